/* The llama plugin's shape and contract, loaded as zt-run loads it: presets against the published
 * parameter counts of the checkpoints they copy, the parameter declarations (names, shapes, units,
 * tensor-parallel split, flags, init), the activation estimate against measured use, and every
 * refusal (config and unit calls) with its message.
 *
 * usage: test_llama_config PLUGINS_D
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_harness.h"
#include "ztest.h"

static zt_error g_err;
static const char *g_plugins_d;

_Noreturn static void die(const char *what)
{
    fprintf(stderr, "test setup failed: %s: %s\n", what, g_err.msg);
    exit(1);
}

static void open_or_die(mh_env *e, const char *config)
{
    if (mh_open(e, g_plugins_d, config, 2, &g_err) != ZT_OK) die(config);
}

/* ---- presets ----------------------------------------------------------------------------------- */

typedef struct preset_case {
    const char *name;
    int32_t hidden, layers, heads, kv_heads, ffn, vocab, head_dim, max_positions;
    int64_t n_parameters;
} preset_case;

static void check_presets(void)
{
    /* Parameter counts: TinyLlama-1.1B, Llama-2-7B and Llama-3-8B as their model cards give them;
     * tiny and 125m counted by hand (embedding and head V*H each, per layer 4*H*H + 3*H*F + 2*H,
     * final norm H). */
    static const preset_case cases[] = {
        {"tiny", 288, 6, 6, 6, 768, 32000, 48, 2048, 24407712},
        {"125m", 768, 12, 12, 12, 2048, 32000, 64, 2048, 134105856},
        {"1b", 2048, 22, 32, 4, 5632, 32000, 64, 2048, 1100048384},
        {"7b", 4096, 32, 32, 32, 11008, 32000, 128, 4096, 6738415616},
        {"8b", 4096, 32, 32, 8, 14336, 128256, 128, 8192, 8030261248},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const preset_case *p = &cases[i];
        char config[128];
        snprintf(config, sizeof config, "{\"model\": {\"preset\": \"%s\"}}", p->name);
        mh_env e;
        open_or_die(&e, config);
        const zt_model_info *info = e.info;
        ZT_CHECK_INT(info->hidden_size, p->hidden);
        ZT_CHECK_INT(info->n_layers, p->layers);
        ZT_CHECK_INT(info->n_units, p->layers + 2);
        ZT_CHECK_INT(info->n_heads, p->heads);
        ZT_CHECK_INT(info->n_kv_heads, p->kv_heads);
        ZT_CHECK_INT(info->intermediate_size, p->ffn);
        ZT_CHECK_INT(info->vocab_size, p->vocab);
        ZT_CHECK_INT(info->head_dim, p->head_dim);
        ZT_CHECK_INT(info->max_seq_len, p->max_positions);
        ZT_CHECK_INT(info->n_parameters, p->n_parameters);
        ZT_CHECK_INT(info->n_params_decl, 2 + 9 * p->layers + 1);
        mh_close(&e);
    }

    /* A key the user sets wins over the preset; the rest stays the preset's. */
    mh_env e;
    open_or_die(&e, "{\"model\": {\"preset\": \"7b\", \"num_hidden_layers\": 2, \"vocab_size\": 1000, "
                    "\"tie_word_embeddings\": true}}");
    ZT_CHECK_INT(e.info->n_layers, 2);
    ZT_CHECK_INT(e.info->vocab_size, 1000);
    ZT_CHECK_INT(e.info->hidden_size, 4096);
    ZT_CHECK_INT(e.info->intermediate_size, 11008);
    /* tied: the head is counted once, with the embedding */
    ZT_CHECK_INT(e.info->n_parameters, 1000LL * 4096 + 2 * (4LL * 4096 * 4096 + 3LL * 4096 * 11008 + 2 * 4096) + 4096);
    mh_close(&e);
}

/* ---- declarations ------------------------------------------------------------------------------ */

static void check_decl(const zt_param_decl *d, const char *name, int32_t unit, int64_t rows, int64_t cols,
                       int32_t tp, uint32_t flags, int32_t init)
{
    ZT_CHECK_CONTAINS(d->name, name);
    ZT_CHECK(strcmp(d->name, name) == 0);
    ZT_CHECK_INT(d->unit, unit);
    ZT_CHECK_INT(d->ndim, cols ? 2 : 1);
    ZT_CHECK_INT(d->shape[0], rows);
    if (cols) ZT_CHECK_INT(d->shape[1], cols);
    ZT_CHECK_INT(d->tp_split_dim, tp);
    ZT_CHECK_INT(d->flags, flags);
    ZT_CHECK_INT(d->init, init);
}

static void check_declarations(void)
{
    mh_env e;
    /* GQA with a head size that is not hidden / heads, as Qwen- or Gemma-like configs have. */
    open_or_die(&e, "{\"model\": {\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 12, \"vocab_size\": 100, "
                    "\"initializer_range\": 0.05}}");
    const zt_model_info *info = e.info;
    ZT_CHECK_INT(info->struct_size, sizeof(zt_model_info));
    ZT_CHECK_INT(info->n_params_decl, 21);
    ZT_CHECK_INT(info->max_seq_len, 2048); /* transformers' default without a preset */
    const zt_param_decl *d = info->params;
    check_decl(&d[0], "model.embed_tokens.weight", 0, 100, 64, 0, ZT_PARAM_EMBEDDING, ZT_INIT_NORMAL);
    ZT_CHECK_CLOSE(d[0].init_std, 0.05, 1e-7, 0);
    for (int l = 0; l < 2; l++) {
        const zt_param_decl *L = &d[1 + 9 * l];
        char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d." suffix, l), name)
        check_decl(&L[0], NAME("self_attn.q_proj.weight"), l + 1, 96, 64, 0, 0, ZT_INIT_NORMAL);
        check_decl(&L[1], NAME("self_attn.k_proj.weight"), l + 1, 24, 64, 0, 0, ZT_INIT_NORMAL);
        check_decl(&L[2], NAME("self_attn.v_proj.weight"), l + 1, 24, 64, 0, 0, ZT_INIT_NORMAL);
        check_decl(&L[3], NAME("self_attn.o_proj.weight"), l + 1, 64, 96, 1, 0, ZT_INIT_NORMAL);
        check_decl(&L[4], NAME("mlp.gate_proj.weight"), l + 1, 96, 64, 0, 0, ZT_INIT_NORMAL);
        check_decl(&L[5], NAME("mlp.up_proj.weight"), l + 1, 96, 64, 0, 0, ZT_INIT_NORMAL);
        check_decl(&L[6], NAME("mlp.down_proj.weight"), l + 1, 64, 96, 1, 0, ZT_INIT_NORMAL);
        check_decl(&L[7], NAME("input_layernorm.weight"), l + 1, 64, 0, -1, ZT_PARAM_NO_DECAY, ZT_INIT_ONES);
        check_decl(&L[8], NAME("post_attention_layernorm.weight"), l + 1, 64, 0, -1, ZT_PARAM_NO_DECAY,
                   ZT_INIT_ONES);
#undef NAME
        ZT_CHECK_CLOSE(L[3].init_std, 0.05, 1e-7, 0);
    }
    check_decl(&d[19], "model.norm.weight", 3, 64, 0, -1, ZT_PARAM_NO_DECAY, ZT_INIT_ONES);
    check_decl(&d[20], "lm_head.weight", 3, 100, 64, 0, 0, ZT_INIT_NORMAL);
    ZT_CHECK(d[20].tied_to == NULL);
    int64_t layer = 96 * 64 + 2 * 24 * 64 + 64 * 96 + 3 * 96 * 64 + 2 * 64;
    ZT_CHECK_INT(info->n_parameters, 2 * 100 * 64 + 2 * layer + 64);

    /* Activations: recompute keeps only the layer input; without it the estimate must match what
     * a training forward really holds (layer records and the attention's rows, plus the input). */
    ZT_CHECK_CLOSE(info->act_bytes_per_token_layer_recompute, 64 * 4, 1e-12, 0);
    ZT_CHECK(info->act_bytes_per_token_layer > 4 * info->act_bytes_per_token_layer_recompute);
    enum { B = 2, T = 64 };
    int32_t tokens[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 7) % 100;
    mh_params p;
    mh_batch b;
    mh_run r;
    if (mh_params_alloc(&e, &p, &g_err) != ZT_OK || mh_batch_make(&b, B, T, tokens, tokens, NULL, 0, &g_err) != ZT_OK ||
        mh_run_alloc(&e, &b, &r, &g_err) != ZT_OK)
        die("estimate setup");
    for (int32_t i = 0; i < p.n; i++)
        for (int64_t k = 0; k < p.numel[i]; k++) p.value[i][k] = 0.01f * (float)((k * 31 + i) % 17) - 0.08f;
    zt_mem_stats before, after;
    zt_runtime_mem_stats(e.rt, ZT_POOL_ACTIVATIONS, ZT_MEM_HOST, &before);
    if (mh_forward(&e, &p, &b, &r, ZT_UNIT_TRAIN, 0, &g_err) != ZT_OK) die("estimate forward");
    zt_runtime_mem_stats(e.rt, ZT_POOL_ACTIVATIONS, ZT_MEM_HOST, &after);
    /* the head's record (norm, logits) is not per layer: measure the layers alone */
    uint64_t head_bytes = (uint64_t)B * T * (64 + 1 + 100) * sizeof(float);
    double measured = (double)(after.current - before.current - head_bytes) / (B * T) / info->n_layers;
    double estimate_without_input = info->act_bytes_per_token_layer - info->act_bytes_per_token_layer_recompute;
    ZT_CHECK_CLOSE(measured, estimate_without_input, 0.02, 0);
    /* release() frees a training forward's records when no backward follows */
    for (int32_t u = 0; u < e.info->n_units; u++) {
        e.model->release(e.model_state, u, &r.saved[u]);
        ZT_CHECK(r.saved[u] == NULL);
    }
    zt_runtime_mem_stats(e.rt, ZT_POOL_ACTIVATIONS, ZT_MEM_HOST, &after);
    ZT_CHECK_INT(after.current, before.current);
    mh_run_free(&r);
    mh_batch_free(&b);
    mh_params_free(&p);
    mh_close(&e);

    /* tied: the head is a view of the embedding */
    open_or_die(&e, "{\"model\": {\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1, "
                    "\"num_attention_heads\": 4, \"vocab_size\": 100, \"tie_word_embeddings\": true}}");
    d = &e.info->params[e.info->n_params_decl - 1];
    check_decl(d, "lm_head.weight", 2, 100, 64, 0, ZT_PARAM_TIED, ZT_INIT_NORMAL);
    ZT_CHECK(d->tied_to && strcmp(d->tied_to, "model.embed_tokens.weight") == 0);
    ZT_CHECK_INT(e.info->n_kv_heads, 4); /* unset without a preset: multi-head */
    ZT_CHECK_INT(e.info->head_dim, 16);
    ZT_CHECK_INT(e.info->n_parameters, 100 * 64 + (4 * 64 * 64 + 3 * 64 * 96 + 2 * 64) + 64);
    mh_close(&e);
}

/* ---- refusals at init -------------------------------------------------------------------------- */

static void expect_init_error(const char *config, zt_status status, const char *text)
{
    mh_env e;
    zt_status st = mh_open(&e, g_plugins_d, config, 1, &g_err);
    ZT_CHECK_INT(st, status);
    if (st == ZT_OK) {
        fprintf(stderr, "config %s was accepted\n", config);
        mh_close(&e);
        return;
    }
    ZT_CHECK_CONTAINS(g_err.msg, text);
}

static void check_config_errors(void)
{
    expect_init_error("{}", ZT_ERR_CONFIG,
                      "the llama model has no size: model.preset is not set and neither are model.hidden_size, "
                      "model.intermediate_size, model.num_hidden_layers, model.num_attention_heads, "
                      "model.vocab_size. Set model.preset to one of tiny, 125m, 1b, 7b, 8b");
    /* only the missing ones are listed */
    expect_init_error("{\"model\": {\"hidden_size\": 64, \"vocab_size\": 10, \"num_hidden_layers\": 1}}",
                      ZT_ERR_CONFIG,
                      "model.preset is not set and neither are model.intermediate_size, model.num_attention_heads. ");
    static const char sizes[] = "\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1, "
                                "\"vocab_size\": 100";
    char config[512];
    snprintf(config, sizeof config, "{\"model\": {%s, \"num_attention_heads\": 4, \"num_key_value_heads\": 3}}", sizes);
    expect_init_error(config, ZT_ERR_CONFIG,
                      "model.num_key_value_heads (3) must divide model.num_attention_heads (4): each key/value head "
                      "serves the same number of query heads");
    snprintf(config, sizeof config, "{\"model\": {%s, \"num_attention_heads\": 6}}", sizes);
    expect_init_error(config, ZT_ERR_CONFIG,
                      "model.hidden_size (64) is not a multiple of model.num_attention_heads (6), so the head size");
    snprintf(config, sizeof config, "{\"model\": {%s, \"num_attention_heads\": 4, \"head_dim\": 7}}", sizes);
    expect_init_error(config, ZT_ERR_CONFIG,
                      "the head size is 7, but rotary embeddings rotate pairs of dimensions and need an even "
                      "head size");
    snprintf(config, sizeof config,
             "{\"model\": {%s, \"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": \"llama3\", "
             "\"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 64}}}", sizes);
    expect_init_error(config, ZT_ERR_CONFIG,
                      "model.rope_scaling.rope_type is \"llama3\" but model.rope_scaling.factor is not set");
    snprintf(config, sizeof config,
             "{\"model\": {%s, \"num_attention_heads\": 4, \"rope_scaling\": {\"factor\": 8}}}", sizes);
    expect_init_error(config, ZT_ERR_CONFIG,
                      "model.rope_scaling.factor is set but model.rope_scaling.rope_type is \"none\"");
    snprintf(config, sizeof config,
             "{\"model\": {%s, \"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": \"llama3\", "
             "\"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 4, "
             "\"original_max_position_embeddings\": 64}}}", sizes);
    expect_init_error(config, ZT_ERR_CONFIG,
                      "model.rope_scaling.high_freq_factor (4) must be greater than model.rope_scaling.low_freq_factor "
                      "(4)");
    snprintf(config, sizeof config, "{\"model\": {%s, \"num_attention_heads\": 4, \"head_dim\": 4294967296}}", sizes);
    expect_init_error(config, ZT_ERR_CONFIG, "model.head_dim = 4294967296 is too large: at most 2147483647");
    /* the schema's own checks, done by the host before init */
    expect_init_error("{\"model\": {\"preset\": \"3b\"}}", ZT_ERR_CONFIG, "model.preset");
    snprintf(config, sizeof config, "{\"model\": {%s, \"num_attention_heads\": 0}}", sizes);
    expect_init_error(config, ZT_ERR_CONFIG, "model.num_attention_heads");
}

/* Without a usable GPU, a CUDA run is refused at init with a way out; the plugin declares CUDA. */
static void check_cuda_refused(void)
{
    mh_env e;
    open_or_die(&e, "{\"model\": {\"preset\": \"tiny\"}}");
    const zt_plugin *plugin = e.model_plugin.plugin;
    zt_host cuda_host = *e.model_plugin.host;
    zt_device_ctx gpu = *cuda_host.device;
    gpu.device_type = ZT_DEVICE_CUDA;
    cuda_host.device = &gpu;
    void *state = (void *)&e; /* must be reset to NULL */
    zt_status st = plugin->init(&cuda_host, &state);
    if (st == ZT_OK) { /* a machine with a usable GPU: nothing to refuse */
        plugin->fini(state);
    } else {
        ZT_CHECK_INT(st, ZT_ERR_UNSUPPORTED);
        ZT_CHECK(state == NULL);
        const char *why = mh_model_error(&e); /* taking the message clears it */
#if ZT_TEST_PLUGINS_HAVE_CUDA
        ZT_CHECK_CONTAINS(why, "llama: CUDA device 0 cannot be used");
        ZT_CHECK_CONTAINS(why, "or train on the CPU (device = cpu)");
#else /* a build without CUDA (-DZT_CUDA=OFF): the plugin says so, and declares no CUDA */
        ZT_CHECK_CONTAINS(why, "this llama plugin was built without CUDA");
        ZT_CHECK_CONTAINS(why, "or train on the CPU (device = cpu)");
#endif
    }
#if ZT_TEST_PLUGINS_HAVE_CUDA
    ZT_CHECK_INT(plugin->caps, ZT_CAP_CPU | ZT_CAP_CUDA | ZT_CAP_BF16 | ZT_CAP_FP16 | ZT_CAP_RECOMPUTE);
#else
    ZT_CHECK_INT(plugin->caps, ZT_CAP_CPU | ZT_CAP_RECOMPUTE);
#endif
    mh_close(&e);
}

/* ---- refusals of unit calls -------------------------------------------------------------------- */

typedef struct call_fixture {
    mh_env e;
    mh_params p;
    mh_batch b;
    mh_run r;
    zt_tensor views[16], grads[16];
    int64_t hidden_shape[3], logits_shape[3];
} call_fixture;

/* A unit call the model accepts; each check breaks one thing. */
static zt_unit_call good_call(call_fixture *f, int32_t u, int backward)
{
    zt_unit_call c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.unit = u;
    c.flags = ZT_UNIT_TRAIN;
    int32_t n = 0;
    for (int32_t i = 0; i < f->p.n; i++) {
        const zt_param_decl *d = &f->e.info->params[i];
        if (d->unit != u) continue;
        f->views[n] = mh_view(f->p.value[i], d->ndim, d->shape);
        f->grads[n++] = mh_view(f->p.grad[i], d->ndim, d->shape);
    }
    c.n_params = n;
    c.params = f->views;
    c.grads = backward ? f->grads : NULL;
    c.batch = &f->b.batch;
    c.attention = &f->e.attention;
    int32_t last = f->e.info->n_units - 1;
    if (u > 0) c.x_in = mh_view(f->r.hidden[u - 1], 3, f->hidden_shape);
    if (u < last) c.x_out = mh_view(f->r.hidden[u], 3, f->hidden_shape);
    if (backward && u > 0) c.dx_in = mh_view(f->r.grad_hidden[u - 1], 3, f->hidden_shape);
    if (backward && u < last) c.dx_out = mh_view(f->r.grad_hidden[u], 3, f->hidden_shape);
    c.loss = u == last && !backward ? &f->r.loss : NULL;
    c.saved = &f->r.saved[u];
    return c;
}

static void expect_call_error(call_fixture *f, const zt_unit_call *c, int backward, const char *text)
{
    zt_status st = backward ? f->e.model->backward(f->e.model_state, c) : f->e.model->forward(f->e.model_state, c);
    ZT_CHECK_INT(st, ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(mh_model_error(&f->e), text);
}

static void check_call_errors(void)
{
    call_fixture f;
    open_or_die(&f.e, "{\"model\": {\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1, "
                      "\"num_attention_heads\": 4, \"vocab_size\": 100}}");
    enum { B = 2, T = 5 };
    int32_t tokens[B * T] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    if (mh_params_alloc(&f.e, &f.p, &g_err) != ZT_OK ||
        mh_batch_make(&f.b, B, T, tokens, tokens, NULL, 0, &g_err) != ZT_OK ||
        mh_run_alloc(&f.e, &f.b, &f.r, &g_err) != ZT_OK)
        die("call setup");
    for (int32_t i = 0; i < f.p.n; i++)
        for (int64_t k = 0; k < f.p.numel[i]; k++) f.p.value[i][k] = 0.02f;
    int64_t hs[3] = {B, T, 64}, ls[3] = {B, T, 100};
    memcpy(f.hidden_shape, hs, sizeof hs);
    memcpy(f.logits_shape, ls, sizeof ls);
    zt_unit_call c;

    f.b.tokens[8] = 100; /* row 1, position 3 */
    c = good_call(&f, 0, 0);
    expect_call_error(&f, &c, 0,
                      "the embedding (unit 0): token id 100 at batch row 1, position 3 is outside the vocabulary "
                      "[0, 100) of this model (model.vocab_size)");
    f.b.tokens[8] = 9;
    c = good_call(&f, 0, 0);
    ZT_CHECK_INT(f.e.model->forward(f.e.model_state, &c), ZT_OK);
    c = good_call(&f, 1, 0);
    ZT_CHECK_INT(f.e.model->forward(f.e.model_state, &c), ZT_OK);
    f.e.model->release(f.e.model_state, 1, &f.r.saved[1]);
    ZT_CHECK(f.r.saved[1] == NULL);

    f.b.targets[2] = 100;
    c = good_call(&f, 2, 0);
    expect_call_error(&f, &c, 0,
                      "the LM head (unit 2): target id 100 at batch row 0, position 2 is outside the vocabulary");
    ZT_CHECK(f.r.saved[2] == NULL); /* a failed forward keeps nothing */
    f.b.targets[2] = 3;
    f.b.batch.n_loss_tokens_global = 0;
    c = good_call(&f, 2, 0);
    expect_call_error(&f, &c, 0, "batch->n_loss_tokens_global is 0: the global batch has no token to take the loss on");
    f.b.batch.n_loss_tokens_global = 8;

    c = good_call(&f, 3, 0);
    expect_call_error(&f, &c, 0,
                      "llama forward: unit 3 does not exist; this model has units 0 (embedding) to 2 (LM head)");
    c = good_call(&f, 1, 0);
    c.n_params = 8;
    expect_call_error(&f, &c, 0, "layer 0 (unit 1): expected 9 parameter views, got 8");
    /* a q_proj view of the wrong shape */
    c = good_call(&f, 1, 0);
    f.views[0].shape[0] = 32;
    f.views[0].shape[1] = 128;
    f.views[0].stride[0] = 128;
    expect_call_error(&f, &c, 0,
                      "layer 0 (unit 1): model.layers.0.self_attn.q_proj.weight must be a contiguous fp32 CPU "
                      "tensor of shape [64, 64], but its shape differs (dtype 0, shape [32, 128]); the host or the zero plugin "
                      "passed a wrong view");
    c = good_call(&f, 1, 0);
    f.views[7].dtype = ZT_BF16;
    expect_call_error(&f, &c, 0, "model.layers.0.input_layernorm.weight must be a contiguous fp32 CPU tensor of shape "
                                 "[64], but its dtype is not F32");
    c = good_call(&f, 1, 0);
    c.x_out.stride[1] = 128;
    expect_call_error(&f, &c, 0, "x_out must be a contiguous fp32 CPU tensor of shape [2, 5, 64], but it is not "
                                 "contiguous");
    c = good_call(&f, 1, 0);
    c.attention = NULL;
    expect_call_error(&f, &c, 0, "no attention plugin is bound");
    c = good_call(&f, 1, 0);
    f.b.batch.positions = NULL;
    expect_call_error(&f, &c, 0, "the batch has no positions");
    f.b.batch.positions = f.b.positions;

    /* the slot discipline: one forward, one backward */
    c = good_call(&f, 1, 1);
    expect_call_error(&f, &c, 1, "layer 0 (unit 1) backward: the saved-activations slot does not hold this unit's "
                                 "training forward (it is empty)");
    c = good_call(&f, 1, 0);
    ZT_CHECK_INT(f.e.model->forward(f.e.model_state, &c), ZT_OK);
    ZT_CHECK(f.r.saved[1] != NULL);
    expect_call_error(&f, &c, 0, "the saved-activations slot still holds an earlier forward; run its backward or "
                                 "release it first");
    c = good_call(&f, 2, 1);
    void *wrong = f.r.saved[1];
    c.saved = &wrong;
    expect_call_error(&f, &c, 1, "the LM head (unit 2) backward: the saved-activations slot does not hold this "
                                 "unit's training forward (it belongs to another unit)");
    f.e.model->release(f.e.model_state, 1, &f.r.saved[1]);
    ZT_CHECK(f.r.saved[1] == NULL);

    /* generation and training do not mix */
    c = good_call(&f, 1, 0);
    zt_kv_cache *kv = NULL;
    zt_kv_cache_desc desc = {.struct_size = sizeof desc, .n_layers = 1, .n_kv_heads = 4, .head_dim = 16,
                             .max_seqs = 2, .max_tokens = 16, .dtype = ZT_F32};
    ZT_CHECK_INT(f.e.attention.ops->kv_create(f.e.attention.state, &desc, &kv), ZT_OK);
    const int32_t seqs[2] = {0, 1};
    c.kv = kv;
    c.kv_seq_ids = seqs;
    expect_call_error(&f, &c, 0, "a KV cache is for generation: a call with a KV cache cannot train");
    c.flags = 0;
    c.saved = NULL;
    ZT_CHECK_INT(f.e.model->forward(f.e.model_state, &c), ZT_OK);
    c = good_call(&f, 2, 0);
    c.kv = kv;
    c.kv_seq_ids = seqs;
    c.flags = 0;
    c.loss = NULL;
    expect_call_error(&f, &c, 0, "generation needs the logits: x_out is NULL");
    f.e.attention.ops->kv_destroy(f.e.attention.state, kv);

    static const int pools[] = {ZT_POOL_ACTIVATIONS, ZT_POOL_WORKSPACE};
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) {
        zt_mem_stats stats;
        zt_runtime_mem_stats(f.e.rt, pools[i], ZT_MEM_HOST, &stats);
        ZT_CHECK_INT(stats.current, 0);
    }
    mh_run_free(&f.r);
    mh_batch_free(&f.b);
    mh_params_free(&f.p);
    mh_close(&f.e);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGINS_D\n", argv[0]);
        return 2;
    }
    g_plugins_d = argv[1];
    check_presets();
    check_declarations();
    check_config_errors();
    check_cuda_refused();
    check_call_errors();
    return zt_test_result();
}
