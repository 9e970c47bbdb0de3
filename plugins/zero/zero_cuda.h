/* The GPU side of the zero plugins (zero_cuda.c): what the plugins' other sources do with memset,
 * memcpy and the CPU kernels, on device memory, and the ordering between the host's compute and comm
 * streams.
 *
 * Streams: the model, the optimizer, the norm and zero fills run on the compute stream; every
 * collective (the host's, on device memory) and the copies and adds that feed it run on the comm
 * stream. Ordering is by events, never a host wait: before a collective the comm stream waits for
 * the compute stream's work so far (zero_cuda_comm_wait_compute); after it, an event slot is
 * recorded on the comm stream (zero_cuda_record_comm), and the compute stream waits on that slot
 * only where it needs the data (zero_cuda_compute_wait): before the optimizer, before the model reads
 * gathered parameters, before a buffer the collective used is freed or reused.
 *
 * A plugin built without CUDA (no ZT_PLUGIN_CUDA) refuses GPU runs in setup, so it never calls
 * these; the inline versions below only keep the plugins' sources free of #ifdefs.
 */
#ifndef ZT_PLUGINS_ZERO_CUDA_H
#define ZT_PLUGINS_ZERO_CUDA_H

#include <stdint.h>
#include "zt/zt_plugin.h"

typedef struct zero_cuda zero_cuda;

#ifdef ZT_PLUGIN_CUDA

/* The kernel context, sized for the global norm of n_tensors gradient ranges of these sizes; n_slots
 * events; n_norms device floats for per-unit norms; dp doubles of device scratch for the norm exchange. */
zt_status zero_cuda_create(const zt_host *h, const char *plugin, int64_t n_tensors, const int64_t *sizes,
                           int32_t n_slots, int32_t n_norms, int32_t dp, zero_cuda **out);
void zero_cuda_destroy(const zt_host *h, zero_cuda *g);
/* Enqueued on the compute stream. */
zt_status zero_cuda_zero(const zt_host *h, void *dst, uint64_t bytes);
/* Between host and device memory; returns once the copy is done (waits for the compute stream). */
zt_status zero_cuda_copy(const zt_host *h, void *dst, const void *src, uint64_t bytes);
/* Device to device, enqueued on the comm stream (staging buffers of collectives). */
zt_status zero_cuda_copy_comm(const zt_host *h, void *dst, const void *src, uint64_t bytes);
/* y += x (fp32, n elements), enqueued on the comm stream. */
zt_status zero_cuda_add_comm(const zt_host *h, zero_cuda *g, float *y, const float *x, int64_t n);
/* The comm stream waits for everything enqueued on the compute stream so far. */
zt_status zero_cuda_comm_wait_compute(const zt_host *h, zero_cuda *g);
/* Event `slot` marks the comm stream's work so far; the compute stream waits on a slot. */
zt_status zero_cuda_record_comm(const zt_host *h, zero_cuda *g, int32_t slot);
zt_status zero_cuda_compute_wait(const zt_host *h, zero_cuda *g, int32_t slot);
/* The L2 norm of n device tensors, reduced in a fixed order; waits for the result. */
zt_status zero_cuda_global_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                                const int64_t *sizes, double *norm);
/* The same into device float `index` of the per-unit norms, enqueued (no wait); read them all with
 * zero_cuda_read_norms (one wait). */
zt_status zero_cuda_unit_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                              const int64_t *sizes, int32_t index);
zt_status zero_cuda_read_norms(const zt_host *h, zero_cuda *g, int32_t n, float *out);
/* Every rank's `local` into parts[0, group size), through device memory (GPU collectives move device
 * buffers); waits for the result. */
zt_status zero_cuda_all_gather_double(const zt_host *h, zero_cuda *g, const zt_group *group, double local,
                                      double *parts);
/* copy[0, n) = bf16(master[0, n)), round to nearest even; enqueued on the compute stream. */
zt_status zero_cuda_refresh(const zt_host *h, zero_cuda *g, const float *master, uint16_t *copy, int64_t n);
/* The same on the comm stream (stage 3 casts the master shard there right before gathering it). */
zt_status zero_cuda_refresh_comm(const zt_host *h, zero_cuda *g, const float *master, uint16_t *copy, int64_t n);

/* Offload (GPU runs with offload_optimizer.device = cpu; docs/zero.md "Offload"). Events: per unit
 * one for its latest gradient download (recorded on the comm stream) and one for its latest
 * parameter upload (copy stream), and one per upload staging buffer (n_staging). The host waits on
 * download and staging events (blocking sync, so a waiting thread leaves its core to the CPU
 * optimizer); the comm stream waits on upload events before a unit's gather. */
zt_status zero_cuda_offload_init(const zt_host *h, zero_cuda *g, int32_t n_units, int32_t n_staging);
/* The calling thread computes on the run's device (the offload thread: CUDA's current device is per
 * thread). */
zt_status zero_cuda_bind_thread(const zt_host *h, zero_cuda *g);
/* dst (host) = src (device), enqueued on the comm stream (behind the unit's reduction), then the
 * unit's download event. */
zt_status zero_cuda_download(const zt_host *h, zero_cuda *g, int32_t unit, void *dst, const void *src,
                             uint64_t bytes);
/* Host wait: the unit's latest download has landed. */
zt_status zero_cuda_wait_download(const zt_host *h, zero_cuda *g, int32_t unit);
/* dst (device) = src (host), enqueued on the copy stream. */
zt_status zero_cuda_upload(const zt_host *h, zero_cuda *g, void *dst, const void *src, uint64_t bytes);
/* After a unit's uploads out of staging buffer `buf`: records the unit's upload event and the buffer's. */
zt_status zero_cuda_upload_done(const zt_host *h, zero_cuda *g, int32_t unit, int32_t buf);
/* Host wait: the uploads out of staging buffer `buf` are done, so it may be written again. */
zt_status zero_cuda_wait_staging(const zt_host *h, zero_cuda *g, int32_t buf);
/* The comm stream waits for the unit's latest upload (before gathering the unit). */
zt_status zero_cuda_comm_wait_upload(const zt_host *h, zero_cuda *g, int32_t unit);
/* dst (device) = src (host memory), enqueued on the comm stream. */
zt_status zero_cuda_copy_in_comm(const zt_host *h, zero_cuda *g, void *dst, const void *src, uint64_t bytes);
/* Host wait for everything enqueued so far on the comm stream, or on the copy stream. */
zt_status zero_cuda_sync_comm(const zt_host *h, zero_cuda *g);
zt_status zero_cuda_sync_copy(const zt_host *h, zero_cuda *g);

#else

static inline zt_status zero_cuda_unavailable(const zt_host *h)
{
    h->error(h->ctx, ZT_ERR_INTERNAL, "a zero plugin built without CUDA was asked to touch device memory (a bug)");
    return ZT_ERR_INTERNAL;
}
static inline zt_status zero_cuda_create(const zt_host *h, const char *plugin, int64_t n_tensors,
                                         const int64_t *sizes, int32_t n_slots, int32_t n_norms, int32_t dp,
                                         zero_cuda **out)
{
    (void)plugin, (void)n_tensors, (void)sizes, (void)n_slots, (void)n_norms, (void)dp, (void)out;
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
static inline zt_status zero_cuda_copy_comm(const zt_host *h, void *dst, const void *src, uint64_t bytes)
{
    (void)dst, (void)src, (void)bytes;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_add_comm(const zt_host *h, zero_cuda *g, float *y, const float *x, int64_t n)
{
    (void)g, (void)y, (void)x, (void)n;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_comm_wait_compute(const zt_host *h, zero_cuda *g)
{
    (void)g;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_record_comm(const zt_host *h, zero_cuda *g, int32_t slot)
{
    (void)g, (void)slot;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_compute_wait(const zt_host *h, zero_cuda *g, int32_t slot)
{
    (void)g, (void)slot;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_global_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                                              const int64_t *sizes, double *norm)
{
    (void)g, (void)n, (void)tensors, (void)sizes, (void)norm;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_unit_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                                            const int64_t *sizes, int32_t index)
{
    (void)g, (void)n, (void)tensors, (void)sizes, (void)index;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_read_norms(const zt_host *h, zero_cuda *g, int32_t n, float *out)
{
    (void)g, (void)n, (void)out;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_all_gather_double(const zt_host *h, zero_cuda *g, const zt_group *group,
                                                    double local, double *parts)
{
    (void)g, (void)group, (void)local, (void)parts;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_refresh(const zt_host *h, zero_cuda *g, const float *master, uint16_t *copy,
                                          int64_t n)
{
    (void)g, (void)master, (void)copy, (void)n;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_refresh_comm(const zt_host *h, zero_cuda *g, const float *master,
                                               uint16_t *copy, int64_t n)
{
    (void)g, (void)master, (void)copy, (void)n;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_offload_init(const zt_host *h, zero_cuda *g, int32_t n_units, int32_t n_staging)
{
    (void)g, (void)n_units, (void)n_staging;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_bind_thread(const zt_host *h, zero_cuda *g)
{
    (void)g;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_download(const zt_host *h, zero_cuda *g, int32_t unit, void *dst, const void *src,
                                           uint64_t bytes)
{
    (void)g, (void)unit, (void)dst, (void)src, (void)bytes;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_wait_download(const zt_host *h, zero_cuda *g, int32_t unit)
{
    (void)g, (void)unit;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_upload(const zt_host *h, zero_cuda *g, void *dst, const void *src, uint64_t bytes)
{
    (void)g, (void)dst, (void)src, (void)bytes;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_upload_done(const zt_host *h, zero_cuda *g, int32_t unit, int32_t buf)
{
    (void)g, (void)unit, (void)buf;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_wait_staging(const zt_host *h, zero_cuda *g, int32_t buf)
{
    (void)g, (void)buf;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_comm_wait_upload(const zt_host *h, zero_cuda *g, int32_t unit)
{
    (void)g, (void)unit;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_copy_in_comm(const zt_host *h, zero_cuda *g, void *dst, const void *src,
                                               uint64_t bytes)
{
    (void)g, (void)dst, (void)src, (void)bytes;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_sync_comm(const zt_host *h, zero_cuda *g)
{
    (void)g;
    return zero_cuda_unavailable(h);
}
static inline zt_status zero_cuda_sync_copy(const zt_host *h, zero_cuda *g)
{
    (void)g;
    return zero_cuda_unavailable(h);
}

#endif

#endif
