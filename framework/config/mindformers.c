/* MindFormers' spellings (yaml.h): the keys of a MindFormers YAML config (configs/llama/run_llama_7b.yaml
 * and its kin; the fragments of the seed article) rewritten in the tree to zt's keys before the tree
 * becomes a config document, so that they reach zt's settings and plugins like zt's own keys.
 *
 * Every MindFormers key zt knows is in k_rules (docs/config.md lists them): renamed to the zt key of the
 * same concept (the place then notes "MindFormers KEY", in messages and in the resolved config's
 * _sources); translated where the value changes form (optimizer_shard: true is ZeRO stage 1, beta1 and
 * beta2 are one betas list, an lr_schedule is scheduler.*); accepted and dropped with a note when it has
 * no effect in zt (MindSpore's runtime context, data sinking, ...); accepted only at the value that
 * switches a feature off when zt does not have the feature; or kept aside as a launch key
 * (load_checkpoint, run_mode, use_parallel, resume_training) for the command line. A value given in a
 * MindFormers spelling and in zt's (or in two MindFormers spellings) must agree. Keys not in the table
 * stay as they are, so validation reports a MindFormers key zt does not know as an unknown key.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/yaml.h"

typedef struct mf_ctx mf_ctx;

typedef enum {
    RENAME, /* to the zt key `arg` */
    NOTE,   /* dropped: no effect in zt, because `why` */
    MATCH,  /* accepted at one of the values `arg` ('|'-separated JSON texts; null too), dropped; other
               values ask for what zt does not do: `why` */
    LAUNCH, /* kept aside for the command line */
    CUSTOM  /* fn */
} rule_action;

typedef struct mf_rule {
    const char *key;
    int action;
    const char *arg;
    const char *why;
    void (*fn)(mf_ctx *c, const struct mf_rule *r);
} mf_rule;

/* A MindFormers optimizer zt's adamw plugin computes. */
typedef struct mf_optimizer {
    const char *name;
    const char *eps;  /* its default */
    int bias_correction;
} mf_optimizer;

/* Notes that share their reason become one line. */
typedef struct note_group {
    const char *why;
    char *keys;        /* "a, b, c" (arena) */
    int line, col;     /* the first key's place */
    int n;
} note_group;

struct mf_ctx {
    cfg_yaml_tree *t;
    cfg_yaml_node *root;
    cfg_mf_result *out;
    problem_list *problems;
    note_group groups[64];
    int n_groups;
    char *matched;                 /* keys accepted at a value that switches a feature off */
    int matched_line, matched_col;
    const mf_optimizer *optimizer; /* optimizer.type was one of MindFormers' AdamW kin */
    int optimizer_line, optimizer_col;
    int model_config;              /* model.model_config was given */
    int said_shard;                /* the note on optimizer parallelism is out */
    cfg_yaml_pair multiple_of, ffn_dim_multiplier;
    int have_multiple_of, have_ffn_dim_multiplier;
};

/* ---- helpers ------------------------------------------------------------------------------------- */

static void problem(mf_ctx *c, int line, int col, const char *fmt, ...) ZT_PRINTF(4, 5);
static void problem(mf_ctx *c, int line, int col, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cfg_problem_add(c->problems, "%s:%d:%d: %s", c->t->origin, line, col, msg);
}

static void oom(mf_ctx *c)
{
    cfg_problem_add(c->problems, "%s: out of memory rewriting the MindFormers keys", c->t->origin);
}

/* A line of zt_config_notes. */
static void say(mf_ctx *c, int line, int col, const char *fmt, ...) ZT_PRINTF(4, 5);
static void say(mf_ctx *c, int line, int col, const char *fmt, ...)
{
    fprintf(c->out->notes, "%s:%d:%d: ", c->t->origin, line, col);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(c->out->notes, fmt, ap);
    va_end(ap);
    fputc('\n', c->out->notes);
}

/* `key` has no effect in zt, because `why`. */
static void no_effect(mf_ctx *c, const char *key, int line, int col, const char *why)
{
    for (int k = 0; k < c->n_groups; k++) {
        note_group *g = &c->groups[k];
        if (strcmp(g->why, why)) continue;
        g->keys = cfg_yaml_printf(c->t, "%s, %s", g->keys, key);
        g->n++;
        if (!g->keys) oom(c);
        return;
    }
    if (c->n_groups == (int)(sizeof c->groups / sizeof c->groups[0])) {
        say(c, line, col, "%s (MindFormers) has no effect in zt: %s", key, why);
        return;
    }
    note_group *g = &c->groups[c->n_groups++];
    *g = (note_group){why, cfg_yaml_printf(c->t, "%s", key), line, col, 1};
    if (!g->keys) oom(c);
}

/* "run.yaml:4:3 (MindFormers runner_config.batch_size)" */
static const char *place_of(mf_ctx *c, int line, int col, const char *note)
{
    const char *s = note ? cfg_yaml_printf(c->t, "%s:%d:%d (%s)", c->t->origin, line, col, note)
                         : cfg_yaml_printf(c->t, "%s:%d:%d", c->t->origin, line, col);
    return s ? s : "?";
}

/* Put value `v` at zt key `target`, its key placed at line:col with `note`. A value already there must be
 * the same one (then it stays); a mapping on the way is created. */
static void put(mf_ctx *c, const char *target, cfg_yaml_node *v, int line, int col, const char *note)
{
    cfg_yaml_node *map = c->root;
    const char *part = target;
    v->note = note;
    for (;;) {
        size_t n = strcspn(part, ".");
        char *name = cfg_yaml_strdup(c->t, part, n);
        if (!name) { oom(c); return; }
        cfg_yaml_pair *p = cfg_yaml_find(map, name);
        if (!part[n]) {
            if (!p) {
                if (!cfg_yaml_add_pair(c->t, map, name, line, col, v)) { oom(c); return; }
                map->pairs[map->n - 1].note = note;
                return;
            }
            if (cfg_yaml_same(p->value, v)) return;
            char a[96], b[96];
            cfg_yaml_describe(p->value, a, sizeof a);
            cfg_yaml_describe(v, b, sizeof b);
            cfg_problem_add(c->problems,
                            "config key '%s' is given twice with different values: %s (%s) and %s (%s); keep one",
                            target, a, place_of(c, p->line, p->col, p->note), b, place_of(c, line, col, note));
            return;
        }
        if (!p) {
            cfg_yaml_node *sub = cfg_yaml_new(c->t, CFG_YAML_MAP, NULL, line, col);
            if (!sub || !cfg_yaml_add_pair(c->t, map, name, line, col, sub)) { oom(c); return; }
            sub->note = note;
            map->pairs[map->n - 1].note = note;
            map = sub;
        } else if (p->value->kind == CFG_YAML_MAP) {
            map = p->value;
        } else {
            char a[96];
            cfg_yaml_describe(p->value, a, sizeof a);
            cfg_problem_add(c->problems,
                            "%s sets config key '%s', but '%.*s' is given as a value, %s (%s), not as a mapping",
                            place_of(c, line, col, note), target, (int)(part - target + n), target, a,
                            place_of(c, p->line, p->col, p->note));
            return;
        }
        part += n + 1;
    }
}

static const char *mf_note(mf_ctx *c, const char *key)
{
    const char *s = cfg_yaml_printf(c->t, "MindFormers %s", key);
    if (!s) oom(c);
    return s;
}

static cfg_yaml_node *number(mf_ctx *c, const char *text, int line, int col)
{
    cfg_yaml_node *v = cfg_yaml_new(c->t, CFG_YAML_NUMBER, cfg_yaml_strdup(c->t, text, strlen(text)), line, col);
    if (!v || !v->text) oom(c);
    return v && v->text ? v : NULL;
}

static cfg_yaml_node *boolean(mf_ctx *c, int value, int line, int col)
{
    cfg_yaml_node *v = cfg_yaml_new(c->t, CFG_YAML_BOOL, value ? "true" : "false", line, col);
    if (!v) oom(c);
    return v;
}

static cfg_yaml_node *text(mf_ctx *c, const char *s, int line, int col)
{
    cfg_yaml_node *v = cfg_yaml_new(c->t, CFG_YAML_STRING, s, line, col);
    if (!v) oom(c);
    return v;
}

static int is_text(const cfg_yaml_node *v, const char *s)
{
    return v && v->kind == CFG_YAML_STRING && v->len == strlen(s) && !memcmp(v->text, s, v->len);
}

/* The value of `v` is one of `alternatives` ('|'-separated JSON texts), or null. */
static int matches(const cfg_yaml_node *v, const char *alternatives)
{
    if (v->kind == CFG_YAML_NULL) return 1;
    for (const char *a = alternatives; *a;) {
        size_t n = strcspn(a, "|");
        if (a[0] == '"' && v->kind == CFG_YAML_STRING && v->len == n - 2 && !memcmp(v->text, a + 1, n - 2)) return 1;
        if (a[0] != '"' && v->kind == CFG_YAML_NUMBER && strtod(a, NULL) == cfg_yaml_number(v)) return 1;
        if (a[0] != '"' && v->kind == CFG_YAML_BOOL && strlen(v->text) == n && !memcmp(v->text, a, n)) return 1;
        a += n + (a[n] == '|');
    }
    return 0;
}

/* "a, b, c": the first-level keys of a mapping, for a note about a whole section. */
static const char *keys_of(mf_ctx *c, const cfg_yaml_node *map)
{
    if (map->kind != CFG_YAML_MAP || map->n == 0) return "";
    char *s = cfg_yaml_printf(c->t, " (%s", map->pairs[0].key);
    for (int k = 1; s && k < map->n && k < 8; k++) s = cfg_yaml_printf(c->t, "%s, %s", s, map->pairs[k].key);
    if (s) s = cfg_yaml_printf(c->t, "%s%s)", s, map->n > 8 ? ", ..." : "");
    return s ? s : "";
}

static void note_taken(mf_ctx *c, const char *key, const cfg_yaml_pair *p, const char *why)
{
    const char *name = p->value->kind == CFG_YAML_MAP ? cfg_yaml_printf(c->t, "%s%s", key, keys_of(c, p->value)) : key;
    no_effect(c, name ? name : key, p->line, p->col, why);
}

/* ---- the generic actions ------------------------------------------------------------------------- */

static void launch_key(mf_ctx *c, const char *key, const cfg_yaml_pair *p)
{
    const cfg_yaml_node *v = p->value;
    int is_bool = !strcmp(key, "use_parallel") || !strcmp(key, "resume_training");
    if ((is_bool && v->kind != CFG_YAML_BOOL && v->kind != CFG_YAML_NULL) ||
        (!is_bool && v->kind != CFG_YAML_STRING && v->kind != CFG_YAML_NULL)) {
        char shown[96];
        cfg_yaml_describe(v, shown, sizeof shown);
        if (!strcmp(key, "resume_training") && v->kind == CFG_YAML_STRING)
            {
        problem(c, v->line, v->col, "resume_training %s names a checkpoint file: zt resumes from a checkpoint "
                           "directory; give it as load_checkpoint and set resume_training: true", shown);
        return;
    }
        { problem(c, v->line, v->col, "%s must be %s, got %s", key, is_bool ? "true or false" : "text", shown); return; }
    }
    if (c->out->n_launch == (int)(sizeof c->out->launch / sizeof c->out->launch[0])) return;
    cfg_launch_key *l = &c->out->launch[c->out->n_launch++];
    l->key = (char *)key;
    l->value = v->kind == CFG_YAML_NULL ? "" : (char *)v->text;
    l->place = (char *)place_of(c, v->line, v->col, NULL);
}

static void apply_rule(mf_ctx *c, const mf_rule *r)
{
    if (r->action == CUSTOM) {
        if (cfg_yaml_get(c->root, r->key, NULL)) r->fn(c, r);
        return;
    }
    cfg_yaml_pair p;
    if (!cfg_yaml_take(c->root, r->key, &p)) return;
    switch (r->action) {
    case RENAME: put(c, r->arg, p.value, p.line, p.col, mf_note(c, r->key)); break;
    case NOTE: note_taken(c, r->key, &p, r->why); break;
    case LAUNCH: launch_key(c, r->key, &p); break;
    case MATCH:
        if (matches(p.value, r->arg)) {
            if (!c->matched) c->matched_line = p.line, c->matched_col = p.col;
            c->matched = c->matched ? cfg_yaml_printf(c->t, "%s, %s", c->matched, r->key)
                                    : cfg_yaml_printf(c->t, "%s", r->key);
            if (!c->matched) oom(c);
        } else {
            char shown[96];
            cfg_yaml_describe(p.value, shown, sizeof shown);
            problem(c, p.value->line, p.value->col, "MindFormers key '%s' is %s: %s; set it to %.*s or remove it",
                    r->key, shown, r->why, (int)strcspn(r->arg, "|"), r->arg);
        }
        break;
    }
}

/* ---- optimizer ----------------------------------------------------------------------------------- */

static const mf_optimizer k_optimizers[] = {
    {"AdamWeightDecay", "1e-6", 0},
    {"FP32StateAdamWeightDecay", "1e-6", 0},
    {"AdamW", "1e-8", 1},
};

/* optimizer.type (in place) or train_config.optimizer (to optimizer.type): MindFormers' AdamW kin is the
 * adamw plugin; any other name is left to plugin selection, which lists the optimizers there are. */
static void h_optimizer_type(mf_ctx *c, const mf_rule *r)
{
    cfg_yaml_pair *p;
    cfg_yaml_node *v = cfg_yaml_get(c->root, r->key, &p);
    const mf_optimizer *o = NULL;
    for (size_t k = 0; k < sizeof k_optimizers / sizeof k_optimizers[0]; k++)
        if (is_text(v, k_optimizers[k].name)) o = &k_optimizers[k];
    int in_place = !strcmp(r->key, "optimizer.type");
    if (!o && in_place) return;
    const char *note = mf_note(c, o ? cfg_yaml_printf(c->t, "%s %s", r->key, o->name) : r->key);
    if (o) {
        int first = !c->optimizer;
        c->optimizer = o;
        c->optimizer_line = v->line;
        c->optimizer_col = v->col;
        v->text = "adamw";
        v->len = 5;
        if (!o->bias_correction && first)
            say(c, v->line, v->col,
                "%s %s is zt's adamw (torch.optim.AdamW). MindSpore's AdamWeightDecay takes no bias correction (its "
                "step is lr * (m / (sqrt(v) + eps) + weight_decay * w)); zt's adamw divides m by 1 - beta1^t and v by "
                "1 - beta2^t, so its first steps are larger until those factors near 1 (a few thousand steps with "
                "beta2 0.999). The weight decay is the same: decoupled, lr * weight_decay * w",
                r->key, o->name);
    }
    if (in_place) {
        v->note = note;
        p->note = note;
        return;
    }
    cfg_yaml_pair taken;
    cfg_yaml_take(c->root, r->key, &taken);
    put(c, "optimizer.type", taken.value, taken.line, taken.col, note);
}

/* optimizer.beta1 and optimizer.beta2: one list, optimizer.params.betas; a missing one is MindSpore's default. */
static void h_betas(mf_ctx *c, const mf_rule *r)
{
    (void)r;
    cfg_yaml_pair b1, b2;
    int has1 = cfg_yaml_take(c->root, "optimizer.beta1", &b1), has2 = cfg_yaml_take(c->root, "optimizer.beta2", &b2);
    const cfg_yaml_pair *first = has1 ? &b1 : &b2;
    cfg_yaml_node *list = cfg_yaml_new(c->t, CFG_YAML_SEQ, NULL, first->value->line, first->value->col);
    if (!list) { oom(c); return; }
    cfg_yaml_node *one = has1 ? b1.value : number(c, "0.9", b2.value->line, b2.value->col);
    cfg_yaml_node *two = has2 ? b2.value : number(c, "0.999", b1.value->line, b1.value->col);
    if (!one || !two || !cfg_yaml_append(c->t, list, one) || !cfg_yaml_append(c->t, list, two)) { oom(c); return; }
    const char *note = mf_note(c, has1 && has2 ? "optimizer.beta1, optimizer.beta2"
                                  : has1       ? "optimizer.beta1, and MindSpore's default beta2 0.999"
                                               : "optimizer.beta2, and MindSpore's default beta1 0.9");
    one->note = two->note = note;
    put(c, "optimizer.params.betas", list, first->line, first->col, note);
}

/* After the rules: what MindSpore's AdamWeightDecay defaults to where zt's adamw defaults otherwise. */
static void optimizer_defaults(mf_ctx *c)
{
    if (!c->optimizer) return;
    const char *note = mf_note(c, cfg_yaml_printf(c->t, "optimizer.type %s: its default", c->optimizer->name));
    static const char *const keys[] = {"optimizer.params.eps", "optimizer.params.weight_decay"};
    const char *values[] = {c->optimizer->eps, "0"};
    for (int k = 0; k < 2; k++) {
        if (cfg_yaml_get(c->root, keys[k], NULL)) continue;
        cfg_yaml_node *v = number(c, values[k], c->optimizer_line, c->optimizer_col);
        if (v) put(c, keys[k], v, c->optimizer_line, c->optimizer_col, note);
    }
}

/* ---- parallelism, recomputation, precision -------------------------------------------------------- */

/* parallel_config.optimizer_shard, parallel.enable_parallel_optimizer: ZeRO stage 1 or 0. */
static void h_optimizer_shard(mf_ctx *c, const mf_rule *r)
{
    cfg_yaml_pair p;
    cfg_yaml_take(c->root, r->key, &p);
    if (p.value->kind != CFG_YAML_BOOL) {
        char shown[96];
        cfg_yaml_describe(p.value, shown, sizeof shown);
        { problem(c, p.value->line, p.value->col, "%s must be true or false, got %s", r->key, shown); return; }
    }
    int on = !strcmp(p.value->text, "true");
    cfg_yaml_node *stage = number(c, on ? "1" : "0", p.value->line, p.value->col);
    if (!stage) return;
    put(c, "zero_optimization.stage", stage, p.line, p.col,
        mf_note(c, cfg_yaml_printf(c->t, "%s: %s", r->key, p.value->text)));
    if (on && !c->said_shard++)
        say(c, p.value->line, p.value->col,
            "%s: true is ZeRO stage 1 in zt (zero_optimization.stage 1, the zero1 plugin): MindSpore's optimizer "
            "parallelism partitions the optimizer state and the fp32 weights over the data-parallel ranks and gathers "
            "the weights after each step, which is what zero1 does", r->key);
}

static void h_recompute(mf_ctx *c, const mf_rule *r)
{
    cfg_yaml_pair p;
    cfg_yaml_take(c->root, r->key, &p);
    if (p.value->kind == CFG_YAML_SEQ || p.value->kind == CFG_YAML_NUMBER)
        {
        problem(c, p.value->line, p.value->col,
                       "recompute_config.recompute as %s recomputes a number of layers per pipeline stage; zt recomputes "
                       "every layer or none: write true or false", p.value->kind == CFG_YAML_SEQ ? "a list" : "a number");
        return;
    }
    put(c, "recompute", p.value, p.line, p.col, mf_note(c, r->key));
}

/* model.model_config.compute_dtype: the precision zt's bf16.enabled / fp16.enabled choose. */
static void h_compute_dtype(mf_ctx *c, const mf_rule *r)
{
    cfg_yaml_pair p;
    cfg_yaml_take(c->root, r->key, &p);
    static const struct {
        const char *name;
        int bf16, fp16;
    } k_types[] = {{"float16", 0, 1}, {"bfloat16", 1, 0}, {"float32", 0, 0}};
    for (size_t k = 0; k < sizeof k_types / sizeof k_types[0]; k++) {
        if (!is_text(p.value, k_types[k].name)) continue;
        const char *note = mf_note(c, cfg_yaml_printf(c->t, "%s %s", r->key, k_types[k].name));
        cfg_yaml_node *bf16 = boolean(c, k_types[k].bf16, p.value->line, p.value->col);
        cfg_yaml_node *fp16 = boolean(c, k_types[k].fp16, p.value->line, p.value->col);
        if (bf16) put(c, "bf16.enabled", bf16, p.line, p.col, note);
        if (fp16) put(c, "fp16.enabled", fp16, p.line, p.col, note);
        return;
    }
    char shown[96];
    cfg_yaml_describe(p.value, shown, sizeof shown);
    problem(c, p.value->line, p.value->col,
            "%s %s has no zt counterpart: zt computes in \"bfloat16\" (bf16.enabled), \"float16\" (fp16.enabled) or, on "
            "the CPU, \"float32\"", r->key, shown);
}

/* multiple_of and ffn_dim_multiplier: kept for ffn_size. */
static void h_ffn_parts(mf_ctx *c, const mf_rule *r)
{
    int multiple = strstr(r->key, "multiple_of") != NULL;
    cfg_yaml_take(c->root, r->key, multiple ? &c->multiple_of : &c->ffn_dim_multiplier);
    if (multiple) c->have_multiple_of = 1;
    else c->have_ffn_dim_multiplier = 1;
}

static void h_model_config(mf_ctx *c, const mf_rule *r)
{
    (void)r;
    c->model_config = 1;
}

/* After the rules: the feed-forward width MindFormers' LLaMA derives when it is not given (its other
 * defaults, as max_position_embedding = seq_length, are MindFormers' own: an HF model's config.json,
 * which --model checks the config against, may well say otherwise). */
static void model_defaults(mf_ctx *c)
{
    if (!c->model_config) return;
    cfg_yaml_node *hidden = cfg_yaml_get(c->root, "model.hidden_size", NULL);
    const cfg_yaml_pair *mult = c->have_multiple_of ? &c->multiple_of : NULL;
    const cfg_yaml_pair *ffn = c->have_ffn_dim_multiplier ? &c->ffn_dim_multiplier : NULL;
    if (cfg_yaml_get(c->root, "model.intermediate_size", NULL)) {
        if (mult) no_effect(c, "model.model_config.multiple_of", mult->line, mult->col, "intermediate_size is given");
        if (ffn) no_effect(c, "model.model_config.ffn_dim_multiplier", ffn->line, ffn->col, "intermediate_size is given");
        return;
    }
    if (!hidden || hidden->kind != CFG_YAML_NUMBER) {
        if (mult) no_effect(c, "model.model_config.multiple_of", mult->line, mult->col, "hidden_size is not given");
        if (ffn) no_effect(c, "model.model_config.ffn_dim_multiplier", ffn->line, ffn->col, "hidden_size is not given");
        return;
    }
    /* MindFormers' LLaMA feed-forward width: 4h, times (ffn_dim_multiplier + 0.01) when given, 2/3 of
     * that, rounded up to a multiple of multiple_of (256 by default) */
    if ((mult && mult->value->kind != CFG_YAML_NUMBER) || (ffn && ffn->value->kind != CFG_YAML_NUMBER &&
                                                           ffn->value->kind != CFG_YAML_NULL)) {
        const cfg_yaml_pair *bad = mult && mult->value->kind != CFG_YAML_NUMBER ? mult : ffn;
        {
        problem(c, bad->value->line, bad->value->col, "%s must be a number",
                       bad == mult ? "model.model_config.multiple_of" : "model.model_config.ffn_dim_multiplier");
        return;
    }
    }
    double multiple = mult ? cfg_yaml_number(mult->value) : 256;
    if (multiple < 1 || multiple != floor(multiple))
        {
        problem(c, mult->value->line, mult->value->col, "model.model_config.multiple_of must be a positive "
                       "integer, got %s", mult->value->text);
        return;
    }
    double width = 4 * cfg_yaml_number(hidden);
    if (ffn && ffn->value->kind == CFG_YAML_NUMBER) width = floor((cfg_yaml_number(ffn->value) + 0.01) * width);
    width = floor(2 * width / 3);
    width = multiple * floor((width + multiple - 1) / multiple);
    char shown[32];
    snprintf(shown, sizeof shown, "%.0f", width);
    const cfg_yaml_pair *from = mult ? mult : ffn;
    int line = from ? from->line : hidden->line, col = from ? from->col : hidden->col;
    cfg_yaml_node *v = number(c, shown, line, col);
    if (v)
        put(c, "model.intermediate_size", v, line, col,
            mf_note(c, cfg_yaml_printf(c->t, "model.model_config.hidden_size x 8/3 rounded up to multiple_of %.0f%s",
                                       multiple, ffn ? " with ffn_dim_multiplier" : "")));
}

/* ---- data, schedule, loss scale, callbacks ------------------------------------------------------- */

static void h_dataset_dir(mf_ctx *c, const mf_rule *r)
{
    cfg_yaml_pair p;
    cfg_yaml_take(c->root, r->key, &p);
    if (p.value->kind == CFG_YAML_NULL || (p.value->kind == CFG_YAML_STRING && p.value->len == 0)) return;
    put(c, "data.path", p.value, p.line, p.col, mf_note(c, r->key));
    say(c, p.value->line, p.value->col,
        "%s is zt's data.path, which must be a data set written by zt-prep (zt does not read MindRecord files: "
        "tokenize the source JSON with zt-prep)", r->key);
}

/* One field of an lr_schedule mapping: taken, NULL when absent. */
static cfg_yaml_node *field(cfg_yaml_node *map, const char *key, cfg_yaml_pair *out)
{
    return cfg_yaml_take(map, key, out) ? out->value : NULL;
}

static int need_number(mf_ctx *c, const cfg_yaml_node *v, const char *key)
{
    if (v->kind == CFG_YAML_NUMBER) return 1;
    char shown[96];
    cfg_yaml_describe(v, shown, sizeof shown);
    problem(c, v->line, v->col, "%s must be a number, got %s", key, shown);
    return 0;
}

/* lr_schedule: MindFormers' schedules that zt's scheduler.* compute. */
static void h_lr_schedule(mf_ctx *c, const mf_rule *r)
{
    cfg_yaml_pair s;
    cfg_yaml_take(c->root, r->key, &s);
    cfg_yaml_node *m = s.value;
    if (m->kind != CFG_YAML_MAP)
        { problem(c, m->line, m->col, "lr_schedule must be a mapping (type: CosineWithWarmUpLR, learning_rate: ...)"); return; }
    cfg_yaml_pair pt, plr, pinit, pws, pwr, ptot, pend, pcyc, pdec;
    cfg_yaml_node *type = field(m, "type", &pt), *lr = field(m, "learning_rate", &plr);
    cfg_yaml_node *init = field(m, "warmup_lr_init", &pinit), *ws = field(m, "warmup_steps", &pws);
    cfg_yaml_node *wr = field(m, "warmup_ratio", &pwr), *total = field(m, "total_steps", &ptot);
    cfg_yaml_node *end = field(m, "lr_end", &pend), *cycles = field(m, "num_cycles", &pcyc);
    cfg_yaml_node *decay = field(m, "decay_steps", &pdec);
    static const char *const mf[] = {"ConstantWarmUpLR", "LinearWithWarmUpLR", "CosineWithWarmUpLR"};
    static const char *const zt[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
    int kind = -1;
    for (int k = 0; k < 3; k++)
        if (is_text(type, mf[k])) kind = k;
    if (kind < 0) {
        char shown[96] = "missing";
        if (type) cfg_yaml_describe(type, shown, sizeof shown);
        {
        problem(c, type ? type->line : s.line, type ? type->col : s.col,
                       "lr_schedule.type %s has no zt schedule: ConstantWarmUpLR, LinearWithWarmUpLR and "
                       "CosineWithWarmUpLR translate to zt's scheduler.type WarmupLR, WarmupDecayLR and "
                       "WarmupCosineLR; for another, write scheduler.* (docs/config.md)", shown);
        return;
    }
    }
    for (int k = 0; k < m->n; k++)
        problem(c, m->pairs[k].line, m->pairs[k].col, "lr_schedule.%s is not translated to zt (only type, learning_rate, "
                "warmup_steps, warmup_ratio, warmup_lr_init, total_steps, lr_end, num_cycles and decay_steps are): "
                "remove it, or write zt's scheduler.* keys instead", m->pairs[k].key);
    const char *note = cfg_yaml_printf(c->t, "MindFormers lr_schedule.type %s", mf[kind]);
    cfg_yaml_node *zt_type = text(c, zt[kind], type->line, type->col);
    if (zt_type) put(c, "scheduler.type", zt_type, pt.line, pt.col, note);
    int decays = kind != 0;
    double total_steps = -1;
    if (total) {
        if (total->kind != CFG_YAML_NULL) need_number(c, total, "lr_schedule.total_steps");
        if (total->kind == CFG_YAML_NUMBER) total_steps = cfg_yaml_number(total);
        if (total_steps > 0 && decays)
            put(c, "scheduler.params.total_num_steps", total, ptot.line, ptot.col, mf_note(c, "lr_schedule.total_steps"));
        else if (total_steps > 0)
            no_effect(c, "lr_schedule.total_steps", ptot.line, ptot.col, "ConstantWarmUpLR does not decay");
        else
            no_effect(c, "lr_schedule.total_steps", ptot.line, ptot.col,
                      "-1 (or null) is MindFormers' \"all the steps of the data set\": zt's schedule decays over "
                      "`steps` unless scheduler.params.total_num_steps is set");
    }
    if (lr) put(c, "scheduler.params.warmup_max_lr", lr, plr.line, plr.col, mf_note(c, "lr_schedule.learning_rate"));
    if (init) {
        if (kind == 1 && !(init->kind == CFG_YAML_NUMBER && cfg_yaml_number(init) == 0))
            problem(c, init->line, init->col, "lr_schedule.warmup_lr_init with LinearWithWarmUpLR: MindFormers decays "
                    "to 0, zt's WarmupDecayLR decays to its warm-up start (scheduler.params.warmup_min_lr), so they "
                    "agree only at 0: remove it or set it to 0");
        else put(c, "scheduler.params.warmup_min_lr", init, pinit.line, pinit.col, mf_note(c, "lr_schedule.warmup_lr_init"));
    }
    if (ws && wr)
        problem(c, wr->line, wr->col, "lr_schedule gives warmup_steps and warmup_ratio; MindFormers takes the ratio: "
                "keep one");
    else if (ws)
        put(c, "scheduler.params.warmup_num_steps", ws, pws.line, pws.col, mf_note(c, "lr_schedule.warmup_steps"));
    else if (wr && need_number(c, wr, "lr_schedule.warmup_ratio")) {
        if (total_steps > 0) {
            char steps[32];
            snprintf(steps, sizeof steps, "%.0f", floor(total_steps * cfg_yaml_number(wr)));
            cfg_yaml_node *v = number(c, steps, wr->line, wr->col);
            if (v)
                put(c, "scheduler.params.warmup_num_steps", v, pwr.line, pwr.col,
                    mf_note(c, "lr_schedule.warmup_ratio x total_steps"));
        } else {
            problem(c, wr->line, wr->col, "lr_schedule.warmup_ratio %s with no total_steps (or -1, the data set's): "
                    "MindFormers takes that share of the steps its data set has; zt's warm-up is a number of steps: "
                    "write lr_schedule.warmup_steps N (or scheduler.params.warmup_num_steps)", wr->text);
        }
    }
    if (kind == 2) {
        if (cycles && !(cycles->kind == CFG_YAML_NUMBER && cfg_yaml_number(cycles) == 0.5))
            problem(c, cycles->line, cycles->col, "lr_schedule.num_cycles other than 0.5 (one half cosine) has no zt "
                    "schedule: remove it");
        if (decay && !(decay->kind == CFG_YAML_NUMBER && total && total->kind == CFG_YAML_NUMBER &&
                       cfg_yaml_number(decay) == total_steps))
            problem(c, decay->line, decay->col, "lr_schedule.decay_steps (holding lr_end after that step) has no zt "
                    "counterpart unless it equals total_steps: remove it");
        /* the floor: lr_end, as a fraction of the peak (MindFormers' default lr_end is 0) */
        if (end && !need_number(c, end, "lr_schedule.lr_end")) return;
        if (end && (!lr || lr->kind != CFG_YAML_NUMBER || cfg_yaml_number(lr) <= 0))
            {
        problem(c, end->line, end->col, "lr_schedule.lr_end needs lr_schedule.learning_rate (a positive "
                           "number) to become zt's scheduler.params.cos_min_ratio, lr_end / learning_rate");
        return;
    }
        char ratio[40] = "0";
        if (end) cfg_format_double(cfg_yaml_number(end) / cfg_yaml_number(lr), ratio, sizeof ratio);
        cfg_yaml_node *v = number(c, ratio, end ? end->line : type->line, end ? end->col : type->col);
        if (v)
            put(c, "scheduler.params.cos_min_ratio", v, end ? pend.line : pt.line, end ? pend.col : pt.col,
                mf_note(c, end ? "lr_schedule.lr_end / lr_schedule.learning_rate"
                               : "lr_schedule: CosineWithWarmUpLR's default lr_end 0"));
    } else {
        if (end) problem(c, end->line, end->col, "lr_schedule.lr_end is read by CosineWithWarmUpLR only: remove it");
        if (cycles) problem(c, cycles->line, cycles->col, "lr_schedule.num_cycles is read by CosineWithWarmUpLR only");
        if (decay) problem(c, decay->line, decay->col, "lr_schedule.decay_steps is read by CosineWithWarmUpLR only");
    }
}

/* runner_wrapper: its loss scale (fp16.*) and its gradient clipping (gradient_clipping). */
static void h_runner_wrapper(mf_ctx *c, const mf_rule *r)
{
    cfg_yaml_pair w;
    cfg_yaml_take(c->root, r->key, &w);
    cfg_yaml_node *m = w.value;
    if (m->kind != CFG_YAML_MAP) { problem(c, m->line, m->col, "runner_wrapper must be a mapping"); return; }
    cfg_yaml_pair ps, pclip, pnorm, ptype;
    cfg_yaml_node *scale = field(m, "scale_sense", &ps), *clip = field(m, "use_clip_grad", &pclip);
    cfg_yaml_node *norm = field(m, "max_grad_norm", &pnorm), *type = field(m, "type", &ptype);
    if (type)
        no_effect(c, "runner_wrapper.type", ptype.line, ptype.col,
                  "the training step is zt's own (loss scaling and gradient clipping are its fp16.* and "
                  "gradient_clipping keys)");
    if (scale && scale->kind == CFG_YAML_MAP) {
        cfg_yaml_pair pst, pv, pf, pw;
        cfg_yaml_node *st = field(scale, "type", &pst), *value = field(scale, "loss_scale_value", &pv);
        cfg_yaml_node *factor = field(scale, "scale_factor", &pf), *window = field(scale, "scale_window", &pw);
        if (!is_text(st, "DynamicLossScaleUpdateCell")) {
            char shown[96] = "missing";
            if (st) cfg_yaml_describe(st, shown, sizeof shown);
            problem(c, st ? st->line : ps.line, st ? st->col : ps.col,
                    "runner_wrapper.scale_sense.type %s: zt's fp16 loss scale is dynamic (DynamicLossScaleUpdateCell, "
                    "fp16.*); a fixed loss scale is not implemented", shown);
        }
        if (value && need_number(c, value, "runner_wrapper.scale_sense.loss_scale_value")) {
            int power;
            double frac = frexp(cfg_yaml_number(value), &power);
            if (frac != 0.5 || power - 1 < 0 || power - 1 > 32) {
                problem(c, value->line, value->col, "runner_wrapper.scale_sense.loss_scale_value %s: zt's loss scale "
                        "starts at a power of two from 1 to 2^32 (fp16.initial_scale_power)", value->text);
            } else {
                char p2[8];
                snprintf(p2, sizeof p2, "%d", power - 1);
                cfg_yaml_node *v = number(c, p2, value->line, value->col);
                if (v)
                    put(c, "fp16.initial_scale_power", v, pv.line, pv.col,
                        mf_note(c, "runner_wrapper.scale_sense.loss_scale_value = 2^initial_scale_power"));
            }
        }
        if (factor && !(factor->kind == CFG_YAML_NUMBER && cfg_yaml_number(factor) == 2))
            problem(c, factor->line, factor->col, "runner_wrapper.scale_sense.scale_factor other than 2: zt halves and "
                    "doubles its loss scale; remove it or set it to 2");
        if (window)
            put(c, "fp16.loss_scale_window", window, pw.line, pw.col, mf_note(c, "runner_wrapper.scale_sense.scale_window"));
        for (int k = 0; k < scale->n; k++)
            problem(c, scale->pairs[k].line, scale->pairs[k].col, "runner_wrapper.scale_sense.%s is not translated to "
                    "zt: remove it", scale->pairs[k].key);
        say(c, ps.line, ps.col, "runner_wrapper.scale_sense is zt's fp16 loss scale (fp16.*), used when fp16.enabled is "
            "true (compute_dtype float16); bf16 and the CPU's fp32 need none");
    } else if (scale) {
        problem(c, scale->line, scale->col, "runner_wrapper.scale_sense as a number is a fixed loss scale, which zt does "
                "not implement (its fp16 loss scale is dynamic, fp16.*): remove it");
    }
    if (clip && clip->kind != CFG_YAML_BOOL) {
        problem(c, clip->line, clip->col, "runner_wrapper.use_clip_grad must be true or false");
    } else if (clip && !strcmp(clip->text, "false")) {
        cfg_yaml_node *v = number(c, "0", clip->line, clip->col);
        if (v) put(c, "gradient_clipping", v, pclip.line, pclip.col, mf_note(c, "runner_wrapper.use_clip_grad: false"));
        if (norm) no_effect(c, "runner_wrapper.max_grad_norm", pnorm.line, pnorm.col, "use_clip_grad is false");
    } else if (clip) {
        cfg_yaml_node *v = norm ? norm : number(c, "1", clip->line, clip->col);
        if (v)
            put(c, "gradient_clipping", v, norm ? pnorm.line : pclip.line, norm ? pnorm.col : pclip.col,
                mf_note(c, norm ? "runner_wrapper.max_grad_norm"
                                : "runner_wrapper.use_clip_grad: true, MindFormers' default max_grad_norm 1.0"));
    } else if (norm) {
        no_effect(c, "runner_wrapper.max_grad_norm", pnorm.line, pnorm.col,
                  "MindFormers clips only with use_clip_grad: true");
    }
    for (int k = 0; k < m->n; k++)
        no_effect(c, cfg_yaml_printf(c->t, "runner_wrapper.%s", m->pairs[k].key), m->pairs[k].line, m->pairs[k].col,
                  "MindSpore's training-step cell settings; zt's step is its own");
}

/* callbacks: the checkpoint monitor's interval and count are checkpoint.*; the others are logging. */
static void h_callbacks(mf_ctx *c, const mf_rule *r)
{
    cfg_yaml_pair p;
    cfg_yaml_take(c->root, r->key, &p);
    if (p.value->kind != CFG_YAML_SEQ) { note_taken(c, "callbacks", &p, "zt logs every log.every steps"); return; }
    for (int k = 0; k < p.value->n; k++) {
        cfg_yaml_node *item = p.value->items[k];
        cfg_yaml_pair *type = item->kind == CFG_YAML_MAP ? cfg_yaml_find(item, "type") : NULL;
        if (!type || !(is_text(type->value, "CheckpointMointor") || is_text(type->value, "CheckpointMonitor"))) {
            char shown[96] = "an item";
            if (type) cfg_yaml_describe(type->value, shown, sizeof shown);
            no_effect(c, cfg_yaml_printf(c->t, "callbacks %s", shown), item->line, item->col,
                      "zt logs the loss, learning rate and throughput every log.every steps");
            continue;
        }
        static const char *const mf[] = {"save_checkpoint_steps", "keep_checkpoint_max", "directory"};
        static const char *const zt[] = {"checkpoint.every", "checkpoint.keep", "checkpoint.dir"};
        for (int f = 0; f < 3; f++) {
            cfg_yaml_pair q;
            if (!cfg_yaml_take(item, mf[f], &q)) continue;
            if (f == 2 && (q.value->kind == CFG_YAML_NULL || (q.value->kind == CFG_YAML_STRING && !q.value->len)))
                continue;
            put(c, zt[f], q.value, q.line, q.col,
                mf_note(c, cfg_yaml_printf(c->t, "callbacks %s.%s", type->value->text, mf[f])));
        }
        for (int f = 0; f < item->n; f++)
            if (strcmp(item->pairs[f].key, "type"))
                no_effect(c, cfg_yaml_printf(c->t, "callbacks %s.%s", type->value->text, item->pairs[f].key),
                          item->pairs[f].line, item->pairs[f].col,
                          "zt writes its checkpoints its own way (docs/checkpoint-format.md)");
    }
}

/* ---- the table ----------------------------------------------------------------------------------- */

#define NO_EFFECT(key, why) {key, NOTE, NULL, why, NULL}
#define OFF(key, values, why) {key, MATCH, values, why, NULL}

static const char k_generation[] =
    "a generation setting; zt-run --generate takes --max-new-tokens, --temperature and --top-p";
static const char k_precision[] =
    "zt chooses the precision of each computation itself (norms, softmax and rotary angles in fp32; docs/cuda.md)";
static const char k_strategy[] =
    "zt's checkpoints hold whole tensors and load under any layout, so it needs no strategy files";

static const mf_rule k_rules[] = {
    /* launch keys: the command line's (cli/mindformers.c) */
    {"run_mode", LAUNCH, NULL, NULL, NULL},
    {"load_checkpoint", LAUNCH, NULL, NULL, NULL},
    {"resume_training", LAUNCH, NULL, NULL, NULL},
    {"use_parallel", LAUNCH, NULL, NULL, NULL},
    NO_EFFECT("src_strategy_path_or_dir", k_strategy),
    OFF("only_save_strategy", "false", k_strategy),
    OFF("trainer.type", "\"CausalLanguageModelingTrainer\"", "zt-run trains causal language models only"),
    NO_EFFECT("trainer.model_name", "the model is the model plugin's (llama), shaped by model.* or --model DIR"),

    /* runner_config */
    {"runner_config.batch_size", RENAME, "train_micro_batch_size_per_gpu", NULL, NULL},
    {"runner_config.epochs", RENAME, "epochs", NULL, NULL},
    {"runner_config.gradient_accumulation_steps", RENAME, "gradient_accumulation_steps", NULL, NULL},
    NO_EFFECT("runner_config.sink_mode", "MindSpore's data sinking to the device; zt feeds each step itself"),
    NO_EFFECT("runner_config.sink_size", "MindSpore's data sinking to the device; zt feeds each step itself"),
    OFF("runner_config.initial_epoch", "0", "zt continues a run from its checkpoint's position (--resume)"),
    OFF("runner_config.initial_step", "0", "zt continues a run from its checkpoint's position (--resume)"),

    /* optimizer, lr_schedule */
    {"optimizer.type", CUSTOM, NULL, NULL, h_optimizer_type},
    {"optimizer.beta1", CUSTOM, NULL, NULL, h_betas},
    {"optimizer.beta2", CUSTOM, NULL, NULL, h_betas},
    {"optimizer.betas", RENAME, "optimizer.params.betas", NULL, NULL},
    {"optimizer.eps", RENAME, "optimizer.params.eps", NULL, NULL},
    {"optimizer.weight_decay", RENAME, "optimizer.params.weight_decay", NULL, NULL},
    {"optimizer.learning_rate", RENAME, "optimizer.params.lr", NULL, NULL},
    {"lr_schedule", CUSTOM, NULL, NULL, h_lr_schedule},
    OFF("lr_scale", "false", "zt does not scale the learning rate by the batch size; set optimizer.params.lr"),
    NO_EFFECT("lr_scale_factor", "lr_scale is off"),
    OFF("layer_scale", "false", "layer-wise learning-rate decay is not implemented"),
    NO_EFFECT("layer_decay", "layer_scale is off"),

    /* the seed article's train_config and parallel_context_config */
    {"train_config.optimizer", CUSTOM, NULL, NULL, h_optimizer_type},
    {"train_config.learning_rate", RENAME, "optimizer.params.lr", NULL, NULL},
    {"train_config.trainable_params", RENAME, "trainable_params", NULL, NULL},
    {"model.model_config.pet_config.freeze_include", RENAME, "pet_config.freeze_include", NULL, NULL},
    {"model.model_config.pet_config.freeze_exclude", RENAME, "pet_config.freeze_exclude", NULL, NULL},
    NO_EFFECT("train_config.parallel_mode", "zt lays the ranks out from the parallel_config sizes; there is no "
              "parallel mode to choose"),
    {"parallel_context_config.only_trainable_params", RENAME, "checkpoint.only_trainable", NULL, NULL},

    /* data */
    {"train_dataset.data_loader.dataset_dir", CUSTOM, NULL, NULL, h_dataset_dir},
    {"train_dataset.data_loader.shuffle", RENAME, "data.shuffle", NULL, NULL},
    {"train_dataset.batch_size", RENAME, "train_micro_batch_size_per_gpu", NULL, NULL},
    NO_EFFECT("train_dataset", "zt's data loader reads zt-prep data sets; its settings are data.*"),
    NO_EFFECT("train_dataset_task", "its dataset_config repeats train_dataset"),
    OFF("do_eval", "false", "zt evaluates during training every eval.every steps on the data set's held-out split "
        "(zt-prep --val-fraction): set eval.every instead"),
    NO_EFFECT("eval_dataset", "zt evaluates on the training data set's held-out split (eval.*)"),
    NO_EFFECT("eval_dataset_task", "zt evaluates on the training data set's held-out split (eval.*)"),

    /* parallelism */
    {"parallel_config.optimizer_shard", CUSTOM, NULL, NULL, h_optimizer_shard},
    {"parallel.enable_parallel_optimizer", CUSTOM, NULL, NULL, h_optimizer_shard},
    {"parallel_config.auto_trans_ckpt", RENAME, "auto_trans_ckpt", NULL, NULL},
    {"parallel_config.only_trainable_params", RENAME, "checkpoint.only_trainable", NULL, NULL},
    OFF("parallel.strategy_ckpt_config.only_trainable_params", "false", k_strategy),
    OFF("parallel_config.expert_parallel", "1", "zt has no mixture-of-experts models"),
    OFF("parallel_config.context_parallel", "1", "context parallelism is not implemented"),
    NO_EFFECT("parallel_config.vocab_emb_dp", "zt's parallel plugin decides how the embedding is split"),
    NO_EFFECT("parallel_config.gradient_aggregation_group", "zt's zero plugin buckets the gradients itself "
              "(zero_optimization.reduce_bucket_size)"),
    OFF("micro_batch_interleave_num", "1", "micro-batch interleaving is not implemented"),
    OFF("parallel.enable_alltoall", "false", "zt has no mixture-of-experts models"),
    NO_EFFECT("parallel", "MindSpore's auto-parallel context; zt lays the ranks out from parallel_config and "
              "zero_optimization"),

    /* recomputation */
    {"recompute_config.recompute", CUSTOM, NULL, NULL, h_recompute},
    OFF("recompute_config.select_recompute", "false", "selective recomputation is not implemented: zt recomputes "
        "whole layers (recompute: true)"),
    OFF("recompute_config.select_comm_recompute", "false", "selective recomputation is not implemented: zt "
        "recomputes whole layers (recompute: true)"),
    NO_EFFECT("recompute_config.parallel_optimizer_comm_recompute", "zt's recomputation reruns the layers' math, "
              "never their communication"),
    NO_EFFECT("recompute_config.mp_comm_recompute", "zt's recomputation reruns the layers' math, never their "
              "communication"),
    NO_EFFECT("recompute_config.recompute_slice_activation", "zt's recomputation reruns the layers' math, never "
              "their communication"),

    /* the model */
    {"model.model_config", CUSTOM, NULL, NULL, h_model_config},
    OFF("model.model_config.type", "\"LlamaConfig\"", "zt's model plugin is llama (LLaMA 1, 2 and 3)"),
    OFF("model.arch.type", "\"LlamaForCausalLM\"", "zt's model plugin is llama (LLaMA 1, 2 and 3)"),
    {"model.model_config.hidden_size", RENAME, "model.hidden_size", NULL, NULL},
    {"model.model_config.num_layers", RENAME, "model.num_hidden_layers", NULL, NULL},
    {"model.model_config.num_heads", RENAME, "model.num_attention_heads", NULL, NULL},
    {"model.model_config.n_kv_heads", RENAME, "model.num_key_value_heads", NULL, NULL},
    {"model.model_config.vocab_size", RENAME, "model.vocab_size", NULL, NULL},
    {"model.model_config.intermediate_size", RENAME, "model.intermediate_size", NULL, NULL},
    {"model.model_config.rms_norm_eps", RENAME, "model.rms_norm_eps", NULL, NULL},
    {"model.model_config.theta", RENAME, "model.rope_theta", NULL, NULL},
    {"model.model_config.max_position_embedding", RENAME, "model.max_position_embeddings", NULL, NULL},
    {"model.model_config.tie_word_embeddings", RENAME, "model.tie_word_embeddings", NULL, NULL},
    {"model.model_config.seq_length", RENAME, "data.seq_len", NULL, NULL},
    {"model.model_config.multiple_of", CUSTOM, NULL, NULL, h_ffn_parts},
    {"model.model_config.ffn_dim_multiplier", CUSTOM, NULL, NULL, h_ffn_parts},
    {"model.model_config.compute_dtype", CUSTOM, NULL, NULL, h_compute_dtype},
    NO_EFFECT("model.model_config.layernorm_compute_type", k_precision),
    NO_EFFECT("model.model_config.softmax_compute_type", k_precision),
    NO_EFFECT("model.model_config.rotary_dtype", k_precision),
    NO_EFFECT("model.model_config.param_init_type", "zt keeps fp32 master weights"),
    NO_EFFECT("model.model_config.batch_size", "MindFormers' batch size for prediction; zt-run --generate runs one "
              "prompt"),
    NO_EFFECT("model.model_config.bos_token_id", "zt takes the special tokens from the tokenizer"),
    NO_EFFECT("model.model_config.eos_token_id", "zt takes the special tokens from the tokenizer"),
    NO_EFFECT("model.model_config.pad_token_id", "zt takes the special tokens from the tokenizer"),
    NO_EFFECT("model.model_config.ignore_token_id", "zt's loss covers the tokens zt-prep marked (the responses)"),
    NO_EFFECT("model.model_config.use_past", "generation uses the attention plugin's KV cache; training needs none"),
    NO_EFFECT("model.model_config.use_past_shard", "generation uses the attention plugin's KV cache; training needs "
              "none"),
    NO_EFFECT("model.model_config.use_flash_attention", "zt chooses the attention plugin: flash on GPU runs, naive "
              "elsewhere (--plugins names another)"),
    NO_EFFECT("model.model_config.pretrain_seqlen", "rotary positions are not interpolated (extend_method \"None\")"),
    OFF("model.model_config.extend_method", "\"None\"", "position interpolation (PI, NTK) is not implemented; Llama "
        "3.1's scaling is model.rope_scaling.*"),
    NO_EFFECT("model.model_config.compute_in_2d", "a MindSpore graph layout choice"),
    OFF("model.model_config.offset", "0", "zt's pipeline plugin splits the layers evenly"),
    NO_EFFECT("model.model_config.checkpoint_name_or_path", "zt loads weights from load_checkpoint or --model DIR"),
    NO_EFFECT("model.model_config.repetition_penalty", k_generation),
    NO_EFFECT("model.model_config.max_decode_length", k_generation),
    NO_EFFECT("model.model_config.top_k", k_generation),
    NO_EFFECT("model.model_config.top_p", k_generation),
    NO_EFFECT("model.model_config.do_sample", k_generation),

    /* the rest of MindSpore's setup */
    {"runner_wrapper", CUSTOM, NULL, NULL, h_runner_wrapper},
    {"callbacks", CUSTOM, NULL, NULL, h_callbacks},
    NO_EFFECT("eval_callbacks", "zt logs the evaluation loss every eval.every steps"),
    NO_EFFECT("context", "MindSpore's runtime context; zt's device is the device key, its GPU memory cap "
              "gpu_mem_limit"),
    NO_EFFECT("processor", "zt's tokenizer is the data set's (zt-prep -t) or MODEL/tokenizer.model"),
    NO_EFFECT("metric", "zt reports the loss and perplexity of the held-out split"),
    OFF("profile", "false", "profiling is not implemented"),
    NO_EFFECT("profile_start_step", "profile is off"),
    NO_EFFECT("profile_stop_step", "profile is off"),
    NO_EFFECT("init_start_profile", "profile is off"),
    NO_EFFECT("profile_communication", "profile is off"),
    NO_EFFECT("profile_memory", "profile is off"),
    OFF("auto_tune", "false", "autotuning is not implemented"),
    NO_EFFECT("filepath_prefix", "auto_tune is off"),
    NO_EFFECT("autotune_per_step", "auto_tune is off"),
    NO_EFFECT("remote_save_url", "zt writes to output_dir; uploading to OBS is not part of zt"),
};

void cfg_mindformers_apply(cfg_yaml_tree *t, cfg_mf_result *out, problem_list *problems)
{
    mf_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    c.root = t->root;
    c.out = out;
    c.problems = problems;
    for (size_t k = 0; k < sizeof k_rules / sizeof k_rules[0]; k++) apply_rule(&c, &k_rules[k]);
    optimizer_defaults(&c);
    model_defaults(&c);
    const cfg_yaml_pair *epochs = cfg_yaml_find(c.root, "epochs");
    if (epochs && epochs->note && !cfg_yaml_find(c.root, "steps"))
        say(&c, epochs->line, epochs->col,
            "runner_config.epochs is zt's epochs: zt stops after that many epochs or `steps` optimizer steps (default "
            "1000), whichever comes first; set steps too to train every epoch");
    for (int k = 0; k < c.n_groups; k++) {
        const note_group *g = &c.groups[k];
        say(&c, g->line, g->col, "%s (MindFormers) %s no effect in zt: %s", g->keys, g->n > 1 ? "have" : "has", g->why);
    }
    if (c.matched)
        say(&c, c.matched_line, c.matched_col, "accepted, as their values ask for what zt does anyway (or switch off what it does not do): %s", c.matched);
    cfg_yaml_prune(c.root);
}
