/* The CUDA path of the llama units: layers.c's forward and backward, step for step, on the bf16 kernels
 * of kernels/cuda (docs/gpu.md). Activations and matrix-product inputs are bf16, products accumulate
 * in fp32, norms keep fp32 statistics, parameter gradients accumulate in fp32. Everything is enqueued
 * on the host's compute stream; the only wait is for the loss, which the host reads after the last
 * unit's forward.
 *
 * Differences from the CPU path, both for memory:
 *   - the LM head never materializes [tokens, vocab] logits: zt_cuda_lm_head_loss walks the rows in
 *     chunks. Its backward therefore recomputes the logits of each chunk (one GEMM more than keeping
 *     dlogits, which for a 32k vocabulary would be 64 KiB per token);
 *   - saved activations are one device block per unit (plus a small host header), placed by the same
 *     carving as layers.c but in bytes, bf16 arrays and fp32 statistics mixed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda_plugin.h"
#include "llama.h"

#define GPU_SAVED_MAGIC 0x4741535Au /* "ZSAG" */

/* The plugin's device state (llama.h: llama_state.gpu). */
struct llama_gpu {
    zt_cuda_ctx *ctx;
    float *inv_freq; /* [head_dim / 2] on the device */
    double *loss;    /* the LM head's loss share, on the device */
    float *discard;  /* [hidden]: the dW of a frozen norm, which the RMSNorm kernel always accumulates */
};

/* What a training forward leaves in *zt_unit_call.saved: a host header and, unless it only marks a
 * recompute, the unit's activations in one device block. */
typedef struct gpu_record {
    uint32_t magic;
    int32_t unit;
    int32_t recompute;
    int64_t tokens;
    void *attention_saved;
    const zt_attention_binding *attention;
    void *acts; /* device */
} gpu_record;

/* Device arrays of one layer, as in layers.c (bf16 unless marked). */
typedef struct gpu_layer_acts {
    uint16_t *norm1, *q, *k, *v, *attn, *resid, *norm2, *gate, *up;
    float *rstd1, *rstd2; /* fp32 */
} gpu_layer_acts;

typedef struct gpu_head_acts {
    uint16_t *norm;
    float *rstd;
} gpu_head_acts;

typedef struct gpu_layer_grads {
    uint16_t *act, *norm, *resid, *attn, *q, *k, *v;
} gpu_layer_grads;

typedef struct gpu_run {
    llama_state *s;
    const zt_unit_call *c;
    cudaStream_t stream;
    int64_t tokens;
    char name[40];
} gpu_run;

/* ---- memory ---------------------------------------------------------------------------------- */

/* Consecutive arrays in one device block, each at a 256-byte boundary (the GEMMs' and the vector
 * kernels' alignment); base NULL only counts. */
typedef struct byte_carver {
    char *base;
    uint64_t used;
} byte_carver;

static void *carve(byte_carver *cv, int64_t n, uint64_t elem_bytes)
{
    void *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += ((uint64_t)n * elem_bytes + 255) / 256 * 256;
    return p;
}

static void carve_layer(const llama_config *c, int64_t N, byte_carver *cv, gpu_layer_acts *a)
{
    int64_t H = c->hidden, Q = c->heads * c->head_dim, KV = c->kv_heads * c->head_dim, F = c->intermediate;
    a->norm1 = carve(cv, N * H, 2);
    a->rstd1 = carve(cv, N, 4);
    a->q = carve(cv, N * Q, 2);
    a->k = carve(cv, N * KV, 2);
    a->v = carve(cv, N * KV, 2);
    a->attn = carve(cv, N * Q, 2);
    a->resid = carve(cv, N * H, 2);
    a->norm2 = carve(cv, N * H, 2);
    a->rstd2 = carve(cv, N, 4);
    a->gate = carve(cv, N * F, 2);
    a->up = carve(cv, N * F, 2);
}

static void carve_head(const llama_config *c, int64_t N, byte_carver *cv, gpu_head_acts *a)
{
    a->norm = carve(cv, N * c->hidden, 2);
    a->rstd = carve(cv, N, 4);
}

static void carve_layer_grads(const llama_config *c, int64_t N, byte_carver *cv, gpu_layer_grads *d)
{
    int64_t H = c->hidden, Q = c->heads * c->head_dim, KV = c->kv_heads * c->head_dim;
    d->act = carve(cv, N * c->intermediate, 2);
    d->norm = carve(cv, N * H, 2);
    d->resid = carve(cv, N * H, 2);
    d->attn = carve(cv, N * Q, 2);
    d->q = carve(cv, N * Q, 2);
    d->k = carve(cv, N * KV, 2);
    d->v = carve(cv, N * KV, 2);
}

static void *device_alloc(const gpu_run *r, int32_t pool, uint64_t bytes, const char *what)
{
    char tag[64];
    snprintf(tag, sizeof tag, "%s %s", r->name, what);
    const zt_host *h = r->s->host;
    return h->alloc(h->ctx, pool, ZT_MEM_DEVICE, bytes ? bytes : 1, 0, tag);
}

static gpu_record *record_new(const gpu_run *r, int32_t pool, int marker, const char *what)
{
    const zt_host *h = r->s->host;
    char tag[64];
    snprintf(tag, sizeof tag, "%s %s (header)", r->name, what);
    gpu_record *rec = h->alloc(h->ctx, pool, ZT_MEM_HOST, sizeof *rec, 0, tag);
    if (!rec) return NULL;
    memset(rec, 0, sizeof *rec);
    rec->magic = GPU_SAVED_MAGIC;
    rec->unit = r->c->unit;
    rec->recompute = marker;
    rec->tokens = r->tokens;
    rec->attention = r->c->attention;
    if (marker) return rec;
    byte_carver cv = {NULL, 0};
    gpu_layer_acts la;
    gpu_head_acts ha;
    if (r->c->unit == r->s->info.n_units - 1) carve_head(&r->s->cfg, r->tokens, &cv, &ha);
    else carve_layer(&r->s->cfg, r->tokens, &cv, &la);
    rec->acts = device_alloc(r, pool, cv.used, what);
    if (!rec->acts) {
        h->free(h->ctx, rec);
        return NULL;
    }
    return rec;
}

void llama_cuda_saved_free(llama_state *s, void *saved)
{
    gpu_record *rec = saved;
    if (!rec) return;
    if (rec->attention_saved) rec->attention->ops->release(rec->attention->state, rec->attention_saved);
    s->host->free(s->host->ctx, rec->acts);
    rec->magic = 0;
    s->host->free(s->host->ctx, rec);
}

/* ---- helpers --------------------------------------------------------------------------------- */

static const uint16_t *param(const gpu_run *r, int i)
{
    return r->c->params[i].data;
}

static float *grad(const gpu_run *r, int i)
{
    return r->c->grads ? r->c->grads[i].data : NULL;
}

static zt_status step_failed(const gpu_run *r, zt_status st, const char *step)
{
    char what[96];
    snprintf(what, sizeof what, "%s: %s", r->name, step);
    return zt_plugin_cuda_failed(r->s->host, st, what);
}

#define CUDA_STEP(call, step)                                           \
    do {                                                                \
        zt_status cuda_st_ = (call);                                    \
        if (cuda_st_ != ZT_OK) {                                        \
            st = step_failed(r, cuda_st_, step);                        \
            goto done;                                                  \
        }                                                               \
    } while (0)

/* The scratch the kernel context needs for this batch: RMSNorm and embedding backward, and the LM
 * head's logits chunk. The chunk is halved until it fits LM_HEAD_SCRATCH bytes, as the kernel
 * halves it, so the scratch is exactly what the kernel will use: fewer, larger GEMMs than a tighter
 * budget, and 2048 rows of a 32k vocabulary (384 MiB). */
#define LM_HEAD_SCRATCH (512ull << 20)

static uint64_t scratch_needed(const llama_config *c, int64_t N)
{
    int64_t chunk = N;
    while (chunk > 1 && zt_cuda_lm_head_loss_scratch_bytes(chunk, c->vocab) > LM_HEAD_SCRATCH) chunk = (chunk + 1) / 2;
    uint64_t need = zt_cuda_lm_head_loss_scratch_bytes(chunk, c->vocab);
    uint64_t norm = zt_cuda_rmsnorm_backward_scratch_bytes(N, c->hidden);
    uint64_t embed = zt_cuda_embedding_backward_scratch_bytes(N, c->vocab);
    if (norm > need) need = norm;
    if (embed > need) need = embed;
    return need;
}

static zt_status gpu_run_init(gpu_run *r, llama_state *s, const zt_unit_call *c)
{
    r->s = s;
    r->c = c;
    r->stream = zt_plugin_stream(s->host);
    r->tokens = (int64_t)c->batch->batch * c->batch->seq_len;
    llama_unit_name(s, c->unit, r->name, sizeof r->name);
    return zt_plugin_cuda_ctx(s->host, "llama", scratch_needed(&s->cfg, r->tokens), &s->gpu->ctx);
}

/* A [B, T, heads, D] bf16 device view for the attention plugin. */
static zt_tensor attention_view(const gpu_run *r, void *data, int64_t heads)
{
    const zt_batch *b = r->c->batch;
    int64_t D = r->s->cfg.head_dim;
    zt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = ZT_BF16;
    t.device_type = ZT_DEVICE_CUDA;
    t.device_index = r->s->host->device->device_index;
    t.ndim = 4;
    t.shape[0] = b->batch;
    t.shape[1] = b->seq_len;
    t.shape[2] = heads;
    t.shape[3] = D;
    t.stride[3] = 1;
    t.stride[2] = D;
    t.stride[1] = heads * D;
    t.stride[0] = b->seq_len * heads * D;
    return t;
}

static zt_attn_args attention_args(const gpu_run *r, const gpu_layer_acts *a)
{
    const llama_config *c = &r->s->cfg;
    zt_attn_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.n_heads = (int32_t)c->heads;
    args.n_kv_heads = (int32_t)c->kv_heads;
    args.head_dim = (int32_t)c->head_dim;
    args.scale = 1.0f / sqrtf((float)c->head_dim);
    args.causal = 1;
    args.batch = r->c->batch;
    args.q = attention_view(r, a->q, c->heads);
    args.k = attention_view(r, a->k, c->kv_heads);
    args.v = attention_view(r, a->v, c->kv_heads);
    args.out = attention_view(r, a->attn, c->heads);
    return args;
}

static zt_status attention_failed(const gpu_run *r, zt_status st, const char *op)
{
    r->s->host->error(r->s->host->ctx, st, "%s: the attention plugin's %s failed (its message is above)", r->name,
                      op);
    return st;
}

/* ---- embedding ------------------------------------------------------------------------------- */

zt_status llama_cuda_embedding_forward(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    zt_status st = gpu_run_init(r, s, c);
    if (st != ZT_OK) return st;
    /* Out-of-range ids are recorded on the device and reported when the LM head reads the loss. */
    CUDA_STEP(zt_cuda_embedding_forward(s->gpu->ctx, r->stream, r->tokens, s->cfg.vocab, s->cfg.hidden,
                                        c->batch->tokens, param(r, EMBED_TABLE), c->x_out.data),
              "embedding forward");
done:
    return st;
}

zt_status llama_cuda_embedding_backward(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    zt_status st = gpu_run_init(r, s, c);
    float *g = grad(r, EMBED_TABLE);
    if (st != ZT_OK || !g) return st; /* a frozen embedding has nothing to propagate */
    CUDA_STEP(zt_cuda_embedding_backward(s->gpu->ctx, r->stream, r->tokens, s->cfg.vocab, s->cfg.hidden,
                                         c->batch->tokens, c->dx_out.data, g),
              "embedding backward");
done:
    return st;
}

/* ---- transformer layer ----------------------------------------------------------------------- */

static zt_status layer_compute(const gpu_run *r, const uint16_t *x, const gpu_layer_acts *a, uint16_t *out,
                               void **attention_saved)
{
    llama_state *s = r->s;
    const zt_unit_call *c = r->c;
    const llama_config *cfg = &s->cfg;
    zt_cuda_ctx *ctx = s->gpu->ctx;
    cudaStream_t stream = r->stream;
    int64_t N = r->tokens, H = cfg->hidden, F = cfg->intermediate, D = cfg->head_dim;
    int64_t Q = cfg->heads * D, KV = cfg->kv_heads * D;
    float eps = (float)cfg->rms_norm_eps;
    const int32_t *positions = c->batch->positions;
    zt_status st = ZT_OK;
    uint16_t *act = NULL;

    CUDA_STEP(zt_cuda_rmsnorm_forward(ctx, stream, N, H, eps, x, param(r, LAYER_INPUT_NORM), a->norm1, a->rstd1),
              "input_layernorm forward");
    CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, Q, H, a->norm1, param(r, LAYER_Q), a->q), "q_proj forward");
    CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, KV, H, a->norm1, param(r, LAYER_K), a->k), "k_proj forward");
    CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, KV, H, a->norm1, param(r, LAYER_V), a->v), "v_proj forward");
    CUDA_STEP(zt_cuda_rope_forward(ctx, stream, N, cfg->heads, D, positions, s->gpu->inv_freq, a->q, a->q),
              "rope forward (q)");
    CUDA_STEP(zt_cuda_rope_forward(ctx, stream, N, cfg->kv_heads, D, positions, s->gpu->inv_freq, a->k, a->k),
              "rope forward (k)");

    const zt_attention_binding *att = c->attention;
    zt_attn_args args = attention_args(r, a);
    st = att->ops->forward(att->state, &args, attention_saved);
    if (st != ZT_OK) return attention_failed(r, st, "forward");

    CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, H, Q, a->attn, param(r, LAYER_O), a->resid), "o_proj forward");
    CUDA_STEP(zt_cuda_add_bf16(ctx, stream, N * H, x, a->resid), "residual add");
    CUDA_STEP(zt_cuda_rmsnorm_forward(ctx, stream, N, H, eps, a->resid, param(r, LAYER_POST_NORM), a->norm2, a->rstd2),
              "post_attention_layernorm forward");
    CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, F, H, a->norm2, param(r, LAYER_GATE), a->gate),
              "gate_proj forward");
    CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, F, H, a->norm2, param(r, LAYER_UP), a->up), "up_proj forward");
    if (!out) return ZT_OK;

    act = device_alloc(r, ZT_POOL_WORKSPACE, (uint64_t)(N * F) * 2, "SwiGLU output");
    if (!act) return ZT_ERR_OUT_OF_MEMORY;
    CUDA_STEP(zt_cuda_swiglu_forward(ctx, stream, N * F, a->gate, a->up, act), "SwiGLU forward");
    /* out is written last, after every read of x: the host may pass one buffer as both. */
    CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, H, F, act, param(r, LAYER_DOWN), out), "down_proj forward");
    CUDA_STEP(zt_cuda_add_bf16(ctx, stream, N * H, a->resid, out), "residual add");
done:
    s->host->free(s->host->ctx, act);
    return st;
}

static zt_status head_compute(const gpu_run *r, const uint16_t *x, const gpu_head_acts *a, float *loss_out,
                              void *logits_out, int32_t logits_dtype);

zt_status llama_cuda_layer_forward(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    zt_status st = gpu_run_init(r, s, c);
    if (st != ZT_OK) return st;
    int train = (c->flags & ZT_UNIT_TRAIN) != 0, recompute = (c->flags & ZT_UNIT_RECOMPUTE) != 0;
    int keep = train && !recompute;
    gpu_record *rec = record_new(r, keep ? ZT_POOL_ACTIVATIONS : ZT_POOL_WORKSPACE, 0,
                                 keep ? "activations" : "forward scratch");
    if (!rec) return ZT_ERR_OUT_OF_MEMORY;
    byte_carver cv = {rec->acts, 0};
    gpu_layer_acts a;
    carve_layer(&s->cfg, r->tokens, &cv, &a);
    st = layer_compute(r, c->x_in.data, &a, c->x_out.data, keep ? &rec->attention_saved : NULL);
    if (st != ZT_OK || !keep) {
        llama_cuda_saved_free(s, rec);
        rec = NULL;
    }
    if (st == ZT_OK && train && recompute) {
        rec = record_new(r, ZT_POOL_ACTIVATIONS, 1, "recompute marker");
        if (!rec) return ZT_ERR_OUT_OF_MEMORY;
    }
    if (st == ZT_OK && train) *c->saved = rec;
    return st;
}

static zt_status take_record(const gpu_run *r, gpu_record **out)
{
    gpu_record *rec = *r->c->saved;
    if (!rec || rec->magic != GPU_SAVED_MAGIC || rec->unit != r->c->unit || rec->tokens != r->tokens) {
        r->s->host->error(r->s->host->ctx, ZT_ERR_INVALID_ARG,
                          "%s backward: the saved-activations slot does not hold this unit's training forward "
                          "(%s); run forward with ZT_UNIT_TRAIN on the same batch before backward, and free "
                          "each slot once (a host or zero-plugin bug)",
                          r->name,
                          !rec ? "it is empty"
                          : rec->magic != GPU_SAVED_MAGIC ? "it holds something else"
                          : rec->unit != r->c->unit      ? "it belongs to another unit"
                                                         : "it was made for a batch of another size");
        return ZT_ERR_INVALID_ARG;
    }
    *out = rec;
    return ZT_OK;
}

/* Recomputes the activations of a unit whose record only marks a recompute (activation
 * checkpointing: the host kept the unit's input). */
static zt_status materialize(const gpu_run *r, gpu_record *rec, gpu_record **fresh)
{
    *fresh = NULL;
    if (!rec->recompute) return ZT_OK;
    gpu_record *again = record_new(r, ZT_POOL_ACTIVATIONS, 0, "recomputed activations");
    if (!again) return ZT_ERR_OUT_OF_MEMORY;
    byte_carver cv = {again->acts, 0};
    zt_status st;
    if (r->c->unit == r->s->info.n_units - 1) {
        gpu_head_acts a;
        carve_head(&r->s->cfg, r->tokens, &cv, &a);
        st = head_compute(r, r->c->x_in.data, &a, NULL, NULL, 0);
    } else {
        gpu_layer_acts a;
        carve_layer(&r->s->cfg, r->tokens, &cv, &a);
        st = layer_compute(r, r->c->x_in.data, &a, NULL, &again->attention_saved);
    }
    if (st != ZT_OK) {
        llama_cuda_saved_free(r->s, again);
        return st;
    }
    *fresh = again;
    return ZT_OK;
}

/* dx[M,K] += dy[M,N] w[N,K] (several projections read the same input), rounded to bf16 once. */
static zt_status linear_backward_input_add(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M, int64_t N,
                                           int64_t K, const uint16_t *dy, const uint16_t *w, uint16_t *dx)
{
    return zt_cuda_gemm(ctx, stream, 0, 0, M, K, N, dy, N, w, K, dx, ZT_BF16, K, 1);
}

zt_status llama_cuda_layer_backward(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    gpu_record *saved = NULL, *fresh = NULL;
    void *work = NULL;
    zt_status st = gpu_run_init(r, s, c);
    if (st == ZT_OK) st = take_record(r, &saved);
    if (st != ZT_OK) return st;
    const llama_config *cfg = &s->cfg;
    zt_cuda_ctx *ctx = s->gpu->ctx;
    cudaStream_t stream = r->stream;
    int64_t N = r->tokens, H = cfg->hidden, F = cfg->intermediate, D = cfg->head_dim;
    int64_t Q = cfg->heads * D, KV = cfg->kv_heads * D;
    st = materialize(r, saved, &fresh);
    if (st != ZT_OK) goto done;
    gpu_record *rec = fresh ? fresh : saved;
    byte_carver cv = {rec->acts, 0};
    gpu_layer_acts a;
    carve_layer(cfg, N, &cv, &a);
    byte_carver wv = {NULL, 0};
    gpu_layer_grads d;
    carve_layer_grads(cfg, N, &wv, &d);
    if (!(work = device_alloc(r, ZT_POOL_WORKSPACE, wv.used, "backward scratch"))) {
        st = ZT_ERR_OUT_OF_MEMORY;
        goto done;
    }
    wv = (byte_carver){work, 0};
    carve_layer_grads(cfg, N, &wv, &d);
    const uint16_t *dy = c->dx_out.data;
    float *g;
    float *discard = s->gpu->discard;

    /* MLP: out = h + down(act), act = silu(gate) * up */
    CUDA_STEP(zt_cuda_swiglu_forward(ctx, stream, N * F, a.gate, a.up, d.act), "SwiGLU recompute");
    if ((g = grad(r, LAYER_DOWN)))
        CUDA_STEP(zt_cuda_linear_backward_weight(ctx, stream, N, H, F, dy, d.act, g), "down_proj weight gradient");
    CUDA_STEP(zt_cuda_linear_backward_input(ctx, stream, N, H, F, dy, param(r, LAYER_DOWN), d.act),
              "down_proj backward");
    CUDA_STEP(zt_cuda_swiglu_backward(ctx, stream, N * F, a.gate, a.up, d.act, a.gate, a.up), "SwiGLU backward");
    if ((g = grad(r, LAYER_GATE)))
        CUDA_STEP(zt_cuda_linear_backward_weight(ctx, stream, N, F, H, a.gate, a.norm2, g), "gate_proj weight gradient");
    if ((g = grad(r, LAYER_UP)))
        CUDA_STEP(zt_cuda_linear_backward_weight(ctx, stream, N, F, H, a.up, a.norm2, g), "up_proj weight gradient");
    CUDA_STEP(zt_cuda_linear_backward_input(ctx, stream, N, F, H, a.gate, param(r, LAYER_GATE), d.norm),
              "gate_proj backward");
    CUDA_STEP(linear_backward_input_add(ctx, stream, N, F, H, a.up, param(r, LAYER_UP), d.norm), "up_proj backward");
    g = grad(r, LAYER_POST_NORM);
    CUDA_STEP(zt_cuda_rmsnorm_backward(ctx, stream, N, H, a.resid, param(r, LAYER_POST_NORM), a.rstd2, d.norm,
                                       d.resid, g ? g : discard),
              "post_attention_layernorm backward");
    CUDA_STEP(zt_cuda_add_bf16(ctx, stream, N * H, dy, d.resid), "residual gradient");

    /* attention: h = x + o_proj(attention(rope(q), rope(k), v)) */
    if ((g = grad(r, LAYER_O)))
        CUDA_STEP(zt_cuda_linear_backward_weight(ctx, stream, N, H, Q, d.resid, a.attn, g), "o_proj weight gradient");
    CUDA_STEP(zt_cuda_linear_backward_input(ctx, stream, N, H, Q, d.resid, param(r, LAYER_O), d.attn),
              "o_proj backward");
    zt_attn_args args = attention_args(r, &a);
    args.dout = attention_view(r, d.attn, cfg->heads);
    args.dq = attention_view(r, d.q, cfg->heads);
    args.dk = attention_view(r, d.k, cfg->kv_heads);
    args.dv = attention_view(r, d.v, cfg->kv_heads);
    void *attention_saved = rec->attention_saved;
    rec->attention_saved = NULL; /* the attention backward frees it */
    st = c->attention->ops->backward(c->attention->state, &args, attention_saved);
    if (st != ZT_OK) {
        st = attention_failed(r, st, "backward");
        goto done;
    }
    CUDA_STEP(zt_cuda_rope_backward(ctx, stream, N, cfg->heads, D, c->batch->positions, s->gpu->inv_freq, d.q, d.q),
              "rope backward (q)");
    CUDA_STEP(zt_cuda_rope_backward(ctx, stream, N, cfg->kv_heads, D, c->batch->positions, s->gpu->inv_freq, d.k,
                                    d.k),
              "rope backward (k)");
    if ((g = grad(r, LAYER_Q)))
        CUDA_STEP(zt_cuda_linear_backward_weight(ctx, stream, N, Q, H, d.q, a.norm1, g), "q_proj weight gradient");
    if ((g = grad(r, LAYER_K)))
        CUDA_STEP(zt_cuda_linear_backward_weight(ctx, stream, N, KV, H, d.k, a.norm1, g), "k_proj weight gradient");
    if ((g = grad(r, LAYER_V)))
        CUDA_STEP(zt_cuda_linear_backward_weight(ctx, stream, N, KV, H, d.v, a.norm1, g), "v_proj weight gradient");
    CUDA_STEP(zt_cuda_linear_backward_input(ctx, stream, N, Q, H, d.q, param(r, LAYER_Q), d.norm), "q_proj backward");
    CUDA_STEP(linear_backward_input_add(ctx, stream, N, KV, H, d.k, param(r, LAYER_K), d.norm), "k_proj backward");
    CUDA_STEP(linear_backward_input_add(ctx, stream, N, KV, H, d.v, param(r, LAYER_V), d.norm), "v_proj backward");
    /* dx_in is written last, after every read of dx_out: the host may pass one buffer as both. */
    g = grad(r, LAYER_INPUT_NORM);
    CUDA_STEP(zt_cuda_rmsnorm_backward(ctx, stream, N, H, c->x_in.data, param(r, LAYER_INPUT_NORM), a.rstd1, d.norm,
                                       c->dx_in.data, g ? g : discard),
              "input_layernorm backward");
    CUDA_STEP(zt_cuda_add_bf16(ctx, stream, N * H, d.resid, c->dx_in.data), "residual gradient");
done:
    s->host->free(s->host->ctx, work);
    llama_cuda_saved_free(s, fresh);
    llama_cuda_saved_free(s, saved);
    *c->saved = NULL;
    return st;
}

/* ---- final norm, LM head and loss ------------------------------------------------------------ */

/* The final norm into a; the logits into logits_out unless it is NULL (bf16 or fp32, as the host's
 * view); the loss share into *loss_out unless it is NULL. Reading the loss waits for the device,
 * which also reports token ids or targets outside the vocabulary seen since the last wait. */
static zt_status head_compute(const gpu_run *r, const uint16_t *x, const gpu_head_acts *a, float *loss_out,
                              void *logits_out, int32_t logits_dtype)
{
    llama_state *s = r->s;
    const zt_unit_call *c = r->c;
    const llama_config *cfg = &s->cfg;
    zt_cuda_ctx *ctx = s->gpu->ctx;
    int64_t N = r->tokens, H = cfg->hidden, V = cfg->vocab;
    zt_status st = ZT_OK;
    float *row_loss = NULL;
    CUDA_STEP(zt_cuda_rmsnorm_forward(ctx, r->stream, N, H, (float)cfg->rms_norm_eps, x, param(r, HEAD_NORM), a->norm,
                                      a->rstd),
              "final norm forward");
    if (logits_out)
        CUDA_STEP(zt_cuda_gemm(ctx, r->stream, 0, 1, N, V, H, a->norm, H, param(r, HEAD_LM), H, logits_out,
                               logits_dtype, V, 0),
                  "lm_head forward (logits)");
    if (!loss_out) return ZT_OK;
    if (!(row_loss = device_alloc(r, ZT_POOL_WORKSPACE, (uint64_t)N * sizeof(float), "per-token loss")))
        return ZT_ERR_OUT_OF_MEMORY;
    CUDA_STEP(zt_cuda_lm_head_loss(ctx, r->stream, N, H, V, a->norm, param(r, HEAD_LM), c->batch->targets,
                                   (double)c->batch->n_loss_tokens_global, 1.0f, row_loss, s->gpu->loss, NULL, NULL),
              "LM head loss");
    double loss = 0;
    cudaError_t e = cudaMemcpyAsync(&loss, s->gpu->loss, sizeof loss, cudaMemcpyDeviceToHost, r->stream);
    if (e != cudaSuccess) {
        s->host->error(s->host->ctx, ZT_ERR_DEVICE, "%s: reading the loss from the GPU failed: %s", r->name,
                       cudaGetErrorString(e));
        st = ZT_ERR_DEVICE;
        goto done;
    }
    CUDA_STEP(zt_cuda_check_indices(ctx, r->stream), "checking token ids and targets");
    *loss_out = (float)loss;
done:
    s->host->free(s->host->ctx, row_loss);
    return st;
}

zt_status llama_cuda_head_forward(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    zt_status st = gpu_run_init(r, s, c);
    if (st != ZT_OK) return st;
    int train = (c->flags & ZT_UNIT_TRAIN) != 0, recompute = (c->flags & ZT_UNIT_RECOMPUTE) != 0;
    int keep = train && !recompute;
    gpu_record *rec = record_new(r, keep ? ZT_POOL_ACTIVATIONS : ZT_POOL_WORKSPACE, 0,
                                 keep ? "activations" : "forward scratch");
    if (!rec) return ZT_ERR_OUT_OF_MEMORY;
    byte_carver cv = {rec->acts, 0};
    gpu_head_acts a;
    carve_head(&s->cfg, r->tokens, &cv, &a);
    st = head_compute(r, c->x_in.data, &a, c->loss, c->x_out.data, c->x_out.dtype);
    if (st != ZT_OK || !keep) {
        llama_cuda_saved_free(s, rec);
        rec = NULL;
    }
    if (st == ZT_OK && train && recompute) {
        rec = record_new(r, ZT_POOL_ACTIVATIONS, 1, "recompute marker");
        if (!rec) return ZT_ERR_OUT_OF_MEMORY;
    }
    if (st == ZT_OK && train) *c->saved = rec;
    return st;
}

zt_status llama_cuda_head_backward(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    gpu_record *saved = NULL, *fresh = NULL;
    void *work = NULL;
    zt_status st = gpu_run_init(r, s, c);
    if (st == ZT_OK) st = take_record(r, &saved);
    if (st != ZT_OK) return st;
    const llama_config *cfg = &s->cfg;
    zt_cuda_ctx *ctx = s->gpu->ctx;
    int64_t N = r->tokens, H = cfg->hidden, V = cfg->vocab;
    st = materialize(r, saved, &fresh);
    if (st != ZT_OK) goto done;
    byte_carver cv = {(fresh ? fresh : saved)->acts, 0};
    gpu_head_acts a;
    carve_head(cfg, N, &cv, &a);
    byte_carver wv = {NULL, 0};
    carve(&wv, N * H, 2);
    carve(&wv, N, 4);
    if (!(work = device_alloc(r, ZT_POOL_WORKSPACE, wv.used, "backward scratch"))) {
        st = ZT_ERR_OUT_OF_MEMORY;
        goto done;
    }
    wv = (byte_carver){work, 0};
    uint16_t *d_norm = carve(&wv, N * H, 2);
    float *row_loss = carve(&wv, N, 4);
    /* The logits again, chunk by chunk, now with d_norm = dlogits W and dW += dlogits^T norm. */
    CUDA_STEP(zt_cuda_lm_head_loss(ctx, r->stream, N, H, V, a.norm, param(r, HEAD_LM), c->batch->targets,
                                   (double)c->batch->n_loss_tokens_global, 1.0f, row_loss, s->gpu->loss, d_norm,
                                   grad(r, HEAD_LM)),
              "LM head backward");
    float *g = grad(r, HEAD_NORM);
    CUDA_STEP(zt_cuda_rmsnorm_backward(ctx, r->stream, N, H, c->x_in.data, param(r, HEAD_NORM), a.rstd, d_norm,
                                       c->dx_in.data, g ? g : s->gpu->discard),
              "final norm backward");
done:
    s->host->free(s->host->ctx, work);
    llama_cuda_saved_free(s, fresh);
    llama_cuda_saved_free(s, saved);
    *c->saved = NULL;
    return st;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

/* The shapes the bf16 kernels take: 16-byte rows everywhere (multiples of 8 elements). */
static zt_status check_shapes(const llama_state *s)
{
    const llama_config *c = &s->cfg;
    const struct { const char *key; int64_t value; } dims[] = {
        {"model.hidden_size", c->hidden},
        {"model.intermediate_size", c->intermediate},
        {"model.vocab_size", c->vocab},
        {"model.num_attention_heads x model.head_dim", c->heads * c->head_dim},
        {"model.num_key_value_heads x model.head_dim", c->kv_heads * c->head_dim},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].value % 8 == 0) continue;
        s->host->error(s->host->ctx, ZT_ERR_UNSUPPORTED,
                       "llama on CUDA: %s is %lld, but the bf16 kernels need a multiple of 8 (16-byte rows for "
                       "the tensor cores); pad it (a vocabulary can be padded: model.vocab_size) or train on the "
                       "CPU (device = cpu)",
                       dims[i].key, (long long)dims[i].value);
        return ZT_ERR_UNSUPPORTED;
    }
    if (c->head_dim % 2 != 0 || c->head_dim > 256) {
        s->host->error(s->host->ctx, ZT_ERR_UNSUPPORTED,
                       "llama on CUDA: model.head_dim is %lld, but the rotary kernel needs an even head size of at "
                       "most 256; train on the CPU (device = cpu)", (long long)c->head_dim);
        return ZT_ERR_UNSUPPORTED;
    }
    return ZT_OK;
}

zt_status llama_cuda_init(llama_state *s)
{
    const zt_host *h = s->host;
    zt_status st = check_shapes(s);
    if (st != ZT_OK) return st;
    cudaError_t e = cudaSetDevice(h->device->device_index);
    if (e != cudaSuccess) {
        h->error(h->ctx, ZT_ERR_UNSUPPORTED, "llama: CUDA device %d cannot be used: %s (%s); check nvidia-smi, or "
                 "train on the CPU (device = cpu)", (int)h->device->device_index, cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return ZT_ERR_UNSUPPORTED;
    }
    s->gpu = calloc(1, sizeof *s->gpu);
    if (!s->gpu) {
        h->error(h->ctx, ZT_ERR_OUT_OF_MEMORY, "cannot allocate the llama plugin's CUDA state");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    uint64_t half = (uint64_t)s->cfg.head_dim / 2;
    s->gpu->inv_freq = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_DEVICE, half * sizeof(float), 0, "llama rotary frequencies");
    s->gpu->loss = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_DEVICE, sizeof(double), 0, "llama loss");
    s->gpu->discard = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_DEVICE, (uint64_t)s->cfg.hidden * sizeof(float), 0,
                               "llama frozen-norm gradient");
    if (!s->gpu->inv_freq || !s->gpu->loss || !s->gpu->discard) return ZT_ERR_OUT_OF_MEMORY;
    e = cudaMemcpyAsync(s->gpu->inv_freq, s->inv_freq, half * sizeof(float), cudaMemcpyHostToDevice,
                        zt_plugin_stream(h));
    if (e == cudaSuccess) e = cudaStreamSynchronize(zt_plugin_stream(h)); /* s->inv_freq is pageable */
    if (e != cudaSuccess) {
        h->error(h->ctx, ZT_ERR_DEVICE, "llama: copying the rotary frequencies to the GPU failed: %s",
                 cudaGetErrorString(e));
        return ZT_ERR_DEVICE;
    }
    return ZT_OK;
}

void llama_cuda_fini(llama_state *s)
{
    if (!s->gpu) return;
    const zt_host *h = s->host;
    h->free(h->ctx, s->gpu->inv_freq);
    h->free(h->ctx, s->gpu->loss);
    h->free(h->ctx, s->gpu->discard);
    zt_cuda_ctx_destroy(s->gpu->ctx);
    free(s->gpu);
    s->gpu = NULL;
}
