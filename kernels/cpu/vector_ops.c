/* Whole-buffer operations: the global gradient norm (for clipping), scaling and adding. */
#include <math.h>
#include <string.h>
#include "cpu/kernels.h"
#include "cpu/f16.h"
#include "cpu/simd.h"

/* The norm's sum is split into a fixed number of slices, whatever the thread count, and the
 * slices are added in order: the result is the same for any thread pool. */
enum { NORM_SLICES = 64 };

typedef struct norm_job {
    int64_t n_tensors;
    const float *const *tensors;
    const int64_t *sizes;
    int64_t total;
    double partial[NORM_SLICES];
} norm_job;

typedef float zt_v4 __attribute__((vector_size(16)));
typedef double zt_v4d __attribute__((vector_size(32)));

/* Sum of x[i]^2 in double (the squares of fp32 values are exact in double). */
ZT_CPU_INLINE double sum_squares_f64(const float *x, int64_t n)
{
    zt_v4d s0 = {0}, s1 = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        zt_v4 lo, hi;
        memcpy(&lo, x + i, sizeof lo);
        memcpy(&hi, x + i + 4, sizeof hi);
        zt_v4d dlo = __builtin_convertvector(lo, zt_v4d), dhi = __builtin_convertvector(hi, zt_v4d);
        s0 += dlo * dlo;
        s1 += dhi * dhi;
    }
    zt_v4d s = s0 + s1;
    double total = (s[0] + s[1]) + (s[2] + s[3]);
    for (; i < n; i++) total += (double)x[i] * x[i];
    return total;
}

/* Sum of squares of elements [begin, end) of the concatenation of all tensors. */
ZT_CPU_CLONES
static double sum_squares(const norm_job *j, int64_t begin, int64_t end)
{
    double total = 0.0;
    int64_t offset = 0;
    for (int64_t t = 0; t < j->n_tensors && offset < end; offset += j->sizes[t], t++) {
        int64_t lo = begin > offset ? begin - offset : 0;
        int64_t hi = end - offset < j->sizes[t] ? end - offset : j->sizes[t];
        if (lo < hi) total += sum_squares_f64(j->tensors[t] + lo, hi - lo);
    }
    return total;
}

static void norm_slices(void *arg, int64_t begin, int64_t end)
{
    norm_job *j = arg;
    for (int64_t slice = begin; slice < end; slice++) {
        int64_t lo = j->total * slice / NORM_SLICES, hi = j->total * (slice + 1) / NORM_SLICES;
        j->partial[slice] = sum_squares(j, lo, hi);
    }
}

double zt_cpu_global_l2_norm(const zt_cpu_ctx *ctx, int64_t n_tensors, const float *const *tensors,
                             const int64_t *sizes)
{
    norm_job j = {.n_tensors = n_tensors, .tensors = tensors, .sizes = sizes};
    for (int64_t t = 0; t < n_tensors; t++) j.total += sizes[t];
    zt_cpu_parallel_for(ctx, NORM_SLICES, 1, norm_slices, &j);
    double total = 0.0;
    for (int slice = 0; slice < NORM_SLICES; slice++) total += j.partial[slice];
    return sqrt(total);
}

typedef struct elementwise_job {
    float s;
    const float *x;
    float *y;
} elementwise_job;

static void scale_range(void *arg, int64_t begin, int64_t end)
{
    const elementwise_job *j = arg;
    for (int64_t i = begin; i < end; i++) j->y[i] *= j->s;
}

void zt_cpu_scale(const zt_cpu_ctx *ctx, int64_t n, float s, float *x)
{
    elementwise_job j = {.s = s, .y = x};
    zt_cpu_parallel_for(ctx, n, 16384, scale_range, &j);
}

static void add_range(void *arg, int64_t begin, int64_t end)
{
    const elementwise_job *j = arg;
    for (int64_t i = begin; i < end; i++) j->y[i] += j->x[i];
}

void zt_cpu_add(const zt_cpu_ctx *ctx, int64_t n, const float *x, float *y)
{
    elementwise_job j = {.x = x, .y = y};
    zt_cpu_parallel_for(ctx, n, 16384, add_range, &j);
}

typedef struct bf16_job {
    const float *src;
    uint16_t *dst;
} bf16_job;

static void bf16_range(void *arg, int64_t begin, int64_t end)
{
    const bf16_job *j = arg;
    for (int64_t i = begin; i < end; i++) j->dst[i] = zt_bf16_bits_from_f32(j->src[i]);
}

void zt_cpu_to_bf16(const zt_cpu_ctx *ctx, int64_t n, const float *src, uint16_t *dst)
{
    if (n <= 0) return;
    bf16_job j = {src, dst};
    zt_cpu_parallel_for(ctx, n, 16384, bf16_range, &j);
}

static void f16_range(void *arg, int64_t begin, int64_t end)
{
    const bf16_job *j = arg;
    for (int64_t i = begin; i < end; i++) j->dst[i] = zt_f16_bits_from_f32(j->src[i]);
}

void zt_cpu_to_f16(const zt_cpu_ctx *ctx, int64_t n, const float *src, uint16_t *dst)
{
    if (n <= 0) return;
    bf16_job j = {src, dst};
    zt_cpu_parallel_for(ctx, n, 16384, f16_range, &j);
}
