/* ZeRO stages 0-3 (DeepSpeed's zero_optimization.stage), one set of sources compiled once per stage
 * with ZT_ZERO_STAGE = 0..3 (plugins/zero/CMakeLists.txt): the stages differ in what a rank keeps
 * whole and what it keeps as its 1/dp shard, not in how anything is computed. docs/zero.md is the
 * user's guide; this comment is the map of the code. This file holds the options, init and fini,
 * setup (what each unit keeps where, and its buffers), the checkpoint shards and the plugin's tables;
 * the rest, each file one concern, sharing the state of zero_internal.h:
 *   collectives.c       the reductions and gathers of a unit (ordered on the comm stream on GPUs),
 *                       stage 3's gathered parameters and stages 2-3's transient gradients
 *   step.c              the per-unit calls of forward and backward, and the optimizer step
 *   offload_step.c      offload_optimizer: the step on the offload thread (offload.c) and, on GPUs,
 *                       the gradient downloads, parameter uploads and their tickets
 *   step_in_backward.c  step_in_backward: whether it is on, and each unit's step inside the backward
 *   estimate.c          the memory estimate (zt-run --dry-run), from the model's declarations alone
 *   zero_cuda.c         the GPU side of all of these (zero_cuda.h)
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
 * (stage3_prefetch_bucket_size sizes the prefetch of the GPU path, stage3_max_live_parameters caps what
 * it may hold gathered with the running units).
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
 * Offload on GPUs (off.on_gpu: offload_optimizer on a GPU run). The fp32 master, the optimizer state
 * and (stages 2-3) the gradient shard are host memory; the model's bf16 copies stay on the device.
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
 *     compute_bf16 at shard_offset; stage 3: shard_bf16), then the unit's upload event;
 *     zero_gather_unit makes the comm stream wait on it, so the next gather of the unit reads the new
 *     values. Stage 3 with offload_param keeps shard_bf16 on the host: the optimizer writes it
 *     directly, and zero_gather_unit copies it up into this rank's slot of the gathered buffer and
 *     gathers in place.
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
 * comm stream (zero_prefetch_next): with the fp32 master on the device (no offload), zero_gather_unit
 * casts this rank's master shard into its slot of the gathered buffer and gathers in place
 * (cast_gather: no bf16 shard is kept, 2 bytes per parameter / ranks less, as FSDP2's mixed precision
 * casts before its all-gather); with offload, from a bf16 shard [S] (shard_bf16) the offload thread
 * uploads or writes.
 * Where a bf16 copy of the master is kept, the optimizer writes it in its update pass (ABI 1.1
 * compute_copy; zero_refresh_compute_copy converts otherwise and after loads).
 * Collectives run on the comm stream, ordered by events (zero_cuda.h; zero_internal.h's
 * comm_after_compute before, comm_done after, compute_after where the compute stream needs the data);
 * stages 2-3 free a transient gradient buffer one unit after its reduction (pending_free,
 * zero_flush_pending).
 *
 * Frozen parameters (ABI 1.3: the layout's trainable_numel). The host puts a unit's trainable
 * parameters first, [0, P), and its frozen ones after, [P, total); everything above (master, gradients,
 * optimizer state, shards, reductions, the optimizer) is over [0, P) alone. The frozen region exists
 * only in the compute copy the model reads: stages 0-2 at [P, total) of the full compute buffer (CPU
 * fp32, GPU bf16/fp16), stage 3 as a 1/dp shard in the compute dtype (frozen_shard, host memory with
 * offload_param) that zero_gather_unit gathers next to the trainable region. It is written once
 * (write_shard of ZT_SHARD_FROZEN) and never reduced, stepped or gathered again by stages 0-2. A unit
 * with nothing to train (P = 0) has no master, gradient or state at all, and the backward need not
 * visit it.
 *
 * step_in_backward (zero_optimization.step_in_backward, ABI 1.1 begin_step): with one micro-batch,
 * no clipping and no loss scale, each storage unit is reduced and stepped at grads_ready of the last
 * unit writing it (sib_step_at), from gradients that exist only for that unit: stages 0-1 allocate
 * `grad` in the backward and free it after the step (zero_hold_grads), stages 2-3 reduce-scatter
 * grad_full in place and step from it (a storage unit several units write keeps its accumulator, so
 * the sums are those of the normal path: bit for bit the same weights on CPU runs). step() then only
 * reports the norm (zero_sib_finish_step).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <zt/zt.h>

#include "cpu/f16.h"
#include "cpu/kernels.h"
#include "zero_internal.h"

static inline float f32_from_bf16_bits(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static const char *const k_offload_devices[] = {"none", "cpu", NULL};
static const char *const k_step_in_backward[] = {"auto", "true", "false", NULL};

const zt_option zero_options[] = {
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
     .min = 0,
     .help = "elements per gradient reduction call (DeepSpeed's name and unit); a larger unit is reduced "
             "in pieces through a staging buffer of this size. 0: each unit in one call (DeepSpeed's 0 reduces "
             "every gradient on its own, unbucketed; zt's smallest reduction is one unit's)"},
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
    {.key = "zero_optimization.stage3_max_live_parameters",
     .type = ZT_OPT_INT,
     .flags = ZT_OPT_HAS_MIN,
     .default_value = "1000000000",
     .min = 0,
     .help = "stage 3: at most this many parameter elements gathered at once, counting the running units; "
             "on GPU runs a prefetch that would pass it waits (the running unit itself is always gathered). CPU "
             "runs hold only the running unit (and a tied embedding) anyway"},
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

const int32_t zero_n_options = sizeof zero_options / sizeof zero_options[0];

/* ---- helpers -------------------------------------------------------------------------------- */

static void zero_range(void *arg, int64_t begin, int64_t end)
{
    memset((float *)arg + begin, 0, (size_t)(end - begin) * sizeof(float));
}

/* Where a buffer lives. CPU runs: host memory. GPU runs: device memory, or host memory for what is
 * offloaded, page-locked (ZT_MEM_PINNED) when the pin_memory of an offload it belongs to is on. */
int32_t zero_mem_where(const zero_state *s, int offloaded)
{
    if (s->host->device->device_type == ZT_DEVICE_CPU) return ZT_MEM_HOST;
    int opt = (offloaded & OFFLOADED_OPTIMIZER) && s->cfg.offload_optimizer;
    int param = (offloaded & OFFLOADED_PARAM) && s->cfg.offload_param;
    if (!opt && !param) return ZT_MEM_DEVICE;
    return (opt && s->cfg.pin_optimizer) || (param && s->cfg.pin_param) ? ZT_MEM_PINNED : ZT_MEM_HOST;
}

/* n zero-filled floats; NULL only on failure (n == 0 gives NULL and no error: nothing to hold). */
float *zero_alloc_floats(const zero_state *s, int pool, int offloaded, int64_t n, const char *what, int32_t unit)
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

void *zero_alloc_table(const zero_state *s, uint64_t bytes, const char *what)
{
    void *p = s->host->alloc(s->host->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, bytes ? bytes : 1, 0, what);
    if (p) memset(p, 0, bytes);
    return p;
}

/* The compute copy's 16 bits of fp32 on the CPU: bf16, the bits of the GPU's __float2bfloat16_rn and
 * of adamw's CPU compute_copy; or fp16 (fp16.enabled, GPU runs only), those of __float2half_rn. */
void zero_bf16_host(const zero_state *s, const float *src, uint16_t *dst, int64_t n)
{
    zt_cpu_ctx cpu = {.parallel_for = s->host->parallel_for, .pool = s->host->ctx};
    if (s->compute16 == ZT_F16) zt_cpu_to_f16(&cpu, n, src, dst);
    else zt_cpu_to_bf16(&cpu, n, src, dst);
}

/* The optimizer writes the compute copy in its update pass (ABI 1.1), in this run's 16-bit type (fp16
 * copies: ABI 1.2's ZT_OPTIM_WRITES_COMPUTE_COPY_F16); otherwise zero_refresh_compute_copy converts. */
int zero_opt_writes_copy(const zero_state *s)
{
    if (!(s->opt->flags & ZT_OPTIM_WRITES_COMPUTE_COPY)) return 0;
    return s->compute16 != ZT_F16 || (s->opt->flags & ZT_OPTIM_WRITES_COMPUTE_COPY_F16);
}

zt_status zero_check_unit(const zero_state *s, const char *call, int32_t unit)
{
    if (!s->units) return fail(s, ZT_ERR_INVALID_ARG, "%s called before setup", call);
    if (unit < 0 || unit >= s->n_units)
        return fail(s, ZT_ERR_INVALID_ARG, "%s: unit %d is not in [0, %d)", call, (int)unit, (int)s->n_units);
    return ZT_OK;
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
    if (st == ZT_OK) st = h->cfg_int(h->ctx, "zero_optimization.stage3_max_live_parameters", &s->cfg.max_live);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.reduce_scatter", &reduce_scatter);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.allgather_partitions", &allgather_partitions);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.contiguous_gradients", &contiguous);
    if (st == ZT_OK) st = h->cfg_string(h->ctx, "zero_optimization.offload_optimizer.device", &offload_optimizer);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.offload_optimizer.pin_memory", &pin_optimizer);
    if (st == ZT_OK) st = h->cfg_string(h->ctx, "zero_optimization.offload_param.device", &offload_param);
    if (st == ZT_OK) st = h->cfg_bool(h->ctx, "zero_optimization.offload_param.pin_memory", &pin_param);
    if (st != ZT_OK) return fail(s, st, "cannot read its options (status %d): a host bug", (int)st);
    if (s->cfg.reduce_bucket == 0) s->cfg.reduce_bucket = INT64_MAX; /* no bucket: a unit per call */

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
        h->free(h->ctx, us->frozen_shard);
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
    h->free(h->ctx, s->norm_tp_parts);
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
zt_status zero_refresh_compute_copy(zero_state *s, int32_t unit)
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
        if (SHARDED_PARAMS && us->frozen_count) { /* the frozen shard, in the compute dtype only */
            char tag[96];
            snprintf(tag, sizeof tag, PLUGIN_NAME " unit %d frozen 16-bit parameters (shard)", (int)u);
            us->frozen_shard = s->host->alloc(s->host->ctx, ZT_POOL_PARAMS, zero_mem_where(s, OFFLOADED_PARAM),
                                              (uint64_t)us->frozen_count * sizeof(uint16_t), 0, tag);
            if (!us->frozen_shard) st = ZT_ERR_OUT_OF_MEMORY;
        }
        if (st != ZT_OK || !(SHARDED_PARAMS ? us->padded : us->total) || s->cast_gather) continue;
        char tag[96];
        int64_t n = SHARDED_PARAMS ? us->shard_count : us->total;
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
            if (!l->trainable_numel || l->trainable_numel[s->units[u].touched[k]]) hs->sib_step_at = u; /* else nothing to step */
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
        us->total = ul->padded_numel;
        us->padded = l->trainable_numel ? l->trainable_numel[u] : ul->padded_numel;
        us->shard_count = SHARDED_MASTER ? us->padded / s->dp.size : us->padded;
        us->shard_offset = SHARDED_MASTER ? s->dp.rank * us->shard_count : 0;
        us->frozen_count = SHARDED_PARAMS ? (us->total - us->padded) / s->dp.size : us->total - us->padded;
        us->frozen_offset = us->padded + (SHARDED_PARAMS ? s->dp.rank * us->frozen_count : 0);
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
            int32_t replicas = l->struct_size >= ZT_LAYOUT_SIZE_1_4 && l->tp_replicas ? l->tp_replicas[i] : 1;
            if (last && last->unit == u && last->decay == (int32_t)l->decay[i] && last->replicas == replicas &&
                last->master_offset + last->count == master) {
                last->count += count;
            } else {
                s->ranges[n_ranges++] = (opt_range){.unit = u,
                                                    .decay = l->decay[i],
                                                    .replicas = replicas,
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
        /* CPU: the fp32 compute copy of the whole unit (stage 0: also the master of [0, P)); GPU stage 0:
         * the fp32 master of the trainable region only, beside the 16-bit copy of everything */
        int64_t n = gpu ? us->padded : us->total;
        us->compute = zero_alloc_floats(s, ZT_POOL_PARAMS, 0, n, gpu ? "fp32 master" : "parameters", u);
        if (n && !us->compute) return ZT_ERR_OUT_OF_MEMORY;
    }
    if (SHARDED_PARAMS && !gpu && us->frozen_count) {
        us->frozen_shard = zero_alloc_floats(s, ZT_POOL_PARAMS, 0, us->frozen_count, "frozen parameters (shard)", u);
        if (!us->frozen_shard) return ZT_ERR_OUT_OF_MEMORY;
    }
    if (SHARDED_MASTER) {
        /* the master lives with the optimizer: offload_param moves the stage-3 bf16 shard (setup_gpu) */
        us->master = zero_alloc_floats(s, ZT_POOL_PARAMS, OFFLOADED_OPTIMIZER, us->shard_count, "fp32 master shard", u);
        if (us->shard_count && !us->master) return ZT_ERR_OUT_OF_MEMORY;
    } else {
        us->master = us->compute;
    }
    /* step_in_backward: stages 0-1 allocate gradients per step and unit (zero_hold_grads); stages 2-3
     * keep a shard accumulator only for a storage unit several units write (a tied embedding) */
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
    int64_t stages = 1;
    if (h->cfg_int(h->ctx, "parallel_config.pipeline_stage", &stages) == ZT_OK && stages > 1) {
        if (stages > ZERO_MAX_PP)
            return fail(s, ZT_ERR_UNSUPPORTED, "adds the gradient norms of at most %d pipeline stages, not %lld; "
                        "use fewer stages", ZERO_MAX_PP, (long long)stages);
        st = h->group_get(h->ctx, "pp", &s->pp);
        if (st != ZT_OK) return st;
    }
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
    /* tensor parallelism: the norm also adds the other tensor ranks' shards */
    if (layout->struct_size >= ZT_LAYOUT_SIZE_1_4 && layout->tp_replicas) {
        st = h->group_get(h->ctx, "tp", &s->tp);
        if (st != ZT_OK) return st;
        s->has_tp = 1;
        s->norm_tp_parts = zero_alloc_table(s, (uint64_t)s->tp.size * sizeof *s->norm_tp_parts, PLUGIN_NAME " norm");
        if (!s->norm_tp_parts) return ZT_ERR_OUT_OF_MEMORY;
    }
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

/* ---- shards --------------------------------------------------------------------------------- */

static void zero_shard_range(void *opaque, int32_t unit, int64_t *offset, int64_t *count)
{
    zero_state *s = opaque;
    int known = s->units && unit >= 0 && unit < s->n_units;
    *offset = known ? s->units[unit].shard_offset : 0;
    *count = known ? s->units[unit].shard_count : 0;
}

/* This rank's slice of the frozen region in fp32 to (out) or from (in) the compute copy that alone holds
 * it: stages 0-2 the full compute buffer past the trainable region, stage 3 the frozen shard. */
static zt_status copy_frozen(zero_state *s, unit_store *us, float *out, const float *in)
{
    int64_t n = us->frozen_count;
    if (!n) return ZT_OK;
    if (!s->gpu) {
        float *at = SHARDED_PARAMS ? us->frozen_shard : us->compute + us->frozen_offset;
        memcpy(out ? (void *)out : (void *)at, out ? (const void *)at : (const void *)in, (size_t)n * sizeof(float));
        return ZT_OK;
    }
    uint16_t *at = SHARDED_PARAMS ? us->frozen_shard : us->compute_bf16 + us->frozen_offset;
    uint16_t *tmp = zero_alloc_table(s, (uint64_t)n * sizeof(uint16_t), PLUGIN_NAME " frozen weights (transient)");
    if (!tmp) return ZT_ERR_OUT_OF_MEMORY;
    zt_status st = zero_cuda_sync_comm(s->host, s->gpu); /* a gather may still read the old values */
    if (st == ZT_OK && in) {
        zero_bf16_host(s, in, tmp, n);
        st = zero_cuda_copy(s->host, at, tmp, (uint64_t)n * sizeof(uint16_t));
    } else if (st == ZT_OK) {
        st = zero_cuda_copy(s->host, tmp, at, (uint64_t)n * sizeof(uint16_t));
        for (int64_t k = 0; st == ZT_OK && k < n; k++)
            out[k] = s->compute16 == ZT_F16 ? zt_f32_from_f16_bits(tmp[k]) : f32_from_bf16_bits(tmp[k]);
    }
    s->host->free(s->host->ctx, tmp);
    return st;
}

static void zero_frozen_range(void *opaque, int32_t unit, int64_t *offset, int64_t *count)
{
    zero_state *s = opaque;
    int known = s->units && unit >= 0 && unit < s->n_units;
    *offset = known ? s->units[unit].frozen_offset : 0;
    *count = known ? s->units[unit].frozen_count : 0;
}

/* Optimizer state is packed (trainable elements only); a shard is positional, zeros for frozen
 * parameters and padding. noinline: inlined into read_shard (in = NULL), GCC 12 at -O3 warns that the
 * write branches memcpy from NULL, which the check below rules out. */
__attribute__((noinline)) static zt_status copy_shard(zero_state *s, const char *call, int32_t unit, int32_t which, float *out, const float *in)
{
    zt_status st = zero_check_unit(s, call, unit);
    if (st != ZT_OK) return st;
    if (which < ZT_SHARD_FROZEN || which > s->n_state || (out == NULL && in == NULL))
        return fail(s, ZT_ERR_INVALID_ARG,
                    "%s: array %d is neither the master (0) nor one of the %d optimizer states (nor the frozen "
                    "region, -1), or the buffer is NULL",
                    call, (int)which, (int)s->n_state);
    unit_store *us = &s->units[unit];
    if (which == ZT_SHARD_FROZEN) return copy_frozen(s, us, out, in);
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
    .frozen_range = zero_frozen_range,
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
    .version = "1.2.0",
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
