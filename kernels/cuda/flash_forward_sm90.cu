/* Flash attention forward for Hopper (sm_90a): the FlashAttention-2 algorithm of flash_forward.cu on
 * warpgroup MMA (wgmma), structured as FlashAttention-3.
 *
 * Warp specialization. A unit of work is BR = 64 * CWGS query rows of one (batch, head); a block has
 * 1 + CWGS warpgroups:
 *   - warpgroup 0, the producer, gives its registers back (setmaxnreg.dec) and one warp of it feeds
 *     a ring of STAGES shared-memory buffers: per key tile, one lane issues the TMA loads of K and V
 *     (128-byte swizzled boxes of 64 columns, rows past seq zero-filled by TMA) onto the stage's
 *     "full" mbarrier (expect_tx), while the warp's lanes copy the tile's document ids. Q is loaded by
 *     TMA once per unit onto its own mbarrier, once the consumers released the previous unit's.
 *   - warpgroups 1..CWGS, the consumers (setmaxnreg.inc), own 64 query rows each and keep their
 *     output accumulators (fp32), running max and sum in registers. Every consumer thread arrives on
 *     a stage's "empty" mbarrier once its MMAs that read the stage completed, which hands the buffer
 *     back to the producer. No block-wide barrier after setup.
 * Persistent: one block per SM walks units (snake order over the list sorted longest first), the
 * ring running on across units, so a unit's loads overlap the previous unit's MMAs and stores. With
 * document ids a small kernel first finds each query tile's first key tile.
 * Consumer overlap inside a warpgroup: for key tile j the warpgroup issues S_j = Q K_j^T and
 * O += P_{j-1} V_{j-1} together (wgmma, asynchronous), waits for S_j only, masks and exponentiates
 * it while the P V product runs, then waits for that, rescales O and packs P_j to E A fragments.
 * Between warpgroups: they take turns to issue their MMAs (pingpong, named barriers).
 *   S = Q K^T     wgmma m64n128k16, both operands in shared memory (K-major, 128B swizzle)
 *   O += P V      wgmma m64nDk16, P from registers, V in shared memory read transposed (MN-major)
 * Online softmax in base 2 (scores prescaled by scale * log2(e)). Work skipped as in flash_forward.cu:
 * key tiles past the causal diagonal, key tiles before the first one holding a document of this
 * query tile, and per warpgroup tiles entirely above its rows (the warpgroup still waits for and
 * releases their buffers). Grouped-query attention reads kv head h / group directly. o and lse
 * (natural log, max * scale + log(sum)) are those of the mma.sync forward, so either backward takes
 * them.
 *
 * Templated on the element type E (bf16, or f16 for fp16.enabled; flash_common.cuh): the wgmma input
 * type, the TMA maps' data type and the packing of P and O follow it, everything else is the same.
 *
 * Compiled only for sm_90a (kernels/CMakeLists.txt); elsewhere the kernel body is a trap and the
 * host side reports the kernel unavailable, so the mma.sync kernels run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include "cuda/flash_kernel.h"
#include "cuda/flash_wgmma.cuh"
#include "cuda/hopper_async.cuh"

namespace {

/* Per head dim and consumer warpgroups: key tiles of BC = 128 (S = m64n128), the ring depth, and the
 * register split. The kernel launches with 65536 / THREADS registers a thread (__launch_bounds__(.., 1));
 * the producer drops to PRODUCER_REGS and the consumers take what it freed:
 *   3 warpgroups: 168 at launch, 24 + 2 x 240 (128 x 144 freed = 256 x 72 taken)
 *   4 warpgroups: 128 at launch, 32 + 3 x 160 (128 x 96 freed = 384 x 32 taken) */
template <int D, int CWGS>
struct sm90_fwd_shape {
    static constexpr int BC = 128, BR = 64 * CWGS, THREADS = 128 * (CWGS + 1);
    static constexpr int PRODUCER_REGS = CWGS == 2 ? 24 : 32, CONSUMER_REGS = CWGS == 2 ? 240 : 160;
    static_assert(CWGS == 2 || CWGS == 3, "2 or 3 consumer warpgroups");
    /* what the producer frees must cover what the consumers take, or their setmaxnreg.inc waits forever */
    static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
    static_assert(LAUNCH_REGS - PRODUCER_REGS >= CWGS * (CONSUMER_REGS - LAUNCH_REGS), "register split over budget");
    static constexpr size_t Q_BYTES = (size_t)BR * D * 2, KV_BYTES = (size_t)BC * D * 2;
    /* hd 128: 3 stages (32 + 3 x 64 KiB); hd 64: 4 stages (16 or 24 + 4 x 32 KiB) */
    static constexpr int STAGES = (int)((232448 - 1024 - 2048 - Q_BYTES) / (2 * KV_BYTES)) > 4
                                      ? 4
                                      : (int)((232448 - 1024 - 2048 - Q_BYTES) / (2 * KV_BYTES));
    static constexpr size_t KV_OFF = Q_BYTES, DOC_OFF = KV_OFF + 2 * STAGES * KV_BYTES,
                            BAR_OFF = DOC_OFF + (size_t)STAGES * BC * 4, INT_OFF = BAR_OFF + (2 * STAGES + 2) * 8;
    /* the swizzled tiles need 1024-byte alignment, which the kernel makes by skipping up to 1023 bytes */
    static constexpr size_t SMEM = 1024 + INT_OFF + 16;
    static_assert(STAGES >= 2, "too little shared memory for a 2-stage ring");
    static_assert(SMEM <= 232448, "more shared memory than an sm_90 block may have");
};

struct sm90_fwd_args {
    /* [batch][seq][heads][D] views, boxes of 64 columns x (BR rows of q, BC of k and v) */
    CUtensorMap tq, tk, tv;
    flash_params p;
    /* With document ids: per (batch, query tile) the first key tile to visit, found by
     * flash_first_tiles_kernel; NULL: each block searches for its one unit itself. */
    const int *first_tiles;
};

/* The first key tile holding a document of each (batch, query tile): the query tile's first key
 * does, so only keys before it are searched. Exact for any ids (packed documents need not be
 * sorted): the first key whose id lies in the query tile's [min, max]; the mask does the rest. */
template <int BR, int BC>
__global__ void __launch_bounds__(256) flash_first_tiles_kernel(const int32_t *doc_ids, int T, int q_tiles,
                                                                int *first_tiles)
{
    __shared__ int sh[3]; /* doc min, doc max, first key */
    const int qt = blockIdx.x, b = blockIdx.y, q0 = qt * BR, tid = threadIdx.x;
    const int32_t *doc = doc_ids + (int64_t)b * T;
    if (tid == 0) {
        sh[0] = INT32_MAX;
        sh[1] = INT32_MIN;
        sh[2] = q0;
    }
    __syncthreads();
    for (int i = tid; i < BR && q0 + i < T; i += 256) {
        atomicMin(&sh[0], doc[q0 + i]);
        atomicMax(&sh[1], doc[q0 + i]);
    }
    __syncthreads();
    const int doc_min = sh[0], doc_max = sh[1];
    for (int key = tid; key < q0; key += 256)
        if (doc[key] >= doc_min && doc[key] <= doc_max) {
            atomicMin(&sh[2], key);
            break; /* this thread's later keys are larger */
        }
    __syncthreads();
    if (tid == 0) first_tiles[(int64_t)b * q_tiles + qt] = sh[2] / BC;
}

/* Named barriers (0 is __syncthreads'): the consumers' turns to issue MMAs. (maybe_unused: builds
 * without sm_90a compile the kernel bodies out.) */
[[maybe_unused]] constexpr int BAR_TURN = 1;

template <typename E, int D, int CWGS, bool PINGPONG>
__global__ void __launch_bounds__(sm90_fwd_shape<D, CWGS>::THREADS, 1)
    flash_forward_sm90_kernel(const __grid_constant__ sm90_fwd_args args)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = sm90_fwd_shape<D, CWGS>;
    constexpr int BR = S::BR, BC = S::BC, THREADS = S::THREADS, STAGES = S::STAGES;
    const flash_params &p = args.p;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    bf16 *sQ = reinterpret_cast<bf16 *>(smem);                       /* [D/64][BR][64] */
    bf16 *sK = reinterpret_cast<bf16 *>(smem + S::KV_OFF);           /* [STAGES][D/64][BC][64] */
    bf16 *sV = sK + STAGES * BC * D;                                 /* [STAGES][D/64][BC][64] */
    int32_t *sKeyDoc = reinterpret_cast<int32_t *>(smem + S::DOC_OFF); /* [STAGES][BC] */
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + S::BAR_OFF);  /* [STAGES]: K, V, docs landed */
    uint64_t *empty = full + STAGES;                                   /* [STAGES]: consumers done */
    uint64_t *q_full = empty + STAGES, *q_empty = q_full + 1;          /* Q landed / Q read by all */
    int *shared_ints = reinterpret_cast<int *>(smem + S::INT_OFF); /* doc min, doc max, first key */

    /* warpgroup index through a shuffle: provably warp-uniform, which ptxas needs to give the
     * consumers the registers of setmaxnreg.inc */
    const int T = p.seq, tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    /* Work units (query tile, head, batch), numbered with the query tile fastest and the longest
     * tiles (most keys) first, so the blocks running at once share the K/V of a few heads in L2.
     * Block i takes units i, 2G - 1 - i, 2G + i, 4G - 1 - i, ... (G blocks; snake order balances
     * long and short tiles); with one block per unit, unit i. */
    const int q_tiles = (T + BR - 1) / BR, n_work = q_tiles * p.heads * p.batch, G = gridDim.x;
    auto work_at = [&](int k) { return k * G + ((k & 1) ? G - 1 - (int)blockIdx.x : (int)blockIdx.x); };
    struct unit {
        int q0, h, b, last_tile, qt;
    };
    auto decode = [&](int w) {
        unit u;
        u.qt = q_tiles - 1 - w % q_tiles;
        u.q0 = u.qt * BR;
        u.h = (w / q_tiles) % p.heads;
        u.b = w / q_tiles / p.heads;
        u.last_tile = ((u.q0 + BR < T ? u.q0 + BR : T) - 1) / BC;
        return u;
    };

    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 32);          /* the producer warp's lanes */
            mbar_init(&empty[s], 128 * CWGS); /* every consumer thread */
        }
        mbar_init(q_full, 1);
        mbar_init(q_empty, 128 * CWGS);
        mbar_fence_init();
        shared_ints[0] = INT32_MAX;
        shared_ints[1] = INT32_MIN;
    }
    __syncthreads();

    /* With documents and no first_tiles (the host then launches one block per unit): the first key
     * tile holding a document of this query tile, found as by flash_first_tiles_kernel, by all
     * threads before the roles split. Without documents every unit starts at key tile 0. */
    int doc_first_tile = 0;
    auto first_tile_of = [&](int k, const unit &u) {
        return args.first_tiles ? args.first_tiles[(int64_t)u.b * q_tiles + u.qt] : k == 0 ? doc_first_tile : 0;
    };
    if (p.doc_ids && !args.first_tiles) {
        const unit u = decode(work_at(0));
        const int32_t *doc = p.doc_ids + (int64_t)u.b * T;
        if (tid == 0) shared_ints[2] = u.q0;
        for (int i = tid; i < BR && u.q0 + i < T; i += THREADS) {
            atomicMin(&shared_ints[0], doc[u.q0 + i]);
            atomicMax(&shared_ints[1], doc[u.q0 + i]);
        }
        __syncthreads();
        const int doc_min = shared_ints[0], doc_max = shared_ints[1];
        for (int key = tid; key < u.q0; key += THREADS)
            if (doc[key] >= doc_min && doc[key] <= doc_max) {
                atomicMin(&shared_ints[2], key);
                break; /* this thread's later keys are larger */
            }
        __syncthreads();
        doc_first_tile = shared_ints[2] / BC;
    }

    if (wg == 0) {
        /* ---- producer: one warp; lane 0 issues the TMA loads ---- */
        setmaxnreg_dec<S::PRODUCER_REGS>();
        if (tid >= 32) return;
        const int lane = tid;
        if (lane == 0) {
            tma_prefetch_desc(&args.tq);
            tma_prefetch_desc(&args.tk);
            tma_prefetch_desc(&args.tv);
        }
        int it = 0; /* position in the K/V ring, continued across units */
        for (int k = 0; work_at(k) < n_work; k++) {
            const unit u = decode(work_at(k));
            const int kv_head = u.h / p.group;
            const int32_t *doc = p.doc_ids ? p.doc_ids + (int64_t)u.b * T : nullptr;
            mbar_wait(q_empty, (k & 1) ^ 1); /* every consumer has read the previous unit's Q */
            if (lane == 0) {
                mbar_arrive_expect_tx(q_full, (uint32_t)S::Q_BYTES);
#pragma unroll
                for (int j = 0; j < D / 64; j++) tma_load_4d(sQ + j * BR * 64, &args.tq, q_full, j * 64, u.h, u.q0, u.b);
            }
            for (int tile = first_tile_of(k, u); tile <= u.last_tile; tile++, it++) {
                const int stage = it % STAGES;
                mbar_wait(&empty[stage], ((it / STAGES) & 1) ^ 1);
                if (doc)
                    for (int i = lane; i < BC; i += 32) {
                        int key = tile * BC + i;
                        sKeyDoc[stage * BC + i] = key < T ? doc[key] : INT32_MIN;
                    }
                if (lane == 0) {
                    mbar_arrive_expect_tx(&full[stage], (uint32_t)(2 * S::KV_BYTES));
                    bf16 *k_dst = sK + stage * BC * D, *v_dst = sV + stage * BC * D;
#pragma unroll
                    for (int j = 0; j < D / 64; j++) {
                        tma_load_4d(k_dst + j * BC * 64, &args.tk, &full[stage], j * 64, kv_head, tile * BC, u.b);
                        tma_load_4d(v_dst + j * BC * 64, &args.tv, &full[stage], j * 64, kv_head, tile * BC, u.b);
                    }
                } else {
                    mbar_arrive(&full[stage]); /* releases this lane's document ids */
                }
            }
        }
        return;
    }

    /* ---- consumers ---- */
    setmaxnreg_inc<S::CONSUMER_REGS>();
    const int cw = wg - 1, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    /* This warpgroup's 64 rows of Q: rows cw * 64 of each column block (1024-byte aligned). */
    const bf16 *wg_q = sQ + cw * 64 * 64;

    float acc[D / 8][4];
    float s[BC / 8][4];
#pragma unroll
    for (int n = 0; n < BC / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    uint32_t pa[BC / 16][4];
    float row_max[2], row_sum[2];
    /* per unit */
    int wg_row0 = 0, rows[2] = {0, 0}, row_doc[2] = {0, 0};
    const int32_t *doc = nullptr;

    /* S = Q K^T of the tile in `stage`, issued and committed (not waited for). */
    auto issue_s = [&](int stage) {
        const bf16 *tK = sK + stage * BC * D;
#pragma unroll
        for (int kd = 0; kd < D / 16; kd++) {
            /* column block kd / 4, 32 bytes per k16 step inside it */
            uint64_t dq = wgmma_desc(wg_q + (kd / 4) * BR * 64 + (kd % 4) * 16, 16, 1024);
            uint64_t dk = wgmma_desc(tK + (kd / 4) * BC * 64 + (kd % 4) * 16, 16, 1024);
            wgmma_ss_m64n128_acc<E>(s, dq, dk, kd > 0);
        }
        wgmma_commit();
    };
    /* O += P V of the tile in `stage`: V is [keys][D], the B operand transposed: 16 keys (2048
     * bytes) per k16 step, column blocks BC * 128 bytes apart. Issued and committed. */
    auto issue_pv = [&](int stage) {
        const bf16 *tV = sV + stage * BC * D;
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint64_t dv = wgmma_desc(tV + kk * 16 * 64, BC * 128, 1024);
            if constexpr (D == 128)
                wgmma_rs_m64n128<E>(acc, pa[kk], dv);
            else
                wgmma_rs_m64n64<E>(acc, pa[kk], dv);
        }
        wgmma_commit();
    };
    /* Masks S of `tile` and turns it into unnormalized probabilities under the new running max;
     * returns through `correction` the factor that rescales what was accumulated under the old. */
    auto softmax = [&](int tile, int stage, float (&correction)[2]) {
        const int k0 = tile * BC;
        if (doc) {
            /* the key's document must be the row's; ids of 2 adjacent keys in one 8-byte load */
            const int32_t *key_doc = sKeyDoc + stage * BC + 2 * t4;
#pragma unroll
            for (int n = 0; n < BC / 8; n++) {
                int2 kd = *reinterpret_cast<const int2 *>(key_doc + n * 8);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = k0 + n * 8 + 2 * t4 + (e & 1), r = e >> 1;
                    bool visible = key <= rows[r] && key < T && ((e & 1) ? kd.y : kd.x) == row_doc[r];
                    if (!visible) s[n][e] = -INFINITY;
                }
            }
        } else if (k0 + BC - 1 > wg_row0 || k0 + BC > T) {
            /* causal and past-the-end keys: visible below a per-row limit */
            const int limit[2] = {min(rows[0] + 1, T) - k0 - 2 * t4, min(rows[1] + 1, T) - k0 - 2 * t4};
#pragma unroll
            for (int n = 0; n < BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (n * 8 + (e & 1) >= limit[e >> 1]) s[n][e] = -INFINITY;
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = row_max[r];
#pragma unroll
            for (int n = 0; n < BC / 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* while the row has seen no visible key its max is -inf: exponentiate against 0 */
            float base = mx == -INFINITY ? 0.0f : mx * p.scale_log2;
            correction[r] = exp2f(row_max[r] * p.scale_log2 - base); /* 0 at first */
            row_max[r] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < BC / 8; n++) {
                s[n][2 * r] = exp2f(fmaf(s[n][2 * r], p.scale_log2, -base));
                s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], p.scale_log2, -base));
                sum += s[n][2 * r] + s[n][2 * r + 1];
            }
            row_sum[r] = row_sum[r] * correction[r] + sum;
        }
    };
    /* P as E A fragments straight from S's accumulators. */
    auto pack_p = [&]() {
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            pa[kk][0] = pack16<E>(s[2 * kk][0], s[2 * kk][1]);
            pa[kk][1] = pack16<E>(s[2 * kk][2], s[2 * kk][3]);
            pa[kk][2] = pack16<E>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[kk][3] = pack16<E>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
    };

    /* Pingpong: the consumer warpgroups take turns to issue their MMAs (round robin, named barrier
     * BAR_TURN + cw of 256 threads: this warpgroup's sync and the previous one's arrive), so one's
     * softmax overlaps the others' matrix products. Every warpgroup takes n_tiles + 1 turns per unit
     * (dummy ones for tiles above its rows); the block's very last turn hands on to nobody. */
    int turn = 0, n_tiles = 0;
    bool last_unit = false;
    auto turn_begin = [&]() {
        if constexpr (PINGPONG) named_bar_sync(BAR_TURN + cw, 256);
    };
    auto turn_end = [&]() {
        if constexpr (PINGPONG)
            if (!(last_unit && turn == n_tiles && cw == CWGS - 1))
                named_bar_arrive(BAR_TURN + (cw + 1) % CWGS, 256);
        turn++;
    };
    if (PINGPONG && cw == 0) named_bar_arrive(BAR_TURN, 256); /* the first turn is warpgroup 0's */

    int it_base = 0; /* ring position of this unit's first tile */
    for (int k = 0; work_at(k) < n_work; k++) {
        const unit u = decode(work_at(k));
        last_unit = work_at(k + 1) >= n_work;
        const int first_tile = first_tile_of(k, u);
        n_tiles = u.last_tile - first_tile + 1;
        turn = 0;
        wg_row0 = u.q0 + cw * 64;
        rows[0] = wg_row0 + warp * 16 + g;
        rows[1] = rows[0] + 8;
        doc = p.doc_ids ? p.doc_ids + (int64_t)u.b * T : nullptr;
        if (doc)
            for (int r = 0; r < 2; r++) row_doc[r] = doc[rows[r] < T ? rows[r] : T - 1];
        /* the tiles this warpgroup computes: a prefix of the unit's (later ones lie above its rows) */
        const int wg_last_tile = (wg_row0 + 63) / BC < u.last_tile ? (wg_row0 + 63) / BC : u.last_tile;
        const int n_wg = wg_last_tile - first_tile + 1;
#pragma unroll
        for (int n = 0; n < D / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        row_max[0] = row_max[1] = -INFINITY;
        row_sum[0] = row_sum[1] = 0.0f;

        mbar_wait_or_exit(q_full, k & 1);
        float correction[2];
        /* tile 0 of this warpgroup: S, softmax, P (O is still zero: nothing to rescale) */
        {
            const int stage = it_base % STAGES;
            mbar_wait_or_exit(&full[stage], (it_base / STAGES) & 1);
            turn_begin();
            wgmma_fence();
            issue_s(stage);
            turn_end();
            wgmma_wait<0>();
            wgmma_fence_operands(s);
            if (n_wg == 1) mbar_arrive(q_empty); /* its last S: Q may be replaced */
            softmax(first_tile, stage, correction);
            pack_p();
        }
        for (int i = 1; i < n_wg; i++) {
            const int it = it_base + i, stage = it % STAGES, prev = (it - 1) % STAGES;
            mbar_wait_or_exit(&full[stage], (it / STAGES) & 1);
            turn_begin();
            wgmma_fence(); /* P and the rescaled O, written by this thread, before the MMAs read them */
            issue_s(stage);
            issue_pv(prev);
            turn_end();
            wgmma_wait<1>(); /* S of this tile; P V of the previous one still runs */
            wgmma_fence_operands(s);
            if (i == n_wg - 1) mbar_arrive(q_empty);
            softmax(first_tile + i, stage, correction);
            wgmma_wait<0>();
            wgmma_fence_operands(acc);
            /* ties the packing below to after the wait: P V was still reading the old fragments */
            wgmma_fence_operands(s);
            mbar_arrive(&empty[prev]);
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                acc[n][0] *= correction[0];
                acc[n][1] *= correction[0];
                acc[n][2] *= correction[1];
                acc[n][3] *= correction[1];
            }
            pack_p();
        }
        {
            const int last = (it_base + n_wg - 1) % STAGES;
            turn_begin();
            wgmma_fence();
            issue_pv(last);
            turn_end();
            wgmma_wait<0>();
            wgmma_fence_operands(acc);
            mbar_arrive(&empty[last]);
        }
        /* tiles above this warpgroup's rows: only hand their buffers back */
        for (int i = n_wg; i < n_tiles; i++) {
            const int it = it_base + i, stage = it % STAGES;
            mbar_wait_or_exit(&full[stage], (it / STAGES) & 1);
            mbar_arrive(&empty[stage]);
            turn_begin();
            turn_end();
        }
        it_base += n_tiles;

        /* O / sum and lse straight from registers (Q's shared memory already holds the next unit's) */
        const int64_t q_stride = (int64_t)p.heads * D;
        bf16 *o_base = p.o_out + ((int64_t)u.b * T * p.heads + u.h) * D;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float sum = row_sum[r];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const int row = rows[r];
            if (row >= T) continue;
            const float inv = 1.0f / sum;
            bf16 *out = o_base + (int64_t)row * q_stride;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<uint32_t *>(out + n * 8 + 2 * t4) =
                    pack16<E>(acc[n][2 * r] * inv, acc[n][2 * r + 1] * inv);
            if (t4 == 0) p.lse_out[((int64_t)u.b * p.heads + u.h) * T + row] = row_max[r] * p.scale + logf(sum);
        }
    }
#else
    (void)args;
    __trap(); /* built without sm_90a code: the host never launches this */
#endif
}

/* Tuning switches for measurements (docs/cuda.md), read at every launch:
 *   ZT_FLASH_SM90_HD64_WGS=2|3      consumer warpgroups at head dim 64 (2, the default: 128-row
 *                                   units; 3: 192-row units, FlashAttention-3's choice)
 *   ZT_FLASH_SM90_PINGPONG=0|1      the consumers' MMA turns (default 1)
 *   ZT_FLASH_SM90_PERSISTENT=0..9   0: one block per unit; 1 (default): one per SM walking units;
 *                                   2-9: at most that many blocks (tests of the persistent path on
 *                                   small shapes) */
struct sm90_tuning {
    int hd64_wgs, pingpong, persistent;
};

zt_status tuning_value(const char *name, int lo, int hi, int fallback, int *out)
{
    const char *e = getenv(name);
    if (!e || !e[0]) {
        *out = fallback;
        return ZT_OK;
    }
    if (e[0] < '0' || e[0] > '9' || e[1] || e[0] - '0' < lo || e[0] - '0' > hi)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "flash attention forward (wgmma): %s=%s: expected a value in %d..%d; "
                            "unset it for the default (%d)", name, e, lo, hi, fallback);
    *out = e[0] - '0';
    return ZT_OK;
}

zt_status read_tuning(sm90_tuning *t)
{
    zt_status st;
    if ((st = tuning_value("ZT_FLASH_SM90_HD64_WGS", 2, 3, 2, &t->hd64_wgs)) != ZT_OK ||
        (st = tuning_value("ZT_FLASH_SM90_PINGPONG", 0, 1, 1, &t->pingpong)) != ZT_OK ||
        (st = tuning_value("ZT_FLASH_SM90_PERSISTENT", 0, 9, 1, &t->persistent)) != ZT_OK)
        return st;
    return ZT_OK;
}

/* A [batch][seq][heads][dim] TMA view as zt_hopper_tensor_map_bthd makes it (boxes of box_rows x 64
 * columns, 128-byte swizzle), with the data type of E: FLOAT16 for fp16 (TMA only copies; the type
 * names the element size, and keeps the map honest about what it reads). */
template <typename E>
zt_status tensor_map_bthd(CUtensorMap *map, const char *what, const void *base, int64_t batch, int64_t seq,
                          int64_t heads, int64_t dim, int box_rows)
{
    if constexpr (!std::is_same<E, f16>::value) {
        return zt_hopper_tensor_map_bthd(map, what, base, batch, seq, heads, dim, box_rows, 64);
    } else {
        if (batch <= 0 || seq <= 0 || heads <= 0 || dim <= 0 || box_rows <= 0)
            return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: TMA view of a [%lld][%lld][%lld][%lld] fp16 tensor: every "
                                "extent must be positive", what, (long long)batch, (long long)seq, (long long)heads,
                                (long long)dim);
        const uint64_t dims[4] = {(uint64_t)dim, (uint64_t)heads, (uint64_t)seq, (uint64_t)batch};
        const uint64_t strides[3] = {(uint64_t)dim * 2, (uint64_t)(heads * dim) * 2,
                                     (uint64_t)(seq * heads * dim) * 2};
        const uint32_t box[4] = {64, 1, (uint32_t)box_rows, 1};
        return zt_hopper_tensor_map(map, what, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, base, dims, strides, box, 128);
    }
}

template <typename E, int D, int CWGS, bool PINGPONG>
zt_status launch_forward_sm90(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params &p, int persistent)
{
    using S = sm90_fwd_shape<D, CWGS>;
    const char *what = "flash attention forward (wgmma)";
    zt_status st = flash_prepare(ctx, what, flash_forward_sm90_kernel<E, D, CWGS, PINGPONG>, S::SMEM);
    if (st != ZT_OK) return st;
    const int64_t n_work = (int64_t)((p.seq + S::BR - 1) / S::BR) * p.heads * p.batch;
    if (n_work > INT32_MAX)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED, "%s: %lld query tiles (batch x heads x seq / %d) exceed the "
                            "kernel's int32 work numbering; split the batch", what, (long long)n_work, S::BR);
    sm90_fwd_args args;
    memset(&args, 0, sizeof args);
    args.p = p;
    if ((st = tensor_map_bthd<E>(&args.tq, "flash attention forward (wgmma), q", p.q, p.batch, p.seq, p.heads, D,
                                 S::BR)) != ZT_OK ||
        (st = tensor_map_bthd<E>(&args.tk, "flash attention forward (wgmma), k", p.k, p.batch, p.seq, p.kv_heads,
                                 D, S::BC)) != ZT_OK ||
        (st = tensor_map_bthd<E>(&args.tv, "flash attention forward (wgmma), v", p.v, p.batch, p.seq, p.kv_heads,
                                 D, S::BC)) != ZT_OK)
        return st;
    /* Persistent: one block per SM walking units, so one unit's loads overlap the previous one's
     * work. With documents the first key tile of every (batch, query tile) is found first, into the
     * context's scratch (B x q_tiles ints); were the scratch too small, one block per unit searches
     * for its own. */
    const int q_tiles = (p.seq + S::BR - 1) / S::BR;
    int64_t blocks = n_work;
    const int64_t cap = persistent == 1 ? ctx->sm_count : persistent;
    bool walk = persistent && blocks > cap;
    if (walk && p.doc_ids) {
        const uint64_t bytes = (uint64_t)p.batch * q_tiles * sizeof(int);
        if (bytes <= zt_cuda_ctx_scratch_bytes(ctx)) {
            args.first_tiles = (const int *)zt_cuda_scratch(ctx, bytes, what);
            flash_first_tiles_kernel<S::BR, S::BC><<<dim3((unsigned)q_tiles, (unsigned)p.batch), 256, 0, stream>>>(
                p.doc_ids, p.seq, q_tiles, (int *)args.first_tiles);
            if ((st = zt_cuda_check_launch("flash attention forward (wgmma), first key tiles")) != ZT_OK) return st;
        }
        walk = args.first_tiles != nullptr;
    }
    if (walk) blocks = cap;
    flash_forward_sm90_kernel<E, D, CWGS, PINGPONG><<<(unsigned)blocks, S::THREADS, S::SMEM, stream>>>(args);
    return zt_cuda_check_launch(what);
}

template <typename E, int D, int CWGS>
zt_status launch_forward_sm90_pp(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params &p, const sm90_tuning &t)
{
    return t.pingpong ? launch_forward_sm90<E, D, CWGS, true>(ctx, stream, p, t.persistent)
                      : launch_forward_sm90<E, D, CWGS, false>(ctx, stream, p, t.persistent);
}

template <typename E>
zt_status launch_forward_sm90_dim(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params &p, int head_dim,
                                  const sm90_tuning &t)
{
    if (head_dim == 64)
        return t.hd64_wgs == 2 ? launch_forward_sm90_pp<E, 64, 2>(ctx, stream, p, t)
                               : launch_forward_sm90_pp<E, 64, 3>(ctx, stream, p, t);
    return launch_forward_sm90_pp<E, 128, 2>(ctx, stream, p, t);
}

} // namespace

int zt_cuda_flash_wgmma_built(void)
{
#ifdef ZT_FLASH_SM90A
    return 1;
#else
    return 0;
#endif
}

zt_status zt_flash_forward_wgmma(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params *p, int head_dim)
{
    if (!zt_cuda_flash_wgmma_built())
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "flash attention forward (wgmma): this build has no sm_90a code; configure "
                            "with 90 in CMAKE_CUDA_ARCHITECTURES, or set ZT_FLASH_KERNEL=mma");
    sm90_tuning t = {}; /* every field set by read_tuning; {} keeps -O3 GCC from guessing otherwise */
    zt_status st = read_tuning(&t);
    if (st != ZT_OK) return st;
    /* the context's 16-bit type (zt_cuda_ctx_set_dtype): q, k, v and o are bf16 or fp16 */
    ZT_DISPATCH16(ctx->dtype, E, return launch_forward_sm90_dim<E>(ctx, stream, *p, head_dim, t));
}
