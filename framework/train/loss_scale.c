/* Dynamic loss scaling: see loss_scale.h. */
#include "train/loss_scale.h"

#include <math.h>

void zt_loss_scaler_init(zt_loss_scaler *s, int64_t initial_power, int64_t window, int64_t hysteresis,
                         double min_scale)
{
    s->scale = ldexp(1.0, (int)initial_power);
    s->min_scale = min_scale;
    if (s->scale < min_scale) s->scale = min_scale;
    s->window = window > 0 ? window : 1;
    s->hysteresis = hysteresis > 0 ? hysteresis : 1;
    s->hysteresis_left = s->hysteresis;
    s->good_steps = 0;
    s->overflows_at_min = 0;
    s->skipped_total = 0;
    s->consecutive_hysteresis = 0;
    s->is_static = 0;
}

void zt_loss_scaler_init_static(zt_loss_scaler *s, double scale, int64_t hysteresis)
{
    zt_loss_scaler_init(s, 0, 1, hysteresis, scale);
    s->scale = scale;
    s->is_static = 1;
}

int64_t zt_loss_scaler_collapse_after(const zt_loss_scaler *s) { return 2 * s->hysteresis; }

uint32_t zt_loss_scaler_update(zt_loss_scaler *s, int overflow)
{
    uint32_t flags = 0;
    if (overflow) {
        flags |= ZT_LOSS_SCALE_SKIPPED;
        s->skipped_total++;
        s->good_steps = 0;
        if (s->scale <= s->min_scale || s->is_static) {
            /* nothing left to halve: count how long the overflow persists */
            if (++s->overflows_at_min >= zt_loss_scaler_collapse_after(s)) flags |= ZT_LOSS_SCALE_COLLAPSED;
            return flags;
        }
        if (s->hysteresis_left > 1) {
            s->hysteresis_left--;
            return flags;
        }
        s->scale = s->scale / 2 < s->min_scale ? s->min_scale : s->scale / 2;
        return flags | ZT_LOSS_SCALE_HALVED;
    }
    if (s->consecutive_hysteresis) s->hysteresis_left = s->hysteresis;
    s->overflows_at_min = 0;
    if (s->is_static) return flags;
    if (++s->good_steps >= s->window) {
        s->good_steps = 0;
        s->hysteresis_left = s->hysteresis;
        s->scale *= 2;
        flags |= ZT_LOSS_SCALE_DOUBLED;
    }
    return flags;
}
