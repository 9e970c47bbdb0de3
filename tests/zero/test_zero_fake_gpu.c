/* The zero plugins' GPU paths, offload included, without a GPU: plugins/zero's sources compiled for
 * one stage (ZT_ZERO_STAGE) with ZT_PLUGIN_CUDA against fake_zero_cuda.c (device memory is host
 * memory, kernels are CPU loops, stream copies are deferred until the stream order says they must
 * have happened), driven through its ops by a stub model on a host table whose device says CUDA.
 *
 * Each offload configuration trains 3 steps and must give BIT FOR BIT the masters, optimizer state
 * and bf16 views (every forward of every step, and after the last) of the same run without offload:
 * the test optimizer does the same float arithmetic on either side, the clip factor is 1 (a huge
 * max_grad_norm keeps the clipped path), and gradients are added in the same order. The gradient
 * norms agree to 1e-6 (the fake device norm is a float, the offload CPU norm a double). Gradients
 * depend on the bf16 views, so a stale view, a stale or torn gradient copy, a skipped add, a wrong
 * offset or a frozen element overwritten changes the weights.
 *   - offload_optimizer (pinned, pageable), 2 micro-batches (host adds of downloaded slices, the tied
 *     embedding's second writer), stages 1-3; stage 3 also with offload_param, and offload_param alone;
 *   - early steps (gradient_clipping 0, 1 micro-batch): the offload thread steps units during the
 *     backward (checked: the optimizer runs before step() is called);
 *   - an optimizer without compute_copy (the bf16 converted by the plugin).
 * The optimizer must run on the offload thread in offload runs, and the fake must have deferred copies.
 * usage: test_zero_fake_gpu (one executable per stage: 1, 2, 3) */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <zt/zt.h>

#include "config/config.h"
#include "train/layout.h"
#include "host/runtime.h"
#include "ztest.h"

#ifndef ZT_ZERO_STAGE
#error "compile with -DZT_ZERO_STAGE"
#endif
#define STAGE ZT_ZERO_STAGE

extern long fake_zero_cuda_deferred[2];
int fake_zero_cuda_idle(void);
const zt_plugin *zt_plugin_entry(void);

/* unit 0: embed [100]; unit 1: q [7, 33] (no decay), frozen [5]; unit 2: w [2049], extra [3], lm_head
 * tied to embed (as test_zero_stages.c) */
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
static const float k_grad[N_PARAMS] = {1.0f, 0.5f, 0.0f, 0.25f, -1.0f, 2.0f};
static const int32_t k_first[3] = {EMBED, Q, W}, k_count[3] = {1, 2, 3};
#define N_STEPS 3
#define MAX_UNIT 2064
#define VIEW_ELEMS (100 + 231 + 5 + 2049 + 3 + 100)

static float bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t bf16_of(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* The frozen parameter's starting value at element k of unit 1's buffer; exact in bf16. */
static float frozen_value(int64_t k)
{
    return 0.75f + 0.0078125f * (float)(k % 16);
}

/* ---- the test optimizer: decoupled decay, p -= lr * (scale * g + wd * p); state += scale * g ---- */

static pthread_t g_main;
static atomic_int g_calls, g_calls_on_main, g_calls_total;

static int32_t t_n_state(void *s)
{
    (void)s;
    return 1;
}
static const char *t_state_name(void *s, int32_t i)
{
    (void)s;
    return i == 0 ? "acc" : NULL;
}
static zt_status t_step(void *s, const zt_optim_hparams *h, float *param, const float *grad, float *const *state,
                        uint64_t n, int32_t device_type, void *stream)
{
    (void)s, (void)device_type, (void)stream; /* fake device memory is host memory */
    atomic_fetch_add(&g_calls, 1);
    atomic_fetch_add(&g_calls_total, 1);
    if (pthread_equal(pthread_self(), g_main)) atomic_fetch_add(&g_calls_on_main, 1);
    uint16_t *copy = h->struct_size >= ZT_OPTIM_HPARAMS_SIZE_1_1 ? h->compute_copy : NULL;
    for (uint64_t i = 0; i < n; i++) {
        float g = grad[i] * (float)h->grad_scale;
        param[i] -= (float)h->lr * (g + (float)h->weight_decay * param[i]);
        state[0][i] += g;
        if (copy) copy[i] = bf16_of(param[i]);
    }
    return ZT_OK;
}
static const zt_optimizer_ops k_opt_copy = {sizeof(zt_optimizer_ops), ZT_OPTIM_WRITES_COMPUTE_COPY, t_n_state,
                                            t_state_name, t_step};
static const zt_optimizer_ops k_opt_plain = {sizeof(zt_optimizer_ops), 0, t_n_state, t_state_name, t_step};

/* ---- a host whose device says CUDA: device and pinned memory are host memory ------------------ */

static const zt_host *g_real;
static zt_host g_host;
static zt_device_ctx g_device;

static void *fake_alloc(void *ctx, int32_t pool, int32_t where, uint64_t bytes, uint64_t alignment, const char *tag)
{
    (void)where;
    return g_real->alloc(ctx, pool, ZT_MEM_HOST, bytes, alignment, tag);
}

typedef struct env {
    zt_config *cfg;
    zt_runtime *rt;
    zt_host_layout *layout;
    zt_model_info model;
    const zt_plugin *plugin;
    const zt_zero_ops *ops;
    void *state;
    zt_error err;
} env;

static int open_env(const char *config_json, env *e)
{
    memset(e, 0, sizeof *e);
    e->plugin = zt_plugin_entry();
    e->ops = e->plugin->ops;
    e->cfg = zt_config_new();
    uint32_t n_host;
    const zt_option *host = zt_host_options(&n_host);
    zt_runtime_options ro = {.n_threads = 2, .single_process = 1};
    if (zt_config_add_schema(e->cfg, "host", host, n_host, &e->err) != ZT_OK ||
        zt_config_add_schema(e->cfg, e->plugin->name, e->plugin->options, e->plugin->n_options, &e->err) != ZT_OK ||
        zt_config_load_string(e->cfg, config_json, "test", &e->err) != ZT_OK ||
        zt_config_validate(e->cfg, &e->err) != ZT_OK || zt_runtime_create(&ro, e->cfg, &e->rt, &e->err) != ZT_OK) {
        fprintf(stderr, "%s\n", e->err.msg);
        exit(1);
    }
    g_real = zt_runtime_host(e->rt, e->plugin->name, e->plugin->options, e->plugin->n_options);
    zt_group dp;
    int32_t rank0 = 0;
    ZT_CHECK_INT(g_real->group_create(g_real->ctx, "dp", &rank0, 1, &dp), ZT_OK);
    g_host = *g_real;
    g_device = *g_real->device;
    g_device.device_type = ZT_DEVICE_CUDA;
    g_device.compute_stream = (void *)&g_device.compute_stream; /* never dereferenced by the fake */
    g_device.comm_stream = (void *)&g_device.comm_stream;
    g_device.copy_stream = (void *)&g_device.copy_stream;
    g_host.device = &g_device;
    g_host.alloc = fake_alloc;
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
    e->layout->layout.compute_dtype = ZT_BF16;
    zt_status st = e->plugin->init(&g_host, &e->state);
    if (st != ZT_OK) fprintf(stderr, "init: %s\n", zt_runtime_take_error(g_real, &st));
    return st == ZT_OK;
}

static void close_env(env *e)
{
    e->plugin->fini(e->state);
    zt_layout_free(e->layout);
    zt_runtime_destroy(e->rt);
    zt_config_free(e->cfg);
}

static const char *take_error(void)
{
    zt_status st;
    return zt_runtime_take_error(g_real, &st);
}

/* ---- one run ---------------------------------------------------------------------------------- */

typedef struct result {
    float master[3][MAX_UNIT], state[3][MAX_UNIT];
    uint16_t views[N_STEPS + 1][VIEW_ELEMS]; /* every forward's views, then after the last step */
    double norms[N_STEPS];
    int early_calls; /* optimizer calls seen before step() of the last step */
} result;

/* The views of unit u into out (its parameters' elements in order); returns how many. */
static int64_t copy_views(const zt_tensor *views, int32_t u, uint16_t *out)
{
    int64_t n = 0;
    for (int32_t k = 0; k < k_count[u]; k++) {
        int32_t i = k_first[u] + k;
        ZT_CHECK_INT(views[k].dtype, ZT_BF16);
        memcpy(out + n, views[k].data, (size_t)k_numel[i] * sizeof(uint16_t));
        n += k_numel[i];
    }
    return n;
}

static void forward(env *e, uint16_t *out)
{
    zt_tensor views[3];
    int64_t at = 0;
    for (int32_t u = 0; u < 3; u++) {
        ZT_CHECK_INT(e->ops->before_unit(e->state, u, ZT_PHASE_FORWARD, views, NULL), ZT_OK);
        at += copy_views(views, u, out + at);
        ZT_CHECK_INT(e->ops->after_unit(e->state, u, ZT_PHASE_FORWARD), ZT_OK);
    }
    ZT_CHECK_INT(at, VIEW_ELEMS);
}

/* One micro-batch's backward: each gradient element depends on the bf16 parameter it belongs to
 * (and on the micro-batch), added into the view as a model accumulates. */
static void backward(env *e, int micro, int last)
{
    zt_tensor views[3], grads[3];
    for (int32_t u = 2; u >= 0; u--) {
        ZT_CHECK_INT(e->ops->before_unit(e->state, u, ZT_PHASE_BACKWARD, views, grads), ZT_OK);
        for (int32_t k = 0; k < k_count[u]; k++) {
            int32_t i = k_first[u] + k;
            if (i == FROZEN) {
                ZT_CHECK(grads[k].data == NULL);
                continue;
            }
            const uint16_t *p = views[k].data;
            float *g = grads[k].data;
            for (int64_t j = 0; j < k_numel[i]; j++)
                g[j] += k_grad[i] * (1.0f + 0.5f * (float)micro) + 0.25f * bf16_to_float(p[j]);
        }
        ZT_CHECK_INT(e->ops->grads_ready(e->state, u, last), ZT_OK);
        ZT_CHECK_INT(e->ops->after_unit(e->state, u, ZT_PHASE_BACKWARD), ZT_OK);
    }
}

static void sleep_ms(int ms)
{
    struct timespec t = {0, (long)ms * 1000000L};
    nanosleep(&t, NULL);
}

/* Trains N_STEPS steps under config_json; early: clip 0 and one micro-batch (else a huge clip norm
 * and two micro-batches). Returns 0 when the run could not be set up (already reported). */
static int run(const char *label, const char *config_json, const zt_optimizer_ops *opt, int early, result *out)
{
    memset(out, 0, sizeof *out);
    env e;
    if (!open_env(config_json, &e)) {
        ZT_CHECK(0 && "init failed");
        return 0;
    }
    zt_status st = e.ops->setup(e.state, &e.layout->layout, opt, NULL);
    if (st != ZT_OK) {
        fprintf(stderr, "%s: setup: %s\n", label, take_error());
        ZT_CHECK(0 && "setup failed");
        close_env(&e);
        return 0;
    }
    /* masters: unit u element k = 0.5 + 0.01 u + 0.001 (k mod 97), padding included (never trained);
     * the frozen region (unit 1 from element 240: the frozen parameter, then padding) likewise by its
     * offset in the unit's buffer, written once in fp32 and kept only as bf16 */
    float buf[MAX_UNIT];
    for (int32_t u = 0; u < 3; u++) {
        int64_t offset, count;
        e.ops->shard_range(e.state, u, &offset, &count);
        ZT_CHECK_INT(count, e.layout->trainable_numel[u]);
        for (int64_t k = 0; k < count; k++) buf[k] = 0.5f + 0.01f * (float)u + 0.001f * (float)(k % 97);
        ZT_CHECK_INT(e.ops->write_shard(e.state, u, ZT_SHARD_MASTER, buf), ZT_OK);
        e.ops->frozen_range(e.state, u, &offset, &count);
        ZT_CHECK_INT(count, u == 1 ? 16 : 0);
        for (int64_t k = 0; k < count; k++) buf[k] = frozen_value(offset + k);
        if (count) ZT_CHECK_INT(e.ops->write_shard(e.state, u, ZT_SHARD_FROZEN, buf), ZT_OK);
    }
    int accum = early ? 1 : 2;
    for (int step = 1; step <= N_STEPS; step++) {
        zt_step_args a = {.struct_size = sizeof a, .step = step, .lr = 0.05, .weight_decay = 0.1,
                          .max_grad_norm = early ? 0.0 : 1e9, .loss_scale = 1.0};
        ZT_CHECK_INT(e.ops->begin_step(e.state, &a), ZT_OK);
        for (int m = 0; m < accum; m++) {
            forward(&e, out->views[step - 1]); /* every micro-batch reads the same weights */
            backward(&e, m, m == accum - 1);
        }
        if (early && step == N_STEPS) { /* the steps were queued in the backward: they run without step() */
            for (int waited = 0; waited < 2000 && atomic_load(&g_calls) < 3; waited += 5) sleep_ms(5);
            out->early_calls = atomic_load(&g_calls);
        }
        zt_step_result r = {.struct_size = sizeof r};
        st = e.ops->step(e.state, &a, &r);
        if (st != ZT_OK) fprintf(stderr, "%s: step %d: %s\n", label, step, take_error());
        ZT_CHECK_INT(st, ZT_OK);
        ZT_CHECK(!r.skipped);
        out->norms[step - 1] = r.grad_norm;
        ZT_CHECK_INT(e.ops->zero_grad(e.state), ZT_OK);
        if (step < N_STEPS) atomic_store(&g_calls, 0);
    }
    forward(&e, out->views[N_STEPS]);
    /* the frozen parameter (views 331..335) is what was written, bit for bit, after every forward */
    for (int f = 0; f <= N_STEPS; f++)
        for (int64_t j = 0; j < k_numel[FROZEN]; j++)
            ZT_CHECK(out->views[f][331 + j] == bf16_of(frozen_value(240 + j)));
    ZT_CHECK_INT(e.ops->read_shard(e.state, 1, ZT_SHARD_FROZEN, buf), ZT_OK);
    for (int64_t j = 0; j < k_numel[FROZEN]; j++) ZT_CHECK(buf[j] == frozen_value(240 + j));
    for (int32_t u = 0; u < 3; u++) {
        ZT_CHECK_INT(e.ops->read_shard(e.state, u, ZT_SHARD_MASTER, out->master[u]), ZT_OK);
        ZT_CHECK_INT(e.ops->read_shard(e.state, u, 1, out->state[u]), ZT_OK);
    }
    close_env(&e);
    ZT_CHECK(fake_zero_cuda_idle());
    return 1;
}

static void same(const char *label, const result *ref, const result *got)
{
    int bad = 0;
    for (int s = 0; s <= N_STEPS; s++)
        if (memcmp(ref->views[s], got->views[s], sizeof ref->views[s]) != 0) {
            int j = 0;
            while (ref->views[s][j] == got->views[s][j]) j++;
            fprintf(stderr, "%s: the bf16 views of forward %d differ from the run without offload (element %d: "
                            "%g, expected %g)\n",
                    label, s + 1, j, bf16_to_float(got->views[s][j]), bf16_to_float(ref->views[s][j]));
            bad++;
            break;
        }
    for (int u = 0; u < 3; u++) {
        if (memcmp(ref->master[u], got->master[u], sizeof ref->master[u]) != 0) {
            fprintf(stderr, "%s: unit %d's master differs from the run without offload\n", label, u);
            bad++;
        }
        if (memcmp(ref->state[u], got->state[u], sizeof ref->state[u]) != 0) {
            fprintf(stderr, "%s: unit %d's optimizer state differs from the run without offload\n", label, u);
            bad++;
        }
    }
    for (int s = 0; s < N_STEPS; s++)
        ZT_CHECK_CLOSE(got->norms[s], ref->norms[s], 1e-6, 0);
    ZT_CHECK_INT(bad, 0);
    if (!bad) printf("PASS zero%d %s: bit for bit the run without offload (norms %.6g %.6g %.6g)\n", STAGE, label,
                     got->norms[0], got->norms[1], got->norms[2]);
}

/* An offload run: the optimizer ran on the offload thread only, and the fake deferred copies. */
static void offloaded(const char *label, const char *config, const zt_optimizer_ops *opt, int early,
                      const result *ref, result *got)
{
    long deferred_before = fake_zero_cuda_deferred[0] + fake_zero_cuda_deferred[1];
    atomic_store(&g_calls, 0);
    atomic_store(&g_calls_on_main, 0);
    atomic_store(&g_calls_total, 0);
    if (!run(label, config, opt, early, got)) return;
    int total = atomic_load(&g_calls_total), on_main = atomic_load(&g_calls_on_main);
    ZT_CHECK_INT(total, 3 * N_STEPS); /* three ranges per step */
    if (strstr(config, "offload_optimizer")) {
        if (on_main != 0) fprintf(stderr, "%s: the optimizer ran on the training thread\n", label);
        ZT_CHECK_INT(on_main, 0);
        ZT_CHECK(fake_zero_cuda_deferred[0] + fake_zero_cuda_deferred[1] > deferred_before);
    }
    if (early) { /* three ranges (embed, q, w + extra): all stepped before step() was called */
        ZT_CHECK_INT(got->early_calls, 3);
    }
    same(label, ref, got);
}

int main(void)
{
    g_main = pthread_self();
    static result ref, got, ref_early, ref_plain;
    const char *base = "{\"gradient_clipping\": 1e9, \"gradient_accumulation_steps\": 2, "
                       "\"zero_optimization\": {\"step_in_backward\": \"false\"%s}}";
    const char *early = "{\"gradient_clipping\": 0, \"gradient_accumulation_steps\": 1, "
                        "\"zero_optimization\": {\"step_in_backward\": \"%s\"%s}}";
    char config[512];
    snprintf(config, sizeof config, base, "");
    if (!run("reference", config, &k_opt_copy, 0, &ref)) return zt_test_result();
    /* the run without offload ran the optimizer on the calling thread */
    ZT_CHECK(atomic_load(&g_calls_on_main) == atomic_load(&g_calls_total) && atomic_load(&g_calls_total) > 0);

    snprintf(config, sizeof config, base, ", \"offload_optimizer\": {\"device\": \"cpu\"}");
    offloaded("offload_optimizer", config, &k_opt_copy, 0, &ref, &got);
    snprintf(config, sizeof config, base, ", \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": false}");
    offloaded("offload_optimizer pageable", config, &k_opt_copy, 0, &ref, &got);
    if (STAGE == 3) {
        snprintf(config, sizeof config, base,
                 ", \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}");
        offloaded("offload_optimizer + offload_param", config, &k_opt_copy, 0, &ref, &got);
        snprintf(config, sizeof config, base, ", \"offload_param\": {\"device\": \"cpu\"}");
        offloaded("offload_param alone", config, &k_opt_copy, 0, &ref, &got);
    }

    /* early steps: the reference steps after the backward (step_in_backward false) */
    snprintf(config, sizeof config, early, "false", "");
    atomic_store(&g_calls, 0);
    if (run("reference, no clipping", config, &k_opt_copy, 1, &ref_early)) {
        ZT_CHECK_INT(ref_early.early_calls, 0); /* nothing runs before step() without offload */
        snprintf(config, sizeof config, early, "auto", ", \"offload_optimizer\": {\"device\": \"cpu\"}");
        offloaded("offload_optimizer, early steps", config, &k_opt_copy, 1, &ref_early, &got);
        if (STAGE == 3) {
            snprintf(config, sizeof config, early, "true",
                     ", \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}");
            offloaded("offload_optimizer + offload_param, early steps", config, &k_opt_copy, 1, &ref_early, &got);
        }
    }

    /* an optimizer that does not write the compute copy: the plugin converts */
    snprintf(config, sizeof config, base, "");
    if (run("reference, optimizer without compute_copy", config, &k_opt_plain, 0, &ref_plain)) {
        ZT_CHECK(memcmp(ref_plain.views, ref.views, sizeof ref.views) == 0); /* the conversion is the same */
        snprintf(config, sizeof config, base, ", \"offload_optimizer\": {\"device\": \"cpu\"}");
        offloaded("offload_optimizer, optimizer without compute_copy", config, &k_opt_plain, 0, &ref_plain, &got);
    }

    /* step_in_backward true with offload_param alone is still refused, with what to do */
    if (STAGE == 3) {
        env e;
        snprintf(config, sizeof config, early, "true", ", \"offload_param\": {\"device\": \"cpu\"}");
        ZT_CHECK(open_env(config, &e));
        ZT_CHECK_INT(e.ops->setup(e.state, &e.layout->layout, &k_opt_copy, NULL), ZT_ERR_CONFIG);
        ZT_CHECK_CONTAINS(take_error(), "no offload other than offload_optimizer on a GPU run (this run: "
                                        "offload_param alone)");
        close_env(&e);
    }
    return zt_test_result();
}
