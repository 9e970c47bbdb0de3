/* zt-run --check: what a run would load, probed and initialized in child processes (isolate.c), and
 * its config validated and printed resolved (also saved as OUTPUT_DIR/config.resolved.json). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "cli/cli.h"
#include "train/tensorboard.h"
#include "host/adapter.h"

/* ---- --check ---------------------------------------------------------------------------------- */

typedef struct check_job {
    zt_plugin_set *set;
    zt_config *cfg;                   /* NULL for probe: the config is not validated yet */
    const zt_host_settings *settings; /* likewise */
} check_job;

/* Child: probe every plugin of the set; report all that cannot run, not just the first. */
static void check_probe_body(void *arg, FILE *report)
{
    check_job *job = arg;
    zt_error err, all;
    zt_error_clear(&all);
    zt_runtime *rt = NULL;
    zt_status first = zt_cli_create_runtime(NULL, NULL, NULL, 1, 1, &rt, &err);
    if (first != ZT_OK) {
        zt_child_report_final(report, first, err.msg);
        return;
    }
    for (int k = 1; k <= ZT_KIND_COUNT; k++) {
        zt_loaded_plugin *lp = &job->set->by_kind[k];
        if (!lp->plugin) continue;
        zt_child_report_call(report, "probe()", lp);
        zt_status st = zt_plugin_probe(lp, rt, &err);
        if (st == ZT_OK) continue;
        if (first == ZT_OK) first = st;
        zt_error_append(&all, "%s%s", all.msg[0] ? "\n" : "", err.msg);
    }
    zt_child_report_final(report, first, all.msg);
    zt_runtime_destroy(rt);
}

/* Child: init every plugin in kind order with the validated config, then fini in reverse. */
static void check_init_body(void *arg, FILE *report)
{
    check_job *job = arg;
    zt_error err;
    zt_runtime *rt = NULL;
    zt_status st = zt_cli_create_runtime(job->cfg, job->settings, job->set, (int)job->settings->threads, 1, &rt, &err);
    for (int k = 1; k <= ZT_KIND_COUNT && st == ZT_OK; k++) {
        zt_loaded_plugin *lp = &job->set->by_kind[k];
        if (!lp->plugin) continue;
        zt_child_report_call(report, "init()", lp);
        st = zt_plugin_init(lp, rt, &err);
        if (st != ZT_OK || k != ZT_KIND_MODEL) continue;
        /* the model's size settles the Trainer's "auto"s that the plugins after it read */
        int64_t hidden = zt_cli_model_hidden(job->set);
        char text[32];
        snprintf(text, sizeof text, "%lld", (long long)hidden);
        zt_child_report_line(report, "model_hidden", text);
        st = zt_cli_model_autos(job->cfg, lp->desc.name, hidden, &err);
    }
    if (st == ZT_OK) st = zt_plugin_set_attach_adapter(job->set, &err);
    for (int k = ZT_KIND_COUNT; k >= 1; k--) {
        zt_loaded_plugin *lp = &job->set->by_kind[k];
        if (!lp->initialized) continue;
        zt_child_report_call(report, "fini()", lp);
        zt_plugin_unload(lp);
    }
    zt_child_report_final(report, st, st == ZT_OK ? "" : err.msg);
    zt_runtime_destroy(rt);
}

int zt_cli_check(const run_args *a)
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
    zt_host_settings settings;
    if (zt_cli_load_config(a, 0, cfg, &err) != ZT_OK) goto fail;
    if (zt_cli_resolve_plugins(a, cfg, &reg, &set, &err) != ZT_OK) goto fail;

    check_job job = {&set, NULL, NULL};
    zt_run_isolated(check_probe_body, &job, 0, a->probe_timeout_s, &r);
    if (!r.completed || r.status != ZT_OK) {
        zt_child_failure(&r, "probing the plugins", a->probe_timeout_s, &err);
        goto fail;
    }

    if (zt_cli_add_schemas(cfg, &set, &err) != ZT_OK) goto fail;
    if (zt_config_validate(cfg, &err) != ZT_OK) goto fail;
    if (zt_cli_settings(cfg, zt_cli_world_size(a), &settings, &err) != ZT_OK) goto fail;

    job.cfg = cfg;
    job.settings = &settings;
    zt_run_isolated(check_init_body, &job, 0, 0, &r);
    if (!r.completed || r.status != ZT_OK) {
        zt_child_failure(&r, "initializing the plugins", 0, &err);
        goto fail;
    }
    if (zt_cli_model_autos(cfg, set.by_kind[ZT_KIND_MODEL].desc.name, r.model_hidden, &err) != ZT_OK) goto fail;
    zt_cli_log_deepspeed_notes(cfg);

    plugins = zt_cli_plugins_json(&set);
    if (!plugins) {
        zt_error_set(&err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing the resolved config");
        goto fail;
    }
    if (zt_config_write_resolved(cfg, stdout, plugins, &err) != ZT_OK) goto fail;
    fflush(stdout);
    const char *output_dir = settings.output_dir;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.resolved.json", output_dir); /* output_dir fits: settings.c */
    if (zt_mkdir_p(output_dir, "output", "choose another output_dir (--output-dir DIR)", &err) != ZT_OK) goto fail;
    if (zt_config_save_resolved(cfg, path, plugins, &err) != ZT_OK) goto fail;
    if (settings.tensorboard && zt_tensorboard_check(&settings, &err) != ZT_OK) goto fail;
    fprintf(stderr, "zt-run: check passed; resolved config saved to %s\n", path);
    status = ZT_EXIT_OK;
    goto done;
fail:
    zt_cli_run_error(&err);
done:
    free(plugins);
    zt_plugin_set_unload(&set);
    zt_registry_free(reg);
    zt_config_free(cfg);
    return status;
}

