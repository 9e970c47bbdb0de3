/* Run configuration: JSON file(s) plus --set overrides, checked against the schemas of the host and
 * of every loaded plugin (see config.h and docs/config.md).
 *
 * Model: every given value is an entry "dotted.key -> JSON token" that remembers where it came from.
 * Objects are flattened (an array stays one value); each object is also kept as an entry, marked
 * is_object, so that "zero_optimization.stage": {...} or an empty {} can be reported instead of
 * vanishing. Every declared option holds its effective value, re-resolved whenever a value or a schema
 * is added, so the host can read its own keys (which select the plugins) before the plugins' schemas
 * exist; zt_config_validate (schema.c) then reports every problem at once.
 *
 * This file: documents and building a config, typed access. config_internal.h lists the others.
 */
#define _POSIX_C_SOURCE 200809L
#include "config/config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/json.h"
#include "config/config_internal.h"
#include "config/yaml.h"

int cfg_grow(void **items, int *cap, int need, size_t item_size)
{
    if (need <= *cap) return 1;
    int new_cap = *cap ? *cap * 2 : 16;
    while (new_cap < need) new_cap *= 2;
    void *p = realloc(*items, (size_t)new_cap * item_size);
    if (!p) return 0;
    *items = p;
    *cap = new_cap;
    return 1;
}

/* Hand `p` to the config (freed by zt_config_free); on failure frees p and returns NULL. */
void *cfg_arena_keep(zt_config *cfg, void *p)
{
    if (!p) return NULL;
    if (!cfg_grow((void **)&cfg->arena, &cfg->cap_arena, cfg->n_arena + 1, sizeof *cfg->arena)) {
        free(p);
        return NULL;
    }
    cfg->arena[cfg->n_arena++] = p;
    return p;
}

char *cfg_arena_strndup(zt_config *cfg, const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return cfg_arena_keep(cfg, p);
}

char *cfg_format_alloc(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

void cfg_problems_open(problem_list *p)
{
    memset(p, 0, sizeof *p);
    p->f = open_memstream(&p->text, &p->len);
}

void cfg_problem_add(problem_list *p, const char *fmt, ...)
{
    if (p->f) {
        if (p->count) fputc('\n', p->f);
        va_list ap;
        va_start(ap, fmt);
        vfprintf(p->f, fmt, ap);
        va_end(ap);
    }
    p->count++;
}

/* Closes the list; when it holds problems, puts them in err (cut to fit, with a count of the rest). */
zt_status cfg_problems_close(problem_list *p, zt_status status, zt_error *err)
{
    if (p->f) fclose(p->f);
    if (p->count == 0) {
        free(p->text);
        return ZT_OK;
    }
    if (!p->f || !p->text) {
        free(p->text);
        return zt_error_set(err, status, "%d config problem(s); out of memory while describing them",
                            p->count);
    }
    size_t room = ZT_ERROR_MSG_MAX - 64;
    if (p->len > room) {
        /* Cut at a line end and say how many lines were left out. */
        size_t cut = room;
        while (cut > 0 && p->text[cut] != '\n') cut--;
        int left_out = 0;
        for (size_t k = cut; k < p->len; k++) left_out += p->text[k] == '\n';
        zt_error_set(err, status, "%.*s\n... and %d more problem(s)", (int)cut, p->text, left_out);
    } else {
        zt_error_set(err, status, "%s", p->text);
    }
    free(p->text);
    return status;
}

/* ---- documents ----------------------------------------------------------------------------- */

void cfg_doc_free(config_doc *d)
{
    zt_json_free(&d->json);
    free(d->text);
    free(d->origin);
    for (int k = 0; k < d->n_places; k++) free(d->places[k].note);
    free(d->places);
}

/* A command-line style value: JSON when it is a valid JSON scalar or array, else the text itself
 * as a string. On success *out owns its text. */
zt_status cfg_parse_command_line_value(const char *value, const char *origin, config_doc *out,
                                       zt_error *err)
{
    memset(out, 0, sizeof *out);
    out->from_set = 1;
    out->origin = strdup(origin);
    out->text = strdup(value);
    if (!out->origin || !out->text) {
        cfg_doc_free(out);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    }
    zt_error not_json;
    if (zt_json_parse(out->text, strlen(out->text), out->origin, &out->json, &not_json) == ZT_OK) {
        if (out->json.tok[0].type != ZT_JSON_OBJECT) return ZT_OK;
        cfg_doc_free(out);
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s: a JSON object cannot be given as one value; give each key on its "
                            "own, e.g. --set zero_optimization.stage=2",
                            origin);
    }
    /* Not JSON: store the text as a JSON string literal so every value is a token. */
    free(out->text);
    out->text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&out->text, &len);
    if (m) {
        zt_json_write_string(m, value, strlen(value));
        fclose(m);
    }
    if (!m || !out->text) {
        cfg_doc_free(out);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    }
    zt_status st = zt_json_parse(out->text, len, out->origin, &out->json, err);
    if (st != ZT_OK) cfg_doc_free(out);
    return st;
}

int cfg_add_doc(zt_config *cfg, config_doc *d)
{
    if (!cfg_grow((void **)&cfg->docs, &cfg->cap_docs, cfg->n_docs + 1, sizeof *cfg->docs)) return -1;
    cfg->docs[cfg->n_docs] = *d;
    return cfg->n_docs++;
}

int cfg_add_entry(zt_config *cfg, char *key, int doc, int value_tok, size_t key_offset, int is_object)
{
    if (!cfg_grow((void **)&cfg->given, &cfg->cap_given, cfg->n_given + 1, sizeof *cfg->given)) return 0;
    cfg->given[cfg->n_given++] = (given_entry){key, doc, value_tok, key_offset, is_object};
    return 1;
}

/* 1 when a declared option cannot take the text "auto" as its value (every type but a string, and an
 * enum without the choice "auto"), so a file's "auto" for it is the Hugging Face Trainer's placeholder. */
static int auto_is_placeholder(const zt_option *opt)
{
    if (opt->type == ZT_OPT_STRING) return 0;
    if (opt->type != ZT_OPT_ENUM) return 1;
    for (int k = 0; opt->choices && opt->choices[k]; k++)
        if (!strcmp(opt->choices[k], "auto")) return 0;
    return 1;
}

int cfg_entry_is_auto(const zt_config *cfg, const given_entry *e)
{
    const config_doc *d = &cfg->docs[e->doc];
    if (d->from_set || d->put || e->is_object) return 0;
    const zt_json_tok *t = &d->json.tok[e->value_tok];
    if (t->type != ZT_JSON_STRING || t->end - t->start != 4 || memcmp(d->json.text + t->start, "auto", 4) != 0)
        return 0;
    const declared_option *decl = cfg_find_decl(cfg, e->key);
    return decl && auto_is_placeholder(decl->opt);
}

int cfg_auto_entry(const zt_config *cfg, const char *key)
{
    int found = -1;
    for (int k = 0; k < cfg->n_given; k++)
        if (!strcmp(cfg->given[k].key, key) && cfg_entry_is_auto(cfg, &cfg->given[k])) found = k;
    return found;
}

/* The entry whose value counts for `key`: the last --set, else the last file entry; -1 if none. A file's
 * "auto" (cfg_entry_is_auto) gives no value: the key keeps zt's own (a --set, a value the host puts, or
 * the default), as the Hugging Face Trainer fills "auto" from its own settings. */
int cfg_effective_entry(const zt_config *cfg, const char *key)
{
    int best = -1, best_from_set = 0;
    for (int k = 0; k < cfg->n_given; k++) {
        const given_entry *e = &cfg->given[k];
        if (e->is_object || strcmp(e->key, key) != 0 || cfg_entry_is_auto(cfg, e)) continue;
        int from_set = cfg->docs[e->doc].from_set;
        if (best < 0 || from_set >= best_from_set) {
            best = k;
            best_from_set = from_set;
        }
    }
    return best;
}

/* Recompute every declared option's effective value. */
void cfg_resolve_all(zt_config *cfg)
{
    for (int k = 0; k < cfg->n_decl; k++) {
        declared_option *d = &cfg->decl[k];
        free(d->problem);
        d->problem = NULL;
        d->invalid = 0;
        d->value = d->def;
        d->given = cfg_effective_entry(cfg, d->opt->key);
        if (d->given < 0) continue;
        const given_entry *e = &cfg->given[d->given];
        const config_doc *doc = &cfg->docs[e->doc];
        option_value v;
        value_problem vp;
        if (cfg_parse_value(cfg, d->opt, &doc->json, e->value_tok, doc->from_set, &v, &vp)) {
            d->value = v;
            continue;
        }
        char place[4200];
        if (vp.byte) cfg_describe_place(cfg, e, vp.byte, place, sizeof place);
        else cfg_describe_value_place(cfg, e, vp.tok, place, sizeof place);
        d->invalid = 1;
        d->problem = cfg_format_alloc("config key '%s' %s (%s)%s%s", d->opt->key, vp.problem, place,
                                  vp.hint[0] ? "; " : "", vp.hint);
    }
}

/* Record the members of object `obj` (and, recursively, of nested objects) under `prefix`. */
static void flatten(zt_config *cfg, int doc, int obj, const char *prefix, problem_list *problems)
{
    const zt_json *j = &cfg->docs[doc].json;
    int k = obj + 1;
    for (int member = 0; member < j->tok[obj].size; member++, k = zt_json_skip(j, k)) {
        int value = k + 1;
        char *name = NULL;
        zt_error key_err;
        if (zt_json_string(j, k, &name, NULL, &key_err) != ZT_OK) {
            cfg_problem_add(problems, "%s (in a key)", key_err.msg);
            continue;
        }
        /* zt's own metadata in config.resolved.json: ignored so a resolved config can be fed back. */
        if (!prefix && (!strcmp(name, "_sources") || !strcmp(name, "_plugins") || !strcmp(name, "_notes"))) {
            free(name);
            continue;
        }
        if (name[0] == '\0' || strchr(name, '.')) {
            int line, col;
            cfg_doc_line_col(&cfg->docs[doc], cfg_token_offset(j, k), &line, &col, NULL);
            cfg_problem_add(problems, "%s:%d:%d: %s; nest %s instead, e.g. %s", j->origin, line, col,
                            name[0] ? "a config key cannot contain '.'" : "a config key cannot be empty",
                            cfg->docs[doc].n_places ? "mappings" : "objects",
                            cfg->docs[doc].n_places ? "\"zero_optimization:\" with \"stage: 2\" indented below it"
                                                    : "{\"zero_optimization\": {\"stage\": 2}}");
            free(name);
            continue;
        }
        char *key = prefix ? cfg_format_alloc("%s.%s", prefix, name) : name;
        if (prefix) free(name);
        int is_object = j->tok[value].type == ZT_JSON_OBJECT;
        if (!key || !cfg_add_entry(cfg, key, doc, value, cfg_token_offset(j, k), is_object)) {
            free(key);
            cfg_problem_add(problems, "%s: out of memory while reading the config", j->origin);
            return;
        }
        if (is_object) flatten(cfg, doc, value, key, problems);
    }
}

/* Take ownership of `text` (NUL-terminated, len bytes) and `places`, parse it and record its values. */
zt_status cfg_load_document(zt_config *cfg, char *text, size_t len, const char *origin, cfg_place *places,
                            int n_places, zt_error *err)
{
    config_doc d = {text, strdup(origin), 0, 0, {0}, places, n_places};
    if (!d.origin) {
        cfg_doc_free(&d);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    }
    zt_status st = zt_json_parse(d.text, len, d.origin, &d.json, err);
    if (st != ZT_OK) {
        cfg_doc_free(&d);
        return st;
    }
    if (d.json.tok[0].type != ZT_JSON_OBJECT) {
        int line, col;
        cfg_doc_line_col(&d, cfg_token_offset(&d.json, 0), &line, &col, NULL);
        st = zt_error_set(err, ZT_ERR_CONFIG,
                          "%s:%d:%d: a config must be a JSON object ({\"key\": value, ...}), found %s",
                          origin, line, col,
                          d.json.tok[0].type == ZT_JSON_ARRAY ? "an array" : "a single value");
        cfg_doc_free(&d);
        return st;
    }
    int doc = cfg_add_doc(cfg, &d);
    if (doc < 0) {
        cfg_doc_free(&d);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    }
    int n_given_before = cfg->n_given;
    problem_list problems;
    cfg_problems_open(&problems);
    flatten(cfg, doc, 0, NULL, &problems);
    st = cfg_problems_close(&problems, ZT_ERR_CONFIG, err);
    if (st != ZT_OK) {
        /* Leave the config as it was. */
        while (cfg->n_given > n_given_before) free(cfg->given[--cfg->n_given].key);
        cfg_doc_free(&cfg->docs[--cfg->n_docs]);
        return st;
    }
    cfg->validated = 0;
    cfg_resolve_all(cfg);
    return ZT_OK;
}

/* ---- public: building a config ------------------------------------------------------------- */

zt_config *zt_config_new(void) { return calloc(1, sizeof(zt_config)); }

void zt_config_free(zt_config *cfg)
{
    if (!cfg) return;
    for (int k = 0; k < cfg->n_docs; k++) cfg_doc_free(&cfg->docs[k]);
    for (int k = 0; k < cfg->n_given; k++) free(cfg->given[k].key);
    for (int k = 0; k < cfg->n_decl; k++) free(cfg->decl[k].problem);
    for (int k = 0; k < cfg->n_arena; k++) free(cfg->arena[k]);
    for (int k = 0; k < cfg->n_launch; k++) {
        free(cfg->launch[k].key);
        free(cfg->launch[k].value);
        free(cfg->launch[k].place);
    }
    free(cfg->launch);
    free(cfg->notes);
    free(cfg->docs);
    free(cfg->given);
    free(cfg->decl);
    free(cfg->arena);
    free(cfg);
}

zt_status zt_config_load_file(zt_config *cfg, const char *path, zt_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return zt_error_set(err, ZT_ERR_IO, "cannot open config file '%s': %s; check the path", path,
                            strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return zt_error_set(err, ZT_ERR_IO,
                            "config file '%s' is a directory; give the path of the config file (JSON or YAML)", path);
    }
    size_t len = 0, cap = 1 << 16;
    char *text = malloc(cap);
    while (text) {
        len += fread(text + len, 1, cap - 1 - len, f);
        if (len < cap - 1) break; /* end of file, or an error (checked below) */
        cap *= 2;
        char *bigger = realloc(text, cap);
        if (!bigger) free(text);
        text = bigger;
    }
    int read_error = ferror(f);
    int saved_errno = errno;
    fclose(f);
    if (!text) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", path);
    if (read_error) {
        free(text);
        return zt_error_set(err, ZT_ERR_IO, "cannot read config file '%s': %s", path,
                            strerror(saved_errno));
    }
    text[len] = '\0';
    if (cfg_is_yaml_path(path)) return cfg_yaml_load(cfg, text, len, path, err);
    /* A YAML file under another name: JSON's error alone would not say what to do. */
    size_t first = strspn(text, " \t\r\n");
    int looks_yaml = first < len && text[first] != '{' && text[first] != '[' && strchr(text, ':');
    zt_status loaded = cfg_load_document(cfg, text, len, path, NULL, 0, err);
    if (loaded == ZT_ERR_FORMAT && looks_yaml)
        zt_error_append(err, "; if '%s' is a YAML config, give it the extension .yaml or .yml (zt chooses the "
                        "format by the file name)", path);
    return loaded;
}

zt_status zt_config_load_string(zt_config *cfg, const char *json, const char *origin, zt_error *err)
{
    char *text = strdup(json);
    if (!text) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    return cfg_load_document(cfg, text, strlen(text), origin, NULL, 0, err);
}

zt_status zt_config_load_yaml_string(zt_config *cfg, const char *yaml, const char *origin, zt_error *err)
{
    char *text = strdup(yaml);
    if (!text) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    return cfg_yaml_load(cfg, text, strlen(text), origin, err);
}

int zt_config_path_is_yaml(const char *path)
{
    return cfg_is_yaml_path(path);
}

const char *zt_config_notes(const zt_config *cfg)
{
    return cfg->notes ? cfg->notes : "";
}

const char *zt_config_launch_key(const zt_config *cfg, const char *key, const char **place)
{
    for (int k = cfg->n_launch - 1; k >= 0; k--) {
        if (strcmp(cfg->launch[k].key, key) != 0) continue;
        if (place) *place = cfg->launch[k].place;
        return cfg->launch[k].value;
    }
    return NULL;
}

zt_status zt_config_set(zt_config *cfg, const char *assignment, zt_error *err)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--set '%s': expected KEY=VALUE, e.g. --set zero_optimization.stage=2",
                            assignment);
    }
    char *key = strndup(assignment, (size_t)(eq - assignment));
    if (!key) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "--set: out of memory");
    if (key[0] == '.' || key[strlen(key) - 1] == '.' || strstr(key, "..")) {
        zt_status st = zt_error_set(err, ZT_ERR_CONFIG,
                                    "--set '%s': the key '%s' has an empty part; keys are dotted "
                                    "paths such as zero_optimization.stage",
                                    assignment, key);
        free(key);
        return st;
    }
    char *origin = cfg_format_alloc("--set %s", assignment);
    if (!origin) {
        free(key);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "--set: out of memory");
    }
    config_doc d;
    zt_status st = cfg_parse_command_line_value(eq + 1, origin, &d, err);
    free(origin);
    if (st != ZT_OK) {
        free(key);
        return st;
    }
    int doc = cfg_add_doc(cfg, &d);
    if (doc < 0 || !cfg_add_entry(cfg, key, doc, 0, 0, 0)) {
        if (doc >= 0) cfg->n_docs--;
        cfg_doc_free(&d);
        free(key);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "--set: out of memory");
    }
    cfg->validated = 0;
    cfg_resolve_all(cfg);
    return ZT_OK;
}

/* One value the host puts: a document of one JSON token (the value written as JSON text, as every
 * given value is kept) and its entry. */
static zt_status put_value(zt_config *cfg, const char *key, const char *json_text, size_t len, const char *origin,
                           int rank, zt_error *err)
{
    if (rank != ZT_CONFIG_RANK_FILE && rank != ZT_CONFIG_RANK_SET)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "zt_config_put of '%s': rank %d is not a ZT_CONFIG_RANK_*",
                            key, rank);
    config_doc d = {NULL, strdup(origin), rank == ZT_CONFIG_RANK_SET, 1, {0}, NULL, 0};
    char *k = strdup(key);
    d.text = malloc(len + 1);
    if (!d.origin || !d.text || !k) {
        free(d.origin);
        free(d.text);
        free(k);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory recording %s", origin, key);
    }
    memcpy(d.text, json_text, len);
    d.text[len] = '\0';
    zt_status st = zt_json_parse(d.text, len, d.origin, &d.json, err);
    if (st != ZT_OK) { /* a value the host wrote itself: cannot happen */
        cfg_doc_free(&d);
        free(k);
        return st;
    }
    int doc = cfg_add_doc(cfg, &d);
    if (doc < 0 || !cfg_add_entry(cfg, k, doc, 0, 0, 0)) {
        if (doc >= 0) cfg->n_docs--;
        cfg_doc_free(&d);
        free(k);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory recording %s", origin, key);
    }
    cfg->validated = 0;
    cfg_resolve_all(cfg);
    return ZT_OK;
}

zt_status zt_config_put_string(zt_config *cfg, const char *key, const char *value, const char *origin, int rank,
                               zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (m) {
        zt_json_write_string(m, value, strlen(value));
        if (fclose(m) != 0) {
            free(text);
            text = NULL;
        }
    }
    if (!text) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory recording %s", origin, key);
    zt_status st = put_value(cfg, key, text, len, origin, rank, err);
    free(text);
    return st;
}

zt_status zt_config_put_int(zt_config *cfg, const char *key, int64_t value, const char *origin, int rank,
                            zt_error *err)
{
    char text[32];
    int n = snprintf(text, sizeof text, "%lld", (long long)value);
    return put_value(cfg, key, text, (size_t)n, origin, rank, err);
}

zt_status zt_config_put_float(zt_config *cfg, const char *key, double value, const char *origin, int rank,
                              zt_error *err)
{
    if (!isfinite(value))
        return zt_error_set(err, ZT_ERR_CONFIG, "%s gives %s the value %g, which is not a finite number", origin, key,
                            value);
    char text[40];
    cfg_format_double(value, text, sizeof text);
    return put_value(cfg, key, text, strlen(text), origin, rank, err);
}

zt_status zt_config_put_bool(zt_config *cfg, const char *key, int32_t value, const char *origin, int rank,
                             zt_error *err)
{
    return value ? put_value(cfg, key, "true", 4, origin, rank, err) : put_value(cfg, key, "false", 5, origin, rank, err);
}

void zt_config_drop_puts(zt_config *cfg, const char *origin)
{
    int kept = 0;
    for (int k = 0; k < cfg->n_given; k++) {
        const config_doc *d = &cfg->docs[cfg->given[k].doc];
        if (d->put && !strcmp(d->origin, origin)) {
            free(cfg->given[k].key);
            continue;
        }
        cfg->given[kept++] = cfg->given[k];
    }
    if (kept == cfg->n_given) return;
    cfg->n_given = kept; /* the documents stay until zt_config_free: the arena may hold their strings */
    cfg->validated = 0;
    cfg_resolve_all(cfg);
}

/* ---- typed access -------------------------------------------------------------------------- */

/* The option behind `key` when it has `type` (or `alt_type`) and a usable value. */
static zt_status lookup(const zt_config *cfg, const char *key, int type, int alt_type,
                        const declared_option **out)
{
    const declared_option *d = key ? cfg_find_decl(cfg, key) : NULL;
    if (!d) return ZT_ERR_NOT_FOUND;
    if (d->opt->type != type && d->opt->type != alt_type) return ZT_ERR_INVALID_ARG;
    if (d->invalid) return ZT_ERR_CONFIG;
    if (!d->value.present) return ZT_ERR_NOT_FOUND;
    *out = d;
    return ZT_OK;
}

zt_status zt_config_get_bool(const zt_config *cfg, const char *key, int32_t *out)
{
    const declared_option *d;
    zt_status st = lookup(cfg, key, ZT_OPT_BOOL, ZT_OPT_BOOL, &d);
    if (st == ZT_OK) *out = d->value.b;
    return st;
}

zt_status zt_config_get_int(const zt_config *cfg, const char *key, int64_t *out)
{
    const declared_option *d;
    zt_status st = lookup(cfg, key, ZT_OPT_INT, ZT_OPT_BYTES, &d);
    if (st == ZT_OK) *out = d->value.i;
    return st;
}

zt_status zt_config_get_float(const zt_config *cfg, const char *key, double *out)
{
    const declared_option *d;
    zt_status st = lookup(cfg, key, ZT_OPT_FLOAT, ZT_OPT_FLOAT, &d);
    if (st == ZT_OK) *out = d->value.f;
    return st;
}

zt_status zt_config_get_string(const zt_config *cfg, const char *key, const char **out)
{
    const declared_option *d;
    zt_status st = lookup(cfg, key, ZT_OPT_STRING, ZT_OPT_ENUM, &d);
    if (st == ZT_OK) *out = d->value.s;
    return st;
}

zt_status zt_config_get_floats(const zt_config *cfg, const char *key, double *out, int32_t cap,
                               int32_t *n)
{
    const declared_option *d;
    zt_status st = lookup(cfg, key, ZT_OPT_FLOATS, ZT_OPT_FLOATS, &d);
    if (st != ZT_OK) return st;
    *n = d->value.n_floats;
    if (d->value.n_floats > cap) return ZT_ERR_BUFFER_TOO_SMALL;
    if (d->value.n_floats > 0) memcpy(out, d->value.floats, (size_t)d->value.n_floats * sizeof *out);
    return ZT_OK;
}

int zt_config_is_set(const zt_config *cfg, const char *key)
{
    return cfg_effective_entry(cfg, key) >= 0;
}
