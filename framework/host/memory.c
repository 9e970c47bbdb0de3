/* Memory accounting behind zt_host.alloc and the host's own allocations: counters per (pool, where)
 * with peaks, optional limits per side (host and pinned memory against one, device memory against
 * the other), the table of live allocations, and out-of-memory messages that name the pool. Also
 * what the machine has (zt_machine_memory_read), for the estimate's check before a run allocates. */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "config/config.h"
#include "host/runtime_internal.h"

static int side_of(int where) { return where == ZT_MEM_DEVICE ? SIDE_DEVICE : SIDE_HOST; }

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

void *rt_mem_alloc(zt_runtime *rt, int pool, int where, uint64_t bytes, uint64_t alignment,
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
int rt_mem_free(zt_runtime *rt, void *ptr)
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

int rt_mem_stats(zt_runtime *rt, int pool, int where, zt_mem_stats *out)
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
    return rt_mem_alloc(rt, pool, where, bytes, alignment, tag, err);
}

void zt_runtime_free(zt_runtime *rt, void *ptr)
{
    if (ptr && !rt_mem_free(rt, ptr))
        zt_log(ZT_LOG_ERROR, "zt_runtime_free(%p): not a live allocation of this runtime (freed twice, "
                             "or allocated elsewhere); left alone", ptr);
}

void zt_runtime_mem_stats(zt_runtime *rt, int pool, int where, zt_mem_stats *out)
{
    rt_mem_stats(rt, pool, where, out);
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

int zt_runtime_has_graphs(const zt_runtime *rt)
{
    const zt_device_backend *d = rt->device;
    return d->capture_begin && d->capture_end && d->graph_launch && d->graph_destroy;
}

zt_status zt_runtime_capture_begin(zt_runtime *rt, zt_error *err)
{
    if (!zt_runtime_has_graphs(rt))
        return zt_error_set(err, ZT_ERR_UNSUPPORTED, "the %s device has no CUDA graphs", rt->device->name);
    return rt->device->capture_begin(&rt->device_ctx, err);
}

zt_status zt_runtime_capture_end(zt_runtime *rt, void **graph, zt_error *err)
{
    *graph = NULL;
    if (!zt_runtime_has_graphs(rt))
        return zt_error_set(err, ZT_ERR_UNSUPPORTED, "the %s device has no CUDA graphs", rt->device->name);
    return rt->device->capture_end(&rt->device_ctx, graph, err);
}

zt_status zt_runtime_graph_launch(zt_runtime *rt, void *graph, zt_error *err)
{
    if (!zt_runtime_has_graphs(rt))
        return zt_error_set(err, ZT_ERR_UNSUPPORTED, "the %s device has no CUDA graphs", rt->device->name);
    return rt->device->graph_launch(&rt->device_ctx, graph, err);
}

void zt_runtime_graph_destroy(zt_runtime *rt, void *graph)
{
    if (graph && zt_runtime_has_graphs(rt)) rt->device->graph_destroy(&rt->device_ctx, graph);
}

/* Free what is still allocated at shutdown, naming the first few blocks so the owner can be
 * found. */
void rt_release_leaks(zt_runtime *rt)
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


/* ---- the machine's memory ------------------------------------------------------------------- */

/* The number of kB on the "key: N kB" line of /proc/meminfo; 0 when absent. */
static uint64_t meminfo_kb(const char *text, const char *key)
{
    size_t n = strlen(key);
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (!strncmp(line, key, n) && line[n] == ':') return strtoull(line + n + 1, NULL, 10);
    return 0;
}

/* A cgroup v2 file holding one number ("max" or absent: 0). */
static uint64_t cgroup_number(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char text[64] = "";
    int ok = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    return ok && text[0] >= '0' && text[0] <= '9' ? strtoull(text, NULL, 10) : 0;
}

zt_status zt_machine_memory_read(zt_machine_memory *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    const char *given = getenv("ZT_HOST_MEM_AVAILABLE");
    if (given && *given) {
        int64_t bytes = 0;
        if (!zt_config_parse_bytes(given, &bytes) || bytes <= 0)
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "ZT_HOST_MEM_AVAILABLE is \"%s\", which is not a byte size: give one such as "
                                "\"64GiB\" or \"512M\" (K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB "
                                "of 1000), or unset it to use this machine's memory", given);
        out->available = out->total = (uint64_t)bytes;
        out->overridden = 1;
        snprintf(out->source, sizeof out->source, "ZT_HOST_MEM_AVAILABLE");
        return ZT_OK;
    }
    char text[8192];
    FILE *f = fopen("/proc/meminfo", "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = '\0';
    uint64_t available = meminfo_kb(text, "MemAvailable") * 1024, total = meminfo_kb(text, "MemTotal") * 1024;
    if (!available)
        return zt_error_set(err, ZT_ERR_IO,
                            "cannot tell how much host memory this machine has: /proc/meminfo %s; set "
                            "ZT_HOST_MEM_AVAILABLE to the memory the run may use (e.g. \"64GiB\")",
                            f ? "has no MemAvailable line" : "cannot be read");
    out->available = available;
    out->total = total;
    snprintf(out->source, sizeof out->source, "MemAvailable in /proc/meminfo");
    /* In a container, the cgroup's limit is what the ranks can have, whatever the machine holds. */
    uint64_t limit = cgroup_number("/sys/fs/cgroup/memory.max"), used = cgroup_number("/sys/fs/cgroup/memory.current");
    if (limit) {
        uint64_t left = limit > used ? limit - used : 0;
        if (left < out->available) {
            out->available = left;
            snprintf(out->source, sizeof out->source, "this cgroup's memory.max less its memory.current");
        }
        if (!out->total || limit < out->total) out->total = limit;
    }
    return ZT_OK;
}
