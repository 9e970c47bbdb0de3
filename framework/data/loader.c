/* The shard loader (see loader.h for what it guarantees and how the stream is defined). */
#define _POSIX_C_SOURCE 200809L /* O_CLOEXEC, mmap */
#include "data/loader.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/json.h"
#include "base/log.h"
#include "data/shard_format.h"

/* Shards are little-endian and read in place. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the loader reads little-endian shards in place and needs a little-endian host"
#endif

#define REPREP "re-run zt-prep to regenerate the data set"
#define MANIFEST_MAX_BYTES (256u << 20) /* far above any real manifest; refuses to slurp junk */

/* ---- one shard image --------------------------------------------------------------------------- */

/* FNV-1a 64 of the whole file and of one section in the same pass: two independent multiply chains
 * run side by side, so verifying the manifest's file checksum costs almost nothing extra. */
static void fnv1a64_pair(uint64_t *file_hash, uint64_t *section_hash, const uint8_t *p, uint64_t n)
{
    uint64_t a = *file_hash, b = *section_hash;
    for (uint64_t i = 0; i < n; i++) {
        a = (a ^ p[i]) * 0x100000001b3ull;
        b = (b ^ p[i]) * 0x100000001b3ull;
    }
    *file_hash = a;
    *section_hash = b;
}

typedef struct section {
    const char *name;     /* "tokens", "mask", "index" */
    uint64_t offset;
    uint64_t bytes;
    uint32_t offset_field;/* byte offset of the offset field in the header, for messages */
    const char *count_field;
    uint64_t count;
    uint64_t item_bytes;
    uint64_t stored_checksum;
} section;

static zt_status check_section(const section *s, uint64_t prev_end, uint64_t file_size,
                               const char *name, zt_error *err)
{
    if (s->offset % ZT_SHARD_ALIGN != 0)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the %s section offset %" PRIu64 " (header byte offset %u) is not a "
                            "multiple of %u; the header is corrupt: " REPREP,
                            name, s->name, s->offset, s->offset_field, ZT_SHARD_ALIGN);
    if (s->offset < prev_end)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the %s section starts at byte %" PRIu64 " (header byte offset %u), "
                            "before the end of what precedes it (byte %" PRIu64 "); the header is "
                            "corrupt: " REPREP,
                            name, s->name, s->offset, s->offset_field, prev_end);
    if (s->bytes / s->item_bytes != s->count || s->offset > file_size ||
        s->bytes > file_size - s->offset)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the %s section (%" PRIu64 " x %" PRIu64 " bytes from header field "
                            "%s, at byte %" PRIu64 ") does not fit in the %" PRIu64 "-byte file; the "
                            "header is corrupt: " REPREP,
                            name, s->name, s->count, s->item_bytes, s->count_field, s->offset,
                            file_size);
    return ZT_OK;
}

/* Sample holding token t (index is already known to be valid). */
static uint64_t sample_of_token(const uint64_t *index, uint64_t n_samples, uint64_t t)
{
    uint64_t lo = 0, hi = n_samples; /* index[lo] <= t < index[hi] */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (index[mid] <= t) lo = mid;
        else hi = mid;
    }
    return lo;
}

static zt_status check_checksums(const uint8_t *data, uint64_t size, const section *sec,
                                 const char *name, const zt_shard_expect *expect, zt_error *err)
{
    uint64_t file_hash = ZT_FNV1A64_INIT, pos = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t gap_hash = ZT_FNV1A64_INIT, section_hash = ZT_FNV1A64_INIT;
        fnv1a64_pair(&file_hash, &gap_hash, data + pos, sec[i].offset - pos);
        fnv1a64_pair(&file_hash, &section_hash, data + sec[i].offset, sec[i].bytes);
        pos = sec[i].offset + sec[i].bytes;
        if (section_hash != sec[i].stored_checksum)
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: the %s section (bytes %" PRIu64 "-%" PRIu64 ") is corrupt: its "
                                "checksum is %016" PRIx64 " but the header records %016" PRIx64
                                "; " REPREP " or restore the file from a good copy",
                                name, sec[i].name, sec[i].offset, pos, section_hash,
                                sec[i].stored_checksum);
    }
    uint64_t tail_hash = ZT_FNV1A64_INIT;
    fnv1a64_pair(&file_hash, &tail_hash, data + pos, size - pos);
    if (expect->check_file_checksum && file_hash != expect->file_checksum)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the file's checksum is %016" PRIx64 " but manifest.json records %016"
                            PRIx64 ": bytes outside the checksummed sections (padding) changed, or "
                            "the file belongs to another run of zt-prep; " REPREP,
                            name, file_hash, expect->file_checksum);
    return ZT_OK;
}

static zt_status check_index(const uint64_t *index, uint64_t n_samples, uint64_t n_tokens,
                             uint64_t index_offset, const char *name, zt_error *err)
{
    if (index[0] != 0)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: index[0] (byte %" PRIu64 ") is %" PRIu64 ", must be 0; the index is "
                            "corrupt: " REPREP,
                            name, index_offset, index[0]);
    for (uint64_t i = 1; i <= n_samples; i++) {
        if (index[i] > n_tokens)
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: index[%" PRIu64 "] (byte %" PRIu64 ") is %" PRIu64 ", beyond "
                                "n_tokens %" PRIu64 "; the index is corrupt: " REPREP,
                                name, i, index_offset + 8 * i, index[i], n_tokens);
        if (index[i] <= index[i - 1])
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: the index is not increasing: index[%" PRIu64 "] = %" PRIu64
                                " (byte %" PRIu64 ") is not above index[%" PRIu64 "] = %" PRIu64
                                ", so sample %" PRIu64 " would be empty or reversed; " REPREP,
                                name, i, index[i], index_offset + 8 * i, i - 1, index[i - 1], i - 1);
    }
    if (index[n_samples] != n_tokens)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: index[n_samples] = index[%" PRIu64 "] is %" PRIu64 " but n_tokens is "
                            "%" PRIu64 ": tokens past the last sample are not covered; " REPREP,
                            name, n_samples, index[n_samples], n_tokens);
    return ZT_OK;
}

/* Largest id first (a loop the compiler vectorizes); the offender is located only on failure. */
static zt_status check_tokens(const zt_shard_view *v, uint64_t tokens_offset, const char *name,
                              zt_error *err)
{
    uint32_t max_id = 0;
    if (v->token_bytes == 2) {
        const uint16_t *t = (const uint16_t *)v->tokens;
        for (uint64_t i = 0; i < v->n_tokens; i++) max_id = t[i] > max_id ? t[i] : max_id;
    } else {
        const uint32_t *t = (const uint32_t *)v->tokens;
        for (uint64_t i = 0; i < v->n_tokens; i++) max_id = t[i] > max_id ? t[i] : max_id;
    }
    if (max_id < v->vocab_size) return ZT_OK;
    for (uint64_t i = 0; i < v->n_tokens; i++) {
        uint32_t id = v->token_bytes == 2 ? ((const uint16_t *)v->tokens)[i]
                                          : ((const uint32_t *)v->tokens)[i];
        if (id >= v->vocab_size)
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: token %" PRIu64 " (sample %" PRIu64 ", byte %" PRIu64 ") has id "
                                "%u, not below vocab_size %" PRIu64 "; the shard is corrupt or was "
                                "made with another tokenizer: " REPREP,
                                name, i, sample_of_token(v->index, v->n_samples, i),
                                tokens_offset + i * v->token_bytes, id, v->vocab_size);
    }
    return ZT_OK;
}

static zt_status check_mask(const zt_shard_view *v, uint64_t mask_offset, const char *name,
                            zt_error *err)
{
    uint8_t stray_bits = 0;
    uint64_t ones = 0;
    for (uint64_t i = 0; i < v->n_tokens; i++) {
        stray_bits |= v->mask[i] & 0xfe;
        ones += v->mask[i] & 1;
    }
    if (stray_bits) {
        for (uint64_t i = 0; i < v->n_tokens; i++)
            if (v->mask[i] > 1)
                return zt_error_set(err, ZT_ERR_FORMAT,
                                    "%s: loss mask byte %" PRIu64 " (sample %" PRIu64 ", byte %"
                                    PRIu64 ") is %u; mask bytes must be 0 or 1: " REPREP,
                                    name, i, sample_of_token(v->index, v->n_samples, i),
                                    mask_offset + i, v->mask[i]);
    }
    if (ones != v->n_loss_tokens)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the loss mask has %" PRIu64 " ones but header field n_loss_tokens "
                            "says %" PRIu64 "; " REPREP,
                            name, ones, v->n_loss_tokens);
    return ZT_OK;
}

static void describe_magic(const uint8_t *m, char *out, size_t cap)
{
    size_t used = 0;
    for (int i = 0; i < 8 && used + 5 < cap; i++) {
        if (m[i] >= 0x20 && m[i] < 0x7f && m[i] != '"' && m[i] != '\\') out[used++] = (char)m[i];
        else used += (size_t)snprintf(out + used, cap - used, "\\x%02x", m[i]);
    }
    out[used] = '\0';
}

zt_status zt_shard_validate(const uint8_t *data, uint64_t size, const char *name,
                            const zt_shard_expect *expect, zt_shard_view *out, zt_error *err)
{
    static const zt_shard_expect nothing_expected = {.verify_checksums = 1};
    if (!expect) expect = &nothing_expected;
    memset(out, 0, sizeof *out);
    if (size < ZT_SHARD_HEADER_SIZE)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the file is %" PRIu64 " bytes, shorter than the %u-byte shard "
                            "header: it is truncated or not a zt shard; " REPREP,
                            name, size, ZT_SHARD_HEADER_SIZE);
    zt_shard_header h;
    memcpy(&h, data, sizeof h);
    if (memcmp(h.magic, ZT_SHARD_MAGIC, 8) != 0) {
        char found[40];
        describe_magic(data, found, sizeof found);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: not a zt shard: the file starts with \"%s\" instead of the magic "
                            "\"ZTSHARD\\x00\"; check the path, or " REPREP,
                            name, found);
    }
    if (h.version != ZT_SHARD_VERSION)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: shard format version %u (header byte offset 8), but this zt reads "
                            "version %u: re-run this release's zt-prep to rewrite the data set",
                            name, h.version, ZT_SHARD_VERSION);
    if (h.header_size != ZT_SHARD_HEADER_SIZE)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: header_size is %u (header byte offset 12), expected %u; the header "
                            "is corrupt: " REPREP,
                            name, h.header_size, ZT_SHARD_HEADER_SIZE);
    uint64_t header_hash = zt_fnv1a64(ZT_FNV1A64_INIT, data, 120);
    if (header_hash != h.header_checksum)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the header checksum (byte offset 120) is %016" PRIx64 " but bytes "
                            "0-119 hash to %016" PRIx64 ": the header is corrupt; " REPREP,
                            name, h.header_checksum, header_hash);
    for (unsigned i = 0; i < sizeof h.reserved; i++)
        if (h.reserved[i] != 0)
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: reserved header byte %u is 0x%02x, must be 0: the file is "
                                "corrupt or from an incompatible zt-prep; " REPREP,
                                name, 128 + i, h.reserved[i]);
    if (h.file_size != size) {
        if (size < h.file_size)
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: the file is truncated: its header (byte offset 88) says %" PRIu64
                                " bytes but it has only %" PRIu64 " (an interrupted copy or write?); "
                                "copy it again or " REPREP,
                                name, h.file_size, size);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the file has %" PRIu64 " bytes but its header (byte offset 88) says %"
                            PRIu64 ": something was appended to it; " REPREP,
                            name, size, h.file_size);
    }
    if (h.token_bytes != 2 && h.token_bytes != 4)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: token_bytes is %u (header byte offset 16); it must be 2 or 4: " REPREP,
                            name, h.token_bytes);
    if (h.flags & ~ZT_SHARD_FLAG_VALIDATION)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: flags 0x%x (header byte offset 20) has bits this zt does not know "
                            "(0x%x): the shard comes from a newer zt-prep; " REPREP " with this release",
                            name, h.flags, h.flags & ~ZT_SHARD_FLAG_VALIDATION);
    if (h.vocab_size == 0 || h.vocab_size > INT32_MAX ||
        (h.token_bytes == 2 && h.vocab_size > 65536u))
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: vocab_size %u (header byte offset 24) is invalid for %u-byte token "
                            "ids; " REPREP,
                            name, h.vocab_size, h.token_bytes);
    /* Every sample has a token, so n_samples <= n_tokens; this also keeps n_samples + 1 from
     * overflowing once the tokens section is known to fit in the file. */
    if (h.n_loss_tokens > h.n_tokens || h.n_samples > h.n_tokens)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: header counts are inconsistent: n_samples %" PRIu64 " and "
                            "n_loss_tokens %" PRIu64 " must not exceed n_tokens %" PRIu64 "; " REPREP,
                            name, h.n_samples, h.n_loss_tokens, h.n_tokens);

    /* What the caller knows the shard must be. Checked before the long passes: the header is
     * already known to be intact, and a wrong-tokenizer shard deserves that message, not another. */
    if (expect->check_tokenizer && h.tokenizer_hash != expect->tokenizer_hash)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tokenized with tokenizer %016" PRIx64 " but the data set's manifest "
                            "says %016" PRIx64 ": shards of different zt-prep runs were mixed; " REPREP
                            " into an empty directory",
                            name, h.tokenizer_hash, expect->tokenizer_hash);
    if (expect->check_tokenizer && h.vocab_size != expect->vocab_size)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: vocab_size %u differs from the manifest's %" PRIu64 ": shards of "
                            "different zt-prep runs were mixed; " REPREP " into an empty directory",
                            name, h.vocab_size, expect->vocab_size);
    int is_validation = (h.flags & ZT_SHARD_FLAG_VALIDATION) != 0;
    if (expect->check_split && is_validation != (expect->validation != 0))
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the shard holds %s samples but manifest.json lists it under split "
                            "\"%s\"; the manifest does not belong to these shards: " REPREP,
                            name, is_validation ? "validation" : "training",
                            expect->validation ? "val" : "train");

    section sec[3] = {
        {"tokens", h.tokens_offset, h.n_tokens * h.token_bytes, 64, "n_tokens", h.n_tokens,
         h.token_bytes, h.tokens_checksum},
        {"mask", h.mask_offset, h.n_tokens, 72, "n_tokens", h.n_tokens, 1, h.mask_checksum},
        {"index", h.index_offset, (h.n_samples + 1) * 8, 80, "n_samples + 1", h.n_samples + 1, 8,
         h.index_checksum},
    };
    uint64_t prev_end = ZT_SHARD_HEADER_SIZE;
    for (int i = 0; i < 3; i++) {
        zt_status st = check_section(&sec[i], prev_end, size, name, err);
        if (st) return st;
        prev_end = sec[i].offset + sec[i].bytes;
    }
    if (expect->verify_checksums) {
        zt_status st = check_checksums(data, size, sec, name, expect, err);
        if (st) return st;
    }

    out->base = data;
    out->size = size;
    out->token_bytes = h.token_bytes;
    out->vocab_size = h.vocab_size;
    out->tokenizer_hash = h.tokenizer_hash;
    out->n_samples = h.n_samples;
    out->n_tokens = h.n_tokens;
    out->n_loss_tokens = h.n_loss_tokens;
    out->tokens = data + h.tokens_offset;
    out->mask = data + h.mask_offset;
    out->index = (const uint64_t *)(const void *)(data + h.index_offset);
    zt_status st = check_index(out->index, h.n_samples, h.n_tokens, h.index_offset, name, err);
    if (!st) st = check_tokens(out, h.tokens_offset, name, err);
    if (!st) st = check_mask(out, h.mask_offset, name, err);
    if (st) memset(out, 0, sizeof *out);
    return st;
}

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

/* splitmix64 (Steele, Lea, Flood 2014): a tiny generator with a full 64-bit period. */
static uint64_t splitmix64_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, bound) without modulo bias: reject the few values below 2^64 mod bound. */
static uint64_t uniform_below(uint64_t *state, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t r = splitmix64_next(state);
        if (r >= threshold) return r % bound;
    }
}

static void build_order(zt_loader *l, uint64_t epoch)
{
    uint64_t n = (uint64_t)l->info.n_samples;
    for (uint64_t i = 0; i < n; i++) l->order[i] = (uint32_t)i;
    if (l->opt.shuffle) {
        uint64_t epoch_state = epoch;
        uint64_t state = l->opt.seed ^ splitmix64_next(&epoch_state);
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

/* ---- small JSON readers with origin:line:col messages ---------------------------------------- */

static zt_status json_fail(const zt_json *j, int tok, zt_error *err, const char *fmt, ...)
    ZT_PRINTF(4, 5);
static zt_status json_fail(const zt_json *j, int tok, zt_error *err, const char *fmt, ...)
{
    int line = 1, col = 1;
    if (tok >= 0 && tok < j->n_tok) zt_json_line_col(j->text, (size_t)j->tok[tok].start, &line, &col);
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return zt_error_set(err, ZT_ERR_FORMAT, "%s:%d:%d: %s", j->origin, line, col, what);
}

/* The value of `key` in object obj, which must exist (else an error at the object). */
static zt_status json_member(const zt_json *j, int obj, const char *key, const char *where, int *tok,
                             zt_error *err)
{
    *tok = zt_json_object_get(j, obj, key);
    if (*tok < 0) return json_fail(j, obj, err, "%s has no \"%s\"", where, key);
    return ZT_OK;
}

/* A JSON integer written plainly (optional '-', digits): read exactly, with no detour through
 * double, so 64-bit values survive. */
static zt_status json_integer(const zt_json *j, int tok, const char *key, int64_t min, int64_t max,
                              int64_t *out, zt_error *err)
{
    const zt_json_tok *t = &j->tok[tok];
    const char *s = j->text + t->start;
    int n = t->end - t->start;
    int neg = n > 0 && s[0] == '-';
    int ok = t->type == ZT_JSON_PRIMITIVE && n > neg && n - neg <= 19;
    uint64_t v = 0;
    for (int i = neg; ok && i < n; i++) {
        if (s[i] < '0' || s[i] > '9') ok = 0;
        else v = v * 10 + (uint64_t)(s[i] - '0');
    }
    ok = ok && v <= (uint64_t)INT64_MAX;
    int64_t value = ok ? (neg ? -(int64_t)v : (int64_t)v) : 0;
    if (!ok || value < min || value > max)
        return json_fail(j, tok, err, "\"%s\" must be an integer in [%" PRId64 ", %" PRId64 "], found "
                         "%s%.*s%s", key, min, max, t->type == ZT_JSON_STRING ? "\"" : "",
                         n > 40 ? 40 : n, s, t->type == ZT_JSON_STRING ? "\"" : "");
    *out = value;
    return ZT_OK;
}

static zt_status json_text(const zt_json *j, int tok, const char *key, char **out, zt_error *err)
{
    if (j->tok[tok].type != ZT_JSON_STRING)
        return json_fail(j, tok, err, "\"%s\" must be a string", key);
    size_t len;
    zt_status st = zt_json_string(j, tok, out, &len, err);
    if (st) return st;
    if (strlen(*out) != len) {
        free(*out);
        *out = NULL;
        return json_fail(j, tok, err, "\"%s\" contains a NUL character", key);
    }
    return ZT_OK;
}

/* Checksums and hashes are written as 16 hex digits (JSON numbers cannot hold 64 bits exactly). */
static zt_status json_hex64(const zt_json *j, int tok, const char *key, uint64_t *out, zt_error *err)
{
    const zt_json_tok *t = &j->tok[tok];
    const char *s = j->text + t->start;
    int ok = t->type == ZT_JSON_STRING && t->end - t->start == 16;
    uint64_t v = 0;
    for (int i = 0; ok && i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) ok = 0;
        else v = v << 4 | (uint64_t)d;
    }
    if (!ok)
        return json_fail(j, tok, err, "\"%s\" must be a string of 16 hex digits, found %.*s", key,
                         t->end - t->start > 40 ? 40 : t->end - t->start, s);
    *out = v;
    return ZT_OK;
}

static zt_status json_bool(const zt_json *j, int tok, const char *key, int32_t *out, zt_error *err)
{
    if (!zt_json_is_bool(j, tok)) return json_fail(j, tok, err, "\"%s\" must be true or false", key);
    *out = zt_json_get_bool(j, tok);
    return ZT_OK;
}

/* ---- manifest ---------------------------------------------------------------------------------- */

static zt_status read_file(const char *path, char **out, size_t *len, zt_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return zt_error_set(err, errno == ENOENT ? ZT_ERR_NOT_FOUND : ZT_ERR_IO,
                                "cannot open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t used = 0, cap = 0;
    for (;;) {
        if (used == cap) {
            if (cap >= MANIFEST_MAX_BYTES) {
                fclose(f);
                free(buf);
                return zt_error_set(err, ZT_ERR_FORMAT, "%s is larger than %u MiB; it is not a "
                                    "zt-prep manifest", path, MANIFEST_MAX_BYTES >> 20);
            }
            cap = cap ? cap * 2 : 65536;
            char *grown = realloc(buf, cap + 1);
            if (!grown) {
                fclose(f);
                free(buf);
                return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
            }
            buf = grown;
        }
        size_t got = fread(buf + used, 1, cap - used, f);
        used += got;
        if (got == 0) break;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return zt_error_set(err, ZT_ERR_IO, "cannot read %s: a read error occurred", path);
    }
    buf[used] = '\0';
    *out = buf;
    *len = used;
    return ZT_OK;
}

typedef struct manifest_shard {
    char *file;
    int64_t bytes, n_samples, n_tokens, n_loss_tokens;
    uint64_t checksum;
} manifest_shard;

typedef struct manifest {
    uint64_t tokenizer_hash;
    int64_t vocab_size, bos_id, eos_id, pad_id;
    int32_t packed;         /* options.layout: 1 packed, 0 padded, -1 not given */
    manifest_shard *shards; /* of the requested split, in manifest order */
    int64_t n_shards;
    int64_t n_other_split;
} manifest;

static void manifest_free(manifest *m)
{
    for (int64_t i = 0; i < m->n_shards; i++) free(m->shards[i].file);
    free(m->shards);
    memset(m, 0, sizeof *m);
}

static zt_status parse_tokenizer(const zt_json *j, int root, manifest *m, zt_error *err)
{
    int tok_obj, t;
    zt_status st = json_member(j, root, "tokenizer", "the manifest", &tok_obj, err);
    if (st) return st;
    if (j->tok[tok_obj].type != ZT_JSON_OBJECT)
        return json_fail(j, tok_obj, err, "\"tokenizer\" must be an object");
    const char *where = "\"tokenizer\"";
    if ((st = json_member(j, tok_obj, "hash", where, &t, err)) ||
        (st = json_hex64(j, t, "hash", &m->tokenizer_hash, err)))
        return st;
    if ((st = json_member(j, tok_obj, "vocab_size", where, &t, err)) ||
        (st = json_integer(j, t, "vocab_size", 1, INT32_MAX, &m->vocab_size, err)))
        return st;
    const char *ids[3] = {"bos_id", "eos_id", "pad_id"};
    int64_t *values[3] = {&m->bos_id, &m->eos_id, &m->pad_id};
    for (int i = 0; i < 3; i++)
        if ((st = json_member(j, tok_obj, ids[i], where, &t, err)) ||
            (st = json_integer(j, t, ids[i], -1, m->vocab_size - 1, values[i], err)))
            return st;
    return ZT_OK;
}

/* What identifies a zt-prep manifest, and the layout zt-prep recorded for the loader. */
static zt_status parse_header(const zt_json *j, manifest *m, zt_error *err)
{
    int t;
    int64_t version;
    zt_status st = json_member(j, 0, "format", "the manifest", &t, err);
    if (st) return st;
    if (!zt_json_eq(j, t, "zt-prep-manifest"))
        return json_fail(j, t, err, "\"format\" is not \"zt-prep-manifest\": this manifest.json was not "
                         "written by zt-prep; run zt-prep to make a data set");
    if ((st = json_member(j, 0, "format_version", "the manifest", &t, err)) ||
        (st = json_integer(j, t, "format_version", 0, INT64_MAX, &version, err)))
        return st;
    if (version != 1)
        return json_fail(j, t, err, "manifest format_version %" PRId64 ", but this zt reads version 1: "
                         "re-run this release's zt-prep, or use the zt release that wrote it", version);
    m->packed = -1;
    int options = zt_json_object_get(j, 0, "options");
    int layout = options >= 0 && j->tok[options].type == ZT_JSON_OBJECT
                     ? zt_json_object_get(j, options, "layout") : -1;
    if (layout >= 0) {
        if (zt_json_eq(j, layout, "packed")) m->packed = 1;
        else if (zt_json_eq(j, layout, "padded")) m->packed = 0;
        else return json_fail(j, layout, err, "options.layout must be \"packed\" or \"padded\"");
    }
    return ZT_OK;
}

/* A shard file name must stay inside the data set directory. */
static int plain_file_name(const char *s)
{
    return s[0] != '\0' && s[0] != '.' && strchr(s, '/') == NULL;
}

static zt_status parse_shard_entry(const zt_json *j, int entry, int64_t i, const char *split,
                                   manifest *m, zt_error *err)
{
    char where[64];
    snprintf(where, sizeof where, "shards[%" PRId64 "]", i);
    if (j->tok[entry].type != ZT_JSON_OBJECT)
        return json_fail(j, entry, err, "%s must be an object", where);
    int t;
    char *split_name = NULL;
    zt_status st = json_member(j, entry, "split", where, &t, err);
    if (!st) st = json_text(j, t, "split", &split_name, err);
    if (st) return st;
    if (strcmp(split_name, "train") != 0 && strcmp(split_name, "val") != 0) {
        free(split_name);
        return json_fail(j, t, err, "%s: \"split\" must be \"train\" or \"val\"", where);
    }
    int wanted = strcmp(split_name, split) == 0;
    free(split_name);

    manifest_shard s = {0};
    if ((st = json_member(j, entry, "file", where, &t, err)) ||
        (st = json_text(j, t, "file", &s.file, err)))
        return st;
    if (!plain_file_name(s.file)) {
        free(s.file);
        return json_fail(j, t, err, "%s: \"file\" must be a file name inside the data set directory "
                         "(no '/', not starting with '.')", where);
    }
    const char *counts[4] = {"samples", "tokens", "loss_tokens", "bytes"};
    int64_t *values[4] = {&s.n_samples, &s.n_tokens, &s.n_loss_tokens, &s.bytes};
    for (int k = 0; !st && k < 4; k++)
        if (!(st = json_member(j, entry, counts[k], where, &t, err)))
            st = json_integer(j, t, counts[k], 0, INT64_MAX, values[k], err);
    if (!st && !(st = json_member(j, entry, "checksum", where, &t, err)))
        st = json_hex64(j, t, "checksum", &s.checksum, err);
    if (st) {
        free(s.file);
        return st;
    }
    if (!wanted) {
        free(s.file);
        m->n_other_split++;
        return ZT_OK;
    }
    m->shards[m->n_shards++] = s;
    return ZT_OK;
}

static zt_status parse_manifest(const char *text, size_t len, const char *origin, const char *split,
                                manifest *m, zt_error *err)
{
    memset(m, 0, sizeof *m);
    zt_json j;
    zt_status st = zt_json_parse(text, len, origin, &j, err);
    if (st) return st;
    int shards;
    if (j.n_tok < 1 || j.tok[0].type != ZT_JSON_OBJECT) st = json_fail(&j, 0, err, "the manifest must be an object");
    if (!st) st = parse_header(&j, m, err);
    if (!st) st = parse_tokenizer(&j, 0, m, err);
    if (!st) st = json_member(&j, 0, "shards", "the manifest", &shards, err);
    if (!st && j.tok[shards].type != ZT_JSON_ARRAY)
        st = json_fail(&j, shards, err, "\"shards\" must be an array");
    if (!st) {
        int n = j.tok[shards].size;
        m->shards = calloc(n > 0 ? (size_t)n : 1, sizeof *m->shards);
        if (!m->shards) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", origin);
        int entry = shards + 1;
        for (int i = 0; !st && i < n; i++) {
            st = parse_shard_entry(&j, entry, i, split, m, err);
            entry = zt_json_skip(&j, entry);
        }
    }
    if (!st && m->n_shards == 0)
        st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                          "%s lists no \"%s\" shards (%" PRId64 " of the other split); run zt-prep "
                          "so that it writes a %s split, or use the other split",
                          origin, split, m->n_other_split, split);
    zt_json_free(&j);
    if (st) manifest_free(m);
    return st;
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
    char *manifest_path = NULL, *text = NULL;
    manifest m = {0};
    size_t len = 0;
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

    st = read_file(manifest_path, &text, &len, err);
    if (st == ZT_ERR_NOT_FOUND)
        zt_error_append(err, "\n%s is not a zt-prep data set, or zt-prep did not finish (it writes "
                        "manifest.json last): run zt-prep -o %s", l->dir, l->dir);
    if (!st) st = parse_manifest(text, len, manifest_path, l->split, &m, err);
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
    free(text);
    manifest_free(&m);
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
        st = json_fail(&j, 0, err, "a loader position must be an object");
    for (int i = 0; !st && i < N_KEYS; i++)
        st = json_member(&j, 0, keys[i], "the loader position", &tok[i], err);
    if (!st && j.tok[0].size != N_KEYS)
        st = json_fail(&j, 0, err, "the loader position has keys other than format, version, dataset, "
                       "seed, shuffle, world, rank, epoch, cursor and batches");
    if (!st && !zt_json_eq(&j, tok[0], "zt-loader-position"))
        st = json_fail(&j, tok[0], err, "\"format\" must be \"zt-loader-position\"");
    int64_t version = 0, world = 0, rank = 0, epoch = 0, cursor = 0, batches = 0;
    if (!st) st = json_integer(&j, tok[1], "version", 1, 1, &version, err);
    if (!st) st = json_hex64(&j, tok[2], "dataset", &p.dataset_hash, err);
    if (!st) st = json_hex64(&j, tok[3], "seed", &p.seed, err);
    if (!st) st = json_bool(&j, tok[4], "shuffle", &p.shuffle, err);
    if (!st) st = json_integer(&j, tok[5], "world", 1, INT32_MAX, &world, err);
    if (!st) st = json_integer(&j, tok[6], "rank", 0, world - 1, &rank, err);
    if (!st) st = json_integer(&j, tok[7], "epoch", 0, INT64_MAX, &epoch, err);
    if (!st) st = json_integer(&j, tok[8], "cursor", 0, INT64_MAX, &cursor, err);
    if (!st) st = json_integer(&j, tok[9], "batches", 0, INT64_MAX, &batches, err);
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
