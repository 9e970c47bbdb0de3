/* What the CUDA paths of zt's own plugins (llama, flash, adamw, zero0) share: their kernel context
 * and how a kernel failure reaches the user. Included only where the plugin is built with CUDA
 * (ZT_PLUGIN_CUDA), next to kernels/cuda/kernels_cuda.h.
 *
 * Each plugin links its own copy of the static kernel library, so each has its own zt_cuda_ctx
 * (cuBLASLt handle and workspace, scratch). Everything runs on the host's compute stream, in order.
 * The context's memory (32 MiB of cuBLASLt workspace plus the scratch) is cudaMalloc'ed by the
 * kernel library, outside the host's pools: the plugins log its size when they create it.
 */
#ifndef ZT_PLUGINS_CUDA_PLUGIN_H
#define ZT_PLUGINS_CUDA_PLUGIN_H

#include "cuda/kernels_cuda.h"
#include "zt/zt_plugin.h"

/* The compute stream every plugin enqueues on. */
static inline cudaStream_t zt_plugin_stream(const zt_host *host)
{
    return (cudaStream_t)host->device->compute_stream;
}

/* A kernel call failed: the kernel library's message, prefixed by what the plugin was doing. */
static inline zt_status zt_plugin_cuda_failed(const zt_host *host, zt_status st, const char *what)
{
    host->error(host->ctx, st, "%s: %s", what, zt_cuda_last_error());
    return st;
}

/* The 16-bit compute type of a GPU run: ZT_F16 when fp16.enabled (docs/cuda.md, "fp16"), else ZT_BF16.
 * Every plugin's kernel context computes in it (zt_plugin_cuda_ctx sets it). */
static inline int32_t zt_plugin_compute_dtype16(const zt_host *host)
{
    int32_t fp16 = 0;
    if (host->cfg_bool(host->ctx, "fp16.enabled", &fp16) != ZT_OK) fp16 = 0;
    return fp16 ? ZT_F16 : ZT_BF16;
}

/* Makes *ctx a context with at least scratch_bytes of scratch: created on first use, and created
 * again (larger) when a call needs more than it has, e.g. the first batch of another shape. */
static inline zt_status zt_plugin_cuda_ctx(const zt_host *host, const char *plugin, uint64_t scratch_bytes,
                                           zt_cuda_ctx **ctx)
{
    if (scratch_bytes < 4096) scratch_bytes = 4096; /* 0 would pick the library's 64 MiB default */
    if (*ctx && zt_cuda_ctx_scratch_bytes(*ctx) >= scratch_bytes) return ZT_OK;
    if (*ctx) {
        cudaStreamSynchronize(zt_plugin_stream(host)); /* kernels may still read the old scratch */
        zt_cuda_ctx_destroy(*ctx);
        *ctx = NULL;
    }
    zt_status st = zt_cuda_ctx_create(host->device->device_index, scratch_bytes, ctx);
    if (st != ZT_OK) {
        host->error(host->ctx, st, "%s: cannot create its CUDA kernel context (%.1f MiB of scratch): %s", plugin,
                    (double)scratch_bytes / (1 << 20), zt_cuda_last_error());
        return st;
    }
    st = zt_cuda_ctx_set_dtype(*ctx, zt_plugin_compute_dtype16(host));
    if (st != ZT_OK) return zt_plugin_cuda_failed(host, st, plugin);
    host->log(host->ctx, ZT_LOG_DEBUG, "%s: CUDA kernel context with %.1f MiB of scratch and 32 MiB of cuBLASLt "
              "workspace (outside the memory pools)", plugin, (double)scratch_bytes / (1 << 20));
    return ZT_OK;
}

#endif
