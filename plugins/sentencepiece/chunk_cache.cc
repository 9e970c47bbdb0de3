#include "chunk_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

// The slots live in anonymous mmap'ed memory (no page until used, page-aligned so that a region of
// 512 slots is one page), so they are plain uint64_t accessed with the compiler's atomic builtins
// rather than std::atomic objects, which would have to be constructed, touching every page.

namespace {

size_t words_for_bytes(size_t n) { return (n + 3) / 4; }

uint64_t make_slot(uint64_t hash, size_t offset) { return hash << 32 | (offset + 1); }
uint32_t slot_hash(uint64_t slot) { return static_cast<uint32_t>(slot >> 32); }
size_t slot_offset(uint64_t slot) { return static_cast<uint32_t>(slot) - 1; }

}  // namespace

chunk_cache::chunk_cache(size_t budget_bytes)
{
    // A quarter of the budget for the table (the largest power of two of slots that fits), the
    // direct table when the budget is large enough for it not to matter, the rest for the arena,
    // whose offsets must fit in 32 bits.
    n_slots_ = 1;
    while (n_slots_ * 2 * sizeof(uint64_t) <= budget_bytes / 4) n_slots_ *= 2;
    size_t used = n_slots_ * sizeof(uint64_t);
    const size_t direct_bytes = k_direct_limit * sizeof(uint32_t);
    const bool direct = budget_bytes >= (4u << 20);
    if (direct) used += direct_bytes;
    if (budget_bytes > used) arena_words_ = std::min<size_t>((budget_bytes - used) / 4, UINT32_MAX - 1);
    void *slots = mmap(nullptr, slot_bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    slots_ = slots == MAP_FAILED ? nullptr : static_cast<uint64_t *>(slots);
    const size_t n_regions = (n_slots_ >> k_region_shift) + 1;
    written_ = static_cast<uint64_t *>(std::calloc((n_regions + 63) / 64, sizeof(uint64_t)));
    arena_ = static_cast<uint32_t *>(std::malloc(std::max<size_t>(arena_words_, 1) * 4));
    // The direct table is small and read before it is written: zeroed by writing (no zero pages).
    if (direct) direct_ = static_cast<uint32_t *>(std::malloc(k_direct_limit * sizeof(uint32_t)));
    if (direct_) std::memset(direct_, 0, k_direct_limit * sizeof(uint32_t));
    if (!slots_ || !written_ || !arena_ || (direct && !direct_)) {
        release();
        throw std::bad_alloc();
    }
}

size_t chunk_cache::slot_bytes() const { return n_slots_ * sizeof(uint64_t); }

void chunk_cache::release()
{
    if (slots_) munmap(slots_, slot_bytes());
    std::free(written_);
    std::free(arena_);
    std::free(direct_);
    slots_ = nullptr;
    written_ = nullptr;
    arena_ = nullptr;
    direct_ = nullptr;
}

chunk_cache::~chunk_cache() { release(); }

void chunk_cache::mark_written(size_t slot)
{
    const size_t r = slot >> k_region_shift;
    const uint64_t bit = uint64_t{1} << (r % 64);
    if (!(__atomic_load_n(&written_[r / 64], __ATOMIC_RELAXED) & bit))
        __atomic_fetch_or(&written_[r / 64], bit, __ATOMIC_RELEASE);
}

const int *chunk_cache::find(std::string_view chunk, uint64_t hash, uint32_t *n_ids) const
{
    const size_t mask = n_slots_ - 1;
    const uint32_t tag = static_cast<uint32_t>(hash);
    for (size_t i = tag & mask;; i = (i + 1) & mask) {
        if (!region_written(i)) return nullptr;  // only empty slots there
        const uint64_t slot = __atomic_load_n(&slots_[i], __ATOMIC_ACQUIRE);
        if (slot == 0) return nullptr;  // the table is never full, so a probe always ends
        if (slot_hash(slot) != tag) continue;
        const uint32_t *entry = arena_ + slot_offset(slot);
        if (entry[0] != chunk.size() || std::memcmp(entry + 2, chunk.data(), chunk.size()) != 0)
            continue;
        *n_ids = entry[1];
        return reinterpret_cast<const int *>(entry + 2 + words_for_bytes(entry[0]));
    }
}

void chunk_cache::insert(std::string_view chunk, uint64_t hash, const int *ids, size_t n_ids,
                         int32_t one_cp)
{
    if (chunk.size() > k_longest_chunk) return;
    const size_t entry_words = 2 + words_for_bytes(chunk.size()) + n_ids;
    if (one_cp >= 0) {
        // A direct slot of its own: claim room in the arena, write the entry, publish it.
        const size_t offset = arena_used_.fetch_add(entry_words, std::memory_order_relaxed);
        if (offset + entry_words > arena_words_) {
            not_cached_.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        uint32_t *entry = arena_ + offset;
        entry[0] = static_cast<uint32_t>(chunk.size());
        entry[1] = static_cast<uint32_t>(n_ids);
        std::memcpy(entry + 2, chunk.data(), chunk.size());
        if (n_ids) std::memcpy(entry + 2 + words_for_bytes(chunk.size()), ids, n_ids * sizeof *ids);
        uint32_t empty = 0;
        // Another thread may have published the same code point meanwhile: its entry is as good.
        if (__atomic_compare_exchange_n(&direct_[one_cp], &empty, static_cast<uint32_t>(offset + 1),
                                        false, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
            n_direct_.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    // Claim an entry of the table (kept at most half full, so that probes stay short and always
    // reach an empty slot) and room in the arena, or leave the chunk uncached.
    if (2 * (n_entries_.fetch_add(1, std::memory_order_relaxed) + 1) > n_slots_) {
        n_entries_.fetch_sub(1, std::memory_order_relaxed);
        not_cached_.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    const size_t offset = arena_used_.fetch_add(entry_words, std::memory_order_relaxed);
    if (offset + entry_words > arena_words_) {
        n_entries_.fetch_sub(1, std::memory_order_relaxed);
        not_cached_.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    uint32_t *entry = arena_ + offset;
    entry[0] = static_cast<uint32_t>(chunk.size());
    entry[1] = static_cast<uint32_t>(n_ids);
    std::memcpy(entry + 2, chunk.data(), chunk.size());
    if (n_ids) std::memcpy(entry + 2 + words_for_bytes(chunk.size()), ids, n_ids * sizeof *ids);

    const size_t mask = n_slots_ - 1;
    const uint32_t tag = static_cast<uint32_t>(hash);
    const uint64_t mine = make_slot(hash, offset);
    for (size_t i = tag & mask;; i = (i + 1) & mask) {
        uint64_t slot = 0;
        if (__atomic_compare_exchange_n(&slots_[i], &slot, mine, false, __ATOMIC_RELEASE,
                                        __ATOMIC_ACQUIRE)) {
            mark_written(i);
            return;
        }
        // The slot is taken (`slot` now holds it). By this very chunk when another thread encoded
        // it at the same time: then our copy in the arena stays unused.
        const uint32_t *other = arena_ + slot_offset(slot);
        if (slot_hash(slot) == tag && other[0] == chunk.size() &&
            std::memcmp(other + 2, chunk.data(), chunk.size()) == 0) {
            n_entries_.fetch_sub(1, std::memory_order_relaxed);
            return;
        }
    }
}

void chunk_cache::count(uint64_t lookups, uint64_t hits)
{
    lookups_.fetch_add(lookups, std::memory_order_relaxed);
    hits_.fetch_add(hits, std::memory_order_relaxed);
}

chunk_cache::stats chunk_cache::totals() const
{
    stats t{};
    t.lookups = lookups_.load(std::memory_order_relaxed);
    t.hits = hits_.load(std::memory_order_relaxed);
    t.entries = n_entries_.load(std::memory_order_relaxed) + n_direct_.load(std::memory_order_relaxed);
    t.not_cached = not_cached_.load(std::memory_order_relaxed);
    t.entry_bytes = std::min(arena_used_.load(std::memory_order_relaxed), arena_words_) * 4;
    return t;
}
