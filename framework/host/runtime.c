/* The runtime behind the zt_host services table (runtime.h). This file: one zt_host per plugin
 * (logging, the error slot, config getters, memory, threads, cancel), the table itself, and creating
 * and destroying the runtime; runtime_internal.h names the files of memory accounting and
 * collectives. */
#define _POSIX_C_SOURCE 200809L
#include "host/runtime.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "host/runtime_internal.h"
#include "dist/job.h"
#include "dist/flight.h"
#include "dist/launch.h"
#include "config/settings.h"

static volatile sig_atomic_t g_cancel_requested = 0;

void zt_runtime_request_cancel(void) { g_cancel_requested = 1; }
int zt_runtime_cancel_requested(void) { return g_cancel_requested != 0; }

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

void rt_record_error(plugin_ctx *pc, zt_status status, const char *fmt, ...)
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
    void *ptr = rt_mem_alloc(pc->rt, pool, where, bytes, alignment, tag, &err);
    if (!ptr) rt_record_error(pc, err.status, "%s", err.msg);
    return ptr;
}

static void host_free(void *ctx, void *ptr)
{
    plugin_ctx *pc = ctx;
    if (ptr && !rt_mem_free(pc->rt, ptr))
        plugin_log(pc, ZT_LOG_ERROR, "host->free(%p): not a live allocation of host->alloc (freed twice, "
                   "or allocated elsewhere); left alone (a bug in plugin '%s')", ptr, pc->name);
}

static void host_mem_stats(void *ctx, int32_t pool, int32_t where, zt_mem_stats *out)
{
    plugin_ctx *pc = ctx;
    if (!rt_mem_stats(pc->rt, pool, where, out))
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
        .group_get = rt_host_group_get,
        .group_create = rt_host_group_create,
        .all_reduce = rt_host_all_reduce,
        .reduce_scatter = rt_host_reduce_scatter,
        .all_gather = rt_host_all_gather,
        .broadcast = rt_host_broadcast,
        .send = rt_host_send,
        .recv = rt_host_recv,
        .barrier = rt_host_barrier,
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
    } else if (pc && (pc->schema != schema || pc->n_options != (schema ? n_options : 0))) {
        /* The plugin was unloaded and loaded again (the estimator loads each other stage per row):
         * its schema lives in the new copy of its library, wherever that was mapped. */
        pc->schema = schema;
        pc->n_options = schema ? n_options : 0;
        if (pc->defaults) {
            zt_config_free(pc->defaults);
            pc->defaults = NULL;
            if (load_defaults(pc) != ZT_OK) pc = NULL;
        }
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

/* Several ranks: NCCL for GPU ranks and MPI for CPU ranks (comm.backend auto), or MPI for GPU ranks
 * with their buffers staged through host memory (mpi). */
static zt_status create_multi_rank_backend(zt_runtime *rt, const zt_runtime_options *opt, const zt_launch *launch,
                                           zt_error *err)
{
    int gpu = opt->device_type != ZT_DEVICE_CPU;
    if (opt->comm_backend == ZT_COMM_BACKEND_NCCL && !gpu)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "comm.backend = nccl, but these %d ranks run on the CPU, where NCCL cannot carry their "
                            "collectives: leave comm.backend at auto (MPI), or run on GPUs (device = cuda)",
                            launch->world_size);
    if (opt->comm_backend != ZT_COMM_BACKEND_MPI || !gpu)
        return zt_launch_comm_create(launch, opt->device_type, opt->comm_timeout_s, &rt->comm, err);
    zt_comm_backend *mpi = NULL;
    zt_status st = zt_launch_comm_create_mpi_for_gpus(launch, opt->comm_timeout_s, &mpi, err);
    if (st != ZT_OK) return st;
    zt_log(ZT_LOG_INFO, "comm.backend = mpi: the collectives of these %d GPU ranks go through MPI, every buffer "
           "staged through host memory", launch->world_size);
    return zt_comm_host_staged_create(mpi, rt->device, &rt->device_ctx, &rt->comm, err);
}

/* One process: the local backend. A job of several ranks: the backend its launch calls for
 * (launch.c), log lines that say which rank wrote them, and under zt-run --nproc this rank's entry in
 * the job directory (job.h), once it is connected. */
static zt_status create_comm_backend(zt_runtime *rt, const zt_runtime_options *opt, const zt_launch *launch,
                                     zt_error *err)
{
    if (launch->world_size > 1) zt_job_attach(launch->rank, launch->world_size, launch->launcher);
    /* Before the backend: the comm modules take its hooks as they start. */
    zt_status st = zt_flight_init(launch->rank, launch->world_size, opt->flight_entries, err);
    if (st != ZT_OK) return st;
    if (launch->world_size == 1) return zt_comm_local_create(rt->device, &rt->device_ctx, &rt->comm, err);
    st = create_multi_rank_backend(rt, opt, launch, err);
    if (st == ZT_OK) {
        zt_log_set_rank(launch->rank);
        zt_job_register(opt->comm_timeout_s);
    }
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
    zt_status st = rt_create_group(rt, "world", all, n, &world, err);
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
    if (st == ZT_OK) st = rt_comm_monitor_create(rt, opt->comms_logger, err);
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
    rt_comm_monitor_destroy(rt); /* its events belong to the device, shut down below */
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
    rt_release_leaks(rt);
    free(rt->records);
    if (rt->device) rt->device->shutdown(&rt->device_ctx);
    zt_threadpool_destroy(rt->threads);
    pthread_mutex_destroy(&rt->names_lock);
    pthread_mutex_destroy(&rt->mem_lock);
    free(rt->memory_note);
    free(rt);
}
