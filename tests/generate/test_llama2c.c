/* llama2.c's formats (framework/state/llama2c.c) against independent references:
 *   - the tokenizer: LLaMA's 32000-token vocabulary as a llama2.c tokenizer.bin must encode the 262
 *     texts of tokenizers/llama2_tokenizer_golden.jsonl to the ids the SentencePiece library gives
 *     with the same vocabulary as a .model, and decode them back to the text; hand-made small
 *     tokenizers check the merge order, byte fallback and the rule about the piece after BOS;
 *   - the legacy model: every tensor of weights/stories260K.bin, read as Hugging Face names, must
 *     equal (bit for bit) weights/stories260K_hf/model.safetensors, which was converted from it
 *     independently (numpy, q/k permuted to the rotate_half layout), read with the test suite's own
 *     safetensors reader;
 *   - malformed files: clear errors, never a crash.
 *
 * usage: test_llama2c WORK_DIR SHARED_DATA   (the shared-data parts skip when it is missing)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "state/hf_model.h"
#include "base/json.h"
#include "state/llama2c.h"
#include "safetensors_min.h"
#include "ztest.h"

static const char *g_work;

/* A tokenizer file from (piece, score) pairs; returns its path. */
typedef struct piece_def {
    const char *bytes;
    float score;
} piece_def;

static const char *write_tokenizer(const char *name, const piece_def *pieces, int n, int32_t max_len)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_work, name);
    FILE *f = fopen(path, "wb");
    if (!f) ZT_SKIP("cannot write %s", path);
    fwrite(&max_len, 4, 1, f);
    for (int i = 0; i < n; i++) {
        int32_t len = (int32_t)strlen(pieces[i].bytes);
        fwrite(&pieces[i].score, 4, 1, f);
        fwrite(&len, 4, 1, f);
        fwrite(pieces[i].bytes, 1, (size_t)len, f);
    }
    fclose(f);
    return path;
}

static void check_ids(const zt_l2c_tokenizer *t, const char *text, const int32_t *want, size_t n_want)
{
    int32_t *ids = NULL;
    size_t n = 0;
    zt_error err;
    zt_status st = zt_l2c_encode(t, text, strlen(text), &ids, &n, &err);
    ZT_CHECK_INT(st, ZT_OK);
    if (st != ZT_OK) fprintf(stderr, "%s\n", err.msg);
    ZT_CHECK_INT(n, n_want);
    for (size_t i = 0; i < n && i < n_want; i++) {
        if (ids[i] != want[i]) fprintf(stderr, "encode(\"%s\"): id %zu is %d, expected %d\n", text, i, ids[i], want[i]);
        ZT_CHECK_INT(ids[i], want[i]);
    }
    free(ids);
}

/* Hand-computed encodings with a tiny vocabulary. */
static void check_small_tokenizer(void)
{
    /* ids: 0 <unk>, 1 BOS, 2 EOS, 3..4 byte pieces, then pieces with scores. */
    const piece_def pieces[] = {
        {"<unk>", 0},   {"\n<s>\n", 0}, {"\n</s>\n", 0}, {"<0x0A>", 0}, {"<0xC3>", 0}, /* 0..4 */
        {" ", -1},      {"a", -2},      {"b", -3},       {"ab", -4},    {" a", -0.5f}, /* 5..9 */
        {" ab", -6},    {"ba", -0.1f},  {"<0xA9>", 0},                                 /* 10..12 */
    };
    const char *path = write_tokenizer("small.bin", pieces, 13, 6);
    zt_l2c_tokenizer *t = NULL;
    zt_error err;
    ZT_CHECK_INT(zt_l2c_tokenizer_load(path, 13, &t, &err), ZT_OK);
    if (!t) return;
    /* " ab": " "+"a" (-0.5) beats "a"+"b" (-4); then " a"+"b" = " ab" (-6). */
    check_ids(t, "ab", (const int32_t[]){10}, 1);
    /* " bab": of the pairs " b" (no piece), "ba" (-0.1) and "ab" (-4), "ba" merges first; then neither
     * " ba" nor "bab" is a piece. */
    check_ids(t, "bab", (const int32_t[]){5, 11, 7}, 3);
    /* "\n" has no piece of its own: its byte piece. "é" (C3 A9): both bytes. */
    check_ids(t, "a\n\xC3\xA9", (const int32_t[]){9, 3, 4, 12}, 4);
    check_ids(t, "", NULL, 0); /* no dummy prefix for empty text */

    int32_t *ids = NULL;
    size_t n = 0;
    ZT_CHECK_INT(zt_l2c_encode(t, "x", 1, &ids, &n, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "neither a piece for it nor the byte piece <0x78>");
    ZT_CHECK_INT(zt_l2c_encode(t, "a\xC3", 2, &ids, &n, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "not valid UTF-8 at byte 1");

    /* Decoding: the piece after BOS loses its leading space; byte pieces become bytes. */
    char *text = NULL;
    size_t len = 0;
    ZT_CHECK_INT(zt_l2c_decode(t, 1, (const int32_t[]){10, 3, 4, 12, 9}, 5, &text, &len, &err), ZT_OK);
    ZT_CHECK(text && len == 7 && memcmp(text, "ab\n\xC3\xA9 a", 7) == 0);
    free(text);
    ZT_CHECK_INT(zt_l2c_decode(t, 7, (const int32_t[]){10}, 1, &text, &len, &err), ZT_OK);
    ZT_CHECK(text && strcmp(text, " ab") == 0);
    free(text);
    ZT_CHECK_INT(zt_l2c_decode(t, -1, (const int32_t[]){13}, 1, &text, &len, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "token id 13 is outside the llama2.c vocabulary [0, 13)");
    zt_l2c_tokenizer_free(t);

    /* The file must hold exactly the model's vocabulary. */
    ZT_CHECK_INT(zt_l2c_tokenizer_load(path, 12, &t, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "remain after the model's 12 tokens");
    ZT_CHECK_INT(zt_l2c_tokenizer_load(path, 14, &t, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "the file ends after 13 of the model's 14 tokens");
    const piece_def too_long[] = {{"<unk>", 0}, {"<s>", 0}, {"</s>", 0}, {"abcdefgh", 0}};
    path = write_tokenizer("too_long.bin", too_long, 4, 6);
    ZT_CHECK_INT(zt_l2c_tokenizer_load(path, 4, &t, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "token 3 at byte");
    ZT_CHECK_CONTAINS(err.msg, "has length 8, expected 1 to max_token_length 6");
    char missing[4096];
    snprintf(missing, sizeof missing, "%s/missing.bin", g_work);
    ZT_CHECK_INT(zt_l2c_tokenizer_load(missing, 4, &t, &err), ZT_ERR_NOT_FOUND);
}

/* LLaMA's vocabulary in llama2.c's format against SentencePiece's ids for the same vocabulary. */
static void check_llama_golden(const char *shared)
{
    char tok_path[4096], golden_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizers/llama2c_tokenizer.bin", shared);
    snprintf(golden_path, sizeof golden_path, "%s/tokenizers/llama2_tokenizer_golden.jsonl", shared);
    if (access(tok_path, R_OK) != 0 || access(golden_path, R_OK) != 0) {
        fprintf(stderr, "note: %s or %s missing: golden tokenizer check skipped\n", tok_path, golden_path);
        return;
    }
    zt_l2c_tokenizer *t = NULL;
    zt_error err;
    ZT_CHECK_INT(zt_l2c_tokenizer_load(tok_path, 32000, &t, &err), ZT_OK);
    if (!t) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    char *all = NULL;
    size_t size = 0;
    ZT_CHECK_INT(zt_read_file(golden_path, &all, &size, &err), ZT_OK);
    int lines = 0, encoded_same = 0, decoded_same = 0;
    for (char *line = all, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        zt_json j;
        if (zt_json_parse(line, strlen(line), golden_path, &j, &err) != ZT_OK) {
            ZT_CHECK(0);
            break;
        }
        int text_tok = zt_json_object_get(&j, 0, "text"), ids_tok = zt_json_object_get(&j, 0, "ids");
        char *text = NULL;
        size_t len = 0;
        ZT_CHECK_INT(zt_json_string(&j, text_tok, &text, &len, &err), ZT_OK);
        int32_t n_want = j.tok[ids_tok].size, *want = malloc(((size_t)n_want + 1) * sizeof *want);
        for (int32_t i = 0, k = ids_tok + 1; i < n_want; i++, k = zt_json_skip(&j, k))
            want[i] = (int32_t)zt_json_get_number(&j, k);
        int32_t *ids = NULL;
        size_t n = 0;
        ZT_CHECK_INT(zt_l2c_encode(t, text, len, &ids, &n, &err), ZT_OK);
        int same = n == (size_t)n_want && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
        if (!same)
            fprintf(stderr, "line %d: llama2.c encoding differs from SentencePiece's for: %.60s\n", lines + 1, text);
        encoded_same += same;
        /* SentencePiece drops the dummy-prefix space when decoding; llama2.c keeps it unless the
         * piece follows BOS, so decoding after BOS gives the text back. */
        char *back = NULL;
        size_t back_len = 0;
        ZT_CHECK_INT(zt_l2c_decode(t, ZT_L2C_BOS, want, (size_t)n_want, &back, &back_len, &err), ZT_OK);
        int round_trip = back && back_len == len && memcmp(back, text, len) == 0;
        if (!round_trip) fprintf(stderr, "line %d: decoding does not give the text back: %.60s\n", lines + 1, text);
        decoded_same += round_trip;
        free(back);
        free(ids);
        free(want);
        free(text);
        zt_json_free(&j);
        lines++;
    }
    ZT_CHECK_INT(lines, 262);
    ZT_CHECK_INT(encoded_same, lines);
    ZT_CHECK_INT(decoded_same, lines);
    free(all);
    zt_l2c_tokenizer_free(t);
}

static void check_stories_model(const char *shared)
{
    char bin[4096], st_path[4096];
    snprintf(bin, sizeof bin, "%s/weights/stories260K.bin", shared);
    snprintf(st_path, sizeof st_path, "%s/weights/stories260K_hf/model.safetensors", shared);
    if (access(bin, R_OK) != 0 || access(st_path, R_OK) != 0) {
        fprintf(stderr, "note: %s or %s missing: model check skipped\n", bin, st_path);
        return;
    }
    zt_l2c_model *m = NULL;
    zt_error err;
    ZT_CHECK_INT(zt_l2c_model_open(bin, &m, &err), ZT_OK);
    if (!m) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    const zt_hf_config *c = zt_l2c_model_config(m);
    /* PROVENANCE.md: dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512, seq_len 512, shared. */
    ZT_CHECK_INT(c->hidden_size, 64);
    ZT_CHECK_INT(c->intermediate_size, 172);
    ZT_CHECK_INT(c->num_hidden_layers, 5);
    ZT_CHECK_INT(c->num_attention_heads, 8);
    ZT_CHECK_INT(c->num_key_value_heads, 4);
    ZT_CHECK_INT(c->head_dim, 8);
    ZT_CHECK_INT(c->vocab_size, 512);
    ZT_CHECK_INT(c->max_position_embeddings, 512);
    ZT_CHECK_INT(c->tie_word_embeddings, 1);

    ref_st_file f;
    ZT_CHECK_INT(ref_st_open(st_path, &f, &err), ZT_OK);
    zt_hf_tensor_list list;
    ZT_CHECK_INT(zt_hf_llama_tensors(c, ZT_ST_F32, &list, &err), ZT_OK);
    ZT_CHECK_INT(list.n, 47); /* PROVENANCE.md: 47 tensors, no lm_head.weight (tied) */
    for (size_t i = 0; i < list.n; i++) {
        const zt_st_tensor_spec *s = &list.specs[i];
        float *want = NULL;
        int64_t n = 1;
        for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
        ZT_CHECK_INT(ref_st_read_f32(&f, s->name, s->ndim, s->shape, &want, &err), ZT_OK);
        float *got = malloc((size_t)n * sizeof *got);
        /* In two pieces, so a range that starts inside a row is read too. */
        uint64_t half = (uint64_t)n / 2 + 3;
        ZT_CHECK_INT(zt_l2c_model_read(m, s->name, s->ndim, s->shape, 0, half, got, &err), ZT_OK);
        ZT_CHECK_INT(zt_l2c_model_read(m, s->name, s->ndim, s->shape, half, (uint64_t)n - half, got + half, &err),
                     ZT_OK);
        if (want && memcmp(got, want, (size_t)n * sizeof *got) != 0) {
            fprintf(stderr, "tensor %s differs from the HF conversion\n", s->name);
            ZT_CHECK(0);
        }
        free(got);
        free(want);
    }
    /* The tied head reads the embeddings. */
    int64_t head_shape[2] = {512, 64};
    float row[64], embed_row[64];
    ZT_CHECK_INT(zt_l2c_model_read(m, "lm_head.weight", 2, head_shape, 64 * 7, 64, row, &err), ZT_OK);
    ZT_CHECK_INT(zt_l2c_model_read(m, "model.embed_tokens.weight", 2, head_shape, 64 * 7, 64, embed_row, &err), ZT_OK);
    ZT_CHECK(memcmp(row, embed_row, sizeof row) == 0);
    /* Shape and name errors. */
    int64_t wrong[2] = {64, 65};
    const char *q_proj = "model.layers.0.self_attn.q_proj.weight", *up_proj = "model.layers.5.mlp.up_proj.weight";
    ZT_CHECK_INT(zt_l2c_model_read(m, q_proj, 2, wrong, 0, 1, row, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "tensor 'model.layers.0.self_attn.q_proj.weight' is [64, 64] in the llama2.c model");
    ZT_CHECK_INT(zt_l2c_model_read(m, up_proj, 2, wrong, 0, 1, row, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "a llama2.c model has no tensor 'model.layers.5.mlp.up_proj.weight'");
    zt_hf_tensor_list_free(&list);
    ref_st_close(&f);
    zt_l2c_model_close(m);

    /* A truncated copy and a header that is not a model. */
    char *bytes = NULL;
    size_t size = 0;
    ZT_CHECK_INT(zt_read_file(bin, &bytes, &size, &err), ZT_OK);
    char path[4096];
    snprintf(path, sizeof path, "%s/truncated.bin", g_work);
    FILE *out = fopen(path, "wb");
    fwrite(bytes, 1, size - 4, out);
    fclose(out);
    ZT_CHECK_INT(zt_l2c_model_open(path, &m, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "is 1056536 bytes, but a llama2.c version 0 model with this header");
    ZT_CHECK_CONTAINS(err.msg, "is 1056540 bytes");
    int32_t bad_heads = 7;
    memcpy(bytes + 12, &bad_heads, 4);
    out = fopen(path, "wb");
    fwrite(bytes, 1, size, out);
    fclose(out);
    ZT_CHECK_INT(zt_l2c_model_open(path, &m, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "n_heads 7");
    ZT_CHECK_CONTAINS(err.msg, "is not a llama2.c version 0 model");
    free(bytes);
}

/* stories260K.bin with one weight made NaN: refused where it is read, naming tensor, row, column and
 * the byte of the file. llama2.c's layout: a 7 x int32 header (28 bytes), then the token embedding
 * table [vocab, dim] row by row, so element (0, 5) is at byte 28 + 5 * 4 = 48. */
static void check_stories_nonfinite(const char *shared)
{
    char bin[4096], poisoned[4096];
    snprintf(bin, sizeof bin, "%s/weights/stories260K.bin", shared);
    snprintf(poisoned, sizeof poisoned, "%s/stories260K-nan.bin", g_work);
    FILE *in = fopen(bin, "rb");
    if (!in) {
        fprintf(stderr, "note: %s missing: non-finite check skipped\n", bin);
        return;
    }
    FILE *out = fopen(poisoned, "wb");
    char chunk[65536];
    size_t got;
    while (out && (got = fread(chunk, 1, sizeof chunk, in)) > 0) fwrite(chunk, 1, got, out);
    fclose(in);
    const float nan_value = NAN;
    if (out) {
        fseek(out, 48, SEEK_SET);
        fwrite(&nan_value, sizeof nan_value, 1, out);
        fclose(out);
    }
    zt_l2c_model *m = NULL;
    zt_error err;
    ZT_CHECK_INT(zt_l2c_model_open(poisoned, &m, &err), ZT_OK);
    if (!m) return;
    const int64_t shape[2] = {512, 64};
    float *buf = malloc(512 * 64 * sizeof *buf);
    ZT_CHECK_INT(zt_l2c_model_read(m, "model.embed_tokens.weight", 2, shape, 64, 64, buf, &err), ZT_OK); /* row 1 */
    ZT_CHECK_INT(zt_l2c_model_read(m, "model.embed_tokens.weight", 2, shape, 0, 512 * 64, buf, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "tensor 'model.embed_tokens.weight' holds NaN at row 0, column 5 (byte 48 of the file)");
    free(buf);
    zt_l2c_model_close(m);
    remove(poisoned);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s WORK_DIR SHARED_DATA\n", argv[0]);
        return 2;
    }
    g_work = argv[1];
    check_small_tokenizer();
    check_llama_golden(argv[2]);
    check_stories_model(argv[2]);
    check_stories_nonfinite(argv[2]);
    return zt_test_result();
}
