/* Checkpoint -> Hugging Face export: a LLaMA saved by 3 simulated ranks (padded flat units) exports
 * to a transformers directory whose tensors are exactly the logical values (no padding, no shift at
 * shard boundaries), in fp32 and in sharded bf16; a config that does not match is refused. */
#include "safetensors/test_util.h"

#include "state/checkpoint.h"
#include "state/hf_model.h"

#define DP 3
#define ALIGN 4

static int name_key(const char *name)
{
    unsigned h = 5381;
    for (const char *p = name; *p; p++) h = h * 33 + (unsigned char)*p;
    return (int)(h % 1000);
}

static int64_t numel_of(const zt_st_tensor_spec *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
    return n;
}

/* Save the LLaMA of config c from DP ranks: units are the embeddings, one per layer, and the head
 * (final norm + lm_head), each padded to a multiple of DP * ALIGN. */
static char *save_llama(const char *root, const zt_hf_config *c)
{
    zt_error err = {0};
    zt_hf_tensor_list list;
    ZT_CHECK_INT(zt_hf_llama_tensors(c, ZT_ST_F32, &list, &err), ZT_OK);
    int n_units = (int)c->num_hidden_layers + 2;
    zt_param_decl *params = calloc(list.n, sizeof *params);
    zt_unit_layout *units = calloc((size_t)n_units, sizeof *units);
    int64_t *offsets = calloc(list.n, sizeof *offsets);
    for (size_t i = 0; i < list.n; i++) {
        const char *name = list.specs[i].name;
        int unit = !strncmp(name, "model.layers.", 13) ? 1 + atoi(name + 13)
                 : !strcmp(name, "model.embed_tokens.weight") ? 0 : n_units - 1;
        params[i] = (zt_param_decl){name, list.specs[i].ndim, unit, {list.specs[i].shape[0],
                                    list.specs[i].shape[1]}, -1, 0, ZT_INIT_NORMAL, 0.02f, NULL};
        zt_unit_layout *u = &units[unit];
        if (u->n_params == 0) u->first_param = (int32_t)i;
        u->n_params++;
        offsets[i] = u->numel;
        u->numel += numel_of(&list.specs[i]);
    }
    for (int u = 0; u < n_units; u++) {
        units[u].padded_numel = (units[u].numel + DP * ALIGN - 1) / (DP * ALIGN) * (DP * ALIGN);
    }
    zt_model_info info = {.struct_size = sizeof info, .n_units = n_units,
                          .n_layers = (int32_t)c->num_hidden_layers,
                          .vocab_size = (int32_t)c->vocab_size, .hidden_size = (int32_t)c->hidden_size,
                          .n_heads = (int32_t)c->num_attention_heads,
                          .n_kv_heads = (int32_t)c->num_key_value_heads,
                          .head_dim = (int32_t)c->head_dim,
                          .intermediate_size = (int32_t)c->intermediate_size,
                          .n_params_decl = (int32_t)list.n, .params = params};
    zt_layout layout = {sizeof layout, n_units, &info, units, offsets, NULL, NULL, ZT_F32, 0, NULL, NULL};

    char *staging = NULL;
    ZT_CHECK_INT(zt_ckpt_stage(root, 5, &staging, &err), ZT_OK);
    zt_ckpt_rank_result results[DP];
    for (int r = 0; r < DP; r++) {
        zt_ckpt_rank_writer *w = NULL;
        ZT_CHECK_INT(zt_ckpt_rank_writer_open(staging, r, &w, &err), ZT_OK);
        for (int u = 0; u < n_units; u++) {
            float *flat = malloc((size_t)units[u].padded_numel * sizeof *flat);
            for (int64_t e = 0; e < units[u].padded_numel; e++) flat[e] = -999.0f; /* padding */
            for (int p = units[u].first_param; p < units[u].first_param + units[u].n_params; p++) {
                for (int64_t e = 0; e < numel_of(&list.specs[p]); e++) {
                    flat[offsets[p] + e] = ref_value(name_key(params[p].name), e);
                }
            }
            int64_t count = units[u].padded_numel / DP, offset = r * count;
            ZT_CHECK_INT(zt_ckpt_rank_writer_add_unit_shard(w, &layout, u, ZT_CKPT_GROUP_PARAM,
                                                            offset, count, flat + offset, &err),
                         ZT_OK);
            free(flat);
        }
        ZT_CHECK_INT(zt_ckpt_rank_writer_finish(w, &results[r], &err), ZT_OK);
    }
    zt_ckpt_tensor_decl *decls = calloc(list.n, sizeof *decls);
    for (size_t i = 0; i < list.n; i++) {
        decls[i] = (zt_ckpt_tensor_decl){list.specs[i].name, ZT_CKPT_GROUP_PARAM, list.specs[i].ndim,
                                         {list.specs[i].shape[0], list.specs[i].shape[1]}};
    }
    zt_ckpt_commit_args a = {.root = root, .staging_dir = staging, .step = 5,
                             .layout = {DP, 3, DP, 1, 1}, .tensors = decls, .n_tensors = list.n,
                             .ranks = results, .n_ranks = DP};
    zt_ckpt_model_shape_from_info(&info, &a.model);
    char *final = NULL;
    ZT_CHECK_INT(zt_ckpt_commit(&a, &final, &err), ZT_OK);
    if (!final) fprintf(stderr, "%s\n", err.msg);
    for (int r = 0; r < DP; r++) zt_ckpt_rank_result_free(&results[r]);
    free(decls);
    free(staging);
    free(params);
    free(units);
    free(offsets);
    zt_hf_tensor_list_free(&list);
    return final;
}

static void check_export(const char *dir, const zt_hf_config *c, int dtype)
{
    zt_error err = {0};
    zt_hf_model *m = NULL;
    ZT_CHECK_INT(zt_hf_model_open(dir, &m, &err), ZT_OK);
    if (!m) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    ZT_CHECK(zt_hf_model_config(m)->dtype == dtype);
    zt_hf_tensor_list list;
    ZT_CHECK_INT(zt_hf_llama_tensors(c, ZT_ST_F32, &list, &err), ZT_OK);
    for (size_t i = 0; i < list.n; i++) {
        int64_t n = numel_of(&list.specs[i]);
        float *got = malloc((size_t)n * sizeof *got);
        ZT_CHECK_INT(zt_hf_model_read(m, list.specs[i].name, list.specs[i].ndim, list.specs[i].shape,
                                      0, (uint64_t)n, got, &err),
                     ZT_OK);
        int same = 1;
        for (int64_t e = 0; e < n; e++) {
            float want = ref_value(name_key(list.specs[i].name), e);
            same &= dtype == ZT_ST_F32 ? bits_of(got[e]) == bits_of(want)
                                       : fabsf(got[e] - want) <= fabsf(want) * 0x1p-8f;
        }
        if (!same) fprintf(stderr, "%s: %s differs\n", dir, list.specs[i].name);
        ZT_CHECK(same);
        free(got);
    }
    zt_hf_tensor_list_free(&list);
    zt_hf_model_close(m);
}

int main(void)
{
    char *root = make_scratch_dir("ckpt-hf");
    zt_hf_config c;
    zt_hf_config_defaults(&c);
    c.hidden_size = 8;
    c.intermediate_size = 12;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 4;
    c.vocab_size = 11;
    char *step_dir = save_llama(root, &c);
    zt_error err = {0};
    zt_ckpt *ckpt = NULL;
    ZT_CHECK_INT(zt_ckpt_open(step_dir, &ckpt, &err), ZT_OK);
    if (ckpt) {
        char *f32 = path_in(root, "hf-f32"), *bf16 = path_in(root, "hf-bf16");
        ZT_CHECK_INT(zt_hf_export_checkpoint(f32, &c, ckpt, ZT_ST_F32, 0, &err), ZT_OK);
        check_export(f32, &c, ZT_ST_F32);
        ZT_CHECK_INT(zt_hf_export_checkpoint(bf16, &c, ckpt, ZT_ST_BF16, 500, &err), ZT_OK);
        char *index = path_in(bf16, "model.safetensors.index.json");
        ZT_CHECK(file_exists(index));
        free(index);
        check_export(bf16, &c, ZT_ST_BF16);

        zt_hf_config wider = c;
        wider.intermediate_size = 16;
        char *bad = path_in(root, "hf-bad");
        ZT_CHECK_INT(zt_hf_export_checkpoint(bad, &wider, ckpt, ZT_ST_F32, 0, &err), ZT_ERR_CONFIG);
        ZT_CHECK_CONTAINS(err.msg, "the checkpoint has tensor 'model.layers.0.mlp.gate_proj.weight' "
                                   "of shape [12, 8], but the HF config implies [16, 8]");
        zt_hf_config deeper = c;
        deeper.num_hidden_layers = 3;
        ZT_CHECK_INT(zt_hf_export_checkpoint(bad, &deeper, ckpt, ZT_ST_F32, 0, &err), ZT_ERR_CONFIG);
        ZT_CHECK_CONTAINS(err.msg, "the checkpoint has no tensor 'model.layers.2.self_attn.q_proj.weight'");
        ZT_CHECK(!file_exists(bad));
        /* Declared tied, the export leaves lm_head.weight out, as transformers saves tied models. */
        zt_hf_config tied = c;
        tied.tie_word_embeddings = 1;
        ZT_CHECK_INT(zt_hf_export_checkpoint(bad, &tied, ckpt, ZT_ST_F32, 0, &err), ZT_OK);
        zt_st_set *s = NULL;
        ZT_CHECK_INT(zt_st_set_open(bad, &s, &err), ZT_OK);
        ZT_CHECK(s && zt_st_set_count(s) == 20 && !zt_st_set_find(s, "lm_head.weight", NULL));
        zt_st_set_close(s);
        free(bad);
        free(f32);
        free(bf16);
        zt_ckpt_close(ckpt);
    }
    free(step_dir);
    remove_tree(root);
    free(root);
    return zt_test_result();
}
