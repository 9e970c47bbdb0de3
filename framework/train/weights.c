/* Weights into the trainer (random initialization, a Hugging Face directory) and out of it (the HF
 * export at the end of a run), moved one unit's shard at a time through the zero plugin. */
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
    return zt_hf_model_read(src->model, p->name, p->ndim, p->shape, (uint64_t)elem_offset, (uint64_t)n, slice_at, err);
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
    zt_hf_model_close(src.model);
    zt_st_close(src.adapter);
    if (st == ZT_OK) zt_log(ZT_LOG_INFO, "weights loaded from %s%s%s", dir, adapter_dir ? ", the adapter from " : "",
                            adapter_dir ? adapter_dir : "");
    return st;
}

/* ---- HF export -------------------------------------------------------------------------------- */

typedef struct export_ctx {
    trainer *t;
    const zt_hf_tensor_list *list;
    int32_t loaded_unit; /* whose master is in shard_buf; -1 none */
} export_ctx;

static zt_status export_fill(void *opaque, size_t index, uint64_t elem_offset, uint64_t count, float *dst,
                             zt_error *err)
{
    export_ctx *x = opaque;
    trainer *t = x->t;
    const char *name = x->list->specs[index].name;
    int32_t i = zt_layout_find(t->layout, name);
    if (i < 0)
        return zt_error_set(err, ZT_ERR_INTERNAL, "export: the model has no parameter '%s' that config.json implies",
                            name);
    int32_t owner = t->layout->owner[i];
    int32_t unit = t->info->params[owner].unit;
    if (x->loaded_unit != unit) {
        zt_status st = ZT_OK;
        if (t->dp.size > 1) st = t->host->broadcast(t->host->ctx, &t->dp, &unit, 1, ZT_I32, 0, NULL);
        if (st != ZT_OK) return tr_host_failed(t, st, err, "asking the ranks for a unit to export (broadcast over 'dp')");
        st = tr_gather_master(t, unit, t->shard_buf, err);
        if (st != ZT_OK) return st;
        x->loaded_unit = unit;
    }
    memcpy(dst, t->shard_buf + t->layout->param_offset[owner] + (int64_t)elem_offset, count * sizeof(float));
    tr_adapter_merge(t, owner, t->shard_buf, elem_offset, count, dst); /* LoRA: W + scaling * B A */
    return ZT_OK;
}

/* The config.json of the trained model: the --model one, else built from the model and its keys. */
static zt_status export_config(trainer *t, zt_hf_config *c, zt_error *err)
{
    if (t->req->model_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", t->req->model_dir);
        return zt_hf_config_load(path, c, err);
    }
    const zt_config *cfg = t->req->cfg;
    if (zt_config_is_set(cfg, "model.preset") &&
        (!zt_config_is_set(cfg, "model.rms_norm_eps") || !zt_config_is_set(cfg, "model.rope_theta")))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--export with model.preset needs model.rms_norm_eps and model.rope_theta set "
                            "explicitly (the preset's values are internal to the model plugin); add them, e.g. "
                            "--set model.rms_norm_eps=1e-5 --set model.rope_theta=10000");
    const zt_model_info *m = t->info;
    zt_hf_config_defaults(c);
    c->hidden_size = m->hidden_size;
    c->intermediate_size = m->intermediate_size;
    c->num_hidden_layers = m->n_layers;
    c->num_attention_heads = m->n_heads;
    c->num_key_value_heads = m->n_kv_heads;
    c->head_dim = m->head_dim;
    c->vocab_size = m->vocab_size;
    c->max_position_embeddings = m->max_seq_len;
    c->tie_word_embeddings = 0;
    for (int32_t i = 0; i < m->n_params_decl; i++)
        if (m->params[i].flags & ZT_PARAM_TIED) c->tie_word_embeddings = 1;
    zt_config_get_float(cfg, "model.rms_norm_eps", &c->rms_norm_eps);
    zt_config_get_float(cfg, "model.rope_theta", &c->rope_theta);
    zt_config_get_float(cfg, "model.initializer_range", &c->initializer_range);
    const char *rope_type = "none";
    zt_config_get_string(cfg, "model.rope_scaling.rope_type", &rope_type);
    if (!strcmp(rope_type, "llama3")) {
        c->rope_llama3 = 1;
        zt_config_get_float(cfg, "model.rope_scaling.factor", &c->rope_factor);
        zt_config_get_float(cfg, "model.rope_scaling.low_freq_factor", &c->rope_low_freq_factor);
        zt_config_get_float(cfg, "model.rope_scaling.high_freq_factor", &c->rope_high_freq_factor);
        zt_config_get_int(cfg, "model.rope_scaling.original_max_position_embeddings",
                          &c->rope_original_max_position_embeddings);
    }
    /* The special tokens of the tokenizer the data was prepared with. */
    c->bos_token_id = t->data_info->bos_id;
    c->pad_token_id = t->data_info->pad_id;
    c->n_eos = 0;
    if (t->data_info->eos_id >= 0) c->eos_token_ids[c->n_eos++] = t->data_info->eos_id;
    c->dtype = ZT_ST_F32;
    return ZT_OK;
}

static zt_status export_hf_rank0(trainer *t, zt_error *err)
{
    zt_hf_config c;
    zt_status st = export_config(t, &c, err);
    if (st != ZT_OK) return st;
    c.dtype = ZT_ST_F32;
    zt_hf_tensor_list list = {0};
    st = zt_hf_llama_tensors(&c, ZT_ST_F32, &list, err);
    if (st != ZT_OK) return st;
    export_ctx x = {t, &list, -1};
    st = zt_hf_export(t->req->export_dir, &c, list.specs, list.n, export_fill, &x, 0, err);
    zt_hf_tensor_list_free(&list);
    if (st == ZT_OK) zt_log(ZT_LOG_INFO, "model exported in Hugging Face format to %s", t->req->export_dir);
    return st;
}

/* Rank 0 writes the files. Sharded units are gathered as it reads them: it broadcasts each unit it
 * needs and every rank joins the gather, until it broadcasts -1. */
zt_status tr_export_hf(trainer *t, zt_error *err)
{
    zt_status st = tr_hold_shard_buffer(t, err);
    st = tr_agree_on_status(t, st, err, "holding a unit's weights for the export");
    if (st != ZT_OK) return st;
    int32_t unit = -1;
    if (t->dp.rank == 0) {
        st = export_hf_rank0(t, err);
        if (t->dp.size > 1) t->host->broadcast(t->host->ctx, &t->dp, &unit, 1, ZT_I32, 0, NULL);
    } else {
        while (st == ZT_OK) {
            st = t->host->broadcast(t->host->ctx, &t->dp, &unit, 1, ZT_I32, 0, NULL);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "waiting for rank 0's export (broadcast over 'dp')");
            if (st != ZT_OK || unit < 0) break;
            st = tr_gather_master(t, unit, t->shard_buf, err);
        }
    }
    tr_drop_shard_buffer(t);
    return tr_agree_on_status(t, st, err, "exporting the model");
}

