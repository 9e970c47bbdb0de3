/* The communication monitor (comm_monitor.h): what collectives.c reports around each call, kept per
 * kind, group and caller, per step and over the run, and the end-of-run table. */
#define _POSIX_C_SOURCE 200809L
#include "host/comm_monitor.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "host/runtime_internal.h"

static const char *const k_op_names[ZT_COMM_OP_COUNT] = {"all_reduce", "reduce_scatter", "all_gather",
                                                         "broadcast", "send", "recv"};

const char *zt_comm_op_name(int op)
{
    return op >= 0 && op < ZT_COMM_OP_COUNT ? k_op_names[op] : "?";
}

uint64_t zt_comm_op_bytes(int op, uint64_t count, uint64_t elem_size, int32_t ranks)
{
    uint64_t bytes = count * elem_size;
    return op == ZT_COMM_REDUCE_SCATTER || op == ZT_COMM_ALL_GATHER ? bytes * (uint64_t)ranks : bytes;
}

double zt_comm_busbw_factor(int op, int32_t ranks)
{
    double n = ranks > 0 ? ranks : 1;
    switch (op) {
    case ZT_COMM_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case ZT_COMM_REDUCE_SCATTER:
    case ZT_COMM_ALL_GATHER: return (n - 1) / n;
    default: return 1.0;
    }
}

double zt_comm_algbw_gbps(const zt_comm_op_stats *s)
{
    return s->time_s > 0 ? (double)s->bytes / s->time_s / 1e9 : 0.0;
}

double zt_comm_busbw_gbps(const zt_comm_op_stats *s)
{
    return zt_comm_algbw_gbps(s) * zt_comm_busbw_factor(s->op, s->ranks);
}

/* ---- state -------------------------------------------------------------------------------------- */

typedef struct totals {
    uint64_t count, bytes;
    double time_s;
} totals;

/* One (kind, group, caller). `step` is the step in progress; `steps` the finished ones; `outside`
 * what ran between steps. */
typedef struct entry {
    int32_t op;
    const comm_group *group;
    const char *caller; /* the plugin_ctx's name: lives as long as the runtime */
    totals step, steps, outside;
} entry;

/* A device-timed call whose events are not read yet. */
typedef struct pending {
    void *start, *end;
    int32_t entry;
    int32_t in_step; /* issued inside a step */
    uint64_t bytes;
} pending;

struct comm_monitor {
    pthread_mutex_t lock;
    zt_comms_logger_settings logger;
    uint32_t profiled;   /* bit per op: what the log (verbose lines, the end table) shows */
    int device_timing;   /* the device has timing events (CUDA) */
    int timing_failed;   /* an event call failed once: warned, device timing stopped */
    int in_step;
    entry *entries;
    int32_t n_entries, cap_entries;
    pending *pending;
    int32_t n_pending, cap_pending;
    void **spare;        /* events to reuse */
    int32_t n_spare, cap_spare;
    zt_comm_op_stats *snapshot;
    const char **snapshot_caller; /* summarize by caller: whose each row is */
    int32_t cap_snapshot;
};

/* Grow *items (of `size` bytes each) to hold one more; 0 when out of memory. */
static int reserve(void **items, int32_t *cap, int32_t n, size_t size)
{
    if (n < *cap) return 1;
    int32_t want = *cap ? *cap * 2 : 16;
    void *grown = realloc(*items, (size_t)want * size);
    if (!grown) return 0;
    *items = grown;
    *cap = want;
    return 1;
}

static zt_status parse_prof_ops(const char *list, uint32_t *bits, zt_error *err)
{
    *bits = 0;
    const char *p = list ? list : "";
    while (*p) {
        size_t n = strcspn(p, ",");
        while (n && p[0] == ' ') p++, n--;
        size_t len = n;
        while (len && p[len - 1] == ' ') len--;
        int found = -1;
        for (int op = 0; op < ZT_COMM_OP_COUNT && len; op++)
            if (strlen(k_op_names[op]) == len && strncmp(p, k_op_names[op], len) == 0) found = op;
        if (found < 0 && len)
            return zt_error_set(err, ZT_ERR_CONFIG,
                                "comms_logger.prof_ops: '%.*s' is not a collective zt issues; the names are "
                                "all_reduce, reduce_scatter, all_gather, broadcast, send and recv",
                                (int)len, p);
        if (found >= 0) *bits |= 1u << found;
        p += n;
        if (*p == ',') p++;
    }
    return ZT_OK;
}

zt_status rt_comm_monitor_create(zt_runtime *rt, const zt_comms_logger_settings *logger, zt_error *err)
{
    zt_comms_logger_settings defaults = {.enabled = 0, .verbose = 0, .prof_all = 1, .debug = 0, .prof_ops = ""};
    if (!logger) logger = &defaults;
    uint32_t bits = 0;
    zt_status st = parse_prof_ops(logger->prof_ops, &bits, err);
    if (st != ZT_OK) return st;
    comm_monitor *m = calloc(1, sizeof *m);
    if (!m) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating the communication monitor");
    pthread_mutex_init(&m->lock, NULL);
    m->logger = *logger;
    m->logger.prof_ops = NULL; /* parsed into `profiled`; the config's string need not outlive it */
    m->profiled = !logger->enabled || logger->prof_all ? (1u << ZT_COMM_OP_COUNT) - 1 : bits;
    const zt_device_backend *d = rt->device;
    m->device_timing = d->event_create && d->event_record && d->event_elapsed && d->event_destroy;
    rt->monitor = m;
    return ZT_OK;
}

void rt_comm_monitor_destroy(zt_runtime *rt)
{
    comm_monitor *m = rt->monitor;
    if (!m) return;
    const zt_device_backend *d = rt->device;
    for (int32_t i = 0; i < m->n_pending; i++) {
        d->event_destroy(&rt->device_ctx, m->pending[i].start);
        d->event_destroy(&rt->device_ctx, m->pending[i].end);
    }
    for (int32_t i = 0; i < m->n_spare; i++) d->event_destroy(&rt->device_ctx, m->spare[i]);
    free(m->pending);
    free(m->spare);
    free(m->entries);
    free(m->snapshot);
    free(m->snapshot_caller);
    pthread_mutex_destroy(&m->lock);
    free(m);
    rt->monitor = NULL;
}

/* ---- recording -------------------------------------------------------------------------------- */

/* The entry of (op, group, caller), made on first use; -1 when out of memory. Lock held. */
static int32_t entry_of(comm_monitor *m, int32_t op, const comm_group *g, const char *caller)
{
    for (int32_t i = 0; i < m->n_entries; i++)
        if (m->entries[i].op == op && m->entries[i].group == g && m->entries[i].caller == caller) return i;
    if (!reserve((void **)&m->entries, &m->cap_entries, m->n_entries, sizeof *m->entries)) return -1;
    m->entries[m->n_entries] = (entry){.op = op, .group = g, .caller = caller};
    return m->n_entries++;
}

static void log_call(const comm_monitor *m, zt_runtime *rt, const entry *e, uint64_t bytes, double seconds)
{
    if (!m->logger.enabled || !m->logger.verbose || !(m->profiled & (1u << e->op)) || rt->comm->world_rank != 0)
        return;
    zt_comm_op_stats s = {.op = e->op, .ranks = e->group->size, .count = 1, .bytes = bytes, .time_s = seconds};
    char caller[NAME_MAX_LEN + 16] = "";
    if (m->logger.debug) snprintf(caller, sizeof caller, " | caller %s", e->caller);
    zt_log(ZT_LOG_INFO, "comm op: %s | group %s (%d ranks) | %llu bytes | %.3f ms | algbw %.3f GB/s | busbw %.3f GB/s%s",
           zt_comm_op_name(e->op), e->group->name, (int)e->group->size, (unsigned long long)bytes, seconds * 1e3,
           zt_comm_algbw_gbps(&s), zt_comm_busbw_gbps(&s), caller);
}

/* Adds one call's time where it belongs now: the step in progress, else the finished steps (a call
 * of a step read after it ended) or outside. Lock held. */
static void add_time(comm_monitor *m, entry *e, int issued_in_step, double seconds)
{
    if (m->in_step) e->step.time_s += seconds;
    else if (issued_in_step) e->steps.time_s += seconds;
    else e->outside.time_s += seconds;
}

static void timing_failed(comm_monitor *m, const zt_error *err)
{
    if (!m->timing_failed)
        zt_log(ZT_LOG_WARN, "the communication monitor stops timing collectives on the device: %s (counts and bytes "
               "are still kept)", err->msg);
    m->timing_failed = 1;
}

static void *take_event(comm_monitor *m, zt_runtime *rt)
{
    if (m->n_spare > 0) return m->spare[--m->n_spare];
    void *event = NULL;
    zt_error err;
    if (rt->device->event_create(&rt->device_ctx, &event, &err) != ZT_OK) {
        timing_failed(m, &err);
        return NULL;
    }
    return event;
}

static void give_event(comm_monitor *m, zt_runtime *rt, void *event)
{
    if (!event) return;
    if (reserve((void **)&m->spare, &m->cap_spare, m->n_spare, sizeof *m->spare)) m->spare[m->n_spare++] = event;
    else rt->device->event_destroy(&rt->device_ctx, event);
}

void rt_comm_begin(plugin_ctx *pc, comm_probe *p, int32_t op, const comm_group *g, uint64_t count, int32_t dtype,
                   void *stream)
{
    zt_runtime *rt = pc->rt;
    comm_monitor *m = rt->monitor;
    memset(p, 0, sizeof *p);
    p->entry = -1;
    if (!m) return;
    p->bytes = zt_comm_op_bytes(op, count, zt_comm_element_size(dtype), g->size);
    p->stream = stream;
    pthread_mutex_lock(&m->lock);
    p->entry = entry_of(m, op, g, pc->name);
    if (p->entry >= 0 && m->device_timing && !m->timing_failed) {
        p->start = take_event(m, rt);
        zt_error err;
        if (p->start && rt->device->event_record(&rt->device_ctx, p->start, stream, &err) != ZT_OK) {
            timing_failed(m, &err);
            give_event(m, rt, p->start);
            p->start = NULL;
        }
    }
    pthread_mutex_unlock(&m->lock);
    p->started_s = zt_now_s();
}

void rt_comm_end(plugin_ctx *pc, comm_probe *p, zt_status st)
{
    zt_runtime *rt = pc->rt;
    comm_monitor *m = rt->monitor;
    if (!m || p->entry < 0) return;
    double seconds = zt_now_s() - p->started_s;
    pthread_mutex_lock(&m->lock);
    entry *e = &m->entries[p->entry];
    if (st == ZT_OK) { /* a failed collective ends the run with its own message; it moved nothing to count */
        totals *t = m->in_step ? &e->step : &e->outside;
        t->count++;
        t->bytes += p->bytes;
    }
    if (!p->start) {
        if (st == ZT_OK && !m->device_timing) {
            add_time(m, e, m->in_step, seconds);
            log_call(m, rt, e, p->bytes, seconds);
        }
    } else {
        void *end = st == ZT_OK ? take_event(m, rt) : NULL;
        zt_error err;
        if (end && rt->device->event_record(&rt->device_ctx, end, p->stream, &err) != ZT_OK) {
            timing_failed(m, &err);
            give_event(m, rt, end);
            end = NULL;
        }
        if (end && reserve((void **)&m->pending, &m->cap_pending, m->n_pending, sizeof *m->pending)) {
            m->pending[m->n_pending++] =
                (pending){.start = p->start, .end = end, .entry = p->entry, .in_step = m->in_step, .bytes = p->bytes};
        } else {
            give_event(m, rt, p->start);
            give_event(m, rt, end);
        }
    }
    pthread_mutex_unlock(&m->lock);
}

/* Reads every pending pair whose events have completed, keeping the others in order. Lock held. */
static void read_events(comm_monitor *m, zt_runtime *rt)
{
    int32_t kept = 0;
    for (int32_t i = 0; i < m->n_pending; i++) {
        pending *q = &m->pending[i];
        double seconds = 0;
        zt_error err;
        int done = m->timing_failed ? -1 : rt->device->event_elapsed(&rt->device_ctx, q->start, q->end, &seconds, &err);
        if (done == 0) {
            m->pending[kept++] = *q;
            continue;
        }
        if (done > 0) {
            add_time(m, &m->entries[q->entry], q->in_step, seconds);
            log_call(m, rt, &m->entries[q->entry], q->bytes, seconds);
        } else if (!m->timing_failed) {
            timing_failed(m, &err);
        }
        give_event(m, rt, q->start);
        give_event(m, rt, q->end);
    }
    m->n_pending = kept;
}

/* ---- steps ------------------------------------------------------------------------------------ */

void zt_runtime_comm_step_begin(zt_runtime *rt)
{
    comm_monitor *m = rt->monitor;
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    m->in_step = 1;
    pthread_mutex_unlock(&m->lock);
}

static void add_totals(totals *into, const totals *t)
{
    into->count += t->count;
    into->bytes += t->bytes;
    into->time_s += t->time_s;
}

/* The entries summed over callers into m->snapshot (by kind and group, in order of first use), from
 * `which` totals of each entry. `only_profiled`: the kinds the log shows. Returns how many; lock held. */
static int32_t summarize(comm_monitor *m, size_t which, int only_profiled, int by_caller)
{
    if (m->cap_snapshot < m->n_entries) {
        zt_comm_op_stats *grown = realloc(m->snapshot, (size_t)m->n_entries * sizeof *grown);
        if (grown) m->snapshot = grown;
        const char **callers = realloc(m->snapshot_caller, (size_t)m->n_entries * sizeof *callers);
        if (callers) m->snapshot_caller = callers;
        if (!grown || !callers) return 0;
        m->cap_snapshot = m->n_entries;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < m->n_entries; i++) {
        const entry *e = &m->entries[i];
        const totals *t = (const totals *)((const char *)e + which);
        if (t->count == 0 && t->time_s == 0) continue;
        if (only_profiled && !(m->profiled & (1u << e->op))) continue;
        int32_t k = 0;
        while (k < n && (by_caller || m->snapshot[k].op != e->op || strcmp(m->snapshot[k].group, e->group->name) != 0))
            k++;
        if (k == n) {
            zt_comm_op_stats *s = &m->snapshot[n++];
            memset(s, 0, sizeof *s);
            s->op = e->op;
            s->ranks = e->group->size;
            snprintf(s->group, sizeof s->group, "%s", e->group->name);
            m->snapshot_caller[k] = e->caller;
        }
        m->snapshot[k].count += t->count;
        m->snapshot[k].bytes += t->bytes;
        m->snapshot[k].time_s += t->time_s;
    }
    return n;
}

void zt_runtime_comm_step_end(zt_runtime *rt, zt_comm_stats *out)
{
    memset(out, 0, sizeof *out);
    comm_monitor *m = rt->monitor;
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    read_events(m, rt);
    out->n_ops = summarize(m, offsetof(entry, step), 0, 0);
    out->ops = m->snapshot;
    for (int32_t k = 0; k < out->n_ops; k++) out->time_s += m->snapshot[k].time_s;
    for (int32_t i = 0; i < m->n_entries; i++) {
        add_totals(&m->entries[i].steps, &m->entries[i].step);
        memset(&m->entries[i].step, 0, sizeof m->entries[i].step);
    }
    m->in_step = 0;
    pthread_mutex_unlock(&m->lock);
}

/* ---- the end-of-run table --------------------------------------------------------------------- */

/* What each rank sends rank 0: its steps' time, then calls, bytes and seconds per kind. */
#define RANK_FIELDS (1 + 3 * ZT_COMM_OP_COUNT)

static void rank_totals(const comm_monitor *m, double steps_s, double *v)
{
    memset(v, 0, RANK_FIELDS * sizeof *v);
    v[0] = steps_s;
    for (int32_t i = 0; i < m->n_entries; i++) {
        const entry *e = &m->entries[i];
        double *k = v + 1 + 3 * e->op;
        k[0] += (double)e->steps.count;
        k[1] += (double)e->steps.bytes;
        k[2] += e->steps.time_s;
    }
}

static void log_rank_line(int rank, const double *v)
{
    double calls = 0, bytes = 0, seconds = 0;
    char kinds[512] = "";
    size_t used = 0;
    for (int op = 0; op < ZT_COMM_OP_COUNT; op++) {
        const double *k = v + 1 + 3 * op;
        calls += k[0];
        bytes += k[1];
        seconds += k[2];
        if (k[0] > 0 && used < sizeof kinds)
            used += (size_t)snprintf(kinds + used, sizeof kinds - used, " | %s %.6f s", k_op_names[op], k[2]);
    }
    zt_log(ZT_LOG_INFO, "  rank %d: %.6f s in collectives (%.1f%% of %.3f s of steps), %.0f bytes in %.0f calls%s",
           rank, seconds, v[0] > 0 ? 100.0 * seconds / v[0] : 0.0, v[0], bytes, calls, kinds);
}

static void log_table(const comm_monitor *m, int32_t rows)
{
    int by_caller = m->logger.enabled && m->logger.debug;
    zt_log(ZT_LOG_INFO, "  %-15s %-8s %5s %10s %16s %12s %12s %12s%s", "op", "group", "ranks", "calls", "bytes",
           "time_s", "algbw_GB/s", "busbw_GB/s", by_caller ? " caller" : "");
    for (int32_t k = 0; k < rows; k++) {
        const zt_comm_op_stats *s = &m->snapshot[k];
        zt_log(ZT_LOG_INFO, "  %-15s %-8s %5d %10llu %16llu %12.6f %12.3f %12.3f%s%s", zt_comm_op_name(s->op),
               s->group, (int)s->ranks, (unsigned long long)s->count, (unsigned long long)s->bytes, s->time_s,
               zt_comm_algbw_gbps(s), zt_comm_busbw_gbps(s), by_caller ? " " : "",
               by_caller ? m->snapshot_caller[k] : "");
    }
}

zt_status zt_runtime_comm_report(zt_runtime *rt, double steps_s, zt_error *err)
{
    comm_monitor *m = rt->monitor;
    if (!m) return ZT_OK;
    /* The run is over: wait for the device once, so every call's events can be read. */
    zt_status st = m->n_pending ? rt->device->sync(&rt->device_ctx, NULL, err) : ZT_OK;
    if (st != ZT_OK) return st;
    int32_t world = rt->comm->world_size, me = rt->comm->world_rank;
    double *all = calloc((size_t)world * RANK_FIELDS, sizeof *all);
    if (!all) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory gathering the communication totals");
    double mine[RANK_FIELDS];
    pthread_mutex_lock(&m->lock);
    read_events(m, rt);
    rank_totals(m, steps_s, mine);
    pthread_mutex_unlock(&m->lock);
    memcpy(all + (size_t)me * RANK_FIELDS, mine, sizeof mine);

    /* Straight to the backend, on "world": the report's own gather is not one of the run's collectives. */
    comm_group *w = NULL;
    for (comm_group *g = rt->groups; g; g = g->next)
        if (strcmp(g->name, "world") == 0) w = g;
    if (world > 1 && w) {
        st = rt->comm->all_gather(rt->comm, w->comm, mine, all, sizeof mine, ZT_U8,
                                  rt->device_ctx.comm_stream, err);
        if (st == ZT_OK && rt->device_ctx.comm_stream) st = rt->device->sync(&rt->device_ctx, rt->device_ctx.comm_stream, err);
    }
    if (st != ZT_OK || me != 0) {
        free(all);
        return st;
    }

    pthread_mutex_lock(&m->lock);
    int restricted = m->logger.enabled && !m->logger.prof_all;
    int32_t rows = summarize(m, offsetof(entry, steps), 1, m->logger.enabled && m->logger.debug);
    zt_log(ZT_LOG_INFO, "communication during the steps, rank 0%s (bytes as nccl-tests counts them; docs/distributed.md):",
           restricted ? ", the kinds in comms_logger.prof_ops" : "");
    if (rows) log_table(m, rows);
    else zt_log(ZT_LOG_INFO, "  (no collectives%s)", restricted ? " of those kinds" : "");
    totals outside = {0, 0, 0};
    for (int32_t i = 0; i < m->n_entries; i++)
        if (m->profiled & (1u << m->entries[i].op)) add_totals(&outside, &m->entries[i].outside);
    if (outside.count)
        zt_log(ZT_LOG_INFO, "  outside the steps (setup, evaluation, checkpoints): %llu calls, %llu bytes, %.6f s",
               (unsigned long long)outside.count, (unsigned long long)outside.bytes, outside.time_s);
    pthread_mutex_unlock(&m->lock);
    if (world > 1) {
        zt_log(ZT_LOG_INFO, "communication during the steps, per rank:");
        for (int32_t r = 0; r < world; r++) log_rank_line(r, all + (size_t)r * RANK_FIELDS);
    }
    free(all);
    return ZT_OK;
}
