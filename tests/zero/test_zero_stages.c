/* The ZeRO plugins zero0..zero3 (one source set, plugins/zero) loaded as zt-run loads them,
 * in one process, driven with a recording optimizer defined here and hand-computed gradients:
 *   - what each stage keeps resident (pool counters around before_unit / grads_ready / after_unit),
 *   - tied storage (the LM head reads and accumulates into the embedding of unit 0), frozen
 *     parameters, gradient accumulation over two micro-batches, the global norm and clipping, the
 *     optimizer ranges, updated weights reaching the model's views after the step and after a
 *     write_shard, through staging buckets smaller than every unit,
 *   - the memory estimates of stages 1-3 against the formulas worked out by hand below,
 *   - the options each stage refuses, with their messages.
 * Multi-rank behaviour is tested end to end by run_test.sh.
 * usage: test_zero_stages ZERO0_SO ZERO1_SO ZERO2_SO ZERO3_SO */
#include <math.h>

#include "config/config.h"
#include "train/layout.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "ztest.h"

/* unit 0: embed [100]
 * unit 1: q [7, 33] (no decay), frozen [5] (not trainable)
 * unit 2: w [2049], extra [3], lm_head tied to embed */
static zt_param_decl k_params[] = {
    {"model.embed_tokens.weight", 1, 0, {100}, 0, ZT_PARAM_EMBEDDING, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.0.q.weight", 2, 1, {7, 33}, 0, ZT_PARAM_NO_DECAY, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.0.frozen.weight", 1, 1, {5}, 0, 0, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.1.w.weight", 1, 2, {2049}, 0, 0, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.1.extra.weight", 1, 2, {3}, 0, 0, ZT_INIT_NORMAL, 0.02f, NULL},
    {"lm_head.weight", 1, 2, {100}, 0, ZT_PARAM_TIED, ZT_INIT_NORMAL, 0.02f, "model.embed_tokens.weight"},
};
enum { EMBED, Q, FROZEN, W, EXTRA, LM, N_PARAMS };
static const int64_t k_numel[N_PARAMS] = {100, 231, 5, 2049, 3, 100};
/* The gradient each backward writes into each parameter's view, per micro-batch; the tied head's
 * lands on the embedding, which then receives 1.0 (unit 0) + 2.0 (unit 2) per micro-batch. */
static const float k_grad[N_PARAMS] = {1.0f, 0.5f, 0.0f, 0.25f, -1.0f, 2.0f};

/* ---- a recording optimizer: p -= lr * scale * g; its one state accumulates scale * g ----------- */

typedef struct call {
    uint64_t n;
    double weight_decay, grad_scale;
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
    if (g_n_calls < 16) g_calls[g_n_calls] = (call){n, h->weight_decay, h->grad_scale};
    g_n_calls++;
    for (uint64_t i = 0; i < n; i++) {
        float g = grad[i] * (float)h->grad_scale;
        param[i] -= (float)h->lr * g;
        state[0][i] += g;
    }
    return ZT_OK;
}

static const zt_optimizer_ops k_recorder = {sizeof(zt_optimizer_ops), 0, rec_n_state, rec_state_name, rec_step};

/* ---- environment ------------------------------------------------------------------------------ */

typedef struct env {
    zt_config *cfg;
    zt_runtime *rt;
    zt_loaded_plugin lp;
    const zt_zero_ops *ops;
    zt_host_layout *layout;
    zt_model_info model;
    zt_error err;
} env;

/* Loads `so` under `config_json`; returns the status of its init (err holds the message). */
static zt_status open_env(const char *so, const char *config_json, env *e)
{
    memset(e, 0, sizeof *e);
    if (zt_plugin_load(NULL, so, &e->lp, &e->err) != ZT_OK) {
        fprintf(stderr, "%s\n", e->err.msg);
        exit(1);
    }
    e->ops = e->lp.plugin->ops;
    e->cfg = zt_config_new();
    uint32_t n_host;
    const zt_option *host = zt_host_options(&n_host);
    zt_runtime_options ro = {.n_threads = 2, .single_process = 1};
    if (zt_config_add_schema(e->cfg, "host", host, n_host, &e->err) != ZT_OK ||
        zt_config_add_schema(e->cfg, e->lp.desc.name, e->lp.plugin->options, e->lp.plugin->n_options, &e->err) !=
            ZT_OK ||
        zt_config_load_string(e->cfg, config_json, "test", &e->err) != ZT_OK ||
        zt_config_validate(e->cfg, &e->err) != ZT_OK || zt_runtime_create(&ro, e->cfg, &e->rt, &e->err) != ZT_OK) {
        fprintf(stderr, "%s\n", e->err.msg);
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
    if (zt_layout_build(&e->model, &lo, &e->layout, &e->err) != ZT_OK) {
        fprintf(stderr, "%s\n", e->err.msg);
        exit(1);
    }
    return zt_plugin_init(&e->lp, e->rt, &e->err);
}

static void close_env(env *e)
{
    zt_plugin_unload(&e->lp); /* fini before the layout it holds goes */
    zt_layout_free(e->layout);
    zt_runtime_destroy(e->rt);
    zt_config_free(e->cfg);
}

static uint64_t pool_now(env *e, int pool)
{
    zt_mem_stats s;
    zt_runtime_mem_stats(e->rt, pool, ZT_MEM_HOST, &s);
    return s.current;
}

/* ---- one stage through two micro-batches and a step ------------------------------------------- */

/* One micro-batch's backward, units in reverse as the trainer runs them: each parameter's gradient
 * view receives k_grad (added, as the model accumulates). Checks what each stage holds meanwhile. */
static void backward(env *e, int stage)
{
    void *s = e->lp.state;
    zt_tensor views[3], grads[3];
    const int32_t first[3] = {EMBED, Q, W}, count[3] = {1, 2, 3};
    for (int32_t u = 2; u >= 0; u--) {
        uint64_t grads_before = pool_now(e, ZT_POOL_GRADS);
        ZT_CHECK_INT(e->ops->before_unit(s, u, ZT_PHASE_BACKWARD, views, grads), ZT_OK);
        if (stage >= 2) /* the unit's full gradients (and, for the head, the embedding's) appear */
            ZT_CHECK_INT(pool_now(e, ZT_POOL_GRADS) - grads_before,
                         4 * (e->layout->trainable_numel[u] + (u == 2 ? e->layout->trainable_numel[0] : 0)));
        for (int32_t k = 0; k < count[u]; k++) {
            int32_t i = first[u] + k;
            ZT_CHECK_INT(grads[k].shape[0], k_params[i].shape[0]);
            if (i == FROZEN) {
                ZT_CHECK(grads[k].data == NULL);
                continue;
            }
            for (int64_t j = 0; j < k_numel[i]; j++) ((float *)grads[k].data)[j] += k_grad[i];
        }
        ZT_CHECK_INT(e->ops->grads_ready(s, u, 1), ZT_OK);
        if (stage >= 2) ZT_CHECK_INT(pool_now(e, ZT_POOL_GRADS), grads_before); /* reduced and freed */
        ZT_CHECK_INT(e->ops->after_unit(s, u, ZT_PHASE_BACKWARD), ZT_OK);
    }
}

static void test_stage(const char *so, int stage)
{
    env e;
    /* Buckets of 64 elements: every unit is reduced and gathered in pieces through staging. */
    const char *buckets = "{\"zero_optimization\": {\"reduce_bucket_size\": 64, \"allgather_bucket_size\": 64}}";
    ZT_CHECK_INT(open_env(so, buckets, &e), ZT_OK);
    void *s = e.lp.state;
    ZT_CHECK_INT(e.ops->stage, stage);
    ZT_CHECK_INT(e.ops->setup(s, &e.layout->layout, &k_recorder, NULL), ZT_OK);
    const int64_t padded[3] = {e.layout->units[0].padded_numel, e.layout->units[1].padded_numel,
                               e.layout->units[2].padded_numel};
    /* multiples of 16; unit 1 is q (231, padded to 240) then the frozen region (5, padded to 16) */
    ZT_CHECK(padded[0] == 112 && padded[1] == 256 && padded[2] == 2064);
    const int64_t trained[3] = {112, 240, 2064};
    for (int u = 0; u < 3; u++) ZT_CHECK_INT(e.layout->trainable_numel[u], trained[u]);

    /* Resident after setup: stage 0 one full copy (the master of the trainable regions), stages 1-2
     * the full copy and the master shard of the trainable regions, stage 3 the master shard and the
     * frozen shard (one rank: each shard is the whole region). The frozen parameter costs only its
     * copy: 16 elements, never a master, gradient or state element. */
    int64_t total = padded[0] + padded[1] + padded[2], total_trained = trained[0] + trained[1] + trained[2];
    ZT_CHECK_INT(pool_now(&e, ZT_POOL_PARAMS),
                 4 * (stage == 0 ? total : stage <= 2 ? total + total_trained : total_trained + 16));
    ZT_CHECK_INT(pool_now(&e, ZT_POOL_COMM), stage >= 1 ? 2 * 64 * 4 : 0); /* reduce + gather staging */
    /* stage 0 packs gradients and state by trainable element: 100 + 231 + 2052 = 2383 */
    ZT_CHECK_INT(pool_now(&e, ZT_POOL_OPTIMIZER), 4 * 2383);
    ZT_CHECK_INT(pool_now(&e, ZT_POOL_GRADS), 4 * (stage == 0 ? 2383 : total_trained));

    /* Masters with recognizable values: unit u element k = 1000 u + k; the frozen region likewise. */
    float *buf = malloc(4096 * sizeof *buf);
    for (int32_t u = 0; u < 3; u++) {
        int64_t offset, count;
        e.ops->shard_range(s, u, &offset, &count);
        ZT_CHECK(offset == 0 && count == trained[u]);
        for (int64_t k = 0; k < count; k++) buf[k] = (float)(1000 * u + k);
        ZT_CHECK_INT(e.ops->write_shard(s, u, ZT_SHARD_MASTER, buf), ZT_OK);
        e.ops->frozen_range(s, u, &offset, &count);
        ZT_CHECK_INT(count, padded[u] - trained[u]);
        for (int64_t k = 0; k < count; k++) buf[k] = (float)(1000 * u + offset + k);
        if (count) ZT_CHECK_INT(offset, trained[u]);
        if (count) ZT_CHECK_INT(e.ops->write_shard(s, u, ZT_SHARD_FROZEN, buf), ZT_OK);
    }

    /* Forward views read the masters (gathered for stage 3, refreshed for stages 1-2); the tied
     * head reads the embedding. */
    zt_tensor views[3];
    uint64_t params_before = pool_now(&e, ZT_POOL_PARAMS);
    ZT_CHECK_INT(e.ops->before_unit(s, 2, ZT_PHASE_FORWARD, views, NULL), ZT_OK);
    if (stage == 3) ZT_CHECK_INT(pool_now(&e, ZT_POOL_PARAMS) - params_before, 4 * (padded[2] + padded[0]));
    ZT_CHECK(((float *)views[0].data)[5] == 2005.0f && ((float *)views[2].data)[7] == 7.0f);
    ZT_CHECK(views[2].ndim == 1 && views[2].shape[0] == 100 && views[2].dtype == ZT_F32);
    ZT_CHECK_INT(e.ops->after_unit(s, 2, ZT_PHASE_FORWARD), ZT_OK);
    ZT_CHECK_INT(pool_now(&e, ZT_POOL_PARAMS), params_before); /* stage 3 released both */

    /* Two micro-batches, then the step. Per micro-batch the embedding gets 1 + 2 = 3, q 0.5, w 0.25,
     * extra -1; over two: 6, 1, 0.5, -2. Norm: sqrt(100 * 36 + 231 * 1 + 2049 * 0.25 + 3 * 4) =
     * sqrt(4355.25); clipping to 1 scales by 1 / (norm + 1e-6). */
    backward(&e, stage);
    backward(&e, stage);
    zt_step_args a = {.struct_size = sizeof a, .step = 1, .lr = 0.1, .weight_decay = 0.01, .max_grad_norm = 1.0,
                      .loss_scale = 1.0};
    zt_step_result r = {.struct_size = sizeof r};
    g_n_calls = 0;
    ZT_CHECK_INT(e.ops->step(s, &a, &r), ZT_OK);
    const double norm = sqrt(4355.25), clip = 1.0 / (norm + 1e-6);
    ZT_CHECK(!r.skipped);
    ZT_CHECK_CLOSE(r.grad_norm, norm, 1e-12, 0);
    /* One optimizer call per run of trainable parameters with one decay flag. */
    ZT_CHECK_INT(g_n_calls, 3);
    const uint64_t sizes[3] = {100, 231, 2052};
    const double decays[3] = {0.01, 0.0, 0.01};
    for (int i = 0; i < 3 && i < g_n_calls; i++) {
        ZT_CHECK_INT(g_calls[i].n, sizes[i]);
        ZT_CHECK(g_calls[i].weight_decay == decays[i]);
        ZT_CHECK_CLOSE(g_calls[i].grad_scale, clip, 1e-12, 0);
    }
    /* The optimizer saw the accumulated gradients: its state holds clip * g, positional with zeros
     * for the frozen parameter and the padding. */
    ZT_CHECK_INT(e.ops->read_shard(s, 0, 1, buf), ZT_OK);
    ZT_CHECK_CLOSE(buf[0], 6 * clip, 1e-6, 0);
    ZT_CHECK_CLOSE(buf[99], 6 * clip, 1e-6, 0);
    ZT_CHECK(buf[100] == 0.0f);
    ZT_CHECK_INT(e.ops->read_shard(s, 1, 1, buf), ZT_OK);
    ZT_CHECK_CLOSE(buf[230], 1 * clip, 1e-6, 0);
    ZT_CHECK(buf[231] == 0.0f && buf[235] == 0.0f);
    ZT_CHECK_INT(e.ops->read_shard(s, 2, 1, buf), ZT_OK);
    ZT_CHECK_CLOSE(buf[2048], 0.5 * clip, 1e-6, 0);
    ZT_CHECK_CLOSE(buf[2049], -2 * clip, 1e-6, 0);
    ZT_CHECK(buf[2052] == 0.0f);

    /* The updated weights reach the model's views; the frozen one did not move. */
    ZT_CHECK_INT(e.ops->before_unit(s, 1, ZT_PHASE_FORWARD, views, NULL), ZT_OK);
    ZT_CHECK_CLOSE(((float *)views[0].data)[3], 1003.0 - 0.1 * clip * 1.0, 1e-7, 0);
    ZT_CHECK(((float *)views[1].data)[4] == 1244.0f);
    ZT_CHECK_INT(e.ops->read_shard(s, 1, ZT_SHARD_FROZEN, buf), ZT_OK);
    ZT_CHECK(buf[0] == 1240.0f && buf[4] == 1244.0f);
    ZT_CHECK_INT(e.ops->after_unit(s, 1, ZT_PHASE_FORWARD), ZT_OK);
    ZT_CHECK_INT(e.ops->read_shard(s, 0, ZT_SHARD_MASTER, buf), ZT_OK);
    ZT_CHECK_CLOSE(buf[10], 10.0 - 0.1 * clip * 6.0, 1e-7, 0);

    /* zero_grad: the next step starts from nothing (a step without backward has norm 0). */
    ZT_CHECK_INT(e.ops->zero_grad(s), ZT_OK);
    a.step = 2;
    ZT_CHECK_INT(e.ops->step(s, &a, &r), ZT_OK);
    ZT_CHECK(r.grad_norm == 0.0 && !r.skipped);

    /* Errors name what is wrong. */
    char prefix[32];
    snprintf(prefix, sizeof prefix, "zero%d ", stage);
    zt_status ignored;
    ZT_CHECK_INT(e.ops->before_unit(s, 3, ZT_PHASE_FORWARD, views, NULL), ZT_ERR_INVALID_ARG);
    const char *msg = zt_runtime_take_error(e.lp.host, &ignored);
    ZT_CHECK_CONTAINS(msg, prefix);
    ZT_CHECK_CONTAINS(msg, "before_unit: unit 3 is not in [0, 3)");
    ZT_CHECK_INT(e.ops->before_unit(s, 0, 7, views, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(e.lp.host, &ignored), "phase 7 is neither forward (0) nor backward (1)");
    ZT_CHECK_INT(e.ops->write_shard(s, 0, 2, buf), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(e.lp.host, &ignored),
                      "array 2 is neither the master (0) nor one of the 1 optimizer states");

    /* The estimate for 1000 parameters, AdamW's 2 states, 4 ranks, this model: the largest unit a
     * backward touches is unit 2 (w 2049 + extra 3) with the tied embedding (100): 2152 elements.
     *   stage 1: params 4000 + 4000/4 = 5000, grads 4000, optimizer 8000/4 = 2000
     *   stage 2: params 5000, grads 1000 + 4 x 2152 = 9608, optimizer 2000
     *   stage 3: params 1000 + 8608 = 9608, grads 9608, optimizer 2000
     * Buckets of 64 over 4 ranks: 16 elements per rank, less than the largest slice (2052 / 4), so
     * stages 1-3 hold a reduce and a gather bucket of 4 x 16 floats each: 512 bytes. */
    zt_estimate_in in = {.struct_size = sizeof in, .dp_size = 4, .n_optimizer_states = 2, .n_parameters = 1000,
                         .compute_dtype = ZT_F32, .model = &e.model};
    zt_mem_estimate out = {.struct_size = sizeof out};
    ZT_CHECK_INT(e.ops->estimate(s, &in, &out), ZT_OK);
    const double want[4][4] = {{4000, 4000, 8000, 0}, {5000, 4000, 2000, 512}, {5000, 9608, 2000, 512},
                               {9608, 9608, 2000, 512}};
    ZT_CHECK(out.host[ZT_POOL_PARAMS] == want[stage][0]);
    ZT_CHECK(out.host[ZT_POOL_GRADS] == want[stage][1]);
    ZT_CHECK(out.host[ZT_POOL_OPTIMIZER] == want[stage][2]);
    ZT_CHECK(out.host[ZT_POOL_COMM] == want[stage][3]);
    ZT_CHECK(out.device[ZT_POOL_PARAMS] == 0 && out.host[ZT_POOL_ACTIVATIONS] == 0);

    free(buf);
    close_env(&e);
}

/* Options a stage refuses at init, with what to do about it. */
static void test_refused(const char *so, const char *config_json, const char *message)
{
    env e;
    ZT_CHECK_INT(open_env(so, config_json, &e), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(e.err.msg, message);
    close_env(&e);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s ZERO0_SO ZERO1_SO ZERO2_SO ZERO3_SO\n", argv[0]);
        return 2;
    }
    for (int stage = 0; stage <= 3; stage++) test_stage(argv[1 + stage], stage);

    test_refused(argv[1], "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\"}}}",
                 "offloading the optimizer needs a sharded optimizer (stage 1, 2 or 3, as in DeepSpeed)");
    for (int stage = 1; stage <= 2; stage++)
        test_refused(argv[1 + stage], "{\"zero_optimization\": {\"offload_param\": {\"device\": \"cpu\"}}}",
                     "offloading parameters needs stage 3 (as in DeepSpeed); set zero_optimization.stage to 3");
    test_refused(argv[4], "{\"zero_optimization\": {\"allgather_partitions\": false}}",
                 "zero_optimization.allgather_partitions is false, but zt always gathers updated parameters");
    test_refused(argv[3], "{\"zero_optimization\": {\"contiguous_gradients\": false}}",
                 "zero_optimization.contiguous_gradients is false");
    /* Offload is accepted where DeepSpeed accepts it. */
    env e;
    ZT_CHECK_INT(open_env(argv[4], "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", "
                                   "\"pin_memory\": true}, \"offload_param\": {\"device\": \"cpu\"}}}", &e),
                 ZT_OK);
    close_env(&e);
    return zt_test_result();
}
