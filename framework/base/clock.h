/* The one clock zt measures durations with: monotonic seconds (never jumps with the wall clock). */
#ifndef ZT_FRAMEWORK_CLOCK_H
#define ZT_FRAMEWORK_CLOCK_H

/* Seconds since an arbitrary fixed point; only differences mean something. */
double zt_now_s(void);

#endif
