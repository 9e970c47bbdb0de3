/* Writing a finished data directory: shuffle, train/val split, shards, manifest.json.
 *
 * Crash safety: everything is written into DIR/.zt-prep-tmp-PID-XXXXXX and fsynced first. Only then
 * are the previous run's manifest and shards removed (manifest first), the new shards renamed into
 * DIR and manifest.json written last (temp file + rename). A directory is complete exactly when it
 * has manifest.json, and a manifest only ever names shards that are complete; a killed run leaves at
 * most a temp directory, which the next run removes.
 */
#define _GNU_SOURCE
#include "prep.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/json.h"
#include "data/shard_format.h"

#define TMP_PREFIX ".zt-prep-tmp-"
#define MANIFEST "manifest.json"

/* ---- the output directory -------------------------------------------------------------------- */

static int is_shard_name(const char *name)
{
    size_t n = strlen(name), ext = strlen(ZT_SHARD_EXT);
    return n > ext && strcmp(name + n - ext, ZT_SHARD_EXT) == 0 &&
           (strncmp(name, "train-", 6) == 0 || strncmp(name, "val-", 4) == 0);
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = prep_xmalloc(n, "a path");
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* rm -r of a directory we created (flat: only files inside). */
static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char *p = join(dir, e->d_name);
            unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* A manifest.json written by zt-prep (not someone else's file of that name). */
static int is_our_manifest(const char *path)
{
    char *text;
    size_t size;
    zt_error err;
    if (zt_read_file(path, &text, &size, &err) != ZT_OK) return 0;
    zt_json j;
    memset(&j, 0, sizeof j);
    int ours = 0;
    if (zt_json_parse(text, size, path, &j, &err) == ZT_OK && j.n_tok && j.tok[0].type == ZT_JSON_OBJECT) {
        int v = zt_json_object_get(&j, 0, "format");
        ours = v >= 0 && zt_json_eq(&j, v, "zt-prep-manifest");
    }
    zt_json_free(&j);
    free(text);
    return ours;
}

zt_status prep_outdir_open(const char *dir, int force, prep_outdir *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    out->lock_fd = -1;
    zt_status st = zt_mkdir_p(dir, "output", "choose another with -o DIR", err);
    if (st != ZT_OK) return st;
    out->lock_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (out->lock_fd < 0)
        return zt_error_set(err, ZT_ERR_IO, "cannot open output directory '%s': %s", dir, strerror(errno));
    if (flock(out->lock_fd, LOCK_EX | LOCK_NB) != 0)
        return zt_error_set(err, ZT_ERR_IO, "another zt-prep is writing into '%s' right now; wait for "
                            "it to finish or choose another directory with -o DIR", dir);
    DIR *d = opendir(dir);
    if (!d) return zt_error_set(err, ZT_ERR_IO, "cannot read output directory '%s': %s", dir, strerror(errno));
    char foreign[256] = "";
    int n_foreign = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) continue;
        if (strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0) {
            /* We hold the directory's lock, so no other run is using it: it was left by a run that
             * was killed. */
            char *p = join(dir, name);
            prep_info("removing '%s', left by an interrupted run", p);
            remove_tree(p);
            free(p);
            continue;
        }
        if (is_shard_name(name)) continue;
        if (strcmp(name, MANIFEST) == 0) {
            char *p = join(dir, name);
            int ours = is_our_manifest(p);
            free(p);
            if (ours) continue;
        }
        if (n_foreign++ == 0) snprintf(foreign, sizeof foreign, "%s", name);
    }
    closedir(d);
    if (n_foreign && !force)
        return zt_error_set(err, ZT_ERR_IO,
                            "output directory '%s' is not empty and is not a zt-prep output (it has "
                            "'%s'%s); choose an empty or new directory with -o DIR, or pass --force "
                            "to write into it anyway (zt-prep then replaces only its own files: "
                            "manifest.json, train-*.ztshard, val-*.ztshard)",
                            dir, foreign, n_foreign > 1 ? " and more" : "");
    if (access(dir, W_OK) != 0)
        return zt_error_set(err, ZT_ERR_IO, "output directory '%s' is not writable: %s; choose "
                            "another with -o DIR", dir, strerror(errno));
    out->dir = prep_xstrdup(dir);
    char name[64];
    snprintf(name, sizeof name, TMP_PREFIX "%ld-XXXXXX", (long)getpid());
    out->tmp = join(dir, name);
    if (!mkdtemp(out->tmp)) {
        zt_error_set(err, ZT_ERR_IO, "cannot create a temp directory in '%s': %s", dir, strerror(errno));
        prep_outdir_free(out);
        return ZT_ERR_IO;
    }
    return ZT_OK;
}

void prep_outdir_abandon(prep_outdir *o)
{
    if (o->tmp) remove_tree(o->tmp);
}

void prep_outdir_free(prep_outdir *o)
{
    if (o->lock_fd >= 0) close(o->lock_fd); /* releases the lock */
    free(o->dir);
    free(o->tmp);
    memset(o, 0, sizeof *o);
    o->lock_fd = -1;
}

/* ---- shards ---------------------------------------------------------------------------------- */

/* Sequential writer of a shard: buffers writes, puts them at file_pos with pwrite, and keeps the
 * FNV-1a 64 of everything put unless hashing is 0. With fd < 0 it only hashes. */
typedef struct writer {
    int fd;
    int hashing;
    char buf[1 << 20];
    size_t used;
    uint64_t offset;   /* bytes put so far */
    uint64_t file_pos; /* where the buffered bytes go */
    uint64_t hash;
    int error; /* errno of the first failed write */
} writer;

static void writer_reset(writer *w, int fd, uint64_t file_pos)
{
    w->fd = fd;
    w->hashing = 1;
    w->used = 0;
    w->offset = 0;
    w->file_pos = file_pos;
    w->hash = ZT_FNV1A64_INIT;
    w->error = 0;
}

static void writer_flush(writer *w)
{
    const char *p = w->buf;
    while (w->used && !w->error) {
        ssize_t n = pwrite(w->fd, p, w->used, (off_t)w->file_pos);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            w->error = errno;
            break;
        }
        p += n;
        w->used -= (size_t)n;
        w->file_pos += (uint64_t)n;
    }
    w->used = 0;
}

static void writer_put(writer *w, const void *data, size_t n)
{
    const char *p = data;
    if (w->hashing) w->hash = zt_fnv1a64(w->hash, p, n);
    w->offset += n;
    if (w->fd < 0) return;
    while (n) {
        size_t room = sizeof w->buf - w->used;
        size_t m = n < room ? n : room;
        memcpy(w->buf + w->used, p, m);
        w->used += m;
        p += m;
        n -= m;
        if (w->used == sizeof w->buf) writer_flush(w);
    }
}

static uint64_t align_up(uint64_t x) { return (x + ZT_SHARD_ALIGN - 1) / ZT_SHARD_ALIGN * ZT_SHARD_ALIGN; }

/* Zero bytes up to the next multiple of ZT_SHARD_ALIGN of w->offset. */
static void writer_align(writer *w)
{
    static const char zeros[ZT_SHARD_ALIGN];
    writer_put(w, zeros, (size_t)(align_up(w->offset) - w->offset));
}

typedef struct shard_info {
    char name[64];
    int val;
    uint64_t n_samples, n_tokens, n_loss, bytes, checksum;
} shard_info;

/* The sections after the header, in file order; each is hashed on its own into *h. */
enum section { SECTION_TOKENS, SECTION_MASK, SECTION_INDEX };
static void put_section(writer *w, const prep_sink *s, const uint8_t *spill, const uint32_t *order,
                        size_t n, int section)
{
    const uint32_t tb = s->token_bytes;
    uint64_t start = 0;
    if (section == SECTION_INDEX) writer_put(w, &start, sizeof start);
    for (size_t i = 0; i < n; i++) {
        const prep_sample *sm = &s->samples[order[i]];
        if (section == SECTION_TOKENS) {
            writer_put(w, spill + sm->spill_off, (size_t)sm->len * tb);
        } else if (section == SECTION_MASK) {
            writer_put(w, spill + sm->spill_off + (size_t)sm->len * tb, sm->len);
        } else {
            start += sm->len;
            writer_put(w, &start, sizeof start);
        }
    }
}

/* One section's checksum (it goes into the header). The three are hashed on threads of their own:
 * FNV-1a is sequential within a stream, and this runs when the tokenizer threads are done. */
typedef struct section_hash_job {
    const prep_sink *sink;
    const uint8_t *spill;
    const uint32_t *order;
    size_t n;
    int section;
    writer *w;
} section_hash_job;

static void *hash_section(void *arg)
{
    section_hash_job *job = arg;
    writer_reset(job->w, -1, 0);
    put_section(job->w, job->sink, job->spill, job->order, job->n, job->section);
    return NULL;
}

/* The whole shard, header first, through writer w (which hashes it too when it writes, or only
 * hashes with fd < 0). */
static void put_shard(writer *w, const zt_shard_header *h, const prep_sink *s, const uint8_t *spill,
                      const uint32_t *order, size_t n)
{
    writer_put(w, h, sizeof *h);
    for (int section = 0; section < 3; section++) {
        put_section(w, s, spill, order, n, section);
        if (section < SECTION_INDEX) writer_align(w);
    }
    writer_flush(w);
}

/* Writing the file and its fsync, on a thread of its own while the main thread hashes the whole
 * file for the manifest: both stream the same bytes, and only the hash is a sequential chain. */
typedef struct file_job {
    writer *w;
    const zt_shard_header *h;
    const prep_sink *sink;
    const uint8_t *spill;
    const uint32_t *order;
    size_t n;
    int error;
} file_job;

static void *write_file(void *arg)
{
    file_job *job = arg;
    put_shard(job->w, job->h, job->sink, job->spill, job->order, job->n);
    job->error = job->w->error;
    if (!job->error && job->w->offset != job->h->file_size) job->error = EIO; /* a layout bug */
    if (!job->error && fsync(job->w->fd) != 0) job->error = errno;
    return NULL;
}

static zt_status write_shard(const prep_run *run, const char *path, const uint8_t *spill,
                             const uint32_t *order, size_t n, int val, uint32_t shard_index,
                             shard_info *info, zt_error *err)
{
    const prep_sink *s = run->sink;
    zt_shard_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, ZT_SHARD_MAGIC, 8);
    h.version = ZT_SHARD_VERSION;
    h.header_size = ZT_SHARD_HEADER_SIZE;
    h.token_bytes = s->token_bytes;
    h.flags = val ? ZT_SHARD_FLAG_VALIDATION : 0;
    h.vocab_size = (uint32_t)run->tok->info.vocab_size;
    h.shard_index = shard_index;
    h.tokenizer_hash = run->tok->info.model_hash;
    h.n_samples = n;
    for (size_t i = 0; i < n; i++) {
        h.n_tokens += s->samples[order[i]].len;
        h.n_loss_tokens += s->samples[order[i]].n_loss;
    }
    h.tokens_offset = ZT_SHARD_HEADER_SIZE;
    h.mask_offset = align_up(h.tokens_offset + h.n_tokens * s->token_bytes);
    h.index_offset = align_up(h.mask_offset + h.n_tokens);
    h.file_size = h.index_offset + (n + 1) * sizeof(uint64_t);

    /* 1. The section checksums for the header, each on a thread (or here, when none can be had). */
    writer *w = prep_xmalloc(sizeof *w, "a shard write buffer");
    uint64_t *checksums[3] = {&h.tokens_checksum, &h.mask_checksum, &h.index_checksum};
    section_hash_job jobs[3];
    pthread_t threads[3];
    int started[3] = {0, 0, 0};
    for (int section = 0; section < 3; section++) {
        jobs[section] = (section_hash_job){s, spill, order, n, section,
                                           section == 0 ? w : prep_xmalloc(sizeof *w, "a shard hash buffer")};
        started[section] = section > 0 && pthread_create(&threads[section], NULL, hash_section, &jobs[section]) == 0;
        if (!started[section] && section > 0) hash_section(&jobs[section]);
    }
    hash_section(&jobs[0]);
    writer *file_writer = jobs[1].w; /* reused for the file below */
    for (int section = 0; section < 3; section++) {
        if (started[section]) pthread_join(threads[section], NULL);
        *checksums[section] = jobs[section].w->hash;
    }
    free(jobs[2].w);
    h.header_checksum = zt_fnv1a64(ZT_FNV1A64_INIT, &h, offsetof(zt_shard_header, header_checksum));

    /* 2. The file written and fsynced on a thread, while the whole file is hashed here for the
     *    manifest (the header is part of it, so this could not start earlier). */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        zt_error_set(err, ZT_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
        free(w);
        free(file_writer);
        return ZT_ERR_IO;
    }
    writer_reset(file_writer, fd, 0);
    file_writer->hashing = 0; /* the main thread hashes */
    file_job file = {file_writer, &h, s, spill, order, n, 0};
    pthread_t file_thread;
    int writing = pthread_create(&file_thread, NULL, write_file, &file) == 0;
    writer_reset(w, -1, 0);
    put_shard(w, &h, s, spill, order, n);
    if (writing) pthread_join(file_thread, NULL);
    else write_file(&file);
    int e = file.error;
    if (close(fd) != 0 && !e) e = errno;
    uint64_t file_hash = w->hash;
    free(w);
    free(file_writer);
    if (e) return zt_error_set(err, ZT_ERR_IO, "cannot write '%s': %s", path, strerror(e));
    info->val = val;
    info->n_samples = n;
    info->n_tokens = h.n_tokens;
    info->n_loss = h.n_loss_tokens;
    info->bytes = h.file_size;
    info->checksum = file_hash;
    return ZT_OK;
}

/* Cut one split (samples `order[0, n)` in order) into shards of about shard_tokens tokens. */
static zt_status write_split(const prep_run *run, const prep_outdir *od, const uint8_t *spill,
                             const uint32_t *order, size_t n, int val, shard_info **shards,
                             size_t *n_shards, zt_error *err)
{
    const uint64_t limit = run->opt->shard_tokens;
    size_t begin = 0;
    uint32_t index = 0;
    while (begin < n) {
        if (prep_interrupted) return zt_error_set(err, ZT_ERR_CANCELLED, "interrupted");
        uint64_t tokens = 0;
        size_t end = begin;
        /* A shard takes samples while it stays within the limit; one sample always fits. */
        while (end < n && (end == begin || tokens + run->sink->samples[order[end]].len <= limit))
            tokens += run->sink->samples[order[end++]].len;
        *shards = prep_xrealloc(*shards, (*n_shards + 1) * sizeof **shards, "shard list");
        shard_info *info = &(*shards)[(*n_shards)++];
        memset(info, 0, sizeof *info);
        snprintf(info->name, sizeof info->name, "%s-%05u%s", val ? "val" : "train", index, ZT_SHARD_EXT);
        char *path = join(od->tmp, info->name);
        zt_status st = write_shard(run, path, spill, order + begin, end - begin, val, index, info, err);
        free(path);
        if (st != ZT_OK) return st;
        begin = end;
        index++;
    }
    return ZT_OK;
}

/* ---- manifest -------------------------------------------------------------------------------- */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void write_jstr(FILE *f, const char *s) { zt_json_write_string(f, s, strlen(s)); }

static void write_manifest(FILE *f, const prep_run *run, const shard_info *shards, size_t n_shards,
                           uint64_t n_train, uint64_t n_val)
{
    const prep_options *opt = run->opt;
    const prep_stats *st = run->stats;
    const prep_sink *sink = run->sink;
    const zt_tokenizer_info *ti = &run->tok->info;

    /* Token length percentiles over kept samples (nearest rank). */
    uint32_t *lens = prep_xmalloc((sink->n_samples ? sink->n_samples : 1) * sizeof *lens, "lengths");
    uint64_t total = 0, loss = 0;
    for (size_t i = 0; i < sink->n_samples; i++) {
        lens[i] = sink->samples[i].len;
        total += sink->samples[i].len;
        loss += sink->samples[i].n_loss;
    }
    qsort(lens, sink->n_samples, sizeof *lens, cmp_u32);
    size_t n = sink->n_samples;
#define PCT(q) (n ? lens[(size_t)ceil((q) * (double)n) - 1] : 0)
    uint32_t p50 = PCT(0.50), p95 = PCT(0.95), pmax = n ? lens[n - 1] : 0;
#undef PCT
    free(lens);

    fputs("{\n  \"format\": \"zt-prep-manifest\",\n  \"format_version\": 1,\n", f);
    fprintf(f, "  \"zt_version\": \"%s\",\n", ZT_VERSION);
    fputs("  \"inputs\": [", f);
    for (int i = 0; i < opt->n_inputs; i++) {
        const prep_input_file *in = &run->inputs[i];
        fputs(i ? ",\n    {\"path\": " : "\n    {\"path\": ", f);
        write_jstr(f, in->path);
        fprintf(f, ", \"bytes\": %" PRIu64 ", \"fnv1a64\": \"%016" PRIx64 "\", \"format\": \"%s\", "
                "\"records\": %" PRIu64 ", \"bad_records\": %" PRIu64 "}",
                in->bytes, in->hash, in->jsonl ? "jsonl" : "json-array", in->records, in->bad);
    }
    fputs("\n  ],\n  \"tokenizer\": {\n    \"path\": ", f);
    write_jstr(f, run->tok->path);
    fputs(",\n    \"plugin\": ", f);
    write_jstr(f, run->tok->plugin.desc.name);
    fprintf(f, ",\n    \"plugin_version\": ");
    write_jstr(f, run->tok->plugin.plugin->version ? run->tok->plugin.plugin->version : "");
    fprintf(f, ",\n    \"hash\": \"%016" PRIx64 "\",\n    \"model_type\": ", ti->model_hash);
    write_jstr(f, ti->model_type);
    fprintf(f, ",\n    \"vocab_size\": %d,\n    \"bos_id\": %d,\n    \"eos_id\": %d,\n"
               "    \"pad_id\": %d,\n    \"unk_id\": %d\n  },\n",
            ti->vocab_size, ti->bos_id, ti->eos_id, ti->pad_id, ti->unk_id);
    fputs("  \"template\": ", f);
    zt_template_write_json(run->tpl, f, "  ");
    fprintf(f, ",\n  \"options\": {\n    \"max_len\": %d,\n    \"layout\": \"%s\",\n"
               "    \"val_fraction\": %.17g,\n    \"seed\": %" PRIu64 ",\n    \"shuffle\": %s,\n"
               "    \"strict\": %s,\n    \"overlong\": \"%s\",\n    \"shard_tokens\": %" PRIu64 ",\n"
               "    \"history_loss\": %s,\n    \"bos\": %s,\n    \"min_prompt_tokens_on_truncation\": %d,\n"
               "    \"dedup\": %s,\n    \"fields\": {",
            opt->max_len, opt->pad ? "padded" : "packed", opt->val_fraction, opt->seed,
            opt->shuffle ? "true" : "false", opt->strict ? "true" : "false",
            opt->overlong == PREP_OVERLONG_DROP ? "drop" : "truncate", opt->shard_tokens,
            opt->history_loss ? "true" : "false", ti->bos_id >= 0 ? "true" : "false", opt->max_len / 4,
            opt->dedup ? "true" : "false");
    /* The record key each field was read from (--field). */
    for (int field = 0; field < PREP_FIELD_COUNT; field++) {
        fprintf(f, "%s\"%s\": ", field ? ", " : "", prep_field_name(field));
        write_jstr(f, opt->field_keys[field] ? opt->field_keys[field] : prep_field_name(field));
    }
    fputs("}\n  },\n", f);
    fprintf(f, "  \"token_dtype\": \"%s\",\n", sink->token_bytes == 2 ? "uint16" : "uint32");

    fprintf(f, "  \"statistics\": {\n    \"records_read\": %" PRIu64 ",\n    \"records_kept\": %" PRIu64
               ",\n    \"records_bad\": %" PRIu64 ",\n",
            st->records_read, st->kept, st->bad_total);
    uint64_t dropped = 0;
    for (int r = 0; r < PREP_DROP_COUNT; r++) dropped += st->dropped[r];
    fprintf(f, "    \"records_dropped\": %" PRIu64 ",\n", dropped);
    fprintf(f, "    \"records_truncated\": %" PRIu64 ",\n",
            st->truncated[PREP_TRUNC_PROMPT] + st->truncated[PREP_TRUNC_RESPONSE]);
    fprintf(f, "    \"records_duplicate\": %" PRIu64 ",\n", st->duplicates);
    fprintf(f, "    \"truncated\": {\"prompt_only\": %" PRIu64 ", \"prompt_and_response\": %" PRIu64 "},\n",
            st->truncated[PREP_TRUNC_PROMPT], st->truncated[PREP_TRUNC_RESPONSE]);
    fputs("    \"dropped\": {", f);
    for (int r = 0; r < PREP_DROP_COUNT; r++)
        fprintf(f, "%s\"%s\": %" PRIu64, r ? ", " : "", prep_drop_reason_name(r), st->dropped[r]);
    fputs("},\n    \"bad_records\": {", f);
    for (int r = 0; r < PREP_BAD_COUNT; r++)
        fprintf(f, "%s\"%s\": %" PRIu64, r ? ", " : "", prep_bad_reason_name(r), st->bad[r]);
    fputs("},\n    \"unknown_fields\": {", f);
    size_t *idx = prep_counter_sorted(&st->unknown_fields);
    for (size_t i = 0; i < st->unknown_fields.n; i++) {
        if (i) fputs(", ", f);
        write_jstr(f, st->unknown_fields.names[idx[i]]);
        fprintf(f, ": %" PRIu64, st->unknown_fields.counts[idx[i]]);
    }
    free(idx);
    fprintf(f, "},\n    \"records_with_history\": %" PRIu64 ",\n    \"records_with_system\": %" PRIu64 ",\n",
            st->with_history, st->with_system);
    fprintf(f, "    \"tokens\": %" PRIu64 ",\n    \"loss_tokens\": %" PRIu64 ",\n"
               "    \"loss_token_share\": %.6f,\n",
            total, loss, total ? (double)loss / (double)total : 0.0);
    fprintf(f, "    \"sample_tokens\": {\"p50\": %u, \"p95\": %u, \"max\": %u, \"mean\": %.2f, "
               "\"longest_before_truncation\": %" PRIu64 "},\n",
            p50, p95, pmax, n ? (double)total / (double)n : 0.0, st->longest);
    fprintf(f, "    \"train_samples\": %" PRIu64 ",\n    \"val_samples\": %" PRIu64 "\n  },\n",
            n_train, n_val);
    fputs("  \"shards\": [", f);
    for (size_t i = 0; i < n_shards; i++) {
        const shard_info *s = &shards[i];
        fputs(i ? ",\n    {\"file\": " : "\n    {\"file\": ", f);
        write_jstr(f, s->name);
        fprintf(f, ", \"split\": \"%s\", \"samples\": %" PRIu64 ", \"tokens\": %" PRIu64
                   ", \"loss_tokens\": %" PRIu64 ", \"bytes\": %" PRIu64
                   ", \"checksum\": \"%016" PRIx64 "\"}",
                s->val ? "val" : "train", s->n_samples, s->n_tokens, s->n_loss, s->bytes,
                s->checksum);
    }
    fputs("\n  ]\n}\n", f);
}

/* ---- putting it together --------------------------------------------------------------------- */

static zt_status commit(const prep_outdir *od, const shard_info *shards, size_t n_shards,
                        const char *manifest, size_t manifest_len, zt_error *err)
{
    /* 1. The old manifest goes first: from here until step 4 the directory has none, so nobody
     *    reads a mix of old and new shards as a data set. */
    char *old_manifest = join(od->dir, MANIFEST);
    if (unlink(old_manifest) != 0 && errno != ENOENT) {
        zt_error_set(err, ZT_ERR_IO, "cannot remove the previous '%s': %s", old_manifest, strerror(errno));
        free(old_manifest);
        return ZT_ERR_IO;
    }
    zt_status st = zt_fsync_dir(od->dir, err);
    /* 2. Shards of the previous run. */
    DIR *d = st == ZT_OK ? opendir(od->dir) : NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (is_shard_name(e->d_name)) {
                char *p = join(od->dir, e->d_name);
                unlink(p);
                free(p);
            }
        closedir(d);
    }
    /* 3. The new shards. */
    for (size_t i = 0; i < n_shards && st == ZT_OK; i++) {
        char *from = join(od->tmp, shards[i].name), *to = join(od->dir, shards[i].name);
        if (rename(from, to) != 0)
            st = zt_error_set(err, ZT_ERR_IO, "cannot move '%s' to '%s': %s", from, to, strerror(errno));
        free(from);
        free(to);
    }
    if (st == ZT_OK) st = zt_fsync_dir(od->dir, err);
    /* 4. The manifest, last. */
    if (st == ZT_OK) st = zt_atomic_write(old_manifest, manifest, manifest_len, err);
    free(old_manifest);
    return st;
}

zt_status prep_write_output(const prep_run *run, prep_outdir *od, zt_error *err)
{
    const prep_options *opt = run->opt;
    prep_sink *sink = run->sink;
    const size_t n = sink->n_samples;
    if (n > UINT32_MAX)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED, "%zu samples in one run; split the input into "
                            "runs of at most %u records", n, UINT32_MAX);

    /* Validation samples: a seeded random subset of floor(F * N), at least one when F > 0 and
     * N >= 100. The permutation also gives the shuffled order of each split. */
    uint64_t n_val = (uint64_t)floor(opt->val_fraction * (double)n);
    if (opt->val_fraction > 0 && n >= 100 && n_val == 0) n_val = 1;
    if (n_val >= n) n_val = n ? n - 1 : 0;
    uint32_t *perm = prep_xmalloc((n ? n : 1) * sizeof *perm, "the sample permutation");
    for (size_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
    uint64_t rng = opt->seed;
    for (size_t i = n; i > 1; i--) { /* Fisher-Yates */
        size_t k = (size_t)prep_random_below(&rng, i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[k];
        perm[k] = t;
    }
    uint32_t *val = perm, *train = perm + n_val;
    size_t n_train = n - n_val;
    if (!opt->shuffle) { /* same split, input order within each split */
        qsort(val, n_val, sizeof *val, cmp_u32);
        qsort(train, n_train, sizeof *train, cmp_u32);
    }

    if (fflush(sink->spill) != 0) {
        free(perm);
        return zt_error_set(err, ZT_ERR_IO, "cannot write the temporary sample file: %s", strerror(errno));
    }
    uint8_t *spill = NULL;
    if (sink->spill_bytes) {
        spill = mmap(NULL, sink->spill_bytes, PROT_READ, MAP_PRIVATE, fileno(sink->spill), 0);
        if (spill == MAP_FAILED) {
            free(perm);
            return zt_error_set(err, ZT_ERR_IO, "cannot map the temporary sample file: %s", strerror(errno));
        }
    }
    shard_info *shards = NULL;
    size_t n_shards = 0;
    zt_status st = write_split(run, od, spill, train, n_train, 0, &shards, &n_shards, err);
    if (st == ZT_OK) st = write_split(run, od, spill, val, n_val, 1, &shards, &n_shards, err);
    if (spill) munmap(spill, sink->spill_bytes);
    free(perm);

    if (st == ZT_OK) {
        char *text = NULL;
        size_t len = 0;
        FILE *mf = open_memstream(&text, &len);
        if (!mf) {
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing the manifest");
        } else {
            write_manifest(mf, run, shards, n_shards, n_train, n_val);
            fclose(mf);
            if (prep_interrupted) st = zt_error_set(err, ZT_ERR_CANCELLED, "interrupted");
            else st = commit(od, shards, n_shards, text, len, err);
            free(text);
        }
    }
    if (st == ZT_OK) {
        prep_info("wrote %zu train and %" PRIu64 " validation samples in %zu shard(s) to %s/",
                  n_train, n_val, n_shards, od->dir);
    }
    free(shards);
    return st;
}
