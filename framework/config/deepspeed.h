/* DeepSpeed configs as DeepSpeed and the Hugging Face Trainer mean them (docs/config.md, "DeepSpeed
 * compatibility"): the rules that span keys, which the schemas of single keys cannot state.
 *
 *   - "auto" (the Trainer's placeholder): a file's "auto" for a key gives it zt's own value (config.c);
 *     the keys the Trainer derives from other values are derived here: the batch triple (below) and,
 *     from the model's hidden size h, zero_optimization.reduce_bucket_size = h^2,
 *     stage3_prefetch_bucket_size = floor(0.9 h^2), stage3_param_persistence_threshold = 10 h.
 *   - DeepSpeed's batch rule: train_batch_size = train_micro_batch_size_per_gpu x
 *     gradient_accumulation_steps x the data-parallel size; any two give the third.
 *   - DeepSpeed keys zt accepts without effect (each with the reason), and switches zt accepts only
 *     at the value that turns them off (monitor sections with "enabled": false, ...).
 * A derived value is put into the config as a value of the file's rank (a --set of the key still wins),
 * its origin saying how it was derived; the resolved config's _sources and _notes show it.
 */
#ifndef ZT_FRAMEWORK_CONFIG_DEEPSPEED_H
#define ZT_FRAMEWORK_CONFIG_DEEPSPEED_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "config/config.h"

/* DeepSpeed's batch rule over `dp` data-parallel ranks (settings.h's zt_data_parallel_size): the keys
 * not given (or given "auto") are derived from those given, as DeepSpeed's engine does: all three
 * must agree; two give the third; train_batch_size alone gives the micro-batch (accumulation 1, zt's
 * default); without it, train_batch_size is micro-batch x accumulation x dp. A triple that does not
 * fit, or a division that is not exact, is a ZT_ERR_CONFIG naming the three values, where they came
 * from and dp. The config must be validated again afterwards. */
zt_status zt_ds_resolve_batch(zt_config *cfg, int64_t dp, zt_error *err);

/* The "auto"s the Trainer derives from the model's hidden size (above), for the keys the file gives as
 * "auto" and no --set overrides. `model` names where the size came from in the values' origin ("model
 * 'llama'"). The config must be validated again afterwards. */
zt_status zt_ds_resolve_model_autos(zt_config *cfg, int64_t hidden, const char *model, zt_error *err);

/* What the config's DeepSpeed keys mean in zt that a reader of the file would not see: every "auto" and
 * the value it took, every key accepted without effect and why, every switch accepted switched off.
 * One line each, "PLACE: TEXT\n"; `prefix` starts every line (the log's "zt info: "). */
void zt_ds_describe(const zt_config *cfg, FILE *out, const char *prefix);

#endif
