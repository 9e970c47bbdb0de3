/* fixture-zero1: a conformant ZeRO plugin that claims stage 1 and moves nothing (see
 * fixture_model.c). Its stage lets the tests check that --plugins and zero_optimization.stage must
 * agree. */
#include "fixture.h"

#define NAME "fixture-zero1"

static zt_status setup(void *state, const zt_layout *layout, const zt_optimizer_ops *opt, void *opt_state)
{
    (void)layout, (void)opt, (void)opt_state;
    return fixture_refuse(state, NAME, "setup");
}

static zt_status before_unit(void *state, int32_t unit, int32_t phase, zt_tensor *params, zt_tensor *grads)
{
    (void)unit, (void)phase, (void)params, (void)grads;
    return fixture_refuse(state, NAME, "before_unit");
}

static zt_status after_unit(void *state, int32_t unit, int32_t phase)
{
    (void)unit, (void)phase;
    return fixture_refuse(state, NAME, "after_unit");
}

static zt_status grads_ready(void *state, int32_t unit, int32_t last_micro)
{
    (void)unit, (void)last_micro;
    return fixture_refuse(state, NAME, "grads_ready");
}

static zt_status step(void *state, const zt_step_args *a, zt_step_result *r)
{
    (void)a, (void)r;
    return fixture_refuse(state, NAME, "step");
}

static zt_status zero_grad(void *state)
{
    return fixture_refuse(state, NAME, "zero_grad");
}

static void shard_range(void *state, int32_t unit, int64_t *offset, int64_t *count)
{
    (void)state, (void)unit;
    *offset = 0;
    *count = 0;
}

static zt_status read_shard(void *state, int32_t unit, int32_t which, float *dst)
{
    (void)unit, (void)which, (void)dst;
    return fixture_refuse(state, NAME, "read_shard");
}

static zt_status write_shard(void *state, int32_t unit, int32_t which, const float *src)
{
    (void)unit, (void)which, (void)src;
    return fixture_refuse(state, NAME, "write_shard");
}

static zt_status estimate(void *state, const zt_estimate_in *in, zt_mem_estimate *out)
{
    (void)in, (void)out;
    return fixture_refuse(state, NAME, "estimate");
}

static const zt_zero_ops ops = {
    .struct_size = sizeof(zt_zero_ops),
    .stage = 1,
    .setup = setup,
    .before_unit = before_unit,
    .after_unit = after_unit,
    .grads_ready = grads_ready,
    .step = step,
    .zero_grad = zero_grad,
    .shard_range = shard_range,
    .read_shard = read_shard,
    .write_shard = write_shard,
    .estimate = estimate,
};

/* DeepSpeed's keys, declared so --describe and validation have an enum and a size to show; the
 * fixture reads neither. */
static const char *const offload_devices[] = {"none", "cpu", NULL};
static const zt_option options[] = {
    {"zero_optimization.offload_optimizer.device", ZT_OPT_ENUM, 0, "none", 0, 0, offload_devices,
     "where optimizer state lives (ignored by this fixture)"},
    {"zero_optimization.reduce_bucket_size", ZT_OPT_BYTES, ZT_OPT_HAS_MIN, "500M", 1, 0, NULL,
     "gradient bucket size (ignored by this fixture)"},
};

static const zt_plugin plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_ZERO,
    .name = NAME,
    .version = "0.0.1",
    .description = "ZeRO stage 1 that moves nothing (zt ABI test fixture)",
    .options = options,
    .n_options = sizeof options / sizeof options[0],
    .caps = ZT_CAP_CPU,
    .probe = fixture_probe,
    .init = fixture_init,
    .fini = fixture_fini,
    .ops = &ops,
};

ZT_PLUGIN_ENTRY
{
    return &plugin;
}
