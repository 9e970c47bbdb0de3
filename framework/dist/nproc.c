/* `zt-run --nproc N`: N ranks on this machine (launch.h, docs/distributed.md). GPU ranks are this
 * process's children: it relays their output and signals. CPU ranks are mpirun's children: this
 * process starts mpirun and watches the ranks through the job directory (job.h), so it can relay a
 * user's interrupt to each rank itself (mpirun would turn it into SIGTERM and SIGKILL one second
 * later, too soon for a checkpoint), tell an interrupt from a failure, and name the rank that died
 * or stopped. */
#define _GNU_SOURCE /* readlink, strsignal, prctl, pipe2 */
#include "dist/launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/module.h"
#include "base/threadpool.h"
#include "device/device.h"
#include "dist/comm_mpi.h"
#include "dist/comm_nccl.h"
#include "dist/flight.h"
#include "dist/job.h"

#if !defined(ZT_HAVE_MPI_BACKEND) || !defined(ZT_HAVE_NCCL_BACKEND)
#error "ZT_HAVE_MPI_BACKEND and ZT_HAVE_NCCL_BACKEND must be defined (framework/CMakeLists.txt)"
#endif

#define MAX_LOCAL_RANKS 1024

static const char *env_value(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* ---- both kinds of ranks ---------------------------------------------------------------------- */

/* The first executable `name` on $PATH, like execvp finds it. */
static int find_on_path(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path || !*path) return 0;
    for (const char *dir = path; dir;) {
        const char *colon = strchr(dir, ':');
        size_t len = colon ? (size_t)(colon - dir) : strlen(dir);
        int w = len ? snprintf(out, cap, "%.*s/%s", (int)len, dir, name) : snprintf(out, cap, "./%s", name);
        if (w > 0 && (size_t)w < cap && access(out, X_OK) == 0) return 1;
        dir = colon ? colon + 1 : NULL;
    }
    return 0;
}

/* SIGINT, SIGTERM and SIGHUP to zt-run are the user's (a terminal's Ctrl-C reaches zt-run alone:
 * the ranks, or mpirun, are in process groups of their own); the supervisors relay them. Counted,
 * so a second Ctrl-C is seen as one. */
static volatile sig_atomic_t g_signals_seen, g_last_signal;

static void on_user_signal(int sig)
{
    g_last_signal = sig;
    g_signals_seen++;
}

typedef struct caught_signals {
    struct sigaction old_int, old_term, old_hup;
} caught_signals;

static void catch_user_signals(caught_signals *c)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_user_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &c->old_int);
    sigaction(SIGTERM, &sa, &c->old_term);
    sigaction(SIGHUP, &sa, &c->old_hup);
}

static void restore_user_signals(const caught_signals *c)
{
    sigaction(SIGINT, &c->old_int, NULL);
    sigaction(SIGTERM, &c->old_term, NULL);
    sigaction(SIGHUP, &c->old_hup, NULL);
}

/* "was killed by signal 9 (Killed; pid 4242): out of memory (dmesg says), or killed by hand" */
static void describe_signal(int sig, pid_t pid, char *out, size_t cap)
{
    snprintf(out, cap, "was killed by signal %d (%s; pid %ld)%s", sig, strsignal(sig), (long)pid,
             sig == SIGKILL ? ": out of memory (dmesg says), or killed by hand" : "");
}

static void describe_exit(int status, pid_t pid, char *out, size_t cap)
{
    if (WIFEXITED(status))
        snprintf(out, cap, "exited with code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        describe_signal(WTERMSIG(status), pid, out, cap);
    else
        snprintf(out, cap, "ended with status %d", status);
}

/* After a job that failed: which rank the flight recorder's dumps show behind, and in which
 * collective (dist/flight.h). `states` holds what this process saw of each of the `world` ranks. */
static void report_flight(const char *job_dir, long world, const zt_flight_rank_state *states)
{
    zt_error err;
    int n = 0;
    fflush(stdout);
    if (zt_flight_analyze(job_dir, (int32_t)world, states, stderr, "zt-run: flight recorder: ", &n, &err) != ZT_OK &&
        err.status != ZT_ERR_NOT_FOUND)
        fprintf(stderr, "zt-run: flight recorder: %s\n", err.msg);
    fflush(stderr);
}

/* Removes the job directory; the ranks' flight recorder dumps stay, and this says where. */
static void remove_job_dir(const char *job_dir)
{
    if (zt_job_dir_remove(job_dir))
        fprintf(stderr, "zt-run: flight recorder: the ranks' dumps stay in %s (zt-run --flight-recorder %s reads "
                "them again)\n", job_dir, job_dir);
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL); /* a signal cuts it short: the loop then relays it at once */
}

/* ---- zt-run --nproc on GPUs: the ranks are this process's children ----------------------------- */

#define NPROC_GRACE_S 10.0 /* after one rank fails, the others get this long to end on SIGTERM */

/* The value of the last `--set device=V` (or --set=device=V) in argv; NULL when none. */
static const char *device_in_args(int argc, char **argv)
{
    const char *found = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = NULL;
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) a = argv[++i];
        else if (strncmp(argv[i], "--set=", 6) == 0) a = argv[i] + 6;
        if (a && strncmp(a, "device=", 7) == 0) found = a + 7;
    }
    return found;
}

/* A free TCP port on 127.0.0.1 for the children's rendezvous, held (*holder, bound, never listening)
 * until they are done: a port merely found free and closed again can be taken as the source port of
 * some other program's connection before rank 0 binds it (seen with NCCL jobs running beside each
 * other); Linux never picks an explicitly bound port for that. Both sockets set SO_REUSEADDR, so rank
 * 0's listening socket may bind the port while this one holds it (it never listens). */
static int reserve_local_port(int *holder, zt_error *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || getsockname(fd, (struct sockaddr *)&sa, &len)) {
        int e = errno;
        if (fd >= 0) close(fd);
        zt_error_set(err, ZT_ERR_IO, "--nproc: cannot find a free TCP port on 127.0.0.1 for the ranks' "
                     "rendezvous: %s", strerror(e));
        return -1;
    }
    *holder = fd;
    return ntohs(sa.sin_port);
}

typedef struct rank_output {
    int fd;            /* -1 when closed */
    FILE *to;          /* stdout or stderr */
    int rank;
    char buf[16384];
    size_t len;
} rank_output;

/* zt's own log lines already say "zt[rank 1] ...": those go as they are. */
static void emit_line(rank_output *o, const char *line, size_t len)
{
    if (len >= 8 && strncmp(line, "zt[rank ", 8) == 0)
        fprintf(o->to, "%.*s\n", (int)len, line);
    else
        fprintf(o->to, "[rank %d] %.*s\n", o->rank, (int)len, line);
}

/* Writes the complete lines of `o` (all of it when `flush`), each prefixed with its rank. */
static void emit_lines(rank_output *o, int flush)
{
    size_t start = 0;
    for (size_t i = 0; i < o->len; i++)
        if (o->buf[i] == '\n') {
            emit_line(o, o->buf + start, i - start);
            start = i + 1;
        }
    if (flush && start < o->len) {
        emit_line(o, o->buf + start, o->len - start);
        start = o->len;
    }
    memmove(o->buf, o->buf + start, o->len - start);
    o->len -= start;
    fflush(o->to);
}

static void pump_output(rank_output *outs, int n_outs, int wait_ms)
{
    struct pollfd fds[2 * MAX_LOCAL_RANKS];
    int map[2 * MAX_LOCAL_RANKS], n = 0;
    for (int i = 0; i < n_outs; i++)
        if (outs[i].fd >= 0) {
            fds[n] = (struct pollfd){.fd = outs[i].fd, .events = POLLIN};
            map[n++] = i;
        }
    if (!n) {
        if (wait_ms > 0) {
            struct timespec ts = {0, (long)wait_ms * 1000000L};
            nanosleep(&ts, NULL);
        }
        return;
    }
    if (poll(fds, (nfds_t)n, wait_ms) <= 0) return;
    for (int k = 0; k < n; k++) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        rank_output *o = &outs[map[k]];
        if (o->len == sizeof o->buf) emit_lines(o, 1); /* a line longer than the buffer: split it */
        ssize_t got = read(o->fd, o->buf + o->len, sizeof o->buf - o->len);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) {
            emit_lines(o, 1);
            close(o->fd);
            o->fd = -1;
            continue;
        }
        o->len += (size_t)got;
        emit_lines(o, 0);
    }
}

/* The GPU ranks this machine starts: ranks first .. first + count - 1 of world_size, which meet at
 * addr:port. */
typedef struct node_ranks {
    long first, count, world_size;
    const char *addr;
    int port;
} node_ranks;

/* Starts the children, relays their output and signals, and returns the job's exit code. A signal
 * to zt-run is recorded in the job directory `job_dir`, then forwarded as it came: a rank then knows
 * a user's SIGTERM from the one this supervisor sends the others when a rank fails. A rank that ends
 * by the relayed signal, or with 130 (stopped by it, after its checkpoint), has not failed. Ranks
 * are named by their rank in the whole job; local index r is rank first + r. */
static int supervise_ranks(const char *exe, char **args, const node_ranks *job, const char *job_dir)
{
    long nproc = job->count, world = job->world_size;
    pid_t pids[MAX_LOCAL_RANKS];
    int alive[MAX_LOCAL_RANKS], statuses[MAX_LOCAL_RANKS];
    rank_output *outs = calloc((size_t)(2 * nproc), sizeof *outs);
    if (!outs) {
        fprintf(stderr, "zt-run: error: out of memory starting %ld ranks\n", nproc);
        return 1;
    }
    int n_outs = 0;
    caught_signals caught;
    catch_user_signals(&caught);
    int signals_handled = g_signals_seen, relayed = 0; /* relayed: the user's signal, once there was one */
    pid_t parent = getpid();
    char port_text[16], world_text[16], local_world_text[16];
    snprintf(port_text, sizeof port_text, "%d", job->port);
    snprintf(world_text, sizeof world_text, "%ld", world);
    snprintf(local_world_text, sizeof local_world_text, "%ld", nproc);
    long started = 0;
    int code = 0, failed_rank = -1;
    fflush(NULL);
    for (long r = 0; r < nproc; r++) {
        int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
        long rank = job->first + r;
        /* Rank 0 writes straight to this terminal: its output stays as a single run's. */
        if (rank > 0 && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)) {
            fprintf(stderr, "zt-run: error: --nproc: cannot create a pipe for rank %ld: %s\n", rank, strerror(errno));
            code = 1;
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "zt-run: error: --nproc: cannot start rank %ld: %s\n", rank, strerror(errno));
            code = 1;
            break;
        }
        if (pid == 0) {
            /* Its own process group: a terminal's Ctrl-C reaches only zt-run, which forwards it once. */
            setpgid(0, 0);
            prctl(PR_SET_PDEATHSIG, SIGTERM); /* zt-run killed outright: the ranks end too */
            if (getppid() != parent) _exit(1);
            if (rank > 0 && (dup2(out_pipe[1], STDOUT_FILENO) < 0 || dup2(err_pipe[1], STDERR_FILENO) < 0))
                _exit(127);
            char rank_text[24], local_text[24];
            snprintf(rank_text, sizeof rank_text, "%ld", rank);
            snprintf(local_text, sizeof local_text, "%ld", r);
            setenv("ZT_RANK", rank_text, 1);
            setenv("ZT_LOCAL_RANK", local_text, 1);
            setenv("ZT_WORLD_SIZE", world_text, 1);
            setenv("ZT_LOCAL_WORLD_SIZE", local_world_text, 1);
            setenv("ZT_LAUNCHER", ZT_NPROC_LAUNCHER, 1);
            setenv("ZT_MASTER_ADDR", job->addr, 1);
            setenv("ZT_MASTER_PORT", port_text, 1);
            setenv(ZT_JOB_DIR_ENV, job_dir, 1);
            setenv("NCCL_NVLS_ENABLE", "0", 0); /* NVLink multicast off unless asked for */
            execv(exe, args);
            fprintf(stderr, "zt-run: error: --nproc: cannot start rank %ld (%s): %s\n", rank, exe, strerror(errno));
            _exit(127);
        }
        pids[r] = pid;
        alive[r] = 1;
        started++;
        if (rank > 0) {
            close(out_pipe[1]);
            close(err_pipe[1]);
            outs[n_outs++] = (rank_output){.fd = out_pipe[0], .to = stdout, .rank = (int)rank};
            outs[n_outs++] = (rank_output){.fd = err_pipe[0], .to = stderr, .rank = (int)rank};
        }
    }
    if (code) { /* a rank could not start: end those that did */
        for (long r = 0; r < started; r++) kill(pids[r], SIGTERM);
        failed_rank = -2;
    }
    long n_alive = started;
    double kill_at = code ? zt_now_s() + NPROC_GRACE_S : 0;
    while (n_alive > 0) {
        pump_output(outs, n_outs, 100);
        if (g_signals_seen != signals_handled) {
            signals_handled = g_signals_seen;
            int sig = g_last_signal;
            zt_job_record_interrupt(job_dir, sig, signals_handled); /* before any rank gets it */
            relayed = sig;
            for (long r = 0; r < started; r++)
                if (alive[r]) kill(pids[r], sig);
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            long r = 0;
            while (r < started && pids[r] != pid) r++;
            if (r == started || !alive[r]) continue;
            alive[r] = 0;
            statuses[r] = status;
            n_alive--;
            int bad = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            int by_user = relayed && ((WIFEXITED(status) && WEXITSTATUS(status) == 130) ||
                                      (WIFSIGNALED(status) && WTERMSIG(status) == relayed));
            if (bad && by_user && failed_rank == -1) {
                /* Stopped by the user's signal: the job's code is that, and nobody failed. */
                if (!code) code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                if (WIFSIGNALED(status)) {
                    char how[160];
                    describe_signal(WTERMSIG(status), pid, how, sizeof how);
                    pump_output(outs, n_outs, 0);
                    fprintf(stderr, "zt-run: rank %ld of %ld %s, which zt-run relayed to it\n", job->first + r, world,
                            how);
                    fflush(stderr);
                }
                continue;
            }
            if (!bad || failed_rank != -1) continue;
            failed_rank = (int)r;
            code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            pump_output(outs, n_outs, 0); /* its last words first */
            char how[160];
            describe_exit(status, pid, how, sizeof how);
            const char *ending = !n_alive       ? ""
                                 : world > nproc ? "; ending the other ranks on this machine (SIGTERM, then SIGKILL "
                                                   "after 10 s)"
                                                 : "; ending the other ranks (SIGTERM, then SIGKILL after 10 s)";
            fprintf(stderr, "zt-run: rank %ld of %ld %s%s\n", job->first + r, world, how, ending);
            fflush(stderr);
            for (long o = 0; o < started; o++)
                if (alive[o]) kill(pids[o], SIGTERM);
            kill_at = zt_now_s() + NPROC_GRACE_S;
        }
        if (kill_at > 0 && zt_now_s() >= kill_at) {
            for (long r = 0; r < started; r++)
                if (alive[r]) {
                    fprintf(stderr, "zt-run: rank %ld of %ld did not end within 10 s of SIGTERM: SIGKILL\n",
                            job->first + r, world);
                    kill(pids[r], SIGKILL);
                }
            kill_at = 0;
        }
    }
    /* Whatever the ranks wrote last (a child of theirs could hold a pipe: stop after a second). */
    double drain_until = zt_now_s() + 1.0;
    int open_outs = 1;
    while (open_outs && zt_now_s() < drain_until) {
        pump_output(outs, n_outs, 100);
        open_outs = 0;
        for (int i = 0; i < n_outs; i++) open_outs |= outs[i].fd >= 0;
    }
    for (int i = 0; i < n_outs; i++)
        if (outs[i].fd >= 0) {
            emit_lines(&outs[i], 1);
            close(outs[i].fd);
        }
    free(outs);
    restore_user_signals(&caught);
    if (code && code != 130) {
        zt_flight_rank_state *states = calloc((size_t)world, sizeof *states);
        for (long r = 0; states && r < started; r++) {
            zt_flight_rank_state *s = &states[job->first + r];
            s->pid = pids[r];
            s->killed = !alive[r] && WIFSIGNALED(statuses[r]) && WTERMSIG(statuses[r]) != relayed;
            s->signal = s->killed ? WTERMSIG(statuses[r]) : 0;
        }
        report_flight(job_dir, world, states);
        free(states);
    }
    return code;
}

/* Whether --nproc starts GPU ranks (*gpu): device cuda, or auto (the default) with GPUs here. An
 * error when cuda is asked for and unusable, there are fewer GPUs than ranks, or no NCCL backend.
 * `form` is the option that gave nproc, for messages: "--nproc", "--nproc-per-node". */
static zt_status choose_gpu_ranks(const char *form, long nproc, int mode, int argc, char **argv, int *gpu,
                                  zt_error *err)
{
    char what[48];
    snprintf(what, sizeof what, "%s %ld", form, nproc);
    *gpu = mode == ZT_NPROC_FORK;
    if (*gpu) return ZT_OK;
    const char *device = device_in_args(argc, argv);
    if (mode == ZT_NPROC_CPU || (mode == ZT_NPROC_AUTO && device && strcmp(device, "cpu") == 0)) return ZT_OK;
    int want_cuda = mode == ZT_NPROC_GPU || (device && strcmp(device, "cuda") == 0);
    int n_gpus = 0;
    zt_error cuda_err;
    if (zt_device_cuda_count(&n_gpus, &cuda_err) != ZT_OK) {
        if (!want_cuda) return ZT_OK; /* auto without GPUs: CPU ranks */
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "%s with device=cuda starts one rank per GPU, but %s: run on a machine with "
                            "GPUs, or start CPU ranks (--set device=cpu)", what, cuda_err.msg);
    }
    if (nproc > n_gpus)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "%s starts one rank per GPU, but this process sees %d GPU%s%s: use %s %d "
                            "or fewer, or start CPU ranks (--set device=cpu)", what, n_gpus, n_gpus == 1 ? "" : "s",
                            env_value("CUDA_VISIBLE_DEVICES") ? " (CUDA_VISIBLE_DEVICES limits them)" : "", form,
                            n_gpus);
    if (!env_value("ZT_COMM_NCCL_LIBRARY")) {
        char path[PATH_MAX], tried[3 * PATH_MAX + 16];
        if (!ZT_HAVE_NCCL_BACKEND || !zt_module_find(ZT_COMM_NCCL_FILE, path, sizeof path, tried, sizeof tried))
            return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                                "%s starts GPU ranks that talk through NCCL, but %s: install NCCL and "
                                "rebuild zt (docs/distributed.md), or start CPU ranks (--set device=cpu)", what,
                                ZT_HAVE_NCCL_BACKEND ? "zt's NCCL backend libzt-comm-nccl.so is missing"
                                                     : "zt was built without NCCL");
    }
    *gpu = 1;
    return ZT_OK;
}

/* ---- zt-run --nproc on CPUs: mpirun's ranks, watched through the job directory ------------------- */

/* A rank stopped this long past its comm.timeout_s makes zt-run end the job: the others' watchdog
 * cannot see a rank that stopped while they were moving a collective's data with it. */
#define STOPPED_GRACE_S 2.0
#define POLL_MS 100

typedef struct watched_rank {
    zt_job_rank_info info;
    int delivered;        /* interrupts relayed to it */
    double gone_at;       /* when it was first seen gone; 0 while it runs */
    double stopped_since; /* 0 while it is not stopped */
    double longest_stop;
} watched_rank;

/* Reads what rank r wrote, relays the interrupts it has not had yet (one per poll: two signals sent
 * at once would merge into one), and notes whether it is gone or stopped. */
static void watch_rank(const char *job_dir, int32_t r, watched_rank *w, int n_interrupts, int relay_sig,
                       int relaying, double now)
{
    zt_job_read_rank(job_dir, r, &w->info);
    if (!w->info.registered || w->gone_at > 0) return;
    char state = zt_job_process_state(w->info.pid, w->info.start); /* first: its pid may be another's now */
    if (state == 0 || state == 'Z' || state == 'X') {
        w->gone_at = now;
        zt_job_read_rank(job_dir, r, &w->info); /* what it wrote as it ended */
        return;
    }
    if (relaying && w->info.ready && w->delivered < n_interrupts && kill(w->info.pid, relay_sig) == 0)
        w->delivered++;
    if ((state == 'T' || state == 't') && !w->info.ended) { /* ended: exiting (a leak check's stop) */
        if (w->stopped_since == 0) w->stopped_since = now;
        if (now - w->stopped_since > w->longest_stop) w->longest_stop = now - w->stopped_since;
    } else {
        w->stopped_since = 0;
    }
}

/* The rank that brought the job down, and what to say about it (*kind): one that was stopped for a
 * while, else one gone without saying how it ended before zt-run ended the job (killed), else the
 * first that stopped with an error. -1: none. */
static long find_culprit(const watched_rank *w, long nproc, int relay_sig, double ended_at, const char **kind)
{
    long best = -1;
    for (long r = 0; r < nproc; r++)
        if (w[r].longest_stop >= 1.0 && (best < 0 || w[r].longest_stop > w[best].longest_stop)) best = r;
    if (best >= 0) {
        *kind = "stopped";
        return best;
    }
    /* A relayed SIGHUP ends the ranks (they do not catch it), and so does zt-run ending the job. */
    for (long r = 0; r < nproc; r++)
        if (w[r].info.registered && w[r].gone_at > 0 && !w[r].info.ended && relay_sig != SIGHUP &&
            (ended_at == 0 || w[r].gone_at < ended_at) && (best < 0 || w[r].gone_at < w[best].gone_at))
            best = r;
    if (best >= 0) {
        *kind = "killed";
        return best;
    }
    for (long r = 0; r < nproc; r++) {
        const zt_job_rank_info *i = &w[r].info;
        if (i->ended && strcmp(i->end_how, "exit") == 0 && i->end_status != 0 && i->end_status != 130 &&
            (best < 0 || i->end_at < w[best].info.end_at))
            best = r;
    }
    if (best >= 0) *kind = "error";
    return best;
}

/* Starts mpirun (in a process group of its own, so a terminal's Ctrl-C reaches zt-run alone) and
 * watches its ranks until it exits. A user's signal is recorded in the job directory, then sent to
 * each rank once it is ready for it (rank-R.ready); a second one ends the job at once, through
 * mpirun. Returns the job's exit code: 130 when it stopped for an interrupt, 0 when every rank
 * succeeded, else mpirun's, after naming the rank that brought the job down. */
static int supervise_mpirun(const char *mpirun, char **args, long nproc, const char *job_dir)
{
    watched_rank *w = calloc((size_t)nproc, sizeof *w);
    if (!w) {
        fprintf(stderr, "zt-run: error: out of memory starting %ld ranks\n", nproc);
        return 1;
    }
    caught_signals caught;
    catch_user_signals(&caught);
    int n_interrupts = 0, relay_sig = 0, said_waiting = 0;
    double ended_at = 0; /* when zt-run itself ended the job */
    pid_t parent = getpid();
    fflush(NULL);
    pid_t child = fork();
    if (child < 0) {
        fprintf(stderr, "zt-run: error: --nproc: cannot start %s: %s\n", mpirun, strerror(errno));
        restore_user_signals(&caught);
        free(w);
        return 1;
    }
    if (child == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* zt-run killed outright: mpirun ends the ranks */
        if (getppid() != parent) _exit(1);
        /* A background process group reading the terminal would be stopped; the ranks read nothing. */
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, STDIN_FILENO);
        setenv(ZT_JOB_DIR_ENV, job_dir, 1);
        execv(mpirun, args);
        fprintf(stderr, "zt-run: error: --nproc %ld: cannot start %s: %s\n", nproc, mpirun, strerror(errno));
        _exit(127);
    }
    int status = 0;
    for (;;) {
        if (waitpid(child, &status, WNOHANG) == child) break;
        double now = zt_now_s();
        int seen = g_signals_seen;
        if (seen != n_interrupts) {
            relay_sig = g_last_signal;
            n_interrupts = seen;
            zt_job_record_interrupt(job_dir, relay_sig, n_interrupts); /* before any rank gets it */
            long n_ready = 0;
            for (long r = 0; r < nproc; r++) {
                zt_job_read_rank(job_dir, (int32_t)r, &w[r].info);
                n_ready += w[r].info.ready && w[r].gone_at == 0;
            }
            if (n_interrupts >= 2 && ended_at == 0) {
                /* Through mpirun, which ends the ranks quietly; each of them, ready or not, had one
                 * interrupt recorded, so it takes the SIGTERM for the second. */
                fprintf(stderr, "zt-run: second interrupt: ending the ranks now, without a checkpoint\n");
                kill(child, SIGTERM);
                ended_at = now;
            } else if (n_ready < nproc && !said_waiting) {
                fprintf(stderr, "zt-run: interrupt: %ld of %ld ranks are still starting; zt-run passes it on to each "
                        "once it has (interrupt again to end them now, without a checkpoint)\n", nproc - n_ready,
                        nproc);
                said_waiting = 1;
            }
        }
        for (long r = 0; r < nproc; r++) {
            watch_rank(job_dir, (int32_t)r, &w[r], n_interrupts, relay_sig, ended_at == 0, now);
            double limit = w[r].info.timeout_s;
            if (w[r].stopped_since > 0 && limit > 0 && now - w[r].stopped_since > limit + STOPPED_GRACE_S &&
                ended_at == 0) {
                char why[320];
                snprintf(why, sizeof why, "rank %ld of %ld (pid %ld) has been stopped for %.0f s (SIGSTOP, Ctrl-Z "
                         "in its terminal, or a debugger), longer than its comm.timeout_s of %g s", r, nproc,
                         (long)w[r].info.pid, now - w[r].stopped_since, limit);
                zt_job_record_failure(job_dir, why); /* before the ranks hear of it */
                fprintf(stderr, "zt-run: %s: ending the job, which cannot go on without it\n", why);
                kill(child, SIGTERM);
                ended_at = now;
            }
        }
        pause_ms(POLL_MS);
    }
    /* mpirun reaps its ranks before it exits; one it left behind (mpirun killed outright) is ended. */
    double now = zt_now_s();
    for (long r = 0; r < nproc; r++) {
        watch_rank(job_dir, (int32_t)r, &w[r], 0, 0, 0, now);
        if (w[r].info.registered && w[r].gone_at == 0 && kill(w[r].info.pid, SIGKILL) == 0)
            fprintf(stderr, "zt-run: rank %ld of %ld (pid %ld) outlived mpirun: SIGKILL\n", r, nproc,
                    (long)w[r].info.pid);
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const char *kind = NULL;
    /* mpirun exits 0 only when every rank did: nobody to name then. */
    long culprit = code ? find_culprit(w, nproc, relay_sig, ended_at, &kind) : -1;
    long n_registered = 0, n_interrupted = 0, n_done = 0;
    for (long r = 0; r < nproc; r++) {
        const zt_job_rank_info *i = &w[r].info;
        n_registered += i->registered;
        n_interrupted += i->ended && strcmp(i->end_how, "exit") == 0 && i->end_status == 130;
        n_done += i->ended && strcmp(i->end_how, "exit") == 0 && i->end_status == 0;
    }
    if (culprit >= 0) {
        const watched_rank *c = &w[culprit];
        char how[160];
        if (strcmp(kind, "killed") == 0) {
            /* mpirun exits with 128 + the signal of the first rank that was killed */
            if (code > 128 && code < 128 + 65)
                describe_signal(code - 128, c->info.pid, how, sizeof how);
            else
                snprintf(how, sizeof how, "was killed by a signal (pid %ld; mpirun's message above says which)",
                         (long)c->info.pid);
            fprintf(stderr, "zt-run: rank %ld of %ld %s; mpirun ended the other ranks\n", culprit, nproc, how);
        } else if (strcmp(kind, "stopped") == 0) {
            if (ended_at == 0)
                fprintf(stderr, "zt-run: rank %ld of %ld (pid %ld) was stopped for %.0f s (SIGSTOP, Ctrl-Z in its "
                        "terminal, or a debugger), and the other ranks could not go on without it\n", culprit,
                        nproc, (long)c->info.pid, c->longest_stop);
        } else {
            fprintf(stderr, "zt-run: rank %ld of %ld stopped with an error, exit code %d (pid %ld; its message is "
                    "above)\n", culprit, nproc, c->info.end_status, (long)c->info.pid);
            if (!code) code = c->info.end_status;
        }
        if (!code) code = 1;
    } else if (n_interrupts > 0 || n_interrupted > 0) {
        /* Stopped by an interrupt, after the checkpoint; 0 if training ended first on every rank. */
        code = n_registered == nproc && n_done == nproc ? 0 : 130;
    }
    restore_user_signals(&caught);
    if (code && code != 130) {
        zt_flight_rank_state *states = calloc((size_t)nproc, sizeof *states);
        for (long r = 0; states && r < nproc; r++) {
            states[r].pid = w[r].info.registered ? w[r].info.pid : 0;
            states[r].stopped = w[r].longest_stop >= 1.0;
            states[r].stopped_s = w[r].longest_stop;
            /* Gone without saying how, before zt-run or mpirun ended the job (as find_culprit). */
            states[r].killed = w[r].info.registered && w[r].gone_at > 0 && !w[r].info.ended &&
                               (ended_at == 0 || w[r].gone_at < ended_at) && (culprit < 0 || r == culprit);
            if (states[r].killed && r == culprit && code > 128 && code < 128 + 65) states[r].signal = code - 128;
        }
        report_flight(job_dir, nproc, states);
        free(states);
    }
    free(w);
    return code;
}

/* ---- zt-run's launch options ---------------------------------------------------------------------- */

/* Every launch option (each takes a value), with torchrun's older underscore spellings: the ranks'
 * command line leaves them out. */
static const char *const k_launch_options[] = {"--nproc",       "--nnodes",      "--nproc-per-node",
                                               "--nproc_per_node", "--node-rank", "--node_rank",
                                               "--master-addr", "--master_addr", "--master-port",
                                               "--master_port"};

/* 1 when argv[i] is a launch option: 2 with its value in the next argument, 1 as --name=value. */
static int launch_option_width(const char *arg)
{
    for (size_t k = 0; k < sizeof k_launch_options / sizeof k_launch_options[0]; k++) {
        size_t len = strlen(k_launch_options[k]);
        if (strncmp(arg, k_launch_options[k], len) != 0) continue;
        if (arg[len] == '\0') return 2;
        if (arg[len] == '=') return 1;
    }
    return 0;
}

/* The ranks' command line: `head` (n_head entries), then argv[1..] without the launch options;
 * NULL-terminated, NULL when out of memory. */
static char **ranks_command(char *const *head, int n_head, int argc, char **argv)
{
    char **args = calloc((size_t)argc + (size_t)n_head + 1, sizeof *args);
    if (!args) return NULL;
    int n = 0;
    for (int i = 0; i < n_head; i++) args[n++] = head[i];
    for (int i = 1; i < argc; i++) {
        int width = launch_option_width(argv[i]);
        if (width) {
            i += width - 1; /* and its value */
            continue;
        }
        args[n++] = argv[i];
    }
    args[n] = NULL;
    return args;
}

/* A whole number in [min, max], in decimal, nothing else. */
static int parse_count(const char *text, long min, long max, long *out)
{
    errno = 0;
    char *end;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max) return 0;
    *out = v;
    return 1;
}

#define MAX_NODES 65536
#define DEFAULT_MASTER_PORT 29500 /* torchrun's */

zt_status zt_launch_plan_make(const zt_launch_request *req, zt_launch_plan *out, zt_error *err)
{
    *out = (zt_launch_plan){.nnodes = 1, .per_node = 1, .node_rank = 0, .world_size = 1, .form = "--nproc"};
    const struct {
        const char *name, *value;
    } torchrun[] = {{"--nnodes", req->nnodes},           {"--nproc-per-node", req->nproc_per_node},
                    {"--node-rank", req->node_rank},     {"--master-addr", req->master_addr},
                    {"--master-port", req->master_port}};
    const char *first = NULL;
    for (size_t i = 0; i < sizeof torchrun / sizeof torchrun[0] && !first; i++)
        if (torchrun[i].value) first = torchrun[i].name;
    long v;
    if (req->nproc) {
        if (first)
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--nproc and %s are two ways of saying how to start the ranks: give --nproc N "
                                "alone (N ranks on this machine; the same as --nnodes 1 --nproc-per-node N), or "
                                "torchrun's flags (--nnodes, --nproc-per-node, --node-rank, --master-addr, "
                                "--master-port) without --nproc", first);
        if (!parse_count(req->nproc, 1, MAX_LOCAL_RANKS, &v))
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--nproc '%s': expected the number of ranks to start on this machine, a whole "
                                "number from 1 to %d", req->nproc, MAX_LOCAL_RANKS);
        out->per_node = out->world_size = (int32_t)v;
        return ZT_OK;
    }
    if (!first) return ZT_OK; /* no launch option: one process */
    out->form = "--nproc-per-node";
    if (req->nnodes) {
        if (strchr(req->nnodes, ':'))
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--nnodes '%s': zt-run starts a fixed number of machines, not torchrun's elastic "
                                "range MIN:MAX: give the number of machines, e.g. --nnodes 2", req->nnodes);
        if (!parse_count(req->nnodes, 1, MAX_NODES, &v))
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--nnodes '%s': expected the number of machines of the job, a whole number from 1 "
                                "to %d", req->nnodes, MAX_NODES);
        out->nnodes = (int32_t)v;
    }
    if (req->nproc_per_node) {
        const char *p = req->nproc_per_node;
        if (strcmp(p, "gpu") == 0 || strcmp(p, "cpu") == 0 || strcmp(p, "auto") == 0 || strcmp(p, "xpu") == 0)
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--nproc-per-node '%s': zt-run takes the number of ranks itself, not torchrun's "
                                "'%s': give it, e.g. --nproc-per-node 8 for 8 GPUs (nvidia-smi -L lists them)", p,
                                p);
        if (!parse_count(p, 1, MAX_LOCAL_RANKS, &v))
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--nproc-per-node '%s': expected the number of ranks to start on this machine, a "
                                "whole number from 1 to %d", p, MAX_LOCAL_RANKS);
        out->per_node = (int32_t)v;
    }
    if (req->node_rank) {
        if (!parse_count(req->node_rank, 0, MAX_NODES - 1, &v))
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--node-rank '%s': expected this machine's number in the job, a whole number from "
                                "0 (the machine of rank 0) to --nnodes - 1", req->node_rank);
        if (v >= out->nnodes)
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--node-rank %ld with --nnodes %d: the machines are numbered from 0 to %d (0 runs "
                                "rank 0, which the others meet at --master-addr); give each machine its own "
                                "number, or raise --nnodes", v, out->nnodes, out->nnodes - 1);
        out->node_rank = (int32_t)v;
    }
    if (req->master_port) {
        if (!parse_count(req->master_port, 1, 65535, &v))
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--master-port '%s' is not a TCP port (1 to 65535): give a free port on the "
                                "machine of rank 0, the same on every machine (torchrun's default is %d)",
                                req->master_port, DEFAULT_MASTER_PORT);
        out->master_port = (int)v;
    }
    if (req->master_addr) {
        if (!*req->master_addr)
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--master-addr is empty: give the address or host name of the machine of rank 0 "
                                "(--node-rank 0)");
        out->master_addr = req->master_addr;
    }
    if (out->nnodes > 1 && !out->master_addr)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "--nnodes %d needs --master-addr: the address or host name by which every machine "
                            "reaches the machine of rank 0 (--node-rank 0), the same on every machine",
                            out->nnodes);
    out->world_size = out->nnodes * out->per_node;
    return ZT_OK;
}

/* Appends " arg" to out[*len..cap), in single quotes when the shell would split or expand it. */
static void append_shell_word(char *out, size_t cap, size_t *len, const char *arg, int first)
{
    int plain = *arg != '\0';
    for (const char *c = arg; *c && plain; c++)
        plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                strchr("-_./=:,+@%", *c) != NULL;
    if (!first) zt_job_append(out, cap, len, " ");
    if (plain) {
        zt_job_append(out, cap, len, arg);
        return;
    }
    zt_job_append(out, cap, len, "'");
    for (const char *c = arg; *c; c++) {
        char one[2] = {*c, '\0'};
        zt_job_append(out, cap, len, *c == '\'' ? "'\\''" : one);
    }
    zt_job_append(out, cap, len, "'");
}

void zt_launch_command_text(int argc, char **argv, char *out, size_t cap)
{
    size_t len = 0;
    if (!cap) return;
    out[0] = '\0';
    append_shell_word(out, cap, &len, argc > 0 ? argv[0] : "zt-run", 1);
    char **rest = ranks_command(NULL, 0, argc, argv);
    for (int i = 0; rest && rest[i]; i++) append_shell_word(out, cap, &len, rest[i], 0);
    free(rest);
    if (len + 1 >= cap && cap > 4) snprintf(out + cap - 4, 4, "...");
}

/* CPU ranks on several machines: MPI connects only the processes its own launcher starts, so a
 * zt-run on each machine cannot join them. The message gives the commands that can, with this
 * command line in them. */
static zt_status several_cpu_nodes_error(const zt_launch_plan *plan, int argc, char **argv, zt_error *err)
{
    char command[2048];
    zt_launch_command_text(argc, argv, command, sizeof command);
    int cores = zt_online_cores(), pe = cores / plan->per_node > 0 ? cores / plan->per_node : 1;
    return zt_error_set(err, ZT_ERR_INVALID_ARG,
                        "--nnodes %d --nproc-per-node %d asks for CPU ranks on %d machines, which a zt-run on each "
                        "machine cannot start: CPU ranks talk through MPI, which connects only the processes its "
                        "own launcher starts. Start the whole job once, from one machine, with mpirun and a "
                        "hostfile HOSTS naming the %d machines, one line each ('node0 slots=%d'; ssh from that "
                        "machine to the others without a password):\n"
                        "    mpirun -np %d --hostfile HOSTS --map-by ppr:%d:node:PE=%d --bind-to core %s\n"
                        "or under Slurm:\n"
                        "    srun -N %d --ntasks-per-node %d --cpus-per-task %d --mpi=pmix %s\n"
                        "(PE and --cpus-per-task: each rank's share of a machine's cores, %d on this one; docs/distributed.md, "
                        "'CPU ranks on several machines'). For GPU ranks, which zt-run starts on each machine, "
                        "--set device=cuda",
                        plan->nnodes, plan->per_node, plan->nnodes, plan->nnodes, plan->per_node, plan->world_size,
                        plan->per_node, pe, command, plan->nnodes, plan->per_node, pe, command, pe);
}

zt_status zt_launch_local(const char *nproc_text, int argc, char **argv, zt_error *err)
{
    return zt_launch_local_mode(nproc_text, ZT_NPROC_AUTO, argc, argv, err);
}

zt_status zt_launch_local_mode(const char *nproc_text, int mode, int argc, char **argv, zt_error *err)
{
    zt_launch_request req = {.nproc = nproc_text};
    return zt_launch_start(&req, mode, argc, argv, err);
}

zt_status zt_launch_start(const zt_launch_request *req, int mode, int argc, char **argv, zt_error *err)
{
    zt_launch_plan plan;
    zt_status st = zt_launch_plan_make(req, &plan, err);
    if (st != ZT_OK) return st;
    int given_address = plan.master_addr || plan.master_port;
    if (plan.world_size == 1) {
        if (given_address)
            fprintf(stderr, "zt-run: note: --master-addr and --master-port have no effect here: the job is one "
                    "rank, in this process, which meets nobody\n");
        return ZT_OK;
    }
    char what[48]; /* the option as typed, for messages */
    snprintf(what, sizeof what, "%s %d", plan.form, plan.per_node);
    long nproc = plan.per_node;

    zt_launch launch;
    st = zt_launch_detect(&launch, err);
    if (st != ZT_OK) return st;
    if (launch.world_size > 1)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "%s starts the ranks itself, but this process already is rank %d of %d "
                            "(from %s): drop %s, or run zt-run %s outside the launcher", what, launch.rank,
                            launch.world_size, launch.launcher, plan.form, plan.form);
    int gpu = 0;
    st = choose_gpu_ranks(plan.form, nproc, mode, argc, argv, &gpu, err);
    if (st != ZT_OK) return st;
    if (gpu) {
        char exe[PATH_MAX];
        ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (len <= 0) return zt_error_set(err, ZT_ERR_IO, "%s: cannot find this program's own path "
                                          "(/proc/self/exe: %s)", plan.form, strerror(errno));
        exe[len] = '\0';
        node_ranks job = {.first = (long)plan.node_rank * plan.per_node, .count = nproc,
                          .world_size = plan.world_size, .addr = "127.0.0.1"};
        int port_holder = -1;
        if (given_address || plan.nnodes > 1) {
            /* Rank 0 listens on the port on every interface; the others connect to the address. */
            if (plan.master_addr) job.addr = plan.master_addr;
            job.port = plan.master_port ? plan.master_port : DEFAULT_MASTER_PORT;
        } else {
            job.port = reserve_local_port(&port_holder, err);
            if (job.port < 0) return err->status;
        }
        char *head[] = {exe};
        char **args = ranks_command(head, 1, argc, argv);
        if (!args) {
            if (port_holder >= 0) close(port_holder);
            return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory starting %ld ranks", nproc);
        }
        char job_dir[PATH_MAX];
        st = zt_job_dir_create(job_dir, sizeof job_dir, err);
        int code = st == ZT_OK ? supervise_ranks(exe, args, &job, job_dir) : 0;
        if (port_holder >= 0) close(port_holder);
        free(args);
        if (st != ZT_OK) return st;
        remove_job_dir(job_dir);
        fflush(NULL);
        exit(code);
    }
    if (plan.nnodes > 1) return several_cpu_nodes_error(&plan, argc, argv, err);
    char mpirun[PATH_MAX], backend[PATH_MAX], tried[3 * PATH_MAX + 16];
    if (!find_on_path("mpirun", mpirun, sizeof mpirun))
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "%s starts CPU ranks with Open MPI's mpirun, which is not on PATH: install "
                            "it (Debian/Ubuntu: apt-get install openmpi-bin), or start the ranks with your "
                            "launcher (mpirun -np %ld zt-run ..., srun -n %ld zt-run ...)", what, nproc, nproc);
    if (!env_value("ZT_COMM_MPI_LIBRARY") &&
        (!ZT_HAVE_MPI_BACKEND || !zt_module_find(ZT_COMM_MPI_FILE, backend, sizeof backend, tried, sizeof tried)))
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "%s starts CPU ranks that talk through MPI, but %s: install libopenmpi-dev "
                            "and rebuild zt, or run one process", what,
                            ZT_HAVE_MPI_BACKEND ? "zt's MPI backend libzt-comm-mpi.so is missing"
                                                : "zt was built without MPI");
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return zt_error_set(err, ZT_ERR_IO, "%s: cannot find this program's own path "
                                      "(/proc/self/exe: %s)", plan.form, strerror(errno));
    exe[len] = '\0';
    if (given_address)
        fprintf(stderr, "zt-run: note: --master-addr and --master-port have no effect on CPU ranks: mpirun "
                "starts and connects them on this machine\n");

    /* mpirun binds each rank to one core by default (np <= 2), which would leave every thread of
     * a rank's pool on that core: give each rank its share of this machine's cores instead. */
    int cores = zt_online_cores();
    char np[16], map_by[48];
    snprintf(np, sizeof np, "%ld", nproc);
    snprintf(map_by, sizeof map_by, "slot:PE=%ld", cores / nproc);
    char *head[16];
    int n = 0;
    head[n++] = mpirun;
    head[n++] = "-np";
    head[n++] = np;
    head[n++] = "--oversubscribe";
    if (nproc <= cores) {
        head[n++] = "--map-by";
        head[n++] = map_by;
        head[n++] = "--bind-to";
        head[n++] = "core";
    } else {
        head[n++] = "--bind-to";
        head[n++] = "none";
    }
    if (geteuid() == 0) head[n++] = "--allow-run-as-root"; /* containers often run as root */
    head[n++] = exe;
    char **args = ranks_command(head, n, argc, argv);
    if (!args) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory starting %ld ranks", nproc);
    char job_dir[PATH_MAX];
    st = zt_job_dir_create(job_dir, sizeof job_dir, err);
    if (st != ZT_OK) {
        free(args);
        return st;
    }
    int code = supervise_mpirun(mpirun, args, nproc, job_dir);
    remove_job_dir(job_dir);
    free(args);
    fflush(NULL);
    exit(code);
}
