/* A growable byte buffer, kept NUL-terminated so its text can be printed or parsed as it is. The
 * one buffer type of zt's host and zt-prep (prompt rendering, zt-prep's text building). */
#ifndef ZT_FRAMEWORK_BUF_H
#define ZT_FRAMEWORK_BUF_H

#include <stddef.h>

typedef struct zt_buf {
    char *data; /* NULL until the first append */
    size_t len, cap;
} zt_buf;

/* Room for `extra` more bytes (and the NUL after them). 0 on success, -1 when out of memory (the
 * buffer is unchanged). */
int zt_buf_reserve(zt_buf *b, size_t extra);
/* Append n bytes; 0 on success, -1 when out of memory (the buffer is unchanged). */
int zt_buf_append(zt_buf *b, const void *p, size_t n);
void zt_buf_free(zt_buf *b);

#endif
