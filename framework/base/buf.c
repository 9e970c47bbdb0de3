#include "base/buf.h"

#include <stdlib.h>
#include <string.h>

int zt_buf_reserve(zt_buf *b, size_t extra)
{
    if (extra > (size_t)-1 / 2 - b->len) return -1;
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra + 1) cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data) return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

int zt_buf_append(zt_buf *b, const void *p, size_t n)
{
    if (zt_buf_reserve(b, n) != 0) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

void zt_buf_free(zt_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
