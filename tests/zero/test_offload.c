/* The offload thread of the zero plugins (plugins/zero/offload.c) without a GPU and without
 * the plugins: a stub host, jobs that record where and in which order they ran, and the CPU AdamW
 * kernel stepped unit by unit on the thread against the same kernel called directly (the reference).
 * Checks: jobs run on another thread, in submission order, while submit has already returned (the
 * overlap); the first failure skips later jobs, reaches wait, and is cleared by it; a full queue is a
 * named error; destroy with queued jobs does not hang; AdamW results are bit-identical.
 * usage: test_offload */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/kernels.h"
#include "ztest.h"
#include "../../plugins/zero/offload.h"

/* ---- stub host ------------------------------------------------------------------------------- */

static char g_error[1024];
static int g_n_errors;

static void stub_error(void *ctx, int32_t status, const char *fmt, ...)
{
    (void)ctx, (void)status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    g_n_errors++;
}

static void stub_log(void *ctx, int32_t level, const char *fmt, ...)
{
    (void)ctx, (void)level, (void)fmt;
}

static zt_host make_host(void)
{
    zt_host h;
    memset(&h, 0, sizeof h);
    h.struct_size = sizeof h;
    h.error = stub_error;
    h.log = stub_log;
    return h;
}

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* ---- recording jobs -------------------------------------------------------------------------- */

typedef struct recorder {
    pthread_t caller;
    int on_caller; /* a job ran on the submitting thread */
    int32_t order[64];
    int n;
    int32_t fail_unit;     /* this unit's job fails (-1: none) */
    int32_t gate_unit;     /* this unit's job waits for `gate` (-1: none) */
    atomic_int gate;
    atomic_int gate_seen;  /* the gated job saw the gate open (set after submit returned) */
    atomic_int started;    /* a job has begun */
} recorder;

static zt_status record_job(void *arg, int32_t unit)
{
    recorder *r = arg;
    if (pthread_equal(pthread_self(), r->caller)) r->on_caller = 1;
    atomic_store(&r->started, 1);
    if (unit == r->gate_unit) {
        for (int i = 0; i < 10000 && !atomic_load(&r->gate); i++) sleep_ms(1);
        atomic_store(&r->gate_seen, atomic_load(&r->gate));
    }
    if (r->n < 64) r->order[r->n++] = unit;
    return unit == r->fail_unit ? ZT_ERR_DEVICE : ZT_OK;
}

static void test_order_and_overlap(void)
{
    zt_host h = make_host();
    recorder r = {.caller = pthread_self(), .fail_unit = -1, .gate_unit = 0};
    zero_offload *o = NULL;
    ZT_CHECK_INT(zero_offload_create(&h, "zero2", record_job, &r, 8, &o), ZT_OK);
    /* Unit 0's job waits until the gate opens; the gate opens only after every submit returned, so
     * the jobs must run on another thread while the caller goes on. */
    for (int32_t u = 0; u < 5; u++) ZT_CHECK_INT(zero_offload_submit(o, u), ZT_OK);
    atomic_store(&r.gate, 1);
    ZT_CHECK_INT(zero_offload_wait(o), ZT_OK);
    ZT_CHECK(atomic_load(&r.gate_seen) == 1);
    ZT_CHECK(!r.on_caller);
    ZT_CHECK_INT(r.n, 5);
    for (int i = 0; i < r.n; i++) ZT_CHECK_INT(r.order[i], i);
    ZT_CHECK_INT(zero_offload_jobs_run(o), 5);
    /* A second round on the same thread: the engine is reusable step after step. */
    r.gate_unit = -1;
    for (int32_t u = 4; u >= 0; u--) ZT_CHECK_INT(zero_offload_submit(o, u), ZT_OK);
    ZT_CHECK_INT(zero_offload_wait(o), ZT_OK);
    ZT_CHECK_INT(r.n, 10);
    for (int i = 5; i < r.n; i++) ZT_CHECK_INT(r.order[i], 9 - i);
    zero_offload_destroy(o);
}

/* zero_offload_wait_for(n): returns once the first n jobs are done, with later ones still queued. */
static void test_wait_for(void)
{
    zt_host h = make_host();
    recorder r = {.caller = pthread_self(), .fail_unit = 3, .gate_unit = 2};
    zero_offload *o = NULL;
    ZT_CHECK_INT(zero_offload_create(&h, "zero2", record_job, &r, 8, &o), ZT_OK);
    for (int32_t u = 0; u < 5; u++) ZT_CHECK_INT(zero_offload_submit(o, u), ZT_OK);
    ZT_CHECK_INT(zero_offload_wait_for(o, 2), ZT_OK); /* jobs 1 and 2 (units 0, 1) */
    ZT_CHECK(r.n >= 2 && r.order[0] == 0 && r.order[1] == 1);
    ZT_CHECK(!atomic_load(&r.gate_seen)); /* unit 2's job is still held at its gate */
    atomic_store(&r.gate, 1);
    /* job 4 (unit 3) fails: waiting for it returns the failure without clearing it */
    ZT_CHECK_INT(zero_offload_wait_for(o, 4), ZT_ERR_DEVICE);
    ZT_CHECK_INT(zero_offload_wait_for(o, 5), ZT_ERR_DEVICE);
    ZT_CHECK_INT(zero_offload_wait(o), ZT_ERR_DEVICE);
    ZT_CHECK_INT(zero_offload_wait(o), ZT_OK);
    ZT_CHECK_INT(zero_offload_wait_for(o, 5), ZT_OK); /* long done */
    zero_offload_destroy(o);
}

static void test_failure(void)
{
    zt_host h = make_host();
    recorder r = {.caller = pthread_self(), .fail_unit = 2, .gate_unit = -1};
    zero_offload *o = NULL;
    ZT_CHECK_INT(zero_offload_create(&h, "zero2", record_job, &r, 8, &o), ZT_OK);
    for (int32_t u = 0; u < 5; u++) ZT_CHECK_INT(zero_offload_submit(o, u), ZT_OK);
    ZT_CHECK_INT(zero_offload_wait(o), ZT_ERR_DEVICE);
    /* 0, 1 and the failing 2 ran; 3 and 4 were skipped, not run on suspect state */
    ZT_CHECK_INT(r.n, 3);
    ZT_CHECK_INT(zero_offload_jobs_run(o), 3);
    /* The failure was reported once; the next round starts clean. */
    ZT_CHECK_INT(zero_offload_wait(o), ZT_OK);
    r.fail_unit = -1;
    ZT_CHECK_INT(zero_offload_submit(o, 7), ZT_OK);
    ZT_CHECK_INT(zero_offload_wait(o), ZT_OK);
    ZT_CHECK_INT(r.n, 4);
    ZT_CHECK_INT(r.order[3], 7);
    zero_offload_destroy(o);
}

static void test_queue_full_and_destroy(void)
{
    zt_host h = make_host();
    recorder r = {.caller = pthread_self(), .fail_unit = -1, .gate_unit = 0};
    zero_offload *o = NULL;
    ZT_CHECK_INT(zero_offload_create(&h, "zero3", record_job, &r, 2, &o), ZT_OK);
    ZT_CHECK_INT(zero_offload_submit(o, 0), ZT_OK);
    /* wait until the thread holds job 0 (blocked on the gate), so exactly two places are left */
    for (int i = 0; i < 10000 && !atomic_load(&r.started); i++) sleep_ms(1);
    ZT_CHECK(atomic_load(&r.started));
    ZT_CHECK_INT(zero_offload_submit(o, 1), ZT_OK);
    ZT_CHECK_INT(zero_offload_submit(o, 2), ZT_OK);
    g_n_errors = 0;
    ZT_CHECK_INT(zero_offload_submit(o, 3), ZT_ERR_INTERNAL);
    ZT_CHECK_INT(g_n_errors, 1);
    ZT_CHECK_CONTAINS(g_error, "zero3: offload queue full (2 jobs) when unit 3 was submitted");
    atomic_store(&r.gate, 1);
    /* destroy with jobs still queued: returns after the current job, the rest dropped */
    zero_offload_destroy(o);
    ZT_CHECK(r.n >= 1 && r.n <= 3);
}

static void test_bad_arguments(void)
{
    zt_host h = make_host();
    zero_offload *o = (zero_offload *)&h;
    g_n_errors = 0;
    ZT_CHECK_INT(zero_offload_create(&h, "zero1", NULL, NULL, 4, &o), ZT_ERR_INTERNAL);
    ZT_CHECK(o == NULL);
    ZT_CHECK_INT(g_n_errors, 1);
    ZT_CHECK_CONTAINS(g_error, "zero1: offload engine created without a job function");
    zero_offload_destroy(NULL); /* a no-op */
}

/* ---- AdamW on the thread against AdamW called directly ---------------------------------------- */

static void serial_for(void *pool, int64_t n, int64_t grain, zt_range_fn fn, void *arg)
{
    (void)pool, (void)grain;
    fn(arg, 0, n);
}

enum { N_UNITS = 4 };
static const int64_t k_unit_numel[N_UNITS] = {1000, 37, 4099, 8};

typedef struct adam_units {
    float *p[N_UNITS], *g[N_UNITS], *m[N_UNITS], *v[N_UNITS];
    zt_adamw_params hp;
} adam_units;

static zt_status adam_job(void *arg, int32_t unit)
{
    adam_units *a = arg;
    zt_cpu_ctx ctx = {.parallel_for = serial_for, .pool = NULL};
    zt_cpu_adamw_step(&ctx, k_unit_numel[unit], &a->hp, a->p[unit], a->g[unit], a->m[unit], a->v[unit]);
    return ZT_OK;
}

static void test_adamw_bits(void)
{
    zt_host h = make_host();
    adam_units got, want;
    memset(&got, 0, sizeof got);
    memset(&want, 0, sizeof want);
    uint32_t seed = 12345;
    for (int u = 0; u < N_UNITS; u++) {
        size_t bytes = (size_t)k_unit_numel[u] * sizeof(float);
        got.p[u] = malloc(bytes), got.g[u] = malloc(bytes), got.m[u] = calloc(1, bytes), got.v[u] = calloc(1, bytes);
        want.p[u] = malloc(bytes), want.g[u] = got.g[u], want.m[u] = calloc(1, bytes), want.v[u] = calloc(1, bytes);
        for (int64_t i = 0; i < k_unit_numel[u]; i++) {
            seed = seed * 1664525u + 1013904223u;
            got.p[u][i] = want.p[u][i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
            seed = seed * 1664525u + 1013904223u;
            got.g[u][i] = ((float)(seed >> 8) / (float)(1u << 24) - 0.5f) * 1e-2f;
        }
    }
    zero_offload *o = NULL;
    ZT_CHECK_INT(zero_offload_create(&h, "zero2", adam_job, &got, N_UNITS, &o), ZT_OK);
    zt_cpu_ctx ctx = {.parallel_for = serial_for, .pool = NULL};
    for (int64_t step = 1; step <= 3; step++) {
        zt_adamw_params hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1, .step = step};
        got.hp = want.hp = hp;
        for (int32_t u = N_UNITS - 1; u >= 0; u--) ZT_CHECK_INT(zero_offload_submit(o, u), ZT_OK); /* backward order */
        for (int u = 0; u < N_UNITS; u++)
            zt_cpu_adamw_step(&ctx, k_unit_numel[u], &hp, want.p[u], want.g[u], want.m[u], want.v[u]);
        ZT_CHECK_INT(zero_offload_wait(o), ZT_OK);
    }
    zero_offload_destroy(o);
    int same = 1, moved = 0;
    for (int u = 0; u < N_UNITS; u++) {
        size_t bytes = (size_t)k_unit_numel[u] * sizeof(float);
        same &= !memcmp(got.p[u], want.p[u], bytes) && !memcmp(got.m[u], want.m[u], bytes) &&
                !memcmp(got.v[u], want.v[u], bytes);
        moved |= got.m[u][0] != 0.0f;
        free(got.p[u]), free(got.g[u]), free(got.m[u]), free(got.v[u]);
        free(want.p[u]), free(want.m[u]), free(want.v[u]);
    }
    ZT_CHECK(same);
    ZT_CHECK(moved); /* the jobs did run */
}

/* The vectorized kernel (eight lanes, AVX2/AVX-512 clones) against the scalar expression order,
 * every operation rounded separately (volatile keeps the compiler from fusing or reordering). */
static void test_adamw_kernel_order(void)
{
    enum { N = 1003 }; /* a tail of 3 after the vector blocks */
    static float p[N], g[N], m[N], v[N], rp[N], rm[N], rv[N];
    uint32_t seed = 99;
    for (int i = 0; i < N; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = rp[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
        seed = seed * 1664525u + 1013904223u;
        g[i] = ((float)(seed >> 8) / (float)(1u << 24) - 0.5f) * 3e-2f;
        m[i] = rm[i] = 0, v[i] = rv[i] = 0;
    }
    zt_cpu_ctx ctx = {.parallel_for = serial_for, .pool = NULL};
    for (int64_t step = 1; step <= 4; step++) {
        zt_adamw_params hp = {.lr = 2e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.05, .step = step};
        zt_cpu_adamw_step(&ctx, N, &hp, p, g, m, v);
        float decay = (float)(1.0 - hp.lr * hp.weight_decay), omb1 = (float)(1.0 - hp.beta1),
              b2 = (float)hp.beta2, omb2 = (float)(1.0 - hp.beta2),
              b2s = (float)sqrt(1.0 - pow(hp.beta2, (double)step)), eps = (float)hp.eps,
              nss = (float)(-(hp.lr / (1.0 - pow(hp.beta1, (double)step))));
        for (int i = 0; i < N; i++) {
            volatile float t = g[i] - rm[i];
            t = omb1 * t;
            rp[i] *= decay;
            rm[i] += t;
            volatile float a = rv[i] * b2, b = omb2 * g[i];
            b = b * g[i];
            rv[i] = a + b;
            volatile float d = sqrtf(rv[i]);
            d = d / b2s;
            d = d + eps;
            volatile float q = nss * rm[i];
            q = q / d;
            rp[i] += q;
        }
    }
    ZT_CHECK(!memcmp(p, rp, sizeof p));
    ZT_CHECK(!memcmp(m, rm, sizeof m));
    ZT_CHECK(!memcmp(v, rv, sizeof v));
}

int main(void)
{
    test_order_and_overlap();
    test_wait_for();
    test_failure();
    test_queue_full_and_destroy();
    test_bad_arguments();
    test_adamw_bits();
    test_adamw_kernel_order();
    return zt_test_result();
}
