/* Host logging: one line per message on stderr, "zt[rank N] LEVEL: message". Thread-safe. */
#ifndef ZT_FRAMEWORK_LOG_H
#define ZT_FRAMEWORK_LOG_H

#include <stdarg.h>
#include "zt/zt_types.h"

void zt_log(int level, const char *fmt, ...) ZT_PRINTF(2, 3);
void zt_logv(int level, const char *source, const char *fmt, va_list ap);
void zt_log_set_level(int min_level);   /* messages below are dropped; default ZT_LOG_INFO */
void zt_log_set_rank(int rank);         /* -1 (default): no rank shown */
int zt_log_rank(void);                  /* the rank lines show; -1: none (one process) */

#endif
