// Exact encoding of a text as independently encoded chunks, each looked up in a cache first.
//
// Most of the time libsentencepiece spends on a text goes to BPE merges of words it has seen
// thousands of times. For the models where it is provably exact, this encoder
//   1. normalizes the text itself (only done for models whose normalizer has no rewriting rules,
//      so normalizing is: U+2581 for spaces, dummy prefix, optional whitespace trimming);
//   2. cuts the normalized text between every two adjacent characters a, b that occur next to each
//      other in no vocabulary piece ("cut points");
//   3. encodes each chunk on its own, through a copy of the model whose normalizer does nothing,
//      and caches its ids.
//
// Why the ids equal libsentencepiece's for the whole text, for a BPE model:
//   - BPE starts from one symbol per character (or per user-defined piece, matched longest first)
//     and only ever merges two neighbours into a symbol that is a vocabulary piece. A symbol
//     spanning a cut point would be a piece containing "ab": none exists, so no symbol ever spans
//     one, and the merges on each side never see the other side.
//   - The next merge is the best-scoring pair, ties broken by position; each piece has one fixed
//     score, so within a chunk the order of merges is the same whether other chunks are there or
//     not. (Unigram models are different: their Viterbi search adds scores along the whole text in
//     float32, and rounding then decides near-ties differently on a split text; not chunked.)
//   - Unknown pieces: with byte_fallback each becomes its UTF-8 bytes, piece by piece. Without it,
//     SentencePiece merges a run of consecutive unknown pieces into one <unk>; the encoder does the
//     same where two chunks meet.
//   - Models with UNUSED pieces are not chunked: BPE re-splits those with a map that is shared by
//     the whole text. Neither are models with a space in a piece (the normalizer treats such
//     user-defined pieces as units when it removes extra whitespace).
// Tests: tests/tokenizer/test_spm_chunked.c compares against spm_encode and the Python binding.
#ifndef ZT_SPM_CHUNKED_ENCODER_H
#define ZT_SPM_CHUNKED_ENCODER_H

#include <sentencepiece_processor.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chunk_cache.h"
#include "model_file.h"

// A thread's buffer of ids: grown by doubling and never zero-filled (std::vector::resize would
// write every int before the encoder does).
struct id_buffer {
    std::unique_ptr<int[]> data;
    size_t cap = 0;
    size_t n = 0;  // ids written
    int *room(size_t more)
    {
        if (n + more > cap) grow(n + more);
        return data.get() + n;
    }
    void grow(size_t need);
};

class chunked_encoder {
public:
    // The chunked encoder of the model in `file`, with a cache of at most cache_bytes; or nullptr
    // and *why_not completing "encoding in chunks would not be exact: ..." (or an error loading
    // the normalizer-free copy of the model). It reads the pieces from the file itself, so it can
    // be made while libsentencepiece loads the model for whole-text encoding.
    static std::unique_ptr<chunked_encoder> create(const spm_model_file &file, size_t cache_bytes,
                                                   std::string *why_not);

    // The whole-text model has the pieces and <unk> id this encoder read from the file (else
    // *why_not says what differs).
    bool matches(const sentencepiece::SentencePieceProcessor &whole, std::string *why_not) const;

    // Encode valid UTF-8 text, appending its ids to *out. Thread-safe.
    sentencepiece::util::Status encode(std::string_view text, id_buffer *out);

    // Encode a set of awkward built-in texts both ways: false (and *text set to the first one that
    // differs, control characters escaped) means this libsentencepiece does not behave as the
    // reasoning above assumes.
    bool agrees_with(const sentencepiece::SentencePieceProcessor &whole, std::string *text);

    chunk_cache::stats cache_totals() { return cache_.totals(); }

private:
    chunked_encoder(const spm_encode_spec &spec, size_t cache_bytes);

    struct lookup_tally {
        uint64_t lookups = 0, hits = 0;
    };
    std::string_view normalize(std::string_view text, std::string *buf) const;
    __attribute__((always_inline)) bool is_cut_point(char32_t left, char32_t right) const;
    // Append the ids of one chunk; one_cp is its code point when it is a single one, else -1.
    // False with *error set when libsentencepiece fails (no Status is made on the hot path).
    bool append_chunk(std::string_view chunk, int32_t one_cp, id_buffer *out, lookup_tally *tally,
                      sentencepiece::util::Status *error);
    sentencepiece::util::Status encode_uncached(std::string_view chunk, int32_t one_cp,
                                                bool cacheable, uint64_t hash, id_buffer *out);

    spm_encode_spec spec_;
    int unk_id_ = -1;
    int n_pieces_ = 0;
    sentencepiece::SentencePieceProcessor pieces_only_;  // the model with a do-nothing normalizer
    // The adjacent character pairs of all pieces BPE can form, as pair_key()s in an open-addressing
    // table (0 = empty) of pair_slots_.size() = a power of two slots.
    std::vector<uint64_t> pair_slots_;
    // For code points below chunk_cache::k_direct_limit: k_left when the character is followed by
    // another one in some piece, k_right when it follows another one. Most CJK characters have
    // neither, so most cut points are found without probing pair_slots_.
    static constexpr uint8_t k_left = 1, k_right = 2;
    std::vector<uint8_t> neighbours_;
    chunk_cache cache_;
};

#endif
