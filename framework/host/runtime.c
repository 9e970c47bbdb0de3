/* The runtime behind the zt_host services table. See runtime.h.
 *
 * Layout of this file:
 *   memory accounting    per (pool, where) counters, limits, the allocation table, OOM messages
 *   plugin contexts      one zt_host per plugin: logging, the error slot, config getters
 *   collectives          named groups over a zt_comm_backend (comm.h)
 *   create / destroy
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include "host/runtime.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/threadpool.h"
#include "device/device.h"
#include "dist/comm.h"
#include "dist/launch.h"

#define WHERE_COUNT 3
#define HOST_ALIGNMENT 64    /* a cache line: no false sharing between allocations */
#define DEVICE_ALIGNMENT 256 /* what cudaMalloc guarantees and vectorized kernels assume */
#define TAG_MAX 48           /* tags are kept (truncated) for the leak report at shutdown */
#define NAME_MAX_LEN 64

/* Limits are per side: pinned memory is host RAM, so it counts against the host limit. */
enum { SIDE_HOST = 0, SIDE_DEVICE = 1, SIDE_COUNT = 2 };
static int side_of(int where) { return where == ZT_MEM_DEVICE ? SIDE_DEVICE : SIDE_HOST; }

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
    struct comm_group *next;
} comm_group;

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
};

static volatile sig_atomic_t g_cancel_requested = 0;

void zt_runtime_request_cancel(void) { g_cancel_requested = 1; }
int zt_runtime_cancel_requested(void) { return g_cancel_requested != 0; }

const char *zt_pool_name(int pool)
{
    static const char *const names[ZT_POOL_COUNT] = {"params",    "grads", "optimizer", "activations",
                                                     "workspace", "comm",  "kv_cache",  "other"};
    return pool >= 0 && pool < ZT_POOL_COUNT ? names[pool] : "unknown";
}

const char *zt_mem_where_name(int where)
{
    static const char *const names[WHERE_COUNT] = {"host", "pinned", "device"};
    return where >= 0 && where < WHERE_COUNT ? names[where] : "unknown";
}

/* "1 byte", "300 bytes", "300 KiB", "2.00 GiB", "10.5 GiB": binary units, three significant
 * digits. */
static const char *format_bytes(uint64_t bytes, char buf[32])
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, 32, "%llu byte%s", (unsigned long long)bytes, bytes == 1 ? "" : "s");
        return buf;
    }
    double value = (double)bytes / 1024.0;
    int unit = 0;
    while (value >= 1024.0 && unit < 5) {
        value /= 1024.0;
        unit++;
    }
    const char *fmt = value < 10.0 ? "%.2f %s" : value < 100.0 ? "%.1f %s" : "%.0f %s";
    snprintf(buf, 32, fmt, value, units[unit]);
    return buf;
}

/* ---- memory accounting ---------------------------------------------------------------------- */

static size_t record_home(const zt_runtime *rt, const void *ptr)
{
    uint64_t h = (uint64_t)(uintptr_t)ptr;
    h ^= h >> 33; /* mix: aligned addresses have many equal low bits */
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return (size_t)h & (rt->records_cap - 1);
}

static void records_place(zt_runtime *rt, const alloc_record *rec)
{
    size_t i = record_home(rt, rec->ptr);
    while (rt->records[i].ptr) i = (i + 1) & (rt->records_cap - 1);
    rt->records[i] = *rec;
}

/* Make room for one more record (load factor <= 1/2), so inserting after an allocation succeeded
 * can never fail. */
static int records_reserve_one(zt_runtime *rt)
{
    if ((rt->records_used + 1) * 2 <= rt->records_cap) return 1;
    size_t new_cap = rt->records_cap ? rt->records_cap * 2 : 64;
    alloc_record *old = rt->records;
    size_t old_cap = rt->records_cap;
    alloc_record *grown = calloc(new_cap, sizeof *grown);
    if (!grown) return 0;
    rt->records = grown;
    rt->records_cap = new_cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].ptr) records_place(rt, &old[i]);
    free(old);
    return 1;
}

static long records_find(const zt_runtime *rt, const void *ptr)
{
    if (!rt->records_cap) return -1;
    for (size_t i = record_home(rt, ptr); rt->records[i].ptr; i = (i + 1) & (rt->records_cap - 1))
        if (rt->records[i].ptr == ptr) return (long)i;
    return -1;
}

/* Backward-shift deletion: later entries of the probe run move up so lookups never stop early. */
static void records_remove_at(zt_runtime *rt, size_t hole)
{
    size_t mask = rt->records_cap - 1;
    for (size_t j = (hole + 1) & mask; rt->records[j].ptr; j = (j + 1) & mask) {
        size_t home = record_home(rt, rt->records[j].ptr);
        int stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays) continue;
        rt->records[hole] = rt->records[j];
        hole = j;
    }
    rt->records[hole].ptr = NULL;
    rt->records_used--;
}

/* "params 256 KiB, grads 512 KiB": every pool holding memory on `side`. */
static void describe_pool_use(const zt_runtime *rt, int side, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (int pool = 0; pool < ZT_POOL_COUNT; pool++) {
        uint64_t bytes = 0;
        for (int where = 0; where < WHERE_COUNT; where++)
            if (side_of(where) == side) bytes += rt->mem[pool][where].current;
        if (!bytes || used >= cap) continue;
        char b[32];
        used += (size_t)snprintf(out + used, cap - used, "%s%s %s", used ? ", " : "",
                                 zt_pool_name(pool), format_bytes(bytes, b));
    }
    if (!out[0]) snprintf(out, cap, "no pool holds any");
}

/* The message of a failed allocation: the pool that overflowed, the request and its tag, the
 * limit, and every pool's use, then how to make it fit. `reason` is NULL when the limit refused the
 * request, else what the allocator said. Called with mem_lock held. */
static void describe_out_of_memory(const zt_runtime *rt, int pool, int where, uint64_t bytes,
                                   const char *tag, const char *reason, zt_error *err)
{
    int side = side_of(where);
    uint64_t pool_use = 0;
    for (int w = 0; w < WHERE_COUNT; w++)
        if (side_of(w) == side) pool_use += rt->mem[pool][w].current;
    char asked[32], pool_b[32], all_b[32], limit_b[32], pools[512], all_use[160];
    describe_pool_use(rt, side, pools, sizeof pools);
    const char *side_name = side == SIDE_HOST ? "host" : "device";
    if (rt->side_limit[side])
        snprintf(all_use, sizeof all_use, "%s of the %s %s limit", format_bytes(rt->side_used[side], all_b),
                 format_bytes(rt->side_limit[side], limit_b), side_name);
    else
        snprintf(all_use, sizeof all_use, "%s of %s memory (no limit set)",
                 format_bytes(rt->side_used[side], all_b), side_name);
    /* The exact byte count helps match a request to the code that made it; below 1 KiB the short
     * form already is exact. */
    char exact[64] = "";
    if (bytes >= 1024) snprintf(exact, sizeof exact, " (%llu bytes)", (unsigned long long)bytes);

    zt_error_set(err, ZT_ERR_OUT_OF_MEMORY,
                 "out of memory in pool '%s' on %s: asked %s%s for '%s', %s; the pool uses %s, all pools "
                 "use %s (%s)",
                 zt_pool_name(pool), where == ZT_MEM_PINNED ? "pinned host" : side_name,
                 format_bytes(bytes, asked), exact, tag,
                 reason ? reason : "which does not fit under the limit",
                 format_bytes(pool_use, pool_b), all_use, pools);
    if (side == SIDE_HOST && rt->side_limit[side])
        zt_error_append(err, "; pinned memory counts against the host limit");
    if (side == SIDE_DEVICE && rt->memory_note)
        zt_error_append(err, ".\n%s", rt->memory_note);
    if (side == SIDE_DEVICE)
        zt_error_append(err, ".\nTo fit: raise gpu_mem_limit (zt-run --gpu-mem-limit) if it is below the "
                             "GPU's memory, offload optimizer state or parameters to the CPU "
                             "(zero_optimization.offload_optimizer.device = \"cpu\"), use a higher "
                             "zero_optimization.stage, activation checkpointing (recompute), or a "
                             "smaller train_micro_batch_size_per_gpu.");
    else
        zt_error_append(err, ".\nTo fit: raise the host memory limit or free memory on this machine, "
                             "offload less to the CPU, or use a smaller train_micro_batch_size_per_gpu.");
}

void zt_runtime_set_memory_note(zt_runtime *rt, const char *note)
{
    char *copy = note ? strdup(note) : NULL; /* NULL on failure: the message goes without the note */
    pthread_mutex_lock(&rt->mem_lock);
    free(rt->memory_note);
    rt->memory_note = copy;
    pthread_mutex_unlock(&rt->mem_lock);
}

static void *mem_alloc(zt_runtime *rt, int pool, int where, uint64_t bytes, uint64_t alignment,
                       const char *tag, zt_error *err)
{
    if (!tag || !*tag) tag = "(untagged)";
    if (pool < 0 || pool >= ZT_POOL_COUNT) {
        zt_error_set(err, ZT_ERR_INVALID_ARG,
                     "allocation '%s' names memory pool %d, which does not exist: use a zt_pool value "
                     "from ZT_POOL_PARAMS (0) to ZT_POOL_OTHER (%d)", tag, pool, ZT_POOL_COUNT - 1);
        return NULL;
    }
    if (where < 0 || where >= WHERE_COUNT) {
        zt_error_set(err, ZT_ERR_INVALID_ARG,
                     "allocation '%s' asks for memory kind %d, which does not exist: use ZT_MEM_HOST (0), "
                     "ZT_MEM_PINNED (1) or ZT_MEM_DEVICE (2)", tag, where);
        return NULL;
    }
    if (alignment == 0) alignment = where == ZT_MEM_DEVICE ? DEVICE_ALIGNMENT : HOST_ALIGNMENT;
    if (alignment & (alignment - 1)) {
        zt_error_set(err, ZT_ERR_INVALID_ARG,
                     "allocation '%s' asks for alignment %llu, which is not a power of two: use a power "
                     "of two, or 0 for the default (%d on the host, %d on the device)",
                     tag, (unsigned long long)alignment, HOST_ALIGNMENT, DEVICE_ALIGNMENT);
        return NULL;
    }
    if (alignment < sizeof(void *)) alignment = sizeof(void *); /* stricter alignment satisfies it */

    int side = side_of(where);
    void *ptr = NULL;
    pthread_mutex_lock(&rt->mem_lock);
    uint64_t limit = rt->side_limit[side], used = rt->side_used[side];
    if (limit && (used > limit || bytes > limit - used)) {
        describe_out_of_memory(rt, pool, where, bytes, tag, NULL, err);
    } else if (bytes > SIZE_MAX - alignment) {
        describe_out_of_memory(rt, pool, where, bytes, tag, "more than this machine can address", err);
    } else if (!records_reserve_one(rt)) {
        describe_out_of_memory(rt, pool, where, bytes, tag,
                               "the system allocator failed (growing the allocation table)", err);
    } else {
        if (where == ZT_MEM_HOST) {
            if (posix_memalign(&ptr, (size_t)alignment, bytes ? (size_t)bytes : 1) != 0) ptr = NULL;
            if (!ptr) describe_out_of_memory(rt, pool, where, bytes, tag, "the system allocator failed", err);
        } else {
            zt_error backend_err;
            zt_error_clear(&backend_err);
            ptr = rt->device->alloc(&rt->device_ctx, where, bytes, alignment, &backend_err);
            if (!ptr && backend_err.status == ZT_ERR_OUT_OF_MEMORY) {
                describe_out_of_memory(rt, pool, where, bytes, tag, backend_err.msg, err);
            } else if (!ptr) {
                char asked[32];
                zt_error_set(err, backend_err.status, "cannot allocate %s for '%s' in pool '%s' on %s: %s",
                             format_bytes(bytes, asked), tag, zt_pool_name(pool), zt_mem_where_name(where),
                             backend_err.msg);
            }
        }
        if (ptr) {
            alloc_record rec = {.ptr = ptr, .bytes = bytes, .pool = pool, .where = where};
            snprintf(rec.tag, sizeof rec.tag, "%s", tag);
            records_place(rt, &rec);
            rt->records_used++;
            mem_counter *c = &rt->mem[pool][where];
            c->current += bytes;
            c->n_allocs++;
            if (c->current > c->peak) c->peak = c->current;
            rt->side_used[side] += bytes;
        }
    }
    pthread_mutex_unlock(&rt->mem_lock);
    return ptr;
}

/* Returns 0 when ptr is not a live allocation of this runtime (nothing is freed then). */
static int mem_free(zt_runtime *rt, void *ptr)
{
    pthread_mutex_lock(&rt->mem_lock);
    long i = records_find(rt, ptr);
    if (i < 0) {
        pthread_mutex_unlock(&rt->mem_lock);
        return 0;
    }
    alloc_record rec = rt->records[i];
    records_remove_at(rt, (size_t)i);
    mem_counter *c = &rt->mem[rec.pool][rec.where];
    c->current -= rec.bytes;
    c->n_allocs--;
    rt->side_used[side_of(rec.where)] -= rec.bytes;
    pthread_mutex_unlock(&rt->mem_lock);

    if (rec.where == ZT_MEM_HOST) free(ptr);
    else rt->device->free(&rt->device_ctx, rec.where, ptr);
    return 1;
}

static int mem_stats(zt_runtime *rt, int pool, int where, zt_mem_stats *out)
{
    memset(out, 0, sizeof *out);
    if (pool < 0 || pool >= ZT_POOL_COUNT || where < 0 || where >= WHERE_COUNT) return 0;
    pthread_mutex_lock(&rt->mem_lock);
    const mem_counter *c = &rt->mem[pool][where];
    out->current = c->current;
    out->peak = c->peak;
    out->n_allocs = c->n_allocs;
    out->limit = rt->side_limit[side_of(where)];
    pthread_mutex_unlock(&rt->mem_lock);
    return 1;
}

void *zt_runtime_alloc(zt_runtime *rt, int pool, int where, uint64_t bytes, uint64_t alignment,
                       const char *tag, zt_error *err)
{
    return mem_alloc(rt, pool, where, bytes, alignment, tag, err);
}

void zt_runtime_free(zt_runtime *rt, void *ptr)
{
    if (ptr && !mem_free(rt, ptr))
        zt_log(ZT_LOG_ERROR, "zt_runtime_free(%p): not a live allocation of this runtime (freed twice, "
                             "or allocated elsewhere); left alone", ptr);
}

void zt_runtime_mem_stats(zt_runtime *rt, int pool, int where, zt_mem_stats *out)
{
    mem_stats(rt, pool, where, out);
}

void zt_runtime_mem_reset_peaks(zt_runtime *rt)
{
    pthread_mutex_lock(&rt->mem_lock);
    for (int pool = 0; pool < ZT_POOL_COUNT; pool++)
        for (int where = 0; where < WHERE_COUNT; where++) rt->mem[pool][where].peak = rt->mem[pool][where].current;
    pthread_mutex_unlock(&rt->mem_lock);
}

zt_status zt_runtime_memcpy(zt_runtime *rt, void *dst, const void *src, uint64_t bytes, zt_error *err)
{
    return rt->device->memcpy(&rt->device_ctx, dst, src, bytes, rt->device_ctx.compute_stream, err);
}

zt_status zt_runtime_sync(zt_runtime *rt, zt_error *err)
{
    return rt->device->sync(&rt->device_ctx, rt->device_ctx.compute_stream, err);
}

/* Free what is still allocated at shutdown, naming the first few blocks so the owner can be
 * found. */
static void release_leaks(zt_runtime *rt)
{
    if (!rt->records_used) return;
    enum { SHOWN = 8 };
    uint64_t total = 0;
    size_t shown = 0, n = rt->records_used;
    for (size_t i = 0; i < rt->records_cap; i++) total += rt->records[i].ptr ? rt->records[i].bytes : 0;
    char b[32];
    zt_log(ZT_LOG_WARN, "%zu allocation%s (%s) still live at shutdown (whoever allocated them did not "
           "free them); freeing them:", n, n == 1 ? "" : "s", format_bytes(total, b));
    for (size_t i = 0; i < rt->records_cap; i++) {
        alloc_record rec = rt->records[i];
        if (!rec.ptr) continue;
        if (shown++ < SHOWN)
            zt_log(ZT_LOG_WARN, "  '%s': %s in pool '%s' on %s", rec.tag, format_bytes(rec.bytes, b),
                   zt_pool_name(rec.pool), zt_mem_where_name(rec.where));
        if (rec.where == ZT_MEM_HOST) free(rec.ptr);
        else rt->device->free(&rt->device_ctx, rec.where, rec.ptr);
    }
    if (n > SHOWN) zt_log(ZT_LOG_WARN, "  and %zu more", n - SHOWN);
}

/* ---- plugin contexts: logging and the error slot --------------------------------------------- */

static void record_errorv(plugin_ctx *pc, zt_status status, const char *fmt, va_list ap)
{
    pthread_mutex_lock(&pc->error_lock);
    /* A second message before the take (say the plugin adds context to a failed host->alloc) goes
     * on a new line, so neither is lost. The first status stays: it is the root cause. */
    size_t used = strlen(pc->error_msg);
    if (used && used + 1 < sizeof pc->error_msg) pc->error_msg[used++] = '\n';
    else if (!used) pc->error_status = status;
    if (used + 1 < sizeof pc->error_msg)
        vsnprintf(pc->error_msg + used, sizeof pc->error_msg - used, fmt, ap);
    pthread_mutex_unlock(&pc->error_lock);
}

static void record_error(plugin_ctx *pc, zt_status status, const char *fmt, ...) ZT_PRINTF(3, 4);
static void record_error(plugin_ctx *pc, zt_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record_errorv(pc, status, fmt, ap);
    va_end(ap);
}

static void plugin_log(plugin_ctx *pc, int level, const char *fmt, ...) ZT_PRINTF(3, 4);
static void plugin_log(plugin_ctx *pc, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zt_logv(level, pc->name, fmt, ap);
    va_end(ap);
}

static void host_log(void *ctx, int32_t level, const char *fmt, ...)
{
    if (level < ZT_LOG_DEBUG) level = ZT_LOG_DEBUG;
    if (level > ZT_LOG_ERROR) level = ZT_LOG_ERROR;
    va_list ap;
    va_start(ap, fmt);
    zt_logv(level, ((plugin_ctx *)ctx)->name, fmt, ap);
    va_end(ap);
}

static void host_error(void *ctx, int32_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record_errorv(ctx, (zt_status)status, fmt, ap);
    va_end(ap);
}

const char *zt_runtime_take_error(const zt_host *host, zt_status *status_out)
{
    if (!host) {
        if (status_out) *status_out = ZT_OK;
        return "";
    }
    plugin_ctx *pc = host->ctx;
    pthread_mutex_lock(&pc->error_lock);
    memcpy(pc->taken_msg, pc->error_msg, sizeof pc->taken_msg);
    if (status_out) *status_out = pc->error_status;
    pc->error_msg[0] = '\0';
    pc->error_status = ZT_OK;
    pthread_mutex_unlock(&pc->error_lock);
    return pc->taken_msg;
}

/* ---- plugin contexts: config getters ---------------------------------------------------------- */

typedef enum getter_kind { GET_BOOL, GET_INT, GET_FLOAT, GET_STRING, GET_FLOATS } getter_kind;

static const char *getter_name(getter_kind g)
{
    static const char *const names[] = {"cfg_bool", "cfg_int", "cfg_float", "cfg_string", "cfg_floats"};
    return names[g];
}

static const char *opt_type_name(int type)
{
    static const char *const names[] = {"bool", "int", "float", "string", "enum", "floats", "bytes"};
    return type >= 0 && type <= ZT_OPT_BYTES ? names[type] : "unknown";
}

/* The one getter that reads each declared type (-1: the type is unknown). Sizes are integers;
 * enums are strings. */
static int getter_for_type(int type)
{
    switch (type) {
    case ZT_OPT_BOOL: return GET_BOOL;
    case ZT_OPT_INT: case ZT_OPT_BYTES: return GET_INT;
    case ZT_OPT_FLOAT: return GET_FLOAT;
    case ZT_OPT_STRING: case ZT_OPT_ENUM: return GET_STRING;
    case ZT_OPT_FLOATS: return GET_FLOATS;
    default: return -1;
    }
}

static const zt_option *find_option(const zt_option *opts, uint32_t n, const char *key)
{
    for (uint32_t i = 0; i < n; i++)
        if (opts[i].key && strcmp(opts[i].key, key) == 0) return &opts[i];
    return NULL;
}

/* The config a plugin's getters read: the run's, or without one (zt-run --list-plugins) the
 * plugin's own, which holds only the schema defaults. Defaults are parsed by the config module
 * either way, so a default reads the same as the user writing that value. */
static const zt_config *config_of(const plugin_ctx *pc)
{
    return pc->rt->cfg ? pc->rt->cfg : pc->defaults;
}

/* `key` must be declared by this plugin's schema or the host's, with a type the getter reads.
 * A miss is a plugin bug: logged, naming the plugin and the key. */
static zt_status check_key(plugin_ctx *pc, getter_kind g, const char *key)
{
    if (!key) {
        plugin_log(pc, ZT_LOG_ERROR, "%s called with a NULL key (a bug in plugin '%s')", getter_name(g),
                   pc->name);
        return ZT_ERR_INVALID_ARG;
    }
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    const zt_option *opt = find_option(pc->schema, pc->n_options, key);
    if (!opt) opt = find_option(host_opts, n_host, key);
    if (!opt) {
        const char *nearest = config_of(pc) ? zt_config_nearest_key(config_of(pc), key) : NULL;
        char hint[200] = "";
        if (nearest) snprintf(hint, sizeof hint, " (did you mean '%s'?)", nearest);
        plugin_log(pc, ZT_LOG_ERROR,
                   "plugin '%s' read config key '%s'%s with %s, but neither its options schema nor the "
                   "host declares that key: add it to the plugin's zt_option table (a plugin bug)",
                   pc->name, key, hint, getter_name(g));
        return ZT_ERR_NOT_FOUND;
    }
    int right = getter_for_type(opt->type);
    if (right != (int)g) {
        plugin_log(pc, ZT_LOG_ERROR,
                   "plugin '%s' read config key '%s' with %s, but the key is declared as %s: read it "
                   "with %s (a plugin bug)", pc->name, key, getter_name(g), opt_type_name(opt->type),
                   right >= 0 ? getter_name((getter_kind)right) : "a getter of a known type");
        return ZT_ERR_INVALID_ARG;
    }
    return ZT_OK;
}

static zt_status host_cfg_bool(void *ctx, const char *key, int32_t *out)
{
    plugin_ctx *pc = ctx;
    zt_status st = check_key(pc, GET_BOOL, key);
    if (st != ZT_OK) return st;
    return zt_config_get_bool(config_of(pc), key, out);
}

static zt_status host_cfg_int(void *ctx, const char *key, int64_t *out)
{
    plugin_ctx *pc = ctx;
    zt_status st = check_key(pc, GET_INT, key);
    if (st != ZT_OK) return st;
    return zt_config_get_int(config_of(pc), key, out);
}

static zt_status host_cfg_float(void *ctx, const char *key, double *out)
{
    plugin_ctx *pc = ctx;
    zt_status st = check_key(pc, GET_FLOAT, key);
    if (st != ZT_OK) return st;
    return zt_config_get_float(config_of(pc), key, out);
}

static zt_status host_cfg_string(void *ctx, const char *key, const char **out)
{
    plugin_ctx *pc = ctx;
    zt_status st = check_key(pc, GET_STRING, key);
    if (st != ZT_OK) return st;
    return zt_config_get_string(config_of(pc), key, out);
}

static zt_status host_cfg_floats(void *ctx, const char *key, double *out, int32_t cap, int32_t *n)
{
    plugin_ctx *pc = ctx;
    zt_status st = check_key(pc, GET_FLOATS, key);
    if (st != ZT_OK) return st;
    if (!n || cap < 0 || (cap > 0 && !out)) {
        plugin_log(pc, ZT_LOG_ERROR, "cfg_floats('%s') needs an output array of cap >= 0 items and a "
                   "count pointer (a bug in plugin '%s')", key, pc->name);
        return ZT_ERR_INVALID_ARG;
    }
    return zt_config_get_floats(config_of(pc), key, out, cap, n);
}

/* ---- plugin contexts: memory, threads, cancel ------------------------------------------------- */

static void *host_alloc(void *ctx, int32_t pool, int32_t where, uint64_t bytes, uint64_t alignment,
                        const char *tag)
{
    plugin_ctx *pc = ctx;
    zt_error err;
    void *ptr = mem_alloc(pc->rt, pool, where, bytes, alignment, tag, &err);
    if (!ptr) record_error(pc, err.status, "%s", err.msg);
    return ptr;
}

static void host_free(void *ctx, void *ptr)
{
    plugin_ctx *pc = ctx;
    if (ptr && !mem_free(pc->rt, ptr))
        plugin_log(pc, ZT_LOG_ERROR, "host->free(%p): not a live allocation of host->alloc (freed twice, "
                   "or allocated elsewhere); left alone (a bug in plugin '%s')", ptr, pc->name);
}

static void host_mem_stats(void *ctx, int32_t pool, int32_t where, zt_mem_stats *out)
{
    plugin_ctx *pc = ctx;
    if (!mem_stats(pc->rt, pool, where, out))
        plugin_log(pc, ZT_LOG_ERROR, "host->mem_stats(pool %d, where %d): no such pool or memory kind; "
                   "returned zeros (a bug in plugin '%s')", pool, where, pc->name);
}

static void host_parallel_for(void *ctx, int64_t n, int64_t grain, zt_range_fn fn, void *arg)
{
    plugin_ctx *pc = ctx;
    if (!fn) {
        plugin_log(pc, ZT_LOG_ERROR, "host->parallel_for called with a NULL function; nothing ran (a bug "
                   "in plugin '%s')", pc->name);
        return;
    }
    zt_threadpool_parallel_for(pc->rt->threads, n, grain, fn, arg);
}

static int32_t host_cancelled(void *ctx)
{
    (void)ctx;
    return g_cancel_requested != 0;
}

void zt_runtime_parallel_for(zt_runtime *rt, int64_t n, int64_t grain, zt_range_fn fn, void *arg)
{
    zt_threadpool_parallel_for(rt->threads, n, grain, fn, arg);
}

int zt_runtime_n_threads(const zt_runtime *rt) { return zt_threadpool_n_threads(rt->threads); }

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
static zt_status create_group(zt_runtime *rt, const char *name, const int32_t *world_ranks, int32_t n,
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
    g->next = rt->groups;
    rt->groups = g;
    *out = g;
    return ZT_OK;
}

static zt_status host_group_get(void *ctx, const char *name, zt_group *out)
{
    plugin_ctx *pc = ctx;
    zt_runtime *rt = pc->rt;
    if (!name || !out) {
        record_error(pc, ZT_ERR_INVALID_ARG, "group_get needs a group name and an output zt_group");
        return ZT_ERR_INVALID_ARG;
    }
    pthread_mutex_lock(&rt->names_lock);
    comm_group *g = find_group(rt, name);
    if (g) fill_group(g, out);
    char names[512];
    if (!g) list_group_names(rt, names, sizeof names);
    pthread_mutex_unlock(&rt->names_lock);
    if (g) return ZT_OK;
    record_error(pc, ZT_ERR_NOT_FOUND,
                 "there is no communication group named '%s' (the groups are: %s); create it with "
                 "host->group_create first", name, names);
    return ZT_ERR_NOT_FOUND;
}

static zt_status host_group_create(void *ctx, const char *name, const int32_t *world_ranks, int32_t n,
                                   zt_group *out)
{
    plugin_ctx *pc = ctx;
    zt_runtime *rt = pc->rt;
    if (!out) {
        record_error(pc, ZT_ERR_INVALID_ARG, "group_create needs an output zt_group");
        return ZT_ERR_INVALID_ARG;
    }
    zt_error err;
    comm_group *g = NULL;
    pthread_mutex_lock(&rt->names_lock);
    zt_status st = create_group(rt, name, world_ranks, n, &g, &err);
    if (st == ZT_OK) fill_group(g, out);
    pthread_mutex_unlock(&rt->names_lock);
    if (st != ZT_OK) record_error(pc, st, "%s", err.msg);
    return st;
}

/* The group behind a plugin's zt_group, or NULL after recording why it is not one of ours. */
static comm_group *group_of(plugin_ctx *pc, const char *op, const zt_group *handle)
{
    const comm_group *g = handle ? handle->handle : NULL;
    if (!g || g->magic != GROUP_MAGIC || g->rt != pc->rt) {
        record_error(pc, ZT_ERR_INVALID_ARG,
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
        record_error(pc, ZT_ERR_INVALID_ARG, "%s on group '%s': dtype %d is not a zt_dtype", op_name,
                     g->name, dtype);
        return ZT_ERR_INVALID_ARG;
    }
    if (count && (!a || !b)) {
        record_error(pc, ZT_ERR_INVALID_ARG, "%s on group '%s': a buffer is NULL for %llu elements",
                     op_name, g->name, (unsigned long long)count);
        return ZT_ERR_INVALID_ARG;
    }
    if (count > UINT64_MAX / multiple / elem) {
        record_error(pc, ZT_ERR_INVALID_ARG, "%s on group '%s': %llu elements is more than fits in "
                     "memory", op_name, g->name, (unsigned long long)count);
        return ZT_ERR_INVALID_ARG;
    }
    return ZT_OK;
}

static zt_status check_reduce_op(plugin_ctx *pc, const char *op_name, const comm_group *g, int32_t op)
{
    if (op >= ZT_REDUCE_SUM && op <= ZT_REDUCE_AVG) return ZT_OK;
    record_error(pc, ZT_ERR_INVALID_ARG, "%s on group '%s': reduce op %d is not a zt_reduce_op (SUM 0, "
                 "MAX 1, MIN 2, AVG 3)", op_name, g->name, op);
    return ZT_ERR_INVALID_ARG;
}

/* `rank` (a root or a peer) must be a rank of the group. */
static zt_status check_group_rank(plugin_ctx *pc, const char *op_name, const comm_group *g, int32_t rank,
                                  const char *role)
{
    if (rank >= 0 && rank < g->size) return ZT_OK;
    record_error(pc, ZT_ERR_INVALID_ARG, "%s on group '%s': %s %d is not a rank of the group (ranks 0 to "
                 "%d)", op_name, g->name, role, rank, g->size - 1);
    return ZT_ERR_INVALID_ARG;
}

/* Point-to-point needs a peer other than this process. */
static zt_status check_peer(plugin_ctx *pc, const char *op_name, const comm_group *g, int32_t peer)
{
    zt_status st = check_group_rank(pc, op_name, g, peer, "peer");
    if (st != ZT_OK || peer != g->rank) return st;
    record_error(pc, ZT_ERR_INVALID_ARG,
                 "%s on group '%s': peer %d is this process's own rank, and a rank cannot exchange with "
                 "itself%s", op_name, g->name, peer,
                 g->size == 1 ? " (the group has only this rank, so it has no peer)" : "");
    return ZT_ERR_INVALID_ARG;
}

static void *comm_stream(const plugin_ctx *pc, void *stream)
{
    return stream ? stream : pc->rt->device_ctx.comm_stream;
}

static zt_status backend_result(plugin_ctx *pc, const char *op_name, const comm_group *g, zt_status st,
                                const zt_error *err)
{
    if (st != ZT_OK) record_error(pc, st, "%s on group '%s': %s", op_name, g->name, err->msg);
    return st;
}

static zt_status host_all_reduce(void *ctx, const zt_group *group, const void *send, void *recv,
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
    st = c->all_reduce(c, g->comm, send, recv, count, dtype, op, comm_stream(pc, stream), &err);
    return backend_result(pc, "all_reduce", g, st, &err);
}

static zt_status host_reduce_scatter(void *ctx, const zt_group *group, const void *send, void *recv,
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
    st = c->reduce_scatter(c, g->comm, send, recv, count, dtype, op, comm_stream(pc, stream), &err);
    return backend_result(pc, "reduce_scatter", g, st, &err);
}

static zt_status host_all_gather(void *ctx, const zt_group *group, const void *send, void *recv,
                                 uint64_t count, int32_t dtype, void *stream)
{
    plugin_ctx *pc = ctx;
    comm_group *g = group_of(pc, "all_gather", group);
    if (!g) return ZT_ERR_INVALID_ARG;
    zt_status st = check_transfer(pc, "all_gather", g, send, recv, count, (uint64_t)g->size, dtype);
    if (st != ZT_OK) return st;
    zt_error err;
    zt_comm_backend *c = pc->rt->comm;
    st = c->all_gather(c, g->comm, send, recv, count, dtype, comm_stream(pc, stream), &err);
    return backend_result(pc, "all_gather", g, st, &err);
}

static zt_status host_broadcast(void *ctx, const zt_group *group, void *buf, uint64_t count, int32_t dtype,
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
    st = c->broadcast(c, g->comm, buf, count, dtype, root, comm_stream(pc, stream), &err);
    return backend_result(pc, "broadcast", g, st, &err);
}

static zt_status host_send(void *ctx, const zt_group *group, const void *buf, uint64_t count, int32_t dtype,
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
    st = c->send(c, g->comm, buf, count, dtype, peer, comm_stream(pc, stream), &err);
    return backend_result(pc, "send", g, st, &err);
}

static zt_status host_recv(void *ctx, const zt_group *group, void *buf, uint64_t count, int32_t dtype,
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
    st = c->recv(c, g->comm, buf, count, dtype, peer, comm_stream(pc, stream), &err);
    return backend_result(pc, "recv", g, st, &err);
}

static zt_status host_barrier(void *ctx, const zt_group *group)
{
    plugin_ctx *pc = ctx;
    comm_group *g = group_of(pc, "barrier", group);
    if (!g) return ZT_ERR_INVALID_ARG;
    zt_error err;
    zt_comm_backend *c = pc->rt->comm;
    zt_status st = c->barrier(c, g->comm, &err);
    return backend_result(pc, "barrier", g, st, &err);
}

/* ---- the per-plugin services table ------------------------------------------------------------ */

/* Without a run config, getters read the schema defaults from a config of the plugin's own. A
 * schema the config module rejects (a malformed key, a default that does not parse) is logged;
 * the plugin's keys then read as not found. */
static zt_status load_defaults(plugin_ctx *pc)
{
    pc->defaults = zt_config_new();
    if (!pc->defaults) return ZT_ERR_OUT_OF_MEMORY;
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    zt_error err;
    zt_status st = zt_config_add_schema(pc->defaults, "host", host_opts, n_host, &err);
    if (st == ZT_OK) st = zt_config_add_schema(pc->defaults, pc->name, pc->schema, pc->n_options, &err);
    if (st == ZT_ERR_OUT_OF_MEMORY) return st;
    if (st != ZT_OK)
        plugin_log(pc, ZT_LOG_ERROR, "plugin '%s' has an unusable options schema, so none of its options "
                   "can be read (a plugin bug):\n%s", pc->name, err.msg);
    return ZT_OK;
}

static void free_plugin_ctx(plugin_ctx *pc)
{
    zt_config_free(pc->defaults);
    pthread_mutex_destroy(&pc->error_lock);
    free(pc);
}

static plugin_ctx *new_plugin_ctx(zt_runtime *rt, const char *plugin_name, const zt_option *schema,
                                  uint32_t n_options)
{
    plugin_ctx *pc = calloc(1, sizeof *pc);
    if (!pc) return NULL;
    pc->rt = rt;
    snprintf(pc->name, sizeof pc->name, "%s", plugin_name);
    pc->schema = schema;
    pc->n_options = schema ? n_options : 0;
    pthread_mutex_init(&pc->error_lock, NULL);
    if (!rt->cfg && load_defaults(pc) != ZT_OK) {
        free_plugin_ctx(pc);
        return NULL;
    }
    pc->host = (zt_host){
        .struct_size = sizeof(zt_host),
        .abi_major = ZT_ABI_MAJOR,
        .abi_minor = ZT_ABI_MINOR,
        .ctx = pc,
        .log = host_log,
        .error = host_error,
        .cfg_bool = host_cfg_bool,
        .cfg_int = host_cfg_int,
        .cfg_float = host_cfg_float,
        .cfg_string = host_cfg_string,
        .cfg_floats = host_cfg_floats,
        .alloc = host_alloc,
        .free = host_free,
        .mem_stats = host_mem_stats,
        .device = &rt->device_ctx,
        .world_rank = rt->comm->world_rank,
        .world_size = rt->comm->world_size,
        .group_get = host_group_get,
        .group_create = host_group_create,
        .all_reduce = host_all_reduce,
        .reduce_scatter = host_reduce_scatter,
        .all_gather = host_all_gather,
        .broadcast = host_broadcast,
        .send = host_send,
        .recv = host_recv,
        .barrier = host_barrier,
        .parallel_for = host_parallel_for,
        .cancelled = host_cancelled,
    };
    return pc;
}

/* NULL only when plugin_name is NULL or memory ran out. A second call with the same name returns
 * the first table (and keeps the first schema). */
const zt_host *zt_runtime_host(zt_runtime *rt, const char *plugin_name, const zt_option *schema,
                               uint32_t n_options)
{
    if (!plugin_name) return NULL;
    pthread_mutex_lock(&rt->names_lock);
    plugin_ctx *pc = rt->plugins;
    while (pc && strcmp(pc->name, plugin_name) != 0) pc = pc->next;
    if (!pc && (pc = new_plugin_ctx(rt, plugin_name, schema, n_options)) != NULL) {
        pc->next = rt->plugins;
        rt->plugins = pc;
    }
    pthread_mutex_unlock(&rt->names_lock);
    return pc ? &pc->host : NULL;
}

/* ---- create / destroy ------------------------------------------------------------------------- */

/* The GPU of a rank of a multi-rank CUDA run: its local rank (the rank when the launcher gave none).
 * One GPU visible to a rank whose local rank is higher: a launcher that gives each rank its own GPU
 * through CUDA_VISIBLE_DEVICES (srun --gpus-per-task=1); two ranks on one GPU are refused by NCCL. */
static zt_status gpu_of_rank(const zt_launch *launch, int *index, zt_error *err)
{
    int n_devices = 0;
    zt_status st = zt_device_cuda_count(&n_devices, err);
    if (st != ZT_OK) return st;
    int local = launch->local_rank >= 0 ? launch->local_rank : launch->rank;
    if (local < n_devices) {
        *index = local;
        return ZT_OK;
    }
    if (n_devices == 1 && getenv("CUDA_VISIBLE_DEVICES")) {
        *index = 0;
        return ZT_OK;
    }
    return zt_error_set(err, ZT_ERR_INVALID_ARG,
                        "rank %d of %d (from %s) is %s %d on its machine, which has %d GPU%s for this process: run "
                        "at most %d ranks per machine (one per GPU)%s", launch->rank, launch->world_size,
                        launch->launcher, launch->local_rank >= 0 ? "local rank" : "rank (no local rank given)",
                        local, n_devices, n_devices == 1 ? "" : "s", n_devices,
                        launch->local_rank >= 0 ? "" : ", or have the launcher set the local rank (ZT_LOCAL_RANK)");
}

/* One process: the local backend. A job of several ranks: the backend its launch calls for
 * (launch.c), and log lines that say which rank wrote them. */
static zt_status create_comm_backend(zt_runtime *rt, const zt_runtime_options *opt, const zt_launch *launch,
                                     zt_error *err)
{
    if (launch->world_size == 1) return zt_comm_local_create(rt->device, &rt->device_ctx, &rt->comm, err);
    zt_status st = zt_launch_comm_create(launch, opt->device_type, opt->comm_timeout_s, &rt->comm, err);
    if (st == ZT_OK) zt_log_set_rank(launch->rank);
    return st;
}

/* "world" holds every rank of the job. */
static zt_status create_world_group(zt_runtime *rt, zt_error *err)
{
    int32_t n = rt->comm->world_size;
    int32_t *all = malloc((size_t)n * sizeof *all);
    if (!all) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating group 'world'");
    for (int32_t i = 0; i < n; i++) all[i] = i;
    comm_group *world;
    zt_status st = create_group(rt, "world", all, n, &world, err);
    free(all);
    return st;
}

zt_status zt_runtime_create(const zt_runtime_options *opt, const zt_config *cfg, zt_runtime **out,
                            zt_error *err)
{
    static const zt_runtime_options defaults = {0}; /* all cores, CPU, no limits */
    if (!opt) opt = &defaults;
    *out = NULL;
    const zt_device_backend *device = NULL;
    zt_status st = zt_device_backend_open(opt->device_type, &device, err);
    if (st != ZT_OK) return st;

    zt_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating the runtime");
    rt->cfg = cfg;
    rt->side_limit[SIDE_HOST] = opt->host_mem_limit;
    rt->side_limit[SIDE_DEVICE] = opt->device_mem_limit;
    pthread_mutex_init(&rt->mem_lock, NULL);
    pthread_mutex_init(&rt->names_lock, NULL);

    /* The launch first: a rank of a multi-rank CUDA run computes on the GPU of its local rank. */
    zt_launch launch = {.rank = 0, .world_size = 1, .local_rank = 0, .launcher = "a single process"};
    int device_index = opt->device_index;
    st = opt->single_process ? ZT_OK : zt_launch_detect(&launch, err);
    if (st == ZT_OK && launch.world_size > 1 && opt->device_type == ZT_DEVICE_CUDA)
        st = gpu_of_rank(&launch, &device_index, err);
    if (st == ZT_OK) st = zt_threadpool_create(opt->n_threads, &rt->threads, err);
    if (st == ZT_OK) st = device->init(device_index, &rt->device_ctx, err);
    if (st == ZT_OK) {
        rt->device = device; /* from here on destroy shuts it down */
        rt->device_ctx.n_threads = zt_threadpool_n_threads(rt->threads);
        st = create_comm_backend(rt, opt, &launch, err);
    }
    if (st == ZT_OK) st = create_world_group(rt, err);
    if (st != ZT_OK) {
        zt_runtime_destroy(rt);
        return st;
    }
    *out = rt;
    return ZT_OK;
}

void zt_runtime_destroy(zt_runtime *rt)
{
    if (!rt) return;
    for (comm_group *g = rt->groups, *next; g; g = next) {
        next = g->next;
        rt->comm->group_destroy(rt->comm, g->comm);
        free(g->world_ranks);
        free(g);
    }
    if (rt->comm) rt->comm->destroy(rt->comm);
    for (plugin_ctx *pc = rt->plugins, *next; pc; pc = next) {
        next = pc->next;
        free_plugin_ctx(pc);
    }
    release_leaks(rt);
    free(rt->records);
    if (rt->device) rt->device->shutdown(&rt->device_ctx);
    zt_threadpool_destroy(rt->threads);
    pthread_mutex_destroy(&rt->names_lock);
    pthread_mutex_destroy(&rt->mem_lock);
    free(rt->memory_note);
    free(rt);
}
