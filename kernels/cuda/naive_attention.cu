/* Naive attention on the GPU: the unfused, deliberately simple algorithm that serves as the
 * reference for the flash kernels (docs/cuda.md). Per batch element, scores S = scale Q K^T for
 * every head are fp32 [H, T, T] in the caller's workspace (cuBLAS strided-batched SGEMM on fp32
 * copies of the bf16 inputs, no TF32), one kernel applies the causal and document masks and the row
 * softmax in place, and O = P V is another SGEMM. The backward recomputes P from the saved
 * log-sum-exp (as the CPU path does) rather than keeping [B, H, T, T] between forward and backward.
 * Everything after the bf16 inputs is fp32 until the outputs are rounded to bf16 once, so the only
 * differences to the CPU path are that rounding and the summation order.
 *
 * Grouped-query heads: query head h = g * group + j reads kv head g. The GEMMs loop over j and batch
 * over g with K/V strides of one head, so no repeated K/V tensor is ever built; dK and dV accumulate
 * over j (beta = 1 after the first).
 */
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.cuh"

struct zt_cuda_naive_attention {
    int device;
    cublasHandle_t blas;
    int32_t dtype; /* ZT_BF16 or ZT_F16: the inputs' and outputs' 16-bit type */
};

namespace {

const int kThreads = 256;

/* cuBLAS statuses by name (cublasGetStatusString exists from CUDA 11.4 on). */
zt_status blas_failed(cublasStatus_t st, const char *what)
{
    return zt_cuda_fail(ZT_ERR_DEVICE, "naive attention: cuBLAS %s failed: %s (%d)", what, cublasGetStatusString(st),
                        (int)st);
}

unsigned grid_for(int64_t n)
{
    int64_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > 65535) blocks = 65535; /* grid-stride loops cover the rest */
    return (unsigned)(blocks > 0 ? blocks : 1);
}

template <typename T> __global__ void x16_to_f32(int64_t n, const T *in, float *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = zt_to_f32(in[i]);
}

template <typename T> __global__ void f32_to_x16(int64_t n, const float *in, T *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = zt_from_f32<T>(in[i]);
}

/* Key j is visible to query i: causal, and of the same document when doc (one row of doc_ids) is
 * given. Padding has its own document id (-1), so it too sees only itself and earlier padding. */
__device__ __forceinline__ bool visible(const int32_t *doc, int64_t i, int64_t j)
{
    return j <= i && (!doc || doc[j] == doc[i]);
}

/* Block-wide reductions over kThreads threads; every thread gets the result. */
__device__ float block_max(float x, float *shared)
{
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* shared may still be read by a previous reduction */
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = -INFINITY;
    for (int w = 0; w < kThreads / 32; w++) x = fmaxf(x, shared[w]);
    return x;
}

__device__ float block_sum(float x, float *shared)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = 0.0f;
    for (int w = 0; w < kThreads / 32; w++) x += shared[w]; /* fixed order: deterministic */
    return x;
}

/* One block per score row (h, i) of batch element b: s holds scale q.k for [H, T, T]. forward:
 * P = softmax over the visible keys, written in place, and lse[h, i] = max + log(sum). recompute
 * (backward): P = exp(s - lse[h, i]) on the visible keys from the forward's lse. Hidden keys get 0. */
__global__ void __launch_bounds__(kThreads) masked_softmax(int64_t T, const int32_t *doc, float *s, float *lse,
                                                           int recompute)
{
    __shared__ float shared[kThreads / 32];
    int64_t row = blockIdx.x, i = row % T;
    float *p = s + row * T;
    if (recompute) {
        float l = lse[row];
        for (int64_t j = threadIdx.x; j < T; j += kThreads) p[j] = visible(doc, i, j) ? expf(p[j] - l) : 0.0f;
        return;
    }
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j <= i; j += kThreads)
        if (visible(doc, i, j)) m = fmaxf(m, p[j]);
    m = block_max(m, shared);
    float sum = 0.0f;
    if (m != -INFINITY) /* never false: a query always sees itself; kept so a bug cannot make NaN */
        for (int64_t j = threadIdx.x; j <= i; j += kThreads)
            if (visible(doc, i, j)) sum += expf(p[j] - m);
    sum = block_sum(sum, shared);
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t j = threadIdx.x; j < T; j += kThreads) p[j] = visible(doc, i, j) ? expf(p[j] - m) * inv : 0.0f;
    if (threadIdx.x == 0) lse[row] = sum > 0.0f ? m + logf(sum) : -INFINITY;
}

/* delta[h, i] = sum_d dO[i, h, d] O[i, h, d] for one batch element (o, dout: [T, H, D] bf16). */
template <typename E>
__global__ void row_dot(int64_t T, int64_t H, int64_t D, const E *o, const E *dout, float *delta)
{
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < H * T; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t h = r / T, i = r % T;
        const E *a = o + (i * H + h) * D, *b = dout + (i * H + h) * D;
        float acc = 0.0f;
        for (int64_t d = 0; d < D; d++) acc += zt_to_f32(a[d]) * zt_to_f32(b[d]);
        delta[r] = acc;
    }
}

/* dS = P (dP - delta[row]) in place on dP, [H, T, T]. Hidden keys have P = 0, so dS = 0 there. */
__global__ void softmax_grad(int64_t T, int64_t n, const float *p, const float *delta, float *dp)
{
    for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < n; x += (int64_t)gridDim.x * blockDim.x)
        dp[x] = p[x] * (dp[x] - delta[x / T]);
}

/* Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, strided-batched, fp32: cuBLAS is
 * column-major, so it computes C^T = op(B)^T op(A)^T with the operands swapped. */
zt_status rm_gemm(cublasHandle_t h, const char *what, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb, float beta,
                  float *C, int64_t ldc, int64_t sc, int64_t batch)
{
    cublasStatus_t st = cublasSgemmStridedBatched(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                  (int)N, (int)M, (int)K, &alpha, B, (int)ldb, sb, A, (int)lda, sa,
                                                  &beta, C, (int)ldc, sc, (int)batch);
    return st == CUBLAS_STATUS_SUCCESS ? ZT_OK : blas_failed(st, what);
}

/* Carves 256-byte aligned pieces out of the caller's workspace. */
struct carve {
    char *base;
    uint64_t used;
    float *take(uint64_t floats)
    {
        float *p = base ? (float *)(base + used) : nullptr;
        used += zt_round_up(floats * sizeof(float), 256);
        return p;
    }
};

struct fwd_layout {
    float *q, *k, *v, *o, *s;
};
struct bwd_layout {
    float *q, *k, *v, *dout, *dq, *dk, *dv, *p, *dp, *delta;
};

fwd_layout forward_layout(const zt_cuda_attention_shape *s, void *ws, uint64_t *bytes)
{
    int64_t nq = s->batch * s->seq * s->heads * s->head_dim, nkv = s->batch * s->seq * s->kv_heads * s->head_dim;
    carve c = {(char *)ws, 0};
    fwd_layout l;
    l.q = c.take((uint64_t)nq);
    l.k = c.take((uint64_t)nkv);
    l.v = c.take((uint64_t)nkv);
    l.o = c.take((uint64_t)nq);
    l.s = c.take((uint64_t)(s->heads * s->seq * s->seq)); /* one batch element's scores at a time */
    *bytes = c.used;
    return l;
}

bwd_layout backward_layout(const zt_cuda_attention_shape *s, void *ws, uint64_t *bytes)
{
    int64_t nq = s->batch * s->seq * s->heads * s->head_dim, nkv = s->batch * s->seq * s->kv_heads * s->head_dim;
    uint64_t scores = (uint64_t)(s->heads * s->seq * s->seq);
    carve c = {(char *)ws, 0};
    bwd_layout l;
    l.q = c.take((uint64_t)nq);
    l.k = c.take((uint64_t)nkv);
    l.v = c.take((uint64_t)nkv);
    l.dout = c.take((uint64_t)nq);
    l.dq = c.take((uint64_t)nq);
    l.dk = c.take((uint64_t)nkv);
    l.dv = c.take((uint64_t)nkv);
    l.p = c.take(scores);
    l.dp = c.take(scores);
    l.delta = c.take((uint64_t)(s->heads * s->seq));
    *bytes = c.used;
    return l;
}

zt_status check_shape(const zt_cuda_attention_shape *s, const char *op)
{
    if (!s || s->batch < 1 || s->seq < 1 || s->heads < 1 || s->kv_heads < 1 || s->head_dim < 1 ||
        s->heads % s->kv_heads != 0)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "naive attention %s: batch %lld, seq %lld, heads %lld, kv_heads %lld, head_dim %lld: all "
                            "must be positive and kv_heads must divide heads", op,
                            s ? (long long)s->batch : 0LL, s ? (long long)s->seq : 0LL,
                            s ? (long long)s->heads : 0LL, s ? (long long)s->kv_heads : 0LL,
                            s ? (long long)s->head_dim : 0LL);
    /* cuBLAS takes int sizes and leading dimensions; a batch element's scores must be indexable. */
    if (s->seq > INT32_MAX / 8 || s->heads > INT32_MAX / 8 || s->heads * s->head_dim > INT32_MAX / 8 ||
        s->heads * s->seq > INT32_MAX)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "naive attention %s: seq %lld x heads %lld x head_dim %lld is beyond what the naive "
                            "reference handles (cuBLAS int sizes); use flash attention", op, (long long)s->seq,
                            (long long)s->heads, (long long)s->head_dim);
    return ZT_OK;
}

zt_status check_workspace(const char *op, void *ws, uint64_t have, uint64_t need)
{
    if (!ws || have < need)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "naive attention %s: the workspace is %s (%llu bytes) but this shape needs %llu bytes; "
                            "size it with zt_cuda_naive_attention_%s_workspace_bytes", op, ws ? "too small" : "NULL",
                            (unsigned long long)have, (unsigned long long)need, op);
    return ZT_OK;
}

zt_status cast_in(int32_t dtype, cudaStream_t stream, int64_t n, const uint16_t *in, float *out, const char *what)
{
    ZT_DISPATCH16(dtype, E, x16_to_f32<E><<<grid_for(n), kThreads, 0, stream>>>(n, (const E *)in, out));
    return zt_cuda_check_launch(what);
}

zt_status cast_out(int32_t dtype, cudaStream_t stream, int64_t n, const float *in, uint16_t *out, const char *what)
{
    ZT_DISPATCH16(dtype, E, f32_to_x16<E><<<grid_for(n), kThreads, 0, stream>>>(n, in, (E *)out));
    return zt_cuda_check_launch(what);
}

/* S = scale Q K^T for every head of batch element b into s ([H, T, T]). */
zt_status scores(cublasHandle_t h, const zt_cuda_attention_shape *sh, int64_t b, const float *q, const float *k,
                 float *s)
{
    int64_t T = sh->seq, H = sh->heads, Hkv = sh->kv_heads, D = sh->head_dim, group = H / Hkv;
    zt_status st = ZT_OK;
    for (int64_t j = 0; j < group && st == ZT_OK; j++)
        st = rm_gemm(h, "S = scale Q K^T", 0, 1, T, T, D, sh->scale, q + b * T * H * D + j * D, H * D, group * D,
                     k + b * T * Hkv * D, Hkv * D, D, 0.0f, s + j * T * T, T, group * T * T, Hkv);
    return st;
}

} // namespace

extern "C" zt_status zt_cuda_naive_attention_create(int device, zt_cuda_naive_attention **out)
{
    *out = nullptr;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return zt_cuda_fail(ZT_ERR_DEVICE, "naive attention: cudaSetDevice(%d) failed: %s", device,
                            cudaGetErrorString(e));
    zt_cuda_naive_attention *na = (zt_cuda_naive_attention *)calloc(1, sizeof *na);
    if (!na) return zt_cuda_fail(ZT_ERR_OUT_OF_MEMORY, "naive attention: out of host memory for its context");
    na->device = device;
    na->dtype = ZT_BF16;
    cublasStatus_t st = cublasCreate(&na->blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(na);
        return blas_failed(st, "handle creation (cublasCreate)");
    }
    /* A reference computes in true fp32: no TF32 tensor cores, whatever NVIDIA_TF32_OVERRIDE says. */
    st = cublasSetMathMode(na->blas, CUBLAS_PEDANTIC_MATH);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(na->blas);
        free(na);
        return blas_failed(st, "cublasSetMathMode(CUBLAS_PEDANTIC_MATH)");
    }
    *out = na;
    return ZT_OK;
}

extern "C" zt_status zt_cuda_naive_attention_set_dtype(zt_cuda_naive_attention *na, int32_t dtype)
{
    if (dtype != ZT_BF16 && dtype != ZT_F16)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED, "naive attention: dtype %d is not ZT_BF16 or ZT_F16", (int)dtype);
    na->dtype = dtype;
    return ZT_OK;
}

extern "C" void zt_cuda_naive_attention_destroy(zt_cuda_naive_attention *na)
{
    if (!na) return;
    cublasDestroy(na->blas);
    free(na);
}

extern "C" uint64_t zt_cuda_naive_attention_forward_workspace_bytes(const zt_cuda_attention_shape *s)
{
    uint64_t bytes = 0;
    forward_layout(s, nullptr, &bytes);
    return bytes;
}

extern "C" uint64_t zt_cuda_naive_attention_backward_workspace_bytes(const zt_cuda_attention_shape *s)
{
    uint64_t bytes = 0;
    backward_layout(s, nullptr, &bytes);
    return bytes;
}

extern "C" zt_status zt_cuda_naive_attention_forward(zt_cuda_naive_attention *na, cudaStream_t stream,
                                                     const zt_cuda_attention_shape *sh, const uint16_t *q,
                                                     const uint16_t *k, const uint16_t *v, const int32_t *doc_ids,
                                                     uint16_t *o, float *lse, void *workspace,
                                                     uint64_t workspace_bytes)
{
    zt_status st = check_shape(sh, "forward");
    if (st != ZT_OK) return st;
    uint64_t need = 0;
    fwd_layout l = forward_layout(sh, workspace, &need);
    if ((st = check_workspace("forward", workspace, workspace_bytes, need)) != ZT_OK) return st;
    cublasStatus_t bs = cublasSetStream(na->blas, stream);
    if (bs != CUBLAS_STATUS_SUCCESS) return blas_failed(bs, "cublasSetStream");
    int64_t B = sh->batch, T = sh->seq, H = sh->heads, Hkv = sh->kv_heads, D = sh->head_dim, group = H / Hkv;
    int64_t nq = B * T * H * D, nkv = B * T * Hkv * D;
    if ((st = cast_in(na->dtype, stream, nq, q, l.q, "naive attention forward: q to fp32")) != ZT_OK ||
        (st = cast_in(na->dtype, stream, nkv, k, l.k, "naive attention forward: k to fp32")) != ZT_OK ||
        (st = cast_in(na->dtype, stream, nkv, v, l.v, "naive attention forward: v to fp32")) != ZT_OK)
        return st;
    for (int64_t b = 0; b < B; b++) {
        if ((st = scores(na->blas, sh, b, l.q, l.k, l.s)) != ZT_OK) return st;
        masked_softmax<<<(unsigned)(H * T), kThreads, 0, stream>>>(T, doc_ids ? doc_ids + b * T : nullptr, l.s,
                                                                    lse + b * H * T, 0);
        if ((st = zt_cuda_check_launch("naive attention forward: masked softmax")) != ZT_OK) return st;
        for (int64_t j = 0; j < group && st == ZT_OK; j++) /* O_h = P_h V_g */
            st = rm_gemm(na->blas, "O = P V", 0, 0, T, D, T, 1.0f, l.s + j * T * T, T, group * T * T,
                         l.v + b * T * Hkv * D, Hkv * D, D, 0.0f, l.o + b * T * H * D + j * D, H * D, group * D, Hkv);
        if (st != ZT_OK) return st;
    }
    return cast_out(na->dtype, stream, nq, l.o, o, "naive attention forward: out to 16 bits");
}

extern "C" zt_status zt_cuda_naive_attention_backward(zt_cuda_naive_attention *na, cudaStream_t stream,
                                                      const zt_cuda_attention_shape *sh, const uint16_t *q,
                                                      const uint16_t *k, const uint16_t *v, const int32_t *doc_ids,
                                                      const uint16_t *o, const float *lse, const uint16_t *dout,
                                                      uint16_t *dq, uint16_t *dk, uint16_t *dv, void *workspace,
                                                      uint64_t workspace_bytes)
{
    zt_status st = check_shape(sh, "backward");
    if (st != ZT_OK) return st;
    uint64_t need = 0;
    bwd_layout l = backward_layout(sh, workspace, &need);
    if ((st = check_workspace("backward", workspace, workspace_bytes, need)) != ZT_OK) return st;
    cublasStatus_t bs = cublasSetStream(na->blas, stream);
    if (bs != CUBLAS_STATUS_SUCCESS) return blas_failed(bs, "cublasSetStream");
    cublasHandle_t h = na->blas;
    int64_t B = sh->batch, T = sh->seq, H = sh->heads, Hkv = sh->kv_heads, D = sh->head_dim, group = H / Hkv;
    int64_t nq = B * T * H * D, nkv = B * T * Hkv * D;
    if ((st = cast_in(na->dtype, stream, nq, q, l.q, "naive attention backward: q to fp32")) != ZT_OK ||
        (st = cast_in(na->dtype, stream, nkv, k, l.k, "naive attention backward: k to fp32")) != ZT_OK ||
        (st = cast_in(na->dtype, stream, nkv, v, l.v, "naive attention backward: v to fp32")) != ZT_OK ||
        (st = cast_in(na->dtype, stream, nq, dout, l.dout, "naive attention backward: dout to fp32")) != ZT_OK)
        return st;
    for (int64_t b = 0; b < B; b++) {
        const float *qb = l.q + b * T * H * D, *kb = l.k + b * T * Hkv * D, *vb = l.v + b * T * Hkv * D;
        const float *dob = l.dout + b * T * H * D;
        float *dqb = l.dq + b * T * H * D, *dkb = l.dk + b * T * Hkv * D, *dvb = l.dv + b * T * Hkv * D;
        const int32_t *doc = doc_ids ? doc_ids + b * T : nullptr;
        /* P again, from the forward's log-sum-exp. */
        if ((st = scores(h, sh, b, l.q, l.k, l.p)) != ZT_OK) return st;
        masked_softmax<<<(unsigned)(H * T), kThreads, 0, stream>>>(T, doc, l.p, (float *)(lse + b * H * T), 1);
        if ((st = zt_cuda_check_launch("naive attention backward: recomputing P")) != ZT_OK) return st;
        for (int64_t j = 0; j < group && st == ZT_OK; j++) {
            float acc = j ? 1.0f : 0.0f; /* dV_g and dK_g sum over the group's query heads */
            const float *pj = l.p + j * T * T;
            float *dpj = l.dp + j * T * T;
            st = rm_gemm(h, "dV = P^T dO", 1, 0, T, D, T, 1.0f, pj, T, group * T * T, dob + j * D, H * D, group * D,
                         acc, dvb, Hkv * D, D, Hkv);
            if (st == ZT_OK)
                st = rm_gemm(h, "dP = dO V^T", 0, 1, T, T, D, 1.0f, dob + j * D, H * D, group * D, vb, Hkv * D, D,
                             0.0f, dpj, T, group * T * T, Hkv);
        }
        if (st != ZT_OK) return st;
        ZT_DISPATCH16(na->dtype, E,
        row_dot<E><<<grid_for(H * T), kThreads, 0, stream>>>(T, H, D, (const E *)o + b * T * H * D,
                                                          (const E *)dout + b * T * H * D, l.delta));
        if ((st = zt_cuda_check_launch("naive attention backward: rowsum(dO * O)")) != ZT_OK) return st;
        softmax_grad<<<grid_for(H * T * T), kThreads, 0, stream>>>(T, H * T * T, l.p, l.delta, l.dp);
        if ((st = zt_cuda_check_launch("naive attention backward: dS = P (dP - delta)")) != ZT_OK) return st;
        for (int64_t j = 0; j < group && st == ZT_OK; j++) {
            float acc = j ? 1.0f : 0.0f;
            const float *dsj = l.dp + j * T * T;
            st = rm_gemm(h, "dQ = scale dS K", 0, 0, T, D, T, sh->scale, dsj, T, group * T * T, kb, Hkv * D, D, 0.0f,
                         dqb + j * D, H * D, group * D, Hkv);
            if (st == ZT_OK)
                st = rm_gemm(h, "dK = scale dS^T Q", 1, 0, T, D, T, sh->scale, dsj, T, group * T * T, qb + j * D,
                             H * D, group * D, acc, dkb, Hkv * D, D, Hkv);
        }
        if (st != ZT_OK) return st;
    }
    if ((st = cast_out(na->dtype, stream, nq, l.dq, dq, "naive attention backward: dq to 16 bits")) != ZT_OK ||
        (st = cast_out(na->dtype, stream, nkv, l.dk, dk, "naive attention backward: dk to 16 bits")) != ZT_OK)
        return st;
    return cast_out(na->dtype, stream, nkv, l.dv, dv, "naive attention backward: dv to 16 bits");
}
