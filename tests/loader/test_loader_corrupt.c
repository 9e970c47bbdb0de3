/* Bad data sets: every corruption gives a non-zero status and a message naming the file, what is
 * wrong and what to do. Damage comes in three kinds: raw (caught by the checksums), resealed (the
 * checksums are recomputed so the structural and content checks must catch it), and manifest
 * problems. Run it under the ASan build too: a hostile file must never cause an out-of-bounds read.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "data/loader.h"
#include "shard_writer.h"
#include "ztest.h"

#define HASH 0x0123456789abcdefull
#define VOCAB 100
#define SHARD "train-00000.ztshard"

static tw_samples g_samples;
static tw_image g_good; /* a valid train shard of six samples */
static char *g_root;    /* this test's directory; each case writes a fresh data set below it */
static int g_case;

static const tw_tokenizer g_tok = {.hash = HASH, .vocab_size = VOCAB, .bos_id = 1, .eos_id = 2,
                                   .pad_id = 0};

static void make_good(void)
{
    static const uint32_t t0[] = {1, 10, 11, 12}, t1[] = {1, 20, 21}, t2[] = {1, 30, 31, 32, 33},
                          t3[] = {1, 40}, t4[] = {1, 50, 51, 52, 53, 54, 55}, t5[] = {1, 60};
    static const uint8_t m0[] = {0, 0, 1, 1}, m1[] = {0, 1, 1}, m2[] = {0, 0, 0, 1, 1}, m3[] = {0, 1},
                         m4[] = {0, 0, 0, 0, 1, 1, 1}, m5[] = {0, 1};
    tw_samples_init(&g_samples);
    tw_samples_add(&g_samples, t0, m0, 4);
    tw_samples_add(&g_samples, t1, m1, 3);
    tw_samples_add(&g_samples, t2, m2, 5);
    tw_samples_add(&g_samples, t3, m3, 2);
    tw_samples_add(&g_samples, t4, m4, 7);
    tw_samples_add(&g_samples, t5, m5, 2);
    tw_shard_params p = {.token_bytes = 2, .vocab_size = VOCAB, .tokenizer_hash = HASH};
    tw_build(&g_samples, &p, &g_good);
}

static tw_image copy_good(void)
{
    tw_image c = {aligned_alloc(64, (g_good.size + 63) / 64 * 64), g_good.size};
    memcpy(c.data, g_good.data, g_good.size);
    return c;
}

/* A new, empty data set directory. */
static char *new_dir(void)
{
    char *dir = malloc(strlen(g_root) + 32);
    sprintf(dir, "%s/case%04d", g_root, g_case++);
    mkdir(dir, 0755);
    return dir;
}

static zt_status open_dir(const char *dir, const char *split, int verify, zt_error *err)
{
    zt_loader_options o;
    zt_loader_options_default(&o);
    o.dir = dir;
    o.split = split;
    o.micro_batch = 2;
    o.seq_len = 8;
    o.verify_checksums = verify;
    zt_loader *l = NULL;
    zt_status st = zt_loader_open(&o, &l, err);
    if (!st) {
        /* A data set that opens must also yield batches without trouble. */
        const zt_loader_batch *b;
        for (int i = 0; i < 8; i++) ZT_CHECK_INT(zt_loader_next(l, &b, err), ZT_OK);
        zt_loader_close(l);
    } else {
        ZT_CHECK(l == NULL);
    }
    return st;
}

/* Write img as the only train shard (with a manifest describing it as written) and open it. */
static zt_status open_image(const tw_image *img, int verify, zt_error *err, char **dir_out)
{
    char *dir = new_dir();
    tw_entry e = {SHARD, "train", img};
    ZT_CHECK_INT(tw_write_dataset(dir, &g_tok, &e, 1), 0);
    zt_status st = open_dir(dir, "train", verify, err);
    if (dir_out) *dir_out = dir;
    else free(dir);
    return st;
}

/* img must be rejected with `status` and a message containing the shard's path and `needle`. */
static void expect_bad_image(const tw_image *img, int verify, zt_status status, const char *needle,
                             int line)
{
    zt_error err = {0};
    char *dir;
    zt_status st = open_image(img, verify, &err, &dir);
    char path[512];
    snprintf(path, sizeof path, "%s/" SHARD ": ", dir);
    if (st != status || !strstr(err.msg, path) || !strstr(err.msg, needle)) {
        fprintf(stderr, "line %d: expected status %d with \"%s\" and \"%s\", got %d: %s\n", line,
                status, path, needle, st, err.msg);
        zt_test_failures++;
    }
    free(dir);
}
#define EXPECT_BAD(img, needle) expect_bad_image(img, 1, ZT_ERR_FORMAT, needle, __LINE__)

static void test_good_opens(void)
{
    zt_error err = {0};
    ZT_CHECK_INT(open_image(&g_good, 1, &err, NULL), ZT_OK);
}

static void test_truncation(void)
{
    /* Every prefix of the file, from empty to one byte short. */
    for (size_t size = 0; size < g_good.size; size++) {
        tw_image cut = copy_good();
        cut.size = size;
        char needle[128];
        if (size < 256)
            snprintf(needle, sizeof needle, "the file is %zu bytes, shorter than the 256-byte shard "
                     "header: it is truncated", size);
        else
            snprintf(needle, sizeof needle, "the file is truncated: its header (byte offset 88) says "
                     "%zu bytes but it has only %zu", g_good.size, size);
        expect_bad_image(&cut, 1, ZT_ERR_FORMAT, needle, __LINE__);
        tw_image_free(&cut);
    }
    /* Appended bytes. */
    tw_image longer = {aligned_alloc(64, (g_good.size + 3 + 63) / 64 * 64), g_good.size + 3};
    memcpy(longer.data, g_good.data, g_good.size);
    memset(longer.data + g_good.size, 0, 3);
    char needle[128];
    snprintf(needle, sizeof needle, "the file has %zu bytes but its header (byte offset 88) says %zu: "
             "something was appended", g_good.size + 3, g_good.size);
    EXPECT_BAD(&longer, needle);
    tw_image_free(&longer);
}

/* Flip each header byte: which check fires depends on the field hit. */
static void test_header_flips(void)
{
    for (size_t off = 0; off < 256; off++) {
        tw_image img = copy_good();
        img.data[off] ^= 0x40;
        const char *needle = off < 8     ? "not a zt shard: the file starts with"
                             : off < 12  ? "shard format version"
                             : off < 16  ? "header_size is"
                             : off < 128 ? "the header checksum (byte offset 120)"
                                         : "reserved header byte";
        EXPECT_BAD(&img, needle);
        tw_image_free(&img);
    }
}

/* Flip bytes inside each section, and in the padding between sections. */
static void test_section_flips(void)
{
    const struct { const char *name; size_t field; uint64_t bytes; } sec[3] = {
        {"tokens", TW_OFF_TOKENS, g_samples.n_tokens * 2},
        {"mask", TW_OFF_MASK, g_samples.n_tokens},
        {"index", TW_OFF_INDEX, (g_samples.n_samples + 1) * 8},
    };
    for (int s = 0; s < 3; s++) {
        uint64_t at = tw_get_u64(&g_good, sec[s].field);
        for (uint64_t i = 0; i < sec[s].bytes; i += 5) {
            tw_image img = copy_good();
            img.data[at + i] ^= 0x01;
            char needle[160];
            snprintf(needle, sizeof needle, "the %s section (bytes %" PRIu64 "-%" PRIu64 ") is corrupt: "
                     "its checksum is", sec[s].name, at, at + sec[s].bytes);
            EXPECT_BAD(&img, needle);
            tw_image_free(&img);
        }
    }
    /* The padding after the tokens section is covered only by the manifest's file checksum. */
    uint64_t gap = tw_get_u64(&g_good, TW_OFF_TOKENS) + g_samples.n_tokens * 2;
    ZT_CHECK(gap < tw_get_u64(&g_good, TW_OFF_MASK));
    tw_image img = copy_good();
    img.data[gap] ^= 0x01;
    zt_error err = {0};
    char *dir = new_dir();
    tw_entry e = {SHARD, "train", &g_good}; /* the manifest describes the undamaged file */
    ZT_CHECK_INT(tw_write_dataset(dir, &g_tok, &e, 1), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/" SHARD, dir);
    ZT_CHECK_INT(tw_write_file(path, img.data, img.size), 0);
    ZT_CHECK_INT(open_dir(dir, "train", 1, &err), ZT_ERR_FORMAT);
    char needle[160];
    snprintf(needle, sizeof needle, "the file's checksum is %016" PRIx64 " but manifest.json records %016"
             PRIx64, tw_fnv1a64(img.data, img.size), tw_fnv1a64(g_good.data, g_good.size));
    ZT_CHECK_CONTAINS(err.msg, needle);
    ZT_CHECK_CONTAINS(err.msg, "re-run zt-prep");
    /* Without the checksum pass the padding is not read, and the set opens. */
    ZT_CHECK_INT(open_dir(dir, "train", 0, &err), ZT_OK);
    free(dir);
    tw_image_free(&img);
}

/* Damage behind valid checksums: the structural and content checks must catch it. */
static void test_resealed(void)
{
    const uint64_t tokens_at = tw_get_u64(&g_good, TW_OFF_TOKENS);
    const uint64_t mask_at = tw_get_u64(&g_good, TW_OFF_MASK);
    const uint64_t index_at = tw_get_u64(&g_good, TW_OFF_INDEX);
    const uint64_t n_tokens = g_samples.n_tokens; /* 23 */
    tw_image img;

    /* token 5 is the second token of sample 1 */
    img = copy_good();
    img.data[tokens_at + 10] = VOCAB;
    tw_reseal(&img);
    char needle[200];
    snprintf(needle, sizeof needle, "token 5 (sample 1, byte %" PRIu64 ") has id 100, not below "
             "vocab_size 100", tokens_at + 10);
    EXPECT_BAD(&img, needle);
    /* The same damage without resealing is a checksum error; with the checksum pass skipped the
     * token check still catches it. */
    tw_image raw = copy_good();
    raw.data[tokens_at + 10] = VOCAB;
    expect_bad_image(&raw, 0, ZT_ERR_FORMAT, needle, __LINE__);
    tw_image_free(&raw);
    tw_image_free(&img);

    img = copy_good();
    img.data[mask_at + 9] = 2;
    tw_reseal(&img);
    snprintf(needle, sizeof needle, "loss mask byte 9 (sample 2, byte %" PRIu64 ") is 2; mask bytes must "
             "be 0 or 1", mask_at + 9);
    EXPECT_BAD(&img, needle);
    tw_image_free(&img);

    img = copy_good();
    tw_put_u64(&img, TW_OFF_N_LOSS, 12);
    tw_reseal(&img);
    EXPECT_BAD(&img, "the loss mask has 11 ones but header field n_loss_tokens says 12");
    tw_image_free(&img);

    /* index = 0 4 7 12 14 21 23; make index[2] = 3 < index[1] */
    img = copy_good();
    tw_put_u64(&img, index_at + 16, 3);
    tw_reseal(&img);
    snprintf(needle, sizeof needle, "the index is not increasing: index[2] = 3 (byte %" PRIu64 ") is not "
             "above index[1] = 4, so sample 1 would be empty or reversed", index_at + 16);
    EXPECT_BAD(&img, needle);
    tw_image_free(&img);

    img = copy_good();
    tw_put_u64(&img, index_at + 8, 4); /* unchanged: 4; now an empty sample 1 */
    tw_put_u64(&img, index_at + 16, 4);
    tw_reseal(&img);
    EXPECT_BAD(&img, "index[2] = 4");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u64(&img, index_at, 1);
    tw_reseal(&img);
    EXPECT_BAD(&img, "index[0] (byte");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u64(&img, index_at + 8 * 3, 1000);
    tw_reseal(&img);
    EXPECT_BAD(&img, "index[3] (byte");
    EXPECT_BAD(&img, "is 1000, beyond n_tokens 23");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u64(&img, index_at + 8 * 6, n_tokens - 1);
    tw_reseal(&img);
    EXPECT_BAD(&img, "index[n_samples] = index[6] is 22 but n_tokens is 23");
    tw_image_free(&img);

    /* version is checked before the header checksum: no reseal needed */
    img = copy_good();
    tw_put_u32(&img, TW_OFF_VERSION, 2);
    EXPECT_BAD(&img, "shard format version 2 (header byte offset 8), but this zt reads version 1: "
                     "re-run this release's zt-prep");
    tw_image_free(&img);

    img = copy_good();
    memcpy(img.data, "GGUF\3\0\0\0", 8);
    EXPECT_BAD(&img, "not a zt shard: the file starts with \"GGUF\\x03\\x00\\x00\\x00\"");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u32(&img, TW_OFF_TOKEN_BYTES, 3);
    tw_reseal_header(&img);
    EXPECT_BAD(&img, "token_bytes is 3 (header byte offset 16); it must be 2 or 4");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u32(&img, TW_OFF_VOCAB, 0);
    tw_reseal_header(&img);
    EXPECT_BAD(&img, "vocab_size 0 (header byte offset 24) is invalid for 2-byte token ids");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u32(&img, TW_OFF_VOCAB, 70000);
    tw_reseal_header(&img);
    EXPECT_BAD(&img, "vocab_size 70000 (header byte offset 24) is invalid for 2-byte token ids");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u32(&img, TW_OFF_FLAGS, 4);
    tw_reseal_header(&img);
    EXPECT_BAD(&img, "flags 0x4 (header byte offset 20) has bits this zt does not know");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u64(&img, TW_OFF_MASK, mask_at + 1);
    tw_reseal_header(&img);
    snprintf(needle, sizeof needle, "the mask section offset %" PRIu64 " (header byte offset 72) is not a "
             "multiple of 64", mask_at + 1);
    EXPECT_BAD(&img, needle);
    tw_image_free(&img);

    img = copy_good();
    tw_put_u64(&img, TW_OFF_MASK, tokens_at);
    tw_reseal_header(&img);
    snprintf(needle, sizeof needle, "the mask section starts at byte %" PRIu64 " (header byte offset 72), "
             "before the end of what precedes it (byte %" PRIu64 ")", tokens_at, tokens_at + 2 * n_tokens);
    EXPECT_BAD(&img, needle);
    tw_image_free(&img);

    img = copy_good();
    tw_put_u64(&img, TW_OFF_TOKENS, 128);
    tw_reseal_header(&img);
    EXPECT_BAD(&img, "the tokens section starts at byte 128 (header byte offset 64), before the end of "
                     "what precedes it (byte 256)");
    tw_image_free(&img);

    /* Counts far beyond the file, including ones whose byte sizes overflow 64 bits. Counts above
     * 2^63 cannot appear in a manifest, so those go to zt_shard_validate directly. */
    const struct { uint32_t token_bytes; uint64_t n_tokens, n_samples; const char *needle; } huge[] = {
        {2, 1000, 6, "the tokens section (1000 x 2 bytes from header field n_tokens, at byte 256) "
                     "does not fit in the 440-byte file"},
        {2, 1ull << 62, 6, "the tokens section (4611686018427387904 x 2 bytes"},
        {4, 1ull << 62, 6, "the tokens section (4611686018427387904 x 4 bytes"}, /* 2^64: wraps to 0 */
        {4, (1ull << 62) + 1, 6, "the tokens section (4611686018427387905 x 4 bytes"},
        {2, UINT64_MAX / 2 + 1, 6, "the tokens section (9223372036854775808 x 2 bytes"},
        {2, UINT64_MAX, 6, "the tokens section (18446744073709551615 x 2 bytes"},
        {2, UINT64_MAX, UINT64_MAX, "the tokens section (18446744073709551615 x 2 bytes"},
        {2, 23, UINT64_MAX, "header counts are inconsistent: n_samples 18446744073709551615"},
        {2, 23, 20, "the index section (21 x 8 bytes from header field n_samples + 1, at byte 384) "
                    "does not fit"},
        {2, 23, 24, "header counts are inconsistent: n_samples 24"},
    };
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        img = copy_good();
        tw_put_u32(&img, TW_OFF_TOKEN_BYTES, huge[i].token_bytes);
        tw_put_u64(&img, TW_OFF_N_TOKENS, huge[i].n_tokens);
        tw_put_u64(&img, TW_OFF_N_SAMPLES, huge[i].n_samples);
        tw_reseal_header(&img);
        if (huge[i].n_tokens <= INT64_MAX && huge[i].n_samples <= INT64_MAX) EXPECT_BAD(&img, huge[i].needle);
        zt_shard_view view;
        zt_error err = {0};
        ZT_CHECK_INT(zt_shard_validate(img.data, img.size, "direct.ztshard", NULL, &view, &err),
                     ZT_ERR_FORMAT);
        ZT_CHECK_CONTAINS(err.msg, "direct.ztshard: ");
        ZT_CHECK_CONTAINS(err.msg, huge[i].needle);
        tw_image_free(&img);
    }

    /* the file is a validation shard, the manifest says train */
    img = copy_good();
    tw_put_u32(&img, TW_OFF_FLAGS, 1);
    tw_reseal_header(&img);
    EXPECT_BAD(&img, "the shard holds validation samples but manifest.json lists it under split "
                     "\"train\"");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u32(&img, TW_OFF_SHARD_INDEX, 5);
    tw_reseal_header(&img);
    EXPECT_BAD(&img, "header field shard_index is 5 but");
    EXPECT_BAD(&img, "lists it as \"train\" shard 0");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u64(&img, TW_OFF_TOKENIZER_HASH, 99);
    tw_reseal_header(&img);
    EXPECT_BAD(&img, "tokenized with tokenizer 0000000000000063 but the data set's manifest says "
                     "0123456789abcdef");
    tw_image_free(&img);

    img = copy_good();
    tw_put_u32(&img, TW_OFF_VOCAB, 101);
    tw_reseal_header(&img);
    EXPECT_BAD(&img, "vocab_size 101 differs from the manifest's 100");
    tw_image_free(&img);
}

/* A manifest written by the test; returns the directory (with the good shard in it). */
static char *with_manifest(const char *manifest)
{
    char *dir = new_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/" SHARD, dir);
    ZT_CHECK_INT(tw_write_file(path, g_good.data, g_good.size), 0);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    ZT_CHECK_INT(tw_write_file(path, manifest, strlen(manifest)), 0);
    return dir;
}

static void expect_manifest_error(const char *manifest, const char *split, zt_status status,
                                  const char *needle, int line)
{
    char *dir = with_manifest(manifest);
    zt_error err = {0};
    zt_status st = open_dir(dir, split, 1, &err);
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/manifest.json", dir);
    if (st != status || !strstr(err.msg, prefix) || !strstr(err.msg, needle)) {
        fprintf(stderr, "line %d: expected status %d with \"%s\" and \"%s\", got %d: %s\n", line,
                status, prefix, needle, st, err.msg);
        zt_test_failures++;
    }
    free(dir);
}
#define EXPECT_MANIFEST(manifest, needle) \
    expect_manifest_error(manifest, "train", ZT_ERR_FORMAT, needle, __LINE__)

#define HEAD "\"format\": \"zt-prep-manifest\", \"format_version\": 1"
#define COUNTS "\"samples\": 6, \"tokens\": 23, \"loss_tokens\": 11"

static void test_manifest(void)
{
    char good_entry[512];
    snprintf(good_entry, sizeof good_entry,
             "{\"file\": \"" SHARD "\", \"split\": \"train\", " COUNTS ", \"bytes\": %zu, "
             "\"checksum\": \"%016" PRIx64 "\"}",
             g_good.size, tw_fnv1a64(g_good.data, g_good.size));
    const char *tok = HEAD ", \"tokenizer\": {\"hash\": \"0123456789abcdef\", \"vocab_size\": 100, "
                      "\"bos_id\": 1, \"eos_id\": 2, \"pad_id\": 0}";
    char m[2048];

    /* the test's own manifest, well formed: it opens (so the cases below fail for their reason) */
    snprintf(m, sizeof m, "{%s, \"shards\": [%s]}", tok, good_entry);
    char *dir = with_manifest(m);
    zt_error err = {0};
    ZT_CHECK_INT(open_dir(dir, "train", 1, &err), ZT_OK);
    free(dir);

    /* JSON syntax error: the JSON reader's message with the file's path and line */
    snprintf(m, sizeof m, "{%s,\n \"shards\": [%s,]}", tok, good_entry);
    EXPECT_MANIFEST(m, "manifest.json:2:");
    EXPECT_MANIFEST("", "manifest.json:1:");
    EXPECT_MANIFEST("[]", "manifest.json:1:1: the manifest must be an object");

    /* not zt-prep's, or a newer zt-prep's */
    snprintf(m, sizeof m, "{\"format\": \"hf-dataset\", \"format_version\": 1, \"shards\": []}");
    EXPECT_MANIFEST(m, "manifest.json:1:13: \"format\" is not \"zt-prep-manifest\": this manifest.json "
                       "was not written by zt-prep");
    snprintf(m, sizeof m, "{\"format_version\": 1, \"shards\": []}");
    EXPECT_MANIFEST(m, "manifest.json:1:1: the manifest has no \"format\"");
    snprintf(m, sizeof m, "{\"format\": \"zt-prep-manifest\",\n \"format_version\": 2, \"shards\": []}");
    EXPECT_MANIFEST(m, "manifest.json:2:20: manifest format_version 2, but this zt reads version 1");
    snprintf(m, sizeof m, "{%s, \"options\": {\"layout\": \"diagonal\"}, \"shards\": [%s]}", tok,
             good_entry);
    EXPECT_MANIFEST(m, "options.layout must be \"packed\" or \"padded\"");

    snprintf(m, sizeof m, "{" HEAD ", \"shards\": [%s]}", good_entry);
    EXPECT_MANIFEST(m, "manifest.json:1:1: the manifest has no \"tokenizer\"");
    snprintf(m, sizeof m, "{%s}", tok);
    EXPECT_MANIFEST(m, "manifest.json:1:1: the manifest has no \"shards\"");
    snprintf(m, sizeof m, "{%s,\n\"shards\": {}}", tok);
    EXPECT_MANIFEST(m, "manifest.json:2:11: \"shards\" must be an array");
    snprintf(m, sizeof m, "{%s, \"shards\": [7]}", tok);
    EXPECT_MANIFEST(m, "shards[0] must be an object");
    snprintf(m, sizeof m, "{\"tokenizer\": {\"hash\": \"0123456789abcdeg\", \"vocab_size\": 100, "
             "\"bos_id\": 1, \"eos_id\": 2, \"pad_id\": 0}, " HEAD ", \"shards\": [%s]}", good_entry);
    EXPECT_MANIFEST(m, "manifest.json:1:25: \"hash\" must be a string of 16 hex digits, found "
                       "0123456789abcdeg");
    snprintf(m, sizeof m, "{" HEAD ", \"tokenizer\": {\"hash\": \"0123456789abcdef\", \"vocab_size\": "
             "100, \"bos_id\": 1, \"eos_id\": 2, \"pad_id\": 100}, \"shards\": [%s]}", good_entry);
    EXPECT_MANIFEST(m, "\"pad_id\" must be an integer in [-1, 99], found 100");
    snprintf(m, sizeof m, "{" HEAD ", \"tokenizer\": {\"hash\": \"0123456789abcdef\", \"vocab_size\": "
             "1.5e2, \"bos_id\": 1, \"eos_id\": 2, \"pad_id\": 0}, \"shards\": [%s]}", good_entry);
    EXPECT_MANIFEST(m, "\"vocab_size\" must be an integer in [1, 2147483647], found 1.5e2");
    snprintf(m, sizeof m, "{" HEAD ", \"tokenizer\": {\"hash\": \"0123456789abcdef\", \"vocab_size\": "
             "100, \"eos_id\": 2, \"pad_id\": 0}, \"shards\": [%s]}", good_entry);
    EXPECT_MANIFEST(m, "\"tokenizer\" has no \"bos_id\"");

#define SUM "\"checksum\": \"0000000000000000\""
    const struct { const char *entry, *needle; } entries[] = {
        {"{\"file\": \"" SHARD "\", \"split\": \"test\", " COUNTS ", \"bytes\": 1, " SUM "}",
         "shards[0]: \"split\" must be \"train\" or \"val\""},
        {"{\"file\": \"../" SHARD "\", \"split\": \"train\", " COUNTS ", \"bytes\": 1, " SUM "}",
         "shards[0]: \"file\" must be a file name inside the data set directory"},
        {"{\"file\": \"/etc/passwd\", \"split\": \"train\", " COUNTS ", \"bytes\": 1, " SUM "}",
         "shards[0]: \"file\" must be a file name inside the data set directory"},
        {"{\"file\": 5, \"split\": \"train\", " COUNTS ", \"bytes\": 1, " SUM "}",
         "\"file\" must be a string"},
        {"{\"file\": \"" SHARD "\", \"split\": \"train\", " COUNTS ", \"bytes\": \"1\", " SUM "}",
         "\"bytes\" must be an integer in [0, 9223372036854775807], found \"1\""},
        {"{\"file\": \"" SHARD "\", \"split\": \"train\", " COUNTS ", \"bytes\": -1, " SUM "}",
         "\"bytes\" must be an integer in [0, 9223372036854775807], found -1"},
        {"{\"file\": \"" SHARD "\", \"split\": \"train\", " COUNTS ", \"bytes\": 1, \"checksum\": 0}",
         "\"checksum\" must be a string of 16 hex digits, found 0"},
        {"{\"file\": \"" SHARD "\", \"split\": \"train\", " COUNTS ", " SUM "}",
         "shards[0] has no \"bytes\""},
        {"{\"file\": \"" SHARD "\", \"split\": \"train\", \"tokens\": 23, \"loss_tokens\": 11, "
         "\"bytes\": 1, " SUM "}",
         "shards[0] has no \"samples\""},
    };
#undef SUM
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        snprintf(m, sizeof m, "{%s, \"shards\": [%s]}", tok, entries[i].entry);
        expect_manifest_error(m, "train", ZT_ERR_FORMAT, entries[i].needle, __LINE__);
    }

    /* counts that differ from the shard's */
    const struct { const char *counts, *needle; } wrong[] = {
        {"\"samples\": 6, \"tokens\": 23, \"loss_tokens\": 11, \"bytes\": 441",
         "the shard has 440 bytes but"},
        {"\"samples\": 7, \"tokens\": 23, \"loss_tokens\": 11, \"bytes\": 440",
         "the shard has 6 samples but"},
        {"\"samples\": 6, \"tokens\": 22, \"loss_tokens\": 11, \"bytes\": 440",
         "the shard has 23 tokens but"},
        {"\"samples\": 6, \"tokens\": 23, \"loss_tokens\": 0, \"bytes\": 440",
         "the shard has 11 loss_tokens but"},
    };
    ZT_CHECK_INT(g_good.size, 440);
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        snprintf(m, sizeof m, "{%s, \"shards\": [{\"file\": \"" SHARD "\", \"split\": \"train\", %s, "
                 "\"checksum\": \"%016" PRIx64 "\"}]}", tok, wrong[i].counts,
                 tw_fnv1a64(g_good.data, g_good.size));
        EXPECT_MANIFEST(m, wrong[i].needle);
        EXPECT_MANIFEST(m, "the file was replaced or the manifest belongs to another run");
    }

    /* no shards of the wanted split */
    snprintf(m, sizeof m, "{%s, \"shards\": [%s]}", tok, good_entry);
    expect_manifest_error(m, "val", ZT_ERR_NOT_FOUND,
                          "lists no \"val\" shards (1 of the other split); run zt-prep so that it "
                          "writes a val split", __LINE__);
}

static void test_missing_files(void)
{
    /* no manifest at all */
    char *dir = new_dir();
    zt_error err = {0};
    ZT_CHECK_INT(open_dir(dir, "train", 1, &err), ZT_ERR_NOT_FOUND);
    char needle[1024];
    snprintf(needle, sizeof needle, "cannot open %s/manifest.json: No such file or directory", dir);
    ZT_CHECK_CONTAINS(err.msg, needle);
    ZT_CHECK_CONTAINS(err.msg, "is not a zt-prep data set, or zt-prep did not finish");
    free(dir);

    /* a shard the manifest lists is missing */
    dir = new_dir();
    tw_entry e[2] = {{SHARD, "train", &g_good}, {"train-00001.ztshard", "train", NULL}};
    ZT_CHECK_INT(tw_write_dataset(dir, &g_tok, e, 2), 0);
    ZT_CHECK_INT(open_dir(dir, "train", 1, &err), ZT_ERR_NOT_FOUND);
    snprintf(needle, sizeof needle, "cannot open shard %s/train-00001.ztshard: No such file or "
             "directory; manifest.json lists it, so the data set is incomplete", dir);
    ZT_CHECK_CONTAINS(err.msg, needle);
    free(dir);

    /* a directory where a shard should be */
    dir = new_dir();
    tw_entry d = {SHARD, "train", NULL};
    ZT_CHECK_INT(tw_write_dataset(dir, &g_tok, &d, 1), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/" SHARD, dir);
    mkdir(path, 0755);
    ZT_CHECK_INT(open_dir(dir, "train", 1, &err), ZT_ERR_IO);
    snprintf(needle, sizeof needle, "shard %s is not a regular file", path);
    ZT_CHECK_CONTAINS(err.msg, needle);
    free(dir);
}

/* Two shards of different tokenizers: the second is named. */
static void test_mixed_shards(void)
{
    tw_shard_params p = {.token_bytes = 2, .vocab_size = VOCAB, .tokenizer_hash = HASH + 1,
                         .shard_index = 1};
    tw_image other;
    tw_build(&g_samples, &p, &other);
    char *dir = new_dir();
    tw_entry e[2] = {{SHARD, "train", &g_good}, {"train-00001.ztshard", "train", &other}};
    ZT_CHECK_INT(tw_write_dataset(dir, &g_tok, e, 2), 0);
    zt_error err = {0};
    ZT_CHECK_INT(open_dir(dir, "train", 1, &err), ZT_ERR_FORMAT);
    char needle[512];
    snprintf(needle, sizeof needle, "%s/train-00001.ztshard: tokenized with tokenizer 0123456789abcdf0 "
             "but the data set's manifest says 0123456789abcdef: shards of different zt-prep runs were "
             "mixed", dir);
    ZT_CHECK_CONTAINS(err.msg, needle);
    free(dir);
    tw_image_free(&other);
}

static void test_bad_options(void)
{
    char *dir = new_dir();
    tw_entry e = {SHARD, "train", &g_good};
    ZT_CHECK_INT(tw_write_dataset(dir, &g_tok, &e, 1), 0);
    zt_loader *l = NULL;
    zt_error err = {0};
    zt_loader_options o;

    zt_loader_options_default(&o);
    o.dir = dir;
    o.split = "test";
    ZT_CHECK_INT(zt_loader_open(&o, &l, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "loader: split must be \"train\" or \"val\", not \"test\"");

    zt_loader_options_default(&o);
    o.dir = dir;
    o.seq_len = 1;
    ZT_CHECK_INT(zt_loader_open(&o, &l, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "loader: micro_batch 1 x seq_len 1 is invalid");

    zt_loader_options_default(&o);
    o.dir = dir;
    o.world = 2;
    o.rank = 2;
    ZT_CHECK_INT(zt_loader_open(&o, &l, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "loader: rank 2 of world 2 is invalid");

    zt_loader_options_default(&o);
    o.dir = dir;
    o.world = 7;
    ZT_CHECK_INT(zt_loader_open(&o, &l, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "has 6 samples, fewer than the 7 data-parallel ranks");

    zt_loader_options_default(&o);
    o.dir = dir;
    o.tokenizer_hash = 0x1111111111111111ull;
    ZT_CHECK_INT(zt_loader_open(&o, &l, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "was tokenized with tokenizer 0123456789abcdef but this run's tokenizer "
                               "is 1111111111111111");

    zt_loader_options_default(&o);
    o.dir = dir;
    o.model_vocab_size = 64;
    ZT_CHECK_INT(zt_loader_open(&o, &l, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "has vocab_size 100 (manifest tokenizer) but the model has only 64 "
                               "embeddings");

    /* matching run settings are accepted */
    zt_loader_options_default(&o);
    o.dir = dir;
    o.tokenizer_hash = HASH;
    o.model_vocab_size = 128;
    ZT_CHECK_INT(zt_loader_open(&o, &l, &err), ZT_OK);
    zt_loader_close(l);
    free(dir);
}

int main(void)
{
    g_root = tw_make_temp_dir("corrupt");
    make_good();
    test_good_opens();
    test_truncation();
    test_header_flips();
    test_section_flips();
    test_resealed();
    test_manifest();
    test_missing_files();
    test_mixed_shards();
    test_bad_options();
    tw_image_free(&g_good);
    tw_samples_free(&g_samples);
    if (!zt_test_failures) tw_remove_tree(g_root);
    free(g_root);
    return zt_test_result();
}
