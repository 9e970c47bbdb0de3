/* Writes the batch of a torch model fixture (tests/reference/fixtures/<model>/expected.safetensors:
 * input_ids, labels, and doc_ids when packed) as a zt data set, with the independent shard writer of
 * the loader tests, so zt-run trains on exactly the batch transformers computed its loss on.
 *
 * HF's labels[t] is the token predicted at position t - 1, or -100; a shard's loss-mask byte of
 * token t says the same (the loader's target of token t - 1 is token t when mask[t] is 1). Without
 * doc_ids every row is one sample (layout "padded", rows of exactly seq_len tokens); with doc_ids
 * each run of equal ids is a sample (layout "packed": the loader refills the rows in order).
 * usage: make_fixture_data FIXTURE_MODEL_DIR OUT_DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state/safetensors.h"
#include "shard_writer.h"

static int64_t *read_i64(const zt_st_file *f, const char *name, int64_t *rows, int64_t *cols)
{
    const zt_st_tensor *t = zt_st_find(f, name);
    if (!t) return NULL;
    if (t->dtype != ZT_ST_I64 || t->ndim != 2) {
        fprintf(stderr, "make_fixture_data: %s must be a 2-D int64 tensor\n", name);
        exit(1);
    }
    *rows = t->shape[0];
    *cols = t->shape[1];
    int64_t *out = malloc(t->numel * sizeof *out);
    memcpy(out, zt_st_data(f, t), t->numel * sizeof *out); /* little-endian, as this machine */
    return out;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s FIXTURE_MODEL_DIR OUT_DIR\n", argv[0]);
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/expected.safetensors", argv[1]);
    zt_st_file *f;
    zt_error err;
    if (zt_st_open(path, &f, &err) != ZT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int64_t rows, cols, r2, c2, r3 = 0, c3 = 0;
    int64_t *ids = read_i64(f, "input_ids", &rows, &cols), *labels = read_i64(f, "labels", &r2, &c2);
    int64_t *docs = read_i64(f, "doc_ids", &r3, &c3);
    if (!ids || !labels || r2 != rows || c2 != cols || (docs && (r3 != rows || c3 != cols))) {
        fprintf(stderr, "make_fixture_data: %s lacks input_ids/labels of one shape\n", path);
        return 1;
    }
    tw_samples s;
    tw_samples_init(&s);
    uint32_t *tokens = malloc((size_t)cols * sizeof *tokens);
    uint8_t *mask = malloc((size_t)cols);
    for (int64_t b = 0; b < rows; b++) {
        int64_t start = 0;
        for (int64_t t = 0; t <= cols; t++) {
            int boundary = t == cols || (docs && t > start && docs[b * cols + t] != docs[b * cols + t - 1]);
            if (!boundary) continue;
            for (int64_t k = start; k < t; k++) {
                tokens[k - start] = (uint32_t)ids[b * cols + k];
                /* the first token of a sample is never predicted */
                mask[k - start] = k > start && labels[b * cols + k] != -100;
            }
            tw_samples_add(&s, tokens, mask, (size_t)(t - start));
            start = t;
        }
    }
    /* every fixture model has a vocabulary of 128 (make_fixtures.py) */
    tw_shard_params p = {.token_bytes = 2, .vocab_size = 128, .tokenizer_hash = 0x5a54fe7c5a54fe7cull};
    tw_image img;
    tw_build(&s, &p, &img);
    tw_tokenizer tok = {p.tokenizer_hash, 128, -1, -1, -1, docs ? "packed" : "padded"};
    tw_entry entry = {"train-00000.ztshard", "train", &img};
    int rc = tw_write_dataset(argv[2], &tok, &entry, 1);
    if (rc != 0) fprintf(stderr, "make_fixture_data: cannot write %s\n", argv[2]);
    tw_image_free(&img);
    tw_samples_free(&s);
    free(tokens), free(mask), free(ids), free(labels), free(docs);
    zt_st_close(f);
    return rc ? 1 : 0;
}
