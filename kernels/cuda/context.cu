/* The CUDA kernels' context (device, cuBLASLt handle and workspace, its own or borrowed from the
 * host, scratch, device-side index errors), error messages, and the element-wise conversions. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/common.cuh"
#include "cpu/f16.h"

/* ---- errors ---------------------------------------------------------------------------------- */

static thread_local char last_error[1024];

const char *zt_cuda_last_error(void) { return last_error; }

zt_status zt_cuda_fail(zt_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

zt_status zt_cuda_check_launch(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return ZT_OK;
    return zt_cuda_fail(ZT_ERR_DEVICE, "%s: CUDA kernel launch failed: %s (%s); an earlier kernel "
                        "may have failed asynchronously: rerun with CUDA_LAUNCH_BLOCKING=1 to find it",
                        what, cudaGetErrorString(e), cudaGetErrorName(e));
}

void *zt_cuda_scratch(zt_cuda_ctx *ctx, uint64_t bytes, const char *what)
{
    if (bytes <= ctx->scratch_bytes) return ctx->scratch;
    zt_cuda_fail(ZT_ERR_BUFFER_TOO_SMALL,
                 "%s needs %llu bytes of scratch but the CUDA context has %llu; create the context "
                 "with at least that much (see the zt_cuda_*_scratch_bytes queries)",
                 what, (unsigned long long)bytes, (unsigned long long)ctx->scratch_bytes);
    return NULL;
}

/* ---- context --------------------------------------------------------------------------------- */

enum { LT_WORKSPACE_BYTES = 32 << 20 }; /* cuBLAS's recommendation for Hopper */
static const uint64_t DEFAULT_SCRATCH_BYTES = 64ull << 20;

static zt_status cuda_error(const char *call, cudaError_t e)
{
    return zt_cuda_fail(e == cudaErrorMemoryAllocation ? ZT_ERR_OUT_OF_MEMORY : ZT_ERR_DEVICE,
                        "CUDA context: %s failed: %s (%s)", call, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}

/* Both constructors: lt == NULL makes the context's own handle and workspace, else it borrows them. */
static zt_status ctx_create(int device, uint64_t scratch_bytes, void *lt, void *lt_workspace,
                            uint64_t lt_workspace_bytes, zt_cuda_ctx **out)
{
    *out = NULL;
    zt_cuda_ctx *ctx = (zt_cuda_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) return zt_cuda_fail(ZT_ERR_OUT_OF_MEMORY, "CUDA context: out of host memory");
    ctx->device = device;
    ctx->dtype = ZT_BF16;
    ctx->scratch_bytes = scratch_bytes ? scratch_bytes : DEFAULT_SCRATCH_BYTES;
    ctx->owns_lt = lt == NULL;
    if (!ctx->owns_lt) { /* set first, so a failure below never frees what the caller owns */
        ctx->lt = (cublasLtHandle_t)lt;
        ctx->lt_workspace = lt_workspace;
        ctx->lt_workspace_bytes = (size_t)lt_workspace_bytes;
    }
    cudaError_t e;
    zt_status st = ZT_OK;
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        st = cuda_error("cudaSetDevice", e);
    } else if ((e = cudaDeviceGetAttribute(&ctx->sm_count, cudaDevAttrMultiProcessorCount,
                                           device)) != cudaSuccess ||
               (e = cudaDeviceGetAttribute(&ctx->max_smem_per_block,
                                           cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) !=
                   cudaSuccess) {
        st = cuda_error("cudaDeviceGetAttribute", e);
    } else if (ctx->owns_lt &&
               (e = cudaMalloc(&ctx->lt_workspace, LT_WORKSPACE_BYTES)) != cudaSuccess) {
        st = cuda_error("cudaMalloc (cuBLASLt workspace, 32 MiB)", e);
    } else if ((e = cudaMalloc(&ctx->scratch, ctx->scratch_bytes)) != cudaSuccess) {
        st = cuda_error("cudaMalloc (scratch)", e);
    } else if ((e = cudaMalloc(&ctx->index_errors, ZT_INDEX_SLOTS * sizeof(unsigned long long))) !=
               cudaSuccess) {
        st = cuda_error("cudaMalloc (index errors)", e);
    } else if ((e = cudaMemset(ctx->index_errors, 0xff,
                               ZT_INDEX_SLOTS * sizeof(unsigned long long))) != cudaSuccess) {
        st = cuda_error("cudaMemset", e);
    } else {
        cublasStatus_t cs = CUBLAS_STATUS_SUCCESS;
        if (ctx->owns_lt) {
            ctx->lt_workspace_bytes = LT_WORKSPACE_BYTES;
            cs = cublasLtCreate(&ctx->lt);
        }
        if (cs != CUBLAS_STATUS_SUCCESS)
            st = zt_cuda_fail(ZT_ERR_DEVICE, "CUDA context: cublasLtCreate failed: %s",
                              cublasGetStatusString(cs));
        else if ((e = cudaDeviceSynchronize()) != cudaSuccess)
            st = cuda_error("cudaDeviceSynchronize", e);
    }
    if (st != ZT_OK) {
        zt_cuda_ctx_destroy(ctx);
        return st;
    }
    *out = ctx;
    return ZT_OK;
}

zt_status zt_cuda_ctx_create(int device, uint64_t scratch_bytes, zt_cuda_ctx **out)
{
    return ctx_create(device, scratch_bytes, NULL, NULL, 0, out);
}

zt_status zt_cuda_ctx_create_shared(int device, uint64_t scratch_bytes, void *cublaslt, void *workspace,
                                    uint64_t workspace_bytes, zt_cuda_ctx **out)
{
    *out = NULL;
    if (!cublaslt || !workspace || !workspace_bytes)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "CUDA context: a shared context needs a cuBLASLt handle and a workspace (got "
                            "handle %p, workspace %p of %llu bytes); use zt_cuda_ctx_create for a context of "
                            "its own", cublaslt, workspace, (unsigned long long)workspace_bytes);
    return ctx_create(device, scratch_bytes, cublaslt, workspace, workspace_bytes, out);
}

void zt_cuda_ctx_destroy(zt_cuda_ctx *ctx)
{
    if (!ctx) return;
    zt_cuda_release_gemm_plans(ctx);
    if (ctx->owns_lt) {
        if (ctx->lt) cublasLtDestroy(ctx->lt);
        cudaFree(ctx->lt_workspace);
    }
    cudaFree(ctx->scratch);
    for (int i = 0; i < ctx->n_retired; i++) cudaFree(ctx->retired[i]);
    free(ctx->retired);
    cudaFree(ctx->index_errors);
    free(ctx);
}

uint64_t zt_cuda_ctx_scratch_bytes(const zt_cuda_ctx *ctx) { return ctx->scratch_bytes; }

zt_status zt_cuda_ctx_grow_scratch(zt_cuda_ctx *ctx, uint64_t bytes)
{
    if (bytes <= ctx->scratch_bytes) return ZT_OK;
    void **retired = (void **)realloc(ctx->retired, (size_t)(ctx->n_retired + 1) * sizeof *retired);
    if (!retired) return zt_cuda_fail(ZT_ERR_OUT_OF_MEMORY, "CUDA context: out of host memory");
    ctx->retired = retired;
    void *fresh = NULL;
    cudaError_t e = cudaMalloc(&fresh, (size_t)bytes);
    if (e != cudaSuccess) return cuda_error("cudaMalloc (a larger scratch)", e);
    ctx->retired[ctx->n_retired++] = ctx->scratch; /* a captured graph may still read it */
    ctx->scratch = fresh;
    ctx->scratch_bytes = bytes;
    return ZT_OK;
}

zt_status zt_cuda_ctx_set_dtype(zt_cuda_ctx *ctx, int32_t dtype)
{
    if (dtype != ZT_BF16 && dtype != ZT_F16)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "CUDA context: compute dtype %d is not ZT_BF16 (%d) or ZT_F16 (%d); the GPU "
                            "kernels compute in bf16 or fp16 only", (int)dtype, (int)ZT_BF16, (int)ZT_F16);
    ctx->dtype = dtype;
    return ZT_OK;
}

int32_t zt_cuda_ctx_dtype(const zt_cuda_ctx *ctx) { return ctx ? ctx->dtype : ZT_BF16; }

zt_status zt_cuda_check_indices(zt_cuda_ctx *ctx, cudaStream_t stream)
{
    static const char *const kernel_names[ZT_INDEX_SLOTS] = {
        "embedding forward: token id", "embedding backward: token id", "cross-entropy: target"};
    static const char *const expected[ZT_INDEX_SLOTS] = {
        "[0, vocab)", "[0, vocab)", "[0, vocab) or -100 (ignored)"};
    unsigned long long codes[ZT_INDEX_SLOTS];
    cudaError_t e = cudaMemcpyAsync(codes, ctx->index_errors, sizeof codes,
                                    cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e == cudaSuccess)
        e = cudaMemsetAsync(ctx->index_errors, 0xff, sizeof codes, stream);
    if (e != cudaSuccess) return cuda_error("checking token ids and targets", e);
    for (int slot = 0; slot < ZT_INDEX_SLOTS; slot++) {
        if (codes[slot] == ~0ull) continue;
        long long row = (long long)(codes[slot] >> 32);
        int32_t value = (int32_t)(uint32_t)(codes[slot] & 0xffffffffu);
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s %d at row %lld is outside %s; the row was treated as absent. Check "
                            "that the data was tokenized with this model's tokenizer (vocab size)",
                            kernel_names[slot], value, row, expected[slot]);
    }
    return ZT_OK;
}

/* ---- host conversions ------------------------------------------------------------------------ */

void zt_cuda_bf16_from_f32_host(const float *in, uint16_t *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &in[i], 4);
        if ((bits & 0x7fffffffu) > 0x7f800000u) { /* NaN: keep it a quiet NaN */
            out[i] = (uint16_t)((bits >> 16) | 0x40);
            continue;
        }
        bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest, ties to even */
        out[i] = (uint16_t)(bits >> 16);
    }
}

void zt_cuda_f32_from_bf16_host(const uint16_t *in, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)in[i] << 16;
        memcpy(&out[i], &bits, 4);
    }
}

void zt_cuda_f16_from_f32_host(const float *in, uint16_t *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = zt_f16_bits_from_f32(in[i]);
}

void zt_cuda_f32_from_f16_host(const uint16_t *in, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = zt_f32_from_f16_bits(in[i]);
}

/* ---- device conversions and add -------------------------------------------------------------- */

template <typename T> __global__ void cast_f32_to_16_kernel(int64_t n, const float *in, T *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = zt_from_f32<T>(in[i]);
}

template <typename T> __global__ void cast_16_to_f32_kernel(int64_t n, const T *in, float *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = zt_to_f32(in[i]);
}

template <typename T> __global__ void add_16_kernel(int64_t n, const T *x, T *y)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = zt_from_f32<T>(zt_to_f32(y[i]) + zt_to_f32(x[i]));
}

zt_status zt_cuda_cast_f32_to_bf16(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n,
                                   const float *in, uint16_t *out)
{
    if (n <= 0) return ZT_OK;
    ZT_DISPATCH16(ctx->dtype, T,
                  cast_f32_to_16_kernel<T><<<zt_grid_for(n, 256, ctx), 256, 0, stream>>>(n, in, (T *)out));
    return zt_cuda_check_launch(ctx->dtype == ZT_F16 ? "cast fp32 to fp16" : "cast fp32 to bf16");
}

zt_status zt_cuda_cast_bf16_to_f32(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n,
                                   const uint16_t *in, float *out)
{
    if (n <= 0) return ZT_OK;
    ZT_DISPATCH16(ctx->dtype, T,
                  cast_16_to_f32_kernel<T><<<zt_grid_for(n, 256, ctx), 256, 0, stream>>>(n, (const T *)in, out));
    return zt_cuda_check_launch(ctx->dtype == ZT_F16 ? "cast fp16 to fp32" : "cast bf16 to fp32");
}

zt_status zt_cuda_add_bf16(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n, const uint16_t *x,
                           uint16_t *y)
{
    if (n <= 0) return ZT_OK;
    ZT_DISPATCH16(ctx->dtype, T,
                  add_16_kernel<T><<<zt_grid_for(n, 256, ctx), 256, 0, stream>>>(n, (const T *)x, (T *)y));
    return zt_cuda_check_launch(ctx->dtype == ZT_F16 ? "add fp16" : "add bf16");
}
