/* The zero plugins' training step: the calls around each unit's forward and backward (the views of
 * the compute copy and of the gradients the model gets, stage 3's gathers, the reductions as the
 * backward goes), and step(): the reduction's end, the global norm, clipping and the optimizer over
 * this rank's ranges, then the refreshed compute copies. With offload or step_in_backward step()
 * hands over to offload_step.c or step_in_backward.c.
 */
#include <math.h>
#include <string.h>

#include <zt/zt.h>

#include "cpu/kernels.h"
#include "zero_internal.h"

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

zt_status zero_before_unit(void *opaque, int32_t unit, int32_t phase, zt_tensor *params, zt_tensor *grads)
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

zt_status zero_after_unit(void *opaque, int32_t unit, int32_t phase)
{
    zero_state *s = opaque;
    zt_status st = zero_check_unit(s, "after_unit", unit);
    if (st != ZT_OK || !SHARDED_PARAMS) return st; /* stages 0-2 keep the compute copy resident */
    (void)phase;
    const unit_store *us = &s->units[unit];
    for (int32_t k = 0; k < us->n_touched; k++) zero_release_params(s, us->touched[k]);
    return ZT_OK;
}

zt_status zero_grads_ready(void *opaque, int32_t unit, int32_t last_micro)
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

/* Tensor parallelism: this tensor rank's norm (of its shards, over "dp") into the model's, the squares
 * of every tensor rank added in rank order, so all of them clip alike. */
static zt_status zero_tp_norm(zero_state *s, double *norm)
{
    if (!s->has_tp || s->tp.size == 1) return ZT_OK;
    const zt_host *h = s->host;
    double square = *norm * *norm;
    zt_status st = h->all_gather(h->ctx, &s->tp, &square, s->norm_tp_parts, sizeof square, ZT_U8, NULL);
    if (st != ZT_OK) return st;
    double sum = 0;
    for (int32_t r = 0; r < s->tp.size; r++) sum += s->norm_tp_parts[r];
    *norm = sqrt(sum);
    return ZT_OK;
}

/* On the GPU under tensor parallelism: the norm of norm_tensors with each range held by k tensor ranks
 * counted 1/k, one device reduction per distinct k (1 for split tensors, tp for the norms, tp / kv
 * heads for replicated key/value heads), their squares added in order of k. The ranges are
 * regrouped in place and restored. */
static zt_status gpu_norm_of_replicas(zero_state *s, double *norm)
{
    int32_t n = s->n_ranges, done_below = 0;
    double sum = 0;
    const float **tensors = s->norm_tensors;
    int64_t *sizes = s->norm_sizes;
    zt_status st = ZT_OK;
    while (st == ZT_OK) {
        int32_t k = 0; /* the smallest replica count above done_below */
        for (int32_t r = 0; r < n; r++)
            if (s->ranges[r].replicas > done_below && (!k || s->ranges[r].replicas < k)) k = s->ranges[r].replicas;
        if (!k) break;
        int32_t m = 0;
        for (int32_t r = 0; r < n; r++)
            if (s->ranges[r].replicas == k) {
                tensors[m] = s->units[s->ranges[r].unit].grad + s->ranges[r].grad_offset;
                sizes[m++] = s->ranges[r].count;
            }
        double part = 0;
        st = zero_cuda_global_norm(s->host, s->gpu, m, tensors, sizes, &part);
        sum += part * part / k;
        done_below = k;
    }
    for (int32_t r = 0; r < n; r++) {
        tensors[r] = s->units[s->ranges[r].unit].grad + s->ranges[r].grad_offset;
        sizes[r] = s->ranges[r].count;
    }
    *norm = sqrt(sum);
    return st;
}

/* sqrt of the sum of squares of every trainable gradient of the whole model, the same on every rank. */
zt_status zero_global_norm(zero_state *s, double *norm)
{
    const zt_host *h = s->host;
    for (int32_t r = 0; r < s->n_ranges; r++) {
        const opt_range *rg = &s->ranges[r];
        s->norm_tensors[r] = s->units[rg->unit].grad + rg->grad_offset;
        s->norm_sizes[r] = rg->count;
    }
    double local = 0;
    /* offload, stages 2-3: the reduced gradients are the host shards */
    if (s->gpu && !(s->off.on_gpu && SHARDED_GRADS) && s->has_tp) {
        zt_status st = gpu_norm_of_replicas(s, &local);
        if (st != ZT_OK) return st;
    } else if (s->gpu && !(s->off.on_gpu && SHARDED_GRADS)) {
        zt_status st = zero_cuda_global_norm(h, s->gpu, s->n_ranges, s->norm_tensors, s->norm_sizes, &local);
        if (st != ZT_OK) return st;
    } else if (s->has_tp) { /* each value once: a range held by k tensor ranks counts 1/k on each */
        zt_cpu_ctx cpu = {.parallel_for = h->parallel_for, .pool = h->ctx};
        double sum = 0;
        for (int32_t r = 0; r < s->n_ranges; r++) {
            double part = zt_cpu_global_l2_norm(&cpu, 1, &s->norm_tensors[r], &s->norm_sizes[r]);
            sum += part * part / s->ranges[r].replicas;
        }
        local = sqrt(sum);
    } else {
        zt_cpu_ctx cpu = {.parallel_for = h->parallel_for, .pool = h->ctx};
        local = zt_cpu_global_l2_norm(&cpu, s->n_ranges, s->norm_tensors, s->norm_sizes);
    }
    double sum = local * local;
    if (STAGE != 0 && s->dp.size > 1) { /* stages 0: every rank holds every reduced gradient */
        /* The doubles themselves (as bytes, which every backend moves exactly), added in rank order. */
        double square = sum;
        zt_status st = s->gpu ? zero_cuda_all_gather_double(h, s->gpu, &s->dp, square, s->norm_parts)
                              : h->all_gather(h->ctx, &s->dp, &square, s->norm_parts, sizeof square, ZT_U8, NULL);
        if (st != ZT_OK) return st;
        sum = 0;
        for (int32_t r = 0; r < s->dp.size; r++) sum += s->norm_parts[r];
    }
    /* A pipeline: each stage has the gradients of its own units only (the others' are zero here), so
     * the stages' sums of squares add up, in stage order, to the whole model's (CPU ranks). */
    if (s->pp.size > 1) {
        double square = sum, parts[ZERO_MAX_PP];
        zt_status st = h->all_gather(h->ctx, &s->pp, &square, parts, sizeof square, ZT_U8, NULL);
        if (st != ZT_OK) return st;
        sum = 0;
        for (int32_t r = 0; r < s->pp.size; r++) sum += parts[r];
    }
    *norm = sqrt(sum);
    return zero_tp_norm(s, norm);
}

/* The optimizer on one range of this rank's slice: `grads` laid out as the unit's `grad`; `copy`
 * NULL or the base of the bf16 array (indexed like the master) the optimizer writes in the same pass
 * (ABI 1.1 compute_copy, only when it says it does); on the GPU or on the CPU. */
zt_status zero_step_range_at(zero_state *s, const opt_range *rg, const zt_step_args *a, double clip,
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
zt_status zero_step_range(zero_state *s, const opt_range *rg, const zt_step_args *a, double clip)
{
    const unit_store *us = &s->units[rg->unit];
    int on_gpu = s->gpu != NULL;
    /* ABI 1.1: the bf16 compute copy in the same pass (this rank's slice of it), unless it lives on the
     * host (stage 3 with offload_param alone: zero_after_unit_step converts and copies it) or stage 3
     * keeps none (cast_gather) */
    uint16_t *copy = NULL;
    if (on_gpu && !(SHARDED_PARAMS && s->cfg.offload_param) && !s->cast_gather)
        copy = STAGE == 0 ? us->compute_bf16 : SHARDED_PARAMS ? us->shard_bf16 : us->compute_bf16 + us->shard_offset;
    const float *grads = us->step_grads ? us->step_grads : us->grad;
    return zero_step_range_at(s, rg, a, clip, grads, copy, on_gpu);
}

/* After the optimizer updated unit u's master: GPU runs convert it to the bf16 copy unless the
 * optimizer wrote it (ABI 1.1 compute_copy, in the same pass); stages 1-2 then all-gather every
 * rank's updated slice into the compute copy (GPU runs: bf16, in place, on the comm stream; the
 * unit's next before_unit waits for it). */
zt_status zero_after_unit_step(zero_state *s, int32_t u)
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

zt_status zero_step(void *opaque, const zt_step_args *a, zt_step_result *r)
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

zt_status zero_zero_grad(void *opaque)
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
