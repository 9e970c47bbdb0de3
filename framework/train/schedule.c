/* Learning-rate schedules (schedule.h has the formulas and how they relate to DeepSpeed's). */
#include "train/schedule.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define PI 3.14159265358979323846

static const char *const k_type_names[] = {"constant", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};

const char *zt_schedule_type_name(int type)
{
    return type >= 0 && type < (int)(sizeof k_type_names / sizeof k_type_names[0]) ? k_type_names[type]
                                                                                    : "unknown";
}

/* A scheduler.params key the chosen type does not read: refusing it beats silently ignoring a
 * setting the user believes is in effect. */
static zt_status refuse_unused(int given, const char *type, const char *key, const char *why, zt_error *err)
{
    if (!given) return ZT_OK;
    return zt_error_set(err, ZT_ERR_CONFIG,
                        "config key '%s' is set but scheduler.type \"%s\" does not use it (%s); remove the "
                        "key or choose a scheduler.type that uses it",
                        key, type, why);
}

zt_status zt_schedule_from_settings(const zt_schedule_settings *in, int64_t steps, int have_optimizer_lr,
                                    double optimizer_lr, zt_schedule *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    const char *type = in->type;
    int found = -1;
    for (int i = 0; i < (int)(sizeof k_type_names / sizeof k_type_names[0]); i++)
        if (!strcmp(type, k_type_names[i])) found = i;
    if (found < 0)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "scheduler.type \"%s\" is not one of constant, WarmupLR, WarmupDecayLR, "
                            "WarmupCosineLR",
                            type);
    out->type = found;

    zt_status st = ZT_OK;
    if (out->type == ZT_SCHEDULE_CONSTANT) {
        st = refuse_unused(in->given_warmup_num_steps, type, "scheduler.params.warmup_num_steps",
                           "it has no warm-up; use WarmupLR", err);
        if (st == ZT_OK)
            st = refuse_unused(in->given_warmup_min_lr, type, "scheduler.params.warmup_min_lr",
                               "it has no warm-up; use WarmupLR", err);
    }
    if (st == ZT_OK && (out->type == ZT_SCHEDULE_CONSTANT || out->type == ZT_SCHEDULE_WARMUP))
        st = refuse_unused(in->given_total_num_steps, type, "scheduler.params.total_num_steps",
                           "it does not decay; use WarmupDecayLR or WarmupCosineLR", err);
    if (st == ZT_OK && out->type != ZT_SCHEDULE_WARMUP_COSINE)
        st = refuse_unused(in->given_cos_min_ratio, type, "scheduler.params.cos_min_ratio",
                           "only WarmupCosineLR reads it", err);
    if (st != ZT_OK) return st;

    if (in->has_warmup_max_lr) out->peak_lr = in->warmup_max_lr;
    else if (have_optimizer_lr) out->peak_lr = optimizer_lr;
    else
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "no learning rate: scheduler.params.warmup_max_lr is not set and the optimizer "
                            "plugin declares no optimizer.params.lr; set scheduler.params.warmup_max_lr");
    out->min_lr = out->type == ZT_SCHEDULE_CONSTANT ? out->peak_lr : in->warmup_min_lr;
    out->warmup_steps = in->warmup_num_steps;
    out->cos_min_ratio = in->cos_min_ratio;
    out->total_steps = in->has_total_num_steps ? in->total_num_steps : steps;

    int decays = out->type == ZT_SCHEDULE_WARMUP_DECAY || out->type == ZT_SCHEDULE_WARMUP_COSINE;
    if (decays && out->warmup_steps > out->total_steps)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "scheduler.params.warmup_num_steps (%lld) is larger than the %lld steps the "
                            "schedule decays over (scheduler.params.total_num_steps, else steps): lower the "
                            "warm-up or raise total_num_steps",
                            (long long)out->warmup_steps, (long long)out->total_steps);
    return ZT_OK;
}

double zt_schedule_lr(const zt_schedule *s, int64_t step)
{
    if (s->type == ZT_SCHEDULE_CONSTANT) return s->peak_lr;
    double i = (double)(step - 1); /* DeepSpeed's last_batch_iteration during step `step` */
    double w = (double)s->warmup_steps, n = (double)s->total_steps;
    if (i < w) return s->min_lr + (s->peak_lr - s->min_lr) * (i / w);
    switch (s->type) {
    case ZT_SCHEDULE_WARMUP_DECAY: {
        double gamma = (n - i) / fmax(1.0, n - w);
        return s->min_lr + (s->peak_lr - s->min_lr) * fmax(0.0, gamma);
    }
    case ZT_SCHEDULE_WARMUP_COSINE: {
        double progress = fmin(1.0, (i - w + 1.0) / fmax(1.0, n - w));
        double cosine = (1.0 + cos(PI * progress)) / 2.0;
        return s->peak_lr * (s->cos_min_ratio + (1.0 - s->cos_min_ratio) * cosine);
    }
    default:
        return s->peak_lr;
    }
}

size_t zt_schedule_to_json(const zt_schedule *s, char *buf, size_t cap)
{
    int n = snprintf(buf, cap,
                     "{\"type\":\"%s\",\"peak_lr\":%.17g,\"min_lr\":%.17g,\"warmup_num_steps\":%lld,"
                     "\"total_num_steps\":%lld,\"cos_min_ratio\":%.17g}",
                     zt_schedule_type_name(s->type), s->peak_lr, s->min_lr, (long long)s->warmup_steps,
                     (long long)s->total_steps, s->cos_min_ratio);
    return n < 0 ? 0 : (size_t)n;
}

zt_status zt_schedule_for_run(const zt_schedule_settings *in, int64_t steps, const zt_config *cfg, zt_schedule *out,
                              zt_error *err)
{
    double lr = 0;
    int have_lr = zt_config_get_float(cfg, "optimizer.params.lr", &lr) == ZT_OK;
    return zt_schedule_from_settings(in, steps, have_lr, lr, out, err);
}
