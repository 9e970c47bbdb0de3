/* The NCCL communication backend: the GPU ranks of one job talk through NCCL. Built as the MODULE
 * libzt-comm-nccl.so (framework/CMakeLists.txt), so only this file links NCCL; comm_nccl.h is its
 * interface, comm.h the table it fills, docs/distributed.md the user's view.
 *
 * Communicators. Start-up connects every rank into a private "bootstrap" communicator from the id
 * launch.c carried. A group gets its own communicator (ncclCommInitRankConfig): its first member
 * makes an id and sends it to the others over the bootstrap communicator (point to point, so only
 * the members take part: zt creates a group on its members only, which ncclCommSplit cannot do).
 *
 * No hangs. Every communicator is non-blocking (ncclConfig_t.blocking = 0): start-up polls
 * ncclCommGetAsyncError and gives up after comm.timeout_s. Every operation enqueued on a stream is
 * followed by a CUDA event; the watchdog thread checks the oldest unfinished one, and past
 * comm.timeout_s prints what it was, aborts every communicator and ends the process (the launcher
 * then ends the others). It also polls each communicator's asynchronous error (a peer that died
 * mid-collective, a network failure) and reports it the same way.
 *
 * Threads: collectives come from one thread at a time (the runtime's callers serialize); the
 * watchdog shares only the queue of pending operations and the list of groups, under `lock`.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep, clock_gettime, setenv */
#include "base/clock.h"
#include "dist/comm_nccl.h"
#include "dist/flight.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define GROUP_NAME_MAX 64
#define MAX_PENDING 4096 /* enqueued operations not yet seen complete */
#define WHAT_MAX 224

_Static_assert(sizeof(ncclUniqueId) == ZT_COMM_NCCL_ID_BYTES, "comm_nccl.h's ZT_COMM_NCCL_ID_BYTES is wrong");

enum op_kind { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_SEND, OP_RECV, OP_BARRIER, OP_COUNT };
static const char *const k_op_names[OP_COUNT] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                 "send", "recv", "barrier"};

typedef struct nccl_group {
    ncclComm_t comm;
    char name[GROUP_NAME_MAX];
    int rank, size;
    uint64_t n_calls[OP_COUNT]; /* numbers the calls in messages: "all_reduce #57" */
    struct nccl_group *next;    /* the backend's list, which the watchdog polls */
} nccl_group;

typedef struct pending_op {
    cudaEvent_t event; /* created on first use of the slot, reused after */
    int recorded;      /* 0 while the operation is being enqueued: not complete */
    double since;      /* enqueued, or became the oldest: the timeout counts from the later */
    uint64_t flight;   /* the flight recorder's token of the collective (dist/flight.h); 0: none */
    char what[WHAT_MAX];
} pending_op;

typedef struct nccl_backend {
    zt_comm_backend base; /* first, so a zt_comm_backend * is an nccl_backend * */
    double timeout_s;     /* 0: wait forever */
    int device;
    ncclComm_t boot;      /* every rank: carries the groups' ids */
    cudaStream_t stream;  /* this backend's own work: id exchange, barrier */
    unsigned char *scratch; /* device: one id + fingerprint, a barrier's word */
    zt_comm_backend *bootstrap;
    void *staging;          /* device: host buffers of a collective pass through here (host_staged) */
    uint64_t staging_bytes;

    pthread_mutex_t lock; /* ring, head, n_pending, groups */
    pending_op ring[MAX_PENDING];
    int head, n_pending;
    nccl_group *groups;
    pthread_t watchdog;
    int watchdog_running, stop;
} nccl_backend;

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Spin for the first milliseconds (a collective of ranks that are all there completes at once),
 * then poll gently. */
static void pause_after(double waited_s)
{
    if (waited_s < 0.002) return;
    sleep_us(waited_s < 1.0 ? 50 : 1000);
}

static zt_status cuda_failed(const nccl_backend *b, cudaError_t rc, const char *what, zt_error *err)
{
    return zt_error_set(err, ZT_ERR_COMM, "rank %d of %d: CUDA failed in %s: %s (%s)", b->base.world_rank,
                        b->base.world_size, what, cudaGetErrorString(rc), cudaGetErrorName(rc));
}

static zt_status nccl_failed(const nccl_backend *b, ncclComm_t comm, ncclResult_t rc, const char *what,
                             zt_error *err)
{
    const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
    return zt_error_set(err, ZT_ERR_COMM,
                        "rank %d of %d: NCCL failed in %s: %s%s%s; if another rank died, its output says why "
                        "(NCCL_DEBUG=WARN shows NCCL's view)", b->base.world_rank, b->base.world_size, what,
                        ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
}

/* zt-run's flight recorder (dist/flight.h): told when a collective's event fires, dumped by die(). */
static const zt_flight_hooks *g_flight;

EXPORT void zt_comm_nccl_flight_v1(const zt_flight_hooks *hooks);
EXPORT void zt_comm_nccl_flight_v1(const zt_flight_hooks *hooks) { g_flight = hooks; }

/* ---- the end of the job: abort every communicator, exit ---------------------------------------- */

/* Called with b->lock held (or by the only thread). ncclCommAbort does not wait for peers. */
static void die(nccl_backend *b, const char *message)
{
    fprintf(stderr, "%s\n", message);
    fflush(stderr);
    if (g_flight) {
        char reason[320];
        snprintf(reason, sizeof reason, "watchdog: %s", strncmp(message, "zt-run: ", 8) == 0 ? message + 8 : message);
        g_flight->dump(reason);
        g_flight->report();
    }
    /* Should an abort itself get stuck (a wedged GPU), SIGALRM still ends the process. */
    signal(SIGALRM, SIG_DFL);
    alarm(20);
    for (nccl_group *g = b->groups; g; g = g->next) ncclCommAbort(g->comm);
    if (b->boot) ncclCommAbort(b->boot);
    fprintf(stderr, "zt-run: rank %d of %d: NCCL aborted; ending this rank (exit 1)\n", b->base.world_rank,
            b->base.world_size);
    fflush(stderr);
    _exit(1);
}

/* ---- pending operations and the watchdog ------------------------------------------------------- */

/* Takes the completed operations off the front; returns 0, or dies on a CUDA error. Lock held. */
static void reap(nccl_backend *b)
{
    while (b->n_pending > 0) {
        pending_op *p = &b->ring[b->head];
        if (!p->recorded) return;
        cudaError_t rc = cudaEventQuery(p->event);
        if (rc == cudaErrorNotReady) return;
        if (rc != cudaSuccess) {
            char msg[512];
            snprintf(msg, sizeof msg, "zt-run: rank %d of %d: CUDA failed while %s ran: %s; the GPU or a kernel "
                     "before it failed (compute-sanitizer or CUDA_LAUNCH_BLOCKING=1 finds which)",
                     b->base.world_rank, b->base.world_size, p->what, cudaGetErrorString(rc));
            die(b, msg);
        }
        if (p->flight && g_flight) g_flight->completed(p->flight);
        b->head = (b->head + 1) % MAX_PENDING;
        b->n_pending--;
        if (b->n_pending > 0) {
            pending_op *next = &b->ring[b->head];
            double now = zt_now_s();
            if (next->since < now) next->since = now; /* only the oldest is timed */
        }
    }
}

/* Adds an operation about to be enqueued; returns its slot. Waits while the queue is full (the
 * watchdog ends the process if the oldest never completes). */
static int track_begin(nccl_backend *b, const char *what)
{
    pthread_mutex_lock(&b->lock);
    while (b->n_pending == MAX_PENDING) {
        reap(b);
        if (b->n_pending < MAX_PENDING) break;
        pthread_mutex_unlock(&b->lock);
        sleep_us(100);
        pthread_mutex_lock(&b->lock);
    }
    int slot = (b->head + b->n_pending) % MAX_PENDING;
    pending_op *p = &b->ring[slot];
    p->recorded = 0;
    p->since = zt_now_s();
    p->flight = g_flight ? g_flight->current() : 0;
    snprintf(p->what, sizeof p->what, "%s", what);
    b->n_pending++;
    pthread_mutex_unlock(&b->lock);
    return slot;
}

/* The operation of `slot` is on `stream`: record its event. */
static zt_status track_end(nccl_backend *b, int slot, cudaStream_t stream, zt_error *err)
{
    pthread_mutex_lock(&b->lock);
    pending_op *p = &b->ring[slot];
    cudaError_t rc = cudaSuccess;
    if (!p->event) rc = cudaEventCreateWithFlags(&p->event, cudaEventDisableTiming);
    if (rc == cudaSuccess) rc = cudaEventRecord(p->event, stream);
    if (rc == cudaSuccess) p->recorded = 1;
    pthread_mutex_unlock(&b->lock);
    /* A slot left unrecorded would look stuck forever: the watchdog ends the process then, which
     * is right, since the stream is unusable. */
    return rc == cudaSuccess ? ZT_OK : cuda_failed(b, rc, "recording the watchdog's event", err);
}

/* Waits on the host until every operation so far is complete (the watchdog bounds the wait). */
static void wait_all_tracked(nccl_backend *b)
{
    double start = zt_now_s();
    for (;;) {
        pthread_mutex_lock(&b->lock);
        reap(b);
        int n = b->n_pending;
        pthread_mutex_unlock(&b->lock);
        if (!n) return;
        pause_after(zt_now_s() - start);
    }
}

static void *watchdog_main(void *arg)
{
    nccl_backend *b = arg;
    cudaSetDevice(b->device); /* events and communicators belong to this rank's GPU */
    for (;;) {
        sleep_us(20000);
        pthread_mutex_lock(&b->lock);
        if (b->stop) {
            pthread_mutex_unlock(&b->lock);
            return NULL;
        }
        reap(b);
        if (b->n_pending > 0 && b->timeout_s > 0) {
            pending_op *p = &b->ring[b->head];
            double waited = zt_now_s() - p->since;
            if (waited >= b->timeout_s) {
                char msg[1024];
                snprintf(msg, sizeof msg,
                         "zt-run: rank %d of %d: %s has not completed after %g s; a peer rank is probably dead or "
                         "stuck elsewhere (its output, or the launcher's, says which); if a rank legitimately "
                         "needs longer, for example to save a large checkpoint, raise comm.timeout_s",
                         b->base.world_rank, b->base.world_size, p->what, b->timeout_s);
                die(b, msg);
            }
        }
        for (nccl_group *g = b->groups; g; g = g->next) {
            ncclResult_t async = ncclSuccess;
            ncclResult_t rc = ncclCommGetAsyncError(g->comm, &async);
            if (rc == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) continue;
            if (rc != ncclSuccess) async = rc;
            const char *last = ncclGetLastError(g->comm);
            char msg[1024];
            snprintf(msg, sizeof msg,
                     "zt-run: rank %d of %d: NCCL reported an error on group '%s': %s%s%s; a peer rank probably "
                     "died or its connection failed (its output, or the launcher's, says which; NCCL_DEBUG=WARN "
                     "shows more)", b->base.world_rank, b->base.world_size, g->name, ncclGetErrorString(async),
                     last && *last ? ": " : "", last ? last : "");
            die(b, msg);
        }
        pthread_mutex_unlock(&b->lock);
    }
}

/* ---- non-blocking communicators ---------------------------------------------------------------- */

/* Completes an NCCL call on a non-blocking communicator (it may return ncclInProgress). With
 * `timeout` (start-up) gives up after timeout_s; without, the caller's pending operation is what
 * the watchdog times. */
static zt_status finish_call(nccl_backend *b, ncclComm_t comm, ncclResult_t rc, int timeout, const char *what,
                             zt_error *err)
{
    double start = zt_now_s(), waited = 0;
    while (rc == ncclInProgress) {
        if (timeout && b->timeout_s > 0 && waited >= b->timeout_s)
            return zt_error_set(err, ZT_ERR_TIMEOUT,
                                "rank %d of %d: %s has not completed after %g s: a rank may not have started, be "
                                "stuck elsewhere, or be unable to reach this one (NCCL_DEBUG=INFO shows where NCCL "
                                "stands); raise comm.timeout_s if start-up legitimately takes longer",
                                b->base.world_rank, b->base.world_size, what, b->timeout_s);
        pause_after(waited);
        if (ncclCommGetAsyncError(comm, &rc) != ncclSuccess) rc = ncclInternalError;
        waited = zt_now_s() - start;
    }
    return rc == ncclSuccess ? ZT_OK : nccl_failed(b, comm, rc, what, err);
}

/* A communicator of n ranks in which this one is `me`. */
static zt_status init_comm(nccl_backend *b, const ncclUniqueId *id, int n, int me, const char *what,
                           ncclComm_t *out, zt_error *err)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t rc = ncclCommInitRankConfig(&comm, n, *id, me, &config);
    if (!comm) return nccl_failed(b, NULL, rc == ncclSuccess ? ncclInternalError : rc, what, err);
    zt_status st = finish_call(b, comm, rc, 1, what, err);
    if (st != ZT_OK) {
        ncclCommAbort(comm);
        return st;
    }
    *out = comm;
    return ZT_OK;
}

/* ---- data types -------------------------------------------------------------------------------- */

/* Reductions need NCCL's arithmetic on the type; moving data needs only its size (U16 moves as
 * F16 bits). */
static zt_status nccl_type_of(int32_t dtype, int reduce, ncclDataType_t *out, zt_error *err)
{
    switch (dtype) {
    case ZT_F32: *out = ncclFloat32; return ZT_OK;
    case ZT_BF16: *out = ncclBfloat16; return ZT_OK;
    case ZT_F16: *out = ncclFloat16; return ZT_OK;
    case ZT_I32: *out = ncclInt32; return ZT_OK;
    case ZT_I64: *out = ncclInt64; return ZT_OK;
    case ZT_U8: *out = ncclUint8; return ZT_OK;
    case ZT_U32: *out = ncclUint32; return ZT_OK;
    case ZT_U16:
        if (!reduce) {
            *out = ncclFloat16;
            return ZT_OK;
        }
        return zt_error_set(err, ZT_ERR_UNSUPPORTED, "NCCL has no 16-bit unsigned integer type to reduce U16 "
                            "values with: reduce them as U32 or I32");
    default:
        return zt_error_set(err, ZT_ERR_UNSUPPORTED, "dtype %d is not one NCCL moves (F32, BF16, F16, I32, I64, "
                            "U8, U16, U32)", dtype);
    }
}

static zt_status nccl_op_of(int32_t op, ncclRedOp_t *out, zt_error *err)
{
    switch (op) {
    case ZT_REDUCE_SUM: *out = ncclSum; return ZT_OK;
    case ZT_REDUCE_MAX: *out = ncclMax; return ZT_OK;
    case ZT_REDUCE_MIN: *out = ncclMin; return ZT_OK;
    case ZT_REDUCE_AVG: *out = ncclAvg; return ZT_OK;
    default: return zt_error_set(err, ZT_ERR_UNSUPPORTED, "reduce op %d is not SUM, MAX, MIN or AVG", op);
    }
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

/* "all_reduce #57 on group 'dp' (1024 x BF16)"; `detail` goes after the number (" to rank 1"). */
static void describe_call(nccl_group *g, int op, const char *detail, uint64_t count, int32_t dtype, char *out)
{
    uint64_t number = ++g->n_calls[op];
    if (op == OP_BARRIER)
        snprintf(out, WHAT_MAX, "barrier #%llu on group '%s'", (unsigned long long)number, g->name);
    else
        snprintf(out, WHAT_MAX, "%s #%llu%s on group '%s' (%llu x %s)", k_op_names[op], (unsigned long long)number,
                 detail, g->name, (unsigned long long)count, zt_comm_dtype_name(dtype));
}

/* ---- the collectives --------------------------------------------------------------------------- */

/* The pattern of every operation: tracked from before the enqueue (which may itself wait for
 * peers while NCCL connects lazily) to the event after it. */
#define ENQUEUE(b, g, what, stream, call)                                                               \
    do {                                                                                                \
        int slot_ = track_begin((b), (what));                                                           \
        ncclResult_t rc_ = (call);                                                                      \
        zt_status st_ = finish_call((b), (g)->comm, rc_, 0, (what), err);                               \
        zt_status end_ = track_end((b), slot_, (stream), err);                                          \
        if (st_ != ZT_OK) return st_;                                                                   \
        if (end_ != ZT_OK) return end_;                                                                 \
    } while (0)

/* A group of one: every collective is a copy of this rank's own data (a sum, max, min or average of
 * one contribution is that contribution). Done here rather than by NCCL, which is cheaper and also
 * sidesteps NCCL 2.28's ncclAvg on one rank, seen on an H200 to leave the last of 4097 floats
 * unwritten (tests/comm/nccl_check.c). */
static zt_status solo_copy(nccl_backend *b, const void *send, void *recv, uint64_t bytes, void *stream,
                           zt_error *err)
{
    if (send == recv || !bytes) return ZT_OK;
    cudaError_t rc = cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
    return rc == cudaSuccess ? ZT_OK : cuda_failed(b, rc, "copying a one-rank group's collective", err);
}

static zt_status device_all_reduce(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                 int32_t dtype, int32_t op, void *stream, zt_error *err)
{
    nccl_backend *b = (nccl_backend *)self;
    nccl_group *g = comm;
    ncclDataType_t type = ncclUint8;
    ncclRedOp_t nop = ncclSum;
    uint64_t bytes = count * zt_comm_element_size(dtype);
    zt_status st = nccl_type_of(dtype, 1, &type, err);
    if (st == ZT_OK) st = nccl_op_of(op, &nop, err);
    if (st == ZT_OK) st = check_apart(send, bytes, recv, bytes, err);
    if (st != ZT_OK || !count) return st;
    if (g->size == 1) return solo_copy(b, send, recv, bytes, stream, err);
    char what[WHAT_MAX];
    describe_call(g, OP_ALL_REDUCE, "", count, dtype, what);
    ENQUEUE(b, g, what, stream, ncclAllReduce(send, recv, count, type, nop, g->comm, (cudaStream_t)stream));
    return ZT_OK;
}

/* zt's in place (send == recv) puts this rank's part at the start of the buffer; NCCL's in place
 * leaves it at offset rank * count. Rank 0 is the same either way; the others reduce in NCCL's
 * place, then copy (the two ranges do not overlap). */
static zt_status device_reduce_scatter(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                     int32_t dtype, int32_t op, void *stream, zt_error *err)
{
    nccl_backend *b = (nccl_backend *)self;
    nccl_group *g = comm;
    ncclDataType_t type = ncclUint8;
    ncclRedOp_t nop = ncclSum;
    uint64_t bytes = count * zt_comm_element_size(dtype);
    zt_status st = nccl_type_of(dtype, 1, &type, err);
    if (st == ZT_OK) st = nccl_op_of(op, &nop, err);
    if (st == ZT_OK) st = check_apart(send, bytes * (uint64_t)g->size, recv, bytes, err);
    if (st != ZT_OK || !count) return st;
    if (g->size == 1) return solo_copy(b, send, recv, bytes, stream, err);
    char what[WHAT_MAX];
    describe_call(g, OP_REDUCE_SCATTER, "", count, dtype, what);
    cudaStream_t s = (cudaStream_t)stream;
    int shifted = send == recv && g->rank > 0;
    void *target = shifted ? (char *)recv + (uint64_t)g->rank * bytes : recv;
    ENQUEUE(b, g, what, s, ncclReduceScatter(send, target, count, type, nop, g->comm, s));
    if (shifted) {
        cudaError_t rc = cudaMemcpyAsync(recv, target, bytes, cudaMemcpyDeviceToDevice, s);
        if (rc != cudaSuccess) return cuda_failed(b, rc, "moving reduce_scatter's in-place result", err);
    }
    return ZT_OK;
}

/* zt's in place reads this rank's part from the start of the buffer; NCCL's from offset
 * rank * count: move it there first (the ranges do not overlap for rank > 0). */
static zt_status device_all_gather(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                 int32_t dtype, void *stream, zt_error *err)
{
    nccl_backend *b = (nccl_backend *)self;
    nccl_group *g = comm;
    ncclDataType_t type = ncclUint8;
    uint64_t bytes = count * zt_comm_element_size(dtype);
    zt_status st = nccl_type_of(dtype, 0, &type, err);
    if (st == ZT_OK) st = check_apart(send, bytes, recv, bytes * (uint64_t)g->size, err);
    if (st != ZT_OK || !count) return st;
    if (g->size == 1) return solo_copy(b, send, recv, bytes, stream, err);
    char what[WHAT_MAX];
    describe_call(g, OP_ALL_GATHER, "", count, dtype, what);
    cudaStream_t s = (cudaStream_t)stream;
    const void *source = send;
    if (send == recv && g->rank > 0) {
        source = (char *)recv + (uint64_t)g->rank * bytes;
        cudaError_t rc = cudaMemcpyAsync((void *)source, send, bytes, cudaMemcpyDeviceToDevice, s);
        if (rc != cudaSuccess) return cuda_failed(b, rc, "placing all_gather's in-place part", err);
    }
    ENQUEUE(b, g, what, s, ncclAllGather(source, recv, count, type, g->comm, s));
    return ZT_OK;
}

static zt_status device_broadcast(zt_comm_backend *self, void *comm, void *buf, uint64_t count, int32_t dtype,
                                int32_t root, void *stream, zt_error *err)
{
    nccl_backend *b = (nccl_backend *)self;
    nccl_group *g = comm;
    ncclDataType_t type = ncclUint8;
    zt_status st = nccl_type_of(dtype, 0, &type, err);
    if (st != ZT_OK || !count || g->size == 1) return st;
    char what[WHAT_MAX], detail[48];
    snprintf(detail, sizeof detail, " from rank %d", root);
    describe_call(g, OP_BROADCAST, detail, count, dtype, what);
    ENQUEUE(b, g, what, stream, ncclBroadcast(buf, buf, count, type, root, g->comm, (cudaStream_t)stream));
    return ZT_OK;
}

static zt_status device_send(zt_comm_backend *self, void *comm, const void *buf, uint64_t count, int32_t dtype,
                           int32_t peer, void *stream, zt_error *err)
{
    nccl_backend *b = (nccl_backend *)self;
    nccl_group *g = comm;
    ncclDataType_t type = ncclUint8;
    zt_status st = nccl_type_of(dtype, 0, &type, err);
    if (st != ZT_OK || !count) return st;
    char what[WHAT_MAX], detail[48];
    snprintf(detail, sizeof detail, " to rank %d", peer);
    describe_call(g, OP_SEND, detail, count, dtype, what);
    ENQUEUE(b, g, what, stream, ncclSend(buf, count, type, peer, g->comm, (cudaStream_t)stream));
    return ZT_OK;
}

static zt_status device_recv(zt_comm_backend *self, void *comm, void *buf, uint64_t count, int32_t dtype, int32_t peer,
                           void *stream, zt_error *err)
{
    nccl_backend *b = (nccl_backend *)self;
    nccl_group *g = comm;
    ncclDataType_t type = ncclUint8;
    zt_status st = nccl_type_of(dtype, 0, &type, err);
    if (st != ZT_OK || !count) return st;
    char what[WHAT_MAX], detail[48];
    snprintf(detail, sizeof detail, " from rank %d", peer);
    describe_call(g, OP_RECV, detail, count, dtype, what);
    ENQUEUE(b, g, what, stream, ncclRecv(buf, count, type, peer, g->comm, (cudaStream_t)stream));
    return ZT_OK;
}

/* ---- host buffers ------------------------------------------------------------------------------
 * NCCL moves device memory only, but the host's own collectives (the trainer's token counts, loss
 * sums, stop flags, checkpoint paths) pass host memory, as they do on the MPI backend. Such a call
 * goes through a device staging buffer: inputs copied up on the stream, the collective, outputs
 * copied down, and the stream waited for (under the watchdog), so on return the host buffer holds
 * the result as an MPI call would. These calls are small; device buffers never take this path. */

static int is_host_memory(const void *p)
{
    struct cudaPointerAttributes a;
    if (!p) return 0;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* older drivers report pageable memory as an error: clear it */
        return 1;
    }
    return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
}

static zt_status staging_reserve(nccl_backend *b, uint64_t bytes, zt_error *err)
{
    if (bytes <= b->staging_bytes) return ZT_OK;
    uint64_t want = bytes < 4096 ? 4096 : bytes;
    if (b->staging) {
        cudaError_t rc = cudaStreamSynchronize(b->stream);
        if (rc == cudaSuccess) rc = cudaDeviceSynchronize(); /* no queued call may still read the old one */
        if (rc != cudaSuccess) return cuda_failed(b, rc, "waiting before growing the host-buffer staging", err);
        cudaFree(b->staging);
        b->staging = NULL;
        b->staging_bytes = 0;
    }
    cudaError_t rc = cudaMalloc(&b->staging, want);
    if (rc != cudaSuccess) return cuda_failed(b, rc, "allocating the staging buffer for a host-memory collective", err);
    b->staging_bytes = want;
    return ZT_OK;
}

/* Copy `bytes` between host and device on `stream` (direction from the pointers). */
static zt_status staged_copy(nccl_backend *b, void *dst, const void *src, uint64_t bytes, cudaStream_t stream,
                             const char *what, zt_error *err)
{
    if (!bytes) return ZT_OK;
    cudaError_t rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
    return rc == cudaSuccess ? ZT_OK : cuda_failed(b, rc, what, err);
}

/* Wait for `stream` under the watchdog, so a peer that never joins is reported, not waited on. */
static zt_status staged_wait(nccl_backend *b, cudaStream_t stream, const char *what, zt_error *err)
{
    int slot = track_begin(b, what);
    zt_status st = track_end(b, slot, stream, err);
    if (st != ZT_OK) return st;
    cudaError_t rc = cudaStreamSynchronize(stream);
    return rc == cudaSuccess ? ZT_OK : cuda_failed(b, rc, what, err);
}

/* One collective with send (send_bytes read) and recv (recv_bytes written; in place when
 * send == recv, reading max(send_bytes, in_bytes) from it first). Device buffers: straight through. */
typedef zt_status (*device_call)(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                 int32_t dtype, int32_t arg, void *stream, zt_error *err);

static zt_status staged(zt_comm_backend *self, void *comm, const void *send, uint64_t send_bytes, void *recv,
                        uint64_t recv_bytes, uint64_t count, int32_t dtype, int32_t arg, void *stream,
                        device_call call, const char *op, zt_error *err)
{
    nccl_backend *b = (nccl_backend *)self;
    int host_send = is_host_memory(send), host_recv = is_host_memory(recv);
    if (!host_send && !host_recv) return call(self, comm, send, recv, count, dtype, arg, stream, err);
    cudaStream_t s = (cudaStream_t)stream;
    char what[WHAT_MAX];
    snprintf(what, sizeof what, "%s of host memory (staged through the device)", op);
    if (send == recv) { /* in place: one staged buffer, as large as either side */
        uint64_t bytes = send_bytes > recv_bytes ? send_bytes : recv_bytes;
        zt_status st = staging_reserve(b, bytes, err);
        if (st == ZT_OK) st = staged_copy(b, b->staging, send, send_bytes, s, what, err);
        if (st == ZT_OK) st = call(self, comm, b->staging, b->staging, count, dtype, arg, stream, err);
        if (st == ZT_OK) st = staged_copy(b, recv, b->staging, recv_bytes, s, what, err);
        return st == ZT_OK ? staged_wait(b, s, what, err) : st;
    }
    uint64_t send_at = 0, recv_at = host_send ? (send_bytes + 255) / 256 * 256 : 0;
    zt_status st = staging_reserve(b, recv_at + (host_recv ? recv_bytes : 0), err);
    if (st != ZT_OK) return st;
    unsigned char *base = b->staging;
    const void *dsend = host_send ? base + send_at : send;
    void *drecv = host_recv ? base + recv_at : recv;
    if (host_send) st = staged_copy(b, (void *)dsend, send, send_bytes, s, what, err);
    if (st == ZT_OK) st = call(self, comm, dsend, drecv, count, dtype, arg, stream, err);
    if (st == ZT_OK && host_recv) st = staged_copy(b, recv, drecv, recv_bytes, s, what, err);
    return st == ZT_OK ? staged_wait(b, s, what, err) : st;
}

static zt_status call_all_reduce(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                 int32_t dtype, int32_t op, void *stream, zt_error *err)
{
    return device_all_reduce(self, comm, send, recv, count, dtype, op, stream, err);
}
static zt_status call_reduce_scatter(zt_comm_backend *self, void *comm, const void *send, void *recv,
                                     uint64_t count, int32_t dtype, int32_t op, void *stream, zt_error *err)
{
    return device_reduce_scatter(self, comm, send, recv, count, dtype, op, stream, err);
}
static zt_status call_all_gather(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                 int32_t dtype, int32_t unused, void *stream, zt_error *err)
{
    (void)unused;
    return device_all_gather(self, comm, send, recv, count, dtype, stream, err);
}
static zt_status call_broadcast(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                int32_t dtype, int32_t root, void *stream, zt_error *err)
{
    (void)send;
    return device_broadcast(self, comm, recv, count, dtype, root, stream, err);
}
static zt_status call_send(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                           int32_t dtype, int32_t peer, void *stream, zt_error *err)
{
    (void)recv;
    return device_send(self, comm, send, count, dtype, peer, stream, err);
}
static zt_status call_recv(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                           int32_t dtype, int32_t peer, void *stream, zt_error *err)
{
    (void)send;
    return device_recv(self, comm, recv, count, dtype, peer, stream, err);
}

static uint64_t group_size_of(void *comm) { return (uint64_t)((nccl_group *)comm)->size; }

static zt_status nccl_all_reduce(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                 int32_t dtype, int32_t op, void *stream, zt_error *err)
{
    uint64_t bytes = count * zt_comm_element_size(dtype);
    return staged(self, comm, send, bytes, recv, bytes, count, dtype, op, stream, call_all_reduce, "all_reduce", err);
}

static zt_status nccl_reduce_scatter(zt_comm_backend *self, void *comm, const void *send, void *recv,
                                     uint64_t count, int32_t dtype, int32_t op, void *stream, zt_error *err)
{
    uint64_t bytes = count * zt_comm_element_size(dtype);
    return staged(self, comm, send, bytes * group_size_of(comm), recv, bytes, count, dtype, op, stream,
                  call_reduce_scatter, "reduce_scatter", err);
}

static zt_status nccl_all_gather(zt_comm_backend *self, void *comm, const void *send, void *recv, uint64_t count,
                                 int32_t dtype, void *stream, zt_error *err)
{
    uint64_t bytes = count * zt_comm_element_size(dtype);
    return staged(self, comm, send, bytes, recv, bytes * group_size_of(comm), count, dtype, 0, stream,
                  call_all_gather, "all_gather", err);
}

static zt_status nccl_broadcast(zt_comm_backend *self, void *comm, void *buf, uint64_t count, int32_t dtype,
                                int32_t root, void *stream, zt_error *err)
{
    uint64_t bytes = count * zt_comm_element_size(dtype);
    return staged(self, comm, buf, bytes, buf, bytes, count, dtype, root, stream, call_broadcast, "broadcast", err);
}

static zt_status nccl_send(zt_comm_backend *self, void *comm, const void *buf, uint64_t count, int32_t dtype,
                           int32_t peer, void *stream, zt_error *err)
{
    uint64_t bytes = count * zt_comm_element_size(dtype);
    return staged(self, comm, buf, bytes, NULL, 0, count, dtype, peer, stream, call_send, "send", err);
}

static zt_status nccl_recv(zt_comm_backend *self, void *comm, void *buf, uint64_t count, int32_t dtype, int32_t peer,
                           void *stream, zt_error *err)
{
    uint64_t bytes = count * zt_comm_element_size(dtype);
    return staged(self, comm, NULL, 0, buf, bytes, count, dtype, peer, stream, call_recv, "recv", err);
}

/* Waits on the host, under the watchdog, for what this backend queued on its own stream. */
static zt_status wait_own_stream(nccl_backend *b, const char *what, zt_error *err)
{
    int slot = track_begin(b, what);
    zt_status st = track_end(b, slot, b->stream, err);
    if (st != ZT_OK) return st;
    wait_all_tracked(b);
    cudaError_t rc = cudaStreamQuery(b->stream);
    return rc == cudaSuccess ? ZT_OK : cuda_failed(b, rc, what, err);
}

/* A host barrier: a one-word all_reduce on this backend's stream, waited for. */
static zt_status nccl_barrier(zt_comm_backend *self, void *comm, zt_error *err)
{
    nccl_backend *b = (nccl_backend *)self;
    nccl_group *g = comm;
    char what[WHAT_MAX];
    describe_call(g, OP_BARRIER, "", 0, ZT_U8, what);
    float *word = (float *)(b->scratch + 2 * ZT_COMM_NCCL_ID_BYTES);
    ENQUEUE(b, g, what, b->stream, ncclAllReduce(word, word, 1, ncclFloat32, ncclSum, g->comm, b->stream));
    return wait_own_stream(b, what, err);
}

/* ---- groups ------------------------------------------------------------------------------------ */

static uint64_t group_fingerprint(const char *name, const int32_t *ranks, int32_t n)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * UINT64_C(0x100000001b3);
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)ranks[i]) * UINT64_C(0x100000001b3);
    return h;
}

/* The group's first member makes the id and sends it, with the group's fingerprint, to the
 * others over the bootstrap communicator; they check they are creating the same group. */
static zt_status exchange_group_id(nccl_backend *b, const char *name, const int32_t *ranks, int32_t n, int me,
                                   ncclUniqueId *id, zt_error *err)
{
    unsigned char host[ZT_COMM_NCCL_ID_BYTES + 8];
    uint64_t mine = group_fingerprint(name, ranks, n);
    char what[WHAT_MAX];
    snprintf(what, sizeof what, "creating group '%s' (%d ranks; world rank %d, its first, sends the others its id)",
             name, n, ranks[0]);
    ncclResult_t rc;
    cudaError_t crc;
    if (me == 0) {
        rc = ncclGetUniqueId(id);
        if (rc != ncclSuccess) return nccl_failed(b, NULL, rc, "ncclGetUniqueId", err);
        memcpy(host, id, ZT_COMM_NCCL_ID_BYTES);
        memcpy(host + ZT_COMM_NCCL_ID_BYTES, &mine, 8);
        crc = cudaMemcpyAsync(b->scratch, host, sizeof host, cudaMemcpyHostToDevice, b->stream);
        if (crc == cudaSuccess) crc = cudaStreamSynchronize(b->stream); /* host is on this stack */
        if (crc != cudaSuccess) return cuda_failed(b, crc, what, err);
        int slot = track_begin(b, what);
        rc = ncclGroupStart();
        for (int32_t i = 1; i < n && rc == ncclSuccess; i++)
            rc = ncclSend(b->scratch, sizeof host, ncclUint8, ranks[i], b->boot, b->stream);
        ncclResult_t end = ncclGroupEnd();
        if (rc == ncclSuccess) rc = end;
        zt_status st = finish_call(b, b->boot, rc, 0, what, err);
        zt_status st2 = track_end(b, slot, b->stream, err);
        if (st != ZT_OK) return st;
        if (st2 != ZT_OK) return st2;
        return wait_own_stream(b, what, err);
    }
    int slot = track_begin(b, what);
    rc = ncclRecv(b->scratch, sizeof host, ncclUint8, ranks[0], b->boot, b->stream);
    zt_status st = finish_call(b, b->boot, rc, 0, what, err);
    zt_status st2 = track_end(b, slot, b->stream, err);
    if (st != ZT_OK) return st;
    if (st2 != ZT_OK) return st2;
    st = wait_own_stream(b, what, err);
    if (st != ZT_OK) return st;
    crc = cudaMemcpy(host, b->scratch, sizeof host, cudaMemcpyDeviceToHost);
    if (crc != cudaSuccess) return cuda_failed(b, crc, what, err);
    uint64_t theirs;
    memcpy(&theirs, host + ZT_COMM_NCCL_ID_BYTES, 8);
    if (theirs != mine)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "group_create('%s'): world rank %d, the group's first, is creating another group at "
                            "this point (another name, other ranks, or another order); every member must create "
                            "the same groups in the same order", name, ranks[0]);
    memcpy(id, host, ZT_COMM_NCCL_ID_BYTES);
    return ZT_OK;
}

static zt_status nccl_group_create(zt_comm_backend *self, const char *name, const int32_t *world_ranks, int32_t n,
                                   void **comm_out, zt_error *err)
{
    nccl_backend *b = (nccl_backend *)self;
    int me = -1;
    for (int32_t i = 0; i < n; i++)
        if (world_ranks[i] == b->base.world_rank) me = i;
    if (me < 0)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "group_create('%s'): world rank %d is not a member",
                            name, b->base.world_rank);
    nccl_group *g = calloc(1, sizeof *g);
    if (!g) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating group '%s'", name);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->rank = me;
    g->size = n;
    ncclUniqueId id;
    zt_status st = exchange_group_id(b, name, world_ranks, n, me, &id, err);
    char what[WHAT_MAX];
    snprintf(what, sizeof what, "starting NCCL for group '%s' (%d ranks)", name, n);
    if (st == ZT_OK) st = init_comm(b, &id, n, me, what, &g->comm, err);
    if (st != ZT_OK) {
        free(g);
        return st;
    }
    pthread_mutex_lock(&b->lock);
    g->next = b->groups;
    b->groups = g;
    pthread_mutex_unlock(&b->lock);
    *comm_out = g;
    return ZT_OK;
}

/* Flushes and frees a communicator; one whose peers are gone is aborted instead of waited for. */
static void close_comm(nccl_backend *b, ncclComm_t comm, const char *name)
{
    zt_error err;
    char what[WHAT_MAX];
    snprintf(what, sizeof what, "closing NCCL for group '%s'", name);
    if (finish_call(b, comm, ncclCommFinalize(comm), 1, what, &err) != ZT_OK) {
        fprintf(stderr, "zt-run: warning: %s; aborting it\n", err.msg);
        ncclCommAbort(comm);
        return;
    }
    ncclCommDestroy(comm);
}

static void nccl_group_destroy(zt_comm_backend *self, void *comm)
{
    nccl_backend *b = (nccl_backend *)self;
    nccl_group *g = comm;
    wait_all_tracked(b); /* nothing of this group still in flight */
    pthread_mutex_lock(&b->lock);
    for (nccl_group **p = &b->groups; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    pthread_mutex_unlock(&b->lock);
    close_comm(b, g->comm, g->name);
    free(g);
}

/* ---- start and shutdown ------------------------------------------------------------------------ */

static void stop_watchdog(nccl_backend *b)
{
    if (!b->watchdog_running) return;
    pthread_mutex_lock(&b->lock);
    b->stop = 1;
    pthread_mutex_unlock(&b->lock);
    pthread_join(b->watchdog, NULL);
    b->watchdog_running = 0;
}

static void free_backend(nccl_backend *b)
{
    stop_watchdog(b);
    for (int i = 0; i < MAX_PENDING; i++)
        if (b->ring[i].event) cudaEventDestroy(b->ring[i].event);
    if (b->scratch) cudaFree(b->scratch);
    if (b->staging) cudaFree(b->staging);
    if (b->stream) cudaStreamDestroy(b->stream);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

static void nccl_destroy(zt_comm_backend *self)
{
    nccl_backend *b = (nccl_backend *)self;
    wait_all_tracked(b);
    while (b->groups) nccl_group_destroy(self, b->groups);
    stop_watchdog(b);
    if (b->boot) close_comm(b, b->boot, "bootstrap");
    b->boot = NULL;
    zt_comm_backend *bootstrap = b->bootstrap;
    free_backend(b);
    if (bootstrap) bootstrap->destroy(bootstrap);
}

EXPORT zt_status zt_comm_nccl_unique_id_v1(unsigned char id[ZT_COMM_NCCL_ID_BYTES], char *version, size_t cap,
                                           zt_error *err);
EXPORT zt_status zt_comm_nccl_unique_id_v1(unsigned char id[ZT_COMM_NCCL_ID_BYTES], char *version, size_t cap,
                                           zt_error *err)
{
    int v = 0;
    if (ncclGetVersion(&v) == ncclSuccess && version && cap)
        snprintf(version, cap, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    ncclUniqueId uid;
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* no NVLink multicast unless asked for (docs/distributed.md) */
    ncclResult_t rc = ncclGetUniqueId(&uid);
    const char *last = rc == ncclSuccess ? NULL : ncclGetLastError(NULL);
    if (rc != ncclSuccess)
        return zt_error_set(err, ZT_ERR_COMM, "ncclGetUniqueId failed: %s%s%s (NCCL_DEBUG=WARN says more; "
                            "NCCL_SOCKET_IFNAME picks the network interface)", ncclGetErrorString(rc),
                            last && *last ? ": " : "", last ? last : "");
    memcpy(id, &uid, ZT_COMM_NCCL_ID_BYTES);
    return ZT_OK;
}

EXPORT zt_status zt_comm_nccl_create_v1(const zt_comm_nccl_options *opt, zt_comm_backend **out, zt_error *err);
EXPORT zt_status zt_comm_nccl_create_v1(const zt_comm_nccl_options *opt, zt_comm_backend **out, zt_error *err)
{
    *out = NULL;
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    nccl_backend *b = calloc(1, sizeof *b);
    if (!b) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating the NCCL backend");
    pthread_mutex_init(&b->lock, NULL);
    b->timeout_s = opt->timeout_s;
    b->base = (zt_comm_backend){
        .name = "nccl",
        .world_rank = opt->rank,
        .world_size = opt->world_size,
        .group_create = nccl_group_create,
        .group_destroy = nccl_group_destroy,
        .all_reduce = nccl_all_reduce,
        .reduce_scatter = nccl_reduce_scatter,
        .all_gather = nccl_all_gather,
        .broadcast = nccl_broadcast,
        .send = nccl_send,
        .recv = nccl_recv,
        .barrier = nccl_barrier,
        .destroy = nccl_destroy,
    };
    cudaError_t crc = cudaGetDevice(&b->device);
    if (crc == cudaSuccess) crc = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking);
    if (crc == cudaSuccess) crc = cudaMalloc((void **)&b->scratch, 3 * ZT_COMM_NCCL_ID_BYTES);
    if (crc != cudaSuccess) {
        cuda_failed(b, crc, "starting the NCCL backend (stream, scratch memory)", err);
        free_backend(b);
        return err->status;
    }
    if (pthread_create(&b->watchdog, NULL, watchdog_main, b) != 0) {
        zt_error_set(err, ZT_ERR_COMM, "cannot start the NCCL watchdog thread");
        free_backend(b);
        return err->status;
    }
    b->watchdog_running = 1;
    ncclUniqueId id;
    memcpy(&id, opt->id, sizeof id);
    char what[WHAT_MAX];
    snprintf(what, sizeof what, "start-up (connecting the %d ranks from %s through NCCL on GPU %d)", opt->world_size,
             opt->launcher, b->device);
    zt_status st = init_comm(b, &id, opt->world_size, opt->rank, what, &b->boot, err);
    if (st != ZT_OK) {
        free_backend(b);
        return st;
    }
    b->bootstrap = opt->bootstrap;
    *out = &b->base;
    return ZT_OK;
}
