/* DeepSpeed's rules across keys (framework/config/deepspeed.c): the batch rule against DeepSpeed's own
 * derivation written out here (its engine's _set_batch_related_parameters and _batch_assertion), the
 * Hugging Face Trainer's "auto" (zt's own value; the derived ones from the batch rule and the hidden size),
 * and what the resolved config says about them. */
#include <string.h>

#include "config/config.h"
#include "config/deepspeed.h"
#include "ztest.h"

static zt_config *new_config(void)
{
    zt_config *cfg = zt_config_new();
    zt_error err = {0};
    uint32_t n;
    const zt_option *host = zt_host_options(&n);
    ZT_CHECK_INT(zt_config_add_schema(cfg, "host", host, n, &err), ZT_OK);
    static const zt_option zero[] = {
        {"zero_optimization.reduce_bucket_size", ZT_OPT_INT, ZT_OPT_HAS_MIN, "500000000", 1, 0, NULL, "r"},
        {"zero_optimization.stage3_prefetch_bucket_size", ZT_OPT_INT, ZT_OPT_HAS_MIN, "50000000", 0, 0, NULL, "p"},
    };
    ZT_CHECK_INT(zt_config_add_schema(cfg, "zero3", zero, 2, &err), ZT_OK);
    return cfg;
}

/* DeepSpeed's derivation: integer divisions, then the assertion. 0 when DeepSpeed refuses the triple.
 * Without train_batch_size and the micro-batch DeepSpeed refuses to start; zt takes its default
 * micro-batch (4) there, which this reference does too. */
static int deepspeed_batch(int64_t tb, int64_t mb, int64_t ga, int64_t dp, int64_t out[3])
{
    if (tb && mb && ga) {
    } else if (tb && mb) {
        ga = tb / mb / dp;
    } else if (tb && ga) {
        mb = tb / dp / ga;
    } else if (mb && ga) {
        tb = mb * ga * dp;
    } else if (tb) {
        ga = 1;
        mb = tb / dp;
    } else {
        if (!mb) mb = 4;
        if (!ga) ga = 1;
        tb = mb * ga * dp;
    }
    if (tb <= 0 || mb <= 0 || ga <= 0 || tb != mb * ga * dp) return 0;
    out[0] = tb, out[1] = mb, out[2] = ga;
    return 1;
}

static void test_batch_rule(void)
{
    int compared = 0;
    static const int64_t values[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 48};
    const int nv = (int)(sizeof values / sizeof values[0]);
    for (int64_t dp = 1; dp <= 4; dp++)
        for (int a = 0; a < nv; a++)
            for (int b = 0; b < 6; b++)
                for (int c = 0; c < 6; c++) {
                    int64_t tb = values[a], mb = values[b], ga = values[c], want[3];
                    char json[256];
                    /* a key not given is written "auto" in every other case: the same as absent */
                    int use_auto = (a + b + c) % 2;
                    snprintf(json, sizeof json, "{");
#define ADD(name, v)                                                                                       \
    if (v) snprintf(json + strlen(json), sizeof json - strlen(json), "%s\"%s\": %lld", json[1] ? ", " : "", \
                    name, (long long)v);                                                                   \
    else if (use_auto)                                                                                     \
        snprintf(json + strlen(json), sizeof json - strlen(json), "%s\"%s\": \"auto\"", json[1] ? ", " : "", name);
                    ADD("train_batch_size", tb);
                    ADD("train_micro_batch_size_per_gpu", mb);
                    ADD("gradient_accumulation_steps", ga);
                    snprintf(json + strlen(json), sizeof json - strlen(json), "}");
                    zt_config *cfg = new_config();
                    zt_error err = {0};
                    ZT_CHECK_INT(zt_config_load_string(cfg, json, "ds.json", &err), ZT_OK);
                    zt_status st = zt_ds_resolve_batch(cfg, dp, &err);
                    if (st == ZT_OK) st = zt_config_validate(cfg, &err);
                    int ok = deepspeed_batch(tb, mb, ga, dp, want);
                    if (ok != (st == ZT_OK)) {
                        fprintf(stderr, "%s over %lld ranks: zt %s, DeepSpeed %s\n%s\n", json, (long long)dp,
                                st == ZT_OK ? "accepts" : "refuses", ok ? "accepts" : "refuses", err.msg);
                        zt_test_failures++;
                    } else if (ok) {
                        int64_t got[3] = {0, 0, 0};
                        zt_config_get_int(cfg, "train_batch_size", &got[0]);
                        zt_config_get_int(cfg, "train_micro_batch_size_per_gpu", &got[1]);
                        zt_config_get_int(cfg, "gradient_accumulation_steps", &got[2]);
                        if (memcmp(got, want, sizeof got)) {
                            fprintf(stderr, "%s over %lld ranks: zt %lld/%lld/%lld, DeepSpeed %lld/%lld/%lld\n", json,
                                    (long long)dp, (long long)got[0], (long long)got[1], (long long)got[2],
                                    (long long)want[0], (long long)want[1], (long long)want[2]);
                            zt_test_failures++;
                        }
                    } else {
                        /* the message names the three values and the rank count */
                        ZT_CHECK_CONTAINS(err.msg, "train_batch_size");
                        ZT_CHECK_CONTAINS(err.msg, "train_micro_batch_size_per_gpu");
                        ZT_CHECK_CONTAINS(err.msg, "gradient_accumulation_steps");
                        ZT_CHECK_CONTAINS(err.msg, "data-parallel rank");
                    }
                    compared++;
                    zt_config_free(cfg);
                }
    fprintf(stderr, "batch rule vs DeepSpeed's: %d triples compared\n", compared);

    /* the message in full, with where each value came from */
    zt_config *cfg = new_config();
    zt_error err = {0};
    ZT_CHECK_INT(zt_config_load_string(cfg, "{\"train_batch_size\": 32,\n \"train_micro_batch_size_per_gpu\": 3,\n"
                                       " \"gradient_accumulation_steps\": 2}", "ds.json", &err), ZT_OK);
    ZT_CHECK_INT(zt_ds_resolve_batch(cfg, 4, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "the batch sizes do not agree: train_batch_size 32 (ds.json:1:22), "
                      "train_micro_batch_size_per_gpu 3 (ds.json:2:36) and gradient_accumulation_steps 2 "
                      "(ds.json:3:33) over 4 data-parallel ranks");
    ZT_CHECK_CONTAINS(err.msg, "(3 x 2 x 4 = 24)");
    zt_config_free(cfg);
}

static char *resolved(const zt_config *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    zt_error err;
    ZT_CHECK_INT(zt_config_write_resolved(cfg, f, NULL, &err), ZT_OK);
    fclose(f);
    return text;
}

static void test_auto(void)
{
    zt_config *cfg = new_config();
    zt_error err = {0};
    ZT_CHECK_INT(zt_config_load_string(cfg,
                                       "{\"gradient_clipping\": \"auto\", \"fp16\": {\"enabled\": \"auto\"},\n"
                                       " \"bf16\": {\"enabled\": \"auto\"}, \"steps_per_print\": 7,\n"
                                       " \"zero_optimization\": {\"reduce_bucket_size\": \"auto\",\n"
                                       "   \"stage3_prefetch_bucket_size\": \"auto\", "
                                       "\"stage3_param_persistence_threshold\": \"auto\",\n"
                                       "   \"sub_group_size\": 1e9},\n"
                                       " \"train_micro_batch_size_per_gpu\": \"auto\", \"wandb\": {\"enabled\": false}}",
                                       "ds.json", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "train_micro_batch_size_per_gpu=2", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    /* "auto" is zt's value: the default, or the --set */
    double clip = 0;
    int64_t i = 0;
    int32_t b = -1;
    ZT_CHECK_INT(zt_config_get_float(cfg, "gradient_clipping", &clip), ZT_OK);
    ZT_CHECK(clip == 1.0);
    ZT_CHECK_INT(zt_config_is_set(cfg, "gradient_clipping"), 0);
    ZT_CHECK_INT(zt_config_get_bool(cfg, "fp16.enabled", &b), ZT_OK);
    ZT_CHECK_INT(b, 0);
    ZT_CHECK_INT(zt_config_get_int(cfg, "train_micro_batch_size_per_gpu", &i), ZT_OK);
    ZT_CHECK_INT(i, 2);
    /* derived: the batch rule over 3 ranks, the hidden size 64 */
    ZT_CHECK_INT(zt_ds_resolve_batch(cfg, 3, &err), ZT_OK);
    ZT_CHECK_INT(zt_ds_resolve_model_autos(cfg, 64, "model 'llama'", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    ZT_CHECK_INT(zt_config_get_int(cfg, "train_batch_size", &i), ZT_OK);
    ZT_CHECK_INT(i, 6);
    ZT_CHECK_INT(zt_config_get_int(cfg, "zero_optimization.reduce_bucket_size", &i), ZT_OK);
    ZT_CHECK_INT(i, 4096);
    ZT_CHECK_INT(zt_config_get_int(cfg, "zero_optimization.stage3_prefetch_bucket_size", &i), ZT_OK);
    ZT_CHECK_INT(i, 3686); /* floor(0.9 x 4096) */
    ZT_CHECK_INT(zt_config_get_int(cfg, "zero_optimization.stage3_param_persistence_threshold", &i), ZT_OK);
    ZT_CHECK_INT(i, 640);
    /* a --set wins over a derived "auto" */
    ZT_CHECK_INT(zt_config_set(cfg, "zero_optimization.reduce_bucket_size=1000", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    ZT_CHECK_INT(zt_config_get_int(cfg, "zero_optimization.reduce_bucket_size", &i), ZT_OK);
    ZT_CHECK_INT(i, 1000);
    char *text = resolved(cfg);
    ZT_CHECK_CONTAINS(text, "\"gradient_clipping\": \"\\\"auto\\\" (file:ds.json:1): zt's default\"");
    ZT_CHECK_CONTAINS(text, "\"train_micro_batch_size_per_gpu\": \"--set (over the file's \\\"auto\\\")\"");
    ZT_CHECK_CONTAINS(text, "\"train_batch_size\": \"train_micro_batch_size_per_gpu x "
                            "gradient_accumulation_steps x data-parallel size = 2 x 1 x 3 (DeepSpeed's batch rule)\"");
    ZT_CHECK_CONTAINS(text, "\"zero_optimization.stage3_prefetch_bucket_size\": \"\\\"auto\\\" (ds.json:4:4): "
                            "floor(0.9 x hidden_size^2) with hidden_size 64 (model 'llama'), the Hugging Face "
                            "Trainer's rule\"");
    ZT_CHECK_CONTAINS(text, "\"_notes\": [");
    ZT_CHECK_CONTAINS(text, "ds.json:1:2: gradient_clipping \\\"auto\\\" is 1 (zt's default)");
    ZT_CHECK_CONTAINS(text, "ds.json:5:4: zero_optimization.sub_group_size (DeepSpeed) has no effect in zt: ");
    ZT_CHECK_CONTAINS(text, "ds.json:6:54: wandb.enabled is false");
    free(text);
    zt_config_free(cfg);

    /* a string key takes "auto" as its text; an enum with the choice "auto" as the choice */
    cfg = new_config();
    ZT_CHECK_INT(zt_config_load_string(cfg, "{\"device\": \"auto\", \"output_dir\": \"auto\"}", "ds.json", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    ZT_CHECK_INT(zt_config_is_set(cfg, "device"), 1);
    const char *s = NULL;
    ZT_CHECK_INT(zt_config_get_string(cfg, "output_dir", &s), ZT_OK);
    ZT_CHECK(s && !strcmp(s, "auto"));
    zt_config_free(cfg);
}

int main(void)
{
    test_batch_rule();
    test_auto();
    return zt_test_result();
}
