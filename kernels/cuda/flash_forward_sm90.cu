/* Flash attention forward for Hopper (sm_90a): the FlashAttention-2 algorithm of flash_forward.cu on
 * warpgroup MMA (wgmma), in the FlashAttention-3 style.
 *
 * A block owns BR = 64 * WGS query rows of one (batch, head); each warpgroup (128 threads) owns 64 of
 * them and keeps their output accumulators (fp32) and running max / sum in registers. Key/value
 * tiles of BC rows stream through shared memory in 3 buffers with cp.async (issued by every thread
 * one tile ahead, before the current tile is computed): the buffer a load overwrites was last read
 * two tiles before, which the one barrier per tile already orders. Per tile and warpgroup:
 *   S = Q K^T     wgmma m64nBCk16, both operands in shared memory (K-major, 128B swizzle)
 *   mask, online softmax in base 2 (scores prescaled by scale * log2(e)), rescale O
 *   O += P V      wgmma m64nDk16, P from registers (packed from S's accumulators), V in shared
 *                 memory read transposed (MN-major)
 * The warpgroups of a block (and the blocks of an SM) interleave, so one's softmax overlaps
 * another's MMAs. Work skipped as in flash_forward.cu: key tiles past the causal diagonal, key tiles
 * before the first one holding a document of this query tile, and per warpgroup tiles entirely above
 * its rows. Grouped-query attention reads kv head h / group directly.
 *
 * Compiled only for sm_90a (kernels/CMakeLists.txt); elsewhere the kernel body is a trap and the
 * host side reports the kernel unavailable, so the mma.sync kernels run.
 */
#include <math.h>
#include "cuda/flash_kernel.h"
#include "cuda/flash_wgmma.cuh"

namespace {

/* The tile shapes per head dim. hd 128: S and O take 64 + 64 accumulator registers per thread (211
 * registers in all, no spills), one block of 2 warpgroups per SM (227 KiB of shared memory). hd 64:
 * 64-key tiles keep S and O at 32 + 32 registers, so two blocks share an SM within 128 registers a
 * thread (with 128-key tiles ptxas spilled), 66 KiB each. */
template <int D>
struct sm90_config;
template <>
struct sm90_config<128> {
    static constexpr int WGS = 2, BC = 128, MIN_BLOCKS = 1;
};
template <>
struct sm90_config<64> {
    static constexpr int WGS = 2, BC = 64, MIN_BLOCKS = 2;
};

template <int D>
struct sm90_shape {
    static constexpr int WGS = sm90_config<D>::WGS, BC = sm90_config<D>::BC;
    static constexpr int BR = 64 * WGS, THREADS = 128 * WGS, STAGES = 3;
    static constexpr size_t Q_BYTES = (size_t)BR * D * 2, KV_BYTES = (size_t)BC * D * 2;
    /* Q, then K and V of each stage, then the key documents of each stage and 2 ints; the swizzled
     * tiles need 1024-byte alignment, which the kernel makes by skipping up to 1023 bytes.
     * hd 128: 231952 bytes, within the 232448 (227 KiB) a block may have on sm_90. */
    static constexpr size_t SMEM = 1024 + Q_BYTES + 2 * STAGES * KV_BYTES + STAGES * BC * 4 + 16;
    static_assert(SMEM <= 232448, "more shared memory than an sm_90 block may have");
};

template <int D>
__global__ void __launch_bounds__(sm90_shape<D>::THREADS, sm90_config<D>::MIN_BLOCKS)
    flash_forward_sm90_kernel(const flash_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = sm90_shape<D>;
    constexpr int BR = S::BR, BC = S::BC, THREADS = S::THREADS, STAGES = S::STAGES;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    bf16 *sQ = reinterpret_cast<bf16 *>(smem);
    bf16 *sK = reinterpret_cast<bf16 *>(smem + S::Q_BYTES);                       /* [STAGES][BC * D] */
    bf16 *sV = reinterpret_cast<bf16 *>(smem + S::Q_BYTES + STAGES * S::KV_BYTES); /* [STAGES][BC * D] */
    int32_t *sKeyDoc = reinterpret_cast<int32_t *>(smem + S::Q_BYTES + 2 * STAGES * S::KV_BYTES); /* [STAGES][BC] */
    int *query_doc = reinterpret_cast<int *>(sKeyDoc + STAGES * BC); /* min, max */

    const int T = p.seq, tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int q_tile = gridDim.x - 1 - blockIdx.x; /* the longest rows (most keys) start first */
    const int h = blockIdx.y, b = blockIdx.z, kv_head = h / p.group;
    const int q0 = q_tile * BR;
    const int64_t q_stride = (int64_t)p.heads * D, kv_stride = (int64_t)p.kv_heads * D;
    const bf16 *q_base = p.q + ((int64_t)b * T * p.heads + h) * D;
    const bf16 *k_base = p.k + ((int64_t)b * T * p.kv_heads + kv_head) * D;
    const bf16 *v_base = p.v + ((int64_t)b * T * p.kv_heads + kv_head) * D;
    const int32_t *doc = p.doc_ids ? p.doc_ids + (int64_t)b * T : nullptr;

    const int wg_row0 = q0 + wg * 64, wg_row_last = wg_row0 + 63;
    const int rows[2] = {wg_row0 + warp * 16 + g, wg_row0 + warp * 16 + g + 8};
    const int last_row = (q0 + BR < T ? q0 + BR : T) - 1;
    const int last_tile = last_row / BC;

    /* With documents: the first key tile holding a document of this query tile. */
    int first_tile = 0;
    int row_doc[2] = {0, 0};
    if (doc) {
        for (int r = 0; r < 2; r++) row_doc[r] = doc[rows[r] < T ? rows[r] : T - 1];
        if (tid == 0) {
            query_doc[0] = INT32_MAX;
            query_doc[1] = INT32_MIN;
        }
        __syncthreads();
        for (int i = tid; i < BR && q0 + i < T; i += THREADS) {
            atomicMin(&query_doc[0], doc[q0 + i]);
            atomicMax(&query_doc[1], doc[q0 + i]);
        }
        __syncthreads();
        const int doc_min = query_doc[0], doc_max = query_doc[1];
        for (first_tile = 0; first_tile < last_tile; first_tile++) {
            int hit = 0;
            for (int i = tid; i < BC; i += THREADS) {
                int key = first_tile * BC + i;
                hit |= key < T && doc[key] >= doc_min && doc[key] <= doc_max;
            }
            if (__syncthreads_or(hit)) break;
        }
    }

    auto load_kv = [&](int tile, int buf) {
        sw128_load_async<BC, D, THREADS>(sK + buf * BC * D, k_base, kv_stride, tile * BC, T, tid);
        sw128_load_async<BC, D, THREADS>(sV + buf * BC * D, v_base, kv_stride, tile * BC, T, tid);
        if (doc) {
            for (int i = tid; i < BC; i += THREADS) {
                int key = tile * BC + i;
                sKeyDoc[buf * BC + i] = key < T ? doc[key] : INT32_MIN;
            }
        }
    };

    sw128_load_async<BR, D, THREADS>(sQ, q_base, q_stride, q0, T, tid);
    load_kv(first_tile, 0);
    cp_async_commit();

    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    /* This warpgroup's 64 rows of Q: rows wg * 64 of each column block (1024-byte aligned). */
    const bf16 *wg_q = sQ + wg * 64 * 64;

    for (int tile = first_tile; tile <= last_tile; tile++) {
        const int buf = (tile - first_tile) % STAGES;
        /* into the buffer of tile - 2, which every thread finished before the barrier of tile - 1 */
        if (tile < last_tile) load_kv(tile + 1, (buf + 1) % STAGES);
        cp_async_commit();
        cp_async_wait<1>();
        fence_proxy_async_shared(); /* this thread's cp.async data, before wgmma reads it */
        __syncthreads();            /* the tile is loaded; and all are done with tile - 1 */
        const int k0 = tile * BC;
        const bf16 *tK = sK + buf * BC * D, *tV = sV + buf * BC * D;
        if (k0 <= wg_row_last) { /* warpgroup-uniform; otherwise every key is after these rows */
            float s[BC / 8][4];
#pragma unroll
            for (int n = 0; n < BC / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            wgmma_fence();
#pragma unroll
            for (int kd = 0; kd < D / 16; kd++) {
                /* column block kd / 4, 32 bytes per k16 step inside it */
                uint64_t dq = wgmma_desc(wg_q + (kd / 4) * BR * 64 + (kd % 4) * 16, 16, 1024);
                uint64_t dk = wgmma_desc(tK + (kd / 4) * BC * 64 + (kd % 4) * 16, 16, 1024);
                if constexpr (BC == 128)
                    wgmma_ss_m64n128(s, dq, dk);
                else
                    wgmma_ss_m64n64(s, dq, dk);
            }
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands(s);

            if (k0 + BC - 1 > wg_row0 || doc || k0 + BC > T) {
#pragma unroll
                for (int n = 0; n < BC / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int key_local = n * 8 + 2 * t4 + (e & 1), key = k0 + key_local;
                        int r = e >> 1;
                        bool visible = key <= rows[r] && key < T &&
                                       (!doc || sKeyDoc[buf * BC + key_local] == row_doc[r]);
                        if (!visible) s[n][e] = -INFINITY;
                    }
            }
            /* online softmax: new running max, rescale what was accumulated under the old one */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = row_max[r];
#pragma unroll
                for (int n = 0; n < BC / 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                /* while the row has seen no visible key its max is -inf: exponentiate against 0 */
                float base = mx == -INFINITY ? 0.0f : mx * p.scale_log2;
                float correction = exp2f(row_max[r] * p.scale_log2 - base); /* 0 at first */
                row_max[r] = mx;
                row_sum[r] *= correction;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    acc[n][2 * r] *= correction;
                    acc[n][2 * r + 1] *= correction;
                }
#pragma unroll
                for (int n = 0; n < BC / 8; n++) {
                    s[n][2 * r] = exp2f(fmaf(s[n][2 * r], p.scale_log2, -base));
                    s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], p.scale_log2, -base));
                    row_sum[r] += s[n][2 * r] + s[n][2 * r + 1];
                }
            }
            /* O += P V: P packed to bf16 A fragments straight from the accumulators; V is [keys][D],
             * the B operand transposed: 16 keys (2048 bytes) per k16 step, column blocks BC * 128
             * bytes apart */
            uint32_t pa[BC / 16][4];
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
                pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
                pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                uint64_t dv = wgmma_desc(tV + kk * 16 * 64, BC * 128, 1024);
                if constexpr (D == 128)
                    wgmma_rs_m64n128(acc, pa[kk], dv);
                else
                    wgmma_rs_m64n64(acc, pa[kk], dv);
            }
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands(acc);
        }
    }

    bf16 *o_base = p.o_out + ((int64_t)b * T * p.heads + h) * D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        int row = rows[r];
        if (row >= T) continue;
        float inv = 1.0f / sum;
        bf16 *out = o_base + (int64_t)row * q_stride;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<uint32_t *>(out + n * 8 + 2 * t4) =
                pack_bf16(acc[n][2 * r] * inv, acc[n][2 * r + 1] * inv);
        if (t4 == 0)
            p.lse_out[((int64_t)b * p.heads + h) * T + row] = row_max[r] * p.scale + logf(sum);
    }
#else
    (void)p;
    __trap(); /* built without sm_90a code: the host never launches this */
#endif
}

template <int D>
zt_status launch_forward_sm90(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params &p)
{
    using S = sm90_shape<D>;
    zt_status st = flash_prepare(ctx, "flash attention forward (wgmma)", flash_forward_sm90_kernel<D>,
                                 S::SMEM);
    if (st != ZT_OK) return st;
    dim3 grid((unsigned)((p.seq + S::BR - 1) / S::BR), (unsigned)p.heads, (unsigned)p.batch);
    flash_forward_sm90_kernel<D><<<grid, S::THREADS, S::SMEM, stream>>>(p);
    return zt_cuda_check_launch("flash attention forward (wgmma)");
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
    return head_dim == 64 ? launch_forward_sm90<64>(ctx, stream, *p)
                          : launch_forward_sm90<128>(ctx, stream, *p);
}
