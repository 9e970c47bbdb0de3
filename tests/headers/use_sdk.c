/* Uses the SDK the way a plugin does: a complete (if trivial) optimizer plugin. Compiled as C99 and
 * C11 here, and as C++17 through use_sdk.cpp, so a header change that breaks any language mode a
 * plugin author may use breaks zt's own build. Valid C and C++ at once: no designated initializers.
 */
#include <zt/zt.h>

/* zt_abi_check.h only checks the frozen layout on LP64; make sure it did here. */
#if UINTPTR_MAX != 0xFFFFFFFFFFFFFFFFu
#error "not an LP64 target: zt_abi_check.h did not check the frozen layout"
#endif

static zt_status demo_probe(const zt_host *host)
{
    host->log(host->ctx, ZT_LOG_DEBUG, "probing on device type %d", (int)host->device->device_type);
    return ZT_OK;
}

static zt_status demo_init(const zt_host *host, void **state)
{
    double lr = 0.0;
    zt_status status = host->cfg_float(host->ctx, "optimizer.params.lr", &lr);
    if (status != ZT_OK) {
        host->error(host->ctx, status, "cannot read %s", "optimizer.params.lr");
        return status;
    }
    *state = NULL;
    return ZT_OK;
}

static void demo_fini(void *state)
{
    (void)state;
}

static int32_t demo_n_state(void *state)
{
    (void)state;
    return 0;
}

static const char *demo_state_name(void *state, int32_t i)
{
    (void)state;
    (void)i;
    return NULL;
}

static zt_status demo_step(void *state, const zt_optim_hparams *h, float *param, const float *grad,
                           float *const *opt_state, uint64_t n, int32_t device_type, void *stream)
{
    uint64_t i;
    (void)state;
    (void)opt_state;
    (void)device_type;
    (void)stream;
    for (i = 0; i < n; i++) param[i] -= (float)h->lr * grad[i] * (float)h->grad_scale;
    return ZT_OK;
}

static const zt_optimizer_ops demo_ops = {
    sizeof(zt_optimizer_ops), 0, demo_n_state, demo_state_name, demo_step};

static const char *const demo_choices[] = {"sum", "mean", NULL};

static const zt_option demo_options[] = {
    {"optimizer.params.lr", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN | ZT_OPT_MIN_OPEN, "1e-3", 0.0, 0.0, NULL,
     "learning rate"},
    {"optimizer.params.reduction", ZT_OPT_ENUM, 0u, "mean", 0.0, 0.0, demo_choices, "how to reduce"},
};

static const zt_plugin demo_plugin = {
    ZT_ABI_MAGIC, ZT_ABI_MAJOR, ZT_ABI_MINOR, (uint32_t)sizeof(zt_plugin),
    ZT_KIND_OPTIMIZER, "demo", "0.0.1", "header compile check",
    demo_options, (uint32_t)(sizeof demo_options / sizeof demo_options[0]), 0u,
    ZT_CAP_CPU | ZT_CAP_CONCURRENT,
    demo_probe, demo_init, demo_fini, &demo_ops};

ZT_PLUGIN_ENTRY
{
    return &demo_plugin;
}

/* The entry matches the type the host casts dlsym's result to. */
zt_plugin_entry_fn zt_headers_entry_type_check(void);
zt_plugin_entry_fn zt_headers_entry_type_check(void)
{
    return zt_plugin_entry;
}
