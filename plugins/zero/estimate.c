/* The zero plugins' memory estimate (zt-run --dry-run; docs/zero.md): the bytes setup would
 * allocate for this stage and its options, per pool, in device and host memory, from the model's
 * declarations alone (no layout, no GPU needed).
 */
#include <math.h>
#include <string.h>

#include <zt/zt.h>

#include "zero_internal.h"

/* ---- memory estimate ------------------------------------------------------------------------ */

/* Per-unit sizes the estimate needs, from the model's declarations alone: the largest sum of the
 * storage units one unit touches (a stage-3 gather: every parameter; a stage-2/3 transient gradient:
 * the trainable ones only, `trainable` NULL meaning all) and the largest unit. Padding (under
 * dp * 16 elements per unit and region) is left out. */
static void unit_extents(const zt_model_info *m, const uint8_t *trainable, double *max_touched,
                         double *max_touched_trainable, double *largest_unit)
{
    *max_touched = *max_touched_trainable = *largest_unit = 0;
    for (int32_t u = 0; u < m->n_units; u++) {
        double touched = 0, touched_trainable = 0;
        for (int32_t home = 0; home < m->n_units; home++) {
            double size = 0, size_trainable = 0;
            int uses = home == u;
            for (int32_t i = 0; i < m->n_params_decl; i++) {
                const zt_param_decl *p = &m->params[i];
                if (p->unit == home && !(p->flags & ZT_PARAM_TIED)) {
                    size += (double)numel_of(p);
                    if (!trainable || trainable[i]) size_trainable += (double)numel_of(p);
                }
                if (p->unit == u && (p->flags & ZT_PARAM_TIED)) {
                    int32_t owner = find_param(m, p->tied_to);
                    uses |= owner >= 0 && m->params[owner].unit == home;
                }
            }
            if (home == u && size > *largest_unit) *largest_unit = size;
            if (uses) touched += size, touched_trainable += size_trainable;
        }
        if (touched > *max_touched) *max_touched = touched;
        if (touched_trainable > *max_touched_trainable) *max_touched_trainable = touched_trainable;
    }
}

/* Whether the optimizer steps inside the backward (ABI 1.1, zero_optimization.step_in_backward): then
 * gradients exist only per unit. Read only when this build declares the option; auto resolves as
 * zero_sib_decide does: on one GPU, without clipping, loss scaling (fp16), gradient accumulation and
 * offload. */
static int estimate_step_in_backward(const zero_state *s, double d)
{
    static const char key[] = "zero_optimization.step_in_backward";
    int declared = 0;
    for (int32_t i = 0; i < zero_n_options; i++)
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

/* GPU runs (bf16 compute, fp32 master, fp32 gradient accumulation), per rank, P parameters of which T
 * train, over d ranks, U = the largest set of storage units one unit touches (a gathered unit with its
 * tied owner), Ut the trainable part of such a set, k optimizer states. A frozen parameter costs only
 * its bf16 copy (2 bytes, over d under stage 3):
 *   stage 0: master 4T + bf16 copy 2P; gradients 4T (4Ut when stepping in the backward); state 4kT
 *   stage 1: bf16 2P + master 4T/d; gradients 4T (4Ut); state 4kT/d
 *   stage 2: bf16 2P + master 4T/d; gradient shard 4T/d + one unit's transient full gradients 4Ut
 *            (stepping in the backward: only the unit's shard 4Ut/d); state 4kT/d
 *   stage 3: two gathered units 2 x 2U (current and prefetched) + master 4T/d (each gather casts
 *            the master shard into its slot: cast_gather) + the frozen bf16 shard 2(P - T)/d;
 *            gradients as stage 2; state 4kT/d; with an offload also a bf16 shard 2T/d, the
 *            gathers' source
 * offload_optimizer: master, state and gradient shards in pinned host memory, plus two bf16 upload
 * staging buffers and two fp32 gradient download buffers of one unit's trainable shard on the host
 * (one in flight while the other is used);
 * offload_param (stage 3): the bf16 shards in pinned host memory. Buckets (pool comm) as on the CPU. */
static void estimate_gpu(const zero_state *s, double n, double t, double k, double d, double touched,
                         double touched_t, double comm, zt_mem_estimate *out)
{
    int sib = estimate_step_in_backward(s, d);
    int off_opt = STAGE >= 1 && s->cfg.offload_optimizer, off_param = SHARDED_PARAMS && s->cfg.offload_param;
    double *dev = out->device, *host = out->host, *states_at = off_opt ? host : dev;
    if (STAGE == 0) {
        dev[ZT_POOL_PARAMS] += 4.0 * t + 2.0 * n;
        dev[ZT_POOL_GRADS] += 4.0 * (sib ? touched_t : t);
        dev[ZT_POOL_OPTIMIZER] += 4.0 * k * t;
    } else {
        if (SHARDED_PARAMS) {
            if (off_opt || off_param) (off_param ? host : dev)[ZT_POOL_PARAMS] += 2.0 * t / d;
            (off_param ? host : dev)[ZT_POOL_PARAMS] += 2.0 * (n - t) / d;
            dev[ZT_POOL_PARAMS] += 2.0 * 2.0 * touched;
        } else {
            dev[ZT_POOL_PARAMS] += 2.0 * n;
        }
        states_at[ZT_POOL_PARAMS] += 4.0 * t / d;
        if (off_opt) {
            host[ZT_POOL_PARAMS] += 2.0 * 2.0 * touched_t / d; /* two bf16 upload staging buffers */
            host[ZT_POOL_GRADS] += 2.0 * 4.0 * touched_t / d;  /* two fp32 gradient download buffers */
        }
        if (!SHARDED_GRADS) {
            dev[ZT_POOL_GRADS] += 4.0 * (sib ? touched_t : t);
        } else {
            dev[ZT_POOL_GRADS] += 4.0 * touched_t;
            states_at[ZT_POOL_GRADS] += 4.0 * (sib ? touched_t : t) / d;
        }
        states_at[ZT_POOL_OPTIMIZER] += 4.0 * k * t / d;
    }
    dev[ZT_POOL_COMM] += comm;
}

zt_status zero_estimate(void *opaque, const zt_estimate_in *in, zt_mem_estimate *out)
{
    zero_state *s = opaque;
    if (!in || !out || in->struct_size < sizeof(zt_estimate_in) || out->struct_size < sizeof(zt_mem_estimate) ||
        in->dp_size < 1 || in->n_optimizer_states < 0)
        return fail(s, ZT_ERR_INVALID_ARG, "estimate: the arguments are missing, too old or out of range");
    double n = (double)in->n_parameters, k = (double)in->n_optimizer_states, d = (double)in->dp_size;
    double max_touched = 0, max_touched_t = 0, largest = (double)in->largest_unit_numel;
    /* ABI 1.3: the frozen parameters, which cost only their compute copy */
    const uint8_t *trainable = in->struct_size >= ZT_ESTIMATE_IN_SIZE_1_3 && in->model ? in->trainable : NULL;
    double t = n;
    if (trainable) {
        t = 0;
        for (int32_t i = 0; i < in->model->n_params_decl; i++)
            if (trainable[i] && !(in->model->params[i].flags & ZT_PARAM_TIED)) t += (double)numel_of(&in->model->params[i]);
    }
    if (in->model) unit_extents(in->model, trainable, &max_touched, &max_touched_t, &largest);
    else max_touched = max_touched_t = largest;
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
        estimate_gpu(s, n, t, k, d, max_touched, max_touched_t, comm, out);
        return ZT_OK;
    }

    /* CPU runs: everything is host memory, fp32 (offload moves nothing); stage 3 keeps the frozen
     * parameters as an fp32 shard beside the trainable master shard. */
    double c = 4.0;
    double master = SHARDED_MASTER ? 4.0 * t / d : 0.0;
    double compute = SHARDED_PARAMS ? c * max_touched + c * (n - t) / d : c * n;
    double grads = STAGE <= 1 ? c * t : 4.0 * t / d + c * max_touched_t;
    double optimizer = 4.0 * k * (SHARDED_MASTER ? t / d : t);
    out->host[ZT_POOL_PARAMS] += compute + master;
    out->host[ZT_POOL_GRADS] += grads;
    out->host[ZT_POOL_OPTIMIZER] += optimizer;
    out->host[ZT_POOL_COMM] += comm;
    return ZT_OK;
}
