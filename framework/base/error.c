#include "base/error.h"

#include <stdio.h>
#include <string.h>

zt_status zt_error_setv(zt_error *err, zt_status status, const char *fmt, va_list ap)
{
    if (err) {
        err->status = status;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return status;
}

zt_status zt_error_set(zt_error *err, zt_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zt_error_setv(err, status, fmt, ap);
    va_end(ap);
    return status;
}

void zt_error_append(zt_error *err, const char *fmt, ...)
{
    if (!err) return;
    size_t used = strlen(err->msg);
    if (used + 1 >= sizeof err->msg) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + used, sizeof err->msg - used, fmt, ap);
    va_end(ap);
}

void zt_error_clear(zt_error *err)
{
    if (!err) return;
    err->status = ZT_OK;
    err->msg[0] = '\0';
}

const char *zt_status_name(zt_status s)
{
    switch (s) {
    case ZT_OK: return "ok";
    case ZT_ERR_INVALID_ARG: return "invalid argument";
    case ZT_ERR_UNSUPPORTED: return "unsupported";
    case ZT_ERR_OUT_OF_MEMORY: return "out of memory";
    case ZT_ERR_IO: return "I/O error";
    case ZT_ERR_FORMAT: return "bad format";
    case ZT_ERR_DEVICE: return "device error";
    case ZT_ERR_COMM: return "communication error";
    case ZT_ERR_TIMEOUT: return "timeout";
    case ZT_ERR_CONFIG: return "config error";
    case ZT_ERR_NOT_FOUND: return "not found";
    case ZT_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    case ZT_ERR_CANCELLED: return "cancelled";
    case ZT_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}
