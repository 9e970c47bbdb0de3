/* zt-run --generate --prompts FILE --output OUT.jsonl: every record answered, continuously batched
 * (docs/generate.md). Records wait in input order; up to generate.max_seqs of them decode together,
 * one token each per step, and a new one joins (its prompt run alone, as a prefill) whenever one
 * finishes and the KV cache has room. When the cache cannot grow, the sequence admitted last is
 * preempted: its blocks are freed and it starts again later (its seed makes it draw the same
 * tokens). Each row of the model is computed independently of the others, and every record samples
 * with a seed of its own, so an answer does not depend on which records shared its batch.
 *
 * Answers are appended, whole lines, to OUT.jsonl.partial as they finish; a run that finds that
 * file skips the records it answers (a killed run resumes). At the end the lines are written to
 * OUT.jsonl in input order (atomically) and the partial file is removed. */
#define _GNU_SOURCE /* open_memstream, memmem, strdup */
#include "generate/generate_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "base/json.h"
#include "base/log.h"
#include "base/random.h"

/* One record of --prompts. */
typedef struct record {
    char *id_json;      /* the record's "id" as JSON text, or its number */
    char *prompt, *input;
    int raw;            /* {"prompt": ...}: no template */
    int32_t *ids;       /* {"prompt_ids": [...]}: the prompt as token ids, used as they are */
    int32_t n_ids;
    char *error;        /* why it cannot be answered (malformed, empty, too long, ...) */
    char *line;         /* its output line, once answered (with the newline) */
    /* Its own sampling (the record's "temperature", "top_k", "top_p", "max_new_tokens", "seed",
     * "stop"; the run's where it gives none). */
    double temperature, top_p;
    int32_t top_k;
    int64_t max_new_tokens;
    int has_seed;
    uint64_t seed;
    char *stops[MAX_STOP_TEXTS];
    int n_stops;
} record;

typedef struct batch {
    gen_run *g;
    record *recs;
    int64_t n_recs, n_done;
    FILE *partial;
    char partial_path[4200];
    int64_t tokens_out;
    double started, last_progress;
    int64_t finished, finished_slots, finished_tokens; /* KV waste of finished sequences */
} batch;

/* A running sequence. */
typedef struct slot {
    int64_t rec;        /* -1: free */
    int32_t *ids;       /* prompt, then the generated tokens */
    int32_t n_prompt, length;
    zt_sampler sampler;
    double started;
    int64_t admitted;   /* admission order, for preemption */
} slot;

/* ---- reading the records --------------------------------------------------------------------- */

static char *printf_alloc(const char *fmt, ...) ZT_PRINTF(1, 2);
static char *printf_alloc(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

/* {"prompt_ids": [id, ...]}: ids of a vocabulary of `vocab` tokens, into r->ids. */
static void read_prompt_ids(const zt_json *j, int arr, int64_t number, int32_t vocab, record *r)
{
    if (j->tok[arr].type != ZT_JSON_ARRAY || j->tok[arr].size == 0) {
        r->error = printf_alloc("record %lld: \"prompt_ids\" must be a non-empty array of token ids", (long long)number);
        return;
    }
    if (!(r->ids = malloc((size_t)j->tok[arr].size * sizeof *r->ids))) return;
    for (int k = 0, tok = arr + 1; k < j->tok[arr].size; k++, tok = zt_json_skip(j, tok)) {
        double v = zt_json_is_number(j, tok) ? zt_json_get_number(j, tok) : -1;
        if (v < 0 || v >= vocab || v != (double)(int32_t)v) {
            r->error = printf_alloc("record %lld: \"prompt_ids\" entry %d is %.*s, not a token id in [0, %d) (the "
                                    "model's vocabulary)", (long long)number, k + 1, j->tok[tok].end - j->tok[tok].start,
                                    j->text + j->tok[tok].start, (int)vocab);
            return;
        }
        r->ids[r->n_ids++] = (int32_t)v;
    }
    r->raw = 1;
}

/* A number field of the record within [lo, hi] (whole when `whole`), into *out; 0 and r->error set
 * when it is not one. Absent: *out keeps the run's value. */
static int read_option(const zt_json *j, int obj, int64_t number, const char *key, double lo, double hi, int whole,
                       int lo_open, const char *meaning, double *out, record *r)
{
    int t = zt_json_object_get(j, obj, key);
    if (t < 0) return 1;
    double v = zt_json_is_number(j, t) ? zt_json_get_number(j, t) : NAN;
    if (!(v >= lo && v <= hi) || (lo_open && v == lo) || (whole && v != floor(v))) {
        const char *quote = j->tok[t].type == ZT_JSON_STRING ? "\"" : "";
        r->error = printf_alloc("record %lld: \"%s\" is %s%.*s%s: expected %s", (long long)number, key, quote,
                                j->tok[t].end - j->tok[t].start, j->text + j->tok[t].start, quote, meaning);
        return 0;
    }
    *out = v;
    return 1;
}

/* The record's own sampling options, the run's (settings s) where it gives none. */
static void read_sampling(const zt_json *j, int obj, int64_t number, const zt_generate_settings *s, record *r)
{
    double temperature = s->temperature, top_p = s->top_p, top_k = s->top_k, max_new = (double)s->max_new_tokens,
           seed = -1;
    if (!read_option(j, obj, number, "temperature", 0, 100, 0, 0, "a number from 0 (greedy) to 100", &temperature, r) ||
        !read_option(j, obj, number, "top_p", 0, 1, 0, 1, "a number above 0 and at most 1", &top_p, r) ||
        !read_option(j, obj, number, "top_k", 0, INT32_MAX, 1, 0, "a whole number >= 0 (0: all tokens)", &top_k, r) ||
        !read_option(j, obj, number, "max_new_tokens", 1, 1000000, 1, 0, "a whole number from 1 to 1000000",
                     &max_new, r) ||
        !read_option(j, obj, number, "seed", 0, 9007199254740992.0, 1, 0, "a whole number from 0 to 2^53", &seed, r))
        return;
    r->temperature = temperature;
    r->top_p = top_p;
    r->top_k = (int32_t)top_k;
    r->max_new_tokens = (int64_t)max_new;
    r->has_seed = seed >= 0;
    r->seed = r->has_seed ? (uint64_t)seed : 0;
    int stop = zt_json_object_get(j, obj, "stop");
    if (stop < 0 || zt_json_is_null(j, stop)) return;
    int one = j->tok[stop].type == ZT_JSON_STRING, n = one ? 1 : j->tok[stop].size;
    if ((!one && j->tok[stop].type != ZT_JSON_ARRAY) || n > MAX_STOP_TEXTS) {
        r->error = printf_alloc("record %lld: \"stop\" must be a string or an array of at most %d strings",
                                (long long)number, MAX_STOP_TEXTS);
        return;
    }
    for (int k = 0, t = one ? stop : stop + 1; k < n; k++, t = zt_json_skip(j, t)) {
        zt_error err = {0};
        size_t len = 0;
        if (j->tok[t].type != ZT_JSON_STRING) {
            r->error = printf_alloc("record %lld: \"stop\" entry %d is not a string", (long long)number, k + 1);
            return;
        }
        if (zt_json_string(j, t, &r->stops[r->n_stops], &len, &err) != ZT_OK) {
            r->error = printf_alloc("record %lld: \"stop\" entry %d: %s", (long long)number, k + 1, err.msg);
            return;
        }
        r->n_stops++;
        if (len == 0 || len > MAX_STOP_TEXT_BYTES) {
            r->error = printf_alloc("record %lld: \"stop\" entry %d has %zu bytes: a stop text needs 1 to %d",
                                    (long long)number, k + 1, len, MAX_STOP_TEXT_BYTES);
            return;
        }
    }
}

/* A record from object token `obj` of j; problems go to r->error. */
static void read_record(const zt_json *j, int obj, int64_t number, int32_t vocab, const zt_generate_settings *s,
                        record *r)
{
    zt_error err = {0};
    if (!(r->id_json = printf_alloc("%lld", (long long)number))) return;
    if (j->tok[obj].type != ZT_JSON_OBJECT) {
        r->error = printf_alloc("record %lld is not a JSON object: give {\"instruction\": ..., \"input\": ...} or "
                                "{\"prompt\": ...}", (long long)number);
        return;
    }
    int id = zt_json_object_get(j, obj, "id");
    if (id >= 0) {
        const zt_json_tok *t = &j->tok[id];
        int quoted = t->type == ZT_JSON_STRING;
        free(r->id_json);
        r->id_json = printf_alloc("%s%.*s%s", quoted ? "\"" : "", t->end - t->start, j->text + t->start,
                                  quoted ? "\"" : "");
    }
    int instruction = zt_json_object_get(j, obj, "instruction"), prompt = zt_json_object_get(j, obj, "prompt");
    int input = zt_json_object_get(j, obj, "input"), ids = zt_json_object_get(j, obj, "prompt_ids");
    read_sampling(j, obj, number, s, r);
    if (r->error) return;
    if (ids >= 0 && instruction < 0 && prompt < 0) {
        read_prompt_ids(j, ids, number, vocab, r);
        return;
    }
    int field = instruction >= 0 ? instruction : prompt;
    const char *name = instruction >= 0 ? "instruction" : "prompt";
    if (field < 0) {
        r->error = printf_alloc("record %lld has neither \"instruction\" (Alpaca) nor \"prompt\" (raw text) nor "
                                "\"prompt_ids\" (token ids)",
                                (long long)number);
        return;
    }
    if (j->tok[field].type != ZT_JSON_STRING || (input >= 0 && j->tok[input].type != ZT_JSON_STRING)) {
        r->error = printf_alloc("record %lld: \"%s\" must be a string", (long long)number,
                                j->tok[field].type != ZT_JSON_STRING ? name : "input");
        return;
    }
    size_t n;
    if (zt_json_string(j, field, &r->prompt, &n, &err) != ZT_OK ||
        (input >= 0 && zt_json_string(j, input, &r->input, &n, &err) != ZT_OK)) {
        r->error = printf_alloc("record %lld: %s", (long long)number, err.msg);
        return;
    }
    r->raw = instruction < 0;
    const char *p = r->prompt;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (!*p) r->error = printf_alloc("record %lld: the %s is empty: give some text", (long long)number, name);
}

/* .jsonl: one object per line (a line that is no JSON is that record's error); .json: an array. */
static zt_status read_records(batch *b, const char *path, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    zt_status st = zt_read_file(path, &text, &len, err);
    if (st != ZT_OK) return st;
    size_t path_len = strlen(path);
    int jsonl = path_len > 6 && !strcmp(path + path_len - 6, ".jsonl");
    zt_json j;
    if (!jsonl) {
        st = zt_json_parse(text, len, path, &j, err);
        if (st == ZT_OK && j.tok[0].type != ZT_JSON_ARRAY) {
            zt_json_free(&j);
            st = zt_error_set(err, ZT_ERR_FORMAT, "%s: --prompts FILE.json must hold an array of records (a file "
                              "of one object per line is read as JSON lines when it ends in .jsonl)", path);
        }
        if (st != ZT_OK) {
            free(text);
            return st;
        }
        b->n_recs = j.tok[0].size;
        b->recs = calloc((size_t)b->n_recs + 1, sizeof *b->recs);
        for (int64_t i = 0, tok = 1; b->recs && i < b->n_recs; i++, tok = zt_json_skip(&j, (int)tok))
            read_record(&j, (int)tok, i + 1, b->g->model.info->vocab_size, b->g->s, &b->recs[i]);
        zt_json_free(&j);
    } else {
        int64_t lines = 0;
        for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
        b->recs = calloc((size_t)lines + 2, sizeof *b->recs); /* a last line without a newline too */
        for (size_t at = 0; b->recs && at < len;) {
            const char *nl = memchr(text + at, '\n', len - at);
            size_t end = nl ? (size_t)(nl - text) : len, k = at;
            while (k < end && (text[k] == ' ' || text[k] == '\t' || text[k] == '\r')) k++;
            if (k < end) { /* blank lines are no records */
                record *r = &b->recs[b->n_recs++];
                zt_error line_err = {0};
                char origin[64];
                snprintf(origin, sizeof origin, "record %lld", (long long)b->n_recs);
                if (zt_json_parse(text + at, end - at, origin, &j, &line_err) == ZT_OK) {
                    read_record(&j, 0, b->n_recs, b->g->model.info->vocab_size, b->g->s, r);
                    zt_json_free(&j);
                } else {
                    int64_t line = 1; /* blank lines make it differ from the record number */
                    for (size_t i = 0; i < at; i++) line += text[i] == '\n';
                    r->id_json = printf_alloc("%lld", (long long)b->n_recs);
                    r->error = printf_alloc("%s (line %lld of %s)", line_err.msg, (long long)line, path);
                }
            }
            at = end + 1;
        }
    }
    free(text);
    if (!b->recs) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    if (b->n_recs == 0) return zt_error_set(err, ZT_ERR_FORMAT, "%s holds no records", path);
    return ZT_OK;
}

/* ---- the output ------------------------------------------------------------------------------ */

/* The record's line; text NULL for an error line. */
static zt_status answer(batch *b, int64_t i, const char *text, size_t text_len, const int32_t *output_ids,
                        int32_t prompt_tokens, int32_t output_tokens, const char *reason, double latency,
                        zt_error *err)
{
    record *r = &b->recs[i];
    char *line = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&line, &n);
    if (!f) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing record %lld", (long long)i + 1);
    fprintf(f, "{\"record\":%lld,\"id\":%s,\"prompt\":", (long long)i + 1, r->id_json ? r->id_json : "null");
    zt_json_write_string(f, r->prompt ? r->prompt : "", r->prompt ? strlen(r->prompt) : 0);
    if (text) {
        fputs(",\"output\":", f);
        zt_json_write_string(f, text, text_len);
        if (r->ids) { /* ids in, ids out (the text too when a tokenizer is known) */
            fputs(",\"output_ids\":[", f);
            for (int32_t k = 0; k < output_tokens; k++) fprintf(f, "%s%d", k ? "," : "", (int)output_ids[k]);
            fputc(']', f);
        }
        fprintf(f, ",\"prompt_tokens\":%d,\"output_tokens\":%d,\"finish_reason\":\"%s\",\"latency_s\":%.4f}\n",
                (int)prompt_tokens, (int)output_tokens, reason, latency);
    } else {
        fputs(",\"output\":null,\"finish_reason\":\"error\",\"error\":", f);
        zt_json_write_string(f, r->error, strlen(r->error));
        fputs("}\n", f);
        zt_log(ZT_LOG_ERROR, "%s", r->error);
    }
    fclose(f);
    if (!line) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing record %lld", (long long)i + 1);
    r->line = line;
    b->n_done++;
    b->tokens_out += output_tokens;
    b->g->stats.new_tokens += output_tokens;
    b->g->stats.prompt_tokens += prompt_tokens;
    if (fwrite(line, 1, n, b->partial) != n || fflush(b->partial) != 0)
        return zt_error_set(err, ZT_ERR_IO, "cannot write %s: %s", b->partial_path, strerror(errno));
    return ZT_OK;
}

static void progress(batch *b, int final)
{
    double now = zt_now_s();
    if (!final && now - b->last_progress < 1.0) return;
    b->last_progress = now;
    double took = now - b->started;
    int tty = isatty(2);
    fprintf(stderr, "%sgenerate: %lld/%lld records, %lld tokens, %.1f tokens/s%s", tty ? "\r" : "",
            (long long)b->n_done, (long long)b->n_recs, (long long)b->tokens_out,
            took > 0 ? (double)b->tokens_out / took : 0.0, tty && !final ? "" : "\n");
    fflush(stderr);
}

/* Lines of an earlier run's OUT.jsonl.partial: their records are answered. A torn last line (a
 * killed write) is cut off. */
static zt_status resume(batch *b, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    if (access(b->partial_path, F_OK) != 0) return ZT_OK;
    zt_status st = zt_read_file(b->partial_path, &text, &len, err);
    if (st != ZT_OK) return st;
    size_t good = 0;
    int64_t found = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        if (!nl) break;
        size_t end = (size_t)(nl - text);
        zt_json j;
        zt_error ignored = {0};
        if (zt_json_parse(text + at, end - at, b->partial_path, &j, &ignored) != ZT_OK) break;
        int rec = zt_json_object_get(&j, 0, "record");
        int64_t i = rec >= 0 && zt_json_is_number(&j, rec) ? (int64_t)zt_json_get_number(&j, rec) - 1 : -1;
        zt_json_free(&j);
        if (i < 0 || i >= b->n_recs) {
            free(text);
            return zt_error_set(err, ZT_ERR_FORMAT, "%s: line of record %lld, but --prompts has %lld records: it is "
                                "from another prompts file; delete it to start again", b->partial_path,
                                (long long)i + 1, (long long)b->n_recs);
        }
        if (!b->recs[i].line) {
            b->recs[i].line = strndup(text + at, end - at + 1);
            b->n_done++;
            found++;
        }
        at = end + 1;
        good = at;
    }
    free(text);
    if (truncate(b->partial_path, (off_t)good) != 0)
        return zt_error_set(err, ZT_ERR_IO, "cannot truncate %s: %s", b->partial_path, strerror(errno));
    zt_log(ZT_LOG_INFO, "resuming: %lld of %lld records are answered in %s", (long long)found, (long long)b->n_recs,
           b->partial_path);
    return ZT_OK;
}

static zt_status write_output(batch *b, zt_error *err)
{
    zt_buf all = {0};
    for (int64_t i = 0; i < b->n_recs; i++)
        if (b->recs[i].line && zt_buf_append(&all, b->recs[i].line, strlen(b->recs[i].line))) {
            zt_buf_free(&all);
            return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing %s", b->g->o->output);
        }
    zt_status st = zt_atomic_write(b->g->o->output, all.data ? all.data : "", all.len, err);
    zt_buf_free(&all);
    if (st == ZT_OK) unlink(b->partial_path);
    return st;
}

/* ---- the scheduler --------------------------------------------------------------------------- */

/* The answer's text: the generated ids without a final stop id, cut at the first stop text (the
 * template's answer suffix, --stop). *stopped: one was found. */
static zt_status answer_text(gen_run *g, const record *r, const slot *s, char **text, size_t *len, int *stopped,
                             zt_error *err)
{
    int32_t end = s->length;
    if (end > s->n_prompt && gen_is_stop_id(g, s->ids[end - 1])) end--;
    *stopped = 0;
    if (!g->have_tok) { /* prompt_ids records without a tokenizer: their answer is output_ids */
        *len = 0;
        return (*text = strdup("")) ? ZT_OK : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    }
    zt_status st = gen_tokenizer_decode(&g->tok, s->ids[s->n_prompt - 1], s->ids + s->n_prompt,
                                        (size_t)(end - s->n_prompt), text, len, err);
    if (st != ZT_OK) return st;
    size_t cut = gen_stop_text_at(g, r->stops, r->n_stops, *text, 0, *len);
    *stopped = cut < *len;
    *len = cut;
    return ZT_OK;
}

static void slot_clear(slot *s)
{
    free(s->ids);
    zt_sampler_free(&s->sampler);
    memset(s, 0, sizeof *s);
    s->rec = -1;
}

/* Frees a finished sequence's cache, counting the slots it wasted. */
static zt_status release(batch *b, int32_t seq, int finished, zt_error *err)
{
    gen_model *m = &b->g->model;
    zt_kv_stats k;
    if (finished && gen_model_kv_stats(m, seq, &k, err) == ZT_OK) {
        b->finished++;
        b->finished_slots += k.slots;
        b->finished_tokens += k.tokens;
    }
    zt_status st = m->attention.ops->kv_reset(m->attention.state, m->kv, seq);
    return st == ZT_OK ? ZT_OK : zt_plugin_failed(m->attention_lp, st, err, "kv_reset(%d)", (int)seq);
}

static zt_status reserve(gen_model *m, const int32_t *seqs, int32_t n, int32_t n_new, zt_error *err)
{
    const zt_attention_ops *ops = m->attention.ops;
    if (ops->struct_size < ZT_ATTENTION_OPS_SIZE_1_3 || !ops->kv_reserve) return ZT_OK;
    zt_status st = ops->kv_reserve(m->attention.state, m->kv, seqs, n, n_new);
    if (st == ZT_OK) return ZT_OK;
    return zt_plugin_failed(m->attention_lp, st, err, "kv_reserve(%d sequences, %d tokens)", (int)n, (int)n_new);
}

/* After a sequence's new token: finished (a stop id, a stop text, max new tokens, the context) is
 * answered and its slot freed. */
static zt_status after_token(batch *b, int32_t seq, slot *s, zt_error *err)
{
    gen_run *g = b->g;
    const record *r = &b->recs[s->rec];
    int32_t generated = s->length - s->n_prompt, context = g->model.info->max_seq_len;
    const char *reason = gen_is_stop_id(g, s->ids[s->length - 1]) ? "stop"
                       : generated >= r->max_new_tokens ? "length"
                       : s->length >= context ? "context" : NULL;
    char *text = NULL;
    size_t len = 0;
    int stopped = 0;
    if (!reason && !g->n_stop_texts && !r->n_stops) return ZT_OK;
    zt_status st = answer_text(g, r, s, &text, &len, &stopped, err);
    if (st == ZT_OK && (reason || stopped)) {
        st = answer(b, s->rec, text, len, s->ids + s->n_prompt, s->n_prompt, generated, reason ? reason : "stop",
                    zt_now_s() - s->started, err);
        if (st == ZT_OK) st = release(b, seq, 1, err);
        slot_clear(s);
    }
    free(text);
    return st;
}

/* Tokenizes record i into slot s; a bad record is answered with its error (returns 1). */
static int start_record(batch *b, int64_t i, slot *s, zt_error *err, zt_status *st)
{
    gen_run *g = b->g;
    record *r = &b->recs[i];
    int32_t n_bos = 0, context = g->model.info->max_seq_len;
    *st = ZT_OK;
    if (!r->error && !r->ids && !g->have_tok)
        r->error = printf_alloc("record %lld is text, but no tokenizer is known to turn it into tokens: give -t FILE or "
                                "--data DIR, or give the prompt as {\"prompt_ids\": [...]}", (long long)i + 1);
    if (!r->error && r->n_stops && !g->have_tok)
        r->error = printf_alloc("record %lld: \"stop\" ends the answer's text, but no tokenizer is known to give one: "
                                "give -t FILE or --data DIR", (long long)i + 1);
    if (!r->error && !r->raw && !g->have_tpl)
        r->error = printf_alloc("record %lld is an Alpaca record (\"instruction\"), but --raw turns the template "
                                "off: remove --raw, or give {\"prompt\": TEXT}", (long long)i + 1);
    if (!r->error) {
        zt_error enc = {0};
        if (r->ids && (s->ids = malloc((size_t)r->n_ids * sizeof *s->ids))) {
            memcpy(s->ids, r->ids, (size_t)r->n_ids * sizeof *s->ids);
            s->n_prompt = r->n_ids;
        }
        if (r->ids && !s->ids)
            r->error = printf_alloc("record %lld: out of memory for its %d prompt ids", (long long)i + 1, (int)r->n_ids);
        else if (!r->ids && gen_encode_prompt(g, r->prompt, r->input, r->raw, &s->ids, &s->n_prompt, &n_bos, &enc) != ZT_OK)
            r->error = printf_alloc("record %lld: %s", (long long)i + 1, enc.msg);
        else if (s->n_prompt >= context)
            r->error = printf_alloc("record %lld: the prompt is %d tokens, but the model reads at most %d "
                                    "(max_position_embeddings), which leaves no room for an answer: shorten it",
                                    (long long)i + 1, (int)s->n_prompt, (int)context);
    }
    if (r->error) {
        free(s->ids);
        s->ids = NULL;
        *st = answer(b, i, NULL, 0, NULL, 0, 0, NULL, 0, err);
        return 1;
    }
    int32_t *grown = realloc(s->ids, (size_t)context * sizeof *grown);
    if (!grown) {
        *st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for record %lld", (long long)i + 1);
        return 1;
    }
    s->ids = grown;
    s->length = s->n_prompt;
    /* A seed of its own: the same answer whatever ran beside it. */
    uint64_t seed = zt_mix64((g->s->seed_given ? g->s->seed : (uint64_t)g->settings.seed) + (uint64_t)(i + 1) *
                             ZT_GOLDEN_GAMMA);
    if (r->has_seed) seed = r->seed; /* the record's own: the answer --prompt ... --seed S gives */
    *st = zt_sampler_init(&s->sampler, g->model.info->vocab_size, r->temperature, r->top_k, r->top_p, seed, err);
    s->rec = i;
    return 0;
}

/* Samples the next token of slot s from logits row `row`. */
static void sample(gen_run *g, slot *s, const float *logits, float *masked)
{
    int32_t V = g->model.info->vocab_size, n_draw = gen_n_draw(g);
    memcpy(masked, logits, (size_t)V * sizeof *masked);
    for (int32_t v = n_draw; v < V; v++) masked[v] = -INFINITY; /* ids the tokenizer lacks */
    s->ids[s->length++] = zt_sampler_next(&s->sampler, masked);
}

/* Runs n_new tokens of each of the n slots seqs[] (gen_model_run) and appends each slot's next token:
 * drawn on the device with the slot's own next u (m->device_sampling), else by its host sampler. */
static zt_status run_and_sample(gen_run *g, slot *slots, const int32_t *seqs, int32_t n, const int32_t *tokens,
                                int32_t n_new, const int32_t *start, float *masked, zt_error *err)
{
    gen_model *m = &g->model;
    int32_t V = m->info->vocab_size;
    if (!m->device_sampling) {
        zt_status st = gen_model_run(m, seqs, n, tokens, n_new, start, err);
        for (int32_t k = 0; k < n && st == ZT_OK; k++) sample(g, &slots[seqs[k]], m->logits + (int64_t)k * V, masked);
        return st;
    }
    int32_t n_draw = gen_n_draw(g);
    for (int32_t k = 0; k < n; k++) m->sample_rows[k] = gen_sample_row(&slots[seqs[k]].sampler);
    zt_status st = gen_model_run_sampled(m, seqs, n, tokens, n_new, start, m->sample_rows, n_draw, m->sampled, err);
    for (int32_t k = 0; k < n && st == ZT_OK; k++) {
        slot *s = &slots[seqs[k]];
        s->ids[s->length++] = m->sampled[k];
    }
    return st;
}

zt_status gen_batch_run(gen_run *g, zt_error *err)
{
    batch b = {.g = g, .started = zt_now_s()};
    gen_model *m = &g->model;
    const zt_generate_options *o = g->o;
    int32_t max_seqs = (int32_t)g->settings.generate_max_seqs, context = m->info->max_seq_len;
    const zt_attention_ops *ops = m->attention.ops;
    if (!ops->kv_reset) max_seqs = 1;
    snprintf(b.partial_path, sizeof b.partial_path, "%s.partial", o->output);
    zt_status st = read_records(&b, o->prompts, err);
    if (st == ZT_OK) st = resume(&b, err);
    if (st == ZT_OK && !(b.partial = fopen(b.partial_path, "a")))
        st = zt_error_set(err, ZT_ERR_IO, "cannot write %s: %s", b.partial_path, strerror(errno));
    int32_t seq_tokens = (int32_t)(context < 1 ? 1 : context);
    if (st == ZT_OK) st = gen_model_prepare(m, max_seqs, seq_tokens, err);
    slot *slots = calloc((size_t)max_seqs, sizeof *slots);
    int64_t *queue = calloc((size_t)b.n_recs + 1, sizeof *queue);
    int32_t *seqs = calloc((size_t)max_seqs, sizeof *seqs), *tokens = calloc((size_t)max_seqs, sizeof *tokens),
            *start = calloc((size_t)max_seqs, sizeof *start);
    float *masked = malloc((size_t)m->info->vocab_size * sizeof *masked);
    if (st == ZT_OK && (!slots || !queue || !seqs || !tokens || !start || !masked))
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for %d sequences", (int)max_seqs);
    int64_t head = 0, tail = 0, admitted = 0; /* queue[head, tail): records to run, in order */
    for (int64_t i = 0; st == ZT_OK && i < b.n_recs; i++)
        if (!b.recs[i].line) queue[tail++] = i;
    for (int32_t i = 0; slots && i < max_seqs; i++) slots[i].rec = -1;
    zt_log(ZT_LOG_INFO, "%lld records to answer from %s, up to %d at once (generate.max_seqs), %s", (long long)(tail - head),
           o->prompts, (int)max_seqs, g->s->temperature == 0 ? "greedy" : "sampled with a seed per record");
    /* Warm-up with a typical prompt (records are tokenized as they are admitted). */
    if (st == ZT_OK) st = gen_model_warmup(m, 128, gen_n_draw(g), err);
    gen_stats_begin(&g->stats); /* after reading the records and creating the cache, as the peer's clock */
    while (st == ZT_OK) {
        int32_t running = 0;
        for (int32_t i = 0; i < max_seqs; i++) running += slots[i].rec >= 0;
        /* Admit waiting records while a slot and the cache's room allow. */
        for (int32_t i = 0; i < max_seqs && head < tail && st == ZT_OK; i++) {
            slot *s = &slots[i];
            if (s->rec >= 0) continue;
            int64_t r = queue[head];
            if (start_record(&b, r, s, err, &st)) {
                head++;
                i--; /* the slot is still free */
                continue;
            }
            if (st != ZT_OK) break;
            int32_t cached = 0;
            if (ops->struct_size >= ZT_ATTENTION_OPS_SIZE_1_3 && ops->kv_prefix) {
                st = ops->kv_prefix(m->attention.state, m->kv, i, s->ids, s->n_prompt, &cached);
                if (st != ZT_OK) st = zt_plugin_failed(m->attention_lp, st, err, "kv_prefix");
            }
            zt_error room = {0};
            if (st == ZT_OK && reserve(m, &i, 1, s->n_prompt - cached, &room) != ZT_OK) {
                st = release(&b, i, 0, err);
                if (st == ZT_OK && running == 0) { /* alone and still no room: it never fits */
                    b.recs[r].error = printf_alloc("record %lld: the KV cache cannot hold its prompt of %d tokens even "
                                                   "alone (raise paged.kv_budget): %s", (long long)r + 1,
                                                   (int)s->n_prompt, room.msg);
                    st = answer(&b, r, NULL, 0, NULL, 0, 0, NULL, 0, err);
                    head++;
                    i--;
                }
                slot_clear(s);
                if (running > 0) break; /* wait for a running sequence to finish */
                continue;
            }
            head++;
            s->started = zt_now_s();
            s->admitted = admitted++;
            int32_t n_run = s->n_prompt - cached;
            double t0 = zt_now_s();
            if (st == ZT_OK) st = run_and_sample(g, slots, &i, 1, s->ids + cached, n_run, &cached, masked, err);
            g->stats.prefill_s += zt_now_s() - t0;
            g->stats.prefills++;
            if (st == ZT_OK) {
                gen_stats_first_token(&g->stats, s->started);
                running++;
                if (running > g->stats.peak_concurrent) g->stats.peak_concurrent = running;
                st = after_token(&b, i, s, err);
                if (s->rec < 0) running--;
            }
        }
        if (st != ZT_OK) break;
        int32_t n = 0;
        for (int32_t i = 0; i < max_seqs; i++)
            if (slots[i].rec >= 0) seqs[n++] = i;
        if (n == 0) {
            if (head >= tail) break;
            continue;
        }
        /* Room for one more token each; else preempt the sequence admitted last and try again. */
        zt_error room = {0};
        while (st == ZT_OK && reserve(m, seqs, n, 1, &room) != ZT_OK) {
            int32_t last = 0;
            for (int32_t k = 1; k < n; k++)
                if (slots[seqs[k]].admitted > slots[seqs[last]].admitted) last = k;
            slot *s = &slots[seqs[last]];
            if (n == 1) { /* alone and still no room */
                b.recs[s->rec].error = printf_alloc("record %lld: the KV cache cannot hold it even alone at %d "
                                                    "tokens (raise paged.kv_budget): %s", (long long)s->rec + 1,
                                                    (int)s->length, room.msg);
                st = answer(&b, s->rec, NULL, 0, NULL, 0, 0, NULL, 0, err);
            } else {
                zt_log(ZT_LOG_WARN, "KV cache full: record %lld is preempted (its blocks are freed) and starts again "
                       "later", (long long)s->rec + 1);
                queue[--head] = s->rec;
            }
            if (st == ZT_OK) st = release(&b, seqs[last], 0, err);
            slot_clear(s);
            seqs[last] = seqs[--n];
            memset(&room, 0, sizeof room);
            if (n == 0) break;
        }
        if (st != ZT_OK || n == 0) continue;
        for (int32_t k = 0; k < n; k++) {
            slot *s = &slots[seqs[k]];
            tokens[k] = s->ids[s->length - 1];
            start[k] = s->length - 1;
        }
        double t0 = zt_now_s();
        st = run_and_sample(g, slots, seqs, n, tokens, 1, start, masked, err);
        g->stats.decode_s += zt_now_s() - t0;
        g->stats.decode_steps++;
        for (int32_t k = 0; k < n && st == ZT_OK; k++) st = after_token(&b, seqs[k], &slots[seqs[k]], err);
        progress(&b, 0);
    }
    g->stats.finished = zt_now_s();
    if (st == ZT_OK) {
        progress(&b, 1);
        gen_model_log_kv(m, b.finished, b.finished_slots, b.finished_tokens);
    }
    if (b.partial && fclose(b.partial) != 0 && st == ZT_OK)
        st = zt_error_set(err, ZT_ERR_IO, "cannot write %s: %s", b.partial_path, strerror(errno));
    if (st == ZT_OK) st = write_output(&b, err);
    int64_t errors = 0;
    for (int64_t i = 0; i < b.n_recs; i++) errors += b.recs[i].error != NULL;
    if (st == ZT_OK)
        zt_log(errors ? ZT_LOG_WARN : ZT_LOG_INFO, "wrote %lld answers to %s%s", (long long)b.n_recs, o->output,
               errors ? " (some are error lines: see above)" : "");
    for (int32_t i = 0; slots && i < max_seqs; i++) slot_clear(&slots[i]);
    for (int64_t i = 0; b.recs && i < b.n_recs; i++) {
        free(b.recs[i].id_json);
        free(b.recs[i].prompt);
        free(b.recs[i].input);
        free(b.recs[i].ids);
        free(b.recs[i].error);
        for (int k = 0; k < b.recs[i].n_stops; k++) free(b.recs[i].stops[k]);
        free(b.recs[i].line);
    }
    free(b.recs);
    free(slots);
    free(queue);
    free(seqs);
    free(tokens);
    free(start);
    free(masked);
    return st;
}
