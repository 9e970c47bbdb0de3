/* What the attention plugins' KV caches on a GPU share (naive and flash: a contiguous cache, one block
 * of the whole context per sequence; paged: blocks from one pool): the K/V pool in device memory in
 * the run's 16-bit type, [n_layers][n_blocks][n_kv_heads][block_size][head_dim] (the decode
 * kernels' head-major blocks, kernels_cuda.h zt_cuda_kv_pages), and per decode step the block tables and lengths
 * of the call's sequences, in call order, in fixed device buffers (so a captured CUDA graph replays
 * with new values): staged by kv_prepare before a step, else by the step's first kv_attend (which
 * the host never captures then). Each layer's kv_attend writes the new K/V (zt_cuda_kv_write) and attends over the
 * blocks in place (zt_cuda_attention_decode). The plugin keeps its own bookkeeping (lengths, which
 * blocks a sequence holds) on the host, as on the CPU. Included only where the plugin is built with
 * CUDA (ZT_PLUGIN_CUDA), after cuda_plugin.h.
 */
#ifndef ZT_PLUGINS_KV_CUDA_H
#define ZT_PLUGINS_KV_CUDA_H

#include <stdlib.h>
#include <string.h>

#include "cuda_plugin.h"
#include "zt/zt_model.h"

typedef struct zt_kv_device {
    zt_cuda_ctx *ctx;        /* the decode kernel's context: its split scratch grows as calls need */
    uint16_t *k, *v;         /* the pool */
    int64_t layer_elems;     /* n_blocks * n_kv_heads * block_size * head_dim */
    int32_t n_layers, n_blocks, block_size, n_kv_heads, head_dim;
    int32_t table_stride;    /* blocks a sequence may hold */
    int32_t max_rows;        /* sequences one call may run */
    int32_t *rows;           /* device: [max_rows][table_stride] block tables, then [max_rows] lengths */
    int32_t *staging;        /* host: the same, filled by the plugin before zt_kv_device_upload */
    /* The sequences (in call order) whose tables and lengths `rows` holds for the coming step
     * (kv_prepare, or the step's first kv_attend); n_prepared 0 once a cache change makes them old
     * (kv_advance, kv_reset, a block taken). kv_attend stages only when they are not the call's. */
    int32_t n_prepared;
    int32_t *prepared_ids;   /* host [max_rows] */
} zt_kv_device;

/* The block table of call row i in staging (table_stride entries) and its length. */
static inline int32_t *zt_kv_device_table(zt_kv_device *d, int32_t i)
{
    return d->staging + (int64_t)i * d->table_stride;
}

static inline int32_t *zt_kv_device_length(zt_kv_device *d, int32_t i)
{
    return d->staging + (int64_t)d->max_rows * d->table_stride + i;
}

/* Whether `rows` holds the tables and lengths of seq_ids[0, n) for this step. */
static inline int zt_kv_device_prepared(const zt_kv_device *d, const int32_t *seq_ids, int32_t n)
{
    return n > 0 && d->n_prepared == n && !memcmp(d->prepared_ids, seq_ids, (size_t)n * sizeof *seq_ids);
}

/* What `rows` holds no longer matches the cache (its lengths or blocks changed). */
static inline void zt_kv_device_unprepare(zt_kv_device *d)
{
    d->n_prepared = 0;
}

static inline void zt_kv_device_destroy(const zt_host *host, zt_kv_device *d)
{
    host->free(host->ctx, d->k);
    host->free(host->ctx, d->v);
    host->free(host->ctx, d->rows);
    free(d->staging);
    free(d->prepared_ids);
    zt_cuda_ctx_destroy(d->ctx);
    memset(d, 0, sizeof *d);
}

/* The pool and the per-step buffers; host->alloc describes a failure (ZT_ERR_OUT_OF_MEMORY). */
static inline zt_status zt_kv_device_create(zt_kv_device *d, const zt_host *host, int32_t n_layers, int32_t n_blocks,
                                            int32_t block_size, int32_t n_kv_heads, int32_t head_dim,
                                            int32_t table_stride, int32_t max_rows)
{
    memset(d, 0, sizeof *d);
    d->n_layers = n_layers;
    d->n_blocks = n_blocks;
    d->block_size = block_size;
    d->n_kv_heads = n_kv_heads;
    d->head_dim = head_dim;
    d->table_stride = table_stride;
    d->max_rows = max_rows;
    d->layer_elems = (int64_t)n_blocks * block_size * n_kv_heads * head_dim;
    uint64_t bytes = (uint64_t)n_layers * (uint64_t)d->layer_elems * 2;
    uint64_t ints = (uint64_t)max_rows * ((uint64_t)table_stride + 1);
    d->k = host->alloc(host->ctx, ZT_POOL_KV_CACHE, ZT_MEM_DEVICE, bytes, 0, "KV cache keys (device)");
    d->v = d->k ? host->alloc(host->ctx, ZT_POOL_KV_CACHE, ZT_MEM_DEVICE, bytes, 0, "KV cache values (device)") : NULL;
    d->rows = d->v ? host->alloc(host->ctx, ZT_POOL_OTHER, ZT_MEM_DEVICE, ints * sizeof(int32_t), 0,
                                 "KV cache block tables (device)")
                   : NULL;
    d->staging = d->rows ? calloc(ints, sizeof(int32_t)) : NULL;
    d->prepared_ids = d->staging ? calloc((size_t)max_rows, sizeof(int32_t)) : NULL;
    if (!d->prepared_ids) {
        if (d->rows) host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache's block table copy");
        zt_kv_device_destroy(host, d);
        return ZT_ERR_OUT_OF_MEMORY;
    }
    return ZT_OK;
}

/* Copies the staging tables and lengths of the call rows seq_ids[0, n_rows) to the device (before the
 * first layer of a step; ordered on the compute stream, so the kernels of the step before have read
 * the old ones) and marks them prepared. */
static inline zt_status zt_kv_device_upload(zt_kv_device *d, const zt_host *host, const int32_t *seq_ids,
                                            int32_t n_rows)
{
    cudaStream_t stream = zt_plugin_stream(host);
    cudaError_t e = cudaMemcpyAsync(d->rows, d->staging, (size_t)n_rows * d->table_stride * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(d->rows + (int64_t)d->max_rows * d->table_stride, zt_kv_device_length(d, 0),
                            (size_t)n_rows * sizeof(int32_t), cudaMemcpyHostToDevice, stream);
    /* the staging buffer is pageable: the copies have read it when they return */
    if (e != cudaSuccess) {
        host->error(host->ctx, ZT_ERR_DEVICE, "copying the KV cache's block tables to the GPU failed: %s",
                    cudaGetErrorString(e));
        return ZT_ERR_DEVICE;
    }
    memcpy(d->prepared_ids, seq_ids, (size_t)n_rows * sizeof *seq_ids);
    d->n_prepared = n_rows;
    return ZT_OK;
}

/* Copy-on-write: block `from`'s K and V, in every layer, into block `to` (ordered on the compute stream
 * before the step's writes). */
static inline zt_status zt_kv_device_copy_block(zt_kv_device *d, const zt_host *host, int32_t to, int32_t from)
{
    int64_t block = (int64_t)d->block_size * d->n_kv_heads * d->head_dim;
    cudaStream_t stream = zt_plugin_stream(host);
    cudaError_t e = cudaSuccess;
    for (int32_t l = 0; l < d->n_layers && e == cudaSuccess; l++) {
        int64_t base = (int64_t)l * d->layer_elems;
        e = cudaMemcpyAsync(d->k + base + to * block, d->k + base + from * block, (size_t)block * 2,
                            cudaMemcpyDeviceToDevice, stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(d->v + base + to * block, d->v + base + from * block, (size_t)block * 2,
                                cudaMemcpyDeviceToDevice, stream);
    }
    if (e != cudaSuccess) {
        host->error(host->ctx, ZT_ERR_DEVICE, "copying a shared KV block on the GPU failed: %s", cudaGetErrorString(e));
        return ZT_ERR_DEVICE;
    }
    return ZT_OK;
}

/* Training-style causal attention of q over k, v of the call alone (the plugin's forward: the flash
 * kernels), for a prompt of a fresh sequence; NULL: the decode kernel attends the prompt too. */
typedef zt_status (*zt_kv_prefill_fn)(void *state, const zt_attn_args *a);

/* One layer of a step over the uploaded rows: a->k, a->v ([n_rows, n_new, n_kv_heads, head_dim]) are
 * written after each row's length, then a->q attends causally over each row's blocks into a->out.
 * fresh: one row with nothing cached before the new tokens (a prompt), which `prefill` (when set)
 * attends from a->k, a->v directly. */
static inline zt_status zt_kv_device_attend(zt_kv_device *d, const zt_host *host, const char *plugin, int32_t layer,
                                            int32_t n_rows, const zt_attn_args *a, int fresh,
                                            zt_kv_prefill_fn prefill, void *state)
{
    int32_t n_new = (int32_t)a->q.shape[1];
    uint64_t scratch = zt_cuda_attention_decode_scratch_bytes(n_rows, n_new, a->n_heads, d->head_dim, d->table_stride,
                                                              d->block_size);
    zt_status st = zt_plugin_cuda_ctx(host, plugin, scratch, &d->ctx);
    if (st != ZT_OK) return st;
    zt_cuda_kv_pages p = {.k = d->k + (int64_t)layer * d->layer_elems,
                          .v = d->v + (int64_t)layer * d->layer_elems,
                          .block_size = d->block_size,
                          .n_kv_heads = d->n_kv_heads,
                          .head_dim = d->head_dim,
                          .block_tables = d->rows,
                          .table_stride = d->table_stride,
                          .lengths = d->rows + (int64_t)d->max_rows * d->table_stride};
    cudaStream_t stream = zt_plugin_stream(host);
    st = zt_cuda_kv_write(d->ctx, stream, &p, n_rows, n_new, a->k.data, a->v.data);
    if (st != ZT_OK) return zt_plugin_cuda_failed(host, st, "kv_attend: writing the new keys and values");
    if (fresh && n_rows == 1 && n_new > 1 && prefill) return prefill(state, a);
    st = zt_cuda_attention_decode(d->ctx, stream, &p, n_rows, n_new, a->n_heads, a->scale, a->q.data, a->out.data);
    if (st != ZT_OK) return zt_plugin_cuda_failed(host, st, "kv_attend: decode attention");
    return ZT_OK;
}

#endif
