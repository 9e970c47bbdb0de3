/* Hopper (sm_90a) building blocks of the wgmma flash attention kernels: warpgroup MMA wrappers,
 * shared-memory matrix descriptors, the 128-byte swizzled tile layout they read, and the fences.
 * Include only from files compiled for sm_90a (kernels/CMakeLists.txt builds flash_*_sm90.cu so).
 *
 * Tile layout (the "128B swizzle" of the wgmma descriptors): a [ROWS][L] bf16 tile is stored as L/64
 * column blocks, each [ROWS][64] (rows of 128 bytes), block j at element offset j * ROWS * 64. In a
 * block, 16-byte chunk c of row r sits at chunk position c ^ (r % 8): the hardware applies the same
 * XOR to address bits 4-6 from bits 7-9, so every block must start 1024-byte aligned.
 *
 * Descriptors (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29 leading
 * byte offset >> 4, 32-45 stride byte offset >> 4, 62-63 swizzle mode (1 = 128B).
 *   K-major operand (Q and K for S = Q K^T; the reduction dim is contiguous): SBO = 1024 (one group
 *   of 8 rows), LBO unused (1). A k16 step inside a 64-wide block adds 32 bytes to the start.
 *   MN-major operand (V for O += P V, stored [keys][D] with D contiguous; transposed B): LBO = the
 *   byte distance between 64-column blocks, SBO = 1024 (8 keys); a k16 step adds 16 rows = 2048 B.
 *
 * Accumulator fragment of m64nNk16 (fp32): warp w of the warpgroup holds rows 16w..16w+15; lane
 * 4g + t holds, per 8-column chunk j, d[j][0..1] = (row g, cols 8j+2t, +1), d[j][2..3] = (row g+8,
 * same cols): per warp exactly the mma.m16n8k16 C layout of flash_common.cuh. The register A operand
 * has the mma.m16n8k16 A layout per warp, so P goes from S's accumulators to the PV product by
 * packing pairs to bf16, as in the mma.sync kernels.
 *
 * The MMA wrappers are templated on the element type T (bf16, or f16 for fp16.enabled): the same
 * instruction with .f16 inputs instead of .bf16 (fp32 accumulators, the same operand layouts and
 * transposes); the tiles hold either type's 16-bit elements (flash_common.cuh).
 */
#ifndef ZT_KERNELS_CUDA_FLASH_WGMMA_CUH
#define ZT_KERNELS_CUDA_FLASH_WGMMA_CUH

#include <stdint.h>
#include <type_traits>
#include "cuda/flash_common.cuh"

/* Element offset of (row, col) in a swizzled [ROWS][L] tile (layout above). */
template <int ROWS>
__device__ __forceinline__ int sw128_offset(int row, int col)
{
    return (col >> 6) * ROWS * 64 + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

/* Copies rows [row0, row0 + ROWS) of a [T, ...] tensor (D elements per row, `stride` elements between
 * rows) into a swizzled tile with cp.async; rows at or past T are zero-filled (finite: P * V must not
 * meet NaN garbage). */
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void sw128_load_async(bf16 *tile, const bf16 *base, int64_t stride, int row0,
                                                 int T, int tid)
{
    constexpr int CHUNKS_PER_ROW = D / 8;
#pragma unroll
    for (int c = tid; c < ROWS * CHUNKS_PER_ROW; c += THREADS) {
        int r = c / CHUNKS_PER_ROW, chunk = c % CHUNKS_PER_ROW;
        int inside = row0 + r < T;
        const bf16 *src = inside ? base + (int64_t)(row0 + r) * stride + chunk * 8 : base;
        cp_async_16(tile + sw128_offset<ROWS>(r, chunk * 8), src, inside ? 16 : 0);
    }
}

__device__ __forceinline__ uint64_t wgmma_desc(const void *smem, uint32_t lbo_bytes, uint32_t sbo_bytes)
{
    uint64_t addr = shared_address(smem);
    return ((addr & 0x3FFFFull) >> 4) | ((uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

/* Orders this warpgroup's register writes (accumulators, A fragments) before the next wgmma. */
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}
/* Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to the async
 * proxy that wgmma reads shared memory through; follow with a barrier. */
__device__ __forceinline__ void fence_proxy_async_shared()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* The compiler sees a wgmma's accumulators as written when the asm statement issues; this empty asm,
 * placed after wgmma_wait, keeps every later read of them after the wait. */
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N][4])
{
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[j][e])::"memory");
}

/* d[64/8][4] += A (shared, K-major) * B (shared, K-major), one m64n64k16 step. */
#define WGMMA_SS_M64N64_ASM(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
        "%32, %33, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
        : "l"(desc_a), "l"(desc_b))
template <typename T>
__device__ __forceinline__ void wgmma_ss_m64n64(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b)
{
    if constexpr (std::is_same<T, f16>::value)
        WGMMA_SS_M64N64_ASM("f16");
    else
        WGMMA_SS_M64N64_ASM("bf16");
}
#undef WGMMA_SS_M64N64_ASM

/* d[64/8][4] += A (registers, the mma.m16n8k16 A fragment per warp) * B (shared, MN-major),
 * one m64n64k16 step. */
#define WGMMA_RS_M64N64_ASM(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
        "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))
template <typename T>
__device__ __forceinline__ void wgmma_rs_m64n64(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b)
{
    if constexpr (std::is_same<T, f16>::value)
        WGMMA_RS_M64N64_ASM("f16");
    else
        WGMMA_RS_M64N64_ASM("bf16");
}
#undef WGMMA_RS_M64N64_ASM

/* d[128/8][4] += A (shared, K-major) * B (shared, K-major), one m64n128k16 step. */
#define WGMMA_SS_M64N128_ASM(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
        "%64, %65, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
        : "l"(desc_a), "l"(desc_b))
template <typename T>
__device__ __forceinline__ void wgmma_ss_m64n128(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b)
{
    if constexpr (std::is_same<T, f16>::value)
        WGMMA_SS_M64N128_ASM("f16");
    else
        WGMMA_SS_M64N128_ASM("bf16");
}
#undef WGMMA_SS_M64N128_ASM

/* d[128/8][4] += A (registers, the mma.m16n8k16 A fragment per warp) * B (shared, MN-major),
 * one m64n128k16 step. */
#define WGMMA_RS_M64N128_ASM(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))
template <typename T>
__device__ __forceinline__ void wgmma_rs_m64n128(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b)
{
    if constexpr (std::is_same<T, f16>::value)
        WGMMA_RS_M64N128_ASM("f16");
    else
        WGMMA_RS_M64N128_ASM("bf16");
}
#undef WGMMA_RS_M64N128_ASM

/* d[64/8][4] += A (shared, MN-major: stored [k][m]) * B (shared, MN-major: stored [k][n]), one
 * m64n64k16 step (both operands transposed). */
#define WGMMA_SS_M64N64_TT_ASM(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
        "%32, %33, 1, 1, 1, 1, 1;\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
        : "l"(desc_a), "l"(desc_b))
template <typename T>
__device__ __forceinline__ void wgmma_ss_m64n64_tt(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b)
{
    if constexpr (std::is_same<T, f16>::value)
        WGMMA_SS_M64N64_TT_ASM("f16");
    else
        WGMMA_SS_M64N64_TT_ASM("bf16");
}
#undef WGMMA_SS_M64N64_TT_ASM

/* d[128/8][4] (+)= A (shared, K-major) * B (shared, K-major), one m64n128k16 step; accumulate = 0
 * overwrites d (the first k step of a product: no zeroing of the accumulators, no register writes
 * that would need a wgmma_fence). */
#define WGMMA_SS_M64N128_ACC_ASM(TY) \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
        "%64, %65, p, 1, 1, 0, 0;\n}\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
        : "l"(desc_a), "l"(desc_b), "r"(accumulate))
template <typename T>
__device__ __forceinline__ void wgmma_ss_m64n128_acc(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b,
                                                     int accumulate)
{
    if constexpr (std::is_same<T, f16>::value)
        WGMMA_SS_M64N128_ACC_ASM("f16");
    else
        WGMMA_SS_M64N128_ACC_ASM("bf16");
}
#undef WGMMA_SS_M64N128_ACC_ASM

/* wgmma_ss_m64n64 with accumulate = 0 overwriting d (the first k step of a product: no zeroing of the
 * accumulators, so no register writes before the chain). */
#define WGMMA_SS_M64N64_ACC_ASM(TY) \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
        "%32, %33, p, 1, 1, 0, 0;\n}\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
        : "l"(desc_a), "l"(desc_b), "r"(accumulate))
template <typename T>
__device__ __forceinline__ void wgmma_ss_m64n64_acc(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    if constexpr (std::is_same<T, f16>::value)
        WGMMA_SS_M64N64_ACC_ASM("f16");
    else
        WGMMA_SS_M64N64_ACC_ASM("bf16");
}
#undef WGMMA_SS_M64N64_ACC_ASM

/* wgmma_ss_m64n64_tt (both operands transposed) with accumulate = 0 overwriting d. */
#define WGMMA_SS_M64N64_TT_ACC_ASM(TY) \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
        "%32, %33, p, 1, 1, 1, 1;\n}\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
        : "l"(desc_a), "l"(desc_b), "r"(accumulate))
template <typename T>
__device__ __forceinline__ void wgmma_ss_m64n64_tt_acc(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    if constexpr (std::is_same<T, f16>::value)
        WGMMA_SS_M64N64_TT_ACC_ASM("f16");
    else
        WGMMA_SS_M64N64_TT_ACC_ASM("bf16");
}
#undef WGMMA_SS_M64N64_TT_ACC_ASM

/* ---- what the two Hopper backwards (flash_backward_sm90.cu, flash_backward_sm90_ws.cu) share ---- */

/* An m64nN fp32 accumulator x ([N/8][4], layout above) rounded to T and packed as the register A
 * operand of N/16 k16 steps: how P^T and dS^T go from their products to the dV and dK products. */
template <typename T, int N8>
__device__ __forceinline__ void pack_a_fragments(const float (&x)[N8][4], uint32_t (&a)[N8 / 2][4])
{
#pragma unroll
    for (int kq = 0; kq < N8 / 2; kq++) {
        a[kq][0] = pack16<T>(x[2 * kq][0], x[2 * kq][1]);
        a[kq][1] = pack16<T>(x[2 * kq][2], x[2 * kq][3]);
        a[kq][2] = pack16<T>(x[2 * kq + 1][0], x[2 * kq + 1][1]);
        a[kq][3] = pack16<T>(x[2 * kq + 1][2], x[2 * kq + 1][3]);
    }
}

/* dS^T = P^T (dP^T - delta) in place over dp (keys x queries), from the T-rounded P^T (pa, as
 * pack_a_fragments made it), as the mma.sync backward does; delta indexed by the query column. */
template <typename T, int N8>
__device__ __forceinline__ void ds_from_p(float (&dp)[N8][4], const uint32_t (&pa)[N8 / 2][4], const float *delta,
                                          int t4)
{
#pragma unroll
    for (int n = 0; n < N8; n++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float2 prob = unpack16<T>(pa[n / 2][(n % 2) * 2 + r]);
            int q_local = n * 8 + 2 * t4;
            dp[n][2 * r] = prob.x * (dp[n][2 * r] - delta[q_local]);
            dp[n][2 * r + 1] = prob.y * (dp[n][2 * r + 1] - delta[q_local + 1]);
        }
    }
}

/* Register A fragments (a thread's rows `row` and row + 8, 16 columns per k16 step) stored into a
 * swizzled [ROWS][16 K16] tile of one column block: dS^T for the dQ product. */
template <int ROWS, int K16>
__device__ __forceinline__ void store_a_fragments(bf16 *tile, int row, int t4, const uint32_t (&a)[K16][4])
{
#pragma unroll
    for (int kq = 0; kq < K16; kq++) {
        int col = kq * 16 + 2 * t4;
        *reinterpret_cast<uint32_t *>(tile + sw128_offset<ROWS>(row, col)) = a[kq][0];
        *reinterpret_cast<uint32_t *>(tile + sw128_offset<ROWS>(row + 8, col)) = a[kq][1];
        *reinterpret_cast<uint32_t *>(tile + sw128_offset<ROWS>(row, col + 8)) = a[kq][2];
        *reinterpret_cast<uint32_t *>(tile + sw128_offset<ROWS>(row + 8, col + 8)) = a[kq][3];
    }
}

/* acc (64 x D) += A (registers, K16 k16 steps) * B, B a swizzled [16 K16 rows][D] tile read
 * transposed (16 rows, 2048 bytes, per k16 step; column blocks `block_bytes` apart): dV += P^T dO
 * and dK += dS^T Q. Issued only: the caller fences, commits and waits. */
template <typename T, int D, int K16>
__device__ __forceinline__ void wgmma_rs_accumulate(float (&acc)[D / 8][4], const uint32_t (&a)[K16][4],
                                                    const bf16 *b, uint32_t block_bytes)
{
    static_assert(D == 64 || D == 128, "head dim 64 or 128");
#pragma unroll
    for (int kq = 0; kq < K16; kq++) {
        const uint64_t desc = wgmma_desc(b + kq * 16 * 64, block_bytes, 1024);
        if constexpr (D == 128)
            wgmma_rs_m64n128<T>(acc, a[kq], desc);
        else
            wgmma_rs_m64n64<T>(acc, a[kq], desc);
    }
}

#endif
