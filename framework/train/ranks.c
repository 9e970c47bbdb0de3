/* The ranks of a training run (trainer_internal.h): plain data parallelism over the whole job, or the
 * grid of a parallel plugin (docs/parallel.md), whose "dp" group the trainer then trains over. */
#include <stdlib.h>
#include <string.h>

#include "train/trainer_internal.h"

/* Plain data parallelism over the whole job: "dp" is every rank. */
static zt_status data_parallel_group(trainer *t, zt_error *err)
{
    int32_t world = t->host->world_size;
    int32_t *ranks = malloc((size_t)world * sizeof *ranks);
    if (!ranks) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating group 'dp'");
    for (int32_t r = 0; r < world; r++) ranks[r] = r;
    zt_status st = t->host->group_create(t->host->ctx, "dp", ranks, world, &t->dp);
    free(ranks);
    if (st != ZT_OK) return tr_host_failed(t, st, err, "creating the data-parallel group 'dp'");
    t->world = t->dp;
    t->grid = (zt_rank_grid){.struct_size = sizeof t->grid, .dp_size = t->dp.size, .tp_size = 1, .pp_size = 1,
                             .dp_rank = t->dp.rank, .last_unit = t->info->n_units - 1};
    /* Unset, parallel_config.data_parallel is whatever the launch gave; set, it must agree. */
    int64_t dp_config = t->set->data_parallel;
    if (t->set->has_data_parallel && dp_config != t->dp.size)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "parallel_config.data_parallel is %lld but the job has %d process%s; launch that many "
                            "ranks (zt-run --nproc %lld, or mpirun -np %lld) or remove the key",
                            (long long)dp_config, (int)t->dp.size, t->dp.size == 1 ? "" : "es", (long long)dp_config,
                            (long long)dp_config);
    return ZT_OK;
}

/* What a pipeline run executes (docs/parallel.md, "Execution"): the rest is refused with the way out. */
static zt_status check_pipeline(trainer *t, zt_error *err)
{
    const zt_host_settings *s = t->set;
    int32_t p = t->grid.pp_size;
    const char *why = NULL;
    int tied = 0;
    for (int32_t i = 0; i < t->info->n_params_decl; i++) tied |= (t->info->params[i].flags & ZT_PARAM_TIED) != 0;
    if (tied)
        why = "the LM head is tied to the embedding, which lives on the first stage while the head runs on the last; "
              "set model.tie_word_embeddings to false";
    else if (s->eval_every > 0)
        why = "evaluation runs the whole model on one rank; set eval.every to 0";
    else if (t->req->export_adapter_dir)
        why = "the adapter export reads every unit on rank 0 of 'dp'; leave --export-adapter out";
    else if (s->trainable_params && s->trainable_params[0])
        why = "freezing (trainable_params) stops the backward below the lowest trainable unit on one rank; train "
              "every parameter";
    if (!why) return ZT_OK;
    return zt_error_set(err, ZT_ERR_UNSUPPORTED, "parallel_config.pipeline_stage = %d: %s", (int)p, why);
}

/* A parallel plugin arranges the ranks (docs/parallel.md): its setup builds the grid and the "dp",
 * "tp" and "pp" groups, and the trainer's data parallelism is over its "dp". */
static zt_status setup_parallel(trainer *t, zt_error *err)
{
    const zt_loaded_plugin *lp = &t->req->plugins->by_kind[ZT_KIND_PARALLEL];
    const zt_parallel_ops *ops = lp->plugin->ops;
    if (!lp->initialized || !ops || !ops->setup)
        return zt_error_set(err, ZT_ERR_INTERNAL, "parallel plugin '%s' is not initialized or has no setup",
                            lp->desc.name);
    memset(&t->grid, 0, sizeof t->grid);
    t->grid.struct_size = sizeof t->grid;
    zt_status st = ops->setup(lp->state, t->info, &t->grid);
    if (st != ZT_OK) return zt_plugin_failed(lp, st, err, "setup (the rank grid and its groups)");
    st = t->host->group_get(t->host->ctx, "dp", &t->dp);
    if (st != ZT_OK) return tr_host_failed(t, st, err, "looking up the parallel plugin's group 'dp'");
    if (t->dp.size != t->grid.dp_size)
        return zt_error_set(err, ZT_ERR_INTERNAL, "parallel plugin '%s' reports %d data-parallel ranks, but its "
                            "group 'dp' has %d", lp->desc.name, (int)t->grid.dp_size, (int)t->dp.size);
    if (t->set->has_data_parallel && t->set->data_parallel != t->grid.dp_size)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "parallel_config: data_parallel x model_parallel x pipeline_stage = %lld x %d x %d = %lld, "
                            "but the job has %d ranks: launch %lld ranks, or set data_parallel to %d (or remove it)",
                            (long long)t->set->data_parallel, (int)t->grid.tp_size, (int)t->grid.pp_size,
                            (long long)t->set->data_parallel * t->grid.tp_size * t->grid.pp_size,
                            (int)t->host->world_size,
                            (long long)t->set->data_parallel * t->grid.tp_size * t->grid.pp_size,
                            (int)t->grid.dp_size);
    /* every rank: a checkpoint's writers (each (tp, pp) position writes its own shards) */
    int32_t world = t->host->world_size, *all = malloc((size_t)world * sizeof *all);
    if (!all) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating group 'world'");
    for (int32_t r = 0; r < world; r++) all[r] = r;
    st = t->host->group_create(t->host->ctx, "world", all, world, &t->world);
    free(all);
    if (st != ZT_OK) return tr_host_failed(t, st, err, "creating the group 'world' (every rank)");
    /* tensor parallel: the model splits itself over "tp" and the layout holds its shards */
    st = tr_tensor_parallel(t, t->grid.tp_size, t->grid.tp_rank, t->set->seq_parallel, err);
    if (st != ZT_OK) return st;
    if (t->grid.pp_size > 1) return check_pipeline(t, err);
    return ZT_OK;
}

zt_status tr_setup_ranks(trainer *t, zt_error *err)
{
    return t->req->plugins->by_kind[ZT_KIND_PARALLEL].plugin ? setup_parallel(t, err) : data_parallel_group(t, err);
}
