/* sgd: stochastic gradient descent with momentum, computed as torch.optim.SGD does:
 *
 *     g   = grad * grad_scale + weight_decay * param
 *     buf = g                                   on step 1
 *     buf = momentum * buf + (1 - dampening) * g  afterwards
 *     g   = g + momentum * buf  (nesterov)  or  buf
 *     param -= lr * g
 *
 * The good plugin of the ABI tests: zt-run --list-plugins, --describe and --check are checked
 * against it, and test_sgd_plugin.c compares its step, loaded through the ABI, with values computed
 * by hand. Built like any plugin but never installed. */
#include <stdlib.h>

#include "zt/zt_plugin.h"

typedef struct sgd_state {
    const zt_host *host;
    float momentum;
    float dampening;
    int32_t nesterov;
} sgd_state;

static const zt_option sgd_options[] = {
    {"optimizer.params.lr", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN | ZT_OPT_MIN_OPEN, "0.01", 0, 0, NULL,
     "learning rate; the host's schedule passes each step's value to the optimizer"},
    {"optimizer.params.weight_decay", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN, "0", 0, 0, NULL,
     "L2 penalty added to the gradient (coupled, as in torch.optim.SGD)"},
    {"optimizer.params.momentum", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX, "0", 0, 1, NULL,
     "momentum factor; 0 is plain SGD and keeps no state"},
    {"optimizer.params.dampening", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX, "0", 0, 1, NULL,
     "dampening of the momentum update"},
    {"optimizer.params.nesterov", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "Nesterov momentum (needs momentum > 0 and dampening 0)"},
};

static zt_status sgd_probe(const zt_host *host)
{
    (void)host; /* runs wherever the host runs: the CPU path is all it needs */
    return ZT_OK;
}

static zt_status sgd_init(const zt_host *host, void **state)
{
    double momentum, dampening;
    int32_t nesterov;
    if (host->cfg_float(host->ctx, "optimizer.params.momentum", &momentum) != ZT_OK ||
        host->cfg_float(host->ctx, "optimizer.params.dampening", &dampening) != ZT_OK ||
        host->cfg_bool(host->ctx, "optimizer.params.nesterov", &nesterov) != ZT_OK) {
        host->error(host->ctx, ZT_ERR_INTERNAL, "sgd could not read its own options from the host");
        return ZT_ERR_INTERNAL;
    }
    if (nesterov && (momentum <= 0 || dampening != 0)) {
        host->error(host->ctx, ZT_ERR_CONFIG,
                    "optimizer.params.nesterov = true needs optimizer.params.momentum > 0 and "
                    "optimizer.params.dampening = 0 (got momentum %g, dampening %g): set them, or turn "
                    "nesterov off", momentum, dampening);
        return ZT_ERR_CONFIG;
    }
    sgd_state *s = malloc(sizeof *s);
    if (!s) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "out of memory for sgd's %zu-byte state", sizeof *s);
        return ZT_ERR_OUT_OF_MEMORY;
    }
    s->host = host;
    s->momentum = (float)momentum;
    s->dampening = (float)dampening;
    s->nesterov = nesterov;
    *state = s;
    return ZT_OK;
}

static void sgd_fini(void *state)
{
    free(state);
}

static int32_t sgd_n_state(void *state)
{
    return ((const sgd_state *)state)->momentum > 0 ? 1 : 0;
}

static const char *sgd_state_name(void *state, int32_t i)
{
    return i == 0 && sgd_n_state(state) == 1 ? "momentum_buffer" : NULL;
}

typedef struct sgd_range {
    const sgd_state *s;
    const zt_optim_hparams *h;
    float *param;
    const float *grad;
    float *buf; /* NULL without momentum */
} sgd_range;

static void sgd_update(void *arg, int64_t begin, int64_t end)
{
    const sgd_range *r = arg;
    const float lr = (float)r->h->lr, wd = (float)r->h->weight_decay, scale = (float)r->h->grad_scale;
    const float momentum = r->s->momentum, keep = 1.0f - r->s->dampening;
    for (int64_t i = begin; i < end; i++) {
        float g = r->grad[i] * scale + wd * r->param[i];
        if (r->buf) {
            float buf = r->h->step == 1 ? g : momentum * r->buf[i] + keep * g;
            r->buf[i] = buf;
            g = r->s->nesterov ? g + momentum * buf : buf;
        }
        r->param[i] -= lr * g;
    }
}

static zt_status sgd_step(void *state, const zt_optim_hparams *h, float *param, const float *grad,
                          float *const *opt_state, uint64_t n, int32_t device_type, void *stream)
{
    (void)stream;
    const sgd_state *s = state;
    const zt_host *host = s->host;
    if (!h || h->struct_size < sizeof *h || (n && (!param || !grad)) ||
        (sgd_n_state(state) && n && (!opt_state || !opt_state[0]))) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG,
                    "sgd step: NULL hparams, parameters, gradients or momentum buffer for %llu elements",
                    (unsigned long long)n);
        return ZT_ERR_INVALID_ARG;
    }
    if (device_type != ZT_DEVICE_CPU) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "sgd (a test plugin) steps on host memory only: run on the CPU or offload the optimizer "
                    "(zero_optimization.offload_optimizer.device = \"cpu\")");
        return ZT_ERR_UNSUPPORTED;
    }
    sgd_range r = {s, h, param, grad, sgd_n_state(state) ? opt_state[0] : NULL};
    host->parallel_for(host->ctx, (int64_t)n, 4096, sgd_update, &r);
    return ZT_OK;
}

static const zt_optimizer_ops sgd_ops = {
    .struct_size = sizeof(zt_optimizer_ops),
    .n_state = sgd_n_state,
    .state_name = sgd_state_name,
    .step = sgd_step,
};

static const zt_plugin sgd_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_OPTIMIZER,
    .name = "sgd",
    .version = "1.0.0",
    .description = "SGD with momentum, as torch.optim.SGD (zt ABI test plugin)",
    .options = sgd_options,
    .n_options = sizeof sgd_options / sizeof sgd_options[0],
    .caps = ZT_CAP_CPU,
    .probe = sgd_probe,
    .init = sgd_init,
    .fini = sgd_fini,
    .ops = &sgd_ops,
};

ZT_PLUGIN_ENTRY
{
    return &sgd_plugin;
}
