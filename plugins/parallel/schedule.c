/* The pipeline schedule as an instruction list (layout.h; docs/parallel.md, "Schedule").
 *
 * Compute order: 1F1B. Stage s of p first runs p-1-s forwards (warm-up), then alternates one forward
 * and one backward, then drains the backwards; so it holds at most p-s micro-batches' activations.
 * With v virtual stages (model chunks; chunk c of stage s is model stage c*p+s) the order is
 * Megatron's interleaved one: forwards go through the chunks in groups of p micro-batches, the
 * warm-up is 2(p-1-s) + (v-1)p, and backwards run the chunks in reverse.
 *
 * Transfers: every stage's compute order is first run on a common clock with unit cost per chunk
 * (a transfer's data is ready when its producer ends). Each transfer is then keyed by that time and
 * the sending stage, and every stage lists its computes (by start time) and its transfers (by key)
 * in key order, transfers first on a tie. The transfers of every stage then appear in one global
 * order, so the earliest pending transfer always has both ends at it: blocking (rendezvous) sends
 * and receives cannot deadlock, and with equal costs no stage waits longer than the 1F1B timeline
 * says, so the bubble is (p-1) / (v m + p-1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"

double pp_bubble_fraction(int32_t pp, int32_t n_micro, int32_t virtual_stages)
{
    if (pp <= 1 || n_micro < 1) return 0.0;
    double v = virtual_stages < 1 ? 1.0 : (double)virtual_stages;
    return (double)(pp - 1) / (v * (double)n_micro + (double)(pp - 1));
}

int pp_schedule_check(int32_t pp, int32_t virtual_stages, int32_t n_micro, char *why, size_t cap)
{
    if (n_micro < 1) {
        snprintf(why, cap, "the pipeline needs at least 1 micro-batch per step (micro_batch_num is %d)", (int)n_micro);
        return -1;
    }
    if (virtual_stages > 1 && pp < 2) {
        snprintf(why, cap, "parallel.virtual_stages is %d, but interleaving needs a pipeline "
                 "(parallel_config.pipeline_stage above 1); set parallel.virtual_stages to 1", (int)virtual_stages);
        return -1;
    }
    if (virtual_stages > 1 && n_micro % pp) {
        snprintf(why, cap, "the interleaved schedule (parallel.virtual_stages = %d) needs micro_batch_num to be a "
                 "multiple of pipeline_stage = %d, but it is %d: use %d or %d, or set parallel.virtual_stages to 1",
                 (int)virtual_stages, (int)pp, (int)n_micro, (int)(n_micro / pp * pp > 0 ? n_micro / pp * pp : pp),
                 (int)((n_micro / pp + 1) * pp));
        return -1;
    }
    return 0;
}

typedef struct compute_op {
    int32_t backward, micro, chunk;
} compute_op;

/* The i-th forward (or backward) of a stage: its micro-batch and chunk. */
static void nth_op(int32_t p, int32_t v, int32_t i, int32_t backward, compute_op *op)
{
    int32_t group = i / (p * v), in_group = i % (p * v);
    op->backward = backward;
    op->micro = v == 1 ? i : group * p + in_group % p;
    op->chunk = v == 1 ? 0 : (backward ? v - 1 - in_group / p : in_group / p);
}

/* The compute order of `stage` (2 m v ops). */
static void compute_order(int32_t p, int32_t v, int32_t stage, int32_t m, compute_op *ops)
{
    int32_t total = m * v, n = 0, warm;
    if (v == 1) {
        warm = p - 1 - stage < m ? p - 1 - stage : m;
    } else {
        warm = 2 * (p - 1 - stage) + (v - 1) * p;
        if (warm > total) warm = total;
    }
    int32_t f = 0, b = 0;
    for (; f < warm; f++) nth_op(p, v, f, 0, &ops[n++]);
    while (b < total) {
        if (f < total) nth_op(p, v, f++, 0, &ops[n++]);
        nth_op(p, v, b++, 1, &ops[n++]);
    }
}

typedef struct keyed {
    int64_t time;      /* ticks on the common clock */
    int32_t tie;       /* 0 transfers, 1 compute */
    int32_t sender;    /* transfers: the sending stage */
    int32_t seq;       /* order of creation, for a stable sort */
    zt_pp_action a;
} keyed;

static int keyed_cmp(const void *x, const void *y)
{
    const keyed *a = x, *b = y;
    if (a->time != b->time) return a->time < b->time ? -1 : 1;
    if (a->tie != b->tie) return a->tie - b->tie;
    if (a->sender != b->sender) return a->sender - b->sender;
    return a->seq - b->seq;
}

int32_t pp_schedule_build(int32_t p, int32_t v, int32_t stage, int32_t m, zt_pp_action *out, int32_t cap)
{
    if (v < 1) v = 1;
    int32_t per_stage = 2 * m * v, K = p * v;
    compute_op *ops = malloc((size_t)p * (size_t)per_stage * sizeof *ops);
    int64_t *end = malloc((size_t)2 * (size_t)m * (size_t)K * sizeof *end);      /* [backward][micro][k] */
    int64_t *start = malloc((size_t)per_stage * sizeof *start);                   /* this stage's ops */
    keyed *items = malloc((size_t)per_stage * 3 * sizeof *items);
    int32_t *next = calloc((size_t)p, sizeof *next);
    int64_t *clock = calloc((size_t)p, sizeof *clock);
    if (!ops || !end || !start || !items || !next || !clock) {
        free(ops), free(end), free(start), free(items), free(next), free(clock);
        return -1;
    }
#define END(bw, mi, k) end[((size_t)(bw) * (size_t)m + (size_t)(mi)) * (size_t)K + (size_t)(k)]
    for (size_t i = 0; i < (size_t)2 * (size_t)m * (size_t)K; i++) end[i] = -1;
    for (int32_t s = 0; s < p; s++) compute_order(p, v, s, m, ops + (size_t)s * (size_t)per_stage);

    /* The common clock: run every stage's order as far as its inputs allow, until all are done (the
     * 1F1B orders are deadlock-free without transfer constraints, so this ends). */
    for (int moved = 1; moved;) {
        moved = 0;
        for (int32_t s = 0; s < p; s++) {
            while (next[s] < per_stage) {
                const compute_op *o = &ops[(size_t)s * (size_t)per_stage + (size_t)next[s]];
                int32_t k = o->chunk * p + s;
                int64_t ready = 0;
                if (!o->backward && k > 0) ready = END(0, o->micro, k - 1);
                if (o->backward) ready = k < K - 1 ? END(1, o->micro, k + 1) : END(0, o->micro, k);
                if (ready < 0) break;
                int64_t t0 = clock[s] > ready ? clock[s] : ready;
                if (s == stage) start[next[s]] = t0;
                clock[s] = t0 + 1;
                END(o->backward, o->micro, k) = clock[s];
                next[s]++;
                moved = 1;
            }
        }
    }

    int32_t n = 0;
    const compute_op *mine = ops + (size_t)stage * (size_t)per_stage;
    int32_t prev = (stage + p - 1) % p, nxt = (stage + 1) % p;
    for (int32_t i = 0; i < per_stage; i++) {
        const compute_op *o = &mine[i];
        int32_t k = o->chunk * p + stage;
        keyed c = {start[i], 1, stage, n, {o->backward ? ZT_PP_BACKWARD : ZT_PP_FORWARD, o->micro, o->chunk, -1}};
        items[n++] = c;
        if (!o->backward && k > 0) {
            keyed r = {END(0, o->micro, k - 1), 0, prev, n, {ZT_PP_RECV_ACTIVATION, o->micro, o->chunk, prev}};
            items[n++] = r;
        }
        if (!o->backward && k < K - 1) {
            keyed snd = {END(0, o->micro, k), 0, stage, n, {ZT_PP_SEND_ACTIVATION, o->micro, o->chunk, nxt}};
            items[n++] = snd;
        }
        if (o->backward && k < K - 1) {
            keyed r = {END(1, o->micro, k + 1), 0, nxt, n, {ZT_PP_RECV_GRADIENT, o->micro, o->chunk, nxt}};
            items[n++] = r;
        }
        if (o->backward && k > 0) {
            keyed snd = {END(1, o->micro, k), 0, stage, n, {ZT_PP_SEND_GRADIENT, o->micro, o->chunk, prev}};
            items[n++] = snd;
        }
    }
#undef END
    qsort(items, (size_t)n, sizeof *items, keyed_cmp);
    for (int32_t i = 0; i < n && i < cap; i++) out[i] = items[i].a;
    free(ops), free(end), free(start), free(items), free(next), free(clock);
    return n;
}
