/* Rotary position embedding, HF rotate_half layout, bf16 in and out with fp32 arithmetic:
 *   y[i]       = x[i] cos(a_i) - x[i + D/2] sin(a_i)
 *   y[i + D/2] = x[i + D/2] cos(a_i) + x[i] sin(a_i),     a_i = position * inv_freq[i]
 * The backward applies the transposed rotation (sin negated). One block per token: its cos/sin
 * table is computed once (accurate sincosf on the fp32 angle, as the CPU kernel does) and reused by
 * every head.
 */
#include "cuda/common.cuh"

enum { MAX_HALF = 256 }; /* head_dim <= 512 */

__global__ void rope_kernel(int64_t heads, int64_t head_dim, const int32_t *positions,
                            const float *inv_freq, float sin_sign, const bf16 *in, bf16 *out)
{
    __shared__ float cos_a[MAX_HALF], sin_a[MAX_HALF];
    int64_t t = blockIdx.x;
    int half = (int)(head_dim / 2);
    float position = (float)positions[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(position * inv_freq[i], &s, &c);
        cos_a[i] = c;
        sin_a[i] = sin_sign * s;
    }
    __syncthreads();
    const bf16 *x = in + t * heads * head_dim;
    bf16 *y = out + t * heads * head_dim;
    for (int64_t p = threadIdx.x; p < heads * half; p += blockDim.x) {
        int64_t h = p / half;
        int i = (int)(p % half);
        float lo = __bfloat162float(x[h * head_dim + i]);
        float hi = __bfloat162float(x[h * head_dim + i + half]);
        y[h * head_dim + i] = __float2bfloat16_rn(lo * cos_a[i] - hi * sin_a[i]);
        y[h * head_dim + i + half] = __float2bfloat16_rn(hi * cos_a[i] + lo * sin_a[i]);
    }
}

static zt_status launch_rope(const char *what, cudaStream_t stream, int64_t tokens, int64_t heads,
                             int64_t head_dim, const int32_t *positions, const float *inv_freq,
                             float sin_sign, const uint16_t *in, uint16_t *out)
{
    if (tokens < 0 || heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 || head_dim > 2 * MAX_HALF)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s: head_dim %lld must be even and at most %d, heads %lld positive",
                            what, (long long)head_dim, 2 * MAX_HALF, (long long)heads);
    if (tokens == 0) return ZT_OK;
    rope_kernel<<<(unsigned)tokens, 128, 0, stream>>>(heads, head_dim, positions, inv_freq, sin_sign,
                                                      (const bf16 *)in, (bf16 *)out);
    return zt_cuda_check_launch(what);
}

zt_status zt_cuda_rope_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                               int64_t heads, int64_t head_dim, const int32_t *positions,
                               const float *inv_freq, const uint16_t *x, uint16_t *y)
{
    (void)ctx;
    return launch_rope("rope forward", stream, tokens, heads, head_dim, positions, inv_freq, 1.0f,
                       x, y);
}

zt_status zt_cuda_rope_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                int64_t heads, int64_t head_dim, const int32_t *positions,
                                const float *inv_freq, const uint16_t *dy, uint16_t *dx)
{
    (void)ctx;
    return launch_rope("rope backward", stream, tokens, heads, head_dim, positions, inv_freq,
                       -1.0f, dy, dx);
}
