/* The flight recorder: each rank's last N collectives, dumped when the job goes wrong, and the
 * analysis that says which rank is behind and in which collective (docs/distributed.md, "The
 * flight recorder").
 *
 * The ring. Every collective of host->all_reduce, ... (host/collectives.c) takes one slot of a ring
 * of comm.flight_recorder.entries slots, allocated once: its number in its group (seq), the op,
 * the group, element count, bytes, dtype, root or peer, its state and when it was issued and
 * completed. CPU collectives (MPI, local) are complete when the backend returns; GPU ones
 * (NCCL) are "enqueued" then, and complete once the event the NCCL backend records after them
 * has fired, which its watchdog thread sees (no host synchronisation is added). Recording is
 * lock-free: an atomic counter hands out slots, and a slot's id is written last, so a dump that
 * interrupts a write skips that slot instead of reading half of it.
 *
 * The dumps. On a watchdog timeout (the MPI and NCCL backends call the hooks below), a fatal
 * signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) or an interrupt (SIGINT, SIGTERM: the
 * trainer's handler) a rank writes its ring as JSON lines to DIR/rank-R.flight.jsonl (through a
 * temporary file and a rename), DIR being the job directory of zt-run --nproc (job.h), else the
 * run's output directory. Dumping is async-signal-safe: open, write, rename, close, clock_gettime
 * and the ring's atomics only.
 *
 * The analysis (zt_flight_analyze) reads the dumps of a directory: per group, the rank whose last
 * issued (then last completed) sequence number is lowest is behind, and the collective the others
 * wait in is named with its op and bytes; a member that left no dump (killed, or stopped) is found
 * by elimination and named with what its launcher knows of it. zt-run --nproc prints it when a
 * job fails; `zt-run --flight-recorder DIR` prints it after the fact.
 */
#ifndef ZT_FRAMEWORK_FLIGHT_H
#define ZT_FRAMEWORK_FLIGHT_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "base/error.h"
#include "dist/job.h"

/* A rank's dump in its directory: rank-R followed by this. */
#define ZT_FLIGHT_SUFFIX ZT_JOB_FLIGHT_SUFFIX

enum zt_flight_op {
    ZT_FLIGHT_ALL_REDUCE,
    ZT_FLIGHT_REDUCE_SCATTER,
    ZT_FLIGHT_ALL_GATHER,
    ZT_FLIGHT_BROADCAST,
    ZT_FLIGHT_SEND,
    ZT_FLIGHT_RECV,
    ZT_FLIGHT_BARRIER,
    ZT_FLIGHT_OP_COUNT
};

/* What the comm modules (libzt-comm-mpi.so, libzt-comm-nccl.so), which cannot link zt-run's
 * symbols, call back into. Given to a module through its optional export ZT_COMM_*_FLIGHT_ENTRY
 * before its backend is created. */
typedef struct zt_flight_hooks {
    /* The token of the collective this thread is issuing now (0: none, or a call of the backend's
     * own such as group creation). The NCCL backend keeps it with the event it records. */
    uint64_t (*current)(void);
    /* The collective of `token` has completed (the NCCL watchdog saw its event fire). */
    void (*completed)(uint64_t token);
    /* Dump the ring now, `reason` saying why ("watchdog timeout in all_reduce #57 on group 'dp'").
     * Async-signal-safe. */
    void (*dump)(const char *reason);
    /* After a dump for a watchdog timeout: without zt-run --nproc (which analyzes the dumps once
     * the job has ended), waits up to a few seconds for the other ranks' dumps and prints the
     * analysis to stderr. Not for signal handlers. */
    void (*report)(void);
} zt_flight_hooks;

/* The modules' optional exports: void NAME(const zt_flight_hooks *hooks). */
#define ZT_COMM_MPI_FLIGHT_ENTRY "zt_comm_mpi_flight_v1"
#define ZT_COMM_NCCL_FLIGHT_ENTRY "zt_comm_nccl_flight_v1"
typedef void (*zt_comm_flight_fn)(const zt_flight_hooks *hooks);

/* ---- recording (the rank's side) ---------------------------------------------------------------- */

/* Allocates the ring of `entries` slots (0: the recorder is off) for rank `rank` of `world_size`
 * and installs the fatal-signal dumps. Dumps go to the job directory when zt_job_attach found one;
 * else nowhere until zt_flight_set_dir. Once per process; a second call changes nothing. */
zt_status zt_flight_init(int32_t rank, int32_t world_size, uint32_t entries, zt_error *err);
/* Where the dumps go when there is no job directory (the run's output directory); removes this
 * rank's dump of an earlier run there. Ignored under a job directory and for a single process. */
void zt_flight_set_dir(const char *dir);
const zt_flight_hooks *zt_flight_hooks_get(void);

/* Registers a group (called as it is created); returns its index for zt_flight_issue, -1 when the
 * recorder is off or its table of groups is full. */
int32_t zt_flight_group(const char *name, const int32_t *world_ranks, int32_t n, int32_t my_rank);

/* A collective on group `group` is about to be issued: `count` elements as the caller gave them,
 * `bytes` the largest buffer of the call, `peer` the root or peer (group rank; -1 when none).
 * Returns its token (0 when not recorded). The token is this thread's current one until
 * zt_flight_returned. */
uint64_t zt_flight_issue(int32_t group, int op, uint64_t count, int32_t dtype, uint64_t bytes, int32_t peer);
/* The backend returned for `token`: `ok` 0 marks it failed; else it is complete, or enqueued when
 * `async` (NCCL), to be completed by the hooks' completed(). */
void zt_flight_returned(uint64_t token, int ok, int async);

/* Writes this rank's dump now (reason: why). 0 on success, -1 when off, no directory, or the
 * write failed. Async-signal-safe. */
int zt_flight_dump(const char *reason);

/* ---- reading the dumps ------------------------------------------------------------------------- */

/* What a launcher knows of a rank that the dumps may not say. */
typedef struct zt_flight_rank_state {
    pid_t pid;         /* 0: not known */
    int stopped;       /* it was stopped (SIGSTOP, Ctrl-Z, a debugger) */
    double stopped_s;  /* for how long, when stopped */
    int killed;        /* it died by a signal without saying how it ended */
    int signal;        /* that signal, when known; 0 otherwise */
} zt_flight_rank_state;

/* Reads DIR/rank-*.flight.jsonl and prints, each line starting with `prefix`, which rank is
 * behind in which group and collective, and the members found by elimination. `world_size` 0
 * takes it from the dumps; `states` (world_size entries) may be NULL. *n_dumps gets how many dumps
 * were read. ZT_ERR_NOT_FOUND when there is none; ZT_ERR_FORMAT naming the file and line of a dump
 * that does not parse. */
zt_status zt_flight_analyze(const char *dir, int32_t world_size, const zt_flight_rank_state *states, FILE *out,
                            const char *prefix, int *n_dumps, zt_error *err);

#endif
