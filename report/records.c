/* One line of metrics.jsonl (docs/training.md, "What a run writes") parsed into a report_record. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "report.h"

const char *report_space_name(int space) { return space == REPORT_DEVICE ? "device" : "host"; }

/* The number of key `key` of object obj, NAN when absent or null; an error when it is something else. */
static zt_status number_of(const zt_json *j, int obj, const char *key, const char *origin, double *out,
                           zt_error *err)
{
    *out = NAN;
    int v = zt_json_object_get(j, obj, key);
    if (v < 0 || zt_json_is_null(j, v)) return ZT_OK;
    if (!zt_json_is_number(j, v))
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: \"%s\" is not a number", origin, key);
    *out = zt_json_get_number(j, v);
    return ZT_OK;
}

static int pool_index(report_pools *pools, const zt_json *j, int key_tok)
{
    int len = j->tok[key_tok].end - j->tok[key_tok].start;
    const char *name = j->text + j->tok[key_tok].start;
    for (int p = 0; p < pools->n; p++)
        if ((int)strlen(pools->names[p]) == len && memcmp(pools->names[p], name, (size_t)len) == 0) return p;
    if (pools->n == REPORT_MAX_POOLS) return -1;
    char *copy = report_xmalloc((size_t)len + 1, "a pool name");
    memcpy(copy, name, (size_t)len);
    copy[len] = '\0';
    pools->names[pools->n] = copy;
    return pools->n++;
}

/* "mem_host"/"mem_device": {"params":{"current":N,"peak":N},...,"total":{...}}: each pool's peak. */
static zt_status read_mem(const zt_json *j, int obj, const char *key, const char *origin, report_pools *pools,
                          report_step *s, int space, zt_error *err)
{
    int m = zt_json_object_get(j, obj, key);
    if (m < 0) return ZT_OK;
    if (j->tok[m].type != ZT_JSON_OBJECT)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: \"%s\" is not an object of pools", origin, key);
    s->has_mem[space] = 1;
    for (int p = 0; p < REPORT_MAX_POOLS; p++) s->mem_peak[space][p] = NAN;
    s->mem_total_peak[space] = NAN;
    int k = m + 1;
    for (int i = 0; i < j->tok[m].size; i++) {
        int value = k + 1;
        if (j->tok[value].type != ZT_JSON_OBJECT)
            return zt_error_set(err, ZT_ERR_FORMAT, "%s: \"%s\".\"%.*s\" is not {\"current\":..,\"peak\":..}",
                                origin, key, j->tok[k].end - j->tok[k].start, j->text + j->tok[k].start);
        double peak;
        zt_status st = number_of(j, value, "peak", origin, &peak, err);
        if (st != ZT_OK) return st;
        if (zt_json_eq(j, k, "total")) {
            s->mem_total_peak[space] = peak;
        } else {
            int p = pool_index(pools, j, k);
            if (p >= 0) s->mem_peak[space][p] = peak;
        }
        k = zt_json_skip(j, value);
    }
    return ZT_OK;
}

double report_busbw_factor(const char *op, int n)
{
    if (n <= 0) return NAN;
    if (strcmp(op, "all_reduce") == 0) return 2.0 * (n - 1) / n;
    if (strcmp(op, "reduce_scatter") == 0 || strcmp(op, "all_gather") == 0) return (double)(n - 1) / n;
    return 1.0;
}

/* The string of key `key` of an ops entry into a fixed-size name. */
static zt_status name_of(const zt_json *j, int entry, const char *key, const char *origin, int index, char *out,
                         zt_error *err)
{
    int v = zt_json_object_get(j, entry, key);
    if (v < 0 || j->tok[v].type != ZT_JSON_STRING)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: \"comm\".\"ops\"[%d] needs a string \"%s\"", origin, index,
                            key);
    char *text;
    size_t len;
    zt_status st = zt_json_string(j, v, &text, &len, err);
    if (st != ZT_OK) return st;
    if (len >= REPORT_COMM_NAME_MAX)
        st = zt_error_set(err, ZT_ERR_FORMAT, "%s: \"comm\".\"ops\"[%d].\"%s\" is %zu bytes long; zt-report reads "
                          "names of up to %d", origin, index, key, len, REPORT_COMM_NAME_MAX - 1);
    else memcpy(out, text, len + 1);
    free(text);
    return st;
}

/* "ops":[{"op":..,"group":..,"ranks":n,"count":N,"bytes":B,"time_s":t,...},...]: the sums are taken by
 * the reader (runs.c); the entries' own bandwidths are per step and are not summed. */
static zt_status read_comm_ops(const zt_json *j, int comm, const char *origin, report_record *out, zt_error *err)
{
    int a = zt_json_object_get(j, comm, "ops");
    if (a < 0 || zt_json_is_null(j, a)) return ZT_OK;
    if (j->tok[a].type != ZT_JSON_ARRAY)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: \"comm\".\"ops\" is not an array", origin);
    if (j->tok[a].size > REPORT_MAX_COMM_OPS)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: \"comm\".\"ops\" has %d entries; zt-report reads up to %d "
                            "kinds of collective and group", origin, j->tok[a].size, REPORT_MAX_COMM_OPS);
    int e = a + 1;
    for (int i = 0; i < j->tok[a].size; i++, e = zt_json_skip(j, e)) {
        if (j->tok[e].type != ZT_JSON_OBJECT)
            return zt_error_set(err, ZT_ERR_FORMAT, "%s: \"comm\".\"ops\"[%d] is not an object", origin, i);
        report_comm_op *op = &out->ops[out->n_ops];
        double ranks;
        zt_status st = name_of(j, e, "op", origin, i, op->op, err);
        if (st == ZT_OK) st = name_of(j, e, "group", origin, i, op->group, err);
        if (st == ZT_OK) st = number_of(j, e, "ranks", origin, &ranks, err);
        if (st == ZT_OK) st = number_of(j, e, "count", origin, &op->count, err);
        if (st == ZT_OK) st = number_of(j, e, "bytes", origin, &op->bytes, err);
        if (st == ZT_OK) st = number_of(j, e, "time_s", origin, &op->time_s, err);
        if (st != ZT_OK) return st;
        if (isnan(op->count) || isnan(op->bytes) || isnan(op->time_s))
            return zt_error_set(err, ZT_ERR_FORMAT, "%s: \"comm\".\"ops\"[%d] needs numbers \"count\", \"bytes\" "
                                "and \"time_s\"", origin, i);
        /* "ranks" came with the table's busbw; records without it read, their busbw unknown */
        op->ranks = isfinite(ranks) && ranks >= 1 ? (int)ranks : 0;
        out->n_ops++;
    }
    return ZT_OK;
}

/* "comm":{"time_s":T,"share":F,"ops":[...]} (the communication monitor's; absent in runs without it). */
static zt_status read_comm(const zt_json *j, int obj, const char *origin, report_record *out, zt_error *err)
{
    report_step *s = &out->train;
    int c = zt_json_object_get(j, obj, "comm");
    if (c < 0 || zt_json_is_null(j, c)) return ZT_OK;
    if (j->tok[c].type != ZT_JSON_OBJECT)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: \"comm\" is not an object", origin);
    zt_status st = number_of(j, c, "time_s", origin, &s->comm_time_s, err);
    if (st == ZT_OK) st = number_of(j, c, "share", origin, &s->comm_share, err);
    s->has_comm = st == ZT_OK && !isnan(s->comm_time_s);
    if (st == ZT_OK) st = read_comm_ops(j, c, origin, out, err);
    return st;
}

zt_status report_parse_record(const char *line, size_t len, const char *origin, report_pools *pools,
                              report_record *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    zt_json j;
    zt_status st = zt_json_parse(line, len, origin, &j, err);
    if (st != ZT_OK) return st;
    if (j.n_tok == 0 || j.tok[0].type != ZT_JSON_OBJECT) {
        zt_json_free(&j);
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: not a metrics record (a JSON object with \"step\" and "
                            "\"type\")", origin);
    }
    double step;
    st = number_of(&j, 0, "step", origin, &step, err);
    int type = zt_json_object_get(&j, 0, "type");
    if (st == ZT_OK && (isnan(step) || type < 0 || j.tok[type].type != ZT_JSON_STRING))
        st = zt_error_set(err, ZT_ERR_FORMAT, "%s: a metrics record needs a number \"step\" and a string "
                          "\"type\"", origin);
    if (st != ZT_OK) {
        zt_json_free(&j);
        return st;
    }
    if (zt_json_eq(&j, type, "train")) {
        report_step *s = &out->train;
        out->kind = REPORT_RECORD_TRAIN;
        s->step = (int64_t)step;
        double total;
        st = number_of(&j, 0, "total_steps", origin, &total, err);
        s->total_steps = isnan(total) ? -1 : (int64_t)total;
        struct { const char *key; double *to; } fields[] = {
            {"loss", &s->loss}, {"lr", &s->lr}, {"grad_norm", &s->grad_norm}, {"loss_scale", &s->loss_scale},
            {"tokens", &s->tokens}, {"tokens_per_s", &s->tokens_per_s}, {"step_s", &s->step_s},
            {"elapsed_s", &s->elapsed_s}, {"eta_s", &s->eta_s},
        };
        for (size_t f = 0; st == ZT_OK && f < sizeof fields / sizeof fields[0]; f++)
            st = number_of(&j, 0, fields[f].key, origin, fields[f].to, err);
        int sk = zt_json_object_get(&j, 0, "skipped");
        s->skipped = sk >= 0 && zt_json_is_bool(&j, sk) && zt_json_get_bool(&j, sk);
        if (st == ZT_OK) st = read_mem(&j, 0, "mem_host", origin, pools, s, REPORT_HOST, err);
        if (st == ZT_OK) st = read_mem(&j, 0, "mem_device", origin, pools, s, REPORT_DEVICE, err);
        if (st == ZT_OK) st = read_comm(&j, 0, origin, out, err);
    } else if (zt_json_eq(&j, type, "eval")) {
        out->kind = REPORT_RECORD_EVAL;
        out->eval.step = (int64_t)step;
        st = number_of(&j, 0, "eval_loss", origin, &out->eval.eval_loss, err);
    } else {
        out->kind = REPORT_RECORD_OTHER;
    }
    zt_json_free(&j);
    return st;
}
