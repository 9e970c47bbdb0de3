/* Exact causal attention for the head sizes the flash kernels do not take (anything but 64 and 128,
 * e.g. the 8- and 16-wide heads of small test models): one thread per query row (forward, dQ) or per
 * key row (dK, dV), fp32 arithmetic on bf16 or fp16 inputs (the element type E, a template
 * parameter, picked by the callers' dtype), the same masks and outputs as the flash kernels
 * (o, lse [B,H,T]; dq, dk, dv overwritten). Simple rather than fast: each thread walks every key (or
 * query) of its row, O(T^2 D) work with no tiling; a model of real size uses the flash kernels.
 * Deterministic: every output element is summed by one thread in a fixed order.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "exact.h"

enum { THREADS = 128 };

typedef __nv_bfloat16 bf16;
typedef __half f16;

__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(f16 x) { return __half2float(x); }
template <typename E> __device__ __forceinline__ E from_f32(float v);
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ f16 from_f32<f16>(float v) { return __float2half_rn(v); }

template <typename E>
struct exact_args {
    int64_t batch, seq, heads, kv_heads, head_dim;
    float scale;
    const E *q, *k, *v, *o, *dout;
    const int32_t *doc_ids;
    const float *lse;
    float *delta; /* [B, H, T] rowsum(dO * O) */
};

/* The row of token t, head h of a [B, T, heads, D] tensor. */
template <typename E>
__device__ __forceinline__ int64_t row_at(const exact_args<E> &a, int64_t b, int64_t t, int64_t h, int64_t heads)
{
    return ((b * a.seq + t) * heads + h) * a.head_dim;
}

/* Query i of row b sees key j: causal, and within one document when doc_ids are given. */
template <typename E>
__device__ __forceinline__ bool visible(const exact_args<E> &a, int64_t b, int64_t i, int64_t j)
{
    return j <= i && (!a.doc_ids || a.doc_ids[b * a.seq + i] == a.doc_ids[b * a.seq + j]);
}

template <typename E>
__device__ __forceinline__ float dot(const E *x, const float *y, int64_t n)
{
    float s = 0.0f;
    for (int64_t d = 0; d < n; d++) s += to_f32(x[d]) * y[d];
    return s;
}

template <typename E>
__device__ __forceinline__ float dot16(const E *x, const E *y, int64_t n)
{
    float s = 0.0f;
    for (int64_t d = 0; d < n; d++) s += to_f32(x[d]) * to_f32(y[d]);
    return s;
}

/* One thread per (b, h, i): online softmax over the visible keys. */
template <typename E>
__global__ void exact_forward_kernel(exact_args<E> a, E *o, float *lse)
{
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= a.batch * a.heads * a.seq) return;
    int64_t i = id % a.seq, h = (id / a.seq) % a.heads, b = id / (a.seq * a.heads);
    int64_t kvh = h / (a.heads / a.kv_heads), D = a.head_dim;
    float q[ZT_FLASH_EXACT_MAX_D], acc[ZT_FLASH_EXACT_MAX_D];
    const E *qi = a.q + row_at(a, b, i, h, a.heads);
    for (int64_t d = 0; d < D; d++) {
        q[d] = to_f32(qi[d]) * a.scale;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j <= i; j++) {
        if (!visible(a, b, i, j)) continue;
        float s = dot(a.k + row_at(a, b, j, kvh, a.kv_heads), q, D);
        float m_new = fmaxf(m, s), correction = expf(m - m_new), p = expf(s - m_new);
        const E *vj = a.v + row_at(a, b, j, kvh, a.kv_heads);
        for (int64_t d = 0; d < D; d++) acc[d] = acc[d] * correction + p * to_f32(vj[d]);
        l = l * correction + p;
        m = m_new;
    }
    E *oi = o + row_at(a, b, i, h, a.heads);
    for (int64_t d = 0; d < D; d++) oi[d] = from_f32<E>(acc[d] / l);
    lse[(b * a.heads + h) * a.seq + i] = m + logf(l);
}

/* delta[b, h, i] = sum_d dO * O, as the flash backward's first kernel. */
template <typename E>
__global__ void exact_delta_kernel(exact_args<E> a)
{
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= a.batch * a.heads * a.seq) return;
    int64_t i = id % a.seq, h = (id / a.seq) % a.heads, b = id / (a.seq * a.heads);
    int64_t at = row_at(a, b, i, h, a.heads);
    a.delta[(b * a.heads + h) * a.seq + i] = dot16(a.dout + at, a.o + at, a.head_dim);
}

/* dS_ij = P_ij (dO_i . v_j - delta_i) with P_ij = exp(scale q_i . k_j - lse_i). */
template <typename E>
__device__ __forceinline__ float score_gradient(const exact_args<E> &a, int64_t b, int64_t h, int64_t kvh, int64_t i,
                                                int64_t j, float *p_out)
{
    int64_t D = a.head_dim, bh = (b * a.heads + h) * a.seq + i;
    float s = dot16(a.q + row_at(a, b, i, h, a.heads), a.k + row_at(a, b, j, kvh, a.kv_heads), D) * a.scale;
    float p = expf(s - a.lse[bh]);
    float dp = dot16(a.dout + row_at(a, b, i, h, a.heads), a.v + row_at(a, b, j, kvh, a.kv_heads), D);
    *p_out = p;
    return p * (dp - a.delta[bh]);
}

/* One thread per (b, h, i): dq_i = scale sum_j dS_ij k_j. */
template <typename E>
__global__ void exact_dq_kernel(exact_args<E> a, E *dq)
{
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= a.batch * a.heads * a.seq) return;
    int64_t i = id % a.seq, h = (id / a.seq) % a.heads, b = id / (a.seq * a.heads);
    int64_t kvh = h / (a.heads / a.kv_heads), D = a.head_dim;
    float acc[ZT_FLASH_EXACT_MAX_D];
    for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
    for (int64_t j = 0; j <= i; j++) {
        if (!visible(a, b, i, j)) continue;
        float p, ds = score_gradient(a, b, h, kvh, i, j, &p);
        const E *kj = a.k + row_at(a, b, j, kvh, a.kv_heads);
        for (int64_t d = 0; d < D; d++) acc[d] += ds * to_f32(kj[d]);
    }
    E *out = dq + row_at(a, b, i, h, a.heads);
    for (int64_t d = 0; d < D; d++) out[d] = from_f32<E>(acc[d] * a.scale);
}

/* One thread per (b, kv head, j): dk_j = scale sum_{h in group, i} dS_ij q_i, dv_j = sum P_ij dO_i. */
template <typename E>
__global__ void exact_dkv_kernel(exact_args<E> a, E *dk, E *dv)
{
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= a.batch * a.kv_heads * a.seq) return;
    int64_t j = id % a.seq, kvh = (id / a.seq) % a.kv_heads, b = id / (a.seq * a.kv_heads);
    int64_t group = a.heads / a.kv_heads, D = a.head_dim;
    float acc_k[ZT_FLASH_EXACT_MAX_D], acc_v[ZT_FLASH_EXACT_MAX_D];
    for (int64_t d = 0; d < D; d++) acc_k[d] = acc_v[d] = 0.0f;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
        for (int64_t i = j; i < a.seq; i++) {
            if (!visible(a, b, i, j)) continue;
            float p, ds = score_gradient(a, b, h, kvh, i, j, &p);
            const E *qi = a.q + row_at(a, b, i, h, a.heads), *doi = a.dout + row_at(a, b, i, h, a.heads);
            for (int64_t d = 0; d < D; d++) {
                acc_k[d] += ds * to_f32(qi[d]);
                acc_v[d] += p * to_f32(doi[d]);
            }
        }
    }
    int64_t at = row_at(a, b, j, kvh, a.kv_heads);
    for (int64_t d = 0; d < D; d++) {
        dk[at + d] = from_f32<E>(acc_k[d] * a.scale);
        dv[at + d] = from_f32<E>(acc_v[d]);
    }
}

template <typename E>
static exact_args<E> args_of(const zt_cuda_attention_shape *s, const uint16_t *q, const uint16_t *k,
                             const uint16_t *v, const int32_t *doc_ids)
{
    exact_args<E> a = {};
    a.batch = s->batch;
    a.seq = s->seq;
    a.heads = s->heads;
    a.kv_heads = s->kv_heads;
    a.head_dim = s->head_dim;
    a.scale = s->scale;
    a.q = (const E *)q;
    a.k = (const E *)k;
    a.v = (const E *)v;
    a.doc_ids = doc_ids;
    return a;
}

static unsigned blocks_for(int64_t n) { return (unsigned)((n + THREADS - 1) / THREADS); }

static cudaError_t launched(void) { return cudaGetLastError(); }

template <typename E>
static cudaError_t exact_forward(cudaStream_t stream, const zt_cuda_attention_shape *s, const uint16_t *q,
                                 const uint16_t *k, const uint16_t *v, const int32_t *doc_ids, uint16_t *o, float *lse)
{
    exact_args<E> a = args_of<E>(s, q, k, v, doc_ids);
    int64_t rows = s->batch * s->heads * s->seq;
    if (rows == 0) return cudaSuccess;
    exact_forward_kernel<E><<<blocks_for(rows), THREADS, 0, stream>>>(a, (E *)o, lse);
    return launched();
}

extern "C" cudaError_t zt_flash_exact_forward(cudaStream_t stream, int32_t dtype, const zt_cuda_attention_shape *s,
                                              const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                              const int32_t *doc_ids, uint16_t *o, float *lse)
{
    return dtype == ZT_F16 ? exact_forward<f16>(stream, s, q, k, v, doc_ids, o, lse)
                           : exact_forward<bf16>(stream, s, q, k, v, doc_ids, o, lse);
}

template <typename E>
static cudaError_t exact_backward(cudaStream_t stream, const zt_cuda_attention_shape *s, const uint16_t *q,
                                  const uint16_t *k, const uint16_t *v, const int32_t *doc_ids, const uint16_t *o,
                                  const float *lse, const uint16_t *dout, float *delta, uint16_t *dq, uint16_t *dk,
                                  uint16_t *dv)
{
    exact_args<E> a = args_of<E>(s, q, k, v, doc_ids);
    a.o = (const E *)o;
    a.dout = (const E *)dout;
    a.lse = lse;
    a.delta = delta;
    int64_t rows = s->batch * s->heads * s->seq, kv_rows = s->batch * s->kv_heads * s->seq;
    if (rows == 0) return cudaSuccess;
    exact_delta_kernel<E><<<blocks_for(rows), THREADS, 0, stream>>>(a);
    exact_dq_kernel<E><<<blocks_for(rows), THREADS, 0, stream>>>(a, (E *)dq);
    exact_dkv_kernel<E><<<blocks_for(kv_rows), THREADS, 0, stream>>>(a, (E *)dk, (E *)dv);
    return launched();
}

extern "C" cudaError_t zt_flash_exact_backward(cudaStream_t stream, int32_t dtype, const zt_cuda_attention_shape *s,
                                               const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                               const int32_t *doc_ids, const uint16_t *o, const float *lse,
                                               const uint16_t *dout, float *delta, uint16_t *dq, uint16_t *dk,
                                               uint16_t *dv)
{
    return dtype == ZT_F16 ? exact_backward<f16>(stream, s, q, k, v, doc_ids, o, lse, dout, delta, dq, dk, dv)
                           : exact_backward<bf16>(stream, s, q, k, v, doc_ids, o, lse, dout, delta, dq, dk, dv);
}
