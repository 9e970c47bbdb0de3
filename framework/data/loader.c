/* The shard loader: opens a split (every shard mapped and validated, shard.c; the manifest read,
 * manifest.c), makes the micro-batches of this rank's stream, and saves and restores its position
 * (loader.h says what it guarantees and how the stream is defined). */
#define _POSIX_C_SOURCE 200809L /* O_CLOEXEC, mmap */
#include "data/loader_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/json.h"
#include "base/log.h"
#include "base/random.h"
#include "data/shard_format.h"

/* ---- the loader -------------------------------------------------------------------------------- */

typedef struct loader_shard {
    char *path;
    void *map;
    uint64_t map_size;
    zt_shard_view view;
    uint64_t first_sample; /* index of its first sample in the split */
} loader_shard;

struct zt_loader {
    zt_loader_options opt; /* dir and split point at the copies below */
    char *dir;
    char *split;
    zt_loader_info info;
    loader_shard *shards;
    uint32_t *order;       /* P_e for e = order_epoch: sample numbers */
    uint64_t order_epoch;
    zt_loader_position pos;
    zt_loader_batch batch;
};

void zt_loader_options_default(zt_loader_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->split = "train";
    opt->micro_batch = 1;
    opt->seq_len = 2048;
    opt->packed = ZT_LOADER_LAYOUT_MANIFEST;
    opt->shuffle = 1;
    opt->seed = 1234;
    opt->world = 1;
    opt->verify_checksums = 1;
}

/* Uniform in [0, bound) without modulo bias: reject the few values below 2^64 mod bound. */
static uint64_t uniform_below(uint64_t *state, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t r = zt_splitmix64(state);
        if (r >= threshold) return r % bound;
    }
}

static void build_order(zt_loader *l, uint64_t epoch)
{
    uint64_t n = (uint64_t)l->info.n_samples;
    for (uint64_t i = 0; i < n; i++) l->order[i] = (uint32_t)i;
    if (l->opt.shuffle) {
        uint64_t epoch_state = epoch;
        uint64_t state = l->opt.seed ^ zt_splitmix64(&epoch_state);
        for (uint64_t i = n - 1; i > 0; i--) {
            uint64_t j = uniform_below(&state, i + 1);
            uint32_t t = l->order[i];
            l->order[i] = l->order[j];
            l->order[j] = t;
        }
    }
    l->order_epoch = epoch;
}

/* The first shard whose samples end after `sample` holds it (shards may be empty). */
static const loader_shard *shard_of_sample(const zt_loader *l, uint64_t sample, uint64_t *local)
{
    int64_t lo = 0, hi = l->info.n_shards - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const loader_shard *s = &l->shards[mid];
        if (s->first_sample + s->view.n_samples > sample) hi = mid;
        else lo = mid + 1;
    }
    *local = sample - l->shards[lo].first_sample;
    return &l->shards[lo];
}

static uint64_t sample_length(const zt_loader *l, uint64_t sample)
{
    uint64_t local;
    const loader_shard *s = shard_of_sample(l, sample, &local);
    return s->view.index[local + 1] - s->view.index[local];
}

/* Sample number at this rank's stream position (epoch, cursor); rebuilds the order on a new epoch. */
static uint64_t stream_sample(zt_loader *l, uint64_t epoch, uint64_t cursor)
{
    if (l->order_epoch != epoch) build_order(l, epoch);
    return l->order[cursor * (uint64_t)l->opt.world + (uint64_t)l->opt.rank];
}

/* Rows of T that rank `rank` needs for its samples of the epoch whose order is built. */
static uint64_t rows_for_rank(const zt_loader *l, int32_t rank)
{
    uint64_t per_rank = (uint64_t)l->info.samples_per_rank, T = (uint64_t)l->opt.seq_len;
    if (!l->opt.packed) return per_rank;
    uint64_t rows = 0, fill = T; /* fill == T: no open row */
    for (uint64_t c = 0; c < per_rank; c++) {
        uint64_t len = sample_length(l, l->order[c * (uint64_t)l->opt.world + (uint64_t)rank]);
        if (len > T) len = T;
        if (len > T - fill) {
            rows++;
            fill = 0;
        }
        fill += len;
    }
    return rows;
}

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static char *copy_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *c = malloc(n);
    if (c) memcpy(c, s, n);
    return c;
}

/* ---- open -------------------------------------------------------------------------------------- */

static zt_status check_options(const zt_loader_options *o, zt_error *err)
{
    if (!o->dir || !o->dir[0])
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "loader: no data set directory was given");
    if (!o->split || (strcmp(o->split, "train") != 0 && strcmp(o->split, "val") != 0))
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "loader: split must be \"train\" or \"val\", not "
                            "\"%s\"", o->split ? o->split : "(null)");
    if (o->micro_batch < 1 || o->seq_len < 2 ||
        (int64_t)o->micro_batch * o->seq_len > INT32_MAX)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "loader: micro_batch %d x seq_len %d is invalid: "
                            "micro_batch must be >= 1, seq_len >= 2 and their product < 2^31",
                            o->micro_batch, o->seq_len);
    if (o->packed != 0 && o->packed != 1 && o->packed != ZT_LOADER_LAYOUT_MANIFEST)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "loader: packed is %d; it must be 1, 0 or "
                            "ZT_LOADER_LAYOUT_MANIFEST", o->packed);
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "loader: rank %d of world %d is invalid: need "
                            "world >= 1 and 0 <= rank < world", o->rank, o->world);
    return ZT_OK;
}

static zt_status map_shard(loader_shard *s, const char *path, zt_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zt_error_set(err, errno == ENOENT ? ZT_ERR_NOT_FOUND : ZT_ERR_IO,
                            "cannot open shard %s: %s; manifest.json lists it, so the data set is "
                            "incomplete: copy the missing file or " REPREP,
                            path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return zt_error_set(err, ZT_ERR_IO, "shard %s is not a regular file", path);
    }
    s->map_size = (uint64_t)sb.st_size;
    if (s->map_size > 0) {
        s->map = mmap(NULL, (size_t)s->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (s->map == MAP_FAILED) {
            s->map = NULL;
            int e = errno;
            close(fd);
            return zt_error_set(err, ZT_ERR_IO, "cannot map shard %s (%" PRIu64 " bytes): %s", path,
                                s->map_size, strerror(e));
        }
    }
    close(fd);
    return ZT_OK;
}

static zt_status open_shards(zt_loader *l, const manifest *m, const char *manifest_path,
                             zt_error *err)
{
    int validation = strcmp(l->split, "val") == 0;
    uint64_t first_sample = 0, dataset_hash = zt_fnv1a64(ZT_FNV1A64_INIT, l->split, strlen(l->split));
    for (int64_t i = 0; i < m->n_shards; i++) {
        loader_shard *s = &l->shards[i];
        const manifest_shard *ms = &m->shards[i];
        s->path = path_join(l->dir, ms->file);
        if (!s->path) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening %s", l->dir);
        zt_status st = map_shard(s, s->path, err);
        if (st) return st;
        zt_shard_expect expect = {
            .check_tokenizer = 1,
            .check_split = 1,
            .check_file_checksum = 1,
            .validation = validation,
            .verify_checksums = l->opt.verify_checksums,
            .tokenizer_hash = m->tokenizer_hash,
            .vocab_size = (uint64_t)m->vocab_size,
            .file_checksum = ms->checksum,
        };
        st = zt_shard_validate(s->map, s->map_size, s->path, &expect, &s->view, err);
        if (st) return st;
        const char *what[4] = {"bytes", "samples", "tokens", "loss_tokens"};
        const uint64_t listed[4] = {(uint64_t)ms->bytes, (uint64_t)ms->n_samples,
                                    (uint64_t)ms->n_tokens, (uint64_t)ms->n_loss_tokens};
        const uint64_t actual[4] = {s->map_size, s->view.n_samples, s->view.n_tokens,
                                    s->view.n_loss_tokens};
        for (int k = 0; k < 4; k++)
            if (listed[k] != actual[k])
                return zt_error_set(err, ZT_ERR_FORMAT,
                                    "%s: the shard has %" PRIu64 " %s but %s records %" PRIu64 " for "
                                    "it: the file was replaced or the manifest belongs to another "
                                    "run; " REPREP,
                                    s->path, actual[k], what[k], manifest_path, listed[k]);
        zt_shard_header h;
        memcpy(&h, s->map, sizeof h);
        if (h.shard_index != (uint64_t)i)
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: header field shard_index is %u but %s lists it as \"%s\" shard "
                                "%" PRId64 ": the shards were renamed or the list reordered; " REPREP,
                                s->path, h.shard_index, manifest_path, l->split, i);
        s->first_sample = first_sample;
        first_sample += s->view.n_samples;
        l->info.n_tokens += (int64_t)s->view.n_tokens;
        l->info.n_loss_tokens += (int64_t)s->view.n_loss_tokens;
        dataset_hash = zt_fnv1a64(dataset_hash, &ms->checksum, sizeof ms->checksum);
    }
    l->info.n_samples = (int64_t)first_sample;
    l->info.dataset_hash = dataset_hash;
    return ZT_OK;
}

static zt_status alloc_buffers(zt_loader *l, zt_error *err)
{
    size_t bt = (size_t)l->opt.micro_batch * (size_t)l->opt.seq_len;
    zt_loader_batch *b = &l->batch;
    l->order = malloc((size_t)l->info.n_samples * sizeof *l->order);
    b->tokens = malloc(bt * sizeof(int32_t));
    b->targets = malloc(bt * sizeof(int32_t));
    b->positions = malloc(bt * sizeof(int32_t));
    b->doc_ids = malloc(bt * sizeof(int32_t));
    b->cu_seqlens = malloc((bt + 1) * sizeof(int32_t)); /* every span holds at least one token */
    if (!l->order || !b->tokens || !b->targets || !b->positions || !b->doc_ids || !b->cu_seqlens)
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory: the loader needs %zu bytes for "
                            "the sample order and batch buffers of %s",
                            (size_t)l->info.n_samples * 4 + bt * 20, l->dir);
    return ZT_OK;
}

zt_status zt_loader_open(const zt_loader_options *opt, zt_loader **out, zt_error *err)
{
    *out = NULL;
    zt_status st = check_options(opt, err);
    if (st) return st;
    zt_loader *l = calloc(1, sizeof *l);
    char *manifest_path = NULL;
    manifest m = {0};
    if (!l) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening %s", opt->dir);
    l->opt = *opt;
    l->dir = copy_string(opt->dir);
    l->split = copy_string(opt->split);
    manifest_path = l->dir ? path_join(l->dir, ZT_LOADER_MANIFEST) : NULL;
    if (!l->dir || !l->split || !manifest_path) {
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening %s", opt->dir);
        goto done;
    }
    l->opt.dir = l->dir;
    l->opt.split = l->split;

    st = loader_manifest_load(manifest_path, l->dir, l->split, &m, err);
    if (st) goto done;
    if (opt->tokenizer_hash && opt->tokenizer_hash != m.tokenizer_hash) {
        st = zt_error_set(err, ZT_ERR_CONFIG,
                          "%s was tokenized with tokenizer %016" PRIx64 " but this run's tokenizer is "
                          "%016" PRIx64 ": re-run zt-prep with the run's tokenizer model, or "
                          "configure the tokenizer the data was prepared with",
                          l->dir, m.tokenizer_hash, opt->tokenizer_hash);
        goto done;
    }
    if (opt->model_vocab_size && m.vocab_size > opt->model_vocab_size) {
        st = zt_error_set(err, ZT_ERR_CONFIG,
                          "%s has vocab_size %" PRId64 " (manifest tokenizer) but the model has only "
                          "%" PRId64 " embeddings: the data was tokenized for another model; re-run "
                          "zt-prep with this model's tokenizer",
                          l->dir, m.vocab_size, opt->model_vocab_size);
        goto done;
    }
    l->shards = calloc((size_t)m.n_shards, sizeof *l->shards);
    if (!l->shards) {
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening %s", l->dir);
        goto done;
    }
    l->info.n_shards = m.n_shards;
    st = open_shards(l, &m, manifest_path, err);
    if (st) goto done;

    zt_loader_info *in = &l->info;
    in->vocab_size = m.vocab_size;
    in->n_other_split_shards = m.n_other_split;
    in->tokenizer_hash = m.tokenizer_hash;
    in->bos_id = m.bos_id;
    in->eos_id = m.eos_id;
    in->pad_id = m.pad_id;
    in->pad_token = m.pad_id >= 0 ? m.pad_id : m.eos_id >= 0 ? m.eos_id : 0;
    in->manifest_layout = m.packed;
    if (l->opt.packed == ZT_LOADER_LAYOUT_MANIFEST) l->opt.packed = m.packed != 0;
    in->packed = l->opt.packed;
    if (in->n_samples == 0 || (uint64_t)in->n_samples > UINT32_MAX) {
        st = zt_error_set(err, ZT_ERR_FORMAT,
                          "split \"%s\" of %s has %" PRId64 " samples; the loader needs 1 to 2^32-1 "
                          "(re-run zt-prep on non-empty input, or split a bigger set into several)",
                          l->split, l->dir, in->n_samples);
        goto done;
    }
    in->samples_per_rank = in->n_samples / opt->world;
    in->dropped_per_epoch = in->n_samples % opt->world;
    if (in->samples_per_rank == 0) {
        st = zt_error_set(err, ZT_ERR_CONFIG,
                          "split \"%s\" of %s has %" PRId64 " samples, fewer than the %d data-parallel "
                          "ranks: each rank needs at least one; use fewer ranks or more data",
                          l->split, l->dir, in->n_samples, opt->world);
        goto done;
    }
    for (int64_t s = 0; s < in->n_shards; s++) {
        const zt_shard_view *v = &l->shards[s].view;
        for (uint64_t i = 0; i < v->n_samples; i++)
            in->n_long_samples += v->index[i + 1] - v->index[i] > (uint64_t)opt->seq_len;
    }
    st = alloc_buffers(l, err);
    if (st) goto done;
    build_order(l, 0);
    uint64_t most_rows = 0;
    for (int32_t r = 0; r < opt->world; r++) {
        uint64_t rows = rows_for_rank(l, r);
        most_rows = rows > most_rows ? rows : most_rows;
    }
    in->batches_per_epoch = (int64_t)((most_rows + (uint64_t)opt->micro_batch - 1) /
                                      (uint64_t)opt->micro_batch);
    zt_loader_rewind(l);
    if (in->n_long_samples)
        zt_log(ZT_LOG_WARN, "%s: %" PRId64 " of %" PRId64 " \"%s\" samples are longer than seq_len %d "
               "and will be truncated to it; raise seq_len or re-run zt-prep with --max-len %d",
               l->dir, in->n_long_samples, in->n_samples, l->split, opt->seq_len, opt->seq_len);

done:
    free(manifest_path);
    loader_manifest_free(&m);
    if (st) {
        zt_loader_close(l);
        return st;
    }
    *out = l;
    return ZT_OK;
}

void zt_loader_close(zt_loader *l)
{
    if (!l) return;
    for (int64_t i = 0; l->shards && i < l->info.n_shards; i++) {
        if (l->shards[i].map) munmap(l->shards[i].map, (size_t)l->shards[i].map_size);
        free(l->shards[i].path);
    }
    free(l->shards);
    free(l->order);
    free(l->batch.tokens);
    free(l->batch.targets);
    free(l->batch.positions);
    free(l->batch.doc_ids);
    free(l->batch.cu_seqlens);
    free(l->dir);
    free(l->split);
    free(l);
}

const zt_loader_info *zt_loader_info_get(const zt_loader *l) { return &l->info; }

/* ---- batches ----------------------------------------------------------------------------------- */

/* The next sample of this rank's stream, or 0 when a single pass has used all of its samples. */
static int peek_sample(zt_loader *l, uint64_t *sample)
{
    if (l->pos.cursor == (uint64_t)l->info.samples_per_rank) {
        if (l->opt.single_pass) return 0;
        l->pos.epoch++;
        l->pos.cursor = 0;
    }
    *sample = stream_sample(l, l->pos.epoch, l->pos.cursor);
    return 1;
}

typedef struct span_writer {
    zt_loader_batch *b;
    int32_t at; /* next free slot in the flat B*T stream */
} span_writer;

static void open_span(span_writer *w, int32_t len)
{
    zt_loader_batch *b = w->b;
    b->cu_seqlens[b->n_spans++] = w->at;
    if (len > b->max_span_len) b->max_span_len = len;
}

static void write_padding(zt_loader *l, span_writer *w, int32_t len)
{
    open_span(w, len);
    zt_loader_batch *b = w->b;
    for (int32_t j = 0; j < len; j++, w->at++) {
        b->tokens[w->at] = (int32_t)l->info.pad_token;
        b->targets[w->at] = ZT_LOADER_IGNORE_INDEX;
        b->positions[w->at] = j;
        b->doc_ids[w->at] = -1;
    }
}

static void write_sample(zt_loader *l, span_writer *w, uint64_t sample, int32_t len)
{
    uint64_t local;
    const loader_shard *s = shard_of_sample(l, sample, &local);
    const zt_shard_view *v = &s->view;
    uint64_t first = v->index[local];
    zt_loader_batch *b = w->b;
    int32_t doc = b->n_spans;
    open_span(w, len);
    b->n_samples++;
    for (int32_t j = 0; j < len; j++, w->at++) {
        uint64_t t = first + (uint64_t)j;
        b->tokens[w->at] = v->token_bytes == 2 ? ((const uint16_t *)v->tokens)[t]
                                               : (int32_t)((const uint32_t *)v->tokens)[t];
        b->positions[w->at] = j;
        b->doc_ids[w->at] = doc;
        int takes_loss = j + 1 < len && v->mask[t + 1];
        b->targets[w->at] = ZT_LOADER_IGNORE_INDEX;
        if (takes_loss) {
            b->targets[w->at] = v->token_bytes == 2 ? ((const uint16_t *)v->tokens)[t + 1]
                                                    : (int32_t)((const uint32_t *)v->tokens)[t + 1];
            b->n_loss_tokens++;
        }
    }
    b->n_tokens += len;
}

zt_status zt_loader_next(zt_loader *l, const zt_loader_batch **out, zt_error *err)
{
    *out = NULL;
    if (l->opt.single_pass && l->pos.batches >= (uint64_t)l->info.batches_per_epoch)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "loader: the single pass over split \"%s\" of %s is complete (%" PRId64
                            " batches); call zt_loader_rewind to start another",
                            l->split, l->dir, l->info.batches_per_epoch);
    zt_loader_batch *b = &l->batch;
    const int32_t T = l->opt.seq_len;
    b->batch = l->opt.micro_batch;
    b->seq_len = T;
    b->n_spans = b->n_samples = b->max_span_len = b->n_truncated = 0;
    b->n_tokens = b->n_loss_tokens = 0;
    span_writer w = {b, 0};
    for (int32_t row = 0; row < b->batch; row++) {
        int32_t fill = 0;
        uint64_t sample;
        while (fill < T && peek_sample(l, &sample)) {
            uint64_t full = sample_length(l, sample);
            int32_t len = full > (uint64_t)T ? T : (int32_t)full;
            if (len > T - fill) break; /* starts the next row: samples are never split */
            write_sample(l, &w, sample, len);
            b->n_truncated += full > (uint64_t)T;
            fill += len;
            l->pos.cursor++;
            if (!l->opt.packed) break;
        }
        if (fill < T) write_padding(l, &w, T - fill);
    }
    b->cu_seqlens[b->n_spans] = w.at;
    l->pos.batches++;
    *out = b;
    return ZT_OK;
}

void zt_loader_batch_view(const zt_loader_batch *b, zt_batch *out)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->batch = b->batch;
    out->seq_len = b->seq_len;
    out->n_docs = b->n_spans;
    out->tokens = b->tokens;
    out->targets = b->targets;
    out->positions = b->positions;
    out->doc_ids = b->doc_ids;
    out->cu_seqlens = b->cu_seqlens;
    out->max_doc_len = b->max_span_len;
}

/* ---- position ---------------------------------------------------------------------------------- */

void zt_loader_get_position(const zt_loader *l, zt_loader_position *out) { *out = l->pos; }

void zt_loader_rewind(zt_loader *l)
{
    memset(&l->pos, 0, sizeof l->pos);
    l->pos.dataset_hash = l->info.dataset_hash;
    l->pos.seed = l->opt.seed;
    l->pos.shuffle = l->opt.shuffle ? 1 : 0;
    l->pos.world = l->opt.world;
    l->pos.rank = l->opt.rank;
}

zt_status zt_loader_set_position(zt_loader *l, const zt_loader_position *pos, zt_error *err)
{
    const char *resume = "the saved data position belongs to another stream";
    if (pos->dataset_hash != l->info.dataset_hash)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s: it was saved for data set %016" PRIx64 " but split \"%s\" of %s is "
                            "%016" PRIx64 " (its shards changed); resume with the data the run "
                            "started with",
                            resume, pos->dataset_hash, l->split, l->dir, l->info.dataset_hash);
    if (pos->seed != l->opt.seed || (pos->shuffle != 0) != (l->opt.shuffle != 0))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s: it was saved with seed %" PRIu64 " and shuffle %s, this run has seed "
                            "%" PRIu64 " and shuffle %s; resume with the original settings",
                            resume, pos->seed, pos->shuffle ? "on" : "off", l->opt.seed,
                            l->opt.shuffle ? "on" : "off");
    if (pos->world != l->opt.world || pos->rank != l->opt.rank)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s: it was saved by rank %d of %d data-parallel ranks, this is rank %d of "
                            "%d; the exact position cannot be carried to another rank layout, resume "
                            "with the original data-parallel size",
                            resume, pos->rank, pos->world, l->opt.rank, l->opt.world);
    if (pos->cursor > (uint64_t)l->info.samples_per_rank ||
        (l->opt.single_pass && pos->epoch != 0) || pos->epoch > UINT64_MAX / 2)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s: epoch %" PRIu64 ", cursor %" PRIu64 " is outside the stream (%" PRId64
                            " samples per rank and epoch); the position is corrupt",
                            resume, pos->epoch, pos->cursor, l->info.samples_per_rank);
    l->pos = *pos;
    return ZT_OK;
}

size_t zt_loader_position_to_json(const zt_loader_position *pos, char *buf, size_t cap)
{
    int n = snprintf(buf, cap,
                     "{\"format\":\"zt-loader-position\",\"version\":1,\"dataset\":\"%016" PRIx64 "\","
                     "\"seed\":\"%016" PRIx64 "\",\"shuffle\":%s,\"world\":%d,\"rank\":%d,"
                     "\"epoch\":%" PRIu64 ",\"cursor\":%" PRIu64 ",\"batches\":%" PRIu64 "}",
                     pos->dataset_hash, pos->seed, pos->shuffle ? "true" : "false", pos->world,
                     pos->rank, pos->epoch, pos->cursor, pos->batches);
    return n < 0 ? 0 : (size_t)n;
}

zt_status zt_loader_position_from_json(const char *text, size_t len, const char *origin,
                                       zt_loader_position *out, zt_error *err)
{
    static const char *const keys[] = {"format", "version", "dataset", "seed", "shuffle",
                                       "world", "rank", "epoch", "cursor", "batches"};
    enum { N_KEYS = sizeof keys / sizeof keys[0] };
    zt_json j;
    zt_status st = zt_json_parse(text, len, origin, &j, err);
    if (st) return st;
    zt_loader_position p = {0};
    int tok[N_KEYS];
    if (j.n_tok < 1 || j.tok[0].type != ZT_JSON_OBJECT)
        st = loader_json_fail(&j, 0, err, "a loader position must be an object");
    for (int i = 0; !st && i < N_KEYS; i++)
        st = loader_json_member(&j, 0, keys[i], "the loader position", &tok[i], err);
    if (!st && j.tok[0].size != N_KEYS)
        st = loader_json_fail(&j, 0, err, "the loader position has keys other than format, version, "
                              "dataset, seed, shuffle, world, rank, epoch, cursor and batches");
    if (!st && !zt_json_eq(&j, tok[0], "zt-loader-position"))
        st = loader_json_fail(&j, tok[0], err, "\"format\" must be \"zt-loader-position\"");
    int64_t version = 0, world = 0, rank = 0, epoch = 0, cursor = 0, batches = 0;
    if (!st) st = loader_json_integer(&j, tok[1], "version", 1, 1, &version, err);
    if (!st) st = loader_json_hex64(&j, tok[2], "dataset", &p.dataset_hash, err);
    if (!st) st = loader_json_hex64(&j, tok[3], "seed", &p.seed, err);
    if (!st) st = loader_json_bool(&j, tok[4], "shuffle", &p.shuffle, err);
    if (!st) st = loader_json_integer(&j, tok[5], "world", 1, INT32_MAX, &world, err);
    if (!st) st = loader_json_integer(&j, tok[6], "rank", 0, world - 1, &rank, err);
    if (!st) st = loader_json_integer(&j, tok[7], "epoch", 0, INT64_MAX, &epoch, err);
    if (!st) st = loader_json_integer(&j, tok[8], "cursor", 0, INT64_MAX, &cursor, err);
    if (!st) st = loader_json_integer(&j, tok[9], "batches", 0, INT64_MAX, &batches, err);
    zt_json_free(&j);
    if (st) return st;
    p.world = (int32_t)world;
    p.rank = (int32_t)rank;
    p.epoch = (uint64_t)epoch;
    p.cursor = (uint64_t)cursor;
    p.batches = (uint64_t)batches;
    *out = p;
    return ZT_OK;
}
