/* Forward and backward of the three kinds of unit, in fp32 on the CPU, as transformers'
 * LlamaForCausalLM computes them (docs/model-llama.md has the equations):
 *
 *   embedding:  x = E[tokens]
 *   layer:      n1 = rmsnorm(x);  q,k,v = n1 Wq^T, n1 Wk^T, n1 Wv^T;  rope(q), rope(k)
 *               h = x + attention(q, k, v) Wo^T
 *               n2 = rmsnorm(h);  out = h + (silu(n2 Wg^T) * n2 Wu^T) Wd^T
 *   head:       logits = rmsnorm(x) Wlm^T;  loss = sum(-log softmax(logits)[target]) / n_loss_tokens
 *
 * plugin.c has checked every view and the batch before these run, and calls them through
 * llama_cpu_backend (the end of this file). What a training forward keeps for the backward, and when
 * the backward recomputes it instead, is layers_saved.c's; this file places the activations (one
 * host block with the record's header) and computes them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "llama_tp.h"

/* A record is one host->alloc block: the header (llama_saved), then, unless it only marks a
 * recompute, the unit's activations (layer_acts or head_acts) at a 64-byte boundary. */
#define RECORD_HEADER_BYTES ((sizeof(llama_saved) + 63) / 64 * 64)

/* With sequence parallelism the norms' and the residual's rows are this rank's sequence shard: Ns =
 * N / tp of them (tp.c); otherwise Ns = N. */
typedef struct layer_acts {
    float *norm1, *rstd1; /* input RMSNorm output [Ns, hidden] and its 1/rms [Ns] */
    float *q, *k, *v;     /* projections after rotary embedding: [N, heads*D], [N, kv_heads*D] x 2 */
    float *attn;          /* attention output [N, heads*D] */
    float *resid;         /* h = x + o_proj(attn) [Ns, hidden] */
    float *norm2, *rstd2; /* post-attention RMSNorm [Ns, hidden], [Ns] */
    float *gate, *up;     /* MLP projections before the SwiGLU [N, intermediate] x 2 */
    float *lora[LLAMA_LINEARS]; /* LoRA: scaling * x A^T [N, r] of each adapted linear, else NULL */
} layer_acts;

typedef struct head_acts {
    float *norm, *rstd; /* final RMSNorm [Ns, hidden], [Ns] */
    float *logits;      /* [N, vocab]; after a training forward: d loss / d logits */
} head_acts;

/* ---- memory ---------------------------------------------------------------------------------- */

/* The rows of the sequence shard of a call of N tokens (N itself without sequence parallelism). */
static int64_t shard_rows(const llama_state *s, int64_t N)
{
    return llama_tp_seq_parallel(s) ? N / s->tp.size : N;
}

/* Splits a float buffer into consecutive arrays, each starting at a 64-byte boundary. */
typedef struct carver {
    float *base; /* NULL: only count */
    int64_t used;
} carver;

static float *carve(carver *cv, int64_t n)
{
    float *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += (n + 15) / 16 * 16;
    return p;
}

static void carve_layer(const llama_state *s, int32_t unit, int64_t N, carver *cv, layer_acts *a)
{
    const llama_config *c = &s->cfg;
    const llama_tp *t = &s->tp; /* this rank's heads and ffn part under tensor parallelism */
    int64_t H = c->hidden, Q = t->heads * c->head_dim, KV = t->kv_heads * c->head_dim, F = t->ffn;
    int64_t Ns = shard_rows(s, N);
    a->norm1 = carve(cv, Ns * H);
    a->rstd1 = carve(cv, Ns);
    a->q = carve(cv, N * Q);
    a->k = carve(cv, N * KV);
    a->v = carve(cv, N * KV);
    a->attn = carve(cv, N * Q);
    a->resid = carve(cv, Ns * H);
    a->norm2 = carve(cv, Ns * H);
    a->rstd2 = carve(cv, Ns);
    a->gate = carve(cv, N * F);
    a->up = carve(cv, N * F);
    for (int k = 0; k < LLAMA_LINEARS; k++)
        a->lora[k] = s->lora.r > 0 && s->lora.slot[(unit - 1) * LLAMA_LINEARS + k] >= 0 ? carve(cv, N * s->lora.r)
                                                                                          : NULL;
}

static void carve_head(const llama_state *s, int64_t N, carver *cv, head_acts *a)
{
    int64_t Ns = shard_rows(s, N);
    a->norm = carve(cv, Ns * s->cfg.hidden);
    a->rstd = carve(cv, Ns);
    a->logits = carve(cv, N * s->tp.vocab); /* this rank's vocabulary rows */
}

/* The layer backward's scratch. */
typedef struct layer_grads {
    float *act;     /* silu(gate) * up, then its gradient [N, intermediate] */
    float *norm;    /* gradient at the post-attention norm's output, later the input norm's [N, hidden] */
    float *resid;   /* gradient at h, the residual stream after attention [N, hidden] */
    float *attn;    /* gradient at the attention output [N, heads*D] */
    float *q, *k, *v;
    float *lora;    /* LoRA: the gradient at scaling * x A^T of one linear [N, r] */
    /* sequence parallelism only (else NULL): a norm's output gathered whole [N, hidden], the shards
     * [Ns, hidden] of the norm gradient, the residual gradient and the input gradient, and a norm
     * weight's gradient from this rank's tokens [hidden] */
    float *full, *dnorm_shard, *dresid_shard, *dx_shard, *norm_weight;
} layer_grads;

static void carve_layer_grads(const llama_state *s, int64_t N, carver *cv, layer_grads *d)
{
    const llama_config *c = &s->cfg;
    const llama_tp *t = &s->tp;
    int64_t H = c->hidden, Q = t->heads * c->head_dim, KV = t->kv_heads * c->head_dim;
    d->act = carve(cv, N * t->ffn);
    d->norm = carve(cv, N * H);
    d->resid = carve(cv, N * H);
    d->attn = carve(cv, N * Q);
    d->q = carve(cv, N * Q);
    d->k = carve(cv, N * KV);
    d->v = carve(cv, N * KV);
    d->lora = s->lora.r > 0 ? carve(cv, N * s->lora.r) : NULL;
    int sp = llama_tp_seq_parallel(s);
    int64_t Ns = shard_rows(s, N);
    d->full = sp ? carve(cv, N * H) : NULL;
    d->dnorm_shard = sp ? carve(cv, Ns * H) : NULL;
    d->dresid_shard = sp ? carve(cv, Ns * H) : NULL;
    d->dx_shard = sp ? carve(cv, Ns * H) : NULL;
    d->norm_weight = sp ? carve(cv, H) : NULL;
}

static float *alloc_floats(const llama_call *r, int32_t pool, int64_t n, const char *what)
{
    char tag[64];
    snprintf(tag, sizeof tag, "%s %s", r->name, what);
    const zt_host *h = r->s->host;
    return h->alloc(h->ctx, pool, ZT_MEM_HOST, (uint64_t)n * sizeof(float), 0, tag);
}

/* llama_backend.saved_alloc: a record with room for the activations of this unit (or just the
 * header when `marker`). */
static llama_saved *saved_alloc(const llama_call *r, int32_t pool, int marker, const char *what)
{
    carver cv = {NULL, 0};
    layer_acts la;
    head_acts ha;
    int32_t unit = r->c->unit;
    if (!marker) {
        if (unit == r->s->info.n_units - 1) carve_head(r->s, r->tokens, &cv, &ha);
        else carve_layer(r->s, unit, r->tokens, &cv, &la);
    }
    char tag[64];
    snprintf(tag, sizeof tag, "%s %s", r->name, what);
    const zt_host *h = r->s->host;
    llama_saved *rec = h->alloc(h->ctx, pool, ZT_MEM_HOST, RECORD_HEADER_BYTES + (uint64_t)cv.used * sizeof(float),
                                0, tag);
    if (!rec) return NULL;
    memset(rec, 0, sizeof *rec);
    if (!marker) rec->acts = (char *)rec + RECORD_HEADER_BYTES;
    return rec;
}

/* llama_backend.saved_free: the activations are in the header's block. */
static void saved_free(llama_state *s, llama_saved *rec)
{
    s->host->free(s->host->ctx, rec);
}

/* ---- small helpers --------------------------------------------------------------------------- */

static const float *param(const llama_call *r, int i)
{
    return r->c->params[i].data;
}

/* The gradient buffer of parameter i, or NULL when it is frozen. */
static float *grad(const llama_call *r, int i)
{
    return r->c->grads ? r->c->grads[i].data : NULL;
}

/* Describes a failed kernel: they fail only when the 3 MiB matrix-multiply packing buffer cannot be
 * allocated. */
static zt_status kernel_failed(const llama_call *r, zt_status st, const char *step)
{
    r->s->host->error(r->s->host->ctx, st,
                      "%s: %s failed (%s): the matrix-multiply kernel could not allocate its 3 MiB "
                      "packing buffer; free memory or lower train_micro_batch_size_per_gpu",
                      r->name, step, st == ZT_ERR_OUT_OF_MEMORY ? "out of memory" : "kernel error");
    return st;
}

#define KERNEL(call, step)                                              \
    do {                                                                \
        zt_status kernel_st_ = (call);                                  \
        if (kernel_st_ != ZT_OK) {                                      \
            st = kernel_failed(r, kernel_st_, step);                    \
            goto done;                                                  \
        }                                                               \
    } while (0)

/* dX[M,K] += dY[M,N] W[N,K]: the input gradient of a linear layer added to what is there (several
 * projections read the same input). */
static zt_status linear_backward_input_add(const zt_cpu_ctx *ctx, int64_t M, int64_t N, int64_t K,
                                           const float *dy, const float *w, float *dx)
{
    return zt_cpu_gemm(ctx, 0, 0, M, K, N, dy, N, w, K, dx, K, 1);
}

/* ---- LoRA on a linear (lora.c chose which) ---------------------------------------------------- */

/* The view index of linear k's A in this layer's parameters (B follows it), or -1. */
static int lora_slot(const llama_call *r, int k)
{
    const llama_lora *l = &r->s->lora;
    return l->r > 0 ? l->slot[(r->c->unit - 1) * LLAMA_LINEARS + k] : -1;
}

/* lora_dropout as peft applies it: on the adapter's input x before A, in training only (forward,
 * backward and recompute of a ZT_UNIT_TRAIN call), each element kept with probability 1 - p and
 * scaled by 1 / (1 - p). The mask is a hash of the seed, the unit, the linear and the micro-batch's
 * tokens and positions, so the backward and a recompute draw the forward's mask without storing it,
 * and a resumed run draws the masks of an uninterrupted one. */
static int lora_dropping(const llama_call *r)
{
    return r->s->lora.dropout > 0 && (r->c->flags & ZT_UNIT_TRAIN);
}

/* o_proj and down_proj: row-parallel, their inputs split by columns under tensor parallelism. */
static int row_parallel(int k)
{
    return k == LAYER_O || k == LAYER_DOWN;
}

/* dst = dropout(src) [N, in] with linear k's mask (dst may be src). The input of a row-parallel linear
 * under tensor parallelism is this rank's `in` columns of tp * in: each element draws the mask of its
 * place in the whole input, as on one rank. */
static void lora_dropout(const llama_call *r, int k, int64_t in, const float *src, float *dst)
{
    const zt_batch *b = r->c->batch;
    const llama_tp *t = &r->s->tp;
    uint64_t h = llama_lora_mask_start(&r->s->lora, r->c->unit, k);
    for (int64_t i = 0; i < r->tokens; i++)
        h = llama_lora_mix64(h ^ ((uint64_t)(uint32_t)b->tokens[i] | (uint64_t)(uint32_t)b->positions[i] << 32));
    uint64_t cut = (uint64_t)((double)r->s->lora.dropout * 16777216.0); /* on 24 bits */
    float keep = 1.0f / (1.0f - r->s->lora.dropout);
    int64_t whole = row_parallel(k) ? in * t->size : in, col0 = row_parallel(k) ? in * t->rank : 0;
    for (int64_t n = 0; n < r->tokens; n++)
        for (int64_t j = 0; j < in; j++) {
            uint64_t e = (uint64_t)(n * whole + col0 + j);
            dst[n * in + j] = (llama_lora_mix64(h + LLAMA_LORA_GOLDEN * e) >> 40) >= cut ? src[n * in + j] * keep : 0.0f;
        }
}

/* x itself, or with dropout a new buffer dropout(x) in *owned (freed by the caller); NULL: out of memory. */
static const float *lora_input(const llama_call *r, int k, int64_t in, const float *x, float **owned)
{
    *owned = NULL;
    if (!lora_dropping(r)) return x;
    if (!(*owned = malloc((size_t)(r->tokens * in) * sizeof(float)))) return NULL;
    lora_dropout(r, k, in, x, *owned);
    return *owned;
}

/* u[N, r] = scaling * dropout(x) A^T. */
static zt_status lora_project(const llama_call *r, int k, int64_t in, const float *x, float *u)
{
    int a = lora_slot(r, k);
    if (a < 0) return ZT_OK;
    int64_t N = r->tokens, R = r->s->lora.r;
    float *owned;
    const float *xd = lora_input(r, k, in, x, &owned);
    zt_status st = xd ? zt_cpu_linear_forward(&r->s->cpu, N, R, in, xd, param(r, a), u) : ZT_ERR_OUT_OF_MEMORY;
    if (st == ZT_OK) zt_cpu_scale(&r->s->cpu, N * R, r->s->lora.scaling, u);
    free(owned);
    return st;
}

/* y[N, out] += u B^T with u = scaling * x A^T [N, r] kept in `u` for the backward. */
static zt_status lora_forward(const llama_call *r, int k, int64_t in, int64_t out, const float *x, float *u,
                              float *y)
{
    int a = lora_slot(r, k);
    if (a < 0) return ZT_OK;
    zt_status st = lora_project(r, k, in, x, u);
    if (st != ZT_OK) return st;
    int64_t R = r->s->lora.r;
    return zt_cpu_gemm(&r->s->cpu, 0, 1, r->tokens, out, R, u, R, param(r, a + 1), R, y, out, 1);
}

/* The adapter's part of linear k's backward, before the base linear overwrites its input gradient:
 * dB += dy^T u, du = scaling * dy B into du [N, r], dA += du^T dropout(x).
 *
 * Under tensor parallelism (tp.c's split: B's rows of a column-parallel linear, A's columns of a
 * row-parallel one) the replicated factor's gradient is a partial sum on each rank: A's of a
 * column-parallel linear (du comes from this rank's rows of B), B's of a row-parallel one (u from
 * this rank's columns of A). It is computed apart, summed over "tp" and then added, so every rank
 * holds the one-rank gradient. du stays partial for a column-parallel linear: the input gradient it
 * adds to is all-reduced (or reduce-scattered) with the base linear's. */
static zt_status lora_backward_weights(const llama_call *r, int k, int64_t in, int64_t out, const float *x,
                                       const float *u, const float *dy, float *du)
{
    int a = lora_slot(r, k);
    if (a < 0) return ZT_OK;
    const zt_cpu_ctx *ctx = &r->s->cpu;
    int64_t N = r->tokens, R = r->s->lora.r;
    float *gA = grad(r, a), *gB = grad(r, a + 1), *part = NULL;
    int split = r->s->tp.size > 1, sum_b = split && row_parallel(k) && gB, sum_a = split && !row_parallel(k) && gA;
    if ((sum_a || sum_b) && !(part = calloc((size_t)(R * (sum_b ? out : in)), sizeof *part)))
        return ZT_ERR_OUT_OF_MEMORY;
    zt_status st = ZT_OK;
    if (gB) st = zt_cpu_linear_backward_weight(ctx, N, out, R, dy, u, sum_b ? part : gB);
    if (st == ZT_OK && sum_b) st = llama_tp_sum_grad(r, part, gB, out * R, "a LoRA B's gradient");
    if (st == ZT_OK) st = zt_cpu_linear_backward_input(ctx, N, out, R, dy, param(r, a + 1), du);
    if (st != ZT_OK) goto done;
    zt_cpu_scale(ctx, N * R, r->s->lora.scaling, du);
    if (!gA) goto done;
    float *owned;
    const float *xd = lora_input(r, k, in, x, &owned);
    st = xd ? zt_cpu_linear_backward_weight(ctx, N, R, in, du, xd, sum_a ? part : gA) : ZT_ERR_OUT_OF_MEMORY;
    free(owned);
    if (st == ZT_OK && sum_a) st = llama_tp_sum_grad(r, part, gA, R * in, "a LoRA A's gradient");
done:
    free(part);
    return st;
}

/* dx[N, in] += dropout'(du A): the adapter's share of the input gradient, after the base linear wrote its
 * own (through dropout: the forward's mask and scale). */
static zt_status lora_backward_input(const llama_call *r, int k, int64_t in, const float *du, float *dx)
{
    int a = lora_slot(r, k);
    if (a < 0) return ZT_OK;
    int64_t N = r->tokens, R = r->s->lora.r;
    if (!lora_dropping(r)) return zt_cpu_gemm(&r->s->cpu, 0, 0, N, in, R, du, R, param(r, a), in, dx, in, 1);
    float *t = malloc((size_t)(N * in) * sizeof *t);
    zt_status st = t ? zt_cpu_gemm(&r->s->cpu, 0, 0, N, in, R, du, R, param(r, a), in, t, in, 0) : ZT_ERR_OUT_OF_MEMORY;
    if (st == ZT_OK) {
        lora_dropout(r, k, in, t, t);
        for (int64_t e = 0; e < N * in; e++) dx[e] += t[e];
    }
    free(t);
    return st;
}

/* A [B, T, heads, D] view for the attention plugin. */
static zt_tensor attention_view(float *data, const zt_batch *b, int64_t heads, int64_t D)
{
    zt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = ZT_F32;
    t.device_type = ZT_DEVICE_CPU;
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

static zt_attn_args attention_args(const llama_call *r, const layer_acts *a)
{
    const llama_config *c = &r->s->cfg;
    const zt_batch *b = r->c->batch;
    zt_attn_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    const llama_tp *t = &r->s->tp;
    args.n_heads = (int32_t)t->heads;
    args.n_kv_heads = (int32_t)t->kv_heads;
    args.head_dim = (int32_t)c->head_dim;
    args.scale = 1.0f / sqrtf((float)c->head_dim);
    args.causal = 1;
    args.batch = b;
    args.q = attention_view(a->q, b, t->heads, c->head_dim);
    args.k = attention_view(a->k, b, t->kv_heads, c->head_dim);
    args.v = attention_view(a->v, b, t->kv_heads, c->head_dim);
    args.out = attention_view(a->attn, b, t->heads, c->head_dim);
    return args;
}

static zt_status attention_failed(const llama_call *r, zt_status st, const char *op)
{
    r->s->host->error(r->s->host->ctx, st, "%s: the attention plugin's %s failed (its message is above)",
                      r->name, op);
    return st;
}

/* ---- embedding (unit 0) ---------------------------------------------------------------------- */

static zt_status bad_token(const llama_call *r, const char *what, int64_t index, int32_t id)
{
    const zt_batch *b = r->c->batch;
    r->s->host->error(r->s->host->ctx, ZT_ERR_INVALID_ARG,
                      "%s: %s %d at batch row %lld, position %lld is outside the vocabulary [0, %lld) of "
                      "this model (model.vocab_size); the data was tokenized with a tokenizer whose vocabulary "
                      "does not fit the model: prepare it again (zt-prep) with the model's tokenizer",
                      r->name, what, (int)id, (long long)(index / b->seq_len), (long long)(index % b->seq_len),
                      (long long)r->s->cfg.vocab);
    return ZT_ERR_INVALID_ARG;
}

static zt_status embedding_forward(llama_state *s, const zt_unit_call *c)
{
    llama_call run;
    const llama_call *r = &run;
    llama_call_init(&run, s, c);
    int64_t bad = -1;
    zt_status st = s->tp.size > 1
                       ? llama_tp_embedding_forward(r, param(r, EMBED_TABLE), c->x_out.data, &bad)
                       : zt_cpu_embedding_forward(&s->cpu, r->tokens, s->cfg.vocab, s->cfg.hidden, c->batch->tokens,
                                                  param(r, EMBED_TABLE), c->x_out.data, &bad);
    if (st != ZT_OK) return bad >= 0 ? bad_token(r, "token id", bad, c->batch->tokens[bad]) : st;
    return ZT_OK; /* the backward needs only batch->tokens: nothing to save */
}

static zt_status embedding_backward(llama_state *s, const zt_unit_call *c)
{
    llama_call run;
    const llama_call *r = &run;
    llama_call_init(&run, s, c);
    float *g = grad(r, EMBED_TABLE);
    if (!g) return ZT_OK; /* frozen embedding: unit 0 has no input gradient to propagate */
    int64_t bad = -1;
    zt_status st = s->tp.size > 1
                       ? llama_tp_embedding_backward(r, c->dx_out.data, g, &bad)
                       : zt_cpu_embedding_backward(&s->cpu, r->tokens, s->cfg.vocab, s->cfg.hidden,
                                                   c->batch->tokens, c->dx_out.data, g, &bad);
    if (st != ZT_OK) return bad_token(r, "token id", bad, c->batch->tokens[bad]);
    return ZT_OK;
}

/* ---- transformer layer ----------------------------------------------------------------------- */

/* The layer's forward on x, filling `a`. Writes `out` unless it is NULL (a recompute inside the
 * backward needs only the activations). attention_saved: where the attention plugin keeps what its
 * backward needs; NULL when no backward follows. */
static zt_status layer_compute(const llama_call *r, const float *x, const layer_acts *a, float *out,
                               void **attention_saved)
{
    llama_state *s = r->s;
    const zt_unit_call *c = r->c;
    const llama_config *cfg = &s->cfg;
    const zt_cpu_ctx *ctx = &s->cpu;
    const llama_tp *t = &s->tp;
    int64_t N = r->tokens, H = cfg->hidden, F = t->ffn, D = cfg->head_dim;
    int64_t Q = t->heads * D, KV = t->kv_heads * D;
    const int32_t *positions = c->batch->positions;
    float *act = NULL, *work = NULL;
    int64_t Ns, first;
    zt_status st = llama_tp_seq_rows(r, &Ns, &first);
    if (st != ZT_OK) return st;
    /* Sequence parallelism: the norms' whole outputs for the column-parallel linears, the row-parallel
     * linears' partial sums [N, hidden] each, and the output's shard [Ns, hidden]; all scratch. */
    int sp = llama_tp_seq_parallel(s);
    if (sp && !(work = alloc_floats(r, ZT_POOL_WORKSPACE, 2 * N * H + Ns * H, "sequence-parallel scratch")))
        return ZT_ERR_OUT_OF_MEMORY;
    float *full = sp ? work : a->norm1, *partial = sp ? work + N * H : a->resid;
    const float *xs = x + first * H; /* this rank's tokens of the residual stream */

    zt_cpu_rmsnorm_forward(ctx, Ns, H, (float)cfg->rms_norm_eps, xs, param(r, LAYER_INPUT_NORM), a->norm1,
                           a->rstd1);
    if ((st = llama_tp_gather_rows(r, a->norm1, full, H, "the input norm's output")) != ZT_OK) goto done;
    KERNEL(zt_cpu_linear_forward(ctx, N, Q, H, full, param(r, LAYER_Q), a->q), "q_proj forward");
    KERNEL(zt_cpu_linear_forward(ctx, N, KV, H, full, param(r, LAYER_K), a->k), "k_proj forward");
    KERNEL(zt_cpu_linear_forward(ctx, N, KV, H, full, param(r, LAYER_V), a->v), "v_proj forward");
    KERNEL(lora_forward(r, LAYER_Q, H, Q, full, a->lora[LAYER_Q], a->q), "q_proj LoRA forward");
    KERNEL(lora_forward(r, LAYER_K, H, KV, full, a->lora[LAYER_K], a->k), "k_proj LoRA forward");
    KERNEL(lora_forward(r, LAYER_V, H, KV, full, a->lora[LAYER_V], a->v), "v_proj LoRA forward");
    zt_cpu_rope_forward(ctx, N, t->heads, D, positions, s->inv_freq, a->q, a->q);
    zt_cpu_rope_forward(ctx, N, t->kv_heads, D, positions, s->inv_freq, a->k, a->k);

    const zt_attention_binding *att = c->attention;
    zt_attn_args args = attention_args(r, a);
    if (c->kv) {
        st = att->ops->kv_attend(att->state, c->kv, c->unit - 1, c->kv_seq_ids, c->batch->batch, &args);
        if (st != ZT_OK) {
            st = attention_failed(r, st, "kv_attend");
            goto done;
        }
    } else {
        st = att->ops->forward(att->state, &args, attention_saved);
        if (st != ZT_OK) {
            st = attention_failed(r, st, "forward");
            goto done;
        }
    }

    KERNEL(zt_cpu_linear_forward(ctx, N, H, Q, a->attn, param(r, LAYER_O), partial), "o_proj forward");
    KERNEL(lora_forward(r, LAYER_O, Q, H, a->attn, a->lora[LAYER_O], partial), "o_proj LoRA forward");
    /* row-parallel o_proj: each rank's heads give a partial sum (the attention block's all-reduce, or
     * with sequence parallelism its reduce-scatter onto the rank's tokens) */
    if ((st = llama_tp_reduce_rows(r, partial, a->resid, H, "the attention output")) != ZT_OK) goto done;
    zt_cpu_add(ctx, Ns * H, xs, a->resid);
    zt_cpu_rmsnorm_forward(ctx, Ns, H, (float)cfg->rms_norm_eps, a->resid, param(r, LAYER_POST_NORM), a->norm2,
                           a->rstd2);
    if (!sp) full = a->norm2;
    if ((st = llama_tp_gather_rows(r, a->norm2, full, H, "the post-attention norm's output")) != ZT_OK) goto done;
    KERNEL(zt_cpu_linear_forward(ctx, N, F, H, full, param(r, LAYER_GATE), a->gate), "gate_proj forward");
    KERNEL(zt_cpu_linear_forward(ctx, N, F, H, full, param(r, LAYER_UP), a->up), "up_proj forward");
    KERNEL(lora_forward(r, LAYER_GATE, H, F, full, a->lora[LAYER_GATE], a->gate), "gate_proj LoRA forward");
    KERNEL(lora_forward(r, LAYER_UP, H, F, full, a->lora[LAYER_UP], a->up), "up_proj LoRA forward");
    if (!out) goto done; /* down_proj's LoRA input is recomputed with the SwiGLU in the backward */

    act = alloc_floats(r, ZT_POOL_WORKSPACE, N * F, "SwiGLU output");
    if (!act) {
        st = ZT_ERR_OUT_OF_MEMORY;
        goto done;
    }
    zt_cpu_swiglu_forward(ctx, N * F, a->gate, a->up, act);
    /* out is written last, after every read of x: the host may pass one buffer as both. */
    float *down = sp ? partial : out, *out_shard = sp ? work + 2 * N * H : out;
    KERNEL(zt_cpu_linear_forward(ctx, N, H, F, act, param(r, LAYER_DOWN), down), "down_proj forward");
    KERNEL(lora_forward(r, LAYER_DOWN, F, H, act, a->lora[LAYER_DOWN], down), "down_proj LoRA forward");
    /* row-parallel down_proj: the MLP block's all-reduce (reduce-scatter) */
    if ((st = llama_tp_reduce_rows(r, down, out_shard, H, "the MLP output")) != ZT_OK) goto done;
    zt_cpu_add(ctx, Ns * H, a->resid, out_shard);
    /* the unit's output is whole: the shards gathered (sequence parallelism only) */
    st = llama_tp_gather_rows(r, out_shard, out, H, "the layer's output");
done:
    s->host->free(s->host->ctx, act);
    s->host->free(s->host->ctx, work);
    return st;
}

/* llama_compute_fn of a layer: its activations in rec. */
static zt_status layer_fill(const llama_call *r, llama_saved *rec, int outputs, int keep)
{
    carver cv = {rec->acts, 0};
    layer_acts a;
    carve_layer(r->s, r->c->unit, r->tokens, &cv, &a);
    return layer_compute(r, r->c->x_in.data, &a, outputs ? r->c->x_out.data : NULL,
                         keep ? &rec->attention_saved : NULL);
}

static zt_status layer_forward(llama_state *s, const zt_unit_call *c)
{
    llama_call run;
    llama_call_init(&run, s, c);
    return llama_saved_forward(&run, layer_fill);
}

static zt_status layer_backward(llama_state *s, const zt_unit_call *c)
{
    llama_call run;
    const llama_call *r = &run;
    llama_call_init(&run, s, c);
    const llama_config *cfg = &s->cfg;
    const zt_cpu_ctx *ctx = &s->cpu;
    const llama_tp *t = &s->tp;
    int64_t N = r->tokens, H = cfg->hidden, F = t->ffn, D = cfg->head_dim;
    int64_t Q = t->heads * D, KV = t->kv_heads * D;
    llama_saved *saved = NULL, *fresh = NULL;
    float *work = NULL;
    zt_status st = llama_saved_take(r, &saved);
    if (st != ZT_OK) return st;
    st = llama_saved_materialize(r, saved, layer_fill, &fresh);
    if (st != ZT_OK) goto done;
    llama_saved *rec = fresh ? fresh : saved;
    carver cv = {rec->acts, 0};
    layer_acts a;
    carve_layer(s, c->unit, N, &cv, &a);
    carver wv = {NULL, 0};
    layer_grads d;
    carve_layer_grads(s, N, &wv, &d);
    work = alloc_floats(r, ZT_POOL_WORKSPACE, wv.used, "backward scratch");
    if (!work) {
        st = ZT_ERR_OUT_OF_MEMORY;
        goto done;
    }
    wv = (carver){work, 0};
    carve_layer_grads(s, N, &wv, &d);
    const float *dy = c->dx_out.data;
    float *g;
    /* Sequence parallelism: the norms and the residual on this rank's Ns tokens from row `first`,
     * each norm's output gathered whole again for the weight gradients of the linears it feeds. */
    int sp = llama_tp_seq_parallel(s);
    int64_t Ns, first;
    if ((st = llama_tp_seq_rows(r, &Ns, &first)) != ZT_OK) goto done;
    float *norm2 = sp ? d.full : a.norm2, *dnorm = sp ? d.dnorm_shard : d.norm;
    float *dresid = sp ? d.dresid_shard : d.resid, *dx = sp ? d.dx_shard : c->dx_in.data;
    if ((st = llama_tp_gather_rows(r, a.norm2, norm2, H, "the post-attention norm's output")) != ZT_OK) goto done;

    /* MLP: out = h + down(act), act = silu(gate) * up */
    zt_cpu_swiglu_forward(ctx, N * F, a.gate, a.up, d.act);
    if ((g = grad(r, LAYER_DOWN)))
        KERNEL(zt_cpu_linear_backward_weight(ctx, N, H, F, dy, d.act, g), "down_proj weight gradient");
    KERNEL(lora_project(r, LAYER_DOWN, F, d.act, a.lora[LAYER_DOWN]), "down_proj LoRA recompute");
    KERNEL(lora_backward_weights(r, LAYER_DOWN, F, H, d.act, a.lora[LAYER_DOWN], dy, d.lora),
           "down_proj LoRA gradients");
    KERNEL(zt_cpu_linear_backward_input(ctx, N, H, F, dy, param(r, LAYER_DOWN), d.act), "down_proj backward");
    KERNEL(lora_backward_input(r, LAYER_DOWN, F, d.lora, d.act), "down_proj LoRA backward");
    zt_cpu_swiglu_backward(ctx, N * F, a.gate, a.up, d.act, a.gate, a.up); /* gate, up := their gradients */
    if ((g = grad(r, LAYER_GATE)))
        KERNEL(zt_cpu_linear_backward_weight(ctx, N, F, H, a.gate, norm2, g), "gate_proj weight gradient");
    if ((g = grad(r, LAYER_UP)))
        KERNEL(zt_cpu_linear_backward_weight(ctx, N, F, H, a.up, norm2, g), "up_proj weight gradient");
    KERNEL(zt_cpu_linear_backward_input(ctx, N, F, H, a.gate, param(r, LAYER_GATE), d.norm), "gate_proj backward");
    KERNEL(linear_backward_input_add(ctx, N, F, H, a.up, param(r, LAYER_UP), d.norm), "up_proj backward");
    for (int k = LAYER_GATE; k <= LAYER_UP; k++) {
        KERNEL(lora_backward_weights(r, k, H, F, norm2, a.lora[k], k == LAYER_GATE ? a.gate : a.up, d.lora),
               "gate/up_proj LoRA gradients");
        KERNEL(lora_backward_input(r, k, H, d.lora, d.norm), "gate/up_proj LoRA backward");
    }
    /* column-parallel gate/up: each rank's ffn part gives a partial input gradient (all-reduced, or
     * reduce-scattered onto the rank's tokens) */
    if ((st = llama_tp_reduce_rows(r, d.norm, dnorm, H, "the MLP input gradient")) != ZT_OK) goto done;
    g = grad(r, LAYER_POST_NORM); /* NULL (frozen): no weight gradient */
    if (sp && g) memset(d.norm_weight, 0, (size_t)H * sizeof(float));
    zt_cpu_rmsnorm_backward(ctx, Ns, H, a.resid, param(r, LAYER_POST_NORM), a.rstd2, dnorm, dresid,
                            sp && g ? d.norm_weight : g);
    if (sp && g && (st = llama_tp_sum_grad(r, d.norm_weight, g, H, "the post-attention norm's weight gradient")) != ZT_OK)
        goto done;
    zt_cpu_add(ctx, Ns * H, dy + first * H, dresid); /* the residual path */
    if ((st = llama_tp_gather_rows(r, dresid, d.resid, H, "the residual gradient")) != ZT_OK) goto done;

    /* attention: h = x + o_proj(attention(rope(q), rope(k), v)) */
    if ((g = grad(r, LAYER_O)))
        KERNEL(zt_cpu_linear_backward_weight(ctx, N, H, Q, d.resid, a.attn, g), "o_proj weight gradient");
    KERNEL(zt_cpu_linear_backward_input(ctx, N, H, Q, d.resid, param(r, LAYER_O), d.attn), "o_proj backward");
    KERNEL(lora_backward_weights(r, LAYER_O, Q, H, a.attn, a.lora[LAYER_O], d.resid, d.lora), "o_proj LoRA gradients");
    KERNEL(lora_backward_input(r, LAYER_O, Q, d.lora, d.attn), "o_proj LoRA backward");
    zt_attn_args args = attention_args(r, &a);
    args.dout = attention_view(d.attn, c->batch, t->heads, D);
    args.dq = attention_view(d.q, c->batch, t->heads, D);
    args.dk = attention_view(d.k, c->batch, t->kv_heads, D);
    args.dv = attention_view(d.v, c->batch, t->kv_heads, D);
    void *attention_saved = rec->attention_saved;
    rec->attention_saved = NULL; /* the attention backward frees it */
    st = c->attention->ops->backward(c->attention->state, &args, attention_saved);
    if (st != ZT_OK) {
        st = attention_failed(r, st, "backward");
        goto done;
    }
    zt_cpu_rope_backward(ctx, N, t->heads, D, c->batch->positions, s->inv_freq, d.q, d.q);
    zt_cpu_rope_backward(ctx, N, t->kv_heads, D, c->batch->positions, s->inv_freq, d.k, d.k);
    /* The input gradient first, from this rank's own dk and dv: the all-reduce below adds every
     * rank's, so a replicated KV head's contributions are each counted once. */
    KERNEL(zt_cpu_linear_backward_input(ctx, N, Q, H, d.q, param(r, LAYER_Q), d.norm), "q_proj backward");
    KERNEL(linear_backward_input_add(ctx, N, KV, H, d.k, param(r, LAYER_K), d.norm), "k_proj backward");
    KERNEL(linear_backward_input_add(ctx, N, KV, H, d.v, param(r, LAYER_V), d.norm), "v_proj backward");
    /* A KV head replicated on several ranks: its weight gradient is the sum of theirs. */
    if ((st = llama_tp_sum_kv_replicas(r, d.k, d.v)) != ZT_OK) goto done;
    float *norm1 = sp ? d.full : a.norm1;
    if ((st = llama_tp_gather_rows(r, a.norm1, norm1, H, "the input norm's output")) != ZT_OK) goto done;
    if ((g = grad(r, LAYER_Q)))
        KERNEL(zt_cpu_linear_backward_weight(ctx, N, Q, H, d.q, norm1, g), "q_proj weight gradient");
    if ((g = grad(r, LAYER_K)))
        KERNEL(zt_cpu_linear_backward_weight(ctx, N, KV, H, d.k, norm1, g), "k_proj weight gradient");
    if ((g = grad(r, LAYER_V)))
        KERNEL(zt_cpu_linear_backward_weight(ctx, N, KV, H, d.v, norm1, g), "v_proj weight gradient");
    for (int k = LAYER_Q; k <= LAYER_V; k++) {
        const float *dproj = k == LAYER_Q ? d.q : k == LAYER_K ? d.k : d.v;
        int64_t out = k == LAYER_Q ? Q : KV;
        KERNEL(lora_backward_weights(r, k, H, out, norm1, a.lora[k], dproj, d.lora), "q/k/v_proj LoRA gradients");
        KERNEL(lora_backward_input(r, k, H, d.lora, d.norm), "q/k/v_proj LoRA backward");
    }
    /* column-parallel q/k/v: the attention block's backward all-reduce (reduce-scatter) */
    if ((st = llama_tp_reduce_rows(r, d.norm, dnorm, H, "the attention input gradient")) != ZT_OK) goto done;
    /* dx_in is written last, after every read of dx_out: the host may pass one buffer as both. */
    g = grad(r, LAYER_INPUT_NORM);
    if (sp && g) memset(d.norm_weight, 0, (size_t)H * sizeof(float));
    zt_cpu_rmsnorm_backward(ctx, Ns, H, (const float *)c->x_in.data + first * H, param(r, LAYER_INPUT_NORM),
                            a.rstd1, dnorm, dx, sp && g ? d.norm_weight : g);
    if (sp && g && (st = llama_tp_sum_grad(r, d.norm_weight, g, H, "the input norm's weight gradient")) != ZT_OK)
        goto done;
    zt_cpu_add(ctx, Ns * H, dresid, dx);
    st = llama_tp_gather_rows(r, dx, c->dx_in.data, H, "the layer's input gradient");
done:
    s->host->free(s->host->ctx, work);
    llama_saved_done(r, saved, fresh);
    return st;
}

/* ---- final norm, LM head and loss (last unit) ------------------------------------------------ */

/* Logits of x into a->logits, and a copy into logits_out unless it is NULL; the loss share into
 * *loss_out unless it is NULL; when `train`, a->logits is then replaced by d loss / d logits for the
 * backward. */
static zt_status head_compute(const llama_call *r, const float *x, const head_acts *a, float *logits_out,
                              float *loss_out, int train)
{
    llama_state *s = r->s;
    const zt_unit_call *c = r->c;
    const llama_config *cfg = &s->cfg;
    int64_t N = r->tokens, H = cfg->hidden, V = s->tp.vocab; /* this rank's vocabulary rows */
    float *row_loss = NULL, *full = NULL;
    int64_t Ns, first;
    zt_status st = llama_tp_seq_rows(r, &Ns, &first);
    if (st != ZT_OK) return st;
    /* sequence parallelism: the norm on this rank's tokens, gathered whole for the LM head */
    if (llama_tp_seq_parallel(s) && !(full = alloc_floats(r, ZT_POOL_WORKSPACE, N * H, "gathered final norm")))
        return ZT_ERR_OUT_OF_MEMORY;
    zt_cpu_rmsnorm_forward(&s->cpu, Ns, H, (float)cfg->rms_norm_eps, x + first * H, param(r, HEAD_NORM), a->norm,
                           a->rstd);
    st = llama_tp_gather_rows(r, a->norm, full ? full : a->norm, H, "the final norm's output");
    if (st == ZT_OK &&
        (st = zt_cpu_linear_forward(&s->cpu, N, V, H, full ? full : a->norm, param(r, HEAD_LM), a->logits)) != ZT_OK)
        st = kernel_failed(r, st, "lm_head forward");
    s->host->free(s->host->ctx, full);
    if (st != ZT_OK) return st;
    if (logits_out && s->tp.size > 1 && (st = llama_tp_gather_logits(r, a->logits, logits_out)) != ZT_OK) return st;
    if (logits_out && s->tp.size == 1) memcpy(logits_out, a->logits, (size_t)(N * V) * sizeof(float));
    if (!loss_out && !train) return ZT_OK;
    double loss = 0.0;
    int64_t bad = -1;
    if (s->tp.size > 1) { /* vocab-parallel: the logits stay split */
        st = llama_tp_cross_entropy(r, a->logits, (double)c->batch->n_loss_tokens_global,
                                    (float)zt_unit_call_loss_scale(c), &loss, train, &bad);
        if (st != ZT_OK) return bad >= 0 ? bad_token(r, "target id", bad, c->batch->targets[bad]) : st;
        if (loss_out) *loss_out = (float)loss;
        return ZT_OK;
    }

    row_loss = alloc_floats(r, ZT_POOL_WORKSPACE, N, "per-token loss");
    if (!row_loss) return ZT_ERR_OUT_OF_MEMORY;
    st = zt_cpu_cross_entropy(&s->cpu, N, V, a->logits, c->batch->targets,
                              (double)c->batch->n_loss_tokens_global, (float)zt_unit_call_loss_scale(c), row_loss,
                              &loss,
                              train ? a->logits : NULL, &bad);
    if (st != ZT_OK) {
        /* plugin.c checked n_loss_tokens_global, so this is a target outside the vocabulary */
        st = bad_token(r, "target id", bad, c->batch->targets[bad]);
        goto done;
    }
    if (loss_out) *loss_out = (float)loss;
done:
    s->host->free(s->host->ctx, row_loss);
    return st;
}

/* llama_compute_fn of the head: its activations in rec (with keep, d loss / d logits). */
static zt_status head_fill(const llama_call *r, llama_saved *rec, int outputs, int keep)
{
    carver cv = {rec->acts, 0};
    head_acts a;
    carve_head(r->s, r->tokens, &cv, &a);
    return head_compute(r, r->c->x_in.data, &a, outputs ? r->c->x_out.data : NULL, outputs ? r->c->loss : NULL,
                        keep);
}

static zt_status head_forward(llama_state *s, const zt_unit_call *c)
{
    llama_call run;
    llama_call_init(&run, s, c);
    return llama_saved_forward(&run, head_fill);
}

static zt_status head_backward(llama_state *s, const zt_unit_call *c)
{
    llama_call run;
    const llama_call *r = &run;
    llama_call_init(&run, s, c);
    const llama_config *cfg = &s->cfg;
    int64_t N = r->tokens, H = cfg->hidden, V = s->tp.vocab;
    llama_saved *saved = NULL, *fresh = NULL;
    float *work = NULL;
    zt_status st = llama_saved_take(r, &saved);
    if (st != ZT_OK) return st;
    st = llama_saved_materialize(r, saved, head_fill, &fresh);
    if (st != ZT_OK) goto done;
    carver cv = {(fresh ? fresh : saved)->acts, 0};
    head_acts a;
    carve_head(s, N, &cv, &a);
    /* Sequence parallelism: the norm on this rank's Ns tokens from row `first`; scratch for its output
     * gathered whole, the norm gradient's and the input gradient's shards, its weight gradient. */
    int sp = llama_tp_seq_parallel(s);
    int64_t Ns, first;
    if ((st = llama_tp_seq_rows(r, &Ns, &first)) != ZT_OK) goto done;
    work = alloc_floats(r, ZT_POOL_WORKSPACE, sp ? 2 * N * H + 2 * Ns * H + H : N * H, "backward scratch");
    if (!work) {
        st = ZT_ERR_OUT_OF_MEMORY;
        goto done;
    }
    float *d_norm = work, *g;
    float *norm = sp ? work + N * H : a.norm, *dnorm = sp ? work + 2 * N * H : d_norm;
    float *dx = sp ? dnorm + Ns * H : c->dx_in.data, *norm_weight = sp ? dx + Ns * H : NULL;
    if ((st = llama_tp_gather_rows(r, a.norm, norm, H, "the final norm's output")) != ZT_OK) goto done;
    if ((g = grad(r, HEAD_LM)))
        KERNEL(zt_cpu_linear_backward_weight(&s->cpu, N, V, H, a.logits, norm, g), "lm_head weight gradient");
    KERNEL(zt_cpu_linear_backward_input(&s->cpu, N, V, H, a.logits, param(r, HEAD_LM), d_norm),
           "lm_head backward");
    /* vocab-parallel LM head: each rank's rows give a partial input gradient (all-reduced, or
     * reduce-scattered onto the rank's tokens) */
    if ((st = llama_tp_reduce_rows(r, d_norm, dnorm, H, "the LM head's input gradient")) != ZT_OK) goto done;
    g = grad(r, HEAD_NORM);
    if (sp && g) memset(norm_weight, 0, (size_t)H * sizeof(float));
    zt_cpu_rmsnorm_backward(&s->cpu, Ns, H, (const float *)c->x_in.data + first * H, param(r, HEAD_NORM), a.rstd,
                            dnorm, dx, sp && g ? norm_weight : g);
    if (sp && g && (st = llama_tp_sum_grad(r, norm_weight, g, H, "the final norm's weight gradient")) != ZT_OK)
        goto done;
    st = llama_tp_gather_rows(r, dx, c->dx_in.data, H, "the head's input gradient");
done:
    s->host->free(s->host->ctx, work);
    llama_saved_done(r, saved, fresh);
    return st;
}

/* ---- the CPU path's table -------------------------------------------------------------------- */

const llama_backend llama_cpu_backend = {
    .device_type = ZT_DEVICE_CPU,
    .forward = {[LLAMA_UNIT_EMBEDDING] = embedding_forward, [LLAMA_UNIT_LAYER] = layer_forward,
                [LLAMA_UNIT_HEAD] = head_forward},
    .backward = {[LLAMA_UNIT_EMBEDDING] = embedding_backward, [LLAMA_UNIT_LAYER] = layer_backward,
                 [LLAMA_UNIT_HEAD] = head_backward},
    .saved_alloc = saved_alloc,
    .saved_free = saved_free,
};
