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
//
// Chunks of a single code point below k_direct_limit (most CJK text is cut into such chunks: the
// LLaMA vocabulary has few pieces that join two Chinese characters) have a slot of their own in a
// direct table indexed by the code point, so their lookup needs no hash, probe or comparison. The
// direct table takes 768 KiB of the budget when the budget is at least 4 MiB; it is published the
// same way as the hashed slots.
//
// Lookups never read a page of the slot table that no insert has written: a bit per 512 slots
// says which have been (the bit is set after the slot is published, and a region without it holds
// only empty slots). Reading an untouched page first would map the kernel's shared zero page, and
// the first insert there would then have to replace it, which flushes that page from the TLB of
// every core running one of the process's threads: with two threads that cost zt-prep as much
// time as all its lookups.
#ifndef ZT_SPM_CHUNK_CACHE_H
#define ZT_SPM_CHUNK_CACHE_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

// The hash the cache is keyed by: 8 bytes per step (a chunk is mostly a word or a few characters,
// so this costs a few multiplications where FNV-1a takes one per byte).
inline uint64_t chunk_hash(const char *s, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (; n >= 8; s += 8, n -= 8) {
        uint64_t w;
        __builtin_memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    uint64_t tail = 0;
    for (size_t k = 0; k < n; k++) tail |= static_cast<uint64_t>(static_cast<unsigned char>(s[k])) << (8 * k);
    h = (h ^ tail) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 32);
}

class chunk_cache {
public:
    // Chunks longer than this are not cached: long ones rarely repeat, and this bounds an entry.
    static constexpr size_t k_longest_chunk = 256;
    // Single code points below this are cached in the direct table (all of the BMP and the CJK
    // extension planes 2).
    static constexpr char32_t k_direct_limit = 0x30000;

    // budget_bytes bounds the slot table and the arena together.
    explicit chunk_cache(size_t budget_bytes);
    ~chunk_cache();
    chunk_cache(const chunk_cache &) = delete;
    chunk_cache &operator=(const chunk_cache &) = delete;

    // The ids of `chunk` (*n_ids of them) when it is cached, else nullptr. `hash` is
    // chunk_hash(chunk).
    const int *find(std::string_view chunk, uint64_t hash, uint32_t *n_ids) const;
    // The same for a chunk that is the single code point `cp`; only for has_direct() and
    // cp < k_direct_limit.
    const int *find_one(char32_t cp, uint32_t *n_ids) const
    {
        const uint32_t slot = __atomic_load_n(&direct_[cp], __ATOMIC_ACQUIRE);
        if (slot == 0) return nullptr;
        const uint32_t *entry = arena_ + (slot - 1);
        *n_ids = entry[1];
        return reinterpret_cast<const int *>(entry + 2 + (entry[0] + 3) / 4);
    }
    bool has_direct() const { return direct_ != nullptr; }
    // Remember the ids of `chunk` (at most k_longest_chunk bytes), unless it is there already or
    // the cache is full. `one_cp` is the chunk's code point when it is a single one that
    // find_one() serves, else -1.
    void insert(std::string_view chunk, uint64_t hash, const int *ids, size_t n_ids, int32_t one_cp);
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
    uint32_t *direct_ = nullptr;  // k_direct_limit slots: 0 empty, else 1 + arena offset; or none
    uint64_t *written_ = nullptr; // bit r: some slot in [512 r, 512 (r + 1)) has been written
    static constexpr unsigned k_region_shift = 9;  // 512 slots = one 4 KiB page
    bool region_written(size_t slot) const
    {
        const size_t r = slot >> k_region_shift;
        return (__atomic_load_n(&written_[r / 64], __ATOMIC_ACQUIRE) >> (r % 64)) & 1;
    }
    void mark_written(size_t slot);
    size_t slot_bytes() const;
    void release();

    // Written by inserts and count(); kept off the cache line above.
    alignas(64) std::atomic<size_t> arena_used_{0};  // words claimed, may pass arena_words_
    std::atomic<size_t> n_entries_{0};               // hashed entries published or being written
    std::atomic<size_t> n_direct_{0};                // direct entries published
    std::atomic<uint64_t> lookups_{0}, hits_{0}, not_cached_{0};
};

#endif
