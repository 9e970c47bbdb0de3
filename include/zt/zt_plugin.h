/* zt plugin ABI v1: the entry point. The only header a plugin needs to include.
 *
 * A plugin is a shared object that exports exactly one symbol, ZT_ENTRY_SYMBOL:
 *
 *     ZT_EXPORT const zt_plugin *zt_plugin_entry(void);
 *
 * Lifecycle (docs/plugins.md has the full story):
 *   1. dlopen(RTLD_NOW | RTLD_LOCAL), dlsym(zt_plugin_entry), call it. It must do nothing but return
 *      a pointer to a static zt_plugin.
 *   2. The host checks magic, abi_major, abi_minor and struct_size before reading anything else, then
 *      kind, name and the ops table's struct_size.
 *   3. probe(host): can this plugin run on this machine? Cheap, no side effects, may be called many
 *      times (zt-run --list-plugins). Returns ZT_OK or ZT_ERR_UNSUPPORTED with host->error() saying
 *      why ("no CUDA device found").
 *   4. The host validates the user's config against every loaded plugin's options schema.
 *   5. init(host, &state): allocate plugin state; read options through host->cfg_*.
 *   6. The kind's ops are called with `state` (zt_tokenizer_ops, zt_model_ops, ...).
 *   7. fini(state): free everything. The host then dlclose()s.
 *
 * No C++ exception may leave any function of the table: catch everything at the boundary and turn it
 * into a status with host->error().
 *
 * Tags. The comment of every function pointer in the SDK says, in brackets (as CLAP's headers do),
 * where it is called from and what the caller promises:
 *   [main thread]      the thread that loaded the plugin (zt-run's or zt-prep's main thread):
 *                      entry, probe, init and fini, and the host's calls before a run starts
 *                      (estimate). Never concurrent with another call into the same plugin.
 *   [training thread]  the thread that runs training (setup, the steps, checkpoints) or the
 *                      generation loop. In zt-run it is the main thread; calls into one plugin from
 *                      it never overlap.
 *   [any thread]       from any thread, and concurrently with other calls unless the comment says
 *                      which calls it must not overlap.
 *   [collective]       every rank of the group (for a plugin op: every rank of the job) makes the
 *                      call, in the same order relative to the other collectives of that group; a
 *                      rank that skips one leaves the others waiting until comm.timeout_s.
 *   [may be NULL]      optional: the caller checks the pointer and does without it. A pointer
 *                      without this tag is required: the host (or the plugin that calls it) calls
 *                      it without a check.
 * Ownership: a pointer argument is borrowed for the duration of the call, unless its comment says
 * who owns what it points at afterwards; a returned pointer's comment says who owns it and until
 * when.
 */
#ifndef ZT_PLUGIN_H
#define ZT_PLUGIN_H

#include "zt_types.h"
#include "zt_host.h"
#include "zt_tokenizer.h"
#include "zt_model.h"
#include "zt_train.h"
#include "zt_adapter.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zt_plugin {
    /* Read first, before anything else, to decide whether the rest can be read at all. */
    uint32_t magic;        /* ZT_ABI_MAGIC */
    uint16_t abi_major;    /* ZT_ABI_MAJOR the plugin was built against */
    uint16_t abi_minor;    /* ZT_ABI_MINOR the plugin was built against */
    uint32_t struct_size;  /* sizeof(zt_plugin) as the plugin was built */

    int32_t kind;          /* zt_kind */
    const char *name;      /* short unique name used in --plugins, e.g. "adamw" */
    const char *version;   /* the plugin's own version, semver "1.2.0" */
    const char *description; /* one line */

    /* The options schema; may be NULL when n_options == 0. Static, owned by the plugin for as long
     * as the .so is loaded. */
    const zt_option *options;
    uint32_t n_options;
    uint32_t reserved0;
    uint64_t caps;         /* ZT_CAP_* */

    /* May this plugin run here? Called without init, possibly many times, and by zt-run
     * --list-plugins / --check in a forked child process; state-free, no side effects. `host` is
     * borrowed for the call. [main thread] Required (the loader refuses a NULL probe, init, fini or
     * ops). */
    zt_status (*probe)(const zt_host *host);
    /* Create the plugin state, once, after the config was validated against every schema. `host`
     * stays valid until fini returns. *state (owned by the plugin, handed back to every op and to
     * fini) may be set to NULL for stateless plugins. On failure, free what you made: fini is not
     * called for a failed init. [main thread] */
    zt_status (*init)(const zt_host *host, void **state);
    /* Free everything init and the ops made, with the state init produced (also NULL). Called once,
     * after the last op returned, in the reverse kind order of init; the host dlclose()s next, so
     * nothing of the plugin may outlive it. [main thread] */
    void (*fini)(void *state);

    /* The kind's ops table: zt_tokenizer_ops, zt_model_ops, zt_optimizer_ops, zt_zero_ops,
     * zt_attention_ops or zt_parallel_ops. Static, owned by the plugin. */
    const void *ops;
} zt_plugin;

typedef const zt_plugin *(*zt_plugin_entry_fn)(void);

/* The entry every plugin defines (declared here so -Wmissing-prototypes stays quiet): returns a
 * pointer to a static zt_plugin, owned by the plugin. [main thread], right after dlopen. */
ZT_EXPORT const zt_plugin *zt_plugin_entry(void);

/* Declare the entry in a plugin source file:  ZT_PLUGIN_ENTRY { return &my_plugin; } */
#ifdef __cplusplus
#define ZT_PLUGIN_ENTRY extern "C" ZT_EXPORT const zt_plugin *zt_plugin_entry(void)
#else
#define ZT_PLUGIN_ENTRY ZT_EXPORT const zt_plugin *zt_plugin_entry(void)
#endif

#ifdef __cplusplus
}
#endif

#include "zt_abi_check.h"

#endif /* ZT_PLUGIN_H */
