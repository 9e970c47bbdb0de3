/* zero0: ZeRO stage 0, i.e. plain data parallelism (DeepSpeed zero_optimization.stage 0).
 *
 * Every rank holds, per unit:
 *   - the full fp32 master buffer, laid out by the host (padded_numel floats). On the CPU the model
 *     computes in fp32, so the views handed to the model ARE the master: nothing to copy or refresh;
 *   - the gradients and optimizer state of the unit's TRAINABLE parameters only, packed in layout
 *     order (frozen parameters get neither, so fine-tuning a few projections of a large model does
 *     not pay 12 bytes per frozen parameter).
 *
 * Gradient reduction. The model divides each micro-batch's loss by the loss-token count of the whole
 * global batch (all micro-batches of all ranks), so the loss of the step is the SUM over ranks and
 * micro-batches of those parts, and so is its gradient: the all-reduce over group "dp" is a SUM.
 * (An AVG would divide by the rank count a second time: DeepSpeed averages because its loss is a
 * per-rank mean.) Micro-batches accumulate into the same buffers (the model's backward adds), and
 * the reduction runs once per step, after the last micro-batch: per unit in grads_ready as soon as
 * its backward is done (zero_optimization.overlap_comm = true) or for all units at the start of
 * step(). A unit whose storage a later unit also uses (the embedding tied to the LM head) is always
 * reduced in grads_ready after every contribution has arrived, because backward runs in reverse.
 *
 * step(): global L2 norm of the trainable gradients (double accumulation, in a fixed order, so it
 * does not depend on the thread count), unscaled by loss_scale; non-finite -> no update, reported
 * as skipped; clipping factor min(1, max_grad_norm / (norm + 1e-6)) (torch's clip_grad_norm_)
 * passed to the optimizer as grad_scale; the optimizer runs once per contiguous range of trainable
 * parameters with the same weight-decay flag.
 *
 * Memory (estimate(), per rank, N parameters, k optimizer states per element, Adam k = 2):
 *   CPU, fp32:          params 4N + grads 4N + optimizer 4kN  = 16 B/param with Adam (host pools)
 *   GPU, bf16/fp16:     params 2N (compute copy) + 4N (fp32 master), grads 2N, optimizer 4kN
 *                       = 16 B/param with Adam (device pools): DeepSpeed's stage-0 figure of
 *                       2 + 2 + 12 bytes per parameter. (zero0 runs on the CPU only for now.)
 * The estimate assumes every parameter is trainable: an upper bound when trainable_params is set.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <zt/zt.h>

#include "cpu/kernels.h"

/* One run of trainable parameters with the same decay flag, contiguous in the master buffer and in
 * the packed gradient and state buffers. */
typedef struct opt_range {
    int32_t unit;
    int32_t decay;
    int64_t master_offset;
    int64_t packed_offset;
    int64_t count;
} opt_range;

typedef struct unit_store {
    float *master;        /* [padded_numel] */
    float *grad;          /* [n_trainable] packed */
    float **state;        /* [n_state] each [n_trainable] packed */
    int64_t n_trainable;
    int32_t reduced;      /* gradients already all-reduced this step */
    int32_t reduce_in_step; /* a later unit writes into this unit's gradients too */
} unit_store;

typedef struct zero0_state {
    const zt_host *host;
    int32_t overlap_comm;
    int64_t bucket_elements;

    /* From setup on. The layout stays valid until fini, but fini must not need it. */
    const zt_layout *layout;
    int32_t n_units;
    const zt_optimizer_ops *opt;
    void *opt_state;
    int32_t n_state;
    zt_group dp;
    unit_store *units;         /* [n_units] */
    int64_t *packed_offset;    /* [n_params] offset in the owner unit's packed buffers; -1 frozen */
    int32_t *storage;          /* [n_params] the parameter whose storage it uses */
    opt_range *ranges;
    int32_t n_ranges;
    const float **norm_tensors; /* [n_units] scratch for the norm */
    int64_t *norm_sizes;
} zero0_state;

static const zt_option zero0_options[] = {
    {.key = "zero_optimization.overlap_comm",
     .type = ZT_OPT_BOOL,
     .default_value = "false",
     .help = "all-reduce each unit's gradients as soon as its backward of the step's last micro-batch "
             "is done, instead of all at once at the optimizer step (DeepSpeed's name)"},
    {.key = "zero_optimization.reduce_bucket_size",
     .type = ZT_OPT_INT,
     .flags = ZT_OPT_HAS_MIN,
     .default_value = "500000000",
     .min = 1,
     .help = "elements per gradient all-reduce call (DeepSpeed's name and unit); larger unit buffers are "
             "reduced in pieces of this size"},
};

/* ---- helpers -------------------------------------------------------------------------------- */

static void *alloc_floats(zero0_state *s, int pool, int64_t n, const char *what, int32_t unit)
{
    if (n == 0) return NULL;
    char tag[96];
    snprintf(tag, sizeof tag, "zero0 unit %d %s", (int)unit, what);
    void *p = s->host->alloc(s->host->ctx, pool, ZT_MEM_HOST, (uint64_t)n * sizeof(float), 0, tag);
    if (p) memset(p, 0, (size_t)n * sizeof(float));
    return p;
}

static int32_t find_param(const zt_model_info *m, const char *name)
{
    for (int32_t i = 0; i < m->n_params_decl; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    return -1;
}

static int64_t numel_of(const zt_param_decl *p)
{
    int64_t n = 1;
    for (int32_t d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static zt_status check_unit(const zero0_state *s, const char *call, int32_t unit)
{
    if (!s->units) {
        s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG, "zero0 %s called before setup", call);
        return ZT_ERR_INVALID_ARG;
    }
    if (unit < 0 || unit >= s->layout->n_units) {
        s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG, "zero0 %s: unit %d is not in [0, %d)", call, (int)unit,
                       (int)s->layout->n_units);
        return ZT_ERR_INVALID_ARG;
    }
    return ZT_OK;
}

/* SUM over "dp" in place, in pieces of at most bucket_elements. */
static zt_status reduce_unit(zero0_state *s, int32_t unit)
{
    unit_store *u = &s->units[unit];
    if (u->reduced) return ZT_OK;
    u->reduced = 1;
    if (s->dp.size <= 1) return ZT_OK;
    for (int64_t at = 0; at < u->n_trainable; at += s->bucket_elements) {
        int64_t n = u->n_trainable - at < s->bucket_elements ? u->n_trainable - at : s->bucket_elements;
        zt_status st = s->host->all_reduce(s->host->ctx, &s->dp, u->grad + at, u->grad + at, (uint64_t)n, ZT_F32,
                                           ZT_REDUCE_SUM, NULL);
        if (st != ZT_OK) return st; /* the host recorded which collective failed */
    }
    return ZT_OK;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static zt_status zero0_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static zt_status zero0_init(const zt_host *host, void **state_out)
{
    zero0_state *s = host->alloc(host->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, sizeof *s, 0, "zero0 state");
    if (!s) return ZT_ERR_OUT_OF_MEMORY;
    memset(s, 0, sizeof *s);
    s->host = host;
    zt_status st = host->cfg_bool(host->ctx, "zero_optimization.overlap_comm", &s->overlap_comm);
    if (st == ZT_OK) st = host->cfg_int(host->ctx, "zero_optimization.reduce_bucket_size", &s->bucket_elements);
    if (st != ZT_OK) {
        host->error(host->ctx, st, "zero0: cannot read its options (status %d): a host bug", (int)st);
        host->free(host->ctx, s);
        return st;
    }
    *state_out = s;
    return ZT_OK;
}

static void zero0_fini(void *opaque)
{
    zero0_state *s = opaque;
    if (!s) return;
    const zt_host *h = s->host;
    if (s->units) {
        for (int32_t u = 0; u < s->n_units; u++) {
            h->free(h->ctx, s->units[u].master);
            h->free(h->ctx, s->units[u].grad);
            for (int32_t k = 0; s->units[u].state && k < s->n_state; k++) h->free(h->ctx, s->units[u].state[k]);
            h->free(h->ctx, s->units[u].state);
        }
    }
    h->free(h->ctx, s->units);
    h->free(h->ctx, s->packed_offset);
    h->free(h->ctx, s->storage);
    h->free(h->ctx, s->ranges);
    h->free(h->ctx, s->norm_tensors);
    h->free(h->ctx, s->norm_sizes);
    h->free(h->ctx, s);
}

/* Packed offsets of trainable parameters, the optimizer ranges, and which units must wait for the
 * step to be reduced. */
static zt_status plan(zero0_state *s)
{
    const zt_layout *l = s->layout;
    const zt_model_info *m = l->model;
    int32_t n_ranges = 0;
    for (int32_t u = 0; u < l->n_units; u++) {
        const zt_unit_layout *ul = &l->units[u];
        int64_t packed = 0;
        int64_t next_master = -1; /* where a range continuing the previous one would start */
        for (int32_t i = ul->first_param; i < ul->first_param + ul->n_params; i++) {
            s->packed_offset[i] = -1;
            if (m->params[i].flags & ZT_PARAM_TIED) continue;
            int64_t n = numel_of(&m->params[i]);
            if (!l->trainable[i]) {
                next_master = -1;
                continue;
            }
            s->packed_offset[i] = packed;
            opt_range *last = n_ranges ? &s->ranges[n_ranges - 1] : NULL;
            if (last && next_master == l->param_offset[i] && last->decay == (int32_t)l->decay[i]) {
                last->count += n;
            } else {
                s->ranges[n_ranges++] = (opt_range){u, l->decay[i], l->param_offset[i], packed, n};
            }
            next_master = l->param_offset[i] + n;
            packed += n;
        }
        s->units[u].n_trainable = packed;
    }
    s->n_ranges = n_ranges;
    for (int32_t i = 0; i < m->n_params_decl; i++) {
        if (!(m->params[i].flags & ZT_PARAM_TIED)) {
            s->storage[i] = i;
            continue;
        }
        int32_t owner = find_param(m, m->params[i].tied_to);
        if (owner < 0) {
            s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG,
                           "zero0 setup: parameter '%s' is tied to '%s', which the model does not declare",
                           m->params[i].name, m->params[i].tied_to);
            return ZT_ERR_INVALID_ARG;
        }
        s->storage[i] = owner;
        s->packed_offset[i] = s->packed_offset[owner];
        /* Backward runs units in reverse: an owner in a later unit would be reduced too early. */
        if (m->params[owner].unit > m->params[i].unit) s->units[m->params[owner].unit].reduce_in_step = 1;
    }
    return ZT_OK;
}

static zt_status zero0_setup(void *opaque, const zt_layout *layout, const zt_optimizer_ops *opt, void *opt_state)
{
    zero0_state *s = opaque;
    const zt_host *h = s->host;
    if (s->units) {
        h->error(h->ctx, ZT_ERR_INVALID_ARG, "zero0 setup called twice");
        return ZT_ERR_INVALID_ARG;
    }
    if (!layout || layout->struct_size < sizeof(zt_layout) || !layout->model || !opt || !opt->step) {
        h->error(h->ctx, ZT_ERR_INVALID_ARG, "zero0 setup: the layout or the optimizer ops are missing or too old");
        return ZT_ERR_INVALID_ARG;
    }
    if (h->device->device_type != ZT_DEVICE_CPU || layout->compute_dtype != ZT_F32) {
        h->error(h->ctx, ZT_ERR_UNSUPPORTED,
                 "zero0 runs on the CPU in fp32 only for now (this run: %s, compute dtype %d); train on the CPU",
                 h->device->device_type == ZT_DEVICE_CUDA ? "CUDA" : "CPU", (int)layout->compute_dtype);
        return ZT_ERR_UNSUPPORTED;
    }
    zt_status st = h->group_get(h->ctx, "dp", &s->dp);
    if (st != ZT_OK) return st; /* the host's message names the missing group */

    const zt_model_info *m = layout->model;
    int32_t n_units = layout->n_units, n_params = m->n_params_decl;
    s->layout = layout;
    s->opt = opt;
    s->opt_state = opt_state;
    s->n_state = opt->n_state ? opt->n_state(opt_state) : 0;
    s->units = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, (uint64_t)n_units * sizeof *s->units, 0, "zero0 units");
    s->packed_offset = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, (uint64_t)n_params * sizeof(int64_t), 0,
                                "zero0 offsets");
    s->storage = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, (uint64_t)n_params * sizeof(int32_t), 0, "zero0 ties");
    s->ranges = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, (uint64_t)n_params * sizeof *s->ranges, 0,
                         "zero0 ranges");
    s->norm_tensors = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, (uint64_t)n_units * sizeof(float *), 0,
                               "zero0 norm");
    s->norm_sizes = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, (uint64_t)n_units * sizeof(int64_t), 0,
                             "zero0 norm");
    if (!s->units || !s->packed_offset || !s->storage || !s->ranges || !s->norm_tensors || !s->norm_sizes)
        return ZT_ERR_OUT_OF_MEMORY;
    memset(s->units, 0, (size_t)n_units * sizeof *s->units);
    s->n_units = n_units;
    st = plan(s);
    if (st != ZT_OK) return st;

    for (int32_t u = 0; u < n_units; u++) {
        unit_store *us = &s->units[u];
        us->master = alloc_floats(s, ZT_POOL_PARAMS, layout->units[u].padded_numel, "fp32 parameters", u);
        us->grad = alloc_floats(s, ZT_POOL_GRADS, us->n_trainable, "gradients", u);
        if ((layout->units[u].padded_numel && !us->master) || (us->n_trainable && !us->grad))
            return ZT_ERR_OUT_OF_MEMORY;
        if (!s->n_state) continue;
        us->state = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, (uint64_t)s->n_state * sizeof(float *), 0,
                             "zero0 state table");
        if (!us->state) return ZT_ERR_OUT_OF_MEMORY;
        memset(us->state, 0, (size_t)s->n_state * sizeof(float *));
        for (int32_t k = 0; k < s->n_state; k++) {
            const char *name = opt->state_name ? opt->state_name(opt_state, k) : NULL;
            us->state[k] = alloc_floats(s, ZT_POOL_OPTIMIZER, us->n_trainable, name ? name : "optimizer state", u);
            if (us->n_trainable && !us->state[k]) return ZT_ERR_OUT_OF_MEMORY;
        }
    }
    return ZT_OK;
}

/* ---- per unit ------------------------------------------------------------------------------- */

static void fill_view(zt_tensor *t, const zt_param_decl *p, float *data)
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = ZT_F32;
    t->device_type = ZT_DEVICE_CPU;
    t->ndim = p->ndim;
    int64_t stride = 1;
    for (int32_t d = p->ndim - 1; d >= 0; d--) {
        t->shape[d] = p->shape[d];
        t->stride[d] = stride;
        stride *= p->shape[d];
    }
}

static zt_status zero0_before_unit(void *opaque, int32_t unit, int32_t phase, zt_tensor *params, zt_tensor *grads)
{
    zero0_state *s = opaque;
    zt_status st = check_unit(s, "before_unit", unit);
    if (st != ZT_OK) return st;
    const zt_layout *l = s->layout;
    const zt_model_info *m = l->model;
    const zt_unit_layout *ul = &l->units[unit];
    for (int32_t k = 0; k < ul->n_params; k++) {
        int32_t i = ul->first_param + k, owner = s->storage[i];
        const zt_param_decl *p = &m->params[i];
        const unit_store *home = &s->units[m->params[owner].unit];
        if (params) fill_view(&params[k], p, home->master + l->param_offset[owner]);
        if (phase == ZT_PHASE_BACKWARD && grads)
            fill_view(&grads[k], p, s->packed_offset[i] >= 0 ? home->grad + s->packed_offset[i] : NULL);
    }
    return ZT_OK;
}

static zt_status zero0_after_unit(void *opaque, int32_t unit, int32_t phase)
{
    (void)phase;
    return check_unit(opaque, "after_unit", unit); /* stage 0 keeps everything resident */
}

static zt_status zero0_grads_ready(void *opaque, int32_t unit, int32_t last_micro)
{
    zero0_state *s = opaque;
    zt_status st = check_unit(s, "grads_ready", unit);
    if (st != ZT_OK || !last_micro || !s->overlap_comm || s->units[unit].reduce_in_step) return st;
    return reduce_unit(s, unit);
}

/* ---- the step ------------------------------------------------------------------------------- */

static zt_status zero0_step(void *opaque, const zt_step_args *a, zt_step_result *r)
{
    zero0_state *s = opaque;
    const zt_host *h = s->host;
    if (!s->units) {
        h->error(h->ctx, ZT_ERR_INVALID_ARG, "zero0 step called before setup");
        return ZT_ERR_INVALID_ARG;
    }
    if (!a || a->struct_size < sizeof(zt_step_args) || !r || r->struct_size < sizeof(zt_step_result) ||
        a->step < 1 || !(a->loss_scale > 0) || !(a->max_grad_norm >= 0)) {
        h->error(h->ctx, ZT_ERR_INVALID_ARG,
                 "zero0 step: the arguments are missing, too old, or out of range (step >= 1, loss_scale > 0, "
                 "max_grad_norm >= 0)");
        return ZT_ERR_INVALID_ARG;
    }
    int32_t n_units = s->layout->n_units;
    for (int32_t u = 0; u < n_units; u++) {
        zt_status st = reduce_unit(s, u);
        if (st != ZT_OK) return st;
    }

    int64_t n_tensors = 0;
    for (int32_t u = 0; u < n_units; u++) {
        if (!s->units[u].n_trainable) continue;
        s->norm_tensors[n_tensors] = s->units[u].grad;
        s->norm_sizes[n_tensors++] = s->units[u].n_trainable;
    }
    zt_cpu_ctx cpu = {.parallel_for = h->parallel_for, .pool = h->ctx};
    double norm = zt_cpu_global_l2_norm(&cpu, n_tensors, s->norm_tensors, s->norm_sizes) / a->loss_scale;
    r->grad_norm = norm;
    r->skipped = !isfinite(norm);
    if (r->skipped) return ZT_OK;

    double clip = 1.0;
    if (a->max_grad_norm > 0) clip = fmin(1.0, a->max_grad_norm / (norm + 1e-6));
    float *state_at[16];
    if (s->n_state > (int32_t)(sizeof state_at / sizeof state_at[0])) {
        h->error(h->ctx, ZT_ERR_UNSUPPORTED, "zero0: the optimizer has %d state arrays per element; at most %d "
                 "are supported", (int)s->n_state, (int)(sizeof state_at / sizeof state_at[0]));
        return ZT_ERR_UNSUPPORTED;
    }
    for (int32_t r = 0; r < s->n_ranges; r++) {
        const opt_range *rg = &s->ranges[r];
        const unit_store *us = &s->units[rg->unit];
        for (int32_t k = 0; k < s->n_state; k++) state_at[k] = us->state[k] + rg->packed_offset;
        zt_optim_hparams hp = {.struct_size = sizeof hp,
                               .step = a->step,
                               .lr = a->lr,
                               .weight_decay = rg->decay ? a->weight_decay : 0.0,
                               .grad_scale = clip / a->loss_scale};
        zt_status st = s->opt->step(s->opt_state, &hp, us->master + rg->master_offset, us->grad + rg->packed_offset,
                                    state_at, (uint64_t)rg->count, ZT_DEVICE_CPU, NULL);
        if (st != ZT_OK) return st; /* the optimizer described its failure */
    }
    return ZT_OK;
}

static zt_status zero0_zero_grad(void *opaque)
{
    zero0_state *s = opaque;
    if (!s->units) {
        s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG, "zero0 zero_grad called before setup");
        return ZT_ERR_INVALID_ARG;
    }
    for (int32_t u = 0; u < s->layout->n_units; u++) {
        unit_store *us = &s->units[u];
        if (us->n_trainable) memset(us->grad, 0, (size_t)us->n_trainable * sizeof(float));
        us->reduced = 0;
    }
    return ZT_OK;
}

/* ---- shards: every rank holds the whole unit ------------------------------------------------ */

static void zero0_shard_range(void *opaque, int32_t unit, int64_t *offset, int64_t *count)
{
    zero0_state *s = opaque;
    *offset = 0;
    *count = s->units && unit >= 0 && unit < s->layout->n_units ? s->layout->units[unit].padded_numel : 0;
}

/* Optimizer state is packed (trainable parameters only); shards are in layout order with zeros for
 * frozen parameters and padding. */
static zt_status copy_shard(zero0_state *s, const char *call, int32_t unit, int32_t which, float *out,
                            const float *in)
{
    zt_status st = check_unit(s, call, unit);
    if (st != ZT_OK) return st;
    if (which < 0 || which > s->n_state || (out == NULL && in == NULL)) {
        s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG,
                       "zero0 %s: array %d is neither the master (0) nor one of the %d optimizer states, or the "
                       "buffer is NULL", call, (int)which, (int)s->n_state);
        return ZT_ERR_INVALID_ARG;
    }
    const zt_layout *l = s->layout;
    unit_store *us = &s->units[unit];
    int64_t padded = l->units[unit].padded_numel;
    if (which == ZT_SHARD_MASTER) {
        if (out) memcpy(out, us->master, (size_t)padded * sizeof(float));
        else memcpy(us->master, in, (size_t)padded * sizeof(float));
        return ZT_OK;
    }
    float *state = us->state[which - 1];
    if (out) memset(out, 0, (size_t)padded * sizeof(float));
    const zt_unit_layout *ul = &l->units[unit];
    for (int32_t i = ul->first_param; i < ul->first_param + ul->n_params; i++) {
        if (s->storage[i] != i || s->packed_offset[i] < 0) continue;
        int64_t n = numel_of(&l->model->params[i]);
        if (out) memcpy(out + l->param_offset[i], state + s->packed_offset[i], (size_t)n * sizeof(float));
        else memcpy(state + s->packed_offset[i], in + l->param_offset[i], (size_t)n * sizeof(float));
    }
    return ZT_OK;
}

static zt_status zero0_read_shard(void *opaque, int32_t unit, int32_t which, float *dst)
{
    return copy_shard(opaque, "read_shard", unit, which, dst, NULL);
}

static zt_status zero0_write_shard(void *opaque, int32_t unit, int32_t which, const float *src)
{
    return copy_shard(opaque, "write_shard", unit, which, NULL, src);
}

/* ---- memory estimate ------------------------------------------------------------------------ */

static zt_status zero0_estimate(void *opaque, const zt_estimate_in *in, zt_mem_estimate *out)
{
    zero0_state *s = opaque;
    if (!in || !out || in->struct_size < sizeof(zt_estimate_in) || out->struct_size < sizeof(zt_mem_estimate)) {
        s->host->error(s->host->ctx, ZT_ERR_INVALID_ARG, "zero0 estimate: the arguments are missing or too old");
        return ZT_ERR_INVALID_ARG;
    }
    double n = (double)in->n_parameters, k = (double)in->n_optimizer_states;
    memset(out->device, 0, sizeof out->device);
    memset(out->host, 0, sizeof out->host);
    if (s->host->device->device_type == ZT_DEVICE_CPU) {
        out->host[ZT_POOL_PARAMS] = 4.0 * n;
        out->host[ZT_POOL_GRADS] = 4.0 * n;
        out->host[ZT_POOL_OPTIMIZER] = 4.0 * k * n;
    } else {
        out->device[ZT_POOL_PARAMS] = (2.0 + 4.0) * n;
        out->device[ZT_POOL_GRADS] = 2.0 * n;
        out->device[ZT_POOL_OPTIMIZER] = 4.0 * k * n;
    }
    return ZT_OK; /* the all-reduce is in place: no communication buckets */
}

static const zt_zero_ops zero0_ops = {
    .struct_size = sizeof(zt_zero_ops),
    .stage = 0,
    .setup = zero0_setup,
    .before_unit = zero0_before_unit,
    .after_unit = zero0_after_unit,
    .grads_ready = zero0_grads_ready,
    .step = zero0_step,
    .zero_grad = zero0_zero_grad,
    .shard_range = zero0_shard_range,
    .read_shard = zero0_read_shard,
    .write_shard = zero0_write_shard,
    .estimate = zero0_estimate,
};

static const zt_plugin zero0_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_ZERO,
    .name = "zero0",
    .version = "1.0.0",
    .description = "ZeRO stage 0: plain data parallelism, full parameters, gradients and optimizer state per rank",
    .options = zero0_options,
    .n_options = sizeof zero0_options / sizeof zero0_options[0],
    .caps = ZT_CAP_CPU | ZT_CAP_MULTI_RANK,
    .probe = zero0_probe,
    .init = zero0_init,
    .fini = zero0_fini,
    .ops = &zero0_ops,
};

ZT_PLUGIN_ENTRY
{
    return &zero0_plugin;
}
