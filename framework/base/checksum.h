/* FNV-1a 64: the one checksum zt uses for shards, checkpoints and tokenizer model hashes.
 * Chosen for being tiny and dependency-free; it detects corruption, it is not a security hash.
 * Incremental: h = zt_fnv1a64(h, buf, n) starting from ZT_FNV1A64_INIT. */
#ifndef ZT_FRAMEWORK_CHECKSUM_H
#define ZT_FRAMEWORK_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define ZT_FNV1A64_INIT 0xcbf29ce484222325ull

uint64_t zt_fnv1a64(uint64_t h, const void *data, size_t n);

#endif
