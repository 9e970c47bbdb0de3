/* Flash attention backward for Hopper (sm_90a): the main kernel of flash_backward.cu on warpgroup
 * MMA (wgmma). flash_backward.cu runs the delta kernel before it and the dQ conversion after it, for
 * both kernels.
 *
 * A block owns BC = 128 keys of one (batch, kv head); each of its 2 warpgroups owns 64 keys and
 * accumulates their dK and dV (fp32) in registers. It walks every query head of the group and the
 * query tiles (BR = 64 rows) at or after its keys, Q, dO, lse, delta double-buffered with cp.async.
 * Per tile and warpgroup (keys as the M dimension, so dK and dV need no reduction):
 *   S^T  = K Q^T     wgmma SS m64n64, K and Q K-major in shared memory
 *   dP^T = V dO^T    wgmma SS m64n64 (issued with S^T, one wait for both)
 *   P^T = exp2(S^T scale log2e - lse log2e) masked; dS^T = P^T (dP^T - delta)
 *   dV += P^T dO     wgmma RS m64nD, P^T from registers, dO read transposed (MN-major)
 *   dK += dS^T Q     wgmma RS m64nD (issued with dV)
 * dS^T (bf16) goes to shared memory (128B-swizzled [BC][BR]) for dQ = dS K, read with both operands
 * transposed: D = 128, each warpgroup takes 64 of dQ's columns over all 128 keys; D = 64, each
 * takes its own 64 keys for all columns. The result is added to the fp32 dQ accumulator with 16-byte
 * atomics (their order varies, so dQ can differ in the last bits between runs; dK, dV are exact).
 */
#include <math.h>
#include "cuda/flash_kernel.h"
#include "cuda/flash_wgmma.cuh"

namespace {

constexpr int BC = 128, BR = 64, THREADS = 256;

template <int D>
struct bwd_sm90_shape {
    static constexpr size_t KV_BYTES = (size_t)BC * D * 2, QT_BYTES = (size_t)BR * D * 2;
    static constexpr size_t DS_BYTES = (size_t)BC * BR * 2;
    /* K, V, Q[2], dO[2], dS^T, then lse, delta, query doc [2][BR] each and 2 ints; 1024 bytes of
     * slack for the alignment the swizzled tiles need */
    static constexpr size_t SMEM = 1024 + 2 * KV_BYTES + 4 * QT_BYTES + DS_BYTES + 3 * 2 * BR * 4 + 16;
};

template <int D>
__global__ void __launch_bounds__(THREADS, 1) flash_backward_sm90_kernel(const flash_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = bwd_sm90_shape<D>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    bf16 *sK = reinterpret_cast<bf16 *>(smem);
    bf16 *sV = reinterpret_cast<bf16 *>(smem + S::KV_BYTES);
    bf16 *sQ = reinterpret_cast<bf16 *>(smem + 2 * S::KV_BYTES);                    /* [2][BR * D] */
    bf16 *sdO = reinterpret_cast<bf16 *>(smem + 2 * S::KV_BYTES + 2 * S::QT_BYTES); /* [2][BR * D] */
    bf16 *sdS = reinterpret_cast<bf16 *>(smem + 2 * S::KV_BYTES + 4 * S::QT_BYTES); /* [BC][BR] */
    float *sLse = reinterpret_cast<float *>(smem + 2 * S::KV_BYTES + 4 * S::QT_BYTES + S::DS_BYTES);
    float *sDelta = sLse + 2 * BR;                                     /* [2][BR] */
    int32_t *sQueryDoc = reinterpret_cast<int32_t *>(sDelta + 2 * BR); /* [2][BR] */
    int *key_doc_range = reinterpret_cast<int *>(sQueryDoc + 2 * BR);  /* min, max */

    const int T = p.seq, tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int k0 = blockIdx.x * BC, kv_head = blockIdx.y, b = blockIdx.z;
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

    /* Work items: (query head of the group, query tile at or after this key tile). */
    const int n_q_tiles = (T + BR - 1) / BR, first_q_tile = k0 / BR;
    const int tiles_per_head = n_q_tiles - first_q_tile;
    const int n_items = p.group * tiles_per_head;
    auto next_item = [&](int item) {
        if (!doc) return item;
        const int doc_min = key_doc_range[0], doc_max = key_doc_range[1];
        for (; item < n_items; item++) {
            int q = (first_q_tile + item % tiles_per_head) * BR + tid;
            int hit = tid < BR && q < T && doc[q] >= doc_min && doc[q] <= doc_max;
            if (__syncthreads_or(hit)) break;
        }
        return item;
    };
    auto load_item = [&](int item, int buf) {
        int h = kv_head * p.group + item / tiles_per_head;
        int q0 = (first_q_tile + item % tiles_per_head) * BR;
        int64_t head_offset = ((int64_t)b * T * p.heads + h) * D;
        sw128_load_async<BR, D, THREADS>(sQ + buf * BR * D, p.q + head_offset, q_stride, q0, T, tid);
        sw128_load_async<BR, D, THREADS>(sdO + buf * BR * D, p.dout + head_offset, q_stride, q0, T, tid);
        if (tid < BR) {
            int q = q0 + tid;
            int64_t row = ((int64_t)b * p.heads + h) * T + q;
            sLse[buf * BR + tid] = q < T ? p.lse[row] * 1.4426950408889634f : 0.0f;
            sDelta[buf * BR + tid] = q < T ? p.delta[row] : 0.0f;
            sQueryDoc[buf * BR + tid] = doc && q < T ? doc[q] : INT32_MIN;
        }
    };

    sw128_load_async<BC, D, THREADS>(sK, k_base, kv_stride, k0, T, tid);
    sw128_load_async<BC, D, THREADS>(sV, v_base, kv_stride, k0, T, tid);
    int item = next_item(0);
    if (item < n_items) load_item(item, 0);
    cp_async_commit();

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    /* this warpgroup's 64 key rows of K and V (1024-byte aligned in each column block) */
    const bf16 *wg_k = sK + wg * 64 * 64, *wg_v = sV + wg * 64 * 64;

    for (int buf = 0; item < n_items; buf ^= 1) {
        const int next = next_item(item + 1);
        if (next < n_items) load_item(next, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        fence_proxy_async_shared(); /* this thread's cp.async data, before wgmma reads it */
        __syncthreads();

        const int h = kv_head * p.group + item / tiles_per_head;
        const int q0 = (first_q_tile + item % tiles_per_head) * BR;
        const bf16 *tQ = sQ + buf * BR * D, *tdO = sdO + buf * BR * D;
        const float *tLse = sLse + buf * BR, *tDelta = sDelta + buf * BR;
        const int32_t *tDoc = sQueryDoc + buf * BR;
        const bool active = q0 + BR - 1 >= wg_key0; /* warpgroup-uniform: some query sees some key */

        if (active) {
            float s[BR / 8][4], dp[BR / 8][4];
#pragma unroll
            for (int n = 0; n < BR / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
            wgmma_fence();
#pragma unroll
            for (int kd = 0; kd < D / 16; kd++) {
                const int off_kv = (kd / 4) * BC * 64 + (kd % 4) * 16, off_q = (kd / 4) * BR * 64 + (kd % 4) * 16;
                wgmma_ss_m64n64(s, wgmma_desc(wg_k + off_kv, 16, 1024), wgmma_desc(tQ + off_q, 16, 1024));
            }
#pragma unroll
            for (int kd = 0; kd < D / 16; kd++) {
                const int off_kv = (kd / 4) * BC * 64 + (kd % 4) * 16, off_q = (kd / 4) * BR * 64 + (kd % 4) * 16;
                wgmma_ss_m64n64(dp, wgmma_desc(wg_v + off_kv, 16, 1024), wgmma_desc(tdO + off_q, 16, 1024));
            }
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands(s);
            wgmma_fence_operands(dp);

            /* P^T = exp2(S^T scale log2e - lse log2e), 0 where the mask hides the pair; then
             * dS^T = P^T (dP^T - delta). Both packed to bf16 A fragments (P^T, dS^T: keys x queries) */
            const bool need_mask = q0 < wg_key0 + 63 || doc || q0 + BR > T || wg_key0 + 64 > T;
            uint32_t pa[BR / 16][4], da[BR / 16][4];
#pragma unroll
            for (int n = 0; n < BR / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int q_local = n * 8 + 2 * t4 + (e & 1), q = q0 + q_local, r = e >> 1;
                    bool visible = !need_mask || (q >= keys[r] && q < T && keys[r] < T &&
                                                  (!doc || tDoc[q_local] == key_doc[r]));
                    s[n][e] = visible ? exp2f(fmaf(s[n][e], p.scale_log2, -tLse[q_local])) : 0.0f;
                }
            }
#pragma unroll
            for (int kq = 0; kq < BR / 16; kq++) {
                pa[kq][0] = pack_bf16(s[2 * kq][0], s[2 * kq][1]);
                pa[kq][1] = pack_bf16(s[2 * kq][2], s[2 * kq][3]);
                pa[kq][2] = pack_bf16(s[2 * kq + 1][0], s[2 * kq + 1][1]);
                pa[kq][3] = pack_bf16(s[2 * kq + 1][2], s[2 * kq + 1][3]);
            }
            /* dS from the bf16-rounded P, as the mma.sync backward does */
#pragma unroll
            for (int n = 0; n < BR / 8; n++) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    uint32_t packed = pa[n / 2][(n % 2) * 2 + r];
                    float2 prob = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&packed));
                    int q_local = n * 8 + 2 * t4;
                    dp[n][2 * r] = prob.x * (dp[n][2 * r] - tDelta[q_local]);
                    dp[n][2 * r + 1] = prob.y * (dp[n][2 * r + 1] - tDelta[q_local + 1]);
                }
            }
#pragma unroll
            for (int kq = 0; kq < BR / 16; kq++) {
                da[kq][0] = pack_bf16(dp[2 * kq][0], dp[2 * kq][1]);
                da[kq][1] = pack_bf16(dp[2 * kq][2], dp[2 * kq][3]);
                da[kq][2] = pack_bf16(dp[2 * kq + 1][0], dp[2 * kq + 1][1]);
                da[kq][3] = pack_bf16(dp[2 * kq + 1][2], dp[2 * kq + 1][3]);
            }
            /* dS^T to shared memory for dQ ([BC][BR], one column block). Before the products: the
             * registers of a wgmma's A operand must not be touched until it completes */
#pragma unroll
            for (int kq = 0; kq < BR / 16; kq++) {
                int col = kq * 16 + 2 * t4;
                *reinterpret_cast<uint32_t *>(sdS + sw128_offset<BC>(key_row, col)) = da[kq][0];
                *reinterpret_cast<uint32_t *>(sdS + sw128_offset<BC>(key_row + 8, col)) = da[kq][1];
                *reinterpret_cast<uint32_t *>(sdS + sw128_offset<BC>(key_row, col + 8)) = da[kq][2];
                *reinterpret_cast<uint32_t *>(sdS + sw128_offset<BC>(key_row + 8, col + 8)) = da[kq][3];
            }
            /* dV += P^T dO, dK += dS^T Q: dO and Q [queries][D] read transposed, 16 queries (2048
             * bytes) per k16 step, column blocks BR * 128 bytes apart */
            wgmma_fence();
#pragma unroll
            for (int kq = 0; kq < BR / 16; kq++) {
                uint64_t d_do = wgmma_desc(tdO + kq * 16 * 64, BR * 128, 1024);
                if constexpr (D == 128)
                    wgmma_rs_m64n128(dv, pa[kq], d_do);
                else
                    wgmma_rs_m64n64(dv, pa[kq], d_do);
            }
#pragma unroll
            for (int kq = 0; kq < BR / 16; kq++) {
                uint64_t d_q = wgmma_desc(tQ + kq * 16 * 64, BR * 128, 1024);
                if constexpr (D == 128)
                    wgmma_rs_m64n128(dk, da[kq], d_q);
                else
                    wgmma_rs_m64n64(dk, da[kq], d_q);
            }
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands(dv);
            wgmma_fence_operands(dk);
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
#pragma unroll
            for (int n = 0; n < 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < KEYS / 16; kk++)
                wgmma_ss_m64n64_tt(dq, wgmma_desc(a_base + kk * 16 * 64, 64 * 128, 1024),
                                   wgmma_desc(b_base + kk * 16 * 64, BC * 128, 1024));
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands(dq);
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
        __syncthreads(); /* dS^T and this buffer are rewritten next */
        item = next;
    }
    cp_async_wait<0>(); /* nothing may be left in flight when no item was active */

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
                pack_bf16(dk[n][2 * r] * p.scale, dk[n][2 * r + 1] * p.scale);
            *reinterpret_cast<uint32_t *>(dv_row + col) = pack_bf16(dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
#else
    (void)p;
    __trap(); /* built without sm_90a code: the host never launches this */
#endif
}

template <int D>
zt_status launch_backward_sm90(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params &p, int launch)
{
    constexpr size_t smem = bwd_sm90_shape<D>::SMEM;
    zt_status st = flash_prepare(ctx, "flash attention backward (wgmma)", flash_backward_sm90_kernel<D>, smem);
    if (st != ZT_OK || !launch) return st;
    dim3 grid((unsigned)((p.seq + BC - 1) / BC), (unsigned)p.kv_heads, (unsigned)p.batch);
    flash_backward_sm90_kernel<D><<<grid, THREADS, smem, stream>>>(p);
    return zt_cuda_check_launch("flash attention backward (wgmma)");
}

} // namespace

zt_status zt_flash_backward_wgmma(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params *p, int head_dim,
                                  int launch)
{
    if (!zt_cuda_flash_wgmma_built())
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "flash attention backward (wgmma): this build has no sm_90a code; configure "
                            "with 90 in CMAKE_CUDA_ARCHITECTURES, or set ZT_FLASH_KERNEL=mma");
    return head_dim == 64 ? launch_backward_sm90<64>(ctx, stream, *p, launch)
                          : launch_backward_sm90<128>(ctx, stream, *p, launch);
}
