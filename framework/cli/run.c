/* What --check and training share: the run's config as the command line gives it, its plugins (chosen
 * by host/select.c, their schemas added), and the runtime they run on. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/log.h"
#include "cli/cli.h"
#include "config/deepspeed.h"
#include "dist/launch.h"
#include "host/select.h"

zt_status zt_cli_load_config(const run_args *a, int training, zt_config *cfg, zt_error *err)
{
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    zt_status st = zt_config_add_schema(cfg, "host", host_opts, n_host, err);
    if (st == ZT_OK && a->config_path) st = zt_config_load_file(cfg, a->config_path, err);
    /* What the file gives that zt accepts without effect (MindFormers' keys): said once, by rank 0. */
    for (const char *line = zt_config_notes(cfg); st == ZT_OK && *line && zt_log_rank() <= 0;) {
        size_t n = strcspn(line, "\n");
        zt_log(ZT_LOG_INFO, "%.*s", (int)n, line);
        line += n + (line[n] == '\n');
    }
    for (int i = 0; i < a->n_sets && st == ZT_OK; i++) st = zt_config_set(cfg, a->sets[i], err);
    /* The options that stand for a key count as a --set of it. */
    if (st == ZT_OK && a->output_dir)
        st = zt_config_put_string(cfg, "output_dir", a->output_dir, "--output-dir", ZT_CONFIG_RANK_SET, err);
    if (st == ZT_OK && training && a->gpu_mem_limit)
        st = zt_config_put_string(cfg, "gpu_mem_limit", a->gpu_mem_limit, "--gpu-mem-limit", ZT_CONFIG_RANK_SET, err);
    if (st == ZT_OK && training && a->data)
        st = zt_config_put_string(cfg, "data.path", a->data, "--data", ZT_CONFIG_RANK_SET, err);
    return st;
}

zt_status zt_cli_resolve_plugins(const run_args *a, zt_config *cfg, zt_registry **reg, zt_plugin_set *set,
                                 zt_error *err)
{
    zt_status st = zt_registry_scan(a->plugin_paths, a->n_plugin_paths, reg, err);
    if (st == ZT_OK) st = zt_plugin_set_resolve(*reg, a->plugins, zt_select_run_kinds(cfg), cfg, set, err);
    if (st == ZT_OK) st = zt_select_record(cfg, set, err);
    return st;
}

zt_status zt_cli_add_schemas(zt_config *cfg, const zt_plugin_set *set, zt_error *err)
{
    zt_status st = ZT_OK;
    for (int k = 1; k <= ZT_KIND_COUNT && st == ZT_OK; k++) {
        const zt_loaded_plugin *lp = &set->by_kind[k];
        if (lp->plugin) st = zt_config_add_schema(cfg, lp->desc.name, lp->plugin->options, lp->plugin->n_options, err);
    }
    return st;
}

zt_status zt_cli_create_runtime(const zt_config *cfg, const zt_host_settings *settings, const zt_plugin_set *set,
                                int n_threads, int in_child, zt_runtime **rt, zt_error *err)
{
    zt_host_settings defaults;
    zt_runtime_options opt;
    memset(&opt, 0, sizeof opt);
    opt.n_threads = n_threads;
    opt.single_process = in_child;
    zt_status st = zt_select_device(settings, set, &opt.device_type, err);
    if (st == ZT_OK && !settings) st = zt_host_settings_defaults(&defaults, err);
    if (st != ZT_OK) return st;
    if (!settings) settings = &defaults;
    opt.device_mem_limit = zt_device_pool_limit(settings);
    opt.comm_timeout_s = settings->comm_timeout_s;
    opt.comm_backend = settings->comm_backend;
    opt.comms_logger = &settings->comms_logger;
    opt.flight_entries = in_child ? 0 : (uint32_t)settings->flight_recorder_entries;
    return zt_runtime_create(&opt, cfg, rt, err);
}

/* "_plugins" of the resolved config: [{"name", "kind", "version", "abi", "path"}, ...] */
char *zt_cli_plugins_json(const zt_plugin_set *set)
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


int64_t zt_cli_world_size(const run_args *a)
{
    char *end;
    long n = a->nproc ? strtol(a->nproc, &end, 10) : 0;
    if (a->nproc && !*end && n >= 1 && n <= 65536) return n;
    zt_launch launch;
    zt_error err;
    return zt_launch_detect(&launch, &err) == ZT_OK && launch.world_size > 1 ? launch.world_size : 1;
}

zt_status zt_cli_settings(zt_config *cfg, int64_t world_size, zt_host_settings *settings, zt_error *err)
{
    zt_status st = zt_host_settings_read(cfg, settings, err);
    if (st == ZT_OK) st = zt_micro_batch_num_apply(cfg, settings, err);
    if (st == ZT_OK) st = zt_ds_resolve_batch(cfg, zt_data_parallel_size(settings, world_size), err);
    if (st == ZT_OK) st = zt_config_validate(cfg, err);
    return st == ZT_OK ? zt_host_settings_read(cfg, settings, err) : st;
}

int64_t zt_cli_model_hidden(const zt_plugin_set *set)
{
    const zt_loaded_plugin *lp = &set->by_kind[ZT_KIND_MODEL];
    if (!lp->plugin || !lp->initialized) return 0;
    const zt_model_ops *ops = lp->plugin->ops;
    const zt_model_info *info = ops && ops->info ? ops->info(lp->state) : NULL;
    return info ? info->hidden_size : 0;
}

zt_status zt_cli_model_autos(zt_config *cfg, const char *model_name, int64_t hidden, zt_error *err)
{
    char model[96];
    snprintf(model, sizeof model, "model '%s'", model_name);
    zt_status st = zt_ds_resolve_model_autos(cfg, hidden, model, err);
    return st == ZT_OK ? zt_config_validate(cfg, err) : st;
}

void zt_cli_log_deepspeed_notes(const zt_config *cfg)
{
    if (zt_log_rank() > 0) return;
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return;
    zt_ds_describe(cfg, mem, "");
    if (fclose(mem) == 0)
        for (const char *line = text; *line;) {
            size_t n = strcspn(line, "\n");
            zt_log(ZT_LOG_INFO, "%.*s", (int)n, line);
            line += n + (line[n] == '\n');
        }
    free(text);
}
