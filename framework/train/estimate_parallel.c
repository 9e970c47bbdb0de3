/* The memory estimate of a tensor x pipeline layout (estimate.h, zt_estimate_parallel; docs/parallel.md,
 * "Memory"): per pipeline stage, the pools of one of its ranks. The parallel plugin's plan() says which
 * units the stage runs; the rank's view of the model keeps those units' parameters, each split along
 * its tp_split_dim into tp parts (rounded up, as the padded vocabulary is), and the zero plugin
 * estimates that view over the data-parallel ranks. Activations: 1F1B keeps min(p - i, m) micro-batches
 * in flight on stage i, each with its layers' saved activations (and the LM head's on the last stage,
 * its logits split over tp), plus the hidden-state buffers of the trainer's slots (one more than in
 * flight after the first stage: the next input arrives early) and two gradient buffers; GPU workspace: one unsplit
 * layer's scratch (an upper bound under tensor parallelism). KV heads replicated over more tensor
 * ranks than heads are counted at 1/tp, as if split. Sequence parallelism (use_seq_parallel, CPU
 * ranks) keeps each layer's two norms and residual ([hidden] and a 1/rms each, per token) and the
 * head's norm on tokens / tp rows: their other (tp - 1) / tp leave every saved layer and the head. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/estimate.h"

static int64_t decl_numel(const zt_param_decl *p)
{
    int64_t n = 1;
    for (int32_t d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

/* The rank's view: params outside [first, last] hold nothing, split ones 1/tp (rounded up). */
static void rank_view(const zt_model_info *m, const zt_rank_grid *g, zt_param_decl *decls, zt_model_info *view)
{
    *view = *m;
    view->params = decls;
    view->n_parameters = 0;
    for (int32_t i = 0; i < m->n_params_decl; i++) {
        zt_param_decl *p = &decls[i];
        *p = m->params[i];
        if (p->unit < g->first_unit || p->unit > g->last_unit) {
            p->shape[0] = 0;
        } else if (p->tp_split_dim >= 0 && p->tp_split_dim < p->ndim && g->tp_size > 1) {
            int64_t *s = &p->shape[p->tp_split_dim];
            *s = (*s + g->tp_size - 1) / g->tp_size;
        }
        if (!(p->flags & ZT_PARAM_TIED)) view->n_parameters += decl_numel(p);
    }
}

zt_status zt_estimate_parallel(const zt_dry_run_request *req, const zt_estimate_in *base, const zt_model_info *m,
                               int gpu, zt_parallel_estimate *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    const zt_loaded_plugin *par = &req->plugins->by_kind[ZT_KIND_PARALLEL];
    const zt_loaded_plugin *zero = &req->plugins->by_kind[ZT_KIND_ZERO];
    if (!par->plugin) return ZT_OK;
    const zt_parallel_ops *ops = par->plugin->ops;
    if (!par->initialized || ops->struct_size < ZT_PARALLEL_OPS_SIZE_1_4 || !ops->plan) {
        out->problem = 1;
        snprintf(out->why, sizeof out->why, "parallel plugin '%.64s' %s, so the estimate above is for a rank that "
                 "holds the whole model", par->desc.name,
                 par->initialized ? "has no plan() (ABI 1.4)" : "was not initialized");
        return ZT_OK;
    }
    const zt_host_settings *s = req->settings;
    int32_t tp = (int32_t)s->model_parallel, pp = (int32_t)s->pipeline_stage;
    int32_t world = req->dp_size * tp * pp;
    zt_param_decl *decls = malloc((size_t)m->n_params_decl * sizeof *decls);
    out->stages = calloc((size_t)pp, sizeof *out->stages);
    if (!decls || !out->stages) {
        free(decls);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory estimating the parallel layout");
    }
    out->n_micro = base->dp_size > 0 ? (int32_t)s->accum : 1;
    out->dp = req->dp_size;
    out->tp = tp;
    out->pp = pp;
    out->world = world;
    out->bubble = pp > 1 ? (double)(pp - 1) / (double)(out->n_micro + pp - 1) : 0.0;
    double eb = gpu ? 2.0 : 4.0, hidden = eb * m->hidden_size, tokens = (double)base->micro_batch * base->seq_len;
    zt_status st = ZT_OK;
    for (int32_t stage = 0; stage < pp && st == ZT_OK; stage++) {
        zt_parallel_stage_estimate *e = &out->stages[out->n_stages];
        zt_rank_grid g = {.struct_size = sizeof g};
        st = ops->plan(par->state, m, world, stage * req->dp_size * tp, &g);
        if (st != ZT_OK) {
            zt_status reported;
            const char *msg = zt_runtime_take_error(par->host, &reported);
            st = zt_error_set(err, st, "parallel plugin '%s': %s", par->desc.name, msg[0] ? msg : zt_status_name(st));
            break;
        }
        zt_model_info view;
        rank_view(m, &g, decls, &view);
        zt_estimate_in in = *base;
        in.model = &view;
        in.n_parameters = view.n_parameters;
        in.largest_unit_numel = 0;
        for (int32_t u = g.first_unit; u <= g.last_unit; u++) {
            int64_t n = 0;
            for (int32_t i = 0; i < view.n_params_decl; i++)
                if (decls[i].unit == u && !(decls[i].flags & ZT_PARAM_TIED)) n += decl_numel(&decls[i]);
            if (n > in.largest_unit_numel) in.largest_unit_numel = n;
        }
        e->stage = stage;
        e->first_unit = g.first_unit;
        e->last_unit = g.last_unit;
        e->layers = (g.last_unit < m->n_layers ? g.last_unit : m->n_layers) - (g.first_unit > 1 ? g.first_unit : 1) + 1;
        e->in_flight = pp - stage < out->n_micro ? pp - stage : out->n_micro;
        e->n_parameters = view.n_parameters;
        /* one micro-batch's activations on this stage, as zt_estimate_activations counts a whole model's */
        int last = g.last_unit == m->n_units - 1;
        double head = !last ? 0 : gpu ? hidden + 4.0 : eb * (ceil((double)m->vocab_size / tp) + m->hidden_size + 1);
        /* Sequence parallelism (CPU ranks) keeps each layer's norms, 1/rms and residual (and the head's
         * norm) on N / tp rows. */
        double sp_share = s->seq_parallel && tp > 1 && !gpu ? 1.0 - 1.0 / tp : 0.0;
        double layer = m->act_bytes_per_token_layer - sp_share * eb * (3.0 * m->hidden_size + 2.0);
        if (last) head -= sp_share * eb * (m->hidden_size + 1.0);
        /* what the trainer allocates (train/pipeline.c): per micro-batch in flight its layers' saved
         * activations (each layer's output counted in the slot below); per slot its input and its
         * layers' outputs, and the gradients it receives and sends; the two hidden-state gradients
         * once. A stage after the first also has a slot for the next micro-batch's activations, which
         * arrive before its backward frees one (the list's transfer order). */
        int32_t slots = e->in_flight + (stage > 0 && e->in_flight < out->n_micro);
        double recomputed = layer - hidden;
        double saved = base->recompute ? 0 : e->layers * recomputed + head;
        double slot = hidden * (e->layers + 1 + (stage > 0) + (stage + 1 < pp));
        double once = 2.0 * hidden + (base->recompute ? (recomputed > head ? recomputed : head) : 0);
        e->activations = tokens * (e->in_flight * saved + slots * slot + once);
        e->mem.struct_size = sizeof e->mem;
        const zt_zero_ops *zo = zero->plugin->ops;
        st = zo->estimate ? zo->estimate(zero->state, &in, &e->mem) : ZT_ERR_UNSUPPORTED;
        if (st != ZT_OK) {
            zt_status reported;
            const char *msg = zt_runtime_take_error(zero->host, &reported);
            st = zt_error_set(err, st, "zero plugin '%s' cannot estimate stage %d's memory: %s", zero->desc.name,
                              (int)stage, msg[0] ? msg : zt_status_name(st));
            break;
        }
        (gpu ? e->mem.device : e->mem.host)[ZT_POOL_ACTIVATIONS] += e->activations;
        /* the scratch of one whole (unsplit) layer: an upper bound for a tensor-parallel rank's */
        if (gpu) e->mem.device[ZT_POOL_WORKSPACE] += zt_estimate_workspace(m, (int64_t)tokens, gpu);
        out->n_stages++;
    }
    free(decls);
    return st;
}

void zt_parallel_estimate_free(zt_parallel_estimate *e)
{
    free(e->stages);
    e->stages = NULL;
    e->n_stages = 0;
}
