/* Dynamic loss scaling for fp16 training (fp16.enabled), DeepSpeed's DynamicLossScaler:
 *  - the loss gradient is multiplied by `scale` (S) in the backward; the optimizer divides it out;
 *  - a step whose gradients overflowed (a non-finite global norm) is skipped on every rank;
 *  - `hysteresis` overflows halve S (not below min_scale); every further overflow halves it again until
 *    the hysteresis is restored: when S is doubled (DeepSpeed's default), or with consecutive_hysteresis
 *    after every successful step;
 *  - `window` consecutive successful steps double S;
 *  - a static scale (fp16.loss_scale > 0, zt_loss_scaler_init_static) never changes: overflowing steps
 *    are skipped all the same;
 *  - overflows that persist at min_scale (2 x hysteresis consecutive steps already at the minimum)
 *    mean the scale has collapsed: training cannot continue (the caller stops with a message).
 * Pure logic, no I/O: tests/fp16/test_loss_scale.c checks exact sequences, and tests/fp16/loss_scale_ref.py
 * checks it against DeepSpeed's DynamicLossScaler.update_scale written out in Python. */
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
    int consecutive_hysteresis; /* restore the hysteresis after every good step (DeepSpeed's option) */
    int is_static;             /* fp16.loss_scale > 0: the scale never moves */
} zt_loss_scaler;

/* What an update did (bit flags). */
#define ZT_LOSS_SCALE_SKIPPED 0x1u   /* this step overflowed: no update was made */
#define ZT_LOSS_SCALE_HALVED 0x2u
#define ZT_LOSS_SCALE_DOUBLED 0x4u
#define ZT_LOSS_SCALE_COLLAPSED 0x8u /* overflow persists at min_scale: stop training */

/* scale = 2^initial_power (at least min_scale); consecutive_hysteresis off (DeepSpeed's default: set
 * the field to turn it on). */
void zt_loss_scaler_init(zt_loss_scaler *s, int64_t initial_power, int64_t window, int64_t hysteresis,
                         double min_scale);
/* A static scale: `scale` at every step; 2 x hysteresis overflowing steps in a row collapse it. */
void zt_loss_scaler_init_static(zt_loss_scaler *s, double scale, int64_t hysteresis);

/* Records one step's outcome (overflow: its gradients were not finite) and moves the scale;
 * returns ZT_LOSS_SCALE_* flags. */
uint32_t zt_loss_scaler_update(zt_loss_scaler *s, int overflow);

/* Consecutive overflowing steps at min_scale after which the scale counts as collapsed. */
int64_t zt_loss_scaler_collapse_after(const zt_loss_scaler *s);

#endif
