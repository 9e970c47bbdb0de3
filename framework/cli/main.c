/* zt-run: the zt command line (docs/cli.md). This file holds its options, --help, the parsing and
 * which action runs; cli.h lists the files of the actions.
 *
 * Exit status: 0 success, 1 a runtime, config or plugin error, 2 a usage error, 130 training stopped
 * by Ctrl-C (after saving a checkpoint).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"
#include "base/log.h"
#include "cli/cli.h"
#include "dist/flight.h"
#include "dist/job.h"
#include "dist/launch.h"
#include "generate/generate.h"
#include "state/hf_export.h"

#ifndef ZT_VERSION
#error "ZT_VERSION must be defined (framework/CMakeLists.txt)"
#endif

/* A probe is cheap by contract (ABI: "cheap, no side effects"); one that takes longer than this is
 * hung. Initializing the CUDA driver takes a few seconds on a large machine, hence the margin;
 * $ZT_PROBE_TIMEOUT overrides it. */
#define DEFAULT_PROBE_TIMEOUT_S 60

/* ---- command line ----------------------------------------------------------------------------- */

static const zt_cli_option options[N_OPTIONS] = {
    [OPT_HELP] = {"--help", "-h", NULL, "show this help and exit"},
    [OPT_VERSION] = {"--version", NULL, NULL, "print the zt version and the plugin ABI version, and exit"},
    [OPT_LIST_PLUGINS] = {"--list-plugins", NULL, NULL,
                          "list installed plugins and whether each can run on this machine"},
    [OPT_DESCRIBE] = {"--describe", NULL, "NAME", "show one plugin: kind, version, ABI, and every option it accepts"},
    [OPT_ENV] = {"--env", NULL, NULL, "show this machine: CPU, memory, GPUs, CUDA/NCCL/MPI versions, plugins"},
    [OPT_CHECK] = {"--check", NULL, NULL,
                   "load, probe and initialize the run's plugins, validate the config, print it resolved"},
    [OPT_FLIGHT_RECORDER] = {"--flight-recorder", NULL, "DIR",
                             "read the ranks' flight recorder dumps in DIR and say which rank was behind, in "
                             "which collective (docs/distributed.md)"},
    [OPT_PLUGIN_PATH] = {"--plugin-path", NULL, "DIR",
                         "search DIR first for NAME.plugin descriptors (repeatable; DIR may be a:b:c)"},
    [OPT_PLUGINS] = {"--plugins", NULL, "LIST",
                     "plugins to use, comma-separated: names, .plugin or .so paths (e.g. llama,zero3,flash)"},
    [OPT_CONFIG] = {"--config", NULL, "FILE", "JSON run configuration (a DeepSpeed ds_config.json works)"},
    [OPT_SET] = {"--set", NULL, "KEY=VALUE", "override one config key, e.g. --set zero_optimization.stage=2 (repeatable)"},
    [OPT_OUTPUT_DIR] = {"--output-dir", NULL, "DIR",
                        "where the run writes its files, config.resolved.json first (same as --set output_dir=DIR)"},
    /* training only (framework/train/trainer.c) */
    [OPT_DATA] = {"--data", NULL, "DIR", "train on this zt-prep data set (same as --set data.path=DIR)"},
    [OPT_MODEL] = {"--model", NULL, "DIR", "fine-tune the Hugging Face LLaMA model in DIR (config.json + safetensors)"},
    [OPT_RESUME] = {"--resume", NULL, "DIR|latest", "continue from a checkpoint: its directory, or the newest in checkpoint.dir"},
    [OPT_EXPORT] = {"--export", NULL, "DIR",
                    "after training, write the model to DIR as transformers loads it (weights, configs, tokenizer)"},
    [OPT_EXPORT_DTYPE] = {"--export-dtype", NULL, "fp32|bf16|fp16|auto",
                          "the export's dtype (auto: the --model's, else bf16; docs/export.md)"},
    [OPT_EXPORT_SHARD_SIZE] = {"--export-shard-size", NULL, "SIZE",
                               "the export's largest weight file, as transformers' max_shard_size (5GB, 2GiB, ...)"},
    [OPT_ADAPTER] = {"--adapter", NULL, "DIR",
                     "start the adapter from a peft adapter directory (adapter_model.safetensors; with --plugins ...,lora)"},
    [OPT_EXPORT_ADAPTER] = {"--export-adapter", NULL, "DIR",
                            "after training, write the adapter to DIR as peft writes it (adapter_config.json, "
                            "adapter_model.safetensors)"},
    [OPT_NPROC] = {"--nproc", NULL, "N",
                   "train with N ranks on this machine (GPU runs: one rank per GPU over NCCL; CPU runs: "
                   "through mpirun; docs/distributed.md)"},
    /* torchrun's flags (also as --nproc_per_node, --node_rank, --master_addr, --master_port) */
    [OPT_NNODES] = {"--nnodes", NULL, "N", "torchrun-style: the job spans N machines, each running zt-run (1)"},
    [OPT_NPROC_PER_NODE] = {"--nproc-per-node", NULL, "P",
                            "torchrun-style: P ranks on this machine (1); --nnodes 1 --nproc-per-node P is --nproc P"},
    [OPT_NODE_RANK] = {"--node-rank", NULL, "R", "torchrun-style: this machine is R of 0..N-1; its ranks are R*P.. (0)"},
    [OPT_MASTER_ADDR] = {"--master-addr", NULL, "HOST",
                         "torchrun-style: where rank 0 (machine 0) is reached; needed with --nnodes above 1"},
    [OPT_MASTER_PORT] = {"--master-port", NULL, "PORT",
                         "torchrun-style: the port GPU ranks meet rank 0 on (29500); CPU ranks: docs/distributed.md"},
    [OPT_DRY_RUN] = {"--dry-run", NULL, NULL,
                     "print the memory per rank by pool for this run and every other ZeRO stage and offload choice, "
                     "then exit without training (docs/zero.md)"},
    [OPT_GPU_MEM_LIMIT] = {"--gpu-mem-limit", NULL, "SIZE",
                           "cap the GPU memory zt allocates per device, e.g. 24G (same as --set gpu_mem_limit=SIZE)"},
    /* training several configurations side by side (cli/compare.c, docs/compare.md) */
    [OPT_COMPARE] = {"--compare", NULL, "KEY=V1,V2",
                     "train every combination of these values (repeatable: one KEY each) a few steps each, "
                     "in a child zt-run each, and write RUN_DIR/compare.md and compare.json"},
    [OPT_COMPARE_STEPS] = {"--compare-steps", NULL, "N", "--compare: the timed steps of each combination (5)"},
    [OPT_COMPARE_WARMUP] = {"--compare-warmup", NULL, "N", "--compare: the steps before them, not timed (2)"},
    /* generation only (framework/generate/generate.c); --model, --resume, --data, --plugins and --set apply too */
    [OPT_GENERATE] = {"--generate", NULL, NULL, "generate text from --model DIR|FILE.bin or --resume CKPT (docs/generate.md)"},
    [OPT_TOKENIZER] = {"--tokenizer", "-t", "FILE", "generation: tokenizer model (default: the data set's, or MODEL/tokenizer.model)"},
    [OPT_PROMPT] = {"--prompt", NULL, "TEXT", "generation: the instruction (with --raw: the text to continue)"},
    [OPT_INPUT] = {"--input", NULL, "TEXT", "generation: the template's input field (context for the instruction)"},
    [OPT_PROMPT_IDS] = {"--prompt-ids", NULL, "IDS", "generation: the prompt as token ids, e.g. 1,450,4996, used as they are"},
    [OPT_TEMPLATE] = {"--template", NULL, "NAME|FILE", "generation: prompt template (default: the data set's, else alpaca)"},
    [OPT_RAW] = {"--raw", NULL, NULL, "generation: no template; continue the --prompt text"},
    [OPT_MAX_NEW_TOKENS] = {"--max-new-tokens", NULL, "N", "generation: stop after N new tokens (128)"},
    [OPT_TEMPERATURE] = {"--temperature", NULL, "T", "generation: 0 for greedy (default), else sample softmax(logits / T)"},
    [OPT_TOP_K] = {"--top-k", NULL, "K", "generation: sample among the K most likely tokens (0: all, the default)"},
    [OPT_TOP_P] = {"--top-p", NULL, "P", "generation: sample among the most likely tokens holding probability P (1)"},
    [OPT_STOP] = {"--stop", NULL, "TEXT", "generation: end the answer before TEXT (repeatable; TEXT is not written)"},
    [OPT_SEED] = {"--seed", NULL, "S", "generation: sampling seed (default: the config key seed)"},
    [OPT_PROMPTS] = {"--prompts", NULL, "FILE", "generation: answer every record of FILE.json|.jsonl (Alpaca or {\"prompt\": ...})"},
    [OPT_OUTPUT] = {"--output", NULL, "FILE", "generation with --prompts: one JSON line per record, in input order"},
    [OPT_STATS] = {"--stats", NULL, "FILE",
                   "generation: write its figures (tokens/s, time to first token, memory by pool) as JSON"},
    [OPT_PRINT_IDS] = {"--print-ids", NULL, NULL, "generation: write the generated token ids instead of text"},
    /* MindFormers compatibility (run_mindformer.py's flags; cli/mindformers.c, docs/cli.md) */
    [OPT_MF_USE_PARALLEL] = {"--use_parallel", NULL, "True|False", "MindFormers: with --device_num N, train on N ranks (zt: --nproc N)"},
    [OPT_MF_DEVICE_NUM] = {"--device_num", NULL, "N", "MindFormers: the number of ranks (zt: --nproc N)"},
    [OPT_MF_RUN_MODE] = {"--run_mode", NULL, "MODE", "MindFormers: train or finetune (zt: train), predict (zt: --generate)"},
    [OPT_MF_LOAD_CHECKPOINT] = {"--load_checkpoint", NULL, "PATH",
                                "MindFormers: the weights to start from: an HF model directory (zt: --model) or a zt "
                                "checkpoint (zt: --resume)"},
};

static void print_help(FILE *f)
{
    fprintf(f,
            "zt-run %s: fine-tune LLMs with zt's plugins (tokenizer, model, optimizer, zero, attention, parallel)\n"
            "\n"
            "Usage:\n"
            "  zt-run --list-plugins [--plugin-path DIR]\n"
            "  zt-run --describe NAME [--plugin-path DIR]\n"
            "  zt-run --env [--plugin-path DIR]\n"
            "  zt-run --check [--plugins LIST] [--config FILE] [--set KEY=VALUE]... [--output-dir DIR]\n"
            "  zt-run --flight-recorder DIR\n"
            "  zt-run [--plugins LIST] [--config FILE] [--set KEY=VALUE]... [--output-dir DIR] [--data DIR]\n"
            "         [--model DIR] [--resume DIR|latest] [--export DIR] [--nproc N]   (train; docs/training.md)\n"
            "         [--export-dtype fp32|bf16|fp16|auto] [--export-shard-size SIZE]   (docs/export.md)\n"
            "         [--nnodes N --nproc-per-node P --node-rank R --master-addr HOST --master-port PORT]\n"
            "         [--dry-run] [--gpu-mem-limit SIZE]\n"
            "  zt-run --compare KEY=V1,V2[,...] [--compare KEY2=...]... [--compare-steps N] [--compare-warmup N]\n"
            "         <the training options>              (a table of every combination; docs/compare.md)\n"
            "  zt-run --generate --model DIR|FILE.bin|--resume CKPT [-t FILE] [--data DIR] --prompt TEXT\n"
            "         [--input TEXT] [--template NAME|FILE|--raw] [--max-new-tokens N] [--temperature T]\n"
            "         [--top-k K] [--top-p P] [--stop TEXT]... [--seed S]      (generate; docs/generate.md)\n"
            "\n"
            "Options:\n",
            ZT_VERSION);
    zt_cli_print_options(f, options, N_OPTIONS);
    fprintf(f,
            "\n"
            "Exit status: 0 success, 1 runtime, config or plugin error, 2 usage error.\n"
            "Training exits with 130 after Ctrl-C, once it has saved a checkpoint.\n"
            "Plugin search path, config keys and more: docs/cli.md, docs/plugins.md, docs/config.md.\n");
}

int zt_cli_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("zt-run: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nRun zt-run --help for usage.\n", stderr);
    return ZT_EXIT_USAGE;
}

int zt_cli_run_error(const zt_error *err)
{
    /* A rank of a job says which one it is: the launcher merges every rank's output. */
    if (zt_log_rank() >= 0) fprintf(stderr, "zt[rank %d] error: %s\n", zt_log_rank(), err->msg);
    else fprintf(stderr, "zt-run: error: %s\n", err->msg);
    return ZT_EXIT_ERROR;
}

/* ---- torchrun's spellings --------------------------------------------------------------------- */

/* torchrun's older underscore spellings, which torchrun still takes: read as the current ones. */
static const char *const k_torchrun_spellings[][2] = {{"--nproc_per_node", "--nproc-per-node"},
                                                      {"--node_rank", "--node-rank"},
                                                      {"--master_addr", "--master-addr"},
                                                      {"--master_port", "--master-port"}};

/* Whether the option argument `arg` ("--name" or "--name=value") takes the next argument as its value. */
static int takes_next_argument(const char *arg)
{
    if (strncmp(arg, "--", 2) == 0 && strchr(arg, '=')) return 0;
    for (int i = 0; i < N_OPTIONS; i++)
        if (strcmp(arg, options[i].name) == 0 || (options[i].short_name && strcmp(arg, options[i].short_name) == 0))
            return options[i].value_name != NULL;
    return 0;
}

/* argv with torchrun's underscore spellings in option places replaced by the current ones
 * ("--nproc_per_node=2" becomes "--nproc-per-node" "2"), in *out (malloc'ed, *out_argc entries, the
 * strings argv's or constants). The launch strips both spellings from the ranks' command line. */
static int respell_torchrun_flags(int argc, char **argv, char ***out, int *out_argc)
{
    char **v = calloc((size_t)(2 * argc + 1), sizeof *v);
    if (!v) return 0;
    int n = 0;
    for (int i = 0; i < argc; i++) {
        char *arg = argv[i];
        for (size_t k = 0; i > 0 && k < sizeof k_torchrun_spellings / sizeof k_torchrun_spellings[0]; k++) {
            size_t len = strlen(k_torchrun_spellings[k][0]);
            if (strncmp(arg, k_torchrun_spellings[k][0], len) != 0 || (arg[len] && arg[len] != '=')) continue;
            v[n++] = (char *)k_torchrun_spellings[k][1];
            arg = arg[len] == '=' ? arg + len + 1 : NULL; /* the value, when given as --name=value */
            break;
        }
        if (arg != argv[i]) {
            if (arg) v[n++] = arg;
            else if (i + 1 < argc) v[n++] = argv[++i];
            continue;
        }
        v[n++] = arg;
        if (i > 0 && takes_next_argument(arg) && i + 1 < argc) v[n++] = argv[++i];
    }
    *out = v;
    *out_argc = n;
    return 1;
}

/* Fills *a from argv; returns -1 when fine, else the exit status (help, version, usage error). */
static int parse_args(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    a->action = -1;
    a->export_dtype = -1;
    zt_cli_arg *args;
    int n;
    zt_error err;
    char **spelled;
    int n_spelled;
    if (!respell_torchrun_flags(argc, argv, &spelled, &n_spelled)) {
        fprintf(stderr, "zt-run: error: out of memory\n");
        return ZT_EXIT_ERROR;
    }
    zt_status parsed = zt_cli_parse(options, N_OPTIONS, n_spelled, spelled, &args, &n, &err);
    free(spelled); /* the values point into argv or at constants */
    if (parsed != ZT_OK)
        return zt_cli_usage_error("%s", err.msg);
    /* --help and --version win over everything else, as with most tools. */
    for (int i = 0; i < n; i++) {
        if (args[i].option == OPT_HELP) {
            free(args);
            print_help(stdout);
            return ZT_EXIT_OK;
        }
    }
    for (int i = 0; i < n; i++) {
        if (args[i].option == OPT_VERSION) {
            free(args);
            printf("zt-run %s (zt plugin ABI %u.%u)\n", ZT_VERSION, ZT_ABI_MAJOR, ZT_ABI_MINOR);
            return ZT_EXIT_OK;
        }
    }
    a->plugin_paths = calloc((size_t)n + 1, sizeof *a->plugin_paths);
    a->sets = calloc((size_t)n + 1, sizeof *a->sets);
    a->compares = calloc((size_t)n + 1, sizeof *a->compares);
    a->gen.stops = calloc((size_t)n + 1, sizeof *a->gen.stops);
    if (!a->plugin_paths || !a->sets || !a->compares || !a->gen.stops) {
        free(args);
        fprintf(stderr, "zt-run: error: out of memory\n");
        return ZT_EXIT_ERROR;
    }
    int status = -1;
    int given[N_OPTIONS] = {0};
    for (int i = 0; i < n && status < 0; i++) {
        int o = args[i].option;
        const char *v = args[i].value;
        if (o != OPT_PLUGIN_PATH && o != OPT_SET && o != OPT_COMPARE && o != OPT_STOP && given[o]) {
            status = zt_cli_usage_error("%s is given twice; give it once", options[o].name);
            break;
        }
        given[o] = 1;
        switch (o) {
        case OPT_LIST_PLUGINS:
        case OPT_DESCRIBE:
        case OPT_ENV:
        case OPT_CHECK:
        case OPT_FLIGHT_RECORDER:
        case OPT_GENERATE:
            if (a->action >= 0) {
                status = zt_cli_usage_error("%s and %s are separate actions; give one of them",
                                     options[a->action].name, options[o].name);
                break;
            }
            a->action = o;
            if (o == OPT_DESCRIBE) a->describe_name = v;
            if (o == OPT_FLIGHT_RECORDER) a->flight_dir = v;
            break;
        case OPT_PLUGIN_PATH: a->plugin_paths[a->n_plugin_paths++] = v; break;
        case OPT_PLUGINS: a->plugins = v; break;
        case OPT_CONFIG: a->config_path = v; break;
        case OPT_SET:
            if (!strchr(v, '=') || v[0] == '=')
                status = zt_cli_usage_error("--set '%s': expected KEY=VALUE, e.g. --set zero_optimization.stage=2", v);
            a->sets[a->n_sets++] = v;
            break;
        case OPT_OUTPUT_DIR: a->output_dir = v; break;
        case OPT_DATA: a->data = v; break;
        case OPT_MODEL: a->model = v; break;
        case OPT_RESUME: a->resume = v; break;
        case OPT_EXPORT: a->export_dir = v; break;
        case OPT_EXPORT_DTYPE:
            if (zt_hf_parse_dtype(v, "--export-dtype", &a->export_dtype, &err) != ZT_OK)
                status = zt_cli_usage_error("%s", err.msg);
            break;
        case OPT_EXPORT_SHARD_SIZE:
            if (zt_hf_parse_shard_size(v, "--export-shard-size", &a->export_shard_bytes, &err) != ZT_OK)
                status = zt_cli_usage_error("%s", err.msg);
            break;
        case OPT_ADAPTER: a->adapter = v; break;
        case OPT_EXPORT_ADAPTER: a->export_adapter_dir = v; break;
        case OPT_NPROC: a->nproc = v; break;
        case OPT_NNODES: a->nnodes = v; break;
        case OPT_NPROC_PER_NODE: a->nproc_per_node = v; break;
        case OPT_NODE_RANK: a->node_rank = v; break;
        case OPT_MASTER_ADDR: a->master_addr = v; break;
        case OPT_MASTER_PORT: a->master_port = v; break;
        case OPT_DRY_RUN: a->dry_run = 1; break;
        case OPT_GPU_MEM_LIMIT: a->gpu_mem_limit = v; break;
        case OPT_COMPARE: a->compares[a->n_compares++] = v; break;
        case OPT_COMPARE_STEPS: a->compare_steps = v; break;
        case OPT_COMPARE_WARMUP: a->compare_warmup = v; break;
        case OPT_TOKENIZER: a->gen.tokenizer = v; break;
        case OPT_PROMPT: a->gen.prompt = v; break;
        case OPT_INPUT: a->gen.input = v; break;
        case OPT_PROMPT_IDS: a->gen.prompt_ids = v; break;
        case OPT_TEMPLATE: a->gen.template_name = v; break;
        case OPT_RAW: a->gen.raw = 1; break;
        case OPT_MAX_NEW_TOKENS: a->gen.max_new_tokens = v; break;
        case OPT_TEMPERATURE: a->gen.temperature = v; break;
        case OPT_TOP_K: a->gen.top_k = v; break;
        case OPT_TOP_P: a->gen.top_p = v; break;
        case OPT_STOP: a->gen.stops[a->gen.n_stops++] = v; break;
        case OPT_SEED: a->gen.seed = v; break;
        case OPT_PRINT_IDS: a->gen.print_ids = 1; break;
        case OPT_PROMPTS: a->gen.prompts = v; break;
        case OPT_OUTPUT: a->gen.output = v; break;
        case OPT_STATS: a->gen.stats = v; break;
        case OPT_MF_USE_PARALLEL: a->mf.use_parallel = v; break;
        case OPT_MF_DEVICE_NUM: a->mf.device_num = v; break;
        case OPT_MF_RUN_MODE: a->mf.run_mode = v; break;
        case OPT_MF_LOAD_CHECKPOINT: a->mf.load_checkpoint = v; break;
        }
    }
    /* MindFormers' flags become zt's options before the checks of which options go together. */
    if (status < 0) status = zt_cli_mindformers(a, given);
    /* Options only --check (the run) reads: silently ignoring them elsewhere would hide mistakes. */
    static const int run_only[] = {OPT_PLUGINS, OPT_CONFIG, OPT_SET, OPT_OUTPUT_DIR};
    for (size_t i = 0; i < sizeof run_only / sizeof run_only[0] && status < 0; i++)
        if (given[run_only[i]] && a->action >= 0 && a->action != OPT_CHECK &&
            !(a->action == OPT_GENERATE && (run_only[i] == OPT_PLUGINS || run_only[i] == OPT_SET)))
            status = zt_cli_usage_error("%s has no effect with %s", options[run_only[i]].name, options[a->action].name);
    static const int train_only[] = {OPT_DATA, OPT_MODEL, OPT_RESUME, OPT_EXPORT, OPT_EXPORT_DTYPE,
                                     OPT_EXPORT_SHARD_SIZE, OPT_ADAPTER, OPT_EXPORT_ADAPTER, OPT_NPROC, OPT_NNODES,
                                     OPT_NPROC_PER_NODE, OPT_NODE_RANK, OPT_MASTER_ADDR, OPT_MASTER_PORT,
                                     OPT_DRY_RUN, OPT_GPU_MEM_LIMIT, OPT_COMPARE};
    /* --check takes the rank count (--nproc, torchrun's flags) that DeepSpeed's batch rule divides by */
    for (size_t i = 0; i < sizeof train_only / sizeof train_only[0] && status < 0; i++)
        if (given[train_only[i]] && a->action >= 0 &&
            !(a->action == OPT_CHECK && train_only[i] >= OPT_NPROC && train_only[i] <= OPT_MASTER_PORT) &&
            !(a->action == OPT_GENERATE && (train_only[i] == OPT_DATA || train_only[i] == OPT_MODEL ||
                                            train_only[i] == OPT_RESUME || train_only[i] == OPT_ADAPTER)))
            status = zt_cli_usage_error("%s is for training and has no effect with %s", options[train_only[i]].name,
                                 options[a->action].name);
    for (int o = OPT_COMPARE_STEPS; o <= OPT_COMPARE_WARMUP && status < 0; o++)
        if (given[o] && !given[OPT_COMPARE])
            status = zt_cli_usage_error("%s goes with --compare KEY=V1,V2 (docs/compare.md)", options[o].name);
    for (int o = OPT_EXPORT_DTYPE; o <= OPT_EXPORT_SHARD_SIZE && status < 0; o++)
        if (given[o] && !given[OPT_EXPORT] && a->action < 0)
            status = zt_cli_usage_error("%s sets how --export writes the model; add --export DIR", options[o].name);
    for (int o = OPT_TOKENIZER; o <= OPT_PRINT_IDS && status < 0; o++)
        if (given[o] && a->action != OPT_GENERATE)
            status = zt_cli_usage_error("%s is for generation: add --generate (docs/generate.md)", options[o].name);
    free(args);
    if (status >= 0) return status;
    if (a->nnodes || a->nproc_per_node || a->node_rank || a->master_addr || a->master_port) {
        /* torchrun's flags are checked before anything starts; a dry run estimates their world size. */
        zt_launch_request req = {a->nproc, a->nnodes, a->nproc_per_node, a->node_rank, a->master_addr,
                                 a->master_port};
        zt_launch_plan plan;
        if (zt_launch_plan_make(&req, &plan, &err) != ZT_OK) return zt_cli_usage_error("%s", err.msg);
        if (a->dry_run || a->action == OPT_CHECK) {
            snprintf(a->world_text, sizeof a->world_text, "%d", plan.world_size);
            a->nproc = a->world_text;
        }
    }

    a->probe_timeout_s = DEFAULT_PROBE_TIMEOUT_S;
    const char *timeout = getenv("ZT_PROBE_TIMEOUT");
    if (timeout && *timeout) {
        char *end;
        long seconds = strtol(timeout, &end, 10);
        if (*end || seconds < 1 || seconds > 3600)
            return zt_cli_usage_error("ZT_PROBE_TIMEOUT='%s' is not a whole number of seconds from 1 to 3600", timeout);
        a->probe_timeout_s = (int)seconds;
    }
    return -1;
}

void zt_cli_format_caps(uint64_t caps, char *buf, size_t cap)
{
    static const char *const names[] = {"cpu",    "cuda",     "multi-rank", "bf16",      "fp16",      "offload",
                                        "packed", "kv-cache", "gqa",        "recompute", "concurrent"};
    const int n_names = (int)(sizeof names / sizeof names[0]);
    size_t used = 0;
    buf[0] = '\0';
    for (int bit = 0; bit < 64 && used < cap; bit++) {
        if (!(caps & (1ull << bit))) continue;
        const char *sep = used ? "," : "";
        if (bit < n_names) used += (size_t)snprintf(buf + used, cap - used, "%s%s", sep, names[bit]);
        else used += (size_t)snprintf(buf + used, cap - used, "%sbit %d", sep, bit);
    }
    if (!buf[0]) snprintf(buf, cap, "none declared");
}

/* ---- --generate (framework/generate/) ----------------------------------------------------------------- */

static int do_generate(run_args *a)
{
    zt_generate_options *g = &a->gen;
    g->plugin_paths = a->plugin_paths;
    g->n_plugin_paths = a->n_plugin_paths;
    g->plugins = a->plugins;
    g->sets = a->sets;
    g->n_sets = a->n_sets;
    g->model = a->model;
    g->resume = a->resume;
    g->adapter = a->adapter;
    g->data = a->data;
    zt_generate_settings settings;
    zt_error err;
    if (zt_generate_check(g, &settings, &err) != ZT_OK) return zt_cli_usage_error("%s", err.msg);
    return zt_generate_run(g, &settings, &err) == ZT_OK ? ZT_EXIT_OK : zt_cli_run_error(&err);
}

/* zt-run --flight-recorder DIR: what a job's dumps say, after the fact (dist/flight.h). */
static int show_flight_recorder(const char *dir)
{
    zt_error err;
    int n = 0;
    if (zt_flight_analyze(dir, 0, NULL, stdout, "", &n, &err) != ZT_OK) return zt_cli_run_error(&err);
    return ZT_EXIT_OK;
}

int main(int argc, char **argv)
{
    run_args a;
    int status = parse_args(argc, argv, &a);
    /* A rank of a job says so on every line from the first (the runtime checks the launch itself). */
    zt_launch launch;
    zt_error launch_err;
    if (status < 0 && zt_launch_detect(&launch, &launch_err) == ZT_OK && launch.world_size > 1)
        zt_log_set_rank(launch.rank);
    /* --compare starts a child zt-run per combination, which launches its own ranks. */
    if (status < 0 && a.n_compares > 0) status = zt_cli_compare(&a);
    if (status < 0 && !a.dry_run && a.action != OPT_CHECK &&
        (a.nproc || a.nnodes || a.nproc_per_node || a.node_rank || a.master_addr || a.master_port)) {
        /* Returns only on failure, or for a job of one rank (the run stays in this process). */
        zt_launch_request req = {a.nproc, a.nnodes, a.nproc_per_node, a.node_rank, a.master_addr, a.master_port};
        zt_error err;
        zt_status st = zt_launch_start(&req, ZT_NPROC_AUTO, argc, argv, &err);
        if (st != ZT_OK) status = st == ZT_ERR_INVALID_ARG ? zt_cli_usage_error("%s", err.msg) : zt_cli_run_error(&err);
    }
    if (status < 0) {
        switch (a.action) {
        case OPT_LIST_PLUGINS: status = zt_cli_list_plugins(&a, 0); break;
        case OPT_DESCRIBE: status = zt_cli_describe(&a); break;
        case OPT_ENV: status = zt_cli_list_plugins(&a, 1); break;
        case OPT_CHECK: status = zt_cli_check(&a); break;
        case OPT_FLIGHT_RECORDER: status = show_flight_recorder(a.flight_dir); break;
        case OPT_GENERATE: status = do_generate(&a); break;
        default: status = zt_cli_train(&a); break;
        }
    }
    free(a.plugin_paths);
    free(a.sets);
    free(a.compares);
    free(a.gen.stops);
    /* A rank of zt-run --nproc tells it how it ended (job.h); under its mpirun an interrupted rank
     * then exits 0, which zt-run turns back into 130. */
    zt_job_note_end("exit", status);
    return zt_job_exit_status(status);
}
