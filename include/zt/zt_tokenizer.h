/* zt plugin ABI v1: tokenizer plugins (kind ZT_KIND_TOKENIZER), e.g. sentencepiece.
 *
 * A tokenizer plugin opens any number of models; zt-prep opens one and encodes from many threads at
 * once (whether or not the plugin declares ZT_CAP_CONCURRENT). Every op is required: zt-prep and
 * zt-run --generate call them without NULL checks. Tags: zt_plugin.h.
 */
#ifndef ZT_TOKENIZER_H
#define ZT_TOKENIZER_H

#include "zt_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Facts about an opened tokenizer model. An id that the model does not have is -1 (T5 has no BOS). */
typedef struct zt_tokenizer_info {
    uint32_t struct_size;
    int32_t vocab_size;
    int32_t bos_id;
    int32_t eos_id;
    int32_t pad_id;
    int32_t unk_id;
    uint64_t model_hash;    /* FNV-1a 64 of the model file's bytes: stable across runs and machines */
    char model_type[16];    /* "bpe", "unigram", "word", "char" */
} zt_tokenizer_info;

/* Opaque handle to one opened model. */
typedef struct zt_tokenizer_model zt_tokenizer_model;

typedef struct zt_tokenizer_ops {
    uint32_t struct_size;
    uint32_t reserved0;

    /* Open the model file at `path` (plugin state from init as `state`; path borrowed). On success
     * *out is a new handle, owned by the plugin, that the caller closes with close(). [any thread]
     * (zt's callers open on the main thread). */
    zt_status (*open)(void *state, const char *path, zt_tokenizer_model **out);
    /* Free the handle; NULL is a no-op. [any thread], after every other call on m returned. */
    void (*close)(zt_tokenizer_model *m);

    /* Fill *out (caller-owned; set out->struct_size first). [any thread] */
    zt_status (*info)(zt_tokenizer_model *m, zt_tokenizer_info *out);

    /* Encode `len` bytes of UTF-8 text (not NUL-terminated) into ids, without adding BOS or EOS.
     * Writes min(needed, cap) ids and sets *n_out to the number needed; returns
     * ZT_ERR_BUFFER_TOO_SMALL when needed > cap. Invalid UTF-8 is ZT_ERR_INVALID_ARG. text and ids
     * are the caller's. [any thread], concurrently on the same model (zt-prep's workers do). */
    zt_status (*encode)(zt_tokenizer_model *m, const char *text, uint64_t len, int32_t *ids,
                        uint64_t cap, uint64_t *n_out);

    /* Decode ids to UTF-8 text. Writes min(needed, cap) bytes, NUL-terminated when room allows,
     * and sets *len_out to the bytes needed (without the NUL); ZT_ERR_BUFFER_TOO_SMALL when the text
     * and its NUL do not fit. [any thread], concurrently on the same model. */
    zt_status (*decode)(zt_tokenizer_model *m, const int32_t *ids, uint64_t n, char *text,
                        uint64_t cap, uint64_t *len_out);

    /* The piece string of one id (e.g. "\xe2\x96\x81the", "<0x0A>"), same buffer rules as decode.
     * [any thread], concurrently on the same model. */
    zt_status (*id_to_piece)(zt_tokenizer_model *m, int32_t id, char *buf, uint64_t cap,
                             uint64_t *len_out);
} zt_tokenizer_ops;

#ifdef __cplusplus
}
#endif

#endif /* ZT_TOKENIZER_H */
