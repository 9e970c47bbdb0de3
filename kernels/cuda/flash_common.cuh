/* Building blocks of the flash attention kernels: bf16 / fp16 tensor-core MMA (mma.sync m16n8k16, sm_80+),
 * ldmatrix, cp.async, the swizzled shared-memory tile layout, and the host-side shape checks.
 *
 * Fragment layouts (PTX ISA, "mma.m16n8k16"), lane = 4 * g + t:
 *   A 16x16 (row-major):  a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
 *   B 16x8  (k x n):      b0 = (k 2t..2t+1, n g)  b1 = (k 2t+8.., n g)
 *   C 16x8  (fp32):       c0,c1 = (g, 2t..2t+1)  c2,c3 = (g+8, 2t..2t+1)
 * Two adjacent C tiles (columns 0-7 and 8-15) are exactly one A fragment of k = 16 once packed to
 * bf16, which is how P and dS go from one product into the next without shared memory.
 *
 * Shared-memory tiles hold rows of L bf16 (L = 64 or 128) as 16-byte chunks; chunk c of row r is
 * stored at chunk position c ^ (r % 8), so the 8 rows an ldmatrix reads at one column hit 8
 * different bank groups (no conflicts) and cp.async writes whole chunks.
 */
#ifndef ZT_KERNELS_CUDA_FLASH_COMMON_CUH
#define ZT_KERNELS_CUDA_FLASH_COMMON_CUH

#include <stdint.h>
#include "cuda/common.cuh"

/* Element offset of (row, col) in a swizzled tile with rows of L elements. */
template <int L>
__device__ __forceinline__ int swizzle(int row, int col)
{
    static_assert(L % 64 == 0, "swizzled rows need at least 8 chunks of 8 elements");
    return row * L + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

__device__ __forceinline__ uint32_t shared_address(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, bypassing L1; src_bytes = 0 fills the chunk with zeros. */
__device__ __forceinline__ void cp_async_16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
                 "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
}

/* c += a * b on one 16x8x16 tile, fp32 accumulators. */
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The element type of the flash kernels (template parameter E in the kernels, whose T is the
 * sequence length): bf16, or f16 (IEEE half, fp16.enabled), picked from the context's dtype on the
 * host (ZT_DISPATCH16). Shared-memory tiles and the 16-bit tensor pointers of
 * flash_params are typed bf16 but hold either type's bits: cp.async, ldmatrix and TMA only move 16-bit
 * elements. The type matters only where values are computed: the MMA's input type (.bf16 / .f16,
 * both with fp32 accumulators), rounding fp32 to it (pack16) and widening it (unpack16). The bf16 forms are the
 * bf16-only code of before, so the bf16 instantiations compile to the same instructions. */
template <typename T>
__device__ __forceinline__ void mma16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16<bf16>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    mma_bf16(c, a, b0, b1);
}
template <>
__device__ __forceinline__ void mma16<f16>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two fp32 values rounded to T (nearest even; fp16 beyond 65504 -> inf, which the loss scaler sees),
 * lo in the low half: one 32-bit A-fragment register or a pair of adjacent output elements. */
template <typename T>
__device__ __forceinline__ uint32_t pack16(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack16<bf16>(float lo, float hi)
{
    return pack_bf16(lo, hi);
}
template <>
__device__ __forceinline__ uint32_t pack16<f16>(float lo, float hi)
{
    __half2 v = __float22half2_rn(make_float2(lo, hi));
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The two T values of a packed register, widened to fp32 (x = low half). */
template <typename T>
__device__ __forceinline__ float2 unpack16(uint32_t v);
template <>
__device__ __forceinline__ float2 unpack16<bf16>(uint32_t v)
{
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&v));
}
template <>
__device__ __forceinline__ float2 unpack16<f16>(uint32_t v)
{
    return __half22float2(*reinterpret_cast<__half2 *>(&v));
}

/* Where each lane points ldmatrix_x4 in a swizzled tile with rows of L elements. The four 8x8
 * matrices of one x4 load are taken either
 *   rows first: (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, 8-15)
 *     - the A fragment of a row-major tile (ldmatrix_x4): a0..a3
 *     - two B fragments of a tile stored [k][n] (ldmatrix_x4_trans): b0, b1 of n 0-7, then of 8-15
 *   or columns first: (rows 0-7, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 0-7), (8-15, 8-15)
 *     - two B fragments of a tile stored [n][k] (ldmatrix_x4): b0, b1 of n 0-7, then of 8-15
 *     - the A fragment of a matrix stored transposed, [k][m] (ldmatrix_x4_trans): a0..a3
 * For a block at (row0, col0), row0 % 8 == 0 and col0 % 16 == 0, the swizzled offset is
 * row0 * L + (col0 & ~63) + one of four per-lane offsets (chosen by col0 / 16 % 4): computed once,
 * they leave the unrolled loops with immediate offsets instead of dozens of live addresses. */
template <int L>
struct ldmatrix_offsets {
    int lane_offset[4];
    int lane_row_offset, lane_xor; /* for at_dynamic */

    __device__ __forceinline__ ldmatrix_offsets(int lane_row, int lane_chunk)
    {
        lane_row_offset = lane_row * L;
        lane_xor = lane_chunk ^ (lane_row & 7);
#pragma unroll
        for (int i = 0; i < 4; i++) lane_offset[i] = lane_row_offset + 8 * ((2 * i) ^ lane_xor);
    }
    static __device__ __forceinline__ ldmatrix_offsets rows_first(int lane)
    {
        return ldmatrix_offsets((lane & 7) + 8 * ((lane >> 3) & 1), lane >> 4);
    }
    static __device__ __forceinline__ ldmatrix_offsets columns_first(int lane)
    {
        return ldmatrix_offsets((lane & 7) + 8 * (lane >> 4), (lane >> 3) & 1);
    }
    /* col0 must be known at compile time (after unrolling): a run-time index into lane_offset
     * would put it in local memory. */
    __device__ __forceinline__ const bf16 *at(const bf16 *tile, int row0, int col0) const
    {
        return tile + row0 * L + (col0 & ~63) + lane_offset[(col0 >> 4) & 3];
    }
    /* The same address for a col0 that depends on run-time values (one XOR more). */
    __device__ __forceinline__ const bf16 *at_dynamic(const bf16 *tile, int row0, int col0) const
    {
        return tile + row0 * L + (col0 & ~63) + lane_row_offset + 8 * (((col0 >> 3) & 7) ^ lane_xor);
    }
};

/* Copies rows [row0, row0 + ROWS) of a [T, ...] tensor (D elements per row, `stride` elements
 * between rows) into a swizzled tile; rows at or past T are zero-filled. */
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_async(bf16 *tile, const bf16 *base, int64_t stride,
                                                int row0, int T)
{
    constexpr int CHUNKS_PER_ROW = D / 8;
#pragma unroll
    for (int c = threadIdx.x; c < ROWS * CHUNKS_PER_ROW; c += THREADS) {
        int r = c / CHUNKS_PER_ROW, chunk = c % CHUNKS_PER_ROW;
        int inside = row0 + r < T;
        const bf16 *src = inside ? base + (int64_t)(row0 + r) * stride + chunk * 8 : base;
        cp_async_16(tile + swizzle<D>(r, chunk * 8), src, inside ? 16 : 0);
    }
}

/* Kernel arguments shared by the forward and the backward. */
struct flash_params {
    const bf16 *q, *k, *v, *o, *dout;
    const int32_t *doc_ids;
    bf16 *o_out, *dq, *dk, *dv;
    float *lse_out, *dq_accum, *delta;
    const float *lse;
    int batch, seq, heads, kv_heads, group;
    float scale;      /* softmax scale */
    float scale_log2; /* scale * log2(e): exponentials are taken as exp2 */
    /* backward (wgmma) work decomposition, set by flash_backward.cu: the query heads of a group are
     * split over bwd_split blocks per key tile (bwd_split > 1: fp32 dK/dV partials [2][split][B*T*KV][D]
     * in dkv_partial, summed after); blocks run bwd_chunk (batch, kv head, split) units at a time;
     * bwd_dq_bulk: dq_accum is [B][H][D/64][T rounded up to 64][64], added to with bulk reduce-adds;
     * bwd_ring: head dim 64's warpgroups synchronize through an mbarrier ring, not block barriers */
    float *dkv_partial;
    int bwd_split, bwd_chunk, bwd_dq_bulk, bwd_ring;
};

static inline zt_status flash_check(const char *what, const zt_cuda_attention_shape *s,
                                    const void *const *ptrs, int n_ptrs)
{
    if (s->batch <= 0 || s->seq <= 0 || s->heads <= 0 || s->kv_heads <= 0 ||
        s->heads % s->kv_heads != 0 || s->seq > INT32_MAX / 2 || s->batch > 65535 ||
        s->heads > 65535)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s: batch %lld, seq %lld, heads %lld, kv_heads %lld: all must be "
                            "positive and heads a multiple of kv_heads",
                            what, (long long)s->batch, (long long)s->seq, (long long)s->heads,
                            (long long)s->kv_heads);
    if (s->head_dim != 64 && s->head_dim != 128)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "%s: head_dim %lld is not supported; the flash kernels are built for "
                            "64 and 128", what, (long long)s->head_dim);
    if (!(s->scale > 0.0f))
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: softmax scale %g must be positive", what,
                            (double)s->scale);
    for (int i = 0; i < n_ptrs; i++)
        if (!ptrs[i] || (uintptr_t)ptrs[i] % 16 != 0)
            return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                                "%s: tensor argument %d is NULL or not 16-byte aligned", what, i + 1);
    return ZT_OK;
}

static inline flash_params flash_make_params(const zt_cuda_attention_shape *s)
{
    flash_params p = {};
    p.batch = (int)s->batch;
    p.seq = (int)s->seq;
    p.heads = (int)s->heads;
    p.kv_heads = (int)s->kv_heads;
    p.group = (int)(s->heads / s->kv_heads);
    p.scale = s->scale;
    p.scale_log2 = s->scale * 1.4426950408889634f;
    return p;
}

/* Raises a kernel's dynamic shared-memory limit, or explains why the device cannot run it. */
template <typename Kernel>
static zt_status flash_prepare(zt_cuda_ctx *ctx, const char *what, Kernel kernel, size_t smem)
{
    if ((int64_t)smem > ctx->max_smem_per_block)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "%s needs %zu bytes of shared memory per block; this GPU allows %d. "
                            "Use head_dim 64 or a GPU with more shared memory (A100, H100)",
                            what, smem, ctx->max_smem_per_block);
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess)
        return zt_cuda_fail(ZT_ERR_DEVICE, "%s: cudaFuncSetAttribute failed: %s", what,
                            cudaGetErrorString(e));
    return ZT_OK;
}

#endif
