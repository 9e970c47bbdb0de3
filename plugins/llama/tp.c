/* Tensor parallelism in the llama model (Megatron's split; docs/parallel.md):
 *
 *   q/k/v, gate/up  column-parallel: each rank holds its heads' / its ffn part's rows
 *   o, down         row-parallel: the matching columns; their outputs are partial sums, all-reduced
 *                   over "tp" once per attention block and once per MLP block (the backward all-reduces
 *                   the input gradient of the column-parallel projections the same way)
 *   embedding       vocabulary rows (padded to a multiple of tp): a masked lookup, then an all-reduce
 *   LM head + loss  vocabulary rows: a vocab-parallel cross-entropy that reduces each row's max, its
 *                   sum of exponentials and its target logit over "tp", never the logits themselves
 *
 * With more ranks than key/value heads, each rank holds one KV head and tp / kv_heads ranks share it
 * (Megatron's replication); their gradients of k and v are summed so the copies stay equal. Norms are
 * replicated: their inputs and input gradients are the same on every rank, so are their gradients.
 *
 * Sequence parallelism (zt_model_parallel.seq_parallel, Megatron's sequence_parallel): inside a layer
 * and the head the norms and residual adds run on this rank's N / tp tokens; an all-gather over "tp"
 * gives the column-parallel linears the whole sequence, and a reduce-scatter replaces the all-reduce
 * after the row-parallel ones. A norm weight's gradient then comes from the rank's tokens only and is
 * all-reduced over "tp". The units' boundaries stay whole (the host passes [N, hidden] between
 * units), so a layer ends with an all-gather of its output (the backward: of its input gradient).
 * This file holds the split rules (what parallelize and param_shard answer, the local shapes the unit
 * checks expect) and the CPU path's collectives and vocab-parallel math; layers.c calls them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "llama_tp.h"

void llama_tp_init(llama_state *s)
{
    llama_tp *t = &s->tp;
    memset(t, 0, sizeof *t);
    t->size = 1;
    t->heads = s->cfg.heads;
    t->kv_heads = s->cfg.kv_heads;
    t->kv_replicas = 1;
    t->ffn = s->cfg.intermediate;
    t->vocab = s->cfg.vocab;
    t->vocab_valid = s->cfg.vocab;
}

/* The sizes that divide `n`, for messages ("1, 2, 4"). */
static void divisors(int64_t n, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int64_t d = 1; d <= n && used < cap; d++)
        if (n % d == 0) used += (size_t)snprintf(buf + used, cap - used, "%s%lld", used ? ", " : "", (long long)d);
}

static zt_status refuse(const llama_state *s, const char *what, int64_t n, int32_t tp)
{
    char sizes[160];
    divisors(n, sizes, sizeof sizes);
    s->host->error(s->host->ctx, ZT_ERR_CONFIG,
                   "tensor parallel over %d ranks (parallel_config.model_parallel) needs %s (%lld) to divide "
                   "by %d; model_parallel sizes that divide it: %s", (int)tp, what, (long long)n, (int)tp, sizes);
    return ZT_ERR_CONFIG;
}

zt_status llama_parallelize(llama_state *s, const zt_model_parallel *p)
{
    const zt_host *h = s->host;
    if (!p || p->struct_size < ZT_MODEL_PARALLEL_SIZE_1_4 || p->tp_size < 1 || p->tp_rank < 0 ||
        p->tp_rank >= p->tp_size) {
        h->error(h->ctx, ZT_ERR_INVALID_ARG, "llama parallelize: the tensor-parallel description is missing or "
                 "inconsistent (tp_rank %d of tp_size %d; a host bug)", p ? (int)p->tp_rank : -1,
                 p ? (int)p->tp_size : 0);
        return ZT_ERR_INVALID_ARG;
    }
    const llama_config *c = &s->cfg;
    int32_t tp = p->tp_size;
    if (tp > 1 && s->on_gpu && (p->seq_parallel || s->lora.r > 0)) {
        h->error(h->ctx, ZT_ERR_UNSUPPORTED, "tensor parallel (model_parallel %d) on GPUs computes the plain "
                 "Megatron split; %s runs on CPU ranks only: %s, or train with device = cpu", (int)tp,
                 p->seq_parallel ? "sequence parallelism (parallel_config.use_seq_parallel)" : "a LoRA adapter",
                 p->seq_parallel ? "set use_seq_parallel to false" : "train the adapter with model_parallel 1");
        return ZT_ERR_UNSUPPORTED;
    }
    if (tp > c->kv_heads && s->lora.r > 0) {
        for (int32_t l = 0; l < (int32_t)c->layers; l++)
            if (s->lora.slot[l * LLAMA_LINEARS + LAYER_K] >= 0 || s->lora.slot[l * LLAMA_LINEARS + LAYER_V] >= 0) {
                h->error(h->ctx, ZT_ERR_UNSUPPORTED,
                         "tensor parallel over %d ranks replicates the model's %lld key/value heads, and LoRA on "
                         "k_proj or v_proj (layer %d) of a replicated head is not something the llama plugin "
                         "computes: leave k_proj and v_proj out of lora.target_modules, or use a model_parallel that "
                         "divides %lld", (int)tp, (long long)c->kv_heads, (int)l, (long long)c->kv_heads);
                return ZT_ERR_UNSUPPORTED;
            }
    }
    if (c->heads % tp) return refuse(s, "the attention heads (model.num_attention_heads)", c->heads, tp);
    if (c->intermediate % tp) return refuse(s, "the MLP width (model.intermediate_size)", c->intermediate, tp);
    if (tp <= c->kv_heads ? c->kv_heads % tp : tp % c->kv_heads) {
        char sizes[160];
        divisors(c->kv_heads, sizes, sizeof sizes);
        h->error(h->ctx, ZT_ERR_CONFIG,
                 "tensor parallel over %d ranks needs the key/value heads (model.num_key_value_heads, %lld) to "
                 "divide by %d, or %d to be a multiple of them (each KV head then replicated on %d / %lld ranks); "
                 "sizes that work: the divisors of %lld (%s) and their multiples that divide the %lld heads",
                 (int)tp, (long long)c->kv_heads, (int)tp, (int)tp, (int)tp, (long long)c->kv_heads,
                 (long long)c->kv_heads, sizes, (long long)c->heads);
        return ZT_ERR_CONFIG;
    }
    if (s->on_gpu && tp > 1) { /* the bf16 kernels' 16-byte rows (layers_cuda.c check_shapes) for each shard */
        int64_t D = c->head_dim, kv = tp <= c->kv_heads ? c->kv_heads / tp : 1;
        const struct { const char *what; int64_t width; } w[] = {
            {"query heads x head_dim", c->heads / tp * D}, {"key/value heads x head_dim", kv * D},
            {"MLP width", c->intermediate / tp}};
        for (int i = 0; i < 3; i++)
            if (w[i].width % 8) {
                h->error(h->ctx, ZT_ERR_CONFIG, "tensor parallel over %d ranks on GPUs: each rank's %s would be "
                         "%lld, but the bf16 kernels need a multiple of 8; use a model_parallel that leaves "
                         "multiples of 8, or train on the CPU (device = cpu)", (int)tp, w[i].what,
                         (long long)w[i].width);
                return ZT_ERR_CONFIG;
            }
    }
    llama_tp *t = &s->tp;
    llama_tp_init(s);
    t->size = tp;
    t->rank = p->tp_rank;
    t->seq_parallel = p->seq_parallel;
    t->group = p->tp;
    t->heads = c->heads / tp;
    if (tp <= c->kv_heads) {
        t->kv_heads = c->kv_heads / tp;
        t->kv_first = t->rank * t->kv_heads;
    } else {
        t->kv_replicas = (int32_t)(tp / c->kv_heads);
        t->kv_heads = 1;
        t->kv_first = t->rank / t->kv_replicas;
    }
    t->ffn = c->intermediate / tp;
    t->vocab = (c->vocab + tp - 1) / tp;
    t->vocab_first = t->rank * t->vocab;
    t->vocab_valid = c->vocab - t->vocab_first;
    if (t->vocab_valid > t->vocab) t->vocab_valid = t->vocab;
    if (t->vocab_valid < 0) t->vocab_valid = 0;
    if (tp > 1)
        h->log(h->ctx, ZT_LOG_INFO,
               "llama: tensor-parallel rank %d of %d: %lld of %lld heads, %lld key/value head(s) from %lld%s, "
               "MLP %lld of %lld, vocabulary rows %lld..%lld (padded to %lld)",
               (int)t->rank, (int)tp, (long long)t->heads, (long long)c->heads, (long long)t->kv_heads,
               (long long)t->kv_first, t->kv_replicas > 1 ? " (replicated)" : "", (long long)t->ffn,
               (long long)c->intermediate, (long long)t->vocab_first, (long long)(t->vocab_first + t->vocab_valid),
               (long long)(t->vocab * tp));
    return ZT_OK;
}

/* Which split a declaration follows: its rows (or columns) per rank, its first, how many are real,
 * how many ranks share them. */
typedef struct split_rule {
    int32_t dim;
    int64_t offset, extent, valid;
    int32_t replicas;
} split_rule;

/* The linear (LAYER_*) that the adapter parameter k of layer unit u adapts: the adapted linears'
 * A and B follow the layer's own parameters in LAYER_* order (lora.c). */
static int32_t lora_base(const llama_state *s, int32_t u, int32_t k)
{
    for (int32_t j = 0; j < LLAMA_LINEARS; j++) {
        int32_t a = s->lora.slot[(u - 1) * LLAMA_LINEARS + j];
        if (a >= 0 && (k == a || k == a + 1)) return j;
    }
    return -1; /* not reached: every adapter parameter belongs to an adapted linear */
}

static split_rule rule_of(const llama_state *s, int32_t param)
{
    const llama_tp *t = &s->tp;
    const zt_param_decl *d = &s->decls[param];
    split_rule r = {-1, 0, 0, 0, t->size}; /* replicated: every tp rank holds it */
    int32_t u = d->unit, k = param - s->unit_first_param[u];
    int64_t D = s->cfg.head_dim;
    if (t->size == 1) return r;
    if (d->flags & ZT_PARAM_ADAPTER) {
        /* LoRA (peft with Megatron's layers): the factor next to the split dimension of the base weight
         * splits with it, the other one is replicated: B's rows of a column-parallel linear, A's columns
         * of a row-parallel one */
        int32_t base = lora_base(s, u, k), is_b = (k - LAYER_PARAMS) % 2;
        split_rule b = rule_of(s, s->unit_first_param[u] + base);
        return b.dim == (is_b ? 0 : 1) ? b : r;
    }
    if (u == 0 || (u == s->info.n_units - 1 && k == HEAD_LM)) {
        r = (split_rule){0, t->vocab_first, t->vocab, t->vocab_valid, 1};
    } else if (u > 0 && u < s->info.n_units - 1) {
        switch (k) {
        case LAYER_Q: r = (split_rule){0, t->rank * t->heads * D, t->heads * D, t->heads * D, 1}; break;
        case LAYER_K:
        case LAYER_V:
            r = (split_rule){0, t->kv_first * D, t->kv_heads * D, t->kv_heads * D, t->kv_replicas};
            break;
        case LAYER_O: r = (split_rule){1, t->rank * t->heads * D, t->heads * D, t->heads * D, 1}; break;
        case LAYER_GATE:
        case LAYER_UP: r = (split_rule){0, t->rank * t->ffn, t->ffn, t->ffn, 1}; break;
        case LAYER_DOWN: r = (split_rule){1, t->rank * t->ffn, t->ffn, t->ffn, 1}; break;
        default: break;
        }
    }
    return r;
}

zt_status llama_param_shard(const llama_state *s, int32_t param, zt_param_shard *out)
{
    if (param < 0 || param >= s->info.n_params_decl || !out || out->struct_size < ZT_PARAM_SHARD_SIZE_1_4) {
        s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG, "llama param_shard: declaration %d does not exist (the "
                       "model has %d) or the shard struct is older than ABI 1.4 (a host bug)", (int)param,
                       (int)s->info.n_params_decl);
        return ZT_ERR_INVALID_ARG;
    }
    split_rule r = rule_of(s, param);
    const zt_param_decl *d = &s->decls[param];
    uint32_t size = out->struct_size;
    memset(out, 0, size);
    out->struct_size = size;
    out->split_dim = r.dim;
    out->replicas = r.replicas;
    if (r.dim < 0) {
        out->extent = out->valid = d->shape[0];
        return ZT_OK;
    }
    out->offset = r.offset;
    out->extent = r.extent;
    out->valid = r.valid;
    return ZT_OK;
}

void llama_local_shape(const llama_state *s, int32_t param, int64_t *out)
{
    const zt_param_decl *d = &s->decls[param];
    for (int i = 0; i < 4; i++) out[i] = d->shape[i];
    split_rule r = rule_of(s, param);
    if (r.dim >= 0) out[r.dim] = r.extent;
}

/* ---- the CPU path's collectives and vocab-parallel math -------------------------------------- */

zt_status llama_tp_all_reduce(const llama_call *r, float *buf, int64_t n, int32_t op, const char *what)
{
    const llama_state *s = r->s;
    if (s->tp.size == 1 || n == 0) return ZT_OK;
    zt_status st = s->host->all_reduce(s->host->ctx, &s->tp.group, buf, buf, (uint64_t)n, ZT_F32, op, NULL);
    if (st != ZT_OK)
        s->host->error(s->host->ctx, st, "%s: the tensor-parallel all-reduce of %s over \"tp\" failed (the "
                       "collective's message is above)", r->name, what);
    return st;
}

static zt_status out_of_memory(const llama_call *r, const char *what)
{
    r->s->host->error(r->s->host->ctx, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory for %s", r->name, what);
    return ZT_ERR_OUT_OF_MEMORY;
}

zt_status llama_tp_sum_kv_replicas(const llama_call *r, float *dk, float *dv)
{
    const llama_state *s = r->s;
    const llama_tp *t = &s->tp;
    if (t->kv_replicas == 1) return ZT_OK;
    int64_t N = r->tokens, D = s->cfg.head_dim, KV = s->cfg.kv_heads * D;
    /* Each rank's dk and dv in its head's columns of a zeroed [2, N, kv_heads * D], summed over "tp":
     * the ranks sharing a head add up, the others add zero. */
    float *all = calloc((size_t)(2 * N * KV), sizeof *all);
    if (!all) return out_of_memory(r, "the replicated key/value heads' gradient sum");
    int64_t col = t->kv_first * D;
    for (int64_t n = 0; n < N; n++) {
        memcpy(all + n * KV + col, dk + n * D, (size_t)D * sizeof(float));
        memcpy(all + (N + n) * KV + col, dv + n * D, (size_t)D * sizeof(float));
    }
    zt_status st = llama_tp_all_reduce(r, all, 2 * N * KV, ZT_REDUCE_SUM, "the replicated key/value gradients");
    for (int64_t n = 0; st == ZT_OK && n < N; n++) {
        memcpy(dk + n * D, all + n * KV + col, (size_t)D * sizeof(float));
        memcpy(dv + n * D, all + (N + n) * KV + col, (size_t)D * sizeof(float));
    }
    free(all);
    return st;
}

int llama_tp_seq_parallel(const llama_state *s)
{
    return s->tp.size > 1 && s->tp.seq_parallel;
}

zt_status llama_tp_seq_rows(const llama_call *r, int64_t *rows, int64_t *first)
{
    const llama_state *s = r->s;
    *rows = r->tokens;
    *first = 0;
    if (!llama_tp_seq_parallel(s)) return ZT_OK;
    const zt_batch *b = r->c->batch;
    if (r->tokens % s->tp.size) {
        s->host->error(s->host->ctx, ZT_ERR_CONFIG,
                       "%s: sequence parallelism (parallel_config.use_seq_parallel) over %d tensor-parallel ranks "
                       "splits the micro-batch's %lld x %lld = %lld tokens into equal shards, and %lld does not "
                       "divide by %d: make seq_length (or the micro-batch size) a multiple of %d, or turn "
                       "use_seq_parallel off", r->name, (int)s->tp.size, (long long)b->batch, (long long)b->seq_len,
                       (long long)r->tokens, (long long)r->tokens, (int)s->tp.size, (int)s->tp.size);
        return ZT_ERR_CONFIG;
    }
    *rows = r->tokens / s->tp.size;
    *first = s->tp.rank * *rows;
    return ZT_OK;
}

static zt_status collective_failed(const llama_call *r, zt_status st, const char *op, const char *what)
{
    r->s->host->error(r->s->host->ctx, st, "%s: the sequence-parallel %s of %s over \"tp\" failed (the "
                      "collective's message is above)", r->name, op, what);
    return st;
}

zt_status llama_tp_reduce_rows(const llama_call *r, float *partial, float *dst, int64_t width, const char *what)
{
    const llama_state *s = r->s;
    if (!llama_tp_seq_parallel(s)) return llama_tp_all_reduce(r, partial, r->tokens * width, ZT_REDUCE_SUM, what);
    uint64_t count = (uint64_t)(r->tokens / s->tp.size * width);
    zt_status st = s->host->reduce_scatter(s->host->ctx, &s->tp.group, partial, dst, count, ZT_F32, ZT_REDUCE_SUM,
                                           NULL);
    return st == ZT_OK ? ZT_OK : collective_failed(r, st, "reduce-scatter", what);
}

zt_status llama_tp_gather_rows(const llama_call *r, const float *shard, float *full, int64_t width, const char *what)
{
    const llama_state *s = r->s;
    if (!llama_tp_seq_parallel(s)) {
        if (full != shard) memcpy(full, shard, (size_t)(r->tokens * width) * sizeof(float));
        return ZT_OK;
    }
    uint64_t count = (uint64_t)(r->tokens / s->tp.size * width);
    zt_status st = s->host->all_gather(s->host->ctx, &s->tp.group, shard, full, count, ZT_F32, NULL);
    return st == ZT_OK ? ZT_OK : collective_failed(r, st, "all-gather", what);
}

zt_status llama_tp_sum_grad(const llama_call *r, float *gw, float *dw, int64_t n, const char *what)
{
    zt_status st = llama_tp_all_reduce(r, gw, n, ZT_REDUCE_SUM, what);
    if (st != ZT_OK) return st;
    for (int64_t i = 0; i < n; i++) dw[i] += gw[i];
    return ZT_OK;
}

/* A token id outside the vocabulary: its index, or -1. */
static int64_t first_bad_id(const int32_t *ids, int64_t n, int64_t vocab, int allow_ignore)
{
    for (int64_t i = 0; i < n; i++) {
        if (allow_ignore && ids[i] == -100) continue;
        if (ids[i] < 0 || ids[i] >= vocab) return i;
    }
    return -1;
}

zt_status llama_tp_embedding_forward(const llama_call *r, const float *table, float *y, int64_t *bad)
{
    const llama_state *s = r->s;
    const llama_tp *t = &s->tp;
    int64_t N = r->tokens, H = s->cfg.hidden;
    const int32_t *ids = r->c->batch->tokens;
    if ((*bad = first_bad_id(ids, N, s->cfg.vocab, 0)) >= 0) return ZT_ERR_INVALID_ARG;
    for (int64_t n = 0; n < N; n++) {
        int64_t local = ids[n] - t->vocab_first;
        if (local >= 0 && local < t->vocab_valid) memcpy(y + n * H, table + local * H, (size_t)H * sizeof(float));
        else memset(y + n * H, 0, (size_t)H * sizeof(float));
    }
    return llama_tp_all_reduce(r, y, N * H, ZT_REDUCE_SUM, "the embedding lookup");
}

zt_status llama_tp_embedding_backward(const llama_call *r, const float *dy, float *dtable, int64_t *bad)
{
    const llama_state *s = r->s;
    const llama_tp *t = &s->tp;
    int64_t N = r->tokens, H = s->cfg.hidden;
    const int32_t *ids = r->c->batch->tokens;
    if ((*bad = first_bad_id(ids, N, s->cfg.vocab, 0)) >= 0) return ZT_ERR_INVALID_ARG;
    for (int64_t n = 0; n < N; n++) {
        int64_t local = ids[n] - t->vocab_first;
        if (local < 0 || local >= t->vocab_valid) continue;
        float *row = dtable + local * H;
        for (int64_t j = 0; j < H; j++) row[j] += dy[n * H + j];
    }
    return ZT_OK;
}

zt_status llama_tp_cross_entropy(const llama_call *r, float *logits, double normalizer, float dloss, double *loss,
                                 int train, int64_t *bad)
{
    const llama_state *s = r->s;
    const llama_tp *t = &s->tp;
    int64_t N = r->tokens, V = t->vocab, valid = t->vocab_valid;
    const int32_t *targets = r->c->batch->targets;
    if ((*bad = first_bad_id(targets, N, s->cfg.vocab, 1)) >= 0) return ZT_ERR_INVALID_ARG;
    float *rows = malloc((size_t)(3 * N) * sizeof *rows); /* max [N], then sum of exp [N], target logit [N] */
    if (!rows) return out_of_memory(r, "the vocab-parallel cross-entropy's row statistics");
    float *mx = rows, *sum = rows + N, *tgt = rows + 2 * N;
    for (int64_t n = 0; n < N; n++) {
        float m = -INFINITY;
        for (int64_t j = 0; j < valid; j++) m = fmaxf(m, logits[n * V + j]);
        mx[n] = m;
    }
    zt_status st = llama_tp_all_reduce(r, mx, N, ZT_REDUCE_MAX, "the logits' row maxima");
    for (int64_t n = 0; st == ZT_OK && n < N; n++) {
        double e = 0.0;
        for (int64_t j = 0; j < valid; j++) e += exp((double)logits[n * V + j] - mx[n]);
        sum[n] = (float)e;
        int64_t local = targets[n] - t->vocab_first;
        tgt[n] = targets[n] != -100 && local >= 0 && local < valid ? logits[n * V + local] : 0.0f;
    }
    if (st == ZT_OK) st = llama_tp_all_reduce(r, sum, 2 * N, ZT_REDUCE_SUM, "the logits' sums of exponentials");
    if (st != ZT_OK) {
        free(rows);
        return st;
    }
    double total = 0.0;
    for (int64_t n = 0; n < N; n++)
        if (targets[n] != -100) total += log((double)sum[n]) + mx[n] - tgt[n];
    *loss = total / normalizer;
    if (train) {
        float scale = (float)(dloss / normalizer);
        for (int64_t n = 0; n < N; n++) {
            float *row = logits + n * V;
            int64_t local = targets[n] - t->vocab_first;
            if (targets[n] == -100) {
                memset(row, 0, (size_t)V * sizeof(float));
                continue;
            }
            for (int64_t j = 0; j < valid; j++) row[j] = (float)(exp((double)row[j] - mx[n]) / sum[n]) * scale;
            if (local >= 0 && local < valid) row[local] -= scale;
            for (int64_t j = valid; j < V; j++) row[j] = 0.0f;
        }
    }
    free(rows);
    return ZT_OK;
}

zt_status llama_tp_gather_logits(const llama_call *r, const float *local, float *out)
{
    const llama_state *s = r->s;
    const llama_tp *t = &s->tp;
    int64_t N = r->tokens, V = t->vocab, full = s->cfg.vocab;
    float *all = malloc((size_t)(t->size * N * V) * sizeof *all);
    if (!all) return out_of_memory(r, "the gathered logits");
    zt_status st = s->host->all_gather(s->host->ctx, &t->group, local, all, (uint64_t)(N * V), ZT_F32, NULL);
    if (st != ZT_OK) {
        s->host->error(s->host->ctx, st, "%s: the all-gather of the logits over \"tp\" failed", r->name);
        free(all);
        return st;
    }
    for (int32_t k = 0; k < t->size; k++) {
        int64_t first = k * V, n_cols = full - first < V ? full - first : V;
        for (int64_t n = 0; n < N && n_cols > 0; n++)
            memcpy(out + n * full + first, all + ((int64_t)k * N + n) * V, (size_t)n_cols * sizeof(float));
    }
    free(all);
    return ZT_OK;
}
