/* A real trained model end to end: Karpathy's TinyStories 260K (shared data, HF layout) decoded
 * greedily through the llama and naive plugins with the KV cache must give exactly the 256 tokens
 * llama2.c's run.c gives (weights/stories260K_greedy_ids.json).
 *
 * usage: test_llama_stories PLUGINS_D SHARED_DATA
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "model_harness.h"
#include "ztest.h"

static zt_error g_err;

_Noreturn static void die(const char *what)
{
    fprintf(stderr, "test setup failed: %s: %s\n", what, g_err.msg);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLUGINS_D SHARED_DATA\n", argv[0]);
        return 2;
    }
    char model_dir[4096], ids_path[4096], weights[4096];
    snprintf(model_dir, sizeof model_dir, "%s/weights/stories260K_hf", argv[2]);
    snprintf(ids_path, sizeof ids_path, "%s/weights/stories260K_greedy_ids.json", argv[2]);
    snprintf(weights, sizeof weights, "%s/weights/stories260K_hf/model.safetensors", argv[2]);
    if (access(weights, R_OK) != 0 || access(ids_path, R_OK) != 0)
        ZT_SKIP("the shared data (%s, %s) is not here", weights, ids_path);

    size_t len = 0;
    char *text = mh_read_file(ids_path, &len, &g_err);
    zt_json j;
    if (!text || zt_json_parse(text, len, ids_path, &j, &g_err) != ZT_OK) die(ids_path);
    int prompt_tok = zt_json_object_get(&j, 0, "prompt_ids"), ids_tok = zt_json_object_get(&j, 0, "generated_ids");
    if (prompt_tok < 0 || ids_tok < 0 || j.tok[prompt_tok].type != ZT_JSON_ARRAY || j.tok[prompt_tok].size != 1 ||
        j.tok[ids_tok].type != ZT_JSON_ARRAY) {
        zt_error_set(&g_err, ZT_ERR_FORMAT, "expected a one-token prompt_ids array and a generated_ids array");
        die(ids_path);
    }
    int32_t prompt = (int32_t)zt_json_get_number(&j, prompt_tok + 1), n_new = j.tok[ids_tok].size;
    int32_t *expected = malloc(sizeof(int32_t) * (size_t)n_new), *got = malloc(sizeof(int32_t) * (size_t)(n_new + 1));
    for (int32_t i = 0, tok = ids_tok + 1; i < n_new; i++, tok = zt_json_skip(&j, tok))
        expected[i] = (int32_t)zt_json_get_number(&j, tok);
    zt_json_free(&j);
    free(text);

    char *config = mh_config_from_hf(model_dir, &g_err);
    mh_env e;
    mh_params p;
    if (!config || mh_open(&e, argv[1], config, 2, &g_err) != ZT_OK) die("loading llama and naive");
    if (mh_params_alloc(&e, &p, &g_err) != ZT_OK || mh_params_load(&e, &p, weights, &g_err) != ZT_OK) die(weights);
    ZT_CHECK(e.info->params[e.info->n_params_decl - 1].flags & ZT_PARAM_TIED);
    if (mh_generate(&e, &p, &prompt, 1, n_new, 1, got, NULL, &g_err) != ZT_OK) die("generation");
    int first_difference = -1;
    for (int32_t i = 0; i < n_new && first_difference < 0; i++)
        if (got[1 + i] != expected[i]) first_difference = i;
    if (first_difference >= 0)
        fprintf(stderr, "generated token %d is %d, llama2.c gives %d\n", first_difference,
                (int)got[1 + first_difference], (int)expected[first_difference]);
    ZT_CHECK_INT(first_difference, -1);
    ZT_CHECK_INT(n_new, 256);

    mh_params_free(&p);
    mh_close(&e);
    free(config);
    free(expected);
    free(got);
    return zt_test_result();
}
