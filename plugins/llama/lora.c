/* LoRA on the llama layers' linears (zt_model_ops.adapt, include/zt/zt_adapter.h): which linears the
 * spec's target_modules select, with peft's matching rule, and the declarations the adapter adds.
 * The math is the device path's (layers.c on the CPU, lora_cuda.c on CUDA). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

/* peft's rule for a list of targets: module `name` is adapted when it is a target or ends in
 * "." + a target. */
static int target_matches(const char *target, const char *name)
{
    size_t nt = strlen(target), nn = strlen(name);
    if (nt == nn) return !strcmp(target, name);
    return nt < nn && name[nn - nt - 1] == '.' && !strcmp(name + nn - nt, target);
}

void llama_lora_free(llama_state *s)
{
    free(s->lora.slot);
    free(s->lora.targets);
    memset(&s->lora, 0, sizeof s->lora);
}

static zt_status lora_refuse(llama_state *s, const char *fmt, const char *what)
{
    s->host->error(s->host->ctx, ZT_ERR_CONFIG, fmt, what);
    llama_lora_free(s);
    return ZT_ERR_CONFIG;
}

/* Marks in s->lora.slot the linears the comma-separated targets select; every target must select
 * one (peft refuses a target that is not in the model, too). */
static zt_status resolve_targets(llama_state *s, const char *list)
{
    int32_t layers = (int32_t)s->cfg.layers;
    if (!strcmp(list, "all-linear")) {
        for (int32_t i = 0; i < layers * LLAMA_LINEARS; i++) s->lora.slot[i] = 1;
        return ZT_OK;
    }
    char *copy = strdup(list);
    if (!copy) return lora_refuse(s, "out of memory reading lora.target_modules%s", "");
    zt_status st = ZT_OK;
    char module[96];
    for (char *t = strtok(copy, ","); t && st == ZT_OK; t = strtok(NULL, ",")) {
        while (*t == ' ') t++;
        for (char *e = t + strlen(t); e > t && e[-1] == ' ';) *--e = '\0';
        if (!strcmp(t, "lm_head") || !strcmp(t, "embed_tokens")) {
            s->host->error(s->host->ctx, ZT_ERR_CONFIG,
                           "lora.target_modules: \"%s\": the llama plugin adapts the layers' linears (q_proj, "
                           "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj), not the embedding or the LM "
                           "head; to train \"%s\" itself name it in trainable_params",
                           t, t);
            st = ZT_ERR_CONFIG;
            break;
        }
        int hits = 0;
        for (int32_t l = 0; l < layers; l++)
            for (int32_t k = 0; k < LLAMA_LINEARS; k++) {
                snprintf(module, sizeof module, "model.layers.%d.%s", (int)l, llama_linear_names[k]);
                if (target_matches(t, module)) s->lora.slot[l * LLAMA_LINEARS + k] = 1, hits++;
            }
        if (!hits) {
            s->host->error(s->host->ctx, ZT_ERR_CONFIG,
                           "lora.target_modules: \"%s\" names no linear layer of this model; a target is a module "
                           "name or its end (\"q_proj\", \"self_attn.v_proj\", \"model.layers.0.mlp.down_proj\"): "
                           "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or \"all-linear\"",
                           t);
            st = ZT_ERR_CONFIG;
        }
    }
    free(copy);
    if (st != ZT_OK) llama_lora_free(s);
    return st;
}

zt_status llama_lora_adapt(llama_state *s, const zt_adapter_spec *spec)
{
    if (s->lora.r > 0) return lora_refuse(s, "the llama plugin already carries an adapter%s", "");
    if (spec->method != ZT_ADAPTER_LORA)
        return lora_refuse(s, "the llama plugin computes LoRA adapters only (zt_adapter_spec.method %s)", "is another");
    if (spec->r < 1 || !spec->target_modules || !*spec->target_modules)
        return lora_refuse(s, "the adapter spec has no rank or no target modules (an adapter plugin bug)%s", "");
    int32_t layers = (int32_t)s->cfg.layers;
    s->lora.slot = malloc((size_t)layers * LLAMA_LINEARS * sizeof *s->lora.slot);
    s->lora.targets = strdup(spec->target_modules);
    if (!s->lora.slot || !s->lora.targets) return lora_refuse(s, "out of memory setting up the adapter%s", "");
    for (int32_t i = 0; i < layers * LLAMA_LINEARS; i++) s->lora.slot[i] = -1;
    zt_status st = resolve_targets(s, spec->target_modules);
    if (st != ZT_OK) return st;
    /* slot: the index of A in the unit's views, after the layer's own LAYER_PARAMS */
    s->lora.n_adapted = 0;
    for (int32_t l = 0; l < layers; l++) {
        int32_t j = 0;
        for (int32_t k = 0; k < LLAMA_LINEARS; k++)
            if (s->lora.slot[l * LLAMA_LINEARS + k] >= 0) s->lora.slot[l * LLAMA_LINEARS + k] = LAYER_PARAMS + 2 * j++;
        s->lora.n_adapted += j;
    }
    s->lora.r = spec->r;
    s->lora.scaling = (float)spec->scaling;
    s->lora.dropout = (float)spec->dropout;
    int64_t seed = 0;
    if (s->lora.dropout > 0 && s->host->cfg_int(s->host->ctx, "seed", &seed) != ZT_OK)
        return lora_refuse(s, "lora.lora_dropout: the host key seed cannot be read%s", "");
    s->lora.seed = (uint64_t)seed;
    llama_params_free(s);
    st = llama_params_build(s);
    if (st != ZT_OK) {
        llama_lora_free(s);
        return st;
    }
    s->host->log(s->host->ctx, ZT_LOG_INFO, "llama: LoRA r %d, scaling %g on %d linears (%s)", (int)spec->r,
                 spec->scaling, (int)s->lora.n_adapted, spec->target_modules);
    return ZT_OK;
}
