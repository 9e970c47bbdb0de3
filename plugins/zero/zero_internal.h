/* The zero plugins' internals, private to plugins/zero: the stage macros, the state every file of
 * the plugin shares (zero_state; its parts by concern: cfg the options, sib step_in_backward, off the
 * offload), the small helpers every file uses, and the functions one file calls in another, grouped
 * by the file that defines them. zero.c's header comment is the map of the code. Every file is
 * compiled once per stage (ZT_ZERO_STAGE).
 */
#ifndef ZT_PLUGINS_ZERO_INTERNAL_H
#define ZT_PLUGINS_ZERO_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <zt/zt.h>

#include "offload.h"
#include "zero_cuda.h"

#ifndef ZT_ZERO_STAGE
#error "compile with -DZT_ZERO_STAGE=0, 1, 2 or 3 (see plugins/zero/CMakeLists.txt)"
#endif
#define STAGE ZT_ZERO_STAGE
#define STRINGIFY2(x) #x
#define STRINGIFY(x) STRINGIFY2(x)
#define PLUGIN_NAME "zero" STRINGIFY(ZT_ZERO_STAGE)

/* Shards of the master, optimizer state and (stages 2-3) gradients. */
#define SHARDED_MASTER (STAGE >= 1)
/* Gradients live as per-rank accumulators fed by per-micro-batch reduce-scatters. */
#define SHARDED_GRADS (STAGE >= 2)
/* Parameters exist only as shards and are gathered per unit. */
#define SHARDED_PARAMS (STAGE >= 3)

#define MAX_OPT_STATES 16

/* Which builds train on GPUs: every stage built with the CUDA kernels. */
#if defined(ZT_PLUGIN_CUDA)
#define GPU_CAPABLE 1
#else
#define GPU_CAPABLE 0
#endif

/* Which offload a buffer belongs to (zero_mem_where's `offloaded`, a bit mask): it lives in host
 * memory when that offload is on, pinned per that offload's pin_memory. */
#define OFFLOADED_OPTIMIZER 1
#define OFFLOADED_PARAM 2

/* One run of trainable elements of this rank's slice with one decay flag; contiguous in the master
 * (offset from the slice start), the gradients the optimizer reads and the packed state. */
typedef struct opt_range {
    int32_t unit;
    int32_t decay;
    int32_t replicas;   /* tensor parallelism: ranks of "tp" holding the same values (zt_layout.tp_replicas) */
    int32_t reserved;
    int64_t master_offset;
    int64_t grad_offset;
    int64_t state_offset;
    int64_t count;
} opt_range;

/* A unit's offload bookkeeping on GPU runs (off.on_gpu); written by the training thread before it
 * submits a job reading it. */
typedef struct unit_offload {
    int32_t fresh;          /* stages 2-3: the host gradient shard holds nothing of this step yet, so the next
                               download lands in it directly (zero_grad sets it instead of clearing) */
    int32_t add_buf;        /* stages 2-3: the download buffer (off.down[]) its queued add reads */
    int32_t step_buf;       /* stage 1: the download buffer its queued step reads */
    int64_t last_ticket;    /* the latest job waiting on its download event or reading its downloads */
    int64_t step_ticket;    /* this step's step job; 0 none */
} unit_offload;

typedef struct unit_store {
    int64_t padded;         /* P: the trainable region [0, P) of the unit's buffer, which alone has a master,
                               gradients and optimizer state (the whole buffer for a pre-1.3 layout) */
    int64_t total;          /* the whole buffer: the trainable region, then the frozen region [P, total),
                               which exists only in the compute copy (zero.c's header comment, "Frozen") */
    int64_t frozen_offset;  /* this rank's slice of the frozen region [frozen_offset, + frozen_count): */
    int64_t frozen_count;   /* stage 3 a 1/dp slice, else the whole region */
    void *frozen_shard;     /* stage 3: [frozen_count] in the compute dtype (fp32 on the CPU, 16-bit on
                               GPUs), host memory with offload_param; gathered with the unit */
    int64_t shard_offset;   /* this rank's slice [shard_offset, shard_offset + shard_count) of P; */
    int64_t shard_count;    /* stage 0: the whole unit */
    float *compute;         /* [P]; stage 3: only while live > 0 */
    float *master;          /* [shard_count]; stage 0: == compute */
    uint16_t *compute_bf16; /* GPU runs: [P], the bf16 copy the model reads; stage 3: gathered while live */
    uint16_t *shard_bf16;   /* GPU runs, stage 3 with offload: [shard_count], bf16 of the master shard
                               (gathered from); NULL with cast_gather */
    float *pending_free;    /* GPU runs, stages 2-3: a transient gradient buffer a reduction on the comm
                               stream still reads; freed at the next grads_ready or step */
    int32_t gather_pending; /* GPU runs, stages 1-2: the compute copy's all-gather is in flight */
    int32_t prefetched;     /* GPU runs, stage 3: `compute_bf16` was gathered ahead, not yet held */
    int32_t sib_step_at;    /* step_in_backward: the unit whose grads_ready steps this storage unit (the
                               earliest unit touching it: backward runs units in reverse); -1 none */
    int32_t n_touchers;     /* units whose backward writes this unit's gradients */
    unit_offload off;       /* offload on GPUs (off.on_gpu) */
    const float *step_grads; /* step_in_backward: where zero_step_range reads this unit's gradients, when
                                they are not `grad` (the in-place reduced transient buffer) */
    float *grad;            /* stage 0: [n_trainable] packed; stage 1: [P]; stages 2-3: [shard_count] */
    float *grad_full;       /* stages 2-3: the transient [P] of this micro-batch's backward */
    float **state;          /* [n_state], each [n_state_elems] */
    int64_t n_state_elems;  /* trainable elements of the slice */
    int64_t n_grad;         /* elements of `grad` */
    int32_t live;           /* stage 3: before_unit calls holding `compute` */
    int32_t grad_refs;      /* stages 2-3: backward calls holding `grad_full` */
    int32_t reduced;        /* stages 0-1: reduced this step */
    int32_t reduce_in_step; /* stages 0-1: an earlier unit's backward also writes here (tied), so only
                               step() knows that every contribution has arrived */
    int32_t stale;          /* stages 1-2: the compute copy must be gathered from the master shards */
    int32_t *touched;       /* storage units this unit's parameters live in: itself first, then the
                               owners of its tied parameters */
    int32_t n_touched;
} unit_store;

/* The options, as read_options read them at init; fixed for the run. */
typedef struct zero_config {
    int32_t overlap_comm;
    int64_t reduce_bucket, allgather_bucket, prefetch_bucket;
    int64_t max_live; /* stage3_max_live_parameters: gathered elements, prefetches included */
    int32_t offload_optimizer, offload_param, pin_optimizer, pin_param;
} zero_config;

/* zero_optimization.step_in_backward (zero.c's header comment, "step_in_backward"). */
typedef struct zero_sib {
    int32_t on;             /* step_in_backward is on for this run */
    int32_t have_args;      /* begin_step gave this step's arguments */
    zt_step_args args;      /* begin_step's arguments (offload's early steps use them too) */
    double square;          /* CPU runs: this rank's sum of squares over the units stepped so far */
    int32_t count;          /* storage units stepped in this step's backward */
    float *norms;           /* GPU runs: [n_units] per-unit norms read back in step() */
} zero_sib;

/* offload_optimizer: the thread that runs the optimizer (offload.h), what step() hands it, and on GPU
 * runs the copies to and from the host (zero.c's header comment, "Offload on GPUs"). */
typedef struct zero_off {
    zero_offload *thread;
    const zt_step_args *args;
    double clip;
    zt_step_args args_copy;
    int32_t on_gpu;         /* offload_optimizer on a GPU run */
    int32_t early;          /* a step may start inside the backward (the conditions of step_in_backward) */
    int32_t early_now;      /* this step's units are stepped as their gradients reach the host */
    int32_t early_count;    /* units submitted in this step's backward */
    int64_t submitted;      /* jobs submitted since setup: the n-th is ticket n (zero_offload_wait_for) */
    float *down[2];         /* host [max shard] fp32: gradient downloads to add (stages 2-3) or step from (1) */
    int64_t down_ticket[2]; /* the job reading each */
    int32_t down_next;
    uint16_t *up[2];        /* host [max shard] bf16: staging of the parameter uploads (offload thread) */
    int32_t up_next;        /* offload thread only */
    double *unit_square;    /* [n_units] early steps: each unit's sum of squares (offload thread) */
    const float **job_tensors; /* [n_params] the offload thread's norm scratch */
    int64_t *job_sizes;
} zero_off;

typedef struct zero_state {
    const zt_host *host;
    zero_config cfg;
    zero_cuda *gpu;         /* GPU runs (zero_cuda.h); NULL on the CPU */
    int32_t compute16;      /* GPU runs: the 16-bit type of the compute copies, ZT_BF16 or ZT_F16 (fp16);
                               the arrays are named *_bf16 from before fp16 existed */
    int32_t cast_gather;    /* GPU runs, stage 3 without offload: gathers cast the fp32 master shard */
    zero_sib sib;
    zero_off off;

    /* From setup on. */
    const zt_layout *layout;
    int32_t n_units;
    const zt_optimizer_ops *opt;
    void *opt_state;
    int32_t n_state;
    zt_group dp;
    zt_group pp;             /* pipeline parallel ("pp" of the parallel plugin); size 0 without one */
    unit_store *units;      /* [n_units] */
    int32_t *storage;       /* [n_params] the parameter whose storage it uses (itself or tied owner) */
    int64_t *grad_view;     /* [n_params] offset of its gradient view in the unit's gradient buffer
                               (stage 0: packed; else positional); -1: frozen */
    opt_range *ranges;      /* [n_params] */
    int32_t n_ranges;
    const float **norm_tensors; /* [n_params] scratch for the norm */
    int64_t *norm_sizes;
    double *norm_parts;     /* [dp] each rank's sum of squares */
    zt_group tp;            /* tensor parallelism (zt_layout.tp_replicas): the norm is summed over it too */
    int32_t has_tp;
    double *norm_tp_parts;  /* [tp] */
    float *reduce_staging;  /* [dp * reduce_chunk] or NULL */
    float *gather_staging;  /* [dp * gather_chunk] or NULL */
    int64_t reduce_chunk, gather_chunk; /* elements per rank per collective */
} zero_state;

/* ---- helpers -------------------------------------------------------------------------------- */

/* The plugin's error message, through host->error with the plugin's name first; returns st. Inline
 * so that each file has its own and the name stays out of the linked objects' symbols. */
static inline zt_status fail(const zero_state *s, zt_status st, const char *fmt, ...) ZT_PRINTF(3, 4);
static inline zt_status fail(const zero_state *s, zt_status st, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->host->error(s->host->ctx, st, PLUGIN_NAME " %s", msg);
    return st;
}

static inline int64_t numel_of(const zt_param_decl *p)
{
    int64_t n = 1;
    for (int32_t d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static inline int32_t find_param(const zt_model_info *m, const char *name)
{
    for (int32_t i = 0; i < m->n_params_decl; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    return -1;
}

/* ---- the comm stream ------------------------------------------------------------------------ */

/* GPU runs: every collective and its staging copies and adds run on the comm stream (the host's
 * default stream for collectives, the NULL stream collectives.c passes) after the compute stream's
 * work so far; event slots tell the compute stream when the data is there (zero_cuda.h). CPU runs:
 * collectives are synchronous and these are no-ops. Slots: reduce of unit u = u, gather of unit u =
 * n_units + u, "everything so far" = 2 n_units. */
static inline int32_t reduce_slot(int32_t u) { return u; }
static inline int32_t gather_slot(const zero_state *s, int32_t u) { return s->n_units + u; }
static inline int32_t all_slot(const zero_state *s) { return 2 * s->n_units; }

static inline zt_status comm_after_compute(zero_state *s)
{
    return s->gpu ? zero_cuda_comm_wait_compute(s->host, s->gpu) : ZT_OK;
}
static inline zt_status comm_done(zero_state *s, int32_t slot)
{
    return s->gpu ? zero_cuda_record_comm(s->host, s->gpu, slot) : ZT_OK;
}
static inline zt_status compute_after(zero_state *s, int32_t slot)
{
    return s->gpu ? zero_cuda_compute_wait(s->host, s->gpu, slot) : ZT_OK;
}
/* The compute stream waits for everything enqueued on the comm stream so far. */
static inline zt_status compute_after_all_comm(zero_state *s)
{
    if (!s->gpu) return ZT_OK;
    zt_status st = comm_done(s, all_slot(s));
    return st == ZT_OK ? compute_after(s, all_slot(s)) : st;
}

/* ---- between the files ---------------------------------------------------------------------- */

/* zero.c */
extern const zt_option zero_options[];
extern const int32_t zero_n_options;
int32_t zero_mem_where(const zero_state *s, int offloaded);
float *zero_alloc_floats(const zero_state *s, int pool, int offloaded, int64_t n, const char *what, int32_t unit);
void *zero_alloc_table(const zero_state *s, uint64_t bytes, const char *what);
void zero_bf16_host(const zero_state *s, const float *src, uint16_t *dst, int64_t n);
int zero_opt_writes_copy(const zero_state *s);
zt_status zero_check_unit(const zero_state *s, const char *call, int32_t unit);
zt_status zero_refresh_compute_copy(zero_state *s, int32_t unit);

/* collectives.c */
zt_status zero_gather_unit(zero_state *s, int32_t u);
zt_status zero_reduce_unit_once(zero_state *s, int32_t unit);
zt_status zero_flush_pending(zero_state *s, int32_t only);
zt_status zero_hold_params(zero_state *s, int32_t unit);
void zero_release_params(zero_state *s, int32_t unit);
zt_status zero_prefetch_next(zero_state *s, int32_t unit, int32_t phase);
zt_status zero_hold_grads(zero_state *s, int32_t unit);
zt_status zero_release_grads(zero_state *s, int32_t unit, int32_t by);

/* step.c: the ops of the unit calls and of the step; the pieces of the step the others reuse */
zt_status zero_before_unit(void *opaque, int32_t unit, int32_t phase, zt_tensor *params, zt_tensor *grads);
zt_status zero_after_unit(void *opaque, int32_t unit, int32_t phase);
zt_status zero_grads_ready(void *opaque, int32_t unit, int32_t last_micro);
zt_status zero_step(void *opaque, const zt_step_args *a, zt_step_result *r);
zt_status zero_zero_grad(void *opaque);
zt_status zero_global_norm(zero_state *s, double *norm);
zt_status zero_step_range_at(zero_state *s, const opt_range *rg, const zt_step_args *a, double clip,
                             const float *grads, uint16_t *copy, int on_gpu);
zt_status zero_step_range(zero_state *s, const opt_range *rg, const zt_step_args *a, double clip);
zt_status zero_after_unit_step(zero_state *s, int32_t u);

/* offload_step.c */
zt_status zero_off_job(void *opaque, int32_t job); /* the offload thread's zero_offload_fn */
zt_status zero_off_setup_gpu(zero_state *s);
zt_status zero_off_download_grads(zero_state *s, int32_t unit, const float *slice);
zt_status zero_off_submit_step(zero_state *s, int32_t unit);
zt_status zero_off_step(zero_state *s, const zt_step_args *a, double clip);
zt_status zero_off_gpu_step(zero_state *s, const zt_step_args *a, zt_step_result *r);

/* step_in_backward.c */
zt_status zero_sib_decide(zero_state *s, int gpu);
zt_status zero_begin_step(void *opaque, const zt_step_args *a);
zt_status zero_sib_step_unit(zero_state *s, int32_t unit, const float *grads);
zt_status zero_sib_finish_step(zero_state *s, const zt_step_args *a, zt_step_result *r);

/* estimate.c */
zt_status zero_estimate(void *opaque, const zt_estimate_in *in, zt_mem_estimate *out);

/* The most pipeline stages whose gradient norms zero_global_norm adds up. */
#define ZERO_MAX_PP 256

#endif
