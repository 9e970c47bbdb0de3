/* The shard loader: turns a zt-prep data set into training micro-batches (zt_batch).
 *
 * A data set is a directory holding manifest.json (written last by zt-prep) and the shards it lists
 * (framework/data/shard_format.h). Of the manifest the loader reads "format" ("zt-prep-manifest"),
 * "format_version" (1), "tokenizer" {"hash", "vocab_size", "bos_id", "eos_id", "pad_id"},
 * "options" {"layout": "packed" | "padded"} (optional) and "shards" [{"file", "split", "samples",
 * "tokens", "loss_tokens", "bytes", "checksum"}]; a split's shards are used in manifest order.
 * zt_loader_open maps every shard of one split read-only and validates it completely before the
 * first batch:
 *   - header: magic, version, header_size, header checksum, token_bytes 2|4, flags, reserved bytes,
 *     file_size equal to the real size (a truncated file is caught here), sections in order,
 *     64-byte aligned, non-overlapping, inside the file and sized from the counts;
 *   - checksums: each section's FNV-1a 64 and the manifest's whole-file checksum, computed in one
 *     pass over the file at about 0.8 GB/s on one core (measured on a 150 MB shard), so opening a
 *     10 GB split costs about 12 s. verify_checksums = 0 skips only this pass (for huge, already
 *     verified sets); the checks below (about 3 GB/s) always run because they are what makes
 *     reading the data safe;
 *   - contents: index[0] == 0, strictly increasing (no empty sample), index[n_samples] == n_tokens;
 *     every token id < vocab_size; every mask byte 0 or 1 and their sum == n_loss_tokens;
 *   - consistency: the tokenizer hash and vocab_size of every shard equal the manifest's (and the
 *     run's tokenizer and model, when given); the manifest's bytes, samples, tokens and loss_tokens
 *     equal the shard's; the split flag matches; shard_index is the shard's place in its split.
 * Every failure names the file, the field or byte offset, and what to do. Nothing is read before it
 * is proven to be inside the mapping, so a hostile file gives an error, never a crash
 * (tests/fuzz/fuzz_shard.c). Shards must not change while a loader has them open: a file truncated
 * under its mapping makes the next read fault (SIGBUS), as with any mmap reader.
 *
 * The sample stream. The split's samples are numbered 0..N-1 in manifest order. Epoch e visits them
 * in a permutation P_e: the identity without shuffle, else a Fisher-Yates shuffle (i from N-1 down
 * to 1, swap i with an unbiased j in [0, i]) driven by a splitmix64 generator whose state starts at
 * seed ^ (the first splitmix64 output of state e). So every epoch has its own order and the same seed
 * always gives the same orders. Data parallelism: rank r of w takes P_e[r], P_e[r + w], ...
 * i.e. floor(N / w) samples per epoch; the N mod w samples at the end of P_e are dropped for that
 * epoch (different ones each epoch when shuffled), so no sample is seen twice in an epoch and every
 * rank sees the same number of samples. Epochs follow each other seamlessly: the stream never ends
 * and a packed row may hold the last samples of epoch e and the first of e + 1 (as Megatron does).
 * Every rank produces exactly one micro-batch per zt_loader_next call, so ranks always take the same
 * number of steps; the trainer decides how many (zt_loader_info.batches_per_epoch helps).
 *
 * Rows. Packed mode fills each row of T tokens with whole samples in stream order; a sample that
 * does not fit in what is left of the row starts the next row and the rest of the row is padding
 * (samples are never split across rows, so no document loses its beginning). Padded mode puts one
 * sample per row. In both modes a sample longer than T is truncated to its first T tokens (the
 * prompt and the start of the response); zt_loader_open counts these samples and logs one warning
 * with the count, and each batch reports how many it holds. Padding uses the manifest's pad_id, else
 * eos_id, else 0.
 *
 * Per token of a row:
 *   tokens     the sample's token ids, pad id on padding;
 *   targets    for token j of a sample: token j + 1 of the same sample when its mask byte is 1, else
 *              -100; the last (kept) token of a sample is always -100, so no loss crosses documents;
 *              -100 on padding;
 *   positions  0, 1, 2, ... restarting at every span (see below);
 *   doc_ids    the span index (below) for sample tokens, -1 on padding.
 * Spans: the flat B*T stream is cut into contiguous spans, one per sample and one per run of padding
 * at the end of a row; cu_seqlens[0..n_spans] are their start offsets (cu_seqlens[n_spans] == B*T)
 * and max_span_len the longest. So every token belongs to exactly one span and a varlen attention
 * kernel can use cu_seqlens directly; padding attends only to padding. zt_batch.n_docs and
 * max_doc_len carry n_spans and max_span_len.
 *
 * Resuming. zt_loader_position is the whole state of the stream (epoch and how many of this rank's
 * samples of that epoch were consumed). Save it with each checkpoint (zt_loader_position_to_json),
 * restore it into a loader opened with the same data set, seed, shuffle and world/rank, and the run
 * continues with exactly the batches it would have produced. micro_batch, seq_len and the packing
 * mode may change on resume (the sample order continues; the rows differ).
 *
 * Threads: a loader is used by one thread at a time.
 */
#ifndef ZT_FRAMEWORK_LOADER_H
#define ZT_FRAMEWORK_LOADER_H

#include <stddef.h>
#include <stdint.h>
#include "zt/zt_model.h"
#include "base/error.h"

#define ZT_LOADER_IGNORE_INDEX (-100) /* target of a token that takes no loss */
#define ZT_LOADER_MANIFEST "manifest.json"
#define ZT_LOADER_LAYOUT_MANIFEST (-1)

typedef struct zt_loader zt_loader;

typedef struct zt_loader_options {
    const char *dir;           /* data set directory (manifest.json and its shards) */
    const char *split;         /* "train" or "val" */
    int32_t micro_batch;       /* B >= 1 */
    int32_t seq_len;           /* T >= 2 */
    /* 1: several samples per row; 0: one sample per row; ZT_LOADER_LAYOUT_MANIFEST: what zt-prep
     * recorded (--pack / --pad, manifest options.layout), packed when it recorded nothing. */
    int32_t packed;
    int32_t shuffle;           /* 1: a new sample order every epoch; 0: manifest order */
    uint64_t seed;             /* shuffle seed */
    int32_t rank;              /* data-parallel rank, 0 <= rank < world */
    int32_t world;             /* data-parallel size >= 1 */
    /* 1: the stream is one epoch long, for evaluation: zt_loader_info.batches_per_epoch batches,
     * the same count on every rank (ranks that run out of samples get rows of padding), after which
     * zt_loader_next fails until zt_loader_rewind. 0: the endless training stream. */
    int32_t single_pass;
    int32_t verify_checksums;  /* 1 (default): verify every checksum on open; see above */
    /* What the run uses, checked against the data set when non-zero: the tokenizer's model_hash and
     * the model's vocab_size (every token id must be below it). */
    uint64_t tokenizer_hash;
    int64_t model_vocab_size;
} zt_loader_options;

/* Defaults: split "train", micro_batch 1, seq_len 2048, the manifest's layout, shuffle, seed 1234,
 * rank 0 of 1, endless stream, verify_checksums 1, no tokenizer/model checks. Set dir. */
void zt_loader_options_default(zt_loader_options *opt);

/* Open and fully validate the split (see above). On failure *out is NULL and err says what is wrong
 * with which file. */
zt_status zt_loader_open(const zt_loader_options *opt, zt_loader **out, zt_error *err);
void zt_loader_close(zt_loader *l);

/* What the open split holds. Valid until zt_loader_close. */
typedef struct zt_loader_info {
    int64_t n_shards;
    int64_t n_other_split_shards; /* shards the manifest lists for the other split (0: it has none) */
    int64_t n_samples;          /* N: samples in the split */
    int64_t n_tokens;           /* tokens in the split */
    int64_t n_loss_tokens;      /* mask bytes equal to 1 in the split */
    int64_t samples_per_rank;   /* floor(N / world): this rank's samples per epoch */
    int64_t dropped_per_epoch;  /* N mod world */
    int64_t n_long_samples;     /* samples longer than seq_len (truncated when used) */
    /* single_pass: the exact length of the pass, the largest count any rank needs. Endless stream:
     * the same count for epoch 0's order (other epochs differ by a little in packed mode). */
    int64_t batches_per_epoch;
    int64_t vocab_size;
    int64_t bos_id, eos_id, pad_id; /* from the manifest; -1 when the tokenizer has none */
    int64_t pad_token;          /* the id written on padding */
    int32_t packed;             /* the layout in use: 1 packed, 0 padded */
    int32_t manifest_layout;    /* what zt-prep recorded: 1 packed, 0 padded, -1 nothing */
    uint64_t tokenizer_hash;
    uint64_t dataset_hash;      /* fingerprint of the split's shards (their checksums, in order) */
} zt_loader_info;

const zt_loader_info *zt_loader_info_get(const zt_loader *l);

/* One micro-batch in host memory, owned by the loader and overwritten by the next call. */
typedef struct zt_loader_batch {
    int32_t batch;              /* B */
    int32_t seq_len;            /* T */
    int32_t n_spans;            /* spans in the B*T stream (samples + padding runs) */
    int32_t n_samples;          /* spans that are samples */
    int32_t max_span_len;
    int32_t n_truncated;        /* samples in this batch cut to seq_len */
    int64_t n_tokens;           /* sample tokens (B*T minus padding) */
    int64_t n_loss_tokens;      /* targets != -100: this micro-batch's share of the global count */
    int32_t *tokens;            /* [B*T] */
    int32_t *targets;           /* [B*T] */
    int32_t *positions;         /* [B*T] */
    int32_t *doc_ids;           /* [B*T] */
    int32_t *cu_seqlens;        /* [n_spans + 1] */
} zt_loader_batch;

/* The next micro-batch of this rank's stream. Fails only when a single pass is complete. */
zt_status zt_loader_next(zt_loader *l, const zt_loader_batch **out, zt_error *err);

/* A zt_batch viewing b's host arrays; n_loss_tokens_global is left 0 for the trainer to fill with
 * the sum of n_loss_tokens over the step's micro-batches and ranks. */
void zt_loader_batch_view(const zt_loader_batch *b, zt_batch *out);

/* ---- the data set's tokenizer ---------------------------------------------------------------- */

/* The "tokenizer" object of a data set's manifest.json: which tokenizer model file zt-prep used
 * (path as given to zt-prep, so relative to where it ran; its FNV-1a 64 hash tells whether a file is
 * that one), the plugin that read it (both "" when the manifest names none), and its special ids
 * (-1: none). */
typedef struct zt_data_tokenizer {
    char path[4096];
    char plugin[64];
    uint64_t hash;
    int64_t vocab_size, bos_id, eos_id, pad_id, unk_id;
} zt_data_tokenizer;

/* Read it from data_dir/manifest.json; errors name the file, line and column. */
zt_status zt_data_tokenizer_read(const char *data_dir, zt_data_tokenizer *out, zt_error *err);

/* ---- position: save and resume ------------------------------------------------------------- */

typedef struct zt_loader_position {
    uint64_t dataset_hash;      /* zt_loader_info.dataset_hash of the loader it came from */
    uint64_t seed;
    int32_t shuffle;
    int32_t world;
    int32_t rank;
    int32_t reserved0;          /* 0; keeps the layout free of implicit padding */
    uint64_t epoch;             /* epoch of the next sample */
    uint64_t cursor;            /* this rank's samples of `epoch` already consumed */
    uint64_t batches;           /* micro-batches produced so far (informational) */
} zt_loader_position;

void zt_loader_get_position(const zt_loader *l, zt_loader_position *out);
/* Continue from pos. Fails, changing nothing, when pos belongs to another data set, seed, shuffle
 * setting, world size or rank (the stream would not be the one that was interrupted). */
zt_status zt_loader_set_position(zt_loader *l, const zt_loader_position *pos, zt_error *err);
/* Back to the start of the stream (epoch 0, nothing consumed). */
void zt_loader_rewind(zt_loader *l);

/* A one-line JSON object, e.g.
 *   {"format":"zt-loader-position","version":1,"dataset":"<16 hex>","seed":"<16 hex>",
 *    "shuffle":true,"world":2,"rank":0,"epoch":3,"cursor":120,"batches":970}
 * Writes at most cap bytes including the NUL, like snprintf, and returns the length it needs. */
size_t zt_loader_position_to_json(const zt_loader_position *pos, char *buf, size_t cap);
/* Parse what zt_loader_position_to_json wrote; `origin` names the text in messages. */
zt_status zt_loader_position_from_json(const char *text, size_t len, const char *origin,
                                       zt_loader_position *out, zt_error *err);

/* ---- one shard image ----------------------------------------------------------------------- */

/* What a shard must agree with (NULL: only its own consistency). */
typedef struct zt_shard_expect {
    int32_t check_tokenizer;     /* 1: header tokenizer_hash and vocab_size must equal these */
    int32_t check_split;         /* 1: the VALIDATION flag must equal `validation` */
    int32_t check_file_checksum; /* 1: the whole image must hash to file_checksum */
    int32_t validation;
    int32_t verify_checksums;    /* 0: skip the checksum pass (and with it the file checksum) */
    uint64_t tokenizer_hash;
    uint64_t vocab_size;
    uint64_t file_checksum;      /* FNV-1a 64 of the whole image (manifest "checksum") */
} zt_shard_expect;

/* A validated shard: pointers into the image. */
typedef struct zt_shard_view {
    const uint8_t *base;
    uint64_t size;
    uint32_t token_bytes;
    uint64_t vocab_size;
    uint64_t tokenizer_hash;
    uint64_t n_samples;
    uint64_t n_tokens;
    uint64_t n_loss_tokens;
    const void *tokens;        /* uint16_t or uint32_t [n_tokens] */
    const uint8_t *mask;       /* [n_tokens] */
    const uint64_t *index;     /* [n_samples + 1] */
} zt_shard_view;

/* Validate a shard image of `size` bytes (the whole file) as zt_loader_open does; `name` (the
 * file's path) starts every message. data must be 8-byte aligned (a mapping or malloc). */
zt_status zt_shard_validate(const uint8_t *data, uint64_t size, const char *name,
                            const zt_shard_expect *expect, zt_shard_view *out, zt_error *err);

#endif
