/* The GPU side of the zero plugins: zero_cuda.h. */
#include "zero_cuda.h"

#include <stdio.h>
#include <stdlib.h>

#include "../cuda_plugin.h"

struct zero_cuda {
    char plugin[16];
    zt_cuda_ctx *ctx;
    float *norm;        /* one device float: the global norm */
    float *unit_norms;  /* [n_norms] device floats */
    double *parts;      /* [dp + 1] device doubles: the norm exchange */
    int32_t n_norms, dp;
    cudaEvent_t compute_done; /* recorded on the compute stream, waited on by the comm stream */
    cudaEvent_t *slots;       /* [n_slots], recorded on the comm stream */
    int32_t n_slots;
    /* offload (zero_cuda_offload_init): [n_units] each, and [n_staging] */
    cudaEvent_t *downloads, *uploads, *staging;
    int32_t n_units, n_staging;
};

static zt_status cuda_call_failed(const zt_host *h, const char *plugin, cudaError_t e, const char *what)
{
    h->error(h->ctx, ZT_ERR_DEVICE, "%s: %s failed: %s (%s)", plugin, what, cudaGetErrorString(e),
             cudaGetErrorName(e));
    return ZT_ERR_DEVICE;
}

static cudaStream_t comm_stream(const zt_host *h) { return (cudaStream_t)h->device->comm_stream; }
static cudaStream_t copy_stream(const zt_host *h) { return (cudaStream_t)h->device->copy_stream; }

static void destroy_events(cudaEvent_t *events, int32_t n)
{
    for (int32_t i = 0; events && i < n; i++)
        if (events[i]) cudaEventDestroy(events[i]);
    free(events);
}

zt_status zero_cuda_create(const zt_host *h, const char *plugin, int64_t n_tensors, const int64_t *sizes,
                           int32_t n_slots, int32_t n_norms, int32_t dp, zero_cuda **out)
{
    *out = NULL;
    zero_cuda *g = calloc(1, sizeof *g);
    if (!g) {
        h->error(h->ctx, ZT_ERR_OUT_OF_MEMORY, "%s: out of host memory for its CUDA state", plugin);
        return ZT_ERR_OUT_OF_MEMORY;
    }
    snprintf(g->plugin, sizeof g->plugin, "%s", plugin);
    g->n_norms = n_norms > 0 ? n_norms : 1;
    g->dp = dp > 0 ? dp : 1;
    zt_status st = ZT_OK;
    if (!h->device->comm_stream) {
        h->error(h->ctx, ZT_ERR_DEVICE, "%s: the host's device context has no comm stream (a host bug)", plugin);
        st = ZT_ERR_DEVICE;
    }
    if (st == ZT_OK) st = zt_plugin_cuda_ctx(h, plugin, zt_cuda_global_norm_scratch_bytes(n_tensors, sizes), &g->ctx);
    if (st == ZT_OK &&
        (!(g->norm = h->alloc(h->ctx, ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, sizeof(float), 0, "zero gradient norm")) ||
         !(g->unit_norms = h->alloc(h->ctx, ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, (uint64_t)g->n_norms * sizeof(float), 0,
                                    "zero per-unit gradient norms")) ||
         !(g->parts = h->alloc(h->ctx, ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, (uint64_t)(g->dp + 1) * sizeof(double), 0,
                               "zero norm exchange"))))
        st = ZT_ERR_OUT_OF_MEMORY;
    if (st == ZT_OK) { /* the buffers come from the compute stream's pool; the comm stream uses parts */
        cudaError_t e = cudaStreamSynchronize(zt_plugin_stream(h));
        if (e != cudaSuccess) st = cuda_call_failed(h, plugin, e, "cudaStreamSynchronize");
    }
    if (st == ZT_OK) {
        cudaError_t e = cudaEventCreateWithFlags(&g->compute_done, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            g->compute_done = NULL;
            st = cuda_call_failed(h, plugin, e, "cudaEventCreate");
        }
    }
    if (st == ZT_OK && n_slots > 0) {
        g->slots = calloc((size_t)n_slots, sizeof *g->slots);
        if (!g->slots) {
            h->error(h->ctx, ZT_ERR_OUT_OF_MEMORY, "%s: out of host memory for %d CUDA events", plugin, (int)n_slots);
            st = ZT_ERR_OUT_OF_MEMORY;
        }
        for (int32_t i = 0; st == ZT_OK && i < n_slots; i++) {
            cudaError_t e = cudaEventCreateWithFlags(&g->slots[i], cudaEventDisableTiming);
            if (e != cudaSuccess) {
                g->slots[i] = NULL;
                st = cuda_call_failed(h, plugin, e, "cudaEventCreate");
            } else {
                g->n_slots = i + 1;
            }
        }
    }
    if (st != ZT_OK) {
        zero_cuda_destroy(h, g);
        return st;
    }
    *out = g;
    return ZT_OK;
}

void zero_cuda_destroy(const zt_host *h, zero_cuda *g)
{
    if (!g) return;
    /* Work still queued may use the buffers and events: let both streams drain first. */
    cudaStreamSynchronize(comm_stream(h));
    cudaStreamSynchronize(zt_plugin_stream(h));
    if (g->n_units || g->n_staging) cudaStreamSynchronize(copy_stream(h));
    for (int32_t i = 0; i < g->n_slots; i++) cudaEventDestroy(g->slots[i]);
    free(g->slots);
    destroy_events(g->downloads, g->n_units);
    destroy_events(g->uploads, g->n_units);
    destroy_events(g->staging, g->n_staging);
    if (g->compute_done) cudaEventDestroy(g->compute_done);
    h->free(h->ctx, g->norm);
    h->free(h->ctx, g->unit_norms);
    h->free(h->ctx, g->parts);
    zt_cuda_ctx_destroy(g->ctx);
    free(g);
}

zt_status zero_cuda_zero(const zt_host *h, void *dst, uint64_t bytes)
{
    cudaError_t e = cudaMemsetAsync(dst, 0, (size_t)bytes, zt_plugin_stream(h));
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, "zero", e, "cudaMemsetAsync");
}

zt_status zero_cuda_copy(const zt_host *h, void *dst, const void *src, uint64_t bytes)
{
    cudaStream_t stream = zt_plugin_stream(h);
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, "zero", e, "copying a shard between host and GPU");
}

zt_status zero_cuda_copy_comm(const zt_host *h, void *dst, const void *src, uint64_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, comm_stream(h));
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, "zero", e, "copying a communication bucket");
}

zt_status zero_cuda_add_comm(const zt_host *h, zero_cuda *g, float *y, const float *x, int64_t n)
{
    zt_status st = zt_cuda_add_f32(g->ctx, comm_stream(h), n, x, y);
    return st == ZT_OK ? ZT_OK : zt_plugin_cuda_failed(h, st, "zero: adding the gradient accumulator");
}

zt_status zero_cuda_comm_wait_compute(const zt_host *h, zero_cuda *g)
{
    cudaError_t e = cudaEventRecord(g->compute_done, zt_plugin_stream(h));
    if (e == cudaSuccess) e = cudaStreamWaitEvent(comm_stream(h), g->compute_done, 0);
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "ordering the comm stream after compute");
}

zt_status zero_cuda_record_comm(const zt_host *h, zero_cuda *g, int32_t slot)
{
    if (slot < 0 || slot >= g->n_slots) {
        h->error(h->ctx, ZT_ERR_INTERNAL, "%s: event slot %d is not in [0, %d) (a bug)", g->plugin, (int)slot,
                 (int)g->n_slots);
        return ZT_ERR_INTERNAL;
    }
    cudaError_t e = cudaEventRecord(g->slots[slot], comm_stream(h));
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "cudaEventRecord on the comm stream");
}

zt_status zero_cuda_compute_wait(const zt_host *h, zero_cuda *g, int32_t slot)
{
    if (slot < 0 || slot >= g->n_slots) {
        h->error(h->ctx, ZT_ERR_INTERNAL, "%s: event slot %d is not in [0, %d) (a bug)", g->plugin, (int)slot,
                 (int)g->n_slots);
        return ZT_ERR_INTERNAL;
    }
    cudaError_t e = cudaStreamWaitEvent(zt_plugin_stream(h), g->slots[slot], 0);
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "ordering the compute stream after comm");
}

zt_status zero_cuda_global_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                                const int64_t *sizes, double *norm)
{
    cudaStream_t stream = zt_plugin_stream(h);
    zt_status st = zt_cuda_global_norm(g->ctx, stream, n, tensors, sizes, 0.0f, g->norm, NULL);
    if (st != ZT_OK) return zt_plugin_cuda_failed(h, st, "zero: the gradient norm");
    float value = 0;
    cudaError_t e = cudaMemcpyAsync(&value, g->norm, sizeof value, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return cuda_call_failed(h, g->plugin, e, "reading the gradient norm");
    *norm = value;
    return ZT_OK;
}

zt_status zero_cuda_unit_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                              const int64_t *sizes, int32_t index)
{
    if (index < 0 || index >= g->n_norms) {
        h->error(h->ctx, ZT_ERR_INTERNAL, "%s: unit norm %d is not in [0, %d) (a bug)", g->plugin, (int)index,
                 (int)g->n_norms);
        return ZT_ERR_INTERNAL;
    }
    if (n == 0) return zero_cuda_zero(h, g->unit_norms + index, sizeof(float));
    zt_status st = zt_cuda_global_norm(g->ctx, zt_plugin_stream(h), n, tensors, sizes, 0.0f, g->unit_norms + index,
                                       NULL);
    return st == ZT_OK ? ZT_OK : zt_plugin_cuda_failed(h, st, "zero: a unit's gradient norm");
}

zt_status zero_cuda_read_norms(const zt_host *h, zero_cuda *g, int32_t n, float *out)
{
    if (n > g->n_norms) n = g->n_norms;
    cudaStream_t stream = zt_plugin_stream(h);
    cudaError_t e = cudaMemcpyAsync(out, g->unit_norms, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "reading the per-unit gradient norms");
}

zt_status zero_cuda_all_gather_double(const zt_host *h, zero_cuda *g, const zt_group *group, double local,
                                      double *parts)
{
    if (group->size > g->dp) {
        h->error(h->ctx, ZT_ERR_INTERNAL, "%s: norm exchange over %d ranks, sized for %d (a bug)", g->plugin,
                 (int)group->size, (int)g->dp);
        return ZT_ERR_INTERNAL;
    }
    cudaStream_t comm = comm_stream(h);
    /* parts[dp] holds this rank's value; the gather fills parts[0, size). Bytes, so every backend
     * moves the doubles exactly. */
    cudaError_t e = cudaMemcpyAsync(g->parts + g->dp, &local, sizeof local, cudaMemcpyHostToDevice, comm);
    if (e == cudaSuccess) e = cudaStreamSynchronize(comm); /* `local` is a stack value */
    if (e != cudaSuccess) return cuda_call_failed(h, g->plugin, e, "copying the local norm to the GPU");
    zt_status st = h->all_gather(h->ctx, group, g->parts + g->dp, g->parts, sizeof(double), ZT_U8, comm);
    if (st != ZT_OK) return st;
    e = cudaMemcpyAsync(parts, g->parts, (size_t)group->size * sizeof(double), cudaMemcpyDeviceToHost, comm);
    if (e == cudaSuccess) e = cudaStreamSynchronize(comm);
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "reading the exchanged norms");
}

zt_status zero_cuda_refresh(const zt_host *h, zero_cuda *g, const float *master, uint16_t *copy, int64_t n)
{
    zt_status st = zt_cuda_cast_f32_to_bf16(g->ctx, zt_plugin_stream(h), n, master, copy);
    return st == ZT_OK ? ZT_OK : zt_plugin_cuda_failed(h, st, "zero: refreshing the bf16 copy of the weights");
}

zt_status zero_cuda_refresh_comm(const zt_host *h, zero_cuda *g, const float *master, uint16_t *copy, int64_t n)
{
    zt_status st = zt_cuda_cast_f32_to_bf16(g->ctx, comm_stream(h), n, master, copy);
    return st == ZT_OK ? ZT_OK : zt_plugin_cuda_failed(h, st, "zero: casting the master shard for its gather");
}

/* ---- offload ---------------------------------------------------------------------------------- */

static zt_status create_events(const zt_host *h, zero_cuda *g, int32_t n, unsigned flags, cudaEvent_t **out)
{
    *out = calloc((size_t)(n > 0 ? n : 1), sizeof **out);
    if (!*out) {
        h->error(h->ctx, ZT_ERR_OUT_OF_MEMORY, "%s: out of host memory for %d CUDA events", g->plugin, (int)n);
        return ZT_ERR_OUT_OF_MEMORY;
    }
    for (int32_t i = 0; i < n; i++) {
        cudaError_t e = cudaEventCreateWithFlags(&(*out)[i], flags);
        if (e != cudaSuccess) {
            (*out)[i] = NULL;
            return cuda_call_failed(h, g->plugin, e, "cudaEventCreate (offload)");
        }
    }
    return ZT_OK;
}

zt_status zero_cuda_offload_init(const zt_host *h, zero_cuda *g, int32_t n_units, int32_t n_staging)
{
    if (g->downloads || n_units < 0 || n_staging < 0) {
        h->error(h->ctx, ZT_ERR_INTERNAL, "%s: offload events set up twice or with negative counts (a bug)", g->plugin);
        return ZT_ERR_INTERNAL;
    }
    if (!h->device->copy_stream) {
        h->error(h->ctx, ZT_ERR_DEVICE, "%s: the host's device context has no copy stream (a host bug)", g->plugin);
        return ZT_ERR_DEVICE;
    }
    /* Counts first, so zero_cuda_destroy frees what was created if a later creation fails. */
    g->n_units = n_units;
    g->n_staging = n_staging;
    /* Host-waited events block instead of spinning: the waiting thread's core is the CPU optimizer's. */
    unsigned waited = cudaEventDisableTiming | cudaEventBlockingSync;
    zt_status st = create_events(h, g, n_units, waited, &g->downloads);
    if (st == ZT_OK) st = create_events(h, g, n_units, cudaEventDisableTiming, &g->uploads);
    if (st == ZT_OK) st = create_events(h, g, n_staging, waited, &g->staging);
    return st;
}

zt_status zero_cuda_bind_thread(const zt_host *h, zero_cuda *g)
{
    cudaError_t e = cudaSetDevice(h->device->device_index);
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "cudaSetDevice on the offload thread");
}

static zt_status check_event(const zt_host *h, zero_cuda *g, cudaEvent_t *events, int32_t n, int32_t i,
                             const char *what)
{
    if (events && i >= 0 && i < n) return ZT_OK;
    h->error(h->ctx, ZT_ERR_INTERNAL, "%s: %s event %d is not in [0, %d) or offload is not set up (a bug)", g->plugin,
             what, (int)i, (int)n);
    return ZT_ERR_INTERNAL;
}

zt_status zero_cuda_download(const zt_host *h, zero_cuda *g, int32_t unit, void *dst, const void *src,
                             uint64_t bytes)
{
    zt_status st = check_event(h, g, g->downloads, g->n_units, unit, "download");
    if (st != ZT_OK) return st;
    cudaError_t e = bytes ? cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost, comm_stream(h))
                          : cudaSuccess;
    if (e != cudaSuccess) return cuda_call_failed(h, g->plugin, e, "copying a gradient shard to the host");
    e = cudaEventRecord(g->downloads[unit], comm_stream(h));
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "cudaEventRecord (gradient download)");
}

zt_status zero_cuda_wait_download(const zt_host *h, zero_cuda *g, int32_t unit)
{
    zt_status st = check_event(h, g, g->downloads, g->n_units, unit, "download");
    if (st != ZT_OK) return st;
    cudaError_t e = cudaEventSynchronize(g->downloads[unit]);
    return e == cudaSuccess ? ZT_OK
                            : cuda_call_failed(h, g->plugin, e, "waiting for a gradient shard's copy to the host "
                                                                "(or a collective before it)");
}

zt_status zero_cuda_upload(const zt_host *h, zero_cuda *g, void *dst, const void *src, uint64_t bytes)
{
    if (!bytes) return ZT_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice, copy_stream(h));
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "copying updated bf16 parameters to the GPU");
}

zt_status zero_cuda_upload_done(const zt_host *h, zero_cuda *g, int32_t unit, int32_t buf)
{
    zt_status st = check_event(h, g, g->uploads, g->n_units, unit, "upload");
    if (st == ZT_OK) st = check_event(h, g, g->staging, g->n_staging, buf, "staging");
    if (st != ZT_OK) return st;
    cudaError_t e = cudaEventRecord(g->uploads[unit], copy_stream(h));
    if (e == cudaSuccess) e = cudaEventRecord(g->staging[buf], copy_stream(h));
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "cudaEventRecord (parameter upload)");
}

zt_status zero_cuda_wait_staging(const zt_host *h, zero_cuda *g, int32_t buf)
{
    zt_status st = check_event(h, g, g->staging, g->n_staging, buf, "staging");
    if (st != ZT_OK) return st;
    cudaError_t e = cudaEventSynchronize(g->staging[buf]);
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "waiting for a parameter upload");
}

zt_status zero_cuda_comm_wait_upload(const zt_host *h, zero_cuda *g, int32_t unit)
{
    zt_status st = check_event(h, g, g->uploads, g->n_units, unit, "upload");
    if (st != ZT_OK) return st;
    cudaError_t e = cudaStreamWaitEvent(comm_stream(h), g->uploads[unit], 0);
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "ordering a gather after a parameter upload");
}

zt_status zero_cuda_copy_in_comm(const zt_host *h, zero_cuda *g, void *dst, const void *src, uint64_t bytes)
{
    if (!bytes) return ZT_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, comm_stream(h));
    return e == cudaSuccess ? ZT_OK
                            : cuda_call_failed(h, g->plugin, e, "copying a parameter shard into its gathered slot");
}

zt_status zero_cuda_sync_comm(const zt_host *h, zero_cuda *g)
{
    cudaError_t e = cudaStreamSynchronize(comm_stream(h));
    return e == cudaSuccess ? ZT_OK
                            : cuda_call_failed(h, g->plugin, e, "waiting for the comm stream (collectives and "
                                                                "gradient copies)");
}

zt_status zero_cuda_sync_copy(const zt_host *h, zero_cuda *g)
{
    cudaError_t e = cudaStreamSynchronize(copy_stream(h));
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, g->plugin, e, "waiting for the parameter uploads");
}
