/* The llama model plugin's internals: the resolved model shape, the plugin state, the saved
 * activations every device path keeps the same way, and the table of what each device path does
 * (llama_backend). docs/model-llama.md explains the math and the memory layout.
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

/* The three kinds of unit: unit 0, units 1 .. layers, the last one. */
enum { LLAMA_UNIT_EMBEDDING, LLAMA_UNIT_LAYER, LLAMA_UNIT_HEAD, LLAMA_UNIT_KINDS };

/* The linear layers of a transformer layer LoRA can adapt, in LAYER_* order (LAYER_Q .. LAYER_DOWN). */
#define LLAMA_LINEARS 7

/* A LoRA adapter on the layers' linears (zt_adapter_spec; lora.c): y += scaling * x A^T B^T. */
typedef struct llama_lora {
    int32_t r;              /* rank; 0: no adapter */
    float scaling;
    char *targets;          /* the spec's target_modules, copied */
    /* [layers * LLAMA_LINEARS]: where linear k of layer l has its A in that unit's parameter views
     * (B follows it), or -1 when it is not adapted */
    int32_t *slot;
    int32_t n_adapted;      /* adapted linears over all layers */
    float dropout;          /* lora_dropout: on the adapter's input, in training only (layers.c) */
    uint64_t seed;          /* the host key seed, which the dropout masks derive from */
} llama_lora;

/* lora_dropout's mask (layers.c on the CPU, kernels/cuda/lora_dropout.cu on the GPU, which repeats
 * these two steps in device code): a chain of splitmix64's finalizer from llama_lora_mask_start over the
 * micro-batch's tokens and positions, then one hash per element. */
#define LLAMA_LORA_GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t llama_lora_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The chain's start for linear k (LAYER_*) of `unit`. */
static inline uint64_t llama_lora_mask_start(const llama_lora *l, int32_t unit, int k)
{
    return llama_lora_mix64(l->seed + LLAMA_LORA_GOLDEN * (uint64_t)(unit * LLAMA_LINEARS + k + 1));
}

typedef struct llama_state llama_state;

/* This rank's part of the model under tensor parallelism (tp.c; zt_model_parallel). Without
 * parallelize(): size 1, every count the whole model's. */
typedef struct llama_tp {
    int32_t size, rank;
    int32_t seq_parallel;    /* 1: norms and residual adds on sequence shards (tp.c) */
    zt_group group;          /* "tp" */
    int64_t heads;           /* query heads of this rank: heads / size */
    int64_t kv_heads;        /* key/value heads of this rank: kv_heads / size, or 1 when replicated */
    int64_t kv_first;        /* the first of them in the model's numbering */
    int32_t kv_replicas;     /* ranks holding the same key/value heads (size / kv_heads when size > kv_heads) */
    int64_t ffn;             /* intermediate / size */
    int64_t vocab;           /* rows of the embedding and LM head per rank: vocab padded to a multiple of size */
    int64_t vocab_first;     /* the first of them in the vocabulary */
    int64_t vocab_valid;     /* of them, inside the vocabulary (the rest pad) */
} llama_tp;

/* zt_model_ops.parallelize / param_shard (tp.c). llama_tp_init sets the one-rank values (init). */
void llama_tp_init(llama_state *s);
zt_status llama_parallelize(llama_state *s, const zt_model_parallel *p);
zt_status llama_param_shard(const llama_state *s, int32_t param, zt_param_shard *out);
/* The local shape of declaration `param` under s->tp (out[4]). */
void llama_local_shape(const llama_state *s, int32_t param, int64_t *out);

typedef struct llama_backend llama_backend;
typedef struct llama_gpu llama_gpu; /* layers_cuda.c */

struct llama_state {
    const zt_host *host;
    const llama_backend *backend; /* the device path, chosen once at init from host->device */
    int on_gpu;                   /* a CUDA run: bf16 or fp16 units on the GPU (layers_cuda.c) */
    int32_t compute;              /* dtype of parameter views and activations: ZT_F32 (CPU), ZT_BF16,
                                     or ZT_F16 on a GPU with fp16.enabled */
    llama_gpu *gpu;               /* their device state; NULL on the CPU */
    zt_cpu_ctx cpu;               /* the host's thread pool, for the kernels */
    llama_config cfg;
    float *inv_freq;              /* [head_dim / 2] rotary frequencies */
    zt_model_info info;
    zt_param_decl *decls;         /* info.params */
    char *names;                  /* storage of the decl names */
    int32_t *unit_first_param;    /* [n_units + 1]: decls of unit u are [first[u], first[u+1]) */
    llama_lora lora;
    llama_tp tp;
};

/* Builds info and the parameter declarations from cfg and, with an adapter, s->lora (params.c). */
zt_status llama_params_build(llama_state *s);
void llama_params_free(llama_state *s);

/* zt_model_ops.adapt (lora.c): checks the spec, resolves its targets into s->lora and rebuilds the
 * declarations with the adapter's parameters. */
zt_status llama_lora_adapt(llama_state *s, const zt_adapter_spec *spec);
void llama_lora_free(llama_state *s);
/* The module names of linear k ("self_attn.q_proj", ...). */
extern const char *const llama_linear_names[LLAMA_LINEARS];

/* ---- saved activations, on every device (layers_saved.c) ------------------------------------- */

/* One unit call in progress, after plugin.c checked it (views, shapes, dtypes, batch). The CUDA
 * path's own run (layers_cuda.c) has this as its first member. */
typedef struct llama_call {
    llama_state *s;
    const zt_unit_call *c;
    int64_t tokens; /* N = B*T */
    char name[40];  /* "layer 3 (unit 4)", for messages */
} llama_call;

void llama_call_init(llama_call *u, llama_state *s, const zt_unit_call *c);

/* What a training forward of a layer or the head leaves in *zt_unit_call.saved: a host header and,
 * unless it only marks a recompute, the unit's activations at `acts`, placed by the device path
 * (llama_backend.saved_alloc). */
typedef struct llama_saved {
    uint32_t magic;
    int32_t unit;
    int32_t recompute;     /* 1: no activations; the backward recomputes the forward */
    int64_t tokens;        /* B*T of the forward that made it */
    void *attention_saved; /* the attention plugin's record for this layer's backward */
    const zt_attention_binding *attention; /* who made attention_saved, to release it */
    void *acts;            /* the activations (CPU: after the header; CUDA: one device block); NULL
                              for a recompute marker */
} llama_saved;

/* A device path's forward of a layer or the head into rec's activations. outputs: the forward
 * proper (x_out, and the loss where asked); 0: the backward's recompute, activations only. keep: a
 * backward reads rec (the attention plugin saves into rec->attention_saved). */
typedef zt_status (*llama_compute_fn)(const llama_call *u, llama_saved *rec, int outputs, int keep);

/* A forward of a layer or the head with its record: the activations are kept in
 * ZT_POOL_ACTIVATIONS for a training forward, only a marker with ZT_UNIT_RECOMPUTE as well, and
 * nothing (scratch from ZT_POOL_WORKSPACE) otherwise. */
zt_status llama_saved_forward(const llama_call *u, llama_compute_fn compute);
/* The backward's start: the record in the slot, checked to be this call's forward; then, when it
 * only marks a recompute, the activations computed again into *fresh (else *fresh is NULL). */
zt_status llama_saved_take(const llama_call *u, llama_saved **saved);
zt_status llama_saved_materialize(const llama_call *u, llama_saved *saved, llama_compute_fn compute,
                                  llama_saved **fresh);
/* The backward's end: frees both records and empties the slot. */
void llama_saved_done(const llama_call *u, llama_saved *saved, llama_saved *fresh);
/* Frees a record, and the attention plugin's part of it when no backward took that (NULL is a no-op). */
void llama_saved_free(llama_state *s, llama_saved *rec);

/* ---- the device paths ------------------------------------------------------------------------ */

/* What differs between the CPU and the CUDA path: plugin.c picks the one for host->device at init
 * and calls the units only through it. */
struct llama_backend {
    int32_t device_type; /* ZT_DEVICE_CPU or ZT_DEVICE_CUDA */
    zt_status (*init)(llama_state *s); /* after the shape and declarations; NULL: nothing to do */
    void (*fini)(llama_state *s);      /* also after a failed init; NULL: nothing to do */
    /* by unit kind (LLAMA_UNIT_*), called after plugin.c checked the call */
    zt_status (*forward[LLAMA_UNIT_KINDS])(llama_state *s, const zt_unit_call *c);
    zt_status (*backward[LLAMA_UNIT_KINDS])(llama_state *s, const zt_unit_call *c);
    /* A record from `pool` (tags: the unit's name and `what`): a zeroed header with, unless
     * `marker`, room for the unit's activations at acts; NULL when out of memory (the host said so). */
    llama_saved *(*saved_alloc)(const llama_call *u, int32_t pool, int marker, const char *what);
    void (*saved_free)(llama_state *s, llama_saved *rec); /* the header and the activations */
};

extern const llama_backend llama_cpu_backend;  /* layers.c: fp32 */
extern const llama_backend llama_cuda_backend; /* layers_cuda.c, built with ZT_PLUGIN_CUDA: bf16 or fp16 */

/* "layer 3" / "the embedding" / "the LM head", for messages. */
const char *llama_unit_name(const llama_state *s, int32_t unit, char *buf, size_t cap);

#endif
