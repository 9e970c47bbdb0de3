/* The resolved config: every declared key with its effective value and where it came from, as
 * zt-run --check prints it and every run saves it (config.resolved.json). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/json.h"
#include "config/config_internal.h"
#include "config/deepspeed.h"

/* ---- the resolved config ------------------------------------------------------------------- */

/* Sort order that keeps each section together: '.' sorts before every other key character. */
static int compare_keys(const void *a, const void *b)
{
    const char *x = (*(const declared_option *const *)a)->opt->key;
    const char *y = (*(const declared_option *const *)b)->opt->key;
    for (;; x++, y++) {
        unsigned char cx = *x == '.' ? 1 : (unsigned char)*x;
        unsigned char cy = *y == '.' ? 1 : (unsigned char)*y;
        if (cx != cy || cx == 0) return (int)cx - (int)cy;
    }
}

static void write_value(FILE *out, const declared_option *d)
{
    const option_value *v = &d->value;
    char number[32];
    if (!v->present) {
        fputs("null", out);
        return;
    }
    switch (d->opt->type) {
    case ZT_OPT_BOOL: fputs(v->b ? "true" : "false", out); break;
    case ZT_OPT_INT:
    case ZT_OPT_BYTES: fprintf(out, "%lld", (long long)v->i); break;
    case ZT_OPT_FLOAT:
        cfg_format_double(v->f, number, sizeof number);
        fputs(number, out);
        break;
    case ZT_OPT_STRING:
    case ZT_OPT_ENUM: zt_json_write_string(out, v->s, strlen(v->s)); break;
    case ZT_OPT_FLOATS:
        fputc('[', out);
        for (int32_t k = 0; k < v->n_floats; k++) {
            cfg_format_double(v->floats[k], number, sizeof number);
            fprintf(out, "%s%s", k ? ", " : "", number);
        }
        fputc(']', out);
        break;
    }
}

/* "file:PATH:LINE" of entry e, with its MindFormers note; NULL when out of memory. */
static char *file_place(const zt_config *cfg, const given_entry *e)
{
    const config_doc *doc = &cfg->docs[e->doc];
    int line, col;
    const char *note;
    cfg_doc_line_col(doc, e->key_offset, &line, &col, &note);
    return note ? cfg_format_alloc("file:%s:%d (%s)", doc->origin, line, note)
                : cfg_format_alloc("file:%s:%d", doc->origin, line);
}

static void write_source(const zt_config *cfg, FILE *out, const declared_option *d)
{
    int auto_entry = cfg_auto_entry(cfg, d->opt->key);
    if (d->given < 0 && auto_entry >= 0) {
        /* the file's "auto", filled with zt's own value as the Hugging Face Trainer fills it with its own */
        char *place = file_place(cfg, &cfg->given[auto_entry]);
        char *source = place ? cfg_format_alloc("\"auto\" (%s): zt's default", place) : NULL;
        if (source) zt_json_write_string(out, source, strlen(source));
        else fputs("\"auto\"", out);
        free(place);
        free(source);
        return;
    }
    if (d->given < 0) {
        fputs("\"default\"", out);
        return;
    }
    const given_entry *e = &cfg->given[d->given];
    const config_doc *doc = &cfg->docs[e->doc];
    if (doc->put) {
        zt_json_write_string(out, doc->origin, strlen(doc->origin));
        return;
    }
    if (doc->from_set) {
        fputs(auto_entry >= 0 ? "\"--set (over the file's \\\"auto\\\")\"" : "\"--set\"", out);
        return;
    }
    char *source = file_place(cfg, e);
    if (source) zt_json_write_string(out, source, strlen(source));
    else fputs("\"file\"", out);
    free(source);
}

/* "_notes": what the file means in zt that its keys do not show (the MindFormers notes, every "auto" and
 * the value it took, the DeepSpeed keys accepted without effect), one string per line; absent when none. */
static void write_notes(const zt_config *cfg, FILE *out)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return;
    fputs(zt_config_notes(cfg), mem);
    zt_ds_describe(cfg, mem, "");
    if (fclose(mem) != 0) {
        free(text);
        return;
    }
    int n = 0;
    for (const char *line = text; *line;) {
        size_t k = strcspn(line, "\n");
        fputs(n++ ? ",\n    " : ",\n  \"_notes\": [\n    ", out);
        zt_json_write_string(out, line, k);
        line += k + (line[k] == '\n');
    }
    if (n) fputs("\n  ]", out);
    free(text);
}

static void indent(FILE *out, int level) { fprintf(out, "%*s", 2 * level, ""); }

zt_status zt_config_write_resolved(const zt_config *cfg, FILE *out, const char *plugins_json,
                                   zt_error *err)
{
    if (!cfg->validated) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "zt_config_write_resolved: the config has not been validated since it last "
                            "changed; call zt_config_validate first");
    }
    if (plugins_json) {
        zt_json check;
        zt_error parse_err;
        if (zt_json_parse(plugins_json, strlen(plugins_json), "_plugins", &check, &parse_err) != ZT_OK) {
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "zt_config_write_resolved: the plugin list is not valid JSON: %s",
                                parse_err.msg);
        }
        zt_json_free(&check);
    }
    const declared_option **sorted = malloc((size_t)(cfg->n_decl ? cfg->n_decl : 1) * sizeof *sorted);
    if (!sorted) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing the config");
    for (int k = 0; k < cfg->n_decl; k++) sorted[k] = &cfg->decl[k];
    qsort(sorted, (size_t)cfg->n_decl, sizeof *sorted, compare_keys);

    /* Nested objects rebuilt from the sorted dotted keys: `open` is the section path now open
     * (a prefix of the previous key, ending with '.'), `open_depth` its number of components. */
    const char *open = "";
    size_t open_len = 0;
    int open_depth = 0;
    int first_at_level[64] = {1};
    fputc('{', out);
    for (int k = 0; k < cfg->n_decl; k++) {
        const char *key = sorted[k]->opt->key;
        /* Close sections that this key is not in. */
        while (open_depth > 0 && !(strncmp(open, key, open_len) == 0)) {
            open_len--; /* drop the trailing '.' and the last component */
            while (open_len > 0 && open[open_len - 1] != '.') open_len--;
            fputc('\n', out);
            indent(out, open_depth);
            fputc('}', out);
            open_depth--;
        }
        /* Open the sections between the open path and the key's last component. */
        const char *part = key + open_len;
        const char *dot;
        while ((dot = strchr(part, '.')) != NULL) {
            fputs(first_at_level[open_depth] ? "\n" : ",\n", out);
            first_at_level[open_depth] = 0;
            indent(out, open_depth + 1);
            zt_json_write_string(out, part, (size_t)(dot - part));
            fputs(": {", out);
            open_depth++;
            first_at_level[open_depth] = 1;
            part = dot + 1;
        }
        open = key;
        open_len = (size_t)(part - key);
        fputs(first_at_level[open_depth] ? "\n" : ",\n", out);
        first_at_level[open_depth] = 0;
        indent(out, open_depth + 1);
        zt_json_write_string(out, part, strlen(part));
        fputs(": ", out);
        write_value(out, sorted[k]);
    }
    while (open_depth > 0) {
        fputc('\n', out);
        indent(out, open_depth);
        fputc('}', out);
        open_depth--;
    }
    fputs(first_at_level[0] ? "\n  \"_sources\": {" : ",\n  \"_sources\": {", out);
    for (int k = 0; k < cfg->n_decl; k++) {
        fputs(k ? ",\n    " : "\n    ", out);
        zt_json_write_string(out, sorted[k]->opt->key, strlen(sorted[k]->opt->key));
        fputs(": ", out);
        write_source(cfg, out, sorted[k]);
    }
    fputs(cfg->n_decl ? "\n  }" : "}", out);
    write_notes(cfg, out);
    if (plugins_json) fprintf(out, ",\n  \"_plugins\": %s", plugins_json);
    fputs("\n}\n", out);
    free(sorted);
    if (ferror(out)) {
        return zt_error_set(err, ZT_ERR_IO, "could not write the resolved config: %s", strerror(errno));
    }
    return ZT_OK;
}

zt_status zt_config_save_resolved(const zt_config *cfg, const char *path, const char *plugins_json,
                                  zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving '%s'", path);
    zt_status st = zt_config_write_resolved(cfg, mem, plugins_json, err);
    if (fclose(mem) != 0 && st == ZT_OK)
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving '%s'", path);
    if (st == ZT_OK) st = zt_atomic_write(path, text, len, err);
    free(text);
    return st;
}
