/* The tokenizer files of a Hugging Face model directory, so transformers' AutoTokenizer loads an
 * export (docs/export.md): either the files of the model directory a run fine-tuned (copied as they
 * are), or a SentencePiece model (tokenizer.model) with the tokenizer_config.json and
 * special_tokens_map.json that name its special tokens for LlamaTokenizer.
 */
#ifndef ZT_FRAMEWORK_HF_TOKENIZER_H
#define ZT_FRAMEWORK_HF_TOKENIZER_H

#include <stdint.h>
#include "base/error.h"

/* The files transformers reads for a tokenizer, in the order they are copied; NULL-terminated. */
extern const char *const zt_hf_tokenizer_files[];

/* 1 when dir has a tokenizer of its own: tokenizer.model or tokenizer.json. */
int zt_hf_dir_has_tokenizer(const char *dir);

/* Copy every file of zt_hf_tokenizer_files that src_dir has into dst_dir (atomically each).
 * *n_copied: how many. */
zt_status zt_hf_tokenizer_copy(const char *src_dir, const char *dst_dir, int *n_copied, zt_error *err);

/* What a SentencePiece model is shipped with. Ids are -1 when the tokenizer has no such token. */
typedef struct zt_hf_spm_tokenizer {
    const char *path;          /* the SentencePiece model file */
    uint64_t expected_hash;    /* its FNV-1a 64 (the data set's tokenizer.hash); 0: not checked */
    int64_t bos_id, eos_id, unk_id, pad_id;
    int64_t model_max_length;  /* the model's max_position_embeddings */
} zt_hf_spm_tokenizer;

/* Check that t->path is a SentencePiece model with those ids (and the expected hash), before a run
 * trains: the pieces of the special ids are read from it. */
zt_status zt_hf_spm_check(const zt_hf_spm_tokenizer *t, zt_error *err);

/* Copy t->path to dir/tokenizer.model (checking the hash of what was copied) and write
 * dir/tokenizer_config.json (LlamaTokenizer, the special tokens, add_bos_token when there is a BOS)
 * and dir/special_tokens_map.json. */
zt_status zt_hf_spm_write(const zt_hf_spm_tokenizer *t, const char *dir, zt_error *err);

/* The piece of `id` in the SentencePiece model file at path (malloc'd), for messages and tests. */
zt_status zt_hf_spm_piece(const char *path, int64_t id, char **piece, zt_error *err);

#endif
