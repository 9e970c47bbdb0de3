/* The host-staged communicator (dist/comm_host_staged.c: GPU ranks over MPI, comm.backend = mpi) on
 * CPU ranks under mpirun: the MPI backend wrapped around the CPU device backend, so every call goes
 * through the staging and its 16-bit reductions through fp32, the same code a GPU run takes with the
 * CUDA device backend. Each result is checked against values this rank computes itself:
 *   all_reduce   bf16 and fp16 SUM (each rank's values widened, summed in fp32, rounded once) and
 *                MAX, fp32 SUM, in place and apart
 *   reduce_scatter, all_gather, broadcast (bf16), send/recv (fp32 ring), barrier
 *   mpirun -np N test_host_staged   (N >= 2)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/f16.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "ztest.h"

static int rank, world;

static float bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) /* round to nearest even (finite values) */
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* A value of (rank, i) that bf16 and fp16 hold inexactly when summed: the fp32 sum rounds once. */
static float value(int r, uint64_t i) { return (float)(0.1 * (r + 1) + 0.37 * (double)(i % 23) - 3.0); }

static void check_half_reduce(zt_comm_backend *b, void *comm, int32_t dtype, int32_t op, uint64_t n, int in_place)
{
    uint16_t *send = malloc(n * 2), *recv = malloc(n * 2);
    for (uint64_t i = 0; i < n; i++) {
        float v = value(rank, i);
        send[i] = dtype == ZT_BF16 ? f32_to_bf16(v) : zt_f16_bits_from_f32(v);
    }
    zt_error err = {0};
    zt_status st = b->all_reduce(b, comm, send, in_place ? send : recv, n, dtype, op, NULL, &err);
    ZT_CHECK_MSG(st == ZT_OK, "all_reduce %s: %s", zt_comm_dtype_name(dtype), err.msg);
    const uint16_t *got = in_place ? send : recv;
    for (uint64_t i = 0; st == ZT_OK && i < n; i++) {
        float acc = op == ZT_REDUCE_MAX ? -INFINITY : 0.0f;
        for (int r = 0; r < world; r++) {
            float v = value(r, i);
            v = dtype == ZT_BF16 ? bf16_to_f32(f32_to_bf16(v)) : zt_f32_from_f16_bits(zt_f16_bits_from_f32(v));
            acc = op == ZT_REDUCE_MAX ? fmaxf(acc, v) : acc + v;
        }
        uint16_t want = dtype == ZT_BF16 ? f32_to_bf16(acc) : zt_f16_bits_from_f32(acc);
        if (got[i] != want) {
            ZT_CHECK_MSG(0, "all_reduce %s op %d element %llu: 0x%04x, want 0x%04x (the fp32 result rounded once)",
                  zt_comm_dtype_name(dtype), (int)op, (unsigned long long)i, got[i], want);
            break;
        }
    }
    free(send);
    free(recv);
}

static void check_f32_and_moves(zt_comm_backend *b, void *comm, uint64_t n)
{
    zt_error err = {0};
    float *x = malloc(n * world * sizeof *x), *y = malloc(n * world * sizeof *y);
    for (uint64_t i = 0; i < n; i++) x[i] = value(rank, i);
    ZT_CHECK_MSG(b->all_reduce(b, comm, x, y, n, ZT_F32, ZT_REDUCE_SUM, NULL, &err) == ZT_OK, "all_reduce F32: %s", err.msg);
    for (uint64_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < world; r++) want += value(r, i);
        if (y[i] != want) {
            ZT_CHECK_MSG(0, "all_reduce F32 element %llu: %g, want %g", (unsigned long long)i, y[i], want);
            break;
        }
    }
    /* reduce_scatter of bf16: rank r gets block r of the sums, rounded once */
    uint16_t *h = malloc(n * world * 2), *hs = malloc(n * 2);
    for (uint64_t i = 0; i < n * world; i++) h[i] = f32_to_bf16(value(rank, i));
    ZT_CHECK_MSG(b->reduce_scatter(b, comm, h, hs, n, ZT_BF16, ZT_REDUCE_SUM, NULL, &err) == ZT_OK, "reduce_scatter: %s",
          err.msg);
    for (uint64_t i = 0; i < n; i++) {
        float acc = 0;
        for (int r = 0; r < world; r++) acc += bf16_to_f32(f32_to_bf16(value(r, rank * n + i)));
        if (hs[i] != f32_to_bf16(acc)) {
            ZT_CHECK_MSG(0, "reduce_scatter element %llu: 0x%04x, want 0x%04x", (unsigned long long)i, hs[i], f32_to_bf16(acc));
            break;
        }
    }
    /* all_gather of bf16: the bits of every rank's block, in rank order */
    for (uint64_t i = 0; i < n; i++) hs[i] = (uint16_t)(rank * 1000 + i % 1000);
    ZT_CHECK_MSG(b->all_gather(b, comm, hs, h, n, ZT_BF16, NULL, &err) == ZT_OK, "all_gather: %s", err.msg);
    for (int r = 0; r < world; r++)
        for (uint64_t i = 0; i < n; i++)
            if (h[r * n + i] != (uint16_t)(r * 1000 + i % 1000)) {
                ZT_CHECK_MSG(0, "all_gather: rank %d's element %llu is 0x%04x", r, (unsigned long long)i, h[r * n + i]);
                r = world;
                break;
            }
    /* broadcast from the last rank */
    for (uint64_t i = 0; i < n; i++) hs[i] = (uint16_t)(rank + 7 * i);
    ZT_CHECK_MSG(b->broadcast(b, comm, hs, n, ZT_BF16, world - 1, NULL, &err) == ZT_OK, "broadcast: %s", err.msg);
    for (uint64_t i = 0; i < n; i++)
        if (hs[i] != (uint16_t)(world - 1 + 7 * i)) {
            ZT_CHECK_MSG(0, "broadcast element %llu: 0x%04x", (unsigned long long)i, hs[i]);
            break;
        }
    /* a ring of sends: even ranks send first, odd ones receive first */
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    for (uint64_t i = 0; i < n; i++) x[i] = (float)(rank * 10000 + i);
    zt_status st1, st2;
    if (rank % 2 == 0) {
        st1 = b->send(b, comm, x, n, ZT_F32, next, NULL, &err);
        st2 = b->recv(b, comm, y, n, ZT_F32, prev, NULL, &err);
    } else {
        st2 = b->recv(b, comm, y, n, ZT_F32, prev, NULL, &err);
        st1 = b->send(b, comm, x, n, ZT_F32, next, NULL, &err);
    }
    ZT_CHECK_MSG(st1 == ZT_OK && st2 == ZT_OK, "send/recv: %s", err.msg);
    for (uint64_t i = 0; i < n; i++)
        if (y[i] != (float)(prev * 10000 + i)) {
            ZT_CHECK_MSG(0, "recv element %llu: %g from rank %d", (unsigned long long)i, y[i], prev);
            break;
        }
    ZT_CHECK_MSG(b->barrier(b, comm, &err) == ZT_OK, "barrier: %s", err.msg);
    free(x), free(y), free(h), free(hs);
}

int main(void)
{
    zt_error err = {0};
    zt_launch launch;
    if (zt_launch_detect(&launch, &err) != ZT_OK || launch.world_size < 2) {
        fprintf(stderr, "test_host_staged runs under mpirun -np 2 or more (%s)\n", err.msg);
        return 77;
    }
    rank = launch.rank;
    zt_test_set_rank(rank);
    world = launch.world_size;
    zt_device_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    zt_comm_backend *mpi = NULL, *b = NULL;
    if (zt_device_cpu.init(0, &ctx, &err) != ZT_OK ||
        zt_launch_comm_create(&launch, ZT_DEVICE_CPU, 60, &mpi, &err) != ZT_OK ||
        zt_comm_host_staged_create(mpi, &zt_device_cpu, &ctx, &b, &err) != ZT_OK) {
        fprintf(stderr, "rank %d: FAIL: cannot start: %s\n", rank, err.msg);
        return 1;
    }
    int32_t *all = malloc((size_t)world * sizeof *all);
    for (int r = 0; r < world; r++) all[r] = r;
    void *comm = NULL;
    if (b->group_create(b, "world", all, world, &comm, &err) != ZT_OK) {
        fprintf(stderr, "rank %d: FAIL: group_create: %s\n", rank, err.msg);
        return 1;
    }
    for (int in_place = 0; in_place < 2; in_place++) {
        check_half_reduce(b, comm, ZT_BF16, ZT_REDUCE_SUM, 1000, in_place);
        check_half_reduce(b, comm, ZT_F16, ZT_REDUCE_SUM, 1000, in_place);
        check_half_reduce(b, comm, ZT_BF16, ZT_REDUCE_MAX, 333, in_place);
    }
    check_f32_and_moves(b, comm, 777);
    b->group_destroy(b, comm);
    b->destroy(b);
    free(all);
    if (rank == 0) printf("host-staged collectives on %d ranks: %s\n", world, zt_test_failures ? "FAIL" : "ok");
    return zt_test_failures ? 1 : 0;
}
