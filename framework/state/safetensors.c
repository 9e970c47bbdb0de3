/* safetensors reading, conversion and writing (see safetensors.h for the format and the rules). */
#define _GNU_SOURCE /* open_memstream */

#include "state/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; zt reads it in place and needs a little-endian host"
#endif

/* The reference implementation refuses larger headers; so does zt, before allocating for one. */
#define ST_MAX_HEADER_BYTES 100000000ull
/* Elements converted per fill call while writing: bounds the writer's scratch memory (4 MiB). */
#define ST_WRITE_CHUNK ((uint64_t)1 << 20)

/* ---- dtypes ---------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[ZT_ST_DTYPE_COUNT] = {
    [ZT_ST_BOOL] = {"BOOL", 1},       [ZT_ST_U8] = {"U8", 1},
    [ZT_ST_I8] = {"I8", 1},           [ZT_ST_F8_E5M2] = {"F8_E5M2", 1},
    [ZT_ST_F8_E4M3] = {"F8_E4M3", 1}, [ZT_ST_F8_E8M0] = {"F8_E8M0", 1},
    [ZT_ST_I16] = {"I16", 2},         [ZT_ST_U16] = {"U16", 2},
    [ZT_ST_F16] = {"F16", 2},         [ZT_ST_BF16] = {"BF16", 2},
    [ZT_ST_I32] = {"I32", 4},         [ZT_ST_U32] = {"U32", 4},
    [ZT_ST_F32] = {"F32", 4},         [ZT_ST_F64] = {"F64", 8},
    [ZT_ST_I64] = {"I64", 8},         [ZT_ST_U64] = {"U64", 8},
    [ZT_ST_C64] = {"C64", 8},
};

const char *zt_st_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < ZT_ST_DTYPE_COUNT ? st_dtypes[dtype].name : "?";
}

size_t zt_st_dtype_size(int dtype)
{
    return dtype >= 0 && dtype < ZT_ST_DTYPE_COUNT ? st_dtypes[dtype].size : 0;
}

int zt_st_dtype_from_name(const char *name)
{
    for (int d = 0; d < ZT_ST_DTYPE_COUNT; d++) {
        if (strcmp(st_dtypes[d].name, name) == 0) return d;
    }
    return -1;
}

const char *zt_st_dtype_torch_name(int dtype)
{
    switch (dtype) {
    case ZT_ST_F32: return "float32";
    case ZT_ST_BF16: return "bfloat16";
    case ZT_ST_F16: return "float16";
    default: return NULL;
    }
}

static int is_float_dtype(int dtype)
{
    return dtype == ZT_ST_F32 || dtype == ZT_ST_BF16 || dtype == ZT_ST_F16;
}

/* ---- fp32 <-> bf16 / fp16 -------------------------------------------------------------------- */

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t zt_bf16_from_f32(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    /* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry out of the
     * mantissa correctly bumps the exponent (up to infinity). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float zt_f32_from_bf16(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* Round `value` right by `shift` bits to nearest, ties to even. */
static uint32_t round_shift_even(uint32_t value, unsigned shift)
{
    if (shift >= 32) return 0;
    uint32_t kept = value >> shift;
    uint32_t rest = value & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (kept & 1u))) kept++;
    return kept;
}

uint16_t zt_f16_from_f32(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    /* 65520 is halfway between 65504 (the largest half) and 65536: ties to even go to infinity. */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    unsigned exponent = a >> 23; /* biased by 127 */
    if (exponent < 113) {
        /* Below 2^-14: a half subnormal, in units of 2^-24. An fp32 denormal is far below 2^-25. */
        if (exponent == 0) return sign;
        uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
        return (uint16_t)(sign | round_shift_even(mantissa, 126u - exponent));
    }
    uint32_t h = ((exponent - 112u) << 10) | ((a & 0x7fffffu) >> 13);
    uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* a carry moves into the exponent */
    return (uint16_t)(sign | h);
}

float zt_f32_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0) {
        float v = (float)mantissa * (1.0f / 16777216.0f); /* mantissa * 2^-24, exact */
        return sign ? -v : v;
    }
    if (exponent == 31) return f32_from_bits(sign | 0x7f800000u | (mantissa << 13));
    return f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/* Convert n stored elements (unaligned bytes) to fp32. */
static void convert_to_f32(int dtype, const uint8_t *src, uint64_t n, float *dst)
{
    if (dtype == ZT_ST_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, sizeof h);
        dst[i] = dtype == ZT_ST_BF16 ? zt_f32_from_bf16(h) : zt_f32_from_f16(h);
    }
}

/* Convert n fp32 values into the stored form, in place in `buf` (fp16/bf16 shrink, so this works). */
static void convert_from_f32(int dtype, float *buf, uint64_t n)
{
    if (dtype == ZT_ST_F32) return;
    uint16_t *out = (uint16_t *)(void *)buf;
    for (uint64_t i = 0; i < n; i++) {
        float x = buf[i];
        uint16_t h = dtype == ZT_ST_BF16 ? zt_bf16_from_f32(x) : zt_f16_from_f32(x);
        memcpy(out + i, &h, sizeof h);
    }
}


/* ---- reading --------------------------------------------------------------------------------- */

struct zt_st_file {
    char *path;
    void *map;
    size_t size;
    const uint8_t *data;  /* the data section */
    uint64_t data_size;
    zt_st_tensor *tensors; /* sorted by name */
    size_t n_tensors;
    char **meta_keys;      /* "__metadata__", in file order */
    char **meta_values;
    size_t n_meta;
};

static void file_free(zt_st_file *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->size);
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    free(f);
}

void zt_st_close(zt_st_file *f) { file_free(f); }
const char *zt_st_path(const zt_st_file *f) { return f->path; }
size_t zt_st_count(const zt_st_file *f) { return f->n_tensors; }
const zt_st_tensor *zt_st_at(const zt_st_file *f, size_t i) { return &f->tensors[i]; }
const void *zt_st_data(const zt_st_file *f, const zt_st_tensor *t) { return f->data + t->begin; }

const char *zt_st_metadata(const zt_st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++) {
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    }
    return NULL;
}

static int compare_tensor_names(const void *a, const void *b)
{
    return strcmp(((const zt_st_tensor *)a)->name, ((const zt_st_tensor *)b)->name);
}

const zt_st_tensor *zt_st_find(const zt_st_file *f, const char *name)
{
    zt_st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, f->n_tensors, sizeof key, compare_tensor_names);
}

/* A JSON number token that is a plain non-negative integer (no sign, fraction or exponent) fitting
 * in uint64; 0 otherwise. Parsed from the text, as doubles lose precision past 2^53. */
static int json_u64(const zt_json *j, int tok, uint64_t *out)
{
    if (tok < 0 || j->tok[tok].type != ZT_JSON_PRIMITIVE) return 0;
    const char *s = j->text + j->tok[tok].start;
    int n = j->tok[tok].end - j->tok[tok].start;
    uint64_t v = 0;
    if (n == 0) return 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        if (v > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10) return 0;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 1;
}

/* Fill t from the tensor's header object `obj`. */
static zt_status parse_tensor_info(const zt_st_file *f, const zt_json *j, int obj, zt_st_tensor *t,
                                   zt_error *err)
{
    const char *p = f->path, *name = t->name;
    if (j->tok[obj].type != ZT_JSON_OBJECT) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor '%s': the header entry is not an object with dtype, shape "
                            "and data_offsets: file corrupt or not a safetensors file",
                            p, name);
    }
    int dtype_tok = zt_json_object_get(j, obj, "dtype");
    int shape_tok = zt_json_object_get(j, obj, "shape");
    int offsets_tok = zt_json_object_get(j, obj, "data_offsets");
    const char *missing = dtype_tok < 0 ? "dtype" : shape_tok < 0 ? "shape"
                        : offsets_tok < 0 ? "data_offsets" : NULL;
    if (missing) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor '%s' has no \"%s\" in the header: file corrupt or not a "
                            "safetensors file",
                            p, name, missing);
    }
    if (j->tok[dtype_tok].type != ZT_JSON_STRING) {
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is not a string", p,
                            name);
    }
    char dtype_name[32];
    int dlen = j->tok[dtype_tok].end - j->tok[dtype_tok].start;
    snprintf(dtype_name, sizeof dtype_name, "%.*s", dlen < 31 ? dlen : 31,
             j->text + j->tok[dtype_tok].start);
    t->dtype = dlen < 31 ? zt_st_dtype_from_name(dtype_name) : -1;
    if (t->dtype < 0) {
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has dtype '%s', which zt does not know (known: BOOL, "
                            "U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, "
                            "F64, I64, U64, C64); convert the model to F32, BF16 or F16",
                            p, name, dtype_name);
    }

    if (j->tok[shape_tok].type != ZT_JSON_ARRAY) {
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array", p,
                            name);
    }
    t->ndim = j->tok[shape_tok].size;
    if (t->ndim > ZT_ST_MAX_DIMS) {
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has %d dimensions; zt reads up to %d", p, name, t->ndim,
                            ZT_ST_MAX_DIMS);
    }
    t->numel = 1;
    int item = shape_tok + 1;
    for (int d = 0; d < t->ndim; d++, item = zt_json_skip(j, item)) {
        uint64_t dim;
        if (!json_u64(j, item, &dim) || dim > (uint64_t)INT64_MAX) {
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: tensor '%s': shape[%d] is '%.*s', not a non-negative integer",
                                p, name, d, j->tok[item].end - j->tok[item].start,
                                j->text + j->tok[item].start);
        }
        t->shape[d] = (int64_t)dim;
        if (__builtin_mul_overflow(t->numel, dim, &t->numel)) {
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: tensor '%s': the shape's element count overflows 64 bits: file "
                                "corrupt",
                                p, name);
        }
    }

    if (j->tok[offsets_tok].type != ZT_JSON_ARRAY || j->tok[offsets_tok].size != 2 ||
        !json_u64(j, offsets_tok + 1, &t->begin) || !json_u64(j, offsets_tok + 2, &t->end)) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor '%s': \"data_offsets\" must be [begin, end] with two "
                            "non-negative integers",
                            p, name);
    }
    if (t->begin > t->end) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                            "] end before they begin: file corrupt",
                            p, name, t->begin, t->end);
    }
    if (t->end > f->data_size) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                            "] exceed the data section (%" PRIu64 " bytes): file truncated or "
                            "corrupt",
                            p, name, t->begin, t->end, f->data_size);
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(t->numel, (uint64_t)zt_st_dtype_size(t->dtype), &bytes) ||
        bytes != t->end - t->begin) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor '%s' holds %" PRIu64 " bytes (data_offsets [%" PRIu64
                            ", %" PRIu64 "]) but its shape and dtype %s need %" PRIu64
                            " elements x %zu bytes: file corrupt",
                            p, name, t->end - t->begin, t->begin, t->end,
                            zt_st_dtype_name(t->dtype), t->numel, zt_st_dtype_size(t->dtype));
    }
    return ZT_OK;
}

static zt_status parse_metadata(zt_st_file *f, const zt_json *j, int obj, zt_error *err)
{
    if (j->tok[obj].type != ZT_JSON_OBJECT) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: \"__metadata__\" is not an object of strings: file corrupt", f->path);
    }
    size_t n = (size_t)j->tok[obj].size;
    f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_values = calloc(n ? n : 1, sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values) {
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", f->path);
    }
    int k = obj + 1;
    for (size_t i = 0; i < n; i++, k = zt_json_skip(j, k)) {
        zt_status st = zt_json_string(j, k, &f->meta_keys[i], NULL, err);
        if (st != ZT_OK) return st;
        f->n_meta = i + 1; /* owned from here on, even if the value fails */
        if (j->tok[k + 1].type != ZT_JSON_STRING) {
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: \"__metadata__\" value of '%s' is not a string (safetensors "
                                "metadata maps strings to strings)",
                                f->path, f->meta_keys[i]);
        }
        st = zt_json_string(j, k + 1, &f->meta_values[i], NULL, err);
        if (st != ZT_OK) return st;
    }
    return ZT_OK;
}

/* Parse the header JSON text[0, n) into f's tensors and metadata. */
static zt_status parse_header(zt_st_file *f, const char *text, size_t n, zt_error *err)
{
    size_t bad = 0;
    if (n == 0 || text[0] != '{') {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the header does not start with '{': not a safetensors file, or "
                            "corrupt",
                            f->path);
    }
    if (!zt_utf8_valid(text, n, &bad)) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the header is not valid UTF-8 (byte %zu of the header): file corrupt",
                            f->path, bad);
    }
    char origin[PATH_MAX + 16];
    snprintf(origin, sizeof origin, "%s header", f->path);
    zt_json j;
    zt_status st = zt_json_parse(text, n, origin, &j, err);
    if (st != ZT_OK) {
        zt_error_append(err, "\nThe safetensors header is corrupt: re-download or re-export the file.");
        return st;
    }
    if (j.tok[0].type != ZT_JSON_OBJECT) {
        zt_json_free(&j);
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: the header is not a JSON object", f->path);
    }
    size_t members = (size_t)j.tok[0].size;
    f->tensors = calloc(members ? members : 1, sizeof *f->tensors);
    if (!f->tensors) {
        zt_json_free(&j);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu tensors", f->path,
                            members);
    }
    int k = 1;
    for (size_t m = 0; m < members && st == ZT_OK; m++, k = zt_json_skip(&j, k)) {
        if (zt_json_eq(&j, k, "__metadata__")) {
            st = f->meta_keys ? zt_error_set(err, ZT_ERR_FORMAT,
                                             "%s: \"__metadata__\" appears twice in the header",
                                             f->path)
                              : parse_metadata(f, &j, k + 1, err);
            continue;
        }
        zt_st_tensor *t = &f->tensors[f->n_tensors];
        st = zt_json_string(&j, k, &t->name, NULL, err);
        if (st != ZT_OK) break;
        f->n_tensors++;
        st = parse_tensor_info(f, &j, k + 1, t, err);
    }
    zt_json_free(&j);
    return st;
}

static int compare_by_offset(const void *a, const void *b)
{
    const zt_st_tensor *x = *(const zt_st_tensor *const *)a, *y = *(const zt_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Names unique; the tensors tile the data section: no overlap, no gap, nothing after the last. */
static zt_status check_layout(zt_st_file *f, zt_error *err)
{
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, compare_tensor_names);
    for (size_t i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: tensor '%s' appears twice in the header: file corrupt", f->path,
                                f->tensors[i].name);
        }
    }
    zt_st_tensor **by_offset = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof *by_offset);
    if (!by_offset) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", f->path);
    for (size_t i = 0; i < f->n_tensors; i++) by_offset[i] = &f->tensors[i];
    qsort(by_offset, f->n_tensors, sizeof *by_offset, compare_by_offset);
    zt_status st = ZT_OK;
    uint64_t covered = 0;
    const zt_st_tensor *previous = NULL;
    for (size_t i = 0; i < f->n_tensors && st == ZT_OK; i++) {
        const zt_st_tensor *t = by_offset[i];
        if (t->begin < covered) {
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                              "] overlap tensor '%s' [%" PRIu64 ", %" PRIu64 "]: file corrupt",
                              f->path, t->name, t->begin, t->end, previous->name, previous->begin,
                              previous->end);
        } else if (t->begin > covered) {
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s: bytes [%" PRIu64 ", %" PRIu64 ") of the data section belong to "
                              "no tensor (before tensor '%s'); safetensors requires tensors to be "
                              "contiguous: file corrupt",
                              f->path, covered, t->begin, t->name);
        }
        covered = t->end;
        previous = t;
    }
    free(by_offset);
    if (st == ZT_OK && covered != f->data_size) {
        st = zt_error_set(err, ZT_ERR_FORMAT,
                          "%s: the file has %" PRIu64 " bytes after the last tensor's data (the "
                          "tensors cover %" PRIu64 " of %" PRIu64 " data bytes): file corrupt or "
                          "appended to",
                          f->path, f->data_size - covered, covered, f->data_size);
    }
    return st;
}

zt_status zt_st_open(const char *path, zt_st_file **out, zt_error *err)
{
    *out = NULL;
    zt_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening '%s'", path);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        zt_status st = zt_error_set(err, errno == ENOENT ? ZT_ERR_NOT_FOUND : ZT_ERR_IO,
                                    "cannot open '%s': %s", path, strerror(errno));
        file_free(f);
        return st;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        zt_status st = zt_error_set(err, ZT_ERR_IO, "'%s' is not a regular file", path);
        close(fd);
        file_free(f);
        return st;
    }
    f->size = (size_t)sb.st_size;
    if (f->size < 8) {
        close(fd);
        zt_status st = zt_error_set(err, ZT_ERR_FORMAT,
                                    "%s: the file is %zu bytes, shorter than the 8-byte header "
                                    "length: file truncated or not a safetensors file",
                                    path, f->size);
        file_free(f);
        return st;
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        zt_status st = zt_error_set(err, ZT_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
        file_free(f);
        return st;
    }
    uint64_t header_len;
    memcpy(&header_len, f->map, sizeof header_len);
    zt_status st = ZT_OK;
    if (header_len > f->size - 8) {
        st = zt_error_set(err, ZT_ERR_FORMAT,
                          "%s: the header length %" PRIu64 " exceeds the file (%zu bytes): file "
                          "truncated or not a safetensors file",
                          path, header_len, f->size);
    } else if (header_len > ST_MAX_HEADER_BYTES) {
        st = zt_error_set(err, ZT_ERR_FORMAT,
                          "%s: the header is %" PRIu64 " bytes; safetensors allows at most %llu: "
                          "file corrupt",
                          path, header_len, ST_MAX_HEADER_BYTES);
    }
    if (st == ZT_OK) {
        f->data = (const uint8_t *)f->map + 8 + header_len;
        f->data_size = f->size - 8 - header_len;
        st = parse_header(f, (const char *)f->map + 8, (size_t)header_len, err);
    }
    if (st == ZT_OK) st = check_layout(f, err);
    if (st != ZT_OK) {
        file_free(f);
        return st;
    }
    *out = f;
    return ZT_OK;
}

zt_status zt_st_read_f32(const zt_st_file *f, const zt_st_tensor *t, uint64_t elem_offset,
                         uint64_t count, float *dst, zt_error *err)
{
    if (!is_float_dtype(t->dtype)) {
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has dtype %s; zt converts only F32, BF16 and F16 to "
                            "fp32",
                            f->path, t->name, zt_st_dtype_name(t->dtype));
    }
    if (elem_offset > t->numel || count > t->numel - elem_offset) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "%s: elements [%" PRIu64 ", %" PRIu64 ") asked of tensor '%s', which "
                            "has %" PRIu64,
                            f->path, elem_offset, elem_offset + count, t->name, t->numel);
    }
    size_t esize = zt_st_dtype_size(t->dtype);
    convert_to_f32(t->dtype, f->data + t->begin + elem_offset * esize, count, dst);
    return ZT_OK;
}

static int is_nonfinite_bits(const float *x)
{
    uint32_t bits;
    memcpy(&bits, x, sizeof bits); /* NaN and infinity: the exponent all ones */
    return (bits & 0x7f800000u) == 0x7f800000u;
}

int64_t zt_st_find_nonfinite(const float *x, uint64_t n)
{
    /* 64 at a time without a branch per element: the common case (none) stays a tight loop */
    for (uint64_t i = 0; i < n; i += 64) {
        uint64_t end = n - i < 64 ? n : i + 64;
        int any = 0;
        for (uint64_t k = i; k < end; k++) any |= is_nonfinite_bits(x + k);
        if (!any) continue;
        for (uint64_t k = i; k < end; k++)
            if (is_nonfinite_bits(x + k)) return (int64_t)k;
    }
    return -1;
}

const char *zt_st_nonfinite_name(float v) { return isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf"; }

/* ---- writing --------------------------------------------------------------------------------- */

static uint64_t spec_numel(const zt_st_tensor_spec *t)
{
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

static uint64_t spec_bytes(const zt_st_tensor_spec *t)
{
    return spec_numel(t) * zt_st_dtype_size(t->dtype);
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static zt_status check_specs(const char *what, const zt_st_tensor_spec *tensors, size_t n,
                             zt_error *err)
{
    const char **names = malloc((n ? n : 1) * sizeof *names);
    if (!names) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    zt_status st = ZT_OK;
    for (size_t i = 0; i < n && st == ZT_OK; i++) {
        const zt_st_tensor_spec *t = &tensors[i];
        names[i] = t->name ? t->name : "";
        if (!t->name || !t->name[0] || strcmp(t->name, "__metadata__") == 0) {
            st = zt_error_set(err, ZT_ERR_INVALID_ARG, "%s: tensor %zu has an invalid name '%s'",
                              what, i, names[i]);
        } else if (!is_float_dtype(t->dtype)) {
            st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                              "%s: tensor '%s': zt writes F32, BF16 or F16, not %s", what,
                              t->name, zt_st_dtype_name(t->dtype));
        } else if (t->ndim < 0 || t->ndim > ZT_ST_MAX_DIMS) {
            st = zt_error_set(err, ZT_ERR_INVALID_ARG, "%s: tensor '%s' has %d dimensions", what,
                              t->name, t->ndim);
        }
        for (int d = 0; st == ZT_OK && d < t->ndim; d++) {
            if (t->shape[d] < 0) {
                st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                                  "%s: tensor '%s' has a negative dimension %" PRId64, what,
                                  t->name, t->shape[d]);
            }
        }
    }
    if (st == ZT_OK) {
        qsort(names, n, sizeof *names, compare_strings);
        for (size_t i = 1; i < n && st == ZT_OK; i++) {
            if (strcmp(names[i - 1], names[i]) == 0) {
                st = zt_error_set(err, ZT_ERR_INVALID_ARG, "%s: tensor '%s' is given twice", what,
                                  names[i]);
            }
        }
    }
    free(names);
    return st;
}

/* The header JSON for tensors[which[0..n)], padded with spaces so the data section starts at a
 * multiple of 8 bytes (as the reference writer does). */
static zt_status build_header(const zt_st_tensor_spec *tensors, const size_t *which, size_t n,
                              char **out, size_t *out_len, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for a safetensors header");
    fputs("{\"__metadata__\":{\"format\":\"pt\"}", m);
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const zt_st_tensor_spec *t = &tensors[which[i]];
        fputc(',', m);
        zt_json_write_string(m, t->name, strlen(t->name));
        fprintf(m, ":{\"dtype\":\"%s\",\"shape\":[", zt_st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) fprintf(m, "%s%" PRId64, d ? "," : "", t->shape[d]);
        uint64_t bytes = spec_bytes(t);
        fprintf(m, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset, offset + bytes);
        offset += bytes;
    }
    fputc('}', m);
    for (long pos = ftell(m); pos % 8 != 0; pos++) fputc(' ', m);
    if (fclose(m) != 0 || !text) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for a safetensors header");
    }
    *out = text;
    *out_len = len;
    return ZT_OK;
}

/* Write tensors[which[0..n)] to path. */
static zt_status write_file(const char *path, const zt_st_tensor_spec *tensors, const size_t *which,
                            size_t n, zt_st_fill_fn fill, void *ctx, zt_error *err)
{
    char *header = NULL;
    size_t header_len = 0;
    zt_status st = build_header(tensors, which, n, &header, &header_len, err);
    if (st != ZT_OK) return st;
    float *chunk = malloc(ST_WRITE_CHUNK * sizeof *chunk);
    if (!chunk) {
        free(header);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", path);
    }
    zt_atomic_file f;
    st = zt_atomic_file_open(&f, path, err);
    if (st == ZT_OK) {
        uint64_t len64 = header_len;
        st = zt_atomic_file_write(&f, &len64, sizeof len64, err);
        if (st == ZT_OK) st = zt_atomic_file_write(&f, header, header_len, err);
        for (size_t i = 0; i < n && st == ZT_OK; i++) {
            const zt_st_tensor_spec *t = &tensors[which[i]];
            uint64_t numel = spec_numel(t);
            for (uint64_t at = 0; at < numel && st == ZT_OK; at += ST_WRITE_CHUNK) {
                uint64_t count = numel - at < ST_WRITE_CHUNK ? numel - at : ST_WRITE_CHUNK;
                st = fill(ctx, which[i], at, count, chunk, err);
                if (st != ZT_OK) {
                    zt_error_append(err, "\n(while writing tensor '%s' to '%s')", t->name, path);
                    break;
                }
                convert_from_f32(t->dtype, chunk, count);
                st = zt_atomic_file_write(&f, chunk, count * zt_st_dtype_size(t->dtype), err);
            }
        }
        if (st == ZT_OK) {
            st = zt_atomic_file_commit(&f, err);
        } else {
            zt_atomic_file_abort(&f);
        }
    }
    free(chunk);
    free(header);
    return st;
}

zt_status zt_st_write(const char *path, const zt_st_tensor_spec *tensors, size_t n,
                      zt_st_fill_fn fill, void *ctx, zt_error *err)
{
    zt_status st = check_specs(path, tensors, n, err);
    if (st != ZT_OK) return st;
    size_t *which = malloc((n ? n : 1) * sizeof *which);
    if (!which) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", path);
    for (size_t i = 0; i < n; i++) which[i] = i;
    st = write_file(path, tensors, which, n, fill, ctx, err);
    free(which);
    return st;
}

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A shard file name from an index: plain, inside the model directory. */
static int plain_file_name(const char *name)
{
    return name[0] && name[0] != '.' && !strchr(name, '/') && !strchr(name, '\\');
}

/* Read dir/model.safetensors.index.json into *text and *j (weight_map at *weight_map). */
static zt_status load_index(const char *index_path, char **text, zt_json *j, int *weight_map,
                            zt_error *err)
{
    memset(j, 0, sizeof *j);
    char *buf;
    size_t len;
    zt_status st = zt_read_file(index_path, &buf, &len, err);
    *text = NULL;
    if (st != ZT_OK) return st;
    st = zt_json_parse(buf, len, index_path, j, err);
    if (st == ZT_OK) {
        *weight_map = zt_json_object_get(j, 0, "weight_map");
        if (j->tok[0].type != ZT_JSON_OBJECT || *weight_map < 0 ||
            j->tok[*weight_map].type != ZT_JSON_OBJECT) {
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s: expected an object with a \"weight_map\" object (tensor name -> "
                              "shard file), as transformers writes",
                              index_path);
        }
    }
    if (st != ZT_OK) {
        zt_json_free(j);
        free(buf);
        return st;
    }
    *text = buf;
    return ZT_OK;
}

/* Remove weight files of an earlier save that the new save does not use. old_files come from the
 * earlier index (read before it was overwritten); keep lists the files just written. */
static void remove_stale_weights(const char *dir, char **old_files, size_t n_old,
                                 char *const *keep, size_t n_keep)
{
    for (size_t i = 0; i < n_old; i++) {
        int used = 0;
        for (size_t k = 0; k < n_keep && !used; k++) used = strcmp(old_files[i], keep[k]) == 0;
        if (used) continue;
        char *p = path_join(dir, old_files[i]);
        if (p) unlink(p);
        free(p);
    }
}

/* Files named by the existing index in dir, if any (for cleanup after a new save). */
static void old_index_files(const char *index_path, char ***out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    char *text;
    zt_json j;
    int map;
    zt_error ignored;
    if (load_index(index_path, &text, &j, &map, &ignored) != ZT_OK) return;
    size_t n = (size_t)j.tok[map].size, count = 0;
    char **files = calloc(n ? n : 1, sizeof *files);
    int k = map + 1;
    for (size_t i = 0; files && i < n; i++, k = zt_json_skip(&j, k)) {
        char *name = NULL;
        if (zt_json_string(&j, k + 1, &name, NULL, &ignored) != ZT_OK) continue;
        int seen = !plain_file_name(name);
        for (size_t c = 0; c < count && !seen; c++) seen = strcmp(files[c], name) == 0;
        if (seen) {
            free(name);
        } else {
            files[count++] = name;
        }
    }
    zt_json_free(&j);
    free(text);
    *out = files;
    *n_out = files ? count : 0;
}

zt_status zt_st_write_model(const char *dir, const zt_st_tensor_spec *tensors, size_t n,
                            zt_st_fill_fn fill, void *ctx, uint64_t max_shard_bytes,
                            zt_error *err)
{
    if (max_shard_bytes == 0) max_shard_bytes = ZT_ST_DEFAULT_MAX_SHARD_BYTES;
    zt_status st = check_specs(dir, tensors, n, err);
    if (st != ZT_OK) return st;

    /* Plan: shard_of[i] for each tensor, greedily in order. */
    size_t *shard_of = malloc((n ? n : 1) * sizeof *shard_of);
    size_t *which = malloc((n ? n : 1) * sizeof *which);
    char *index_path = path_join(dir, ZT_ST_INDEX_NAME);
    char *single_path = path_join(dir, ZT_ST_SINGLE_NAME);
    if (!shard_of || !which || !index_path || !single_path) {
        free(shard_of);
        free(which);
        free(index_path);
        free(single_path);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", dir);
    }
    size_t n_shards = 1;
    uint64_t in_shard = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = spec_bytes(&tensors[i]);
        if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
            n_shards++;
            in_shard = 0;
        }
        shard_of[i] = n_shards - 1;
        in_shard += bytes;
        total += bytes;
    }

    char **old_files;
    size_t n_old;
    old_index_files(index_path, &old_files, &n_old);

    char **names = calloc(n_shards, sizeof *names);
    if (!names) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", dir);
    for (size_t s = 0; s < n_shards && st == ZT_OK; s++) {
        names[s] = malloc(64);
        if (!names[s]) {
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", dir);
            break;
        }
        if (n_shards == 1) {
            snprintf(names[s], 64, "%s", ZT_ST_SINGLE_NAME);
        } else {
            snprintf(names[s], 64, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
        }
        size_t count = 0;
        for (size_t i = 0; i < n; i++) {
            if (shard_of[i] == s) which[count++] = i;
        }
        char *path = path_join(dir, names[s]);
        st = path ? write_file(path, tensors, which, count, fill, ctx, err)
                  : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", dir);
        free(path);
    }

    if (st == ZT_OK && n_shards > 1) {
        /* transformers writes the index with sorted keys; so does zt. */
        size_t *by_name = which;
        for (size_t i = 0; i < n; i++) by_name[i] = i;
        for (size_t i = 1; i < n; i++) { /* insertion sort: stable, n is a few hundred */
            size_t v = by_name[i], k = i;
            while (k > 0 && strcmp(tensors[by_name[k - 1]].name, tensors[v].name) > 0) {
                by_name[k] = by_name[k - 1];
                k--;
            }
            by_name[k] = v;
        }
        char *text = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&text, &len);
        if (!m) {
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", index_path);
        } else {
            fprintf(m, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n"
                       "  \"weight_map\": {",
                    total);
            for (size_t i = 0; i < n; i++) {
                const zt_st_tensor_spec *t = &tensors[by_name[i]];
                fputs(i ? ",\n    " : "\n    ", m);
                zt_json_write_string(m, t->name, strlen(t->name));
                fprintf(m, ": \"%s\"", names[shard_of[by_name[i]]]);
            }
            fputs("\n  }\n}\n", m);
            if (fclose(m) != 0 || !text) {
                st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'",
                                  index_path);
            } else {
                st = zt_atomic_write(index_path, text, len, err);
            }
            free(text);
        }
    }

    if (st == ZT_OK) {
        /* The new set is complete: now drop what would make a reader see an older or mixed model
         * (transformers prefers model.safetensors over an index, so a stale one must go). */
        remove_stale_weights(dir, old_files, n_old, names, n_shards);
        if (n_shards > 1) {
            unlink(single_path);
        } else if (file_exists(index_path)) {
            unlink(index_path);
        }
        st = zt_fsync_dir(dir, err);
    }
    for (size_t i = 0; i < n_old; i++) free(old_files[i]);
    free(old_files);
    for (size_t s = 0; names && s < n_shards; s++) free(names[s]);
    free(names);
    free(shard_of);
    free(which);
    free(index_path);
    free(single_path);
    return st;
}

/* ---- sets ------------------------------------------------------------------------------------ */

typedef struct set_entry {
    const zt_st_tensor *tensor;
    const zt_st_file *file;
} set_entry;

struct zt_st_set {
    zt_st_file **files;
    size_t n_files;
    set_entry *entries; /* sorted by name */
    size_t n_entries;
    int sharded;
};

void zt_st_set_close(zt_st_set *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n_files; i++) zt_st_close(s->files[i]);
    free(s->files);
    free(s->entries);
    free(s);
}

size_t zt_st_set_count(const zt_st_set *s) { return s->n_entries; }
int zt_st_set_sharded(const zt_st_set *s) { return s->sharded; }

const zt_st_tensor *zt_st_set_at(const zt_st_set *s, size_t i, const zt_st_file **file)
{
    if (file) *file = s->entries[i].file;
    return s->entries[i].tensor;
}

static int compare_entries(const void *a, const void *b)
{
    return strcmp(((const set_entry *)a)->tensor->name, ((const set_entry *)b)->tensor->name);
}

const zt_st_tensor *zt_st_set_find(const zt_st_set *s, const char *name, const zt_st_file **file)
{
    zt_st_tensor key_tensor = {.name = (char *)name};
    set_entry key = {.tensor = &key_tensor};
    const set_entry *e = bsearch(&key, s->entries, s->n_entries, sizeof key, compare_entries);
    if (file) *file = e ? e->file : NULL;
    return e ? e->tensor : NULL;
}

/* Index every tensor of every file; a name in two files is an error. */
static zt_status build_entries(zt_st_set *s, const char *dir, zt_error *err)
{
    size_t total = 0;
    for (size_t i = 0; i < s->n_files; i++) total += zt_st_count(s->files[i]);
    s->entries = malloc((total ? total : 1) * sizeof *s->entries);
    if (!s->entries) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    for (size_t i = 0; i < s->n_files; i++) {
        for (size_t k = 0; k < zt_st_count(s->files[i]); k++) {
            s->entries[s->n_entries++] = (set_entry){zt_st_at(s->files[i], k), s->files[i]};
        }
    }
    qsort(s->entries, s->n_entries, sizeof *s->entries, compare_entries);
    for (size_t i = 1; i < s->n_entries; i++) {
        if (strcmp(s->entries[i - 1].tensor->name, s->entries[i].tensor->name) == 0) {
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: tensor '%s' is stored in both '%s' and '%s'; which one is "
                                "meant is ambiguous: remove the stale shard",
                                dir, s->entries[i].tensor->name, zt_st_path(s->entries[i - 1].file),
                                zt_st_path(s->entries[i].file));
        }
    }
    return ZT_OK;
}

static zt_status open_sharded(zt_st_set *s, const char *dir, const char *index_path, zt_error *err)
{
    char *text;
    zt_json j;
    int map;
    zt_status st = load_index(index_path, &text, &j, &map, err);
    if (st != ZT_OK) return st;
    size_t n = (size_t)j.tok[map].size;
    char **tensor_names = calloc(n ? n : 1, sizeof *tensor_names);
    char **file_names = calloc(n ? n : 1, sizeof *file_names);
    s->files = calloc(n ? n : 1, sizeof *s->files);
    if (!tensor_names || !file_names || !s->files) {
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path);
    }
    int k = map + 1;
    for (size_t i = 0; i < n && st == ZT_OK; i++, k = zt_json_skip(&j, k)) {
        st = zt_json_string(&j, k, &tensor_names[i], NULL, err);
        if (st != ZT_OK) break;
        if (j.tok[k + 1].type != ZT_JSON_STRING) {
            int line, col;
            zt_json_line_col(j.text, (size_t)j.tok[k + 1].start, &line, &col);
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s:%d:%d: weight_map entry of '%s' is not a file name string",
                              index_path, line, col, tensor_names[i]);
            break;
        }
        st = zt_json_string(&j, k + 1, &file_names[i], NULL, err);
        if (st != ZT_OK) break;
        if (!plain_file_name(file_names[i])) {
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s: weight_map puts tensor '%s' in '%s'; shard names must be plain "
                              "file names inside the model directory",
                              index_path, tensor_names[i], file_names[i]);
            break;
        }
        char *path = path_join(dir, file_names[i]);
        if (!path) {
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path);
            break;
        }
        size_t f = 0;
        while (f < s->n_files && strcmp(zt_st_path(s->files[f]), path) != 0) f++;
        if (f == s->n_files) {
            st = zt_st_open(path, &s->files[f], err);
            if (st != ZT_OK) {
                zt_error_append(err, "\n(a shard named by %s, for tensor '%s')", index_path,
                                tensor_names[i]);
            } else {
                s->n_files++;
            }
        }
        free(path);
        if (st != ZT_OK) break;
        if (!zt_st_find(s->files[f], tensor_names[i])) {
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s: weight_map says tensor '%s' is in '%s', but that file has no "
                              "such tensor: the index and the shards do not belong together",
                              index_path, tensor_names[i], file_names[i]);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (tensor_names) free(tensor_names[i]);
        if (file_names) free(file_names[i]);
    }
    free(tensor_names);
    free(file_names);
    zt_json_free(&j);
    free(text);
    if (st == ZT_OK && n == 0) {
        st = zt_error_set(err, ZT_ERR_FORMAT, "%s: the weight_map is empty", index_path);
    }
    return st;
}

zt_status zt_st_set_open(const char *dir, zt_st_set **out, zt_error *err)
{
    *out = NULL;
    zt_st_set *s = calloc(1, sizeof *s);
    char *single = path_join(dir, ZT_ST_SINGLE_NAME);
    char *index = path_join(dir, ZT_ST_INDEX_NAME);
    zt_status st = ZT_OK;
    if (!s || !single || !index) {
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening '%s'", dir);
    } else if (file_exists(single) && file_exists(index)) {
        st = zt_error_set(err, ZT_ERR_FORMAT,
                          "%s has both %s and %s; one of them is left over from another save: "
                          "remove the stale one",
                          dir, ZT_ST_SINGLE_NAME, ZT_ST_INDEX_NAME);
    } else if (file_exists(single)) {
        s->files = calloc(1, sizeof *s->files);
        st = s->files ? zt_st_open(single, &s->files[0], err)
                      : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening '%s'", dir);
        if (st == ZT_OK) s->n_files = 1;
    } else if (file_exists(index)) {
        s->sharded = 1;
        st = open_sharded(s, dir, index, err);
    } else {
        char *bin = path_join(dir, "pytorch_model.bin");
        int has_bin = bin && file_exists(bin);
        free(bin);
        st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                          "%s has neither %s nor %s%s", dir, ZT_ST_SINGLE_NAME, ZT_ST_INDEX_NAME,
                          has_bin ? "; it has pytorch_model.bin, which zt does not read (pickle): "
                                    "convert it with transformers' save_pretrained("
                                    "safe_serialization=True)"
                                  : ": is this a Hugging Face model directory?");
    }
    if (st == ZT_OK) st = build_entries(s, dir, err);
    free(single);
    free(index);
    if (st != ZT_OK) {
        zt_st_set_close(s);
        return st;
    }
    *out = s;
    return ZT_OK;
}
