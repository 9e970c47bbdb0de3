/* Sample order: the shuffle (against a second implementation of the documented algorithm), the
 * data-parallel split, equal step counts, and exact resumption from a saved position. */
#include <stdlib.h>

#include "data/loader.h"
#include "shard_writer.h"
#include "ztest.h"

#define N_SAMPLES 38
#define ID_BASE 100 /* sample i starts with token ID_BASE + i, so batches tell which samples they hold */

/* N_SAMPLES samples of 1 to 7 tokens over two shards (20 + 18). */
static char *write_numbered(const char *name)
{
    char *dir = tw_make_temp_dir(name);
    tw_samples s[2];
    tw_samples_init(&s[0]);
    tw_samples_init(&s[1]);
    for (uint32_t i = 0; i < N_SAMPLES; i++) {
        uint32_t len = 1 + (i * 5) % 7, tokens[8];
        uint8_t mask[8];
        for (uint32_t j = 0; j < len; j++) {
            tokens[j] = j == 0 ? ID_BASE + i : 3 + j;
            mask[j] = j >= len / 2;
        }
        tw_samples_add(&s[i < 20 ? 0 : 1], tokens, mask, len);
    }
    tw_shard_params p = {.token_bytes = 2, .vocab_size = 1000, .tokenizer_hash = 5};
    tw_image img[2];
    tw_build(&s[0], &p, &img[0]);
    p.shard_index = 1;
    tw_build(&s[1], &p, &img[1]);
    tw_tokenizer tok = {.hash = 5, .vocab_size = 1000, .bos_id = 1, .eos_id = 2, .pad_id = 0};
    tw_entry e[2] = {{"train-00000.ztshard", "train", &img[0]},
                     {"train-00001.ztshard", "train", &img[1]}};
    ZT_CHECK_INT(tw_write_dataset(dir, &tok, e, 2), 0);
    for (int i = 0; i < 2; i++) {
        tw_image_free(&img[i]);
        tw_samples_free(&s[i]);
    }
    return dir;
}

static zt_loader *open_or_fail(const zt_loader_options *o)
{
    zt_loader *l = NULL;
    zt_error err = {0};
    if (zt_loader_open(o, &l, &err)) {
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

/* Append the samples of batch b, in order, to seq. */
static int collect_samples(const zt_loader_batch *b, int *seq, int n)
{
    for (int s = 0; s < b->n_spans; s++) {
        int32_t at = b->cu_seqlens[s];
        if (b->doc_ids[at] >= 0) seq[n++] = b->tokens[at] - ID_BASE;
    }
    return n;
}

/* The documented shuffle, written again from loader.h's description. */
static uint64_t ref_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void ref_order(uint64_t seed, uint64_t epoch, int n, int *order)
{
    uint64_t e = epoch;
    uint64_t state = seed ^ ref_splitmix64(&e);
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        uint64_t bound = (uint64_t)i + 1, r;
        do r = ref_splitmix64(&state);
        while (r < (0 - bound) % bound);
        int j = (int)(r % bound), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

static zt_loader_options base_options(const char *dir)
{
    zt_loader_options o;
    zt_loader_options_default(&o);
    o.dir = dir;
    o.seed = 42;
    return o;
}

static void test_shuffle(const char *dir)
{
    /* One sample per batch: the batches spell out the order. */
    zt_loader_options o = base_options(dir);
    o.packed = 0;
    o.micro_batch = 1;
    o.seq_len = 8;
    zt_loader *l = open_or_fail(&o);
    int got[3][N_SAMPLES], want[N_SAMPLES];
    for (int e = 0; e < 3; e++) {
        int n = 0;
        for (int i = 0; i < N_SAMPLES; i++) n = collect_samples(next_or_fail(l), got[e], n);
        ZT_CHECK_INT(n, N_SAMPLES);
        int seen[N_SAMPLES] = {0};
        for (int i = 0; i < N_SAMPLES; i++) seen[got[e][i]]++;
        for (int i = 0; i < N_SAMPLES; i++) ZT_CHECK_INT(seen[i], 1); /* a permutation */
        ref_order(42, (uint64_t)e, N_SAMPLES, want);
        for (int i = 0; i < N_SAMPLES; i++) ZT_CHECK_INT(got[e][i], want[i]);
    }
    ZT_CHECK(memcmp(got[0], got[1], sizeof got[0]) != 0);
    ZT_CHECK(memcmp(got[1], got[2], sizeof got[0]) != 0);
    int identity = 1;
    for (int i = 0; i < N_SAMPLES; i++) identity &= got[0][i] == i;
    ZT_CHECK(!identity);
    zt_loader_close(l);

    /* Another seed, another order; no shuffle, manifest order every epoch. */
    o.seed = 43;
    l = open_or_fail(&o);
    int other[N_SAMPLES], n = 0;
    for (int i = 0; i < N_SAMPLES; i++) n = collect_samples(next_or_fail(l), other, n);
    ZT_CHECK(memcmp(other, got[0], sizeof other) != 0);
    zt_loader_close(l);
    o.shuffle = 0;
    l = open_or_fail(&o);
    for (int e = 0; e < 2; e++) {
        n = 0;
        for (int i = 0; i < N_SAMPLES; i++) n = collect_samples(next_or_fail(l), other, n);
        for (int i = 0; i < N_SAMPLES; i++) ZT_CHECK_INT(other[i], i);
    }
    zt_loader_close(l);
}

/* world 3: 38 samples give 12 per rank and epoch, 2 dropped. Each rank's stream, epoch by epoch,
 * must be P_e[r], P_e[r + 3], ...: together every kept sample exactly once. */
static void test_ranks(const char *dir, int packed)
{
    enum { WORLD = 3, PER_RANK = N_SAMPLES / WORLD, EPOCHS = 3 };
    int seq[WORLD][EPOCHS * PER_RANK + 64];
    for (int r = 0; r < WORLD; r++) {
        zt_loader_options o = base_options(dir);
        o.world = WORLD;
        o.rank = r;
        o.packed = packed;
        o.micro_batch = 2;
        o.seq_len = 8;
        zt_loader *l = open_or_fail(&o);
        ZT_CHECK_INT(zt_loader_info_get(l)->samples_per_rank, PER_RANK);
        ZT_CHECK_INT(zt_loader_info_get(l)->dropped_per_epoch, N_SAMPLES % WORLD);
        int n = 0;
        while (n < EPOCHS * PER_RANK) n = collect_samples(next_or_fail(l), seq[r], n);
        zt_loader_close(l);
    }
    for (int e = 0; e < EPOCHS; e++) {
        int want[N_SAMPLES], seen[N_SAMPLES] = {0};
        ref_order(42, (uint64_t)e, N_SAMPLES, want);
        for (int r = 0; r < WORLD; r++)
            for (int i = 0; i < PER_RANK; i++) {
                int sample = seq[r][e * PER_RANK + i];
                ZT_CHECK_INT(sample, want[i * WORLD + r]);
                seen[sample]++;
            }
        int kept = 0;
        for (int i = 0; i < N_SAMPLES; i++) {
            ZT_CHECK(seen[i] <= 1);
            kept += seen[i];
        }
        ZT_CHECK_INT(kept, WORLD * PER_RANK);
        /* the dropped ones are the last N mod world of this epoch's order */
        for (int i = WORLD * PER_RANK; i < N_SAMPLES; i++) ZT_CHECK_INT(seen[want[i]], 0);
    }
}

/* Evaluation: a single pass has the same length on every rank even when packing gives the ranks
 * different row counts, and covers each rank's samples exactly once. */
static void test_single_pass_steps(const char *dir)
{
    enum { WORLD = 3 };
    int64_t steps[WORLD];
    int max_needed = 0, seen[N_SAMPLES] = {0};
    for (int r = 0; r < WORLD; r++) {
        zt_loader_options o = base_options(dir);
        o.world = WORLD;
        o.rank = r;
        o.micro_batch = 2;
        o.seq_len = 8;
        o.single_pass = 1;
        zt_loader *l = open_or_fail(&o);
        steps[r] = zt_loader_info_get(l)->batches_per_epoch;
        int seq[N_SAMPLES], n = 0, last_with_data = 0;
        for (int64_t i = 0; i < steps[r]; i++) {
            const zt_loader_batch *b = next_or_fail(l);
            n = collect_samples(b, seq, n);
            if (b->n_samples) last_with_data = (int)i + 1;
        }
        ZT_CHECK_INT(n, N_SAMPLES / WORLD);
        for (int i = 0; i < n; i++) seen[seq[i]]++;
        if (last_with_data > max_needed) max_needed = last_with_data;
        const zt_loader_batch *b;
        zt_error err = {0};
        ZT_CHECK_INT(zt_loader_next(l, &b, &err), ZT_ERR_INVALID_ARG);
        zt_loader_close(l);
    }
    ZT_CHECK_INT(steps[1], steps[0]);
    ZT_CHECK_INT(steps[2], steps[0]);
    ZT_CHECK_INT(max_needed, steps[0]); /* no rank runs batches that nobody needs */
    for (int i = 0; i < N_SAMPLES; i++) ZT_CHECK(seen[i] <= 1);
}

static int batches_equal(const zt_loader_batch *a, const zt_loader_batch *b)
{
    size_t bt = (size_t)a->batch * (size_t)a->seq_len * sizeof(int32_t);
    return a->batch == b->batch && a->seq_len == b->seq_len && a->n_spans == b->n_spans &&
           a->n_samples == b->n_samples && a->max_span_len == b->max_span_len &&
           a->n_tokens == b->n_tokens && a->n_loss_tokens == b->n_loss_tokens &&
           !memcmp(a->tokens, b->tokens, bt) && !memcmp(a->targets, b->targets, bt) &&
           !memcmp(a->positions, b->positions, bt) && !memcmp(a->doc_ids, b->doc_ids, bt) &&
           !memcmp(a->cu_seqlens, b->cu_seqlens, ((size_t)a->n_spans + 1) * sizeof(int32_t));
}

/* Save after k batches, reopen, restore through JSON: the next batches equal the uninterrupted
 * run's, across several epoch boundaries. */
static void test_resume(const char *dir, int packed)
{
    enum { TOTAL = 40, K = 13 };
    zt_loader_options o = base_options(dir);
    o.world = 2;
    o.rank = 1;
    o.packed = packed;
    o.micro_batch = 2;
    o.seq_len = 8;
    zt_loader *whole = open_or_fail(&o);
    zt_loader *first = open_or_fail(&o);
    char saved[512];
    for (int i = 0; i < K; i++) {
        const zt_loader_batch *a = next_or_fail(whole), *b = next_or_fail(first);
        ZT_CHECK(batches_equal(a, b));
    }
    zt_loader_position pos;
    zt_loader_get_position(first, &pos);
    size_t need = zt_loader_position_to_json(&pos, saved, sizeof saved);
    ZT_CHECK(need < sizeof saved);
    zt_loader_close(first);

    zt_loader *resumed = open_or_fail(&o);
    zt_loader_position back;
    zt_error err = {0};
    ZT_CHECK_INT(zt_loader_position_from_json(saved, strlen(saved), "position", &back, &err), ZT_OK);
    ZT_CHECK(memcmp(&back, &pos, sizeof pos) == 0);
    ZT_CHECK_INT(zt_loader_set_position(resumed, &back, &err), ZT_OK);
    int epochs_crossed = 0;
    for (int i = K; i < TOTAL; i++) {
        const zt_loader_batch *a = next_or_fail(whole), *b = next_or_fail(resumed);
        if (!batches_equal(a, b)) {
            fprintf(stderr, "resumed batch %d differs (packed %d)\n", i, packed);
            zt_test_failures++;
            break;
        }
    }
    zt_loader_position end;
    zt_loader_get_position(resumed, &end);
    epochs_crossed = (int)(end.epoch - pos.epoch);
    ZT_CHECK(epochs_crossed >= 2);
    ZT_CHECK_INT(end.batches, TOTAL);
    zt_loader_close(resumed);
    zt_loader_close(whole);
}

static void test_position_mismatch(const char *dir)
{
    zt_loader_options o = base_options(dir);
    o.world = 2;
    zt_loader *l = open_or_fail(&o);
    zt_loader_position pos, bad;
    zt_loader_get_position(l, &pos);
    zt_error err = {0};

    bad = pos;
    bad.seed = 7;
    ZT_CHECK_INT(zt_loader_set_position(l, &bad, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "saved with seed 7 and shuffle on, this run has seed 42");
    bad = pos;
    bad.world = 4;
    bad.rank = 3;
    ZT_CHECK_INT(zt_loader_set_position(l, &bad, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "saved by rank 3 of 4 data-parallel ranks, this is rank 0 of 2");
    bad = pos;
    bad.dataset_hash ^= 1;
    ZT_CHECK_INT(zt_loader_set_position(l, &bad, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "its shards changed");
    bad = pos;
    bad.cursor = N_SAMPLES;
    ZT_CHECK_INT(zt_loader_set_position(l, &bad, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "cursor 38 is outside the stream (19 samples per rank");
    zt_loader_close(l);

    /* Malformed saved positions name the problem and its place. */
    static const struct { const char *text, *message; } cases[] = {
        {"{\"format\":\"zt-loader-position\"", "pos:1:"},
        {"[1]", "pos:1:1: a loader position must be an object"},
        {"{\"format\":\"x\",\"version\":1,\"dataset\":\"0000000000000001\",\"seed\":\"000000000000002a\","
         "\"shuffle\":true,\"world\":2,\"rank\":0,\"epoch\":0,\"cursor\":0,\"batches\":0}",
         "pos:1:12: \"format\" must be \"zt-loader-position\""},
        {"{\"format\":\"zt-loader-position\",\"version\":1,\"dataset\":\"01\",\"seed\":\"000000000000002a\","
         "\"shuffle\":true,\"world\":2,\"rank\":0,\"epoch\":0,\"cursor\":0,\"batches\":0}",
         "\"dataset\" must be a string of 16 hex digits, found 01"},
        {"{\"format\":\"zt-loader-position\",\"version\":1,\"dataset\":\"0000000000000001\","
         "\"seed\":\"000000000000002a\",\"shuffle\":true,\"world\":2,\"rank\":2,\"epoch\":0,"
         "\"cursor\":0,\"batches\":0}",
         "\"rank\" must be an integer in [0, 1], found 2"},
        {"{\"format\":\"zt-loader-position\",\"version\":1,\"dataset\":\"0000000000000001\","
         "\"seed\":\"000000000000002a\",\"shuffle\":true,\"world\":2,\"rank\":0,\"epoch\":0,"
         "\"cursor\":-5,\"batches\":0}",
         "\"cursor\" must be an integer in [0, 9223372036854775807], found -5"},
        {"{\"format\":\"zt-loader-position\",\"version\":1,\"dataset\":\"0000000000000001\","
         "\"seed\":\"000000000000002a\",\"shuffle\":true,\"world\":2,\"rank\":0,\"epoch\":0,"
         "\"cursor\":0}",
         "pos:1:1: the loader position has no \"batches\""},
        {"{\"format\":\"zt-loader-position\",\"version\":1,\"dataset\":\"0000000000000001\","
         "\"seed\":\"000000000000002a\",\"shuffle\":1,\"world\":2,\"rank\":0,\"epoch\":0,"
         "\"cursor\":0,\"batches\":0}",
         "\"shuffle\" must be true or false"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zt_loader_position p;
        zt_error e = {0};
        ZT_CHECK(zt_loader_position_from_json(cases[i].text, strlen(cases[i].text), "pos", &p, &e) != ZT_OK);
        ZT_CHECK_CONTAINS(e.msg, cases[i].message);
    }
}

int main(void)
{
    char *dir = write_numbered("order");
    test_shuffle(dir);
    test_ranks(dir, 1);
    test_ranks(dir, 0);
    test_single_pass_steps(dir);
    test_resume(dir, 1);
    test_resume(dir, 0);
    test_position_mismatch(dir);
    tw_remove_tree(dir);
    free(dir);
    return zt_test_result();
}
