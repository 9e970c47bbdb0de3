/* The contiguous KV cache of the naive and flash attention plugins: max_seqs sequence slots, each
 * owning seq_capacity = max_tokens / max_seqs tokens of every layer, reserved when the cache is made
 * (a sequence fits, or never will). On the CPU (where the plugin defines ZT_KV_CONTIGUOUS_CPU: naive)
 * fp32 host buffers [layer][seq][token][kv_head][head_dim] read by zt_cpu_attention_decode; on a GPU
 * (ZT_PLUGIN_CUDA, the run computes on one) the device pool of kv_cuda.h, one block per sequence.
 * This header defines the plugin's struct zt_kv_cache; the plugin checks its tensors (dtype, device,
 * shapes) and calls these for the rest. Errors name the plugin ("naive attention kv_attend: ...").
 */
#ifndef ZT_PLUGINS_KV_CONTIGUOUS_H
#define ZT_PLUGINS_KV_CONTIGUOUS_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt/zt_model.h"
#include "zt/zt_plugin.h"
#ifdef ZT_KV_CONTIGUOUS_CPU
#include "cpu/kernels.h"
#endif
#ifdef ZT_PLUGIN_CUDA
#include "kv_cuda.h"
#else
typedef zt_status (*zt_kv_prefill_fn)(void *state, const zt_attn_args *a); /* kv_cuda.h */
#endif

#define KV_CONTIGUOUS_MAGIC 0x4556414Eu /* "NAVE" */

struct zt_kv_cache {
    uint32_t magic;
    int32_t n_layers, n_kv_heads, head_dim, max_seqs;
    int64_t seq_capacity;
    int64_t *length; /* committed tokens per sequence */
    float *k, *v;    /* on the CPU */
    int on_gpu;
#ifdef ZT_PLUGIN_CUDA
    zt_kv_device dev; /* on a GPU: blocks = sequences, block_size = seq_capacity */
#endif
};

/* Where the messages go: the plugin's host and the name they start with ("naive attention"). */
typedef struct kv_contiguous_owner {
    const zt_host *host;
    const char *name;
} kv_contiguous_owner;

static zt_status kvc_fail(const kv_contiguous_owner *o, zt_status st, const char *op, const char *fmt, ...)
    ZT_PRINTF(4, 5);
static zt_status kvc_fail(const kv_contiguous_owner *o, zt_status st, const char *op, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    o->host->error(o->host->ctx, st, "%s %s: %s", o->name, op, msg);
    return st;
}

static zt_status kvc_create(const kv_contiguous_owner *o, int on_gpu, const zt_kv_cache_desc *d, zt_kv_cache **out)
{
    if (!d || !out || d->struct_size < ZT_KV_CACHE_DESC_SIZE_1_0)
        return kvc_fail(o, ZT_ERR_INVALID_ARG, "kv_create", "the descriptor or the output pointer is NULL");
    *out = NULL;
    if (on_gpu && d->dtype != ZT_BF16 && d->dtype != ZT_F16)
        return kvc_fail(o, ZT_ERR_UNSUPPORTED, "kv_create",
                        "cache dtype %d asked for; on a GPU the cache holds the run's 16-bit type (ZT_BF16 or "
                        "ZT_F16)", (int)d->dtype);
    if (!on_gpu && d->dtype != ZT_F32)
        return kvc_fail(o, ZT_ERR_UNSUPPORTED, "kv_create", "cache dtype %d asked for; on the CPU %s caches fp32 "
                        "(ZT_F32) only", (int)d->dtype, o->name);
#if !defined(ZT_KV_CONTIGUOUS_CPU)
    if (!on_gpu)
        return kvc_fail(o, ZT_ERR_UNSUPPORTED, "kv_create", "this plugin keeps a KV cache on a GPU only");
#endif
#if !defined(ZT_PLUGIN_CUDA)
    if (on_gpu)
        return kvc_fail(o, ZT_ERR_UNSUPPORTED, "kv_create", "this build of the plugin has no CUDA path");
#endif
    if (d->n_layers < 1 || d->n_kv_heads < 1 || d->head_dim < 1 || d->max_seqs < 1 || d->max_tokens < d->max_seqs)
        return kvc_fail(o, ZT_ERR_INVALID_ARG, "kv_create",
                        "n_layers %d, n_kv_heads %d, head_dim %d, max_seqs %d, max_tokens %d: all must be positive "
                        "and max_tokens at least max_seqs (every sequence gets max_tokens / max_seqs tokens)",
                        (int)d->n_layers, (int)d->n_kv_heads, (int)d->head_dim, (int)d->max_seqs, (int)d->max_tokens);
    double elem = on_gpu ? 2 : sizeof(float);
    double elements = (double)d->n_layers * d->max_seqs * (double)(d->max_tokens / d->max_seqs) * d->n_kv_heads *
                      d->head_dim;
    if (elements * elem > 0x1p62)
        return kvc_fail(o, ZT_ERR_OUT_OF_MEMORY, "kv_create",
                        "a cache of %d layers x %d tokens x %d heads x %d would take %.3g bytes per K and V: more "
                        "than any machine has; lower max_tokens", (int)d->n_layers, (int)d->max_tokens,
                        (int)d->n_kv_heads, (int)d->head_dim, elements * elem);
    zt_kv_cache *c = calloc(1, sizeof *c);
    int64_t *length = calloc((size_t)d->max_seqs, sizeof *length);
    if (!c || !length) {
        free(c);
        free(length);
        return kvc_fail(o, ZT_ERR_OUT_OF_MEMORY, "kv_create", "cannot allocate the cache bookkeeping");
    }
    c->magic = KV_CONTIGUOUS_MAGIC;
    c->n_layers = d->n_layers;
    c->n_kv_heads = d->n_kv_heads;
    c->head_dim = d->head_dim;
    c->max_seqs = d->max_seqs;
    c->seq_capacity = d->max_tokens / d->max_seqs;
    c->length = length;
    c->on_gpu = on_gpu;
#ifdef ZT_PLUGIN_CUDA
    if (on_gpu) {
        if (zt_kv_device_create(&c->dev, o->host, d->n_layers, d->max_seqs, (int32_t)c->seq_capacity, d->n_kv_heads,
                                d->head_dim, 1, d->max_seqs) != ZT_OK) {
            free(length);
            free(c);
            return ZT_ERR_OUT_OF_MEMORY; /* host->alloc described it */
        }
        *out = c;
        return ZT_OK;
    }
#endif
    uint64_t bytes = (uint64_t)d->n_layers * (uint64_t)d->max_seqs * (uint64_t)c->seq_capacity *
                     (uint64_t)d->n_kv_heads * (uint64_t)d->head_dim * sizeof(float);
    c->k = o->host->alloc(o->host->ctx, ZT_POOL_KV_CACHE, ZT_MEM_HOST, bytes, 0, "KV cache keys");
    c->v = c->k ? o->host->alloc(o->host->ctx, ZT_POOL_KV_CACHE, ZT_MEM_HOST, bytes, 0, "KV cache values") : NULL;
    if (!c->v) {
        o->host->free(o->host->ctx, c->k);
        free(length);
        free(c);
        return ZT_ERR_OUT_OF_MEMORY; /* host->alloc described it */
    }
    *out = c;
    return ZT_OK;
}

static void kvc_destroy(const kv_contiguous_owner *o, zt_kv_cache *c)
{
    if (!c || c->magic != KV_CONTIGUOUS_MAGIC) return;
    c->magic = 0;
#ifdef ZT_PLUGIN_CUDA
    if (c->on_gpu) zt_kv_device_destroy(o->host, &c->dev);
#endif
    o->host->free(o->host->ctx, c->k);
    o->host->free(o->host->ctx, c->v);
    free(c->length);
    free(c);
}

/* Checks a cache handle and a list of sequences; `n_new` more tokens must fit each one. */
static zt_status kvc_check_sequences(const kv_contiguous_owner *o, const char *op, const zt_kv_cache *c,
                                     const int32_t *seq_ids, int32_t n_seqs, int64_t n_new)
{
    if (!c || c->magic != KV_CONTIGUOUS_MAGIC)
        return kvc_fail(o, ZT_ERR_INVALID_ARG, op, "the cache handle is not a live KV cache of this plugin");
    if (n_seqs < 1 || !seq_ids)
        return kvc_fail(o, ZT_ERR_INVALID_ARG, op, "no sequences given (n_seqs %d)", (int)n_seqs);
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t id = seq_ids[i];
        if (id < 0 || id >= c->max_seqs)
            return kvc_fail(o, ZT_ERR_INVALID_ARG, op, "sequence id %d (entry %d) is outside [0, %d), the max_seqs "
                            "the cache was created with", (int)id, (int)i, (int)c->max_seqs);
        for (int32_t j = 0; j < i; j++)
            if (seq_ids[j] == id)
                return kvc_fail(o, ZT_ERR_INVALID_ARG, op, "sequence id %d appears twice (entries %d and %d)",
                                (int)id, (int)j, (int)i);
        if (c->length[id] + n_new > c->seq_capacity)
            return kvc_fail(o, ZT_ERR_BUFFER_TOO_SMALL, op,
                            "sequence %d holds %lld tokens and %lld more do not fit its %lld-token share of the "
                            "cache (max_tokens / max_seqs); create the cache with max_tokens of at least %lld, or "
                            "reset finished sequences", (int)id, (long long)c->length[id], (long long)n_new,
                            (long long)c->seq_capacity, (long long)((c->length[id] + n_new) * c->max_seqs));
    }
    return ZT_OK;
}

#ifdef ZT_KV_CONTIGUOUS_CPU
/* K (or V) of token `pos` of sequence `seq` in `layer`. */
static float *kvc_row(const zt_kv_cache *c, float *base, int32_t layer, int32_t seq, int64_t pos)
{
    int64_t row = ((int64_t)layer * c->max_seqs + seq) * c->seq_capacity + pos;
    return base + row * c->n_kv_heads * c->head_dim;
}
#endif

/* What kv_attend checks against the cache (the sequences, the layer, the head counts), before the
 * plugin checks the tensors. */
static zt_status kvc_check_attend(const kv_contiguous_owner *o, const zt_kv_cache *c, int32_t layer,
                                  const int32_t *seq_ids, int32_t n_seqs, const zt_attn_args *a)
{
    zt_status st = kvc_check_sequences(o, "kv_attend", c, seq_ids, n_seqs, a->q.shape[1]);
    if (st != ZT_OK) return st;
    if (layer < 0 || layer >= c->n_layers)
        return kvc_fail(o, ZT_ERR_INVALID_ARG, "kv_attend", "layer %d is outside [0, %d), the cache's n_layers",
                        (int)layer, (int)c->n_layers);
    if (a->n_kv_heads != c->n_kv_heads || a->head_dim != c->head_dim)
        return kvc_fail(o, ZT_ERR_INVALID_ARG, "kv_attend",
                        "the call has %d key/value heads of %d but the cache was created for %d of %d",
                        (int)a->n_kv_heads, (int)a->head_dim, (int)c->n_kv_heads, (int)c->head_dim);
    return ZT_OK;
}

#ifdef ZT_PLUGIN_CUDA
/* The step's tables (a sequence's one block is its id) and lengths, to the device. */
static zt_status kvc_stage(const kv_contiguous_owner *o, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs)
{
    for (int32_t i = 0; i < n_seqs; i++) {
        zt_kv_device_table(&c->dev, i)[0] = seq_ids[i];
        *zt_kv_device_length(&c->dev, i) = (int32_t)c->length[seq_ids[i]];
    }
    return zt_kv_device_upload(&c->dev, o->host, seq_ids, n_seqs);
}
#endif

/* kv_attend after kvc_check_attend and the plugin's checks of q, k, v, out ([n_seqs, n_new, heads,
 * head_dim], dtype, device): appends k, v after each sequence's committed tokens and attends q over
 * each whole cache. cpu: the plugin's CPU kernel context (NULL on a GPU); prefill (may be NULL): the
 * plugin's forward for a fresh sequence's prompt on a GPU (kv_cuda.h), called with `state`. */
static zt_status kvc_attend(const kv_contiguous_owner *o, void *cpu, zt_kv_cache *c, int32_t layer,
                            const int32_t *seq_ids, int32_t n_seqs, const zt_attn_args *a, zt_kv_prefill_fn prefill,
                            void *state)
{
    (void)prefill; /* used on a GPU only */
    (void)state;
#ifdef ZT_PLUGIN_CUDA
    if (c->on_gpu) {
        zt_status st; /* staged once a step, by kv_prepare or here */
        if (!zt_kv_device_prepared(&c->dev, seq_ids, n_seqs) && (st = kvc_stage(o, c, seq_ids, n_seqs)) != ZT_OK)
            return st;
        return zt_kv_device_attend(&c->dev, o->host, o->name, layer, n_seqs, a, c->length[seq_ids[0]] == 0, prefill,
                                   state);
    }
#endif
#ifdef ZT_KV_CONTIGUOUS_CPU
    int64_t n_new = a->q.shape[1], H = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim;
    /* Append: the new tokens go after each sequence's committed ones (kv_advance commits them). */
    size_t row_bytes = (size_t)(Hkv * D) * sizeof(float);
    for (int32_t i = 0; i < n_seqs; i++) {
        for (int64_t t = 0; t < n_new; t++) {
            int64_t pos = c->length[seq_ids[i]] + t;
            memcpy(kvc_row(c, c->k, layer, seq_ids[i], pos), (const float *)a->k.data + (i * n_new + t) * Hkv * D,
                   row_bytes);
            memcpy(kvc_row(c, c->v, layer, seq_ids[i], pos), (const float *)a->v.data + (i * n_new + t) * Hkv * D,
                   row_bytes);
        }
    }
    /* Each sequence's slice is one block of seq_capacity tokens: the shared decode kernel's
     * block tables are then just the sequence ids. */
    int64_t *lengths = malloc((size_t)n_seqs * sizeof *lengths);
    if (!lengths)
        return kvc_fail(o, ZT_ERR_OUT_OF_MEMORY, "kv_attend", "cannot allocate %d sequence lengths", (int)n_seqs);
    for (int32_t i = 0; i < n_seqs; i++) lengths[i] = c->length[seq_ids[i]];
    int64_t layer_offset = (int64_t)layer * c->max_seqs * c->seq_capacity * Hkv * D;
    zt_kv_pages pages = {.k = c->k + layer_offset, .v = c->v + layer_offset, .block_size = c->seq_capacity,
                         .row_stride = Hkv * D, .block_tables = seq_ids, .table_stride = 1, .lengths = lengths};
    zt_attention_shape shape = {.heads = H, .kv_heads = Hkv, .head_dim = D, .scale = a->scale};
    zt_cpu_attention_decode(cpu, &shape, &pages, n_seqs, n_new, a->q.data, a->out.data);
    free(lengths);
    return ZT_OK;
#else
    (void)cpu;
    return kvc_fail(o, ZT_ERR_UNSUPPORTED, "kv_attend", "this plugin keeps a KV cache on a GPU only");
#endif
}

static zt_status kvc_advance(const kv_contiguous_owner *o, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs,
                             int32_t n_new)
{
    if (n_new < 0) return kvc_fail(o, ZT_ERR_INVALID_ARG, "kv_advance", "n_new is %d, less than 0", (int)n_new);
    zt_status st = kvc_check_sequences(o, "kv_advance", c, seq_ids, n_seqs, n_new);
    if (st != ZT_OK) return st;
    for (int32_t i = 0; i < n_seqs; i++) c->length[seq_ids[i]] += n_new;
#ifdef ZT_PLUGIN_CUDA
    zt_kv_device_unprepare(&c->dev);
#endif
    return ZT_OK;
}

static zt_status kvc_reset(const kv_contiguous_owner *o, zt_kv_cache *c, int32_t seq_id)
{
    zt_status st = kvc_check_sequences(o, "kv_reset", c, &seq_id, 1, 0);
    if (st != ZT_OK) return st;
    c->length[seq_id] = 0;
#ifdef ZT_PLUGIN_CUDA
    zt_kv_device_unprepare(&c->dev);
#endif
    return ZT_OK;
}

/* Room is reserved when the cache is made: a sequence fits, or never will. */
static zt_status kvc_reserve(const kv_contiguous_owner *o, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs,
                             int32_t n_new)
{
    if (n_new < 0) return kvc_fail(o, ZT_ERR_INVALID_ARG, "kv_reserve", "n_new is %d, less than 0", (int)n_new);
    return kvc_check_sequences(o, "kv_reserve", c, seq_ids, n_seqs, n_new);
}

/* kv_reserve, then (on a GPU) the step's tables and lengths to the device: kv_attend then only
 * enqueues kernels, so the host may capture the step. */
static zt_status kvc_prepare(const kv_contiguous_owner *o, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs,
                             int32_t n_new)
{
    if (n_new < 0) return kvc_fail(o, ZT_ERR_INVALID_ARG, "kv_prepare", "n_new is %d, less than 0", (int)n_new);
    zt_status st = kvc_check_sequences(o, "kv_prepare", c, seq_ids, n_seqs, n_new);
#ifdef ZT_PLUGIN_CUDA
    if (st == ZT_OK && c->on_gpu) st = kvc_stage(o, c, seq_ids, n_seqs);
#endif
    return st;
}

/* One block per sequence slot, of its whole share: a live sequence holds one, a finished one none. */
static zt_status kvc_stats(const kv_contiguous_owner *o, const zt_kv_cache *c, int32_t seq_id, zt_kv_stats *out)
{
    if (!c || c->magic != KV_CONTIGUOUS_MAGIC || !out || out->struct_size < sizeof *out)
        return kvc_fail(o, ZT_ERR_INVALID_ARG, "kv_stats", "the cache handle or the output struct is not valid");
    if (seq_id < -1 || seq_id >= c->max_seqs)
        return kvc_fail(o, ZT_ERR_INVALID_ARG, "kv_stats", "sequence id %d is outside [-1, %d)", (int)seq_id,
                        (int)c->max_seqs);
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->block_size = (int32_t)c->seq_capacity;
    out->total_blocks = c->max_seqs;
    for (int32_t i = 0; i < c->max_seqs; i++) {
        int live = c->length[i] > 0;
        out->used_blocks += live;
        if (seq_id == -1 || seq_id == i) {
            out->tokens += c->length[i];
            out->slots += live ? c->seq_capacity : 0;
        }
    }
    out->refcount_sum = out->used_blocks;
    out->free_blocks = out->total_blocks - out->used_blocks;
    out->bytes = 2 * (int64_t)c->n_layers * c->max_seqs * c->seq_capacity * c->n_kv_heads * c->head_dim *
                 (int64_t)(c->on_gpu ? 2 : sizeof(float));
    return ZT_OK;
}

#endif
