/* Tokenization on worker threads, results taken back in input order.
 *
 * The main thread reads records into batches (input.c) and submits each full batch; workers take
 * batches in submission order and turn every record into one sample (tokens + loss mask); the main
 * thread drains finished batches strictly in submission order and appends the kept samples to the
 * spill file. Every sample depends on its record alone, so the output is identical for any number
 * of threads.
 *
 * One sample: [BOS] + prompt ids + answer ids + EOS, where prompt and answer are tokenized
 * separately (never a substring of one tokenization) and only answer ids and EOS carry loss.
 * With history, each earlier turn contributes its prompt and answer the same way; earlier answers
 * carry loss only with --history-loss.
 */
#define _POSIX_C_SOURCE 200809L
#include "prep.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A batch is handed to the workers once it holds this many records or text bytes. */
#define BATCH_MAX_RECORDS 256
#define BATCH_MAX_TEXT (512u * 1024u)

enum batch_state { BATCH_FREE, BATCH_FILLING, BATCH_QUEUED, BATCH_WORKING, BATCH_DONE };

typedef struct progress {
    int on_tty;        /* redraw one line with \r */
    int enabled;
    double start, last_shown;
    uint64_t total_bytes;
} progress;

struct prep_pipeline {
    const prep_options *opt;
    const zt_template *tpl;
    prep_tokenizer *tok;
    prep_sink *sink;

    prep_batch *ring;
    int *state;
    uint64_t n_ring;
    uint64_t next_fill;   /* sequence number of the batch being filled */
    uint64_t next_work;   /* next batch a worker takes */
    uint64_t next_drain;  /* next batch the main thread drains */
    int stopping;

    pthread_mutex_t lock;
    pthread_cond_t work_ready; /* a batch was queued, or stopping */
    pthread_cond_t work_done;  /* a batch finished */
    pthread_t *threads;
    int n_threads;

    progress prog;
    uint64_t records_drained;
    uint64_t input_done;

    /* Digests of the kept samples so far (main thread only): open addressing, {0, 0} = empty,
     * at most half full. */
    uint64_t (*seen)[2];
    size_t n_seen, n_seen_slots;
};

/* ---- one record -> one sample ----------------------------------------------------------------- */

typedef struct worker_scratch {
    prep_buf text;   /* rendered prompt or answer */
    int32_t *ids;    /* encoder output */
    size_t cap_ids;
} worker_scratch;

static void batch_push(prep_batch *b, int32_t id, uint8_t loss)
{
    if (b->n_ids == b->cap_ids) {
        b->cap_ids = b->cap_ids ? b->cap_ids * 2 : 65536;
        b->ids = prep_xrealloc(b->ids, b->cap_ids * sizeof *b->ids, "batch token ids");
        b->mask = prep_xrealloc(b->mask, b->cap_ids, "batch loss mask");
    }
    b->ids[b->n_ids] = id;
    b->mask[b->n_ids] = loss;
    b->n_ids++;
}

static zt_status encode_into(prep_tokenizer *tok, worker_scratch *w, prep_batch *b,
                             const char *text, size_t len, uint8_t loss, zt_error *err)
{
    size_t n = 0;
    zt_status st = prep_tokenizer_encode(tok, text, len, &w->ids, &w->cap_ids, &n, err);
    if (st != ZT_OK) return st;
    const uint32_t vocab = (uint32_t)tok->info.vocab_size;
    if (b->n_ids + n > b->cap_ids) {
        while (b->n_ids + n > b->cap_ids) b->cap_ids = b->cap_ids ? b->cap_ids * 2 : 65536;
        b->ids = prep_xrealloc(b->ids, b->cap_ids * sizeof *b->ids, "batch token ids");
        b->mask = prep_xrealloc(b->mask, b->cap_ids, "batch loss mask");
    }
    /* Copy first, check once: the check is for a broken plugin, not for data. */
    int32_t *to = b->ids + b->n_ids;
    uint32_t outside = 0;
    for (size_t i = 0; i < n; i++) {
        to[i] = w->ids[i];
        outside |= (uint32_t)w->ids[i] >= vocab;
    }
    if (outside) {
        for (size_t i = 0; i < n; i++)
            if ((uint32_t)w->ids[i] >= vocab)
                return zt_error_set(err, ZT_ERR_INTERNAL,
                                    "the tokenizer returned id %d, outside its vocabulary of %d",
                                    w->ids[i], (int)vocab);
    }
    memset(b->mask + b->n_ids, loss, n);
    b->n_ids += n;
    return ZT_OK;
}

/* 128 bits of two independent multiply-rotate lanes over (id, loss) words, finished with
 * MurmurHash3's fmix64: not cryptographic, but for data that is not built to collide two different
 * samples share a digest with a probability near 2^-128. */
static uint64_t fmix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static void sample_digest(const int32_t *ids, const uint8_t *mask, size_t n, uint64_t out[2])
{
    uint64_t a = 0x243f6a8885a308d3ull, b = 0x13198a2e03707344ull;
    /* Two (id, loss) words per step: an id has at most 31 bits, so id << 1 | loss fits 32. */
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        uint64_t x = ((uint64_t)(uint32_t)ids[i] << 1 | mask[i]) |
                     ((uint64_t)(uint32_t)ids[i + 1] << 1 | mask[i + 1]) << 32;
        a = (a ^ x) * 0x9e3779b97f4a7c15ull;
        a ^= a >> 29;
        b = (b + x) * 0xc2b2ae3d27d4eb4full;
        b = b << 31 | b >> 33;
    }
    if (i < n) {
        uint64_t x = (uint64_t)(uint32_t)ids[i] << 1 | mask[i];
        a = (a ^ x) * 0x9e3779b97f4a7c15ull;
        b = (b + x) * 0xc2b2ae3d27d4eb4full;
    }
    out[0] = fmix64(a ^ n) | 1; /* never {0, 0}, the empty slot */
    out[1] = fmix64(b + n * 0x9e3779b97f4a7c15ull);
}

static int only_whitespace(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r') return 0;
    return 1;
}

/* Cut an over-long sample to max_len (docs/zt-prep.md, "Over-long samples"):
 *  1. keep BOS;
 *  2. drop prompt tokens from the left (oldest history first, then the start of the instruction)
 *     until the sample fits, but keep at least min(prompt, max_len / 4) prompt tokens so the
 *     answer keeps some context;
 *  3. if it still does not fit, cut the response from the right (its EOS goes first). */
static void truncate_sample(int32_t *ids, uint8_t *mask, uint32_t n_bos, uint32_t prompt_len,
                            uint32_t response_len, uint32_t max_len, uint32_t *kept_prompt,
                            uint32_t *kept_response)
{
    uint32_t budget = max_len - n_bos;
    uint32_t min_prompt = prompt_len < max_len / 4 ? prompt_len : max_len / 4;
    uint32_t keep_p, keep_r;
    if (budget >= response_len && budget - response_len >= min_prompt) {
        keep_r = response_len;
        keep_p = budget - response_len < prompt_len ? budget - response_len : prompt_len;
    } else {
        keep_p = min_prompt;
        keep_r = budget - keep_p;
    }
    uint32_t from = n_bos + prompt_len - keep_p; /* first prompt token kept */
    memmove(ids + n_bos, ids + from, (size_t)(keep_p + keep_r) * sizeof *ids);
    memmove(mask + n_bos, mask + from, (size_t)(keep_p + keep_r));
    *kept_prompt = keep_p;
    *kept_response = keep_r;
}

static zt_status build_sample(const prep_pipeline *p, worker_scratch *w, prep_batch *b,
                              const prep_record *r, prep_result *res, zt_error *err)
{
    const zt_template *tpl = p->tpl;
    const zt_tokenizer_info *info = &p->tok->info;
    const char *arena = b->text.data;
    memset(res, 0, sizeof *res);
    res->ids_off = b->n_ids;

    if (only_whitespace(arena + r->output.off, r->output.len)) {
        res->outcome = PREP_DROPPED;
        res->drop_reason = PREP_DROP_EMPTY_OUTPUT;
        return ZT_OK;
    }

    const uint8_t history_loss = (uint8_t)(p->opt->history_loss != 0);
    const int has_bos = info->bos_id >= 0;
    if (has_bos) batch_push(b, info->bos_id, 0);

    /* The default system text follows the first turn's variant (Alpaca has two preambles). */
    const uint32_t n_turns = r->n_turns + 1;
    const prep_span *turns = b->turns + 2 * (size_t)r->first_turn;
    int first_has_input = r->n_turns ? 0 : r->input.len > 0;
    const char *system = first_has_input ? tpl->system : tpl->system_no_input;
    size_t system_len = strlen(system);
    if (r->has_system) {
        system = arena + r->system.off;
        system_len = r->system.len;
    }

    uint64_t prompt_end = 0;
    zt_status st = ZT_OK;
    for (uint32_t t = 0; t < n_turns && st == ZT_OK; t++) {
        const int last = t + 1 == n_turns;
        prep_span user = last ? r->instruction : turns[2 * t];
        prep_span input = last ? r->input : (prep_span){0, 0};
        prep_span answer = last ? r->output : turns[2 * t + 1];

        w->text.len = 0;
        if (t > 0) prep_buf_append(&w->text, tpl->turn_separator, strlen(tpl->turn_separator));
        if (zt_template_render_prompt(tpl, &w->text, t == 0 ? system : NULL, system_len, arena + user.off,
                                      user.len, arena + input.off, input.len) != 0)
            prep_out_of_memory("a rendered prompt");
        st = encode_into(p->tok, w, b, w->text.data, w->text.len, 0, err);
        if (st != ZT_OK) break;
        if (last) prompt_end = b->n_ids;

        const uint8_t loss = last ? 1 : history_loss;
        if (tpl->answer_suffix[0]) {
            w->text.len = 0;
            prep_buf_append(&w->text, arena + answer.off, answer.len);
            prep_buf_append(&w->text, tpl->answer_suffix, strlen(tpl->answer_suffix));
            st = encode_into(p->tok, w, b, w->text.data, w->text.len, loss, err);
        } else {
            st = encode_into(p->tok, w, b, arena + answer.off, answer.len, loss, err);
        }
        if (!last && tpl->turn_tokens != ZT_TURN_NONE) {
            batch_push(b, info->eos_id, loss);
            if (tpl->turn_tokens == ZT_TURN_EOS_BOS && has_bos) batch_push(b, info->bos_id, 0);
        }
    }
    if (st != ZT_OK) return st;
    batch_push(b, info->eos_id, 1);
    sample_digest(b->ids + res->ids_off, b->mask + res->ids_off, b->n_ids - res->ids_off, res->digest);

    const uint32_t n_bos = has_bos ? 1 : 0;
    uint64_t total = b->n_ids - res->ids_off;
    uint32_t prompt_len = (uint32_t)(prompt_end - res->ids_off - n_bos);
    uint32_t response_len = (uint32_t)(b->n_ids - prompt_end);
    res->full_len = total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
    const uint32_t max_len = (uint32_t)p->opt->max_len;
    if (total > max_len) {
        if (p->opt->overlong == PREP_OVERLONG_DROP) {
            b->n_ids = res->ids_off;
            res->outcome = PREP_DROPPED;
            res->drop_reason = PREP_DROP_OVERLONG;
            return ZT_OK;
        }
        uint32_t keep_p, keep_r;
        truncate_sample(b->ids + res->ids_off, b->mask + res->ids_off, n_bos, prompt_len,
                        response_len, max_len, &keep_p, &keep_r);
        res->truncation = keep_r < response_len ? PREP_TRUNC_RESPONSE : PREP_TRUNC_PROMPT;
        b->n_ids = res->ids_off + n_bos + keep_p + keep_r;
    }
    res->len = (uint32_t)(b->n_ids - res->ids_off);
    uint32_t n_loss = 0; /* a local sum: the compiler vectorizes it */
    for (uint64_t i = res->ids_off; i < b->n_ids; i++) n_loss += b->mask[i];
    res->n_loss = n_loss;
    if (res->n_loss == 0) {
        b->n_ids = res->ids_off;
        res->len = 0;
        res->outcome = PREP_DROPPED;
        res->drop_reason = PREP_DROP_NO_LOSS_TOKENS;
        return ZT_OK;
    }
    res->outcome = PREP_KEPT;
    return ZT_OK;
}

static void tokenize_batch(prep_pipeline *p, worker_scratch *w, prep_batch *b)
{
    zt_error err;
    zt_error_clear(&err);
    b->n_ids = 0;
    if (b->cap_results < b->n_recs) {
        b->cap_results = b->cap_recs;
        b->results = prep_xrealloc(b->results, b->cap_results * sizeof *b->results, "results");
    }
    for (size_t i = 0; i < b->n_recs; i++) {
        zt_status st = build_sample(p, w, b, &b->recs[i], &b->results[i], &err);
        if (st != ZT_OK) {
            b->status = st;
            b->error = prep_xstrdup(err.msg);
            return;
        }
    }
}

static void *worker_main(void *arg)
{
    prep_pipeline *p = arg;
    worker_scratch w;
    memset(&w, 0, sizeof w);
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->stopping && p->next_work == p->next_fill) pthread_cond_wait(&p->work_ready, &p->lock);
        if (p->next_work == p->next_fill) break; /* stopping and nothing queued */
        uint64_t seq = p->next_work++;
        prep_batch *b = &p->ring[seq % p->n_ring];
        p->state[seq % p->n_ring] = BATCH_WORKING;
        pthread_mutex_unlock(&p->lock);
        tokenize_batch(p, &w, b);
        pthread_mutex_lock(&p->lock);
        p->state[seq % p->n_ring] = BATCH_DONE;
        pthread_cond_broadcast(&p->work_done);
    }
    pthread_mutex_unlock(&p->lock);
    prep_buf_free(&w.text);
    free(w.ids);
    return NULL;
}

/* ---- progress ------------------------------------------------------------------------------------ */

static void format_duration(double s, char *out, size_t cap)
{
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(out, cap, "%ld:%02ld", t / 60, t % 60);
}

static void progress_show(prep_pipeline *p, int final)
{
    progress *g = &p->prog;
    if (!g->enabled) return;
    double now = zt_now_s();
    double interval = g->on_tty ? 0.2 : 5.0;
    if (!final && now - g->last_shown < interval) return;
    g->last_shown = now;
    double elapsed = now - g->start;
    double frac = g->total_bytes ? (double)p->input_done / (double)g->total_bytes : 1.0;
    if (frac > 1.0) frac = 1.0;
    double rate = elapsed > 0 ? (double)p->records_drained / elapsed : 0.0;
    char eta[32] = "?";
    if (frac > 0.001) format_duration(elapsed * (1.0 - frac) / frac, eta, sizeof eta);
    if (g->on_tty) {
        char bar[31];
        int fill = (int)(frac * 30.0);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r[%s] %5.1f%%  %llu records  %.0f records/s  ETA %s   ", bar, frac * 100.0,
                (unsigned long long)p->records_drained, rate, eta);
        if (final) fputc('\n', stderr);
        fflush(stderr);
    } else if (!final) {
        prep_info("%.1f%% of input read, %llu records tokenized (%.0f records/s), ETA %s",
                  frac * 100.0, (unsigned long long)p->records_drained, rate, eta);
    }
}

/* ---- draining -------------------------------------------------------------------------------- */

/* 1 when a sample with this digest was kept before; else remembers it and returns 0. */
static int seen_before(prep_pipeline *p, const uint64_t d[2])
{
    if (2 * (p->n_seen + 1) > p->n_seen_slots) {
        size_t n_slots = p->n_seen_slots ? 2 * p->n_seen_slots : 1 << 14;
        /* Zeroed by writing, not calloc: probing calloc'ed zero pages maps the shared zero page,
         * and the first store then has to replace it, flushing the TLBs of the worker cores. */
        uint64_t (*slots)[2] = malloc(n_slots * sizeof *slots);
        if (!slots) prep_out_of_memory("the digests that find duplicate samples");
        memset(slots, 0, n_slots * sizeof *slots);
        for (size_t i = 0; i < p->n_seen_slots; i++) {
            if (!p->seen[i][0]) continue;
            size_t k = (size_t)p->seen[i][1] & (n_slots - 1);
            while (slots[k][0]) k = (k + 1) & (n_slots - 1);
            slots[k][0] = p->seen[i][0];
            slots[k][1] = p->seen[i][1];
        }
        free(p->seen);
        p->seen = slots;
        p->n_seen_slots = n_slots;
    }
    size_t k = (size_t)d[1] & (p->n_seen_slots - 1);
    while (p->seen[k][0]) {
        if (p->seen[k][0] == d[0] && p->seen[k][1] == d[1]) return 1;
        k = (k + 1) & (p->n_seen_slots - 1);
    }
    p->seen[k][0] = d[0];
    p->seen[k][1] = d[1];
    p->n_seen++;
    return 0;
}

static zt_status drain_batch(prep_pipeline *p, prep_batch *b, zt_error *err)
{
    if (b->status != ZT_OK) {
        zt_error_set(err, b->status, "%s", b->error);
        return b->status;
    }
    prep_sink *s = p->sink;
    prep_stats *stats = s->stats;
    for (size_t i = 0; i < b->n_recs; i++) {
        const prep_result *r = &b->results[i];
        if (r->full_len > stats->longest) stats->longest = r->full_len;
        if (r->outcome == PREP_DROPPED) {
            stats->dropped[r->drop_reason]++;
            continue;
        }
        if (seen_before(p, r->digest)) {
            stats->duplicates++;
            if (p->opt->dedup) {
                stats->dropped[PREP_DROP_DUPLICATE]++;
                continue;
            }
        }
        stats->kept++;
        if (r->truncation) stats->truncated[r->truncation]++;
        if (s->n_samples == s->cap_samples) {
            s->cap_samples = s->cap_samples ? s->cap_samples * 2 : 4096;
            s->samples = prep_xrealloc(s->samples, s->cap_samples * sizeof *s->samples, "sample index");
        }
        s->samples[s->n_samples++] = (prep_sample){s->spill_bytes, r->len, r->n_loss};
        const int32_t *ids = b->ids + r->ids_off;
        size_t wrote;
        if (s->token_bytes == 2) {
            uint16_t buf[1024];
            wrote = 0;
            for (uint32_t k = 0; k < r->len;) {
                uint32_t m = r->len - k < 1024 ? r->len - k : 1024;
                for (uint32_t q = 0; q < m; q++) buf[q] = (uint16_t)ids[k + q];
                wrote += fwrite(buf, 2, m, s->spill);
                k += m;
            }
        } else {
            wrote = fwrite(ids, 4, r->len, s->spill);
        }
        wrote += fwrite(b->mask + r->ids_off, 1, r->len, s->spill);
        if (wrote != 2 * (size_t)r->len)
            return zt_error_set(err, ZT_ERR_IO, "cannot write the temporary sample file (disk full?)");
        s->spill_bytes += (uint64_t)r->len * (s->token_bytes + 1);
    }
    p->records_drained += b->n_recs;
    p->input_done = b->input_done;
    progress_show(p, 0);
    return ZT_OK;
}

static void batch_reset(prep_batch *b)
{
    b->text.len = 0;
    b->n_recs = 0;
    b->n_turns = 0;
    b->n_ids = 0;
    b->status = ZT_OK;
    free(b->error);
    b->error = NULL;
}

/* Wait for the oldest in-flight batch, drain it and free its slot. */
static zt_status drain_oldest(prep_pipeline *p, zt_error *err)
{
    uint64_t seq = p->next_drain;
    pthread_mutex_lock(&p->lock);
    while (p->state[seq % p->n_ring] != BATCH_DONE) pthread_cond_wait(&p->work_done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    prep_batch *b = &p->ring[seq % p->n_ring];
    zt_status st = drain_batch(p, b, err);
    batch_reset(b);
    p->state[seq % p->n_ring] = BATCH_FREE;
    p->next_drain++;
    return st;
}

zt_status prep_pipeline_start(const prep_options *opt, const zt_template *tpl,
                              prep_tokenizer *tok, prep_sink *sink, uint64_t total_input_bytes,
                              prep_pipeline **out, zt_error *err)
{
    prep_pipeline *p = calloc(1, sizeof *p);
    if (!p) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory starting the workers");
    p->opt = opt;
    p->tpl = tpl;
    p->tok = tok;
    p->sink = sink;
    p->n_threads = opt->threads;
    /* Enough batches in flight that no worker waits while the main thread drains one. */
    p->n_ring = (uint64_t)(2 * p->n_threads + 2);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work_ready, NULL);
    pthread_cond_init(&p->work_done, NULL);
    p->ring = calloc(p->n_ring, sizeof *p->ring);
    p->state = calloc(p->n_ring, sizeof *p->state);
    p->threads = calloc((size_t)p->n_threads, sizeof *p->threads);
    if (!p->ring || !p->state || !p->threads) {
        prep_pipeline_free(p);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory starting the workers");
    }
    p->state[0] = BATCH_FILLING;

    p->prog.on_tty = isatty(STDERR_FILENO);
    p->prog.enabled = opt->progress;
    p->prog.start = p->prog.last_shown = zt_now_s();
    p->prog.total_bytes = total_input_bytes;

    for (int i = 0; i < p->n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            p->n_threads = i;
            prep_pipeline_free(p);
            return zt_error_set(err, ZT_ERR_INTERNAL, "cannot start tokenizer thread %d", i);
        }
    }
    *out = p;
    return ZT_OK;
}

prep_batch *prep_pipeline_batch(prep_pipeline *p)
{
    return &p->ring[p->next_fill % p->n_ring];
}

static zt_status submit(prep_pipeline *p, uint64_t input_done, zt_error *err)
{
    prep_batch *b = prep_pipeline_batch(p);
    b->input_done = input_done;
    pthread_mutex_lock(&p->lock);
    p->state[p->next_fill % p->n_ring] = BATCH_QUEUED;
    p->next_fill++;
    pthread_cond_signal(&p->work_ready);
    pthread_mutex_unlock(&p->lock);
    /* The next slot must be free before the reader fills it. */
    if (p->next_fill - p->next_drain == p->n_ring) {
        zt_status st = drain_oldest(p, err);
        if (st != ZT_OK) return st;
    }
    p->state[p->next_fill % p->n_ring] = BATCH_FILLING;
    return ZT_OK;
}

zt_status prep_pipeline_record_done(prep_pipeline *p, uint64_t input_done, zt_error *err)
{
    prep_batch *b = prep_pipeline_batch(p);
    if (b->n_recs < BATCH_MAX_RECORDS && b->text.len < BATCH_MAX_TEXT) return ZT_OK;
    if (prep_interrupted) return zt_error_set(err, ZT_ERR_CANCELLED, "interrupted");
    return submit(p, input_done, err);
}

static void stop_workers(prep_pipeline *p)
{
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    pthread_cond_broadcast(&p->work_ready);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    p->n_threads = 0;
}

zt_status prep_pipeline_finish(prep_pipeline *p, zt_error *err)
{
    zt_status st = ZT_OK;
    if (prep_pipeline_batch(p)->n_recs) st = submit(p, p->prog.total_bytes, err);
    while (st == ZT_OK && p->next_drain < p->next_fill) st = drain_oldest(p, err);
    stop_workers(p);
    if (st == ZT_OK) {
        p->input_done = p->prog.total_bytes;
        progress_show(p, 1);
    }
    return st;
}

void prep_pipeline_free(prep_pipeline *p)
{
    if (!p) return;
    if (p->n_threads) stop_workers(p);
    for (uint64_t i = 0; p->ring && i < p->n_ring; i++) {
        prep_batch *b = &p->ring[i];
        prep_buf_free(&b->text);
        free(b->recs);
        free(b->turns);
        free(b->ids);
        free(b->mask);
        free(b->results);
        free(b->error);
    }
    free(p->ring);
    free(p->state);
    free(p->threads);
    free(p->seen);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->work_ready);
    pthread_cond_destroy(&p->work_done);
    free(p);
}
