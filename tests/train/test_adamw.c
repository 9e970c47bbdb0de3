/* The adamw plugin, loaded as zt-run loads it, against torch.optim.AdamW (the ops/adamw fixture:
 * three steps of torch's own optimizer) and against a double-precision reference written here from
 * the algorithm in the PyTorch documentation, including the grad_scale (clipping) path.
 * usage: test_adamw LIBZT_ADAMW_SO FIXTURE_DIR */
#include <math.h>

#include "config/config.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "state/safetensors.h"
#include "ztest.h"

typedef struct optimizer {
    zt_config *cfg;
    zt_runtime *rt;
    zt_loaded_plugin lp;
    const zt_optimizer_ops *ops;
} optimizer;

/* Load and initialize the plugin with `json` as the run's config. Returns the init status. */
static zt_status open_optimizer(const char *so, const char *json, optimizer *o, zt_error *err)
{
    memset(o, 0, sizeof *o);
    zt_status st = zt_plugin_load(NULL, so, &o->lp, err);
    if (st != ZT_OK) return st;
    o->cfg = zt_config_new();
    uint32_t n_host;
    const zt_option *host = zt_host_options(&n_host);
    st = zt_config_add_schema(o->cfg, "host", host, n_host, err);
    if (st == ZT_OK) st = zt_config_add_schema(o->cfg, "adamw", o->lp.plugin->options, o->lp.plugin->n_options, err);
    if (st == ZT_OK) st = zt_config_load_string(o->cfg, json, "test", err);
    if (st == ZT_OK) st = zt_config_validate(o->cfg, err);
    zt_runtime_options ro = {.n_threads = 2};
    if (st == ZT_OK) st = zt_runtime_create(&ro, o->cfg, &o->rt, err);
    if (st == ZT_OK) st = zt_plugin_init(&o->lp, o->rt, err);
    o->ops = o->lp.plugin->ops;
    return st;
}

static void close_optimizer(optimizer *o)
{
    zt_plugin_unload(&o->lp);
    zt_runtime_destroy(o->rt);
    zt_config_free(o->cfg);
}

static zt_status step(optimizer *o, int64_t t, double lr, double wd, double scale, float *p, const float *g,
                      float *m, float *v, uint64_t n, int32_t device)
{
    zt_optim_hparams h = {.struct_size = sizeof h, .step = t, .lr = lr, .weight_decay = wd, .grad_scale = scale};
    float *state[2] = {m, v};
    return o->ops->step(o->lp.state, &h, p, g, state, n, device, NULL);
}

static float *read_tensor(const zt_st_file *f, const char *name, uint64_t *numel)
{
    const zt_st_tensor *t = zt_st_find(f, name);
    if (!t) {
        fprintf(stderr, "fixture tensor %s missing\n", name);
        exit(1);
    }
    float *out = malloc(t->numel * sizeof *out);
    zt_error err;
    if (zt_st_read_f32(f, t, 0, t->numel, out, &err) != ZT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    *numel = t->numel;
    return out;
}

/* torch.optim.AdamW(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1), 3 steps. */
static void test_against_torch(const char *so, const char *fixture_dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/ops/adamw.safetensors", fixture_dir);
    zt_st_file *f;
    zt_error err;
    if (zt_st_open(path, &f, &err) != ZT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        zt_test_failures++;
        return;
    }
    uint64_t n, n_grads, n_out;
    float *p = read_tensor(f, "p0", &n), *grads = read_tensor(f, "grads", &n_grads);
    float *p_torch = read_tensor(f, "p", &n_out), *m_torch = read_tensor(f, "m", &n_out),
          *v_torch = read_tensor(f, "v", &n_out);
    ZT_CHECK_INT(n_grads, 3 * n);
    float *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);

    optimizer o;
    ZT_CHECK_INT(open_optimizer(so, "{\"optimizer\": {\"params\": {\"betas\": [0.9, 0.95], \"eps\": 1e-8}}}", &o,
                                &err), ZT_OK);
    for (int t = 1; t <= 3; t++)
        ZT_CHECK_INT(step(&o, t, 1e-2, 0.1, 1.0, p, grads + (t - 1) * n, m, v, n, ZT_DEVICE_CPU), ZT_OK);
    int bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        /* A few ulps of the inputs' scale (gradients ~1): m, a running mean of +-1 values, can be
         * small after cancellation, so it gets an absolute tolerance of that scale. */
        int ok = fabsf(p[i] - p_torch[i]) <= 1e-6f * fabsf(p_torch[i]) + 1e-7f &&
                 fabsf(m[i] - m_torch[i]) <= 1e-6f * fabsf(m_torch[i]) + 1e-7f &&
                 fabsf(v[i] - v_torch[i]) <= 1e-6f * fabsf(v_torch[i]) + 1e-9f;
        if (!ok && bad++ < 5)
            fprintf(stderr, "element %llu: p %.9g vs torch %.9g, m %.9g vs %.9g, v %.9g vs %.9g\n",
                    (unsigned long long)i, p[i], p_torch[i], m[i], m_torch[i], v[i], v_torch[i]);
    }
    ZT_CHECK_INT(bad, 0);
    close_optimizer(&o);
    zt_st_close(f);
    free(p), free(grads), free(p_torch), free(m_torch), free(v_torch), free(m), free(v);
}

/* The PyTorch documentation's AdamW, in double, with the gradient scaled first. */
static void reference_step(int64_t t, double lr, double b1, double b2, double eps, double wd, double scale,
                           double *p, const float *g, double *m, double *v, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        double gi = (double)((float)(g[i] * (float)scale)); /* torch scales the fp32 gradient in fp32 */
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double m_hat = m[i] / (1 - pow(b1, (double)t)), v_hat = v[i] / (1 - pow(b2, (double)t));
        p[i] -= lr * m_hat / (sqrt(v_hat) + eps);
    }
}

static uint64_t lcg = 88172645463325252ull;
static float noise(void)
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(lcg >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void test_against_reference(const char *so)
{
    /* more than the plugin's 1 Mi-element scaling chunk, so the chunk boundary is crossed */
    const uint64_t n = (1u << 20) + 777;
    float *p = malloc(n * sizeof *p), *g = malloc(2 * n * sizeof *g), *m = calloc(n, sizeof *m),
          *v = calloc(n, sizeof *v);
    double *rp = malloc(n * sizeof *rp), *rm = calloc(n, sizeof *rm), *rv = calloc(n, sizeof *rv);
    for (uint64_t i = 0; i < n; i++) rp[i] = p[i] = noise();
    for (uint64_t i = 0; i < 2 * n; i++) g[i] = noise() * (i % 97 == 0 ? 1e-6f : 1.0f);
    optimizer o;
    zt_error err;
    ZT_CHECK_INT(open_optimizer(so, "{\"optimizer\": {\"params\": {\"betas\": [0.8, 0.99], \"eps\": 1e-6}}}", &o,
                                &err), ZT_OK);
    const double lr[2] = {3e-3, 1e-3}, scale[2] = {0.37, 1.0}, wd = 0.05;
    for (int t = 1; t <= 2; t++) {
        ZT_CHECK_INT(step(&o, t, lr[t - 1], wd, scale[t - 1], p, g + (t - 1) * n, m, v, n, ZT_DEVICE_CPU), ZT_OK);
        reference_step(t, lr[t - 1], 0.8, 0.99, 1e-6, wd, scale[t - 1], rp, g + (t - 1) * n, rm, rv, n);
    }
    int bad = 0;
    double worst = 0;
    for (uint64_t i = 0; i < n; i++) {
        double diff = fabs(p[i] - rp[i]);
        if (diff > worst) worst = diff;
        if (diff > 1e-6 * fabs(rp[i]) + 1e-7 && bad++ < 5)
            fprintf(stderr, "element %llu: %.9g, reference %.12g\n", (unsigned long long)i, p[i], rp[i]);
    }
    ZT_CHECK_INT(bad, 0);
    fprintf(stderr, "adamw vs double reference: largest difference %.3g over %llu elements\n", worst,
            (unsigned long long)n);

    /* lr 0 and no decay: nothing moves, the moments still update */
    float before = p[5];
    ZT_CHECK_INT(step(&o, 3, 0.0, 0.0, 1.0, p, g, m, v, n, ZT_DEVICE_CPU), ZT_OK);
    ZT_CHECK(p[5] == before);
    close_optimizer(&o);
    free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv);
}

/* torch.optim.Adam (L2 weight decay: weight_decay x p added to the gradient), in double, as DeepSpeed's
 * FusedAdam computes with adam_w_mode false. */
static void reference_adam_l2_step(int64_t t, double lr, double b1, double b2, double eps, double wd, double scale,
                                   double *p, const float *g, double *m, double *v, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        double gi = (double)((float)(g[i] * (float)scale)) + wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double m_hat = m[i] / (1 - pow(b1, (double)t)), v_hat = v[i] / (1 - pow(b2, (double)t));
        p[i] -= lr * m_hat / (sqrt(v_hat) + eps);
    }
}

/* DeepSpeed's optimizer types: "Adam" with adam_w_mode false is Adam with L2 decay; "Adam" by default and
 * "AdamW" with adam_w_mode false are AdamW (DeepSpeed's engine forces adam_w_mode for AdamW). */
static void test_deepspeed_adam_modes(const char *so)
{
    static const struct {
        const char *json;
        int l2;
    } cases[] = {
        {"{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false, \"betas\": [0.9, 0.95]}}}", 1},
        {"{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9, 0.95]}}}", 0},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"adam_w_mode\": false, \"betas\": [0.9, 0.95]}}}", 0},
    };
    const uint64_t n = 4099;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float *p = malloc(n * sizeof *p), *g = malloc(3 * n * sizeof *g), *m = calloc(n, sizeof *m),
              *v = calloc(n, sizeof *v);
        double *rp = malloc(n * sizeof *rp), *rm = calloc(n, sizeof *rm), *rv = calloc(n, sizeof *rv);
        for (uint64_t i = 0; i < n; i++) rp[i] = p[i] = noise();
        for (uint64_t i = 0; i < 3 * n; i++) g[i] = noise() * 0.1f;
        optimizer o;
        zt_error err;
        ZT_CHECK_INT(open_optimizer(so, cases[c].json, &o, &err), ZT_OK);
        const double lr = 1e-2, wd = 0.3, scale[3] = {1.0, 0.5, 1.0};
        for (int t = 1; t <= 3; t++) {
            ZT_CHECK_INT(step(&o, t, lr, wd, scale[t - 1], p, g + (t - 1) * n, m, v, n, ZT_DEVICE_CPU), ZT_OK);
            if (cases[c].l2) reference_adam_l2_step(t, lr, 0.9, 0.95, 1e-8, wd, scale[t - 1], rp, g + (t - 1) * n, rm, rv, n);
            else reference_step(t, lr, 0.9, 0.95, 1e-8, wd, scale[t - 1], rp, g + (t - 1) * n, rm, rv, n);
        }
        int bad = 0;
        for (uint64_t i = 0; i < n; i++)
            if (fabs(p[i] - rp[i]) > 1e-6 * fabs(rp[i]) + 1e-7 && bad++ < 3)
                fprintf(stderr, "%s: element %llu: %.9g, reference %.12g\n", cases[c].json, (unsigned long long)i,
                        p[i], rp[i]);
        ZT_CHECK_INT(bad, 0);
        if (cases[c].l2) { /* the GPU path has no L2 decay: refused by name */
            zt_status st;
            ZT_CHECK_INT(step(&o, 4, lr, wd, 1.0, p, g, m, v, n, ZT_DEVICE_CUDA), ZT_ERR_UNSUPPORTED);
            ZT_CHECK_CONTAINS(zt_runtime_take_error(o.lp.host, &st), "optimizer.params.adam_w_mode is false");
        }
        close_optimizer(&o);
        free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv);
    }
}

static void test_interface_and_errors(const char *so)
{
    optimizer o;
    zt_error err;
    zt_status st;
    ZT_CHECK_INT(open_optimizer(so, "{}", &o, &err), ZT_OK);
    ZT_CHECK_INT(o.ops->n_state(o.lp.state), 2);
    ZT_CHECK(!strcmp(o.ops->state_name(o.lp.state, 0), "exp_avg"));
    ZT_CHECK(!strcmp(o.ops->state_name(o.lp.state, 1), "exp_avg_sq"));
    ZT_CHECK(o.ops->state_name(o.lp.state, 2) == NULL);
    /* DeepSpeed's names and torch's defaults */
    double lr, wd, eps;
    ZT_CHECK_INT(zt_config_get_float(o.cfg, "optimizer.params.lr", &lr), ZT_OK);
    ZT_CHECK_INT(zt_config_get_float(o.cfg, "optimizer.params.weight_decay", &wd), ZT_OK);
    ZT_CHECK_INT(zt_config_get_float(o.cfg, "optimizer.params.eps", &eps), ZT_OK);
    ZT_CHECK(lr == 3e-4 && wd == 0.01 && eps == 1e-8);

    float p[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1}, m[4] = {0}, v[4] = {0};
    ZT_CHECK_INT(step(&o, 1, 1e-3, 0, 1, p, g, m, v, 4, ZT_DEVICE_CUDA), ZT_ERR_UNSUPPORTED);
#if ZT_TEST_PLUGINS_HAVE_CUDA
    ZT_CHECK_CONTAINS(zt_runtime_take_error(o.lp.host, &st),
                      "the ranges are said to be CUDA memory (device_type CUDA), but this run computes on the CPU");
#else /* a build without CUDA (-DZT_CUDA=OFF) */
    ZT_CHECK_CONTAINS(zt_runtime_take_error(o.lp.host, &st),
                      "this adamw plugin was built without CUDA, so it cannot update device memory");
#endif
    ZT_CHECK_INT(step(&o, 0, 1e-3, 0, 1, p, g, m, v, 4, ZT_DEVICE_CPU), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(o.lp.host, &st), "step must be >= 1");
    ZT_CHECK_INT(step(&o, 1, NAN, 0, 1, p, g, m, v, 4, ZT_DEVICE_CPU), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(o.lp.host, &st), "lr (nan)");
    ZT_CHECK_INT(step(&o, 1, 1e-3, 0, 1, p, g, NULL, v, 4, ZT_DEVICE_CPU), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(o.lp.host, &st), "must be non-NULL for 4 elements");
    ZT_CHECK(p[0] == 1 && m[0] == 0); /* refused calls change nothing */
    close_optimizer(&o);

    ZT_CHECK_INT(open_optimizer(so, "{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.0]}}}", &o, &err),
                 ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "optimizer.params.betas[1] is 1: it must be below 1");
    close_optimizer(&o);
    ZT_CHECK_INT(open_optimizer(so, "{\"optimizer\": {\"params\": {\"betas\": [0.9, 0.99, 0.5]}}}", &o, &err),
                 ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "must hold exactly 2 numbers [beta1, beta2], got 3");
    close_optimizer(&o);
    ZT_CHECK_INT(open_optimizer(so, "{\"optimizer\": {\"params\": {\"eps\": -1}}}", &o, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "optimizer.params.eps");
    close_optimizer(&o);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s LIBZT_ADAMW_SO FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    test_against_torch(argv[1], argv[2]);
    test_against_reference(argv[1]);
    test_deepspeed_adam_modes(argv[1]);
    test_interface_and_errors(argv[1]);
    return zt_test_result();
}
