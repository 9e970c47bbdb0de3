/* Exact causal attention with grouped KV heads and an optional packed-document mask, computed in
 * tiles of 8 queries x 8 keys (FlashAttention's structure, sized for CPU vector registers).
 *
 * The 8 queries of a tile are the 8 lanes of a vector: their q rows (and, in the backward, their
 * dO rows) are transposed once per query block into qt[d][lane], so a score tile is 8 vectors
 * s[key] = sum_d k[key][d] * qt[d] built from broadcasts and FMAs, with no horizontal sums; the
 * softmax, the mask and the backward's dS are then lane-wise vector operations too, including exp
 * (zt_v8_exp). Products with a row operand (P V, dS K, P^T dO, dS^T Q) are row updates
 * dst += sum coef * row, vectorized over the head dimension.
 *
 * Forward: per query block, keys in tiles of 8 with an online softmax (running max m and sum l per
 * lane; the output rows are rescaled by exp(m_old - m_new)), so no T x T score matrix is stored.
 * The row's log-sum-exp lse = m + log(l) is saved for the backward.
 *
 * Backward, with P_ij = exp(scale q_i.k_j - lse_i) recomputed from lse and D_i = dO_i . O_i:
 *   dV_j += P_ij dO_i;  dS_ij = P_ij (dO_i . V_j - D_i) scale;  dQ_i += dS_ij K_j;  dK_j += dS_ij Q_i.
 * A task owns one (batch, kv head) pair: it writes that head's dK, dV and the dQ of every query head
 * sharing it, so nothing is written by two threads, and every sum runs in an order fixed by the
 * shape alone (heads, then query blocks, then lanes), whatever the thread count.
 */
#include <math.h>
#include "cpu/kernels.h"
#include "cpu/simd.h"

enum {
    TILE = 8,       /* queries per block = lanes of a zt_v8; keys per tile */
    PACK_DIM = 128  /* head-dimension slice transposed at once: qt is 4 KiB (LLaMA's D <= 128) */
};

typedef struct attention_job {
    const zt_attention_shape *s;
    const float *q, *k, *v, *o, *lse_in, *dout;
    const int32_t *doc_ids;
    float *o_out, *lse_out, *dq, *dk, *dv;
} attention_job;

/* Query blocks are visited in the order 0, n-1, 1, n-2, ...: with causal masking block i costs
 * about i + 1 key tiles, so any contiguous run of items (what one thread receives) has about the
 * same total cost. */
static int64_t balanced_block(int64_t item, int64_t n_blocks)
{
    int64_t pair = item / 2;
    return item % 2 == 0 ? pair : n_blocks - 1 - pair;
}

/* t[d][lane] = rows[lane][d0 + d] for d < n_d; lanes >= n_rows are 0. */
ZT_CPU_INLINE void pack_transposed(const float *const rows[TILE], int64_t n_rows, int64_t d0,
                                   int64_t n_d, float *restrict t)
{
    for (int64_t d = 0; d < n_d; d++)
        for (int64_t lane = 0; lane < TILE; lane++)
            t[d * TILE + lane] = lane < n_rows ? rows[lane][d0 + d] : 0.0f;
}

/* acc[key] += sum over d < n_d of rows[key][d0 + d] * t[d][:] for the 8 keys of a tile. */
ZT_CPU_INLINE void tile_dots(const float *const rows[TILE], int64_t d0, int64_t n_d,
                             const float *restrict t, zt_v8 acc[TILE])
{
    zt_v8 a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    zt_v8 a4 = acc[4], a5 = acc[5], a6 = acc[6], a7 = acc[7];
    const float *r0 = rows[0] + d0, *r1 = rows[1] + d0, *r2 = rows[2] + d0, *r3 = rows[3] + d0;
    const float *r4 = rows[4] + d0, *r5 = rows[5] + d0, *r6 = rows[6] + d0, *r7 = rows[7] + d0;
    for (int64_t d = 0; d < n_d; d++) {
        zt_v8 x = zt_v8_load(t + d * TILE);
        a0 += r0[d] * x; a1 += r1[d] * x; a2 += r2[d] * x; a3 += r3[d] * x;
        a4 += r4[d] * x; a5 += r5[d] * x; a6 += r6[d] * x; a7 += r7[d] * x;
    }
    acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3;
    acc[4] = a4; acc[5] = a5; acc[6] = a6; acc[7] = a7;
}

/* The scores of one tile, s[key][lane] = rows[key] . queries[lane], over the whole head dimension.
 * qt holds the first PACK_DIM columns of the queries, transposed; with a longer head the other
 * slices are transposed here, tile by tile. */
ZT_CPU_INLINE void tile_scores(const float *const rows[TILE], const float *const queries[TILE],
                               int64_t n_q, int64_t D, float *restrict qt, zt_v8 s[TILE])
{
    for (int key = 0; key < TILE; key++) s[key] = (zt_v8){0};
    for (int64_t d0 = 0; d0 < D; d0 += PACK_DIM) {
        int64_t n_d = D - d0 < PACK_DIM ? D - d0 : PACK_DIM;
        if (D > PACK_DIM) pack_transposed(queries, n_q, d0, n_d, qt);
        tile_dots(rows, d0, n_d, qt, s);
    }
}

/* dst[0, D) = keep * dst + sum over r < n of coef[r * stride] * src[r][0, D). */
ZT_CPU_INLINE void rows_update(float *restrict dst, float keep, const float *coef, int64_t stride,
                               const float *const *src, int64_t n, int64_t D)
{
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) {
        zt_v8 acc = zt_v8_load(dst + d) * keep;
        for (int64_t r = 0; r < n; r++) acc += coef[r * stride] * zt_v8_load(src[r] + d);
        zt_v8_store(dst + d, acc);
    }
    if (d < D) {
        zt_v8 acc = zt_v8_load_partial(dst + d, D - d) * keep;
        for (int64_t r = 0; r < n; r++) acc += coef[r * stride] * zt_v8_load_partial(src[r] + d, D - d);
        zt_v8_store_partial(dst + d, acc, D - d);
    }
}

ZT_CPU_INLINE zt_v8i splat_int(int32_t x) { return (zt_v8i){x, x, x, x, x, x, x, x}; }

/* Where query lane i0 + lane may see key j: a real query (lane < n_q), causal, same document. */
ZT_CPU_INLINE zt_v8i visible(int64_t i0, int64_t n_q, int64_t j, const int32_t *doc)
{
    const zt_v8i lanes = {0, 1, 2, 3, 4, 5, 6, 7};
    zt_v8i mask = (lanes < splat_int((int32_t)n_q)) & (splat_int((int32_t)(j - i0)) <= lanes);
    if (doc) {
        int32_t q_docs[TILE] = {0};
        memcpy(q_docs, doc + i0, sizeof(int32_t) * (size_t)n_q);
        zt_v8i docs;
        memcpy(&docs, q_docs, sizeof docs);
        mask &= docs == splat_int(doc[j]);
    }
    return mask;
}

/* Offset of the row of the tile's key `key` (token j0 + key) in a [T, Hkv, D] tensor; past the
 * last key the first one stands in (its lanes are masked, and the pointer stays in the tensor). */
ZT_CPU_INLINE int64_t key_offset(int64_t j0, int64_t n_k, int64_t key, int64_t stride)
{
    return (j0 + (key < n_k ? key : 0)) * stride;
}

ZT_CPU_CLONES
static void forward_blocks(void *arg, int64_t begin, int64_t end)
{
    const attention_job *job = arg;
    const zt_attention_shape *s = job->s;
    int64_t T = s->seq, H = s->heads, Hkv = s->kv_heads, D = s->head_dim;
    int64_t group = H / Hkv, n_blocks = (T + TILE - 1) / TILE;
    float qt[PACK_DIM * TILE] __attribute__((aligned(64)));
    float p_tile[TILE][TILE], alpha_lanes[TILE], m_lanes[TILE], l_lanes[TILE];
    for (int64_t item = begin; item < end; item++) {
        int64_t bh = item / n_blocks, b = bh / H, h = bh % H;
        int64_t i0 = balanced_block(item % n_blocks, n_blocks) * TILE;
        int64_t n_q = T - i0 < TILE ? T - i0 : TILE;
        const float *k = job->k + (b * T * Hkv + h / group) * D; /* key j at k + j * Hkv * D */
        const float *v = job->v + (b * T * Hkv + h / group) * D;
        const int32_t *doc = job->doc_ids ? job->doc_ids + b * T : NULL;
        const float *queries[TILE];
        float *outs[TILE];
        for (int64_t lane = 0; lane < TILE; lane++) {
            int64_t row = (b * T + i0 + (lane < n_q ? lane : 0)) * H + h;
            queries[lane] = job->q + row * D;
            outs[lane] = job->o_out + row * D;
        }
        for (int64_t lane = 0; lane < n_q; lane++) memset(outs[lane], 0, sizeof(float) * (size_t)D);
        pack_transposed(queries, n_q, 0, D < PACK_DIM ? D : PACK_DIM, qt);
        zt_v8 m = zt_v8_splat(-INFINITY), l = {0};
        for (int64_t j0 = 0; j0 < i0 + n_q; j0 += TILE) {
            int64_t n_k = i0 + n_q - j0 < TILE ? i0 + n_q - j0 : TILE;
            const float *keys[TILE], *values[TILE];
            for (int64_t key = 0; key < TILE; key++) {
                keys[key] = k + key_offset(j0, n_k, key, Hkv * D);
                values[key] = v + key_offset(j0, n_k, key, Hkv * D);
            }
            zt_v8 scores[TILE];
            zt_v8i seen[TILE];
            tile_scores(keys, queries, n_q, D, qt, scores);
            zt_v8 m_new = m;
            for (int64_t key = 0; key < TILE; key++) {
                seen[key] = key < n_k ? visible(i0, n_q, j0 + key, doc) : splat_int(0);
                scores[key] = zt_v8_select(seen[key], s->scale * scores[key], zt_v8_splat(-INFINITY));
                m_new = zt_v8_select(scores[key] > m_new, scores[key], m_new);
            }
            /* A lane that has seen no key yet keeps m = -inf; shifting by 0 there avoids
             * -inf - -inf (its p are 0 and its l and output stay 0). */
            zt_v8 shift = zt_v8_select(m_new == zt_v8_splat(-INFINITY), zt_v8_splat(0.0f), m_new);
            zt_v8 alpha = zt_v8_exp(m - shift);
            l *= alpha;
            for (int64_t key = 0; key < TILE; key++) {
                zt_v8 p = zt_v8_select(seen[key], zt_v8_exp(scores[key] - shift), zt_v8_splat(0.0f));
                l += p;
                zt_v8_store(p_tile[key], p);
            }
            zt_v8_store(alpha_lanes, alpha);
            for (int64_t lane = 0; lane < n_q; lane++)
                rows_update(outs[lane], alpha_lanes[lane], &p_tile[0][lane], TILE, values, n_k, D);
            m = m_new;
        }
        zt_v8_store(m_lanes, m);
        zt_v8_store(l_lanes, l);
        for (int64_t lane = 0; lane < n_q; lane++) {
            float inv_sum = 1.0f / l_lanes[lane];
            for (int64_t d = 0; d < D; d++) outs[lane][d] *= inv_sum;
            job->lse_out[(b * H + h) * T + i0 + lane] = m_lanes[lane] + logf(l_lanes[lane]);
        }
    }
}

void zt_cpu_attention_forward(const zt_cpu_ctx *ctx, const zt_attention_shape *s, const float *q,
                              const float *k, const float *v, const int32_t *doc_ids, float *o,
                              float *lse)
{
    attention_job job = {.s = s, .q = q, .k = k, .v = v, .doc_ids = doc_ids, .o_out = o,
                         .lse_out = lse};
    int64_t n_blocks = (s->seq + TILE - 1) / TILE;
    zt_cpu_parallel_for(ctx, s->batch * s->heads * n_blocks, 2, forward_blocks, &job);
}

ZT_CPU_CLONES
static void backward_groups(void *arg, int64_t begin, int64_t end)
{
    const attention_job *job = arg;
    const zt_attention_shape *s = job->s;
    int64_t T = s->seq, H = s->heads, Hkv = s->kv_heads, D = s->head_dim;
    int64_t group = H / Hkv;
    float qt[PACK_DIM * TILE] __attribute__((aligned(64)));
    float dot[PACK_DIM * TILE] __attribute__((aligned(64)));
    float p_tile[TILE][TILE], ds_tile[TILE][TILE], lse_lanes[TILE], out_dots[TILE];
    for (int64_t item = begin; item < end; item++) {
        int64_t b = item / Hkv, g = item % Hkv;
        const int32_t *doc = job->doc_ids ? job->doc_ids + b * T : NULL;
        const float *k = job->k + (b * T * Hkv + g) * D, *v = job->v + (b * T * Hkv + g) * D;
        float *dk = job->dk + (b * T * Hkv + g) * D, *dv = job->dv + (b * T * Hkv + g) * D;
        for (int64_t j = 0; j < T; j++) {
            memset(dk + j * Hkv * D, 0, sizeof(float) * (size_t)D);
            memset(dv + j * Hkv * D, 0, sizeof(float) * (size_t)D);
        }
        for (int64_t h = g * group; h < (g + 1) * group; h++) {
            for (int64_t i0 = 0; i0 < T; i0 += TILE) {
                int64_t n_q = T - i0 < TILE ? T - i0 : TILE;
                const float *queries[TILE], *douts[TILE];
                float *dqs[TILE];
                for (int64_t lane = 0; lane < TILE; lane++) {
                    int64_t row = (b * T + i0 + (lane < n_q ? lane : 0)) * H + h;
                    queries[lane] = job->q + row * D;
                    douts[lane] = job->dout + row * D;
                    dqs[lane] = job->dq + row * D;
                    lse_lanes[lane] = lane < n_q ? job->lse_in[(b * H + h) * T + i0 + lane] : 0.0f;
                    out_dots[lane] = lane < n_q ? zt_dot(douts[lane], job->o + row * D, D) : 0.0f; /* D_i */
                }
                for (int64_t lane = 0; lane < n_q; lane++) memset(dqs[lane], 0, sizeof(float) * (size_t)D);
                pack_transposed(queries, n_q, 0, D < PACK_DIM ? D : PACK_DIM, qt);
                pack_transposed(douts, n_q, 0, D < PACK_DIM ? D : PACK_DIM, dot);
                zt_v8 lse = zt_v8_load(lse_lanes), out_dot = zt_v8_load(out_dots);
                for (int64_t j0 = 0; j0 < i0 + n_q; j0 += TILE) {
                    int64_t n_k = i0 + n_q - j0 < TILE ? i0 + n_q - j0 : TILE;
                    const float *keys[TILE], *values[TILE];
                    float *dks[TILE], *dvs[TILE];
                    for (int64_t key = 0; key < TILE; key++) {
                        int64_t offset = key_offset(j0, n_k, key, Hkv * D);
                        keys[key] = k + offset;
                        values[key] = v + offset;
                        dks[key] = dk + offset;
                        dvs[key] = dv + offset;
                    }
                    zt_v8 scores[TILE], dp[TILE];
                    tile_scores(keys, queries, n_q, D, qt, scores);
                    tile_scores(values, douts, n_q, D, dot, dp); /* dP_ij = dO_i . V_j */
                    for (int64_t key = 0; key < TILE; key++) {
                        zt_v8i seen = key < n_k ? visible(i0, n_q, j0 + key, doc) : splat_int(0);
                        zt_v8 p = zt_v8_select(seen, zt_v8_exp(s->scale * scores[key] - lse), zt_v8_splat(0.0f));
                        zt_v8_store(p_tile[key], p);
                        zt_v8_store(ds_tile[key], p * (dp[key] - out_dot) * s->scale);
                    }
                    for (int64_t key = 0; key < n_k; key++) {
                        rows_update(dvs[key], 1.0f, p_tile[key], 1, douts, n_q, D);
                        rows_update(dks[key], 1.0f, ds_tile[key], 1, queries, n_q, D);
                    }
                    for (int64_t lane = 0; lane < n_q; lane++)
                        rows_update(dqs[lane], 1.0f, &ds_tile[0][lane], TILE, keys, n_k, D);
                }
            }
        }
    }
}

void zt_cpu_attention_backward(const zt_cpu_ctx *ctx, const zt_attention_shape *s, const float *q,
                               const float *k, const float *v, const int32_t *doc_ids,
                               const float *o, const float *lse, const float *dout, float *dq,
                               float *dk, float *dv)
{
    attention_job job = {.s = s, .q = q, .k = k, .v = v, .o = o, .lse_in = lse, .dout = dout,
                         .doc_ids = doc_ids, .dq = dq, .dk = dk, .dv = dv};
    zt_cpu_parallel_for(ctx, s->batch * s->kv_heads, 1, backward_groups, &job);
}
