/* llama2.c's file formats (github.com/karpathy/llama2.c), read so that models trained with it run in
 * zt (docs/generate.md):
 *
 *   - the tokenizer .bin that run.c reads (tokenizer.bin, tok512.bin): int32 max_token_length, then
 *     per token a float32 merge score, an int32 byte length and the piece's bytes. The file does not
 *     record how many tokens it holds: the reader is given the model's vocabulary size and requires
 *     the file to end exactly after that many tokens, which is what rejects a tokenizer of another
 *     model;
 *   - the legacy (version 0) model .bin: seven int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 *     vocab_size, negative when the classifier is not shared with the embeddings, seq_len), then
 *     every weight in fp32 (see llama2c.c for the order).
 *
 * Encoding and decoding follow run.c exactly: ids 0, 1 and 2 are <unk>, BOS and EOS; encode puts a
 * space before non-empty text (SentencePiece's dummy prefix), looks up each UTF-8 character, falls
 * back to <0xHH> byte pieces, then merges the adjacent pair whose merged piece scores best until no
 * pair merges; decode drops the leading space of the piece that follows BOS and turns <0xHH> pieces
 * into their byte.
 */
#ifndef ZT_FRAMEWORK_LLAMA2C_H
#define ZT_FRAMEWORK_LLAMA2C_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "state/hf_model.h"

#define ZT_L2C_BOS 1
#define ZT_L2C_EOS 2

/* ---- tokenizer ------------------------------------------------------------------------------- */

typedef struct zt_l2c_tokenizer zt_l2c_tokenizer;

zt_status zt_l2c_tokenizer_load(const char *path, int32_t vocab_size, zt_l2c_tokenizer **out, zt_error *err);
void zt_l2c_tokenizer_free(zt_l2c_tokenizer *t);

/* Text (UTF-8, checked) to ids, without BOS. *ids is malloc'd (NULL when *n is 0). */
zt_status zt_l2c_encode(const zt_l2c_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                        zt_error *err);
/* Ids to text; `prev` is the id before ids[0] (-1 for none), for run.c's rule about the piece after
 * BOS. *text is malloc'd and NUL-terminated; *len excludes the NUL. */
zt_status zt_l2c_decode(const zt_l2c_tokenizer *t, int32_t prev, const int32_t *ids, size_t n, char **text,
                        size_t *len, zt_error *err);

/* ---- legacy model ---------------------------------------------------------------------------- */

typedef struct zt_l2c_model zt_l2c_model;

/* Open and check a version 0 model .bin: a sane header, and a file size of exactly the weights the
 * header implies (with or without the two RoPE tables run.c no longer reads). */
zt_status zt_l2c_model_open(const char *path, zt_l2c_model **out, zt_error *err);
void zt_l2c_model_close(zt_l2c_model *m);
/* The model as a Hugging Face config: run.c's fixed rms_norm_eps 1e-5 and rope_theta 10000, BOS 1,
 * EOS 2, tied embeddings when the classifier is shared. */
const zt_hf_config *zt_l2c_model_config(const zt_l2c_model *m);
/* Elements [elem_offset, elem_offset + count) of the tensor Hugging Face names `name`, after checking
 * its shape, as zt_hf_model_read does. q_proj and k_proj come out in Hugging Face's rotate_half
 * layout: llama2.c rotates interleaved pairs (2i, 2i + 1) of each head, transformers rotates the
 * halves (i, i + D/2), so row 2i + j of a head (j = 0, 1) becomes row i + j * D/2 (the permutation
 * transformers' convert_llama_weights_to_hf.py applies to Meta's weights). */
zt_status zt_l2c_model_read(const zt_l2c_model *m, const char *name, int ndim, const int64_t *shape,
                            uint64_t elem_offset, uint64_t count, float *dst, zt_error *err);

#endif
