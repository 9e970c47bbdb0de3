/* Internals shared by the .cu files of kernels/cuda: the context, error reporting and bf16 helpers.
 * Not part of the C API (kernels_cuda.h is). */
#ifndef ZT_KERNELS_CUDA_COMMON_CUH
#define ZT_KERNELS_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "cuda/kernels_cuda.h"

/* Slots of zt_cuda_ctx.index_errors: where an out-of-range device-side index was seen. */
enum zt_index_slot {
    ZT_INDEX_EMBEDDING_FORWARD = 0,
    ZT_INDEX_EMBEDDING_BACKWARD = 1,
    ZT_INDEX_CROSS_ENTROPY = 2,
    ZT_INDEX_SLOTS = 3
};

/* One cuBLASLt problem, remembered with the algorithm its heuristic chose so that repeated shapes
 * (every layer of every step) skip the descriptor setup and the heuristic query. */
struct zt_gemm_plan {
    int64_t key[12];
    int used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};
enum { ZT_GEMM_PLAN_CACHE = 64 };

struct zt_cuda_ctx {
    int device;
    int sm_count;
    int max_smem_per_block; /* opt-in limit, bytes */
    cublasLtHandle_t lt;
    void *lt_workspace;
    size_t lt_workspace_bytes;
    int owns_lt; /* 1: lt and lt_workspace are this context's (zt_cuda_ctx_create); 0: borrowed */
    void *scratch;
    uint64_t scratch_bytes;
    void **retired; /* earlier scratch buffers, kept until destroy (zt_cuda_ctx_grow_scratch) */
    int n_retired;
    /* Per slot: (row << 32 | uint32 value) of the lowest bad row, or ~0 when none. */
    unsigned long long *index_errors;
    zt_gemm_plan plans[ZT_GEMM_PLAN_CACHE];
    int next_plan; /* round-robin replacement when the cache is full */
    /* The 16-bit type of activations, matmul inputs and compute copies: ZT_BF16 (default) or ZT_F16
     * (zt_cuda_ctx_set_dtype). The uint16_t* entry points dispatch on it. */
    int32_t dtype;
};

/* Records the message for zt_cuda_last_error and returns status. */
zt_status zt_cuda_fail(zt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ZT_OK, or ZT_ERR_DEVICE naming `what` when the launch just made (or earlier work) failed. */
zt_status zt_cuda_check_launch(const char *what);

/* The context's scratch, or NULL (with the error recorded) when it holds fewer than `bytes`. */
void *zt_cuda_scratch(zt_cuda_ctx *ctx, uint64_t bytes, const char *what);

/* GEMMs of a few rows (gemm_small_m.cu): C[M,N] (+)= alpha A[M,K] B[N,K]^T for M up to
 * ZT_CUDA_SMALL_M_ROWS, streaming B once, where cuBLASLt's tiles would mostly be padding. One row
 * only: on a 7B decode step (H200) it beat cuBLASLt by 3% at M = 1 and ran at half its speed at
 * M = 8, where reading A from L1 for every weight chunk costs more than the padding saves. fits:
 * whether this shape and layout can go there (no transposed A, transposed B, K and the leading
 * dimensions of A and B multiples of 8, A and B 16-byte aligned, not switched off by
 * ZT_CUDA_SMALL_M_GEMM=0). C_in NULL: C itself when accumulating. */
#define ZT_CUDA_SMALL_M_ROWS 1
int zt_cuda_small_m_gemm_fits(int trans_a, int trans_b, int64_t M, int64_t K, const void *A, int64_t lda,
                              const void *B, int64_t ldb);
zt_status zt_cuda_small_m_gemm(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M, int64_t N, int64_t K, float alpha,
                               const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, const void *C_in,
                               void *C, int32_t c_dtype, int64_t ldc, int accumulate);

/* Frees the cached cuBLASLt descriptors (gemm.cu). */
void zt_cuda_release_gemm_plans(zt_cuda_ctx *ctx);

/* Grid size for a grid-stride loop over n items with `threads` per block. */
static inline unsigned zt_grid_for(int64_t n, int threads, const zt_cuda_ctx *ctx)
{
    int64_t blocks = (n + threads - 1) / threads;
    int64_t cap = (int64_t)ctx->sm_count * 32;
    if (blocks > cap) blocks = cap;
    return (unsigned)(blocks > 0 ? blocks : 1);
}

static inline uint64_t zt_round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* ---- device helpers -------------------------------------------------------------------------- */

typedef __nv_bfloat16 bf16;

/* 8 bf16 values moved as one 16-byte access. */
union zt_bf16x8 {
    uint4 raw;
    __nv_bfloat162 pair[4];
};

__device__ __forceinline__ void zt_load8(const bf16 *p, float out[8])
{
    zt_bf16x8 v;
    v.raw = *reinterpret_cast<const uint4 *>(p);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(v.pair[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ void zt_store8(bf16 *p, const float in[8])
{
    zt_bf16x8 v;
#pragma unroll
    for (int i = 0; i < 4; i++) v.pair[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    *reinterpret_cast<uint4 *>(p) = v.raw;
}

/* The same for IEEE half (fp16 compute, fp16.enabled): 8 values per 16-byte access. */
typedef __half f16;

union zt_f16x8 {
    uint4 raw;
    __half2 pair[4];
};

__device__ __forceinline__ void zt_load8(const f16 *p, float out[8])
{
    zt_f16x8 v;
    v.raw = *reinterpret_cast<const uint4 *>(p);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __half22float2(v.pair[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ void zt_store8(f16 *p, const float in[8])
{
    zt_f16x8 v;
#pragma unroll
    for (int i = 0; i < 4; i++) v.pair[i] = __floats2half2_rn(in[2 * i], in[2 * i + 1]);
    *reinterpret_cast<uint4 *>(p) = v.raw;
}

/* Scalar conversions for kernels templated on the 16-bit element type T (bf16 or f16):
 * zt_to_f32(x) widens, zt_from_f32<T>(v) rounds to nearest even (fp16: beyond 65504 -> inf, which
 * is what the loss scaler's overflow check needs to see). */
__device__ __forceinline__ float zt_to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float zt_to_f32(f16 x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T zt_from_f32(float v);
template <> __device__ __forceinline__ bf16 zt_from_f32<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ f16 zt_from_f32<f16>(float v) { return __float2half_rn(v); }

/* Runs `...` with T the context's 16-bit type: ZT_DISPATCH16(ctx->dtype, T, kernel<T><<<...>>>(...)). */
#define ZT_DISPATCH16(dtype, T, ...)                                                              \
    do {                                                                                          \
        if ((dtype) == ZT_F16) {                                                                  \
            typedef f16 T;                                                                        \
            __VA_ARGS__;                                                                          \
        } else {                                                                                  \
            typedef bf16 T;                                                                       \
            __VA_ARGS__;                                                                          \
        }                                                                                         \
    } while (0)

/* The context's 16-bit type as cuBLAS names it, and in words for messages. */
static inline cudaDataType_t zt_cuda_type16(int32_t dtype) { return dtype == ZT_F16 ? CUDA_R_16F : CUDA_R_16BF; }
static inline const char *zt_dtype16_name(int32_t dtype) { return dtype == ZT_F16 ? "fp16" : "bf16"; }

__device__ __forceinline__ float zt_warp_sum(float x)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * `shared` holds 32 floats. The order of additions is fixed, so the result is deterministic. */
__device__ __forceinline__ float zt_block_sum(float x, float *shared)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    x = zt_warp_sum(x);
    __syncthreads(); /* `shared` may still be read by a previous call */
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < warps ? shared[lane] : 0.0f;
    return zt_warp_sum(x);
}

/* Records row `row` holding the out-of-range value `value` (keeps the lowest row). */
__device__ __forceinline__ void zt_record_bad_index(unsigned long long *slot, int64_t row,
                                                    int32_t value)
{
    unsigned long long code = ((unsigned long long)row << 32) | (uint32_t)value;
    atomicMin(slot, code);
}

#endif
