/* A peft LoRA adapter directory (adapter_config.json + adapter_model.safetensors, docs/lora.md) read
 * against a run's model: the adapter's parameters (ZT_PARAM_ADAPTER) are there under peft's names,
 * "base_model.model." + zt's name. Training starts an adapter from one (--adapter with training) and
 * generation runs with one (--generate --adapter). */
#ifndef ZT_FRAMEWORK_PEFT_ADAPTER_H
#define ZT_FRAMEWORK_PEFT_ADAPTER_H

#include <stdint.h>
#include "zt/zt_adapter.h"
#include "base/error.h"
#include "state/safetensors.h"

#define ZT_PEFT_PREFIX "base_model.model."

/* DIR/adapter_model.safetensors, after checking DIR/adapter_config.json's r, lora_alpha and use_rslora
 * against spec (the shapes show r, not the scaling) and that the file holds exactly info's adapter
 * parameters: an adapter of other target modules is refused, not half loaded. Close with zt_st_close. */
zt_status zt_peft_adapter_open(const char *dir, const zt_adapter_spec *spec, const zt_model_info *info,
                               zt_st_file **out, zt_error *err);

/* Elements [elem_offset, elem_offset + n) of adapter parameter p from the file, after checking its shape. */
zt_status zt_peft_adapter_read(const zt_st_file *f, const zt_param_decl *p, int64_t elem_offset, int64_t n,
                               float *dst, zt_error *err);

#endif
