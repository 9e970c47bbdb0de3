/* The model.* keys of a Hugging Face LLaMA config (model_config.h). */
#define _GNU_SOURCE
#include "state/model_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One model.* key and the value config.json gives it. */
typedef struct hf_key {
    const char *key;
    double value;
    int is_float;
} hf_key;

/* A value the user gave must agree with config.json: a model of another shape would fail later, at
 * the weights, with a less helpful message. */
static zt_status check_user_value(const zt_config *cfg, const hf_key *k, const char *path, zt_error *err)
{
    if (!zt_config_is_set(cfg, k->key)) return ZT_OK;
    double mine = k->value;
    int64_t mine_int;
    if (k->is_float) zt_config_get_float(cfg, k->key, &mine);
    else if (zt_config_get_int(cfg, k->key, &mine_int) == ZT_OK) mine = (double)mine_int;
    if (mine == k->value) return ZT_OK;
    return zt_error_set(err, ZT_ERR_CONFIG,
                        "%s is %.17g in the config but %.17g in %s (--model); remove the key (the model directory "
                        "decides) or use another model",
                        k->key, mine, k->value, path);
}

zt_status zt_model_config_apply(zt_config *cfg, const zt_hf_config *config, const char *model_arg,
                                const char *path, zt_error *err)
{
    const zt_hf_config hf = *config;
    zt_status st = ZT_OK;
    if (zt_config_is_set(cfg, "model.preset"))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "model.preset and --model %s both give the model's shape; remove model.preset (the "
                            "model's own config decides)",
                            model_arg);
    const hf_key shape[] = {
        {"model.hidden_size", (double)hf.hidden_size, 0},
        {"model.intermediate_size", (double)hf.intermediate_size, 0},
        {"model.num_hidden_layers", (double)hf.num_hidden_layers, 0},
        {"model.num_attention_heads", (double)hf.num_attention_heads, 0},
        {"model.num_key_value_heads", (double)hf.num_key_value_heads, 0},
        {"model.head_dim", (double)hf.head_dim, 0},
        {"model.vocab_size", (double)hf.vocab_size, 0},
        {"model.max_position_embeddings", (double)hf.max_position_embeddings, 0},
        {"model.rms_norm_eps", hf.rms_norm_eps, 1},
        {"model.rope_theta", hf.rope_theta, 1},
        {"model.initializer_range", hf.initializer_range, 1},
    };
    const hf_key llama3[] = {
        {"model.rope_scaling.factor", hf.rope_factor, 1},
        {"model.rope_scaling.low_freq_factor", hf.rope_low_freq_factor, 1},
        {"model.rope_scaling.high_freq_factor", hf.rope_high_freq_factor, 1},
        {"model.rope_scaling.original_max_position_embeddings", (double)hf.rope_original_max_position_embeddings, 0},
    };
    size_t n_llama3 = hf.rope_llama3 ? sizeof llama3 / sizeof llama3[0] : 0;

    char origin[4200];
    snprintf(origin, sizeof origin, "--model %s", path);
    const int rank = ZT_CONFIG_RANK_FILE; /* as if from a config file: checked against the user's values below */
    st = zt_config_put_bool(cfg, "model.tie_word_embeddings", hf.tie_word_embeddings != 0, origin, rank, err);
    if (st == ZT_OK)
        st = zt_config_put_string(cfg, "model.rope_scaling.rope_type", hf.rope_llama3 ? "llama3" : "none", origin,
                                  rank, err);
    const hf_key *lists[2] = {llama3, shape};
    size_t counts[2] = {n_llama3, sizeof shape / sizeof shape[0]};
    for (int l = 0; l < 2; l++) {
        for (size_t i = 0; i < counts[l] && st == ZT_OK; i++) {
            const hf_key *k = &lists[l][i];
            st = check_user_value(cfg, k, path, err);
            if (st != ZT_OK) break;
            st = k->is_float ? zt_config_put_float(cfg, k->key, k->value, origin, rank, err)
                             : zt_config_put_int(cfg, k->key, (int64_t)k->value, origin, rank, err);
        }
    }
    return st;
}
