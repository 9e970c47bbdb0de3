/* The communication backend of a single-process run: world size 1, so every group holds only this
 * process and every collective reduces to copying send into recv (SUM, MAX, MIN and AVG of one
 * contribution are that contribution). See comm.h. */
#include "dist/comm.h"

#include <stdlib.h>

typedef struct local_backend {
    zt_comm_backend base; /* first, so a zt_comm_backend * is a local_backend * */
    const zt_device_backend *device;
    const zt_device_ctx *device_ctx;
} local_backend;

/* Groups carry no state here; any non-NULL handle will do. */
static int the_local_comm;

static zt_status local_copy(zt_comm_backend *self, void *dst, const void *src, uint64_t count,
                            int32_t dtype, void *stream, zt_error *err)
{
    local_backend *lb = (local_backend *)self;
    uint64_t bytes = count * zt_comm_element_size(dtype);
    if (bytes == 0 || dst == src) return ZT_OK;
    return lb->device->memcpy(lb->device_ctx, dst, src, bytes, stream, err);
}

static zt_status local_group_create(zt_comm_backend *self, const char *name, const int32_t *world_ranks,
                                    int32_t n, void **comm_out, zt_error *err)
{
    (void)self;
    (void)name;
    (void)world_ranks;
    (void)n;
    (void)err;
    *comm_out = &the_local_comm;
    return ZT_OK;
}

static void local_group_destroy(zt_comm_backend *self, void *comm)
{
    (void)self;
    (void)comm;
}

static zt_status local_all_reduce(zt_comm_backend *self, void *comm, const void *send, void *recv,
                                  uint64_t count, int32_t dtype, int32_t op, void *stream,
                                  zt_error *err)
{
    (void)comm;
    (void)op;
    return local_copy(self, recv, send, count, dtype, stream, err);
}

static zt_status local_reduce_scatter(zt_comm_backend *self, void *comm, const void *send,
                                      void *recv, uint64_t count, int32_t dtype, int32_t op,
                                      void *stream, zt_error *err)
{
    (void)comm;
    (void)op;
    return local_copy(self, recv, send, count, dtype, stream, err);
}

static zt_status local_all_gather(zt_comm_backend *self, void *comm, const void *send, void *recv,
                                  uint64_t count, int32_t dtype, void *stream, zt_error *err)
{
    (void)comm;
    return local_copy(self, recv, send, count, dtype, stream, err);
}

static zt_status local_broadcast(zt_comm_backend *self, void *comm, void *buf, uint64_t count,
                                 int32_t dtype, int32_t root, void *stream, zt_error *err)
{
    /* The root is this process: its buffer already holds the data. */
    (void)self, (void)comm, (void)buf, (void)count, (void)dtype, (void)root, (void)stream, (void)err;
    return ZT_OK;
}

/* The runtime rejects a peer equal to this rank, which is the only rank there is; reaching these
 * would mean that check was bypassed. */
static zt_status local_send(zt_comm_backend *self, void *comm, const void *buf, uint64_t count,
                            int32_t dtype, int32_t peer, void *stream, zt_error *err)
{
    (void)self, (void)comm, (void)buf, (void)count, (void)dtype, (void)stream;
    return zt_error_set(err, ZT_ERR_INTERNAL, "send to rank %d in a single-process run, which has no "
                        "other rank (a zt bug: the runtime should have rejected it)", peer);
}

static zt_status local_recv(zt_comm_backend *self, void *comm, void *buf, uint64_t count,
                            int32_t dtype, int32_t peer, void *stream, zt_error *err)
{
    (void)self, (void)comm, (void)buf, (void)count, (void)dtype, (void)stream;
    return zt_error_set(err, ZT_ERR_INTERNAL, "receive from rank %d in a single-process run, which "
                        "has no other rank (a zt bug: the runtime should have rejected it)", peer);
}

static zt_status local_barrier(zt_comm_backend *self, void *comm, zt_error *err)
{
    (void)self, (void)comm, (void)err;
    return ZT_OK;
}

static void local_destroy(zt_comm_backend *self) { free(self); }

zt_status zt_comm_local_create(const zt_device_backend *device, const zt_device_ctx *device_ctx,
                               zt_comm_backend **out, zt_error *err)
{
    local_backend *lb = calloc(1, sizeof *lb);
    if (!lb) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating the communicator");
    lb->device = device;
    lb->device_ctx = device_ctx;
    lb->base = (zt_comm_backend){
        .name = "local",
        .world_rank = 0,
        .world_size = 1,
        .group_create = local_group_create,
        .group_destroy = local_group_destroy,
        .all_reduce = local_all_reduce,
        .reduce_scatter = local_reduce_scatter,
        .all_gather = local_all_gather,
        .broadcast = local_broadcast,
        .send = local_send,
        .recv = local_recv,
        .barrier = local_barrier,
        .destroy = local_destroy,
    };
    *out = &lb->base;
    return ZT_OK;
}
