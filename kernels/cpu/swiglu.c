/* SwiGLU, the LLaMA MLP activation:  h = silu(g) * u,  silu(g) = g * sigmoid(g) = g / (1 + e^-g).
 * Backward:  du = dh * silu(g);  dg = dh * u * s * (1 + g * (1 - s)),  s = sigmoid(g).
 */
#include "cpu/kernels.h"
#include "cpu/simd.h"

typedef struct swiglu_job {
    const float *gate, *up, *dh;
    float *h, *dgate, *dup;
} swiglu_job;

/* Elements [i, i + n), n <= 8. (The vector code lives in inline helpers that take pointers:
 * Clang rejects vector values directly in the body of a target_clones function.) */
ZT_CPU_INLINE void forward_block(const swiglu_job *j, int64_t i, int64_t n)
{
    zt_v8 g = n == 8 ? zt_v8_load(j->gate + i) : zt_v8_load_partial(j->gate + i, n);
    zt_v8 u = n == 8 ? zt_v8_load(j->up + i) : zt_v8_load_partial(j->up + i, n);
    zt_v8 h = g / (1.0f + zt_v8_exp(-g)) * u;
    if (n == 8) zt_v8_store(j->h + i, h);
    else zt_v8_store_partial(j->h + i, h, n);
}

ZT_CPU_CLONES
static void forward_range(void *arg, int64_t begin, int64_t end)
{
    for (int64_t i = begin; i < end; i += 8) forward_block(arg, i, end - i < 8 ? end - i : 8);
}

void zt_cpu_swiglu_forward(const zt_cpu_ctx *ctx, int64_t n, const float *gate, const float *up,
                           float *h)
{
    swiglu_job j = {.gate = gate, .up = up, .h = h};
    zt_cpu_parallel_for(ctx, n, 4096, forward_range, &j);
}

ZT_CPU_INLINE void backward_block(const swiglu_job *j, int64_t i, int64_t n)
{
    zt_v8 g = n == 8 ? zt_v8_load(j->gate + i) : zt_v8_load_partial(j->gate + i, n);
    zt_v8 u = n == 8 ? zt_v8_load(j->up + i) : zt_v8_load_partial(j->up + i, n);
    zt_v8 dh = n == 8 ? zt_v8_load(j->dh + i) : zt_v8_load_partial(j->dh + i, n);
    zt_v8 s = 1.0f / (1.0f + zt_v8_exp(-g));
    zt_v8 du = dh * (g * s);
    zt_v8 dg = dh * u * (s * (1.0f + g * (1.0f - s)));
    if (n == 8) {
        zt_v8_store(j->dgate + i, dg);
        zt_v8_store(j->dup + i, du);
    } else {
        zt_v8_store_partial(j->dgate + i, dg, n);
        zt_v8_store_partial(j->dup + i, du, n);
    }
}

ZT_CPU_CLONES
static void backward_range(void *arg, int64_t begin, int64_t end)
{
    for (int64_t i = begin; i < end; i += 8) backward_block(arg, i, end - i < 8 ? end - i : 8);
}

void zt_cpu_swiglu_backward(const zt_cpu_ctx *ctx, int64_t n, const float *gate, const float *up,
                            const float *dh, float *dgate, float *dup)
{
    swiglu_job j = {.gate = gate, .up = up, .dh = dh, .dgate = dgate, .dup = dup};
    zt_cpu_parallel_for(ctx, n, 4096, backward_range, &j);
}
