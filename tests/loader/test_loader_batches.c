/* Loader batches against hand-computed expectations: packing, padding, targets at document
 * boundaries, positions, spans, truncation, single passes, several shards and 4-byte token ids. */
#include <stdlib.h>

#include "data/loader.h"
#include "shard_writer.h"
#include "ztest.h"

#define X ZT_LOADER_IGNORE_INDEX

static void check_array(const char *what, const int32_t *got, const int32_t *want, int n, int line)
{
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            fprintf(stderr, "line %d: %s[%d] = %d, expected %d\n", line, what, i, got[i], want[i]);
            zt_test_failures++;
            return;
        }
    }
}
#define CHECK_ARRAY(what, got, ...)                                                                \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        check_array(what, got, want_, (int)(sizeof want_ / sizeof want_[0]), __LINE__);            \
    } while (0)

/* Six samples: a token 1 (BOS) and ids that say which sample they belong to. Sample 4 has 8
 * tokens, more than the tests' seq_len 6. */
static void six_samples(tw_samples *s)
{
    static const uint32_t t0[] = {1, 10, 11, 12}, t1[] = {1, 20, 21}, t2[] = {1, 30, 31, 32, 33},
                          t3[] = {1, 40}, t4[] = {1, 50, 51, 52, 53, 54, 55, 56}, t5[] = {1, 60};
    static const uint8_t m0[] = {0, 0, 1, 1}, m1[] = {0, 1, 1}, m2[] = {0, 0, 0, 1, 1}, m3[] = {0, 1},
                         m4[] = {0, 0, 0, 0, 1, 1, 1, 1}, m5[] = {0, 1};
    tw_samples_init(s);
    tw_samples_add(s, t0, m0, 4);
    tw_samples_add(s, t1, m1, 3);
    tw_samples_add(s, t2, m2, 5);
    tw_samples_add(s, t3, m3, 2);
    tw_samples_add(s, t4, m4, 8);
    tw_samples_add(s, t5, m5, 2);
}

static char *write_six(const char *name, int64_t pad_id, const char *layout)
{
    char *dir = tw_make_temp_dir(name);
    tw_samples s;
    six_samples(&s);
    tw_shard_params p = {.token_bytes = 2, .vocab_size = 100, .tokenizer_hash = 0x1234abcd5678ef00ull};
    tw_image img;
    tw_build(&s, &p, &img);
    tw_tokenizer tok = {.hash = p.tokenizer_hash, .vocab_size = 100, .bos_id = 1, .eos_id = 2,
                        .pad_id = pad_id, .layout = layout};
    tw_entry e = {"train-00000.ztshard", "train", &img};
    ZT_CHECK_INT(tw_write_dataset(dir, &tok, &e, 1), 0);
    tw_image_free(&img);
    tw_samples_free(&s);
    return dir;
}

static zt_loader *open_or_fail(const zt_loader_options *o)
{
    zt_loader *l = NULL;
    zt_error err = {0};
    zt_status st = zt_loader_open(o, &l, &err);
    if (st) {
        fprintf(stderr, "zt_loader_open failed: %s\n", err.msg);
        exit(1);
    }
    return l;
}

static const zt_loader_batch *next_or_fail(zt_loader *l)
{
    const zt_loader_batch *b = NULL;
    zt_error err = {0};
    if (zt_loader_next(l, &b, &err)) {
        fprintf(stderr, "zt_loader_next failed: %s\n", err.msg);
        exit(1);
    }
    return b;
}

static void test_packed(void)
{
    char *dir = write_six("packed", 0, NULL);
    zt_loader_options o;
    zt_loader_options_default(&o);
    o.dir = dir;
    o.micro_batch = 2;
    o.seq_len = 6;
    o.shuffle = 0;
    zt_loader *l = open_or_fail(&o);
    const zt_loader_info *in = zt_loader_info_get(l);
    ZT_CHECK_INT(in->n_samples, 6);
    ZT_CHECK_INT(in->n_tokens, 24);
    ZT_CHECK_INT(in->n_loss_tokens, 12);
    ZT_CHECK_INT(in->n_long_samples, 1);
    ZT_CHECK_INT(in->pad_token, 0);
    ZT_CHECK_INT(in->manifest_layout, -1);
    ZT_CHECK_INT(in->packed, 1); /* packed when zt-prep recorded no layout */
    /* rows of epoch 0: S0 | S1 | S2 | S3 | S4 (cut to 6) | S5, i.e. 6 rows, 3 batches */
    ZT_CHECK_INT(in->batches_per_epoch, 3);

    /* Batch 0: S0 leaves 2 slots, too few for S1 (3 tokens), so S1 starts row 1; S2 (5) does
     * not fit after it either. */
    const zt_loader_batch *b = next_or_fail(l);
    ZT_CHECK_INT(b->batch, 2);
    ZT_CHECK_INT(b->seq_len, 6);
    CHECK_ARRAY("tokens", b->tokens, 1, 10, 11, 12, 0, 0, /**/ 1, 20, 21, 0, 0, 0);
    CHECK_ARRAY("targets", b->targets, X, 11, 12, X, X, X, /**/ 20, 21, X, X, X, X);
    CHECK_ARRAY("positions", b->positions, 0, 1, 2, 3, 0, 1, /**/ 0, 1, 2, 0, 1, 2);
    CHECK_ARRAY("doc_ids", b->doc_ids, 0, 0, 0, 0, -1, -1, /**/ 2, 2, 2, -1, -1, -1);
    ZT_CHECK_INT(b->n_spans, 4);
    CHECK_ARRAY("cu_seqlens", b->cu_seqlens, 0, 4, 6, 9, 12);
    ZT_CHECK_INT(b->n_samples, 2);
    ZT_CHECK_INT(b->max_span_len, 4);
    ZT_CHECK_INT(b->n_tokens, 7);
    ZT_CHECK_INT(b->n_loss_tokens, 4);
    ZT_CHECK_INT(b->n_truncated, 0);

    /* Batch 1: S2 then S3; S4 (cut to 6) does not fit after S3. */
    b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 30, 31, 32, 33, 0, /**/ 1, 40, 0, 0, 0, 0);
    CHECK_ARRAY("targets", b->targets, X, X, 32, 33, X, X, /**/ 40, X, X, X, X, X);
    CHECK_ARRAY("positions", b->positions, 0, 1, 2, 3, 4, 0, /**/ 0, 1, 0, 1, 2, 3);
    CHECK_ARRAY("doc_ids", b->doc_ids, 0, 0, 0, 0, 0, -1, /**/ 2, 2, -1, -1, -1, -1);
    CHECK_ARRAY("cu_seqlens", b->cu_seqlens, 0, 5, 6, 8, 12);
    ZT_CHECK_INT(b->n_spans, 4);
    ZT_CHECK_INT(b->max_span_len, 5);
    ZT_CHECK_INT(b->n_loss_tokens, 3);

    /* Batch 2: S4 truncated to its first 6 tokens (its last kept token predicts nothing); row 1
     * packs S5, the end of epoch 0, and S0, the start of epoch 1 (no shuffle: same order). */
    b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 50, 51, 52, 53, 54, /**/ 1, 60, 1, 10, 11, 12);
    CHECK_ARRAY("targets", b->targets, X, X, X, 53, 54, X, /**/ 60, X, X, 11, 12, X);
    CHECK_ARRAY("positions", b->positions, 0, 1, 2, 3, 4, 5, /**/ 0, 1, 0, 1, 2, 3);
    CHECK_ARRAY("doc_ids", b->doc_ids, 0, 0, 0, 0, 0, 0, /**/ 1, 1, 2, 2, 2, 2);
    CHECK_ARRAY("cu_seqlens", b->cu_seqlens, 0, 6, 8, 12);
    ZT_CHECK_INT(b->n_spans, 3);
    ZT_CHECK_INT(b->n_samples, 3);
    ZT_CHECK_INT(b->max_span_len, 6);
    ZT_CHECK_INT(b->n_truncated, 1);
    ZT_CHECK_INT(b->n_tokens, 12);
    ZT_CHECK_INT(b->n_loss_tokens, 5);
    zt_loader_position pos;
    zt_loader_get_position(l, &pos);
    ZT_CHECK_INT(pos.epoch, 1);
    ZT_CHECK_INT(pos.cursor, 1);
    ZT_CHECK_INT(pos.batches, 3);

    /* The zt_batch handed to the model views the same arrays. */
    zt_batch zb;
    zt_loader_batch_view(b, &zb);
    ZT_CHECK_INT(zb.struct_size, sizeof(zt_batch));
    ZT_CHECK_INT(zb.batch, 2);
    ZT_CHECK_INT(zb.seq_len, 6);
    ZT_CHECK_INT(zb.n_docs, 3);
    ZT_CHECK_INT(zb.max_doc_len, 6);
    ZT_CHECK(zb.tokens == b->tokens && zb.targets == b->targets && zb.positions == b->positions &&
             zb.doc_ids == b->doc_ids && zb.cu_seqlens == b->cu_seqlens);
    ZT_CHECK_INT(zb.n_loss_tokens_global, 0);

    /* Batch 3 continues epoch 1: S1, then S2 does not fit; S2 alone. */
    b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 20, 21, 0, 0, 0, /**/ 1, 30, 31, 32, 33, 0);
    zt_loader_close(l);
    tw_remove_tree(dir);
    free(dir);
}

static void test_padded(void)
{
    /* No pad id in the tokenizer: padding uses EOS (2). zt-prep --pad recorded the padded layout,
     * which the loader follows unless told otherwise. */
    char *dir = write_six("padded", -1, "padded");
    zt_loader_options o;
    zt_loader_options_default(&o);
    o.dir = dir;
    o.micro_batch = 3;
    o.seq_len = 6;
    o.shuffle = 0;
    zt_loader *l = open_or_fail(&o);
    ZT_CHECK_INT(zt_loader_info_get(l)->pad_token, 2);
    ZT_CHECK_INT(zt_loader_info_get(l)->manifest_layout, 0);
    ZT_CHECK_INT(zt_loader_info_get(l)->packed, 0);
    ZT_CHECK_INT(zt_loader_info_get(l)->batches_per_epoch, 2);
    const zt_loader_batch *b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 10, 11, 12, 2, 2, /**/ 1, 20, 21, 2, 2, 2,
                /**/ 1, 30, 31, 32, 33, 2);
    CHECK_ARRAY("targets", b->targets, X, 11, 12, X, X, X, /**/ 20, 21, X, X, X, X,
                /**/ X, X, 32, 33, X, X);
    CHECK_ARRAY("positions", b->positions, 0, 1, 2, 3, 0, 1, /**/ 0, 1, 2, 0, 1, 2,
                /**/ 0, 1, 2, 3, 4, 0);
    CHECK_ARRAY("doc_ids", b->doc_ids, 0, 0, 0, 0, -1, -1, /**/ 2, 2, 2, -1, -1, -1,
                /**/ 4, 4, 4, 4, 4, -1);
    CHECK_ARRAY("cu_seqlens", b->cu_seqlens, 0, 4, 6, 9, 12, 17, 18);
    ZT_CHECK_INT(b->n_spans, 6);
    ZT_CHECK_INT(b->n_samples, 3);
    ZT_CHECK_INT(b->n_tokens, 12);
    ZT_CHECK_INT(b->n_loss_tokens, 6);

    b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 40, 2, 2, 2, 2, /**/ 1, 50, 51, 52, 53, 54,
                /**/ 1, 60, 2, 2, 2, 2);
    CHECK_ARRAY("targets", b->targets, 40, X, X, X, X, X, /**/ X, X, X, 53, 54, X,
                /**/ 60, X, X, X, X, X);
    CHECK_ARRAY("cu_seqlens", b->cu_seqlens, 0, 2, 6, 12, 14, 18);
    ZT_CHECK_INT(b->n_spans, 5);
    ZT_CHECK_INT(b->n_truncated, 1);
    ZT_CHECK_INT(b->max_span_len, 6);
    /* Epoch 1 starts a new batch here: S0 again. */
    b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 10, 11, 12, 2, 2);
    zt_loader_close(l);

    /* An explicit choice wins over the manifest. */
    o.packed = 1;
    l = open_or_fail(&o);
    ZT_CHECK_INT(zt_loader_info_get(l)->packed, 1);
    next_or_fail(l);
    b = next_or_fail(l);
    /* rows S3 | S4 | S5 + S0 of epoch 1, where padded mode had S5 alone */
    CHECK_ARRAY("tokens", b->tokens, 1, 40, 2, 2, 2, 2, /**/ 1, 50, 51, 52, 53, 54,
                /**/ 1, 60, 1, 10, 11, 12);
    zt_loader_close(l);
    tw_remove_tree(dir);
    free(dir);
}

static void test_single_pass(void)
{
    char *dir = write_six("pass", 0, "packed");
    zt_loader_options o;
    zt_loader_options_default(&o);
    o.dir = dir;
    o.micro_batch = 4;
    o.seq_len = 6;
    o.shuffle = 0;
    o.single_pass = 1;
    zt_loader *l = open_or_fail(&o);
    ZT_CHECK_INT(zt_loader_info_get(l)->batches_per_epoch, 2); /* 6 rows in batches of 4 */
    const zt_loader_batch *b = next_or_fail(l);
    ZT_CHECK_INT(b->n_samples, 4);
    /* The second batch: S4 and S5, then two rows of padding only (the pass has no more samples). */
    b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 50, 51, 52, 53, 54, /**/ 1, 60, 0, 0, 0, 0,
                /**/ 0, 0, 0, 0, 0, 0, /**/ 0, 0, 0, 0, 0, 0);
    CHECK_ARRAY("doc_ids", b->doc_ids + 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    CHECK_ARRAY("positions", b->positions + 12, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5);
    CHECK_ARRAY("cu_seqlens", b->cu_seqlens, 0, 6, 8, 12, 18, 24);
    ZT_CHECK_INT(b->n_samples, 2);
    ZT_CHECK_INT(b->n_loss_tokens, 3);
    ZT_CHECK_INT(b->n_tokens, 8);

    zt_error err = {0};
    ZT_CHECK_INT(zt_loader_next(l, &b, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK(b == NULL);
    ZT_CHECK_CONTAINS(err.msg, "the single pass over split \"train\"");
    ZT_CHECK_CONTAINS(err.msg, "is complete (2 batches); call zt_loader_rewind");

    zt_loader_rewind(l);
    b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 10, 11, 12, 0, 0);
    zt_loader_close(l);
    tw_remove_tree(dir);
    free(dir);
}

/* 4-byte ids above 65535, and a split over three shards of which the middle one is empty: sample
 * numbers run across shard boundaries in manifest order. */
static void test_shards_and_wide_ids(void)
{
    char *dir = tw_make_temp_dir("wide");
    const uint32_t vocab = 70001;
    static const uint32_t a0[] = {1, 70000, 65536}, a1[] = {1, 65535}, c0[] = {1, 69999, 3, 70000};
    static const uint8_t ma0[] = {0, 1, 1}, ma1[] = {0, 1}, mc0[] = {0, 0, 1, 1};
    tw_samples a, empty, c;
    tw_samples_init(&a);
    tw_samples_add(&a, a0, ma0, 3);
    tw_samples_add(&a, a1, ma1, 2);
    tw_samples_init(&empty);
    tw_samples_init(&c);
    tw_samples_add(&c, c0, mc0, 4);
    tw_shard_params p = {.token_bytes = 4, .vocab_size = vocab, .tokenizer_hash = 77};
    tw_image img[3];
    tw_build(&a, &p, &img[0]);
    p.shard_index = 1;
    tw_build(&empty, &p, &img[1]);
    p.shard_index = 2;
    tw_build(&c, &p, &img[2]);
    tw_tokenizer tok = {.hash = 77, .vocab_size = vocab, .bos_id = 1, .eos_id = 2, .pad_id = 0};
    tw_entry e[3] = {{"train-00000.ztshard", "train", &img[0]},
                     {"train-00001.ztshard", "train", &img[1]},
                     {"train-00002.ztshard", "train", &img[2]}};
    ZT_CHECK_INT(tw_write_dataset(dir, &tok, e, 3), 0);

    zt_loader_options o;
    zt_loader_options_default(&o);
    o.dir = dir;
    o.micro_batch = 1;
    o.seq_len = 4;
    o.packed = 0;
    o.shuffle = 0;
    zt_loader *l = open_or_fail(&o);
    ZT_CHECK_INT(zt_loader_info_get(l)->n_shards, 3);
    ZT_CHECK_INT(zt_loader_info_get(l)->n_samples, 3);
    ZT_CHECK_INT(zt_loader_info_get(l)->n_tokens, 9);
    const zt_loader_batch *b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 70000, 65536, 0);
    CHECK_ARRAY("targets", b->targets, 70000, 65536, X, X);
    b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 65535, 0, 0);
    CHECK_ARRAY("targets", b->targets, 65535, X, X, X);
    b = next_or_fail(l);
    CHECK_ARRAY("tokens", b->tokens, 1, 69999, 3, 70000);
    CHECK_ARRAY("targets", b->targets, X, 3, 70000, X);
    ZT_CHECK_INT(b->n_spans, 1);
    CHECK_ARRAY("cu_seqlens", b->cu_seqlens, 0, 4);
    zt_loader_close(l);

    for (int i = 0; i < 3; i++) tw_image_free(&img[i]);
    tw_samples_free(&a);
    tw_samples_free(&empty);
    tw_samples_free(&c);
    tw_remove_tree(dir);
    free(dir);
}

/* The test writer's checksum is FNV-1a 64 as published (reference vectors), so a shard the loader
 * accepts carries checksums of the documented algorithm, not just self-consistent ones. */
static void test_writer_checksum(void)
{
    ZT_CHECK_INT(tw_fnv1a64("", 0), 0xcbf29ce484222325ull);
    ZT_CHECK_INT(tw_fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
    ZT_CHECK_INT(tw_fnv1a64("foobar", 6), 0x85944171f73967e8ull);
}

int main(void)
{
    test_writer_checksum();
    test_packed();
    test_padded();
    test_single_pass();
    test_shards_and_wide_ids();
    return zt_test_result();
}
