/* zt-report: an HTML report with plots of zt-run runs, or a live view of one (docs/report.md). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"
#include "report.h"

enum { O_OUT, O_FOLLOW, O_INTERVAL, O_HELP, O_VERSION, O_COUNT };

static const zt_cli_option options[O_COUNT] = {
    [O_OUT] = {"--output", "-o", "FILE", "the page to write (default report.html); the PNGs go into FILE_files/"},
    [O_FOLLOW] = {"--follow", "-f", NULL, "show a live view of one run in the terminal until it ends"},
    [O_INTERVAL] = {"--interval", NULL, "S", "--follow: seconds between refreshes (default 1)"},
    [O_HELP] = {"--help", "-h", NULL, "show this help"},
    [O_VERSION] = {"--version", NULL, NULL, "show the version"},
};

static void usage(FILE *f)
{
    fputs("usage: zt-report RUN_DIR [RUN_DIR...] [-o report.html]\n"
          "       zt-report --follow RUN_DIR [--interval S]\n\n"
          "Writes a self-contained HTML page with plots of zt-run runs (loss, learning rate, gradient\n"
          "norm, loss scale, tokens/s, memory by pool and rank, communication time; several runs\n"
          "overlaid), their summaries and configs, and a run's compare.json; each plot also as PNG.\n"
          "--follow shows a run's progress live from its metrics files until the run ends.\n\n"
          "options:\n", f);
    zt_cli_print_options(f, options, O_COUNT);
    fputs("\nExit status: 0 success (--follow: the run finished), 1 error, 2 bad command line,\n"
          "3 (--follow) the run stopped before its last step, 130 interrupted.\n"
          "Details: docs/report.md\n", f);
}

/* zt_cli_parse takes only options: the RUN_DIR arguments are set aside first. */
static void split_positionals(int argc, char **argv, char **opt_argv, int *opt_argc, const char **dirs, int *n_dirs)
{
    *opt_argc = 1;
    opt_argv[0] = argv[0];
    *n_dirs = 0;
    int only_dirs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_dirs || a[0] != '-' || a[1] == '\0') {
            dirs[(*n_dirs)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_dirs = 1;
            continue;
        }
        opt_argv[(*opt_argc)++] = argv[i];
        if (strchr(a, '=')) continue;
        for (int o = 0; o < O_COUNT; o++)
            if (options[o].value_name && (strcmp(a, options[o].name) == 0 ||
                                          (options[o].short_name && strcmp(a, options[o].short_name) == 0))) {
                if (i + 1 < argc) opt_argv[(*opt_argc)++] = argv[++i];
                break;
            }
    }
}

static int write_report(const char **dirs, int n_dirs, const char *out)
{
    report_run *runs = report_xcalloc((size_t)n_dirs, sizeof *runs, "the runs");
    int rc = 0;
    zt_error err;
    for (int i = 0; i < n_dirs && rc == 0; i++) {
        if (report_run_read(dirs[i], &runs[i], &err) != ZT_OK) {
            report_fail("%s", err.msg);
            rc = 1;
        } else if (runs[i].torn_note) {
            report_note("%s", runs[i].torn_note);
        }
    }
    if (rc == 0) {
        report_charts charts;
        report_build_charts(runs, n_dirs, &charts);
        if (report_write_html(runs, n_dirs, &charts, out, &err) != ZT_OK) {
            report_fail("cannot write the report: %s", err.msg);
            rc = 1;
        } else {
            report_note("wrote %s (%d run%s, %d charts; PNGs beside it)", out, n_dirs, n_dirs == 1 ? "" : "s",
                        charts.n);
        }
        report_charts_free(&charts);
    }
    for (int i = 0; i < n_dirs; i++) report_run_free(&runs[i]);
    free(runs);
    return rc;
}

int main(int argc, char **argv)
{
    char **opt_argv = report_xcalloc((size_t)argc + 1, sizeof *opt_argv, "the command line");
    const char **dirs = report_xcalloc((size_t)argc + 1, sizeof *dirs, "the command line");
    int opt_argc, n_dirs;
    split_positionals(argc, argv, opt_argv, &opt_argc, dirs, &n_dirs);
    zt_cli_arg *args = NULL;
    int n_args = 0, rc = 0;
    zt_error err;
    if (zt_cli_parse(options, O_COUNT, opt_argc, opt_argv, &args, &n_args, &err) != ZT_OK) {
        report_fail("%s (zt-report --help lists the options)", err.msg);
        rc = 2;
    }
    const char *out = "report.html";
    int follow = 0, seen[O_COUNT] = {0};
    double interval = 1.0;
    for (int i = 0; rc == 0 && i < n_args; i++) {
        int o = args[i].option;
        if (seen[o]++) {
            report_fail("%s is given more than once", options[o].name);
            rc = 2;
            break;
        }
        switch (o) {
        case O_OUT: out = args[i].value; break;
        case O_FOLLOW: follow = 1; break;
        case O_INTERVAL: {
            char *end;
            errno = 0;
            interval = strtod(args[i].value, &end);
            if (errno || end == args[i].value || *end || !(interval >= 0.05 && interval <= 3600)) {
                report_fail("--interval: '%s' must be a number of seconds between 0.05 and 3600", args[i].value);
                rc = 2;
            }
            break;
        }
        case O_HELP: usage(stdout); rc = -1; break;
        case O_VERSION: printf("zt-report %s\n", ZT_VERSION); rc = -1; break;
        }
    }
    if (rc == 0 && n_dirs == 0) {
        report_fail("give at least one RUN_DIR (the output_dir of a zt-run run)");
        usage(stderr);
        rc = 2;
    } else if (rc == 0 && follow && (n_dirs != 1 || seen[O_OUT])) {
        report_fail("--follow shows one run in the terminal: give one RUN_DIR and no -o");
        rc = 2;
    } else if (rc == 0 && !follow && seen[O_INTERVAL]) {
        report_fail("--interval is an option of --follow");
        rc = 2;
    }
    if (rc == 0) {
        if (follow) {
            report_follow_options fo = {.dir = dirs[0], .interval_s = interval, .ansi = -1};
            rc = report_follow(&fo);
        } else {
            rc = write_report(dirs, n_dirs, out);
        }
    }
    free(args);
    free(opt_argv);
    free(dirs);
    return rc < 0 ? 0 : rc;
}
