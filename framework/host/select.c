/* The one place that decides what a run loads and where it computes (docs/plugins.md, "Defaults";
 * docs/gpu.md, "device"):
 *   - the plugins named in --plugins, each checked against the config key that would otherwise
 *     choose its kind (optimizer.type, zero_optimization.stage);
 *   - a default for every kind the run needs and the user did not name: the tokenizer sentencepiece,
 *     the model llama, the optimizer optimizer.type names, zero_optimization.stage's zeroN, and the
 *     attention the device calls for (flash for GPU training, naive elsewhere), and the parallel
 *     plugin once parallel_config.model_parallel or .pipeline_stage is above 1;
 *   - what --plugins chose, recorded back into the config (the resolved config says what runs);
 *   - the device (device = auto | cpu | cuda, against the plugins' ZT_CAP_CPU / ZT_CAP_CUDA).
 * The keys that choose plugins are read here before validation: which plugins load decides which
 * schemas there are to validate against.
 */
#define _GNU_SOURCE
#include "host/select.h"

#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/args.h"
#include "base/log.h"
#include "device/device.h"

/* ---- the plugins of a run ----------------------------------------------------------------------- */

/* optimizer.type as a plugin name: DeepSpeed writes "AdamW", zt plugins are lower case. Returns 1
 * when the user set it (name filled), 0 when not, -1 on a bad value (err set). */
static int config_optimizer_name(const zt_config *cfg, char *name, size_t cap, zt_error *err)
{
    const char *value = NULL;
    if (!cfg || !zt_config_is_set(cfg, "optimizer.type")) return 0;
    if (zt_config_get_string(cfg, "optimizer.type", &value) != ZT_OK || !value) {
        zt_error_set(err, ZT_ERR_CONFIG, "optimizer.type must be a string naming an optimizer, e.g. \"AdamW\"");
        return -1;
    }
    zt_select_optimizer_plugin(value, name, cap);
    if (!zt_plugin_name_valid(name)) {
        zt_error_set(err, ZT_ERR_CONFIG,
                     "optimizer.type = \"%.80s\" is not an optimizer plugin name (e.g. \"AdamW\" selects the "
                     "plugin adamw); to load a plugin from a path, put the path in --plugins",
                     value);
        return -1;
    }
    return 1;
}

/* zero_optimization.stage: 1 when set (stage filled), 0 when not, -1 on a bad value. The schema
 * holds the range too; this runs before validation, since the stage chooses a plugin. */
static int config_zero_stage(const zt_config *cfg, int64_t *stage, zt_error *err)
{
    if (!cfg || !zt_config_is_set(cfg, "zero_optimization.stage")) return 0;
    if (zt_config_get_int(cfg, "zero_optimization.stage", stage) != ZT_OK || *stage < 0 || *stage > 3) {
        zt_error_set(err, ZT_ERR_CONFIG, "zero_optimization.stage must be 0, 1, 2 or 3 (as in DeepSpeed)");
        return -1;
    }
    return 1;
}

/* A plugin the user named must agree with the config keys that would otherwise select one. */
static zt_status check_named_against_config(const zt_plugin_set *set, const zt_config *cfg, zt_error *err)
{
    const zt_loaded_plugin *opt = &set->by_kind[ZT_KIND_OPTIMIZER];
    char wanted[64];
    if (opt->plugin) {
        int r = config_optimizer_name(cfg, wanted, sizeof wanted, err);
        if (r < 0) return ZT_ERR_CONFIG;
        if (r > 0 && strcmp(wanted, opt->desc.name))
            return zt_error_set(err, ZT_ERR_CONFIG,
                                "--plugins names the optimizer '%s' but the config sets optimizer.type to an "
                                "optimizer called '%s': make them agree, or drop one of them",
                                opt->desc.name, wanted);
    }
    const zt_loaded_plugin *zero = &set->by_kind[ZT_KIND_ZERO];
    int64_t stage;
    if (zero->plugin) {
        int r = config_zero_stage(cfg, &stage, err);
        if (r < 0) return ZT_ERR_CONFIG;
        int32_t plugin_stage = ((const zt_zero_ops *)zero->plugin->ops)->stage;
        if (r > 0 && stage != plugin_stage)
            return zt_error_set(err, ZT_ERR_CONFIG,
                                "--plugins names '%s', a ZeRO stage %d plugin, but the config sets "
                                "zero_optimization.stage = %lld: make them agree, or drop one of them",
                                zero->desc.name, (int)plugin_stage, (long long)stage);
    }
    return ZT_OK;
}

/* How many CUDA GPUs this process could use (0: none, `why` says why), asked in a short-lived
 * child: initializing CUDA in this process before zt-run forks its plugin probes (--check) would
 * leave the driver unusable in those children. A child that does not answer within a minute (a
 * wedged driver) is killed and counts as no GPU. */
static int usable_gpus(char *why, size_t cap)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, cap, "cannot look for a GPU (pipe: %s)", strerror(errno));
        return 0;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, cap, "cannot look for a GPU (fork: %s)", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return 0;
    }
    if (pid == 0) {
        close(fds[0]);
        zt_error e;
        int n = 0;
        char msg[ZT_ERROR_MSG_MAX + 32];
        int len = zt_device_cuda_count(&n, &e) == ZT_OK ? snprintf(msg, sizeof msg, "%d ", n)
                                                            : snprintf(msg, sizeof msg, "0 %s", e.msg);
        if (len > (int)sizeof msg - 1) len = (int)sizeof msg - 1;
        ssize_t done = write(fds[1], msg, (size_t)len);
        _exit(done == len ? 0 : 1);
    }
    close(fds[1]);
    char buf[ZT_ERROR_MSG_MAX + 32];
    size_t got = 0;
    int timed_out = 0;
    for (;;) {
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        int ready = poll(&pfd, 1, 60 * 1000);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) {
            timed_out = 1;
            kill(pid, SIGKILL);
            break;
        }
        ssize_t r = read(fds[0], buf + got, sizeof buf - 1 - got);
        if (r > 0 && (got += (size_t)r) < sizeof buf - 1) continue;
        if (r < 0 && errno == EINTR) continue;
        break;
    }
    close(fds[0]);
    buf[got] = '\0';
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (timed_out) {
        snprintf(why, cap, "looking for a GPU (the CUDA driver, in a child process) did not answer within 60 s; "
                 "check the driver with nvidia-smi, or set device = cpu");
        return 0;
    }
    char *rest = NULL;
    long n = strtol(buf, &rest, 10);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || rest == buf) {
        snprintf(why, cap, "looking for a GPU crashed or failed (in a child process)%s%.1000s", got ? ": " : "",
                 got ? buf : "");
        return 0;
    }
    snprintf(why, cap, "%.2000s", n > 0 ? "" : (*rest == ' ' ? rest + 1 : rest));
    return n > 0 ? (int)n : 0;
}

/* The default attention (docs/gpu.md): flash where training computes on a GPU, naive elsewhere.
 * device = auto decides here what zt_select_device decides for the run: flash when every plugin
 * resolved so far can run on CUDA, flash is installed and a GPU is usable. The choice and the reason
 * are logged, since they decide the run's speed. */
static void default_attention(const zt_registry *reg, const zt_plugin_set *so_far, unsigned needed_kinds,
                              const zt_config *cfg, char *name, size_t cap, char *source, size_t source_cap)
{
    const char *device = "cpu";
    if (!cfg || zt_config_get_string(cfg, "device", &device) != ZT_OK) device = "cpu"; /* as zt_select_device */
    int flash_installed = 0;
    for (int i = 0; i < zt_registry_count(reg); i++) {
        const zt_plugin_desc *d = zt_registry_at(reg, i);
        if (!strcmp(d->name, "flash") && d->kind == ZT_KIND_ATTENTION) flash_installed = 1;
    }
    const char *cpu_only = NULL;
    for (int k = 1; k <= ZT_KIND_COUNT && !cpu_only; k++) {
        const zt_loaded_plugin *lp = &so_far->by_kind[k];
        if (k != ZT_KIND_TOKENIZER && lp->plugin && !(lp->plugin->caps & ZT_CAP_CUDA)) cpu_only = lp->desc.name;
    }
    snprintf(name, cap, "naive");
    if (!(needed_kinds & (1u << ZT_KIND_OPTIMIZER))) {
        snprintf(source, source_cap, "the default attention of runs that do not train (naive: on the CPU, with a "
                 "KV cache)");
    } else if (!strcmp(device, "cuda")) {
        if (flash_installed) snprintf(name, cap, "flash");
        snprintf(source, source_cap, "the default attention of GPU runs (device = cuda)%s",
                 flash_installed ? "" : "; flash is not installed, so the unfused naive reference");
    } else if (!strcmp(device, "auto")) {
        char why[2200], detail[2048];
        int gpus = 0;
        if (cpu_only)
            snprintf(why, sizeof why, "plugin '%.64s' runs on the CPU only, so the run computes on the CPU", cpu_only);
        else if (!flash_installed)
            snprintf(why, sizeof why, "the flash plugin is not installed");
        else if ((gpus = usable_gpus(detail, sizeof detail)) > 0)
            snprintf(name, cap, "flash");
        else
            snprintf(why, sizeof why, "no usable GPU: %.2040s", detail);
        if (gpus > 0)
            snprintf(source, source_cap, "the default attention of device = auto: %d usable GPU%s and flash installed",
                     gpus, gpus == 1 ? "" : "s");
        else
            snprintf(source, source_cap, "the default attention of device = auto: %.2200s", why);
    } else {
        snprintf(source, source_cap, "the default attention on the CPU (device = %.64s)", device);
    }
    if (needed_kinds & (1u << ZT_KIND_OPTIMIZER)) /* training; generation always takes naive */
        zt_log(ZT_LOG_INFO, "attention: %s ('%s')", source, name);
}

/* The documented default of a kind (docs/plugins.md). `source` says where it came from, for
 * messages. so_far: the plugins resolved before this kind (attention's default depends on them).
 * Returns ZT_OK with name filled, ZT_ERR_NOT_FOUND when the kind has no default. */
static zt_status default_plugin(int kind, const zt_registry *reg, const zt_plugin_set *so_far, unsigned needed_kinds,
                                const zt_config *cfg, char *name, size_t cap, char *source, size_t source_cap,
                                zt_error *err)
{
    int64_t stage = 0;
    int r;
    switch (kind) {
    case ZT_KIND_TOKENIZER:
        snprintf(name, cap, "sentencepiece");
        snprintf(source, source_cap, "the default tokenizer");
        return ZT_OK;
    case ZT_KIND_MODEL:
        snprintf(name, cap, "llama");
        snprintf(source, source_cap, "the default model");
        return ZT_OK;
    case ZT_KIND_ATTENTION:
        default_attention(reg, so_far, needed_kinds, cfg, name, cap, source, source_cap);
        return ZT_OK;
    case ZT_KIND_OPTIMIZER:
        r = config_optimizer_name(cfg, name, cap, err);
        if (r < 0) return ZT_ERR_CONFIG;
        if (r == 0) snprintf(name, cap, "adamw");
        snprintf(source, source_cap, r ? "the optimizer selected by optimizer.type"
                                       : "the default optimizer (optimizer.type is not set)");
        return ZT_OK;
    case ZT_KIND_ZERO:
        r = config_zero_stage(cfg, &stage, err);
        if (r < 0) return ZT_ERR_CONFIG;
        zt_select_zero_plugin((int)stage, name, cap);
        snprintf(source, source_cap, r ? "the ZeRO plugin for zero_optimization.stage = %d"
                                       : "the default ZeRO plugin (zero_optimization.stage is not set: %d)",
                 (int)stage);
        return ZT_OK;
    case ZT_KIND_PARALLEL:
        snprintf(name, cap, "parallel");
        snprintf(source, source_cap, "the parallel plugin of a parallel_config with model_parallel or "
                 "pipeline_stage above 1");
        return ZT_OK;
    }
    return ZT_ERR_NOT_FOUND;
}

zt_status zt_plugin_set_resolve(const zt_registry *reg, const char *list, unsigned needed_kinds,
                                const zt_config *cfg, zt_plugin_set *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    zt_status st = ZT_OK;
    char *copy = strdup(list ? list : "");
    if (!copy) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory resolving plugins");

    /* 1. What the user named, in order. */
    int position = 0;
    for (char *token = copy; token && st == ZT_OK; position++) {
        char *comma = strchr(token, ',');
        if (comma) *comma = '\0';
        char *name = zt_trim(token);
        token = comma ? comma + 1 : NULL;
        if (!*name) {
            if (!comma && position == 0) break; /* an empty list */
            st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                              "--plugins '%s': entry %d is empty; separate plugin names with single commas",
                              list, position + 1);
            break;
        }
        zt_loaded_plugin lp;
        st = zt_plugin_load(reg, name, &lp, err);
        if (st != ZT_OK) break;
        zt_loaded_plugin *slot = &out->by_kind[lp.desc.kind];
        if (slot->plugin) {
            st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                              "--plugins names two %s plugins, '%s' (%s) and '%s' (%s): a run uses one plugin "
                              "per kind; keep one of them",
                              zt_kind_name(lp.desc.kind), slot->desc.name, slot->desc.library, lp.desc.name,
                              lp.desc.library);
            zt_plugin_unload(&lp);
            break;
        }
        *slot = lp;
    }
    free(copy);
    if (st == ZT_OK) st = check_named_against_config(out, cfg, err);

    /* 2. Defaults for the kinds the program needs and the user did not name. */
    for (int k = 1; k <= ZT_KIND_COUNT && st == ZT_OK; k++) {
        if (!(needed_kinds & (1u << k)) || out->by_kind[k].plugin) continue;
        char name[64], source[ZT_ERROR_MSG_MAX / 2];
        st = default_plugin(k, reg, out, needed_kinds, cfg, name, sizeof name, source, sizeof source, err);
        if (st == ZT_ERR_NOT_FOUND) {
            st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                              "this run needs %s %s plugin%s, and that kind has no default: name one in "
                              "--plugins (zt-run --list-plugins shows the installed ones)",
                              zt_kind_article(k), zt_kind_name(k),
                              k == ZT_KIND_PARALLEL ? " (a parallel_config size is above 1)" : "");
            break;
        }
        if (st != ZT_OK) break;
        zt_loaded_plugin lp;
        zt_error load_err;
        st = zt_plugin_load(reg, name, &lp, &load_err);
        if (st == ZT_ERR_NOT_FOUND) {
            zt_error_set(err, st,
                         "no %s plugin was named in --plugins, so zt uses %s, '%s', which is not installed. "
                         "Install it, or name another %s plugin in --plugins.\n%s",
                         zt_kind_name(k), source, name, zt_kind_name(k), load_err.msg);
            break;
        }
        if (st != ZT_OK) {
            zt_error_set(err, st, "%s, '%s': %s", source, name, load_err.msg);
            break;
        }
        if (lp.desc.kind != k) {
            st = zt_error_set(err, ZT_ERR_CONFIG, "%s, '%s', is %s %s plugin, not %s %s plugin", source, name,
                              zt_kind_article(lp.desc.kind), zt_kind_name(lp.desc.kind), zt_kind_article(k),
                              zt_kind_name(k));
            zt_plugin_unload(&lp);
            break;
        }
        out->by_kind[k] = lp;
    }
    if (st != ZT_OK) zt_plugin_set_unload(out);
    return st;
}

/* ---- what --plugins chose, in the config --------------------------------------------------------- */

/* The plugin kinds this run loads: what training needs, plus a parallel plugin once a tensor or
 * pipeline size is above 1 (data parallelism alone needs none: every rank is a data-parallel rank). */
unsigned zt_select_run_kinds(const zt_config *cfg)
{
    static const char *const sizes[] = {"parallel_config.model_parallel", "parallel_config.pipeline_stage"};
    unsigned kinds = ZT_TRAINING_KINDS;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int64_t n;
        if (zt_config_get_int(cfg, sizes[i], &n) == ZT_OK && n > 1) kinds |= 1u << ZT_KIND_PARALLEL;
    }
    return kinds;
}

/* A plugin named in --plugins stands for the config key that would otherwise select it. When the
 * config (unset, so at its default) names another, record the plugin's choice, so the resolved
 * config says what actually runs. Resolution has already refused a named plugin that contradicts
 * a key the user set, and a default plugin agrees with the config by construction. */
zt_status zt_select_record(zt_config *cfg, const zt_plugin_set *set, zt_error *err)
{
    const zt_loaded_plugin *opt = &set->by_kind[ZT_KIND_OPTIMIZER], *zero = &set->by_kind[ZT_KIND_ZERO];
    zt_status st = ZT_OK;
    const char *type = NULL;
    char chosen[64] = "";
    if (opt->plugin && zt_config_get_string(cfg, "optimizer.type", &type) == ZT_OK)
        zt_select_optimizer_plugin(type, chosen, sizeof chosen);
    if (opt->plugin && type && strcmp(chosen, opt->desc.name))
        st = zt_config_put_string(cfg, "optimizer.type", opt->desc.name, "--plugins", ZT_CONFIG_RANK_FILE, err);
    int64_t stage;
    int32_t plugin_stage = zero->plugin ? ((const zt_zero_ops *)zero->plugin->ops)->stage : 0;
    if (st == ZT_OK && zero->plugin && zt_config_get_int(cfg, "zero_optimization.stage", &stage) == ZT_OK &&
        stage != plugin_stage)
        st = zt_config_put_int(cfg, "zero_optimization.stage", plugin_stage, "--plugins", ZT_CONFIG_RANK_FILE, err);
    return st;
}

void zt_select_zero_plugin(int stage, char *name, size_t cap) { snprintf(name, cap, "zero%d", stage); }

void zt_select_optimizer_plugin(const char *type, char *name, size_t cap)
{
    snprintf(name, cap, "%s", type);
    for (char *c = name; *c; c++) *c = (char)tolower((unsigned char)*c);
    /* DeepSpeed's "Adam" is its FusedAdam, AdamW or Adam with L2 decay by adam_w_mode: the adamw plugin's */
    if (!strcmp(name, "adam")) snprintf(name, cap, "adamw");
}

/* ---- the device -------------------------------------------------------------------------------- */

const zt_loaded_plugin *zt_plugin_set_without(const zt_plugin_set *set, uint64_t cap)
{
    for (int k = 1; k <= ZT_KIND_COUNT; k++)
        if (k != ZT_KIND_TOKENIZER && set->by_kind[k].plugin && !(set->by_kind[k].plugin->caps & cap))
            return &set->by_kind[k];
    return NULL;
}

zt_status zt_select_device(const zt_host_settings *settings, const zt_plugin_set *set, int *device_type,
                           zt_error *err)
{
    *device_type = ZT_DEVICE_CPU;
    if (!settings || !set) return ZT_OK;
    const char *want = settings->device == ZT_DEVICE_SETTING_CUDA  ? "cuda"
                       : settings->device == ZT_DEVICE_SETTING_CPU ? "cpu"
                                                                   : "auto";
    const zt_loaded_plugin *cpu_only = zt_plugin_set_without(set, ZT_CAP_CUDA), *gpu_only = zt_plugin_set_without(set, ZT_CAP_CPU);
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
