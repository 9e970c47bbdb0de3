/* The training loop (trainer.h). This file: settings and configuration, the run's plugins, buffers,
 * one micro-batch forward/backward, the step, evaluation, ranks, Ctrl-C, and the loop itself;
 * trainer_internal.h names the files that hold weights and checkpoints. */
#define _GNU_SOURCE
#include "train/trainer.h"

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
#include "dist/flight.h"
#include "dist/job.h"
#include "state/checkpoint.h"
#include "state/hf_model.h"
#include "state/model_config.h"
#include "train/trainer_internal.h"

/* ---- settings --------------------------------------------------------------------------------- */

static zt_status no_data_error(zt_error *err)
{
    return zt_error_set(err, ZT_ERR_CONFIG,
                        "no training data: data.path is not set; point it at a directory written by zt-prep "
                        "(--data DIR, or --set data.path=DIR)");
}

/* train_batch_size, when given, against the job's data-parallel size (known once the ranks are). */
static zt_status check_global_batch(const zt_host_settings *s, int32_t dp, zt_error *err)
{
    int64_t global = s->train_batch_size;
    if (!s->has_train_batch_size || global == s->micro_batch * s->accum * dp) return ZT_OK;
    return zt_error_set(err, ZT_ERR_CONFIG,
                        "train_batch_size is %lld but train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
                        "data-parallel ranks = %lld x %lld x %d = %lld; make them agree (as DeepSpeed requires) or "
                        "remove train_batch_size",
                        (long long)global, (long long)s->micro_batch, (long long)s->accum, (int)dp,
                        (long long)(s->micro_batch * s->accum * dp));
}

/* ---- configuration: --model and the data set's vocabulary ------------------------------------ */

/* The tokenizer vocab_size of data_dir/manifest.json. */
static zt_status manifest_vocab(const char *data_dir, int64_t *vocab, zt_error *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", data_dir, ZT_LOADER_MANIFEST) >= (int)sizeof path)
        return zt_error_set(err, ZT_ERR_CONFIG, "data.path is too long");
    FILE *f = fopen(path, "rb");
    if (!f)
        return zt_error_set(err, ZT_ERR_IO,
                            "cannot read %s: %s; data.path must be a directory written by zt-prep", path,
                            strerror(errno));
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    char chunk[65536];
    size_t got;
    while (mem && (got = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, got, mem);
    fclose(f);
    if (!mem || fclose(mem) != 0) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    }
    zt_json j;
    zt_status st = zt_json_parse(text, len, path, &j, err);
    if (st == ZT_OK) {
        int tok = j.tok[0].type == ZT_JSON_OBJECT ? zt_json_object_get(&j, 0, "tokenizer") : -1;
        int v = tok >= 0 && j.tok[tok].type == ZT_JSON_OBJECT ? zt_json_object_get(&j, tok, "vocab_size") : -1;
        if (v < 0 || !zt_json_is_number(&j, v) || zt_json_get_number(&j, v) < 1)
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s has no positive tokenizer.vocab_size; re-run zt-prep to rewrite the data set", path);
        else
            *vocab = (int64_t)zt_json_get_number(&j, v);
        zt_json_free(&j);
    }
    free(text);
    return st;
}

/* The model.* keys of an HF config.json (the llama plugin uses transformers' names under "model."),
 * added to cfg as if from a config file named after it. The weights' headers are checked against
 * config.json first (zt_hf_model_open: every tensor with the shape config.json implies), so a
 * config.json that does not belong to the weights is reported as such before any plugin sizes,
 * estimates or allocates the model it describes. */
static zt_status apply_hf_config(zt_config *cfg, const char *model_dir, zt_error *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", model_dir) >= (int)sizeof path)
        return zt_error_set(err, ZT_ERR_CONFIG, "--model %s: the path is too long", model_dir);
    zt_hf_model *m;
    zt_status st = zt_hf_model_open(model_dir, &m, err);
    if (st != ZT_OK) return st;
    zt_hf_config hf = *zt_hf_model_config(m);
    zt_hf_model_close(m);
    return zt_model_config_apply(cfg, &hf, model_dir, path, err);
}

zt_status zt_train_configure(zt_config *cfg, const char *model_dir, int require_data, zt_error *err)
{
    zt_status st = zt_config_validate(cfg, err);
    if (st != ZT_OK) return st;
    const char *data = NULL;
    int have_data = zt_config_get_string(cfg, "data.path", &data) == ZT_OK;
    if (!have_data && require_data) return no_data_error(err);
    if (model_dir) {
        st = apply_hf_config(cfg, model_dir, err);
        return st == ZT_OK ? zt_config_validate(cfg, err) : st;
    }
    /* Without data (a dry run) the model's own sizes (a preset, or model.* keys) must say it all. */
    if (zt_config_is_set(cfg, "model.vocab_size") || !have_data) return ZT_OK;
    int64_t vocab;
    st = manifest_vocab(data, &vocab, err);
    if (st != ZT_OK) return st;
    st = zt_config_put_int(cfg, "model.vocab_size", vocab, "data.path manifest.json (tokenizer.vocab_size)",
                           ZT_CONFIG_RANK_FILE, err);
    return st == ZT_OK ? zt_config_validate(cfg, err) : st;
}

/* ---- the trainer's state ------------------------------------------------------------------------ */




/* Our own collective failed: the runtime recorded why in our services table. */
zt_status tr_host_failed(trainer *t, zt_status st, zt_error *err, const char *what)
{
    zt_status reported;
    const char *msg = zt_runtime_take_error(t->host, &reported);
    return zt_error_set(err, st, "%s failed: %s", what, msg[0] ? msg : zt_status_name(st));
}

/* [B, T, width] in the run's compute dtype (fp32 on the CPU, bf16 or fp16 on the GPU). */
static zt_tensor hidden_view(const trainer *tr, void *data, const zt_batch *b, int64_t width)
{
    zt_tensor t;
    memset(&t, 0, sizeof t);
    if (!data) return t;
    t.data = data;
    t.dtype = tr->on_gpu ? tr->compute16 : ZT_F32;
    t.device_type = tr->on_gpu ? ZT_DEVICE_CUDA : ZT_DEVICE_CPU;
    t.device_index = tr->host->device->device_index;
    t.ndim = 3;
    t.shape[0] = b->batch;
    t.shape[1] = b->seq_len;
    t.shape[2] = width;
    t.stride[2] = 1;
    t.stride[1] = width;
    t.stride[0] = width * b->seq_len;
    return t;
}

static void *talloc(trainer *t, int pool, uint64_t bytes, const char *tag, zt_error *err)
{
    void *p = zt_runtime_alloc(t->rt, pool, ZT_MEM_HOST, bytes ? bytes : 1, 0, tag, err);
    if (p) memset(p, 0, bytes);
    return p;
}

/* Memory the units compute on: device memory on GPU runs (not zeroed: every user writes it first). */
static void *compute_alloc(trainer *t, int pool, uint64_t bytes, const char *tag, zt_error *err)
{
    if (!t->on_gpu) return talloc(t, pool, bytes, tag, err);
    return zt_runtime_alloc(t->rt, pool, ZT_MEM_DEVICE, bytes ? bytes : 1, 0, tag, err);
}

/* ---- setup ------------------------------------------------------------------------------------ */

static zt_status bind_plugins(trainer *t, zt_error *err)
{
    zt_plugin_set *set = t->req->plugins;
    t->model_lp = &set->by_kind[ZT_KIND_MODEL];
    t->zero_lp = &set->by_kind[ZT_KIND_ZERO];
    t->opt_lp = &set->by_kind[ZT_KIND_OPTIMIZER];
    t->attention_lp = &set->by_kind[ZT_KIND_ATTENTION];
    const zt_loaded_plugin *needed[] = {t->model_lp, t->zero_lp, t->opt_lp, t->attention_lp};
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++)
        if (!needed[i]->plugin || !needed[i]->initialized)
            return zt_error_set(err, ZT_ERR_INTERNAL, "the trainer needs initialized model, attention, optimizer "
                                "and zero plugins");
    t->model = t->model_lp->plugin->ops;
    t->zero = t->zero_lp->plugin->ops;
    t->opt = t->opt_lp->plugin->ops;
    t->attention.ops = t->attention_lp->plugin->ops;
    t->attention.state = t->attention_lp->state;
    t->attention.caps = t->attention_lp->plugin->caps;
    t->info = t->model->info(t->model_lp->state);
    if (!t->info || t->info->n_units < 2)
        return zt_error_set(err, ZT_ERR_INTERNAL, "model plugin '%s' reports no model info (or fewer than 2 units)",
                            t->model_lp->desc.name);
    if (t->set->recompute && !(t->model_lp->plugin->caps & ZT_CAP_RECOMPUTE))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "recompute is true but model plugin '%s' cannot recompute activations (no "
                            "ZT_CAP_RECOMPUTE); set recompute to false",
                            t->model_lp->desc.name);

    t->host = zt_runtime_host(t->rt, "trainer", NULL, 0);
    if (!t->host) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating the trainer's services");
    zt_status st = tr_setup_ranks(t, err);
    if (st != ZT_OK) return st;
    zt_status batch = check_global_batch(t->set, t->dp.size, err);
    if (batch != ZT_OK) return batch;
    t->on_gpu = t->host->device->device_type == ZT_DEVICE_CUDA;
    if (t->on_gpu && !t->set->fp16 && !t->set->bf16)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "bf16.enabled is false and fp16.enabled is false, but zt's GPU path computes in 16 bits "
                            "(fp32 master weights): set bf16.enabled to true, or fp16.enabled to true (with dynamic "
                            "loss scaling), or train on the CPU in fp32 (device = cpu)");
    /* a model plugin older than ABI 1.2 never reads zt_unit_call.loss_scale: its gradients would arrive
     * unscaled and then be divided by the scale */
    if (t->on_gpu && t->set->fp16 && t->model_lp->plugin->abi_minor < 2)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "fp16.enabled is true, but model plugin '%s' was built against zt ABI %u.%u, before "
                            "fp16 loss scaling (1.2): rebuild it against this SDK, or train in bf16 (fp16.enabled "
                            "false)", t->model_lp->desc.name, (unsigned)t->model_lp->plugin->abi_major,
                            (unsigned)t->model_lp->plugin->abi_minor);
    /* the plugins whose GPU code reads and writes the 16-bit tensors must have fp16 kernels (one with
     * bf16 kernels alone would read fp16 bits as bf16); the optimizer says so per call instead
     * (ZT_OPTIM_WRITES_COMPUTE_COPY_F16) */
    const zt_loaded_plugin *sixteen_bit[] = {t->model_lp, t->zero_lp, t->attention_lp};
    for (size_t i = 0; t->on_gpu && t->set->fp16 && i < sizeof sixteen_bit / sizeof sixteen_bit[0]; i++)
        if (!(sixteen_bit[i]->plugin->caps & ZT_CAP_FP16))
            return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                                "fp16.enabled is true, but %s plugin '%s' has no fp16 GPU code (it does not "
                                "declare ZT_CAP_FP16): train in bf16 (bf16.enabled true, fp16.enabled false) or "
                                "choose a %s plugin that declares it", zt_kind_name(sixteen_bit[i]->desc.kind),
                                sixteen_bit[i]->desc.name, zt_kind_name(sixteen_bit[i]->desc.kind));
    if (t->set->fp16 && !t->on_gpu)
        zt_log(ZT_LOG_WARN, "fp16.enabled is ignored on the CPU, which trains in fp32");
    t->fp16 = t->on_gpu && t->set->fp16;
    t->compute16 = t->fp16 ? ZT_F16 : ZT_BF16;
    if (t->fp16) {
        const char *hook = getenv("ZT_FP16_TEST_OVERFLOW");
        t->fp16_test_overflow = hook && !strcmp(hook, "1");
        const char *test_note = t->fp16_test_overflow ? "; ZT_FP16_TEST_OVERFLOW=1: every backward overflows" : "";
        if (t->set->fp16_static_scale > 0) {
            zt_loss_scaler_init_static(&t->scaler, t->set->fp16_static_scale, t->set->fp16_hysteresis);
            zt_log(ZT_LOG_INFO, "fp16: IEEE half compute with the static loss scale %g (fp16.loss_scale)%s",
                   t->scaler.scale, test_note);
        } else {
            zt_loss_scaler_init(&t->scaler, t->set->fp16_scale_power, t->set->fp16_window, t->set->fp16_hysteresis,
                                t->set->fp16_min_scale);
            t->scaler.consecutive_hysteresis = t->set->fp16_consecutive_hysteresis;
            zt_log(ZT_LOG_INFO, "fp16: IEEE half compute with dynamic loss scaling from %g (window %lld, hysteresis %lld%s, "
                   "min %g)%s", t->scaler.scale, (long long)t->set->fp16_window, (long long)t->set->fp16_hysteresis,
                   t->scaler.consecutive_hysteresis ? ", consecutive" : "", t->set->fp16_min_scale, test_note);
        }
    }
    return ZT_OK;
}

static zt_status open_data(trainer *t, zt_error *err)
{
    zt_loader_options o;
    zt_loader_options_default(&o);
    o.dir = t->set->data_path;
    o.split = "train";
    o.micro_batch = (int32_t)t->set->micro_batch;
    o.seq_len = (int32_t)t->set->seq_len;
    o.packed = t->set->data_mode;
    o.shuffle = t->set->shuffle;
    o.seed = (uint64_t)t->set->seed;
    o.rank = t->dp.rank;
    o.world = t->dp.size;
    o.model_vocab_size = t->info->vocab_size;
    zt_status st = zt_loader_open(&o, &t->train_loader, err);
    if (st != ZT_OK) return st;
    t->data_info = zt_loader_info_get(t->train_loader); /* the loader refused a vocabulary too large */
    if (t->data_info->packed && !(t->attention.caps & ZT_CAP_PACKED))
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "the data is packed (several samples per row) but attention plugin '%s' cannot keep "
                            "them apart (no ZT_CAP_PACKED): set data.mode to padded, or use an attention plugin "
                            "that supports packing (naive)",
                            t->attention_lp->desc.name);
    if (t->data_info->vocab_size < t->info->vocab_size)
        zt_log(ZT_LOG_INFO, "the model's vocabulary (%d) is larger than the tokenizer's (%lld): embedding rows "
               "past %lld are never used (models often pad their vocabulary)",
               (int)t->info->vocab_size, (long long)t->data_info->vocab_size, (long long)t->data_info->vocab_size);
    if (t->set->seq_len > t->info->max_seq_len)
        zt_log(ZT_LOG_WARN, "data.seq_len %lld is longer than the model's max_position_embeddings %d",
               (long long)t->set->seq_len, (int)t->info->max_seq_len);
    if (t->set->eval_every > 0) {
        if (t->data_info->n_other_split_shards == 0)
            return zt_error_set(err, ZT_ERR_CONFIG,
                                "eval.every is %lld, which needs the data set's validation split, but %s has none "
                                "(zt-prep wrote it with --val-fraction 0): re-run zt-prep with --val-fraction, or set "
                                "eval.every to 0",
                                (long long)t->set->eval_every, t->set->data_path);
        o.split = "val";
        o.single_pass = 1;
        o.shuffle = 0;
        st = zt_loader_open(&o, &t->val_loader, err);
        /* The split is there, so the loader's own advice fits (a corrupt shard: re-run zt-prep). */
        if (st != ZT_OK) {
            zt_error_append(err, "\n(in the validation split, which eval.every = %lld evaluates on)",
                            (long long)t->set->eval_every);
            return st;
        }
    }
    return ZT_OK;
}

static zt_status alloc_buffers(trainer *t, zt_error *err)
{
    const zt_model_info *m = t->info;
    int64_t rows = t->set->micro_batch * t->set->seq_len;
    int32_t n_units = m->n_units;
    t->micro = talloc(t, ZT_POOL_OTHER, (uint64_t)t->set->accum * sizeof *t->micro, "trainer micro-batch table", err);
    t->hidden = talloc(t, ZT_POOL_OTHER, (uint64_t)n_units * sizeof *t->hidden, "trainer hidden table", err);
    t->saved = talloc(t, ZT_POOL_OTHER, (uint64_t)n_units * sizeof *t->saved, "trainer saved slots", err);
    if (!t->micro || !t->hidden || !t->saved) return ZT_ERR_OUT_OF_MEMORY;
    for (int64_t k = 0; k < t->set->accum; k++) {
        micro_batch *mb = &t->micro[k];
        int32_t **arrays[] = {&mb->tokens, &mb->targets, &mb->positions, &mb->doc_ids, &mb->cu_seqlens};
        for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) {
            *arrays[a] = talloc(t, ZT_POOL_OTHER, (uint64_t)(rows + 1) * sizeof(int32_t), "trainer micro-batch", err);
            if (!*arrays[a]) return ZT_ERR_OUT_OF_MEMORY;
        }
    }
    if (t->on_gpu) {
        micro_batch *d = &t->device_micro;
        int32_t **arrays[] = {&d->tokens, &d->targets, &d->positions, &d->doc_ids, &d->cu_seqlens};
        for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) {
            *arrays[a] = compute_alloc(t, ZT_POOL_OTHER, (uint64_t)(rows + 1) * sizeof(int32_t),
                                       "trainer micro-batch on the device", err);
            if (!*arrays[a]) return ZT_ERR_OUT_OF_MEMORY;
        }
    }
    uint64_t hidden_bytes = (uint64_t)rows * (uint64_t)m->hidden_size * (t->on_gpu ? 2u : sizeof(float));
    /* a pipeline stage's units read the previous stage's output and write their own */
    int32_t first = t->grid.first_unit > 0 ? t->grid.first_unit - 1 : 0;
    for (int32_t u = first; u + 1 < n_units && u <= t->grid.last_unit; u++) {
        char tag[64];
        snprintf(tag, sizeof tag, "unit %d output (kept for backward)", (int)u);
        t->hidden[u] = compute_alloc(t, ZT_POOL_ACTIVATIONS, hidden_bytes, tag, err);
        if (!t->hidden[u]) return ZT_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < 2; i++) {
        t->dx[i] = compute_alloc(t, ZT_POOL_ACTIVATIONS, hidden_bytes, "hidden-state gradient", err);
        if (!t->dx[i]) return ZT_ERR_OUT_OF_MEMORY;
    }
    for (int32_t u = 0; u < n_units; u++)
        if (t->layout->units[u].n_params > t->max_unit_params) t->max_unit_params = t->layout->units[u].n_params;
    t->params = talloc(t, ZT_POOL_OTHER, (uint64_t)(t->max_unit_params + 1) * sizeof(zt_tensor), "unit views", err);
    t->grads = talloc(t, ZT_POOL_OTHER, (uint64_t)(t->max_unit_params + 1) * sizeof(zt_tensor), "unit views", err);
    if (!t->params || !t->grads) return ZT_ERR_OUT_OF_MEMORY;
    return ZT_OK;
}

/* One unit's shard in host memory for weights on their way in or out (loading, checkpoints,
 * export). Held only meanwhile: for a 7B model it is the 0.5 GB embedding. */
zt_status tr_hold_shard_buffer(trainer *t, zt_error *err)
{
    if (!t->shard_buf)
        t->shard_buf = talloc(t, ZT_POOL_WORKSPACE, (uint64_t)t->layout->largest_unit_numel * sizeof(float),
                              "one unit's shard (weights in and out)", err);
    return t->shard_buf ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
}

void tr_drop_shard_buffer(trainer *t)
{
    zt_runtime_free(t->rt, t->shard_buf);
    t->shard_buf = NULL;
}

static void free_buffers(trainer *t)
{
    tr_pipeline_free(t);
    if (t->micro) {
        for (int64_t k = 0; k < t->set->accum; k++) {
            micro_batch *mb = &t->micro[k];
            int32_t *arrays[] = {mb->tokens, mb->targets, mb->positions, mb->doc_ids, mb->cu_seqlens};
            for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) zt_runtime_free(t->rt, arrays[a]);
        }
    }
    int32_t *device_arrays[] = {t->device_micro.tokens, t->device_micro.targets, t->device_micro.positions,
                                t->device_micro.doc_ids, t->device_micro.cu_seqlens};
    for (size_t a = 0; a < sizeof device_arrays / sizeof device_arrays[0]; a++)
        zt_runtime_free(t->rt, device_arrays[a]);
    if (t->hidden)
        for (int32_t u = 0; u < t->info->n_units; u++) zt_runtime_free(t->rt, t->hidden[u]);
    if (t->saved)
        for (int32_t u = 0; u < t->info->n_units; u++)
            if (t->saved[u]) t->model->release(t->model_lp->state, u, &t->saved[u]);
    zt_runtime_free(t->rt, t->micro);
    zt_runtime_free(t->rt, t->hidden);
    zt_runtime_free(t->rt, t->saved);
    zt_runtime_free(t->rt, t->dx[0]);
    zt_runtime_free(t->rt, t->dx[1]);
    zt_runtime_free(t->rt, t->params);
    zt_runtime_free(t->rt, t->grads);
    tr_drop_shard_buffer(t);
}

/* ---- one micro-batch -------------------------------------------------------------------------- */

zt_batch tr_batch_of(const trainer *t, const micro_batch *mb, int64_t n_loss_tokens_global)
{
    zt_batch b = {.struct_size = sizeof b,
                  .batch = (int32_t)t->set->micro_batch,
                  .seq_len = (int32_t)t->set->seq_len,
                  .n_docs = mb->n_spans,
                  .tokens = mb->tokens,
                  .targets = mb->targets,
                  .positions = mb->positions,
                  .doc_ids = mb->doc_ids,
                  .cu_seqlens = mb->cu_seqlens,
                  .max_doc_len = mb->max_span_len,
                  .n_loss_tokens_global = n_loss_tokens_global};
    return b;
}

static zt_unit_call unit_call(trainer *t, int32_t u, uint32_t flags, const zt_batch *b)
{
    const zt_unit_layout *ul = &t->layout->units[u];
    zt_unit_call c = {.struct_size = sizeof c,
                      .unit = u,
                      .flags = flags,
                      .n_params = ul->n_params,
                      .params = t->params,
                      .batch = b,
                      .attention = &t->attention};
    int64_t width = t->info->hidden_size;
    if (u > 0) c.x_in = hidden_view(t, t->hidden[u - 1], b, width);
    if (u + 1 < t->info->n_units) c.x_out = hidden_view(t, t->hidden[u], b, width);
    /* ABI 1.2: the last unit's backward multiplies the loss gradient by it (fp16 loss scaling); the test
     * hook makes it infinite, so every gradient overflows exactly as a real overflow does */
    c.loss_scale = !t->fp16 ? 1.0 : t->fp16_test_overflow ? INFINITY : t->scaler.scale;
    return c;
}

/* Forward through every unit; the last unit's loss goes to *loss. flags: ZT_UNIT_TRAIN (and
 * recompute) for training, 0 for evaluation (nothing is kept). */
zt_status tr_forward(trainer *t, const zt_batch *b, uint32_t flags, float *loss, zt_error *err)
{
    int32_t n_units = t->info->n_units;
    void *zs = t->zero_lp->state;
    for (int32_t u = t->grid.first_unit; u <= t->grid.last_unit; u++) {
        zt_status st = t->zero->before_unit(zs, u, ZT_PHASE_FORWARD, t->params, NULL);
        if (st != ZT_OK) return zt_plugin_failed(t->zero_lp, st, err, "before_unit(%d, forward)", (int)u);
        /* a unit below the lowest trainable one has no backward (backward()): it keeps nothing */
        uint32_t unit_flags = u < t->layout->lowest_trainable_unit ? 0 : flags;
        zt_unit_call c = unit_call(t, u, unit_flags, b);
        if (u == n_units - 1) c.loss = loss;
        c.saved = (unit_flags & ZT_UNIT_TRAIN) ? &t->saved[u] : NULL;
        st = t->model->forward(t->model_lp->state, &c);
        if (st != ZT_OK) return zt_plugin_failed(t->model_lp, st, err, "forward of unit %d", (int)u);
        st = t->zero->after_unit(zs, u, ZT_PHASE_FORWARD);
        if (st != ZT_OK) return zt_plugin_failed(t->zero_lp, st, err, "after_unit(%d, forward)", (int)u);
    }
    return ZT_OK;
}

zt_status tr_backward(trainer *t, const zt_batch *b, int last_micro, zt_error *err)
{
    int32_t n_units = t->info->n_units;
    void *zs = t->zero_lp->state;
    int64_t width = t->info->hidden_size;
    int cur = 0; /* dx[cur] holds the gradient of the current unit's output */
    /* Nothing below the lowest unit with a trainable parameter needs a gradient: the backward stops
     * there, and its forward activations below were kept only for the layers that run it. */
    int32_t lowest = t->layout->lowest_trainable_unit > 0 ? t->layout->lowest_trainable_unit : 0;
    if (lowest < t->grid.first_unit) lowest = t->grid.first_unit;
    for (int32_t u = t->grid.last_unit; u >= lowest; u--) {
        zt_status st = t->zero->before_unit(zs, u, ZT_PHASE_BACKWARD, t->params, t->grads);
        if (st != ZT_OK) return zt_plugin_failed(t->zero_lp, st, err, "before_unit(%d, backward)", (int)u);
        zt_unit_call c = unit_call(t, u, ZT_UNIT_TRAIN, b);
        c.grads = t->grads;
        c.saved = &t->saved[u];
        if (u + 1 < n_units) c.dx_out = hidden_view(t, t->dx[cur], b, width);
        if (u > 0) c.dx_in = hidden_view(t, t->dx[1 - cur], b, width);
        st = t->model->backward(t->model_lp->state, &c);
        if (st != ZT_OK) return zt_plugin_failed(t->model_lp, st, err, "backward of unit %d", (int)u);
        st = t->zero->grads_ready(zs, u, last_micro);
        if (st != ZT_OK) return zt_plugin_failed(t->zero_lp, st, err, "grads_ready(%d)", (int)u);
        st = t->zero->after_unit(zs, u, ZT_PHASE_BACKWARD);
        if (st != ZT_OK) return zt_plugin_failed(t->zero_lp, st, err, "after_unit(%d, backward)", (int)u);
        cur = 1 - cur;
    }
    t->dx_bottom = cur; /* the gradient of the lowest unit's input (a pipeline stage sends it back) */
    return ZT_OK;
}

/* GPU runs: the units read the batch from device memory. Copies b's arrays into device_micro and
 * points b there; ordered on the compute stream, so the copy lands after the kernels of the previous
 * micro-batch have read theirs. */
zt_status tr_upload_batch(trainer *t, zt_batch *b, zt_error *err)
{
    if (!t->on_gpu) return ZT_OK;
    size_t cells = (size_t)b->batch * (size_t)b->seq_len * sizeof(int32_t);
    const micro_batch *d = &t->device_micro;
    struct { int32_t *device; const int32_t **field; size_t bytes; } arrays[] = {
        {d->tokens, &b->tokens, cells},       {d->targets, &b->targets, cells},
        {d->positions, &b->positions, cells}, {d->doc_ids, &b->doc_ids, cells},
        {d->cu_seqlens, &b->cu_seqlens, ((size_t)b->n_docs + 1) * sizeof(int32_t)}};
    for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) {
        if (!*arrays[a].field) continue;
        zt_status st = zt_runtime_memcpy(t->rt, arrays[a].device, *arrays[a].field, arrays[a].bytes, err);
        if (st != ZT_OK) return st;
        *arrays[a].field = arrays[a].device;
    }
    return ZT_OK;
}

/* ---- one optimizer step ----------------------------------------------------------------------- */

static void copy_micro(micro_batch *dst, const zt_loader_batch *src)
{
    size_t cells = (size_t)src->batch * (size_t)src->seq_len * sizeof(int32_t);
    memcpy(dst->tokens, src->tokens, cells);
    memcpy(dst->targets, src->targets, cells);
    memcpy(dst->positions, src->positions, cells);
    memcpy(dst->doc_ids, src->doc_ids, cells);
    memcpy(dst->cu_seqlens, src->cu_seqlens, ((size_t)src->n_spans + 1) * sizeof(int32_t));
    dst->n_spans = src->n_spans;
    dst->max_span_len = src->max_span_len;
    dst->n_tokens = src->n_tokens;
    dst->n_loss_tokens = src->n_loss_tokens;
}

/* Why a step made no update. */
enum { TR_SKIP_NONE = 0, TR_SKIP_NO_LOSS_TOKENS = 1, TR_SKIP_NONFINITE = 2, TR_SKIP_OVERFLOW = 3 };

typedef struct step_outcome {
    double loss;      /* mean over the global batch's loss tokens; NAN when it has none */
    double lr;
    double loss_scale; /* fp16: the scale this step's backward used; 0 otherwise */
    zt_step_result result;
    int32_t skip_cause; /* TR_SKIP_* when result.skipped */
    int64_t tokens, loss_tokens; /* global */
    double forward_s, backward_s, optimizer_s; /* wall_clock_breakdown: this rank's time in each phase */
} step_outcome;

/* wall_clock_breakdown: the time now, once the device has done its queued work (GPU runs), so a phase's
 * time is its own, as DeepSpeed's synchronized timers measure it. Without the option: 0, no sync. */
static double phase_clock(trainer *t, zt_error *err, zt_status *st)
{
    if (!t->set->wall_clock_breakdown) return 0;
    if (t->on_gpu && *st == ZT_OK) *st = zt_runtime_sync(t->rt, err);
    return zt_now_s();
}

/* fp16: the loss scaler learns whether the step overflowed. The zero plugin decided the skip from the
 * global gradient norm, which it reads on the host anyway (clipping and the skip test need it: one
 * 8-byte device-to-host copy per step, already there in bf16 runs), and which is the same on every rank
 * (all-reduced), so every rank skips, halves and doubles in step without another collective. */
static zt_status fp16_after_step(trainer *t, int64_t step, step_outcome *out, zt_error *err)
{
    double used = t->scaler.scale;
    uint32_t f = zt_loss_scaler_update(&t->scaler, out->result.skipped);
    if (f & ZT_LOSS_SCALE_COLLAPSED)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "fp16: gradients overflow even at the minimum loss scale %g at step %lld (%lld overflowing "
                            "steps in a row at fp16.min_loss_scale, %lld skipped in all), so training cannot "
                            "continue. The model itself produces inf/nan in fp16 (activations or gradients "
                            "beyond 65504), not the scaled loss: likely the learning rate is too high (the weights "
                            "diverged: lower optimizer.params.lr, or clip with gradient_clipping) or the model's "
                            "values do not fit fp16. Fixes: lower the learning rate, or train in bf16 (bf16.enabled "
                            "true, fp16.enabled false: no loss scaling needed); lower fp16.min_loss_scale (below 1) if the "
                            "gradients are merely too large for fp16; raise fp16.min_loss_scale only if small "
                            "gradients underflow at the scale it reached (a higher minimum never cures an overflow)",
                            used, (long long)step, (long long)zt_loss_scaler_collapse_after(&t->scaler),
                            (long long)t->scaler.skipped_total);
    if (f & ZT_LOSS_SCALE_SKIPPED)
        zt_log(ZT_LOG_INFO, "step %lld: fp16 gradients overflowed at loss scale %g (norm %g): the update was skipped "
               "(%lld skipped so far)%s", (long long)step, used, out->result.grad_norm,
               (long long)t->scaler.skipped_total,
               f & ZT_LOSS_SCALE_HALVED ? "" : used > t->scaler.min_scale ? "; the scale holds (hysteresis)" : "");
    if (f & ZT_LOSS_SCALE_HALVED)
        zt_log(ZT_LOG_INFO, "step %lld: loss scale %g -> %g", (long long)step, used, t->scaler.scale);
    if (f & ZT_LOSS_SCALE_DOUBLED)
        zt_log(ZT_LOG_INFO, "step %lld: loss scale %g -> %g (%lld steps without overflow)", (long long)step, used,
               t->scaler.scale, (long long)t->set->fp16_window);
    return ZT_OK;
}

static zt_status train_step(trainer *t, int64_t step, step_outcome *out, zt_error *err)
{
    zt_runtime_mem_reset_peaks(t->rt); /* the step's record reports this step's peak */
    memset(out, 0, sizeof *out);
    out->result.struct_size = sizeof out->result;
    int64_t counts[2] = {0, 0}; /* loss tokens, tokens of this rank's micro-batches */
    for (int64_t k = 0; k < t->set->accum; k++) {
        const zt_loader_batch *lb;
        zt_status st = zt_loader_next(t->train_loader, &lb, err);
        if (st != ZT_OK) return st;
        copy_micro(&t->micro[k], lb);
        counts[0] += lb->n_loss_tokens;
        counts[1] += lb->n_tokens;
    }
    zt_status st = t->host->all_reduce(t->host->ctx, &t->dp, counts, counts, 2, ZT_I64, ZT_REDUCE_SUM, NULL);
    if (st != ZT_OK) return tr_host_failed(t, st, err, "counting the global batch's loss tokens (all-reduce over 'dp')");
    out->loss_tokens = counts[0];
    out->tokens = counts[1];
    /* Skipped fp16 steps advance neither the schedule nor Adam's step counter (DeepSpeed's fp16 optimizer
     * does not step the optimizer or the lr scheduler on overflow): the optimizer's step is `applied`. */
    int64_t applied = t->fp16 ? step - t->scaler.skipped_total : step;
    out->lr = zt_schedule_lr(&t->schedule, applied);
    if (counts[0] == 0) {
        /* Nothing to learn from (every target is -100, e.g. answers cut off by seq_len): the mean
         * is undefined, so the step makes no update at all. */
        out->loss = NAN;
        out->result.skipped = 1;
        out->skip_cause = TR_SKIP_NO_LOSS_TOKENS;
        out->result.grad_norm = 0;
        zt_log(ZT_LOG_WARN, "step %lld: the global batch has no loss tokens (every target is -100); no update",
               (long long)step);
        return ZT_OK;
    }

    double loss = 0;
    uint32_t flags = ZT_UNIT_TRAIN | (t->set->recompute ? ZT_UNIT_RECOMPUTE : 0);
    zt_step_args a = {.struct_size = sizeof a,
                      .step = applied,
                      .lr = out->lr,
                      .weight_decay = t->weight_decay,
                      .max_grad_norm = t->set->clip,
                      .loss_scale = t->fp16 ? t->scaler.scale : 1.0};
    out->loss_scale = t->fp16 ? t->scaler.scale : 0;
    /* ABI 1.1: the zero plugin may step each unit inside the backward (step_in_backward) */
    if (t->zero->struct_size >= ZT_ZERO_OPS_SIZE_1_1 && t->zero->begin_step) {
        st = t->zero->begin_step(t->zero_lp->state, &a);
        if (st != ZT_OK) return zt_plugin_failed(t->zero_lp, st, err, "begin_step %lld", (long long)step);
    }
    if (t->grid.pp_size > 1) {
        st = tr_pipeline_step(t, counts[0], flags, &loss, &out->forward_s, &out->backward_s, err);
        if (st != ZT_OK) return st;
    }
    for (int64_t k = 0; k < t->set->accum && t->grid.pp_size == 1; k++) {
        zt_batch b = tr_batch_of(t, &t->micro[k], counts[0]);
        float part = 0;
        st = tr_upload_batch(t, &b, err);
        double t0 = phase_clock(t, err, &st);
        if (st == ZT_OK) st = tr_forward(t, &b, flags, &part, err);
        double t1 = phase_clock(t, err, &st);
        if (st == ZT_OK) st = tr_backward(t, &b, k == t->set->accum - 1, err);
        double t2 = phase_clock(t, err, &st);
        if (st != ZT_OK) return st;
        out->forward_s += t1 - t0;
        out->backward_s += t2 - t1;
        loss += part;
    }
    if (t->dp.size > 1) {
        float shared = (float)loss;
        st = t->host->all_reduce(t->host->ctx, &t->dp, &shared, &shared, 1, ZT_F32, ZT_REDUCE_SUM, NULL);
        if (st != ZT_OK) return tr_host_failed(t, st, err, "summing the loss over 'dp'");
        loss = shared;
    }
    if (t->grid.pp_size > 1) { /* the last stage computed it; the others add 0 */
        float shared = (float)loss;
        st = t->host->all_reduce(t->host->ctx, &t->pp, &shared, &shared, 1, ZT_F32, ZT_REDUCE_SUM, NULL);
        if (st != ZT_OK) return tr_host_failed(t, st, err, "sharing the loss over 'pp'");
        loss = shared;
    }
    out->loss = loss;

    void *zs = t->zero_lp->state;
    double t0 = phase_clock(t, err, &st);
    if (st != ZT_OK) return st;
    st = t->zero->step(zs, &a, &out->result);
    if (st != ZT_OK) return zt_plugin_failed(t->zero_lp, st, err, "step %lld", (long long)step);
    out->optimizer_s = phase_clock(t, err, &st) - t0;
    if (st != ZT_OK) return st;
    st = t->zero->zero_grad(zs);
    if (st != ZT_OK) return zt_plugin_failed(t->zero_lp, st, err, "zero_grad after step %lld", (long long)step);
    if (out->result.skipped) out->skip_cause = t->fp16 ? TR_SKIP_OVERFLOW : TR_SKIP_NONFINITE;
    if (t->fp16) return fp16_after_step(t, step, out, err);
    if (out->result.skipped)
        zt_log(ZT_LOG_WARN, "step %lld: the gradient norm is %g (non-finite): the update was skipped",
               (long long)step, out->result.grad_norm);
    return ZT_OK;
}

/* ---- skipped steps ---------------------------------------------------------------------------- */

/* Consecutive skipped steps after which training stops (docs/training.md, "Skipped steps"). fp16 skips
 * while the loss scale settles: from 2^initial_scale_power down to 1 that takes initial_scale_power +
 * hysteresis - 1 overflows (17 by default), so twice that is no start-up any more. bf16 and fp32 have
 * no start-up skips; a run of them means the weights or the computation went non-finite. Every run
 * gets at least 34, the fp16 figure at the defaults, so a short burst of bad batches never stops one. */
static int64_t skip_limit(const trainer *t)
{
    int64_t settle = t->set->fp16_scale_power + t->set->fp16_hysteresis - 1;
    return t->fp16 && 2 * settle > 34 ? 2 * settle : 34;
}

/* After each step: a run of skipped steps as long as skip_limit() stops training with its cause and
 * fix, instead of skipping to the end and exiting 0 with the weights untouched. */
static zt_status check_skips(trainer *t, int64_t step, const step_outcome *o, zt_error *err)
{
    if (!o->result.skipped) {
        t->skipped_in_row = 0;
        memset(t->skipped_by_cause, 0, sizeof t->skipped_by_cause);
        return ZT_OK;
    }
    if (t->skipped_in_row++ == 0) t->skipped_since = step;
    t->skipped_by_cause[o->skip_cause & 3]++;
    int64_t limit = skip_limit(t);
    if (t->skipped_in_row < limit) return ZT_OK;
    zt_error_set(err, ZT_ERR_CONFIG,
                 "steps %lld to %lld: %lld optimizer steps in a row were skipped (zt stops after %lld; docs/training.md, "
                 "\"Skipped steps\"), so training makes no progress. ",
                 (long long)t->skipped_since, (long long)step, (long long)t->skipped_in_row, (long long)limit);
    if (o->skip_cause == TR_SKIP_NO_LOSS_TOKENS)
        zt_error_append(err, "The last global batch had no loss token (every target is -100): the answers are cut off by "
                        "data.seq_len (%lld), or the data set masks every token. Raise data.seq_len, or re-run zt-prep so "
                        "that prompt and answer fit in it",
                        (long long)t->set->seq_len);
    else if (o->skip_cause == TR_SKIP_OVERFLOW)
        zt_error_append(err, "fp16 gradients overflowed (the loss scale is now %g, from 2^%lld): the model's values do "
                        "not fit fp16, or the weights diverged. Train in bf16 (bf16.enabled true, fp16.enabled false), "
                        "or lower the learning rate (optimizer.params.lr, peak %g); resume from a checkpoint saved before "
                        "step %lld (--resume DIR) or start over",
                        t->scaler.scale, (long long)t->set->fp16_scale_power, t->schedule.peak_lr,
                        (long long)t->skipped_since);
    else
        zt_error_append(err, "The gradient norm was not finite (last: %s): the loss, the gradients or the weights "
                        "overflow. Likely the learning rate is too high (optimizer.params.lr, peak %g): lower it, or "
                        "clip with gradient_clipping (now %g); then resume from a checkpoint saved before step %lld "
                        "(--resume DIR) or start over",
                        isnan(o->result.grad_norm) ? "NaN" : "infinite", t->schedule.peak_lr, t->set->clip,
                        (long long)t->skipped_since);
    int64_t *by = t->skipped_by_cause;
    if (by[o->skip_cause & 3] != t->skipped_in_row)
        zt_error_append(err, " (of the %lld: %lld with a non-finite gradient norm, %lld fp16 overflows, %lld without "
                        "loss tokens)",
                        (long long)t->skipped_in_row, (long long)by[TR_SKIP_NONFINITE], (long long)by[TR_SKIP_OVERFLOW],
                        (long long)by[TR_SKIP_NO_LOSS_TOKENS]);
    return ZT_ERR_CONFIG;
}

/* ---- evaluation ------------------------------------------------------------------------------- */

/* Mean loss over the loss tokens of up to eval.batches micro-batches of the validation split. */
static zt_status evaluate(trainer *t, double *mean_loss, int64_t *n_tokens, zt_error *err)
{
    zt_loader_rewind(t->val_loader);
    int64_t n_batches = zt_loader_info_get(t->val_loader)->batches_per_epoch;
    if (n_batches > t->set->eval_batches) n_batches = t->set->eval_batches;
    double sum = 0;
    int64_t tokens = 0;
    for (int64_t i = 0; i < n_batches && (t->dp.size > 1 || !zt_runtime_cancel_requested()); i++) {
        const zt_loader_batch *lb;
        zt_status st = zt_loader_next(t->val_loader, &lb, err);
        if (st != ZT_OK) return st;
        zt_batch b;
        zt_loader_batch_view(lb, &b);
        b.n_loss_tokens_global = 1; /* the model returns the sum; divided by the token count below */
        float part = 0;
        st = tr_upload_batch(t, &b, err);
        if (st == ZT_OK) st = tr_forward(t, &b, 0, &part, err);
        if (st != ZT_OK) return st;
        sum += part;
        tokens += lb->n_loss_tokens;
    }
    if (t->dp.size > 1) {
        float s = (float)sum;
        int64_t n = tokens;
        zt_status st = t->host->all_reduce(t->host->ctx, &t->dp, &s, &s, 1, ZT_F32, ZT_REDUCE_SUM, NULL);
        if (st == ZT_OK) st = t->host->all_reduce(t->host->ctx, &t->dp, &n, &n, 1, ZT_I64, ZT_REDUCE_SUM, NULL);
        if (st != ZT_OK) return tr_host_failed(t, st, err, "summing the evaluation loss over 'dp'");
        sum = s;
        tokens = n;
    }
    *n_tokens = tokens;
    *mean_loss = tokens ? sum / (double)tokens : NAN;
    return ZT_OK;
}

/* ---- ranks ------------------------------------------------------------------------------------ */

/* After a part that can fail on some ranks only (a full disk, a file another rank wrote): every rank
 * learns whether all succeeded, so none waits in a collective the others skip. A failing rank keeps
 * its own message; the others get one naming the lowest failing rank (its message is in its output). */
zt_status tr_agree_on_status(trainer *t, zt_status mine, zt_error *err, const char *what)
{
    return tr_agree_on_status_in(t, &t->dp, mine, err, what);
}

zt_status tr_agree_on_status_in(trainer *t, const zt_group *g, zt_status mine, zt_error *err, const char *what)
{
    if (g->size == 1) return mine;
    int64_t first = mine == ZT_OK ? INT64_MAX : (int64_t)g->rank * 256 + (int64_t)mine;
    zt_status st = t->host->all_reduce(t->host->ctx, g, &first, &first, 1, ZT_I64, ZT_REDUCE_MIN, NULL);
    if (st != ZT_OK) return mine != ZT_OK ? mine : tr_host_failed(t, st, err, what);
    if (mine != ZT_OK || first == INT64_MAX) return mine;
    return zt_error_set(err, (zt_status)(first % 256), "%s failed on rank %d (its message is in that rank's output)",
                        what, (int)(first / 256));
}

/* A unit's whole weights [padded] (fp32; the frozen region from the compute copy) into `full` on every
 * rank, region by region. A replicated region (the zero plugin's slice is all of it) is read locally;
 * a sharded one is read into the region's start and all-gathered in place, which needs every rank. */
zt_status tr_gather_master(trainer *t, int32_t unit, float *full, zt_error *err)
{
    if (t->export_units) { /* a pipeline's first stage, exporting: the unit as its stage shared it */
        memcpy(full, t->export_units[unit], (size_t)t->layout->units[unit].padded_numel * sizeof(float));
        return ZT_OK;
    }
    void *zs = t->zero_lp->state;
    unit_region r[2];
    int n;
    tr_unit_regions(t, unit, r, &n);
    for (int k = 0; k < n; k++) {
        float *at = full + r[k].start;
        if (!r[k].size) continue;
        zt_status st = t->zero->read_shard(zs, unit, r[k].which, at);
        if (st != ZT_OK) return zt_plugin_failed(t->zero_lp, st, err, "read_shard(unit %d, weights)", (int)unit);
        if (r[k].count == r[k].size) continue;
        if (r[k].count * t->dp.size != r[k].size || r[k].offset != r[k].start + r[k].count * t->dp.rank)
            return zt_error_set(err, ZT_ERR_INTERNAL,
                                "zero plugin '%s' holds elements [%lld, %lld) of unit %d (region [%lld, %lld)) on "
                                "rank %d of %d: neither the whole region nor its even 1/%d slice",
                                t->zero_lp->desc.name, (long long)r[k].offset, (long long)(r[k].offset + r[k].count),
                                (int)unit, (long long)r[k].start, (long long)(r[k].start + r[k].size), (int)t->dp.rank,
                                (int)t->dp.size, (int)t->dp.size);
        st = t->host->all_gather(t->host->ctx, &t->dp, at, at, (uint64_t)r[k].count, ZT_F32, NULL);
        if (st != ZT_OK) return tr_host_failed(t, st, err, "gathering a unit's weights (all-gather over 'dp')");
    }
    return ZT_OK;
}

/* ---- Ctrl-C ------------------------------------------------------------------------------------ */

/* SIGINT (a terminal's Ctrl-C, or zt-run --nproc relaying it) and SIGTERM (a scheduler) ask for a
 * checkpoint: the step in progress finishes, every rank agrees to stop (train_loop), the checkpoint
 * is saved, the exit status is 130. A SIGTERM that a launcher sends to tear a job down after a rank
 * failed cannot get one (saving needs every rank): the job directory tells the two apart (job.h), and
 * then the rank says which rank is gone and ends as SIGTERM ends it.
 *
 * The handler's lines are made before it is installed (a handler may not format): "zt-run: " for
 * one process, "zt[rank N] " for a rank of a job. */
static char g_interrupt_line[256], g_sigterm_line[448], g_second_line[160];
static struct sigaction g_old_int, g_old_term;

static void say(const char *line)
{
    ssize_t ignored = write(STDERR_FILENO, line, strlen(line));
    (void)ignored;
}

static void end_torn_down(int sig)
{
    static char line[2048];
    size_t len = 0;
    line[0] = '\0';
    zt_job_append(line, sizeof line, &len, "zt[rank ");
    zt_job_append_int(line, sizeof line, &len, zt_job_rank());
    zt_job_append(line, sizeof line, &len, "] SIGTERM: the launcher is ending the job, and this rank stops now, "
                  "without a checkpoint (saving one needs every rank): ");
    if (!zt_job_describe_peers(line, sizeof line, &len))
        zt_job_append(line, sizeof line, &len, "no other rank has failed that this one can see (the launcher's "
                      "message says why)");
    zt_job_append(line, sizeof line, &len, "\n");
    say(line);
    zt_job_note_end("terminated", 128 + sig);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig); /* delivered when the handler returns: the rank ends by SIGTERM, as a launcher expects */
}

static void on_interrupt(int sig)
{
    /* The ranks' last collectives first: a job interrupted because it hangs is what they explain. */
    zt_flight_dump(sig == SIGTERM ? "SIGTERM" : "SIGINT");
    if (sig == SIGTERM && zt_job_sigterm_ends_job()) {
        end_torn_down(sig);
        return;
    }
    /* The second: here, or zt-run --nproc's, which comes as mpirun's SIGTERM. */
    if (zt_runtime_cancel_requested() || (sig == SIGTERM && zt_job_interrupts() >= 2)) {
        say(g_second_line);
        zt_job_note_end("exit", 130);
        _exit(zt_job_exit_status(130));
    }
    zt_runtime_request_cancel();
    say(sig == SIGTERM ? g_sigterm_line : g_interrupt_line);
}

static void catch_interrupts(void)
{
    char prefix[32] = "\nzt-run: "; /* one process: off the terminal's "^C" first */
    if (zt_log_rank() >= 0) snprintf(prefix, sizeof prefix, "zt[rank %d] ", zt_log_rank());
    snprintf(g_interrupt_line, sizeof g_interrupt_line, "%sinterrupt: finishing the current step, then saving a "
             "checkpoint (interrupt again to quit without one)\n", prefix);
    snprintf(g_second_line, sizeof g_second_line, "%ssecond interrupt: exiting now, without a checkpoint\n", prefix);
    /* A rank of your own mpirun or srun cannot tell a user's SIGTERM from the launcher's after a
     * failure (only zt-run --nproc records interrupts): it says both. */
    if (zt_log_rank() >= 0 && !zt_job_attached())
        snprintf(g_sigterm_line, sizeof g_sigterm_line, "%sSIGTERM: finishing the current step, then saving a "
                 "checkpoint if every rank is still there (a launcher also sends SIGTERM when a rank has failed: "
                 "then the job ends without one, and the launcher's message names that rank)\n", prefix);
    else
        snprintf(g_sigterm_line, sizeof g_sigterm_line, "%s", g_interrupt_line);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
    zt_job_set_ready(1); /* zt-run --nproc relays a user's interrupt from now on */
}

static void restore_interrupts(void)
{
    zt_job_set_ready(0);
    sigaction(SIGINT, &g_old_int, NULL);
    sigaction(SIGTERM, &g_old_term, NULL);
}

/* ---- the loop ---------------------------------------------------------------------------------- */

static void fill_record(trainer *t, const step_outcome *o, int64_t step, double step_s, int64_t session_steps,
                        zt_train_record *r)
{
    memset(r, 0, sizeof *r);
    r->step = step;
    r->total_steps = t->set->steps;
    r->loss = o->loss;
    r->lr = o->lr;
    r->grad_norm = o->result.grad_norm;
    r->skipped = o->result.skipped;
    r->loss_scale = o->loss_scale;
    r->tokens = o->tokens;
    r->loss_tokens = o->loss_tokens;
    r->step_s = step_s;
    r->elapsed_s = t->elapsed_before + t->session_s;
    r->eta_s = t->session_s / (double)session_steps * (double)(t->set->steps - step);
    r->has_device = t->host->device->device_type != ZT_DEVICE_CPU;
    for (int p = 0; p < ZT_POOL_COUNT; p++) {
        zt_runtime_mem_stats(t->rt, p, ZT_MEM_HOST, &r->host_mem[p]);
        if (r->has_device) {
            zt_runtime_mem_stats(t->rt, p, ZT_MEM_DEVICE, &r->device_mem[p]);
            /* Pinned memory (offload's shards and staging) is host memory too: the host figures are
             * pageable + pinned (the peak is the sum of the two kinds' peaks: an upper bound). */
            zt_mem_stats pinned;
            zt_runtime_mem_stats(t->rt, p, ZT_MEM_PINNED, &pinned);
            r->host_mem[p].current += pinned.current;
            r->host_mem[p].peak += pinned.peak;
            r->host_mem[p].n_allocs += pinned.n_allocs;
        }
    }
}

static zt_status run_eval(trainer *t, int64_t step, zt_error *err)
{
    double started = zt_now_s(), loss = 0;
    int64_t tokens = 0;
    zt_status st = evaluate(t, &loss, &tokens, err);
    if (st != ZT_OK || zt_runtime_cancel_requested()) return st;
    double took = zt_now_s() - started;
    zt_log(ZT_LOG_INFO, "step %lld/%lld | eval_loss %.4f over %lld tokens (%.1f s)", (long long)step,
           (long long)t->set->steps, loss, (long long)tokens, took);
    st = t->metrics ? zt_metrics_eval(t->metrics, step, loss, tokens, took, err) : ZT_OK;
    return st == ZT_OK && t->tensorboard ? zt_tensorboard_eval(t->tensorboard, step, loss, err) : st;
}

/* How to continue after an interruption, for the final message. */
static void interrupted_message(trainer *t, int64_t start_step, const char *saved_dir, zt_error *err)
{
    if (t->step == start_step && !saved_dir) {
        zt_error_set(err, ZT_ERR_CANCELLED, "interrupted before step %lld was complete: nothing new to save%s",
                     (long long)(t->step + 1), t->req->resume ? " (the checkpoint resumed from is unchanged)" : "");
        return;
    }
    zt_error_set(err, ZT_ERR_CANCELLED,
                 "interrupted after step %lld of %lld; its checkpoint is in %s. Resume with the same command plus "
                 "--resume latest",
                 (long long)t->step, (long long)t->set->steps, saved_dir ? saved_dir : t->set->checkpoint_dir);
}

static zt_status train_loop(trainer *t, zt_error *err)
{
    /* The run starts from a saved state (a checkpoint) or a reproducible one (seed, --model). */
    int64_t start_step = t->step, last_saved = t->step, session_steps = 0;
    zt_loader_position pos;
    zt_loader_get_position(t->train_loader, &pos);
    zt_status st = ZT_OK;
    int32_t stop[2] = {0, 0}; /* interrupted, epochs done: on any rank */
    while (t->step < t->set->steps) {
        stop[0] = zt_runtime_cancel_requested();
        stop[1] = t->set->epochs > 0 && pos.epoch >= (uint64_t)t->set->epochs;
        if (t->dp.size > 1) {
            st = t->host->all_reduce(t->host->ctx, &t->dp, stop, stop, 2, ZT_I32, ZT_REDUCE_MAX, NULL);
            if (st != ZT_OK) return tr_host_failed(t, st, err, "agreeing on whether to stop (all-reduce over 'dp')");
        }
        if (stop[0]) break;
        if (stop[1]) {
            zt_log(ZT_LOG_INFO, "reached %lld epoch%s after step %lld: stopping (epochs)", (long long)t->set->epochs,
                   t->set->epochs == 1 ? "" : "s", (long long)t->step);
            break;
        }
        int64_t step = t->step + 1;
        double started = zt_now_s();
        step_outcome o;
        zt_runtime_comm_step_begin(t->rt); /* the step's collectives, for its record (host/comm_monitor.h) */
        st = train_step(t, step, &o, err);
        zt_comm_stats comm;
        zt_runtime_comm_step_end(t->rt, &comm);
        if (st == ZT_ERR_CANCELLED) break; /* a plugin stopped mid-step: the last complete step is saved */
        if (st != ZT_OK) return st;
        double step_s = zt_now_s() - started;
        t->session_s += step_s;
        session_steps++;
        t->step = step;
        t->tokens_seen += o.tokens;
        zt_loader_get_position(t->train_loader, &pos);

        zt_train_record r;
        fill_record(t, &o, step, step_s, session_steps, &r);
        r.comm = &comm;
        st = t->metrics ? zt_metrics_train(t->metrics, &r, err) : ZT_OK;
        if (st == ZT_OK && t->tensorboard) st = zt_tensorboard_train(t->tensorboard, &r, err);
        if (st != ZT_OK) return st;
        if (step % t->set->log_every == 0 || step == t->set->steps) {
            char line[512];
            zt_metrics_format_train(&r, line, sizeof line);
            zt_log(ZT_LOG_INFO, "%s", line);
            if (t->set->wall_clock_breakdown)
                zt_log(ZT_LOG_INFO, "step %lld time (wall_clock_breakdown, rank %d): forward %.3f s | backward %.3f s "
                       "| optimizer step %.3f s | the rest %.3f s", (long long)step, (int)t->host->world_rank,
                       o.forward_s, o.backward_s, o.optimizer_s, step_s - o.forward_s - o.backward_s - o.optimizer_s);
        }
        st = check_skips(t, step, &o, err);
        if (st != ZT_OK) return st;
        if (t->set->eval_every > 0 && step % t->set->eval_every == 0) {
            st = run_eval(t, step, err);
            if (st != ZT_OK) return st;
        }
        if (t->set->checkpoint_every > 0 && step % t->set->checkpoint_every == 0 && step < t->set->steps) {
            char *dir = NULL;
            st = tr_save_checkpoint(t, step, &pos, &dir, err);
            free(dir);
            if (st != ZT_OK) return st;
            last_saved = step;
        }
    }
    int cancelled = st == ZT_ERR_CANCELLED || stop[0];
    /* Every rank is here (the ranks agreed to stop, or all finished): the end-of-run table. */
    zt_status reported = zt_runtime_comm_report(t->rt, t->session_s, err);
    if (reported != ZT_OK) return reported;
    char *dir = NULL;
    /* checkpoint.final = false skips the end-of-run checkpoint, never the one an interruption needs */
    int save = t->step > last_saved && (t->set->checkpoint_final || cancelled);
    zt_status saved = save ? tr_save_checkpoint(t, t->step, &pos, &dir, err) : ZT_OK;
    if (saved == ZT_OK && cancelled) {
        interrupted_message(t, start_step, dir, err);
        saved = ZT_ERR_CANCELLED;
    }
    free(dir);
    return saved;
}

/* ---- entry ------------------------------------------------------------------------------------- */

static zt_status prepare_output(trainer *t, zt_error *err)
{
    zt_flight_set_dir(t->set->output_dir); /* its dumps, when there is no job directory (dist/flight.h) */
    zt_status st = zt_mkdir_p(t->set->output_dir, "output", "choose another output_dir (--output-dir DIR)", err);
    if (st != ZT_OK) return st;
    char path[4096];
    /* World ranks: with tensor or pipeline parallelism several ranks are data-parallel rank 0 */
    if (t->host->world_rank != 0) {
        /* One run, one output directory, which rank 0 writes; each other rank keeps its own records
         * (its memory and communication) beside rank 0's metrics.jsonl. */
        snprintf(path, sizeof path, "%s/metrics.rank%d.jsonl", t->set->output_dir, (int)t->host->world_rank);
        return zt_metrics_open(path, t->req->resume ? t->step : -1, &t->metrics, err);
    }
    snprintf(path, sizeof path, "%s/config.resolved.json", t->set->output_dir);
    st = zt_config_save_resolved(t->req->cfg, path, t->req->plugins_json, err);
    if (st != ZT_OK) return st;
    /* Every value the run uses, defaults included, with the plugin versions: the first thing to read
     * when two runs differ. */
    zt_log(ZT_LOG_INFO, "resolved config (also in %s):", path);
    st = zt_config_write_resolved(t->req->cfg, stderr, t->req->plugins_json, err);
    if (st != ZT_OK) return st;
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->set->output_dir);
    st = zt_metrics_open(path, t->req->resume ? t->step : -1, &t->metrics, err);
    if (st != ZT_OK || !t->set->tensorboard) return st;
    int64_t samples_per_step = t->set->micro_batch * t->set->accum * t->dp.size; /* DeepSpeed's x-axis */
    return zt_tensorboard_open(t->set, samples_per_step, t->step, &t->tensorboard, err);
}

static zt_status setup_and_train(trainer *t, zt_error *err)
{
    t->set = t->req->settings;
    /* The optimizer plugin declares weight_decay when it has one; without it nothing decays. */
    if (zt_config_get_float(t->req->cfg, "optimizer.params.weight_decay", &t->weight_decay) != ZT_OK) t->weight_decay = 0;
    if (!t->set->data_path) return no_data_error(err);
    zt_status st = bind_plugins(t, err);
    if (st == ZT_OK && t->host->world_rank > 0) zt_log_set_level(ZT_LOG_WARN);
    if (st == ZT_OK) st = zt_schedule_for_run(&t->set->schedule, t->set->steps, t->req->cfg, &t->schedule, err);
    zt_layout_options lo = {t->dp.size, t->set->trainable_params, t->set->no_decay_flags, t->set->freeze_include,
                            t->set->freeze_exclude, t->tp_shards, 0, 0, 0};
    /* a pipeline stage stores its own units only; the whole model's layout is the export's */
    if (st == ZT_OK && t->grid.pp_size > 1) st = zt_layout_build(t->info, &lo, &t->whole_layout, err);
    lo.held_range = t->grid.pp_size > 1;
    lo.held_first = t->grid.first_unit;
    lo.held_last = t->grid.last_unit;
    if (st == ZT_OK) st = zt_layout_build(t->info, &lo, &t->layout, err);
    if (st == ZT_OK && t->on_gpu) t->layout->layout.compute_dtype = t->compute16;
    if (st == ZT_OK) {
        zt_status zs = t->zero->setup(t->zero_lp->state, &t->layout->layout, t->opt, t->opt_lp->state);
        if (zs != ZT_OK) st = zt_plugin_failed(t->zero_lp, zs, err, "setup");
    }
    if (st == ZT_OK) st = open_data(t, err);
    if (st == ZT_OK) st = alloc_buffers(t, err);
    if (st == ZT_OK) st = tr_pipeline_setup(t, err);
    if (st != ZT_OK) return st;

    if (t->req->adapter_dir && (!t->req->model_dir || t->req->resume || !tr_adapter_spec(t)))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--adapter %s: %s", t->req->adapter_dir,
                            !tr_adapter_spec(t) ? "this run has no adapter plugin; add one to --plugins (--plugins llama,lora)"
                            : t->req->resume ? "a resumed run takes its adapter from the checkpoint; leave --adapter out"
                                             : "an adapter goes on the base model it was trained on: add --model BASE");
    if (t->req->export_adapter_dir && !tr_adapter_spec(t))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--export-adapter %s: this run has no adapter plugin; add one to --plugins (--plugins "
                            "llama,lora), or export the whole model with --export",
                            t->req->export_adapter_dir);
    if ((st = tr_check_checkpoint_settings(t, err)) != ZT_OK) return st;
    tr_remove_stale_staging(t);
    if (t->req->resume) st = tr_resume(t, err);
    else if (t->req->model_dir) st = tr_load_hf(t, t->req->model_dir, t->req->adapter_dir, err);
    else st = tr_load_master(t, tr_random_source, NULL, err);
    tr_drop_shard_buffer(t);
    if (st == ZT_OK) st = tr_agree_on_status(t, prepare_output(t, err), err, "preparing the output directory");
    /* a pipeline's export is its first stage's, once every stage has shared its units' weights */
    if (st == ZT_OK && t->req->export_dir && t->grid.pp_rank == 0) st = tr_export_prepare(t, err);
    if (st != ZT_OK) return st;

    zt_log(ZT_LOG_INFO, "training %lld parameters (%lld trainable) for %lld steps of %lld x %lld x %d sequences of "
           "%lld tokens; schedule %s, peak lr %g",
           (long long)t->info->n_parameters, (long long)t->layout->n_trainable, (long long)t->set->steps,
           (long long)t->set->micro_batch, (long long)t->set->accum, (int)t->dp.size, (long long)t->set->seq_len,
           zt_schedule_type_name(t->schedule.type), t->schedule.peak_lr);
    if (t->step >= t->set->steps)
        zt_log(ZT_LOG_INFO, "the checkpoint is at step %lld and steps is %lld: nothing left to train",
               (long long)t->step, (long long)t->set->steps);
    st = train_loop(t, err);
    if (st == ZT_OK && t->req->export_dir && t->grid.pp_size > 1) st = tr_pipeline_share_weights(t, err);
    if (st == ZT_OK && t->req->export_dir && t->grid.pp_rank == 0) st = tr_export_hf(t, err);
    tr_pipeline_export_done(t);
    if (st == ZT_OK && t->req->export_adapter_dir) st = tr_export_adapter(t, t->req->export_adapter_dir, err);
    return st;
}

zt_status zt_train_run(const zt_train_request *req, zt_error *err)
{
    trainer t;
    memset(&t, 0, sizeof t);
    t.req = req;
    t.rt = req->rt;
    catch_interrupts();
    zt_status st = setup_and_train(&t, err);
    zt_log_set_level(ZT_LOG_INFO);
    restore_interrupts();
    zt_metrics_close(t.metrics);
    zt_tensorboard_close(t.tensorboard);
    tr_export_free(&t);
    if (t.info) free_buffers(&t);
    zt_loader_close(t.train_loader);
    zt_loader_close(t.val_loader);
    /* The zero plugin holds the layout (and the layout the model's info) until its fini. */
    zt_plugin_set_unload(req->plugins);
    tr_pipeline_export_done(&t);
    zt_layout_free(t.layout);
    zt_layout_free(t.whole_layout);
    tr_tensor_parallel_free(&t);
    return st;
}
