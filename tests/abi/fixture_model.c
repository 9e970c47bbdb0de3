/* fixture-model: a conformant model plugin that computes nothing. With fixture-attention and
 * fixture-zero1 it completes a run's plugin set, so `zt-run --check` can be tested on the plugin
 * under test without depending on the real model, attention and ZeRO plugins. */
#include "fixture.h"

static const zt_model_info *info(void *state)
{
    (void)state;
    return NULL; /* no parameters: --check never asks, and a trainer refuses a NULL info */
}

static zt_status forward(void *state, const zt_unit_call *c)
{
    (void)c;
    return fixture_refuse(state, "fixture-model", "forward");
}

static zt_status backward(void *state, const zt_unit_call *c)
{
    (void)c;
    return fixture_refuse(state, "fixture-model", "backward");
}

static void release(void *state, int32_t unit, void **saved)
{
    (void)state, (void)unit, (void)saved;
}

static const zt_model_ops ops = {
    .struct_size = sizeof(zt_model_ops),
    .info = info,
    .forward = forward,
    .backward = backward,
    .release = release,
};

static const zt_plugin plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_MODEL,
    .name = "fixture-model",
    .version = "0.0.1",
    .description = "model that computes nothing (zt ABI test fixture)",
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
