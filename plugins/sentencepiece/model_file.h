/* Reading a SentencePiece .model file before handing it to the library.
 *
 * The plugin reads the bytes itself (once) so that the hash describes exactly what was loaded, and
 * walks the top level of the ModelProto protobuf so that a truncated or foreign file gets a message
 * with a byte offset; libsentencepiece only says "ParseFromArray failed", and a file cut exactly
 * between two vocabulary entries would even load, silently losing its normalizer and trainer spec. */
#ifndef ZT_SPM_MODEL_FILE_H
#define ZT_SPM_MODEL_FILE_H

#include <stddef.h>
#include <stdint.h>
#include "zt/zt_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The encode-time settings of normalizer_spec and trainer_spec, with the .proto defaults for fields
 * the file leaves out. They decide whether chunked encoding (chunked_encoder.h) is exact. */
typedef struct spm_encode_spec {
    char normalizer_name[32];       /* normalizer_spec.name, e.g. "identity", "nmt_nfkc" ("" if absent) */
    size_t charsmap_size;           /* bytes of precompiled_charsmap; 0: no rewriting rules at all */
    int add_dummy_prefix;           /* default 1 */
    int remove_extra_whitespaces;   /* default 1 */
    int escape_whitespaces;         /* default 1 */
    int treat_whitespace_as_suffix; /* trainer_spec, default 0 */
    int byte_fallback;              /* trainer_spec, default 0 */
} spm_encode_spec;

typedef struct spm_model_file {
    unsigned char *bytes;  /* the whole file (malloc) */
    size_t size;
    uint64_t hash;         /* FNV-1a 64 of bytes[0, size) */
    int32_t n_pieces;      /* vocabulary entries found by the scan */
    char model_type[16];   /* "unigram", "bpe", "word" or "char", from trainer_spec.model_type */
    spm_encode_spec spec;
} spm_model_file;

/* Read, hash and scan `path`. On failure returns ZT_ERR_IO (cannot open or read it, including a
 * missing file), ZT_ERR_OUT_OF_MEMORY or ZT_ERR_FORMAT (not a model, truncated) and writes a phrase
 * saying what is wrong with the file into why[0, why_cap) ("it is truncated: ..."); *out is then
 * empty. */
zt_status spm_model_file_read(const char *path, spm_model_file *out, char *why, size_t why_cap);
void spm_model_file_free(spm_model_file *f);

/* The same model with a normalizer that changes nothing: no rewriting rules, no dummy prefix, no
 * whitespace removal, and without self_test_data (whose expectations assume the real normalizer).
 * The chunked encoder normalizes text itself and hands this model pieces of the normalized text.
 * Returns a malloc'ed serialized ModelProto in *out (*out_size bytes), or NULL when out of memory. */
unsigned char *spm_model_file_without_normalizer(const spm_model_file *f, size_t *out_size);

/* The vocabulary pieces in id order, read from the file (a scanned one) without libsentencepiece:
 * start with *pos = 0; each call sets *piece, *len and *type (sentencepiece_model.proto's
 * SentencePiece.Type: 1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE; NORMAL when
 * absent) and returns 1, or returns 0 after the last piece. */
enum {
    SPM_PIECE_NORMAL = 1,
    SPM_PIECE_UNKNOWN = 2,
    SPM_PIECE_CONTROL = 3,
    SPM_PIECE_USER_DEFINED = 4,
    SPM_PIECE_UNUSED = 5,
    SPM_PIECE_BYTE = 6
};
int spm_model_file_next_piece(const spm_model_file *f, size_t *pos, const char **piece, size_t *len,
                              int *type);

/* FNV-1a 64, the checksum zt uses everywhere (framework/base/checksum.c); a plugin links nothing from
 * the host, so it carries its own copy of these few lines. */
uint64_t spm_fnv1a64(const void *data, size_t n);

#ifdef __cplusplus
}
#endif

#endif
