/* The paged plugin's block pool (block_pool.h). Prefixes are found by a scan of the blocks' hashes:
 * a prompt looks up one hash per full block, which costs a few microseconds per prompt at the pool
 * sizes of a CPU run. */
#include "block_pool.h"

#include <stdlib.h>
#include <string.h>

static uint64_t splitmix(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int block_pool_init(block_pool *p, int32_t n_blocks, int32_t block_size, int shuffle, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->shuffle = shuffle;
    p->rng = seed;
    p->refcount = calloc((size_t)n_blocks, sizeof *p->refcount);
    p->clean = malloc((size_t)n_blocks * sizeof *p->clean);
    p->cached = malloc((size_t)n_blocks * sizeof *p->cached);
    p->hash = calloc((size_t)n_blocks, sizeof *p->hash);
    p->parent_hash = calloc((size_t)n_blocks, sizeof *p->parent_hash);
    p->tokens = malloc((size_t)n_blocks * (size_t)block_size * sizeof *p->tokens);
    if (!p->refcount || !p->clean || !p->cached || !p->hash || !p->parent_hash || !p->tokens) {
        block_pool_free(p);
        return -1;
    }
    /* Stacked so that block 0 is handed out first. */
    for (int32_t i = 0; i < n_blocks; i++) p->clean[i] = n_blocks - 1 - i;
    p->n_clean = n_blocks;
    return 0;
}

void block_pool_free(block_pool *p)
{
    free(p->refcount);
    free(p->clean);
    free(p->cached);
    free(p->hash);
    free(p->parent_hash);
    free(p->tokens);
    memset(p, 0, sizeof *p);
}

int32_t block_pool_available(const block_pool *p)
{
    return p->n_clean + p->n_cached;
}

static void remove_cached(block_pool *p, int32_t block)
{
    for (int32_t i = 0; i < p->n_cached; i++)
        if (p->cached[i] == block) {
            memmove(p->cached + i, p->cached + i + 1, (size_t)(p->n_cached - i - 1) * sizeof *p->cached);
            p->n_cached--;
            return;
        }
}

int32_t block_pool_take(block_pool *p)
{
    int32_t block;
    if (p->n_clean > 0) {
        int32_t at = p->n_clean - 1;
        if (p->shuffle) at = (int32_t)(splitmix(&p->rng) % (uint64_t)p->n_clean);
        block = p->clean[at];
        p->clean[at] = p->clean[--p->n_clean];
    } else if (p->n_cached > 0) {
        block = p->cached[0]; /* the prefix freed longest ago */
        remove_cached(p, block);
        p->hash[block] = 0;
    } else {
        return -1;
    }
    p->refcount[block] = 1;
    if (++p->used > p->peak_used) p->peak_used = p->used;
    return block;
}

void block_pool_ref(block_pool *p, int32_t block)
{
    if (p->refcount[block]++ == 0) {
        remove_cached(p, block);
        if (++p->used > p->peak_used) p->peak_used = p->used;
    }
}

void block_pool_unref(block_pool *p, int32_t block)
{
    if (--p->refcount[block] > 0) return;
    p->used--;
    if (p->hash[block]) p->cached[p->n_cached++] = block;
    else p->clean[p->n_clean++] = block;
}

uint64_t block_pool_chain(uint64_t parent, const int32_t *tokens, int32_t n)
{
    uint64_t h = parent ^ 0x6A09E667F3BCC909ull;
    for (int32_t i = 0; i < n; i++) {
        uint64_t x = h ^ (uint32_t)tokens[i];
        h = splitmix(&x);
    }
    return h ? h : 1; /* 0 means "no prefix" */
}

int32_t block_pool_find(const block_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens)
{
    size_t bytes = (size_t)p->block_size * sizeof *tokens;
    for (int32_t b = 0; b < p->n_blocks; b++)
        if (p->hash[b] == hash && p->parent_hash[b] == parent &&
            !memcmp(p->tokens + (int64_t)b * p->block_size, tokens, bytes))
            return b;
    return -1;
}

void block_pool_publish(block_pool *p, int32_t block, uint64_t hash, uint64_t parent, const int32_t *tokens)
{
    if (block_pool_find(p, hash, parent, tokens) >= 0) return;
    p->hash[block] = hash;
    p->parent_hash[block] = parent;
    memcpy(p->tokens + (int64_t)block * p->block_size, tokens, (size_t)p->block_size * sizeof *tokens);
}
