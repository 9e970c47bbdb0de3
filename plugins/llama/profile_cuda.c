/* ZT_CUDA_PROFILE=1: the GPU time of every op of the llama units on CUDA (layers_cuda.c), from CUDA
 * events on the compute stream, and the host's side of the same window; docs/cuda.md, "Profile".
 *
 * CUDA events around every op of the units (named by its step, summed over layers), for a window of
 * training micro-batches after a few warm-up ones; the table is printed to stderr when the plugin
 * finishes. The window runs from one training embedding forward to the one `window` micro-batches
 * later, so the GPU time outside the model (the optimizer, the zero plugin, batch copies, waits) is
 * the gap between the end of one embedding backward and the next forward, and whatever no op
 * covers (host launch gaps) is the rest. Events are only created while the window records: off, the
 * cost is one NULL test per op.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama_cuda.h"

#define PROF_OUTSIDE "outside the model (optimizer, zero, batch copies)"

static zt_status prof_cuda_failed(const llama_state *s, cudaError_t e, const char *what)
{
    s->host->error(s->host->ctx, ZT_ERR_DEVICE,
                   "llama: ZT_CUDA_PROFILE: %s failed: %s (%s); unset ZT_CUDA_PROFILE to train without the profile",
                   what, cudaGetErrorString(e), cudaGetErrorName(e));
    return ZT_ERR_DEVICE;
}

zt_status prof_event(const llama_state *s, cudaStream_t stream, cudaEvent_t *ev)
{
    if (s->gpu->prof) s->gpu->prof->host_last = prof_now_ms();
    cudaError_t e = cudaEventCreate(ev);
    if (e != cudaSuccess) {
        *ev = NULL;
        return prof_cuda_failed(s, e, "cudaEventCreate");
    }
    e = cudaEventRecord(*ev, stream);
    return e == cudaSuccess ? ZT_OK : prof_cuda_failed(s, e, "cudaEventRecord");
}

static zt_status prof_begin_named(const llama_state *s, gpu_prof *p, cudaStream_t stream, const char *name)
{
    if (p->n_marks == p->cap) {
        int64_t cap = p->cap ? 2 * p->cap : 4096;
        prof_mark *m = realloc(p->marks, (size_t)cap * sizeof *m);
        if (!m) {
            s->host->error(s->host->ctx, ZT_ERR_OUT_OF_MEMORY, "llama: ZT_CUDA_PROFILE: out of host memory for %lld "
                           "event records; profile fewer micro-batches (ZT_CUDA_PROFILE_STEPS)", (long long)cap);
            return ZT_ERR_OUT_OF_MEMORY;
        }
        p->marks = m;
        p->cap = cap;
    }
    prof_mark *m = &p->marks[p->n_marks++];
    m->name = name;
    m->end = NULL;
    m->host_ms = 0;
    return prof_event(s, stream, &m->begin);
}

zt_status prof_begin(const gpu_run *r, const char *name)
{
    return prof_begin_named(r->call.s, r->prof, r->stream, name);
}

/* The host time of the op begun last (ops do not nest). */
void prof_host_time(const gpu_run *r, double host_t0)
{
    r->prof->marks[r->prof->n_marks - 1].host_ms = prof_now_ms() - host_t0;
}

zt_status prof_end(const gpu_run *r)
{
    return prof_event(r->call.s, r->stream, &r->prof->marks[r->prof->n_marks - 1].end);
}

void prof_destroy_events(gpu_prof *p)
{
    for (int64_t i = 0; i < p->n_marks; i++) {
        if (p->marks[i].begin) cudaEventDestroy(p->marks[i].begin);
        if (p->marks[i].end) cudaEventDestroy(p->marks[i].end);
    }
    p->n_marks = 0;
    cudaEvent_t *evs[] = {&p->window_begin, &p->window_end, &p->model_end};
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) {
        if (*evs[i]) cudaEventDestroy(*evs[i]);
        *evs[i] = NULL;
    }
}

/* Waits for the window's last event (`end`: window_end, or an event of the last op) and sums the
 * op times by name. */
static zt_status prof_resolve(const llama_state *s, gpu_prof *p, cudaEvent_t end)
{
    cudaError_t e = cudaEventSynchronize(end);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, p->window_begin, end);
    p->window_ms = ms;
    p->host_window_ms = p->host_last - p->host_begin;
    p->plans_made = zt_cuda_gemm_plans_made() - p->plans_begin;
    for (int64_t i = 0; i < p->n_marks && e == cudaSuccess; i++) {
        const prof_mark *m = &p->marks[i];
        if (!m->begin || !m->end) continue; /* an op that failed: the run stops anyway */
        e = cudaEventElapsedTime(&ms, m->begin, m->end);
        int k = 0;
        while (k < p->n_ops && strcmp(p->op_name[k], m->name) != 0) k++;
        if (k == PROF_MAX_OPS) k = PROF_MAX_OPS - 1; /* cannot happen with the plugin's fixed step names */
        if (k == p->n_ops) {
            p->op_name[k] = m->name;
            p->n_ops++;
        }
        p->op_calls[k]++;
        p->op_ms[k] += ms;
        p->op_host_ms[k] += m->host_ms;
        if (m->host_ms > p->op_host_max_ms[k]) p->op_host_max_ms[k] = m->host_ms;
    }
    prof_destroy_events(p);
    p->state = 2;
    return e == cudaSuccess ? ZT_OK : prof_cuda_failed(s, e, "reading the event times");
}

/* Called by every embedding forward: a training one starts a micro-batch, which may open or close
 * the window. */
zt_status prof_micro_begin(llama_state *s, cudaStream_t stream, int counted)
{
    gpu_prof *p = s->gpu->prof;
    if (!p || p->state == 2 || !counted) return ZT_OK;
    p->micro++;
    zt_status st = ZT_OK;
    if (p->state == 1 && p->model_end) { /* the gap since the last embedding backward */
        st = prof_begin_named(s, p, stream, PROF_OUTSIDE);
        if (st == ZT_OK) {
            prof_mark *m = &p->marks[p->n_marks - 1];
            cudaEventDestroy(m->begin);
            m->begin = p->model_end;
            p->model_end = NULL;
            st = prof_event(s, stream, &m->end);
        }
    }
    if (st != ZT_OK) return st;
    if (p->state == 0 && p->micro == p->warmup + 1) {
        p->state = 1;
        st = prof_event(s, stream, &p->window_begin);
        p->host_begin = p->host_last;
        p->plans_begin = zt_cuda_gemm_plans_made();
        return st;
    }
    if (p->state == 1 && p->micro == p->warmup + p->window + 1) {
        p->recorded_micro = p->window;
        st = prof_event(s, stream, &p->window_end);
        return st == ZT_OK ? prof_resolve(s, p, p->window_end) : st;
    }
    return ZT_OK;
}

void prof_finish(llama_state *s)
{
    gpu_prof *p = s->gpu->prof;
    int cut_short = p->state == 1;
    if (cut_short) {
        /* The run ended inside the window: it closes at the end of the last timed op (the stream
         * may be gone by now), so the last step's optimizer is not in it. */
        p->recorded_micro = p->micro - p->warmup;
        cudaEvent_t end = p->model_end ? p->model_end : p->n_marks ? p->marks[p->n_marks - 1].end : NULL;
        if (!end) end = p->window_begin;
        if (prof_resolve(s, p, end) != ZT_OK) return;
    }
    if (p->state == 0) {
        fprintf(stderr, "ZT_CUDA_PROFILE: nothing recorded: the run had %lld training micro-batches, not more than "
                "the %lld warm-up ones (set ZT_CUDA_PROFILE_WARMUP lower or train longer)\n",
                (long long)p->micro, (long long)p->warmup);
        return;
    }
    int order[PROF_MAX_OPS];
    double sum = 0;
    for (int k = 0; k < p->n_ops; k++) {
        order[k] = k;
        sum += p->op_ms[k];
    }
    for (int i = 1; i < p->n_ops; i++) /* by total time, largest first */
        for (int j = i; j > 0 && p->op_ms[order[j]] > p->op_ms[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double per = p->recorded_micro > 0 ? (double)p->recorded_micro : 1.0;
    double total = p->window_ms > 0 ? p->window_ms : 1.0;
    fprintf(stderr, "\nZT_CUDA_PROFILE: llama GPU time by op over %lld training micro-batches (after %lld warm-up), "
            "%.3f ms per micro-batch (CUDA events on the compute stream)\n",
            (long long)p->recorded_micro, (long long)p->warmup, p->window_ms / per);
    if (cut_short)
        fprintf(stderr, "(the run ended inside the window: it closes at the last timed op, so the last step's "
                "optimizer is not in it; train longer than ZT_CUDA_PROFILE_WARMUP + ZT_CUDA_PROFILE_STEPS)\n");
    /* host ms/mb: wall clock of the op's launch calls per micro-batch; host max ms: the slowest single
     * call (a stall: a sync, the memory pool growing). An op whose GPU time is below its host time
     * cannot keep the stream fed by itself. */
    fprintf(stderr, "%-56s %8s %12s %14s %7s %11s %12s\n", "op", "calls", "total ms", "ms/micro-batch", "%",
            "host ms/mb", "host max ms");
    double host_ops = 0;
    for (int i = 0; i < p->n_ops; i++) {
        int k = order[i];
        host_ops += p->op_host_ms[k];
        fprintf(stderr, "%-56s %8lld %12.3f %14.3f %6.1f%% %11.3f %12.3f\n", p->op_name[k], (long long)p->op_calls[k],
                p->op_ms[k], p->op_ms[k] / per, 100.0 * p->op_ms[k] / total, p->op_host_ms[k] / per,
                p->op_host_max_ms[k]);
    }
    fprintf(stderr, "%-56s %8s %12.3f %14.3f %6.1f%%\n", "(no op timed: gaps between ops, GPU idle)", "",
            p->window_ms - sum, (p->window_ms - sum) / per, 100.0 * (p->window_ms - sum) / total);
    /* The host's side of the same window. Host busy (wall minus the loss wait) near the GPU window:
     * the host cannot keep the stream fed and the gaps are its overhead. Far below: the gaps come from
     * waits that drain the queue (the loss here, the gradient norm in "elsewhere"). */
    double other = p->unit_ms - host_ops - p->alloc_ms - p->loss_wait_ms;
    char label[96];
    fprintf(stderr, "%-56s %8lld %12.3f %14.3f %6.1f%%\n", "host: in llama's unit calls, of which:",
            (long long)p->unit_calls, p->unit_ms, p->unit_ms / per, 100.0 * p->unit_ms / total);
    fprintf(stderr, "%-56s %8s %12.3f %14.3f %6.1f%%\n", "  issuing the timed ops (attention plugin included)", "",
            host_ops, host_ops / per, 100.0 * host_ops / total);
    snprintf(label, sizeof label, "  host->alloc / free (max %.3f ms per call)", p->alloc_max_ms);
    fprintf(stderr, "%-56s %8lld %12.3f %14.3f %6.1f%%\n", label, (long long)p->alloc_calls, p->alloc_ms,
            p->alloc_ms / per, 100.0 * p->alloc_ms / total);
    fprintf(stderr, "%-56s %8s %12.3f %14.3f %6.1f%%\n", "  blocked reading the loss (one sync per micro-batch)", "",
            p->loss_wait_ms, p->loss_wait_ms / per, 100.0 * p->loss_wait_ms / total);
    fprintf(stderr, "%-56s %8s %12.3f %14.3f %6.1f%%\n", "  the rest (events, bookkeeping)", "", other,
            other / per, 100.0 * other / total);
    fprintf(stderr, "%-56s %8s %12.3f %14.3f %6.1f%%\n", "host: between llama's calls (trainer, zero hooks)", "",
            p->between_ms, p->between_ms / per, 100.0 * p->between_ms / total);
    double outside = p->host_window_ms - p->unit_ms - p->between_ms;
    fprintf(stderr, "%-56s %8s %12.3f %14.3f %6.1f%%\n", "host: step ends (zero step, its norm sync, next batch)", "",
            outside, outside / per, 100.0 * outside / total);
    fprintf(stderr, "%-56s %8s %12.3f %14.3f %6.1f%%\n", "host: wall clock of the window", "", p->host_window_ms,
            p->host_window_ms / per, 100.0 * p->host_window_ms / total);
    /* a heuristic query each on the host; 0 once every shape was seen (the cache holds 64) */
    fprintf(stderr, "%-56s %8llu\n", "cuBLASLt plans made in the window (0 expected)",
            (unsigned long long)p->plans_made);
    fprintf(stderr, "%-56s %8s %12.3f %14.3f %6.1f%%\n\n", "window", "", p->window_ms, p->window_ms / per, 100.0);
}
