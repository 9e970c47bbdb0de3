/* Dynamic loss scaling for fp16 training (fp16.enabled), DeepSpeed's DynamicLossScaler:
 *  - the loss gradient is multiplied by `scale` (S) in the backward; the optimizer divides it out;
 *  - a step whose gradients overflowed (a non-finite global norm) is skipped on every rank;
 *  - `hysteresis` consecutive overflows halve S (not below min_scale); every further overflow halves
 *    it again until a step succeeds (which restores the hysteresis: DeepSpeed's
 *    consecutive_hysteresis);
 *  - `window` consecutive successful steps double S;
 *  - overflows that persist at min_scale (2 x hysteresis consecutive steps already at the minimum)
 *    mean the scale has collapsed: training cannot continue (the caller stops with a message).
 * Pure logic, no I/O: tests/fp16/test_loss_scale.c checks exact sequences. */
#ifndef ZT_LOSS_SCALE_H
#define ZT_LOSS_SCALE_H

#include <stdint.h>

typedef struct zt_loss_scaler {
    double scale, min_scale;
    int64_t window, hysteresis;
    int64_t hysteresis_left;   /* overflows still tolerated before the next halving */
    int64_t good_steps;        /* successful steps since the last overflow or doubling */
    int64_t overflows_at_min;  /* consecutive overflowing steps that began at min_scale */
    int64_t skipped_total;     /* steps skipped for overflow in the whole run (checkpointed) */
} zt_loss_scaler;

/* What an update did (bit flags). */
#define ZT_LOSS_SCALE_SKIPPED 0x1u   /* this step overflowed: no update was made */
#define ZT_LOSS_SCALE_HALVED 0x2u
#define ZT_LOSS_SCALE_DOUBLED 0x4u
#define ZT_LOSS_SCALE_COLLAPSED 0x8u /* overflow persists at min_scale: stop training */

/* scale = 2^initial_power (at least min_scale). */
void zt_loss_scaler_init(zt_loss_scaler *s, int64_t initial_power, int64_t window, int64_t hysteresis,
                         double min_scale);

/* Records one step's outcome (overflow: its gradients were not finite) and moves the scale;
 * returns ZT_LOSS_SCALE_* flags. */
uint32_t zt_loss_scaler_update(zt_loss_scaler *s, int overflow);

/* Consecutive overflowing steps at min_scale after which the scale counts as collapsed. */
int64_t zt_loss_scaler_collapse_after(const zt_loss_scaler *s);

#endif
