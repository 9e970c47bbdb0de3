/* zt checkpoints, reading: checkpoint.json validated in full on open, then any element range of any
 * logical tensor assembled from whichever shards hold it (resharding N ranks to M, any ZeRO stage),
 * checksums verified on first read, and the check that a checkpoint fits this run's model
 * (checkpoint.h, docs/checkpoint-format.md). */
#define _GNU_SOURCE /* asprintf, qsort_r, strndup */

#include "state/checkpoint_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/fileio.h"
#include "base/json.h"
#include "state/safetensors.h"

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
        int cmp = ckpt_compare_key(group, name, t->group, t->name);
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
    char *path = ckpt_join(c->dir, f->name);
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
        st = ckpt_check_coverage(c->index_path, t->name, t->group, t->info.numel, spans,
                                 t->n_shards, r->err);
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
    return ckpt_compare_key(x->group, x->name, y->group, y->name);
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
            if (ckpt_compare_key(x->group, x->name, y->group, y->name) == 0) {
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
    if (!c || !(c->dir = strdup(step_dir)) || !(c->index_path = ckpt_join(step_dir, CKPT_INDEX))) {
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
    /* A checkpoint saved by a diverged run holds its NaN or infinities faithfully (the checksum
     * matches): refused here too, for every group, since a resume from it could only skip steps. */
    int64_t bad = zt_st_find_nonfinite((const float *)(f->map + s->byte_offset), (uint64_t)s->count);
    if (bad >= 0) {
        float v;
        memcpy(&v, f->map + s->byte_offset + (uint64_t)bad * sizeof(float), sizeof v);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "checkpoint %s: tensor '%s' (group %s) holds %s at element %" PRId64 " (in %s, "
                            "written by rank %d): the run had diverged when it saved this checkpoint, so a resume "
                            "from it could only skip steps; resume from an earlier checkpoint",
                            c->dir, t->name, t->group, zt_st_nonfinite_name(v), s->elem_offset + bad, f->name,
                            s->rank);
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
    zt_status st = ckpt_check_unit_range(layout, unit, offset, count, err);
    if (st != ZT_OK) return st;
    memset(dst, 0, (size_t)count * sizeof *dst); /* padding, and room for what follows */
    int64_t param_start, length, flat_start;
    for (int p = layout->units[unit].first_param; st == ZT_OK; p++) {
        p = ckpt_next_overlap(layout, unit, p, offset, count, &param_start, &length, &flat_start);
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
    return zt_ckpt_check_model_params(c, info, groups, n_groups, NULL, err);
}

zt_status zt_ckpt_check_model_params(const zt_ckpt *c, const zt_model_info *info, const char *const *groups,
                                     size_t n_groups, const uint8_t *needed, zt_error *err)
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
            if ((d->flags & ZT_PARAM_TIED) || (needed && !needed[p])) continue;
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
