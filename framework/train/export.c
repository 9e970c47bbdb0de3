/* --export DIR: the trained model as a Hugging Face directory transformers loads as it is
 * (docs/export.md): config.json, generation_config.json, the tokenizer files and the weights in the
 * export dtype, written by rank 0 into a staging directory that is swapped in whole. What it will
 * write is decided before the first step (tr_export_prepare), so a run does not train for hours to
 * fail at the end over a missing tokenizer or a directory it must not replace. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/fileio.h"
#include "base/log.h"
#include "data/loader.h"
#include "state/hf_export.h"
#include "state/hf_model.h"
#include "state/hf_tokenizer.h"
#include "train/trainer_internal.h"

#define FP16_OVERFLOW 65520.0f /* the smallest magnitude IEEE half rounds to infinity */

struct tr_export_plan {
    zt_hf_config config;           /* config.json; config.dtype is the export's dtype */
    const char *tokenizer_dir;     /* copy this model directory's tokenizer files, or NULL */
    int has_spm;                   /* else ship this SentencePiece model */
    char spm_path[4096];
    zt_hf_spm_tokenizer spm;
    int copy_generation_config;    /* the --model directory has generation_config.json */
};

/* ---- config.json ---------------------------------------------------------------------------------- */

/* The --model one, else built from the model plugin's info and the model.* keys. */
static zt_status export_config(trainer *t, zt_hf_config *c, zt_error *err)
{
    if (t->req->model_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", t->req->model_dir);
        return zt_hf_config_load(path, c, err);
    }
    const zt_config *cfg = t->req->cfg;
    const zt_model_info *m = t->info;
    zt_hf_config_defaults(c);
    /* ABI 1.3: the model says its RMSNorm epsilon and RoPE base, a preset's included */
    int reports = m->struct_size >= ZT_MODEL_INFO_SIZE_1_3 && m->rms_norm_eps > 0 && m->rope_theta > 0;
    if (reports) {
        c->rms_norm_eps = m->rms_norm_eps;
        c->rope_theta = m->rope_theta;
    } else if (zt_config_is_set(cfg, "model.preset") &&
               (!zt_config_is_set(cfg, "model.rms_norm_eps") || !zt_config_is_set(cfg, "model.rope_theta"))) {
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--export with model.preset: the model plugin '%s' was built against zt ABI %u.%u, "
                            "whose model info does not report rms_norm_eps and rope_theta (ABI 1.3 does), so "
                            "config.json cannot say them; set model.rms_norm_eps and model.rope_theta explicitly "
                            "(e.g. --set model.rms_norm_eps=1e-5 --set model.rope_theta=10000), or rebuild the plugin",
                            t->model_lp->desc.name, (unsigned)t->model_lp->plugin->abi_major,
                            (unsigned)t->model_lp->plugin->abi_minor);
    }
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
    if (!reports) {
        zt_config_get_float(cfg, "model.rms_norm_eps", &c->rms_norm_eps);
        zt_config_get_float(cfg, "model.rope_theta", &c->rope_theta);
    }
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
    return ZT_OK;
}

/* ---- the plan ------------------------------------------------------------------------------------- */

static int file_in(const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Where the tokenizer comes from: the --model directory's own files, else the data set's tokenizer. */
static zt_status plan_tokenizer(trainer *t, tr_export_plan *p, zt_error *err)
{
    const char *model_dir = t->req->model_dir;
    zt_data_tokenizer dt;
    zt_status st = zt_data_tokenizer_read(t->set->data_path, &dt, err);
    if (st != ZT_OK) return st;
    if (model_dir && zt_hf_dir_has_tokenizer(model_dir)) {
        p->tokenizer_dir = model_dir;
        char path[4200];
        snprintf(path, sizeof path, "%s/tokenizer.model", model_dir);
        char *bytes = NULL;
        size_t len = 0;
        zt_error ignored;
        if (zt_read_file(path, &bytes, &len, &ignored) == ZT_OK &&
            zt_fnv1a64(ZT_FNV1A64_INIT, bytes, len) != dt.hash)
            zt_log(ZT_LOG_WARN,
                   "--export %s: the tokenizer files come from %s, but its tokenizer.model is not the tokenizer the "
                   "data set was prepared with (%s): the exported model has learnt the data set's token ids",
                   t->req->export_dir, model_dir, dt.path);
        free(bytes);
        return ZT_OK;
    }
    if (!dt.path[0]) {
        zt_log(ZT_LOG_WARN,
               "--export %s: %s/manifest.json names no tokenizer file, so the export gets no tokenizer files; "
               "add the tokenizer's Hugging Face files to %s yourself",
               t->req->export_dir, t->set->data_path, t->req->export_dir);
        return ZT_OK;
    }
    if (strcmp(dt.plugin, "sentencepiece") != 0) {
        zt_log(ZT_LOG_WARN,
               "--export %s: the data set's tokenizer %s was read by the tokenizer plugin '%s', not sentencepiece, "
               "so the export gets no tokenizer files (transformers' LlamaTokenizer reads SentencePiece models); "
               "add the tokenizer's Hugging Face files to %s yourself",
               t->req->export_dir, dt.path, dt.plugin, t->req->export_dir);
        return ZT_OK;
    }
    snprintf(p->spm_path, sizeof p->spm_path, "%s", dt.path);
    p->spm = (zt_hf_spm_tokenizer){p->spm_path, dt.hash, dt.bos_id, dt.eos_id, dt.unk_id, dt.pad_id,
                                   p->config.max_position_embeddings};
    st = zt_hf_spm_check(&p->spm, err);
    if (st == ZT_ERR_NOT_FOUND)
        zt_error_append(err, "\n--export ships the data set's tokenizer (tokenizer.path of %s/manifest.json, where "
                             "zt-prep read it): put the file back, or re-run zt-prep with the tokenizer where it is "
                             "now%s",
                        t->set->data_path,
                        model_dir ? ", or put the model's tokenizer.model into the --model directory" : "");
    else if (st != ZT_OK)
        zt_error_append(err, "\n(--export ships the data set's tokenizer, tokenizer.path of %s/manifest.json)",
                        t->set->data_path);
    if (st == ZT_OK) p->has_spm = 1;
    return st;
}

static zt_status plan_rank0(trainer *t, tr_export_plan *p, zt_error *err)
{
    const zt_train_request *req = t->req;
    zt_status st = zt_hf_export_check_dest(req->export_dir, err);
    if (st == ZT_OK) st = export_config(t, &p->config, err);
    if (st != ZT_OK) return st;
    const char *why = "--export-dtype";
    int dtype = req->export_dtype;
    if (dtype < 0 && req->model_dir) {
        dtype = p->config.dtype >= 0 ? p->config.dtype : ZT_ST_F32; /* transformers: no torch_dtype is float32 */
        why = "auto: the --model's torch_dtype";
    } else if (dtype < 0) {
        dtype = ZT_ST_BF16;
        why = "auto: a model trained from its own initialization";
    }
    p->config.dtype = dtype;
    p->copy_generation_config = req->model_dir && file_in(req->model_dir, "generation_config.json");
    st = plan_tokenizer(t, p, err);
    if (st != ZT_OK) return st;
    char shard[48] = "5 GB";
    if (req->export_shard_bytes) snprintf(shard, sizeof shard, "%" PRIu64 " bytes", req->export_shard_bytes);
    zt_log(ZT_LOG_INFO, "after the last step the model is exported to %s: %s weights (%s), shards of at most %s, "
           "tokenizer %s%s%s", req->export_dir, zt_st_dtype_torch_name(dtype), why, shard,
           p->tokenizer_dir ? "files of " : p->has_spm ? "" : "none",
           p->tokenizer_dir ? p->tokenizer_dir : p->has_spm ? p->spm_path : "",
           p->copy_generation_config ? ", generation_config.json of the --model" : "");
    return ZT_OK;
}

zt_status tr_export_prepare(trainer *t, zt_error *err)
{
    zt_status st = ZT_OK;
    if (t->host->world_rank == 0) { /* with tensor parallelism several ranks are dp rank 0: one writes */
        t->export_plan = calloc(1, sizeof *t->export_plan);
        st = t->export_plan ? plan_rank0(t, t->export_plan, err)
                            : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory planning the export");
    }
    return tr_agree_on_status(t, st, err, "planning the export");
}

void tr_export_free(trainer *t)
{
    free(t->export_plan);
    t->export_plan = NULL;
}

/* ---- the weights ---------------------------------------------------------------------------------- */

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
    const zt_st_tensor_spec *spec = &x->list->specs[index];
    int32_t i = zt_layout_find(t->layout, spec->name);
    if (i < 0)
        return zt_error_set(err, ZT_ERR_INTERNAL, "export: the model has no parameter '%s' that config.json implies",
                            spec->name);
    int32_t owner = t->layout->owner[i];
    int32_t unit = t->info->params[owner].unit;
    if (x->loaded_unit != unit) {
        zt_status st = ZT_OK;
        if (t->tp_units) st = t->host->broadcast(t->host->ctx, &t->tp, &unit, 1, ZT_I32, 0, NULL);
        if (st == ZT_OK && t->dp.size > 1) st = t->host->broadcast(t->host->ctx, &t->dp, &unit, 1, ZT_I32, 0, NULL);
        if (st != ZT_OK) return tr_host_failed(t, st, err, "asking the ranks for a unit to export (broadcast)");
        st = tr_gather_master(t, unit, t->shard_buf, err);
        if (st == ZT_OK && t->tp_units) st = tr_tp_gather_unit(t, unit, t->shard_buf, t->tp_units, err);
        if (st != ZT_OK) return st;
        x->loaded_unit = unit;
    }
    int32_t a, b;
    if (t->tp_units) { /* the logical tensor from every tensor-parallel rank's shard, without padding */
        int64_t unit_numel = t->layout->units[unit].padded_numel;
        tr_tp_assemble(t, owner, t->tp_units, unit_numel, (int64_t)elem_offset, (int64_t)count, dst);
        if (tr_adapter_factors(t, owner, &a, &b)) { /* LoRA: the factors assembled too, then merged */
            const zt_param_decl *da = &t->info->params[a], *db = &t->info->params[b];
            int64_t na = da->shape[0] * da->shape[1], nb = db->shape[0] * db->shape[1];
            float *A = malloc((size_t)(na + nb) * sizeof *A);
            if (!A) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "export: out of memory merging '%s''s adapter",
                                        spec->name);
            tr_tp_assemble(t, a, t->tp_units, unit_numel, 0, na, A);
            tr_tp_assemble(t, b, t->tp_units, unit_numel, 0, nb, A + na);
            tr_adapter_merge_factors(t, owner, A, A + na, elem_offset, count, dst);
            free(A);
        }
    } else {
        memcpy(dst, t->shard_buf + t->layout->param_offset[owner] + (int64_t)elem_offset, count * sizeof(float));
        tr_adapter_merge(t, owner, t->shard_buf, elem_offset, count, dst); /* LoRA: W + scaling * B A */
    }
    /* IEEE half tops out at 65504: a larger weight would be exported as infinity */
    for (uint64_t k = 0; spec->dtype == ZT_ST_F16 && k < count; k++)
        if (fabsf(dst[k]) >= FP16_OVERFLOW)
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--export-dtype fp16: tensor '%s' holds %g at element %" PRIu64 ", beyond float16's "
                                "range (+-65504), so the export would hold infinity there; export in bf16 or fp32 "
                                "(--export-dtype bf16)",
                                spec->name, (double)dst[k], elem_offset + k);
    return ZT_OK;
}

/* Everything into the staging directory: weights and config.json, then the tokenizer and the
 * generation config. */
static zt_status write_staged(trainer *t, const tr_export_plan *p, const char *dir, zt_error *err)
{
    zt_hf_tensor_list list = {0};
    zt_status st = zt_hf_llama_tensors(&p->config, p->config.dtype, &list, err);
    if (st != ZT_OK) return st;
    export_ctx x = {t, &list, -1};
    st = zt_hf_export(dir, &p->config, list.specs, list.n, export_fill, &x, t->req->export_shard_bytes, err);
    zt_hf_tensor_list_free(&list);
    char src[4200], dst[4200];
    snprintf(dst, sizeof dst, "%s/generation_config.json", dir);
    if (st == ZT_OK && p->copy_generation_config) {
        snprintf(src, sizeof src, "%s/generation_config.json", t->req->model_dir);
        st = zt_copy_file(src, dst, NULL, err);
    } else if (st == ZT_OK) {
        st = zt_hf_generation_config_write(dst, &p->config, err);
    }
    int n_copied = 0;
    if (st == ZT_OK && p->tokenizer_dir) st = zt_hf_tokenizer_copy(p->tokenizer_dir, dir, &n_copied, err);
    if (st == ZT_OK && p->has_spm) st = zt_hf_spm_write(&p->spm, dir, err);
    return st;
}

/* Tests kill a run here, with every file staged and nothing published (tests/export). */
static void test_stall(const char *staging)
{
    const char *hook = getenv("ZT_TEST_EXPORT_STALL");
    if (!hook || strcmp(hook, "1") != 0) return;
    zt_log(ZT_LOG_WARN, "test hook ZT_TEST_EXPORT_STALL: the export is staged in %s; waiting 60 s before "
           "publishing it", staging);
    for (int i = 0; i < 600; i++) usleep(100000);
}

static zt_status export_rank0(trainer *t, zt_error *err)
{
    const tr_export_plan *p = t->export_plan;
    zt_hf_export_stage stage;
    zt_status st = zt_hf_export_stage_begin(t->req->export_dir, &stage, err);
    if (st != ZT_OK) return st;
    st = write_staged(t, p, stage.staging, err);
    if (st != ZT_OK) {
        zt_hf_export_stage_discard(&stage);
        return st;
    }
    test_stall(stage.staging);
    st = zt_hf_export_stage_publish(&stage, err);
    if (st == ZT_OK)
        zt_log(ZT_LOG_INFO, "model exported in Hugging Face format to %s (%s)", t->req->export_dir,
               zt_st_dtype_torch_name(p->config.dtype));
    return st;
}

zt_status tr_export_hf(trainer *t, zt_error *err)
{
    zt_status st = tr_hold_shard_buffer(t, err);
    st = tr_agree_on_status(t, st, err, "holding a unit's weights for the export");
    if (st != ZT_OK) return st;
    int32_t unit = -1;
    /* Tensor parallelism: every tp rank's dp rank 0 gathers its shards over "dp" and the tp ranks
     * all-gather the unit for rank 0 of the world, which writes the export (its tp rank 0 relays). */
    if (st == ZT_OK && t->tp_shards) {
        t->tp_units = malloc((size_t)t->layout->largest_unit_numel * (size_t)t->tp.size * sizeof(float));
        if (!t->tp_units) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the export's tp units");
    }
    st = tr_agree_on_status(t, st, err, "holding the tensor-parallel units for the export");
    if (st != ZT_OK) {
        tr_drop_shard_buffer(t);
        return st;
    }
    if (t->host->world_rank == 0) {
        st = export_rank0(t, err);
        if (t->tp_units) t->host->broadcast(t->host->ctx, &t->tp, &unit, 1, ZT_I32, 0, NULL);
        if (t->dp.size > 1) t->host->broadcast(t->host->ctx, &t->dp, &unit, 1, ZT_I32, 0, NULL);
    } else if (t->dp.rank == 0 && t->tp_units) {
        while (st == ZT_OK) {
            st = t->host->broadcast(t->host->ctx, &t->tp, &unit, 1, ZT_I32, 0, NULL);
            if (st == ZT_OK && t->dp.size > 1) st = t->host->broadcast(t->host->ctx, &t->dp, &unit, 1, ZT_I32, 0, NULL);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "waiting for rank 0's export (broadcast)");
            if (st != ZT_OK || unit < 0) break;
            st = tr_gather_master(t, unit, t->shard_buf, err);
            if (st == ZT_OK) st = tr_tp_gather_unit(t, unit, t->shard_buf, t->tp_units, err);
        }
    } else {
        while (st == ZT_OK) {
            st = t->host->broadcast(t->host->ctx, &t->dp, &unit, 1, ZT_I32, 0, NULL);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "waiting for rank 0's export (broadcast over 'dp')");
            if (st != ZT_OK || unit < 0) break;
            st = tr_gather_master(t, unit, t->shard_buf, err);
        }
    }
    tr_drop_shard_buffer(t);
    free(t->tp_units);
    t->tp_units = NULL;
    return tr_agree_on_status(t, st, err, "exporting the model");
}
