// The tokenizer ops over libsentencepiece. A thin shim: check the arguments and the UTF-8, call
// SentencePieceProcessor, copy results out by the buffer rules of zt_tokenizer.h, and turn every
// failure (including C++ exceptions, which must not cross the C ABI) into a status + host->error().
#include "spm_ops.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "chunked_encoder.h"
#include "model_file.h"
#include "utf8.h"

static_assert(sizeof(int) == sizeof(int32_t), "ids are copied between int and int32_t buffers");

struct zt_tokenizer_model {
    const zt_host *host = nullptr;
    std::string path;  // for messages
    sentencepiece::SentencePieceProcessor processor;
    std::unique_ptr<chunked_encoder> chunked;  // null: texts are encoded whole by `processor`
    zt_tokenizer_info info{};  // computed once at open
};

namespace {

const char k_load_fix[] = "pass a SentencePiece .model file (zt-prep -t)";

// Run `body`, turning any exception into a status with a message. `doing` completes "while ...".
template <typename Body>
zt_status guarded(const zt_host *host, const char *doing, Body body)
{
    try {
        return body();
    } catch (const std::bad_alloc &) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "out of memory while %s", doing);
        return ZT_ERR_OUT_OF_MEMORY;
    } catch (const std::exception &e) {
        host->error(host->ctx, ZT_ERR_INTERNAL,
                    "unexpected error while %s: %s; please report this as a zt bug", doing, e.what());
        return ZT_ERR_INTERNAL;
    } catch (...) {
        host->error(host->ctx, ZT_ERR_INTERNAL,
                    "unexpected non-standard exception while %s; please report this as a zt bug",
                    doing);
        return ZT_ERR_INTERNAL;
    }
}

// Frees the file bytes however open() leaves.
struct model_file_guard {
    spm_model_file file{};
    ~model_file_guard() { spm_model_file_free(&file); }
};

// The buffer rule shared by decode and id_to_piece: write min(needed, cap) bytes, a NUL after them
// when it fits, report the bytes needed, and fail when the text and its NUL do not both fit.
zt_status copy_text_out(const zt_tokenizer_model *m, std::string_view text, char *buf, uint64_t cap,
                        uint64_t *len_out, const char *what)
{
    const uint64_t needed = text.size();
    const size_t n_copy = static_cast<size_t>(std::min(needed, cap));
    if (n_copy) std::memcpy(buf, text.data(), n_copy);  // buf may be NULL when cap is 0
    if (cap > needed) buf[needed] = '\0';
    *len_out = needed;
    if (cap > needed) return ZT_OK;
    m->host->error(m->host->ctx, ZT_ERR_BUFFER_TOO_SMALL,
                   "%s needs %llu bytes plus a terminating NUL but the buffer holds %llu; call again "
                   "with cap >= %llu",
                   what, static_cast<unsigned long long>(needed), static_cast<unsigned long long>(cap),
                   static_cast<unsigned long long>(needed + 1));
    return ZT_ERR_BUFFER_TOO_SMALL;
}

// Encode in chunks when that gives exactly the ids of whole-text encoding (chunked_encoder.h), and
// say in the log which way this model is encoded.
void choose_encoding(zt_tokenizer_model *m, std::unique_ptr<chunked_encoder> chunked,
                     std::string why_not, uint64_t cache_bytes)
{
    const zt_host *host = m->host;
    const char *path = m->path.c_str();
    if (cache_bytes == 0) {
        host->log(host->ctx, ZT_LOG_INFO, "'%s': encoding every text whole (%s is 0)", path,
                  SPM_CHUNK_CACHE_KEY);
        return;
    }
    std::string differing;
    if (chunked && !chunked->matches(m->processor, &why_not)) chunked.reset();
    m->chunked = std::move(chunked);
    if (!m->chunked) {
        host->log(host->ctx, ZT_LOG_INFO,
                  "'%s': encoding every text whole; encoding in chunks would not be exact: %s",
                  path, why_not.c_str());
    } else if (!m->chunked->agrees_with(m->processor, &differing)) {
        m->chunked.reset();
        host->log(host->ctx, ZT_LOG_WARN,
                  "'%s': encoding every text whole: encoding in chunks gave other ids than "
                  "libsentencepiece for the built-in test text \"%s\"; this libsentencepiece does "
                  "not behave as zt expects, please report it with its version",
                  path, differing.c_str());
    } else {
        const int shift = cache_bytes >= (1u << 20) ? 20 : cache_bytes >= (1u << 10) ? 10 : 0;
        host->log(host->ctx, ZT_LOG_INFO,
                  "'%s': encoding in chunks cut where no piece can span, with a cache of up to "
                  "%llu %s (a BPE model without normalization rules: the ids are those of "
                  "whole-text encoding)",
                  path, static_cast<unsigned long long>(cache_bytes >> shift),
                  shift == 20 ? "MiB" : shift == 10 ? "KiB" : "bytes");
    }
}

// SentencePiece does not range-check ids: an out-of-range id would read past its vocabulary.
bool id_in_vocab(const zt_tokenizer_model *m, int32_t id)
{
    return id >= 0 && id < m->info.vocab_size;
}

}  // namespace

zt_status spm_open(void *state, const char *path, zt_tokenizer_model **out)
{
    const auto *plugin = static_cast<const spm_plugin_state *>(state);
    if (!plugin) return ZT_ERR_INVALID_ARG;  // no host to report through: init was not called
    const zt_host *host = plugin->host;
    return guarded(host, "opening a tokenizer model", [&]() -> zt_status {
        if (!path || !out) {
            host->error(host->ctx, ZT_ERR_INVALID_ARG,
                        "tokenizer open() called with a NULL path or out pointer: a bug in the "
                        "caller");
            return ZT_ERR_INVALID_ARG;
        }
        *out = nullptr;
        model_file_guard guard;
        char why[1024];
        zt_status st = spm_model_file_read(path, &guard.file, why, sizeof why);
        if (st != ZT_OK) {
            host->error(host->ctx, st, "cannot load tokenizer model '%s': %s; %s", path, why,
                        k_load_fix);
            return st;
        }
        auto m = std::make_unique<zt_tokenizer_model>();
        m->host = host;
        m->path = path;
        const spm_model_file &file = guard.file;
        // The chunked encoder (whose second copy of the model is a third of open()'s time) is
        // made on a thread of its own while libsentencepiece loads the model here.
        std::unique_ptr<chunked_encoder> chunked;
        std::string why_not;
        std::exception_ptr chunk_failure;  // rethrown here: exceptions must not leave the thread
        const auto make_chunked = [&]() {
            try {
                chunked = chunked_encoder::create(file, plugin->chunk_cache_bytes, &why_not);
            } catch (...) {
                chunk_failure = std::current_exception();
            }
        };
        std::thread maker;
        struct joiner {  // joined on every way out, exceptions included
            std::thread *t;
            ~joiner()
            {
                if (t->joinable()) t->join();
            }
        } join_maker{&maker};
        if (plugin->chunk_cache_bytes) {
            try {
                maker = std::thread(make_chunked);
            } catch (const std::system_error &) {
                make_chunked();  // no thread to be had: the same, one after the other
            }
        }
        sentencepiece::util::Status loaded = m->processor.LoadFromSerializedProto(
            std::string_view(reinterpret_cast<const char *>(file.bytes), file.size));
        if (maker.joinable()) maker.join();
        if (chunk_failure) std::rethrow_exception(chunk_failure);
        if (!loaded.ok()) {
            host->error(host->ctx, ZT_ERR_FORMAT,
                        "cannot load tokenizer model '%s': SentencePiece rejected it: %s; %s", path,
                        loaded.ToString().c_str(), k_load_fix);
            return ZT_ERR_FORMAT;
        }
        zt_tokenizer_info &info = m->info;
        info.struct_size = sizeof info;
        info.vocab_size = m->processor.GetPieceSize();
        info.bos_id = m->processor.bos_id();
        info.eos_id = m->processor.eos_id();
        info.pad_id = m->processor.pad_id();
        info.unk_id = m->processor.unk_id();
        info.model_hash = file.hash;
        std::snprintf(info.model_type, sizeof info.model_type, "%s", file.model_type);
        host->log(host->ctx, ZT_LOG_DEBUG, "opened '%s': %s, %d pieces, FNV-1a %016llx", path,
                  info.model_type, info.vocab_size, static_cast<unsigned long long>(info.model_hash));
        choose_encoding(m.get(), std::move(chunked), std::move(why_not), plugin->chunk_cache_bytes);
        *out = m.release();
        return ZT_OK;
    });
}

void spm_close(zt_tokenizer_model *m)
{
    if (m && m->chunked) {
        const chunk_cache::stats c = m->chunked->cache_totals();
        if (c.lookups > 0)
            m->host->log(m->host->ctx, ZT_LOG_INFO,
                         "'%s': chunk cache: %llu lookups, %llu hits (%.1f%%); %llu chunks cached "
                         "(%.1f MiB of entries); %llu not cached (cache full)",
                         m->path.c_str(), static_cast<unsigned long long>(c.lookups),
                         static_cast<unsigned long long>(c.hits),
                         100.0 * static_cast<double>(c.hits) / static_cast<double>(c.lookups),
                         static_cast<unsigned long long>(c.entries),
                         static_cast<double>(c.entry_bytes) / (1 << 20),
                         static_cast<unsigned long long>(c.not_cached));
    }
    delete m;
}

zt_status spm_info(zt_tokenizer_model *m, zt_tokenizer_info *out)
{
    if (!m) return ZT_ERR_INVALID_ARG;
    const zt_host *host = m->host;
    if (!out) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG,
                    "tokenizer info() called with a NULL out pointer (a bug in the caller)");
        return ZT_ERR_INVALID_ARG;
    }
    if (out->struct_size < sizeof(zt_tokenizer_info)) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG,
                    "tokenizer info() needs a zt_tokenizer_info with struct_size >= %zu, got "
                    "struct_size %u (set out->struct_size = sizeof(zt_tokenizer_info) before the call)",
                    sizeof(zt_tokenizer_info), out->struct_size);
        return ZT_ERR_INVALID_ARG;
    }
    // The caller's struct_size stays; fields a later ABI minor appends are not ours to touch.
    const uint32_t caller_size = out->struct_size;
    *out = m->info;
    out->struct_size = caller_size;
    return ZT_OK;
}

zt_status spm_encode(zt_tokenizer_model *m, const char *text, uint64_t len, int32_t *ids,
                     uint64_t cap, uint64_t *n_out)
{
    if (!m) return ZT_ERR_INVALID_ARG;
    const zt_host *host = m->host;
    return guarded(host, "encoding text", [&]() -> zt_status {
        if ((!text && len) || (!ids && cap) || !n_out) {
            host->error(host->ctx, ZT_ERR_INVALID_ARG,
                        "tokenizer encode() called with a NULL text, ids or n_out (text may be NULL "
                        "only when len is 0, ids only when cap is 0): a bug in the caller");
            return ZT_ERR_INVALID_ARG;
        }
        size_t bad_offset = 0;
        const char *why = nullptr;
        if (!spm_utf8_valid(text, len, &bad_offset, &why)) {
            host->error(host->ctx, ZT_ERR_INVALID_ARG,
                        "cannot encode text: invalid UTF-8 at byte offset %zu of %llu (byte 0x%02x): "
                        "%s; convert the input to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)",
                        bad_offset, static_cast<unsigned long long>(len),
                        static_cast<unsigned char>(text[bad_offset]), why);
            return ZT_ERR_INVALID_ARG;
        }
        // Encode is const and thread-safe; one buffer per thread keeps the hot path free of
        // allocations once it has grown to the longest text seen.
        thread_local std::vector<int> encoded_whole;
        thread_local id_buffer encoded_chunks;
        const std::string_view whole(text, static_cast<size_t>(len));
        encoded_chunks.n = 0;
        sentencepiece::util::Status st = m->chunked ? m->chunked->encode(whole, &encoded_chunks)
                                                    : m->processor.Encode(whole, &encoded_whole);
        const int *encoded = m->chunked ? encoded_chunks.data.get() : encoded_whole.data();
        const size_t n_encoded = m->chunked ? encoded_chunks.n : encoded_whole.size();
        if (!st.ok()) {
            host->error(host->ctx, ZT_ERR_INTERNAL,
                        "SentencePiece failed to encode %llu bytes with tokenizer model '%s': %s",
                        static_cast<unsigned long long>(len), m->path.c_str(), st.ToString().c_str());
            return ZT_ERR_INTERNAL;
        }
        const uint64_t needed = n_encoded;
        *n_out = needed;
        const size_t n_copy = static_cast<size_t>(std::min(needed, cap));
        if (n_copy) std::memcpy(ids, encoded, n_copy * sizeof *ids);  // ids may be NULL at cap 0
        if (needed <= cap) return ZT_OK;
        host->error(host->ctx, ZT_ERR_BUFFER_TOO_SMALL,
                    "encode needs room for %llu ids but the buffer holds %llu; call again with "
                    "cap >= %llu",
                    static_cast<unsigned long long>(needed), static_cast<unsigned long long>(cap),
                    static_cast<unsigned long long>(needed));
        return ZT_ERR_BUFFER_TOO_SMALL;
    });
}

zt_status spm_decode(zt_tokenizer_model *m, const int32_t *ids, uint64_t n, char *text,
                     uint64_t cap, uint64_t *len_out)
{
    if (!m) return ZT_ERR_INVALID_ARG;
    const zt_host *host = m->host;
    return guarded(host, "decoding ids", [&]() -> zt_status {
        if ((!ids && n) || (!text && cap) || !len_out) {
            host->error(host->ctx, ZT_ERR_INVALID_ARG,
                        "tokenizer decode() called with a NULL ids, text or len_out (ids may be NULL "
                        "only when n is 0, text only when cap is 0): a bug in the caller");
            return ZT_ERR_INVALID_ARG;
        }
        for (uint64_t i = 0; i < n; i++) {
            if (id_in_vocab(m, ids[i])) continue;
            host->error(host->ctx, ZT_ERR_INVALID_ARG,
                        "cannot decode: id %d at position %llu is outside the vocabulary of "
                        "tokenizer model '%s' (ids 0..%d); the ids were made by another tokenizer "
                        "or include padding",
                        ids[i], static_cast<unsigned long long>(i), m->path.c_str(),
                        m->info.vocab_size - 1);
            return ZT_ERR_INVALID_ARG;
        }
        thread_local std::vector<int> id_buffer;
        thread_local std::string decoded;
        id_buffer.assign(ids, ids + n);
        sentencepiece::util::Status st = m->processor.Decode(id_buffer, &decoded);
        if (!st.ok()) {
            host->error(host->ctx, ZT_ERR_INTERNAL,
                        "SentencePiece failed to decode %llu ids with tokenizer model '%s': %s",
                        static_cast<unsigned long long>(n), m->path.c_str(), st.ToString().c_str());
            return ZT_ERR_INTERNAL;
        }
        return copy_text_out(m, decoded, text, cap, len_out, "decode");
    });
}

zt_status spm_id_to_piece(zt_tokenizer_model *m, int32_t id, char *buf, uint64_t cap,
                          uint64_t *len_out)
{
    if (!m) return ZT_ERR_INVALID_ARG;
    const zt_host *host = m->host;
    return guarded(host, "looking up a piece", [&]() -> zt_status {
        if ((!buf && cap) || !len_out) {
            host->error(host->ctx, ZT_ERR_INVALID_ARG,
                        "tokenizer id_to_piece() called with a NULL buf or len_out (buf may be NULL "
                        "only when cap is 0): a bug in the caller");
            return ZT_ERR_INVALID_ARG;
        }
        if (!id_in_vocab(m, id)) {
            host->error(host->ctx, ZT_ERR_INVALID_ARG,
                        "cannot look up the piece of id %d: it is outside the vocabulary of "
                        "tokenizer model '%s' (ids 0..%d)",
                        id, m->path.c_str(), m->info.vocab_size - 1);
            return ZT_ERR_INVALID_ARG;
        }
        return copy_text_out(m, m->processor.IdToPiece(id), buf, cap, len_out, "id_to_piece");
    });
}
