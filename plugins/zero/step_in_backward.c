/* The zero plugins' zero_optimization.step_in_backward (zero.c's header comment, "step_in_backward"):
 * whether a run steps inside the backward, begin_step (the arguments it steps with, also offload's
 * early steps'), each storage unit's step at the grads_ready of its last writer, and step(), which
 * then only reports the norm.
 */
#include <math.h>
#include <string.h>

#include <zt/zt.h>

#include "cpu/kernels.h"
#include "zero_internal.h"

/* ---- whether a run steps in the backward ---------------------------------------------------- */

/* zero_optimization.step_in_backward: the step inside the backward equals the step after it only
 * when the update of a unit needs nothing of the other units: no clipping (the global norm), no loss
 * scale (fp16: a non-finite norm must skip the step), one micro-batch per step (the gradient is
 * complete at the first backward). auto: on for such runs on one GPU (the memory of a full gradient
 * buffer matters there; on several the overlap of reductions with the backward matters more); true:
 * refuse what is not exact; false: never. Offload steps on its own thread. */
zt_status zero_sib_decide(zero_state *s, int gpu)
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

/* ---- the step inside the backward ----------------------------------------------------------- */

/* begin_step (ABI 1.1): the step's arguments before its backward, so that units can be stepped in
 * it (step_in_backward; on GPUs offload's early steps, when this step neither clips nor scales). */
zt_status zero_begin_step(void *opaque, const zt_step_args *a)
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

/* step_in_backward: unit u's gradients are complete and reduced (`grads`, laid out as `grad`):
 * add its sum of squares to the norm (GPU runs: a device float per unit, read once in step()),
 * step its ranges with begin_step's arguments, and refresh its compute copy. */
zt_status zero_sib_step_unit(zero_state *s, int32_t unit, const float *grads)
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
zt_status zero_sib_finish_step(zero_state *s, const zt_step_args *a, zt_step_result *r)
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
