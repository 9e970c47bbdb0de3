/* A small stand-in for the host's training loop, for the llama and naive plugin tests.
 *
 * It loads the two plugins through the registry and runtime exactly as zt-run does (build-tree
 * plugins.d, options schemas validated, probe, init), then plays the host's and the zero plugin's
 * part: one contiguous buffer per declared parameter (a tied parameter is a view of its owner),
 * weights loaded by Hugging Face name, one hidden-state buffer per unit boundary, and the units run
 * forward and backward in order. Every output buffer is filled with NaN before each run, so a unit
 * that leaves part of its output unwritten fails the comparison.
 */
#ifndef ZT_TESTS_MODEL_HARNESS_H
#define ZT_TESTS_MODEL_HARNESS_H

#include <stdint.h>

#include "config/config.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "zt/zt_plugin.h"

typedef struct mh_env {
    zt_registry *registry;
    zt_config *cfg;
    zt_runtime *rt;
    zt_loaded_plugin model_plugin, attention_plugin;
    const zt_model_ops *model;
    void *model_state;
    const zt_model_info *info;
    zt_attention_binding attention;
} mh_env;

/* Loads llama and naive from `plugins_d` with the run config `config_json` (a JSON object, e.g.
 * {"model": {"preset": "tiny"}}) and initializes both. On failure returns the status with the
 * registry's message (which includes the plugin's own) in err, and leaves e closed. */
zt_status mh_open(mh_env *e, const char *plugins_d, const char *config_json, int n_threads, zt_error *err);
/* mh_open is a world of one rank; mh_open_ranks with single_process 0 joins the ranks of the launch
 * (mpirun) instead, with the collectives of the host's MPI backend. */
zt_status mh_open_ranks(mh_env *e, const char *plugins_d, const char *config_json, int n_threads, int single_process,
                        zt_error *err);
void mh_close(mh_env *e);

/* The message the model plugin gave with host->error since the last call (and clears it). */
const char *mh_model_error(mh_env *e);
const char *mh_attention_error(mh_env *e);

/* The run config for an HF checkpoint directory: its config.json's fields under "model." (what
 * zt-run --model DIR does). Understands transformers 4 (rope_theta, rope_scaling) and 5
 * (rope_parameters). malloc'd JSON text, or NULL with err set. */
char *mh_config_from_hf(const char *model_dir, zt_error *err);

/* Parameter storage, one contiguous fp32 buffer per declaration, with zeroed gradients. */
typedef struct mh_params {
    int32_t n;
    float **value;      /* [n]; a tied declaration points at its owner's buffer */
    float **grad;       /* [n]; likewise */
    int64_t *numel;     /* [n] */
    int32_t *owner;     /* [n]: the declaration that owns the storage (itself unless tied) */
    int64_t (*shape)[4]; /* [n]: each view's shape; NULL: the declarations' (a tensor-parallel rank's
                            shards have their own, mh_params_alloc_shards) */
} mh_params;

zt_status mh_params_alloc(const mh_env *e, mh_params *p, zt_error *err);
void mh_params_free(mh_params *p);
/* This rank's tensor-parallel shards (zt_model_ops.param_shard, after parallelize) of the whole
 * tensors in `full` (a one-rank model's mh_params of the same declarations): the slice of each split
 * parameter, padding zero; gradients zero. */
zt_status mh_params_alloc_shards(const mh_env *e, const mh_params *full, mh_params *p, zt_error *err);
/* Every non-tied parameter from `safetensors_path` by its HF name and shape. */
zt_status mh_params_load(const mh_env *e, mh_params *p, const char *safetensors_path, zt_error *err);
void mh_grads_zero(const mh_env *e, mh_params *p);
int32_t mh_param_index(const mh_env *e, const char *name); /* -1 when not declared */

/* One micro-batch with its own storage. */
typedef struct mh_batch {
    zt_batch batch;
    int32_t *tokens, *targets, *positions, *doc_ids, *cu_seqlens;
} mh_batch;

/* B rows of T tokens. targets: from HF labels (shifted by one inside each row, -100 at the end)
 * when labels != NULL, else all -100. positions: restart at each document; doc_ids: NULL means one
 * document per row. n_loss_tokens_global: 0 means "count this batch's loss tokens". */
zt_status mh_batch_make(mh_batch *b, int32_t B, int32_t T, const int32_t *tokens, const int32_t *labels,
                        const int32_t *doc_ids, int64_t n_loss_tokens_global, zt_error *err);
void mh_batch_free(mh_batch *b);

/* Hidden-state buffers and saved slots for one micro-batch: hidden[u] is the output of unit u
 * (u < n_units - 1), grad_hidden[u] the gradient with respect to it. */
typedef struct mh_run {
    int32_t n_units;
    int64_t tokens;
    float **hidden, **grad_hidden;
    void **saved;
    float *logits; /* [tokens, vocab] */
    float loss;
} mh_run;

zt_status mh_run_alloc(const mh_env *e, const mh_batch *b, mh_run *r, zt_error *err);
void mh_run_free(mh_run *r);

/* Forward through every unit with `flags` (ZT_UNIT_*). want_logits: the last unit also writes
 * r->logits. The loss goes to r->loss. On failure: the status, with the plugin's message in err. */
zt_status mh_forward(mh_env *e, const mh_params *p, const mh_batch *b, mh_run *r, uint32_t flags, int want_logits,
                     zt_error *err);
/* Backward through every unit, accumulating into p's gradients. frozen[i] != 0 passes a NULL gradient
 * for declaration i (frozen may be NULL). */
zt_status mh_backward(mh_env *e, const mh_params *p, const mh_batch *b, mh_run *r, const int *frozen,
                      zt_error *err);

/* Greedy decoding of n_new tokens after the prompt, with the KV cache (use_cache) or by running the
 * whole sequence again for every token. out_tokens receives prompt + generated ids; step_logits
 * (may be NULL) the logits [n_new, vocab] each new token was chosen from. */
zt_status mh_generate(mh_env *e, const mh_params *p, const int32_t *prompt, int32_t n_prompt, int32_t n_new,
                      int use_cache, int32_t *out_tokens, float *step_logits, zt_error *err);

/* A contiguous fp32 CPU view of `data` with `shape`. */
zt_tensor mh_view(void *data, int ndim, const int64_t *shape);

/* Comparison of float arrays: every element within rtol relative to the reference, with an
 * absolute floor of atol_fraction * max|want| for elements near zero. Prints the worst element
 * on failure and returns 0. */
int mh_close_enough(const char *what, const float *got, const float *want, int64_t n, double rtol,
                    double atol_fraction);

/* The fixture's expected.json: loss, loss tokens, greedy generation. */
typedef struct mh_expected {
    double loss;
    int64_t n_loss_tokens;
    int32_t prompt[64], output[64];
    int32_t n_prompt, n_output;
} mh_expected;

zt_status mh_expected_load(const char *path, mh_expected *x, zt_error *err);

/* The whole file in a malloc'd NUL-terminated buffer. */
char *mh_read_file(const char *path, size_t *len, zt_error *err);

#endif
