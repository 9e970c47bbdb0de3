/* Plugin discovery (descriptors on the search path) and loading (dlopen plus the ABI checks).
 * registry.h describes the descriptor format and the search path; docs/plugins.md the rules for
 * plugin authors. */
#define _GNU_SOURCE
#include "host/registry.h"

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/args.h"
#include "base/log.h"
#include "host/trust.h"

#ifndef ZT_INSTALL_PLUGINS_D
#error "ZT_INSTALL_PLUGINS_D must be defined (framework/CMakeLists.txt)"
#endif
#ifndef ZT_BUILD_PLUGINS_D
#error "ZT_BUILD_PLUGINS_D must be defined (framework/CMakeLists.txt)"
#endif
#ifndef ZT_PLUGINS_D_TO_LIBDIR
#error "ZT_PLUGINS_D_TO_LIBDIR must be defined (framework/CMakeLists.txt)"
#endif

/* ---- kinds ------------------------------------------------------------------------------------ */

static const char *const kind_names[ZT_KIND_COUNT + 1] = {
    NULL, "tokenizer", "model", "optimizer", "zero", "attention", "parallel", "adapter",
};

static const char *const ops_type_names[ZT_KIND_COUNT + 1] = {
    NULL, "zt_tokenizer_ops", "zt_model_ops", "zt_optimizer_ops", "zt_zero_ops", "zt_attention_ops",
    "zt_parallel_ops", "zt_adapter_ops",
};

/* Sizes of the v1.0 structs. A plugin built against any 1.x SDK has at least these bytes; later
 * minors only append. They are the frozen numbers of zt_abi_check.h, repeated here because sizeof
 * grows with every minor while the minimum a 1.x host accepts does not. */
#define PLUGIN_V1_0_SIZE 96u
static const uint32_t ops_v1_0_size[ZT_KIND_COUNT + 1] = {0, 56, 40, 32, 88, 72, 24, 16}; /* adapter: 1.3 */

_Static_assert(sizeof(zt_plugin) >= PLUGIN_V1_0_SIZE, "zt_plugin shrank below v1.0");
_Static_assert(sizeof(zt_tokenizer_ops) >= 56 && sizeof(zt_model_ops) >= 40 &&
                   sizeof(zt_optimizer_ops) >= 32 && sizeof(zt_zero_ops) >= 88 &&
                   sizeof(zt_attention_ops) >= 72 && sizeof(zt_parallel_ops) >= 24,
               "an ops table shrank below its v1.0 size");

zt_status zt_plugin_failed(const zt_loaded_plugin *lp, zt_status st, zt_error *err, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    zt_status reported;
    const char *msg = zt_runtime_take_error(lp->host, &reported);
    return zt_error_set(err, st, "%s plugin '%s', %s: %s%s", zt_kind_name(lp->plugin->kind), lp->desc.name, what,
                        msg[0] ? msg : zt_status_name(st), msg[0] ? "" : " (the plugin gave no message)");
}

const char *zt_kind_name(int kind)
{
    return kind >= 1 && kind <= ZT_KIND_COUNT ? kind_names[kind] : "unknown kind";
}

int zt_kind_from_name(const char *name)
{
    for (int k = 1; k <= ZT_KIND_COUNT; k++)
        if (name && !strcmp(name, kind_names[k])) return k;
    return 0;
}

const char *zt_kind_article(int kind)
{
    const char *n = zt_kind_name(kind);
    return strchr("aeiou", n[0]) ? "an" : "a";
}

/* ---- small helpers ---------------------------------------------------------------------------- */

static int is_directory(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_regular_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && !strcmp(s + ls - lx, suffix);
}

/* A shared object path: "x.so" or a versioned "x.so.1". */
static int looks_like_library(const char *s)
{
    return ends_with(s, ".so") || strstr(s, ".so.") != NULL;
}

/* Directory part of a path ("." when there is none). */
static void dir_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

/* `items` (a malloc'ed array of *cap elements, n used) with room for one more: the same pointer or
 * a larger copy. NULL when out of memory; `items` is then still valid. */
static void *room_for_one_more(void *items, int *cap, int n, size_t item_size)
{
    if (n < *cap) return items;
    int new_cap = *cap ? *cap * 2 : 8;
    void *p = realloc(items, (size_t)new_cap * item_size);
    if (p) *cap = new_cap;
    return p;
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* snprintf for messages: cutting an absurdly long path short is acceptable there. */
static void format_message(char *buf, size_t cap, const char *fmt, ...) ZT_PRINTF(3, 4);
static void format_message(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

/* snprintf into a PATH_MAX buffer for a path: -1 when it does not fit (never a truncated path). */
static int format_path(char *buf, const char *fmt, ...) ZT_PRINTF(2, 3);
static int format_path(char *buf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, PATH_MAX, fmt, ap);
    va_end(ap);
    return n >= 0 && n < PATH_MAX ? 0 : -1;
}

int zt_plugin_name_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof(((zt_plugin_desc *)0)->name)) return 0;
    if (!islower((unsigned char)s[0]) && !isdigit((unsigned char)s[0])) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!islower(c) && !isdigit(c) && c != '-' && c != '_' && c != '.') return 0;
    }
    return 1;
}

/* ---- the registry ----------------------------------------------------------------------------- */

/* A parsed descriptor plus what the registry learned resolving its library line. */
typedef struct descriptor_entry {
    zt_plugin_desc desc;
    int scan_order;       /* position among all descriptor files scanned, good or bad */
    int library_found;
    char library_tried[2 * PATH_MAX + 64]; /* the candidate paths, for "not found" messages */
    char *trust_problem;  /* malloc'ed; why its files failed the trust rules at scan time, or NULL */
} descriptor_entry;

typedef struct search_dir {
    char path[PATH_MAX];
    const char *origin; /* "--plugin-path", "$ZT_PLUGIN_PATH", ... */
    int exists;
} search_dir;

typedef struct problem {
    char plugin_name[256]; /* the descriptor's file name without .plugin, to match --plugins */
    int scan_order;       /* as descriptor_entry's; -1 for a problem that is not a descriptor */
    char *text;           /* "path:line: what is wrong" */
} problem;

struct zt_registry {
    descriptor_entry *entries;
    int n_entries, cap_entries;
    search_dir *dirs;
    int n_dirs, cap_dirs;
    problem *problems;
    int n_problems, cap_problems;
    int n_scanned; /* descriptor files seen so far */
};

int zt_registry_count(const zt_registry *reg) { return reg ? reg->n_entries : 0; }
const zt_plugin_desc *zt_registry_at(const zt_registry *reg, int i)
{
    return reg && i >= 0 && i < reg->n_entries ? &reg->entries[i].desc : NULL;
}
int zt_registry_dir_count(const zt_registry *reg) { return reg ? reg->n_dirs : 0; }
const char *zt_registry_dir(const zt_registry *reg, int i)
{
    return reg && i >= 0 && i < reg->n_dirs ? reg->dirs[i].path : NULL;
}
const char *zt_registry_trust_problem(const zt_registry *reg, int i)
{
    return reg && i >= 0 && i < reg->n_entries ? reg->entries[i].trust_problem : NULL;
}
int zt_registry_problem_count(const zt_registry *reg) { return reg ? reg->n_problems : 0; }
const char *zt_registry_problem(const zt_registry *reg, int i)
{
    return reg && i >= 0 && i < reg->n_problems ? reg->problems[i].text : NULL;
}

void zt_registry_free(zt_registry *reg)
{
    if (!reg) return;
    for (int i = 0; i < reg->n_problems; i++) free(reg->problems[i].text);
    free(reg->problems);
    for (int i = 0; i < reg->n_entries; i++) free(reg->entries[i].trust_problem);
    free(reg->entries);
    free(reg->dirs);
    free(reg);
}

/* plugin_name: the malformed descriptor's name (taken at scan_order), or NULL for another problem. */
static zt_status add_problem(zt_registry *reg, const char *plugin_name, const char *text, zt_error *err)
{
    problem *grown = room_for_one_more(reg->problems, &reg->cap_problems, reg->n_problems, sizeof *grown);
    if (grown) reg->problems = grown;
    if (!grown || !(reg->problems[reg->n_problems].text = strdup(text)))
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory while scanning plugins");
    snprintf(reg->problems[reg->n_problems].plugin_name, sizeof reg->problems[0].plugin_name, "%s",
             plugin_name ? plugin_name : "");
    reg->problems[reg->n_problems].scan_order = plugin_name ? reg->n_scanned : -1;
    reg->n_problems++;
    return ZT_OK;
}

static const problem *first_problem_named(const zt_registry *reg, const char *name)
{
    for (int i = 0; i < reg->n_problems; i++)
        if (reg->problems[i].scan_order >= 0 && !strcmp(reg->problems[i].plugin_name, name)) return &reg->problems[i];
    return NULL;
}

/* Append a search directory unless the same directory (after resolving links) is already listed. */
static zt_status add_dir(zt_registry *reg, const char *path, const char *origin, zt_error *err)
{
    char canonical[PATH_MAX];
    int exists = is_directory(path) && realpath(path, canonical) != NULL;
    if (!exists) snprintf(canonical, sizeof canonical, "%s", path);
    for (int i = 0; i < reg->n_dirs; i++)
        if (!strcmp(reg->dirs[i].path, canonical)) return ZT_OK;
    search_dir *grown = room_for_one_more(reg->dirs, &reg->cap_dirs, reg->n_dirs, sizeof *grown);
    if (!grown) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory while scanning plugins");
    reg->dirs = grown;
    search_dir *d = &reg->dirs[reg->n_dirs++];
    snprintf(d->path, sizeof d->path, "%s", canonical);
    d->origin = origin;
    d->exists = exists;
    return ZT_OK;
}

/* ---- trust ------------------------------------------------------------------------------------ */

/* Room for the problem lines of a descriptor and its library (trust.h): a few paths each. */
#define TRUST_WHY_MAX (4 * PATH_MAX)

/* The trust problems of a plugin's files: its descriptor (empty for a .so path) and its library
 * (when found). Returns 1 with `why` filled when one of them fails the rules. */
static int plugin_untrusted(const char *descriptor, const char *library, char *why, size_t cap)
{
    const char *paths[2];
    int n = 0;
    if (descriptor && *descriptor) paths[n++] = descriptor;
    if (library && *library) paths[n++] = library;
    return zt_trust_check(paths, n, why, cap);
}

/* At scan time: remember why an entry's files are unsafe, for --list-plugins. */
static zt_status note_trust(descriptor_entry *e, zt_error *err)
{
    char *why = malloc(TRUST_WHY_MAX);
    if (!why) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory while scanning plugins");
    if (plugin_untrusted(e->desc.descriptor, e->library_found ? e->desc.library : NULL, why, TRUST_WHY_MAX)) {
        e->desc.unsafe = 1;
        e->trust_problem = why;
        return ZT_OK;
    }
    free(why);
    return ZT_OK;
}

/* At load time, before any of the plugin's code runs: refuse a plugin whose files fail the trust
 * rules, or, with ZT_ALLOW_UNSAFE_PLUGINS=1, warn and go on. `who` is "plugin 'x' (descriptor ...)". */
static zt_status trust_gate(const char *who, const char *descriptor, const char *library, zt_error *err)
{
    int allowed = zt_trust_unsafe_allowed(err);
    if (allowed < 0) return ZT_ERR_CONFIG;
    char *why = malloc(TRUST_WHY_MAX);
    if (!why) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory checking %s", who);
    zt_status st = ZT_OK;
    if (plugin_untrusted(descriptor, library, why, TRUST_WHY_MAX)) {
        if (allowed) {
            zt_log(ZT_LOG_WARN, "loading %s although users other than you and root could change its files, "
                   "because %s=1:", who, ZT_TRUST_OPT_IN);
            for (char *line = why, *next; line; line = next) {
                next = strchr(line, '\n');
                if (next) *next++ = '\0';
                zt_log(ZT_LOG_WARN, "  %s", line);
            }
        } else {
            st = zt_error_set(err, ZT_ERR_IO,
                              "refusing to load %s: users other than you and root could change its files, "
                              "and loading it runs that code as you:", who);
            for (char *line = why, *next; line; line = next) {
                next = strchr(line, '\n');
                if (next) *next++ = '\0';
                zt_error_append(err, "\n  %s", line);
            }
            zt_error_append(err, "\nFix the permissions as shown (docs/plugins.md, \"Trust\"), or set %s=1 to "
                                 "load it anyway, with a warning, while developing", ZT_TRUST_OPT_IN);
        }
    }
    free(why);
    return st;
}

/* ---- descriptor files ------------------------------------------------------------------------- */

/* Find the library a descriptor names (rules in docs/plugins.md): an absolute path as is; a path
 * with a '/' relative to the descriptor's directory; a bare file name in the descriptor's directory,
 * then in the plugin library directory of the same install tree (ZT_PLUGINS_D_TO_LIBDIR). */
static void resolve_library(const char *descriptor_dir, const char *value, descriptor_entry *e)
{
    char candidates[2][PATH_MAX];
    int n = 0, too_long = 0;
    if (value[0] == '/') {
        too_long |= format_path(candidates[n++], "%s", value);
    } else if (strchr(value, '/')) {
        too_long |= format_path(candidates[n++], "%s/%s", descriptor_dir, value);
    } else {
        /* The install tree's library directory, resolved so messages show a plain path. */
        char libdir[PATH_MAX], resolved[PATH_MAX];
        too_long |= format_path(candidates[n++], "%s/%s", descriptor_dir, value);
        too_long |= format_path(libdir, "%s/%s", descriptor_dir, ZT_PLUGINS_D_TO_LIBDIR);
        too_long |= format_path(candidates[n++], "%s/%s", realpath(libdir, resolved) ? resolved : libdir, value);
    }
    e->library_found = 0;
    if (too_long) {
        format_message(e->library_tried, sizeof e->library_tried, "'%s' in %s: the path is too long", value,
                       descriptor_dir);
        format_message(e->desc.library, sizeof e->desc.library, "%s", value);
        return;
    }
    format_message(e->library_tried, sizeof e->library_tried, "%s%s%s", candidates[0], n > 1 ? ", " : "",
                   n > 1 ? candidates[1] : "");
    for (int i = 0; i < n && !e->library_found; i++)
        e->library_found = is_regular_file(candidates[i]) && realpath(candidates[i], e->desc.library);
    /* Not found: show where it belongs, the last candidate (a bare name's home is the library dir). */
    if (!e->library_found) format_message(e->desc.library, sizeof e->desc.library, "%s", candidates[n - 1]);
}

#define DESCRIPTOR_MAX_BYTES 65536

enum { KEY_NAME, KEY_KIND, KEY_LIBRARY, KEY_ABI, N_KEYS };
static const char *const descriptor_keys[N_KEYS] = {"name", "kind", "library", "abi"};

/* The whole descriptor as a NUL-terminated string (caller frees), or NULL with `why` set. */
static char *read_descriptor_text(const char *path, char *why, size_t why_cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        format_message(why, why_cap, "%s: cannot open the descriptor: %s", path, strerror(errno));
        return NULL;
    }
    char *text = malloc(DESCRIPTOR_MAX_BYTES + 1);
    size_t len = text ? fread(text, 1, DESCRIPTOR_MAX_BYTES + 1, f) : 0;
    int read_failed = !text || ferror(f);
    fclose(f);
    const char *problem = NULL;
    if (read_failed) problem = "cannot read the descriptor";
    else if (len > DESCRIPTOR_MAX_BYTES) problem = "larger than 64 KiB, so not a plugin descriptor; move it out of plugins.d";
    else if (memchr(text, '\0', len)) problem = "contains a NUL byte, so it is not a text descriptor; move it out of plugins.d";
    if (problem) {
        format_message(why, why_cap, "%s: %s", path, problem);
        free(text);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

/* Split `text` (modified in place) into the four values; line[k] is the line key k was on. */
static int parse_key_values(const char *path, char *text, char values[N_KEYS][PATH_MAX], int line[N_KEYS],
                            char *why, size_t why_cap)
{
    int line_no = 0;
    for (char *next_line = text; next_line;) {
        char *content = next_line;
        line_no++;
        next_line = strchr(content, '\n');
        if (next_line) *next_line++ = '\0';
        char *hash = strchr(content, '#');
        if (hash) *hash = '\0';
        content = zt_trim(content);
        if (!*content) continue;
        for (const char *c = content; *c; c++) {
            if ((unsigned char)*c < 0x20 && *c != '\t') {
                format_message(why, why_cap, "%s:%d: contains a control character (byte 0x%02X); descriptors are plain text",
                               path, line_no, (unsigned char)*c);
                return -1;
            }
        }
        char *eq = strchr(content, '=');
        if (!eq) {
            format_message(why, why_cap, "%s:%d: expected 'key = value', found '%.80s'; the keys are name, kind, library and abi",
                           path, line_no, content);
            return -1;
        }
        *eq = '\0';
        char *key = zt_trim(content), *value = zt_trim(eq + 1);
        int k = 0;
        while (k < N_KEYS && strcmp(key, descriptor_keys[k])) k++;
        if (k == N_KEYS) {
            const char *near = zt_nearest_word(key, descriptor_keys, N_KEYS);
            format_message(why, why_cap, "%s:%d: unknown key '%.80s'%s%s%s; the keys are name, kind, library and abi",
                           path, line_no, key, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
            return -1;
        }
        if (line[k]) {
            format_message(why, why_cap, "%s:%d: '%s' is given twice (first on line %d); keep one", path, line_no,
                           key, line[k]);
            return -1;
        }
        if (!*value || strlen(value) >= PATH_MAX) {
            format_message(why, why_cap, "%s:%d: '%s' %s", path, line_no, key, *value ? "is too long" : "has no value");
            return -1;
        }
        line[k] = line_no;
        memcpy(values[k], value, strlen(value) + 1);
    }
    for (int k = 0; k < N_KEYS; k++) {
        if (!line[k]) {
            format_message(why, why_cap, "%s: missing '%s = ...'; a descriptor needs name, kind, library and abi",
                           path, descriptor_keys[k]);
            return -1;
        }
    }
    return 0;
}

/* Parse one NAME.plugin file into *e. On failure returns -1 with `why` holding "path:line: what is
 * wrong; how to fix it" (the registry keeps it as a problem; loading that plugin reports it). */
static int parse_descriptor(const char *path, descriptor_entry *e, char *why, size_t why_cap)
{
    memset(e, 0, sizeof *e);
    char absolute[PATH_MAX];
    if (!realpath(path, absolute)) {
        format_message(why, why_cap, "%s: cannot open the descriptor: %s", path, strerror(errno));
        return -1;
    }
    char *text = read_descriptor_text(absolute, why, why_cap);
    if (!text) return -1;
    char values[N_KEYS][PATH_MAX];
    int line[N_KEYS] = {0};
    int parsed = parse_key_values(absolute, text, values, line, why, why_cap);
    free(text);
    if (parsed != 0) return -1;

    const char *name = values[KEY_NAME], *kind = values[KEY_KIND], *abi = values[KEY_ABI];
    const char *file_name = strrchr(absolute, '/') + 1;
    int stem_len = (int)(strlen(file_name) - strlen(".plugin"));
    if (!zt_plugin_name_valid(name)) {
        format_message(why, why_cap, "%s:%d: name '%.80s' is not a valid plugin name (lower-case letters, digits, "
                       "'-', '_', '.'; at most 63)", absolute, line[KEY_NAME], name);
        return -1;
    }
    if ((int)strlen(name) != stem_len || strncmp(name, file_name, (size_t)stem_len)) {
        format_message(why, why_cap, "%s:%d: name = %s, but the file is named %s; rename the file to %s.plugin",
                       absolute, line[KEY_NAME], name, file_name, name);
        return -1;
    }
    e->desc.kind = zt_kind_from_name(kind);
    if (!e->desc.kind) {
        const char *near = zt_nearest_word(kind, kind_names + 1, ZT_KIND_COUNT);
        format_message(why, why_cap, "%s:%d: kind '%.80s' is not a plugin kind%s%s%s; use one of tokenizer, model, "
                       "optimizer, zero, attention, parallel, adapter", absolute, line[KEY_KIND], kind,
                       near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
        return -1;
    }
    unsigned major, minor;
    char extra;
    if (sscanf(abi, "%u.%u%c", &major, &minor, &extra) != 2 || major > 65535 || minor > 65535) {
        format_message(why, why_cap, "%s:%d: abi '%.80s' is not MAJOR.MINOR (e.g. abi = %u.%u)", absolute,
                       line[KEY_ABI], abi, ZT_ABI_MAJOR, ZT_ABI_MINOR);
        return -1;
    }
    memcpy(e->desc.name, name, strlen(name) + 1); /* valid_plugin_name checked that it fits */
    memcpy(e->desc.descriptor, absolute, strlen(absolute) + 1);
    e->desc.abi_major = (int)major;
    e->desc.abi_minor = (int)minor;
    char dir[PATH_MAX];
    dir_of(absolute, dir, sizeof dir);
    resolve_library(dir, values[KEY_LIBRARY], e);
    return 0;
}

static zt_status scan_dir(zt_registry *reg, const char *dir, zt_error *err)
{
    DIR *d = opendir(dir);
    if (!d) {
        char text[PATH_MAX + 128];
        snprintf(text, sizeof text, "%s: cannot list the directory: %s", dir, strerror(errno));
        return add_problem(reg, NULL, text, err);
    }
    /* Read all names first and sort them, so the order does not depend on the file system. */
    char **names = NULL;
    int n = 0, cap = 0;
    zt_status st = ZT_OK;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.' || !ends_with(ent->d_name, ".plugin")) continue;
        char **grown = room_for_one_more(names, &cap, n, sizeof *grown);
        char *copy = grown ? strdup(ent->d_name) : NULL;
        if (grown) names = grown;
        if (!copy) {
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory while scanning plugins");
            break;
        }
        names[n++] = copy;
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof *names, compare_strings);

    for (int i = 0; i < n && st == ZT_OK; i++) {
        char path[PATH_MAX], why[PATH_MAX + 512];
        if (format_path(path, "%s/%s", dir, names[i])) {
            format_message(why, sizeof why, "%s/%s: the path is too long", dir, names[i]);
            st = add_problem(reg, NULL, why, err);
            continue;
        }
        descriptor_entry *grown = room_for_one_more(reg->entries, &reg->cap_entries, reg->n_entries, sizeof *grown);
        if (!grown) {
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory while scanning plugins");
            break;
        }
        reg->entries = grown;
        if (parse_descriptor(path, &reg->entries[reg->n_entries], why, sizeof why) == 0) {
            reg->entries[reg->n_entries].scan_order = reg->n_scanned;
            st = note_trust(&reg->entries[reg->n_entries++], err);
        } else {
            char stem[256];
            snprintf(stem, sizeof stem, "%.*s", (int)(strlen(names[i]) - strlen(".plugin")), names[i]);
            st = add_problem(reg, stem, why, err);
        }
        reg->n_scanned++;
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

/* Add each directory of a colon-separated list. A missing one is an error when `must_exist`, else a
 * problem listed by --list-plugins (it stays on the search path, shown as missing). */
static zt_status add_dir_list(zt_registry *reg, const char *list, const char *origin, int must_exist,
                              zt_error *err)
{
    char *copy = strdup(list);
    if (!copy) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory while scanning plugins");
    zt_status st = ZT_OK;
    char *save = NULL;
    for (char *part = strtok_r(copy, ":", &save); part && st == ZT_OK; part = strtok_r(NULL, ":", &save)) {
        if (!is_directory(part)) {
            if (must_exist) {
                st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                                  "%s %s: %s; give the directory that holds the .plugin descriptors",
                                  origin, part, access(part, F_OK) == 0 ? "not a directory" : "no such directory");
                break;
            }
            char text[PATH_MAX + 128];
            snprintf(text, sizeof text, "%s names %s, which is not a directory; fix or drop that entry", origin,
                     part);
            st = add_problem(reg, NULL, text, err);
            if (st) break;
        }
        st = add_dir(reg, part, origin, err);
    }
    free(copy);
    return st;
}

/* The per-user directory into path (PATH_MAX): $XDG_DATA_HOME/zt/plugins.d, else
 * $HOME/.local/share/zt/plugins.d. The XDG base directory spec says a relative XDG_DATA_HOME is
 * invalid and ignored; a relative HOME is ignored too: either would make zt-run load plugins from
 * wherever it is started. 0 when there is none. */
static int per_user_dir(char *path)
{
    const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
    if (xdg && *xdg && xdg[0] != '/') {
        zt_log(ZT_LOG_INFO, "XDG_DATA_HOME=%s is ignored: it is a relative path, and the XDG base directory "
               "spec says relative values are ignored; set it to an absolute path", xdg);
        xdg = NULL;
    }
    if (xdg && *xdg) return format_path(path, "%s/zt/plugins.d", xdg) == 0;
    if (home && home[0] != '/') {
        zt_log(ZT_LOG_INFO, "HOME%s%s is ignored for the per-user plugin directory: it is %s, so there is no "
               "per-user plugin directory; set HOME (or XDG_DATA_HOME) to an absolute path",
               *home ? "=" : "", home, *home ? "a relative path" : "empty");
        return 0;
    }
    return home && format_path(path, "%s/.local/share/zt/plugins.d", home) == 0;
}

zt_status zt_registry_scan(const char *const *explicit_dirs, int n_explicit, zt_registry **out,
                           zt_error *err)
{
    *out = NULL;
    /* A bad ZT_ALLOW_UNSAFE_PLUGINS value is reported once, before anything is listed or loaded. */
    if (zt_trust_unsafe_allowed(err) < 0) return ZT_ERR_CONFIG;
    zt_registry *reg = calloc(1, sizeof *reg);
    if (!reg) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory while scanning plugins");
    zt_status st = ZT_OK;

    /* 1. --plugin-path: the user typed it, so a missing directory is an error, not a silent skip. */
    for (int i = 0; i < n_explicit && st == ZT_OK; i++)
        st = add_dir_list(reg, explicit_dirs[i], "--plugin-path", 1, err);
    /* 2. $ZT_PLUGIN_PATH: a stale entry is listed as a problem but does not stop the run. */
    const char *env = getenv("ZT_PLUGIN_PATH");
    if (st == ZT_OK && env && *env) st = add_dir_list(reg, env, "$ZT_PLUGIN_PATH", 0, err);
    /* 3. per-user */
    char path[PATH_MAX];
    if (st == ZT_OK && per_user_dir(path)) st = add_dir(reg, path, "per-user", err);
    /* 4. the install prefix, and the tree zt-run itself lives in (a relocated install) */
    if (st == ZT_OK) st = add_dir(reg, ZT_INSTALL_PLUGINS_D, "install prefix", err);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (st == ZT_OK && n > 0) {
        exe[n] = '\0';
        char exe_dir[PATH_MAX], prefix[PATH_MAX]; /* <prefix>/bin/zt-run */
        dir_of(exe, exe_dir, sizeof exe_dir);
        dir_of(exe_dir, prefix, sizeof prefix);
        if (format_path(path, "%s/share/zt/plugins.d", prefix) == 0)
            st = add_dir(reg, path, "next to the executable", err);
    }
    /* 5. the build tree, so zt-run works from a build without installing */
    if (st == ZT_OK) st = add_dir(reg, ZT_BUILD_PLUGINS_D, "build tree", err);

    for (int i = 0; i < reg->n_dirs && st == ZT_OK; i++)
        if (reg->dirs[i].exists) st = scan_dir(reg, reg->dirs[i].path, err);
    if (st != ZT_OK) {
        zt_registry_free(reg);
        return st;
    }

    /* First match wins: a later descriptor of the same name is shadowed, also by an earlier one that
     * is malformed (that one's problem is what a run asking for the name gets). */
    for (int i = 0; i < reg->n_entries; i++) {
        for (int j = 0; j < i; j++)
            if (!strcmp(reg->entries[i].desc.name, reg->entries[j].desc.name)) reg->entries[i].desc.shadowed = 1;
        const problem *bad = first_problem_named(reg, reg->entries[i].desc.name);
        if (bad && bad->scan_order < reg->entries[i].scan_order) reg->entries[i].desc.shadowed = 1;
    }
    *out = reg;
    return ZT_OK;
}

/* ---- crash guard ------------------------------------------------------------------------------ */

/* While the host is inside a plugin's code (its static constructors, entry, probe, init or fini), a
 * fatal signal prints which plugin was running and then takes its default action (core dump, exit
 * status 128 + signal), so a crash is never anonymous. Outside those calls the host's own handlers
 * (or none) are in place: the guard is installed around each call and removed after it. */

static const int guarded_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
#define N_GUARDED ((int)(sizeof guarded_signals / sizeof guarded_signals[0]))

static struct {
    const char *plugin;
    const char *call;
    const char *library;
    struct sigaction saved[N_GUARDED];
} g_guard;

static void write_str(const char *s)
{
    ssize_t ignored = write(STDERR_FILENO, s, strlen(s));
    (void)ignored;
}

static const char *signal_description(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV (invalid memory access)";
    case SIGBUS: return "SIGBUS (bad memory access)";
    case SIGILL: return "SIGILL (illegal instruction: built for another CPU?)";
    case SIGFPE: return "SIGFPE (arithmetic error, e.g. integer division by zero)";
    case SIGABRT: return "SIGABRT (abort: a failed assert, or a C++ exception nobody caught)";
    }
    return "a fatal signal";
}

/* Async-signal-safe: only write(2), sigaction and raise. */
static void crash_handler(int sig)
{
    write_str("\nzt: plugin '");
    write_str(g_guard.plugin ? g_guard.plugin : "?");
    write_str("' crashed in ");
    write_str(g_guard.call ? g_guard.call : "?");
    write_str(" with ");
    write_str(signal_description(sig));
    write_str("\nzt: library: ");
    write_str(g_guard.library ? g_guard.library : "?");
    write_str("\nzt: this is a bug in the plugin: report it to its author, or run without it\n");
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

static void guard_begin(const char *plugin, const char *call, const char *library)
{
    /* An alternate stack lets the handler run even when the plugin overflowed its stack. */
    static char alt_stack[65536];
    static int alt_stack_ready = 0;
    if (!alt_stack_ready) {
        stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack, .ss_flags = 0};
        sigaltstack(&ss, NULL);
        alt_stack_ready = 1;
    }
    g_guard.plugin = plugin;
    g_guard.call = call;
    g_guard.library = library;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = crash_handler;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_GUARDED; i++) sigaction(guarded_signals[i], &sa, &g_guard.saved[i]);
}

static void guard_end(void)
{
    for (int i = 0; i < N_GUARDED; i++) sigaction(guarded_signals[i], &g_guard.saved[i], NULL);
    g_guard.plugin = g_guard.call = g_guard.library = NULL;
}

/* ---- loading ---------------------------------------------------------------------------------- */

/* The checks of registry.h, in order; `d` is the descriptor (name and kind may be empty when the
 * plugin was loaded from a .so path). `who` is "plugin 'x' (/path/libx.so)". */
static zt_status check_plugin(const zt_plugin *p, const zt_plugin_desc *d, const char *who, zt_error *err)
{
    if (p->magic != ZT_ABI_MAGIC)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s is not a zt plugin: its entry returned a struct with magic 0x%08X, expected "
                            "0x%08X (\"ZTP1\"). It may be a plugin for another program or an unfinished "
                            "build: rebuild it against this zt SDK (include/zt/zt_plugin.h)",
                            who, (unsigned)p->magic, (unsigned)ZT_ABI_MAGIC);
    if (p->abi_major != ZT_ABI_MAJOR)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "%s was built against zt ABI %u.%u, this zt provides %u.%u: a plugin of another "
                            "major ABI cannot be loaded; rebuild the plugin against this SDK, or use a zt that "
                            "provides ABI %u.x",
                            who, p->abi_major, p->abi_minor, ZT_ABI_MAJOR, ZT_ABI_MINOR, p->abi_major);
    if (p->abi_minor > ZT_ABI_MINOR)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "%s was built against zt ABI %u.%u, this zt provides %u.%u: upgrade zt or rebuild "
                            "the plugin against this SDK",
                            who, p->abi_major, p->abi_minor, ZT_ABI_MAJOR, ZT_ABI_MINOR);
    if (p->struct_size < PLUGIN_V1_0_SIZE)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s has a zt_plugin struct of %u bytes, smaller than the %u bytes of ABI 1.0: it "
                            "was not built from the zt SDK headers; rebuild it against this SDK",
                            who, (unsigned)p->struct_size, PLUGIN_V1_0_SIZE);
    if (p->kind < 1 || p->kind > ZT_KIND_COUNT)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s declares kind %d, which is not a zt plugin kind (1 tokenizer .. 7 adapter): "
                            "this is a bug in the plugin; report it to its author",
                            who, (int)p->kind);
    if (d->kind && p->kind != d->kind)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s is %s %s plugin, but its descriptor %s says kind = %s: fix the descriptor's "
                            "kind line (kind = %s) or point its library line at the right plugin",
                            who, zt_kind_article(p->kind), zt_kind_name(p->kind), d->descriptor,
                            zt_kind_name(d->kind), zt_kind_name(p->kind));
    if (!p->name)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s has no name (NULL): this is a bug in the plugin; report it to its author", who);
    if (!zt_plugin_name_valid(p->name))
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s calls itself '%.80s', which is not a valid plugin name (lower-case letters, "
                            "digits, '-', '_', '.'; at most 63): this is a bug in the plugin",
                            who, p->name);
    if (d->name[0] && strcmp(p->name, d->name))
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s calls itself '%s', but its descriptor %s says name = %s: the descriptor's "
                            "library line points at another plugin; fix it, or rename the descriptor to "
                            "%s.plugin with name = %s",
                            who, p->name, d->descriptor, d->name, p->name, p->name);
    const struct {
        const void *value;
        const char *field;
    } required[] = {
        {p->version, "version"}, {p->description, "description"}, {(const void *)p->probe, "probe"},
        {(const void *)p->init, "init"}, {(const void *)p->fini, "fini"}, {p->ops, "ops"},
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!required[i].value)
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s has no %s (NULL): every plugin must provide name, version, description, "
                                "probe, init, fini and ops; this is a bug in the plugin, report it to its author",
                                who, required[i].field);
    uint32_t ops_size = *(const uint32_t *)p->ops;
    if (ops_size < ops_v1_0_size[p->kind])
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s has a %s table of %u bytes (its struct_size), smaller than the %u bytes of ABI "
                            "1.0: the plugin did not set struct_size, or was not built from the zt SDK "
                            "headers; rebuild it against this SDK",
                            who, ops_type_names[p->kind], (unsigned)ops_size, (unsigned)ops_v1_0_size[p->kind]);

    if (p->n_options && !p->options)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s declares %u options but its options table is NULL: this is a bug in the "
                            "plugin; report it to its author",
                            who, (unsigned)p->n_options);
    for (uint32_t i = 0; i < p->n_options; i++) {
        const zt_option *o = &p->options[i];
        const char *problem = NULL;
        if (!o->key) problem = "has no key (NULL)";
        else if (!o->help) problem = "has no help text (NULL)";
        else if (o->type < ZT_OPT_BOOL || o->type > ZT_OPT_BYTES) problem = "has an unknown type";
        else if (o->type == ZT_OPT_ENUM && (!o->choices || !o->choices[0]))
            problem = "is an enum without choices";
        for (uint32_t j = 0; !problem && j < i; j++)
            if (p->options[j].key && !strcmp(p->options[j].key, o->key)) problem = "is declared twice";
        if (problem)
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: option %u (key '%s') %s: this is a bug in the plugin's options table; "
                                "report it to its author",
                                who, (unsigned)i, o->key ? o->key : "(null)", problem);
    }
    return ZT_OK;
}

/* dlopen `library` and run the checks; on success fills lp (desc taken from d, completed from the
 * plugin for a .so path). */
static zt_status open_library(const zt_plugin_desc *d, zt_loaded_plugin *lp, zt_error *err)
{
    char who[PATH_MAX + 96];
    if (d->name[0]) snprintf(who, sizeof who, "plugin '%s' (%s)", d->name, d->library);
    else snprintf(who, sizeof who, "the plugin at %s", d->library);
    const char *display_name = d->name[0] ? d->name : d->library;

    guard_begin(display_name, "dlopen (its static constructors)", d->library);
    dlerror();
    void *dl = dlopen(d->library, RTLD_NOW | RTLD_LOCAL);
    guard_end();
    if (!dl)
        return zt_error_set(err, ZT_ERR_IO,
                            "cannot load %s: %s. Check that it is a shared object for this machine and that "
                            "the libraries it needs are installed (ldd %s)",
                            who, dlerror(), d->library);

    void *sym = dlsym(dl, ZT_ENTRY_SYMBOL);
    if (!sym) {
        dlclose(dl);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s does not export %s, so it is not a zt plugin (or was built without the "
                            "ZT_PLUGIN_ENTRY macro): rebuild it with the zt SDK; nm -D --defined-only %s lists "
                            "what it exports",
                            who, ZT_ENTRY_SYMBOL, d->library);
    }
    zt_plugin_entry_fn entry = (zt_plugin_entry_fn)sym; /* POSIX allows this conversion for dlsym */
    guard_begin(display_name, "zt_plugin_entry()", d->library);
    const zt_plugin *p = entry();
    guard_end();
    if (!p) {
        dlclose(dl);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: zt_plugin_entry() returned NULL; it must return a pointer to a static "
                            "zt_plugin. This is a bug in the plugin: report it to its author",
                            who);
    }
    zt_status st = check_plugin(p, d, who, err);
    if (st != ZT_OK) {
        dlclose(dl);
        return st;
    }
    memset(lp, 0, sizeof *lp);
    lp->desc = *d;
    if (!lp->desc.name[0]) {
        snprintf(lp->desc.name, sizeof lp->desc.name, "%s", p->name);
        lp->desc.kind = p->kind;
        lp->desc.abi_major = p->abi_major;
        lp->desc.abi_minor = p->abi_minor;
    }
    lp->dl = dl;
    lp->plugin = p;
    return ZT_OK;
}

static zt_status load_entry(const descriptor_entry *e, zt_loaded_plugin *lp, zt_error *err)
{
    const zt_plugin_desc *d = &e->desc;
    char who[PATH_MAX + 96];
    snprintf(who, sizeof who, "plugin '%s' (descriptor %s)", d->name, d->descriptor);
    zt_status st = trust_gate(who, d->descriptor, e->library_found ? d->library : NULL, err);
    if (st != ZT_OK) return st;
    /* The descriptor's abi line lets an incompatible plugin be refused without running any of its
     * code (dlopen runs static constructors). */
    if (d->abi_major != (int)ZT_ABI_MAJOR || d->abi_minor > (int)ZT_ABI_MINOR)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "plugin '%s' (descriptor %s) says abi = %d.%d, this zt provides %u.%u: %s",
                            d->name, d->descriptor, d->abi_major, d->abi_minor, ZT_ABI_MAJOR, ZT_ABI_MINOR,
                            d->abi_major != (int)ZT_ABI_MAJOR
                                ? "install a build of the plugin for this zt's major ABI, or a zt that provides it"
                                : "upgrade zt or rebuild the plugin against this SDK");
    if (!e->library_found)
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "plugin '%s': its library was not found (tried %s). The descriptor %s names it in "
                            "its library line: reinstall the plugin, or fix that line",
                            d->name, e->library_tried, d->descriptor);
    return open_library(d, lp, err);
}

/* The message for a name nobody installed: every directory tried and the nearest names. */
static zt_status unknown_plugin(const zt_registry *reg, const char *name, zt_error *err)
{
    zt_error_set(err, ZT_ERR_NOT_FOUND, "no plugin named '%s' is installed.", name);
    int n_near = 0;
    for (int i = 0; i < reg->n_entries; i++) {
        const zt_plugin_desc *d = &reg->entries[i].desc;
        if (d->shadowed || !zt_is_near_word(name, d->name)) continue;
        zt_error_append(err, "%s '%s' (%s)", n_near ? "," : " Closest installed:", d->name, zt_kind_name(d->kind));
        n_near++;
    }
    if (!n_near) zt_error_append(err, " Run zt-run --list-plugins to see what is installed.");
    zt_error_append(err, "\nDirectories searched, in order:");
    for (int i = 0; i < reg->n_dirs; i++)
        zt_error_append(err, "\n  %s (%s%s)", reg->dirs[i].path, reg->dirs[i].origin,
                        reg->dirs[i].exists ? "" : "; does not exist");
    zt_error_append(err, "\nInstall the plugin's NAME.plugin descriptor in one of them, or add its directory "
                         "with --plugin-path DIR or $ZT_PLUGIN_PATH");
    return ZT_ERR_NOT_FOUND;
}

zt_status zt_plugin_load(const zt_registry *reg, const char *name_or_path, zt_loaded_plugin *out,
                         zt_error *err)
{
    memset(out, 0, sizeof *out);
    if (!name_or_path || !*name_or_path)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "empty plugin name: give a plugin name, a .plugin or a .so path");

    if (looks_like_library(name_or_path)) {
        zt_plugin_desc d;
        memset(&d, 0, sizeof d);
        if (!is_regular_file(name_or_path) || !realpath(name_or_path, d.library))
            return zt_error_set(err, ZT_ERR_NOT_FOUND, "plugin library %s: %s", name_or_path,
                                access(name_or_path, F_OK) == 0 ? "not a regular file" : "no such file");
        char who[PATH_MAX + 32];
        snprintf(who, sizeof who, "the plugin at %s", d.library);
        zt_status st = trust_gate(who, NULL, d.library, err);
        return st != ZT_OK ? st : open_library(&d, out, err);
    }
    if (ends_with(name_or_path, ".plugin")) {
        descriptor_entry *e = malloc(sizeof *e);
        char why[PATH_MAX + 512];
        if (!e) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory loading %s", name_or_path);
        zt_status st;
        if (parse_descriptor(name_or_path, e, why, sizeof why) != 0)
            st = zt_error_set(err, ZT_ERR_FORMAT, "bad plugin descriptor: %s", why);
        else
            st = load_entry(e, out, err);
        free(e);
        return st;
    }
    if (strchr(name_or_path, '/'))
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "'%s' is neither a plugin name nor a path ending in .plugin or .so", name_or_path);

    if (!reg)
        return zt_error_set(err, ZT_ERR_NOT_FOUND, "no plugin named '%s' (no plugin directories scanned)", name_or_path);
    const problem *bad = first_problem_named(reg, name_or_path);
    for (int i = 0; i < reg->n_entries; i++)
        if (!reg->entries[i].desc.shadowed && !strcmp(reg->entries[i].desc.name, name_or_path))
            return load_entry(&reg->entries[i], out, err);
    if (bad)
        return zt_error_set(err, ZT_ERR_FORMAT, "plugin '%s' has a bad descriptor: %s", name_or_path, bad->text);
    return unknown_plugin(reg, name_or_path, err);
}

/* ---- probe, init, unload ---------------------------------------------------------------------- */

/* The failure message of a plugin call: the plugin's own words, or a note that it gave none. A probe
 * answering ZT_ERR_UNSUPPORTED is not a failure but a refusal, and reads as one. */
static zt_status plugin_call_failed(const zt_loaded_plugin *lp, const zt_host *host, zt_status st,
                                    const char *call, int is_probe, zt_error *err)
{
    zt_status reported; /* the status given to host->error(); the returned one is what counts */
    const char *msg = zt_runtime_take_error(host, &reported);
    if (is_probe && st == ZT_ERR_UNSUPPORTED)
        zt_error_set(err, st, "plugin '%s' cannot run here: ", lp->desc.name);
    else
        zt_error_set(err, st, "plugin '%s' failed in %s (%s): ", lp->desc.name, call, zt_status_name(st));
    if (msg && *msg) zt_error_append(err, "%s", msg);
    else zt_error_append(err, "it gave no reason (a plugin should describe every failure with host->error(); "
                              "report this to its author)");
    return st;
}

zt_status zt_plugin_probe(zt_loaded_plugin *lp, zt_runtime *rt, zt_error *err)
{
    if (!lp || !lp->plugin) return zt_error_set(err, ZT_ERR_INVALID_ARG, "zt_plugin_probe: plugin not loaded");
    const zt_plugin *p = lp->plugin;
    const zt_host *host = zt_runtime_host(rt, lp->desc.name, p->options, p->n_options);
    if (!host)
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "no services table for plugin '%s'", lp->desc.name);
    zt_status ignored;
    zt_runtime_take_error(host, &ignored); /* drop any message left from an earlier call */
    guard_begin(lp->desc.name, "probe()", lp->desc.library);
    zt_status st = p->probe(host);
    guard_end();
    return st == ZT_OK ? ZT_OK : plugin_call_failed(lp, host, st, "probe()", 1, err);
}

zt_status zt_plugin_init(zt_loaded_plugin *lp, zt_runtime *rt, zt_error *err)
{
    if (!lp || !lp->plugin) return zt_error_set(err, ZT_ERR_INVALID_ARG, "zt_plugin_init: plugin not loaded");
    if (lp->initialized)
        return zt_error_set(err, ZT_ERR_INTERNAL, "plugin '%s' is already initialized", lp->desc.name);
    const zt_plugin *p = lp->plugin;
    const zt_host *host = zt_runtime_host(rt, lp->desc.name, p->options, p->n_options);
    if (!host)
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "no services table for plugin '%s'", lp->desc.name);
    zt_status ignored;
    zt_runtime_take_error(host, &ignored);
    void *state = NULL;
    guard_begin(lp->desc.name, "init()", lp->desc.library);
    zt_status st = p->init(host, &state);
    guard_end();
    if (st != ZT_OK) return plugin_call_failed(lp, host, st, "init()", 0, err);
    lp->host = host;
    lp->state = state;
    lp->initialized = 1;
    return ZT_OK;
}

void zt_plugin_unload(zt_loaded_plugin *lp)
{
    if (!lp) return;
    if (lp->initialized && lp->plugin) {
        guard_begin(lp->desc.name, "fini()", lp->desc.library);
        lp->plugin->fini(lp->state);
        guard_end();
    }
    if (lp->dl) dlclose(lp->dl);
    memset(lp, 0, sizeof *lp);
}

void zt_plugin_set_unload(zt_plugin_set *set)
{
    if (!set) return;
    /* Reverse kind order: the opposite of the order a run initializes them in. */
    for (int k = ZT_KIND_COUNT; k >= 1; k--) zt_plugin_unload(&set->by_kind[k]);
}
