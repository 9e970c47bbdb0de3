/* The process-wide runtime behind the zt_host services table: memory accounting by pool with
 * optional limits, the worker thread pool, the device context, communication groups, and one
 * zt_host table per loaded plugin (so log lines and config checks know which plugin is calling).
 */
#ifndef ZT_FRAMEWORK_RUNTIME_H
#define ZT_FRAMEWORK_RUNTIME_H

#include "zt/zt_host.h"
#include "base/error.h"
#include "config/config.h"
#include "config/settings.h"

typedef struct zt_runtime zt_runtime;

typedef struct zt_runtime_options {
    int n_threads;          /* 0: all online cores */
    int device_type;        /* zt_device_type */
    int device_index;
    uint64_t host_mem_limit;   /* 0: none */
    uint64_t device_mem_limit; /* 0: none (zt-run --gpu-mem-limit) */
    int single_process;        /* 1: a world of one whatever the launch environment says (a child
                                  forked by a rank to inspect plugins is not a rank itself) */
    double comm_timeout_s;     /* multi-rank runs: the collective watchdog's timeout (comm.timeout_s);
                                  0 waits forever */
    const zt_comms_logger_settings *comms_logger; /* what the communication monitor logs
                                                     (host/comm_monitor.h); NULL: nothing extra */
    uint32_t flight_entries;   /* the flight recorder's ring (comm.flight_recorder.entries); 0: off */
    int comm_backend;          /* ZT_COMM_BACKEND_* of config/settings.h (comm.backend); 0: auto */
} zt_runtime_options;

/* cfg may be NULL (e.g. zt-run --list-plugins); it must outlive the runtime. */
zt_status zt_runtime_create(const zt_runtime_options *opt, const zt_config *cfg, zt_runtime **out,
                            zt_error *err);
void zt_runtime_destroy(zt_runtime *rt);

/* A services table for plugin `name` whose config getters accept only keys in its schema (plus the
 * host's keys). Owned by the runtime; valid until zt_runtime_destroy. */
const zt_host *zt_runtime_host(zt_runtime *rt, const char *plugin_name, const zt_option *schema,
                               uint32_t n_options);

/* The message the plugin behind `host` gave with host->error() since the last take (empty string if
 * none), then clears it. */
const char *zt_runtime_take_error(const zt_host *host, zt_status *status_out);

/* Memory accounting, also used directly by the host (trainer, loader). */
void *zt_runtime_alloc(zt_runtime *rt, int pool, int where, uint64_t bytes, uint64_t alignment,
                       const char *tag, zt_error *err);
void zt_runtime_free(zt_runtime *rt, void *ptr);
void zt_runtime_mem_stats(zt_runtime *rt, int pool, int where, zt_mem_stats *out);
/* Every pool's peak becomes its current use: the trainer calls it at the start of each step, so a
 * step's record reports that step's peak. */
void zt_runtime_mem_reset_peaks(zt_runtime *rt);
const char *zt_pool_name(int pool);
/* A text (the memory estimate of the run, zt_memory_check) that a device allocation's out-of-memory
 * message ends with; NULL removes it. Copied. */
void zt_runtime_set_memory_note(zt_runtime *rt, const char *note);
const char *zt_mem_where_name(int where);

/* The host memory this machine has for a run's ranks (memory.c), which the estimate compares the
 * ranks' host pools with (train/estimate.h). */
typedef struct zt_machine_memory {
    uint64_t available; /* what new allocations can have */
    uint64_t total;     /* MemTotal, or a lower cgroup limit; 0 when not known */
    int overridden;     /* 1: from ZT_HOST_MEM_AVAILABLE */
    char source[160];   /* where `available` comes from, for messages */
} zt_machine_memory;

/* ZT_HOST_MEM_AVAILABLE when set (a byte size such as "64GiB": a test and debug knob, and the memory
 * of the machine a dry run is for when it is not this one; docs/zero.md), else MemAvailable of
 * /proc/meminfo, lowered to what a cgroup v2 limit leaves this process (memory.max minus
 * memory.current). Errors: a ZT_HOST_MEM_AVAILABLE that is no byte size, or no /proc/meminfo. */
zt_status zt_machine_memory_read(zt_machine_memory *out, zt_error *err);

/* Copy between host and device memory of this run, ordered on the device's compute stream (on the
 * CPU: done on return), and wait for that stream. */
zt_status zt_runtime_memcpy(zt_runtime *rt, void *dst, const void *src, uint64_t bytes, zt_error *err);
zt_status zt_runtime_sync(zt_runtime *rt, zt_error *err);

/* CUDA graphs of the compute stream (device.h): whether the run's device has them, then capture
 * (begin, enqueue work, end: *graph), replay and destroy. ZT_ERR_UNSUPPORTED where it has none. */
int zt_runtime_has_graphs(const zt_runtime *rt);
zt_status zt_runtime_capture_begin(zt_runtime *rt, zt_error *err);
zt_status zt_runtime_capture_end(zt_runtime *rt, void **graph, zt_error *err);
zt_status zt_runtime_graph_launch(zt_runtime *rt, void *graph, zt_error *err);
void zt_runtime_graph_destroy(zt_runtime *rt, void *graph);


/* Thread pool shared by host and plugins. */
void zt_runtime_parallel_for(zt_runtime *rt, int64_t n, int64_t grain, zt_range_fn fn, void *arg);
int zt_runtime_n_threads(const zt_runtime *rt);

/* Ctrl-C: set from the signal handler, read by host->cancelled. */
void zt_runtime_request_cancel(void);
int zt_runtime_cancel_requested(void);

#endif
