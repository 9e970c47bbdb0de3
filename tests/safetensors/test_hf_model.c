/* HF model directories: config.json mapping (values, defaults, refusals with their reasons, the
 * unknown-key warning), import of single and sharded weights with shape checks, nearest-name hints
 * and tied embeddings, and export that reads back to the same values. */
#include "test_util.h"

#include "state/hf_model.h"
#include "base/json.h"
#include "runtime/stderr_capture.h"

static char *g_dir;

static zt_status parse(const char *json, zt_hf_config *c, zt_error *err)
{
    return zt_hf_config_parse(json, strlen(json), "config.json", c, err);
}

#define TINY_FIELDS                                                                               \
    "\"model_type\": \"llama\", \"hidden_size\": 8, \"intermediate_size\": 12, "                  \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"vocab_size\": 11"

static void test_config_values(void)
{
    zt_hf_config c;
    zt_error err = {0};
    /* Only the required fields: everything else takes transformers' LlamaConfig default. */
    ZT_CHECK_INT(parse("{" TINY_FIELDS "}", &c, &err), ZT_OK);
    ZT_CHECK(c.hidden_size == 8 && c.intermediate_size == 12 && c.num_hidden_layers == 2);
    ZT_CHECK(c.num_attention_heads == 2 && c.num_key_value_heads == 2 && c.head_dim == 4);
    ZT_CHECK(c.vocab_size == 11 && c.max_position_embeddings == 2048);
    ZT_CHECK(c.rms_norm_eps == 1e-6 && c.rope_theta == 10000.0 && c.initializer_range == 0.02);
    ZT_CHECK(!c.tie_word_embeddings && !c.rope_llama3 && c.dtype == -1);
    ZT_CHECK(c.bos_token_id == 1 && c.n_eos == 1 && c.eos_token_ids[0] == 2 && c.pad_token_id == -1);

    /* A Llama 3.1 8B config.json as published (transformers 4.43). */
    const char *llama31 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
        "\"attention_dropout\": 0.0, \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, "
        "128009], \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02, "
        "\"intermediate_size\": 14336, \"max_position_embeddings\": 131072, \"mlp_bias\": false, "
        "\"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32, "
        "\"num_key_value_heads\": 8, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, "
        "\"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
        "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, "
        "\"rope_theta\": 500000.0, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
        "\"transformers_version\": \"4.43.0.dev0\", \"use_cache\": true, \"vocab_size\": 128256}";
    stderr_capture cap;
    capture_begin(&cap);
    ZT_CHECK_INT(parse(llama31, &c, &err), ZT_OK);
    const char *logged = capture_end(&cap);
    ZT_CHECK(strstr(logged, "ignoring") == NULL); /* every key is known */
    ZT_CHECK(c.hidden_size == 4096 && c.num_key_value_heads == 8 && c.head_dim == 128);
    ZT_CHECK(c.rope_llama3 && c.rope_factor == 8.0 && c.rope_low_freq_factor == 1.0);
    ZT_CHECK(c.rope_high_freq_factor == 4.0 && c.rope_original_max_position_embeddings == 8192);
    ZT_CHECK(c.rope_theta == 500000.0 && c.rms_norm_eps == 1e-5 && c.vocab_size == 128256);
    ZT_CHECK(c.n_eos == 3 && c.eos_token_ids[0] == 128001 && c.eos_token_ids[2] == 128009);
    ZT_CHECK(c.bos_token_id == 128000 && c.dtype == ZT_ST_BF16);

    /* transformers 5 spelling: rope_parameters and dtype; an explicit head_dim; null pad. */
    const char *v5 = "{" TINY_FIELDS ", \"num_key_value_heads\": 1, \"head_dim\": 16, "
                     "\"rope_parameters\": {\"rope_theta\": 50000.0, \"rope_type\": \"default\"}, "
                     "\"dtype\": \"float16\", \"pad_token_id\": null, \"tie_word_embeddings\": true}";
    ZT_CHECK_INT(parse(v5, &c, &err), ZT_OK);
    ZT_CHECK(c.head_dim == 16 && c.num_key_value_heads == 1 && c.rope_theta == 50000.0);
    ZT_CHECK(!c.rope_llama3 && c.dtype == ZT_ST_F16 && c.pad_token_id == -1 && c.tie_word_embeddings);

    /* Unknown keys are accepted with a warning that names them. */
    capture_begin(&cap);
    ZT_CHECK_INT(parse("{" TINY_FIELDS ", \"sliding_window\": 4096, \"_name_or_path\": \"x\"}", &c,
                       &err),
                 ZT_OK);
    logged = capture_end(&cap);
    ZT_CHECK_CONTAINS(logged, "config.json: ignoring 1 key(s) zt does not know: \"sliding_window\"");
}

static void test_config_refusals(void)
{
    static const char *cases[][2] = {
        {"{\"model_type\": \"mistral\", \"hidden_size\": 8}",
         "config.json:1:16: model_type must be \"llama\""},
        {"{\"hidden_size\": 8}", "\"model_type\" is missing"},
        {"{" TINY_FIELDS ", \"hidden_act\": \"gelu\"}", "hidden_act must be \"silu\""},
        {"{" TINY_FIELDS ", \"attention_bias\": true}", "attention_bias is true: zt's LLaMA has no bias"},
        {"{" TINY_FIELDS ", \"mlp_bias\": true}", "mlp_bias is true"},
        {"{" TINY_FIELDS ", \"attention_dropout\": 0.1}", "attention_dropout must be 0"},
        {"{" TINY_FIELDS ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}",
         "rope_scaling type \"linear\" is not supported by zt"},
        {"{" TINY_FIELDS ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}",
         "rope_parameters type \"yarn\" is not supported"},
        {"{" TINY_FIELDS ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}",
         "rope_scaling of type llama3 needs \"low_freq_factor\""},
        {"{" TINY_FIELDS ", \"quantization_config\": {\"quant_method\": \"gptq\"}}",
         "quantization_config is present"},
        {"{" TINY_FIELDS ", \"architectures\": [\"LlamaForSequenceClassification\"]}",
         "architectures does not include \"LlamaForCausalLM\""},
        {"{\"model_type\": \"llama\", \"intermediate_size\": 12, \"num_hidden_layers\": 2, "
         "\"num_attention_heads\": 2, \"vocab_size\": 11}",
         "\"hidden_size\" is missing"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 8.5, \"intermediate_size\": 12}",
         "config.json:1:40: \"hidden_size\" must be an integer >= 1, found 8.5"},
        {"{" TINY_FIELDS ", \"num_key_value_heads\": 3}",
         "num_attention_heads 2 is not a multiple of num_key_value_heads 3"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 9, \"intermediate_size\": 12, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"vocab_size\": 11}",
         "hidden_size 9 is not a multiple of num_attention_heads 2 and no head_dim is given"},
        {"{" TINY_FIELDS ", \"rms_norm_eps\": -1}", "\"rms_norm_eps\" must be a number > 0, found -1"},
        {"{" TINY_FIELDS ", \"tie_word_embeddings\": \"yes\"}",
         "\"tie_word_embeddings\" must be true or false, found yes"},
        {"{" TINY_FIELDS ", \"eos_token_id\": [1, -2]}", "\"eos_token_id\" must be a token id >= 0"},
        {"{" TINY_FIELDS ",}", "config.json:1:"},
        {"[1]", "config.json must be a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        zt_hf_config c;
        zt_error err = {0};
        ZT_CHECK(parse(cases[i][0], &c, &err) != ZT_OK);
        ZT_CHECK_CONTAINS(err.msg, cases[i][1]);
    }
}

/* A quoted number is said to be a string; special token ids must be rows of the vocabulary (11). */
static void test_config_strings_and_ids(void)
{
    static const char *cases[][2] = {
        {"{\"model_type\": \"llama\", \"hidden_size\": \"288\", \"intermediate_size\": 12}",
         "config.json:1:40: \"hidden_size\" must be an integer >= 1, found 288, a string (write it without the "
         "quotes)"},
        {"{" TINY_FIELDS ", \"rms_norm_eps\": \"1e-5\"}", "\"rms_norm_eps\" must be a number > 0, found 1e-5, a string"},
        {"{" TINY_FIELDS ", \"tie_word_embeddings\": \"true\"}",
         "found true, a string (write it without the quotes)"},
        {"{" TINY_FIELDS ", \"bos_token_id\": 1000000}",
         "\"bos_token_id\" is 1000000, but vocab_size is 11 (ids 0 to 10): the model has no such token; fix the "
         "id in config.json"},
        {"{" TINY_FIELDS ", \"pad_token_id\": 11}", "\"pad_token_id\" is 11, but vocab_size is 11"},
        {"{" TINY_FIELDS ", \"eos_token_id\": 11}", "\"eos_token_id\" is 11, but vocab_size is 11"},
        {"{" TINY_FIELDS ", \"eos_token_id\": [2, 12]}", "\"eos_token_id\" is 12, but vocab_size is 11"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        zt_hf_config c;
        zt_error err = {0};
        ZT_CHECK_INT(parse(cases[i][0], &c, &err), ZT_ERR_CONFIG);
        ZT_CHECK_CONTAINS(err.msg, cases[i][1]);
    }
    /* the last row of the vocabulary is fine */
    zt_hf_config c;
    zt_error err = {0};
    ZT_CHECK_INT(parse("{" TINY_FIELDS ", \"bos_token_id\": 10, \"eos_token_id\": [10, 0], \"pad_token_id\": 0}", &c,
                       &err),
                 ZT_OK);
    ZT_CHECK(c.bos_token_id == 10 && c.n_eos == 2 && c.eos_token_ids[0] == 10 && c.pad_token_id == 0);
    /* and what import refuses is never exported */
    c.eos_token_ids[1] = 1000000;
    char *path = path_in(g_dir, "ids-config.json");
    ZT_CHECK_INT(zt_hf_config_write(path, &c, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "eos_token_id 1000000 is not below vocab_size 11");
    ZT_CHECK(!file_exists(path));
    free(path);
}

/* ---- directories ----------------------------------------------------------------------------- */

/* A tiny LLaMA: hidden 8, intermediate 12, 2 layers, 2 heads sharing 1 kv head (head_dim 4),
 * vocab 11. */
static zt_hf_config tiny_config(int tied)
{
    zt_hf_config c;
    zt_hf_config_defaults(&c);
    c.hidden_size = 8;
    c.intermediate_size = 12;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 4;
    c.vocab_size = 11;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = tied;
    return c;
}

static int same_config(const zt_hf_config *a, const zt_hf_config *b)
{
    int same = a->n_eos == b->n_eos;
    for (int i = 0; same && i < a->n_eos; i++) same = a->eos_token_ids[i] == b->eos_token_ids[i];
    return same && a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size &&
           a->num_hidden_layers == b->num_hidden_layers &&
           a->num_attention_heads == b->num_attention_heads &&
           a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim &&
           a->vocab_size == b->vocab_size && a->max_position_embeddings == b->max_position_embeddings &&
           a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta &&
           a->initializer_range == b->initializer_range && a->rope_llama3 == b->rope_llama3 &&
           a->rope_factor == b->rope_factor && a->rope_low_freq_factor == b->rope_low_freq_factor &&
           a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_original_max_position_embeddings == b->rope_original_max_position_embeddings &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->bos_token_id == b->bos_token_id &&
           a->pad_token_id == b->pad_token_id && a->dtype == b->dtype;
}

/* The value every test expects at element i of tensor `name`: ref_value keyed by a name hash. */
static int name_key(const char *name)
{
    unsigned h = 5381;
    for (const char *p = name; *p; p++) h = h * 33 + (unsigned char)*p;
    return (int)(h % 1000);
}

typedef struct named_fill {
    const zt_st_tensor_spec *specs;
} named_fill;

static zt_status fill_by_name(void *ctx, size_t index, uint64_t elem_offset, uint64_t count,
                              float *dst, zt_error *err)
{
    (void)err;
    const char *name = ((named_fill *)ctx)->specs[index].name;
    for (uint64_t i = 0; i < count; i++) dst[i] = ref_value(name_key(name), (int64_t)(elem_offset + i));
    return ZT_OK;
}

static zt_status export_tiny(const char *dir, const zt_hf_config *c, int dtype, uint64_t max_shard,
                             zt_error *err)
{
    zt_hf_tensor_list list;
    zt_status st = zt_hf_llama_tensors(c, dtype, &list, err);
    if (st != ZT_OK) return st;
    named_fill ctx = {list.specs};
    st = zt_hf_export(dir, c, list.specs, list.n, fill_by_name, &ctx, max_shard, err);
    zt_hf_tensor_list_free(&list);
    return st;
}

/* Open dir and compare every tensor with the expected values (bf16: the rounded value). */
static void check_model_values(const char *dir, int dtype, int tied)
{
    zt_error err = {0};
    zt_hf_model *m = NULL;
    ZT_CHECK_INT(zt_hf_model_open(dir, &m, &err), ZT_OK);
    if (!m) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    const zt_hf_config *c = zt_hf_model_config(m);
    ZT_CHECK(c->hidden_size == 8 && c->num_key_value_heads == 1 && c->dtype == dtype);
    zt_hf_tensor_list list;
    zt_hf_config untied = *c;
    untied.tie_word_embeddings = 0; /* ask for lm_head.weight even when tied */
    ZT_CHECK_INT(zt_hf_llama_tensors(&untied, ZT_ST_F32, &list, &err), ZT_OK);
    ZT_CHECK_INT(list.n, 2 + 9 * 2 + 1);
    float buf[11 * 12];
    for (size_t i = 0; i < list.n; i++) {
        const zt_st_tensor_spec *s = &list.specs[i];
        uint64_t numel = (uint64_t)s->shape[0] * (uint64_t)(s->ndim == 2 ? s->shape[1] : 1);
        ZT_CHECK_INT(zt_hf_model_read(m, s->name, s->ndim, s->shape, 0, numel, buf, &err), ZT_OK);
        const char *source = tied && !strcmp(s->name, "lm_head.weight") ? "model.embed_tokens.weight"
                                                                         : s->name;
        int same = 1;
        for (uint64_t e = 0; e < numel; e++) {
            float exact = ref_value(name_key(source), (int64_t)e);
            if (dtype == ZT_ST_BF16) { /* within half a bf16 unit (2^-8 relative), low bits zero */
                same &= fabsf(buf[e] - exact) <= fabsf(exact) * 0x1p-8f && (bits_of(buf[e]) & 0xFFFFu) == 0;
            } else {
                same &= bits_of(buf[e]) == bits_of(exact);
            }
        }
        if (!same) fprintf(stderr, "values of %s differ\n", s->name);
        ZT_CHECK(same);
    }
    /* A sub-range, as a rank reads its shard. */
    const int64_t q_shape[2] = {8, 8};
    ZT_CHECK_INT(zt_hf_model_read(m, "model.layers.1.self_attn.q_proj.weight", 2, q_shape, 10, 5,
                                  buf, &err),
                 ZT_OK);
    if (dtype == ZT_ST_F32) {
        ZT_CHECK(buf[0] == ref_value(name_key("model.layers.1.self_attn.q_proj.weight"), 10));
    }
    zt_hf_tensor_list_free(&list);
    zt_hf_model_close(m);
}

static void test_export_import(void)
{
    zt_error err = {0};
    char *single = path_in(g_dir, "single");
    zt_hf_config c = tiny_config(0);
    c.rope_llama3 = 1; /* written and read back below */
    c.rope_factor = 8.0;
    c.rope_low_freq_factor = 1.0;
    c.rope_high_freq_factor = 4.0;
    c.rope_original_max_position_embeddings = 32;
    c.n_eos = 2;
    c.eos_token_ids[0] = 5;
    c.eos_token_ids[1] = 7;
    ZT_CHECK_INT(export_tiny(single, &c, ZT_ST_F32, 0, &err), ZT_OK);
    check_model_values(single, ZT_ST_F32, 0);

    /* The exported config.json, read back with the plain JSON reader. */
    char *config_path = path_in(single, "config.json");
    size_t n;
    char *text = (char *)read_bytes(config_path, &n);
    zt_json j;
    ZT_CHECK_INT(zt_json_parse(text, n, config_path, &j, &err), ZT_OK);
    ZT_CHECK(zt_json_eq(&j, zt_json_object_get(&j, 0, "model_type"), "llama"));
    ZT_CHECK(zt_json_eq(&j, zt_json_object_get(&j, 0, "torch_dtype"), "float32"));
    ZT_CHECK(zt_json_eq(&j, zt_json_object_get(&j, 0, "hidden_act"), "silu"));
    ZT_CHECK(zt_json_eq(&j, j.tok[zt_json_object_get(&j, 0, "architectures")].size == 1
                                ? zt_json_object_get(&j, 0, "architectures") + 1 : -1,
                        "LlamaForCausalLM"));
    ZT_CHECK(zt_json_get_number(&j, zt_json_object_get(&j, 0, "rms_norm_eps")) == 1e-5);
    ZT_CHECK(strstr(text, "\"rms_norm_eps\": 1e-05,") != NULL); /* shortest round-trip form */
    ZT_CHECK(strstr(text, "\"rope_theta\": 10000.0,") != NULL); /* a float, as transformers writes */
    ZT_CHECK(zt_json_is_null(&j, zt_json_object_get(&j, 0, "pad_token_id")));
    zt_json_free(&j);
    free(text);
    zt_hf_config back;
    ZT_CHECK_INT(zt_hf_config_load(config_path, &back, &err), ZT_OK);
    c.dtype = ZT_ST_F32;
    ZT_CHECK(same_config(&back, &c));
    free(config_path);

    /* bf16, sharded: 9 shards of at most 600 bytes (the embeddings alone are 176 bytes). */
    char *sharded = path_in(g_dir, "sharded");
    ZT_CHECK_INT(export_tiny(sharded, &c, ZT_ST_BF16, 600, &err), ZT_OK);
    char *index = path_in(sharded, "model.safetensors.index.json");
    ZT_CHECK(file_exists(index));
    free(index);
    check_model_values(sharded, ZT_ST_BF16, 0);

    /* Tied embeddings: no lm_head.weight in the files; reading it gives the embeddings. */
    char *tied = path_in(g_dir, "tied");
    zt_hf_config ct = tiny_config(1);
    ZT_CHECK_INT(export_tiny(tied, &ct, ZT_ST_F32, 0, &err), ZT_OK);
    zt_st_set *s;
    ZT_CHECK_INT(zt_st_set_open(tied, &s, &err), ZT_OK);
    ZT_CHECK(s && zt_st_set_find(s, "lm_head.weight", NULL) == NULL);
    ZT_CHECK(s && zt_st_set_count(s) == 20);
    zt_st_set_close(s);
    check_model_values(tied, ZT_ST_F32, 1);

    /* Exports that transformers could not load are refused before anything is written. */
    zt_hf_tensor_list list;
    ZT_CHECK_INT(zt_hf_llama_tensors(&c, ZT_ST_F32, &list, &err), ZT_OK);
    named_fill ctx = {list.specs};
    char *bad = path_in(g_dir, "bad_export");
    ZT_CHECK_INT(zt_hf_export(bad, &c, list.specs, list.n - 1, fill_by_name, &ctx, 0, &err),
                 ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "20 tensors given, a LLaMA with 2 layers has 21");
    list.specs[3].shape[0] = 5;
    ZT_CHECK_INT(zt_hf_export(bad, &c, list.specs, list.n, fill_by_name, &ctx, 0, &err),
                 ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "tensor 'model.layers.0.self_attn.v_proj.weight' has shape [5, 8], "
                               "the config implies [4, 8]");
    list.specs[3].shape[0] = 4;
    list.specs[4].dtype = ZT_ST_BF16;
    ZT_CHECK_INT(zt_hf_export(bad, &c, list.specs, list.n, fill_by_name, &ctx, 0, &err),
                 ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "is BF16 but 'model.embed_tokens.weight' is F32");
    ZT_CHECK(!file_exists(bad));
    zt_hf_tensor_list_free(&list);
    free(bad);
    free(single);
    free(sharded);
    free(tied);
}

/* Weights that do not match config.json, written with the plain safetensors writer. */
static void test_import_errors(void)
{
    zt_error err = {0};
    zt_hf_model *m = NULL;
    char *dir = path_in(g_dir, "mismatch");
    zt_hf_config c = tiny_config(0);
    ZT_CHECK_INT(export_tiny(dir, &c, ZT_ST_F32, 0, &err), ZT_OK);
    zt_hf_tensor_list list;
    ZT_CHECK_INT(zt_hf_llama_tensors(&c, ZT_ST_F32, &list, &err), ZT_OK);
    named_fill ctx = {list.specs};

    /* A misspelled tensor: missing, with the nearest names offered. */
    list.specs[5].name = "model.layers.0.mlp.gate_prj.weight";
    ZT_CHECK_INT(zt_st_write_model(dir, list.specs, list.n, fill_by_name, &ctx, 0, &err), ZT_OK);
    ZT_CHECK_INT(zt_hf_model_open(dir, &m, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "the weights have no tensor 'model.layers.0.mlp.gate_proj.weight'");
    ZT_CHECK_CONTAINS(err.msg, "nearest names there: 'model.layers.0.mlp.gate_prj.weight'");
    list.specs[5].name = "model.layers.0.mlp.gate_proj.weight";

    /* A shape that does not follow from config.json. */
    list.specs[0].shape[0] = 12;
    ZT_CHECK_INT(zt_st_write_model(dir, list.specs, list.n, fill_by_name, &ctx, 0, &err), ZT_OK);
    ZT_CHECK_INT(zt_hf_model_open(dir, &m, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "tensor 'model.embed_tokens.weight' has shape [12, 8], but");
    ZT_CHECK_CONTAINS(err.msg, "config.json implies [11, 8]: the weights and config.json do not belong together");
    list.specs[0].shape[0] = 11;

    /* lm_head missing while config.json says untied. */
    ZT_CHECK_INT(zt_st_write_model(dir, list.specs, list.n - 1, fill_by_name, &ctx, 0, &err), ZT_OK);
    ZT_CHECK_INT(zt_hf_model_open(dir, &m, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "no tensor 'lm_head.weight'");
    ZT_CHECK_CONTAINS(err.msg, "\"tie_word_embeddings\": true");

    /* A third layer config.json does not know. */
    zt_hf_config three = c;
    three.num_hidden_layers = 3;
    zt_hf_tensor_list more;
    ZT_CHECK_INT(zt_hf_llama_tensors(&three, ZT_ST_F32, &more, &err), ZT_OK);
    named_fill more_ctx = {more.specs};
    ZT_CHECK_INT(zt_st_write_model(dir, more.specs, more.n, fill_by_name, &more_ctx, 0, &err), ZT_OK);
    ZT_CHECK_INT(zt_hf_model_open(dir, &m, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "the weights have tensors a LLaMA with");
    ZT_CHECK_CONTAINS(err.msg, "'model.layers.2.input_layernorm.weight'");
    zt_hf_tensor_list_free(&more);

    /* Matching weights again. */
    ZT_CHECK_INT(zt_st_write_model(dir, list.specs, list.n, fill_by_name, &ctx, 0, &err), ZT_OK);
    ZT_CHECK_INT(zt_hf_model_open(dir, &m, &err), ZT_OK);
    /* Reading with the wrong expected shape, and a name that is not there. */
    const int64_t wrong[2] = {8, 9};
    float buf[128];
    ZT_CHECK_INT(zt_hf_model_read(m, "model.layers.0.self_attn.o_proj.weight", 2, wrong, 0, 72, buf,
                                  &err),
                 ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "tensor 'model.layers.0.self_attn.o_proj.weight' has shape [8, 8], "
                               "this run's model expects [8, 9]");
    ZT_CHECK_INT(zt_hf_model_read(m, "model.layers.0.self_attn.o_proj.weights", 2, wrong, 0, 72,
                                  buf, &err),
                 ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "no tensor 'model.layers.0.self_attn.o_proj.weights'");
    ZT_CHECK_CONTAINS(err.msg, "nearest names there: 'model.layers.0.self_attn.o_proj.weight'");
    zt_hf_model_close(m);
    m = NULL;

    /* No config.json at all. */
    char *config_path = path_in(dir, "config.json");
    remove(config_path);
    ZT_CHECK_INT(zt_hf_model_open(dir, &m, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "cannot open");
    ZT_CHECK_CONTAINS(err.msg, "config.json");
    free(config_path);
    zt_hf_tensor_list_free(&list);
    free(dir);
}

/* A weight that is NaN (F32) or overflows F16 to infinity: the read names tensor, element, row, column. */
static zt_status fill_poisoned(void *ctx, size_t index, uint64_t elem_offset, uint64_t count, float *dst,
                               zt_error *err)
{
    zt_status st = fill_by_name(ctx, index, elem_offset, count, dst, err);
    const char *name = ((named_fill *)ctx)->specs[index].name;
    for (uint64_t i = 0; i < count; i++)
        if (!strcmp(name, "model.layers.1.mlp.down_proj.weight") && elem_offset + i == 13)
            dst[i] = ((named_fill *)ctx)->specs[index].dtype == ZT_ST_F16 ? 1e6f : NAN;
    return st;
}

static void test_nonfinite_weights(void)
{
    const int dtypes[] = {ZT_ST_F32, ZT_ST_F16};
    const char *names[] = {"NaN", "+inf"};
    for (int k = 0; k < 2; k++) {
        zt_error err = {0};
        char sub[32];
        snprintf(sub, sizeof sub, "poisoned-%d", k);
        char *dir = path_in(g_dir, sub);
        zt_hf_config c = tiny_config(0);
        zt_hf_tensor_list list;
        ZT_CHECK_INT(zt_hf_llama_tensors(&c, dtypes[k], &list, &err), ZT_OK);
        named_fill ctx = {list.specs};
        ZT_CHECK_INT(zt_hf_export(dir, &c, list.specs, list.n, fill_poisoned, &ctx, 0, &err), ZT_OK);
        zt_hf_tensor_list_free(&list);
        zt_hf_model *m = NULL;
        ZT_CHECK_INT(zt_hf_model_open(dir, &m, &err), ZT_OK); /* the headers are fine */
        if (!m) continue;
        const int64_t shape[2] = {8, 12}; /* down_proj: [hidden, intermediate] */
        float buf[96];
        ZT_CHECK_INT(zt_hf_model_read(m, "model.layers.1.mlp.down_proj.weight", 2, shape, 0, 13, buf, &err), ZT_OK);
        ZT_CHECK_INT(zt_hf_model_read(m, "model.layers.1.mlp.down_proj.weight", 2, shape, 10, 20, buf, &err),
                     ZT_ERR_FORMAT);
        char want[160];
        snprintf(want, sizeof want, "tensor 'model.layers.1.mlp.down_proj.weight' holds %s at element 13 (row 1, "
                 "column 1): the model's weights are not all finite numbers", names[k]);
        ZT_CHECK_CONTAINS(err.msg, want);
        ZT_CHECK_CONTAINS(err.msg, "use an intact copy");
        zt_hf_model_close(m);
        free(dir);
    }
}

int main(void)
{
    g_dir = make_scratch_dir("hf-model");
    test_nonfinite_weights();
    test_config_values();
    test_config_refusals();
    test_config_strings_and_ids();
    test_export_import();
    test_import_errors();
    remove_tree(g_dir);
    free(g_dir);
    return zt_test_result();
}
