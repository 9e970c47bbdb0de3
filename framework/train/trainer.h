/* The training loop behind `zt-run` (docs/training.md is the user's guide).
 *
 * One optimizer step:
 *   1. take gradient_accumulation_steps micro-batches from the loader and count the loss tokens of
 *      all of them on all data-parallel ranks (an all-reduce), so every micro-batch's loss is divided
 *      by the loss-token count of the WHOLE global batch: the step's loss is the mean over its loss
 *      tokens (transformers' semantics for labels of -100) however the batch is split into
 *      micro-batches and ranks;
 *   2. per micro-batch: units forward (zero.before_unit -> model.forward -> zero.after_unit), the last
 *      unit giving the loss; units backward in reverse (zero.before_unit -> model.backward ->
 *      zero.grads_ready -> zero.after_unit). The host keeps every unit's input (one [B, T, hidden]
 *      buffer per unit boundary, pool activations) and two gradient buffers;
 *   3. zero.step with the schedule's learning rate and gradient_clipping, then zero.zero_grad.
 * Then the log line and a metrics.jsonl record, evaluation every eval.every steps, and a checkpoint
 * every checkpoint.every steps and at the end.
 *
 * Checkpoints hold the fp32 weights and optimizer state as logical tensors with Hugging Face names,
 * the step, the loader position, the schedule and the resolved config. Resuming restores all of it,
 * so on the CPU the resumed run computes exactly (bit for bit) what the uninterrupted run would have.
 * Ctrl-C (SIGINT or SIGTERM) finishes the current step, saves a checkpoint and returns
 * ZT_ERR_CANCELLED with a message saying how to resume (zt-run exits with status 130).
 */
#ifndef ZT_FRAMEWORK_TRAINER_H
#define ZT_FRAMEWORK_TRAINER_H

#include "base/error.h"
#include "config/config.h"
#include "config/settings.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "state/hf_model.h"

/* Call once every loaded plugin's schema is in cfg, instead of zt_config_validate. Validates cfg, then
 * completes it:
 *   - model_dir (--model, may be NULL): an HF LLaMA directory whose config.json gives the model.*
 *     keys (a model.* key the user set must agree with it; model.preset must not be set);
 *   - without model_dir and without a user-set model.vocab_size, model.vocab_size is the data set's
 *     tokenizer vocab_size (data.path/manifest.json);
 * and validates again. require_data 0 (a dry run) accepts a config without data.path: the model's
 * own keys (a preset or model.*) then give its sizes. */
zt_status zt_train_configure(zt_config *cfg, const char *model_dir, int require_data, zt_error *err);

typedef struct zt_train_request {
    zt_config *cfg;            /* validated by zt_train_configure */
    const zt_host_settings *settings; /* read from cfg after that validation */
    zt_plugin_set *plugins;    /* model, attention, optimizer, zero (and parallel) loaded and initialized */
    zt_runtime *rt;
    const char *plugins_json;  /* the "_plugins" of the resolved config */
    const char *resume;        /* NULL, "latest" (newest in checkpoint.dir), or a checkpoint directory
                                  (a step-NNNNNN directory, or a checkpoint root: its newest) */
    const char *model_dir;     /* NULL, or the HF directory to start from (fine-tuning) */
    const char *export_dir;    /* NULL, or where to write the trained model in HF format at the end */
    int export_dtype;          /* ZT_ST_F32, BF16 or F16; -1: auto (the --model's dtype, else bf16) */
    uint64_t export_shard_bytes; /* the largest weight file of the export; 0: 5 GB, as transformers */
    const char *adapter_dir;   /* NULL, or a peft adapter directory the adapter's parameters start from */
    const char *export_adapter_dir; /* NULL, or where to write the adapter as peft does at the end */
} zt_train_request;

/* Train. ZT_ERR_CANCELLED after a Ctrl-C (checkpoint saved; err says how to resume). On return the
 * plugins of req->plugins are finalized and unloaded, whatever the status: the zero plugin keeps
 * the parameter layout, which the trainer owns, until its fini. */
zt_status zt_train_run(const zt_train_request *req, zt_error *err);

#endif
