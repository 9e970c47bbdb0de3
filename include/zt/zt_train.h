/* zt plugin ABI v1: optimizer plugins (ZT_KIND_OPTIMIZER), ZeRO plugins (ZT_KIND_ZERO) and parallel
 * strategy plugins (ZT_KIND_PARALLEL).
 *
 * Division of labour: the optimizer is pure math over flat fp32 ranges; the zero plugin owns where
 * parameters, gradients and optimizer state live (device or host, full or sharded) and when they
 * move; the parallel plugin (plugins/parallel) builds the rank
 * grid and decides which units and tensor slices a rank holds. The host drives the step and owns
 * checkpoints. Tags ([training thread], [collective], [may be NULL], ...): zt_plugin.h.
 */
#ifndef ZT_TRAIN_H
#define ZT_TRAIN_H

#include "zt_types.h"
#include "zt_host.h"
#include "zt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- optimizer ------------------------------------------------------------------------------- */

/* Per-call hyperparameters. The learning-rate schedule and parameter groups live in the host, so
 * the optimizer sees the lr and weight decay that apply to this range. */
typedef struct zt_optim_hparams {
    uint32_t struct_size;
    int32_t reserved0;
    int64_t step;        /* 1-based count of optimizer steps taken, this one included */
    double lr;
    double weight_decay; /* 0 for no-decay groups */
    double grad_scale;   /* multiply gradients by this first (clipping factor, 1/loss-scale) */
    /* ABI 1.1 (read only when struct_size >= ZT_OPTIM_HPARAMS_SIZE_1_1): NULL, or a bf16 array over
     * the same element range as `param`, in the same memory; the optimizer writes
     * bf16(round-to-nearest-even(updated param)) there in the same pass, so the zero plugin needs no
     * separate conversion of the master to the model's compute copy. */
    void *compute_copy;
    /* ABI 1.2 (read only when struct_size >= ZT_OPTIM_HPARAMS_SIZE_1_2): the zt_dtype of
     * compute_copy, ZT_BF16 or ZT_F16 (fp16 training: IEEE half, round to nearest even, inf beyond
     * 65504). A 1.1 caller, and 0 (unset), mean ZT_BF16. The zero plugin passes an ZT_F16 copy only to an optimizer
     * that declares ZT_OPTIM_WRITES_COMPUTE_COPY_F16; for others it converts the copy itself. */
    int32_t compute_copy_dtype;
    int32_t reserved1;
} zt_optim_hparams;

/* struct_size of a v1.0 zt_optim_hparams (no compute_copy), of a 1.1 one and of a 1.2 one. */
#define ZT_OPTIM_HPARAMS_SIZE_1_0 40u
#define ZT_OPTIM_HPARAMS_SIZE_1_1 48u
#define ZT_OPTIM_HPARAMS_SIZE_1_2 56u

/* zt_optimizer_ops.flags (ABI 1.1; 0 in a v1.0 plugin, whose field was reserved and zero). */
#define ZT_OPTIM_WRITES_COMPUTE_COPY 1u /* step() honours zt_optim_hparams.compute_copy */
#define ZT_OPTIM_WRITES_COMPUTE_COPY_F16 2u /* ABI 1.2: ... also when compute_copy_dtype is ZT_F16 */

typedef struct zt_optimizer_ops {
    uint32_t struct_size;
    uint32_t flags;          /* ZT_OPTIM_* (ABI 1.1; was reserved, zero, in 1.0) */
    /* Number of fp32 state arrays per parameter element (AdamW: 2) and their names (checkpoint keys,
     * e.g. "exp_avg"). The zero plugin allocates them, zero-filled, wherever it keeps the shard.
     * [may be NULL], each: no n_state means no state arrays, no state_name means unnamed ones (the
     * host and the zero plugins check). [training thread] and [main thread] (the estimate). */
    int32_t (*n_state)(void *state);
    /* A static string owned by the plugin, or NULL for i out of range. */
    const char *(*state_name)(void *state, int32_t i);
    /* Update n elements in place. param, grad and every opt_state[i] point at the same element
     * range, all in memory of `device_type` (ZT_DEVICE_CUDA: enqueue on `stream`, may return before
     * the work is done; ZT_DEVICE_CPU: done on return, may use host->parallel_for). The arrays
     * belong to the zero plugin; h is borrowed for the call. Called by the zero plugin, never by
     * the host: [training thread], or the zero plugin's offload thread (offload_optimizer), one
     * call at a time. Required (the zero plugins refuse an optimizer without step). */
    zt_status (*step)(void *state, const zt_optim_hparams *h, float *param, const float *grad,
                      float *const *opt_state, uint64_t n, int32_t device_type, void *stream);
} zt_optimizer_ops;

/* ---- the flat parameter layout the host builds ----------------------------------------------- */

/* Each unit's parameters live in one flat buffer, padded so it splits evenly across the data-
 * parallel ranks: no tensor size ever has to divide the rank count. ABI 1.3: the buffer has two
 * regions, each padded to a multiple of dp_size * alignment on its own: the trainable parameters
 * first, [0, zt_layout.trainable_numel[u]), then the frozen ones, [trainable_numel[u], padded_numel).
 * Only the trainable region needs an fp32 master, gradients and optimizer state; the frozen region
 * needs only the compute copy. */
typedef struct zt_unit_layout {
    int64_t numel;        /* sum of the unit's parameter sizes */
    int64_t padded_numel; /* numel rounded up to a multiple of dp_size * alignment */
    int32_t first_param;  /* index into zt_model_info.params */
    int32_t n_params;
} zt_unit_layout;

/* The host keeps the layout valid until the zero plugin's fini. */
typedef struct zt_layout {
    uint32_t struct_size;
    int32_t n_units;
    const zt_model_info *model;
    const zt_unit_layout *units;     /* [n_units] */
    const int64_t *param_offset;     /* [n_params_decl] element offset inside the unit's buffer;
                                        -1 for a tied parameter (no storage of its own) */
    const uint8_t *trainable;        /* [n_params_decl] 0 for frozen parameters */
    const uint8_t *decay;            /* [n_params_decl] 1 when weight decay applies */
    int32_t compute_dtype;           /* zt_dtype of the views handed to the model */
    int32_t reserved0;
    /* ABI 1.3 (read only when struct_size >= ZT_LAYOUT_SIZE_1_3): [n_units] the padded size of each
     * unit's trainable region (see zt_unit_layout); the frozen region follows it. A 1.0-1.2 layout
     * has no frozen region: the whole buffer is treated as trainable storage. */
    const int64_t *trainable_numel;
    /* ABI 1.4 (read only when struct_size >= ZT_LAYOUT_SIZE_1_4): tensor parallelism. [n_params_decl]
     * how many ranks of the "tp" group hold the same values of each parameter (the tp size for a
     * replicated one, 1 for a split one, between for replicated KV heads; zt_param_shard.replicas);
     * NULL without tensor parallelism. The global gradient norm counts every value once: the sum over
     * "tp" of each rank's squares divided by their replicas. */
    const int32_t *tp_replicas;
} zt_layout;

/* struct_size of a v1.0 zt_layout, of a 1.3 one and of a 1.4 one. */
#define ZT_LAYOUT_SIZE_1_0 56u
#define ZT_LAYOUT_SIZE_1_3 64u
#define ZT_LAYOUT_SIZE_1_4 72u

/* ---- ZeRO ------------------------------------------------------------------------------------ */

typedef enum zt_phase {
    ZT_PHASE_FORWARD = 0,
    ZT_PHASE_BACKWARD = 1
} zt_phase;

typedef struct zt_step_args {
    uint32_t struct_size;
    int32_t reserved0;
    int64_t step;            /* 1-based */
    double lr;               /* this step's lr from the schedule */
    double weight_decay;     /* for parameters whose layout decay flag is 1 */
    double max_grad_norm;    /* clip to this global L2 norm; 0: no clipping */
    double loss_scale;       /* gradients arrive multiplied by this (fp16); 1 otherwise */
} zt_step_args;

typedef struct zt_step_result {
    uint32_t struct_size;
    int32_t skipped;         /* 1: non-finite gradients, no update made */
    double grad_norm;        /* global L2 norm before clipping, unscaled */
} zt_step_result;

/* Which flat array of a unit's local shard: the fp32 master copy, or optimizer state i (1-based);
 * ABI 1.3: ZT_SHARD_FROZEN, this rank's slice of the frozen region (zt_zero_ops.frozen_range), read
 * and written as fp32 (the plugin keeps it only in the compute dtype). */
#define ZT_SHARD_MASTER 0
#define ZT_SHARD_FROZEN (-1)

/* Memory a configuration needs, by pool, per rank, on the device and on the host, in bytes. */
typedef struct zt_mem_estimate {
    uint32_t struct_size;
    int32_t reserved0;
    double device[ZT_POOL_COUNT];
    double host[ZT_POOL_COUNT];
} zt_mem_estimate;

typedef struct zt_estimate_in {
    uint32_t struct_size;
    int32_t dp_size;
    int32_t micro_batch;
    int32_t seq_len;
    int32_t recompute;
    int32_t compute_dtype;
    int32_t n_optimizer_states;
    int32_t reserved0;
    int64_t n_parameters;
    int64_t largest_unit_numel;
    const zt_model_info *model;
    /* ABI 1.3 (read only when struct_size >= ZT_ESTIMATE_IN_SIZE_1_3): [n_params_decl] 0 for a frozen
     * parameter (it costs only its compute copy), as zt_layout.trainable; NULL: everything trains. */
    const uint8_t *trainable;
} zt_estimate_in;

/* struct_size of a v1.0 zt_estimate_in and of a 1.3 one. */
#define ZT_ESTIMATE_IN_SIZE_1_0 56u
#define ZT_ESTIMATE_IN_SIZE_1_3 64u

typedef struct zt_zero_ops {
    uint32_t struct_size;
    int32_t stage;           /* 0..3, as DeepSpeed's zero_optimization.stage */
    /* Every op of this table is [training thread] and required (the host calls them without NULL
     * checks) unless its comment says otherwise. */

    /* Allocate every buffer for `layout` (through host->alloc, so each is accounted to its pool) and
     * bind the optimizer. layout (the host's) and opt / opt_state (the optimizer plugin's table and
     * state) stay valid until this plugin's fini. [collective] */
    zt_status (*setup)(void *state, const zt_layout *layout, const zt_optimizer_ops *opt,
                       void *opt_state);
    /* Make unit u's parameters available for `phase`: fill params[0..n) (and, in backward, grads),
     * arrays of the host's, with views of the plugin's memory, valid until after_unit. Stage 3
     * all-gathers here and prefetches the next unit. [collective] */
    zt_status (*before_unit)(void *state, int32_t unit, int32_t phase, zt_tensor *params,
                             zt_tensor *grads);
    /* The views of before_unit are no longer used (stage 3 frees the gathered unit). Every rank
     * calls it in the same unit order; [collective] in that sense, though the in-tree plugins
     * communicate nothing here. */
    zt_status (*after_unit)(void *state, int32_t unit, int32_t phase);
    /* Unit u's gradients for this micro-batch are complete (after its backward). Stages 2/3
     * reduce-scatter them here on every micro-batch (so only the local shard accumulates); stages
     * 0/1 reduce on the last micro-batch of the step (last_micro = 1). [collective] */
    zt_status (*grads_ready)(void *state, int32_t unit, int32_t last_micro);
    /* Finish gradient communication, compute the global norm, clip, run the optimizer on the local
     * shards (device or host), and make updated parameters available as the stage requires.
     * a is borrowed; *r is the host's. [collective] */
    zt_status (*step)(void *state, const zt_step_args *a, zt_step_result *r);
    /* Reset the gradients for the next step. Local (every rank calls it, nothing is exchanged). */
    zt_status (*zero_grad)(void *state);
    /* This rank's slice [offset, offset+count) of unit u's padded flat buffer (the same for master
     * and each optimizer state). Checkpoints store it with the layout, so they reshard on load.
     * Local. */
    void (*shard_range)(void *state, int32_t unit, int64_t *offset, int64_t *count);
    /* Copy this rank's shard of `which` (ZT_SHARD_MASTER or optimizer state 1..n) to or from host
     * memory of count floats (the host's buffer). After write_shard of the master, the compute copy
     * is refreshed. Local: each rank copies its own shard (checkpoints, export). */
    zt_status (*read_shard)(void *state, int32_t unit, int32_t which, float *dst);
    zt_status (*write_shard)(void *state, int32_t unit, int32_t which, const float *src);
    /* Memory this stage would need for `in`, for zt-run --dry-run. May be called with state from
     * init before setup (also on plugins initialized only to estimate another stage), and must not
     * allocate. [main thread]. [may be NULL] on CPU runs (--dry-run then says the plugin has no
     * estimate, and the host-memory check before a CPU run is skipped with a warning); a GPU run
     * needs it: before training, the host checks the estimate against the device's memory (and the
     * machine's host memory) and refuses the run when the zero plugin cannot estimate. */
    zt_status (*estimate)(void *state, const zt_estimate_in *in, zt_mem_estimate *out);
    /* ABI 1.1 [may be NULL] (the host calls it only when struct_size >= ZT_ZERO_OPS_SIZE_1_1 and it
     * is set): the coming step's arguments, before its first micro-batch, so a plugin can run the
     * optimizer on each unit inside the backward (zero_optimization.step_in_backward). step() is
     * still called, with the same arguments, after the last micro-batch. Local. */
    zt_status (*begin_step)(void *state, const zt_step_args *a);
    /* ABI 1.3 [may be NULL] (the host calls it only when struct_size >= ZT_ZERO_OPS_SIZE_1_3 and it
     * is set): this rank's slice [offset, offset+count) of unit u's frozen region (offset counts from
     * the start of the unit's buffer), which read_shard / write_shard move as ZT_SHARD_FROZEN. With
     * it, shard_range covers the trainable region only; without it, the plugin keeps the whole
     * buffer as trainable storage and shard_range covers all of it. Local. */
    void (*frozen_range)(void *state, int32_t unit, int64_t *offset, int64_t *count);
} zt_zero_ops;

/* struct_size of a v1.0 zt_zero_ops (no begin_step), of a 1.1 one and of a 1.3 one. */
#define ZT_ZERO_OPS_SIZE_1_0 88u
#define ZT_ZERO_OPS_SIZE_1_1 96u
#define ZT_ZERO_OPS_SIZE_1_3 104u

/* ---- parallel strategy ----------------------------------------------------------------------- */

/* The in-tree plugin `parallel` (plugins/parallel, docs/parallel.md) implements this kind: tensor and
 * pipeline parallelism in one plugin, because zt_parallel_ops sets up the whole grid at once. zt-run
 * loads it when --plugins names one or parallel_config.model_parallel or .pipeline_stage is above 1;
 * the trainer calls setup once and then trains over the plugin's "dp" group. */

typedef struct zt_rank_grid {
    uint32_t struct_size;
    int32_t dp_size, tp_size, pp_size;
    int32_t dp_rank, tp_rank, pp_rank;
    int32_t first_unit;      /* pipeline: the units this rank runs, inclusive */
    int32_t last_unit;
} zt_rank_grid;

typedef enum zt_pp_op {
    ZT_PP_FORWARD = 0,           /* run this stage's units forward on micro-batch `micro` */
    ZT_PP_BACKWARD = 1,          /* and backward (its forward came earlier in the list) */
    ZT_PP_SEND_ACTIVATION = 2,   /* send micro's output hidden states to pipeline rank `peer` */
    ZT_PP_RECV_ACTIVATION = 3,   /* receive micro's input hidden states from `peer` */
    ZT_PP_SEND_GRADIENT = 4,     /* send the gradient of micro's input to `peer` */
    ZT_PP_RECV_GRADIENT = 5      /* receive the gradient of micro's output from `peer` */
} zt_pp_op;

/* One instruction of a rank's pipeline schedule. Transfers are listed explicitly, in an order in
 * which blocking (rendezvous) sends and receives cannot deadlock, so the host runs the list as is. */
typedef struct zt_pp_action {
    int32_t op;              /* zt_pp_op */
    int32_t micro;           /* micro-batch index */
    int32_t chunk;           /* virtual stage (model chunk) of this rank, 0 without interleaving */
    int32_t peer;            /* transfers: the pipeline rank at the other end ("pp" group); -1 otherwise */
} zt_pp_action;

typedef struct zt_parallel_ops {
    uint32_t struct_size;
    uint32_t reserved0;
    /* Build the grid from config (parallel_config.*) and create the "dp", "tp" and "pp" groups with
     * host->group_create (every rank creates all three, in that order). model is the model plugin's;
     * *out the host's. A layout that does not fit the job or the model is ZT_ERR_CONFIG with a message
     * naming the numbers. [collective], [training thread]. */
    zt_status (*setup)(void *state, const zt_model_info *model, zt_rank_grid *out);
    /* This rank's ordered instructions for one step of n_micro micro-batches (1F1B for pp > 1; each
     * forward followed by its backward with pp = 1). Writes up to cap actions into the caller's
     * array, sets *n to the number needed. Local, [training thread]; after setup. */
    zt_status (*schedule)(void *state, int32_t n_micro, zt_pp_action *actions, int32_t cap,
                          int32_t *n);
    /* ABI 1.4 (read only when struct_size >= ZT_PARALLEL_OPS_SIZE_1_4): the grid of world rank `rank`
     * in a job of `world` ranks, checked as setup checks it, without creating any group: what the
     * memory estimator (zt-run --dry-run) lays out per rank. Local, [main thread], after init. */
    zt_status (*plan)(void *state, const zt_model_info *model, int32_t world, int32_t rank,
                      zt_rank_grid *out);
} zt_parallel_ops;

/* struct_size of a v1.0 zt_parallel_ops and of a 1.4 one (plan). */
#define ZT_PARALLEL_OPS_SIZE_1_0 24u
#define ZT_PARALLEL_OPS_SIZE_1_4 32u

#ifdef __cplusplus
}
#endif

#endif /* ZT_TRAIN_H */
