/* SwiGLU, the LLaMA MLP activation, in bf16 or fp16 (the context's type) with fp32 arithmetic:
 *   h = silu(g) * u,  silu(g) = g * s,  s = sigmoid(g) = 1 / (1 + e^-g)
 *   du = dh * g * s;  dg = dh * u * s * (1 + g * (1 - s))
 * Memory-bound: 16-byte accesses (8 elements per thread and step), the last n % 8 elements one by one.
 */
#include "cuda/common.cuh"

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T>
__global__ void swiglu_forward_kernel(int64_t n, const T *gate, const T *up, T *h)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t v = first; v < n / 8; v += stride) {
        float g[8], u[8], out[8];
        zt_load8(gate + v * 8, g);
        zt_load8(up + v * 8, u);
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = g[i] * sigmoid(g[i]) * u[i];
        zt_store8(h + v * 8, out);
    }
    for (int64_t i = n / 8 * 8 + first; i < n; i += stride) {
        float g = zt_to_f32(gate[i]);
        h[i] = zt_from_f32<T>(g * sigmoid(g) * zt_to_f32(up[i]));
    }
}

__device__ __forceinline__ void swiglu_grad(float g, float u, float dh, float *dg, float *du)
{
    float s = sigmoid(g);
    *du = dh * (g * s);
    *dg = dh * u * (s * (1.0f + g * (1.0f - s)));
}

template <typename T>
__global__ void swiglu_backward_kernel(int64_t n, const T *gate, const T *up, const T *dh,
                                       T *dgate, T *dup)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t v = first; v < n / 8; v += stride) {
        float g[8], u[8], d[8], dg[8], du[8];
        zt_load8(gate + v * 8, g);
        zt_load8(up + v * 8, u);
        zt_load8(dh + v * 8, d);
#pragma unroll
        for (int i = 0; i < 8; i++) swiglu_grad(g[i], u[i], d[i], &dg[i], &du[i]);
        zt_store8(dgate + v * 8, dg);
        zt_store8(dup + v * 8, du);
    }
    for (int64_t i = n / 8 * 8 + first; i < n; i += stride) {
        float dg, du;
        swiglu_grad(zt_to_f32(gate[i]), zt_to_f32(up[i]), zt_to_f32(dh[i]), &dg, &du);
        dgate[i] = zt_from_f32<T>(dg);
        dup[i] = zt_from_f32<T>(du);
    }
}

static zt_status check_aligned(const char *what, const void *const *ptrs, int n_ptrs)
{
    for (int i = 0; i < n_ptrs; i++)
        if ((uintptr_t)ptrs[i] % 16 != 0)
            return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                                "%s: tensor argument %d is not 16-byte aligned; allocate it with "
                                "cudaMalloc or at a multiple of 8 elements", what, i + 1);
    return ZT_OK;
}

zt_status zt_cuda_swiglu_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n,
                                 const uint16_t *gate, const uint16_t *up, uint16_t *h)
{
    const void *ptrs[] = {gate, up, h};
    zt_status st = check_aligned("SwiGLU forward", ptrs, 3);
    if (st != ZT_OK || n <= 0) return st;
    ZT_DISPATCH16(ctx->dtype, T,
                  swiglu_forward_kernel<T><<<zt_grid_for((n + 7) / 8, 256, ctx), 256, 0, stream>>>(
                      n, (const T *)gate, (const T *)up, (T *)h));
    return zt_cuda_check_launch("SwiGLU forward");
}

zt_status zt_cuda_swiglu_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n,
                                  const uint16_t *gate, const uint16_t *up, const uint16_t *dh,
                                  uint16_t *dgate, uint16_t *dup)
{
    const void *ptrs[] = {gate, up, dh, dgate, dup};
    zt_status st = check_aligned("SwiGLU backward", ptrs, 5);
    if (st != ZT_OK || n <= 0) return st;
    ZT_DISPATCH16(ctx->dtype, T,
                  swiglu_backward_kernel<T><<<zt_grid_for((n + 7) / 8, 256, ctx), 256, 0, stream>>>(
                      n, (const T *)gate, (const T *)up, (const T *)dh, (T *)dgate, (T *)dup));
    return zt_cuda_check_launch("SwiGLU backward");
}

/* ---- row-strided forms: gate and up as column blocks of one [rows, 2F] GEMM output ------------ */

/* Vectors of 8 along each row; cols % 8 == 0 and 8-element row strides (checked on the host). */
template <typename T>
__global__ void swiglu_forward_rows_kernel(int64_t rows, int64_t cols, const T *gate,
                                           const T *up, int64_t ld_in, T *h, int64_t ld_h)
{
    int64_t per_row = cols / 8, n = rows * per_row;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < n; v += stride) {
        int64_t r = v / per_row, c = (v % per_row) * 8;
        float g[8], u[8], out[8];
        zt_load8(gate + r * ld_in + c, g);
        zt_load8(up + r * ld_in + c, u);
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = g[i] * sigmoid(g[i]) * u[i];
        zt_store8(h + r * ld_h + c, out);
    }
}

template <typename T>
__global__ void swiglu_backward_rows_kernel(int64_t rows, int64_t cols, const T *gate,
                                            const T *up, int64_t ld_in, const T *dh,
                                            int64_t ld_dh, T *dgate, T *dup, int64_t ld_out)
{
    int64_t per_row = cols / 8, n = rows * per_row;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < n; v += stride) {
        int64_t r = v / per_row, c = (v % per_row) * 8;
        float g[8], u[8], d[8], dg[8], du[8];
        zt_load8(gate + r * ld_in + c, g);
        zt_load8(up + r * ld_in + c, u);
        zt_load8(dh + r * ld_dh + c, d);
#pragma unroll
        for (int i = 0; i < 8; i++) swiglu_grad(g[i], u[i], d[i], &dg[i], &du[i]);
        zt_store8(dgate + r * ld_out + c, dg);
        zt_store8(dup + r * ld_out + c, du);
    }
}

static zt_status check_rows(const char *what, int64_t rows, int64_t cols, const int64_t *lds,
                            int n_lds)
{
    if (rows < 0 || cols < 0 || cols % 8 != 0)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s: rows %lld and cols %lld must not be negative and cols a multiple "
                            "of 8 (16-byte accesses)",
                            what, (long long)rows, (long long)cols);
    for (int i = 0; i < n_lds; i++)
        if (lds[i] < cols || lds[i] % 8 != 0)
            return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                                "%s: row stride %lld (argument %d) must be at least cols %lld and a "
                                "multiple of 8",
                                what, (long long)lds[i], i + 1, (long long)cols);
    return ZT_OK;
}

zt_status zt_cuda_swiglu_forward_rows(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows,
                                      int64_t cols, const uint16_t *gate, const uint16_t *up,
                                      int64_t ld_in, uint16_t *h, int64_t ld_h)
{
    const char *what = "SwiGLU forward (row-strided)";
    const void *ptrs[] = {gate, up, h};
    const int64_t lds[] = {ld_in, ld_h};
    zt_status st = check_rows(what, rows, cols, lds, 2);
    if (st == ZT_OK) st = check_aligned(what, ptrs, 3);
    if (st != ZT_OK || rows == 0 || cols == 0) return st;
    ZT_DISPATCH16(ctx->dtype, T,
                  swiglu_forward_rows_kernel<T><<<zt_grid_for(rows * (cols / 8), 256, ctx), 256, 0, stream>>>(
                      rows, cols, (const T *)gate, (const T *)up, ld_in, (T *)h, ld_h));
    return zt_cuda_check_launch(what);
}

zt_status zt_cuda_swiglu_backward_rows(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows,
                                       int64_t cols, const uint16_t *gate, const uint16_t *up,
                                       int64_t ld_in, const uint16_t *dh, int64_t ld_dh,
                                       uint16_t *dgate, uint16_t *dup, int64_t ld_out)
{
    const char *what = "SwiGLU backward (row-strided)";
    const void *ptrs[] = {gate, up, dh, dgate, dup};
    const int64_t lds[] = {ld_in, ld_dh, ld_out};
    zt_status st = check_rows(what, rows, cols, lds, 3);
    if (st == ZT_OK) st = check_aligned(what, ptrs, 5);
    if (st != ZT_OK || rows == 0 || cols == 0) return st;
    ZT_DISPATCH16(ctx->dtype, T,
                  swiglu_backward_rows_kernel<T><<<zt_grid_for(rows * (cols / 8), 256, ctx), 256, 0, stream>>>(
                      rows, cols, (const T *)gate, (const T *)up, ld_in, (const T *)dh, ld_dh,
                      (T *)dgate, (T *)dup, ld_out));
    return zt_cuda_check_launch(what);
}
