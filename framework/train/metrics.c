/* metrics.jsonl and the per-step log line (metrics.h). */
#define _GNU_SOURCE /* open_memstream */
#include "train/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "base/json.h"
#include "base/log.h"
#include "host/runtime.h"
#include "state/safetensors.h"

struct zt_metrics {
    int fd;     /* O_APPEND: every record is one write() at the end */
    char *path;
    off_t size; /* bytes of complete records: where a failed write is cut back to */
};

/* ---- continuing the file of an interrupted run ------------------------------------------------ */

/* The "step" of a metrics record, or -1 when the line is not one (metrics.h: every record starts
 * with "step"). */
static int64_t record_step(const char *line, size_t len, const char *origin)
{
    zt_json j;
    zt_error err;
    if (zt_json_parse(line, len, origin, &j, &err) != ZT_OK) return -1;
    int64_t step = -1;
    if (j.n_tok > 0 && j.tok[0].type == ZT_JSON_OBJECT) {
        int v = zt_json_object_get(&j, 0, "step");
        if (v >= 0 && zt_json_is_number(&j, v)) step = (int64_t)zt_json_get_number(&j, v);
    }
    zt_json_free(&j);
    return step;
}

/* Every record this file writes starts so; a last line that does and does not parse is one of ours
 * cut short. */
#define RECORD_START "{\"step\":"

/* What resuming finds in the file, line by line. */
typedef struct metrics_scan {
    off_t kept_end;           /* end of the last line kept (a record of a step <= the checkpoint's) */
    int kept_lacks_newline;   /* that line is a whole record whose line end was never written */
    int64_t dropped;          /* records of steps after the checkpoint's */
    int out_of_order;         /* a kept record comes after a dropped one: the kept ones are no prefix */
    long torn_line;           /* line number of a torn last line; 0: none */
    size_t torn_bytes;
} metrics_scan;

typedef enum { LINE_KEEP, LINE_DROP, LINE_TORN } line_fate;

/* The fate of one line, or an error: a line that is not a record is someone else's, unless it is
 * the last one and torn (no line end, or the start of a record that does not parse): zt writes
 * each record with one write() and stops at the first failure, so only the last line can be cut
 * short (a full disk, a crash, a power cut). */
static zt_status line_fate_of(const char *path, long line_no, const char *line, size_t len, int last,
                              int64_t last_step, line_fate *fate, zt_error *err)
{
    char origin[64];
    snprintf(origin, sizeof origin, "line %ld", line_no);
    int64_t step = record_step(line, len, origin);
    if (step >= 0) {
        *fate = step <= last_step ? LINE_KEEP : LINE_DROP;
        return ZT_OK;
    }
    int has_newline = line[len - 1] == '\n';
    if (last && (!has_newline || strncmp(line, RECORD_START, strlen(RECORD_START)) == 0)) {
        *fate = LINE_TORN;
        return ZT_OK;
    }
    return zt_error_set(err, ZT_ERR_FORMAT,
                        "%s:%ld is not a metrics record (a JSON object starting with \"step\"); the file "
                        "was changed by something else: move it away to start a new one",
                        path, line_no);
}

/* Reads `in` from the start, deciding every line's fate; with `out` open, also
 * copies the kept lines into it (each with its line end). */
static zt_status scan_lines(FILE *in, const char *path, int64_t last_step, metrics_scan *s, zt_atomic_file *out,
                            zt_error *err)
{
    memset(s, 0, sizeof *s);
    char *line = NULL, *next = NULL;
    size_t cap = 0, next_cap = 0;
    ssize_t len = getline(&line, &cap, in);
    off_t offset = 0;
    long line_no = 0;
    zt_status st = ZT_OK;
    while (st == ZT_OK && len > 0) {
        ssize_t next_len = getline(&next, &next_cap, in); /* one line ahead: is this the last? */
        line_no++;
        line_fate fate;
        st = line_fate_of(path, line_no, line, (size_t)len, next_len <= 0, last_step, &fate, err);
        if (st != ZT_OK) break;
        offset += len;
        if (fate == LINE_KEEP) {
            if (s->dropped) s->out_of_order = 1;
            s->kept_end = offset;
            s->kept_lacks_newline = line[len - 1] != '\n';
            if (out) st = zt_atomic_file_write(out, line, (size_t)len, err);
            if (st == ZT_OK && out && s->kept_lacks_newline) st = zt_atomic_file_write(out, "\n", 1, err);
        } else if (fate == LINE_DROP) {
            s->dropped++;
        } else {
            s->torn_line = line_no;
            s->torn_bytes = (size_t)len;
        }
        char *swap = line;
        line = next;
        next = swap;
        size_t swap_cap = cap;
        cap = next_cap;
        next_cap = swap_cap;
        len = next_len;
    }
    if (st == ZT_OK && ferror(in))
        st = zt_error_set(err, ZT_ERR_IO, "cannot read %s to continue it: %s", path, strerror(errno));
    free(line);
    free(next);
    return st;
}

/* Cut the file back to its kept prefix in place: one ftruncate, which needs no free space (the disk
 * may still be nearly full after the failure that stopped the last session) and never touches a
 * byte before the cut. */
static zt_status cut_in_place(const char *path, const metrics_scan *s, zt_error *err)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) return zt_error_set(err, ZT_ERR_IO, "cannot open %s to continue it: %s", path, strerror(errno));
    zt_status st = ZT_OK;
    if (ftruncate(fd, s->kept_end) != 0)
        st = zt_error_set(err, ZT_ERR_IO, "cannot cut %s back to its records of the checkpoint's steps: %s",
                          path, strerror(errno));
    if (st == ZT_OK && s->kept_lacks_newline && write(fd, "\n", 1) != 1)
        st = zt_error_set(err, ZT_ERR_IO, "cannot end the last record of %s with a line end: %s (disk full?)",
                          path, strerror(errno));
    if (st == ZT_OK && fsync(fd) != 0)
        st = zt_error_set(err, ZT_ERR_IO, "cannot sync %s: %s", path, strerror(errno));
    close(fd);
    return st;
}

/* Keep only the records of steps <= last_step: in place when they are the file's first lines (as zt
 * writes them), else by rewriting the file atomically (the old one stays until the new one is
 * complete). */
static zt_status continue_records(const char *path, int64_t last_step, zt_error *err)
{
    FILE *in = fopen(path, "rb");
    if (!in) {
        if (errno == ENOENT) return ZT_OK; /* nothing was logged before: start afresh */
        return zt_error_set(err, ZT_ERR_IO, "cannot read %s to continue it: %s", path, strerror(errno));
    }
    metrics_scan s;
    zt_status st = scan_lines(in, path, last_step, &s, NULL, err);
    struct stat sb;
    if (st == ZT_OK && fstat(fileno(in), &sb) != 0)
        st = zt_error_set(err, ZT_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    if (st == ZT_OK && s.out_of_order) {
        zt_atomic_file out;
        rewind(in);
        st = zt_atomic_file_open(&out, path, err);
        if (st == ZT_OK) st = scan_lines(in, path, last_step, &s, &out, err);
        if (st == ZT_OK) st = zt_atomic_file_commit(&out, err);
        else zt_atomic_file_abort(&out);
    } else if (st == ZT_OK && (s.kept_end < sb.st_size || s.kept_lacks_newline)) {
        st = cut_in_place(path, &s, err);
    }
    fclose(in);
    if (st != ZT_OK) return st;
    if (s.torn_line)
        zt_log(ZT_LOG_WARN, "%s:%ld: removed a torn last line (%zu bytes, not a whole record): zt's own record, cut "
               "short when the previous session stopped (a full disk, a crash); the records up to step %lld are "
               "kept",
               path, s.torn_line, s.torn_bytes, (long long)last_step);
    if (s.dropped)
        zt_log(ZT_LOG_INFO, "%s: dropped %lld record%s of steps after %lld (written after the checkpoint; those "
               "steps are trained again)",
               path, (long long)s.dropped, s.dropped == 1 ? "" : "s", (long long)last_step);
    return ZT_OK;
}

/* ---- writing ---------------------------------------------------------------------------------- */

zt_status zt_metrics_open(const char *path, int64_t resume_step, zt_metrics **out, zt_error *err)
{
    *out = NULL;
    if (resume_step >= 0) {
        zt_status st = continue_records(path, resume_step, err);
        if (st != ZT_OK) return st;
    }
    zt_metrics *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening %s", path);
    }
    m->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (resume_step >= 0 ? 0 : O_TRUNC), 0666);
    struct stat sb;
    if (m->fd < 0 || fstat(m->fd, &sb) != 0) {
        zt_error_set(err, ZT_ERR_IO, "cannot open the metrics file %s: %s; check that output_dir is writable",
                     path, strerror(errno));
        if (m->fd >= 0) close(m->fd);
        free(m->path);
        free(m);
        return ZT_ERR_IO;
    }
    m->size = sb.st_size;
    *out = m;
    return ZT_OK;
}

void zt_metrics_close(zt_metrics *m)
{
    if (!m) return;
    if (m->fd >= 0) close(m->fd);
    free(m->path);
    free(m);
}

/* A record being composed: text/len are open_memstream's. */
typedef struct record {
    FILE *f;
    char *text;
    size_t len;
} record;

/* A record is composed in memory and written with one write(), so `tail -f` never sees half of one;
 * a write that fails part way (a full disk) is cut back off, so the file still ends with the last
 * whole record and a later --resume continues it. */
static zt_status write_record(zt_metrics *m, record *r, zt_error *err)
{
    fputs("}\n", r->f);
    int closed = fclose(r->f) == 0; /* sets text and len */
    char *text = r->text;
    size_t len = r->len;
    if (!closed || !text) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing a record to %s", m->path);
    }
    size_t done = 0;
    int e = 0;
    while (done < len) {
        ssize_t w = write(m->fd, text + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            e = w < 0 ? errno : ENOSPC;
            break;
        }
        done += (size_t)w;
    }
    free(text);
    if (!e) {
        m->size += (off_t)done;
        return ZT_OK;
    }
    int cut = done == 0 || ftruncate(m->fd, m->size) == 0;
    return zt_error_set(err, ZT_ERR_IO, "cannot write to the metrics file %s: %s (disk full?); %s", m->path,
                        strerror(e),
                        cut ? "it still ends with the last whole record: free space, then continue with --resume"
                            : "it may end with part of a record, which --resume removes");
}

static zt_status begin_record(zt_metrics *m, record *r, zt_error *err)
{
    r->text = NULL;
    r->len = 0;
    r->f = open_memstream(&r->text, &r->len);
    return r->f ? ZT_OK : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing a record to %s", m->path);
}

static void write_mem(FILE *f, const char *key, const zt_mem_stats *mem)
{
    uint64_t current = 0, peak = 0;
    fprintf(f, ",\"%s\":{", key);
    for (int p = 0; p < ZT_POOL_COUNT; p++) {
        fprintf(f, "\"%s\":{\"current\":%llu,\"peak\":%llu},", zt_pool_name(p),
                (unsigned long long)mem[p].current, (unsigned long long)mem[p].peak);
        current += mem[p].current;
        peak += mem[p].peak;
    }
    fprintf(f, "\"total\":{\"current\":%llu,\"peak\":%llu}}", (unsigned long long)current,
            (unsigned long long)peak);
}

/* ,"key":value with every digit of the double; null for NaN and infinities, which JSON lacks. */
static void write_number(FILE *f, const char *key, double v)
{
    if (isfinite(v)) fprintf(f, ",\"%s\":%.17g", key, v);
    else fprintf(f, ",\"%s\":null", key);
}

/* ,"comm":{...}: the step's collectives (metrics.h). */
static void write_comm(FILE *f, const zt_comm_stats *c, double step_s)
{
    fprintf(f, ",\"comm\":{\"time_s\":%.17g", c->time_s); /* a sum of finite times */
    write_number(f, "share", step_s > 0 ? c->time_s / step_s : 0.0);
    fputs(",\"ops\":[", f);
    for (int32_t k = 0; k < c->n_ops; k++) {
        const zt_comm_op_stats *s = &c->ops[k];
        fprintf(f, "%s{\"op\":\"%s\"", k ? "," : "", zt_comm_op_name(s->op));
        fputs(",\"group\":", f);
        zt_json_write_string(f, s->group, strlen(s->group));
        fprintf(f, ",\"ranks\":%d,\"count\":%llu,\"bytes\":%llu", (int)s->ranks, (unsigned long long)s->count,
                (unsigned long long)s->bytes);
        write_number(f, "time_s", s->time_s);
        write_number(f, "algbw_gbps", zt_comm_algbw_gbps(s));
        write_number(f, "busbw_gbps", zt_comm_busbw_gbps(s));
        fputc('}', f);
    }
    fputs("]}", f);
}

zt_status zt_metrics_train(zt_metrics *m, const zt_train_record *r, zt_error *err)
{
    record rec;
    zt_status st = begin_record(m, &rec, err);
    if (st != ZT_OK) return st;
    FILE *f = rec.f;
    fprintf(f, "{\"step\":%lld,\"type\":\"train\",\"total_steps\":%lld", (long long)r->step,
            (long long)r->total_steps);
    write_number(f, "loss", r->loss);
    write_number(f, "lr", r->lr);
    write_number(f, "grad_norm", r->grad_norm);
    fprintf(f, ",\"skipped\":%s,\"tokens\":%lld,\"loss_tokens\":%lld", r->skipped ? "true" : "false",
            (long long)r->tokens, (long long)r->loss_tokens);
    if (r->loss_scale > 0) write_number(f, "loss_scale", r->loss_scale); /* fp16 runs only */
    write_number(f, "tokens_per_s", zt_train_record_tokens_per_s(r));
    write_number(f, "step_s", r->step_s);
    write_number(f, "elapsed_s", r->elapsed_s);
    write_number(f, "eta_s", r->eta_s);
    write_mem(f, "mem_host", r->host_mem);
    if (r->has_device) write_mem(f, "mem_device", r->device_mem);
    if (r->comm) write_comm(f, r->comm, r->step_s);
    return write_record(m, &rec, err);
}

zt_status zt_metrics_eval(zt_metrics *m, int64_t step, double eval_loss, int64_t eval_tokens, double eval_s,
                          zt_error *err)
{
    record rec;
    zt_status st = begin_record(m, &rec, err);
    if (st != ZT_OK) return st;
    FILE *f = rec.f;
    fprintf(f, "{\"step\":%lld,\"type\":\"eval\"", (long long)step);
    write_number(f, "eval_loss", eval_loss);
    fprintf(f, ",\"eval_tokens\":%lld", (long long)eval_tokens);
    write_number(f, "eval_s", eval_s);
    return write_record(m, &rec, err);
}

static void format_rate(double per_s, char *buf, size_t cap)
{
    if (per_s >= 1e6) snprintf(buf, cap, "%.2fM", per_s / 1e6);
    else if (per_s >= 1e4) snprintf(buf, cap, "%.1fk", per_s / 1e3);
    else snprintf(buf, cap, "%.0f", per_s);
}

/* The sum of the pools' peaks: an upper bound of the true peak (pools peak at different moments). */
static double peak_gib(const zt_mem_stats *mem)
{
    double total = 0;
    for (int p = 0; p < ZT_POOL_COUNT; p++) total += (double)mem[p].peak;
    return total / (1024.0 * 1024.0 * 1024.0);
}

void zt_metrics_format_train(const zt_train_record *r, char *buf, size_t cap)
{
    char rate[32], elapsed[32], eta[32], mem[64];
    format_rate(zt_train_record_tokens_per_s(r), rate, sizeof rate);
    zt_format_duration(r->elapsed_s, elapsed, sizeof elapsed);
    zt_format_duration(r->eta_s, eta, sizeof eta);
    if (r->has_device)
        snprintf(mem, sizeof mem, "peak mem %.2f GiB device, %.2f GiB host", peak_gib(r->device_mem),
                 peak_gib(r->host_mem));
    else
        snprintf(mem, sizeof mem, "peak mem %.2f GiB", peak_gib(r->host_mem));
    char scale[48] = "";
    if (r->loss_scale > 0) snprintf(scale, sizeof scale, " | loss_scale %.6g", r->loss_scale);
    snprintf(buf, cap, "step %lld/%lld | loss %.4f | lr %.3e | grad_norm %.4g%s%s | %s tok/s | elapsed %s | eta %s | %s",
             (long long)r->step, (long long)r->total_steps, r->loss, r->lr, r->grad_norm,
             r->skipped ? (r->loss_scale > 0 ? " (overflow: update skipped)" : " (non-finite: update skipped)") : "",
             scale, rate, elapsed, eta, mem);
}
