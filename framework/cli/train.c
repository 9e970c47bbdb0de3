/* zt-run's training action: the config and plugins as --check resolves them (run.c), probed and
 * initialized here, in the process that trains; then the loop (framework/train/trainer.c), or with
 * --dry-run the memory estimate (framework/train/estimate.c) instead. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/log.h"
#include "cli/cli.h"
#include "dist/job.h"
#include "host/adapter.h"
#include "host/select.h"
#include "train/estimate.h"
#include "train/trainer.h"

/* --dry-run: the memory estimate of the run do_train was about to start, for as many data-parallel
 * ranks as it would have (zt_data_parallel_size of --nproc N, else of the launch's ranks), printed
 * by rank 0 and written to OUTPUT_DIR/memory-estimate.json. */
static int dry_run(const run_args *a, zt_config *cfg, const zt_host_settings *settings, const zt_registry *reg,
                   const zt_plugin_set *set, zt_runtime *rt, int gpu)
{
    zt_error err;
    const zt_host *host = set->by_kind[ZT_KIND_ZERO].host;
    int64_t world = host->world_size;
    if (a->nproc) {
        char *end;
        world = strtol(a->nproc, &end, 10);
        if (*end || world < 1 || world > 65536)
            return zt_cli_usage_error("--nproc '%s' is not a number of ranks from 1 to 65536", a->nproc);
    }
    int64_t dp = zt_data_parallel_size(settings, world);
    if (host->world_rank != 0) return ZT_EXIT_OK;
    const char *output_dir = settings->output_dir;
    char path[4200];
    snprintf(path, sizeof path, "%s/memory-estimate.json", output_dir); /* output_dir fits: settings.c */
    zt_dry_run_request req = {cfg, settings, reg, set, rt, (int32_t)dp, path, gpu, 0};
    if (zt_mkdir_p(output_dir, "output", "choose another output_dir (--output-dir DIR)", &err) != ZT_OK) return zt_cli_run_error(&err);
    zt_status st = zt_dry_run(&req, stdout, &err);
    if (st == ZT_ERR_OUT_OF_MEMORY && err.msg[0]) {
        /* The table is out; the run as configured would not fit: say so as the run would, and fail. */
        fprintf(stderr, "zt-run: dry run: the estimate is also in %s\n", path);
        return zt_cli_run_error(&err);
    }
    if (st != ZT_OK) return zt_cli_run_error(&err);
    fprintf(stderr, "zt-run: dry run: nothing was trained; the estimate is also in %s\n", path);
    return ZT_EXIT_OK;
}

/* Whether a run would compute on GPUs: device cuda, or a plugin that runs only there. */
static int wants_gpu(const zt_host_settings *settings, const zt_plugin_set *set)
{
    return settings->device == ZT_DEVICE_SETTING_CUDA || zt_plugin_set_without(set, ZT_CAP_CPU) != NULL;
}

/* The plugins a memory estimate initializes (the adapter adds the parameters that train). */
static int estimated_kind(int kind)
{
    return kind == ZT_KIND_MODEL || kind == ZT_KIND_OPTIMIZER || kind == ZT_KIND_ZERO || kind == ZT_KIND_ADAPTER ||
           kind == ZT_KIND_PARALLEL;
}

/* A GPU run's dry run where it cannot run (no GPU here, or a plugin without CUDA): the estimate needs
 * no device, so the model, optimizer and zero plugins are initialized on a CPU runtime and the
 * estimator is told the run is a GPU one. `why` (err) is printed as a note. */
static zt_status cpu_runtime_for_estimate(zt_error *why, const zt_host_settings *settings, const zt_config *cfg,
                                          zt_runtime **rt)
{
    fprintf(stderr, "zt-run: dry run: note: this GPU run cannot start here (%s); estimating it anyway\n", why->msg);
    zt_error_clear(why);
    zt_runtime_options opt;
    memset(&opt, 0, sizeof opt);
    opt.n_threads = (int)settings->threads;
    opt.device_type = ZT_DEVICE_CPU; /* ranks as launched, so only rank 0 prints */
    opt.comm_timeout_s = settings->comm_timeout_s;
    opt.comm_backend = settings->comm_backend;
    return zt_runtime_create(&opt, cfg, rt, why);
}

int zt_cli_train(const run_args *a)
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
    zt_host_settings settings;
    if (zt_cli_load_config(a, 1, cfg, &err) != ZT_OK) goto fail;
    if (zt_cli_resolve_plugins(a, cfg, &reg, &set, &err) != ZT_OK) goto fail;
    if (zt_cli_add_schemas(cfg, &set, &err) != ZT_OK) goto fail;
    if (zt_train_configure(cfg, a->model, !a->dry_run, &err) != ZT_OK) goto fail;
    if (zt_cli_settings(cfg, zt_cli_world_size(a), &settings, &err) != ZT_OK) goto fail;
    int estimate_only = 0; /* a dry run estimating a GPU run on a CPU runtime */
    if (zt_cli_create_runtime(cfg, &settings, &set, (int)settings.threads, 0, &rt, &err) != ZT_OK) {
        if (!a->dry_run || !wants_gpu(&settings, &set)) goto fail;
        if (cpu_runtime_for_estimate(&err, &settings, cfg, &rt) != ZT_OK) goto fail;
        estimate_only = 1;
    }
    for (int k = 1; k <= ZT_KIND_COUNT; k++)
        if (set.by_kind[k].plugin && (!estimate_only || estimated_kind(k)) &&
            zt_plugin_probe(&set.by_kind[k], rt, &err) != ZT_OK)
            goto fail;
    for (int k = 1; k <= ZT_KIND_COUNT; k++) {
        if (!set.by_kind[k].plugin || (estimate_only && !estimated_kind(k))) continue;
        if (zt_plugin_init(&set.by_kind[k], rt, &err) != ZT_OK) goto fail;
        /* the model's size settles the Trainer's "auto"s that the plugins after it read */
        if (k == ZT_KIND_MODEL &&
            zt_cli_model_autos(cfg, set.by_kind[k].desc.name, zt_cli_model_hidden(&set), &err) != ZT_OK)
            goto fail;
    }
    zt_cli_log_deepspeed_notes(cfg);
    if (zt_plugin_set_attach_adapter(&set, &err) != ZT_OK) goto fail;
    int on_gpu = set.by_kind[ZT_KIND_ZERO].host && set.by_kind[ZT_KIND_ZERO].host->device->device_type != ZT_DEVICE_CPU;
    if (a->dry_run) {
        status = dry_run(a, cfg, &settings, reg, &set, rt, on_gpu || estimate_only);
        goto done;
    }
    {
        /* Before anything big is allocated: refuse a run the estimate says cannot fit (the GPU, and the
         * host memory of this machine's ranks), and give the allocator the estimate for its own
         * out-of-memory message. */
        const zt_host *zh = set.by_kind[ZT_KIND_ZERO].host;
        zt_dry_run_request check = {cfg, &settings, reg, &set, rt, zh->world_size, NULL, on_gpu, 0};
        if (zt_memory_check(&check, &err) != ZT_OK) goto fail;
    }
    if (!(plugins = zt_cli_plugins_json(&set))) goto oom;
    zt_train_request req = {cfg,        &settings,  &set,           rt, plugins, a->resume, a->model, a->export_dir,
                            a->export_dtype, a->export_shard_bytes, a->adapter, a->export_adapter_dir};
    zt_status st = zt_train_run(&req, &err);
    if (st == ZT_ERR_CANCELLED) {
        /* Rank 0 speaks for a job (where its checkpoint is); the others said they were interrupted. */
        if (zt_log_rank() < 0) fprintf(stderr, "zt-run: %s\n", err.msg);
        else if (zt_log_rank() == 0) fprintf(stderr, "zt[rank 0] %s\n", err.msg);
        status = ZT_EXIT_INTERRUPTED;
    } else if (st != ZT_OK) {
        zt_cli_run_error(&err);
    } else {
        status = ZT_EXIT_OK;
    }
    goto done;
oom:
    zt_error_set(&err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
fail:
    zt_cli_run_error(&err);
done:
    /* Before the shutdown barrier, where a rank that failed alone waits for the others: zt-run then
     * knows already which rank failed (job.h). */
    zt_job_note_end("exit", status);
    free(plugins);
    zt_plugin_set_unload(&set); /* fini before the runtime that served them goes */
    zt_runtime_destroy(rt);
    zt_registry_free(reg);
    zt_config_free(cfg);
    return status;
}

