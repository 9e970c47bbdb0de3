/* Private to framework/generate/ (nothing outside it includes this): what the files of zt-run
 * --generate share. sources.c finds the model's config, the template and the tokenizer (checkpoint
 * config, data manifest) and wraps the tokenizer; decode.c runs the model against its KV cache;
 * generate.c checks the options, streams the text and runs the whole; sampler.c is the sampler
 * (generate.h, with the public entry points). */
#ifndef ZT_FRAMEWORK_GENERATE_INTERNAL_H
#define ZT_FRAMEWORK_GENERATE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "config/config.h"
#include "data/prompt_template.h"
#include "generate/generate.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "state/checkpoint.h"
#include "state/hf_model.h"
#include "state/llama2c.h"

/* ---- where model, template and tokenizer come from (sources.c) --------------------------------- */

/* What a zt-prep manifest says about the tokenizer and the template. */
typedef struct manifest_info {
    char path[4096];
    char *tokenizer_path;
    char *tokenizer_plugin;
    uint64_t tokenizer_hash;
    char *template_json; /* the template as a template file's JSON object */
} manifest_info;

/* data_dir/manifest.json's tokenizer (path, plugin, hash) and template. */
zt_status gen_manifest_load(const char *data_dir, manifest_info *m, zt_error *err);
void gen_manifest_free(manifest_info *m);
/* A template from the JSON of a template file (the manifest's record of it): zt_template_load
 * reads files, so it goes through a private temporary file. */
zt_status gen_template_from_manifest(const manifest_info *m, zt_template *tpl, zt_error *err);
/* The checkpoint directory --resume names: a step directory, or a checkpoint root (its newest). */
zt_status gen_resolve_checkpoint(const char *arg, char **step_dir, zt_error *err);
/* The model.* keys and data.path of the resolved config a checkpoint carries: the model's shape as
 * it was trained, and the data set whose manifest holds the template and tokenizer. */
zt_status gen_checkpoint_config(zt_ckpt *c, const char *dir, zt_config *cfg, char **data_path, zt_error *err);

/* ---- the tokenizer (sources.c) ----------------------------------------------------------------- */

/* A tokenizer plugin's model (SentencePiece .model), or a llama2.c tokenizer .bin. */
typedef struct gen_tokenizer {
    char *path;
    const zt_loaded_plugin *lp;
    const zt_tokenizer_ops *ops;
    zt_tokenizer_model *model;
    zt_l2c_tokenizer *l2c;
    zt_tokenizer_info info;
} gen_tokenizer;

/* A llama2.c tokenizer (a .bin), not a tokenizer plugin's model. */
int gen_is_llama2c_file(const char *path);
/* A llama2.c .bin for a model of model_vocab tokens, else a model of plugin lp. */
zt_status gen_tokenizer_open(gen_tokenizer *t, const char *path, const zt_loaded_plugin *lp, int32_t model_vocab,
                             zt_error *err);
void gen_tokenizer_close(gen_tokenizer *t);
/* The ids of text[0, len), malloc'd. */
zt_status gen_tokenizer_encode(gen_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                               zt_error *err);
/* Text of ids; `prev` is the id before them (llama2.c drops the space of the piece after BOS). */
zt_status gen_tokenizer_decode(gen_tokenizer *t, int32_t prev, const int32_t *ids, size_t n, char **text, size_t *len,
                               zt_error *err);

/* ---- the model against its KV cache (decode.c) ------------------------------------------------- */

typedef struct gen_model {
    zt_runtime *rt;
    const zt_loaded_plugin *model_lp, *attention_lp;
    const zt_model_ops *ops;
    const zt_model_info *info;
    zt_attention_binding attention;
    float *weights;          /* every parameter with storage, one after another */
    zt_tensor *views;        /* [n_params_decl]: a tied parameter views its owner's storage */
    int32_t *unit_first;     /* [n_units + 1]: the first parameter of each unit */
    zt_kv_cache *kv;
    int32_t n_cached;        /* tokens already in the cache */
    float *hidden[2];        /* [tokens the cache holds, hidden]: unit outputs, ping-pong */
    float *logits;           /* [vocab] of the last token */
    int32_t *positions, *targets, *doc_ids; /* [tokens the cache holds] */
} gen_model;

/* Reads one parameter (its whole logical tensor) from wherever the weights are. */
typedef zt_status (*weight_reader)(void *source, const zt_param_decl *p, float *dst, zt_error *err);

/* The readers of a zt_hf_model, a zt_l2c_model and a zt_ckpt (its "param" group). */
zt_status gen_read_hf(void *source, const zt_param_decl *p, float *dst, zt_error *err);
zt_status gen_read_llama2c(void *source, const zt_param_decl *p, float *dst, zt_error *err);
zt_status gen_read_checkpoint(void *source, const zt_param_decl *p, float *dst, zt_error *err);
/* Parameter storage and views, filled by `read`. */
zt_status gen_model_load_weights(gen_model *m, weight_reader read, void *source, zt_error *err);
/* Buffers and the KV cache for `capacity` tokens. */
zt_status gen_model_prepare(gen_model *m, int32_t capacity, zt_error *err);
void gen_model_free(gen_model *m);
/* Runs tokens[0, n) at the next positions through every unit, appending their keys and values to the
 * cache; m->logits receives the logits of the last one. The last unit (norm, LM head) runs on the
 * last token only: nothing else of the prefill needs logits. */
zt_status gen_model_step(gen_model *m, const int32_t *tokens, int32_t n, zt_error *err);

#endif
