/* zt's own checkpoints (docs/checkpoint-format.md is the reference for the files).
 *
 * A checkpoint stores LOGICAL tensors by their Hugging Face name and group ("param" for the fp32
 * master weights, the optimizer's state names such as "exp_avg" for its state), never the padded
 * flat buffers of a particular run. Each writing rank stores the element ranges of the logical
 * tensors it holds in its own data file; checkpoint.json lists, for every logical tensor, which
 * rank file holds which range. A reader asks for any element range of any logical tensor and gets it
 * assembled from whichever shards cover it, so a checkpoint written by N ranks under one ZeRO stage
 * loads under M ranks and any other stage, and padding never reaches the file.
 *
 * Writing, in three steps shaped for multi-rank runs:
 *   1. rank 0: zt_ckpt_stage() creates ROOT/step-000100.tmp-<pid>-XXXXXX/ (multi-rank: broadcast
 *      the path);
 *   2. every rank: a zt_ckpt_rank_writer writes rank-RRRRR.bin in it and returns the descriptions of
 *      what it wrote (zt_ckpt_rank_result; multi-rank: gather them to rank 0);
 *   3. rank 0: zt_ckpt_commit() checks that the shards cover every declared tensor exactly once,
 *      writes checkpoint.json, syncs, renames the directory to ROOT/step-000100/, points ROOT/latest
 *      at it and prunes old checkpoints.
 * A crash at any point leaves either the previous complete checkpoint or the new one; a leftover
 * *.tmp-* directory is ignored (and reported) by readers, and removed by the next run on the same
 * host once its writer is gone (zt_ckpt_remove_stale_staging).
 *
 * Not thread-safe: one thread uses a given writer or reader at a time.
 */
#ifndef ZT_FRAMEWORK_CHECKPOINT_H
#define ZT_FRAMEWORK_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include "zt/zt_train.h"
#include "base/error.h"

#define ZT_CKPT_FORMAT_VERSION 1
#define ZT_CKPT_NAME_MAX 256  /* tensor and blob names, NUL included */
#define ZT_CKPT_GROUP_MAX 64
#define ZT_CKPT_MAX_DIMS 8
#define ZT_CKPT_GROUP_PARAM "param" /* the fp32 master weights */

/* Where a checkpoint was written from; recorded for people, never needed to read it back. */
typedef struct zt_ckpt_layout {
    int32_t world_size;
    int32_t zero_stage;
    int32_t dp_size;
    int32_t tp_size;
    int32_t pp_size;
} zt_ckpt_layout;

/* The model's shape, so a resume with a different model fails with a clear comparison. */
typedef struct zt_ckpt_model_shape {
    int64_t n_layers;
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t n_heads;
    int64_t n_kv_heads;
    int64_t head_dim;
    int64_t intermediate_size;
} zt_ckpt_model_shape;

void zt_ckpt_model_shape_from_info(const zt_model_info *info, zt_ckpt_model_shape *out);

/* One logical tensor to save. */
typedef struct zt_ckpt_tensor_decl {
    const char *name;  /* "model.layers.0.mlp.up_proj.weight" */
    const char *group; /* ZT_CKPT_GROUP_PARAM or an optimizer state name */
    int32_t ndim;
    int64_t shape[ZT_CKPT_MAX_DIMS];
} zt_ckpt_tensor_decl;

/* ---- writing --------------------------------------------------------------------------------- */

typedef enum zt_ckpt_piece_kind {
    ZT_CKPT_SHARD = 0, /* elements [elem_offset, elem_offset + count) of a logical tensor */
    ZT_CKPT_BLOB = 1   /* named bytes: RNG state, loader position, scheduler, loss scale */
} zt_ckpt_piece_kind;

/* One thing a rank wrote into its data file. Plain data (fixed-size strings), so a multi-rank run
 * can gather these to rank 0 as bytes. */
typedef struct zt_ckpt_piece {
    int32_t kind;                  /* zt_ckpt_piece_kind */
    int32_t rank;
    char name[ZT_CKPT_NAME_MAX];   /* tensor or blob name */
    char group[ZT_CKPT_GROUP_MAX]; /* shards: the tensor's group; blobs: "" */
    int64_t elem_offset;           /* shards: first element within the flattened tensor */
    int64_t count;                 /* shards: elements; blobs: bytes */
    uint64_t byte_offset;          /* position in the rank's data file */
    uint64_t byte_size;
    uint64_t checksum;             /* FNV-1a 64 of those bytes */
} zt_ckpt_piece;

/* What one rank wrote: its data file and the pieces in it. */
typedef struct zt_ckpt_rank_result {
    int32_t rank;
    uint64_t file_size;
    zt_ckpt_piece *pieces; /* malloc'd; zt_ckpt_rank_result_free */
    size_t n_pieces;
} zt_ckpt_rank_result;

void zt_ckpt_rank_result_free(zt_ckpt_rank_result *r);

/* Step 1 (rank 0): create the staging directory for `step` under root (root is created if
 * missing), with a writer.json naming this process (host, boot id, pid namespace, pid) until the
 * commit removes it. *staging_dir is malloc'd. */
zt_status zt_ckpt_stage(const char *root, int64_t step, char **staging_dir, zt_error *err);
/* Remove a staging directory after a failed save: the regular files in it, then the directory. */
void zt_ckpt_discard_stage(const char *staging_dir);
/* Remove root's staging directories (step-N.tmp-*) whose writer is gone: its writer.json names this
 * boot of this host and this pid namespace, and no process has its pid (killed while saving). Each
 * removal is logged with its size; *n_removed and *bytes_removed (either may be NULL) give the totals.
 * A live pid (even a reused one), another host or container, or no writer.json (a zt before this
 * one) keeps the directory: zt_ckpt_latest reports it. Fails only when root cannot be listed. */
zt_status zt_ckpt_remove_stale_staging(const char *root, int64_t *n_removed, uint64_t *bytes_removed,
                                       zt_error *err);

/* Step 2 (each rank). */
typedef struct zt_ckpt_rank_writer zt_ckpt_rank_writer;

zt_status zt_ckpt_rank_writer_open(const char *staging_dir, int32_t rank,
                                   zt_ckpt_rank_writer **out, zt_error *err);
/* Elements [elem_offset, elem_offset + count) of logical tensor (name, group), fp32. */
zt_status zt_ckpt_rank_writer_add_shard(zt_ckpt_rank_writer *w, const char *name,
                                        const char *group, int64_t elem_offset, int64_t count,
                                        const float *data, zt_error *err);
/* This rank's slice [offset, offset + count) of unit `unit`'s padded flat buffer (what a ZeRO
 * plugin's shard_range/read_shard give): split into pieces of the logical tensors it overlaps;
 * padding is not stored. Tied parameters have no storage of their own and are skipped. */
zt_status zt_ckpt_rank_writer_add_unit_shard(zt_ckpt_rank_writer *w, const zt_layout *layout,
                                             int32_t unit, const char *group, int64_t offset,
                                             int64_t count, const float *data, zt_error *err);
zt_status zt_ckpt_rank_writer_add_blob(zt_ckpt_rank_writer *w, const char *name,
                                       const void *data, size_t size, zt_error *err);
/* Sync and close the data file; *out receives its description (the writer is freed either way). */
zt_status zt_ckpt_rank_writer_finish(zt_ckpt_rank_writer *w, zt_ckpt_rank_result *out,
                                     zt_error *err);
/* Give up: close and delete this rank's data file. */
void zt_ckpt_rank_writer_abort(zt_ckpt_rank_writer *w);

/* Step 3 (rank 0). */
typedef struct zt_ckpt_commit_args {
    const char *root;
    const char *staging_dir;          /* from zt_ckpt_stage */
    int64_t step;
    const char *config_json;          /* the run's resolved config: a JSON object (NULL: {}) */
    zt_ckpt_model_shape model;
    zt_ckpt_layout layout;
    const zt_ckpt_tensor_decl *tensors;
    size_t n_tensors;
    const zt_ckpt_rank_result *ranks; /* every writing rank's result */
    size_t n_ranks;
    int32_t keep_last;                /* keep this many newest checkpoints; 0: keep all */
} zt_ckpt_commit_args;

/* Validate coverage (every element of every declared tensor written by exactly one rank; nothing
 * undeclared), write checkpoint.json, publish the directory as ROOT/step-NNNNNN and update
 * ROOT/latest; then prune. On failure the staging directory is left for the caller to discard.
 * *final_dir (malloc'd, may be NULL) receives the published path. */
zt_status zt_ckpt_commit(const zt_ckpt_commit_args *a, char **final_dir, zt_error *err);

/* ---- finding checkpoints --------------------------------------------------------------------- */

typedef struct zt_ckpt_entry {
    int64_t step;
    char *path;
} zt_ckpt_entry;

typedef struct zt_ckpt_list {
    zt_ckpt_entry *complete; /* step-NNNNNN directories with a checkpoint.json, by step */
    size_t n_complete;
    char **incomplete;       /* *.tmp-* directories, and step directories lacking checkpoint.json */
    size_t n_incomplete;
} zt_ckpt_list;

/* List root's checkpoints (a missing root is an empty list). */
zt_status zt_ckpt_list_dir(const char *root, zt_ckpt_list *out, zt_error *err);
void zt_ckpt_list_free(zt_ckpt_list *l);

/* The checkpoint to resume from: the one ROOT/latest names, or, without a latest file, the newest
 * complete one (with a warning). Incomplete directories are reported as warnings and never chosen.
 * ZT_ERR_NOT_FOUND when there is none. *step_dir is malloc'd. */
zt_status zt_ckpt_latest(const char *root, char **step_dir, zt_error *err);

/* ---- reading --------------------------------------------------------------------------------- */

typedef struct zt_ckpt_tensor_info {
    const char *name;
    const char *group;
    int32_t ndim;
    int64_t shape[ZT_CKPT_MAX_DIMS];
    int64_t numel;
} zt_ckpt_tensor_info;

typedef struct zt_ckpt zt_ckpt;

/* Open a step directory: checkpoint.json is validated in full (format version, every file present
 * with its recorded size, every shard inside its file, every tensor covered exactly once). Data
 * checksums are verified when a shard or blob is first read (and by zt_ckpt_verify). */
zt_status zt_ckpt_open(const char *step_dir, zt_ckpt **out, zt_error *err);
void zt_ckpt_close(zt_ckpt *c);

int64_t zt_ckpt_step(const zt_ckpt *c);
const char *zt_ckpt_zt_version(const zt_ckpt *c);
const char *zt_ckpt_config_json(const zt_ckpt *c); /* the resolved config's JSON text */
const zt_ckpt_model_shape *zt_ckpt_model(const zt_ckpt *c);
const zt_ckpt_layout *zt_ckpt_written_layout(const zt_ckpt *c);
size_t zt_ckpt_tensor_count(const zt_ckpt *c);
const zt_ckpt_tensor_info *zt_ckpt_tensor_at(const zt_ckpt *c, size_t i);
const zt_ckpt_tensor_info *zt_ckpt_find(const zt_ckpt *c, const char *name, const char *group);

/* Elements [elem_offset, elem_offset + count) of logical tensor (name, group) into dst, from
 * whichever shards hold them. This is how a run with another rank count or stage reads its part. */
zt_status zt_ckpt_read(zt_ckpt *c, const char *name, const char *group, int64_t elem_offset,
                       int64_t count, float *dst, zt_error *err);
/* The inverse of zt_ckpt_rank_writer_add_unit_shard for THIS run's layout: fill dst with slice
 * [offset, offset + count) of unit `unit`'s padded flat buffer of `group`; padding reads as 0. */
zt_status zt_ckpt_read_unit_shard(zt_ckpt *c, const zt_layout *layout, int32_t unit,
                                  const char *group, int64_t offset, int64_t count, float *dst,
                                  zt_error *err);
/* A blob's bytes (valid until zt_ckpt_close), checksum verified. */
zt_status zt_ckpt_blob(zt_ckpt *c, const char *name, const void **data, size_t *size,
                       zt_error *err);

/* Does the checkpoint fit this run's model? Compares the model shape (naming each difference:
 * "checkpoint has hidden_size 512, this run's model has 768"), then requires, for each group in
 * groups[0..n_groups), every parameter of the model with its shape and no tensor the model lacks. */
zt_status zt_ckpt_check_model(const zt_ckpt *c, const zt_model_info *info,
                              const char *const *groups, size_t n_groups, zt_error *err);
/* The same, requiring only the parameters p with needed[p] nonzero (a trainable-only checkpoint:
 * the trainable ones); the checkpoint may still hold no tensor the model lacks. */
zt_status zt_ckpt_check_model_params(const zt_ckpt *c, const zt_model_info *info, const char *const *groups,
                                     size_t n_groups, const uint8_t *needed, zt_error *err);

/* Verify every checksum now (zt-run --verify-checkpoint, tests). */
zt_status zt_ckpt_verify(zt_ckpt *c, zt_error *err);

#endif
