/* The seam between the runtime and the hardware a run computes on.
 *
 * The runtime never calls a device API directly: it picks one backend for the run and goes through
 * this table for everything that is not pageable host memory (which it allocates itself).
 *
 *   framework/device/device_cpu.c   zt_device_cpu: CPU runs. There is no device memory; "pinned" host
 *                            memory is ordinary host memory (nothing is ever transferred).
 *   framework/device/device_cuda.c  CUDA runs: the MODULE libzt-device-cuda.so, which links the CUDA
 *                            runtime so that zt-run and zt_core never do (they run where CUDA is
 *                            not installed). The runtime dlopens it for a CUDA run and calls its
 *                            export ZT_DEVICE_CUDA_ENTRY (docs/gpu.md; zt-run --env also asks
 *                            ZT_DEVICE_CUDA_VERSIONS_ENTRY): cudaSetDevice in init,
 *                            the three streams, the cuBLASLt handle and its workspace in the
 *                            zt_device_ctx (shared by every plugin), stream-ordered cudaMallocAsync
 *                            on compute_stream for ZT_MEM_DEVICE (a free does not stall the host),
 *                            cudaHostAlloc for ZT_MEM_PINNED, cudaMemcpyAsync, cudaStreamSynchronize,
 *                            timing events (cudaEventRecord, cudaEventElapsedTime), CUDA graphs
 *                            of the compute stream (cudaStreamBeginCapture, cudaGraphLaunch).
 *
 * Backend functions report failures through err (what failed and how to fix it); the runtime adds
 * the pool, tag and memory use around an allocation failure.
 */
#ifndef ZT_FRAMEWORK_DEVICE_H
#define ZT_FRAMEWORK_DEVICE_H

#include "zt/zt_host.h"
#include "base/error.h"

typedef struct zt_device_backend {
    const char *name; /* "cpu", "cuda" */

    /* Select device `index` and fill every field of ctx except n_threads (the runtime's). Creates
     * whatever streams and handles the backend exposes there. */
    zt_status (*init)(int index, zt_device_ctx *ctx, zt_error *err);
    /* Release what init created. ctx is the one init filled. */
    void (*shutdown)(zt_device_ctx *ctx);

    /* `where` is ZT_MEM_PINNED or ZT_MEM_DEVICE (pageable host memory never reaches a backend).
     * alignment is a power of two >= sizeof(void *). bytes may be 0: return a unique pointer all
     * the same (the runtime tells allocations apart by address). Returns NULL with err set on failure:
     * ZT_ERR_OUT_OF_MEMORY when the memory is exhausted, ZT_ERR_UNSUPPORTED when this backend
     * has no such memory at all. */
    void *(*alloc)(const zt_device_ctx *ctx, int where, uint64_t bytes, uint64_t alignment,
                   zt_error *err);
    void (*free)(const zt_device_ctx *ctx, int where, void *ptr);

    /* Copy between any two buffers of this run (host, pinned or device; they may overlap), ordered
     * on `stream` (a cudaStream_t; ignored on CPU, where the copy is done on return). */
    zt_status (*memcpy)(const zt_device_ctx *ctx, void *dst, const void *src, uint64_t bytes,
                        void *stream, zt_error *err);
    /* Wait for all work queued on `stream` (NULL: all of the device's work). */
    zt_status (*sync)(const zt_device_ctx *ctx, void *stream, zt_error *err);

    /* Timing events on a stream, for the communication monitor (host/comm_monitor.h): recorded around
     * an operation, they time it on the device without a host wait. NULL on a backend whose work is
     * done on return (the CPU), where the caller reads the clock around the call instead. */
    zt_status (*event_create)(const zt_device_ctx *ctx, void **event, zt_error *err);
    zt_status (*event_record)(const zt_device_ctx *ctx, void *event, void *stream, zt_error *err);
    /* 1 with *seconds between two recorded events once both are complete; 0 while either is not
     * (never waits); -1 on a device error (err says which). */
    int (*event_elapsed)(const zt_device_ctx *ctx, void *start, void *end, double *seconds, zt_error *err);
    void (*event_destroy)(const zt_device_ctx *ctx, void *event);

    /* CUDA graphs of the compute stream (generate.cuda_graphs): capture_begin records what this
     * thread enqueues there from now on instead of running it; capture_end stops and instantiates
     * the recording into *graph, or fails (err says what could not be captured; the stream runs
     * normally again either way); graph_launch replays a graph on the compute stream. NULL on a
     * backend without graphs (the CPU). */
    zt_status (*capture_begin)(const zt_device_ctx *ctx, zt_error *err);
    zt_status (*capture_end)(const zt_device_ctx *ctx, void **graph, zt_error *err);
    zt_status (*graph_launch)(const zt_device_ctx *ctx, void *graph, zt_error *err);
    void (*graph_destroy)(const zt_device_ctx *ctx, void *graph);
} zt_device_backend;

extern const zt_device_backend zt_device_cpu;

/* The backend of device type `device_type` (zt_device_type): zt_device_cpu, or CUDA's, loading zt's
 * CUDA backend (libzt-device-cuda.so) on first use. The module is never closed: the CUDA runtime it
 * links cannot be unloaded and started again cleanly within one process. */
zt_status zt_device_backend_open(int device_type, const zt_device_backend **out, zt_error *err);

/* How many CUDA devices this process can use, loading the CUDA backend on first use. ZT_OK with
 * *n_devices >= 1, else the reason there is none: no CUDA in this build, the module or the CUDA
 * runtime missing, no driver or no GPU (device = auto falls back to the CPU then). */
zt_status zt_device_cuda_count(int *n_devices, zt_error *err);

/* The export of libzt-device-cuda.so. The version is in the name, so a module whose table differs is
 * refused by dlsym instead of being called with the wrong layout. It fills *backend and the number
 * of CUDA devices this process can use; when there is none (no driver, no GPU, CUDA_VISIBLE_DEVICES
 * empty) it returns ZT_ERR_UNSUPPORTED and err says why. */
#define ZT_DEVICE_CUDA_ENTRY "zt_device_cuda_open_v3"
typedef zt_status (*zt_device_cuda_open_fn)(const zt_device_backend **backend, int *n_devices,
                                            zt_error *err);

/* The CUDA stack as the module sees it, for zt-run --env (device/requirements.h judges it). Asking
 * creates no CUDA context. */
typedef struct zt_cuda_versions {
    int runtime;            /* cudaRuntimeGetVersion of the runtime the module loaded (13000 = 13.0) */
    int built;              /* CUDART_VERSION of the headers the module was compiled against */
    int driver;             /* cudaDriverGetVersion: the newest CUDA the driver supports; 0: no driver */
    char runtime_path[4096]; /* the libcudart file loaded */
} zt_cuda_versions;

/* The module's second export; ZT_DEVICE_CUDA_ENTRY's naming rule. */
#define ZT_DEVICE_CUDA_VERSIONS_ENTRY "zt_device_cuda_versions_v1"
typedef void (*zt_device_cuda_versions_fn)(zt_cuda_versions *out);

/* Loads the CUDA backend as zt_device_cuda_count does (without looking for GPUs) and asks it. Fails
 * with the reason when this build has no CUDA or the module or its libraries cannot be loaded. */
zt_status zt_device_cuda_versions(zt_cuda_versions *out, zt_error *err);

#endif
