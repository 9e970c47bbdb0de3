/* A pipeline stage's step (trainer_internal.h; docs/parallel.md, "Execution"): the parallel plugin's
 * instruction list for the step's micro-batches, run as it is. Each micro-batch has its own
 * hidden-state buffers and saved slots (slot 0 is the trainer's own), since 1F1B keeps several in
 * flight; activations and gradients cross between neighbouring stages over the "pp" group, and each
 * stage computes only its units (t->grid). Every stage loads the same micro-batches (the loader is
 * sharded over "dp" only), so the first stage has the tokens and the last the targets. */
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "train/trainer_internal.h"

typedef struct tr_pipeline {
    zt_pp_action *actions;
    int32_t n_actions, n_micro;
    void ***hidden;      /* [n_micro][n_units]: slot 0 is t->hidden */
    void ***saved;       /* [n_micro][n_units]: slot 0 is t->saved */
    float **grad_in;     /* [n_micro]: the gradient of this stage's output, received */
    float **grad_out;    /* [n_micro]: the gradient of its input, to send */
    uint64_t count;      /* elements of one micro-batch's hidden states */
} tr_pipeline;

static void *pipe_alloc(trainer *t, uint64_t bytes, const char *tag, zt_error *err)
{
    void *p = zt_runtime_alloc(t->rt, ZT_POOL_ACTIVATIONS, ZT_MEM_HOST, bytes ? bytes : 1, 0, tag, err);
    if (p) memset(p, 0, bytes);
    return p;
}

zt_status tr_pipeline_setup(trainer *t, zt_error *err)
{
    if (t->grid.pp_size <= 1) return ZT_OK;
    const zt_loaded_plugin *lp = &t->req->plugins->by_kind[ZT_KIND_PARALLEL];
    const zt_parallel_ops *ops = lp->plugin->ops;
    zt_status st = t->host->group_get(t->host->ctx, "pp", &t->pp);
    if (st != ZT_OK) return tr_host_failed(t, st, err, "looking up the parallel plugin's group 'pp'");
    tr_pipeline *p = calloc(1, sizeof *p);
    if (!p) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the pipeline");
    t->pipeline = p;
    p->n_micro = (int32_t)t->set->accum;
    int32_t need = 0;
    st = ops->schedule(lp->state, p->n_micro, NULL, 0, &need);
    if (st != ZT_OK && st != ZT_ERR_BUFFER_TOO_SMALL) return zt_plugin_failed(lp, st, err, "schedule");
    p->actions = calloc((size_t)need, sizeof *p->actions);
    if (!p->actions) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the pipeline schedule");
    st = ops->schedule(lp->state, p->n_micro, p->actions, need, &p->n_actions);
    if (st != ZT_OK) return zt_plugin_failed(lp, st, err, "schedule");
    int32_t n_units = t->info->n_units, first = t->grid.first_unit, last = t->grid.last_unit;
    p->count = (uint64_t)t->set->micro_batch * (uint64_t)t->set->seq_len * (uint64_t)t->info->hidden_size;
    uint64_t bytes = p->count * sizeof(float);
    p->hidden = calloc((size_t)p->n_micro, sizeof *p->hidden);
    p->saved = calloc((size_t)p->n_micro, sizeof *p->saved);
    p->grad_in = calloc((size_t)p->n_micro, sizeof *p->grad_in);
    p->grad_out = calloc((size_t)p->n_micro, sizeof *p->grad_out);
    if (!p->hidden || !p->saved || !p->grad_in || !p->grad_out)
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the pipeline's buffers");
    for (int32_t k = 0; k < p->n_micro; k++) {
        p->grad_in[k] = pipe_alloc(t, bytes, "pipeline: received output gradient", err);
        p->grad_out[k] = pipe_alloc(t, bytes, "pipeline: input gradient to send", err);
        if (!p->grad_in[k] || !p->grad_out[k]) return ZT_ERR_OUT_OF_MEMORY;
        if (k == 0) {
            p->hidden[0] = t->hidden;
            p->saved[0] = t->saved;
            continue;
        }
        p->hidden[k] = calloc((size_t)n_units, sizeof **p->hidden);
        p->saved[k] = calloc((size_t)n_units, sizeof **p->saved);
        if (!p->hidden[k] || !p->saved[k]) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
        for (int32_t u = first > 0 ? first - 1 : 0; u <= last && u + 1 < n_units; u++) {
            p->hidden[k][u] = pipe_alloc(t, bytes, "pipeline: a micro-batch's unit output", err);
            if (!p->hidden[k][u]) return ZT_ERR_OUT_OF_MEMORY;
        }
    }
    return ZT_OK;
}

void tr_pipeline_free(trainer *t)
{
    tr_pipeline *p = t->pipeline;
    if (!p) return;
    for (int32_t k = 0; k < p->n_micro; k++) {
        if (p->grad_in) zt_runtime_free(t->rt, p->grad_in[k]);
        if (p->grad_out) zt_runtime_free(t->rt, p->grad_out[k]);
        if (k == 0) continue;
        for (int32_t u = 0; p->hidden && p->hidden[k] && u < t->info->n_units; u++) zt_runtime_free(t->rt, p->hidden[k][u]);
        for (int32_t u = 0; p->saved && p->saved[k] && u < t->info->n_units; u++)
            if (p->saved[k][u]) t->model->release(t->model_lp->state, u, &p->saved[k][u]);
        if (p->hidden) free(p->hidden[k]);
        if (p->saved) free(p->saved[k]);
    }
    free(p->hidden), free(p->saved), free(p->grad_in), free(p->grad_out), free(p->actions);
    free(p);
    t->pipeline = NULL;
}

zt_status tr_pipeline_step(trainer *t, int64_t loss_tokens_global, uint32_t flags, double *loss, double *forward_s,
                           double *backward_s, zt_error *err)
{
    tr_pipeline *p = t->pipeline;
    const zt_host *h = t->host;
    int32_t first = t->grid.first_unit, last = t->grid.last_unit;
    void **own_hidden = t->hidden, **own_saved = t->saved;
    zt_status st = ZT_OK;
    *loss = 0;
    for (int32_t i = 0; i < p->n_actions && st == ZT_OK; i++) {
        const zt_pp_action *a = &p->actions[i];
        int32_t k = a->micro;
        t->hidden = p->hidden[k];
        t->saved = p->saved[k];
        zt_batch b = tr_batch_of(t, &t->micro[k], loss_tokens_global);
        double t0 = zt_now_s();
        float part = 0;
        switch (a->op) {
        case ZT_PP_FORWARD:
            st = tr_forward(t, &b, flags, &part, err);
            *loss += part;
            *forward_s += zt_now_s() - t0;
            break;
        case ZT_PP_BACKWARD:
            if (last + 1 < t->info->n_units) memcpy(t->dx[0], p->grad_in[k], p->count * sizeof(float));
            st = tr_backward(t, &b, k == p->n_micro - 1, err);
            if (st == ZT_OK && first > 0) memcpy(p->grad_out[k], t->dx[t->dx_bottom], p->count * sizeof(float));
            *backward_s += zt_now_s() - t0;
            break;
        case ZT_PP_SEND_ACTIVATION:
            st = h->send(h->ctx, &t->pp, t->hidden[last], p->count, ZT_F32, a->peer, NULL);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "sending a micro-batch's activations over 'pp'");
            break;
        case ZT_PP_RECV_ACTIVATION:
            st = h->recv(h->ctx, &t->pp, t->hidden[first - 1], p->count, ZT_F32, a->peer, NULL);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "receiving a micro-batch's activations over 'pp'");
            break;
        case ZT_PP_SEND_GRADIENT:
            st = h->send(h->ctx, &t->pp, p->grad_out[k], p->count, ZT_F32, a->peer, NULL);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "sending a micro-batch's gradients over 'pp'");
            break;
        case ZT_PP_RECV_GRADIENT:
            st = h->recv(h->ctx, &t->pp, p->grad_in[k], p->count, ZT_F32, a->peer, NULL);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "receiving a micro-batch's gradients over 'pp'");
            break;
        default:
            st = zt_error_set(err, ZT_ERR_INTERNAL, "the pipeline schedule has an unknown instruction %d", (int)a->op);
        }
    }
    t->hidden = own_hidden;
    t->saved = own_saved;
    return st;
}

/* ---- sharing the trained weights ---------------------------------------------------------------- */

typedef struct share_ctx {
    float *full;              /* one whole unit */
    int32_t unit;             /* whose weights are in full; -1 none */
    int32_t *first, *last;    /* [pp]: each stage's units */
} share_ctx;

/* tr_load_master's source: unit u gathered over "dp" on every stage and broadcast over "pp" from the
 * stage that trained it (every rank asks for the units in the same order). */
static zt_status share_source(trainer *t, void *opaque, int32_t unit, int64_t offset, int64_t count, float *dst,
                              zt_error *err)
{
    share_ctx *c = opaque;
    if (c->unit != unit) {
        int32_t owner = 0;
        while (owner + 1 < t->grid.pp_size && unit > c->last[owner]) owner++;
        zt_status st = tr_gather_master(t, unit, c->full, err);
        if (st != ZT_OK) return st;
        st = t->host->broadcast(t->host->ctx, &t->pp, c->full, (uint64_t)t->layout->units[unit].padded_numel, ZT_F32,
                                owner, NULL);
        if (st != ZT_OK) return tr_host_failed(t, st, err, "sharing a unit's trained weights (broadcast over 'pp')");
        c->unit = unit;
    }
    memcpy(dst, c->full + offset, (size_t)count * sizeof(float));
    return ZT_OK;
}

zt_status tr_pipeline_share_weights(trainer *t, zt_error *err)
{
    int32_t p = t->grid.pp_size, mine[2] = {t->grid.first_unit, t->grid.last_unit};
    share_ctx c = {.unit = -1};
    int32_t *units = malloc((size_t)p * 2 * sizeof *units);
    c.full = malloc((size_t)t->layout->largest_unit_numel * sizeof(float));
    if (!units || !c.full) {
        free(units), free(c.full);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory sharing the pipeline's weights");
    }
    zt_status st = t->host->all_gather(t->host->ctx, &t->pp, mine, units, 2, ZT_I32, NULL);
    if (st != ZT_OK) st = tr_host_failed(t, st, err, "sharing the stages' units (all-gather over 'pp')");
    c.first = malloc((size_t)p * sizeof *c.first);
    c.last = malloc((size_t)p * sizeof *c.last);
    for (int32_t s = 0; st == ZT_OK && c.first && c.last && s < p; s++) c.first[s] = units[2 * s], c.last[s] = units[2 * s + 1];
    if (st == ZT_OK && (!c.first || !c.last)) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == ZT_OK) st = tr_load_master(t, share_source, &c, err);
    tr_drop_shard_buffer(t);
    free(units), free(c.full), free(c.first), free(c.last);
    return st;
}
