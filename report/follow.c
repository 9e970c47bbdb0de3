/* zt-report --follow RUN_DIR (report.h): a live view of a run from its metrics files, redrawn every
 * interval. The files are tailed: each refresh reads what was appended since the last one and keeps a
 * line still being written (no line end yet) for the next. On a terminal the view is redrawn in place
 * with two ANSI sequences (clear, home); on a pipe or file it is one line per refresh that brought new
 * records.
 *
 * When the run is over: zt-run holds metrics.jsonl open for writing from its first step to its end,
 * so the run is live while some process has that file open for writing (found through /proc/PID/fd
 * and /proc/PID/fdinfo) and over once none has. Where /proc cannot tell (processes of other users
 * hide their files, and the writer was never seen), a run is over when its last step's record is
 * there and no file has grown for 3 s. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "report.h"

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* One tailed metrics file. */
typedef struct tail {
    report_rank rank;
    off_t offset;        /* bytes consumed: whole lines */
    long line_no;
    zt_buf partial;      /* the start of a line still being written */
} tail;

typedef struct follow {
    const report_follow_options *opt;
    int n_tails;
    tail *tails;         /* by rank; tails[0] is metrics.jsonl */
    double last_growth;  /* when a file last grew (zt_now_s) */
    double last_record;  /* when the newest record was read */
    int writer_seen;
    pid_t writer;        /* the process that has metrics.jsonl open for writing, 0 when none is known */
    long printed_lines;  /* lines read at the last printed line (pipe output); -1 before the first */
} follow;

/* ---- tailing --------------------------------------------------------------------------------- */

static int compare_tails(const void *a, const void *b)
{
    return ((const tail *)a)->rank.rank - ((const tail *)b)->rank.rank;
}

/* Rank files appear as ranks reach their first step: looked for at every refresh. */
static void find_files(follow *f)
{
    DIR *d = opendir(f->opt->dir);
    if (!d) return;
    struct dirent *e;
    int added = 0;
    while ((e = readdir(d)) != NULL) {
        int rank = report_metrics_file_rank(e->d_name);
        if (rank < 0) continue;
        int known = 0;
        for (int i = 0; i < f->n_tails; i++) known |= f->tails[i].rank.rank == rank;
        if (known) continue;
        f->tails = report_xrealloc(f->tails, (size_t)(f->n_tails + 1) * sizeof *f->tails, "the followed files");
        tail *t = &f->tails[f->n_tails++];
        memset(t, 0, sizeof *t);
        t->rank.rank = rank;
        t->rank.path = report_format("%s/%s", f->opt->dir, e->d_name);
        added = 1;
    }
    closedir(d);
    if (added) qsort(f->tails, (size_t)f->n_tails, sizeof *f->tails, compare_tails);
}

static void tail_reset(tail *t)
{
    char *path = t->rank.path;
    int rank = t->rank.rank;
    t->rank.path = NULL;
    report_rank_free(&t->rank);
    t->rank.path = path;
    t->rank.rank = rank;
    t->offset = 0;
    t->line_no = 0;
    t->partial.len = 0;
}

/* Read what was appended; complete lines become records. A file that shrank was started afresh (a new
 * run in the same directory, or a resumed one cutting back its records): it is read again from the
 * start. */
static zt_status tail_read(follow *f, tail *t, zt_error *err)
{
    int fd = open(t->rank.path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ZT_OK; /* not there (yet, or any more): nothing new */
    struct stat sb;
    if (fstat(fd, &sb) == 0 && sb.st_size < t->offset + (off_t)t->partial.len) tail_reset(t);
    if (lseek(fd, t->offset + (off_t)t->partial.len, SEEK_SET) < 0) {
        close(fd);
        return zt_error_set(err, ZT_ERR_IO, "cannot read %s: %s", t->rank.path, strerror(errno));
    }
    char chunk[65536];
    ssize_t n;
    zt_status st = ZT_OK;
    while (st == ZT_OK && (n = read(fd, chunk, sizeof chunk)) > 0) {
        f->last_growth = zt_now_s();
        report_buf_add(&t->partial, chunk, (size_t)n);
        size_t start = 0;
        char *nl;
        while (st == ZT_OK && (nl = memchr(t->partial.data + start, '\n', t->partial.len - start)) != NULL) {
            size_t end = (size_t)(nl - t->partial.data);
            st = report_rank_add_line(&t->rank, t->partial.data + start, end - start, ++t->line_no, err);
            if (st != ZT_OK)
                zt_error_append(err, "\nonly the last line of a metrics file may be unfinished; this one was "
                                "changed by something else");
            f->last_record = zt_now_s();
            t->offset += (off_t)(end + 1 - start);
            start = end + 1;
        }
        memmove(t->partial.data, t->partial.data + start, t->partial.len - start);
        t->partial.len -= start;
    }
    close(fd);
    return st;
}

/* ---- is the run still going? ------------------------------------------------------------------- */

enum { WRITER_NONE, WRITER_ALIVE, WRITER_UNKNOWN };

/* 1 when fd N of process pid is `target` opened for writing. */
static int writes_file(const char *pid, const char *fd, const struct stat *target)
{
    char path[600];
    struct stat sb;
    snprintf(path, sizeof path, "/proc/%s/fd/%s", pid, fd);
    if (stat(path, &sb) != 0 || sb.st_dev != target->st_dev || sb.st_ino != target->st_ino) return 0;
    snprintf(path, sizeof path, "/proc/%s/fdinfo/%s", pid, fd);
    FILE *info = fopen(path, "r");
    if (!info) return 0;
    char line[128];
    int writing = 0;
    while (fgets(line, sizeof line, info))
        if (strncmp(line, "flags:", 6) == 0) writing = (strtol(line + 6, NULL, 8) & O_ACCMODE) != O_RDONLY;
    fclose(info);
    return writing;
}

static int process_writes(const char *pid, const struct stat *target, int *hidden)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/fd", pid);
    DIR *d = opendir(path);
    if (!d) {
        if (errno == EACCES) (*hidden)++;
        return 0;
    }
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)) != NULL)
        if (isdigit((unsigned char)e->d_name[0])) found = writes_file(pid, e->d_name, target);
    closedir(d);
    return found;
}

static int writer_state(follow *f)
{
    struct stat target;
    if (stat(f->tails[0].rank.path, &target) != 0) return WRITER_UNKNOWN;
    char pid[32];
    if (f->writer) { /* the one found last time, first */
        snprintf(pid, sizeof pid, "%d", (int)f->writer);
        int hidden = 0;
        if (process_writes(pid, &target, &hidden)) return WRITER_ALIVE;
        f->writer = 0;
    }
    DIR *proc = opendir("/proc");
    if (!proc) return WRITER_UNKNOWN;
    struct dirent *e;
    int hidden = 0, found = 0;
    while (!found && (e = readdir(proc)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0]) || atoi(e->d_name) == (int)getpid()) continue;
        if (process_writes(e->d_name, &target, &hidden)) {
            found = 1;
            f->writer = (pid_t)atoi(e->d_name);
        }
    }
    closedir(proc);
    if (found) {
        f->writer_seen = 1;
        return WRITER_ALIVE;
    }
    return hidden && !f->writer_seen ? WRITER_UNKNOWN : WRITER_NONE;
}

/* ---- the view ---------------------------------------------------------------------------------- */

static const report_step *last_step(const tail *t)
{
    return t->rank.n_steps ? &t->rank.steps[t->rank.n_steps - 1] : NULL;
}

static void status_line(const follow *f, zt_buf *b, int terminal)
{
    const report_step *s = last_step(&f->tails[0]);
    if (!s) {
        report_buf_puts(b, "no step recorded yet");
        return;
    }
    double since = zt_now_s() - f->last_record;
    double eta = isfinite(s->eta_s) ? fmax(0, s->eta_s - since) : NAN;
    char rate[32], eta_text[32], elapsed[32];
    report_format_rate(s->tokens_per_s, rate, sizeof rate);
    zt_format_duration(eta, eta_text, sizeof eta_text);
    zt_format_duration(s->elapsed_s, elapsed, sizeof elapsed);
    report_buf_printf(b, "step %lld/%lld", (long long)s->step, (long long)s->total_steps);
    if (s->total_steps > 0) report_buf_printf(b, " (%.0f%%)", 100.0 * (double)s->step / (double)s->total_steps);
    report_buf_printf(b, "%sloss %.4f", terminal ? "   " : " | ", s->loss);
    const report_rank *r0 = &f->tails[0].rank;
    if (r0->n_evals)
        report_buf_printf(b, "%seval loss %.4f (step %lld)", terminal ? "   " : " | ",
                          r0->evals[r0->n_evals - 1].eval_loss, (long long)r0->evals[r0->n_evals - 1].step);
    if (terminal) report_buf_printf(b, "   lr %.3e   grad_norm %.4g", s->lr, s->grad_norm);
    if (isfinite(s->loss_scale)) report_buf_printf(b, "%sloss scale %.6g", terminal ? "   " : " | ", s->loss_scale);
    if (s->skipped) report_buf_puts(b, " (update skipped)");
    report_buf_printf(b, "%s%s tok/s%selapsed %s%sETA %s", terminal ? "\n" : " | ", rate, terminal ? "   " : " | ",
                      elapsed, terminal ? "   " : " | ", eta_text);
    if (terminal) report_buf_printf(b, "   step %.3f s   last record %.0f s ago", s->step_s, since);
}

/* Pools that hold memory on some rank at its newest record; "total" is shown too. */
static void memory_view(const follow *f, zt_buf *b, int terminal)
{
    int used[REPORT_SPACES][REPORT_MAX_POOLS] = {{0}};
    int any = 0;
    for (int i = 0; i < f->n_tails; i++) {
        const report_step *s = last_step(&f->tails[i]);
        for (int space = 0; s && space < REPORT_SPACES; space++)
            for (int p = 0; s->has_mem[space] && p < f->tails[i].rank.pools.n; p++)
                if (s->mem_peak[space][p] > 0) used[space][p] = any = 1;
    }
    if (!any) return;
    const report_pools *pools = &f->tails[0].rank.pools; /* every rank writes the pools in one order */
    if (terminal) {
        report_buf_printf(b, "\n\nmemory (per-step peak)");
        for (int p = 0; p < pools->n; p++)
            if (used[0][p] || used[1][p]) report_buf_printf(b, " %11s", pools->names[p]);
        report_buf_printf(b, " %11s", "total");
    } else {
        report_buf_puts(b, " | mem");
    }
    for (int i = 0; i < f->n_tails; i++) {
        const report_step *s = last_step(&f->tails[i]);
        for (int space = REPORT_DEVICE; s && space >= REPORT_HOST; space--) {
            if (!s->has_mem[space]) continue;
            char text[32];
            report_format_bytes(s->mem_total_peak[space], text, sizeof text);
            if (!terminal) {
                report_buf_printf(b, " r%d %s %s", f->tails[i].rank.rank, report_space_name(space), text);
                continue;
            }
            report_buf_printf(b, "\nrank %-3d %-13s", f->tails[i].rank.rank, report_space_name(space));
            for (int p = 0; p < pools->n && p < f->tails[i].rank.pools.n; p++) {
                if (!used[0][p] && !used[1][p]) continue;
                char pool[32];
                report_format_bytes(s->mem_peak[space][p], pool, sizeof pool);
                report_buf_printf(b, " %11s", pool);
            }
            report_buf_printf(b, " %11s", text);
        }
    }
}

static void comm_view(const follow *f, zt_buf *b, int terminal)
{
    int any = 0;
    for (int i = 0; i < f->n_tails; i++) {
        const report_step *s = last_step(&f->tails[i]);
        if (!s || !s->has_comm) continue;
        if (!any) report_buf_puts(b, terminal ? "\n\ncommunication:" : " | comm");
        double share = isfinite(s->comm_share) ? s->comm_share : s->comm_time_s / s->step_s;
        if (terminal)
            report_buf_printf(b, "%s rank %d %.1f%% of the step (%.3f s)", any ? "," : "", f->tails[i].rank.rank,
                              100 * share, s->comm_time_s);
        else
            report_buf_printf(b, " r%d %.1f%%", f->tails[i].rank.rank, 100 * share);
        any = 1;
    }
    if (!any && terminal) report_buf_puts(b, "\n\ncommunication: no communication data in the records");
}

static void render(follow *f, int terminal)
{
    zt_buf b = {0};
    if (terminal) {
        report_buf_printf(&b, "\033[H\033[2Jzt-report --follow %s   (every %g s; Ctrl-C to stop)\n\n", f->opt->dir,
                          f->opt->interval_s);
    } else {
        long lines = 0;
        for (int i = 0; i < f->n_tails; i++) lines += f->tails[i].line_no;
        if (lines == f->printed_lines) return; /* nothing new: a pipe gets no repeated line */
        f->printed_lines = lines;
    }
    status_line(f, &b, terminal);
    memory_view(f, &b, terminal);
    comm_view(f, &b, terminal);
    report_buf_puts(&b, "\n");
    fwrite(b.data, 1, b.len, stdout);
    fflush(stdout);
    zt_buf_free(&b);
}

/* ---- the loop ---------------------------------------------------------------------------------- */

static void free_follow(follow *f)
{
    for (int i = 0; i < f->n_tails; i++) {
        report_rank_free(&f->tails[i].rank);
        zt_buf_free(&f->tails[i].partial);
    }
    free(f->tails);
}

static int finish(follow *f, const char *why)
{
    const report_step *s = last_step(&f->tails[0]);
    int done = s && s->total_steps > 0 && s->step >= s->total_steps;
    for (int i = 0; i < f->n_tails; i++)
        if (f->tails[i].partial.len)
            report_note("%s:%ld: a torn last line (%zu bytes) left out: the run stopped while writing it",
                        f->tails[i].rank.path, f->tails[i].line_no + 1, f->tails[i].partial.len);
    if (done)
        printf("zt-report: the run finished: step %lld/%lld (%s)\n", (long long)s->step, (long long)s->total_steps,
               why);
    else if (s)
        printf("zt-report: the run stopped at step %lld of %lld (%s)\n", (long long)s->step,
               (long long)s->total_steps, why);
    else
        printf("zt-report: the run stopped before its first step (%s)\n", why);
    fflush(stdout);
    free_follow(f);
    return done ? 0 : 3;
}

int report_follow(const report_follow_options *opt)
{
    struct stat sb;
    int found = stat(opt->dir, &sb) == 0;
    if (!found || !S_ISDIR(sb.st_mode)) {
        report_fail("run directory %s: %s; give the output_dir of a zt-run run", opt->dir,
                    found ? "not a directory" : strerror(errno));
        return 1;
    }
    follow f = {.opt = opt, .printed_lines = -1};
    find_files(&f);
    if (f.n_tails == 0 || f.tails[0].rank.rank != 0) {
        report_fail("%s holds no metrics.jsonl: zt-run writes it from the start of training; give the run's "
                    "output_dir, and start --follow once the run has begun", opt->dir);
        free_follow(&f);
        return 1;
    }
    int terminal = opt->ansi < 0 ? isatty(STDOUT_FILENO) : opt->ansi;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    f.last_growth = f.last_record = zt_now_s();
    for (;;) {
        /* Whether a writer is there is asked before the files are read: a run that writes its last
         * record and closes in between is then read to its end before it is found gone. */
        int writer = writer_state(&f);
        find_files(&f);
        zt_error err;
        for (int i = 0; i < f.n_tails; i++)
            if (tail_read(&f, &f.tails[i], &err) != ZT_OK) {
                report_fail("%s", err.msg);
                free_follow(&f);
                return 1;
            }
        render(&f, terminal);
        if (writer == WRITER_NONE)
            return finish(&f, f.writer_seen ? "its process closed metrics.jsonl"
                                            : "no process has metrics.jsonl open for writing");
        const report_step *s = last_step(&f.tails[0]);
        if (writer == WRITER_UNKNOWN && s && s->total_steps > 0 && s->step >= s->total_steps &&
            zt_now_s() - f.last_growth >= 3.0)
            return finish(&f, "its last step is recorded and the files have not grown for 3 s");
        struct timespec ts = {(time_t)opt->interval_s, (long)(fmod(opt->interval_s, 1.0) * 1e9)};
        nanosleep(&ts, NULL);
        if (interrupted) {
            free_follow(&f);
            return 130;
        }
    }
}
