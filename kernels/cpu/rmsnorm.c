/* RMSNorm as in HF LlamaRMSNorm, in fp32:  y = w * x * r,  r = 1 / sqrt(mean(x^2) + eps).
 *
 * Backward, with g = w * dy and n = dim:
 *   dx = r * (g - x * r^2 * sum(g * x) / n)
 *   dw += sum over rows of dy * x * r   (skipped when dw is NULL: a frozen weight)
 * dx is split over rows; dw over columns (every column sums all rows itself, in row order), so no
 * two threads ever add into the same element and the sums do not depend on the thread count.
 */
#include <math.h>
#include "cpu/kernels.h"
#include "cpu/simd.h"

typedef struct rmsnorm_job {
    int64_t rows, dim;
    float eps;
    const float *x, *w, *dy, *rstd_in;
    float *y, *dx, *dw, *rstd_out;
} rmsnorm_job;

ZT_CPU_CLONES
static void forward_rows(void *arg, int64_t begin, int64_t end)
{
    const rmsnorm_job *j = arg;
    for (int64_t row = begin; row < end; row++) {
        const float *x = j->x + row * j->dim;
        float *y = j->y + row * j->dim;
        float r = 1.0f / sqrtf(zt_dot(x, x, j->dim) / (float)j->dim + j->eps);
        for (int64_t i = 0; i < j->dim; i++) y[i] = j->w[i] * (x[i] * r);
        j->rstd_out[row] = r;
    }
}

void zt_cpu_rmsnorm_forward(const zt_cpu_ctx *ctx, int64_t rows, int64_t dim, float eps,
                            const float *x, const float *w, float *y, float *rstd)
{
    rmsnorm_job j = {.rows = rows, .dim = dim, .eps = eps, .x = x, .w = w, .y = y, .rstd_out = rstd};
    zt_cpu_parallel_for(ctx, rows, 16, forward_rows, &j);
}

ZT_CPU_CLONES
static void backward_input_rows(void *arg, int64_t begin, int64_t end)
{
    const rmsnorm_job *j = arg;
    for (int64_t row = begin; row < end; row++) {
        const float *x = j->x + row * j->dim, *dy = j->dy + row * j->dim;
        float *dx = j->dx + row * j->dim;
        float r = j->rstd_in[row];
        float gx = zt_dot3(j->w, dy, x, j->dim); /* sum(g * x) */
        float c = r * r * gx / (float)j->dim;
        for (int64_t i = 0; i < j->dim; i++) dx[i] = r * (j->w[i] * dy[i] - x[i] * c);
    }
}

ZT_CPU_CLONES
static void backward_weight_columns(void *arg, int64_t begin, int64_t end)
{
    const rmsnorm_job *j = arg;
    for (int64_t row = 0; row < j->rows; row++) {
        const float *x = j->x + row * j->dim, *dy = j->dy + row * j->dim;
        float r = j->rstd_in[row];
        for (int64_t i = begin; i < end; i++) j->dw[i] += dy[i] * (x[i] * r);
    }
}

void zt_cpu_rmsnorm_backward(const zt_cpu_ctx *ctx, int64_t rows, int64_t dim, const float *x,
                             const float *w, const float *rstd, const float *dy, float *dx,
                             float *dw)
{
    rmsnorm_job j = {.rows = rows, .dim = dim, .x = x, .w = w, .dy = dy, .rstd_in = rstd,
                     .dx = dx, .dw = dw};
    zt_cpu_parallel_for(ctx, rows, 16, backward_input_rows, &j);
    if (dw) zt_cpu_parallel_for(ctx, dim, 64, backward_weight_columns, &j);
}
