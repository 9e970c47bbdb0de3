/* Plugin discovery and loading.
 *
 * A plugin is installed by a descriptor file NAME.plugin in a plugins.d directory:
 *
 *     # comments and blank lines are ignored
 *     name = adamw
 *     kind = optimizer          # tokenizer | model | optimizer | zero | attention | parallel
 *     library = ../../../lib/zt/plugins/libzt-adamw.so   # relative to this file's directory
 *     abi = 1.0                 # the zt ABI the plugin was built for
 *
 * The search path, first match wins (docs/plugins.md):
 *   1. --plugin-path DIR (repeatable; each may be colon-separated)
 *   2. $ZT_PLUGIN_PATH (colon-separated)
 *   3. the per-user directory: $XDG_DATA_HOME/zt/plugins.d, else $HOME/.local/share/zt/plugins.d; a
 *      relative XDG_DATA_HOME is ignored (as the XDG base directory spec says), a relative or empty
 *      HOME too, each with an info line, so the per-user directory never depends on the working
 *      directory. Relative --plugin-path and $ZT_PLUGIN_PATH entries are the user's explicit choice
 *      and are taken relative to the working directory.
 *   4. the install prefix: <CMAKE_INSTALL_PREFIX>/share/zt/plugins.d, and <exe>/../share/zt/plugins.d
 *   5. the build tree: <build>/share/zt/plugins.d
 *
 * Trust: a plugin is loaded only when its descriptor, its library and every directory above them pass
 * the ownership and permission rules of host/trust.h (no one but the user and root can change them);
 * ZT_ALLOW_UNSAFE_PLUGINS=1 loads one that fails them with a warning. This holds for every way in:
 * a name from the search path, a .plugin path and a .so path.
 *
 * Loading: dlopen(RTLD_NOW | RTLD_LOCAL), dlsym(ZT_ENTRY_SYMBOL), then magic, ABI major, minor and
 * struct_size are checked before any other field is read or any function called.
 */
#ifndef ZT_FRAMEWORK_REGISTRY_H
#define ZT_FRAMEWORK_REGISTRY_H

#include "zt/zt_plugin.h"
#include "base/error.h"
#include "host/runtime.h"

typedef struct zt_plugin_desc {
    char name[64];
    int kind;               /* zt_kind */
    char library[4096];     /* resolved absolute path of the .so */
    char descriptor[4096];  /* path of the .plugin file */
    int abi_major, abi_minor;
    int shadowed;           /* 1: an earlier directory on the path has a plugin of this name */
    int unsafe;             /* 1: its files failed the trust rules when scanned (zt_registry_trust_problem) */
} zt_plugin_desc;

typedef struct zt_registry zt_registry;

/* Scan the search path. explicit_dirs are the --plugin-path values (may be NULL). A malformed
 * descriptor is not fatal for the scan: it is kept as a problem listed by zt_registry_problems and
 * reported if the user asks for that plugin. */
zt_status zt_registry_scan(const char *const *explicit_dirs, int n_explicit, zt_registry **out,
                           zt_error *err);
void zt_registry_free(zt_registry *reg);

int zt_registry_count(const zt_registry *reg);
const zt_plugin_desc *zt_registry_at(const zt_registry *reg, int i);
/* The directories searched, in order, for error messages and --list-plugins. */
int zt_registry_dir_count(const zt_registry *reg);
const char *zt_registry_dir(const zt_registry *reg, int i);
/* Why entry i (as zt_registry_at) is unsafe: one "path breaks rule; fix: command" line per problem,
 * or NULL when its files passed the trust rules. */
const char *zt_registry_trust_problem(const zt_registry *reg, int i);
/* Descriptors that could not be parsed: "path: problem" lines. */
int zt_registry_problem_count(const zt_registry *reg);
const char *zt_registry_problem(const zt_registry *reg, int i);

/* A loaded plugin. */
typedef struct zt_loaded_plugin {
    zt_plugin_desc desc;
    void *dl;                  /* dlopen handle */
    const zt_plugin *plugin;   /* validated entry struct */
    const zt_host *host;       /* its services table, set by zt_plugin_init */
    void *state;               /* from init */
    int initialized;
} zt_loaded_plugin;

/* Find `name_or_path` (a plugin name, a .plugin descriptor path or a .so path), check that its files
 * can be trusted, dlopen it and check its ABI. Errors name the plugin, what is wrong and, for an
 * unknown name, every directory tried. */
zt_status zt_plugin_load(const zt_registry *reg, const char *name_or_path, zt_loaded_plugin *out,
                         zt_error *err);
/* probe with a services table from rt; ZT_ERR_UNSUPPORTED carries the plugin's reason. */
zt_status zt_plugin_probe(zt_loaded_plugin *lp, zt_runtime *rt, zt_error *err);
zt_status zt_plugin_init(zt_loaded_plugin *lp, zt_runtime *rt, zt_error *err);
/* fini (if initialized) and dlclose. Safe on a zeroed struct. */
void zt_plugin_unload(zt_loaded_plugin *lp);

/* A call into plugin lp failed with st: set err to what the host was doing (fmt), followed by the
 * plugin's own message (or the status name when it gave none). Returns st. */
zt_status zt_plugin_failed(const zt_loaded_plugin *lp, zt_status st, zt_error *err, const char *fmt, ...)
    ZT_PRINTF(4, 5);

const char *zt_kind_name(int kind);         /* "tokenizer", ... */
const char *zt_kind_article(int kind);      /* "a" or "an", for "an optimizer plugin" */
/* Plugin names: what --plugins accepts and what a descriptor file is named after (lower case
 * letters, digits, '-', '_', '.'; at most 63 bytes). */
int zt_plugin_name_valid(const char *s);
int zt_kind_from_name(const char *name);    /* 0 if unknown */

/* The plugins of one run: one per kind at most. */
typedef struct zt_plugin_set {
    zt_loaded_plugin by_kind[ZT_KIND_COUNT + 1]; /* index = zt_kind; unused entries zeroed */
} zt_plugin_set;

/* fini and unload every plugin of the set, in the reverse of the order a run initializes them. */
void zt_plugin_set_unload(zt_plugin_set *set);

#endif
