/* The GPU side of the zero plugins (zero_cuda.c): what zero.c does with memset, memcpy and the CPU
 * kernels, on device memory. GPU runs are stage 0 on one GPU for now: the fp32 master, gradients and
 * optimizer state live on the device, and the model reads a bf16 copy of the master that these
 * functions refresh after every optimizer step and every write of the master (docs/gpu.md).
 *
 * A plugin built without CUDA (no ZT_PLUGIN_CUDA) refuses GPU runs in setup, so it never calls
 * these; the inline versions below only keep zero.c free of #ifdefs.
 */
#ifndef ZT_PLUGINS_ZERO_CUDA_H
#define ZT_PLUGINS_ZERO_CUDA_H

#include <stdint.h>
#include "zt/zt_plugin.h"

typedef struct zero_cuda zero_cuda;

#ifdef ZT_PLUGIN_CUDA

/* The kernel context, sized for the global norm of n_tensors gradient ranges of these sizes. */
zt_status zero_cuda_create(const zt_host *h, int64_t n_tensors, const int64_t *sizes, zero_cuda **out);
void zero_cuda_destroy(const zt_host *h, zero_cuda *g);
/* Enqueued on the compute stream. */
zt_status zero_cuda_zero(const zt_host *h, void *dst, uint64_t bytes);
/* Between host and device memory; returns once the copy is done. */
zt_status zero_cuda_copy(const zt_host *h, void *dst, const void *src, uint64_t bytes);
/* The L2 norm of n device tensors, reduced in a fixed order; waits for the result. */
zt_status zero_cuda_global_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                                const int64_t *sizes, double *norm);
/* copy[0, n) = bf16(master[0, n)), round to nearest even; enqueued. */
zt_status zero_cuda_refresh(const zt_host *h, zero_cuda *g, const float *master, uint16_t *copy, int64_t n);

#else

static inline zt_status zero_cuda_unavailable(const zt_host *h)
{
    h->error(h->ctx, ZT_ERR_INTERNAL, "a zero plugin built without CUDA was asked to touch device memory (a bug)");
    return ZT_ERR_INTERNAL;
}
static inline zt_status zero_cuda_create(const zt_host *h, int64_t n_tensors, const int64_t *sizes, zero_cuda **out)
{
    (void)n_tensors, (void)sizes, (void)out;
    return zero_cuda_unavailable(h);
}
static inline void zero_cuda_destroy(const zt_host *h, zero_cuda *g) { (void)h, (void)g; }
static inline zt_status zero_cuda_zero(const zt_host *h, void *dst, uint64_t bytes)
{
    (void)dst, (void)bytes;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_copy(const zt_host *h, void *dst, const void *src, uint64_t bytes)
{
    (void)dst, (void)src, (void)bytes;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_global_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                                              const int64_t *sizes, double *norm)
{
    (void)g, (void)n, (void)tensors, (void)sizes, (void)norm;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_refresh(const zt_host *h, zero_cuda *g, const float *master, uint16_t *copy,
                                          int64_t n)
{
    (void)g, (void)master, (void)copy, (void)n;
    return zero_cuda_unavailable(h);
}

#endif

#endif
