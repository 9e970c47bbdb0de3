/* The paged plugin's block pool: which blocks are free, who references each, and the prompt
 * prefixes cached blocks hold (block_pool.c). It knows nothing of K and V, only block ids, so the
 * same bookkeeping serves a CPU pool and, for the CUDA decode kernels, a device one. */
#ifndef ZT_PAGED_BLOCK_POOL_H
#define ZT_PAGED_BLOCK_POOL_H

#include <stdint.h>

typedef struct block_pool {
    int32_t n_blocks, block_size;
    int32_t *refcount;     /* [n_blocks]: sequences holding the block */
    /* Free blocks without a prefix, a stack; shuffle: taken at random (a debug option that shows
     * no result depends on which physical block a token lands in). */
    int32_t *clean;
    int32_t n_clean;
    /* Free blocks that still hold a prompt prefix, oldest first: reused by a matching prompt, else
     * evicted when no clean block is left. */
    int32_t *cached;
    int32_t n_cached;
    /* A full prompt block's identity: the hash of its tokens chained with the hash of all blocks
     * before it (0: none), its parent's hash and its tokens [n_blocks][block_size], compared on a
     * match so a hash collision can never share the wrong block. */
    uint64_t *hash, *parent_hash;
    int32_t *tokens;
    int32_t used, peak_used;
    int shuffle;
    uint64_t rng;
} block_pool;

/* 0, or -1 when out of memory. */
int block_pool_init(block_pool *p, int32_t n_blocks, int32_t block_size, int shuffle, uint64_t seed);
void block_pool_free(block_pool *p);
/* Blocks an allocation can have now: clean and cached. */
int32_t block_pool_available(const block_pool *p);
/* A block with refcount 1 (a clean one, else the oldest cached one, forgotten), or -1 when none. */
int32_t block_pool_take(block_pool *p);
/* One more reference to a block (a cached free one becomes used again). */
void block_pool_ref(block_pool *p, int32_t block);
/* One reference less; at 0 the block is free: cached when it holds a prefix, else clean. */
void block_pool_unref(block_pool *p, int32_t block);
/* The chained hash of a block of tokens after a block of hash `parent` (0 for the first). */
uint64_t block_pool_chain(uint64_t parent, const int32_t *tokens, int32_t n);
/* The block holding exactly these tokens after `parent`, or -1. */
int32_t block_pool_find(const block_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Records that `block` holds these tokens after `parent` (unless another block already does). */
void block_pool_publish(block_pool *p, int32_t block, uint64_t hash, uint64_t parent, const int32_t *tokens);

#endif
