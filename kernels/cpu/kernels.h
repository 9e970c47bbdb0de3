/* Portable fp32 CPU kernels for LLaMA training: the numerical core the CPU model plugin calls.
 *
 * Conventions shared by every kernel (docs/kernels.md has the derivations and the measurements):
 *  - fp32, row-major, contiguous; shapes are given as element counts. Integer inputs (token ids,
 *    labels, positions, document ids) are int32.
 *  - Forward outputs and activation gradients are OVERWRITTEN. Parameter gradients (dW of a matmul,
 *    the RMSNorm weight, the embedding table) are ACCUMULATED (+=), so gradient accumulation over
 *    micro-batches needs no extra pass; zero them once per optimizer step.
 *  - Multithreading goes through zt_cpu_ctx.parallel_for, the same signature as the host's
 *    zt_host.parallel_for, so a plugin passes the host's thread pool straight in. A NULL
 *    parallel_for (or a NULL ctx) runs everything serially on the calling thread.
 *  - Work is split so that every output element is written by exactly one range, and every sum is
 *    taken in a fixed order: results do not depend on the number of threads.
 *  - Kernels check only the inputs that would make them read or write out of bounds (token ids,
 *    labels); shapes and hyper-parameters are the caller's to validate. Those kernels return
 *    ZT_ERR_INVALID_ARG and the index of the first offending element.
 */
#ifndef ZT_KERNELS_CPU_H
#define ZT_KERNELS_CPU_H

#include <stdint.h>
#include "zt/zt_host.h"
#include "zt/zt_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zt_cpu_ctx {
    /* Run fn over [0, n) in ranges of at least `grain` items; NULL: serially. */
    void (*parallel_for)(void *pool, int64_t n, int64_t grain, zt_range_fn fn, void *arg);
    void *pool;         /* first argument of parallel_for (the host's ctx) */
    int32_t no_avx512;  /* 0: GEMM picks its AVX-512 kernel on CPUs that have it; 1: it uses the
                           AVX2/baseline kernel anyway (lets tests and benchmarks cover both) */
} zt_cpu_ctx;

/* Calls ctx->parallel_for, or fn(arg, 0, n) when there is none. For the kernels' own use and for
 * callers that want the same serial fallback. */
void zt_cpu_parallel_for(const zt_cpu_ctx *ctx, int64_t n, int64_t grain, zt_range_fn fn,
                         void *arg);

/* ---- matrix multiplication ------------------------------------------------------------------- */

/* C[M,N] (+)= op(A)[M,K] * op(B)[K,N], with op(X) = X or X^T. Leading dimensions are row strides
 * of the matrices as stored (A is [M,lda] when not transposed, [K,lda] when transposed).
 * accumulate: 0 overwrites C, 1 adds to it. K == 0 leaves C (accumulate) or zeroes it.
 * Returns ZT_ERR_OUT_OF_MEMORY if the packing workspace (about 3 MiB) cannot be allocated. */
zt_status zt_cpu_gemm(const zt_cpu_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N,
                      int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                      int64_t ldc, int accumulate);

/* The three products of a linear layer y = x W^T with HF's [out, in] weights, all contiguous:
 * forward   Y[M,N]  = X[M,K] * W[N,K]^T
 * dX        dX[M,K] = dY[M,N] * W[N,K]          (overwrites)
 * dW        dW[N,K] += dY[M,N]^T * X[M,K]       (accumulates) */
zt_status zt_cpu_linear_forward(const zt_cpu_ctx *ctx, int64_t M, int64_t N, int64_t K,
                                const float *x, const float *w, float *y);
zt_status zt_cpu_linear_backward_input(const zt_cpu_ctx *ctx, int64_t M, int64_t N, int64_t K,
                                       const float *dy, const float *w, float *dx);
zt_status zt_cpu_linear_backward_weight(const zt_cpu_ctx *ctx, int64_t M, int64_t N, int64_t K,
                                        const float *dy, const float *x, float *dw);

/* ---- RMSNorm (HF LlamaRMSNorm: y = w * x / sqrt(mean(x^2) + eps)) --------------------------- */

/* x, y: [rows, dim]; w: [dim]; rstd: [rows] receives 1/sqrt(mean(x^2)+eps) for the backward. */
void zt_cpu_rmsnorm_forward(const zt_cpu_ctx *ctx, int64_t rows, int64_t dim, float eps,
                            const float *x, const float *w, float *y, float *rstd);
/* dx = d/dx (overwrites); dw += d/dw (accumulates; NULL: no weight gradient, a frozen norm). x and
 * rstd as given to / returned by forward. */
void zt_cpu_rmsnorm_backward(const zt_cpu_ctx *ctx, int64_t rows, int64_t dim, const float *x,
                             const float *w, const float *rstd, const float *dy, float *dx,
                             float *dw);

/* ---- rotary position embedding (HF rotate_half layout) --------------------------------------- */

typedef enum zt_rope_type {
    ZT_ROPE_DEFAULT = 0,
    ZT_ROPE_LLAMA3 = 1 /* Llama 3.1 frequency scaling */
} zt_rope_type;

typedef struct zt_rope_config {
    int32_t rope_type; /* zt_rope_type */
    int32_t head_dim;  /* even */
    double theta;      /* rope_theta */
    /* ZT_ROPE_LLAMA3 only (HF rope_scaling keys of the same names): */
    double factor;
    double low_freq_factor;
    double high_freq_factor;
    double original_max_position_embeddings;
} zt_rope_config;

/* inv_freq[head_dim/2], computed in fp32 exactly as transformers does, so angles match bit for bit. */
void zt_cpu_rope_inv_freq(const zt_rope_config *cfg, float *inv_freq);

/* x: [tokens, heads, head_dim]; positions: [tokens] (restart per document in packed batches).
 * Rotates pairs (i, i + head_dim/2) by positions[t] * inv_freq[i]. y may equal x (in place). */
void zt_cpu_rope_forward(const zt_cpu_ctx *ctx, int64_t tokens, int64_t heads, int64_t head_dim,
                         const int32_t *positions, const float *inv_freq, const float *x, float *y);
/* The transpose (inverse) rotation: dx from dy. dx may equal dy. */
void zt_cpu_rope_backward(const zt_cpu_ctx *ctx, int64_t tokens, int64_t heads, int64_t head_dim,
                          const int32_t *positions, const float *inv_freq, const float *dy,
                          float *dx);

/* ---- SwiGLU: h = silu(gate) * up -------------------------------------------------------------- */

void zt_cpu_swiglu_forward(const zt_cpu_ctx *ctx, int64_t n, const float *gate, const float *up,
                           float *h);
/* dgate and dup overwrite; either may alias gate / up (each element is read before it is written). */
void zt_cpu_swiglu_backward(const zt_cpu_ctx *ctx, int64_t n, const float *gate, const float *up,
                            const float *dh, float *dgate, float *dup);

/* ---- token embedding -------------------------------------------------------------------------- */

/* y[t,:] = table[ids[t],:]; table [vocab, dim]. An id outside [0, vocab) is ZT_ERR_INVALID_ARG with
 * its position in *bad_index (may be NULL); y is then unspecified. */
zt_status zt_cpu_embedding_forward(const zt_cpu_ctx *ctx, int64_t tokens, int64_t vocab,
                                   int64_t dim, const int32_t *ids, const float *table, float *y,
                                   int64_t *bad_index);
/* dtable[ids[t],:] += dy[t,:] (scatter-add, deterministic). Same id check as the forward. */
zt_status zt_cpu_embedding_backward(const zt_cpu_ctx *ctx, int64_t tokens, int64_t vocab,
                                    int64_t dim, const int32_t *ids, const float *dy,
                                    float *dtable, int64_t *bad_index);

/* ---- attention (naive, exact) ---------------------------------------------------------------- */

typedef struct zt_attention_shape {
    int64_t batch, seq;   /* B, T */
    int64_t heads;        /* H query heads */
    int64_t kv_heads;     /* Hkv; H % Hkv == 0; query head h reads kv head h / (H / Hkv) */
    int64_t head_dim;     /* D */
    float scale;          /* softmax scale, usually 1/sqrt(D) */
} zt_attention_shape;

/* q, o: [B,T,H,D]; k, v: [B,T,Hkv,D]. Query i attends keys j <= i, and when doc_ids ([B,T], may be
 * NULL) is given only those with doc_ids[b,j] == doc_ids[b,i] (packed documents). lse: [B,H,T]
 * receives the log-sum-exp of each query's scaled scores, which the backward needs. */
void zt_cpu_attention_forward(const zt_cpu_ctx *ctx, const zt_attention_shape *s, const float *q,
                              const float *k, const float *v, const int32_t *doc_ids, float *o,
                              float *lse);
/* dq, dk, dv overwrite. o and lse are the forward's outputs. */
void zt_cpu_attention_backward(const zt_cpu_ctx *ctx, const zt_attention_shape *s, const float *q,
                               const float *k, const float *v, const int32_t *doc_ids,
                               const float *o, const float *lse, const float *dout, float *dq,
                               float *dk, float *dv);

/* A KV cache in blocks, one layer of it, as the generation kernels read it in place: token t of a
 * sequence is row block_tables[seq][t / block_size] * block_size + t % block_size of k and v, each
 * row row_stride floats (kv_heads * head_dim) holding the kv heads one after another. The layout of
 * a block, [block_size][kv_heads][head_dim], is what a GPU decode kernel reads too. */
typedef struct zt_kv_pages {
    const float *k, *v;          /* [blocks][block_size][kv_heads][head_dim] */
    int64_t block_size;          /* tokens per block */
    int64_t row_stride;          /* floats per token row: kv_heads * head_dim */
    const int32_t *block_tables; /* [n_seqs][table_stride]: each sequence's blocks in token order */
    int64_t table_stride;
    const int64_t *lengths;      /* [n_seqs]: tokens committed before the new ones */
} zt_kv_pages;

/* q, out: [n_seqs, n_new, H, D]. The new tokens' K/V are already in the blocks, at positions
 * lengths[s] .. lengths[s] + n_new - 1; new token i of sequence s attends to positions
 * 0 .. lengths[s] + i (causal). Exact: the maximum score, then exp-weighted V over the sum, in
 * position order, so the result does not depend on how the tokens are spread over blocks. */
void zt_cpu_attention_decode(const zt_cpu_ctx *ctx, const zt_attention_shape *s, const zt_kv_pages *p,
                             int64_t n_seqs, int64_t n_new, const float *q, float *out);

/* ---- softmax cross-entropy over the vocabulary ----------------------------------------------- */

#define ZT_IGNORE_INDEX (-100)

/* logits: [rows, vocab]; targets: [rows], the class of each row or ZT_IGNORE_INDEX.
 * row_loss[rows] receives -log softmax(logits)[target] (0 for ignored rows) and *loss their sum,
 * taken in double in row order, divided by `normalizer` (the number of non-ignored targets in the
 * whole global batch, so micro-batches and ranks add up to HF's mean).
 * When dlogits is not NULL it receives dloss * d(*loss)/dlogits = dloss * (softmax - onehot) /
 * normalizer (zero rows for ignored targets); dlogits may equal logits (in place).
 * A target outside [0, vocab) other than ZT_IGNORE_INDEX is ZT_ERR_INVALID_ARG (*bad_index: its
 * row); so is a normalizer that is not positive (*bad_index: -1). */
zt_status zt_cpu_cross_entropy(const zt_cpu_ctx *ctx, int64_t rows, int64_t vocab,
                               const float *logits, const int32_t *targets, double normalizer,
                               float dloss, float *row_loss, double *loss, float *dlogits,
                               int64_t *bad_index);

/* ---- optimizer -------------------------------------------------------------------------------- */

typedef struct zt_adamw_params {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step; /* 1 for the first step: bias corrections use it */
} zt_adamw_params;

/* One torch.optim.AdamW step (decoupled weight decay) on n parameters, in place:
 * p *= 1 - lr*wd; m = lerp(m, g, 1-beta1); v = beta2*v + (1-beta2)*g^2;
 * p -= lr/(1-beta1^step) * m / (sqrt(v)/sqrt(1-beta2^step) + eps). */
void zt_cpu_adamw_step(const zt_cpu_ctx *ctx, int64_t n, const zt_adamw_params *hp, float *p,
                       const float *g, float *m, float *v);

/* sqrt of the sum of squares of all elements of n_tensors tensors (tensors[i] has sizes[i]
 * elements), accumulated in double in a fixed order. */
double zt_cpu_global_l2_norm(const zt_cpu_ctx *ctx, int64_t n_tensors, const float *const *tensors,
                             const int64_t *sizes);
/* x[i] *= s (gradient clipping). */
void zt_cpu_scale(const zt_cpu_ctx *ctx, int64_t n, float s, float *x);
/* y[i] += x[i] (residual branches in the backward). */
void zt_cpu_add(const zt_cpu_ctx *ctx, int64_t n, const float *x, float *y);
/* dst[i] = bf16 bits of src[i], rounded to nearest even, NaN kept a quiet NaN: the bits of CUDA's
 * __float2bfloat16_rn (the bf16 compute copies that CPU offload writes for the GPU). */
void zt_cpu_to_bf16(const zt_cpu_ctx *ctx, int64_t n, const float *src, uint16_t *dst);
/* dst[i] = IEEE half bits of src[i]: the bits of CUDA's __float2half_rn (cpu/f16.h; the fp16 compute
 * copies that CPU offload writes for the GPU). */
void zt_cpu_to_f16(const zt_cpu_ctx *ctx, int64_t n, const float *src, uint16_t *dst);

#ifdef __cplusplus
}
#endif

#endif
