#include "base/log.h"

#include <pthread.h>
#include <stdio.h>

static int g_min_level = ZT_LOG_INFO;
static int g_rank = -1;
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;

void zt_log_set_level(int min_level) { g_min_level = min_level; }
void zt_log_set_rank(int rank) { g_rank = rank; }
int zt_log_rank(void) { return g_rank; }

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
    /* One write per line, prefix and all: lines of concurrent threads never interleave, nor do those
     * of ranks whose output a launcher merges (stderr is unbuffered: one fprintf per part would let
     * another rank's line come between the prefix and the message). */
    char message[4096], line[4096 + 160];
    vsnprintf(message, sizeof message, fmt, ap);
    char prefix[32];
    if (g_rank >= 0) snprintf(prefix, sizeof prefix, "zt[rank %d]", g_rank);
    else snprintf(prefix, sizeof prefix, "zt");
    int n = snprintf(line, sizeof line, "%s %s%s%s%s: %s\n", prefix, level_name(level), source && *source ? " [" : "",
                     source && *source ? source : "", source && *source ? "]" : "", message);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (len && line[len - 1] != '\n') line[len - 1] = '\n'; /* cut short: still one line */
    pthread_mutex_lock(&g_log_lock);
    fwrite(line, 1, len, stderr);
    pthread_mutex_unlock(&g_log_lock);
}

void zt_log(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zt_logv(level, NULL, fmt, ap);
    va_end(ap);
}
