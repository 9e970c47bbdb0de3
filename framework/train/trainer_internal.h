/* Private to framework/train/: the trainer's state and what its files share.
 *
 *   trainer.c        settings and configuration, setup, one micro-batch, one optimizer step,
 *                    evaluation, ranks, Ctrl-C, the loop, the entry
 *   weights.c        weights in (random, a Hugging Face directory)
 *   export.c         weights out: the Hugging Face export, planned before the first step
 *   checkpointing.c  checkpoints: saving (every rank's shard, committed by rank 0) and resuming
 */
#ifndef ZT_FRAMEWORK_TRAINER_INTERNAL_H
#define ZT_FRAMEWORK_TRAINER_INTERNAL_H

#include "data/loader.h"
#include "train/layout.h"
#include "train/loss_scale.h"
#include "train/metrics.h"
#include "train/tensorboard.h"
#include "train/schedule.h"
#include "train/trainer.h"

/* A copy of one loader micro-batch: the loader overwrites its own on the next call, and a step needs
 * all of its micro-batches at once (their loss tokens are counted before the first forward). */
typedef struct micro_batch {
    int32_t *tokens, *targets, *positions, *doc_ids, *cu_seqlens;
    int32_t n_spans, max_span_len;
    int64_t n_tokens, n_loss_tokens;
} micro_batch;

typedef struct tr_export_plan tr_export_plan; /* export.c */

typedef struct trainer {
    const zt_train_request *req;
    zt_runtime *rt;
    const zt_host_settings *set; /* the request's */
    double weight_decay;          /* optimizer.params.weight_decay, 0 when the optimizer has none */
    const zt_host *host; /* the trainer's own services table: collectives */
    zt_group dp;         /* the data-parallel group: every rank, or the parallel plugin's "dp" */
    zt_group world;      /* every rank (a checkpoint's writers): "dp" itself without a parallel plugin */
    zt_rank_grid grid;   /* this rank in the data x tensor x pipeline grid (1 x 1 without a parallel plugin) */
    /* Tensor parallelism (tensor_parallel.c): the "tp" group and this rank's shard of every
     * parameter, which the layout allocates; tp_shards NULL: one tensor-parallel rank. */
    zt_group tp;
    zt_param_shard *tp_shards;
    zt_param_shard *tp_all_shards; /* [tp.size * n_params_decl]: every tp rank's, for the export */
    float *tp_units;               /* the export: one unit of every tp rank [tp.size * largest unit] */

    const zt_loaded_plugin *model_lp, *zero_lp, *opt_lp, *attention_lp;
    const zt_model_ops *model;
    const zt_zero_ops *zero;
    const zt_optimizer_ops *opt;
    const zt_model_info *info;
    zt_attention_binding attention;

    zt_host_layout *layout;
    /* A pipeline stage: the whole model's layout (its units' geometry, no storage), which the first
     * stage exports through, with every unit's trained weights in export_units [n_units][padded]
     * (tr_pipeline_share_weights until tr_pipeline_export_done). */
    zt_host_layout *whole_layout;
    float **export_units;
    zt_schedule schedule;
    zt_loader *train_loader, *val_loader;
    const zt_loader_info *data_info;

    micro_batch *micro;  /* [accum] */
    /* fp16 on a GPU (fp16.enabled): 16-bit compute in IEEE half with dynamic loss scaling */
    int fp16;
    int32_t compute16;   /* GPU runs: ZT_BF16 or ZT_F16 */
    zt_loss_scaler scaler;
    int fp16_test_overflow; /* ZT_FP16_TEST_OVERFLOW=1: every backward overflows (the collapse test) */
    /* GPU runs: the units compute on the device, in bf16 or fp16; the micro-batch being computed is copied
     * into device_micro (its int32 arrays only) and hidden states live in device memory. */
    int on_gpu;
    micro_batch device_micro;
    void **hidden;       /* [n_units - 1]: the output of unit u is hidden[u] (compute dtype) */
    void *dx[2];
    int dx_bottom;       /* after a backward: dx[dx_bottom] is the gradient of its lowest unit's input */
    void **saved;        /* [n_units] */
    zt_group pp;         /* pipeline parallel: the "pp" group of the parallel plugin */
    struct tr_pipeline *pipeline; /* pipeline parallel: the schedule and the micro-batches' buffers */
    zt_tensor *params, *grads;
    int32_t max_unit_params;
    float *shard_buf;    /* one unit's shard while weights move in or out (hold_shard_buffer) */

    zt_metrics *metrics;  /* rank 0: metrics.jsonl; rank R: metrics.rank<R>.jsonl */
    zt_tensorboard *tensorboard; /* rank 0 with tensorboard.enabled; else NULL */
    tr_export_plan *export_plan; /* --export: what rank 0 will write (NULL on the other ranks) */
    /* The run of skipped steps that ends at the last step (trainer.c, "skipped steps"): its length,
     * its first step, and its steps by cause (TR_SKIP_*). */
    int64_t skipped_in_row, skipped_since, skipped_by_cause[4];
    int64_t step;        /* optimizer steps completed */
    double elapsed_before; /* training seconds of earlier sessions (resume) */
    double session_s;      /* training seconds of this session (steps only) */
    int64_t tokens_seen;
    /* checkpoint.only_trainable: the hash of the frozen base weights as loaded (base_weights.c), which
     * the checkpoints record; rank 0 only */
    uint64_t base_hash;
    int32_t base_hash_known;
} trainer;

/* Fill every unit's master from `fill`, which writes this rank's slice [offset, offset + count) of a
 * unit's padded buffer into dst (padding zero). */
typedef zt_status (*shard_source)(trainer *t, void *ctx, int32_t unit, int64_t offset, int64_t count, float *dst,
                                  zt_error *err);

/* Calls fn for every parameter with storage that overlaps [offset, offset + count) of unit u:
 * the element range inside the tensor and where it lies in the slice. */
typedef zt_status (*piece_fn)(trainer *t, void *ctx, int32_t param, int64_t elem_offset, int64_t n, float *slice_at,
                              zt_error *err);

/* One region of a unit's buffer as this rank's zero plugin holds it: the trainable region (which =
 * ZT_SHARD_MASTER; the whole buffer with a zero plugin older than ABI 1.3) or the frozen region
 * (ZT_SHARD_FROZEN), start and size of the region, and this rank's slice [offset, offset + count). */
typedef struct unit_region {
    int32_t which;
    int64_t start, size;
    int64_t offset, count;
} unit_region;

/* The regions of unit u (1 or 2; a frozen region only when it is not empty): *n of them into r. */
void tr_unit_regions(trainer *t, int32_t u, unit_region r[2], int *n);

/* ---- trainer.c ----------------------------------------------------------------------------------- */

/* Our own collective failed: the runtime recorded why in our services table. */
zt_status tr_host_failed(trainer *t, zt_status st, zt_error *err, const char *what);
/* One unit's shard in host memory for weights on their way in or out (loading, checkpoints,
 * export). Held only meanwhile: for a 7B model it is the 0.5 GB embedding. */
zt_status tr_hold_shard_buffer(trainer *t, zt_error *err);
void tr_drop_shard_buffer(trainer *t);
/* After a part that can fail on some ranks only (a full disk, a file another rank wrote): every rank
 * learns whether all succeeded, so none waits in a collective the others skip. A failing rank keeps
 * its own message; the others get one naming the lowest failing rank (its message is in its output). */
zt_status tr_agree_on_status(trainer *t, zt_status mine, zt_error *err, const char *what);
/* The same over group g (a checkpoint agrees over t->world). */
zt_status tr_agree_on_status_in(trainer *t, const zt_group *g, zt_status mine, zt_error *err, const char *what);
/* A unit's whole fp32 master [padded] into `full` on every rank. A replicated unit (the zero plugin's
 * shard is the whole unit) is read locally; a sharded one is read into the start of `full` and
 * all-gathered in place, which needs every rank. */
zt_status tr_gather_master(trainer *t, int32_t unit, float *full, zt_error *err);

/* ---- trainer.c: one micro-batch through this rank's units ----------------------------------------- */

zt_batch tr_batch_of(const trainer *t, const micro_batch *mb, int64_t n_loss_tokens_global);
/* On a GPU: the batch's arrays copied into the trainer's device copy (one set: each micro-batch's
 * before its forward or backward, ordered on the compute stream) and b pointed at them. */
zt_status tr_upload_batch(trainer *t, zt_batch *b, zt_error *err);
zt_status tr_forward(trainer *t, const zt_batch *b, uint32_t flags, float *loss, zt_error *err);
zt_status tr_backward(trainer *t, const zt_batch *b, int last_micro, zt_error *err);

/* ---- pipeline.c: a pipeline stage's step (docs/parallel.md) --------------------------------------- */

/* After the buffers: the schedule, and hidden-state buffers and saved slots for as many micro-batches
 * as the schedule keeps in flight on this stage (slot 0 is the trainer's own). */
zt_status tr_pipeline_setup(trainer *t, zt_error *err);
/* This step's micro-batches (t->micro) through the plugin's instruction list; *loss: this stage's sum
 * (0 off the last stage). */
zt_status tr_pipeline_step(trainer *t, int64_t loss_tokens_global, uint32_t flags, double *loss, double *forward_s,
                           double *backward_s, zt_error *err);
void tr_pipeline_free(trainer *t);
/* Every unit's trained weights from the stage that owns it (gathered over "dp", broadcast over "pp")
 * into the first stage's export_units, whose t->layout becomes the whole model's, so it can export
 * the whole model; tr_pipeline_export_done gives the stage its own layout back. */
zt_status tr_pipeline_share_weights(trainer *t, zt_error *err);
void tr_pipeline_export_done(trainer *t);

/* ---- ranks.c: the data-parallel group, or the parallel plugin's grid and groups (t->dp, t->grid) ---- */

zt_status tr_setup_ranks(trainer *t, zt_error *err);

/* ---- weights.c ----------------------------------------------------------------------------------- */

zt_status tr_load_master(trainer *t, shard_source fill, void *ctx, zt_error *err);
zt_status tr_random_source(trainer *t, void *ctx, int32_t unit, int64_t offset, int64_t count, float *dst,
                           zt_error *err);
zt_status tr_for_each_piece(trainer *t, int32_t u, int64_t offset, int64_t count, float *slice, piece_fn fn,
                            void *ctx, zt_error *err);
/* The base model from the HF directory `dir`, the adapter's parameters from the peft directory
 * adapter_dir (NULL: their declared initialisation). */
zt_status tr_load_hf(trainer *t, const char *dir, const char *adapter_dir, zt_error *err);

/* ---- tensor_parallel.c --------------------------------------------------------------------------- */

/* After the parallel plugin's setup and before the layout: puts the model on tensor-parallel rank
 * tp_rank of tp_size over the "tp" group (zt_model_ops.parallelize) and keeps its shards in
 * t->tp_shards. tp_size 1 does nothing. A model without the ABI 1.4 ops is a message naming it. */
zt_status tr_tensor_parallel(trainer *t, int32_t tp_size, int32_t tp_rank, int32_t seq_parallel, zt_error *err);
void tr_tensor_parallel_free(trainer *t);
/* Export with tensor parallelism: the unit in `local` (this rank's gathered master) from every tp rank
 * into all [tp.size * padded_numel] (a collective over "tp"), and element range [elem_offset, +count)
 * of parameter `param`'s logical tensor assembled from them into dst. */
zt_status tr_tp_gather_unit(trainer *t, int32_t unit, const float *local, float *all, zt_error *err);
void tr_tp_assemble(const trainer *t, int32_t param, const float *all, int64_t unit_numel, int64_t elem_offset,
                    int64_t count, float *dst);

/* ---- export.c ------------------------------------------------------------------------------------ */

/* Before the first step (so a run never trains only to fail at the end): rank 0 decides everything
 * the export writes (config.json, dtype, tokenizer and generation config sources) and checks the
 * destination and the tokenizer file; every rank learns whether that worked. */
zt_status tr_export_prepare(trainer *t, zt_error *err);
/* After the last step. Rank 0 writes the files into a staging directory and swaps it in; sharded
 * units are gathered as it reads them: it broadcasts each unit it needs and every rank joins the
 * gather, until it broadcasts -1. */
zt_status tr_export_hf(trainer *t, zt_error *err);
void tr_export_free(trainer *t);

/* ---- adapter_files.c: peft's adapter files -------------------------------------------------------- */

typedef struct zt_st_file zt_st_file;
/* The adapter plugin's spec, or NULL when the run has none. */
const zt_adapter_spec *tr_adapter_spec(const trainer *t);
/* DIR/adapter_model.safetensors, checked against the run's adapter (adapter_config.json's r and
 * lora_alpha, exactly the run's adapter tensors); close with zt_st_close. */
zt_status tr_adapter_open(trainer *t, const char *dir, zt_st_file **out, zt_error *err);
/* Elements [elem_offset, elem_offset + n) of adapter parameter `param` from the file. */
zt_status tr_adapter_read(trainer *t, const zt_st_file *f, int32_t param, int64_t elem_offset, int64_t n,
                          float *dst, zt_error *err);
/* dst (elements [elem_offset, +count) of base parameter `param`, from unit_buf, its unit's whole
 * buffer) += scaling * (B A) when the adapter adapts it; else nothing. */
void tr_adapter_merge(const trainer *t, int32_t param, const float *unit_buf, uint64_t elem_offset, uint64_t count,
                      float *dst);
/* The same from the logical factors A [r, in] and B [out, r] (a tensor-parallel export assembles them);
 * tr_adapter_factors: whether the adapter adapts base parameter `param`, and its A and B. */
void tr_adapter_merge_factors(const trainer *t, int32_t param, const float *A, const float *B, uint64_t elem_offset,
                              uint64_t count, float *dst);
int tr_adapter_factors(const trainer *t, int32_t param, int32_t *a, int32_t *b);
/* --export-adapter: rank 0 writes DIR/adapter_config.json and adapter_model.safetensors; every rank
 * joins (as tr_export_hf). */
zt_status tr_export_adapter(trainer *t, const char *dir, zt_error *err);

/* ---- base_weights.c: the hash of the frozen base weights (checkpoint.only_trainable) ------------- */

typedef struct zt_hf_model zt_hf_model;
typedef struct zt_ckpt zt_ckpt;
/* 1 for a parameter with storage that does not train: what a trainable-only checkpoint leaves out. */
int tr_is_frozen_with_storage(const trainer *t, int32_t param);
/* The hash over the frozen parameters' values read from an HF model or a checkpoint's "param" group. */
zt_status tr_base_hash_hf(trainer *t, zt_hf_model *model, uint64_t *out, zt_error *err);
zt_status tr_base_hash_checkpoint(trainer *t, zt_ckpt *c, uint64_t *out, zt_error *err);
/* Refuses checkpoint.only_trainable in a run that has no base to read the frozen weights from. */
zt_status tr_check_checkpoint_settings(const trainer *t, zt_error *err);

/* ---- checkpointing.c ----------------------------------------------------------------------------- */

/* Rank 0 stages the directory and tells the others where it is; every rank writes its own file; rank 0
 * collects the descriptions and publishes (checkpoint.h). The ranks agree after each part, so a
 * failure on one of them stops all of them at the same point. */
zt_status tr_save_checkpoint(trainer *t, int64_t step, const zt_loader_position *pos, char **final_dir,
                             zt_error *err);
zt_status tr_resume(trainer *t, zt_error *err);
/* Rank 0, before anything is saved or resumed: remove the checkpoint root's staging directories left
 * by saves whose writer is gone (zt_ckpt_remove_stale_staging). */
void tr_remove_stale_staging(trainer *t);

#endif
