/* The sgd test plugin loaded through the whole host path (descriptor, dlopen, ABI checks, config
 * schema, runtime services, probe, init), its step compared with values worked out by hand from
 * torch.optim.SGD's update rule:
 *     g = grad * grad_scale + weight_decay * p;  buf = g (step 1) or momentum * buf + (1 - dampening) * g
 *     g = nesterov ? g + momentum * buf : buf;   p -= lr * g
 * Usage: test_sgd_plugin <build>/tests/abi/root/.../sgd.plugin */
#include <stdio.h>
#include <string.h>

#include "config/config.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "ztest.h"

typedef struct sgd_run {
    zt_config *cfg;
    zt_runtime *rt;
    zt_loaded_plugin lp;
    const zt_optimizer_ops *ops;
    zt_status init_status;
    zt_error err;
} sgd_run;

/* Load the plugin, configure it with `sets` (NULL-terminated "key=value"), probe and init it. */
static int start(sgd_run *r, const char *descriptor, const char *const *sets)
{
    memset(r, 0, sizeof *r);
    zt_error *err = &r->err;
    if (zt_plugin_load(NULL, descriptor, &r->lp, err) != ZT_OK) {
        fprintf(stderr, "cannot load %s: %s\n", descriptor, err->msg);
        return -1;
    }
    const zt_plugin *p = r->lp.plugin;
    uint32_t n_host;
    const zt_option *host_opts = zt_host_options(&n_host);
    r->cfg = zt_config_new();
    zt_runtime_options opt = {.n_threads = 2, .device_type = ZT_DEVICE_CPU};
    if (!r->cfg || zt_config_add_schema(r->cfg, "host", host_opts, n_host, err) != ZT_OK ||
        zt_config_add_schema(r->cfg, p->name, p->options, p->n_options, err) != ZT_OK) {
        fprintf(stderr, "config schema: %s\n", err->msg);
        return -1;
    }
    for (int i = 0; sets && sets[i]; i++) {
        if (zt_config_set(r->cfg, sets[i], err) != ZT_OK) {
            fprintf(stderr, "--set %s: %s\n", sets[i], err->msg);
            return -1;
        }
    }
    if (zt_config_validate(r->cfg, err) != ZT_OK || zt_runtime_create(&opt, r->cfg, &r->rt, err) != ZT_OK ||
        zt_plugin_probe(&r->lp, r->rt, err) != ZT_OK) {
        fprintf(stderr, "setup: %s\n", err->msg);
        return -1;
    }
    r->init_status = zt_plugin_init(&r->lp, r->rt, err);
    r->ops = p->ops;
    return 0;
}

static void stop(sgd_run *r)
{
    zt_plugin_unload(&r->lp);
    zt_runtime_destroy(r->rt);
    zt_config_free(r->cfg);
}

static zt_optim_hparams hparams(int64_t step, double lr, double weight_decay, double grad_scale)
{
    zt_optim_hparams h = {sizeof h, 0, step, lr, weight_decay, grad_scale, NULL, 0, 0};
    return h;
}

static void test_momentum_with_dampening_and_decay(const char *descriptor)
{
    static const char *const sets[] = {"optimizer.params.momentum=0.5", "optimizer.params.dampening=0.1", NULL};
    sgd_run r;
    if (start(&r, descriptor, sets) != 0 || r.init_status != ZT_OK) {
        ZT_CHECK(!"sgd with momentum started");
        fprintf(stderr, "%s\n", r.err.msg);
        stop(&r);
        return;
    }
    ZT_CHECK_INT(r.ops->n_state(r.lp.state), 1);
    ZT_CHECK(!strcmp(r.ops->state_name(r.lp.state, 0), "momentum_buffer"));
    ZT_CHECK(r.ops->state_name(r.lp.state, 1) == NULL);

    float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.2f, 0.4f, -1.0f}, buf[3] = {0, 0, 0};
    float *state[1] = {buf};
    /* step 1, lr 0.1, weight decay 0.01, grad scale 0.5:
     *   g = 0.2*0.5 + 0.01*1 = 0.11      buf = 0.11     p = 1 - 0.011 = 0.989
     *   g = 0.4*0.5 - 0.02 = 0.18        buf = 0.18     p = -2 - 0.018 = -2.018
     *   g = -0.5 + 0.005 = -0.495        buf = -0.495   p = 0.5 + 0.0495 = 0.5495 */
    zt_optim_hparams h = hparams(1, 0.1, 0.01, 0.5);
    ZT_CHECK_INT(r.ops->step(r.lp.state, &h, p, g, state, 3, ZT_DEVICE_CPU, NULL), ZT_OK);
    const float step1_p[3] = {0.989f, -2.018f, 0.5495f}, step1_buf[3] = {0.11f, 0.18f, -0.495f};
    for (int i = 0; i < 3; i++) {
        ZT_CHECK_CLOSE(p[i], step1_p[i], 1e-6, 1e-7);
        ZT_CHECK_CLOSE(buf[i], step1_buf[i], 1e-6, 1e-7);
    }
    /* step 2, same gradients: buf = 0.5*buf + 0.9*g
     *   g = 0.1 + 0.00989 = 0.10989        buf = 0.055 + 0.098901 = 0.153901     p = 0.9736099
     *   g = 0.2 - 0.02018 = 0.17982        buf = 0.09 + 0.161838 = 0.251838      p = -2.0431838
     *   g = -0.5 + 0.005495 = -0.494505    buf = -0.2475 - 0.4450545 = -0.6925545 p = 0.61875545 */
    h = hparams(2, 0.1, 0.01, 0.5);
    ZT_CHECK_INT(r.ops->step(r.lp.state, &h, p, g, state, 3, ZT_DEVICE_CPU, NULL), ZT_OK);
    const float step2_p[3] = {0.9736099f, -2.0431838f, 0.61875545f};
    const float step2_buf[3] = {0.153901f, 0.251838f, -0.6925545f};
    for (int i = 0; i < 3; i++) {
        ZT_CHECK_CLOSE(p[i], step2_p[i], 1e-6, 1e-7);
        ZT_CHECK_CLOSE(buf[i], step2_buf[i], 1e-6, 1e-7);
    }

    /* Refusals carry the plugin's own message through the host. */
    zt_status reported;
    ZT_CHECK_INT(r.ops->step(r.lp.state, &h, p, g, state, 3, ZT_DEVICE_CUDA, NULL), ZT_ERR_UNSUPPORTED);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(r.lp.host, &reported), "steps on host memory only");
    ZT_CHECK_INT(r.ops->step(r.lp.state, &h, p, NULL, state, 3, ZT_DEVICE_CPU, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(r.lp.host, &reported), "NULL hparams, parameters, gradients");
    stop(&r);
}

static void test_nesterov(const char *descriptor)
{
    static const char *const sets[] = {"optimizer.params.momentum=0.9", "optimizer.params.nesterov=true", NULL};
    sgd_run r;
    if (start(&r, descriptor, sets) != 0 || r.init_status != ZT_OK) {
        ZT_CHECK(!"sgd with nesterov started");
        fprintf(stderr, "%s\n", r.err.msg);
        stop(&r);
        return;
    }
    float p = 1.0f, g = 0.5f, buf = 0.0f;
    float *state[1] = {&buf};
    /* step 1: buf = 0.5, g = 0.5 + 0.9*0.5 = 0.95, p = 1 - 0.095 = 0.905
     * step 2: buf = 0.9*0.5 + 0.5 = 0.95, g = 0.5 + 0.9*0.95 = 1.355, p = 0.905 - 0.1355 = 0.7695 */
    zt_optim_hparams h = hparams(1, 0.1, 0, 1);
    ZT_CHECK_INT(r.ops->step(r.lp.state, &h, &p, &g, state, 1, ZT_DEVICE_CPU, NULL), ZT_OK);
    ZT_CHECK_CLOSE(p, 0.905, 1e-6, 1e-7);
    h = hparams(2, 0.1, 0, 1);
    ZT_CHECK_INT(r.ops->step(r.lp.state, &h, &p, &g, state, 1, ZT_DEVICE_CPU, NULL), ZT_OK);
    ZT_CHECK_CLOSE(buf, 0.95, 1e-6, 1e-7);
    ZT_CHECK_CLOSE(p, 0.7695, 1e-6, 1e-7);
    stop(&r);
}

/* Plain SGD keeps no state; a range large enough to be split across the host's threads. */
static void test_plain_sgd_over_threads(const char *descriptor)
{
    sgd_run r;
    if (start(&r, descriptor, NULL) != 0 || r.init_status != ZT_OK) {
        ZT_CHECK(!"plain sgd started");
        fprintf(stderr, "%s\n", r.err.msg);
        stop(&r);
        return;
    }
    ZT_CHECK_INT(r.ops->n_state(r.lp.state), 0);
    ZT_CHECK(r.ops->state_name(r.lp.state, 0) == NULL);
    enum { N = 50000 };
    static float p[N], g[N];
    for (int i = 0; i < N; i++) {
        p[i] = (float)i;
        g[i] = 2.0f;
    }
    /* p -= 0.25 * (2 * 0.5 + 0 * p) = p - 0.25, exactly representable for every i < 2^22 */
    zt_optim_hparams h = hparams(1, 0.25, 0, 0.5);
    ZT_CHECK_INT(r.ops->step(r.lp.state, &h, p, g, NULL, N, ZT_DEVICE_CPU, NULL), ZT_OK);
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += p[i] != (float)i - 0.25f;
    ZT_CHECK_INT(wrong, 0);
    stop(&r);
}

static void test_init_rejects_nesterov_with_dampening(const char *descriptor)
{
    static const char *const sets[] = {"optimizer.params.momentum=0.9", "optimizer.params.dampening=0.5",
                                       "optimizer.params.nesterov=true", NULL};
    sgd_run r;
    if (start(&r, descriptor, sets) != 0) {
        ZT_CHECK(!"sgd loaded and probed");
        stop(&r);
        return;
    }
    ZT_CHECK_INT(r.init_status, ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(r.err.msg, "plugin 'sgd' failed in init() (config error): optimizer.params.nesterov = true "
                                 "needs optimizer.params.momentum > 0 and optimizer.params.dampening = 0 "
                                 "(got momentum 0.9, dampening 0.5)");
    ZT_CHECK(!r.lp.initialized);
    stop(&r);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/sgd.plugin\n", argv[0]);
        return 2;
    }
    test_momentum_with_dampening_and_decay(argv[1]);
    test_nesterov(argv[1]);
    test_plain_sgd_over_threads(argv[1]);
    test_init_rejects_nesterov_with_dampening(argv[1]);
    return zt_test_result();
}
