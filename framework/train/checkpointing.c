/* Checkpoints of a training run (docs/checkpoint-format.md): every rank writes its shard of the
 * fp32 weights and optimizer state with the step, the loader position, the schedule and the resolved
 * config; rank 0 commits them. Resuming restores all of it, under any rank count or ZeRO stage. */
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

#define TRAINER_STATE_BLOB "trainer_state"
#define TRAINER_STATE_FORMAT "zt-trainer-state"

/* ---- checkpoints ------------------------------------------------------------------------------ */

static const char *state_name(trainer *t, int32_t k)
{
    const char *name = t->opt->state_name ? t->opt->state_name(t->opt_lp->state, k) : NULL;
    return name ? name : "state";
}

static int32_t n_opt_state(trainer *t)
{
    return t->opt->n_state ? t->opt->n_state(t->opt_lp->state) : 0;
}

/* checkpoint.only_trainable: ,"base_weights":{...} for the trainer state (docs/checkpoint-format.md),
 * which a resume checks the base model against; else "". NULL: out of memory. */
static char *base_weights_json(trainer *t)
{
    if (!t->set->checkpoint_only_trainable) return strdup("");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    int64_t n = 0;
    for (int32_t i = 0; i < t->info->n_params_decl; i++) n += tr_is_frozen_with_storage(t, i);
    fprintf(f, ",\"base_weights\":{\"only_trainable\":true,\"hash\":\"%016llx\",\"frozen_tensors\":%lld,\"model\":",
            (unsigned long long)t->base_hash, (long long)n);
    if (t->req->model_dir) zt_json_write_string(f, t->req->model_dir, strlen(t->req->model_dir));
    else fputs("null", f);
    fputc('}', f);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* The trainer's own state: JSON, one object. */
static char *trainer_state_json(trainer *t, int64_t step)
{
    char schedule[512];
    zt_schedule_to_json(&t->schedule, schedule, sizeof schedule);
    /* fp16: the loss scaler, so a resumed run continues with the scale (and Adam step count) it had */
    char scaler[320] = "";
    if (t->fp16)
        snprintf(scaler, sizeof scaler,
                 ",\"loss_scale\":{\"scale\":%.17g,\"hysteresis_left\":%lld,\"good_steps\":%lld,"
                 "\"overflows_at_min\":%lld,\"skipped_total\":%lld}",
                 t->scaler.scale, (long long)t->scaler.hysteresis_left, (long long)t->scaler.good_steps,
                 (long long)t->scaler.overflows_at_min, (long long)t->scaler.skipped_total);
    char *base = base_weights_json(t), *text = NULL;
    if (!base || asprintf(&text,
                          "{\"format\":\"" TRAINER_STATE_FORMAT "\",\"version\":1,\"step\":%lld,\"seed\":%lld,"
                          "\"elapsed_s\":%.17g,\"tokens_seen\":%lld,\"schedule\":%s%s%s}",
                          (long long)step, (long long)t->set->seed, t->elapsed_before + t->session_s,
                          (long long)t->tokens_seen, schedule, scaler, base) < 0)
        text = NULL;
    free(base);
    return text;
}

typedef struct save_ctx {
    zt_ckpt_rank_writer *w;
    const char *group;
} save_ctx;

/* One run of a tensor-parallel shard: the logical elements it holds, under the logical tensor's name. */
typedef struct shard_run {
    zt_ckpt_rank_writer *w;  /* saving; NULL: reading from ckpt */
    zt_ckpt *ckpt;
    const char *name, *group;
    float *param;            /* the parameter's storage, from its first element */
    zt_error *err;
} shard_run;

static zt_status save_run(void *ctx, int64_t local, int64_t logical, int64_t count)
{
    const shard_run *r = ctx;
    return zt_ckpt_rank_writer_add_shard(r->w, r->name, r->group, logical, count, r->param + local, r->err);
}

static zt_status read_run(void *ctx, int64_t local, int64_t logical, int64_t count)
{
    const shard_run *r = ctx;
    return zt_ckpt_read(r->ckpt, r->name, r->group, logical, count, r->param + local, r->err);
}

/* With tensor parallelism a parameter's storage is this rank's shard of it: its runs of logical
 * elements (train/layout.h) are what a checkpoint stores, so any other layout reads them back. A
 * parameter replicated over "tp" is saved by tp rank 0 only. */
static zt_status save_piece(trainer *t, void *ctx, int32_t param, int64_t elem_offset, int64_t n, float *slice_at,
                            zt_error *err)
{
    save_ctx *s = ctx;
    if (!t->layout->trainable[param] && (strcmp(s->group, ZT_CKPT_GROUP_PARAM) != 0 || t->set->checkpoint_only_trainable))
        return ZT_OK; /* no state; with checkpoint.only_trainable no weights either */
    const char *name = t->info->params[param].name;
    if (!t->tp_shards) return zt_ckpt_rank_writer_add_shard(s->w, name, s->group, elem_offset, n, slice_at, err);
    if (t->tp_shards[param].split_dim < 0 && t->tp.rank != 0) return ZT_OK;
    shard_run run = {s->w, NULL, name, s->group, slice_at - elem_offset, err};
    return zt_layout_shard_runs(t->layout, param, elem_offset, n, save_run, &run);
}

/* Elements [elem_offset, elem_offset + n) of this rank's storage of `param` from the checkpoint's
 * logical tensor (with tensor parallelism, the runs of logical elements the rank's shard holds). */
static zt_status read_param(trainer *t, zt_ckpt *c, int32_t param, const char *group, int64_t elem_offset,
                            int64_t n, float *slice_at, zt_error *err)
{
    const char *name = t->info->params[param].name;
    if (!t->tp_shards) return zt_ckpt_read(c, name, group, elem_offset, n, slice_at, err);
    shard_run run = {NULL, c, name, group, slice_at - elem_offset, err};
    return zt_layout_shard_runs(t->layout, param, elem_offset, n, read_run, &run);
}

static char *resolved_config_json(trainer *t, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing the resolved config");
        return NULL;
    }
    zt_status st = zt_config_write_resolved(t->req->cfg, f, t->req->plugins_json, err);
    if (fclose(f) != 0 && st == ZT_OK) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != ZT_OK) {
        free(text);
        return NULL;
    }
    return text;
}

/* The declarations of every tensor a checkpoint holds: weights of every parameter with storage (of
 * the trainable ones with checkpoint.only_trainable), optimizer state of the trainable ones. */
static zt_ckpt_tensor_decl *checkpoint_decls(trainer *t, size_t *n_out)
{
    int32_t n_state = n_opt_state(t), np = t->info->n_params_decl;
    zt_ckpt_tensor_decl *d = calloc((size_t)np * (size_t)(1 + n_state), sizeof *d);
    size_t n = 0;
    for (int32_t g = 0; d && g <= n_state; g++) {
        for (int32_t i = 0; i < np; i++) {
            const zt_param_decl *p = &t->info->params[i];
            int keep = t->layout->trainable[i] || (g == 0 && !t->set->checkpoint_only_trainable);
            if (t->layout->param_offset[i] < 0 || !keep) continue;
            d[n].name = p->name;
            d[n].group = g == 0 ? ZT_CKPT_GROUP_PARAM : state_name(t, g - 1);
            d[n].ndim = p->ndim;
            for (int32_t k = 0; k < p->ndim; k++) d[n].shape[k] = p->shape[k];
            n++;
        }
    }
    *n_out = n;
    return d;
}

static zt_status write_rank_file(trainer *t, const char *staging, int64_t step, const zt_loader_position *pos,
                                 zt_ckpt_rank_result *result, zt_error *err)
{
    zt_ckpt_rank_writer *w;
    zt_status st = zt_ckpt_rank_writer_open(staging, t->world.rank, &w, err);
    if (st != ZT_OK) return st;
    void *zs = t->zero_lp->state;
    int32_t n_state = n_opt_state(t);
    /* a pipeline stage saves the units it trains; the others' copies on it are stale */
    for (int32_t u = t->grid.first_unit; u <= t->grid.last_unit && st == ZT_OK; u++) {
        unit_region r[2];
        int n;
        tr_unit_regions(t, u, r, &n);
        for (int k = 0; k < n && st == ZT_OK; k++) {
            if (!r[k].count || (r[k].count == r[k].size && t->dp.rank != 0)) continue; /* replicated: rank 0 */
            if (r[k].which == ZT_SHARD_FROZEN && t->set->checkpoint_only_trainable) continue;
            /* the frozen region holds weights only; the trainable one its optimizer state too */
            int32_t last = r[k].which == ZT_SHARD_FROZEN ? 0 : n_state;
            for (int32_t which = 0; which <= last && st == ZT_OK; which++) {
                int32_t array = r[k].which == ZT_SHARD_FROZEN ? ZT_SHARD_FROZEN : which;
                st = t->zero->read_shard(zs, u, array, t->shard_buf);
                if (st != ZT_OK) {
                    st = zt_plugin_failed(t->zero_lp, st, err, "read_shard(unit %d, array %d)", (int)u, (int)array);
                    break;
                }
                save_ctx sc = {w, which == 0 ? ZT_CKPT_GROUP_PARAM : state_name(t, which - 1)};
                st = tr_for_each_piece(t, u, r[k].offset, r[k].count, t->shard_buf, save_piece, &sc, err);
            }
        }
    }
    char position[512], blob_name[64];
    zt_loader_position_to_json(pos, position, sizeof position);
    snprintf(blob_name, sizeof blob_name, "loader_position.rank-%05d", (int)t->dp.rank);
    /* every (tp, pp) position of a data-parallel rank loads the same batches: one of them saves it */
    int loader_writer = t->grid.tp_rank == 0 && t->grid.pp_rank == 0;
    if (st == ZT_OK && loader_writer)
        st = zt_ckpt_rank_writer_add_blob(w, blob_name, position, strlen(position), err);
    if (st == ZT_OK && t->world.rank == 0) {
        char *state = trainer_state_json(t, step);
        st = state ? zt_ckpt_rank_writer_add_blob(w, TRAINER_STATE_BLOB, state, strlen(state), err)
                   : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing the trainer state");
        free(state);
    }
    if (st != ZT_OK) {
        zt_ckpt_rank_writer_abort(w);
        return st;
    }
    return zt_ckpt_rank_writer_finish(w, result, err);
}

/* Every rank's description of its data file, on rank 0 (all[r] for rank r, all[0] == *mine); the
 * other ranks send theirs. */
static zt_status gather_rank_results(trainer *t, const zt_ckpt_rank_result *mine, zt_ckpt_rank_result *all,
                                     zt_error *err)
{
    const zt_host *h = t->host;
    zt_status st = ZT_OK;
    if (t->world.rank != 0) {
        int64_t header[2] = {(int64_t)mine->n_pieces, (int64_t)mine->file_size};
        st = h->send(h->ctx, &t->world, header, 2, ZT_I64, 0, NULL);
        if (st == ZT_OK && mine->n_pieces)
            st = h->send(h->ctx, &t->world, mine->pieces, mine->n_pieces * sizeof *mine->pieces, ZT_U8, 0, NULL);
        return st == ZT_OK ? ZT_OK : tr_host_failed(t, st, err, "sending this rank's checkpoint description to rank 0");
    }
    all[0] = *mine;
    for (int32_t r = 1; r < t->world.size && st == ZT_OK; r++) {
        int64_t header[2];
        st = h->recv(h->ctx, &t->world, header, 2, ZT_I64, r, NULL);
        if (st != ZT_OK) break;
        all[r].rank = r;
        all[r].file_size = (uint64_t)header[1];
        all[r].n_pieces = (size_t)header[0];
        all[r].pieces = calloc(all[r].n_pieces ? all[r].n_pieces : 1, sizeof *all[r].pieces);
        if (!all[r].pieces)
            return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory receiving rank %d's checkpoint description",
                                (int)r);
        if (all[r].n_pieces)
            st = h->recv(h->ctx, &t->world, all[r].pieces, all[r].n_pieces * sizeof *all[r].pieces, ZT_U8, r, NULL);
    }
    return st == ZT_OK ? ZT_OK : tr_host_failed(t, st, err, "receiving the ranks' checkpoint descriptions");
}

/* Rank 0 stages the directory and tells the others where it is; every rank writes its own file; rank 0
 * collects the descriptions and publishes (checkpoint.h). The ranks agree after each part, so a
 * failure on one of them stops all of them at the same point. */
zt_status tr_save_checkpoint(trainer *t, int64_t step, const zt_loader_position *pos, char **final_dir,
                             zt_error *err)
{
    double started = zt_now_s();
    char *staging = NULL, *config = NULL;
    char staging_path[4096] = "";
    zt_ckpt_rank_result result = {0};
    zt_ckpt_rank_result *all = calloc((size_t)t->world.size, sizeof *all);
    size_t n_decls = 0;
    zt_ckpt_tensor_decl *decls = NULL;
    zt_status st = all ? tr_hold_shard_buffer(t, err)
                       : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving a checkpoint");
    if (st == ZT_OK && t->set->checkpoint_only_trainable && t->world.rank == 0 && !t->base_hash_known)
        st = zt_error_set(err, ZT_ERR_INTERNAL, "checkpoint.only_trainable: the base weights were never hashed");
    if (st == ZT_OK && t->world.rank == 0) st = zt_ckpt_stage(t->set->checkpoint_dir, step, &staging, err);
    if (st == ZT_OK && staging && strlen(staging) >= sizeof staging_path)
        st = zt_error_set(err, ZT_ERR_CONFIG, "checkpoint.dir is too long: %s", staging);
    if (st == ZT_OK && staging) memcpy(staging_path, staging, strlen(staging) + 1);
    st = tr_agree_on_status_in(t, &t->world, st, err, "creating the checkpoint's directory");
    if (st == ZT_OK && t->world.size > 1) {
        st = t->host->broadcast(t->host->ctx, &t->world, staging_path, sizeof staging_path, ZT_U8, 0, NULL);
        if (st != ZT_OK) st = tr_host_failed(t, st, err, "sharing the checkpoint's directory (broadcast over 'world')");
    }
    if (st == ZT_OK) st = write_rank_file(t, staging_path, step, pos, &result, err);
    st = tr_agree_on_status_in(t, &t->world, st, err, "writing the checkpoint's rank files");
    if (st == ZT_OK) st = gather_rank_results(t, &result, all, err);
    if (st == ZT_OK && t->world.rank == 0) {
        if (!(decls = checkpoint_decls(t, &n_decls)))
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory listing the checkpoint's tensors");
        else if (!(config = resolved_config_json(t, err)))
            st = err->status;
    }
    if (st == ZT_OK && t->world.rank == 0) {
        zt_ckpt_commit_args a = {.root = t->set->checkpoint_dir,
                                 .staging_dir = staging,
                                 .step = step,
                                 .config_json = config,
                                 .layout = {.world_size = t->host->world_size,
                                            .zero_stage = t->zero->stage,
                                            .dp_size = t->dp.size,
                                            .tp_size = t->grid.tp_size,
                                            .pp_size = t->grid.pp_size},
                                 .tensors = decls,
                                 .n_tensors = n_decls,
                                 .ranks = all,
                                 .n_ranks = (size_t)t->world.size,
                                 .keep_last = (int32_t)t->set->checkpoint_keep};
        zt_ckpt_model_shape_from_info(t->info, &a.model);
        st = zt_ckpt_commit(&a, final_dir, err);
    }
    st = tr_agree_on_status_in(t, &t->world, st, err, "publishing the checkpoint");
    if (st != ZT_OK && staging) zt_ckpt_discard_stage(staging);
    if (st == ZT_OK) zt_log(ZT_LOG_INFO, "checkpoint of step %lld saved to %s (%.1f s)", (long long)step,
                            final_dir && *final_dir ? *final_dir : t->set->checkpoint_dir, zt_now_s() - started);
    for (int32_t r = 1; all && r < t->world.size; r++) zt_ckpt_rank_result_free(&all[r]);
    zt_ckpt_rank_result_free(&result);
    free(all);
    free(staging);
    free(config);
    free(decls);
    tr_drop_shard_buffer(t);
    return st;
}

typedef struct resume_ctx {
    zt_ckpt *ckpt;
    const char *group;
    int64_t missing;   /* optimizer-state elements the checkpoint lacks (newly trainable parameters) */
} resume_ctx;

static zt_status param_piece(trainer *t, void *ctx, int32_t param, int64_t elem_offset, int64_t n, float *slice_at,
                             zt_error *err)
{
    resume_ctx *r = ctx;
    return read_param(t, r->ckpt, param, ZT_CKPT_GROUP_PARAM, elem_offset, n, slice_at, err);
}

static zt_status ckpt_param_source(trainer *t, void *ctx, int32_t unit, int64_t offset, int64_t count, float *dst,
                                   zt_error *err)
{
    resume_ctx *r = ctx;
    if (!t->tp_shards)
        return zt_ckpt_read_unit_shard(r->ckpt, &t->layout->layout, unit, ZT_CKPT_GROUP_PARAM, offset, count, dst, err);
    memset(dst, 0, (size_t)count * sizeof *dst); /* a tensor-parallel shard's padding */
    return tr_for_each_piece(t, unit, offset, count, dst, param_piece, ctx, err);
}

static zt_status resume_state_piece(trainer *t, void *ctx, int32_t param, int64_t elem_offset, int64_t n,
                                    float *slice_at, zt_error *err)
{
    resume_ctx *r = ctx;
    const char *name = t->info->params[param].name;
    if (!t->layout->trainable[param]) return ZT_OK;
    if (!zt_ckpt_find(r->ckpt, name, r->group)) {
        r->missing += n; /* stays zero: a fresh optimizer state, as for a parameter never trained */
        return ZT_OK;
    }
    return read_param(t, r->ckpt, param, r->group, elem_offset, n, slice_at, err);
}

/* The JSON number of `key` in object text, or fallback. */
static double json_number(const zt_json *j, const char *key, double fallback)
{
    int v = zt_json_object_get(j, 0, key);
    return v >= 0 && zt_json_is_number(j, v) ? zt_json_get_number(j, v) : fallback;
}

/* fp16: the checkpoint's loss scaler; a checkpoint without one (written by a bf16 run or an older zt)
 * starts from the configured initial scale. */
static void restore_loss_scale(trainer *t, const zt_json *j)
{
    int obj = zt_json_object_get(j, 0, "loss_scale");
    if (obj < 0 || j->tok[obj].type != ZT_JSON_OBJECT) {
        zt_log(ZT_LOG_INFO, "fp16: the checkpoint has no loss-scale state (a bf16 run or an older zt): starting from "
               "the initial scale %g", t->scaler.scale);
        return;
    }
    double v[5];
    static const char *const keys[5] = {"scale", "hysteresis_left", "good_steps", "overflows_at_min", "skipped_total"};
    for (int i = 0; i < 5; i++) {
        int at = zt_json_object_get(j, obj, keys[i]);
        v[i] = at >= 0 && zt_json_is_number(j, at) ? zt_json_get_number(j, at) : NAN;
        if (!isfinite(v[i]) || v[i] < 0) {
            zt_log(ZT_LOG_WARN, "fp16: the checkpoint's loss-scale state lacks a valid \"%s\": starting from the "
                   "initial scale %g", keys[i], t->scaler.scale);
            return;
        }
    }
    t->scaler.scale = v[0] < t->scaler.min_scale ? t->scaler.min_scale : v[0];
    t->scaler.hysteresis_left = (int64_t)v[1] < 1 || (int64_t)v[1] > t->scaler.hysteresis ? t->scaler.hysteresis
                                                                                          : (int64_t)v[1];
    t->scaler.good_steps = (int64_t)v[2];
    t->scaler.overflows_at_min = (int64_t)v[3];
    t->scaler.skipped_total = (int64_t)v[4];
    zt_log(ZT_LOG_INFO, "fp16: loss scale %g restored from the checkpoint (%lld steps skipped before it)",
           t->scaler.scale, (long long)t->scaler.skipped_total);
}

static zt_status restore_trainer_state(trainer *t, zt_ckpt *c, zt_error *err)
{
    const void *data;
    size_t size;
    zt_status st = zt_ckpt_blob(c, TRAINER_STATE_BLOB, &data, &size, err);
    if (st != ZT_OK) return st;
    zt_json j;
    st = zt_json_parse(data, size, "checkpoint blob " TRAINER_STATE_BLOB, &j, err);
    if (st != ZT_OK) return st;
    int format = zt_json_object_get(&j, 0, "format");
    if (j.tok[0].type != ZT_JSON_OBJECT || format < 0 || !zt_json_eq(&j, format, TRAINER_STATE_FORMAT) ||
        json_number(&j, "version", 0) != 1 || json_number(&j, "step", -1) != (double)zt_ckpt_step(c)) {
        zt_json_free(&j);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "the checkpoint's " TRAINER_STATE_BLOB " is not a version 1 " TRAINER_STATE_FORMAT
                            " for its step %lld; it was written by another program or version",
                            (long long)zt_ckpt_step(c));
    }
    t->elapsed_before = json_number(&j, "elapsed_s", 0);
    t->tokens_seen = (int64_t)json_number(&j, "tokens_seen", 0);
    double seed = json_number(&j, "seed", -1);
    if (seed != (double)t->set->seed)
        zt_log(ZT_LOG_WARN, "the checkpoint was trained with seed %.0f, this run has seed %lld", seed,
               (long long)t->set->seed);
    if (t->fp16) restore_loss_scale(t, &j);
    int sched = zt_json_object_get(&j, 0, "schedule");
    char now[512];
    zt_schedule_to_json(&t->schedule, now, sizeof now);
    if (sched >= 0) {
        int len = j.tok[sched].end - j.tok[sched].start;
        if ((size_t)len != strlen(now) || memcmp(j.text + j.tok[sched].start, now, (size_t)len) != 0)
            zt_log(ZT_LOG_WARN, "the learning-rate schedule changed since the checkpoint: it was %.*s, now %s", len,
                   j.text + j.tok[sched].start, now);
    }
    zt_json_free(&j);
    return ZT_OK;
}

static zt_status read_position(zt_ckpt *c, int32_t rank, zt_loader_position *pos, zt_error *err)
{
    char blob_name[64];
    snprintf(blob_name, sizeof blob_name, "loader_position.rank-%05d", (int)rank);
    const void *data;
    size_t size;
    zt_status st = zt_ckpt_blob(c, blob_name, &data, &size, err);
    return st == ZT_OK ? zt_loader_position_from_json(data, size, blob_name, pos, err) : st;
}

/* The data stream where the checkpoint left it. With the rank count it was written with, each rank
 * continues its own stream. With another count: rank r of w takes samples r, r + w, ... of each
 * epoch's order, so W ranks that each consumed c samples consumed exactly the first W * c; the new
 * ranks continue from there (rounded down to a multiple of the new count), and when the old ranks
 * had consumed different counts (packed rows), from the smallest, so no sample is skipped and the
 * few consumed beyond it are seen again (logged). */
static zt_status restore_loader(trainer *t, zt_ckpt *c, zt_error *err)
{
    zt_loader_position pos;
    zt_status st = read_position(c, 0, &pos, err);
    if (st != ZT_OK) return st;
    if (pos.world == t->dp.size) {
        if (t->dp.rank != 0) st = read_position(c, t->dp.rank, &pos, err);
        return st == ZT_OK ? zt_loader_set_position(t->train_loader, &pos, err) : st;
    }
    int32_t old_world = pos.world;
    uint64_t consumed = 0, epoch = pos.epoch, cursor = pos.cursor;
    for (int32_t r = 0; r < old_world && st == ZT_OK; r++) {
        zt_loader_position other;
        st = read_position(c, r, &other, err);
        if (st != ZT_OK) break;
        if (other.epoch < epoch || (other.epoch == epoch && other.cursor < cursor)) {
            epoch = other.epoch;
            cursor = other.cursor;
        }
        consumed += other.cursor;
    }
    if (st != ZT_OK) return st;
    uint64_t global = cursor * (uint64_t)old_world, new_cursor = global / (uint64_t)t->dp.size;
    pos.world = t->dp.size;
    pos.rank = t->dp.rank;
    pos.epoch = epoch;
    pos.cursor = new_cursor;
    st = zt_loader_set_position(t->train_loader, &pos, err);
    if (st != ZT_OK) return st;
    uint64_t resumed_at = new_cursor * (uint64_t)t->dp.size;
    if (consumed > resumed_at && pos.epoch == epoch)
        zt_log(ZT_LOG_INFO, "the checkpoint was written by %d data-parallel ranks, this run has %d: the data continues "
               "at sample %llu of epoch %llu, so %llu samples the old ranks had consumed are seen again",
               (int)old_world, (int)t->dp.size, (unsigned long long)resumed_at, (unsigned long long)epoch,
               (unsigned long long)(consumed - resumed_at));
    else
        zt_log(ZT_LOG_INFO, "the checkpoint was written by %d data-parallel ranks, this run has %d: the data continues "
               "at sample %llu of epoch %llu, exactly where the old ranks stopped",
               (int)old_world, (int)t->dp.size, (unsigned long long)resumed_at, (unsigned long long)epoch);
    return ZT_OK;
}

/* Staging directories of saves killed part way (a checkpoint's size each) would pile up: rank 0
 * removes those whose writer is gone before this run writes into the root. A failure here costs
 * only the space, so it is a warning. */
void tr_remove_stale_staging(trainer *t)
{
    if (t->host->world_rank != 0) return;
    zt_error err;
    if (zt_ckpt_remove_stale_staging(t->set->checkpoint_dir, NULL, NULL, &err) != ZT_OK)
        zt_log(ZT_LOG_WARN, "could not look for stale checkpoint staging directories: %s", err.msg);
}

/* After the checkpoint to resume could not be found: what to do, by what `root` holds. list: name
 * the complete checkpoints (the message does not yet). */
static void resume_advice(const char *root, int list, zt_error *err)
{
    zt_ckpt_list l;
    zt_error ignored;
    if (zt_ckpt_list_dir(root, &l, &ignored) != ZT_OK) return;
    if (l.n_complete == 0 && l.n_incomplete == 0) {
        zt_error_append(err, "\nnothing to resume from: train without --resume first, or point --resume at "
                        "a checkpoint directory");
    } else if (l.n_complete == 0) {
        zt_error_append(err, "\nNo complete checkpoint is left in %s: restore what is missing, or train without "
                        "--resume to start over (into another --output-dir, to keep this run's files)", root);
    } else {
        for (size_t i = 0; list && i < l.n_complete; i++)
            zt_error_append(err, "%s%s", i ? ", " : "\nComplete checkpoints in the same root: ", l.complete[i].path);
        zt_error_append(err, "\nResume from an older one (e.g. --resume %s, the newest complete one), or train "
                        "without --resume to start over (into another --output-dir, to keep this run's files)",
                        l.complete[l.n_complete - 1].path);
    }
    zt_ckpt_list_free(&l);
}

static zt_status resolve_resume_dir(trainer *t, char **step_dir, zt_error *err)
{
    const char *want = t->req->resume;
    if (!strcmp(want, "latest")) {
        zt_status st = zt_ckpt_latest(t->set->checkpoint_dir, step_dir, err);
        if (st == ZT_ERR_NOT_FOUND) resume_advice(t->set->checkpoint_dir, 0, err);
        return st;
    }
    char probe[4096];
    struct stat sb;
    snprintf(probe, sizeof probe, "%s/checkpoint.json", want);
    if (stat(probe, &sb) == 0) return (*step_dir = strdup(want)) ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
    if (stat(want, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "--resume %s: no such directory; give a checkpoint (a step-NNNNNN directory), a "
                            "checkpoint root, or latest (the newest under %s)",
                            want, t->set->checkpoint_dir);
    /* A checkpoint directory by its name, not a root: it lacks its index. */
    char root[4096];
    snprintf(root, sizeof root, "%s", want);
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/') root[--n] = '\0';
    char *slash = strrchr(root, '/');
    if (strncmp(slash ? slash + 1 : root, "step-", 5) == 0) {
        if (slash) *(slash == root ? slash + 1 : slash) = '\0';
        else snprintf(root, sizeof root, ".");
        zt_error_set(err, ZT_ERR_NOT_FOUND,
                     "--resume %s: this checkpoint directory has no checkpoint.json, so it is incomplete or "
                     "damaged (the file was deleted or moved, or the save did not finish)",
                     want);
        resume_advice(root, 1, err);
        return ZT_ERR_NOT_FOUND;
    }
    zt_status st = zt_ckpt_latest(want, step_dir, err); /* a root: its newest complete checkpoint */
    if (st == ZT_ERR_NOT_FOUND) resume_advice(want, 0, err);
    return st;
}

/* What the trainer state says of the base model: a checkpoint saved with checkpoint.only_trainable
 * has no frozen weights, and the hash of those it was trained on. */
typedef struct base_record {
    int only_trainable;
    char hash[17];
    char *model; /* the run's --model; NULL when it had none */
} base_record;

static zt_status read_base_record(zt_ckpt *c, const char *dir, base_record *b, zt_error *err)
{
    const void *data;
    size_t size;
    zt_status st = zt_ckpt_blob(c, TRAINER_STATE_BLOB, &data, &size, err);
    zt_json j;
    if (st == ZT_OK) st = zt_json_parse(data, size, "checkpoint blob " TRAINER_STATE_BLOB, &j, err);
    if (st != ZT_OK) return st;
    int obj = j.tok[0].type == ZT_JSON_OBJECT ? zt_json_object_get(&j, 0, "base_weights") : -1;
    if (obj >= 0 && j.tok[obj].type == ZT_JSON_OBJECT) {
        int only = zt_json_object_get(&j, obj, "only_trainable"), hash = zt_json_object_get(&j, obj, "hash");
        int model = zt_json_object_get(&j, obj, "model");
        b->only_trainable = only >= 0 && zt_json_is_bool(&j, only) && zt_json_get_bool(&j, only);
        int len = hash >= 0 && j.tok[hash].type == ZT_JSON_STRING ? j.tok[hash].end - j.tok[hash].start : 0;
        if (b->only_trainable && len != 16)
            st = zt_error_set(err, ZT_ERR_FORMAT, "checkpoint %s: the trainer state's base_weights has no 16-digit "
                              "\"hash\"; it was written by another program", dir);
        else if (len == 16)
            memcpy(b->hash, j.text + j.tok[hash].start, 16);
        size_t n;
        if (st == ZT_OK && model >= 0 && j.tok[model].type == ZT_JSON_STRING)
            st = zt_json_string(&j, model, &b->model, &n, err);
    }
    zt_json_free(&j);
    return st;
}

/* A trainable-only checkpoint: the frozen weights come from --model, which must hold the very values
 * the checkpoint was trained on (rank 0 compares the hashes; every rank opens the base). */
static zt_status open_base(trainer *t, const char *dir, const base_record *b, zt_hf_model **base, zt_error *err)
{
    const char *was = b->model ? b->model : "(none recorded)";
    if (!t->req->model_dir)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "checkpoint %s holds only the trainable parameters (checkpoint.only_trainable): the frozen "
                            "weights come from the base model it was trained on, whose frozen weights hash to %s. "
                            "Resume with --model BASE (the checkpoint's run used --model %s)",
                            dir, b->hash, was);
    zt_status st = zt_hf_model_open(t->req->model_dir, base, err);
    if (st == ZT_OK && t->dp.rank == 0) st = tr_base_hash_hf(t, *base, &t->base_hash, err);
    if (st == ZT_OK && t->dp.rank == 0) {
        char now[17];
        snprintf(now, sizeof now, "%016llx", (unsigned long long)t->base_hash);
        t->base_hash_known = 1;
        if (strcmp(now, b->hash) != 0)
            st = zt_error_set(err, ZT_ERR_CONFIG,
                              "checkpoint %s holds only the trainable parameters (checkpoint.only_trainable), trained "
                              "on frozen weights that hash to %s (--model %s); the frozen weights of --model %s hash "
                              "to %s: that is another base. Resume with --model %s (or a copy of it); if "
                              "trainable_params or the adapter's target modules changed since, the frozen set "
                              "differs too: resume with the checkpoint's settings",
                              dir, b->hash, was, t->req->model_dir, now, was);
    }
    return tr_agree_on_status(t, st, err, "checking the base model's weights");
}

typedef struct mixed_ctx {
    zt_ckpt *ckpt;
    zt_hf_model *base;
} mixed_ctx;

static zt_status mixed_piece(trainer *t, void *ctx, int32_t param, int64_t elem_offset, int64_t n, float *slice_at,
                             zt_error *err)
{
    const mixed_ctx *m = ctx;
    const zt_param_decl *p = &t->info->params[param];
    if (t->layout->trainable[param])
        return read_param(t, m->ckpt, param, ZT_CKPT_GROUP_PARAM, elem_offset, n, slice_at, err);
    return zt_hf_model_read(m->base, p->name, p->ndim, p->shape, (uint64_t)elem_offset, (uint64_t)n, slice_at, err);
}

/* The trainable weights from the checkpoint, the frozen ones from the base. */
static zt_status mixed_source(trainer *t, void *ctx, int32_t unit, int64_t offset, int64_t count, float *dst,
                              zt_error *err)
{
    memset(dst, 0, (size_t)count * sizeof *dst);
    return tr_for_each_piece(t, unit, offset, count, dst, mixed_piece, ctx, err);
}

/* The weights: all from the checkpoint, or (trainable-only) from the checkpoint and the base. A run
 * that saves trainable-only checkpoints from here on hashes the frozen weights it resumes with. */
static zt_status resume_weights(trainer *t, zt_ckpt *c, const char *dir, zt_error *err)
{
    static const char *const groups[] = {ZT_CKPT_GROUP_PARAM};
    base_record b = {0};
    zt_hf_model *base = NULL;
    zt_status st = read_base_record(c, dir, &b, err);
    /* without --model: say what to pass before the model's shape is compared with defaults */
    if (st == ZT_OK && b.only_trainable && !t->req->model_dir) st = open_base(t, dir, &b, &base, err);
    if (st == ZT_OK)
        st = b.only_trainable ? zt_ckpt_check_model_params(c, t->info, groups, 1, t->layout->trainable, err)
                              : zt_ckpt_check_model(c, t->info, groups, 1, err);
    if (st == ZT_OK && b.only_trainable) st = open_base(t, dir, &b, &base, err);
    resume_ctx r = {c, ZT_CKPT_GROUP_PARAM, 0};
    mixed_ctx m = {c, base};
    if (st == ZT_OK) st = b.only_trainable ? tr_load_master(t, mixed_source, &m, err)
                                           : tr_load_master(t, ckpt_param_source, &r, err);
    if (st == ZT_OK && t->set->checkpoint_only_trainable && !b.only_trainable && t->dp.rank == 0) {
        st = tr_base_hash_checkpoint(t, c, &t->base_hash, err);
        t->base_hash_known = st == ZT_OK;
    }
    if (st == ZT_OK && b.only_trainable)
        zt_log(ZT_LOG_INFO, "trainable-only checkpoint: the frozen weights from %s (hash %s, as saved)",
               t->req->model_dir, b.hash);
    zt_hf_model_close(base);
    free(b.model);
    return st;
}

/* auto_trans_ckpt false (MindFormers' key): the checkpoint must have been written under this run's
 * layout, ranks and ZeRO stage; true (the default) reads it under any (the logical tensors). */
static zt_status check_layout(trainer *t, const zt_ckpt *c, const char *dir, zt_error *err)
{
    const zt_ckpt_layout *w = zt_ckpt_written_layout(c);
    zt_ckpt_layout now = {t->host->world_size, t->zero->stage, t->dp.size, t->grid.tp_size, t->grid.pp_size};
    if (t->set->auto_trans_ckpt || (w->world_size == now.world_size && w->zero_stage == now.zero_stage &&
                                    w->dp_size == now.dp_size && w->tp_size == now.tp_size && w->pp_size == now.pp_size))
        return ZT_OK;
    return zt_error_set(err, ZT_ERR_CONFIG,
                        "checkpoint %s was written by %d rank%s as data_parallel %d x model_parallel %d x "
                        "pipeline_stage %d under ZeRO stage %d; this run has %d rank%s as data_parallel %d x "
                        "model_parallel %d x pipeline_stage %d under ZeRO stage %d, and auto_trans_ckpt is false, "
                        "so the checkpoint is not resharded. Set auto_trans_ckpt to true (the default) to load it "
                        "into this layout, or run with the checkpoint's layout",
                        dir, (int)w->world_size, w->world_size == 1 ? "" : "s", (int)w->dp_size, (int)w->tp_size,
                        (int)w->pp_size, (int)w->zero_stage, (int)now.world_size, now.world_size == 1 ? "" : "s",
                        (int)now.dp_size, (int)now.tp_size, (int)now.pp_size, (int)now.zero_stage);
}

zt_status tr_resume(trainer *t, zt_error *err)
{
    char *dir = NULL;
    zt_status st = resolve_resume_dir(t, &dir, err);
    if (st != ZT_OK) return st;
    zt_ckpt *c = NULL;
    st = zt_ckpt_open(dir, &c, err);
    if (st == ZT_OK) st = check_layout(t, c, dir, err);
    if (st == ZT_OK) st = resume_weights(t, c, dir, err);
    resume_ctx r = {c, ZT_CKPT_GROUP_PARAM, 0};
    void *zs = t->zero_lp->state;
    int32_t n_state = n_opt_state(t);
    for (int32_t k = 0; k < n_state && st == ZT_OK; k++) {
        r.group = state_name(t, k);
        for (int32_t u = 0; u < t->info->n_units && st == ZT_OK; u++) {
            int64_t offset, count;
            t->zero->shard_range(zs, u, &offset, &count);
            memset(t->shard_buf, 0, (size_t)count * sizeof(float));
            st = tr_for_each_piece(t, u, offset, count, t->shard_buf, resume_state_piece, &r, err);
            if (st != ZT_OK) break;
            st = t->zero->write_shard(zs, u, k + 1, t->shard_buf);
            if (st != ZT_OK) st = zt_plugin_failed(t->zero_lp, st, err, "write_shard(unit %d, %s)", (int)u, r.group);
        }
    }
    if (st == ZT_OK) st = restore_trainer_state(t, c, err);
    if (st == ZT_OK) st = restore_loader(t, c, err);
    if (st == ZT_OK) {
        t->step = zt_ckpt_step(c);
        if (r.missing)
            zt_log(ZT_LOG_WARN, "the checkpoint holds no optimizer state for %lld elements of parameters that are "
                   "trainable now (trainable_params changed); their state starts at zero", (long long)r.missing);
        zt_log(ZT_LOG_INFO, "resumed from %s at step %lld", dir, (long long)t->step);
    } else {
        zt_error_append(err, "\n(while resuming from %s)", dir);
    }
    zt_ckpt_close(c);
    free(dir);
    return st;
}

