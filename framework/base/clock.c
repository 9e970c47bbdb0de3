#define _POSIX_C_SOURCE 200809L
#include "base/clock.h"

#include <stdio.h>
#include <time.h>

double zt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void zt_format_duration(double seconds, char *buf, size_t cap)
{
    if (!(seconds >= 0) || seconds > 1e9) {
        snprintf(buf, cap, "?");
        return;
    }
    long long s = (long long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, cap, "%lldh%02lldm%02llds", s / 3600, s / 60 % 60, s % 60);
    else if (s >= 60) snprintf(buf, cap, "%lldm%02llds", s / 60, s % 60);
    else snprintf(buf, cap, "%llds", s);
}
