// A C++ plugin that breaks the one C++ rule of the ABI: an exception escapes probe (THROW_IN_PROBE)
// or init (THROW_IN_INIT) into the C host, which ends in std::terminate. zt-run must survive it
// (it runs plugin code of --check in a child process) and name the plugin and the call.
#include <stdexcept>

#include "zt/zt_plugin.h"

#ifndef PLUGIN_NAME
#error "PLUGIN_NAME must be defined"
#endif

namespace {

zt_status probe(const zt_host *)
{
#ifdef THROW_IN_PROBE
    throw std::runtime_error("the test plugin " PLUGIN_NAME " throws from probe()");
#endif
    return ZT_OK;
}

zt_status init(const zt_host *, void **state)
{
#ifdef THROW_IN_INIT
    throw std::runtime_error("the test plugin " PLUGIN_NAME " throws from init()");
#endif
    *state = nullptr;
    return ZT_OK;
}

void fini(void *) {}

int32_t n_state(void *) { return 0; }

const char *state_name(void *, int32_t) { return nullptr; }

zt_status step(void *, const zt_optim_hparams *, float *, const float *, float *const *, uint64_t, int32_t,
               void *)
{
    throw std::logic_error(PLUGIN_NAME " has no step");
}

const zt_optimizer_ops ops = {sizeof(zt_optimizer_ops), 0, n_state, state_name, step};

const zt_plugin plugin = {
    ZT_ABI_MAGIC, ZT_ABI_MAJOR, ZT_ABI_MINOR, sizeof(zt_plugin), ZT_KIND_OPTIMIZER, PLUGIN_NAME, "0.0.1",
    "C++ plugin that lets an exception escape (zt ABI test plugin)", nullptr, 0, 0, ZT_CAP_CPU, probe, init,
    fini, &ops,
};

} // namespace

ZT_PLUGIN_ENTRY
{
    return &plugin;
}
