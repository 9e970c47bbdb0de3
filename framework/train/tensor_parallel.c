/* Tensor parallelism from the trainer's side: the model splits itself (zt_model_ops.parallelize,
 * ABI 1.4) and says where each rank's shard of a parameter lies (param_shard); the layout then holds
 * only this rank's shards (train/layout.h), which the zero plugin shards again over "dp". */
#include <stdlib.h>
#include <string.h>

#include "train/trainer_internal.h"

/* What a tensor-parallel run does not do: the adapter export (it reads the whole adapter on rank 0 of
 * "dp", which holds only its tensor shard; a LoRA adapter is refused with model_parallel above 1
 * anyway, by the llama plugin). Refused before anything runs. */
static zt_status refuse_unsupported(const trainer *t, int32_t tp_size, zt_error *err)
{
    if (!t->req->export_adapter_dir) return ZT_OK;
    return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                        "model_parallel %d: --export-adapter reads the whole adapter on one rank, which holds only its "
                        "tensor-parallel shard, and adapters train with model_parallel 1 only: leave --export-adapter "
                        "out (--export works), or train with model_parallel 1", (int)tp_size);
}

zt_status tr_tensor_parallel(trainer *t, int32_t tp_size, int32_t tp_rank, int32_t seq_parallel, zt_error *err)
{
    if (tp_size <= 1) return ZT_OK;
    zt_status refused = refuse_unsupported(t, tp_size, err);
    if (refused != ZT_OK) return refused;
    /* sequence parallelism splits each micro-batch's tokens into tp equal shards (the model checks each
     * call too; this says so before anything runs) */
    int64_t tokens = t->set->micro_batch * t->set->seq_len;
    if (seq_parallel && tokens % tp_size)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "parallel_config.use_seq_parallel splits each micro-batch's train_micro_batch_size_per_gpu "
                            "x data.seq_len = %lld x %lld = %lld tokens over model_parallel %d ranks, and %lld does not "
                            "divide by %d: make data.seq_len a multiple of %d, or turn use_seq_parallel off",
                            (long long)t->set->micro_batch, (long long)t->set->seq_len, (long long)tokens,
                            (int)tp_size, (long long)tokens, (int)tp_size, (int)tp_size);
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
    t->tp_all_shards = calloc((size_t)n * (size_t)tp_size, sizeof *t->tp_all_shards);
    if (!t->tp_all_shards) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the parameter shards");
    st = t->host->all_gather(t->host->ctx, &t->tp, t->tp_shards, t->tp_all_shards,
                             (uint64_t)n * sizeof *t->tp_shards, ZT_U8, NULL);
    if (st != ZT_OK) return tr_host_failed(t, st, err, "gathering the tensor-parallel shards (all-gather over 'tp')");
    return ZT_OK;
}

zt_status tr_tp_gather_unit(trainer *t, int32_t unit, const float *local, float *all, zt_error *err)
{
    zt_status st = t->host->all_gather(t->host->ctx, &t->tp, local, all,
                                       (uint64_t)t->layout->units[unit].padded_numel, ZT_F32, NULL);
    return st == ZT_OK ? ZT_OK : tr_host_failed(t, st, err, "gathering a unit's shards (all-gather over 'tp')");
}

typedef struct assemble_ctx {
    const float *rank_param; /* the parameter's storage in one rank's unit */
    int64_t lo, hi;          /* the logical elements asked for */
    float *dst;              /* logical element lo */
} assemble_ctx;

static zt_status assemble_run(void *ctx, int64_t local, int64_t logical, int64_t count)
{
    const assemble_ctx *a = ctx;
    int64_t from = logical > a->lo ? logical : a->lo, to = logical + count < a->hi ? logical + count : a->hi;
    if (from < to)
        memcpy(a->dst + (from - a->lo), a->rank_param + local + (from - logical), (size_t)(to - from) * sizeof(float));
    return ZT_OK;
}

void tr_tp_assemble(const trainer *t, int32_t param, const float *all, int64_t unit_numel, int64_t elem_offset,
                    int64_t count, float *dst)
{
    int32_t n = t->info->n_params_decl;
    for (int32_t k = 0; k < t->tp.size; k++) {
        const zt_param_shard *sh = &t->tp_all_shards[(size_t)k * (size_t)n + (size_t)param];
        assemble_ctx a = {all + (int64_t)k * unit_numel + t->layout->param_offset[param], elem_offset,
                          elem_offset + count, dst};
        zt_layout_runs_of(t->layout, param, sh, 0, t->layout->numel[param], assemble_run, &a);
        if (sh->split_dim < 0) break; /* replicated: every rank holds the same */
    }
}

void tr_tensor_parallel_free(trainer *t)
{
    free(t->tp_shards);
    free(t->tp_all_shards);
    t->tp_shards = t->tp_all_shards = NULL;
}
