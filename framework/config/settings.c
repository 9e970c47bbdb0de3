/* The host's settings, read once from the validated config (settings.h). */
#include "config/settings.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "zt/zt_model.h"

/* Each getter below reads a key of the host's own schema, which has a default or is reported unset:
 * a failure means the host's schema is not in cfg, or the value is invalid and validation was
 * skipped; both are zt bugs, not user errors. */
static zt_status missing(const char *key, zt_status st, zt_error *err)
{
    return zt_error_set(err, ZT_ERR_INTERNAL,
                        "the host key %s cannot be read (%s): the settings were read from a config without the "
                        "host's schema, or before validation (a zt bug)",
                        key, zt_status_name(st));
}

#define READ(getter, key, out)                                                                                   \
    do {                                                                                                         \
        zt_status read_st_ = getter(cfg, key, out);                                                              \
        if (read_st_ != ZT_OK) return missing(key, read_st_, err);                                               \
    } while (0)

/* A ZT_OPT_NO_DEFAULT key: *has 0 when unset. */
#define READ_OPTIONAL(getter, key, has, out)                                                                     \
    do {                                                                                                         \
        zt_status read_st_ = getter(cfg, key, out);                                                              \
        *(has) = read_st_ == ZT_OK;                                                                              \
        if (read_st_ != ZT_OK && read_st_ != ZT_ERR_NOT_FOUND) return missing(key, read_st_, err);              \
    } while (0)

static zt_status read_bool(const zt_config *cfg, const char *key, int32_t *out)
{
    return zt_config_get_bool(cfg, key, out);
}

/* optimizer.no_decay: which ZT_PARAM_* groups get no weight decay. */
static zt_status parse_no_decay(const char *list, uint32_t *flags, zt_error *err)
{
    *flags = 0;
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n == 5 && !strncmp(p, "norms", 5)) *flags |= ZT_PARAM_NO_DECAY;
        else if (n == 10 && !strncmp(p, "embeddings", 10)) *flags |= ZT_PARAM_EMBEDDING;
        else
            return zt_error_set(err, ZT_ERR_CONFIG,
                                "optimizer.no_decay \"%s\": \"%.*s\" is not a parameter group; use a comma-separated "
                                "list of norms and embeddings, or \"\" to decay every parameter",
                                list, (int)n, p);
        p += n;
        if (*p == ',') p++;
    }
    return ZT_OK;
}

static zt_status read_schedule(const zt_config *cfg, zt_schedule_settings *s, zt_error *err)
{
    READ(zt_config_get_string, "scheduler.type", &s->type);
    READ(zt_config_get_int, "scheduler.params.warmup_num_steps", &s->warmup_num_steps);
    READ(zt_config_get_float, "scheduler.params.warmup_min_lr", &s->warmup_min_lr);
    READ_OPTIONAL(zt_config_get_float, "scheduler.params.warmup_max_lr", &s->has_warmup_max_lr, &s->warmup_max_lr);
    READ_OPTIONAL(zt_config_get_int, "scheduler.params.total_num_steps", &s->has_total_num_steps,
                  &s->total_num_steps);
    READ(zt_config_get_float, "scheduler.params.cos_min_ratio", &s->cos_min_ratio);
    s->given_warmup_num_steps = zt_config_is_set(cfg, "scheduler.params.warmup_num_steps");
    s->given_warmup_min_lr = zt_config_is_set(cfg, "scheduler.params.warmup_min_lr");
    s->given_total_num_steps = zt_config_is_set(cfg, "scheduler.params.total_num_steps");
    s->given_cos_min_ratio = zt_config_is_set(cfg, "scheduler.params.cos_min_ratio");
    return ZT_OK;
}

zt_status zt_host_settings_read(const zt_config *cfg, zt_host_settings *s, zt_error *err)
{
    memset(s, 0, sizeof *s);
    int32_t has;
    READ(zt_config_get_int, "train_micro_batch_size_per_gpu", &s->micro_batch);
    READ(zt_config_get_int, "gradient_accumulation_steps", &s->accum);
    READ_OPTIONAL(zt_config_get_int, "train_batch_size", &s->has_train_batch_size, &s->train_batch_size);
    READ(zt_config_get_int, "steps", &s->steps);
    READ_OPTIONAL(zt_config_get_int, "epochs", &has, &s->epochs);
    READ(zt_config_get_float, "gradient_clipping", &s->clip);
    READ(zt_config_get_int, "seed", &s->seed);

    READ(read_bool, "bf16.enabled", &s->bf16);
    READ(read_bool, "fp16.enabled", &s->fp16);
    READ(zt_config_get_int, "fp16.initial_scale_power", &s->fp16_scale_power);
    READ(zt_config_get_int, "fp16.loss_scale_window", &s->fp16_window);
    READ(zt_config_get_int, "fp16.hysteresis", &s->fp16_hysteresis);
    READ(zt_config_get_float, "fp16.min_loss_scale", &s->fp16_min_scale);
    READ(zt_config_get_float, "fp16.loss_scale", &s->fp16_static_scale);
    READ(read_bool, "fp16.consecutive_hysteresis", &s->fp16_consecutive_hysteresis);
    /* bf16.enabled defaults to true: only an explicit true next to fp16 is a contradiction */
    if (s->fp16 && s->bf16 && zt_config_is_set(cfg, "bf16.enabled"))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "fp16.enabled and bf16.enabled are both true; pick one precision: set bf16.enabled to "
                            "false for fp16 with loss scaling, or fp16.enabled to false for bf16 (recommended on "
                            "GPUs that have it: no loss scaling needed)");
    if (s->fp16 && !s->fp16_static_scale && ldexp(1.0, (int)s->fp16_scale_power) < s->fp16_min_scale)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "fp16.min_loss_scale is %g, above the initial loss scale 2^%lld = %g; lower "
                            "fp16.min_loss_scale or raise fp16.initial_scale_power",
                            s->fp16_min_scale, (long long)s->fp16_scale_power, ldexp(1.0, (int)s->fp16_scale_power));

    int64_t stage;
    READ(zt_config_get_int, "zero_optimization.stage", &stage);
    s->zero_stage = (int32_t)stage;
    READ(zt_config_get_string, "optimizer.type", &s->optimizer_type);
    const char *no_decay;
    READ(zt_config_get_string, "optimizer.no_decay", &no_decay);
    zt_status st = parse_no_decay(no_decay, &s->no_decay_flags, err);
    if (st != ZT_OK) return st;

    st = read_schedule(cfg, &s->schedule, err);
    if (st != ZT_OK) return st;

    READ(read_bool, "recompute", &s->recompute);
    READ_OPTIONAL(zt_config_get_string, "trainable_params", &has, &s->trainable_params);
    READ_OPTIONAL(zt_config_get_string, "pet_config.freeze_include", &has, &s->freeze_include);
    READ_OPTIONAL(zt_config_get_string, "pet_config.freeze_exclude", &has, &s->freeze_exclude);

    READ_OPTIONAL(zt_config_get_string, "data.path", &has, &s->data_path);
    /* data.mode unset: the layout the data set was written in (its schema default is only what
     * --describe shows; docs/training.md) */
    const char *mode;
    READ(zt_config_get_string, "data.mode", &mode);
    s->data_mode = !zt_config_is_set(cfg, "data.mode") ? ZT_DATA_MODE_MANIFEST
                   : !strcmp(mode, "packed")           ? ZT_DATA_MODE_PACKED
                                                       : ZT_DATA_MODE_PADDED;
    READ(zt_config_get_int, "data.seq_len", &s->seq_len);
    READ(read_bool, "data.shuffle", &s->shuffle);

    READ(zt_config_get_int, "eval.every", &s->eval_every);
    READ(zt_config_get_int, "eval.batches", &s->eval_batches);
    READ(zt_config_get_int, "checkpoint.every", &s->checkpoint_every);
    READ(zt_config_get_int, "checkpoint.keep", &s->checkpoint_keep);
    READ(read_bool, "checkpoint.final", &s->checkpoint_final);
    READ(read_bool, "checkpoint.only_trainable", &s->checkpoint_only_trainable);
    READ(zt_config_get_int, "log.every", &s->log_every);
    int64_t steps_per_print;
    READ_OPTIONAL(zt_config_get_int, "steps_per_print", &has, &steps_per_print);
    if (has && zt_config_is_set(cfg, "log.every") && steps_per_print != s->log_every)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "log.every is %lld but steps_per_print (DeepSpeed's name of the same setting) is %lld; "
                            "give one of them, or the same value to both",
                            (long long)s->log_every, (long long)steps_per_print);
    if (has) s->log_every = steps_per_print;
    READ(read_bool, "wall_clock_breakdown", &s->wall_clock_breakdown);
    READ(zt_config_get_string, "output_dir", &s->output_dir);
    /* Room for the names joined to it (checkpoints/step-NNNNNN/..., config.resolved.json). */
    if (!s->output_dir[0] || strlen(s->output_dir) > 4000)
        return zt_error_set(err, ZT_ERR_CONFIG, "output_dir \"%.100s\" is empty or longer than 4000 bytes",
                            s->output_dir);
    const char *dir;
    READ_OPTIONAL(zt_config_get_string, "checkpoint.dir", &has, &dir);
    int n = has ? snprintf(s->checkpoint_dir, sizeof s->checkpoint_dir, "%s", dir)
                : snprintf(s->checkpoint_dir, sizeof s->checkpoint_dir, "%s/checkpoints", s->output_dir);
    if (n < 0 || n >= (int)sizeof s->checkpoint_dir)
        return zt_error_set(err, ZT_ERR_CONFIG, "checkpoint.dir (or output_dir) is longer than %zu bytes",
                            sizeof s->checkpoint_dir - 1);
    READ(read_bool, "tensorboard.enabled", &s->tensorboard);
    READ(zt_config_get_string, "tensorboard.output_path", &s->tensorboard_output_path);
    READ(zt_config_get_string, "tensorboard.job_name", &s->tensorboard_job_name);
    READ(zt_config_get_int, "threads", &s->threads);
    READ(zt_config_get_int, "generate.max_seqs", &s->generate_max_seqs);
    READ(read_bool, "generate.device_sampling", &s->generate_device_sampling);
    READ(read_bool, "generate.cuda_graphs", &s->generate_cuda_graphs);
    READ(read_bool, "generate.warmup", &s->generate_warmup);
    int64_t limit = 0;
    READ_OPTIONAL(zt_config_get_int, "gpu_mem_limit", &has, &limit);
    s->gpu_mem_limit = has && limit > 0 ? (uint64_t)limit : 0;
    int64_t reserve = 0;
    READ(zt_config_get_int, "gpu_context_reserve", &reserve);
    s->gpu_context_reserve = (uint64_t)reserve;
    if (s->gpu_mem_limit && s->gpu_mem_limit <= s->gpu_context_reserve)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "gpu_mem_limit (%lld bytes) leaves nothing for zt's pools after gpu_context_reserve "
                            "(%lld bytes, the CUDA context and kernels outside the pools): give the card's whole "
                            "memory as the limit (e.g. --gpu-mem-limit 24G), or lower gpu_context_reserve",
                            (long long)s->gpu_mem_limit, (long long)s->gpu_context_reserve);
    const char *device;
    READ(zt_config_get_string, "device", &device);
    s->device = !strcmp(device, "cpu") ? ZT_DEVICE_SETTING_CPU
                : !strcmp(device, "cuda") ? ZT_DEVICE_SETTING_CUDA
                                          : ZT_DEVICE_SETTING_AUTO;

    READ(zt_config_get_int, "parallel_config.data_parallel", &s->data_parallel);
    s->has_data_parallel = zt_config_is_set(cfg, "parallel_config.data_parallel");
    READ(zt_config_get_int, "parallel_config.model_parallel", &s->model_parallel);
    READ(zt_config_get_int, "parallel_config.pipeline_stage", &s->pipeline_stage);
    READ(read_bool, "parallel_config.use_seq_parallel", &s->seq_parallel);
    READ(zt_config_get_int, "parallel_config.micro_batch_num", &s->micro_batch_num);
    /* micro_batch_num (MindFormers) is the pipeline's micro-batches per step; without a pipeline it means
     * what gradient_accumulation_steps means: both count the micro-batches of one optimizer step. Set
     * alone, it gives the other; set both, they must agree; except that without a pipeline
     * micro_batch_num = 1, the value MindFormers' configs carry when they do not pipeline (the seed's
     * among them), leaves gradient_accumulation_steps as it is (docs/parallel.md). */
    int given_mbn = zt_config_is_set(cfg, "parallel_config.micro_batch_num");
    int given_accum = zt_config_is_set(cfg, "gradient_accumulation_steps");
    int mbn_counts = s->pipeline_stage > 1 || s->micro_batch_num > 1 || !given_accum;
    if (given_mbn && mbn_counts) {
        if (given_accum && s->accum != s->micro_batch_num)
            return zt_error_set(err, ZT_ERR_CONFIG,
                                "parallel_config.micro_batch_num is %lld but gradient_accumulation_steps is %lld: "
                                "both count the micro-batches of one optimizer step (with a pipeline, its "
                                "micro-batches); set them to the same value, or remove one",
                                (long long)s->micro_batch_num, (long long)s->accum);
        s->accum = s->micro_batch_num;
    }
    READ(read_bool, "auto_trans_ckpt", &s->auto_trans_ckpt);
    READ(zt_config_get_float, "comm.timeout_s", &s->comm_timeout_s);
    const char *backend;
    READ(zt_config_get_string, "comm.backend", &backend);
    s->comm_backend = !strcmp(backend, "mpi") ? ZT_COMM_BACKEND_MPI
                      : !strcmp(backend, "nccl") ? ZT_COMM_BACKEND_NCCL
                                                 : ZT_COMM_BACKEND_AUTO;
    READ(read_bool, "comms_logger.enabled", &s->comms_logger.enabled);
    READ(read_bool, "comms_logger.verbose", &s->comms_logger.verbose);
    READ(read_bool, "comms_logger.prof_all", &s->comms_logger.prof_all);
    READ(read_bool, "comms_logger.debug", &s->comms_logger.debug);
    READ(zt_config_get_string, "comms_logger.prof_ops", &s->comms_logger.prof_ops);
    READ(zt_config_get_int, "comm.flight_recorder.entries", &s->flight_recorder_entries);
    return ZT_OK;
}

zt_status zt_micro_batch_num_apply(zt_config *cfg, const zt_host_settings *s, zt_error *err)
{
    if (!zt_config_is_set(cfg, "parallel_config.micro_batch_num") || zt_config_is_set(cfg, "gradient_accumulation_steps"))
        return ZT_OK;
    return zt_config_put_int(cfg, "gradient_accumulation_steps", s->micro_batch_num,
                             "parallel_config.micro_batch_num (MindFormers: the micro-batches of one step)",
                             ZT_CONFIG_RANK_FILE, err);
}

int64_t zt_data_parallel_size(const zt_host_settings *s, int64_t world_size)
{
    if (s->has_data_parallel) return s->data_parallel;
    int64_t other = s->model_parallel * s->pipeline_stage;
    return other > 0 && world_size >= other ? world_size / other : 1;
}

/* One config holding only the host's schema, made once and kept for the process: the defaults'
 * strings point into it. */
static zt_config *g_defaults;
static zt_status g_defaults_status = ZT_ERR_INTERNAL;
static pthread_once_t g_defaults_once = PTHREAD_ONCE_INIT;

static void make_defaults(void)
{
    zt_error err;
    g_defaults = zt_config_new();
    if (!g_defaults) {
        g_defaults_status = ZT_ERR_OUT_OF_MEMORY;
        return;
    }
    uint32_t n = 0;
    const zt_option *opts = zt_host_options(&n);
    g_defaults_status = zt_config_add_schema(g_defaults, "host", opts, n, &err);
}

zt_status zt_host_settings_defaults(zt_host_settings *out, zt_error *err)
{
    pthread_once(&g_defaults_once, make_defaults);
    if (g_defaults_status != ZT_OK)
        return zt_error_set(err, g_defaults_status, "cannot build the host's default settings (%s)",
                            zt_status_name(g_defaults_status));
    return zt_host_settings_read(g_defaults, out, err);
}
