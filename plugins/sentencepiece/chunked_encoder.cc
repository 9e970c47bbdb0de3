#include "chunked_encoder.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "utf8.h"

using sentencepiece::util::Status;

namespace {

const char k_visible_space[] = "\xe2\x96\x81";  // U+2581: how SentencePiece writes a space
constexpr size_t k_visible_space_len = 3;

// The code point starting at s[i] of valid UTF-8, and its length in *len. Inlined into the loop
// that visits every character of every text.
__attribute__((always_inline)) inline char32_t decode_utf8(std::string_view s, size_t i, size_t *len)
{
    const auto byte = [&](size_t k) {
        return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]));
    };
    const char32_t lead = byte(0);
    if (lead < 0x80) {
        *len = 1;
        return lead;
    }
    if (lead < 0xE0) {
        *len = 2;
        return (lead & 0x1F) << 6 | (byte(1) & 0x3F);
    }
    if (lead < 0xF0) {
        *len = 3;
        return (lead & 0x0F) << 12 | (byte(1) & 0x3F) << 6 | (byte(2) & 0x3F);
    }
    *len = 4;
    return (lead & 0x07) << 18 | (byte(1) & 0x3F) << 12 | (byte(2) & 0x3F) << 6 | (byte(3) & 0x3F);
}

// Code points fit in 21 bits; + 1 keeps every key away from the empty slot's 0.
uint64_t pair_key(char32_t left, char32_t right)
{
    return (static_cast<uint64_t>(left) << 21 | right) + 1;
}

size_t pair_slot(uint64_t key, size_t n_slots)
{
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & (n_slots - 1);
}

// Texts where a wrong normalization or a wrong cut would show: runs and ends of spaces, the
// dummy prefix, raw U+2581, tabs and newlines (not spaces to SentencePiece), digits, characters
// the vocabulary lacks, control-piece look-alikes, and mixed scripts.
const char *const k_awkward_texts[] = {
    "", " ", "   ", "a", " a", "a ", "  a  b   c  ", "\t", "a\tb \t c", "a\nb", "\n\n x \n",
    "Hello,  World!", "12345 67.89 1,000,000", "\xe2\x96\x81", " \xe2\x96\x81 ",
    "a \xe2\x96\x81\xe2\x96\x81 b\xe2\x96\x81", "<s> </s> <unk> <pad>",
    "\xf0\x9f\x98\x80 \xf0\x9f\x98\x80\xf0\x9f\x98\x80",  // emoji
    "\xe4\xb8\xad\xe6\x96\x87 \xe6\x96\x87\xe6\x9c\xac",  // CJK
    "mixed \xe4\xb8\xad\xe6\x96\x87text and \xd0\xba\xd0\xb8\xd1\x80\xd0\xb8\xd0\xbb\xd0\xbb\xd0\xb8"
    "\xd1\x86\xd0\xb0",
    "x\xe3\x80\x80y\xc2\xa0z", "end with spaces   ", "  \t  lead and trail \n  ",
};

}  // namespace

chunked_encoder::chunked_encoder(const spm_encode_spec &spec, size_t cache_bytes)
    : spec_(spec), cache_(cache_bytes)
{
}

std::unique_ptr<chunked_encoder> chunked_encoder::create(const spm_model_file &file,
                                                         size_t cache_bytes, std::string *why_not)
{
    const spm_encode_spec &spec = file.spec;
    if (std::strcmp(file.model_type, "unigram") == 0) {
        *why_not = "it is a unigram model, whose Viterbi search adds piece scores along the whole "
                   "text in float32; encoding a text in parts can settle near-ties differently";
        return nullptr;
    }
    if (std::strcmp(file.model_type, "bpe") != 0) {
        *why_not = std::string("only BPE models are encoded in chunks, and this is a ") +
                   file.model_type + " model";
        return nullptr;
    }
    if (spec.charsmap_size > 0) {
        *why_not = std::string("its normalizer '") + spec.normalizer_name +
                   "' rewrites text with rules (a precompiled_charsmap) that the chunked encoder "
                   "does not reproduce";
        return nullptr;
    }
    if (!spec.escape_whitespaces) {
        *why_not = "its normalizer keeps spaces as spaces (escape_whitespaces: false)";
        return nullptr;
    }

    std::unique_ptr<chunked_encoder> encoder(new chunked_encoder(spec, cache_bytes));
    std::vector<uint64_t> pairs;
    std::vector<uint8_t> neighbours(chunk_cache::k_direct_limit, 0);
    // The pieces straight from the file (the same ModelProto libsentencepiece loaded): its API
    // costs more per piece than all the rest of this loop.
    size_t pos = 0, piece_len = 0;
    const char *piece_bytes = nullptr;
    int type = 0, id = 0;
    for (; spm_model_file_next_piece(&file, &pos, &piece_bytes, &piece_len, &type); id++) {
        if (type == SPM_PIECE_UNKNOWN && encoder->unk_id_ < 0) encoder->unk_id_ = id;
        // BPE never forms control, unknown or byte pieces from text: they cannot span a cut.
        if (type == SPM_PIECE_CONTROL || type == SPM_PIECE_UNKNOWN || type == SPM_PIECE_BYTE) continue;
        const std::string_view piece(piece_bytes, piece_len);
        if (type == SPM_PIECE_UNUSED) {
            *why_not = "its piece " + std::to_string(id) + " ('" + std::string(piece) +
                       "') is UNUSED, and BPE re-splits such pieces with a map shared by the "
                       "whole text";
            return nullptr;
        }
        if (piece.find(' ') != std::string_view::npos) {
            *why_not = "its piece " + std::to_string(id) + " ('" + std::string(piece) + "') contains a space";
            return nullptr;
        }
        size_t bad_offset;
        const char *problem;
        if (!spm_utf8_valid(piece.data(), piece.size(), &bad_offset, &problem)) {
            *why_not = "its piece " + std::to_string(id) + " is not valid UTF-8 (" + problem + ")";
            return nullptr;
        }
        size_t len = 0;
        char32_t left = 0;
        for (size_t i = 0; i < piece.size(); i += len) {
            const char32_t right = decode_utf8(piece, i, &len);
            if (i > 0) {
                pairs.push_back(pair_key(left, right));
                if (left < chunk_cache::k_direct_limit) neighbours[left] |= k_left;
                if (right < chunk_cache::k_direct_limit) neighbours[right] |= k_right;
            }
            left = right;
        }
    }
    encoder->n_pieces_ = id;
    encoder->neighbours_ = std::move(neighbours);
    // Most pairs occur in many pieces: the repeats are dropped as the table is filled (cheaper
    // than sorting), and the table doubles whenever it gets half full, so it ends up at two to
    // four slots a distinct pair: small enough to stay in the cache for the probes of encode().
    std::vector<uint64_t> &table = encoder->pair_slots_;
    size_t n_distinct = 0;
    const auto place = [&table](uint64_t key) {
        const size_t mask = table.size() - 1;
        size_t i = pair_slot(key, table.size());
        while (table[i] != 0 && table[i] != key) i = (i + 1) & mask;
        const bool is_new = table[i] == 0;
        table[i] = key;
        return is_new;
    };
    table.assign(1024, 0);
    for (uint64_t key : pairs) {
        if (2 * (n_distinct + 1) > table.size()) {
            std::vector<uint64_t> old(2 * table.size(), 0);
            old.swap(table);
            for (uint64_t k : old)
                if (k) place(k);
        }
        n_distinct += place(key);
    }

    size_t size = 0;
    std::unique_ptr<unsigned char, void (*)(void *)> copy(spm_model_file_without_normalizer(&file, &size),
                                                          std::free);
    if (!copy) throw std::bad_alloc();
    const Status loaded = encoder->pieces_only_.LoadFromSerializedProto(
        std::string_view(reinterpret_cast<const char *>(copy.get()), size));
    if (!loaded.ok()) {
        *why_not = "SentencePiece rejected the model with its normalizer removed: " +
                   loaded.ToString();
        return nullptr;
    }
    return encoder;
}


inline bool chunked_encoder::is_cut_point(char32_t left, char32_t right) const
{
    if (left < chunk_cache::k_direct_limit && !(neighbours_[left] & k_left)) return true;
    if (right < chunk_cache::k_direct_limit && !(neighbours_[right] & k_right)) return true;
    const uint64_t key = pair_key(left, right);
    const size_t mask = pair_slots_.size() - 1;
    for (size_t i = pair_slot(key, pair_slots_.size());; i = (i + 1) & mask) {
        if (pair_slots_[i] == key) return false;
        if (pair_slots_[i] == 0) return true;
    }
}

// What SentencePiece's normalizer does when it has no rewriting rules (normalizer.cc): optionally
// drop leading, trailing and repeated spaces, write each space as U+2581, and add one U+2581 in
// front (or at the end, with treat_whitespace_as_suffix) of a text that is not empty. Written into
// *buf (which only ever grows, so a thread reuses it without refilling it) through a pointer:
// the text is copied run by run between spaces.
std::string_view chunked_encoder::normalize(std::string_view text, std::string *buf) const
{
    const bool trim = spec_.remove_extra_whitespaces;
    if (trim) text.remove_prefix(std::min(text.size(), text.find_first_not_of(' ')));
    if (text.empty()) return std::string_view();
    size_t n = 0;
    const auto room = [&](size_t more) {  // grows by doubling; retains what the longest text needs
        if (n + more > buf->size()) buf->resize(std::max(n + more, 2 * buf->size()));
        return buf->data() + n;
    };
    const auto put_space = [&]() {
        std::memcpy(room(k_visible_space_len), k_visible_space, k_visible_space_len);
        n += k_visible_space_len;
    };
    if (spec_.add_dummy_prefix && !spec_.treat_whitespace_as_suffix) put_space();
    const char *p = text.data(), *end = p + text.size();
    while (p < end) {
        const char *space = static_cast<const char *>(std::memchr(p, ' ', static_cast<size_t>(end - p)));
        if (!space) space = end;
        const size_t run = static_cast<size_t>(space - p);
        std::memcpy(room(run), p, run);
        n += run;
        if (space == end) break;
        p = space;
        while (p < end && *p == ' ') {
            if (!trim || p == space) put_space();
            p++;
        }
    }
    const char *out = buf->data();
    if (trim) {  // every trailing U+2581 goes, also one the text itself contained
        while (n >= k_visible_space_len &&
               std::memcmp(out + n - k_visible_space_len, k_visible_space, k_visible_space_len) == 0)
            n -= k_visible_space_len;
    }
    if (spec_.add_dummy_prefix && spec_.treat_whitespace_as_suffix) put_space();
    return std::string_view(buf->data(), n);
}

void id_buffer::grow(size_t need)
{
    size_t new_cap = cap ? 2 * cap : 1024;
    while (new_cap < need) new_cap *= 2;
    std::unique_ptr<int[]> bigger(new int[new_cap]);
    if (n) std::memcpy(bigger.get(), data.get(), n * sizeof(int));
    data = std::move(bigger);
    cap = new_cap;
}

Status chunked_encoder::encode_uncached(std::string_view chunk, int32_t one_cp, bool cacheable,
                                        uint64_t hash, id_buffer *out)
{
    thread_local std::vector<int> chunk_ids;
    const Status st = pieces_only_.Encode(chunk, &chunk_ids);
    if (!st.ok()) return st;
    if (cacheable) cache_.insert(chunk, hash, chunk_ids.data(), chunk_ids.size(), one_cp);
    int *to = out->room(chunk_ids.size());
    if (!chunk_ids.empty()) std::memcpy(to, chunk_ids.data(), chunk_ids.size() * sizeof *to);
    out->n += chunk_ids.size();
    return Status();
}

bool chunked_encoder::append_chunk(std::string_view chunk, int32_t one_cp, id_buffer *out,
                                   lookup_tally *tally, Status *error)
{
    const size_t first = out->n;
    tally->lookups++;
    const int *cached = nullptr;
    uint32_t n_cached = 0;
    uint64_t hash = 0;
    const bool direct = one_cp >= 0 && cache_.has_direct() &&
                        static_cast<char32_t>(one_cp) < chunk_cache::k_direct_limit;
    const bool cacheable = direct || chunk.size() <= chunk_cache::k_longest_chunk;
    if (direct) {
        cached = cache_.find_one(static_cast<char32_t>(one_cp), &n_cached);
    } else if (cacheable) {
        hash = chunk_hash(chunk.data(), chunk.size());
        cached = cache_.find(chunk, hash, &n_cached);
    } else {
        tally->lookups--;  // too long to be cached: not a lookup
    }
    if (cached) {
        tally->hits++;
        int *to = out->room(n_cached);
        for (uint32_t k = 0; k < n_cached; k++) to[k] = cached[k];
        out->n += n_cached;
    } else {
        *error = encode_uncached(chunk, direct ? one_cp : -1, cacheable, hash, out);
        if (!error->ok()) return false;
    }
    // Without byte fallback SentencePiece turns a run of unknown pieces into one <unk>; a run
    // may continue across the cut.
    int *ids = out->data.get();
    if (!spec_.byte_fallback && first > 0 && out->n > first && ids[first - 1] == unk_id_ &&
        ids[first] == unk_id_) {
        std::memmove(ids + first, ids + first + 1, (out->n - first - 1) * sizeof *ids);
        out->n--;
    }
    return true;
}

Status chunked_encoder::encode(std::string_view text, id_buffer *out_buffer)
{
    thread_local std::string normalized;
    const std::string_view s = normalize(text, &normalized);
    id_buffer &out = *out_buffer;
    lookup_tally tally;
    Status error;
    size_t start = 0, len = 0, chars = 0;
    char32_t left = 0, first_cp = 0;
    // A cached chunk of one code point is handled here, without a call: that is most chunks of
    // CJK text. The <unk> run rule of append_chunk only matters without byte fallback.
    const bool direct = cache_.has_direct() && spec_.byte_fallback;
    for (size_t i = 0; i < s.size(); i += len) {
        const char32_t right = decode_utf8(s, i, &len);
        if (i > 0 && is_cut_point(left, right)) {
            uint32_t n_cached;
            const int *cached;
            if (chars == 1 && direct && first_cp < chunk_cache::k_direct_limit &&
                (cached = cache_.find_one(first_cp, &n_cached)) != nullptr) {
                int *to = out.room(n_cached);
                for (uint32_t k = 0; k < n_cached; k++) to[k] = cached[k];
                out.n += n_cached;
                tally.lookups++;
                tally.hits++;
            } else {
                const int32_t one = chars == 1 ? static_cast<int32_t>(first_cp) : -1;
                if (!append_chunk(s.substr(start, i - start), one, &out, &tally, &error)) return error;
            }
            start = i;
            chars = 0;
        }
        if (chars++ == 0) first_cp = right;
        left = right;
    }
    if (start < s.size()) {
        const int32_t one = chars == 1 ? static_cast<int32_t>(first_cp) : -1;
        if (!append_chunk(s.substr(start), one, &out, &tally, &error)) return error;
    }
    cache_.count(tally.lookups, tally.hits);
    return error;
}

bool chunked_encoder::matches(const sentencepiece::SentencePieceProcessor &whole,
                              std::string *why_not) const
{
    if (n_pieces_ == whole.GetPieceSize() && unk_id_ == whole.unk_id()) return true;
    *why_not = "reading the file found " + std::to_string(n_pieces_) + " pieces and <unk> id " +
               std::to_string(unk_id_) + ", libsentencepiece " + std::to_string(whole.GetPieceSize()) +
               " and " + std::to_string(whole.unk_id());
    return false;
}

bool chunked_encoder::agrees_with(const sentencepiece::SentencePieceProcessor &whole,
                                  std::string *text)
{
    std::vector<int> want;
    id_buffer got;
    for (const char *awkward : k_awkward_texts) {
        got.n = 0;
        if (whole.Encode(awkward, &want).ok() && encode(awkward, &got).ok() &&
            std::vector<int>(got.data.get(), got.data.get() + got.n) == want)
            continue;
        // For a one-line message: control characters as \xHH.
        text->clear();
        for (const char *c = awkward; *c; c++) {
            char escaped[8];
            if (static_cast<unsigned char>(*c) < 0x20)
                std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned char>(*c));
            else
                std::snprintf(escaped, sizeof escaped, "%c", *c);
            *text += escaped;
        }
        return false;
    }
    return true;
}
