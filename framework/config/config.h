/* Run configuration: a JSON file (parsed with jsmn) or a YAML file (libyaml), plus `--set a.b.c=value`
 * overrides.
 *
 * Keys are dotted paths into the JSON object ("zero_optimization.offload_optimizer.device"); a YAML
 * mapping is the same object. MindFormers' spellings in a YAML file reach zt's keys (mindformers.c).
 * Every key is owned by exactly one schema: the host's (host_options.c) or one loaded plugin's
 * zt_option table. Validation, before any plugin's init, rejects unknown keys (naming the nearest
 * valid key), DeepSpeed keys zt does not support (named as such), wrong types, out-of-range values
 * and bad enum choices, each with the file:line:column or the --set argument it came from.
 */
#ifndef ZT_FRAMEWORK_CONFIG_H
#define ZT_FRAMEWORK_CONFIG_H

#include <stdio.h>
#include "zt/zt_types.h"
#include "base/error.h"

typedef struct zt_config zt_config;

zt_config *zt_config_new(void);
void zt_config_free(zt_config *cfg);

/* Read a config from `path`: YAML when the name ends in .yaml or .yml (any case), JSON otherwise (a
 * DeepSpeed ds_config.json works as is). Syntax errors report path:line:column and what was expected.
 * Values are kept as given until validation. A YAML file is read as PyYAML reads YAML 1.1 (the
 * scalars' types, anchors, aliases and << merges; docs/config.md has the exact rules), must hold one
 * mapping, and its MindFormers spellings are rewritten to zt's keys, each value's place then naming
 * the MindFormers key ("run.yaml:12:3 (MindFormers runner_config.batch_size)"). */
zt_status zt_config_load_file(zt_config *cfg, const char *path, zt_error *err);
/* Same, from a string; `origin` names it in messages. */
zt_status zt_config_load_string(zt_config *cfg, const char *json, const char *origin, zt_error *err);
zt_status zt_config_load_yaml_string(zt_config *cfg, const char *yaml, const char *origin, zt_error *err);
/* 1 when zt_config_load_file reads `path` as YAML (.yaml, .yml). */
int zt_config_path_is_yaml(const char *path);

/* What the YAML files loaded so far gave that has no effect in zt, and why: one line each, every line
 * ending in '\n' ("run.yaml:80:3: context.device_target (MindFormers) has no effect in zt: ...");
 * "" when nothing. The command line logs them. */
const char *zt_config_notes(const zt_config *cfg);
/* A launch key of a MindFormers YAML file: run_mode, load_checkpoint, resume_training or use_parallel,
 * which are options of the command line rather than config keys (cli/mindformers.c). Its value as text
 * ("finetune", "true", "false", a path; "" for null) and its place ("run.yaml:4:18"), from the last file
 * that gives it; NULL when none does. */
const char *zt_config_launch_key(const zt_config *cfg, const char *key, const char **place);

/* Apply one "a.b.c=value" override (command line --set). The value is parsed as JSON when it is a
 * valid JSON scalar or array (3, 1e-4, true, [0.9,0.95], "x"), else taken as a string (cpu).
 * Overrides win over the file regardless of order. For a STRING/ENUM key any value is taken as
 * text (--set output_dir=2024 is the string "2024"). JSON null means "not set". */
zt_status zt_config_set(zt_config *cfg, const char *assignment, zt_error *err);

/* Values the host decides and records in the run's config: the --output-dir, --data and
 * --gpu-mem-limit options, the plugins --plugins names (optimizer.type, zero_optimization.stage), the
 * model's shape from --model DIR/config.json, the data set's vocabulary. Each is a given value like
 * one from a file, checked against its schema like any other, and `origin` says where it came from in
 * messages and in the resolved config's _sources ("--model out/config.json", "--plugins").
 * rank ZT_CONFIG_RANK_FILE: a --set of the key still wins over it; ZT_CONFIG_RANK_SET: it counts as
 * a --set (a command-line option that stands for one). */
enum { ZT_CONFIG_RANK_FILE = 0, ZT_CONFIG_RANK_SET = 1 };
zt_status zt_config_put_string(zt_config *cfg, const char *key, const char *value, const char *origin, int rank,
                               zt_error *err);
zt_status zt_config_put_int(zt_config *cfg, const char *key, int64_t value, const char *origin, int rank,
                            zt_error *err);
zt_status zt_config_put_float(zt_config *cfg, const char *key, double value, const char *origin, int rank,
                              zt_error *err);
zt_status zt_config_put_bool(zt_config *cfg, const char *key, int32_t value, const char *origin, int rank,
                             zt_error *err);

/* Take back every value put with `origin` (the estimator's other configurations): each key has its
 * earlier value again. The config must be validated again before it is read. */
void zt_config_drop_puts(zt_config *cfg, const char *origin);

/* Declare the keys `owner` ("host" or a plugin name) understands. A key declared by two owners is an
 * error naming both. The table must outlive cfg. */
zt_status zt_config_add_schema(zt_config *cfg, const char *owner, const zt_option *opts,
                               uint32_t n, zt_error *err);

/* Check every given key and value against the schemas. On failure the message lists each problem
 * (all of them, not just the first), one per line. */
zt_status zt_config_validate(zt_config *cfg, zt_error *err);

/* Typed access to a validated config: the given value, else the schema default. ZT_ERR_NOT_FOUND
 * for an undeclared key, or for a ZT_OPT_NO_DEFAULT key that was not given; ZT_ERR_CONFIG for a
 * value that fails its schema; ZT_ERR_INVALID_ARG for a getter of the wrong type. Getters work
 * before zt_config_validate (values are checked as schemas arrive), so the host can read its own
 * keys before plugins are loaded. Strings live as long as cfg. */
zt_status zt_config_get_bool(const zt_config *cfg, const char *key, int32_t *out);
zt_status zt_config_get_int(const zt_config *cfg, const char *key, int64_t *out);
zt_status zt_config_get_float(const zt_config *cfg, const char *key, double *out);
zt_status zt_config_get_string(const zt_config *cfg, const char *key, const char **out);
zt_status zt_config_get_floats(const zt_config *cfg, const char *key, double *out, int32_t cap,
                               int32_t *n);
/* 1 when the user gave the key (file or --set), 0 when it comes from the default. */
int zt_config_is_set(const zt_config *cfg, const char *key);

/* Write the fully resolved config as a JSON object: every declared key with its value, plus a
 * "_sources" object (key -> "default" | "file:PATH:LINE" | "file:PATH:LINE (MindFormers KEY)" | "--set"
 * | the origin of a value the host put) and the "_plugins" JSON text
 * given by the caller (name, kind, version, path of each loaded plugin; may be NULL). */
zt_status zt_config_write_resolved(const zt_config *cfg, FILE *out, const char *plugins_json,
                                   zt_error *err);
/* Same, atomically to a file (temp file + rename). */
zt_status zt_config_save_resolved(const zt_config *cfg, const char *path, const char *plugins_json,
                                  zt_error *err);

/* The host's own keys (train_micro_batch_size_per_gpu, gradient_accumulation_steps,
 * zero_optimization.stage, ...), documented in docs/config.md. */
const zt_option *zt_host_options(uint32_t *n);

/* Levenshtein-nearest declared key to `key`, or NULL when none is close. */
const char *zt_config_nearest_key(const zt_config *cfg, const char *key);

/* A byte size as ZT_OPT_BYTES values are written ("512M", "24GiB", "100MB", "4096"): K/M/G/T and
 * KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000. 1 when `text` is one. Also for
 * byte sizes that come from the environment (ZT_HOST_MEM_AVAILABLE). */
int zt_config_parse_bytes(const char *text, int64_t *out);

#endif
