/* Shared helpers of the tokenizer tests: load the sentencepiece plugin exactly as zt-run does
 * (registry scan of the build tree's plugins.d, dlopen + ABI checks, a runtime's services table,
 * init), and read the reference files the fixture script wrote with the sentencepiece CLI. */
#ifndef ZT_TESTS_TK_COMMON_H
#define ZT_TESTS_TK_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "host/registry.h"
#include "host/runtime.h"

typedef struct tk_plugin {
    zt_registry *registry;
    zt_config *config; /* NULL: every option at its default */
    zt_runtime *runtime;
    zt_loaded_plugin loaded;
    const zt_tokenizer_ops *ops;
    void *state;
} tk_plugin;

/* Load, probe and init "sentencepiece" from plugins_d. Exits with a message if that fails: nothing
 * else can run. */
void tk_plugin_load(tk_plugin *p, const char *plugins_d);
/* The same with a run config as zt-run would read it, e.g. {"tokenizer": {"chunk_cache": "64K"}},
 * validated against the plugin's options. */
void tk_plugin_load_config(tk_plugin *p, const char *plugins_d, const char *config_json);
void tk_plugin_unload(tk_plugin *p);

/* Everything written to stderr (the host's log lines) between start and end, as a malloc'ed
 * string; it is also passed on to the real stderr. */
void tk_stderr_capture_start(void);
char *tk_stderr_capture_end(void);
/* In a log text, the number written just before the first `label` (e.g. " shard evictions");
 * 0 when it does not occur, 1 with *value set when it does. */
int tk_log_number(const char *log, const char *label, unsigned long long *value);

/* Open a model that must open; exits with the plugin's message otherwise. */
zt_tokenizer_model *tk_open(tk_plugin *p, const char *path);

/* The message the plugin gave with host->error() since the last call (then cleared). */
const char *tk_take_error(tk_plugin *p, zt_status *status);

/* Encode text[0, len) into a malloc'ed array (*n ids); exits on failure. */
int32_t *tk_encode(tk_plugin *p, zt_tokenizer_model *m, const char *text, size_t len, uint64_t *n);
/* Decode into a malloc'ed NUL-terminated string (*len bytes); exits on failure. */
char *tk_decode(tk_plugin *p, zt_tokenizer_model *m, const int32_t *ids, uint64_t n, uint64_t *len);

/* A whole file, NUL-terminated (malloc); exits if it cannot be read. */
char *tk_read_file(const char *path, size_t *len);
/* Write bytes to path; exits on failure. */
void tk_write_file(const char *path, const void *data, size_t len);

/* A text file split at '\n' (the newline is not part of a line; a final newline ends the last
 * line rather than starting an empty one). The lines point into `data`, NUL-terminated. */
typedef struct tk_lines {
    char *data;
    size_t count;
    char **line;
    size_t *len;
} tk_lines;
void tk_read_lines(const char *path, tk_lines *out);
void tk_lines_free(tk_lines *l);

/* Space-separated decimal ids, as `spm_encode --output_format=id` prints them, in a malloc'ed
 * array of *n ids; exits on a malformed number. */
int32_t *tk_parse_ids(const char *line, size_t *n);

/* "dir/name" in a static rotating buffer (enough for a few paths alive at once). */
const char *tk_path(const char *dir, const char *name);

#endif
