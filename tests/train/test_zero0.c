/* The zero0 plugin, loaded as zt-run loads it, driven with a recording optimizer defined here:
 * the views it hands the model (tied and frozen parameters), the global norm and clipping factor
 * against torch.nn.utils.clip_grad_norm_ (the ops/global_norm fixture), the optimizer ranges and
 * their weight decay, non-finite skipping, shards, and the memory estimate.
 * usage: test_zero0 LIBZT_ZERO0_SO FIXTURE_DIR */
#include <math.h>

#include "config/config.h"
#include "train/layout.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "state/safetensors.h"
#include "ztest.h"

/* unit 0: embed [100]                    <- fixture t0
 * unit 1: q [7, 33] (no decay)           <- t1,  frozen [5] (not trainable)
 * unit 2: w [2049], extra [3] (adjacent, same decay: one optimizer range), lm_head tied to embed */
static zt_param_decl k_params[] = {
    {"model.embed_tokens.weight", 1, 0, {100}, 0, ZT_PARAM_EMBEDDING, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.0.q.weight", 2, 1, {7, 33}, 0, ZT_PARAM_NO_DECAY, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.0.frozen.weight", 1, 1, {5}, 0, 0, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.1.w.weight", 1, 2, {2049}, 0, 0, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.1.extra.weight", 1, 2, {3}, 0, 0, ZT_INIT_NORMAL, 0.02f, NULL},
    {"lm_head.weight", 1, 2, {100}, 0, ZT_PARAM_TIED, ZT_INIT_NORMAL, 0.02f, "model.embed_tokens.weight"},
};
enum { EMBED, Q, FROZEN, W, EXTRA, LM, N_PARAMS };

/* ---- a recording optimizer: p -= lr * scale * g; its one state accumulates scale * g ----------- */

typedef struct call {
    uint64_t n;
    int64_t step;
    double lr, weight_decay, grad_scale;
} call;

static call g_calls[16];
static int g_n_calls;

static int32_t rec_n_state(void *s)
{
    (void)s;
    return 1;
}

static const char *rec_state_name(void *s, int32_t i)
{
    (void)s;
    return i == 0 ? "scaled_grad" : NULL;
}

static zt_status rec_step(void *s, const zt_optim_hparams *h, float *param, const float *grad, float *const *state,
                          uint64_t n, int32_t device_type, void *stream)
{
    (void)s, (void)device_type, (void)stream;
    if (g_n_calls < 16) g_calls[g_n_calls] = (call){n, h->step, h->lr, h->weight_decay, h->grad_scale};
    g_n_calls++;
    for (uint64_t i = 0; i < n; i++) {
        float g = grad[i] * (float)h->grad_scale;
        param[i] -= (float)h->lr * g;
        state[0][i] += g;
    }
    return ZT_OK;
}

static const zt_optimizer_ops k_recorder = {sizeof(zt_optimizer_ops), 0, rec_n_state, rec_state_name, rec_step};

/* ---- fixture ---------------------------------------------------------------------------------- */

static float *fixture_tensor(zt_st_file *f, const char *name, uint64_t expect)
{
    const zt_st_tensor *t = zt_st_find(f, name);
    zt_error err;
    float *out = t ? malloc(t->numel * sizeof *out) : NULL;
    if (!t || t->numel != expect || zt_st_read_f32(f, t, 0, t->numel, out, &err) != ZT_OK) {
        fprintf(stderr, "global_norm fixture: tensor %s missing or not %llu elements\n", name,
                (unsigned long long)expect);
        exit(1);
    }
    return out;
}

/* ---- the test --------------------------------------------------------------------------------- */

typedef struct env {
    zt_config *cfg;
    zt_runtime *rt;
    zt_loaded_plugin lp;
    const zt_zero_ops *ops;
    zt_host_layout *layout;
    zt_model_info model;
} env;

static void open_env(const char *so, env *e)
{
    zt_error err;
    memset(e, 0, sizeof *e);
    if (zt_plugin_load(NULL, so, &e->lp, &err) != ZT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    e->ops = e->lp.plugin->ops;
    e->cfg = zt_config_new();
    uint32_t n_host;
    const zt_option *host = zt_host_options(&n_host);
    zt_runtime_options ro = {.n_threads = 2};
    if (zt_config_add_schema(e->cfg, "host", host, n_host, &err) != ZT_OK ||
        zt_config_add_schema(e->cfg, "zero0", e->lp.plugin->options, e->lp.plugin->n_options, &err) != ZT_OK ||
        zt_config_load_string(e->cfg, "{\"zero_optimization\": {\"overlap_comm\": true, \"reduce_bucket_size\": 64}}",
                              "test", &err) != ZT_OK ||
        zt_config_validate(e->cfg, &err) != ZT_OK || zt_runtime_create(&ro, e->cfg, &e->rt, &err) != ZT_OK ||
        zt_plugin_init(&e->lp, e->rt, &err) != ZT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    const zt_host *h = zt_runtime_host(e->rt, "test", NULL, 0);
    zt_group dp;
    int32_t rank0 = 0;
    ZT_CHECK_INT(h->group_create(h->ctx, "dp", &rank0, 1, &dp), ZT_OK);

    memset(&e->model, 0, sizeof e->model);
    e->model.struct_size = sizeof e->model;
    e->model.n_units = 3;
    e->model.n_params_decl = N_PARAMS;
    e->model.params = k_params;
    e->model.n_parameters = 100 + 231 + 5 + 2049 + 3;
    zt_layout_options lo = {1, "embed_tokens,q,w,extra", ZT_PARAM_NO_DECAY, NULL, NULL, NULL, 0, 0, 0};
    if (zt_layout_build(&e->model, &lo, &e->layout, &err) != ZT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}

static void close_env(env *e)
{
    zt_plugin_unload(&e->lp); /* fini before the layout it holds goes */
    zt_layout_free(e->layout);
    zt_runtime_destroy(e->rt);
    zt_config_free(e->cfg);
}

static const char *plugin_message(env *e)
{
    zt_status st;
    return zt_runtime_take_error(e->lp.host, &st);
}

static void test_zero0(const char *so, const char *fixture_dir)
{
    env e;
    open_env(so, &e);
    void *s = e.lp.state;
    zt_tensor views[3], grads[3];
    zt_step_result r = {.struct_size = sizeof r};
    zt_step_args a = {.struct_size = sizeof a, .step = 1, .lr = 0.1, .weight_decay = 0.01, .max_grad_norm = 1.0,
                      .loss_scale = 1.0};

    ZT_CHECK_INT(e.ops->step(s, &a, &r), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(plugin_message(&e), "zero0 step called before setup");
    ZT_CHECK_INT(e.ops->setup(s, &e.layout->layout, &k_recorder, NULL), ZT_OK);
    ZT_CHECK_INT(e.ops->stage, 0);

    /* Unit 1 holds q (231, padded to 240) as its trainable region, then the frozen parameter (5, padded
     * to 16) as its frozen region; the other units train everything. */
    const int64_t trained[3] = {112, 240, 2064}, padded_of[3] = {112, 256, 2064};
    for (int32_t u = 0; u < 3; u++) {
        ZT_CHECK_INT(e.layout->layout.trainable_numel[u], trained[u]);
        ZT_CHECK_INT(e.layout->layout.units[u].padded_numel, padded_of[u]);
    }
    ZT_CHECK_INT(e.layout->param_offset[FROZEN], 240);

    /* Masters with recognizable values: unit u element k = 1000 u + k, the frozen region likewise (by
     * its offset in the unit's buffer). */
    for (int32_t u = 0; u < 3; u++) {
        int64_t offset, count;
        e.ops->shard_range(s, u, &offset, &count);
        ZT_CHECK_INT(offset, 0);
        ZT_CHECK_INT(count, trained[u]);
        float *buf = malloc((size_t)padded_of[u] * sizeof *buf);
        for (int64_t k = 0; k < count; k++) buf[k] = (float)(1000 * u + k);
        ZT_CHECK_INT(e.ops->write_shard(s, u, ZT_SHARD_MASTER, buf), ZT_OK);
        e.ops->frozen_range(s, u, &offset, &count);
        ZT_CHECK_INT(count, padded_of[u] - trained[u]);
        if (count) ZT_CHECK_INT(offset, trained[u]);
        for (int64_t k = 0; k < count; k++) buf[k] = (float)(1000 * u + offset + k);
        if (count) ZT_CHECK_INT(e.ops->write_shard(s, u, ZT_SHARD_FROZEN, buf), ZT_OK);
        free(buf);
    }

    /* Forward views: the model reads the master; the tied head reads the embedding. */
    ZT_CHECK_INT(e.ops->before_unit(s, 1, ZT_PHASE_FORWARD, views, NULL), ZT_OK);
    ZT_CHECK(((float *)views[0].data)[0] == 1000.0f && ((float *)views[1].data)[0] == 1240.0f);
    ZT_CHECK(views[0].ndim == 2 && views[0].shape[0] == 7 && views[0].shape[1] == 33 && views[0].stride[0] == 33 &&
             views[0].stride[1] == 1 && views[0].dtype == ZT_F32 && views[0].device_type == ZT_DEVICE_CPU);
    zt_tensor embed_view, embed_grad;
    ZT_CHECK_INT(e.ops->before_unit(s, 0, ZT_PHASE_BACKWARD, &embed_view, &embed_grad), ZT_OK);
    ZT_CHECK_INT(e.ops->before_unit(s, 2, ZT_PHASE_BACKWARD, views, grads), ZT_OK);
    ZT_CHECK(views[2].data == embed_view.data && grads[2].data == embed_grad.data && grads[2].data != NULL);
    ZT_CHECK(((float *)views[0].data)[0] == 2000.0f);
    zt_tensor unit1_grads[2];
    ZT_CHECK_INT(e.ops->before_unit(s, 1, ZT_PHASE_BACKWARD, views, unit1_grads), ZT_OK);
    ZT_CHECK(unit1_grads[0].data != NULL);
    ZT_CHECK(unit1_grads[1].data == NULL); /* frozen: no gradient storage */
    ZT_CHECK(unit1_grads[1].shape[0] == 5);

    /* Gradients from the fixture: t0, t1, t2 (and 0 for "extra"). */
    char path[4096];
    snprintf(path, sizeof path, "%s/ops/global_norm.safetensors", fixture_dir);
    zt_st_file *f;
    zt_error err;
    if (zt_st_open(path, &f, &err) != ZT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    float *t0 = fixture_tensor(f, "t0", 100), *t1 = fixture_tensor(f, "t1", 231), *t2 = fixture_tensor(f, "t2", 2049);
    float *c0 = fixture_tensor(f, "clipped_t0", 100), *c1 = fixture_tensor(f, "clipped_t1", 231),
          *c2 = fixture_tensor(f, "clipped_t2", 2049);
    const double torch_norm = 1334.4586215788327, torch_clip = 0.0007493675585590704; /* global_norm.json */
    memcpy(embed_grad.data, t0, 100 * sizeof(float));
    memcpy(unit1_grads[0].data, t1, 231 * sizeof(float));
    memcpy(grads[0].data, t2, 2049 * sizeof(float));
    for (int u = 2; u >= 0; u--) ZT_CHECK_INT(e.ops->grads_ready(s, u, 1), ZT_OK);

    g_n_calls = 0;
    ZT_CHECK_INT(e.ops->step(s, &a, &r), ZT_OK);
    ZT_CHECK(!r.skipped);
    ZT_CHECK_CLOSE(r.grad_norm, torch_norm, 1e-12, 0);
    /* One optimizer call per run of trainable parameters with one decay flag: embed, q (no decay),
     * then w and extra together; the frozen parameter is never passed. */
    ZT_CHECK_INT(g_n_calls, 3);
    const uint64_t sizes[3] = {100, 231, 2052};
    const double decays[3] = {0.01, 0.0, 0.01};
    for (int i = 0; i < 3 && i < g_n_calls; i++) {
        ZT_CHECK_INT(g_calls[i].n, sizes[i]);
        ZT_CHECK(g_calls[i].weight_decay == decays[i]);
        ZT_CHECK(g_calls[i].lr == 0.1 && g_calls[i].step == 1);
        ZT_CHECK_CLOSE(g_calls[i].grad_scale, torch_clip, 1e-12, 0);
    }
    /* The scaled gradients the optimizer saw are torch's clipped gradients. */
    float *state = malloc(64 * 64 * sizeof *state);
    const float *clipped[3] = {c0, c1, c2};
    const int32_t unit_of[3] = {0, 1, 2};
    const int64_t count_of[3] = {100, 231, 2049};
    for (int i = 0; i < 3; i++) {
        ZT_CHECK_INT(e.ops->read_shard(s, unit_of[i], 1, state), ZT_OK);
        int bad = 0;
        for (int64_t k = 0; k < count_of[i]; k++)
            bad += !(fabsf(state[k] - clipped[i][k]) <= 1e-6f * fabsf(clipped[i][k]) + 1e-12f);
        ZT_CHECK_INT(bad, 0);
    }
    /* Layout order with zeros for the padding of the trainable region (the state covers only it). */
    ZT_CHECK_INT(e.ops->read_shard(s, 1, 1, state), ZT_OK);
    for (int64_t k = 231; k < trained[1]; k++) ZT_CHECK(state[k] == 0.0f);
    /* The master moved by lr * clipped gradient; the frozen parameter did not move. */
    ZT_CHECK_INT(e.ops->read_shard(s, 1, ZT_SHARD_MASTER, state), ZT_OK);
    ZT_CHECK_CLOSE(state[3], 1003.0f - 0.1f * c1[3], 1e-7, 1e-5);
    ZT_CHECK_INT(e.ops->read_shard(s, 1, ZT_SHARD_FROZEN, state), ZT_OK);
    for (int k = 0; k < 5; k++) ZT_CHECK(state[k] == (float)(1240 + k));

    /* Gradients that arrive multiplied by a loss scale of 4: the norm is reported unscaled. */
    a.step = 2;
    a.loss_scale = 4.0;
    g_n_calls = 0;
    ZT_CHECK_INT(e.ops->step(s, &a, &r), ZT_OK);
    ZT_CHECK_CLOSE(r.grad_norm, torch_norm / 4, 1e-12, 0);
    ZT_CHECK_CLOSE(g_calls[0].grad_scale, 1.0 / (torch_norm / 4 + 1e-6) / 4, 1e-12, 0);
    /* No clipping: the scale is 1 / loss_scale alone. */
    a.max_grad_norm = 0;
    g_n_calls = 0;
    ZT_CHECK_INT(e.ops->step(s, &a, &r), ZT_OK);
    ZT_CHECK(g_calls[0].grad_scale == 0.25);

    /* A non-finite gradient: no update at all. */
    ((float *)unit1_grads[0].data)[7] = NAN;
    ZT_CHECK_INT(e.ops->read_shard(s, 2, ZT_SHARD_MASTER, state), ZT_OK);
    float before = state[10];
    g_n_calls = 0;
    a.loss_scale = 1;
    ZT_CHECK_INT(e.ops->step(s, &a, &r), ZT_OK);
    ZT_CHECK(r.skipped == 1 && isnan(r.grad_norm) && g_n_calls == 0);
    ZT_CHECK_INT(e.ops->read_shard(s, 2, ZT_SHARD_MASTER, state), ZT_OK);
    ZT_CHECK(state[10] == before);

    /* zero_grad clears every gradient. */
    ZT_CHECK_INT(e.ops->zero_grad(s), ZT_OK);
    int nonzero = 0;
    for (int k = 0; k < 231; k++) nonzero += ((float *)unit1_grads[0].data)[k] != 0.0f;
    for (int k = 0; k < 100; k++) nonzero += ((float *)embed_grad.data)[k] != 0.0f;
    ZT_CHECK_INT(nonzero, 0);

    /* Optimizer state round trip through a shard. */
    int64_t padded = e.layout->layout.units[2].padded_numel;
    for (int64_t k = 0; k < padded; k++) state[k] = k < 2052 ? (float)k * 0.5f : 0.0f;
    ZT_CHECK_INT(e.ops->write_shard(s, 2, 1, state), ZT_OK);
    float *back = malloc((size_t)padded * sizeof *back);
    ZT_CHECK_INT(e.ops->read_shard(s, 2, 1, back), ZT_OK);
    ZT_CHECK(memcmp(back, state, (size_t)padded * sizeof *back) == 0);
    free(back);

    /* Errors name what is wrong. */
    ZT_CHECK_INT(e.ops->before_unit(s, 7, ZT_PHASE_FORWARD, views, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(plugin_message(&e), "unit 7 is not in [0, 3)");
    ZT_CHECK_INT(e.ops->read_shard(s, 0, 5, state), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(plugin_message(&e), "array 5 is neither the master (0) nor one of the 1 optimizer states");
    ZT_CHECK_INT(e.ops->setup(s, &e.layout->layout, &k_recorder, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(plugin_message(&e), "setup called twice");

    /* DeepSpeed's stage-0 figures on the CPU in fp32: 4 + 4 + 4k bytes per parameter. */
    zt_estimate_in in = {.struct_size = sizeof in, .dp_size = 1, .n_optimizer_states = 2, .n_parameters = 1000,
                         .compute_dtype = ZT_F32, .model = &e.model};
    zt_mem_estimate out = {.struct_size = sizeof out};
    ZT_CHECK_INT(e.ops->estimate(s, &in, &out), ZT_OK);
    ZT_CHECK(out.host[ZT_POOL_PARAMS] == 4000 && out.host[ZT_POOL_GRADS] == 4000 &&
             out.host[ZT_POOL_OPTIMIZER] == 8000 && out.device[ZT_POOL_PARAMS] == 0);
    /* With the layout's trainable flags (ABI 1.3) the frozen parameter (5 elements) costs only its
     * fp32 compute copy: 2388 parameters in the copy, 2383 in the gradients and the two states. */
    in.n_parameters = 2388;
    in.trainable = e.layout->layout.trainable;
    ZT_CHECK_INT(e.ops->estimate(s, &in, &out), ZT_OK);
    ZT_CHECK(out.host[ZT_POOL_PARAMS] == 4 * 2388 && out.host[ZT_POOL_GRADS] == 4 * 2383 &&
             out.host[ZT_POOL_OPTIMIZER] == 8 * 2383);

    free(state);
    free(t0), free(t1), free(t2), free(c0), free(c1), free(c2);
    zt_st_close(f);
    close_env(&e);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s LIBZT_ZERO0_SO FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    test_zero0(argv[1], argv[2]);
    return zt_test_result();
}
