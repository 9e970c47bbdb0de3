/* zt-run: the zt command line (docs/cli.md).
 *
 * Plugin code that zt-run runs only to inspect a plugin (probe for --list-plugins and --env; probe,
 * init and fini for --check) runs in a forked child process. A plugin that crashes, aborts (an
 * uncaught C++ exception ends in std::terminate) or hangs there is reported by name and zt-run
 * exits normally with status 1, instead of dying with it. Loading (dlopen and the entry call) stays
 * in zt-run itself: it runs no plugin logic by contract, and the registry's crash guard names the
 * plugin if it does crash.
 *
 * Exit status: 0 success, 1 a runtime, config or plugin error, 2 a usage error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/args.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/fileio.h"
#include "base/json.h"
#include "base/log.h"
#include "cli/env.h"
#include "config/config.h"
#include "device/device.h"
#include "dist/launch.h"
#include "generate/generate.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "train/estimate.h"
#include "train/trainer.h"

#ifndef ZT_VERSION
#error "ZT_VERSION must be defined (framework/CMakeLists.txt)"
#endif

enum { ZT_EXIT_OK = 0, ZT_EXIT_ERROR = 1, ZT_EXIT_USAGE = 2, ZT_EXIT_INTERRUPTED = 130 };

/* A probe is cheap by contract (ABI: "cheap, no side effects"); one that takes longer than this is
 * hung. Initializing the CUDA driver takes a few seconds on a large machine, hence the margin;
 * $ZT_PROBE_TIMEOUT overrides it. */
#define DEFAULT_PROBE_TIMEOUT_S 60

/* The kinds a training run needs; --check checks exactly what a run would load (run_kinds adds a
 * parallel plugin when a parallel size is above 1). */
#define TRAINING_KINDS                                                                                \
    ((1u << ZT_KIND_MODEL) | (1u << ZT_KIND_ATTENTION) | (1u << ZT_KIND_OPTIMIZER) | (1u << ZT_KIND_ZERO))

/* ---- command line ----------------------------------------------------------------------------- */

enum option_id {
    OPT_HELP, OPT_VERSION, OPT_LIST_PLUGINS, OPT_DESCRIBE, OPT_ENV, OPT_CHECK,
    OPT_PLUGIN_PATH, OPT_PLUGINS, OPT_CONFIG, OPT_SET, OPT_OUTPUT_DIR,
    OPT_DATA, OPT_MODEL, OPT_RESUME, OPT_EXPORT, OPT_NPROC, OPT_DRY_RUN, OPT_GPU_MEM_LIMIT,
    OPT_GENERATE, OPT_TOKENIZER, OPT_PROMPT, OPT_INPUT, OPT_PROMPT_IDS, OPT_TEMPLATE, OPT_RAW, OPT_MAX_NEW_TOKENS,
    OPT_TEMPERATURE, OPT_TOP_P, OPT_SEED, OPT_PRINT_IDS, N_OPTIONS
};

static const zt_cli_option options[N_OPTIONS] = {
    [OPT_HELP] = {"--help", "-h", NULL, "show this help and exit"},
    [OPT_VERSION] = {"--version", NULL, NULL, "print the zt version and the plugin ABI version, and exit"},
    [OPT_LIST_PLUGINS] = {"--list-plugins", NULL, NULL,
                          "list installed plugins and whether each can run on this machine"},
    [OPT_DESCRIBE] = {"--describe", NULL, "NAME", "show one plugin: kind, version, ABI, and every option it accepts"},
    [OPT_ENV] = {"--env", NULL, NULL, "show this machine: CPU, memory, GPUs, CUDA/NCCL/MPI versions, plugins"},
    [OPT_CHECK] = {"--check", NULL, NULL,
                   "load, probe and initialize the run's plugins, validate the config, print it resolved"},
    [OPT_PLUGIN_PATH] = {"--plugin-path", NULL, "DIR",
                         "search DIR first for NAME.plugin descriptors (repeatable; DIR may be a:b:c)"},
    [OPT_PLUGINS] = {"--plugins", NULL, "LIST",
                     "plugins to use, comma-separated: names, .plugin or .so paths (e.g. llama,zero3,paged)"},
    [OPT_CONFIG] = {"--config", NULL, "FILE", "JSON run configuration (a DeepSpeed ds_config.json works)"},
    [OPT_SET] = {"--set", NULL, "KEY=VALUE", "override one config key, e.g. --set zero_optimization.stage=2 (repeatable)"},
    [OPT_OUTPUT_DIR] = {"--output-dir", NULL, "DIR",
                        "where the run writes its files, config.resolved.json first (same as --set output_dir=DIR)"},
    /* training only (framework/train/trainer.c) */
    [OPT_DATA] = {"--data", NULL, "DIR", "train on this zt-prep data set (same as --set data.path=DIR)"},
    [OPT_MODEL] = {"--model", NULL, "DIR", "fine-tune the Hugging Face LLaMA model in DIR (config.json + safetensors)"},
    [OPT_RESUME] = {"--resume", NULL, "DIR|latest", "continue from a checkpoint: its directory, or the newest in checkpoint.dir"},
    [OPT_EXPORT] = {"--export", NULL, "DIR", "after training, write the model to DIR in Hugging Face format"},
    [OPT_NPROC] = {"--nproc", NULL, "N",
                   "train with N ranks on this machine (GPU runs: one rank per GPU over NCCL; CPU runs: "
                   "through mpirun; docs/distributed.md)"},
    [OPT_DRY_RUN] = {"--dry-run", NULL, NULL,
                     "print the memory per rank by pool for this run and every other ZeRO stage and offload choice, "
                     "then exit without training (docs/zero.md)"},
    [OPT_GPU_MEM_LIMIT] = {"--gpu-mem-limit", NULL, "SIZE",
                           "cap the GPU memory zt allocates per device, e.g. 24G (same as --set gpu_mem_limit=SIZE)"},
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
    [OPT_TOP_P] = {"--top-p", NULL, "P", "generation: sample among the most likely tokens holding probability P (1)"},
    [OPT_SEED] = {"--seed", NULL, "S", "generation: sampling seed (default: the config key seed)"},
    [OPT_PRINT_IDS] = {"--print-ids", NULL, NULL, "generation: write the generated token ids instead of text"},
};

typedef struct run_args {
    int action; /* OPT_LIST_PLUGINS, OPT_DESCRIBE, OPT_ENV, OPT_CHECK, or -1 for none */
    const char *describe_name;
    const char **plugin_paths;
    int n_plugin_paths;
    const char *plugins;
    const char *config_path;
    const char **sets;
    int n_sets;
    const char *output_dir;
    const char *data, *model, *resume, *export_dir, *nproc, *gpu_mem_limit; /* training */
    int dry_run;
    zt_generate_options gen; /* --generate */
    int probe_timeout_s;
} run_args;

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
            "  zt-run [--plugins LIST] [--config FILE] [--set KEY=VALUE]... [--output-dir DIR] [--data DIR]\n"
            "         [--model DIR] [--resume DIR|latest] [--export DIR] [--nproc N]   (train; docs/training.md)\n"
            "         [--dry-run] [--gpu-mem-limit SIZE]\n"
            "  zt-run --generate --model DIR|FILE.bin|--resume CKPT [-t FILE] [--data DIR] --prompt TEXT\n"
            "         [--input TEXT] [--template NAME|FILE|--raw] [--max-new-tokens N] [--temperature T]\n"
            "         [--top-p P] [--seed S]                                   (generate; docs/generate.md)\n"
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

static int usage_error(const char *fmt, ...) ZT_PRINTF(1, 2);
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("zt-run: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nRun zt-run --help for usage.\n", stderr);
    return ZT_EXIT_USAGE;
}

static int run_error(const zt_error *err)
{
    fprintf(stderr, "zt-run: error: %s\n", err->msg);
    return ZT_EXIT_ERROR;
}

/* Fills *a from argv; returns -1 when fine, else the exit status (help, version, usage error). */
static int parse_args(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    a->action = -1;
    zt_cli_arg *args;
    int n;
    zt_error err;
    if (zt_cli_parse(options, N_OPTIONS, argc, argv, &args, &n, &err) != ZT_OK)
        return usage_error("%s", err.msg);
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
    if (!a->plugin_paths || !a->sets) {
        free(args);
        fprintf(stderr, "zt-run: error: out of memory\n");
        return ZT_EXIT_ERROR;
    }
    int status = -1;
    int given[N_OPTIONS] = {0};
    for (int i = 0; i < n && status < 0; i++) {
        int o = args[i].option;
        const char *v = args[i].value;
        if (o != OPT_PLUGIN_PATH && o != OPT_SET && given[o]) {
            status = usage_error("%s is given twice; give it once", options[o].name);
            break;
        }
        given[o] = 1;
        switch (o) {
        case OPT_LIST_PLUGINS:
        case OPT_DESCRIBE:
        case OPT_ENV:
        case OPT_CHECK:
        case OPT_GENERATE:
            if (a->action >= 0) {
                status = usage_error("%s and %s are separate actions; give one of them",
                                     options[a->action].name, options[o].name);
                break;
            }
            a->action = o;
            if (o == OPT_DESCRIBE) a->describe_name = v;
            break;
        case OPT_PLUGIN_PATH: a->plugin_paths[a->n_plugin_paths++] = v; break;
        case OPT_PLUGINS: a->plugins = v; break;
        case OPT_CONFIG: a->config_path = v; break;
        case OPT_SET:
            if (!strchr(v, '=') || v[0] == '=')
                status = usage_error("--set '%s': expected KEY=VALUE, e.g. --set zero_optimization.stage=2", v);
            a->sets[a->n_sets++] = v;
            break;
        case OPT_OUTPUT_DIR: a->output_dir = v; break;
        case OPT_DATA: a->data = v; break;
        case OPT_MODEL: a->model = v; break;
        case OPT_RESUME: a->resume = v; break;
        case OPT_EXPORT: a->export_dir = v; break;
        case OPT_NPROC: a->nproc = v; break;
        case OPT_DRY_RUN: a->dry_run = 1; break;
        case OPT_GPU_MEM_LIMIT: a->gpu_mem_limit = v; break;
        case OPT_TOKENIZER: a->gen.tokenizer = v; break;
        case OPT_PROMPT: a->gen.prompt = v; break;
        case OPT_INPUT: a->gen.input = v; break;
        case OPT_PROMPT_IDS: a->gen.prompt_ids = v; break;
        case OPT_TEMPLATE: a->gen.template_name = v; break;
        case OPT_RAW: a->gen.raw = 1; break;
        case OPT_MAX_NEW_TOKENS: a->gen.max_new_tokens = v; break;
        case OPT_TEMPERATURE: a->gen.temperature = v; break;
        case OPT_TOP_P: a->gen.top_p = v; break;
        case OPT_SEED: a->gen.seed = v; break;
        case OPT_PRINT_IDS: a->gen.print_ids = 1; break;
        }
    }
    /* Options only --check (the run) reads: silently ignoring them elsewhere would hide mistakes. */
    static const int run_only[] = {OPT_PLUGINS, OPT_CONFIG, OPT_SET, OPT_OUTPUT_DIR};
    for (size_t i = 0; i < sizeof run_only / sizeof run_only[0] && status < 0; i++)
        if (given[run_only[i]] && a->action >= 0 && a->action != OPT_CHECK &&
            !(a->action == OPT_GENERATE && (run_only[i] == OPT_PLUGINS || run_only[i] == OPT_SET)))
            status = usage_error("%s has no effect with %s", options[run_only[i]].name, options[a->action].name);
    static const int train_only[] = {OPT_DATA, OPT_MODEL, OPT_RESUME, OPT_EXPORT, OPT_NPROC, OPT_DRY_RUN,
                                     OPT_GPU_MEM_LIMIT};
    for (size_t i = 0; i < sizeof train_only / sizeof train_only[0] && status < 0; i++)
        if (given[train_only[i]] && a->action >= 0 &&
            !(a->action == OPT_GENERATE && (train_only[i] == OPT_DATA || train_only[i] == OPT_MODEL ||
                                            train_only[i] == OPT_RESUME)))
            status = usage_error("%s is for training and has no effect with %s", options[train_only[i]].name,
                                 options[a->action].name);
    for (int o = OPT_TOKENIZER; o <= OPT_PRINT_IDS && status < 0; o++)
        if (given[o] && a->action != OPT_GENERATE)
            status = usage_error("%s is for generation: add --generate (docs/generate.md)", options[o].name);
    free(args);
    if (status >= 0) return status;

    a->probe_timeout_s = DEFAULT_PROBE_TIMEOUT_S;
    const char *timeout = getenv("ZT_PROBE_TIMEOUT");
    if (timeout && *timeout) {
        char *end;
        long seconds = strtol(timeout, &end, 10);
        if (*end || seconds < 1 || seconds > 3600)
            return usage_error("ZT_PROBE_TIMEOUT='%s' is not a whole number of seconds from 1 to 3600", timeout);
        a->probe_timeout_s = (int)seconds;
    }
    return -1;
}

/* "cpu,cuda,bf16": the ZT_CAP_* flags by name. */
static void format_caps(uint64_t caps, char *buf, size_t cap)
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

/* ---- running plugin code in a child process --------------------------------------------------- */

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
    int term_signal;      /* the signal that killed it, 0 if none */
    int exit_code;
    int timed_out;
} child_result;

typedef void (*child_body)(void *arg, FILE *report);

/* Values travel on one line each: control characters become spaces. */
static void report_line(FILE *report, const char *key, const char *value)
{
    fprintf(report, "%s\t", key);
    for (const char *c = value; *c; c++) fputc((unsigned char)*c < 0x20 ? ' ' : *c, report);
    fputc('\n', report);
    fflush(report);
}

static void report_call(FILE *report, const char *call, const zt_loaded_plugin *lp)
{
    char text[192];
    snprintf(text, sizeof text, "%s of plugin '%s'", call, lp->desc.name);
    report_line(report, "library", lp->desc.library);
    report_line(report, "call", text);
}

static void report_final(FILE *report, zt_status status, const char *message)
{
    fprintf(report, "status\t%d\n%s", (int)status, message ? message : "");
    fflush(report);
}

static void parse_report(char *text, child_result *r)
{
    char *line = text;
    while (line && *line) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char *tab = strchr(line, '\t');
        if (tab) {
            *tab = '\0';
            const char *key = line, *value = tab + 1;
            if (!strcmp(key, "status")) {
                r->completed = 1;
                r->status = (zt_status)atoi(value);
                snprintf(r->message, sizeof r->message, "%s", next ? next : "");
                return;
            }
            if (!strcmp(key, "call")) snprintf(r->call, sizeof r->call, "%s", value);
            else if (!strcmp(key, "library")) snprintf(r->library, sizeof r->library, "%s", value);
            else if (!strcmp(key, "version")) snprintf(r->version, sizeof r->version, "%s", value);
            else if (!strcmp(key, "description")) snprintf(r->description, sizeof r->description, "%s", value);
            else if (!strcmp(key, "caps")) snprintf(r->caps, sizeof r->caps, "%s", value);
            else if (!strcmp(key, "abi")) sscanf(value, "%d.%d", &r->abi_major, &r->abi_minor);
        }
        line = next;
    }
}

/* Run body(arg, report) in a forked child and collect what it reported. quiet: the child's
 * stdout and stderr go to /dev/null (listing); else its output goes to our stderr, so plugin log
 * lines and a C++ runtime's "terminate called after throwing..." reach the user while our stdout
 * stays clean. timeout_s 0: wait as long as it takes. */
static void run_isolated(child_body body, void *arg, int quiet, int timeout_s, child_result *r)
{
    memset(r, 0, sizeof *r);
    int fds[2];
    if (pipe(fds) != 0) {
        r->completed = 1;
        r->status = ZT_ERR_INTERNAL;
        snprintf(r->message, sizeof r->message, "cannot create a pipe: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        r->completed = 1;
        r->status = ZT_ERR_INTERNAL;
        snprintf(r->message, sizeof r->message, "cannot start a child process: %s", strerror(errno));
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        int sink = quiet ? open("/dev/null", O_WRONLY) : STDERR_FILENO;
        if (sink >= 0) {
            dup2(sink, STDOUT_FILENO);
            dup2(sink, STDERR_FILENO);
        }
        FILE *report = fdopen(fds[1], "w");
        if (report) body(arg, report);
        _exit(0); /* no atexit handlers: they belong to the parent */
    }
    close(fds[1]);

    char *text = NULL;
    size_t len = 0, cap = 0;
    double deadline = timeout_s > 0 ? zt_now_s() + timeout_s : 0;
    for (;;) {
        int wait_ms = -1;
        if (timeout_s > 0) {
            double left = deadline - zt_now_s();
            if (left <= 0) {
                r->timed_out = 1;
                kill(pid, SIGKILL);
                break;
            }
            wait_ms = (int)(left * 1000) + 1;
        }
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        int ready = poll(&pfd, 1, wait_ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) continue; /* the deadline check above ends the wait */
        char chunk[4096];
        ssize_t got = read(fds[0], chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        if (len + (size_t)got + 1 > cap) {
            size_t bigger_cap = (len + (size_t)got + 1) * 2;
            char *bigger = realloc(text, bigger_cap);
            if (!bigger) continue; /* keep what fits; the report is then cut short, not wrong */
            text = bigger;
            cap = bigger_cap;
        }
        memcpy(text + len, chunk, (size_t)got);
        len += (size_t)got;
    }
    close(fds[0]);
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(wstatus) && !r->timed_out) r->term_signal = WTERMSIG(wstatus);
    if (WIFEXITED(wstatus)) r->exit_code = WEXITSTATUS(wstatus);
    if (text) {
        text[len] = '\0';
        parse_report(text, r);
        free(text);
    }
    if (r->timed_out || r->term_signal) r->completed = 0;
}

/* Why a child did not report success, as one message: a crash, a hang, or the plugin's error.
 * fallback_call names what the child was doing if it died before announcing a plugin call. */
static void describe_child_failure(const child_result *r, const char *fallback_call, int timeout_s,
                                   zt_error *err)
{
    const char *call = r->call[0] ? r->call : fallback_call;
    const char *library = r->library[0] ? r->library : "unknown";
    if (r->timed_out) {
        zt_error_set(err, ZT_ERR_TIMEOUT,
                     "%s did not return within %d s, so zt-run stopped it. Library: %s. A probe must be "
                     "quick; report the hang to the plugin's author, or leave the plugin out of --plugins",
                     call, timeout_s, library);
    } else if (r->term_signal) {
        zt_error_set(err, ZT_ERR_INTERNAL,
                     "%s crashed (%s, signal %d)%s. Library: %s. zt-run ran it in a child process and is "
                     "unharmed; the plugin has a bug: report it to its author, or leave it out of --plugins",
                     call, strsignal(r->term_signal), r->term_signal,
                     r->term_signal == SIGABRT ? ": an assert failed or a C++ exception escaped the plugin" : "",
                     library);
    } else if (!r->completed) {
        zt_error_set(err, ZT_ERR_INTERNAL, "%s ended its process (exit status %d) instead of returning. Library: %s",
                     call, r->exit_code, library);
    } else {
        zt_error_set(err, r->status, "%s", r->message);
    }
}

/* The first plugin of the run (tokenizers do not compute) that lacks capability `cap`, or NULL. */
static const zt_loaded_plugin *plugin_without(const zt_plugin_set *set, uint64_t cap)
{
    for (int k = 1; k <= ZT_KIND_COUNT; k++)
        if (k != ZT_KIND_TOKENIZER && set->by_kind[k].plugin && !(set->by_kind[k].plugin->caps & cap))
            return &set->by_kind[k];
    return NULL;
}

/* The device a run computes on: the config's `device` (docs/gpu.md). cuda needs every plugin of the
 * run to declare ZT_CAP_CUDA and a GPU; auto picks cuda when both hold (and must, when a plugin runs
 * on CUDA only), else the CPU, saying why. Without a config or plugins (listing, probing): the CPU.
 * CUDA is looked for only when every plugin could use it, so CPU runs never load it. */
static zt_status run_device(const zt_config *cfg, const zt_plugin_set *set, int *device_type, zt_error *err)
{
    *device_type = ZT_DEVICE_CPU;
    const char *want = "cpu";
    if (!cfg || !set || zt_config_get_string(cfg, "device", &want) != ZT_OK) return ZT_OK;
    const zt_loaded_plugin *cpu_only = plugin_without(set, ZT_CAP_CUDA), *gpu_only = plugin_without(set, ZT_CAP_CPU);
    if (!strcmp(want, "cpu")) {
        if (!gpu_only) return ZT_OK;
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "device is cpu, but %s plugin '%s' runs on CUDA GPUs only: set device to cuda or auto, or "
                            "choose a plugin that runs on the CPU%s",
                            zt_kind_name(gpu_only->plugin->kind), gpu_only->desc.name,
                            gpu_only->plugin->kind == ZT_KIND_ATTENTION ? " (--plugins naive)" : "");
    }
    char why[ZT_ERROR_MSG_MAX];
    zt_status st = ZT_ERR_UNSUPPORTED;
    if (cpu_only) {
        snprintf(why, sizeof why, "%s plugin '%s' runs on the CPU only (it does not declare ZT_CAP_CUDA)%s",
                 zt_kind_name(cpu_only->plugin->kind), cpu_only->desc.name,
                 cpu_only->plugin->kind == ZT_KIND_ATTENTION ? "; --plugins flash computes attention on a GPU"
                                                             : "; choose one that runs on CUDA, or train on the CPU");
    } else {
        zt_error cuda_err;
        int n_devices = 0;
        st = zt_device_cuda_count(&n_devices, &cuda_err);
        snprintf(why, sizeof why, "%s", st == ZT_OK ? "" : cuda_err.msg);
    }
    if (st == ZT_OK) {
        *device_type = ZT_DEVICE_CUDA;
        /* naive is the GPU default only where flash is not installed, or when named: say what it costs. */
        const zt_loaded_plugin *attention = &set->by_kind[ZT_KIND_ATTENTION];
        if (attention->plugin && !strcmp(attention->desc.name, "naive"))
            zt_log(ZT_LOG_INFO, "attention 'naive' on the GPU is the unfused reference: fp32 scores [heads, T, T] "
                   "per sequence (memory quadratic in T) and several times slower than flash; --plugins flash "
                   "for speed");
        return ZT_OK;
    }
    if (strcmp(want, "cuda") != 0 && !gpu_only) {
        zt_log(ZT_LOG_INFO, "device auto: training on the CPU because %s", why);
        return ZT_OK;
    }
    char subject[256] = "device is cuda";
    if (gpu_only && strcmp(want, "cuda") != 0)
        snprintf(subject, sizeof subject, "%s plugin '%s' runs on CUDA GPUs only", zt_kind_name(gpu_only->plugin->kind),
                 gpu_only->desc.name);
    return zt_error_set(err, st == ZT_ERR_NOT_FOUND ? st : ZT_ERR_UNSUPPORTED, "%s, but %s", subject, why);
}

/* in_child: a child forked to inspect plugins, which is one process even when zt-run is a rank.
 * set: the run's plugins, which decide the device with cfg (NULL: the CPU). */
static zt_status create_runtime(const zt_config *cfg, const zt_plugin_set *set, int n_threads, int in_child,
                                zt_runtime **rt, zt_error *err)
{
    zt_runtime_options opt;
    memset(&opt, 0, sizeof opt);
    opt.n_threads = n_threads;
    opt.single_process = in_child;
    zt_status st = run_device(cfg, set, &opt.device_type, err);
    if (st != ZT_OK) return st;
    int64_t gpu_mem_limit = 0;
    if (cfg && zt_config_get_int(cfg, "gpu_mem_limit", &gpu_mem_limit) == ZT_OK) opt.device_mem_limit = (uint64_t)gpu_mem_limit;
    return zt_runtime_create(&opt, cfg, rt, err);
}

/* ---- --list-plugins and the plugin part of --env ---------------------------------------------- */

typedef struct probe_job {
    const zt_registry *reg;
    const zt_plugin_desc *desc;
} probe_job;

/* Child: load one descriptor, report its facts, probe it. */
static void probe_descriptor_body(void *arg, FILE *report)
{
    const probe_job *job = arg;
    zt_error err;
    zt_loaded_plugin lp;
    char call[192];
    snprintf(call, sizeof call, "loading (dlopen, zt_plugin_entry) of plugin '%s'", job->desc->name);
    report_line(report, "library", job->desc->library);
    report_line(report, "call", call);
    zt_status st = zt_plugin_load(job->reg, job->desc->descriptor, &lp, &err);
    if (st != ZT_OK) {
        report_final(report, st, err.msg);
        return;
    }
    char abi[32];
    snprintf(abi, sizeof abi, "%u.%u", lp.plugin->abi_major, lp.plugin->abi_minor);
    report_line(report, "version", lp.plugin->version);
    report_line(report, "description", lp.plugin->description);
    report_line(report, "abi", abi);
    char caps[512];
    format_caps(lp.plugin->caps, caps, sizeof caps);
    report_line(report, "caps", caps);
    zt_runtime *rt = NULL;
    st = create_runtime(NULL, NULL, 1, 1, &rt, &err);
    if (st == ZT_OK) {
        report_call(report, "probe()", &lp);
        st = zt_plugin_probe(&lp, rt, &err);
    }
    report_final(report, st, st == ZT_OK ? "" : err.msg);
    zt_plugin_unload(&lp);
    zt_runtime_destroy(rt);
}

typedef struct plugin_row {
    const zt_plugin_desc *desc;
    child_result probe;
    char runs_here[16]; /* "yes", "no", "shadowed" */
    char reason[4096 + 128]; /* why not, one line */
} plugin_row;

/* The first line of a message, for one table cell. */
static void first_line(const char *msg, char *out, size_t cap)
{
    size_t n = strcspn(msg, "\n");
    snprintf(out, cap, "%.*s", (int)n, msg);
}

static const zt_plugin_desc *shadowing_desc(const zt_registry *reg, const zt_plugin_desc *d)
{
    for (int i = 0; i < zt_registry_count(reg); i++) {
        const zt_plugin_desc *other = zt_registry_at(reg, i);
        if (other == d) break;
        if (!strcmp(other->name, d->name)) return other;
    }
    return NULL;
}

/* Probe every installed plugin, each in its own child process. */
static plugin_row *probe_installed(const zt_registry *reg, int timeout_s)
{
    int n = zt_registry_count(reg);
    plugin_row *rows = calloc((size_t)n + 1, sizeof *rows);
    if (!rows) return NULL;
    for (int i = 0; i < n; i++) {
        plugin_row *row = &rows[i];
        row->desc = zt_registry_at(reg, i);
        if (row->desc->shadowed) {
            const zt_plugin_desc *winner = shadowing_desc(reg, row->desc);
            snprintf(row->runs_here, sizeof row->runs_here, "shadowed");
            if (winner)
                snprintf(row->reason, sizeof row->reason, "shadowed by %s, earlier on the search path",
                         winner->descriptor);
            else
                snprintf(row->reason, sizeof row->reason,
                         "shadowed by a malformed %s.plugin earlier on the search path (see Problems)", row->desc->name);
            continue;
        }
        probe_job job = {reg, row->desc};
        run_isolated(probe_descriptor_body, &job, 1, timeout_s, &row->probe);
        int ok = row->probe.completed && row->probe.status == ZT_OK;
        snprintf(row->runs_here, sizeof row->runs_here, "%s", ok ? "yes" : "no");
        if (!ok) {
            zt_error err;
            describe_child_failure(&row->probe, "loading the plugin", timeout_s, &err);
            first_line(err.msg, row->reason, sizeof row->reason);
        }
    }
    return rows;
}

static void print_plugin_table(FILE *f, const zt_registry *reg, const plugin_row *rows)
{
    int n = zt_registry_count(reg);
    enum { C_NAME, C_KIND, C_VERSION, C_ABI, C_HERE, C_CAPS, C_PATH, N_COLS };
    static const char *const headers[N_COLS] = {"NAME", "KIND", "VERSION", "ABI", "RUNS HERE", "CAPS", "PATH"};
    int width[N_COLS];
    for (int c = 0; c < N_COLS; c++) width[c] = (int)strlen(headers[c]);
    char cells[N_COLS][4096];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            for (int c = 0; c < N_COLS; c++) fprintf(f, "%-*s  ", width[c], headers[c]);
            fprintf(f, "DESCRIPTION\n");
        }
        for (int i = 0; i < n; i++) {
            const plugin_row *row = &rows[i];
            const zt_plugin_desc *d = row->desc;
            snprintf(cells[C_NAME], sizeof cells[0], "%s", d->name);
            snprintf(cells[C_KIND], sizeof cells[0], "%s", zt_kind_name(d->kind));
            snprintf(cells[C_VERSION], sizeof cells[0], "%s", row->probe.version[0] ? row->probe.version : "-");
            /* The ABI the library reports once loaded; the descriptor's claim otherwise. */
            if (row->probe.version[0])
                snprintf(cells[C_ABI], sizeof cells[0], "%d.%d", row->probe.abi_major, row->probe.abi_minor);
            else
                snprintf(cells[C_ABI], sizeof cells[0], "%d.%d", d->abi_major, d->abi_minor);
            snprintf(cells[C_HERE], sizeof cells[0], "%s", row->runs_here);
            snprintf(cells[C_CAPS], sizeof cells[0], "%s", row->probe.caps[0] ? row->probe.caps : "-");
            snprintf(cells[C_PATH], sizeof cells[0], "%s", d->library);
            if (pass == 0) {
                for (int c = 0; c < N_COLS; c++)
                    if ((int)strlen(cells[c]) > width[c]) width[c] = (int)strlen(cells[c]);
                continue;
            }
            for (int c = 0; c < N_COLS; c++) fprintf(f, "%-*s  ", width[c], cells[c]);
            fprintf(f, "%s\n", row->probe.description[0] ? row->probe.description : "-");
            if (row->reason[0]) fprintf(f, "    %s: %s\n", row->runs_here, row->reason);
        }
    }
    if (n == 0) fprintf(f, "(no plugins installed)\n");
}

static void print_search_path(FILE *f, const zt_registry *reg)
{
    fprintf(f, "Plugin search path (first match wins):\n");
    for (int i = 0; i < zt_registry_dir_count(reg); i++) {
        const char *dir = zt_registry_dir(reg, i);
        struct stat st;
        int exists = stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
        fprintf(f, "  %d. %s%s\n", i + 1, dir, exists ? "" : "  (does not exist)");
    }
}

static void print_problems(FILE *f, const zt_registry *reg)
{
    int n = zt_registry_problem_count(reg);
    if (!n) return;
    fprintf(f, "\nProblems (these descriptors are ignored until fixed):\n");
    for (int i = 0; i < n; i++) fprintf(f, "  %s\n", zt_registry_problem(reg, i));
}

/* --list-plugins, and --env with the machine's description (with_env) before the plugin table. */
static int do_list_plugins(const run_args *a, int with_env)
{
    zt_registry *reg;
    zt_error err;
    if (zt_registry_scan(a->plugin_paths, a->n_plugin_paths, &reg, &err) != ZT_OK) return run_error(&err);
    /* Probe first: zt_env_print initializes CUDA in this process, and a child forked after that
     * cannot use CUDA. */
    plugin_row *rows = probe_installed(reg, a->probe_timeout_s);
    if (!rows) {
        zt_registry_free(reg);
        fprintf(stderr, "zt-run: error: out of memory\n");
        return ZT_EXIT_ERROR;
    }
    if (with_env) {
        zt_env_print(stdout);
        printf("\nPlugins\n");
    }
    print_search_path(stdout, reg);
    printf("\n");
    print_plugin_table(stdout, reg, rows);
    print_problems(stdout, reg);
    free(rows);
    zt_registry_free(reg);
    return ZT_EXIT_OK;
}

/* ---- --describe ------------------------------------------------------------------------------- */

static const char *option_type_name(int type)
{
    static const char *const names[] = {"bool", "int", "float", "string", "enum", "floats", "bytes"};
    return type >= 0 && type <= ZT_OPT_BYTES ? names[type] : "?";
}

/* "[0, 1)", ">= 0", "adam|sgd": what values the host accepts for o. */
static void option_range(const zt_option *o, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (o->type == ZT_OPT_ENUM) {
        size_t used = 0;
        for (int i = 0; o->choices && o->choices[i] && used < cap; i++)
            used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? "|" : "", o->choices[i]);
        return;
    }
    int has_min = (o->flags & ZT_OPT_HAS_MIN) != 0, has_max = (o->flags & ZT_OPT_HAS_MAX) != 0;
    int open_min = (o->flags & ZT_OPT_MIN_OPEN) != 0;
    const char *each = o->type == ZT_OPT_FLOATS ? "each " : "";
    if (has_min && has_max)
        snprintf(buf, cap, "%s%c%g, %g]", each, open_min ? '(' : '[', o->min, o->max);
    else if (has_min)
        snprintf(buf, cap, "%s%s %g", each, open_min ? ">" : ">=", o->min);
    else if (has_max)
        snprintf(buf, cap, "%s<= %g", each, o->max);
    else
        snprintf(buf, cap, "-");
}

static int do_describe(const run_args *a)
{
    zt_registry *reg;
    zt_error err;
    if (zt_registry_scan(a->plugin_paths, a->n_plugin_paths, &reg, &err) != ZT_OK) return run_error(&err);
    zt_loaded_plugin lp;
    if (zt_plugin_load(reg, a->describe_name, &lp, &err) != ZT_OK) {
        zt_registry_free(reg);
        return run_error(&err);
    }
    const zt_plugin *p = lp.plugin;
    printf("%s %s: %s %s plugin, zt ABI %u.%u\n", p->name, p->version,
           strchr("aeiou", zt_kind_name(p->kind)[0]) ? "an" : "a", zt_kind_name(p->kind), p->abi_major,
           p->abi_minor);
    printf("  %s\n", p->description);
    printf("  library:      %s\n", lp.desc.library);
    if (lp.desc.descriptor[0]) printf("  descriptor:   %s\n", lp.desc.descriptor);
    char caps[512];
    format_caps(p->caps, caps, sizeof caps);
    printf("  capabilities: %s\n", caps);
    if (!p->n_options) {
        printf("\nOptions: none\n");
    } else {
        printf("\nOptions (set them in the --config file or with --set KEY=VALUE):\n");
        static const char *const headers[] = {"KEY", "TYPE", "DEFAULT", "RANGE/CHOICES"};
        int width[4];
        for (int c = 0; c < 4; c++) width[c] = (int)strlen(headers[c]);
        char cells[4][1024];
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1) printf("  %-*s  %-*s  %-*s  %-*s  HELP\n", width[0], headers[0], width[1], headers[1],
                                  width[2], headers[2], width[3], headers[3]);
            for (uint32_t i = 0; i < p->n_options; i++) {
                const zt_option *o = &p->options[i];
                snprintf(cells[0], sizeof cells[0], "%s", o->key);
                snprintf(cells[1], sizeof cells[1], "%s", option_type_name(o->type));
                if ((o->flags & ZT_OPT_NO_DEFAULT) || !o->default_value)
                    snprintf(cells[2], sizeof cells[2], "(none)");
                else if (!o->default_value[0])
                    snprintf(cells[2], sizeof cells[2], "\"\"");
                else
                    snprintf(cells[2], sizeof cells[2], "%s", o->default_value);
                option_range(o, cells[3], sizeof cells[3]);
                if (pass == 0) {
                    for (int c = 0; c < 4; c++)
                        if ((int)strlen(cells[c]) > width[c]) width[c] = (int)strlen(cells[c]);
                } else {
                    printf("  %-*s  %-*s  %-*s  %-*s  %s\n", width[0], cells[0], width[1], cells[1], width[2],
                           cells[2], width[3], cells[3], o->help);
                }
            }
        }
    }
    zt_plugin_unload(&lp);
    zt_registry_free(reg);
    return ZT_EXIT_OK;
}

/* ---- --check ---------------------------------------------------------------------------------- */

typedef struct check_job {
    zt_plugin_set *set;
    const zt_config *cfg; /* NULL for probe: the config is not validated yet */
} check_job;

/* Child: probe every plugin of the set; report all that cannot run, not just the first. */
static void check_probe_body(void *arg, FILE *report)
{
    check_job *job = arg;
    zt_error err, all;
    zt_error_clear(&all);
    zt_runtime *rt = NULL;
    zt_status first = create_runtime(NULL, NULL, 1, 1, &rt, &err);
    if (first != ZT_OK) {
        report_final(report, first, err.msg);
        return;
    }
    for (int k = 1; k <= ZT_KIND_COUNT; k++) {
        zt_loaded_plugin *lp = &job->set->by_kind[k];
        if (!lp->plugin) continue;
        report_call(report, "probe()", lp);
        zt_status st = zt_plugin_probe(lp, rt, &err);
        if (st == ZT_OK) continue;
        if (first == ZT_OK) first = st;
        zt_error_append(&all, "%s%s", all.msg[0] ? "\n" : "", err.msg);
    }
    report_final(report, first, all.msg);
    zt_runtime_destroy(rt);
}

/* Child: init every plugin in kind order with the validated config, then fini in reverse. */
static void check_init_body(void *arg, FILE *report)
{
    check_job *job = arg;
    zt_error err;
    int64_t threads = 0;
    if (zt_config_get_int(job->cfg, "threads", &threads) != ZT_OK) threads = 0;
    zt_runtime *rt = NULL;
    zt_status st = create_runtime(job->cfg, job->set, (int)threads, 1, &rt, &err);
    for (int k = 1; k <= ZT_KIND_COUNT && st == ZT_OK; k++) {
        zt_loaded_plugin *lp = &job->set->by_kind[k];
        if (!lp->plugin) continue;
        report_call(report, "init()", lp);
        st = zt_plugin_init(lp, rt, &err);
    }
    for (int k = ZT_KIND_COUNT; k >= 1; k--) {
        zt_loaded_plugin *lp = &job->set->by_kind[k];
        if (!lp->initialized) continue;
        report_call(report, "fini()", lp);
        zt_plugin_unload(lp);
    }
    report_final(report, st, st == ZT_OK ? "" : err.msg);
    zt_runtime_destroy(rt);
}

/* "_plugins" of the resolved config: [{"name", "kind", "version", "abi", "path"}, ...] */
static char *plugins_json(const zt_plugin_set *set)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    fputc('[', f);
    int n = 0;
    for (int k = 1; k <= ZT_KIND_COUNT; k++) {
        const zt_loaded_plugin *lp = &set->by_kind[k];
        if (!lp->plugin) continue;
        char abi[32];
        snprintf(abi, sizeof abi, "%u.%u", lp->plugin->abi_major, lp->plugin->abi_minor);
        const char *fields[5][2] = {{"name", lp->desc.name},
                                    {"kind", zt_kind_name(k)},
                                    {"version", lp->plugin->version},
                                    {"abi", abi},
                                    {"path", lp->desc.library}};
        fputs(n++ ? ", {" : "{", f);
        for (int i = 0; i < 5; i++) {
            fprintf(f, "%s\"%s\": ", i ? ", " : "", fields[i][0]);
            zt_json_write_string(f, fields[i][1], strlen(fields[i][1]));
        }
        fputc('}', f);
    }
    fputc(']', f);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* The plugin kinds this run loads: what training needs, plus a parallel plugin once a tensor or
 * pipeline size is above 1 (data parallelism alone needs none: every rank is a data-parallel rank). */
static unsigned run_kinds(const zt_config *cfg)
{
    static const char *const sizes[] = {"parallel_config.model_parallel", "parallel_config.pipeline_stage"};
    unsigned kinds = TRAINING_KINDS;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int64_t n;
        if (zt_config_get_int(cfg, sizes[i], &n) == ZT_OK && n > 1) kinds |= 1u << ZT_KIND_PARALLEL;
    }
    return kinds;
}

/* --output-dir DIR is --set output_dir=DIR, with DIR always a string (even "123" or "true"). */
static zt_status set_output_dir(zt_config *cfg, const char *dir, zt_error *err)
{
    char *assignment = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&assignment, &len);
    if (!f) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading --output-dir");
    fputs("output_dir=", f);
    zt_json_write_string(f, dir, strlen(dir));
    if (fclose(f) != 0) {
        free(assignment);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading --output-dir");
    }
    zt_status st = zt_config_set(cfg, assignment, err);
    free(assignment);
    return st;
}

/* A plugin named in --plugins stands for the config key that would otherwise select it. When the
 * config (unset, so at its default) names another, record the plugin's choice, so the resolved
 * config says what actually runs. Resolution has already refused a named plugin that contradicts
 * a key the user set, and a default plugin agrees with the config by construction. */
static zt_status record_named_plugins(zt_config *cfg, const zt_plugin_set *set, zt_error *err)
{
    const zt_loaded_plugin *opt = &set->by_kind[ZT_KIND_OPTIMIZER], *zero = &set->by_kind[ZT_KIND_ZERO];
    char json[256];
    zt_status st = ZT_OK;
    const char *type = NULL;
    if (opt->plugin && zt_config_get_string(cfg, "optimizer.type", &type) == ZT_OK && strcasecmp(type, opt->desc.name)) {
        snprintf(json, sizeof json, "{\"optimizer\": {\"type\": \"%s\"}}", opt->desc.name); /* a plugin name needs no escapes */
        st = zt_config_load_string(cfg, json, "--plugins", err);
    }
    int64_t stage;
    int32_t plugin_stage = zero->plugin ? ((const zt_zero_ops *)zero->plugin->ops)->stage : 0;
    if (st == ZT_OK && zero->plugin && zt_config_get_int(cfg, "zero_optimization.stage", &stage) == ZT_OK &&
        stage != plugin_stage) {
        snprintf(json, sizeof json, "{\"zero_optimization\": {\"stage\": %d}}", (int)plugin_stage);
        st = zt_config_load_string(cfg, json, "--plugins", err);
    }
    return st;
}

static int do_check(const run_args *a)
{
    zt_error err;
    int status = ZT_EXIT_ERROR;
    zt_registry *reg = NULL;
    zt_plugin_set set;
    memset(&set, 0, sizeof set);
    char *plugins = NULL;
    child_result r;
    zt_config *cfg = zt_config_new();
    if (!cfg) {
        fprintf(stderr, "zt-run: error: out of memory\n");
        return ZT_EXIT_ERROR;
    }

    /* The config first: optimizer.type and zero_optimization.stage choose default plugins. */
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    if (zt_config_add_schema(cfg, "host", host_opts, n_host, &err) != ZT_OK) goto fail;
    if (a->config_path && zt_config_load_file(cfg, a->config_path, &err) != ZT_OK) goto fail;
    for (int i = 0; i < a->n_sets; i++)
        if (zt_config_set(cfg, a->sets[i], &err) != ZT_OK) goto fail;
    if (a->output_dir && set_output_dir(cfg, a->output_dir, &err) != ZT_OK) goto fail;

    if (zt_registry_scan(a->plugin_paths, a->n_plugin_paths, &reg, &err) != ZT_OK) goto fail;
    if (zt_plugin_set_resolve(reg, a->plugins, run_kinds(cfg), cfg, &set, &err) != ZT_OK) goto fail;
    if (record_named_plugins(cfg, &set, &err) != ZT_OK) goto fail;

    check_job job = {&set, NULL};
    run_isolated(check_probe_body, &job, 0, a->probe_timeout_s, &r);
    if (!r.completed || r.status != ZT_OK) {
        describe_child_failure(&r, "probing the plugins", a->probe_timeout_s, &err);
        goto fail;
    }

    for (int k = 1; k <= ZT_KIND_COUNT; k++) {
        const zt_loaded_plugin *lp = &set.by_kind[k];
        if (lp->plugin &&
            zt_config_add_schema(cfg, lp->desc.name, lp->plugin->options, lp->plugin->n_options, &err) != ZT_OK)
            goto fail;
    }
    if (zt_config_validate(cfg, &err) != ZT_OK) goto fail;

    job.cfg = cfg;
    run_isolated(check_init_body, &job, 0, 0, &r);
    if (!r.completed || r.status != ZT_OK) {
        describe_child_failure(&r, "initializing the plugins", 0, &err);
        goto fail;
    }

    plugins = plugins_json(&set);
    if (!plugins) {
        zt_error_set(&err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing the resolved config");
        goto fail;
    }
    if (zt_config_write_resolved(cfg, stdout, plugins, &err) != ZT_OK) goto fail;
    fflush(stdout);
    const char *output_dir = NULL;
    char path[4096];
    if (zt_config_get_string(cfg, "output_dir", &output_dir) != ZT_OK || !output_dir) {
        zt_error_set(&err, ZT_ERR_INTERNAL, "the host key output_dir has no value");
        goto fail;
    }
    if (snprintf(path, sizeof path, "%s/config.resolved.json", output_dir) >= (int)sizeof path) {
        zt_error_set(&err, ZT_ERR_CONFIG, "output_dir '%.200s...' is too long", output_dir);
        goto fail;
    }
    if (zt_mkdir_p(output_dir, "output", "choose another output_dir (--output-dir DIR)", &err) != ZT_OK) goto fail;
    if (zt_config_save_resolved(cfg, path, plugins, &err) != ZT_OK) goto fail;
    fprintf(stderr, "zt-run: check passed; resolved config saved to %s\n", path);
    status = ZT_EXIT_OK;
    goto done;
fail:
    run_error(&err);
done:
    free(plugins);
    zt_plugin_set_unload(&set);
    zt_registry_free(reg);
    zt_config_free(cfg);
    return status;
}

/* ---- training (the loop itself is framework/train/trainer.c) ------------------------------------------ */

/* Config and plugins as --check resolves them, but probed and initialized here, in the process
 * that trains. */
/* --dry-run: the memory estimate of the run do_train was about to start, for as many data-parallel
 * ranks as it would have (--nproc N, else parallel_config.data_parallel, else the launch's), printed
 * by rank 0 and written to OUTPUT_DIR/memory-estimate.json. */
static int dry_run(const run_args *a, zt_config *cfg, const zt_registry *reg, const zt_plugin_set *set,
                   zt_runtime *rt, int gpu)
{
    zt_error err;
    const zt_host *host = set->by_kind[ZT_KIND_ZERO].host;
    int64_t dp = host->world_size;
    if (a->nproc) {
        char *end;
        dp = strtol(a->nproc, &end, 10);
        if (*end || dp < 1 || dp > 65536) return usage_error("--nproc '%s' is not a number of ranks from 1 to 65536", a->nproc);
    } else if (zt_config_is_set(cfg, "parallel_config.data_parallel")) {
        zt_config_get_int(cfg, "parallel_config.data_parallel", &dp);
    }
    if (host->world_rank != 0) return ZT_EXIT_OK;
    const char *output_dir = NULL;
    char path[4096];
    if (zt_config_get_string(cfg, "output_dir", &output_dir) != ZT_OK ||
        snprintf(path, sizeof path, "%s/memory-estimate.json", output_dir) >= (int)sizeof path) {
        zt_error_set(&err, ZT_ERR_CONFIG, "output_dir is missing or too long");
        return run_error(&err);
    }
    zt_dry_run_request req = {cfg, reg, set, rt, (int32_t)dp, path, gpu};
    if (zt_mkdir_p(output_dir, "output", "choose another output_dir (--output-dir DIR)", &err) != ZT_OK) return run_error(&err);
    zt_status st = zt_dry_run(&req, stdout, &err);
    if (st == ZT_ERR_OUT_OF_MEMORY && err.msg[0]) {
        /* The table is out; the run as configured would not fit: say so as the run would, and fail. */
        fprintf(stderr, "zt-run: dry run: the estimate is also in %s\n", path);
        return run_error(&err);
    }
    if (st != ZT_OK) return run_error(&err);
    fprintf(stderr, "zt-run: dry run: nothing was trained; the estimate is also in %s\n", path);
    return ZT_EXIT_OK;
}

/* Whether a run would compute on GPUs: device cuda, or a plugin that runs only there. */
static int wants_gpu(const zt_config *cfg, const zt_plugin_set *set)
{
    const char *want = "cpu";
    if (zt_config_get_string(cfg, "device", &want) == ZT_OK && want && !strcmp(want, "cuda")) return 1;
    return plugin_without(set, ZT_CAP_CPU) != NULL;
}

/* The plugins a memory estimate initializes. */
static int estimated_kind(int kind)
{
    return kind == ZT_KIND_MODEL || kind == ZT_KIND_OPTIMIZER || kind == ZT_KIND_ZERO;
}

/* A GPU run's dry run where it cannot run (no GPU here, or a plugin without CUDA): the estimate needs
 * no device, so the model, optimizer and zero plugins are initialized on a CPU runtime and the
 * estimator is told the run is a GPU one. `why` (err) is printed as a note. */
static zt_status cpu_runtime_for_estimate(zt_error *why, int n_threads, const zt_config *cfg, zt_runtime **rt)
{
    fprintf(stderr, "zt-run: dry run: note: this GPU run cannot start here (%s); estimating it anyway\n", why->msg);
    zt_error_clear(why);
    zt_runtime_options opt;
    memset(&opt, 0, sizeof opt);
    opt.n_threads = n_threads;
    opt.device_type = ZT_DEVICE_CPU; /* ranks as launched, so only rank 0 prints */
    return zt_runtime_create(&opt, cfg, rt, why);
}

static int do_train(const run_args *a)
{
    zt_error err;
    int status = ZT_EXIT_ERROR;
    zt_registry *reg = NULL;
    zt_runtime *rt = NULL;
    char *plugins = NULL;
    zt_plugin_set set;
    memset(&set, 0, sizeof set);
    zt_config *cfg = zt_config_new();
    if (!cfg) {
        fprintf(stderr, "zt-run: error: out of memory\n");
        return ZT_EXIT_ERROR;
    }
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    if (zt_config_add_schema(cfg, "host", host_opts, n_host, &err) != ZT_OK) goto fail;
    if (a->config_path && zt_config_load_file(cfg, a->config_path, &err) != ZT_OK) goto fail;
    for (int i = 0; i < a->n_sets; i++)
        if (zt_config_set(cfg, a->sets[i], &err) != ZT_OK) goto fail;
    if (a->output_dir && set_output_dir(cfg, a->output_dir, &err) != ZT_OK) goto fail;
    if (a->gpu_mem_limit) {
        char *assignment = NULL;
        if (asprintf(&assignment, "gpu_mem_limit=%s", a->gpu_mem_limit) < 0) goto oom;
        zt_status st = zt_config_set(cfg, assignment, &err);
        free(assignment);
        if (st != ZT_OK) goto fail;
    }
    if (a->data) {
        char *assignment = NULL;
        if (asprintf(&assignment, "data.path=%s", a->data) < 0) goto oom;
        zt_status st = zt_config_set(cfg, assignment, &err);
        free(assignment);
        if (st != ZT_OK) goto fail;
    }
    if (zt_registry_scan(a->plugin_paths, a->n_plugin_paths, &reg, &err) != ZT_OK) goto fail;
    if (zt_plugin_set_resolve(reg, a->plugins, run_kinds(cfg), cfg, &set, &err) != ZT_OK) goto fail;
    if (record_named_plugins(cfg, &set, &err) != ZT_OK) goto fail;
    for (int k = 1; k <= ZT_KIND_COUNT; k++) {
        const zt_loaded_plugin *lp = &set.by_kind[k];
        if (lp->plugin &&
            zt_config_add_schema(cfg, lp->desc.name, lp->plugin->options, lp->plugin->n_options, &err) != ZT_OK)
            goto fail;
    }
    if (zt_train_configure(cfg, a->model, !a->dry_run, &err) != ZT_OK) goto fail;
    int64_t threads = 0;
    if (zt_config_get_int(cfg, "threads", &threads) != ZT_OK) threads = 0;
    int estimate_only = 0; /* a dry run estimating a GPU run on a CPU runtime */
    if (create_runtime(cfg, &set, (int)threads, 0, &rt, &err) != ZT_OK) {
        if (!a->dry_run || !wants_gpu(cfg, &set)) goto fail;
        if (cpu_runtime_for_estimate(&err, (int)threads, cfg, &rt) != ZT_OK) goto fail;
        estimate_only = 1;
    }
    for (int k = 1; k <= ZT_KIND_COUNT; k++)
        if (set.by_kind[k].plugin && (!estimate_only || estimated_kind(k)) &&
            zt_plugin_probe(&set.by_kind[k], rt, &err) != ZT_OK)
            goto fail;
    for (int k = 1; k <= ZT_KIND_COUNT; k++)
        if (set.by_kind[k].plugin && (!estimate_only || estimated_kind(k)) &&
            zt_plugin_init(&set.by_kind[k], rt, &err) != ZT_OK)
            goto fail;
    int on_gpu = set.by_kind[ZT_KIND_ZERO].host && set.by_kind[ZT_KIND_ZERO].host->device->device_type != ZT_DEVICE_CPU;
    if (a->dry_run) {
        status = dry_run(a, cfg, reg, &set, rt, on_gpu || estimate_only);
        goto done;
    }
    if (on_gpu) {
        /* Before anything big is allocated: refuse a run the estimate says cannot fit, and give the
         * allocator the estimate for its own out-of-memory message. */
        const zt_host *zh = set.by_kind[ZT_KIND_ZERO].host;
        zt_dry_run_request check = {cfg, reg, &set, rt, zh->world_size, NULL, 1};
        if (zt_memory_check(&check, &err) != ZT_OK) goto fail;
    }
    if (!(plugins = plugins_json(&set))) goto oom;
    zt_train_request req = {cfg, &set, rt, plugins, a->resume, a->model, a->export_dir};
    zt_status st = zt_train_run(&req, &err);
    if (st == ZT_ERR_CANCELLED) {
        fprintf(stderr, "zt-run: %s\n", err.msg);
        status = ZT_EXIT_INTERRUPTED;
    } else if (st != ZT_OK) {
        run_error(&err);
    } else {
        status = ZT_EXIT_OK;
    }
    goto done;
oom:
    zt_error_set(&err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
fail:
    run_error(&err);
done:
    free(plugins);
    zt_plugin_set_unload(&set); /* fini before the runtime that served them goes */
    zt_runtime_destroy(rt);
    zt_registry_free(reg);
    zt_config_free(cfg);
    return status;
}

/* ---- --generate (framework/generate/generate.c) ---------------------------------------------------------- */

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
    g->data = a->data;
    zt_generate_settings settings;
    zt_error err;
    if (zt_generate_check(g, &settings, &err) != ZT_OK) return usage_error("%s", err.msg);
    return zt_generate_run(g, &settings, &err) == ZT_OK ? ZT_EXIT_OK : run_error(&err);
}

int main(int argc, char **argv)
{
    run_args a;
    int status = parse_args(argc, argv, &a);
    if (status < 0 && a.nproc && !a.dry_run) {
        /* Returns only on failure, or for --nproc 1 (the run stays in this process). */
        zt_error err;
        zt_status st = zt_launch_local(a.nproc, argc, argv, &err);
        if (st != ZT_OK) status = st == ZT_ERR_INVALID_ARG ? usage_error("%s", err.msg) : run_error(&err);
    }
    if (status < 0) {
        switch (a.action) {
        case OPT_LIST_PLUGINS: status = do_list_plugins(&a, 0); break;
        case OPT_DESCRIBE: status = do_describe(&a); break;
        case OPT_ENV: status = do_list_plugins(&a, 1); break;
        case OPT_CHECK: status = do_check(&a); break;
        case OPT_GENERATE: status = do_generate(&a); break;
        default: status = do_train(&a); break;
        }
    }
    free(a.plugin_paths);
    free(a.sets);
    return status;
}
