/* A learnable zt data set over a vocabulary of any size, for the GPU tests of vocabularies that are
 * not a multiple of 8 (run_gpu_test.sh odd_vocab): every id below VOCAB occurs, the last ones (the
 * LM head's tail rows on the GPU) included, so the loss and the gradients reach every row.
 *
 * Each sample is one row of exactly SEQ tokens ("padded" layout) with a loss on every token but the
 * first. A sample starts at a random id; each next token is, with probability 1/2, the current
 * one's successor in a fixed random permutation of the vocabulary (a bigram the model can learn),
 * with probability 1/4 the last id, VOCAB - 1 (which the GPU's LM head computes in its tail GEMMs
 * when VOCAB is not a multiple of 8: a quarter of all targets depend on them, so a fault there
 * moves the loss far), otherwise a uniformly random id (so the loss stays well above zero, where
 * relative comparisons of two runs stay meaningful). ROWS samples go to the train split and
 * ROWS / 8 (at least one) to the validation split. Written by the independent shard writer of the
 * loader tests.
 * usage: zt-gpu-vocab-data OUT_DIR VOCAB SEQ ROWS [SEED] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_writer.h"

static long parse(const char *text, const char *what, long min, long max)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "zt-gpu-vocab-data: %s '%s' is not a whole number from %ld to %ld\n", what, text, min, max);
        exit(2);
    }
    return v;
}

/* splitmix64: a reproducible stream for a seed. */
static uint64_t next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* `rows` samples of the walk, built into *img (validation flag as given). */
static void build(const uint32_t *successor, long vocab, long seq, long rows, int validation,
                  uint64_t *state, tw_image *img)
{
    uint32_t *tokens = malloc((size_t)seq * sizeof *tokens);
    uint8_t *mask = malloc((size_t)seq);
    if (!tokens || !mask) {
        fprintf(stderr, "zt-gpu-vocab-data: out of memory\n");
        exit(1);
    }
    memset(mask, 1, (size_t)seq);
    mask[0] = 0; /* the first token of a sample is never predicted */
    tw_samples s;
    tw_samples_init(&s);
    for (long r = 0; r < rows; r++) {
        tokens[0] = (uint32_t)(next(state) % (uint64_t)vocab);
        for (long t = 1; t < seq; t++) {
            uint64_t x = next(state);
            tokens[t] = x & 1   ? successor[tokens[t - 1]]
                        : x & 2 ? (uint32_t)(vocab - 1)
                                : (uint32_t)((x >> 2) % (uint64_t)vocab);
        }
        tw_samples_add(&s, tokens, mask, (size_t)seq);
    }
    tw_shard_params p = {.token_bytes = vocab <= 65536 ? 2 : 4, .vocab_size = (uint32_t)vocab,
                         .tokenizer_hash = 0x7a74766f63616221ull /* "ztvocab!" */, .validation = (uint32_t)validation};
    tw_build(&s, &p, img);
    tw_samples_free(&s);
    free(tokens);
    free(mask);
}

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: %s OUT_DIR VOCAB SEQ ROWS [SEED]\n", argv[0]);
        return 2;
    }
    long vocab = parse(argv[2], "VOCAB", 2, 1L << 24), seq = parse(argv[3], "SEQ", 2, 1L << 20);
    long rows = parse(argv[4], "ROWS", 1, 1L << 24), seed = argc == 6 ? parse(argv[5], "SEED", 0, 1L << 62) : 0;
    uint64_t state = (uint64_t)seed;
    uint32_t *successor = malloc((size_t)vocab * sizeof *successor);
    if (!successor) {
        fprintf(stderr, "zt-gpu-vocab-data: out of memory\n");
        return 1;
    }
    for (long i = 0; i < vocab; i++) successor[i] = (uint32_t)i;
    for (long i = vocab - 1; i > 0; i--) { /* Fisher-Yates */
        long j = (long)(next(&state) % (uint64_t)(i + 1));
        uint32_t tmp = successor[i];
        successor[i] = successor[j];
        successor[j] = tmp;
    }
    tw_image train, val;
    build(successor, vocab, seq, rows, 0, &state, &train);
    build(successor, vocab, seq, rows / 8 > 0 ? rows / 8 : 1, 1, &state, &val);
    tw_tokenizer tok = {0x7a74766f63616221ull, vocab, -1, -1, -1, "padded"};
    tw_entry entries[] = {{"train-00000.ztshard", "train", &train}, {"val-00000.ztshard", "val", &val}};
    int rc = tw_write_dataset(argv[1], &tok, entries, 2);
    if (rc != 0) fprintf(stderr, "zt-gpu-vocab-data: cannot write %s\n", argv[1]);
    tw_image_free(&train);
    tw_image_free(&val);
    free(successor);
    return rc != 0;
}
