/* The parallel plugin's pure parts without ranks or devices (plugins/parallel/layout.h):
 *   - the pipeline instruction lists of all stages, run together by an independent simulator in
 *     which a send blocks until the peer's matching receive (rendezvous, the strictest transport):
 *     they never deadlock, each (micro, chunk) runs forward once before its backward, inputs arrive
 *     before the compute that needs them, stage i holds at most p-i micro-batches (1F1B), and the
 *     idle share of every stage on the simulated clock (unit cost per chunk) is the formula's bubble
 *     (p-1)/(m+p-1), (p-1)/(v m+p-1) interleaved;
 *   - the grid: Megatron's rank order, the stages' units covering the model once, the uneven split
 *     policy, and the errors for layouts that do not fit. */
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "ztest.h"

typedef struct stage_run {
    zt_pp_action *a;
    int32_t n, pc;
    double clock, busy;
    int32_t in_flight, max_in_flight;
} stage_run;

/* What a stage has: forward done, backward done, activation received, gradient received. */
#define IDX(mi, k) ((size_t)(mi) * (size_t)K + (size_t)(k))

static void simulate(int32_t p, int32_t v, int32_t m)
{
    int32_t K = p * v;
    stage_run *st = calloc((size_t)p, sizeof *st);
    unsigned char *fwd = calloc((size_t)m * (size_t)K, 1), *bwd = calloc((size_t)m * (size_t)K, 1);
    unsigned char *act = calloc((size_t)m * (size_t)K, 1), *grad = calloc((size_t)m * (size_t)K, 1);
    for (int32_t s = 0; s < p; s++) {
        int32_t need = pp_schedule_build(p, v, s, m, NULL, 0);
        ZT_CHECK(need > 0);
        st[s].a = calloc((size_t)need, sizeof *st[s].a);
        ZT_CHECK_INT(pp_schedule_build(p, v, s, m, st[s].a, need), need);
        st[s].n = need;
    }
    int errors = 0;
    for (int moved = 1; moved && !errors;) {
        moved = 0;
        for (int32_t s = 0; s < p && !errors; s++) {
            stage_run *r = &st[s];
            while (r->pc < r->n && !errors) {
                const zt_pp_action *x = &r->a[r->pc];
                int32_t k = x->chunk * p + s;
                if (x->op == ZT_PP_FORWARD || x->op == ZT_PP_BACKWARD) {
                    int bw = x->op == ZT_PP_BACKWARD;
                    if (x->peer != -1) errors++;
                    if (!bw && ((k > 0 && !act[IDX(x->micro, k)]) || fwd[IDX(x->micro, k)])) errors++;
                    if (bw && (!fwd[IDX(x->micro, k)] || bwd[IDX(x->micro, k)] || (k < K - 1 && !grad[IDX(x->micro, k)])))
                        errors++;
                    (bw ? bwd : fwd)[IDX(x->micro, k)] = 1;
                    r->in_flight += bw ? -1 : 1;
                    if (r->in_flight > r->max_in_flight) r->max_in_flight = r->in_flight;
                    r->clock += 1.0 / v;
                    r->busy += 1.0 / v;
                    r->pc++;
                    moved = 1;
                    continue;
                }
                if (x->op == ZT_PP_RECV_ACTIVATION || x->op == ZT_PP_RECV_GRADIENT) break; /* the sender moves */
                /* a send: the peer must be at the matching receive */
                int grad_send = x->op == ZT_PP_SEND_GRADIENT;
                int32_t peer = x->peer, peer_k = grad_send ? k - 1 : k + 1;
                if (peer != (grad_send ? (s + p - 1) % p : (s + 1) % p) || peer_k < 0 || peer_k >= K) {
                    errors++;
                    break;
                }
                if (!(grad_send ? bwd : fwd)[IDX(x->micro, k)]) errors++; /* sending what is not computed */
                stage_run *q = &st[peer];
                if (q->pc >= q->n) break;
                const zt_pp_action *y = &q->a[q->pc];
                int want = grad_send ? ZT_PP_RECV_GRADIENT : ZT_PP_RECV_ACTIVATION;
                if (y->op != want || y->micro != x->micro || y->chunk * p + peer != peer_k || y->peer != s) break;
                (grad_send ? grad : act)[IDX(x->micro, peer_k)] = 1;
                double t = r->clock > q->clock ? r->clock : q->clock;
                r->clock = q->clock = t;
                r->pc++, q->pc++;
                moved = 1;
            }
        }
    }
    ZT_CHECK_INT(errors, 0);
    double bubble = pp_bubble_fraction(p, m, v), total = 0;
    for (int32_t s = 0; s < p; s++) total = st[s].clock > total ? st[s].clock : total;
    for (int32_t s = 0; s < p; s++) {
        if (st[s].pc != st[s].n)
            fprintf(stderr, "p %d v %d m %d: stage %d stopped at instruction %d of %d (deadlock)\n", (int)p, (int)v,
                    (int)m, (int)s, (int)st[s].pc, (int)st[s].n);
        ZT_CHECK_INT(st[s].pc, st[s].n);
        ZT_CHECK_INT(st[s].in_flight, 0);
        if (v == 1) ZT_CHECK(st[s].max_in_flight <= (p - s < m ? p - s : m));
        ZT_CHECK_CLOSE((total - st[s].busy) / total, bubble, 1e-9, 1e-12);
    }
    for (size_t i = 0; i < (size_t)m * (size_t)K; i++) ZT_CHECK(fwd[i] && bwd[i]);
    for (int32_t s = 0; s < p; s++) free(st[s].a);
    free(st), free(fwd), free(bwd), free(act), free(grad);
}

static void test_schedules(void)
{
    char why[512];
    for (int32_t p = 1; p <= 8; p++)
        for (int32_t m = 1; m <= 16; m++) simulate(p, 1, m);
    for (int32_t p = 2; p <= 8; p++)
        for (int32_t v = 2; v <= 4; v++)
            for (int32_t m = p; m <= 3 * p; m += p) {
                ZT_CHECK_INT(pp_schedule_check(p, v, m, why, sizeof why), 0);
                simulate(p, v, m);
            }
    /* the formulas themselves, by hand: 4 stages, 8 micro-batches: 3/11; interleaved v = 2: 3/19 */
    ZT_CHECK_CLOSE(pp_bubble_fraction(4, 8, 1), 3.0 / 11.0, 1e-12, 0);
    ZT_CHECK_CLOSE(pp_bubble_fraction(4, 8, 2), 3.0 / 19.0, 1e-12, 0);
    ZT_CHECK_CLOSE(pp_bubble_fraction(1, 8, 1), 0.0, 0, 1e-15);
    /* 1F1B with 2 stages, 2 micro-batches, stage 0: F0 send F1 send, recv-grad B0, recv-grad B1 */
    zt_pp_action a[16];
    ZT_CHECK_INT(pp_schedule_build(2, 1, 0, 2, a, 16), 8);
    ZT_CHECK_INT(a[0].op, ZT_PP_FORWARD);
    ZT_CHECK_INT(a[1].op, ZT_PP_SEND_ACTIVATION);
    ZT_CHECK_INT(a[1].peer, 1);
    /* no pipeline: each forward followed by its backward (gradient accumulation) */
    ZT_CHECK_INT(pp_schedule_build(1, 1, 0, 3, a, 16), 6);
    for (int i = 0; i < 6; i++) {
        ZT_CHECK_INT(a[i].op, i % 2 ? ZT_PP_BACKWARD : ZT_PP_FORWARD);
        ZT_CHECK_INT(a[i].micro, i / 2);
    }
    ZT_CHECK(pp_schedule_check(4, 2, 6, why, sizeof why) != 0 && strstr(why, "multiple of pipeline_stage = 4"));
    ZT_CHECK(pp_schedule_check(1, 2, 4, why, sizeof why) != 0);
    ZT_CHECK(pp_schedule_check(4, 1, 0, why, sizeof why) != 0);
}

static void test_grid(void)
{
    char why[1024];
    /* Megatron's order: tensor fastest, then data, then pipeline */
    pp_layout l = {.world = 8, .dp = 0, .tp = 2, .pp = 2, .virtual_stages = 1};
    ZT_CHECK_INT(pp_layout_check(&l, 4, 8, 8, 64, why, sizeof why), 0);
    ZT_CHECK_INT(l.dp, 2);
    for (int32_t r = 0; r < 8; r++) {
        int32_t d, t, p;
        pp_layout_coords(&l, r, &d, &t, &p);
        ZT_CHECK_INT(t, r % 2);
        ZT_CHECK_INT(d, (r / 2) % 2);
        ZT_CHECK_INT(p, r / 4);
        ZT_CHECK_INT(pp_layout_world_rank(&l, d, t, p), r);
    }
    /* the seed's layouts: 8 cards as data 2 x model 4, 32 as data 8 x model 4 (LLaMA 7B: 32 heads) */
    pp_layout seed = {.world = 8, .dp = 0, .tp = 4, .pp = 1, .virtual_stages = 1};
    ZT_CHECK_INT(pp_layout_check(&seed, 32, 32, 32, 11008, why, sizeof why), 0);
    ZT_CHECK_INT(seed.dp, 2);
    pp_layout seed32 = {.world = 32, .dp = 0, .tp = 4, .pp = 1, .virtual_stages = 1};
    ZT_CHECK_INT(pp_layout_check(&seed32, 32, 32, 32, 11008, why, sizeof why), 0);
    ZT_CHECK_INT(seed32.dp, 8);

    /* every unit on exactly one stage, in order; uneven: 10 layers on 4 stages -> 2, 3, 3, 2 */
    int32_t expect[4] = {2, 3, 3, 2};
    for (int32_t stages = 1; stages <= 10; stages++) {
        int32_t next = 0;
        for (int32_t s = 0; s < stages; s++) {
            int32_t first, last, fl, count;
            pp_stage_units(10, stages, s, &first, &last);
            pp_stage_layers(10, stages, s, &fl, &count);
            ZT_CHECK_INT(first, next);
            ZT_CHECK(last >= first && count >= 1);
            ZT_CHECK(count == 10 / stages || count == 10 / stages + 1);
            if (stages == 4) ZT_CHECK_INT(count, expect[s]);
            next = last + 1;
        }
        ZT_CHECK_INT(next, 12);
    }
    /* 5 layers on 3 stages: the middle stage takes the extra one first, then stage 0 */
    int32_t fl, count;
    pp_stage_layers(5, 3, 1, &fl, &count);
    ZT_CHECK_INT(count, 2);
    pp_stage_layers(5, 3, 0, &fl, &count);
    ZT_CHECK_INT(count, 2);
    pp_stage_layers(5, 3, 2, &fl, &count);
    ZT_CHECK_INT(count, 1);

    /* layouts that do not fit, each naming the numbers */
    pp_layout bad = {.world = 6, .dp = 0, .tp = 4, .pp = 1, .virtual_stages = 1};
    ZT_CHECK(pp_layout_check(&bad, 4, 8, 8, 64, why, sizeof why) != 0 && strstr(why, "does not divide the job's 6"));
    pp_layout product = {.world = 8, .dp = 3, .tp = 2, .pp = 1, .virtual_stages = 1};
    ZT_CHECK(pp_layout_check(&product, 4, 8, 8, 64, why, sizeof why) != 0 && strstr(why, "3 x 2 x 1 = 6"));
    pp_layout heads = {.world = 3, .dp = 0, .tp = 3, .pp = 1, .virtual_stages = 1};
    ZT_CHECK(pp_layout_check(&heads, 4, 8, 8, 96, why, sizeof why) != 0 && strstr(why, "8 attention heads: use one of 1, 2"));
    pp_layout kv = {.world = 8, .dp = 0, .tp = 8, .pp = 1, .virtual_stages = 1};
    ZT_CHECK_INT(pp_layout_check(&kv, 4, 8, 2, 64, why, sizeof why), 0); /* 2 KV heads, each on 4 ranks */
    pp_layout kv3 = {.world = 4, .dp = 0, .tp = 4, .pp = 1, .virtual_stages = 1};
    ZT_CHECK(pp_layout_check(&kv3, 4, 8, 6, 64, why, sizeof why) != 0 && strstr(why, "6 KV heads"));
    pp_layout ffn = {.world = 4, .dp = 0, .tp = 4, .pp = 1, .virtual_stages = 1};
    ZT_CHECK(pp_layout_check(&ffn, 4, 8, 8, 90, why, sizeof why) != 0 && strstr(why, "intermediate_size 90"));
    pp_layout layers = {.world = 8, .dp = 0, .tp = 1, .pp = 8, .virtual_stages = 1};
    ZT_CHECK(pp_layout_check(&layers, 4, 8, 8, 64, why, sizeof why) != 0 && strstr(why, "at most 4 stages"));
    pp_layout chunks = {.world = 2, .dp = 0, .tp = 1, .pp = 2, .virtual_stages = 3};
    ZT_CHECK(pp_layout_check(&chunks, 4, 8, 8, 64, why, sizeof why) != 0 && strstr(why, "at most 2 virtual"));
}

int main(void)
{
    test_schedules();
    test_grid();
    return zt_test_result();
}
