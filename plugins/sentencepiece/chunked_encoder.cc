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

// The code point starting at s[i] of valid UTF-8, and its length in *len.
char32_t decode_utf8(std::string_view s, size_t i, size_t *len)
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

std::unique_ptr<chunked_encoder> chunked_encoder::create(
    const spm_model_file &file, const sentencepiece::SentencePieceProcessor &whole,
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
    encoder->unk_id_ = whole.unk_id();
    std::vector<uint64_t> pairs;
    for (int id = 0; id < whole.GetPieceSize(); id++) {
        // BPE never forms control, unknown or byte pieces from text: they cannot span a cut.
        if (whole.IsControl(id) || whole.IsUnknown(id) || whole.IsByte(id)) continue;
        const std::string &piece = whole.IdToPiece(id);
        if (whole.IsUnused(id)) {
            *why_not = "its piece " + std::to_string(id) + " ('" + piece +
                       "') is UNUSED, and BPE re-splits such pieces with a map shared by the "
                       "whole text";
            return nullptr;
        }
        if (piece.find(' ') != std::string::npos) {
            *why_not = "its piece " + std::to_string(id) + " ('" + piece + "') contains a space";
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
            if (i > 0) pairs.push_back(pair_key(left, right));
            left = right;
        }
    }
    std::sort(pairs.begin(), pairs.end());
    pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
    size_t n_slots = 16;
    while (n_slots < 2 * pairs.size()) n_slots *= 2;
    encoder->pair_slots_.assign(n_slots, 0);
    for (uint64_t key : pairs) {
        size_t i = pair_slot(key, n_slots);
        while (encoder->pair_slots_[i] != 0) i = (i + 1) & (n_slots - 1);
        encoder->pair_slots_[i] = key;
    }

    size_t size = 0;
    unsigned char *copy = spm_model_file_without_normalizer(&file, &size);
    if (!copy) throw std::bad_alloc();
    const Status loaded = encoder->pieces_only_.LoadFromSerializedProto(
        std::string_view(reinterpret_cast<const char *>(copy), size));
    std::free(copy);
    if (!loaded.ok()) {
        *why_not = "SentencePiece rejected the model with its normalizer removed: " +
                   loaded.ToString();
        return nullptr;
    }
    return encoder;
}

bool chunked_encoder::is_cut_point(char32_t left, char32_t right) const
{
    const uint64_t key = pair_key(left, right);
    const size_t mask = pair_slots_.size() - 1;
    for (size_t i = pair_slot(key, pair_slots_.size());; i = (i + 1) & mask) {
        if (pair_slots_[i] == key) return false;
        if (pair_slots_[i] == 0) return true;
    }
}

// What SentencePiece's normalizer does when it has no rewriting rules (normalizer.cc): optionally
// drop leading, trailing and repeated spaces, write each space as U+2581, and add one U+2581 in
// front (or at the end, with treat_whitespace_as_suffix) of a text that is not empty.
void chunked_encoder::normalize(std::string_view text, std::string *out) const
{
    out->clear();
    const bool trim = spec_.remove_extra_whitespaces;
    if (trim) text.remove_prefix(std::min(text.size(), text.find_first_not_of(' ')));
    if (text.empty()) return;
    const bool dummy_in_front = spec_.add_dummy_prefix && !spec_.treat_whitespace_as_suffix;
    if (dummy_in_front) out->append(k_visible_space, k_visible_space_len);
    size_t pos = 0;
    while (pos < text.size()) {
        const size_t space = std::min(text.size(), text.find(' ', pos));
        out->append(text.data() + pos, space - pos);
        if (space == text.size()) break;
        const size_t run_end = std::min(text.size(), text.find_first_not_of(' ', space));
        for (size_t n = trim ? 1 : run_end - space; n > 0; n--)
            out->append(k_visible_space, k_visible_space_len);
        pos = run_end;
    }
    if (trim) {  // every trailing U+2581 goes, also one the text itself contained
        while (out->size() >= k_visible_space_len &&
               out->compare(out->size() - k_visible_space_len, k_visible_space_len,
                            k_visible_space) == 0)
            out->resize(out->size() - k_visible_space_len);
    }
    if (spec_.add_dummy_prefix && spec_.treat_whitespace_as_suffix)
        out->append(k_visible_space, k_visible_space_len);
}

Status chunked_encoder::append_chunk(std::string_view chunk, std::vector<int> *ids,
                                     lookup_tally *tally)
{
    const size_t first = ids->size();
    const bool cacheable = chunk.size() <= chunk_cache::k_longest_chunk;
    const uint64_t hash = cacheable ? spm_fnv1a64(chunk.data(), chunk.size()) : 0;
    tally->lookups += cacheable;
    if (cacheable && cache_.find(chunk, hash, ids)) {
        tally->hits++;
    } else {
        thread_local std::vector<int> chunk_ids;
        const Status st = pieces_only_.Encode(chunk, &chunk_ids);
        if (!st.ok()) return st;
        if (cacheable) cache_.insert(chunk, hash, chunk_ids.data(), chunk_ids.size());
        ids->insert(ids->end(), chunk_ids.begin(), chunk_ids.end());
    }
    // Without byte fallback SentencePiece turns a run of unknown pieces into one <unk>; a run
    // may continue across the cut.
    if (!spec_.byte_fallback && first > 0 && ids->size() > first &&
        (*ids)[first - 1] == unk_id_ && (*ids)[first] == unk_id_)
        ids->erase(ids->begin() + static_cast<std::ptrdiff_t>(first));
    return Status();
}

Status chunked_encoder::encode(std::string_view text, std::vector<int> *ids)
{
    thread_local std::string normalized;
    normalize(text, &normalized);
    const std::string_view s = normalized;
    lookup_tally tally;
    Status st;
    size_t start = 0, len = 0;
    char32_t left = 0;
    for (size_t i = 0; i < s.size() && st.ok(); i += len) {
        const char32_t right = decode_utf8(s, i, &len);
        if (i > 0 && is_cut_point(left, right)) {
            st = append_chunk(s.substr(start, i - start), ids, &tally);
            start = i;
        }
        left = right;
    }
    if (st.ok() && start < s.size()) st = append_chunk(s.substr(start), ids, &tally);
    cache_.count(tally.lookups, tally.hits);
    return st;
}

bool chunked_encoder::agrees_with(const sentencepiece::SentencePieceProcessor &whole,
                                  std::string *text)
{
    std::vector<int> want, got;
    for (const char *awkward : k_awkward_texts) {
        got.clear();
        if (whole.Encode(awkward, &want).ok() && encode(awkward, &got).ok() && want == got) continue;
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
