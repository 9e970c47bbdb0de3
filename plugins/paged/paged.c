/* The paged attention plugin: a KV cache in fixed-size blocks of one preallocated pool, addressed
 * through per-sequence block tables (vLLM's PagedAttention), with prompt prefixes shared between
 * sequences by reference-counted blocks and copy-on-write. Training and prefill run the exact
 * causal attention of the CPU kernels (packed documents, grouped KV heads), the same the naive
 * plugin runs; decoding runs the kernels' block-table attention, which the naive plugin's
 * contiguous cache runs too, so both give the same bits. docs/generate.md describes the cache.
 *
 * On a GPU (device = cuda, a build with CUDA) training and evaluation run the flash kernels instead
 * (train_cuda.c), the calls the flash plugin makes.
 *
 * Layout, chosen so a GPU decode kernel reads blocks in place: per layer, K and V pools of
 * [n_blocks][block_size][n_kv_heads][head_dim] floats (the layers one after another); one block
 * id addresses the same slots in every layer; block tables are int32 [max_seqs][max_blocks_per_seq].
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attention_args.h"
#include "block_pool.h"
#include "cpu/kernels.h"
#include "zt/zt_plugin.h"
#ifdef ZT_PLUGIN_CUDA
#include "../kv_cuda.h"
#include "train_cuda.h"
#endif

typedef struct paged_options {
    int64_t block_size;
    double kv_budget_gib; /* < 0: not set, kv_fraction decides */
    double kv_fraction;
    int32_t prefix_sharing, shuffle;
    int64_t shuffle_seed;
} paged_options;

typedef struct paged_state {
    const zt_host *host;
    zt_cpu_ctx cpu;
    paged_options opt;
#ifdef ZT_PLUGIN_CUDA
    paged_cuda *cuda; /* a GPU run's training path; NULL on the CPU */
#endif
} paged_state;

#define SAVED_MAGIC 0x56534150u /* "PASV" */
#define CACHE_MAGIC 0x45474150u /* "PAGE" */

/* What forward keeps for backward: the log-sum-exp of every query row, [B, H, T]. */
typedef struct paged_saved {
    uint32_t magic;
    int32_t heads;
    int64_t batch, seq;
    float lse[];
} paged_saved;

/* One sequence slot. Its prompt is kept to publish the full prompt blocks it fills. */
typedef struct paged_seq {
    int32_t *table; /* [max_blocks_per_seq] of the cache's tables */
    int32_t n_table;
    int64_t length;  /* committed tokens */
    int32_t *prompt; /* kv_prefix's tokens (malloc'd), NULL without */
    int32_t n_prompt;
    int32_t n_published; /* leading blocks known to the prefix cache (matched or published) */
    uint64_t chain;      /* the hash of the last of them */
} paged_seq;

struct zt_kv_cache {
    uint32_t magic;
    int32_t n_layers, n_kv_heads, head_dim, max_seqs, max_blocks_per_seq;
    int64_t row; /* floats per token row: n_kv_heads * head_dim */
    int prefix_sharing;
    block_pool pool;
    float *k, *v;        /* [n_layers][n_blocks][block_size][n_kv_heads][head_dim], on the CPU */
#ifdef ZT_PLUGIN_CUDA
    int on_gpu;          /* the pool is dev's, in the run's 16-bit type, with the tables mirrored there */
    zt_kv_device dev;
#endif
    int32_t *tables;     /* [max_seqs][max_blocks_per_seq] */
    paged_seq *seqs;     /* [max_seqs] */
    int64_t prefix_hit_tokens, cow_copies;
};

/* ---- messages and checks --------------------------------------------------------------------- */

static zt_status fail(const paged_state *s, zt_status st, const char *op, const char *fmt, ...) ZT_PRINTF(4, 5);
static zt_status fail(const paged_state *s, zt_status st, const char *op, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->host->error(s->host->ctx, st, "paged attention %s: %s", op, msg);
    return st;
}

static zt_status check_tensor(const paged_state *s, const char *op, const char *name, const zt_tensor *t,
                              int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    const int64_t want[4] = {d0, d1, d2, d3};
    if (!t->data) return fail(s, ZT_ERR_INVALID_ARG, op, "%s has no data (NULL)", name);
    int on_gpu = 0;
#ifdef ZT_PLUGIN_CUDA
    on_gpu = s->cuda != NULL;
    if (on_gpu && ((t->dtype != ZT_BF16 && t->dtype != ZT_F16) || t->device_type != ZT_DEVICE_CUDA))
        return fail(s, ZT_ERR_UNSUPPORTED, op, "%s must be a bf16 or fp16 tensor in device memory (dtype %d, device "
                    "%d given): this run computes on a GPU", name, (int)t->dtype, (int)t->device_type);
#endif
    if (!on_gpu && (t->dtype != ZT_F32 || t->device_type != ZT_DEVICE_CPU))
        return fail(s, ZT_ERR_UNSUPPORTED, op, "%s must be an fp32 tensor in host memory (dtype %d, device %d given): "
                    "paged attention computes on the CPU in fp32", name, (int)t->dtype, (int)t->device_type);
    char why[512];
    if (!zt_attention_shape_ok(t, name, want, why, sizeof why)) return fail(s, ZT_ERR_INVALID_ARG, op, "%s", why);
    return ZT_OK;
}

static zt_status check_heads(const paged_state *s, const char *op, const zt_attn_args *a)
{
    if (!a || a->struct_size < sizeof(zt_attn_args))
        return fail(s, ZT_ERR_INVALID_ARG, op, "the argument struct is NULL or older than ABI 1.0");
    if (a->n_heads < 1 || a->n_kv_heads < 1 || a->head_dim < 1 || a->n_heads % a->n_kv_heads != 0)
        return fail(s, ZT_ERR_INVALID_ARG, op,
                    "n_heads %d, n_kv_heads %d, head_dim %d: all must be positive and n_kv_heads must divide "
                    "n_heads", (int)a->n_heads, (int)a->n_kv_heads, (int)a->head_dim);
    if (!a->causal)
        return fail(s, ZT_ERR_UNSUPPORTED, op, "non-causal attention was asked for (causal = 0); paged attention "
                    "implements the causal mask of decoder-only models only");
    if (!(a->scale > 0.0f) || !isfinite(a->scale))
        return fail(s, ZT_ERR_INVALID_ARG, op, "the softmax scale %g is not a positive number", (double)a->scale);
    return ZT_OK;
}

static zt_status check_training_args(const paged_state *s, const char *op, const zt_attn_args *a)
{
    zt_status st = check_heads(s, op, a);
    if (st != ZT_OK) return st;
    const zt_batch *b = a->batch;
    if (!b || b->batch < 1 || b->seq_len < 1) return fail(s, ZT_ERR_INVALID_ARG, op, "the batch is missing or empty");
    int64_t B = b->batch, T = b->seq_len, H = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim;
    if ((st = check_tensor(s, op, "q", &a->q, B, T, H, D)) != ZT_OK) return st;
    if ((st = check_tensor(s, op, "k", &a->k, B, T, Hkv, D)) != ZT_OK) return st;
    if ((st = check_tensor(s, op, "v", &a->v, B, T, Hkv, D)) != ZT_OK) return st;
    return check_tensor(s, op, "out", &a->out, B, T, H, D);
}

static zt_attention_shape kernel_shape(const zt_attn_args *a)
{
    zt_attention_shape shape = {.batch = a->batch->batch, .seq = a->batch->seq_len, .heads = a->n_heads,
                                .kv_heads = a->n_kv_heads, .head_dim = a->head_dim, .scale = a->scale};
    return shape;
}

/* ---- training: the CPU kernels' exact attention ---------------------------------------------- */

static zt_status paged_forward(void *state, const zt_attn_args *a, void **saved)
{
    paged_state *s = state;
#ifdef ZT_PLUGIN_CUDA
    if (s->cuda) return paged_cuda_forward(s->cuda, a, saved);
#endif
    zt_status st = check_training_args(s, "forward", a);
    if (st != ZT_OK) return st;
    zt_attention_shape shape = kernel_shape(a);
    uint64_t rows = (uint64_t)(shape.batch * shape.heads * shape.seq);
    paged_saved *rec = s->host->alloc(s->host->ctx, saved ? ZT_POOL_ACTIVATIONS : ZT_POOL_WORKSPACE, ZT_MEM_HOST,
                                      sizeof(paged_saved) + rows * sizeof(float), 0, "attention log-sum-exp rows");
    if (!rec) return ZT_ERR_OUT_OF_MEMORY;
    *rec = (paged_saved){.magic = SAVED_MAGIC, .heads = a->n_heads, .batch = shape.batch, .seq = shape.seq};
    zt_cpu_attention_forward(&s->cpu, &shape, a->q.data, a->k.data, a->v.data, a->batch->doc_ids, a->out.data,
                             rec->lse);
    if (saved) *saved = rec;
    else s->host->free(s->host->ctx, rec);
    return ZT_OK;
}

static void free_saved(paged_state *s, paged_saved *rec)
{
    rec->magic = 0;
    s->host->free(s->host->ctx, rec);
}

/* Frees `saved` in every case (the ABI's "backward consumes saved"). */
static zt_status paged_backward(void *state, const zt_attn_args *a, void *saved)
{
    paged_state *s = state;
#ifdef ZT_PLUGIN_CUDA
    if (s->cuda) return paged_cuda_backward(s->cuda, a, saved);
#endif
    paged_saved *rec = saved;
    zt_status st = check_training_args(s, "backward", a);
    if (st == ZT_OK) {
        int64_t B = a->batch->batch, T = a->batch->seq_len, H = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim;
        if (!rec || rec->magic != SAVED_MAGIC || rec->batch != B || rec->seq != T || rec->heads != H)
            st = fail(s, ZT_ERR_INVALID_ARG, "backward", "the saved record is %s; pass what forward stored in *saved "
                      "for this same batch, once", !rec ? "NULL (forward ran without a backward)"
                      : rec->magic != SAVED_MAGIC ? "not one of paged attention's (or was freed already)"
                                                  : "from a forward of another shape");
        if (st == ZT_OK && (st = check_tensor(s, "backward", "dout", &a->dout, B, T, H, D)) == ZT_OK &&
            (st = check_tensor(s, "backward", "dq", &a->dq, B, T, H, D)) == ZT_OK &&
            (st = check_tensor(s, "backward", "dk", &a->dk, B, T, Hkv, D)) == ZT_OK)
            st = check_tensor(s, "backward", "dv", &a->dv, B, T, Hkv, D);
    }
    if (st == ZT_OK) {
        zt_attention_shape shape = kernel_shape(a);
        zt_cpu_attention_backward(&s->cpu, &shape, a->q.data, a->k.data, a->v.data, a->batch->doc_ids, a->out.data,
                                  rec->lse, a->dout.data, a->dq.data, a->dk.data, a->dv.data);
    }
    if (rec && rec->magic == SAVED_MAGIC) free_saved(s, rec);
    return st;
}

static void paged_release(void *state, void *saved)
{
#ifdef ZT_PLUGIN_CUDA
    if (((paged_state *)state)->cuda) {
        paged_cuda_release(((paged_state *)state)->cuda, saved);
        return;
    }
#endif
    paged_saved *rec = saved;
    if (rec && rec->magic == SAVED_MAGIC) free_saved(state, rec);
}

/* ---- the cache ------------------------------------------------------------------------------- */

static int64_t block_floats(const zt_kv_cache *c)
{
    return (int64_t)c->pool.block_size * c->row;
}

static float *layer_pool(const zt_kv_cache *c, float *base, int32_t layer)
{
    return base + (int64_t)layer * c->pool.n_blocks * block_floats(c);
}

static zt_status paged_kv_create(void *state, const zt_kv_cache_desc *d, zt_kv_cache **out)
{
    paged_state *s = state;
    const zt_host *h = s->host;
    if (!d || !out || d->struct_size < ZT_KV_CACHE_DESC_SIZE_1_0)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_create", "the descriptor or the output pointer is NULL");
    *out = NULL;
    int on_gpu = 0, elem = sizeof(float);
#ifdef ZT_PLUGIN_CUDA
    on_gpu = s->cuda != NULL;
    if (on_gpu) elem = 2;
    if (on_gpu && d->dtype != ZT_BF16 && d->dtype != ZT_F16)
        return fail(s, ZT_ERR_UNSUPPORTED, "kv_create", "cache dtype %d asked for; on a GPU paged attention caches "
                    "the run's 16-bit type (ZT_BF16 or ZT_F16)", (int)d->dtype);
#endif
    if (!on_gpu && d->dtype != ZT_F32)
        return fail(s, ZT_ERR_UNSUPPORTED, "kv_create", "cache dtype %d asked for; paged attention caches fp32 "
                    "(ZT_F32) on the CPU", (int)d->dtype);
    if (d->n_layers < 1 || d->n_kv_heads < 1 || d->head_dim < 1 || d->max_seqs < 1 || d->max_tokens < d->max_seqs)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_create", "n_layers %d, n_kv_heads %d, head_dim %d, max_seqs %d, "
                    "max_tokens %d: all must be positive and max_tokens at least max_seqs", (int)d->n_layers,
                    (int)d->n_kv_heads, (int)d->head_dim, (int)d->max_seqs, (int)d->max_tokens);
    int is_1_3 = d->struct_size >= ZT_KV_CACHE_DESC_SIZE_1_3;
    int64_t bs = d->block_size > 0 ? d->block_size : s->opt.block_size;
    int64_t seq_tokens = is_1_3 && d->max_seq_tokens > 0 ? d->max_seq_tokens : d->max_tokens / d->max_seqs;
    int64_t per_seq = (seq_tokens + bs - 1) / bs;
    double block_bytes = 2.0 * d->n_layers * (double)bs * d->n_kv_heads * d->head_dim * elem;
    double budget;
    char origin[128];
    if (s->opt.kv_budget_gib >= 0) {
        budget = s->opt.kv_budget_gib * 1073741824.0;
        snprintf(origin, sizeof origin, "paged.kv_budget %g GiB", s->opt.kv_budget_gib);
    } else {
        uint64_t free_bytes = is_1_3 ? d->free_bytes : 0;
#ifdef ZT_PLUGIN_CUDA
        size_t device_free = 0, device_total = 0;
        if (on_gpu && !free_bytes && cudaMemGetInfo(&device_free, &device_total) == cudaSuccess)
            free_bytes = device_free; /* the host does not know the device's */
#endif
        if (!free_bytes)
            return fail(s, ZT_ERR_CONFIG, "kv_create", "the host does not say how much memory is free, so "
                        "paged.kv_fraction has nothing to take a share of: set paged.kv_budget (GiB)");
        budget = s->opt.kv_fraction * (double)free_bytes;
        snprintf(origin, sizeof origin, "paged.kv_fraction %g of %.2f GiB free", s->opt.kv_fraction,
                 (double)free_bytes / 1073741824.0);
    }
    double fit = floor(budget / block_bytes);
    if (fit < 1)
        return fail(s, ZT_ERR_CONFIG, "kv_create", "the KV budget (%s = %.0f bytes) holds no block: one block of %lld "
                    "tokens takes %.0f bytes (%d layers x K and V x %d heads x %d); raise paged.kv_budget or lower "
                    "paged.block_size", origin, budget, (long long)bs, block_bytes, (int)d->n_layers,
                    (int)d->n_kv_heads, (int)d->head_dim);
    double want = (double)per_seq * d->max_seqs; /* more could never be used */
    int64_t n_blocks = (int64_t)(fit < want ? fit : want);
    if (n_blocks > INT32_MAX / 2) n_blocks = INT32_MAX / 2;
    zt_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return fail(s, ZT_ERR_OUT_OF_MEMORY, "kv_create", "cannot allocate the cache bookkeeping");
    c->magic = CACHE_MAGIC;
    c->n_layers = d->n_layers;
    c->n_kv_heads = d->n_kv_heads;
    c->head_dim = d->head_dim;
    c->max_seqs = d->max_seqs;
    c->max_blocks_per_seq = (int32_t)per_seq;
    c->row = (int64_t)d->n_kv_heads * d->head_dim;
    c->prefix_sharing = s->opt.prefix_sharing;
    c->tables = calloc((size_t)d->max_seqs * (size_t)per_seq, sizeof *c->tables);
    c->seqs = calloc((size_t)d->max_seqs, sizeof *c->seqs);
    if (!c->tables || !c->seqs ||
        block_pool_init(&c->pool, (int32_t)n_blocks, (int32_t)bs, s->opt.shuffle, (uint64_t)s->opt.shuffle_seed)) {
        free(c->tables);
        free(c->seqs);
        free(c);
        return fail(s, ZT_ERR_OUT_OF_MEMORY, "kv_create", "cannot allocate the tables of %lld blocks",
                    (long long)n_blocks);
    }
    for (int32_t i = 0; i < d->max_seqs; i++) c->seqs[i].table = c->tables + (int64_t)i * per_seq;
    uint64_t bytes = (uint64_t)(block_bytes / 2) * (uint64_t)n_blocks;
#ifdef ZT_PLUGIN_CUDA
    c->on_gpu = on_gpu;
    if (on_gpu && zt_kv_device_create(&c->dev, h, d->n_layers, (int32_t)n_blocks, (int32_t)bs, d->n_kv_heads,
                                      d->head_dim, (int32_t)per_seq, d->max_seqs) != ZT_OK) {
        block_pool_free(&c->pool);
        free(c->tables);
        free(c->seqs);
        free(c);
        return ZT_ERR_OUT_OF_MEMORY; /* host->alloc described it */
    }
    if (on_gpu) goto created;
#endif
    c->k = h->alloc(h->ctx, ZT_POOL_KV_CACHE, ZT_MEM_HOST, bytes, 0, "paged KV cache keys");
    c->v = c->k ? h->alloc(h->ctx, ZT_POOL_KV_CACHE, ZT_MEM_HOST, bytes, 0, "paged KV cache values") : NULL;
    if (!c->v) {
        h->free(h->ctx, c->k);
        block_pool_free(&c->pool);
        free(c->tables);
        free(c->seqs);
        free(c);
        return ZT_ERR_OUT_OF_MEMORY; /* host->alloc described it */
    }
#ifdef ZT_PLUGIN_CUDA
created:
#endif
    h->log(h->ctx, ZT_LOG_INFO, "KV cache: %lld blocks of %lld tokens (%.2f MiB; %s%s), prefix sharing %s%s",
           (long long)n_blocks, (long long)bs, 2.0 * (double)bytes / 1048576.0, origin,
           fit < want ? "" : ", capped at what max_seqs sequences of the longest length can use",
           c->prefix_sharing ? "on" : "off", s->opt.shuffle ? ", blocks handed out in random order" : "");
    *out = c;
    return ZT_OK;
}

static void paged_kv_destroy(void *state, zt_kv_cache *c)
{
    paged_state *s = state;
    if (!c || c->magic != CACHE_MAGIC) return;
    c->magic = 0;
    for (int32_t i = 0; i < c->max_seqs; i++) free(c->seqs[i].prompt);
#ifdef ZT_PLUGIN_CUDA
    if (c->on_gpu) zt_kv_device_destroy(s->host, &c->dev);
#endif
    s->host->free(s->host->ctx, c->k);
    s->host->free(s->host->ctx, c->v);
    block_pool_free(&c->pool);
    free(c->tables);
    free(c->seqs);
    free(c);
}

static zt_status check_sequences(const paged_state *s, const char *op, const zt_kv_cache *c, const int32_t *seq_ids,
                                 int32_t n_seqs)
{
    if (!c || c->magic != CACHE_MAGIC)
        return fail(s, ZT_ERR_INVALID_ARG, op, "the cache handle is not a live paged-attention KV cache");
    if (n_seqs < 1 || !seq_ids) return fail(s, ZT_ERR_INVALID_ARG, op, "no sequences given (n_seqs %d)", (int)n_seqs);
    for (int32_t i = 0; i < n_seqs; i++) {
        if (seq_ids[i] < 0 || seq_ids[i] >= c->max_seqs)
            return fail(s, ZT_ERR_INVALID_ARG, op, "sequence id %d (entry %d) is outside [0, %d), the max_seqs the "
                        "cache was created with", (int)seq_ids[i], (int)i, (int)c->max_seqs);
        for (int32_t j = 0; j < i; j++)
            if (seq_ids[j] == seq_ids[i])
                return fail(s, ZT_ERR_INVALID_ARG, op, "sequence id %d appears twice (entries %d and %d)",
                            (int)seq_ids[i], (int)j, (int)i);
    }
    return ZT_OK;
}

/* Whether writing the sequence's next token needs a private copy of the block it lands in: the
 * block is shared, or published as a prefix (its content must stay what its hash says). */
static int needs_copy(const zt_kv_cache *c, const paged_seq *q)
{
    int64_t bs = c->pool.block_size;
    if (q->length >= (int64_t)q->n_table * bs) return 0; /* the next token starts a new block */
    int32_t block = q->table[q->length / bs];
    return c->pool.refcount[block] > 1 || c->pool.hash[block] != 0;
}

/* The device's copy of the step's tables and lengths (kv_cuda.h) is old: the cache changed. */
static void unprepare(zt_kv_cache *c)
{
#ifdef ZT_PLUGIN_CUDA
    zt_kv_device_unprepare(&c->dev);
#else
    (void)c;
#endif
}

static zt_status paged_kv_reserve(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs, int32_t n_new)
{
    paged_state *s = state;
    zt_status st = check_sequences(s, "kv_reserve", c, seq_ids, n_seqs);
    if (st != ZT_OK) return st;
    if (n_new < 0) return fail(s, ZT_ERR_INVALID_ARG, "kv_reserve", "n_new is %d, less than 0", (int)n_new);
    int64_t bs = c->pool.block_size, needed = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const paged_seq *q = &c->seqs[seq_ids[i]];
        int64_t blocks = (q->length + n_new + bs - 1) / bs;
        if (blocks > c->max_blocks_per_seq)
            return fail(s, ZT_ERR_BUFFER_TOO_SMALL, "kv_reserve", "sequence %d holds %lld tokens and %d more exceed "
                        "the %lld tokens a sequence may have (the cache's max_seq_tokens)", (int)seq_ids[i],
                        (long long)q->length, (int)n_new, (long long)c->max_blocks_per_seq * bs);
        needed += (blocks > q->n_table ? blocks - q->n_table : 0) + (n_new > 0 && needs_copy(c, q));
    }
    if (needed > block_pool_available(&c->pool))
        return fail(s, ZT_ERR_BUFFER_TOO_SMALL, "kv_reserve", "%lld more blocks are needed and %d of the pool's %d "
                    "are free; finish or preempt a sequence, or raise paged.kv_budget", (long long)needed,
                    (int)block_pool_available(&c->pool), (int)c->pool.n_blocks);
    for (int32_t i = 0; i < n_seqs && n_new > 0; i++) {
        paged_seq *q = &c->seqs[seq_ids[i]];
        if (needs_copy(c, q)) { /* copy-on-write: the tokens before the write, in every layer */
            int32_t at = (int32_t)(q->length / bs), old = q->table[at], fresh = block_pool_take(&c->pool);
            for (int32_t l = 0; l < c->n_layers && c->k; l++) {
                size_t n = (size_t)block_floats(c) * sizeof(float);
                memcpy(layer_pool(c, c->k, l) + fresh * block_floats(c), layer_pool(c, c->k, l) + old * block_floats(c), n);
                memcpy(layer_pool(c, c->v, l) + fresh * block_floats(c), layer_pool(c, c->v, l) + old * block_floats(c), n);
            }
#ifdef ZT_PLUGIN_CUDA
            zt_status copied = c->on_gpu ? zt_kv_device_copy_block(&c->dev, s->host, fresh, old) : ZT_OK;
            if (copied != ZT_OK) return copied;
#endif
            block_pool_unref(&c->pool, old);
            q->table[at] = fresh;
            c->cow_copies++;
            unprepare(c);
        }
        while ((int64_t)q->n_table * bs < q->length + n_new) {
            q->table[q->n_table++] = block_pool_take(&c->pool);
            unprepare(c);
        }
    }
    return ZT_OK;
}

#ifdef ZT_PLUGIN_CUDA
/* The step's block tables and lengths, in call order, to the device. */
static zt_status stage(paged_state *s, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs)
{
    for (int32_t i = 0; i < n_seqs; i++) {
        const paged_seq *q = &c->seqs[seq_ids[i]];
        memcpy(zt_kv_device_table(&c->dev, i), q->table, (size_t)q->n_table * sizeof *q->table);
        *zt_kv_device_length(&c->dev, i) = (int32_t)q->length;
    }
    return zt_kv_device_upload(&c->dev, s->host, seq_ids, n_seqs);
}
#endif

/* kv_reserve, then (on a GPU) the step's tables and lengths to the device: kv_attend then only
 * enqueues kernels, so the host may capture the step. */
static zt_status paged_kv_prepare(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs, int32_t n_new)
{
    zt_status st = paged_kv_reserve(state, c, seq_ids, n_seqs, n_new);
#ifdef ZT_PLUGIN_CUDA
    if (st == ZT_OK && c->on_gpu) st = stage(state, c, seq_ids, n_seqs);
#endif
    return st;
}

static zt_status paged_kv_prefix(void *state, zt_kv_cache *c, int32_t seq_id, const int32_t *tokens, int32_t n,
                                 int32_t *n_cached)
{
    paged_state *s = state;
    zt_status st = check_sequences(s, "kv_prefix", c, &seq_id, 1);
    if (st != ZT_OK) return st;
    paged_seq *q = &c->seqs[seq_id];
    if (q->length || q->n_table || q->prompt)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_prefix", "sequence %d is not empty (%lld tokens): kv_prefix comes "
                    "before its first kv_attend; kv_reset it first", (int)seq_id, (long long)q->length);
    if (n < 1 || !tokens || !n_cached)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_prefix", "no prompt given (n %d)", (int)n);
    *n_cached = 0;
    if (!c->prefix_sharing) return ZT_OK;
    if (!(q->prompt = malloc((size_t)n * sizeof *tokens)))
        return fail(s, ZT_ERR_OUT_OF_MEMORY, "kv_prefix", "cannot keep a prompt of %d tokens", (int)n);
    memcpy(q->prompt, tokens, (size_t)n * sizeof *tokens);
    q->n_prompt = n;
    int32_t bs = c->pool.block_size;
    while ((q->n_published + 1) * bs <= n && q->n_published < c->max_blocks_per_seq) {
        const int32_t *block_tokens = tokens + (int64_t)q->n_published * bs;
        uint64_t h = block_pool_chain(q->chain, block_tokens, bs);
        int32_t block = block_pool_find(&c->pool, h, q->chain, block_tokens);
        if (block < 0) break;
        block_pool_ref(&c->pool, block);
        q->table[q->n_table++] = block;
        unprepare(c);
        q->n_published++;
        q->chain = h;
    }
    /* The last prompt token is computed again when the whole prompt was found: its logits are needed
     * (its write goes to a private copy of the shared block). */
    int64_t found = (int64_t)q->n_published * bs;
    q->length = found < n ? found : n - 1;
    c->prefix_hit_tokens += q->length;
    *n_cached = (int32_t)q->length;
    return ZT_OK;
}

#ifdef ZT_PLUGIN_CUDA
/* A fresh sequence's prompt (nothing cached): the flash kernels over its own k, v, as in training. */
static zt_status paged_prefill(void *state, const zt_attn_args *a)
{
    return paged_cuda_forward(state, a, NULL);
}
#endif

static zt_status paged_kv_attend(void *state, zt_kv_cache *c, int32_t layer, const int32_t *seq_ids, int32_t n_seqs,
                                 const zt_attn_args *a)
{
    paged_state *s = state;
    zt_status st = check_heads(s, "kv_attend", a);
    if (st != ZT_OK) return st;
    int64_t n_new = a->q.shape[1];
    if (a->q.ndim != 4 || n_new < 1 || n_new > INT32_MAX)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_attend", "q must be [n_seqs, n_new, heads, head_dim] with n_new >= 1");
    if ((st = check_sequences(s, "kv_attend", c, seq_ids, n_seqs)) != ZT_OK) return st;
    if (layer < 0 || layer >= c->n_layers)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_attend", "layer %d is outside [0, %d), the cache's n_layers", (int)layer,
                    (int)c->n_layers);
    if (a->n_kv_heads != c->n_kv_heads || a->head_dim != c->head_dim)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_attend", "the call has %d key/value heads of %d but the cache was "
                    "created for %d of %d", (int)a->n_kv_heads, (int)a->head_dim, (int)c->n_kv_heads, (int)c->head_dim);
    int64_t H = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim, bs = c->pool.block_size;
    if ((st = check_tensor(s, "kv_attend", "q", &a->q, n_seqs, n_new, H, D)) != ZT_OK ||
        (st = check_tensor(s, "kv_attend", "k", &a->k, n_seqs, n_new, Hkv, D)) != ZT_OK ||
        (st = check_tensor(s, "kv_attend", "v", &a->v, n_seqs, n_new, Hkv, D)) != ZT_OK ||
        (st = check_tensor(s, "kv_attend", "out", &a->out, n_seqs, n_new, H, D)) != ZT_OK)
        return st;
    /* A no-op when the host reserved the room (every layer after the first finds it there). */
    if ((st = paged_kv_reserve(s, c, seq_ids, n_seqs, (int32_t)n_new)) != ZT_OK) return st;

#ifdef ZT_PLUGIN_CUDA
    if (c->on_gpu) { /* the call's tables and lengths, once a step; the kernels write and read in place */
        if (!zt_kv_device_prepared(&c->dev, seq_ids, n_seqs) && (st = stage(s, c, seq_ids, n_seqs)) != ZT_OK)
            return st;
        return zt_kv_device_attend(&c->dev, s->host, "paged", layer, n_seqs, a, c->seqs[seq_ids[0]].length == 0,
                                   paged_prefill, s->cuda);
    }
#endif
    int32_t stride = c->max_blocks_per_seq;
    int32_t *tables = malloc((size_t)n_seqs * (size_t)stride * sizeof *tables);
    int64_t *lengths = malloc((size_t)n_seqs * sizeof *lengths);
    if (!tables || !lengths) {
        free(tables);
        free(lengths);
        return fail(s, ZT_ERR_OUT_OF_MEMORY, "kv_attend", "cannot allocate the block tables of %d sequences",
                    (int)n_seqs);
    }
    float *k_pool = layer_pool(c, c->k, layer), *v_pool = layer_pool(c, c->v, layer);
    size_t row_bytes = (size_t)c->row * sizeof(float);
    for (int32_t i = 0; i < n_seqs; i++) {
        const paged_seq *q = &c->seqs[seq_ids[i]];
        for (int64_t t = 0; t < n_new; t++) {
            int64_t pos = q->length + t, slot = (int64_t)q->table[pos / bs] * bs + pos % bs;
            memcpy(k_pool + slot * c->row, (const float *)a->k.data + (i * n_new + t) * c->row, row_bytes);
            memcpy(v_pool + slot * c->row, (const float *)a->v.data + (i * n_new + t) * c->row, row_bytes);
        }
        memcpy(tables + (int64_t)i * stride, q->table, (size_t)q->n_table * sizeof *tables);
        lengths[i] = q->length;
    }
    zt_kv_pages pages = {.k = k_pool, .v = v_pool, .block_size = bs, .row_stride = c->row, .block_tables = tables,
                         .table_stride = stride, .lengths = lengths};
    zt_attention_shape shape = {.heads = H, .kv_heads = Hkv, .head_dim = D, .scale = a->scale};
    zt_cpu_attention_decode(&s->cpu, &shape, &pages, n_seqs, n_new, a->q.data, a->out.data);
    free(tables);
    free(lengths);
    return ZT_OK;
}

/* Commits the tokens and publishes the prompt blocks they filled, for later prompts to share. */
static zt_status paged_kv_advance(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs, int32_t n_new)
{
    paged_state *s = state;
    zt_status st = check_sequences(s, "kv_advance", c, seq_ids, n_seqs);
    if (st != ZT_OK) return st;
    int64_t bs = c->pool.block_size;
    for (int32_t i = 0; i < n_seqs; i++)
        if (n_new < 0 || c->seqs[seq_ids[i]].length + n_new > (int64_t)c->seqs[seq_ids[i]].n_table * bs)
            return fail(s, ZT_ERR_INVALID_ARG, "kv_advance", "sequence %d: %d tokens to commit, but its blocks hold "
                        "room for %lld after its %lld (commit only what kv_attend wrote)", (int)seq_ids[i], (int)n_new,
                        (long long)(c->seqs[seq_ids[i]].n_table * bs - c->seqs[seq_ids[i]].length),
                        (long long)c->seqs[seq_ids[i]].length);
    unprepare(c);
    for (int32_t i = 0; i < n_seqs; i++) {
        paged_seq *q = &c->seqs[seq_ids[i]];
        q->length += n_new;
        int64_t prompt_done = q->length < q->n_prompt ? q->length : q->n_prompt;
        while (q->prompt && (int64_t)(q->n_published + 1) * bs <= prompt_done) {
            const int32_t *block_tokens = q->prompt + (int64_t)q->n_published * bs;
            uint64_t h = block_pool_chain(q->chain, block_tokens, (int32_t)bs);
            block_pool_publish(&c->pool, q->table[q->n_published], h, q->chain, block_tokens);
            q->chain = h;
            q->n_published++;
        }
    }
    return ZT_OK;
}

static zt_status paged_kv_reset(void *state, zt_kv_cache *c, int32_t seq_id)
{
    paged_state *s = state;
    zt_status st = check_sequences(s, "kv_reset", c, &seq_id, 1);
    if (st != ZT_OK) return st;
    paged_seq *q = &c->seqs[seq_id];
    for (int32_t b = q->n_table - 1; b >= 0; b--) block_pool_unref(&c->pool, q->table[b]);
    unprepare(c);
    free(q->prompt);
    int32_t *table = q->table;
    memset(q, 0, sizeof *q);
    q->table = table;
    return ZT_OK;
}

static zt_status paged_kv_stats(void *state, const zt_kv_cache *c, int32_t seq_id, zt_kv_stats *out)
{
    paged_state *s = state;
    if (!c || c->magic != CACHE_MAGIC || !out || out->struct_size < sizeof *out)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_stats", "the cache handle or the output struct is not valid");
    if (seq_id < -1 || seq_id >= c->max_seqs)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_stats", "sequence id %d is outside [-1, %d)", (int)seq_id,
                    (int)c->max_seqs);
    const block_pool *p = &c->pool;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->block_size = p->block_size;
    out->total_blocks = p->n_blocks;
    out->used_blocks = p->used;
    out->free_blocks = block_pool_available(p);
    out->cached_blocks = p->n_cached;
    out->peak_used_blocks = p->peak_used;
    for (int32_t b = 0; b < p->n_blocks; b++) out->refcount_sum += p->refcount[b];
    for (int32_t i = 0; i < c->max_seqs; i++)
        if (seq_id == -1 || seq_id == i) {
            out->tokens += c->seqs[i].length;
            out->slots += (int64_t)c->seqs[i].n_table * p->block_size;
        }
    out->prefix_hit_tokens = c->prefix_hit_tokens;
    out->cow_copies = c->cow_copies;
    int64_t elem = sizeof(float);
#ifdef ZT_PLUGIN_CUDA
    if (c->on_gpu) elem = 2;
#endif
    out->bytes = 2 * (int64_t)p->n_blocks * block_floats(c) * elem;
    return ZT_OK;
}

/* ---- plugin ---------------------------------------------------------------------------------- */

static const zt_option k_options[] = {
    {.key = "paged.block_size", .type = ZT_OPT_INT, .flags = ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX, .default_value = "16",
     .min = 1, .max = 4096,
     .help = "tokens per KV cache block: a sequence wastes on average half a block (16: about 3% of Alpaca's "
             "~240-token sequences)"},
    {.key = "paged.kv_budget", .type = ZT_OPT_FLOAT, .flags = ZT_OPT_HAS_MIN | ZT_OPT_NO_DEFAULT, .min = 0,
     .help = "GiB of memory for the KV cache's one pool of blocks (unset: paged.kv_fraction decides)"},
    {.key = "paged.kv_fraction", .type = ZT_OPT_FLOAT, .flags = ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX,
     .default_value = "0.5", .min = 0, .max = 1,
     .help = "without paged.kv_budget: the share of free memory (on the CPU: host memory) the pool may take; the "
             "pool never exceeds what max_seqs sequences of the longest length can use"},
    {.key = "paged.prefix_sharing", .type = ZT_OPT_BOOL, .default_value = "true",
     .help = "a prompt's full blocks that another prompt already filled with the same tokens are shared "
             "(reference-counted, copied before a write) instead of computed and stored again"},
    {.key = "paged.shuffle_blocks", .type = ZT_OPT_BOOL, .default_value = "false",
     .help = "debug: hand out free blocks in random order (results must not change)"},
    {.key = "paged.shuffle_seed", .type = ZT_OPT_INT, .flags = ZT_OPT_HAS_MIN, .default_value = "1", .min = 0,
     .help = "debug: the seed of paged.shuffle_blocks' order"},
};

static zt_status paged_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static zt_status read_options(const zt_host *host, paged_options *o)
{
    o->kv_budget_gib = -1;
    zt_status st = host->cfg_int(host->ctx, "paged.block_size", &o->block_size);
    if (st == ZT_OK) st = host->cfg_float(host->ctx, "paged.kv_fraction", &o->kv_fraction);
    if (st == ZT_OK) st = host->cfg_bool(host->ctx, "paged.prefix_sharing", &o->prefix_sharing);
    if (st == ZT_OK) st = host->cfg_bool(host->ctx, "paged.shuffle_blocks", &o->shuffle);
    if (st == ZT_OK) st = host->cfg_int(host->ctx, "paged.shuffle_seed", &o->shuffle_seed);
    if (st == ZT_OK) {
        st = host->cfg_float(host->ctx, "paged.kv_budget", &o->kv_budget_gib);
        if (st == ZT_ERR_NOT_FOUND) { /* not set: kv_fraction */
            o->kv_budget_gib = -1;
            st = ZT_OK;
        }
    }
    if (st != ZT_OK) host->error(host->ctx, st, "cannot read the paged.* options (a plugin bug)");
    return st;
}

static zt_status paged_init(const zt_host *host, void **state)
{
    *state = NULL;
    int on_gpu = host->device && host->device->device_type != ZT_DEVICE_CPU;
#ifndef ZT_PLUGIN_CUDA
    if (on_gpu) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED, "this build of paged attention runs on the CPU only (built without "
                    "CUDA): set device = cpu, or build zt with -DZT_CUDA=ON");
        return ZT_ERR_UNSUPPORTED;
    }
#endif
    paged_state *s = calloc(1, sizeof *s);
    if (!s) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "cannot allocate the paged attention state");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    zt_status st = read_options(host, &s->opt);
    if (st != ZT_OK) {
        free(s);
        return st;
    }
    s->host = host;
    s->cpu.parallel_for = host->parallel_for;
    s->cpu.pool = host->ctx;
#ifdef ZT_PLUGIN_CUDA
    if (on_gpu && (st = paged_cuda_init(host, &s->cuda)) != ZT_OK) {
        free(s);
        return st;
    }
#endif
    *state = s;
    return ZT_OK;
}

static void paged_fini(void *state)
{
#ifdef ZT_PLUGIN_CUDA
    if (state) paged_cuda_fini(((paged_state *)state)->cuda);
#endif
    free(state);
}

static const zt_attention_ops k_ops = {
    .struct_size = sizeof(zt_attention_ops),
    .forward = paged_forward,
    .backward = paged_backward,
    .kv_create = paged_kv_create,
    .kv_destroy = paged_kv_destroy,
    .kv_attend = paged_kv_attend,
    .kv_advance = paged_kv_advance,
    .kv_reset = paged_kv_reset,
    .release = paged_release,
    .kv_reserve = paged_kv_reserve,
    .kv_prefix = paged_kv_prefix,
    .kv_stats = paged_kv_stats,
    .kv_prepare = paged_kv_prepare,
};

static const zt_plugin k_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_ATTENTION,
    .name = "paged",
    .version = "1.0.0",
    .description = "exact causal attention on the CPU (fp32, packed documents, GQA) with a paged KV cache: one pool "
                   "of fixed-size blocks, per-sequence block tables, shared prompt prefixes (copy-on-write); in a "
                   "CUDA build also training on the GPU with the flash kernels",
#ifdef ZT_PLUGIN_CUDA
    .caps = ZT_CAP_CPU | ZT_CAP_CUDA | ZT_CAP_BF16 | ZT_CAP_FP16 | ZT_CAP_PACKED | ZT_CAP_GQA | ZT_CAP_KV_CACHE,
#else
    .caps = ZT_CAP_CPU | ZT_CAP_PACKED | ZT_CAP_GQA | ZT_CAP_KV_CACHE,
#endif
    .options = k_options,
    .n_options = sizeof k_options / sizeof k_options[0],
    .probe = paged_probe,
    .init = paged_init,
    .fini = paged_fini,
    .ops = &k_ops,
};

ZT_PLUGIN_ENTRY
{
    return &k_plugin;
}
