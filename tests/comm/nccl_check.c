/* The NCCL backend (framework/dist/comm_nccl.c) through the runtime, on 2 GPUs: every collective on
 * device buffers, compared with values this program computes on the host from each member's world
 * rank (never from another rank's output); outputs are poisoned (0xff bytes) before each call.
 *
 *   nccl_check --nproc N MODE   starts N GPU ranks running `nccl_check MODE` the way zt-run --nproc
 *                               does (zt_launch_local_mode ZT_NPROC_GPU). Exit 77 with fewer GPUs.
 *   nccl_check collectives      all_reduce (F32 SUM/AVG/MAX/MIN, BF16, F16, I32, I64, U8, U32),
 *                               reduce_scatter and all_gather (F32, BF16; in and out of place),
 *                               broadcast from each root, send/recv, barrier, on "world", on "pair"
 *                               (world ranks [1, 0]) and on a one-rank group; counts 1, 1023, 4097
 *                               and 2^20; a U16 reduction is refused with a message.
 *   nccl_check skip             the watchdog: rank 1 never joins all_reduce #3 (comm.timeout_s = 3);
 *                               rank 0 must end with the watchdog's message.
 *   nccl_check kill             rank 1 dies by SIGKILL before all_reduce #3.
 *   nccl_check launched N [T]   one all_reduce of the ranks' numbers in a job that must have N ranks
 *                               (torchrun-style variables, or mpirun: gpu2.sh starts those), with
 *                               comm.timeout_s = T (default 60).
 * gpu2.sh runs them all and prints PASS/FAIL per check.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "dist/launch.h"
#include "device/device.h"
#include "host/runtime.h"
#include "ztest.h"

static int g_rank;
static zt_runtime *g_rt;
static const zt_host *g_h;
static void *g_stream; /* the compute stream: the copies below are ordered on it too */

typedef struct group_under_test {
    const char *name;
    int32_t ranks[4];
    int32_t n, me; /* members (world ranks, in group order), this rank's index */
    zt_group g;
} group_under_test;

/* ---- exact values per (world rank, index) ----------------------------------------------------- */

static float f32_value(int r, uint64_t i) { return (float)((r + 1) * 0.25 + (double)(i % 17) - 8.0); }
static float small_int(int r, uint64_t i) { return (float)((int)((r * 5 + i) % 9) - 4 + r); } /* exact in 16 bits */
static int32_t i32_value(int r, uint64_t i) { return (r - 1) * 1000 - (int32_t)(i % 500) + 7; }
static int64_t i64_value(int r, uint64_t i) { return ((int64_t)(r + 1) << 40) + (int64_t)i; }
static uint8_t u8_value(int r, uint64_t i) { return (uint8_t)((r * 3 + i) % 50); }
static uint32_t u32_value(int r, uint64_t i) { return 1000000000u + (uint32_t)r + (uint32_t)(i % 3); }

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* the values are exact in bf16: no rounding needed */
}
static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* IEEE half for small integers (|x| < 2048, exact). */
static uint16_t to_f16(float f)
{
    if (f == 0) return 0;
    uint16_t sign = f < 0 ? 0x8000 : 0;
    float a = fabsf(f);
    int e = 0;
    while (a >= 2.0f) a /= 2, e++;
    while (a < 1.0f) a *= 2, e--;
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((a - 1.0f) * 1024.0f));
}
static float from_f16(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    float m = (float)(h & 0x3ff) / 1024.0f;
    float v = e == 0 ? ldexpf(m, -14) : ldexpf(1.0f + m, e - 15);
    return h & 0x8000 ? -v : v;
}

/* ---- device buffers --------------------------------------------------------------------------- */

static void *dev_alloc(uint64_t bytes)
{
    void *p = g_h->alloc(g_h->ctx, ZT_POOL_COMM, ZT_MEM_DEVICE, bytes ? bytes : 1, 0, "nccl_check");
    if (!p) {
        zt_status st;
        fprintf(stderr, "rank %d: device alloc of %llu bytes: %s\n", g_rank, (unsigned long long)bytes,
                zt_runtime_take_error(g_h, &st));
        exit(1);
    }
    return p;
}

static void copy(void *dst, const void *src, uint64_t bytes)
{
    zt_error err;
    if (zt_runtime_memcpy(g_rt, dst, src, bytes, &err) != ZT_OK || zt_runtime_sync(g_rt, &err) != ZT_OK) {
        fprintf(stderr, "rank %d: copy: %s\n", g_rank, err.msg);
        exit(1);
    }
}

static void poison(void *dev, uint64_t bytes)
{
    void *host = malloc(bytes);
    memset(host, 0xff, bytes);
    copy(dev, host, bytes);
    free(host);
}

static void expect_ok(zt_status st, const char *what, const group_under_test *t)
{
    if (st == ZT_OK) return;
    zt_status recorded;
    fprintf(stderr, "rank %d: %s on group '%s' failed: %s\n", g_rank, what, t->name, zt_runtime_take_error(g_h, &recorded));
    zt_test_failures++;
}

/* Compares n values; reports the first few differences. */
static void expect_values(const char *what, const group_under_test *t, uint64_t count, const double *got,
                          const double *want)
{
    int bad = 0;
    for (uint64_t i = 0; i < count; i++)
        if (!(got[i] == want[i])) {
            if (bad++ < 3)
                fprintf(stderr, "rank %d: %s on '%s' (count %llu): element %llu is %.9g, expected %.9g\n", g_rank,
                        what, t->name, (unsigned long long)count, (unsigned long long)i, got[i], want[i]);
        }
    if (bad) zt_test_failures++;
}

/* ---- host <-> typed buffers ------------------------------------------------------------------- */

static uint64_t dsize(int32_t dtype)
{
    return dtype == ZT_BF16 || dtype == ZT_F16 || dtype == ZT_U16 ? 2 : dtype == ZT_I64 ? 8 : dtype == ZT_U8 ? 1 : 4;
}

static double gen(int32_t dtype, int r, uint64_t i, int op)
{
    switch (dtype) {
    case ZT_F32: return op == ZT_REDUCE_MAX || op == ZT_REDUCE_MIN ? small_int(r, i) : f32_value(r, i);
    case ZT_BF16: case ZT_F16: return small_int(r, i);
    case ZT_I32: return i32_value(r, i);
    case ZT_I64: return (double)i64_value(r, i);
    case ZT_U8: return u8_value(r, i);
    case ZT_U16: return (double)(60000 - 1000 * r - (int)(i % 1000)); /* moved as bits, never added */
    default: return u32_value(r, i);
    }
}

static void store(int32_t dtype, void *buf, uint64_t i, double v)
{
    switch (dtype) {
    case ZT_F32: ((float *)buf)[i] = (float)v; break;
    case ZT_BF16: ((uint16_t *)buf)[i] = to_bf16((float)v); break;
    case ZT_F16: ((uint16_t *)buf)[i] = to_f16((float)v); break;
    case ZT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ZT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ZT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case ZT_U16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    default: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    }
}

static double load(int32_t dtype, const void *buf, uint64_t i)
{
    switch (dtype) {
    case ZT_F32: return ((const float *)buf)[i];
    case ZT_BF16: return from_bf16(((const uint16_t *)buf)[i]);
    case ZT_F16: return from_f16(((const uint16_t *)buf)[i]);
    case ZT_I32: return ((const int32_t *)buf)[i];
    case ZT_I64: return (double)((const int64_t *)buf)[i];
    case ZT_U8: return ((const uint8_t *)buf)[i];
    case ZT_U16: return ((const uint16_t *)buf)[i];
    default: return ((const uint32_t *)buf)[i];
    }
}

/* i64 values exceed double's exact range only beyond 2^53: (r+1)<<40 + i is well inside. */
static double reduce_expect(const group_under_test *t, int32_t dtype, int op, uint64_t i)
{
    double acc = gen(dtype, t->ranks[0], i, op);
    for (int32_t m = 1; m < t->n; m++) {
        double v = gen(dtype, t->ranks[m], i, op);
        acc = op == ZT_REDUCE_MAX ? fmax(acc, v) : op == ZT_REDUCE_MIN ? fmin(acc, v) : acc + v;
    }
    if (op == ZT_REDUCE_AVG) acc /= t->n;
    return acc;
}

/* ---- the collectives -------------------------------------------------------------------------- */

static void check_all_reduce(group_under_test *t, uint64_t count, int32_t dtype, int op, int in_place)
{
    uint64_t bytes = count * dsize(dtype);
    void *host = malloc(bytes);
    double *got = malloc(count * sizeof *got), *want = malloc(count * sizeof *want);
    for (uint64_t i = 0; i < count; i++) store(dtype, host, i, gen(dtype, g_rank, i, op));
    void *send = dev_alloc(bytes), *recv = in_place ? send : dev_alloc(bytes);
    copy(send, host, bytes);
    if (!in_place) poison(recv, bytes);
    expect_ok(g_h->all_reduce(g_h->ctx, &t->g, send, recv, count, dtype, op, g_stream), "all_reduce", t);
    memset(host, 0, bytes);
    copy(host, recv, bytes);
    for (uint64_t i = 0; i < count; i++) {
        got[i] = load(dtype, host, i);
        want[i] = reduce_expect(t, dtype, op, i);
    }
    char what[64];
    snprintf(what, sizeof what, "all_reduce dtype %d op %d%s", dtype, op, in_place ? " in place" : "");
    expect_values(what, t, count, got, want);
    if (!in_place) g_h->free(g_h->ctx, recv);
    g_h->free(g_h->ctx, send);
    free(host), free(got), free(want);
}

/* send holds n * count elements: element j of this rank is gen(rank, j). */
static void check_reduce_scatter(group_under_test *t, uint64_t count, int32_t dtype, int in_place)
{
    uint64_t total = count * (uint64_t)t->n, es = dsize(dtype);
    void *host = malloc(total * es);
    double *got = malloc(count * sizeof *got), *want = malloc(count * sizeof *want);
    for (uint64_t j = 0; j < total; j++) store(dtype, host, j, gen(dtype, g_rank, j, ZT_REDUCE_SUM));
    void *send = dev_alloc(total * es), *recv = in_place ? send : dev_alloc(count * es);
    copy(send, host, total * es);
    if (!in_place) poison(recv, count * es);
    expect_ok(g_h->reduce_scatter(g_h->ctx, &t->g, send, recv, count, dtype, ZT_REDUCE_SUM, g_stream),
              "reduce_scatter", t);
    copy(host, recv, count * es);
    for (uint64_t i = 0; i < count; i++) {
        got[i] = load(dtype, host, i);
        want[i] = reduce_expect(t, dtype, ZT_REDUCE_SUM, (uint64_t)t->me * count + i);
    }
    expect_values(in_place ? "reduce_scatter in place" : "reduce_scatter", t, count, got, want);
    if (!in_place) g_h->free(g_h->ctx, recv);
    g_h->free(g_h->ctx, send);
    free(host), free(got), free(want);
}

/* In place: this rank's count elements at the start of the n * count buffer. */
static void check_all_gather(group_under_test *t, uint64_t count, int32_t dtype, int in_place)
{
    uint64_t total = count * (uint64_t)t->n, es = dsize(dtype);
    void *host = malloc(total * es);
    double *got = malloc(total * sizeof *got), *want = malloc(total * sizeof *want);
    for (uint64_t i = 0; i < count; i++) store(dtype, host, i, gen(dtype, g_rank, i, ZT_REDUCE_SUM));
    void *recv = dev_alloc(total * es), *send = in_place ? recv : dev_alloc(count * es);
    poison(recv, total * es);
    copy(send, host, count * es);
    expect_ok(g_h->all_gather(g_h->ctx, &t->g, send, recv, count, dtype, g_stream), "all_gather", t);
    copy(host, recv, total * es);
    for (int32_t m = 0; m < t->n; m++)
        for (uint64_t i = 0; i < count; i++) {
            got[(uint64_t)m * count + i] = load(dtype, host, (uint64_t)m * count + i);
            want[(uint64_t)m * count + i] = gen(dtype, t->ranks[m], i, ZT_REDUCE_SUM);
        }
    expect_values(in_place ? "all_gather in place" : "all_gather", t, total, got, want);
    if (!in_place) g_h->free(g_h->ctx, send);
    g_h->free(g_h->ctx, recv);
    free(host), free(got), free(want);
}

static void check_broadcast(group_under_test *t, uint64_t count, int32_t dtype, int root)
{
    uint64_t bytes = count * dsize(dtype);
    void *host = malloc(bytes);
    double *got = malloc(count * sizeof *got), *want = malloc(count * sizeof *want);
    void *buf = dev_alloc(bytes);
    if (t->me == root) {
        for (uint64_t i = 0; i < count; i++) store(dtype, host, i, gen(dtype, g_rank, i, ZT_REDUCE_SUM));
        copy(buf, host, bytes);
    } else {
        poison(buf, bytes);
    }
    expect_ok(g_h->broadcast(g_h->ctx, &t->g, buf, count, dtype, root, g_stream), "broadcast", t);
    copy(host, buf, bytes);
    for (uint64_t i = 0; i < count; i++) {
        got[i] = load(dtype, host, i);
        want[i] = gen(dtype, t->ranks[root], i, ZT_REDUCE_SUM);
    }
    expect_values("broadcast", t, count, got, want);
    g_h->free(g_h->ctx, buf);
    free(host), free(got), free(want);
}

/* Group rank 0 sends to group rank 1, then back. */
static void check_send_recv(group_under_test *t, uint64_t count)
{
    if (t->n < 2) return;
    uint64_t bytes = count * 4;
    float *host = malloc(bytes);
    double *got = malloc(count * sizeof *got), *want = malloc(count * sizeof *want);
    float *buf = dev_alloc(bytes);
    for (int dir = 0; dir < 2; dir++) {
        int sender = dir, receiver = 1 - dir;
        if (t->me == sender) {
            for (uint64_t i = 0; i < count; i++) host[i] = f32_value(g_rank, i);
            copy(buf, host, bytes);
            expect_ok(g_h->send(g_h->ctx, &t->g, buf, count, ZT_F32, receiver, g_stream), "send", t);
            zt_error err;
            zt_runtime_sync(g_rt, &err);
        } else if (t->me == receiver) {
            poison(buf, bytes);
            expect_ok(g_h->recv(g_h->ctx, &t->g, buf, count, ZT_F32, sender, g_stream), "recv", t);
            copy(host, buf, bytes);
            for (uint64_t i = 0; i < count; i++) {
                got[i] = host[i];
                want[i] = f32_value(t->ranks[sender], i);
            }
            expect_values("send/recv", t, count, got, want);
        }
    }
    g_h->free(g_h->ctx, buf);
    free(host), free(got), free(want);
}

static void check_group(group_under_test *t)
{
    static const uint64_t counts[] = {1, 1023, 4097, 1u << 20};
    for (int c = 0; c < 4; c++) {
        uint64_t n = counts[c];
        for (int in_place = 0; in_place < 2; in_place++) {
            check_all_reduce(t, n, ZT_F32, ZT_REDUCE_SUM, in_place);
            check_all_reduce(t, n, ZT_BF16, ZT_REDUCE_SUM, in_place);
            check_reduce_scatter(t, n, ZT_F32, in_place);
            check_reduce_scatter(t, n, ZT_BF16, in_place);
            check_all_gather(t, n, ZT_F32, in_place);
            check_all_gather(t, n, ZT_BF16, in_place);
        }
        check_broadcast(t, n, ZT_F32, t->n - 1);
        check_broadcast(t, n, ZT_BF16, 0);
        check_send_recv(t, n);
    }
    check_all_reduce(t, 4097, ZT_F32, ZT_REDUCE_AVG, 0);
    check_all_reduce(t, 4097, ZT_F32, ZT_REDUCE_MAX, 1);
    check_all_reduce(t, 4097, ZT_F32, ZT_REDUCE_MIN, 0);
    check_all_reduce(t, 1023, ZT_F16, ZT_REDUCE_SUM, 0);
    check_all_reduce(t, 1023, ZT_BF16, ZT_REDUCE_MAX, 0);
    check_all_reduce(t, 1023, ZT_I32, ZT_REDUCE_SUM, 0);
    check_all_reduce(t, 1023, ZT_I64, ZT_REDUCE_SUM, 1);
    check_all_reduce(t, 1023, ZT_U8, ZT_REDUCE_MAX, 0);
    check_all_reduce(t, 1023, ZT_U32, ZT_REDUCE_SUM, 0);
    expect_ok(g_h->barrier(g_h->ctx, &t->g), "barrier", t);
    expect_ok(g_h->all_reduce(g_h->ctx, &t->g, NULL, NULL, 0, ZT_F32, ZT_REDUCE_SUM, g_stream), "all_reduce of 0", t);
}

/* ---- runs ------------------------------------------------------------------------------------- */

static zt_config *g_cfg;

static void start(double timeout_s)
{
    zt_error err;
    g_cfg = zt_config_new();
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    char assignment[64];
    snprintf(assignment, sizeof assignment, "comm.timeout_s=%g", timeout_s);
    zt_runtime_options opt = {.n_threads = 1, .device_type = ZT_DEVICE_CUDA, .comm_timeout_s = timeout_s};
    if (zt_config_add_schema(g_cfg, "host", host_opts, n_host, &err) != ZT_OK ||
        zt_config_set(g_cfg, assignment, &err) != ZT_OK || zt_runtime_create(&opt, g_cfg, &g_rt, &err) != ZT_OK) {
        fprintf(stderr, "nccl_check: cannot start: %s\n", err.msg);
        exit(1);
    }
    g_h = zt_runtime_host(g_rt, "nccl_check", NULL, 0);
    g_rank = g_h->world_rank;
    g_stream = g_h->device->compute_stream;
}

static void stop(void)
{
    zt_runtime_destroy(g_rt);
    zt_config_free(g_cfg);
}

static void make_group(group_under_test *t)
{
    t->me = -1;
    for (int32_t m = 0; m < t->n; m++)
        if (t->ranks[m] == g_rank) t->me = m;
    if (strcmp(t->name, "world") == 0) expect_ok(g_h->group_get(g_h->ctx, "world", &t->g), "group_get", t);
    else expect_ok(g_h->group_create(g_h->ctx, t->name, t->ranks, t->n, &t->g), "group_create", t);
}

static int run_collectives(void)
{
    start(120);
    if (g_h->world_size != 2) ZT_SKIP("nccl_check collectives runs on exactly 2 ranks, not %d", g_h->world_size);
    group_under_test world = {.name = "world", .ranks = {0, 1}, .n = 2};
    group_under_test pair = {.name = "pair", .ranks = {1, 0}, .n = 2};
    group_under_test solo = {.name = "solo", .ranks = {g_rank}, .n = 1};
    make_group(&world);
    make_group(&pair);
    make_group(&solo);
    check_group(&world);
    check_group(&pair);
    check_group(&solo);
    /* NCCL has no 16-bit unsigned type to add with. */
    uint16_t *u16 = dev_alloc(8);
    zt_status st = g_h->all_reduce(g_h->ctx, &world.g, u16, u16, 4, ZT_U16, ZT_REDUCE_SUM, g_stream);
    zt_status recorded;
    const char *msg = zt_runtime_take_error(g_h, &recorded);
    ZT_CHECK(st != ZT_OK);
    ZT_CHECK_CONTAINS(msg, "NCCL has no 16-bit unsigned integer type");
    g_h->free(g_h->ctx, u16);
    /* Moving U16 is fine: NCCL carries it as 16-bit floats' bits, unchanged even where they are NaN. */
    check_broadcast(&world, 1001, ZT_U16, 1);
    check_all_gather(&world, 1001, ZT_U16, 0);
    stop();
    printf("rank %d: nccl_check collectives %s\n", g_rank, zt_test_failures ? "FAILED" : "passed");
    return zt_test_result();
}

static int run_stuck(const char *mode)
{
    start(strcmp(mode, "kill") == 0 ? 20 : 3);
    zt_group world;
    g_h->group_get(g_h->ctx, "world", &world);
    float *x = dev_alloc(4);
    float one = 1;
    for (int call = 1; call <= 3; call++) {
        if (call == 3 && g_rank == 1) {
            if (strcmp(mode, "kill") == 0) {
                struct timespec half = {0, 500 * 1000 * 1000};
                nanosleep(&half, NULL);
                raise(SIGKILL);
            }
            sleep(60); /* "stuck elsewhere" */
        }
        copy(x, &one, 4);
        zt_status st = g_h->all_reduce(g_h->ctx, &world, x, x, 1, ZT_F32, ZT_REDUCE_SUM, g_stream);
        if (st != ZT_OK) {
            zt_status recorded;
            fprintf(stderr, "rank %d: all_reduce: %s\n", g_rank, zt_runtime_take_error(g_h, &recorded));
            return 1;
        }
        copy(&one, x, 4); /* waits for the all_reduce */
    }
    fprintf(stderr, "rank %d: the job was not ended\n", g_rank);
    return 1;
}

static int run_launched(const char *expected, double timeout_s)
{
    start(timeout_s);
    zt_group world;
    g_h->group_get(g_h->ctx, "world", &world);
    int64_t mine = g_rank, *dev = dev_alloc(8);
    copy(dev, &mine, 8);
    zt_status st = g_h->all_reduce(g_h->ctx, &world, dev, dev, 1, ZT_I64, ZT_REDUCE_SUM, g_stream);
    if (st != ZT_OK) {
        zt_status recorded;
        fprintf(stderr, "rank %d: all_reduce: %s\n", g_rank, zt_runtime_take_error(g_h, &recorded));
        return 1;
    }
    copy(&mine, dev, 8);
    ZT_CHECK_INT(g_h->world_size, atoi(expected));
    ZT_CHECK_INT(mine, (int64_t)g_h->world_size * (g_h->world_size - 1) / 2);
    printf("rank %d of %d: sum of ranks %lld on GPU %d\n", g_rank, g_h->world_size, (long long)mine,
           g_h->device->device_index);
    g_h->free(g_h->ctx, dev);
    stop();
    return zt_test_result();
}

int main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "--nproc") == 0) {
        int n_gpus = 0;
        zt_error err;
        if (zt_device_cuda_count(&n_gpus, &err) != ZT_OK) ZT_SKIP("no usable GPU: %s", err.msg);
        if (n_gpus < atoi(argv[2])) ZT_SKIP("%s ranks need %s GPUs; this machine has %d", argv[2], argv[2], n_gpus);
        if (zt_launch_local_mode(argv[2], ZT_NPROC_GPU, argc, argv, &err) != ZT_OK) {
            fprintf(stderr, "nccl_check: error: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "collectives") == 0) return run_collectives();
    if (argc == 2 && (strcmp(argv[1], "skip") == 0 || strcmp(argv[1], "kill") == 0)) return run_stuck(argv[1]);
    if ((argc == 3 || argc == 4) && strcmp(argv[1], "launched") == 0)
        return run_launched(argv[2], argc == 4 ? atof(argv[3]) : 60);
    fprintf(stderr, "usage: nccl_check --nproc N MODE | collectives | skip | kill | launched N [TIMEOUT_S]\n");
    return 2;
}
