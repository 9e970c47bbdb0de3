/* Flash attention backward for Hopper (sm_90a), warp-specialized in the FlashAttention-3 style: the
 * "wgmma-ws" backward kernel, auto's choice on compute capability 9.0 (flash_backward.cu), head dim
 * 64 and 128, bf16 and fp16. First run on an H200 on 2026-11-30 (head dim 128, bf16): 1.5-2.1x
 * faster than the wgmma kernel of flash_backward_sm90.cu; scripts/flash-bwd-ws-check.sh verifies
 * and times it.
 *
 * Same work and contract as flash_backward_sm90.cu: a block owns BC = 128 keys of one (batch, kv
 * head) and one split of its GQA group's query heads (the same 1-D grid, chunks and split, decoded
 * the same way), walks the query tiles (BR = 64 rows) at or after its keys, keeps dK and dV (fp32)
 * in registers, and adds dQ into the bulk-layout fp32 accumulator with TMA reduce-adds
 * (flash_backward.cu runs delta before and the dQ conversion / split dK-dV sum after).
 *
 * What differs: the structure. 3 warpgroups, 384 threads:
 *   - warpgroup 0, the producer, gives its registers back (setmaxnreg.dec 24). Its warp 0 decides
 *     the work items (query head, query tile; the document skipping too) and feeds a ring of STAGES
 *     stages: per item
 *     one lane waits for the stage's "empty" mbarrier, announces the bytes (expect_tx) and issues
 *     the TMA loads of Q and dO (rows past seq zero-filled), while the 32
 *     lanes copy lse (times log2 e), delta and the query documents and the item number, then arrive
 *     on "full". After the last item it publishes item -1 (the end) the same way. K and V are loaded
 *     once by TMA onto their own mbarrier.
 *   - warpgroups 1 and 2, the consumers (setmaxnreg.inc 240), own 64 keys each. Per item:
 *       S^T  = K Q^T   and  dP^T = V dO^T   (wgmma SS m64n64, two commit groups: P^T is computed
 *                                            from S^T while dP^T still runs)
 *       P^T = exp2(S^T scale log2e - lse log2e) (ex2.approx), masked; dS^T = P^T (dP^T - delta),
 *       both to bf16
 *       dS^T -> shared memory (double-buffered [2][BC][BR], own 64 rows)
 *       dV += P^T dO, dK += dS^T Q   (wgmma RS m64n{D}, A from registers; not waited for)
 *       head dim 128: named barriers: this half of dS^T is in (arrive), the other half is in
 *       (sync; see BAR_DS), then
 *       dQ[:, 64 cw..] = dS K         (wgmma SS m64n64, both operands read transposed, 128 keys; 64
 *                                      when the second warpgroup's keys all lie after the tile)
 *       head dim 64: each consumer's dQ (all 64 columns) over its own 64 keys, no exchange (as the
 *       wgmma kernel does at 64: two 16 KiB reduce-adds per item, the same traffic as at 128)
 *       once dV, dK completed every thread arrives on "empty" (Q, dO read; dQ may still run);
 *       after dQ's wait the 64 x 64 fp32 dQ tile goes to a staging buffer (2 per warpgroup) and,
 *       after a warpgroup named barrier, one thread adds it to dq_accum with one
 *       cp.reduce.async.bulk.
 *     No block-wide barrier after setup: the consumers meet only at the dS^T exchange, the
 *     producer only through the mbarriers.
 * Deterministic dK, dV (fixed order in registers; split partials summed in split order after); dQ's
 * reduce-adds land in a varying order (last bits can differ between runs), as with the wgmma kernel.
 *
 * Why dS^T goes through a barrier between the two consumers: dQ sums over all 128 keys of the block;
 * each consumer takes 64 of dQ's columns so that the reduce traffic stays one 32 KiB tile per block
 * and item (each taking all columns over its own keys would double it). The dS^T buffer is double
 * buffered: a consumer rewrites buffer i % 2 at item i + 2 only after its sync on the other's
 * barrier of item i + 1, which the other arrives on only after its dQ of item i (which read the
 * buffer) completed. bench/attention/ws_protocol_model.py checks the protocol in random
 * interleavings.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include "cuda/flash_kernel.h"
#include "cuda/flash_wgmma.cuh"
#include "cuda/hopper_async.cuh"

namespace {

constexpr int BC = 128, BR = 64, THREADS = 384, STAGES = 2;
constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;
/* 168 at launch (__launch_bounds__(384, 1)); what the producer frees covers what the consumers take,
 * or their setmaxnreg.inc would wait forever */
constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
static_assert(LAUNCH_REGS - PRODUCER_REGS >= 2 * (CONSUMER_REGS - LAUNCH_REGS), "register split over budget");

/* Named barriers (0 is __syncthreads'). The dS^T exchange is one-directional: consumer c arrives on
 * BAR_DS + 2 c + item % 2 once its half of the item's dS^T is written, and the other consumer syncs
 * on it (256 threads: 128 arrive, 128 wait) before its dQ product; so neither waits for the other
 * to reach its dQ, and the two drift apart by up to about an item (one's exponentials overlap the
 * other's MMAs). The item parity in the id keeps a consumer that runs ahead from arriving twice on
 * one barrier before the other synced on it: to arrive for item i + 2 it must have synced on the
 * other's item i + 1, which the other arrives on only after it synced on item i.
 * BAR_DQ + c: consumer c's dQ staging handoff to its issuing thread (128). */
constexpr int BAR_DS = 1, BAR_DQ = 5;
static_assert(BAR_DQ >= BAR_DS + 4 && BAR_DQ + 1 <= 15, "4 dS^T barrier ids, then 2 for the dQ handoffs");

/* Shared memory: K, V, the Q/dO ring, dS^T (double-buffered), dQ staging (double-buffered per
 * consumer), lse/delta/query documents/item per stage, the mbarriers. A third ring stage was measured
 * no faster at head dim 128 (4 shapes, within 1%) and spilled: two it is. */
template <int D>
struct ws_shape {
    static constexpr size_t KV_BYTES = (size_t)BC * D * 2, QT_BYTES = (size_t)BR * D * 2;
    static constexpr size_t DS_BYTES = (size_t)BC * BR * 2;  /* one dS^T buffer */
    static constexpr size_t DQ_BYTES = (size_t)64 * 64 * 4; /* one dQ staging tile */
    static constexpr size_t K_OFF = 0, V_OFF = KV_BYTES, Q_OFF = 2 * KV_BYTES,
                            DO_OFF = Q_OFF + STAGES * QT_BYTES, DS_OFF = DO_OFF + STAGES * QT_BYTES,
                            DQ_OFF = DS_OFF + 2 * DS_BYTES, LSE_OFF = DQ_OFF + 2 * 2 * DQ_BYTES,
                            DELTA_OFF = LSE_OFF + STAGES * BR * 4, QDOC_OFF = DELTA_OFF + STAGES * BR * 4,
                            ITEM_OFF = QDOC_OFF + STAGES * BR * 4,
                            BAR_OFF = (ITEM_OFF + STAGES * 4 + 7) / 8 * 8, INT_OFF = BAR_OFF + (2 * STAGES + 1) * 8;
    /* the swizzled tiles need 1024-byte alignment, which the kernel makes by skipping up to 1023 bytes */
    static constexpr size_t SMEM = 1024 + INT_OFF + 16;
    static_assert(SMEM <= 232448, "more shared memory than an sm_90 block may have");
    static_assert(K_OFF % 1024 == 0 && V_OFF % 1024 == 0 && Q_OFF % 1024 == 0 && DO_OFF % 1024 == 0 &&
                      DS_OFF % 1024 == 0, "the swizzled tiles (TMA and wgmma) need 1024-byte alignment");
};

/* 2^x by the SFU alone (ex2.approx.ftz: about 2 ulp, results below 2^-126 flushed to 0, 2^-inf = 0):
 * P is rounded to bf16 right after, and exp2f's exact path costs a range test, two multiplies and a
 * branch per element; -inf for masked pairs keeps the loop free of branches. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) /* used by the kernel body only, which other targets stub */
__device__ __forceinline__ float ex2_ftz(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
#endif

struct ws_args {
    /* [batch][seq][heads][D] views in boxes of 64 columns: q, dout of BR rows, k, v of BC rows */
    CUtensorMap tq, tdo, tk, tv;
    flash_params p;
};

/* E: bf16 or fp16 (the wgmma and conversion type; shared tiles are 16-bit storage either way) */
template <typename E, int D>
__global__ void __launch_bounds__(THREADS, 1) flash_backward_sm90_ws_kernel(const __grid_constant__ ws_args args)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = ws_shape<D>;
    const flash_params &p = args.p;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    bf16 *sK = reinterpret_cast<bf16 *>(smem + S::K_OFF);   /* [D/64][BC][64] */
    bf16 *sV = reinterpret_cast<bf16 *>(smem + S::V_OFF);   /* [D/64][BC][64] */
    bf16 *sQ = reinterpret_cast<bf16 *>(smem + S::Q_OFF);   /* [STAGES][D/64][BR][64] */
    bf16 *sdO = reinterpret_cast<bf16 *>(smem + S::DO_OFF); /* [STAGES][D/64][BR][64] */
    bf16 *sdS = reinterpret_cast<bf16 *>(smem + S::DS_OFF); /* [2][BC][BR]: dS^T, keys as rows */
    float *sdQ = reinterpret_cast<float *>(smem + S::DQ_OFF); /* [2 buffers][2 consumers][64 * 64] */
    float *sLse = reinterpret_cast<float *>(smem + S::LSE_OFF);     /* [STAGES][BR], times log2 e */
    float *sDelta = reinterpret_cast<float *>(smem + S::DELTA_OFF); /* [STAGES][BR] */
    int32_t *sQueryDoc = reinterpret_cast<int32_t *>(smem + S::QDOC_OFF); /* [STAGES][BR] */
    int *sItem = reinterpret_cast<int *>(smem + S::ITEM_OFF);             /* [STAGES]: item, -1 = end */
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + S::BAR_OFF);    /* [STAGES] */
    uint64_t *empty = full + STAGES;                                     /* [STAGES] */
    uint64_t *kv_full = empty + STAGES;
    int *key_doc_range = reinterpret_cast<int *>(smem + S::INT_OFF); /* min, max */

    /* warpgroup index through a shuffle: provably warp-uniform, which ptxas needs to give the
     * consumers the registers of setmaxnreg.inc */
    const int T = p.seq, tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0);

    /* Which work: exactly as flash_backward_sm90.cu (1-D grid over chunks of bwd_chunk units
     * (batch, kv head, split), key tile by key tile, tile 0 first). */
    const int n_key_tiles = (T + BC - 1) / BC, split = p.bwd_split;
    const int units = p.batch * p.kv_heads * split;
    const int chunk = (int)blockIdx.x / (p.bwd_chunk * n_key_tiles);
    const int in_chunk = (int)blockIdx.x % (p.bwd_chunk * n_key_tiles);
    const int chunk_units = min(p.bwd_chunk, units - chunk * p.bwd_chunk);
    const int key_tile = in_chunk / chunk_units, unit = chunk * p.bwd_chunk + in_chunk % chunk_units;
    const int sp = unit % split, kv_head = unit / split % p.kv_heads, b = unit / split / p.kv_heads;
    const int k0 = key_tile * BC, heads_per_split = p.group / split;
    const int head0 = kv_head * p.group + sp * heads_per_split;
    const int32_t *doc = p.doc_ids ? p.doc_ids + (int64_t)b * T : nullptr;
    /* items: (query head of this split, query tile at or after this key tile), head-major */
    const int n_q_tiles = (T + BR - 1) / BR, first_q_tile = k0 / BR;
    const int tiles_per_head = n_q_tiles - first_q_tile;
    const int n_items = heads_per_split * tiles_per_head;

    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 32);   /* the producer warp's lanes */
            mbar_init(&empty[s], 256); /* every consumer thread */
        }
        mbar_init(kv_full, 1);
        mbar_fence_init();
        key_doc_range[0] = INT32_MAX;
        key_doc_range[1] = INT32_MIN;
    }
    __syncthreads();
    if (doc) { /* the documents of this block's keys, for skipping query tiles that meet none */
        if (tid < BC && k0 + tid < T) {
            atomicMin(&key_doc_range[0], doc[k0 + tid]);
            atomicMax(&key_doc_range[1], doc[k0 + tid]);
        }
        __syncthreads();
    }

    if (wg == 0) {
        /* ---- producer: warp 0; lane 0 issues the TMA loads ---- */
        setmaxnreg_dec<PRODUCER_REGS>();
        if (tid >= 32) return;
        const int lane = tid;
        if (lane == 0) {
            tma_prefetch_desc(&args.tq);
            tma_prefetch_desc(&args.tdo);
            tma_prefetch_desc(&args.tk);
            tma_prefetch_desc(&args.tv);
            mbar_arrive_expect_tx(kv_full, (uint32_t)(2 * S::KV_BYTES));
#pragma unroll
            for (int j = 0; j < D / 64; j++) {
                tma_load_4d(sK + j * BC * 64, &args.tk, kv_full, j * 64, kv_head, k0, b);
                tma_load_4d(sV + j * BC * 64, &args.tv, kv_full, j * 64, kv_head, k0, b);
            }
        }
        const int doc_min = key_doc_range[0], doc_max = key_doc_range[1];
        /* the next item at or after `item` whose queries can see a document of these keys (exact
         * for packed, non-decreasing ids; a safe superset otherwise: the mask does the rest) */
        auto next_item = [&](int item) {
            if (!doc) return item;
            for (; item < n_items; item++) {
                const int q0 = (first_q_tile + item % tiles_per_head) * BR;
                int hit = 0;
#pragma unroll
                for (int r = 0; r < BR; r += 32) {
                    const int q = q0 + r + lane;
                    hit |= q < T && doc[q] >= doc_min && doc[q] <= doc_max;
                }
                if (__any_sync(0xffffffffu, hit)) break;
            }
            return item;
        };
        /* ring position as (stage, phase) counters: no division by STAGES (3) */
        for (int stage = 0, phase = 0, item = next_item(0);; item = next_item(item + 1)) {
            mbar_wait(&empty[stage], phase ^ 1);
            if (item >= n_items) { /* the end, published like an item */
                if (lane == 0) sItem[stage] = -1;
                mbar_arrive(&full[stage]);
                break;
            }
            const int h = head0 + item / tiles_per_head;
            const int q0 = (first_q_tile + item % tiles_per_head) * BR;
            if (lane == 0) {
                mbar_expect_tx(&full[stage], (uint32_t)(2 * S::QT_BYTES));
#pragma unroll
                for (int j = 0; j < D / 64; j++) {
                    tma_load_4d(sQ + stage * BR * D + j * BR * 64, &args.tq, &full[stage], j * 64, h, q0, b);
                    tma_load_4d(sdO + stage * BR * D + j * BR * 64, &args.tdo, &full[stage], j * 64, h, q0, b);
                }
                sItem[stage] = item;
            }
            /* rows past T: zeros (their pairs are masked) */
#pragma unroll
            for (int r = 0; r < BR; r += 32) {
                const int q = q0 + r + lane;
                const int64_t row = ((int64_t)b * p.heads + h) * T + q;
                sLse[stage * BR + r + lane] = q < T ? p.lse[row] * 1.4426950408889634f : 0.0f;
                sDelta[stage * BR + r + lane] = q < T ? p.delta[row] : 0.0f;
                sQueryDoc[stage * BR + r + lane] = doc && q < T ? doc[q] : INT32_MIN;
            }
            mbar_arrive(&full[stage]); /* release: this lane's st.shared, before the consumers read */
            if (++stage == STAGES) stage = 0, phase ^= 1;
        }
        return;
    }

    /* ---- consumers ---- */
    setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = wg - 1, ctid = tid - 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int wg_key0 = k0 + cw * 64;
    const int key_row = cw * 64 + warp * 16 + g; /* this thread's first key row in the block */
    const int keys[2] = {k0 + key_row, k0 + key_row + 8};
    int key_doc[2] = {0, 0};
    if (doc) {
        key_doc[0] = doc[keys[0] < T ? keys[0] : T - 1];
        key_doc[1] = doc[keys[1] < T ? keys[1] : T - 1];
    }
    /* this warpgroup's 64 key rows of K and V (1024-byte aligned in each column block) */
    const bf16 *wg_k = sK + cw * 64 * 64, *wg_v = sV + cw * 64 * 64;

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    int dq_tiles = 0; /* dQ tiles this warpgroup added: staging buffer dq_tiles % 2 is next */

    mbar_wait_or_exit(kv_full, 0);
    /* it: the item count (its parity picks the dS^T buffer and barrier ids); stage, phase: the ring */
    for (int it = 0, stage = 0, phase = 0;; it++) {
        mbar_wait_or_exit(&full[stage], phase);
        const int item = sItem[stage];
        if (item < 0) break;
        const int h = head0 + item / tiles_per_head;
        const int q0 = (first_q_tile + item % tiles_per_head) * BR;
        const bf16 *tQ = sQ + stage * BR * D, *tdO = sdO + stage * BR * D;
        const float *tLse = sLse + stage * BR, *tDelta = sDelta + stage * BR;
        const int32_t *tDoc = sQueryDoc + stage * BR;
        bf16 *tdS = sdS + (it & 1) * BC * BR;
        /* warpgroup-uniform: some query of the tile sees some key of this warpgroup (always true
         * for the first; false for the second on the tile that starts at the block's keys) */
        const bool active = q0 + BR - 1 >= wg_key0;
        const bool second_active = q0 + BR - 1 >= k0 + 64;

        if (active) {
            /* S^T and dP^T as two groups: P^T is computed from S^T while dP^T still runs */
            float s[BR / 8][4], dp[BR / 8][4];
            /* S^T's accumulators are zeroed, dP^T's first k step overwrites its own. Measured with
             * ptxas 13.0 (SASS): this is the one form that issues both chains back to back without
             * spills; zeroing both makes ptxas wait for S^T before issuing dP^T, zeroing neither
             * spills ~120 bytes a thread. */
#pragma unroll
            for (int n = 0; n < BR / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] = 0.0f;
            wgmma_fence();
#pragma unroll
            for (int kd = 0; kd < D / 16; kd++) {
                const int off_kv = (kd / 4) * BC * 64 + (kd % 4) * 16, off_q = (kd / 4) * BR * 64 + (kd % 4) * 16;
                wgmma_ss_m64n64_acc<E>(s, wgmma_desc(wg_k + off_kv, 16, 1024), wgmma_desc(tQ + off_q, 16, 1024), 1);
            }
            wgmma_commit();
#pragma unroll
            for (int kd = 0; kd < D / 16; kd++) {
                const int off_kv = (kd / 4) * BC * 64 + (kd % 4) * 16, off_q = (kd / 4) * BR * 64 + (kd % 4) * 16;
                wgmma_ss_m64n64_acc<E>(dp, wgmma_desc(wg_v + off_kv, 16, 1024), wgmma_desc(tdO + off_q, 16, 1024), kd);
            }
            wgmma_commit();
            wgmma_wait<1>(); /* S^T; dP^T still runs */
            wgmma_fence_operands(s);

            /* P^T = exp2(S^T scale log2e - lse log2e), 0 where the mask hides the pair. Tiles that
             * need no mask (most: below the diagonal, no documents, inside seq) take a loop of
             * FFMA + EX2 alone; the others test each pair (branches: the branch-free select makes
             * ptxas hoist the operand loads and spill). */
            const bool need_mask = q0 < wg_key0 + 63 || doc || q0 + BR > T || wg_key0 + 64 > T;
            uint32_t pa[BR / 16][4], da[BR / 16][4];
            if (!need_mask) {
#pragma unroll
                for (int n = 0; n < BR / 8; n++) {
                    const float2 l = *reinterpret_cast<const float2 *>(tLse + n * 8 + 2 * t4);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[n][e] = ex2_ftz(fmaf(s[n][e], p.scale_log2, -((e & 1) ? l.y : l.x)));
                }
            } else {
                /* visible: keys[r] <= q < T (which implies keys[r] < T), as bounds on the column's
                 * compile-time part c = q_local - 2 t4 */
                const int lo[2] = {keys[0] - q0 - 2 * t4, keys[1] - q0 - 2 * t4}, hi = T - q0 - 2 * t4;
#pragma unroll
                for (int n = 0; n < BR / 8; n++) {
                    const float2 l = *reinterpret_cast<const float2 *>(tLse + n * 8 + 2 * t4);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int c = n * 8 + (e & 1), q_local = c + 2 * t4, r = e >> 1;
                        const bool visible =
                            c >= lo[r] && c < hi && (!doc || tDoc[q_local] == key_doc[r]);
                        s[n][e] = visible ? ex2_ftz(fmaf(s[n][e], p.scale_log2, -((e & 1) ? l.y : l.x))) : 0.0f;
                    }
                }
            }
            pack_a_fragments<E>(s, pa);
            wgmma_wait<0>();
            wgmma_fence_operands(dp);
            ds_from_p<E>(dp, pa, tDelta, t4);
            pack_a_fragments<E>(dp, da);
            /* dS^T to shared memory before the products: a wgmma's A registers must not be read
             * until it completes */
            store_a_fragments<BC>(tdS, key_row, t4, da);
            /* dV += P^T dO, dK += dS^T Q: dO and Q [queries][D] read transposed, 16 queries (2048
             * bytes) per k16 step, column blocks BR * 128 bytes apart */
            wgmma_fence();
            wgmma_rs_accumulate<E, D>(dv, pa, tdO, BR * 128);
            wgmma_rs_accumulate<E, D>(dk, da, tQ, BR * 128);
            /* not waited for: they run on while this warpgroup hands over its dS^T and waits for the
             * other's, and the dQ product queues behind them (the A fragments stay live until they
             * complete: no spills at 240 registers, ptxas 13.0) */
            wgmma_commit();
        }
        fence_proxy_async_shared(); /* dS^T written with st.shared, read by wgmma */
        /* the staging buffer this warpgroup fills next was read by the reduce-add two items ago (the
         * barrier below orders this thread's wait before the others' staging writes) */
        if constexpr (D == 128) {
            named_bar_arrive(BAR_DS + 2 * cw + (it & 1), 256); /* this half of dS^T is in */
            if (ctid % 128 == 0) bulk_wait_read<1>();
            named_bar_sync(BAR_DS + 2 * (1 - cw) + (it & 1), 256); /* the other half is in */
        } else {
            /* head dim 64: this warpgroup's dQ reads only the dS^T rows it wrote itself */
            if (ctid % 128 == 0) bulk_wait_read<1>();
            named_bar_sync(BAR_DS + cw, 128);
        }

        /* dQ (BR x 64) = dS K, A = dS^T [keys][queries] and B = K [keys][D] both read transposed.
         * Head dim 128: columns 64 cw.. over the block's keys (the second 64 keys only when their
         * dS^T rows were written); head dim 64: all columns over this warpgroup's own 64 keys (none
         * when inactive: its dS^T rows were not written, and its share of dQ is zero) */
        float dq[8][4];
        const bf16 *a_base = D == 128 ? tdS : tdS + cw * 64 * BR;
        const bf16 *b_base = D == 128 ? sK + cw * BC * 64 : sK + cw * 64 * 64;
        /* two whole chains rather than predicated steps, which ptxas splits into groups with a dummy
         * wgmma each */
        auto issue_dq = [&](auto n_steps) {
#pragma unroll
            for (int kk = 0; kk < decltype(n_steps)::value; kk++)
                wgmma_ss_m64n64_tt_acc<E>(dq, wgmma_desc(a_base + kk * 16 * 64, 64 * 128, 1024),
                                          wgmma_desc(b_base + kk * 16 * 64, BC * 128, 1024), kk);
            wgmma_commit();
        };
        const bool dq_here = D == 128 || active;
        wgmma_fence();
        if (D == 128 && second_active)
            issue_dq(std::integral_constant<int, BC / 16>());
        else if (dq_here)
            issue_dq(std::integral_constant<int, 64 / 16>());
        /* dV, dK (the group before dQ's) completed: this thread is done with the stage (its MMAs
         * read Q and dO; lse, delta and the documents were read), which the producer may refill
         * while dQ still runs */
        if (!dq_here) { /* head dim 64, keys all after this tile: nothing to add (and nothing pending) */
            wgmma_wait<0>();
            wgmma_fence_operands(dv);
            wgmma_fence_operands(dk);
            mbar_arrive(&empty[stage]);
            if (++stage == STAGES) stage = 0, phase ^= 1;
            continue;
        }
        wgmma_wait<1>();
        wgmma_fence_operands(dv);
        wgmma_fence_operands(dk);
        mbar_arrive(&empty[stage]);
        wgmma_wait<0>();
        wgmma_fence_operands(dq);

        /* dQ tile (64 queries x this warpgroup's 64 columns) to staging, 16-byte chunk c of row r at
         * c ^ (r % 8) (conflict-free float2 stores), then one bulk reduce-add of its 16 KiB into
         * dq_accum ([B][H][D/64][T rounded up to 64][64], the same order) */
        float *stage_dq = sdQ + ((dq_tiles & 1) * 2 + cw) * 64 * 64;
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = warp * 16 + g + 8 * r, chunk16 = (2 * n + t4 / 2) ^ (row & 7);
                *reinterpret_cast<float2 *>(stage_dq + row * 64 + chunk16 * 4 + 2 * (t4 & 1)) =
                    make_float2(dq[n][2 * r], dq[n][2 * r + 1]);
            }
        fence_proxy_async_shared();
        named_bar_sync(BAR_DQ + cw, 128);
        if (ctid % 128 == 0) {
            const int col_block = D == 128 ? cw : 0;
            float *dst = p.dq_accum + ((((int64_t)b * p.heads + h) * (D / 64) + col_block) * (n_q_tiles * BR) + q0) * 64;
            bulk_reduce_add_f32(dst, stage_dq, 64 * 64 * 4);
            bulk_commit();
        }
        dq_tiles++;
        if (++stage == STAGES) stage = 0, phase ^= 1;
    }
    if (ctid % 128 == 0) bulk_wait<0>(); /* the staging tiles are read before the block exits */

    const int64_t kv_stride = (int64_t)p.kv_heads * D;
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
    (void)args;
    __trap(); /* built without sm_90a code: the host never launches this */
#endif
}

template <typename E, int D>
zt_status launch_ws(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params *p, int launch)
{
    const char *what = "flash attention backward (wgmma-ws)";
    using S = ws_shape<D>;
    zt_status st = flash_prepare(ctx, what, flash_backward_sm90_ws_kernel<E, D>, S::SMEM);
    if (st != ZT_OK || !launch) return st;
    if (p->bwd_split < 1 || p->group % p->bwd_split != 0 || p->bwd_chunk < 1 || (p->bwd_split > 1 && !p->dkv_partial) ||
        !p->bwd_dq_bulk)
        return zt_cuda_fail(ZT_ERR_INTERNAL, "%s: bad work split %d (group %d) / chunk %d / dq layout %d", what,
                            p->bwd_split, p->group, p->bwd_chunk, p->bwd_dq_bulk);
    const int64_t blocks = (int64_t)((p->seq + BC - 1) / BC) * p->batch * p->kv_heads * p->bwd_split;
    if (blocks > INT32_MAX)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED, "%s: %lld blocks exceed the 1-D grid; use a smaller batch", what,
                            (long long)blocks);
    ws_args args;
    memset(&args, 0, sizeof args);
    args.p = *p;
    if ((st = zt_hopper_tensor_map_bthd(&args.tq, "flash attention backward (wgmma-ws), q", p->q, p->batch, p->seq,
                                        p->heads, D, BR, 64)) != ZT_OK ||
        (st = zt_hopper_tensor_map_bthd(&args.tdo, "flash attention backward (wgmma-ws), dout", p->dout, p->batch,
                                        p->seq, p->heads, D, BR, 64)) != ZT_OK ||
        (st = zt_hopper_tensor_map_bthd(&args.tk, "flash attention backward (wgmma-ws), k", p->k, p->batch, p->seq,
                                        p->kv_heads, D, BC, 64)) != ZT_OK ||
        (st = zt_hopper_tensor_map_bthd(&args.tv, "flash attention backward (wgmma-ws), v", p->v, p->batch, p->seq,
                                        p->kv_heads, D, BC, 64)) != ZT_OK)
        return st;
    flash_backward_sm90_ws_kernel<E, D><<<(unsigned)blocks, THREADS, S::SMEM, stream>>>(args);
    return zt_cuda_check_launch(what);
}

} // namespace

zt_status zt_flash_backward_wgmma_ws(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params *p, int head_dim,
                                     int launch)
{
    const char *what = "flash attention backward (wgmma-ws)";
    if (!zt_cuda_flash_wgmma_built())
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "%s: this build has no sm_90a code; configure with 90 in CMAKE_CUDA_ARCHITECTURES, "
                            "or set ZT_FLASH_BACKWARD_KERNEL=mma", what);
    if (head_dim != 64 && head_dim != 128)
        return zt_cuda_fail(ZT_ERR_INTERNAL, "%s: head_dim %d reached the kernel; it is built for 64 and 128", what,
                            head_dim);
    /* the context's 16-bit type (zt_cuda_ctx_set_dtype): q, k, v, dout, dk, dv are bf16 or fp16 */
    ZT_DISPATCH16(ctx->dtype, E,
                  return head_dim == 128 ? launch_ws<E, 128>(ctx, stream, p, launch)
                                         : launch_ws<E, 64>(ctx, stream, p, launch));
}
