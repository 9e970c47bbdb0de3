/* What the CUDA paths of zt's own plugins (llama, flash, adamw, zero0-3) share: their kernel context
 * and how a kernel failure reaches the user. Included only where the plugin is built with CUDA
 * (ZT_PLUGIN_CUDA), next to kernels/cuda/kernels_cuda.h.
 *
 * Each plugin links its own copy of the static kernel library, so each has its own zt_cuda_ctx with
 * its own scratch; the cuBLASLt handle and its 32 MiB workspace are the host's one per device
 * (zt_device_ctx.cublaslt / .workspace), shared by every plugin's context. Sharing one workspace is
 * safe because every GEMM of every plugin is enqueued on the host's compute stream, in order: only
 * the llama plugin multiplies matrices (zt_cuda_gemm, zt_cuda_linear_*, zt_cuda_lm_head_loss, all on
 * zt_plugin_stream); the zero plugins' contexts run element-wise kernels on the comm stream, which
 * never touch the workspace. A plugin that ever enqueues a GEMM on another stream must give that
 * path a context of its own (zt_cuda_ctx_create). A host that sets no handle (an older one) gets
 * the old behaviour: a context of its own, handle and workspace included.
 * The context's scratch is cudaMalloc'ed by the kernel library, outside the host's pools, as the
 * host's workspace is: the plugins log its size when they create it.
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

/* Makes *ctx a context with at least scratch_bytes of scratch: created on first use; its scratch
 * grows when a call needs more than it has, e.g. the first batch of another shape. The context
 * itself (and the scratch it had) stays: a captured CUDA graph may hold its addresses. */
static inline zt_status zt_plugin_cuda_ctx(const zt_host *host, const char *plugin, uint64_t scratch_bytes,
                                           zt_cuda_ctx **ctx)
{
    if (scratch_bytes < 4096) scratch_bytes = 4096; /* 0 would pick the library's 64 MiB default */
    if (*ctx && zt_cuda_ctx_scratch_bytes(*ctx) >= scratch_bytes) return ZT_OK;
    if (*ctx) {
        uint64_t had = zt_cuda_ctx_scratch_bytes(*ctx);
        zt_status grown = zt_cuda_ctx_grow_scratch(*ctx, scratch_bytes);
        if (grown != ZT_OK) {
            host->error(host->ctx, grown, "%s: cannot grow its CUDA scratch to %.1f MiB: %s", plugin,
                        (double)scratch_bytes / (1 << 20), zt_cuda_last_error());
            return grown;
        }
        host->log(host->ctx, ZT_LOG_DEBUG, "%s: CUDA scratch grown from %.1f to %.1f MiB (outside the memory pools; "
                  "the smaller one is kept until the plugin closes)", plugin, (double)had / (1 << 20),
                  (double)scratch_bytes / (1 << 20));
        return ZT_OK;
    }
    const zt_device_ctx *dev = host->device;
    int shared = dev->cublaslt && dev->workspace && dev->workspace_bytes;
    zt_status st = shared ? zt_cuda_ctx_create_shared(dev->device_index, scratch_bytes, dev->cublaslt, dev->workspace,
                                                      dev->workspace_bytes, ctx)
                          : zt_cuda_ctx_create(dev->device_index, scratch_bytes, ctx);
    if (st != ZT_OK) {
        host->error(host->ctx, st, "%s: cannot create its CUDA kernel context (%.1f MiB of scratch): %s", plugin,
                    (double)scratch_bytes / (1 << 20), zt_cuda_last_error());
        return st;
    }
    st = zt_cuda_ctx_set_dtype(*ctx, zt_plugin_compute_dtype16(host));
    if (st != ZT_OK) return zt_plugin_cuda_failed(host, st, plugin);
    host->log(host->ctx, ZT_LOG_DEBUG, "%s: CUDA kernel context with %.1f MiB of scratch (outside the memory pools), "
              "%s", plugin, (double)scratch_bytes / (1 << 20),
              shared ? "on the host's cuBLASLt handle and workspace"
                     : "with a cuBLASLt handle and 32 MiB of workspace of its own (the host provides none)");
    return ZT_OK;
}

#endif
