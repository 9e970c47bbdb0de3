/* The dynamic loss scaler (framework/train/loss_scale.c) against hand-written sequences: hysteresis,
 * halving to min_loss_scale, doubling after loss_scale_window good steps, collapse at the minimum. */
#include "train/loss_scale.h"
#include "ztest.h"

#define SKIP ZT_LOSS_SCALE_SKIPPED
#define HALF ZT_LOSS_SCALE_HALVED
#define DOUBLE ZT_LOSS_SCALE_DOUBLED
#define COLLAPSE ZT_LOSS_SCALE_COLLAPSED

/* Feeds outcomes (1 overflow, 0 good) and checks each step's flags and the scale after it. */
static void run(zt_loss_scaler *s, int n, const int *overflow, const uint32_t *flags, const double *scale)
{
    for (int i = 0; i < n; i++) {
        uint32_t f = zt_loss_scaler_update(s, overflow[i]);
        ZT_CHECK_INT(f, flags[i]);
        ZT_CHECK_CLOSE(s->scale, scale[i], 0, 0);
    }
}

static void test_sequence(void)
{
    zt_loss_scaler s;
    zt_loss_scaler_init(&s, 4, 3, 2, 2.0); /* S = 16, window 3, hysteresis 2, min 2 */
    s.consecutive_hysteresis = 1;           /* a good step restores the hysteresis */
    ZT_CHECK_CLOSE(s.scale, 16.0, 0, 0);
    static const int o[] = {1, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1};
    static const uint32_t f[] = {SKIP,        SKIP | HALF, SKIP | HALF, 0,    0,    DOUBLE, SKIP, 0,
                                 SKIP,        SKIP | HALF, SKIP | HALF, SKIP, SKIP, SKIP,   SKIP | COLLAPSE};
    static const double sc[] = {16, 8, 4, 4, 4, 8, 8, 8, 8, 4, 2, 2, 2, 2, 2};
    run(&s, 15, o, f, sc);
    ZT_CHECK_INT(s.skipped_total, 11);
    ZT_CHECK_INT(zt_loss_scaler_collapse_after(&s), 4);
}

/* A good step at the minimum restarts the collapse count; hysteresis 1 halves at once; the halving
 * stops at a min_loss_scale that is not a power of two. */
static void test_min_and_reset(void)
{
    zt_loss_scaler s;
    zt_loss_scaler_init(&s, 3, 1000, 1, 5.0); /* S = 8, min 5 */
    static const int o[] = {1, 1, 0, 1, 1};
    static const uint32_t f[] = {SKIP | HALF, SKIP, 0, SKIP, SKIP | COLLAPSE};
    static const double sc[] = {5, 5, 5, 5, 5};
    run(&s, 5, o, f, sc);
    /* an initial scale below the minimum starts at the minimum */
    zt_loss_scaler_init(&s, 0, 1, 2, 3.0);
    ZT_CHECK_CLOSE(s.scale, 3.0, 0, 0);
    /* window 1 doubles after every good step */
    static const int o2[] = {0, 0};
    static const uint32_t f2[] = {DOUBLE, DOUBLE};
    static const double sc2[] = {6, 12};
    run(&s, 2, o2, f2, sc2);
}

/* The forced-overflow pattern of the GPU test: 2^32 with hysteresis 2 overflows until the scale is
 * small enough; the halvings are exactly those DeepSpeed makes. */
static void test_large_initial(void)
{
    zt_loss_scaler s;
    zt_loss_scaler_init(&s, 32, 1000, 2, 1.0);
    s.consecutive_hysteresis = 1;
    ZT_CHECK_INT(zt_loss_scaler_update(&s, 1), SKIP);
    ZT_CHECK_CLOSE(s.scale, 4294967296.0, 0, 0);
    for (int i = 31; i >= 20; i--) {
        ZT_CHECK_INT(zt_loss_scaler_update(&s, 1), SKIP | HALF);
        ZT_CHECK_CLOSE(s.scale, (double)(1ull << i), 0, 0);
    }
    ZT_CHECK_INT(zt_loss_scaler_update(&s, 0), 0);
    ZT_CHECK_INT(s.hysteresis_left, 2);
    ZT_CHECK_INT(s.skipped_total, 13);
}

/* DeepSpeed's default (consecutive_hysteresis false): a good step does not restore the hysteresis, the
 * doubling after loss_scale_window good steps does; a static scale never moves. */
static void test_deepspeed_default_and_static(void)
{
    zt_loss_scaler s;
    zt_loss_scaler_init(&s, 4, 3, 2, 1.0); /* S = 16, window 3, hysteresis 2 */
    static const int o[] = {1, 0, 1, 1, 0, 0, 0, 1};
    static const uint32_t f[] = {SKIP, 0, SKIP | HALF, SKIP | HALF, 0, 0, DOUBLE, SKIP};
    static const double sc[] = {16, 16, 8, 4, 4, 4, 8, 8};
    run(&s, 8, o, f, sc);
    zt_loss_scaler_init_static(&s, 128.0, 2);
    static const int o2[] = {0, 1, 0, 1, 1, 1, 1};
    static const uint32_t f2[] = {0, SKIP, 0, SKIP, SKIP, SKIP, SKIP | COLLAPSE};
    static const double sc2[] = {128, 128, 128, 128, 128, 128, 128};
    run(&s, 7, o2, f2, sc2);
}

int main(void)
{
    test_deepspeed_default_and_static();
    test_sequence();
    test_min_and_reset();
    test_large_initial();
    return zt_test_result();
}
