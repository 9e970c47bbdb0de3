#include "base/log.h"

#include <pthread.h>
#include <stdio.h>

static int g_min_level = ZT_LOG_INFO;
static int g_rank = -1;
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;

void zt_log_set_level(int min_level) { g_min_level = min_level; }
void zt_log_set_rank(int rank) { g_rank = rank; }

static const char *level_name(int level)
{
    switch (level) {
    case ZT_LOG_DEBUG: return "debug";
    case ZT_LOG_INFO: return "info";
    case ZT_LOG_WARN: return "warning";
    default: return "error";
    }
}

void zt_logv(int level, const char *source, const char *fmt, va_list ap)
{
    if (level < g_min_level) return;
    /* One locked write per line so lines of concurrent threads never interleave. */
    char line[4096];
    vsnprintf(line, sizeof line, fmt, ap);
    pthread_mutex_lock(&g_log_lock);
    if (g_rank >= 0) fprintf(stderr, "zt[rank %d] ", g_rank);
    else fputs("zt ", stderr);
    fprintf(stderr, "%s", level_name(level));
    if (source && *source) fprintf(stderr, " [%s]", source);
    fprintf(stderr, ": %s\n", line);
    pthread_mutex_unlock(&g_log_lock);
}

void zt_log(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zt_logv(level, NULL, fmt, ap);
    va_end(ap);
}
