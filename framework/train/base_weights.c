/* The hash of a run's frozen base weights (checkpoint.only_trainable, docs/checkpoint-format.md). A
 * checkpoint that leaves the frozen weights out records it, and a resume that reads them again from
 * --model BASE checks that they are the same values, bit for bit, before it trains on them.
 *
 * FNV-1a 64 (base/checksum.h) over every frozen parameter with storage, in the model's declaration
 * order: its name, a zero byte, then its fp32 values as loaded (little-endian). It depends on the
 * values and the frozen set only, never on the rank count, ZeRO stage or the dtype of the files. */
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "base/log.h"
#include "state/checkpoint.h"
#include "state/hf_model.h"
#include "train/trainer_internal.h"

#define HASH_CHUNK (1 << 20) /* elements read at a time */

typedef zt_status (*tensor_reader)(void *ctx, const zt_param_decl *p, int64_t offset, int64_t count, float *dst,
                                   zt_error *err);

int tr_is_frozen_with_storage(const trainer *t, int32_t param)
{
    return t->layout->param_offset[param] >= 0 && !t->layout->trainable[param];
}

static zt_status hash_frozen(trainer *t, tensor_reader read, void *ctx, uint64_t *out, zt_error *err)
{
    int64_t biggest = 0;
    for (int32_t i = 0; i < t->info->n_params_decl; i++)
        if (tr_is_frozen_with_storage(t, i) && t->layout->numel[i] > biggest) biggest = t->layout->numel[i];
    float *buf = malloc((size_t)(biggest < HASH_CHUNK ? (biggest ? biggest : 1) : HASH_CHUNK) * sizeof *buf);
    if (!buf) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory hashing the base weights");
    uint64_t h = ZT_FNV1A64_INIT;
    zt_status st = ZT_OK;
    for (int32_t i = 0; i < t->info->n_params_decl && st == ZT_OK; i++) {
        if (!tr_is_frozen_with_storage(t, i)) continue;
        const zt_param_decl *p = &t->info->params[i];
        h = zt_fnv1a64(h, p->name, strlen(p->name) + 1);
        for (int64_t at = 0; at < t->layout->numel[i] && st == ZT_OK; at += HASH_CHUNK) {
            int64_t n = t->layout->numel[i] - at < HASH_CHUNK ? t->layout->numel[i] - at : HASH_CHUNK;
            st = read(ctx, p, at, n, buf, err);
            if (st == ZT_OK) h = zt_fnv1a64(h, buf, (size_t)n * sizeof *buf);
        }
    }
    free(buf);
    *out = h;
    return st;
}

static zt_status read_hf(void *ctx, const zt_param_decl *p, int64_t offset, int64_t count, float *dst, zt_error *err)
{
    return zt_hf_model_read(ctx, p->name, p->ndim, p->shape, (uint64_t)offset, (uint64_t)count, dst, err);
}

static zt_status read_ckpt(void *ctx, const zt_param_decl *p, int64_t offset, int64_t count, float *dst,
                           zt_error *err)
{
    return zt_ckpt_read(ctx, p->name, ZT_CKPT_GROUP_PARAM, offset, count, dst, err);
}

zt_status tr_base_hash_hf(trainer *t, zt_hf_model *model, uint64_t *out, zt_error *err)
{
    return hash_frozen(t, read_hf, model, out, err);
}

zt_status tr_base_hash_checkpoint(trainer *t, zt_ckpt *c, uint64_t *out, zt_error *err)
{
    return hash_frozen(t, read_ckpt, c, out, err);
}

/* A checkpoint without frozen weights can only be resumed from with the base they came from. */
zt_status tr_check_checkpoint_settings(const trainer *t, zt_error *err)
{
    if (!t->set->checkpoint_only_trainable || t->req->model_dir || t->req->resume) return ZT_OK;
    return zt_error_set(err, ZT_ERR_CONFIG,
                        "checkpoint.only_trainable is true but the run has no --model: its checkpoints leave the "
                        "frozen weights out, and a resume reads them again from the base model. Start from a "
                        "base with --model BASE, or set checkpoint.only_trainable=false");
}
