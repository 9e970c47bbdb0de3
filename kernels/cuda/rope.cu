/* Rotary position embedding, HF rotate_half layout, bf16 in and out with fp32 arithmetic:
 *   y[i]       = x[i] cos(a_i) - x[i + D/2] sin(a_i)
 *   y[i + D/2] = x[i + D/2] cos(a_i) + x[i] sin(a_i),     a_i = position * inv_freq[i]
 * The backward applies the transposed rotation (sin negated). One block per token: its cos/sin
 * table is computed once (accurate sincosf on the fp32 angle, as the CPU kernel does) and reused by
 * every head.
 *
 * One kernel serves the plain rope (q or k alone, in place allowed) and the fused q/k/v form: the
 * forward reads q, k and v from the stacked [tokens, q|k|v] output of one projection GEMM and writes
 * the contiguous q, k (rotated) and v the attention plugin takes; the backward reads the attention's
 * dq, dk, dv and writes one stacked dqkv, so dX and dW of the three projections are one GEMM each.
 * Each thread moves 8 elements of a half-head and the 8 matching ones of the other half as 16-byte
 * accesses when head_dim % 16 == 0 and every pointer and row stride allows it (scalar otherwise).
 * Every element is read and written by the same thread, so in-place calls are safe.
 */
#include <string.h>

#include "cuda/common.cuh"

enum { MAX_HALF = 256 }; /* head_dim <= 512 */

struct rope_args {
    int64_t heads, kv_heads, head_dim;
    const bf16 *in_q, *in_k, *in_v; /* in_k, in_v may be NULL (kv_heads part absent) */
    int64_t ld_in_q, ld_in_k, ld_in_v; /* row strides, elements */
    bf16 *out_q, *out_k, *out_v;
    int64_t ld_out_q, ld_out_k, ld_out_v;
};

/* rope_args' pointers are typed bf16 for their address arithmetic only (both 16-bit types have the
 * same size); the kernel reads and writes them as T. */
template <bool VEC, typename T>
__global__ void rope_kernel(rope_args a, const int32_t *positions, const float *inv_freq, float sin_sign)
{
    __shared__ float cos_a[MAX_HALF], sin_a[MAX_HALF];
    int64_t t = blockIdx.x;
    int half = (int)(a.head_dim / 2);
    float position = (float)positions[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(position * inv_freq[i], &s, &c);
        cos_a[i] = c;
        sin_a[i] = sin_sign * s;
    }
    __syncthreads();
    const int width = VEC ? 8 : 1;
    int64_t per_head = half / width; /* work items per head */
    int64_t nq = a.heads * per_head, nk = a.in_k ? a.kv_heads * per_head : 0;
    for (int64_t p = threadIdx.x; p < nq + nk; p += blockDim.x) {
        int64_t h, i;
        const T *x;
        T *y;
        if (p < nq) {
            h = p / per_head;
            i = (p % per_head) * width;
            x = (const T *)(a.in_q + t * a.ld_in_q + h * a.head_dim);
            y = (T *)(a.out_q + t * a.ld_out_q + h * a.head_dim);
        } else {
            h = (p - nq) / per_head;
            i = ((p - nq) % per_head) * width;
            x = (const T *)(a.in_k + t * a.ld_in_k + h * a.head_dim);
            y = (T *)(a.out_k + t * a.ld_out_k + h * a.head_dim);
        }
        if (VEC) {
            float lo[8], hi[8], ylo[8], yhi[8];
            zt_load8(x + i, lo);
            zt_load8(x + i + half, hi);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                ylo[j] = lo[j] * cos_a[i + j] - hi[j] * sin_a[i + j];
                yhi[j] = hi[j] * cos_a[i + j] + lo[j] * sin_a[i + j];
            }
            zt_store8(y + i, ylo);
            zt_store8(y + i + half, yhi);
        } else {
            float lo = zt_to_f32(x[i]), hi = zt_to_f32(x[i + half]);
            y[i] = zt_from_f32<T>(lo * cos_a[i] - hi * sin_a[i]);
            y[i + half] = zt_from_f32<T>(hi * cos_a[i] + lo * sin_a[i]);
        }
    }
    if (!a.in_v) return;
    /* v passes through unchanged (a copy between the stacked and the contiguous layout). */
    int64_t row = a.kv_heads * a.head_dim;
    const bf16 *x = a.in_v + t * a.ld_in_v;
    bf16 *y = a.out_v + t * a.ld_out_v;
    if (VEC) {
        for (int64_t e = threadIdx.x * 8; e < row; e += blockDim.x * 8)
            *reinterpret_cast<uint4 *>(y + e) = *reinterpret_cast<const uint4 *>(x + e);
    } else {
        for (int64_t e = threadIdx.x; e < row; e += blockDim.x) y[e] = x[e];
    }
}

static int aligned16(const void *p) { return p == NULL || (uintptr_t)p % 16 == 0; }

static zt_status launch_rope(const char *what, zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                             const rope_args *a, const int32_t *positions, const float *inv_freq,
                             float sin_sign)
{
    if (tokens < 0 || a->heads <= 0 || a->kv_heads < 0 || a->head_dim <= 0 || a->head_dim % 2 != 0 ||
        a->head_dim > 2 * MAX_HALF)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s: head_dim %lld must be even and at most %d, heads %lld positive, "
                            "kv_heads %lld not negative",
                            what, (long long)a->head_dim, 2 * MAX_HALF, (long long)a->heads,
                            (long long)a->kv_heads);
    if (!a->in_q || !a->out_q || (a->in_k && !a->out_k) || (a->in_v && !a->out_v) || !positions ||
        !inv_freq)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: a tensor argument is NULL", what);
    if (tokens == 0) return ZT_OK;
    /* 16-byte accesses need 8-element half-heads, aligned pointers and row strides of 8 elements
     * (always true for the llama plugin's shapes, which are checked to be multiples of 8). */
    int vec = a->head_dim % 16 == 0;
    const void *ptrs[] = {a->in_q, a->in_k, a->in_v, a->out_q, a->out_k, a->out_v};
    for (int i = 0; i < 6; i++) vec = vec && aligned16(ptrs[i]);
    const int64_t lds[] = {a->ld_in_q, a->ld_in_k, a->ld_in_v, a->ld_out_q, a->ld_out_k, a->ld_out_v};
    for (int i = 0; i < 6; i++) vec = vec && lds[i] % 8 == 0;
    ZT_DISPATCH16(ctx->dtype, T,
        if (vec)
            rope_kernel<true, T><<<(unsigned)tokens, 128, 0, stream>>>(*a, positions, inv_freq, sin_sign);
        else
            rope_kernel<false, T><<<(unsigned)tokens, 128, 0, stream>>>(*a, positions, inv_freq, sin_sign));
    return zt_cuda_check_launch(what);
}

static rope_args plain_args(int64_t heads, int64_t head_dim, const uint16_t *in, uint16_t *out)
{
    rope_args a;
    memset(&a, 0, sizeof a);
    a.heads = heads;
    a.head_dim = head_dim;
    a.in_q = (const bf16 *)in;
    a.out_q = (bf16 *)out;
    a.ld_in_q = a.ld_out_q = heads * head_dim;
    return a;
}

zt_status zt_cuda_rope_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                               int64_t heads, int64_t head_dim, const int32_t *positions,
                               const float *inv_freq, const uint16_t *x, uint16_t *y)
{
    rope_args a = plain_args(heads, head_dim, x, y);
    return launch_rope("rope forward", ctx, stream, tokens, &a, positions, inv_freq, 1.0f);
}

zt_status zt_cuda_rope_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                int64_t heads, int64_t head_dim, const int32_t *positions,
                                const float *inv_freq, const uint16_t *dy, uint16_t *dx)
{
    rope_args a = plain_args(heads, head_dim, dy, dx);
    return launch_rope("rope backward", ctx, stream, tokens, &a, positions, inv_freq, -1.0f);
}

zt_status zt_cuda_rope_qkv_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                   int64_t heads, int64_t kv_heads, int64_t head_dim,
                                   const int32_t *positions, const float *inv_freq,
                                   const uint16_t *qkv, uint16_t *q, uint16_t *k, uint16_t *v)
{
    if (kv_heads <= 0)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "rope q/k/v forward: kv_heads %lld must be positive",
                            (long long)kv_heads);
    int64_t Q = heads * head_dim, KV = kv_heads * head_dim, ld = Q + 2 * KV;
    const bf16 *in = (const bf16 *)qkv;
    rope_args a = {heads, kv_heads, head_dim, in, in ? in + Q : NULL, in ? in + Q + KV : NULL,
                   ld, ld, ld, (bf16 *)q, (bf16 *)k, (bf16 *)v, Q, KV, KV};
    return launch_rope("rope q/k/v forward", ctx, stream, tokens, &a, positions, inv_freq, 1.0f);
}

zt_status zt_cuda_rope_qkv_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                    int64_t heads, int64_t kv_heads, int64_t head_dim,
                                    const int32_t *positions, const float *inv_freq,
                                    const uint16_t *dq, const uint16_t *dk, const uint16_t *dv,
                                    uint16_t *dqkv)
{
    if (kv_heads <= 0 || !dk || !dv)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "rope q/k/v backward: kv_heads %lld must be positive and dk, dv given",
                            (long long)kv_heads);
    int64_t Q = heads * head_dim, KV = kv_heads * head_dim, ld = Q + 2 * KV;
    bf16 *out = (bf16 *)dqkv;
    rope_args a = {heads, kv_heads, head_dim, (const bf16 *)dq, (const bf16 *)dk, (const bf16 *)dv,
                   Q, KV, KV, out, out ? out + Q : NULL, out ? out + Q + KV : NULL, ld, ld, ld};
    return launch_rope("rope q/k/v backward", ctx, stream, tokens, &a, positions, inv_freq, -1.0f);
}
