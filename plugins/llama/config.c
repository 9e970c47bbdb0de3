/* The model's shape: a preset's values, overridden by every model.* key the user (or the host,
 * copying an HF config.json) set, then validated as a whole. */
#include <stdio.h>
#include <string.h>

#include "llama.h"

typedef struct llama_preset {
    const char *name;
    int64_t hidden, layers, heads, kv_heads, intermediate, vocab, max_positions;
    double rms_norm_eps, rope_theta;
} llama_preset;

/* The shapes of well-known checkpoints, so `model.preset` alone trains something real-sized:
 * 1b = TinyLlama-1.1B, 7b = Llama-2-7B, 8b = Llama-3-8B (values of their HF config.json). */
static const llama_preset k_presets[] = {
    {"tiny", 288, 6, 6, 6, 768, 32000, 2048, 1e-5, 10000.0},
    {"125m", 768, 12, 12, 12, 2048, 32000, 2048, 1e-5, 10000.0},
    {"1b", 2048, 22, 32, 4, 5632, 32000, 2048, 1e-5, 10000.0},
    {"7b", 4096, 32, 32, 32, 11008, 32000, 4096, 1e-5, 10000.0},
    {"8b", 4096, 32, 32, 8, 14336, 128256, 8192, 1e-5, 500000.0},
};

/* Without a preset, the values transformers' LlamaConfig defaults to. */
#define DEFAULT_RMS_NORM_EPS 1e-6
#define DEFAULT_ROPE_THETA 10000.0
#define DEFAULT_MAX_POSITIONS 2048

/* The largest size a model dimension may have: the kernels index with int64 but the ABI's
 * zt_model_info carries int32 fields. */
#define MAX_DIM INT32_MAX

/* Reads an integer key into *out when the user set it; returns 1 if set, 0 if not. */
static int read_int(const zt_host *host, const char *key, int64_t *out)
{
    int64_t v;
    if (host->cfg_int(host->ctx, key, &v) != ZT_OK) return 0;
    *out = v;
    return 1;
}

static int read_float(const zt_host *host, const char *key, double *out)
{
    double v;
    if (host->cfg_float(host->ctx, key, &v) != ZT_OK) return 0;
    *out = v;
    return 1;
}

/* The sizes every model needs; without a preset all of them must be set. */
static const char *const k_required_sizes[] = {
    "model.hidden_size", "model.intermediate_size", "model.num_hidden_layers",
    "model.num_attention_heads", "model.vocab_size",
};

static zt_status resolve_sizes(const zt_host *host, llama_config *cfg)
{
    const char *preset_name = NULL;
    const llama_preset *preset = NULL;
    if (host->cfg_string(host->ctx, "model.preset", &preset_name) == ZT_OK) {
        for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
            if (strcmp(k_presets[i].name, preset_name) == 0) preset = &k_presets[i];
        if (!preset) { /* the schema's choices and this table disagree: a plugin bug */
            host->error(host->ctx, ZT_ERR_INTERNAL,
                        "model.preset = \"%s\" passed validation but the llama plugin has no such preset "
                        "(a bug in the plugin; report it)", preset_name);
            return ZT_ERR_INTERNAL;
        }
    }
    cfg->preset = preset ? preset->name : NULL;
    if (preset) {
        cfg->hidden = preset->hidden;
        cfg->layers = preset->layers;
        cfg->heads = preset->heads;
        cfg->kv_heads = preset->kv_heads;
        cfg->intermediate = preset->intermediate;
        cfg->vocab = preset->vocab;
        cfg->max_positions = preset->max_positions;
        cfg->rms_norm_eps = preset->rms_norm_eps;
        cfg->rope.theta = preset->rope_theta;
    } else {
        cfg->max_positions = DEFAULT_MAX_POSITIONS;
        cfg->rms_norm_eps = DEFAULT_RMS_NORM_EPS;
        cfg->rope.theta = DEFAULT_ROPE_THETA;
    }

    int64_t *required[] = {&cfg->hidden, &cfg->intermediate, &cfg->layers, &cfg->heads, &cfg->vocab};
    char missing[512] = "";
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        if (read_int(host, k_required_sizes[i], required[i]) || preset) continue;
        size_t used = strlen(missing);
        snprintf(missing + used, sizeof missing - used, "%s%s", used ? ", " : "", k_required_sizes[i]);
    }
    if (missing[0]) {
        host->error(host->ctx, ZT_ERR_CONFIG,
                    "the llama model has no size: model.preset is not set and neither are %s. Set "
                    "model.preset to one of tiny, 125m, 1b, 7b, 8b (e.g. --set model.preset=1b), or give "
                    "all of model.hidden_size, model.intermediate_size, model.num_hidden_layers, "
                    "model.num_attention_heads and model.vocab_size, or pass an HF checkpoint with "
                    "--model DIR (its config.json sets them)", missing);
        return ZT_ERR_CONFIG;
    }
    /* HF's LlamaConfig: num_key_value_heads defaults to num_attention_heads (plain multi-head). */
    if (!read_int(host, "model.num_key_value_heads", &cfg->kv_heads) && !preset) cfg->kv_heads = cfg->heads;
    read_int(host, "model.max_position_embeddings", &cfg->max_positions);
    read_float(host, "model.rms_norm_eps", &cfg->rms_norm_eps);
    read_float(host, "model.rope_theta", &cfg->rope.theta);
    cfg->head_dim = 0;
    read_int(host, "model.head_dim", &cfg->head_dim);
    int32_t tie = 0;
    if (host->cfg_bool(host->ctx, "model.tie_word_embeddings", &tie) == ZT_OK) cfg->tie_embeddings = tie;
    read_float(host, "model.initializer_range", &cfg->initializer_range); /* the schema's default: 0.02 */
    return ZT_OK;
}

/* The Llama 3.1 rope_scaling block: all four numbers or none. */
static zt_status resolve_rope_scaling(const zt_host *host, llama_config *cfg)
{
    static const char *const keys[] = {
        "model.rope_scaling.factor", "model.rope_scaling.low_freq_factor",
        "model.rope_scaling.high_freq_factor", "model.rope_scaling.original_max_position_embeddings",
    };
    const char *rope_type = "none";
    host->cfg_string(host->ctx, "model.rope_scaling.rope_type", &rope_type);
    int llama3 = strcmp(rope_type, "llama3") == 0;
    double values[4] = {0};
    int64_t original = 0;
    int given[4];
    given[0] = read_float(host, keys[0], &values[0]);
    given[1] = read_float(host, keys[1], &values[1]);
    given[2] = read_float(host, keys[2], &values[2]);
    given[3] = read_int(host, keys[3], &original);
    values[3] = (double)original;
    for (int i = 0; i < 4; i++) {
        if (given[i] && !llama3) {
            host->error(host->ctx, ZT_ERR_CONFIG,
                        "%s is set but model.rope_scaling.rope_type is \"%s\": the scaling numbers only apply "
                        "to Llama 3.1 rope scaling; set model.rope_scaling.rope_type to \"llama3\" or remove %s",
                        keys[i], rope_type, keys[i]);
            return ZT_ERR_CONFIG;
        }
        if (!given[i] && llama3) {
            host->error(host->ctx, ZT_ERR_CONFIG,
                        "model.rope_scaling.rope_type is \"llama3\" but %s is not set; Llama 3.1 rope scaling "
                        "needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings "
                        "(Llama-3.1-8B: 8, 1, 4 and 8192)", keys[i]);
            return ZT_ERR_CONFIG;
        }
    }
    cfg->rope.rope_type = llama3 ? ZT_ROPE_LLAMA3 : ZT_ROPE_DEFAULT;
    if (!llama3) return ZT_OK;
    cfg->rope.factor = values[0];
    cfg->rope.low_freq_factor = values[1];
    cfg->rope.high_freq_factor = values[2];
    cfg->rope.original_max_position_embeddings = values[3];
    /* transformers divides by (high_freq_factor - low_freq_factor) to blend the middle band. */
    if (!(values[2] > values[1])) {
        host->error(host->ctx, ZT_ERR_CONFIG,
                    "model.rope_scaling.high_freq_factor (%g) must be greater than "
                    "model.rope_scaling.low_freq_factor (%g): the band between them is blended by dividing by "
                    "their difference (Llama-3.1 uses 4 and 1)", values[2], values[1]);
        return ZT_ERR_CONFIG;
    }
    return ZT_OK;
}

/* Relations between keys the schema cannot express (it already checked each value's range). */
static zt_status validate(const zt_host *host, llama_config *cfg)
{
    const struct { const char *key; int64_t value; } dims[] = {
        {"model.hidden_size", cfg->hidden}, {"model.intermediate_size", cfg->intermediate},
        {"model.num_hidden_layers", cfg->layers}, {"model.num_attention_heads", cfg->heads},
        {"model.num_key_value_heads", cfg->kv_heads}, {"model.vocab_size", cfg->vocab},
        {"model.max_position_embeddings", cfg->max_positions}, {"model.head_dim", cfg->head_dim},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].value > MAX_DIM) {
            host->error(host->ctx, ZT_ERR_CONFIG, "%s = %lld is too large: at most %d",
                        dims[i].key, (long long)dims[i].value, MAX_DIM);
            return ZT_ERR_CONFIG;
        }
    }
    if (cfg->heads % cfg->kv_heads != 0) {
        host->error(host->ctx, ZT_ERR_CONFIG,
                    "model.num_key_value_heads (%lld) must divide model.num_attention_heads (%lld): each "
                    "key/value head serves the same number of query heads (grouped-query attention); use 1 "
                    "(multi-query), another divisor, or %lld (multi-head)",
                    (long long)cfg->kv_heads, (long long)cfg->heads, (long long)cfg->heads);
        return ZT_ERR_CONFIG;
    }
    if (cfg->head_dim == 0) {
        if (cfg->hidden % cfg->heads != 0) {
            host->error(host->ctx, ZT_ERR_CONFIG,
                        "model.hidden_size (%lld) is not a multiple of model.num_attention_heads (%lld), so "
                        "the head size hidden_size / num_attention_heads is not a whole number; change one of "
                        "them, or set model.head_dim",
                        (long long)cfg->hidden, (long long)cfg->heads);
            return ZT_ERR_CONFIG;
        }
        cfg->head_dim = cfg->hidden / cfg->heads;
    }
    if (cfg->head_dim % 2 != 0) {
        host->error(host->ctx, ZT_ERR_CONFIG,
                    "the head size is %lld, but rotary embeddings rotate pairs of dimensions and need an even "
                    "head size; set an even model.head_dim (or change model.hidden_size or "
                    "model.num_attention_heads, whose quotient it is by default)",
                    (long long)cfg->head_dim);
        return ZT_ERR_CONFIG;
    }
    if (cfg->heads * cfg->head_dim > MAX_DIM) {
        host->error(host->ctx, ZT_ERR_CONFIG,
                    "model.num_attention_heads x head size = %lld x %lld is too large: at most %d",
                    (long long)cfg->heads, (long long)cfg->head_dim, MAX_DIM);
        return ZT_ERR_CONFIG;
    }
    cfg->rope.head_dim = (int32_t)cfg->head_dim;
    return ZT_OK;
}

zt_status llama_config_resolve(const zt_host *host, llama_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    zt_status st = resolve_sizes(host, cfg);
    if (st == ZT_OK) st = resolve_rope_scaling(host, cfg);
    if (st == ZT_OK) st = validate(host, cfg);
    return st;
}
