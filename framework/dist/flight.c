/* The flight recorder's rank side: the ring, the hooks of collectives.c and the comm modules, and
 * the async-signal-safe dump (flight.h). Its analysis is in flight_report.c. */
#define _XOPEN_SOURCE 700 /* sigaction with SA_ONSTACK, pthread_sigmask, clock_gettime */
#include "dist/flight.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/comm.h"
#include "dist/job.h"

#define MAX_GROUPS 64
#define GROUP_NAME_MAX 64

enum { STATE_ISSUED = 1, STATE_ENQUEUED, STATE_COMPLETED, STATE_FAILED };

static const char *const k_op_names[ZT_FLIGHT_OP_COUNT] = {"all_reduce", "reduce_scatter", "all_gather",
                                                           "broadcast", "send", "recv", "barrier"};
static const char *const k_state_names[] = {"?", "issued", "enqueued", "completed", "failed"};

/* One collective. `id` (the token; 1, 2, ... over the whole process) is 0 while the slot is being
 * written, and written last: a reader that sees the same non-zero id before and after copying the
 * slot has a whole one. */
typedef struct slot {
    _Atomic uint64_t id;
    uint64_t seq, count, bytes;
    int32_t group, op, dtype, peer;
    uint64_t issued_ns;
    _Atomic uint64_t completed_ns; /* written before state becomes completed */
    _Atomic int32_t state;
} slot;

typedef struct group_info {
    char name[GROUP_NAME_MAX];
    int32_t size, rank;
    int32_t *world_ranks;
    _Atomic uint64_t issued;    /* the last sequence number issued: seq runs 1, 2, ... per group */
    _Atomic uint64_t completed; /* the highest sequence number completed */
} group_info;

static struct {
    slot *ring;
    uint32_t entries;
    int32_t rank, world_size;
    _Atomic uint64_t next_id;
    group_info groups[MAX_GROUPS];
    _Atomic int32_t n_groups;
    char dir[PATH_MAX - 64];
    _Atomic int dumping;   /* a dump is being written (this thread interrupted it, or another) */
    _Atomic int finalized; /* a timeout or a fatal signal was dumped: later dumps keep it */
    struct sigaction fatal_before[5];
} g;

static _Thread_local uint64_t t_current;

static const int k_fatal_signals[5] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

static uint64_t now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- recording ----------------------------------------------------------------------------------- */

int32_t zt_flight_group(const char *name, const int32_t *world_ranks, int32_t n, int32_t my_rank)
{
    int32_t index = atomic_load(&g.n_groups);
    if (!g.ring || index >= MAX_GROUPS) return -1;
    group_info *gi = &g.groups[index];
    gi->world_ranks = malloc((size_t)n * sizeof *gi->world_ranks);
    if (!gi->world_ranks) return -1;
    memcpy(gi->world_ranks, world_ranks, (size_t)n * sizeof *world_ranks);
    size_t len = strlen(name);
    if (len >= sizeof gi->name) len = sizeof gi->name - 1;
    memcpy(gi->name, name, len);
    gi->name[len] = '\0';
    gi->size = n;
    gi->rank = my_rank;
    atomic_store(&g.n_groups, index + 1); /* published whole: a dump reads only groups below n_groups */
    return index;
}

uint64_t zt_flight_issue(int32_t group, int op, uint64_t count, int32_t dtype, uint64_t bytes, int32_t peer)
{
    t_current = 0;
    if (!g.ring || group < 0 || group >= atomic_load(&g.n_groups)) return 0;
    uint64_t id = atomic_fetch_add_explicit(&g.next_id, 1, memory_order_relaxed) + 1;
    slot *s = &g.ring[(id - 1) % g.entries];
    atomic_store_explicit(&s->id, 0, memory_order_release);
    group_info *gi = &g.groups[group];
    s->seq = atomic_fetch_add_explicit(&gi->issued, 1, memory_order_relaxed) + 1;
    s->count = count;
    s->bytes = bytes;
    s->group = group;
    s->op = op;
    s->dtype = dtype;
    s->peer = peer;
    s->issued_ns = now_ns(CLOCK_MONOTONIC);
    atomic_store_explicit(&s->completed_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&s->state, STATE_ISSUED, memory_order_relaxed);
    atomic_store_explicit(&s->id, id, memory_order_release);
    t_current = id;
    return id;
}

/* The slot of `token` while it still holds that collective; NULL once the ring has moved past. */
static slot *slot_of(uint64_t token)
{
    if (!token || !g.ring) return NULL;
    slot *s = &g.ring[(token - 1) % g.entries];
    return atomic_load_explicit(&s->id, memory_order_acquire) == token ? s : NULL;
}

static void complete(uint64_t token)
{
    slot *s = slot_of(token);
    /* The first event of a collective is its own (a staged one has a copy after it). */
    if (!s || atomic_load_explicit(&s->state, memory_order_acquire) == STATE_COMPLETED) return;
    atomic_store_explicit(&s->completed_ns, now_ns(CLOCK_MONOTONIC), memory_order_relaxed);
    atomic_store_explicit(&s->state, STATE_COMPLETED, memory_order_release);
    group_info *gi = &g.groups[s->group];
    uint64_t seen = atomic_load(&gi->completed);
    while (seen < s->seq && !atomic_compare_exchange_weak(&gi->completed, &seen, s->seq)) {
    }
}

void zt_flight_returned(uint64_t token, int ok, int async)
{
    t_current = 0;
    slot *s = slot_of(token);
    if (!s) return;
    if (!ok) {
        atomic_store_explicit(&s->state, STATE_FAILED, memory_order_release);
    } else if (!async) {
        complete(token);
    } else {
        /* The NCCL watchdog may have seen it complete already: issued becomes enqueued, nothing else. */
        int32_t issued = STATE_ISSUED;
        atomic_compare_exchange_strong(&s->state, &issued, STATE_ENQUEUED);
    }
}

/* ---- the dump (async-signal-safe) ------------------------------------------------------------------ */

typedef struct writer {
    int fd, failed;
    size_t len;
    char buf[4096];
} writer;

static void w_flush(writer *w)
{
    size_t done = 0;
    while (done < w->len && !w->failed) {
        ssize_t put = write(w->fd, w->buf + done, w->len - done);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) w->failed = 1;
        else done += (size_t)put;
    }
    w->len = 0;
}

static void w_text(writer *w, const char *text)
{
    for (const char *c = text; *c; c++) {
        if (w->len == sizeof w->buf) w_flush(w);
        w->buf[w->len++] = *c;
    }
}

static void w_uint(writer *w, uint64_t v)
{
    char digits[24], text[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++) text[i] = digits[n - 1 - i];
    text[n] = '\0';
    w_text(w, text);
}

static void w_int(writer *w, int64_t v)
{
    if (v < 0) {
        w_text(w, "-");
        w_uint(w, 0ull - (uint64_t)v);
    } else {
        w_uint(w, (uint64_t)v);
    }
}

/* Nanoseconds as seconds with 6 decimals. */
static void w_seconds(writer *w, uint64_t ns)
{
    w_uint(w, ns / 1000000000ull);
    char frac[8];
    uint64_t us = ns % 1000000000ull / 1000ull;
    for (int i = 5; i >= 0; i--) {
        frac[i] = (char)('0' + us % 10);
        us /= 10;
    }
    frac[6] = '\0';
    w_text(w, ".");
    w_text(w, frac);
}

/* A JSON string: quotes and backslashes escaped, control characters dropped. */
static void w_string(writer *w, const char *s)
{
    w_text(w, "\"");
    for (const char *c = s; *c; c++) {
        char one[3] = {*c, '\0', '\0'};
        if (*c == '"' || *c == '\\') {
            one[0] = '\\';
            one[1] = *c;
        } else if ((unsigned char)*c < 0x20) {
            continue;
        }
        w_text(w, one);
    }
    w_text(w, "\"");
}

static void write_header(writer *w, const char *reason, uint64_t recorded, int32_t n_groups)
{
    w_text(w, "{\"flight_recorder\":1,\"rank\":");
    w_int(w, g.rank);
    w_text(w, ",\"world_size\":");
    w_int(w, g.world_size);
    w_text(w, ",\"pid\":");
    w_int(w, getpid());
    w_text(w, ",\"reason\":");
    w_string(w, reason);
    w_text(w, ",\"dumped_s\":");
    w_seconds(w, now_ns(CLOCK_MONOTONIC));
    w_text(w, ",\"unix_s\":");
    w_seconds(w, now_ns(CLOCK_REALTIME));
    w_text(w, ",\"entries\":");
    w_uint(w, g.entries);
    w_text(w, ",\"recorded\":");
    w_uint(w, recorded);
    w_text(w, ",\"groups\":[");
    for (int32_t i = 0; i < n_groups; i++) {
        const group_info *gi = &g.groups[i];
        w_text(w, i ? ",{\"name\":" : "{\"name\":");
        w_string(w, gi->name);
        w_text(w, ",\"rank\":");
        w_int(w, gi->rank);
        w_text(w, ",\"size\":");
        w_int(w, gi->size);
        w_text(w, ",\"ranks\":[");
        for (int32_t r = 0; r < gi->size; r++) {
            if (r) w_text(w, ",");
            w_int(w, gi->world_ranks[r]);
        }
        w_text(w, "],\"issued\":");
        w_uint(w, atomic_load(&gi->issued));
        w_text(w, ",\"completed\":");
        w_uint(w, atomic_load(&gi->completed));
        w_text(w, "}");
    }
    w_text(w, "]}\n");
}

static void write_entry(writer *w, uint64_t id, const slot *s, int32_t state, uint64_t completed_ns)
{
    w_text(w, "{\"seq\":");
    w_uint(w, s->seq);
    w_text(w, ",\"id\":");
    w_uint(w, id);
    w_text(w, ",\"op\":\"");
    w_text(w, s->op >= 0 && s->op < ZT_FLIGHT_OP_COUNT ? k_op_names[s->op] : "?");
    w_text(w, "\",\"group\":");
    w_string(w, g.groups[s->group].name);
    w_text(w, ",\"count\":");
    w_uint(w, s->count);
    w_text(w, ",\"bytes\":");
    w_uint(w, s->bytes);
    w_text(w, ",\"dtype\":\"");
    w_text(w, zt_comm_dtype_name(s->dtype));
    w_text(w, "\"");
    if (s->peer >= 0) {
        w_text(w, s->op == ZT_FLIGHT_BROADCAST ? ",\"root\":" : ",\"peer\":");
        w_int(w, s->peer);
    }
    w_text(w, ",\"state\":\"");
    w_text(w, state >= STATE_ISSUED && state <= STATE_FAILED ? k_state_names[state] : "?");
    w_text(w, "\",\"issued_s\":");
    w_seconds(w, s->issued_ns);
    w_text(w, ",\"completed_s\":");
    if (state == STATE_COMPLETED) w_seconds(w, completed_ns);
    else w_text(w, "null");
    w_text(w, "}\n");
}

static int dump(const char *reason, int final)
{
    if (!g.ring || !g.dir[0] || atomic_load(&g.finalized)) return -1;
    if (atomic_exchange(&g.dumping, 1)) return -1;
    /* The interrupts that end a rank wait until the file is whole. */
    sigset_t block, before;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &block, &before);

    char path[PATH_MAX], tmp[PATH_MAX];
    size_t len = 0;
    path[0] = '\0';
    zt_job_append(path, sizeof path, &len, g.dir);
    zt_job_append(path, sizeof path, &len, "/rank-");
    zt_job_append_int(path, sizeof path, &len, g.rank);
    zt_job_append(path, sizeof path, &len, ZT_FLIGHT_SUFFIX);
    len = 0;
    tmp[0] = '\0';
    zt_job_append(tmp, sizeof tmp, &len, path);
    zt_job_append(tmp, sizeof tmp, &len, ".tmp");
    static writer w; /* static: a signal handler's stack may be small */
    w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    w.failed = w.fd < 0;
    w.len = 0;
    int rc = -1;
    if (!w.failed) {
        uint64_t recorded = atomic_load(&g.next_id);
        write_header(&w, reason, recorded, atomic_load(&g.n_groups));
        uint64_t first = recorded > g.entries ? recorded - g.entries + 1 : 1;
        for (uint64_t id = first; id <= recorded && id; id++) {
            const slot *s = &g.ring[(id - 1) % g.entries];
            if (atomic_load_explicit(&s->id, memory_order_acquire) != id) continue;
            slot copy;
            memcpy(&copy, s, sizeof copy);
            int32_t state = atomic_load_explicit(&s->state, memory_order_acquire);
            uint64_t done_ns = atomic_load_explicit(&s->completed_ns, memory_order_relaxed);
            if (atomic_load_explicit(&s->id, memory_order_acquire) != id) continue; /* rewritten meanwhile */
            write_entry(&w, id, &copy, state, done_ns);
        }
        w_flush(&w);
        close(w.fd);
        rc = w.failed || rename(tmp, path) != 0 ? -1 : 0;
        if (rc) unlink(tmp);
    }
    if (rc == 0 && final) atomic_store(&g.finalized, 1);
    atomic_store(&g.dumping, 0);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    return rc;
}

int zt_flight_dump(const char *reason) { return dump(reason, 0); }

static void on_fatal_signal(int sig)
{
    const char *what = sig == SIGSEGV ? "fatal signal SIGSEGV"
                       : sig == SIGBUS ? "fatal signal SIGBUS"
                       : sig == SIGFPE ? "fatal signal SIGFPE"
                       : sig == SIGILL ? "fatal signal SIGILL"
                                       : "fatal signal SIGABRT";
    dump(what, 1);
    for (int i = 0; i < 5; i++)
        if (k_fatal_signals[i] == sig) sigaction(sig, &g.fatal_before[i], NULL);
    raise(sig); /* what the signal would have done without the recorder */
}

/* ---- the modules' hooks ------------------------------------------------------------------------- */

static uint64_t hook_current(void) { return t_current; }
static void hook_completed(uint64_t token) { complete(token); }
static void hook_dump(const char *reason) { dump(reason, 1); }

/* Without zt-run --nproc nobody analyzes the dumps after the job: the rank that timed out does,
 * once the others that time out too have written theirs. */
static void hook_report(void)
{
    if (zt_job_attached() || !g.ring || !g.dir[0]) return;
    char path[PATH_MAX];
    for (int tries = 0; tries < 30; tries++) { /* 3 s at most */
        int32_t have = 0;
        for (int32_t r = 0; r < g.world_size; r++) {
            snprintf(path, sizeof path, "%s/rank-%d%s", g.dir, (int)r, ZT_FLIGHT_SUFFIX);
            have += access(path, F_OK) == 0;
        }
        if (have == g.world_size) break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char prefix[48];
    snprintf(prefix, sizeof prefix, "zt[rank %d] flight recorder: ", (int)g.rank);
    zt_error err;
    int n = 0;
    if (zt_flight_analyze(g.dir, g.world_size, NULL, stderr, prefix, &n, &err) != ZT_OK)
        fprintf(stderr, "%s%s\n", prefix, err.msg);
    fflush(stderr);
}

static const zt_flight_hooks k_hooks = {
    .current = hook_current, .completed = hook_completed, .dump = hook_dump, .report = hook_report};

const zt_flight_hooks *zt_flight_hooks_get(void) { return &k_hooks; }

/* ---- set-up ------------------------------------------------------------------------------------- */

zt_status zt_flight_init(int32_t rank, int32_t world_size, uint32_t entries, zt_error *err)
{
    if (g.ring || !entries) return ZT_OK;
    g.ring = calloc(entries, sizeof *g.ring);
    if (!g.ring)
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the flight recorder's %u entries "
                            "(comm.flight_recorder.entries; 0 turns it off)", entries);
    g.entries = entries;
    g.rank = rank;
    g.world_size = world_size;
    if (zt_job_attached()) snprintf(g.dir, sizeof g.dir, "%s", zt_job_dir());
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sa.sa_flags = SA_ONSTACK; /* the plugin guard's alternate stack, when there is one */
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 5; i++) sigaction(k_fatal_signals[i], &sa, &g.fatal_before[i]);
    return ZT_OK;
}

void zt_flight_set_dir(const char *dir)
{
    /* One process has no peers to be behind: its collectives are copies, and it writes no dump. */
    if (!g.ring || zt_job_attached() || g.world_size < 2 || !dir || strlen(dir) >= sizeof g.dir) return;
    snprintf(g.dir, sizeof g.dir, "%s", dir);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/rank-%d%s", g.dir, (int)g.rank, ZT_FLIGHT_SUFFIX);
    unlink(path); /* an earlier run's: the analysis would read it as this run's */
}
