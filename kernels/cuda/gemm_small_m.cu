/* C[M,N] (+)= A[M,K] B[N,K]^T for a few rows M (the kernel takes up to 8; gemm.cu sends it M = 1,
 * the measured win: common.cuh): the linear layers of a decode step at small batch, where every weight is read once per step and the step is bound by that read. cuBLASLt's
 * tensor-core tiles are 64+ rows tall, so at M = 1 most of each tile is padding and its kernels read
 * the weights well below the memory's bandwidth; here one warp streams one weight row (16-byte
 * loads that bypass L1, as nothing reads them again) and dots it with the M rows of A (read through
 * L1: every warp of the block reads the same A), fp32 accumulation, one warp reduction per row.
 * gemm.cu sends a GEMM here when it has this shape and layout (zt_cuda_small_m_gemm_fits);
 * ZT_CUDA_SMALL_M_GEMM=0 sends every GEMM to cuBLASLt (to compare the two).
 */
#include <stdlib.h>
#include <string.h>

#include "cuda/common.cuh"

namespace {

constexpr int WARPS = 8; /* warps (weight rows) per block */
constexpr int UNROLL = 4; /* 16-byte weight loads in flight per lane */

__device__ __forceinline__ uint4 load_streaming(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* 8 values of T in a register to fp32 (common.cuh's zt_load8 on the register's bytes). */
template <typename T> __device__ __forceinline__ void widen8(uint4 raw, float out[8])
{
    zt_load8(reinterpret_cast<const T *>(&raw), out);
}

struct small_m_args {
    const void *A, *B, *C_in;
    void *C;
    int64_t lda, ldb, ldc, N, K;
    int M, c_f32, accumulate;
    float alpha;
};

template <typename T, int MAX_M>
__global__ void __launch_bounds__(WARPS * 32) small_m_kernel(small_m_args a)
{
    const int lane = threadIdx.x % 32;
    const int64_t n = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    if (n >= a.N) return;
    const uint4 *b = reinterpret_cast<const uint4 *>(static_cast<const T *>(a.B) + n * a.ldb);
    const T *A = static_cast<const T *>(a.A);
    const int64_t chunks = a.K / 8;
    float acc[MAX_M];
#pragma unroll
    for (int m = 0; m < MAX_M; m++) acc[m] = 0.0f;
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * UNROLL) {
        uint4 w[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) { /* all loads first: UNROLL in flight */
            int64_t c = c0 + (int64_t)u * 32;
            w[u] = c < chunks ? load_streaming(b + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int64_t c = c0 + (int64_t)u * 32;
            if (c >= chunks) break;
            float wf[8];
            widen8<T>(w[u], wf);
#pragma unroll
            for (int m = 0; m < MAX_M; m++) {
                if (m >= a.M) break;
                float x[8];
                widen8<T>(__ldg(reinterpret_cast<const uint4 *>(A + m * a.lda) + c), x);
#pragma unroll
                for (int i = 0; i < 8; i++) acc[m] = fmaf(wf[i], x[i], acc[m]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MAX_M; m++) {
        if (m >= a.M) break;
        float v = zt_warp_sum(acc[m]) * a.alpha;
        if (lane != m % 32) continue;
        int64_t at = m * a.ldc + n;
        if (a.c_f32) {
            if (a.accumulate) v += static_cast<const float *>(a.C_in)[at];
            static_cast<float *>(a.C)[at] = v;
        } else {
            if (a.accumulate) v += zt_to_f32(static_cast<const T *>(a.C_in)[at]);
            static_cast<T *>(a.C)[at] = zt_from_f32<T>(v);
        }
    }
}

template <typename T> void launch(const small_m_args &a, cudaStream_t stream)
{
    dim3 grid((unsigned)((a.N + WARPS - 1) / WARPS));
    if (a.M == 1) small_m_kernel<T, 1><<<grid, WARPS * 32, 0, stream>>>(a);
    else small_m_kernel<T, 8><<<grid, WARPS * 32, 0, stream>>>(a); /* up to 8 (not reached: ZT_CUDA_SMALL_M_ROWS) */
}

int small_m_enabled()
{
    static int enabled = -1;
    if (enabled < 0) {
        const char *v = getenv("ZT_CUDA_SMALL_M_GEMM");
        enabled = !(v && strcmp(v, "0") == 0);
    }
    return enabled;
}

} // namespace

int zt_cuda_small_m_gemm_fits(int trans_a, int trans_b, int64_t M, int64_t K, const void *A, int64_t lda,
                              const void *B, int64_t ldb)
{
    return small_m_enabled() && !trans_a && trans_b && M >= 1 && M <= ZT_CUDA_SMALL_M_ROWS && K >= 8 && K % 8 == 0 &&
           lda % 8 == 0 && ldb % 8 == 0 && (uintptr_t)A % 16 == 0 && (uintptr_t)B % 16 == 0;
}

zt_status zt_cuda_small_m_gemm(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M, int64_t N, int64_t K, float alpha,
                               const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, const void *C_in,
                               void *C, int32_t c_dtype, int64_t ldc, int accumulate)
{
    if (M > 8) return zt_cuda_fail(ZT_ERR_INVALID_ARG, "GEMM of a few rows: M = %lld is above 8", (long long)M);
    small_m_args a = {A, B, C_in ? C_in : C, C, lda, ldb, ldc, N, K, (int)M, c_dtype == ZT_F32, accumulate != 0, alpha};
    ZT_DISPATCH16(ctx->dtype, T, launch<T>(a, stream));
    return zt_cuda_check_launch("GEMM of a few rows (gemm_small_m.cu)");
}
