/* Flash attention forward (the FlashAttention-2 algorithm) on bf16 or fp16 tensor cores (templated on
 * the element type E, the context's dtype; see flash_common.cuh).
 *
 * A block owns BR = 128 query rows of one (batch, head); each of its 4 warps owns 32 of them (two
 * 16-row MMA tiles) and keeps their output accumulators (fp32) and running max / sum in registers;
 * two blocks share an SM. Key/value tiles of BC = 64 rows stream through shared memory,
 * double-buffered with cp.async so the next tile loads while this one is computed. Per tile:
 * S = Q K^T (tensor cores), masking, online softmax (rescale O and the row sum when the max grows),
 * O += P V with P packed to E (the element type) straight from the S accumulators. At the end O /= sum and
 * lse = max * scale + log(sum).
 *
 * Work skipped: key tiles after the causal diagonal; with document ids, key tiles before the first
 * one that holds a document of this query tile; per warp, tiles entirely above its diagonal.
 * Grouped-query attention reads kv head h / group directly: K/V are never repeated.
 */
#include <math.h>
#include <stdlib.h>
#include <atomic>
#include <string.h>
#include "cuda/flash_common.cuh"
#include "cuda/flash_kernel.h"

namespace {

/* A block: WARPS warps of M_TILES x 16 query rows each. Two 16-row tiles per warp read every K/V
 * fragment from shared memory once for 32 rows, halving the shared-memory traffic per MMA (which
 * bounds this kernel: Q is re-read per tile instead, 1/4 of the K+V bytes). */
constexpr int WARPS = 4, M_TILES = 2, BR = WARPS * M_TILES * 16, BC = 64, THREADS = WARPS * 32;

template <int D>
constexpr size_t forward_smem_bytes()
{
    return (size_t)(BR * D + 4 * BC * D) * sizeof(bf16) + 2 * BC * sizeof(int32_t);
}

template <typename E, int D>
__global__ void __launch_bounds__(THREADS, 2) flash_forward_kernel(const flash_params p)
{
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem);
    bf16 *sK = sQ + BR * D; /* [2][BC * D] */
    bf16 *sV = sK + 2 * BC * D;
    int32_t *sKeyDoc = reinterpret_cast<int32_t *>(sV + 2 * BC * D); /* [2][BC] */
    __shared__ int query_doc_min, query_doc_max;

    const int T = p.seq, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int q_tile = gridDim.x - 1 - blockIdx.x; /* the longest rows (most keys) start first */
    const int h = blockIdx.y, b = blockIdx.z, kv_head = h / p.group;
    const int q0 = q_tile * BR;
    const int64_t q_stride = (int64_t)p.heads * D, kv_stride = (int64_t)p.kv_heads * D;
    const bf16 *q_base = p.q + ((int64_t)b * T * p.heads + h) * D;
    const bf16 *k_base = p.k + ((int64_t)b * T * p.kv_heads + kv_head) * D;
    const bf16 *v_base = p.v + ((int64_t)b * T * p.kv_heads + kv_head) * D;
    const int32_t *doc = p.doc_ids ? p.doc_ids + (int64_t)b * T : nullptr;

    const auto rows_first = ldmatrix_offsets<D>::rows_first(lane);
    const auto columns_first = ldmatrix_offsets<D>::columns_first(lane);
    const int warp_row0 = q0 + warp * M_TILES * 16, warp_row_last = warp_row0 + M_TILES * 16 - 1;
    /* The query rows of this thread: row g and g + 8 of each 16-row tile. */
    int rows[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++) {
        rows[mt][0] = warp_row0 + mt * 16 + g;
        rows[mt][1] = rows[mt][0] + 8;
    }
    const int last_row = (q0 + BR < T ? q0 + BR : T) - 1;
    const int last_tile = last_row / BC;

    /* With documents: the first key tile holding a document of this query tile. */
    int first_tile = 0;
    int row_doc[M_TILES][2] = {};
    if (doc) {
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) row_doc[mt][r] = doc[rows[mt][r] < T ? rows[mt][r] : T - 1];
        if (tid == 0) {
            query_doc_min = INT32_MAX;
            query_doc_max = INT32_MIN;
        }
        __syncthreads();
        for (int i = tid; i < BR && q0 + i < T; i += THREADS) {
            atomicMin(&query_doc_min, doc[q0 + i]);
            atomicMax(&query_doc_max, doc[q0 + i]);
        }
        __syncthreads();
        for (first_tile = 0; first_tile < last_tile; first_tile++) {
            int hit = 0;
            for (int i = tid; i < BC; i += THREADS) {
                int key = first_tile * BC + i;
                hit |= key < T && doc[key] >= query_doc_min && doc[key] <= query_doc_max;
            }
            if (__syncthreads_or(hit)) break;
        }
    }

    auto load_kv = [&](int tile, int buf) {
        load_tile_async<BC, D, THREADS>(sK + buf * BC * D, k_base, kv_stride, tile * BC, T);
        load_tile_async<BC, D, THREADS>(sV + buf * BC * D, v_base, kv_stride, tile * BC, T);
        if (doc) {
            for (int i = tid; i < BC; i += THREADS) {
                int key = tile * BC + i;
                sKeyDoc[buf * BC + i] = key < T ? doc[key] : INT32_MIN;
            }
        }
    };

    load_tile_async<BR, D, THREADS>(sQ, q_base, q_stride, q0, T);
    load_kv(first_tile, 0);
    cp_async_commit();

    float acc[M_TILES][D / 8][4];
    float row_max[M_TILES][2], row_sum[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++) {
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
        row_max[mt][0] = row_max[mt][1] = -INFINITY;
        row_sum[mt][0] = row_sum[mt][1] = 0.0f;
    }

    for (int tile = first_tile; tile <= last_tile; tile++) {
        const int buf = (tile - first_tile) & 1;
        if (tile < last_tile) load_kv(tile + 1, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int k0 = tile * BC;
        const bf16 *tK = sK + buf * BC * D, *tV = sV + buf * BC * D;
        if (k0 <= warp_row_last) { /* otherwise every key of the tile is after this warp's rows */
            float s[M_TILES][BC / 8][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                for (int n = 0; n < BC / 8; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
            /* S = Q K^T: each K fragment feeds both row tiles. Not unrolled over kd: unrolled, the
             * compiler hoists every Q fragment of the tile into registers and spills. */
#pragma unroll 1
            for (int kd = 0; kd < D / 16; kd++) {
                uint32_t qa[M_TILES][4];
#pragma unroll
                for (int mt = 0; mt < M_TILES; mt++)
                    ldmatrix_x4(qa[mt], rows_first.at_dynamic(sQ, warp * M_TILES * 16 + mt * 16, kd * 16));
#pragma unroll
                for (int np = 0; np < BC / 16; np++) {
                    uint32_t kb[4];
                    ldmatrix_x4(kb, columns_first.at_dynamic(tK, np * 16, kd * 16));
#pragma unroll
                    for (int mt = 0; mt < M_TILES; mt++) {
                        mma16<E>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
                        mma16<E>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
                    }
                }
            }
            if (k0 + BC - 1 > warp_row0 || doc || k0 + BC > T) {
#pragma unroll
                for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                    for (int n = 0; n < BC / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int key_local = n * 8 + 2 * t4 + (e & 1), key = k0 + key_local;
                            int r = e >> 1;
                            bool visible = key <= rows[mt][r] && key < T &&
                                           (!doc || sKeyDoc[buf * BC + key_local] == row_doc[mt][r]);
                            if (!visible) s[mt][n][e] = -INFINITY;
                        }
            }
            /* online softmax: new running max, rescale what was accumulated under the old one */
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float mx = row_max[mt][r];
#pragma unroll
                    for (int n = 0; n < BC / 8; n++)
                        mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    /* while the row has seen no visible key its max is -inf: exponentiate against 0 */
                    float base = mx == -INFINITY ? 0.0f : mx * p.scale_log2;
                    float correction = exp2f(row_max[mt][r] * p.scale_log2 - base); /* 0 at first */
                    row_max[mt][r] = mx;
                    row_sum[mt][r] *= correction;
#pragma unroll
                    for (int n = 0; n < D / 8; n++) {
                        acc[mt][n][2 * r] *= correction;
                        acc[mt][n][2 * r + 1] *= correction;
                    }
#pragma unroll
                    for (int n = 0; n < BC / 8; n++) {
                        s[mt][n][2 * r] = exp2f(fmaf(s[mt][n][2 * r], p.scale_log2, -base));
                        s[mt][n][2 * r + 1] = exp2f(fmaf(s[mt][n][2 * r + 1], p.scale_log2, -base));
                        row_sum[mt][r] += s[mt][n][2 * r] + s[mt][n][2 * r + 1];
                    }
                }
            }
            /* O += P V, P packed to E A fragments straight from the accumulators */
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                uint32_t pa[M_TILES][4];
#pragma unroll
                for (int mt = 0; mt < M_TILES; mt++) {
                    pa[mt][0] = pack16<E>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    pa[mt][1] = pack16<E>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    pa[mt][2] = pack16<E>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    pa[mt][3] = pack16<E>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
#pragma unroll
                for (int np = 0; np < D / 16; np++) {
                    uint32_t vb[4];
                    ldmatrix_x4_trans(vb, rows_first.at(tV, kk * 16, np * 16));
#pragma unroll
                    for (int mt = 0; mt < M_TILES; mt++) {
                        mma16<E>(acc[mt][2 * np], pa[mt], vb[0], vb[1]);
                        mma16<E>(acc[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
                    }
                }
            }
        }
        __syncthreads(); /* the next iteration's prefetch overwrites this buffer */
    }

    bf16 *o_base = p.o_out + ((int64_t)b * T * p.heads + h) * D;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float sum = row_sum[mt][r];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            int row = rows[mt][r];
            if (row >= T) continue;
            float inv = 1.0f / sum;
            bf16 *out = o_base + (int64_t)row * q_stride;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<uint32_t *>(out + n * 8 + 2 * t4) =
                    pack16<E>(acc[mt][n][2 * r] * inv, acc[mt][n][2 * r + 1] * inv);
            if (t4 == 0)
                p.lse_out[((int64_t)b * p.heads + h) * T + row] = row_max[mt][r] * p.scale + logf(sum);
        }
    }
}

template <typename E, int D>
zt_status launch_forward(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params &p)
{
    constexpr size_t smem = forward_smem_bytes<D>();
    zt_status st = flash_prepare(ctx, "flash attention forward", flash_forward_kernel<E, D>, smem);
    if (st != ZT_OK) return st;
    dim3 grid((unsigned)((p.seq + BR - 1) / BR), (unsigned)p.heads, (unsigned)p.batch);
    flash_forward_kernel<E, D><<<grid, THREADS, smem, stream>>>(p);
    return zt_cuda_check_launch("flash attention forward");
}

} // namespace

const char *zt_cuda_flash_kernel_name(zt_cuda_flash_kernel k)
{
    return k == ZT_CUDA_FLASH_MMA ? "mma" : k == ZT_CUDA_FLASH_WGMMA ? "wgmma" : k == ZT_CUDA_FLASH_WGMMA_WS ? "wgmma-ws" : "auto";
}

zt_status zt_cuda_flash_kernel_parse(const char *text, zt_cuda_flash_kernel *out)
{
    if (!text || !*text || !strcmp(text, "auto"))
        *out = ZT_CUDA_FLASH_AUTO;
    else if (!strcmp(text, "mma"))
        *out = ZT_CUDA_FLASH_MMA;
    else if (!strcmp(text, "wgmma"))
        *out = ZT_CUDA_FLASH_WGMMA;
    else if (!strcmp(text, "wgmma-ws"))
        *out = ZT_CUDA_FLASH_WGMMA_WS;
    else
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "'%s' is not a flash attention kernel: use auto (wgmma on compute "
                            "capability 9.0 GPUs, else mma), mma, wgmma or wgmma-ws", text);
    return ZT_OK;
}

zt_status zt_cuda_flash_kernel_from_env(zt_cuda_flash_kernel *out)
{
    const char *text = getenv("ZT_FLASH_KERNEL");
    if (zt_cuda_flash_kernel_parse(text, out) == ZT_OK) return ZT_OK;
    return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                        "ZT_FLASH_KERNEL=%s is not a flash attention kernel: set it to auto (wgmma on "
                        "compute capability 9.0 GPUs, else mma), mma, wgmma or wgmma-ws, or unset it", text);
}

zt_status zt_cuda_flash_backward_kernel_from_env(zt_cuda_flash_kernel *out)
{
    const char *text = getenv("ZT_FLASH_BACKWARD_KERNEL");
    if (!text || !*text) return zt_cuda_flash_kernel_from_env(out);
    if (zt_cuda_flash_kernel_parse(text, out) == ZT_OK) return ZT_OK;
    return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                        "ZT_FLASH_BACKWARD_KERNEL=%s is not a flash attention kernel: set it to auto, "
                        "mma, wgmma or wgmma-ws, or unset it (the backward then follows ZT_FLASH_KERNEL)", text);
}

zt_status zt_cuda_flash_kernel_resolve(zt_cuda_ctx *ctx, const zt_cuda_attention_shape *s,
                                       zt_cuda_flash_kernel want, zt_cuda_flash_kernel *got)
{
    (void)s; /* both kernels take every shape flash_check accepts */
    if (want == ZT_CUDA_FLASH_MMA) {
        *got = ZT_CUDA_FLASH_MMA;
        return ZT_OK;
    }
    /* every forward and backward asks: cache the answer per device (10 * major + minor, 0 = unknown) */
    static std::atomic<int> cached_cc[64];
    int major = 0, minor = 0;
    int cached = ctx->device >= 0 && ctx->device < 64 ? cached_cc[ctx->device].load(std::memory_order_relaxed) : 0;
    if (cached) {
        major = cached / 10, minor = cached % 10;
    } else {
        cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx->device);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ctx->device);
        if (e != cudaSuccess)
            return zt_cuda_fail(ZT_ERR_DEVICE, "flash attention: cannot read the compute capability of GPU %d: %s",
                                ctx->device, cudaGetErrorString(e));
        if (ctx->device >= 0 && ctx->device < 64 && minor < 10)
            cached_cc[ctx->device].store(10 * major + minor, std::memory_order_relaxed);
    }
    /* sm_90a code runs on compute capability 9.0 only (not on later GPUs) */
    int runs = zt_cuda_flash_wgmma_built() && major == 9 && minor == 0;
    if (want == ZT_CUDA_FLASH_AUTO) {
        *got = runs ? ZT_CUDA_FLASH_WGMMA : ZT_CUDA_FLASH_MMA;
        return ZT_OK;
    }
    if (!zt_cuda_flash_wgmma_built())
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "flash attention: the wgmma kernel is not in this build (it needs 90 in "
                            "CMAKE_CUDA_ARCHITECTURES); unset ZT_FLASH_KERNEL or set it to mma or auto");
    if (!runs)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "flash attention: the wgmma kernel needs a compute capability 9.0 GPU (H100, "
                            "H200); GPU %d is %d.%d. Unset ZT_FLASH_KERNEL or set it to mma or auto",
                            ctx->device, major, minor);
    *got = want; /* wgmma or wgmma-ws (the backward's warp-specialized kernel; same requirements) */
    return ZT_OK;
}

zt_status zt_cuda_flash_attention_forward_kernel(zt_cuda_ctx *ctx, cudaStream_t stream,
                                                 const zt_cuda_attention_shape *s,
                                                 zt_cuda_flash_kernel kernel, const uint16_t *q,
                                                 const uint16_t *k, const uint16_t *v,
                                                 const int32_t *doc_ids, uint16_t *o, float *lse)
{
    const void *ptrs[] = {q, k, v, o, lse};
    zt_status st = flash_check("flash attention forward", s, ptrs, 5);
    if (st != ZT_OK) return st;
    st = zt_cuda_flash_kernel_resolve(ctx, s, kernel, &kernel);
    if (st != ZT_OK) return st;
    flash_params p = flash_make_params(s);
    p.q = (const bf16 *)q;
    p.k = (const bf16 *)k;
    p.v = (const bf16 *)v;
    p.doc_ids = doc_ids;
    p.o_out = (bf16 *)o;
    p.lse_out = lse;
    /* wgmma-ws names a backward kernel; its forward is the wgmma one */
    if (kernel == ZT_CUDA_FLASH_WGMMA || kernel == ZT_CUDA_FLASH_WGMMA_WS)
        return zt_flash_forward_wgmma(ctx, stream, &p, (int)s->head_dim);
    /* the context's 16-bit type (zt_cuda_ctx_set_dtype): q, k, v and o are bf16 or fp16 */
    ZT_DISPATCH16(ctx->dtype, E,
                  return s->head_dim == 64 ? launch_forward<E, 64>(ctx, stream, p)
                                           : launch_forward<E, 128>(ctx, stream, p));
}

zt_status zt_cuda_flash_attention_forward(zt_cuda_ctx *ctx, cudaStream_t stream,
                                          const zt_cuda_attention_shape *s, const uint16_t *q,
                                          const uint16_t *k, const uint16_t *v,
                                          const int32_t *doc_ids, uint16_t *o, float *lse)
{
    zt_cuda_flash_kernel kernel;
    zt_status st = zt_cuda_flash_kernel_from_env(&kernel);
    if (st != ZT_OK) return st;
    return zt_cuda_flash_attention_forward_kernel(ctx, stream, s, kernel, q, k, v, doc_ids, o, lse);
}
