/* See model_harness.h. */
#include "model_harness.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "safetensors_min.h"

/* ---- plugins ----------------------------------------------------------------------------------- */

void mh_close(mh_env *e)
{
    /* The reverse of the order a run initializes them in: the model after its attention. */
    zt_plugin_unload(&e->model_plugin);
    zt_plugin_unload(&e->attention_plugin);
    zt_runtime_destroy(e->rt);
    zt_config_free(e->cfg);
    zt_registry_free(e->registry);
    memset(e, 0, sizeof *e);
}

static zt_status load_plugin(mh_env *e, const char *name, int kind, zt_loaded_plugin *lp, zt_error *err)
{
    zt_status st = zt_plugin_load(e->registry, name, lp, err);
    if (st != ZT_OK) return st;
    if (lp->plugin->kind != kind)
        return zt_error_set(err, ZT_ERR_FORMAT, "the plugin named %s is a %s plugin, not a %s plugin", name,
                            zt_kind_name(lp->plugin->kind), zt_kind_name(kind));
    return zt_config_add_schema(e->cfg, name, lp->plugin->options, lp->plugin->n_options, err);
}

zt_status mh_open(mh_env *e, const char *plugins_d, const char *config_json, int n_threads, zt_error *err)
{
    return mh_open_ranks(e, plugins_d, config_json, n_threads, 1, err);
}

zt_status mh_open_ranks(mh_env *e, const char *plugins_d, const char *config_json, int n_threads, int single_process,
                        zt_error *err)
{
    memset(e, 0, sizeof *e);
    const char *dirs[] = {plugins_d};
    zt_status st = zt_registry_scan(dirs, 1, &e->registry, err);
    e->cfg = st == ZT_OK ? zt_config_new() : NULL;
    if (st == ZT_OK && !e->cfg) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "zt_config_new failed");
    uint32_t n_host = 0;
    const zt_option *host_options = zt_host_options(&n_host);
    if (st == ZT_OK) st = zt_config_add_schema(e->cfg, "host", host_options, n_host, err);
    if (st == ZT_OK) st = load_plugin(e, "llama", ZT_KIND_MODEL, &e->model_plugin, err);
    if (st == ZT_OK) st = load_plugin(e, "naive", ZT_KIND_ATTENTION, &e->attention_plugin, err);
    if (st == ZT_OK) st = zt_config_load_string(e->cfg, config_json, "test config", err);
    if (st == ZT_OK) st = zt_config_validate(e->cfg, err);
    zt_runtime_options opt = {.n_threads = n_threads, .device_type = ZT_DEVICE_CPU, .single_process = single_process};
    if (st == ZT_OK) st = zt_runtime_create(&opt, e->cfg, &e->rt, err);
    if (st == ZT_OK) st = zt_plugin_probe(&e->attention_plugin, e->rt, err);
    if (st == ZT_OK) st = zt_plugin_probe(&e->model_plugin, e->rt, err);
    if (st == ZT_OK) st = zt_plugin_init(&e->attention_plugin, e->rt, err);
    if (st == ZT_OK) st = zt_plugin_init(&e->model_plugin, e->rt, err);
    if (st != ZT_OK) {
        mh_close(e);
        return st;
    }
    e->model = e->model_plugin.plugin->ops;
    e->model_state = e->model_plugin.state;
    e->info = e->model->info(e->model_state);
    e->attention.ops = e->attention_plugin.plugin->ops;
    e->attention.state = e->attention_plugin.state;
    e->attention.caps = e->attention_plugin.plugin->caps;
    return ZT_OK;
}

const char *mh_model_error(mh_env *e)
{
    return zt_runtime_take_error(e->model_plugin.host, NULL);
}

const char *mh_attention_error(mh_env *e)
{
    return zt_runtime_take_error(e->attention_plugin.host, NULL);
}

/* ---- files ------------------------------------------------------------------------------------- */

char *mh_read_file(const char *path, size_t *len, zt_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        zt_error_set(err, ZT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *text = NULL;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size >= 0 && fseek(f, 0, SEEK_SET) == 0) text = malloc((size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) {
        zt_error_set(err, ZT_ERR_IO, "cannot read %s", path);
        free(text);
        fclose(f);
        return NULL;
    }
    fclose(f);
    text[size] = '\0';
    if (len) *len = (size_t)size;
    return text;
}

/* A growing JSON text. */
typedef struct text_buf {
    char s[4096];
    size_t used;
} text_buf;

static void put(text_buf *t, const char *fmt, ...) ZT_PRINTF(2, 3);
static void put(text_buf *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (t->used < sizeof t->s) t->used += (size_t)vsnprintf(t->s + t->used, sizeof t->s - t->used, fmt, ap);
    va_end(ap);
}

/* Copies `key` of object `obj` as `"name": value` when it is a number or a boolean. */
static void copy_value(text_buf *t, const zt_json *j, int obj, const char *key, const char *name, int *first)
{
    int tok = zt_json_object_get(j, obj, key);
    if (tok < 0 || zt_json_is_null(j, tok)) return;
    const zt_json_tok *v = &j->tok[tok];
    put(t, "%s\"%s\": %.*s", *first ? "" : ", ", name, v->end - v->start, j->text + v->start);
    *first = 0;
}

char *mh_config_from_hf(const char *model_dir, zt_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    size_t len = 0;
    char *text = mh_read_file(path, &len, err);
    if (!text) return NULL;
    zt_json j;
    char *out = NULL;
    if (zt_json_parse(text, len, path, &j, err) != ZT_OK) {
        free(text);
        return NULL;
    }
    static const char *const plain[] = {
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
        "tie_word_embeddings", "initializer_range",
    };
    text_buf t = {.used = 0};
    int first = 1;
    put(&t, "{\"model\": {");
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) copy_value(&t, &j, 0, plain[i], plain[i], &first);
    /* transformers 5 keeps theta and scaling in rope_parameters, 4 in rope_theta and rope_scaling. */
    int rope = zt_json_object_get(&j, 0, "rope_parameters");
    if (rope < 0 || j.tok[rope].type != ZT_JSON_OBJECT) rope = zt_json_object_get(&j, 0, "rope_scaling");
    if (rope >= 0 && j.tok[rope].type == ZT_JSON_OBJECT) {
        copy_value(&t, &j, rope, "rope_theta", "rope_theta", &first);
        int type = zt_json_object_get(&j, rope, "rope_type");
        if (type < 0) type = zt_json_object_get(&j, rope, "type");
        if (type >= 0 && zt_json_eq(&j, type, "llama3")) {
            put(&t, ", \"rope_scaling\": {\"rope_type\": \"llama3\"");
            int not_first = 0;
            copy_value(&t, &j, rope, "factor", "factor", &not_first);
            copy_value(&t, &j, rope, "low_freq_factor", "low_freq_factor", &not_first);
            copy_value(&t, &j, rope, "high_freq_factor", "high_freq_factor", &not_first);
            copy_value(&t, &j, rope, "original_max_position_embeddings", "original_max_position_embeddings",
                       &not_first);
            put(&t, "}");
        } else if (type >= 0 && !zt_json_eq(&j, type, "default")) {
            zt_error_set(err, ZT_ERR_UNSUPPORTED, "%s: rope type %.*s is not one the llama plugin implements", path,
                         j.tok[type].end - j.tok[type].start, j.text + j.tok[type].start);
            goto done;
        }
    }
    put(&t, "}}");
    if (t.used >= sizeof t.s) {
        zt_error_set(err, ZT_ERR_INTERNAL, "%s: the converted config does not fit the test's buffer", path);
        goto done;
    }
    out = strdup(t.s);
done:
    zt_json_free(&j);
    free(text);
    return out;
}

/* ---- parameters -------------------------------------------------------------------------------- */

int32_t mh_param_index(const mh_env *e, const char *name)
{
    for (int32_t i = 0; i < e->info->n_params_decl; i++)
        if (strcmp(e->info->params[i].name, name) == 0) return i;
    return -1;
}

static int64_t decl_numel(const zt_param_decl *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= d->shape[i];
    return n;
}

void mh_params_free(mh_params *p)
{
    for (int32_t i = 0; i < p->n && p->owner; i++) {
        if (p->owner[i] != i) continue;
        free(p->value[i]);
        free(p->grad[i]);
    }
    free(p->value);
    free(p->grad);
    free(p->numel);
    free(p->owner);
    free(p->shape);
    memset(p, 0, sizeof *p);
}

zt_status mh_params_alloc_shards(const mh_env *e, const mh_params *full, mh_params *p, zt_error *err)
{
    memset(p, 0, sizeof *p);
    int32_t n = e->info->n_params_decl;
    p->n = n;
    p->value = calloc((size_t)n, sizeof *p->value);
    p->grad = calloc((size_t)n, sizeof *p->grad);
    p->numel = calloc((size_t)n, sizeof *p->numel);
    p->owner = calloc((size_t)n, sizeof *p->owner);
    p->shape = calloc((size_t)n, sizeof *p->shape);
    if (!p->value || !p->grad || !p->numel || !p->owner || !p->shape) goto oom;
    for (int32_t i = 0; i < n; i++) {
        const zt_param_decl *d = &e->info->params[i];
        zt_param_shard sh = {.struct_size = sizeof sh};
        if (e->model->param_shard(e->model_state, i, &sh) != ZT_OK) {
            mh_params_free(p);
            return zt_error_set(err, ZT_ERR_INTERNAL, "param_shard of %s failed: %s", d->name,
                                zt_runtime_take_error(e->model_plugin.host, NULL));
        }
        for (int k = 0; k < 4; k++) p->shape[i][k] = d->shape[k];
        if (sh.split_dim >= 0) p->shape[i][sh.split_dim] = sh.extent;
        p->numel[i] = 1;
        for (int k = 0; k < d->ndim; k++) p->numel[i] *= p->shape[i][k];
        p->owner[i] = full->owner[i];
        if (p->owner[i] != i) {
            p->value[i] = p->value[p->owner[i]];
            p->grad[i] = p->grad[p->owner[i]];
            continue;
        }
        p->value[i] = calloc((size_t)p->numel[i], sizeof(float));
        p->grad[i] = calloc((size_t)p->numel[i], sizeof(float));
        if (!p->value[i] || !p->grad[i]) goto oom;
        int64_t rows = d->shape[0], cols = d->ndim == 2 ? d->shape[1] : 1;
        for (int64_t row = 0; row < rows; row++) {
            for (int64_t col = 0; col < cols; col++) {
                int64_t lr = row, lc = col, lcols = cols;
                if (sh.split_dim == 0) lr = row - sh.offset;
                if (sh.split_dim == 1) lc = col - sh.offset, lcols = sh.extent;
                int64_t in_extent = sh.split_dim == 0 ? lr : lc;
                if (sh.split_dim >= 0 && (in_extent < 0 || in_extent >= sh.valid)) continue;
                p->value[i][lr * lcols + lc] = full->value[i][row * cols + col];
            }
        }
    }
    return ZT_OK;
oom:
    mh_params_free(p);
    return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the parameter shards");
}

zt_status mh_params_alloc(const mh_env *e, mh_params *p, zt_error *err)
{
    memset(p, 0, sizeof *p);
    int32_t n = e->info->n_params_decl;
    p->n = n;
    p->value = calloc((size_t)n, sizeof *p->value);
    p->grad = calloc((size_t)n, sizeof *p->grad);
    p->numel = calloc((size_t)n, sizeof *p->numel);
    p->owner = calloc((size_t)n, sizeof *p->owner);
    if (!p->value || !p->grad || !p->numel || !p->owner) goto oom;
    for (int32_t i = 0; i < n; i++) {
        const zt_param_decl *d = &e->info->params[i];
        p->numel[i] = decl_numel(d);
        p->owner[i] = i;
        if (d->flags & ZT_PARAM_TIED) {
            int32_t owner = d->tied_to ? mh_param_index(e, d->tied_to) : -1;
            if (owner < 0 || owner >= i || decl_numel(&e->info->params[owner]) != p->numel[i]) {
                mh_params_free(p);
                return zt_error_set(err, ZT_ERR_FORMAT, "%s is tied to '%s', which is not an earlier declaration "
                                    "of the same size", d->name, d->tied_to ? d->tied_to : "(NULL)");
            }
            p->owner[i] = owner;
            p->value[i] = p->value[owner];
            p->grad[i] = p->grad[owner];
            continue;
        }
        p->value[i] = malloc((size_t)p->numel[i] * sizeof(float));
        p->grad[i] = calloc((size_t)p->numel[i], sizeof(float));
        if (!p->value[i] || !p->grad[i]) goto oom;
    }
    return ZT_OK;
oom:
    mh_params_free(p);
    return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the parameters");
}

zt_status mh_params_load(const mh_env *e, mh_params *p, const char *safetensors_path, zt_error *err)
{
    ref_st_file f;
    zt_status st = ref_st_open(safetensors_path, &f, err);
    if (st != ZT_OK) return st;
    int owned = 0;
    for (int32_t i = 0; i < p->n && st == ZT_OK; i++) {
        if (p->owner[i] != i) continue;
        owned++;
        const zt_param_decl *d = &e->info->params[i];
        float *values = NULL;
        st = ref_st_read_f32(&f, d->name, d->ndim, d->shape, &values, err);
        if (st == ZT_OK) memcpy(p->value[i], values, (size_t)p->numel[i] * sizeof(float));
        free(values);
    }
    if (st == ZT_OK && f.n_tensors != owned)
        st = zt_error_set(err, ZT_ERR_FORMAT, "%s holds %d tensors but the model declares %d with storage",
                          safetensors_path, f.n_tensors, owned);
    ref_st_close(&f);
    return st;
}

void mh_grads_zero(const mh_env *e, mh_params *p)
{
    (void)e;
    for (int32_t i = 0; i < p->n; i++)
        if (p->owner[i] == i) memset(p->grad[i], 0, (size_t)p->numel[i] * sizeof(float));
}

/* ---- batches ----------------------------------------------------------------------------------- */

void mh_batch_free(mh_batch *b)
{
    free(b->tokens);
    free(b->targets);
    free(b->positions);
    free(b->doc_ids);
    free(b->cu_seqlens);
    memset(b, 0, sizeof *b);
}

zt_status mh_batch_make(mh_batch *b, int32_t B, int32_t T, const int32_t *tokens, const int32_t *labels,
                        const int32_t *doc_ids, int64_t n_loss_tokens_global, zt_error *err)
{
    memset(b, 0, sizeof *b);
    size_t n = (size_t)B * (size_t)T;
    b->tokens = malloc(n * sizeof(int32_t));
    b->targets = malloc(n * sizeof(int32_t));
    b->positions = malloc(n * sizeof(int32_t));
    b->doc_ids = malloc(n * sizeof(int32_t));
    b->cu_seqlens = malloc((n + 1) * sizeof(int32_t));
    if (!b->tokens || !b->targets || !b->positions || !b->doc_ids || !b->cu_seqlens) {
        mh_batch_free(b);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for a batch");
    }
    memcpy(b->tokens, tokens, n * sizeof(int32_t));
    int32_t n_docs = 0, max_doc_len = 0;
    int64_t loss_tokens = 0;
    for (int32_t row = 0; row < B; row++) {
        for (int32_t t = 0; t < T; t++) {
            size_t i = (size_t)row * (size_t)T + (size_t)t;
            b->doc_ids[i] = doc_ids ? doc_ids[i] : 0;
            int starts = t == 0 || b->doc_ids[i] != b->doc_ids[i - 1];
            b->positions[i] = starts ? 0 : b->positions[i - 1] + 1;
            if (starts) b->cu_seqlens[n_docs++] = (int32_t)i;
            /* HF shifts inside the model: position t predicts labels[t + 1]. */
            b->targets[i] = labels && t + 1 < T ? labels[i + 1] : -100;
            loss_tokens += b->targets[i] != -100;
        }
    }
    b->cu_seqlens[n_docs] = (int32_t)n;
    for (int32_t d = 0; d < n_docs; d++) {
        int32_t doc_len = b->cu_seqlens[d + 1] - b->cu_seqlens[d];
        if (doc_len > max_doc_len) max_doc_len = doc_len;
    }
    b->batch = (zt_batch){
        .struct_size = sizeof(zt_batch), .batch = B, .seq_len = T, .n_docs = n_docs, .tokens = b->tokens,
        .targets = b->targets, .positions = b->positions, .doc_ids = b->doc_ids, .cu_seqlens = b->cu_seqlens,
        .max_doc_len = max_doc_len,
        .n_loss_tokens_global = n_loss_tokens_global ? n_loss_tokens_global : loss_tokens,
    };
    return ZT_OK;
}

/* ---- running the units ------------------------------------------------------------------------- */

zt_tensor mh_view(void *data, int ndim, const int64_t *shape)
{
    zt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = ZT_F32;
    t.device_type = ZT_DEVICE_CPU;
    t.ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = stride;
        stride *= shape[i];
    }
    return t;
}

static void poison(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
}

void mh_run_free(mh_run *r)
{
    for (int32_t u = 0; r->hidden && u < r->n_units; u++) {
        free(r->hidden[u]);
        free(r->grad_hidden[u]);
    }
    free(r->hidden);
    free(r->grad_hidden);
    free(r->saved);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

zt_status mh_run_alloc(const mh_env *e, const mh_batch *b, mh_run *r, zt_error *err)
{
    memset(r, 0, sizeof *r);
    r->n_units = e->info->n_units;
    r->tokens = (int64_t)b->batch.batch * b->batch.seq_len;
    r->hidden = calloc((size_t)r->n_units, sizeof *r->hidden);
    r->grad_hidden = calloc((size_t)r->n_units, sizeof *r->grad_hidden);
    r->saved = calloc((size_t)r->n_units, sizeof *r->saved);
    r->logits = malloc((size_t)r->tokens * (size_t)e->info->vocab_size * sizeof(float));
    int ok = r->hidden && r->grad_hidden && r->saved && r->logits;
    for (int32_t u = 0; ok && u < r->n_units - 1; u++) {
        r->hidden[u] = malloc((size_t)r->tokens * (size_t)e->info->hidden_size * sizeof(float));
        r->grad_hidden[u] = malloc((size_t)r->tokens * (size_t)e->info->hidden_size * sizeof(float));
        ok = r->hidden[u] && r->grad_hidden[u];
    }
    if (ok) return ZT_OK;
    mh_run_free(r);
    return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the hidden states");
}

/* The declarations of unit u: [*first, *first + *count). */
static void unit_params(const mh_env *e, int32_t u, int32_t *first, int32_t *count)
{
    *first = -1;
    *count = 0;
    for (int32_t i = 0; i < e->info->n_params_decl; i++) {
        if (e->info->params[i].unit != u) continue;
        if (*first < 0) *first = i;
        (*count)++;
    }
}

static zt_status call_failed(mh_env *e, zt_status st, const char *op, int32_t unit, zt_error *err)
{
    const char *attention = mh_attention_error(e);
    zt_error_set(err, st, "model %s of unit %d failed: %s", op, (int)unit, mh_model_error(e));
    if (*attention) zt_error_append(err, "attention: %s", attention);
    return st;
}

static zt_status run_forward(mh_env *e, const mh_params *p, const mh_batch *b, mh_run *r, uint32_t flags,
                             int want_logits, zt_kv_cache *kv, const int32_t *kv_seq_ids, zt_error *err)
{
    int32_t last = r->n_units - 1;
    int64_t hidden_shape[3] = {b->batch.batch, b->batch.seq_len, e->info->hidden_size};
    int64_t logits_shape[3] = {b->batch.batch, b->batch.seq_len, e->info->vocab_size};
    zt_tensor views[16];
    for (int32_t u = 0; u <= last; u++) {
        int32_t first, count;
        unit_params(e, u, &first, &count);
        if (count > (int32_t)(sizeof views / sizeof views[0]))
            return zt_error_set(err, ZT_ERR_INTERNAL, "unit %d has more parameters than the harness holds", (int)u);
        for (int32_t i = 0; i < count; i++)
            views[i] = mh_view(p->value[first + i], e->info->params[first + i].ndim,
                               p->shape ? p->shape[first + i] : e->info->params[first + i].shape);
        zt_unit_call c;
        memset(&c, 0, sizeof c);
        c.struct_size = sizeof c;
        c.unit = u;
        c.flags = flags;
        c.n_params = count;
        c.params = views;
        c.batch = &b->batch;
        c.attention = &e->attention;
        if (u > 0) c.x_in = mh_view(r->hidden[u - 1], 3, hidden_shape);
        if (u < last) {
            c.x_out = mh_view(r->hidden[u], 3, hidden_shape);
            poison(r->hidden[u], r->tokens * e->info->hidden_size);
        } else if (want_logits) {
            c.x_out = mh_view(r->logits, 3, logits_shape);
            poison(r->logits, r->tokens * e->info->vocab_size);
        }
        r->loss = NAN;
        if (u == last && !kv) c.loss = &r->loss;
        c.saved = &r->saved[u];
        c.kv = kv;
        c.kv_seq_ids = kv_seq_ids;
        zt_status st = e->model->forward(e->model_state, &c);
        if (st != ZT_OK) return call_failed(e, st, "forward", u, err);
    }
    return ZT_OK;
}

zt_status mh_forward(mh_env *e, const mh_params *p, const mh_batch *b, mh_run *r, uint32_t flags, int want_logits,
                     zt_error *err)
{
    return run_forward(e, p, b, r, flags, want_logits, NULL, NULL, err);
}

zt_status mh_backward(mh_env *e, const mh_params *p, const mh_batch *b, mh_run *r, const int *frozen, zt_error *err)
{
    int32_t last = r->n_units - 1;
    int64_t hidden_shape[3] = {b->batch.batch, b->batch.seq_len, e->info->hidden_size};
    zt_tensor views[16], grads[16];
    for (int32_t u = last; u >= 0; u--) {
        int32_t first, count;
        unit_params(e, u, &first, &count);
        for (int32_t i = 0; i < count; i++) {
            const zt_param_decl *d = &e->info->params[first + i];
            const int64_t *shape = p->shape ? p->shape[first + i] : d->shape;
            views[i] = mh_view(p->value[first + i], d->ndim, shape);
            grads[i] = mh_view(frozen && frozen[first + i] ? NULL : p->grad[first + i], d->ndim, shape);
        }
        zt_unit_call c;
        memset(&c, 0, sizeof c);
        c.struct_size = sizeof c;
        c.unit = u;
        c.flags = ZT_UNIT_TRAIN;
        c.n_params = count;
        c.params = views;
        c.grads = grads;
        c.batch = &b->batch;
        c.attention = &e->attention;
        if (u > 0) {
            c.x_in = mh_view(r->hidden[u - 1], 3, hidden_shape);
            c.dx_in = mh_view(r->grad_hidden[u - 1], 3, hidden_shape);
            poison(r->grad_hidden[u - 1], r->tokens * e->info->hidden_size);
        }
        if (u < last) c.dx_out = mh_view(r->grad_hidden[u], 3, hidden_shape);
        c.saved = &r->saved[u];
        zt_status st = e->model->backward(e->model_state, &c);
        if (st != ZT_OK) return call_failed(e, st, "backward", u, err);
    }
    return ZT_OK;
}

/* ---- generation -------------------------------------------------------------------------------- */

static int32_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

/* One forward of `tokens` (one row) at positions start.. and the argmax of its last logits. */
static zt_status decode_step(mh_env *e, const mh_params *p, const int32_t *tokens, int32_t n, int32_t start,
                             zt_kv_cache *kv, int32_t *next, float *logits_out, zt_error *err)
{
    mh_batch b;
    mh_run r;
    zt_status st = mh_batch_make(&b, 1, n, tokens, NULL, NULL, 1, err);
    if (st != ZT_OK) return st;
    for (int32_t t = 0; t < n; t++) b.positions[t] = start + t;
    st = mh_run_alloc(e, &b, &r, err);
    if (st == ZT_OK) {
        static const int32_t seq0 = 0;
        st = run_forward(e, p, &b, &r, 0, 1, kv, kv ? &seq0 : NULL, err);
        int64_t V = e->info->vocab_size;
        if (st == ZT_OK) {
            const float *last = r.logits + (int64_t)(n - 1) * V;
            *next = argmax(last, V);
            if (logits_out) memcpy(logits_out, last, (size_t)V * sizeof(float));
        }
        mh_run_free(&r);
    }
    mh_batch_free(&b);
    return st;
}

zt_status mh_generate(mh_env *e, const mh_params *p, const int32_t *prompt, int32_t n_prompt, int32_t n_new,
                      int use_cache, int32_t *out_tokens, float *step_logits, zt_error *err)
{
    const zt_attention_ops *ops = e->attention.ops;
    int64_t V = e->info->vocab_size;
    zt_kv_cache *kv = NULL;
    memcpy(out_tokens, prompt, (size_t)n_prompt * sizeof(int32_t));
    if (use_cache) {
        zt_kv_cache_desc desc = {
            .struct_size = sizeof desc, .n_layers = e->info->n_layers, .n_kv_heads = e->info->n_kv_heads,
            .head_dim = e->info->head_dim, .max_seqs = 1, .max_tokens = n_prompt + n_new, .dtype = ZT_F32,
        };
        if (ops->kv_create(e->attention.state, &desc, &kv) != ZT_OK)
            return zt_error_set(err, ZT_ERR_INVALID_ARG, "kv_create: %s", mh_attention_error(e));
    }
    static const int32_t seq0 = 0;
    zt_status st = ZT_OK;
    int32_t length = n_prompt;
    for (int32_t step = 0; step < n_new && st == ZT_OK; step++) {
        float *logits = step_logits ? step_logits + step * V : NULL;
        if (!use_cache) {
            st = decode_step(e, p, out_tokens, length, 0, NULL, &out_tokens[length], logits, err);
        } else {
            /* The prompt in one call, then one token per call against the cache. */
            int32_t start = step == 0 ? 0 : length - 1, n = step == 0 ? n_prompt : 1;
            st = decode_step(e, p, out_tokens + start, n, start, kv, &out_tokens[length], logits, err);
            if (st == ZT_OK && ops->kv_advance(e->attention.state, kv, &seq0, 1, n) != ZT_OK)
                st = zt_error_set(err, ZT_ERR_INVALID_ARG, "kv_advance: %s", mh_attention_error(e));
        }
        length++;
    }
    if (kv) ops->kv_destroy(e->attention.state, kv);
    return st;
}

/* ---- comparisons and expectations -------------------------------------------------------------- */

int mh_close_enough(const char *what, const float *got, const float *want, int64_t n, double rtol,
                    double atol_fraction)
{
    double scale = 0.0;
    for (int64_t i = 0; i < n; i++) scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    double atol = atol_fraction * scale, worst = 0.0;
    int64_t worst_i = -1;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]), tol = rtol * fabs(want[i]) + atol;
        double ratio = isfinite(got[i]) ? (tol > 0 ? err / tol : (err > 0 ? INFINITY : 0)) : INFINITY;
        if (ratio > worst || worst_i < 0) {
            worst = ratio;
            worst_i = i;
        }
    }
    if (n == 0 || worst <= 1.0) return 1;
    fprintf(stderr, "%s: element %lld is %.9g, expected %.9g (error %.3g of its tolerance; rtol %g, atol %g)\n",
            what, (long long)worst_i, (double)got[worst_i], (double)want[worst_i], worst, rtol, atol);
    return 0;
}

static int read_int_array(const zt_json *j, int arr, int32_t *out, int cap)
{
    if (arr < 0 || j->tok[arr].type != ZT_JSON_ARRAY || j->tok[arr].size > cap) return -1;
    int n = j->tok[arr].size, tok = arr + 1;
    for (int i = 0; i < n; i++, tok = zt_json_skip(j, tok)) out[i] = (int32_t)zt_json_get_number(j, tok);
    return n;
}

zt_status mh_expected_load(const char *path, mh_expected *x, zt_error *err)
{
    size_t len = 0;
    char *text = mh_read_file(path, &len, err);
    if (!text) return ZT_ERR_IO;
    zt_json j;
    zt_status st = zt_json_parse(text, len, path, &j, err);
    if (st == ZT_OK) {
        int loss = zt_json_object_get(&j, 0, "loss"), n = zt_json_object_get(&j, 0, "n_loss_tokens");
        int gen = zt_json_object_get(&j, 0, "generate");
        int prompt = gen >= 0 ? zt_json_object_get(&j, gen, "prompt") : -1;
        int output = gen >= 0 ? zt_json_object_get(&j, gen, "output") : -1;
        x->n_prompt = read_int_array(&j, prompt, x->prompt, 64);
        x->n_output = read_int_array(&j, output, x->output, 64);
        if (loss < 0 || n < 0 || x->n_prompt < 1 || x->n_output <= x->n_prompt)
            st = zt_error_set(err, ZT_ERR_FORMAT, "%s: expected loss, n_loss_tokens and generate.{prompt,output}",
                              path);
        else {
            x->loss = zt_json_get_number(&j, loss);
            x->n_loss_tokens = (int64_t)zt_json_get_number(&j, n);
        }
        zt_json_free(&j);
    }
    free(text);
    return st;
}
