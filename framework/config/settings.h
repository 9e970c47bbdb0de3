/* The host's settings: every host key (host_options.c, docs/config.md) read once, typed, right after
 * the run's config is validated, and handed to the trainer, the estimator, the schedule and the
 * runtime. Readers never fall back to a default of their own: the schema's default is the only one,
 * and a key that is unset where the schema has none (ZT_OPT_NO_DEFAULT) says so with a `has_` flag or
 * a NULL string.
 *
 * The keys that choose plugins (device, optimizer.type, zero_optimization.stage, the parallel sizes)
 * are also read before validation, by plugin selection (host/select.c): which plugins load decides
 * which schemas there are to validate against. The settings read them again, validated.
 */
#ifndef ZT_FRAMEWORK_SETTINGS_H
#define ZT_FRAMEWORK_SETTINGS_H

#include <stdint.h>

#include "base/error.h"
#include "config/config.h"

/* `device` */
enum { ZT_DEVICE_SETTING_AUTO = 0, ZT_DEVICE_SETTING_CPU = 1, ZT_DEVICE_SETTING_CUDA = 2 };
/* comm.backend: what carries a multi-rank run's collectives (host/runtime.c picks by it) */
enum { ZT_COMM_BACKEND_AUTO = 0, ZT_COMM_BACKEND_NCCL = 1, ZT_COMM_BACKEND_MPI = 2 };
/* `data.mode`; unset is ZT_DATA_MODE_MANIFEST: the layout zt-prep recorded (--pack or --pad) */
enum { ZT_DATA_MODE_MANIFEST = -1, ZT_DATA_MODE_PADDED = 0, ZT_DATA_MODE_PACKED = 1 };

/* scheduler.type and scheduler.params.*: the schedule's own settings (train/schedule.h turns them into
 * a schedule with the optimizer's learning rate). `given_*`: the user set the key, so a schedule that
 * does not use it can refuse it instead of ignoring it. */
typedef struct zt_schedule_settings {
    const char *type;                     /* "constant", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR" */
    int64_t warmup_num_steps;
    double warmup_min_lr;
    int32_t has_warmup_max_lr;            /* unset: the optimizer's lr */
    double warmup_max_lr;
    int32_t has_total_num_steps;          /* unset: steps */
    int64_t total_num_steps;
    double cos_min_ratio;
    int32_t given_warmup_num_steps, given_warmup_min_lr, given_total_num_steps, given_cos_min_ratio;
} zt_schedule_settings;

/* comms_logger.*: what the communication monitor logs (host/comm_monitor.h); it measures every
 * collective whatever these say. */
typedef struct zt_comms_logger_settings {
    int32_t enabled, verbose, prof_all, debug;
    const char *prof_ops; /* comma-separated names; "" for none */
} zt_comms_logger_settings;

typedef struct zt_host_settings {
    /* batch and steps (DeepSpeed's names) */
    int64_t micro_batch;         /* train_micro_batch_size_per_gpu */
    int64_t accum;               /* gradient_accumulation_steps */
    int32_t has_train_batch_size;
    int64_t train_batch_size;
    int64_t steps;
    int64_t epochs;              /* 0: not given (steps alone decide) */
    double clip;                 /* gradient_clipping; 0: off */
    int64_t seed;

    /* precision */
    int32_t bf16, fp16;          /* bf16.enabled, fp16.enabled (both true is refused) */
    int64_t fp16_scale_power, fp16_window, fp16_hysteresis;
    double fp16_min_scale;
    double fp16_static_scale;    /* fp16.loss_scale: 0 dynamic, else the static scale */
    int32_t fp16_consecutive_hysteresis;

    /* plugins chosen by the config */
    int32_t zero_stage;
    const char *optimizer_type;
    uint32_t no_decay_flags;     /* optimizer.no_decay as ZT_PARAM_NO_DECAY | ZT_PARAM_EMBEDDING */

    zt_schedule_settings schedule;

    /* model */
    int32_t recompute;
    const char *trainable_params; /* NULL: train everything */
    const char *freeze_include;   /* pet_config.freeze_include; NULL: none */
    const char *freeze_exclude;   /* pet_config.freeze_exclude; NULL: none */

    /* data */
    const char *data_path;       /* NULL: not given (a dry run needs none) */
    int32_t data_mode;           /* ZT_DATA_MODE_* */
    int64_t seq_len;
    int32_t shuffle;

    /* evaluation, checkpoints, logging, output */
    int64_t eval_every, eval_batches;
    int64_t checkpoint_every, checkpoint_keep;
    int32_t checkpoint_final;
    int32_t checkpoint_only_trainable; /* checkpoint.only_trainable: no frozen weights in checkpoints */
    char checkpoint_dir[4096];   /* checkpoint.dir, else <output_dir>/checkpoints */
    int64_t log_every;           /* log.every, else steps_per_print (DeepSpeed's name), else log.every's default */
    int32_t wall_clock_breakdown;
    const char *output_dir;
    int32_t tensorboard;                  /* tensorboard.enabled */
    const char *tensorboard_output_path;  /* tensorboard.output_path ("": the current directory) */
    const char *tensorboard_job_name;     /* tensorboard.job_name */
    int64_t threads;             /* 0: one per online core */
    int64_t generate_max_seqs;   /* zt-run --generate --prompts: sequences decoded together */
    int32_t generate_device_sampling; /* generate.device_sampling: the GPU head samples */
    int32_t generate_cuda_graphs; /* generate.cuda_graphs: decode steps replay CUDA graphs */
    int32_t generate_warmup;     /* generate.warmup: a throw-away prompt before the clock starts (GPU) */
    uint64_t gpu_mem_limit;      /* 0: no cap */
    uint64_t gpu_context_reserve; /* what the process holds outside the pools (CUDA context, kernels) */
    int32_t device;              /* ZT_DEVICE_SETTING_* */

    /* parallelism (MindFormers' names) */
    int32_t has_data_parallel;   /* unset: the launch's rank count */
    int64_t data_parallel, model_parallel, pipeline_stage, micro_batch_num;
    int32_t auto_trans_ckpt;
    int32_t seq_parallel; /* parallel_config.use_seq_parallel: the model splits the sequence over "tp" */
    double comm_timeout_s;
    int comm_backend; /* ZT_COMM_BACKEND_* (comm.backend) */

    /* DeepSpeed's comms_logger block (docs/distributed.md, "Watching the collectives") */
    zt_comms_logger_settings comms_logger;
    int64_t flight_recorder_entries; /* comm.flight_recorder.entries */
} zt_host_settings;

/* Read every host key of a config that holds the host's schema (validated, or at least holding no
 * invalid host value). Checks that span keys: fp16 and bf16 both set true, fp16.min_loss_scale above
 * the initial scale, optimizer.no_decay's groups, and paths that would not fit. Strings point into
 * cfg and live as long as it. */
zt_status zt_host_settings_read(const zt_config *cfg, zt_host_settings *out, zt_error *err);

/* The data-parallel size of a job of `world_size` ranks: parallel_config.data_parallel when set, else the
 * ranks left once tensor and pipeline parallelism (model_parallel x pipeline_stage) have taken theirs. The
 * one place that says it: DeepSpeed's batch rule (config/deepspeed.h) and the estimate use it. */
int64_t zt_data_parallel_size(const zt_host_settings *s, int64_t world_size);

/* parallel_config.micro_batch_num set without gradient_accumulation_steps: record the accumulation it
 * gives in cfg (before DeepSpeed's batch rule reads it), from settings read from cfg. */
zt_status zt_micro_batch_num_apply(zt_config *cfg, const zt_host_settings *s, zt_error *err);

/* The settings of a config with nothing but the host's schema at its defaults: for runtimes made
 * without a run config (zt-run --list-plugins, --env, probing in a child). */
zt_status zt_host_settings_defaults(zt_host_settings *out, zt_error *err);

/* The cap on zt's device pools: gpu_mem_limit less gpu_context_reserve (what the process holds outside
 * the pools), so a run under --gpu-mem-limit 24G fits a 24 GiB card whole; 0 (no cap) without a limit.
 * zt_host_settings_read refuses a limit at or below the reserve. */
static inline uint64_t zt_device_pool_limit(const zt_host_settings *s)
{
    return s->gpu_mem_limit > s->gpu_context_reserve ? s->gpu_mem_limit - s->gpu_context_reserve : 0;
}

#endif
