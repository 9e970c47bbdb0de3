/* Hugging Face LLaMA model directories: config.json plus model.safetensors (or shards with
 * model.safetensors.index.json), read for import and written for export, so transformers'
 * LlamaForCausalLM.from_pretrained() loads what zt exports.
 *
 * config.json is read strictly: a field that changes the model's math and zt does not implement is
 * refused with the reason (model_type other than llama, hidden_act other than silu, attention_bias
 * or mlp_bias true, attention_dropout above 0, rope scaling other than llama3, quantization_config,
 * an architecture other than LlamaForCausalLM). Fields that do not change the math are accepted and
 * ignored (zt_hf_informational_keys lists them); any other key is reported as a warning, since it
 * may be a newer transformers setting zt does not know.
 */
#ifndef ZT_FRAMEWORK_HF_MODEL_H
#define ZT_FRAMEWORK_HF_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "base/error.h"
#include "state/checkpoint.h"
#include "state/safetensors.h"

#define ZT_HF_MAX_EOS 8

/* The LLaMA fields of config.json. Optional fields get transformers' LlamaConfig defaults. */
typedef struct zt_hf_config {
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;     /* default: num_attention_heads */
    int64_t head_dim;                /* default: hidden_size / num_attention_heads */
    int64_t vocab_size;
    int64_t max_position_embeddings; /* default 2048 */
    double rms_norm_eps;             /* default 1e-6 */
    double rope_theta;               /* default 10000 */
    double initializer_range;        /* default 0.02 */
    /* rope_scaling {"rope_type": "llama3", ...} (Llama 3.1+); 0 for none / "default". */
    int32_t rope_llama3;
    double rope_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int64_t rope_original_max_position_embeddings;
    int32_t tie_word_embeddings;     /* default 0 */
    int64_t bos_token_id;            /* -1: none (null) */
    int64_t pad_token_id;            /* -1: none */
    int64_t eos_token_ids[ZT_HF_MAX_EOS]; /* an int or a list in config.json */
    int32_t n_eos;
    int32_t dtype;                   /* zt_st_dtype of torch_dtype / dtype; -1 when absent */
} zt_hf_config;

/* transformers' LlamaConfig defaults (a 7B shape) for every field. */
void zt_hf_config_defaults(zt_hf_config *c);
/* Parse config.json text; `origin` names it in messages (path:line:col). */
zt_status zt_hf_config_parse(const char *text, size_t len, const char *origin, zt_hf_config *out,
                             zt_error *err);
zt_status zt_hf_config_load(const char *path, zt_hf_config *out, zt_error *err);
/* Write config.json for LlamaForCausalLM atomically; torch_dtype is c->dtype (F32 when -1). */
zt_status zt_hf_config_write(const char *path, const zt_hf_config *c, zt_error *err);

/* Keys accepted and ignored because they do not change the model's math; NULL-terminated. */
extern const char *const zt_hf_informational_keys[];

/* ---- the tensors of a LLaMA model ------------------------------------------------------------ */

/* Every tensor a LLaMA model with config c has, with transformers' names and shapes: embeddings,
 * per layer the norms and projections, the final norm, and lm_head.weight unless tied. */
typedef struct zt_hf_tensor_list {
    zt_st_tensor_spec *specs;
    size_t n;
    char *names; /* storage of specs[i].name */
} zt_hf_tensor_list;

zt_status zt_hf_llama_tensors(const zt_hf_config *c, int dtype, zt_hf_tensor_list *out,
                              zt_error *err);
void zt_hf_tensor_list_free(zt_hf_tensor_list *l);

/* ---- import ---------------------------------------------------------------------------------- */

typedef struct zt_hf_model zt_hf_model;

/* Open dir: read config.json, open the weights, and check that they are exactly the tensors of a
 * LLaMA with that config (every one present with its shape and a float dtype; nothing else besides
 * rotary inv_freq buffers, and lm_head.weight when tied, which transformers ignores as well). */
zt_status zt_hf_model_open(const char *dir, zt_hf_model **out, zt_error *err);
void zt_hf_model_close(zt_hf_model *m);
const zt_hf_config *zt_hf_model_config(const zt_hf_model *m);
const zt_st_set *zt_hf_model_weights(const zt_hf_model *m);

/* Read elements [elem_offset, elem_offset + count) of tensor `name` as fp32, after checking that
 * its shape is shape[0..ndim) (the model's view). A tied lm_head.weight reads the embeddings. A
 * missing name is reported with the nearest names the model has. */
zt_status zt_hf_model_read(const zt_hf_model *m, const char *name, int ndim, const int64_t *shape,
                           uint64_t elem_offset, uint64_t count, float *dst, zt_error *err);

/* ---- export ---------------------------------------------------------------------------------- */

/* Write dir/config.json and the weights (model.safetensors, or shards past max_shard_bytes; 0: 5 GB)
 * so transformers loads them. The tensors must be exactly zt_hf_llama_tensors(c) (any order) and
 * all of one dtype (F32, BF16 or F16), which becomes torch_dtype. dir is created if missing; the
 * weights are written before config.json, each file atomically. */
zt_status zt_hf_export(const char *dir, const zt_hf_config *c, const zt_st_tensor_spec *tensors,
                       size_t n, zt_st_fill_fn fill, void *ctx, uint64_t max_shard_bytes,
                       zt_error *err);

/* Export the master weights (group "param") of a zt checkpoint, written under any rank count or
 * stage, as an HF model with config c in `dtype` (ZT_ST_F32, ZT_ST_BF16 or ZT_ST_F16). Every tensor
 * of the LLaMA must be in the checkpoint with the shape c implies. */
zt_status zt_hf_export_checkpoint(const char *dir, const zt_hf_config *c, zt_ckpt *ckpt, int dtype,
                                  uint64_t max_shard_bytes, zt_error *err);

#endif
