/* The paged plugin's training on a GPU: packed causal attention through the flash kernels of
 * kernels/cuda (zt_cuda_flash_attention_forward_kernel / _backward_tuned), with the flash plugin's
 * default kernel choice and backward tuning, so a paged run's losses are a flash run's. The log-sum-
 * exp rows ([B, H, T] fp32, device memory) go from forward to backward as in the flash plugin.
 * Head sizes 64 and 128 only: the flash plugin's slow exact kernels for other sizes are its own. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../attention_args.h"
#include "../cuda_plugin.h"
#include "cuda/flash_kernel.h"
#include "train_cuda.h"

#define SAVED_MAGIC 0x44475043u /* "CPGD" */

struct paged_cuda {
    const zt_host *host;
    zt_cuda_ctx *ctx; /* made by the first call, sized for the backward's scratch */
    int32_t dtype;    /* the run's 16-bit compute type */
    zt_cuda_flash_kernel kernel, bwd_kernel;
    zt_cuda_flash_backward_tuning tuning;
};

typedef struct cuda_saved {
    uint32_t magic;
    int32_t heads;
    int64_t batch, seq;
    float *lse; /* [B, H, T] on the device */
} cuda_saved;

static zt_status fail(const paged_cuda *c, zt_status st, const char *op, const char *fmt, ...) ZT_PRINTF(4, 5);
static zt_status fail(const paged_cuda *c, zt_status st, const char *op, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->host->error(c->host->ctx, st, "paged attention %s (CUDA): %s", op, msg);
    return st;
}

static zt_status check_tensor(const paged_cuda *c, const char *op, const char *name, const zt_tensor *t, int64_t d0,
                              int64_t d1, int64_t d2, int64_t d3)
{
    const int64_t want[4] = {d0, d1, d2, d3};
    if (!t->data) return fail(c, ZT_ERR_INVALID_ARG, op, "%s has no data (NULL)", name);
    if (t->dtype != c->dtype || t->device_type != ZT_DEVICE_CUDA)
        return fail(c, ZT_ERR_UNSUPPORTED, op, "%s must be a %s tensor in CUDA device memory (dtype %d, device %d given)",
                    name, c->dtype == ZT_F16 ? "fp16" : "bf16", (int)t->dtype, (int)t->device_type);
    char why[512];
    if (!zt_attention_shape_ok(t, name, want, why, sizeof why)) return fail(c, ZT_ERR_INVALID_ARG, op, "%s", why);
    return ZT_OK;
}

static zt_status check_args(const paged_cuda *c, const char *op, const zt_attn_args *a, zt_cuda_attention_shape *shape)
{
    if (!a || a->struct_size < sizeof(zt_attn_args))
        return fail(c, ZT_ERR_INVALID_ARG, op, "the argument struct is NULL or older than ABI 1.0");
    const zt_batch *b = a->batch;
    if (!b || b->batch < 1 || b->seq_len < 1) return fail(c, ZT_ERR_INVALID_ARG, op, "the batch is missing or empty");
    if (a->n_heads < 1 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads != 0)
        return fail(c, ZT_ERR_INVALID_ARG, op, "n_heads %d, n_kv_heads %d: n_kv_heads must divide n_heads",
                    (int)a->n_heads, (int)a->n_kv_heads);
    if (a->head_dim != 64 && a->head_dim != 128)
        return fail(c, ZT_ERR_UNSUPPORTED, op,
                    "head_dim %d: on a GPU paged attention trains with the flash kernels, which take head_dim 64 "
                    "or 128; use --plugins flash (it has slow exact kernels for other head sizes) or device = cpu",
                    (int)a->head_dim);
    if (!a->causal)
        return fail(c, ZT_ERR_UNSUPPORTED, op, "non-causal attention was asked for (causal = 0); paged attention "
                    "implements the causal mask of decoder-only models only");
    int64_t B = b->batch, T = b->seq_len, D = a->head_dim;
    zt_status st = check_tensor(c, op, "q", &a->q, B, T, a->n_heads, D);
    if (st == ZT_OK) st = check_tensor(c, op, "k", &a->k, B, T, a->n_kv_heads, D);
    if (st == ZT_OK) st = check_tensor(c, op, "v", &a->v, B, T, a->n_kv_heads, D);
    if (st == ZT_OK) st = check_tensor(c, op, "out", &a->out, B, T, a->n_heads, D);
    if (st != ZT_OK) return st;
    *shape = (zt_cuda_attention_shape){B, T, a->n_heads, a->n_kv_heads, D, a->scale};
    return ZT_OK;
}

zt_status paged_cuda_forward(paged_cuda *c, const zt_attn_args *a, void **saved)
{
    const zt_host *h = c->host;
    zt_cuda_attention_shape shape;
    zt_status st = check_args(c, "forward", a, &shape);
    if (st != ZT_OK) return st;
    st = zt_plugin_cuda_ctx(h, "paged", zt_cuda_flash_attention_backward_scratch_bytes_tuned(&shape, &c->tuning),
                            &c->ctx);
    if (st != ZT_OK) return st;
    uint64_t lse_bytes = (uint64_t)(shape.batch * shape.heads * shape.seq) * sizeof(float);
    float *lse = h->alloc(h->ctx, saved ? ZT_POOL_ACTIVATIONS : ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, lse_bytes, 0,
                          "paged attention log-sum-exp");
    if (!lse) return ZT_ERR_OUT_OF_MEMORY;
    st = zt_cuda_flash_attention_forward_kernel(c->ctx, zt_plugin_stream(h), &shape, c->kernel, a->q.data, a->k.data,
                                                a->v.data, a->batch->doc_ids, a->out.data, lse);
    if (st != ZT_OK) st = zt_plugin_cuda_failed(h, st, "paged attention forward (flash kernels)");
    cuda_saved *keep = NULL;
    if (st == ZT_OK && saved) {
        keep = h->alloc(h->ctx, ZT_POOL_ACTIVATIONS, ZT_MEM_HOST, sizeof *keep, 0, "paged attention saved header");
        if (!keep) st = ZT_ERR_OUT_OF_MEMORY;
    }
    if (st != ZT_OK || !saved) {
        h->free(h->ctx, lse);
        return st;
    }
    *keep = (cuda_saved){SAVED_MAGIC, (int32_t)shape.heads, shape.batch, shape.seq, lse};
    *saved = keep;
    return ZT_OK;
}

void paged_cuda_release(paged_cuda *c, void *saved)
{
    cuda_saved *rec = saved;
    if (!rec || rec->magic != SAVED_MAGIC) return;
    rec->magic = 0;
    c->host->free(c->host->ctx, rec->lse);
    c->host->free(c->host->ctx, rec);
}

zt_status paged_cuda_backward(paged_cuda *c, const zt_attn_args *a, void *saved)
{
    cuda_saved *rec = saved;
    zt_cuda_attention_shape shape;
    zt_status st = check_args(c, "backward", a, &shape);
    if (st == ZT_OK && (!rec || rec->magic != SAVED_MAGIC || rec->batch != shape.batch || rec->seq != shape.seq ||
                        rec->heads != shape.heads))
        st = fail(c, ZT_ERR_INVALID_ARG, "backward", "the saved record is %s; pass what forward stored in *saved for "
                  "this same batch, once (a model plugin bug)", !rec ? "NULL" : rec->magic != SAVED_MAGIC
                  ? "not one of paged attention's (or was freed already)" : "from a forward of another shape");
    int64_t B = shape.batch, T = shape.seq, D = shape.head_dim;
    if (st == ZT_OK) st = check_tensor(c, "backward", "dout", &a->dout, B, T, a->n_heads, D);
    if (st == ZT_OK) st = check_tensor(c, "backward", "dq", &a->dq, B, T, a->n_heads, D);
    if (st == ZT_OK) st = check_tensor(c, "backward", "dk", &a->dk, B, T, a->n_kv_heads, D);
    if (st == ZT_OK) st = check_tensor(c, "backward", "dv", &a->dv, B, T, a->n_kv_heads, D);
    if (st == ZT_OK) {
        st = zt_cuda_flash_attention_backward_tuned(c->ctx, zt_plugin_stream(c->host), &shape, c->bwd_kernel,
                                                    &c->tuning, a->q.data, a->k.data, a->v.data, a->batch->doc_ids,
                                                    a->out.data, rec->lse, a->dout.data, a->dq.data, a->dk.data,
                                                    a->dv.data);
        if (st == ZT_ERR_UNSUPPORTED)
            st = fail(c, st, "backward", "%s; this GPU cannot run the flash backward at head_dim %lld: use --plugins "
                      "flash (it falls back to its exact kernels)", zt_cuda_last_error(), (long long)D);
        else if (st != ZT_OK)
            st = zt_plugin_cuda_failed(c->host, st, "paged attention backward (flash kernels)");
    }
    paged_cuda_release(c, rec); /* consumed, also on failure */
    return st;
}

zt_status paged_cuda_init(const zt_host *host, paged_cuda **out)
{
    *out = NULL;
    if (host->device->cc_major < 8) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED, "paged attention on a GPU runs the flash kernels, which need "
                    "compute capability 8.0 or newer (bf16 tensor cores); this GPU has %d.%d: use device = cpu",
                    (int)host->device->cc_major, (int)host->device->cc_minor);
        return ZT_ERR_UNSUPPORTED;
    }
    zt_cuda_flash_kernel kernel, bwd_kernel;
    if (zt_cuda_flash_kernel_from_env(&kernel) != ZT_OK || zt_cuda_flash_backward_kernel_from_env(&bwd_kernel) != ZT_OK) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG, "paged attention: %s", zt_cuda_last_error());
        return ZT_ERR_INVALID_ARG;
    }
    paged_cuda *c = host->alloc(host->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, sizeof *c, 0, "paged attention CUDA state");
    if (!c) return ZT_ERR_OUT_OF_MEMORY;
    memset(c, 0, sizeof *c);
    c->host = host;
    c->dtype = zt_plugin_compute_dtype16(host);
    c->kernel = kernel;
    c->bwd_kernel = bwd_kernel;
    /* the flash plugin's defaults (flash.backward_split 0, _dq bulk, _ring true) */
    c->tuning = (zt_cuda_flash_backward_tuning){.split = 0, .dq_bulk = 1, .ring = 1};
    *out = c;
    return ZT_OK;
}

void paged_cuda_fini(paged_cuda *c)
{
    if (!c) return;
    zt_cuda_ctx_destroy(c->ctx);
    c->host->free(c->host->ctx, c);
}
