/* Hugging Face safetensors files: reading (mmap, fully validated), conversion of F32/F16/BF16 to
 * fp32, and writing single files or sharded sets with model.safetensors.index.json.
 *
 * The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N
 * bytes of JSON header, then the data section. The header maps each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative to the data section, plus an
 * optional "__metadata__" object of strings. zt validates what the reference implementation
 * validates: the tensors tile the data section exactly (no gap, no overlap, nothing after the last
 * one) and each one's byte size is numel * dtype size. Every error names the file, the tensor and the
 * problem.
 */
#ifndef ZT_FRAMEWORK_SAFETENSORS_H
#define ZT_FRAMEWORK_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "base/error.h"
#include "base/fileio.h"

/* ---- dtypes ---------------------------------------------------------------------------------- */

/* Every dtype of the safetensors spec with a whole-byte element size. Reading accepts them all (so a
 * file with int64 buffers still opens); conversion to fp32 handles F32, F16 and BF16. */
typedef enum zt_st_dtype {
    ZT_ST_BOOL,
    ZT_ST_U8,
    ZT_ST_I8,
    ZT_ST_F8_E5M2,
    ZT_ST_F8_E4M3,
    ZT_ST_F8_E8M0,
    ZT_ST_I16,
    ZT_ST_U16,
    ZT_ST_F16,
    ZT_ST_BF16,
    ZT_ST_I32,
    ZT_ST_U32,
    ZT_ST_F32,
    ZT_ST_F64,
    ZT_ST_I64,
    ZT_ST_U64,
    ZT_ST_C64,
    ZT_ST_DTYPE_COUNT
} zt_st_dtype;

const char *zt_st_dtype_name(int dtype);           /* "BF16" */
size_t zt_st_dtype_size(int dtype);                /* bytes per element */
int zt_st_dtype_from_name(const char *name);       /* -1 when unknown */
/* The torch_dtype string of config.json ("float32", "bfloat16", "float16"), or NULL. */
const char *zt_st_dtype_torch_name(int dtype);

/* fp32 <-> bf16/fp16 bit patterns. Narrowing rounds to nearest, ties to even (as PyTorch does);
 * values beyond the range become infinity and NaN stays a (quiet) NaN. */
uint16_t zt_bf16_from_f32(float x);
float zt_f32_from_bf16(uint16_t h);
uint16_t zt_f16_from_f32(float x);
float zt_f32_from_f16(uint16_t h);

/* ---- reading --------------------------------------------------------------------------------- */

#define ZT_ST_MAX_DIMS 8

typedef struct zt_st_tensor {
    char *name;
    int32_t dtype;            /* zt_st_dtype */
    int32_t ndim;
    int64_t shape[ZT_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;      /* byte range inside the data section */
} zt_st_tensor;

typedef struct zt_st_file zt_st_file;

/* Map and validate `path`. The file stays mapped until zt_st_close. */
zt_status zt_st_open(const char *path, zt_st_file **out, zt_error *err);
void zt_st_close(zt_st_file *f);

const char *zt_st_path(const zt_st_file *f);
size_t zt_st_count(const zt_st_file *f);
/* Tensors in name order; i < zt_st_count(f). */
const zt_st_tensor *zt_st_at(const zt_st_file *f, size_t i);
const zt_st_tensor *zt_st_find(const zt_st_file *f, const char *name); /* NULL when absent */
/* A "__metadata__" value, or NULL. */
const char *zt_st_metadata(const zt_st_file *f, const char *key);
/* The tensor's raw bytes (little-endian, as stored). */
const void *zt_st_data(const zt_st_file *f, const zt_st_tensor *t);

/* Convert elements [elem_offset, elem_offset + count) of the flattened tensor to fp32 in dst. */
zt_status zt_st_read_f32(const zt_st_file *f, const zt_st_tensor *t, uint64_t elem_offset,
                         uint64_t count, float *dst, zt_error *err);

/* Index of the first NaN or infinity of x[0, n), or -1. The model readers (hf_model.c, llama2c.c,
 * checkpoint_read.c) refuse weights with one: a single non-finite weight makes every loss and
 * gradient non-finite, so training would skip every step and generation emit garbage. */
int64_t zt_st_find_nonfinite(const float *x, uint64_t n);
/* "NaN", "+inf" or "-inf": what a non-finite value is, for messages. */
const char *zt_st_nonfinite_name(float v);

/* ---- writing --------------------------------------------------------------------------------- */

/* One tensor to write: stored as `dtype` (ZT_ST_F32, ZT_ST_BF16 or ZT_ST_F16), converted from the
 * fp32 values the fill callback supplies. */
typedef struct zt_st_tensor_spec {
    const char *name;
    int32_t dtype;
    int32_t ndim;
    int64_t shape[ZT_ST_MAX_DIMS];
} zt_st_tensor_spec;

/* Supplies fp32 values [elem_offset, elem_offset + count) of tensor `index` (its position in the
 * array given to the writer) into dst. Called in order, in chunks, so a tensor never has to be held
 * whole in memory. Return ZT_OK, or a status with err filled. */
typedef zt_status (*zt_st_fill_fn)(void *ctx, size_t index, uint64_t elem_offset, uint64_t count,
                                   float *dst, zt_error *err);

/* Write one .safetensors file atomically, with "__metadata__": {"format": "pt"}. */
zt_status zt_st_write(const char *path, const zt_st_tensor_spec *tensors, size_t n,
                      zt_st_fill_fn fill, void *ctx, zt_error *err);

#define ZT_ST_DEFAULT_MAX_SHARD_BYTES (5000ull * 1000 * 1000) /* 5 GB, as transformers */

/* Write the weights of a model directory as transformers does: dir/model.safetensors when the data
 * fits in max_shard_bytes (0: the default), else dir/model-0000i-of-0000n.safetensors plus
 * dir/model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}). Tensors keep their
 * order; a new shard starts when the next tensor would overflow the current one (a tensor larger than
 * the limit gets a shard of its own). Each file is atomic; the index is written after the shards, and
 * only then are weight files of an earlier save that the new set does not use removed. */
zt_status zt_st_write_model(const char *dir, const zt_st_tensor_spec *tensors, size_t n,
                            zt_st_fill_fn fill, void *ctx, uint64_t max_shard_bytes,
                            zt_error *err);

/* ---- a model directory's weights: one file or an index of shards ----------------------------- */

#define ZT_ST_SINGLE_NAME "model.safetensors"
#define ZT_ST_INDEX_NAME "model.safetensors.index.json"

typedef struct zt_st_set zt_st_set;

/* Open dir/model.safetensors, or every shard that dir/model.safetensors.index.json names (each
 * weight_map entry is checked to exist in its shard). */
zt_status zt_st_set_open(const char *dir, zt_st_set **out, zt_error *err);
void zt_st_set_close(zt_st_set *s);
size_t zt_st_set_count(const zt_st_set *s);
/* Tensors of the whole set in name order; *file receives the shard holding it. */
const zt_st_tensor *zt_st_set_at(const zt_st_set *s, size_t i, const zt_st_file **file);
const zt_st_tensor *zt_st_set_find(const zt_st_set *s, const char *name, const zt_st_file **file);
/* 1 when the set came from an index. */
int zt_st_set_sharded(const zt_st_set *s);

#endif
