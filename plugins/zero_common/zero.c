/* ZeRO stages 0-3 (DeepSpeed's zero_optimization.stage), one source compiled once per stage with
 * ZT_ZERO_STAGE = 0..3 (plugins/zeroN/CMakeLists.txt): the stages differ in what a rank keeps whole
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
 * Offload (offload_optimizer.device, offload_param.device = cpu): on CPU runs every buffer already
 * is host memory, so offload changes nothing; it is accepted so one config serves CPU and GPU runs.
 * Allocations go through mem_where(), the seam where the GPU path puts device and pinned memory.
 *
 * GPU runs (zero0 built with CUDA, one GPU): every buffer is device memory. The fp32 `compute` buffer
 * is then the master only, and the model reads compute_bf16, a bf16 copy refreshed after every step
 * and every write of the master; norm, zero fill and shard copies go through zero_cuda.h.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <zt/zt.h>

#include "cpu/kernels.h"
#include "zero_cuda.h"

#ifndef ZT_ZERO_STAGE
#error "compile with -DZT_ZERO_STAGE=0, 1, 2 or 3 (see plugins/zero0/CMakeLists.txt)"
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

/* Which builds train on GPUs: stage 0 with the CUDA kernels. */
#if defined(ZT_PLUGIN_CUDA) && ZT_ZERO_STAGE == 0
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

typedef struct unit_store {
    int64_t padded;         /* P */
    int64_t shard_offset;   /* this rank's slice [shard_offset, shard_offset + shard_count) of P; */
    int64_t shard_count;    /* stage 0: the whole unit */
    float *compute;         /* [P]; stage 3: only while live > 0 */
    float *master;          /* [shard_count]; stage 0: == compute */
    uint16_t *compute_bf16; /* GPU runs: [P], the bf16 copy of the master the model reads */
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

typedef struct zero_state {
    const zt_host *host;
    zero_cuda *gpu;         /* GPU runs (zero_cuda.h); NULL on the CPU */
    int32_t overlap_comm;
    int64_t reduce_bucket, allgather_bucket, prefetch_bucket;
    int32_t offload_optimizer, offload_param, pin_memory;

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
     .default_value = "false",
     .help = "offloaded optimizer state in page-locked host memory (faster transfers; GPU runs)"},
    {.key = "zero_optimization.offload_param.device",
     .type = ZT_OPT_ENUM,
     .default_value = "none",
     .choices = k_offload_devices,
     .help = "cpu: keep the parameter shards in host memory between uses (stage 3 only). On CPU runs "
             "they already are"},
    {.key = "zero_optimization.offload_param.pin_memory",
     .type = ZT_OPT_BOOL,
     .default_value = "false",
     .help = "offloaded parameters in page-locked host memory (GPU runs)"},
};

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

/* Where a buffer lives. CPU runs: host memory. GPU runs (to come): device memory, or host memory
 * (pinned with pin_memory) for what is offloaded. */
static int32_t mem_where(const zero_state *s, int offloaded)
{
    if (s->host->device->device_type == ZT_DEVICE_CPU) return ZT_MEM_HOST;
    if (!offloaded) return ZT_MEM_DEVICE;
    return s->pin_memory ? ZT_MEM_PINNED : ZT_MEM_HOST;
}

/* n zero-filled floats; NULL only on failure (n == 0 gives NULL and no error: nothing to hold). */
static float *alloc_floats(const zero_state *s, int pool, int offloaded, int64_t n, const char *what, int32_t unit)
{
    if (n <= 0) return NULL;
    char tag[96];
    snprintf(tag, sizeof tag, PLUGIN_NAME " unit %d %s", (int)unit, what);
    int32_t where = mem_where(s, offloaded);
    float *p = s->host->alloc(s->host->ctx, pool, where, (uint64_t)n * sizeof(float), 0, tag);
    if (p && where != ZT_MEM_DEVICE) memset(p, 0, (size_t)n * sizeof(float));
    if (p && where == ZT_MEM_DEVICE && zero_cuda_zero(s->host, p, (uint64_t)n * sizeof(float)) != ZT_OK) {
        s->host->free(s->host->ctx, p);
        return NULL;
    }
    return p;
}

static void *alloc_table(const zero_state *s, uint64_t bytes, const char *what)
{
    void *p = s->host->alloc(s->host->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, bytes ? bytes : 1, 0, what);
    if (p) memset(p, 0, bytes);
    return p;
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

static zt_status check_unit(const zero_state *s, const char *call, int32_t unit)
{
    if (!s->units) return fail(s, ZT_ERR_INVALID_ARG, "%s called before setup", call);
    if (unit < 0 || unit >= s->n_units)
        return fail(s, ZT_ERR_INVALID_ARG, "%s: unit %d is not in [0, %d)", call, (int)unit, (int)s->n_units);
    return ZT_OK;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- collectives ---------------------------------------------------------------------------- */

/* Stage 0: SUM over "dp" in place, in pieces of at most reduce_bucket_size elements. */
static zt_status all_reduce_unit(zero_state *s, unit_store *us)
{
    if (s->dp.size <= 1) return ZT_OK;
    for (int64_t at = 0; at < us->n_grad; at += s->reduce_bucket) {
        int64_t n = min64(us->n_grad - at, s->reduce_bucket);
        zt_status st = s->host->all_reduce(s->host->ctx, &s->dp, us->grad + at, us->grad + at, (uint64_t)n, ZT_F32,
                                           ZT_REDUCE_SUM, NULL);
        if (st != ZT_OK) return st; /* the host recorded which collective failed */
    }
    return ZT_OK;
}

/* SUM-reduce-scatter `full` ([P], this rank's contribution) so that `shard` receives this rank's
 * reduced slice. shard == full: stage 1's in place, the slice lands at the start of full. A unit
 * whose slice exceeds reduce_chunk goes in pieces: piece j of every rank's slice is packed into the
 * staging buffer, which is reduce-scattered into piece j of the result. Pieces run in increasing j,
 * so in place a piece is written only where every piece still to be packed has been read. */
static zt_status reduce_scatter_unit(zero_state *s, const unit_store *us, float *full, float *shard)
{
    const zt_host *h = s->host;
    int64_t S = us->shard_count;
    if (S <= s->reduce_chunk)
        return h->reduce_scatter(h->ctx, &s->dp, full, shard, (uint64_t)S, ZT_F32, ZT_REDUCE_SUM, NULL);
    for (int64_t at = 0; at < S; at += s->reduce_chunk) {
        int64_t n = min64(S - at, s->reduce_chunk);
        for (int32_t r = 0; r < s->dp.size; r++)
            memcpy(s->reduce_staging + r * n, full + r * S + at, (size_t)n * sizeof(float));
        zt_status st = h->reduce_scatter(h->ctx, &s->dp, s->reduce_staging, shard + at, (uint64_t)n, ZT_F32,
                                         ZT_REDUCE_SUM, NULL);
        if (st != ZT_OK) return st;
    }
    return ZT_OK;
}

/* The whole unit [P] from every rank's master slice; the inverse of reduce_scatter_unit's pieces. */
static zt_status all_gather_unit(zero_state *s, const unit_store *us, float *full)
{
    const zt_host *h = s->host;
    int64_t S = us->shard_count;
    if (S <= s->gather_chunk) return h->all_gather(h->ctx, &s->dp, us->master, full, (uint64_t)S, ZT_F32, NULL);
    for (int64_t at = 0; at < S; at += s->gather_chunk) {
        int64_t n = min64(S - at, s->gather_chunk);
        zt_status st = h->all_gather(h->ctx, &s->dp, us->master + at, s->gather_staging, (uint64_t)n, ZT_F32, NULL);
        if (st != ZT_OK) return st;
        for (int32_t r = 0; r < s->dp.size; r++)
            memcpy(full + r * S + at, s->gather_staging + r * n, (size_t)n * sizeof(float));
    }
    return ZT_OK;
}

/* Stages 0-1: the step's single reduction of a unit's accumulated gradients. */
static zt_status reduce_unit_once(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->reduced) return ZT_OK;
    us->reduced = 1;
    return STAGE == 0 ? all_reduce_unit(s, us) : reduce_scatter_unit(s, us, us->grad, us->grad);
}

/* Stages 2-3: add this micro-batch's transient gradients of storage unit u into its accumulator:
 * the accumulator joins this rank's own contribution first, so the reduce-scatter yields
 * accumulator + sum over ranks. */
static zt_status reduce_into_shard(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    float *own = us->grad_full + us->shard_offset;
    for (int64_t k = 0; k < us->shard_count; k++) own[k] += us->grad[k];
    return reduce_scatter_unit(s, us, us->grad_full, us->grad);
}

/* ---- stage 3 gathers and stages 2-3 transient gradients --------------------------------------- */

static zt_status hold_params(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->live++ > 0) return ZT_OK;
    us->compute = alloc_floats(s, ZT_POOL_PARAMS, 0, us->padded, "gathered parameters", unit);
    if (!us->compute) {
        us->live = 0;
        return ZT_ERR_OUT_OF_MEMORY;
    }
    zt_status st = all_gather_unit(s, us, us->compute);
    if (st != ZT_OK) {
        s->host->free(s->host->ctx, us->compute);
        us->compute = NULL;
        us->live = 0;
    }
    return st;
}

static void release_params(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->live == 0 || --us->live > 0) return;
    s->host->free(s->host->ctx, us->compute);
    us->compute = NULL;
}

static zt_status hold_grads(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->grad_refs++ > 0) return ZT_OK;
    us->grad_full = alloc_floats(s, ZT_POOL_GRADS, 0, us->padded, "gradients of this backward", unit);
    if (us->grad_full) return ZT_OK;
    us->grad_refs = 0;
    return ZT_ERR_OUT_OF_MEMORY;
}

/* Reduce the transient gradients once the last backward writing them is done, then free them. */
static zt_status release_grads(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->grad_refs == 0 || --us->grad_refs > 0) return ZT_OK;
    zt_status st = reduce_into_shard(s, unit);
    s->host->free(s->host->ctx, us->grad_full);
    us->grad_full = NULL;
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
    int32_t reduce_scatter = 1, allgather_partitions = 1, contiguous = 1, pin_optimizer = 0, pin_param = 0;
    const char *offload_optimizer = "none", *offload_param = "none";
    zt_status st = h->cfg_bool(h->ctx, "zero_optimization.overlap_comm", &s->overlap_comm);
    if (st == ZT_OK) st = h->cfg_int(h->ctx, "zero_optimization.reduce_bucket_size", &s->reduce_bucket);
    if (st == ZT_OK) st = h->cfg_int(h->ctx, "zero_optimization.allgather_bucket_size", &s->allgather_bucket);
    if (st == ZT_OK) st = h->cfg_int(h->ctx, "zero_optimization.stage3_prefetch_bucket_size", &s->prefetch_bucket);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.reduce_scatter", &reduce_scatter);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.allgather_partitions", &allgather_partitions);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.contiguous_gradients", &contiguous);
    if (st == ZT_OK) st = h->cfg_string(h->ctx, "zero_optimization.offload_optimizer.device", &offload_optimizer);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.offload_optimizer.pin_memory", &pin_optimizer);
    if (st == ZT_OK) st = h->cfg_string(h->ctx, "zero_optimization.offload_param.device", &offload_param);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.offload_param.pin_memory", &pin_param);
    if (st != ZT_OK) return fail(s, st, "cannot read its options (status %d): a host bug", (int)st);

    s->offload_optimizer = !strcmp(offload_optimizer, "cpu");
    s->offload_param = !strcmp(offload_param, "cpu");
    s->pin_memory = pin_optimizer || pin_param;
    if (!reduce_scatter || !allgather_partitions || !contiguous)
        return fail(s, ZT_ERR_CONFIG,
                    "options: zero_optimization.%s is false, but zt always %s; remove the key or set it to true",
                    !reduce_scatter ? "reduce_scatter" : !allgather_partitions ? "allgather_partitions"
                                                                                : "contiguous_gradients",
                    !reduce_scatter         ? "reduces sharded gradients with a reduce-scatter"
                    : !allgather_partitions ? "gathers updated parameters with an all-gather"
                                            : "keeps gradients in contiguous per-unit buffers");
    if (STAGE == 0 && s->offload_optimizer)
        return fail(s, ZT_ERR_CONFIG,
                    "options: zero_optimization.offload_optimizer.device is \"cpu\", but offloading the optimizer "
                    "needs a sharded optimizer (stage 1, 2 or 3, as in DeepSpeed); set "
                    "zero_optimization.stage to 1 or more, or the device to \"none\"");
    if (STAGE < 3 && s->offload_param)
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
    for (int32_t u = 0; s->units && u < s->n_units; u++) {
        unit_store *us = &s->units[u];
        h->free(h->ctx, us->compute);
        h->free(h->ctx, us->compute_bf16);
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
    zero_cuda_destroy(h, s->gpu);
    h->free(h->ctx, s);
}

/* ---- setup ---------------------------------------------------------------------------------- */

/* GPU runs: the bf16 copy the model reads of every unit's master. */
static zt_status refresh_compute_copy(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    return us->padded ? zero_cuda_refresh(s->host, s->gpu, us->master, us->compute_bf16, us->padded) : ZT_OK;
}

/* GPU runs: the kernel context (sized for the norm over the optimizer's ranges) and the bf16 copies. */
static zt_status setup_gpu(zero_state *s)
{
    for (int32_t r = 0; r < s->n_ranges; r++) s->norm_sizes[r] = s->ranges[r].count;
    zt_status st = zero_cuda_create(s->host, s->n_ranges, s->norm_sizes, &s->gpu);
    for (int32_t u = 0; u < s->n_units && st == ZT_OK; u++) {
        unit_store *us = &s->units[u];
        if (!us->padded) continue;
        char tag[96];
        snprintf(tag, sizeof tag, PLUGIN_NAME " unit %d bf16 parameters", (int)u);
        us->compute_bf16 = s->host->alloc(s->host->ctx, ZT_POOL_PARAMS, ZT_MEM_DEVICE,
                                          (uint64_t)us->padded * sizeof(uint16_t), 0, tag);
        st = us->compute_bf16 ? refresh_compute_copy(s, u) : ZT_ERR_OUT_OF_MEMORY;
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
        us->touched = alloc_table(s, (uint64_t)(ul->n_params + 1) * sizeof(int32_t), PLUGIN_NAME " storage units");
        if (!us->touched) return ZT_ERR_OUT_OF_MEMORY;
        us->touched[us->n_touched++] = u;
        for (int32_t i = ul->first_param; i < ul->first_param + ul->n_params; i++) {
            int32_t home = m->params[s->storage[i]].unit, seen = 0;
            for (int32_t k = 0; k < us->n_touched; k++) seen |= us->touched[k] == home;
            if (!seen) us->touched[us->n_touched++] = home;
        }
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
    s->reduce_chunk = s->reduce_bucket / d > 0 ? s->reduce_bucket / d : 1;
    s->gather_chunk = s->allgather_bucket / d > 0 ? s->allgather_bucket / d : 1;
    if (STAGE >= 1 && largest > s->reduce_chunk) {
        s->reduce_staging = alloc_floats(s, ZT_POOL_COMM, 0, d * s->reduce_chunk, "reduce bucket (staging)", -1);
        if (!s->reduce_staging) return ZT_ERR_OUT_OF_MEMORY;
    }
    if (STAGE >= 1 && largest > s->gather_chunk) {
        s->gather_staging = alloc_floats(s, ZT_POOL_COMM, 0, d * s->gather_chunk, "all-gather bucket (staging)", -1);
        if (!s->gather_staging) return ZT_ERR_OUT_OF_MEMORY;
    }
    return ZT_OK;
}

static zt_status alloc_unit(zero_state *s, int32_t u)
{
    unit_store *us = &s->units[u];
    if (!SHARDED_PARAMS) {
        us->compute = alloc_floats(s, ZT_POOL_PARAMS, 0, us->padded, "parameters", u);
        if (us->padded && !us->compute) return ZT_ERR_OUT_OF_MEMORY;
    }
    if (SHARDED_MASTER) {
        /* stage 3 "offloads parameters" by keeping this shard on the host; the master is the shard */
        us->master = alloc_floats(s, ZT_POOL_PARAMS, s->offload_optimizer || s->offload_param, us->shard_count,
                                  "fp32 master shard", u);
        if (us->shard_count && !us->master) return ZT_ERR_OUT_OF_MEMORY;
    } else {
        us->master = us->compute;
    }
    us->grad = alloc_floats(s, ZT_POOL_GRADS, SHARDED_GRADS && s->offload_optimizer, us->n_grad, "gradients", u);
    if (us->n_grad && !us->grad) return ZT_ERR_OUT_OF_MEMORY;
    if (!s->n_state) return ZT_OK;
    us->state = alloc_table(s, (uint64_t)s->n_state * sizeof(float *), PLUGIN_NAME " state table");
    if (!us->state) return ZT_ERR_OUT_OF_MEMORY;
    for (int32_t k = 0; k < s->n_state; k++) {
        const char *name = s->opt->state_name ? s->opt->state_name(s->opt_state, k) : NULL;
        us->state[k] = alloc_floats(s, ZT_POOL_OPTIMIZER, s->offload_optimizer, us->n_state_elems,
                                    name ? name : "optimizer state", u);
        if (us->n_state_elems && !us->state[k]) return ZT_ERR_OUT_OF_MEMORY;
    }
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
    if (gpu && (!GPU_CAPABLE || layout->compute_dtype != ZT_BF16))
        return fail(s, ZT_ERR_UNSUPPORTED,
                    "trains on GPUs only as stage 0 built with CUDA, computing in bf16, for now (this run: "
                    "compute dtype %d); set zero_optimization.stage to 0, or train on the CPU (device = cpu)",
                    (int)layout->compute_dtype);
    if (!gpu && (h->device->device_type != ZT_DEVICE_CPU || layout->compute_dtype != ZT_F32))
        return fail(s, ZT_ERR_UNSUPPORTED,
                    "runs on the CPU in fp32 only for now (this run: %s, compute dtype %d); train on the CPU",
                    h->device->device_type == ZT_DEVICE_CUDA ? "CUDA" : "CPU", (int)layout->compute_dtype);
    zt_status st = h->group_get(h->ctx, "dp", &s->dp);
    if (st != ZT_OK) return st; /* the host's message names the missing group */
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
    s->units = alloc_table(s, (uint64_t)layout->n_units * sizeof *s->units, PLUGIN_NAME " units");
    s->storage = alloc_table(s, (uint64_t)n_params * sizeof *s->storage, PLUGIN_NAME " ties");
    s->grad_view = alloc_table(s, (uint64_t)n_params * sizeof *s->grad_view, PLUGIN_NAME " offsets");
    s->ranges = alloc_table(s, (uint64_t)n_params * sizeof *s->ranges, PLUGIN_NAME " ranges");
    s->norm_tensors = alloc_table(s, (uint64_t)n_params * sizeof *s->norm_tensors, PLUGIN_NAME " norm");
    s->norm_sizes = alloc_table(s, (uint64_t)n_params * sizeof *s->norm_sizes, PLUGIN_NAME " norm");
    s->norm_parts = alloc_table(s, (uint64_t)s->dp.size * sizeof *s->norm_parts, PLUGIN_NAME " norm");
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
    if (st == ZT_OK && (s->offload_optimizer || s->offload_param) && h->device->device_type == ZT_DEVICE_CPU)
        h->log(h->ctx, ZT_LOG_INFO,
               "offload to the CPU requested: this run computes on the CPU, where every buffer already is host "
               "memory, so nothing moves");
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
    zt_status st = check_unit(s, "before_unit", unit);
    if (st != ZT_OK) return st;
    if (phase != ZT_PHASE_FORWARD && phase != ZT_PHASE_BACKWARD)
        return fail(s, ZT_ERR_INVALID_ARG, "before_unit: phase %d is neither forward (0) nor backward (1)", (int)phase);
    const unit_store *us = &s->units[unit];
    for (int32_t k = 0; k < us->n_touched && st == ZT_OK; k++) {
        int32_t home = us->touched[k];
        unit_store *hs = &s->units[home];
        if (SHARDED_PARAMS) {
            st = hold_params(s, home);
        } else if (SHARDED_MASTER && hs->stale) {
            st = all_gather_unit(s, hs, hs->compute); /* a master shard was written (load, resume) */
            hs->stale = st != ZT_OK;
        }
        if (st == ZT_OK && SHARDED_GRADS && phase == ZT_PHASE_BACKWARD) st = hold_grads(s, home);
    }
    if (st != ZT_OK) return st;

    const zt_layout *l = s->layout;
    const zt_model_info *m = l->model;
    const zt_unit_layout *ul = &l->units[unit];
    for (int32_t k = 0; k < ul->n_params; k++) {
        int32_t i = ul->first_param + k, owner = s->storage[i];
        const zt_param_decl *p = &m->params[i];
        const unit_store *home = &s->units[m->params[owner].unit];
        const zt_device_ctx *device = s->host->device;
        if (params && s->gpu) fill_view(&params[k], p, home->compute_bf16 + l->param_offset[owner], ZT_BF16, device);
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
    zt_status st = check_unit(s, "after_unit", unit);
    if (st != ZT_OK || !SHARDED_PARAMS) return st; /* stages 0-2 keep the compute copy resident */
    (void)phase;
    const unit_store *us = &s->units[unit];
    for (int32_t k = 0; k < us->n_touched; k++) release_params(s, us->touched[k]);
    return ZT_OK;
}

static zt_status zero_grads_ready(void *opaque, int32_t unit, int32_t last_micro)
{
    zero_state *s = opaque;
    zt_status st = check_unit(s, "grads_ready", unit);
    if (st != ZT_OK) return st;
    const unit_store *us = &s->units[unit];
    if (SHARDED_GRADS) {
        for (int32_t k = 0; k < us->n_touched && st == ZT_OK; k++) st = release_grads(s, us->touched[k]);
        return st;
    }
    if (!last_micro || !s->overlap_comm || us->reduce_in_step) return ZT_OK;
    return reduce_unit_once(s, unit);
}

/* ---- the step ------------------------------------------------------------------------------- */

/* sqrt of the sum of squares of every trainable gradient of the whole model, the same on every rank. */
static zt_status global_norm(zero_state *s, double *norm)
{
    const zt_host *h = s->host;
    for (int32_t r = 0; r < s->n_ranges; r++) {
        const opt_range *rg = &s->ranges[r];
        s->norm_tensors[r] = s->units[rg->unit].grad + rg->grad_offset;
        s->norm_sizes[r] = rg->count;
    }
    double local = 0;
    if (s->gpu) {
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
    zt_status st = h->all_gather(h->ctx, &s->dp, &square, s->norm_parts, sizeof square, ZT_U8, NULL);
    if (st != ZT_OK) return st;
    double sum = 0;
    for (int32_t r = 0; r < s->dp.size; r++) sum += s->norm_parts[r];
    *norm = sqrt(sum);
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
    zt_status st = ZT_OK;
    for (int32_t u = 0; !SHARDED_GRADS && u < s->n_units && st == ZT_OK; u++) st = reduce_unit_once(s, u);
    if (st != ZT_OK) return st;

    double norm = 0;
    st = global_norm(s, &norm);
    if (st != ZT_OK) return st;
    norm /= a->loss_scale;
    r->grad_norm = norm;
    r->skipped = !isfinite(norm);
    if (r->skipped) return ZT_OK; /* every rank saw the same norm: they all skip */

    double clip = 1.0;
    if (a->max_grad_norm > 0) clip = fmin(1.0, a->max_grad_norm / (norm + 1e-6));
    float *state_at[MAX_OPT_STATES];
    for (int32_t k = 0; k < s->n_ranges; k++) {
        const opt_range *rg = &s->ranges[k];
        const unit_store *us = &s->units[rg->unit];
        for (int32_t j = 0; j < s->n_state; j++) state_at[j] = us->state[j] + rg->state_offset;
        zt_optim_hparams hp = {.struct_size = sizeof hp,
                               .step = a->step,
                               .lr = a->lr,
                               .weight_decay = rg->decay ? a->weight_decay : 0.0,
                               .grad_scale = clip / a->loss_scale};
        st = s->opt->step(s->opt_state, &hp, us->master + rg->master_offset, us->grad + rg->grad_offset,
                          state_at, (uint64_t)rg->count, s->gpu ? ZT_DEVICE_CUDA : ZT_DEVICE_CPU,
                          s->gpu ? s->host->device->compute_stream : NULL);
        if (st != ZT_OK) return st; /* the optimizer described its failure */
    }
    for (int32_t u = 0; s->gpu && u < s->n_units && st == ZT_OK; u++)
        if (s->units[u].n_state_elems) st = refresh_compute_copy(s, u);
    /* Stages 1-2: every rank's compute copy gets the updated slices of all ranks. */
    for (int32_t u = 0; SHARDED_MASTER && !SHARDED_PARAMS && u < s->n_units && st == ZT_OK; u++) {
        st = all_gather_unit(s, &s->units[u], s->units[u].compute);
        s->units[u].stale = st != ZT_OK;
    }
    return st;
}

static zt_status zero_zero_grad(void *opaque)
{
    zero_state *s = opaque;
    if (!s->units) return fail(s, ZT_ERR_INVALID_ARG, "zero_grad called before setup");
    for (int32_t u = 0; u < s->n_units; u++) {
        unit_store *us = &s->units[u];
        size_t bytes = (size_t)us->n_grad * sizeof(float);
        if (us->n_grad && s->gpu) {
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
 * parameters and padding. */
static zt_status copy_shard(zero_state *s, const char *call, int32_t unit, int32_t which, float *out, const float *in)
{
    zt_status st = check_unit(s, call, unit);
    if (st != ZT_OK) return st;
    if (which < 0 || which > s->n_state || (out == NULL && in == NULL))
        return fail(s, ZT_ERR_INVALID_ARG,
                    "%s: array %d is neither the master (0) nor one of the %d optimizer states, or the buffer is "
                    "NULL",
                    call, (int)which, (int)s->n_state);
    unit_store *us = &s->units[unit];
    size_t bytes = (size_t)us->shard_count * sizeof(float);
    if (which == ZT_SHARD_MASTER) {
        if (out) {
            st = s->gpu ? zero_cuda_copy(s->host, out, us->master, bytes) : (memcpy(out, us->master, bytes), ZT_OK);
        } else if (s->gpu) {
            st = zero_cuda_copy(s->host, us->master, in, bytes);
            if (st == ZT_OK) st = refresh_compute_copy(s, unit);
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
        if (s->gpu) st = zero_cuda_copy(s->host, dst, src, n);
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
    int gpu = s->host->device->device_type != ZT_DEVICE_CPU;
    /* Bytes per element of the compute copy and transient gradients: fp32 on the CPU, bf16/fp16 on GPUs. */
    double c = !gpu || in->compute_dtype == ZT_F32 ? 4.0 : 2.0;
    double master = SHARDED_MASTER ? 4.0 * n / d : (gpu ? 4.0 * n : 0.0);
    double compute = SHARDED_PARAMS ? c * max_touched : c * n;
    /* GPU runs accumulate gradients in fp32 (the kernels' dW), so stage 0 keeps them in fp32 there */
    double grads = STAGE == 0 ? (gpu ? 4.0 : c) * n : STAGE == 1 ? c * n : 4.0 * n / d + c * max_touched;
    double optimizer = 4.0 * k * (SHARDED_MASTER ? n / d : n);
    double comm = 0;
    if (STAGE >= 1) {
        double largest_slice = largest / d, reduce_chunk = fmax(1, floor((double)s->reduce_bucket / d)),
               gather_chunk = fmax(1, floor((double)s->allgather_bucket / d));
        if (largest_slice > reduce_chunk) comm += 4.0 * d * reduce_chunk;
        if (largest_slice > gather_chunk) comm += 4.0 * d * gather_chunk;
    }

    memset(out->device, 0, sizeof out->device);
    memset(out->host, 0, sizeof out->host);
    /* GPU runs: what is offloaded lives in host memory; CPU runs: everything does. */
    double *params_at = gpu ? out->device : out->host, *states_at = params_at;
    if (gpu && s->offload_optimizer) states_at = out->host;
    params_at[ZT_POOL_PARAMS] += compute;
    (SHARDED_PARAMS && gpu && s->offload_param ? out->host : states_at)[ZT_POOL_PARAMS] += master;
    if (SHARDED_GRADS) {
        params_at[ZT_POOL_GRADS] += c * max_touched;
        states_at[ZT_POOL_GRADS] += grads - c * max_touched;
    } else {
        params_at[ZT_POOL_GRADS] += grads;
    }
    states_at[ZT_POOL_OPTIMIZER] += optimizer;
    params_at[ZT_POOL_COMM] += comm;
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
            (GPU_CAPABLE ? ZT_CAP_CUDA | ZT_CAP_BF16 : 0),
    .probe = zero_probe,
    .init = zero_init,
    .fini = zero_fini,
    .ops = &zero_ops,
};

ZT_PLUGIN_ENTRY
{
    return &zero_plugin;
}
