/* zt checkpoints: per-rank data files of logical-tensor shards, checkpoint.json, atomic publish,
 * latest pointer, pruning, and resharding reads (checkpoint.h, docs/checkpoint-format.md). */
#define _GNU_SOURCE /* renameat2, asprintf, open_memstream, mkdtemp */

#include "state/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/json.h"
#include "base/log.h"
#include "state/safetensors.h" /* atomic files */

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint data files are little-endian fp32; zt needs a little-endian host"
#endif

#define CKPT_FORMAT_NAME "zt-checkpoint"
#define CKPT_INDEX "checkpoint.json"
#define CKPT_LATEST "latest"
#define CKPT_TMP_MARK ".tmp-"
/* Each piece starts at a multiple of this in its data file, so a reader can map fp32 in place. */
#define CKPT_ALIGN 64u

static char *join(const char *dir, const char *name)
{
    char *p = NULL;
    return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

static int64_t decl_numel(int ndim, const int64_t *shape)
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

typedef struct span {
    int64_t offset, count;
    int32_t rank;
    size_t source; /* index of the piece or shard it came from */
} span;

static int compare_spans(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->count < y->count ? -1 : x->count > y->count;
}

/* Sort spans and check that they tile [0, numel): no element missing, none stored twice. */
static zt_status check_coverage(const char *where, const char *name, const char *group,
                                int64_t numel, span *spans, size_t n, zt_error *err)
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

/* ---- staging --------------------------------------------------------------------------------- */

static zt_status make_dir(const char *path, zt_error *err)
{
    if (mkdir(path, 0777) == 0 || errno == EEXIST) return ZT_OK;
    if (errno == ENOENT) { /* create the parents, then retry */
        char *parent = strdup(path);
        char *slash = parent ? strrchr(parent, '/') : NULL;
        if (slash && slash != parent) {
            *slash = '\0';
            zt_status st = make_dir(parent, err);
            free(parent);
            if (st != ZT_OK) return st;
            if (mkdir(path, 0777) == 0 || errno == EEXIST) return ZT_OK;
        } else {
            free(parent);
        }
    }
    return zt_error_set(err, ZT_ERR_IO, "cannot create directory '%s': %s", path, strerror(errno));
}

zt_status zt_ckpt_stage(const char *root, int64_t step, char **staging_dir, zt_error *err)
{
    *staging_dir = NULL;
    if (step < 0) return zt_error_set(err, ZT_ERR_INVALID_ARG, "checkpoint step %" PRId64 " < 0", step);
    zt_status st = make_dir(root, err);
    if (st != ZT_OK) return st;
    char *path = NULL;
    if (asprintf(&path, "%s/step-%06" PRId64 CKPT_TMP_MARK "%ld-XXXXXX", root, step,
                 (long)getpid()) < 0) {
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory staging a checkpoint");
    }
    if (!mkdtemp(path)) {
        st = zt_error_set(err, ZT_ERR_IO, "cannot create checkpoint staging directory '%s': %s",
                          path, strerror(errno));
        free(path);
        return st;
    }
    /* mkdtemp makes it 0700; the published checkpoint gets the permissions of any new directory. */
    mode_t mask = umask(0);
    umask(mask);
    chmod(path, 0777 & ~mask);
    *staging_dir = path;
    return ZT_OK;
}

/* Remove the regular files of dir, checkpoint.json first (so an interrupted removal never leaves a
 * directory that looks complete), then dir itself. 0 on success. */
static int remove_checkpoint_dir(const char *dir)
{
    char *index = join(dir, CKPT_INDEX);
    if (index) unlink(index);
    free(index);
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char *p = join(dir, e->d_name);
        struct stat sb;
        if (p && lstat(p, &sb) == 0 && S_ISREG(sb.st_mode)) unlink(p);
        free(p);
    }
    closedir(d);
    return rmdir(dir);
}

void zt_ckpt_discard_stage(const char *staging_dir)
{
    if (staging_dir) remove_checkpoint_dir(staging_dir);
}

/* ---- rank writer ----------------------------------------------------------------------------- */

struct zt_ckpt_rank_writer {
    char *path;
    int fd;
    int32_t rank;
    uint64_t size;
    zt_ckpt_piece *pieces;
    size_t n_pieces, cap;
};

void zt_ckpt_rank_result_free(zt_ckpt_rank_result *r)
{
    free(r->pieces);
    r->pieces = NULL;
    r->n_pieces = 0;
}

zt_status zt_ckpt_rank_writer_open(const char *staging_dir, int32_t rank,
                                   zt_ckpt_rank_writer **out, zt_error *err)
{
    *out = NULL;
    if (rank < 0 || rank > 99999) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "checkpoint rank %d is outside 0..99999", rank);
    }
    zt_ckpt_rank_writer *w = calloc(1, sizeof *w);
    if (!w || asprintf(&w->path, "%s/rank-%05d.bin", staging_dir, rank) < 0) {
        free(w);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing a checkpoint");
    }
    w->rank = rank;
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (w->fd < 0) {
        zt_status st = zt_error_set(err, ZT_ERR_IO, "cannot create checkpoint file '%s': %s%s",
                                    w->path, strerror(errno),
                                    errno == EEXIST ? " (two writers for the same rank?)" : "");
        free(w->path);
        free(w);
        return st;
    }
    *out = w;
    return ZT_OK;
}

static zt_status write_all(zt_ckpt_rank_writer *w, const void *data, size_t n, zt_error *err)
{
    const char *p = data;
    while (n > 0) {
        ssize_t k = write(w->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            return zt_error_set(err, ZT_ERR_IO, "cannot write checkpoint file '%s': %s (is the disk "
                                "full?)", w->path, strerror(errno));
        }
        p += k;
        n -= (size_t)k;
        w->size += (uint64_t)k;
    }
    return ZT_OK;
}

static zt_status add_piece(zt_ckpt_rank_writer *w, int kind, const char *name, const char *group,
                           int64_t elem_offset, int64_t count, const void *data, size_t bytes,
                           zt_error *err)
{
    if (!name || !name[0] || strlen(name) >= ZT_CKPT_NAME_MAX) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "checkpoint: a name must have 1 to %d bytes ('%.40s...')",
                            ZT_CKPT_NAME_MAX - 1, name ? name : "");
    }
    if (kind == ZT_CKPT_SHARD && (!group || !group[0] || strlen(group) >= ZT_CKPT_GROUP_MAX)) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "checkpoint: tensor '%s' needs a group name of 1 to %d bytes", name,
                            ZT_CKPT_GROUP_MAX - 1);
    }
    if (w->n_pieces == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        zt_ckpt_piece *bigger = realloc(w->pieces, cap * sizeof *bigger);
        if (!bigger) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing a checkpoint");
        w->pieces = bigger;
        w->cap = cap;
    }
    static const uint8_t zeros[CKPT_ALIGN];
    zt_status st = write_all(w, zeros, (CKPT_ALIGN - w->size % CKPT_ALIGN) % CKPT_ALIGN, err);
    if (st != ZT_OK) return st;
    zt_ckpt_piece *p = &w->pieces[w->n_pieces];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->rank = w->rank;
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->group, sizeof p->group, "%s", kind == ZT_CKPT_SHARD ? group : "");
    p->elem_offset = elem_offset;
    p->count = count;
    p->byte_offset = w->size;
    p->byte_size = bytes;
    p->checksum = zt_fnv1a64(ZT_FNV1A64_INIT, data, bytes);
    st = write_all(w, data, bytes, err);
    if (st == ZT_OK) w->n_pieces++;
    return st;
}

zt_status zt_ckpt_rank_writer_add_shard(zt_ckpt_rank_writer *w, const char *name,
                                        const char *group, int64_t elem_offset, int64_t count,
                                        const float *data, zt_error *err)
{
    if (elem_offset < 0 || count < 0) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "checkpoint: shard of '%s' with offset %" PRId64 " and count %" PRId64,
                            name, elem_offset, count);
    }
    if (count == 0) return ZT_OK; /* nothing to store: e.g. a rank whose slice is all padding */
    return add_piece(w, ZT_CKPT_SHARD, name, group, elem_offset, count, data,
                     (size_t)count * sizeof(float), err);
}

zt_status zt_ckpt_rank_writer_add_blob(zt_ckpt_rank_writer *w, const char *name,
                                       const void *data, size_t size, zt_error *err)
{
    return add_piece(w, ZT_CKPT_BLOB, name, NULL, 0, (int64_t)size, data, size, err);
}

/* The range check shared by both directions of unit-shard conversion. */
static zt_status check_unit_range(const zt_layout *layout, int32_t unit, int64_t offset,
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

/* For each stored parameter of `unit` that overlaps flat range [offset, offset + count): its
 * index, the overlap's start within the parameter, and its length. Returns the next index to look
 * at, or -1 when there is none. */
static int next_overlap(const zt_layout *layout, int32_t unit, int p, int64_t offset, int64_t count,
                        int64_t *param_start, int64_t *length, int64_t *flat_start)
{
    const zt_unit_layout *u = &layout->units[unit];
    for (; p < u->first_param + u->n_params; p++) {
        const zt_param_decl *d = &layout->model->params[p];
        if (d->flags & ZT_PARAM_TIED) continue;
        int64_t begin = layout->param_offset[p], end = begin + decl_numel(d->ndim, d->shape);
        int64_t lo = offset > begin ? offset : begin, hi = offset + count < end ? offset + count : end;
        if (lo >= hi) continue;
        *param_start = lo - begin;
        *length = hi - lo;
        *flat_start = lo;
        return p;
    }
    return -1;
}

zt_status zt_ckpt_rank_writer_add_unit_shard(zt_ckpt_rank_writer *w, const zt_layout *layout,
                                             int32_t unit, const char *group, int64_t offset,
                                             int64_t count, const float *data, zt_error *err)
{
    zt_status st = check_unit_range(layout, unit, offset, count, err);
    int64_t param_start, length, flat_start;
    for (int p = layout->units[unit].first_param; st == ZT_OK; p++) {
        p = next_overlap(layout, unit, p, offset, count, &param_start, &length, &flat_start);
        if (p < 0) break;
        st = zt_ckpt_rank_writer_add_shard(w, layout->model->params[p].name, group, param_start,
                                           length, data + (flat_start - offset), err);
    }
    return st;
}

zt_status zt_ckpt_rank_writer_finish(zt_ckpt_rank_writer *w, zt_ckpt_rank_result *out,
                                     zt_error *err)
{
    memset(out, 0, sizeof *out);
    zt_status st = ZT_OK;
    if (fsync(w->fd) != 0) {
        st = zt_error_set(err, ZT_ERR_IO, "cannot sync checkpoint file '%s': %s", w->path,
                          strerror(errno));
    }
    if (close(w->fd) != 0 && st == ZT_OK) {
        st = zt_error_set(err, ZT_ERR_IO, "cannot write checkpoint file '%s': %s", w->path,
                          strerror(errno));
    }
    w->fd = -1;
    if (st != ZT_OK) {
        zt_ckpt_rank_writer_abort(w);
        return st;
    }
    out->rank = w->rank;
    out->file_size = w->size;
    out->pieces = w->pieces;
    out->n_pieces = w->n_pieces;
    free(w->path);
    free(w);
    return ZT_OK;
}

void zt_ckpt_rank_writer_abort(zt_ckpt_rank_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    unlink(w->path);
    free(w->path);
    free(w->pieces);
    free(w);
}

/* ---- commit ---------------------------------------------------------------------------------- */

/* Declared tensors, looked up by (group, name). */
typedef struct decl_index {
    const zt_ckpt_tensor_decl *decls;
    size_t *order; /* indices sorted by (group, name) */
    size_t n;
} decl_index;

static int compare_key(const char *group_a, const char *name_a, const char *group_b,
                       const char *name_b)
{
    int c = strcmp(group_a, group_b);
    return c ? c : strcmp(name_a, name_b);
}

static int compare_decl_order(const void *a, const void *b, void *decls)
{
    const zt_ckpt_tensor_decl *x = &((const zt_ckpt_tensor_decl *)decls)[*(const size_t *)a];
    const zt_ckpt_tensor_decl *y = &((const zt_ckpt_tensor_decl *)decls)[*(const size_t *)b];
    return compare_key(x->group, x->name, y->group, y->name);
}

/* Index of the declaration (name, group), or -1. */
static long decl_find(const decl_index *ix, const char *name, const char *group)
{
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const zt_ckpt_tensor_decl *d = &ix->decls[ix->order[mid]];
        int c = compare_key(group, name, d->group, d->name);
        if (c == 0) return (long)ix->order[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return -1;
}

static zt_status build_decl_index(const zt_ckpt_commit_args *a, decl_index *ix, zt_error *err)
{
    ix->decls = a->tensors;
    ix->n = a->n_tensors;
    ix->order = malloc((a->n_tensors ? a->n_tensors : 1) * sizeof *ix->order);
    if (!ix->order) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving a checkpoint");
    for (size_t i = 0; i < a->n_tensors; i++) {
        const zt_ckpt_tensor_decl *d = &a->tensors[i];
        ix->order[i] = i;
        if (!d->name || !d->name[0] || strlen(d->name) >= ZT_CKPT_NAME_MAX || !d->group ||
            !d->group[0] || strlen(d->group) >= ZT_CKPT_GROUP_MAX || d->ndim < 0 ||
            d->ndim > ZT_CKPT_MAX_DIMS) {
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "checkpoint: declared tensor %zu ('%s', group '%s', %d dims) is "
                                "invalid",
                                i, d->name ? d->name : "", d->group ? d->group : "", d->ndim);
        }
        for (int k = 0; k < d->ndim; k++) {
            if (d->shape[k] < 0) {
                return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                    "checkpoint: tensor '%s' has a negative dimension", d->name);
            }
        }
    }
    qsort_r(ix->order, ix->n, sizeof *ix->order, compare_decl_order, (void *)a->tensors);
    for (size_t i = 1; i < ix->n; i++) {
        const zt_ckpt_tensor_decl *x = &a->tensors[ix->order[i - 1]], *y = &a->tensors[ix->order[i]];
        if (compare_key(x->group, x->name, y->group, y->name) == 0) {
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "checkpoint: tensor '%s' (group %s) is declared twice", x->name,
                                x->group);
        }
    }
    return ZT_OK;
}

/* Every piece is declared and inside its file; the shards of every tensor tile it. spans_of[t]
 * receives tensor t's spans (sorted); span.source indexes `all` (the flattened pieces). */
typedef struct commit_plan {
    const zt_ckpt_piece **all;
    size_t n_all;
    span **spans_of;
    size_t *n_spans_of;
} commit_plan;

static void plan_free(commit_plan *p, size_t n_tensors)
{
    for (size_t t = 0; p->spans_of && t < n_tensors; t++) free(p->spans_of[t]);
    free(p->spans_of);
    free(p->n_spans_of);
    free(p->all);
}

static zt_status plan_commit(const zt_ckpt_commit_args *a, const decl_index *ix, commit_plan *plan,
                             zt_error *err)
{
    memset(plan, 0, sizeof *plan);
    size_t total = 0;
    for (size_t r = 0; r < a->n_ranks; r++) total += a->ranks[r].n_pieces;
    plan->all = malloc((total ? total : 1) * sizeof *plan->all);
    plan->spans_of = calloc(a->n_tensors ? a->n_tensors : 1, sizeof *plan->spans_of);
    plan->n_spans_of = calloc(a->n_tensors ? a->n_tensors : 1, sizeof *plan->n_spans_of);
    long *tensor_of = malloc((total ? total : 1) * sizeof *tensor_of);
    if (!plan->all || !plan->spans_of || !plan->n_spans_of || !tensor_of) {
        free(tensor_of);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving a checkpoint");
    }
    zt_status st = ZT_OK;
    for (size_t r = 0; r < a->n_ranks && st == ZT_OK; r++) {
        const zt_ckpt_rank_result *rr = &a->ranks[r];
        for (size_t r2 = 0; r2 < r; r2++) {
            if (a->ranks[r2].rank == rr->rank) {
                st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                                  "checkpoint: rank %d's result is given twice", rr->rank);
            }
        }
        for (size_t i = 0; i < rr->n_pieces && st == ZT_OK; i++) {
            const zt_ckpt_piece *p = &rr->pieces[i];
            long t = -1;
            if (p->rank != rr->rank || p->byte_offset > rr->file_size ||
                p->byte_size > rr->file_size - p->byte_offset) {
                st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                                  "checkpoint: piece '%s' of rank %d does not lie in rank %d's "
                                  "file (%" PRIu64 " bytes)",
                                  p->name, p->rank, rr->rank, rr->file_size);
            } else if (p->kind == ZT_CKPT_SHARD) {
                t = decl_find(ix, p->name, p->group);
                if (t < 0) {
                    st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                                      "checkpoint: rank %d wrote a shard of '%s' (group %s), which "
                                      "is not among the declared tensors",
                                      p->rank, p->name, p->group);
                } else {
                    const zt_ckpt_tensor_decl *d = &a->tensors[t];
                    int64_t numel = decl_numel(d->ndim, d->shape);
                    if (p->elem_offset < 0 || p->count <= 0 || p->elem_offset > numel ||
                        p->count > numel - p->elem_offset ||
                        p->byte_size != (uint64_t)p->count * sizeof(float)) {
                        st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                                          "checkpoint: rank %d's shard of '%s' (group %s) covers "
                                          "elements [%" PRId64 ", %" PRId64 "), outside the "
                                          "tensor's %" PRId64,
                                          p->rank, p->name, p->group, p->elem_offset,
                                          p->elem_offset + p->count, numel);
                    }
                }
            } else if (p->kind == ZT_CKPT_BLOB) {
                for (size_t k = 0; k < plan->n_all && st == ZT_OK; k++) {
                    if (plan->all[k]->kind == ZT_CKPT_BLOB && !strcmp(plan->all[k]->name, p->name)) {
                        st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                                          "checkpoint: blob '%s' is written by rank %d and rank "
                                          "%d; blob names must be unique",
                                          p->name, plan->all[k]->rank, p->rank);
                    }
                }
            } else {
                st = zt_error_set(err, ZT_ERR_INVALID_ARG, "checkpoint: piece '%s' has kind %d",
                                  p->name, p->kind);
            }
            tensor_of[plan->n_all] = t;
            plan->all[plan->n_all++] = p;
        }
    }
    for (size_t i = 0; i < plan->n_all && st == ZT_OK; i++) {
        if (tensor_of[i] >= 0) plan->n_spans_of[tensor_of[i]]++;
    }
    for (size_t t = 0; t < a->n_tensors && st == ZT_OK; t++) {
        plan->spans_of[t] = malloc((plan->n_spans_of[t] ? plan->n_spans_of[t] : 1) * sizeof(span));
        if (!plan->spans_of[t]) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
        plan->n_spans_of[t] = 0;
    }
    for (size_t i = 0; i < plan->n_all && st == ZT_OK; i++) {
        long t = tensor_of[i];
        if (t < 0) continue;
        const zt_ckpt_piece *p = plan->all[i];
        plan->spans_of[t][plan->n_spans_of[t]++] = (span){p->elem_offset, p->count, p->rank, i};
    }
    for (size_t t = 0; t < a->n_tensors && st == ZT_OK; t++) {
        const zt_ckpt_tensor_decl *d = &a->tensors[t];
        st = check_coverage("checkpoint not saved", d->name, d->group, decl_numel(d->ndim, d->shape),
                            plan->spans_of[t], plan->n_spans_of[t], err);
    }
    free(tensor_of);
    return st;
}

static void write_json_string(FILE *m, const char *s) { zt_json_write_string(m, s, strlen(s)); }

static zt_status write_index(const zt_ckpt_commit_args *a, const commit_plan *plan, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving a checkpoint");
    fprintf(m, "{\n  \"format\": \"%s\",\n  \"format_version\": %d,\n  \"zt_version\": ",
            CKPT_FORMAT_NAME, ZT_CKPT_FORMAT_VERSION);
    write_json_string(m, ZT_VERSION);
    fprintf(m, ",\n  \"step\": %" PRId64 ",\n", a->step);
    const zt_ckpt_layout *l = &a->layout;
    fprintf(m, "  \"written_layout\": {\"world_size\": %d, \"zero_stage\": %d, \"dp_size\": %d, "
               "\"tp_size\": %d, \"pp_size\": %d},\n",
            l->world_size, l->zero_stage, l->dp_size, l->tp_size, l->pp_size);
    const zt_ckpt_model_shape *s = &a->model;
    fprintf(m, "  \"model\": {\"n_layers\": %" PRId64 ", \"vocab_size\": %" PRId64
               ", \"hidden_size\": %" PRId64 ", \"n_heads\": %" PRId64 ", \"n_kv_heads\": %" PRId64
               ", \"head_dim\": %" PRId64 ", \"intermediate_size\": %" PRId64 "},\n",
            s->n_layers, s->vocab_size, s->hidden_size, s->n_heads, s->n_kv_heads, s->head_dim,
            s->intermediate_size);
    fputs("  \"files\": [", m);
    for (size_t r = 0; r < a->n_ranks; r++) {
        fprintf(m, "%s\n    {\"name\": \"rank-%05d.bin\", \"rank\": %d, \"size\": %" PRIu64 "}",
                r ? "," : "", a->ranks[r].rank, a->ranks[r].rank, a->ranks[r].file_size);
    }
    fputs("\n  ],\n  \"tensors\": [", m);
    for (size_t t = 0; t < a->n_tensors; t++) {
        const zt_ckpt_tensor_decl *d = &a->tensors[t];
        fputs(t ? ",\n    {\"name\": " : "\n    {\"name\": ", m);
        write_json_string(m, d->name);
        fputs(", \"group\": ", m);
        write_json_string(m, d->group);
        fputs(", \"dtype\": \"F32\", \"shape\": [", m);
        for (int k = 0; k < d->ndim; k++) fprintf(m, "%s%" PRId64, k ? ", " : "", d->shape[k]);
        fputs("],\n     \"shards\": [", m);
        for (size_t i = 0; i < plan->n_spans_of[t]; i++) {
            const zt_ckpt_piece *p = plan->all[plan->spans_of[t][i].source];
            fprintf(m, "%s\n       {\"rank\": %d, \"offset\": %" PRId64 ", \"count\": %" PRId64
                       ", \"file\": \"rank-%05d.bin\", \"byte_offset\": %" PRIu64
                       ", \"checksum\": \"%016" PRIx64 "\"}",
                    i ? "," : "", p->rank, p->elem_offset, p->count, p->rank, p->byte_offset,
                    p->checksum);
        }
        fputs("]}", m);
    }
    fputs("\n  ],\n  \"blobs\": [", m);
    int first = 1;
    for (size_t i = 0; i < plan->n_all; i++) {
        const zt_ckpt_piece *p = plan->all[i];
        if (p->kind != ZT_CKPT_BLOB) continue;
        fputs(first ? "\n    {\"name\": " : ",\n    {\"name\": ", m);
        write_json_string(m, p->name);
        fprintf(m, ", \"rank\": %d, \"file\": \"rank-%05d.bin\", \"byte_offset\": %" PRIu64
                   ", \"size\": %" PRIu64 ", \"checksum\": \"%016" PRIx64 "\"}",
                p->rank, p->rank, p->byte_offset, p->byte_size, p->checksum);
        first = 0;
    }
    fputs("\n  ],\n  \"config\": ", m);
    fputs(a->config_json ? a->config_json : "{}", m);
    fputs("\n}\n", m);
    if (fclose(m) != 0 || !text) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving a checkpoint");
    }
    char *path = join(a->staging_dir, CKPT_INDEX);
    zt_status st = path ? zt_atomic_write(path, text, len, err)
                        : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving a checkpoint");
    free(path);
    free(text);
    return st;
}

/* Move staging to final. An existing final (the same step saved again) is swapped out atomically
 * and then removed, so there is never a moment without a complete checkpoint of that step. */
static zt_status publish(const char *staging, const char *final, zt_error *err)
{
    if (rename(staging, final) == 0) return ZT_OK;
    if (errno != EEXIST && errno != ENOTEMPTY) {
        return zt_error_set(err, ZT_ERR_IO, "cannot rename '%s' to '%s': %s", staging, final,
                            strerror(errno));
    }
    if (renameat2(AT_FDCWD, staging, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
        return zt_error_set(err, ZT_ERR_IO,
                            "'%s' already exists and cannot be replaced atomically (%s): move it "
                            "away, or save under another step",
                            final, strerror(errno));
    }
    if (remove_checkpoint_dir(staging) != 0) {
        zt_log(ZT_LOG_WARN, "could not remove the replaced checkpoint, now at '%s'; delete it",
               staging);
    }
    return ZT_OK;
}

static void prune(const char *root, int32_t keep_last, const char *just_written)
{
    zt_ckpt_list list;
    zt_error err;
    if (keep_last <= 0 || zt_ckpt_list_dir(root, &list, &err) != ZT_OK) return;
    /* Newest first: keep the one just written plus the keep_last - 1 newest others. */
    int32_t kept = 1;
    for (size_t i = list.n_complete; i-- > 0;) {
        const char *path = list.complete[i].path;
        if (strcmp(path, just_written) == 0) continue;
        if (kept < keep_last) {
            kept++;
            continue;
        }
        if (remove_checkpoint_dir(path) == 0) {
            zt_log(ZT_LOG_INFO, "removed old checkpoint %s (keeping the newest %d)", path, keep_last);
        } else {
            zt_log(ZT_LOG_WARN, "could not remove old checkpoint %s: %s", path, strerror(errno));
        }
    }
    zt_ckpt_list_free(&list);
}

zt_status zt_ckpt_commit(const zt_ckpt_commit_args *a, char **final_dir, zt_error *err)
{
    if (final_dir) *final_dir = NULL;
    if (!a->root || !a->staging_dir || a->step < 0 || a->n_ranks == 0) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "checkpoint commit needs a root, a staging directory, a step >= 0 and "
                            "at least one rank's result");
    }
    if (a->config_json) {
        zt_json j;
        zt_status st = zt_json_parse(a->config_json, strlen(a->config_json), "resolved config", &j, err);
        int object = st == ZT_OK && j.tok[0].type == ZT_JSON_OBJECT;
        if (st == ZT_OK) zt_json_free(&j);
        if (!object) {
            return st != ZT_OK ? st
                               : zt_error_set(err, ZT_ERR_INVALID_ARG,
                                              "checkpoint: the resolved config is not a JSON object");
        }
    }
    decl_index ix = {0};
    commit_plan plan = {0};
    zt_status st = build_decl_index(a, &ix, err);
    if (st == ZT_OK) st = plan_commit(a, &ix, &plan, err);
    if (st == ZT_OK) st = write_index(a, &plan, err);
    plan_free(&plan, a->n_tensors);
    free(ix.order);
    if (st != ZT_OK) return st;

    char *final = NULL, *latest = NULL, *latest_text = NULL;
    if (asprintf(&final, "%s/step-%06" PRId64, a->root, a->step) < 0) final = NULL;
    latest = join(a->root, CKPT_LATEST);
    if (asprintf(&latest_text, "step-%06" PRId64 "\n", a->step) < 0) latest_text = NULL;
    if (!final || !latest || !latest_text) {
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving a checkpoint");
    }
    if (st == ZT_OK) st = zt_fsync_dir(a->staging_dir, err);
    if (st == ZT_OK) st = publish(a->staging_dir, final, err);
    if (st == ZT_OK) st = zt_fsync_dir(a->root, err);
    if (st == ZT_OK) st = zt_atomic_write(latest, latest_text, strlen(latest_text), err);
    if (st == ZT_OK) prune(a->root, a->keep_last, final);
    if (st == ZT_OK && final_dir) {
        *final_dir = final;
        final = NULL;
    }
    free(final);
    free(latest);
    free(latest_text);
    return st;
}

/* ---- finding checkpoints --------------------------------------------------------------------- */

void zt_ckpt_list_free(zt_ckpt_list *l)
{
    for (size_t i = 0; i < l->n_complete; i++) free(l->complete[i].path);
    for (size_t i = 0; i < l->n_incomplete; i++) free(l->incomplete[i]);
    free(l->complete);
    free(l->incomplete);
    memset(l, 0, sizeof *l);
}

/* "step-<digits>" exactly: its step; else -1. */
static int64_t step_of_name(const char *name)
{
    if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
    int64_t step = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || step > (INT64_MAX - 9) / 10) return -1;
        step = step * 10 + (*p - '0');
    }
    return step;
}

static int compare_entries_by_step(const void *a, const void *b)
{
    const zt_ckpt_entry *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step;
}

zt_status zt_ckpt_list_dir(const char *root, zt_ckpt_list *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return ZT_OK;
        return zt_error_set(err, ZT_ERR_IO, "cannot list checkpoint directory '%s': %s", root,
                            strerror(errno));
    }
    zt_status st = ZT_OK;
    size_t cap_complete = 0, cap_incomplete = 0;
    struct dirent *e;
    while (st == ZT_OK && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "step-", 5) != 0) continue;
        char *path = join(root, e->d_name);
        char *index = path ? join(path, CKPT_INDEX) : NULL;
        struct stat sb;
        if (!path || !index) {
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory listing '%s'", root);
        } else if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            /* not a checkpoint directory: not ours to judge */
        } else if (step_of_name(e->d_name) >= 0 && stat(index, &sb) == 0) {
            if (out->n_complete == cap_complete) {
                cap_complete = cap_complete ? 2 * cap_complete : 16;
                zt_ckpt_entry *bigger = realloc(out->complete, cap_complete * sizeof *bigger);
                if (!bigger) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
                else out->complete = bigger;
            }
            if (st == ZT_OK) {
                out->complete[out->n_complete++] = (zt_ckpt_entry){step_of_name(e->d_name), path};
                path = NULL;
            }
        } else {
            if (out->n_incomplete == cap_incomplete) {
                cap_incomplete = cap_incomplete ? 2 * cap_incomplete : 16;
                char **bigger = realloc(out->incomplete, cap_incomplete * sizeof *bigger);
                if (!bigger) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
                else out->incomplete = bigger;
            }
            if (st == ZT_OK) {
                out->incomplete[out->n_incomplete++] = path;
                path = NULL;
            }
        }
        free(path);
        free(index);
    }
    closedir(d);
    if (st != ZT_OK) {
        zt_ckpt_list_free(out);
        return st;
    }
    if (out->n_complete) {
        qsort(out->complete, out->n_complete, sizeof *out->complete, compare_entries_by_step);
    }
    return ZT_OK;
}

zt_status zt_ckpt_latest(const char *root, char **step_dir, zt_error *err)
{
    *step_dir = NULL;
    zt_ckpt_list list;
    zt_status st = zt_ckpt_list_dir(root, &list, err);
    if (st != ZT_OK) return st;
    for (size_t i = 0; i < list.n_incomplete; i++) {
        zt_log(ZT_LOG_WARN,
               "ignoring incomplete checkpoint directory %s (a save that did not finish, e.g. the "
               "run was killed while saving); delete it to reclaim the space",
               list.incomplete[i]);
    }
    char *latest_path = join(root, CKPT_LATEST), *text = NULL;
    size_t len = 0;
    st = latest_path ? zt_read_file(latest_path, &text, &len, err)
                     : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == ZT_ERR_NOT_FOUND) {
        if (list.n_complete == 0) {
            st = zt_error_set(err, ZT_ERR_NOT_FOUND, "no checkpoint in '%s'%s", root,
                              list.n_incomplete ? " (only incomplete saves, listed above)" : "");
        } else {
            const zt_ckpt_entry *newest = &list.complete[list.n_complete - 1];
            zt_log(ZT_LOG_WARN, "'%s' has no 'latest' file; using the newest complete checkpoint, %s",
                   root, newest->path);
            *step_dir = strdup(newest->path);
            st = *step_dir ? ZT_OK : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
        }
    } else if (st == ZT_OK) {
        while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
            text[--len] = '\0';
        int64_t step = step_of_name(text);
        char *path = step >= 0 ? join(root, text) : NULL;
        char *index = path ? join(path, CKPT_INDEX) : NULL;
        struct stat sb;
        if (step < 0) {
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s: expected the name of a checkpoint directory (step-NNNNNN), found "
                              "'%.80s'; fix or delete the file",
                              latest_path, text);
        } else if (!index || stat(index, &sb) != 0) {
            st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                              "%s names '%s', but %s/%s has no %s: it was deleted or moved; fix "
                              "'latest' or resume from an explicit checkpoint directory",
                              latest_path, text, root, text, CKPT_INDEX);
            for (size_t i = 0; i < list.n_complete; i++) {
                zt_error_append(err, "%s%s", i ? ", " : "\nComplete checkpoints there: ",
                                list.complete[i].path);
            }
        } else {
            *step_dir = path;
            path = NULL;
        }
        free(path);
        free(index);
    }
    free(text);
    free(latest_path);
    zt_ckpt_list_free(&list);
    return st;
}

/* ---- reading --------------------------------------------------------------------------------- */

typedef struct ckpt_file {
    char *name;
    int32_t rank;
    uint64_t size;
    uint8_t *map;
} ckpt_file;

typedef struct ckpt_shard {
    int64_t elem_offset, count;
    int32_t rank;
    int32_t verified;
    size_t file;
    uint64_t byte_offset;
    uint64_t checksum;
} ckpt_shard;

typedef struct ckpt_tensor {
    zt_ckpt_tensor_info info; /* name and group point into the two strings below */
    char *name, *group;
    ckpt_shard *shards;       /* sorted by elem_offset, tiling the tensor */
    size_t n_shards;
} ckpt_tensor;

typedef struct ckpt_blob {
    char *name;
    int32_t rank;
    int32_t verified;
    size_t file;
    uint64_t byte_offset, size, checksum;
} ckpt_blob;

struct zt_ckpt {
    char *dir;
    char *index_path;
    int64_t step;
    char *zt_version;
    char *config_json;
    zt_ckpt_model_shape model;
    zt_ckpt_layout layout;
    ckpt_file *files;
    size_t n_files;
    ckpt_tensor *tensors; /* in file order */
    size_t n_tensors;
    size_t *by_key;       /* tensor indices sorted by (group, name) */
    ckpt_blob *blobs;
    size_t n_blobs;
};

void zt_ckpt_close(zt_ckpt *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->n_files; i++) {
        if (c->files[i].map) munmap(c->files[i].map, c->files[i].size);
        free(c->files[i].name);
    }
    for (size_t i = 0; i < c->n_tensors; i++) {
        free(c->tensors[i].name);
        free(c->tensors[i].group);
        free(c->tensors[i].shards);
    }
    for (size_t i = 0; i < c->n_blobs; i++) free(c->blobs[i].name);
    free(c->files);
    free(c->tensors);
    free(c->by_key);
    free(c->blobs);
    free(c->config_json);
    free(c->zt_version);
    free(c->index_path);
    free(c->dir);
    free(c);
}

int64_t zt_ckpt_step(const zt_ckpt *c) { return c->step; }
const char *zt_ckpt_zt_version(const zt_ckpt *c) { return c->zt_version; }
const char *zt_ckpt_config_json(const zt_ckpt *c) { return c->config_json; }
const zt_ckpt_model_shape *zt_ckpt_model(const zt_ckpt *c) { return &c->model; }
const zt_ckpt_layout *zt_ckpt_written_layout(const zt_ckpt *c) { return &c->layout; }
size_t zt_ckpt_tensor_count(const zt_ckpt *c) { return c->n_tensors; }
const zt_ckpt_tensor_info *zt_ckpt_tensor_at(const zt_ckpt *c, size_t i) { return &c->tensors[i].info; }

static const ckpt_tensor *find_tensor(const zt_ckpt *c, const char *name, const char *group)
{
    size_t lo = 0, hi = c->n_tensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const ckpt_tensor *t = &c->tensors[c->by_key[mid]];
        int cmp = compare_key(group, name, t->group, t->name);
        if (cmp == 0) return t;
        if (cmp < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

const zt_ckpt_tensor_info *zt_ckpt_find(const zt_ckpt *c, const char *name, const char *group)
{
    const ckpt_tensor *t = find_tensor(c, name, group);
    return t ? &t->info : NULL;
}

/* checkpoint.json reading: every error names the file, line and column. */
typedef struct jreader {
    const zt_json *j;
    const char *origin;
    zt_error *err;
} jreader;

static zt_status jr_error(const jreader *r, int tok, const char *fmt, ...) ZT_PRINTF(3, 4);
static zt_status jr_error(const jreader *r, int tok, const char *fmt, ...)
{
    int line = 1, col = 1;
    if (tok >= 0) zt_json_line_col(r->j->text, (size_t)r->j->tok[tok].start, &line, &col);
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return zt_error_set(r->err, ZT_ERR_FORMAT,
                        "%s:%d:%d: %s; checkpoint.json is damaged (or was edited by hand)", r->origin,
                        line, col, what);
}

/* Required member `key` of object obj with JSON type `type`. */
static zt_status jr_member(const jreader *r, int obj, const char *key, int type, int *out)
{
    *out = zt_json_object_get(r->j, obj, key);
    if (*out < 0) return jr_error(r, obj, "\"%s\" is missing", key);
    if (r->j->tok[*out].type != type) {
        static const char *names[] = {"?", "an object", "an array", "a string", "a number"};
        return jr_error(r, *out, "\"%s\" must be %s", key, names[type]);
    }
    return ZT_OK;
}

/* An exact integer >= min (parsed from the text: offsets may exceed 2^53). */
static zt_status jr_int_tok(const jreader *r, int tok, const char *key, int64_t min, int64_t *out)
{
    const zt_json_tok *t = &r->j->tok[tok];
    const char *s = r->j->text + t->start;
    int n = t->end - t->start, i = 0, negative = 0;
    uint64_t v = 0;
    int ok = t->type == ZT_JSON_PRIMITIVE && n > 0;
    if (ok && s[0] == '-') negative = 1, i = 1;
    ok = ok && i < n;
    for (; ok && i < n; i++) {
        ok = s[i] >= '0' && s[i] <= '9' && v <= ((uint64_t)INT64_MAX - (uint64_t)(s[i] - '0')) / 10;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    int64_t value = negative ? -(int64_t)v : (int64_t)v;
    if (!ok || value < min) {
        return jr_error(r, tok, "\"%s\" must be an integer >= %" PRId64 ", found %.*s", key, min,
                        n > 40 ? 40 : n, s);
    }
    *out = value;
    return ZT_OK;
}

static zt_status jr_int(const jreader *r, int obj, const char *key, int64_t min, int64_t *out)
{
    int tok;
    zt_status st = jr_member(r, obj, key, ZT_JSON_PRIMITIVE, &tok);
    return st != ZT_OK ? st : jr_int_tok(r, tok, key, min, out);
}

static zt_status jr_int32(const jreader *r, int obj, const char *key, int64_t min, int32_t *out)
{
    int64_t v;
    zt_status st = jr_int(r, obj, key, min, &v);
    if (st == ZT_OK && v > INT32_MAX) return jr_error(r, obj, "\"%s\" is too large", key);
    if (st == ZT_OK) *out = (int32_t)v;
    return st;
}

static zt_status jr_string(const jreader *r, int obj, const char *key, char **out)
{
    int tok;
    zt_status st = jr_member(r, obj, key, ZT_JSON_STRING, &tok);
    return st != ZT_OK ? st : zt_json_string(r->j, tok, out, NULL, r->err);
}

static zt_status jr_checksum(const jreader *r, int obj, uint64_t *out)
{
    int tok;
    zt_status st = jr_member(r, obj, "checksum", ZT_JSON_STRING, &tok);
    if (st != ZT_OK) return st;
    const zt_json_tok *t = &r->j->tok[tok];
    uint64_t v = 0;
    int ok = t->end - t->start == 16;
    for (int i = t->start; ok && i < t->end; i++) {
        char ch = r->j->text[i];
        int digit = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        ok = digit >= 0;
        v = v << 4 | (uint64_t)(digit & 15);
    }
    if (!ok) return jr_error(r, tok, "\"checksum\" must be 16 lower-case hex digits");
    *out = v;
    return ZT_OK;
}

/* The file a shard or blob names: its index in c->files. */
static zt_status jr_file(const jreader *r, const zt_ckpt *c, int obj, size_t *out)
{
    char *name = NULL;
    zt_status st = jr_string(r, obj, "file", &name);
    if (st != ZT_OK) return st;
    for (*out = 0; *out < c->n_files && strcmp(c->files[*out].name, name) != 0; (*out)++) {}
    if (*out == c->n_files) {
        st = jr_error(r, zt_json_object_get(r->j, obj, "file"),
                      "file '%s' is not among the checkpoint's \"files\"", name);
    }
    free(name);
    return st;
}

static zt_status open_data_file(const jreader *r, zt_ckpt *c, int tok, ckpt_file *f)
{
    int64_t rank, size;
    zt_status st = jr_string(r, tok, "name", &f->name);
    if (st == ZT_OK) st = jr_int(r, tok, "rank", 0, &rank);
    if (st == ZT_OK) st = jr_int(r, tok, "size", 0, &size);
    if (st != ZT_OK) return st;
    if (!f->name[0] || strchr(f->name, '/') || f->name[0] == '.') {
        return jr_error(r, tok, "file name '%s' must be a plain name inside the checkpoint", f->name);
    }
    f->rank = (int32_t)rank;
    f->size = (uint64_t)size;
    char *path = join(c->dir, f->name);
    if (!path) return zt_error_set(r->err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0) {
        st = zt_error_set(r->err, errno == ENOENT ? ZT_ERR_NOT_FOUND : ZT_ERR_IO,
                          "checkpoint %s: data file %s (rank %d) is missing: %s; the checkpoint "
                          "was copied or moved incompletely: restore the file or resume from an "
                          "earlier checkpoint",
                          c->dir, f->name, f->rank, strerror(errno));
    } else if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != f->size) {
        uint64_t actual = (uint64_t)sb.st_size;
        st = zt_error_set(r->err, ZT_ERR_FORMAT,
                          "checkpoint %s: data file %s (rank %d) is %" PRIu64 " bytes, "
                          "checkpoint.json records %" PRIu64 ": %s; restore the file or resume "
                          "from an earlier checkpoint",
                          c->dir, f->name, f->rank, actual, f->size,
                          actual < f->size ? "the file is truncated (an interrupted copy, or a "
                                             "full disk)"
                                           : "the file was overwritten or appended to");
    } else if (f->size > 0) {
        void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            st = zt_error_set(r->err, ZT_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
        } else {
            f->map = map;
        }
    }
    if (fd >= 0) close(fd);
    free(path);
    return st;
}

static zt_status read_shard_entry(const jreader *r, zt_ckpt *c, const ckpt_tensor *t, int tok,
                                  ckpt_shard *s)
{
    int64_t rank, byte_offset;
    zt_status st = jr_int(r, tok, "rank", 0, &rank);
    if (st == ZT_OK) st = jr_int(r, tok, "offset", 0, &s->elem_offset);
    if (st == ZT_OK) st = jr_int(r, tok, "count", 1, &s->count);
    if (st == ZT_OK) st = jr_int(r, tok, "byte_offset", 0, &byte_offset);
    if (st == ZT_OK) st = jr_checksum(r, tok, &s->checksum);
    if (st == ZT_OK) st = jr_file(r, c, tok, &s->file);
    if (st != ZT_OK) return st;
    s->rank = (int32_t)rank;
    s->byte_offset = (uint64_t)byte_offset;
    const ckpt_file *f = &c->files[s->file];
    if (s->elem_offset > t->info.numel || s->count > t->info.numel - s->elem_offset) {
        return jr_error(r, tok, "a shard of '%s' covers elements [%" PRId64 ", %" PRId64
                        ") beyond the tensor's %" PRId64,
                        t->name, s->elem_offset, s->elem_offset + s->count, t->info.numel);
    }
    if ((uint64_t)s->count > (UINT64_MAX / sizeof(float)) ||
        s->byte_offset > f->size || (uint64_t)s->count * sizeof(float) > f->size - s->byte_offset ||
        s->byte_offset % CKPT_ALIGN != 0) {
        return jr_error(r, tok, "the shard of '%s' at byte %" PRIu64 " (%" PRId64 " elements) does "
                        "not lie inside %s (%" PRIu64 " bytes), or is misaligned",
                        t->name, s->byte_offset, s->count, f->name, f->size);
    }
    return ZT_OK;
}

static zt_status read_tensor_entry(const jreader *r, zt_ckpt *c, int tok, ckpt_tensor *t)
{
    int shape, shards;
    char *dtype = NULL;
    zt_status st = jr_string(r, tok, "name", &t->name);
    if (st == ZT_OK) st = jr_string(r, tok, "group", &t->group);
    if (st == ZT_OK) st = jr_string(r, tok, "dtype", &dtype);
    if (st == ZT_OK) st = jr_member(r, tok, "shape", ZT_JSON_ARRAY, &shape);
    if (st == ZT_OK) st = jr_member(r, tok, "shards", ZT_JSON_ARRAY, &shards);
    if (st == ZT_OK && strcmp(dtype, "F32") != 0) {
        st = jr_error(r, tok, "tensor '%s' has dtype '%s'; this zt reads F32 checkpoint tensors",
                      t->name, dtype);
    }
    free(dtype);
    if (st != ZT_OK) return st;
    t->info.name = t->name;
    t->info.group = t->group;
    t->info.ndim = r->j->tok[shape].size;
    if (t->info.ndim > ZT_CKPT_MAX_DIMS) {
        return jr_error(r, shape, "tensor '%s' has %d dimensions (at most %d)", t->name,
                        t->info.ndim, ZT_CKPT_MAX_DIMS);
    }
    t->info.numel = 1;
    int item = shape + 1;
    for (int d = 0; d < t->info.ndim; d++, item = zt_json_skip(r->j, item)) {
        st = jr_int_tok(r, item, "shape", 0, &t->info.shape[d]);
        if (st != ZT_OK) return st;
        if (__builtin_mul_overflow(t->info.numel, t->info.shape[d], &t->info.numel)) {
            return jr_error(r, shape, "tensor '%s': the shape's element count overflows", t->name);
        }
    }
    t->n_shards = (size_t)r->j->tok[shards].size;
    t->shards = calloc(t->n_shards ? t->n_shards : 1, sizeof *t->shards);
    span *spans = malloc((t->n_shards ? t->n_shards : 1) * sizeof *spans);
    if (!t->shards || !spans) {
        free(spans);
        return zt_error_set(r->err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading a checkpoint");
    }
    item = shards + 1;
    for (size_t i = 0; i < t->n_shards && st == ZT_OK; i++, item = zt_json_skip(r->j, item)) {
        if (r->j->tok[item].type != ZT_JSON_OBJECT) {
            st = jr_error(r, item, "each shard of '%s' must be an object", t->name);
            break;
        }
        st = read_shard_entry(r, c, t, item, &t->shards[i]);
        spans[i] = (span){t->shards[i].elem_offset, t->shards[i].count, t->shards[i].rank, i};
    }
    if (st == ZT_OK) {
        st = check_coverage(c->index_path, t->name, t->group, t->info.numel, spans, t->n_shards,
                            r->err);
    }
    if (st == ZT_OK) { /* keep the shards in offset order, as the spans now are */
        ckpt_shard *sorted = malloc((t->n_shards ? t->n_shards : 1) * sizeof *sorted);
        if (!sorted) st = zt_error_set(r->err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; sorted && i < t->n_shards; i++) sorted[i] = t->shards[spans[i].source];
        if (sorted) {
            free(t->shards);
            t->shards = sorted;
        }
    }
    free(spans);
    return st;
}

static zt_status read_blob_entry(const jreader *r, zt_ckpt *c, int tok, ckpt_blob *b)
{
    int64_t rank, byte_offset, size;
    zt_status st = jr_string(r, tok, "name", &b->name);
    if (st == ZT_OK) st = jr_int(r, tok, "rank", 0, &rank);
    if (st == ZT_OK) st = jr_int(r, tok, "byte_offset", 0, &byte_offset);
    if (st == ZT_OK) st = jr_int(r, tok, "size", 0, &size);
    if (st == ZT_OK) st = jr_checksum(r, tok, &b->checksum);
    if (st == ZT_OK) st = jr_file(r, c, tok, &b->file);
    if (st != ZT_OK) return st;
    b->rank = (int32_t)rank;
    b->byte_offset = (uint64_t)byte_offset;
    b->size = (uint64_t)size;
    const ckpt_file *f = &c->files[b->file];
    if (b->byte_offset > f->size || b->size > f->size - b->byte_offset) {
        return jr_error(r, tok, "blob '%s' (bytes [%" PRIu64 ", %" PRIu64 ")) does not lie inside "
                        "%s (%" PRIu64 " bytes)",
                        b->name, b->byte_offset, b->byte_offset + b->size, f->name, f->size);
    }
    return ZT_OK;
}

static int compare_tensor_keys(const void *a, const void *b, void *tensors)
{
    const ckpt_tensor *x = &((const ckpt_tensor *)tensors)[*(const size_t *)a];
    const ckpt_tensor *y = &((const ckpt_tensor *)tensors)[*(const size_t *)b];
    return compare_key(x->group, x->name, y->group, y->name);
}

static zt_status parse_index(zt_ckpt *c, const zt_json *j, zt_error *err)
{
    jreader r = {j, c->index_path, err};
    if (j->tok[0].type != ZT_JSON_OBJECT) return jr_error(&r, 0, "the top level must be an object");
    char *format = NULL;
    int64_t version = 0;
    zt_status st = jr_string(&r, 0, "format", &format);
    if (st == ZT_OK && strcmp(format, CKPT_FORMAT_NAME) != 0) {
        st = zt_error_set(err, ZT_ERR_FORMAT, "%s: format is '%s', not '%s': this is not a zt "
                          "checkpoint", c->index_path, format, CKPT_FORMAT_NAME);
    }
    free(format);
    if (st == ZT_OK) st = jr_int(&r, 0, "format_version", 1, &version);
    if (st == ZT_OK && version != ZT_CKPT_FORMAT_VERSION) {
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "%s: checkpoint format version %" PRId64 " is newer than this zt reads "
                            "(version %d): upgrade zt to resume from it",
                            c->index_path, version, ZT_CKPT_FORMAT_VERSION);
    }
    int layout = -1, model = -1, files = -1, tensors = -1, blobs = -1, config = -1; /* set by jr_member */
    if (st == ZT_OK) st = jr_string(&r, 0, "zt_version", &c->zt_version);
    if (st == ZT_OK) st = jr_int(&r, 0, "step", 0, &c->step);
    if (st == ZT_OK) st = jr_member(&r, 0, "written_layout", ZT_JSON_OBJECT, &layout);
    if (st == ZT_OK) st = jr_int32(&r, layout, "world_size", 1, &c->layout.world_size);
    if (st == ZT_OK) st = jr_int32(&r, layout, "zero_stage", 0, &c->layout.zero_stage);
    if (st == ZT_OK) st = jr_int32(&r, layout, "dp_size", 1, &c->layout.dp_size);
    if (st == ZT_OK) st = jr_int32(&r, layout, "tp_size", 1, &c->layout.tp_size);
    if (st == ZT_OK) st = jr_int32(&r, layout, "pp_size", 1, &c->layout.pp_size);
    if (st == ZT_OK) st = jr_member(&r, 0, "model", ZT_JSON_OBJECT, &model);
    zt_ckpt_model_shape *m = &c->model;
    const char *model_keys[] = {"n_layers", "vocab_size", "hidden_size", "n_heads",
                                "n_kv_heads", "head_dim", "intermediate_size"};
    int64_t *model_values[] = {&m->n_layers, &m->vocab_size, &m->hidden_size, &m->n_heads,
                               &m->n_kv_heads, &m->head_dim, &m->intermediate_size};
    for (int k = 0; k < 7 && st == ZT_OK; k++) st = jr_int(&r, model, model_keys[k], 0, model_values[k]);
    if (st == ZT_OK) st = jr_member(&r, 0, "files", ZT_JSON_ARRAY, &files);
    if (st == ZT_OK) st = jr_member(&r, 0, "tensors", ZT_JSON_ARRAY, &tensors);
    if (st == ZT_OK) st = jr_member(&r, 0, "blobs", ZT_JSON_ARRAY, &blobs);
    if (st == ZT_OK) st = jr_member(&r, 0, "config", ZT_JSON_OBJECT, &config);
    if (st != ZT_OK) return st;

    c->config_json = strndup(j->text + j->tok[config].start,
                             (size_t)(j->tok[config].end - j->tok[config].start));
    size_t n_files = (size_t)j->tok[files].size, n_tensors = (size_t)j->tok[tensors].size;
    size_t n_blobs = (size_t)j->tok[blobs].size;
    c->files = calloc(n_files ? n_files : 1, sizeof *c->files);
    c->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *c->tensors);
    c->by_key = calloc(n_tensors ? n_tensors : 1, sizeof *c->by_key);
    c->blobs = calloc(n_blobs ? n_blobs : 1, sizeof *c->blobs);
    if (!c->config_json || !c->files || !c->tensors || !c->by_key || !c->blobs) {
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", c->index_path);
    }
    int item = files + 1;
    for (size_t i = 0; i < n_files && st == ZT_OK; i++, item = zt_json_skip(j, item)) {
        c->n_files++;
        st = j->tok[item].type == ZT_JSON_OBJECT ? open_data_file(&r, c, item, &c->files[i])
                                                 : jr_error(&r, item, "each file must be an object");
        for (size_t k = 0; k < i && st == ZT_OK; k++) {
            if (strcmp(c->files[k].name, c->files[i].name) == 0) {
                st = jr_error(&r, item, "file '%s' is listed twice", c->files[i].name);
            }
        }
    }
    item = tensors + 1;
    for (size_t i = 0; i < n_tensors && st == ZT_OK; i++, item = zt_json_skip(j, item)) {
        c->n_tensors++;
        c->by_key[i] = i;
        st = j->tok[item].type == ZT_JSON_OBJECT ? read_tensor_entry(&r, c, item, &c->tensors[i])
                                                 : jr_error(&r, item, "each tensor must be an object");
    }
    if (st == ZT_OK) {
        qsort_r(c->by_key, c->n_tensors, sizeof *c->by_key, compare_tensor_keys, c->tensors);
        for (size_t i = 1; i < c->n_tensors && st == ZT_OK; i++) {
            const ckpt_tensor *x = &c->tensors[c->by_key[i - 1]], *y = &c->tensors[c->by_key[i]];
            if (compare_key(x->group, x->name, y->group, y->name) == 0) {
                st = jr_error(&r, tensors, "tensor '%s' (group %s) is listed twice", x->name, x->group);
            }
        }
    }
    item = blobs + 1;
    for (size_t i = 0; i < n_blobs && st == ZT_OK; i++, item = zt_json_skip(j, item)) {
        c->n_blobs++;
        st = j->tok[item].type == ZT_JSON_OBJECT ? read_blob_entry(&r, c, item, &c->blobs[i])
                                                 : jr_error(&r, item, "each blob must be an object");
        for (size_t k = 0; k < i && st == ZT_OK; k++) {
            if (strcmp(c->blobs[k].name, c->blobs[i].name) == 0) {
                st = jr_error(&r, item, "blob '%s' is listed twice", c->blobs[i].name);
            }
        }
    }
    return st;
}

zt_status zt_ckpt_open(const char *step_dir, zt_ckpt **out, zt_error *err)
{
    *out = NULL;
    zt_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(step_dir)) || !(c->index_path = join(step_dir, CKPT_INDEX))) {
        zt_ckpt_close(c);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening '%s'", step_dir);
    }
    char *text = NULL;
    size_t len = 0;
    zt_status st = zt_read_file(c->index_path, &text, &len, err);
    if (st == ZT_ERR_NOT_FOUND) {
        st = zt_error_set(err, ZT_ERR_NOT_FOUND, "%s is not a complete zt checkpoint: it has no %s%s",
                          step_dir, CKPT_INDEX,
                          strstr(step_dir, CKPT_TMP_MARK) ? " (it is the staging directory of a "
                                                            "save that did not finish)"
                                                          : "");
    }
    zt_json j = {0};
    if (st == ZT_OK) st = zt_json_parse(text, len, c->index_path, &j, err);
    if (st == ZT_OK) st = parse_index(c, &j, err);
    zt_json_free(&j);
    free(text);
    if (st != ZT_OK) {
        zt_ckpt_close(c);
        return st;
    }
    *out = c;
    return ZT_OK;
}

static zt_status verify_shard(zt_ckpt *c, const ckpt_tensor *t, ckpt_shard *s, zt_error *err)
{
    if (s->verified) return ZT_OK;
    const ckpt_file *f = &c->files[s->file];
    uint64_t bytes = (uint64_t)s->count * sizeof(float);
    if (zt_fnv1a64(ZT_FNV1A64_INIT, f->map + s->byte_offset, bytes) != s->checksum) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "checkpoint %s: checksum mismatch in %s, in the shard of tensor '%s' "
                            "(group %s, elements [%" PRId64 ", %" PRId64 "), written by rank %d, "
                            "bytes [%" PRIu64 ", %" PRIu64 ")): the file is corrupt; restore it or "
                            "resume from an earlier checkpoint",
                            c->dir, f->name, t->name, t->group, s->elem_offset,
                            s->elem_offset + s->count, s->rank, s->byte_offset,
                            s->byte_offset + bytes);
    }
    s->verified = 1;
    return ZT_OK;
}

/* The groups the checkpoint has, for messages. */
static void append_groups(const zt_ckpt *c, zt_error *err)
{
    const char *last = NULL;
    for (size_t i = 0; i < c->n_tensors; i++) {
        const char *g = c->tensors[c->by_key[i]].group;
        if (last && strcmp(last, g) == 0) continue;
        zt_error_append(err, "%s%s", last ? ", " : " (groups present: ", g);
        last = g;
    }
    if (last) zt_error_append(err, ")");
}

static zt_status missing_tensor(const zt_ckpt *c, const char *name, const char *group, zt_error *err)
{
    int group_known = 0;
    for (size_t i = 0; i < c->n_tensors && !group_known; i++) group_known = !strcmp(c->tensors[i].group, group);
    if (!group_known) {
        zt_error_set(err, ZT_ERR_NOT_FOUND,
                     "checkpoint %s has no '%s' tensors at all: it was saved with another "
                     "optimizer or without optimizer state",
                     c->dir, group);
        append_groups(c, err);
        return ZT_ERR_NOT_FOUND;
    }
    return zt_error_set(err, ZT_ERR_NOT_FOUND,
                        "checkpoint %s has no tensor '%s' in group %s: this run's model has a "
                        "parameter the saved model did not",
                        c->dir, name, group);
}

zt_status zt_ckpt_read(zt_ckpt *c, const char *name, const char *group, int64_t elem_offset,
                       int64_t count, float *dst, zt_error *err)
{
    ckpt_tensor *t = (ckpt_tensor *)find_tensor(c, name, group);
    if (!t) return missing_tensor(c, name, group, err);
    if (elem_offset < 0 || count < 0 || elem_offset > t->info.numel ||
        count > t->info.numel - elem_offset) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "checkpoint %s: elements [%" PRId64 ", %" PRId64 ") asked of tensor "
                            "'%s' (group %s), which has %" PRId64,
                            c->dir, elem_offset, elem_offset + count, name, group, t->info.numel);
    }
    /* First shard ending after elem_offset; the shards tile the tensor, so the rest follow. */
    size_t lo = 0, hi = t->n_shards;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->shards[mid].elem_offset + t->shards[mid].count <= elem_offset) lo = mid + 1;
        else hi = mid;
    }
    int64_t end = elem_offset + count;
    for (size_t i = lo; i < t->n_shards && t->shards[i].elem_offset < end; i++) {
        ckpt_shard *s = &t->shards[i];
        zt_status st = verify_shard(c, t, s, err);
        if (st != ZT_OK) return st;
        int64_t from = s->elem_offset > elem_offset ? s->elem_offset : elem_offset;
        int64_t to = s->elem_offset + s->count < end ? s->elem_offset + s->count : end;
        const uint8_t *src = c->files[s->file].map + s->byte_offset +
                             (uint64_t)(from - s->elem_offset) * sizeof(float);
        memcpy(dst + (from - elem_offset), src, (size_t)(to - from) * sizeof(float));
    }
    return ZT_OK;
}

zt_status zt_ckpt_read_unit_shard(zt_ckpt *c, const zt_layout *layout, int32_t unit,
                                  const char *group, int64_t offset, int64_t count, float *dst,
                                  zt_error *err)
{
    zt_status st = check_unit_range(layout, unit, offset, count, err);
    if (st != ZT_OK) return st;
    memset(dst, 0, (size_t)count * sizeof *dst); /* padding, and room for what follows */
    int64_t param_start, length, flat_start;
    for (int p = layout->units[unit].first_param; st == ZT_OK; p++) {
        p = next_overlap(layout, unit, p, offset, count, &param_start, &length, &flat_start);
        if (p < 0) break;
        st = zt_ckpt_read(c, layout->model->params[p].name, group, param_start, length,
                          dst + (flat_start - offset), err);
    }
    return st;
}

zt_status zt_ckpt_blob(zt_ckpt *c, const char *name, const void **data, size_t *size,
                       zt_error *err)
{
    for (size_t i = 0; i < c->n_blobs; i++) {
        ckpt_blob *b = &c->blobs[i];
        if (strcmp(b->name, name) != 0) continue;
        const ckpt_file *f = &c->files[b->file];
        if (!b->verified &&
            zt_fnv1a64(ZT_FNV1A64_INIT, f->map + b->byte_offset, b->size) != b->checksum) {
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "checkpoint %s: checksum mismatch in %s, in blob '%s' written by "
                                "rank %d (bytes [%" PRIu64 ", %" PRIu64 ")): the file is corrupt; "
                                "restore it or resume from an earlier checkpoint",
                                c->dir, f->name, name, b->rank, b->byte_offset,
                                b->byte_offset + b->size);
        }
        b->verified = 1;
        *data = b->size ? f->map + b->byte_offset : (const void *)"";
        *size = (size_t)b->size;
        return ZT_OK;
    }
    zt_error_set(err, ZT_ERR_NOT_FOUND, "checkpoint %s has no blob '%s'", c->dir, name);
    for (size_t i = 0; i < c->n_blobs; i++) {
        zt_error_append(err, "%s'%s'", i ? ", " : " (blobs there: ", c->blobs[i].name);
    }
    if (c->n_blobs) zt_error_append(err, ")");
    return ZT_ERR_NOT_FOUND;
}

zt_status zt_ckpt_verify(zt_ckpt *c, zt_error *err)
{
    for (size_t i = 0; i < c->n_tensors; i++) {
        for (size_t k = 0; k < c->tensors[i].n_shards; k++) {
            zt_status st = verify_shard(c, &c->tensors[i], &c->tensors[i].shards[k], err);
            if (st != ZT_OK) return st;
        }
    }
    for (size_t i = 0; i < c->n_blobs; i++) {
        const void *data;
        size_t size;
        zt_status st = zt_ckpt_blob(c, c->blobs[i].name, &data, &size, err);
        if (st != ZT_OK) return st;
    }
    return ZT_OK;
}

static void format_dims(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && used < cap; d++) {
        used += (size_t)snprintf(buf + used, cap - used, "%s%" PRId64, d ? ", " : "", shape[d]);
    }
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

zt_status zt_ckpt_check_model(const zt_ckpt *c, const zt_model_info *info,
                              const char *const *groups, size_t n_groups, zt_error *err)
{
    zt_ckpt_model_shape run;
    zt_ckpt_model_shape_from_info(info, &run);
    const char *keys[] = {"n_layers", "vocab_size", "hidden_size", "n_heads",
                          "n_kv_heads", "head_dim", "intermediate_size"};
    const int64_t saved[] = {c->model.n_layers, c->model.vocab_size, c->model.hidden_size,
                             c->model.n_heads, c->model.n_kv_heads, c->model.head_dim,
                             c->model.intermediate_size};
    const int64_t now[] = {run.n_layers, run.vocab_size, run.hidden_size, run.n_heads,
                           run.n_kv_heads, run.head_dim, run.intermediate_size};
    int n_diff = 0;
    for (int k = 0; k < 7; k++) {
        if (saved[k] == now[k]) continue;
        if (n_diff++ == 0) {
            zt_error_set(err, ZT_ERR_CONFIG, "checkpoint %s was saved from a different model:",
                         c->dir);
        }
        zt_error_append(err, "%s checkpoint has %s %" PRId64 ", this run's model has %" PRId64,
                        n_diff > 1 ? ";" : "", keys[k], saved[k], now[k]);
    }
    if (n_diff) {
        zt_error_append(err, ". Resume with the model config the checkpoint was saved with (it "
                             "is stored under \"config\" in its checkpoint.json)");
        return ZT_ERR_CONFIG;
    }
    for (size_t g = 0; g < n_groups; g++) {
        size_t n_model = 0;
        for (int p = 0; p < info->n_params_decl; p++) {
            const zt_param_decl *d = &info->params[p];
            if (d->flags & ZT_PARAM_TIED) continue;
            n_model++;
            const ckpt_tensor *t = find_tensor(c, d->name, groups[g]);
            if (!t) return missing_tensor(c, d->name, groups[g], err);
            int same = t->info.ndim == d->ndim;
            for (int k = 0; same && k < d->ndim; k++) same = t->info.shape[k] == d->shape[k];
            if (!same) {
                char have[128], want[128];
                format_dims(have, sizeof have, t->info.ndim, t->info.shape);
                format_dims(want, sizeof want, d->ndim, d->shape);
                return zt_error_set(err, ZT_ERR_CONFIG,
                                    "checkpoint %s: tensor '%s' (group %s) has shape %s, this "
                                    "run's model has %s",
                                    c->dir, d->name, groups[g], have, want);
            }
        }
        /* The model's tensors are all there; any further one in the group would be dropped. */
        size_t n_saved = 0;
        for (size_t i = 0; i < c->n_tensors; i++) n_saved += !strcmp(c->tensors[i].group, groups[g]);
        for (size_t i = 0; n_saved > n_model && i < c->n_tensors; i++) {
            const ckpt_tensor *t = &c->tensors[i];
            if (strcmp(t->group, groups[g]) != 0) continue;
            int known = 0;
            for (int p = 0; p < info->n_params_decl && !known; p++) {
                known = !(info->params[p].flags & ZT_PARAM_TIED) && !strcmp(info->params[p].name, t->name);
            }
            if (!known) {
                return zt_error_set(err, ZT_ERR_CONFIG,
                                    "checkpoint %s has tensor '%s' (group %s), which this run's "
                                    "model does not have: it was saved from a different model",
                                    c->dir, t->name, groups[g]);
            }
        }
    }
    return ZT_OK;
}
