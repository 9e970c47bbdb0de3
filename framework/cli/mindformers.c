/* MindFormers' launcher flags on zt-run (cli.h, docs/cli.md "MindFormers compatibility"): the flags of
 * `python run_mindformer.py --config run.yaml --use_parallel True --device_num 8 --run_mode finetune
 * --load_checkpoint PATH`, and the launch keys of a MindFormers YAML config (use_parallel, run_mode,
 * load_checkpoint, resume_training), which name what zt-run's own options say:
 *
 *   --device_num N (use_parallel not false)   --nproc N (under a launcher: must be its rank count)
 *   --run_mode train | finetune               training (finetune needs weights to start from)
 *   --run_mode predict                        --generate
 *   --run_mode eval                           refused: zt evaluates during training (eval.every)
 *   load_checkpoint DIR                       --model DIR (a Hugging Face model directory) or
 *                                             --resume DIR (a zt checkpoint or checkpoint root)
 *   load_checkpoint FILE.ckpt                 refused: zt cannot read MindSpore checkpoints
 *
 * As in run_mindformer.py, a flag wins over the config's key. zt's own options stay primary: a flag
 * that disagrees with one of them is refused, naming both.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "base/log.h"
#include "cli/cli.h"
#include "dist/launch.h"

/* A launch setting: its value as given, where it was given ("--run_mode", "run.yaml:8:11"), and whether
 * that was the command line (a usage error) or the config (a config error). */
typedef struct setting {
    const char *value;
    const char *where;
    int flag;
} setting;

static int g_speaks = 1; /* rank 0, or a single process: the one that logs the notes */

static void note(const char *fmt, ...) ZT_PRINTF(1, 2);
static void note(const char *fmt, ...)
{
    if (!g_speaks) return;
    va_list ap;
    va_start(ap, fmt);
    zt_logv(ZT_LOG_INFO, NULL, fmt, ap);
    va_end(ap);
}

/* The message, as a usage error (a flag) or as a config error. */
static int refuse(const setting *s, const char *fmt, ...) ZT_PRINTF(2, 3);
static int refuse(const setting *s, const char *fmt, ...)
{
    zt_error err;
    va_list ap;
    va_start(ap, fmt);
    char msg[ZT_ERROR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (s->flag) return zt_cli_usage_error("%s", msg);
    zt_error_set(&err, ZT_ERR_CONFIG, "%s", msg);
    return zt_cli_run_error(&err);
}

/* The flag when given, else the config's key. */
static setting pick(const char *flag_value, const char *flag_name, const zt_config *cfg, const char *key)
{
    setting s = {flag_value, flag_name, 1};
    if (flag_value || !cfg) return s;
    const char *place = NULL;
    s.value = zt_config_launch_key(cfg, key, &place);
    s.where = place;
    s.flag = 0;
    if (s.value && !*s.value) s.value = NULL; /* null or '': not given */
    return s;
}

/* MindFormers' str2bool: true or false, in any case. -1 when neither. */
static int boolean(const char *s)
{
    if (!strcasecmp(s, "true")) return 1;
    if (!strcasecmp(s, "false")) return 0;
    return -1;
}

static int has_file(const char *dir, const char *name)
{
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0;
}

/* A MindSpore checkpoint directory: *.ckpt files, or rank_N directories of them. */
static int has_mindspore_checkpoints(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        found = (n > 5 && !strcmp(e->d_name + n - 5, ".ckpt")) || !strncmp(e->d_name, "rank_", 5);
    }
    closedir(d);
    return found;
}

static const char k_mindspore_ckpt[] =
    "zt cannot read MindSpore checkpoints: convert it to a Hugging Face model directory (config.json and "
    "model.safetensors; MindFormers' conversion scripts write one for its models) and give that directory";

/* load_checkpoint as --model or --resume, by what `s->value` holds. */
static int map_checkpoint(run_args *a, const setting *s, const setting *resume)
{
    const char *path = s->value;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return refuse(s, "load_checkpoint '%s' (%s): no such file or directory", path, s->where);
    size_t n = strlen(path);
    int want_resume = resume->value ? boolean(resume->value) : -1;
    if (S_ISREG(sb.st_mode)) {
        if (n > 5 && !strcmp(path + n - 5, ".ckpt"))
            return refuse(s, "load_checkpoint '%s' (%s) is a MindSpore checkpoint: %s", path, s->where, k_mindspore_ckpt);
        if (n > 4 && !strcmp(path + n - 4, ".bin") && a->action == OPT_GENERATE) {
            a->model = path; /* a llama2.c model, which generation reads */
            note("load_checkpoint %s (%s) is zt-run --model %s", path, s->where, path);
            return -1;
        }
        return refuse(s, "load_checkpoint '%s' (%s) is a file: give the directory of a Hugging Face model "
                      "(config.json and safetensors) or of a zt checkpoint", path, s->where);
    }
    int hf = has_file(path, "config.json");
    int zt = has_file(path, "checkpoint.json") || has_file(path, "latest");
    if (!hf && !zt) {
        if (has_mindspore_checkpoints(path))
            return refuse(s, "load_checkpoint '%s' (%s) holds MindSpore checkpoints (.ckpt): %s", path, s->where,
                          k_mindspore_ckpt);
        return refuse(s, "load_checkpoint '%s' (%s) is neither a Hugging Face model directory (config.json) nor a "
                      "zt checkpoint (checkpoint.json, or a checkpoint root with 'latest')", path, s->where);
    }
    if (hf && want_resume == 1)
        return refuse(resume, "resume_training is true (%s), but load_checkpoint '%s' is a Hugging Face model "
                      "directory, which holds no optimizer state or step to resume: set resume_training to false to "
                      "fine-tune from it", resume->where, path);
    if (zt && want_resume == 0)
        return refuse(resume, "resume_training is false (%s): MindFormers would start a new run from the weights of "
                      "the checkpoint '%s'; zt starts new runs from Hugging Face weights only. Set resume_training to "
                      "true to continue that run (zt-run --resume %s), or start from an exported model (--export)",
                      resume->where, path, path);
    const char **slot = hf ? &a->model : &a->resume;
    const char *other = hf ? a->resume : a->model;
    if (*slot && strcmp(*slot, path))
        return refuse(s, "load_checkpoint '%s' (%s) and %s %s both name the weights to start from: give one (zt's "
                      "option is %s)", path, s->where, hf ? "--model" : "--resume", *slot, hf ? "--model" : "--resume");
    if (other)
        return refuse(s, "load_checkpoint '%s' (%s) is %s, and %s %s is given too: give one of them", path, s->where,
                      hf ? "a Hugging Face model (--model)" : "a zt checkpoint (--resume)", hf ? "--resume" : "--model",
                      other);
    *slot = path;
    note("load_checkpoint %s (%s) is zt-run %s %s", path, s->where, hf ? "--model" : "--resume", path);
    return -1;
}

/* --device_num and use_parallel against the launch and --nproc. */
static int map_ranks(run_args *a, const setting *use_parallel, const setting *device_num)
{
    int parallel = -1;
    if (use_parallel->value && (parallel = boolean(use_parallel->value)) < 0)
        return refuse(use_parallel, "%s '%s': expected True or False", use_parallel->where, use_parallel->value);
    zt_launch launch;
    zt_error err;
    if (zt_launch_detect(&launch, &err) != ZT_OK) launch.world_size = 1; /* the run reports it */
    long nproc = a->nproc ? strtol(a->nproc, NULL, 10) : 0;
    if (device_num->value) {
        char *end;
        long n = strtol(device_num->value, &end, 10);
        if (*end || end == device_num->value || n < 1 || n > 65536)
            return refuse(device_num, "--device_num '%s': expected a number of ranks from 1 to 65536", device_num->value);
        if (parallel == 0 && n > 1)
            return refuse(device_num, "--device_num %ld asks for %ld ranks, but use_parallel is False (%s): give "
                          "--use_parallel True, or drop --device_num", n, n, use_parallel->where);
        if (launch.world_size > 1) {
            if (n != launch.world_size)
                return refuse(device_num, "--device_num %ld, but this process is rank %d of %d (from %s): give "
                              "--device_num %d, or drop it", n, launch.rank, launch.world_size, launch.launcher,
                              launch.world_size);
            return -1;
        }
        if (n > 1 && a->action == OPT_GENERATE)
            return refuse(device_num, "--device_num %ld: generation (--run_mode predict) runs in one process", n);
        if (a->nproc && nproc != n)
            return refuse(device_num, "--device_num %ld and --nproc %s disagree: give one (zt's option is --nproc)", n,
                          a->nproc);
        if (n > 1 && !a->nproc) {
            a->nproc = device_num->value;
            note("--device_num %ld is zt-run --nproc %ld", n, n);
        }
        return -1;
    }
    if (parallel == 0 && (launch.world_size > 1 || nproc > 1))
        return refuse(use_parallel, "use_parallel is False (%s), but the run has %ld ranks (%s): set use_parallel to "
                      "True, or run one process", use_parallel->where,
                      launch.world_size > 1 ? (long)launch.world_size : nproc,
                      launch.world_size > 1 ? launch.launcher : "--nproc");
    if (parallel == 1 && launch.world_size == 1 && nproc <= 1 && a->action != OPT_GENERATE)
        note("use_parallel is True (%s), but nothing gives the number of ranks: zt-run runs one process; "
             "--device_num N (zt's --nproc N) or a launcher (mpirun, torchrun) starts N", use_parallel->where);
    return -1;
}

/* --run_mode predict: zt-run --generate, which reads the model from --model or --resume. The options
 * that only training reads are refused here, naming --run_mode, before the parser's own checks. */
static int to_generate(run_args *a, int *given)
{
    static const int training[] = {OPT_NPROC, OPT_EXPORT, OPT_DRY_RUN, OPT_GPU_MEM_LIMIT, OPT_OUTPUT_DIR};
    static const char *const names[] = {"--nproc", "--export", "--dry-run", "--gpu-mem-limit", "--output-dir"};
    for (size_t k = 0; k < sizeof training / sizeof training[0]; k++)
        if (given[training[k]])
            return zt_cli_usage_error("--run_mode predict is zt-run --generate, where %s has no effect", names[k]);
    if (a->action >= 0 && a->action != OPT_GENERATE)
        return zt_cli_usage_error("--run_mode predict (zt's --generate) and --%s are separate actions; give one",
                                  a->action == OPT_CHECK ? "check" : "list-plugins");
    a->action = OPT_GENERATE;
    if (a->config_path) {
        if (!zt_config_path_is_yaml(a->config_path))
            return zt_cli_usage_error("--config %s has no effect with --run_mode predict (zt-run --generate): the model's "
                                      "shape comes from --load_checkpoint / --model DIR; drop --config",
                                      a->config_path);
        note("--run_mode predict is zt-run --generate: of %s it reads load_checkpoint only (the model's shape is "
             "that directory's config.json)", a->config_path);
        a->config_path = NULL;
        given[OPT_CONFIG] = 0;
    }
    return -1;
}

int zt_cli_mindformers(run_args *a, int *given)
{
    int flags = a->mf.use_parallel || a->mf.device_num || a->mf.run_mode || a->mf.load_checkpoint;
    int yaml = a->config_path && zt_config_path_is_yaml(a->config_path);
    int inspecting = a->action == OPT_LIST_PLUGINS || a->action == OPT_DESCRIBE || a->action == OPT_ENV;
    if (inspecting && flags) {
        const char *flag = a->mf.use_parallel ? "--use_parallel" : a->mf.device_num ? "--device_num"
                           : a->mf.run_mode   ? "--run_mode"
                                              : "--load_checkpoint";
        return zt_cli_usage_error("%s is for runs and has no effect with --%s", flag,
                                  a->action == OPT_ENV ? "env" : a->action == OPT_DESCRIBE ? "describe" : "list-plugins");
    }
    if (inspecting || (!flags && !yaml) || (a->action == OPT_GENERATE && !flags)) return -1;
    if (a->action == OPT_GENERATE) yaml = 0; /* the parser refuses --config with --generate */
    zt_launch launch;
    zt_error err;
    if (zt_launch_detect(&launch, &err) == ZT_OK && launch.world_size > 1) g_speaks = launch.rank == 0;

    /* the config's launch keys: read here, before the run reads the config (and reports its problems) */
    zt_config *cfg = NULL;
    if (yaml) {
        cfg = zt_config_new();
        if (!cfg) {
            fprintf(stderr, "zt-run: error: out of memory\n");
            return ZT_EXIT_ERROR;
        }
        if (zt_config_load_file(cfg, a->config_path, &err) != ZT_OK) {
            zt_config_free(cfg);
            return zt_cli_run_error(&err);
        }
    }
    int status = -1;
    setting use_parallel = pick(a->mf.use_parallel, "--use_parallel", cfg, "use_parallel");
    setting device_num = {a->mf.device_num, "--device_num", 1};
    setting run_mode = pick(a->mf.run_mode, "--run_mode", cfg, "run_mode");
    setting load = pick(a->mf.load_checkpoint, "--load_checkpoint", cfg, "load_checkpoint");
    setting resume = pick(NULL, NULL, cfg, "resume_training");
    static const char *const modes[] = {"train", "finetune", "predict", "eval"};
    int mode = -1;
    for (int k = 0; run_mode.value && k < 4; k++)
        if (!strcmp(run_mode.value, modes[k])) mode = k;
    if (run_mode.value && mode < 0)
        status = refuse(&run_mode, "run_mode '%s' (%s): expected train, finetune, predict or eval", run_mode.value,
                        run_mode.where);
    else if (mode == 3)
        status = refuse(&run_mode, "run_mode eval (%s): zt has no evaluation-only run; training evaluates on the data "
                        "set's held-out split every eval.every steps (--set eval.every=N), and zt-run --generate shows "
                        "a model's answers", run_mode.where);
    else if (mode == 2 && !run_mode.flag)
        status = refuse(&run_mode, "run_mode predict (%s): zt-run trains unless it generates: run zt-run --generate "
                        "(or --run_mode predict) for that, or set run_mode to train or finetune", run_mode.where);
    else if (mode == 2)
        status = to_generate(a, given);
    else if (mode >= 0 && a->action == OPT_GENERATE)
        status = refuse(&run_mode, "run_mode %s (%s) trains, but --generate generates: give one", run_mode.value,
                        run_mode.where);
    if (status < 0) status = map_ranks(a, &use_parallel, &device_num);
    if (status < 0 && load.value && a->action == OPT_CHECK)
        note("load_checkpoint %s (%s) is read by training runs; --check loads no weights", load.value, load.where);
    else if (status < 0 && load.value)
        status = map_checkpoint(a, &load, &resume);
    if (status < 0 && mode == 1 && a->action < 0 && !a->model && !a->resume)
        status = refuse(&run_mode, "run_mode finetune (%s) starts from trained weights, but none are given: give "
                        "--load_checkpoint DIR (a Hugging Face model directory: zt's --model DIR)", run_mode.where);
    zt_config_free(cfg);
    return status;
}
