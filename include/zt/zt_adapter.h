/* zt plugin ABI v1.3: adapter plugins (ZT_KIND_ADAPTER, e.g. lora): low-parameter fine-tuning.
 *
 * An adapter plugin owns the adapter's settings (its options schema, e.g. lora.r, lora.lora_alpha,
 * lora.target_modules) and says, through spec(), what to add to the model. The model plugin owns
 * the math: the host hands the spec to zt_model_ops.adapt once, after every plugin's init; the model
 * declares the adapter's parameters (ZT_PARAM_ADAPTER) next to its own and computes them inside
 * its units, with its own kernels on its own device. The host lays the adapter's parameters out,
 * trains them, and freezes the base model's (they keep only their compute copy: zt_train.h's
 * frozen region), so the zero plugins, the optimizers and checkpoints need nothing new.
 */
#ifndef ZT_ADAPTER_H
#define ZT_ADAPTER_H

#include "zt_types.h"
#include "zt_model.h" /* the zt_adapter_spec typedef */

#ifdef __cplusplus
extern "C" {
#endif

#define ZT_ADAPTER_LORA 1 /* LoRA (Hu et al. 2021) as peft computes it, below */

/* What to add to the model. LoRA: every targeted linear layer y = x W^T gets
 *     y += scaling * dropout(x) A^T B^T,   A [r, in_features], B [out_features, r],
 * A initialized U(-1/sqrt(in_features), 1/sqrt(in_features)) (kaiming_uniform_ with a = sqrt(5)), B
 * zero, dropout applied to x in training only (probability `dropout`, survivors scaled by
 * 1/(1 - dropout)). Owned by the adapter plugin, valid until its fini. */
struct zt_adapter_spec {
    uint32_t struct_size;
    int32_t method;             /* ZT_ADAPTER_LORA */
    int32_t r;                  /* rank, >= 1 */
    int32_t reserved0;
    double alpha;               /* lora_alpha */
    double scaling;             /* alpha / r, or alpha / sqrt(r) (use_rslora) */
    double dropout;             /* in [0, 1) */
    /* Comma-separated module names, each matching the modules whose dotted name is it or ends in
     * ".name" ("q_proj,v_proj"), or "all-linear": every linear layer but the LM head (peft's rule). */
    const char *target_modules;
    /* The peft adapter_config.json fields the export writes as given ("none": no bias trains). */
    const char *bias;
};

typedef struct zt_adapter_ops {
    uint32_t struct_size;
    uint32_t reserved0;
    /* The adapter as configured; owned by the plugin, valid until fini. [main thread], after init.
     * Required. */
    const zt_adapter_spec *(*spec)(void *state);
} zt_adapter_ops;

#ifdef __cplusplus
}
#endif

#endif /* ZT_ADAPTER_H */
