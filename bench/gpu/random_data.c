/* A zt data set of uniformly random tokens, for benchmarks: the same input the PyTorch peer
 * (../shared/peers/torch_llama.py) trains on, so both measure the same work. Each sample is one row
 * of exactly SEQ tokens ("padded" layout), with a loss on every token but the first, as HF's
 * labels = input_ids gives. Written by the independent shard writer of the loader tests.
 * usage: zt-bench-random-data OUT_DIR VOCAB SEQ ROWS [SEED] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_writer.h"

static long parse(const char *text, const char *what, long min, long max)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "zt-bench-random-data: %s '%s' is not a whole number from %ld to %ld\n", what, text, min, max);
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

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: %s OUT_DIR VOCAB SEQ ROWS [SEED]\n", argv[0]);
        return 2;
    }
    long vocab = parse(argv[2], "VOCAB", 2, 1L << 31), seq = parse(argv[3], "SEQ", 2, 1L << 20);
    long rows = parse(argv[4], "ROWS", 1, 1L << 24), seed = argc == 6 ? parse(argv[5], "SEED", 0, 1L << 62) : 0;
    uint32_t *tokens = malloc((size_t)seq * sizeof *tokens);
    uint8_t *mask = malloc((size_t)seq);
    if (!tokens || !mask) {
        fprintf(stderr, "zt-bench-random-data: out of memory\n");
        return 1;
    }
    memset(mask, 1, (size_t)seq);
    mask[0] = 0; /* the first token of a sample is never predicted */
    tw_samples s;
    tw_samples_init(&s);
    uint64_t state = (uint64_t)seed;
    for (long r = 0; r < rows; r++) {
        for (long t = 0; t < seq; t++) tokens[t] = (uint32_t)(next(&state) % (uint64_t)vocab);
        tw_samples_add(&s, tokens, mask, (size_t)seq);
    }
    tw_shard_params p = {.token_bytes = vocab <= 65536 ? 2 : 4, .vocab_size = (uint32_t)vocab,
                         .tokenizer_hash = 0x7a7472616e646f6dull /* "ztrandom" */};
    tw_image img;
    tw_build(&s, &p, &img);
    tw_tokenizer tok = {p.tokenizer_hash, vocab, -1, -1, -1, "padded"};
    tw_entry entry = {"train-00000.ztshard", "train", &img};
    int rc = tw_write_dataset(argv[1], &tok, &entry, 1);
    if (rc != 0) fprintf(stderr, "zt-bench-random-data: cannot write %s\n", argv[1]);
    tw_image_free(&img);
    tw_samples_free(&s);
    free(tokens);
    free(mask);
    return rc != 0;
}
