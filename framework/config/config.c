/* Run configuration: JSON file(s) plus --set overrides, checked against the schemas of the host and
 * of every loaded plugin (see config.h and docs/config.md).
 *
 * Model: every given value is an entry "dotted.key -> JSON token" that remembers where it came from.
 * Objects are flattened (an array stays one value); each object is also kept as an entry, marked
 * is_object, so that "zero_optimization.stage": {...} or an empty {} can be reported instead of
 * vanishing. Every declared option holds its effective value, re-resolved whenever a value or a schema
 * is added, so the host can read its own keys (which select the plugins) before the plugins' schemas
 * exist; zt_config_validate then reports every problem at once.
 */
#define _POSIX_C_SOURCE 200809L

#include "base/fileio.h"
#include "config/config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"

/* ---- data ---------------------------------------------------------------------------------- */

typedef struct config_doc {
    char *text;   /* owned; the tokens point into it */
    char *origin; /* the file path, or "--set KEY=VALUE" */
    int from_set;
    zt_json json;
} config_doc;

typedef struct given_entry {
    char *key;         /* dotted path */
    int doc;           /* index into docs */
    int value_tok;
    size_t key_offset; /* file: offset of the key's opening quote */
    int is_object;     /* an object: kept for conflict checks, never a value */
} given_entry;

typedef struct option_value {
    int present;          /* 0: a ZT_OPT_NO_DEFAULT key that was not given (or given as null) */
    int32_t b;            /* BOOL */
    int64_t i;            /* INT, BYTES */
    double f;             /* FLOAT */
    const char *s;        /* STRING, ENUM (in the arena) */
    const double *floats; /* FLOATS (in the arena) */
    int32_t n_floats;
} option_value;

typedef struct declared_option {
    const zt_option *opt;
    const char *owner; /* in the arena */
    option_value def;  /* the parsed default */
    option_value value;/* the effective value: the given one when valid, else def */
    int given;         /* index of the effective entry, -1 when nothing was given */
    int invalid;       /* the given value is wrong; `problem` says why */
    char *problem;     /* one full message line (may be NULL when even that allocation failed) */
} declared_option;

struct zt_config {
    config_doc *docs;
    int n_docs, cap_docs;
    given_entry *given;
    int n_given, cap_given;
    declared_option *decl;
    int n_decl, cap_decl;
    /* Strings and arrays handed out by the getters: freed only with the config, so a pointer a
     * caller holds stays valid even when a later --set re-resolves the key. */
    void **arena;
    int n_arena, cap_arena;
    int validated;
};

static int grow(void **items, int *cap, int need, size_t item_size)
{
    if (need <= *cap) return 1;
    int new_cap = *cap ? *cap * 2 : 16;
    while (new_cap < need) new_cap *= 2;
    void *p = realloc(*items, (size_t)new_cap * item_size);
    if (!p) return 0;
    *items = p;
    *cap = new_cap;
    return 1;
}

/* Hand `p` to the config (freed by zt_config_free); on failure frees p and returns NULL. */
static void *arena_keep(zt_config *cfg, void *p)
{
    if (!p) return NULL;
    if (!grow((void **)&cfg->arena, &cfg->cap_arena, cfg->n_arena + 1, sizeof *cfg->arena)) {
        free(p);
        return NULL;
    }
    cfg->arena[cfg->n_arena++] = p;
    return p;
}

static char *arena_strndup(zt_config *cfg, const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return arena_keep(cfg, p);
}

static char *format_alloc(const char *fmt, ...) ZT_PRINTF(1, 2);
static char *format_alloc(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- problem lists: every problem is one line of the final message --------------------------- */

typedef struct problem_list {
    char *text;
    size_t len;
    FILE *f;
    int count;
} problem_list;

static void problems_open(problem_list *p)
{
    memset(p, 0, sizeof *p);
    p->f = open_memstream(&p->text, &p->len);
}

static void problem_add(problem_list *p, const char *fmt, ...) ZT_PRINTF(2, 3);
static void problem_add(problem_list *p, const char *fmt, ...)
{
    if (p->f) {
        if (p->count) fputc('\n', p->f);
        va_list ap;
        va_start(ap, fmt);
        vfprintf(p->f, fmt, ap);
        va_end(ap);
    }
    p->count++;
}

/* Closes the list; when it holds problems, puts them in err (cut to fit, with a count of the rest). */
static zt_status problems_close(problem_list *p, zt_status status, zt_error *err)
{
    if (p->f) fclose(p->f);
    if (p->count == 0) {
        free(p->text);
        return ZT_OK;
    }
    if (!p->f || !p->text) {
        free(p->text);
        return zt_error_set(err, status, "%d config problem(s); out of memory while describing them",
                            p->count);
    }
    size_t room = ZT_ERROR_MSG_MAX - 64;
    if (p->len > room) {
        /* Cut at a line end and say how many lines were left out. */
        size_t cut = room;
        while (cut > 0 && p->text[cut] != '\n') cut--;
        int left_out = 0;
        for (size_t k = cut; k < p->len; k++) left_out += p->text[k] == '\n';
        zt_error_set(err, status, "%.*s\n... and %d more problem(s)", (int)cut, p->text, left_out);
    } else {
        zt_error_set(err, status, "%s", p->text);
    }
    free(p->text);
    return status;
}

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

/* Levenshtein distance; keys longer than 128 bytes are treated as far from everything. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na > 128 || nb > 128) return SIZE_MAX / 2;
    size_t row[129];
    for (size_t j = 0; j <= nb; j++) row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t above = row[j];
            size_t best = diagonal + (a[i - 1] != b[j - 1]);
            if (above + 1 < best) best = above + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diagonal = above;
        }
    }
    return row[nb];
}

static declared_option *find_decl(const zt_config *cfg, const char *key)
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
        size_t full = edit_distance(key, candidate);
        size_t last = edit_distance(key_last, last_component(candidate));
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
    {"zero_optimization.sub_group_size", "ZeRO-Infinity optimizer sub-groups are not implemented"},
    {"zero_optimization.stage3_max_live_parameters",
     "ZeRO-3 parameter prefetch/release tuning is not implemented"},
    {"zero_optimization.stage3_max_reuse_distance",
     "ZeRO-3 parameter prefetch/release tuning is not implemented"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save",
     "gathering 16-bit weights into one file on save is not implemented"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
     "gathering 16-bit weights into one file on save is not implemented"},
    {"zero_optimization.round_robin_gradients",
     "round-robin gradient partitioning for CPU offload is not implemented"},
    {"zero_optimization.elastic_checkpoint", "elastic checkpoints are not implemented"},
    {"zero_optimization.mics_shard_size", "MiCS sharding is not implemented"},
    {"zero_optimization.mics_hierarchical_params_gather", "MiCS sharding is not implemented"},
    {"zero_optimization.zero_hpz_partition_size", "ZeRO++ is not implemented"},
    {"zero_optimization.zero_quantized_weights", "ZeRO++ is not implemented"},
    {"zero_optimization.zero_quantized_gradients", "ZeRO++ is not implemented"},
    {"zero_allow_untested_optimizer", "zt has no list of tested optimizers to bypass"},
    {"zero_force_ds_cpu_optimizer", "there is no DeepSpeed CPU optimizer to force"},
    {"aio", "asynchronous I/O for NVMe offload is not implemented"},
    {"activation_checkpointing",
     "activation checkpointing has no options in zt: switch it on with \"recompute\": true"},
    {"amp", "NVIDIA Apex AMP is not used: set bf16.enabled or fp16.enabled instead"},
    {"fp16.auto_cast", "automatic casting of fp16 inputs is not implemented"},
    {"fp16.loss_scale",
     "a static loss scale is not implemented: fp16 loss scaling is dynamic (fp16.initial_scale_power, "
     "fp16.loss_scale_window, fp16.hysteresis, fp16.min_loss_scale)"},
    {"fp16.consecutive_hysteresis", "not settable: zt always restores the hysteresis after a good step (true)"},
    {"communication_data_type", "the data type of gradient communication cannot be chosen"},
    {"seq_parallel_communication_data_type", "sequence parallelism is not implemented"},
    {"prescale_gradients", "gradient pre-scaling before the all-reduce is not implemented"},
    {"gradient_predivide_factor", "gradient pre-scaling before the all-reduce is not implemented"},
    {"sparse_gradients", "sparse gradients are not implemented"},
    {"data_types", "the gradient accumulation data type cannot be chosen"},
    {"tensorboard", "monitoring backends are not implemented: zt logs to stderr every log.every steps"},
    {"wandb", "monitoring backends are not implemented: zt logs to stderr every log.every steps"},
    {"csv_monitor", "monitoring backends are not implemented: zt logs to stderr every log.every steps"},
    {"comet", "monitoring backends are not implemented: zt logs to stderr every log.every steps"},
    {"steps_per_print", "zt's equivalent is log.every"},
    {"wall_clock_breakdown", "timing breakdowns are not implemented"},
    {"memory_breakdown", "memory breakdowns are not implemented"},
    {"dump_state", "state dumps are not implemented"},
    {"flops_profiler", "the FLOPS profiler is not implemented"},
    {"comms_logger", "communication logging is not implemented"},
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

/* ---- describing values and places ------------------------------------------------------------ */

static size_t token_offset(const zt_json *j, int tok)
{
    /* A string token starts after its quote; point at the quote. */
    return (size_t)j->tok[tok].start - (j->tok[tok].type == ZT_JSON_STRING ? 1 : 0);
}

/* "run.json:4:24" for an offset in a file, or "--set key=value". */
static void describe_place(const zt_config *cfg, const given_entry *e, size_t offset, char *buf,
                           size_t cap)
{
    const config_doc *d = &cfg->docs[e->doc];
    if (d->from_set) {
        snprintf(buf, cap, "%s", d->origin);
        return;
    }
    int line, col;
    zt_json_line_col(d->text, offset, &line, &col);
    snprintf(buf, cap, "%s:%d:%d", d->origin, line, col);
}

static void describe_value_place(const zt_config *cfg, const given_entry *e, int tok, char *buf,
                                 size_t cap)
{
    describe_place(cfg, e, token_offset(&cfg->docs[e->doc].json, tok), buf, cap);
}

/* What the user gave: "string \"abc\"", "number 1.5", "boolean true", "null", "an array". */
static void describe_json_value(const zt_json *j, int tok, char *buf, size_t cap)
{
    const zt_json_tok *t = &j->tok[tok];
    int n = t->end - t->start;
    switch (t->type) {
    case ZT_JSON_OBJECT: snprintf(buf, cap, "an object"); break;
    case ZT_JSON_ARRAY: snprintf(buf, cap, "an array"); break;
    case ZT_JSON_STRING:
        snprintf(buf, cap, "string \"%.*s%s\"", n > 40 ? 40 : n, j->text + t->start, n > 40 ? "..." : "");
        break;
    default:
        if (zt_json_is_null(j, tok)) snprintf(buf, cap, "null");
        else if (zt_json_is_bool(j, tok)) snprintf(buf, cap, "boolean %.*s", n, j->text + t->start);
        else snprintf(buf, cap, "number %.*s", n > 40 ? 40 : n, j->text + t->start);
        break;
    }
}

/* The shortest decimal form that reads back as exactly v. */
static void format_double(double v, char *buf, size_t cap)
{
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(buf, cap, "%.*g", precision, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* "in [16, 1048576]", "in (0, 1]", ">= 1", "> 0", "<= 32"; empty when unbounded. */
static void describe_range(const zt_option *opt, char *buf, size_t cap)
{
    char lo[32], hi[32];
    format_double(opt->min, lo, sizeof lo);
    format_double(opt->max, hi, sizeof hi);
    int open = (opt->flags & ZT_OPT_MIN_OPEN) != 0;
    if ((opt->flags & ZT_OPT_HAS_MIN) && (opt->flags & ZT_OPT_HAS_MAX))
        snprintf(buf, cap, "in %c%s, %s]", open ? '(' : '[', lo, hi);
    else if (opt->flags & ZT_OPT_HAS_MIN)
        snprintf(buf, cap, "%s %s", open ? ">" : ">=", lo);
    else if (opt->flags & ZT_OPT_HAS_MAX)
        snprintf(buf, cap, "<= %s", hi);
    else
        buf[0] = '\0';
}

static int in_range(const zt_option *opt, double v)
{
    if (opt->flags & ZT_OPT_HAS_MIN) {
        if ((opt->flags & ZT_OPT_MIN_OPEN) ? !(v > opt->min) : !(v >= opt->min)) return 0;
    }
    if ((opt->flags & ZT_OPT_HAS_MAX) && !(v <= opt->max)) return 0;
    return 1;
}

/* "an integer", "one of \"packed\", \"padded\"", ... */
static void describe_type(const zt_option *opt, char *buf, size_t cap)
{
    switch (opt->type) {
    case ZT_OPT_BOOL: snprintf(buf, cap, "true or false"); break;
    case ZT_OPT_INT: snprintf(buf, cap, "an integer"); break;
    case ZT_OPT_FLOAT: snprintf(buf, cap, "a number"); break;
    case ZT_OPT_STRING: snprintf(buf, cap, "a string"); break;
    case ZT_OPT_FLOATS: snprintf(buf, cap, "an array of numbers"); break;
    case ZT_OPT_BYTES:
        snprintf(buf, cap, "a byte size (an integer, or a string such as \"512M\", \"24GiB\", \"100MB\")");
        break;
    case ZT_OPT_ENUM: {
        size_t used = (size_t)snprintf(buf, cap, "one of");
        for (int k = 0; opt->choices && opt->choices[k] && used < cap; k++) {
            used += (size_t)snprintf(buf + used, cap - used, "%s \"%s\"", k ? "," : "", opt->choices[k]);
        }
        break;
    }
    default: snprintf(buf, cap, "(unknown type %d)", (int)opt->type); break;
    }
}

/* ---- values -------------------------------------------------------------------------------- */

/* Why a value is not acceptable: `problem` follows "config key 'K' "; `hint` (optional) follows the
 * place. The problem is at token `tok` (an array item, or the value), or at text offset `byte` when
 * that is not 0 (a bad byte inside a string). */
typedef struct value_problem {
    char problem[512];
    char hint[256];
    int tok;
    size_t byte;
} value_problem;

static int fail_type(value_problem *vp, const zt_option *opt, const zt_json *j, int tok)
{
    char type[256], got[96];
    describe_type(opt, type, sizeof type);
    describe_json_value(j, tok, got, sizeof got);
    snprintf(vp->problem, sizeof vp->problem, "must be %s, got %s", type, got);
    vp->tok = tok;
    const zt_json_tok *t = &j->tok[tok];
    if (t->type == ZT_JSON_STRING && t->end - t->start == 4 && memcmp(j->text + t->start, "auto", 4) == 0) {
        snprintf(vp->hint, sizeof vp->hint,
                 "\"auto\" is filled in by the Hugging Face Trainer, not by DeepSpeed or zt: write the "
                 "value itself");
    } else if (zt_json_is_null(j, tok)) {
        snprintf(vp->hint, sizeof vp->hint, "remove the key to use the default (%s)",
                 opt->default_value ? opt->default_value : "unset");
    }
    return 0;
}

static int fail_range(value_problem *vp, const zt_option *opt, const char *what, const char *shown, int tok)
{
    char range[96];
    describe_range(opt, range, sizeof range);
    snprintf(vp->problem, sizeof vp->problem, "%sis %s, out of range: must be %s", what, shown, range);
    vp->tok = tok;
    return 0;
}

/* A JSON number token as an int64: "5e8" and "1.0" are fine, "1.5" is not. */
static int number_to_int(const zt_json *j, int tok, int64_t *out, value_problem *vp)
{
    const zt_json_tok *t = &j->tok[tok];
    int n = t->end - t->start;
    const char *s = j->text + t->start;
    vp->tok = tok;
    if (n >= 64) {
        snprintf(vp->problem, sizeof vp->problem, "is %.40s..., too long for a 64-bit integer", s);
        return 0;
    }
    char buf[64];
    memcpy(buf, s, (size_t)n);
    buf[n] = '\0';
    if (!strpbrk(buf, ".eE")) {
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE) {
            snprintf(vp->problem, sizeof vp->problem, "is %s, outside the 64-bit integer range", buf);
            return 0;
        }
        *out = (int64_t)v;
        return 1;
    }
    double d = strtod(buf, NULL);
    if (!isfinite(d) || d != floor(d)) {
        snprintf(vp->problem, sizeof vp->problem, "must be an integer, got number %s", buf);
        return 0;
    }
    /* 2^63 is exactly representable; anything at or beyond it does not fit. */
    if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) {
        snprintf(vp->problem, sizeof vp->problem, "is %s, outside the 64-bit integer range", buf);
        return 0;
    }
    *out = (int64_t)d;
    return 1;
}

/* "512M" -> 536870912. K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000,
 * B or nothing is bytes; units are case-insensitive; a fraction is rounded to the nearest byte. */
static int parse_byte_size(const char *s, int64_t *out)
{
    static const struct {
        const char *unit;
        double bytes;
    } units[] = {
        {"", 1.0},         {"B", 1.0},
        {"K", 0x1p10},     {"KiB", 0x1p10},  {"KB", 1e3},
        {"M", 0x1p20},     {"MiB", 0x1p20},  {"MB", 1e6},
        {"G", 0x1p30},     {"GiB", 0x1p30},  {"GB", 1e9},
        {"T", 0x1p40},     {"TiB", 0x1p40},  {"TB", 1e12},
    };
    const char *p = s;
    int digits = 0, dots = 0;
    while ((*p >= '0' && *p <= '9') || *p == '.') {
        digits += *p != '.';
        dots += *p == '.';
        p++;
    }
    if (digits == 0 || dots > 1 || p - s >= 64) return 0;
    char number[64];
    memcpy(number, s, (size_t)(p - s));
    number[p - s] = '\0';
    while (*p == ' ') p++;
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) {
        if (strcasecmp(p, units[k].unit) != 0) continue;
        double bytes = floor(strtod(number, NULL) * units[k].bytes + 0.5);
        if (!(bytes < 9223372036854775808.0)) return 0;
        *out = (int64_t)bytes;
        return 1;
    }
    return 0;
}

/* Close choices to suggest for a bad enum value. */
static const char *nearest_choice(const zt_option *opt, const char *given)
{
    const char *best = NULL;
    size_t best_distance = 3; /* suggest only within 2 edits (or a case difference) */
    for (int k = 0; opt->choices && opt->choices[k]; k++) {
        size_t d = strcasecmp(opt->choices[k], given) == 0 ? 0 : edit_distance(opt->choices[k], given);
        if (d < best_distance) {
            best_distance = d;
            best = opt->choices[k];
        }
    }
    return best;
}

/* Check JSON value `tok` against `opt` and fill *out. `from_command_line`: the value was written on
 * the command line (--set) or as a schema default, where a number or boolean for a string option is
 * taken as its text (--set output_dir=2024). Strings and arrays go to the config's arena. */
static int parse_value(zt_config *cfg, const zt_option *opt, const zt_json *j, int tok,
                       int from_command_line, option_value *out, value_problem *vp)
{
    memset(out, 0, sizeof *out);
    memset(vp, 0, sizeof *vp);
    vp->tok = tok;
    out->present = 1;
    const zt_json_tok *t = &j->tok[tok];
    if (zt_json_is_null(j, tok)) {
        if (opt->flags & ZT_OPT_NO_DEFAULT) {
            out->present = 0; /* null is how a resolved config writes "not set" */
            return 1;
        }
        return fail_type(vp, opt, j, tok);
    }
    switch (opt->type) {
    case ZT_OPT_BOOL:
        if (!zt_json_is_bool(j, tok)) return fail_type(vp, opt, j, tok);
        out->b = zt_json_get_bool(j, tok);
        return 1;

    case ZT_OPT_INT:
    case ZT_OPT_FLOAT: {
        if (!zt_json_is_number(j, tok)) return fail_type(vp, opt, j, tok);
        char shown[48];
        snprintf(shown, sizeof shown, "%.*s", t->end - t->start, j->text + t->start);
        double as_double;
        if (opt->type == ZT_OPT_INT) {
            if (!number_to_int(j, tok, &out->i, vp)) return 0;
            as_double = (double)out->i;
        } else {
            out->f = as_double = zt_json_get_number(j, tok);
            if (!isfinite(out->f)) {
                snprintf(vp->problem, sizeof vp->problem, "is %s, too large for a double", shown);
                return 0;
            }
        }
        if (!in_range(opt, as_double)) return fail_range(vp, opt, "", shown, tok);
        return 1;
    }

    case ZT_OPT_STRING:
    case ZT_OPT_ENUM: {
        char *text = NULL;
        if (t->type == ZT_JSON_STRING) {
            size_t bad = 0;
            const char *what = "";
            size_t n = (size_t)(t->end - t->start);
            text = malloc(n + 1);
            if (text && zt_json_unescape(j->text + t->start, n, text, &bad, &what) < 0) {
                free(text);
                snprintf(vp->problem, sizeof vp->problem, "has a bad string value: %s", what);
                vp->byte = (size_t)t->start + bad;
                return 0;
            }
        } else if (from_command_line && t->type == ZT_JSON_PRIMITIVE) {
            text = strndup(j->text + t->start, (size_t)(t->end - t->start));
        } else {
            return fail_type(vp, opt, j, tok);
        }
        out->s = arena_keep(cfg, text);
        if (!out->s) {
            snprintf(vp->problem, sizeof vp->problem, "could not be stored: out of memory");
            return 0;
        }
        if (opt->type == ZT_OPT_STRING) return 1;
        for (int k = 0; opt->choices && opt->choices[k]; k++) {
            if (strcmp(opt->choices[k], out->s) == 0) return 1;
        }
        char type[256];
        describe_type(opt, type, sizeof type);
        snprintf(vp->problem, sizeof vp->problem, "must be %s; got \"%.60s\"", type, out->s);
        const char *near = nearest_choice(opt, out->s);
        if (near) snprintf(vp->hint, sizeof vp->hint, "did you mean \"%s\"?", near);
        return 0;
    }

    case ZT_OPT_FLOATS: {
        if (t->type != ZT_JSON_ARRAY) return fail_type(vp, opt, j, tok);
        double *items = t->size > 0 ? malloc((size_t)t->size * sizeof *items) : NULL;
        if (t->size > 0 && !arena_keep(cfg, items)) {
            snprintf(vp->problem, sizeof vp->problem, "could not be stored: out of memory");
            return 0;
        }
        int item = tok + 1;
        for (int k = 0; k < t->size; k++, item = zt_json_skip(j, item)) {
            char what[32], shown[48];
            snprintf(what, sizeof what, "item %d ", k + 1);
            if (!zt_json_is_number(j, item)) {
                char got[96];
                describe_json_value(j, item, got, sizeof got);
                snprintf(vp->problem, sizeof vp->problem, "%smust be a number, got %s", what, got);
                vp->tok = item;
                return 0;
            }
            items[k] = zt_json_get_number(j, item);
            snprintf(shown, sizeof shown, "%.*s", j->tok[item].end - j->tok[item].start,
                     j->text + j->tok[item].start);
            if (!isfinite(items[k])) {
                snprintf(vp->problem, sizeof vp->problem, "%sis %s, too large for a double", what, shown);
                vp->tok = item;
                return 0;
            }
            if (!in_range(opt, items[k])) return fail_range(vp, opt, what, shown, item);
        }
        out->floats = items;
        out->n_floats = t->size;
        return 1;
    }

    case ZT_OPT_BYTES: {
        char shown[64];
        snprintf(shown, sizeof shown, "%.*s", t->end - t->start > 60 ? 60 : t->end - t->start,
                 j->text + t->start);
        if (zt_json_is_number(j, tok)) {
            if (!number_to_int(j, tok, &out->i, vp)) return 0;
            if (out->i < 0) {
                snprintf(vp->problem, sizeof vp->problem, "is %s, but a byte size cannot be negative",
                         shown);
                return 0;
            }
        } else if (t->type == ZT_JSON_STRING) {
            char text[96];
            size_t n = (size_t)(t->end - t->start);
            if (n >= sizeof text || zt_json_unescape(j->text + t->start, n, text, NULL, NULL) < 0 ||
                !parse_byte_size(text, &out->i)) {
                char type[256];
                describe_type(opt, type, sizeof type);
                snprintf(vp->problem, sizeof vp->problem, "must be %s, got string \"%s\"", type, shown);
                snprintf(vp->hint, sizeof vp->hint,
                         "K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000");
                return 0;
            }
        } else {
            return fail_type(vp, opt, j, tok);
        }
        if (!in_range(opt, (double)out->i)) return fail_range(vp, opt, "", shown, tok);
        return 1;
    }
    }
    snprintf(vp->problem, sizeof vp->problem, "has an option type (%d) this zt does not know",
             (int)opt->type);
    return 0;
}

/* ---- documents ----------------------------------------------------------------------------- */

static void doc_free(config_doc *d)
{
    zt_json_free(&d->json);
    free(d->text);
    free(d->origin);
}

/* A command-line style value: JSON when it is a valid JSON scalar or array, else the text itself
 * as a string. On success *out owns its text. */
static zt_status parse_command_line_value(const char *value, const char *origin, config_doc *out,
                                          zt_error *err)
{
    memset(out, 0, sizeof *out);
    out->from_set = 1;
    out->origin = strdup(origin);
    out->text = strdup(value);
    if (!out->origin || !out->text) {
        doc_free(out);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    }
    zt_error not_json;
    if (zt_json_parse(out->text, strlen(out->text), out->origin, &out->json, &not_json) == ZT_OK) {
        if (out->json.tok[0].type != ZT_JSON_OBJECT) return ZT_OK;
        doc_free(out);
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s: a JSON object cannot be given as one value; give each key on its "
                            "own, e.g. --set zero_optimization.stage=2",
                            origin);
    }
    /* Not JSON: store the text as a JSON string literal so every value is a token. */
    free(out->text);
    out->text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&out->text, &len);
    if (m) {
        zt_json_write_string(m, value, strlen(value));
        fclose(m);
    }
    if (!m || !out->text) {
        doc_free(out);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    }
    zt_status st = zt_json_parse(out->text, len, out->origin, &out->json, err);
    if (st != ZT_OK) doc_free(out);
    return st;
}

static int add_doc(zt_config *cfg, config_doc *d)
{
    if (!grow((void **)&cfg->docs, &cfg->cap_docs, cfg->n_docs + 1, sizeof *cfg->docs)) return -1;
    cfg->docs[cfg->n_docs] = *d;
    return cfg->n_docs++;
}

static int add_entry(zt_config *cfg, char *key, int doc, int value_tok, size_t key_offset, int is_object)
{
    if (!grow((void **)&cfg->given, &cfg->cap_given, cfg->n_given + 1, sizeof *cfg->given)) return 0;
    cfg->given[cfg->n_given++] = (given_entry){key, doc, value_tok, key_offset, is_object};
    return 1;
}

/* The entry whose value counts for `key`: the last --set, else the last file entry; -1 if none. */
static int effective_entry(const zt_config *cfg, const char *key)
{
    int best = -1, best_from_set = 0;
    for (int k = 0; k < cfg->n_given; k++) {
        const given_entry *e = &cfg->given[k];
        if (e->is_object || strcmp(e->key, key) != 0) continue;
        int from_set = cfg->docs[e->doc].from_set;
        if (best < 0 || from_set >= best_from_set) {
            best = k;
            best_from_set = from_set;
        }
    }
    return best;
}

/* Recompute every declared option's effective value. */
static void resolve_all(zt_config *cfg)
{
    for (int k = 0; k < cfg->n_decl; k++) {
        declared_option *d = &cfg->decl[k];
        free(d->problem);
        d->problem = NULL;
        d->invalid = 0;
        d->value = d->def;
        d->given = effective_entry(cfg, d->opt->key);
        if (d->given < 0) continue;
        const given_entry *e = &cfg->given[d->given];
        const config_doc *doc = &cfg->docs[e->doc];
        option_value v;
        value_problem vp;
        if (parse_value(cfg, d->opt, &doc->json, e->value_tok, doc->from_set, &v, &vp)) {
            d->value = v;
            continue;
        }
        char place[4200];
        if (vp.byte) describe_place(cfg, e, vp.byte, place, sizeof place);
        else describe_value_place(cfg, e, vp.tok, place, sizeof place);
        d->invalid = 1;
        d->problem = format_alloc("config key '%s' %s (%s)%s%s", d->opt->key, vp.problem, place,
                                  vp.hint[0] ? "; " : "", vp.hint);
    }
}

/* Record the members of object `obj` (and, recursively, of nested objects) under `prefix`. */
static void flatten(zt_config *cfg, int doc, int obj, const char *prefix, problem_list *problems)
{
    const zt_json *j = &cfg->docs[doc].json;
    int k = obj + 1;
    for (int member = 0; member < j->tok[obj].size; member++, k = zt_json_skip(j, k)) {
        int value = k + 1;
        char *name = NULL;
        zt_error key_err;
        if (zt_json_string(j, k, &name, NULL, &key_err) != ZT_OK) {
            problem_add(problems, "%s (in a key)", key_err.msg);
            continue;
        }
        /* zt's own metadata in config.resolved.json: ignored so a resolved config can be fed back. */
        if (!prefix && (strcmp(name, "_sources") == 0 || strcmp(name, "_plugins") == 0)) {
            free(name);
            continue;
        }
        if (name[0] == '\0' || strchr(name, '.')) {
            int line, col;
            zt_json_line_col(j->text, token_offset(j, k), &line, &col);
            problem_add(problems,
                        "%s:%d:%d: %s; nest objects instead, e.g. {\"zero_optimization\": {\"stage\": 2}}",
                        j->origin, line, col,
                        name[0] ? "a config key cannot contain '.'" : "a config key cannot be empty");
            free(name);
            continue;
        }
        char *key = prefix ? format_alloc("%s.%s", prefix, name) : name;
        if (prefix) free(name);
        int is_object = j->tok[value].type == ZT_JSON_OBJECT;
        if (!key || !add_entry(cfg, key, doc, value, token_offset(j, k), is_object)) {
            free(key);
            problem_add(problems, "%s: out of memory while reading the config", j->origin);
            return;
        }
        if (is_object) flatten(cfg, doc, value, key, problems);
    }
}

/* Take ownership of `text` (NUL-terminated, len bytes), parse it and record its values. */
static zt_status load_text(zt_config *cfg, char *text, size_t len, const char *origin, zt_error *err)
{
    config_doc d = {text, strdup(origin), 0, {0}};
    if (!d.origin) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    }
    zt_status st = zt_json_parse(d.text, len, d.origin, &d.json, err);
    if (st != ZT_OK) {
        doc_free(&d);
        return st;
    }
    if (d.json.tok[0].type != ZT_JSON_OBJECT) {
        int line, col;
        zt_json_line_col(d.text, token_offset(&d.json, 0), &line, &col);
        st = zt_error_set(err, ZT_ERR_CONFIG,
                          "%s:%d:%d: a config must be a JSON object ({\"key\": value, ...}), found %s",
                          origin, line, col,
                          d.json.tok[0].type == ZT_JSON_ARRAY ? "an array" : "a single value");
        doc_free(&d);
        return st;
    }
    int doc = add_doc(cfg, &d);
    if (doc < 0) {
        doc_free(&d);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    }
    int n_given_before = cfg->n_given;
    problem_list problems;
    problems_open(&problems);
    flatten(cfg, doc, 0, NULL, &problems);
    st = problems_close(&problems, ZT_ERR_CONFIG, err);
    if (st != ZT_OK) {
        /* Leave the config as it was. */
        while (cfg->n_given > n_given_before) free(cfg->given[--cfg->n_given].key);
        doc_free(&cfg->docs[--cfg->n_docs]);
        return st;
    }
    cfg->validated = 0;
    resolve_all(cfg);
    return ZT_OK;
}

/* ---- public: building a config ------------------------------------------------------------- */

zt_config *zt_config_new(void) { return calloc(1, sizeof(zt_config)); }

void zt_config_free(zt_config *cfg)
{
    if (!cfg) return;
    for (int k = 0; k < cfg->n_docs; k++) doc_free(&cfg->docs[k]);
    for (int k = 0; k < cfg->n_given; k++) free(cfg->given[k].key);
    for (int k = 0; k < cfg->n_decl; k++) free(cfg->decl[k].problem);
    for (int k = 0; k < cfg->n_arena; k++) free(cfg->arena[k]);
    free(cfg->docs);
    free(cfg->given);
    free(cfg->decl);
    free(cfg->arena);
    free(cfg);
}

zt_status zt_config_load_file(zt_config *cfg, const char *path, zt_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return zt_error_set(err, ZT_ERR_IO, "cannot open config file '%s': %s; check the path", path,
                            strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return zt_error_set(err, ZT_ERR_IO,
                            "config file '%s' is a directory; give the path of the JSON file", path);
    }
    size_t len = 0, cap = 1 << 16;
    char *text = malloc(cap);
    while (text) {
        len += fread(text + len, 1, cap - 1 - len, f);
        if (len < cap - 1) break; /* end of file, or an error (checked below) */
        cap *= 2;
        char *bigger = realloc(text, cap);
        if (!bigger) free(text);
        text = bigger;
    }
    int read_error = ferror(f);
    int saved_errno = errno;
    fclose(f);
    if (!text) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", path);
    if (read_error) {
        free(text);
        return zt_error_set(err, ZT_ERR_IO, "cannot read config file '%s': %s", path,
                            strerror(saved_errno));
    }
    text[len] = '\0';
    return load_text(cfg, text, len, path, err);
}

zt_status zt_config_load_string(zt_config *cfg, const char *json, const char *origin, zt_error *err)
{
    char *text = strdup(json);
    if (!text) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
    return load_text(cfg, text, strlen(text), origin, err);
}

zt_status zt_config_set(zt_config *cfg, const char *assignment, zt_error *err)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--set '%s': expected KEY=VALUE, e.g. --set zero_optimization.stage=2",
                            assignment);
    }
    char *key = strndup(assignment, (size_t)(eq - assignment));
    if (!key) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "--set: out of memory");
    if (key[0] == '.' || key[strlen(key) - 1] == '.' || strstr(key, "..")) {
        zt_status st = zt_error_set(err, ZT_ERR_CONFIG,
                                    "--set '%s': the key '%s' has an empty part; keys are dotted "
                                    "paths such as zero_optimization.stage",
                                    assignment, key);
        free(key);
        return st;
    }
    char *origin = format_alloc("--set %s", assignment);
    if (!origin) {
        free(key);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "--set: out of memory");
    }
    config_doc d;
    zt_status st = parse_command_line_value(eq + 1, origin, &d, err);
    free(origin);
    if (st != ZT_OK) {
        free(key);
        return st;
    }
    int doc = add_doc(cfg, &d);
    if (doc < 0 || !add_entry(cfg, key, doc, 0, 0, 0)) {
        if (doc >= 0) cfg->n_docs--;
        doc_free(&d);
        free(key);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "--set: out of memory");
    }
    cfg->validated = 0;
    resolve_all(cfg);
    return ZT_OK;
}

/* Checks one option of a schema; problems go to `problems`. *def receives the parsed default. */
static void check_option(zt_config *cfg, const char *owner, const zt_option *opts, uint32_t index,
                         option_value *def, problem_list *problems)
{
    const zt_option *o = &opts[index];
    const char *key = o->key ? o->key : "(null)";
    if (!key_is_well_formed(o->key)) {
        problem_add(problems,
                    "'%s' declares an option with the invalid key \"%s\": keys are dot-separated "
                    "names of letters, digits and '_'",
                    owner, key);
        return;
    }
    int parts = 1;
    for (const char *p = key; *p; p++) parts += *p == '.';
    if (parts > 32) {
        problem_add(problems, "'%s' declares '%s': a key has at most 32 dot-separated parts", owner,
                    key);
        return;
    }
    if (key[0] == '_') {
        problem_add(problems, "'%s' declares '%s': keys starting with '_' are reserved for zt", owner,
                    key);
    }
    for (uint32_t k = 0; k < index; k++) {
        if (opts[k].key && strcmp(opts[k].key, key) == 0)
            problem_add(problems, "'%s' declares config key '%s' twice", owner, key);
        else if (opts[k].key && (is_key_prefix(opts[k].key, key) || is_key_prefix(key, opts[k].key)))
            problem_add(problems, "'%s' declares both '%s' and '%s': a key cannot also be a section",
                        owner, opts[k].key, key);
    }
    for (int k = 0; k < cfg->n_decl; k++) {
        const declared_option *d = &cfg->decl[k];
        if (strcmp(d->opt->key, key) == 0) {
            problem_add(problems,
                        "config key '%s' is declared by both '%s' and '%s'; a key has exactly one "
                        "owner: rename it in one of them (a plugin's keys belong in its own section, "
                        "e.g. optimizer.params.*)",
                        key, d->owner, owner);
        } else if (is_key_prefix(d->opt->key, key) || is_key_prefix(key, d->opt->key)) {
            problem_add(problems,
                        "'%s' declares '%s' and '%s' declares '%s': a key cannot also be a section",
                        d->owner, d->opt->key, owner, key);
        }
    }
    if (o->type < ZT_OPT_BOOL || o->type > ZT_OPT_BYTES) {
        problem_add(problems, "'%s' declares '%s' with unknown option type %d", owner, key,
                    (int)o->type);
        return;
    }
    if (o->type == ZT_OPT_ENUM && (!o->choices || !o->choices[0])) {
        problem_add(problems, "'%s' declares enum '%s' without choices", owner, key);
        return;
    }
    if ((o->flags & ZT_OPT_HAS_MIN) && (o->flags & ZT_OPT_HAS_MAX) && o->min > o->max) {
        problem_add(problems, "'%s' declares '%s' with min %g > max %g", owner, key, o->min, o->max);
    }
    memset(def, 0, sizeof *def);
    if (o->flags & ZT_OPT_NO_DEFAULT) {
        if (o->default_value) {
            problem_add(problems,
                        "'%s' declares '%s' with both ZT_OPT_NO_DEFAULT and a default (\"%s\"); drop "
                        "one",
                        owner, key, o->default_value);
        }
        return;
    }
    if (!o->default_value) {
        problem_add(problems,
                    "'%s' declares '%s' without a default; give default_value or set "
                    "ZT_OPT_NO_DEFAULT",
                    owner, key);
        return;
    }
    config_doc d;
    zt_error parse_err;
    if (parse_command_line_value(o->default_value, "default", &d, &parse_err) != ZT_OK) {
        problem_add(problems, "'%s' declares '%s' with an unusable default \"%s\": %s", owner, key,
                    o->default_value, parse_err.msg);
        return;
    }
    value_problem vp;
    if (!parse_value(cfg, o, &d.json, 0, 1, def, &vp)) {
        problem_add(problems, "'%s' declares '%s' with an invalid default \"%s\": it %s", owner, key,
                    o->default_value, vp.problem);
    }
    doc_free(&d);
}

zt_status zt_config_add_schema(zt_config *cfg, const char *owner, const zt_option *opts, uint32_t n,
                               zt_error *err)
{
    if (!owner || (n > 0 && !opts)) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "zt_config_add_schema: owner and options needed");
    }
    owner = arena_strndup(cfg, owner, strlen(owner));
    option_value *defaults = calloc(n ? n : 1, sizeof *defaults);
    if (!owner || !defaults) {
        free(defaults);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory adding the options of a plugin");
    }
    problem_list problems;
    problems_open(&problems);
    for (uint32_t k = 0; k < n; k++) check_option(cfg, owner, opts, k, &defaults[k], &problems);
    zt_status st = problems_close(&problems, ZT_ERR_INVALID_ARG, err);
    if (st == ZT_OK && !grow((void **)&cfg->decl, &cfg->cap_decl, cfg->n_decl + (int)n, sizeof *cfg->decl))
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory adding the options of '%s'", owner);
    if (st == ZT_OK) {
        for (uint32_t k = 0; k < n; k++) {
            cfg->decl[cfg->n_decl++] = (declared_option){&opts[k], owner, defaults[k], defaults[k], -1, 0,
                                                         NULL};
        }
        cfg->validated = 0;
        resolve_all(cfg);
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
        problem_add(problems, "unknown config key '%s' (%s); did you mean '%s'?", e->key, place, near);
    } else {
        problem_add(problems,
                    "unknown config key '%s' (%s); no zt option has a similar name: see "
                    "docs/config.md and zt-run --describe",
                    e->key, place);
    }
}

static void report_deepspeed(const given_entry *e, const deepspeed_key *ds, const char *place,
                             problem_list *problems)
{
    int whole_section = e->is_object;
    problem_add(problems,
                "DeepSpeed key '%s' is not supported by zt (%s): %s. zt reads DeepSpeed configs but "
                "does not implement this option; remove %s '%s' from the config",
                e->key, place, ds->why, whole_section ? "the whole section" : "the key", e->key);
}

zt_status zt_config_validate(zt_config *cfg, zt_error *err)
{
    problem_list problems;
    problems_open(&problems);
    const char **reported = calloc((size_t)cfg->n_given + 1, sizeof *reported);
    int n_reported = 0;
    if (!reported) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory checking the config");

    for (int k = 0; k < cfg->n_given; k++) {
        const given_entry *e = &cfg->given[k];
        const config_doc *doc = &cfg->docs[e->doc];
        char key_place[4200], value_place[4200];
        describe_place(cfg, e, e->key_offset, key_place, sizeof key_place);
        describe_value_place(cfg, e, e->value_tok, value_place, sizeof value_place);

        int duplicate = 0;
        for (int earlier = 0; earlier < k && !doc->from_set; earlier++) {
            const given_entry *f = &cfg->given[earlier];
            if (f->doc != e->doc || strcmp(f->key, e->key) != 0) continue;
            int line1, line2, col;
            zt_json_line_col(doc->text, f->key_offset, &line1, &col);
            zt_json_line_col(doc->text, e->key_offset, &line2, &col);
            problem_add(&problems, "config key '%s' is given twice in %s (lines %d and %d); keep one",
                        e->key, doc->origin, line1, line2);
            duplicate = 1;
            break;
        }
        if (duplicate || under_reported_section(e->key, reported, n_reported)) continue;

        const declared_option *decl = find_decl(cfg, e->key);
        const declared_option *above = find_decl_above(cfg, e->key);
        const declared_option *below = find_decl_below(cfg, e->key);
        const deepspeed_key *ds = find_deepspeed_unsupported(e->key);
        char type[256];

        if (e->is_object) {
            if (decl) {
                describe_type(decl->opt, type, sizeof type);
                problem_add(&problems, "config key '%s' must be %s, got an object (%s)", e->key, type,
                            value_place);
                reported[n_reported++] = e->key;
            } else if (ds && !below) {
                report_deepspeed(e, ds, key_place, &problems);
                reported[n_reported++] = e->key;
            } else if (doc->json.tok[e->value_tok].size == 0 && !below && !above) {
                report_unknown(cfg, e, key_place, &problems); /* an empty {} of an unknown section */
            }
            continue; /* a non-empty object is judged by its keys */
        }
        if (effective_entry(cfg, e->key) != k) continue; /* overridden: only the winner counts */
        if (decl) {
            if (decl->invalid) {
                problem_add(&problems, "%s",
                            decl->problem ? decl->problem : "a config value: out of memory describing it");
            }
        } else if (above) {
            describe_type(above->opt, type, sizeof type);
            problem_add(&problems,
                        "unknown config key '%s' (%s): '%s' is a single value (%s), not a section",
                        e->key, key_place, above->opt->key, type);
        } else if (below) {
            char got[96];
            describe_json_value(&doc->json, e->value_tok, got, sizeof got);
            problem_add(&problems,
                        "config key '%s' must be an object (a section holding keys such as '%s'), got "
                        "%s (%s)",
                        e->key, below->opt->key, got, value_place);
        } else if (ds) {
            report_deepspeed(e, ds, key_place, &problems);
        } else {
            report_unknown(cfg, e, key_place, &problems);
        }
    }
    free(reported);
    zt_status st = problems_close(&problems, ZT_ERR_CONFIG, err);
    cfg->validated = st == ZT_OK;
    return st;
}

/* ---- typed access -------------------------------------------------------------------------- */

/* The option behind `key` when it has `type` (or `alt_type`) and a usable value. */
static zt_status lookup(const zt_config *cfg, const char *key, int type, int alt_type,
                        const declared_option **out)
{
    const declared_option *d = key ? find_decl(cfg, key) : NULL;
    if (!d) return ZT_ERR_NOT_FOUND;
    if (d->opt->type != type && d->opt->type != alt_type) return ZT_ERR_INVALID_ARG;
    if (d->invalid) return ZT_ERR_CONFIG;
    if (!d->value.present) return ZT_ERR_NOT_FOUND;
    *out = d;
    return ZT_OK;
}

zt_status zt_config_get_bool(const zt_config *cfg, const char *key, int32_t *out)
{
    const declared_option *d;
    zt_status st = lookup(cfg, key, ZT_OPT_BOOL, ZT_OPT_BOOL, &d);
    if (st == ZT_OK) *out = d->value.b;
    return st;
}

zt_status zt_config_get_int(const zt_config *cfg, const char *key, int64_t *out)
{
    const declared_option *d;
    zt_status st = lookup(cfg, key, ZT_OPT_INT, ZT_OPT_BYTES, &d);
    if (st == ZT_OK) *out = d->value.i;
    return st;
}

zt_status zt_config_get_float(const zt_config *cfg, const char *key, double *out)
{
    const declared_option *d;
    zt_status st = lookup(cfg, key, ZT_OPT_FLOAT, ZT_OPT_FLOAT, &d);
    if (st == ZT_OK) *out = d->value.f;
    return st;
}

zt_status zt_config_get_string(const zt_config *cfg, const char *key, const char **out)
{
    const declared_option *d;
    zt_status st = lookup(cfg, key, ZT_OPT_STRING, ZT_OPT_ENUM, &d);
    if (st == ZT_OK) *out = d->value.s;
    return st;
}

zt_status zt_config_get_floats(const zt_config *cfg, const char *key, double *out, int32_t cap,
                               int32_t *n)
{
    const declared_option *d;
    zt_status st = lookup(cfg, key, ZT_OPT_FLOATS, ZT_OPT_FLOATS, &d);
    if (st != ZT_OK) return st;
    *n = d->value.n_floats;
    if (d->value.n_floats > cap) return ZT_ERR_BUFFER_TOO_SMALL;
    if (d->value.n_floats > 0) memcpy(out, d->value.floats, (size_t)d->value.n_floats * sizeof *out);
    return ZT_OK;
}

int zt_config_is_set(const zt_config *cfg, const char *key)
{
    return effective_entry(cfg, key) >= 0;
}

/* ---- the resolved config ------------------------------------------------------------------- */

/* Sort order that keeps each section together: '.' sorts before every other key character. */
static int compare_keys(const void *a, const void *b)
{
    const char *x = (*(const declared_option *const *)a)->opt->key;
    const char *y = (*(const declared_option *const *)b)->opt->key;
    for (;; x++, y++) {
        unsigned char cx = *x == '.' ? 1 : (unsigned char)*x;
        unsigned char cy = *y == '.' ? 1 : (unsigned char)*y;
        if (cx != cy || cx == 0) return (int)cx - (int)cy;
    }
}

static void write_value(FILE *out, const declared_option *d)
{
    const option_value *v = &d->value;
    char number[32];
    if (!v->present) {
        fputs("null", out);
        return;
    }
    switch (d->opt->type) {
    case ZT_OPT_BOOL: fputs(v->b ? "true" : "false", out); break;
    case ZT_OPT_INT:
    case ZT_OPT_BYTES: fprintf(out, "%lld", (long long)v->i); break;
    case ZT_OPT_FLOAT:
        format_double(v->f, number, sizeof number);
        fputs(number, out);
        break;
    case ZT_OPT_STRING:
    case ZT_OPT_ENUM: zt_json_write_string(out, v->s, strlen(v->s)); break;
    case ZT_OPT_FLOATS:
        fputc('[', out);
        for (int32_t k = 0; k < v->n_floats; k++) {
            format_double(v->floats[k], number, sizeof number);
            fprintf(out, "%s%s", k ? ", " : "", number);
        }
        fputc(']', out);
        break;
    }
}

static void write_source(const zt_config *cfg, FILE *out, const declared_option *d)
{
    if (d->given < 0) {
        fputs("\"default\"", out);
        return;
    }
    const given_entry *e = &cfg->given[d->given];
    const config_doc *doc = &cfg->docs[e->doc];
    if (doc->from_set) {
        fputs("\"--set\"", out);
        return;
    }
    int line, col;
    zt_json_line_col(doc->text, e->key_offset, &line, &col);
    char *source = format_alloc("file:%s:%d", doc->origin, line);
    if (source) zt_json_write_string(out, source, strlen(source));
    else fputs("\"file\"", out);
    free(source);
}

static void indent(FILE *out, int level) { fprintf(out, "%*s", 2 * level, ""); }

zt_status zt_config_write_resolved(const zt_config *cfg, FILE *out, const char *plugins_json,
                                   zt_error *err)
{
    if (!cfg->validated) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "zt_config_write_resolved: the config has not been validated since it last "
                            "changed; call zt_config_validate first");
    }
    if (plugins_json) {
        zt_json check;
        zt_error parse_err;
        if (zt_json_parse(plugins_json, strlen(plugins_json), "_plugins", &check, &parse_err) != ZT_OK) {
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "zt_config_write_resolved: the plugin list is not valid JSON: %s",
                                parse_err.msg);
        }
        zt_json_free(&check);
    }
    const declared_option **sorted = malloc((size_t)(cfg->n_decl ? cfg->n_decl : 1) * sizeof *sorted);
    if (!sorted) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing the config");
    for (int k = 0; k < cfg->n_decl; k++) sorted[k] = &cfg->decl[k];
    qsort(sorted, (size_t)cfg->n_decl, sizeof *sorted, compare_keys);

    /* Nested objects rebuilt from the sorted dotted keys: `open` is the section path now open
     * (a prefix of the previous key, ending with '.'), `open_depth` its number of components. */
    const char *open = "";
    size_t open_len = 0;
    int open_depth = 0;
    int first_at_level[64] = {1};
    fputc('{', out);
    for (int k = 0; k < cfg->n_decl; k++) {
        const char *key = sorted[k]->opt->key;
        /* Close sections that this key is not in. */
        while (open_depth > 0 && !(strncmp(open, key, open_len) == 0)) {
            open_len--; /* drop the trailing '.' and the last component */
            while (open_len > 0 && open[open_len - 1] != '.') open_len--;
            fputc('\n', out);
            indent(out, open_depth);
            fputc('}', out);
            open_depth--;
        }
        /* Open the sections between the open path and the key's last component. */
        const char *part = key + open_len;
        const char *dot;
        while ((dot = strchr(part, '.')) != NULL) {
            fputs(first_at_level[open_depth] ? "\n" : ",\n", out);
            first_at_level[open_depth] = 0;
            indent(out, open_depth + 1);
            zt_json_write_string(out, part, (size_t)(dot - part));
            fputs(": {", out);
            open_depth++;
            first_at_level[open_depth] = 1;
            part = dot + 1;
        }
        open = key;
        open_len = (size_t)(part - key);
        fputs(first_at_level[open_depth] ? "\n" : ",\n", out);
        first_at_level[open_depth] = 0;
        indent(out, open_depth + 1);
        zt_json_write_string(out, part, strlen(part));
        fputs(": ", out);
        write_value(out, sorted[k]);
    }
    while (open_depth > 0) {
        fputc('\n', out);
        indent(out, open_depth);
        fputc('}', out);
        open_depth--;
    }
    fputs(first_at_level[0] ? "\n  \"_sources\": {" : ",\n  \"_sources\": {", out);
    for (int k = 0; k < cfg->n_decl; k++) {
        fputs(k ? ",\n    " : "\n    ", out);
        zt_json_write_string(out, sorted[k]->opt->key, strlen(sorted[k]->opt->key));
        fputs(": ", out);
        write_source(cfg, out, sorted[k]);
    }
    fputs(cfg->n_decl ? "\n  }" : "}", out);
    if (plugins_json) fprintf(out, ",\n  \"_plugins\": %s", plugins_json);
    fputs("\n}\n", out);
    free(sorted);
    if (ferror(out)) {
        return zt_error_set(err, ZT_ERR_IO, "could not write the resolved config: %s", strerror(errno));
    }
    return ZT_OK;
}

zt_status zt_config_save_resolved(const zt_config *cfg, const char *path, const char *plugins_json,
                                  zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving '%s'", path);
    zt_status st = zt_config_write_resolved(cfg, mem, plugins_json, err);
    if (fclose(mem) != 0 && st == ZT_OK)
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory saving '%s'", path);
    if (st == ZT_OK) st = zt_atomic_write(path, text, len, err);
    free(text);
    return st;
}
