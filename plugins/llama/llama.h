/* The llama model plugin's internals: the resolved model shape, the plugin state, and the per-unit
 * forward/backward used by plugin.c. docs/model-llama.md explains the math and the memory layout.
 */
#ifndef ZT_PLUGIN_LLAMA_H
#define ZT_PLUGIN_LLAMA_H

#include <stdint.h>
#include "cpu/kernels.h"
#include "zt/zt_plugin.h"

/* The model's shape after presets and user keys are merged (config.c). */
typedef struct llama_config {
    const char *preset;        /* "7b", or NULL when the sizes come only from model.* keys */
    int64_t hidden;            /* model.hidden_size */
    int64_t intermediate;      /* model.intermediate_size */
    int64_t layers;            /* model.num_hidden_layers */
    int64_t heads;             /* model.num_attention_heads */
    int64_t kv_heads;          /* model.num_key_value_heads */
    int64_t vocab;             /* model.vocab_size */
    int64_t head_dim;          /* model.head_dim (hidden / heads unless given) */
    int64_t max_positions;     /* model.max_position_embeddings */
    double rms_norm_eps;
    double initializer_range;
    int tie_embeddings;
    zt_rope_config rope;       /* theta and, for Llama 3.1, the frequency scaling */
} llama_config;

/* Reads model.* through the host getters, merges them over the preset and validates the result.
 * On failure the message (host->error) names the keys to set or fix. */
zt_status llama_config_resolve(const zt_host *host, llama_config *cfg);

/* Parameter indices inside a unit, in declaration order (Hugging Face's module order). */
enum { EMBED_TABLE, EMBED_PARAMS };
enum {
    LAYER_Q, LAYER_K, LAYER_V, LAYER_O, LAYER_GATE, LAYER_UP, LAYER_DOWN, LAYER_INPUT_NORM,
    LAYER_POST_NORM, LAYER_PARAMS
};
enum { HEAD_NORM, HEAD_LM, HEAD_PARAMS };

typedef struct llama_gpu llama_gpu; /* layers_cuda.c */

typedef struct llama_state {
    const zt_host *host;
    int on_gpu;                /* a CUDA run: bf16 or fp16 units on the GPU (layers_cuda.c) */
    int32_t compute;           /* dtype of parameter views and activations: ZT_F32 (CPU), ZT_BF16, or
                                  ZT_F16 on a GPU with fp16.enabled */
    llama_gpu *gpu;            /* their device state; NULL on the CPU */
    zt_cpu_ctx cpu;            /* the host's thread pool, for the kernels */
    llama_config cfg;
    float *inv_freq;           /* [head_dim / 2] rotary frequencies */
    zt_model_info info;
    zt_param_decl *decls;      /* info.params */
    char *names;               /* storage of the decl names */
    int32_t *unit_first_param; /* [n_units + 1]: decls of unit u are [first[u], first[u+1]) */
} llama_state;

/* Builds info and the parameter declarations from cfg (params.c). */
zt_status llama_params_build(llama_state *s);
void llama_params_free(llama_state *s);

/* One unit, called by plugin.c after it checked the call (views, shapes, dtypes, batch). */
zt_status llama_embedding_forward(llama_state *s, const zt_unit_call *c);
zt_status llama_embedding_backward(llama_state *s, const zt_unit_call *c);
zt_status llama_layer_forward(llama_state *s, const zt_unit_call *c);
zt_status llama_layer_backward(llama_state *s, const zt_unit_call *c);
zt_status llama_head_forward(llama_state *s, const zt_unit_call *c);
zt_status llama_head_backward(llama_state *s, const zt_unit_call *c);
/* Frees a saved-activation record left by a training forward (NULL is a no-op). */
void llama_saved_free(llama_state *s, void *saved);

/* The same units on CUDA runs (layers_cuda.c, built with ZT_PLUGIN_CUDA), with bf16 device views. */
zt_status llama_cuda_init(llama_state *s); /* checks the shapes the kernels take, uploads constants */
void llama_cuda_fini(llama_state *s);
zt_status llama_cuda_embedding_forward(llama_state *s, const zt_unit_call *c);
zt_status llama_cuda_embedding_backward(llama_state *s, const zt_unit_call *c);
zt_status llama_cuda_layer_forward(llama_state *s, const zt_unit_call *c);
zt_status llama_cuda_layer_backward(llama_state *s, const zt_unit_call *c);
zt_status llama_cuda_head_forward(llama_state *s, const zt_unit_call *c);
zt_status llama_cuda_head_backward(llama_state *s, const zt_unit_call *c);
void llama_cuda_saved_free(llama_state *s, void *saved);

/* "layer 3" / "the embedding" / "the LM head", for messages. */
const char *llama_unit_name(const llama_state *s, int32_t unit, char *buf, size_t cap);

#endif
