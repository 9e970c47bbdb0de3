/* DeepSpeed's rules that span keys, the Trainer's derived "auto"s, and the DeepSpeed keys zt accepts
 * without effect or only switched off (deepspeed.h). */
#define _POSIX_C_SOURCE 200809L
#include "config/deepspeed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "config/config_internal.h"

/* ---- keys accepted without effect, and switches accepted switched off ------------------------------ */

enum {
    DS_ANY = 0,      /* any value of the key's type (a declared key: its schema checks the type) */
    DS_FALSE = 1,    /* a switch: accepted at false; true asks for what zt does not do */
    DS_DISABLED = 2, /* a section: accepted while its "enabled" is false or absent (DeepSpeed's default) */
    DS_NOTED = 3,    /* a key no schema declares, accepted with any value and noted */
};

typedef struct ds_accepted {
    const char *key;
    int when;
    const char *why; /* DS_ANY: why it has no effect; otherwise what zt does not do when it is on */
} ds_accepted;

static const ds_accepted k_accepted[] = {
    {"zero_allow_untested_optimizer", DS_ANY,
     "zt has no list of tested optimizers to bypass: every optimizer plugin runs under every ZeRO stage"},
    {"zero_optimization.round_robin_gradients", DS_ANY,
     "DeepSpeed's order of gradient copies for CPU offload; zt copies each unit's gradient shard as soon as its "
     "reduction is done, unit by unit"},
    {"zero_optimization.sub_group_size", DS_ANY,
     "DeepSpeed steps the optimizer in sub-groups of this many elements to bound the step's buffers; zt steps "
     "one unit (a layer) at a time, which bounds them already"},
    {"zero_optimization.stage3_param_persistence_threshold", DS_ANY,
     "zt gathers a unit's parameters (a layer's matrices and norms together) in one all-gather, so a small "
     "parameter costs no collective of its own, which is what DeepSpeed keeps parameters below this size "
     "unpartitioned for"},
    {"zero_optimization.stage3_max_reuse_distance", DS_ANY,
     "zt releases a unit's gathered parameters right after its forward or backward and keeps a parameter two "
     "units use (the tied embedding) gathered while either runs: there is no cache of released parameters to "
     "bound"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", DS_ANY,
     "--export always gathers every shard into one Hugging Face model (written by rank 0), and checkpoints "
     "keep the shards"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", DS_ANY,
     "--export always gathers every shard into one Hugging Face model (written by rank 0), and checkpoints "
     "keep the shards"},
    {"monitor_config.enabled", DS_NOTED,
     "DeepSpeed's switch over its monitor backends; zt accepts them only switched off (each its own \"enabled\": "
     "false), so nothing is monitored either way"},
    {"monitor_config.tag", DS_NOTED, "the name DeepSpeed's monitor logs under; zt has no monitor backend"},
    {"monitor_config.tensorboard", DS_DISABLED, "TensorBoard event files"},
    {"monitor_config.wandb", DS_DISABLED, "logging to Weights & Biases"},
    {"monitor_config.csv_monitor", DS_DISABLED, "DeepSpeed's CSV monitor (zt writes every step to OUTPUT_DIR/metrics.jsonl)"},
    {"monitor_config.comet", DS_DISABLED, "logging to Comet"},
    {"comms_config", DS_DISABLED, "verbose communication logging"},
    {"wandb", DS_DISABLED, "logging to Weights & Biases"},
    {"csv_monitor", DS_DISABLED, "DeepSpeed's CSV monitor (zt writes every step to OUTPUT_DIR/metrics.jsonl)"},
    {"comet", DS_DISABLED, "logging to Comet"},
    {"flops_profiler", DS_DISABLED, "the FLOPS profiler"},
    {"autotuning", DS_DISABLED, "autotuning"},
    {"elasticity", DS_DISABLED, "elastic training"},
    {"nebula", DS_DISABLED, "Nebula checkpointing"},
    {"hybrid_engine", DS_DISABLED, "the hybrid (RLHF) engine"},
    {"prescale_gradients", DS_FALSE, "gradient pre-scaling before the all-reduce"},
    {"sparse_gradients", DS_FALSE, "sparse gradients"},
    {"memory_breakdown", DS_FALSE, "memory breakdowns (zt-run --dry-run estimates memory by pool)"},
    {"dump_state", DS_FALSE, "state dumps"},
    {"zero_force_ds_cpu_optimizer", DS_FALSE, "forcing DeepSpeed's CPU optimizer"},
    {"fp16.auto_cast", DS_FALSE, "automatic casting of fp16 inputs"},
    {"fp16.fp16_master_weights_and_grads", DS_FALSE,
     "fp16 master weights and gradients (zt keeps fp32 master weights; offload_optimizer steps them on the CPU)"},
    {"zero_optimization.cpu_offload", DS_FALSE,
     "DeepSpeed's older spelling of offload_optimizer.device \"cpu\" (write that instead)"},
};

static int is_prefix_of(const char *prefix, const char *key)
{
    size_t n = strlen(prefix);
    return strncmp(prefix, key, n) == 0 && key[n] == '.';
}

/* The entry of k_accepted for `key`: its own, or its section's (DS_DISABLED); NULL when none. */
static const ds_accepted *find_accepted(const char *key)
{
    for (size_t k = 0; k < sizeof k_accepted / sizeof k_accepted[0]; k++) {
        const ds_accepted *a = &k_accepted[k];
        if (!strcmp(a->key, key) || (a->when == DS_DISABLED && is_prefix_of(a->key, key))) return a;
    }
    return NULL;
}

static const zt_json *entry_json(const zt_config *cfg, const given_entry *e) { return &cfg->docs[e->doc].json; }

/* The key that switches a DS_DISABLED section on: "enabled", or comms_config's "verbose". */
static const char *switch_of(const ds_accepted *a) { return !strcmp(a->key, "comms_config") ? "verbose" : "enabled"; }

int cfg_deepspeed_accepts(const zt_config *cfg, const given_entry *e, const char *place, problem_list *problems)
{
    const ds_accepted *a = find_accepted(e->key);
    if (!a || a->when == DS_ANY) return 0; /* DS_ANY keys are declared: their schema judges them */
    if (a->when == DS_NOTED) return !e->is_object;
    const zt_json *j = entry_json(cfg, e);
    char got[96];
    if (a->when == DS_FALSE) {
        if (strcmp(a->key, e->key) || e->is_object) return 0;
        if (zt_json_is_bool(j, e->value_tok) && !zt_json_get_bool(j, e->value_tok)) return 1;
        if (!zt_json_is_bool(j, e->value_tok)) return 0; /* the unsupported-key message says what it is */
        cfg_problem_add(problems,
                        "DeepSpeed key '%s' is true (%s), which asks for %s: zt does not implement it. Set '%s' to "
                        "false or remove it",
                        e->key, place, a->why, e->key);
        return 1;
    }
    /* DS_DISABLED: the section decides by its "enabled"; its other keys follow. */
    if (!strcmp(a->key, e->key)) return e->is_object; /* a section given as a plain value: not this rule */
    char enabled_key[160];
    snprintf(enabled_key, sizeof enabled_key, "%s.%s", a->key, switch_of(a));
    if (strcmp(e->key, enabled_key)) return 1;
    if (zt_json_is_bool(j, e->value_tok) && !zt_json_get_bool(j, e->value_tok)) return 1;
    if (zt_json_is_bool(j, e->value_tok)) {
        cfg_problem_add(problems,
                        "DeepSpeed key '%s' is true (%s), which asks for %s: zt does not implement it. Set '%s' to "
                        "false or remove the section '%s' (zt logs to stderr every log.every steps and writes "
                        "OUTPUT_DIR/metrics.jsonl)",
                        e->key, place, a->why, e->key, a->key);
        return 1;
    }
    cfg_describe_json_value(j, e->value_tok, got, sizeof got);
    cfg_problem_add(problems, "DeepSpeed key '%s' must be true or false, got %s (%s); zt accepts the section '%s' "
                    "only switched off (false)", e->key, got, place, a->key);
    return 1;
}

/* ---- describing: autos, keys without effect, switches off ---------------------------------------- */

static void write_value_text(const declared_option *d, char *buf, size_t cap)
{
    const option_value *v = &d->value;
    if (!v->present) {
        snprintf(buf, cap, "unset");
        return;
    }
    switch (d->opt->type) {
    case ZT_OPT_BOOL: snprintf(buf, cap, "%s", v->b ? "true" : "false"); break;
    case ZT_OPT_INT:
    case ZT_OPT_BYTES: snprintf(buf, cap, "%lld", (long long)v->i); break;
    case ZT_OPT_FLOAT: cfg_format_double(v->f, buf, cap); break;
    case ZT_OPT_FLOATS: {
        size_t used = (size_t)snprintf(buf, cap, "[");
        for (int32_t k = 0; k < v->n_floats && used < cap; k++) {
            char number[32];
            cfg_format_double(v->floats[k], number, sizeof number);
            used += (size_t)snprintf(buf + used, cap - used, "%s%s", k ? ", " : "", number);
        }
        if (used < cap) snprintf(buf + used, cap - used, "]");
        break;
    }
    default: snprintf(buf, cap, "\"%s\"", v->s ? v->s : ""); break;
    }
}

/* The entry of `key` the user's value is in (the last --set, else the last of the file, "auto" included;
 * not a value the host put); -1 when none. */
static int last_user_entry(const zt_config *cfg, const char *key)
{
    int best = -1, best_from_set = 0;
    for (int k = 0; k < cfg->n_given; k++) {
        const given_entry *e = &cfg->given[k];
        const config_doc *d = &cfg->docs[e->doc];
        if (e->is_object || d->put || strcmp(e->key, key)) continue;
        if (best < 0 || d->from_set >= best_from_set) {
            best = k;
            best_from_set = d->from_set;
        }
    }
    return best;
}

void zt_ds_describe(const zt_config *cfg, FILE *out, const char *prefix)
{
    char place[4200], value[256];
    /* every "auto": the value it took and from where */
    for (int k = 0; k < cfg->n_decl; k++) {
        const declared_option *d = &cfg->decl[k];
        int at = cfg_auto_entry(cfg, d->opt->key);
        if (at < 0) continue;
        cfg_describe_place(cfg, &cfg->given[at], cfg->given[at].key_offset, place, sizeof place);
        write_value_text(d, value, sizeof value);
        const char *from = "zt's default";
        if (d->given >= 0) {
            const config_doc *doc = &cfg->docs[cfg->given[d->given].doc];
            from = doc->put ? doc->origin : doc->from_set ? "the command line's --set" : "the file";
            const char *derived = doc->put && !strncmp(from, "\"auto\" (", 8) ? strstr(from, "): ") : NULL;
            if (derived) from = derived + 3; /* the place is said already */
        }
        fprintf(out, "%s%s: %s \"auto\" is %s (%s)\n", prefix, place, d->opt->key, value, from);
    }
    /* keys accepted without effect, and switches accepted off; each once, where the user gave it */
    for (int k = 0; k < cfg->n_given; k++) {
        const given_entry *e = &cfg->given[k];
        const ds_accepted *a = find_accepted(e->key);
        if (!a || e->is_object || last_user_entry(cfg, e->key) != k) continue;
        cfg_describe_place(cfg, e, e->key_offset, place, sizeof place);
        if (a->when == DS_ANY || a->when == DS_NOTED)
            fprintf(out, "%s%s: %s (DeepSpeed) has no effect in zt: %s\n", prefix, place, e->key, a->why);
        else if (a->when == DS_FALSE || (e->key[strlen(a->key)] == '.' && !strcmp(e->key + strlen(a->key) + 1, switch_of(a))))
            fprintf(out, "%s%s: %s is false, so nothing asks for %s, which zt does not implement\n", prefix, place,
                    e->key, a->why);
    }
}

/* ---- the batch rule -------------------------------------------------------------------------------- */

static const char *const k_micro = "train_micro_batch_size_per_gpu";
static const char *const k_accum = "gradient_accumulation_steps";
static const char *const k_global = "train_batch_size";

/* Where the value of `key` came from, for messages: "ds.json:3:5", "--set ...", "zt's default". */
static void value_place(const zt_config *cfg, const char *key, char *buf, size_t cap)
{
    int k = cfg_effective_entry(cfg, key);
    if (k < 0) {
        snprintf(buf, cap, "%s", cfg_auto_entry(cfg, key) >= 0 ? "\"auto\": zt's default" : "zt's default");
        return;
    }
    cfg_describe_value_place(cfg, &cfg->given[k], cfg->given[k].value_tok, buf, cap);
}

/* Put the derived `value` of `key`, its origin saying how (and that the file said "auto", if so). */
static zt_status put_derived(zt_config *cfg, const char *key, int64_t value, const char *how, zt_error *err)
{
    char place[4200] = "";
    int at = cfg_auto_entry(cfg, key);
    if (at >= 0) cfg_describe_place(cfg, &cfg->given[at], cfg->given[at].key_offset, place, sizeof place);
    char *origin = at >= 0 ? cfg_format_alloc("\"auto\" (%s): %s", place, how) : cfg_format_alloc("%s", how);
    if (!origin) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory deriving %s", key);
    zt_status st = zt_config_put_int(cfg, key, value, origin, ZT_CONFIG_RANK_FILE, err);
    free(origin);
    return st;
}

static zt_status batch_mismatch(const zt_config *cfg, int64_t micro, int64_t accum, int64_t global, int64_t dp,
                                const char *what, zt_error *err)
{
    char pm[4200], pa[4200], pg[4200];
    value_place(cfg, k_micro, pm, sizeof pm);
    value_place(cfg, k_accum, pa, sizeof pa);
    value_place(cfg, k_global, pg, sizeof pg);
    return zt_error_set(err, ZT_ERR_CONFIG,
                        "%s: train_batch_size %lld (%s), train_micro_batch_size_per_gpu %lld (%s) and "
                        "gradient_accumulation_steps %lld (%s) over %lld data-parallel rank%s; DeepSpeed's rule is "
                        "train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
                        "data-parallel size (%lld x %lld x %lld = %lld). Make them agree, or give two of the three "
                        "(or \"auto\") and zt derives the third",
                        what, (long long)global, pg, (long long)micro, pm, (long long)accum, pa, (long long)dp,
                        dp == 1 ? "" : "s", (long long)micro, (long long)accum, (long long)dp,
                        (long long)(micro * accum * dp));
}

zt_status zt_ds_resolve_batch(zt_config *cfg, int64_t dp, zt_error *err)
{
    if (dp < 1) return zt_error_set(err, ZT_ERR_INTERNAL, "the batch rule was given %lld data-parallel ranks", (long long)dp);
    int64_t micro = 0, accum = 0, global = 0;
    if (zt_config_get_int(cfg, k_micro, &micro) != ZT_OK || zt_config_get_int(cfg, k_accum, &accum) != ZT_OK)
        return ZT_OK; /* an invalid value: validation reports it */
    int has_micro = zt_config_is_set(cfg, k_micro), has_accum = zt_config_is_set(cfg, k_accum);
    int has_global = zt_config_get_int(cfg, k_global, &global) == ZT_OK;
    char how[512];
    if (!has_global) {
        snprintf(how, sizeof how,
                 "train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size = %lld x %lld x "
                 "%lld (DeepSpeed's batch rule)",
                 (long long)micro, (long long)accum, (long long)dp);
        return put_derived(cfg, k_global, micro * accum * dp, how, err);
    }
    if (has_micro && has_accum) {
        if (global == micro * accum * dp) return ZT_OK;
        return batch_mismatch(cfg, micro, accum, global, dp, "the batch sizes do not agree", err);
    }
    if (has_micro) { /* train_batch_size with the micro-batch: derive the accumulation */
        if (global % (micro * dp))
            return batch_mismatch(cfg, micro, accum, global, dp,
                                  "train_batch_size is not a multiple of train_micro_batch_size_per_gpu x "
                                  "data-parallel size",
                                  err);
        snprintf(how, sizeof how,
                 "train_batch_size / (train_micro_batch_size_per_gpu x data-parallel size) = %lld / (%lld x %lld) "
                 "(DeepSpeed's batch rule)",
                 (long long)global, (long long)micro, (long long)dp);
        return put_derived(cfg, k_accum, global / (micro * dp), how, err);
    }
    /* train_batch_size with the accumulation, or alone (the accumulation then is zt's default 1): derive the
     * micro-batch */
    if (global % (accum * dp))
        return batch_mismatch(cfg, micro, accum, global, dp,
                              "train_batch_size is not a multiple of gradient_accumulation_steps x data-parallel size",
                              err);
    snprintf(how, sizeof how,
             "train_batch_size / (gradient_accumulation_steps x data-parallel size) = %lld / (%lld x %lld) "
             "(DeepSpeed's batch rule)",
             (long long)global, (long long)accum, (long long)dp);
    return put_derived(cfg, k_micro, global / (accum * dp), how, err);
}

/* ---- the autos of the model's size ------------------------------------------------------------------ */

zt_status zt_ds_resolve_model_autos(zt_config *cfg, int64_t hidden, const char *model, zt_error *err)
{
    if (hidden < 1) return ZT_OK;
    struct {
        const char *key, *formula;
        int64_t value;
    } autos[] = {
        {"zero_optimization.reduce_bucket_size", "hidden_size^2", hidden * hidden},
        {"zero_optimization.stage3_prefetch_bucket_size", "floor(0.9 x hidden_size^2)",
         (int64_t)floor(0.9 * (double)hidden * (double)hidden)},
        {"zero_optimization.stage3_param_persistence_threshold", "10 x hidden_size", 10 * hidden},
    };
    zt_status st = ZT_OK;
    for (size_t k = 0; k < sizeof autos / sizeof autos[0] && st == ZT_OK; k++) {
        int at = cfg_auto_entry(cfg, autos[k].key);
        int effective = cfg_effective_entry(cfg, autos[k].key);
        /* only where the file's "auto" is what counts: not under a --set, not twice */
        if (at < 0 || (effective >= 0 && cfg->docs[cfg->given[effective].doc].from_set)) continue;
        if (effective >= 0 && cfg->docs[cfg->given[effective].doc].put) continue;
        char how[256];
        snprintf(how, sizeof how, "%s with hidden_size %lld (%s), the Hugging Face Trainer's rule", autos[k].formula,
                 (long long)hidden, model);
        st = put_derived(cfg, autos[k].key, autos[k].value, how, err);
    }
    return st;
}
