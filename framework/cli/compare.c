/* zt-run --compare KEY=V1,V2 [--compare KEY2=...] <training options> (docs/compare.md): every
 * combination of the keys' values, first value of each key first (the last key varies fastest),
 * validated as the training action validates its config before anything runs, then each run in a
 * child zt-run of its own: a dry run for the estimate, then a few steps of training. A combination
 * that does not fit, or fails, is a row of the table saying so; Ctrl-C stops the child and leaves
 * the table of those that finished. compare_table.c reads the children's files and writes it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "base/log.h"
#include "cli/cli.h"
#include "cli/compare.h"
#include "dist/launch.h"
#include "train/estimate.h"
#include "train/trainer.h"

#define DEFAULT_TIMED_STEPS 5
#define DEFAULT_WARMUP_STEPS 2
#define MAX_COMPARE_STEPS 100000

/* ---- --compare KEY=V1,V2 ------------------------------------------------------------------------- */

/* Keys a combination cannot vary: the comparison sets them itself. */
static const struct {
    const char *key, *why;
} k_reserved[] = {
    {"output_dir", "each combination writes to RUN_DIR/runs/<n>-<name>; set RUN_DIR with --output-dir"},
    {"steps", "the comparison trains --compare-warmup + --compare-steps steps"},
    {"checkpoint.final", "a comparison saves no checkpoints"},
    {"checkpoint.every", "a comparison saves no checkpoints"},
    {"eval.every", "a comparison does not evaluate, so every timed step is a training step"},
};

static int key_is_well_formed(const char *key)
{
    if (!*key || *key == '.' || key[strlen(key) - 1] == '.' || strstr(key, "..")) return 0;
    for (const char *p = key; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
              *p == '.'))
            return 0;
    return 1;
}

static void key_free(compare_key *k)
{
    for (int v = 0; v < k->n_values; v++) {
        free(k->values[v]);
        free(k->shown[v]);
    }
    free(k->values);
    free(k->shown);
    free(k->key);
    memset(k, 0, sizeof *k);
}

/* "KEY=V1,V2,...": the values split at the commas outside brackets and double quotes, so a list value
 * ([0.9,0.95]) or a quoted one ("a,b") keeps its commas. */
static zt_status parse_key(const char *spec, compare_key *k, zt_error *err)
{
    memset(k, 0, sizeof *k);
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "--compare '%s': expected KEY=V1,V2, e.g. --compare zero_optimization.stage=0,1,2,3", spec);
    k->key = strndup(spec, (size_t)(eq - spec));
    k->values = calloc(strlen(eq) + 1, sizeof *k->values);
    k->shown = calloc(strlen(eq) + 1, sizeof *k->shown);
    if (!k->key || !k->values || !k->shown) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    if (!key_is_well_formed(k->key))
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "--compare '%s': '%s' is not a config key (dotted names of letters, digits and '_', such "
                            "as zero_optimization.stage)", spec, k->key);
    for (size_t i = 0; i < sizeof k_reserved / sizeof k_reserved[0]; i++)
        if (!strcmp(k->key, k_reserved[i].key))
            return zt_error_set(err, ZT_ERR_INVALID_ARG, "--compare '%s': %s cannot be compared: %s", spec, k->key,
                                k_reserved[i].why);
    k->plugin_kind = zt_kind_from_name(k->key);
    const char *p = eq + 1;
    for (;;) {
        const char *start = p;
        int depth = 0, quoted = 0;
        for (; *p && (quoted || depth > 0 || *p != ','); p++) {
            if (quoted) quoted = *p != '"';
            else if (*p == '"') quoted = 1;
            else if (*p == '[' || *p == '{') depth++;
            else if ((*p == ']' || *p == '}') && --depth < 0)
                return zt_error_set(err, ZT_ERR_INVALID_ARG, "--compare '%s': a '%c' without its opening bracket", spec,
                                    *p);
        }
        if (quoted || depth > 0)
            return zt_error_set(err, ZT_ERR_INVALID_ARG, "--compare '%s': %s is not closed", spec,
                                quoted ? "a double quote" : "a bracket");
        size_t n = (size_t)(p - start);
        int whole_quote = n >= 2 && start[0] == '"' && start[n - 1] == '"' && !memchr(start + 1, '"', n - 2);
        if (n == 0 || (whole_quote && n == 2))
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--compare '%s': value %d is empty; give KEY=V1,V2 with a value between each comma",
                                spec, k->n_values + 1);
        if (memchr(start, '"', n) && !whole_quote && start[0] != '[' && start[0] != '{')
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--compare '%s': value %d (%.*s): quote a whole value (\"a,b\"), not part of one", spec,
                                k->n_values + 1, (int)n, start);
        char *value = strndup(start, n);
        char *bare = whole_quote ? strndup(start + 1, n - 2) : strndup(start, n);
        if (!value || !bare) {
            free(value);
            free(bare);
            return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
        }
        for (int v = 0; v < k->n_values; v++)
            if (!strcmp(k->values[v], value)) {
                zt_status st = zt_error_set(err, ZT_ERR_INVALID_ARG, "--compare '%s': the value %s is given twice",
                                            spec, value);
                free(value);
                free(bare);
                return st;
            }
        k->shown[k->n_values] = bare;
        k->values[k->n_values++] = value;
        if (!*p) break;
        p++;
    }
    if (k->plugin_kind)
        for (int v = 0; v < k->n_values; v++)
            if (strchr(k->values[v], ',') || strchr(k->values[v], '['))
                return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                    "--compare '%s': %s is a plugin kind, whose values are plugins (names, .plugin or "
                                    ".so paths), one each", spec, k->key);
    return ZT_OK;
}

/* "1 to MAX" steps, or `fallback` when not given. */
static int parse_steps(const char *text, const char *option, int min, int fallback, int *out)
{
    if (!text) {
        *out = fallback;
        return 1;
    }
    char *end;
    errno = 0;
    long n = strtol(text, &end, 10);
    if (!*text || *end || errno || n < min || n > MAX_COMPARE_STEPS) {
        zt_cli_usage_error("%s '%s' is not a whole number of steps from %d to %d", option, text, min,
                           MAX_COMPARE_STEPS);
        return 0;
    }
    *out = (int)n;
    return 1;
}

/* ---- combinations --------------------------------------------------------------------------------- */

typedef struct compare_run {
    const run_args *a;
    compare_key keys[ZT_COMPARE_MAX_KEYS];
    int n_keys;
    int warmup, timed;
    int n_combinations;
    char exe[4096];
    char run_dir[4096];
} compare_run;

/* Combination i's value index of key k: the first key varies slowest, the last fastest. */
static int value_index(const compare_run *r, int i, int k)
{
    for (int j = r->n_keys - 1; j > k; j--) i /= r->keys[j].n_values;
    return i % r->keys[k].n_values;
}

/* What a combination runs with: run_args with its --set and --plugins (owned here). */
typedef struct combination {
    run_args args;
    const char *values[ZT_COMPARE_MAX_KEYS];
    char **owned; /* the strings made for it */
    int n_owned;
    char name[96]; /* "03-stage_1-device_cpu" */
} combination;

static void combination_free(combination *c)
{
    for (int i = 0; i < c->n_owned; i++) free(c->owned[i]);
    free(c->owned);
    free((void *)c->args.sets);
    memset(c, 0, sizeof *c);
}

static char *own(combination *c, char *s)
{
    if (s) c->owned[c->n_owned++] = s;
    return s;
}

/* "-stage_1": the key's last part and the value, in letters, digits, '.', '-' and single '_' only. */
static void append_name_part(char *name, size_t cap, const char *key, const char *value)
{
    const char *last = strrchr(key, '.');
    char text[64], part[64];
    snprintf(text, sizeof text, "%s_%s", last ? last + 1 : key, value);
    size_t n = 0;
    part[n++] = '-';
    for (const char *p = text; *p; p++) {
        int keep = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
                   *p == '-';
        if (keep) part[n++] = *p;
        else if (part[n - 1] != '_' && part[n - 1] != '-') part[n++] = '_';
    }
    while (n > 1 && part[n - 1] == '_') n--;
    part[n] = '\0';
    size_t used = strlen(name);
    if (used + n < cap) memcpy(name + used, part, n + 1);
}

/* The args of combination i: the user's, its keys as --set (a plugin kind's in --plugins), and the
 * comparison's own: the steps, no checkpoints, no evaluation. */
static zt_status combination_make(const compare_run *r, int i, combination *c, zt_error *err)
{
    memset(c, 0, sizeof *c);
    c->args = *r->a;
    const char **sets = calloc((size_t)r->a->n_sets + r->n_keys + 4, sizeof *sets);
    c->owned = calloc((size_t)r->n_keys + 6, sizeof *c->owned);
    c->args.sets = sets;
    if (!sets || !c->owned) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    int n = 0;
    for (int s = 0; s < r->a->n_sets; s++) sets[n++] = r->a->sets[s];
    snprintf(c->name, sizeof c->name, "%02d", i + 1);
    char *plugins = r->a->plugins ? strdup(r->a->plugins) : NULL;
    for (int k = 0; k < r->n_keys; k++) {
        const compare_key *key = &r->keys[k];
        int index = value_index(r, i, k);
        const char *value = key->values[index];
        c->values[k] = key->shown[index];
        append_name_part(c->name, sizeof c->name, key->key, key->shown[index]);
        char *text = NULL;
        if (key->plugin_kind) {
            if (asprintf(&text, "%s%s%s", plugins ? plugins : "", plugins ? "," : "", key->shown[index]) < 0)
                text = NULL;
            free(plugins);
            plugins = text;
            if (!plugins) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
        } else {
            if (asprintf(&text, "%s=%s", key->key, value) < 0 || !own(c, text))
                return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
            sets[n++] = text;
        }
    }
    c->args.plugins = own(c, plugins);
    char *steps = NULL;
    if (asprintf(&steps, "steps=%d", r->warmup + r->timed) < 0 || !own(c, steps))
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    sets[n++] = steps;
    sets[n++] = "checkpoint.final=false";
    sets[n++] = "checkpoint.every=0";
    sets[n++] = "eval.every=0";
    c->args.n_sets = n;
    return ZT_OK;
}

/* "zero_optimization.stage=1 zero_optimization.offload_optimizer.device=cpu" */
static void combination_text(const compare_run *r, const combination *c, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < r->n_keys && used < cap; k++)
        used += (size_t)snprintf(out + used, cap - used, "%s%s=%s", k ? " " : "", r->keys[k].key, c->values[k]);
}

/* The checks training makes of its config before it starts anything (train.c): every key known, every
 * value valid, the plugins found and loadable. The settings give the output directory (copied to
 * output_dir). Plugins are not probed here: one that cannot run on this machine is that row's error. */
static zt_status combination_validate(const combination *c, char *output_dir, size_t cap, zt_error *err)
{
    zt_registry *reg = NULL;
    zt_plugin_set set;
    memset(&set, 0, sizeof set);
    zt_config *cfg = zt_config_new();
    if (!cfg) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    zt_status st = zt_cli_load_config(&c->args, 1, cfg, err);
    if (st == ZT_OK) st = zt_cli_resolve_plugins(&c->args, cfg, &reg, &set, err);
    if (st == ZT_OK) st = zt_cli_add_schemas(cfg, &set, err);
    if (st == ZT_OK) st = zt_train_configure(cfg, c->args.model, !c->args.dry_run, err);
    zt_host_settings settings;
    if (st == ZT_OK) st = zt_host_settings_read(cfg, &settings, err);
    if (st == ZT_OK) snprintf(output_dir, cap, "%s", settings.output_dir); /* the settings point into cfg */
    zt_plugin_set_unload(&set);
    zt_registry_free(reg);
    zt_config_free(cfg);
    return st;
}

/* ---- the children --------------------------------------------------------------------------------- */

/* SIGINT, SIGTERM and SIGHUP are the user's: the child, in a process group of its own (a terminal's
 * Ctrl-C reaches this process alone), gets each once, as zt-run --nproc relays them to its ranks. */
static volatile sig_atomic_t g_signals_seen, g_last_signal;

static void on_user_signal(int sig)
{
    g_last_signal = sig;
    g_signals_seen++;
}

typedef struct child_end {
    int exit_code;   /* -1 when killed by a signal */
    int term_signal;
    int interrupted; /* the user's signal reached it */
    double seconds;
} child_end;

/* argv for a child zt-run: the combination's options, each as --name=VALUE. */
static char **child_argv(const compare_run *r, const combination *c, const char *dir, int dry_run)
{
    const run_args *a = &c->args;
    int cap = 16 + a->n_plugin_paths + a->n_sets;
    char **v = calloc((size_t)cap, sizeof *v);
    if (!v) return NULL;
    int n = 0, ok = 1;
    v[n++] = strdup(r->exe);
#define OPTION(name, value)                                                                                   \
    do {                                                                                                      \
        if ((value) && asprintf(&v[n++], "%s=%s", name, value) < 0) v[n - 1] = NULL, ok = 0;                 \
    } while (0)
    for (int i = 0; i < a->n_plugin_paths; i++) OPTION("--plugin-path", a->plugin_paths[i]);
    OPTION("--plugins", a->plugins);
    OPTION("--config", a->config_path);
    for (int i = 0; i < a->n_sets; i++) OPTION("--set", a->sets[i]);
    OPTION("--data", a->data);
    OPTION("--model", a->model);
    OPTION("--gpu-mem-limit", a->gpu_mem_limit);
    OPTION("--nproc", a->nproc);
    OPTION("--output-dir", dir);
#undef OPTION
    if (dry_run) v[n++] = strdup("--dry-run");
    for (int i = 0; i < n; i++) ok = ok && v[i];
    if (!ok) {
        for (int i = 0; i < n; i++) free(v[i]);
        free(v);
        return NULL;
    }
    return v;
}

static void argv_free(char **v)
{
    for (int i = 0; v && v[i]; i++) free(v[i]);
    free(v);
}

/* Runs argv with stdout and stderr in log_path, relaying the user's signals; *handled counts those
 * relayed so far. */
static zt_status run_child(char **argv, const char *log_path, int *handled, child_end *end, zt_error *err)
{
    memset(end, 0, sizeof *end);
    double started = zt_now_s();
    int log = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log < 0) return zt_error_set(err, ZT_ERR_IO, "cannot create %s: %s", log_path, strerror(errno));
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(log);
        return zt_error_set(err, ZT_ERR_IO, "cannot start a child zt-run: %s", strerror(errno));
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* this zt-run killed outright: the child ends too */
        if (getppid() != parent) _exit(1);
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, STDIN_FILENO);
        if (dup2(log, STDOUT_FILENO) < 0 || dup2(log, STDERR_FILENO) < 0) _exit(126);
        execv(argv[0], argv);
        dprintf(STDERR_FILENO, "zt-run: error: cannot start %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* as the child does: whichever runs first */
    close(log);
    int status = 0;
    for (;;) {
        if (g_signals_seen != *handled) {
            *handled = g_signals_seen;
            end->interrupted = 1;
            kill(pid, g_last_signal);
        }
        pid_t got = waitpid(pid, &status, WNOHANG);
        if (got == pid) break;
        if (got < 0 && errno != EINTR) {
            end->exit_code = 1;
            return zt_error_set(err, ZT_ERR_IO, "cannot wait for the child zt-run: %s", strerror(errno));
        }
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL); /* a signal cuts it short: the loop relays it at once */
    }
    end->seconds = zt_now_s() - started;
    end->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    end->term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    return ZT_OK;
}

/* The first error line of a child's log, without its "zt-run: error: " (or "zt[rank N] error: "); else
 * how it ended. */
static void child_error(const char *log_path, const child_end *end, char *out, size_t cap)
{
    char *text = NULL;
    size_t len = 0;
    zt_error ignored;
    out[0] = '\0';
    if (zt_read_file(log_path, &text, &len, &ignored) == ZT_OK) {
        /* zt-run's own error lines first (a rank's: "zt[rank N] error: "); any "error: " line else. */
        for (int pass = 0; pass < 2 && !out[0]; pass++)
            for (char *line = text; *line && !out[0];) {
                size_t n = strcspn(line, "\n");
                char *e = memmem(line, n, "error: ", 7);
                int own = e && (e == line + 8 ? !strncmp(line, "zt-run: ", 8) : !strncmp(line, "zt[rank ", 8));
                if (e && (own || pass == 1)) snprintf(out, cap, "%.*s", (int)(n - (size_t)(e + 7 - line)), e + 7);
                line += n + (line[n] == '\n');
            }
        free(text);
    }
    if (out[0]) return;
    if (end->term_signal)
        snprintf(out, cap, "zt-run was killed by signal %d (%s); its output is in %s", end->term_signal,
                 strsignal(end->term_signal), log_path);
    else
        snprintf(out, cap, "zt-run exited with code %d; its output is in %s", end->exit_code, log_path);
}

/* Whether a child's error is a configuration that does not fit: the estimate's refusal (GPU or host
 * memory), or an allocation past a pool's room. */
static int is_no_fit(const char *message)
{
    return !strncmp(message, "out of GPU memory", 17) || !strncmp(message, "out of host memory", 18) ||
           !strncmp(message, "out of memory in pool", 21);
}

/* The row's outcome and its message: the first line of `text`. */
static int row_ends(compare_row *row, int outcome, const char *prefix, const char *text)
{
    row->outcome = outcome;
    snprintf(row->message, sizeof row->message, "%.100s%.900s", prefix, text);
    row->message[strcspn(row->message, "\n")] = '\0';
    return 1;
}

/* "12.3k" */
static const char *tokens_text(double v, char buf[32])
{
    if (!isfinite(v)) snprintf(buf, 32, "-");
    else if (v >= 1e6) snprintf(buf, 32, "%.2fM", v / 1e6);
    else if (v >= 1e3) snprintf(buf, 32, "%.1fk", v / 1e3);
    else snprintf(buf, 32, "%.0f", v);
    return buf;
}

/* One combination: its estimate (a dry run), then, when it fits, its training. Returns 0 when the
 * user interrupted it (the row is not kept). */
static int run_combination(const compare_run *r, const combination *c, const char *label, compare_row *row,
                           int *handled, const char **device)
{
    char path[4480], err_line[1024];
    zt_error err;
    child_end end;
    memset(row, 0, sizeof *row);
    for (int k = 0; k < r->n_keys; k++) row->values[k] = c->values[k];
    snprintf(row->dir, sizeof row->dir, "%s/runs/%s", r->run_dir, c->name);
    row->fits = -1;
    row->loss = row->tokens_per_s = row->step_s = NAN;
    if (zt_mkdir_p(row->dir, "comparison run", "choose another --output-dir", &err) != ZT_OK) {
        return row_ends(row, COMPARE_FAILED, "", err.msg);
    }
    /* What an earlier comparison left here must not be read as this one's. */
    static const char *const stale[] = {"memory-estimate.json", "metrics.jsonl"};
    for (size_t i = 0; i < sizeof stale / sizeof stale[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", row->dir, stale[i]);
        unlink(path);
    }
    for (int rank = 1;; rank++) {
        snprintf(path, sizeof path, "%s/metrics.rank%d.jsonl", row->dir, rank);
        if (unlink(path) != 0) break;
    }

    char **argv = child_argv(r, c, row->dir, 1);
    snprintf(path, sizeof path, "%s/estimate.log", row->dir);
    zt_status st = argv ? run_child(argv, path, handled, &end, &err)
                        : zt_error_set(&err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    argv_free(argv);
    row->seconds = end.seconds;
    if (st == ZT_OK && end.interrupted) return 0;
    if (st != ZT_OK) {
        return row_ends(row, COMPARE_FAILED, "", err.msg);
    }
    if (end.exit_code != 0) child_error(path, &end, err_line, sizeof err_line);
    char estimate_path[4480];
    snprintf(estimate_path, sizeof estimate_path, "%s/memory-estimate.json", row->dir);
    zt_status read = zt_compare_read_estimate(row, estimate_path, device, &err);
    if (end.exit_code != 0) {
        row->fits = is_no_fit(err_line) ? 0 : -1;
        return row_ends(row, row->fits ? COMPARE_FAILED : COMPARE_NO_FIT, "", err_line);
    }
    if (read != ZT_OK) {
        return row_ends(row, COMPARE_FAILED, "the dry run wrote no estimate: ", err.msg);
    }
    row->fits = 1;
    if (r->a->dry_run) {
        row->outcome = COMPARE_ESTIMATED;
        return 1;
    }

    fprintf(stderr, "zt-run: %s: the estimate fits; training %d warm-up + %d timed steps (output: %s/train.log)\n",
            label, r->warmup, r->timed, row->dir);
    argv = child_argv(r, c, row->dir, 0);
    snprintf(path, sizeof path, "%s/train.log", row->dir);
    st = argv ? run_child(argv, path, handled, &end, &err) : zt_error_set(&err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    argv_free(argv);
    row->seconds += end.seconds;
    if (st == ZT_OK && end.interrupted) return 0;
    if (st != ZT_OK) {
        return row_ends(row, COMPARE_FAILED, "", err.msg);
    }
    if (end.exit_code != 0) {
        child_error(path, &end, err_line, sizeof err_line);
        if (is_no_fit(err_line)) row->fits = 0;
        return row_ends(row, row->fits ? COMPARE_FAILED : COMPARE_NO_FIT, "", err_line);
    }
    if (zt_compare_read_metrics(row, r->warmup, &err) != ZT_OK) {
        return row_ends(row, COMPARE_FAILED, "", err.msg);
    }
    row->outcome = COMPARE_RAN;
    return 1;
}

/* ---- zt-run --compare ------------------------------------------------------------------------------ */

/* Options a comparison cannot pass on to its children, and a launch it cannot be part of. */
static int refuse_options(const run_args *a)
{
    static const struct {
        size_t offset;
        const char *name, *why;
    } refused[] = {
        {offsetof(run_args, resume), "--resume",
         "each combination starts from the same weights: --model DIR or the seed"},
        {offsetof(run_args, export_dir), "--export", "the comparison's runs are a few steps each"},
        {offsetof(run_args, nnodes), "--nnodes", "the combinations run on this machine: use --nproc N"},
        {offsetof(run_args, nproc_per_node), "--nproc-per-node", "the combinations run on this machine: use --nproc N"},
        {offsetof(run_args, node_rank), "--node-rank", "the combinations run on this machine: use --nproc N"},
        {offsetof(run_args, master_addr), "--master-addr", "the combinations run on this machine: use --nproc N"},
        {offsetof(run_args, master_port), "--master-port", "the combinations run on this machine: use --nproc N"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (*(const char *const *)((const char *)a + refused[i].offset))
            return zt_cli_usage_error("%s does not go with --compare: %s", refused[i].name, refused[i].why);
    if (a->nproc) { /* each child launches it; a bad value would fail every row alike */
        char *end;
        long n = strtol(a->nproc, &end, 10);
        if (!*a->nproc || *end || n < 1 || n > 65536)
            return zt_cli_usage_error("--nproc '%s' is not a number of ranks from 1 to 65536", a->nproc);
    }
    zt_launch launch;
    zt_error err;
    if (zt_launch_detect(&launch, &err) == ZT_OK && launch.world_size > 1)
        return zt_cli_usage_error("--compare runs under %s as rank %d of %d: start it as one process; it launches "
                                  "each combination's ranks itself (--nproc N)",
                                  launch.launcher, (int)launch.rank, (int)launch.world_size);
    return -1;
}

/* The keys parsed, each combination counted and refused early where it cannot work. */
static int parse_keys(compare_run *r)
{
    const run_args *a = r->a;
    zt_error err;
    if (a->n_compares > ZT_COMPARE_MAX_KEYS)
        return zt_cli_usage_error("--compare is given for %d keys; at most %d can be compared at once",
                                  a->n_compares, ZT_COMPARE_MAX_KEYS);
    long combinations = 1;
    for (int i = 0; i < a->n_compares; i++) {
        compare_key *k = &r->keys[r->n_keys++];
        zt_status st = parse_key(a->compares[i], k, &err);
        if (st == ZT_ERR_OUT_OF_MEMORY) {
            fprintf(stderr, "zt-run: error: out of memory\n");
            return ZT_EXIT_ERROR;
        }
        if (st != ZT_OK) return zt_cli_usage_error("%s", err.msg);
        for (int j = 0; j < r->n_keys - 1; j++)
            if (!strcmp(r->keys[j].key, k->key))
                return zt_cli_usage_error("--compare %s is given twice; give all its values in one: --compare %s=V1,V2",
                                          k->key, k->key);
        size_t klen = strlen(k->key);
        /* The comparison's --set of the key comes after the user's, so it wins: said once. */
        for (int s = 0; s < a->n_sets; s++)
            if (!strncmp(a->sets[s], k->key, klen) && a->sets[s][klen] == '=')
                zt_log(ZT_LOG_INFO, "--compare %s replaces --set %s in every combination", a->compares[i], a->sets[s]);
        static const struct {
            const char *key, *option;
        } by_option[] = {{"data.path", "--data"}, {"gpu_mem_limit", "--gpu-mem-limit"}};
        for (size_t o = 0; o < sizeof by_option / sizeof by_option[0]; o++)
            if (!strcmp(k->key, by_option[o].key) &&
                ((o == 0 && a->data) || (o == 1 && a->gpu_mem_limit)))
                return zt_cli_usage_error("%s is both compared (--compare %s) and given by %s; keep one", k->key,
                                          a->compares[i], by_option[o].option);
        combinations *= k->n_values;
        if (combinations > ZT_COMPARE_MAX_COMBINATIONS) break;
    }
    if (combinations > ZT_COMPARE_MAX_COMBINATIONS) {
        char sizes[256] = "";
        size_t used = 0;
        for (int i = 0; i < a->n_compares && used < sizeof sizes; i++)
            used += (size_t)snprintf(sizes + used, sizeof sizes - used, "%s%d", i ? " x " : "",
                                     i < r->n_keys ? r->keys[i].n_values : 0);
        return zt_cli_usage_error("--compare: %s values make more than %d combinations, each a training run; compare "
                                  "fewer values at once, or split the keys over several comparisons (each with its "
                                  "own --output-dir)",
                                  sizes, ZT_COMPARE_MAX_COMBINATIONS);
    }
    r->n_combinations = (int)combinations;
    return -1;
}

/* Every combination validated before anything runs; RUN_DIR from the first. */
static int validate_all(compare_run *r)
{
    zt_error err;
    zt_log_set_level(ZT_LOG_WARN); /* the checks' info lines, once per combination, would bury the errors */
    int status = -1;
    for (int i = 0; i < r->n_combinations && status < 0; i++) {
        combination c;
        char output_dir[sizeof r->run_dir];
        zt_status st = combination_make(r, i, &c, &err);
        if (st == ZT_OK) st = combination_validate(&c, output_dir, sizeof output_dir, &err);
        if (st != ZT_OK) {
            char text[1024];
            combination_text(r, &c, text, sizeof text);
            fprintf(stderr, "zt-run: error: --compare: combination %d of %d (%s): %s\nNothing was run: every "
                    "combination's config is checked before the first starts.\n", i + 1, r->n_combinations, text,
                    err.msg);
            status = ZT_EXIT_ERROR;
        } else if (i == 0) {
            memcpy(r->run_dir, output_dir, sizeof r->run_dir);
        }
        combination_free(&c);
    }
    zt_log_set_level(ZT_LOG_INFO);
    return status;
}

int zt_cli_compare(const run_args *a)
{
    compare_run *r = calloc(1, sizeof *r);
    compare_row *rows = NULL;
    if (!r) {
        fprintf(stderr, "zt-run: error: out of memory\n");
        return ZT_EXIT_ERROR;
    }
    r->a = a;
    int status = refuse_options(a);
    if (status < 0 && !(parse_steps(a->compare_steps, "--compare-steps", 1, DEFAULT_TIMED_STEPS, &r->timed) &&
                        parse_steps(a->compare_warmup, "--compare-warmup", 0, DEFAULT_WARMUP_STEPS, &r->warmup)))
        status = ZT_EXIT_USAGE;
    if (status < 0) status = parse_keys(r);
    ssize_t len = readlink("/proc/self/exe", r->exe, sizeof r->exe - 1);
    if (status < 0 && (len <= 0 || (size_t)len >= sizeof r->exe - 1)) {
        fprintf(stderr, "zt-run: error: --compare: cannot find this program to run it again (/proc/self/exe: %s)\n",
                strerror(errno));
        status = ZT_EXIT_ERROR;
    }
    if (status < 0) status = validate_all(r);
    if (status >= 0) goto done;

    zt_error err;
    char runs[4200];
    snprintf(runs, sizeof runs, "%s/runs", r->run_dir);
    if (zt_mkdir_p(runs, "output", "choose another output_dir (--output-dir DIR)", &err) != ZT_OK) {
        status = zt_cli_run_error(&err);
        goto done;
    }
    rows = calloc((size_t)r->n_combinations, sizeof *rows);
    if (!rows) {
        fprintf(stderr, "zt-run: error: out of memory\n");
        status = ZT_EXIT_ERROR;
        goto done;
    }
    struct sigaction sa, old_int, old_term, old_hup;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_user_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);

    compare_table table = {r->keys, r->n_keys, rows, 0, r->n_combinations, r->warmup, r->timed, 1, 0,
                           a->dry_run, NULL};
    if (a->nproc) table.nproc = atoi(a->nproc);
    int handled = 0, failed = 0, ran = 0;
    double started = zt_now_s();
    fprintf(stderr, "zt-run: compare: %d combination%s, %s; the table goes to %s/compare.md and compare.json\n",
            r->n_combinations, r->n_combinations == 1 ? "" : "s",
            a->dry_run ? "estimated each" : "each trained in a zt-run of its own", r->run_dir);
    for (int i = 0; i < r->n_combinations && !table.interrupted; i++) {
        combination c;
        char text[1024];
        if (combination_make(r, i, &c, &err) != ZT_OK) {
            status = zt_cli_run_error(&err);
            break;
        }
        combination_text(r, &c, text, sizeof text);
        fprintf(stderr, "zt-run: compare %d of %d: %s (elapsed %.0fs)\n", i + 1, r->n_combinations, text,
                zt_now_s() - started);
        compare_row *row = &rows[table.n_rows];
        char label[64];
        snprintf(label, sizeof label, "compare %d of %d", i + 1, r->n_combinations);
        if (!run_combination(r, &c, label, row, &handled, &table.device)) {
            table.interrupted = 1;
            fprintf(stderr, "zt-run: compare %d of %d: interrupted; the table holds the %d that finished\n", i + 1,
                    r->n_combinations, table.n_rows);
        } else {
            char b[32], t[32];
            const compare_side *peak = &row->measured[row->measured[0].present ? 0 : 1];
            if (row->outcome == COMPARE_RAN)
                fprintf(stderr, "zt-run: compare %d of %d: done in %.1fs: %s tokens/s, loss %.4f, peak %s %s\n", i + 1,
                        r->n_combinations, row->seconds, tokens_text(row->tokens_per_s, t), row->loss,
                        zt_estimate_format_bytes(peak->total, b), peak == &row->measured[0] ? "GPU" : "host");
            else if (row->outcome == COMPARE_ESTIMATED)
                fprintf(stderr, "zt-run: compare %d of %d: estimated\n", i + 1, r->n_combinations);
            else
                fprintf(stderr, "zt-run: compare %d of %d: %s: %s\n", i + 1, r->n_combinations,
                        row->outcome == COMPARE_NO_FIT ? "does not fit" : "failed", row->message);
            failed += row->outcome == COMPARE_FAILED;
            ran += row->outcome == COMPARE_RAN || row->outcome == COMPARE_ESTIMATED;
            table.n_rows++;
        }
        combination_free(&c);
        /* After every row, so a comparison stopped any way leaves the table of what finished. */
        if (zt_compare_write(&table, r->run_dir, NULL, &err) != ZT_OK) {
            status = zt_cli_run_error(&err);
            break;
        }
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    if (status < 0) {
        if (zt_compare_write(&table, r->run_dir, stdout, &err) != ZT_OK) status = zt_cli_run_error(&err);
    }
    if (status < 0) {
        fprintf(stderr, "zt-run: compare: %d of %d combination%s in %.0fs; wrote %s/compare.md and compare.json\n",
                table.n_rows, r->n_combinations, r->n_combinations == 1 ? "" : "s", zt_now_s() - started, r->run_dir);
        /* A row that failed or does not fit is a result of the comparison; none that ran is a failure. */
        status = table.interrupted ? ZT_EXIT_INTERRUPTED : ran ? ZT_EXIT_OK : ZT_EXIT_ERROR;
        if (failed && !table.interrupted)
            fprintf(stderr, "zt-run: compare: %d combination%s failed (the table's notes say why)%s\n", failed,
                    failed == 1 ? "" : "s", ran ? "" : "; none ran");
        else if (!ran && !table.interrupted)
            fprintf(stderr, "zt-run: error: --compare: no combination fits\n");
    }
done:
    for (int k = 0; k < r->n_keys; k++) key_free(&r->keys[k]);
    free(rows);
    free(r);
    return status;
}
