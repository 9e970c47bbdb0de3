/* One AdamW step with torch.optim.AdamW's semantics and rounding: the hyper-parameter expressions
 * are evaluated in double (they are Python floats in torch) and applied to fp32 tensors in the same
 * order torch's CPU kernels use. */
#include <math.h>
#include "cpu/kernels.h"

typedef struct adamw_job {
    float decay;          /* 1 - lr * weight_decay */
    float one_minus_beta1, beta2, one_minus_beta2;
    float bias2_sqrt;     /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step_size;  /* -lr / (1 - beta1^step) */
    float *p, *m, *v;
    const float *g;
} adamw_job;

static void adamw_range(void *arg, int64_t begin, int64_t end)
{
    const adamw_job *j = arg;
    float *restrict p = j->p, *restrict m = j->m, *restrict v = j->v;
    const float *restrict g = j->g;
    for (int64_t i = begin; i < end; i++) {
        p[i] *= j->decay;
        m[i] += j->one_minus_beta1 * (g[i] - m[i]); /* torch: exp_avg.lerp_(grad, 1 - beta1) */
        v[i] = v[i] * j->beta2 + j->one_minus_beta2 * g[i] * g[i];
        float denom = sqrtf(v[i]) / j->bias2_sqrt + j->eps;
        p[i] += j->neg_step_size * m[i] / denom;
    }
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
