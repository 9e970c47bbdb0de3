/* bf16 CUDA kernels for LLaMA training: the GPU counterpart of kernels/cpu/kernels.h.
 *
 * Every function computes the same mathematical function as its zt_cpu_* namesake (same layouts,
 * same rope, masking, ignore-index and accumulate-vs-overwrite rules), so a plugin can switch device
 * without changing its bookkeeping. What differs is precision (docs/cuda.md has the tolerances):
 *  - Activations and matrix-product inputs are bf16 (uint16_t here, __nv_bfloat16 in the .cu files,
 *    round-to-nearest-even), or IEEE half on a context set to ZT_F16 (fp16.enabled: the same functions,
 *    every "bf16" below then reads "fp16"; flash attention excepted); products accumulate in fp32;
 *    statistics (RMSNorm's rstd, softmax sums, log-sum-exp) are fp32.
 *  - Parameter gradients are fp32 and ACCUMULATED (+=), like the CPU kernels'. Master weights and
 *    AdamW moments are fp32; the optimizer writes the bf16 compute copy the forward reads.
 *  - Forward outputs and activation gradients are OVERWRITTEN.
 *
 * Calling rules:
 *  - All pointers to tensors are device pointers; everything is enqueued on the given stream and
 *    returns without waiting for the device. Nothing synchronizes with the host except
 *    zt_cuda_ctx_create / _create_shared / _destroy and zt_cuda_check_indices.
 *  - A zt_cuda_ctx belongs to one device and may be used by one stream at a time: the kernels that
 *    need temporary memory take it from the context's scratch area in stream order.
 *  - Every function returns ZT_OK or an error code; zt_cuda_last_error() then describes the failure
 *    (what, which argument or CUDA call, and what to do). Shapes and hyper-parameters are checked on
 *    the host. Token ids and targets live on the device and are checked there without a host sync:
 *    an out-of-range one is recorded in the context (its row reads zeros and contributes nothing) and
 *    reported by the next zt_cuda_check_indices.
 */
#ifndef ZT_KERNELS_CUDA_H
#define ZT_KERNELS_CUDA_H

#include <stdint.h>
#include <cuda_runtime_api.h>
#include "zt/zt_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- context ---------------------------------------------------------------------------------- */

typedef struct zt_cuda_ctx zt_cuda_ctx;

/* Binds the calling thread to `device`, creates the cuBLASLt handle and its workspace (32 MiB), and
 * allocates `scratch_bytes` of device scratch (size it with the zt_cuda_*_scratch_bytes queries
 * below; 0 picks 64 MiB). Synchronizes. */
zt_status zt_cuda_ctx_create(int device, uint64_t scratch_bytes, zt_cuda_ctx **out);
/* The same around a cuBLASLt handle (cublasLtHandle_t) and GEMM workspace that the caller owns: the
 * host's, zt_device_ctx.cublaslt / .workspace / .workspace_bytes, which every plugin's context shares
 * (plugins/cuda_plugin.h). The context uses them and never frees them; they must outlive it. Every
 * context sharing one workspace must enqueue its GEMMs on one stream (the host's compute stream), so
 * that no two GEMMs use the workspace at once. The scratch is still the context's own. */
zt_status zt_cuda_ctx_create_shared(int device, uint64_t scratch_bytes, void *cublaslt, void *workspace,
                                    uint64_t workspace_bytes, zt_cuda_ctx **out);
/* Frees the scratch, and the handle and workspace only when the context made them. */
void zt_cuda_ctx_destroy(zt_cuda_ctx *ctx);
uint64_t zt_cuda_ctx_scratch_bytes(const zt_cuda_ctx *ctx);
/* Gives the context a scratch of at least `bytes` (nothing to do when it has that much). The old
 * scratch is not freed before zt_cuda_ctx_destroy: a captured CUDA graph (generate.cuda_graphs)
 * may still read it, and nothing has to wait for kernels in flight. Does not synchronize. */
zt_status zt_cuda_ctx_grow_scratch(zt_cuda_ctx *ctx, uint64_t bytes);

/* The context's 16-bit compute type: ZT_BF16 (the default) or ZT_F16 (IEEE half, fp16.enabled).
 * Every uint16_t* tensor below (activations, GEMM inputs and 16-bit outputs, compute copies) holds
 * that type; the functions named *_bf16 cast/add in it too. Set once, before the first kernel (the
 * model plugin does, from fp16.enabled); GEMM plans are cached per type. */
zt_status zt_cuda_ctx_set_dtype(zt_cuda_ctx *ctx, int32_t dtype);
int32_t zt_cuda_ctx_dtype(const zt_cuda_ctx *ctx); /* ZT_BF16 for NULL */

/* The message of the last failure on the calling thread ("" when none). */
const char *zt_cuda_last_error(void);

/* Waits for `stream`, then reports (and clears) the first out-of-range token id or target recorded
 * since the last call: ZT_ERR_INVALID_ARG naming the kernel, the row and the value. */
zt_status zt_cuda_check_indices(zt_cuda_ctx *ctx, cudaStream_t stream);

/* ---- conversions and element-wise ------------------------------------------------------------- */

void zt_cuda_bf16_from_f32_host(const float *in, uint16_t *out, int64_t n); /* RNE, host side */
void zt_cuda_f32_from_bf16_host(const uint16_t *in, float *out, int64_t n);
void zt_cuda_f16_from_f32_host(const float *in, uint16_t *out, int64_t n); /* RNE, inf past 65504 */
void zt_cuda_f32_from_f16_host(const uint16_t *in, float *out, int64_t n);

zt_status zt_cuda_cast_f32_to_bf16(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n,
                                   const float *in, uint16_t *out);
zt_status zt_cuda_cast_bf16_to_f32(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n,
                                   const uint16_t *in, float *out);
/* y[i] += x[i] in fp32, rounded to bf16 (residual branches). */
zt_status zt_cuda_add_bf16(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n, const uint16_t *x,
                           uint16_t *y);

/* ---- matrix multiplication (cuBLASLt, bf16 inputs, fp32 accumulation) ------------------------- */

/* C[M,N] (+)= op(A)[M,K] * op(B)[K,N], row-major as in zt_cpu_gemm (lda, ldb, ldc are row strides).
 * A and B hold the context's 16-bit type; c_dtype is ZT_F32, or ZT_BF16 / ZT_F16, which both mean
 * the context's 16-bit type (so bf16-era callers work unchanged on an fp16 context). accumulate: 0 overwrites C, 1 adds to it (in fp32 before rounding).
 * Leading dimensions that are multiples of 8 elements, 16-byte aligned pointers and contiguous
 * extents of 16 bytes take cuBLAS's fast tensor-core kernels; other leading dimensions work, slower. */
zt_status zt_cuda_gemm(zt_cuda_ctx *ctx, cudaStream_t stream, int trans_a, int trans_b, int64_t M,
                       int64_t N, int64_t K, const uint16_t *A, int64_t lda, const uint16_t *B,
                       int64_t ldb, void *C, int32_t c_dtype, int64_t ldc, int accumulate);
/* zt_cuda_gemm with the product scaled: C = alpha op(A) op(B) (+ C). alpha is the matmul's own
 * scalar (no extra pass, no effect on the cached plan): LoRA's scaling rides on its thin GEMMs. */
zt_status zt_cuda_gemm_scaled(zt_cuda_ctx *ctx, cudaStream_t stream, int trans_a, int trans_b, int64_t M,
                              int64_t N, int64_t K, float alpha, const uint16_t *A, int64_t lda,
                              const uint16_t *B, int64_t ldb, void *C, int32_t c_dtype, int64_t ldc,
                              int accumulate);
/* cuBLASLt plans (descriptors + heuristic query) made so far by this copy of the library: cached
 * per shape, so a steady training step adds none (ZT_CUDA_PROFILE reports the count). */
uint64_t zt_cuda_gemm_plans_made(void);

/* The linear layer's three products with HF's [out, in] weights, all contiguous:
 * forward  y[M,N]  = x[M,K] w[N,K]^T          (bf16, overwrites)
 * dX       dx[M,K] = dy[M,N] w[N,K]           (bf16, overwrites)
 * dW       dw[N,K] += dy[M,N]^T x[M,K]        (fp32, accumulates) */
zt_status zt_cuda_linear_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M, int64_t N,
                                 int64_t K, const uint16_t *x, const uint16_t *w, uint16_t *y);
zt_status zt_cuda_linear_backward_input(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M,
                                        int64_t N, int64_t K, const uint16_t *dy,
                                        const uint16_t *w, uint16_t *dx);
zt_status zt_cuda_linear_backward_weight(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M,
                                         int64_t N, int64_t K, const uint16_t *dy,
                                         const uint16_t *x, float *dw);

/* ---- RMSNorm ---------------------------------------------------------------------------------- */

/* x, y: [rows, dim] bf16; w: [dim] bf16; rstd: [rows] fp32. dim % 8 == 0. */
zt_status zt_cuda_rmsnorm_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows, int64_t dim,
                                  float eps, const uint16_t *x, const uint16_t *w, uint16_t *y,
                                  float *rstd);
/* dx (bf16) overwrites; dw (fp32) accumulates, summed in a fixed order (deterministic); dw NULL: no
 * weight gradient (a frozen norm). */
uint64_t zt_cuda_rmsnorm_backward_scratch_bytes(int64_t rows, int64_t dim);
zt_status zt_cuda_rmsnorm_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows,
                                   int64_t dim, const uint16_t *x, const uint16_t *w,
                                   const float *rstd, const uint16_t *dy, uint16_t *dx, float *dw);

/* ---- rotary position embedding (HF rotate_half) ----------------------------------------------- */

/* x, y: [tokens, heads, head_dim] bf16 (y may equal x); positions: [tokens] int32; inv_freq:
 * [head_dim/2] fp32 on the device, from zt_cpu_rope_inv_freq. Angles and cos/sin are fp32, computed
 * as the CPU kernel computes them. */
zt_status zt_cuda_rope_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                               int64_t heads, int64_t head_dim, const int32_t *positions,
                               const float *inv_freq, const uint16_t *x, uint16_t *y);
zt_status zt_cuda_rope_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                int64_t heads, int64_t head_dim, const int32_t *positions,
                                const float *inv_freq, const uint16_t *dy, uint16_t *dx);

/* ---- SwiGLU: h = silu(gate) * up -------------------------------------------------------------- */

zt_status zt_cuda_swiglu_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n,
                                 const uint16_t *gate, const uint16_t *up, uint16_t *h);
/* dgate, dup overwrite and may alias gate, up. */
zt_status zt_cuda_swiglu_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n,
                                  const uint16_t *gate, const uint16_t *up, const uint16_t *dh,
                                  uint16_t *dgate, uint16_t *dup);

/* ---- token embedding -------------------------------------------------------------------------- */

/* y[t,:] = table[ids[t],:]; table [vocab, dim] bf16; dim % 8 == 0. */
zt_status zt_cuda_embedding_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                    int64_t vocab, int64_t dim, const int32_t *ids,
                                    const uint16_t *table, uint16_t *y);
/* dtable[ids[t],:] += dy[t,:] in fp32. Deterministic: tokens are sorted by id and every row of
 * dtable is summed by one thread block in token order. */
uint64_t zt_cuda_embedding_backward_scratch_bytes(int64_t tokens, int64_t vocab);
zt_status zt_cuda_embedding_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                     int64_t vocab, int64_t dim, const int32_t *ids,
                                     const uint16_t *dy, float *dtable);
/* Tensor parallel (a vocab-parallel embedding): table holds only the vocabulary's rows
 * [first, first + rows); the forward writes zeros for the tokens of other rows (the ranks' outputs
 * then sum to the lookup), the backward adds only to these rows. Ids outside [0, vocab) are
 * recorded as above. */
zt_status zt_cuda_embedding_forward_rows(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                         int64_t vocab, int64_t first, int64_t rows, int64_t dim,
                                         const int32_t *ids, const uint16_t *table, uint16_t *y);
zt_status zt_cuda_embedding_backward_rows(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                          int64_t vocab, int64_t first, int64_t rows, int64_t dim,
                                          const int32_t *ids, const uint16_t *dy, float *dtable);

/* ---- softmax cross-entropy -------------------------------------------------------------------- */

#define ZT_CUDA_IGNORE_INDEX (-100)

/* On given logits [rows, vocab] fp32, as zt_cpu_cross_entropy: row_loss[rows] (fp32), *loss (one
 * fp64 on the device: the row losses summed in row order, divided by normalizer) and, when dlogits
 * is not NULL, dlogits = dloss (softmax - onehot) / normalizer in bf16 (zero rows for ignored
 * targets). */
zt_status zt_cuda_cross_entropy(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows, int64_t vocab,
                                const float *logits, const int32_t *targets, double normalizer,
                                float dloss, float *row_loss, double *loss, uint16_t *dlogits);

/* The LM head and the loss fused: logits = x[rows,dim] w[vocab,dim]^T, then cross-entropy as
 * above, then dx[rows,dim] = dlogits w (bf16, overwrites) and dw[vocab,dim] += dlogits^T x (fp32,
 * accumulates). Rows go through in chunks: only one chunk's logits (fp32) and dlogits (bf16) exist
 * at a time, in the scratch area; chunk_rows = scratch / (6 ld) bytes with ld = vocab rounded up to
 * a multiple of 8, so more scratch means fewer, larger GEMMs. Any vocab; dim % 8 == 0. The columns
 * of the padded rows past vocab are never computed: the loss and the gradients are those of the
 * true vocabulary. dx and dw may be NULL (evaluation: loss only). */
uint64_t zt_cuda_lm_head_loss_scratch_bytes(int64_t chunk_rows, int64_t vocab);
zt_status zt_cuda_lm_head_loss(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows, int64_t dim,
                               int64_t vocab, const uint16_t *x, const uint16_t *w,
                               const int32_t *targets, double normalizer, float dloss,
                               float *row_loss, double *loss, uint16_t *dx, float *dw);

/* The same, vocab-parallel (Megatron's vocab-parallel cross-entropy, which never gathers the
 * logits): this rank's w holds the vocabulary's rows [first, first + valid) of `vocab` (valid may be
 * 0), and the row statistics are combined over the tensor-parallel group by `reduce`, which the
 * caller provides: it all-reduces n fp32 values of buf in place, ordered on `stream` (the max of
 * each row's logits, then each row's sum of exp(logit - max) and its target's logit, per chunk).
 * row_loss and *loss are the whole vocabulary's on every rank; dx is this rank's share (the caller
 * sums it over the group), dw this rank's rows. */
typedef zt_status (*zt_cuda_group_reduce_fn)(void *user, float *buf, int64_t n, int is_max, cudaStream_t stream);
typedef struct zt_cuda_vocab_split {
    int64_t vocab, first, valid;
    int64_t local; /* rows every rank holds, padding included (>= valid): sizes the chunks alike on all */
    zt_cuda_group_reduce_fn reduce;
    void *user;
} zt_cuda_vocab_split;
uint64_t zt_cuda_lm_head_loss_split_scratch_bytes(int64_t chunk_rows, int64_t local);
zt_status zt_cuda_lm_head_loss_split(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows, int64_t dim,
                                     const zt_cuda_vocab_split *split, const uint16_t *x, const uint16_t *w,
                                     const int32_t *targets, double normalizer, float dloss,
                                     float *row_loss, double *loss, uint16_t *dx, float *dw);

/* ---- optimizer -------------------------------------------------------------------------------- */

/* One parameter tensor as the optimizer sees it: fp32 master weights, fp32 gradient, fp32 moments
 * and the bf16 compute copy the model reads (may be NULL). */
typedef struct zt_cuda_param {
    float *master;
    const float *grad;
    float *exp_avg, *exp_avg_sq;
    uint16_t *compute_copy;
    int64_t n;
} zt_cuda_param;

typedef struct zt_cuda_adamw_params {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step; /* 1 for the first step */
} zt_cuda_adamw_params;

/* torch.optim.AdamW on every tensor, a few launches in all. grad_scale: NULL, or a device float the
 * gradients are multiplied by as they are read (the clipping factor of zt_cuda_clip_coefficient). */
zt_status zt_cuda_adamw_step(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n_params,
                             const zt_cuda_param *params, const zt_cuda_adamw_params *hp,
                             const float *grad_scale);

/* The global L2 norm of n_tensors fp32 tensors (host array of device pointers), reduced on the
 * device in a fixed order (double partial sums), written to *norm (device float). When clip_coef is
 * not NULL it receives min(1, max_norm / (norm + 1e-6)) (torch.nn.utils.clip_grad_norm_), ready for
 * zt_cuda_adamw_step: no host synchronization anywhere. */
uint64_t zt_cuda_global_norm_scratch_bytes(int64_t n_tensors, const int64_t *sizes);
zt_status zt_cuda_global_norm(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n_tensors,
                              const float *const *tensors, const int64_t *sizes, float max_norm,
                              float *norm, float *clip_coef);

/* y[0, n) += x[0, n) in fp32 (the zero plugins add a gradient shard accumulator into this
 * micro-batch's gradients before reducing them). */
zt_status zt_cuda_add_f32(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n, const float *x, float *y);

/* ---- flash attention (bf16 tensor cores, sm_80+) ---------------------------------------------- */

typedef struct zt_cuda_attention_shape {
    int64_t batch, seq;   /* B, T */
    int64_t heads;        /* H query heads */
    int64_t kv_heads;     /* Hkv; H % Hkv == 0; query head h reads kv head h / (H / Hkv) */
    int64_t head_dim;     /* D: 64 or 128 */
    float scale;          /* softmax scale, usually 1/sqrt(D) */
} zt_cuda_attention_shape;

/* Causal attention as zt_cpu_attention_forward: q, o [B,T,H,D] bf16; k, v [B,T,Hkv,D] bf16;
 * doc_ids [B,T] int32 or NULL (packed documents: a query sees only keys of its own document);
 * lse [B,H,T] fp32 (the backward needs it). Tiles that the causal or document mask hides entirely
 * are skipped; repeated K/V heads are never materialized. */
zt_status zt_cuda_flash_attention_forward(zt_cuda_ctx *ctx, cudaStream_t stream,
                                          const zt_cuda_attention_shape *s, const uint16_t *q,
                                          const uint16_t *k, const uint16_t *v,
                                          const int32_t *doc_ids, uint16_t *o, float *lse);
/* dq, dk, dv (bf16) overwrite. o and lse are the forward's outputs. dq is accumulated in fp32 in the
 * scratch area (about B*T*H*D*4 bytes, T rounded up to 64, plus B*H*T*4 for the row sums of dO*O;
 * the Hopper kernel adds fp32 dK/dV partial sums when it splits a GQA group over blocks): size it
 * with zt_cuda_flash_attention_backward_scratch_bytes. */
uint64_t zt_cuda_flash_attention_backward_scratch_bytes(const zt_cuda_attention_shape *s);
zt_status zt_cuda_flash_attention_backward(zt_cuda_ctx *ctx, cudaStream_t stream,
                                           const zt_cuda_attention_shape *s, const uint16_t *q,
                                           const uint16_t *k, const uint16_t *v,
                                           const int32_t *doc_ids, const uint16_t *o,
                                           const float *lse, const uint16_t *dout, uint16_t *dq,
                                           uint16_t *dk, uint16_t *dv);

/* ---- fused q/k/v and gate/up forms (engineer C; docs/cuda.md) -------------------------------- */

/* Rope on q and k of one stacked [tokens, q|k|v] projection output (row stride (heads + 2 kv_heads)
 * head_dim): writes q [tokens, heads, D] and k [tokens, kv_heads, D] rotated and v copied, all
 * contiguous (the attention plugin's layout). The backward is the transpose: the attention's dq, dk,
 * dv (contiguous) into one stacked dqkv, so dX and dW of the three projections are one GEMM each. */
zt_status zt_cuda_rope_qkv_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                   int64_t heads, int64_t kv_heads, int64_t head_dim,
                                   const int32_t *positions, const float *inv_freq,
                                   const uint16_t *qkv, uint16_t *q, uint16_t *k, uint16_t *v);
zt_status zt_cuda_rope_qkv_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                    int64_t heads, int64_t kv_heads, int64_t head_dim,
                                    const int32_t *positions, const float *inv_freq,
                                    const uint16_t *dq, const uint16_t *dk, const uint16_t *dv,
                                    uint16_t *dqkv);

/* SwiGLU on row-strided operands: gate and up are [rows, cols] with row stride ld_in (e.g. the two
 * column blocks of one [rows, 2F] gate|up GEMM output: up = gate + F, ld_in = 2F). cols and every
 * row stride a multiple of 8, pointers 16-byte aligned. In the backward dgate, dup may alias gate,
 * up when ld_out == ld_in. */
zt_status zt_cuda_swiglu_forward_rows(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows,
                                      int64_t cols, const uint16_t *gate, const uint16_t *up,
                                      int64_t ld_in, uint16_t *h, int64_t ld_h);
zt_status zt_cuda_swiglu_backward_rows(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows,
                                       int64_t cols, const uint16_t *gate, const uint16_t *up,
                                       int64_t ld_in, const uint16_t *dh, int64_t ld_dh,
                                       uint16_t *dgate, uint16_t *dup, int64_t ld_out);

/* ---- naive attention (the unfused reference for flash; any head_dim) ------------------------- */

/* The same function as zt_cuda_flash_attention_forward / _backward, computed the straightforward
 * way: per batch element fp32 scores [H, T, T] (cuBLAS SGEMM on fp32 copies of the inputs, no
 * TF32), a masked row softmax, O = P V; the backward recomputes P from lse. Only the inputs and
 * outputs are bf16. Memory: the caller's workspace (sized by the *_workspace_bytes queries: fp32
 * copies of q, k, v (and o or the gradients) plus one or two [H, T, T] fp32 score buffers) and
 * cuBLAS's own small per-stream workspace. The handle owns a cuBLAS handle for one device. */
typedef struct zt_cuda_naive_attention zt_cuda_naive_attention;
zt_status zt_cuda_naive_attention_create(int device, zt_cuda_naive_attention **out);
/* The 16-bit type of q, k, v, o and the gradients: ZT_BF16 (default) or ZT_F16. */
zt_status zt_cuda_naive_attention_set_dtype(zt_cuda_naive_attention *na, int32_t dtype);
void zt_cuda_naive_attention_destroy(zt_cuda_naive_attention *na);
uint64_t zt_cuda_naive_attention_forward_workspace_bytes(const zt_cuda_attention_shape *s);
uint64_t zt_cuda_naive_attention_backward_workspace_bytes(const zt_cuda_attention_shape *s);
zt_status zt_cuda_naive_attention_forward(zt_cuda_naive_attention *na, cudaStream_t stream,
                                          const zt_cuda_attention_shape *s, const uint16_t *q,
                                          const uint16_t *k, const uint16_t *v,
                                          const int32_t *doc_ids, uint16_t *o, float *lse,
                                          void *workspace, uint64_t workspace_bytes);
zt_status zt_cuda_naive_attention_backward(zt_cuda_naive_attention *na, cudaStream_t stream,
                                           const zt_cuda_attention_shape *s, const uint16_t *q,
                                           const uint16_t *k, const uint16_t *v,
                                           const int32_t *doc_ids, const uint16_t *o,
                                           const float *lse, const uint16_t *dout, uint16_t *dq,
                                           uint16_t *dk, uint16_t *dv, void *workspace,
                                           uint64_t workspace_bytes);

/* y[M,N] = residual[M,N] + x[M,K] w[N,K]^T: the residual add as the GEMM epilogue (cuBLASLt
 * beta = 1 with C = residual), summed in fp32 and rounded to bf16 once. y may equal residual. */
zt_status zt_cuda_linear_forward_residual(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M,
                                          int64_t N, int64_t K, const uint16_t *x,
                                          const uint16_t *w, const uint16_t *residual, uint16_t *y);

/* RMSNorm backward with the residual branch's gradient added: dx = RMSNorm'(dy) + dres, summed in
 * fp32 and rounded once (saves the separate add). dx may alias dres; dw as zt_cuda_rmsnorm_backward. */
zt_status zt_cuda_rmsnorm_backward_add(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows,
                                       int64_t dim, const uint16_t *x, const uint16_t *w,
                                       const float *rstd, const uint16_t *dy,
                                       const uint16_t *dres, uint16_t *dx, float *dw);

/* ---- LoRA dropout (lora_dropout.cu) ------------------------------------------------------------ */

/* The CPU path's mask (plugins/llama/layers.c): out[c] = the hash chain from starts[c] (host values) over
 * the tokens' ids and positions (device arrays), one chain per linear, at most ZT_LORA_DROPOUT_CHAINS;
 * out is device memory. */
#define ZT_LORA_DROPOUT_CHAINS 8
zt_status zt_cuda_lora_dropout_hash(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens, const int32_t *ids,
                                    const int32_t *positions, int n_chains, const uint64_t *starts,
                                    uint64_t *out);
/* dst[e] (+)= keep(e) ? src[e] / (1 - p) : 0 over n contiguous 16-bit elements, with the mask of the
 * chain value *hash (device); dst may equal src when not accumulating. */
zt_status zt_cuda_lora_dropout(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n, const uint16_t *src,
                               uint16_t *dst, const uint64_t *hash, float p, int accumulate);

/* ---- decode attention over a paged KV cache, and sampling (generation; docs/kernels.md) -------- */

/* A paged (or contiguous: one block per sequence) KV cache on the device, in the context's 16-bit type,
 * head-major blocks: [blocks][n_kv_heads][block_size][head_dim] (one kv head's tokens of a block are one
 * contiguous run, which the decode kernel's thread blocks, one per kv head, stream; the CPU's zt_kv_pages
 * is token-major). Everything that changes per
 * decode step (block tables, lengths) is in device memory, so a captured CUDA graph replays with new
 * values. block_size: any value >= 1 (16 is the paged plugin's default); head_dim: 64 or 128. */
typedef struct zt_cuda_kv_pages {
    uint16_t *k, *v;
    int32_t block_size, n_kv_heads, head_dim;
    const int32_t *block_tables; /* device [n_seqs][table_stride] */
    int32_t table_stride;        /* max blocks per sequence: the split-K plan is fixed by it */
    const int32_t *lengths;      /* device [n_seqs]: tokens committed before the new ones */
} zt_cuda_kv_pages;

/* k_new, v_new [n_seqs, n_new, n_kv_heads, head_dim] -> positions lengths[s] .. lengths[s]+n_new-1 of
 * each sequence, through its block table (the blocks must already be reserved: a position past
 * table_stride*block_size is not written). lengths is not advanced: the caller does that. */
zt_status zt_cuda_kv_write(zt_cuda_ctx *ctx, cudaStream_t stream, const zt_cuda_kv_pages *p,
                           int32_t n_seqs, int32_t n_new, const uint16_t *k_new, const uint16_t *v_new);

/* q, out [n_seqs, n_new, n_heads, head_dim] (the context's 16-bit type); the new tokens' K/V already
 * written; new token i of sequence s attends to 0 .. lengths[s]+i (causal), grouped-query heads read
 * their kv head in place (n_heads % n_kv_heads == 0; one thread block serves the query heads of one kv
 * head). Exact softmax (running max and sum in fp32), the same function as zt_cpu_attention_decode.
 * Long contexts are split over the sequence and merged: the split count and the launch shape depend
 * only on (n_seqs, n_new, n_heads, table_stride, block_size), never on the lengths, so a captured
 * graph replays for any lengths; the partial results live in the context's scratch area (size it
 * with zt_cuda_attention_decode_scratch_bytes). */
zt_status zt_cuda_attention_decode(zt_cuda_ctx *ctx, cudaStream_t stream, const zt_cuda_kv_pages *p,
                                   int32_t n_seqs, int32_t n_new, int32_t n_heads, float scale,
                                   const uint16_t *q, uint16_t *out);
uint64_t zt_cuda_attention_decode_scratch_bytes(int32_t n_seqs, int32_t n_new, int32_t n_heads,
                                                int32_t head_dim, int32_t table_stride, int32_t block_size);

/* Sampling on the device, one row of logits per sequence: greedy (temperature 0: the first maximum),
 * temperature, top-k (0: off; keeps the k most likely, ties to the lower id), then top-p (1: off;
 * the most likely tokens until their mass reaches top_p), with the uniform number u in [0, 1) of each
 * row drawn by the host's per-record RNG, so the token equals the CPU sampler's
 * (framework/generate/sampler.c) for the same u: probabilities in fp64, the draw walks the kept tokens
 * in id order. The fields are doubles because the CPU sampler's are. logits: fp32 (the llama head
 * writes fp32 logits when asked for ZT_F32); -INFINITY excludes a token. Only the first n_draw ids of
 * each row (1 <= n_draw <= vocab; the tokenizer's vocabulary when the model's is padded) can be drawn.
 * A row whose drawable logits hold a NaN or +inf gets token -1 (broken weights: the caller says so, as
 * the CPU path does). Ranking rule (as the CPU sampler's): by logit value, -0 tying with +0, ties to
 * the lower id. */
typedef struct zt_cuda_sample_row { double temperature, top_p, u; int32_t top_k; } zt_cuda_sample_row;
zt_status zt_cuda_sample(zt_cuda_ctx *ctx, cudaStream_t stream, const float *logits /* [n][vocab] */,
                         int32_t n, int32_t vocab, int32_t n_draw, const zt_cuda_sample_row *rows /* device */,
                         int32_t *tokens /* device [n] */);
/* The context scratch zt_cuda_sample uses (its per-row sort buffers). */
uint64_t zt_cuda_sample_scratch_bytes(int32_t n, int32_t vocab);

#ifdef __cplusplus
}
#endif

#endif
