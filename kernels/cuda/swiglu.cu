/* SwiGLU, the LLaMA MLP activation, in bf16 with fp32 arithmetic:
 *   h = silu(g) * u,  silu(g) = g * s,  s = sigmoid(g) = 1 / (1 + e^-g)
 *   du = dh * g * s;  dg = dh * u * s * (1 + g * (1 - s))
 * Memory-bound: 16-byte accesses (8 elements per thread and step), the last n % 8 elements one by one.
 */
#include "cuda/common.cuh"

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void swiglu_forward_kernel(int64_t n, const bf16 *gate, const bf16 *up, bf16 *h)
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
        float g = __bfloat162float(gate[i]);
        h[i] = __float2bfloat16_rn(g * sigmoid(g) * __bfloat162float(up[i]));
    }
}

__device__ __forceinline__ void swiglu_grad(float g, float u, float dh, float *dg, float *du)
{
    float s = sigmoid(g);
    *du = dh * (g * s);
    *dg = dh * u * (s * (1.0f + g * (1.0f - s)));
}

__global__ void swiglu_backward_kernel(int64_t n, const bf16 *gate, const bf16 *up, const bf16 *dh,
                                       bf16 *dgate, bf16 *dup)
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
        swiglu_grad(__bfloat162float(gate[i]), __bfloat162float(up[i]), __bfloat162float(dh[i]),
                    &dg, &du);
        dgate[i] = __float2bfloat16_rn(dg);
        dup[i] = __float2bfloat16_rn(du);
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
    swiglu_forward_kernel<<<zt_grid_for((n + 7) / 8, 256, ctx), 256, 0, stream>>>(
        n, (const bf16 *)gate, (const bf16 *)up, (bf16 *)h);
    return zt_cuda_check_launch("SwiGLU forward");
}

zt_status zt_cuda_swiglu_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n,
                                  const uint16_t *gate, const uint16_t *up, const uint16_t *dh,
                                  uint16_t *dgate, uint16_t *dup)
{
    const void *ptrs[] = {gate, up, dh, dgate, dup};
    zt_status st = check_aligned("SwiGLU backward", ptrs, 5);
    if (st != ZT_OK || n <= 0) return st;
    swiglu_backward_kernel<<<zt_grid_for((n + 7) / 8, 256, ctx), 256, 0, stream>>>(
        n, (const bf16 *)gate, (const bf16 *)up, (const bf16 *)dh, (bf16 *)dgate, (bf16 *)dup);
    return zt_cuda_check_launch("SwiGLU backward");
}
