/* Reading a run directory (report.h): its metrics files, resolved config and compare.json. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"
#include "base/json.h"
#include "report.h"

int report_metrics_file_rank(const char *name)
{
    if (strcmp(name, "metrics.jsonl") == 0) return 0;
    int rank, end = 0;
    if (sscanf(name, "metrics.rank%d.jsonl%n", &rank, &end) == 1 && end > 0 && name[end] == '\0' && rank > 0)
        return rank;
    return -1;
}

/* ---- metrics ----------------------------------------------------------------------------------- */

static int comm_op_index(const report_rank *r, const report_comm_op *op)
{
    for (int k = 0; k < r->n_comm_ops; k++)
        if (strcmp(r->comm_ops[k].op, op->op) == 0 && strcmp(r->comm_ops[k].group, op->group) == 0 &&
            r->comm_ops[k].ranks == op->ranks)
            return k;
    return -1;
}

/* A train record's "comm"."ops" added to the rank's sums over the run, by (op, group, ranks); all of
 * them or, when the sums would hold too many kinds, none (an error). */
static zt_status add_comm_ops(report_rank *r, const report_record *rec, const char *origin, zt_error *err)
{
    int n_new = 0;
    for (int i = 0; i < rec->n_ops; i++) n_new += comm_op_index(r, &rec->ops[i]) < 0;
    if (r->n_comm_ops + n_new > REPORT_MAX_COMM_OPS)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: more than %d kinds of collective and group in %s; zt-report "
                            "sums up to %d", origin, REPORT_MAX_COMM_OPS, r->path, REPORT_MAX_COMM_OPS);
    for (int i = 0; i < rec->n_ops; i++) {
        const report_comm_op *op = &rec->ops[i];
        int k = comm_op_index(r, op);
        if (k < 0) {
            k = r->n_comm_ops++;
            r->comm_ops[k] = *op;
            r->comm_ops[k].count = r->comm_ops[k].bytes = r->comm_ops[k].time_s = 0;
        }
        r->comm_ops[k].count += op->count;
        r->comm_ops[k].bytes += op->bytes;
        r->comm_ops[k].time_s += op->time_s;
    }
    return ZT_OK;
}

zt_status report_rank_add_line(report_rank *r, const char *line, size_t len, long line_no, zt_error *err)
{
    char origin[4096];
    snprintf(origin, sizeof origin, "%s:%ld", r->path, line_no);
    report_record rec;
    zt_status st = report_parse_record(line, len, origin, &r->pools, &rec, err);
    if (st != ZT_OK) return st;
    if (rec.kind == REPORT_RECORD_TRAIN) {
        if (r->n_steps == r->cap_steps) {
            r->cap_steps = r->cap_steps ? 2 * r->cap_steps : 256;
            r->steps = report_xrealloc(r->steps, (size_t)r->cap_steps * sizeof *r->steps, "the steps");
        }
        st = add_comm_ops(r, &rec, origin, err);
        if (st == ZT_OK) r->steps[r->n_steps++] = rec.train;
    } else if (rec.kind == REPORT_RECORD_EVAL) {
        if (r->n_evals == r->cap_evals) {
            r->cap_evals = r->cap_evals ? 2 * r->cap_evals : 64;
            r->evals = report_xrealloc(r->evals, (size_t)r->cap_evals * sizeof *r->evals, "the evaluations");
        }
        r->evals[r->n_evals++] = rec.eval;
    }
    return st;
}

void report_rank_free(report_rank *r)
{
    for (int p = 0; p < r->pools.n; p++) free(r->pools.names[p]);
    free(r->steps);
    free(r->evals);
    free(r->path);
    memset(r, 0, sizeof *r);
}

/* A whole metrics file. Every line must be a record, except a torn last one (zt writes each record
 * with one write(), so only the last line can be cut short: a run still writing it, a full disk, a
 * crash), which is left out with a note in *torn. */
static zt_status read_metrics(report_rank *r, char **torn, zt_error *err)
{
    char *text;
    size_t len;
    zt_status st = zt_read_file(r->path, &text, &len, err);
    if (st != ZT_OK) return st;
    long line_no = 0;
    size_t pos = 0;
    while (st == ZT_OK && pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        line_no++;
        int last = end + 1 >= len;
        zt_error line_err;
        if (report_rank_add_line(r, text + pos, end - pos, line_no, &line_err) != ZT_OK) {
            if (last) {
                free(*torn);
                *torn = report_format("%s:%ld: a torn last line (%zu bytes) left out: the run is writing it, "
                                      "or stopped while writing it", r->path, line_no, end - pos);
            } else {
                st = zt_error_set(err, ZT_ERR_FORMAT, "%s; only the last line of a metrics file may be cut "
                                  "short, so this one was changed by something else: fix or delete that line",
                                  line_err.msg);
            }
        }
        pos = end + 1;
    }
    free(text);
    return st;
}

static int compare_ranks(const void *a, const void *b)
{
    return ((const report_rank *)a)->rank - ((const report_rank *)b)->rank;
}

/* metrics.jsonl, then metrics.rank<R>.jsonl by rank. */
static zt_status read_ranks(report_run *run, zt_error *err)
{
    DIR *d = opendir(run->dir);
    if (!d) return zt_error_set(err, ZT_ERR_IO, "cannot list %s: %s", run->dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int rank = report_metrics_file_rank(e->d_name);
        if (rank < 0) continue;
        run->ranks = report_xrealloc(run->ranks, (size_t)(run->n_ranks + 1) * sizeof *run->ranks, "the ranks");
        report_rank *r = &run->ranks[run->n_ranks++];
        memset(r, 0, sizeof *r);
        r->rank = rank;
        r->path = report_format("%s/%s", run->dir, e->d_name);
    }
    closedir(d);
    if (run->n_ranks > 1) qsort(run->ranks, (size_t)run->n_ranks, sizeof *run->ranks, compare_ranks);
    if (run->n_ranks > 0 && run->ranks[0].rank != 0)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s has rank files (%s) but no metrics.jsonl, which rank 0 "
                            "writes: the run directory is incomplete", run->dir, run->ranks[0].path);
    for (int i = 0; i < run->n_ranks; i++) {
        char *torn = NULL;
        zt_status st = read_metrics(&run->ranks[i], &torn, err);
        if (torn) {
            if (!run->torn_note) run->torn_note = torn;
            else free(torn);
        }
        if (st != ZT_OK) return st;
    }
    return ZT_OK;
}

/* ---- config.resolved.json ---------------------------------------------------------------------- */

static void add_config(report_run *run, const char *key, char *value)
{
    run->config = report_xrealloc(run->config, (size_t)(run->n_config + 1) * sizeof *run->config, "the config");
    report_config_entry *e = &run->config[run->n_config++];
    e->key = report_xstrdup(key);
    e->value = value;
    e->source = NULL;
}

/* A primitive or string value as text (strings unquoted), arrays as their JSON text. */
static char *value_text(const zt_json *j, int tok)
{
    if (j->tok[tok].type == ZT_JSON_STRING) {
        char *s;
        size_t n;
        zt_error err;
        if (zt_json_string(j, tok, &s, &n, &err) == ZT_OK) return s;
    }
    int start = j->tok[tok].start, end = j->tok[tok].end;
    char *s = report_xmalloc((size_t)(end - start) + 1, "a config value");
    memcpy(s, j->text + start, (size_t)(end - start));
    s[end - start] = '\0';
    return s;
}

static void flatten(report_run *run, const zt_json *j, int obj, const char *prefix)
{
    int k = obj + 1;
    for (int i = 0; i < j->tok[obj].size; i++) {
        int v = k + 1;
        char *key = report_format("%s%.*s", prefix, j->tok[k].end - j->tok[k].start, j->text + j->tok[k].start);
        if (key[0] == '_' && !prefix[0]) {
            /* zt's metadata ("_sources", "_plugins"): not keys */
        } else if (j->tok[v].type == ZT_JSON_OBJECT) {
            char *sub = report_format("%s.", key);
            flatten(run, j, v, sub);
            free(sub);
        } else {
            add_config(run, key, value_text(j, v));
        }
        free(key);
        k = zt_json_skip(j, v);
    }
}

static zt_status read_config(report_run *run, zt_error *err)
{
    char *path = report_format("%s/config.resolved.json", run->dir);
    char *text;
    size_t len;
    zt_status st = zt_read_file(path, &text, &len, err);
    if (st == ZT_ERR_NOT_FOUND) {
        free(path);
        return ZT_OK; /* a run directory of another tool, or copied without it: no config table */
    }
    if (st != ZT_OK) {
        free(path);
        return st;
    }
    zt_json j;
    st = zt_json_parse(text, len, path, &j, err);
    if (st == ZT_OK) {
        if (j.n_tok > 0 && j.tok[0].type == ZT_JSON_OBJECT) {
            flatten(run, &j, 0, "");
            int sources = zt_json_object_get(&j, 0, "_sources");
            for (int i = 0; sources >= 0 && j.tok[sources].type == ZT_JSON_OBJECT && i < run->n_config; i++) {
                int s = zt_json_object_get(&j, sources, run->config[i].key);
                if (s >= 0) run->config[i].source = value_text(&j, s);
            }
        } else {
            st = zt_error_set(err, ZT_ERR_FORMAT, "%s is not a JSON object (a resolved config)", path);
        }
        zt_json_free(&j);
    }
    free(text);
    free(path);
    return st;
}

/* ---- compare.json ------------------------------------------------------------------------------ */

static double number_or_nan(const zt_json *j, int obj, const char *key)
{
    int v = obj >= 0 ? zt_json_object_get(j, obj, key) : -1;
    return v >= 0 && zt_json_is_number(j, v) ? zt_json_get_number(j, v) : NAN;
}

/* {"device":{"params":B,...,"total":B},"host":{...}} */
static void read_compare_mem(const zt_json *j, int obj, report_compare_row *row, int measured)
{
    for (int space = 0; space < REPORT_SPACES; space++) {
        int m = zt_json_object_get(j, obj, report_space_name(space));
        if (m < 0 || j->tok[m].type != ZT_JSON_OBJECT) continue;
        if (!measured) {
            row->estimate_total[space] = number_or_nan(j, m, "total");
            if (row->has_measured) continue;
        }
        report_pools *pools = &row->pools[space];
        for (int p = 0; p < pools->n; p++) free(pools->names[p]);
        pools->n = 0;
        int k = m + 1;
        for (int i = 0; i < j->tok[m].size; i++) {
            int v = k + 1;
            double bytes = zt_json_is_number(j, v) ? zt_json_get_number(j, v) : NAN;
            if (zt_json_eq(j, k, "total")) {
                row->mem_total[space] = bytes;
            } else if (pools->n < REPORT_MAX_POOLS) {
                row->mem[space][pools->n] = bytes;
                pools->names[pools->n++] = value_text(j, k);
            }
            k = zt_json_skip(j, v);
        }
    }
}

static zt_status read_compare(report_run *run, zt_error *err)
{
    char *path = report_format("%s/compare.json", run->dir);
    char *text;
    size_t len;
    zt_status st = zt_read_file(path, &text, &len, err);
    if (st == ZT_ERR_NOT_FOUND) {
        free(path);
        return ZT_OK;
    }
    if (st != ZT_OK) {
        free(path);
        return st;
    }
    zt_json j;
    st = zt_json_parse(text, len, path, &j, err);
    if (st != ZT_OK) {
        free(text);
        free(path);
        return st;
    }
    int version = j.tok[0].type == ZT_JSON_OBJECT ? zt_json_object_get(&j, 0, "version") : -1;
    int keys = version >= 0 ? zt_json_object_get(&j, 0, "keys") : -1;
    int rows = version >= 0 ? zt_json_object_get(&j, 0, "rows") : -1;
    if (version < 0 || !zt_json_is_number(&j, version) || zt_json_get_number(&j, version) != 1)
        st = zt_error_set(err, ZT_ERR_FORMAT, "%s: not a compare.json of version 1 (an object with \"version\":1, "
                          "\"keys\" and \"rows\", as zt-run --compare writes it)", path);
    else if (keys < 0 || j.tok[keys].type != ZT_JSON_ARRAY || rows < 0 || j.tok[rows].type != ZT_JSON_ARRAY)
        st = zt_error_set(err, ZT_ERR_FORMAT, "%s: \"keys\" and \"rows\" must be arrays", path);
    if (st == ZT_OK) {
        report_compare *c = report_xcalloc(1, sizeof *c, "the comparison");
        run->compare = c;
        c->path = path;
        path = NULL;
        c->n_keys = j.tok[keys].size;
        c->keys = report_xcalloc((size_t)c->n_keys, sizeof *c->keys, "the comparison");
        for (int i = 0, k = keys + 1; i < c->n_keys; i++, k = zt_json_skip(&j, k)) c->keys[i] = value_text(&j, k);
        c->n_rows = j.tok[rows].size;
        c->rows = report_xcalloc((size_t)c->n_rows, sizeof *c->rows, "the comparison");
        for (int i = 0, r = rows + 1; st == ZT_OK && i < c->n_rows; i++, r = zt_json_skip(&j, r)) {
            report_compare_row *row = &c->rows[i];
            if (j.tok[r].type != ZT_JSON_OBJECT) {
                st = zt_error_set(err, ZT_ERR_FORMAT, "%s: row %d is not an object", c->path, i + 1);
                break;
            }
            row->n_config = c->n_keys;
            row->config_values = report_xcalloc((size_t)c->n_keys, sizeof *row->config_values, "a row");
            int config = zt_json_object_get(&j, r, "config");
            for (int k = 0; k < c->n_keys; k++) {
                int v = config >= 0 && j.tok[config].type == ZT_JSON_OBJECT ? zt_json_object_get(&j, config, c->keys[k])
                                                                           : -1;
                row->config_values[k] = v >= 0 ? value_text(&j, v) : report_xstrdup("");
            }
            int fits = zt_json_object_get(&j, r, "fits");
            row->fits = fits < 0 || !zt_json_is_bool(&j, fits) || zt_json_get_bool(&j, fits);
            int overflow = zt_json_object_get(&j, r, "overflow");
            if (overflow >= 0 && j.tok[overflow].type == ZT_JSON_STRING) row->overflow = value_text(&j, overflow);
            for (int space = 0; space < REPORT_SPACES; space++)
                row->mem_total[space] = row->estimate_total[space] = NAN;
            int measured = zt_json_object_get(&j, r, "measured");
            row->has_measured = measured >= 0 && j.tok[measured].type == ZT_JSON_OBJECT;
            if (row->has_measured) read_compare_mem(&j, measured, row, 1);
            int estimate = zt_json_object_get(&j, r, "estimate");
            if (estimate >= 0 && j.tok[estimate].type == ZT_JSON_OBJECT) read_compare_mem(&j, estimate, row, 0);
            row->tokens_per_s = number_or_nan(&j, r, "tokens_per_s");
            row->loss = number_or_nan(&j, r, "loss");
            row->step_s = number_or_nan(&j, r, "step_s");
            int rd = zt_json_object_get(&j, r, "run_dir");
            if (rd >= 0 && j.tok[rd].type == ZT_JSON_STRING) row->run_dir = value_text(&j, rd);
        }
    }
    zt_json_free(&j);
    free(text);
    free(path);
    return st;
}

/* ---- the run ------------------------------------------------------------------------------------ */

zt_status report_run_read(const char *dir, report_run *run, zt_error *err)
{
    memset(run, 0, sizeof *run);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    run->dir = report_format("%.*s", (int)n, dir);
    run->name = report_xstrdup(run->dir);
    struct stat sb;
    if (stat(run->dir, &sb) != 0)
        return zt_error_set(err, ZT_ERR_NOT_FOUND, "run directory %s: %s; give the output_dir of a zt-run run",
                            run->dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "%s is not a directory; give the output_dir of a zt-run run "
                            "(the directory that holds metrics.jsonl)", run->dir);
    zt_status st = read_ranks(run, err);
    if (st == ZT_OK) st = read_compare(run, err);
    if (st == ZT_OK && run->n_ranks == 0 && !run->compare)
        st = zt_error_set(err, ZT_ERR_NOT_FOUND, "%s holds no metrics.jsonl (nor a compare.json): it is not the "
                          "output_dir of a zt-run run, or the run has not reached its first step", run->dir);
    if (st == ZT_OK) st = read_config(run, err);
    return st;
}

void report_run_free(report_run *run)
{
    for (int i = 0; i < run->n_ranks; i++) report_rank_free(&run->ranks[i]);
    free(run->ranks);
    for (int i = 0; i < run->n_config; i++) {
        free(run->config[i].key);
        free(run->config[i].value);
        free(run->config[i].source);
    }
    free(run->config);
    if (run->compare) {
        report_compare *c = run->compare;
        for (int i = 0; i < c->n_rows; i++) {
            report_compare_row *row = &c->rows[i];
            for (int k = 0; k < row->n_config; k++) free(row->config_values[k]);
            free(row->config_values);
            free(row->overflow);
            free(row->run_dir);
            for (int s = 0; s < REPORT_SPACES; s++)
                for (int p = 0; p < row->pools[s].n; p++) free(row->pools[s].names[p]);
        }
        for (int k = 0; k < c->n_keys; k++) free(c->keys[k]);
        free(c->keys);
        free(c->rows);
        free(c->path);
        free(c);
    }
    free(run->torn_note);
    free(run->dir);
    free(run->name);
    memset(run, 0, sizeof *run);
}
