/* Flash attention backward (the FlashAttention-2 algorithm) on bf16 or fp16 tensor cores (templated on
 * the element type E, the context's dtype; see flash_common.cuh).
 *
 * With P = exp(scale S - lse) recomputed from the forward's log-sum-exp and delta_i = dO_i . O_i:
 *   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - delta),  dQ = scale dS K,  dK = scale dS^T Q.
 *
 * A block owns BC = 128 keys of one (batch, kv head); each of its 8 warps owns 16 of them and
 * accumulates their dK and dV (fp32) in registers. It walks every query head of the group and, for
 * each, the query tiles (BR = 64 rows) at or after its keys (causal), double-buffering Q, dO, lse
 * and delta with cp.async. Per tile a warp computes its slice of S^T = K Q^T and dP^T = V dO^T
 * directly (keys as rows, so dK and dV need no cross-warp reduction), then dV += P^T dO and
 * dK += dS^T Q from registers. dQ needs a sum over all keys: dS^T goes through shared memory, the 8
 * warps compute the tile's dQ = dS K together and add it to an fp32 accumulator in global memory
 * with atomics (their order varies, so dQ can differ in the last bits between runs).
 * Summing dK, dV over the query heads of a group inside the block means grouped-query attention
 * never materializes per-query-head K/V gradients.
 *
 * Around it: a kernel for delta (and zeroing the dQ accumulator) before, and one converting the
 * accumulator to dQ (E) after.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include "cuda/flash_common.cuh"
#include "cuda/flash_kernel.h"

namespace {

constexpr int BC = 128, BR = 64, WARPS = 8, THREADS = WARPS * 32;

template <int D>
constexpr size_t backward_smem_bytes()
{
    /* K, V; Q, dO double-buffered; dS^T; lse, delta, query doc double-buffered */
    return (size_t)(2 * BC * D + 4 * BR * D + BC * BR) * sizeof(bf16) + 3 * 2 * BR * sizeof(float);
}

template <typename E, int D>
__global__ void __launch_bounds__(THREADS, 1) flash_backward_kernel(const flash_params p)
{
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(smem);
    bf16 *sV = sK + BC * D;
    bf16 *sQ = sV + BC * D;     /* [2][BR * D] */
    bf16 *sdO = sQ + 2 * BR * D; /* [2][BR * D] */
    bf16 *sdS = sdO + 2 * BR * D; /* [BC][BR]: dS^T, keys as rows */
    float *sLse = reinterpret_cast<float *>(sdS + BC * BR); /* [2][BR], times log2(e) */
    float *sDelta = sLse + 2 * BR;                         /* [2][BR] */
    int32_t *sQueryDoc = reinterpret_cast<int32_t *>(sDelta + 2 * BR); /* [2][BR] */
    __shared__ int key_doc_min, key_doc_max;

    const int T = p.seq, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int k0 = blockIdx.x * BC, kv_head = blockIdx.y, b = blockIdx.z;
    const int64_t q_stride = (int64_t)p.heads * D, kv_stride = (int64_t)p.kv_heads * D;
    const bf16 *k_base = p.k + ((int64_t)b * T * p.kv_heads + kv_head) * D;
    const bf16 *v_base = p.v + ((int64_t)b * T * p.kv_heads + kv_head) * D;
    const int32_t *doc = p.doc_ids ? p.doc_ids + (int64_t)b * T : nullptr;

    const auto rows_first = ldmatrix_offsets<D>::rows_first(lane);
    const auto columns_first = ldmatrix_offsets<D>::columns_first(lane);
    const auto ds_columns_first = ldmatrix_offsets<BR>::columns_first(lane);
    const int warp_key0 = k0 + warp * 16;
    const int keys[2] = {warp_key0 + g, warp_key0 + g + 8}; /* the two key rows of this thread */
    int key_doc[2] = {0, 0};
    if (doc) {
        key_doc[0] = doc[keys[0] < T ? keys[0] : T - 1];
        key_doc[1] = doc[keys[1] < T ? keys[1] : T - 1];
        if (tid == 0) {
            key_doc_min = INT32_MAX;
            key_doc_max = INT32_MIN;
        }
        __syncthreads();
        if (tid < BC && k0 + tid < T) {
            atomicMin(&key_doc_min, doc[k0 + tid]);
            atomicMax(&key_doc_max, doc[k0 + tid]);
        }
        __syncthreads();
    }

    /* Work items: (query head of the group, query tile at or after this key tile). */
    const int n_q_tiles = (T + BR - 1) / BR, first_q_tile = k0 / BR;
    const int tiles_per_head = n_q_tiles - first_q_tile;
    const int n_items = p.group * tiles_per_head;
    /* The next item at or after `item` whose queries can see a document of these keys. */
    auto next_item = [&](int item) {
        if (!doc) return item;
        for (; item < n_items; item++) {
            int q = (first_q_tile + item % tiles_per_head) * BR + tid;
            int hit = tid < BR && q < T && doc[q] >= key_doc_min && doc[q] <= key_doc_max;
            if (__syncthreads_or(hit)) break;
        }
        return item;
    };
    auto load_item = [&](int item, int buf) {
        int h = kv_head * p.group + item / tiles_per_head;
        int q0 = (first_q_tile + item % tiles_per_head) * BR;
        int64_t head_offset = ((int64_t)b * T * p.heads + h) * D;
        load_tile_async<BR, D, THREADS>(sQ + buf * BR * D, p.q + head_offset, q_stride, q0, T);
        load_tile_async<BR, D, THREADS>(sdO + buf * BR * D, p.dout + head_offset, q_stride, q0, T);
        if (tid < BR) {
            int q = q0 + tid;
            int64_t row = ((int64_t)b * p.heads + h) * T + q;
            sLse[buf * BR + tid] = q < T ? p.lse[row] * 1.4426950408889634f : 0.0f;
            sDelta[buf * BR + tid] = q < T ? p.delta[row] : 0.0f;
            sQueryDoc[buf * BR + tid] = doc && q < T ? doc[q] : INT32_MIN;
        }
    };

    load_tile_async<BC, D, THREADS>(sK, k_base, kv_stride, k0, T);
    load_tile_async<BC, D, THREADS>(sV, v_base, kv_stride, k0, T);
    int item = next_item(0);
    if (item < n_items) load_item(item, 0);
    cp_async_commit();

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    for (int buf = 0; item < n_items; buf ^= 1) {
        const int next = next_item(item + 1);
        if (next < n_items) load_item(next, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();

        const int h = kv_head * p.group + item / tiles_per_head;
        const int q0 = (first_q_tile + item % tiles_per_head) * BR;
        const bf16 *tQ = sQ + buf * BR * D, *tdO = sdO + buf * BR * D;
        const float *tLse = sLse + buf * BR, *tDelta = sDelta + buf * BR;
        const int32_t *tDoc = sQueryDoc + buf * BR;

        if (q0 + BR - 1 >= warp_key0) { /* some query of the tile may see some key of the warp */
            /* S^T = K Q^T: 16 keys x BR queries */
            /* (The kd loops stay rolled: unrolled, the compiler hoists fragments and spills.) */
            float s[BR / 8][4];
#pragma unroll
            for (int n = 0; n < BR / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 1
            for (int kd = 0; kd < D / 16; kd++) {
                uint32_t ka[4];
                ldmatrix_x4(ka, rows_first.at_dynamic(sK, warp * 16, kd * 16));
#pragma unroll
                for (int np = 0; np < BR / 16; np++) {
                    uint32_t qb[4];
                    ldmatrix_x4(qb, columns_first.at_dynamic(tQ, np * 16, kd * 16));
                    mma16<E>(s[2 * np], ka, qb[0], qb[1]);
                    mma16<E>(s[2 * np + 1], ka, qb[2], qb[3]);
                }
            }
            /* P^T = exp(scale S^T - lse), 0 where the mask hides the pair */
            const bool need_mask = q0 < warp_key0 + 15 || doc || q0 + BR > T || warp_key0 + 16 > T;
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
            /* dV += P^T dO. P stays packed in E (the precision dS is rounded to anyway): it
             * frees 16 registers for the dP^T accumulators. */
            uint32_t pa[BR / 16][4];
#pragma unroll
            for (int kq = 0; kq < BR / 16; kq++) {
                pa[kq][0] = pack16<E>(s[2 * kq][0], s[2 * kq][1]);
                pa[kq][1] = pack16<E>(s[2 * kq][2], s[2 * kq][3]);
                pa[kq][2] = pack16<E>(s[2 * kq + 1][0], s[2 * kq + 1][1]);
                pa[kq][3] = pack16<E>(s[2 * kq + 1][2], s[2 * kq + 1][3]);
#pragma unroll
                for (int np = 0; np < D / 16; np++) {
                    uint32_t ob[4];
                    ldmatrix_x4_trans(ob, rows_first.at(tdO, kq * 16, np * 16));
                    mma16<E>(dv[2 * np], pa[kq], ob[0], ob[1]);
                    mma16<E>(dv[2 * np + 1], pa[kq], ob[2], ob[3]);
                }
            }
            /* dP^T = V dO^T, then dS^T = P^T (dP^T - delta) in place */
            float ds[BR / 8][4];
#pragma unroll
            for (int n = 0; n < BR / 8; n++) ds[n][0] = ds[n][1] = ds[n][2] = ds[n][3] = 0.0f;
#pragma unroll 1
            for (int kd = 0; kd < D / 16; kd++) {
                uint32_t va[4];
                ldmatrix_x4(va, rows_first.at_dynamic(sV, warp * 16, kd * 16));
#pragma unroll
                for (int np = 0; np < BR / 16; np++) {
                    uint32_t ob[4];
                    ldmatrix_x4(ob, columns_first.at_dynamic(tdO, np * 16, kd * 16));
                    mma16<E>(ds[2 * np], va, ob[0], ob[1]);
                    mma16<E>(ds[2 * np + 1], va, ob[2], ob[3]);
                }
            }
#pragma unroll
            for (int n = 0; n < BR / 8; n++) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    uint32_t packed = pa[n / 2][(n % 2) * 2 + r];
                    float2 prob = unpack16<E>(packed);
                    int q_local = n * 8 + 2 * t4;
                    ds[n][2 * r] = prob.x * (ds[n][2 * r] - tDelta[q_local]);
                    ds[n][2 * r + 1] = prob.y * (ds[n][2 * r + 1] - tDelta[q_local + 1]);
                }
            }
            /* dK += dS^T Q (scaled at the end); dS^T to shared memory for dQ */
#pragma unroll
            for (int kq = 0; kq < BR / 16; kq++) {
                uint32_t da[4] = {pack16<E>(ds[2 * kq][0], ds[2 * kq][1]),
                                  pack16<E>(ds[2 * kq][2], ds[2 * kq][3]),
                                  pack16<E>(ds[2 * kq + 1][0], ds[2 * kq + 1][1]),
                                  pack16<E>(ds[2 * kq + 1][2], ds[2 * kq + 1][3])};
#pragma unroll
                for (int np = 0; np < D / 16; np++) {
                    uint32_t qb[4];
                    ldmatrix_x4_trans(qb, rows_first.at(tQ, kq * 16, np * 16));
                    mma16<E>(dk[2 * np], da, qb[0], qb[1]);
                    mma16<E>(dk[2 * np + 1], da, qb[2], qb[3]);
                }
                int row = warp * 16 + g, col = kq * 16 + 2 * t4;
                *reinterpret_cast<uint32_t *>(sdS + swizzle<BR>(row, col)) = da[0];
                *reinterpret_cast<uint32_t *>(sdS + swizzle<BR>(row + 8, col)) = da[1];
                *reinterpret_cast<uint32_t *>(sdS + swizzle<BR>(row, col + 8)) = da[2];
                *reinterpret_cast<uint32_t *>(sdS + swizzle<BR>(row + 8, col + 8)) = da[3];
            }
        } else { /* every query of the tile is before this warp's keys: dS^T = 0 */
#pragma unroll
            for (int kq = 0; kq < BR / 16; kq++) {
                int row = warp * 16 + g, col = kq * 16 + 2 * t4;
                *reinterpret_cast<uint32_t *>(sdS + swizzle<BR>(row, col)) = 0u;
                *reinterpret_cast<uint32_t *>(sdS + swizzle<BR>(row + 8, col)) = 0u;
                *reinterpret_cast<uint32_t *>(sdS + swizzle<BR>(row, col + 8)) = 0u;
                *reinterpret_cast<uint32_t *>(sdS + swizzle<BR>(row + 8, col + 8)) = 0u;
            }
        }
        __syncthreads();

        /* dQ (BR x D) += dS K: warp w takes rows 16 (w % 4) and half (w / 4) of the columns */
        {
            constexpr int HALF = D / 2;
            const int row0 = (warp % 4) * 16, col0 = (warp / 4) * HALF;
            float dq[HALF / 8][4];
#pragma unroll
            for (int n = 0; n < HALF / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                uint32_t a[4];
                ldmatrix_x4_trans(a, ds_columns_first.at_dynamic(sdS, kk * 16, row0));
#pragma unroll
                for (int np = 0; np < HALF / 16; np++) {
                    uint32_t kb[4];
                    ldmatrix_x4_trans(kb, rows_first.at_dynamic(sK, kk * 16, col0 + np * 16));
                    mma16<E>(dq[2 * np], a, kb[0], kb[1]);
                    mma16<E>(dq[2 * np + 1], a, kb[2], kb[3]);
                }
            }
            float *dq_base = p.dq_accum + ((int64_t)b * T * p.heads + h) * D;
#if __CUDA_ARCH__ >= 900
            /* 16-byte atomics (sm_90): lanes t and t^1 swap halves so that an even lane holds 4
             * consecutive columns of row g and an odd lane 4 of row g + 8: a quarter of the
             * atomic operations. */
            const int odd = t4 & 1, q = q0 + row0 + g + 8 * odd;
            float *out = dq_base + (int64_t)q * q_stride + col0 + 2 * (t4 & ~1);
#pragma unroll
            for (int n = 0; n < HALF / 8; n++) {
                float send0 = odd ? dq[n][0] : dq[n][2], send1 = odd ? dq[n][1] : dq[n][3];
                float recv0 = __shfl_xor_sync(0xffffffffu, send0, 1);
                float recv1 = __shfl_xor_sync(0xffffffffu, send1, 1);
                float4 v = odd ? make_float4(recv0, recv1, dq[n][2], dq[n][3])
                               : make_float4(dq[n][0], dq[n][1], recv0, recv1);
                if (q < T) atomicAdd(reinterpret_cast<float4 *>(out + n * 8), v);
            }
#else
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int q = q0 + row0 + g + 8 * r;
                if (q >= T) continue;
                float *out = dq_base + (int64_t)q * q_stride + col0 + 2 * t4;
#pragma unroll
                for (int n = 0; n < HALF / 8; n++) {
                    atomicAdd(out + n * 8, dq[n][2 * r]);
                    atomicAdd(out + n * 8 + 1, dq[n][2 * r + 1]);
                }
            }
#endif
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
                pack16<E>(dk[n][2 * r] * p.scale, dk[n][2 * r + 1] * p.scale);
            *reinterpret_cast<uint32_t *>(dv_row + col) = pack16<E>(dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
}

/* delta[b,h,t] = dO . O over the head dimension, one warp per (b, t, h) row. */
template <typename E, int D>
__global__ void flash_delta_kernel(const flash_params p)
{
    int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; /* (b*T + t)*H + h */
    int lane = threadIdx.x % 32;
    int64_t rows = (int64_t)p.batch * p.seq * p.heads;
    if (row >= rows) return;
    float sum = 0.0f;
    if constexpr (std::is_same<E, f16>::value) {
        const __half2 *o = reinterpret_cast<const __half2 *>(p.o + row * D);
        const __half2 *d = reinterpret_cast<const __half2 *>(p.dout + row * D);
#pragma unroll
        for (int i = lane; i < D / 2; i += 32) {
            float2 a = __half22float2(o[i]), c = __half22float2(d[i]);
            sum += a.x * c.x + a.y * c.y;
        }
    } else {
        const __nv_bfloat162 *o = reinterpret_cast<const __nv_bfloat162 *>(p.o + row * D);
        const __nv_bfloat162 *d = reinterpret_cast<const __nv_bfloat162 *>(p.dout + row * D);
#pragma unroll
        for (int i = lane; i < D / 2; i += 32) {
            float2 a = __bfloat1622float2(o[i]), c = __bfloat1622float2(d[i]);
            sum += a.x * c.x + a.y * c.y;
        }
    }
    sum = zt_warp_sum(sum);
    if (lane == 0) {
        int64_t h = row % p.heads, bt = row / p.heads, t = bt % p.seq, b = bt / p.seq;
        p.delta[(b * p.heads + h) * p.seq + t] = sum;
    }
}

/* dK, dV of the wgmma backward with the group split over several blocks: the fp32 partial sums
 * [2][split][rows][D] added in split order (deterministic), dK scaled, to E. 4 columns a thread. */
template <typename E>
__global__ void flash_dkv_reduce_kernel(int64_t n4, int split, const float *partial, float scale, bf16 *dk,
                                        bf16 *dv)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < 2 * n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int which = i >= n4; /* 0: dK, 1: dV */
        const int64_t j = i - which * n4;
        const float4 *src = reinterpret_cast<const float4 *>(partial) + which * split * n4 + j;
        float4 sum = src[0];
        for (int sp = 1; sp < split; sp++) {
            float4 v = src[sp * n4];
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        const float mult = which ? 1.0f : scale;
        uint2 out = make_uint2(pack16<E>(sum.x * mult, sum.y * mult), pack16<E>(sum.z * mult, sum.w * mult));
        reinterpret_cast<uint2 *>(which ? dv : dk)[j] = out;
    }
}

template <typename E>
__global__ void flash_dq_kernel(int64_t n, const float *dq_accum, float scale, bf16 *dq)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        reinterpret_cast<E *>(dq)[i] = zt_from_f32<E>(dq_accum[i] * scale);
}

/* The same from the bulk layout of the wgmma kernel: dq_accum [B][H][D/64][Tp][64] (Tp = T rounded
 * up to 64), 16-byte chunk c of row t at c ^ (t % 8). One 4-column chunk a thread. */
template <typename E, int D>
__global__ void flash_dq_bulk_kernel(flash_params p)
{
    const int T = p.seq, H = p.heads;
    const int64_t tp = (T + 63) / 64 * 64, n4 = (int64_t)p.batch * T * H * (D / 4);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int d4 = (int)(i % (D / 4));
        const int64_t bth = i / (D / 4), h = bth % H, bt = bth / H, t = bt % T, b = bt / T;
        const float4 v = *reinterpret_cast<const float4 *>(
            p.dq_accum + (((b * H + h) * (D / 64) + d4 / 16) * tp + t) * 64 + (((d4 % 16) ^ (t % 8)) * 4));
        reinterpret_cast<uint2 *>(p.dq)[i] =
            make_uint2(pack16<E>(v.x * p.scale, v.y * p.scale), pack16<E>(v.z * p.scale, v.w * p.scale));
    }
}

/* The wgmma backward's split of a GQA group over blocks per key tile: the smallest divisor of the
 * group that gives at least 1.5 waves of blocks on 132 SMs (H100 SXM / H200; a function of the
 * shape alone, as the scratch size must be), or the caller's t->split (the flash plugin's
 * flash.backward_split), or ZT_FLASH_BACKWARD_SPLIT, which overrides both (a divisor of the group;
 * for tuning). Fewer blocks than SMs leave SMs idle; from about 2 waves on, heaviest-first order
 * balances the causal work by itself (measured on an H200 at the 1b model's shape, 256 blocks:
 * unsplit 0.52 ms, split in 2 0.55 ms), and a split costs fp32 dK/dV partial sums. Returns 0 for a
 * bad variable or t->split (message recorded unless quiet). */
int backward_split(const zt_cuda_attention_shape *s, const zt_cuda_flash_backward_tuning *t, bool quiet)
{
    const int64_t group = s->heads / s->kv_heads;
    const char *text = getenv("ZT_FLASH_BACKWARD_SPLIT");
    if (text && *text) {
        char *end;
        long v = strtol(text, &end, 10);
        if (*end || v < 1 || group % v != 0) {
            if (!quiet)
                zt_cuda_fail(ZT_ERR_INVALID_ARG,
                             "ZT_FLASH_BACKWARD_SPLIT=%s: expected a positive divisor of the GQA "
                             "group (heads / kv_heads = %lld); unset it for the automatic choice",
                             text, (long long)group);
            return 0;
        }
        return (int)v;
    }
    if (t && t->split > 0) {
        if (group % t->split != 0) {
            if (!quiet)
                zt_cuda_fail(ZT_ERR_INVALID_ARG,
                             "a backward split of %d blocks per key tile does not divide the GQA group (heads / "
                             "kv_heads = %lld); use a divisor of it, or 0 for the automatic choice",
                             (int)t->split, (long long)group);
            return 0;
        }
        return (int)t->split;
    }
    const int64_t base = (s->seq + 127) / 128 * s->batch * s->kv_heads;
    for (int64_t split = 1; split <= group; split++)
        if (group % split == 0 && 2 * base * split >= 3 * 132) return (int)split;
    return (int)group;
}

/* How the wgmma backward adds dQ up: bulk (default: each warpgroup stages its 64 x 64 fp32 tile in
 * shared memory and one thread adds it with one TMA bulk reduce-add) or atomic (16-byte red.global
 * per 4 values from registers; for comparison): t->dq_bulk, or ZT_FLASH_BACKWARD_DQ=bulk|atomic,
 * which overrides it. -1 (message recorded) for another value of the variable. */
int backward_dq_bulk(const zt_cuda_flash_backward_tuning *t)
{
    const char *text = getenv("ZT_FLASH_BACKWARD_DQ");
    if (!text || !*text) return t ? t->dq_bulk != 0 : 1;
    if (!strcmp(text, "bulk")) return 1;
    if (!strcmp(text, "atomic")) return 0;
    zt_cuda_fail(ZT_ERR_INVALID_ARG, "ZT_FLASH_BACKWARD_DQ=%s: expected bulk (the default) or atomic", text);
    return -1;
}

/* Whether the wgmma backward at head dim 64 (bulk dQ) lets its two warpgroups run apart on an
 * mbarrier ring (1, the default) or meets at a block barrier per query tile (0; for comparison):
 * t->ring, or ZT_FLASH_BACKWARD_RING=0|1, which overrides it. -1 (message recorded) for another
 * value of the variable. */
int backward_ring(const zt_cuda_flash_backward_tuning *t)
{
    const char *text = getenv("ZT_FLASH_BACKWARD_RING");
    if (!text || !*text) return t ? t->ring != 0 : 1;
    if (!strcmp(text, "1")) return 1;
    if (!strcmp(text, "0")) return 0;
    zt_cuda_fail(ZT_ERR_INVALID_ARG, "ZT_FLASH_BACKWARD_RING=%s: expected 0 or 1 (the default)", text);
    return -1;
}

/* The dQ accumulator's bytes: [B][T][H][D] fp32, or the bulk layout's [B][H][D/64][T rounded up to
 * 64][64] (the larger; either kernel may run in the scratch sized here). */
uint64_t accum_bytes(const zt_cuda_attention_shape *s)
{
    uint64_t tp = ((uint64_t)s->seq + 63) / 64 * 64;
    return zt_round_up((uint64_t)s->batch * tp * (uint64_t)s->heads * (uint64_t)s->head_dim * sizeof(float), 256);
}

template <typename E, int D>
zt_status launch_backward(zt_cuda_ctx *ctx, cudaStream_t stream, flash_params p,
                          zt_cuda_flash_kernel kernel)
{
    const char *what = "flash attention backward";
    constexpr size_t smem = backward_smem_bytes<D>();
    /* checks first, so that a GPU that cannot run the kernel gets nothing enqueued */
    zt_status st = kernel == ZT_CUDA_FLASH_WGMMA_WS ? zt_flash_backward_wgmma_ws(ctx, stream, &p, D, 0)
                   : kernel == ZT_CUDA_FLASH_WGMMA  ? zt_flash_backward_wgmma(ctx, stream, &p, D, 0)
                                                    : flash_prepare(ctx, what, flash_backward_kernel<E, D>, smem);
    if (st != ZT_OK) return st;
    int64_t rows = (int64_t)p.batch * p.seq * p.heads;
    /* the bulk layout pads each (batch, head)'s rows to a multiple of 64: the last tile's reduce-add
     * (zeros past T) stays inside it */
    int64_t accum_rows = p.bwd_dq_bulk ? (int64_t)p.batch * p.heads * ((p.seq + 63) / 64 * 64) : rows;
    cudaError_t e = cudaMemsetAsync(p.dq_accum, 0, (size_t)accum_rows * D * sizeof(float), stream);
    if (e != cudaSuccess)
        return zt_cuda_fail(ZT_ERR_DEVICE, "%s: cudaMemsetAsync failed: %s", what,
                            cudaGetErrorString(e));
    flash_delta_kernel<E, D><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(p);
    if ((st = zt_cuda_check_launch("flash attention backward (delta)")) != ZT_OK) return st;
    if (kernel == ZT_CUDA_FLASH_WGMMA || kernel == ZT_CUDA_FLASH_WGMMA_WS) {
        /* chunks of units (batch, kv head, split) whose blocks run together: at least 2 waves, and
         * as many as keep their Q and dO (read by every key tile) within ~24 MB of L2 */
        const int64_t n_key_tiles = (p.seq + 127) / 128, units = (int64_t)p.batch * p.kv_heads * p.bwd_split;
        const int64_t unit_bytes = (int64_t)p.seq * (p.group / p.bwd_split) * D * 2 * 2;
        int64_t chunk = (2 * (int64_t)ctx->sm_count + n_key_tiles - 1) / n_key_tiles;
        if (chunk < (24ll << 20) / unit_bytes) chunk = (24ll << 20) / unit_bytes;
        p.bwd_chunk = (int)(chunk < 1 ? 1 : chunk > units ? units : chunk);
        st = kernel == ZT_CUDA_FLASH_WGMMA_WS ? zt_flash_backward_wgmma_ws(ctx, stream, &p, D, 1)
                                              : zt_flash_backward_wgmma(ctx, stream, &p, D, 1);
        if (st != ZT_OK) return st;
        if (p.bwd_split > 1) {
            const int64_t n4 = (int64_t)p.batch * p.seq * p.kv_heads * D / 4;
            flash_dkv_reduce_kernel<E><<<zt_grid_for(2 * n4, 256, ctx), 256, 0, stream>>>(
                n4, p.bwd_split, p.dkv_partial, p.scale, p.dk, p.dv);
            if ((st = zt_cuda_check_launch("flash attention backward (dK/dV sum)")) != ZT_OK) return st;
        }
    } else {
        dim3 grid((unsigned)((p.seq + BC - 1) / BC), (unsigned)p.kv_heads, (unsigned)p.batch);
        flash_backward_kernel<E, D><<<grid, THREADS, smem, stream>>>(p);
        if ((st = zt_cuda_check_launch(what)) != ZT_OK) return st;
    }
    if (p.bwd_dq_bulk)
        flash_dq_bulk_kernel<E, D><<<zt_grid_for(rows * D / 4, 256, ctx), 256, 0, stream>>>(p);
    else
        flash_dq_kernel<E><<<zt_grid_for(rows * D, 256, ctx), 256, 0, stream>>>(rows * D, p.dq_accum,
                                                                             p.scale, p.dq);
    return zt_cuda_check_launch("flash attention backward (dq)");
}

} // namespace

uint64_t zt_cuda_flash_attention_backward_scratch_bytes_tuned(const zt_cuda_attention_shape *s,
                                                              const zt_cuda_flash_backward_tuning *t)
{
    uint64_t rows = (uint64_t)s->batch * (uint64_t)s->seq * (uint64_t)s->heads;
    uint64_t bytes = accum_bytes(s) + zt_round_up(rows * sizeof(float), 256);
    /* the wgmma kernel's dK/dV partial sums when it splits the group (a bad split counts as 1 here
     * and fails in the backward itself) */
    int split = backward_split(s, t, true);
    if (split > 1)
        bytes += 2 * (uint64_t)split * (uint64_t)s->batch * (uint64_t)s->seq * (uint64_t)s->kv_heads *
                 (uint64_t)s->head_dim * sizeof(float);
    return bytes;
}

uint64_t zt_cuda_flash_attention_backward_scratch_bytes(const zt_cuda_attention_shape *s)
{
    return zt_cuda_flash_attention_backward_scratch_bytes_tuned(s, NULL);
}

zt_status zt_cuda_flash_attention_backward_tuned(zt_cuda_ctx *ctx, cudaStream_t stream,
                                                 const zt_cuda_attention_shape *s, zt_cuda_flash_kernel kernel,
                                                 const zt_cuda_flash_backward_tuning *t, const uint16_t *q,
                                                 const uint16_t *k, const uint16_t *v, const int32_t *doc_ids,
                                                 const uint16_t *o, const float *lse, const uint16_t *dout,
                                                 uint16_t *dq, uint16_t *dk, uint16_t *dv)
{
    const void *ptrs[] = {q, k, v, o, lse, dout, dq, dk, dv};
    zt_status st = flash_check("flash attention backward", s, ptrs, 9);
    if (st != ZT_OK) return st;
    const bool automatic = kernel == ZT_CUDA_FLASH_AUTO;
    st = zt_cuda_flash_kernel_resolve(ctx, s, kernel, &kernel);
    if (st != ZT_OK) return st;
    /* auto on compute capability 9.0: the warp-specialized backward (1.5-2.1x the wgmma kernel's
     * speed, docs/cuda.md); wgmma stays by name, for comparison */
    if (automatic && kernel == ZT_CUDA_FLASH_WGMMA) kernel = ZT_CUDA_FLASH_WGMMA_WS;
    const bool hopper = kernel == ZT_CUDA_FLASH_WGMMA || kernel == ZT_CUDA_FLASH_WGMMA_WS;
    /* the mma.sync kernel keeps a whole group per block and adds dQ with atomics */
    const int split = hopper ? backward_split(s, t, false) : 1;
    if (split == 0) return ZT_ERR_INVALID_ARG;
    /* wgmma-ws always adds dQ with bulk reduce-adds (the dQ choice is wgmma's switch) */
    const int dq_bulk = kernel == ZT_CUDA_FLASH_WGMMA_WS ? 1 : kernel == ZT_CUDA_FLASH_WGMMA ? backward_dq_bulk(t) : 0;
    if (dq_bulk < 0) return ZT_ERR_INVALID_ARG;
    const int ring = kernel == ZT_CUDA_FLASH_WGMMA ? backward_ring(t) : 0;
    if (ring < 0) return ZT_ERR_INVALID_ARG;
    char *scratch = (char *)zt_cuda_scratch(
        ctx, zt_cuda_flash_attention_backward_scratch_bytes_tuned(s, t), "flash attention backward");
    if (!scratch) return ZT_ERR_BUFFER_TOO_SMALL;
    uint64_t rows = (uint64_t)s->batch * (uint64_t)s->seq * (uint64_t)s->heads;
    flash_params p = flash_make_params(s);
    p.q = (const bf16 *)q;
    p.k = (const bf16 *)k;
    p.v = (const bf16 *)v;
    p.o = (const bf16 *)o;
    p.dout = (const bf16 *)dout;
    p.doc_ids = doc_ids;
    p.lse = lse;
    p.dq = (bf16 *)dq;
    p.dk = (bf16 *)dk;
    p.dv = (bf16 *)dv;
    p.dq_accum = (float *)scratch;
    p.delta = (float *)(scratch + accum_bytes(s));
    p.bwd_split = split;
    p.bwd_chunk = 1;
    p.bwd_dq_bulk = dq_bulk;
    p.bwd_ring = ring;
    if (split > 1) p.dkv_partial = (float *)(scratch + accum_bytes(s) + zt_round_up(rows * sizeof(float), 256));
    /* the context's 16-bit type (zt_cuda_ctx_set_dtype): q, k, v, o, dout, dq, dk, dv are bf16 or fp16;
     * lse, delta and the dQ accumulator fp32 either way */
    ZT_DISPATCH16(ctx->dtype, E,
                  return s->head_dim == 64 ? launch_backward<E, 64>(ctx, stream, p, kernel)
                                           : launch_backward<E, 128>(ctx, stream, p, kernel));
}

zt_status zt_cuda_flash_attention_backward_kernel(zt_cuda_ctx *ctx, cudaStream_t stream,
                                                  const zt_cuda_attention_shape *s,
                                                  zt_cuda_flash_kernel kernel, const uint16_t *q,
                                                  const uint16_t *k, const uint16_t *v,
                                                  const int32_t *doc_ids, const uint16_t *o,
                                                  const float *lse, const uint16_t *dout, uint16_t *dq,
                                                  uint16_t *dk, uint16_t *dv)
{
    return zt_cuda_flash_attention_backward_tuned(ctx, stream, s, kernel, NULL, q, k, v, doc_ids, o, lse, dout, dq,
                                                  dk, dv);
}

zt_status zt_cuda_flash_attention_backward(zt_cuda_ctx *ctx, cudaStream_t stream,
                                           const zt_cuda_attention_shape *s, const uint16_t *q,
                                           const uint16_t *k, const uint16_t *v,
                                           const int32_t *doc_ids, const uint16_t *o,
                                           const float *lse, const uint16_t *dout, uint16_t *dq,
                                           uint16_t *dk, uint16_t *dv)
{
    zt_cuda_flash_kernel kernel;
    zt_status st = zt_cuda_flash_backward_kernel_from_env(&kernel);
    if (st != ZT_OK) return st;
    return zt_cuda_flash_attention_backward_kernel(ctx, stream, s, kernel, q, k, v, doc_ids, o, lse,
                                                   dout, dq, dk, dv);
}
