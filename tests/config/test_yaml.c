/* YAML configs (framework/config/yaml.c) and MindFormers' spellings (mindformers.c): the types of plain
 * scalars, anchors, aliases and merges, every refusal with its line:column, places in validation messages
 * and in the resolved config's _sources, and the MindFormers keys: renames, translations, conflicts, notes
 * and launch keys. Expected values are written out by hand from the YAML texts below and from
 * MindFormers' and PyYAML's documented behaviour (docs/config.md), never taken from the code under test;
 * yaml_vs_python.py compares the reader with PyYAML itself.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "ztest.h"

/* ---- schemas: the host's, and what the adamw and llama plugins would declare ---------------------- */

static const zt_option k_adamw_options[] = {
    {"optimizer.params.lr", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN | ZT_OPT_MIN_OPEN, "3e-4", 0, 0, NULL, "lr"},
    {"optimizer.params.betas", ZT_OPT_FLOATS, ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX, "[0.9, 0.999]", 0, 1, NULL, "betas"},
    {"optimizer.params.eps", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN, "1e-8", 0, 0, NULL, "eps"},
    {"optimizer.params.weight_decay", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN, "0.01", 0, 0, NULL, "wd"},
};

#define MODEL_INT(key) {key, ZT_OPT_INT, ZT_OPT_HAS_MIN | ZT_OPT_NO_DEFAULT, NULL, 1, 0, NULL, key}
static const zt_option k_model_options[] = {
    MODEL_INT("model.hidden_size"),         MODEL_INT("model.intermediate_size"),
    MODEL_INT("model.num_hidden_layers"),   MODEL_INT("model.num_attention_heads"),
    MODEL_INT("model.num_key_value_heads"), MODEL_INT("model.vocab_size"),
    MODEL_INT("model.max_position_embeddings"),
    {"model.rms_norm_eps", ZT_OPT_FLOAT, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL, "eps"},
};

static const zt_option k_type_options[] = {
    {"t.b1", ZT_OPT_BOOL, 0, "false", 0, 0, NULL, ""},     {"t.b2", ZT_OPT_BOOL, 0, "true", 0, 0, NULL, ""},
    {"t.b3", ZT_OPT_BOOL, 0, "false", 0, 0, NULL, ""},     {"t.hex", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},
    {"t.bin", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},         {"t.o12", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},
    {"t.under", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},       {"t.sexa", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},
    {"t.neg", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},         {"t.e", ZT_OPT_FLOAT, 0, "0", 0, 0, NULL, ""},
    {"t.dot_e", ZT_OPT_FLOAT, 0, "0", 0, 0, NULL, ""},     {"t.half", ZT_OPT_FLOAT, 0, "0", 0, 0, NULL, ""},
    {"t.e_unsigned", ZT_OPT_FLOAT, 0, "0", 0, 0, NULL, ""},
    {"t.text", ZT_OPT_STRING, 0, "", 0, 0, NULL, ""},      {"t.quoted", ZT_OPT_STRING, 0, "", 0, 0, NULL, ""},
    {"t.single", ZT_OPT_STRING, 0, "", 0, 0, NULL, ""},    {"t.block", ZT_OPT_STRING, 0, "", 0, 0, NULL, ""},
    {"t.none", ZT_OPT_STRING, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL, ""},
    {"t.list", ZT_OPT_FLOATS, 0, "[]", 0, 0, NULL, ""},
};

#define N(table) ((uint32_t)(sizeof table / sizeof table[0]))

static zt_config *new_config(void)
{
    zt_config *cfg = zt_config_new();
    zt_error err = {0};
    uint32_t n;
    const zt_option *host = zt_host_options(&n);
    if (zt_config_add_schema(cfg, "host", host, n, &err) != ZT_OK ||
        zt_config_add_schema(cfg, "adamw", k_adamw_options, N(k_adamw_options), &err) != ZT_OK ||
        zt_config_add_schema(cfg, "llama", k_model_options, N(k_model_options), &err) != ZT_OK) {
        fprintf(stderr, "schema rejected:\n%s\n", err.msg);
        zt_test_failures++;
    }
    return cfg;
}

/* Load `yaml` as run.yaml into a new config with the schemas, and validate it. */
static zt_config *load(const char *yaml, zt_status *st, zt_error *err)
{
    zt_config *cfg = new_config();
    *st = zt_config_load_yaml_string(cfg, yaml, "run.yaml", err);
    if (*st == ZT_OK) *st = zt_config_validate(cfg, err);
    return cfg;
}

/* The load (or validation) must fail with a message holding every `needles` item. */
static void expect_error(int line, const char *yaml, const char *const *needles)
{
    zt_error err = {0};
    zt_status st;
    zt_config_free(load(yaml, &st, &err));
    if (st == ZT_OK) {
        fprintf(stderr, "%s:%d: accepted, expected an error:\n%s\n", __FILE__, line, yaml);
        zt_test_failures++;
        return;
    }
    for (int k = 0; needles[k]; k++) {
        if (strstr(err.msg, needles[k])) continue;
        fprintf(stderr, "%s:%d: expected \"%s\" in:\n%s\n", __FILE__, line, needles[k], err.msg);
        zt_test_failures++;
    }
}
#define EXPECT_ERROR(yaml, ...) expect_error(__LINE__, yaml, (const char *const[]){__VA_ARGS__, NULL})

static zt_config *expect_ok(int line, const char *yaml)
{
    zt_error err = {0};
    zt_status st;
    zt_config *cfg = load(yaml, &st, &err);
    if (st != ZT_OK) {
        fprintf(stderr, "%s:%d: refused:\n%s\n---\n%s\n", __FILE__, line, yaml, err.msg);
        zt_test_failures++;
    }
    return cfg;
}
#define EXPECT_OK(yaml) expect_ok(__LINE__, yaml)

static int64_t get_int(const zt_config *cfg, const char *key)
{
    int64_t v = -12345;
    if (zt_config_get_int(cfg, key, &v) != ZT_OK) fprintf(stderr, "cannot read %s\n", key);
    return v;
}

static double get_float(const zt_config *cfg, const char *key)
{
    double v = -12345;
    if (zt_config_get_float(cfg, key, &v) != ZT_OK) fprintf(stderr, "cannot read %s\n", key);
    return v;
}

static const char *get_string(const zt_config *cfg, const char *key)
{
    const char *v = "(unreadable)";
    zt_config_get_string(cfg, key, &v);
    return v;
}

static int get_bool(const zt_config *cfg, const char *key)
{
    int32_t v = -1;
    zt_config_get_bool(cfg, key, &v);
    return v;
}

/* The resolved config as text. */
static char *resolved(const zt_config *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    zt_error err = {0};
    if (zt_config_write_resolved(cfg, f, NULL, &err) != ZT_OK) fprintf(stderr, "resolved: %s\n", err.msg);
    fclose(f);
    return text;
}

static void expect_in(int line, const char *text, const char *needle)
{
    if (text && strstr(text, needle)) return;
    fprintf(stderr, "%s:%d: expected \"%s\" in:\n%s\n", __FILE__, line, needle, text ? text : "(null)");
    zt_test_failures++;
}
#define EXPECT_IN(text, needle) expect_in(__LINE__, text, needle)

/* ---- scalars: YAML 1.1 as PyYAML types them -------------------------------------------------------- */

static void test_types(void)
{
    zt_config *cfg = new_config();
    zt_error err = {0};
    ZT_CHECK(zt_config_add_schema(cfg, "types", k_type_options, N(k_type_options), &err) == ZT_OK);
    const char *yaml = "t:\n"
                       "  b1: yes\n"
                       "  b2: Off\n"
                       "  b3: TRUE\n"
                       "  hex: 0x1F\n"
                       "  bin: 0b101\n"
                       "  o12: 0o17\n"
                       "  under: 1_000\n"
                       "  sexa: 1:30\n"
                       "  neg: -12\n"
                       "  e: 1e-4\n"
                       "  dot_e: 3.e-4\n"
                       "  half: .5\n"
                       "  e_unsigned: 1.0e5\n"
                       "  text: hello world\n"
                       "  quoted: \"123\"\n"
                       "  single: 'yes'\n"
                       "  block: |\n"
                       "    two\n"
                       "    lines\n"
                       "  none: ~\n"
                       "  list: [1, 2.5, -.5]\n";
    ZT_CHECK(zt_config_load_yaml_string(cfg, yaml, "run.yaml", &err) == ZT_OK);
    ZT_CHECK(zt_config_validate(cfg, &err) == ZT_OK);
    if (err.msg[0]) fprintf(stderr, "%s\n", err.msg);
    ZT_CHECK_INT(get_bool(cfg, "t.b1"), 1);
    ZT_CHECK_INT(get_bool(cfg, "t.b2"), 0);
    ZT_CHECK_INT(get_bool(cfg, "t.b3"), 1);
    ZT_CHECK_INT(get_int(cfg, "t.hex"), 31);
    ZT_CHECK_INT(get_int(cfg, "t.bin"), 5);
    ZT_CHECK_INT(get_int(cfg, "t.o12"), 15);
    ZT_CHECK_INT(get_int(cfg, "t.under"), 1000);
    ZT_CHECK_INT(get_int(cfg, "t.sexa"), 90);
    ZT_CHECK_INT(get_int(cfg, "t.neg"), -12);
    ZT_CHECK(get_float(cfg, "t.e") == 1e-4);
    ZT_CHECK(get_float(cfg, "t.dot_e") == 3e-4);
    ZT_CHECK(get_float(cfg, "t.half") == 0.5);
    ZT_CHECK(get_float(cfg, "t.e_unsigned") == 1e5);
    ZT_CHECK(!strcmp(get_string(cfg, "t.text"), "hello world"));
    ZT_CHECK(!strcmp(get_string(cfg, "t.quoted"), "123"));
    ZT_CHECK(!strcmp(get_string(cfg, "t.single"), "yes"));
    ZT_CHECK(!strcmp(get_string(cfg, "t.block"), "two\nlines\n"));
    const char *none;
    ZT_CHECK(zt_config_get_string(cfg, "t.none", &none) == ZT_ERR_NOT_FOUND); /* null: not set */
    double list[4];
    int32_t n = 0;
    ZT_CHECK(zt_config_get_floats(cfg, "t.list", list, 4, &n) == ZT_OK);
    ZT_CHECK_INT(n, 3);
    ZT_CHECK(list[0] == 1 && list[1] == 2.5 && list[2] == -0.5);
    zt_config_free(cfg);

    /* a number where a string key is: as in JSON, a type error (quote it) */
    EXPECT_ERROR("output_dir: 2024\n", "config key 'output_dir' must be a string, got number 2024 (run.yaml:1:13)");
    /* a bool spelling for an int key */
    EXPECT_ERROR("steps: on\n", "config key 'steps' must be an integer, got boolean true (run.yaml:1:8)");
}

/* ---- anchors, aliases, merges ---------------------------------------------------------------------- */

static void test_anchors_and_merges(void)
{
    static const zt_option opts[] = {
        {"base.x", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},  {"base.y", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},
        {"other.x", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""}, {"other.z", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},
        {"a.x", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},     {"a.y", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},
        {"b.x", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},     {"b.y", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},
        {"b.z", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},     {"c.x", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},
        {"c.y", ZT_OPT_INT, 0, "0", 0, 0, NULL, ""},
    };
    zt_config *cfg = new_config();
    zt_error err = {0};
    ZT_CHECK(zt_config_add_schema(cfg, "test", opts, N(opts), &err) == ZT_OK);
    const char *yaml = "base: &base\n"
                       "  x: 1\n"
                       "  y: 2\n"
                       "other: &other {x: 10, z: 30}\n"
                       "a:\n"
                       "  <<: *base\n"
                       "  y: 20\n"         /* a key of its own wins over a merged one */
                       "b:\n"
                       "  <<: [*other, *base]\n" /* the first mapping of the list wins */
                       "c: *base\n"
                       "steps: &n 7\n"
                       "log: {every: *n}\n";
    ZT_CHECK(zt_config_load_yaml_string(cfg, yaml, "run.yaml", &err) == ZT_OK);
    ZT_CHECK(zt_config_validate(cfg, &err) == ZT_OK);
    if (err.msg[0]) fprintf(stderr, "%s\n", err.msg);
    ZT_CHECK_INT(get_int(cfg, "a.x"), 1);
    ZT_CHECK_INT(get_int(cfg, "a.y"), 20);
    ZT_CHECK_INT(get_int(cfg, "b.x"), 10);
    ZT_CHECK_INT(get_int(cfg, "b.y"), 2);
    ZT_CHECK_INT(get_int(cfg, "b.z"), 30);
    ZT_CHECK_INT(get_int(cfg, "c.x"), 1);
    ZT_CHECK_INT(get_int(cfg, "c.y"), 2);
    ZT_CHECK_INT(get_int(cfg, "log.every"), 7);
    zt_config_free(cfg);
    /* a value through an alias is placed where the alias is */
    EXPECT_ERROR("zero: &z 0\nsteps: *z\n", "config key 'steps' is 0, out of range", "(run.yaml:2:8)");
}

/* ---- refusals, each with its line:column ------------------------------------------------------------- */

static void test_errors(void)
{
    EXPECT_ERROR("steps: 3\n\tlog: 1\n", "run.yaml:2:1: YAML syntax error", "a tab: YAML indents with spaces only");
    EXPECT_ERROR("steps: 3\nseed: 1\nsteps: 4\n",
                 "run.yaml:3:1: the key 'steps' is given twice in this mapping (lines 1 and 3); keep one");
    EXPECT_ERROR("log:\n  every: 1\n seed: 2\n", "run.yaml:3:2: YAML syntax error: did not find expected key",
                 "indentation of this line");
    EXPECT_ERROR("steps: 1\n  seed: 2\n", "run.yaml:2:7: YAML syntax error: mapping values are not allowed");
    EXPECT_ERROR("steps: 1\n---\nseed: 2\n", "run.yaml:2:1: a second YAML document starts here");
    EXPECT_ERROR("yes: 1\n", "run.yaml:1:1: the key yes is read as the boolean true", "quote it ('yes':)");
    EXPECT_ERROR("seed: 1\n1: x\n", "run.yaml:2:1: the key 1 is read as the number 1");
    EXPECT_ERROR("? [a, b]\n: 1\n", "run.yaml:1:3: a key must be text, found a list");
    EXPECT_ERROR("log: &x\n  every: *x\n", "run.yaml:2:10: the alias *x is inside the value anchored &x (line 1)");
    EXPECT_ERROR("steps: *nope\n", "run.yaml:1:8: the alias *nope names no anchor");
    EXPECT_ERROR("gradient_clipping: .inf\n", "run.yaml:1:20: .inf is not a finite number");
    EXPECT_ERROR("steps: 010\n", "run.yaml:1:8: 010 is 8 in YAML 1.1", "10 in YAML 1.2");
    EXPECT_ERROR("output_dir: 2024-01-01\n", "run.yaml:1:13: \"2024-01-01\" is a date", "quote it");
    EXPECT_ERROR("output_dir: \"a\\0b\"\n", "run.yaml:1:13: the text holds a NUL character");
    EXPECT_ERROR("output_dir: !!binary aGk=\n", "run.yaml:1:13: the tag !!binary is not one zt reads");
    EXPECT_ERROR("", "run.yaml holds no values");
    EXPECT_ERROR("# only a comment\n", "run.yaml holds no values");
    EXPECT_ERROR("- steps\n- 3\n", "run.yaml:1:1: a config must be a YAML mapping", "found a list");
    EXPECT_ERROR("zero_optimization.stage: 2\n", "run.yaml:1:1: a config key cannot contain '.'");
    EXPECT_ERROR("log:\n  <<: 5\n", "run.yaml:2:7: << merges mappings, but this is a number");
    EXPECT_ERROR("b: &b {every: 1}\nlog:\n  <<: *b\n  <<: *b\n", "run.yaml:4:3: a second << in this mapping");
    EXPECT_ERROR("output_dir: \xff\n", "run.yaml:1:13: the file is not valid UTF-8");
    EXPECT_ERROR("steps: [1, 2\n", "run.yaml:2:1: YAML syntax error: did not find expected ',' or ']'");
}

/* ---- places: validation messages and the resolved config ---------------------------------------------- */

static void test_places(void)
{
    EXPECT_ERROR("seed: 1\nsteps: 0\n", "config key 'steps' is 0, out of range: must be >= 1 (run.yaml:2:8)");
    EXPECT_ERROR("gradient_clippin: 1\n", "unknown config key 'gradient_clippin' (run.yaml:1:1); did you mean "
                 "'gradient_clipping'?");
    EXPECT_ERROR("zero_optimization:\n  stage: 7\n", "config key 'zero_optimization.stage' is 7, out of range",
                 "(run.yaml:2:10)");
    EXPECT_ERROR("memory_breakdown: true\n", "DeepSpeed key 'memory_breakdown' is true (run.yaml:1:1)");
    /* a column counts characters: "é" is one */
    EXPECT_ERROR("output_dir: é\nsteps: x\n", "(run.yaml:2:8)");
    zt_config *cfg = EXPECT_OK("seed: 7\nlog:\n  every: 5\n");
    char *text = resolved(cfg);
    EXPECT_IN(text, "\"seed\": \"file:run.yaml:1\"");
    EXPECT_IN(text, "\"log.every\": \"file:run.yaml:3\"");
    free(text);
    zt_config_free(cfg);
}

/* A YAML file by its name; JSON under another name, with a hint when it holds YAML. */
static void test_files(void)
{
    char dir[] = "/tmp/zt-test-yaml-XXXXXX";
    ZT_CHECK(mkdtemp(dir) != NULL);
    char path[256];
    const char *names[] = {"run.yaml", "run.YML", "run.json"};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        FILE *f = fopen(path, "w");
        fputs("steps: 3\n", f);
        fclose(f);
        zt_config *cfg = new_config();
        zt_error err = {0};
        zt_status st = zt_config_load_file(cfg, path, &err);
        ZT_CHECK_INT(zt_config_path_is_yaml(path), k < 2);
        if (k < 2) {
            ZT_CHECK(st == ZT_OK);
            ZT_CHECK_INT(get_int(cfg, "steps"), 3);
        } else {
            ZT_CHECK(st != ZT_OK);
            EXPECT_IN(err.msg, "give it the extension .yaml or .yml");
        }
        zt_config_free(cfg);
        unlink(path);
    }
    rmdir(dir);
}

/* ---- MindFormers' spellings ------------------------------------------------------------------------ */

static void test_mindformers_renames(void)
{
    zt_config *cfg = EXPECT_OK("runner_config:\n"
                               "  epochs: 3\n"
                               "  batch_size: 2\n"
                               "  gradient_accumulation_steps: 4\n"
                               "recompute_config:\n"
                               "  recompute: True\n"
                               "parallel_config:\n"
                               "  data_parallel: 2\n"
                               "  optimizer_shard: True\n"
                               "  auto_trans_ckpt: False\n"
                               "train_config:\n"
                               "  learning_rate: 1e-4\n"
                               "  trainable_params: \"layers.31,layers.30\"\n");
    ZT_CHECK_INT(get_int(cfg, "epochs"), 3);
    ZT_CHECK_INT(get_int(cfg, "train_micro_batch_size_per_gpu"), 2);
    ZT_CHECK_INT(get_int(cfg, "gradient_accumulation_steps"), 4);
    ZT_CHECK_INT(get_bool(cfg, "recompute"), 1);
    ZT_CHECK_INT(get_int(cfg, "parallel_config.data_parallel"), 2);
    ZT_CHECK_INT(get_int(cfg, "zero_optimization.stage"), 1); /* optimizer parallelism is ZeRO-1 */
    ZT_CHECK_INT(get_bool(cfg, "auto_trans_ckpt"), 0);
    ZT_CHECK(get_float(cfg, "optimizer.params.lr") == 1e-4);
    ZT_CHECK(!strcmp(get_string(cfg, "trainable_params"), "layers.31,layers.30"));
    char *text = resolved(cfg);
    EXPECT_IN(text, "\"train_micro_batch_size_per_gpu\": \"file:run.yaml:3 (MindFormers runner_config.batch_size)\"");
    EXPECT_IN(text, "\"zero_optimization.stage\": \"file:run.yaml:9 (MindFormers parallel_config.optimizer_shard: "
              "true)\"");
    EXPECT_IN(text, "\"parallel_config.data_parallel\": \"file:run.yaml:8\"");
    free(text);
    EXPECT_IN(zt_config_notes(cfg), "run.yaml:9:20: parallel_config.optimizer_shard: true is ZeRO stage 1");
    EXPECT_IN(zt_config_notes(cfg), "run.yaml:2:3: runner_config.epochs is zt's epochs: zt stops after that many "
              "epochs or `steps`");
    zt_config_free(cfg);
    cfg = EXPECT_OK("steps: 50\nrunner_config:\n  epochs: 3\n");
    ZT_CHECK(!strstr(zt_config_notes(cfg), "runner_config.epochs"));
    zt_config_free(cfg);

    /* a mapped value is checked as the zt key, placed at the MindFormers key */
    EXPECT_ERROR("runner_config:\n  batch_size: 0\n",
                 "config key 'train_micro_batch_size_per_gpu' is 0, out of range: must be >= 1 "
                 "(run.yaml:2:15 (MindFormers runner_config.batch_size))");
    /* the seed's list form of trainable_params, and MindFormers' pet_config freeze lists, reach the keys
     * joined with commas; an item that is not a pattern is named */
    {
        zt_config *lists = EXPECT_OK("train_config:\n  trainable_params: [layers.31, layers.30]\n"
                                     "model:\n  model_config:\n    pet_config:\n"
                                     "      freeze_include: ['*.mlp.*']\n      freeze_exclude: [layers.31.mlp.up_proj]\n");
        ZT_CHECK(!strcmp(get_string(lists, "trainable_params"), "layers.31,layers.30"));
        ZT_CHECK(!strcmp(get_string(lists, "pet_config.freeze_include"), "*.mlp.*"));
        ZT_CHECK(!strcmp(get_string(lists, "pet_config.freeze_exclude"), "layers.31.mlp.up_proj"));
        zt_config_free(lists);
    }
    EXPECT_ERROR("train_config:\n  trainable_params: [layers.31, 7]\n",
                 "item 2 must be a non-empty parameter-name pattern without commas");
    /* keys the table does not know stay, and are unknown keys */
    EXPECT_ERROR("runner_config:\n  batch_size: 2\n  stop_at: 9\n", "unknown config key 'runner_config.stop_at' "
                 "(run.yaml:3:3)");
}

static void test_mindformers_conflicts(void)
{
    EXPECT_ERROR("train_micro_batch_size_per_gpu: 4\nrunner_config:\n  batch_size: 8\n",
                 "config key 'train_micro_batch_size_per_gpu' is given twice with different values: 4 (run.yaml:1:1) "
                 "and 8 (run.yaml:3:3 (MindFormers runner_config.batch_size)); keep one");
    EXPECT_ERROR("runner_config:\n  batch_size: 2\ntrain_dataset:\n  batch_size: 4\n",
                 "config key 'train_micro_batch_size_per_gpu' is given twice with different values: 2 (run.yaml:2:3 "
                 "(MindFormers runner_config.batch_size)) and 4 (run.yaml:4:3 (MindFormers train_dataset.batch_size))");
    EXPECT_ERROR("zero_optimization:\n  stage: 2\nparallel_config:\n  optimizer_shard: true\n",
                 "config key 'zero_optimization.stage' is given twice with different values: 2 (run.yaml:2:3) and 1");
    /* the same value in both spellings: one key (4 and 4.0 are the same number) */
    zt_config *cfg = EXPECT_OK("train_micro_batch_size_per_gpu: 4\nrunner_config:\n  batch_size: 4.0\n"
                               "optimizer:\n  type: AdamWeightDecay\ntrain_config:\n  optimizer: AdamWeightDecay\n");
    ZT_CHECK_INT(get_int(cfg, "train_micro_batch_size_per_gpu"), 4);
    ZT_CHECK(!strcmp(get_string(cfg, "optimizer.type"), "adamw"));
    zt_config_free(cfg);
}

static void test_mindformers_optimizer(void)
{
    /* AdamWeightDecay: adamw, with MindSpore's defaults eps 1e-6 and weight_decay 0 where not given */
    zt_config *cfg = EXPECT_OK("optimizer:\n  type: AdamWeightDecay\n  beta1: 0.95\n  learning_rate: 2.e-5\n");
    ZT_CHECK(!strcmp(get_string(cfg, "optimizer.type"), "adamw"));
    double betas[2] = {0, 0};
    int32_t n = 0;
    ZT_CHECK(zt_config_get_floats(cfg, "optimizer.params.betas", betas, 2, &n) == ZT_OK);
    ZT_CHECK(n == 2 && betas[0] == 0.95 && betas[1] == 0.999);
    ZT_CHECK(get_float(cfg, "optimizer.params.eps") == 1e-6);
    ZT_CHECK(get_float(cfg, "optimizer.params.weight_decay") == 0);
    ZT_CHECK(get_float(cfg, "optimizer.params.lr") == 2e-5);
    EXPECT_IN(zt_config_notes(cfg), "run.yaml:2:9: optimizer.type AdamWeightDecay is zt's adamw");
    EXPECT_IN(zt_config_notes(cfg), "no bias correction");
    zt_config_free(cfg);
    /* MindFormers' AdamW: torch's AdamW (betas as a list), eps 1e-8 and weight_decay 0 by default */
    cfg = EXPECT_OK("optimizer:\n  type: AdamW\n  betas: [0.9, 0.95]\n  weight_decay: 0.1\n");
    ZT_CHECK(get_float(cfg, "optimizer.params.eps") == 1e-8);
    ZT_CHECK(get_float(cfg, "optimizer.params.weight_decay") == 0.1);
    ZT_CHECK(zt_config_get_floats(cfg, "optimizer.params.betas", betas, 2, &n) == ZT_OK && betas[1] == 0.95);
    ZT_CHECK(!strstr(zt_config_notes(cfg), "bias correction"));
    zt_config_free(cfg);
    /* zt's own spellings pass as they are */
    cfg = EXPECT_OK("optimizer:\n  type: adamw\n  params:\n    lr: 0.001\n");
    ZT_CHECK(get_float(cfg, "optimizer.params.weight_decay") == 0.01); /* zt's adamw default */
    zt_config_free(cfg);
}

static void test_mindformers_schedule(void)
{
    zt_config *cfg = EXPECT_OK("lr_schedule:\n"
                               "  type: CosineWithWarmUpLR\n"
                               "  learning_rate: 2.e-4\n"
                               "  lr_end: 2.e-5\n"
                               "  warmup_ratio: 0.1\n"
                               "  total_steps: 500\n");
    ZT_CHECK(!strcmp(get_string(cfg, "scheduler.type"), "WarmupCosineLR"));
    ZT_CHECK(get_float(cfg, "scheduler.params.warmup_max_lr") == 2e-4);
    ZT_CHECK_CLOSE(get_float(cfg, "scheduler.params.cos_min_ratio"), 0.1, 1e-15, 0);
    ZT_CHECK_INT(get_int(cfg, "scheduler.params.warmup_num_steps"), 50);
    ZT_CHECK_INT(get_int(cfg, "scheduler.params.total_num_steps"), 500);
    zt_config_free(cfg);
    /* CosineWithWarmUpLR decays to 0 by default; zt's cos_min_ratio default is 0.1 */
    cfg = EXPECT_OK("lr_schedule:\n  type: CosineWithWarmUpLR\n  learning_rate: 1.e-4\n  warmup_steps: 10\n");
    ZT_CHECK(get_float(cfg, "scheduler.params.cos_min_ratio") == 0);
    ZT_CHECK_INT(get_int(cfg, "scheduler.params.warmup_num_steps"), 10);
    zt_config_free(cfg);
    cfg = EXPECT_OK("lr_schedule:\n  type: LinearWithWarmUpLR\n  learning_rate: 1.e-4\n  total_steps: 100\n");
    ZT_CHECK(!strcmp(get_string(cfg, "scheduler.type"), "WarmupDecayLR"));
    zt_config_free(cfg);
    EXPECT_ERROR("lr_schedule:\n  type: CosineWithWarmUpLR\n  learning_rate: 1.e-4\n  warmup_ratio: 0.03\n"
                 "  total_steps: -1\n",
                 "run.yaml:4:17: lr_schedule.warmup_ratio 0.03 with no total_steps", "write lr_schedule.warmup_steps N");
    EXPECT_ERROR("lr_schedule:\n  type: PolynomialWithWarmUpLR\n", "run.yaml:2:9: lr_schedule.type "
                 "\"PolynomialWithWarmUpLR\" has no zt schedule");
    EXPECT_ERROR("lr_schedule:\n  type: CosineWithWarmUpLR\n  learning_rate: 1.e-4\n  num_cycles: 1.0\n",
                 "run.yaml:4:15: lr_schedule.num_cycles other than 0.5");
}

static void test_mindformers_model(void)
{
    /* LLaMA-7B: the feed-forward width MindFormers derives, 11008 (Llama-2-7B's intermediate_size) */
    zt_config *cfg = EXPECT_OK("model:\n"
                               "  model_config:\n"
                               "    type: LlamaConfig\n"
                               "    seq_length: 4096\n"
                               "    hidden_size: 4096\n"
                               "    num_layers: 32\n"
                               "    num_heads: 32\n"
                               "    vocab_size: 32000\n"
                               "    multiple_of: 256\n"
                               "    rms_norm_eps: 1.0e-5\n"
                               "    compute_dtype: \"float16\"\n"
                               "  arch:\n"
                               "    type: LlamaForCausalLM\n");
    ZT_CHECK_INT(get_int(cfg, "model.hidden_size"), 4096);
    ZT_CHECK_INT(get_int(cfg, "model.intermediate_size"), 11008);
    ZT_CHECK_INT(get_int(cfg, "model.num_hidden_layers"), 32);
    ZT_CHECK_INT(get_int(cfg, "model.num_attention_heads"), 32);
    ZT_CHECK_INT(get_int(cfg, "model.vocab_size"), 32000);
    ZT_CHECK_INT(get_int(cfg, "data.seq_len"), 4096);
    /* MindFormers' own default max_position_embedding (the seq_length) is not copied */
    ZT_CHECK(!zt_config_is_set(cfg, "model.max_position_embeddings"));
    ZT_CHECK(get_float(cfg, "model.rms_norm_eps") == 1e-5);
    ZT_CHECK_INT(get_bool(cfg, "fp16.enabled"), 1);
    ZT_CHECK_INT(get_bool(cfg, "bf16.enabled"), 0);
    zt_config_free(cfg);
    /* Llama-2-70B's: hidden 8192, ffn_dim_multiplier 1.3, multiple_of 4096 give 28672 */
    cfg = EXPECT_OK("model:\n  model_config:\n    hidden_size: 8192\n    ffn_dim_multiplier: 1.3\n"
                    "    multiple_of: 4096\n    n_kv_heads: 8\n");
    ZT_CHECK_INT(get_int(cfg, "model.intermediate_size"), 28672);
    ZT_CHECK_INT(get_int(cfg, "model.num_key_value_heads"), 8);
    zt_config_free(cfg);
    EXPECT_ERROR("model:\n  arch:\n    type: GPT2LMHeadModel\n", "run.yaml:3:11: MindFormers key 'model.arch.type' is "
                 "\"GPT2LMHeadModel\": zt's model plugin is llama");
    EXPECT_ERROR("model:\n  model_config:\n    compute_dtype: int8\n", "run.yaml:3:20: "
                 "model.model_config.compute_dtype \"int8\" has no zt counterpart");
}

static void test_mindformers_switches(void)
{
    /* use_seq_parallel is zt's own key under the same name (sequence parallelism, docs/parallel.md) */
    zt_config *sp = EXPECT_OK("parallel_config:\n  use_seq_parallel: True\n");
    ZT_CHECK_INT(get_bool(sp, "parallel_config.use_seq_parallel"), 1);
    zt_config_free(sp);
    EXPECT_ERROR("recompute_config:\n  recompute: [2, 2]\n", "run.yaml:2:14: recompute_config.recompute as a list");
    EXPECT_ERROR("recompute_config:\n  select_recompute: True\n", "selective recomputation is not implemented");
    EXPECT_ERROR("micro_batch_interleave_num: 2\n", "micro-batch interleaving is not implemented; set it to 1");
    EXPECT_ERROR("runner_wrapper:\n  scale_sense:\n    type: FixedLossScaleUpdateCell\n    loss_scale_value: 1024\n",
                 "a fixed loss scale is not implemented");
    /* off: accepted, and said so */
    zt_config *cfg = EXPECT_OK("profile: False\n"
                               "context:\n  device_target: \"Ascend\"\n  mode: 0\n"
                               "runner_wrapper:\n  scale_sense:\n    type: DynamicLossScaleUpdateCell\n"
                               "    loss_scale_value: 4294967296\n    scale_window: 500\n  use_clip_grad: False\n");
    ZT_CHECK_INT(get_int(cfg, "fp16.initial_scale_power"), 32);
    ZT_CHECK_INT(get_int(cfg, "fp16.loss_scale_window"), 500);
    ZT_CHECK(get_float(cfg, "gradient_clipping") == 0);
    const char *notes = zt_config_notes(cfg);
    EXPECT_IN(notes, "run.yaml:2:1: context (device_target, mode) (MindFormers) has no effect in zt: MindSpore's runtime "
              "context");
    EXPECT_IN(notes, "accepted, as their values ask for what zt does anyway (or switch off what it does not do): "
              "profile");
    zt_config_free(cfg);
    /* only_trainable_params is zt's checkpoint.only_trainable, under both of MindFormers' sections */
    cfg = EXPECT_OK("parallel_config:\n  only_trainable_params: True\n");
    ZT_CHECK_INT(get_bool(cfg, "checkpoint.only_trainable"), 1);
    zt_config_free(cfg);
    cfg = EXPECT_OK("parallel_context_config:\n  only_trainable_params: False\n");
    ZT_CHECK_INT(get_bool(cfg, "checkpoint.only_trainable"), 0);
    zt_config_free(cfg);
    EXPECT_ERROR("parallel_config:\n  only_trainable_params: True\nparallel_context_config:\n"
                 "  only_trainable_params: False\n",
                 "config key 'checkpoint.only_trainable' is given twice with different values");
}

static void test_mindformers_launch_keys(void)
{
    zt_config *cfg = EXPECT_OK("run_mode: 'finetune'\nload_checkpoint: /ckpt/llama\nuse_parallel: True\n"
                               "resume_training: False\n");
    const char *place = NULL;
    const char *v = zt_config_launch_key(cfg, "run_mode", &place);
    ZT_CHECK(v && !strcmp(v, "finetune") && !strcmp(place, "run.yaml:1:11"));
    v = zt_config_launch_key(cfg, "load_checkpoint", &place);
    ZT_CHECK(v && !strcmp(v, "/ckpt/llama") && !strcmp(place, "run.yaml:2:18"));
    v = zt_config_launch_key(cfg, "use_parallel", NULL);
    ZT_CHECK(v && !strcmp(v, "true"));
    v = zt_config_launch_key(cfg, "resume_training", NULL);
    ZT_CHECK(v && !strcmp(v, "false"));
    ZT_CHECK(zt_config_launch_key(cfg, "device_num", NULL) == NULL);
    zt_config_free(cfg);
    EXPECT_ERROR("use_parallel: maybe\n", "run.yaml:1:15: use_parallel must be true or false, got \"maybe\"");
    EXPECT_ERROR("resume_training: step_100.ckpt\n", "resume_training \"step_100.ckpt\" names a checkpoint file");
}

int main(void)
{
    test_types();
    test_anchors_and_merges();
    test_errors();
    test_places();
    test_files();
    test_mindformers_renames();
    test_mindformers_conflicts();
    test_mindformers_optimizer();
    test_mindformers_schedule();
    test_mindformers_model();
    test_mindformers_switches();
    test_mindformers_launch_keys();
    if (zt_test_failures) fprintf(stderr, "%d check(s) failed\n", zt_test_failures);
    return zt_test_failures ? 1 : 0;
}
