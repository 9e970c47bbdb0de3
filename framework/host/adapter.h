/* Putting an adapter plugin (ZT_KIND_ADAPTER, include/zt/zt_adapter.h) on the run's model. */
#ifndef ZT_FRAMEWORK_ADAPTER_H
#define ZT_FRAMEWORK_ADAPTER_H

#include "base/error.h"
#include "host/registry.h"

/* After every plugin of `set` is initialized and before the model's info() is read: when the set has
 * an adapter plugin, hand its spec to the model's adapt op. A model without one (ABI < 1.3 or adapt
 * NULL) is refused with a message naming both plugins. Without an adapter plugin: nothing. */
zt_status zt_plugin_set_attach_adapter(const zt_plugin_set *set, zt_error *err);

/* Whether the set has an adapter plugin. */
int zt_plugin_set_has_adapter(const zt_plugin_set *set);

/* The set's adapter plugin's spec (after its init), or NULL when it has none. */
const zt_adapter_spec *zt_plugin_set_adapter_spec(const zt_plugin_set *set);

#endif
