/* The flat parameter layout (zt_layout of include/zt/zt_train.h) and deterministic initialisation.
 *
 * Each unit's parameters are concatenated, in declaration order, into one flat fp32 buffer:
 *   - a tied parameter (ZT_PARAM_TIED, e.g. lm_head.weight tied to model.embed_tokens.weight) takes no
 *     storage: its param_offset is -1 and it reads and accumulates into its owner's storage, which a
 *     zero plugin finds by the tied_to name;
 *   - the buffer is padded with zeros to a multiple of dp_size * ZT_LAYOUT_ALIGN elements, so every
 *     data-parallel rank's slice is the same size and 64-byte aligned, whatever the tensor sizes.
 * Padding is never trained (it lies outside every parameter range) and is never saved.
 *
 * Regions: a unit's trainable parameters come first, padded as above, then its frozen ones, padded
 * again (zt_unit_layout of zt_train.h): only the trainable region needs an fp32 master, gradients
 * and optimizer state, so the zero plugin keeps just the compute copy of the frozen region.
 *
 * Trainable parameters (host key trainable_params, a list or a comma-separated string of patterns),
 * each pattern matched against the Hugging Face parameter names:
 *   - with a wildcard (* any run of characters, dots included; ? one character; [...] a set) the
 *     pattern must match the whole name: "*.self_attn.*", "model.layers.1?.*";
 *   - without one it must match whole dot-separated components of the name: "q_proj" selects every
 *     "...self_attn.q_proj.weight", "layers.1" selects layer 1 but not layer 10, and a full name
 *     selects exactly that parameter;
 *   - a pattern may leave out the "model." prefix: "layers.31" and "layers.3?.*" match
 *     "model.layers.31...".
 * Then MindFormers' pet_config.freeze_include freezes what it matches and pet_config.freeze_exclude
 * makes trainable what it matches (a parameter both match keeps its state).
 * Unset: everything is trainable. With an adapter (parameters flagged ZT_PARAM_ADAPTER, zt_model.h) the
 * adapter's parameters always train and the base model's only where trainable_params selects them
 * (unset: none). A pattern that matches nothing is an error naming it (a typo must
 * not silently freeze the whole model), naming the model's first parameters. A tied parameter is trainable exactly when its owner is, and a
 * pattern naming it selects the owner.
 *
 * Weight decay: decay[i] is 0 when the parameter carries any of the options' no_decay_flags
 * (ZT_PARAM_NO_DECAY: norms; ZT_PARAM_EMBEDDING: the token embedding), 1 otherwise; a tied
 * parameter has its owner's flag.
 *
 * Tensor parallelism: with shards (zt_layout_options.shards, from the model's param_shard) each
 * parameter's storage is this rank's shard of it (rows or columns of the logical tensor, padding rows
 * zero), numel counts the shard, and zt_layout_shard_runs maps its elements to the logical tensor's.
 *
 * Pipeline stages: with held_range, the parameters of units outside [held_first, held_last] take no
 * storage (numel 0, and shape[0] 0 in the declarations the zero plugin sees), so a stage's zero plugin
 * allocates weights, gradients and optimizer state for its own units only; the held units' geometry
 * (offsets, padded sizes) is the same as in the whole model's layout.
 *
 * Initialisation is a pure function of (seed, parameter name, logical element index): a counter-based
 * generator, so the values do not depend on the unit layout, the padding, the number of ranks, the
 * tensor-parallel split or which rank fills which slice (a tp run starts from the one-rank run's
 * weights). See zt_layout_init_range.
 */
#ifndef ZT_FRAMEWORK_LAYOUT_H
#define ZT_FRAMEWORK_LAYOUT_H

#include <stdint.h>
#include "zt/zt_train.h"
#include "base/error.h"
#include "host/runtime.h"

/* Elements each rank's slice of a unit buffer is a multiple of: 16 fp32 = 64 bytes. */
#define ZT_LAYOUT_ALIGN 16

typedef struct zt_layout_options {
    int32_t dp_size;              /* data-parallel ranks, >= 1 */
    const char *trainable;        /* trainable_params patterns; NULL: all trainable */
    uint32_t no_decay_flags;      /* ZT_PARAM_* flags that exclude a parameter from weight decay */
    const char *freeze_include;   /* pet_config.freeze_include patterns; NULL: none */
    const char *freeze_exclude;   /* pet_config.freeze_exclude patterns; NULL: none */
    const zt_param_shard *shards; /* [n_params_decl] this rank's tensor-parallel shard of each
                                     parameter (zt_model_ops.param_shard); NULL: whole tensors */
    int held_range;               /* a pipeline stage: storage only for units [held_first, held_last] */
    int32_t held_first, held_last;
} zt_layout_options;

/* The host's layout: the ABI view plus the arrays it points at. */
typedef struct zt_host_layout {
    zt_layout layout;             /* handed to the zero plugin; its pointers point into this struct */
    zt_unit_layout *units;        /* [n_units] */
    int64_t *param_offset;        /* [n_params_decl]; -1 for tied parameters */
    uint8_t *trainable;           /* [n_params_decl] */
    uint8_t *decay;               /* [n_params_decl] */
    int32_t *owner;               /* [n_params_decl] the parameter whose storage it uses (itself or
                                     the tied owner) */
    int64_t *numel;               /* [n_params_decl] elements of this rank's tensor: the logical
                                     tensor, or its tensor-parallel shard */
    zt_param_shard *shard;        /* [n_params_decl] the shard (split_dim -1: the whole tensor) */
    int32_t *tp_replicas;         /* [n_params_decl] shard[i].replicas, for zt_layout.tp_replicas */
    /* With shards, layout.model is local_info: the model's declarations with this rank's shapes (what
     * the zero plugin builds the model's views from); logical is always the model's own. */
    const zt_model_info *logical;
    zt_model_info local_info;
    zt_param_decl *local_decls;
    int64_t n_trainable;          /* trainable scalar parameters (tied counted once) */
    int64_t largest_unit_numel;   /* the largest padded unit buffer */
    int64_t *trainable_numel;     /* [n_units] the padded trainable region of each unit */
    int32_t lowest_trainable_unit;/* the backward stops here: nothing below it trains */
    int32_t has_frozen_region;    /* some unit has frozen parameters */
} zt_host_layout;

/* Build the layout of `model`. Checks the model's declarations first (parameters grouped by unit in
 * unit order, unique names, 1 to 4 positive dimensions, tied_to naming an untied parameter of the same
 * shape, n_parameters equal to the sum of the untied sizes): a failure there is the model plugin's
 * bug and is reported as ZT_ERR_INTERNAL naming the parameter. Bad trainable_params patterns are
 * ZT_ERR_CONFIG. */
zt_status zt_layout_build(const zt_model_info *model, const zt_layout_options *opt, zt_host_layout **out,
                          zt_error *err);
void zt_layout_free(zt_host_layout *l);

/* The elements [begin, begin + n) of parameter `param`'s storage as runs of consecutive elements of
 * its logical tensor: fn(ctx, local, logical, count) for each, in order; elements in a shard's
 * padding belong to no run (they stay zero). Stops at the first status fn returns that is not ZT_OK. */
typedef zt_status (*zt_layout_run_fn)(void *ctx, int64_t local, int64_t logical, int64_t count);
zt_status zt_layout_shard_runs(const zt_host_layout *l, int32_t param, int64_t begin, int64_t n,
                               zt_layout_run_fn fn, void *ctx);
/* The same for another rank's shard `sh` of the parameter (an export assembling every rank's). */
zt_status zt_layout_runs_of(const zt_host_layout *l, int32_t param, const zt_param_shard *sh, int64_t begin,
                            int64_t n, zt_layout_run_fn fn, void *ctx);

/* Index of the parameter named `name`, or -1. */
int32_t zt_layout_find(const zt_host_layout *l, const char *name);

/* Fill dst[0, count) with elements [begin, begin + count) of unit `unit`'s padded flat buffer as
 * initialised from `seed`: each parameter by its declared init (ZT_INIT_NORMAL: N(0, init_std);
 * ZT_INIT_UNIFORM: U(-init_std, init_std) from the uniform of counter j; ZT_INIT_ONES; ZT_INIT_ZEROS)
 * and padding with zeros.
 * NORMAL values: element j of parameter `name` is Box-Muller of two uniforms drawn from
 * splitmix64-mixed counters (key = mix(seed ^ fnv1a64(name)), counters 2j and 2j + 1), computed in
 * double and rounded to fp32 once. rt (may be NULL) supplies the thread pool. */
void zt_layout_init_range(const zt_host_layout *l, zt_runtime *rt, int32_t unit, uint64_t seed,
                          int64_t begin, int64_t count, float *dst);

#endif
