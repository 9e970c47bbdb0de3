/* Plugin selection: the one place that decides which plugins a run loads and which device it
 * computes on (select.c says how). */
#ifndef ZT_FRAMEWORK_SELECT_H
#define ZT_FRAMEWORK_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "config/config.h"
#include "config/settings.h"
#include "host/registry.h"

/* The kinds a training run needs. */
#define ZT_TRAINING_KINDS                                                                              \
    ((1u << ZT_KIND_MODEL) | (1u << ZT_KIND_ATTENTION) | (1u << ZT_KIND_OPTIMIZER) | (1u << ZT_KIND_ZERO))

/* The kinds a training run loads (a bitmask of 1 << kind): ZT_TRAINING_KINDS, plus a parallel
 * plugin once a tensor or pipeline size is above 1 (data parallelism alone needs none: every rank is
 * a data-parallel rank). Reads the parallel sizes of a config not validated yet. */
unsigned zt_select_run_kinds(const zt_config *cfg);

/* Resolve "llama,zero3,flash" (names or paths) plus the documented defaults for kinds not named
 * (docs/plugins.md), loading each. `needed_kinds` is a bitmask (1 << kind) of kinds the program
 * needs; defaults are filled only for those. Two plugins of one kind is an error naming both; so is
 * a named plugin that contradicts the config key that would choose its kind. cfg may be NULL (every
 * kind at its default). */
zt_status zt_plugin_set_resolve(const zt_registry *reg, const char *list, unsigned needed_kinds,
                                const zt_config *cfg, zt_plugin_set *out, zt_error *err);

/* What --plugins chose, put into cfg (origin "--plugins") where the config's own key, at its
 * default, names something else: optimizer.type and zero_optimization.stage. */
zt_status zt_select_record(zt_config *cfg, const zt_plugin_set *set, zt_error *err);

/* The name of zt's own plugin for ZeRO stage `stage` ("zero2"). */
void zt_select_zero_plugin(int stage, char *name, size_t cap);
/* The optimizer plugin optimizer.type names: lower case ("AdamW" is adamw), and DeepSpeed's "Adam" is
 * adamw too (whose optimizer.params.adam_w_mode says which decay, as DeepSpeed's FusedAdam). */
void zt_select_optimizer_plugin(const char *type, char *name, size_t cap);

/* The first plugin of the set (tokenizers do not compute) that lacks capability `cap`, or NULL. */
const zt_loaded_plugin *zt_plugin_set_without(const zt_plugin_set *set, uint64_t cap);

/* The device a run computes on (*device_type: ZT_DEVICE_CPU or ZT_DEVICE_CUDA): settings->device.
 * cuda needs every plugin of the run to declare ZT_CAP_CUDA and a GPU; auto picks cuda when both
 * hold (and must, when a plugin runs on CUDA only), else the CPU, saying why. Without settings or
 * plugins (listing, probing): the CPU. CUDA is looked for only when every plugin could use it, so
 * CPU runs never load it. */
zt_status zt_select_device(const zt_host_settings *settings, const zt_plugin_set *set, int *device_type,
                           zt_error *err);

#endif
