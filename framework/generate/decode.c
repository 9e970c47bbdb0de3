/* zt-run --generate: the model against its KV cache. The weights are loaded into host memory (a
 * tied parameter views its owner's storage), then each call runs tokens through every unit, forward
 * only, appending their keys and values to the attention plugin's cache. */
#include "generate/generate_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the model against its KV cache ----------------------------------------------------------- */

static int64_t numel(const zt_param_decl *p)
{
    int64_t n = 1;
    for (int32_t d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static zt_tensor view_of(float *data, int ndim, const int64_t *shape)
{
    zt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = ZT_F32;
    t.device_type = ZT_DEVICE_CPU;
    t.ndim = ndim;
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = stride;
        stride *= shape[d];
    }
    return t;
}

static void *model_alloc(gen_model *m, int pool, uint64_t bytes, const char *tag, zt_error *err)
{
    return zt_runtime_alloc(m->rt, pool, ZT_MEM_HOST, bytes ? bytes : 1, 0, tag, err);
}

zt_status gen_read_hf(void *source, const zt_param_decl *p, float *dst, zt_error *err)
{
    return zt_hf_model_read(source, p->name, p->ndim, p->shape, 0, (uint64_t)numel(p), dst, err);
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
    int64_t total = 0;
    for (int32_t i = 0; i < np; i++) {
        offset[i] = -1;
        if (info->params[i].flags & ZT_PARAM_TIED) continue;
        offset[i] = total;
        total += numel(&info->params[i]);
    }
    m->weights = model_alloc(m, ZT_POOL_PARAMS, (uint64_t)total * sizeof(float), "model weights", err);
    zt_status st = m->weights ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
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
        m->views[i] = view_of(m->weights + offset[owner], p->ndim, p->shape);
        if (owner == i) st = read(source, p, m->weights + offset[i], err);
    }
    free(offset);
    return st;
}

zt_status gen_model_prepare(gen_model *m, int32_t capacity, zt_error *err)
{
    const zt_model_info *info = m->info;
    uint64_t hidden_bytes = (uint64_t)capacity * (uint64_t)info->hidden_size * sizeof(float);
    for (int i = 0; i < 2; i++)
        if (!(m->hidden[i] = model_alloc(m, ZT_POOL_ACTIVATIONS, hidden_bytes, "unit outputs", err)))
            return ZT_ERR_OUT_OF_MEMORY;
    m->logits = model_alloc(m, ZT_POOL_ACTIVATIONS, (uint64_t)info->vocab_size * sizeof(float), "logits", err);
    m->positions = model_alloc(m, ZT_POOL_OTHER, (uint64_t)capacity * sizeof(int32_t), "positions", err);
    m->targets = model_alloc(m, ZT_POOL_OTHER, (uint64_t)capacity * sizeof(int32_t), "targets", err);
    m->doc_ids = model_alloc(m, ZT_POOL_OTHER, (uint64_t)capacity * sizeof(int32_t), "document ids", err);
    if (!m->logits || !m->positions || !m->targets || !m->doc_ids) return ZT_ERR_OUT_OF_MEMORY;
    zt_kv_cache_desc d = {.struct_size = sizeof d,
                          .n_layers = info->n_layers,
                          .n_kv_heads = info->n_kv_heads,
                          .head_dim = info->head_dim,
                          .max_seqs = 1,
                          .max_tokens = capacity,
                          .dtype = ZT_F32};
    zt_status st = m->attention.ops->kv_create(m->attention.state, &d, &m->kv);
    return st == ZT_OK ? ZT_OK : zt_plugin_failed(m->attention_lp, st, err, "kv_create(%d tokens)", (int)capacity);
}

void gen_model_free(gen_model *m)
{
    if (!m->rt) return;
    if (m->kv) m->attention.ops->kv_destroy(m->attention.state, m->kv);
    void *buffers[] = {m->weights, m->views, m->unit_first, m->hidden[0], m->hidden[1], m->logits,
                       m->positions, m->targets, m->doc_ids};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) zt_runtime_free(m->rt, buffers[i]);
    memset(m, 0, sizeof *m);
}

zt_status gen_model_step(gen_model *m, const int32_t *tokens, int32_t n, zt_error *err)
{
    const zt_model_info *info = m->info;
    static const int32_t seq0 = 0;
    for (int32_t t = 0; t < n; t++) {
        m->positions[t] = m->n_cached + t;
        m->targets[t] = -100;
        m->doc_ids[t] = 0;
    }
    int32_t all[2] = {0, n}, one[2] = {0, 1};
    zt_batch whole = {.struct_size = sizeof whole,
                      .batch = 1,
                      .seq_len = n,
                      .n_docs = 1,
                      .tokens = tokens,
                      .targets = m->targets,
                      .positions = m->positions,
                      .doc_ids = m->doc_ids,
                      .cu_seqlens = all,
                      .max_doc_len = n,
                      .n_loss_tokens_global = 1};
    zt_batch last = whole;
    last.seq_len = 1;
    last.tokens += n - 1;
    last.targets += n - 1;
    last.positions += n - 1;
    last.doc_ids += n - 1;
    last.cu_seqlens = one;
    last.max_doc_len = 1;
    int64_t H = info->hidden_size, hidden_shape[3] = {1, n, H}, last_shape[3] = {1, 1, H},
            logits_shape[3] = {1, 1, info->vocab_size};
    int cur = 0; /* hidden[cur] holds the input of the unit about to run */
    int32_t head = info->n_units - 1;
    for (int32_t u = 0; u <= head; u++) {
        zt_unit_call c = {.struct_size = sizeof c,
                          .unit = u,
                          .n_params = m->unit_first[u + 1] - m->unit_first[u],
                          .params = m->views + m->unit_first[u],
                          .batch = u == head ? &last : &whole,
                          .attention = &m->attention,
                          .kv = m->kv,
                          .kv_seq_ids = &seq0};
        if (u == head) {
            c.x_in = view_of(m->hidden[cur] + (int64_t)(n - 1) * H, 3, last_shape);
            c.x_out = view_of(m->logits, 3, logits_shape);
        } else {
            if (u > 0) c.x_in = view_of(m->hidden[cur], 3, hidden_shape);
            c.x_out = view_of(m->hidden[1 - cur], 3, hidden_shape);
        }
        zt_status st = m->ops->forward(m->model_lp->state, &c);
        if (st != ZT_OK) return zt_plugin_failed(m->model_lp, st, err, "forward of unit %d (generation)", (int)u);
        cur = 1 - cur;
    }
    zt_status st = m->attention.ops->kv_advance(m->attention.state, m->kv, &seq0, 1, n);
    if (st != ZT_OK) return zt_plugin_failed(m->attention_lp, st, err, "kv_advance(%d tokens)", (int)n);
    m->n_cached += n;
    for (int32_t v = 0; v < info->vocab_size; v++)
        if (isnan(m->logits[v]) || m->logits[v] == INFINITY)
            return zt_error_set(err, ZT_ERR_INTERNAL,
                                "the model's logits at position %d are not finite (logit %d is %g): the weights are "
                                "broken (a diverged training run?)",
                                (int)(m->n_cached - 1), (int)v, m->logits[v]);
    return ZT_OK;
}
