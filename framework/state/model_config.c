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

    char *json = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&json, &len);
    if (!f) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading --model");
    fprintf(f, "{\"model\": {\"tie_word_embeddings\": %s, \"rope_scaling\": {\"rope_type\": \"%s\"",
            hf.tie_word_embeddings ? "true" : "false", hf.rope_llama3 ? "llama3" : "none");
    for (size_t i = 0; i < n_llama3 && st == ZT_OK; i++) {
        fprintf(f, ", \"%s\": %.17g", strrchr(llama3[i].key, '.') + 1, llama3[i].value);
        st = check_user_value(cfg, &llama3[i], path, err);
    }
    fputc('}', f);
    for (size_t i = 0; i < sizeof shape / sizeof shape[0] && st == ZT_OK; i++) {
        fprintf(f, ", \"%s\": %.17g", strrchr(shape[i].key, '.') + 1, shape[i].value);
        st = check_user_value(cfg, &shape[i], path, err);
    }
    fputs("}}", f);
    if (fclose(f) != 0 && st == ZT_OK)
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading --model");
    if (st == ZT_OK) {
        char origin[4200];
        snprintf(origin, sizeof origin, "--model %s", path);
        st = zt_config_load_string(cfg, json, origin, err);
    }
    free(json);
    return st;
}
