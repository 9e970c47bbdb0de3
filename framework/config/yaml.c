/* YAML configs (yaml.h): a YAML file read with libyaml's event parser (Debian libyaml-dev) into a tree,
 * its plain scalars typed as PyYAML types YAML 1.1, its MindFormers spellings rewritten (mindformers.c),
 * and the tree written as the JSON text of a config document with the YAML place of every token.
 *
 * libyaml's event API, not its document loader: the loader gives a plain scalar and one tagged !!str the
 * same tag, loses where an alias was used, and lets an alias name the node that contains it.
 */
#define _POSIX_C_SOURCE 200809L
#include "config/yaml.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "base/json.h"

#define MAX_DEPTH 512        /* as the JSON reader's nesting limit */
#define MAX_NODES (1L << 20) /* values after aliases are expanded */

/* ---- the tree: arena and helpers -------------------------------------------------------------- */

struct cfg_yaml_block {
    struct cfg_yaml_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *cfg_yaml_alloc(cfg_yaml_tree *t, size_t bytes)
{
    bytes = (bytes + 15) & ~(size_t)15;
    struct cfg_yaml_block *b = t->blocks;
    if (!b || b->cap - b->used < bytes) {
        size_t cap = bytes > 65536 ? bytes : 65536;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = t->blocks;
        b->used = 0;
        b->cap = cap;
        t->blocks = b;
    }
    void *p = b->data + b->used;
    b->used += bytes;
    memset(p, 0, bytes);
    return p;
}

static void tree_free(cfg_yaml_tree *t)
{
    while (t->blocks) {
        struct cfg_yaml_block *next = t->blocks->next;
        free(t->blocks);
        t->blocks = next;
    }
}

char *cfg_yaml_strdup(cfg_yaml_tree *t, const char *s, size_t n)
{
    char *p = cfg_yaml_alloc(t, n + 1);
    if (p) memcpy(p, s, n);
    return p;
}

char *cfg_yaml_printf(cfg_yaml_tree *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *p = cfg_yaml_alloc(t, (size_t)n + 1);
    if (!p) return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

cfg_yaml_node *cfg_yaml_new(cfg_yaml_tree *t, int kind, const char *text, int line, int col)
{
    cfg_yaml_node *v = cfg_yaml_alloc(t, sizeof *v);
    if (!v) return NULL;
    t->n_nodes++;
    v->kind = kind;
    v->text = text;
    v->len = text ? strlen(text) : 0;
    v->line = line;
    v->col = col;
    return v;
}

/* Make room for one more item or pair. */
static int reserve(cfg_yaml_tree *t, cfg_yaml_node *v)
{
    if (v->n < v->cap) return 1;
    int cap = v->cap ? v->cap * 2 : 4;
    size_t size = v->kind == CFG_YAML_MAP ? sizeof *v->pairs : sizeof *v->items;
    void *p = cfg_yaml_alloc(t, (size_t)cap * size);
    if (!p) return 0;
    if (v->n) memcpy(p, v->kind == CFG_YAML_MAP ? (void *)v->pairs : (void *)v->items, (size_t)v->n * size);
    if (v->kind == CFG_YAML_MAP) v->pairs = p;
    else v->items = p;
    v->cap = cap;
    return 1;
}

int cfg_yaml_append(cfg_yaml_tree *t, cfg_yaml_node *seq, cfg_yaml_node *item)
{
    if (!reserve(t, seq)) return 0;
    seq->items[seq->n++] = item;
    return 1;
}

int cfg_yaml_add_pair(cfg_yaml_tree *t, cfg_yaml_node *map, const char *key, int line, int col,
                      cfg_yaml_node *value)
{
    if (!reserve(t, map)) return 0;
    map->pairs[map->n++] = (cfg_yaml_pair){key, line, col, NULL, value};
    return 1;
}

cfg_yaml_pair *cfg_yaml_find(const cfg_yaml_node *map, const char *key)
{
    if (!map || map->kind != CFG_YAML_MAP) return NULL;
    for (int k = 0; k < map->n; k++)
        if (!strcmp(map->pairs[k].key, key)) return &map->pairs[k];
    return NULL;
}

/* The pair at `path` and the map holding it. */
static cfg_yaml_pair *find_path(cfg_yaml_node *map, const char *path, cfg_yaml_node **holder)
{
    char part[256];
    for (;;) {
        size_t n = strcspn(path, ".");
        if (n >= sizeof part) return NULL;
        memcpy(part, path, n);
        part[n] = '\0';
        cfg_yaml_pair *p = cfg_yaml_find(map, part);
        if (!p) return NULL;
        if (!path[n]) {
            if (holder) *holder = map;
            return p;
        }
        map = p->value;
        path += n + 1;
    }
}

cfg_yaml_node *cfg_yaml_get(cfg_yaml_node *map, const char *path, cfg_yaml_pair **pair)
{
    cfg_yaml_pair *p = find_path(map, path, NULL);
    if (pair) *pair = p;
    return p ? p->value : NULL;
}

int cfg_yaml_take(cfg_yaml_node *map, const char *path, cfg_yaml_pair *out)
{
    cfg_yaml_node *holder;
    cfg_yaml_pair *p = find_path(map, path, &holder);
    if (!p) return 0;
    *out = *p;
    int k = (int)(p - holder->pairs);
    memmove(&holder->pairs[k], &holder->pairs[k + 1], (size_t)(holder->n - k - 1) * sizeof *p);
    holder->n--;
    holder->emptied = 1;
    return 1;
}

void cfg_yaml_prune(cfg_yaml_node *map)
{
    for (int k = 0; k < map->n;) {
        cfg_yaml_node *v = map->pairs[k].value;
        if (v->kind == CFG_YAML_MAP) cfg_yaml_prune(v);
        if (v->kind == CFG_YAML_MAP && v->emptied && v->n == 0) {
            memmove(&map->pairs[k], &map->pairs[k + 1], (size_t)(map->n - k - 1) * sizeof *map->pairs);
            map->n--;
            map->emptied = 1;
            continue;
        }
        k++;
    }
}

double cfg_yaml_number(const cfg_yaml_node *v)
{
    return strtod(v->text, NULL);
}

int cfg_yaml_same(const cfg_yaml_node *a, const cfg_yaml_node *b)
{
    if (a->kind != b->kind || a->n != b->n) return 0;
    switch (a->kind) {
    case CFG_YAML_NULL: return 1;
    case CFG_YAML_NUMBER: return cfg_yaml_number(a) == cfg_yaml_number(b);
    case CFG_YAML_BOOL:
    case CFG_YAML_STRING: return a->len == b->len && !memcmp(a->text, b->text, a->len);
    case CFG_YAML_SEQ:
        for (int k = 0; k < a->n; k++)
            if (!cfg_yaml_same(a->items[k], b->items[k])) return 0;
        return 1;
    default:
        for (int k = 0; k < a->n; k++) {
            const cfg_yaml_pair *q = cfg_yaml_find(b, a->pairs[k].key);
            if (!q || !cfg_yaml_same(a->pairs[k].value, q->value)) return 0;
        }
        return 1;
    }
}

void cfg_yaml_describe(const cfg_yaml_node *v, char *buf, size_t cap)
{
    switch (v->kind) {
    case CFG_YAML_NULL: snprintf(buf, cap, "null"); break;
    case CFG_YAML_STRING:
        snprintf(buf, cap, "\"%.*s%s\"", v->len > 60 ? 60 : (int)v->len, v->text, v->len > 60 ? "..." : "");
        break;
    case CFG_YAML_SEQ: snprintf(buf, cap, "a list"); break;
    case CFG_YAML_MAP: snprintf(buf, cap, "a mapping"); break;
    default: snprintf(buf, cap, "%.60s", v->text); break;
    }
}

int cfg_is_yaml_path(const char *path)
{
    size_t n = strlen(path);
    return (n > 5 && !strcasecmp(path + n - 5, ".yaml")) || (n > 4 && !strcasecmp(path + n - 4, ".yml"));
}

/* ---- scalars: YAML 1.1 as PyYAML resolves them ------------------------------------------------- */

/* A number as the two YAML versions read a plain scalar. */
enum { NUM_NONE, NUM_INT, NUM_FLOAT, NUM_NONFINITE, NUM_TOO_LARGE, NUM_NO_DIGITS };

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int in_set(const char *s, size_t n, const char *set)
{
    for (size_t k = 0; k < n; k++)
        if (!strchr(set, s[k]) || !s[k]) return 0;
    return 1;
}

/* s[0, n) without '_', leading zeros cut (one kept), into out. */
static void digits_of(const char *s, size_t n, char *out)
{
    size_t m = 0;
    for (size_t k = 0; k < n; k++)
        if (s[k] != '_') out[m++] = s[k];
    out[m] = '\0';
    size_t zeros = 0;
    while (zeros + 1 < m && out[zeros] == '0') zeros++;
    memmove(out, out + zeros, m - zeros + 1);
}

/* s[0, n) (digits of `base` and '_') as a value; 0 when it does not fit 64 bits. */
static int value_in_base(const char *s, size_t n, int base, uint64_t *out)
{
    uint64_t v = 0;
    int any = 0;
    for (size_t k = 0; k < n; k++) {
        if (s[k] == '_') continue;
        int d = is_digit(s[k]) ? s[k] - '0' : (s[k] | 0x20) - 'a' + 10;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return 0;
        v = v * (uint64_t)base + (uint64_t)d;
        any = 1;
    }
    *out = v;
    return any;
}

/* PyYAML's int: [-+]? then 0b[01_]+, 0x[0-9a-fA-F_]+, 0[0-7_]+, 0, [1-9][0-9_]*, or sexagesimal
 * [1-9][0-9_]*(:[0-5]?[0-9])+. */
static int yaml11_int(const char *s, size_t n, char *out)
{
    size_t i = (n && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    const char *neg = i && s[0] == '-' ? "-" : "";
    const char *b = s + i;
    size_t m = n - i;
    uint64_t v;
    if (m == 0) return NUM_NONE;
    int base = 0;
    size_t skip = 0;
    if (m > 2 && b[0] == '0' && b[1] == 'b' && in_set(b + 2, m - 2, "01_")) base = 2, skip = 2;
    else if (m > 2 && b[0] == '0' && b[1] == 'x' && in_set(b + 2, m - 2, "0123456789abcdefABCDEF_")) base = 16, skip = 2;
    else if (m > 1 && b[0] == '0' && in_set(b + 1, m - 1, "01234567_")) base = 8, skip = 1;
    if (base) {
        if (!value_in_base(b + skip, m - skip, base, &v)) {
            int any = 0;
            for (size_t k = skip; k < m; k++) any |= b[k] != '_';
            if (!any && base != 8) return NUM_NO_DIGITS; /* 0x_: PyYAML's int without digits */
            if (any) return NUM_TOO_LARGE;
            v = 0;
        }
        sprintf(out, "%s%llu", v ? neg : "", (unsigned long long)v);
        return NUM_INT;
    }
    if (m == 1 && b[0] == '0') {
        strcpy(out, "0");
        return NUM_INT;
    }
    if (b[0] < '1' || b[0] > '9') return NUM_NONE;
    size_t first = 0;
    while (first < m && (is_digit(b[first]) || b[first] == '_')) first++;
    if (first == m) {
        sprintf(out, "%s", neg);
        digits_of(b, m, out + strlen(out));
        return NUM_INT;
    }
    /* sexagesimal: 1:30 is 90 */
    if (b[first] != ':' || !value_in_base(b, first, 10, &v)) return b[first] == ':' ? NUM_TOO_LARGE : NUM_NONE;
    size_t k = first;
    while (k < m) {
        if (b[k] != ':') return NUM_NONE;
        size_t d = k + 1;
        while (d < m && is_digit(b[d])) d++;
        size_t len = d - k - 1;
        if (len < 1 || len > 2 || (len == 2 && b[k + 1] > '5')) return NUM_NONE;
        uint64_t part = (uint64_t)(b[k + 1] - '0');
        if (len == 2) part = part * 10 + (uint64_t)(b[k + 2] - '0');
        if (v > (UINT64_MAX - part) / 60) return NUM_TOO_LARGE;
        v = v * 60 + part;
        k = d;
    }
    sprintf(out, "%s%llu", v ? neg : "", (unsigned long long)v);
    return NUM_INT;
}

/* Scan [0-9_]* from s[*k]; returns the count of digits. */
static size_t scan_digits(const char *s, size_t n, size_t *k, int underscores)
{
    size_t digits = 0;
    while (*k < n && (is_digit(s[*k]) || (underscores && s[*k] == '_'))) digits += s[(*k)++] != '_';
    return digits;
}

/* The JSON text of a mantissa int_part.frac_part and exponent (the text after 'e', with its sign). */
static void write_float(char *out, int neg, const char *ip, size_t ni, const char *fp, size_t nf, const char *ep,
                        size_t ne)
{
    char *o = out;
    if (neg) *o++ = '-';
    if (ni) digits_of(ip, ni, o);
    else strcpy(o, "0");
    o += strlen(o);
    size_t m = 0;
    for (size_t k = 0; k < nf; k++)
        if (fp[k] != '_') m++;
    if (m) {
        *o++ = '.';
        for (size_t k = 0; k < nf; k++)
            if (fp[k] != '_') *o++ = fp[k];
    }
    if (ne) {
        *o++ = 'e';
        memcpy(o, ep, ne);
        o += ne;
    }
    *o = '\0';
}

/* ".inf" (after an optional sign, when `sign` allows one) or ".nan" in YAML's three spellings. */
static int is_special(const char *s, size_t n, const char *word, int sign)
{
    size_t i = sign && n && (s[0] == '-' || s[0] == '+') ? 1 : 0;
    if (n - i != 4 || s[i] != '.') return 0;
    const char *w = s + i + 1;
    char upper[4], title[4];
    for (int k = 0; k < 3; k++) upper[k] = (char)(word[k] - 'a' + 'A'), title[k] = word[k];
    title[0] = upper[0];
    if (!strcmp(word, "nan")) title[2] = 'N'; /* NaN */
    return !memcmp(w, word, 3) || !memcmp(w, upper, 3) || !memcmp(w, title, 3);
}

/* PyYAML's float:
 *   [-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?      1.5, 3.e-4, 1.
 *   \.[0-9][0-9_]*([eE][-+][0-9]+)?                  .5 (no sign)
 *   [-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*        sexagesimal, 1:30.5
 *   [-+]?\.(inf|Inf|INF), \.(nan|NaN|NAN) */
static int yaml11_float(const char *s, size_t n, char *out)
{
    size_t i = (n && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    int neg = i && s[0] == '-';
    if (is_special(s, n, "inf", 1) || is_special(s, n, "nan", 0)) return NUM_NONFINITE;
    size_t k = i;
    if (k < n && is_digit(s[k])) {
        size_t ip = k;
        scan_digits(s, n, &k, 1);
        size_t ni = k - ip;
        if (k < n && s[k] == ':') {
            /* sexagesimal float: the last part carries the fraction */
            double v = 0;
            char tmp[64];
            if (ni >= sizeof tmp) return NUM_NONE;
            digits_of(s + ip, ni, tmp);
            v = strtod(tmp, NULL);
            while (k < n && s[k] == ':') {
                size_t d = k + 1;
                while (d < n && is_digit(s[d])) d++;
                size_t len = d - k - 1;
                if (len < 1 || len > 2 || (len == 2 && s[k + 1] > '5')) return NUM_NONE;
                v = v * 60 + (double)atoi(s + k + 1);
                k = d;
            }
            if (k >= n || s[k] != '.') return NUM_NONE;
            size_t fp = ++k;
            scan_digits(s, n, &k, 1);
            if (k != n) return NUM_NONE;
            char frac[80] = "0.";
            size_t m = 2;
            for (size_t q = fp; q < n && m + 1 < sizeof frac; q++)
                if (s[q] != '_') frac[m++] = s[q];
            frac[m] = '\0';
            v += strtod(frac, NULL);
            snprintf(out, 40, "%.17g", neg ? -v : v);
            return isfinite(v) ? NUM_FLOAT : NUM_NONFINITE;
        }
        if (k >= n || s[k] != '.') return NUM_NONE;
        size_t fp = ++k;
        scan_digits(s, n, &k, 1);
        size_t nf = k - fp, ep = 0, ne = 0;
        if (k < n && (s[k] == 'e' || s[k] == 'E')) {
            ep = ++k;
            if (k >= n || (s[k] != '-' && s[k] != '+')) return NUM_NONE;
            k++;
            if (!scan_digits(s, n, &k, 0)) return NUM_NONE;
            ne = k - ep;
        }
        if (k != n) return NUM_NONE;
        write_float(out, neg, s + ip, ni, s + fp, nf, s + ep, ne);
        return NUM_FLOAT;
    }
    if (i || k >= n || s[k] != '.' || k + 1 >= n || !is_digit(s[k + 1])) return NUM_NONE;
    size_t fp = ++k;
    scan_digits(s, n, &k, 1);
    size_t nf = k - fp, ep = 0, ne = 0;
    if (k < n && (s[k] == 'e' || s[k] == 'E')) {
        ep = ++k;
        if (k >= n || (s[k] != '-' && s[k] != '+')) return NUM_NONE;
        k++;
        if (!scan_digits(s, n, &k, 0)) return NUM_NONE;
        ne = k - ep;
    }
    if (k != n) return NUM_NONE;
    write_float(out, 0, NULL, 0, s + fp, nf, s + ep, ne);
    return NUM_FLOAT;
}

/* YAML 1.2's core schema: ints [-+]?[0-9]+, 0o[0-7]+, 0x[0-9a-fA-F]+; floats
 * [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)? and the same .inf / .nan. */
static int yaml12_number(const char *s, size_t n, char *out)
{
    uint64_t v;
    if (n > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'x') &&
        in_set(s + 2, n - 2, s[1] == 'o' ? "01234567" : "0123456789abcdefABCDEF")) {
        if (!value_in_base(s + 2, n - 2, s[1] == 'o' ? 8 : 16, &v)) return NUM_TOO_LARGE;
        sprintf(out, "%llu", (unsigned long long)v);
        return NUM_INT;
    }
    size_t i = (n && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    int neg = i && s[0] == '-';
    if (is_special(s, n, "inf", 1) || is_special(s, n, "nan", 0)) return NUM_NONFINITE;
    size_t k = i, ip = i;
    size_t ni = scan_digits(s, n, &k, 0), fp = k, nf = 0, ep = 0, ne = 0;
    int dot = 0;
    if (k < n && s[k] == '.') {
        dot = 1;
        fp = ++k;
        nf = scan_digits(s, n, &k, 0);
        if (!ni && !nf) return NUM_NONE;
    } else if (!ni) {
        return NUM_NONE;
    }
    if (k < n && (s[k] == 'e' || s[k] == 'E')) {
        ep = ++k;
        if (k < n && (s[k] == '-' || s[k] == '+')) k++;
        if (!scan_digits(s, n, &k, 0)) return NUM_NONE;
        ne = k - ep;
    }
    if (k != n) return NUM_NONE;
    write_float(out, neg, s + ip, ni, s + fp, nf, s + ep, ne);
    return dot || ne ? NUM_FLOAT : NUM_INT;
}

/* A timestamp as PyYAML's resolver sees one: 2001-12-14, or 2001-12-14T21:59:43.10-05:00 and its kin. */
static int yaml11_timestamp(const char *s, size_t n)
{
    size_t k = 0;
#define DIGITS(lo, hi)                                                                                           \
    do {                                                                                                         \
        size_t d_ = 0;                                                                                           \
        while (k < n && is_digit(s[k]) && d_ < (hi)) k++, d_++;                                                  \
        if (d_ < (lo)) return 0;                                                                                 \
    } while (0)
    DIGITS(4, 4);
    if (k >= n || s[k++] != '-') return 0;
    size_t month = k;
    DIGITS(1, 2);
    if (k >= n || s[k++] != '-') return 0;
    size_t day = k;
    DIGITS(1, 2);
    if (k == n) return day - month == 3 && n - day == 2; /* the date alone: two digits each */
    if (s[k] == 'T' || s[k] == 't') k++;
    else if (s[k] == ' ' || s[k] == '\t')
        while (k < n && (s[k] == ' ' || s[k] == '\t')) k++;
    else return 0;
    DIGITS(1, 2);
    if (k >= n || s[k++] != ':') return 0;
    DIGITS(2, 2);
    if (k >= n || s[k++] != ':') return 0;
    DIGITS(2, 2);
    if (k < n && s[k] == '.') {
        k++;
        while (k < n && is_digit(s[k])) k++;
    }
    while (k < n && (s[k] == ' ' || s[k] == '\t')) k++;
    if (k < n && s[k] == 'Z') k++;
    else if (k < n && (s[k] == '-' || s[k] == '+')) {
        k++;
        DIGITS(1, 2);
        if (k < n && s[k] == ':') {
            k++;
            DIGITS(2, 2);
        }
    }
#undef DIGITS
    return k == n;
}

static int is_word(const char *s, size_t n, const char *const *words)
{
    for (int k = 0; words[k]; k++)
        if (strlen(words[k]) == n && !memcmp(s, words[k], n)) return 1;
    return 0;
}

static const char *const k_null[] = {"", "~", "null", "Null", "NULL", NULL};
static const char *const k_true[] = {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", NULL};
static const char *const k_false[] = {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF", NULL};

/* How a scalar is typed: by its tag when it has one, else (plain) by its text; quoted: a string. */
typedef struct scalar {
    const char *s;
    size_t n;
    const char *tag; /* NULL: none */
    int plain;
} scalar;

/* The node of scalar `sc`, or NULL with `problem` (a sentence, after the place) set. */
static cfg_yaml_node *resolve(cfg_yaml_tree *t, const scalar *sc, int line, int col, char *problem, size_t cap)
{
    const char *s = sc->s;
    size_t n = sc->n;
    const char *tag = sc->tag;
    static const char p[] = "tag:yaml.org,2002:";
    const char *type = NULL; /* "str", "int", ...: what to read the text as */
    if (tag && !strcmp(tag, "!")) tag = NULL; /* PyYAML types "! 12" as it types "12" */
    if (tag && !strncmp(tag, p, sizeof p - 1)) type = tag + sizeof p - 1;
    else if (tag) {
        snprintf(problem, cap, "the tag %s is not one zt reads; a config's values are text, numbers, true/false, "
                 "null, lists and mappings", tag);
        return NULL;
    } else if (!sc->plain) type = "str";
    if (type && strcmp(type, "str") && strcmp(type, "int") && strcmp(type, "float") && strcmp(type, "bool") &&
        strcmp(type, "null")) {
        snprintf(problem, cap, "the tag !!%s is not one zt reads; a config's values are text, numbers, true/false, "
                 "null, lists and mappings", type);
        return NULL;
    }
    if (type && !strcmp(type, "str")) {
        if (memchr(s, '\0', n)) {
            snprintf(problem, cap, "the text holds a NUL character, which zt cannot pass on");
            return NULL;
        }
        cfg_yaml_node *v = cfg_yaml_new(t, CFG_YAML_STRING, NULL, line, col);
        if (v && !(v->text = cfg_yaml_strdup(t, s, n))) return NULL;
        if (v) v->len = n;
        return v;
    }
    if ((!type || !strcmp(type, "null")) && is_word(s, n, k_null))
        return cfg_yaml_new(t, CFG_YAML_NULL, "null", line, col);
    if ((!type || !strcmp(type, "bool")) && (is_word(s, n, k_true) || is_word(s, n, k_false)))
        return cfg_yaml_new(t, CFG_YAML_BOOL, is_word(s, n, k_true) ? "true" : "false", line, col);
    if (type && (!strcmp(type, "null") || !strcmp(type, "bool"))) {
        snprintf(problem, cap, "\"%.*s\" is not a !!%s (%s)", n > 40 ? 40 : (int)n, s, type,
                 !strcmp(type, "null") ? "null, ~ or nothing" : "true/false, yes/no or on/off");
        return NULL;
    }
    if (!type && yaml11_timestamp(s, n)) {
        snprintf(problem, cap, "\"%.*s\" is a date in YAML 1.1 (PyYAML reads it so), and no zt key takes a date: "
                 "quote it for text", n > 40 ? 40 : (int)n, s);
        return NULL;
    }
    char *y11 = cfg_yaml_alloc(t, n + 48), *y12 = cfg_yaml_alloc(t, n + 48);
    if (!y11 || !y12) return NULL;
    int a = yaml11_int(s, n, y11);
    if (a == NUM_NONE && (!type || strcmp(type, "int"))) a = yaml11_float(s, n, y11);
    int b = yaml12_number(s, n, y12);
    if (type && !strcmp(type, "int") && b == NUM_FLOAT) b = NUM_NONE;
    if (a == NUM_NONFINITE || (a == NUM_NONE && b == NUM_NONFINITE)) {
        snprintf(problem, cap, "%.*s is not a finite number, and zt's keys take finite numbers only",
                 n > 40 ? 40 : (int)n, s);
        return NULL;
    }
    if (a == NUM_NO_DIGITS) {
        snprintf(problem, cap, "%.*s is read as a number without digits (YAML 1.1's 0x and 0b forms); quote it "
                 "for text", n > 40 ? 40 : (int)n, s);
        return NULL;
    }
    if (a == NUM_TOO_LARGE || (a == NUM_NONE && b == NUM_TOO_LARGE)) {
        snprintf(problem, cap, "%.*s is too large for a 64-bit integer", n > 40 ? 40 : (int)n, s);
        return NULL;
    }
    if (a == NUM_INT && b == NUM_INT && strtod(y11, NULL) != strtod(y12, NULL)) {
        snprintf(problem, cap, "%.*s is %s in YAML 1.1 (an octal number, as PyYAML and so MindFormers read it) but "
                 "%s in YAML 1.2: write it without the leading zero (or 0o%.*s for octal)",
                 n > 40 ? 40 : (int)n, s, y11, y12, n > 40 ? 40 : (int)n - 1, s + 1);
        return NULL;
    }
    if (a != NUM_NONE || b != NUM_NONE)
        return cfg_yaml_new(t, CFG_YAML_NUMBER, a != NUM_NONE ? y11 : y12, line, col);
    if (type) {
        snprintf(problem, cap, "\"%.*s\" is not a !!%s", n > 40 ? 40 : (int)n, s, type);
        return NULL;
    }
    scalar text = *sc;
    text.tag = NULL;
    text.plain = 0; /* no type: text */
    return resolve(t, &text, line, col, problem, cap);
}

/* ---- building the tree from libyaml's events -------------------------------------------------- */

typedef struct anchor {
    const char *name;
    cfg_yaml_node *node;
    int complete;
} anchor;

typedef struct frame {
    cfg_yaml_node *node; /* the SEQ or MAP being read */
    int anchor;          /* index of its anchor, -1 for none */
    /* a MAP: the key read, waiting for its value */
    int have_key, key_is_merge;
    const char *key;
    int key_line, key_col;
    int merge_line;      /* its << key's line; 0: none yet */
    cfg_yaml_node **merges; /* the mappings << names, first first */
    int n_merges, cap_merges;
} frame;

typedef struct builder {
    cfg_yaml_tree *t;
    frame *stack;
    int depth;
    anchor *anchors;
    int n_anchors, cap_anchors;
    cfg_yaml_node *root;
    int documents;
    zt_error *err;
} builder;

static zt_status oom(builder *b)
{
    return zt_error_set(b->err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory reading the YAML file", b->t->origin);
}

static zt_status fail(builder *b, int line, int col, const char *fmt, ...) ZT_PRINTF(4, 5);
static zt_status fail(builder *b, int line, int col, const char *fmt, ...)
{
    char msg[ZT_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return zt_error_set(b->err, ZT_ERR_FORMAT, "%s:%d:%d: %s", b->t->origin, line, col, msg);
}

/* A copy of an anchored node where an alias names it (a copy: the layer may rewrite either). */
static cfg_yaml_node *copy_node(builder *b, const cfg_yaml_node *src, int depth, zt_status *st)
{
    if (b->t->n_nodes >= MAX_NODES) {
        *st = fail(b, src->line, src->col,
                   "expanding the aliases of this file makes more than %ld values: no config is that large (aliases "
                   "that name aliases multiply; is this file meant to be a config?)",
                   MAX_NODES);
        return NULL;
    }
    if (depth > MAX_DEPTH) {
        *st = fail(b, src->line, src->col, "the values nest deeper than %d levels once the aliases are expanded",
                   MAX_DEPTH);
        return NULL;
    }
    cfg_yaml_node *v = cfg_yaml_new(b->t, src->kind, src->text, src->line, src->col);
    if (!v) {
        *st = oom(b);
        return NULL;
    }
    v->len = src->len;
    for (int k = 0; k < src->n; k++) {
        cfg_yaml_node *item = copy_node(b, src->kind == CFG_YAML_MAP ? src->pairs[k].value : src->items[k], depth + 1, st);
        if (!item) return NULL;
        int ok = src->kind == CFG_YAML_MAP ? cfg_yaml_add_pair(b->t, v, src->pairs[k].key, src->pairs[k].line,
                                                               src->pairs[k].col, item)
                                           : cfg_yaml_append(b->t, v, item);
        if (!ok) {
            *st = oom(b);
            return NULL;
        }
    }
    return v;
}

static const char *kind_name(int kind)
{
    static const char *const names[] = {"null", "true/false", "a number", "text", "a list", "a mapping"};
    return names[kind];
}

/* A node is complete: it is the root, an item, a key (scalars only) or a key's value. `sc`: the scalar
 * it was read from (a key's spelling decides whether it is <<), NULL for others. */
static zt_status add_node(builder *b, cfg_yaml_node *v, const scalar *sc)
{
    if (b->depth == 0) {
        b->root = v;
        return ZT_OK;
    }
    frame *f = &b->stack[b->depth - 1];
    if (f->node->kind == CFG_YAML_SEQ) return cfg_yaml_append(b->t, f->node, v) ? ZT_OK : oom(b);
    if (!f->have_key) {
        if (sc && sc->plain && !sc->tag && sc->n == 2 && !memcmp(sc->s, "<<", 2)) {
            if (f->merge_line)
                return fail(b, v->line, v->col, "a second << in this mapping (the first is on line %d): give one << "
                            "with a list of the mappings to merge, << : [*a, *b]", f->merge_line);
            f->key_is_merge = 1;
            f->merge_line = v->line;
        } else if (v->kind != CFG_YAML_STRING) {
            char shown[96];
            cfg_yaml_describe(v, shown, sizeof shown);
            if (v->kind == CFG_YAML_SEQ || v->kind == CFG_YAML_MAP)
                return fail(b, v->line, v->col, "a key must be text, found %s", kind_name(v->kind));
            int n = sc ? (sc->n > 40 ? 40 : (int)sc->n) : (int)strlen(shown);
            const char *spelt = sc ? sc->s : shown;
            const char *as = v->kind == CFG_YAML_BOOL ? "the boolean " : v->kind == CFG_YAML_NUMBER ? "the number " : "";
            return fail(b, v->line, v->col,
                        "the key %.*s is read as %s%s, not as text, in YAML 1.1 (as PyYAML reads it): a config key is "
                        "text; quote it ('%.*s':) if you mean it", n, spelt, as, shown, n, spelt);
        } else {
            const cfg_yaml_pair *dup = cfg_yaml_find(f->node, v->text);
            if (dup)
                return fail(b, v->line, v->col,
                            "the key '%s' is given twice in this mapping (lines %d and %d); keep one", v->text,
                            dup->line, v->line);
            f->key_is_merge = 0;
            f->key = v->text;
        }
        f->key_line = v->line;
        f->key_col = v->col;
        f->have_key = 1;
        return ZT_OK;
    }
    f->have_key = 0;
    if (!f->key_is_merge)
        return cfg_yaml_add_pair(b->t, f->node, f->key, f->key_line, f->key_col, v) ? ZT_OK : oom(b);
    /* << : a mapping, or a list of mappings (the earlier ones win) */
    int n = v->kind == CFG_YAML_SEQ ? v->n : 1;
    for (int k = 0; k < n; k++) {
        cfg_yaml_node *m = v->kind == CFG_YAML_SEQ ? v->items[k] : v;
        if (m->kind != CFG_YAML_MAP)
            return fail(b, m->line, m->col, "<< merges mappings, but this is %s: give << a mapping (*name of an "
                        "anchored one) or a list of them", kind_name(m->kind));
        if (f->n_merges == f->cap_merges) {
            int cap = f->cap_merges ? 2 * f->cap_merges : 4;
            cfg_yaml_node **p = cfg_yaml_alloc(b->t, (size_t)cap * sizeof *p);
            if (!p) return oom(b);
            if (f->n_merges) memcpy(p, f->merges, (size_t)f->n_merges * sizeof *p);
            f->merges = p;
            f->cap_merges = cap;
        }
        f->merges[f->n_merges++] = m;
    }
    return ZT_OK;
}

static zt_status register_anchor(builder *b, const yaml_char_t *name, cfg_yaml_node *v, int complete, int *index)
{
    if (index) *index = -1;
    if (!name) return ZT_OK;
    if (b->n_anchors == b->cap_anchors) {
        int cap = b->cap_anchors ? 2 * b->cap_anchors : 16;
        anchor *p = realloc(b->anchors, (size_t)cap * sizeof *p);
        if (!p) return oom(b);
        b->anchors = p;
        b->cap_anchors = cap;
    }
    const char *copy = cfg_yaml_strdup(b->t, (const char *)name, strlen((const char *)name));
    if (!copy) return oom(b);
    b->anchors[b->n_anchors] = (anchor){copy, v, complete};
    if (index) *index = b->n_anchors;
    b->n_anchors++;
    return ZT_OK;
}

static zt_status on_event(builder *b, const yaml_event_t *ev)
{
    int line = (int)ev->start_mark.line + 1, col = (int)ev->start_mark.column + 1;
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (++b->documents > 1)
            return fail(b, line, col, "a second YAML document starts here: a config file holds one document; remove "
                        "the '---' line and what follows, or put it in a file of its own");
        return ZT_OK;
    case YAML_SCALAR_EVENT: {
        scalar sc = {(const char *)ev->data.scalar.value, ev->data.scalar.length, (const char *)ev->data.scalar.tag,
                     ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE};
        char problem[512];
        problem[0] = '\0';
        cfg_yaml_node *v = resolve(b->t, &sc, line, col, problem, sizeof problem);
        if (!v) return problem[0] ? fail(b, line, col, "%s", problem) : oom(b);
        zt_status st = register_anchor(b, ev->data.scalar.anchor, v, 1, NULL);
        return st == ZT_OK ? add_node(b, v, &sc) : st;
    }
    case YAML_ALIAS_EVENT: {
        const char *name = (const char *)ev->data.alias.anchor;
        int k = b->n_anchors - 1;
        while (k >= 0 && strcmp(b->anchors[k].name, name)) k--;
        if (k < 0)
            return fail(b, line, col, "the alias *%s names no anchor: define &%s on a value above this line", name,
                        name);
        if (!b->anchors[k].complete)
            return fail(b, line, col, "the alias *%s is inside the value anchored &%s (line %d) that it names: a config "
                        "cannot contain itself", name, name, b->anchors[k].node->line);
        zt_status st = ZT_OK;
        cfg_yaml_node *v = copy_node(b, b->anchors[k].node, b->depth + 1, &st);
        if (!v) return st;
        v->line = line; /* where it is used */
        v->col = col;
        return add_node(b, v, NULL);
    }
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        int map = ev->type == YAML_MAPPING_START_EVENT;
        const yaml_char_t *tag = map ? ev->data.mapping_start.tag : ev->data.sequence_start.tag;
        const char *want = map ? "tag:yaml.org,2002:map" : "tag:yaml.org,2002:seq";
        if (tag && strcmp((const char *)tag, want) && strcmp((const char *)tag, "!"))
            return fail(b, line, col, "the tag %s is not one zt reads; a config's values are text, numbers, "
                        "true/false, null, lists and mappings", (const char *)tag);
        if (b->depth > 0) {
            const frame *f = &b->stack[b->depth - 1];
            if (f->node->kind == CFG_YAML_MAP && !f->have_key)
                return fail(b, line, col, "a key must be text, found %s", map ? "a mapping" : "a list");
        }
        if (b->depth >= MAX_DEPTH) return fail(b, line, col, "the values nest deeper than %d levels", MAX_DEPTH);
        cfg_yaml_node *v = cfg_yaml_new(b->t, map ? CFG_YAML_MAP : CFG_YAML_SEQ, NULL, line, col);
        if (!v) return oom(b);
        frame *f = &b->stack[b->depth++];
        memset(f, 0, sizeof *f);
        f->node = v;
        return register_anchor(b, map ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor, v, 0,
                               &f->anchor);
    }
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT: {
        frame f = b->stack[--b->depth];
        /* merged keys: those the mapping does not give itself, the first mapping's first */
        for (int m = 0; m < f.n_merges; m++)
            for (int k = 0; k < f.merges[m]->n; k++) {
                const cfg_yaml_pair *p = &f.merges[m]->pairs[k];
                if (!cfg_yaml_find(f.node, p->key) && !cfg_yaml_add_pair(b->t, f.node, p->key, p->line, p->col, p->value))
                    return oom(b);
            }
        if (f.anchor >= 0) b->anchors[f.anchor].complete = 1;
        return add_node(b, f.node, NULL);
    }
    default: return ZT_OK;
    }
}

/* libyaml's error, with the place and what usually causes it. */
static zt_status syntax_error(const yaml_parser_t *p, const char *origin, const char *text, size_t len, zt_error *err)
{
    if (p->error == YAML_MEMORY_ERROR)
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory reading the YAML file", origin);
    if (p->error == YAML_READER_ERROR) {
        int line = 1, col = 1;
        for (size_t k = 0; k < p->problem_offset && k < len; k++) {
            if (text[k] == '\n') line++, col = 1;
            else if (((unsigned char)text[k] & 0xC0) != 0x80) col++;
        }
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s:%d:%d: the file is not valid UTF-8 (libyaml: %s, byte offset %zu): save it as UTF-8",
                            origin, line, col, p->problem ? p->problem : "bad bytes", p->problem_offset);
    }
    int line = (int)p->problem_mark.line + 1, col = (int)p->problem_mark.column + 1;
    /* the line's text, for the hints */
    const char *at = text;
    for (int k = 1; k < line && at; k++) {
        at = memchr(at, '\n', len - (size_t)(at - text));
        if (at) at++;
    }
    int tab = 0;
    if (at) {
        const char *end = memchr(at, '\n', len - (size_t)(at - text));
        for (const char *c = at; c < (end ? end : text + len) && (*c == ' ' || *c == '\t'); c++) tab |= *c == '\t';
        const char *c = at, *lim = end ? end : text + len;
        for (int k = 1; k < col && c < lim; k++) {
            c++;
            while (c < lim && ((unsigned char)*c & 0xC0) == 0x80) c++;
        }
        tab |= c < lim && *c == '\t';
    }
    const char *problem = p->problem ? p->problem : "syntax error";
    const char *hint = "";
    if (tab)
        hint = "; a tab: YAML indents with spaces only";
    else if (strstr(problem, "mapping values are not allowed"))
        hint = "; a ': ' inside a value that is not quoted, or a key indented deeper than the keys above it: quote "
               "the value, or line the key up with its neighbours";
    else if (strstr(problem, "did not find expected key") || strstr(problem, "did not find expected '-'") ||
             strstr(problem, "could not find expected ':'"))
        hint = "; the indentation of this line does not match the lines above it: keys of one mapping start in "
               "the same column";
    if (p->context)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s:%d:%d: YAML syntax error: %s (%s from %d:%d)%s", origin,
                            line, col, problem, p->context, (int)p->context_mark.line + 1,
                            (int)p->context_mark.column + 1, hint);
    return zt_error_set(err, ZT_ERR_FORMAT, "%s:%d:%d: YAML syntax error: %s%s", origin, line, col, problem, hint);
}

/* The root mapping of YAML text `text`. */
static zt_status build_tree(cfg_yaml_tree *t, const char *text, size_t len, zt_error *err)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory reading the YAML file", t->origin);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    builder b = {t, calloc(MAX_DEPTH + 1, sizeof(frame)), 0, NULL, 0, 0, NULL, 0, err};
    zt_status st = b.stack ? ZT_OK : oom(&b);
    for (int done = 0; st == ZT_OK && !done;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            st = syntax_error(&parser, t->origin, text, len, err);
            break;
        }
        done = ev.type == YAML_STREAM_END_EVENT;
        st = on_event(&b, &ev);
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    free(b.stack);
    free(b.anchors);
    if (st != ZT_OK) return st;
    if (!b.root || (b.root->kind == CFG_YAML_NULL))
        return zt_error_set(err, ZT_ERR_CONFIG, "%s holds no values: a config is a YAML mapping, one 'key: value' "
                            "per line", t->origin);
    if (b.root->kind != CFG_YAML_MAP)
        return zt_error_set(err, ZT_ERR_CONFIG, "%s:%d:%d: a config must be a YAML mapping ('key: value' lines), found "
                            "%s", t->origin, b.root->line, b.root->col,
                            b.root->kind == CFG_YAML_SEQ ? "a list" : "a single value");
    t->root = b.root;
    return ZT_OK;
}

/* ---- writing the tree as JSON, with the places ------------------------------------------------ */

typedef struct writer {
    FILE *f;
    cfg_place *places;
    int n, cap;
    int failed;
} writer;

static void put_place(writer *w, int line, int col, const char *note)
{
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        cfg_place *p = realloc(w->places, (size_t)cap * sizeof *p);
        if (!p) {
            w->failed = 1;
            return;
        }
        w->places = p;
        w->cap = cap;
    }
    long at = ftell(w->f);
    char *copy = note ? strdup(note) : NULL;
    if (at < 0 || (note && !copy)) w->failed = 1;
    w->places[w->n++] = (cfg_place){(size_t)(at < 0 ? 0 : at), line, col, copy};
}

static void write_node(writer *w, const cfg_yaml_node *v)
{
    put_place(w, v->line, v->col, v->note);
    switch (v->kind) {
    case CFG_YAML_NULL: fputs("null", w->f); break;
    case CFG_YAML_STRING: zt_json_write_string(w->f, v->text, v->len); break;
    case CFG_YAML_SEQ:
        fputc('[', w->f);
        for (int k = 0; k < v->n; k++) {
            if (k) fputc(',', w->f);
            write_node(w, v->items[k]);
        }
        fputc(']', w->f);
        break;
    case CFG_YAML_MAP:
        fputc('{', w->f);
        for (int k = 0; k < v->n; k++) {
            if (k) fputc(',', w->f);
            put_place(w, v->pairs[k].line, v->pairs[k].col, v->pairs[k].note);
            zt_json_write_string(w->f, v->pairs[k].key, strlen(v->pairs[k].key));
            fputc(':', w->f);
            write_node(w, v->pairs[k].value);
        }
        fputc('}', w->f);
        break;
    default: fputs(v->text, w->f); break;
    }
}

/* ---- loading ---------------------------------------------------------------------------------- */

/* Keep what the MindFormers layer learnt in cfg: its notes and launch keys. */
static zt_status keep_results(zt_config *cfg, const cfg_mf_result *mf, zt_error *err)
{
    if (mf->notes_len) {
        char *notes = realloc(cfg->notes, cfg->notes_len + mf->notes_len + 1);
        if (!notes) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory keeping the config's notes");
        memcpy(notes + cfg->notes_len, mf->notes_text, mf->notes_len + 1);
        cfg->notes = notes;
        cfg->notes_len += mf->notes_len;
    }
    for (int k = 0; k < mf->n_launch; k++) {
        if (!cfg_grow((void **)&cfg->launch, &cfg->cap_launch, cfg->n_launch + 1, sizeof *cfg->launch))
            return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory keeping the config's launch keys");
        cfg_launch_key *l = &cfg->launch[cfg->n_launch];
        l->key = strdup(mf->launch[k].key);
        l->value = strdup(mf->launch[k].value);
        l->place = strdup(mf->launch[k].place);
        cfg->n_launch++;
        if (!l->key || !l->value || !l->place)
            return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory keeping the config's launch keys");
    }
    return ZT_OK;
}

zt_status cfg_yaml_load(zt_config *cfg, char *text, size_t len, const char *origin, zt_error *err)
{
    cfg_yaml_tree t;
    memset(&t, 0, sizeof t);
    t.origin = origin;
    zt_status st = build_tree(&t, text, len, err);
    free(text);
    cfg_mf_result mf;
    memset(&mf, 0, sizeof mf);
    if (st == ZT_OK) {
        mf.notes = open_memstream(&mf.notes_text, &mf.notes_len);
        problem_list problems;
        cfg_problems_open(&problems);
        if (mf.notes) cfg_mindformers_apply(&t, &mf, &problems);
        else cfg_problem_add(&problems, "%s: out of memory reading the YAML file", origin);
        st = cfg_problems_close(&problems, ZT_ERR_CONFIG, err);
        if (mf.notes && fclose(mf.notes) != 0 && st == ZT_OK)
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory reading the YAML file", origin);
    }
    writer w = {NULL, NULL, 0, 0, 0};
    char *json = NULL;
    size_t json_len = 0;
    if (st == ZT_OK) {
        w.f = open_memstream(&json, &json_len);
        if (w.f) write_node(&w, t.root);
        if (!w.f || fclose(w.f) != 0 || w.failed || !json)
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory reading the YAML file", origin);
    }
    if (st == ZT_OK) {
        st = cfg_load_document(cfg, json, json_len, origin, w.places, w.n, err); /* takes json and the places */
        json = NULL;
        w.places = NULL;
        w.n = 0;
    }
    if (st == ZT_OK) st = keep_results(cfg, &mf, err);
    for (int k = 0; k < w.n; k++) free(w.places[k].note);
    free(w.places);
    free(json);
    free(mf.notes_text);
    tree_free(&t);
    return st;
}
