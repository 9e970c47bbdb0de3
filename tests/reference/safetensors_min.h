/* A minimal, strict reader of the safetensors format, for the kernel tests' reference fixtures.
 *
 * Minimal: the whole file is read into memory (no mmap), it only reads, and it knows the dtypes
 * the fixtures and HF LLaMA checkpoints use (F32, F16, BF16, I32, I64). Strict: every header
 * field is checked (types, shapes, offsets inside the file, sizes matching shapes, no overlaps),
 * and every failure says which file and tensor, what is wrong and what to do.
 * It exists beside framework/state/safetensors.c (the product's reader, which maps files and knows only the
 * floating-point dtypes weights use) because the fixtures also hold integer tensors (token ids,
 * labels). Its names carry the ref_st_ prefix so a test can link both.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {...}}
 * then the data; offsets are relative to the first byte after the header.
 */
#ifndef ZT_TESTS_SAFETENSORS_MIN_H
#define ZT_TESTS_SAFETENSORS_MIN_H

#include <stddef.h>
#include <stdint.h>
#include "base/error.h"
#include "zt/zt_types.h"

typedef struct ref_st_tensor {
    char *name;
    int dtype; /* zt_dtype: ZT_F32, ZT_F16, ZT_BF16, ZT_I32 or ZT_I64 */
    int ndim;
    int64_t shape[ZT_MAX_DIMS];
    int64_t numel;
    const unsigned char *data; /* inside ref_st_file.bytes; not aligned */
    uint64_t nbytes;
} ref_st_tensor;

typedef struct ref_st_file {
    char *path;
    unsigned char *bytes; /* the whole file */
    size_t size;
    ref_st_tensor *tensors; /* in file order of data_offsets */
    int n_tensors;
} ref_st_file;

/* Reads and validates `path`. On failure *out is left empty (safe to close). */
zt_status ref_st_open(const char *path, ref_st_file *out, zt_error *err);
/* Parses an in-memory file image (copied); `origin` names it in messages. */
zt_status ref_st_open_memory(const void *bytes, size_t size, const char *origin, ref_st_file *out,
                            zt_error *err);
void ref_st_close(ref_st_file *f);

/* The tensor called `name`, or NULL. */
const ref_st_tensor *ref_st_find(const ref_st_file *f, const char *name);

/* Tensor `name` converted to fp32 (from F32, F16 or BF16) in a new malloc'd array. When `shape`
 * is not NULL the tensor must have exactly that shape (ndim dimensions). */
zt_status ref_st_read_f32(const ref_st_file *f, const char *name, int ndim, const int64_t *shape,
                         float **out, zt_error *err);
/* Tensor `name` (I32 or I64, every value within int32) as int32 in a new malloc'd array. */
zt_status ref_st_read_i32(const ref_st_file *f, const char *name, int ndim, const int64_t *shape,
                         int32_t **out, zt_error *err);

const char *ref_st_dtype_name(int dtype);

#endif
