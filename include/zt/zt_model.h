/* zt plugin ABI v1: model plugins (ZT_KIND_MODEL, e.g. llama) and attention plugins
 * (ZT_KIND_ATTENTION: naive, flash, paged).
 *
 * How a step flows: the model declares its parameters (zt_param_decl) and the host, through the zero
 * plugin, owns their storage in flat per-unit buffers. The host then walks the units:
 *
 *   forward:  for u in 0..n_units-1: zero.before_unit(u) -> model.forward(u) -> zero.after_unit(u)
 *   backward: for u in n_units-1..0: zero.before_unit(u) -> model.backward(u) -> zero.grads_ready(u)
 *
 * Unit 0 is the embedding (tokens -> hidden), units 1..n_layers are the transformer layers, the last
 * unit is the final norm + LM head + masked cross-entropy (hidden -> loss). The model calls the
 * attention plugin bound to it for the attention core of each layer: the host calls an attention
 * plugin's kv_create / kv_destroy / kv_advance itself (generation), the model plugin everything
 * else. Tags ([training thread], [may be NULL], ...): zt_plugin.h.
 */
#ifndef ZT_MODEL_H
#define ZT_MODEL_H

#include "zt_types.h"
#include "zt_host.h" /* zt_group */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zt_adapter_spec zt_adapter_spec; /* zt_adapter.h */

/* ---- batches --------------------------------------------------------------------------------- */

/* One micro-batch of B rows of T tokens, in the memory of the run's device. Owned by the host; valid
 * for the duration of the call it is passed to.
 * Packed rows hold several documents: positions restart at 0 at each document start and doc_ids
 * differ between documents, so attention never crosses a sample boundary. */
typedef struct zt_batch {
    uint32_t struct_size;
    int32_t batch;            /* B */
    int32_t seq_len;          /* T */
    int32_t n_docs;           /* spans in cu_seqlens: one per document, plus one per run of
                                 padding that ends a row (padding attends only to padding) */
    const int32_t *tokens;    /* [B*T] input ids */
    const int32_t *targets;   /* [B*T] next-token ids; -100 where no loss is taken */
    const int32_t *positions; /* [B*T] position ids (rotary) */
    const int32_t *doc_ids;   /* [B*T] document index per token, unique within a row; padding is -1 */
    const int32_t *cu_seqlens;/* [n_docs+1] start offset of each document in the flat B*T stream */
    int32_t max_doc_len;      /* longest span */
    int32_t reserved0;
    /* Loss tokens in the whole global batch (all micro-batches and ranks): the loss is
     * sum(-log p[target]) / n_loss_tokens_global, so it does not depend on how the batch is split. */
    int64_t n_loss_tokens_global;
} zt_batch;

/* ---- attention ------------------------------------------------------------------------------- */

/* The attention core for one layer: out = softmax(q k^T * scale + mask) v with the causal and
 * document mask of `batch`. Layout [B, T, H, D] contiguous, dtype of the run (F32 on CPU, BF16 on
 * CUDA). k and v have n_kv_heads heads; query head h uses kv head h / (n_heads / n_kv_heads). */
typedef struct zt_attn_args {
    uint32_t struct_size;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    float scale;              /* usually 1/sqrt(head_dim) */
    int32_t causal;           /* 1: token i sees j <= i only */
    const zt_batch *batch;
    zt_tensor q, k, v, out;
    /* backward only (NULL views in forward): dout in, dq/dk/dv out (overwritten, not accumulated) */
    zt_tensor dout, dq, dk, dv;
} zt_attn_args;

/* A KV cache for generation, created and owned by the attention plugin (paged: blocks of
 * block_size tokens addressed through per-sequence block tables). Opaque to everyone else. */
typedef struct zt_kv_cache zt_kv_cache;

typedef struct zt_kv_cache_desc {
    uint32_t struct_size;
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t max_seqs;         /* concurrent sequences */
    int32_t max_tokens;       /* total token capacity across sequences */
    int32_t block_size;       /* tokens per block (paged); 0: plugin default */
    int32_t dtype;            /* zt_dtype of cached K/V */
    /* ABI 1.3 (read only when struct_size >= ZT_KV_CACHE_DESC_SIZE_1_3): */
    uint64_t free_bytes;      /* memory the run's device has free now (on the CPU: host memory, as
                                 the host's memory accounting reads it); a budget as a fraction of
                                 free memory is of this. 0: not known */
    int32_t max_seq_tokens;   /* the longest a sequence gets; 0: max_tokens / max_seqs */
    int32_t reserved1;
} zt_kv_cache_desc;

/* struct_size of a v1.0 zt_kv_cache_desc and of a 1.3 one. */
#define ZT_KV_CACHE_DESC_SIZE_1_0 32u
#define ZT_KV_CACHE_DESC_SIZE_1_3 48u

/* What a KV cache holds (kv_stats), for one sequence or the whole cache. A contiguous cache is
 * one block per sequence slot of its whole capacity. */
typedef struct zt_kv_stats {
    uint32_t struct_size;
    int32_t block_size;       /* tokens per block */
    int64_t total_blocks;     /* blocks of the pool */
    int64_t used_blocks;      /* referenced by at least one sequence */
    int64_t free_blocks;      /* total - used: free, including cached prefix blocks no one holds */
    int64_t cached_blocks;    /* free blocks that still hold a prompt prefix a new sequence may reuse */
    int64_t peak_used_blocks; /* the most used at once since kv_create */
    int64_t refcount_sum;     /* the sum of every block's reference count (0 when no sequence lives) */
    int64_t tokens;           /* committed tokens (a shared block counts for every sequence) */
    int64_t slots;            /* token slots of the blocks the sequences hold (counted the same way) */
    int64_t prefix_hit_tokens;/* tokens kv_prefix found in the cache since kv_create */
    int64_t cow_copies;       /* blocks copied before a write to a shared block since kv_create */
    int64_t bytes;            /* K and V of the pool */
} zt_kv_stats;

typedef struct zt_attention_ops {
    uint32_t struct_size;
    uint32_t reserved0;
    /* Training/prefill. *saved receives what backward needs (e.g. log-sum-exp rows), allocated from
     * ZT_POOL_ACTIVATIONS and owned by the attention plugin until backward or release consumes it
     * (the model only keeps the pointer); pass saved == NULL when no backward follows. The tensors
     * of `a` are the model's, borrowed for the call; on CUDA the work is enqueued on the host's
     * compute stream. [training thread], from the model plugin. Required (the model refuses an
     * attention plugin without forward and backward). */
    zt_status (*forward)(void *state, const zt_attn_args *a, void **saved);
    /* Reads a->out (the forward's output), writes dq, dk, dv and consumes saved, also when it
     * fails. [training thread], from the model plugin. Required. */
    zt_status (*backward)(void *state, const zt_attn_args *a, void *saved);
    /* Generation. [may be NULL]: NULL when the plugin lacks ZT_CAP_KV_CACHE (the host then refuses
     * to generate with it). When set, kv_destroy, kv_attend and kv_advance are required as well
     * (the host and the model call them without checks). The cache is created and owned by the
     * plugin; the host holds the handle until kv_destroy. [training thread], from the host. */
    zt_status (*kv_create)(void *state, const zt_kv_cache_desc *d, zt_kv_cache **out);
    /* Free a cache of kv_create (the host's last use of it). [training thread], from the host. */
    void (*kv_destroy)(void *state, zt_kv_cache *c);
    /* Append new_k/new_v ([n_seqs, n_new, Hkv, D]) for `layer` to the sequences seq_ids, then attend
     * q ([n_seqs, n_new, H, D]) against each sequence's whole cache, writing `out`. The model calls
     * this once per layer per decode step; kv_advance then commits n_new tokens for those
     * sequences. seq_ids and the tensors of `a` are borrowed. [training thread], from the model
     * plugin. */
    zt_status (*kv_attend)(void *state, zt_kv_cache *c, int32_t layer, const int32_t *seq_ids,
                           int32_t n_seqs, const zt_attn_args *a);
    /* [training thread], from the host, after the last unit of a decode step. */
    zt_status (*kv_advance)(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs,
                            int32_t n_new);
    /* Free a sequence's blocks, so its seq_id can start again (a finished or preempted sequence).
     * [may be NULL]: then the host runs one sequence per cache. [training thread], from the host. */
    zt_status (*kv_reset)(void *state, zt_kv_cache *c, int32_t seq_id);
    /* Free what forward left in `saved` when no backward will follow (evaluation, abort).
     * [training thread], from the model plugin. Required (the model calls it without a check). */
    void (*release)(void *state, void *saved);
    /* ABI 1.3 (read only when struct_size >= ZT_ATTENTION_OPS_SIZE_1_3), each [may be NULL],
     * [training thread], from the host. */
    /* Make room for n_new more tokens of each sequence (blocks, and a private copy of a shared
     * block about to be written), all or nothing: ZT_ERR_BUFFER_TOO_SMALL (with a message) leaves
     * the cache as it was, so the host can wait or preempt a sequence. kv_attend makes the same
     * room itself when the host did not ask first. */
    zt_status (*kv_reserve)(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs, int32_t n_new);
    /* Before the first kv_attend of an empty sequence: its whole prompt tokens[0, n). The plugin
     * attaches the cached blocks holding a prefix of it (full blocks, matched by their tokens and
     * all tokens before them) and sets *n_cached to the tokens it already holds (fewer than n: the
     * last prompt token is always computed, for its logits); the host runs the rest. The plugin
     * keeps the tokens to share the blocks this prompt fills. tokens are borrowed. */
    zt_status (*kv_prefix)(void *state, zt_kv_cache *c, int32_t seq_id, const int32_t *tokens, int32_t n,
                           int32_t *n_cached);
    /* What the cache holds: seq_id >= 0 one sequence (tokens, slots; the pool figures as for the
     * whole), -1 the whole cache. out->struct_size is set by the caller. */
    zt_status (*kv_stats)(void *state, const zt_kv_cache *c, int32_t seq_id, zt_kv_stats *out);
    /* ABI 1.5 (read only when struct_size >= ZT_ATTENTION_OPS_SIZE_1_5) [may be NULL], [training
     * thread], from the host, before the first unit of a step: make room for n_new more tokens of
     * each sequence (as kv_reserve does) and write the step's block tables and lengths, in seq_ids
     * order, where the plugin's kernels read them (on a GPU: enqueued on the compute stream). Until
     * the step's kv_advance, kv_attend of the same seq_ids then only enqueues kernels whose
     * arguments are the same at every step of that n_seqs and n_new, so the host may capture the
     * step's units in a CUDA graph and replay it after a later kv_prepare (generate.cuda_graphs).
     * NULL: the host never captures a step. */
    zt_status (*kv_prepare)(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs, int32_t n_new);
} zt_attention_ops;

/* struct_size of a v1.0 zt_attention_ops, a 1.3 one and a 1.5 one. */
#define ZT_ATTENTION_OPS_SIZE_1_0 72u
#define ZT_ATTENTION_OPS_SIZE_1_3 96u
#define ZT_ATTENTION_OPS_SIZE_1_5 104u

/* An attention plugin bound to a model by the host (the model never loads plugins itself). Owned by
 * the host; valid for the call it is passed with. */
typedef struct zt_attention_binding {
    const zt_attention_ops *ops;
    void *state;
    uint64_t caps;
} zt_attention_binding;

/* ---- parameters ------------------------------------------------------------------------------ */

typedef enum zt_init_kind {
    ZT_INIT_NORMAL = 0, /* N(0, init_std) */
    ZT_INIT_ONES = 1,
    ZT_INIT_ZEROS = 2,
    ZT_INIT_UNIFORM = 3 /* ABI 1.3: U(-init_std, init_std) (torch's kaiming_uniform_ with a = sqrt(5) is
                           U(-1/sqrt(fan_in), 1/sqrt(fan_in)): LoRA's A) */
} zt_init_kind;

#define ZT_PARAM_NO_DECAY 0x1u   /* excluded from weight decay (norms, by default embeddings) */
#define ZT_PARAM_EMBEDDING 0x2u  /* the token embedding (optional decay exclusion) */
#define ZT_PARAM_TIED 0x4u       /* storage shared with tied_to; not a separate tensor */
#define ZT_PARAM_ADAPTER 0x8u    /* ABI 1.3: an adapter's parameter (zt_model_ops.adapt), not the base
                                    model's: the host trains these and freezes the base */

/* One logical parameter, named as Hugging Face names it, so checkpoints and exports use HF names. */
typedef struct zt_param_decl {
    const char *name;        /* "model.layers.0.self_attn.q_proj.weight" */
    int32_t ndim;
    int32_t unit;            /* the unit whose forward uses it */
    int64_t shape[4];        /* HF layout: Linear weights are [out_features, in_features] */
    int32_t tp_split_dim;    /* tensor parallel: -1 replicated, 0 split rows (column-parallel),
                                1 split columns (row-parallel) */
    uint32_t flags;          /* ZT_PARAM_* */
    int32_t init;            /* zt_init_kind */
    float init_std;
    const char *tied_to;     /* ZT_PARAM_TIED: the name of the owning parameter; else NULL */
} zt_param_decl;

/* The model's shape and parameter list, valid from init until fini, owned by the plugin. */
typedef struct zt_model_info {
    uint32_t struct_size;
    int32_t n_units;
    int32_t n_layers;
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t intermediate_size;
    int32_t max_seq_len;
    int32_t n_params_decl;
    int32_t reserved0;
    const zt_param_decl *params; /* grouped by unit, in unit order */
    int64_t n_parameters;        /* total scalar parameters (tied counted once) */
    /* Bytes of activations kept per token per layer for backward, without and with recompute;
     * used by the memory estimator. */
    double act_bytes_per_token_layer;
    double act_bytes_per_token_layer_recompute;
    /* ABI 1.3 (read only when struct_size >= ZT_MODEL_INFO_SIZE_1_3): the numbers of the model's math
     * that its shape does not say, so the host can write a complete config.json for an export of a
     * model built from a preset: the RMSNorm epsilon and the RoPE base. 0 when the model has none. */
    double rms_norm_eps;
    double rope_theta;
    /* ABI 1.4 (read only when struct_size >= ZT_MODEL_INFO_SIZE_1_4): ZT_MODEL_CAN_* flags. */
    uint32_t caps;
    uint32_t reserved1;
} zt_model_info;

/* struct_size of a v1.0 zt_model_info, of a 1.3 one (rms_norm_eps, rope_theta) and of a 1.4 one (caps). */
#define ZT_MODEL_INFO_SIZE_1_0 80u
#define ZT_MODEL_INFO_SIZE_1_3 96u
#define ZT_MODEL_INFO_SIZE_1_4 104u

/* zt_model_info.caps: the last unit's forward samples on the device when the unit call asks
 * (zt_unit_call.sample_tokens; generation on a GPU). */
#define ZT_MODEL_CAN_SAMPLE_ON_DEVICE 0x1u

/* One sequence's sampling of zt_unit_call.sample_rows: greedy at temperature 0 (the first maximum),
 * else the softmax of logits / temperature, top_k (0: off), then top_p (1: off), and the token u in
 * [0, 1) selects: the first in id order whose cumulative probability exceeds u. The rules of the
 * host's sampler (framework/generate/generate.h), so given the same u both draw the same token. */
typedef struct zt_sample_row {
    double temperature, top_p, u;
    int32_t top_k;
    int32_t reserved0;
} zt_sample_row;

/* ---- tensor parallelism (ABI 1.4) ------------------------------------------------------------ */

/* The model's place in the tensor-parallel group (zt_model_ops.parallelize). Megatron's split:
 * q/k/v and gate/up are column-parallel (each rank holds rows of the weight: its heads, its part of
 * the ffn), o and down row-parallel (the matching columns), the embedding and the LM head split their
 * vocabulary rows (padded to a multiple of tp_size). Norms are replicated. */
typedef struct zt_model_parallel {
    uint32_t struct_size;
    int32_t tp_size;          /* ranks of the tensor-parallel group; 1: none */
    int32_t tp_rank;          /* this rank within it */
    int32_t seq_parallel;     /* 1: sequence parallel around the tp regions (use_seq_parallel) */
    zt_group tp;              /* the "tp" group (zt_host.group_get); owned by the host */
} zt_model_parallel;

#define ZT_MODEL_PARALLEL_SIZE_1_4 32u

/* One rank's shard of a logical parameter: along split_dim (zt_param_decl.tp_split_dim; -1 the
 * whole tensor) it holds `extent` rows or columns starting at `offset`, of which the first `valid`
 * lie inside the logical tensor; the rest are padding (the vocabulary padded to a multiple of tp),
 * zero and never exported. replicas: how many tensor-parallel ranks hold the same values (tp_size
 * for a replicated parameter, 1 for a split one; KV heads replicated when tp exceeds them are in
 * between, and the model sums their gradients so the copies stay equal). */
typedef struct zt_param_shard {
    uint32_t struct_size;
    int32_t split_dim;
    int64_t offset;
    int64_t extent;
    int64_t valid;
    int32_t replicas;
    int32_t reserved0;
} zt_param_shard;

#define ZT_PARAM_SHARD_SIZE_1_4 40u

/* ---- one unit's forward or backward ---------------------------------------------------------- */

#define ZT_UNIT_TRAIN 0x1u     /* keep what backward needs in *saved */
#define ZT_UNIT_RECOMPUTE 0x2u /* activation checkpointing: keep only the unit's input */

typedef struct zt_unit_call {
    uint32_t struct_size;
    int32_t unit;
    uint32_t flags;            /* ZT_UNIT_* */
    int32_t n_params;
    /* This unit's parameters in declaration order, as compute-dtype views owned by the zero plugin
     * (all-gathered under ZeRO-3). Valid for this call only. */
    const zt_tensor *params;
    /* backward: where to accumulate this unit's gradients (+=), same order; NULL entries for
     * frozen parameters. NULL in forward. */
    const zt_tensor *grads;
    const zt_batch *batch;
    const zt_attention_binding *attention;
    /* Hidden states [B, T, hidden]. forward: x_in -> x_out (x_in is unused by unit 0, which reads
     * batch->tokens; the last unit writes *loss and/or logits, see below).
     * backward: dx_out (gradient w.r.t. this unit's output; unused by the last unit) -> dx_in
     * (unused by unit 0). The host owns all four buffers. */
    zt_tensor x_in, x_out, dx_out, dx_in;
    /* Last unit: when loss != NULL (host memory) it receives this micro-batch's share of the loss,
     * sum(-log p[target]) / batch->n_loss_tokens_global; when x_out.data != NULL the logits
     * [B, T, vocab] are written there too (evaluation, tests, generation). */
    float *loss;
    /* Per (unit, micro-batch) slot for saved activations: NULL when a training forward starts; the
     * model allocates in forward (pool ZT_POOL_ACTIVATIONS), reads and frees in backward (also when
     * backward fails). The host owns the slot. */
    void **saved;
    /* Generation (NULL in training): decode against this cache; logits [B, T, vocab] go to x_out
     * for the last unit. After the last unit the host calls the attention plugin's kv_advance. */
    zt_kv_cache *kv;
    const int32_t *kv_seq_ids;
    /* ABI 1.2 (read only when struct_size >= ZT_UNIT_CALL_SIZE_1_2): the dynamic loss scale S of fp16
     * training. The last unit's backward multiplies the loss gradient by S (so every gradient the
     * backward produces carries S; the zero plugin divides it out through zt_step_args.loss_scale).
     * The loss written to *loss is never scaled. 1 without fp16; a 1.0/1.1 caller means 1. */
    double loss_scale;
    /* ABI 1.4 (read only when struct_size >= ZT_UNIT_CALL_SIZE_1_4, by a model with
     * ZT_MODEL_CAN_SAMPLE_ON_DEVICE; generation only, last unit, NULL otherwise): when sample_tokens
     * is not NULL the model samples one token per sequence from the logits it wrote to x_out, on the
     * host's compute stream, by sample_rows[i] (device memory, [batch->batch]) into sample_tokens[i]
     * (device int32 [batch->batch]); only ids below sample_n_draw (in [1, vocab]: the tokenizer's
     * vocabulary when the model's is padded) are drawn. A row whose logits hold a NaN or +inf gets -1
     * (the host reports broken weights). Nothing waits for the device. */
    const zt_sample_row *sample_rows;
    int32_t *sample_tokens;
    int32_t sample_n_draw;
    int32_t reserved1;
} zt_unit_call;

/* struct_size of a v1.0 zt_unit_call (no loss_scale), of a 1.2 one and of a 1.4 one (sampling). */
#define ZT_UNIT_CALL_SIZE_1_0 560u
#define ZT_UNIT_CALL_SIZE_1_2 568u
#define ZT_UNIT_CALL_SIZE_1_4 592u

/* The loss scale of a unit call: c->loss_scale when the caller's struct has it and it is set, else 1. */
static inline double zt_unit_call_loss_scale(const zt_unit_call *c)
{
    return c->struct_size >= ZT_UNIT_CALL_SIZE_1_2 && c->loss_scale > 0 ? c->loss_scale : 1.0;
}

typedef struct zt_model_ops {
    uint32_t struct_size;
    uint32_t reserved0;
    /* The model's shape and parameters, read from host config (model.preset / model.config)
     * during init. The struct is owned by the plugin and valid until fini. [any thread], after
     * init. Required, as every op of this table (the host calls them without NULL checks). */
    const zt_model_info *(*info)(void *state);
    /* One unit forward / backward: c and everything it points at are the host's (params the zero
     * plugin's), borrowed for the call, except *c->saved (see zt_unit_call). On CUDA the work is
     * enqueued on the host's compute stream. [training thread] (training and generation) */
    zt_status (*forward)(void *state, const zt_unit_call *c);
    zt_status (*backward)(void *state, const zt_unit_call *c); /* [training thread] (training) */
    /* Free whatever forward left in *saved when no backward will follow (evaluation, abort), and
     * set *saved to NULL. [training thread] */
    void (*release)(void *state, int32_t unit, void **saved);
    /* ABI 1.3 [may be NULL] (the host calls it only when struct_size >= ZT_MODEL_OPS_SIZE_1_3): put
     * the adapter `spec` (an adapter plugin's, zt_adapter.h; borrowed for the call) on the model.
     * Called at most once, after init and before the host's first info(). The model appends the
     * adapter's parameters to its declarations, each in the unit that uses it and flagged
     * ZT_PARAM_ADAPTER, named after the module they adapt as peft names them without its
     * "base_model.model." prefix ("model.layers.0.self_attn.q_proj.lora_A.weight"), and computes
     * them in every later forward and backward; the host freezes the parameters without the flag.
     * A target that names no module of the model, or a setting the model cannot compute, is
     * ZT_ERR_CONFIG with host->error() saying which. NULL: the model takes no adapter (the host
     * refuses an adapter plugin with it). [main thread] */
    zt_status (*adapt)(void *state, const zt_adapter_spec *spec);
    /* ABI 1.4 (the host calls them only when struct_size >= ZT_MODEL_OPS_SIZE_1_4), each [may be
     * NULL]: NULL means the model runs on one tensor-parallel rank only (the host refuses tp > 1).
     * Tensor parallelism: put the model on rank p->tp_rank of p->tp_size (p borrowed for the call).
     * Called at most once, after init (and adapt) and before the first forward; from then on the
     * parameter views of every unit call are this rank's shards (param_shard) and the model runs
     * its collectives over p->tp. A shape that does not divide (heads, KV heads, ffn) is
     * ZT_ERR_CONFIG with host->error() naming the numbers and the sizes that would work. [main
     * thread] */
    zt_status (*parallelize)(void *state, const zt_model_parallel *p);
    /* Where this rank's shard of declaration `param` lies in its logical tensor (after parallelize;
     * before it, or for a replicated parameter, the whole tensor). out->struct_size is set by the
     * caller. [any thread], after parallelize. */
    zt_status (*param_shard)(void *state, int32_t param, zt_param_shard *out);
} zt_model_ops;

/* struct_size of a v1.0 zt_model_ops (no adapt), of a 1.3 one and of a 1.4 one (tensor parallel). */
#define ZT_MODEL_OPS_SIZE_1_0 40u
#define ZT_MODEL_OPS_SIZE_1_3 48u
#define ZT_MODEL_OPS_SIZE_1_4 64u

#ifdef __cplusplus
}
#endif

#endif /* ZT_MODEL_H */
