/* Private to framework/cli/: what zt-run's actions share (zt-run itself is cli/main.c).
 *
 *   main.c     the options, --help, parsing, and which action runs
 *   isolate.c  running plugin code in a forked child (probe, init, fini for the inspecting actions)
 *   run.c      what --check and training share: the run's config, plugins and runtime
 *   inspect.c  --list-plugins, --env (with env.c, the machine) and --describe
 *   check.c    --check
 *   train.c    training and --dry-run (the loop itself is framework/train/)
 *   mindformers.c  MindFormers' launcher flags and a YAML config's launch keys, as zt-run's options
 *   compare.c  --compare: every combination of some keys' values trained in a child zt-run each
 *   compare_table.c  --compare's table: the children's estimates and metrics, compare.json and compare.md
 */
#ifndef ZT_FRAMEWORK_CLI_H
#define ZT_FRAMEWORK_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "config/config.h"
#include "config/settings.h"
#include "generate/generate.h"
#include "host/registry.h"
#include "host/runtime.h"

enum { ZT_EXIT_OK = 0, ZT_EXIT_ERROR = 1, ZT_EXIT_USAGE = 2, ZT_EXIT_INTERRUPTED = 130 };

enum option_id {
    OPT_HELP, OPT_VERSION, OPT_LIST_PLUGINS, OPT_DESCRIBE, OPT_ENV, OPT_CHECK, OPT_FLIGHT_RECORDER,
    OPT_PLUGIN_PATH, OPT_PLUGINS, OPT_CONFIG, OPT_SET, OPT_OUTPUT_DIR,
    OPT_DATA, OPT_MODEL, OPT_RESUME, OPT_EXPORT, OPT_EXPORT_DTYPE, OPT_EXPORT_SHARD_SIZE, OPT_ADAPTER,
    OPT_EXPORT_ADAPTER, OPT_NPROC,
    OPT_NNODES, OPT_NPROC_PER_NODE, OPT_NODE_RANK, OPT_MASTER_ADDR, OPT_MASTER_PORT, /* torchrun's flags */
    OPT_DRY_RUN, OPT_GPU_MEM_LIMIT, OPT_COMPARE, OPT_COMPARE_STEPS, OPT_COMPARE_WARMUP,
    OPT_GENERATE, OPT_TOKENIZER, OPT_PROMPT, OPT_INPUT, OPT_PROMPT_IDS, OPT_TEMPLATE, OPT_RAW, OPT_MAX_NEW_TOKENS,
    OPT_TEMPERATURE, OPT_TOP_K, OPT_TOP_P, OPT_STOP, OPT_SEED, OPT_PROMPTS, OPT_OUTPUT, OPT_STATS, OPT_PRINT_IDS,
    /* MindFormers' launcher flags (mindformers.c) */
    OPT_MF_USE_PARALLEL, OPT_MF_DEVICE_NUM, OPT_MF_RUN_MODE, OPT_MF_LOAD_CHECKPOINT,
    N_OPTIONS
};

typedef struct run_args {
    int action; /* OPT_LIST_PLUGINS, OPT_DESCRIBE, OPT_ENV, OPT_CHECK, OPT_FLIGHT_RECORDER, or -1 for none */
    const char *describe_name;
    const char *flight_dir; /* --flight-recorder DIR */
    const char **plugin_paths;
    int n_plugin_paths;
    const char *plugins;
    const char *config_path;
    const char **sets;
    int n_sets;
    const char *output_dir;
    const char *data, *model, *resume, *export_dir, *nproc, *gpu_mem_limit; /* training */
    int export_dtype;           /* --export-dtype: ZT_ST_F32, BF16, F16, or -1 for auto */
    uint64_t export_shard_bytes; /* --export-shard-size; 0: transformers' 5 GB */
    const char *adapter, *export_adapter_dir; /* LoRA (docs/lora.md) */
    /* torchrun's flags (training); with --dry-run, nproc becomes their world size */
    const char *nnodes, *nproc_per_node, *node_rank, *master_addr, *master_port;
    char world_text[16];
    int dry_run;
    const char **compares;   /* --compare KEY=V1,V2 as given (compare.c reads them) */
    int n_compares;
    const char *compare_steps, *compare_warmup;
    zt_generate_options gen; /* --generate */
    int probe_timeout_s;
    struct {                 /* MindFormers' launcher flags as typed (mindformers.c) */
        const char *use_parallel, *device_num, *run_mode, *load_checkpoint;
    } mf;
} run_args;

/* "zt-run: error: ..." and the pointer to --help; returns ZT_EXIT_USAGE. */
int zt_cli_usage_error(const char *fmt, ...) ZT_PRINTF(1, 2);
/* "zt-run: error: <message>"; returns ZT_EXIT_ERROR. */
int zt_cli_run_error(const zt_error *err);

/* "cpu,cuda,bf16": the ZT_CAP_* flags by name. */
void zt_cli_format_caps(uint64_t caps, char *buf, size_t cap);

/* ---- isolate.c ------------------------------------------------------------------------------------ */

/* What a child reported. The child writes "key<TAB>value" lines as it goes (flushed, so they
 * survive a crash), and last "status<TAB>N" followed by the message up to the end. */
typedef struct child_result {
    int completed;        /* the child reported a final status */
    zt_status status;
    char message[ZT_ERROR_MSG_MAX];
    char call[192];       /* the last plugin call it announced: "probe() of plugin 'x'" */
    char library[4096];   /* and that plugin's library */
    char version[64];
    char description[256];
    char caps[512];
    int abi_major, abi_minor;
    int64_t model_hidden; /* the initialized model's hidden size (--check), 0 when not told */
    int term_signal;      /* the signal that killed it, 0 if none */
    int exit_code;
    int timed_out;
} child_result;

typedef void (*child_body)(void *arg, FILE *report);

/* Reports from the child: facts as they are learnt, the plugin call it is about to make, and its
 * final status (with the message). */
void zt_child_report_line(FILE *report, const char *key, const char *value);
void zt_child_report_call(FILE *report, const char *call, const zt_loaded_plugin *lp);
void zt_child_report_final(FILE *report, zt_status status, const char *message);

/* Run body(arg, report) in a forked child and collect what it reported. quiet: the child's
 * stdout and stderr go to /dev/null (listing); else its output goes to our stderr, so plugin log
 * lines and a C++ runtime's "terminate called after throwing..." reach the user while our stdout
 * stays clean. timeout_s 0: wait as long as it takes. */
void zt_run_isolated(child_body body, void *arg, int quiet, int timeout_s, child_result *r);

/* Why a child did not report success, as one message: a crash, a hang, or the plugin's error.
 * fallback_call names what the child was doing if it died before announcing a plugin call. */
void zt_child_failure(const child_result *r, const char *fallback_call, int timeout_s, zt_error *err);

/* ---- run.c ---------------------------------------------------------------------------------------- */

/* The run's config as the command line gives it: the host's schema, --config, every --set, and the
 * options that stand for keys (--output-dir, and for training --data and --gpu-mem-limit). */
zt_status zt_cli_load_config(const run_args *a, int training, zt_config *cfg, zt_error *err);

/* The run's plugins: the registry scanned, the plugins resolved (host/select.c) and their choices
 * recorded in cfg. */
zt_status zt_cli_resolve_plugins(const run_args *a, zt_config *cfg, zt_registry **reg, zt_plugin_set *set,
                                 zt_error *err);
/* Every plugin's schema, added to cfg (before it is validated). */
zt_status zt_cli_add_schemas(zt_config *cfg, const zt_plugin_set *set, zt_error *err);

/* A runtime for the run: settings NULL (listing, probing) is a CPU runtime with the host's default
 * settings; otherwise the device the settings and the plugins decide (zt_select_device), the
 * settings' GPU memory cap and collective timeout. in_child: a child forked to inspect plugins,
 * which is one process even when zt-run is a rank. */
zt_status zt_cli_create_runtime(const zt_config *cfg, const zt_host_settings *settings, const zt_plugin_set *set,
                                int n_threads, int in_child, zt_runtime **rt, zt_error *err);

/* The ranks the run has or is checked for: --nproc (which a dry run and --check take as the rank count,
 * as they do torchrun's flags), else the launch's (mpirun, srun, zt-run's own ranks), else 1. */
int64_t zt_cli_world_size(const run_args *a);

/* The host's settings of a validated config, after DeepSpeed's batch rule has derived what the config
 * leaves to it over the data-parallel size of `world_size` ranks (config/deepspeed.h). */
zt_status zt_cli_settings(zt_config *cfg, int64_t world_size, zt_host_settings *settings, zt_error *err);

/* The hidden size of the set's model plugin once it is initialized (0 before). */
int64_t zt_cli_model_hidden(const zt_plugin_set *set);
/* The Hugging Face Trainer's "auto"s of the model's size (config/deepspeed.h), then validated again. */
zt_status zt_cli_model_autos(zt_config *cfg, const char *model_name, int64_t hidden, zt_error *err);
/* Rank 0 logs what the config's DeepSpeed keys mean in zt (zt_ds_describe), one "zt info:" line each. */
void zt_cli_log_deepspeed_notes(const zt_config *cfg);

/* "_plugins" of the resolved config: [{"name", "kind", "version", "abi", "path"}, ...]; NULL when out
 * of memory. The caller frees it. */
char *zt_cli_plugins_json(const zt_plugin_set *set);

/* ---- mindformers.c --------------------------------------------------------------------------------- */

/* MindFormers' launcher flags (a->mf) and the launch keys of a YAML --config (run_mode, load_checkpoint,
 * resume_training, use_parallel) turned into zt-run's own options: --device_num N with use_parallel is
 * --nproc N, --run_mode predict is --generate, load_checkpoint is --model or --resume by what the path
 * holds. Called by the parser before it checks which options go with which action; `given` marks the
 * options given (an option this turns into another is unmarked). Returns -1 when fine, else the exit
 * status (after the message). */
int zt_cli_mindformers(run_args *a, int *given);

/* ---- the actions ------------------------------------------------------------------------------------- */

int zt_cli_list_plugins(const run_args *a, int with_env); /* inspect.c */
int zt_cli_describe(const run_args *a);                   /* inspect.c */
int zt_cli_check(const run_args *a);                      /* check.c */
int zt_cli_train(const run_args *a);                      /* train.c */
int zt_cli_compare(const run_args *a);                    /* compare.c */

#endif
