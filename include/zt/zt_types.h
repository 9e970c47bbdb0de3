/* zt plugin ABI v1: the basic types every other SDK header uses.
 *
 * Rules for everything under include/zt/:
 *  - Plain C, compiles as C99, C11 and C++17 with -Wall -Wextra -pedantic -Werror.
 *  - Fixed-width integers only in structs (no bool, no enums as struct fields: enum width is
 *    implementation-defined), so the layout is identical for every compiler on one platform.
 *  - Every versioned struct starts with a uint32_t struct_size. Minor versions only append fields;
 *    a reader checks struct_size before touching an appended field.
 *  - The layout of every v1 struct is frozen by the static asserts in zt_abi_check.h.
 */
#ifndef ZT_TYPES_H
#define ZT_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- versioning ------------------------------------------------------------------------------ */

#define ZT_ABI_MAGIC 0x3150545Au /* "ZTP1" read as little-endian bytes */
#define ZT_ABI_MAJOR 1u          /* incompatible change: every plugin must be rebuilt */
#define ZT_ABI_MINOR 5u          /* append-only change: older plugins keep working (1.1: optimizer
                                    compute_copy, zero begin_step; 1.2: fp16 loss scale in the unit
                                    call, fp16 compute copies; 1.3: the model info's rms_norm_eps and
                                    rope_theta, frozen regions of the layout, the zero frozen_range,
                                    the trainable flags of the estimate, KV cache reserve, prefix and
                                    stats ops, free memory in the cache descriptor; the adapter kind,
                                    the model's adapt op, ZT_PARAM_ADAPTER, ZT_INIT_UNIFORM,
                                    ZT_OPT_LIST; 1.4: tensor parallelism, the model's parallelize and
                                    param_shard ops, the parallel plan op; 1.5: the attention
                                    kv_prepare op, for CUDA graphs of the decode step) */

/* The one symbol a plugin exports (see zt_plugin.h). */
#define ZT_ENTRY_SYMBOL "zt_plugin_entry"

#if defined(_WIN32)
#define ZT_EXPORT __declspec(dllexport)
#else
#define ZT_EXPORT __attribute__((visibility("default")))
#endif

/* ---- status codes ---------------------------------------------------------------------------- */

/* Every fallible call returns one of these. A plugin that returns anything but ZT_OK should first
 * describe the failure with host->error(), so the user sees what went wrong, where, and how to fix it.
 * docs/plugins.md lists when to return each code. */
typedef enum zt_status {
    ZT_OK = 0,
    ZT_ERR_INVALID_ARG = 1,  /* the caller passed something malformed (NULL, bad shape, bad value) */
    ZT_ERR_UNSUPPORTED = 2,  /* valid request this plugin cannot do (dtype, device, feature) */
    ZT_ERR_OUT_OF_MEMORY = 3,/* an allocation failed or a pool limit was hit */
    ZT_ERR_IO = 4,           /* a file could not be read or written */
    ZT_ERR_FORMAT = 5,       /* a file or buffer is corrupt, truncated or of the wrong format */
    ZT_ERR_DEVICE = 6,       /* a CUDA/driver/cuBLAS error */
    ZT_ERR_COMM = 7,         /* a collective failed (peer died, NCCL/MPI error) */
    ZT_ERR_TIMEOUT = 8,      /* a wait exceeded its limit */
    ZT_ERR_CONFIG = 9,       /* a config value is missing, of the wrong type or out of range */
    ZT_ERR_NOT_FOUND = 10,   /* a named thing (key, tensor, file, group) does not exist */
    ZT_ERR_BUFFER_TOO_SMALL = 11, /* output capacity too small; the needed size was reported */
    ZT_ERR_CANCELLED = 12,   /* the user interrupted (Ctrl-C) */
    ZT_ERR_INTERNAL = 13     /* a bug: an invariant the plugin relies on does not hold */
} zt_status;

/* ---- plugin kinds ---------------------------------------------------------------------------- */

typedef enum zt_kind {
    ZT_KIND_TOKENIZER = 1,
    ZT_KIND_MODEL = 2,
    ZT_KIND_OPTIMIZER = 3,
    ZT_KIND_ZERO = 4,
    ZT_KIND_ATTENTION = 5,
    ZT_KIND_PARALLEL = 6,
    ZT_KIND_ADAPTER = 7 /* ABI 1.3: low-parameter fine-tuning (zt_adapter.h), e.g. lora */
} zt_kind;
#define ZT_KIND_COUNT 7

/* ---- element types and devices --------------------------------------------------------------- */

typedef enum zt_dtype {
    ZT_F32 = 0,
    ZT_BF16 = 1,
    ZT_F16 = 2,
    ZT_I32 = 3,
    ZT_I64 = 4,
    ZT_U8 = 5,
    ZT_U16 = 6,
    ZT_U32 = 7
} zt_dtype;

typedef enum zt_device_type {
    ZT_DEVICE_CPU = 0,
    ZT_DEVICE_CUDA = 1
} zt_device_type;

#define ZT_MAX_DIMS 6

/* A non-owning view of a strided tensor. Whoever created the view owns `data`; a view never frees.
 * Strides are in elements, not bytes. A contiguous row-major tensor has stride[ndim-1] == 1. */
typedef struct zt_tensor {
    void *data;
    int32_t dtype;       /* zt_dtype */
    int32_t device_type; /* zt_device_type */
    int32_t device_index;
    int32_t ndim;
    int64_t shape[ZT_MAX_DIMS];
    int64_t stride[ZT_MAX_DIMS];
} zt_tensor;

/* ---- options schema -------------------------------------------------------------------------- */

/* The value types an option can have. The host parses and range-checks every value before any
 * plugin's init, so a plugin reading its options through the host getters never sees a bad one. */
typedef enum zt_opt_type {
    ZT_OPT_BOOL = 0,
    ZT_OPT_INT = 1,    /* int64; JSON 5e8 is accepted when integral */
    ZT_OPT_FLOAT = 2,  /* double */
    ZT_OPT_STRING = 3,
    ZT_OPT_ENUM = 4,   /* a string out of `choices` */
    ZT_OPT_FLOATS = 5, /* a JSON array of numbers, e.g. betas [0.9, 0.999]; min/max bound each item */
    ZT_OPT_BYTES = 6   /* a size: integer bytes or a string with a unit, "512M", "24G", "1.5GiB" */
} zt_opt_type;

#define ZT_OPT_HAS_MIN 0x1u   /* value >= min */
#define ZT_OPT_HAS_MAX 0x2u   /* value <= max */
#define ZT_OPT_MIN_OPEN 0x4u  /* value > min instead of >= */
#define ZT_OPT_NO_DEFAULT 0x8u/* unset means "not given" (getter returns ZT_ERR_NOT_FOUND) */
#define ZT_OPT_LIST 0x10u     /* ABI 1.3, ZT_OPT_STRING only: also takes a JSON list of strings, which the
                                 host stores joined with commas ("q_proj,v_proj") */

/* One option a plugin understands. `key` is the full dotted config path, e.g.
 * "zero_optimization.offload_optimizer.device" or "optimizer.params.lr": zt shares DeepSpeed's key
 * names wherever the concept is the same, so a user's ds_config.json needs no rewriting.
 * All strings are static and owned by the plugin for as long as the .so is loaded. */
typedef struct zt_option {
    const char *key;
    int32_t type;              /* zt_opt_type */
    uint32_t flags;            /* ZT_OPT_* */
    const char *default_value; /* the default written as the user would write it, e.g. "0.9", "cpu" */
    double min;
    double max;
    const char *const *choices;/* ZT_OPT_ENUM: NULL-terminated list; NULL otherwise */
    const char *help;          /* one line shown by zt-run --describe */
} zt_option;

/* ---- capability flags ------------------------------------------------------------------------ */

#define ZT_CAP_CPU          (1ull << 0)  /* runs on the CPU path */
#define ZT_CAP_CUDA         (1ull << 1)  /* runs on NVIDIA GPUs */
#define ZT_CAP_MULTI_RANK   (1ull << 2)  /* correct with more than one rank */
#define ZT_CAP_BF16         (1ull << 3)
#define ZT_CAP_FP16         (1ull << 4)  /* GPU code in IEEE half too: fp16.enabled needs it of the model,
                                            zero and attention plugins */
#define ZT_CAP_OFFLOAD      (1ull << 5)  /* can keep state in host memory */
#define ZT_CAP_PACKED       (1ull << 6)  /* attention: honours document boundaries in packed rows */
#define ZT_CAP_KV_CACHE     (1ull << 7)  /* attention: supports decode against a KV cache */
#define ZT_CAP_GQA          (1ull << 8)  /* attention: grouped-query without repeating K/V */
#define ZT_CAP_RECOMPUTE    (1ull << 9)  /* model: activation checkpointing */
#define ZT_CAP_CONCURRENT   (1ull << 10) /* ops may be called from several threads at once (no
                                            host reads it yet: each op's tags say what it gets) */

/* ---- logging --------------------------------------------------------------------------------- */

typedef enum zt_log_level {
    ZT_LOG_DEBUG = 0,
    ZT_LOG_INFO = 1,
    ZT_LOG_WARN = 2,
    ZT_LOG_ERROR = 3
} zt_log_level;

#if defined(__GNUC__) || defined(__clang__)
#define ZT_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define ZT_PRINTF(fmt_index, first_arg)
#endif

#ifdef __cplusplus
}
#endif

#endif /* ZT_TYPES_H */
