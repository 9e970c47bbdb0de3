/* The seam between the runtime's collectives (host->all_reduce, ...) and the transport that moves
 * the data.
 *
 * The runtime owns everything a plugin sees: group names, zt_group handles, argument checks (dtype,
 * op, counts, root and peer ranges, NULL buffers) and the error messages. A backend only creates one
 * communicator per group and moves bytes; it may assume its arguments were checked.
 *
 *   framework/dist/comm_local.c  zt_comm_local_create: a single-process run (world size 1). Every group
 *                           has one member and every collective is a copy on the device backend.
 *   framework/dist/comm_mpi.c    CPU ranks (world size > 1): the MODULE libzt-comm-mpi.so, which links
 *                           MPI, so zt-run itself never does; launch.c finds and loads it
 *                           (docs/distributed.md).
 *   framework/dist/comm_nccl.c   GPU ranks (world size > 1 on a CUDA run): the MODULE
 *                           libzt-comm-nccl.so, which links NCCL and the CUDA runtime; launch.c
 *                           loads it and carries rank 0's NCCL id to the others (TCP rendezvous,
 *                           or MPI). Each group is its own non-blocking NCCL communicator; every
 *                           operation runs on the stream it is given and is watched (an event
 *                           after it, a watchdog thread that aborts NCCL and ends the process
 *                           past comm.timeout_s). Buffers are device memory.
 *   framework/dist/comm_host_staged.c  zt_comm_host_staged_create: GPU ranks over the MPI backend
 *                           (comm.backend = mpi): every buffer copied through host memory, 16-bit
 *                           reductions in fp32. For machines without NCCL and ranks sharing a GPU.
 * zt_runtime_create picks the backend by how the process was launched and the run's device.
 */
#ifndef ZT_FRAMEWORK_COMM_H
#define ZT_FRAMEWORK_COMM_H

#include <stdio.h>

#include "base/error.h"
#include "device/device.h"

typedef struct zt_comm_backend zt_comm_backend;

struct zt_comm_backend {
    const char *name; /* "local", "mpi", "nccl" */
    int32_t world_rank;
    int32_t world_size;

    /* Make the communicator of a group. world_ranks holds n distinct ranks in [0, world_size),
     * this process's among them; the process's rank in the group is its index there. Every member
     * calls this with the same ranks. `name` ("dp") is for messages: a multi-rank backend names the
     * group when a collective on it times out. */
    zt_status (*group_create)(zt_comm_backend *self, const char *name, const int32_t *world_ranks,
                              int32_t n, void **comm_out, zt_error *err);
    void (*group_destroy)(zt_comm_backend *self, void *comm);

    /* The collectives of zt_host.h with their semantics (counts in elements, in-place when
     * send == recv). `stream` is already resolved (never NULL on CUDA runs). */
    zt_status (*all_reduce)(zt_comm_backend *self, void *comm, const void *send, void *recv,
                            uint64_t count, int32_t dtype, int32_t op, void *stream, zt_error *err);
    zt_status (*reduce_scatter)(zt_comm_backend *self, void *comm, const void *send, void *recv,
                                uint64_t count, int32_t dtype, int32_t op, void *stream,
                                zt_error *err);
    zt_status (*all_gather)(zt_comm_backend *self, void *comm, const void *send, void *recv,
                            uint64_t count, int32_t dtype, void *stream, zt_error *err);
    zt_status (*broadcast)(zt_comm_backend *self, void *comm, void *buf, uint64_t count,
                           int32_t dtype, int32_t root, void *stream, zt_error *err);
    /* peer is a group rank other than this process's own. */
    zt_status (*send)(zt_comm_backend *self, void *comm, const void *buf, uint64_t count,
                      int32_t dtype, int32_t peer, void *stream, zt_error *err);
    zt_status (*recv)(zt_comm_backend *self, void *comm, void *buf, uint64_t count, int32_t dtype,
                      int32_t peer, void *stream, zt_error *err);
    zt_status (*barrier)(zt_comm_backend *self, void *comm, zt_error *err);

    void (*destroy)(zt_comm_backend *self);
};

/* Bytes per element of a zt_dtype, 0 for one collectives do not know. */
static inline uint64_t zt_comm_element_size(int32_t dtype)
{
    switch (dtype) {
    case ZT_F32: case ZT_I32: case ZT_U32: return 4;
    case ZT_BF16: case ZT_F16: case ZT_U16: return 2;
    case ZT_I64: return 8;
    case ZT_U8: return 1;
    default: return 0;
    }
}

/* "F32", "BF16", ...: a zt_dtype in the collectives' messages and the flight recorder's dumps. */
static inline const char *zt_comm_dtype_name(int32_t dtype)
{
    static const char *const names[] = {"F32", "BF16", "F16", "I32", "I64", "U8", "U16", "U32"};
    return dtype >= 0 && dtype <= ZT_U32 ? names[dtype] : "?";
}

/* "4 bytes", "64.0 KiB", "1.5 GiB": a collective's size as the watchdog's messages and the flight
 * recorder's analysis both name it ("all_reduce #57 on group 'dp' (64.0 KiB of F32)"). */
static inline void zt_comm_describe_bytes(uint64_t bytes, char out[32])
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(out, 32, "%llu byte%s", (unsigned long long)bytes, bytes == 1 ? "" : "s");
        return;
    }
    double value = (double)bytes / 1024.0;
    int unit = 0;
    while (value >= 1024.0 && unit < 3) {
        value /= 1024.0;
        unit++;
    }
    snprintf(out, 32, "%.1f %s", value, units[unit]);
}

/* The single-process backend. It copies through `device`, which must outlive it. */
zt_status zt_comm_local_create(const zt_device_backend *device, const zt_device_ctx *device_ctx,
                               zt_comm_backend **out, zt_error *err);

/* GPU ranks over a host backend (`inner`, MPI's): buffers anywhere, staged through host memory
 * around each call, ordered on its stream. Takes ownership of inner (destroyed with the result, or
 * here on failure). */
zt_status zt_comm_host_staged_create(zt_comm_backend *inner, const zt_device_backend *device,
                                     const zt_device_ctx *device_ctx, zt_comm_backend **out, zt_error *err);

#endif
