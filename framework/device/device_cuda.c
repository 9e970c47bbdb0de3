/* The CUDA device backend (device.h): the MODULE libzt-device-cuda.so. It links the CUDA runtime and
 * cuBLASLt; zt-run does not, and loads this module only for a CUDA run (runtime.c), so zt-run keeps
 * working on machines without CUDA.
 *
 * Device memory comes from the device's stream-ordered pool (cudaMallocAsync / cudaFreeAsync on the
 * compute stream): plugins free activations every layer, and cudaFree would wait for the whole
 * device each time, so the host could never run ahead of the GPU. The pool keeps freed memory for
 * reuse (release threshold: unlimited), as PyTorch's caching allocator does.
 *
 * The device's one cuBLASLt handle and its workspace (zt_device_ctx.cublaslt, .workspace) are made
 * here too, so that every plugin's kernel context shares them (plugins/cuda_plugin.h) instead of each
 * keeping a copy: every plugin GEMM is enqueued on compute_stream, in order, so one workspace is
 * never used by two GEMMs at once. The workspace is cudaMalloc'ed outside the memory pools, as the
 * kernel contexts' own memory is; the dry-run estimate counts it in pool workspace
 * (framework/train/estimate.c). No plain cuBLAS handle is made: zt_device_ctx.cublas is reserved
 * (zt_host.h says why).
 *
 * What the CUDA stack must be (device/requirements.h) is checked where CUDA itself would fail later
 * or with a vaguer message: a driver missing or too old for the runtime when no device is found, a
 * GPU the kernels cannot run on in init. The words are zt-run --env's, which asks the versions
 * through the second export.
 */
#define _GNU_SOURCE /* dladdr */
#include "device/device.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "device/requirements.h"

/* Everything a failed CUDA call needs in its message: the call, CUDA's words and the error's name. */
static zt_status cuda_failed(zt_error *err, cudaError_t e, const char *call)
{
    zt_status st = e == cudaErrorMemoryAllocation ? ZT_ERR_OUT_OF_MEMORY : ZT_ERR_DEVICE;
    cudaGetLastError(); /* clear a non-sticky error so the next call does not report it again */
    return zt_error_set(err, st, "%s failed: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* cuBLAS's recommendation for Hopper, and what kernels/cuda/context.cu gives a context of its own:
 * the GEMM heuristics see the same workspace either way, so they choose the same algorithms. */
#define CUBLASLT_WORKSPACE_BYTES ((uint64_t)32 << 20)

/* The backend keeps no state of its own: the streams and the cuBLASLt handle live in the zt_device_ctx. */
static cudaStream_t compute_stream_of(const zt_device_ctx *ctx)
{
    return (cudaStream_t)ctx->compute_stream;
}

/* What init made, in reverse: the cuBLASLt workspace and handle, then the streams. Every field is
 * NULL afterwards, so this may run on a half-made context. */
static void destroy_handles(zt_device_ctx *ctx)
{
    if (ctx->workspace) cudaFree(ctx->workspace);
    ctx->workspace = NULL;
    ctx->workspace_bytes = 0;
    if (ctx->cublaslt) cublasLtDestroy((cublasLtHandle_t)ctx->cublaslt);
    ctx->cublaslt = NULL;
    void **streams[] = {&ctx->compute_stream, &ctx->comm_stream, &ctx->copy_stream};
    for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++) {
        if (*streams[i]) cudaStreamDestroy((cudaStream_t)*streams[i]);
        *streams[i] = NULL;
    }
}

/* The handle every plugin's GEMMs go through and their workspace (zt_host.h, zt_device_ctx). */
static zt_status create_cublaslt(zt_device_ctx *ctx, zt_error *err)
{
    cublasLtHandle_t lt = NULL;
    cublasStatus_t cs = cublasLtCreate(&lt);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return zt_error_set(err, ZT_ERR_DEVICE, "cublasLtCreate failed: %s (%d); check that the cuBLAS libraries "
                            "match the CUDA runtime and driver (zt-run --env)", cublasLtGetStatusString(cs), (int)cs);
    ctx->cublaslt = lt;
    void *workspace = NULL;
    cudaError_t e = cudaMalloc(&workspace, (size_t)CUBLASLT_WORKSPACE_BYTES);
    if (e != cudaSuccess) return cuda_failed(err, e, "cudaMalloc (the cuBLASLt workspace, 32 MiB)");
    ctx->workspace = workspace;
    ctx->workspace_bytes = CUBLASLT_WORKSPACE_BYTES;
    return ZT_OK;
}

static zt_status cuda_init(int index, zt_device_ctx *ctx, zt_error *err)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->struct_size = sizeof *ctx;
    ctx->device_type = ZT_DEVICE_CUDA;
    ctx->device_index = index;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return cuda_failed(err, e, "cudaGetDeviceCount");
    if (index < 0 || index >= n)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "CUDA device %d does not exist: this process sees %d device%s (0 to %d); check "
                            "CUDA_VISIBLE_DEVICES and the rank's device index",
                            index, n, n == 1 ? "" : "s", n - 1);
    struct cudaDeviceProp prop;
    if ((e = cudaSetDevice(index)) != cudaSuccess) return cuda_failed(err, e, "cudaSetDevice");
    if ((e = cudaGetDeviceProperties(&prop, index)) != cudaSuccess)
        return cuda_failed(err, e, "cudaGetDeviceProperties");
    /* Before anything is made on it: a GPU the kernels cannot run on fails here with zt-run --env's
     * words, not at the first kernel launch ("no kernel image is available"). */
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    char verdict[1024];
    if (zt_cuda_gpu_verdict(prop.major, prop.minor, zt_cuda_architectures(), driver, runtime, verdict,
                            sizeof verdict) != ZT_REQ_OK)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "CUDA device %d (%s), compute capability %d.%d: %s; train on another GPU or on the "
                            "CPU (device = cpu); zt-run --env checks every GPU",
                            index, prop.name, prop.major, prop.minor, verdict);
    int pools = 0;
    cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, index);
    if (!pools)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "CUDA device %d (%s) has no stream-ordered memory pools (cudaMallocAsync), which zt "
                            "allocates from; update the NVIDIA driver (CUDA 11.2 or newer)", index, prop.name);
    cudaMemPool_t pool;
    uint64_t keep_everything = UINT64_MAX;
    if ((e = cudaDeviceGetDefaultMemPool(&pool, index)) != cudaSuccess ||
        (e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything)) != cudaSuccess)
        return cuda_failed(err, e, "configuring the device's memory pool");
    ctx->cc_major = prop.major;
    ctx->cc_minor = prop.minor;
    ctx->sm_count = prop.multiProcessorCount;
    ctx->total_memory = prop.totalGlobalMem;
    cudaStream_t streams[3];
    for (int i = 0; i < 3; i++) {
        if ((e = cudaStreamCreate(&streams[i])) != cudaSuccess) {
            destroy_handles(ctx);
            return cuda_failed(err, e, "cudaStreamCreate");
        }
        void **slot[] = {&ctx->compute_stream, &ctx->comm_stream, &ctx->copy_stream};
        *slot[i] = streams[i];
    }
    zt_status st = create_cublaslt(ctx, err);
    if (st != ZT_OK) destroy_handles(ctx);
    return st;
}

static void cuda_shutdown(zt_device_ctx *ctx)
{
    cudaDeviceSynchronize(); /* nothing may still run on the workspace or the streams */
    destroy_handles(ctx);
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, ctx->device_index) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
}

/* What is free on the device, for an out-of-memory message. */
static void describe_free_memory(zt_error *err)
{
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
        zt_error_append(err, " (the device has %.2f GiB free of %.2f GiB; other processes may hold some)",
                        (double)free_bytes / (1 << 30), (double)total_bytes / (1 << 30));
}

static void *cuda_alloc(const zt_device_ctx *ctx, int where, uint64_t bytes, uint64_t alignment, zt_error *err)
{
    void *ptr = NULL;
    size_t size = bytes ? (size_t)bytes : 1; /* a unique pointer also for 0 bytes */
    if (bytes > SIZE_MAX) {
        zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%llu bytes are more than this machine can address",
                     (unsigned long long)bytes);
        return NULL;
    }
    cudaError_t e;
    if (where == ZT_MEM_DEVICE) {
        e = cudaMallocAsync(&ptr, size, compute_stream_of(ctx));
        if (e != cudaSuccess) {
            cuda_failed(err, e, "cudaMallocAsync");
            if (e == cudaErrorMemoryAllocation) describe_free_memory(err);
            return NULL;
        }
    } else {
        e = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
        if (e != cudaSuccess) {
            cuda_failed(err, e, "cudaHostAlloc (pinned host memory)");
            return NULL;
        }
    }
    /* CUDA aligns to 256 bytes (pinned memory to a page); a stricter request cannot be met. */
    if ((uintptr_t)ptr % alignment != 0) {
        if (where == ZT_MEM_DEVICE) cudaFreeAsync(ptr, compute_stream_of(ctx));
        else cudaFreeHost(ptr);
        zt_error_set(err, ZT_ERR_UNSUPPORTED,
                     "CUDA gave an address aligned to less than the %llu bytes asked for; ask for 256 bytes "
                     "or less (0 picks 256 on the device)", (unsigned long long)alignment);
        return NULL;
    }
    return ptr;
}

static void cuda_free(const zt_device_ctx *ctx, int where, void *ptr)
{
    if (where == ZT_MEM_DEVICE) cudaFreeAsync(ptr, compute_stream_of(ctx));
    else cudaFreeHost(ptr);
}

static zt_status cuda_memcpy(const zt_device_ctx *ctx, void *dst, const void *src, uint64_t bytes, void *stream,
                             zt_error *err)
{
    if (!bytes || dst == src) return ZT_OK;
    /* Overlapping ranges other than dst == src never occur in zt (collectives copy whole buffers). */
    cudaStream_t s = stream ? (cudaStream_t)stream : compute_stream_of(ctx);
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, s);
    return e == cudaSuccess ? ZT_OK : cuda_failed(err, e, "cudaMemcpyAsync");
}

static zt_status cuda_sync(const zt_device_ctx *ctx, void *stream, zt_error *err)
{
    (void)ctx;
    cudaError_t e = stream ? cudaStreamSynchronize((cudaStream_t)stream) : cudaDeviceSynchronize();
    if (e == cudaSuccess) return ZT_OK;
    cuda_failed(err, e, stream ? "cudaStreamSynchronize" : "cudaDeviceSynchronize");
    zt_error_append(err, ": a kernel enqueued earlier failed; rerun with CUDA_LAUNCH_BLOCKING=1 to find which");
    return err->status;
}

static zt_status cuda_event_create(const zt_device_ctx *ctx, void **event, zt_error *err)
{
    (void)ctx;
    cudaEvent_t e = NULL;
    cudaError_t rc = cudaEventCreate(&e); /* with timing: cudaEventDisableTiming would make it useless here */
    *event = rc == cudaSuccess ? (void *)e : NULL;
    return rc == cudaSuccess ? ZT_OK : cuda_failed(err, rc, "cudaEventCreate");
}

static zt_status cuda_event_record(const zt_device_ctx *ctx, void *event, void *stream, zt_error *err)
{
    cudaStream_t s = stream ? (cudaStream_t)stream : compute_stream_of(ctx);
    cudaError_t rc = cudaEventRecord((cudaEvent_t)event, s);
    return rc == cudaSuccess ? ZT_OK : cuda_failed(err, rc, "cudaEventRecord");
}

static int cuda_event_elapsed(const zt_device_ctx *ctx, void *start, void *end, double *seconds, zt_error *err)
{
    (void)ctx;
    /* Ask the later event first: querying never waits, and once it is complete so is the earlier one
     * (both are on one stream). */
    cudaError_t rc = cudaEventQuery((cudaEvent_t)end);
    if (rc == cudaErrorNotReady) return 0;
    float ms = 0;
    if (rc == cudaSuccess) rc = cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end);
    if (rc == cudaErrorNotReady) return 0;
    if (rc != cudaSuccess) {
        cuda_failed(err, rc, "cudaEventElapsedTime");
        return -1;
    }
    *seconds = (double)ms * 1e-3;
    return 1;
}

static void cuda_event_destroy(const zt_device_ctx *ctx, void *event)
{
    (void)ctx;
    if (event) cudaEventDestroy((cudaEvent_t)event);
}

static zt_status cuda_capture_begin(const zt_device_ctx *ctx, zt_error *err)
{
    /* Thread-local: another thread's cudaMalloc (a comm thread, a progress bar) must not end it. */
    cudaError_t e = cudaStreamBeginCapture(compute_stream_of(ctx), cudaStreamCaptureModeThreadLocal);
    return e == cudaSuccess ? ZT_OK : cuda_failed(err, e, "cudaStreamBeginCapture");
}

static zt_status cuda_capture_end(const zt_device_ctx *ctx, void **graph, zt_error *err)
{
    *graph = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamEndCapture(compute_stream_of(ctx), &g);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an invalidated capture is not a sticky error: the stream goes on */
        if (g) cudaGraphDestroy(g);
        return cuda_failed(err, e, "cudaStreamEndCapture (an operation of the step cannot be captured)");
    }
    e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g); /* the executable graph keeps what it needs */
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cuda_failed(err, e, "cudaGraphInstantiate");
    }
    *graph = exec;
    return ZT_OK;
}

static zt_status cuda_graph_launch(const zt_device_ctx *ctx, void *graph, zt_error *err)
{
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)graph, compute_stream_of(ctx));
    return e == cudaSuccess ? ZT_OK : cuda_failed(err, e, "cudaGraphLaunch");
}

static void cuda_graph_destroy(const zt_device_ctx *ctx, void *graph)
{
    (void)ctx;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

static const zt_device_backend k_cuda_backend = {
    .name = "cuda",
    .init = cuda_init,
    .shutdown = cuda_shutdown,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .memcpy = cuda_memcpy,
    .sync = cuda_sync,
    .event_create = cuda_event_create,
    .event_record = cuda_event_record,
    .event_elapsed = cuda_event_elapsed,
    .event_destroy = cuda_event_destroy,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
};

__attribute__((visibility("default"))) zt_status zt_device_cuda_open_v3(const zt_device_backend **backend,
                                                                        int *n_devices, zt_error *err);
__attribute__((visibility("default"))) void zt_device_cuda_versions_v1(zt_cuda_versions *out);

void zt_device_cuda_versions_v1(zt_cuda_versions *out)
{
    memset(out, 0, sizeof *out);
    if (cudaRuntimeGetVersion(&out->runtime) != cudaSuccess) out->runtime = 0;
    if (cudaDriverGetVersion(&out->driver) != cudaSuccess) out->driver = 0;
    out->built = CUDART_VERSION;
    Dl_info info;
    if (dladdr((void *)cudaRuntimeGetVersion, &info) && info.dli_fname)
        snprintf(out->runtime_path, sizeof out->runtime_path, "%s", info.dli_fname);
    cudaGetLastError();
}

zt_status zt_device_cuda_open_v3(const zt_device_backend **backend, int *n_devices, zt_error *err)
{
    *backend = NULL;
    *n_devices = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        /* No driver and a driver older than the runtime both come back as cudaErrorInsufficientDriver
         * (35); the versions tell them apart, in zt-run --env's words. */
        int driver = 0, runtime = 0;
        cudaDriverGetVersion(&driver);
        cudaRuntimeGetVersion(&runtime);
        char verdict[768];
        int driver_state = zt_cuda_driver_verdict(driver, runtime, verdict, sizeof verdict);
        if (driver_state == ZT_REQ_MISSING)
            return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                                "no CUDA device: CUDA driver %s (check that `nvidia-smi` lists a GPU), or train on "
                                "the CPU (device = cpu)", verdict);
        if (driver_state != ZT_REQ_OK)
            return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                                "the NVIDIA driver cannot run zt's CUDA runtime: CUDA driver: %s. zt-run --env "
                                "shows every version; or train on the CPU (device = cpu)", verdict);
        char why[256];
        if (e != cudaSuccess)
            snprintf(why, sizeof why, "cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
        else
            snprintf(why, sizeof why, "the CUDA driver reports no GPU");
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "no CUDA device: %s. Check that `nvidia-smi` lists a GPU and that "
                            "CUDA_VISIBLE_DEVICES does not hide it, or train on the CPU (device = cpu)", why);
    }
    *backend = &k_cuda_backend;
    *n_devices = n;
    return ZT_OK;
}
