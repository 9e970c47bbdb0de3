/* Weights into the trainer (random initialization, a Hugging Face directory), moved one unit's shard
 * at a time through the zero plugin; export.c takes them out again. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "base/json.h"
#include "base/log.h"
#include "state/checkpoint.h"
#include "state/hf_model.h"
#include "state/model_config.h"
#include "train/trainer_internal.h"

/* ---- weights in ------------------------------------------------------------------------------- */

void tr_unit_regions(trainer *t, int32_t u, unit_region r[2], int *n)
{
    void *zs = t->zero_lp->state;
    int split = t->zero->struct_size >= ZT_ZERO_OPS_SIZE_1_3 && t->zero->frozen_range;
    int64_t padded = t->layout->units[u].padded_numel, trainable = split ? t->layout->trainable_numel[u] : padded;
    r[0] = (unit_region){ZT_SHARD_MASTER, 0, trainable, 0, 0};
    t->zero->shard_range(zs, u, &r[0].offset, &r[0].count);
    *n = 1;
    if (!split || trainable == padded) return;
    r[1] = (unit_region){ZT_SHARD_FROZEN, trainable, padded - trainable, 0, 0};
    t->zero->frozen_range(zs, u, &r[1].offset, &r[1].count);
    *n = 2;
}

/* Frozen parameters go in through the same sources (their values land in the compute copy only). */
zt_status tr_load_master(trainer *t, shard_source fill, void *ctx, zt_error *err)
{
    void *zs = t->zero_lp->state;
    zt_status st = tr_hold_shard_buffer(t, err);
    for (int32_t u = 0; u < t->info->n_units && st == ZT_OK; u++) {
        unit_region r[2];
        int n;
        tr_unit_regions(t, u, r, &n);
        for (int k = 0; k < n && st == ZT_OK; k++) {
            if (!r[k].count) continue;
            st = fill(t, ctx, u, r[k].offset, r[k].count, t->shard_buf, err);
            if (st != ZT_OK) return st;
            st = t->zero->write_shard(zs, u, r[k].which, t->shard_buf);
            if (st != ZT_OK)
                return zt_plugin_failed(t->zero_lp, st, err, "write_shard(unit %d, %s)", (int)u,
                                        r[k].which == ZT_SHARD_FROZEN ? "frozen weights" : "weights");
        }
    }
    return st;
}

zt_status tr_random_source(trainer *t, void *ctx, int32_t unit, int64_t offset, int64_t count, float *dst,
                           zt_error *err)
{
    (void)ctx, (void)err;
    zt_layout_init_range(t->layout, t->rt, unit, (uint64_t)t->set->seed, offset, count, dst);
    return ZT_OK;
}


zt_status tr_for_each_piece(trainer *t, int32_t u, int64_t offset, int64_t count, float *slice, piece_fn fn,
                            void *ctx, zt_error *err)
{
    const zt_unit_layout *ul = &t->layout->units[u];
    for (int32_t i = ul->first_param; i < ul->first_param + ul->n_params; i++) {
        int64_t lo = t->layout->param_offset[i];
        if (lo < 0) continue; /* tied */
        int64_t hi = lo + t->layout->numel[i];
        int64_t from = lo > offset ? lo : offset, to = hi < offset + count ? hi : offset + count;
        if (from >= to) continue;
        zt_status st = fn(t, ctx, i, from - lo, to - from, slice + (from - offset), err);
        if (st != ZT_OK) return st;
    }
    return ZT_OK;
}

typedef struct hf_sources {
    zt_hf_model *model;
    zt_st_file *adapter; /* NULL: the adapter's parameters start as declared */
} hf_sources;

/* One run of a parameter's storage read from the HF files: with tensor parallelism, the logical
 * tensor's elements this rank's shard holds (train/layout.h). */
typedef struct hf_run {
    zt_hf_model *model;
    const zt_param_decl *p;
    float *param; /* the parameter's storage, from its first element */
    zt_error *err;
} hf_run;

static zt_status hf_read_run(void *ctx, int64_t local, int64_t logical, int64_t count)
{
    const hf_run *r = ctx;
    return zt_hf_model_read(r->model, r->p->name, r->p->ndim, r->p->shape, (uint64_t)logical, (uint64_t)count,
                            r->param + local, r->err);
}

/* A base parameter from the HF files; an adapter's from its peft file or its declared init. */
static zt_status hf_piece(trainer *t, void *ctx, int32_t param, int64_t elem_offset, int64_t n, float *slice_at,
                          zt_error *err)
{
    const hf_sources *src = ctx;
    const zt_param_decl *p = &t->info->params[param];
    if ((p->flags & ZT_PARAM_ADAPTER) && src->adapter)
        return tr_adapter_read(t, src->adapter, param, elem_offset, n, slice_at, err);
    if (p->flags & ZT_PARAM_ADAPTER) {
        zt_layout_init_range(t->layout, t->rt, p->unit, (uint64_t)t->set->seed, t->layout->param_offset[param] + elem_offset,
                             n, slice_at);
        return ZT_OK;
    }
    hf_run run = {src->model, p, slice_at - elem_offset, err};
    return zt_layout_shard_runs(t->layout, param, elem_offset, n, hf_read_run, &run);
}

static zt_status hf_source(trainer *t, void *ctx, int32_t unit, int64_t offset, int64_t count, float *dst,
                           zt_error *err)
{
    memset(dst, 0, (size_t)count * sizeof *dst);
    return tr_for_each_piece(t, unit, offset, count, dst, hf_piece, ctx, err);
}

zt_status tr_load_hf(trainer *t, const char *dir, const char *adapter_dir, zt_error *err)
{
    hf_sources src = {NULL, NULL};
    zt_status st = zt_hf_model_open(dir, &src.model, err);
    if (st != ZT_OK) return st;
    if (adapter_dir) st = tr_adapter_open(t, adapter_dir, &src.adapter, err);
    if (st == ZT_OK) st = tr_load_master(t, hf_source, &src, err);
    if (st == ZT_OK && t->set->checkpoint_only_trainable && t->dp.rank == 0) {
        st = tr_base_hash_hf(t, src.model, &t->base_hash, err);
        t->base_hash_known = st == ZT_OK;
    }
    zt_hf_model_close(src.model);
    zt_st_close(src.adapter);
    if (st == ZT_OK) zt_log(ZT_LOG_INFO, "weights loaded from %s%s%s", dir, adapter_dir ? ", the adapter from " : "",
                            adapter_dir ? adapter_dir : "");
    return st;
}
