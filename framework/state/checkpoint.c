/* zt checkpoints: what the writer (checkpoint_write.c) and the reader (checkpoint_read.c) share:
 * the coverage rule both enforce, tensor keys, and the mapping between a unit's padded flat buffer
 * and the logical tensors it holds (checkpoint.h, docs/checkpoint-format.md). checkpoint_find.c
 * lists a root's checkpoints and finds the one to resume from. */
#define _GNU_SOURCE /* asprintf */

#include "state/checkpoint_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *ckpt_join(const char *dir, const char *name)
{
    char *p = NULL;
    return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

int64_t ckpt_decl_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

void zt_ckpt_model_shape_from_info(const zt_model_info *info, zt_ckpt_model_shape *out)
{
    *out = (zt_ckpt_model_shape){info->n_layers,  info->vocab_size, info->hidden_size,
                                 info->n_heads,   info->n_kv_heads, info->head_dim,
                                 info->intermediate_size};
}

/* ---- coverage: the one rule both writer and reader enforce ----------------------------------- */

static int compare_spans(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->count < y->count ? -1 : x->count > y->count;
}

zt_status ckpt_check_coverage(const char *where, const char *name, const char *group, int64_t numel,
                              span *spans, size_t n, zt_error *err)
{
    qsort(spans, n, sizeof *spans, compare_spans);
    int64_t covered = 0;
    for (size_t i = 0; i < n; i++) {
        if (spans[i].offset > covered) break;
        if (spans[i].offset < covered) {
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: tensor '%s' (group %s): elements [%" PRId64 ", %" PRId64
                                ") are stored twice, by rank %d and by rank %d; each element must "
                                "be saved by exactly one rank",
                                where, name, group, spans[i].offset,
                                covered < spans[i].offset + spans[i].count
                                    ? covered : spans[i].offset + spans[i].count,
                                spans[i - 1].rank, spans[i].rank);
        }
        covered = spans[i].offset + spans[i].count;
    }
    if (covered != numel) {
        int64_t gap_end = numel;
        for (size_t i = 0; i < n; i++) {
            if (spans[i].offset > covered) {
                gap_end = spans[i].offset;
                break;
            }
        }
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor '%s' (group %s): elements [%" PRId64 ", %" PRId64
                            ") of %" PRId64 " were saved by no rank; a checkpoint must hold every "
                            "element (under ZeRO-3 each rank saves its own shard, never an "
                            "empty gathered copy)",
                            where, name, group, covered, gap_end, numel);
    }
    return ZT_OK;
}

/* ---- tensor keys ----------------------------------------------------------------------------- */

int ckpt_compare_key(const char *group_a, const char *name_a, const char *group_b,
                     const char *name_b)
{
    int c = strcmp(group_a, group_b);
    return c ? c : strcmp(name_a, name_b);
}

/* ---- unit shards: a unit's padded flat buffer against its logical tensors ---------------------- */

zt_status ckpt_check_unit_range(const zt_layout *layout, int32_t unit, int64_t offset,
                                int64_t count, zt_error *err)
{
    if (unit < 0 || unit >= layout->n_units) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "checkpoint: unit %d outside 0..%d", unit,
                            layout->n_units - 1);
    }
    const zt_unit_layout *u = &layout->units[unit];
    if (offset < 0 || count < 0 || offset > u->padded_numel || count > u->padded_numel - offset) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "checkpoint: slice [%" PRId64 ", %" PRId64 ") of unit %d, whose padded "
                            "buffer has %" PRId64 " elements",
                            offset, offset + count, unit, u->padded_numel);
    }
    return ZT_OK;
}

int ckpt_next_overlap(const zt_layout *layout, int32_t unit, int p, int64_t offset, int64_t count,
                      int64_t *param_start, int64_t *length, int64_t *flat_start)
{
    const zt_unit_layout *u = &layout->units[unit];
    for (; p < u->first_param + u->n_params; p++) {
        const zt_param_decl *d = &layout->model->params[p];
        if (d->flags & ZT_PARAM_TIED) continue;
        int64_t begin = layout->param_offset[p], end = begin + ckpt_decl_numel(d->ndim, d->shape);
        int64_t lo = offset > begin ? offset : begin, hi = offset + count < end ? offset + count : end;
        if (lo >= hi) continue;
        *param_start = lo - begin;
        *length = hi - lo;
        *flat_start = lo;
        return p;
    }
    return -1;
}
