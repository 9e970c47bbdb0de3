/* The one clock zt measures durations with: monotonic seconds (never jumps with the wall clock). */
#ifndef ZT_FRAMEWORK_CLOCK_H
#define ZT_FRAMEWORK_CLOCK_H

#include <stddef.h>

/* Seconds since an arbitrary fixed point; only differences mean something. */
double zt_now_s(void);

/* A duration for people: "1h02m03s", "4m05s", "12s"; "?" for a negative, NaN or absurd one. zt-run's
 * log line and zt-report's views print durations so. */
void zt_format_duration(double seconds, char *buf, size_t cap);

#endif
