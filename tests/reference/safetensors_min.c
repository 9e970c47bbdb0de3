/* Minimal strict safetensors reader; see safetensors_min.h. */
#include "safetensors_min.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/json.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it as is"
#endif

/* A header larger than this is not a model we could train on one host anyway; the limit keeps a
 * corrupt length field from asking for terabytes. */
#define MAX_HEADER_BYTES (100u * 1024u * 1024u)

const char *ref_st_dtype_name(int dtype)
{
    switch (dtype) {
    case ZT_F32: return "F32";
    case ZT_F16: return "F16";
    case ZT_BF16: return "BF16";
    case ZT_I32: return "I32";
    case ZT_I64: return "I64";
    default: return "?";
    }
}

static int dtype_size(int dtype)
{
    return dtype == ZT_F16 || dtype == ZT_BF16 ? 2 : dtype == ZT_I64 ? 8 : 4;
}

static int parse_dtype(const char *s)
{
    const int all[] = {ZT_F32, ZT_F16, ZT_BF16, ZT_I32, ZT_I64};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, ref_st_dtype_name(all[i])) == 0) return all[i];
    return -1;
}

void ref_st_close(ref_st_file *f)
{
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->bytes);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* ---- header parsing ------------------------------------------------------------------------- */

typedef struct header_ctx {
    const ref_st_file *file;
    const zt_json *json;
    const unsigned char *data; /* first byte after the header */
    uint64_t data_size;
    zt_error *err;
} header_ctx;

/* "path: header line L, column C: " prefix for a message about token tok. */
static zt_status header_error(const header_ctx *h, int tok, const char *tensor, const char *what,
                              const char *fix)
{
    int line = 0, col = 0;
    zt_json_line_col(h->json->text, (size_t)h->json->tok[tok].start, &line, &col);
    return zt_error_set(h->err, ZT_ERR_FORMAT, "%s: header line %d, column %d: tensor \"%s\": %s; %s",
                        h->file->path, line, col, tensor, what, fix);
}

/* A JSON number token that is a plain non-negative integer (digits only) <= limit. */
static int read_uint(const zt_json *j, int tok, uint64_t limit, uint64_t *out)
{
    if (j->tok[tok].type != ZT_JSON_PRIMITIVE) return 0;
    const char *s = j->text + j->tok[tok].start;
    int n = j->tok[tok].end - j->tok[tok].start;
    uint64_t v = 0;
    if (n == 0 || n > 19) return 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > limit) return 0;
    *out = v;
    return 1;
}

static zt_status parse_tensor(const header_ctx *h, int value, ref_st_tensor *t)
{
    const zt_json *j = h->json;
    const char *fix = "the file is corrupt or not a safetensors file; re-export it with the "
                      "safetensors library";
    if (j->tok[value].type != ZT_JSON_OBJECT)
        return header_error(h, value, t->name, "the entry is not an object", fix);
    int dtype_tok = zt_json_object_get(j, value, "dtype");
    int shape_tok = zt_json_object_get(j, value, "shape");
    int offsets_tok = zt_json_object_get(j, value, "data_offsets");
    if (dtype_tok < 0 || shape_tok < 0 || offsets_tok < 0)
        return header_error(h, value, t->name,
                            "it lacks one of \"dtype\", \"shape\", \"data_offsets\"", fix);

    if (j->tok[dtype_tok].type != ZT_JSON_STRING)
        return header_error(h, dtype_tok, t->name, "\"dtype\" is not a string", fix);
    char *dtype = NULL;
    zt_status st = zt_json_string(j, dtype_tok, &dtype, NULL, h->err);
    if (st != ZT_OK) return st;
    t->dtype = parse_dtype(dtype);
    if (t->dtype < 0) {
        char what[160];
        snprintf(what, sizeof what, "dtype \"%.40s\" is not supported", dtype);
        free(dtype);
        return header_error(h, dtype_tok, t->name, what,
                            "this reader knows F32, F16, BF16, I32 and I64; convert the checkpoint "
                            "(e.g. to F32 or BF16) before importing it");
    }
    free(dtype);

    if (j->tok[shape_tok].type != ZT_JSON_ARRAY)
        return header_error(h, shape_tok, t->name, "\"shape\" is not an array", fix);
    t->ndim = j->tok[shape_tok].size;
    if (t->ndim > ZT_MAX_DIMS) {
        char what[96];
        snprintf(what, sizeof what, "it has %d dimensions, more than the %d supported", t->ndim,
                 ZT_MAX_DIMS);
        return header_error(h, shape_tok, t->name, what, "no LLaMA tensor has that many; check the file");
    }
    t->numel = 1;
    for (int d = 0, item = shape_tok + 1; d < t->ndim; d++, item = zt_json_skip(j, item)) {
        uint64_t dim;
        if (!read_uint(j, item, (uint64_t)1 << 40, &dim))
            return header_error(h, item, t->name,
                                "a \"shape\" entry is not a non-negative integer below 2^40", fix);
        t->shape[d] = (int64_t)dim;
        if (dim != 0 && (uint64_t)t->numel > ((uint64_t)1 << 50) / dim)
            return header_error(h, shape_tok, t->name, "the shape has more than 2^50 elements", fix);
        t->numel *= (int64_t)dim;
    }

    uint64_t begin, end;
    if (j->tok[offsets_tok].type != ZT_JSON_ARRAY || j->tok[offsets_tok].size != 2 ||
        !read_uint(j, offsets_tok + 1, UINT64_MAX / 2, &begin) ||
        !read_uint(j, zt_json_skip(j, offsets_tok + 1), UINT64_MAX / 2, &end))
        return header_error(h, offsets_tok, t->name,
                            "\"data_offsets\" is not an array of two non-negative integers", fix);
    if (begin > end || end > h->data_size) {
        char what[200];
        snprintf(what, sizeof what,
                 "data_offsets [%llu, %llu] do not lie within the %llu bytes of data after the header",
                 (unsigned long long)begin, (unsigned long long)end,
                 (unsigned long long)h->data_size);
        return header_error(h, offsets_tok, t->name, what,
                            "the file is truncated or corrupt; copy or download it again");
    }
    t->nbytes = end - begin;
    if (t->nbytes != (uint64_t)t->numel * (uint64_t)dtype_size(t->dtype)) {
        char what[200];
        snprintf(what, sizeof what, "it holds %llu bytes but %lld %s elements need %llu",
                 (unsigned long long)t->nbytes, (long long)t->numel, ref_st_dtype_name(t->dtype),
                 (unsigned long long)t->numel * (unsigned long long)dtype_size(t->dtype));
        return header_error(h, offsets_tok, t->name, what, fix);
    }
    t->data = h->data + begin;
    return ZT_OK;
}

static int by_data_offset(const void *a, const void *b)
{
    const ref_st_tensor *x = a, *y = b;
    return x->data < y->data ? -1 : x->data > y->data;
}

static zt_status parse_file(ref_st_file *f, zt_error *err)
{
    if (f->size < 8)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the file has %zu bytes, fewer than the 8-byte header length of a "
                            "safetensors file; it is truncated or not safetensors",
                            f->path, f->size);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = header_len << 8 | f->bytes[i];
    if (header_len > MAX_HEADER_BYTES || header_len > f->size - 8)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the header length field says %llu bytes but the file has %zu "
                            "bytes after it%s; the file is truncated or not safetensors",
                            f->path, (unsigned long long)header_len, f->size - 8,
                            header_len > MAX_HEADER_BYTES ? " (and the limit is 100 MiB)" : "");

    char origin[4200];
    snprintf(origin, sizeof origin, "%s (safetensors header)", f->path);
    zt_json json;
    zt_status st = zt_json_parse((const char *)f->bytes + 8, (size_t)header_len, origin, &json, err);
    if (st != ZT_OK) return st;
    header_ctx h = {f, &json, f->bytes + 8 + header_len, f->size - 8 - header_len, err};
    if (json.tok[0].type != ZT_JSON_OBJECT) {
        zt_json_free(&json);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the header is not a JSON object; the file is not safetensors",
                            f->path);
    }

    f->tensors = calloc((size_t)json.tok[0].size + 1, sizeof *f->tensors);
    if (!f->tensors) {
        zt_json_free(&json);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory for %d tensor entries",
                            f->path, json.tok[0].size);
    }
    for (int key = 1, i = 0; i < json.tok[0].size && st == ZT_OK; i++) {
        int value = key + 1;
        char *name = NULL;
        st = zt_json_string(&json, key, &name, NULL, err);
        if (st == ZT_OK && strcmp(name, "__metadata__") != 0) {
            ref_st_tensor *t = &f->tensors[f->n_tensors++];
            t->name = name;
            name = NULL;
            for (int k = 0; k < f->n_tensors - 1 && st == ZT_OK; k++)
                if (strcmp(f->tensors[k].name, t->name) == 0)
                    st = header_error(&h, key, t->name, "the name appears twice",
                                      "the file is corrupt; re-export it");
            if (st == ZT_OK) st = parse_tensor(&h, value, t);
        }
        free(name);
        key = zt_json_skip(&json, value);
    }
    zt_json_free(&json);
    if (st != ZT_OK) return st;

    /* Tensors must not share bytes (the format forbids it; it would mean a corrupt header). */
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, by_data_offset);
    for (int i = 1; i < f->n_tensors; i++) {
        const ref_st_tensor *a = &f->tensors[i - 1], *b = &f->tensors[i];
        if (a->data + a->nbytes > b->data)
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: the data of tensors \"%s\" and \"%s\" overlap; the header is "
                                "corrupt, re-export the file",
                                f->path, a->name, b->name);
    }
    return ZT_OK;
}

zt_status ref_st_open_memory(const void *bytes, size_t size, const char *origin, ref_st_file *out,
                            zt_error *err)
{
    memset(out, 0, sizeof *out);
    out->path = strdup(origin);
    out->bytes = malloc(size ? size : 1);
    if (!out->path || !out->bytes) {
        ref_st_close(out);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", origin, size);
    }
    memcpy(out->bytes, bytes, size);
    out->size = size;
    zt_status st = parse_file(out, err);
    if (st != ZT_OK) ref_st_close(out);
    return st;
}

zt_status ref_st_open(const char *path, ref_st_file *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return zt_error_set(err, ZT_ERR_IO, "%s: cannot open: %s; check the path", path,
                            strerror(errno));
    zt_status st = ZT_OK;
    long size = -1;
    if (fseek(fp, 0, SEEK_END) == 0) size = ftell(fp);
    if (size < 0 || fseek(fp, 0, SEEK_SET) != 0) {
        st = zt_error_set(err, ZT_ERR_IO, "%s: cannot determine the file size: %s", path,
                          strerror(errno));
    } else {
        out->path = strdup(path);
        out->bytes = malloc((size_t)size + 1);
        out->size = (size_t)size;
        if (!out->path || !out->bytes)
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory for %ld bytes", path, size);
        else if (fread(out->bytes, 1, out->size, fp) != out->size)
            st = zt_error_set(err, ZT_ERR_IO, "%s: read failed: %s", path,
                              ferror(fp) ? strerror(errno) : "the file shrank while reading");
    }
    fclose(fp);
    if (st == ZT_OK) st = parse_file(out, err);
    if (st != ZT_OK) ref_st_close(out);
    return st;
}

const ref_st_tensor *ref_st_find(const ref_st_file *f, const char *name)
{
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

/* ---- typed reads ---------------------------------------------------------------------------- */

static zt_status find_checked(const ref_st_file *f, const char *name, int ndim,
                              const int64_t *shape, const ref_st_tensor **out, zt_error *err)
{
    const ref_st_tensor *t = ref_st_find(f, name);
    if (!t)
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "%s: no tensor \"%s\" (the file has %d); is this the right file?",
                            f->path, name, f->n_tensors);
    int same = !shape || t->ndim == ndim;
    for (int d = 0; same && shape && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char want[160] = "", got[160] = "";
        for (int d = 0; d < ndim; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
                     (long long)shape[d]);
        for (int d = 0; d < t->ndim; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                     (long long)t->shape[d]);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor \"%s\" has shape [%s], expected [%s]; the file does not "
                            "match the model configuration",
                            f->path, name, got, want);
    }
    *out = t;
    return ZT_OK;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | mantissa << 13; /* inf, NaN */
    } else if (exponent != 0) {
        bits = sign | (exponent + 112) << 23 | mantissa << 13; /* rebias 15 -> 127 */
    } else if (mantissa == 0) {
        bits = sign; /* zero */
    } else { /* subnormal half: normalize */
        exponent = 113;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            exponent--;
        }
        bits = sign | exponent << 23 | (mantissa & 0x3ffu) << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

zt_status ref_st_read_f32(const ref_st_file *f, const char *name, int ndim, const int64_t *shape,
                         float **out, zt_error *err)
{
    const ref_st_tensor *t;
    zt_status st = find_checked(f, name, ndim, shape, &t, err);
    if (st != ZT_OK) return st;
    if (t->dtype != ZT_F32 && t->dtype != ZT_F16 && t->dtype != ZT_BF16)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor \"%s\" is %s, expected a floating-point tensor (F32, F16 "
                            "or BF16)",
                            f->path, name, ref_st_dtype_name(t->dtype));
    float *x = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
    if (!x)
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory for tensor \"%s\"",
                            f->path, name);
    for (int64_t i = 0; i < t->numel; i++) {
        if (t->dtype == ZT_F32) {
            memcpy(&x[i], t->data + 4 * i, 4);
            continue;
        }
        uint16_t h;
        memcpy(&h, t->data + 2 * i, 2);
        if (t->dtype == ZT_F16) {
            x[i] = half_to_float(h);
        } else { /* bfloat16: the high half of a float */
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&x[i], &bits, 4);
        }
    }
    *out = x;
    return ZT_OK;
}

zt_status ref_st_read_i32(const ref_st_file *f, const char *name, int ndim, const int64_t *shape,
                         int32_t **out, zt_error *err)
{
    const ref_st_tensor *t;
    zt_status st = find_checked(f, name, ndim, shape, &t, err);
    if (st != ZT_OK) return st;
    if (t->dtype != ZT_I32 && t->dtype != ZT_I64)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor \"%s\" is %s, expected an integer tensor (I32 or I64)",
                            f->path, name, ref_st_dtype_name(t->dtype));
    int32_t *x = malloc(sizeof(int32_t) * (size_t)(t->numel ? t->numel : 1));
    if (!x)
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory for tensor \"%s\"",
                            f->path, name);
    for (int64_t i = 0; i < t->numel; i++) {
        if (t->dtype == ZT_I32) {
            memcpy(&x[i], t->data + 4 * i, 4);
            continue;
        }
        int64_t v;
        memcpy(&v, t->data + 8 * i, 8);
        if (v < INT32_MIN || v > INT32_MAX) {
            free(x);
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: tensor \"%s\" element %lld is %lld, outside the int32 range",
                                f->path, name, (long long)i, (long long)v);
        }
        x[i] = (int32_t)v;
    }
    *out = x;
    return ZT_OK;
}
