/* zt-run --generate: the model against its KV cache. The weights are loaded into host memory (a
 * tied parameter views its owner's storage), then each call runs tokens through every unit, forward
 * only, appending their keys and values to the attention plugin's cache. */
#include "generate/generate_internal.h"

#include "base/clock.h"
#include "base/log.h"
#include "state/safetensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the model against its KV cache ----------------------------------------------------------- */

static void release_graphs(gen_model *m);

static int64_t numel(const zt_param_decl *p)
{
    int64_t n = 1;
    for (int32_t d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

/* A contiguous view in the memory the units run in (host fp32, or the GPU's 16-bit type). */
static zt_tensor view_in(const gen_model *m, void *data, int32_t dtype, int ndim, const int64_t *shape)
{
    zt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device_type = m->on_gpu ? ZT_DEVICE_CUDA : ZT_DEVICE_CPU;
    t.ndim = ndim;
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = stride;
        stride *= shape[d];
    }
    return t;
}

static zt_tensor view_of(const gen_model *m, void *data, int ndim, const int64_t *shape)
{
    return view_in(m, data, m->dtype, ndim, shape);
}

static void *model_alloc(gen_model *m, int pool, uint64_t bytes, const char *tag, zt_error *err)
{
    return zt_runtime_alloc(m->rt, pool, ZT_MEM_HOST, bytes ? bytes : 1, 0, tag, err);
}

/* Memory the units read: the device's on a GPU, else the host's. */
static void *unit_alloc(gen_model *m, int pool, uint64_t bytes, const char *tag, zt_error *err)
{
    return zt_runtime_alloc(m->rt, pool, m->on_gpu ? ZT_MEM_DEVICE : ZT_MEM_HOST, bytes ? bytes : 1, 0, tag, err);
}

static uint64_t elem_bytes(const gen_model *m)
{
    return m->on_gpu ? 2 : sizeof(float);
}

/* Reads parameter p into the units' storage at dst: directly on the CPU; on a GPU into host fp32
 * staging, rounded to the 16-bit type and copied. */
static zt_status read_param(gen_model *m, weight_reader read, void *source, const zt_param_decl *p, void *dst,
                            float *staging, uint16_t *narrow, zt_error *err)
{
    if (!m->on_gpu) return read(source, p, dst, err);
    zt_status st = read(source, p, staging, err);
    int64_t n = numel(p);
    for (int64_t i = 0; i < n && st == ZT_OK; i++)
        narrow[i] = m->dtype == ZT_F16 ? zt_f16_from_f32(staging[i]) : zt_bf16_from_f32(staging[i]);
    if (st == ZT_OK) st = zt_runtime_memcpy(m->rt, dst, narrow, (uint64_t)n * 2, err);
    return st;
}

zt_status gen_read_hf(void *source, const zt_param_decl *p, float *dst, zt_error *err)
{
    return zt_hf_model_read(source, p->name, p->ndim, p->shape, 0, (uint64_t)numel(p), dst, err);
}

zt_status gen_read_hf_adapter(void *source, const zt_param_decl *p, float *dst, zt_error *err)
{
    const gen_hf_adapter_source *s = source;
    if (p->flags & ZT_PARAM_ADAPTER) return zt_peft_adapter_read(s->adapter, p, 0, numel(p), dst, err);
    return gen_read_hf(s->base, p, dst, err);
}

zt_status gen_read_llama2c(void *source, const zt_param_decl *p, float *dst, zt_error *err)
{
    return zt_l2c_model_read(source, p->name, p->ndim, p->shape, 0, (uint64_t)numel(p), dst, err);
}

zt_status gen_read_checkpoint(void *source, const zt_param_decl *p, float *dst, zt_error *err)
{
    return zt_ckpt_read(source, p->name, ZT_CKPT_GROUP_PARAM, 0, numel(p), dst, err);
}

zt_status gen_model_load_weights(gen_model *m, weight_reader read, void *source, zt_error *err)
{
    const zt_model_info *info = m->info;
    int32_t np = info->n_params_decl;
    int64_t *offset = calloc((size_t)np, sizeof *offset);
    m->views = model_alloc(m, ZT_POOL_OTHER, (uint64_t)np * sizeof *m->views, "parameter views", err);
    m->unit_first = model_alloc(m, ZT_POOL_OTHER, (uint64_t)(info->n_units + 1) * sizeof *m->unit_first,
                                "unit table", err);
    if (!offset || !m->views || !m->unit_first) {
        free(offset);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the model's parameter table");
    }
    int64_t total = 0, largest = 0;
    for (int32_t i = 0; i < np; i++) {
        offset[i] = -1;
        if (info->params[i].flags & ZT_PARAM_TIED) continue;
        offset[i] = total;
        total += numel(&info->params[i]);
        if (numel(&info->params[i]) > largest) largest = numel(&info->params[i]);
    }
    m->weights = unit_alloc(m, ZT_POOL_PARAMS, (uint64_t)total * elem_bytes(m), "model weights", err);
    zt_status st = m->weights ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
    float *staging = NULL;
    uint16_t *narrow = NULL;
    if (st == ZT_OK && m->on_gpu) { /* one parameter at a time through the host */
        staging = malloc((size_t)largest * sizeof *staging);
        narrow = malloc((size_t)largest * sizeof *narrow);
        if (!staging || !narrow)
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of host memory staging a parameter of %lld values",
                              (long long)largest);
    }
    for (int32_t u = 0, i = 0; u <= info->n_units; u++) {
        m->unit_first[u] = i; /* parameters are grouped by unit, in unit order (zt_model.h) */
        while (u < info->n_units && i < np && info->params[i].unit == u) i++;
    }
    if (st == ZT_OK && m->unit_first[info->n_units] != np)
        st = zt_error_set(err, ZT_ERR_INTERNAL, "model plugin '%s' declares its parameters out of unit order (a "
                          "plugin bug)", m->model_lp->desc.name);
    for (int32_t i = 0; i < np && st == ZT_OK; i++) {
        const zt_param_decl *p = &info->params[i];
        int32_t owner = i;
        if (p->flags & ZT_PARAM_TIED) {
            owner = -1;
            for (int32_t k = 0; k < np; k++)
                if (p->tied_to && !strcmp(info->params[k].name, p->tied_to)) owner = k;
            if (owner < 0 || offset[owner] < 0) {
                st = zt_error_set(err, ZT_ERR_INTERNAL, "model plugin '%s': %s is tied to '%s', which it does not "
                                  "declare with storage (a plugin bug)",
                                  m->model_lp->desc.name, p->name, p->tied_to ? p->tied_to : "(null)");
                break;
            }
        }
        void *at = (char *)m->weights + (uint64_t)offset[owner] * elem_bytes(m);
        m->views[i] = view_of(m, at, p->ndim, p->shape);
        if (owner == i) st = read_param(m, read, source, p, at, staging, narrow, err);
    }
    free(offset);
    free(staging);
    free(narrow);
    return st;
}

zt_status gen_model_prepare(gen_model *m, int32_t max_seqs, int32_t seq_tokens, zt_error *err)
{
    const zt_model_info *info = m->info;
    m->max_seqs = max_seqs;
    m->seq_tokens = seq_tokens;
    /* Asked for (generate.device_sampling), on a GPU, and a model that can. */
    m->device_sampling = m->device_sampling && m->on_gpu && info->struct_size >= ZT_MODEL_INFO_SIZE_1_4 &&
                         (info->caps & ZT_MODEL_CAN_SAMPLE_ON_DEVICE);
    if (m->on_gpu)
        zt_log(ZT_LOG_INFO, "sampling on the %s (generate.device_sampling)", m->device_sampling ? "GPU" : "host");
    const zt_attention_ops *attention = m->attention.ops;
    int can_prepare = attention->struct_size >= ZT_ATTENTION_OPS_SIZE_1_5 && attention->kv_prepare;
    if (m->cuda_graphs && m->on_gpu && !can_prepare)
        zt_log(ZT_LOG_INFO, "decode steps launch their kernels: attention plugin '%s' has no kv_prepare (ABI 1.5), "
               "so its steps cannot be captured in CUDA graphs (generate.cuda_graphs)", m->attention_lp->desc.name);
    m->cuda_graphs = m->cuda_graphs && m->on_gpu && can_prepare && zt_runtime_has_graphs(m->rt);
    if (m->cuda_graphs) {
        zt_log(ZT_LOG_INFO, "decode steps replay CUDA graphs, one per batch size (generate.cuda_graphs)");
        m->graphs = model_alloc(m, ZT_POOL_OTHER, (uint64_t)(max_seqs + 1) * sizeof *m->graphs, "CUDA graph table",
                                err);
        if (!m->graphs) return ZT_ERR_OUT_OF_MEMORY;
        memset(m->graphs, 0, (size_t)(max_seqs + 1) * sizeof *m->graphs);
    }
    m->rows = seq_tokens > max_seqs ? seq_tokens : max_seqs;
    uint64_t rows = (uint64_t)m->rows, hidden_bytes = rows * (uint64_t)info->hidden_size * elem_bytes(m);
    for (int i = 0; i < 2; i++)
        if (!(m->hidden[i] = unit_alloc(m, ZT_POOL_ACTIVATIONS, hidden_bytes, "unit outputs", err)))
            return ZT_ERR_OUT_OF_MEMORY;
    uint64_t logits_bytes = (uint64_t)max_seqs * (uint64_t)info->vocab_size * sizeof(float);
    m->logits = model_alloc(m, ZT_POOL_ACTIVATIONS, logits_bytes, "logits", err);
    if (m->on_gpu && m->logits && !(m->device_logits = unit_alloc(m, ZT_POOL_ACTIVATIONS, logits_bytes, "logits", err)))
        return ZT_ERR_OUT_OF_MEMORY;
    if (m->device_sampling) {
        uint64_t n = (uint64_t)max_seqs;
        m->sample_rows = zt_runtime_alloc(m->rt, ZT_POOL_OTHER, ZT_MEM_PINNED, n * sizeof *m->sample_rows, 0,
                                          "sampling rows", err);
        m->sampled = zt_runtime_alloc(m->rt, ZT_POOL_OTHER, ZT_MEM_PINNED, n * sizeof *m->sampled, 0,
                                      "sampled tokens", err);
        m->device_sample_rows = unit_alloc(m, ZT_POOL_OTHER, n * sizeof *m->sample_rows, "sampling rows", err);
        m->device_sampled = unit_alloc(m, ZT_POOL_OTHER, n * sizeof *m->sampled, "sampled tokens", err);
        if (!m->sample_rows || !m->sampled || !m->device_sample_rows || !m->device_sampled)
            return ZT_ERR_OUT_OF_MEMORY;
    }
    uint64_t ints = 4 * rows + (uint64_t)max_seqs + 3; /* + 2: the head's {0, 1} after a prompt's */
    m->batch_ints = model_alloc(m, ZT_POOL_OTHER, ints * sizeof(int32_t), "tokens, positions, sequence starts", err);
    if (!m->logits || !m->batch_ints) return ZT_ERR_OUT_OF_MEMORY;
    if (m->on_gpu && !(m->device_batch = unit_alloc(m, ZT_POOL_OTHER, ints * sizeof(int32_t),
                                                    "tokens, positions, sequence starts", err)))
        return ZT_ERR_OUT_OF_MEMORY;
    m->tokens = m->batch_ints;
    m->targets = m->tokens + rows;
    m->positions = m->targets + rows;
    m->doc_ids = m->positions + rows;
    m->cu_seqlens = m->doc_ids + rows;
    int64_t max_tokens = (int64_t)max_seqs * seq_tokens;
    if (max_tokens > INT32_MAX)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "%d sequences of %d tokens are more than a KV cache addresses "
                            "(2^31 tokens): lower generate.max_seqs", (int)max_seqs, (int)seq_tokens);
    /* What is free now, for a budget given as a share of it (paged.kv_fraction). */
    zt_machine_memory mem;
    zt_error ignored = {0};
    uint64_t free_bytes = zt_machine_memory_read(&mem, &ignored) == ZT_OK ? mem.available : 0;
    zt_kv_cache_desc d = {.struct_size = sizeof d,
                          .n_layers = info->n_layers,
                          .n_kv_heads = info->n_kv_heads,
                          .head_dim = info->head_dim,
                          .max_seqs = max_seqs,
                          .max_tokens = (int32_t)max_tokens,
                          .dtype = m->on_gpu ? m->dtype : ZT_F32,
                          .free_bytes = m->on_gpu ? 0 : free_bytes, /* 0: the plugin asks its device */
                          .max_seq_tokens = seq_tokens};
    zt_status st = m->attention.ops->kv_create(m->attention.state, &d, &m->kv);
    return st == ZT_OK ? ZT_OK
                       : zt_plugin_failed(m->attention_lp, st, err, "kv_create(%d sequences of %d tokens)",
                                          (int)max_seqs, (int)seq_tokens);
}

void gen_model_free(gen_model *m)
{
    if (!m->rt) return;
    release_graphs(m);
    if (m->kv) m->attention.ops->kv_destroy(m->attention.state, m->kv);
    void *buffers[] = {m->weights, m->views, m->unit_first, m->hidden[0], m->hidden[1], m->logits,
                       m->device_logits, m->batch_ints, m->device_batch, m->sample_rows, m->sampled,
                       m->device_sample_rows, m->device_sampled, m->graphs};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) zt_runtime_free(m->rt, buffers[i]);
    memset(m, 0, sizeof *m);
}

/* What one call runs: the sequences, their batch (on the device already when the units run there)
 * and whether the head samples. */
typedef struct unit_args {
    const int32_t *seq_ids;
    int32_t n_seqs, n_new;
    const zt_batch *whole, *last; /* the units' batch; the head's (the last token of each sequence) */
    int sampled;                  /* the head samples into m->device_sampled */
    int32_t n_draw;
} unit_args;

/* Enqueues every unit's forward (on a GPU nothing waits: a CUDA graph may be capturing it). */
static zt_status enqueue_units(gen_model *m, const unit_args *u, zt_error *err)
{
    const zt_model_info *info = m->info;
    int64_t H = info->hidden_size, hidden_shape[3] = {u->n_seqs, u->n_new, H}, last_shape[3] = {u->n_seqs, 1, H},
            logits_shape[3] = {u->n_seqs, 1, info->vocab_size};
    int cur = 0; /* hidden[cur] holds the input of the unit about to run */
    int32_t head = info->n_units - 1;
    for (int32_t k = 0; k <= head; k++) {
        zt_unit_call c = {.struct_size = sizeof c,
                          .unit = k,
                          .n_params = m->unit_first[k + 1] - m->unit_first[k],
                          .params = m->views + m->unit_first[k],
                          .batch = k == head ? u->last : u->whole,
                          .attention = &m->attention,
                          .kv = m->kv,
                          .kv_seq_ids = u->seq_ids};
        if (k == head && u->sampled) {
            c.sample_rows = m->device_sample_rows;
            c.sample_tokens = m->device_sampled;
            c.sample_n_draw = u->n_draw;
        }
        if (k == head) {
            c.x_in = view_of(m, (char *)m->hidden[cur] + (uint64_t)(u->n_new - 1) * (uint64_t)H * elem_bytes(m), 3,
                             last_shape);
            c.x_out = view_in(m, m->on_gpu ? m->device_logits : m->logits, ZT_F32, 3, logits_shape);
        } else {
            if (k > 0) c.x_in = view_of(m, m->hidden[cur], 3, hidden_shape);
            c.x_out = view_of(m, m->hidden[1 - cur], 3, hidden_shape);
        }
        zt_status st = m->ops->forward(m->model_lp->state, &c);
        if (st != ZT_OK) return zt_plugin_failed(m->model_lp, st, err, "forward of unit %d (generation)", (int)k);
        cur = 1 - cur;
    }
    return ZT_OK;
}

/* Frees the captured graphs (before what they read: the weights, the cache, the buffers). */
static void release_graphs(gen_model *m)
{
    for (int32_t n = 0; m->graphs && n <= m->max_seqs; n++) {
        zt_runtime_graph_destroy(m->rt, m->graphs[n].exec);
        m->graphs[n].exec = NULL;
    }
}

/* A one-token step of n sequences with generate.cuda_graphs (the attention plugin's kv_prepare has
 * staged the step): the first step of each n runs eagerly (it grows the plugins' scratch to what n
 * needs, so nothing allocates outside the stream while capturing), the second is captured and
 * launched, later ones replay it. A step that cannot be captured turns graphs off for the run. */
static zt_status run_graphed(gen_model *m, const unit_args *u, zt_error *err)
{
    zt_status st = m->attention.ops->kv_prepare(m->attention.state, m->kv, u->seq_ids, u->n_seqs, u->n_new);
    if (st != ZT_OK) return zt_plugin_failed(m->attention_lp, st, err, "kv_prepare(%d sequences)", (int)u->n_seqs);
    gen_graph *g = &m->graphs[u->n_seqs];
    if (g->exec && (g->sampled != u->sampled || g->n_draw != u->n_draw)) { /* another head call: capture again */
        zt_runtime_graph_destroy(m->rt, g->exec);
        g->exec = NULL;
    }
    if (g->exec) {
        m->graph_replays++;
        return zt_runtime_graph_launch(m->rt, g->exec, err);
    }
    if (!g->warm) {
        g->warm = 1;
        return enqueue_units(m, u, err);
    }
    zt_error why = {0};
    void *exec = NULL;
    if ((st = zt_runtime_capture_begin(m->rt, &why)) == ZT_OK) {
        zt_status enqueued = enqueue_units(m, u, &why);
        zt_error ended = {0};
        st = zt_runtime_capture_end(m->rt, &exec, &ended);
        if (enqueued != ZT_OK) st = enqueued;
        else if (st != ZT_OK) why = ended;
    }
    if (st == ZT_OK) {
        *g = (gen_graph){.exec = exec, .warm = 1, .sampled = u->sampled, .n_draw = u->n_draw};
        m->graph_captures++;
        m->graph_replays++;
        return zt_runtime_graph_launch(m->rt, exec, err);
    }
    zt_runtime_graph_destroy(m->rt, exec);
    zt_log(ZT_LOG_WARN, "CUDA graphs off for the rest of this run: capturing the decode step of %d sequences "
           "failed: %s. Each step launches its kernels instead (the same tokens); generate.cuda_graphs = false "
           "skips the attempt", (int)u->n_seqs, why.msg);
    release_graphs(m);
    m->cuda_graphs = 0;
    return enqueue_units(m, u, err);
}

/* gen_model_run and gen_model_run_sampled: with rows, the head samples into next[] (n_draw ids). */
static zt_status run_units(gen_model *m, const int32_t *seq_ids, int32_t n_seqs, const int32_t *tokens,
                           int32_t n_new, const int32_t *start, const zt_sample_row *rows, int32_t n_draw,
                           int32_t *next, zt_error *err)
{
    const zt_model_info *info = m->info;
    int32_t n = n_seqs * n_new;
    if (n_seqs < 1 || n_new < 1 || n_seqs > m->max_seqs || n > m->rows || (n_seqs > 1 && n_new > 1))
        return zt_error_set(err, ZT_ERR_INTERNAL, "gen_model_run: %d sequences of %d tokens do not fit the %d rows "
                            "of %d sequences (a host bug)", (int)n_seqs, (int)n_new, (int)m->rows, (int)m->max_seqs);
    memcpy(m->tokens, tokens, (size_t)n * sizeof *tokens);
    for (int32_t i = 0; i < n_seqs; i++) {
        for (int32_t t = 0; t < n_new; t++) {
            m->positions[i * n_new + t] = start[i] + t;
            m->targets[i * n_new + t] = -100;
            m->doc_ids[i * n_new + t] = 0;
        }
        m->cu_seqlens[i] = i * n_new;
    }
    m->cu_seqlens[n_seqs] = n;
    int32_t used = n_seqs + 1;
    if (n_new > 1) { /* the head's cu_seqlens, see below */
        m->cu_seqlens[2] = 0;
        m->cu_seqlens[3] = 1;
        used = 4;
    }
    /* The units read the batch where they run: on a GPU its copy, at the same offsets. */
    int32_t *ints = m->batch_ints;
#define IN_UNITS(p) (ints + ((p) - m->batch_ints))
    if (m->on_gpu) {
        zt_status st = zt_runtime_memcpy(m->rt, m->device_batch, m->batch_ints,
                                         (uint64_t)(m->cu_seqlens + used - m->batch_ints) * sizeof(int32_t), err);
        if (st != ZT_OK) return st;
        ints = m->device_batch;
    }
    zt_batch whole = {.struct_size = sizeof whole,
                      .batch = n_seqs,
                      .seq_len = n_new,
                      .n_docs = n_seqs,
                      .tokens = IN_UNITS(m->tokens),
                      .targets = IN_UNITS(m->targets),
                      .positions = IN_UNITS(m->positions),
                      .doc_ids = IN_UNITS(m->doc_ids),
                      .cu_seqlens = IN_UNITS(m->cu_seqlens),
                      .max_doc_len = n_new,
                      .n_loss_tokens_global = 1};
#undef IN_UNITS
    /* The head's batch: the last token of each sequence (all of them when each runs one). After a
     * prompt (n_seqs 1) its cu_seqlens {0, 1} are entries 2 and 3 of the block's (room for them
     * is allocated). */
    zt_batch last = whole;
    if (n_new > 1) {
        last.seq_len = 1;
        last.n_docs = 1;
        last.tokens += n_new - 1;
        last.targets += n_new - 1;
        last.positions += n_new - 1;
        last.doc_ids += n_new - 1;
        last.cu_seqlens = whole.cu_seqlens + 2;
        last.max_doc_len = 1;
    }
    unit_args u = {.seq_ids = seq_ids, .n_seqs = n_seqs, .n_new = n_new, .whole = &whole, .last = &last,
                   .sampled = rows != NULL, .n_draw = n_draw};
    zt_status st = m->cuda_graphs && n_new == 1 ? run_graphed(m, &u, err) : enqueue_units(m, &u, err);
    if (st != ZT_OK) return st;
    st = m->attention.ops->kv_advance(m->attention.state, m->kv, seq_ids, n_seqs, n_new);
    if (st != ZT_OK) return zt_plugin_failed(m->attention_lp, st, err, "kv_advance(%d tokens)", (int)n_new);
    if (rows) { /* n int32 back instead of the logits */
        /* Into page-locked memory the copy is asynchronous: the step's one wait is here (it also
         * frees m->sample_rows for the next step's rows). */
        if ((st = zt_runtime_memcpy(m->rt, m->sampled, m->device_sampled, (uint64_t)n_seqs * sizeof *m->sampled,
                                    err)) != ZT_OK ||
            (st = zt_runtime_sync(m->rt, err)) != ZT_OK)
            return st;
        for (int32_t i = 0; i < n_seqs; i++) {
            if (m->sampled[i] < 0 || m->sampled[i] >= n_draw)
                return zt_error_set(err, ZT_ERR_INTERNAL,
                                    "the model's logits at position %d are not finite (the device sampler drew %d): "
                                    "the weights are broken (a diverged training run?)",
                                    (int)(start[i] + n_new - 1), (int)m->sampled[i]);
            next[i] = m->sampled[i];
        }
        return ZT_OK;
    }
    if (m->on_gpu && (st = zt_runtime_memcpy(m->rt, m->logits, m->device_logits,
                                             (uint64_t)n_seqs * (uint64_t)info->vocab_size * sizeof(float), err)) != ZT_OK)
        return st;
    for (int64_t v = 0; v < (int64_t)n_seqs * info->vocab_size; v++)
        if (isnan(m->logits[v]) || m->logits[v] == INFINITY)
            return zt_error_set(err, ZT_ERR_INTERNAL,
                                "the model's logits at position %d are not finite (logit %d is %g): the weights are "
                                "broken (a diverged training run?)",
                                (int)(start[v / info->vocab_size] + n_new - 1), (int)(v % info->vocab_size),
                                m->logits[v]);
    return ZT_OK;
}

zt_status gen_model_run(gen_model *m, const int32_t *seq_ids, int32_t n_seqs, const int32_t *tokens, int32_t n_new,
                        const int32_t *start, zt_error *err)
{
    return run_units(m, seq_ids, n_seqs, tokens, n_new, start, NULL, 0, NULL, err);
}

zt_status gen_model_run_sampled(gen_model *m, const int32_t *seq_ids, int32_t n_seqs, const int32_t *tokens,
                                int32_t n_new, const int32_t *start, const zt_sample_row *rows, int32_t n_draw,
                                int32_t *next, zt_error *err)
{
    if (!m->device_sampling || n_seqs < 1 || n_seqs > m->max_seqs || n_draw < 1 || n_draw > m->info->vocab_size)
        return zt_error_set(err, ZT_ERR_INTERNAL, "gen_model_run_sampled: device sampling is off or %d rows of %d "
                            "drawable ids do not fit (a host bug)", (int)n_seqs, (int)n_draw);
    if (rows != m->sample_rows) memcpy(m->sample_rows, rows, (size_t)n_seqs * sizeof *rows);
    zt_status st = zt_runtime_memcpy(m->rt, m->device_sample_rows, m->sample_rows,
                                     (uint64_t)n_seqs * sizeof *rows, err);
    return st == ZT_OK ? run_units(m, seq_ids, n_seqs, tokens, n_new, start, m->sample_rows, n_draw, next, err) : st;
}

zt_sample_row gen_sample_row(zt_sampler *s)
{
    zt_sample_row r = {.temperature = s->temperature, .top_p = s->top_p, .top_k = s->top_k};
    r.u = zt_sampler_draw_u(s);
    return r;
}

zt_status gen_model_step(gen_model *m, const int32_t *tokens, int32_t n, zt_error *err)
{
    static const int32_t seq0 = 0;
    zt_status st = gen_model_run(m, &seq0, 1, tokens, n, &m->n_cached, err);
    if (st == ZT_OK) m->n_cached += n;
    return st;
}

zt_status gen_model_step_sampled(gen_model *m, const int32_t *tokens, int32_t n, const zt_sample_row *row,
                                 int32_t n_draw, int32_t *next, zt_error *err)
{
    static const int32_t seq0 = 0;
    zt_status st = gen_model_run_sampled(m, &seq0, 1, tokens, n, &m->n_cached, row, n_draw, next, err);
    if (st == ZT_OK) m->n_cached += n;
    return st;
}

/* The first calls of a process load each kernel's module, pick cuBLASLt algorithms and grow the
 * memory pool (0.1 s and more on a 7B model); without this they land in the first record's time to
 * first token. The PyTorch peer times a generate() call after untimed ones, and vLLM profiles a run
 * and captures its graphs at start-up, for the same reason. Nothing of it reaches an answer: the
 * tokens are zeros, the sequence's cache is freed (paged publishes only prompts given by
 * kv_prefix, which this is not), and the samplers draw nothing from any record's generator. */
zt_status gen_model_warmup(gen_model *m, int32_t n_prompt, int32_t n_draw, zt_error *err)
{
    const zt_attention_ops *ops = m->attention.ops;
    if (!m->warmup || !m->on_gpu || m->seq_tokens < 5 || !ops->kv_reset) return ZT_OK;
    int32_t n = n_prompt < m->seq_tokens - 3 ? n_prompt : m->seq_tokens - 3;
    if (n < 1) n = 1;
    int32_t *zeros = calloc((size_t)n, sizeof *zeros), seq = 0, next = 0;
    if (!zeros) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the warm-up prompt");
    double t0 = zt_now_s();
    zt_status st = ZT_OK;
    if (ops->struct_size >= ZT_ATTENTION_OPS_SIZE_1_3 && ops->kv_reserve &&
        (st = ops->kv_reserve(m->attention.state, m->kv, &seq, 1, n + 3)) != ZT_OK)
        st = zt_plugin_failed(m->attention_lp, st, err, "kv_reserve(warm-up, %d tokens)", (int)(n + 3));
    zt_sample_row greedy = {.temperature = 0, .top_p = 1};
    for (int32_t step = 0, start = 0; step < 4 && st == ZT_OK; step++) {
        int32_t len = step == 0 ? n : 1;
        st = m->device_sampling ? gen_model_run_sampled(m, &seq, 1, zeros, len, &start, &greedy, n_draw, &next, err)
                                : gen_model_run(m, &seq, 1, zeros, len, &start, err);
        start += len;
    }
    free(zeros);
    zt_status reset = ops->kv_reset ? ops->kv_reset(m->attention.state, m->kv, seq) : ZT_OK;
    if (st == ZT_OK && reset != ZT_OK) st = zt_plugin_failed(m->attention_lp, reset, err, "kv_reset(warm-up)");
    if (st == ZT_OK) st = zt_runtime_sync(m->rt, err);
    if (st == ZT_OK)
        zt_log(ZT_LOG_INFO, "warm-up (generate.warmup): a %d-token prompt and 3 steps in %.2f s, before the clock starts",
               (int)n, zt_now_s() - t0);
    m->n_cached = 0;
    m->graph_replays = 0; /* --stats counts the steps of the answers */
    return st;
}

zt_status gen_model_kv_stats(gen_model *m, int32_t seq_id, zt_kv_stats *out, zt_error *err)
{
    const zt_attention_ops *ops = m->attention.ops;
    if (ops->struct_size < ZT_ATTENTION_OPS_SIZE_1_3 || !ops->kv_stats) return ZT_ERR_UNSUPPORTED;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    zt_status st = ops->kv_stats(m->attention.state, m->kv, seq_id, out);
    return st == ZT_OK ? ZT_OK : zt_plugin_failed(m->attention_lp, st, err, "kv_stats(%d)", (int)seq_id);
}

void gen_model_log_kv(gen_model *m, int64_t finished, int64_t finished_slots, int64_t finished_tokens)
{
    zt_kv_stats k;
    zt_error err = {0};
    if (gen_model_kv_stats(m, -1, &k, &err) != ZT_OK) return;
    int64_t wasted = finished_slots - finished_tokens;
    zt_log(ZT_LOG_INFO,
           "KV cache (%s): %d-token blocks, %lld blocks (%.2f MiB); peak %lld used; at the end %lld used + %lld free = "
           "%lld (refcount sum %lld, %lld cached prefix blocks); wasted slots %lld of %lld (%.2f%%) over %lld "
           "sequences; prefix sharing: %lld prompt tokens found cached, %lld copy-on-write copies",
           m->attention_lp->desc.name, (int)k.block_size, (long long)k.total_blocks, (double)k.bytes / 1048576.0,
           (long long)k.peak_used_blocks, (long long)k.used_blocks, (long long)k.free_blocks,
           (long long)k.total_blocks, (long long)k.refcount_sum, (long long)k.cached_blocks, (long long)wasted,
           (long long)finished_slots, finished_slots ? 100.0 * (double)wasted / (double)finished_slots : 0.0,
           (long long)finished, (long long)k.prefix_hit_tokens, (long long)k.cow_copies);
}
