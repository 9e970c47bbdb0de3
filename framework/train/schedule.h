/* Learning-rate schedules, with DeepSpeed's names and formulas (scheduler.type, scheduler.params.*).
 *
 * The learning rate of optimizer step s (1-based) is a pure function of s and the config, so a
 * resumed run needs nothing but the step count to continue the schedule exactly. With i = s - 1
 * (DeepSpeed's last_batch_iteration when step s runs), peak = scheduler.params.warmup_max_lr
 * (unset: optimizer.params.lr), min = warmup_min_lr, W = warmup_num_steps, N = total_num_steps
 * (unset: steps):
 *
 *   constant        peak
 *   WarmupLR        min + (peak - min) * i / W  while i < W, then peak
 *   WarmupDecayLR   warm-up as WarmupLR, then min + (peak - min) * max(0, (N - i) / max(1, N - W))
 *   WarmupCosineLR  warm-up as WarmupLR, then peak * (c + (1 - c) * (1 + cos(pi * p)) / 2) with
 *                   p = min(1, (i - W + 1) / max(1, N - W)) and c = cos_min_ratio
 *
 * Differences from DeepSpeed, all deliberate: warm-up is linear (DeepSpeed's warmup_type "linear";
 * its default is "log"); W = 0 means no warm-up (DeepSpeed raises W to 2); the cosine holds at
 * c * peak after N steps (DeepSpeed's cosine would rise again). docs/training.md has the details.
 */
#ifndef ZT_FRAMEWORK_SCHEDULE_H
#define ZT_FRAMEWORK_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>
#include "base/error.h"
#include "config/config.h"
#include "config/settings.h"

typedef enum zt_schedule_type {
    ZT_SCHEDULE_CONSTANT = 0,
    ZT_SCHEDULE_WARMUP = 1,        /* DeepSpeed WarmupLR */
    ZT_SCHEDULE_WARMUP_DECAY = 2,  /* DeepSpeed WarmupDecayLR */
    ZT_SCHEDULE_WARMUP_COSINE = 3  /* DeepSpeed WarmupCosineLR */
} zt_schedule_type;

typedef struct zt_schedule {
    int type;               /* zt_schedule_type */
    double peak_lr;
    double min_lr;          /* warm-up start, and the end of WarmupDecayLR */
    double cos_min_ratio;
    int64_t warmup_steps;
    int64_t total_steps;
} zt_schedule;

/* The schedule of the host's scheduler settings, `steps` (the decay's length when total_num_steps is
 * unset) and the optimizer's learning rate (the peak when warmup_max_lr is unset; have_optimizer_lr 0:
 * the optimizer declares none). A parameter given to a schedule that does not use it, warm-up longer
 * than the decay, or no peak learning rate at all is a ZT_ERR_CONFIG naming the key. */
zt_status zt_schedule_from_settings(const zt_schedule_settings *in, int64_t steps, int have_optimizer_lr,
                                    double optimizer_lr, zt_schedule *out, zt_error *err);
/* The same, with the learning rate read from the optimizer plugin's optimizer.params.lr in cfg. */
zt_status zt_schedule_for_run(const zt_schedule_settings *in, int64_t steps, const zt_config *cfg, zt_schedule *out,
                              zt_error *err);

/* The learning rate of optimizer step `step` (1-based). */
double zt_schedule_lr(const zt_schedule *s, int64_t step);

/* "WarmupCosineLR" etc.: the scheduler.type value of a type. */
const char *zt_schedule_type_name(int type);

/* The schedule as one JSON object (stored in checkpoints, so a resume can say what changed). Like
 * snprintf: writes at most cap bytes including the NUL and returns the length needed. */
size_t zt_schedule_to_json(const zt_schedule *s, char *buf, size_t cap);

#endif
