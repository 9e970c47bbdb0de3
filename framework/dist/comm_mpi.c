/* The MPI communication backend: the CPU ranks of one job talk through MPI (Open MPI on Debian).
 * Built as the MODULE libzt-comm-mpi.so (framework/CMakeLists.txt), so only this file links libmpi;
 * comm_mpi.h is its interface, comm.h the table it fills, docs/distributed.md the user's view.
 *
 * The watchdog. Every wait for other ranks is watched: it is a non-blocking MPI call completed by a
 * test loop, so a collective that the other ranks never join ends the whole job after
 * comm.timeout_s with a message naming it (then MPI_Abort, which makes mpirun stop every rank)
 * instead of hanging forever. Collectives first meet that way and check that every rank is doing
 * the same, then move their data with MPI's faster blocking call (meet_and_agree says why), which a
 * thread watches instead (a rank stopped or stuck in the middle of it). Point to point, group
 * creation, start-up and shutdown are watched the same way.
 * While a wait is long, SIGTERM (what mpirun sends every rank when one dies) first prints what
 * this rank was waiting in, so the job's output shows where each survivor stood; under zt-run
 * --nproc it also names the ranks that are gone or stopped (job.h), and so does a timeout.
 *
 * Threads. MPI is initialized with MPI_THREAD_SERIALIZED: collectives may come from any thread,
 * one at a time, in the same order on every rank of a group. The trainer issues them from its one
 * thread, for which MPI_THREAD_FUNNELED would do; SERIALIZED costs nothing more in Open MPI and
 * leaves room for a communication thread. Nothing here locks: the caller serializes.
 *
 * Errors. MPI_COMM_WORLD and every communicator made from it return MPI errors
 * (MPI_ERRORS_RETURN) instead of aborting; they become ZT_ERR_COMM messages that name the call.
 */
#define _POSIX_C_SOURCE 200809L /* sigaction, nanosleep, clock_gettime */
#include "base/clock.h"
#include "dist/comm_mpi.h"
#include "dist/flight.h"
#include "dist/job.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define GROUP_NAME_MAX 64
#define HANDSHAKE_TAG 1 /* on the control communicator, which carries nothing else */

enum op_kind { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_SEND, OP_RECV, OP_BARRIER, OP_COUNT };
static const char *const k_op_names[OP_COUNT] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                 "send", "recv", "barrier"};

typedef struct mpi_group {
    MPI_Comm comm;
    char name[GROUP_NAME_MAX];
    int rank, size;
    uint64_t n_calls[OP_COUNT]; /* numbers the calls in messages: "all_reduce #57" */
    uint64_t n_collectives;     /* all collectives so far: part of each one's agreement */
} mpi_group;

typedef struct mpi_backend {
    zt_comm_backend base; /* first, so a zt_comm_backend * is an mpi_backend * */
    double timeout_s;     /* 0: wait forever */
    int finalize_mpi;     /* this backend initialized MPI, so destroy finalizes it */
    MPI_Comm control;     /* a private duplicate of MPI_COMM_WORLD for group-creation handshakes */
} mpi_backend;

/* ---- what this rank is waiting in -------------------------------------------------------------- */

/* One wait at a time (the caller serializes), so its description is process state: the timeout
 * message and the SIGTERM handler read it. `g_term_line` is complete before the handler that
 * prints it is installed. */
static char g_waiting_in[320];
static char g_term_line[640];
static struct sigaction g_term_before; /* the SIGTERM disposition the wait replaced */
static const zt_flight_hooks *g_flight; /* zt-run's flight recorder (dist/flight.h); NULL: none */

EXPORT void zt_comm_mpi_flight_v1(const zt_flight_hooks *hooks);
EXPORT void zt_comm_mpi_flight_v1(const zt_flight_hooks *hooks) { g_flight = hooks; }

/* Async-signal-safe: write(2), sigaction, raise and job.h's reads only. Prints where this rank
 * stood (unless zt-run --nproc relayed a user's SIGTERM), then does what SIGTERM would have done
 * without the wait: the trainer's handler (which says whether the job is being torn down or the user
 * asked for a checkpoint), ignoring it, or the default (terminate), for which this line says why. */
static void on_term_while_waiting(int sig, siginfo_t *info, void *context)
{
    /* A user's SIGTERM that zt-run --nproc relays asks for a checkpoint: nothing to explain. */
    int user_interrupt = zt_job_attached() && !zt_job_sigterm_ends_job();
    static char line[2048];
    size_t len = 0;
    line[0] = '\0';
    zt_job_append(line, sizeof line, &len, g_term_line);
    int handled = (g_term_before.sa_flags & SA_SIGINFO) ||
                  (g_term_before.sa_handler != SIG_DFL && g_term_before.sa_handler != SIG_IGN);
    if (!handled) {
        size_t before = len;
        zt_job_append(line, sizeof line, &len, ": ");
        if (!zt_job_describe_peers(line, sizeof line, &len)) {
            len = before;
            line[len] = '\0';
            zt_job_append(line, sizeof line, &len, zt_job_attached()
                          ? " (the launcher is ending the job: its message says why)"
                          : " (mpirun sends SIGTERM to every rank when one fails, or when it is interrupted "
                            "itself: the first error in the job's output names a failed rank)");
        }
    }
    zt_job_append(line, sizeof line, &len, "\n");
    if (!user_interrupt) {
        ssize_t ignored = write(STDERR_FILENO, line, len);
        (void)ignored;
    }
    if (!handled) {
        if (g_flight) g_flight->dump("SIGTERM while waiting for the other ranks");
        zt_job_note_end("terminated", 128 + sig);
    }
    if (g_term_before.sa_flags & SA_SIGINFO) {
        g_term_before.sa_sigaction(sig, info, context);
    } else if (g_term_before.sa_handler == SIG_DFL) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL);
        raise(sig); /* delivered when this handler returns: the process ends by SIGTERM, as it would have */
    } else if (g_term_before.sa_handler != SIG_IGN) {
        g_term_before.sa_handler(sig);
    }
}

static void watch_sigterm(const mpi_backend *b)
{
    snprintf(g_term_line, sizeof g_term_line, "zt[rank %d] SIGTERM while this rank waited in %s for the other ranks",
             b->base.world_rank, g_waiting_in);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_term_while_waiting;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &g_term_before);
}

static void unwatch_sigterm(void) { sigaction(SIGTERM, &g_term_before, NULL); }

/* ---- waiting under the watchdog ---------------------------------------------------------------- */

static zt_status mpi_failed(int rc, zt_error *err)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error code %d", rc);
    return zt_error_set(err, ZT_ERR_COMM,
                        "MPI failed in %s: %s; if another rank died, its output or the launcher's message "
                        "says why", g_waiting_in, text);
}

/* Ends every rank of the job: this one cannot go on, and the others would otherwise wait for it. */
static void abort_job(const mpi_backend *b, const char *why, int from_watch_thread)
{
    fprintf(stderr, "zt[rank %d] error: %s; ending every rank of the job\n", b->base.world_rank, why);
    fflush(stderr);
    if (g_flight) {
        char reason[400];
        snprintf(reason, sizeof reason, "watchdog: timed out in %s", g_waiting_in);
        g_flight->dump(reason);
        g_flight->report();
    }
    zt_job_note_end("aborted", 1);
    /* MPI_THREAD_SERIALIZED: the watch thread may not call MPI while the main thread is inside it.
     * A rank that exits non-zero makes the launcher end the others, as MPI_Abort does. */
    if (!from_watch_thread) MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1); /* MPI_Abort does not return; this is for an MPI that does */
}

/* ---- watching the data phase --------------------------------------------------------------------- */

/* The blocking data phase after a meeting cannot be tested in a loop, and a rank stopped or stuck in
 * it (SIGSTOP, a debugger) would hold the others there for ever. While a data phase runs,
 * g_data_since_us holds when it started (0: none); a thread looks every 200 ms and, past
 * comm.timeout_s, ends this rank as a timed-out wait does. Time this process itself did not run
 * (stopped: the thread sees a gap of a second or more) does not count, as in wait_watched. */
static _Atomic int64_t g_data_since_us;
static pthread_once_t g_watch_once = PTHREAD_ONCE_INIT;
static const mpi_backend *g_watched;

static int64_t now_us(void) { return (int64_t)(zt_now_s() * 1e6); }

static void *watch_data_phase(void *arg)
{
    (void)arg;
    const mpi_backend *b = g_watched;
    int64_t last = now_us();
    for (;;) {
        struct timespec pause = {0, 200 * 1000 * 1000};
        nanosleep(&pause, NULL);
        int64_t now = now_us(), since = atomic_load(&g_data_since_us);
        if (since && now - last >= 1000000) /* this process was not running: move the start on */
            atomic_compare_exchange_strong(&g_data_since_us, &since, since + (now - last));
        last = now;
        since = atomic_load(&g_data_since_us);
        if (!since || (double)(now - since) < b->timeout_s * 1e6) continue;
        char trouble[1024] = "";
        size_t trouble_len = 0;
        zt_job_append(trouble, sizeof trouble, &trouble_len, "; ");
        if (!zt_job_describe_peers(trouble, sizeof trouble, &trouble_len)) trouble[0] = '\0';
        char why[2048];
        snprintf(why, sizeof why, "timed out after %g s in %s, moving its data: every rank had met for it, and "
                 "one has not finished (stopped, stuck, or too slow)%s (if a rank legitimately needs longer, "
                 "raise comm.timeout_s)", b->timeout_s, g_waiting_in, trouble);
        abort_job(b, why, 1);
    }
    return NULL;
}

static void start_watch_thread(void)
{
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* Signals go to the main thread, whose handlers say what it waits in. */
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &before);
    if (pthread_create(&thread, &attr, watch_data_phase, NULL) != 0)
        fprintf(stderr, "zt warning: cannot start the thread that watches MPI's data phases; a rank stopped in "
                "one is not timed out\n");
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    pthread_attr_destroy(&attr);
}

static void data_phase_begin(const mpi_backend *b)
{
    if (b->timeout_s <= 0) return;
    g_watched = b;
    pthread_once(&g_watch_once, start_watch_thread);
    atomic_store(&g_data_since_us, now_us());
}

static void data_phase_end(void) { atomic_store(&g_data_since_us, 0); }

/* The pause between two tests of a pending request. MPI makes progress only inside MPI calls
 * (Open MPI has no progress thread), so the first milliseconds spin at full speed: a meeting whose
 * ranks are all there, or a transfer under way, completes as fast as a blocking call would. Then
 * the CPU goes to whoever needs it (ranks may outnumber cores), and a wait longer than a second,
 * which is a straggler, polls at a gentle rate. */
static void pause_between_tests(double waited_s)
{
    if (waited_s < 0.01) return;
    if (waited_s < 1.0) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
}

/* Completes reqs[0..n) or ends the job when the timeout passes. `peers`, when not NULL, gives the
 * rank each request waits for, so a timeout can name the ranks that never came; else `missing`
 * says who is missing. g_waiting_in says what the wait is for. */
static zt_status wait_watched(const mpi_backend *b, MPI_Request *reqs, int n, const int *peers,
                              const char *missing, zt_error *err)
{
    int done = 0;
    int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, err);
    if (done) return ZT_OK;
    watch_sigterm(b);
    double last = zt_now_s(), waited = 0;
    while (!done) {
        if (b->timeout_s > 0 && waited >= b->timeout_s) break;
        pause_between_tests(waited);
        rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            unwatch_sigterm();
            return mpi_failed(rc, err);
        }
        /* Tests are microseconds apart; a gap of a second is this rank itself not running (stopped
         * by SIGSTOP or a debugger), which is no wait for the others: it does not count. */
        double now = zt_now_s();
        if (now - last < 1.0) waited += now - last;
        last = now;
    }
    unwatch_sigterm();
    if (done) return ZT_OK;

    char who[1024];
    if (peers) {
        /* MPI_Testall left every request as it was; test each to see which peers never came. */
        char list[512] = "";
        size_t used = 0;
        int n_missing = 0;
        for (int i = 0; i < n && used < sizeof list; i++) {
            int arrived = 0;
            MPI_Test(&reqs[i], &arrived, MPI_STATUS_IGNORE);
            if (!arrived)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", n_missing++ ? ", " : "", peers[i]);
        }
        if (!n_missing) return ZT_OK; /* the last ones came just now */
        snprintf(who, sizeof who, "%s %s did not reach it: %s", n_missing == 1 ? "rank" : "ranks", list, missing);
    } else {
        snprintf(who, sizeof who, "%s", missing);
    }
    /* Under zt-run --nproc the ranks that are gone or stopped are known: the likely reason. */
    char trouble[1024] = "";
    size_t trouble_len = 0;
    zt_job_append(trouble, sizeof trouble, &trouble_len, "; ");
    if (!zt_job_describe_peers(trouble, sizeof trouble, &trouble_len)) trouble[0] = '\0';
    char why[3072];
    snprintf(why, sizeof why, "timed out after %g s in %s; %s%s (if a rank legitimately needs longer, for "
             "example to save a large checkpoint, raise comm.timeout_s)", b->timeout_s, g_waiting_in, who, trouble);
    abort_job(b, why, 0);
    return ZT_ERR_TIMEOUT;
}

static const char k_collective_missing[] =
    "the other ranks did not reach it: one may have crashed or be stuck elsewhere";

/* ---- data types and argument checks ------------------------------------------------------------ */

static MPI_Datatype mpi_type_of(int32_t dtype)
{
    switch (dtype) {
    case ZT_F32: return MPI_FLOAT;
    case ZT_I32: return MPI_INT32_T;
    case ZT_I64: return MPI_INT64_T;
    case ZT_U8: return MPI_UINT8_T;
    case ZT_U32: return MPI_UINT32_T;
    default: return MPI_UINT16_T; /* U16, and BF16/F16 moved as their bits */
    }
}

/* Numbers the call and says what it is in g_waiting_in, e.g. "all_reduce #57 on group 'dp'
 * (8.0 MiB of F32)". `detail` goes after the op name ("from rank 2"). */
static void begin_call(mpi_group *g, int op, const char *detail, uint64_t count, int32_t dtype,
                       const char *per)
{
    uint64_t number = ++g->n_calls[op];
    char bytes[32];
    zt_comm_describe_bytes(count * zt_comm_element_size(dtype), bytes);
    if (op == OP_BARRIER)
        snprintf(g_waiting_in, sizeof g_waiting_in, "barrier #%llu on group '%s'", (unsigned long long)number,
                 g->name);
    else
        snprintf(g_waiting_in, sizeof g_waiting_in, "%s #%llu%s on group '%s' (%s of %s%s)", k_op_names[op],
                 (unsigned long long)number, detail, g->name, bytes, zt_comm_dtype_name(dtype), per);
}

/* MPI counts are int: one call carries at most INT_MAX elements. */
static zt_status check_count(int op, uint64_t count, zt_error *err)
{
    if (count <= (uint64_t)INT_MAX) return ZT_OK;
    return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                        "%llu elements are more than one MPI %s carries (%d elements): split the buffer into "
                        "buckets of at most that many", (unsigned long long)count, k_op_names[op], INT_MAX);
}

static zt_status check_reducible(int32_t dtype, int op, zt_error *err)
{
    if (dtype != ZT_BF16 && dtype != ZT_F16) return ZT_OK;
    return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                        "the MPI backend does not reduce %s values: CPU ranks compute in fp32, so %s F32 "
                        "buffers (16-bit reductions run on GPUs, through NCCL)", zt_comm_dtype_name(dtype), k_op_names[op]);
}

/* Buffers of one call may be the same (in place) or apart, never partly overlapping. */
static zt_status check_apart(const void *send, uint64_t send_bytes, const void *recv, uint64_t recv_bytes,
                             zt_error *err)
{
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    if (s == r || !send_bytes || !recv_bytes || s + send_bytes <= r || r + recv_bytes <= s) return ZT_OK;
    return zt_error_set(err, ZT_ERR_INVALID_ARG,
                        "the send and receive buffers overlap without being the same: pass the same pointer "
                        "twice for in place, or buffers apart");
}

static MPI_Op mpi_op_of(int32_t op)
{
    switch (op) {
    case ZT_REDUCE_MAX: return MPI_MAX;
    case ZT_REDUCE_MIN: return MPI_MIN;
    default: return MPI_SUM; /* SUM, and AVG = SUM then divide */
    }
}

/* AVG: the sum divided by the group size; integers divide as C does (toward zero), like NCCL. */
static void divide_by(void *buf, uint64_t count, int32_t dtype, int n)
{
    switch (dtype) {
    case ZT_F32: for (uint64_t i = 0; i < count; i++) ((float *)buf)[i] /= (float)n; break;
    case ZT_I32: for (uint64_t i = 0; i < count; i++) ((int32_t *)buf)[i] /= n; break;
    case ZT_I64: for (uint64_t i = 0; i < count; i++) ((int64_t *)buf)[i] /= n; break;
    /* Small unsigned types divide as int: a group may have more ranks than a U8 holds. */
    case ZT_U8: for (uint64_t i = 0; i < count; i++) ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / n); break;
    case ZT_U16:
        for (uint64_t i = 0; i < count; i++) ((uint16_t *)buf)[i] = (uint16_t)(((uint16_t *)buf)[i] / n);
        break;
    case ZT_U32: for (uint64_t i = 0; i < count; i++) ((uint32_t *)buf)[i] /= (uint32_t)n; break;
    default: break; /* 16-bit floats were refused by check_reducible */
    }
}

/* ---- the collectives --------------------------------------------------------------------------- */

/* FNV-1a over the 8 bytes of `value`: signatures that tell collectives and groups apart. */
static uint64_t fnv_add(uint64_t hash, uint64_t value)
{
    for (int i = 0; i < 8; i++) hash = (hash ^ ((value >> (8 * i)) & 0xff)) * UINT64_C(0x100000001b3);
    return hash;
}
#define FNV_START UINT64_C(0xcbf29ce484222325)

/* Before a collective moves any data, the group's ranks meet under the watchdog (a small
 * MPI_Iallreduce and the test loop) and compare what each is about to do: the collective, count,
 * dtype, reduce op, root, and how many collectives came before on this group. Then the data moves
 * with MPI's blocking collective, which may rely on every rank being there and doing the same.
 *
 * Why not MPI_Iallreduce for the data itself: Open MPI's non-blocking collectives (libnbc) use
 * simpler algorithms than its tuned blocking ones. Measured with Open MPI 4.1, 2 ranks on one
 * machine, best of 8: a 4 MiB all_reduce took 9.3 ms non-blocking against 1.0 ms this way (0.85 ms
 * for MPI_Allreduce alone), 4 KiB 7.7 us against 4.8 us. And agreeing first turns a mismatch (one
 * rank in all_reduce, another in broadcast, or different counts), which MPI leaves undefined and
 * which usually hangs or corrupts memory, into an error on every rank. The price is one small
 * all_reduce per collective (a few microseconds on one machine). What the meeting cannot catch, a
 * rank dying during the data phase, the launcher does (mpirun, srun --kill-on-bad-exit); a rank
 * stopped or stuck in it, the thread of watch_data_phase. */
static zt_status meet_and_agree(const mpi_backend *b, mpi_group *g, int op, uint64_t count, int32_t dtype,
                                int32_t reduce_op, int32_t root, zt_error *err)
{
    uint64_t h = fnv_add(FNV_START, (uint64_t)op);
    h = fnv_add(h, count);
    h = fnv_add(h, (uint64_t)dtype);
    h = fnv_add(h, (uint64_t)(uint32_t)reduce_op);
    h = fnv_add(h, (uint64_t)(uint32_t)root);
    h = fnv_add(h, g->n_collectives++);
    /* MAX of the signature and of its negation: both come back unchanged only if every rank sent the
     * same. 62 bits, so negating never overflows. */
    int64_t mine = (int64_t)(h >> 2), sent[2] = {mine, -mine}, seen[2] = {0, 0};
    MPI_Request req;
    int rc = MPI_Iallreduce(sent, seen, 2, MPI_INT64_T, MPI_MAX, g->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, err);
    zt_status st = wait_watched(b, &req, 1, NULL, k_collective_missing, err);
    if (st == ZT_OK && (seen[0] != mine || seen[1] != -mine))
        st = zt_error_set(err, ZT_ERR_COMM,
                          "the ranks do not all issue the same collective here: this rank is in %s, another is in "
                          "another collective, or has another count, dtype, reduce op or root, or issued a "
                          "different number of collectives before. Every rank of a group must issue the same "
                          "collectives in the same order", g_waiting_in);
    return st;
}

static zt_status mpi_all_reduce(zt_comm_backend *self, void *comm, const void *send, void *recv,
                                uint64_t count, int32_t dtype, int32_t op, void *stream, zt_error *err)
{
    (void)stream;
    mpi_group *g = comm;
    uint64_t bytes = count * zt_comm_element_size(dtype);
    zt_status st = check_count(OP_ALL_REDUCE, count, err);
    if (st == ZT_OK) st = check_reducible(dtype, OP_ALL_REDUCE, err);
    if (st == ZT_OK) st = check_apart(send, bytes, recv, bytes, err);
    if (st != ZT_OK) return st;
    begin_call(g, OP_ALL_REDUCE, "", count, dtype, "");
    st = meet_and_agree((mpi_backend *)self, g, OP_ALL_REDUCE, count, dtype, op, -1, err);
    if (st != ZT_OK) return st;
    data_phase_begin((mpi_backend *)self);
    int rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type_of(dtype),
                           mpi_op_of(op), g->comm);
    data_phase_end();
    if (rc != MPI_SUCCESS) return mpi_failed(rc, err);
    if (op == ZT_REDUCE_AVG) divide_by(recv, count, dtype, g->size);
    return ZT_OK;
}

/* send holds size*count elements, block r for rank r; recv gets this rank's reduced block. In place
 * (send == recv), the result lands in the first count elements. */
static zt_status mpi_reduce_scatter(zt_comm_backend *self, void *comm, const void *send, void *recv,
                                    uint64_t count, int32_t dtype, int32_t op, void *stream, zt_error *err)
{
    (void)stream;
    mpi_group *g = comm;
    uint64_t bytes = count * zt_comm_element_size(dtype);
    zt_status st = check_count(OP_REDUCE_SCATTER, count, err);
    if (st == ZT_OK) st = check_reducible(dtype, OP_REDUCE_SCATTER, err);
    if (st == ZT_OK) st = check_apart(send, bytes * (uint64_t)g->size, recv, bytes, err);
    if (st != ZT_OK) return st;
    begin_call(g, OP_REDUCE_SCATTER, "", count, dtype, " per rank");
    st = meet_and_agree((mpi_backend *)self, g, OP_REDUCE_SCATTER, count, dtype, op, -1, err);
    if (st != ZT_OK) return st;
    data_phase_begin((mpi_backend *)self);
    int rc = MPI_Reduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type_of(dtype),
                                      mpi_op_of(op), g->comm);
    data_phase_end();
    if (rc != MPI_SUCCESS) return mpi_failed(rc, err);
    if (op == ZT_REDUCE_AVG) divide_by(recv, count, dtype, g->size);
    return ZT_OK;
}

/* recv gets size*count elements, block r from rank r. In place (send == recv), this rank's count
 * elements are at the start of recv. */
static zt_status mpi_all_gather(zt_comm_backend *self, void *comm, const void *send, void *recv,
                                uint64_t count, int32_t dtype, void *stream, zt_error *err)
{
    (void)stream;
    mpi_group *g = comm;
    uint64_t bytes = count * zt_comm_element_size(dtype);
    zt_status st = check_count(OP_ALL_GATHER, count, err);
    if (st == ZT_OK) st = check_apart(send, bytes, recv, bytes * (uint64_t)g->size, err);
    if (st != ZT_OK) return st;
    begin_call(g, OP_ALL_GATHER, "", count, dtype, " per rank");
    st = meet_and_agree((mpi_backend *)self, g, OP_ALL_GATHER, count, dtype, -1, -1, err);
    if (st != ZT_OK) return st;
    /* MPI's in place expects this rank's block at its own position; for rank 0 it already is, for
     * the others the two ranges do not overlap. */
    if (send == recv && g->rank > 0 && bytes) memcpy((char *)recv + (uint64_t)g->rank * bytes, send, bytes);
    MPI_Datatype type = mpi_type_of(dtype);
    data_phase_begin((mpi_backend *)self);
    int rc = MPI_Allgather(send == recv ? MPI_IN_PLACE : send, (int)count, type, recv, (int)count, type, g->comm);
    data_phase_end();
    return rc == MPI_SUCCESS ? ZT_OK : mpi_failed(rc, err);
}

static zt_status mpi_broadcast(zt_comm_backend *self, void *comm, void *buf, uint64_t count, int32_t dtype,
                               int32_t root, void *stream, zt_error *err)
{
    (void)stream;
    mpi_group *g = comm;
    zt_status st = check_count(OP_BROADCAST, count, err);
    if (st != ZT_OK) return st;
    char detail[48];
    snprintf(detail, sizeof detail, " from rank %d", root);
    begin_call(g, OP_BROADCAST, detail, count, dtype, "");
    st = meet_and_agree((mpi_backend *)self, g, OP_BROADCAST, count, dtype, -1, root, err);
    if (st != ZT_OK) return st;
    data_phase_begin((mpi_backend *)self);
    int rc = MPI_Bcast(buf, (int)count, mpi_type_of(dtype), root, g->comm);
    data_phase_end();
    return rc == MPI_SUCCESS ? ZT_OK : mpi_failed(rc, err);
}

static zt_status mpi_barrier(zt_comm_backend *self, void *comm, zt_error *err)
{
    mpi_group *g = comm;
    begin_call(g, OP_BARRIER, "", 0, ZT_U8, "");
    /* Meeting is a barrier: every rank has arrived when it completes. */
    return meet_and_agree((mpi_backend *)self, g, OP_BARRIER, 0, ZT_U8, -1, -1, err);
}

/* Point to point is non-blocking and watched throughout: MPI's non-blocking send and receive are
 * as fast as the blocking ones. */
static zt_status mpi_send(zt_comm_backend *self, void *comm, const void *buf, uint64_t count, int32_t dtype,
                          int32_t peer, void *stream, zt_error *err)
{
    (void)stream;
    mpi_group *g = comm;
    zt_status st = check_count(OP_SEND, count, err);
    if (st != ZT_OK) return st;
    char detail[48];
    snprintf(detail, sizeof detail, " to rank %d", peer);
    begin_call(g, OP_SEND, detail, count, dtype, "");
    MPI_Request req;
    int rc = MPI_Isend(buf, (int)count, mpi_type_of(dtype), peer, 0, g->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, err);
    char missing[160];
    snprintf(missing, sizeof missing, "rank %d of the group did not post the matching recv: it may have crashed "
             "or be stuck elsewhere", peer);
    return wait_watched((mpi_backend *)self, &req, 1, NULL, missing, err);
}

static zt_status mpi_recv(zt_comm_backend *self, void *comm, void *buf, uint64_t count, int32_t dtype,
                          int32_t peer, void *stream, zt_error *err)
{
    (void)stream;
    mpi_group *g = comm;
    zt_status st = check_count(OP_RECV, count, err);
    if (st != ZT_OK) return st;
    char detail[48];
    snprintf(detail, sizeof detail, " from rank %d", peer);
    begin_call(g, OP_RECV, detail, count, dtype, "");
    MPI_Request req;
    int rc = MPI_Irecv(buf, (int)count, mpi_type_of(dtype), peer, 0, g->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, err);
    char missing[160];
    snprintf(missing, sizeof missing, "rank %d of the group did not send to it: it may have crashed or be "
             "stuck elsewhere", peer);
    return wait_watched((mpi_backend *)self, &req, 1, NULL, missing, err);
}

/* ---- groups ------------------------------------------------------------------------------------ */

/* Identifies a group by name and members, so the members' handshakes can tell whether they are
 * creating the same one. */
static uint64_t group_fingerprint(const char *name, const int32_t *ranks, int32_t n)
{
    uint64_t h = FNV_START;
    for (const char *c = name; *c; c++) h = fnv_add(h, (uint8_t)*c);
    for (int32_t i = 0; i < n; i++) h = fnv_add(h, (uint32_t)ranks[i]);
    return h;
}

/* "[0, 2, 4]", cut short with "...]" when it does not fit. */
static void describe_ranks(const int32_t *ranks, int32_t n, char *out, size_t cap)
{
    size_t used = (size_t)snprintf(out, cap, "[");
    for (int32_t i = 0; i < n; i++) {
        char one[16];
        snprintf(one, sizeof one, "%s%d", i ? ", " : "", ranks[i]);
        if (used + strlen(one) + 5 >= cap) {
            snprintf(out + used, cap - used, ", ...]");
            return;
        }
        used += (size_t)snprintf(out + used, cap - used, "%s", one);
    }
    snprintf(out + used, cap - used, "]");
}

/* MPI_Comm_create_group blocks until every member calls it, and MPI has no non-blocking form. So the
 * members first meet under the watchdog: each tells the group's first rank (the leader) which
 * group it is creating, and the leader answers once all have come. A member that never comes is
 * named by the leader's timeout; members creating different groups at this point (another order
 * or other ranks) are told so instead of blocking each other. */
static zt_status meet_members(mpi_backend *b, const char *name, const int32_t *ranks, int32_t n, zt_error *err)
{
    const int me = b->base.world_rank, leader = ranks[0];
    const uint64_t mine = group_fingerprint(name, ranks, n);
    char members[160];
    describe_ranks(ranks, n, members, sizeof members);
    snprintf(g_waiting_in, sizeof g_waiting_in, "creating group '%s' (world ranks %s)", name, members);
    zt_status st;
    if (me != leader) {
        uint64_t verdict = 0;
        MPI_Request reqs[2];
        int rc = MPI_Isend(&mine, 1, MPI_UINT64_T, leader, HANDSHAKE_TAG, b->control, &reqs[0]);
        if (rc == MPI_SUCCESS) rc = MPI_Irecv(&verdict, 1, MPI_UINT64_T, leader, HANDSHAKE_TAG, b->control, &reqs[1]);
        if (rc != MPI_SUCCESS) return mpi_failed(rc, err);
        char missing[200];
        snprintf(missing, sizeof missing, "world rank %d, the group's first, did not answer: it may have crashed, "
                 "be stuck elsewhere, or be creating its groups in another order", leader);
        st = wait_watched(b, reqs, 2, NULL, missing, err);
        if (st == ZT_OK && verdict != 1)
            st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                              "group_create('%s'): world rank %d found that the members are not all creating "
                              "this group at this point (another name, other ranks, or another order); every "
                              "member must create the same groups in the same order", name, leader);
        return st;
    }
    int n_others = n - 1;
    uint64_t *theirs = calloc((size_t)n_others + 1, sizeof *theirs);
    MPI_Request *reqs = calloc((size_t)n_others + 1, sizeof *reqs);
    int *peers = calloc((size_t)n_others + 1, sizeof *peers);
    if (!theirs || !reqs || !peers) {
        free(theirs), free(reqs), free(peers);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating group '%s'", name);
    }
    int rc = MPI_SUCCESS;
    for (int i = 0; i < n_others && rc == MPI_SUCCESS; i++) {
        peers[i] = ranks[i + 1];
        rc = MPI_Irecv(&theirs[i], 1, MPI_UINT64_T, peers[i], HANDSHAKE_TAG, b->control, &reqs[i]);
    }
    st = rc == MPI_SUCCESS ? wait_watched(b, reqs, n_others, peers, "a rank may have crashed, be stuck "
                                          "elsewhere, or be creating its groups in another order", err)
                           : mpi_failed(rc, err);
    int mismatch = -1;
    for (int i = 0; i < n_others && st == ZT_OK; i++)
        if (theirs[i] != mine && mismatch < 0) mismatch = peers[i];
    if (st == ZT_OK) {
        /* Answer everyone, also when they disagree, so no member is left waiting. */
        uint64_t verdict = mismatch < 0 ? 1 : 0;
        for (int i = 0; i < n_others && rc == MPI_SUCCESS; i++)
            rc = MPI_Isend(&verdict, 1, MPI_UINT64_T, peers[i], HANDSHAKE_TAG, b->control, &reqs[i]);
        st = rc == MPI_SUCCESS ? wait_watched(b, reqs, n_others, peers, "it stopped waiting for the answer", err)
                               : mpi_failed(rc, err);
        if (st == ZT_OK && mismatch >= 0)
            st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                              "group_create('%s'): world rank %d is creating another group at this point "
                              "(another name, other ranks, or another order); every member must create the "
                              "same groups in the same order", name, mismatch);
    }
    free(theirs), free(reqs), free(peers);
    return st;
}

static zt_status mpi_group_create(zt_comm_backend *self, const char *name, const int32_t *world_ranks, int32_t n,
                                  void **comm_out, zt_error *err)
{
    mpi_backend *b = (mpi_backend *)self;
    mpi_group *g = calloc(1, sizeof *g);
    if (!g) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating group '%s'", name);
    snprintf(g->name, sizeof g->name, "%s", name);
    int is_world = n == b->base.world_size;
    for (int32_t i = 0; i < n && is_world; i++) is_world = world_ranks[i] == i;

    zt_status st = ZT_OK;
    int rc;
    if (is_world) {
        /* Every rank is a member, so the non-blocking duplicate is watched directly. */
        snprintf(g_waiting_in, sizeof g_waiting_in, "creating group '%s' (all %d ranks)", name, n);
        MPI_Request req;
        rc = MPI_Comm_idup(MPI_COMM_WORLD, &g->comm, &req);
        st = rc == MPI_SUCCESS ? wait_watched(b, &req, 1, NULL, k_collective_missing, err) : mpi_failed(rc, err);
    } else {
        st = meet_members(b, name, world_ranks, n, err);
        MPI_Group world_group, members;
        rc = MPI_SUCCESS;
        if (st == ZT_OK) rc = MPI_Comm_group(MPI_COMM_WORLD, &world_group);
        if (st == ZT_OK && rc == MPI_SUCCESS) {
            rc = MPI_Group_incl(world_group, n, world_ranks, &members);
            MPI_Group_free(&world_group);
            if (rc == MPI_SUCCESS) {
                rc = MPI_Comm_create_group(MPI_COMM_WORLD, members, 0, &g->comm);
                MPI_Group_free(&members);
            }
        }
        if (st == ZT_OK && rc != MPI_SUCCESS) st = mpi_failed(rc, err);
    }
    if (st == ZT_OK) {
        MPI_Comm_rank(g->comm, &g->rank);
        MPI_Comm_size(g->comm, &g->size);
        *comm_out = g;
        return ZT_OK;
    }
    free(g);
    return st;
}

static void mpi_group_destroy(zt_comm_backend *self, void *comm)
{
    (void)self;
    mpi_group *g = comm;
    MPI_Comm_free(&g->comm);
    free(g);
}

/* ---- start and shutdown ------------------------------------------------------------------------ */

static void mpi_destroy(zt_comm_backend *self)
{
    mpi_backend *b = (mpi_backend *)self;
    zt_error err;
    if (b->finalize_mpi) {
        /* MPI_Finalize waits for every rank without a timeout; the watched barrier comes first. */
        snprintf(g_waiting_in, sizeof g_waiting_in, "the shutdown barrier (every rank waits for the others "
                 "before MPI_Finalize)");
        MPI_Request req;
        int rc = MPI_Ibarrier(b->control, &req);
        zt_status st = rc == MPI_SUCCESS ? wait_watched(b, &req, 1, NULL, "the other ranks did not finish: one "
                                                        "may have crashed or be stuck elsewhere", &err)
                                         : mpi_failed(rc, &err);
        if (st != ZT_OK) abort_job(b, err.msg, 0);
    }
    MPI_Comm_free(&b->control);
    if (b->finalize_mpi) MPI_Finalize();
    free(b);
}

static zt_status fail_start(int finalize_mpi, zt_error *err)
{
    if (finalize_mpi) MPI_Finalize();
    return err->status;
}

EXPORT zt_status zt_comm_mpi_create_v1(const zt_comm_mpi_options *opt, zt_comm_backend **out, zt_error *err);
EXPORT zt_status zt_comm_mpi_create_v1(const zt_comm_mpi_options *opt, zt_comm_backend **out, zt_error *err)
{
    *out = NULL;
    int finalized = 0, initialized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Finalized(&finalized);
    if (finalized)
        return zt_error_set(err, ZT_ERR_COMM, "MPI was already finalized in this process (a zt runtime was "
                            "created again after the first one was destroyed), and MPI cannot start twice: "
                            "create one runtime per process");
    MPI_Initialized(&initialized);
    int finalize_mpi = !initialized;
    if (!initialized) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return zt_error_set(err, ZT_ERR_COMM, "MPI_Init_thread failed for a job of %d ranks (from %s); "
                                "the lines above, from MPI, say why", opt->world_size, opt->launcher);
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        zt_error_set(err, ZT_ERR_COMM, "MPI offers thread level %d, below MPI_THREAD_SERIALIZED (%d), which zt "
                     "needs because collectives may come from more than one thread: use an MPI built with "
                     "thread support (Open MPI's is)", provided, MPI_THREAD_SERIALIZED);
        return fail_start(finalize_mpi, err);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank = -1, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != opt->rank || size != opt->world_size) {
        zt_error_set(err, ZT_ERR_COMM,
                     "the launch environment says this is rank %d of %d (from %s), but MPI sees rank %d of %d: "
                     "the ranks were not started by a launcher that this MPI connects. Start them with the "
                     "mpirun of the MPI zt was built with (mpirun -np %d zt-run ...), with srun --mpi=pmix "
                     "under Slurm, or with zt-run --nproc %d",
                     opt->rank, opt->world_size, opt->launcher, rank, size, opt->world_size, opt->world_size);
        return fail_start(finalize_mpi, err);
    }

    zt_job_attach(rank, size, opt->launcher); /* this module's own copy of job.c */
    mpi_backend *b = calloc(1, sizeof *b);
    if (!b) {
        zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating the MPI communicator");
        return fail_start(finalize_mpi, err);
    }
    b->timeout_s = opt->timeout_s;
    b->finalize_mpi = finalize_mpi;
    b->base = (zt_comm_backend){
        .name = "mpi",
        .world_rank = rank,
        .world_size = size,
        .group_create = mpi_group_create,
        .group_destroy = mpi_group_destroy,
        .all_reduce = mpi_all_reduce,
        .reduce_scatter = mpi_reduce_scatter,
        .all_gather = mpi_all_gather,
        .broadcast = mpi_broadcast,
        .send = mpi_send,
        .recv = mpi_recv,
        .barrier = mpi_barrier,
        .destroy = mpi_destroy,
    };
    snprintf(g_waiting_in, sizeof g_waiting_in, "start-up (connecting the %d ranks)", size);
    MPI_Request req;
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &b->control, &req);
    zt_status st = rc == MPI_SUCCESS ? wait_watched(b, &req, 1, NULL, k_collective_missing, err) : mpi_failed(rc, err);
    if (st != ZT_OK) {
        free(b);
        return fail_start(finalize_mpi, err);
    }
    *out = &b->base;
    return ZT_OK;
}
