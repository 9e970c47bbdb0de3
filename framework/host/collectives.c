/* Collectives behind zt_host's group and communication services: named groups of world ranks over
 * the run's comm backend (dist/comm.h), and the calls that check their arguments before the backend
 * moves any data. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "host/comm_monitor.h"
#include "dist/flight.h"
#include "host/runtime_internal.h"

/* ---- collectives ------------------------------------------------------------------------------ */

static comm_group *find_group(zt_runtime *rt, const char *name)
{
    for (comm_group *g = rt->groups; g; g = g->next)
        if (strcmp(g->name, name) == 0) return g;
    return NULL;
}

static void list_group_names(zt_runtime *rt, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (comm_group *g = rt->groups; g && used < cap; g = g->next)
        used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? ", " : "", g->name);
}

static void format_ranks(const int32_t *ranks, int32_t n, char *out, size_t cap)
{
    size_t used = (size_t)snprintf(out, cap, "[");
    for (int32_t i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%d", i ? ", " : "", ranks[i]);
    if (used < cap) snprintf(out + used, cap - used, "]");
}

static void fill_group(const comm_group *g, zt_group *out)
{
    out->handle = (void *)g;
    out->rank = g->rank;
    out->size = g->size;
}

/* Validates the name and ranks and makes the backend communicator; called with names_lock held. */
zt_status rt_create_group(zt_runtime *rt, const char *name, const int32_t *world_ranks, int32_t n,
                          comm_group **out, zt_error *err)
{
    int32_t world_size = rt->comm->world_size, me = rt->comm->world_rank;
    if (!name || !*name || strlen(name) >= NAME_MAX_LEN)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "group_create needs a name of 1 to %d characters",
                            NAME_MAX_LEN - 1);
    if (n < 1 || !world_ranks)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "group_create('%s') needs at least one rank (got %d)",
                            name, n);
    int32_t my_index = -1;
    for (int32_t i = 0; i < n; i++) {
        if (world_ranks[i] < 0 || world_ranks[i] >= world_size)
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "group_create('%s'): rank %d is not in the job, whose world ranks are 0 to "
                                "%d (world size %d)", name, world_ranks[i], world_size - 1, world_size);
        for (int32_t j = 0; j < i; j++)
            if (world_ranks[j] == world_ranks[i])
                return zt_error_set(err, ZT_ERR_INVALID_ARG, "group_create('%s'): rank %d is listed twice",
                                    name, world_ranks[i]);
        if (world_ranks[i] == me) my_index = i;
    }
    if (my_index < 0)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "group_create('%s'): this process (world rank %d) is not among the ranks "
                            "given; each process creates only the groups it belongs to", name, me);

    comm_group *existing = find_group(rt, name);
    if (existing) {
        /* Asking again for the same members is harmless (several plugins may need "dp"). */
        int same = existing->size == n;
        for (int32_t i = 0; same && i < n; i++) same = existing->world_ranks[i] == world_ranks[i];
        if (same) {
            *out = existing;
            return ZT_OK;
        }
        char had[256], asked[256];
        format_ranks(existing->world_ranks, existing->size, had, sizeof had);
        format_ranks(world_ranks, n, asked, sizeof asked);
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "group_create('%s', %s): a group of that name already exists with ranks %s; "
                            "pick another name", name, asked, had);
    }

    comm_group *g = calloc(1, sizeof *g);
    int32_t *ranks = malloc((size_t)n * sizeof *ranks);
    if (!g || !ranks) {
        free(g);
        free(ranks);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating group '%s'", name);
    }
    memcpy(ranks, world_ranks, (size_t)n * sizeof *ranks);
    zt_status st = rt->comm->group_create(rt->comm, name, world_ranks, n, &g->comm, err);
    if (st != ZT_OK) {
        free(g);
        free(ranks);
        return st;
    }
    g->magic = GROUP_MAGIC;
    g->rt = rt;
    snprintf(g->name, sizeof g->name, "%s", name);
    g->world_ranks = ranks;
    g->size = n;
    g->rank = my_index;
    g->flight_group = zt_flight_group(name, world_ranks, n, my_index);
    g->next = rt->groups;
    rt->groups = g;
    *out = g;
    return ZT_OK;
}

zt_status rt_host_group_get(void *ctx, const char *name, zt_group *out)
{
    plugin_ctx *pc = ctx;
    zt_runtime *rt = pc->rt;
    if (!name || !out) {
        rt_record_error(pc, ZT_ERR_INVALID_ARG, "group_get needs a group name and an output zt_group");
        return ZT_ERR_INVALID_ARG;
    }
    pthread_mutex_lock(&rt->names_lock);
    comm_group *g = find_group(rt, name);
    if (g) fill_group(g, out);
    char names[512];
    if (!g) list_group_names(rt, names, sizeof names);
    pthread_mutex_unlock(&rt->names_lock);
    if (g) return ZT_OK;
    rt_record_error(pc, ZT_ERR_NOT_FOUND,
                 "there is no communication group named '%s' (the groups are: %s); create it with "
                 "host->group_create first", name, names);
    return ZT_ERR_NOT_FOUND;
}

zt_status rt_host_group_create(void *ctx, const char *name, const int32_t *world_ranks, int32_t n,
                               zt_group *out)
{
    plugin_ctx *pc = ctx;
    zt_runtime *rt = pc->rt;
    if (!out) {
        rt_record_error(pc, ZT_ERR_INVALID_ARG, "group_create needs an output zt_group");
        return ZT_ERR_INVALID_ARG;
    }
    zt_error err;
    comm_group *g = NULL;
    pthread_mutex_lock(&rt->names_lock);
    zt_status st = rt_create_group(rt, name, world_ranks, n, &g, &err);
    if (st == ZT_OK) fill_group(g, out);
    pthread_mutex_unlock(&rt->names_lock);
    if (st != ZT_OK) rt_record_error(pc, st, "%s", err.msg);
    return st;
}

/* The group behind a plugin's zt_group, or NULL after recording why it is not one of ours. */
static comm_group *group_of(plugin_ctx *pc, const char *op, const zt_group *handle)
{
    const comm_group *g = handle ? handle->handle : NULL;
    if (!g || g->magic != GROUP_MAGIC || g->rt != pc->rt) {
        rt_record_error(pc, ZT_ERR_INVALID_ARG,
                     "%s: the zt_group was not made by this host; get one with host->group_get(\"world\") "
                     "or host->group_create", op);
        return NULL;
    }
    return (comm_group *)g;
}

/* Checks shared by every data-moving collective: a known dtype, buffers present, and the byte
 * count of the largest buffer (count * multiple elements) representable. */
static zt_status check_transfer(plugin_ctx *pc, const char *op_name, const comm_group *g, const void *a,
                                const void *b, uint64_t count, uint64_t multiple, int32_t dtype)
{
    uint64_t elem = zt_comm_element_size(dtype);
    if (!elem) {
        rt_record_error(pc, ZT_ERR_INVALID_ARG, "%s on group '%s': dtype %d is not a zt_dtype", op_name,
                     g->name, dtype);
        return ZT_ERR_INVALID_ARG;
    }
    if (count && (!a || !b)) {
        rt_record_error(pc, ZT_ERR_INVALID_ARG, "%s on group '%s': a buffer is NULL for %llu elements",
                     op_name, g->name, (unsigned long long)count);
        return ZT_ERR_INVALID_ARG;
    }
    if (count > UINT64_MAX / multiple / elem) {
        rt_record_error(pc, ZT_ERR_INVALID_ARG, "%s on group '%s': %llu elements is more than fits in "
                     "memory", op_name, g->name, (unsigned long long)count);
        return ZT_ERR_INVALID_ARG;
    }
    return ZT_OK;
}

static zt_status check_reduce_op(plugin_ctx *pc, const char *op_name, const comm_group *g, int32_t op)
{
    if (op >= ZT_REDUCE_SUM && op <= ZT_REDUCE_AVG) return ZT_OK;
    rt_record_error(pc, ZT_ERR_INVALID_ARG, "%s on group '%s': reduce op %d is not a zt_reduce_op (SUM 0, "
                 "MAX 1, MIN 2, AVG 3)", op_name, g->name, op);
    return ZT_ERR_INVALID_ARG;
}

/* `rank` (a root or a peer) must be a rank of the group. */
static zt_status check_group_rank(plugin_ctx *pc, const char *op_name, const comm_group *g, int32_t rank,
                                  const char *role)
{
    if (rank >= 0 && rank < g->size) return ZT_OK;
    rt_record_error(pc, ZT_ERR_INVALID_ARG, "%s on group '%s': %s %d is not a rank of the group (ranks 0 to "
                 "%d)", op_name, g->name, role, rank, g->size - 1);
    return ZT_ERR_INVALID_ARG;
}

/* Point-to-point needs a peer other than this process. */
static zt_status check_peer(plugin_ctx *pc, const char *op_name, const comm_group *g, int32_t peer)
{
    zt_status st = check_group_rank(pc, op_name, g, peer, "peer");
    if (st != ZT_OK || peer != g->rank) return st;
    rt_record_error(pc, ZT_ERR_INVALID_ARG,
                 "%s on group '%s': peer %d is this process's own rank, and a rank cannot exchange with "
                 "itself%s", op_name, g->name, peer,
                 g->size == 1 ? " (the group has only this rank, so it has no peer)" : "");
    return ZT_ERR_INVALID_ARG;
}

static void *comm_stream(const plugin_ctx *pc, void *stream)
{
    return stream ? stream : pc->rt->device_ctx.comm_stream;
}

/* The flight recorder (dist/flight.h) around one backend call: `multiple` counts the blocks of the
 * call's larger buffer (the group's size for reduce_scatter and all_gather). NCCL returns once the
 * collective is enqueued; its watchdog thread marks it complete. */
static uint64_t flight_begin(const comm_group *g, int op, uint64_t count, int32_t dtype, uint64_t multiple,
                             int32_t peer)
{
    return zt_flight_issue(g->flight_group, op, count, dtype, count * multiple * zt_comm_element_size(dtype), peer);
}

static void flight_end(const plugin_ctx *pc, uint64_t token, zt_status st)
{
    zt_flight_returned(token, st == ZT_OK, strcmp(pc->rt->comm->name, "nccl") == 0);
}

static zt_status backend_result(plugin_ctx *pc, const char *op_name, const comm_group *g, zt_status st,
                                const zt_error *err)
{
    if (st != ZT_OK) rt_record_error(pc, st, "%s on group '%s': %s", op_name, g->name, err->msg);
    return st;
}

zt_status rt_host_all_reduce(void *ctx, const zt_group *group, const void *send, void *recv,
                             uint64_t count, int32_t dtype, int32_t op, void *stream)
{
    plugin_ctx *pc = ctx;
    comm_group *g = group_of(pc, "all_reduce", group);
    if (!g) return ZT_ERR_INVALID_ARG;
    zt_status st = check_transfer(pc, "all_reduce", g, send, recv, count, 1, dtype);
    if (st == ZT_OK) st = check_reduce_op(pc, "all_reduce", g, op);
    if (st != ZT_OK) return st;
    zt_error err;
    zt_comm_backend *c = pc->rt->comm;
    comm_probe probe; /* the communication monitor (comm_monitor.h) */
    rt_comm_begin(pc, &probe, ZT_COMM_ALL_REDUCE, g, count, dtype, comm_stream(pc, stream));
    uint64_t flight = flight_begin(g, ZT_FLIGHT_ALL_REDUCE, count, dtype, 1, -1);
    st = c->all_reduce(c, g->comm, send, recv, count, dtype, op, comm_stream(pc, stream), &err);
    flight_end(pc, flight, st);
    rt_comm_end(pc, &probe, st);
    return backend_result(pc, "all_reduce", g, st, &err);
}

zt_status rt_host_reduce_scatter(void *ctx, const zt_group *group, const void *send, void *recv,
                                 uint64_t count, int32_t dtype, int32_t op, void *stream)
{
    plugin_ctx *pc = ctx;
    comm_group *g = group_of(pc, "reduce_scatter", group);
    if (!g) return ZT_ERR_INVALID_ARG;
    zt_status st = check_transfer(pc, "reduce_scatter", g, send, recv, count, (uint64_t)g->size, dtype);
    if (st == ZT_OK) st = check_reduce_op(pc, "reduce_scatter", g, op);
    if (st != ZT_OK) return st;
    zt_error err;
    zt_comm_backend *c = pc->rt->comm;
    comm_probe probe; /* the communication monitor (comm_monitor.h) */
    rt_comm_begin(pc, &probe, ZT_COMM_REDUCE_SCATTER, g, count, dtype, comm_stream(pc, stream));
    uint64_t flight = flight_begin(g, ZT_FLIGHT_REDUCE_SCATTER, count, dtype, (uint64_t)g->size, -1);
    st = c->reduce_scatter(c, g->comm, send, recv, count, dtype, op, comm_stream(pc, stream), &err);
    flight_end(pc, flight, st);
    rt_comm_end(pc, &probe, st);
    return backend_result(pc, "reduce_scatter", g, st, &err);
}

zt_status rt_host_all_gather(void *ctx, const zt_group *group, const void *send, void *recv,
                             uint64_t count, int32_t dtype, void *stream)
{
    plugin_ctx *pc = ctx;
    comm_group *g = group_of(pc, "all_gather", group);
    if (!g) return ZT_ERR_INVALID_ARG;
    zt_status st = check_transfer(pc, "all_gather", g, send, recv, count, (uint64_t)g->size, dtype);
    if (st != ZT_OK) return st;
    zt_error err;
    zt_comm_backend *c = pc->rt->comm;
    comm_probe probe; /* the communication monitor (comm_monitor.h) */
    rt_comm_begin(pc, &probe, ZT_COMM_ALL_GATHER, g, count, dtype, comm_stream(pc, stream));
    uint64_t flight = flight_begin(g, ZT_FLIGHT_ALL_GATHER, count, dtype, (uint64_t)g->size, -1);
    st = c->all_gather(c, g->comm, send, recv, count, dtype, comm_stream(pc, stream), &err);
    flight_end(pc, flight, st);
    rt_comm_end(pc, &probe, st);
    return backend_result(pc, "all_gather", g, st, &err);
}

zt_status rt_host_broadcast(void *ctx, const zt_group *group, void *buf, uint64_t count, int32_t dtype,
                            int32_t root, void *stream)
{
    plugin_ctx *pc = ctx;
    comm_group *g = group_of(pc, "broadcast", group);
    if (!g) return ZT_ERR_INVALID_ARG;
    zt_status st = check_transfer(pc, "broadcast", g, buf, buf, count, 1, dtype);
    if (st == ZT_OK) st = check_group_rank(pc, "broadcast", g, root, "root");
    if (st != ZT_OK) return st;
    zt_error err;
    zt_comm_backend *c = pc->rt->comm;
    comm_probe probe; /* the communication monitor (comm_monitor.h) */
    rt_comm_begin(pc, &probe, ZT_COMM_BROADCAST, g, count, dtype, comm_stream(pc, stream));
    uint64_t flight = flight_begin(g, ZT_FLIGHT_BROADCAST, count, dtype, 1, root);
    st = c->broadcast(c, g->comm, buf, count, dtype, root, comm_stream(pc, stream), &err);
    flight_end(pc, flight, st);
    rt_comm_end(pc, &probe, st);
    return backend_result(pc, "broadcast", g, st, &err);
}

zt_status rt_host_send(void *ctx, const zt_group *group, const void *buf, uint64_t count, int32_t dtype,
                       int32_t peer, void *stream)
{
    plugin_ctx *pc = ctx;
    comm_group *g = group_of(pc, "send", group);
    if (!g) return ZT_ERR_INVALID_ARG;
    zt_status st = check_transfer(pc, "send", g, buf, buf, count, 1, dtype);
    if (st == ZT_OK) st = check_peer(pc, "send", g, peer);
    if (st != ZT_OK) return st;
    zt_error err;
    zt_comm_backend *c = pc->rt->comm;
    comm_probe probe; /* the communication monitor (comm_monitor.h) */
    rt_comm_begin(pc, &probe, ZT_COMM_SEND, g, count, dtype, comm_stream(pc, stream));
    uint64_t flight = flight_begin(g, ZT_FLIGHT_SEND, count, dtype, 1, peer);
    st = c->send(c, g->comm, buf, count, dtype, peer, comm_stream(pc, stream), &err);
    flight_end(pc, flight, st);
    rt_comm_end(pc, &probe, st);
    return backend_result(pc, "send", g, st, &err);
}

zt_status rt_host_recv(void *ctx, const zt_group *group, void *buf, uint64_t count, int32_t dtype,
                       int32_t peer, void *stream)
{
    plugin_ctx *pc = ctx;
    comm_group *g = group_of(pc, "recv", group);
    if (!g) return ZT_ERR_INVALID_ARG;
    zt_status st = check_transfer(pc, "recv", g, buf, buf, count, 1, dtype);
    if (st == ZT_OK) st = check_peer(pc, "recv", g, peer);
    if (st != ZT_OK) return st;
    zt_error err;
    zt_comm_backend *c = pc->rt->comm;
    comm_probe probe; /* the communication monitor (comm_monitor.h) */
    rt_comm_begin(pc, &probe, ZT_COMM_RECV, g, count, dtype, comm_stream(pc, stream));
    uint64_t flight = flight_begin(g, ZT_FLIGHT_RECV, count, dtype, 1, peer);
    st = c->recv(c, g->comm, buf, count, dtype, peer, comm_stream(pc, stream), &err);
    flight_end(pc, flight, st);
    rt_comm_end(pc, &probe, st);
    return backend_result(pc, "recv", g, st, &err);
}

zt_status rt_host_barrier(void *ctx, const zt_group *group)
{
    plugin_ctx *pc = ctx;
    comm_group *g = group_of(pc, "barrier", group);
    if (!g) return ZT_ERR_INVALID_ARG;
    zt_error err;
    zt_comm_backend *c = pc->rt->comm;
    uint64_t flight = flight_begin(g, ZT_FLIGHT_BARRIER, 0, ZT_U8, 1, -1);
    zt_status st = c->barrier(c, g->comm, &err);
    flight_end(pc, flight, st);
    return backend_result(pc, "barrier", g, st, &err);
}

