/* The naive attention plugin: exact attention, the reference the faster plugins are checked
 * against. On the CPU, training goes through the kernels' fp32 attention (causal, packed-document
 * mask, grouped KV heads read in place); generation attends against a KV cache of contiguous
 * per-sequence buffers. docs/model-llama.md describes both.
 *
 * Built with CUDA (ZT_PLUGIN_CUDA), a run whose device is cuda trains through the unfused CUDA
 * algorithm of kernels/cuda/naive_attention.cu: bf16 tensors in and out, fp32 scores [H, T, T] per
 * batch element in a workspace from the host's pools, the backward recomputing P from the saved
 * log-sum-exp. Generation keeps its contiguous cache in device memory (one block of the whole context
 * per sequence, ../kv_cuda.h) and attends with the decode kernels. docs/gpu.md.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attention_args.h"
#include "cpu/kernels.h"
#include "zt/zt_plugin.h"
#ifdef ZT_PLUGIN_CUDA
#include "../cuda_plugin.h"
#endif
#define ZT_KV_CONTIGUOUS_CPU 1 /* naive also keeps its cache on the CPU */
#include "../kv_contiguous.h"

typedef struct naive_state {
    const zt_host *host;
    zt_cpu_ctx cpu;
    int32_t on_cuda; /* the run computes on a GPU: bf16 device tensors, the CUDA path */
#ifdef ZT_PLUGIN_CUDA
    zt_cuda_naive_attention *gpu; /* cuBLAS handle, created by the first CUDA call */
#endif
} naive_state;

#define SAVED_MAGIC 0x5653414Eu /* "NASV" */

/* What forward keeps for backward: the log-sum-exp of every query row, [B, H, T]: in lse[] on the
 * CPU, in device memory (device_lse) on CUDA runs. */
typedef struct naive_saved {
    uint32_t magic;
    int32_t heads;
    int64_t batch, seq;
    float *device_lse;
    float lse[];
} naive_saved;

/* ---- argument checks --------------------------------------------------------------------------- */

static zt_status fail(const naive_state *s, zt_status st, const char *op, const char *fmt, ...) ZT_PRINTF(4, 5);
static zt_status fail(const naive_state *s, zt_status st, const char *op, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->host->error(s->host->ctx, st, "naive attention %s: %s", op, msg);
    return st;
}

/* A contiguous fp32 CPU tensor [d0, d1, d2, d3]; on CUDA runs a bf16 device tensor. */
static zt_status check_tensor(const naive_state *s, const char *op, const char *name, const zt_tensor *t,
                              int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    const int64_t want[4] = {d0, d1, d2, d3};
    if (!t->data) return fail(s, ZT_ERR_INVALID_ARG, op, "%s has no data (NULL)", name);
    if (s->on_cuda) {
        if (t->dtype != ZT_BF16 && t->dtype != ZT_F16)
            return fail(s, ZT_ERR_UNSUPPORTED, op,
                        "%s has dtype %d; on a GPU naive attention computes on bf16 tensors (ZT_BF16), or on "
                        "fp16 ones (ZT_F16) with fp16.enabled", name, (int)t->dtype);
        if (t->device_type != ZT_DEVICE_CUDA)
            return fail(s, ZT_ERR_UNSUPPORTED, op,
                        "%s is in host memory, but this run computes on a GPU: pass CUDA device memory", name);
    } else if (t->dtype != ZT_F32)
        return fail(s, ZT_ERR_UNSUPPORTED, op,
                    "%s has dtype %d; naive attention computes in fp32 only (ZT_F32, the CPU path); use a CUDA "
                    "attention plugin for bf16/fp16", name, (int)t->dtype);
    else if (t->device_type != ZT_DEVICE_CPU)
        return fail(s, ZT_ERR_UNSUPPORTED, op,
                    "%s is in device memory, but this run computes on the CPU: pass host memory", name);
    char why[512];
    if (!zt_attention_shape_ok(t, name, want, why, sizeof why)) return fail(s, ZT_ERR_INVALID_ARG, op, "%s", why);
    return ZT_OK;
}

/* The head counts, scale and causality every op needs. */
static zt_status check_heads(const naive_state *s, const char *op, const zt_attn_args *a)
{
    if (!a || a->struct_size < sizeof(zt_attn_args))
        return fail(s, ZT_ERR_INVALID_ARG, op, "the argument struct is NULL or older than ABI 1.0");
    if (a->n_heads < 1 || a->n_kv_heads < 1 || a->head_dim < 1 || a->n_heads % a->n_kv_heads != 0)
        return fail(s, ZT_ERR_INVALID_ARG, op,
                    "n_heads %d, n_kv_heads %d, head_dim %d: all must be positive and n_kv_heads must divide "
                    "n_heads", (int)a->n_heads, (int)a->n_kv_heads, (int)a->head_dim);
    if (!a->causal)
        return fail(s, ZT_ERR_UNSUPPORTED, op,
                    "non-causal attention was asked for (causal = 0); naive attention implements the causal "
                    "mask of decoder-only models only");
    if (!(a->scale > 0.0f) || !isfinite(a->scale))
        return fail(s, ZT_ERR_INVALID_ARG, op, "the softmax scale %g is not a positive number", (double)a->scale);
    return ZT_OK;
}

/* Training and prefill: q, k, v and out of the batch's shape. */
static zt_status check_training_args(const naive_state *s, const char *op, const zt_attn_args *a)
{
    zt_status st = check_heads(s, op, a);
    if (st != ZT_OK) return st;
    const zt_batch *b = a->batch;
    if (!b || b->batch < 1 || b->seq_len < 1)
        return fail(s, ZT_ERR_INVALID_ARG, op, "the batch is missing or empty");
    int64_t B = b->batch, T = b->seq_len, H = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim;
    if ((st = check_tensor(s, op, "q", &a->q, B, T, H, D)) != ZT_OK) return st;
    if ((st = check_tensor(s, op, "k", &a->k, B, T, Hkv, D)) != ZT_OK) return st;
    if ((st = check_tensor(s, op, "v", &a->v, B, T, Hkv, D)) != ZT_OK) return st;
    return check_tensor(s, op, "out", &a->out, B, T, H, D);
}

static zt_attention_shape kernel_shape(const zt_attn_args *a)
{
    zt_attention_shape shape = {
        .batch = a->batch->batch, .seq = a->batch->seq_len, .heads = a->n_heads,
        .kv_heads = a->n_kv_heads, .head_dim = a->head_dim, .scale = a->scale,
    };
    return shape;
}

/* ---- training on CUDA ---------------------------------------------------------------------------- */

#ifdef ZT_PLUGIN_CUDA
static zt_cuda_attention_shape cuda_shape(const zt_attn_args *a)
{
    zt_cuda_attention_shape shape = {a->batch->batch, a->batch->seq_len, a->n_heads, a->n_kv_heads, a->head_dim,
                                     a->scale};
    return shape;
}

/* The handle, created on first use, set to the call's 16-bit type (q's: bf16, or fp16 with
 * fp16.enabled), which every other tensor of the call must share. */
static zt_status cuda_handle(naive_state *s, const zt_attn_args *a, int backward)
{
    const zt_tensor *views[] = {&a->k, &a->v, &a->out, &a->dout, &a->dq, &a->dk, &a->dv};
    const char *names[] = {"k", "v", "out", "dout", "dq", "dk", "dv"};
    for (int i = 0; i < (backward ? 7 : 3); i++)
        if (views[i]->dtype != a->q.dtype)
            return fail(s, ZT_ERR_INVALID_ARG, backward ? "backward" : "forward",
                        "%s has dtype %d but q has %d: every tensor of a call has the run's one 16-bit type",
                        names[i], (int)views[i]->dtype, (int)a->q.dtype);
    zt_status st = ZT_OK;
    if (!s->gpu) {
        st = zt_cuda_naive_attention_create(s->host->device->device_index, &s->gpu);
        if (st != ZT_OK) return zt_plugin_cuda_failed(s->host, st, "naive attention: creating its cuBLAS handle");
    }
    st = zt_cuda_naive_attention_set_dtype(s->gpu, a->q.dtype);
    return st == ZT_OK ? ZT_OK : zt_plugin_cuda_failed(s->host, st, "naive attention");
}

/* The scores workspace is per call (pool workspace): [H, T, T] fp32 for one batch element at a
 * time plus fp32 copies of q, k, v and out. What outlives the call is the lse (pool activations). */
static zt_status cuda_forward(naive_state *s, const zt_attn_args *a, void **saved)
{
    const zt_host *h = s->host;
    zt_cuda_attention_shape shape = cuda_shape(a);
    zt_status st = cuda_handle(s, a, 0);
    if (st != ZT_OK) return st;
    uint64_t ws_bytes = zt_cuda_naive_attention_forward_workspace_bytes(&shape);
    uint64_t lse_bytes = (uint64_t)(shape.batch * shape.heads * shape.seq) * sizeof(float);
    void *ws = h->alloc(h->ctx, ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, ws_bytes, 0,
                        "naive attention fp32 scores [heads, T, T] and fp32 inputs");
    if (!ws) return ZT_ERR_OUT_OF_MEMORY;
    float *lse = h->alloc(h->ctx, saved ? ZT_POOL_ACTIVATIONS : ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, lse_bytes, 0,
                          "naive attention log-sum-exp rows");
    naive_saved *rec = lse && saved ? h->alloc(h->ctx, ZT_POOL_ACTIVATIONS, ZT_MEM_HOST, sizeof *rec, 0,
                                               "naive attention saved header")
                                    : NULL;
    if (!lse || (saved && !rec)) st = ZT_ERR_OUT_OF_MEMORY; /* host->alloc described it */
    if (st == ZT_OK) {
        st = zt_cuda_naive_attention_forward(s->gpu, zt_plugin_stream(h), &shape, a->q.data, a->k.data, a->v.data,
                                             a->batch->doc_ids, a->out.data, lse, ws, ws_bytes);
        if (st != ZT_OK) zt_plugin_cuda_failed(h, st, "naive attention forward");
    }
    h->free(h->ctx, ws); /* stream-ordered: the kernels enqueued above still see it */
    if (st != ZT_OK || !saved) {
        h->free(h->ctx, lse);
        h->free(h->ctx, rec);
        return st;
    }
    *rec = (naive_saved){.magic = SAVED_MAGIC, .heads = a->n_heads, .batch = shape.batch, .seq = shape.seq,
                         .device_lse = lse};
    *saved = rec;
    return ZT_OK;
}

static zt_status cuda_backward(naive_state *s, const zt_attn_args *a, const naive_saved *rec)
{
    const zt_host *h = s->host;
    zt_cuda_attention_shape shape = cuda_shape(a);
    zt_status st = cuda_handle(s, a, 1);
    if (st != ZT_OK) return st;
    uint64_t ws_bytes = zt_cuda_naive_attention_backward_workspace_bytes(&shape);
    void *ws = h->alloc(h->ctx, ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, ws_bytes, 0,
                        "naive attention backward: fp32 P and dP [heads, T, T], fp32 inputs and gradients");
    if (!ws) return ZT_ERR_OUT_OF_MEMORY;
    st = zt_cuda_naive_attention_backward(s->gpu, zt_plugin_stream(h), &shape, a->q.data, a->k.data, a->v.data,
                                          a->batch->doc_ids, a->out.data, rec->device_lse, a->dout.data, a->dq.data,
                                          a->dk.data, a->dv.data, ws, ws_bytes);
    if (st != ZT_OK) zt_plugin_cuda_failed(h, st, "naive attention backward");
    h->free(h->ctx, ws);
    return st;
}
#endif

/* Frees a saved record and, on CUDA runs, its device lse. */
static void free_saved(naive_state *s, naive_saved *rec)
{
    rec->magic = 0;
    s->host->free(s->host->ctx, rec->device_lse);
    s->host->free(s->host->ctx, rec);
}

/* ---- training ---------------------------------------------------------------------------------- */

static zt_status naive_forward(void *state, const zt_attn_args *a, void **saved)
{
    naive_state *s = state;
    zt_status st = check_training_args(s, "forward", a);
    if (st != ZT_OK) return st;
#ifdef ZT_PLUGIN_CUDA
    if (s->on_cuda) return cuda_forward(s, a, saved);
#endif
    zt_attention_shape shape = kernel_shape(a);
    uint64_t rows = (uint64_t)(shape.batch * shape.heads * shape.seq);
    /* Without a backward the log-sum-exp is scratch; with one it is the saved record. */
    naive_saved *rec = s->host->alloc(s->host->ctx, saved ? ZT_POOL_ACTIVATIONS : ZT_POOL_WORKSPACE, ZT_MEM_HOST,
                                      sizeof(naive_saved) + rows * sizeof(float), 0,
                                      "attention log-sum-exp rows");
    if (!rec) return ZT_ERR_OUT_OF_MEMORY;
    rec->magic = SAVED_MAGIC;
    rec->device_lse = NULL;
    rec->heads = a->n_heads;
    rec->batch = shape.batch;
    rec->seq = shape.seq;
    zt_cpu_attention_forward(&s->cpu, &shape, a->q.data, a->k.data, a->v.data, a->batch->doc_ids, a->out.data,
                             rec->lse);
    if (saved) *saved = rec;
    else s->host->free(s->host->ctx, rec);
    return ZT_OK;
}

/* Frees `saved` in every case, as the ABI's "backward frees saved" asks: a failed backward leaves
 * nothing for the caller to clean up. */
static zt_status naive_backward(void *state, const zt_attn_args *a, void *saved)
{
    naive_state *s = state;
    naive_saved *rec = saved;
    zt_status st = check_training_args(s, "backward", a);
    if (st == ZT_OK) {
        int64_t B = a->batch->batch, T = a->batch->seq_len, H = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim;
        if (!rec || rec->magic != SAVED_MAGIC || rec->batch != B || rec->seq != T || rec->heads != H)
            st = fail(s, ZT_ERR_INVALID_ARG, "backward",
                      "the saved record is %s; pass what forward stored in *saved for this same batch, once",
                      !rec ? "NULL (forward ran with saved == NULL, i.e. without a backward)"
                      : rec->magic != SAVED_MAGIC ? "not one of naive attention's (or was freed already)"
                                                  : "from a forward of another shape");
        if (st == ZT_OK && (st = check_tensor(s, "backward", "dout", &a->dout, B, T, H, D)) == ZT_OK &&
            (st = check_tensor(s, "backward", "dq", &a->dq, B, T, H, D)) == ZT_OK &&
            (st = check_tensor(s, "backward", "dk", &a->dk, B, T, Hkv, D)) == ZT_OK)
            st = check_tensor(s, "backward", "dv", &a->dv, B, T, Hkv, D);
    }
#ifdef ZT_PLUGIN_CUDA
    if (st == ZT_OK && s->on_cuda) st = cuda_backward(s, a, rec);
    else
#endif
    if (st == ZT_OK) {
        zt_attention_shape shape = kernel_shape(a);
        zt_cpu_attention_backward(&s->cpu, &shape, a->q.data, a->k.data, a->v.data, a->batch->doc_ids,
                                  a->out.data, rec->lse, a->dout.data, a->dq.data, a->dk.data, a->dv.data);
    }
    if (rec && rec->magic == SAVED_MAGIC) free_saved(s, rec);
    return st;
}

/* What forward saved, when no backward will follow. */
static void naive_release(void *state, void *saved)
{
    naive_state *s = state;
    naive_saved *rec = saved;
    if (!rec || rec->magic != SAVED_MAGIC) return;
    free_saved(s, rec);
}

/* ---- KV cache (../kv_contiguous.h: contiguous per-sequence slots, on the CPU or the GPU) ------------ */

static kv_contiguous_owner owner_of(const naive_state *s)
{
    return (kv_contiguous_owner){s->host, "naive attention"};
}

static zt_status naive_kv_create(void *state, const zt_kv_cache_desc *d, zt_kv_cache **out)
{
    naive_state *s = state;
    kv_contiguous_owner o = owner_of(s);
    return kvc_create(&o, s->on_cuda, d, out);
}

static void naive_kv_destroy(void *state, zt_kv_cache *c)
{
    kv_contiguous_owner o = owner_of(state);
    kvc_destroy(&o, c);
}

static zt_status naive_kv_attend(void *state, zt_kv_cache *c, int32_t layer, const int32_t *seq_ids,
                                 int32_t n_seqs, const zt_attn_args *a)
{
    naive_state *s = state;
    zt_status st = check_heads(s, "kv_attend", a);
    if (st != ZT_OK) return st;
    int64_t n_new = a->q.shape[1];
    if (a->q.ndim != 4 || n_new < 1)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_attend", "q must be [n_seqs, n_new, heads, head_dim] with n_new >= 1");
    kv_contiguous_owner o = owner_of(s);
    if ((st = kvc_check_attend(&o, c, layer, seq_ids, n_seqs, a)) != ZT_OK) return st;
    int64_t H = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim;
    if ((st = check_tensor(s, "kv_attend", "q", &a->q, n_seqs, n_new, H, D)) != ZT_OK ||
        (st = check_tensor(s, "kv_attend", "k", &a->k, n_seqs, n_new, Hkv, D)) != ZT_OK ||
        (st = check_tensor(s, "kv_attend", "v", &a->v, n_seqs, n_new, Hkv, D)) != ZT_OK ||
        (st = check_tensor(s, "kv_attend", "out", &a->out, n_seqs, n_new, H, D)) != ZT_OK)
        return st;
    return kvc_attend(&o, &s->cpu, c, layer, seq_ids, n_seqs, a, NULL, NULL); /* the reference: decode kernel only */
}

static zt_status naive_kv_advance(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs,
                                  int32_t n_new)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_advance(&o, c, seq_ids, n_seqs, n_new);
}

static zt_status naive_kv_reset(void *state, zt_kv_cache *c, int32_t seq_id)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_reset(&o, c, seq_id);
}

static zt_status naive_kv_reserve(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs,
                                  int32_t n_new)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_reserve(&o, c, seq_ids, n_seqs, n_new);
}

static zt_status naive_kv_prepare(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs, int32_t n_new)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_prepare(&o, c, seq_ids, n_seqs, n_new);
}

static zt_status naive_kv_stats(void *state, const zt_kv_cache *c, int32_t seq_id, zt_kv_stats *out)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_stats(&o, c, seq_id, out);
}

/* ---- plugin ------------------------------------------------------------------------------------ */

static zt_status naive_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static zt_status naive_init(const zt_host *host, void **state)
{
    *state = NULL;
    int on_cuda = host->device && host->device->device_type == ZT_DEVICE_CUDA;
#ifndef ZT_PLUGIN_CUDA
    if (host->device && host->device->device_type != ZT_DEVICE_CPU) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "this naive attention was built without CUDA and runs on the CPU only (fp32); rebuild zt with "
                    "the CUDA toolkit, or use the flash plugin, on a GPU");
        return ZT_ERR_UNSUPPORTED;
    }
#endif
    naive_state *s = calloc(1, sizeof *s);
    if (!s) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "cannot allocate the naive attention state");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    s->host = host;
    s->on_cuda = on_cuda;
    s->cpu.parallel_for = host->parallel_for;
    s->cpu.pool = host->ctx;
    *state = s;
    return ZT_OK;
}

static void naive_fini(void *state)
{
#ifdef ZT_PLUGIN_CUDA
    naive_state *s = state;
    if (s) zt_cuda_naive_attention_destroy(s->gpu);
#endif
    free(state);
}

static const zt_attention_ops k_ops = {
    .struct_size = sizeof(zt_attention_ops),
    .forward = naive_forward,
    .backward = naive_backward,
    .kv_create = naive_kv_create,
    .kv_destroy = naive_kv_destroy,
    .kv_attend = naive_kv_attend,
    .kv_advance = naive_kv_advance,
    .kv_reset = naive_kv_reset,
    .release = naive_release,
    .kv_reserve = naive_kv_reserve,
    .kv_stats = naive_kv_stats,
    .kv_prepare = naive_kv_prepare,
};

static const zt_plugin k_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_ATTENTION,
    .name = "naive",
    .version = "1.0.0",
    .description = "exact causal attention, the reference: fp32 on the CPU (packed documents, GQA, KV cache), "
                   "unfused bf16-in fp32-scores on CUDA where built with it (generation: a contiguous device cache "
                   "and the decode kernels)",
    .caps = ZT_CAP_CPU | ZT_CAP_PACKED | ZT_CAP_GQA | ZT_CAP_KV_CACHE
#ifdef ZT_PLUGIN_CUDA
            | ZT_CAP_CUDA | ZT_CAP_BF16 | ZT_CAP_FP16
#endif
    ,
    .probe = naive_probe,
    .init = naive_init,
    .fini = naive_fini,
    .ops = &k_ops,
};

ZT_PLUGIN_ENTRY
{
    return &k_plugin;
}
