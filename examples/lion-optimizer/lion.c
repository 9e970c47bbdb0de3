/* Lion, a zt optimizer plugin: the example of a third-party plugin built against the installed SDK.
 *
 * Lion ("Symbolic Discovery of Optimization Algorithms", Chen et al. 2023), per element, with the
 * gradient g already multiplied by the host's grad_scale:
 *     c = beta1*m + (1 - beta1)*g
 *     p = p - lr*(sign(c) + weight_decay*p)
 *     m = beta2*m + (1 - beta2)*g
 * The single fp32 state array is the momentum m, checkpointed as "exp_avg" (DeepSpeed's name).
 * The update has the same magnitude for every element, so Lion wants a learning rate 3-10x smaller
 * and a weight decay 3-10x larger than AdamW's.
 */
#include <math.h>

#include <zt/zt.h>

#ifndef LION_VERSION
#error "LION_VERSION comes from CMakeLists.txt (project version)"
#endif

/* Elements per parallel_for chunk: large enough that scheduling costs little next to the update. */
#define LION_GRAIN 16384

typedef struct lion_state {
    const zt_host *host; /* valid until fini; used for errors, the thread pool and freeing this */
    float beta1;
    float beta2;
} lion_state;

static const zt_option lion_options[] = {
    /* lr and weight_decay are read by the host, which schedules them and passes each step's values
     * in zt_optim_hparams; declaring them here lets the user's ds_config.json set them. */
    {.key = "optimizer.params.lr",
     .type = ZT_OPT_FLOAT,
     .flags = ZT_OPT_HAS_MIN | ZT_OPT_MIN_OPEN,
     .default_value = "1e-4",
     .min = 0.0,
     .help = "peak learning rate; Lion wants 3-10x less than AdamW"},
    {.key = "optimizer.params.betas",
     .type = ZT_OPT_FLOATS,
     .flags = ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX,
     .default_value = "[0.9, 0.99]",
     .min = 0.0,
     .max = 1.0,
     .help = "[beta1, beta2]: beta1 mixes momentum and gradient for the update sign, beta2 decays the "
             "momentum"},
    {.key = "optimizer.params.weight_decay",
     .type = ZT_OPT_FLOAT,
     .flags = ZT_OPT_HAS_MIN,
     .default_value = "0.0",
     .min = 0.0,
     .help = "decoupled weight decay; Lion wants 3-10x more than AdamW"},
};

/* Lion runs wherever there is a CPU; the CUDA path is refused per call in step(). */
static zt_status lion_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static zt_status lion_init(const zt_host *host, void **state_out)
{
    /* The host validated each beta against [0, 1] before init; the count is ours to check. */
    double betas[2];
    int32_t n_betas = 0;
    zt_status status = host->cfg_floats(host->ctx, "optimizer.params.betas", betas, 2, &n_betas);
    if (status != ZT_OK) {
        host->error(host->ctx, status, "lion: cannot read optimizer.params.betas (status %d)", (int)status);
        return status;
    }
    if (n_betas != 2) {
        host->error(host->ctx, ZT_ERR_CONFIG,
                    "optimizer.params.betas must hold exactly 2 numbers [beta1, beta2], got %d; "
                    "write e.g. \"betas\": [0.9, 0.99] under \"optimizer\": {\"params\": ...}",
                    (int)n_betas);
        return ZT_ERR_CONFIG;
    }
    lion_state *state = host->alloc(host->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, sizeof *state, 0, "lion state");
    if (!state) return ZT_ERR_OUT_OF_MEMORY; /* alloc recorded the message */
    state->host = host;
    state->beta1 = (float)betas[0];
    state->beta2 = (float)betas[1];
    *state_out = state;
    return ZT_OK;
}

static void lion_fini(void *opaque)
{
    lion_state *state = opaque;
    if (state) state->host->free(state->host->ctx, state);
}

static int32_t lion_n_state(void *opaque)
{
    (void)opaque;
    return 1;
}

static const char *lion_state_name(void *opaque, int32_t i)
{
    (void)opaque;
    return i == 0 ? "exp_avg" : NULL;
}

/* One step's constants and arrays, shared read-only by the parallel_for chunks. */
typedef struct lion_step_args {
    float *param;
    const float *grad;
    float *exp_avg;
    float lr, weight_decay, grad_scale, beta1, beta2;
} lion_step_args;

static void lion_update_range(void *opaque, int64_t begin, int64_t end)
{
    const lion_step_args *a = opaque;
    for (int64_t i = begin; i < end; i++) {
        float g = a->grad[i] * a->grad_scale;
        float m = a->exp_avg[i];
        float c = a->beta1 * m + (1.0f - a->beta1) * g;
        /* sign(c), with sign(0) = 0 and NaN passed through so a bad gradient stays visible. */
        float direction = c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : c;
        a->param[i] -= a->lr * (direction + a->weight_decay * a->param[i]);
        a->exp_avg[i] = a->beta2 * m + (1.0f - a->beta2) * g;
    }
}

static zt_status lion_step(void *opaque, const zt_optim_hparams *h, float *param, const float *grad,
                           float *const *opt_state, uint64_t n, int32_t device_type, void *stream)
{
    (void)stream;
    lion_state *state = opaque;
    const zt_host *host = state->host;
    if (device_type == ZT_DEVICE_CUDA) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "lion has no CUDA kernel: it updates optimizer state in host memory only; offload "
                    "the optimizer (zero_optimization.offload_optimizer.device = \"cpu\") or run on the "
                    "CPU, or pick an optimizer with CUDA support (zt-run --list-plugins)");
        return ZT_ERR_UNSUPPORTED;
    }
    if (device_type != ZT_DEVICE_CPU) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG, "lion step: unknown device_type %d", (int)device_type);
        return ZT_ERR_INVALID_ARG;
    }
    /* the v1.0 size, not sizeof: a zero plugin built against ABI 1.0 passes 40 bytes (docs/plugins.md) */
    if (!h || h->struct_size < ZT_OPTIM_HPARAMS_SIZE_1_0) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG,
                    "lion step: hparams is NULL or its struct_size %u is below the v1 size %u",
                    h ? (unsigned)h->struct_size : 0u, (unsigned)ZT_OPTIM_HPARAMS_SIZE_1_0);
        return ZT_ERR_INVALID_ARG;
    }
    if (n == 0) return ZT_OK;
    if (!param || !grad || !opt_state || !opt_state[0] || n > (uint64_t)INT64_MAX) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG,
                    "lion step: param, grad and exp_avg must be non-NULL for %llu elements",
                    (unsigned long long)n);
        return ZT_ERR_INVALID_ARG;
    }
    if (!isfinite(h->lr) || h->lr < 0.0 || !isfinite(h->weight_decay) || h->weight_decay < 0.0) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG,
                    "lion step %lld: lr %g and weight_decay %g must be finite and >= 0",
                    (long long)h->step, h->lr, h->weight_decay);
        return ZT_ERR_INVALID_ARG;
    }
    lion_step_args args = {
        .param = param,
        .grad = grad,
        .exp_avg = opt_state[0],
        .lr = (float)h->lr,
        .weight_decay = (float)h->weight_decay,
        .grad_scale = (float)h->grad_scale,
        .beta1 = state->beta1,
        .beta2 = state->beta2,
    };
    host->parallel_for(host->ctx, (int64_t)n, LION_GRAIN, lion_update_range, &args);
    return ZT_OK;
}

static const zt_optimizer_ops lion_ops = {
    .struct_size = sizeof(zt_optimizer_ops),
    .n_state = lion_n_state,
    .state_name = lion_state_name,
    .step = lion_step,
};

static const zt_plugin lion_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_OPTIMIZER,
    .name = "lion",
    .version = LION_VERSION,
    .description = "Lion optimizer (Chen et al. 2023): signed momentum update, one state array",
    .options = lion_options,
    .n_options = sizeof lion_options / sizeof lion_options[0],
    /* Element-wise on whatever range it is given: correct on ZeRO shards and offloaded state. */
    .caps = ZT_CAP_CPU | ZT_CAP_MULTI_RANK | ZT_CAP_OFFLOAD,
    .probe = lion_probe,
    .init = lion_init,
    .fini = lion_fini,
    .ops = &lion_ops,
};

ZT_PLUGIN_ENTRY
{
    return &lion_plugin;
}
