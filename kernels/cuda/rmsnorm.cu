/* RMSNorm (HF LlamaRMSNorm) in bf16 with fp32 statistics:  y = w * (x * r),  r = 1/sqrt(mean(x^2)+eps).
 * Backward, g = w * dy:  dx = r * (g - x * r^2 * sum(g * x) / dim);  dw += sum over rows dy * x * r.
 *
 * One block per row (forward) or per chunk of rows (backward); each thread keeps up to
 * MAX_VECTORS groups of 8 columns in registers, so a row is read from memory once. The weight
 * gradient is summed deterministically: every block writes the partial sums of its rows to scratch,
 * and a second kernel adds the partials of each column in block order.
 */
#include <stdint.h>
#include "cuda/common.cuh"

constexpr int MAX_VECTORS = 4;           /* 8-column groups per thread: dim <= 1024 threads * 32 */
constexpr int64_t MAX_BACKWARD_CHUNKS = 256; /* blocks of the backward; partials: chunks x dim fp32 */

static int threads_for(int64_t dim)
{
    int64_t vectors = dim / 8;
    int64_t threads = (vectors + MAX_VECTORS - 1) / MAX_VECTORS;
    threads = (threads + 31) / 32 * 32;
    return (int)(threads < 64 ? 64 : threads);
}

static zt_status check_shape(const char *what, int64_t rows, int64_t dim, const void *const *ptrs,
                             int n_ptrs)
{
    if (rows < 0 || dim <= 0 || dim % 8 != 0 || dim > 1024 * 8 * MAX_VECTORS)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s: dim %lld must be a positive multiple of 8 and at most %d (rows %lld)",
                            what, (long long)dim, 1024 * 8 * MAX_VECTORS, (long long)rows);
    for (int i = 0; i < n_ptrs; i++)
        if ((uintptr_t)ptrs[i] % 16 != 0)
            return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                                "%s: tensor argument %d is not 16-byte aligned; allocate it with "
                                "cudaMalloc or at a multiple of 8 elements", what, i + 1);
    return ZT_OK;
}

__global__ void rmsnorm_forward_kernel(int64_t dim, float eps, const bf16 *x, const bf16 *w,
                                       bf16 *y, float *rstd)
{
    __shared__ float reduce[32];
    int64_t row = blockIdx.x;
    const bf16 *xr = x + row * dim;
    float xv[MAX_VECTORS][8];
    float sum_sq = 0.0f;
#pragma unroll
    for (int v = 0; v < MAX_VECTORS; v++) {
        int64_t col = ((int64_t)v * blockDim.x + threadIdx.x) * 8;
        if (col < dim) {
            zt_load8(xr + col, xv[v]);
#pragma unroll
            for (int i = 0; i < 8; i++) sum_sq += xv[v][i] * xv[v][i];
        }
    }
    sum_sq = zt_block_sum(sum_sq, reduce);
    float r = 1.0f / sqrtf(sum_sq / (float)dim + eps);
#pragma unroll
    for (int v = 0; v < MAX_VECTORS; v++) {
        int64_t col = ((int64_t)v * blockDim.x + threadIdx.x) * 8;
        if (col < dim) {
            float wv[8], out[8];
            zt_load8(w + col, wv);
#pragma unroll
            for (int i = 0; i < 8; i++) out[i] = wv[i] * (xv[v][i] * r);
            zt_store8(y + row * dim + col, out);
        }
    }
    if (threadIdx.x == 0) rstd[row] = r;
}

zt_status zt_cuda_rmsnorm_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows, int64_t dim,
                                  float eps, const uint16_t *x, const uint16_t *w, uint16_t *y,
                                  float *rstd)
{
    (void)ctx;
    const void *ptrs[] = {x, w, y};
    zt_status st = check_shape("RMSNorm forward", rows, dim, ptrs, 3);
    if (st != ZT_OK || rows == 0) return st;
    rmsnorm_forward_kernel<<<(unsigned)rows, threads_for(dim), 0, stream>>>(
        dim, eps, (const bf16 *)x, (const bf16 *)w, (bf16 *)y, rstd);
    return zt_cuda_check_launch("RMSNorm forward");
}

/* Block b handles rows [b * rows_per_chunk, ...): dx for each, and the sum over its rows of
 * dy * x * r for every column, written to partial[b, :]. Only the weight-gradient sums stay in
 * registers; the second pass over a row re-reads it from L1/L2, which keeps large blocks from
 * spilling. */
__global__ void rmsnorm_backward_kernel(int64_t rows, int64_t dim, int64_t rows_per_chunk,
                                        const bf16 *x, const bf16 *w, const float *rstd,
                                        const bf16 *dy, bf16 *dx, float *partial)
{
    __shared__ float reduce[32];
    float dw_acc[MAX_VECTORS][8];
#pragma unroll
    for (int v = 0; v < MAX_VECTORS; v++)
#pragma unroll
        for (int i = 0; i < 8; i++) dw_acc[v][i] = 0.0f;
    int64_t first = blockIdx.x * rows_per_chunk;
    int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    for (int64_t row = first; row < last; row++) {
        float r = rstd[row];
        float gx = 0.0f;
#pragma unroll
        for (int v = 0; v < MAX_VECTORS; v++) {
            int64_t col = ((int64_t)v * blockDim.x + threadIdx.x) * 8;
            if (col < dim) {
                float xv[8], dyv[8], wv[8];
                zt_load8(x + row * dim + col, xv);
                zt_load8(dy + row * dim + col, dyv);
                zt_load8(w + col, wv);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    gx += wv[i] * dyv[i] * xv[i];
                    dw_acc[v][i] += dyv[i] * (xv[i] * r);
                }
            }
        }
        gx = zt_block_sum(gx, reduce);
        float c = r * r * gx / (float)dim;
#pragma unroll
        for (int v = 0; v < MAX_VECTORS; v++) {
            int64_t col = ((int64_t)v * blockDim.x + threadIdx.x) * 8;
            if (col < dim) {
                float xv[8], dyv[8], wv[8], out[8];
                zt_load8(x + row * dim + col, xv);
                zt_load8(dy + row * dim + col, dyv);
                zt_load8(w + col, wv);
#pragma unroll
                for (int i = 0; i < 8; i++) out[i] = r * (wv[i] * dyv[i] - xv[i] * c);
                zt_store8(dx + row * dim + col, out);
            }
        }
    }
#pragma unroll
    for (int v = 0; v < MAX_VECTORS; v++) {
        int64_t col = ((int64_t)v * blockDim.x + threadIdx.x) * 8;
        if (col < dim) {
            float4 *out = reinterpret_cast<float4 *>(partial + blockIdx.x * dim + col);
            out[0] = make_float4(dw_acc[v][0], dw_acc[v][1], dw_acc[v][2], dw_acc[v][3]);
            out[1] = make_float4(dw_acc[v][4], dw_acc[v][5], dw_acc[v][6], dw_acc[v][7]);
        }
    }
}

/* dw[col] += sum over chunks of partial[chunk, col], in chunk order. */
__global__ void sum_partials_kernel(int64_t chunks, int64_t dim, const float *partial, float *dw)
{
    int64_t col = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (col >= dim) return;
    float sum = 0.0f;
    for (int64_t c = 0; c < chunks; c++) sum += partial[c * dim + col];
    dw[col] += sum;
}

static int64_t backward_chunks(int64_t rows)
{
    return rows < MAX_BACKWARD_CHUNKS ? rows : MAX_BACKWARD_CHUNKS;
}

uint64_t zt_cuda_rmsnorm_backward_scratch_bytes(int64_t rows, int64_t dim)
{
    return (uint64_t)backward_chunks(rows) * (uint64_t)dim * sizeof(float);
}

zt_status zt_cuda_rmsnorm_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows,
                                   int64_t dim, const uint16_t *x, const uint16_t *w,
                                   const float *rstd, const uint16_t *dy, uint16_t *dx, float *dw)
{
    const void *ptrs[] = {x, w, dy, dx, dw};
    zt_status st = check_shape("RMSNorm backward", rows, dim, ptrs, 5);
    if (st != ZT_OK || rows == 0) return st;
    int64_t chunks = backward_chunks(rows);
    int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
    chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    float *partial = (float *)zt_cuda_scratch(
        ctx, zt_cuda_rmsnorm_backward_scratch_bytes(rows, dim), "RMSNorm backward");
    if (!partial) return ZT_ERR_BUFFER_TOO_SMALL;
    rmsnorm_backward_kernel<<<(unsigned)chunks, threads_for(dim), 0, stream>>>(
        rows, dim, rows_per_chunk, (const bf16 *)x, (const bf16 *)w, rstd, (const bf16 *)dy,
        (bf16 *)dx, partial);
    if ((st = zt_cuda_check_launch("RMSNorm backward")) != ZT_OK) return st;
    sum_partials_kernel<<<(unsigned)((dim + 255) / 256), 256, 0, stream>>>(chunks, dim, partial, dw);
    return zt_cuda_check_launch("RMSNorm backward (weight gradient)");
}
