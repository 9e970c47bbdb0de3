/* A test-only LLaMA (HF LlamaForCausalLM semantics) composed from the CPU kernels: forward, backward
 * and greedy generation. It exists to prove that the kernels are sufficient to reproduce
 * transformers' training step; the real model plugin comes next and will replace it.
 *
 * Everything is fp32 and unoptimized in memory (all activations are kept); batches are small.
 */
#ifndef ZT_TESTS_TINY_LLAMA_H
#define ZT_TESTS_TINY_LLAMA_H

#include <stdint.h>
#include "cpu/kernels.h"
#include "base/error.h"

typedef struct llama_config {
    int64_t vocab, hidden, layers, heads, kv_heads, head_dim, ffn;
    float eps;
    int tied; /* lm_head shares the embedding table */
    zt_rope_config rope;
} llama_config;

/* The parameters of one decoder layer, in the order of the enum. */
enum {
    L_ATTN_NORM, L_Q, L_K, L_V, L_O, L_MLP_NORM, L_GATE, L_UP, L_DOWN, L_COUNT
};

typedef struct llama_param {
    char name[96]; /* HF name, e.g. "model.layers.0.self_attn.q_proj.weight" */
    int ndim;
    int64_t shape[2];
    int64_t numel;
    float *value, *grad;
} llama_param;

typedef struct llama_model {
    llama_config cfg;
    int n_params;
    llama_param *params;   /* embed, layer 0 .. L-1 (L_COUNT each), final norm, lm_head if untied */
    llama_param *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    float *inv_freq;       /* [head_dim / 2] */
} llama_model;

/* Reads an HF checkpoint directory: config.json (rope_parameters, or legacy rope_theta and
 * rope_scaling) and model.safetensors. Every expected tensor must be present with its shape, and
 * nothing else may be. Gradients start at zero. */
zt_status llama_load(const char *dir, llama_model *m, zt_error *err);
void llama_free(llama_model *m);
llama_param *llama_layer_param(llama_model *m, int64_t layer, int which);

typedef struct llama_batch {
    int64_t batch, seq;
    const int32_t *ids;       /* [batch, seq] */
    const int32_t *positions; /* [batch, seq] */
    const int32_t *doc_ids;   /* [batch, seq] or NULL: one document per row */
    const int32_t *labels;    /* [batch, seq] in HF convention (shifted inside), or NULL */
} llama_batch;

/* Forward; logits [batch*seq, vocab] are written. With labels: *loss is HF's mean cross-entropy
 * over non -100 labels after the shift, and the backward accumulates into every param's grad. */
zt_status llama_step(const zt_cpu_ctx *ctx, llama_model *m, const llama_batch *b, float *logits,
                     double *loss, zt_error *err);

/* Greedy decoding without a cache (each step runs the whole sequence): appends n_new argmax
 * tokens to prompt[0, n_prompt) into out (which holds n_prompt + n_new). */
zt_status llama_generate(const zt_cpu_ctx *ctx, llama_model *m, const int32_t *prompt,
                         int64_t n_prompt, int64_t n_new, int32_t *out, zt_error *err);

#endif
