/* libFuzzer target: the shard reader on hostile bytes.
 *
 * Each input is a whole shard file. It is validated in memory as it is (checksums included). Then its
 * header checksum is recomputed and the checksum pass skipped, so that mutated offsets, counts and
 * contents reach the structural and content checks and the batch builder: validated again, and
 * written into a data set with a manifest that agrees with its header, opened by the loader and read
 * to the end of a single pass in packed and padded mode. Besides the sanitizers, the oracle is a set
 * of invariants every accepted shard and every batch must satisfy.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/loader.h"
#include "base/log.h"
#include "shard_writer.h"

static char *g_dir; /* one data set directory, rewritten for every input */

static void remove_dir(void) { tw_remove_tree(g_dir); }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static char dir[] = "/tmp/zt-fuzz-shard-XXXXXX";
    g_dir = mkdtemp(dir);
    if (!g_dir) {
        perror("mkdtemp");
        abort();
    }
    atexit(remove_dir);
    zt_log_set_level(ZT_LOG_ERROR); /* the truncation warning would flood the output */
    return 0;
}

#define REQUIRE(cond)                                                                          \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "invariant violated: %s (%s:%d)\n", #cond, __FILE__, __LINE__);   \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

/* What zt_shard_validate promises about a shard it accepts. */
static void check_view(const zt_shard_view *v)
{
    REQUIRE(v->index[0] == 0 && v->index[v->n_samples] == v->n_tokens);
    for (uint64_t i = 0; i < v->n_samples; i++) REQUIRE(v->index[i] < v->index[i + 1]);
    uint64_t ones = 0;
    for (uint64_t i = 0; i < v->n_tokens; i++) {
        uint32_t id = v->token_bytes == 2 ? ((const uint16_t *)v->tokens)[i]
                                          : ((const uint32_t *)v->tokens)[i];
        REQUIRE(id < v->vocab_size);
        REQUIRE(v->mask[i] <= 1);
        ones += v->mask[i];
    }
    REQUIRE(ones == v->n_loss_tokens);
}

/* What zt_loader_next promises about every batch. */
static void check_batch(const zt_loader_batch *b, int64_t vocab)
{
    const int32_t T = b->seq_len, n = b->batch * T;
    REQUIRE(b->n_spans >= b->batch && b->n_spans <= n);
    REQUIRE(b->cu_seqlens[0] == 0 && b->cu_seqlens[b->n_spans] == n);
    int64_t loss = 0, tokens = 0;
    for (int32_t s = 0; s < b->n_spans; s++) {
        int32_t start = b->cu_seqlens[s], end = b->cu_seqlens[s + 1];
        REQUIRE(start < end && end - start <= b->max_span_len);
        REQUIRE(start / T == (end - 1) / T); /* a span never crosses rows */
        for (int32_t i = start; i < end; i++) {
            REQUIRE(b->positions[i] == i - start);
            REQUIRE(b->doc_ids[i] == b->doc_ids[start]);
            REQUIRE(b->tokens[i] >= 0 && b->tokens[i] < vocab);
            REQUIRE(b->targets[i] == ZT_LOADER_IGNORE_INDEX ||
                    (b->targets[i] >= 0 && b->targets[i] < vocab));
            loss += b->targets[i] != ZT_LOADER_IGNORE_INDEX;
        }
        REQUIRE(b->doc_ids[start] == -1 || b->doc_ids[start] == s);
        REQUIRE(b->targets[end - 1] == ZT_LOADER_IGNORE_INDEX);
        if (b->doc_ids[start] >= 0) tokens += end - start;
    }
    REQUIRE(loss == b->n_loss_tokens && tokens == b->n_tokens);
}

static void read_pass(const char *split, int packed, int32_t micro_batch, int32_t seq_len)
{
    zt_loader_options o;
    zt_loader_options_default(&o);
    o.dir = g_dir;
    o.split = split;
    o.micro_batch = micro_batch;
    o.seq_len = seq_len;
    o.packed = packed;
    o.single_pass = 1;
    o.verify_checksums = 0;
    zt_loader *l = NULL;
    zt_error err = {0};
    if (zt_loader_open(&o, &l, &err) != ZT_OK) {
        REQUIRE(l == NULL && err.msg[0] != '\0');
        return;
    }
    const zt_loader_info *in = zt_loader_info_get(l);
    for (int64_t i = 0; i < in->batches_per_epoch; i++) {
        const zt_loader_batch *b = NULL;
        REQUIRE(zt_loader_next(l, &b, &err) == ZT_OK);
        check_batch(b, in->vocab_size);
    }
    const zt_loader_batch *b = NULL;
    REQUIRE(zt_loader_next(l, &b, &err) != ZT_OK && b == NULL);
    zt_loader_close(l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A shard is read in place and must be 8-byte aligned, as a mapping is. */
    tw_image img = {aligned_alloc(64, (size + 64) / 64 * 64), size};
    if (!img.data) return 0;
    memcpy(img.data, data, size);

    zt_shard_view view;
    zt_error err = {0};
    if (zt_shard_validate(img.data, size, "fuzz.ztshard", NULL, &view, &err) == ZT_OK) {
        check_view(&view);
    } else {
        REQUIRE(strncmp(err.msg, "fuzz.ztshard: ", 14) == 0);
    }

    /* Past the checksums: a valid header checksum, and no section checksum pass. */
    if (size >= TW_OFF_HEADER_SUM + 8) tw_reseal_header(&img);
    zt_shard_expect unchecked = {.verify_checksums = 0};
    if (zt_shard_validate(img.data, size, "fuzz.ztshard", &unchecked, &view, &err) == ZT_OK)
        check_view(&view);
    else
        REQUIRE(strncmp(err.msg, "fuzz.ztshard: ", 14) == 0);

    /* A manifest that agrees with whatever the header claims, so the loader gets past it. */
    tw_tokenizer tok = {.vocab_size = 1, .bos_id = -1, .eos_id = -1, .pad_id = -1};
    int validation = 0;
    if (size >= 40) {
        uint32_t vocab = tw_get_u32(&img, TW_OFF_VOCAB);
        tok.vocab_size = vocab >= 1 && vocab <= INT32_MAX ? vocab : 1;
        tok.hash = tw_get_u64(&img, TW_OFF_TOKENIZER_HASH);
        validation = tw_get_u32(&img, TW_OFF_FLAGS) & 1;
    }
    const char *split = validation ? "val" : "train";
    tw_entry entry = {validation ? "val-00000.ztshard" : "train-00000.ztshard", split, &img};
    char stale[4096];
    snprintf(stale, sizeof stale, "%s/%s-00000.ztshard", g_dir, validation ? "train" : "val");
    remove(stale);
    REQUIRE(tw_write_dataset(g_dir, &tok, &entry, 1) == 0);
    read_pass(split, 1, 2, 7);
    read_pass(split, 0, 3, 4);
    free(img.data);
    return 0;
}
