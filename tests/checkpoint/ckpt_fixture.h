/* A small model and the flat padded layout the host builds for it, for the checkpoint tests: the
 * same model saved from N simulated ranks and read back under M. The layout is computed here from
 * the rule in zt_train.h (each unit's parameters concatenated, padded to a multiple of
 * dp_size * alignment, rank r holding the r-th equal slice), independently of checkpoint.c. */
#ifndef ZT_TEST_CKPT_FIXTURE_H
#define ZT_TEST_CKPT_FIXTURE_H

#include "safetensors/test_util.h" /* first: it sets the feature macros */

#include <math.h>

#include "state/checkpoint.h"

#define FIX_UNITS 4
#define FIX_PARAMS 9
#define FIX_GROUPS 3

static const char *const fix_groups[FIX_GROUPS] = {"param", "exp_avg", "exp_avg_sq"};

/* hidden 6, vocab 13, 2 layers (q_proj, a norm, down_proj with intermediate 5), final norm and an
 * lm_head that is tied to the embeddings when `tied`. */
static zt_param_decl fix_params[FIX_PARAMS] = {
    {"model.embed_tokens.weight", 2, 0, {13, 6}, 0, ZT_PARAM_EMBEDDING, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.0.self_attn.q_proj.weight", 2, 1, {6, 6}, 0, 0, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.0.input_layernorm.weight", 1, 1, {6}, -1, ZT_PARAM_NO_DECAY, ZT_INIT_ONES, 0, NULL},
    {"model.layers.0.mlp.down_proj.weight", 2, 1, {6, 5}, 1, 0, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.1.self_attn.q_proj.weight", 2, 2, {6, 6}, 0, 0, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.1.input_layernorm.weight", 1, 2, {6}, -1, ZT_PARAM_NO_DECAY, ZT_INIT_ONES, 0, NULL},
    {"model.layers.1.mlp.down_proj.weight", 2, 2, {6, 5}, 1, 0, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.norm.weight", 1, 3, {6}, -1, ZT_PARAM_NO_DECAY, ZT_INIT_ONES, 0, NULL},
    {"lm_head.weight", 2, 3, {13, 6}, 0, 0, ZT_INIT_NORMAL, 0.02f, NULL},
};

typedef struct fix_model {
    zt_model_info info;
    zt_param_decl params[FIX_PARAMS];
    zt_unit_layout units[FIX_UNITS];
    int64_t param_offset[FIX_PARAMS];
    uint8_t trainable[FIX_PARAMS], decay[FIX_PARAMS];
    zt_layout layout;
    int dp_size;
} fix_model;

static inline int64_t fix_numel(const zt_param_decl *d)
{
    int64_t n = 1;
    for (int k = 0; k < d->ndim; k++) n *= d->shape[k];
    return n;
}

static inline void fix_model_init(fix_model *m, int tied, int dp_size, int alignment)
{
    memset(m, 0, sizeof *m);
    memcpy(m->params, fix_params, sizeof m->params);
    if (tied) {
        m->params[8].flags |= ZT_PARAM_TIED;
        m->params[8].tied_to = "model.embed_tokens.weight";
    }
    m->info = (zt_model_info){.struct_size = sizeof(zt_model_info), .n_units = FIX_UNITS,
                              .n_layers = 2, .vocab_size = 13, .hidden_size = 6, .n_heads = 2,
                              .n_kv_heads = 1, .head_dim = 3, .intermediate_size = 5,
                              .max_seq_len = 32, .n_params_decl = FIX_PARAMS, .params = m->params};
    m->dp_size = dp_size;
    for (int u = 0, p = 0; u < FIX_UNITS; u++) {
        zt_unit_layout *ul = &m->units[u];
        ul->first_param = p;
        for (; p < FIX_PARAMS && m->params[p].unit == u; p++, ul->n_params++) {
            m->trainable[p] = 1;
            m->decay[p] = !(m->params[p].flags & ZT_PARAM_NO_DECAY);
            if (m->params[p].flags & ZT_PARAM_TIED) continue; /* no storage of its own */
            m->param_offset[p] = ul->numel;
            ul->numel += fix_numel(&m->params[p]);
        }
        int64_t quantum = (int64_t)dp_size * alignment;
        ul->padded_numel = (ul->numel + quantum - 1) / quantum * quantum;
    }
    m->layout = (zt_layout){sizeof(zt_layout), FIX_UNITS, &m->info, m->units, m->param_offset,
                            m->trainable, m->decay, ZT_F32, 0, NULL, NULL};
}

/* Rank r's slice of unit u: [offset, offset + count). */
static inline void fix_shard_range(const fix_model *m, int u, int rank, int64_t *offset,
                                   int64_t *count)
{
    *count = m->units[u].padded_numel / m->dp_size;
    *offset = rank * *count;
}

static inline int fix_key(const char *name, const char *group)
{
    unsigned h = 5381;
    for (const char *p = name; *p; p++) h = h * 33 + (unsigned char)*p;
    for (const char *p = group; *p; p++) h = h * 33 + (unsigned char)*p;
    return (int)(h % 100000);
}

/* Element i of logical tensor (name, group), at `version` (tests save different values per step). */
static inline float fix_value(const char *name, const char *group, int64_t i, int version)
{
    return ref_value(fix_key(name, group) + version, i);
}

/* Unit u's padded flat buffer of `group` as the ZeRO plugin holds it; padding holds `padding`. */
static inline float *fix_flat_unit(const fix_model *m, int u, const char *group, int version,
                                   float padding)
{
    const zt_unit_layout *ul = &m->units[u];
    float *flat = malloc((size_t)ul->padded_numel * sizeof *flat);
    for (int64_t i = 0; i < ul->padded_numel; i++) flat[i] = padding;
    for (int p = ul->first_param; p < ul->first_param + ul->n_params; p++) {
        if (m->params[p].flags & ZT_PARAM_TIED) continue;
        for (int64_t i = 0; i < fix_numel(&m->params[p]); i++) {
            flat[m->param_offset[p] + i] = fix_value(m->params[p].name, group, i, version);
        }
    }
    return flat;
}

/* The logical tensors of the model, one per (parameter, group). decls has room for all. */
static inline size_t fix_decls(const fix_model *m, zt_ckpt_tensor_decl *decls)
{
    size_t n = 0;
    for (int g = 0; g < FIX_GROUPS; g++) {
        for (int p = 0; p < FIX_PARAMS; p++) {
            const zt_param_decl *d = &m->params[p];
            if (d->flags & ZT_PARAM_TIED) continue;
            decls[n] = (zt_ckpt_tensor_decl){d->name, fix_groups[g], d->ndim, {0}};
            memcpy(decls[n].shape, d->shape, sizeof d->shape);
            n++;
        }
    }
    return n;
}

/* Every simulated rank writes its slice of every unit and group, plus blobs ("rng" from rank 0,
 * "loader.rank<r>" from each rank). results has room for m->dp_size entries. */
static inline void fix_write_ranks(const fix_model *m, const char *staging, int version,
                                   zt_ckpt_rank_result *results)
{
    zt_error err = {0};
    for (int r = 0; r < m->dp_size; r++) {
        zt_ckpt_rank_writer *w = NULL;
        ZT_CHECK_INT(zt_ckpt_rank_writer_open(staging, r, &w, &err), ZT_OK);
        if (!w) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
        for (int u = 0; u < FIX_UNITS; u++) {
            for (int g = 0; g < FIX_GROUPS; g++) {
                float *flat = fix_flat_unit(m, u, fix_groups[g], version, NAN);
                int64_t offset, count;
                fix_shard_range(m, u, r, &offset, &count);
                ZT_CHECK_INT(zt_ckpt_rank_writer_add_unit_shard(w, &m->layout, u, fix_groups[g],
                                                                offset, count, flat + offset, &err),
                             ZT_OK);
                free(flat);
            }
        }
        char name[32];
        int64_t position[2] = {1000 + r, version};
        snprintf(name, sizeof name, "loader.rank%d", r);
        ZT_CHECK_INT(zt_ckpt_rank_writer_add_blob(w, name, position, sizeof position, &err), ZT_OK);
        if (r == 0) {
            const char rng[] = "rng-state-of-rank-0";
            ZT_CHECK_INT(zt_ckpt_rank_writer_add_blob(w, "rng", rng, sizeof rng, &err), ZT_OK);
        }
        ZT_CHECK_INT(zt_ckpt_rank_writer_finish(w, &results[r], &err), ZT_OK);
    }
}

/* A complete save of `m` at `step` under root; returns the published directory (malloc'd). */
static inline char *fix_save(const fix_model *m, const char *root, int64_t step, int version,
                             int keep_last)
{
    zt_error err = {0};
    char *staging = NULL;
    ZT_CHECK_INT(zt_ckpt_stage(root, step, &staging, &err), ZT_OK);
    zt_ckpt_rank_result results[8];
    fix_write_ranks(m, staging, version, results);
    zt_ckpt_tensor_decl decls[FIX_PARAMS * FIX_GROUPS];
    zt_ckpt_commit_args a = {
        .root = root, .staging_dir = staging, .step = step,
        .config_json = "{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": 2}}",
        .layout = {m->dp_size, 2, m->dp_size, 1, 1},
        .tensors = decls, .n_tensors = fix_decls(m, decls),
        .ranks = results, .n_ranks = (size_t)m->dp_size, .keep_last = keep_last};
    zt_ckpt_model_shape_from_info(&m->info, &a.model);
    char *final = NULL;
    ZT_CHECK_INT(zt_ckpt_commit(&a, &final, &err), ZT_OK);
    if (!final) fprintf(stderr, "commit: %s\n", err.msg);
    for (int r = 0; r < m->dp_size; r++) zt_ckpt_rank_result_free(&results[r]);
    free(staging);
    return final;
}

#endif
