/* Sampling on the device (zt_cuda_sample): the CPU sampler's rules (framework/generate/sampler.c) on
 * one thread block per row, so the host never waits for logits.
 *
 * The rule both follow: tokens rank by logit value (a float comparison: -0 equals +0), ties to the
 * lower id. The CPU sampler sorts the vocabulary for top-p; here no sort is needed. Tokens are ordered
 * by a 32-bit key that is monotone in the logit's value (-0 takes +0's key: as raw bits they would
 * rank apart, and a cut inside the tie group at 0 would then keep other tokens than the CPU's), and the
 * cut of top-k (the k-th token) and of top-p (the first token at which the kept mass reaches top_p) is
 * found by building the cut key bit by bit from the top, one block-wide count or mass per bit (radix
 * select). Within the tie group at the cut, the lowest ids are taken, as the sort's order would.
 * Each thread owns a contiguous range of ids, so a scan over thread totals gives id-order prefix sums:
 * the draw walks the kept tokens in id order and returns the first whose cumulative probability
 * exceeds u, as the CPU does. Probabilities are fp64 like the CPU's; they may differ in the last bits
 * only (summation order, and CUDA's fp64 exp within 1 ulp of glibc's), which changes a token only when
 * u or the top-p mass lies within those bits of a boundary (about 1e-15 a draw; tests/cuda/test_decode.c
 * counts such rows apart).
 */
#include <math.h>

#include "cuda/common.cuh"

namespace {

constexpr int SAMPLE_THREADS = 1024;

__device__ __forceinline__ uint32_t order_key(float x)
{
    uint32_t bits = x == 0.0f ? 0u : __float_as_uint(x); /* -0 ties with +0, as in a float comparison */
    return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

/* Block-wide sum of a double; every thread gets the result (fixed order: deterministic). */
__device__ double block_sum(double x, double *shared)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    __syncthreads();
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < SAMPLE_THREADS / 32 ? shared[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Exclusive prefix sum over threads in thread order; *total gets the sum of all. */
__device__ double block_exclusive_scan(double x, double *shared, double *total)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double incl = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        double y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    __syncthreads();
    if (lane == 31) shared[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        double wi = lane < SAMPLE_THREADS / 32 ? shared[lane] : 0.0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            double y = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += y;
        }
        double before = __shfl_up_sync(0xffffffffu, wi, 1); /* exclusive prefix of the warp totals */
        shared[32 + lane] = lane ? before : 0.0;
        if (lane == 31) shared[64] = wi;
    }
    __syncthreads();
    double excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.0;
    *total = shared[64];
    return shared[32 + warp] + excl;
}

/* The first maximum: the lower id wins ties (the CPU's strict > scan). */
__device__ int32_t block_argmax(float v, int32_t id, float *sv, int32_t *si)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        int32_t i2 = __shfl_xor_sync(0xffffffffu, id, o);
        if (v2 > v || (v2 == v && i2 < id)) {
            v = v2;
            id = i2;
        }
    }
    __syncthreads();
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = id;
    }
    __syncthreads();
    v = lane < SAMPLE_THREADS / 32 ? sv[lane] : -INFINITY;
    id = lane < SAMPLE_THREADS / 32 ? si[lane] : INT32_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        int32_t i2 = __shfl_xor_sync(0xffffffffu, id, o);
        if (v2 > v || (v2 == v && i2 < id)) {
            v = v2;
            id = i2;
        }
    }
    return id;
}

/* The largest key c such that the live tokens with key >= c weigh at least `need` (weight: 1 each
 * when prob is NULL, else their probability). */
__device__ uint32_t cut_key(const float *logits, const double *prob, int32_t lo, int32_t hi, double need,
                            double *shared)
{
    uint32_t cut = 0;
    for (int bit = 31; bit >= 0; bit--) {
        uint32_t cand = cut | (1u << bit);
        double mine = 0;
        for (int32_t i = lo; i < hi; i++) {
            double w = prob ? prob[i] : 1.0;
            if (w > 0 && order_key(logits[i]) >= cand) mine += w;
        }
        if (block_sum(mine, shared) >= need) cut = cand;
    }
    return cut;
}

/* Keeps (prob unchanged) the live tokens with key > cut and the first `take` live ones with key ==
 * cut in id order; zeroes the others. */
__device__ void keep_to_cut(const float *logits, double *prob, int32_t lo, int32_t hi, uint32_t cut, int64_t take,
                            double *shared)
{
    double mine = 0, total;
    for (int32_t i = lo; i < hi; i++)
        if (prob[i] > 0 && order_key(logits[i]) == cut) mine += 1;
    double rank = block_exclusive_scan(mine, shared, &total);
    for (int32_t i = lo; i < hi; i++) {
        if (!(prob[i] > 0)) continue;
        uint32_t key = order_key(logits[i]);
        if (key < cut) prob[i] = 0;
        else if (key == cut && rank++ >= (double)take) prob[i] = 0;
    }
    __syncthreads();
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const float *all_logits, int32_t stride, int32_t vocab, const zt_cuda_sample_row *rows,
                  double *all_prob, int32_t *tokens)
{
    __shared__ double shared[72];
    __shared__ float sv[32];
    __shared__ int32_t si[32];
    const int row = blockIdx.x;
    /* vocab: the drawable ids (n_draw), stride: the row length of the logits */
    const float *logits = all_logits + (int64_t)row * stride;
    double *prob = all_prob + (int64_t)row * stride;
    const zt_cuda_sample_row r = rows[row];
    const int32_t per = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int32_t lo = min(vocab, (int32_t)threadIdx.x * per), hi = min(vocab, lo + per);

    float best = -INFINITY;
    int32_t best_id = INT32_MAX;
    double broken = 0; /* NaN or +inf logits: the weights are broken, the row gets -1 */
    for (int32_t i = lo; i < hi; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY) broken += 1;
        if (best_id == INT32_MAX || logits[i] > best) {
            best = logits[i];
            best_id = i;
        }
    }
    if (block_sum(broken, shared) > 0) { /* the same sum in every thread: all return together */
        if (threadIdx.x == 0) tokens[row] = -1;
        return;
    }
    int32_t top_id = block_argmax(best, best_id, sv, si);
    if (!(r.temperature > 0)) {
        if (threadIdx.x == 0) tokens[row] = top_id;
        return;
    }
    const double top = logits[top_id];

    /* top-k: drop all but the k most likely (on the logits: the order is the same). */
    for (int32_t i = lo; i < hi; i++) prob[i] = logits[i] == -INFINITY ? 0.0 : 1.0;
    __syncthreads();
    if (r.top_k > 0 && r.top_k < vocab) {
        uint32_t cut = cut_key(logits, prob, lo, hi, (double)r.top_k, shared);
        double above = 0;
        for (int32_t i = lo; i < hi; i++)
            if (prob[i] > 0 && order_key(logits[i]) > cut) above += 1;
        above = block_sum(above, shared);
        keep_to_cut(logits, prob, lo, hi, cut, (int64_t)(r.top_k - above), shared);
    }

    /* The distribution, as the CPU's: exp((logit - max) / T), normalized. */
    double sum = 0;
    for (int32_t i = lo; i < hi; i++) {
        prob[i] = prob[i] > 0 ? exp(((double)logits[i] - top) / r.temperature) : 0.0;
        sum += prob[i];
    }
    sum = block_sum(sum, shared);
    for (int32_t i = lo; i < hi; i++) prob[i] /= sum;
    __syncthreads();

    /* top-p: the most likely tokens until their mass reaches top_p, then renormalized. */
    double kept = 1.0;
    if (r.top_p < 1) {
        double top_p = r.top_p > 0 ? r.top_p : 1e-300;
        uint32_t cut = cut_key(logits, prob, lo, hi, top_p, shared);
        __shared__ double tied_prob; /* every tied token has the same probability: any holder writes it */
        if (threadIdx.x == 0) tied_prob = 0;
        __syncthreads();
        double above = 0, tied = 0;
        for (int32_t i = lo; i < hi; i++) {
            if (!(prob[i] > 0)) continue;
            uint32_t key = order_key(logits[i]);
            if (key > cut) above += prob[i];
            else if (key == cut) {
                tied += 1;
                tied_prob = prob[i];
            }
        }
        above = block_sum(above, shared);
        tied = block_sum(tied, shared);
        double p = tied_prob;
        kept = above;
        int64_t take = 0;
        while (kept < top_p && take < (int64_t)tied) { /* the CPU's running sum over the sorted tokens */
            kept += p;
            take++;
        }
        keep_to_cut(logits, prob, lo, hi, cut, take, shared);
        for (int32_t i = lo; i < hi; i++) prob[i] /= kept;
        __syncthreads();
    }

    /* The draw: the first kept token in id order whose cumulative probability exceeds u. */
    double mine = 0, total;
    int32_t last = -1;
    for (int32_t i = lo; i < hi; i++)
        if (prob[i] != 0) {
            mine += prob[i];
            last = i;
        }
    double cumulative = block_exclusive_scan(mine, shared, &total);
    int32_t hit = INT32_MAX;
    for (int32_t i = lo; i < hi; i++) {
        if (prob[i] == 0) continue;
        cumulative += prob[i];
        if (r.u < cumulative) {
            hit = i;
            break;
        }
    }
    /* the lowest hit, else the last token that can be drawn (u beyond the rounded total) */
    __syncthreads();
    if (threadIdx.x == 0) si[0] = INT32_MAX, si[1] = -1;
    __syncthreads();
    if (hit != INT32_MAX) atomicMin(&si[0], hit);
    if (last >= 0) atomicMax(&si[1], last);
    __syncthreads();
    if (threadIdx.x == 0) tokens[row] = si[0] != INT32_MAX ? si[0] : si[1] >= 0 ? si[1] : top_id;
}

} // namespace

extern "C" uint64_t zt_cuda_sample_scratch_bytes(int32_t n, int32_t vocab)
{
    return n > 0 && vocab > 0 ? (uint64_t)n * (uint64_t)vocab * sizeof(double) : 0;
}

extern "C" zt_status zt_cuda_sample(zt_cuda_ctx *ctx, cudaStream_t stream, const float *logits, int32_t n,
                                    int32_t vocab, int32_t n_draw, const zt_cuda_sample_row *rows, int32_t *tokens)
{
    const char *what = "zt_cuda_sample";
    if (n < 1 || vocab < 1)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: %d rows of vocabulary %d: both must be >= 1", what, (int)n,
                            (int)vocab);
    if (n_draw < 1 || n_draw > vocab)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: n_draw %d of vocabulary %d: must be in [1, vocabulary]", what,
                            (int)n_draw, (int)vocab);
    if (!logits || !rows || !tokens)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: logits, rows and tokens must be device pointers", what);
    double *prob = (double *)zt_cuda_scratch(ctx, zt_cuda_sample_scratch_bytes(n, vocab), what);
    if (!prob) return ZT_ERR_OUT_OF_MEMORY;
    sample_kernel<<<(unsigned)n, SAMPLE_THREADS, 0, stream>>>(logits, vocab, n_draw, rows, prob, tokens);
    return zt_cuda_check_launch(what);
}
