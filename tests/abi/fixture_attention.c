/* fixture-attention: a conformant attention plugin that computes nothing (see fixture_model.c). */
#include "fixture.h"

static zt_status forward(void *state, const zt_attn_args *a, void **saved)
{
    (void)a, (void)saved;
    return fixture_refuse(state, "fixture-attention", "forward");
}

static zt_status backward(void *state, const zt_attn_args *a, void *saved)
{
    (void)a, (void)saved;
    return fixture_refuse(state, "fixture-attention", "backward");
}

/* No ZT_CAP_KV_CACHE, so the generation ops are NULL, as the ABI prescribes. */
static const zt_attention_ops ops = {
    .struct_size = sizeof(zt_attention_ops),
    .forward = forward,
    .backward = backward,
};

static const zt_plugin plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_ATTENTION,
    .name = "fixture-attention",
    .version = "0.0.1",
    .description = "attention that computes nothing (zt ABI test fixture)",
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
