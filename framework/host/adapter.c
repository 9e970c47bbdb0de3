/* Putting an adapter plugin on the run's model (adapter.h). */
#include "host/adapter.h"

int zt_plugin_set_has_adapter(const zt_plugin_set *set)
{
    return set->by_kind[ZT_KIND_ADAPTER].plugin != NULL;
}

const zt_adapter_spec *zt_plugin_set_adapter_spec(const zt_plugin_set *set)
{
    const zt_loaded_plugin *lp = &set->by_kind[ZT_KIND_ADAPTER];
    if (!lp->plugin) return NULL;
    const zt_adapter_ops *ao = lp->plugin->ops;
    return ao->spec ? ao->spec(lp->state) : NULL;
}

zt_status zt_plugin_set_attach_adapter(const zt_plugin_set *set, zt_error *err)
{
    const zt_loaded_plugin *adapter = &set->by_kind[ZT_KIND_ADAPTER], *model = &set->by_kind[ZT_KIND_MODEL];
    if (!adapter->plugin) return ZT_OK;
    if (!model->plugin || !model->initialized || !adapter->initialized)
        return zt_error_set(err, ZT_ERR_INTERNAL, "the adapter '%s' is attached before the model and it are initialized",
                            adapter->desc.name);
    const zt_model_ops *mo = model->plugin->ops;
    if (mo->struct_size < ZT_MODEL_OPS_SIZE_1_3 || !mo->adapt)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "--plugins names the adapter plugin '%s', but the model plugin '%s' (ABI %u.%u) takes no "
                            "adapter (it has no zt_model_ops.adapt): use a model plugin that does, e.g. llama, or "
                            "train without '%s'",
                            adapter->desc.name, model->desc.name, model->plugin->abi_major, model->plugin->abi_minor,
                            adapter->desc.name);
    const zt_adapter_ops *ao = adapter->plugin->ops;
    const zt_adapter_spec *spec = ao->spec ? ao->spec(adapter->state) : NULL;
    if (!spec || spec->struct_size < sizeof *spec)
        return zt_error_set(err, ZT_ERR_INTERNAL, "the adapter plugin '%s' gave no spec (a plugin bug)",
                            adapter->desc.name);
    zt_status st = mo->adapt(model->state, spec);
    if (st != ZT_OK)
        return zt_plugin_failed(model, st, err, "adapt() with the adapter '%s'", adapter->desc.name);
    return ZT_OK;
}
