/* One given value against its option (type, range, choices), and how values and the places they
 * came from are described in messages (config_internal.h). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/json.h"
#include "config/config_internal.h"

/* ---- describing values and places ------------------------------------------------------------ */

size_t cfg_token_offset(const zt_json *j, int tok)
{
    /* A string token starts after its quote; point at the quote. */
    return (size_t)j->tok[tok].start - (j->tok[tok].type == ZT_JSON_STRING ? 1 : 0);
}

void cfg_doc_line_col(const config_doc *d, size_t offset, int *line, int *col, const char **note)
{
    if (note) *note = NULL;
    if (!d->n_places) {
        zt_json_line_col(d->text, offset, line, col);
        return;
    }
    /* The last place at or before the offset: a token's own, or (inside a string) its string's. */
    int lo = 0, hi = d->n_places - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (d->places[mid].offset <= offset) lo = mid;
        else hi = mid - 1;
    }
    *line = d->places[lo].line;
    *col = d->places[lo].col;
    if (note) *note = d->places[lo].note;
}

/* "run.json:4:24" for an offset in a file, "run.yaml:4:3 (MindFormers runner_config.epochs)", "--set
 * key=value", or the origin of a value the host put. */
void cfg_describe_place(const zt_config *cfg, const given_entry *e, size_t offset, char *buf,
                        size_t cap)
{
    const config_doc *d = &cfg->docs[e->doc];
    if (d->from_set || d->put) {
        snprintf(buf, cap, "%s", d->origin);
        return;
    }
    int line, col;
    const char *note;
    cfg_doc_line_col(d, offset, &line, &col, &note);
    if (note) snprintf(buf, cap, "%s:%d:%d (%s)", d->origin, line, col, note);
    else snprintf(buf, cap, "%s:%d:%d", d->origin, line, col);
}

void cfg_describe_value_place(const zt_config *cfg, const given_entry *e, int tok, char *buf,
                              size_t cap)
{
    cfg_describe_place(cfg, e, cfg_token_offset(&cfg->docs[e->doc].json, tok), buf, cap);
}

/* What the user gave: "string \"abc\"", "number 1.5", "boolean true", "null", "an array". */
void cfg_describe_json_value(const zt_json *j, int tok, char *buf, size_t cap)
{
    const zt_json_tok *t = &j->tok[tok];
    int n = t->end - t->start;
    switch (t->type) {
    case ZT_JSON_OBJECT: snprintf(buf, cap, "an object"); break;
    case ZT_JSON_ARRAY: snprintf(buf, cap, "an array"); break;
    case ZT_JSON_STRING:
        snprintf(buf, cap, "string \"%.*s%s\"", n > 40 ? 40 : n, j->text + t->start, n > 40 ? "..." : "");
        break;
    default:
        if (zt_json_is_null(j, tok)) snprintf(buf, cap, "null");
        else if (zt_json_is_bool(j, tok)) snprintf(buf, cap, "boolean %.*s", n, j->text + t->start);
        else snprintf(buf, cap, "number %.*s", n > 40 ? 40 : n, j->text + t->start);
        break;
    }
}

/* The shortest decimal form that reads back as exactly v. */
void cfg_format_double(double v, char *buf, size_t cap)
{
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(buf, cap, "%.*g", precision, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* "in [16, 1048576]", "in (0, 1]", ">= 1", "> 0", "<= 32"; empty when unbounded. */
static void describe_range(const zt_option *opt, char *buf, size_t cap)
{
    char lo[32], hi[32];
    cfg_format_double(opt->min, lo, sizeof lo);
    cfg_format_double(opt->max, hi, sizeof hi);
    /* an integer key's bounds in full: 1000000000000, not 1e+12 */
    if (opt->type == ZT_OPT_INT && fabs(opt->min) < 1e15) snprintf(lo, sizeof lo, "%.0f", opt->min);
    if (opt->type == ZT_OPT_INT && fabs(opt->max) < 1e15) snprintf(hi, sizeof hi, "%.0f", opt->max);
    int open = (opt->flags & ZT_OPT_MIN_OPEN) != 0;
    if ((opt->flags & ZT_OPT_HAS_MIN) && (opt->flags & ZT_OPT_HAS_MAX))
        snprintf(buf, cap, "in %c%s, %s]", open ? '(' : '[', lo, hi);
    else if (opt->flags & ZT_OPT_HAS_MIN)
        snprintf(buf, cap, "%s %s", open ? ">" : ">=", lo);
    else if (opt->flags & ZT_OPT_HAS_MAX)
        snprintf(buf, cap, "<= %s", hi);
    else
        buf[0] = '\0';
}

static int in_range(const zt_option *opt, double v)
{
    if (opt->flags & ZT_OPT_HAS_MIN) {
        if ((opt->flags & ZT_OPT_MIN_OPEN) ? !(v > opt->min) : !(v >= opt->min)) return 0;
    }
    if ((opt->flags & ZT_OPT_HAS_MAX) && !(v <= opt->max)) return 0;
    return 1;
}

/* "an integer", "one of \"packed\", \"padded\"", ... */
void cfg_describe_type(const zt_option *opt, char *buf, size_t cap)
{
    switch (opt->type) {
    case ZT_OPT_BOOL: snprintf(buf, cap, "true or false"); break;
    case ZT_OPT_INT: snprintf(buf, cap, "an integer"); break;
    case ZT_OPT_FLOAT: snprintf(buf, cap, "a number"); break;
    case ZT_OPT_STRING:
        snprintf(buf, cap, "%s", !cfg_host_option_list(opt) ? "a string"
                                 : opt->flags & ZT_OPT_LIST ? "a list of names or one comma-separated string"
                                                            : "a list of parameter-name patterns or one comma-separated "
                                                              "string");
        break;
    case ZT_OPT_FLOATS: snprintf(buf, cap, "an array of numbers"); break;
    case ZT_OPT_BYTES:
        snprintf(buf, cap, "a byte size (an integer, or a string such as \"512M\", \"24GiB\", \"100MB\")");
        break;
    case ZT_OPT_ENUM: {
        size_t used = (size_t)snprintf(buf, cap, "one of");
        for (int k = 0; opt->choices && opt->choices[k] && used < cap; k++) {
            used += (size_t)snprintf(buf + used, cap - used, "%s \"%s\"", k ? "," : "", opt->choices[k]);
        }
        break;
    }
    default: snprintf(buf, cap, "(unknown type %d)", (int)opt->type); break;
    }
}

static int fail_type(value_problem *vp, const zt_option *opt, const zt_json *j, int tok)
{
    char type[256], got[96];
    cfg_describe_type(opt, type, sizeof type);
    cfg_describe_json_value(j, tok, got, sizeof got);
    snprintf(vp->problem, sizeof vp->problem, "must be %s, got %s", type, got);
    vp->tok = tok;
    const zt_json_tok *t = &j->tok[tok];
    if (t->type == ZT_JSON_STRING && t->end - t->start == 4 && memcmp(j->text + t->start, "auto", 4) == 0) {
        snprintf(vp->hint, sizeof vp->hint,
                 "\"auto\" is filled in by the Hugging Face Trainer, not by DeepSpeed or zt: write the "
                 "value itself");
    } else if (zt_json_is_null(j, tok)) {
        snprintf(vp->hint, sizeof vp->hint, "remove the key to use the default (%s)",
                 opt->default_value ? opt->default_value : "unset");
    } else if (t->type == ZT_JSON_ARRAY && opt->type == ZT_OPT_STRING && t->size > 0) {
        /* a list of names (MindFormers' trainable_params: [layers.31, layers.30]) where zt takes one string */
        char joined[160] = "";
        size_t used = 0;
        int item = tok + 1, all_text = 1;
        for (int k = 0; k < t->size && all_text; k++, item = zt_json_skip(j, item)) {
            const zt_json_tok *it = &j->tok[item];
            all_text = it->type == ZT_JSON_STRING && !memchr(j->text + it->start, ',', (size_t)(it->end - it->start));
            if (all_text && used < sizeof joined)
                used += (size_t)snprintf(joined + used, sizeof joined - used, "%s%.*s", k ? "," : "",
                                         it->end - it->start, j->text + it->start);
        }
        if (all_text && used < sizeof joined)
            snprintf(vp->hint, sizeof vp->hint, "it takes one string: write the list comma-separated, \"%s\"", joined);
    }
    return 0;
}

/* A list of strings for a key that takes one (cfg_host_option_list): the items joined with commas. */
static int join_list(const zt_json *j, int tok, char **out, value_problem *vp)
{
    const zt_json_tok *t = &j->tok[tok];
    size_t cap = (size_t)(t->end - t->start) + 1, used = 0;
    char *text = malloc(cap);
    if (!text) {
        snprintf(vp->problem, sizeof vp->problem, "could not be stored: out of memory");
        return 0;
    }
    text[0] = '\0';
    int item = tok + 1;
    for (int k = 0; k < t->size; k++, item = zt_json_skip(j, item)) {
        const zt_json_tok *it = &j->tok[item];
        size_t n = (size_t)(it->end - it->start), bad = 0;
        const char *what = "";
        int ok = it->type == ZT_JSON_STRING && n > 0 && !memchr(j->text + it->start, ',', n);
        if (ok && k) text[used++] = ',';
        if (ok && zt_json_unescape(j->text + it->start, n, text + used, &bad, &what) < 0) ok = 0;
        if (!ok) {
            char got[96];
            cfg_describe_json_value(j, item, got, sizeof got);
            snprintf(vp->problem, sizeof vp->problem,
                     "item %d must be a non-empty parameter-name pattern without commas, got %s", k + 1, got);
            vp->tok = item;
            free(text);
            return 0;
        }
        used += strlen(text + used);
    }
    *out = text;
    return 1;
}

static int fail_range(value_problem *vp, const zt_option *opt, const char *what, const char *shown, double v,
                      int tok)
{
    char range[96];
    describe_range(opt, range, sizeof range);
    if (cfg_host_option_capped(opt)) {
        /* The maximum only catches typos: a value too small is told the minimum alone. */
        zt_option bound = *opt;
        bound.flags &= v > opt->max ? ~(uint32_t)ZT_OPT_HAS_MIN : ~(uint32_t)ZT_OPT_HAS_MAX;
        describe_range(&bound, range, sizeof range);
        if (v > opt->max)
            snprintf(vp->hint, sizeof vp->hint,
                     "zt caps this key at %.0f to catch typos (an extra digit, a value past 2^32): no real run "
                     "needs more",
                     opt->max);
    }
    snprintf(vp->problem, sizeof vp->problem, "%sis %s, out of range: must be %s", what, shown, range);
    vp->tok = tok;
    return 0;
}

/* A JSON number token as an int64: "5e8" and "1.0" are fine, "1.5" is not. */
static int number_to_int(const zt_json *j, int tok, int64_t *out, value_problem *vp)
{
    const zt_json_tok *t = &j->tok[tok];
    int n = t->end - t->start;
    const char *s = j->text + t->start;
    vp->tok = tok;
    if (n >= 64) {
        snprintf(vp->problem, sizeof vp->problem, "is %.40s..., too long for a 64-bit integer", s);
        return 0;
    }
    char buf[64];
    memcpy(buf, s, (size_t)n);
    buf[n] = '\0';
    if (!strpbrk(buf, ".eE")) {
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE) {
            snprintf(vp->problem, sizeof vp->problem, "is %s, outside the 64-bit integer range", buf);
            return 0;
        }
        *out = (int64_t)v;
        return 1;
    }
    double d = strtod(buf, NULL);
    if (!isfinite(d) || d != floor(d)) {
        snprintf(vp->problem, sizeof vp->problem, "must be an integer, got number %s", buf);
        return 0;
    }
    /* 2^63 is exactly representable; anything at or beyond it does not fit. */
    if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) {
        snprintf(vp->problem, sizeof vp->problem, "is %s, outside the 64-bit integer range", buf);
        return 0;
    }
    *out = (int64_t)d;
    return 1;
}

/* "512M" -> 536870912. K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000,
 * B or nothing is bytes; units are case-insensitive; a fraction is rounded to the nearest byte. */
static int parse_byte_size(const char *s, int64_t *out)
{
    static const struct {
        const char *unit;
        double bytes;
    } units[] = {
        {"", 1.0},         {"B", 1.0},
        {"K", 0x1p10},     {"KiB", 0x1p10},  {"KB", 1e3},
        {"M", 0x1p20},     {"MiB", 0x1p20},  {"MB", 1e6},
        {"G", 0x1p30},     {"GiB", 0x1p30},  {"GB", 1e9},
        {"T", 0x1p40},     {"TiB", 0x1p40},  {"TB", 1e12},
    };
    const char *p = s;
    int digits = 0, dots = 0;
    while ((*p >= '0' && *p <= '9') || *p == '.') {
        digits += *p != '.';
        dots += *p == '.';
        p++;
    }
    if (digits == 0 || dots > 1 || p - s >= 64) return 0;
    char number[64];
    memcpy(number, s, (size_t)(p - s));
    number[p - s] = '\0';
    while (*p == ' ') p++;
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) {
        if (strcasecmp(p, units[k].unit) != 0) continue;
        double bytes = floor(strtod(number, NULL) * units[k].bytes + 0.5);
        if (!(bytes < 9223372036854775808.0)) return 0;
        *out = (int64_t)bytes;
        return 1;
    }
    return 0;
}

/* Close choices to suggest for a bad enum value. */
static const char *nearest_choice(const zt_option *opt, const char *given)
{
    const char *best = NULL;
    size_t best_distance = 3; /* suggest only within 2 edits (or a case difference) */
    for (int k = 0; opt->choices && opt->choices[k]; k++) {
        size_t d = strcasecmp(opt->choices[k], given) == 0 ? 0 : cfg_edit_distance(opt->choices[k], given);
        if (d < best_distance) {
            best_distance = d;
            best = opt->choices[k];
        }
    }
    return best;
}

/* Check JSON value `tok` against `opt` and fill *out. `from_command_line`: the value was written on
 * the command line (--set) or as a schema default, where a number or boolean for a string option is
 * taken as its text (--set output_dir=2024). Strings and arrays go to the config's arena. */
int cfg_parse_value(zt_config *cfg, const zt_option *opt, const zt_json *j, int tok,
                    int from_command_line, option_value *out, value_problem *vp)
{
    memset(out, 0, sizeof *out);
    memset(vp, 0, sizeof *vp);
    vp->tok = tok;
    out->present = 1;
    const zt_json_tok *t = &j->tok[tok];
    if (zt_json_is_null(j, tok)) {
        if (opt->flags & ZT_OPT_NO_DEFAULT) {
            out->present = 0; /* null is how a resolved config writes "not set" */
            return 1;
        }
        return fail_type(vp, opt, j, tok);
    }
    switch (opt->type) {
    case ZT_OPT_BOOL:
        if (!zt_json_is_bool(j, tok)) return fail_type(vp, opt, j, tok);
        out->b = zt_json_get_bool(j, tok);
        return 1;

    case ZT_OPT_INT:
    case ZT_OPT_FLOAT: {
        if (!zt_json_is_number(j, tok)) return fail_type(vp, opt, j, tok);
        char shown[48];
        snprintf(shown, sizeof shown, "%.*s", t->end - t->start, j->text + t->start);
        double as_double;
        if (opt->type == ZT_OPT_INT) {
            if (!number_to_int(j, tok, &out->i, vp)) return 0;
            as_double = (double)out->i;
        } else {
            out->f = as_double = zt_json_get_number(j, tok);
            if (!isfinite(out->f)) {
                snprintf(vp->problem, sizeof vp->problem, "is %s, too large for a double", shown);
                return 0;
            }
        }
        if (!in_range(opt, as_double)) return fail_range(vp, opt, "", shown, as_double, tok);
        return 1;
    }

    case ZT_OPT_STRING:
    case ZT_OPT_ENUM: {
        char *text = NULL;
        if (t->type == ZT_JSON_STRING) {
            size_t bad = 0;
            const char *what = "";
            size_t n = (size_t)(t->end - t->start);
            text = malloc(n + 1);
            if (text && zt_json_unescape(j->text + t->start, n, text, &bad, &what) < 0) {
                free(text);
                snprintf(vp->problem, sizeof vp->problem, "has a bad string value: %s", what);
                vp->byte = (size_t)t->start + bad;
                return 0;
            }
        } else if (from_command_line && t->type == ZT_JSON_PRIMITIVE) {
            text = strndup(j->text + t->start, (size_t)(t->end - t->start));
        } else if (t->type == ZT_JSON_ARRAY && opt->type == ZT_OPT_STRING && cfg_host_option_list(opt)) {
            if (!join_list(j, tok, &text, vp)) return 0;
        } else {
            return fail_type(vp, opt, j, tok);
        }
        out->s = cfg_arena_keep(cfg, text);
        if (!out->s) {
            snprintf(vp->problem, sizeof vp->problem, "could not be stored: out of memory");
            return 0;
        }
        if (opt->type == ZT_OPT_STRING) return 1;
        for (int k = 0; opt->choices && opt->choices[k]; k++) {
            if (strcmp(opt->choices[k], out->s) == 0) return 1;
        }
        char type[256];
        cfg_describe_type(opt, type, sizeof type);
        snprintf(vp->problem, sizeof vp->problem, "must be %s; got \"%.60s\"", type, out->s);
        const char *near = nearest_choice(opt, out->s);
        if (near) snprintf(vp->hint, sizeof vp->hint, "did you mean \"%s\"?", near);
        return 0;
    }

    case ZT_OPT_FLOATS: {
        if (t->type != ZT_JSON_ARRAY) return fail_type(vp, opt, j, tok);
        double *items = t->size > 0 ? malloc((size_t)t->size * sizeof *items) : NULL;
        if (t->size > 0 && !cfg_arena_keep(cfg, items)) {
            snprintf(vp->problem, sizeof vp->problem, "could not be stored: out of memory");
            return 0;
        }
        int item = tok + 1;
        for (int k = 0; k < t->size; k++, item = zt_json_skip(j, item)) {
            char what[32], shown[48];
            snprintf(what, sizeof what, "item %d ", k + 1);
            if (!zt_json_is_number(j, item)) {
                char got[96];
                cfg_describe_json_value(j, item, got, sizeof got);
                snprintf(vp->problem, sizeof vp->problem, "%smust be a number, got %s", what, got);
                vp->tok = item;
                return 0;
            }
            items[k] = zt_json_get_number(j, item);
            snprintf(shown, sizeof shown, "%.*s", j->tok[item].end - j->tok[item].start,
                     j->text + j->tok[item].start);
            if (!isfinite(items[k])) {
                snprintf(vp->problem, sizeof vp->problem, "%sis %s, too large for a double", what, shown);
                vp->tok = item;
                return 0;
            }
            if (!in_range(opt, items[k])) return fail_range(vp, opt, what, shown, items[k], item);
        }
        out->floats = items;
        out->n_floats = t->size;
        return 1;
    }

    case ZT_OPT_BYTES: {
        char shown[64];
        snprintf(shown, sizeof shown, "%.*s", t->end - t->start > 60 ? 60 : t->end - t->start,
                 j->text + t->start);
        if (zt_json_is_number(j, tok)) {
            if (!number_to_int(j, tok, &out->i, vp)) return 0;
            if (out->i < 0) {
                snprintf(vp->problem, sizeof vp->problem, "is %s, but a byte size cannot be negative",
                         shown);
                return 0;
            }
        } else if (t->type == ZT_JSON_STRING) {
            char text[96];
            size_t n = (size_t)(t->end - t->start);
            if (n >= sizeof text || zt_json_unescape(j->text + t->start, n, text, NULL, NULL) < 0 ||
                !parse_byte_size(text, &out->i)) {
                char type[256];
                cfg_describe_type(opt, type, sizeof type);
                snprintf(vp->problem, sizeof vp->problem, "must be %s, got string \"%s\"", type, shown);
                snprintf(vp->hint, sizeof vp->hint,
                         "K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000");
                return 0;
            }
        } else {
            return fail_type(vp, opt, j, tok);
        }
        if (!in_range(opt, (double)out->i)) return fail_range(vp, opt, "", shown, (double)out->i, tok);
        return 1;
    }
    }
    snprintf(vp->problem, sizeof vp->problem, "has an option type (%d) this zt does not know",
             (int)opt->type);
    return 0;
}

int zt_config_parse_bytes(const char *text, int64_t *out)
{
    return text && parse_byte_size(text, out);
}
