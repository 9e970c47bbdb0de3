/* metrics.jsonl and the per-step log line (metrics.h). */
#include "train/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "host/runtime.h"
#include "state/safetensors.h"

struct zt_metrics {
    FILE *file;
    char *path;
};

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

/* Rewrite path keeping only the records of steps <= last_step. */
static zt_status truncate_records(const char *path, int64_t last_step, zt_error *err)
{
    FILE *in = fopen(path, "rb");
    if (!in) {
        if (errno == ENOENT) return ZT_OK; /* nothing was logged before: start afresh */
        return zt_error_set(err, ZT_ERR_IO, "cannot read %s to continue it: %s", path, strerror(errno));
    }
    zt_atomic_file out;
    zt_status st = zt_atomic_file_open(&out, path, err);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long line_no = 0;
    while (st == ZT_OK && (len = getline(&line, &cap, in)) > 0) {
        line_no++;
        char origin[64];
        snprintf(origin, sizeof origin, "line %ld", line_no);
        int64_t step = record_step(line, (size_t)len, origin);
        if (step < 0) {
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s:%ld is not a metrics record (a JSON object starting with \"step\"); the file "
                              "was changed by something else: move it away to start a new one",
                              path, line_no);
            break;
        }
        if (step <= last_step) st = zt_atomic_file_write(&out, line, (size_t)len, err);
    }
    free(line);
    fclose(in);
    if (st == ZT_OK) return zt_atomic_file_commit(&out, err);
    zt_atomic_file_abort(&out);
    return st;
}

zt_status zt_metrics_open(const char *path, int64_t resume_step, zt_metrics **out, zt_error *err)
{
    *out = NULL;
    if (resume_step >= 0) {
        zt_status st = truncate_records(path, resume_step, err);
        if (st != ZT_OK) return st;
    }
    zt_metrics *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening %s", path);
    }
    m->file = fopen(path, resume_step >= 0 ? "ab" : "wb");
    if (!m->file) {
        zt_error_set(err, ZT_ERR_IO, "cannot open the metrics file %s: %s; check that output_dir is writable",
                     path, strerror(errno));
        free(m->path);
        free(m);
        return ZT_ERR_IO;
    }
    *out = m;
    return ZT_OK;
}

void zt_metrics_close(zt_metrics *m)
{
    if (!m) return;
    if (m->file) fclose(m->file);
    free(m->path);
    free(m);
}

static zt_status finish_line(zt_metrics *m, zt_error *err)
{
    fputs("}\n", m->file);
    if (fflush(m->file) != 0 || ferror(m->file))
        return zt_error_set(err, ZT_ERR_IO, "cannot write to the metrics file %s: %s (disk full?)", m->path,
                            strerror(errno));
    return ZT_OK;
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

zt_status zt_metrics_train(zt_metrics *m, const zt_train_record *r, zt_error *err)
{
    fprintf(m->file, "{\"step\":%lld,\"type\":\"train\",\"total_steps\":%lld", (long long)r->step,
            (long long)r->total_steps);
    write_number(m->file, "loss", r->loss);
    write_number(m->file, "lr", r->lr);
    write_number(m->file, "grad_norm", r->grad_norm);
    fprintf(m->file, ",\"skipped\":%s,\"tokens\":%lld,\"loss_tokens\":%lld", r->skipped ? "true" : "false",
            (long long)r->tokens, (long long)r->loss_tokens);
    if (r->loss_scale > 0) write_number(m->file, "loss_scale", r->loss_scale); /* fp16 runs only */
    write_number(m->file, "tokens_per_s", r->step_s > 0 ? (double)r->tokens / r->step_s : 0.0);
    write_number(m->file, "step_s", r->step_s);
    write_number(m->file, "elapsed_s", r->elapsed_s);
    write_number(m->file, "eta_s", r->eta_s);
    write_mem(m->file, "mem_host", r->host_mem);
    if (r->has_device) write_mem(m->file, "mem_device", r->device_mem);
    return finish_line(m, err);
}

zt_status zt_metrics_eval(zt_metrics *m, int64_t step, double eval_loss, int64_t eval_tokens, double eval_s,
                          zt_error *err)
{
    fprintf(m->file, "{\"step\":%lld,\"type\":\"eval\"", (long long)step);
    write_number(m->file, "eval_loss", eval_loss);
    fprintf(m->file, ",\"eval_tokens\":%lld", (long long)eval_tokens);
    write_number(m->file, "eval_s", eval_s);
    return finish_line(m, err);
}

void zt_format_duration(double seconds, char *buf, size_t cap)
{
    if (!(seconds >= 0) || seconds > 1e9) {
        snprintf(buf, cap, "?");
        return;
    }
    long long s = (long long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, cap, "%lldh%02lldm%02llds", s / 3600, s / 60 % 60, s % 60);
    else if (s >= 60) snprintf(buf, cap, "%lldm%02llds", s / 60, s % 60);
    else snprintf(buf, cap, "%llds", s);
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
    format_rate(r->step_s > 0 ? (double)r->tokens / r->step_s : 0.0, rate, sizeof rate);
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
