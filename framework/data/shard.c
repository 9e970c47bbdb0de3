/* One shard image: zt_shard_validate proves every bound, checksum and count of a shard before the
 * loader reads a byte of it (loader.h says what is checked; shard_format.h is the layout). A hostile
 * file gives an error, never a crash (tests/fuzz/fuzz_shard.c). */
#include "data/loader_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/checksum.h"
#include "data/shard_format.h"

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
