/* An optimizer plugin built many times, each time breaking one rule of the plugin ABI, chosen by a
 * compile definition (tests/abi/CMakeLists.txt lists the variants and broken.sh the message zt-run
 * must give for each). Without definitions other than PLUGIN_NAME it is a valid optimizer fixture.
 *
 *   MAGIC, ABI_MAJOR, ABI_MINOR, STRUCT_SIZE, OPS_STRUCT_SIZE   override that header field
 *   STRUCT_NAME          the name the struct claims (default PLUGIN_NAME)
 *   NO_DESCRIPTION       description is NULL
 *   ENUM_WITHOUT_CHOICES an option of type enum with no choices
 *   PROBE_REFUSES        probe returns ZT_ERR_UNSUPPORTED with a reason
 *   PROBE_SEGFAULTS      probe writes to an unmapped address
 *   PROBE_HANGS          probe never returns
 *   INIT_FAILS           init returns ZT_ERR_CONFIG with a message
 *   ENTRY_RETURNS_NULL   zt_plugin_entry returns NULL
 *   ENTRY_MISSING        the entry is exported under another name (zt_plugin_main)
 */
#include <unistd.h>

#include "fixture.h"

#ifndef PLUGIN_NAME
#error "PLUGIN_NAME must be defined"
#endif
#ifndef STRUCT_NAME
#define STRUCT_NAME PLUGIN_NAME
#endif
#ifndef MAGIC
#define MAGIC ZT_ABI_MAGIC
#endif
#ifndef ABI_MAJOR
#define ABI_MAJOR ZT_ABI_MAJOR
#endif
#ifndef ABI_MINOR
#define ABI_MINOR ZT_ABI_MINOR
#endif
#ifndef STRUCT_SIZE
#define STRUCT_SIZE sizeof(zt_plugin)
#endif
#ifndef OPS_STRUCT_SIZE
#define OPS_STRUCT_SIZE sizeof(zt_optimizer_ops)
#endif

static zt_status probe(const zt_host *host)
{
#if defined(PROBE_REFUSES)
    host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                "the test plugin " PLUGIN_NAME " needs a flux capacitor, and this machine has none");
    return ZT_ERR_UNSUPPORTED;
#elif defined(PROBE_HANGS)
    while (sleep(1) == 0) {
    }
    return fixture_probe(host); /* only a signal ends the sleep */
#elif defined(PROBE_SEGFAULTS)
    /* Linux never maps the first page. Not NULL itself, so the store reaches the CPU even under the
     * sanitizers (whose null check would otherwise end the process first); volatile so the
     * compiler keeps it. */
    volatile uintptr_t unmapped = 16;
    *(volatile int *)unmapped = 42;
    return fixture_probe(host);
#else
    return fixture_probe(host);
#endif
}

static zt_status init(const zt_host *host, void **state)
{
#if defined(INIT_FAILS)
    host->error(host->ctx, ZT_ERR_CONFIG,
                "the test plugin " PLUGIN_NAME " always refuses to start: remove it from --plugins");
    *state = NULL;
    return ZT_ERR_CONFIG;
#else
    return fixture_init(host, state);
#endif
}

static int32_t n_state(void *state)
{
    (void)state;
    return 0;
}

static const char *state_name(void *state, int32_t i)
{
    (void)state;
    (void)i;
    return NULL;
}

static zt_status step(void *state, const zt_optim_hparams *h, float *param, const float *grad,
                      float *const *opt_state, uint64_t n, int32_t device_type, void *stream)
{
    (void)h, (void)param, (void)grad, (void)opt_state, (void)n, (void)device_type, (void)stream;
    return fixture_refuse(state, PLUGIN_NAME, "step");
}

static const zt_optimizer_ops ops = {
    .struct_size = OPS_STRUCT_SIZE,
    .n_state = n_state,
    .state_name = state_name,
    .step = step,
};

#if defined(ENUM_WITHOUT_CHOICES)
static const zt_option flavour_option[] = {
    {"optimizer.params.flavour", ZT_OPT_ENUM, 0, "vanilla", 0, 0, NULL, "an enum that forgot its choices"},
};
#define OPTIONS flavour_option
#define N_OPTIONS 1u
#else
#define OPTIONS NULL
#define N_OPTIONS 0u
#endif

static const zt_plugin plugin = {
    .magic = MAGIC,
    .abi_major = ABI_MAJOR,
    .abi_minor = ABI_MINOR,
    .struct_size = STRUCT_SIZE,
    .kind = ZT_KIND_OPTIMIZER,
    .name = STRUCT_NAME,
    .version = "0.0.1",
#if defined(NO_DESCRIPTION)
    .description = NULL,
#else
    .description = "ABI test plugin " PLUGIN_NAME " (tests/abi/broken.c)",
#endif
    .options = OPTIONS,
    .n_options = N_OPTIONS,
    .caps = ZT_CAP_CPU,
    .probe = probe,
    .init = init,
    .fini = fixture_fini,
    .ops = &ops,
};

#if defined(ENTRY_MISSING)
ZT_EXPORT const zt_plugin *zt_plugin_main(void);
ZT_EXPORT const zt_plugin *zt_plugin_main(void)
{
    return &plugin;
}
#elif defined(ENTRY_RETURNS_NULL)
ZT_PLUGIN_ENTRY
{
    const zt_plugin *forgotten = &plugin; /* the bug under test: the struct exists, the entry loses it */
    (void)forgotten;
    return NULL;
}
#else
ZT_PLUGIN_ENTRY
{
    return &plugin;
}
#endif
