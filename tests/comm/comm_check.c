/* The collectives of a zt runtime across ranks, checked against values this program computes
 * itself from each member's world rank (never from another rank's output).
 *
 *   comm_check collectives      every collective, dtype and reduce op on "world" and on subgroups
 *                               ("even", "odd", "reversed", "pair"), in and out of place, plus
 *                               the MPI backend's error messages. Under mpirun with 2 or 4 ranks, or
 *                               alone (world size 1: the local backend, same expectations).
 *   comm_check skip             the watchdog: rank 1 never joins all_reduce #3 (comm.timeout_s = 2).
 *   comm_check skip-group       the watchdog: rank 2 never creates group 'even'.
 *   comm_check kill             rank 1 dies by SIGKILL before all_reduce #3.
 *   comm_check fail-alone       rank 1 stops with an error of its own before all_reduce #3.
 *   comm_check launched N       one all_reduce in a job that must have N ranks (zt-run --nproc).
 *   comm_check --nproc N ARGS   starts `comm_check ARGS` as N ranks through zt_launch_local.
 *   comm_check --fork N ARGS    starts `comm_check ARGS` as N children the way --nproc starts GPU
 *                               ranks (zt_launch_local_mode ZT_NPROC_FORK), on any machine.
 *   comm_check --fork-nodes FLAGS ARGS
 *                               the same for torchrun's flags (--nnodes, --nproc-per-node,
 *                               --node-rank, --master-addr, --master-port; zt_launch_start): this
 *                               machine's share of the ranks.
 *   comm_check fork-child MODE  such a child: gets rank 0's 128-byte id through the TCP rendezvous
 *                               (ZT_MASTER_ADDR/ZT_MASTER_PORT), checks it, then per MODE: ok;
 *                               fail (rank 1 exits 3); kill (rank 1 dies by SIGKILL); stuck (rank 1
 *                               exits 5 while rank 0 sleeps); sleep (every rank sleeps; fork.sh
 *                               signals zt-run's process); interrupt (every rank waits for SIGINT or
 *                               SIGTERM, says whether the job directory calls it a user's interrupt,
 *                               and exits 130); teardown (rank 1 dies by SIGKILL, rank 0 waits for
 *                               the supervisor's SIGTERM and says whom the job directory names).
 * The shell tests next to this file (watchdog.sh, nproc.sh) run the other modes and check what the
 * job prints.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "dist/job.h"
#include "dist/launch.h"
#include "host/runtime.h"
#include "ztest.h"

#define MAX_RANKS 16

static int g_world_rank;

/* ---- the data: every element a function of (world rank, index), exact in every dtype --------- */

static float f32_value(int world_rank, uint64_t i) { return (float)((world_rank + 1) * 0.25 + (double)(i % 17) - 8.0); }
static float minmax_value(int world_rank, uint64_t i) { return (float)((world_rank * 7 + (int)(i % 97) * 3) % 11 - 5); }
static int32_t i32_value(int world_rank, uint64_t i) { return (world_rank - 1) * 1000 - (int32_t)(i % 500) + 7; }
static int64_t i64_value(int world_rank, uint64_t i) { return ((int64_t)(world_rank + 1) << 40) + (int64_t)i; }
static uint8_t u8_value(int world_rank, uint64_t i) { return (uint8_t)((world_rank + i) % 50); }
static uint16_t u16_value(int world_rank, uint64_t i) { return (uint16_t)(1000 * world_rank + i % 1000); }
static uint32_t u32_value(int world_rank, uint64_t i) { return 1000000000u + (uint32_t)world_rank + (uint32_t)(i % 3); }
static uint16_t bf16_bits(int world_rank, uint64_t i) { return (uint16_t)(0x3f80 + world_rank * 0x100 + i % 64); }

typedef struct group_under_test {
    const char *name;
    int32_t ranks[MAX_RANKS]; /* world ranks, in group-rank order */
    int32_t n;
    zt_group g;
} group_under_test;

static double f32_sum(const group_under_test *t, uint64_t i)
{
    double s = 0;
    for (int32_t m = 0; m < t->n; m++) s += f32_value(t->ranks[m], i);
    return s;
}

/* ---- checks ---------------------------------------------------------------------------------- */

static void expect_ok(const zt_host *h, zt_status st, const char *what)
{
    if (st == ZT_OK) return;
    zt_status recorded;
    const char *msg = zt_runtime_take_error(h, &recorded);
    fprintf(stderr, "rank %d: %s failed: %s\n", g_world_rank, what, msg);
    zt_test_failures++;
}

static void expect_error(const zt_host *h, zt_status st, zt_status want, const char *needle)
{
    zt_status recorded;
    const char *msg = zt_runtime_take_error(h, &recorded);
    ZT_CHECK_INT(st, want);
    ZT_CHECK_CONTAINS(msg, needle);
}

static void check_all_reduce(const zt_host *h, group_under_test *t, uint64_t count)
{
    float *send = malloc(count * sizeof *send), *recv = malloc(count * sizeof *recv);
    for (uint64_t i = 0; i < count; i++) send[i] = f32_value(g_world_rank, i);
    expect_ok(h, h->all_reduce(h->ctx, &t->g, send, recv, count, ZT_F32, ZT_REDUCE_SUM, NULL), "all_reduce SUM");
    int bad = 0;
    for (uint64_t i = 0; i < count; i++) bad += recv[i] != (float)f32_sum(t, i);
    ZT_CHECK_INT(bad, 0);
    for (uint64_t i = 0; i < count; i++) ZT_CHECK(send[i] == f32_value(g_world_rank, i)); /* left alone */

    /* in place, AVG */
    memcpy(recv, send, count * sizeof *send);
    expect_ok(h, h->all_reduce(h->ctx, &t->g, recv, recv, count, ZT_F32, ZT_REDUCE_AVG, NULL), "all_reduce AVG");
    bad = 0;
    for (uint64_t i = 0; i < count; i++) bad += recv[i] != (float)f32_sum(t, i) / (float)t->n;
    ZT_CHECK_INT(bad, 0);

    /* MAX and MIN */
    for (uint64_t i = 0; i < count; i++) send[i] = minmax_value(g_world_rank, i);
    for (int op = ZT_REDUCE_MAX; op <= ZT_REDUCE_MIN; op++) {
        expect_ok(h, h->all_reduce(h->ctx, &t->g, send, recv, count, ZT_F32, op, NULL), "all_reduce MAX/MIN");
        bad = 0;
        for (uint64_t i = 0; i < count; i++) {
            float want = minmax_value(t->ranks[0], i);
            for (int32_t m = 1; m < t->n; m++) {
                float v = minmax_value(t->ranks[m], i);
                want = op == ZT_REDUCE_MAX ? (v > want ? v : want) : (v < want ? v : want);
            }
            bad += recv[i] != want;
        }
        ZT_CHECK_INT(bad, 0);
    }
    free(send);
    free(recv);
}

/* SUM and AVG of each integer dtype, and MAX of one; AVG of integers divides as C does. */
static void check_integer_all_reduce(const zt_host *h, group_under_test *t)
{
    enum { N = 257 };
    int32_t i32[N];
    int64_t i64[N];
    uint8_t u8[N];
    uint16_t u16[N];
    uint32_t u32[N];
    for (uint64_t i = 0; i < N; i++) {
        i32[i] = i32_value(g_world_rank, i);
        i64[i] = i64_value(g_world_rank, i);
        u8[i] = u8_value(g_world_rank, i);
        u16[i] = u16_value(g_world_rank, i);
        u32[i] = u32_value(g_world_rank, i);
    }
    expect_ok(h, h->all_reduce(h->ctx, &t->g, i32, i32, N, ZT_I32, ZT_REDUCE_AVG, NULL), "I32 AVG");
    expect_ok(h, h->all_reduce(h->ctx, &t->g, i64, i64, N, ZT_I64, ZT_REDUCE_SUM, NULL), "I64 SUM");
    expect_ok(h, h->all_reduce(h->ctx, &t->g, u8, u8, N, ZT_U8, ZT_REDUCE_SUM, NULL), "U8 SUM");
    expect_ok(h, h->all_reduce(h->ctx, &t->g, u16, u16, N, ZT_U16, ZT_REDUCE_MAX, NULL), "U16 MAX");
    expect_ok(h, h->all_reduce(h->ctx, &t->g, u32, u32, N, ZT_U32, ZT_REDUCE_SUM, NULL), "U32 SUM");
    int bad = 0;
    for (uint64_t i = 0; i < N; i++) {
        int64_t s32 = 0, s64 = 0;
        uint32_t s8 = 0, max16 = 0, s_u32 = 0;
        for (int32_t m = 0; m < t->n; m++) {
            int r = t->ranks[m];
            s32 += i32_value(r, i);
            s64 += i64_value(r, i);
            s8 += u8_value(r, i);
            max16 = u16_value(r, i) > max16 ? u16_value(r, i) : max16;
            s_u32 += u32_value(r, i);
        }
        bad += i32[i] != (int32_t)(s32 / t->n) || i64[i] != s64 || u8[i] != s8 || u16[i] != max16 || u32[i] != s_u32;
    }
    ZT_CHECK_INT(bad, 0);
}

static void check_reduce_scatter(const zt_host *h, group_under_test *t, uint64_t count)
{
    uint64_t total = count * (uint64_t)t->n;
    float *send = malloc(total * sizeof *send), *recv = malloc(count * sizeof *recv);
    for (uint64_t i = 0; i < total; i++) send[i] = f32_value(g_world_rank, i);
    expect_ok(h, h->reduce_scatter(h->ctx, &t->g, send, recv, count, ZT_F32, ZT_REDUCE_SUM, NULL), "reduce_scatter");
    int bad = 0;
    uint64_t mine = (uint64_t)t->g.rank * count;
    for (uint64_t i = 0; i < count; i++) bad += recv[i] != (float)f32_sum(t, mine + i);
    ZT_CHECK_INT(bad, 0);
    /* in place: the result lands in the first count elements */
    expect_ok(h, h->reduce_scatter(h->ctx, &t->g, send, send, count, ZT_F32, ZT_REDUCE_AVG, NULL),
              "reduce_scatter in place");
    bad = 0;
    for (uint64_t i = 0; i < count; i++) bad += send[i] != (float)f32_sum(t, mine + i) / (float)t->n;
    ZT_CHECK_INT(bad, 0);

    int64_t *s64 = malloc(total * sizeof *s64), *r64 = malloc(count * sizeof *r64);
    for (uint64_t i = 0; i < total; i++) s64[i] = i64_value(g_world_rank, i);
    expect_ok(h, h->reduce_scatter(h->ctx, &t->g, s64, r64, count, ZT_I64, ZT_REDUCE_MIN, NULL), "reduce_scatter I64");
    bad = 0;
    for (uint64_t i = 0; i < count; i++) {
        int64_t want = INT64_MAX;
        for (int32_t m = 0; m < t->n; m++) {
            int64_t v = i64_value(t->ranks[m], mine + i);
            want = v < want ? v : want;
        }
        bad += r64[i] != want;
    }
    ZT_CHECK_INT(bad, 0);
    free(send), free(recv), free(s64), free(r64);
}

static void check_all_gather(const zt_host *h, group_under_test *t, uint64_t count)
{
    uint64_t total = count * (uint64_t)t->n;
    float *send = malloc(count * sizeof *send), *recv = malloc(total * sizeof *recv);
    for (uint64_t i = 0; i < count; i++) send[i] = f32_value(g_world_rank, i);
    expect_ok(h, h->all_gather(h->ctx, &t->g, send, recv, count, ZT_F32, NULL), "all_gather");
    int bad = 0;
    for (int32_t m = 0; m < t->n; m++)
        for (uint64_t i = 0; i < count; i++) bad += recv[(uint64_t)m * count + i] != f32_value(t->ranks[m], i);
    ZT_CHECK_INT(bad, 0);

    /* in place: this rank's part at the start of the buffer; BF16 moves as its bits */
    uint16_t *bits = malloc(total * sizeof *bits);
    for (uint64_t i = 0; i < total; i++) bits[i] = 0xdead;
    for (uint64_t i = 0; i < count; i++) bits[i] = bf16_bits(g_world_rank, i);
    expect_ok(h, h->all_gather(h->ctx, &t->g, bits, bits, count, ZT_BF16, NULL), "all_gather in place");
    bad = 0;
    for (int32_t m = 0; m < t->n; m++)
        for (uint64_t i = 0; i < count; i++) bad += bits[(uint64_t)m * count + i] != bf16_bits(t->ranks[m], i);
    ZT_CHECK_INT(bad, 0);
    free(send), free(recv), free(bits);
}

static void check_broadcast(const zt_host *h, group_under_test *t, uint64_t count)
{
    float *buf = malloc(count * sizeof *buf);
    int32_t roots[2] = {0, t->n - 1};
    for (int k = 0; k < 2; k++) {
        int32_t root = roots[k];
        for (uint64_t i = 0; i < count; i++) buf[i] = t->g.rank == root ? f32_value(g_world_rank, i) : -1.0f;
        expect_ok(h, h->broadcast(h->ctx, &t->g, buf, count, ZT_F32, root, NULL), "broadcast");
        int bad = 0;
        for (uint64_t i = 0; i < count; i++) bad += buf[i] != f32_value(t->ranks[root], i);
        ZT_CHECK_INT(bad, 0);
    }
    free(buf);
}

/* A ring: each rank sends to the next group rank and receives from the previous. Even group ranks
 * send first, odd ones receive first, so large (rendezvous) messages cannot deadlock. */
static void check_send_recv(const zt_host *h, group_under_test *t, uint64_t count)
{
    if (t->n < 2) return;
    int32_t me = t->g.rank, next = (me + 1) % t->n, prev = (me + t->n - 1) % t->n;
    float *out = malloc(count * sizeof *out), *in = malloc(count * sizeof *in);
    for (uint64_t i = 0; i < count; i++) out[i] = f32_value(g_world_rank, i), in[i] = -1.0f;
    for (int step = 0; step < 2; step++) {
        if ((me % 2 == 0) == (step == 0))
            expect_ok(h, h->send(h->ctx, &t->g, out, count, ZT_F32, next, NULL), "send");
        else
            expect_ok(h, h->recv(h->ctx, &t->g, in, count, ZT_F32, prev, NULL), "recv");
    }
    int bad = 0;
    for (uint64_t i = 0; i < count; i++) bad += in[i] != f32_value(t->ranks[prev], i);
    ZT_CHECK_INT(bad, 0);
    free(out), free(in);
}

/* The MPI backend's own refusals: no collective is issued, so every rank may try them. */
static void check_mpi_errors(const zt_host *h, group_under_test *t)
{
    uint16_t bf16[4] = {0};
    expect_error(h, h->all_reduce(h->ctx, &t->g, bf16, bf16, 4, ZT_BF16, ZT_REDUCE_SUM, NULL), ZT_ERR_UNSUPPORTED,
                 "all_reduce on group 'world': the MPI backend does not reduce BF16 values: CPU ranks compute in fp32");
    float f[8] = {0};
    expect_error(h, h->all_reduce(h->ctx, &t->g, f, f + 1, 4, ZT_F32, ZT_REDUCE_SUM, NULL), ZT_ERR_INVALID_ARG,
                 "the send and receive buffers overlap without being the same");
    /* Never touched: the count is refused first. */
    expect_error(h, h->all_reduce(h->ctx, &t->g, f, f + 4, UINT64_C(1) << 31, ZT_F32, ZT_REDUCE_SUM, NULL),
                 ZT_ERR_UNSUPPORTED, "all_reduce on group 'world': 2147483648 elements are more than one MPI "
                 "all_reduce carries (2147483647 elements)");

    /* Even ranks all_reduce while odd ones broadcast: every rank is told, none hangs, and the group
     * goes on working. World has seen 15 all_reduces by now (check_group: 2 x 4 in check_all_reduce,
     * 5 integer ones, 1 of 0 elements; the refusals above issue none) and 2 broadcasts. */
    zt_status st = g_world_rank % 2 == 0 ? h->all_reduce(h->ctx, &t->g, f, f, 4, ZT_F32, ZT_REDUCE_SUM, NULL)
                                         : h->broadcast(h->ctx, &t->g, f, 4, ZT_F32, 0, NULL);
    expect_error(h, st, ZT_ERR_COMM, g_world_rank % 2 == 0
                                         ? "all_reduce on group 'world': the ranks do not all issue the same "
                                           "collective here: this rank is in all_reduce #15 on group 'world' (16 "
                                           "bytes of F32), another is in another collective"
                                         : "broadcast on group 'world': the ranks do not all issue the same "
                                           "collective here: this rank is in broadcast #3 from rank 0 on group "
                                           "'world' (16 bytes of F32)");
    /* The same collective with another count on one rank. */
    st = h->all_reduce(h->ctx, &t->g, f, f, g_world_rank == 0 ? 3 : 4, ZT_F32, ZT_REDUCE_SUM, NULL);
    expect_error(h, st, ZT_ERR_COMM, "Every rank of a group must issue the same collectives in the same order");
    expect_ok(h, h->barrier(h->ctx, &t->g), "barrier after a mismatch");
}

static void check_group(const zt_host *h, group_under_test *t)
{
    int32_t my_index = -1;
    for (int32_t m = 0; m < t->n; m++)
        if (t->ranks[m] == g_world_rank) my_index = m;
    if (my_index < 0) return; /* each process creates only the groups it belongs to */
    zt_status st = strcmp(t->name, "world") == 0 ? h->group_get(h->ctx, "world", &t->g)
                                                 : h->group_create(h->ctx, t->name, t->ranks, t->n, &t->g);
    expect_ok(h, st, t->name);
    if (st != ZT_OK) return;
    ZT_CHECK_INT(t->g.rank, my_index);
    ZT_CHECK_INT(t->g.size, t->n);
    check_all_reduce(h, t, 1000);
    check_all_reduce(h, t, 300000); /* 1.1 MiB: large-message protocols */
    check_integer_all_reduce(h, t);
    check_reduce_scatter(h, t, 333);
    check_all_gather(h, t, 1001);
    check_broadcast(h, t, 4097);
    check_send_recv(h, t, 100);
    check_send_recv(h, t, 262144); /* 1 MiB */
    expect_ok(h, h->barrier(h->ctx, &t->g), "barrier");
    expect_ok(h, h->all_reduce(h->ctx, &t->g, NULL, NULL, 0, ZT_F32, ZT_REDUCE_SUM, NULL), "all_reduce of 0");
}

/* ---- runs ------------------------------------------------------------------------------------ */

static zt_runtime *start(double timeout_s, zt_config **cfg_out)
{
    zt_error err;
    zt_config *cfg = zt_config_new();
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    char assignment[64];
    snprintf(assignment, sizeof assignment, "comm.timeout_s=%g", timeout_s);
    zt_runtime_options opt = {.n_threads = 1, .device_type = ZT_DEVICE_CPU, .comm_timeout_s = timeout_s};
    zt_runtime *rt = NULL;
    if (zt_config_add_schema(cfg, "host", host_opts, n_host, &err) != ZT_OK ||
        zt_config_set(cfg, assignment, &err) != ZT_OK || zt_runtime_create(&opt, cfg, &rt, &err) != ZT_OK) {
        fprintf(stderr, "comm_check: cannot start: %s\n", err.msg);
        exit(1);
    }
    *cfg_out = cfg;
    return rt;
}

static void stop(zt_runtime *rt, zt_config *cfg)
{
    zt_runtime_destroy(rt);
    zt_config_free(cfg);
}

static int run_collectives(void)
{
    zt_config *cfg;
    zt_runtime *rt = start(20, &cfg);
    const zt_host *h = zt_runtime_host(rt, "comm_check", NULL, 0);
    int n = h->world_size;
    g_world_rank = h->world_rank;
    if (n > MAX_RANKS) ZT_SKIP("comm_check handles up to %d ranks", MAX_RANKS);
    group_under_test groups[5] = {{.name = "world"}, {.name = "even"}, {.name = "odd"}, {.name = "reversed"},
                                  {.name = "pair"}};
    for (int r = 0; r < n; r++) {
        groups[0].ranks[groups[0].n++] = r;
        groups[r % 2 ? 2 : 1].ranks[groups[r % 2 ? 2 : 1].n++] = r;
        groups[3].ranks[groups[3].n++] = n - 1 - r;
    }
    groups[4].ranks[groups[4].n++] = n - 1; /* the last rank, then rank 1 or 0: not in world order */
    groups[4].ranks[groups[4].n++] = n > 2 ? 1 : 0;
    if (n == 1) groups[4].n = 1;
    for (int k = 0; k < 5; k++)
        if (groups[k].n) check_group(h, &groups[k]);
    if (n > 1) {
        check_mpi_errors(h, &groups[0]);
        /* Ranks 0 and 1 create different groups at the same point: both are told, neither hangs. */
        if (g_world_rank < 2) {
            int32_t both[2] = {1, 0};
            zt_group g;
            expect_error(h, h->group_create(h->ctx, g_world_rank == 0 ? "left" : "right", both, 2, &g),
                         ZT_ERR_INVALID_ARG, "every member must create the same groups in the same order");
        }
    }
    stop(rt, cfg);
    if (zt_test_failures) fprintf(stderr, "rank %d of %d:\n", g_world_rank, n);
    return zt_test_result();
}

/* The watchdog cases: rank 0 (and the others) wait in a collective that rank 1 never joins, or a
 * group rank 2 never creates, or rank 1 dies or shuts down alone. The job must end by itself, well
 * before the sleep. */
static int run_stuck(const char *mode)
{
    zt_config *cfg;
    zt_runtime *rt = start(strcmp(mode, "kill") == 0 ? 10 : 2, &cfg);
    const zt_host *h = zt_runtime_host(rt, "comm_check", NULL, 0);
    g_world_rank = h->world_rank;
    zt_group world;
    expect_ok(h, h->group_get(h->ctx, "world", &world), "world");
    if (strcmp(mode, "skip-group") == 0) {
        int32_t even[MAX_RANKS], n_even = 0;
        for (int r = 0; r < h->world_size && r < 2 * MAX_RANKS; r += 2) even[n_even++] = r;
        if (g_world_rank % 2 == 0 && g_world_rank != 2) {
            zt_group g;
            h->group_create(h->ctx, "even", even, n_even, &g);
        } else {
            sleep(60);
        }
    } else {
        for (int call = 1; call <= 3; call++) {
            float x = (float)g_world_rank;
            if (call == 3 && g_world_rank == 1) {
                if (strcmp(mode, "kill") == 0) {
                    struct timespec half = {0, 500 * 1000 * 1000}; /* so rank 0 surely waits already */
                    nanosleep(&half, NULL);
                    raise(SIGKILL);
                }
                if (strcmp(mode, "fail-alone") == 0) {
                    /* An error only this rank meets: it shuts down while the others wait for it. */
                    fprintf(stderr, "rank 1: stopping with an error of its own\n");
                    stop(rt, cfg);
                    return 1;
                }
                sleep(60); /* "stuck elsewhere" */
            }
            expect_ok(h, h->all_reduce(h->ctx, &world, &x, &x, 1, ZT_F32, ZT_REDUCE_SUM, NULL), "all_reduce");
        }
    }
    fprintf(stderr, "rank %d: the job was not ended\n", g_world_rank);
    stop(rt, cfg);
    return 1;
}

/* A job zt_launch_local started: it has the ranks asked for, and they talk. */
static int run_launched(const char *expected_ranks)
{
    zt_config *cfg;
    zt_runtime *rt = start(20, &cfg);
    const zt_host *h = zt_runtime_host(rt, "comm_check", NULL, 0);
    zt_group world;
    expect_ok(h, h->group_get(h->ctx, "world", &world), "world");
    int64_t rank = h->world_rank;
    expect_ok(h, h->all_reduce(h->ctx, &world, &rank, &rank, 1, ZT_I64, ZT_REDUCE_SUM, NULL), "all_reduce");
    ZT_CHECK_INT(h->world_size, atoi(expected_ranks));
    printf("rank %d of %d: sum of ranks %lld\n", h->world_rank, h->world_size, (long long)rank);
    stop(rt, cfg);
    return zt_test_result();
}

/* The id rank 0 sends: a pattern every rank knows, so the others can tell it arrived whole. */
static unsigned char fake_id_byte(int i) { return (unsigned char)(i * 7 + 13); }

/* fork-child interrupt / teardown: the job directory as a rank of zt-run --nproc sees it. The
 * signals are taken with sigtimedwait, so what a handler may not call is fine here. */
static int run_signalled_child(const zt_launch *l, const char *mode)
{
    zt_job_attach(l->rank, l->world_size, l->launcher);
    zt_job_register(20);
    if (!zt_job_attached()) {
        fprintf(stderr, "rank %d: no job directory (%s is not set)\n", l->rank, ZT_JOB_DIR_ENV);
        return 1;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    if (strcmp(mode, "teardown") == 0 && l->rank == 1) {
        struct timespec pause = {0, 300 * 1000 * 1000}; /* rank 0 registers meanwhile */
        nanosleep(&pause, NULL);
        raise(SIGKILL);
    }
    struct timespec limit = {30, 0};
    int sig = sigtimedwait(&set, NULL, &limit);
    if (sig < 0) {
        fprintf(stderr, "rank %d: no signal within 30 s\n", l->rank);
        return 1;
    }
    char peers[1024] = "";
    size_t len = 0;
    int n_peers = zt_job_describe_peers(peers, sizeof peers, &len);
    int ends = sig == SIGTERM && zt_job_sigterm_ends_job();
    fprintf(stderr, "rank %d: %s, %s (%d interrupt(s) recorded; %d rank(s) in trouble%s%s)\n", l->rank,
            sig == SIGINT ? "SIGINT" : "SIGTERM", ends ? "the job is torn down" : "an interrupt to save for",
            zt_job_interrupts(), n_peers, n_peers ? ": " : "", peers);
    zt_job_note_end("exit", ends ? 1 : 130); /* as zt-run's trainer does before it exits */
    return ends ? 1 : 130;
}

static int run_fork_child(const char *mode)
{
    zt_launch l;
    zt_error err;
    if (zt_launch_detect(&l, &err) != ZT_OK) {
        fprintf(stderr, "comm_check: %s\n", err.msg);
        return 1;
    }
    char addr[256];
    int port = 0, found = 0;
    if (zt_launch_rendezvous_address(addr, sizeof addr, &port, &found, &err) != ZT_OK || !found) {
        fprintf(stderr, "comm_check: no rendezvous address: %s\n", found ? err.msg : "none set");
        return 1;
    }
    unsigned char id[128];
    for (int i = 0; i < 128; i++) id[i] = l.rank == 0 ? fake_id_byte(i) : 0;
    if (zt_rendezvous_exchange(addr, port, l.rank, l.world_size, 20, id, sizeof id, &err) != ZT_OK) {
        fprintf(stderr, "comm_check: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < 128; i++)
        if (id[i] != fake_id_byte(i)) {
            fprintf(stderr, "rank %d: byte %d of the id is %u, rank 0 sent %u\n", l.rank, i, id[i], fake_id_byte(i));
            return 1;
        }
    printf("rank %d of %d: got the id (launcher %s, local rank %d, NCCL_NVLS_ENABLE=%s)\n", l.rank, l.world_size,
           l.launcher, l.local_rank, getenv("NCCL_NVLS_ENABLE") ? getenv("NCCL_NVLS_ENABLE") : "unset");
    printf("rank %d of %d: local rank %d of %d\n", l.rank, l.world_size, l.local_rank, l.local_world_size);
    fprintf(stderr, "rank %d: pid %d, a line on stderr\n", l.rank, (int)getpid());
    fflush(NULL);
    if (strcmp(mode, "interrupt") == 0 || strcmp(mode, "teardown") == 0) return run_signalled_child(&l, mode);
    if (strcmp(mode, "sleep") == 0) {
        sleep(60);
        return 1;
    }
    if (l.rank == 1 && strcmp(mode, "fail") == 0) return 3;
    if (l.rank == 1 && strcmp(mode, "kill") == 0) raise(SIGKILL);
    if (strcmp(mode, "stuck") == 0) {
        if (l.rank == 1) return 5;
        sleep(60); /* zt-run must end it */
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *fork_n = argc >= 3 && strcmp(argv[1], "--fork") == 0          ? argv[2]
                         : argc >= 2 && strncmp(argv[1], "--fork=", 7) == 0 ? argv[1] + 7
                                                                            : NULL;
    if (fork_n) {
        zt_error err;
        /* As --nproc / --nproc=N, which the launch strips from the children's command line. */
        char nproc_eq[32];
        snprintf(nproc_eq, sizeof nproc_eq, "--nproc=%s", fork_n);
        argv[1] = strcmp(argv[1], "--fork") == 0 ? "--nproc" : nproc_eq;
        if (zt_launch_local_mode(fork_n, ZT_NPROC_FORK, argc, argv, &err) != ZT_OK) {
            fprintf(stderr, "comm_check: error: %s\n", err.msg);
            return 1;
        }
        return 0; /* --fork 1: nothing started */
    }
    if (argc >= 2 && strcmp(argv[1], "--fork-nodes") == 0) {
        zt_launch_request req = {0};
        for (int i = 2; i + 1 < argc; i++) {
            const char **slot = strcmp(argv[i], "--nnodes") == 0          ? &req.nnodes
                                : strcmp(argv[i], "--nproc-per-node") == 0 ? &req.nproc_per_node
                                : strcmp(argv[i], "--node-rank") == 0      ? &req.node_rank
                                : strcmp(argv[i], "--master-addr") == 0    ? &req.master_addr
                                : strcmp(argv[i], "--master-port") == 0    ? &req.master_port
                                                                           : NULL;
            if (slot) *slot = argv[++i];
        }
        /* The children run `comm_check ARGS`: the launch leaves out its own flags, this one goes here. */
        argv[1] = argv[0];
        zt_error err;
        if (zt_launch_start(&req, ZT_NPROC_FORK, argc - 1, argv + 1, &err) != ZT_OK) {
            fprintf(stderr, "comm_check: error: %s\n", err.msg);
            return 1;
        }
        return 0; /* one rank in all: nothing started */
    }
    if (argc == 3 && strcmp(argv[1], "fork-child") == 0) return run_fork_child(argv[2]);
    const char *nproc = argc >= 3 && strcmp(argv[1], "--nproc") == 0          ? argv[2]
                        : argc >= 2 && strncmp(argv[1], "--nproc=", 8) == 0 ? argv[1] + 8
                                                                            : NULL;
    if (nproc) {
        zt_error err;
        if (zt_launch_local(nproc, argc, argv, &err) != ZT_OK) {
            fprintf(stderr, "comm_check: error: %s\n", err.msg);
            return 1;
        }
        return run_launched("1"); /* --nproc 1: the run stays in this process */
    }
    if (argc == 2 && strcmp(argv[1], "collectives") == 0) return run_collectives();
    if (argc == 2 && (strcmp(argv[1], "skip") == 0 || strcmp(argv[1], "skip-group") == 0 ||
                      strcmp(argv[1], "kill") == 0 || strcmp(argv[1], "fail-alone") == 0))
        return run_stuck(argv[1]);
    if (argc == 3 && strcmp(argv[1], "launched") == 0) return run_launched(argv[2]);
    fprintf(stderr, "usage: comm_check collectives | skip | skip-group | kill | fail-alone | launched N | "
                    "--nproc N ARGS...\n");
    return 2;
}
