/* The real consumer of an export: transformers' LlamaForCausalLM.from_pretrained() loads what zt
 * exports (fp32 with llama3 rope scaling and several eos ids, bf16 in shards, tied embeddings, fp16
 * with a head_dim that is not hidden / heads) with no missing or unexpected weights and exactly the
 * values written. Skips (77) where torch and transformers are not installed (CI); runs on the GPU
 * machine, whose Python has them. */
#include "test_util.h"

#include <sys/wait.h>

#include "state/hf_model.h"

static int name_key(const char *name)
{
    unsigned h = 5381;
    for (const char *p = name; *p; p++) h = h * 33 + (unsigned char)*p;
    return (int)(h % 1000);
}

static zt_status fill_by_name(void *ctx, size_t index, uint64_t elem_offset, uint64_t count,
                              float *dst, zt_error *err)
{
    (void)err;
    const char *name = ((const zt_st_tensor_spec *)ctx)[index].name;
    for (uint64_t i = 0; i < count; i++) dst[i] = ref_value(name_key(name), (int64_t)(elem_offset + i));
    return ZT_OK;
}

static void export(const char *dir, const zt_hf_config *c, int dtype, uint64_t max_shard)
{
    zt_error err = {0};
    zt_hf_tensor_list list;
    ZT_CHECK_INT(zt_hf_llama_tensors(c, dtype, &list, &err), ZT_OK);
    ZT_CHECK_INT(zt_hf_export(dir, c, list.specs, list.n, fill_by_name, list.specs, max_shard, &err),
                 ZT_OK);
    zt_hf_tensor_list_free(&list);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_hf_transformers hf_transformers_check.py\n");
        return 2;
    }
    if (system("python3 -c 'import numpy, torch, transformers' >/dev/null 2>&1") != 0) {
        ZT_SKIP("torch and transformers are not installed (pip install torch transformers); "
                "the export is still checked against the format by safetensors.python");
    }
    zt_hf_config c;
    zt_hf_config_defaults(&c);
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 4;
    c.vocab_size = 50;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    char *root = make_scratch_dir("hf-transformers");
    char *llama3 = path_in(root, "f32_llama3"), *sharded = path_in(root, "bf16_sharded");
    char *tied = path_in(root, "f32_tied"), *f16 = path_in(root, "f16_head_dim");

    zt_hf_config a = c;
    a.rope_llama3 = 1;
    a.rope_factor = 8.0;
    a.rope_low_freq_factor = 1.0;
    a.rope_high_freq_factor = 4.0;
    a.rope_original_max_position_embeddings = 32;
    a.rope_theta = 500000.0;
    a.n_eos = 2;
    a.eos_token_ids[0] = 3;
    a.eos_token_ids[1] = 4;
    a.pad_token_id = 0;
    export(llama3, &a, ZT_ST_F32, 0);
    export(sharded, &c, ZT_ST_BF16, 1500);
    zt_hf_config t = c;
    t.tie_word_embeddings = 1;
    export(tied, &t, ZT_ST_F32, 0);
    zt_hf_config h = c;
    h.head_dim = 8;
    export(f16, &h, ZT_ST_F16, 0);

    char cmd[8192];
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s:f32' '%s:bf16' '%s:f32' '%s:f16'", argv[1], llama3,
             sharded, tied, f16);
    fflush(stdout);
    int status = system(cmd);
    ZT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    remove_tree(root);
    free(llama3);
    free(sharded);
    free(tied);
    free(f16);
    free(root);
    return zt_test_result();
}
