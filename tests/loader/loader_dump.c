/* Test tool: opens a data set with the loader and prints what it read as one JSON object, for
 * check_e2e.py to compare with its own reading of the manifest and shards.
 *
 *   loader_dump DIR SPLIT SEQ_LEN
 *
 * One sample per row (padded, batch 1, no shuffle, one rank, a single pass), so with SEQ_LEN at least
 * the longest sample every sample appears whole, in manifest order. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "data/loader.h"

static void print_row(const char *name, const zt_loader_batch *b)
{
    printf(",\"%s\":[", name);
    for (int32_t i = 0; i < b->seq_len && b->doc_ids[i] == 0; i++)
        printf("%s%d", i ? "," : "", b->tokens[i]);
    printf("]");
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: loader_dump DIR SPLIT SEQ_LEN\n");
        return 2;
    }
    zt_loader_options o;
    zt_loader_options_default(&o);
    o.dir = argv[1];
    o.split = argv[2];
    o.seq_len = atoi(argv[3]);
    o.micro_batch = 1;
    o.packed = 0;
    o.shuffle = 0;
    o.single_pass = 1;
    zt_loader *l;
    zt_error err = {0};
    if (zt_loader_open(&o, &l, &err) != ZT_OK) {
        fprintf(stderr, "loader_dump: %s\n", err.msg);
        return 1;
    }
    const zt_loader_info *in = zt_loader_info_get(l);
    printf("{\"n_shards\":%" PRId64 ",\"n_samples\":%" PRId64 ",\"n_tokens\":%" PRId64
           ",\"n_loss_tokens\":%" PRId64 ",\"vocab_size\":%" PRId64 ",\"tokenizer_hash\":\"%016" PRIx64
           "\",\"pad_token\":%" PRId64 ",\"packed_in_manifest\":%d,\"batches\":%" PRId64,
           in->n_shards, in->n_samples, in->n_tokens, in->n_loss_tokens, in->vocab_size,
           in->tokenizer_hash, in->pad_token, in->manifest_layout, in->batches_per_epoch);
    int64_t tokens = 0, loss = 0, truncated = 0;
    for (int64_t i = 0; i < in->batches_per_epoch; i++) {
        const zt_loader_batch *b;
        if (zt_loader_next(l, &b, &err) != ZT_OK) {
            fprintf(stderr, "loader_dump: %s\n", err.msg);
            return 1;
        }
        tokens += b->n_tokens;
        loss += b->n_loss_tokens;
        truncated += b->n_truncated;
        if (i == 0) print_row("first_sample", b);
        if (i == in->batches_per_epoch - 1) print_row("last_sample", b);
    }
    printf(",\"batch_tokens\":%" PRId64 ",\"batch_targets\":%" PRId64 ",\"truncated\":%" PRId64 "}\n",
           tokens, loss, truncated);
    zt_loader_close(l);
    return 0;
}
