// A map from text chunks to their ids, shared by all threads that encode with one model, read
// without locks.
//
// It only ever grows, into a slot table and an arena of fixed size that are allocated once (by
// calloc/malloc, so pages the cache never uses cost no memory), and an entry never moves or changes
// once written. A writer first writes its entry into arena space it reserved with an atomic add,
// then publishes it with a release compare-and-swap on an empty slot; a reader that loads the slot
// with acquire therefore sees the whole entry. Locks were the first design: with two threads the
// cache line of each lock moved between the cores on almost every lookup, which cost more than the
// lookup itself. When the table (half full) or the arena is full, new chunks are simply not cached
// and are encoded each time; what is cached stays. Entries are exact either way: only speed depends
// on what is cached.
#ifndef ZT_SPM_CHUNK_CACHE_H
#define ZT_SPM_CHUNK_CACHE_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

class chunk_cache {
public:
    // Chunks longer than this are not cached: long ones rarely repeat, and this bounds an entry.
    static constexpr size_t k_longest_chunk = 256;

    // budget_bytes bounds the slot table and the arena together.
    explicit chunk_cache(size_t budget_bytes);
    ~chunk_cache();
    chunk_cache(const chunk_cache &) = delete;
    chunk_cache &operator=(const chunk_cache &) = delete;

    // When `chunk` is cached, append its ids to *ids and return true. `hash` is spm_fnv1a64(chunk).
    bool find(std::string_view chunk, uint64_t hash, std::vector<int> *ids) const;
    // Remember the ids of `chunk` (at most k_longest_chunk bytes), unless it is there already or
    // the cache is full.
    void insert(std::string_view chunk, uint64_t hash, const int *ids, size_t n_ids);
    // Add one encode() call's lookups and hits to the totals (counting each lookup in a shared
    // counter would move its cache line between the cores all the time).
    void count(uint64_t lookups, uint64_t hits);

    struct stats {
        uint64_t lookups, hits, entries, entry_bytes, not_cached;
    };
    stats totals() const;

private:
    // Read by every lookup, written only here.
    uint64_t *slots_ = nullptr;  // 0: empty; else the hash's low 32 bits << 32 | (1 + arena offset)
    size_t n_slots_ = 0;         // a power of two
    uint32_t *arena_ = nullptr;  // entries: [chunk bytes][n_ids][chunk, padded to whole words][ids]
    size_t arena_words_ = 0;

    // Written by inserts and count(); kept off the cache line above.
    alignas(64) std::atomic<size_t> arena_used_{0};  // words claimed, may pass arena_words_
    std::atomic<size_t> n_entries_{0};               // entries published or being written
    std::atomic<uint64_t> lookups_{0}, hits_{0}, not_cached_{0};
};

#endif
