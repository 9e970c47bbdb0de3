/* The memory estimator behind `zt-run --dry-run` (docs/zero.md, "Memory").
 *
 * For the run's plugins and config it gives the memory one data-parallel rank needs, by pool, and
 * the same for every other ZeRO stage and offload choice, so a user sees what fits before
 * launching. The pools a ZeRO plugin owns (parameters, gradients, optimizer state, communication
 * buckets) come from the zero plugins' own estimate(): the chosen plugin as configured, and zt's
 * zero0..zero3 re-initialized with each offload choice for the other rows. Activations come from
 * the model's declared bytes per token and layer plus the trainer's own buffers
 * (zt_estimate_activations). Not estimated: the model's per-op scratch (pool workspace) and small
 * tables (pool other), which the model plugin does not declare.
 */
#ifndef ZT_FRAMEWORK_ESTIMATE_H
#define ZT_FRAMEWORK_ESTIMATE_H

#include <stdio.h>

#include "config.h"
#include "error.h"
#include "registry.h"
#include "runtime.h"

/* Bytes of pool activations one rank holds at its peak for micro-batches of `tokens` tokens
 * (micro_batch x seq_len), elements of `element_bytes` (4 on the CPU):
 *   - without recompute, at the end of a forward: every layer's saved activations
 *     (act_bytes_per_token_layer, which counts the layer's input, a buffer of the trainer's), the LM
 *     head's (its normalized input, one rms factor and the logits per token), and the trainer's
 *     buffers the layers do not count: the head's input and the two hidden-state gradients;
 *   - with recompute, in the backward: the trainer's buffers (every unit's input and the two
 *     gradients) plus the larger of one layer's and the head's recomputed activations. */
double zt_estimate_activations(const zt_model_info *m, int64_t tokens, int recompute, double element_bytes);

typedef struct zt_dry_run_request {
    zt_config *cfg;               /* validated; its offload keys change while other rows are estimated
                                     and are set back afterwards */
    const zt_registry *reg;       /* finds zero0..zero3 for the other rows */
    const zt_plugin_set *plugins; /* the run's plugins, initialized */
    zt_runtime *rt;
    int32_t dp_size;              /* data-parallel ranks to estimate for */
    const char *json_path;        /* NULL, or where to write the estimate as JSON (atomically) */
} zt_dry_run_request;

/* Print the table to `out` (and write json_path). Errors: a plugin's estimate failing for the chosen
 * configuration, or the JSON file not written. A row of another stage whose plugin cannot be
 * loaded or initialized is printed with the reason instead of numbers. */
zt_status zt_dry_run(const zt_dry_run_request *req, FILE *out, zt_error *err);

#endif
