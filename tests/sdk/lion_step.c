/* The Lion example plugin, as built out of tree against the installed SDK (tests/sdk/build_example.sh),
 * loaded with dlopen and driven through the ABI alone, with a minimal host services table written
 * here. Its step is compared with an independent double-precision implementation of Lion
 * (Chen et al. 2023, Algorithm 2 with decoupled weight decay) and with hand-computed values; its
 * error paths must return the documented statuses with messages that say how to fix the problem.
 *
 * usage: sdk_lion_step PATH/libzt-lion.so
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>

#include <zt/zt.h>

#include "ztest.h"

/* ---- a minimal host ------------------------------------------------------------------------- */

typedef struct test_host {
    double betas[3];     /* what cfg_floats returns for optimizer.params.betas */
    int32_t n_betas;
    int live_allocs;     /* alloc minus free: must return to 0 after fini */
    int parallel_calls;
    int64_t grain_seen;
    zt_status last_error_status;
    char last_error[1024];
} test_host;

static void host_log(void *ctx, int32_t level, const char *fmt, ...)
{
    (void)ctx;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "plugin log %d: ", (int)level);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void host_error(void *ctx, int32_t status, const char *fmt, ...)
{
    test_host *th = ctx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(th->last_error, sizeof th->last_error, fmt, ap);
    va_end(ap);
    th->last_error_status = (zt_status)status;
}

static zt_status host_cfg_floats(void *ctx, const char *key, double *out, int32_t cap, int32_t *n)
{
    test_host *th = ctx;
    if (strcmp(key, "optimizer.params.betas") != 0) {
        fprintf(stderr, "lion asked for unexpected float-list key '%s'\n", key);
        return ZT_ERR_NOT_FOUND;
    }
    for (int32_t i = 0; i < th->n_betas && i < cap; i++) out[i] = th->betas[i];
    *n = th->n_betas;
    return ZT_OK;
}

static void *host_alloc(void *ctx, int32_t pool, int32_t where, uint64_t bytes, uint64_t alignment,
                        const char *tag)
{
    test_host *th = ctx;
    (void)pool;
    (void)alignment;
    ZT_CHECK(where == ZT_MEM_HOST);
    ZT_CHECK(tag != NULL);
    void *p = malloc(bytes);
    if (p) th->live_allocs++;
    return p;
}

static void host_free(void *ctx, void *ptr)
{
    test_host *th = ctx;
    if (ptr) th->live_allocs--;
    free(ptr);
}

/* Runs the chunks last to first, so an implementation that depends on chunk order shows up. */
static void host_parallel_for(void *ctx, int64_t n, int64_t grain, zt_range_fn fn, void *arg)
{
    test_host *th = ctx;
    th->parallel_calls++;
    th->grain_seen = grain;
    int64_t chunk = grain > 0 ? grain : 1;
    if (chunk > 1000) chunk = 1000; /* several chunks even for the small arrays used here */
    int64_t n_chunks = (n + chunk - 1) / chunk;
    for (int64_t c = n_chunks - 1; c >= 0; c--) {
        int64_t begin = c * chunk;
        int64_t end = begin + chunk < n ? begin + chunk : n;
        fn(arg, begin, end);
    }
}

static zt_device_ctx cpu_device = {.struct_size = sizeof(zt_device_ctx), .device_type = ZT_DEVICE_CPU, .n_threads = 1};

static zt_host make_host(test_host *th)
{
    zt_host host;
    memset(&host, 0, sizeof host);
    host.struct_size = sizeof host;
    host.abi_major = ZT_ABI_MAJOR;
    host.abi_minor = ZT_ABI_MINOR;
    host.ctx = th;
    host.log = host_log;
    host.error = host_error;
    host.cfg_floats = host_cfg_floats;
    host.alloc = host_alloc;
    host.free = host_free;
    host.device = &cpu_device;
    host.world_size = 1;
    host.parallel_for = host_parallel_for;
    return host;
}

/* ---- the independent reference: Lion in double precision ------------------------------------- */

static double sign_of(double x)
{
    return x > 0.0 ? 1.0 : x < 0.0 ? -1.0 : 0.0;
}

static void reference_lion(double *param, const double *grad, double *momentum, size_t n, double lr,
                           double weight_decay, double grad_scale, double beta1, double beta2)
{
    for (size_t i = 0; i < n; i++) {
        double g = grad[i] * grad_scale;
        double update = sign_of(beta1 * momentum[i] + (1.0 - beta1) * g);
        param[i] = param[i] - lr * (update + weight_decay * param[i]);
        momentum[i] = beta2 * momentum[i] + (1.0 - beta2) * g;
    }
}

/* A fixed-seed generator, so the data (and the result) are the same on every machine. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform_pm1(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

/* ---- the tests ------------------------------------------------------------------------------- */

static const zt_plugin *plugin;
static const zt_optimizer_ops *ops;

static zt_optim_hparams hparams(int64_t step, double lr, double weight_decay, double grad_scale)
{
    zt_optim_hparams h = {.struct_size = sizeof(zt_optim_hparams), .step = step, .lr = lr,
                          .weight_decay = weight_decay, .grad_scale = grad_scale};
    return h;
}

static void *init_with_betas(test_host *th, const zt_host *host, double beta1, double beta2)
{
    th->betas[0] = beta1;
    th->betas[1] = beta2;
    th->n_betas = 2;
    void *state = NULL;
    ZT_CHECK_INT(plugin->init(host, &state), ZT_OK);
    return state;
}

static void check_descriptor_fields(void)
{
    ZT_CHECK_INT(plugin->magic, ZT_ABI_MAGIC);
    ZT_CHECK_INT(plugin->abi_major, ZT_ABI_MAJOR);
    ZT_CHECK(plugin->abi_minor <= ZT_ABI_MINOR);
    ZT_CHECK(plugin->struct_size >= sizeof(zt_plugin));
    ZT_CHECK_INT(plugin->kind, ZT_KIND_OPTIMIZER);
    ZT_CHECK(strcmp(plugin->name, "lion") == 0);
    ZT_CHECK(ops->struct_size >= sizeof(zt_optimizer_ops));
    ZT_CHECK(plugin->caps & ZT_CAP_CPU);
    ZT_CHECK(!(plugin->caps & ZT_CAP_CUDA));
    /* The options the brief specifies, with DeepSpeed's key names and the paper's default betas. */
    int found_betas = 0;
    for (uint32_t i = 0; i < plugin->n_options; i++) {
        const zt_option *o = &plugin->options[i];
        ZT_CHECK(strncmp(o->key, "optimizer.params.", 17) == 0);
        ZT_CHECK(o->help && o->help[0]);
        if (strcmp(o->key, "optimizer.params.betas") == 0) {
            found_betas = 1;
            ZT_CHECK_INT(o->type, ZT_OPT_FLOATS);
            ZT_CHECK(strcmp(o->default_value, "[0.9, 0.99]") == 0);
        }
    }
    ZT_CHECK(found_betas);
}

static void check_state_names(void *state)
{
    ZT_CHECK_INT(ops->n_state(state), 1);
    ZT_CHECK(ops->state_name(state, 0) && strcmp(ops->state_name(state, 0), "exp_avg") == 0);
    ZT_CHECK(ops->state_name(state, 1) == NULL);
    ZT_CHECK(ops->state_name(state, -1) == NULL);
}

/* Three elements worked out by hand with beta1 = 0.9, beta2 = 0.99, lr = 0.1, wd = 0.01:
 *  [0] p=1,  g=2 (x0.5 = 1),   m=0.5: c = 0.45+0.1 = 0.55 > 0  -> p = 1 - 0.1*(1 + 0.01)   = 0.899,
 *                                                                 m = 0.495 + 0.01         = 0.505
 *  [1] p=1,  g=1 (x0.5 = 0.5), m=-1:  c = -0.9+0.05 < 0        -> p = 1 - 0.1*(-1 + 0.01)  = 1.099,
 *                                                                 m = -0.99 + 0.005        = -0.985
 *  [2] p=-2, g=0,              m=0:   c = 0, sign 0            -> p = -2 - 0.1*(0 - 0.02)  = -1.998,
 *                                                                 m = 0
 * Element 0 also shows grad_scale is honoured: unscaled, m would become 0.495 + 0.02 = 0.515. */
static void check_hand_computed(const zt_host *host, test_host *th)
{
    void *state = init_with_betas(th, host, 0.9, 0.99);
    float param[3] = {1.0f, 1.0f, -2.0f};
    const float grad[3] = {2.0f, 1.0f, 0.0f};
    float momentum[3] = {0.5f, -1.0f, 0.0f};
    float *opt_state[1] = {momentum};
    zt_optim_hparams h = hparams(1, 0.1, 0.01, 0.5);
    ZT_CHECK_INT(ops->step(state, &h, param, grad, opt_state, 3, ZT_DEVICE_CPU, NULL), ZT_OK);
    ZT_CHECK_CLOSE(param[0], 0.899, 1e-6, 1e-7);
    ZT_CHECK_CLOSE(param[1], 1.099, 1e-6, 1e-7);
    ZT_CHECK_CLOSE(param[2], -1.998, 1e-6, 1e-7);
    ZT_CHECK_CLOSE(momentum[0], 0.505, 1e-6, 1e-7);
    ZT_CHECK_CLOSE(momentum[1], -0.985, 1e-6, 1e-7);
    ZT_CHECK_CLOSE(momentum[2], 0.0, 0.0, 0.0);
    plugin->fini(state);
}

/* Several steps on random data with changing lr, weight decay and grad_scale, non-default betas (so
 * they must have been read from the config) and an odd size split over several chunks. */
static void check_against_reference(const zt_host *host, test_host *th)
{
    enum { N = 10007, STEPS = 4 };
    const double beta1 = 0.8, beta2 = 0.95;
    void *state = init_with_betas(th, host, beta1, beta2);
    static float param[N], grad[N], momentum[N];
    static double ref_param[N], ref_grad[N], ref_momentum[N];
    for (int i = 0; i < N; i++) {
        param[i] = (float)uniform_pm1();
        momentum[i] = (float)(0.1 * uniform_pm1());
        ref_param[i] = param[i];
        ref_momentum[i] = momentum[i];
    }
    float *opt_state[1] = {momentum};
    const double lrs[STEPS] = {1e-3, 3e-3, 2e-3, 5e-4};
    const double decays[STEPS] = {0.0, 0.1, 1.0, 0.1};
    const double scales[STEPS] = {1.0, 0.5, 0.125, 2.0};
    int worst = 0;
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < N; i++) {
            grad[i] = (float)uniform_pm1();
            ref_grad[i] = grad[i];
        }
        zt_optim_hparams h = hparams(step + 1, lrs[step], decays[step], scales[step]);
        th->parallel_calls = 0;
        ZT_CHECK_INT(ops->step(state, &h, param, grad, opt_state, N, ZT_DEVICE_CPU, NULL), ZT_OK);
        ZT_CHECK(th->parallel_calls >= 1);
        reference_lion(ref_param, ref_grad, ref_momentum, N, lrs[step], decays[step], scales[step], beta1, beta2);
        for (int i = 0; i < N; i++) {
            int bad = fabs(param[i] - ref_param[i]) > 1e-6 || fabs(momentum[i] - ref_momentum[i]) > 1e-6;
            if (bad && worst++ < 5) {
                fprintf(stderr, "step %d element %d: param %.9g vs reference %.9g, exp_avg %.9g vs %.9g\n",
                        step + 1, i, param[i], ref_param[i], momentum[i], ref_momentum[i]);
            }
        }
    }
    ZT_CHECK_INT(worst, 0);
    plugin->fini(state);
}

static void check_errors(const zt_host *host, test_host *th)
{
    /* Betas that are not a pair: the host checks each item's range, the plugin the count. */
    th->betas[0] = 0.9;
    th->betas[1] = 0.99;
    th->betas[2] = 0.999;
    th->n_betas = 3;
    void *state = NULL;
    th->last_error[0] = 0;
    ZT_CHECK_INT(plugin->init(host, &state), ZT_ERR_CONFIG);
    ZT_CHECK_INT(th->last_error_status, ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(th->last_error, "optimizer.params.betas must hold exactly 2 numbers [beta1, beta2], got 3");
    ZT_CHECK_CONTAINS(th->last_error, "[0.9, 0.99]");
    ZT_CHECK_INT(th->live_allocs, 0);

    state = init_with_betas(th, host, 0.9, 0.99);
    float param[2] = {1.0f, 2.0f}, grad[2] = {1.0f, 1.0f}, momentum[2] = {0.0f, 0.0f};
    float *opt_state[1] = {momentum};
    zt_optim_hparams h = hparams(1, 1e-3, 0.0, 1.0);

    th->last_error[0] = 0;
    ZT_CHECK_INT(ops->step(state, &h, param, grad, opt_state, 2, ZT_DEVICE_CUDA, NULL), ZT_ERR_UNSUPPORTED);
    ZT_CHECK_CONTAINS(th->last_error, "lion has no CUDA kernel");
    ZT_CHECK_CONTAINS(th->last_error, "zero_optimization.offload_optimizer.device");

    th->last_error[0] = 0;
    ZT_CHECK_INT(ops->step(state, &h, param, NULL, opt_state, 2, ZT_DEVICE_CPU, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(th->last_error, "param, grad and exp_avg must be non-NULL for 2 elements");

    zt_optim_hparams short_h = h;
    short_h.struct_size = 8;
    th->last_error[0] = 0;
    ZT_CHECK_INT(ops->step(state, &short_h, param, grad, opt_state, 2, ZT_DEVICE_CPU, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(th->last_error, "struct_size 8 is below the v1 size 40");

    zt_optim_hparams nan_h = hparams(7, NAN, 0.0, 1.0);
    th->last_error[0] = 0;
    ZT_CHECK_INT(ops->step(state, &nan_h, param, grad, opt_state, 2, ZT_DEVICE_CPU, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(th->last_error, "lion step 7: lr nan and weight_decay 0 must be finite and >= 0");

    /* A refused step leaves everything untouched; an empty one succeeds. */
    ZT_CHECK(param[0] == 1.0f && param[1] == 2.0f && momentum[0] == 0.0f && momentum[1] == 0.0f);
    ZT_CHECK_INT(ops->step(state, &h, NULL, NULL, NULL, 0, ZT_DEVICE_CPU, NULL), ZT_OK);
    plugin->fini(state);
    ZT_CHECK_INT(th->live_allocs, 0);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/libzt-lion.so\n", argv[0]);
        return 2;
    }
    void *dl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        fprintf(stderr, "cannot load the lion plugin built by sdk_build_example: %s\n", dlerror());
        return 1;
    }
    zt_plugin_entry_fn entry;
    *(void **)&entry = dlsym(dl, ZT_ENTRY_SYMBOL); /* POSIX: object pointer to function pointer */
    if (!entry || !(plugin = entry())) {
        fprintf(stderr, "%s: no %s or it returned NULL\n", argv[1], ZT_ENTRY_SYMBOL);
        return 1;
    }
    ops = plugin->ops;

    test_host th;
    memset(&th, 0, sizeof th);
    zt_host host = make_host(&th);

    check_descriptor_fields();
    ZT_CHECK_INT(plugin->probe(&host), ZT_OK);
    void *state = init_with_betas(&th, &host, 0.9, 0.99);
    check_state_names(state);
    plugin->fini(state);
    ZT_CHECK_INT(th.live_allocs, 0);

    check_hand_computed(&host, &th);
    check_against_reference(&host, &th);
    check_errors(&host, &th);
    ZT_CHECK_INT(th.live_allocs, 0);

    dlclose(dl);
    return zt_test_result();
}
