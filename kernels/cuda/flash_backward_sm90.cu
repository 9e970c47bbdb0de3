/* Flash attention backward for Hopper (sm_90a): the main kernel of flash_backward.cu on warpgroup
 * MMA (wgmma). flash_backward.cu runs the delta kernel before it and the dQ conversion (and, when a
 * GQA group is split over blocks, the dK/dV sum) after it.
 *
 * A block owns BC = 128 keys of one (batch, kv head) and one split of its group's query heads; each
 * of its 2 warpgroups owns 64 keys and accumulates their dK and dV (fp32) in registers. It walks the
 * query heads of its split and the query tiles (BR = 64 rows) at or after its keys, Q, dO, lse,
 * delta double-buffered with cp.async. The grid is 1-D, heaviest blocks (key tile 0) first, in
 * chunks that share Q/dO through L2 (see the block decoding below).
 * Per tile and warpgroup (keys as the M dimension, so dK and dV need no reduction):
 *   S^T  = K Q^T     wgmma SS m64n64, K and Q K-major in shared memory
 *   dP^T = V dO^T    wgmma SS m64n64 (D = 64: a second group, running while P^T is computed)
 *   P^T = exp2(S^T scale log2e - lse log2e) masked; dS^T = P^T (dP^T - delta)
 *   dV += P^T dO     wgmma RS m64nD, P^T from registers, dO read transposed (MN-major)
 *   dK += dS^T Q     wgmma RS m64nD (issued with dV)
 * dS^T (E) goes to shared memory (128B-swizzled [BC][BR]) for dQ = dS K, read with both operands
 * transposed: D = 128, each warpgroup takes 64 of dQ's columns over all 128 keys; D = 64, each
 * takes its own 64 keys for all columns. The 64 x 64 fp32 result is staged in shared memory and
 * added to the dQ accumulator with one TMA bulk reduce-add (or, ZT_FLASH_BACKWARD_DQ=atomic, with
 * 16-byte atomics from registers); their order varies, so dQ can differ in the last bits between
 * runs; dK, dV are exact. At D = 64 the warpgroups share only the loaded stages and run apart on an
 * mbarrier ring (RING below).
 * Templated on the element type E (bf16, or f16 for fp16.enabled; flash_common.cuh): the wgmma input
 * type and the packing of P^T, dS^T, dK and dV follow it; lse, delta and dQ's accumulator are fp32.
 */
#include <math.h>
#include "cuda/flash_kernel.h"
#include "cuda/flash_wgmma.cuh"
#include "cuda/hopper_async.cuh"

namespace {

constexpr int BC = 128, BR = 64, THREADS = 256;

/* 4 bytes global -> shared (cp.async, L1-cached); src_bytes = 0 writes zeros. */
[[maybe_unused]] __device__ __forceinline__ void cp_async_4(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
/* One arrival on `bar` once all of this thread's earlier cp.async copies have landed (.noinc: the
 * arrival counts against the count the barrier was initialized with). */
[[maybe_unused]] __device__ __forceinline__ void cp_async_mbar_arrive(uint64_t *bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
/* 1 when `pred` is non-zero in any thread of the 128 that meet at named barrier `id`. */
[[maybe_unused]] __device__ __forceinline__ int warpgroup_any(int id, int pred)
{
    int any;
    asm volatile("{\n .reg .pred p, q;\n setp.ne.s32 p, %1, 0;\n bar.red.or.pred q, %2, 128, p;\n"
                 " selp.s32 %0, 1, 0, q;\n}\n"
                 : "=r"(any)
                 : "r"(pred), "r"(id)
                 : "memory");
    return any;
}

template <int D, bool BULK>
struct bwd_sm90_shape {
    static constexpr size_t KV_BYTES = (size_t)BC * D * 2, QT_BYTES = (size_t)BR * D * 2;
    static constexpr size_t DS_BYTES = (size_t)BC * BR * 2;
    /* bulk dQ: per warpgroup 2 fp32 staging tiles of 64 queries x 64 columns */
    static constexpr size_t DQ_BYTES = BULK ? (size_t)2 * 2 * 64 * 64 * 4 : 0;
    /* K, V, Q[2], dO[2], dS^T, dQ staging, then lse, delta, query doc [2][BR] each and 2 ints; 1024
     * bytes of slack for the alignment the swizzled tiles need */
    static constexpr size_t SMEM = 1024 + 2 * KV_BYTES + 4 * QT_BYTES + DS_BYTES + DQ_BYTES + 3 * 2 * BR * 4 + 16 + 32;
};

/* RING (D = 64 with BULK): the two warpgroups run apart instead of meeting at a block barrier per
 * item. The double buffer of Q, dO, lse, delta, query docs becomes a ring of mbarriers: "full[s]"
 * completes when all 256 threads' cp.async copies into stage s landed (cp.async.mbarrier.arrive),
 * "empty[s]" when all 256 threads are done with it; a thread waits for "empty" before loading into
 * a stage again. With D = 64 nothing else is shared between the warpgroups (each computes dQ from
 * its own dS^T rows and keys), so one's softmax can run while the other's products do. */
template <typename E, int D, bool BULK, bool RING>
__global__ void __launch_bounds__(THREADS, 1) flash_backward_sm90_kernel(const flash_params p)
{
    static_assert(!RING || (D == 64 && BULK), "the ring is for head dim 64 with the bulk dQ path");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = bwd_sm90_shape<D, BULK>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    bf16 *sK = reinterpret_cast<bf16 *>(smem);
    bf16 *sV = reinterpret_cast<bf16 *>(smem + S::KV_BYTES);
    bf16 *sQ = reinterpret_cast<bf16 *>(smem + 2 * S::KV_BYTES);                    /* [2][BR * D] */
    bf16 *sdO = reinterpret_cast<bf16 *>(smem + 2 * S::KV_BYTES + 2 * S::QT_BYTES); /* [2][BR * D] */
    bf16 *sdS = reinterpret_cast<bf16 *>(smem + 2 * S::KV_BYTES + 4 * S::QT_BYTES); /* [BC][BR] */
    float *sdQ = reinterpret_cast<float *>(smem + 2 * S::KV_BYTES + 4 * S::QT_BYTES + S::DS_BYTES); /* [2][2 wg][64 * 64] */
    float *sLse = reinterpret_cast<float *>(smem + 2 * S::KV_BYTES + 4 * S::QT_BYTES + S::DS_BYTES + S::DQ_BYTES);
    float *sDelta = sLse + 2 * BR;                                     /* [2][BR] */
    int32_t *sQueryDoc = reinterpret_cast<int32_t *>(sDelta + 2 * BR); /* [2][BR] */
    int *key_doc_range = reinterpret_cast<int *>(sQueryDoc + 2 * BR);  /* min, max */
    uint64_t *ring = reinterpret_cast<uint64_t *>(key_doc_range + 4);  /* full[2], empty[2] (RING) */

    const int T = p.seq, tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    if (RING) {
        if (tid == 0)
            for (int i = 0; i < 4; i++) mbar_init(&ring[i], THREADS);
        mbar_fence_init();
        __syncthreads();
    }
    /* Which work: a 1-D grid over chunks of bwd_chunk units (batch, kv head, split), each chunk's
     * blocks key tile by key tile, tile 0 (the most query tiles at or after it) first. Blocks start
     * in index order, so the heavy blocks start early, the light ones fill the tail, and the blocks
     * running at once share the Q and dO of a few units through L2. */
    const int n_key_tiles = (T + BC - 1) / BC, split = p.bwd_split;
    const int units = p.batch * p.kv_heads * split;
    const int chunk = (int)blockIdx.x / (p.bwd_chunk * n_key_tiles);
    const int in_chunk = (int)blockIdx.x % (p.bwd_chunk * n_key_tiles);
    const int chunk_units = min(p.bwd_chunk, units - chunk * p.bwd_chunk);
    const int key_tile = in_chunk / chunk_units, unit = chunk * p.bwd_chunk + in_chunk % chunk_units;
    const int sp = unit % split, kv_head = unit / split % p.kv_heads, b = unit / split / p.kv_heads;
    const int k0 = key_tile * BC, heads_per_split = p.group / split;
    const int head0 = kv_head * p.group + sp * heads_per_split;
    const int64_t q_stride = (int64_t)p.heads * D, kv_stride = (int64_t)p.kv_heads * D;
    const bf16 *k_base = p.k + ((int64_t)b * T * p.kv_heads + kv_head) * D;
    const bf16 *v_base = p.v + ((int64_t)b * T * p.kv_heads + kv_head) * D;
    const int32_t *doc = p.doc_ids ? p.doc_ids + (int64_t)b * T : nullptr;

    const int wg_key0 = k0 + wg * 64;
    const int key_row = wg * 64 + warp * 16 + g; /* this thread's first key row in the block */
    const int keys[2] = {k0 + key_row, k0 + key_row + 8};
    int key_doc[2] = {0, 0};
    if (doc) {
        key_doc[0] = doc[keys[0] < T ? keys[0] : T - 1];
        key_doc[1] = doc[keys[1] < T ? keys[1] : T - 1];
        if (tid == 0) {
            key_doc_range[0] = INT32_MAX;
            key_doc_range[1] = INT32_MIN;
        }
        __syncthreads();
        if (tid < BC && k0 + tid < T) {
            atomicMin(&key_doc_range[0], doc[k0 + tid]);
            atomicMax(&key_doc_range[1], doc[k0 + tid]);
        }
        __syncthreads();
    }

    /* Work items: (query head of this split of the group, query tile at or after this key tile). */
    const int n_q_tiles = (T + BR - 1) / BR, first_q_tile = k0 / BR;
    const int tiles_per_head = n_q_tiles - first_q_tile;
    const int n_items = heads_per_split * tiles_per_head;
    auto next_item = [&](int item) {
        if (!doc) return item;
        const int doc_min = key_doc_range[0], doc_max = key_doc_range[1];
        for (; item < n_items; item++) {
            if constexpr (RING) { /* each warpgroup finds the same items by itself */
                int q = (first_q_tile + item % tiles_per_head) * BR + tid % 128;
                int hit = tid % 128 < BR && q < T && doc[q] >= doc_min && doc[q] <= doc_max;
                if (warpgroup_any(3 + wg, hit)) break;
            } else {
                int q = (first_q_tile + item % tiles_per_head) * BR + tid;
                int hit = tid < BR && q < T && doc[q] >= doc_min && doc[q] <= doc_max;
                if (__syncthreads_or(hit)) break;
            }
        }
        return item;
    };
    auto load_item = [&](int item, int buf) {
        int h = head0 + item / tiles_per_head;
        int q0 = (first_q_tile + item % tiles_per_head) * BR;
        int64_t head_offset = ((int64_t)b * T * p.heads + h) * D;
        sw128_load_async<BR, D, THREADS>(sQ + buf * BR * D, p.q + head_offset, q_stride, q0, T, tid);
        sw128_load_async<BR, D, THREADS>(sdO + buf * BR * D, p.dout + head_offset, q_stride, q0, T, tid);
        /* lse (natural log, scaled to log2 where used), delta and the query docs by cp.async too, so
         * that one wait (or one mbarrier) covers the whole stage; rows past T read as zeros (and are
         * masked) */
        if (tid < BR) {
            int q = q0 + tid, inside = q < T ? 4 : 0;
            int64_t row = ((int64_t)b * p.heads + h) * T + (q < T ? q : 0);
            cp_async_4(sLse + buf * BR + tid, p.lse + row, inside);
            cp_async_4(sDelta + buf * BR + tid, p.delta + row, inside);
            if (doc) cp_async_4(sQueryDoc + buf * BR + tid, doc + (q < T ? q : 0), inside);
        }
    };

    sw128_load_async<BC, D, THREADS>(sK, k_base, kv_stride, k0, T, tid);
    sw128_load_async<BC, D, THREADS>(sV, v_base, kv_stride, k0, T, tid);
    int item = next_item(0);
    if (item < n_items) load_item(item, 0);
    if (RING) {
        cp_async_mbar_arrive(&ring[0]); /* K and V land with the first stage */
        /* no item (documents): the block must not exit before that arrival lands */
        if (item >= n_items) mbar_wait(&ring[0], 0);
    } else {
        cp_async_commit();
    }

    float dk[D / 8][4], dv[D / 8][4];
    int dq_tiles = 0; /* bulk dQ tiles this warpgroup issued: staging tile dq_tiles % 2 is next */
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    /* this warpgroup's 64 key rows of K and V (1024-byte aligned in each column block) */
    const bf16 *wg_k = sK + wg * 64 * 64, *wg_v = sV + wg * 64 * 64;

    for (int buf = 0, n_done = 0; item < n_items; buf ^= 1, n_done++) {
        const int next = next_item(item + 1);
        if constexpr (RING) {
            if (next < n_items) {
                /* stage buf ^ 1 is in its use (n_done + 1) / 2; the previous one must be over */
                const int use = (n_done + 1) >> 1;
                if (use >= 1) mbar_wait(&ring[2 + (buf ^ 1)], (use - 1) & 1);
                load_item(next, buf ^ 1);
                cp_async_mbar_arrive(&ring[buf ^ 1]);
            }
            mbar_wait(&ring[buf], (n_done >> 1) & 1);
            fence_proxy_async_shared(); /* the cp.async data, before wgmma reads it */
        } else {
            cp_async_wait<0>();         /* this item's tiles, issued one item ago */
            fence_proxy_async_shared(); /* this thread's cp.async data, before wgmma reads it */
            /* The one block-wide barrier per item: the tiles are in, and every thread is done with
             * the previous item (its Q/dO buffer, dS^T), so the next item's loads may go there now. */
            __syncthreads();
            if (next < n_items) load_item(next, buf ^ 1);
            cp_async_commit();
        }

        const int h = head0 + item / tiles_per_head;
        const int q0 = (first_q_tile + item % tiles_per_head) * BR;
        const bf16 *tQ = sQ + buf * BR * D, *tdO = sdO + buf * BR * D;
        const float *tLse = sLse + buf * BR, *tDelta = sDelta + buf * BR;
        const int32_t *tDoc = sQueryDoc + buf * BR;
        const bool active = q0 + BR - 1 >= wg_key0; /* warpgroup-uniform: some query sees some key */

        if (active) {
            /* S^T, then dP^T (D = 64: as a second group, so that P^T is computed from S^T while dP^T
             * still runs; D = 128 has no registers for that). The first k step overwrites the
             * accumulators (no zeroing: no register writes that would make ptxas wait mid-chain). */
            float s[BR / 8][4], dp[BR / 8][4];
            /* D = 128 zeroes the accumulators first: ptxas then waits for S^T before issuing dP^T but
             * does not spill; overwriting them instead spills ~150 bytes a thread and measured 8-10%
             * slower on an H200 */
            constexpr bool ZERO = D == 128;
            if constexpr (ZERO) {
#pragma unroll
                for (int n = 0; n < BR / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
            }
            wgmma_fence();
#pragma unroll
            for (int kd = 0; kd < D / 16; kd++) {
                const int off_kv = (kd / 4) * BC * 64 + (kd % 4) * 16, off_q = (kd / 4) * BR * 64 + (kd % 4) * 16;
                wgmma_ss_m64n64_acc<E>(s, wgmma_desc(wg_k + off_kv, 16, 1024), wgmma_desc(tQ + off_q, 16, 1024),
                                    ZERO || kd);
            }
            if constexpr (D == 64) wgmma_commit();
#pragma unroll
            for (int kd = 0; kd < D / 16; kd++) {
                const int off_kv = (kd / 4) * BC * 64 + (kd % 4) * 16, off_q = (kd / 4) * BR * 64 + (kd % 4) * 16;
                wgmma_ss_m64n64_acc<E>(dp, wgmma_desc(wg_v + off_kv, 16, 1024), wgmma_desc(tdO + off_q, 16, 1024),
                                    ZERO || kd);
            }
            wgmma_commit();
            if constexpr (D == 64)
                wgmma_wait<1>();
            else
                wgmma_wait<0>();
            wgmma_fence_operands(s);

            /* P^T = exp2(S^T scale log2e - lse log2e), 0 where the mask hides the pair; then
             * dS^T = P^T (dP^T - delta). Both packed to E A fragments (P^T, dS^T: keys x queries) */
            const bool need_mask = q0 < wg_key0 + 63 || doc || q0 + BR > T || wg_key0 + 64 > T;
            uint32_t pa[BR / 16][4], da[BR / 16][4];
#pragma unroll
            for (int n = 0; n < BR / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int q_local = n * 8 + 2 * t4 + (e & 1), q = q0 + q_local, r = e >> 1;
                    bool visible = !need_mask || (q >= keys[r] && q < T && keys[r] < T &&
                                                  (!doc || tDoc[q_local] == key_doc[r]));
                    s[n][e] = visible ? exp2f(fmaf(s[n][e], p.scale_log2, -tLse[q_local] * 1.4426950408889634f))
                                      : 0.0f;
                }
            }
            pack_a_fragments<E>(s, pa);
            wgmma_wait<0>();
            wgmma_fence_operands(dp);
            ds_from_p<E>(dp, pa, tDelta, t4);
            pack_a_fragments<E>(dp, da);
            /* dS^T to shared memory for dQ ([BC][BR], one column block). Before the products: the
             * registers of a wgmma's A operand must not be touched until it completes */
            store_a_fragments<BC>(sdS, key_row, t4, da);
            /* dV += P^T dO, dK += dS^T Q: dO and Q [queries][D] read transposed, 16 queries (2048
             * bytes) per k16 step, column blocks BR * 128 bytes apart */
            wgmma_fence();
            wgmma_rs_accumulate<E, D>(dv, pa, tdO, BR * 128);
            wgmma_rs_accumulate<E, D>(dk, da, tQ, BR * 128);
            /* D = 64: not waited for here: they run on while this warpgroup passes the barrier below
             * and queues the dQ product behind them (one wait for all three). D = 128 waits: the
             * A fragments would stay live through the dQ product, and ptxas spills then. */
            wgmma_commit();
            if constexpr (D == 128) {
                wgmma_wait<0>();
                wgmma_fence_operands(dv);
                wgmma_fence_operands(dk);
            }
        } else if (D == 128) { /* every query is before these keys: dS^T = 0 for the other half */
#pragma unroll
            for (int kq = 0; kq < BR / 16; kq++) {
                int col = kq * 16 + 2 * t4;
                *reinterpret_cast<uint32_t *>(sdS + sw128_offset<BC>(key_row, col)) = 0u;
                *reinterpret_cast<uint32_t *>(sdS + sw128_offset<BC>(key_row + 8, col)) = 0u;
                *reinterpret_cast<uint32_t *>(sdS + sw128_offset<BC>(key_row, col + 8)) = 0u;
                *reinterpret_cast<uint32_t *>(sdS + sw128_offset<BC>(key_row + 8, col + 8)) = 0u;
            }
        }
        fence_proxy_async_shared(); /* dS^T written with st.shared, read by wgmma */
        /* bulk dQ: the staging tile this warpgroup fills next was read by the reduce-add before last */
        if (BULK && tid % 128 == 0) bulk_wait_read<1>();
        /* D = 64: a warpgroup's dQ reads only the dS^T rows it wrote itself, so its own 128 threads
         * are enough (named barrier 1 + wg; 0 is __syncthreads'); D = 128 reads both halves */
        if constexpr (D == 64)
            named_bar_sync(1 + wg, 128);
        else
            __syncthreads();

        /* dQ (BR x D) += dS K, A = dS^T [keys][queries] and B = K [keys][D] both read transposed.
         * D = 128: warpgroup wg takes columns 64 wg.. over all BC keys; D = 64: its own 64 keys,
         * all columns (skipped when inactive: its dS^T rows were not written). */
        if (D == 128 || active) {
            constexpr int KEYS = D == 128 ? BC : 64;
            const bf16 *a_base = D == 128 ? sdS : sdS + wg * 64 * BR;
            const bf16 *b_base = D == 128 ? sK + wg * BC * 64 : sK + wg * 64 * 64;
            const int col0 = D == 128 ? wg * 64 : 0;
            float dq[8][4];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < KEYS / 16; kk++)
                wgmma_ss_m64n64_tt_acc<E>(dq, wgmma_desc(a_base + kk * 16 * 64, 64 * 128, 1024),
                                       wgmma_desc(b_base + kk * 16 * 64, BC * 128, 1024), kk);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands(dq);
            wgmma_fence_operands(dv);
            wgmma_fence_operands(dk);
            if constexpr (BULK) {
                /* dQ tile (64 queries x this warpgroup's 64 columns) to shared memory, 16-byte chunk c
                 * of row r at c ^ (r % 8) (conflict-free float2 stores), then one bulk reduce-add of
                 * the 16 KiB into dq_accum, which holds the tile in the same order */
                float *stage = sdQ + ((dq_tiles & 1) * 2 + wg) * 64 * 64;
#pragma unroll
                for (int n = 0; n < 8; n++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const int row = warp * 16 + g + 8 * r, chunk = (2 * n + t4 / 2) ^ (row & 7);
                        *reinterpret_cast<float2 *>(stage + row * 64 + chunk * 4 + 2 * (t4 & 1)) =
                            make_float2(dq[n][2 * r], dq[n][2 * r + 1]);
                    }
                fence_proxy_async_shared();
                named_bar_sync(1 + wg, 128);
                if (tid % 128 == 0) {
                    const int n_rows = n_q_tiles * BR, col_block = D == 128 ? wg : 0;
                    float *dst = p.dq_accum +
                                 ((((int64_t)b * p.heads + h) * (D / 64) + col_block) * n_rows + q0) * 64;
                    bulk_reduce_add_f32(dst, stage, 64 * 64 * 4);
                    bulk_commit();
                }
                dq_tiles++;
            } else {
            /* 16-byte atomics: lanes t and t^1 swap halves so that an even lane holds 4 consecutive
             * columns of row g and an odd lane 4 of row g + 8 */
            float *dq_base = p.dq_accum + ((int64_t)b * T * p.heads + h) * D;
            const int odd = t4 & 1, q = q0 + warp * 16 + g + 8 * odd;
            float *out = dq_base + (int64_t)q * q_stride + col0 + 2 * (t4 & ~1);
#pragma unroll
            for (int n = 0; n < 8; n++) {
                float send0 = odd ? dq[n][0] : dq[n][2], send1 = odd ? dq[n][1] : dq[n][3];
                float recv0 = __shfl_xor_sync(0xffffffffu, send0, 1);
                float recv1 = __shfl_xor_sync(0xffffffffu, send1, 1);
                float4 v = odd ? make_float4(recv0, recv1, dq[n][2], dq[n][3])
                               : make_float4(dq[n][0], dq[n][1], recv0, recv1);
                if (q < T) atomicAdd(reinterpret_cast<float4 *>(out + n * 8), v);
            }
            }
        }
        /* No barrier here: dS^T and this Q/dO buffer are next written after the barrier at the top
         * of the next item, which every thread reaches only once its wgmma reads completed (RING:
         * the stage is released to the loaders instead; dS^T is the warpgroup's own). */
        if (RING) mbar_arrive(&ring[2 + buf]);
        item = next;
    }
    cp_async_wait<0>(); /* nothing may be left in flight when no item was active */
    if (BULK && tid % 128 == 0) bulk_wait<0>(); /* the staging tiles are read before the block exits */

    if (split > 1) { /* fp32 partial sums, added in a fixed order (and scaled) by flash_backward.cu */
        const int64_t rows = (int64_t)p.batch * T * p.kv_heads;
        float *pk = p.dkv_partial + ((int64_t)sp * rows + (int64_t)b * T * p.kv_heads + kv_head) * D;
        float *pv = pk + (int64_t)split * rows * D;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (keys[r] >= T) continue;
            const int64_t row = (int64_t)keys[r] * kv_stride;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                int col = n * 8 + 2 * t4;
                *reinterpret_cast<float2 *>(pk + row + col) = make_float2(dk[n][2 * r], dk[n][2 * r + 1]);
                *reinterpret_cast<float2 *>(pv + row + col) = make_float2(dv[n][2 * r], dv[n][2 * r + 1]);
            }
        }
        return;
    }
    bf16 *dk_base = p.dk + ((int64_t)b * T * p.kv_heads + kv_head) * D;
    bf16 *dv_base = p.dv + ((int64_t)b * T * p.kv_heads + kv_head) * D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (keys[r] >= T) continue;
        bf16 *dk_row = dk_base + (int64_t)keys[r] * kv_stride;
        bf16 *dv_row = dv_base + (int64_t)keys[r] * kv_stride;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            int col = n * 8 + 2 * t4;
            *reinterpret_cast<uint32_t *>(dk_row + col) =
                pack16<E>(dk[n][2 * r] * p.scale, dk[n][2 * r + 1] * p.scale);
            *reinterpret_cast<uint32_t *>(dv_row + col) = pack16<E>(dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
#else
    (void)p;
    __trap(); /* built without sm_90a code: the host never launches this */
#endif
}

template <typename E, int D, bool BULK, bool RING>
zt_status launch_backward_sm90(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params &p, int launch)
{
    constexpr size_t smem = bwd_sm90_shape<D, BULK>::SMEM;
    zt_status st =
        flash_prepare(ctx, "flash attention backward (wgmma)", flash_backward_sm90_kernel<E, D, BULK, RING>, smem);
    if (st != ZT_OK || !launch) return st;
    if (p.bwd_split < 1 || p.group % p.bwd_split != 0 || p.bwd_chunk < 1 || (p.bwd_split > 1 && !p.dkv_partial))
        return zt_cuda_fail(ZT_ERR_INTERNAL,
                            "flash attention backward (wgmma): bad work split %d (group %d) / chunk %d",
                            p.bwd_split, p.group, p.bwd_chunk);
    int64_t blocks = (int64_t)((p.seq + BC - 1) / BC) * p.batch * p.kv_heads * p.bwd_split;
    if (blocks > INT32_MAX)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "flash attention backward (wgmma): %lld blocks exceed the 1-D grid; use a "
                            "smaller batch", (long long)blocks);
    flash_backward_sm90_kernel<E, D, BULK, RING><<<(unsigned)blocks, THREADS, smem, stream>>>(p);
    return zt_cuda_check_launch("flash attention backward (wgmma)");
}

template <typename E>
zt_status launch_backward_sm90_variant(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params &p, int head_dim,
                                       int launch)
{
    if (head_dim == 128)
        return p.bwd_dq_bulk ? launch_backward_sm90<E, 128, true, false>(ctx, stream, p, launch)
                             : launch_backward_sm90<E, 128, false, false>(ctx, stream, p, launch);
    if (!p.bwd_dq_bulk) return launch_backward_sm90<E, 64, false, false>(ctx, stream, p, launch);
    return p.bwd_ring ? launch_backward_sm90<E, 64, true, true>(ctx, stream, p, launch)
                      : launch_backward_sm90<E, 64, true, false>(ctx, stream, p, launch);
}

} // namespace

zt_status zt_flash_backward_wgmma(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params *p, int head_dim,
                                  int launch)
{
    if (!zt_cuda_flash_wgmma_built())
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "flash attention backward (wgmma): this build has no sm_90a code; configure "
                            "with 90 in CMAKE_CUDA_ARCHITECTURES, or set ZT_FLASH_KERNEL=mma");
    /* the context's 16-bit type (zt_cuda_ctx_set_dtype): q, k, v, dout, dk, dv are bf16 or fp16 */
    ZT_DISPATCH16(ctx->dtype, E, return launch_backward_sm90_variant<E>(ctx, stream, *p, head_dim, launch));
}
