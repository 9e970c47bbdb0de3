/* framework/config/config.c + host_options.c: every error message, defaults, precedence, value parsing, and
 * the resolved config. Expected values are written out by hand (from docs/config.md and the JSON
 * texts below), never taken from the code under test.
 *
 * Usage: test_config DS_CONFIG_JSON
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "base/json.h"
#include "ztest.h"

/* What an optimizer plugin would declare (the real one lives in plugins/). */
static const zt_option k_adamw_options[] = {
    {"optimizer.params.lr", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN | ZT_OPT_MIN_OPEN, "1e-3", 0, 0, NULL, "lr"},
    {"optimizer.params.betas", ZT_OPT_FLOATS, ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX, "[0.9, 0.999]", 0, 1,
     NULL, "betas"},
    {"optimizer.params.eps", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN | ZT_OPT_MIN_OPEN, "1e-8", 0, 0, NULL, "eps"},
    {"optimizer.params.weight_decay", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN, "0.01", 0, 0, NULL, "wd"},
};
#define N_ADAMW ((uint32_t)(sizeof k_adamw_options / sizeof k_adamw_options[0]))

static zt_config *new_config(int with_adamw)
{
    zt_config *cfg = zt_config_new();
    zt_error err = {0};
    uint32_t n;
    const zt_option *host = zt_host_options(&n);
    if (zt_config_add_schema(cfg, "host", host, n, &err) != ZT_OK) {
        fprintf(stderr, "host schema rejected:\n%s\n", err.msg);
        zt_test_failures++;
    }
    if (with_adamw && zt_config_add_schema(cfg, "adamw", k_adamw_options, N_ADAMW, &err) != ZT_OK) {
        fprintf(stderr, "adamw schema rejected:\n%s\n", err.msg);
        zt_test_failures++;
    }
    return cfg;
}

/* Load `json` as run.json, apply the NULL-terminated --set list, validate. */
static zt_status check_config(const char *json, const char *const *sets, zt_error *err)
{
    zt_config *cfg = new_config(1);
    zt_status st = json ? zt_config_load_string(cfg, json, "run.json", err) : ZT_OK;
    for (int k = 0; st == ZT_OK && sets && sets[k]; k++) st = zt_config_set(cfg, sets[k], err);
    if (st == ZT_OK) st = zt_config_validate(cfg, err);
    zt_config_free(cfg);
    return st;
}

static int count_lines(const char *s)
{
    int n = 1;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The config must fail validation with exactly `n_lines` problems, the first containing `expected`. */
static void expect_problem(const char *json, const char *const *sets, const char *expected, int n_lines)
{
    zt_error err = {0};
    ZT_CHECK_INT(check_config(json, sets, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, expected);
    ZT_CHECK_INT(count_lines(err.msg), n_lines);
}

static void test_defaults(void)
{
    zt_config *cfg = new_config(1);
    zt_error err = {0};
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    int64_t i = -1;
    double f = -1;
    int32_t b = -1;
    const char *s = NULL;
    /* the defaults of docs/config.md */
    ZT_CHECK_INT(zt_config_get_int(cfg, "train_micro_batch_size_per_gpu", &i), ZT_OK);
    ZT_CHECK_INT(i, 4);
    ZT_CHECK_INT(zt_config_get_int(cfg, "gradient_accumulation_steps", &i), ZT_OK);
    ZT_CHECK_INT(i, 1);
    ZT_CHECK_INT(zt_config_get_int(cfg, "steps", &i), ZT_OK);
    ZT_CHECK_INT(i, 1000);
    ZT_CHECK_INT(zt_config_get_int(cfg, "seed", &i), ZT_OK);
    ZT_CHECK_INT(i, 1234);
    ZT_CHECK_INT(zt_config_get_int(cfg, "zero_optimization.stage", &i), ZT_OK);
    ZT_CHECK_INT(i, 0);
    ZT_CHECK_INT(zt_config_get_int(cfg, "data.seq_len", &i), ZT_OK);
    ZT_CHECK_INT(i, 512);
    ZT_CHECK_INT(zt_config_get_int(cfg, "fp16.initial_scale_power", &i), ZT_OK);
    ZT_CHECK_INT(i, 16);
    ZT_CHECK_INT(zt_config_get_int(cfg, "checkpoint.keep", &i), ZT_OK);
    ZT_CHECK_INT(i, 3);
    ZT_CHECK_INT(zt_config_get_float(cfg, "gradient_clipping", &f), ZT_OK);
    ZT_CHECK_CLOSE(f, 1.0, 0, 0);
    ZT_CHECK_INT(zt_config_get_float(cfg, "scheduler.params.cos_min_ratio", &f), ZT_OK);
    ZT_CHECK_CLOSE(f, 0.1, 0, 0);
    ZT_CHECK_INT(zt_config_get_float(cfg, "optimizer.params.lr", &f), ZT_OK);
    ZT_CHECK_CLOSE(f, 1e-3, 0, 0);
    ZT_CHECK_INT(zt_config_get_bool(cfg, "bf16.enabled", &b), ZT_OK);
    ZT_CHECK_INT(b, 1);
    ZT_CHECK_INT(zt_config_get_bool(cfg, "fp16.enabled", &b), ZT_OK);
    ZT_CHECK_INT(b, 0);
    ZT_CHECK_INT(zt_config_get_bool(cfg, "data.shuffle", &b), ZT_OK);
    ZT_CHECK_INT(b, 1);
    ZT_CHECK_INT(zt_config_get_string(cfg, "optimizer.type", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "adamw") == 0);
    ZT_CHECK_INT(zt_config_get_string(cfg, "scheduler.type", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "WarmupCosineLR") == 0);
    ZT_CHECK_INT(zt_config_get_string(cfg, "data.mode", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "packed") == 0);
    ZT_CHECK_INT(zt_config_get_string(cfg, "output_dir", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "out") == 0);
    double betas[4];
    int32_t n = 0;
    ZT_CHECK_INT(zt_config_get_floats(cfg, "optimizer.params.betas", betas, 4, &n), ZT_OK);
    ZT_CHECK_INT(n, 2);
    ZT_CHECK_CLOSE(betas[0], 0.9, 0, 0);
    ZT_CHECK_CLOSE(betas[1], 0.999, 0, 0);
    /* NO_DEFAULT keys, undeclared keys, getter of the wrong type */
    ZT_CHECK_INT(zt_config_get_int(cfg, "train_batch_size", &i), ZT_ERR_NOT_FOUND);
    ZT_CHECK_INT(zt_config_get_int(cfg, "gpu_mem_limit", &i), ZT_ERR_NOT_FOUND);
    ZT_CHECK_INT(zt_config_get_string(cfg, "data.path", &s), ZT_ERR_NOT_FOUND);
    ZT_CHECK_INT(zt_config_get_float(cfg, "scheduler.params.warmup_max_lr", &f), ZT_ERR_NOT_FOUND);
    ZT_CHECK_INT(zt_config_get_int(cfg, "no.such.key", &i), ZT_ERR_NOT_FOUND);
    ZT_CHECK_INT(zt_config_get_float(cfg, "steps", &f), ZT_ERR_INVALID_ARG);
    ZT_CHECK_INT(zt_config_get_floats(cfg, "optimizer.params.betas", betas, 1, &n),
                 ZT_ERR_BUFFER_TOO_SMALL);
    ZT_CHECK_INT(n, 2);
    ZT_CHECK_INT(zt_config_is_set(cfg, "steps"), 0);
    zt_config_free(cfg);
}

static void test_values_and_precedence(void)
{
    const char *json = "{\n"
                       "  \"steps\": 50,\n"
                       "  \"seed\": 5e8,\n"
                       "  \"gradient_clipping\": 0.5,\n"
                       "  \"data\": {\"path\": \"shards/alpaca\", \"mode\": \"padded\", \"seq_len\": 1.0},\n"
                       "  \"optimizer\": {\"params\": {\"betas\": [0.8, 0.95]}},\n"
                       "  \"gpu_mem_limit\": \"1.5GiB\",\n"
                       "  \"train_batch_size\": null\n"
                       "}";
    zt_error err = {0};
    zt_config *cfg = new_config(1);
    /* --set before the file still wins over the file */
    ZT_CHECK_INT(zt_config_set(cfg, "steps=7", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_load_string(cfg, json, "run.json", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "gradient_clipping=2", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "gradient_clipping=3", &err), ZT_OK); /* the later --set wins */
    ZT_CHECK_INT(zt_config_set(cfg, "output_dir=2024", &err), ZT_OK);      /* text for a string key */
    ZT_CHECK_INT(zt_config_set(cfg, "checkpoint.dir=true", &err), ZT_OK);   /* overridden below */
    ZT_CHECK_INT(zt_config_set(cfg, "trainable_params=q_proj,v_proj", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "data.seq_len=4096", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "bf16.enabled=false", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "optimizer.params.lr=1e-4", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "checkpoint.dir=\"with \\\"quotes\\\"\"", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    if (err.msg[0]) fprintf(stderr, "%s\n", err.msg);

    int64_t i = 0;
    double f = 0;
    int32_t b = -1;
    const char *s = NULL;
    ZT_CHECK_INT(zt_config_get_int(cfg, "steps", &i), ZT_OK);
    ZT_CHECK_INT(i, 7);
    ZT_CHECK_INT(zt_config_get_int(cfg, "seed", &i), ZT_OK);
    ZT_CHECK_INT(i, 500000000);
    ZT_CHECK_INT(zt_config_get_float(cfg, "gradient_clipping", &f), ZT_OK);
    ZT_CHECK_CLOSE(f, 3.0, 0, 0);
    ZT_CHECK_INT(zt_config_get_int(cfg, "data.seq_len", &i), ZT_OK);
    ZT_CHECK_INT(i, 4096);
    ZT_CHECK_INT(zt_config_get_string(cfg, "data.path", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "shards/alpaca") == 0);
    ZT_CHECK_INT(zt_config_get_string(cfg, "data.mode", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "padded") == 0);
    ZT_CHECK_INT(zt_config_get_string(cfg, "output_dir", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "2024") == 0);
    ZT_CHECK_INT(zt_config_get_string(cfg, "trainable_params", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "q_proj,v_proj") == 0);
    ZT_CHECK_INT(zt_config_get_string(cfg, "checkpoint.dir", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "with \"quotes\"") == 0);
    ZT_CHECK_INT(zt_config_get_bool(cfg, "bf16.enabled", &b), ZT_OK);
    ZT_CHECK_INT(b, 0);
    ZT_CHECK_INT(zt_config_get_float(cfg, "optimizer.params.lr", &f), ZT_OK);
    ZT_CHECK_CLOSE(f, 1e-4, 0, 0);
    ZT_CHECK_INT(zt_config_get_int(cfg, "gpu_mem_limit", &i), ZT_OK);
    ZT_CHECK_INT(i, 1610612736); /* 1.5 * 2^30 */
    double betas[2];
    int32_t n = 0;
    ZT_CHECK_INT(zt_config_get_floats(cfg, "optimizer.params.betas", betas, 2, &n), ZT_OK);
    ZT_CHECK(n == 2 && betas[0] == 0.8 && betas[1] == 0.95);
    /* null for a key without default: given, but unset */
    ZT_CHECK_INT(zt_config_get_int(cfg, "train_batch_size", &i), ZT_ERR_NOT_FOUND);
    ZT_CHECK_INT(zt_config_is_set(cfg, "steps"), 1);
    ZT_CHECK_INT(zt_config_is_set(cfg, "seed"), 1);
    ZT_CHECK_INT(zt_config_is_set(cfg, "log.every"), 0);
    ZT_CHECK_INT(zt_config_is_set(cfg, "data"), 0); /* a section is not a value */
    const char *held = NULL;
    ZT_CHECK_INT(zt_config_get_string(cfg, "data.path", &held), ZT_OK);
    /* a string handed out stays valid when the key is given again */
    ZT_CHECK_INT(zt_config_set(cfg, "data.path=elsewhere", &err), ZT_OK);
    ZT_CHECK(held && strcmp(held, "shards/alpaca") == 0);
    zt_config_free(cfg);
}

static void check_bytes(const char *value, int64_t expected)
{
    zt_config *cfg = new_config(0);
    zt_error err = {0};
    char assignment[128];
    snprintf(assignment, sizeof assignment, "gpu_mem_limit=%s", value);
    ZT_CHECK_INT(zt_config_set(cfg, assignment, &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    int64_t got = -1;
    ZT_CHECK_INT(zt_config_get_int(cfg, "gpu_mem_limit", &got), ZT_OK);
    if (got != expected) {
        fprintf(stderr, "byte size \"%s\": got %lld, expected %lld\n", value, (long long)got,
                (long long)expected);
        zt_test_failures++;
    }
    zt_config_free(cfg);
}

static void test_byte_sizes(void)
{
    check_bytes("512M", 536870912LL);          /* 512 * 2^20 */
    check_bytes("24G", 25769803776LL);         /* 24 * 2^30 */
    check_bytes("1.5GiB", 1610612736LL);
    check_bytes("100MB", 100000000LL);
    check_bytes("1KB", 1000LL);
    check_bytes("2k", 2048LL);
    check_bytes("3 MiB", 3145728LL);
    check_bytes("2TB", 2000000000000LL);
    check_bytes("1T", 1099511627776LL);
    check_bytes("0.5K", 512LL);
    check_bytes("10B", 10LL);
    check_bytes("\"1024\"", 1024LL);            /* a JSON string of digits */
    check_bytes("5e8", 500000000LL);            /* a JSON number */
    check_bytes("0", 0LL);

    const char *bad[] = {"24 Gigs", "G", "1.2.3G", "-1G", "1e3G", "\"\"", "12Q"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char assignment[64];
        snprintf(assignment, sizeof assignment, "gpu_mem_limit=%s", bad[k]);
        const char *sets[] = {assignment, NULL};
        expect_problem(NULL, sets,
                       "config key 'gpu_mem_limit' must be a byte size (an integer, or a string such as "
                       "\"512M\", \"24GiB\", \"100MB\"), got string",
                       1);
    }
    const char *sets[] = {"gpu_mem_limit=24 Gigs", NULL};
    expect_problem(NULL, sets, "got string \"24 Gigs\" (--set gpu_mem_limit=24 Gigs); K/M/G/T and "
                               "KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000", 1);
    const char *negative[] = {"gpu_mem_limit=-5", NULL};
    expect_problem(NULL, negative, "config key 'gpu_mem_limit' is -5, but a byte size cannot be negative",
                   1);
    expect_problem("{\"gpu_mem_limit\": true}", NULL,
                   "config key 'gpu_mem_limit' must be a byte size (an integer, or a string such as "
                   "\"512M\", \"24GiB\", \"100MB\"), got boolean true (run.json:1:19)",
                   1);
}

static void test_file_errors(void)
{
    zt_error err = {0};
    zt_config *cfg = new_config(0);
    /* syntax errors come with file:line:col from the JSON reader */
    ZT_CHECK_INT(zt_config_load_string(cfg, "{\n  \"steps\": 10\n  \"seed\": 1\n}", "run.json", &err),
                 ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "run.json:3:3: expected ',' or '}' after the value of key \"steps\"");
    ZT_CHECK_INT(zt_config_load_file(cfg, "/nonexistent/run.json", &err), ZT_ERR_IO);
    ZT_CHECK_CONTAINS(err.msg, "cannot open config file '/nonexistent/run.json': No such file or "
                               "directory; check the path");
    ZT_CHECK_INT(zt_config_load_file(cfg, "/", &err), ZT_ERR_IO);
    ZT_CHECK_CONTAINS(err.msg, "config file '/' is a directory");
    ZT_CHECK_INT(zt_config_load_string(cfg, "[1, 2]", "run.json", &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "run.json:1:1: a config must be a JSON object ({\"key\": value, ...}), "
                               "found an array");
    ZT_CHECK_INT(zt_config_load_string(cfg, "{\"zero_optimization.stage\": 2,\n \"\": 1}", "run.json",
                                       &err),
                 ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "run.json:1:2: a config key cannot contain '.'; nest objects instead");
    ZT_CHECK_CONTAINS(err.msg, "\nrun.json:2:2: a config key cannot be empty");
    ZT_CHECK_INT(zt_config_load_string(cfg, "{\"st\\uD800eps\": 1}", "run.json", &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "run.json:1:5: lone UTF-16 high surrogate");
    /* failed loads left nothing behind */
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    ZT_CHECK_INT(zt_config_is_set(cfg, "steps"), 0);
    zt_config_free(cfg);
}

static void test_set_errors(void)
{
    zt_error err = {0};
    zt_config *cfg = new_config(0);
    ZT_CHECK_INT(zt_config_set(cfg, "steps", &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "--set 'steps': expected KEY=VALUE, e.g. --set zero_optimization.stage=2");
    ZT_CHECK_INT(zt_config_set(cfg, "=3", &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "--set '=3': expected KEY=VALUE");
    ZT_CHECK_INT(zt_config_set(cfg, "data..path=x", &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "--set 'data..path=x': the key 'data..path' has an empty part");
    ZT_CHECK_INT(zt_config_set(cfg, "zero_optimization={\"stage\": 2}", &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "--set zero_optimization={\"stage\": 2}: a JSON object cannot be given as "
                               "one value; give each key on its own");
    zt_config_free(cfg);
}

static void test_validation_errors(void)
{
    /* unknown keys, with the nearest declared key */
    expect_problem("{\n  \"zero_optimisation\": {\n    \"stage\": 2\n  }\n}", NULL,
                   "unknown config key 'zero_optimisation.stage' (run.json:3:5); did you mean "
                   "'zero_optimization.stage'?",
                   1);
    const char *set_typo[] = {"zero_optimisation.stage=2", NULL};
    expect_problem(NULL, set_typo,
                   "unknown config key 'zero_optimisation.stage' (--set zero_optimisation.stage=2); did "
                   "you mean 'zero_optimization.stage'?",
                   1);
    expect_problem("{\"stage\": 2}", NULL,
                   "unknown config key 'stage' (run.json:1:2); did you mean 'zero_optimization.stage'?", 1);
    expect_problem("{\"micro_batch_size\": 2}", NULL,
                   "did you mean 'train_micro_batch_size_per_gpu'?", 1);
    expect_problem("{\"optimizer\": {\"params\": {\"betas1\": 0.9}}}", NULL,
                   "did you mean 'optimizer.params.betas'?", 1);
    expect_problem("{\"qwertyuiop\": 1}", NULL,
                   "unknown config key 'qwertyuiop' (run.json:1:2); no zt option has a similar name: "
                   "see docs/config.md",
                   1);
    expect_problem("{\"empty_section\": {}}", NULL, "unknown config key 'empty_section' (run.json:1:2)", 1);
    expect_problem("{\"_comment\": \"x\"}", NULL, "unknown config key '_comment'", 1);

    /* DeepSpeed keys zt does not implement: a key, and a whole section reported once */
    expect_problem("{\"zero_optimization\": {\"stage\": 2,\n \"mics_shard_size\": 8}}", NULL,
                   "DeepSpeed key 'zero_optimization.mics_shard_size' is not supported by zt "
                   "(run.json:2:2): MiCS sharding is not implemented. zt reads "
                   "DeepSpeed configs but does not implement this option; remove the key "
                   "'zero_optimization.mics_shard_size' from the config",
                   1);
    expect_problem("{\"aio\": {\"block_size\": 1048576}}", NULL,
                   "remove the whole section 'aio' from the config", 1);
    /* sections and switches accepted only switched off: on, they are errors naming the key */
    expect_problem("{\"comet\": {\"enabled\": true, \"project\": \"p\"}}", NULL,
                   "DeepSpeed key 'comet.enabled' is true (run.json:1:12), which asks for logging to Comet: zt "
                   "does not implement it. Set 'comet.enabled' to false or remove the section 'comet'",
                   1);
    /* DeepSpeed's tensorboard block is the host's: its keys validate, a typo is told the right one */
    zt_error tb_err = {0};
    ZT_CHECK_INT(check_config("{\"tensorboard\": {\"enabled\": true, \"output_path\": \"tb\", \"job_name\": \"j\"}}",
                              NULL, &tb_err),
                 ZT_OK);
    expect_problem("{\"tensorboard\": {\"enabled\": 1}}", NULL, "config key 'tensorboard.enabled' must be", 1);
    expect_problem("{\"tensorboard\": {\"enabled\": true, \"job\": \"j\"}}", NULL,
                   "unknown config key 'tensorboard.job' (run.json:1:35); did you mean 'tensorboard.job_name'?", 1);
    const char *ds_set[] = {"wandb.enabled=true", NULL};
    expect_problem(NULL, ds_set, "DeepSpeed key 'wandb.enabled' is true (--set wandb.enabled=true)", 1);
    expect_problem("{\"flops_profiler\": {\"enabled\": \"yes\"}}", NULL,
                   "DeepSpeed key 'flops_profiler.enabled' must be true or false, got string \"yes\"", 1);
    expect_problem("{\"prescale_gradients\": true}", NULL,
                   "DeepSpeed key 'prescale_gradients' is true (run.json:1:2), which asks for gradient pre-scaling "
                   "before the all-reduce: zt does not implement it",
                   1);
    expect_problem("{\"checkpoint\": {\"every\": 100, \"load_universal\": true}}", NULL,
                   "DeepSpeed key 'checkpoint.load_universal' is not supported by zt", 1);

    /* wrong type, for each type */
    expect_problem("{\n  \"train_micro_batch_size_per_gpu\": 8,\n  \"steps\": 10,\n"
                   "  \"gradient_clipping\": \"abc\"\n}",
                   NULL, "config key 'gradient_clipping' must be a number, got string \"abc\" (run.json:4:24)",
                   1);
    expect_problem("{\"bf16\": {\"enabled\": \"yes\"}}", NULL,
                   "config key 'bf16.enabled' must be true or false, got string \"yes\" (run.json:1:22)", 1);
    expect_problem("{\"bf16\": {\"enabled\": 1}}", NULL,
                   "config key 'bf16.enabled' must be true or false, got number 1", 1);
    expect_problem("{\"steps\": 1.5}", NULL,
                   "config key 'steps' must be an integer, got number 1.5 (run.json:1:11)", 1);
    expect_problem("{\"steps\": \"100\"}", NULL,
                   "config key 'steps' must be an integer, got string \"100\" (run.json:1:11)", 1);
    expect_problem("{\"output_dir\": 5}", NULL,
                   "config key 'output_dir' must be a string, got number 5 (run.json:1:16)", 1);
    expect_problem("{\"data\": {\"mode\": \"pakced\"}}", NULL,
                   "config key 'data.mode' must be one of \"packed\", \"padded\"; got \"pakced\" "
                   "(run.json:1:19); did you mean \"packed\"?",
                   1);
    expect_problem("{\"scheduler\": {\"type\": 3}}", NULL,
                   "config key 'scheduler.type' must be one of \"constant\", \"WarmupLR\", "
                   "\"WarmupDecayLR\", \"WarmupCosineLR\", got number 3",
                   1);
    expect_problem("{\"optimizer\": {\"params\": {\"betas\": 0.9}}}", NULL,
                   "config key 'optimizer.params.betas' must be an array of numbers, got number 0.9", 1);
    expect_problem("{\"optimizer\": {\"params\": {\"betas\": [0.9,\n \"x\"]}}}", NULL,
                   "config key 'optimizer.params.betas' item 2 must be a number, got string \"x\" "
                   "(run.json:2:2)",
                   1);
    expect_problem("{\"steps\": null}", NULL,
                   "config key 'steps' must be an integer, got null (run.json:1:11); remove the key to "
                   "use the default (1000)",
                   1);
    const char *auto_set[] = {"train_micro_batch_size_per_gpu=auto", NULL};
    expect_problem(NULL, auto_set,
                   "got string \"auto\" (--set train_micro_batch_size_per_gpu=auto); \"auto\" in a config file "
                   "gives a key zt's own value (as the Hugging Face Trainer fills it with its own); here, write the "
                   "value itself",
                   1);
    /* "auto" for a key no schema declares is still an unknown key */
    expect_problem("{\"train_micro_batch_size\": \"auto\"}", NULL, "unknown config key 'train_micro_batch_size'", 1);
    expect_problem("{\"seed\": 1e30}", NULL,
                   "config key 'seed' is 1e30, outside the 64-bit integer range", 1);
    expect_problem("{\"seed\": 99999999999999999999}", NULL,
                   "config key 'seed' is 99999999999999999999, outside the 64-bit integer range", 1);
    expect_problem("{\"gradient_clipping\": 1e999}", NULL,
                   "config key 'gradient_clipping' is 1e999, too large for a double", 1);
    const char *set_type[] = {"steps=many", NULL};
    expect_problem(NULL, set_type,
                   "config key 'steps' must be an integer, got string \"many\" (--set steps=many)", 1);

    expect_problem("{\"data\": {\"path\": \"a\xC0\xAF\"}}", NULL,
                   "config key 'data.path' has a bad string value: invalid UTF-8: overlong encoding "
                   "(lead byte 0xC0/0xC1) (run.json:1:21)",
                   1);

    /* out of range: int, float, open minimum, array item */
    expect_problem("{\"data\": {\"seq_len\": 8}}", NULL,
                   "config key 'data.seq_len' is 8, out of range: must be in [16, 1048576] (run.json:1:22)",
                   1);
    expect_problem("{\"train_micro_batch_size_per_gpu\": 0}", NULL,
                   "config key 'train_micro_batch_size_per_gpu' is 0, out of range: must be >= 1", 1);
    expect_problem("{\"zero_optimization\": {\"stage\": 4}}", NULL,
                   "config key 'zero_optimization.stage' is 4, out of range: must be in [0, 3]", 1);
    expect_problem("{\"gradient_clipping\": -0.5}", NULL,
                   "config key 'gradient_clipping' is -0.5, out of range: must be >= 0", 1);
    expect_problem("{\"scheduler\": {\"params\": {\"cos_min_ratio\": 1.5}}}", NULL,
                   "config key 'scheduler.params.cos_min_ratio' is 1.5, out of range: must be in [0, 1]",
                   1);
    expect_problem("{\"fp16\": {\"min_loss_scale\": 0}}", NULL,
                   "config key 'fp16.min_loss_scale' is 0, out of range: must be > 0", 1);
    /* the host's integer keys are capped to catch typos: a value past the cap is an error naming the
     * key and the cap, never an allocation of its size later on */
    expect_problem("{\"gradient_accumulation_steps\": 4294967297}", NULL,
                   "config key 'gradient_accumulation_steps' is 4294967297, out of range: must be <= 65536 "
                   "(run.json:1:33); zt caps this key at 65536 to catch typos",
                   1);
    const char *caps[][2] = {
        {"train_micro_batch_size_per_gpu=65537", "'train_micro_batch_size_per_gpu' is 65537, out of range: must be <= 65536"},
        {"train_batch_size=1073741825", "'train_batch_size' is 1073741825, out of range: must be <= 1073741824"},
        {"steps=1000000000001", "'steps' is 1000000000001, out of range: must be <= 1000000000000"},
        {"epochs=1000001", "'epochs' is 1000001, out of range: must be <= 1000000"},
        {"scheduler.params.warmup_num_steps=1e13", "'scheduler.params.warmup_num_steps' is 1e13, out of range: must be <= 1000000000000"},
        {"scheduler.params.total_num_steps=1e13", "'scheduler.params.total_num_steps' is 1e13, out of range"},
        {"fp16.loss_scale_window=1e13", "'fp16.loss_scale_window' is 1e13, out of range"},
        {"fp16.hysteresis=1001", "'fp16.hysteresis' is 1001, out of range: must be <= 1000"},
        {"eval.every=1e13", "'eval.every' is 1e13, out of range"},
        {"eval.batches=1000001", "'eval.batches' is 1000001, out of range: must be <= 1000000"},
        {"checkpoint.every=1e13", "'checkpoint.every' is 1e13, out of range"},
        {"checkpoint.keep=1000001", "'checkpoint.keep' is 1000001, out of range: must be <= 1000000"},
        {"log.every=1e13", "'log.every' is 1e13, out of range"},
        {"threads=1025", "'threads' is 1025, out of range: must be <= 1024"},
        {"parallel_config.data_parallel=65537", "'parallel_config.data_parallel' is 65537, out of range: must be <= 65536"},
        {"parallel_config.model_parallel=65537", "'parallel_config.model_parallel' is 65537, out of range"},
        {"parallel_config.pipeline_stage=65537", "'parallel_config.pipeline_stage' is 65537, out of range"},
        {"parallel_config.micro_batch_num=65537", "'parallel_config.micro_batch_num' is 65537, out of range"},
    };
    for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
        const char *set[] = {caps[k][0], NULL};
        expect_problem(NULL, set, caps[k][1], 1);
    }
    /* at the cap itself: fine */
    const char *at_caps[] = {"gradient_accumulation_steps=65536", "steps=1000000000000", "threads=1024", NULL};
    zt_error cap_err = {0};
    ZT_CHECK_INT(check_config(NULL, at_caps, &cap_err), ZT_OK);
    zt_error err = {0};
    ZT_CHECK_INT(check_config("{\"fp16\": {\"min_loss_scale\": 1e-9}}", NULL, &err), ZT_OK);
    expect_problem("{\"optimizer\": {\"params\": {\"betas\": [1.5, 0.9]}}}", NULL,
                   "config key 'optimizer.params.betas' item 1 is 1.5, out of range: must be in [0, 1]", 1);

    /* object given where a value belongs, and a value where a section belongs */
    expect_problem("{\"zero_optimization\": 3}", NULL,
                   "config key 'zero_optimization' must be an object (a section holding keys such as "
                   "'zero_optimization.stage'), got number 3 (run.json:1:23)",
                   1);
    expect_problem("{\"zero_optimization\": {\"stage\": {\"value\": 2}}}", NULL,
                   "config key 'zero_optimization.stage' must be an integer, got an object (run.json:1:33)",
                   1);
    const char *set_below[] = {"zero_optimization.stage.x=1", NULL};
    expect_problem(NULL, set_below,
                   "unknown config key 'zero_optimization.stage.x' (--set zero_optimization.stage.x=1): "
                   "'zero_optimization.stage' is a single value (an integer), not a section",
                   1);
    const char *set_section[] = {"zero_optimization=2", NULL};
    expect_problem(NULL, set_section,
                   "config key 'zero_optimization' must be an object (a section holding keys such as "
                   "'zero_optimization.stage'), got number 2 (--set zero_optimization=2)",
                   1);

    /* the same key twice in one file */
    expect_problem("{\n  \"seed\": 1,\n  \"seed\": 2\n}", NULL,
                   "config key 'seed' is given twice in run.json (lines 2 and 3); keep one", 1);
}

static void test_several_problems(void)
{
    const char *json = "{\n"
                       "  \"steps\": 0,\n"
                       "  \"gradient_clippin\": 1.0,\n"
                       "  \"memory_breakdown\": true,\n"
                       "  \"data\": {\"mode\": \"streaming\"}\n"
                       "}";
    const char *sets[] = {"bf16.enabled=maybe", "eval.evry=5", NULL};
    zt_error err = {0};
    ZT_CHECK_INT(check_config(json, sets, &err), ZT_ERR_CONFIG);
    const char *expected =
        "config key 'steps' is 0, out of range: must be >= 1 (run.json:2:12)\n"
        "unknown config key 'gradient_clippin' (run.json:3:3); did you mean 'gradient_clipping'?\n"
        "DeepSpeed key 'memory_breakdown' is true (run.json:4:3), which asks for memory breakdowns (zt-run "
        "--dry-run estimates memory by pool): zt does not implement it. Set 'memory_breakdown' to false or remove "
        "it\n"
        "config key 'data.mode' must be one of \"packed\", \"padded\"; got \"streaming\" (run.json:5:20)\n"
        "config key 'bf16.enabled' must be true or false, got string \"maybe\" (--set "
        "bf16.enabled=maybe)\n"
        "unknown config key 'eval.evry' (--set eval.evry=5); did you mean 'eval.every'?";
    if (strcmp(err.msg, expected) != 0) {
        fprintf(stderr, "several problems: got\n%s\nexpected\n%s\n", err.msg, expected);
        zt_test_failures++;
    }
}

static void test_schema_errors(void)
{
    zt_error err = {0};
    zt_config *cfg = new_config(1);
    static const zt_option clash[] = {
        {"seed", ZT_OPT_INT, 0, "1", 0, 0, NULL, "clashes with the host"},
    };
    ZT_CHECK_INT(zt_config_add_schema(cfg, "myplugin", clash, 1, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "config key 'seed' is declared by both 'host' and 'myplugin'; a key has "
                               "exactly one owner");
    static const zt_option section_clash[] = {
        {"zero_optimization", ZT_OPT_INT, 0, "1", 0, 0, NULL, "a section of the host"},
        {"optimizer.params.lr.scale", ZT_OPT_FLOAT, 0, "1", 0, 0, NULL, "below an adamw key"},
    };
    ZT_CHECK_INT(zt_config_add_schema(cfg, "other", section_clash, 2, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "'host' declares 'zero_optimization.stage' and 'other' declares "
                               "'zero_optimization': a key cannot also be a section");
    ZT_CHECK_CONTAINS(err.msg, "'adamw' declares 'optimizer.params.lr' and 'other' declares "
                               "'optimizer.params.lr.scale'");
    static const char *const no_choices[] = {NULL};
    static const zt_option broken[] = {
        {"p.a", ZT_OPT_INT, 0, "abc", 0, 0, NULL, "bad default"},
        {"p.b", ZT_OPT_INT, ZT_OPT_HAS_MIN, "0", 1, 0, NULL, "default below min"},
        {"p.c", ZT_OPT_FLOAT, 0, NULL, 0, 0, NULL, "no default"},
        {"p.d", ZT_OPT_ENUM, 0, "x", 0, 0, no_choices, "no choices"},
        {"p..e", ZT_OPT_INT, 0, "1", 0, 0, NULL, "bad key"},
        {"p.a", ZT_OPT_INT, 0, "1", 0, 0, NULL, "twice"},
        {"_p", ZT_OPT_INT, 0, "1", 0, 0, NULL, "reserved"},
        {"p.f", ZT_OPT_STRING, ZT_OPT_NO_DEFAULT, "x", 0, 0, NULL, "both"},
    };
    ZT_CHECK_INT(zt_config_add_schema(cfg, "p", broken, 8, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "'p' declares 'p.a' with an invalid default \"abc\": it must be an "
                               "integer, got string \"abc\"");
    ZT_CHECK_CONTAINS(err.msg, "'p' declares 'p.b' with an invalid default \"0\": it is 0, out of range: "
                               "must be >= 1");
    ZT_CHECK_CONTAINS(err.msg, "'p' declares 'p.c' without a default; give default_value or set "
                               "ZT_OPT_NO_DEFAULT");
    ZT_CHECK_CONTAINS(err.msg, "'p' declares enum 'p.d' without choices");
    ZT_CHECK_CONTAINS(err.msg, "'p' declares an option with the invalid key \"p..e\"");
    ZT_CHECK_CONTAINS(err.msg, "'p' declares config key 'p.a' twice");
    ZT_CHECK_CONTAINS(err.msg, "'p' declares '_p': keys starting with '_' are reserved for zt");
    ZT_CHECK_CONTAINS(err.msg, "'p' declares 'p.f' with both ZT_OPT_NO_DEFAULT and a default");
    ZT_CHECK_INT(count_lines(err.msg), 8);
    /* rejected schemas added nothing */
    int64_t i;
    ZT_CHECK_INT(zt_config_get_int(cfg, "p.b", &i), ZT_ERR_NOT_FOUND);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    zt_config_free(cfg);
}

/* The host reads its own keys (they choose the plugins) before the plugins' schemas exist. */
static void test_host_keys_before_plugins(void)
{
    zt_error err = {0};
    zt_config *cfg = zt_config_new();
    ZT_CHECK_INT(zt_config_load_string(cfg,
                                       "{\"zero_optimization\": {\"stage\": 2}, \"optimizer\": {\"type\": "
                                       "\"lion\", \"params\": {\"lr\": 2e-4}}}",
                                       "run.json", &err),
                 ZT_OK);
    uint32_t n;
    const zt_option *host = zt_host_options(&n);
    ZT_CHECK_INT(zt_config_add_schema(cfg, "host", host, n, &err), ZT_OK);
    int64_t stage = -1;
    const char *type = NULL;
    ZT_CHECK_INT(zt_config_get_int(cfg, "zero_optimization.stage", &stage), ZT_OK);
    ZT_CHECK_INT(stage, 2);
    ZT_CHECK_INT(zt_config_get_string(cfg, "optimizer.type", &type), ZT_OK);
    ZT_CHECK(type && strcmp(type, "lion") == 0);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "unknown config key 'optimizer.params.lr'");
    ZT_CHECK_INT(zt_config_add_schema(cfg, "lion", k_adamw_options, N_ADAMW, &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    double lr = 0;
    ZT_CHECK_INT(zt_config_get_float(cfg, "optimizer.params.lr", &lr), ZT_OK);
    ZT_CHECK_CLOSE(lr, 2e-4, 0, 0);
    /* a bad value makes its getter fail until it is fixed */
    ZT_CHECK_INT(zt_config_set(cfg, "zero_optimization.stage=9", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_get_int(cfg, "zero_optimization.stage", &stage), ZT_ERR_CONFIG);
    zt_config_free(cfg);
}

static void test_deepspeed_config(const char *path)
{
    zt_error err = {0};
    zt_config *cfg = new_config(1);
    ZT_CHECK_INT(zt_config_load_file(cfg, path, &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    if (err.msg[0]) fprintf(stderr, "%s\n", err.msg);
    int64_t i = 0;
    double f = 0;
    int32_t b = -1;
    const char *s = NULL;
    ZT_CHECK_INT(zt_config_get_int(cfg, "train_batch_size", &i), ZT_OK);
    ZT_CHECK_INT(i, 32);
    ZT_CHECK_INT(zt_config_get_int(cfg, "train_micro_batch_size_per_gpu", &i), ZT_OK);
    ZT_CHECK_INT(i, 8);
    ZT_CHECK_INT(zt_config_get_int(cfg, "gradient_accumulation_steps", &i), ZT_OK);
    ZT_CHECK_INT(i, 4);
    ZT_CHECK_INT(zt_config_get_int(cfg, "zero_optimization.stage", &i), ZT_OK);
    ZT_CHECK_INT(i, 2);
    ZT_CHECK_INT(zt_config_get_int(cfg, "scheduler.params.total_num_steps", &i), ZT_OK);
    ZT_CHECK_INT(i, 2000);
    ZT_CHECK_INT(zt_config_get_float(cfg, "scheduler.params.warmup_max_lr", &f), ZT_OK);
    ZT_CHECK_CLOSE(f, 3e-5, 0, 0);
    ZT_CHECK_INT(zt_config_get_float(cfg, "optimizer.params.eps", &f), ZT_OK);
    ZT_CHECK_CLOSE(f, 1e-8, 0, 0);
    ZT_CHECK_INT(zt_config_get_string(cfg, "optimizer.type", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "AdamW") == 0);
    ZT_CHECK_INT(zt_config_get_string(cfg, "scheduler.type", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "WarmupDecayLR") == 0);
    ZT_CHECK_INT(zt_config_get_bool(cfg, "bf16.enabled", &b), ZT_OK);
    ZT_CHECK_INT(b, 1);
    zt_config_free(cfg);
}

/* Small schema whose resolved form is written out by hand below. */
static const zt_option k_layout_options[] = {
    {"b.y", ZT_OPT_INT, 0, "2", 0, 0, NULL, ""},
    {"c", ZT_OPT_FLOATS, 0, "[0.5, 1e-8]", 0, 0, NULL, ""},
    {"a", ZT_OPT_BOOL, 0, "true", 0, 0, NULL, ""},
    {"b_c", ZT_OPT_FLOAT, 0, "0.1", 0, 0, NULL, ""},
    {"b.x.z", ZT_OPT_STRING, 0, "q\"uote", 0, 0, NULL, ""},
    {"d", ZT_OPT_BYTES, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL, ""},
    {"e", ZT_OPT_BYTES, 0, "1K", 0, 0, NULL, ""},
};

static void test_resolved_layout(void)
{
    zt_error err = {0};
    zt_config *cfg = zt_config_new();
    ZT_CHECK_INT(zt_config_add_schema(cfg, "t", k_layout_options, 7, &err), ZT_OK);
    ZT_CHECK_INT(zt_config_load_string(cfg, "{\n\n  \"b\": {\"y\": 3}}", "r.json", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "a=false", &err), ZT_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    ZT_CHECK_INT(zt_config_write_resolved(cfg, m, NULL, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "call zt_config_validate first");
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    ZT_CHECK_INT(zt_config_write_resolved(cfg, m, "[{\"name\": \"t\"}", &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "the plugin list is not valid JSON: _plugins:1:15: expected ',' or ']'");
    ZT_CHECK_INT(zt_config_write_resolved(cfg, m, "[{\"name\": \"t\"}]", &err), ZT_OK);
    fclose(m);
    const char *expected = "{\n"
                           "  \"a\": false,\n"
                           "  \"b\": {\n"
                           "    \"x\": {\n"
                           "      \"z\": \"q\\\"uote\"\n"
                           "    },\n"
                           "    \"y\": 3\n"
                           "  },\n"
                           "  \"b_c\": 0.1,\n"
                           "  \"c\": [0.5, 1e-08],\n"
                           "  \"d\": null,\n"
                           "  \"e\": 1024,\n"
                           "  \"_sources\": {\n"
                           "    \"a\": \"--set\",\n"
                           "    \"b.x.z\": \"default\",\n"
                           "    \"b.y\": \"file:r.json:3\",\n"
                           "    \"b_c\": \"default\",\n"
                           "    \"c\": \"default\",\n"
                           "    \"d\": \"default\",\n"
                           "    \"e\": \"default\"\n"
                           "  },\n"
                           "  \"_plugins\": [{\"name\": \"t\"}]\n"
                           "}\n";
    if (!text || strcmp(text, expected) != 0) {
        fprintf(stderr, "resolved layout: got\n%s\nexpected\n%s\n", text ? text : "(null)", expected);
        zt_test_failures++;
    }
    free(text);
    zt_config_free(cfg);
}

/* Compare every declared value of two configs with the same schemas. */
static void check_same_values(const zt_config *a, const zt_config *b, const zt_option *opts, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        const char *key = opts[k].key;
        zt_status sa, sb;
        int same;
        switch (opts[k].type) {
        case ZT_OPT_BOOL: {
            int32_t x = 0, y = 0;
            sa = zt_config_get_bool(a, key, &x);
            sb = zt_config_get_bool(b, key, &y);
            same = x == y;
            break;
        }
        case ZT_OPT_INT:
        case ZT_OPT_BYTES: {
            int64_t x = 0, y = 0;
            sa = zt_config_get_int(a, key, &x);
            sb = zt_config_get_int(b, key, &y);
            same = x == y;
            break;
        }
        case ZT_OPT_FLOAT: {
            double x = 0, y = 0;
            sa = zt_config_get_float(a, key, &x);
            sb = zt_config_get_float(b, key, &y);
            same = x == y;
            break;
        }
        case ZT_OPT_FLOATS: {
            double x[8] = {0}, y[8] = {0};
            int32_t nx = 0, ny = 0;
            sa = zt_config_get_floats(a, key, x, 8, &nx);
            sb = zt_config_get_floats(b, key, y, 8, &ny);
            same = nx == ny && memcmp(x, y, sizeof x) == 0;
            break;
        }
        default: {
            const char *x = "", *y = "";
            sa = zt_config_get_string(a, key, &x);
            sb = zt_config_get_string(b, key, &y);
            same = strcmp(x, y) == 0;
            break;
        }
        }
        if (sa != sb || !same) {
            fprintf(stderr, "round trip changed '%s' (status %d vs %d)\n", key, sa, sb);
            zt_test_failures++;
        }
    }
}

static char *read_whole(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 20);
    if (buf) fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    return buf;
}

static void test_resolved_round_trip(const char *ds_path)
{
    zt_error err = {0};
    zt_config *cfg = new_config(1);
    ZT_CHECK_INT(zt_config_load_file(cfg, ds_path, &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "steps=20", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "data.path=/data/shards \"x\" \xC3\xA9", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_set(cfg, "gpu_mem_limit=20GiB", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);

    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    ZT_CHECK_INT(zt_config_write_resolved(cfg, m, "[{\"name\": \"adamw\", \"kind\": \"optimizer\"}]", &err),
                 ZT_OK);
    fclose(m);

    /* it is JSON, nested, with sources and plugins */
    zt_json j;
    ZT_CHECK_INT(zt_json_parse(text, len, "resolved", &j, &err), ZT_OK);
    if (j.n_tok > 0) {
        int zero = zt_json_object_get(&j, 0, "zero_optimization");
        ZT_CHECK_CLOSE(zt_json_get_number(&j, zt_json_object_get(&j, zero, "stage")), 2, 0, 0);
        int opt = zt_json_object_get(&j, 0, "optimizer");
        int params = zt_json_object_get(&j, opt, "params");
        int betas = zt_json_object_get(&j, params, "betas");
        ZT_CHECK_INT(j.tok[betas].type, ZT_JSON_ARRAY);
        ZT_CHECK_CLOSE(zt_json_get_number(&j, betas + 2), 0.999, 0, 0);
        ZT_CHECK_CLOSE(zt_json_get_number(&j, zt_json_object_get(&j, 0, "gpu_mem_limit")), 21474836480.0,
                       0, 0);
        ZT_CHECK(zt_json_is_null(&j, zt_json_object_get(&j, 0, "epochs")));
        int sources = zt_json_object_get(&j, 0, "_sources");
        char *source = NULL;
        ZT_CHECK_INT(zt_json_string(&j, zt_json_object_get(&j, sources, "zero_optimization.stage"), &source,
                                    NULL, &err),
                     ZT_OK);
        char expected_source[4200];
        snprintf(expected_source, sizeof expected_source, "file:%s:35", ds_path);
        ZT_CHECK(source && strcmp(source, expected_source) == 0);
        free(source);
        ZT_CHECK(zt_json_eq(&j, zt_json_object_get(&j, sources, "steps"), "--set"));
        ZT_CHECK(zt_json_eq(&j, zt_json_object_get(&j, sources, "seed"), "default"));
        int plugins = zt_json_object_get(&j, 0, "_plugins");
        ZT_CHECK_INT(j.tok[plugins].type, ZT_JSON_ARRAY);
        zt_json_free(&j);
    }

    /* fed back as a config, it gives the same values */
    zt_config *again = new_config(1);
    ZT_CHECK_INT(zt_config_load_string(again, text, "config.resolved.json", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(again, &err), ZT_OK);
    if (err.msg[0]) fprintf(stderr, "%s\n", err.msg);
    uint32_t n;
    const zt_option *host = zt_host_options(&n);
    check_same_values(cfg, again, host, n);
    check_same_values(cfg, again, k_adamw_options, N_ADAMW);
    zt_config_free(again);

    /* saved atomically: the file holds the same text and no temporary file is left */
    char dir[] = "/tmp/zt-config-test-XXXXXX";
    ZT_CHECK(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/config.resolved.json", dir);
    ZT_CHECK_INT(zt_config_save_resolved(cfg, path, "[{\"name\": \"adamw\", \"kind\": \"optimizer\"}]",
                                         &err),
                 ZT_OK);
    ZT_CHECK_INT(zt_config_save_resolved(cfg, path, "[{\"name\": \"adamw\", \"kind\": \"optimizer\"}]",
                                         &err),
                 ZT_OK); /* replacing an existing file */
    char *saved = read_whole(path);
    ZT_CHECK(saved && text && strcmp(saved, text) == 0);
    free(saved);
    int n_files = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) n_files += e->d_name[0] != '.';
    if (d) closedir(d);
    ZT_CHECK_INT(n_files, 1);
    unlink(path);
    rmdir(dir);
    ZT_CHECK_INT(zt_config_save_resolved(cfg, "/nonexistent-dir/config.resolved.json", NULL, &err),
                 ZT_ERR_IO);
    ZT_CHECK_CONTAINS(err.msg, "cannot create a temp file next to '/nonexistent-dir/config.resolved.json'");
    ZT_CHECK_CONTAINS(err.msg, "No such file or directory; check that the directory exists");

    free(text);
    zt_config_free(cfg);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DS_CONFIG_JSON\n", argv[0]);
        return 2;
    }
    test_defaults();
    test_values_and_precedence();
    test_byte_sizes();
    test_file_errors();
    test_set_errors();
    test_validation_errors();
    test_several_problems();
    test_schema_errors();
    test_host_keys_before_plugins();
    test_deepspeed_config(argv[1]);
    test_resolved_layout();
    test_resolved_round_trip(argv[1]);
    return zt_test_result();
}
