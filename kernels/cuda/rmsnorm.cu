/* RMSNorm (HF LlamaRMSNorm) in bf16 or fp16 (the context's type) with fp32 statistics:  y = w * (x * r),  r = 1/sqrt(mean(x^2)+eps).
 * Backward, g = w * dy:  dx = r * (g - x * r^2 * sum(g * x) / dim);  dw += sum over rows dy * x * r.
 *
 * One block per row (forward) or per chunk of rows (backward); each thread keeps up to
 * MAX_VECTORS groups of 8 columns in registers, so a row is read from memory once. The weight
 * gradient is summed deterministically: every block writes the partial sums of its rows to scratch,
 * and a second kernel adds the partials of each column in a fixed order.
 */
#include <stdint.h>
#include "cuda/common.cuh"

constexpr int MAX_VECTORS = 4;           /* 8-column groups per thread: dim <= 1024 threads * 32 */
constexpr int64_t MAX_BACKWARD_CHUNKS = 1024; /* blocks of the backward (about one wave of 256-thread
                                              * blocks on an H200); partials: chunks x dim fp32 */

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

template <typename T>
__global__ void rmsnorm_forward_kernel(int64_t dim, float eps, const T *x, const T *w,
                                       T *y, float *rstd)
{
    __shared__ float reduce[32];
    int64_t row = blockIdx.x;
    const T *xr = x + row * dim;
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
    const void *ptrs[] = {x, w, y};
    zt_status st = check_shape("RMSNorm forward", rows, dim, ptrs, 3);
    if (st != ZT_OK || rows == 0) return st;
    ZT_DISPATCH16(ctx->dtype, T,
                  rmsnorm_forward_kernel<T><<<(unsigned)rows, threads_for(dim), 0, stream>>>(
                      dim, eps, (const T *)x, (const T *)w, (T *)y, rstd));
    return zt_cuda_check_launch("RMSNorm forward");
}

/* Block b handles rows [b * rows_per_chunk, ...): dx for each, and the sum over its rows of
 * dy * x * r for every column, written to partial[b, :] (partial NULL: a frozen weight, no sums). One pass per row: each thread holds VPT
 * groups of 8 columns of x and dy in registers across the block reduction, w for the whole block.
 * VPT is the fewest groups per thread that cover dim with at most 1024 threads, so small rows get
 * many threads (latency hidden by occupancy), not many registers (launch bounds of 1024 threads
 * cap them at 64, so every block size launches; VPT 2 and 4, dim > 8192, may spill). dres (optional) is added to dx
 * in fp32 before the one rounding (the residual branch's gradient); dx may alias dres. */
template <int VPT, typename T>
__global__ void __launch_bounds__(1024) rmsnorm_backward_kernel(int64_t rows, int64_t dim, int64_t rows_per_chunk,
                                        const T *x, const T *w, const float *rstd,
                                        const T *dy, const T *dres, T *dx, float *partial)
{
    __shared__ float reduce[32];
    float dw_acc[VPT][8], wv[VPT][8];
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        int64_t col = ((int64_t)v * blockDim.x + threadIdx.x) * 8;
#pragma unroll
        for (int i = 0; i < 8; i++) dw_acc[v][i] = wv[v][i] = 0.0f;
        if (col < dim) zt_load8(w + col, wv[v]);
    }
    int64_t first = blockIdx.x * rows_per_chunk;
    int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    for (int64_t row = first; row < last; row++) {
        float r = rstd[row];
        float gx = 0.0f;
        float xv[VPT][8], dyv[VPT][8];
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            int64_t col = ((int64_t)v * blockDim.x + threadIdx.x) * 8;
            if (col < dim) {
                zt_load8(x + row * dim + col, xv[v]);
                zt_load8(dy + row * dim + col, dyv[v]);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    gx += wv[v][i] * dyv[v][i] * xv[v][i];
                    if (partial) dw_acc[v][i] += dyv[v][i] * (xv[v][i] * r);
                }
            }
        }
        gx = zt_block_sum(gx, reduce);
        float c = r * r * gx / (float)dim;
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            int64_t col = ((int64_t)v * blockDim.x + threadIdx.x) * 8;
            if (col < dim) {
                float out[8], res[8];
                if (dres) zt_load8(dres + row * dim + col, res);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    out[i] = r * (wv[v][i] * dyv[v][i] - xv[v][i] * c);
                    if (dres) out[i] += res[i];
                }
                zt_store8(dx + row * dim + col, out);
            }
        }
    }
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        int64_t col = ((int64_t)v * blockDim.x + threadIdx.x) * 8;
        if (partial && col < dim) {
            float4 *out = reinterpret_cast<float4 *>(partial + blockIdx.x * dim + col);
            out[0] = make_float4(dw_acc[v][0], dw_acc[v][1], dw_acc[v][2], dw_acc[v][3]);
            out[1] = make_float4(dw_acc[v][4], dw_acc[v][5], dw_acc[v][6], dw_acc[v][7]);
        }
    }
}

/* dw[col] += sum over chunks of partial[chunk, col] in a fixed order: thread (lane, g) of a block
 * of 32 columns x SUM_GROUPS sums chunks g, g + SUM_GROUPS, ... in order, then the groups are added
 * in group order. Deterministic, and SUM_GROUPS times the parallelism of one thread per column. */
constexpr int SUM_GROUPS = 8;

__global__ void sum_partials_kernel(int64_t chunks, int64_t dim, const float *partial, float *dw)
{
    __shared__ float part[SUM_GROUPS][32];
    int64_t col = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (col < dim)
        for (int64_t c = threadIdx.y; c < chunks; c += SUM_GROUPS) sum += partial[c * dim + col];
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || col >= dim) return;
    float total = 0.0f;
#pragma unroll
    for (int g = 0; g < SUM_GROUPS; g++) total += part[g][threadIdx.x];
    dw[col] += total;
}

static int64_t backward_chunks(int64_t rows)
{
    return rows < MAX_BACKWARD_CHUNKS ? rows : MAX_BACKWARD_CHUNKS;
}

uint64_t zt_cuda_rmsnorm_backward_scratch_bytes(int64_t rows, int64_t dim)
{
    return (uint64_t)backward_chunks(rows) * (uint64_t)dim * sizeof(float);
}

static zt_status rmsnorm_backward(const char *what, zt_cuda_ctx *ctx, cudaStream_t stream,
                                  int64_t rows, int64_t dim, const uint16_t *x, const uint16_t *w,
                                  const float *rstd, const uint16_t *dy, const uint16_t *dres,
                                  uint16_t *dx, float *dw)
{
    const void *ptrs[] = {x, w, dy, dx, dw, dres};
    zt_status st = check_shape(what, rows, dim, ptrs, dres ? 6 : 5);
    if (st != ZT_OK || rows == 0) return st;
    int64_t chunks = backward_chunks(rows);
    int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
    chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    /* dw NULL (a frozen norm): dx alone, no partial sums and no scratch */
    float *partial = dw ? (float *)zt_cuda_scratch(ctx, zt_cuda_rmsnorm_backward_scratch_bytes(rows, dim), what)
                        : NULL;
    if (dw && !partial) return ZT_ERR_BUFFER_TOO_SMALL;
    int64_t vectors = dim / 8;
    int vpt = vectors <= 1024 ? 1 : vectors <= 2048 ? 2 : 4; /* dim <= 32768: check_shape */
    int64_t threads = (vectors + vpt - 1) / vpt;
    threads = (threads + 31) / 32 * 32;
    ZT_DISPATCH16(ctx->dtype, T,
        const T *bx = (const T *)x; const T *bw = (const T *)w; const T *bdy = (const T *)dy;
        const T *bres = (const T *)dres;
        T *bdx = (T *)dx;
        if (vpt == 1)
            rmsnorm_backward_kernel<1, T><<<(unsigned)chunks, (unsigned)threads, 0, stream>>>(
                rows, dim, rows_per_chunk, bx, bw, rstd, bdy, bres, bdx, partial);
        else if (vpt == 2)
            rmsnorm_backward_kernel<2, T><<<(unsigned)chunks, (unsigned)threads, 0, stream>>>(
                rows, dim, rows_per_chunk, bx, bw, rstd, bdy, bres, bdx, partial);
        else
            rmsnorm_backward_kernel<4, T><<<(unsigned)chunks, (unsigned)threads, 0, stream>>>(
                rows, dim, rows_per_chunk, bx, bw, rstd, bdy, bres, bdx, partial));
    if ((st = zt_cuda_check_launch(what)) != ZT_OK || !dw) return st;
    sum_partials_kernel<<<(unsigned)((dim + 31) / 32), dim3(32, SUM_GROUPS), 0, stream>>>(
        chunks, dim, partial, dw);
    return zt_cuda_check_launch("RMSNorm backward (weight gradient)");
}

zt_status zt_cuda_rmsnorm_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows,
                                   int64_t dim, const uint16_t *x, const uint16_t *w,
                                   const float *rstd, const uint16_t *dy, uint16_t *dx, float *dw)
{
    return rmsnorm_backward("RMSNorm backward", ctx, stream, rows, dim, x, w, rstd, dy, NULL, dx, dw);
}

zt_status zt_cuda_rmsnorm_backward_add(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows,
                                       int64_t dim, const uint16_t *x, const uint16_t *w,
                                       const float *rstd, const uint16_t *dy,
                                       const uint16_t *dres, uint16_t *dx, float *dw)
{
    if (!dres)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "RMSNorm backward + residual: dres is NULL");
    return rmsnorm_backward("RMSNorm backward + residual", ctx, stream, rows, dim, x, w, rstd, dy,
                            dres, dx, dw);
}
