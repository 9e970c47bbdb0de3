/* ZeRO stages 0-3 (DeepSpeed's zero_optimization.stage), one source compiled once per stage with
 * ZT_ZERO_STAGE = 0..3 (plugins/zero/CMakeLists.txt): the stages differ in what a rank keeps whole
 * and what it keeps as its 1/dp shard, not in how anything is computed. docs/zero.md is the user's
 * guide; this comment is the map of the code.
 *
 * The host lays every unit's parameters out in one flat buffer of padded_numel (P) elements, a
 * multiple of dp * 16, so rank r of dp owns the slice [r * S, (r + 1) * S) with S = P / dp, whatever
 * the tensor sizes. Per unit and rank:
 *
 *                 compute copy (the model's views)   fp32 master        gradients              optimizer state
 *   stage 0       full [P], IS the master           (the compute copy)  full, trainable only   full, trainable only
 *   stage 1       full [P]                          shard [S]           full [P]               shard, trainable only
 *   stage 2       full [P]                          shard [S]           shard [S] (+ transient full)  shard
 *   stage 3       gathered [P] while in use         shard [S]           shard [S] (+ transient full)  shard
 *
 * On the CPU the model computes in fp32, so stage 0 needs no copy of the master. Stages 1-2 keep the
 * master shard apart from the full compute copy, as DeepSpeed does (its fp32 partition): on GPUs the
 * compute copy is bf16, and apart from that the all-gather that refreshes the compute copy after the
 * step reads the master shard and writes the whole compute buffer, which an in-place collective
 * cannot do. Optimizer state exists only for trainable elements (frozen parameters get none).
 *
 * Gradient reduction is a SUM: the model divides every micro-batch's loss by the loss-token count of
 * the whole global batch, so the step's gradient is the sum over ranks and micro-batches.
 *   stage 0: all-reduce of the packed gradients, in place, once per step (after the last
 *            micro-batch's backward of the unit with overlap_comm, else in step()).
 *   stage 1: like stage 0 but a reduce-scatter; in place, so this rank's reduced slice lands at the
 *            START of the unit's gradient buffer (the collective's in-place convention) and the
 *            optimizer reads it there.
 *   stages 2, 3: every micro-batch, as DeepSpeed does: before_unit(u, backward) allocates a
 *            transient full gradient buffer for each storage unit u's backward writes (u itself, and
 *            the unit owning a tied parameter, e.g. the embedding used as LM head), and grads_ready
 *            reduce-scatters each into that unit's shard accumulator and frees it. So at most one
 *            unit's full gradients (plus its tied owner's) exist at a time, at the price of one
 *            reduce-scatter per unit per micro-batch (gradient accumulation communicates every
 *            micro-batch, as in DeepSpeed's stages 2 and 3).
 * Stage 3 gathers: before_unit all-gathers each storage unit the unit reads into a full buffer
 * (pool params; refcounted, so the tied embedding gathered again for the LM head is the same
 * buffer if unit 0 is still live) and after_unit frees it. CPU collectives are synchronous, so
 * there is nothing to prefetch behind: the next unit is gathered when it starts
 * (stage3_prefetch_bucket_size sizes the prefetch of the GPU path).
 * Buckets: a collective moves at most reduce_bucket_size (gradients) or allgather_bucket_size
 * (parameters) elements; a unit larger than that goes in pieces through a staging buffer of that
 * size (pool comm), allocated only when some unit needs it.
 *
 * step(): finish the reduction, global L2 norm (each rank's sum of squares over its trainable slice,
 * in double, exchanged and added in rank order, so every rank gets the same bits), skip on a
 * non-finite norm, clip factor min(1, max_grad_norm / (norm + 1e-6)) (torch's clip_grad_norm_)
 * handed to the optimizer as grad_scale, the optimizer once per run of trainable elements of the
 * local slice with one decay flag, then stages 1-2 all-gather the updated master shards into the
 * compute copies.
 *
 * Offload (offload_optimizer.device, offload_param.device = cpu): allocations go through
 * zero_mem_where(), which puts what an offload covers in host memory (pinned per its pin_memory) on GPU
 * runs; on CPU runs every buffer already is host memory. With offload_optimizer, step() hands the
 * optimizer to the offload thread (offload.c) unit by unit, CPU runs included, where it computes the
 * same bits.
 * Offload on GPUs (off.on_gpu: offload_optimizer on a GPU run). The fp32 master, the optimizer state and
 * (stages 2-3) the gradient shard are host memory; the model's bf16 copies stay on the device.
 *   gradients down: stages 2-3 reduce-scatter each unit's transient gradients IN PLACE (the slice
 *     lands at the start of grad_full) and copy the slice to the host on the comm stream, then the
 *     unit's download event; the first contribution of a step lands in the host shard itself
 *     (`fresh`), later ones (micro-batches, the tied embedding's second writer) in one of two
 *     download buffers that the offload thread adds into the shard (JOB_ADD). Stage 1 reduces its
 *     full device gradients once per step as without offload and downloads a unit's slice into a
 *     download buffer right before queueing its step. The unit's reduce slot is recorded after the
 *     download, so zero_flush_pending frees grad_full only once the copy has read it.
 *   the step (JOB_STEP, offload thread): waits for the unit's download event, runs the CPU optimizer
 *     writing the bf16 of the updated master (compute_copy) into a pinned staging buffer (two,
 *     alternating) and uploads it on the copy stream into the unit's device bf16 slice (stages 1-2:
 *     compute_bf16 at shard_offset; stage 3: shard_bf16), then the unit's upload event; zero_gather_unit
 *     makes the comm stream wait on it, so the next gather of the unit reads the new values. Stage 3
 *     with offload_param keeps shard_bf16 on the host: the optimizer writes it directly, and
 *     zero_gather_unit copies it up into this rank's slot of the gathered buffer and gathers in place.
 *   step(): without early steps: downloads and adds drain (one host wait), the global norm (stage 1
 *     on the device, stages 2-3 on the CPU from the host shards, exchanged as without offload), then
 *     the units are queued in order; stages 1-2 all-gather unit u once its step is done while the
 *     thread steps u + 1. Early steps (off.early: no clipping, loss scale 1, one micro-batch, as
 *     step_in_backward): the unit is queued as soon as its gradients are downloaded in the backward
 *     (its last writer's grads_ready), so the copies and the CPU step run behind the backward of the
 *     units before it; the thread sums each unit's squares for the reported norm. step() returns
 *     after every job is done, so the next forward (and zero_grad) never races the thread.
 *   Only the training thread issues collectives (ranks must issue them in the same order); the
 *   offload thread only waits on events and enqueues copies. Before the training thread re-records a
 *   unit's download event or reuses a download buffer it waits for the job reading it (tickets).
 *
 * GPU runs (every stage built with CUDA, one or several GPUs): every buffer is device memory and the
 * model reads bf16 copies (compute_bf16): stage 0 [P] beside the fp32 master [P] (`compute`); stages
 * 1-2 [P] and no fp32 [P] at all (this rank's slot of compute_bf16 is written by the optimizer, then
 * gathered in place); stage 3 gathers each unit into a transient [P], the next unit prefetched on the
 * comm stream (zero_prefetch_next): with the fp32 master on the device (no offload), zero_gather_unit casts this
 * rank's master shard into its slot of the gathered buffer and gathers in place (cast_gather: no bf16
 * shard is kept, 2 bytes per parameter / ranks less, as FSDP2's mixed precision casts before its
 * all-gather); with offload, from a bf16 shard [S] (shard_bf16) the offload thread uploads or writes.
 * Where a bf16 copy of the master is kept, the optimizer writes it in its update pass (ABI 1.1
 * compute_copy; zero_refresh_compute_copy converts otherwise and after loads).
 * Collectives run on the comm stream, ordered by events (zero_cuda.h: comm_after_compute before,
 * comm_done after, compute_after where the compute stream needs the data); stages 2-3 free a
 * transient gradient buffer one unit after its reduction (pending_free, zero_flush_pending).
 *
 * step_in_backward (zero_optimization.step_in_backward, ABI 1.1 begin_step): with one micro-batch,
 * no clipping and no loss scale, each storage unit is reduced and stepped at grads_ready of the last
 * unit writing it (sib_step_at), from gradients that exist only for that unit: stages 0-1 allocate
 * `grad` in the backward and free it after the step (zero_hold_grads), stages 2-3 reduce-scatter
 * grad_full in place and step from it (a storage unit several units write keeps its accumulator, so
 * the sums are those of the normal path: bit for bit the same weights on CPU runs). step() then only
 * reports the norm (zero_sib_finish_step).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <zt/zt.h>

#include "cpu/kernels.h"
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

/* One run of trainable elements of this rank's slice with one decay flag; contiguous in the master
 * (offset from the slice start), the gradients the optimizer reads and the packed state. */
typedef struct opt_range {
    int32_t unit;
    int32_t decay;
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
    int64_t padded;         /* P */
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
    int32_t offload_optimizer, offload_param, pin_optimizer, pin_param;
} zero_config;

/* zero_optimization.step_in_backward (header comment, "step_in_backward"). */
typedef struct zero_sib {
    int32_t on;             /* step_in_backward is on for this run */
    int32_t have_args;      /* begin_step gave this step's arguments */
    zt_step_args args;      /* begin_step's arguments (offload's early steps use them too) */
    double square;          /* CPU runs: this rank's sum of squares over the units stepped so far */
    int32_t count;          /* storage units stepped in this step's backward */
    float *norms;           /* GPU runs: [n_units] per-unit norms read back in step() */
} zero_sib;

/* offload_optimizer: the thread that runs the optimizer (offload.h), what step() hands it, and on GPU
 * runs the copies to and from the host (header comment, "Offload on GPUs"). */
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
    unit_store *units;      /* [n_units] */
    int32_t *storage;       /* [n_params] the parameter whose storage it uses (itself or tied owner) */
    int64_t *grad_view;     /* [n_params] offset of its gradient view in the unit's gradient buffer
                               (stage 0: packed; else positional); -1: frozen */
    opt_range *ranges;      /* [n_params] */
    int32_t n_ranges;
    const float **norm_tensors; /* [n_params] scratch for the norm */
    int64_t *norm_sizes;
    double *norm_parts;     /* [dp] each rank's sum of squares */
    float *reduce_staging;  /* [dp * reduce_chunk] or NULL */
    float *gather_staging;  /* [dp * gather_chunk] or NULL */
    int64_t reduce_chunk, gather_chunk; /* elements per rank per collective */
} zero_state;

static const char *const k_offload_devices[] = {"none", "cpu", NULL};
static const char *const k_step_in_backward[] = {"auto", "true", "false", NULL};

static const zt_option zero_options[] = {
    {.key = "zero_optimization.overlap_comm",
     .type = ZT_OPT_BOOL,
     .default_value = "false",
     .help = "reduce each unit's gradients as soon as its backward is done instead of at the optimizer "
             "step (stages 0-1; stages 2-3 always do). GPU runs overlap it with compute; CPU collectives "
             "are synchronous"},
    {.key = "zero_optimization.reduce_bucket_size",
     .type = ZT_OPT_INT,
     .flags = ZT_OPT_HAS_MIN,
     .default_value = "500000000",
     .min = 1,
     .help = "elements per gradient reduction call (DeepSpeed's name and unit); a larger unit is reduced "
             "in pieces through a staging buffer of this size"},
    {.key = "zero_optimization.allgather_bucket_size",
     .type = ZT_OPT_INT,
     .flags = ZT_OPT_HAS_MIN,
     .default_value = "500000000",
     .min = 1,
     .help = "elements per parameter all-gather call (stages 1-3); a larger unit is gathered in pieces "
             "through a staging buffer of this size"},
    {.key = "zero_optimization.stage3_prefetch_bucket_size",
     .type = ZT_OPT_INT,
     .flags = ZT_OPT_HAS_MIN,
     .default_value = "50000000",
     .min = 0,
     .help = "stage 3: elements of upcoming units gathered ahead on GPU runs; CPU runs gather each unit "
             "when it starts (synchronous collectives leave nothing to overlap)"},
    {.key = "zero_optimization.reduce_scatter",
     .type = ZT_OPT_BOOL,
     .default_value = "true",
     .help = "DeepSpeed's choice of reduce-scatter over all-reduce for sharded gradients; zt always "
             "reduce-scatters (false is refused)"},
    {.key = "zero_optimization.allgather_partitions",
     .type = ZT_OPT_BOOL,
     .default_value = "true",
     .help = "DeepSpeed's choice of all-gather over broadcasts for updated parameters; zt always "
             "all-gathers (false is refused)"},
    {.key = "zero_optimization.contiguous_gradients",
     .type = ZT_OPT_BOOL,
     .default_value = "true",
     .help = "gradients in contiguous buffers; zt's always are (flat per-unit buffers; false is refused)"},
    {.key = "zero_optimization.offload_optimizer.device",
     .type = ZT_OPT_ENUM,
     .default_value = "none",
     .choices = k_offload_devices,
     .help = "cpu: keep the fp32 master, gradient shard and optimizer state in host memory and step on "
             "the CPU (stages 1-3). On CPU runs everything already is host memory"},
    {.key = "zero_optimization.offload_optimizer.pin_memory",
     .type = ZT_OPT_BOOL,
     .default_value = "true",
     .help = "offloaded master, gradients and optimizer state in page-locked host memory, so the copies "
             "to and from the GPU run asynchronously, overlapped with compute (GPU runs); false: pageable"},
    {.key = "zero_optimization.offload_param.device",
     .type = ZT_OPT_ENUM,
     .default_value = "none",
     .choices = k_offload_devices,
     .help = "cpu: keep the parameter shards in host memory between uses (stage 3 only). On CPU runs "
             "they already are"},
    {.key = "zero_optimization.offload_param.pin_memory",
     .type = ZT_OPT_BOOL,
     .default_value = "true",
     .help = "offloaded parameter shards in page-locked host memory, so their uploads overlap compute (GPU "
             "runs); false: pageable"},
    {.key = "zero_optimization.step_in_backward",
     .type = ZT_OPT_ENUM,
     .default_value = "auto",
     .choices = k_step_in_backward,
     .help = "run the optimizer on each unit as soon as its gradients are reduced, inside the backward, and "
             "keep gradients only per unit (no full gradient buffer). Exact only without gradient clipping "
             "(gradient_clipping 0), with gradient_accumulation_steps 1 and without fp16: auto turns it on "
             "for such runs on one GPU (on several, reductions overlap the backward better without it), "
             "true refuses other configurations, false never"},
};

/* The offload thread's job (offload.h): job = kind * n_units + unit. CPU runs submit JOB_STEP only,
 * as the unit number itself. */
#define JOB_STEP 0
#define JOB_ADD 1
static zt_status zero_off_job(void *opaque, int32_t job);

/* ---- helpers -------------------------------------------------------------------------------- */

static zt_status fail(const zero_state *s, zt_status st, const char *fmt, ...) ZT_PRINTF(3, 4);
static zt_status fail(const zero_state *s, zt_status st, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->host->error(s->host->ctx, st, PLUGIN_NAME " %s", msg);
    return st;
}

/* Which offload a buffer belongs to (zero_mem_where's `offloaded`, a bit mask): it lives in host memory
 * when that offload is on, pinned per that offload's pin_memory. */
#define OFFLOADED_OPTIMIZER 1
#define OFFLOADED_PARAM 2

/* Where a buffer lives. CPU runs: host memory. GPU runs: device memory, or host memory for what is
 * offloaded, page-locked (ZT_MEM_PINNED) when the pin_memory of an offload it belongs to is on. */
static int32_t zero_mem_where(const zero_state *s, int offloaded)
{
    if (s->host->device->device_type == ZT_DEVICE_CPU) return ZT_MEM_HOST;
    int opt = (offloaded & OFFLOADED_OPTIMIZER) && s->cfg.offload_optimizer;
    int param = (offloaded & OFFLOADED_PARAM) && s->cfg.offload_param;
    if (!opt && !param) return ZT_MEM_DEVICE;
    return (opt && s->cfg.pin_optimizer) || (param && s->cfg.pin_param) ? ZT_MEM_PINNED : ZT_MEM_HOST;
}

static void zero_range(void *arg, int64_t begin, int64_t end)
{
    memset((float *)arg + begin, 0, (size_t)(end - begin) * sizeof(float));
}

/* n zero-filled floats; NULL only on failure (n == 0 gives NULL and no error: nothing to hold). */
static float *zero_alloc_floats(const zero_state *s, int pool, int offloaded, int64_t n, const char *what, int32_t unit)
{
    if (n <= 0) return NULL;
    char tag[96];
    snprintf(tag, sizeof tag, PLUGIN_NAME " unit %d %s", (int)unit, what);
    int32_t where = zero_mem_where(s, offloaded);
    float *p = s->host->alloc(s->host->ctx, pool, where, (uint64_t)n * sizeof(float), 0, tag);
    /* host memory on every thread: offloaded 7B state is ~100 GB to clear */
    if (p && where != ZT_MEM_DEVICE) s->host->parallel_for(s->host->ctx, n, 1 << 20, zero_range, p);
    if (p && where == ZT_MEM_DEVICE && zero_cuda_zero(s->host, p, (uint64_t)n * sizeof(float)) != ZT_OK) {
        s->host->free(s->host->ctx, p);
        return NULL;
    }
    return p;
}

static void *zero_alloc_table(const zero_state *s, uint64_t bytes, const char *what)
{
    void *p = s->host->alloc(s->host->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, bytes ? bytes : 1, 0, what);
    if (p) memset(p, 0, bytes);
    return p;
}

/* The compute copy's 16 bits of fp32 on the CPU: bf16, the bits of the GPU's __float2bfloat16_rn and
 * of adamw's CPU compute_copy; or fp16 (fp16.enabled, GPU runs only), those of __float2half_rn. */
static void zero_bf16_host(const zero_state *s, const float *src, uint16_t *dst, int64_t n)
{
    zt_cpu_ctx cpu = {.parallel_for = s->host->parallel_for, .pool = s->host->ctx};
    if (s->compute16 == ZT_F16) zt_cpu_to_f16(&cpu, n, src, dst);
    else zt_cpu_to_bf16(&cpu, n, src, dst);
}

/* The optimizer writes the compute copy in its update pass (ABI 1.1), in this run's 16-bit type
 * (fp16 copies: ABI 1.2's ZT_OPTIM_WRITES_COMPUTE_COPY_F16); otherwise zero_refresh_compute_copy converts. */
static int zero_opt_writes_copy(const zero_state *s)
{
    if (!(s->opt->flags & ZT_OPTIM_WRITES_COMPUTE_COPY)) return 0;
    return s->compute16 != ZT_F16 || (s->opt->flags & ZT_OPTIM_WRITES_COMPUTE_COPY_F16);
}

/* y += x on the CPU (offload: a downloaded gradient slice into the host shard). */
typedef struct add_job {
    float *y;
    const float *x;
} add_job;

static void add_range(void *arg, int64_t begin, int64_t end)
{
    const add_job *j = arg;
    for (int64_t i = begin; i < end; i++) j->y[i] += j->x[i];
}

static int64_t numel_of(const zt_param_decl *p)
{
    int64_t n = 1;
    for (int32_t d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static int32_t find_param(const zt_model_info *m, const char *name)
{
    for (int32_t i = 0; i < m->n_params_decl; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    return -1;
}

static zt_status zero_check_unit(const zero_state *s, const char *call, int32_t unit)
{
    if (!s->units) return fail(s, ZT_ERR_INVALID_ARG, "%s called before setup", call);
    if (unit < 0 || unit >= s->n_units)
        return fail(s, ZT_ERR_INVALID_ARG, "%s: unit %d is not in [0, %d)", call, (int)unit, (int)s->n_units);
    return ZT_OK;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- collectives ---------------------------------------------------------------------------- */

/* GPU runs: every collective and its staging copies and adds run on the comm stream (the host's
 * default stream for collectives, the NULL below) after the compute stream's work so far; event
 * slots tell the compute stream when the data is there (zero_cuda.h). CPU runs: collectives are
 * synchronous and these are no-ops. Slots: reduce of unit u = u, gather of unit u = n_units + u,
 * "everything so far" = 2 n_units. */
static int32_t reduce_slot(int32_t u) { return u; }
static int32_t gather_slot(const zero_state *s, int32_t u) { return s->n_units + u; }
static int32_t all_slot(const zero_state *s) { return 2 * s->n_units; }

static zt_status comm_after_compute(zero_state *s)
{
    return s->gpu ? zero_cuda_comm_wait_compute(s->host, s->gpu) : ZT_OK;
}
static zt_status comm_done(zero_state *s, int32_t slot)
{
    return s->gpu ? zero_cuda_record_comm(s->host, s->gpu, slot) : ZT_OK;
}
static zt_status compute_after(zero_state *s, int32_t slot)
{
    return s->gpu ? zero_cuda_compute_wait(s->host, s->gpu, slot) : ZT_OK;
}
/* The compute stream waits for everything enqueued on the comm stream so far. */
static zt_status compute_after_all_comm(zero_state *s)
{
    if (!s->gpu) return ZT_OK;
    zt_status st = comm_done(s, all_slot(s));
    return st == ZT_OK ? compute_after(s, all_slot(s)) : st;
}
/* A staging copy of a collective: memcpy on the CPU, the comm stream on GPUs. */
static zt_status copy_bytes(zero_state *s, void *dst, const void *src, size_t bytes)
{
    if (s->gpu) return zero_cuda_copy_comm(s->host, dst, src, bytes);
    memcpy(dst, src, bytes);
    return ZT_OK;
}

/* ---- offload on GPUs: jobs, tickets and gradient downloads ------------------------------------ */

/* Queues `kind` for `unit` on the offload thread; *ticket: the number zero_offload_wait_for waits for.
 * Tickets count the engine's jobs, so on GPU runs every submission goes through here. */
static zt_status offload_submit(zero_state *s, int32_t kind, int32_t unit, int64_t *ticket)
{
    zt_status st = zero_offload_submit(s->off.thread, kind * s->n_units + unit);
    if (st != ZT_OK) return st;
    *ticket = ++s->off.submitted;
    return ZT_OK;
}

/* Host wait for job `ticket` (0: none); the first failure of the thread's jobs so far, if any. */
static zt_status offload_wait_for(zero_state *s, int64_t ticket)
{
    return ticket > 0 ? zero_offload_wait_for(s->off.thread, ticket) : ZT_OK;
}

/* Download buffer for the next copy, once the job that read it last is done. */
static zt_status take_down_buffer(zero_state *s, int32_t *buf)
{
    int32_t b = s->off.down_next;
    s->off.down_next ^= 1;
    *buf = b;
    return offload_wait_for(s, s->off.down_ticket[b]);
}

/* Stages 2-3: this rank's reduced slice of the unit (`slice`, device memory, the start of grad_full
 * after the in-place reduce-scatter) to the host gradient shard, on the comm stream behind the
 * reduction: the step's first contribution straight into the shard, later ones through a download
 * buffer the offload thread adds in (JOB_ADD). */
static zt_status zero_off_download_grads(zero_state *s, int32_t unit, const float *slice)
{
    unit_store *us = &s->units[unit];
    uint64_t bytes = (uint64_t)us->shard_count * sizeof(float);
    /* the download event is recorded again below: the jobs waiting on its last record must be done */
    zt_status st = offload_wait_for(s, us->off.last_ticket);
    if (st != ZT_OK) return st;
    if (us->off.fresh) {
        us->off.fresh = 0;
        return zero_cuda_download(s->host, s->gpu, unit, us->grad, slice, bytes);
    }
    int32_t b = 0;
    st = take_down_buffer(s, &b);
    if (st == ZT_OK) st = zero_cuda_download(s->host, s->gpu, unit, s->off.down[b], slice, bytes);
    us->off.add_buf = b;
    int64_t t = 0;
    if (st == ZT_OK) st = offload_submit(s, JOB_ADD, unit, &t);
    if (st == ZT_OK) s->off.down_ticket[b] = us->off.last_ticket = t;
    return st;
}

/* Unit `unit`'s gradients are reduced (stages 2-3: and on their way to the host shard): queue its
 * CPU step. Stage 1 first downloads its reduced slice (the start of the device gradients) into a
 * download buffer, on the comm stream behind the reduction. Nothing to do for a unit without
 * trainable elements in this rank's slice. */
static zt_status zero_off_submit_step(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (!us->n_state_elems) return ZT_OK;
    zt_status st = ZT_OK;
    int32_t b = -1;
    if (!SHARDED_GRADS) {
        st = offload_wait_for(s, us->off.last_ticket);
        if (st == ZT_OK) st = take_down_buffer(s, &b);
        if (st == ZT_OK)
            st = zero_cuda_download(s->host, s->gpu, unit, s->off.down[b], us->grad,
                                    (uint64_t)us->shard_count * sizeof(float));
        us->off.step_buf = b;
    }
    int64_t t = 0;
    if (st == ZT_OK) st = offload_submit(s, JOB_STEP, unit, &t);
    if (st != ZT_OK) return st;
    if (b >= 0) s->off.down_ticket[b] = t;
    us->off.last_ticket = us->off.step_ticket = t;
    if (s->off.early_now) s->off.early_count++;
    return ZT_OK;
}

/* Stage 0: SUM over "dp" in place, in pieces of at most reduce_bucket_size elements. */
static zt_status all_reduce_unit(zero_state *s, unit_store *us)
{
    if (s->dp.size <= 1) return ZT_OK;
    for (int64_t at = 0; at < us->n_grad; at += s->cfg.reduce_bucket) {
        int64_t n = min64(us->n_grad - at, s->cfg.reduce_bucket);
        zt_status st = s->host->all_reduce(s->host->ctx, &s->dp, us->grad + at, us->grad + at, (uint64_t)n, ZT_F32,
                                           ZT_REDUCE_SUM, NULL);
        if (st != ZT_OK) return st; /* the host recorded which collective failed */
    }
    return ZT_OK;
}

/* SUM-reduce-scatter `full` ([P], this rank's contribution) so that `shard` receives this rank's
 * reduced slice. shard == full: in place, the slice lands at the start of full (stage 1, and stages
 * 2-3 stepping in the backward). A unit whose slice exceeds reduce_chunk goes in pieces: piece j of
 * every rank's slice is packed into the staging buffer, which is reduce-scattered into piece j of
 * the result. Pieces run in increasing j, so in place a piece is written only where every piece
 * still to be packed has been read (on GPUs the copies and collectives are ordered on the comm
 * stream). The caller has ordered the comm stream after the compute stream. */
static zt_status reduce_scatter_unit(zero_state *s, const unit_store *us, float *full, float *shard)
{
    const zt_host *h = s->host;
    int64_t S = us->shard_count;
    if (s->dp.size == 1 && full == shard) return ZT_OK; /* one rank, in place: the sum is the data */
    if (S <= s->reduce_chunk)
        return h->reduce_scatter(h->ctx, &s->dp, full, shard, (uint64_t)S, ZT_F32, ZT_REDUCE_SUM, NULL);
    for (int64_t at = 0; at < S; at += s->reduce_chunk) {
        int64_t n = min64(S - at, s->reduce_chunk);
        zt_status st = ZT_OK;
        for (int32_t r = 0; r < s->dp.size && st == ZT_OK; r++)
            st = copy_bytes(s, s->reduce_staging + r * n, full + r * S + at, (size_t)n * sizeof(float));
        if (st == ZT_OK)
            st = h->reduce_scatter(h->ctx, &s->dp, s->reduce_staging, shard + at, (uint64_t)n, ZT_F32, ZT_REDUCE_SUM,
                                   NULL);
        if (st != ZT_OK) return st;
    }
    return ZT_OK;
}

/* The whole unit [P] (elements of `esz` bytes, `dtype`) from every rank's slice `send` of
 * shard_count elements; the inverse of reduce_scatter_unit's pieces. send == this rank's slot of
 * `full` (full + rank * S) gathers in place. The host's in-place form is send == recv, and backends
 * differ in where they read this rank's part then (NCCL's backend: the start of the buffer, as
 * reduce_scatter leaves it; MPI_IN_PLACE: the rank's slot). So the slice is first copied to the
 * start as well: each convention then finds it, and the start is overwritten by rank 0's slice in
 * either case. */
static zt_status all_gather_bytes(zero_state *s, const unit_store *us, const void *send, void *full, int32_t dtype,
                                  size_t esz)
{
    const zt_host *h = s->host;
    int64_t S = us->shard_count;
    int in_place = send == (const void *)((const char *)full + (size_t)s->dp.rank * (size_t)S * esz);
    if (in_place && s->dp.size == 1) return ZT_OK;
    if (S <= s->gather_chunk) {
        if (!in_place) return h->all_gather(h->ctx, &s->dp, send, full, (uint64_t)S, dtype, NULL);
        zt_status st = s->dp.rank > 0 ? copy_bytes(s, full, send, (size_t)S * esz) : ZT_OK;
        return st == ZT_OK ? h->all_gather(h->ctx, &s->dp, full, full, (uint64_t)S, dtype, NULL) : st;
    }
    for (int64_t at = 0; at < S; at += s->gather_chunk) {
        int64_t n = min64(S - at, s->gather_chunk);
        zt_status st = h->all_gather(h->ctx, &s->dp, (const char *)send + (size_t)at * esz, s->gather_staging,
                                     (uint64_t)n, dtype, NULL);
        for (int32_t r = 0; r < s->dp.size && st == ZT_OK; r++)
            st = copy_bytes(s, (char *)full + (size_t)(r * S + at) * esz,
                            (const char *)s->gather_staging + (size_t)(r * n) * esz, (size_t)n * esz);
        if (st != ZT_OK) return st;
    }
    return ZT_OK;
}

/* The model's compute copy of unit u from every rank's slice, enqueued. CPU runs: the fp32 master
 * shards into `compute`. GPU runs, bf16 (half the bytes of gathering fp32): stages 1-2 in place in
 * compute_bf16 (this rank's slice was written by the optimizer or a refresh), stage 3 in place after
 * casting the master shard into this rank's slot (cast_gather), or with offload from shard_bf16; the
 * gather's event is unit u's gather slot, which the compute stream waits on before the model reads
 * the copy. */
static zt_status zero_gather_unit(zero_state *s, int32_t u)
{
    unit_store *us = &s->units[u];
    zt_status st = comm_after_compute(s);
    if (st != ZT_OK) return st;
    if (!s->gpu) return all_gather_bytes(s, us, us->master, us->compute, ZT_F32, sizeof(float));
    /* offload: the offload thread uploads the unit's updated slice on the copy stream; gather after it */
    if (s->off.on_gpu) st = zero_cuda_comm_wait_upload(s->host, s->gpu, u);
    const uint16_t *send = SHARDED_PARAMS ? us->shard_bf16 : us->compute_bf16 + us->shard_offset;
    if (st == ZT_OK && s->cast_gather) {
        /* the master shard is on the device: its bf16 straight into this rank's slot, gathered in place */
        uint16_t *slot = us->compute_bf16 + us->shard_offset;
        st = zero_cuda_refresh_comm(s->host, s->gpu, us->master, slot, us->shard_count);
        send = slot;
    } else if (st == ZT_OK && SHARDED_PARAMS && s->cfg.offload_param) {
        /* the bf16 shard lives on the host, which collectives do not read: copy it into this rank's
         * slot of the gathered buffer and gather in place */
        uint16_t *slot = us->compute_bf16 + us->shard_offset;
        st = zero_cuda_copy_in_comm(s->host, s->gpu, slot, us->shard_bf16,
                                    (uint64_t)us->shard_count * sizeof(uint16_t));
        send = slot;
    }
    if (st == ZT_OK) st = all_gather_bytes(s, us, send, us->compute_bf16, s->compute16, sizeof(uint16_t));
    return st == ZT_OK ? comm_done(s, gather_slot(s, u)) : st;
}

/* Stages 0-1: the step's single reduction of a unit's accumulated gradients (on GPUs enqueued on
 * the comm stream; step() makes the compute stream wait before the norm). */
static zt_status zero_reduce_unit_once(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->reduced) return ZT_OK;
    us->reduced = 1;
    zt_status st = comm_after_compute(s);
    if (st == ZT_OK) st = STAGE == 0 ? all_reduce_unit(s, us) : reduce_scatter_unit(s, us, us->grad, us->grad);
    return st == ZT_OK ? comm_done(s, reduce_slot(unit)) : st;
}

/* Stages 2-3: add this micro-batch's transient gradients of storage unit u into its accumulator:
 * the accumulator joins this rank's own contribution first, so the reduce-scatter yields
 * accumulator + sum over ranks. On GPUs the add and the collective run on the comm stream. */
static zt_status reduce_into_shard(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    float *own = us->grad_full + us->shard_offset;
    zt_status st = comm_after_compute(s);
    if (st != ZT_OK) return st;
    if (s->gpu) st = zero_cuda_add_comm(s->host, s->gpu, own, us->grad, us->shard_count);
    else
        for (int64_t k = 0; k < us->shard_count; k++) own[k] += us->grad[k];
    if (st == ZT_OK) st = reduce_scatter_unit(s, us, us->grad_full, us->grad);
    return st == ZT_OK ? comm_done(s, reduce_slot(unit)) : st;
}

/* GPU runs: free the transient gradients whose reduction has finished reading them; the compute
 * stream waits for that reduction first (freeing is stream-ordered on the compute stream). Called
 * one unit later than the reduction, so the reduction overlaps the next unit's backward. */
static zt_status zero_flush_pending(zero_state *s, int32_t only)
{
    for (int32_t u = 0; u < s->n_units; u++) {
        unit_store *us = &s->units[u];
        if (!us->pending_free || (only >= 0 && u != only)) continue;
        zt_status st = compute_after(s, reduce_slot(u));
        if (st != ZT_OK) return st;
        s->host->free(s->host->ctx, us->pending_free);
        us->pending_free = NULL;
    }
    return ZT_OK;
}

/* ---- stage 3 gathers and stages 2-3 transient gradients --------------------------------------- */

static zt_status alloc_gathered(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (!s->gpu) {
        us->compute = zero_alloc_floats(s, ZT_POOL_PARAMS, 0, us->padded, "gathered parameters", unit);
        return us->compute || !us->padded ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
    }
    char tag[96];
    snprintf(tag, sizeof tag, PLUGIN_NAME " unit %d gathered bf16 parameters", (int)unit);
    us->compute_bf16 = us->padded ? s->host->alloc(s->host->ctx, ZT_POOL_PARAMS, ZT_MEM_DEVICE,
                                                   (uint64_t)us->padded * sizeof(uint16_t), 0, tag)
                                  : NULL;
    return us->compute_bf16 || !us->padded ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
}

static void free_gathered(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    s->host->free(s->host->ctx, us->compute);
    s->host->free(s->host->ctx, us->compute_bf16);
    us->compute = NULL;
    us->compute_bf16 = NULL;
}

static zt_status zero_hold_params(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->live++ > 0) return ZT_OK;
    if (us->prefetched) { /* gathered ahead on the comm stream: wait for it on the compute stream */
        us->prefetched = 0;
        return compute_after(s, gather_slot(s, unit));
    }
    zt_status st = alloc_gathered(s, unit);
    if (st == ZT_OK) st = zero_gather_unit(s, unit);
    if (st == ZT_OK) st = compute_after(s, gather_slot(s, unit));
    if (st != ZT_OK) {
        free_gathered(s, unit);
        us->live = 0;
    }
    return st;
}

static void zero_release_params(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->live == 0 || --us->live > 0) return;
    free_gathered(s, unit); /* the model's reads of it are earlier on the compute stream */
}

/* GPU runs, stage 3: gather unit u ahead on the comm stream, while the current unit computes. */
static zt_status prefetch_params(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->live > 0 || us->prefetched) return ZT_OK;
    zt_status st = alloc_gathered(s, unit);
    if (st == ZT_OK) st = zero_gather_unit(s, unit);
    if (st != ZT_OK) {
        free_gathered(s, unit);
        return st;
    }
    us->prefetched = 1;
    return ZT_OK;
}

/* A prefetched unit that will not be used next: free it once its gather is done. */
static zt_status drop_prefetch(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (!us->prefetched) return ZT_OK;
    us->prefetched = 0;
    zt_status st = compute_after(s, gather_slot(s, unit));
    free_gathered(s, unit);
    return st;
}

/* Stage 3 on GPUs: prefetch the storage units of the unit that runs after `unit` in this phase
 * (forward: unit + 1, backward: unit - 1), up to stage3_prefetch_bucket_size elements, and drop
 * prefetches that neither this unit nor the next one uses. */
static zt_status zero_prefetch_next(zero_state *s, int32_t unit, int32_t phase)
{
    int32_t next = phase == ZT_PHASE_FORWARD ? unit + 1 : unit - 1;
    int has_next = next >= 0 && next < s->n_units;
    zt_status st = ZT_OK;
    for (int32_t u = 0; u < s->n_units && st == ZT_OK; u++) {
        if (!s->units[u].prefetched) continue;
        int used = 0;
        for (int32_t k = 0; has_next && k < s->units[next].n_touched; k++) used |= s->units[next].touched[k] == u;
        if (!used) st = drop_prefetch(s, u);
    }
    if (st != ZT_OK || !has_next || s->cfg.prefetch_bucket <= 0) return st;
    int64_t budget = s->cfg.prefetch_bucket;
    for (int32_t k = 0; k < s->units[next].n_touched && st == ZT_OK; k++) {
        int32_t home = s->units[next].touched[k];
        if (s->units[home].live > 0 || s->units[home].prefetched) continue;
        if (s->units[home].padded > budget) break;
        budget -= s->units[home].padded;
        st = prefetch_params(s, home);
    }
    return st;
}

/* The transient full gradients of one storage unit's backward: stages 2-3 always; stages 0-1 when
 * stepping in the backward (then `grad` itself is transient). Zero-filled. */
static zt_status zero_hold_grads(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (!SHARDED_GRADS) { /* step_in_backward only: allocated by the first backward touching it */
        if (us->grad || !us->n_grad) return ZT_OK;
        us->grad = zero_alloc_floats(s, ZT_POOL_GRADS, 0, us->n_grad, "gradients of this step (transient)", unit);
        return us->grad ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
    }
    if (us->grad_refs++ > 0) return ZT_OK;
    if (us->pending_free) { /* its previous reduction may still read the old buffer */
        zt_status st = zero_flush_pending(s, unit);
        if (st != ZT_OK) return st;
    }
    us->grad_full = zero_alloc_floats(s, ZT_POOL_GRADS, 0, us->padded, "gradients of this backward", unit);
    if (us->grad_full) return ZT_OK;
    us->grad_refs = 0;
    return ZT_ERR_OUT_OF_MEMORY;
}

static zt_status zero_sib_step_unit(zero_state *s, int32_t unit, const float *grads);

/* Stages 2-3: reduce the transient gradients once the last backward writing them is done, then free
 * them (GPU runs: one unit later, zero_flush_pending). Stepping in the backward, a storage unit written by
 * one unit only is reduced in place and stepped from the transient buffer, one written by several
 * (a tied embedding) accumulates in its shard as usual and is stepped by its last writer. */
static zt_status zero_release_grads(zero_state *s, int32_t unit, int32_t by)
{
    unit_store *us = &s->units[unit];
    if (us->grad_refs == 0 || --us->grad_refs > 0) return ZT_OK;
    zt_status st;
    if (s->sib.on && !us->grad) {
        st = comm_after_compute(s);
        if (st == ZT_OK) st = reduce_scatter_unit(s, us, us->grad_full, us->grad_full);
        if (st == ZT_OK) st = comm_done(s, reduce_slot(unit));
        if (st == ZT_OK) st = compute_after(s, reduce_slot(unit));
        if (st == ZT_OK) st = zero_sib_step_unit(s, unit, us->grad_full);
        s->host->free(s->host->ctx, us->grad_full); /* stream-ordered after the step's reads */
        us->grad_full = NULL;
        return st;
    }
    if (s->off.on_gpu) { /* offload: reduce in place, the slice down to the host shard (zero_off_download_grads) */
        st = comm_after_compute(s);
        if (st == ZT_OK) st = reduce_scatter_unit(s, us, us->grad_full, us->grad_full);
        if (st == ZT_OK) st = zero_off_download_grads(s, unit, us->grad_full);
        /* recorded after the download, so zero_flush_pending frees grad_full once the copy has read it */
        if (st == ZT_OK) st = comm_done(s, reduce_slot(unit));
        us->pending_free = us->grad_full;
        us->grad_full = NULL;
        if (st == ZT_OK && s->off.early_now && us->sib_step_at == by) st = zero_off_submit_step(s, unit);
        return st;
    }
    st = reduce_into_shard(s, unit);
    if (s->gpu) {
        us->pending_free = us->grad_full;
    } else {
        s->host->free(s->host->ctx, us->grad_full);
    }
    us->grad_full = NULL;
    if (st == ZT_OK && s->sib.on && us->sib_step_at == by) {
        st = compute_after(s, reduce_slot(unit));
        if (st == ZT_OK) st = zero_sib_step_unit(s, unit, us->grad);
    }
    return st;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static zt_status zero_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static zt_status read_options(zero_state *s)
{
    const zt_host *h = s->host;
    int32_t reduce_scatter = 1, allgather_partitions = 1, contiguous = 1, pin_optimizer = 1, pin_param = 1;
    const char *offload_optimizer = "none", *offload_param = "none";
    zt_status st = h->cfg_bool(h->ctx, "zero_optimization.overlap_comm", &s->cfg.overlap_comm);
    if (st == ZT_OK) st = h->cfg_int(h->ctx, "zero_optimization.reduce_bucket_size", &s->cfg.reduce_bucket);
    if (st == ZT_OK) st = h->cfg_int(h->ctx, "zero_optimization.allgather_bucket_size", &s->cfg.allgather_bucket);
    if (st == ZT_OK) st = h->cfg_int(h->ctx, "zero_optimization.stage3_prefetch_bucket_size", &s->cfg.prefetch_bucket);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.reduce_scatter", &reduce_scatter);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.allgather_partitions", &allgather_partitions);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.contiguous_gradients", &contiguous);
    if (st == ZT_OK) st = h->cfg_string(h->ctx, "zero_optimization.offload_optimizer.device", &offload_optimizer);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.offload_optimizer.pin_memory", &pin_optimizer);
    if (st == ZT_OK) st = h->cfg_string(h->ctx, "zero_optimization.offload_param.device", &offload_param);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.offload_param.pin_memory", &pin_param);
    if (st != ZT_OK) return fail(s, st, "cannot read its options (status %d): a host bug", (int)st);

    s->cfg.offload_optimizer = !strcmp(offload_optimizer, "cpu");
    s->cfg.offload_param = !strcmp(offload_param, "cpu");
    s->cfg.pin_optimizer = pin_optimizer;
    s->cfg.pin_param = pin_param;
    if (!reduce_scatter || !allgather_partitions || !contiguous)
        return fail(s, ZT_ERR_CONFIG,
                    "options: zero_optimization.%s is false, but zt always %s; remove the key or set it to true",
                    !reduce_scatter ? "reduce_scatter" : !allgather_partitions ? "allgather_partitions"
                                                                                : "contiguous_gradients",
                    !reduce_scatter         ? "reduces sharded gradients with a reduce-scatter"
                    : !allgather_partitions ? "gathers updated parameters with an all-gather"
                                            : "keeps gradients in contiguous per-unit buffers");
    if (STAGE == 0 && s->cfg.offload_optimizer)
        return fail(s, ZT_ERR_CONFIG,
                    "options: zero_optimization.offload_optimizer.device is \"cpu\", but offloading the optimizer "
                    "needs a sharded optimizer (stage 1, 2 or 3, as in DeepSpeed); set "
                    "zero_optimization.stage to 1 or more, or the device to \"none\"");
    if (STAGE < 3 && s->cfg.offload_param)
        return fail(s, ZT_ERR_CONFIG,
                    "options: zero_optimization.offload_param.device is \"cpu\", but offloading parameters needs "
                    "stage 3 (as in DeepSpeed); set zero_optimization.stage to 3, or the device to \"none\"");
    return ZT_OK;
}

static zt_status zero_init(const zt_host *host, void **state_out)
{
    zero_state *s = host->alloc(host->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, sizeof *s, 0, PLUGIN_NAME " state");
    if (!s) return ZT_ERR_OUT_OF_MEMORY;
    memset(s, 0, sizeof *s);
    s->host = host;
    zt_status st = read_options(s);
    if (st != ZT_OK) {
        host->free(host->ctx, s);
        return st;
    }
    *state_out = s;
    return ZT_OK;
}

static void zero_fini(void *opaque)
{
    zero_state *s = opaque;
    if (!s) return;
    const zt_host *h = s->host;
    zero_offload_destroy(s->off.thread); /* first: its thread may still touch the buffers below */
    /* GPU runs: collectives still queued on the comm stream may read buffers freed below (stream-
     * ordered on the compute stream) */
    if (s->gpu) (void)compute_after_all_comm(s);
    /* offload: uploads on the copy stream may still write device copies or read staging buffers */
    if (s->gpu && s->off.on_gpu) (void)zero_cuda_sync_copy(h, s->gpu);
    for (int32_t u = 0; s->units && u < s->n_units; u++) {
        unit_store *us = &s->units[u];
        h->free(h->ctx, us->compute);
        h->free(h->ctx, us->compute_bf16);
        h->free(h->ctx, us->shard_bf16);
        h->free(h->ctx, us->pending_free);
        if (us->master != us->compute) h->free(h->ctx, us->master);
        h->free(h->ctx, us->grad);
        h->free(h->ctx, us->grad_full);
        for (int32_t k = 0; us->state && k < s->n_state; k++) h->free(h->ctx, us->state[k]);
        h->free(h->ctx, us->state);
        h->free(h->ctx, us->touched);
    }
    h->free(h->ctx, s->units);
    h->free(h->ctx, s->storage);
    h->free(h->ctx, s->grad_view);
    h->free(h->ctx, s->ranges);
    h->free(h->ctx, s->norm_tensors);
    h->free(h->ctx, s->norm_sizes);
    h->free(h->ctx, s->norm_parts);
    h->free(h->ctx, s->reduce_staging);
    h->free(h->ctx, s->gather_staging);
    h->free(h->ctx, s->sib.norms);
    for (int32_t b = 0; b < 2; b++) {
        h->free(h->ctx, s->off.down[b]);
        h->free(h->ctx, s->off.up[b]);
    }
    h->free(h->ctx, s->off.unit_square);
    h->free(h->ctx, s->off.job_tensors);
    h->free(h->ctx, s->off.job_sizes);
    zero_cuda_destroy(h, s->gpu);
    h->free(h->ctx, s);
}

/* ---- setup ---------------------------------------------------------------------------------- */

/* GPU runs: this rank's bf16 copy of a unit's master, after every write of the master that the
 * optimizer did not convert itself (setup, load, an optimizer without compute_copy, offload_param
 * without offload_optimizer): stage 0 the whole unit, stages 1-2 this rank's slice of compute_bf16
 * (then gathered, gather_pending), stage 3 the bf16 shard (gathered when the unit is next used).
 * With offload the master (offload_optimizer) or the stage-3 bf16 shard (offload_param) is host
 * memory, which kernels do not read: converted on the CPU, or on the GPU into a transient buffer,
 * and copied across (a host wait; setup, load, and per step only with offload_param alone). */
static zt_status zero_refresh_compute_copy(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (!us->padded) return ZT_OK;
    if (STAGE == 0) return zero_cuda_refresh(s->host, s->gpu, us->master, us->compute_bf16, us->padded);
    if (s->cast_gather) return ZT_OK; /* every gather casts the master afresh */
    const zt_host *h = s->host;
    int64_t n = us->shard_count;
    uint64_t bytes = (uint64_t)n * sizeof(uint16_t);
    uint16_t *target = SHARDED_PARAMS ? us->shard_bf16 : us->compute_bf16 + us->shard_offset;
    int master_on_host = s->off.on_gpu, target_on_host = SHARDED_PARAMS && s->cfg.offload_param;
    zt_status st = ZT_OK;
    if (!master_on_host && !target_on_host) {
        st = zero_cuda_refresh(h, s->gpu, us->master, target, n);
    } else if (master_on_host && target_on_host) {
        st = zero_cuda_sync_comm(h, s->gpu); /* a gather may still copy the old shard up */
        if (st == ZT_OK) zero_bf16_host(s, us->master, target, n);
    } else if (master_on_host) { /* through the first upload staging buffer */
        st = zero_cuda_sync_copy(h, s->gpu); /* its last upload, and any upload into target */
        if (st == ZT_OK) zero_bf16_host(s, us->master, s->off.up[0], n);
        if (st == ZT_OK) st = zero_cuda_copy(h, target, s->off.up[0], bytes);
    } else { /* master on the device, bf16 shard on the host: through a transient device buffer */
        char tag[96];
        snprintf(tag, sizeof tag, PLUGIN_NAME " unit %d bf16 shard (transient, for the host copy)", (int)unit);
        uint16_t *tmp = h->alloc(h->ctx, ZT_POOL_PARAMS, ZT_MEM_DEVICE, bytes, 0, tag);
        if (!tmp) return ZT_ERR_OUT_OF_MEMORY;
        st = zero_cuda_sync_comm(h, s->gpu); /* a gather may still copy the old shard up */
        if (st == ZT_OK) st = zero_cuda_refresh(h, s->gpu, us->master, tmp, n);
        if (st == ZT_OK) st = zero_cuda_copy(h, target, tmp, bytes); /* waits, so tmp is free to go */
        h->free(h->ctx, tmp);
    }
    if (!SHARDED_PARAMS) us->stale = 1; /* gathered at the unit's next before_unit, or by step() */
    return st;
}

/* Offload on GPUs: the host buffers the copies go through (two fp32 download buffers and two bf16
 * upload staging buffers of the largest shard; host memory, pinned per offload_optimizer.pin_memory),
 * the offload thread's tables, and the copy events. */
static zt_status zero_off_setup_gpu(zero_state *s)
{
    int64_t largest = 0;
    for (int32_t u = 0; u < s->n_units; u++) {
        s->units[u].off.fresh = 1;
        if (s->units[u].shard_count > largest) largest = s->units[u].shard_count;
    }
    zt_status st = zero_cuda_offload_init(s->host, s->gpu, s->n_units, 2);
    int32_t where = zero_mem_where(s, OFFLOADED_OPTIMIZER);
    for (int32_t b = 0; b < 2 && st == ZT_OK && largest; b++) {
        /* pool grads/params: what estimate_gpu counts them as (the staging as params) */
        s->off.down[b] = s->host->alloc(s->host->ctx, ZT_POOL_GRADS, where, (uint64_t)largest * sizeof(float), 0,
                                    PLUGIN_NAME " offload gradient download buffer");
        s->off.up[b] = s->host->alloc(s->host->ctx, ZT_POOL_PARAMS, where, (uint64_t)largest * sizeof(uint16_t), 0,
                                  PLUGIN_NAME " offload bf16 upload staging");
        if (!s->off.down[b] || !s->off.up[b]) st = ZT_ERR_OUT_OF_MEMORY;
    }
    if (st == ZT_OK) {
        int32_t n_params = s->layout->model->n_params_decl;
        s->off.unit_square = zero_alloc_table(s, (uint64_t)s->n_units * sizeof(double), PLUGIN_NAME " unit norms");
        s->off.job_tensors =
            zero_alloc_table(s, (uint64_t)n_params * sizeof *s->off.job_tensors, PLUGIN_NAME " offload norm");
        s->off.job_sizes =
            zero_alloc_table(s, (uint64_t)n_params * sizeof *s->off.job_sizes, PLUGIN_NAME " offload norm");
        if (!s->off.unit_square || !s->off.job_tensors || !s->off.job_sizes) st = ZT_ERR_OUT_OF_MEMORY;
    }
    return st;
}

/* GPU runs: the kernel context (sized for the norm over the optimizer's ranges), the stream events,
 * and the bf16 copies: [P] for stages 0-2; stage 3 gathers its [P] per use, from the master itself
 * without offload (cast_gather), else from an [S] bf16 shard (host memory with offload_param). */
static zt_status setup_gpu(zero_state *s)
{
    s->cast_gather = SHARDED_PARAMS && !s->off.on_gpu && !s->cfg.offload_param;
    for (int32_t r = 0; r < s->n_ranges; r++) s->norm_sizes[r] = s->ranges[r].count;
    zt_status st = zero_cuda_create(s->host, PLUGIN_NAME, s->n_ranges, s->norm_sizes, 2 * s->n_units + 1, s->n_units,
                                    s->dp.size, &s->gpu);
    if (st == ZT_OK && s->sib.on) {
        s->sib.norms = zero_alloc_table(s, (uint64_t)s->n_units * sizeof(float), PLUGIN_NAME " unit norms");
        if (!s->sib.norms) st = ZT_ERR_OUT_OF_MEMORY;
    }
    if (st == ZT_OK && s->off.on_gpu) st = zero_off_setup_gpu(s);
    for (int32_t u = 0; u < s->n_units && st == ZT_OK; u++) {
        unit_store *us = &s->units[u];
        if (!us->padded || s->cast_gather) continue;
        char tag[96];
        int64_t n = SHARDED_PARAMS ? us->shard_count : us->padded;
        snprintf(tag, sizeof tag, PLUGIN_NAME " unit %d bf16 parameters%s", (int)u, SHARDED_PARAMS ? " (shard)" : "");
        int32_t where = SHARDED_PARAMS ? zero_mem_where(s, OFFLOADED_PARAM) : ZT_MEM_DEVICE;
        uint16_t *copy = s->host->alloc(s->host->ctx, ZT_POOL_PARAMS, where, (uint64_t)n * sizeof(uint16_t), 0, tag);
        if (SHARDED_PARAMS) us->shard_bf16 = copy;
        else us->compute_bf16 = copy;
        st = copy ? zero_refresh_compute_copy(s, u) : ZT_ERR_OUT_OF_MEMORY;
    }
    return st;
}

/* Tied parameters: which parameter's storage each uses, and which storage units each unit touches. */
static zt_status plan_storage(zero_state *s)
{
    const zt_layout *l = s->layout;
    const zt_model_info *m = l->model;
    for (int32_t i = 0; i < m->n_params_decl; i++) {
        s->storage[i] = i;
        if (!(m->params[i].flags & ZT_PARAM_TIED)) continue;
        int32_t owner = find_param(m, m->params[i].tied_to);
        if (owner < 0)
            return fail(s, ZT_ERR_INVALID_ARG,
                        "setup: parameter '%s' is tied to '%s', which the model does not declare", m->params[i].name,
                        m->params[i].tied_to);
        s->storage[i] = owner;
        /* Backward runs units in reverse: an owner in a later unit would be reduced before the
         * earlier unit's contribution arrives. */
        if (m->params[owner].unit > m->params[i].unit) s->units[m->params[owner].unit].reduce_in_step = 1;
    }
    for (int32_t u = 0; u < l->n_units; u++) {
        const zt_unit_layout *ul = &l->units[u];
        unit_store *us = &s->units[u];
        us->touched = zero_alloc_table(s, (uint64_t)(ul->n_params + 1) * sizeof(int32_t), PLUGIN_NAME " storage units");
        if (!us->touched) return ZT_ERR_OUT_OF_MEMORY;
        us->touched[us->n_touched++] = u;
        for (int32_t i = ul->first_param; i < ul->first_param + ul->n_params; i++) {
            int32_t home = m->params[s->storage[i]].unit, seen = 0;
            for (int32_t k = 0; k < us->n_touched; k++) seen |= us->touched[k] == home;
            if (!seen) us->touched[us->n_touched++] = home;
        }
    }
    /* step_in_backward steps a storage unit at the grads_ready of the earliest unit touching it: the
     * last backward that writes its gradients (units run in reverse). */
    for (int32_t u = 0; u < l->n_units; u++) s->units[u].sib_step_at = -1;
    for (int32_t u = l->n_units - 1; u >= 0; u--)
        for (int32_t k = 0; k < s->units[u].n_touched; k++) {
            unit_store *hs = &s->units[s->units[u].touched[k]];
            hs->sib_step_at = u;
            hs->n_touchers++;
        }
    return ZT_OK;
}

/* This rank's slice of every unit, the optimizer ranges inside it and the gradient view offsets. */
static void plan_slices(zero_state *s)
{
    const zt_layout *l = s->layout;
    const zt_model_info *m = l->model;
    int32_t n_ranges = 0;
    for (int32_t u = 0; u < l->n_units; u++) {
        const zt_unit_layout *ul = &l->units[u];
        unit_store *us = &s->units[u];
        us->padded = ul->padded_numel;
        us->shard_count = SHARDED_MASTER ? us->padded / s->dp.size : us->padded;
        us->shard_offset = SHARDED_MASTER ? s->dp.rank * us->shard_count : 0;
        int64_t lo = us->shard_offset, hi = lo + us->shard_count, packed = 0;
        for (int32_t i = ul->first_param; i < ul->first_param + ul->n_params; i++) {
            s->grad_view[i] = -1;
            if (l->param_offset[i] < 0 || !l->trainable[i]) continue; /* tied (its owner's) or frozen */
            int64_t begin = l->param_offset[i], end = begin + numel_of(&m->params[i]);
            s->grad_view[i] = STAGE == 0 ? packed : begin;
            int64_t from = begin > lo ? begin : lo, to = end < hi ? end : hi;
            if (from >= to) continue;
            int64_t count = to - from, master = from - lo;
            opt_range *last = n_ranges ? &s->ranges[n_ranges - 1] : NULL;
            if (last && last->unit == u && last->decay == (int32_t)l->decay[i] &&
                last->master_offset + last->count == master) {
                last->count += count;
            } else {
                s->ranges[n_ranges++] = (opt_range){.unit = u,
                                                    .decay = l->decay[i],
                                                    .master_offset = master,
                                                    .grad_offset = STAGE == 0 ? packed : master,
                                                    .state_offset = packed,
                                                    .count = count};
            }
            packed += count;
        }
        us->n_state_elems = packed;
        us->n_grad = STAGE == 0 ? packed : STAGE == 1 ? us->padded : us->shard_count;
    }
    s->n_ranges = n_ranges;
}

/* Elements per rank per collective, and the staging buffers for units larger than that. */
static zt_status plan_buckets(zero_state *s)
{
    int64_t largest = 0, d = s->dp.size;
    for (int32_t u = 0; u < s->n_units; u++)
        if (s->units[u].shard_count > largest) largest = s->units[u].shard_count;
    s->reduce_chunk = s->cfg.reduce_bucket / d > 0 ? s->cfg.reduce_bucket / d : 1;
    s->gather_chunk = s->cfg.allgather_bucket / d > 0 ? s->cfg.allgather_bucket / d : 1;
    if (STAGE >= 1 && largest > s->reduce_chunk) {
        s->reduce_staging = zero_alloc_floats(s, ZT_POOL_COMM, 0, d * s->reduce_chunk, "reduce bucket (staging)", -1);
        if (!s->reduce_staging) return ZT_ERR_OUT_OF_MEMORY;
    }
    if (STAGE >= 1 && largest > s->gather_chunk) {
        s->gather_staging =
            zero_alloc_floats(s, ZT_POOL_COMM, 0, d * s->gather_chunk, "all-gather bucket (staging)", -1);
        if (!s->gather_staging) return ZT_ERR_OUT_OF_MEMORY;
    }
    return ZT_OK;
}

static zt_status alloc_unit(zero_state *s, int32_t u)
{
    unit_store *us = &s->units[u];
    /* GPU runs, stages 1-2: the model reads compute_bf16 and the master is the shard, so no fp32 [P] */
    int gpu = s->host->device->device_type == ZT_DEVICE_CUDA;
    if (!SHARDED_PARAMS && !(gpu && SHARDED_MASTER)) {
        us->compute = zero_alloc_floats(s, ZT_POOL_PARAMS, 0, us->padded, "parameters", u);
        if (us->padded && !us->compute) return ZT_ERR_OUT_OF_MEMORY;
    }
    if (SHARDED_MASTER) {
        /* the master lives with the optimizer: offload_param moves the stage-3 bf16 shard (setup_gpu) */
        us->master = zero_alloc_floats(s, ZT_POOL_PARAMS, OFFLOADED_OPTIMIZER, us->shard_count, "fp32 master shard", u);
        if (us->shard_count && !us->master) return ZT_ERR_OUT_OF_MEMORY;
    } else {
        us->master = us->compute;
    }
    /* step_in_backward: stages 0-1 allocate gradients per step and unit (zero_hold_grads); stages 2-3 keep a
     * shard accumulator only for a storage unit several units write (a tied embedding) */
    int transient = s->sib.on && (!SHARDED_GRADS || us->n_touchers <= 1);
    if (!transient) {
        us->grad =
            zero_alloc_floats(s, ZT_POOL_GRADS, SHARDED_GRADS ? OFFLOADED_OPTIMIZER : 0, us->n_grad, "gradients", u);
        if (us->n_grad && !us->grad) return ZT_ERR_OUT_OF_MEMORY;
    }
    if (!s->n_state) return ZT_OK;
    us->state = zero_alloc_table(s, (uint64_t)s->n_state * sizeof(float *), PLUGIN_NAME " state table");
    if (!us->state) return ZT_ERR_OUT_OF_MEMORY;
    for (int32_t k = 0; k < s->n_state; k++) {
        const char *name = s->opt->state_name ? s->opt->state_name(s->opt_state, k) : NULL;
        us->state[k] = zero_alloc_floats(s, ZT_POOL_OPTIMIZER, OFFLOADED_OPTIMIZER, us->n_state_elems,
                                         name ? name : "optimizer state", u);
        if (us->n_state_elems && !us->state[k]) return ZT_ERR_OUT_OF_MEMORY;
    }
    return ZT_OK;
}

/* zero_optimization.step_in_backward: the step inside the backward equals the step after it only
 * when the update of a unit needs nothing of the other units: no clipping (the global norm), no loss
 * scale (fp16: a non-finite norm must skip the step), one micro-batch per step (the gradient is
 * complete at the first backward). auto: on for such runs on one GPU (the memory of a full gradient
 * buffer matters there; on several the overlap of reductions with the backward matters more); true:
 * refuse what is not exact; false: never. Offload steps on its own thread. */
static zt_status zero_sib_decide(zero_state *s, int gpu)
{
    const zt_host *h = s->host;
    const char *mode = "auto";
    double clip = -1;
    int64_t accumulation = 0;
    int32_t fp16 = 0;
    if (h->cfg_string(h->ctx, "zero_optimization.step_in_backward", &mode) != ZT_OK || !mode)
        return fail(s, ZT_ERR_INTERNAL, "cannot read zero_optimization.step_in_backward: a host bug");
    s->sib.on = 0;
    if (!strcmp(mode, "false")) return ZT_OK;
    /* host keys (docs/config.md); a host that does not answer leaves the mode undecidable: off */
    int known = h->cfg_float(h->ctx, "gradient_clipping", &clip) == ZT_OK &&
                h->cfg_int(h->ctx, "gradient_accumulation_steps", &accumulation) == ZT_OK &&
                h->cfg_bool(h->ctx, "fp16.enabled", &fp16) == ZT_OK;
    int exact = known && clip == 0 && accumulation == 1 && !fp16;
    int offload = s->cfg.offload_optimizer || s->cfg.offload_param;
    /* offload_optimizer on GPUs: the offload thread steps each unit once its gradients reach the host,
     * during the backward (the same exactness conditions); gradients keep their buffers */
    int early_offload = gpu && s->cfg.offload_optimizer;
    if (!strcmp(mode, "auto")) {
        /* One GPU only: with several, stepping unit by unit makes the compute stream wait for each
         * unit's reduction, which then no longer overlaps the next unit's backward (measured on 2
         * H200s, 1.1B zero1/zero2: 92% scaling with it, 98% without). */
        s->sib.on = exact && gpu && !offload && s->dp.size == 1;
        s->off.early = exact && early_offload;
        return ZT_OK;
    }
    if (!exact || (offload && !early_offload))
        return fail(s, ZT_ERR_CONFIG,
                    "options: zero_optimization.step_in_backward is true, but stepping the optimizer inside the "
                    "backward is exact only with gradient_clipping 0 (this run: %g), gradient_accumulation_steps "
                    "1 (this run: %lld), fp16.enabled false (this run: %s) and no offload other than "
                    "offload_optimizer on a GPU run (this run: %s); change those, or set "
                    "zero_optimization.step_in_backward to \"auto\" or false",
                    clip, (long long)accumulation, fp16 ? "true" : "false",
                    !offload ? "no offload" : early_offload ? "offload_optimizer on a GPU run" : gpu ? "offload_param alone"
                                                                                             : "offload on a CPU run");
    if (early_offload) s->off.early = 1;
    else s->sib.on = 1;
    return ZT_OK;
}

static zt_status zero_setup(void *opaque, const zt_layout *layout, const zt_optimizer_ops *opt, void *opt_state)
{
    zero_state *s = opaque;
    const zt_host *h = s->host;
    if (s->units) return fail(s, ZT_ERR_INVALID_ARG, "setup called twice");
    if (!layout || layout->struct_size < sizeof(zt_layout) || !layout->model || !opt || !opt->step)
        return fail(s, ZT_ERR_INVALID_ARG, "setup: the layout or the optimizer ops are missing or too old");
    int gpu = h->device->device_type == ZT_DEVICE_CUDA;
    s->off.on_gpu = gpu && s->cfg.offload_optimizer;
    if (gpu && (!GPU_CAPABLE || (layout->compute_dtype != ZT_BF16 && layout->compute_dtype != ZT_F16)))
        return fail(s, ZT_ERR_UNSUPPORTED,
                    "trains on GPUs only when built with CUDA and computing in bf16 or fp16 (this run: compute dtype "
                    "%d%s); rebuild zt where the CUDA toolkit is installed, or train on the CPU (device = cpu)",
                    (int)layout->compute_dtype, GPU_CAPABLE ? "" : ", a plugin built without CUDA");
    if (!gpu && (h->device->device_type != ZT_DEVICE_CPU || layout->compute_dtype != ZT_F32))
        return fail(s, ZT_ERR_UNSUPPORTED,
                    "runs on the CPU in fp32 only for now (this run: %s, compute dtype %d); train on the CPU",
                    h->device->device_type == ZT_DEVICE_CUDA ? "CUDA" : "CPU", (int)layout->compute_dtype);
    s->compute16 = layout->compute_dtype == ZT_F16 ? ZT_F16 : ZT_BF16;
    zt_status st = h->group_get(h->ctx, "dp", &s->dp);
    if (st != ZT_OK) return st; /* the host's message names the missing group */
    st = zero_sib_decide(s, gpu);
    if (st != ZT_OK) return st;
    if (s->sib.on)
        h->log(h->ctx, ZT_LOG_INFO,
               "step_in_backward: the optimizer steps each unit inside the backward, as soon as its gradients "
               "are reduced; gradients exist only per unit");
    if (s->off.on_gpu)
        h->log(h->ctx, ZT_LOG_INFO,
               "offload_optimizer: the fp32 master, optimizer state%s live in %s host memory and the optimizer "
               "steps on the CPU; %s",
               SHARDED_GRADS ? " and gradient shards" : "", s->cfg.pin_optimizer ? "pinned" : "pageable",
               s->off.early ? "each unit is stepped during the backward as soon as its gradients reach the host "
                              "(no clipping, one micro-batch)"
                            : "units are stepped after the backward (the global norm comes first)");
    for (int32_t u = 0; u < layout->n_units; u++)
        if (layout->units[u].padded_numel % s->dp.size != 0)
            return fail(s, ZT_ERR_INVALID_ARG,
                        "setup: unit %d has %lld padded elements, which do not split evenly over the %d data-"
                        "parallel ranks; the layout was built for another data-parallel size (a host bug)",
                        (int)u, (long long)layout->units[u].padded_numel, (int)s->dp.size);
    s->n_state = opt->n_state ? opt->n_state(opt_state) : 0;
    if (s->n_state < 0 || s->n_state > MAX_OPT_STATES)
        return fail(s, ZT_ERR_UNSUPPORTED,
                    "setup: the optimizer has %d state arrays per element; 0 to %d are supported", (int)s->n_state,
                    MAX_OPT_STATES);

    const zt_model_info *m = layout->model;
    int32_t n_params = m->n_params_decl;
    s->layout = layout;
    s->opt = opt;
    s->opt_state = opt_state;
    s->units = zero_alloc_table(s, (uint64_t)layout->n_units * sizeof *s->units, PLUGIN_NAME " units");
    s->storage = zero_alloc_table(s, (uint64_t)n_params * sizeof *s->storage, PLUGIN_NAME " ties");
    s->grad_view = zero_alloc_table(s, (uint64_t)n_params * sizeof *s->grad_view, PLUGIN_NAME " offsets");
    s->ranges = zero_alloc_table(s, (uint64_t)n_params * sizeof *s->ranges, PLUGIN_NAME " ranges");
    s->norm_tensors = zero_alloc_table(s, (uint64_t)n_params * sizeof *s->norm_tensors, PLUGIN_NAME " norm");
    s->norm_sizes = zero_alloc_table(s, (uint64_t)n_params * sizeof *s->norm_sizes, PLUGIN_NAME " norm");
    s->norm_parts = zero_alloc_table(s, (uint64_t)s->dp.size * sizeof *s->norm_parts, PLUGIN_NAME " norm");
    if (!s->units || !s->storage || !s->grad_view || !s->ranges || !s->norm_tensors || !s->norm_sizes ||
        !s->norm_parts)
        return ZT_ERR_OUT_OF_MEMORY;
    s->n_units = layout->n_units;
    st = plan_storage(s);
    if (st != ZT_OK) return st;
    plan_slices(s);
    st = plan_buckets(s);
    for (int32_t u = 0; u < s->n_units && st == ZT_OK; u++) st = alloc_unit(s, u);
    if (st == ZT_OK && gpu) st = setup_gpu(s);
    /* Offload: the optimizer's thread (CPU runs too, where it runs the same arithmetic on the same
     * buffers: tests/zero checks the results stay bit for bit those without offload). */
    /* GPU runs queue adds and steps (at most two adds at a time: the download buffers) */
    if (st == ZT_OK && s->cfg.offload_optimizer && (s->n_ranges || s->off.on_gpu))
        st = zero_offload_create(h, PLUGIN_NAME, zero_off_job, s, 2 * s->n_units + 4, &s->off.thread);
    if (st == ZT_OK && (s->cfg.offload_optimizer || s->cfg.offload_param) && h->device->device_type == ZT_DEVICE_CPU)
        h->log(h->ctx, ZT_LOG_INFO,
               "offload to the CPU requested: this run computes on the CPU, where every buffer already is host "
               "memory, so nothing moves (the optimizer steps on the offload thread)");
    return st;
}

/* ---- per unit ------------------------------------------------------------------------------- */

static void fill_view(zt_tensor *t, const zt_param_decl *p, void *data, int32_t dtype, const zt_device_ctx *device)
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->device_type = device->device_type;
    t->device_index = device->device_index;
    t->ndim = p->ndim;
    int64_t stride = 1;
    for (int32_t d = p->ndim - 1; d >= 0; d--) {
        t->shape[d] = p->shape[d];
        t->stride[d] = stride;
        stride *= p->shape[d];
    }
}

/* The gradient buffer the model accumulates into during a backward. */
static float *grad_target(const unit_store *us) { return SHARDED_GRADS ? us->grad_full : us->grad; }

static zt_status zero_before_unit(void *opaque, int32_t unit, int32_t phase, zt_tensor *params, zt_tensor *grads)
{
    zero_state *s = opaque;
    zt_status st = zero_check_unit(s, "before_unit", unit);
    if (st != ZT_OK) return st;
    if (phase != ZT_PHASE_FORWARD && phase != ZT_PHASE_BACKWARD)
        return fail(s, ZT_ERR_INVALID_ARG, "before_unit: phase %d is neither forward (0) nor backward (1)", (int)phase);
    const unit_store *us = &s->units[unit];
    for (int32_t k = 0; k < us->n_touched && st == ZT_OK; k++) {
        int32_t home = us->touched[k];
        unit_store *hs = &s->units[home];
        if (SHARDED_PARAMS) {
            st = zero_hold_params(s, home);
        } else if (SHARDED_MASTER && hs->stale) { /* CPU runs: a master shard was written (load, resume) */
            st = zero_gather_unit(s, home);
            hs->stale = st != ZT_OK;
            hs->gather_pending = st == ZT_OK && s->gpu;
        }
        if (st == ZT_OK && hs->gather_pending) { /* GPU runs, stages 1-2: the step's gather must land first */
            st = compute_after(s, gather_slot(s, home));
            hs->gather_pending = st != ZT_OK;
        }
        if (st == ZT_OK && phase == ZT_PHASE_BACKWARD && (SHARDED_GRADS || s->sib.on)) st = zero_hold_grads(s, home);
    }
    /* stage 3 on GPUs: the next unit's gather overlaps this unit's compute */
    if (st == ZT_OK && SHARDED_PARAMS && s->gpu) st = zero_prefetch_next(s, unit, phase);
    if (st != ZT_OK) return st;

    const zt_layout *l = s->layout;
    const zt_model_info *m = l->model;
    const zt_unit_layout *ul = &l->units[unit];
    for (int32_t k = 0; k < ul->n_params; k++) {
        int32_t i = ul->first_param + k, owner = s->storage[i];
        const zt_param_decl *p = &m->params[i];
        const unit_store *home = &s->units[m->params[owner].unit];
        const zt_device_ctx *device = s->host->device;
        if (params && s->gpu)
            fill_view(&params[k], p, home->compute_bf16 + l->param_offset[owner], s->compute16, device);
        else if (params) fill_view(&params[k], p, home->compute + l->param_offset[owner], ZT_F32, device);
        if (phase == ZT_PHASE_BACKWARD && grads)
            fill_view(&grads[k], p, s->grad_view[owner] >= 0 ? grad_target(home) + s->grad_view[owner] : NULL,
                      ZT_F32, device);
    }
    return ZT_OK;
}

static zt_status zero_after_unit(void *opaque, int32_t unit, int32_t phase)
{
    zero_state *s = opaque;
    zt_status st = zero_check_unit(s, "after_unit", unit);
    if (st != ZT_OK || !SHARDED_PARAMS) return st; /* stages 0-2 keep the compute copy resident */
    (void)phase;
    const unit_store *us = &s->units[unit];
    for (int32_t k = 0; k < us->n_touched; k++) zero_release_params(s, us->touched[k]);
    return ZT_OK;
}

static zt_status zero_grads_ready(void *opaque, int32_t unit, int32_t last_micro)
{
    zero_state *s = opaque;
    zt_status st = zero_check_unit(s, "grads_ready", unit);
    if (st != ZT_OK) return st;
    const unit_store *us = &s->units[unit];
    /* GPU runs: transient gradients of the previous unit, reduced on the comm stream meanwhile */
    st = zero_flush_pending(s, -1);
    if (st != ZT_OK) return st;
    if (s->sib.on && (!last_micro || !s->sib.have_args))
        return fail(s, ZT_ERR_INVALID_ARG,
                    "grads_ready(%d): zero_optimization.step_in_backward needs %s; set "
                    "zero_optimization.step_in_backward to false",
                    (int)unit, !last_micro ? "one micro-batch per step (this backward is not the step's last)"
                                           : "the step's arguments before the backward (begin_step, ABI 1.1), which "
                                             "this host did not give");
    if (s->off.early_now && !last_micro)
        return fail(s, ZT_ERR_INVALID_ARG,
                    "grads_ready(%d): offload steps the optimizer inside the backward in this configuration, which "
                    "needs one micro-batch per step, but this backward is not the step's last; set "
                    "zero_optimization.step_in_backward to false",
                    (int)unit);
    if (SHARDED_GRADS) {
        for (int32_t k = 0; k < us->n_touched && st == ZT_OK; k++) st = zero_release_grads(s, us->touched[k], unit);
        return st;
    }
    if (s->off.early_now) { /* stage 1 with offload: reduce and queue each storage unit whose last writer this is */
        for (int32_t k = 0; k < us->n_touched && st == ZT_OK; k++) {
            int32_t home = us->touched[k];
            if (s->units[home].sib_step_at != unit) continue;
            st = zero_reduce_unit_once(s, home);
            if (st == ZT_OK) st = zero_off_submit_step(s, home);
        }
        return st;
    }
    if (s->sib.on) { /* stages 0-1: reduce, step and free each storage unit whose last writer this is */
        for (int32_t k = 0; k < us->n_touched && st == ZT_OK; k++) {
            int32_t home = us->touched[k];
            unit_store *hs = &s->units[home];
            if (hs->sib_step_at != unit) continue;
            if (hs->grad) { /* NULL: stage 0, no trainable element in this unit (nothing to reduce) */
                st = zero_reduce_unit_once(s, home);
                if (st == ZT_OK) st = compute_after(s, reduce_slot(home));
            }
            if (st == ZT_OK) st = zero_sib_step_unit(s, home, hs->grad);
            s->host->free(s->host->ctx, hs->grad); /* stream-ordered after the step's reads */
            hs->grad = NULL;
        }
        return st;
    }
    if (!last_micro || !s->cfg.overlap_comm || us->reduce_in_step) return ZT_OK;
    return zero_reduce_unit_once(s, unit);
}

/* ---- the step ------------------------------------------------------------------------------- */

/* sqrt of the sum of squares of every trainable gradient of the whole model, the same on every rank. */
static zt_status zero_global_norm(zero_state *s, double *norm)
{
    const zt_host *h = s->host;
    for (int32_t r = 0; r < s->n_ranges; r++) {
        const opt_range *rg = &s->ranges[r];
        s->norm_tensors[r] = s->units[rg->unit].grad + rg->grad_offset;
        s->norm_sizes[r] = rg->count;
    }
    double local = 0;
    /* offload, stages 2-3: the reduced gradients are the host shards */
    if (s->gpu && !(s->off.on_gpu && SHARDED_GRADS)) {
        zt_status st = zero_cuda_global_norm(h, s->gpu, s->n_ranges, s->norm_tensors, s->norm_sizes, &local);
        if (st != ZT_OK) return st;
    } else {
        zt_cpu_ctx cpu = {.parallel_for = h->parallel_for, .pool = h->ctx};
        local = zt_cpu_global_l2_norm(&cpu, s->n_ranges, s->norm_tensors, s->norm_sizes);
    }
    if (STAGE == 0 || s->dp.size == 1) { /* every rank holds every reduced gradient */
        *norm = local;
        return ZT_OK;
    }
    /* The doubles themselves (as bytes, which every backend moves exactly), added in rank order. */
    double square = local * local;
    zt_status st = s->gpu ? zero_cuda_all_gather_double(h, s->gpu, &s->dp, square, s->norm_parts)
                          : h->all_gather(h->ctx, &s->dp, &square, s->norm_parts, sizeof square, ZT_U8, NULL);
    if (st != ZT_OK) return st;
    double sum = 0;
    for (int32_t r = 0; r < s->dp.size; r++) sum += s->norm_parts[r];
    *norm = sqrt(sum);
    return ZT_OK;
}

/* The optimizer on one range of this rank's slice: `grads` laid out as the unit's `grad`; `copy`
 * NULL or the base of the bf16 array (indexed like the master) the optimizer writes in the same pass
 * (ABI 1.1 compute_copy, only when it says it does); on the GPU or on the CPU. */
static zt_status zero_step_range_at(zero_state *s, const opt_range *rg, const zt_step_args *a, double clip,
                                    const float *grads, uint16_t *copy, int on_gpu)
{
    float *state_at[MAX_OPT_STATES];
    const unit_store *us = &s->units[rg->unit];
    for (int32_t j = 0; j < s->n_state; j++) state_at[j] = us->state[j] + rg->state_offset;
    zt_optim_hparams hp = {.struct_size = sizeof hp,
                           .step = a->step,
                           .lr = a->lr,
                           .weight_decay = rg->decay ? a->weight_decay : 0.0,
                           .grad_scale = clip / a->loss_scale};
    if (copy && zero_opt_writes_copy(s)) {
        hp.compute_copy = copy + rg->master_offset;
        hp.compute_copy_dtype = s->compute16;
    }
    return s->opt->step(s->opt_state, &hp, us->master + rg->master_offset, grads + rg->grad_offset, state_at,
                        (uint64_t)rg->count, on_gpu ? ZT_DEVICE_CUDA : ZT_DEVICE_CPU,
                        on_gpu ? s->host->device->compute_stream : NULL);
}

/* The optimizer on one range where the buffers are: the GPU, or the CPU (CPU runs; the offload
 * thread of CPU runs). Not for offload on GPUs (offload_step_gpu_unit). */
static zt_status zero_step_range(zero_state *s, const opt_range *rg, const zt_step_args *a, double clip)
{
    const unit_store *us = &s->units[rg->unit];
    int on_gpu = s->gpu != NULL;
    /* ABI 1.1: the bf16 compute copy in the same pass (this rank's slice of it), unless it lives on the
     * host (stage 3 with offload_param alone: zero_after_unit_step converts and copies it) or stage 3 keeps
     * none (cast_gather) */
    uint16_t *copy = NULL;
    if (on_gpu && !(SHARDED_PARAMS && s->cfg.offload_param) && !s->cast_gather)
        copy = STAGE == 0 ? us->compute_bf16 : SHARDED_PARAMS ? us->shard_bf16 : us->compute_bf16 + us->shard_offset;
    const float *grads = us->step_grads ? us->step_grads : us->grad;
    return zero_step_range_at(s, rg, a, clip, grads, copy, on_gpu);
}

/* Offload on GPUs, on the offload thread: unit u's CPU step from its host gradients (stage 1: the
 * download buffer) once their download has landed, the bf16 of the updated master into a staging
 * buffer (or, stage 3 with offload_param, the host bf16 shard itself), uploaded on the copy stream
 * into the unit's device bf16 slice; the unit's upload event follows (zero_gather_unit waits on it). */
static zt_status offload_step_gpu_unit(zero_state *s, int32_t unit)
{
    const zt_host *h = s->host;
    unit_store *us = &s->units[unit];
    const float *grads = SHARDED_GRADS ? us->grad : s->off.down[us->off.step_buf];
    zt_status st = ZT_OK;
    if (s->off.early_now) { /* the reported norm: this unit's sum of squares (step() adds the units in order) */
        int32_t n = 0;
        for (int32_t k = 0; k < s->n_ranges; k++) {
            const opt_range *rg = &s->ranges[k];
            if (rg->unit != unit) continue;
            s->off.job_tensors[n] = grads + rg->grad_offset;
            s->off.job_sizes[n++] = rg->count;
        }
        zt_cpu_ctx cpu = {.parallel_for = h->parallel_for, .pool = h->ctx};
        double norm = n ? zt_cpu_global_l2_norm(&cpu, n, s->off.job_tensors, s->off.job_sizes) : 0.0;
        s->off.unit_square[unit] = norm * norm;
    }
    int direct = SHARDED_PARAMS && s->cfg.offload_param; /* the bf16 shard is host memory: written in place */
    int32_t b = s->off.up_next;
    uint16_t *copy = direct ? us->shard_bf16 : s->off.up[b];
    if (!direct) {
        s->off.up_next ^= 1;
        st = zero_cuda_wait_staging(h, s->gpu, b); /* its previous upload has read it */
    }
    for (int32_t k = 0; k < s->n_ranges && st == ZT_OK; k++)
        if (s->ranges[k].unit == unit)
            st = zero_step_range_at(s, &s->ranges[k], s->off.args, s->off.clip, grads, copy, 0);
    for (int32_t k = 0; k < s->n_ranges && st == ZT_OK && !zero_opt_writes_copy(s); k++) {
        const opt_range *rg = &s->ranges[k]; /* an optimizer without compute_copy: convert here */
        if (rg->unit == unit) zero_bf16_host(s, us->master + rg->master_offset, copy + rg->master_offset, rg->count);
    }
    if (st != ZT_OK || direct) return st;
    /* only the stepped ranges: frozen elements and padding of the device copy keep their values */
    uint16_t *dst = SHARDED_PARAMS ? us->shard_bf16 : us->compute_bf16 + us->shard_offset;
    for (int32_t k = 0; k < s->n_ranges && st == ZT_OK; k++) {
        const opt_range *rg = &s->ranges[k];
        if (rg->unit == unit)
            st = zero_cuda_upload(h, s->gpu, dst + rg->master_offset, copy + rg->master_offset,
                                  (uint64_t)rg->count * sizeof(uint16_t));
    }
    return st == ZT_OK ? zero_cuda_upload_done(h, s->gpu, unit, b) : st;
}

/* The offload thread's job (offload.h), with the arguments step() or begin_step left in off.args /
 * off.clip. CPU runs: the optimizer on the unit's ranges. GPU runs: first the unit's download
 * (the thread's CUDA device set first: it is per thread), then its add or its step. */
static zt_status zero_off_job(void *opaque, int32_t job)
{
    zero_state *s = opaque;
    int32_t unit = job % s->n_units, kind = job / s->n_units;
    zt_status st = ZT_OK;
    if (!s->off.on_gpu) {
        for (int32_t k = 0; k < s->n_ranges && st == ZT_OK; k++)
            if (s->ranges[k].unit == unit) st = zero_step_range(s, &s->ranges[k], s->off.args, s->off.clip);
        return st;
    }
    unit_store *us = &s->units[unit];
    st = zero_cuda_bind_thread(s->host, s->gpu);
    if (st == ZT_OK) st = zero_cuda_wait_download(s->host, s->gpu, unit);
    if (st != ZT_OK) return st;
    if (kind == JOB_ADD) {
        add_job add = {us->grad, s->off.down[us->off.add_buf]};
        s->host->parallel_for(s->host->ctx, us->shard_count, 1 << 14, add_range, &add);
        return ZT_OK;
    }
    return offload_step_gpu_unit(s, unit);
}

/* Offload: every unit with trainable elements goes to the offload thread, in unit order, and step()
 * waits for them (the pipelined step after the norm). Always waits for what was queued, so no job
 * outlives the arguments. */
static zt_status zero_off_step(zero_state *s, const zt_step_args *a, double clip)
{
    s->off.args = a;
    s->off.clip = clip;
    zt_status st = ZT_OK;
    for (int32_t u = 0; u < s->n_units && st == ZT_OK; u++)
        if (s->units[u].n_state_elems) st = zero_offload_submit(s->off.thread, u);
    zt_status ran = zero_offload_wait(s->off.thread);
    s->off.args = NULL;
    return st != ZT_OK ? st : ran;
}

/* After the optimizer updated unit u's master: GPU runs convert it to the bf16 copy unless the
 * optimizer wrote it (ABI 1.1 compute_copy, in the same pass); stages 1-2 then all-gather every
 * rank's updated slice into the compute copy (GPU runs: bf16, in place, on the comm stream; the
 * unit's next before_unit waits for it). */
static zt_status zero_after_unit_step(zero_state *s, int32_t u)
{
    unit_store *us = &s->units[u];
    zt_status st = ZT_OK;
    /* (not for offload on GPUs, whose thread converts and uploads: zero_off_gpu_step) stage 3 with
     * offload_param alone: zero_step_range left the host bf16 shard to this refresh */
    int copy_on_host = SHARDED_PARAMS && s->cfg.offload_param;
    if (s->gpu && us->n_state_elems && (copy_on_host || !zero_opt_writes_copy(s)))
        st = zero_refresh_compute_copy(s, u);
    if (st != ZT_OK || !SHARDED_MASTER || SHARDED_PARAMS) return st;
    st = zero_gather_unit(s, u);
    us->stale = st != ZT_OK;
    us->gather_pending = st == ZT_OK && s->gpu;
    return st;
}

/* step_in_backward: unit u's gradients are complete and reduced (`grads`, laid out as `grad`):
 * add its sum of squares to the norm (GPU runs: a device float per unit, read once in step()),
 * step its ranges with begin_step's arguments, and refresh its compute copy. */
static zt_status zero_sib_step_unit(zero_state *s, int32_t unit, const float *grads)
{
    unit_store *us = &s->units[unit];
    const zt_host *h = s->host;
    int32_t n = 0;
    for (int32_t k = 0; k < s->n_ranges; k++) {
        const opt_range *rg = &s->ranges[k];
        if (rg->unit != unit) continue;
        s->norm_tensors[n] = grads + rg->grad_offset;
        s->norm_sizes[n++] = rg->count;
    }
    zt_status st = ZT_OK;
    if (s->gpu) {
        st = zero_cuda_unit_norm(h, s->gpu, n, s->norm_tensors, s->norm_sizes, unit);
    } else if (n) {
        zt_cpu_ctx cpu = {.parallel_for = h->parallel_for, .pool = h->ctx};
        double local = zt_cpu_global_l2_norm(&cpu, n, s->norm_tensors, s->norm_sizes);
        s->sib.square += local * local;
    }
    us->step_grads = grads;
    for (int32_t k = 0; k < s->n_ranges && st == ZT_OK; k++)
        if (s->ranges[k].unit == unit) st = zero_step_range(s, &s->ranges[k], &s->sib.args, 1.0);
    us->step_grads = NULL;
    if (st == ZT_OK) st = zero_after_unit_step(s, unit);
    s->sib.count++;
    return st;
}

/* step_in_backward: every unit was stepped in the backward; what is left is the norm to report. A
 * non-finite norm cannot be undone after the fact (the update is made), so it is an error. */
static zt_status zero_sib_finish_step(zero_state *s, const zt_step_args *a, zt_step_result *r)
{
    const zt_host *h = s->host;
    int32_t expected = 0;
    for (int32_t u = 0; u < s->n_units; u++) expected += s->units[u].sib_step_at >= 0;
    if (!s->sib.have_args || s->sib.args.step != a->step || s->sib.args.lr != a->lr ||
        s->sib.args.weight_decay != a->weight_decay || a->max_grad_norm != 0 || a->loss_scale != 1.0 ||
        s->sib.count != expected)
        return fail(s, ZT_ERR_INVALID_ARG,
                    "step %lld: zero_optimization.step_in_backward stepped %d of %d units in the backward with %s "
                    "arguments than step() got (begin_step %s); a host bug, or set "
                    "zero_optimization.step_in_backward to false",
                    (long long)a->step, (int)s->sib.count, (int)expected, s->sib.have_args ? "other" : "no",
                    s->sib.have_args ? "called" : "not called");
    double local = s->sib.square;
    zt_status st = ZT_OK;
    if (s->gpu) {
        local = 0;
        st = zero_cuda_read_norms(h, s->gpu, s->n_units, s->sib.norms);
        for (int32_t u = 0; st == ZT_OK && u < s->n_units; u++) local += (double)s->sib.norms[u] * s->sib.norms[u];
    }
    double sum = local;
    if (st == ZT_OK && STAGE > 0 && s->dp.size > 1) {
        st = s->gpu ? zero_cuda_all_gather_double(h, s->gpu, &s->dp, local, s->norm_parts)
                    : h->all_gather(h->ctx, &s->dp, &local, s->norm_parts, sizeof local, ZT_U8, NULL);
        sum = 0;
        for (int32_t k = 0; st == ZT_OK && k < s->dp.size; k++) sum += s->norm_parts[k];
    }
    s->sib.have_args = 0;
    s->sib.count = 0;
    s->sib.square = 0;
    if (st != ZT_OK) return st;
    r->grad_norm = sqrt(sum);
    r->skipped = 0;
    if (!isfinite(r->grad_norm))
        return fail(s, ZT_ERR_UNSUPPORTED,
                    "step %lld: the gradient norm is %g (non-finite), but zero_optimization.step_in_backward already "
                    "applied the update unit by unit during the backward, so the step cannot be skipped; the "
                    "weights are no longer usable. Resume from the last checkpoint with "
                    "zero_optimization.step_in_backward set to false (non-finite steps are then skipped) or a lower "
                    "learning rate",
                    (long long)a->step, r->grad_norm);
    return ZT_OK;
}

/* Offload on GPUs, after unit u's step job was queued: wait for it, then (stages 1-2) all-gather
 * every rank's updated slice into the compute copy behind the upload (zero_gather_unit). Collectives are
 * issued here, on the training thread, in unit order on every rank. */
static zt_status offload_finish_unit(zero_state *s, int32_t u)
{
    unit_store *us = &s->units[u];
    zt_status st = offload_wait_for(s, us->off.step_ticket);
    us->off.step_ticket = 0;
    if (st != ZT_OK || !SHARDED_MASTER || SHARDED_PARAMS) return st; /* stage 3 gathers when the unit runs */
    st = zero_gather_unit(s, u);
    us->stale = st != ZT_OK;
    us->gather_pending = st == ZT_OK;
    return st;
}

/* step() with offload on GPUs (header comment, "Offload on GPUs"). Returns once every job is done. */
static zt_status zero_off_gpu_step(zero_state *s, const zt_step_args *a, zt_step_result *r)
{
    const zt_host *h = s->host;
    /* off.early_now stays set until every job is done: the thread reads it (the unit's sum of squares) */
    int early = s->off.early_now;
    zt_status st = zero_flush_pending(s, -1); /* the last unit's transient gradients, once downloaded */
    if (st != ZT_OK) {
        (void)zero_offload_wait(s->off.thread);
        s->off.early_now = 0;
        return st;
    }
    if (early) {
        int32_t expected = 0;
        for (int32_t u = 0; u < s->n_units; u++) expected += s->units[u].sib_step_at >= 0 && s->units[u].n_state_elems;
        if (s->sib.args.step != a->step || s->sib.args.lr != a->lr || s->sib.args.weight_decay != a->weight_decay ||
            a->max_grad_norm != 0 || a->loss_scale != 1.0 || s->off.early_count != expected) {
            (void)zero_offload_wait(s->off.thread); /* no job outlives this step */
            s->off.early_now = 0;
            return fail(s, ZT_ERR_INVALID_ARG,
                        "step %lld: offload stepped %d of %d units inside the backward with other arguments than "
                        "step() got (a host bug); set zero_optimization.step_in_backward to false",
                        (long long)a->step, (int)s->off.early_count, (int)expected);
        }
    } else {
        for (int32_t u = 0; !SHARDED_GRADS && u < s->n_units && st == ZT_OK; u++) st = zero_reduce_unit_once(s, u);
        if (st == ZT_OK) st = compute_after_all_comm(s); /* stage 1: the norm reads the reduced device gradients */
        /* stages 2-3: every download has landed and every add is done before the norm reads the shards */
        if (st == ZT_OK && SHARDED_GRADS) st = zero_cuda_sync_comm(h, s->gpu);
        if (st == ZT_OK) st = zero_offload_wait(s->off.thread);
        for (int32_t u = 0; st == ZT_OK && SHARDED_GRADS && u < s->n_units; u++) {
            unit_store *us = &s->units[u];
            if (us->off.fresh && us->grad) memset(us->grad, 0, (size_t)us->n_grad * sizeof(float)); /* never reduced */
            us->off.fresh = 0;
        }
        double norm = 0;
        if (st == ZT_OK) st = zero_global_norm(s, &norm);
        if (st != ZT_OK) return st;
        norm /= a->loss_scale;
        r->grad_norm = norm;
        r->skipped = !isfinite(norm);
        if (r->skipped) return ZT_OK; /* every rank saw the same norm: they all skip */
        s->off.args_copy = *a;
        s->off.args = &s->off.args_copy;
        s->off.clip = a->max_grad_norm > 0 ? fmin(1.0, a->max_grad_norm / (norm + 1e-6)) : 1.0;
    }
    /* Unit u + 1 is queued (stage 1: downloaded) before unit u is waited for and gathered, so the
     * copies and the gather of one unit overlap the CPU step of the next. Early steps were queued in
     * the backward's order (last unit first): finished in that order, the same on every rank. */
    for (int32_t u = 0; early && u < s->n_units && st == ZT_OK; u++) st = offload_finish_unit(s, s->n_units - 1 - u);
    for (int32_t u = 0; !early && u <= s->n_units && st == ZT_OK; u++) {
        if (u < s->n_units) st = zero_off_submit_step(s, u);
        if (st == ZT_OK && u > 0) st = offload_finish_unit(s, u - 1);
    }
    zt_status ran = zero_offload_wait(s->off.thread); /* always: no job outlives the step's arguments */
    if (st == ZT_OK) st = ran;
    s->off.early_count = 0;
    s->off.early_now = 0;
    if (st != ZT_OK || !early) return st;
    /* early steps: the norm to report, from the units' sums of squares, added in unit order */
    double local = 0;
    for (int32_t u = 0; u < s->n_units; u++) {
        local += s->off.unit_square[u];
        s->off.unit_square[u] = 0;
    }
    double sum = local;
    if (s->dp.size > 1) {
        st = zero_cuda_all_gather_double(h, s->gpu, &s->dp, local, s->norm_parts);
        sum = 0;
        for (int32_t k = 0; st == ZT_OK && k < s->dp.size; k++) sum += s->norm_parts[k];
    }
    if (st != ZT_OK) return st;
    r->grad_norm = sqrt(sum);
    r->skipped = 0;
    if (!isfinite(r->grad_norm))
        return fail(s, ZT_ERR_UNSUPPORTED,
                    "step %lld: the gradient norm is %g (non-finite), but with offload and no clipping the CPU "
                    "optimizer already stepped each unit during the backward, so the step cannot be skipped; the "
                    "weights are no longer usable. Resume from the last checkpoint with "
                    "zero_optimization.step_in_backward set to false (non-finite steps are then skipped) or a lower "
                    "learning rate",
                    (long long)a->step, r->grad_norm);
    return ZT_OK;
}

static zt_status zero_begin_step(void *opaque, const zt_step_args *a)
{
    zero_state *s = opaque;
    if (!s->units) return fail(s, ZT_ERR_INVALID_ARG, "begin_step called before setup");
    if (!a || a->struct_size < sizeof(zt_step_args) || a->step < 1)
        return fail(s, ZT_ERR_INVALID_ARG, "begin_step: the arguments are missing, too old or out of range");
    if (s->sib.on && (a->max_grad_norm != 0 || a->loss_scale != 1.0))
        return fail(s, ZT_ERR_INVALID_ARG,
                    "begin_step %lld: zero_optimization.step_in_backward is on, but this step clips (max_grad_norm "
                    "%g) or scales the loss (%g), which needs the whole gradient first; set "
                    "zero_optimization.step_in_backward to false",
                    (long long)a->step, a->max_grad_norm, a->loss_scale);
    s->sib.args = *a;
    s->sib.have_args = 1;
    s->sib.count = 0;
    s->sib.square = 0;
    /* offload on GPUs: this step's units may be stepped as their gradients reach the host */
    s->off.early_now = s->off.on_gpu && s->off.early && a->max_grad_norm == 0 && a->loss_scale == 1.0;
    if (s->off.early_now) {
        s->off.args = &s->sib.args;
        s->off.clip = 1.0;
        s->off.early_count = 0;
    }
    return ZT_OK;
}

static zt_status zero_step(void *opaque, const zt_step_args *a, zt_step_result *r)
{
    zero_state *s = opaque;
    if (!s->units) return fail(s, ZT_ERR_INVALID_ARG, "step called before setup");
    if (!a || a->struct_size < sizeof(zt_step_args) || !r || r->struct_size < sizeof(zt_step_result) ||
        a->step < 1 || !(a->loss_scale > 0) || !(a->max_grad_norm >= 0))
        return fail(s, ZT_ERR_INVALID_ARG,
                    "step: the arguments are missing, too old, or out of range (step >= 1, loss_scale > 0, "
                    "max_grad_norm >= 0)");
    if (s->sib.on) return zero_sib_finish_step(s, a, r);
    if (s->off.on_gpu) return zero_off_gpu_step(s, a, r);
    zt_status st = ZT_OK;
    for (int32_t u = 0; !SHARDED_GRADS && u < s->n_units && st == ZT_OK; u++) st = zero_reduce_unit_once(s, u);
    /* GPU runs: the reductions ran on the comm stream; the norm and the optimizer read their results */
    if (st == ZT_OK) st = zero_flush_pending(s, -1);
    if (st == ZT_OK) st = compute_after_all_comm(s);
    if (st != ZT_OK) return st;

    double norm = 0;
    st = zero_global_norm(s, &norm);
    if (st != ZT_OK) return st;
    norm /= a->loss_scale;
    r->grad_norm = norm;
    r->skipped = !isfinite(norm);
    if (r->skipped) return ZT_OK; /* every rank saw the same norm: they all skip */

    double clip = 1.0;
    if (a->max_grad_norm > 0) clip = fmin(1.0, a->max_grad_norm / (norm + 1e-6));
    if (s->off.thread) {
        st = zero_off_step(s, a, clip);
        if (st != ZT_OK) return st;
    }
    for (int32_t k = 0; !s->off.thread && k < s->n_ranges; k++) {
        st = zero_step_range(s, &s->ranges[k], a, clip);
        if (st != ZT_OK) return st; /* the optimizer described its failure */
    }
    for (int32_t u = 0; st == ZT_OK && u < s->n_units; u++) st = zero_after_unit_step(s, u);
    return st;
}

static zt_status zero_zero_grad(void *opaque)
{
    zero_state *s = opaque;
    if (!s->units) return fail(s, ZT_ERR_INVALID_ARG, "zero_grad called before setup");
    for (int32_t u = 0; u < s->n_units; u++) {
        unit_store *us = &s->units[u];
        size_t bytes = (size_t)us->n_grad * sizeof(float);
        if (!us->grad) { /* step_in_backward: transient, nothing to clear */
        } else if (s->off.on_gpu && SHARDED_GRADS) {
            /* host shards: the step's first download overwrites instead of adding (no pass over them) */
            us->off.fresh = 1;
        } else if (us->n_grad && s->gpu) {
            zt_status st = zero_cuda_zero(s->host, us->grad, bytes);
            if (st != ZT_OK) return st;
        } else if (us->n_grad) {
            memset(us->grad, 0, bytes);
        }
        us->reduced = 0;
    }
    return ZT_OK;
}

/* ---- shards --------------------------------------------------------------------------------- */

static void zero_shard_range(void *opaque, int32_t unit, int64_t *offset, int64_t *count)
{
    zero_state *s = opaque;
    int known = s->units && unit >= 0 && unit < s->n_units;
    *offset = known ? s->units[unit].shard_offset : 0;
    *count = known ? s->units[unit].shard_count : 0;
}

/* Optimizer state is packed (trainable elements only); a shard is positional, zeros for frozen
 * parameters and padding. noinline: inlined into read_shard (in = NULL), GCC 12 at -O3 warns that the
 * write branches memcpy from NULL, which the check below rules out. */
__attribute__((noinline)) static zt_status copy_shard(zero_state *s, const char *call, int32_t unit, int32_t which, float *out, const float *in)
{
    zt_status st = zero_check_unit(s, call, unit);
    if (st != ZT_OK) return st;
    if (which < 0 || which > s->n_state || (out == NULL && in == NULL))
        return fail(s, ZT_ERR_INVALID_ARG,
                    "%s: array %d is neither the master (0) nor one of the %d optimizer states, or the buffer is "
                    "NULL",
                    call, (int)which, (int)s->n_state);
    unit_store *us = &s->units[unit];
    size_t bytes = (size_t)us->shard_count * sizeof(float);
    /* offload on GPUs: the master and the state are host memory (the offload thread is idle here) */
    int on_gpu = s->gpu && !s->off.on_gpu;
    if (which == ZT_SHARD_MASTER) {
        if (out) {
            st = on_gpu ? zero_cuda_copy(s->host, out, us->master, bytes) : (memcpy(out, us->master, bytes), ZT_OK);
        } else if (s->off.on_gpu) {
            memcpy(us->master, in, bytes);
            st = zero_refresh_compute_copy(s, unit);
        } else if (s->gpu) {
            st = zero_cuda_copy(s->host, us->master, in, bytes);
            if (st == ZT_OK) st = zero_refresh_compute_copy(s, unit);
        } else {
            memcpy(us->master, in, bytes);
            us->stale = SHARDED_MASTER && !SHARDED_PARAMS; /* gathered at the unit's next before_unit */
        }
        return st;
    }
    float *state = us->state[which - 1];
    if (out) memset(out, 0, bytes);
    for (int32_t k = 0; k < s->n_ranges && st == ZT_OK; k++) {
        const opt_range *rg = &s->ranges[k];
        if (rg->unit != unit) continue;
        size_t n = (size_t)rg->count * sizeof(float);
        float *dst = out ? out + rg->master_offset : state + rg->state_offset;
        const float *src = out ? state + rg->state_offset : in + rg->master_offset;
        if (on_gpu) st = zero_cuda_copy(s->host, dst, src, n);
        else memcpy(dst, src, n);
    }
    return st;
}

static zt_status zero_read_shard(void *opaque, int32_t unit, int32_t which, float *dst)
{
    return copy_shard(opaque, "read_shard", unit, which, dst, NULL);
}

static zt_status zero_write_shard(void *opaque, int32_t unit, int32_t which, const float *src)
{
    return copy_shard(opaque, "write_shard", unit, which, NULL, src);
}

/* ---- memory estimate ------------------------------------------------------------------------ */

/* Per-unit sizes the estimate needs, from the model's declarations alone: the largest sum of the
 * storage units one unit touches (a stage-3 gather, a stage-2/3 transient gradient) and the
 * largest unit. Padding (under dp * 16 elements per unit) is left out. */
static void unit_extents(const zt_model_info *m, double *max_touched, double *largest_unit)
{
    *max_touched = 0;
    *largest_unit = 0;
    for (int32_t u = 0; u < m->n_units; u++) {
        double touched = 0;
        for (int32_t home = 0; home < m->n_units; home++) {
            double size = 0;
            int uses = home == u;
            for (int32_t i = 0; i < m->n_params_decl; i++) {
                const zt_param_decl *p = &m->params[i];
                if (p->unit == home && !(p->flags & ZT_PARAM_TIED)) size += (double)numel_of(p);
                if (p->unit == u && (p->flags & ZT_PARAM_TIED)) {
                    int32_t owner = find_param(m, p->tied_to);
                    uses |= owner >= 0 && m->params[owner].unit == home;
                }
            }
            if (home == u && size > *largest_unit) *largest_unit = size;
            if (uses) touched += size;
        }
        if (touched > *max_touched) *max_touched = touched;
    }
}

/* Whether the optimizer steps inside the backward (ABI 1.1, zero_optimization.step_in_backward): then
 * gradients exist only per unit. Read only when this build declares the option; auto resolves as
 * zero_sib_decide does: on one GPU, without clipping, loss scaling (fp16), gradient
 * accumulation and offload. */
static int estimate_step_in_backward(const zero_state *s, double d)
{
    static const char key[] = "zero_optimization.step_in_backward";
    int declared = 0;
    for (size_t i = 0; i < sizeof zero_options / sizeof zero_options[0]; i++)
        declared |= zero_options[i].key && !strcmp(zero_options[i].key, key);
    const zt_host *h = s->host;
    const char *mode = "false";
    if (!declared || h->cfg_string(h->ctx, key, &mode) != ZT_OK || !mode) return 0;
    if (strcmp(mode, "auto") != 0) return !strcmp(mode, "true");
    double clip = 1.0;
    int64_t accumulation = 1;
    int32_t fp16 = 0;
    if (h->cfg_float(h->ctx, "gradient_clipping", &clip) != ZT_OK ||
        h->cfg_int(h->ctx, "gradient_accumulation_steps", &accumulation) != ZT_OK ||
        h->cfg_bool(h->ctx, "fp16.enabled", &fp16) != ZT_OK)
        return 0;
    return clip == 0 && accumulation == 1 && !fp16 && d == 1 && !s->cfg.offload_optimizer && !s->cfg.offload_param;
}

/* GPU runs (bf16 compute, fp32 master, fp32 gradient accumulation), per rank, P parameters over d
 * ranks, U = the largest set of storage units one unit touches (a gathered unit with its tied owner),
 * k optimizer states:
 *   stage 0: master 4P + bf16 copy 2P; gradients 4P (4U when stepping in the backward); state 4kP
 *   stage 1: bf16 2P + master 4P/d; gradients 4P (4U); state 4kP/d
 *   stage 2: bf16 2P + master 4P/d; gradient shard 4P/d + one unit's transient full gradients 4U
 *            (stepping in the backward: only the unit's shard 4U/d); state 4kP/d
 *   stage 3: two gathered units 2 x 2U (current and prefetched) + master 4P/d (each gather casts
 *            the master shard into its slot: cast_gather); gradients as stage 2; state 4kP/d; with an
 *            offload also a bf16 shard 2P/d, the gathers' source
 * offload_optimizer: master, state and gradient shards in pinned host memory, plus two bf16 upload
 * staging buffers and two fp32 gradient download buffers of one unit's shard on the host (one in
 * flight while the other is used);
 * offload_param (stage 3): the bf16 shard in pinned host memory. Buckets (pool comm) as on the CPU. */
static void estimate_gpu(const zero_state *s, double n, double k, double d, double touched, double comm,
                         zt_mem_estimate *out)
{
    int sib = estimate_step_in_backward(s, d);
    int off_opt = STAGE >= 1 && s->cfg.offload_optimizer, off_param = SHARDED_PARAMS && s->cfg.offload_param;
    double *dev = out->device, *host = out->host, *states_at = off_opt ? host : dev;
    if (STAGE == 0) {
        dev[ZT_POOL_PARAMS] += 4.0 * n + 2.0 * n;
        dev[ZT_POOL_GRADS] += 4.0 * (sib ? touched : n);
        dev[ZT_POOL_OPTIMIZER] += 4.0 * k * n;
    } else {
        if (SHARDED_PARAMS) {
            if (off_opt || off_param) (off_param ? host : dev)[ZT_POOL_PARAMS] += 2.0 * n / d;
            dev[ZT_POOL_PARAMS] += 2.0 * 2.0 * touched;
        } else {
            dev[ZT_POOL_PARAMS] += 2.0 * n;
        }
        states_at[ZT_POOL_PARAMS] += 4.0 * n / d;
        if (off_opt) {
            host[ZT_POOL_PARAMS] += 2.0 * 2.0 * touched / d; /* two bf16 upload staging buffers */
            host[ZT_POOL_GRADS] += 2.0 * 4.0 * touched / d;  /* two fp32 gradient download buffers */
        }
        if (!SHARDED_GRADS) {
            dev[ZT_POOL_GRADS] += 4.0 * (sib ? touched : n);
        } else {
            dev[ZT_POOL_GRADS] += 4.0 * touched;
            states_at[ZT_POOL_GRADS] += 4.0 * (sib ? touched : n) / d;
        }
        states_at[ZT_POOL_OPTIMIZER] += 4.0 * k * n / d;
    }
    dev[ZT_POOL_COMM] += comm;
}

static zt_status zero_estimate(void *opaque, const zt_estimate_in *in, zt_mem_estimate *out)
{
    zero_state *s = opaque;
    if (!in || !out || in->struct_size < sizeof(zt_estimate_in) || out->struct_size < sizeof(zt_mem_estimate) ||
        in->dp_size < 1 || in->n_optimizer_states < 0)
        return fail(s, ZT_ERR_INVALID_ARG, "estimate: the arguments are missing, too old or out of range");
    double n = (double)in->n_parameters, k = (double)in->n_optimizer_states, d = (double)in->dp_size;
    double max_touched = 0, largest = (double)in->largest_unit_numel;
    if (in->model) unit_extents(in->model, &max_touched, &largest);
    else max_touched = largest;
    /* A GPU run: this runtime's device, or a bf16/fp16 compute type (a dry run estimating a GPU run
     * on a machine without one; the CPU computes in fp32 only). */
    int gpu = s->host->device->device_type != ZT_DEVICE_CPU || in->compute_dtype != ZT_F32;
    double comm = 0;
    if (STAGE >= 1) {
        double largest_slice = largest / d, reduce_chunk = fmax(1, floor((double)s->cfg.reduce_bucket / d)),
               gather_chunk = fmax(1, floor((double)s->cfg.allgather_bucket / d));
        if (largest_slice > reduce_chunk) comm += 4.0 * d * reduce_chunk;
        if (largest_slice > gather_chunk) comm += 4.0 * d * gather_chunk;
    }
    memset(out->device, 0, sizeof out->device);
    memset(out->host, 0, sizeof out->host);
    if (gpu) {
        estimate_gpu(s, n, k, d, max_touched, comm, out);
        return ZT_OK;
    }

    /* CPU runs: everything is host memory, fp32 (offload moves nothing). */
    double c = 4.0;
    double master = SHARDED_MASTER ? 4.0 * n / d : 0.0;
    double compute = SHARDED_PARAMS ? c * max_touched : c * n;
    double grads = STAGE <= 1 ? c * n : 4.0 * n / d + c * max_touched;
    double optimizer = 4.0 * k * (SHARDED_MASTER ? n / d : n);
    out->host[ZT_POOL_PARAMS] += compute + master;
    out->host[ZT_POOL_GRADS] += grads;
    out->host[ZT_POOL_OPTIMIZER] += optimizer;
    out->host[ZT_POOL_COMM] += comm;
    return ZT_OK;
}

static const zt_zero_ops zero_ops = {
    .struct_size = sizeof(zt_zero_ops),
    .stage = STAGE,
    .setup = zero_setup,
    .before_unit = zero_before_unit,
    .after_unit = zero_after_unit,
    .grads_ready = zero_grads_ready,
    .step = zero_step,
    .zero_grad = zero_zero_grad,
    .shard_range = zero_shard_range,
    .read_shard = zero_read_shard,
    .write_shard = zero_write_shard,
    .estimate = zero_estimate,
    .begin_step = zero_begin_step,
};

static const char *const k_descriptions[] = {
    "ZeRO stage 0: plain data parallelism, full parameters, gradients and optimizer state per rank",
    "ZeRO stage 1: optimizer state and fp32 master sharded over the data-parallel ranks",
    "ZeRO stage 2: optimizer state, fp32 master and gradients sharded over the data-parallel ranks",
    "ZeRO stage 3: parameters too sharded, gathered per unit for its forward and backward",
};

static const zt_plugin zero_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_ZERO,
    .name = PLUGIN_NAME,
    .version = "1.1.0",
    .description = k_descriptions[STAGE],
    .options = zero_options,
    .n_options = sizeof zero_options / sizeof zero_options[0],
    .caps = ZT_CAP_CPU | ZT_CAP_MULTI_RANK | (STAGE >= 1 ? ZT_CAP_OFFLOAD : 0) |
            (GPU_CAPABLE ? ZT_CAP_CUDA | ZT_CAP_BF16 | ZT_CAP_FP16 : 0),
    .probe = zero_probe,
    .init = zero_init,
    .fini = zero_fini,
    .ops = &zero_ops,
};

ZT_PLUGIN_ENTRY
{
    return &zero_plugin;
}
