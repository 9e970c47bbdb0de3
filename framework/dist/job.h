/* The job directory: what the ranks of `zt-run --nproc N` and the zt-run that started them tell each
 * other, which neither could see otherwise (docs/distributed.md, "Stopping a job, and when a rank
 * fails").
 *
 * zt-run --nproc creates a private directory and names it in the ranks' environment, ZT_NPROC_DIR
 * (an internal variable between zt-run and its ranks; set by hand it does nothing useful). In it:
 *
 *   rank-R        rank R's pid, its start time (so a recycled pid is not mistaken for it) and its
 *                 comm.timeout_s, written once the rank has connected to the others. zt-run signals
 *                 the rank by pid (mpirun would turn a relayed SIGINT into SIGTERM and SIGKILL one
 *                 second later, too soon for a checkpoint) and watches whether it dies or stops; the
 *                 other ranks name it when it does.
 *   rank-R.ready  rank R catches SIGINT and SIGTERM (the trainer's handler is in place): zt-run holds
 *                 a user's interrupt until then.
 *   rank-R.end    how rank R ended, when it ended by itself: its exit status, "terminated" (the
 *                 launcher ended it) or "aborted" (its watchdog ended the job), and when. A rank that
 *                 is gone without one was killed.
 *   interrupt     the signal zt-run relays from the user (Ctrl-C, SIGTERM) and how many it had,
 *                 written before any rank gets one: a rank then tells a user's SIGTERM from the one a
 *                 launcher sends to tear the job down after a failure, and a second interrupt, which
 *                 zt-run passes on as mpirun's SIGTERM, from a first.
 *   failure       why zt-run ends the job itself (a rank stopped for longer than comm.timeout_s),
 *                 written before it does: the ranks say it as they end.
 *   rank-R.flight.jsonl  rank R's flight recorder dump (flight.h), written on a watchdog timeout, a
 *                 fatal signal or an interrupt. zt-run keeps these when it removes the directory.
 *
 * Without ZT_NPROC_DIR (one process, your own mpirun or srun) the rank-side calls do nothing and
 * the queries answer "nothing known". Everything marked async-signal-safe uses only open, read,
 * write, rename, close, kill and clock_gettime: no stdio, no allocation. The MPI module compiles its
 * own copy of this file (framework/CMakeLists.txt), which reads the same directory.
 */
#ifndef ZT_FRAMEWORK_JOB_H
#define ZT_FRAMEWORK_JOB_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/error.h"

#define ZT_JOB_DIR_ENV "ZT_NPROC_DIR"
/* The end of a flight recorder dump's name (flight.h): rank-R.flight.jsonl. */
#define ZT_JOB_FLIGHT_SUFFIX ".flight.jsonl"

/* ---- the rank's side ---------------------------------------------------------------------------- */

/* This process is rank `rank` of `world_size`, started by `launcher` (zt_launch.launcher). Reads
 * ZT_NPROC_DIR; without it every call below does nothing. */
void zt_job_attach(int32_t rank, int32_t world_size, const char *launcher);
int zt_job_attached(void);
int32_t zt_job_rank(void);
/* The job directory when attached, else "". */
const char *zt_job_dir(void);

/* Writes rank-R (pid, start time, comm.timeout_s). A directory that cannot be written is a warning:
 * the run goes on, zt-run then knows less. */
void zt_job_register(double timeout_s);

/* rank-R.ready appears (1) or goes (0). */
void zt_job_set_ready(int ready);

/* rank-R.end: `how` is "exit" with this rank's exit status, "terminated" or "aborted".
 * Async-signal-safe. */
void zt_job_note_end(const char *how, int status);

/* The status the process exits with for `status`. Under zt-run --nproc's mpirun a rank stopped by
 * an interrupt (130) exits 0, its 130 in rank-R.end: mpirun would call a non-zero exit a failure and
 * print that it aborted the job, and zt-run exits 130 for it. Async-signal-safe. */
int zt_job_exit_status(int status);

/* Whether a SIGTERM that just arrived ends the job rather than asks for a checkpoint: another rank
 * is gone, stopped or has failed, or zt-run (which records every interrupt it relays) recorded none,
 * so the launcher is tearing the job down. 0 when not attached. Async-signal-safe. */
int zt_job_sigterm_ends_job(void);

/* How many interrupts zt-run recorded (0: none, or not attached). Async-signal-safe. */
int zt_job_interrupts(void);

/* Appends to out[*len..cap) why zt-run ended the job (`failure`), else the other ranks that are
 * gone, stopped or have failed, e.g. "rank 1 (pid 4242) has died (killed by a signal: the
 * launcher's message says which)", separated by "; "; returns how many. Async-signal-safe. */
int zt_job_describe_peers(char *out, size_t cap, size_t *len);

/* Appends text (the whole of it, or as much as fits; out stays NUL-terminated) or a decimal number to
 * out[*len..cap). Async-signal-safe: for the messages of signal handlers. */
void zt_job_append(char *out, size_t cap, size_t *len, const char *text);
void zt_job_append_int(char *out, size_t cap, size_t *len, long long value);

/* ---- the launcher's side ------------------------------------------------------------------------ */

/* What the launcher knows of one rank from the directory. */
typedef struct zt_job_rank_info {
    int registered;          /* rank-R was read */
    pid_t pid;
    unsigned long long start; /* its start time in clock ticks after boot (/proc/PID/stat) */
    double timeout_s;        /* its comm.timeout_s; 0: none */
    int ready;
    int ended;               /* rank-R.end was read */
    char end_how[16];        /* "exit", "terminated", "aborted" */
    int end_status;
    double end_at;           /* when (monotonic seconds, the clock of zt_now_s) */
} zt_job_rank_info;

/* A new private directory $TMPDIR/zt-nproc-XXXXXX (/tmp without TMPDIR) into dir[cap]. */
zt_status zt_job_dir_create(char *dir, size_t cap, zt_error *err);
/* Removes the directory and what the ranks wrote in it, except their flight recorder dumps
 * (rank-R.flight.jsonl): the directory stays when there are some, and the number kept is returned. */
int zt_job_dir_remove(const char *dir);
/* Reads rank R's files into *out (zeroed first). */
void zt_job_read_rank(const char *dir, int32_t rank, zt_job_rank_info *out);
/* Writes `interrupt`: the signal relayed and how many interrupts there were; before the ranks get it. */
void zt_job_record_interrupt(const char *dir, int sig, int count);
/* Writes `failure`: why zt-run ends the job ("rank 1 (pid 4242) has been stopped for 5 s ..."). */
void zt_job_record_failure(const char *dir, const char *why);

/* The state of process `pid` as /proc shows it ('R', 'S', 'D', 'T', 't', 'Z', ...), or 0 when it is
 * gone or the pid now belongs to a process that started at another time than `start`.
 * Async-signal-safe. */
char zt_job_process_state(pid_t pid, unsigned long long start);

#endif
