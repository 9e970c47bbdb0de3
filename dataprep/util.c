/* Small helpers shared by zt-prep's modules: memory, buffers, messages, PRNG, files. */
#define _POSIX_C_SOURCE 200809L
#include "prep.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void *prep_xmalloc(size_t n, const char *what)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        prep_fail("out of memory allocating %zu bytes for %s", n, what);
        exit(1);
    }
    return p;
}

void *prep_xrealloc(void *p, size_t n, const char *what)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        prep_fail("out of memory growing %s to %zu bytes", what, n);
        exit(1);
    }
    return q;
}

char *prep_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = prep_xmalloc(n, "a string");
    memcpy(d, s, n);
    return d;
}

void prep_out_of_memory(const char *what)
{
    prep_fail("out of memory growing %s", what);
    exit(1);
}

void prep_buf_reserve(prep_buf *b, size_t extra)
{
    if (zt_buf_reserve(b, extra) != 0) prep_out_of_memory("a text buffer");
}

void prep_buf_append(prep_buf *b, const void *p, size_t n)
{
    if (zt_buf_append(b, p, n) != 0) prep_out_of_memory("a text buffer");
}

static void vmessage(const char *prefix, const char *fmt, va_list ap)
{
    /* One write per message so lines from the progress display never interleave mid-line. */
    char line[ZT_ERROR_MSG_MAX + 64];
    /* On a terminal, first clear the progress bar's line (it is redrawn on its next update). */
    int n = snprintf(line, sizeof line, "%szt-prep: %s", isatty(STDERR_FILENO) ? "\r\x1b[K" : "", prefix);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    size_t len = strlen(line);
    if (len + 1 < sizeof line) line[len++] = '\n';
    fwrite(line, 1, len, stderr);
}

void prep_info(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage("", fmt, ap);
    va_end(ap);
}

void prep_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage("warning: ", fmt, ap);
    va_end(ap);
}

void prep_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage("error: ", fmt, ap);
    va_end(ap);
}

uint64_t prep_random_below(uint64_t *state, uint64_t n)
{
    /* Rejection sampling keeps every value exactly equally likely (plain modulo would not). */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do {
        r = zt_splitmix64(state);
    } while (r >= limit);
    return r % n;
}

/* ---- counter of names -------------------------------------------------------------------------- */

static uint64_t name_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static void counter_grow(prep_counter *c)
{
    size_t n_slots = c->n_slots ? c->n_slots * 2 : 64;
    uint32_t *slots = calloc(n_slots, sizeof *slots);
    if (!slots) {
        prep_fail("out of memory counting field names");
        exit(1);
    }
    for (size_t i = 0; i < c->n; i++) {
        size_t s = name_hash(c->names[i], strlen(c->names[i])) & (n_slots - 1);
        while (slots[s]) s = (s + 1) & (n_slots - 1);
        slots[s] = (uint32_t)(i + 1);
    }
    free(c->slots);
    c->slots = slots;
    c->n_slots = n_slots;
    c->names = prep_xrealloc(c->names, n_slots / 2 * sizeof *c->names, "field names");
    c->counts = prep_xrealloc(c->counts, n_slots / 2 * sizeof *c->counts, "field counts");
}

void prep_counter_add(prep_counter *c, const char *name, size_t len)
{
    if (c->n + 1 > c->n_slots / 2) counter_grow(c);
    size_t s = name_hash(name, len) & (c->n_slots - 1);
    while (c->slots[s]) {
        size_t i = c->slots[s] - 1;
        if (strlen(c->names[i]) == len && memcmp(c->names[i], name, len) == 0) {
            c->counts[i]++;
            return;
        }
        s = (s + 1) & (c->n_slots - 1);
    }
    char *copy = prep_xmalloc(len + 1, "a field name");
    memcpy(copy, name, len);
    copy[len] = '\0';
    c->names[c->n] = copy;
    c->counts[c->n] = 1;
    c->slots[s] = (uint32_t)(++c->n);
}

void prep_counter_free(prep_counter *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->names[i]);
    free(c->names);
    free(c->counts);
    free(c->slots);
    memset(c, 0, sizeof *c);
}

static const prep_counter *g_sort_counter;
static int cmp_counter_names(const void *a, const void *b)
{
    return strcmp(g_sort_counter->names[*(const size_t *)a],
                  g_sort_counter->names[*(const size_t *)b]);
}

size_t *prep_counter_sorted(const prep_counter *c)
{
    size_t *idx = prep_xmalloc((c->n ? c->n : 1) * sizeof *idx, "sorted field names");
    for (size_t i = 0; i < c->n; i++) idx[i] = i;
    g_sort_counter = c; /* single-threaded: only the main thread writes the manifest */
    qsort(idx, c->n, sizeof *idx, cmp_counter_names);
    return idx;
}
