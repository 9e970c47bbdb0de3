/* A small, independent writer of zt shards and manifests for the loader tests.
 *
 * It follows docs/shard-format.md byte by byte (explicit offsets, its own FNV-1a 64) and shares no
 * code with zt-prep or the loader, so a misreading of the format on either side shows up as a test
 * failure instead of cancelling out. Tests build an image, may damage it (and reseal the checksums
 * when the damage should get past them), then write it out with a manifest.
 */
#ifndef ZT_TESTS_SHARD_WRITER_H
#define ZT_TESTS_SHARD_WRITER_H

#include <stddef.h>
#include <stdint.h>

/* Header byte offsets (docs/shard-format.md). */
enum {
    TW_OFF_MAGIC = 0,
    TW_OFF_VERSION = 8,
    TW_OFF_HEADER_SIZE = 12,
    TW_OFF_TOKEN_BYTES = 16,
    TW_OFF_FLAGS = 20,
    TW_OFF_VOCAB = 24,
    TW_OFF_SHARD_INDEX = 28,
    TW_OFF_TOKENIZER_HASH = 32,
    TW_OFF_N_SAMPLES = 40,
    TW_OFF_N_TOKENS = 48,
    TW_OFF_N_LOSS = 56,
    TW_OFF_TOKENS = 64,
    TW_OFF_MASK = 72,
    TW_OFF_INDEX = 80,
    TW_OFF_FILE_SIZE = 88,
    TW_OFF_TOKENS_SUM = 96,
    TW_OFF_MASK_SUM = 104,
    TW_OFF_INDEX_SUM = 112,
    TW_OFF_HEADER_SUM = 120,
    TW_HEADER = 256
};

/* Samples of one shard, appended one by one. */
typedef struct tw_samples {
    uint32_t *tokens;
    uint8_t *mask;
    uint64_t *index; /* n + 1 entries */
    size_t n_tokens, n_samples, cap_tokens, cap_samples;
} tw_samples;

void tw_samples_init(tw_samples *s);
void tw_samples_add(tw_samples *s, const uint32_t *tokens, const uint8_t *mask, size_t len);
void tw_samples_free(tw_samples *s);

typedef struct tw_shard_params {
    uint32_t token_bytes;    /* 2 or 4 */
    uint32_t vocab_size;
    uint64_t tokenizer_hash;
    uint32_t validation;     /* 1: set the validation flag */
    uint32_t shard_index;
} tw_shard_params;

typedef struct tw_image {
    uint8_t *data;           /* 64-byte aligned */
    size_t size;
} tw_image;

/* A valid shard image of the samples: sections at 64-byte boundaries after the header. */
void tw_build(const tw_samples *s, const tw_shard_params *p, tw_image *out);
void tw_image_free(tw_image *img);
/* Recompute the three section checksums and then the header checksum from the header's own offsets
 * and counts (which must lie inside the image). */
void tw_reseal(tw_image *img);
/* Recompute only the header checksum (after changing header fields that no longer describe
 * sections inside the image). */
void tw_reseal_header(tw_image *img);

uint64_t tw_fnv1a64(const void *data, size_t n);
uint32_t tw_get_u32(const tw_image *img, size_t off);
uint64_t tw_get_u64(const tw_image *img, size_t off);
void tw_put_u32(tw_image *img, size_t off, uint32_t v);
void tw_put_u64(tw_image *img, size_t off, uint64_t v);

/* One manifest entry; checksum and bytes describe the image as written unless overridden. */
typedef struct tw_entry {
    const char *file;
    const char *split;       /* "train" or "val" */
    const tw_image *image;   /* written to dir/file; NULL: write nothing (missing file) */
} tw_entry;

/* The manifest's "tokenizer" object, and options.layout ("packed", "padded"; NULL: not written). */
typedef struct tw_tokenizer {
    uint64_t hash;
    int64_t vocab_size, bos_id, eos_id, pad_id;
    const char *layout;
} tw_tokenizer;

/* Write each image and then manifest.json into dir (created if needed), as zt-prep lays it out
 * (format, format_version, tokenizer, options, shards with the counts their headers hold; 0 for
 * an image too short to hold them). 0 on success. */
int tw_write_dataset(const char *dir, const tw_tokenizer *tok, const tw_entry *entries, size_t n);
/* Write raw bytes to a file (the test's own manifests). 0 on success. */
int tw_write_file(const char *path, const void *data, size_t n);
char *tw_read_file(const char *path, size_t *n);

/* A fresh directory under the current directory ("name-XXXXXX"), and recursive removal. */
char *tw_make_temp_dir(const char *name);
void tw_remove_tree(const char *dir);

#endif
