/* Decode attention over a paged KV cache (zt_cuda_attention_decode) and the K/V write into it
 * (zt_cuda_kv_write); the same function as kernels/cpu/attention_decode.c.
 *
 * Decode reads every cached K/V row once per step and does little arithmetic with it, so the kernel
 * is shaped for bandwidth, not tensor cores:
 *  - One thread block per (split, kv head, row tile, sequence). A row tile is up to 8 query rows of
 *    one kv head (the G = heads / kv_heads query heads of the group times the n_new new tokens), so
 *    grouped-query heads read their K/V once, in place, never repeated.
 *  - Inside the block, a group of D/8 threads holds one token's K (then V) row as 16-byte loads
 *    (8 elements a thread); the block's groups walk the split's tokens UNROLL at a time with all
 *    loads issued before any arithmetic, to keep enough bytes in flight. The cache's blocks are
 *    head-major ([kv head][block_size][head_dim]), so the groups' loads within a block are one
 *    contiguous run of block_size * D elements (4 KiB at 16 x 128 bf16), not D-element pieces a
 *    whole token row apart.
 *  - Scores are taken in the log2 domain (q pre-multiplied by scale * log2 e); each group keeps a
 *    running max, sum and fp32 accumulator per row (exact softmax), merged across groups through
 *    shared memory at the end.
 *  - Long contexts are split over the sequence: the split count comes from the shape only
 *    (decode_plan), so the grid of a captured graph fits every later step; a split past a sequence's
 *    length does no work but still writes an empty partial (max -inf, sum 0). One split writes the
 *    output directly; several write fp32 partials to the scratch area and a merge kernel combines them.
 */
#include <math.h>

#include "cuda/common.cuh"

namespace {

constexpr int DECODE_THREADS = 128;
constexpr int MAX_ROWS = 8;          /* query rows per block */
constexpr int UNROLL = 4;            /* tokens in flight per thread group */
constexpr int FILL_BLOCKS = 512;     /* split until the grid has about this many blocks ... */
constexpr int MIN_SPLIT_TOKENS = 64; /* ... but never into splits shorter than this ... */
constexpr int MAX_SPLIT_TOKENS = 1024; /* ... and always when one would be longer than this */
constexpr float LOG2E = 1.4426950408889634f;

struct decode_plan {
    int rows_per_tile, tiles, splits, split_tokens;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

decode_plan make_plan(int32_t n_seqs, int32_t n_new, int32_t n_heads, int32_t n_kv_heads, int32_t table_stride,
                      int32_t block_size)
{
    decode_plan plan;
    int rows = (n_heads / n_kv_heads) * n_new;
    plan.rows_per_tile = rows >= MAX_ROWS ? MAX_ROWS : rows > 4 ? 8 : rows > 2 ? 4 : rows;
    plan.tiles = (int)ceil_div(rows, plan.rows_per_tile);
    int64_t capacity = (int64_t)table_stride * block_size;
    int64_t base = (int64_t)n_seqs * n_kv_heads * plan.tiles;
    int64_t splits = ceil_div(FILL_BLOCKS, base);
    int64_t at_most = ceil_div(capacity, MIN_SPLIT_TOKENS), at_least = ceil_div(capacity, MAX_SPLIT_TOKENS);
    if (splits > at_most) splits = at_most;
    if (splits < at_least) splits = at_least;
    if (splits < 1) splits = 1;
    plan.split_tokens = (int)ceil_div(capacity, splits);
    plan.splits = (int)ceil_div(capacity, plan.split_tokens);
    return plan;
}

struct decode_args {
    const bf16 *k, *v; /* typed bf16 for address arithmetic only; read as T */
    const int32_t *tables, *lengths;
    int32_t block_size, n_kv_heads, table_stride, n_new, n_heads, group, rows, split_tokens, splits;
    int32_t block_shift; /* log2(block_size) when it is a power of two (shifts instead of divisions), else -1 */
    float scale_log2;
    const bf16 *q;
    bf16 *out;       /* splits == 1 */
    float *partial;  /* splits > 1: [n_seqs][n_new][n_heads][splits][D] accumulators */
    float *stats;    /* [n_seqs][n_new][n_heads][splits][2]: running max (log2 domain), sum */
};

/* Row r of a tile: new token i = r / group, query head kvh * group + r % group. */
__device__ __forceinline__ int64_t row_index(const decode_args &a, int s, int kvh, int r)
{
    int i = r / a.group, h = kvh * a.group + r % a.group;
    return ((int64_t)s * a.n_new + i) * a.n_heads + h;
}

template <typename T, int D, int ROWS>
__global__ void __launch_bounds__(DECODE_THREADS) decode_kernel(decode_args a)
{
    constexpr int TPG = D / 8;                    /* threads per token */
    constexpr int GROUPS = DECODE_THREADS / TPG;  /* tokens side by side */
    const int split = blockIdx.x, kvh = blockIdx.y % a.n_kv_heads, tile = blockIdx.y / a.n_kv_heads;
    const int s = blockIdx.z;
    const int lane = threadIdx.x % TPG, grp = threadIdx.x / TPG;
    const int r0 = tile * ROWS;
    const int32_t length = a.lengths[s];
    const int32_t *table = a.tables + (int64_t)s * a.table_stride;

    float q[ROWS][8], acc[ROWS][8], m[ROWS], l[ROWS];
    int visible[ROWS]; /* row r sees positions < visible[r] */
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int row = r0 + r;
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) acc[r][j] = 0.0f;
        if (row < a.rows) {
            zt_load8((const T *)a.q + row_index(a, s, kvh, row) * D + lane * 8, q[r]);
#pragma unroll
            for (int j = 0; j < 8; j++) q[r][j] *= a.scale_log2;
            visible[r] = length + row / a.group + 1;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) q[r][j] = 0.0f;
            visible[r] = 0;
        }
    }
    int last_row = min(a.rows, r0 + ROWS) - 1;
    int32_t begin = split * a.split_tokens;
    int32_t end = min(begin + a.split_tokens, length + last_row / a.group + 1);
    end = min(end, a.table_stride * a.block_size); /* a length past the table reads nothing outside it */
    const int64_t block_elems = (int64_t)a.n_kv_heads * a.block_size * D, head_base = (int64_t)kvh * a.block_size * D;

    for (int32_t t0 = begin; t0 < end; t0 += GROUPS * UNROLL) {
        float kf[UNROLL][8], vf[UNROLL][8];
        int32_t pos[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            pos[u] = t0 + u * GROUPS + grp;
            if (pos[u] < end) {
                int32_t blk = a.block_shift >= 0 ? pos[u] >> a.block_shift : pos[u] / a.block_size;
                int64_t off = (int64_t)__ldg(table + blk) * block_elems + head_base +
                              (int64_t)(pos[u] - blk * a.block_size) * D + lane * 8;
                zt_load8((const T *)a.k + off, kf[u]);
                zt_load8((const T *)a.v + off, vf[u]);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) kf[u][j] = vf[u][j] = 0.0f;
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float score[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) dot = fmaf(q[r][j], kf[u][j], dot);
#pragma unroll
                for (int o = TPG / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                score[u] = pos[u] < visible[r] && pos[u] < end ? dot : -INFINITY;
            }
            float m_new = m[r];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) m_new = fmaxf(m_new, score[u]);
            if (m_new == -INFINITY) continue; /* nothing visible yet for this row */
            float c = exp2f(m[r] - m_new);
            l[r] *= c;
#pragma unroll
            for (int j = 0; j < 8; j++) acc[r][j] *= c;
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                float p = exp2f(score[u] - m_new);
                l[r] += p;
#pragma unroll
                for (int j = 0; j < 8; j++) acc[r][j] = fmaf(p, vf[u][j], acc[r][j]);
            }
            m[r] = m_new;
        }
    }

    /* Merge the groups: every group's (m, l) per row into shared memory, the block's max per row,
     * then each group's accumulator scaled to it and summed over the groups. */
    __shared__ float sm_m[GROUPS][ROWS], sm_l[GROUPS][ROWS];
    __shared__ float sm_acc[GROUPS][ROWS][D];
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            sm_m[grp][r] = m[r];
            sm_l[grp][r] = l[r];
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float mb = -INFINITY;
        for (int g = 0; g < GROUPS; g++) mb = fmaxf(mb, sm_m[g][r]);
        float c = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - mb);
#pragma unroll
        for (int j = 0; j < 8; j++) sm_acc[grp][r][lane * 8 + j] = acc[r][j] * c;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ROWS * D; e += DECODE_THREADS) {
        int r = e / D, d = e % D, row = r0 + r;
        if (row >= a.rows) continue;
        float mb = -INFINITY, lb = 0.0f, sum = 0.0f;
        for (int g = 0; g < GROUPS; g++) mb = fmaxf(mb, sm_m[g][r]);
        for (int g = 0; g < GROUPS; g++) {
            if (sm_m[g][r] != -INFINITY) lb += sm_l[g][r] * exp2f(sm_m[g][r] - mb);
            sum += sm_acc[g][r][d];
        }
        int64_t ri = row_index(a, s, kvh, row);
        if (a.splits == 1) {
            ((T *)a.out)[ri * D + d] = zt_from_f32<T>(sum / lb);
        } else {
            int64_t pi = ri * a.splits + split;
            a.partial[pi * D + d] = sum;
            if (d == 0) {
                a.stats[pi * 2] = mb;
                a.stats[pi * 2 + 1] = lb;
            }
        }
    }
}

/* out row = sum over splits of acc_s 2^(m_s - M) / sum of l_s 2^(m_s - M); one thread per element. */
template <typename T>
__global__ void decode_merge_kernel(const float *partial, const float *stats, int splits, int D, int64_t n_rows,
                                    T *out)
{
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_rows * D) return;
    int64_t row = e / D;
    int d = (int)(e % D);
    const float *st = stats + row * splits * 2;
    float mb = -INFINITY;
    for (int i = 0; i < splits; i++) mb = fmaxf(mb, st[2 * i]);
    float lb = 0.0f, sum = 0.0f;
    for (int i = 0; i < splits; i++) {
        if (st[2 * i] == -INFINITY) continue; /* an empty split */
        float c = exp2f(st[2 * i] - mb);
        lb += st[2 * i + 1] * c;
        sum += partial[(row * splits + i) * D + d] * c;
    }
    out[e] = zt_from_f32<T>(sum / lb);
}

template <typename T>
__global__ void kv_write_kernel(zt_cuda_kv_pages p, int32_t n_seqs, int32_t n_new, const T *k_new,
                                const T *v_new)
{
    const int per_row = p.n_kv_heads * p.head_dim / 8; /* 16-byte vectors per token */
    const int64_t n = (int64_t)n_seqs * n_new * per_row, capacity = (int64_t)p.table_stride * p.block_size;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t token = e / per_row; /* s * n_new + i */
        int vec = (int)(e % per_row);
        int32_t s = (int32_t)(token / n_new), i = (int32_t)(token % n_new);
        int64_t pos = (int64_t)p.lengths[s] + i;
        if (pos < 0 || pos >= capacity) continue;
        int32_t block = p.block_tables[(int64_t)s * p.table_stride + pos / p.block_size];
        if (block < 0) continue;
        /* head-major block: [kv head][block_size][head_dim] */
        int per_head = p.head_dim / 8, h = vec / per_head;
        int64_t dst = (((int64_t)block * p.n_kv_heads + h) * p.block_size + pos % p.block_size) * per_head + vec % per_head;
        int64_t src = token * per_row + vec;
        reinterpret_cast<uint4 *>(p.k)[dst] = reinterpret_cast<const uint4 *>(k_new)[src];
        reinterpret_cast<uint4 *>(p.v)[dst] = reinterpret_cast<const uint4 *>(v_new)[src];
    }
}

zt_status check_pages(const zt_cuda_kv_pages *p, int32_t n_seqs, int32_t n_new, const char *what)
{
    if (!p || !p->k || !p->v || !p->block_tables || !p->lengths)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: the KV pages need k, v, block_tables and lengths (device pointers)",
                            what);
    if (p->head_dim != 64 && p->head_dim != 128)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s: head_dim %d is not supported; the decode kernels take head_dim 64 or 128", what,
                            (int)p->head_dim);
    if (p->block_size < 1 || p->n_kv_heads < 1 || p->table_stride < 1 || n_seqs < 1 || n_new < 1)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s: block_size %d, n_kv_heads %d, table_stride %d, n_seqs %d, n_new %d: all must be >= 1",
                            what, (int)p->block_size, (int)p->n_kv_heads, (int)p->table_stride, (int)n_seqs,
                            (int)n_new);
    if ((int64_t)p->table_stride * p->block_size > INT32_MAX / 2)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: table_stride %d x block_size %d tokens per sequence is too many",
                            what, (int)p->table_stride, (int)p->block_size);
    if (n_seqs > 65535)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: %d sequences in one call; at most 65535", what, (int)n_seqs);
    return ZT_OK;
}

template <typename T, int D>
void launch_decode(const decode_plan &plan, const decode_args &a, int n_kv_heads, int n_seqs, cudaStream_t stream)
{
    dim3 grid((unsigned)plan.splits, (unsigned)(n_kv_heads * plan.tiles), (unsigned)n_seqs);
    switch (plan.rows_per_tile) {
    case 1: decode_kernel<T, D, 1><<<grid, DECODE_THREADS, 0, stream>>>(a); break;
    case 2: decode_kernel<T, D, 2><<<grid, DECODE_THREADS, 0, stream>>>(a); break;
    case 4: decode_kernel<T, D, 4><<<grid, DECODE_THREADS, 0, stream>>>(a); break;
    default: decode_kernel<T, D, 8><<<grid, DECODE_THREADS, 0, stream>>>(a); break;
    }
}

} // namespace

extern "C" uint64_t zt_cuda_attention_decode_scratch_bytes(int32_t n_seqs, int32_t n_new, int32_t n_heads,
                                                           int32_t head_dim, int32_t table_stride,
                                                           int32_t block_size)
{
    /* The widest plan: the split count is largest with one kv head per query head (ratio 1 gives the
     * fewest rows per tile); the partials do not depend on the kv heads otherwise. */
    if (n_seqs < 1 || n_new < 1 || n_heads < 1 || head_dim < 1 || table_stride < 1 || block_size < 1) return 0;
    uint64_t worst = 0;
    for (int32_t kv = 1; kv <= n_heads; kv++) {
        if (n_heads % kv) continue;
        decode_plan plan = make_plan(n_seqs, n_new, n_heads, kv, table_stride, block_size);
        if (plan.splits == 1) continue;
        uint64_t rows = (uint64_t)n_seqs * n_new * n_heads * plan.splits;
        uint64_t bytes = zt_round_up(rows * head_dim * 4, 256) + rows * 2 * 4;
        if (bytes > worst) worst = bytes;
    }
    return worst;
}

extern "C" zt_status zt_cuda_attention_decode(zt_cuda_ctx *ctx, cudaStream_t stream, const zt_cuda_kv_pages *p,
                                              int32_t n_seqs, int32_t n_new, int32_t n_heads, float scale,
                                              const uint16_t *q, uint16_t *out)
{
    const char *what = "zt_cuda_attention_decode";
    zt_status st = check_pages(p, n_seqs, n_new, what);
    if (st != ZT_OK) return st;
    if (!q || !out) return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: q and out must be device pointers", what);
    if (n_heads < 1 || n_heads % p->n_kv_heads)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s: %d query heads over %d kv heads: the query heads must be a positive multiple", what,
                            (int)n_heads, (int)p->n_kv_heads);
    if (!(scale > 0) || !isfinite(scale))
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: softmax scale %g must be positive and finite", what, (double)scale);
    decode_plan plan = make_plan(n_seqs, n_new, n_heads, p->n_kv_heads, p->table_stride, p->block_size);
    if ((int64_t)p->n_kv_heads * plan.tiles > 65535)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: %d kv heads x %d row tiles (n_new %d) is too large a grid", what,
                            (int)p->n_kv_heads, plan.tiles, (int)n_new);
    decode_args a;
    a.k = (const bf16 *)p->k;
    a.v = (const bf16 *)p->v;
    a.tables = p->block_tables;
    a.lengths = p->lengths;
    a.block_size = p->block_size;
    a.block_shift = -1;
    for (int b = 0; b < 31; b++)
        if (p->block_size == (1 << b)) a.block_shift = b;
    a.n_kv_heads = p->n_kv_heads;
    a.table_stride = p->table_stride;
    a.n_new = n_new;
    a.n_heads = n_heads;
    a.group = n_heads / p->n_kv_heads;
    a.rows = a.group * n_new;
    a.split_tokens = plan.split_tokens;
    a.splits = plan.splits;
    a.scale_log2 = scale * LOG2E;
    a.q = (const bf16 *)q;
    a.out = (bf16 *)out;
    a.partial = NULL;
    a.stats = NULL;
    int64_t n_rows = (int64_t)n_seqs * n_new * n_heads;
    if (plan.splits > 1) {
        uint64_t acc_bytes = zt_round_up((uint64_t)n_rows * plan.splits * p->head_dim * 4, 256);
        uint64_t need = acc_bytes + (uint64_t)n_rows * plan.splits * 2 * 4;
        char *scratch = (char *)zt_cuda_scratch(ctx, need, what);
        if (!scratch) return ZT_ERR_OUT_OF_MEMORY;
        a.partial = (float *)scratch;
        a.stats = (float *)(scratch + acc_bytes);
    }
    ZT_DISPATCH16(ctx->dtype, T, {
        if (p->head_dim == 64) launch_decode<T, 64>(plan, a, p->n_kv_heads, n_seqs, stream);
        else launch_decode<T, 128>(plan, a, p->n_kv_heads, n_seqs, stream);
    });
    st = zt_cuda_check_launch(what);
    if (st != ZT_OK || plan.splits == 1) return st;
    int64_t n = n_rows * p->head_dim;
    ZT_DISPATCH16(ctx->dtype, T,
                  decode_merge_kernel<T><<<(unsigned)ceil_div(n, 256), 256, 0, stream>>>(
                      a.partial, a.stats, plan.splits, p->head_dim, n_rows, (T *)out));
    return zt_cuda_check_launch("zt_cuda_attention_decode (merge of the splits)");
}

extern "C" zt_status zt_cuda_kv_write(zt_cuda_ctx *ctx, cudaStream_t stream, const zt_cuda_kv_pages *p,
                                      int32_t n_seqs, int32_t n_new, const uint16_t *k_new, const uint16_t *v_new)
{
    const char *what = "zt_cuda_kv_write";
    zt_status st = check_pages(p, n_seqs, n_new, what);
    if (st != ZT_OK) return st;
    if (!k_new || !v_new) return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: k_new and v_new must be device pointers", what);
    if ((uintptr_t)k_new % 16 || (uintptr_t)v_new % 16 || (uintptr_t)p->k % 16 || (uintptr_t)p->v % 16)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: k_new, v_new and the cache must be 16-byte aligned", what);
    int64_t n = (int64_t)n_seqs * n_new * p->n_kv_heads * p->head_dim / 8;
    ZT_DISPATCH16(ctx->dtype, T,
                  kv_write_kernel<T><<<zt_grid_for(n, 256, ctx), 256, 0, stream>>>(*p, n_seqs, n_new, (const T *)k_new,
                                                                                   (const T *)v_new));
    return zt_cuda_check_launch(what);
}
