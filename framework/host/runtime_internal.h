/* Private to framework/host/: the runtime's state and what its files share.
 *
 *   runtime.c      the per-plugin contexts (logging, the error slot, config getters), the services
 *                  table, creating and destroying the runtime
 *   memory.c       memory accounting: counters per pool and place, limits, the allocation table,
 *                  out-of-memory messages
 *   collectives.c  named communication groups over the run's comm backend (dist/comm.h)
 *   comm_monitor.c what each collective moved and how long it took (comm_monitor.h)
 */
#ifndef ZT_FRAMEWORK_RUNTIME_INTERNAL_H
#define ZT_FRAMEWORK_RUNTIME_INTERNAL_H

#include <pthread.h>

#include "base/threadpool.h"
#include "device/device.h"
#include "dist/comm.h"
#include "host/runtime.h"

#define WHERE_COUNT 3
#define HOST_ALIGNMENT 64    /* a cache line: no false sharing between allocations */
#define DEVICE_ALIGNMENT 256 /* what cudaMalloc guarantees and vectorized kernels assume */
#define TAG_MAX 48           /* tags are kept (truncated) for the leak report at shutdown */
#define NAME_MAX_LEN 64

/* Limits are per side: pinned memory is host RAM, so it counts against the host limit. */
enum { SIDE_HOST = 0, SIDE_DEVICE = 1, SIDE_COUNT = 2 };

typedef struct mem_counter {
    uint64_t current;
    uint64_t peak;
    uint64_t n_allocs; /* live allocations: 0 at the end of a run that freed everything */
} mem_counter;

/* One live allocation. Kept in a side table rather than a header in front of the block, because
 * device memory cannot be written from the host. */
typedef struct alloc_record {
    void *ptr; /* NULL: empty slot */
    uint64_t bytes;
    int32_t pool;
    int32_t where;
    char tag[TAG_MAX];
} alloc_record;

typedef struct plugin_ctx {
    zt_runtime *rt;
    char name[NAME_MAX_LEN];
    const zt_option *schema;
    uint32_t n_options;
    zt_config *defaults; /* only without a run config: this plugin's and the host's schemas */
    zt_host host;

    /* The error slot: what host->error() (or a failed host->alloc) recorded since the last take.
     * `taken` keeps the last taken message alive for the caller of zt_runtime_take_error. */
    pthread_mutex_t error_lock;
    zt_status error_status;
    char error_msg[ZT_ERROR_MSG_MAX];
    char taken_msg[ZT_ERROR_MSG_MAX];

    struct plugin_ctx *next;
} plugin_ctx;

#define GROUP_MAGIC 0x5247545Au /* "ZTGR": tells our group records from any other pointer */

typedef struct comm_group {
    uint32_t magic;
    zt_runtime *rt;
    char name[NAME_MAX_LEN];
    int32_t *world_ranks;
    int32_t size;
    int32_t rank;
    void *comm; /* the backend's communicator */
    int32_t flight_group; /* its index in the flight recorder (dist/flight.h); -1: not recorded */
    struct comm_group *next;
} comm_group;

typedef struct comm_monitor comm_monitor;

struct zt_runtime {
    const zt_config *cfg;
    zt_threadpool *threads;
    const zt_device_backend *device;
    zt_device_ctx device_ctx;
    zt_comm_backend *comm;

    /* Guards the counters and the allocation table. Held across the backend's allocation so that
     * a limit check and the allocation it admits are one step for concurrent callers. */
    pthread_mutex_t mem_lock;
    mem_counter mem[ZT_POOL_COUNT][WHERE_COUNT];
    uint64_t side_used[SIDE_COUNT];
    uint64_t side_limit[SIDE_COUNT]; /* 0: none */
    char *memory_note;               /* zt_runtime_set_memory_note: the estimate, for device OOMs */
    alloc_record *records;           /* open addressing, linear probing; capacity a power of 2 */
    size_t records_cap;
    size_t records_used;

    pthread_mutex_t names_lock; /* guards the plugin and group lists */
    plugin_ctx *plugins;
    comm_group *groups;

    comm_monitor *monitor; /* NULL only while the runtime is made */
};

/* ---- runtime.c ----------------------------------------------------------------------------------- */

void rt_record_error(plugin_ctx *pc, zt_status status, const char *fmt, ...) ZT_PRINTF(3, 4);

/* ---- memory.c ------------------------------------------------------------------------------------ */

void *rt_mem_alloc(zt_runtime *rt, int pool, int where, uint64_t bytes, uint64_t alignment, const char *tag,
                   zt_error *err);
/* Returns 0 when ptr is not a live allocation of this runtime (nothing is freed then). */
int rt_mem_free(zt_runtime *rt, void *ptr);
int rt_mem_stats(zt_runtime *rt, int pool, int where, zt_mem_stats *out);
/* Free what is still allocated at shutdown, naming the first few blocks so the owner can be
 * found. */
void rt_release_leaks(zt_runtime *rt);

/* ---- collectives.c ------------------------------------------------------------------------------- */

/* Validates the name and ranks and makes the backend communicator; called with names_lock held. */
zt_status rt_create_group(zt_runtime *rt, const char *name, const int32_t *world_ranks, int32_t n,
                          comm_group **out, zt_error *err);
zt_status rt_host_group_get(void *ctx, const char *name, zt_group *out);
zt_status rt_host_group_create(void *ctx, const char *name, const int32_t *world_ranks, int32_t n,
                               zt_group *out);
zt_status rt_host_all_reduce(void *ctx, const zt_group *group, const void *send, void *recv, uint64_t count,
                             int32_t dtype, int32_t op, void *stream);
zt_status rt_host_reduce_scatter(void *ctx, const zt_group *group, const void *send, void *recv,
                                 uint64_t count, int32_t dtype, int32_t op, void *stream);
zt_status rt_host_all_gather(void *ctx, const zt_group *group, const void *send, void *recv, uint64_t count,
                             int32_t dtype, void *stream);
zt_status rt_host_broadcast(void *ctx, const zt_group *group, void *buf, uint64_t count, int32_t dtype,
                            int32_t root, void *stream);
zt_status rt_host_send(void *ctx, const zt_group *group, const void *buf, uint64_t count, int32_t dtype,
                       int32_t peer, void *stream);
zt_status rt_host_recv(void *ctx, const zt_group *group, void *buf, uint64_t count, int32_t dtype,
                       int32_t peer, void *stream);
zt_status rt_host_barrier(void *ctx, const zt_group *group);

/* ---- comm_monitor.c ------------------------------------------------------------------------------ */

/* Parses comms_logger.prof_ops (an unknown name is ZT_ERR_CONFIG naming it); logger NULL: defaults. */
zt_status rt_comm_monitor_create(zt_runtime *rt, const zt_comms_logger_settings *logger, zt_error *err);
void rt_comm_monitor_destroy(zt_runtime *rt);

/* One collective being watched: rt_comm_begin right before the backend call, rt_comm_end with its
 * status right after. */
typedef struct comm_probe {
    int32_t entry;
    uint64_t bytes;
    void *stream;
    void *start; /* the device event before the call, or NULL: timed by the clock */
    double started_s;
} comm_probe;

/* op: ZT_COMM_*; count and dtype as the collective takes them. */
void rt_comm_begin(plugin_ctx *pc, comm_probe *p, int32_t op, const comm_group *g, uint64_t count, int32_t dtype,
                   void *stream);
void rt_comm_end(plugin_ctx *pc, comm_probe *p, zt_status st);

#endif
