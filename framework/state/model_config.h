/* From a model's own config file to zt's config keys.
 *
 * A Hugging Face config.json or a llama2.c header gives the model's shape (zt_hf_config); the llama
 * plugin reads its shape from the model.* keys, named as transformers names them. This is the one
 * mapping between the two, used by training (--model DIR) and generation (HF directories and
 * llama2.c models alike).
 */
#ifndef ZT_FRAMEWORK_MODEL_CONFIG_H
#define ZT_FRAMEWORK_MODEL_CONFIG_H

#include "base/error.h"
#include "config/config.h"
#include "state/hf_model.h"

/* The model.* keys of `config`, added to cfg as if from a config file named `path`; a model.* key
 * already set must agree with it and model.preset must not be set (model_arg: the --model value, for
 * that message). */
zt_status zt_model_config_apply(zt_config *cfg, const zt_hf_config *config, const char *model_arg,
                                const char *path, zt_error *err);

#endif
