/* GPU ranks over a host transport (comm.backend = mpi on a CUDA run): every collective copies its
 * buffers, device or host, into host memory, runs on the CPU backend (MPI) there and copies the
 * result back, ordered on the call's stream (a wait before and after). It is what torch.distributed's
 * gloo backend does with CUDA tensors: far slower than NCCL, for machines without NCCL and for
 * several ranks sharing one GPU, which NCCL refuses (tests/gpu/tp_one_gpu.sh runs tensor and
 * pipeline parallel that way on one GPU). MPI reduces no 16-bit floats, so bf16 and fp16
 * reductions go through fp32 here: each rank's contribution widened, the reduced value rounded once
 * (NCCL sums in the 16-bit type; the result is at least as exact). See comm.h. */
#include "dist/comm.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/f16.h"

typedef struct staged_group {
    void *inner;
    int32_t size;
} staged_group;

typedef struct staged_backend {
    zt_comm_backend base; /* first, so a zt_comm_backend * is a staged_backend * */
    zt_comm_backend *inner;
    const zt_device_backend *device;
    const zt_device_ctx *device_ctx;
    void *buf[2]; /* host staging: [0] the send side, [1] the receive side */
    uint64_t cap[2];
} staged_backend;

static void *reserve(staged_backend *b, int which, uint64_t bytes, zt_error *err)
{
    if (bytes <= b->cap[which]) return b->buf[which];
    void *p = realloc(b->buf[which], bytes);
    if (!p) {
        zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of host memory for %llu bytes of collective staging",
                     (unsigned long long)bytes);
        return NULL;
    }
    b->buf[which] = p;
    b->cap[which] = bytes;
    return p;
}

/* dst <- src through the device backend, finished on return (either side may be device memory). */
static zt_status copy_done(staged_backend *b, void *dst, const void *src, uint64_t bytes, void *stream,
                           zt_error *err)
{
    if (!bytes) return ZT_OK;
    zt_status st = b->device->memcpy(b->device_ctx, dst, src, bytes, stream, err);
    return st == ZT_OK ? b->device->sync(b->device_ctx, stream, err) : st;
}

static int is_half(int32_t dtype)
{
    return dtype == ZT_BF16 || dtype == ZT_F16;
}

static float widen(int32_t dtype, uint16_t h)
{
    return dtype == ZT_F16 ? zt_f32_from_f16_bits(h) : zt_f32_from_bf16_bits(h);
}

static uint16_t narrow(int32_t dtype, float f)
{
    return dtype == ZT_F16 ? zt_f16_bits_from_f32(f) : zt_bf16_bits_from_f32(f);
}

/* The send side in host memory (fp32 for a 16-bit reduction), after the stream's work is done. */
static void *stage_in(staged_backend *b, const void *src, uint64_t count, int32_t dtype, int reduce, void *stream,
                      zt_error *err)
{
    uint64_t elem = zt_comm_element_size(dtype), bytes = count * elem;
    int widened = reduce && is_half(dtype);
    void *host = reserve(b, 0, widened ? count * 4 + bytes : bytes, err);
    if (!host) return NULL;
    uint16_t *raw = widened ? (uint16_t *)((char *)host + count * 4) : host;
    if (b->device->sync(b->device_ctx, stream, err) != ZT_OK || copy_done(b, raw, src, bytes, stream, err) != ZT_OK)
        return NULL;
    if (widened)
        for (uint64_t i = 0; i < count; i++) ((float *)host)[i] = widen(dtype, raw[i]);
    return host;
}

/* The receive side back where the caller wants it (rounded back for a 16-bit reduction). */
static zt_status stage_out(staged_backend *b, void *dst, void *host, uint64_t count, int32_t dtype, int reduce,
                           void *stream, zt_error *err)
{
    if (reduce && is_half(dtype)) {
        uint16_t *raw = host; /* in place: element i's 2 bytes never pass float i + 1's */
        for (uint64_t i = 0; i < count; i++) raw[i] = narrow(dtype, ((float *)host)[i]);
    }
    return copy_done(b, dst, host, count * zt_comm_element_size(dtype), stream, err);
}

static int32_t wire_type(int32_t dtype, int reduce)
{
    return reduce && is_half(dtype) ? ZT_F32 : dtype;
}

static zt_status staged_group_create(zt_comm_backend *self, const char *name, const int32_t *world_ranks, int32_t n,
                                     void **comm_out, zt_error *err)
{
    staged_backend *b = (staged_backend *)self;
    staged_group *g = calloc(1, sizeof *g);
    if (!g) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating group '%s'", name);
    zt_status st = b->inner->group_create(b->inner, name, world_ranks, n, &g->inner, err);
    if (st != ZT_OK) {
        free(g);
        return st;
    }
    g->size = n;
    *comm_out = g;
    return ZT_OK;
}

static void staged_group_destroy(zt_comm_backend *self, void *comm)
{
    staged_backend *b = (staged_backend *)self;
    staged_group *g = comm;
    if (!g) return;
    b->inner->group_destroy(b->inner, g->inner);
    free(g);
}

static zt_status staged_all_reduce(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                   int32_t dtype, int32_t op, void *stream, zt_error *err)
{
    staged_backend *b = (staged_backend *)self;
    staged_group *g = comm;
    void *host = stage_in(b, send, count, dtype, 1, stream, err);
    if (!host) return err && err->status ? err->status : ZT_ERR_INTERNAL;
    zt_status st = b->inner->all_reduce(b->inner, g->inner, host, host, count, wire_type(dtype, 1), op, NULL, err);
    return st == ZT_OK ? stage_out(b, recv, host, count, dtype, 1, stream, err) : st;
}

static zt_status staged_reduce_scatter(zt_comm_backend *self, void *comm, const void *send, void *recv,
                                       uint64_t count, int32_t dtype, int32_t op, void *stream, zt_error *err)
{
    staged_backend *b = (staged_backend *)self;
    staged_group *g = comm;
    void *host = stage_in(b, send, count * (uint64_t)g->size, dtype, 1, stream, err);
    if (!host) return err && err->status ? err->status : ZT_ERR_INTERNAL;
    int32_t wire = wire_type(dtype, 1);
    void *out = reserve(b, 1, count * zt_comm_element_size(wire), err);
    if (!out) return ZT_ERR_OUT_OF_MEMORY;
    zt_status st = b->inner->reduce_scatter(b->inner, g->inner, host, out, count, wire, op, NULL, err);
    return st == ZT_OK ? stage_out(b, recv, out, count, dtype, 1, stream, err) : st;
}

static zt_status staged_all_gather(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                   int32_t dtype, void *stream, zt_error *err)
{
    staged_backend *b = (staged_backend *)self;
    staged_group *g = comm;
    void *host = stage_in(b, send, count, dtype, 0, stream, err);
    if (!host) return err && err->status ? err->status : ZT_ERR_INTERNAL;
    void *out = reserve(b, 1, count * (uint64_t)g->size * zt_comm_element_size(dtype), err);
    if (!out) return ZT_ERR_OUT_OF_MEMORY;
    zt_status st = b->inner->all_gather(b->inner, g->inner, host, out, count, dtype, NULL, err);
    return st == ZT_OK ? stage_out(b, recv, out, count * (uint64_t)g->size, dtype, 0, stream, err) : st;
}

static zt_status staged_broadcast(zt_comm_backend *self, void *comm, void *buf, uint64_t count, int32_t dtype,
                                  int32_t root, void *stream, zt_error *err)
{
    staged_backend *b = (staged_backend *)self;
    staged_group *g = comm;
    void *host = stage_in(b, buf, count, dtype, 0, stream, err);
    if (!host) return err && err->status ? err->status : ZT_ERR_INTERNAL;
    zt_status st = b->inner->broadcast(b->inner, g->inner, host, count, dtype, root, NULL, err);
    return st == ZT_OK ? stage_out(b, buf, host, count, dtype, 0, stream, err) : st;
}

static zt_status staged_send(zt_comm_backend *self, void *comm, const void *buf, uint64_t count, int32_t dtype,
                             int32_t peer, void *stream, zt_error *err)
{
    staged_backend *b = (staged_backend *)self;
    staged_group *g = comm;
    void *host = stage_in(b, buf, count, dtype, 0, stream, err);
    if (!host) return err && err->status ? err->status : ZT_ERR_INTERNAL;
    return b->inner->send(b->inner, g->inner, host, count, dtype, peer, NULL, err);
}

static zt_status staged_recv(zt_comm_backend *self, void *comm, void *buf, uint64_t count, int32_t dtype,
                             int32_t peer, void *stream, zt_error *err)
{
    staged_backend *b = (staged_backend *)self;
    staged_group *g = comm;
    void *host = reserve(b, 1, count * zt_comm_element_size(dtype), err);
    if (!host) return ZT_ERR_OUT_OF_MEMORY;
    /* the stream's earlier work may still read buf: finish it before the copy back overwrites buf */
    zt_status st = b->inner->recv(b->inner, g->inner, host, count, dtype, peer, NULL, err);
    if (st == ZT_OK) st = b->device->sync(b->device_ctx, stream, err);
    return st == ZT_OK ? stage_out(b, buf, host, count, dtype, 0, stream, err) : st;
}

static zt_status staged_barrier(zt_comm_backend *self, void *comm, zt_error *err)
{
    staged_backend *b = (staged_backend *)self;
    staged_group *g = comm;
    return b->inner->barrier(b->inner, g->inner, err);
}

static void staged_destroy(zt_comm_backend *self)
{
    staged_backend *b = (staged_backend *)self;
    b->inner->destroy(b->inner);
    free(b->buf[0]);
    free(b->buf[1]);
    free(b);
}

zt_status zt_comm_host_staged_create(zt_comm_backend *inner, const zt_device_backend *device,
                                     const zt_device_ctx *device_ctx, zt_comm_backend **out, zt_error *err)
{
    staged_backend *b = calloc(1, sizeof *b);
    if (!b) {
        inner->destroy(inner);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating the staged communicator");
    }
    b->inner = inner;
    b->device = device;
    b->device_ctx = device_ctx;
    b->base = (zt_comm_backend){
        .name = inner->name, /* "mpi": what the messages and the flight recorder name */
        .world_rank = inner->world_rank,
        .world_size = inner->world_size,
        .group_create = staged_group_create,
        .group_destroy = staged_group_destroy,
        .all_reduce = staged_all_reduce,
        .reduce_scatter = staged_reduce_scatter,
        .all_gather = staged_all_gather,
        .broadcast = staged_broadcast,
        .send = staged_send,
        .recv = staged_recv,
        .barrier = staged_barrier,
        .destroy = staged_destroy,
    };
    *out = &b->base;
    return ZT_OK;
}
