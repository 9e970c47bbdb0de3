/* Tensor parallelism from the trainer's side: the model splits itself (zt_model_ops.parallelize,
 * ABI 1.4) and says where each rank's shard of a parameter lies (param_shard); the layout then holds
 * only this rank's shards (train/layout.h), which the zero plugin shards again over "dp". */
#include <stdlib.h>
#include <string.h>

#include "train/trainer_internal.h"

/* What a tensor-parallel run does not do: the global gradient norm over tensor shards (the zero
 * plugins reduce it over "dp"), and checkpoints and exports of a split layout (they would write each
 * rank's shards under the logical tensors' names). Refused before anything runs. */
static zt_status refuse_unsupported(const trainer *t, int32_t tp_size, zt_error *err)
{
    const zt_train_request *q = t->req;
    const char *what = t->set->clip > 0 ? "gradient_clipping" : q->export_dir || q->export_adapter_dir ? "--export"
                       : q->resume ? "--resume" : t->set->checkpoint_every > 0 ? "checkpoint.every"
                       : t->set->checkpoint_final ? "checkpoint.final" : NULL;
    if (!what) return ZT_OK;
    return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                        "model_parallel %d: tensor-parallel training in this zt computes the steps only; %s needs "
                        "the whole tensors (a global gradient norm, or checkpoints and exports gathered over the "
                        "tensor-parallel ranks), which it does not assemble. Set gradient_clipping to 0, "
                        "checkpoint.every to 0 and checkpoint.final to false and leave out --export and --resume, "
                        "or train with model_parallel 1", (int)tp_size, what);
}

zt_status tr_tensor_parallel(trainer *t, int32_t tp_size, int32_t tp_rank, int32_t seq_parallel, zt_error *err)
{
    if (tp_size <= 1) return ZT_OK;
    zt_status refused = refuse_unsupported(t, tp_size, err);
    if (refused != ZT_OK) return refused;
    const zt_model_ops *m = t->model;
    const char *name = t->model_lp->plugin->name;
    if (m->struct_size < ZT_MODEL_OPS_SIZE_1_4 || !m->parallelize || !m->param_shard)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "model_parallel %d needs a model plugin that splits itself over tensor-parallel ranks "
                            "(ABI 1.4 parallelize and param_shard); the model plugin %s has none: train it with "
                            "model_parallel 1", (int)tp_size, name);
    zt_status st = t->host->group_get(t->host->ctx, "tp", &t->tp);
    if (st != ZT_OK) return tr_host_failed(t, st, err, "the \"tp\" group (created by the parallel plugin)");
    if (t->tp.size != tp_size || t->tp.rank != tp_rank)
        return zt_error_set(err, ZT_ERR_INTERNAL, "the \"tp\" group has rank %d of %d, the rank grid says %d of %d",
                            (int)t->tp.rank, (int)t->tp.size, (int)tp_rank, (int)tp_size);
    zt_model_parallel p = {.struct_size = sizeof p, .tp_size = tp_size, .tp_rank = tp_rank,
                           .seq_parallel = seq_parallel, .tp = t->tp};
    st = m->parallelize(t->model_lp->state, &p);
    if (st != ZT_OK) return zt_plugin_failed(t->model_lp, st, err, "parallelize(tp rank %d of %d)", (int)tp_rank,
                                             (int)tp_size);
    int32_t n = t->info->n_params_decl;
    t->tp_shards = calloc((size_t)n, sizeof *t->tp_shards);
    if (!t->tp_shards) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the parameter shards");
    for (int32_t i = 0; i < n; i++) {
        t->tp_shards[i].struct_size = sizeof t->tp_shards[i];
        st = m->param_shard(t->model_lp->state, i, &t->tp_shards[i]);
        if (st != ZT_OK)
            return zt_plugin_failed(t->model_lp, st, err, "param_shard(%s)", t->info->params[i].name);
    }
    return ZT_OK;
}

void tr_tensor_parallel_free(trainer *t)
{
    free(t->tp_shards);
    t->tp_shards = NULL;
}
