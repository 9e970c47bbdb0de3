/* zt plugin ABI v1: the services the host hands every plugin at probe and init.
 *
 * A plugin links nothing from the host: everything it needs from zt arrives through this table.
 * The table and `ctx` stay valid from probe/init until the plugin's fini returns. Every function
 * pointer in it is always set (none is NULL).
 *
 * Threading: every service is tagged (zt_plugin.h lists the tags); most are [any thread]. Functions
 * that take a stream enqueue work on it and return without waiting.
 */
#ifndef ZT_HOST_H
#define ZT_HOST_H

#include "zt_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- memory ---------------------------------------------------------------------------------- */

/* What an allocation is for. Every byte is accounted to one pool, so an out-of-memory error names
 * the pool that overflowed and the dry-run estimator can be checked against measured peaks. */
typedef enum zt_pool {
    ZT_POOL_PARAMS = 0,      /* parameters: fp32 master and compute copies */
    ZT_POOL_GRADS = 1,       /* gradients */
    ZT_POOL_OPTIMIZER = 2,   /* optimizer state (moments) */
    ZT_POOL_ACTIVATIONS = 3, /* activations saved for backward */
    ZT_POOL_WORKSPACE = 4,   /* scratch that lives for one op */
    ZT_POOL_COMM = 5,        /* communication buckets */
    ZT_POOL_KV_CACHE = 6,    /* KV cache blocks for generation */
    ZT_POOL_OTHER = 7
} zt_pool;
#define ZT_POOL_COUNT 8

/* Where an allocation lives. */
typedef enum zt_mem_where {
    ZT_MEM_HOST = 0,   /* pageable host memory */
    ZT_MEM_PINNED = 1, /* page-locked host memory (fast, async device transfers) */
    ZT_MEM_DEVICE = 2  /* memory of the run's current device */
} zt_mem_where;

/* One pool's counters, in bytes. */
typedef struct zt_mem_stats {
    uint64_t current;
    uint64_t peak;
    uint64_t limit; /* 0: no limit */
    uint64_t n_allocs; /* live allocations (0 when everything was freed) */
} zt_mem_stats;

/* ---- device context -------------------------------------------------------------------------- */

/* The device a run computes on. On the CPU path only device_type and n_threads are meaningful and
 * every handle is NULL. Handles are owned by the host: a plugin uses them and never destroys them;
 * they stay valid until the plugin's fini returns. Read it from any thread: it is constant for the
 * run. */
typedef struct zt_device_ctx {
    uint32_t struct_size;
    int32_t device_type;     /* zt_device_type */
    int32_t device_index;    /* CUDA ordinal; 0 on CPU */
    int32_t cc_major;        /* compute capability, e.g. 9 and 0 for an H200 */
    int32_t cc_minor;
    int32_t sm_count;
    int32_t n_threads;       /* CPU worker threads the host's parallel_for uses */
    int32_t reserved0;
    uint64_t total_memory;   /* bytes of device memory (host memory on CPU) */
    void *compute_stream;    /* cudaStream_t: all compute of the training step */
    void *comm_stream;       /* cudaStream_t: collectives, so they overlap compute */
    void *copy_stream;       /* cudaStream_t: host<->device transfers (offload) */
    /* Reserved: always NULL. No plain cuBLAS handle is shared: its only in-tree user, the naive
     * attention reference, keeps one of its own in pedantic fp32 math mode (no TF32), per-handle
     * state that a shared handle could not promise to every user. */
    void *cublas;
    /* CUDA runs: the device's one cublasLtHandle_t, shared by every plugin
     * (plugins/cuda_plugin.h). */
    void *cublaslt;
    /* CUDA runs: the device memory that GEMMs through `cublaslt` use as their workspace (32 MiB,
     * 256-byte aligned), shared by every plugin. It is safe to share only because every user
     * enqueues its GEMMs on compute_stream: a GEMM on another stream needs a workspace of its own.
     * Allocated outside the memory pools (the dry-run estimate counts it in pool workspace). */
    void *workspace;
    uint64_t workspace_bytes;
} zt_device_ctx;

/* ---- collectives ----------------------------------------------------------------------------- */

typedef enum zt_reduce_op {
    ZT_REDUCE_SUM = 0,
    ZT_REDUCE_MAX = 1,
    ZT_REDUCE_MIN = 2,
    ZT_REDUCE_AVG = 3
} zt_reduce_op;

/* A communication group, looked up by name. The host always provides "world", and the trainer
 * creates "dp" (every rank: plain data parallelism) unless a parallel plugin (zt_train.h) runs,
 * which creates "dp", "tp", "pp" (and any others) with host->group_create. With one
 * rank, every group has size 1 and every collective is a local copy. The handle is owned by the
 * host. */
typedef struct zt_group {
    void *handle;
    int32_t rank; /* this process's rank within the group */
    int32_t size;
} zt_group;

/* ---- parallel loops on the host's thread pool ------------------------------------------------ */

/* Called on worker threads (and the caller's) with disjoint [begin, end) ranges covering [0, n),
 * concurrently: fn must only write what its range owns. */
typedef void (*zt_range_fn)(void *arg, int64_t begin, int64_t end);

/* ---- the services table ---------------------------------------------------------------------- */

typedef struct zt_host {
    uint32_t struct_size; /* sizeof(zt_host) as the host was built; check before using appended fields */
    uint16_t abi_major;
    uint16_t abi_minor;
    void *ctx;            /* pass back as the first argument of every call below */

    /* Logging. The host prefixes the plugin name and rank; lines of concurrent threads never
     * interleave. [any thread] */
    void (*log)(void *ctx, int32_t level, const char *fmt, ...) ZT_PRINTF(3, 4);
    /* Describe the failure you are about to return: what went wrong, where, and how to fix it.
     * The host shows it with the returned status. Call it at most once per failing call. The
     * message goes to this plugin's one error slot (a second message before the host takes it is
     * appended on a new line). [any thread] */
    void (*error)(void *ctx, int32_t status, const char *fmt, ...) ZT_PRINTF(3, 4);

    /* Typed config getters. `key` is a full dotted key declared in this plugin's options schema (or
     * a host key listed in docs/config.md). Values were validated against the schema before init.
     * Return ZT_OK, or ZT_ERR_NOT_FOUND for a key the schema does not declare (a plugin bug) or a
     * ZT_OPT_NO_DEFAULT key the user did not set. Strings are owned by the host and stay valid
     * until fini. [any thread]: the config is read-only once validated. */
    zt_status (*cfg_bool)(void *ctx, const char *key, int32_t *out);
    zt_status (*cfg_int)(void *ctx, const char *key, int64_t *out);
    zt_status (*cfg_float)(void *ctx, const char *key, double *out);
    zt_status (*cfg_string)(void *ctx, const char *key, const char **out);
    /* ZT_OPT_FLOATS: sets *n to the number of items; writes them when *n <= cap, else writes
     * nothing and returns ZT_ERR_BUFFER_TOO_SMALL. */
    zt_status (*cfg_floats)(void *ctx, const char *key, double *out, int32_t cap, int32_t *n);

    /* Tagged, accounted allocation. `tag` names the allocation in OOM messages ("layer 3 q_proj";
     * copied). Returns NULL on failure, after recording an error that names the pool, the request
     * and the pool's current use and limit; the caller then returns ZT_ERR_OUT_OF_MEMORY. Memory is
     * uninitialized. alignment 0 means 64 bytes on the host and 256 on the device. The block
     * belongs to the caller until it passes it to free, which it must do before its fini returns
     * (the host frees what is left at shutdown, with a warning naming the tags). Device memory is
     * stream-ordered on compute_stream (cudaMallocAsync / cudaFreeAsync): work enqueued there
     * before a free still sees the block; work on another stream that uses it must be waited for
     * first. [any thread] */
    void *(*alloc)(void *ctx, int32_t pool, int32_t where, uint64_t bytes, uint64_t alignment,
                   const char *tag);
    /* Frees a block of alloc (any plugin's: they share one runtime). NULL is a no-op.
     * [any thread] */
    void (*free)(void *ctx, void *ptr);
    /* One pool's counters for one kind of memory, into the caller's *out. [any thread] */
    void (*mem_stats)(void *ctx, int32_t pool, int32_t where, zt_mem_stats *out);

    /* The device this rank computes on. Owned and filled by the host; constant for the run. */
    const zt_device_ctx *device;

    /* Rank of this process in the whole job and its size (1 for a single-process run). */
    int32_t world_rank;
    int32_t world_size;

    /* Collectives over named groups. Buffers are device memory on CUDA runs and host memory on CPU
     * runs; `stream` is a cudaStream_t (NULL: device->comm_stream) and ignored on CPU.
     * count is in elements of dtype. In-place is allowed where send == recv.
     * reduce_scatter: send holds size*count elements, recv receives this rank's count.
     * all_gather: send holds count elements, recv receives size*count.
     * Calls come from one thread at a time for the whole job (the transports do not lock; zt's
     * callers issue them from the training thread). On CUDA runs they enqueue on the stream and
     * return; on CPU runs they are done on return. */

    /* Fill *out with the group called `name` ("world" always exists; the trainer creates "dp").
     * The handle is owned by the host and valid until the run ends. [any thread] */
    zt_status (*group_get)(void *ctx, const char *name, zt_group *out);
    /* Create group `name` over world_ranks[0..n) (borrowed; this rank among them) and fill *out;
     * asking again for an existing name with the same ranks returns it. [collective] over the
     * group's members, each passing the same ranks in the same order. [training thread] */
    zt_status (*group_create)(void *ctx, const char *name, const int32_t *world_ranks, int32_t n,
                              zt_group *out);
    /* [collective] over g, [training thread] (each of the four) */
    zt_status (*all_reduce)(void *ctx, const zt_group *g, const void *send, void *recv,
                            uint64_t count, int32_t dtype, int32_t op, void *stream);
    zt_status (*reduce_scatter)(void *ctx, const zt_group *g, const void *send, void *recv,
                                uint64_t count, int32_t dtype, int32_t op, void *stream);
    zt_status (*all_gather)(void *ctx, const zt_group *g, const void *send, void *recv,
                            uint64_t count, int32_t dtype, void *stream);
    zt_status (*broadcast)(void *ctx, const zt_group *g, void *buf, uint64_t count, int32_t dtype,
                           int32_t root, void *stream);
    /* Point to point, not collective: the peer posts the matching recv / send, in the same order.
     * [training thread] */
    zt_status (*send)(void *ctx, const zt_group *g, const void *buf, uint64_t count, int32_t dtype,
                      int32_t peer, void *stream);
    zt_status (*recv)(void *ctx, const zt_group *g, void *buf, uint64_t count, int32_t dtype,
                      int32_t peer, void *stream);
    /* Returns once every rank of g called it (CPU and CUDA: waits on the host). [collective],
     * [training thread] */
    zt_status (*barrier)(void *ctx, const zt_group *g);

    /* Run fn over [0, n) on the host's worker threads, in chunks of at least `grain` items; returns
     * when all chunks are done. A call from inside fn runs serially on the calling thread. `arg` is
     * borrowed until the call returns. [any thread]: concurrent callers share the workers. */
    void (*parallel_for)(void *ctx, int64_t n, int64_t grain, zt_range_fn fn, void *arg);

    /* Nonzero once the user asked to stop (Ctrl-C): long loops in a plugin should return
     * ZT_ERR_CANCELLED at the next safe point. [any thread] */
    int32_t (*cancelled)(void *ctx);
    int32_t reserved0;
} zt_host;

#ifdef __cplusplus
}
#endif

#endif /* ZT_HOST_H */
