/* The parameter declarations the host lays out: Hugging Face names and shapes, grouped by unit.
 * Unit 0 = embedding, 1..L = layers, L+1 = final norm + LM head. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

enum { NAME_CAP = 96 }; /* "model.layers.2147483647.post_attention_layernorm.weight" fits */

typedef struct decl_builder {
    llama_state *s;
    int32_t n;
} decl_builder;

/* tp_split_dim values (zt_param_decl): which dimension tensor parallelism would split. */
enum { TP_REPLICATED = -1, TP_ROWS = 0, TP_COLUMNS = 1 };

static zt_param_decl *add(decl_builder *b, int32_t unit, const char *name, int64_t rows, int64_t cols,
                          int32_t tp_split_dim)
{
    zt_param_decl *d = &b->s->decls[b->n];
    char *storage = b->s->names + (size_t)b->n * NAME_CAP;
    snprintf(storage, NAME_CAP, "%s", name);
    b->n++;
    d->name = storage;
    d->unit = unit;
    d->ndim = cols ? 2 : 1;
    d->shape[0] = rows;
    d->shape[1] = cols;
    d->tp_split_dim = tp_split_dim;
    d->flags = 0;
    d->init = ZT_INIT_NORMAL;
    d->init_std = (float)b->s->cfg.initializer_range;
    d->tied_to = NULL;
    return d;
}

/* HF's LlamaRMSNorm weight: starts at one, no weight decay, never split. */
static void add_norm(decl_builder *b, int32_t unit, const char *name, int64_t dim)
{
    zt_param_decl *d = add(b, unit, name, dim, 0, TP_REPLICATED);
    d->flags = ZT_PARAM_NO_DECAY;
    d->init = ZT_INIT_ONES;
    d->init_std = 0.0f;
}

const char *const llama_linear_names[LLAMA_LINEARS] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",
};

/* LoRA's A [r, in] and B [out, r] of the linear just declared (`base`), named as peft names them. A
 * is kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)); B starts at zero, so the adapted
 * model starts as the base. Tensor parallelism splits A's input columns of a row-parallel linear
 * and B's output rows of a column-parallel one. */
static void add_lora(decl_builder *b, const zt_param_decl *base, int32_t r, int32_t layer, const char *module)
{
    char name[NAME_CAP];
    int64_t out = base->shape[0], in = base->shape[1];
    int column_parallel = base->tp_split_dim == TP_ROWS;
    snprintf(name, sizeof name, "model.layers.%d.%.40s.lora_A.weight", (int)layer, module);
    zt_param_decl *a = add(b, base->unit, name, r, in, column_parallel ? TP_REPLICATED : TP_COLUMNS);
    a->flags = ZT_PARAM_ADAPTER;
    a->init = ZT_INIT_UNIFORM;
    a->init_std = (float)(1.0 / sqrt((double)in));
    snprintf(name, sizeof name, "model.layers.%d.%.40s.lora_B.weight", (int)layer, module);
    zt_param_decl *bb = add(b, base->unit, name, out, r, column_parallel ? TP_ROWS : TP_REPLICATED);
    bb->flags = ZT_PARAM_ADAPTER;
    bb->init = ZT_INIT_ZEROS;
    bb->init_std = 0.0f;
}

zt_status llama_params_build(llama_state *s)
{
    const llama_config *c = &s->cfg;
    int32_t layers = (int32_t)c->layers, n_units = layers + 2;
    int32_t n_decls = EMBED_PARAMS + layers * LAYER_PARAMS + HEAD_PARAMS + 2 * s->lora.n_adapted;
    s->decls = calloc((size_t)n_decls, sizeof *s->decls);
    s->names = calloc((size_t)n_decls, NAME_CAP);
    s->unit_first_param = calloc((size_t)n_units + 1, sizeof *s->unit_first_param);
    if (!s->decls || !s->names || !s->unit_first_param) {
        llama_params_free(s);
        s->host->error(s->host->ctx, ZT_ERR_OUT_OF_MEMORY,
                       "cannot allocate the declarations of %d parameters", n_decls);
        return ZT_ERR_OUT_OF_MEMORY;
    }
    int64_t H = c->hidden, F = c->intermediate, V = c->vocab;
    int64_t q_out = c->heads * c->head_dim, kv_out = c->kv_heads * c->head_dim;
    decl_builder b = {s, 0};
    char name[NAME_CAP];

    s->unit_first_param[0] = b.n;
    zt_param_decl *embed = add(&b, 0, "model.embed_tokens.weight", V, H, TP_ROWS);
    embed->flags = ZT_PARAM_EMBEDDING;

    for (int32_t l = 0; l < layers; l++) {
        int32_t unit = l + 1;
        s->unit_first_param[unit] = b.n;
        /* In LAYER_* order. Column-parallel projections split their output rows, row-parallel
         * ones (o, down) their input columns: Megatron's split of attention and MLP. */
        const struct { const char *suffix; int64_t rows, cols; int32_t split; } linear[] = {
            {"self_attn.q_proj", q_out, H, TP_ROWS}, {"self_attn.k_proj", kv_out, H, TP_ROWS},
            {"self_attn.v_proj", kv_out, H, TP_ROWS}, {"self_attn.o_proj", H, q_out, TP_COLUMNS},
            {"mlp.gate_proj", F, H, TP_ROWS}, {"mlp.up_proj", F, H, TP_ROWS},
            {"mlp.down_proj", H, F, TP_COLUMNS},
        };
        for (size_t i = 0; i < sizeof linear / sizeof linear[0]; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, linear[i].suffix);
            add(&b, unit, name, linear[i].rows, linear[i].cols, linear[i].split);
        }
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        add_norm(&b, unit, name, H);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        add_norm(&b, unit, name, H);
        /* the adapter's A and B after the layer's own parameters, in LAYER_* order (lora.c's slots) */
        for (int32_t k = 0; s->lora.r > 0 && k < LLAMA_LINEARS; k++) {
            if (s->lora.slot[l * LLAMA_LINEARS + k] < 0) continue;
            add_lora(&b, &s->decls[s->unit_first_param[unit] + k], s->lora.r, l, linear[k].suffix);
        }
    }

    int32_t head_unit = layers + 1;
    s->unit_first_param[head_unit] = b.n;
    add_norm(&b, head_unit, "model.norm.weight", H);
    zt_param_decl *lm_head = add(&b, head_unit, "lm_head.weight", V, H, TP_ROWS);
    if (c->tie_embeddings) {
        lm_head->flags = ZT_PARAM_TIED;
        lm_head->tied_to = embed->name;
    }
    s->unit_first_param[n_units] = b.n;

    int64_t total = 0;
    for (int32_t i = 0; i < b.n; i++) {
        if (s->decls[i].flags & ZT_PARAM_TIED) continue;
        total += s->decls[i].ndim == 2 ? s->decls[i].shape[0] * s->decls[i].shape[1] : s->decls[i].shape[0];
    }

    /* Bytes kept per token per layer between forward and backward, in fp32. Both counts include
     * the layer input, which the host keeps for every unit. Without recompute the layer also keeps
     * (layers.c, carve_layer): both norm outputs, the residual after attention, q, k, v, the
     * attention output, gate and up, two RMS factors, and the attention plugin's per-head
     * log-sum-exp (naive attention). */
    double floats = (double)(4 * H + 2 * q_out + 2 * kv_out + 2 * F + 2 + c->heads);
    /* with LoRA, each adapted linear also keeps its [N, r] down-projection (layers.c) */
    if (layers > 0) floats += (double)s->lora.n_adapted / layers * s->lora.r;
    zt_model_info *info = &s->info;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    info->n_units = n_units;
    info->n_layers = layers;
    info->vocab_size = (int32_t)V;
    info->hidden_size = (int32_t)H;
    info->n_heads = (int32_t)c->heads;
    info->n_kv_heads = (int32_t)c->kv_heads;
    info->head_dim = (int32_t)c->head_dim;
    info->intermediate_size = (int32_t)F;
    info->max_seq_len = (int32_t)c->max_positions;
    info->n_params_decl = b.n;
#ifdef ZT_PLUGIN_CUDA
    info->caps = ZT_MODEL_CAN_SAMPLE_ON_DEVICE; /* the CUDA head samples (layers_cuda.c) */
#endif
    info->params = s->decls;
    info->n_parameters = total;
    info->act_bytes_per_token_layer = floats * sizeof(float);
    info->act_bytes_per_token_layer_recompute = (double)H * sizeof(float);
    /* ABI 1.3: what an export's config.json needs beyond the shape (a preset's values included) */
    info->rms_norm_eps = c->rms_norm_eps;
    info->rope_theta = c->rope.theta;
    return ZT_OK;
}

void llama_params_free(llama_state *s)
{
    free(s->decls);
    free(s->names);
    free(s->unit_first_param);
    s->decls = NULL;
    s->names = NULL;
    s->unit_first_param = NULL;
}
