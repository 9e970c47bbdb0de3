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
#include "config/settings.h"
#include "data/prompt_template.h"
#include "generate/generate.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "state/checkpoint.h"
#include "state/hf_model.h"
#include "state/llama2c.h"
#include "state/peft_adapter.h"

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

/* A captured decode step (decode.c): warm once it ran eagerly at its size; the head's sampling
 * arguments it was captured with. */
typedef struct gen_graph {
    void *exec;
    int warm, sampled;
    int32_t n_draw;
} gen_graph;

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
    int32_t max_seqs;        /* sequences the cache holds */
    int32_t rows;            /* tokens one call may run: max(longest sequence, max_seqs) */
    int32_t n_cached;        /* gen_model_step: tokens of sequence 0 already in the cache */
    int32_t seq_tokens;      /* the longest sequence the cache holds (gen_model_prepare) */
    /* Where the units run: on the CPU in fp32 in host memory; on a GPU (device = cuda) in the
     * 16-bit compute type (bf16, or fp16 with fp16.enabled) in device memory, the logits in fp32,
     * copied to `logits` for the sampler. */
    int on_gpu;
    int32_t dtype;           /* of weights, unit outputs and the KV cache */
    void *hidden[2];         /* [rows, hidden]: unit outputs, ping-pong */
    float *logits;           /* [max_seqs, vocab]: of the last token of each sequence of a call (host) */
    float *device_logits;    /* on a GPU: where the head writes them */
    /* The batch's int32 arrays, one block: tokens, targets, positions, doc_ids [rows] each, then
     * cu_seqlens [max_seqs + 1]; on a GPU copied to device_batch before each call. */
    int32_t *batch_ints, *device_batch;
    int32_t *tokens, *positions, *targets, *doc_ids, *cu_seqlens; /* into batch_ints */
    /* Device sampling (generate.device_sampling, a GPU and a model with ZT_MODEL_CAN_SAMPLE_ON_DEVICE,
     * set before gen_model_prepare): the head samples, and a call copies back n int32 instead of the
     * logits. The rows and tokens [max_seqs] in page-locked host memory and their device copies. */
    int device_sampling;
    zt_sample_row *sample_rows, *device_sample_rows;
    int32_t *sampled, *device_sampled;
    /* CUDA graphs (generate.cuda_graphs, a GPU and an attention plugin with kv_prepare, set before
     * gen_model_prepare): graphs[n] replays the units of a one-token step over n sequences. */
    int cuda_graphs;
    int warmup;        /* generate.warmup (set before gen_model_prepare) */
    gen_graph *graphs; /* [max_seqs + 1] */
    int64_t graph_captures, graph_replays;
} gen_model;

/* Reads one parameter (its whole logical tensor) from wherever the weights are. */
typedef zt_status (*weight_reader)(void *source, const zt_param_decl *p, float *dst, zt_error *err);

/* The readers of a zt_hf_model, a zt_l2c_model and a zt_ckpt (its "param" group). */
zt_status gen_read_hf(void *source, const zt_param_decl *p, float *dst, zt_error *err);
zt_status gen_read_llama2c(void *source, const zt_param_decl *p, float *dst, zt_error *err);
zt_status gen_read_checkpoint(void *source, const zt_param_decl *p, float *dst, zt_error *err);
/* A base model with an adapter (--model BASE --adapter DIR): the adapter's parameters (ZT_PARAM_ADAPTER)
 * from the peft file, the others from the base's HF files. */
typedef struct gen_hf_adapter_source {
    zt_hf_model *base;
    zt_st_file *adapter;
} gen_hf_adapter_source;
zt_status gen_read_hf_adapter(void *source, const zt_param_decl *p, float *dst, zt_error *err);
/* Parameter storage and views, filled by `read`. */
zt_status gen_model_load_weights(gen_model *m, weight_reader read, void *source, zt_error *err);
/* Buffers and the KV cache for max_seqs sequences of up to seq_tokens tokens each. */
zt_status gen_model_prepare(gen_model *m, int32_t max_seqs, int32_t seq_tokens, zt_error *err);
void gen_model_free(gen_model *m);
/* Runs n_new tokens of each of n_seqs sequences (tokens [n_seqs * n_new], sequence i's at positions
 * start[i]..) through every unit, appending their keys and values to the cache and committing them;
 * m->logits row i receives the logits of sequence i's last token. Several sequences run one token
 * each (decoding); a prompt runs alone (n_seqs 1). The last unit (norm, LM head) runs on the last
 * tokens only: nothing else needs logits. */
zt_status gen_model_run(gen_model *m, const int32_t *seq_ids, int32_t n_seqs, const int32_t *tokens, int32_t n_new,
                        const int32_t *start, zt_error *err);
/* gen_model_run with device sampling (m->device_sampling): sequence i's next token, drawn by rows[i]
 * from its first n_draw ids, goes to next[i]; m->logits is not filled. */
zt_status gen_model_run_sampled(gen_model *m, const int32_t *seq_ids, int32_t n_seqs, const int32_t *tokens,
                                int32_t n_new, const int32_t *start, const zt_sample_row *rows, int32_t n_draw,
                                int32_t *next, zt_error *err);
/* The sampling row of a host sampler's next draw (advancing its generator as zt_sampler_next would). */
zt_sample_row gen_sample_row(zt_sampler *s);
/* Sequence 0's next n tokens (the single-prompt path). */
zt_status gen_model_step(gen_model *m, const int32_t *tokens, int32_t n, zt_error *err);
/* On a GPU (generate.warmup), after gen_model_prepare and before the clock starts: a throw-away
 * prompt of up to n_prompt tokens and three one-token steps on sequence 0 (sampled from n_draw ids
 * when the head samples on the device), then that sequence's cache is freed. */
zt_status gen_model_warmup(gen_model *m, int32_t n_prompt, int32_t n_draw, zt_error *err);
/* gen_model_step with device sampling: the next token, drawn by *row from the first n_draw ids, in *next. */
zt_status gen_model_step_sampled(gen_model *m, const int32_t *tokens, int32_t n, const zt_sample_row *row,
                                 int32_t n_draw, int32_t *next, zt_error *err);
/* The attention plugin's cache figures (NULL op: ZT_ERR_UNSUPPORTED, no message). */
zt_status gen_model_kv_stats(gen_model *m, int32_t seq_id, zt_kv_stats *out, zt_error *err);
/* The log line of the cache at the end of generation; waste: slots and tokens of the sequences
 * when they finished, summed. */
void gen_model_log_kv(gen_model *m, int64_t finished, int64_t finished_slots, int64_t finished_tokens);

/* ---- the run's figures, for --stats (stats.c) -------------------------------------------------- */

typedef struct gen_stats {
    double started, finished;  /* zt_now_s(): the first prompt's start, the last token */
    double first_token_s;      /* the first token of the run, since started; -1 before it */
    double ttft_sum_s;         /* each sequence's time from its admission to its first token, summed */
    int64_t sequences;         /* sequences that produced a first token */
    int64_t prompt_tokens, new_tokens;
    int32_t peak_concurrent;   /* the most sequences decoding at once */
    /* Where the wall time went: prompts run as they are admitted, and decode steps (each call's wall
     * time, host preparation and the GPU's work both: a call returns once its tokens are read back);
     * the rest is the host's work between calls (detokenizing, stops, the output file). */
    double prefill_s, decode_s;
    int64_t prefills, decode_steps;
} gen_stats;

/* Starts the clock. */
void gen_stats_begin(gen_stats *s);
/* A sequence admitted at `admitted` (zt_now_s()) has its first token now. */
void gen_stats_first_token(gen_stats *s, double admitted);

/* ---- the run (generate.c) ---------------------------------------------------------------------- */

#define MAX_STOP_IDS 12
#define MAX_STOP_TEXTS 16   /* --stop TEXT, at most this many (the template's answer suffix is one more) */
#define MAX_STOP_TEXT_BYTES 256

typedef struct gen_run {
    const zt_generate_options *o;
    const zt_generate_settings *s;
    zt_config *cfg;
    zt_host_settings settings; /* read from cfg once it is validated */
    zt_registry *reg;
    zt_plugin_set set;
    zt_runtime *rt;
    gen_model model;
    gen_tokenizer tok;
    int have_tok;
    zt_template tpl;
    int have_tpl;
    zt_ckpt *ckpt;
    char *ckpt_dir;
    zt_hf_model *hf;
    zt_l2c_model *l2c;
    char *data_path;           /* --data, or the checkpoint's data.path */
    manifest_info manifest;
    int have_manifest;
    zt_error manifest_err;     /* why the checkpoint's data set could not be read */
    int32_t stop_ids[MAX_STOP_IDS];
    int n_stop_ids;
    const char *stop_texts[MAX_STOP_TEXTS + 1]; /* the template's answer suffix (if any), then --stop */
    int n_stop_texts;
    gen_stats stats;
} gen_run;

/* --stats FILE (nothing without it): g->stats and the memory pools' peaks as one JSON object. */
zt_status gen_stats_write(gen_run *g, const gen_stats *s, zt_error *err);

int gen_is_stop_id(const gen_run *g, int32_t id);
/* The ids a sampler may draw: the model's vocabulary, or the tokenizer's when it is smaller (a
 * vocabulary padded for the kernels holds rows no text decodes to). */
int32_t gen_n_draw(const gen_run *g);
/* Where text[0, len) ends at the earliest stop text (the template's answer suffix, --stop, then the
 * n_extra of extra: a --prompts record's own) that begins at or after `from` (where the answer
 * starts): its offset, or len when none occurs. */
size_t gen_stop_text_at(const gen_run *g, char *const *extra, int n_extra, const char *text, size_t from, size_t len);
/* How many bytes at the end of text[from, len) begin a stop text (they may still become one). */
size_t gen_stop_text_tail(const gen_run *g, const char *text, size_t from, size_t len);
/* BOS (when the tokenizer has one) and the text: rendered as the template's user turn, or as it is
 * when raw. */
zt_status gen_encode_prompt(gen_run *g, const char *prompt, const char *input, int raw, int32_t **ids_out,
                            int32_t *n_out, int32_t *n_bos, zt_error *err);

/* ---- zt-run --generate --prompts (batch.c) ----------------------------------------------------- */

/* Every record of --prompts, continuously batched, answered into --output (docs/generate.md). */
zt_status gen_batch_run(gen_run *g, zt_error *err);

#endif
