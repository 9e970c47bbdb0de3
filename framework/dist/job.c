/* The job directory of `zt-run --nproc`: the rank's side (registering, how it ended, what its peers
 * are doing) and the launcher's (creating it, reading what the ranks wrote). See job.h for the files
 * and why they exist. */
#define _GNU_SOURCE /* mkdtemp */
#include "dist/job.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- async-signal-safe text --------------------------------------------------------------------- */

void zt_job_append(char *out, size_t cap, size_t *len, const char *text)
{
    if (!cap) return;
    size_t n = *len;
    for (const char *c = text; *c && n + 1 < cap; c++) out[n++] = *c;
    out[n] = '\0';
    *len = n;
}

void zt_job_append_int(char *out, size_t cap, size_t *len, long long value)
{
    char digits[24];
    int n = 0;
    unsigned long long v = value < 0 ? 0ull - (unsigned long long)value : (unsigned long long)value;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n < (int)sizeof digits - 2);
    if (value < 0) digits[n++] = '-';
    char text[24];
    for (int i = 0; i < n; i++) text[i] = digits[n - 1 - i];
    text[n] = '\0';
    zt_job_append(out, cap, len, text);
}

/* The next whitespace-separated unsigned number of text at *p; 0 when there is none. */
static int next_number(const char **p, unsigned long long *out)
{
    const char *c = *p;
    while (*c == ' ' || *c == '\n' || *c == '\t') c++;
    if (*c < '0' || *c > '9') return 0;
    unsigned long long v = 0;
    while (*c >= '0' && *c <= '9') v = v * 10 + (unsigned long long)(*c++ - '0');
    *out = v;
    *p = c;
    return 1;
}

/* The next whitespace-separated word of text at *p into word[cap]; 0 when there is none. */
static int next_word(const char **p, char *word, size_t cap)
{
    const char *c = *p;
    while (*c == ' ' || *c == '\n' || *c == '\t') c++;
    size_t n = 0;
    while (*c && *c != ' ' && *c != '\n' && *c != '\t') {
        if (n + 1 < cap) word[n++] = *c;
        c++;
    }
    word[n] = '\0';
    *p = c;
    return n > 0;
}

/* Reads up to cap - 1 bytes of path into buf, NUL-terminated; the length, or -1. */
static ssize_t read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t got = read(fd, buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += (size_t)got;
    }
    close(fd);
    buf[n] = '\0';
    return (ssize_t)n;
}

/* Writes text to path through path.tmp and a rename, so a reader sees all of it or none. */
static int write_small(const char *path, const char *text)
{
    char tmp[PATH_MAX];
    size_t len = 0;
    zt_job_append(tmp, sizeof tmp, &len, path);
    zt_job_append(tmp, sizeof tmp, &len, ".tmp");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t n = strlen(text), done = 0;
    while (done < n) {
        ssize_t put = write(fd, text + done, n - done);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) break;
        done += (size_t)put;
    }
    close(fd);
    if (done < n || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* dir/rank-R<suffix> into out[cap]. */
static void rank_path(const char *dir, int32_t rank, const char *suffix, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    zt_job_append(out, cap, &len, dir);
    zt_job_append(out, cap, &len, "/rank-");
    zt_job_append_int(out, cap, &len, rank);
    zt_job_append(out, cap, &len, suffix);
}

/* ---- processes ---------------------------------------------------------------------------------- */

char zt_job_process_state(pid_t pid, unsigned long long start)
{
    if (pid <= 0) return 0;
    char path[64], stat[1024];
    size_t len = 0;
    path[0] = '\0';
    zt_job_append(path, sizeof path, &len, "/proc/");
    zt_job_append_int(path, sizeof path, &len, pid);
    zt_job_append(path, sizeof path, &len, "/stat");
    if (read_small(path, stat, sizeof stat) <= 0) return 0;
    /* "pid (comm) S ppid ...": the command may hold spaces and parentheses, so from the last ')'.
     * After it come field 3 (the state) and, 19 fields later, field 22 (the start time). */
    const char *c = strrchr(stat, ')');
    if (!c) return 0;
    c++;
    char state[8];
    if (!next_word(&c, state, sizeof state)) return 0;
    unsigned long long value = 0;
    for (int field = 4; field <= 22; field++) {
        char word[32];
        if (!next_word(&c, word, sizeof word)) return 0;
        if (field == 22) {
            const char *w = word;
            if (!next_number(&w, &value)) return 0;
        }
    }
    if (start && value != start) return 0; /* another process has the pid now */
    return state[0];
}

static unsigned long long own_start_time(void)
{
    char path[64], stat[1024];
    size_t len = 0;
    path[0] = '\0';
    zt_job_append(path, sizeof path, &len, "/proc/");
    zt_job_append_int(path, sizeof path, &len, getpid());
    zt_job_append(path, sizeof path, &len, "/stat");
    if (read_small(path, stat, sizeof stat) <= 0) return 0;
    const char *c = strrchr(stat, ')');
    if (!c) return 0;
    c++;
    char word[32];
    unsigned long long value = 0;
    for (int field = 3; field <= 22; field++)
        if (!next_word(&c, word, sizeof word)) return 0;
    const char *w = word;
    return next_number(&w, &value) ? value : 0;
}

/* ---- the launcher's side ------------------------------------------------------------------------ */

zt_status zt_job_dir_create(char *dir, size_t cap, zt_error *err)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    if (snprintf(dir, cap, "%s/zt-nproc-XXXXXX", tmp) >= (int)cap)
        return zt_error_set(err, ZT_ERR_CONFIG, "--nproc: TMPDIR '%s' is too long a path", tmp);
    if (!mkdtemp(dir))
        return zt_error_set(err, ZT_ERR_IO,
                            "--nproc: cannot create the job's directory in %s (%s), through which zt-run and "
                            "its ranks tell each other how they are doing: set TMPDIR to a writable directory",
                            tmp, strerror(errno));
    return ZT_OK;
}

int zt_job_dir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    char path[PATH_MAX];
    int kept = 0;
    size_t suffix = strlen(ZT_JOB_FLIGHT_SUFFIX);
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        size_t len = strlen(e->d_name);
        if (len > suffix && strcmp(e->d_name + len - suffix, ZT_JOB_FLIGHT_SUFFIX) == 0) {
            kept++;
            continue;
        }
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path) unlink(path);
    }
    closedir(d);
    if (!kept) rmdir(dir);
    return kept;
}

void zt_job_read_rank(const char *dir, int32_t rank, zt_job_rank_info *out)
{
    memset(out, 0, sizeof *out);
    char path[PATH_MAX], text[256];
    rank_path(dir, rank, "", path, sizeof path);
    unsigned long long pid = 0, start = 0, timeout_ms = 0;
    const char *c = text;
    if (read_small(path, text, sizeof text) > 0 && next_number(&c, &pid) && next_number(&c, &start) &&
        next_number(&c, &timeout_ms)) {
        out->registered = 1;
        out->pid = (pid_t)pid;
        out->start = start;
        out->timeout_s = (double)timeout_ms / 1000.0;
    }
    rank_path(dir, rank, ".ready", path, sizeof path);
    out->ready = access(path, F_OK) == 0;
    rank_path(dir, rank, ".end", path, sizeof path);
    unsigned long long status = 0, at_ms = 0;
    c = text;
    if (read_small(path, text, sizeof text) > 0 && next_word(&c, out->end_how, sizeof out->end_how) &&
        next_number(&c, &status) && next_number(&c, &at_ms)) {
        out->ended = 1;
        out->end_status = (int)status;
        out->end_at = (double)at_ms / 1000.0;
    }
}

void zt_job_record_interrupt(const char *dir, int sig, int count)
{
    char path[PATH_MAX], text[48];
    size_t len = 0;
    path[0] = text[0] = '\0';
    zt_job_append(path, sizeof path, &len, dir);
    zt_job_append(path, sizeof path, &len, "/interrupt");
    len = 0;
    zt_job_append_int(text, sizeof text, &len, sig);
    zt_job_append(text, sizeof text, &len, " ");
    zt_job_append_int(text, sizeof text, &len, count);
    zt_job_append(text, sizeof text, &len, "\n");
    write_small(path, text);
}

void zt_job_record_failure(const char *dir, const char *why)
{
    char path[PATH_MAX];
    size_t len = 0;
    path[0] = '\0';
    zt_job_append(path, sizeof path, &len, dir);
    zt_job_append(path, sizeof path, &len, "/failure");
    write_small(path, why);
}

/* ---- the rank's side ---------------------------------------------------------------------------- */

/* Set once, before any signal handler that reads them is installed. */
static char g_dir[PATH_MAX - 32];
static int g_attached, g_under_mpirun, g_warned;
static int32_t g_rank = -1, g_world;

void zt_job_attach(int32_t rank, int32_t world_size, const char *launcher)
{
    const char *dir = getenv(ZT_JOB_DIR_ENV);
    g_rank = rank;
    g_world = world_size;
    if (!dir || !*dir || strlen(dir) >= sizeof g_dir || world_size < 2) return;
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    g_under_mpirun = launcher && strcmp(launcher, "mpirun") == 0;
    g_attached = 1;
}

int zt_job_attached(void) { return g_attached; }
const char *zt_job_dir(void) { return g_attached ? g_dir : ""; }
int32_t zt_job_rank(void) { return g_rank; }

static void warn_once(const char *what)
{
    if (g_warned) return;
    g_warned = 1;
    fprintf(stderr, "zt[rank %d] warning: cannot write %s in %s (%s=%s): %s; zt-run will know less of how "
            "this rank is doing\n", (int)g_rank, what, g_dir, ZT_JOB_DIR_ENV, g_dir, strerror(errno));
}

/* A rank that exits without saying how (a test program, an exit() deep inside a library) still
 * tells zt-run; one that said it already keeps what it said. */
static void note_exit(int status, void *arg)
{
    (void)arg;
    char path[PATH_MAX];
    rank_path(g_dir, g_rank, ".end", path, sizeof path);
    if (access(path, F_OK) != 0) zt_job_note_end("exit", status);
}

void zt_job_register(double timeout_s)
{
    if (!g_attached) return;
    static int registered;
    if (!registered++) on_exit(note_exit, NULL);
    char path[PATH_MAX], text[96];
    rank_path(g_dir, g_rank, "", path, sizeof path);
    size_t len = 0;
    text[0] = '\0';
    zt_job_append_int(text, sizeof text, &len, getpid());
    zt_job_append(text, sizeof text, &len, " ");
    zt_job_append_int(text, sizeof text, &len, (long long)own_start_time());
    zt_job_append(text, sizeof text, &len, " ");
    zt_job_append_int(text, sizeof text, &len, timeout_s > 0 ? (long long)(timeout_s * 1000.0) : 0);
    zt_job_append(text, sizeof text, &len, "\n");
    if (write_small(path, text) != 0) warn_once("rank-N");
}

void zt_job_set_ready(int ready)
{
    if (!g_attached) return;
    char path[PATH_MAX];
    rank_path(g_dir, g_rank, ".ready", path, sizeof path);
    if (!ready) {
        unlink(path);
        return;
    }
    if (write_small(path, "1\n") != 0) warn_once("rank-N.ready");
}

void zt_job_note_end(const char *how, int status)
{
    if (!g_attached) return;
    char path[PATH_MAX], text[96];
    rank_path(g_dir, g_rank, ".end", path, sizeof path);
    /* Ended by the launcher after it said how it ends (an error, then the shutdown barrier): that stays. */
    if (strcmp(how, "terminated") == 0 && access(path, F_OK) == 0) return;
    size_t len = 0;
    text[0] = '\0';
    zt_job_append(text, sizeof text, &len, how);
    zt_job_append(text, sizeof text, &len, " ");
    zt_job_append_int(text, sizeof text, &len, status);
    zt_job_append(text, sizeof text, &len, " ");
    zt_job_append_int(text, sizeof text, &len, (long long)(monotonic_s() * 1000.0));
    zt_job_append(text, sizeof text, &len, "\n");
    write_small(path, text);
}

int zt_job_exit_status(int status)
{
    if (!g_attached || !g_under_mpirun || status != 130) return status;
    char path[PATH_MAX], text[96];
    rank_path(g_dir, g_rank, ".end", path, sizeof path);
    const char *c = text;
    char how[16];
    unsigned long long noted = 0;
    /* Only when zt-run can read the 130 back. */
    if (read_small(path, text, sizeof text) > 0 && next_word(&c, how, sizeof how) && next_number(&c, &noted) &&
        noted == 130)
        return 0;
    return status;
}

/* Describes peer `rank`'s trouble into out, returning 1, or returns 0 when it is fine (running, or
 * ended normally, or ended by the launcher like this one). */
static int describe_peer(int32_t rank, char *out, size_t cap, size_t *len)
{
    zt_job_rank_info r;
    zt_job_read_rank(g_dir, rank, &r);
    if (!r.registered) return 0;
    char state = zt_job_process_state(r.pid, r.start);
    const char *what = NULL;
    if (r.ended) {
        /* A rank that has said how it ends is judged by that, not by what its process does while it
         * exits: a sanitizer's leak check at exit, for one, holds it in a tracing stop ('t'). */
        if (strcmp(r.end_how, "aborted") == 0)
            what = "ended the job: its watchdog timed out (its message says waiting for what)";
        else if (strcmp(r.end_how, "exit") == 0 && r.end_status != 0 && r.end_status != 130)
            what = "stopped with an error (its message says which)";
    } else if (state == 'T' || state == 't') {
        what = "is stopped (SIGSTOP, Ctrl-Z in its terminal, or a debugger)";
    } else if (state == 0 || state == 'Z' || state == 'X') {
        what = "has died (killed by a signal: the launcher's message says which)";
    }
    if (!what) return 0;
    zt_job_append(out, cap, len, "rank ");
    zt_job_append_int(out, cap, len, rank);
    zt_job_append(out, cap, len, " (pid ");
    zt_job_append_int(out, cap, len, r.pid);
    zt_job_append(out, cap, len, ") ");
    zt_job_append(out, cap, len, what);
    return 1;
}

int zt_job_describe_peers(char *out, size_t cap, size_t *len)
{
    if (!g_attached) return 0;
    char path[PATH_MAX], why[512];
    size_t plen = 0;
    path[0] = '\0';
    zt_job_append(path, sizeof path, &plen, g_dir);
    zt_job_append(path, sizeof path, &plen, "/failure");
    if (read_small(path, why, sizeof why) > 0) { /* zt-run ended the job and said why */
        zt_job_append(out, cap, len, why);
        return 1;
    }
    int found = 0;
    for (int32_t r = 0; r < g_world; r++) {
        if (r == g_rank) continue;
        size_t before = *len;
        if (found) zt_job_append(out, cap, len, "; ");
        if (describe_peer(r, out, cap, len)) {
            found++;
        } else {
            *len = before;
            if (cap) out[before] = '\0';
        }
    }
    return found;
}

int zt_job_interrupts(void)
{
    if (!g_attached) return 0;
    char path[PATH_MAX], text[48];
    size_t plen = 0;
    path[0] = '\0';
    zt_job_append(path, sizeof path, &plen, g_dir);
    zt_job_append(path, sizeof path, &plen, "/interrupt");
    unsigned long long sig = 0, count = 0;
    const char *c = text;
    if (read_small(path, text, sizeof text) <= 0 || !next_number(&c, &sig) || !next_number(&c, &count)) return 0;
    return (int)count;
}

int zt_job_sigterm_ends_job(void)
{
    if (!g_attached) return 0;
    char scratch[1024];
    size_t len = 0;
    scratch[0] = '\0';
    if (zt_job_describe_peers(scratch, sizeof scratch, &len) > 0) return 1;
    return zt_job_interrupts() == 0;
}
