/* Checksums. FNV-1a 64 is the one zt uses for its own files: shards, checkpoints and tokenizer model
 * hashes (tiny and dependency-free; it detects corruption, it is not a security hash).
 * Incremental: h = zt_fnv1a64(h, buf, n) starting from ZT_FNV1A64_INIT.
 *
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) is what other programs' formats demand:
 * TFRecord framing of TensorBoard event files (train/tensorboard.c) checks it, masked. Incremental:
 * c = zt_crc32c(c, buf, n) starting from 0; zt_crc32c(0, "123456789", 9) is 0xE3069283. */
#ifndef ZT_FRAMEWORK_CHECKSUM_H
#define ZT_FRAMEWORK_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define ZT_FNV1A64_INIT 0xcbf29ce484222325ull

uint64_t zt_fnv1a64(uint64_t h, const void *data, size_t n);

uint32_t zt_crc32c(uint32_t crc, const void *data, size_t n);

/* TFRecord's masked CRC (rotate right by 15, add a constant), stored so that a CRC computed over data
 * that itself holds CRCs does not degenerate. */
uint32_t zt_crc32c_masked(uint32_t crc);

#endif
