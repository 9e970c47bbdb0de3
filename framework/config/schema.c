/* Keys and schemas: which keys exist and who owns them, the DeepSpeed keys zt does not implement,
 * and validation of every given key against the schemas (config_internal.h). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/args.h"
#include "base/json.h"
#include "config/config_internal.h"

/* ---- keys ---------------------------------------------------------------------------------- */

/* Dot-separated names of letters, digits and '_'. */
static int key_is_well_formed(const char *key)
{
    if (!key || !*key) return 0;
    int part_len = 0;
    for (const char *p = key;; p++) {
        if (*p == '.' || *p == '\0') {
            if (part_len == 0) return 0;
            if (*p == '\0') return 1;
            part_len = 0;
        } else if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                   *p == '_') {
            part_len++;
        } else {
            return 0;
        }
    }
}

/* 1 when `prefix` is a proper dotted prefix of `key` ("a.b" of "a.b.c", not of "a.bc"). */
static int is_key_prefix(const char *prefix, const char *key)
{
    size_t n = strlen(prefix);
    return strncmp(prefix, key, n) == 0 && key[n] == '.';
}

static const char *last_component(const char *key)
{
    const char *dot = strrchr(key, '.');
    return dot ? dot + 1 : key;
}

/* Levenshtein distance (zt_edit_distance); keys longer than 128 bytes are treated as far from
 * everything, so a pathological key costs no quadratic time. */
size_t cfg_edit_distance(const char *a, const char *b)
{
    if (strlen(a) > 128 || strlen(b) > 128) return SIZE_MAX / 2;
    return (size_t)zt_edit_distance(a, b);
}

declared_option *cfg_find_decl(const zt_config *cfg, const char *key)
{
    for (int k = 0; k < cfg->n_decl; k++) {
        if (strcmp(cfg->decl[k].opt->key, key) == 0) return &cfg->decl[k];
    }
    return NULL;
}

/* A declared key below `key` ("zero_optimization.stage" for "zero_optimization"), or NULL. */
static const declared_option *find_decl_below(const zt_config *cfg, const char *key)
{
    for (int k = 0; k < cfg->n_decl; k++) {
        if (is_key_prefix(key, cfg->decl[k].opt->key)) return &cfg->decl[k];
    }
    return NULL;
}

/* A declared key above `key` ("zero_optimization.stage" for "zero_optimization.stage.x"), or NULL. */
static const declared_option *find_decl_above(const zt_config *cfg, const char *key)
{
    for (int k = 0; k < cfg->n_decl; k++) {
        if (is_key_prefix(cfg->decl[k].opt->key, key)) return &cfg->decl[k];
    }
    return NULL;
}

const char *zt_config_nearest_key(const zt_config *cfg, const char *key)
{
    /* Tiers, best first: within 2 edits; the key is part of a declared key ("micro_batch_size");
     * within a third of its length in edits; the same last component ("lr" for optimizer.params.lr).
     * score = tier * 1000 + distance within the tier. */
    const char *best = NULL;
    size_t best_score = SIZE_MAX;
    size_t key_len = strlen(key);
    const char *key_last = last_component(key);
    size_t key_last_len = strlen(key_last);
    for (int k = 0; k < cfg->n_decl; k++) {
        const char *candidate = cfg->decl[k].opt->key;
        size_t full = cfg_edit_distance(key, candidate);
        size_t last = cfg_edit_distance(key_last, last_component(candidate));
        size_t score = SIZE_MAX;
        if (full <= 2)
            score = full;
        else if (key_len >= 5 && strstr(candidate, key))
            score = 1000 + strlen(candidate) - key_len;
        else if (full <= key_len / 3)
            score = 2000 + full;
        else if (last == 0 || (key_last_len >= 4 && last <= key_last_len / 4))
            score = 3000 + last;
        if (score < best_score) {
            best_score = score;
            best = candidate;
        }
    }
    return best;
}

/* ---- DeepSpeed keys zt does not implement ---------------------------------------------------- */

/* Real DeepSpeed config keys (or whole sections: the entry matches every key below it) that zt
 * recognizes but does not implement. A key some schema declares is never looked up here, so a plugin
 * that starts supporting one of these simply declares it. */
typedef struct deepspeed_key {
    const char *key;
    const char *why;
} deepspeed_key;

static const deepspeed_key k_deepspeed_unsupported[] = {
    {"zero_optimization.elastic_checkpoint", "elastic checkpoints are not implemented"},
    {"zero_optimization.mics_shard_size", "MiCS sharding is not implemented"},
    {"zero_optimization.mics_hierarchical_params_gather", "MiCS sharding is not implemented"},
    {"zero_optimization.zero_hpz_partition_size", "ZeRO++ is not implemented"},
    {"zero_optimization.zero_quantized_weights", "ZeRO++ is not implemented"},
    {"zero_optimization.zero_quantized_gradients", "ZeRO++ is not implemented"},
    {"zero_force_ds_cpu_optimizer", "there is no DeepSpeed CPU optimizer to force"},
    {"aio", "asynchronous I/O for NVMe offload is not implemented"},
    {"activation_checkpointing",
     "activation checkpointing has no options in zt: switch it on with \"recompute\": true"},
    {"amp", "NVIDIA Apex AMP is not used: set bf16.enabled or fp16.enabled instead"},
    {"fp16.auto_cast", "automatic casting of fp16 inputs is not implemented"},
    {"communication_data_type", "the data type of gradient communication cannot be chosen"},
    {"seq_parallel_communication_data_type", "sequence parallelism is not implemented"},
    {"prescale_gradients", "gradient pre-scaling before the all-reduce is not implemented"},
    {"gradient_predivide_factor", "gradient pre-scaling before the all-reduce is not implemented"},
    {"sparse_gradients", "sparse gradients are not implemented"},
    {"data_types", "the gradient accumulation data type cannot be chosen"},
    {"wandb", "Weights & Biases logging is not implemented: zt logs to stderr every log.every steps"},
    {"csv_monitor", "the CSV monitor is not implemented: zt writes every step to OUTPUT_DIR/metrics.jsonl"},
    {"comet", "Comet logging is not implemented: zt logs to stderr every log.every steps"},
    {"memory_breakdown", "memory breakdowns are not implemented"},
    {"dump_state", "state dumps are not implemented"},
    {"flops_profiler", "the FLOPS profiler is not implemented"},
    {"compression_training", "compression training is not implemented"},
    {"data_efficiency", "data efficiency (data sampling and routing) is not implemented"},
    {"curriculum_learning", "curriculum learning is not implemented"},
    {"sparse_attention",
     "sparse attention is not implemented: the attention plugin decides how attention is computed"},
    {"pipeline",
     "DeepSpeed's pipeline engine settings are not read: pipeline parallelism is set with "
     "parallel_config.pipeline_stage"},
    {"autotuning", "autotuning is not implemented"},
    {"elasticity", "elastic training is not implemented"},
    {"progressive_layer_drop", "progressive layer drop is not implemented"},
    {"eigenvalue", "eigenvalue computation is not implemented"},
    {"quantize_training", "quantization-aware training is not implemented"},
    {"nebula", "Nebula checkpointing is not implemented"},
    {"hybrid_engine", "the hybrid (RLHF) engine is not implemented"},
    {"checkpoint.tag_validation", "checkpoint tags are not used"},
    {"checkpoint.load_universal",
     "universal checkpoints are not implemented: zt converts between parallel layouts itself "
     "(auto_trans_ckpt)"},
    {"checkpoint.use_node_local_storage", "node-local checkpoint storage is not implemented"},
    {"checkpoint.parallel_write", "parallel checkpoint writing is not implemented"},
    {"dataloader_drop_last", "the data loader is configured with the data.* keys"},
    {"scheduler.params.warmup_type", "the shape of the warmup cannot be chosen"},
    {"scheduler.params.warmup_min_ratio", "use scheduler.params.warmup_min_lr"},
    {"scheduler.params.last_batch_iteration",
     "the scheduler position is restored from the checkpoint when resuming"},
};

static const deepspeed_key *find_deepspeed_unsupported(const char *key)
{
    size_t n = sizeof k_deepspeed_unsupported / sizeof k_deepspeed_unsupported[0];
    for (size_t k = 0; k < n; k++) {
        const char *ds = k_deepspeed_unsupported[k].key;
        if (strcmp(ds, key) == 0 || is_key_prefix(ds, key)) return &k_deepspeed_unsupported[k];
    }
    return NULL;
}

/* Checks one option of a schema; problems go to `problems`. *def receives the parsed default. */
static void check_option(zt_config *cfg, const char *owner, const zt_option *opts, uint32_t index,
                         option_value *def, problem_list *problems)
{
    const zt_option *o = &opts[index];
    const char *key = o->key ? o->key : "(null)";
    if (!key_is_well_formed(o->key)) {
        cfg_problem_add(problems,
                    "'%s' declares an option with the invalid key \"%s\": keys are dot-separated "
                    "names of letters, digits and '_'",
                    owner, key);
        return;
    }
    int parts = 1;
    for (const char *p = key; *p; p++) parts += *p == '.';
    if (parts > 32) {
        cfg_problem_add(problems, "'%s' declares '%s': a key has at most 32 dot-separated parts", owner,
                    key);
        return;
    }
    if (key[0] == '_') {
        cfg_problem_add(problems, "'%s' declares '%s': keys starting with '_' are reserved for zt", owner,
                    key);
    }
    for (uint32_t k = 0; k < index; k++) {
        if (opts[k].key && strcmp(opts[k].key, key) == 0)
            cfg_problem_add(problems, "'%s' declares config key '%s' twice", owner, key);
        else if (opts[k].key && (is_key_prefix(opts[k].key, key) || is_key_prefix(key, opts[k].key)))
            cfg_problem_add(problems, "'%s' declares both '%s' and '%s': a key cannot also be a section",
                        owner, opts[k].key, key);
    }
    for (int k = 0; k < cfg->n_decl; k++) {
        const declared_option *d = &cfg->decl[k];
        if (strcmp(d->opt->key, key) == 0) {
            cfg_problem_add(problems,
                        "config key '%s' is declared by both '%s' and '%s'; a key has exactly one "
                        "owner: rename it in one of them (a plugin's keys belong in its own section, "
                        "e.g. optimizer.params.*)",
                        key, d->owner, owner);
        } else if (is_key_prefix(d->opt->key, key) || is_key_prefix(key, d->opt->key)) {
            cfg_problem_add(problems,
                        "'%s' declares '%s' and '%s' declares '%s': a key cannot also be a section",
                        d->owner, d->opt->key, owner, key);
        }
    }
    if (o->type < ZT_OPT_BOOL || o->type > ZT_OPT_BYTES) {
        cfg_problem_add(problems, "'%s' declares '%s' with unknown option type %d", owner, key,
                    (int)o->type);
        return;
    }
    if (o->type == ZT_OPT_ENUM && (!o->choices || !o->choices[0])) {
        cfg_problem_add(problems, "'%s' declares enum '%s' without choices", owner, key);
        return;
    }
    if ((o->flags & ZT_OPT_HAS_MIN) && (o->flags & ZT_OPT_HAS_MAX) && o->min > o->max) {
        cfg_problem_add(problems, "'%s' declares '%s' with min %g > max %g", owner, key, o->min, o->max);
    }
    memset(def, 0, sizeof *def);
    if (o->flags & ZT_OPT_NO_DEFAULT) {
        if (o->default_value) {
            cfg_problem_add(problems,
                        "'%s' declares '%s' with both ZT_OPT_NO_DEFAULT and a default (\"%s\"); drop "
                        "one",
                        owner, key, o->default_value);
        }
        return;
    }
    if (!o->default_value) {
        cfg_problem_add(problems,
                    "'%s' declares '%s' without a default; give default_value or set "
                    "ZT_OPT_NO_DEFAULT",
                    owner, key);
        return;
    }
    config_doc d;
    zt_error parse_err;
    if (cfg_parse_command_line_value(o->default_value, "default", &d, &parse_err) != ZT_OK) {
        cfg_problem_add(problems, "'%s' declares '%s' with an unusable default \"%s\": %s", owner, key,
                    o->default_value, parse_err.msg);
        return;
    }
    value_problem vp;
    if (!cfg_parse_value(cfg, o, &d.json, 0, 1, def, &vp)) {
        cfg_problem_add(problems, "'%s' declares '%s' with an invalid default \"%s\": it %s", owner, key,
                    o->default_value, vp.problem);
    }
    cfg_doc_free(&d);
}

zt_status zt_config_add_schema(zt_config *cfg, const char *owner, const zt_option *opts, uint32_t n,
                               zt_error *err)
{
    if (!owner || (n > 0 && !opts)) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "zt_config_add_schema: owner and options needed");
    }
    owner = cfg_arena_strndup(cfg, owner, strlen(owner));
    option_value *defaults = calloc(n ? n : 1, sizeof *defaults);
    if (!owner || !defaults) {
        free(defaults);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory adding the options of a plugin");
    }
    problem_list problems;
    cfg_problems_open(&problems);
    for (uint32_t k = 0; k < n; k++) check_option(cfg, owner, opts, k, &defaults[k], &problems);
    zt_status st = cfg_problems_close(&problems, ZT_ERR_INVALID_ARG, err);
    if (st == ZT_OK && !cfg_grow((void **)&cfg->decl, &cfg->cap_decl, cfg->n_decl + (int)n, sizeof *cfg->decl))
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory adding the options of '%s'", owner);
    if (st == ZT_OK) {
        for (uint32_t k = 0; k < n; k++) {
            cfg->decl[cfg->n_decl++] = (declared_option){&opts[k], owner, defaults[k], defaults[k], -1, 0,
                                                         NULL};
        }
        cfg->validated = 0;
        cfg_resolve_all(cfg);
    }
    free(defaults);
    return st;
}

/* ---- validation ---------------------------------------------------------------------------- */

/* 1 when a proper prefix of `key` is in `sections` (already reported: stay quiet about its keys). */
static int under_reported_section(const char *key, const char *const *sections, int n)
{
    for (int k = 0; k < n; k++) {
        if (is_key_prefix(sections[k], key)) return 1;
    }
    return 0;
}

static void report_unknown(const zt_config *cfg, const given_entry *e, const char *place,
                           problem_list *problems)
{
    const char *near = zt_config_nearest_key(cfg, e->key);
    if (near) {
        cfg_problem_add(problems, "unknown config key '%s' (%s); did you mean '%s'?", e->key, place, near);
    } else {
        cfg_problem_add(problems,
                    "unknown config key '%s' (%s); no zt option has a similar name: see "
                    "docs/config.md and zt-run --describe",
                    e->key, place);
    }
}

static void report_deepspeed(const given_entry *e, const deepspeed_key *ds, const char *place,
                             problem_list *problems)
{
    int whole_section = e->is_object;
    cfg_problem_add(problems,
                "DeepSpeed key '%s' is not supported by zt (%s): %s. zt reads DeepSpeed configs but "
                "does not implement this option; remove %s '%s' from the config",
                e->key, place, ds->why, whole_section ? "the whole section" : "the key", e->key);
}

zt_status zt_config_validate(zt_config *cfg, zt_error *err)
{
    problem_list problems;
    cfg_problems_open(&problems);
    const char **reported = calloc((size_t)cfg->n_given + 1, sizeof *reported);
    int n_reported = 0;
    if (!reported) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory checking the config");

    for (int k = 0; k < cfg->n_given; k++) {
        const given_entry *e = &cfg->given[k];
        const config_doc *doc = &cfg->docs[e->doc];
        char key_place[4200], value_place[4200];
        cfg_describe_place(cfg, e, e->key_offset, key_place, sizeof key_place);
        cfg_describe_value_place(cfg, e, e->value_tok, value_place, sizeof value_place);

        int duplicate = 0;
        for (int earlier = 0; earlier < k && !doc->from_set; earlier++) {
            const given_entry *f = &cfg->given[earlier];
            if (f->doc != e->doc || strcmp(f->key, e->key) != 0) continue;
            int line1, line2, col;
            cfg_doc_line_col(doc, f->key_offset, &line1, &col, NULL);
            cfg_doc_line_col(doc, e->key_offset, &line2, &col, NULL);
            cfg_problem_add(&problems, "config key '%s' is given twice in %s (lines %d and %d); keep one",
                        e->key, doc->origin, line1, line2);
            duplicate = 1;
            break;
        }
        if (duplicate || under_reported_section(e->key, reported, n_reported)) continue;

        const declared_option *decl = cfg_find_decl(cfg, e->key);
        const declared_option *above = find_decl_above(cfg, e->key);
        const declared_option *below = find_decl_below(cfg, e->key);
        const deepspeed_key *ds = find_deepspeed_unsupported(e->key);
        char type[256];

        if (e->is_object) {
            if (decl) {
                cfg_describe_type(decl->opt, type, sizeof type);
                cfg_problem_add(&problems, "config key '%s' must be %s, got an object (%s)", e->key, type,
                            value_place);
                reported[n_reported++] = e->key;
            } else if (!below && cfg_deepspeed_accepts(cfg, e, key_place, &problems)) {
                /* a section zt accepts switched off: its keys are judged one by one */
            } else if (ds && !below) {
                report_deepspeed(e, ds, key_place, &problems);
                reported[n_reported++] = e->key;
            } else if (doc->json.tok[e->value_tok].size == 0 && !below && !above) {
                report_unknown(cfg, e, key_place, &problems); /* an empty {} of an unknown section */
            }
            continue; /* a non-empty object is judged by its keys */
        }
        if (cfg_effective_entry(cfg, e->key) != k) continue; /* overridden: only the winner counts */
        if (decl) {
            if (decl->invalid) {
                cfg_problem_add(&problems, "%s",
                            decl->problem ? decl->problem : "a config value: out of memory describing it");
            }
        } else if (above) {
            cfg_describe_type(above->opt, type, sizeof type);
            cfg_problem_add(&problems,
                        "unknown config key '%s' (%s): '%s' is a single value (%s), not a section",
                        e->key, key_place, above->opt->key, type);
        } else if (below) {
            char got[96];
            cfg_describe_json_value(&doc->json, e->value_tok, got, sizeof got);
            cfg_problem_add(&problems,
                        "config key '%s' must be an object (a section holding keys such as '%s'), got "
                        "%s (%s)",
                        e->key, below->opt->key, got, value_place);
        } else if (cfg_deepspeed_accepts(cfg, e, key_place, &problems)) {
            /* accepted switched off, or the problem is said */
        } else if (ds) {
            report_deepspeed(e, ds, key_place, &problems);
        } else {
            report_unknown(cfg, e, key_place, &problems);
        }
    }
    free(reported);
    zt_status st = cfg_problems_close(&problems, ZT_ERR_CONFIG, err);
    cfg->validated = st == ZT_OK;
    return st;
}
