/* zt-report's small utilities (report.h): allocation that ends the run, buffers, messages, number
 * formats. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

void report_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("zt-report: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void report_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("zt-report: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void out_of_memory(const char *what, size_t n)
{
    report_fail("out of memory allocating %zu bytes for %s", n, what);
    exit(1);
}

void *report_xmalloc(size_t n, const char *what)
{
    void *p = malloc(n ? n : 1);
    if (!p) out_of_memory(what, n);
    return p;
}

void *report_xrealloc(void *p, size_t n, const char *what)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) out_of_memory(what, n);
    return q;
}

void *report_xcalloc(size_t n, size_t size, const char *what)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory(what, n * size);
    return p;
}

char *report_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = report_xmalloc(n, "a string");
    memcpy(d, s, n);
    return d;
}

char *report_format(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = report_xmalloc((size_t)(n < 0 ? 0 : n) + 1, "a string");
    vsnprintf(s, (size_t)(n < 0 ? 0 : n) + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

void report_buf_add(zt_buf *b, const void *p, size_t n)
{
    if (zt_buf_append(b, p, n) != 0) out_of_memory("the page", b->len + n);
}

void report_buf_puts(zt_buf *b, const char *s) { report_buf_add(b, s, strlen(s)); }

void report_buf_printf(zt_buf *b, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n > 0) {
        if (zt_buf_reserve(b, (size_t)n) != 0) out_of_memory("the page", b->len + (size_t)n);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void report_buf_escaped(zt_buf *b, const char *s)
{
    for (const char *p = s; *p; p++) {
        switch (*p) {
        case '&': report_buf_puts(b, "&amp;"); break;
        case '<': report_buf_puts(b, "&lt;"); break;
        case '>': report_buf_puts(b, "&gt;"); break;
        case '"': report_buf_puts(b, "&quot;"); break;
        default: report_buf_add(b, p, 1);
        }
    }
}

void report_format_bytes(double bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (!(bytes == bytes)) {
        snprintf(buf, cap, "-");
        return;
    }
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%.0f B", bytes);
    else snprintf(buf, cap, "%.*f %s", bytes >= 100 ? 0 : bytes >= 10 ? 1 : 2, bytes, units[u]);
}

void report_format_rate(double per_s, char *buf, size_t cap)
{
    if (!(per_s == per_s)) snprintf(buf, cap, "-");
    else if (per_s >= 1e6) snprintf(buf, cap, "%.2fM", per_s / 1e6);
    else if (per_s >= 1e4) snprintf(buf, cap, "%.1fk", per_s / 1e3);
    else snprintf(buf, cap, "%.0f", per_s);
}

const char *report_fit_text(const char *s, int max, char *buf, size_t cap)
{
    size_t n = strlen(s);
    if ((int)n <= max || max < 4 || cap < (size_t)max + 1) return s;
    snprintf(buf, cap, "%.*s...", max - 3, s);
    return buf;
}
