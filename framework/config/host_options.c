/* The host's own config keys. DeepSpeed's names are used wherever DeepSpeed has the concept (so a
 * ds_config.json works unchanged), MindFormers' names where only MindFormers has it (recompute,
 * parallel_config, auto_trans_ckpt), zt's own otherwise. docs/config.md documents every key; keep the
 * two in step. Plugins declare their own keys (optimizer.params.*, zero_optimization.offload_*, ...).
 */
#include <string.h>

#include "config/config_internal.h"

#define MIN_ONLY ZT_OPT_HAS_MIN
#define MIN_MAX (ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX)

/* Integer keys have sane maxima, far above any real run, so that a typo (an extra digit, a value
 * past 2^32) is a validation error naming the key instead of an out-of-memory report or a wrapped
 * product further on. docs/config.md lists them. These caps are told apart from the maxima that are
 * part of a key's meaning (data.seq_len's 1048576, zero_optimization.stage's 3, ...) by value
 * (cfg_host_option_capped), so they must differ from every such maximum of the table. */
#define MAX_BATCH 65536               /* sequences per micro-batch; micro-batches per step (the trainer
                                         holds them all) or in flight through a pipeline */
#define MAX_GLOBAL_BATCH 1073741824   /* 2^30 sequences per optimizer step */
#define MAX_STEPS 1000000000000.0     /* steps, every "every N steps" and every count of steps */
#define MAX_EPOCHS 1000000
#define MAX_HYSTERESIS 1000
#define MAX_EVAL_BATCHES 1000000
#define MAX_KEEP 1000000
#define MAX_THREADS 1024              /* the thread pool's own limit (base/threadpool.c) */
#define MAX_RANKS 65536               /* as zt-run --nproc */

static const char *const k_scheduler_types[] = {"constant", "WarmupLR", "WarmupDecayLR",
                                                "WarmupCosineLR", NULL};
static const char *const k_data_modes[] = {"packed", "padded", NULL};
static const char *const k_devices[] = {"auto", "cpu", "cuda", NULL};
static const char *const k_comm_backends[] = {"auto", "nccl", "mpi", NULL};

static const zt_option k_host_options[] = {
    /* ---- batch and steps (DeepSpeed names) ---- */
    {"train_micro_batch_size_per_gpu", ZT_OPT_INT, MIN_MAX, "4", 1, MAX_BATCH, NULL,
     "Sequences per micro-batch on each data-parallel rank (DeepSpeed's name)."},
    {"gradient_accumulation_steps", ZT_OPT_INT, MIN_MAX, "1", 1, MAX_BATCH, NULL,
     "Micro-batches whose gradients are summed before each optimizer step."},
    {"train_batch_size", ZT_OPT_INT, MIN_MAX | ZT_OPT_NO_DEFAULT, NULL, 1, MAX_GLOBAL_BATCH, NULL,
     "Global batch per optimizer step; when given it must equal train_micro_batch_size_per_gpu x "
     "gradient_accumulation_steps x parallel_config.data_parallel (as in DeepSpeed)."},
    {"steps", ZT_OPT_INT, MIN_MAX, "1000", 1, MAX_STEPS, NULL,
     "Optimizer steps to train (one step = gradient_accumulation_steps micro-batches)."},
    {"epochs", ZT_OPT_INT, MIN_MAX | ZT_OPT_NO_DEFAULT, NULL, 1, MAX_EPOCHS, NULL,
     "Passes over the data; when given, training stops after this many epochs or `steps`, whichever "
     "comes first."},
    {"gradient_clipping", ZT_OPT_FLOAT, MIN_ONLY, "1.0", 0, 0, NULL,
     "Clip the global gradient L2 norm to this value before each step; 0 disables clipping."},
    {"seed", ZT_OPT_INT, MIN_ONLY, "1234", 0, 0, NULL,
     "Seed for weight initialisation, data shuffling and dropout; the same seed gives the same run."},

    /* ---- precision (DeepSpeed names) ---- */
    {"bf16.enabled", ZT_OPT_BOOL, 0, "true", 0, 0, NULL,
     "Compute in bfloat16 with fp32 master weights on GPUs; ignored on the CPU, which computes in "
     "fp32. fp16.enabled true takes precedence over this default; both set true is an error."},
    {"fp16.enabled", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "GPUs: compute in float16 (IEEE half) with fp32 master weights and dynamic loss scaling; the "
     "CPU trains in fp32 and ignores it. Not with bf16.enabled set true. docs/cuda.md, \"fp16\"."},
    {"fp16.initial_scale_power", ZT_OPT_INT, MIN_MAX, "16", 0, 32, NULL,
     "fp16: the loss scale starts at 2^initial_scale_power."},
    {"fp16.loss_scale_window", ZT_OPT_INT, MIN_MAX, "1000", 1, MAX_STEPS, NULL,
     "fp16: consecutive steps without overflow after which the loss scale is doubled."},
    {"fp16.hysteresis", ZT_OPT_INT, MIN_MAX, "2", 1, MAX_HYSTERESIS, NULL,
     "fp16: consecutive overflowing steps (skipped) before the loss scale is halved; once halved, "
     "each further overflow halves it until a step succeeds."},
    {"fp16.min_loss_scale", ZT_OPT_FLOAT, MIN_ONLY | ZT_OPT_MIN_OPEN, "1", 0, 0, NULL,
     "fp16: the loss scale never drops below this value; 2 x hysteresis overflowing steps in a row "
     "at it stop training with an error (the scale has collapsed)."},
    {"fp16.loss_scale", ZT_OPT_FLOAT, MIN_ONLY, "0", 0, 0, NULL,
     "fp16: 0 scales the loss dynamically (the keys above); a positive value is a static loss scale, "
     "never changed (overflowing steps are still skipped)."},
    {"fp16.consecutive_hysteresis", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "fp16: true restores the hysteresis after every step without overflow; false (DeepSpeed's default) "
     "only when the loss scale is raised after loss_scale_window good steps."},

    /* ---- plugins chosen by the config ---- */
    {"zero_optimization.stage", ZT_OPT_INT, MIN_MAX, "0", 0, 3, NULL,
     "ZeRO stage 0-3: selects the plugin zero0..zero3 (0: replicated optimizer state, 1: partitioned "
     "optimizer state, 2: + gradients, 3: + parameters)."},
    {"optimizer.no_decay", ZT_OPT_STRING, 0, "norms", 0, 0, NULL,
     "parameter groups excluded from weight decay, comma-separated: norms (RMSNorm weights, as the HF Trainer), embeddings (the token embedding and a tied LM head); \"\" decays every parameter (as torch.optim.AdamW(model.parameters()))"},
    {"optimizer.type", ZT_OPT_STRING, 0, "adamw", 0, 0, NULL,
     "Optimizer plugin to load, by name (e.g. adamw, lion; zt-run --list-plugins shows them)."},

    /* ---- learning-rate schedule (DeepSpeed names) ---- */
    {"scheduler.type", ZT_OPT_ENUM, 0, "WarmupCosineLR", 0, 0, k_scheduler_types,
     "Learning-rate schedule: constant, WarmupLR (warm up, then constant), WarmupDecayLR (warm up, "
     "then linear decay to 0), WarmupCosineLR (warm up, then cosine decay to cos_min_ratio x peak)."},
    {"scheduler.params.warmup_num_steps", ZT_OPT_INT, MIN_MAX, "0", 0, MAX_STEPS, NULL,
     "Optimizer steps of linear warm-up."},
    {"scheduler.params.warmup_min_lr", ZT_OPT_FLOAT, MIN_ONLY, "0", 0, 0, NULL,
     "Learning rate at the start of warm-up."},
    {"scheduler.params.warmup_max_lr", ZT_OPT_FLOAT, MIN_ONLY | ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "Peak learning rate reached after warm-up; unset: the optimizer's lr (optimizer.params.lr)."},
    {"scheduler.params.total_num_steps", ZT_OPT_INT, MIN_MAX | ZT_OPT_NO_DEFAULT, NULL, 1, MAX_STEPS, NULL,
     "Steps over which the schedule decays; unset: `steps`."},
    {"scheduler.params.cos_min_ratio", ZT_OPT_FLOAT, MIN_MAX, "0.1", 0, 1, NULL,
     "WarmupCosineLR: the final learning rate as a fraction of the peak."},

    /* ---- model (MindFormers names) ---- */
    {"recompute", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "Activation checkpointing: recompute activations in the backward pass to save memory "
     "(MindFormers' name)."},
    {"trainable_params", ZT_OPT_STRING, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "Parameter-name patterns to train, a list or comma-separated (MindFormers style: [layers.31, layers.30], "
     "\"q_proj,v_proj\", \"*.mlp.*\"); all other parameters are frozen and cost only their compute copy. "
     "Unset: train everything."},
    {"pet_config.freeze_include", ZT_OPT_STRING, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "MindFormers' freeze list: parameter-name patterns (a list or comma-separated) to freeze, applied after "
     "trainable_params."},
    {"pet_config.freeze_exclude", ZT_OPT_STRING, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "MindFormers' freeze exceptions: patterns kept trainable; a parameter both freeze lists match is left "
     "as trainable_params says."},

    /* ---- data ---- */
    {"data.path", ZT_OPT_STRING, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "Directory of tokenized shards written by zt-prep."},
    {"data.mode", ZT_OPT_ENUM, 0, "packed", 0, 0, k_data_modes,
     "packed: concatenate samples into full rows of seq_len tokens (attention stays within each "
     "sample); padded: one sample per row, padded to seq_len."},
    {"data.seq_len", ZT_OPT_INT, MIN_MAX, "512", 16, 1048576, NULL,
     "Tokens per training row."},
    {"data.shuffle", ZT_OPT_BOOL, 0, "true", 0, 0, NULL,
     "Shuffle the sample order every epoch (seeded by `seed`)."},

    /* ---- evaluation, checkpoints, logging, output ---- */
    {"eval.every", ZT_OPT_INT, MIN_MAX, "0", 0, MAX_STEPS, NULL,
     "Evaluate on the held-out split every N optimizer steps; 0: never."},
    {"eval.batches", ZT_OPT_INT, MIN_MAX, "16", 1, MAX_EVAL_BATCHES, NULL,
     "Micro-batches per evaluation."},
    {"checkpoint.every", ZT_OPT_INT, MIN_MAX, "0", 0, MAX_STEPS, NULL,
     "Save a checkpoint every N optimizer steps; 0: only at the end."},
    {"checkpoint.dir", ZT_OPT_STRING, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "Where checkpoints go; unset: <output_dir>/checkpoints."},
    {"checkpoint.keep", ZT_OPT_INT, MIN_MAX, "3", 1, MAX_KEEP, NULL,
     "Keep the newest N checkpoints and delete older ones."},
    {"checkpoint.final", ZT_OPT_BOOL, 0, "true", 0, 0, NULL,
     "Save a checkpoint when training ends; false skips it (benchmarks, throwaway runs). An "
     "interrupted run (Ctrl-C) saves one either way."},
    {"checkpoint.only_trainable", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "Checkpoints hold only the trainable state: the trainable parameters and their optimizer state, "
     "not the frozen weights, which a resume reads again from --model BASE (checked by a hash of "
     "them). Needs --model. MindFormers' only_trainable_params."},
    {"log.every", ZT_OPT_INT, MIN_MAX, "1", 1, MAX_STEPS, NULL,
     "Log loss, learning rate and throughput every N optimizer steps."},
    {"steps_per_print", ZT_OPT_INT, MIN_MAX | ZT_OPT_NO_DEFAULT, NULL, 1, MAX_STEPS, NULL,
     "DeepSpeed's name of log.every: log every N optimizer steps (log.every, when also given, must agree)."},
    {"wall_clock_breakdown", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "Log the time of the step's forward, backward and optimizer step with each log line; GPU runs "
     "synchronize the device at each boundary to measure them (as DeepSpeed's timers do), which costs "
     "the overlap of those phases."},
    {"output_dir", ZT_OPT_STRING, 0, "out", 0, 0, NULL,
     "Directory for the run's outputs (config.resolved.json, final weights, logs)."},
    {"tensorboard.enabled", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "Write TensorBoard event files of the run's scalars (rank 0) into tensorboard.output_path/"
     "tensorboard.job_name (DeepSpeed's monitor; docs/training.md, \"TensorBoard\")."},
    {"tensorboard.output_path", ZT_OPT_STRING, 0, "", 0, 0, NULL,
     "Directory holding the job's event-file directory; \"\": the current directory (as DeepSpeed)."},
    {"tensorboard.job_name", ZT_OPT_STRING, 0, "DeepSpeedJobName", 0, 0, NULL,
     "The event files' directory under tensorboard.output_path: one TensorBoard run."},
    {"threads", ZT_OPT_INT, MIN_MAX, "0", 0, MAX_THREADS, NULL,
     "CPU worker threads; 0: one per online core."},
    {"generate.max_seqs", ZT_OPT_INT, MIN_MAX, "8", 1, 4096, NULL,
     "zt-run --generate --prompts: the most sequences decoded together (continuous batching); the "
     "attention plugin's KV cache may hold fewer (docs/generate.md)."},
    {"generate.device_sampling", ZT_OPT_BOOL, 0, "true", 0, 0, NULL,
     "zt-run --generate on a GPU: sample on the device (the LM head's forward), copying back one token "
     "per sequence instead of the logits; false: the host sampler (the same tokens for the same seed)."},
    {"generate.cuda_graphs", ZT_OPT_BOOL, 0, "true", 0, 0, NULL,
     "zt-run --generate on a GPU: capture each batch size's one-token decode step in a CUDA graph and "
     "replay it (one launch instead of hundreds); false: launch every kernel each step (the same "
     "tokens)."},
    {"generate.warmup", ZT_OPT_BOOL, 0, "true", 0, 0, NULL,
     "zt-run --generate on a GPU: before the clock starts, run one throw-away prompt and three decode "
     "steps (kernel loading, GEMM algorithm choice, memory pool growth, the batch-1 CUDA graph), as "
     "the PyTorch peer's untimed calls and vLLM's start-up do; false: the first record pays for them."},
    {"gpu_mem_limit", ZT_OPT_BYTES, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "Make each GPU behave like a card of this size, e.g. \"24GiB\": zt's pools get it less "
     "gpu_context_reserve; unset: no cap."},
    {"gpu_context_reserve", ZT_OPT_BYTES, 0, "1610612736", 0, 0, NULL,
     "GPU memory a process holds outside zt's pools (the CUDA context, loaded kernels, library "
     "workspaces; 1.0-1.3 GiB measured on an H200 with CUDA 13), counted against gpu_mem_limit or the "
     "GPU's memory by the dry run and the allocator. Default 1.5 GiB."},
    {"device", ZT_OPT_ENUM, 0, "auto", 0, 0, k_devices,
     "Where training computes: cpu (fp32), cuda (bf16 on the GPU, fp32 master weights), or auto: cuda "
     "when a GPU is present and every plugin of the run can run on it, else cpu (docs/gpu.md)."},

    /* ---- parallelism (MindFormers names) ---- */
    {"parallel_config.data_parallel", ZT_OPT_INT, MIN_MAX, "1", 1, MAX_RANKS, NULL,
     "Data-parallel ranks (model replicas); when not given, the number of launched ranks."},
    {"parallel_config.model_parallel", ZT_OPT_INT, MIN_MAX, "1", 1, MAX_RANKS, NULL,
     "Tensor-parallel ranks each layer is split across."},
    {"parallel_config.pipeline_stage", ZT_OPT_INT, MIN_MAX, "1", 1, MAX_RANKS, NULL,
     "Pipeline stages the layers are split into."},
    {"parallel_config.use_seq_parallel", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "Sequence parallelism with tensor parallelism: norms and residual adds on each tensor rank's share of "
     "the micro-batch's tokens (docs/parallel.md); no effect with model_parallel 1."},
    {"parallel_config.micro_batch_num", ZT_OPT_INT, MIN_MAX, "1", 1, MAX_BATCH, NULL,
     "Micro-batches in flight through the pipeline per step."},
    {"auto_trans_ckpt", ZT_OPT_BOOL, 0, "true", 0, 0, NULL,
     "Convert a checkpoint saved under another parallel layout when loading it (MindFormers' name)."},

    /* ---- DeepSpeed keys accepted without effect (config/deepspeed.c says why, in the run's notes) ---- */
    {"zero_allow_untested_optimizer", ZT_OPT_BOOL, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "DeepSpeed: no effect in zt, which has no list of tested optimizers to bypass."},
    {"zero_optimization.round_robin_gradients", ZT_OPT_BOOL, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "DeepSpeed: no effect in zt, whose offload copies each unit's gradient shard as its reduction ends."},
    {"zero_optimization.sub_group_size", ZT_OPT_INT, MIN_ONLY | ZT_OPT_NO_DEFAULT, NULL, 1, 0, NULL,
     "DeepSpeed: no effect in zt, which steps the optimizer one unit (a layer) at a time."},
    {"zero_optimization.stage3_param_persistence_threshold", ZT_OPT_INT, MIN_ONLY | ZT_OPT_NO_DEFAULT, NULL, 0, 0,
     NULL, "DeepSpeed: no effect in zt, which gathers a unit's parameters, small ones included, in one "
     "all-gather."},
    {"zero_optimization.stage3_max_reuse_distance", ZT_OPT_INT, MIN_ONLY | ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL,
     "DeepSpeed: no effect in zt, which releases a unit's gathered parameters right after its use."},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", ZT_OPT_BOOL, ZT_OPT_NO_DEFAULT, NULL, 0, 0,
     NULL, "DeepSpeed: no effect in zt: --export always gathers the shards into one model."},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", ZT_OPT_BOOL, ZT_OPT_NO_DEFAULT, NULL, 0, 0,
     NULL, "DeepSpeed (the older name): no effect in zt: --export always gathers the shards into one model."},
    {"comm.backend", ZT_OPT_ENUM, 0, "auto", 0, 0, k_comm_backends,
     "Multi-rank runs: what carries the collectives. auto: NCCL for GPU ranks, MPI for CPU ranks; mpi on "
     "GPU ranks stages every buffer through host memory (slow: for machines without NCCL, or several ranks "
     "sharing one GPU, which NCCL refuses); nccl on CPU ranks is an error (docs/distributed.md)."},
    {"comm.timeout_s", ZT_OPT_FLOAT, MIN_ONLY, "300", 0, 0, NULL,
     "Multi-rank runs: a collective not completed after this many seconds ends every rank with a "
     "message naming it, instead of hanging; 0 waits forever (docs/distributed.md)."},

    /* ---- communication logging (DeepSpeed's comms_logger; docs/distributed.md) ---- */
    {"comms_logger.enabled", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "Log the run's collectives: the end-of-run table shows the profiled ones (prof_all, prof_ops), "
     "with verbose every call as it completes, with debug the caller of each. The per-step figures of "
     "metrics.jsonl are measured either way."},
    {"comms_logger.verbose", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "comms_logger: log every profiled collective as it completes (op, group, bytes, time, algbw, busbw)."},
    {"comms_logger.prof_all", ZT_OPT_BOOL, 0, "true", 0, 0, NULL,
     "comms_logger: profile every kind of collective; false: only those in prof_ops."},
    {"comms_logger.prof_ops", ZT_OPT_STRING, 0, "", 0, 0, NULL,
     "comms_logger with prof_all false: the collectives to profile, a list (JSON array or "
     "comma-separated) of all_reduce, reduce_scatter, all_gather, broadcast, send, recv."},
    {"comms_logger.debug", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "comms_logger: name the caller (the plugin, or zt for the host) of every logged collective, and "
     "give each caller its own rows in the end-of-run table."},
    {"comm.flight_recorder.entries", ZT_OPT_INT, MIN_MAX, "256", 0, 1048576, NULL,
     "The flight recorder: each rank keeps its last this many collectives, and writes them to a dump on a "
     "watchdog timeout, a fatal signal or an interrupt; 0 turns it off (docs/distributed.md)."},
};

int cfg_host_option_capped(const zt_option *opt)
{
    static const double caps[] = {MAX_BATCH, MAX_GLOBAL_BATCH, MAX_STEPS, MAX_EPOCHS, MAX_HYSTERESIS,
                                  MAX_EVAL_BATCHES, MAX_KEEP, MAX_THREADS, MAX_RANKS};
    size_t n = sizeof k_host_options / sizeof k_host_options[0];
    if (opt->type == ZT_OPT_STRING && (opt->flags & ZT_OPT_LIST)) return 1; /* a plugin's list key */
    if (opt < k_host_options || opt >= k_host_options + n || opt->type != ZT_OPT_INT || !(opt->flags & ZT_OPT_HAS_MAX))
        return 0;
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++)
        if (opt->max == caps[i]) return 1;
    return 0;
}

const char *cfg_host_option_list_item(const zt_option *opt)
{
    static const struct { const char *key, *item; } lists[] = {
        {"trainable_params", "parameter-name pattern"},
        {"pet_config.freeze_include", "parameter-name pattern"},
        {"pet_config.freeze_exclude", "parameter-name pattern"},
        {"comms_logger.prof_ops", "collective name"},
    };
    size_t n = sizeof k_host_options / sizeof k_host_options[0];
    if (opt && opt->type == ZT_OPT_STRING && (opt->flags & ZT_OPT_LIST)) return "name"; /* a plugin's list key */
    if (opt < k_host_options || opt >= k_host_options + n || opt->type != ZT_OPT_STRING) return NULL;
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++)
        if (!strcmp(opt->key, lists[i].key)) return lists[i].item;
    return NULL;
}

const zt_option *zt_host_options(uint32_t *n)
{
    *n = (uint32_t)(sizeof k_host_options / sizeof k_host_options[0]);
    return k_host_options;
}
