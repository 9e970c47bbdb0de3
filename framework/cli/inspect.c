/* The inspecting actions: --list-plugins (what is installed and whether it can run here), --env (the
 * machine, env.c, and the same table) and --describe (one plugin and its options). Each plugin is
 * loaded here and probed in a child process (isolate.c). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/env.h"
#include "host/trust.h"

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
    zt_child_report_line(report, "library", job->desc->library);
    zt_child_report_line(report, "call", call);
    zt_status st = zt_plugin_load(job->reg, job->desc->descriptor, &lp, &err);
    if (st != ZT_OK) {
        zt_child_report_final(report, st, err.msg);
        return;
    }
    char abi[32];
    snprintf(abi, sizeof abi, "%u.%u", lp.plugin->abi_major, lp.plugin->abi_minor);
    zt_child_report_line(report, "version", lp.plugin->version);
    zt_child_report_line(report, "description", lp.plugin->description);
    zt_child_report_line(report, "abi", abi);
    char caps[512];
    zt_cli_format_caps(lp.plugin->caps, caps, sizeof caps);
    zt_child_report_line(report, "caps", caps);
    zt_runtime *rt = NULL;
    st = zt_cli_create_runtime(NULL, NULL, NULL, 1, 1, &rt, &err);
    if (st == ZT_OK) {
        zt_child_report_call(report, "probe()", &lp);
        st = zt_plugin_probe(&lp, rt, &err);
    }
    zt_child_report_final(report, st, st == ZT_OK ? "" : err.msg);
    zt_plugin_unload(&lp);
    zt_runtime_destroy(rt);
}

typedef struct plugin_row {
    const zt_plugin_desc *desc;
    child_result probe;
    char runs_here[16]; /* "yes", "no", "shadowed", "unsafe" */
    char reason[4096 + 128]; /* why not, one line */
    const char *trust_problem; /* the registry's lines on why its files are unsafe, or NULL */
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

/* Probe every installed plugin, each in its own child process. One whose files fail the trust rules
 * (host/trust.h) is not loaded at all, unless ZT_ALLOW_UNSAFE_PLUGINS=1. */
static plugin_row *probe_installed(const zt_registry *reg, int timeout_s)
{
    int n = zt_registry_count(reg);
    int unsafe_allowed = zt_trust_unsafe_allowed(NULL) == 1; /* the scan refused a bad value */
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
        row->trust_problem = zt_registry_trust_problem(reg, i);
        if (row->desc->unsafe && !unsafe_allowed) {
            snprintf(row->runs_here, sizeof row->runs_here, "unsafe");
            continue;
        }
        probe_job job = {reg, row->desc};
        zt_run_isolated(probe_descriptor_body, &job, 1, timeout_s, &row->probe);
        int ok = row->probe.completed && row->probe.status == ZT_OK;
        snprintf(row->runs_here, sizeof row->runs_here, "%s", ok ? "yes" : "no");
        if (!ok) {
            zt_error err;
            zt_child_failure(&row->probe, "loading the plugin", timeout_s, &err);
            first_line(err.msg, row->reason, sizeof row->reason);
        }
    }
    return rows;
}

/* The indented lines under an unsafe plugin's row: each problem, then what was done about it. */
static void print_trust_problem(FILE *f, const plugin_row *row)
{
    for (const char *line = row->trust_problem; *line;) {
        size_t n = strcspn(line, "\n");
        fprintf(f, "    unsafe: %.*s\n", (int)n, line);
        line += n + (line[n] == '\n');
    }
    if (!strcmp(row->runs_here, "unsafe"))
        fprintf(f, "    unsafe: not loaded; fix the permissions as shown, or set %s=1 to load it anyway\n",
                ZT_TRUST_OPT_IN);
    else
        fprintf(f, "    unsafe: loaded anyway, because %s=1\n", ZT_TRUST_OPT_IN);
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
            if (row->trust_problem) print_trust_problem(f, row);
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
int zt_cli_list_plugins(const run_args *a, int with_env)
{
    zt_registry *reg;
    zt_error err;
    if (zt_registry_scan(a->plugin_paths, a->n_plugin_paths, &reg, &err) != ZT_OK) return zt_cli_run_error(&err);
    /* Probe first: zt_env_print initializes CUDA in this process, and a child forked after that
     * cannot use CUDA. */
    plugin_row *rows = probe_installed(reg, a->probe_timeout_s);
    if (!rows) {
        zt_registry_free(reg);
        fprintf(stderr, "zt-run: error: out of memory\n");
        return ZT_EXIT_ERROR;
    }
    int too_old = 0; /* --env: components found that zt's runs cannot use */
    if (with_env) {
        too_old = zt_env_print(stdout);
        printf("\nPlugins\n");
    }
    print_search_path(stdout, reg);
    printf("\n");
    print_plugin_table(stdout, reg, rows);
    print_problems(stdout, reg);
    free(rows);
    zt_registry_free(reg);
    if (too_old) {
        fflush(stdout);
        fprintf(stderr, "zt-run: --env: %d component%s of this machine %s too old or not supported for zt (see "
                        "\"Requirements\" above)\n", too_old, too_old == 1 ? "" : "s", too_old == 1 ? "is" : "are");
        return ZT_EXIT_ERROR;
    }
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

int zt_cli_describe(const run_args *a)
{
    zt_registry *reg;
    zt_error err;
    if (zt_registry_scan(a->plugin_paths, a->n_plugin_paths, &reg, &err) != ZT_OK) return zt_cli_run_error(&err);
    zt_loaded_plugin lp;
    if (zt_plugin_load(reg, a->describe_name, &lp, &err) != ZT_OK) {
        zt_registry_free(reg);
        return zt_cli_run_error(&err);
    }
    const zt_plugin *p = lp.plugin;
    printf("%s %s: %s %s plugin, zt ABI %u.%u\n", p->name, p->version,
           strchr("aeiou", zt_kind_name(p->kind)[0]) ? "an" : "a", zt_kind_name(p->kind), p->abi_major,
           p->abi_minor);
    printf("  %s\n", p->description);
    printf("  library:      %s\n", lp.desc.library);
    if (lp.desc.descriptor[0]) printf("  descriptor:   %s\n", lp.desc.descriptor);
    char caps[512];
    zt_cli_format_caps(p->caps, caps, sizeof caps);
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
