/* The llama model plugin: options, lifecycle, the checks every unit call passes before the math
 * runs, and the choice of the device path (llama_backend: layers.c on the CPU, layers_cuda.c on
 * CUDA) that every unit call then goes to. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define INT_MIN1 (ZT_OPT_HAS_MIN | ZT_OPT_NO_DEFAULT)
#define POSITIVE (ZT_OPT_HAS_MIN | ZT_OPT_MIN_OPEN | ZT_OPT_NO_DEFAULT)

static const char *const k_preset_choices[] = {"tiny", "125m", "1b", "7b", "8b", NULL};
static const char *const k_rope_type_choices[] = {"none", "llama3", NULL};

/* Hugging Face's config.json names under "model.", so `--model DIR` copies them one to one. All but
 * initializer_range are "not given" by default: a preset fills them, a user value wins. */
static const zt_option k_options[] = {
    {"model.preset", ZT_OPT_ENUM, ZT_OPT_NO_DEFAULT, NULL, 0, 0, k_preset_choices,
     "Model shape: tiny (288 hidden, 6 layers), 125m, 1b (TinyLlama-1.1B), 7b (Llama-2-7B), 8b (Llama-3-8B); "
     "any model.* key overrides it."},
    {"model.hidden_size", ZT_OPT_INT, INT_MIN1, NULL, 1, 0, NULL, "Width of the residual stream."},
    {"model.intermediate_size", ZT_OPT_INT, INT_MIN1, NULL, 1, 0, NULL, "Width of the SwiGLU MLP."},
    {"model.num_hidden_layers", ZT_OPT_INT, INT_MIN1, NULL, 1, 0, NULL, "Transformer layers."},
    {"model.num_attention_heads", ZT_OPT_INT, INT_MIN1, NULL, 1, 0, NULL, "Query heads."},
    {"model.num_key_value_heads", ZT_OPT_INT, INT_MIN1, NULL, 1, 0, NULL,
     "Key/value heads: equal to num_attention_heads (multi-head), a divisor (grouped-query) or 1 "
     "(multi-query); unset without a preset: num_attention_heads."},
    {"model.vocab_size", ZT_OPT_INT, INT_MIN1, NULL, 1, 0, NULL, "Vocabulary size (embedding rows)."},
    {"model.head_dim", ZT_OPT_INT, INT_MIN1, NULL, 1, 0, NULL,
     "Size of one attention head; unset: hidden_size / num_attention_heads."},
    {"model.rms_norm_eps", ZT_OPT_FLOAT, POSITIVE, NULL, 0, 0, NULL,
     "Epsilon of RMSNorm; unset without a preset: 1e-6 (transformers' default)."},
    {"model.rope_theta", ZT_OPT_FLOAT, POSITIVE, NULL, 0, 0, NULL,
     "Base of the rotary frequencies; unset without a preset: 10000."},
    {"model.max_position_embeddings", ZT_OPT_INT, INT_MIN1, NULL, 1, 0, NULL,
     "Longest sequence the model is meant for; unset without a preset: 2048."},
    {"model.tie_word_embeddings", ZT_OPT_BOOL, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "Share the LM head's weight with the token embedding; unset: false."},
    {"model.rope_scaling.rope_type", ZT_OPT_ENUM, ZT_OPT_NO_DEFAULT, NULL, 0, 0, k_rope_type_choices,
     "Rotary frequency scaling: none, or llama3 (Llama 3.1, needs the four numbers below)."},
    {"model.rope_scaling.factor", ZT_OPT_FLOAT, POSITIVE, NULL, 0, 0, NULL,
     "llama3 scaling: divisor of the low frequencies (Llama-3.1: 8)."},
    {"model.rope_scaling.low_freq_factor", ZT_OPT_FLOAT, POSITIVE, NULL, 0, 0, NULL,
     "llama3 scaling: wavelengths above original_max_position_embeddings / low_freq_factor are "
     "scaled fully (Llama-3.1: 1)."},
    {"model.rope_scaling.high_freq_factor", ZT_OPT_FLOAT, POSITIVE, NULL, 0, 0, NULL,
     "llama3 scaling: wavelengths below original_max_position_embeddings / high_freq_factor are kept "
     "(Llama-3.1: 4)."},
    {"model.rope_scaling.original_max_position_embeddings", ZT_OPT_INT, INT_MIN1, NULL, 1, 0, NULL,
     "llama3 scaling: the context length the model was pretrained with (Llama-3.1: 8192)."},
    {"model.initializer_range", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN, "0.02", 0, 0, NULL,
     "Standard deviation of the normal initialisation of every weight matrix (norms start at 1)."},
};

const char *llama_unit_name(const llama_state *s, int32_t unit, char *buf, size_t cap)
{
    if (unit == 0) snprintf(buf, cap, "the embedding (unit 0)");
    else if (unit == s->info.n_units - 1) snprintf(buf, cap, "the LM head (unit %d)", (int)unit);
    else snprintf(buf, cap, "layer %d (unit %d)", (int)unit - 1, (int)unit);
    return buf;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

/* The device paths this build has. A run on CUDA takes the CUDA one; any other run the CPU one. */
static const llama_backend *const k_backends[] = {
    &llama_cpu_backend,
#ifdef ZT_PLUGIN_CUDA
    &llama_cuda_backend,
#endif
};

static const llama_backend *backend_for(int32_t device_type)
{
    for (size_t i = 0; i < sizeof k_backends / sizeof k_backends[0]; i++)
        if (k_backends[i]->device_type == device_type) return k_backends[i];
    return NULL;
}

static zt_status llama_probe(const zt_host *host)
{
    (void)host; /* the CPU path runs anywhere; init checks a CUDA run's device */
    return ZT_OK;
}

static void llama_fini(void *state)
{
    llama_state *s = state;
    if (!s) return;
    if (s->backend->fini) s->backend->fini(s);
    llama_params_free(s);
    llama_lora_free(s);
    free(s->inv_freq);
    free(s);
}

static zt_status llama_init(const zt_host *host, void **state)
{
    *state = NULL;
    int on_gpu = host->device && host->device->device_type == ZT_DEVICE_CUDA;
    const llama_backend *backend = backend_for(on_gpu ? ZT_DEVICE_CUDA : ZT_DEVICE_CPU);
    if (!backend) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "this llama plugin was built without CUDA, so it computes on the CPU only: rebuild zt where "
                    "the CUDA toolkit is installed, or train on the CPU (device = cpu)");
        return ZT_ERR_UNSUPPORTED;
    }
    llama_state *s = calloc(1, sizeof *s);
    if (!s) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "cannot allocate the llama plugin state");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    s->host = host;
    s->backend = backend;
    s->on_gpu = on_gpu;
    int32_t fp16 = 0;
    if (host->cfg_bool(host->ctx, "fp16.enabled", &fp16) != ZT_OK) fp16 = 0;
    /* the CPU path computes in fp32 whatever fp16.enabled says (the host warns) */
    s->compute = !on_gpu ? ZT_F32 : fp16 ? ZT_F16 : ZT_BF16;
    s->cpu.parallel_for = host->parallel_for;
    s->cpu.pool = host->ctx;
    zt_status st = llama_config_resolve(host, &s->cfg);
    if (st == ZT_OK) st = llama_params_build(s);
    if (st == ZT_OK) {
        s->inv_freq = malloc((size_t)s->cfg.head_dim / 2 * sizeof *s->inv_freq);
        if (!s->inv_freq) {
            host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "cannot allocate the rotary frequency table");
            st = ZT_ERR_OUT_OF_MEMORY;
        }
    }
    if (st == ZT_OK) zt_cpu_rope_inv_freq(&s->cfg.rope, s->inv_freq);
    if (st == ZT_OK) llama_tp_init(s);
    if (st == ZT_OK && backend->init) st = backend->init(s);
    if (st != ZT_OK) {
        llama_fini(s);
        return st;
    }
    const llama_config *c = &s->cfg;
    host->log(host->ctx, ZT_LOG_INFO,
              "llama%s%s: %lld layers, hidden %lld, %lld heads (%lld key/value) of %lld, MLP %lld, vocab %lld%s, "
              "%lld parameters",
              c->preset ? " preset " : "", c->preset ? c->preset : "", (long long)c->layers, (long long)c->hidden,
              (long long)c->heads, (long long)c->kv_heads, (long long)c->head_dim, (long long)c->intermediate,
              (long long)c->vocab, c->tie_embeddings ? " (tied LM head)" : "", (long long)s->info.n_parameters);
    *state = s;
    return ZT_OK;
}

/* ---- checks on every unit call --------------------------------------------------------------- */

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* A contiguous tensor of exactly `shape` and `dtype` in the run's memory: fp32 CPU views on the CPU;
 * on CUDA runs bf16 device views (fp32 for gradients). */
static zt_status check_view(const llama_state *s, const char *unit_name, const char *what,
                            const zt_tensor *t, int ndim, const int64_t *shape, int32_t dtype)
{
    char want[96], got[96];
    format_shape(want, sizeof want, ndim, shape);
    const char *problem = NULL;
    int64_t expected_stride = 1;
    const char *dtype_name = dtype == ZT_F32 ? "fp32" : dtype == ZT_F16 ? "fp16" : "bf16",
               *device_name = s->on_gpu ? "CUDA" : "CPU";
    if (!t->data) problem = "its data pointer is NULL";
    else if (t->dtype != dtype)
        problem = dtype == ZT_F32 ? (s->on_gpu ? "its dtype is not F32" : "its dtype is not F32 (the CPU path computes in fp32)")
                  : dtype == ZT_F16 ? "its dtype is not F16 (fp16.enabled: the CUDA path computes in fp16)"
                                    : "its dtype is not BF16 (the CUDA path computes in bf16)";
    else if (t->device_type != (s->on_gpu ? ZT_DEVICE_CUDA : ZT_DEVICE_CPU))
        problem = s->on_gpu ? "it is not in CUDA device memory" : "it is not in CPU memory";
    else if (t->ndim != ndim) problem = "it has another number of dimensions";
    for (int i = ndim - 1; !problem && i >= 0; i--) {
        if (t->shape[i] != shape[i]) problem = "its shape differs";
        else if (t->stride[i] != expected_stride) problem = "it is not contiguous (row-major)";
        expected_stride *= shape[i];
    }
    if (!problem) return ZT_OK;
    format_shape(got, sizeof got, t->ndim >= 0 && t->ndim <= ZT_MAX_DIMS ? t->ndim : 0, t->shape);
    s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG,
                   "%s: %s must be a contiguous %s %s tensor of shape %s, but %s (dtype %d, shape %s); the "
                   "host or the zero plugin passed a wrong view",
                   unit_name, what, dtype_name, device_name, want, problem, (int)t->dtype, got);
    return ZT_ERR_INVALID_ARG;
}

static zt_status call_error(const llama_state *s, const char *unit_name, const char *problem)
{
    s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG, "%s: %s", unit_name, problem);
    return ZT_ERR_INVALID_ARG;
}

/* Everything a unit call must satisfy before a device path (layers.c, layers_cuda.c) touches memory. */
static zt_status check_call(const llama_state *s, const zt_unit_call *c, int backward)
{
    char name[40], what[160];
    if (!c || c->struct_size < sizeof(zt_unit_call)) {
        s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG,
                       "llama %s: the unit call is NULL or older than ABI 1.0 (struct_size %u, expected at least "
                       "%zu)", backward ? "backward" : "forward", c ? c->struct_size : 0u, sizeof(zt_unit_call));
        return ZT_ERR_INVALID_ARG;
    }
    int32_t n_units = s->info.n_units, u = c->unit;
    if (u < 0 || u >= n_units) {
        s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG,
                       "llama %s: unit %d does not exist; this model has units 0 (embedding) to %d (LM head)",
                       backward ? "backward" : "forward", (int)u, (int)n_units - 1);
        return ZT_ERR_INVALID_ARG;
    }
    llama_unit_name(s, u, name, sizeof name);
    int is_embedding = u == 0, is_head = u == n_units - 1, is_layer = !is_embedding && !is_head;
    int train = (c->flags & ZT_UNIT_TRAIN) != 0;

    int32_t compute = s->compute; /* the dtype of parameters and activations */
    int32_t first = s->unit_first_param[u], n = s->unit_first_param[u + 1] - first;
    if (c->n_params != n || !c->params) {
        snprintf(what, sizeof what, "expected %d parameter views, got %d%s", (int)n, (int)c->n_params,
                 c->params ? "" : " (params is NULL)");
        return call_error(s, name, what);
    }
    for (int32_t i = 0; i < n; i++) {
        const zt_param_decl *d = &s->decls[first + i];
        int64_t shape[4]; /* this rank's shard under tensor parallelism */
        llama_local_shape(s, first + i, shape);
        zt_status st = check_view(s, name, d->name, &c->params[i], d->ndim, shape, compute);
        if (st != ZT_OK) return st;
        if (backward && c->grads && c->grads[i].data) {
            snprintf(what, sizeof what, "the gradient of %s", d->name);
            st = check_view(s, name, what, &c->grads[i], d->ndim, shape, ZT_F32);
            if (st != ZT_OK) return st;
        }
    }

    const zt_batch *b = c->batch;
    if (!b || b->batch < 1 || b->seq_len < 1 || !b->tokens)
        return call_error(s, name, "the batch is missing, empty, or has no tokens (a host bug)");
    if (is_layer && !b->positions)
        return call_error(s, name, "the batch has no positions, which the rotary embedding needs (a host bug)");
    int wants_loss = is_head && !backward && c->loss;
    if (is_head && (wants_loss || train || backward)) {
        if (!b->targets)
            return call_error(s, name, "the loss needs batch->targets, which is NULL (a host bug)");
        if (b->n_loss_tokens_global < 1) {
            s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG,
                           "%s: batch->n_loss_tokens_global is %lld: the global batch has no token to take the "
                           "loss on (every target is -100); the host must skip such a step",
                           name, (long long)b->n_loss_tokens_global);
            return ZT_ERR_INVALID_ARG;
        }
    }

    /* The largest per-token array is one of these; a batch whose arrays would not fit in memory
     * (or whose byte counts would overflow) is refused before anything is allocated. */
    const llama_config *cfg = &s->cfg;
    double widest = (double)(cfg->vocab > cfg->intermediate ? cfg->vocab : cfg->intermediate);
    if (widest < (double)(cfg->heads * cfg->head_dim)) widest = (double)(cfg->heads * cfg->head_dim);
    if ((double)b->batch * b->seq_len * (widest + cfg->hidden) * 16.0 > 0x1p62) {
        s->host->error(s->host->ctx, ZT_ERR_OUT_OF_MEMORY,
                       "%s: a batch of %d x %d tokens needs more activation memory than any machine has; lower "
                       "train_micro_batch_size_per_gpu or data.seq_len", name, (int)b->batch, (int)b->seq_len);
        return ZT_ERR_OUT_OF_MEMORY;
    }

    int64_t H = cfg->hidden;
    int64_t hidden_shape[3] = {b->batch, b->seq_len, H};
    int64_t logits_shape[3] = {b->batch, b->seq_len, cfg->vocab};
    zt_status st = ZT_OK;
    /* GPU runs may ask for the logits in fp32 or bf16 */
    int32_t logits_dtype = s->on_gpu && c->x_out.dtype == ZT_F32 ? ZT_F32 : compute;
    if (!backward) {
        if (!is_embedding) st = check_view(s, name, "x_in", &c->x_in, 3, hidden_shape, compute);
        if (st == ZT_OK && !is_head) st = check_view(s, name, "x_out", &c->x_out, 3, hidden_shape, compute);
        if (st == ZT_OK && is_head && c->x_out.data)
            st = check_view(s, name, "x_out (logits)", &c->x_out, 3, logits_shape, logits_dtype);
    } else {
        if (!is_embedding)
            st = check_view(s, name, "x_in (the unit input the host keeps)", &c->x_in, 3, hidden_shape, compute);
        if (st == ZT_OK && !is_embedding) st = check_view(s, name, "dx_in", &c->dx_in, 3, hidden_shape, compute);
        if (st == ZT_OK && !is_head) st = check_view(s, name, "dx_out", &c->dx_out, 3, hidden_shape, compute);
    }
    if (st != ZT_OK) return st;

    if (is_layer) {
        const zt_attention_binding *att = c->attention;
        if (!att || !att->ops || !att->ops->forward || !att->ops->backward)
            return call_error(s, name, "no attention plugin is bound (zt_unit_call.attention is NULL); the host "
                                       "binds one, by default naive");
    }
    if (c->kv) {
        if (train || backward)
            return call_error(s, name, "a KV cache is for generation: a call with a KV cache cannot train");
        if (!c->kv_seq_ids) return call_error(s, name, "a KV cache call needs kv_seq_ids (a host bug)");
        if (is_layer && !c->attention->ops->kv_attend)
            return call_error(s, name, "the bound attention plugin has no KV cache (no ZT_CAP_KV_CACHE); "
                                       "generate with an attention plugin that has one, e.g. naive");
        if (is_head && !c->x_out.data)
            return call_error(s, name, "generation needs the logits: x_out is NULL");
    }
    if (c->struct_size >= ZT_UNIT_CALL_SIZE_1_4 && (c->sample_tokens || c->sample_rows)) {
        if (!is_head || backward || train || !c->kv || !s->on_gpu)
            return call_error(s, name, "device sampling (sample_tokens) is for the LM head of a generation "
                                       "forward on a GPU (a host bug)");
        if (!c->sample_tokens || !c->sample_rows || logits_dtype != ZT_F32)
            return call_error(s, name, "device sampling needs sample_rows, sample_tokens and fp32 logits in x_out "
                                       "(a host bug)");
        if (c->sample_n_draw < 1 || c->sample_n_draw > cfg->vocab) {
            snprintf(what, sizeof what, "sample_n_draw is %d: it must be in [1, %d] (the vocabulary)",
                     (int)c->sample_n_draw, (int)cfg->vocab);
            return call_error(s, name, what);
        }
    }
    if ((train || backward) && !c->saved)
        return call_error(s, name, "training needs a saved-activations slot (zt_unit_call.saved is NULL)");
    if (train && !backward && *c->saved) {
        return call_error(s, name, "the saved-activations slot still holds an earlier forward; run its "
                                   "backward or release it first (a host bug)");
    }
    return ZT_OK;
}

/* ---- ops ------------------------------------------------------------------------------------- */

static const zt_model_info *llama_info(void *state)
{
    return &((llama_state *)state)->info;
}

/* LLAMA_UNIT_* of a (checked) unit index. */
static int unit_kind(const llama_state *s, int32_t unit)
{
    if (unit == 0) return LLAMA_UNIT_EMBEDDING;
    if (unit == s->info.n_units - 1) return LLAMA_UNIT_HEAD;
    return LLAMA_UNIT_LAYER;
}

static zt_status llama_forward(void *state, const zt_unit_call *c)
{
    llama_state *s = state;
    zt_status st = check_call(s, c, 0);
    if (st != ZT_OK) return st;
    return s->backend->forward[unit_kind(s, c->unit)](s, c);
}

static zt_status llama_backward(void *state, const zt_unit_call *c)
{
    llama_state *s = state;
    zt_status st = check_call(s, c, 1);
    if (st != ZT_OK) return st;
    return s->backend->backward[unit_kind(s, c->unit)](s, c);
}

static void llama_release(void *state, int32_t unit, void **saved)
{
    (void)unit;
    if (!saved) return;
    llama_saved_free(state, *saved);
    *saved = NULL;
}

static zt_status llama_adapt(void *state, const zt_adapter_spec *spec)
{
    return llama_lora_adapt(state, spec);
}

static zt_status llama_parallelize_op(void *state, const zt_model_parallel *p)
{
    return llama_parallelize(state, p);
}

static zt_status llama_param_shard_op(void *state, int32_t param, zt_param_shard *out)
{
    return llama_param_shard(state, param, out);
}

static const zt_model_ops k_ops = {
    .struct_size = sizeof(zt_model_ops),
    .info = llama_info,
    .forward = llama_forward,
    .backward = llama_backward,
    .release = llama_release,
    .adapt = llama_adapt,
    .parallelize = llama_parallelize_op,
    .param_shard = llama_param_shard_op,
};

static const zt_plugin k_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_MODEL,
    .name = "llama",
    .version = "1.0.0",
#ifdef ZT_PLUGIN_CUDA
    .description = "LLaMA 1/2/3 (RMSNorm, RoPE with Llama 3 scaling, GQA/MQA, SwiGLU), fp32 on the CPU, bf16 or fp16 on CUDA",
#else
    .description = "LLaMA 1/2/3 (RMSNorm, RoPE with Llama 3 scaling, GQA/MQA, SwiGLU), fp32 on the CPU",
#endif
    .options = k_options,
    .n_options = sizeof k_options / sizeof k_options[0],
    .caps = ZT_CAP_CPU | ZT_CAP_RECOMPUTE
#ifdef ZT_PLUGIN_CUDA
            | ZT_CAP_CUDA | ZT_CAP_BF16 | ZT_CAP_FP16
#endif
    ,
    .probe = llama_probe,
    .init = llama_init,
    .fini = llama_fini,
    .ops = &k_ops,
};

ZT_PLUGIN_ENTRY
{
    return &k_plugin;
}
