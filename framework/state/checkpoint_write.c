/* zt checkpoints, writing: the staging directory, each rank's data file (rank writer), and the
 * commit that checks coverage, writes checkpoint.json, publishes the directory atomically, points
 * latest at it and prunes old checkpoints (checkpoint.h, docs/checkpoint-format.md). */
#define _GNU_SOURCE /* renameat2, asprintf, open_memstream, mkdtemp, qsort_r */

#include "state/checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/fileio.h"
#include "base/json.h"
#include "base/log.h"

/* ---- staging and its writer ------------------------------------------------------------------ */

/* Who writes a staging directory: enough to tell later, on this host, whether that process is gone.
 * A pid means something only within one boot of one kernel and one pid namespace (a container has
 * its own): boot_id (random per boot, so it also tells machines apart) and pid_ns say which. */
typedef struct ckpt_writer {
    char host[256];
    char boot_id[64];
    char pid_ns[64];
    int64_t pid;
} ckpt_writer;

static void read_line_file(const char *path, char *buf, size_t cap)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    if (!fgets(buf, (int)cap, f)) buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\r\n")] = '\0';
}

static void writer_self(ckpt_writer *w)
{
    memset(w, 0, sizeof *w);
    if (gethostname(w->host, sizeof w->host - 1) != 0) w->host[0] = '\0';
    read_line_file("/proc/sys/kernel/random/boot_id", w->boot_id, sizeof w->boot_id);
    ssize_t n = readlink("/proc/self/ns/pid", w->pid_ns, sizeof w->pid_ns - 1);
    w->pid_ns[n > 0 ? n : 0] = '\0';
    w->pid = (int64_t)getpid();
}

static zt_status write_writer_file(const char *staging, zt_error *err)
{
    ckpt_writer w;
    writer_self(&w);
    char *text = NULL, *path = ckpt_join(staging, CKPT_WRITER);
    size_t len = 0;
    FILE *m = path ? open_memstream(&text, &len) : NULL;
    if (m) {
        fputs("{\"host\": ", m);
        zt_json_write_string(m, w.host, strlen(w.host));
        fputs(", \"boot_id\": ", m);
        zt_json_write_string(m, w.boot_id, strlen(w.boot_id));
        fputs(", \"pid_ns\": ", m);
        zt_json_write_string(m, w.pid_ns, strlen(w.pid_ns));
        fprintf(m, ", \"pid\": %" PRId64 "}\n", w.pid);
    }
    zt_status st = m && fclose(m) == 0 && text ? zt_atomic_write(path, text, len, err)
                                               : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory staging a checkpoint");
    free(text);
    free(path);
    return st;
}

/* The writer recorded in staging/writer.json; 0 when there is none or it cannot be read. */
static int read_writer_file(const char *staging, ckpt_writer *w)
{
    memset(w, 0, sizeof *w);
    char *path = ckpt_join(staging, CKPT_WRITER), *text = NULL;
    size_t len = 0;
    zt_error err;
    int ok = path && zt_read_file(path, &text, &len, &err) == ZT_OK;
    zt_json j;
    ok = ok && zt_json_parse(text, len, path, &j, &err) == ZT_OK;
    if (ok) {
        int pid = j.tok[0].type == ZT_JSON_OBJECT ? zt_json_object_get(&j, 0, "pid") : -1;
        ok = pid >= 0 && zt_json_is_number(&j, pid) && zt_json_get_number(&j, pid) >= 1;
        if (ok) w->pid = (int64_t)zt_json_get_number(&j, pid);
        const char *keys[] = {"host", "boot_id", "pid_ns"};
        char *dst[] = {w->host, w->boot_id, w->pid_ns};
        size_t caps[] = {sizeof w->host, sizeof w->boot_id, sizeof w->pid_ns};
        for (int k = 0; k < 3 && ok; k++) {
            int tok = zt_json_object_get(&j, 0, keys[k]);
            char *value = NULL;
            size_t n = 0;
            ok = tok >= 0 && j.tok[tok].type == ZT_JSON_STRING && zt_json_string(&j, tok, &value, &n, &err) == ZT_OK &&
                 n < caps[k];
            if (ok) memcpy(dst[k], value, n + 1);
            free(value);
        }
        zt_json_free(&j);
    }
    free(text);
    free(path);
    return ok;
}

/* The writer is known to be gone: same boot and pid namespace as this process, and no process has
 * its pid. A live process with that pid (even an unrelated one that reused it), another host, another
 * container, or a boot of another machine: not provably gone, so the directory stays. */
static int writer_gone(const ckpt_writer *self, const ckpt_writer *w)
{
    if (!self->boot_id[0] || strcmp(self->boot_id, w->boot_id) != 0) return 0;
    if (!self->pid_ns[0] || strcmp(self->pid_ns, w->pid_ns) != 0) return 0;
    if (w->pid == self->pid || w->pid > INT32_MAX) return 0;
    return kill((pid_t)w->pid, 0) != 0 && errno == ESRCH;
}

zt_status zt_ckpt_stage(const char *root, int64_t step, char **staging_dir, zt_error *err)
{
    *staging_dir = NULL;
    if (step < 0) return zt_error_set(err, ZT_ERR_INVALID_ARG, "checkpoint step %" PRId64 " < 0", step);
    zt_status st = zt_mkdir_p(root, "checkpoint", "choose another checkpoint.dir (or output_dir)", err);
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
    /* So that a later run can remove it if this process dies before publishing it. */
    st = write_writer_file(path, err);
    if (st != ZT_OK) {
        rmdir(path);
        free(path);
        return st;
    }
    *staging_dir = path;
    return ZT_OK;
}

/* Remove the regular files of dir, checkpoint.json first (so an interrupted removal never leaves a
 * directory that looks complete), then dir itself. 0 on success. */
static int remove_checkpoint_dir(const char *dir)
{
    char *index = ckpt_join(dir, CKPT_INDEX);
    if (index) unlink(index);
    free(index);
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char *p = ckpt_join(dir, e->d_name);
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

/* ---- stale staging directories ---------------------------------------------------------------- */

/* Bytes of the regular files directly in dir (a checkpoint directory has no subdirectories). */
static uint64_t dir_bytes(const char *dir)
{
    uint64_t total = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *p = ckpt_join(dir, e->d_name);
        struct stat sb;
        if (p && lstat(p, &sb) == 0 && S_ISREG(sb.st_mode)) total += (uint64_t)sb.st_size;
        free(p);
    }
    closedir(d);
    return total;
}

zt_status zt_ckpt_remove_stale_staging(const char *root, int64_t *n_removed, uint64_t *bytes_removed,
                                       zt_error *err)
{
    if (n_removed) *n_removed = 0;
    if (bytes_removed) *bytes_removed = 0;
    zt_ckpt_list list;
    zt_status st = zt_ckpt_list_dir(root, &list, err);
    if (st != ZT_OK) return st;
    ckpt_writer self;
    writer_self(&self);
    int64_t n = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < list.n_incomplete; i++) {
        const char *dir = list.incomplete[i];
        const char *slash = strrchr(dir, '/');
        ckpt_writer w;
        if (!strstr(slash ? slash + 1 : dir, CKPT_TMP_MARK) || !read_writer_file(dir, &w) || !writer_gone(&self, &w))
            continue;
        uint64_t bytes = dir_bytes(dir);
        if (remove_checkpoint_dir(dir) != 0) {
            zt_log(ZT_LOG_WARN, "could not remove stale checkpoint staging directory %s: %s; delete it by hand", dir,
                   strerror(errno));
            continue;
        }
        zt_log(ZT_LOG_INFO,
               "removed stale checkpoint staging directory %s (%" PRIu64 " bytes): its writer, process %" PRId64
               " on this host (%s), is gone, so the save it began never finished",
               dir, bytes, w.pid, w.host);
        n++;
        total += bytes;
    }
    zt_ckpt_list_free(&list);
    if (n > 1)
        zt_log(ZT_LOG_INFO, "removed %" PRId64 " stale checkpoint staging directories in %s, %" PRIu64 " bytes (%.1f MiB) "
               "in all", n, root, total, (double)total / (1024.0 * 1024.0));
    if (n_removed) *n_removed = n;
    if (bytes_removed) *bytes_removed = total;
    return ZT_OK;
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

zt_status zt_ckpt_rank_writer_add_unit_shard(zt_ckpt_rank_writer *w, const zt_layout *layout,
                                             int32_t unit, const char *group, int64_t offset,
                                             int64_t count, const float *data, zt_error *err)
{
    zt_status st = ckpt_check_unit_range(layout, unit, offset, count, err);
    int64_t param_start, length, flat_start;
    for (int p = layout->units[unit].first_param; st == ZT_OK; p++) {
        p = ckpt_next_overlap(layout, unit, p, offset, count, &param_start, &length, &flat_start);
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

static int compare_decl_order(const void *a, const void *b, void *decls)
{
    const zt_ckpt_tensor_decl *x = &((const zt_ckpt_tensor_decl *)decls)[*(const size_t *)a];
    const zt_ckpt_tensor_decl *y = &((const zt_ckpt_tensor_decl *)decls)[*(const size_t *)b];
    return ckpt_compare_key(x->group, x->name, y->group, y->name);
}

/* Index of the declaration (name, group), or -1. */
static long decl_find(const decl_index *ix, const char *name, const char *group)
{
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const zt_ckpt_tensor_decl *d = &ix->decls[ix->order[mid]];
        int c = ckpt_compare_key(group, name, d->group, d->name);
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
        if (ckpt_compare_key(x->group, x->name, y->group, y->name) == 0) {
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
                    int64_t numel = ckpt_decl_numel(d->ndim, d->shape);
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
        st = ckpt_check_coverage("checkpoint not saved", d->name, d->group,
                                 ckpt_decl_numel(d->ndim, d->shape), plan->spans_of[t],
                                 plan->n_spans_of[t], err);
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
    char *path = ckpt_join(a->staging_dir, CKPT_INDEX);
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
    latest = ckpt_join(a->root, CKPT_LATEST);
    if (asprintf(&latest_text, "step-%06" PRId64 "\n", a->step) < 0) latest_text = NULL;
    if (!final || !latest || !latest_text) {
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving a checkpoint");
    }
    if (st == ZT_OK) {
        /* The writer's note is for staging only: a published checkpoint does not carry it. */
        char *writer = ckpt_join(a->staging_dir, CKPT_WRITER);
        if (!writer) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving a checkpoint");
        else if (unlink(writer) != 0 && errno != ENOENT)
            st = zt_error_set(err, ZT_ERR_IO, "cannot remove %s: %s", writer, strerror(errno));
        free(writer);
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
