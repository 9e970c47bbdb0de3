/* A pipeline stage's step (trainer_internal.h; docs/parallel.md, "Execution"): the parallel plugin's
 * instruction list for the step's micro-batches, run as it is. A micro-batch in flight has its own
 * hidden-state buffers and saved slots, since 1F1B keeps several in flight (p - i on stage i): each
 * micro-batch takes a free slot at its first instruction and frees it after its last, so a stage holds
 * as many slots as its list keeps micro-batches live (slot 0 is the trainer's own). Activations and
 * gradients cross between neighbouring stages over the "pp" group, and each stage computes and stores
 * only its units (t->grid). Every stage loads the same micro-batches (the loader is sharded over "dp"
 * only), so the first stage has the tokens and the last the targets. On GPU ranks the buffers are
 * device memory in the compute type, like the trainer's own hidden states, and the transfers run on
 * the compute stream after the unit calls that produce them (the host collectives order them there).
 *
 * Every step each rank appends its instructions' times to OUTPUT_DIR/pipeline.rank<R>.jsonl: one line
 * {"step":N,"stage":S,"stages":P,"micro_batches":M,"list_s":T,"compute_s":C,"idle_share":1-C/T,
 * "actions":[["F",micro,start_s,end_s],...]} (F forward, B backward, SA/RA send/receive activations,
 * SG/RG gradients), so the measured bubble (the stage's idle share of its list) can be read against
 * (p-1)/(m+p-1) (bench/parallel). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "train/trainer_internal.h"

typedef struct tr_pipeline {
    zt_pp_action *actions;
    int32_t n_actions, n_micro, n_slots;
    int32_t *slot;       /* [n_actions]: the slot of each instruction's micro-batch */
    void ***hidden;      /* [n_slots][n_units]: slot 0 is t->hidden */
    void ***saved;       /* [n_slots][n_units]: slot 0 is t->saved */
    void **grad_in;      /* [n_slots]: the gradient of this stage's output, received */
    void **grad_out;     /* [n_slots]: the gradient of its input, to send */
    uint64_t count;      /* elements of one micro-batch's hidden states */
    int32_t dtype;       /* theirs: F32 on the CPU, the 16-bit compute type on a GPU */
    uint64_t bytes;      /* count elements of dtype */
    double *times;       /* [n_actions][2]: each instruction's start and end in the step, seconds */
    FILE *timing;        /* OUTPUT_DIR/pipeline.rank<R>.jsonl, opened at the first step */
    int timing_opened;
} tr_pipeline;

/* Slots for the list's micro-batches: the lowest free one at a micro-batch's first instruction, freed
 * after its last. */
static zt_status assign_slots(tr_pipeline *p, zt_error *err)
{
    int32_t *last = malloc((size_t)p->n_micro * sizeof *last), *of = malloc((size_t)p->n_micro * sizeof *of);
    uint8_t *busy = calloc((size_t)p->n_micro, 1);
    p->slot = calloc((size_t)(p->n_actions > 0 ? p->n_actions : 1), sizeof *p->slot);
    zt_status st = last && of && busy && p->slot ? ZT_OK : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    for (int32_t k = 0; st == ZT_OK && k < p->n_micro; k++) last[k] = -1, of[k] = -1;
    for (int32_t i = 0; st == ZT_OK && i < p->n_actions; i++) {
        int32_t k = p->actions[i].micro;
        if (k < 0 || k >= p->n_micro)
            return zt_error_set(err, ZT_ERR_INTERNAL, "the pipeline schedule names micro-batch %d of %d", (int)k,
                                (int)p->n_micro);
        last[k] = i;
    }
    for (int32_t i = 0; st == ZT_OK && i < p->n_actions; i++) {
        int32_t k = p->actions[i].micro;
        if (of[k] < 0) {
            int32_t s = 0;
            while (busy[s]) s++;
            busy[s] = 1, of[k] = s;
            if (s + 1 > p->n_slots) p->n_slots = s + 1;
        }
        p->slot[i] = of[k];
        if (last[k] == i) busy[of[k]] = 0;
    }
    if (p->n_slots < 1) p->n_slots = 1;
    free(last), free(of), free(busy);
    return st;
}

/* A zeroed buffer where the trainer keeps hidden states (host memory, or the GPU's). */
static void *pipe_alloc(trainer *t, uint64_t bytes, const char *tag, zt_error *err)
{
    void *p = zt_runtime_alloc(t->rt, ZT_POOL_ACTIVATIONS, t->on_gpu ? ZT_MEM_DEVICE : ZT_MEM_HOST, bytes ? bytes : 1,
                               0, tag, err);
    if (!p || !bytes) return p;
    if (!t->on_gpu) return memset(p, 0, bytes);
    void *zeros = calloc(1, bytes);
    zt_status st = zeros ? zt_runtime_memcpy(t->rt, p, zeros, bytes, err)
                         : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory clearing %s", tag);
    free(zeros);
    if (st == ZT_OK) return p;
    zt_runtime_free(t->rt, p);
    return NULL;
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
    if ((st = assign_slots(p, err)) != ZT_OK) return st;
    p->times = calloc((size_t)(p->n_actions > 0 ? p->n_actions : 1) * 2, sizeof *p->times);
    if (!p->times) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the pipeline's timings");
    int32_t n_units = t->info->n_units, first = t->grid.first_unit, last = t->grid.last_unit, n = p->n_slots;
    p->count = (uint64_t)t->set->micro_batch * (uint64_t)t->set->seq_len * (uint64_t)t->info->hidden_size;
    p->dtype = t->on_gpu ? t->compute16 : ZT_F32;
    p->bytes = p->count * (t->on_gpu ? 2u : sizeof(float));
    uint64_t bytes = p->bytes;
    p->hidden = calloc((size_t)n, sizeof *p->hidden);
    p->saved = calloc((size_t)n, sizeof *p->saved);
    p->grad_in = calloc((size_t)n, sizeof *p->grad_in);
    p->grad_out = calloc((size_t)n, sizeof *p->grad_out);
    if (!p->hidden || !p->saved || !p->grad_in || !p->grad_out)
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the pipeline's buffers");
    for (int32_t k = 0; k < n; k++) {
        /* the first stage sends no input gradient, the last receives no output gradient */
        if (last + 1 < n_units) p->grad_in[k] = pipe_alloc(t, bytes, "pipeline: received output gradient", err);
        if (first > 0) p->grad_out[k] = pipe_alloc(t, bytes, "pipeline: input gradient to send", err);
        if ((last + 1 < n_units && !p->grad_in[k]) || (first > 0 && !p->grad_out[k])) return ZT_ERR_OUT_OF_MEMORY;
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
    zt_log(ZT_LOG_INFO, "pipeline stage %d of %d: units %d..%d, %d of %d micro-batches in flight", (int)t->grid.pp_rank,
           (int)t->grid.pp_size, (int)first, (int)last, (int)n, (int)p->n_micro);
    return ZT_OK;
}

void tr_pipeline_free(trainer *t)
{
    tr_pipeline *p = t->pipeline;
    if (!p) return;
    for (int32_t k = 0; k < p->n_slots; k++) {
        if (p->grad_in) zt_runtime_free(t->rt, p->grad_in[k]);
        if (p->grad_out) zt_runtime_free(t->rt, p->grad_out[k]);
        if (k == 0) continue;
        for (int32_t u = 0; p->hidden && p->hidden[k] && u < t->info->n_units; u++) zt_runtime_free(t->rt, p->hidden[k][u]);
        for (int32_t u = 0; p->saved && p->saved[k] && u < t->info->n_units; u++)
            if (p->saved[k][u]) t->model->release(t->model_lp->state, u, &p->saved[k][u]);
        if (p->hidden) free(p->hidden[k]);
        if (p->saved) free(p->saved[k]);
    }
    free(p->hidden), free(p->saved), free(p->grad_in), free(p->grad_out), free(p->actions), free(p->slot), free(p->times);
    if (p->timing) fclose(p->timing);
    free(p);
    t->pipeline = NULL;
}

/* The step's line of OUTPUT_DIR/pipeline.rank<R>.jsonl (above). A file that cannot be written costs
 * the measurement only, with a warning, never the run. */
static void write_timing(trainer *t, tr_pipeline *p, double list_s)
{
    static const char *const names[] = {[ZT_PP_FORWARD] = "F", [ZT_PP_BACKWARD] = "B",
                                        [ZT_PP_SEND_ACTIVATION] = "SA", [ZT_PP_RECV_ACTIVATION] = "RA",
                                        [ZT_PP_SEND_GRADIENT] = "SG", [ZT_PP_RECV_GRADIENT] = "RG"};
    if (!p->timing) {
        char path[4200];
        snprintf(path, sizeof path, "%s/pipeline.rank%d.jsonl", t->set->output_dir, (int)t->host->world_rank);
        p->timing = fopen(path, p->timing_opened ? "a" : "w");
        if (!p->timing) {
            if (!p->timing_opened) zt_log(ZT_LOG_WARN, "cannot write the pipeline's timings to %s", path);
            p->timing_opened = 1;
            return;
        }
        p->timing_opened = 1;
    }
    double compute = 0;
    for (int32_t i = 0; i < p->n_actions; i++)
        if (p->actions[i].op == ZT_PP_FORWARD || p->actions[i].op == ZT_PP_BACKWARD)
            compute += p->times[2 * i + 1] - p->times[2 * i];
    fprintf(p->timing, "{\"step\":%lld,\"stage\":%d,\"stages\":%d,\"micro_batches\":%d,\"list_s\":%.9g,"
            "\"compute_s\":%.9g,\"idle_share\":%.9g,\"actions\":[", (long long)t->step + 1, (int)t->grid.pp_rank,
            (int)t->grid.pp_size, (int)p->n_micro, list_s, compute, list_s > 0 ? 1.0 - compute / list_s : 0.0);
    for (int32_t i = 0; i < p->n_actions; i++) {
        int op = (int)p->actions[i].op;
        fprintf(p->timing, "%s[\"%s\",%d,%.9g,%.9g]", i ? "," : "",
                op >= 0 && op < (int)(sizeof names / sizeof names[0]) && names[op] ? names[op] : "?",
                (int)p->actions[i].micro, p->times[2 * i], p->times[2 * i + 1]);
    }
    fputs("]}\n", p->timing);
    fflush(p->timing);
}

zt_status tr_pipeline_step(trainer *t, int64_t loss_tokens_global, uint32_t flags, double *loss, double *forward_s,
                           double *backward_s, zt_error *err)
{
    tr_pipeline *p = t->pipeline;
    const zt_host *h = t->host;
    int32_t first = t->grid.first_unit, last = t->grid.last_unit;
    void **own_hidden = t->hidden, **own_saved = t->saved;
    zt_status st = ZT_OK;
    /* transfers on the compute stream, after the units that write what they send and before those
     * that read what they receive (NULL would mean the comm stream, ordered with neither) */
    void *stream = h->device->compute_stream;
    double begin = zt_now_s();
    *loss = 0;
    for (int32_t i = 0; i < p->n_actions && st == ZT_OK; i++) {
        const zt_pp_action *a = &p->actions[i];
        int32_t k = a->micro, slot = p->slot[i];
        t->hidden = p->hidden[slot];
        t->saved = p->saved[slot];
        zt_batch b = tr_batch_of(t, &t->micro[k], loss_tokens_global);
        double t0 = zt_now_s();
        float part = 0;
        switch (a->op) {
        case ZT_PP_FORWARD:
            st = tr_upload_batch(t, &b, err);
            if (st == ZT_OK) st = tr_forward(t, &b, flags, &part, err);
            *loss += part;
            *forward_s += zt_now_s() - t0;
            break;
        case ZT_PP_BACKWARD:
            if (last + 1 < t->info->n_units) st = zt_runtime_memcpy(t->rt, t->dx[0], p->grad_in[slot], p->bytes, err);
            if (st == ZT_OK) st = tr_upload_batch(t, &b, err);
            if (st == ZT_OK) st = tr_backward(t, &b, k == p->n_micro - 1, err);
            if (st == ZT_OK && first > 0)
                st = zt_runtime_memcpy(t->rt, p->grad_out[slot], t->dx[t->dx_bottom], p->bytes, err);
            *backward_s += zt_now_s() - t0;
            break;
        case ZT_PP_SEND_ACTIVATION:
            st = h->send(h->ctx, &t->pp, t->hidden[last], p->count, p->dtype, a->peer, stream);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "sending a micro-batch's activations over 'pp'");
            break;
        case ZT_PP_RECV_ACTIVATION:
            st = h->recv(h->ctx, &t->pp, t->hidden[first - 1], p->count, p->dtype, a->peer, stream);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "receiving a micro-batch's activations over 'pp'");
            break;
        case ZT_PP_SEND_GRADIENT:
            st = h->send(h->ctx, &t->pp, p->grad_out[slot], p->count, p->dtype, a->peer, stream);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "sending a micro-batch's gradients over 'pp'");
            break;
        case ZT_PP_RECV_GRADIENT:
            st = h->recv(h->ctx, &t->pp, p->grad_in[slot], p->count, p->dtype, a->peer, stream);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "receiving a micro-batch's gradients over 'pp'");
            break;
        default:
            st = zt_error_set(err, ZT_ERR_INTERNAL, "the pipeline schedule has an unknown instruction %d", (int)a->op);
        }
        p->times[2 * i] = t0 - begin;
        p->times[2 * i + 1] = zt_now_s() - begin;
    }
    t->hidden = own_hidden;
    t->saved = own_saved;
    if (st == ZT_OK) write_timing(t, p, zt_now_s() - begin);
    return st;
}

/* ---- sharing the trained weights ---------------------------------------------------------------- */

/* Unit by unit (every rank in the same order): the owning stage gathers it over "dp" and broadcasts it
 * over "pp"; the first stage keeps it for the export. The other stages hold only their own units. */
zt_status tr_pipeline_share_weights(trainer *t, zt_error *err)
{
    const zt_host_layout *whole = t->whole_layout;
    int32_t p = t->grid.pp_size, n_units = t->info->n_units, mine[2] = {t->grid.first_unit, t->grid.last_unit};
    int32_t *units = malloc((size_t)p * 2 * sizeof *units);
    float *scratch = malloc((size_t)whole->largest_unit_numel * sizeof(float));
    float **kept = t->grid.pp_rank == 0 ? calloc((size_t)n_units, sizeof *kept) : NULL;
    zt_status st = units && scratch && (kept || t->grid.pp_rank != 0)
                       ? ZT_OK : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory sharing the pipeline's weights");
    if (st == ZT_OK && (st = t->host->all_gather(t->host->ctx, &t->pp, mine, units, 2, ZT_I32, NULL)) != ZT_OK)
        st = tr_host_failed(t, st, err, "sharing the stages' units (all-gather over 'pp')");
    for (int32_t u = 0, owner = 0; st == ZT_OK && u < n_units; u++) {
        while (owner + 1 < p && u > units[2 * owner + 1]) owner++;
        uint64_t count = (uint64_t)whole->units[u].padded_numel;
        float *buf = scratch;
        if (kept && !(buf = kept[u] = malloc((size_t)(count ? count : 1) * sizeof(float))))
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory keeping unit %d for the export", (int)u);
        if (st == ZT_OK && owner == t->grid.pp_rank) st = tr_gather_master(t, u, buf, err);
        if (st == ZT_OK && count && (st = t->host->broadcast(t->host->ctx, &t->pp, buf, count, ZT_F32, owner, NULL)) != ZT_OK)
            st = tr_host_failed(t, st, err, "sharing a unit's trained weights (broadcast over 'pp')");
    }
    free(units), free(scratch);
    t->export_units = kept;
    if (kept) { /* the first stage exports through the whole model's layout */
        zt_host_layout *own = t->layout;
        t->layout = t->whole_layout;
        t->whole_layout = own;
    }
    return st;
}

void tr_pipeline_export_done(trainer *t)
{
    if (!t->export_units) return;
    for (int32_t u = 0; u < t->info->n_units; u++) free(t->export_units[u]);
    free(t->export_units);
    t->export_units = NULL;
    zt_host_layout *whole = t->layout;
    t->layout = t->whole_layout;
    t->whole_layout = whole;
}
