/* One AdamW step with torch.optim.AdamW's semantics and rounding: the hyper-parameter expressions
 * are evaluated in double (they are Python floats in torch) and applied to fp32 tensors in the same
 * order torch's CPU kernels use. Eight elements at a time (SSE sqrt, vector extensions, AVX2/AVX-512
 * clones chosen at run time), every operation rounded as in the scalar loop, so the result does not
 * depend on the CPU, the clone or the thread count. */
#include <math.h>
#include <string.h>
#if defined(__x86_64__) || defined(__SSE__)
#include <immintrin.h>
#endif

#include "cpu/kernels.h"
#include "cpu/simd.h"

typedef struct adamw_job {
    float decay;          /* 1 - lr * weight_decay */
    float one_minus_beta1, beta2, one_minus_beta2;
    float bias2_sqrt;     /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step_size;  /* -lr / (1 - beta1^step) */
    float *p, *m, *v;
    const float *g;
} adamw_job;

/* One element, the reference order of operations; the vector block below repeats it lane by lane. */
ZT_CPU_INLINE void adamw_one(const adamw_job *j, int64_t i)
{
    float *restrict p = j->p, *restrict m = j->m, *restrict v = j->v;
    const float *restrict g = j->g;
    p[i] *= j->decay;
    m[i] += j->one_minus_beta1 * (g[i] - m[i]); /* torch: exp_avg.lerp_(grad, 1 - beta1) */
    v[i] = v[i] * j->beta2 + j->one_minus_beta2 * g[i] * g[i];
    float denom = sqrtf(v[i]) / j->bias2_sqrt + j->eps;
    p[i] += j->neg_step_size * m[i] / denom;
}

/* sqrt of eight lanes. GCC will not vectorize sqrtf (errno: the call "clobbers memory"), so the
 * SSE instruction, which is in every x86-64 clone and correctly rounded like sqrtf. */
ZT_CPU_INLINE zt_v8 adamw_sqrt8(zt_v8 x)
{
#if defined(__x86_64__) || defined(__SSE__)
    __m128 lo, hi;
    memcpy(&lo, &x, sizeof lo);
    memcpy(&hi, (const char *)&x + sizeof lo, sizeof hi);
    lo = _mm_sqrt_ps(lo);
    hi = _mm_sqrt_ps(hi);
    memcpy(&x, &lo, sizeof lo);
    memcpy((char *)&x + sizeof lo, &hi, sizeof hi);
#else
    for (int k = 0; k < 8; k++) x[k] = sqrtf(x[k]);
#endif
    return x;
}

/* Eight elements, each operation rounded exactly as in adamw_one (no contraction into FMAs). */
ZT_CPU_INLINE void adamw_block(const adamw_job *j, int64_t i)
{
#ifdef __clang__
#pragma clang fp contract(off)
#endif
    zt_v8 p = zt_v8_load(j->p + i), g = zt_v8_load(j->g + i), m = zt_v8_load(j->m + i), v = zt_v8_load(j->v + i);
    p = p * j->decay;
    m = m + j->one_minus_beta1 * (g - m);
    v = v * j->beta2 + j->one_minus_beta2 * g * g;
    zt_v8 denom = adamw_sqrt8(v) / j->bias2_sqrt + j->eps;
    p = p + j->neg_step_size * m / denom;
    zt_v8_store(j->p + i, p);
    zt_v8_store(j->m + i, m);
    zt_v8_store(j->v + i, v);
}

/* Bit-identical to the scalar order: GCC's gnu11 default (-ffp-contract=fast) would fuse the
 * multiply-adds into FMAs in the AVX2/AVX-512 clones, rounding once instead of twice. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
ZT_CPU_CLONES
static void adamw_range(void *arg, int64_t begin, int64_t end)
{
    const adamw_job *j = arg;
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) adamw_block(j, i);
    for (; i < end; i++) adamw_one(j, i);
}

void zt_cpu_adamw_step(const zt_cpu_ctx *ctx, int64_t n, const zt_adamw_params *hp, float *p,
                       const float *g, float *m, float *v)
{
    double step = (double)hp->step;
    adamw_job j = {
        .decay = (float)(1.0 - hp->lr * hp->weight_decay),
        .one_minus_beta1 = (float)(1.0 - hp->beta1),
        .beta2 = (float)hp->beta2,
        .one_minus_beta2 = (float)(1.0 - hp->beta2),
        .bias2_sqrt = (float)sqrt(1.0 - pow(hp->beta2, step)),
        .eps = (float)hp->eps,
        .neg_step_size = (float)(-(hp->lr / (1.0 - pow(hp->beta1, step)))),
        .p = p, .m = m, .v = v, .g = g};
    zt_cpu_parallel_for(ctx, n, 16384, adamw_range, &j);
}
