/* Softmax cross-entropy over the vocabulary, and the LM head fused with it.
 *
 * Per row with target c:  loss = lse - x_c,  lse = m + log(sum exp(x - m)),  m = max x;
 * dlogits = dloss / normalizer * (softmax(x) - onehot(c)), written in the context's 16-bit type (it
 * feeds two GEMMs). With fp16 loss scaling dloss is the loss scale S, so the whole backward carries S.
 * One block per row: a first pass keeps a running max and rescaled sum per thread (an online
 * softmax, so the row is read once for both), a second pass writes the gradient.
 *
 * The fused LM head never holds the logits of the whole batch: rows go through in chunks sized to
 * the scratch area; for each chunk, logits = x w^T (fp32), the row losses and dlogits (bf16), then
 * dx = dlogits w and dw += dlogits^T x. The total loss is summed over rows at the end, in row order.
 *
 * Any vocabulary size (32001 after adding a pad token, 49953, ...): the chunk's logits and dlogits
 * rows are ld = vocab rounded up to 8 elements apart (16-byte rows, which cuBLAS needs for its fast
 * tensor-core kernels), and the columns past vocab are never written nor read: the softmax, the
 * loss and the gradient see exactly the true vocabulary. cuBLAS also wants the extent along each
 * matrix's contiguous dimension to be a multiple of 16 bytes, which the vocabulary is for the three
 * products here, so a vocabulary that is not a multiple of 8 splits each product: its body, the
 * first vocab / 8 * 8 rows of w, on the fast path, and its tail (at most 7 rows) as a second, tiny
 * GEMM. The weight w stays [vocab, dim] as the caller holds it: no padded copy exists.
 */
#include <math.h>
#include "cuda/common.cuh"

enum { CE_THREADS = 512, LOSS_THREADS = 1024 };

/* Merges (max, sum of exp(x - max)) pairs across the block; every thread gets the result. */
__device__ void block_softmax_stats(float *m, float *s, float *shared_m, float *shared_s)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other_m = __shfl_xor_sync(0xffffffffu, *m, offset);
        float other_s = __shfl_xor_sync(0xffffffffu, *s, offset);
        float new_m = fmaxf(*m, other_m);
        /* a side with max -inf has sum 0 and contributes nothing (avoids exp(-inf - -inf)) */
        float mine = *m == -INFINITY ? 0.0f : *s * expf(*m - new_m);
        float theirs = other_m == -INFINITY ? 0.0f : other_s * expf(other_m - new_m);
        *m = new_m;
        *s = mine + theirs;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    if (lane == 0) {
        shared_m[warp] = *m;
        shared_s[warp] = *s;
    }
    __syncthreads();
    float m_all = -INFINITY;
    for (int w = 0; w < warps; w++) m_all = fmaxf(m_all, shared_m[w]);
    float s_all = 0.0f;
    for (int w = 0; w < warps; w++)
        if (shared_m[w] != -INFINITY) s_all += shared_s[w] * expf(shared_m[w] - m_all);
    *m = m_all;
    *s = s_all;
}

/* Row `blockIdx.x` of logits: row_loss and (when dlogits) the gradient. grad_scale = dloss / N.
 * Rows of logits and dlogits are ld >= vocab elements apart; columns vocab .. ld are not touched. */
template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
cross_entropy_rows_kernel(int64_t vocab, int64_t ld, const float *logits, const int32_t *targets,
                          int64_t first_row, float grad_scale, float *row_loss, T *dlogits,
                          unsigned long long *bad)
{
    __shared__ float shared_m[32], shared_s[32];
    int64_t row = blockIdx.x;
    const float *x = logits + row * ld;
    T *dx = dlogits ? dlogits + row * ld : NULL;
    int32_t target = targets[row];
    int ignored = target == ZT_CUDA_IGNORE_INDEX;
    if (!ignored && (target < 0 || target >= vocab)) {
        if (threadIdx.x == 0) zt_record_bad_index(bad, first_row + row, target);
        ignored = 1;
    }
    if (ignored) {
        if (threadIdx.x == 0) row_loss[row] = 0.0f;
        if (dx)
            for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) dx[c] = zt_from_f32<T>(0.0f);
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
        float v = x[c];
        if (v > m) {
            s = s * expf(m - v) + 1.0f; /* exp(-inf) = 0 on the first element */
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    block_softmax_stats(&m, &s, shared_m, shared_s);
    if (threadIdx.x == 0) row_loss[row] = m + logf(s) - x[target];
    if (!dx) return;
    float scale = grad_scale / s;
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
        float d = expf(x[c] - m) * scale;
        if (c == target) d -= grad_scale;
        dx[c] = zt_from_f32<T>(d); /* fp16: a loss scale too large overflows here, to inf */
    }
}

/* *loss = sum(row_loss) / normalizer in double; thread i sums rows i, i + blockDim, ... and the
 * per-thread sums are combined in a fixed tree: deterministic. */
__global__ void __launch_bounds__(LOSS_THREADS)
total_loss_kernel(int64_t rows, const float *row_loss, double normalizer, double *loss)
{
    __shared__ double partial[LOSS_THREADS];
    double sum = 0.0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum += row_loss[r];
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int width = blockDim.x / 2; width > 0; width /= 2) {
        if ((int)threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
        __syncthreads();
    }
    if (threadIdx.x == 0) *loss = partial[0] / normalizer;
}

static zt_status check_loss_args(const char *what, int64_t rows, int64_t vocab, double normalizer)
{
    if (rows < 0 || vocab <= 0 || rows > INT32_MAX)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: rows %lld and vocab %lld must be positive",
                            what, (long long)rows, (long long)vocab);
    if (!(normalizer > 0.0))
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s: normalizer %g must be positive (the number of non-ignored targets "
                            "in the global batch)", what, normalizer);
    return ZT_OK;
}

static zt_status launch_rows(cudaStream_t stream, int64_t rows, int64_t vocab, int64_t ld,
                             const float *logits, const int32_t *targets, int64_t first_row,
                             float grad_scale, float *row_loss, uint16_t *dlogits, zt_cuda_ctx *ctx)
{
    ZT_DISPATCH16(ctx->dtype, T,
                  cross_entropy_rows_kernel<T><<<(unsigned)rows, CE_THREADS, 0, stream>>>(
                      vocab, ld, logits, targets, first_row, grad_scale, row_loss, (T *)dlogits,
                      ctx->index_errors + ZT_INDEX_CROSS_ENTROPY));
    return zt_cuda_check_launch("cross-entropy");
}

static zt_status launch_total(cudaStream_t stream, int64_t rows, const float *row_loss,
                              double normalizer, double *loss)
{
    total_loss_kernel<<<1, LOSS_THREADS, 0, stream>>>(rows, row_loss, normalizer, loss);
    return zt_cuda_check_launch("cross-entropy (total loss)");
}

zt_status zt_cuda_cross_entropy(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows, int64_t vocab,
                                const float *logits, const int32_t *targets, double normalizer,
                                float dloss, float *row_loss, double *loss, uint16_t *dlogits)
{
    zt_status st = check_loss_args("cross-entropy", rows, vocab, normalizer);
    if (st != ZT_OK) return st;
    if (rows > 0) {
        st = launch_rows(stream, rows, vocab, vocab, logits, targets, 0, (float)(dloss / normalizer),
                         row_loss, dlogits, ctx);
        if (st != ZT_OK) return st;
    }
    return launch_total(stream, rows, row_loss, normalizer, loss);
}

/* The row stride of the chunk's logits and dlogits: the vocabulary rounded up to 8 elements. */
static int64_t logits_ld(int64_t vocab) { return (vocab + 7) / 8 * 8; }

/* fp32 logits then bf16 dlogits of one chunk, each 256-byte aligned. */
static uint64_t chunk_bytes(int64_t chunk_rows, int64_t vocab)
{
    uint64_t ld = (uint64_t)logits_ld(vocab);
    return zt_round_up((uint64_t)chunk_rows * ld * 4, 256) +
           zt_round_up((uint64_t)chunk_rows * ld * 2, 256);
}

/* A chunk's logits[n, 0:rows] (fp32, row stride ld) = x[n, dim] w[0:rows, dim]^T: the body, the
 * first rows / 8 * 8 rows of w, on the fast path, the tail (at most 7 rows) as a second GEMM. */
static zt_status chunk_logits(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n, int64_t dim, int64_t rows,
                              const uint16_t *x, const uint16_t *w, float *logits, int64_t ld)
{
    int64_t body = rows / 8 * 8, tail = rows - body;
    zt_status st = zt_cuda_gemm(ctx, stream, 0, 1, n, body, dim, x, dim, w, dim, logits, ZT_F32, ld, 0);
    if (st == ZT_OK && tail)
        st = zt_cuda_gemm(ctx, stream, 0, 1, n, tail, dim, x, dim, w + body * dim, dim, logits + body, ZT_F32, ld, 0);
    return st;
}

/* From the chunk's dlogits[n, 0:rows] (row stride ld): dx[n, dim] = dlogits w (overwrites) and
 * dw[0:rows, dim] += dlogits^T x (fp32); either may be NULL. dx sums over the rows: the tail's small
 * share first (rounded to bf16 at its own magnitude), then the body added to it in fp32 and rounded
 * once, as one GEMM rounds. */
static zt_status chunk_grads(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n, int64_t dim, int64_t rows,
                             const uint16_t *dlogits, int64_t ld, const uint16_t *x, const uint16_t *w,
                             uint16_t *dx, float *dw)
{
    int64_t body = rows / 8 * 8, tail = rows - body;
    const uint16_t *w_tail = w + body * dim;
    zt_status st = ZT_OK;
    if (dx && tail)
        st = zt_cuda_gemm(ctx, stream, 0, 0, n, dim, tail, dlogits + body, ld, w_tail, dim, dx, ZT_BF16, dim, 0);
    if (st == ZT_OK && dx)
        st = zt_cuda_gemm(ctx, stream, 0, 0, n, dim, body, dlogits, ld, w, dim, dx, ZT_BF16, dim, tail ? 1 : 0);
    if (st == ZT_OK && dw)
        st = zt_cuda_gemm(ctx, stream, 1, 0, body, dim, n, dlogits, ld, x, dim, dw, ZT_F32, dim, 1);
    if (st == ZT_OK && dw && tail)
        st = zt_cuda_gemm(ctx, stream, 1, 0, tail, dim, n, dlogits + body, ld, x, dim, dw + body * dim, ZT_F32, dim,
                          1);
    return st;
}

uint64_t zt_cuda_lm_head_loss_scratch_bytes(int64_t chunk_rows, int64_t vocab)
{
    return chunk_bytes(chunk_rows, vocab);
}

zt_status zt_cuda_lm_head_loss(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows, int64_t dim,
                               int64_t vocab, const uint16_t *x, const uint16_t *w,
                               const int32_t *targets, double normalizer, float dloss,
                               float *row_loss, double *loss, uint16_t *dx, float *dw)
{
    zt_status st = check_loss_args("LM head loss", rows, vocab, normalizer);
    if (st != ZT_OK) return st;
    if (dim <= 0 || dim % 8 != 0)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "LM head loss: dim %lld must be a positive multiple of 8 (tensor core "
                            "GEMMs need 16-byte aligned rows of x and w)", (long long)dim);
    int64_t chunk = rows;
    while (chunk > 1 && chunk_bytes(chunk, vocab) > ctx->scratch_bytes) chunk = (chunk + 1) / 2;
    char *scratch = (char *)zt_cuda_scratch(ctx, chunk_bytes(rows > 0 ? chunk : 0, vocab),
                                            "LM head loss (one row of logits)");
    if (!scratch) return ZT_ERR_BUFFER_TOO_SMALL;
    int64_t ld = logits_ld(vocab);
    float *logits = (float *)scratch;
    uint16_t *dlogits = (uint16_t *)(scratch + zt_round_up((uint64_t)chunk * ld * 4, 256));
    int need_grad = dx || dw;
    float grad_scale = (float)(dloss / normalizer);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        const uint16_t *xc = x + r0 * dim;
        st = chunk_logits(ctx, stream, n, dim, vocab, xc, w, logits, ld);
        if (st == ZT_OK)
            st = launch_rows(stream, n, vocab, ld, logits, targets + r0, r0, grad_scale,
                             row_loss + r0, need_grad ? dlogits : NULL, ctx);
        if (st == ZT_OK) st = chunk_grads(ctx, stream, n, dim, vocab, dlogits, ld, xc, w, dx ? dx + r0 * dim : NULL, dw);
        if (st != ZT_OK) return st;
    }
    return launch_total(stream, rows, row_loss, normalizer, loss);
}

/* ---- vocab-parallel: the LM head of one tensor-parallel rank ------------------------------------ */

/* The chunk's logits, dlogits and three row statistics (max, sum of exp, target logit). */
static uint64_t split_chunk_bytes(int64_t chunk_rows, int64_t local)
{
    return chunk_bytes(chunk_rows, local) + zt_round_up((uint64_t)chunk_rows * 3 * 4, 256);
}

uint64_t zt_cuda_lm_head_loss_split_scratch_bytes(int64_t chunk_rows, int64_t local)
{
    return split_chunk_bytes(chunk_rows, local);
}

/* Row `blockIdx.x`: the max of this rank's `valid` logits (-inf when it has none) and the target's
 * logit when this rank holds it (else 0). Targets outside the whole vocabulary are recorded. */
__global__ void __launch_bounds__(CE_THREADS)
split_max_kernel(int64_t valid, int64_t ld, const float *logits, const int32_t *targets, int64_t vocab,
                 int64_t first, int64_t first_row, float *stat_max, float *stat_target, unsigned long long *bad)
{
    __shared__ float shared[32];
    int64_t row = blockIdx.x;
    const float *x = logits + row * ld;
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < valid; c += blockDim.x) m = fmaxf(m, x[c]);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 0; w < (int)(blockDim.x / 32); w++) m = fmaxf(m, shared[w]);
    stat_max[row] = m;
    int32_t target = targets[row];
    if (target != ZT_CUDA_IGNORE_INDEX && (target < 0 || target >= vocab)) zt_record_bad_index(bad, first_row + row, target);
    int64_t local = (int64_t)target - first;
    stat_target[row] = target != ZT_CUDA_IGNORE_INDEX && local >= 0 && local < valid ? x[local] : 0.0f;
}

/* Row `blockIdx.x`: the sum of exp(logit - max) over this rank's logits, max the group's. */
__global__ void __launch_bounds__(CE_THREADS)
split_sum_kernel(int64_t valid, int64_t ld, const float *logits, const float *stat_max, float *stat_sum)
{
    __shared__ float shared[32];
    int64_t row = blockIdx.x;
    const float *x = logits + row * ld;
    float m = stat_max[row], s = 0.0f;
    for (int64_t c = threadIdx.x; c < valid; c += blockDim.x) s += expf(x[c] - m);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x != 0) return;
    s = 0.0f;
    for (int w = 0; w < (int)(blockDim.x / 32); w++) s += shared[w];
    stat_sum[row] = s;
}

/* Row `blockIdx.x`: its loss from the group's statistics and, when dlogits, this rank's columns of
 * the gradient. */
template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
split_finish_kernel(int64_t valid, int64_t ld, const float *logits, const int32_t *targets, int64_t vocab,
                    int64_t first, float grad_scale, const float *stat_max, const float *stat_sum,
                    const float *stat_target, float *row_loss, T *dlogits)
{
    int64_t row = blockIdx.x;
    const float *x = logits + row * ld;
    T *dx = dlogits ? dlogits + row * ld : NULL;
    int32_t target = targets[row];
    int ignored = target == ZT_CUDA_IGNORE_INDEX || target < 0 || target >= vocab;
    float m = stat_max[row], s = stat_sum[row];
    if (threadIdx.x == 0) row_loss[row] = ignored ? 0.0f : m + logf(s) - stat_target[row];
    if (!dx) return;
    int64_t local = ignored ? -1 : (int64_t)target - first;
    float scale = grad_scale / s;
    for (int64_t c = threadIdx.x; c < valid; c += blockDim.x) {
        float d = ignored ? 0.0f : expf(x[c] - m) * scale;
        if (c == local) d -= grad_scale;
        dx[c] = zt_from_f32<T>(d);
    }
}

zt_status zt_cuda_lm_head_loss_split(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t rows, int64_t dim,
                                     const zt_cuda_vocab_split *split, const uint16_t *x, const uint16_t *w,
                                     const int32_t *targets, double normalizer, float dloss,
                                     float *row_loss, double *loss, uint16_t *dx, float *dw)
{
    zt_status st = check_loss_args("vocab-parallel LM head loss", rows, split->vocab, normalizer);
    if (st != ZT_OK) return st;
    int64_t valid = split->valid, local = split->local;
    if (dim <= 0 || dim % 8 != 0 || valid < 0 || local < valid || split->first < 0 ||
        split->first + valid > split->vocab || !split->reduce)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "vocab-parallel LM head loss: dim %lld (a positive multiple of 8), rows %lld..%lld of "
                            "%lld held as %lld, or the reduce callback are not valid", (long long)dim,
                            (long long)split->first, (long long)(split->first + valid), (long long)split->vocab,
                            (long long)local);
    /* the chunk from `local`, the same on every rank: each chunk is one round of reductions */
    int64_t chunk = rows;
    while (chunk > 1 && split_chunk_bytes(chunk, local) > ctx->scratch_bytes) chunk = (chunk + 1) / 2;
    char *scratch = (char *)zt_cuda_scratch(ctx, split_chunk_bytes(rows > 0 ? chunk : 0, local),
                                            "vocab-parallel LM head loss");
    if (!scratch) return ZT_ERR_BUFFER_TOO_SMALL;
    int64_t ld = logits_ld(local);
    float *logits = (float *)scratch;
    uint16_t *dlogits = (uint16_t *)(scratch + zt_round_up((uint64_t)chunk * ld * 4, 256));
    float *stats = (float *)(scratch + chunk_bytes(chunk, local));
    int need_grad = dx || dw;
    float grad_scale = (float)(dloss / normalizer);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        const uint16_t *xc = x + r0 * dim;
        float *stat_max = stats, *stat_sum = stats + n, *stat_target = stats + 2 * n;
        if ((st = chunk_logits(ctx, stream, n, dim, valid, xc, w, logits, ld)) != ZT_OK) return st;
        split_max_kernel<<<(unsigned)n, CE_THREADS, 0, stream>>>(valid, ld, logits, targets + r0, split->vocab,
                                                                 split->first, r0, stat_max, stat_target,
                                                                 ctx->index_errors + ZT_INDEX_CROSS_ENTROPY);
        if ((st = zt_cuda_check_launch("vocab-parallel cross-entropy (row maxima)")) != ZT_OK) return st;
        if ((st = split->reduce(split->user, stat_max, n, 1, stream)) != ZT_OK) return st;
        split_sum_kernel<<<(unsigned)n, CE_THREADS, 0, stream>>>(valid, ld, logits, stat_max, stat_sum);
        if ((st = zt_cuda_check_launch("vocab-parallel cross-entropy (sums)")) != ZT_OK) return st;
        if ((st = split->reduce(split->user, stat_sum, 2 * n, 0, stream)) != ZT_OK) return st; /* sum, target */
        ZT_DISPATCH16(ctx->dtype, T,
                      split_finish_kernel<T><<<(unsigned)n, CE_THREADS, 0, stream>>>(
                          valid, ld, logits, targets + r0, split->vocab, split->first, grad_scale, stat_max,
                          stat_sum, stat_target, row_loss + r0, need_grad ? (T *)dlogits : NULL));
        if ((st = zt_cuda_check_launch("vocab-parallel cross-entropy")) != ZT_OK) return st;
        /* dx = dlogits w over this rank's rows (a share of the sum; zeros when it holds none: a GEMM
         * with K = 0 writes zeros), dw its rows */
        st = chunk_grads(ctx, stream, n, dim, valid, dlogits, ld, xc, w, dx ? dx + r0 * dim : NULL, dw);
        if (st != ZT_OK) return st;
    }
    return launch_total(stream, rows, row_loss, normalizer, loss);
}
