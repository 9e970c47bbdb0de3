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

/* "comm":{"time_s":T,"share":F,"ops":[...]} (the communication monitor's; absent in runs without it). */
static zt_status read_comm(const zt_json *j, int obj, const char *origin, report_step *s, zt_error *err)
{
    int c = zt_json_object_get(j, obj, "comm");
    if (c < 0 || zt_json_is_null(j, c)) return ZT_OK;
    if (j->tok[c].type != ZT_JSON_OBJECT)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: \"comm\" is not an object", origin);
    zt_status st = number_of(j, c, "time_s", origin, &s->comm_time_s, err);
    if (st == ZT_OK) st = number_of(j, c, "share", origin, &s->comm_share, err);
    s->has_comm = st == ZT_OK && !isnan(s->comm_time_s);
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
        if (st == ZT_OK) st = read_comm(&j, 0, origin, s, err);
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
