/* Error reporting inside the host: every fallible framework function returns a zt_status and, on
 * failure, fills a caller-provided zt_error with a message that says what went wrong, where, and how
 * to fix it. Messages are complete sentences without a trailing newline; several lines are allowed
 * (e.g. the list of paths tried). */
#ifndef ZT_FRAMEWORK_ERROR_H
#define ZT_FRAMEWORK_ERROR_H

#include <stdarg.h>
#include "zt/zt_types.h"

#define ZT_ERROR_MSG_MAX 8192

typedef struct zt_error {
    zt_status status;
    char msg[ZT_ERROR_MSG_MAX];
} zt_error;

/* Set status and message (replacing any earlier one); returns status so callers can
 * `return zt_error_set(err, ZT_ERR_IO, "...")`. err may be NULL. */
zt_status zt_error_set(zt_error *err, zt_status status, const char *fmt, ...) ZT_PRINTF(3, 4);
zt_status zt_error_setv(zt_error *err, zt_status status, const char *fmt, va_list ap);
/* Append more text (a new line of detail) to the current message. */
void zt_error_append(zt_error *err, const char *fmt, ...) ZT_PRINTF(2, 3);
void zt_error_clear(zt_error *err);
/* Short name of a status ("invalid argument", "out of memory", ...). */
const char *zt_status_name(zt_status s);

#endif
