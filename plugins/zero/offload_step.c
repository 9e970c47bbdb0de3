/* The zero plugins' offload_optimizer (zero.c's header comment, "Offload" and "Offload on GPUs"):
 * the step handed to the offload thread (offload.c) unit by unit, and on GPU runs the rest of it: the
 * host buffers, each unit's gradients downloaded into the host shard, its CPU step and its upload,
 * the tickets that keep the training thread from reusing what a job still reads, and step() with its
 * early steps during the backward. Only the training thread issues collectives; the offload thread
 * (zero_off_job) only waits on events and enqueues copies.
 */
#include <math.h>
#include <string.h>

#include <zt/zt.h>

#include "cpu/kernels.h"
#include "zero_internal.h"

/* The offload thread's job (offload.h): job = kind * n_units + unit. CPU runs submit JOB_STEP only,
 * as the unit number itself. */
#define JOB_STEP 0
#define JOB_ADD 1

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

/* ---- offload on GPUs: the host buffers ------------------------------------------------------ */

/* Offload on GPUs: the host buffers the copies go through (two fp32 download buffers and two bf16
 * upload staging buffers of the largest shard; host memory, pinned per offload_optimizer.pin_memory),
 * the offload thread's tables, and the copy events. */
zt_status zero_off_setup_gpu(zero_state *s)
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
zt_status zero_off_download_grads(zero_state *s, int32_t unit, const float *slice)
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
zt_status zero_off_submit_step(zero_state *s, int32_t unit)
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

/* ---- the step on the offload thread --------------------------------------------------------- */

/* Offload on GPUs, on the offload thread: unit u's CPU step from its host gradients (stage 1: the
 * download buffer) once their download has landed, the bf16 of the updated master into a staging buffer
 * (or, stage 3 with offload_param, the host bf16 shard itself), uploaded on the copy stream into the
 * unit's device bf16 slice; the unit's upload event follows (zero_gather_unit waits on it). */
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
zt_status zero_off_job(void *opaque, int32_t job)
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
zt_status zero_off_step(zero_state *s, const zt_step_args *a, double clip)
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

/* ---- step() with offload on GPUs ------------------------------------------------------------ */

/* Offload on GPUs, after unit u's step job was queued: wait for it, then (stages 1-2) all-gather every
 * rank's updated slice into the compute copy behind the upload (zero_gather_unit). Collectives are
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

/* step() with offload on GPUs (zero.c's header comment, "Offload on GPUs"). Returns once every job is
 * done. */
zt_status zero_off_gpu_step(zero_state *s, const zt_step_args *a, zt_step_result *r)
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
