/* The on-disk layout of a zt token shard (docs/shard-format.md is the prose version).
 * Written by zt-prep (dataprep/), read by the loader (framework/data/shard.c validates it, loader.c
 * reads it). Little-endian.
 *
 *   offset 0     zt_shard_header (256 bytes, zero-padded)
 *   tokens       n_tokens ids, uint16 or uint32 (token_bytes)
 *   loss mask    n_tokens bytes, 1 where the token is a training target (response and EOS), else 0
 *   index        n_samples + 1 uint64: sample i is tokens [index[i], index[i+1])
 *
 * Every section starts at a multiple of 64 bytes. Each section has its own FNV-1a 64 checksum and
 * the header has one over its own bytes, so a reader can tell a truncated or corrupt file from a
 * valid one and say which part is damaged.
 */
#ifndef ZT_FRAMEWORK_SHARD_FORMAT_H
#define ZT_FRAMEWORK_SHARD_FORMAT_H

#include <stdint.h>

#define ZT_SHARD_MAGIC "ZTSHARD\0" /* 8 bytes */
#define ZT_SHARD_VERSION 1u
#define ZT_SHARD_HEADER_SIZE 256u
#define ZT_SHARD_ALIGN 64u
#define ZT_SHARD_EXT ".ztshard"

/* header flags */
#define ZT_SHARD_FLAG_VALIDATION 0x1u /* samples of the validation split */

typedef struct zt_shard_header {
    char magic[8];            /* ZT_SHARD_MAGIC */
    uint32_t version;         /* ZT_SHARD_VERSION */
    uint32_t header_size;     /* ZT_SHARD_HEADER_SIZE */
    uint32_t token_bytes;     /* 2 (uint16, vocab <= 65536) or 4 (uint32) */
    uint32_t flags;           /* ZT_SHARD_FLAG_* */
    uint32_t vocab_size;
    uint32_t shard_index;     /* position of this shard in its split */
    uint64_t tokenizer_hash;  /* zt_tokenizer_info.model_hash of the tokenizer used */
    uint64_t n_samples;
    uint64_t n_tokens;
    uint64_t n_loss_tokens;
    uint64_t tokens_offset;   /* byte offsets from the start of the file */
    uint64_t mask_offset;
    uint64_t index_offset;
    uint64_t file_size;       /* total bytes; a shorter file is truncated */
    uint64_t tokens_checksum; /* FNV-1a 64 of each section's bytes */
    uint64_t mask_checksum;
    uint64_t index_checksum;
    uint64_t header_checksum; /* FNV-1a 64 of the header's first 120 bytes (up to this field) */
    uint8_t reserved[128];    /* zero */
} zt_shard_header;

#if defined(__cplusplus)
static_assert(sizeof(zt_shard_header) == ZT_SHARD_HEADER_SIZE, "shard header is 256 bytes");
#else
_Static_assert(sizeof(zt_shard_header) == ZT_SHARD_HEADER_SIZE, "shard header is 256 bytes");
_Static_assert(__builtin_offsetof(zt_shard_header, header_checksum) == 120,
               "header checksum covers the first 120 bytes");
#endif

#endif
