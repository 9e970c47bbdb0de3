/* Every way the sentencepiece plugin can be handed bad input gives the right status and a message
 * that says what, where and how to fix it: unreadable, foreign, truncated and empty model files,
 * invalid UTF-8 (with the byte offset), buffers too small (with the size needed), ids outside the
 * vocabulary, and a bad info struct.
 *
 *   test_spm_errors PLUGINS_D WORK_DIR      (WORK_DIR from make_references.sh) */
#include <stdlib.h>
#include <string.h>

#include "tk_common.h"
#include "ztest.h"

static tk_plugin plugin;
static const char *work;

/* open() must fail with `status` and a message holding every one of the NULL-terminated needles. */
static void expect_open_fails(const char *path, zt_status status, const char *const *needles)
{
    zt_tokenizer_model *m = (zt_tokenizer_model *)&plugin; /* non-NULL: open() must reset it */
    zt_status got = plugin.ops->open(plugin.state, path, &m);
    ZT_CHECK_INT(got, status);
    ZT_CHECK(m == NULL);
    zt_status reported;
    const char *msg = tk_take_error(&plugin, &reported);
    ZT_CHECK_INT(reported, status);
    char quoted[4200];
    snprintf(quoted, sizeof quoted, "cannot load tokenizer model '%s': ", path);
    ZT_CHECK_CONTAINS(msg, quoted);
    ZT_CHECK_CONTAINS(msg, "pass a SentencePiece .model file (zt-prep -t)");
    for (; *needles; needles++) ZT_CHECK_CONTAINS(msg, *needles);
    if (got == ZT_OK) plugin.ops->close(m);
}

static void check_bad_model_files(const char *model_bytes, size_t model_size)
{
    expect_open_fails(tk_path(work, "no-such-file.model"), ZT_ERR_IO,
                      (const char *[]){"cannot open it: No such file or directory", NULL});
    expect_open_fails(work, ZT_ERR_IO, (const char *[]){"it is a directory", NULL});

    const char *json = "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\", \"vocab\": {}}}\n";
    tk_write_file(tk_path(work, "tokenizer.json"), json, strlen(json));
    expect_open_fails(tk_path(work, "tokenizer.json"), ZT_ERR_FORMAT,
                      (const char *[]){"it is not a SentencePiece model: byte 0 (0x7b)",
                                       "looks like JSON", NULL});

    tk_write_file(tk_path(work, "empty.model"), "", 0);
    expect_open_fails(tk_path(work, "empty.model"), ZT_ERR_FORMAT,
                      (const char *[]){"the file is empty", NULL});
    expect_open_fails(tk_path(work, "bpe.vocab"), ZT_ERR_FORMAT,
                      (const char *[]){"it is not a SentencePiece model", "looks like text", NULL});

    /* Cut in the middle of a vocabulary entry: protobuf framing runs past the end. */
    tk_write_file(tk_path(work, "half.model"), model_bytes, model_size / 2);
    char runs_past[128];
    snprintf(runs_past, sizeof runs_past, "runs past the end of the file (%zu bytes)", model_size / 2);
    expect_open_fails(tk_path(work, "half.model"), ZT_ERR_FORMAT,
                      (const char *[]){"it is truncated: the entry starting at byte", runs_past, NULL});

    /* Cut exactly after the first vocabulary entry (field 1, length-delimited: tag 0x0a, then a
     * one-byte length): well-formed protobuf that libsentencepiece alone would load. */
    ZT_CHECK_INT((unsigned char)model_bytes[0], 0x0a);
    ZT_CHECK((unsigned char)model_bytes[1] < 0x80);
    size_t first_entry = 2 + (unsigned char)model_bytes[1];
    tk_write_file(tk_path(work, "one-piece.model"), model_bytes, first_entry);
    expect_open_fails(tk_path(work, "one-piece.model"), ZT_ERR_FORMAT,
                      (const char *[]){"it is truncated or incomplete: it stops after 1 "
                                       "vocabulary piece(s) without the trainer_spec and "
                                       "normalizer_spec sections", NULL});

    /* Hand-made ModelProtos, written byte by byte. pieces {piece: "a"}, trainer_spec
     * {model_type: 9}, normalizer_spec {}: no such model type. */
    const unsigned char bad_type[] = {0x0a, 0x03, 0x0a, 0x01, 'a', 0x12, 0x02, 0x18, 0x09, 0x1a, 0x00};
    tk_write_file(tk_path(work, "bad-type.model"), bad_type, sizeof bad_type);
    expect_open_fails(tk_path(work, "bad-type.model"), ZT_ERR_FORMAT,
                      (const char *[]){"trainer_spec.model_type is 9, which is none of", NULL});
    /* Well-framed, but the vocabulary has no <unk>: libsentencepiece itself refuses it. */
    const unsigned char no_unk[] = {0x0a, 0x03, 0x0a, 0x01, 'a', 0x12, 0x00, 0x1a, 0x00};
    tk_write_file(tk_path(work, "no-unk.model"), no_unk, sizeof no_unk);
    expect_open_fails(tk_path(work, "no-unk.model"), ZT_ERR_FORMAT,
                      (const char *[]){"SentencePiece rejected it: ", "unk is not defined", NULL});
}

/* encode() of invalid UTF-8 fails with the offset of the first bad byte (hand-computed). */
static void check_invalid_utf8(zt_tokenizer_model *m)
{
    static const struct {
        const char *text;
        size_t offset;
        const char *why;
    } cases[] = {
        {"abc\xff", 3, "byte that never occurs in UTF-8"},
        {"h\xc3\xa9llo\x80", 6, "continuation byte without a lead byte"},
        {"\xc0\xaf", 0, "overlong 2-byte encoding"},
        {"ab\xe0\x80\xaf", 2, "overlong 3-byte encoding"},
        {"\xf0\x82\x82\xac", 0, "overlong 4-byte encoding"},
        {"ok \xed\xa0\x80", 3, "UTF-16 surrogate code point"},
        {"x\xf4\x90\x80\x80", 1, "code point above U+10FFFF"},
        {"\xe4\xb8\xad\xe6\x96", 3, "cut short by the end of the text"},
        {"\xe6\x96z", 0, "cut short by a byte that is not a continuation byte"},
        {"\xf0\x9f\x8d\x41", 0, "cut short by a byte that is not a continuation byte"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t ids[64];
        uint64_t n = 12345;
        size_t len = strlen(cases[i].text);
        ZT_CHECK_INT(plugin.ops->encode(m, cases[i].text, len, ids, 64, &n), ZT_ERR_INVALID_ARG);
        const char *msg = tk_take_error(&plugin, NULL);
        char where[128];
        snprintf(where, sizeof where, "invalid UTF-8 at byte offset %zu of %zu (byte 0x%02x)",
                 cases[i].offset, len, (unsigned char)cases[i].text[cases[i].offset]);
        ZT_CHECK_CONTAINS(msg, where);
        ZT_CHECK_CONTAINS(msg, cases[i].why);
        ZT_CHECK_CONTAINS(msg, "convert the input to UTF-8");
    }
    /* The edges of the valid range are accepted: U+0000, U+007F, U+0080, U+07FF, U+0800, U+D7FF,
     * U+E000, U+FFFF, U+10000, U+10FFFF. */
    static const char edges[] = "\x00\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80"
                                "\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf";
    int32_t ids[256];
    uint64_t n = 0;
    ZT_CHECK_INT(plugin.ops->encode(m, edges, sizeof edges - 1, ids, 256, &n), ZT_OK);
    ZT_CHECK(n > 0);
}

static void check_small_buffers(zt_tokenizer_model *m)
{
    const char *text = "The quick brown fox jumps over the lazy dog.";
    uint64_t needed = 0;
    int32_t *all = tk_encode(&plugin, m, text, strlen(text), &needed);
    ZT_CHECK(needed > 4);

    /* Size query: no buffer at all. */
    uint64_t n = 0;
    ZT_CHECK_INT(plugin.ops->encode(m, text, strlen(text), NULL, 0, &n), ZT_ERR_BUFFER_TOO_SMALL);
    ZT_CHECK_INT(n, needed);
    tk_take_error(&plugin, NULL);

    /* Three slots: the first three ids are written, the next slot is untouched. */
    int32_t ids[4] = {-7, -7, -7, -7};
    ZT_CHECK_INT(plugin.ops->encode(m, text, strlen(text), ids, 3, &n), ZT_ERR_BUFFER_TOO_SMALL);
    ZT_CHECK_INT(n, needed);
    ZT_CHECK(memcmp(ids, all, 3 * sizeof *ids) == 0);
    ZT_CHECK_INT(ids[3], -7);
    char expected[160];
    snprintf(expected, sizeof expected,
             "encode needs room for %llu ids but the buffer holds 3; call again with cap >= %llu",
             (unsigned long long)needed, (unsigned long long)needed);
    ZT_CHECK_CONTAINS(tk_take_error(&plugin, NULL), expected);

    /* Decode with room for the text but not its NUL: the text is written, nothing after it. */
    uint64_t text_len = strlen(text), len = 0;
    char out[128];
    memset(out, '#', sizeof out);
    ZT_CHECK_INT(plugin.ops->decode(m, all, needed, out, text_len, &len), ZT_ERR_BUFFER_TOO_SMALL);
    ZT_CHECK_INT(len, text_len);
    ZT_CHECK(memcmp(out, text, text_len) == 0);
    ZT_CHECK_INT(out[text_len], '#');
    snprintf(expected, sizeof expected,
             "decode needs %llu bytes plus a terminating NUL but the buffer holds %llu; call again "
             "with cap >= %llu",
             (unsigned long long)text_len, (unsigned long long)text_len,
             (unsigned long long)text_len + 1);
    ZT_CHECK_CONTAINS(tk_take_error(&plugin, NULL), expected);
    /* ...and with exactly enough room it succeeds and terminates. */
    ZT_CHECK_INT(plugin.ops->decode(m, all, needed, out, text_len + 1, &len), ZT_OK);
    ZT_CHECK(strcmp(out, text) == 0);

    /* id_to_piece: the BPE model's id 3 is "<pad>" (5 bytes). */
    memset(out, '#', sizeof out);
    ZT_CHECK_INT(plugin.ops->id_to_piece(m, 3, out, 2, &len), ZT_ERR_BUFFER_TOO_SMALL);
    ZT_CHECK_INT(len, 5);
    ZT_CHECK(memcmp(out, "<p#", 3) == 0);
    ZT_CHECK_CONTAINS(tk_take_error(&plugin, NULL),
                      "id_to_piece needs 5 bytes plus a terminating NUL but the buffer holds 2");
    free(all);
}

static void check_bad_ids(zt_tokenizer_model *m)
{
    char out[64];
    uint64_t len = 0;
    const int32_t too_big[] = {5, 1000, 7};
    ZT_CHECK_INT(plugin.ops->decode(m, too_big, 3, out, sizeof out, &len), ZT_ERR_INVALID_ARG);
    const char *msg = tk_take_error(&plugin, NULL);
    ZT_CHECK_CONTAINS(msg, "cannot decode: id 1000 at position 1 is outside the vocabulary");
    ZT_CHECK_CONTAINS(msg, "bpe.model' (ids 0..999)");

    const int32_t negative[] = {-1};
    ZT_CHECK_INT(plugin.ops->decode(m, negative, 1, out, sizeof out, &len), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(tk_take_error(&plugin, NULL), "id -1 at position 0 is outside the vocabulary");

    ZT_CHECK_INT(plugin.ops->id_to_piece(m, 1000, out, sizeof out, &len), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(tk_take_error(&plugin, NULL),
                      "cannot look up the piece of id 1000: it is outside the vocabulary");

    zt_tokenizer_info info = {.struct_size = 8};
    ZT_CHECK_INT(plugin.ops->info(m, &info), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(tk_take_error(&plugin, NULL), "struct_size >= 48, got struct_size 8");
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLUGINS_D WORK_DIR\n", argv[0]);
        return 2;
    }
    work = argv[2];
    tk_plugin_load(&plugin, argv[1]);

    size_t model_size;
    char *model_bytes = tk_read_file(tk_path(work, "bpe.model"), &model_size);
    check_bad_model_files(model_bytes, model_size);
    free(model_bytes);

    zt_tokenizer_model *m = tk_open(&plugin, tk_path(work, "bpe.model"));
    check_invalid_utf8(m);
    check_small_buffers(m);
    check_bad_ids(m);
    plugin.ops->close(m);
    tk_plugin_unload(&plugin);
    return zt_test_result();
}
