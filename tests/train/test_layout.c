/* The flat parameter layout: offsets and padding worked out by hand, trainable_params patterns,
 * decay flags, declaration checks, initialisation that does not depend on the layout, and a pipeline
 * stage's layout that stores its own units only. */
#include <math.h>
#include <string.h>

#include "train/layout.h"
#include "ztest.h"

/* A three-unit model shaped like a small tied LLaMA (sizes chosen so nothing is a multiple of 16).
 *   unit 0: embed [10, 4]                                 40 elements
 *   unit 1: q_proj [3, 4], input_layernorm [4], down_proj [5]   12 + 4 + 5 = 21
 *   unit 2: norm [4], lm_head [10, 4] tied to embed       4 (+ 0)
 */
static zt_param_decl k_params[] = {
    {"model.embed_tokens.weight", 2, 0, {10, 4}, 0, ZT_PARAM_EMBEDDING, ZT_INIT_NORMAL, 0.02f, NULL},
    {"model.layers.0.self_attn.q_proj.weight", 2, 1, {3, 4}, 0, 0, ZT_INIT_NORMAL, 0.5f, NULL},
    {"model.layers.0.input_layernorm.weight", 1, 1, {4}, -1, ZT_PARAM_NO_DECAY, ZT_INIT_ONES, 0, NULL},
    {"model.layers.0.mlp.down_proj.weight", 1, 1, {5}, 1, 0, ZT_INIT_ZEROS, 0, NULL},
    {"model.norm.weight", 1, 2, {4}, -1, ZT_PARAM_NO_DECAY, ZT_INIT_ONES, 0, NULL},
    {"lm_head.weight", 2, 2, {10, 4}, 0, ZT_PARAM_TIED, ZT_INIT_NORMAL, 0.02f, "model.embed_tokens.weight"},
};
enum { EMBED, Q, INORM, DOWN, NORM, LM, N_PARAMS };

static zt_model_info model(zt_param_decl *params)
{
    zt_model_info m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    m.n_units = 3;
    m.n_params_decl = N_PARAMS;
    m.params = params;
    m.n_parameters = 40 + 21 + 4;
    return m;
}

static zt_status build(const zt_model_info *m, int dp, const char *trainable, uint32_t no_decay,
                       zt_host_layout **out, zt_error *err)
{
    zt_layout_options o = {dp, trainable, no_decay, NULL, NULL, NULL, 0, 0, 0};
    return zt_layout_build(m, &o, out, err);
}

static void test_offsets_and_padding(void)
{
    zt_model_info m = model(k_params);
    zt_host_layout *l;
    zt_error err;
    ZT_CHECK_INT(build(&m, 1, NULL, ZT_PARAM_NO_DECAY, &l, &err), ZT_OK);
    const zt_layout *v = &l->layout;
    ZT_CHECK_INT(v->n_units, 3);
    ZT_CHECK_INT(v->units[0].numel, 40);
    ZT_CHECK_INT(v->units[0].padded_numel, 48); /* next multiple of 1 x 16 */
    ZT_CHECK_INT(v->units[1].numel, 21);
    ZT_CHECK_INT(v->units[1].padded_numel, 32);
    ZT_CHECK_INT(v->units[2].numel, 4);          /* the tied head takes no storage */
    ZT_CHECK_INT(v->units[2].padded_numel, 16);
    ZT_CHECK_INT(v->units[1].first_param, Q);
    ZT_CHECK_INT(v->units[1].n_params, 3);
    ZT_CHECK_INT(v->units[2].first_param, NORM);
    ZT_CHECK_INT(v->units[2].n_params, 2);
    ZT_CHECK_INT(v->param_offset[EMBED], 0);
    ZT_CHECK_INT(v->param_offset[Q], 0);
    ZT_CHECK_INT(v->param_offset[INORM], 12);
    ZT_CHECK_INT(v->param_offset[DOWN], 16);
    ZT_CHECK_INT(v->param_offset[NORM], 0);
    ZT_CHECK_INT(v->param_offset[LM], -1);
    ZT_CHECK_INT(l->owner[LM], EMBED);
    ZT_CHECK_INT(l->largest_unit_numel, 48);
    ZT_CHECK_INT(l->n_trainable, 65);
    ZT_CHECK(v->model == &m && v->compute_dtype == ZT_F32);
    zt_layout_free(l);

    /* 4 ranks: every unit pads to a multiple of 64, so each rank's slice is 16-aligned. */
    ZT_CHECK_INT(build(&m, 4, NULL, 0, &l, &err), ZT_OK);
    ZT_CHECK_INT(l->layout.units[0].padded_numel, 64);
    ZT_CHECK_INT(l->layout.units[1].padded_numel, 64);
    ZT_CHECK_INT(l->layout.units[2].padded_numel, 64);
    ZT_CHECK_INT(l->layout.param_offset[DOWN], 16); /* padding never moves parameters */
    zt_layout_free(l);
    ZT_CHECK_INT(build(&m, 3, NULL, 0, &l, &err), ZT_OK);
    ZT_CHECK_INT(l->layout.units[0].padded_numel, 48); /* 40 -> 48 = 3 x 16 */
    ZT_CHECK_INT(l->layout.units[1].padded_numel, 48);
    zt_layout_free(l);
}

static void test_decay(void)
{
    zt_model_info m = model(k_params);
    zt_host_layout *l;
    zt_error err;
    ZT_CHECK_INT(build(&m, 1, NULL, ZT_PARAM_NO_DECAY, &l, &err), ZT_OK);
    const uint8_t expect_norms[N_PARAMS] = {1, 1, 0, 1, 0, 1};
    for (int i = 0; i < N_PARAMS; i++) ZT_CHECK_INT(l->decay[i], expect_norms[i]);
    zt_layout_free(l);
    ZT_CHECK_INT(build(&m, 1, NULL, ZT_PARAM_NO_DECAY | ZT_PARAM_EMBEDDING, &l, &err), ZT_OK);
    const uint8_t expect_both[N_PARAMS] = {0, 1, 0, 1, 0, 0}; /* the tied head follows the embedding */
    for (int i = 0; i < N_PARAMS; i++) ZT_CHECK_INT(l->decay[i], expect_both[i]);
    zt_layout_free(l);
    ZT_CHECK_INT(build(&m, 1, NULL, 0, &l, &err), ZT_OK);
    for (int i = 0; i < N_PARAMS; i++) ZT_CHECK_INT(l->decay[i], 1);
    zt_layout_free(l);
}

/* Which parameters a trainable_params value selects. */
static void check_trainable(const char *patterns, const uint8_t *expected, int64_t n_trainable)
{
    zt_model_info m = model(k_params);
    zt_host_layout *l;
    zt_error err;
    zt_status st = build(&m, 1, patterns, 0, &l, &err);
    ZT_CHECK_INT(st, ZT_OK);
    if (st != ZT_OK) {
        fprintf(stderr, "  patterns \"%s\": %s\n", patterns, err.msg);
        return;
    }
    for (int i = 0; i < N_PARAMS; i++) {
        if (l->trainable[i] != expected[i]) fprintf(stderr, "  patterns \"%s\", param %d:\n", patterns, i);
        ZT_CHECK_INT(l->trainable[i], expected[i]);
    }
    ZT_CHECK_INT(l->n_trainable, n_trainable);
    zt_layout_free(l);
}

static void test_trainable(void)
{
    /*                                        embed q inorm down norm lm */
    check_trainable("q_proj", (const uint8_t[]){0, 1, 0, 0, 0, 0}, 12);
    /* whole components: "norm" is model.norm.weight, not input_layernorm */
    check_trainable("norm", (const uint8_t[]){0, 0, 0, 0, 1, 0}, 4);
    check_trainable("layers.0", (const uint8_t[]){0, 1, 1, 1, 0, 0}, 21);
    check_trainable("*.self_attn.*,model.norm.weight", (const uint8_t[]){0, 1, 0, 0, 1, 0}, 16);
    check_trainable(" *layernorm* , down_proj ", (const uint8_t[]){0, 0, 1, 1, 0, 0}, 9);
    /* naming the tied head trains its storage, the embedding */
    check_trainable("lm_head", (const uint8_t[]){1, 0, 0, 0, 0, 1}, 40);
    check_trainable("model.layers.?.mlp.*", (const uint8_t[]){0, 0, 0, 1, 0, 0}, 5);

    zt_model_info m = model(k_params);
    zt_host_layout *l = NULL;
    zt_error err;
    ZT_CHECK_INT(build(&m, 1, "q_proj,layers.1", 0, &l, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "the pattern \"layers.1\" matches no parameter");
    ZT_CHECK(l == NULL);
    ZT_CHECK_INT(build(&m, 1, "proj", 0, &l, &err), ZT_ERR_CONFIG); /* not a whole component */
    ZT_CHECK_CONTAINS(err.msg, "\"proj\" matches no parameter");
    ZT_CHECK_INT(build(&m, 1, "q_proj,,norm", 0, &l, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "empty pattern");
    ZT_CHECK_INT(build(&m, 1, "q_proj, ,norm", 0, &l, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "pattern 2 is empty");
    ZT_CHECK_INT(build(&m, 1, "", 0, &l, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "would freeze the whole model");
}

/* A broken declaration is the model plugin's bug, named precisely. */
static void check_bad_model(zt_param_decl *params, int64_t n_parameters, const char *needle)
{
    zt_model_info m = model(params);
    m.n_parameters = n_parameters;
    zt_host_layout *l = NULL;
    zt_error err;
    ZT_CHECK_INT(build(&m, 1, NULL, 0, &l, &err), ZT_ERR_INTERNAL);
    ZT_CHECK_CONTAINS(err.msg, needle);
    ZT_CHECK(l == NULL);
}

static void test_bad_models(void)
{
    zt_param_decl p[N_PARAMS];
    memcpy(p, k_params, sizeof p);
    check_bad_model(p, 64, "reports 64 parameters but its declarations add up to 65");
    memcpy(p, k_params, sizeof p);
    p[DOWN].name = "model.layers.0.self_attn.q_proj.weight";
    check_bad_model(p, 65, "declares the parameter 'model.layers.0.self_attn.q_proj.weight' twice");
    memcpy(p, k_params, sizeof p);
    p[Q].unit = 2;
    check_bad_model(p, 65, "parameters must be grouped by unit in unit order");
    memcpy(p, k_params, sizeof p);
    p[LM].tied_to = "model.embed.weight";
    check_bad_model(p, 65, "is tied to 'model.embed.weight', which it does not declare");
    memcpy(p, k_params, sizeof p);
    p[LM].shape[0] = 11;
    check_bad_model(p, 65, "tied to 'model.embed_tokens.weight' of a different shape");
    memcpy(p, k_params, sizeof p);
    p[LM].flags = 0;
    check_bad_model(p, 65, "has tied_to without ZT_PARAM_TIED");
    memcpy(p, k_params, sizeof p);
    p[Q].shape[1] = 0;
    check_bad_model(p, 65, "has size 0 in dimension 1");
}

/* Values of parameter i as the whole unit buffer of a layout holds them. */
static float *unit_values(const zt_host_layout *l, int32_t unit, uint64_t seed)
{
    int64_t n = l->layout.units[unit].padded_numel;
    float *buf = malloc((size_t)n * sizeof *buf);
    zt_layout_init_range(l, NULL, unit, seed, 0, n, buf);
    return buf;
}

static void test_init(void)
{
    zt_model_info m = model(k_params);
    zt_host_layout *one, *four;
    zt_error err;
    ZT_CHECK_INT(build(&m, 1, NULL, 0, &one, &err), ZT_OK);
    ZT_CHECK_INT(build(&m, 4, NULL, 0, &four, &err), ZT_OK);

    for (int32_t u = 0; u < 3; u++) {
        float *a = unit_values(one, u, 42), *b = unit_values(four, u, 42), *c = unit_values(one, u, 43);
        /* Same parameter values under 1 and 4 ranks (the layouts pad differently). */
        ZT_CHECK(memcmp(a, b, (size_t)one->layout.units[u].numel * sizeof *a) == 0);
        /* Padding is zero. */
        for (int64_t k = four->layout.units[u].numel; k < four->layout.units[u].padded_numel; k++)
            ZT_CHECK(b[k] == 0.0f);
        /* Filled rank by rank (4 slices) = filled at once. */
        int64_t slice = four->layout.units[u].padded_numel / 4;
        float *pieces = malloc((size_t)four->layout.units[u].padded_numel * sizeof *pieces);
        for (int r = 0; r < 4; r++) zt_layout_init_range(four, NULL, u, 42, r * slice, slice, pieces + r * slice);
        ZT_CHECK(memcmp(pieces, b, (size_t)four->layout.units[u].padded_numel * sizeof *b) == 0);
        /* Another seed, other normal values. */
        if (u == 0) ZT_CHECK(memcmp(a, c, 40 * sizeof *a) != 0);
        free(a);
        free(b);
        free(c);
        free(pieces);
    }

    float *u1 = unit_values(one, 1, 42);
    for (int k = 0; k < 4; k++) ZT_CHECK(u1[12 + k] == 1.0f); /* input_layernorm: ONES */
    for (int k = 0; k < 5; k++) ZT_CHECK(u1[16 + k] == 0.0f); /* down_proj: ZEROS */
    int distinct = 0;
    for (int k = 1; k < 12; k++) distinct += u1[k] != u1[0];
    ZT_CHECK_INT(distinct, 11);
    free(u1);
    zt_layout_free(one);
    zt_layout_free(four);
}

/* NORMAL init is N(0, std): check the sample mean and standard deviation of a large tensor. */
static void test_init_statistics(void)
{
    zt_param_decl big[] = {
        {"model.embed_tokens.weight", 2, 0, {256, 64}, 0, 0, ZT_INIT_NORMAL, 0.02f, NULL},
        {"lm_head.weight", 2, 1, {256, 64}, 0, 0, ZT_INIT_NORMAL, 0.5f, NULL},
    };
    zt_model_info m;
    memset(&m, 0, sizeof m);
    m.n_units = 2;
    m.n_params_decl = 2;
    m.params = big;
    m.n_parameters = 2 * 256 * 64;
    zt_host_layout *l;
    zt_error err;
    ZT_CHECK_INT(build(&m, 1, NULL, 0, &l, &err), ZT_OK);
    const double n = 256 * 64;
    for (int32_t u = 0; u < 2; u++) {
        float *v = unit_values(l, u, 1234);
        double sum = 0, sq = 0, beyond3 = 0, std = big[u].init_std;
        for (int64_t k = 0; k < 256 * 64; k++) {
            sum += v[k];
            sq += (double)v[k] * v[k];
            beyond3 += fabs(v[k]) > 3 * std;
        }
        double mean = sum / n, sd = sqrt(sq / n - mean * mean);
        /* 5 standard errors: the mean's is std / sqrt(n), the deviation's about std / sqrt(2n). */
        ZT_CHECK(fabs(mean) < 5 * std / sqrt(n));
        ZT_CHECK(fabs(sd - std) < 5 * std / sqrt(2 * n));
        /* A normal puts 0.27 % beyond 3 sigma: 44 of 16384 expected. */
        ZT_CHECK(beyond3 > 15 && beyond3 < 90);
        free(v);
    }
    zt_layout_free(l);
}

/* Tensor-parallel shards: each rank's storage is its rows or columns, and its initialisation is the
 * slice of the one-rank initialisation (padding rows zero), whatever the split. */
static void test_tensor_parallel_shards(void)
{
    zt_param_decl p[] = {
        {"rows", 2, 0, {10, 4}, 0, 0, ZT_INIT_NORMAL, 0.5f, NULL},    /* the vocabulary: 10 rows, 3 ranks */
        {"cols", 2, 0, {3, 6}, 1, 0, ZT_INIT_NORMAL, 0.5f, NULL},     /* row-parallel: 6 columns, 2 ranks */
        {"norm", 1, 0, {4}, -1, 0, ZT_INIT_ONES, 0, NULL},
    };
    zt_model_info m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    m.n_units = 1;
    m.n_params_decl = 3;
    m.params = p;
    m.n_parameters = 40 + 18 + 4;
    zt_host_layout *whole, *shard;
    zt_error err;
    ZT_CHECK_INT(build(&m, 1, NULL, 0, &whole, &err), ZT_OK);
    float full[80];
    zt_layout_init_range(whole, NULL, 0, 7, 0, 62, full);
    /* the last of 3 vocabulary ranks: rows 8..9 real, 2 rows of padding; the second column rank */
    zt_param_shard sh[3] = {
        {sizeof(zt_param_shard), 0, 8, 4, 2, 1, 0},
        {sizeof(zt_param_shard), 1, 3, 3, 3, 1, 0},
        {sizeof(zt_param_shard), -1, 0, 4, 4, 1, 0},
    };
    zt_layout_options o = {1, NULL, 0, NULL, NULL, sh, 0, 0, 0};
    ZT_CHECK_INT(zt_layout_build(&m, &o, &shard, &err), ZT_OK);
    ZT_CHECK_INT(shard->numel[0], 16);
    ZT_CHECK_INT(shard->numel[1], 9);
    ZT_CHECK_INT(shard->numel[2], 4);
    ZT_CHECK_INT(shard->layout.units[0].numel, 29);
    float local[32];
    zt_layout_init_range(shard, NULL, 0, 7, 0, 29, local);
    for (int i = 0; i < 16; i++) /* rows 8, 9 of the whole, then padding */
        ZT_CHECK(local[i] == (i < 8 ? full[32 + i] : 0.0f));
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++) ZT_CHECK(local[16 + r * 3 + c] == full[40 + r * 6 + 3 + c]);
    for (int i = 0; i < 4; i++) ZT_CHECK(local[25 + i] == 1.0f);
    /* a part of the unit: the same values */
    float part[5];
    zt_layout_init_range(shard, NULL, 0, 7, 14, 5, part);
    for (int i = 0; i < 5; i++) ZT_CHECK(part[i] == local[14 + i]);
    zt_layout_free(shard);

    /* a shard that does not fit its tensor is the model's bug, named */
    sh[0].offset = 9;
    ZT_CHECK_INT(zt_layout_build(&m, &o, &shard, &err), ZT_ERR_INTERNAL);
    ZT_CHECK_CONTAINS(err.msg, "shard of rows");
    zt_layout_free(whole);
}

/* A pipeline stage holding unit 1 only: the other units take no storage and reach the zero plugin
 * with no elements; unit 1's offsets, padding and initial values are the whole layout's (worked out
 * by hand in test_offsets_and_padding). */
static void test_pipeline_stage(void)
{
    zt_model_info m = model(k_params);
    zt_host_layout *whole, *stage;
    zt_error err;
    ZT_CHECK_INT(build(&m, 2, NULL, ZT_PARAM_NO_DECAY, &whole, &err), ZT_OK);
    zt_layout_options o = {2, NULL, ZT_PARAM_NO_DECAY, NULL, NULL, NULL, 1, 1, 1};
    ZT_CHECK_INT(zt_layout_build(&m, &o, &stage, &err), ZT_OK);
    const zt_layout *v = &stage->layout;
    ZT_CHECK_INT(v->units[0].numel, 0);
    ZT_CHECK_INT(v->units[0].padded_numel, 0);
    ZT_CHECK_INT(v->units[2].numel, 0);
    ZT_CHECK_INT(v->units[2].padded_numel, 0);
    ZT_CHECK_INT(v->units[1].numel, 21);
    ZT_CHECK_INT(v->units[1].padded_numel, 32); /* next multiple of 2 x 16 */
    ZT_CHECK_INT(stage->largest_unit_numel, 32);
    ZT_CHECK_INT(whole->largest_unit_numel, 64);
    for (int i = Q; i <= DOWN; i++) ZT_CHECK_INT(v->param_offset[i], whole->layout.param_offset[i]);
    ZT_CHECK_INT(v->model->params[EMBED].shape[0], 0);
    ZT_CHECK_INT(v->model->params[NORM].shape[0], 0);
    ZT_CHECK_INT(v->model->params[Q].shape[0], 3);
    ZT_CHECK_INT(v->model->n_parameters, 21);
    ZT_CHECK_INT(stage->n_trainable, 21);
    ZT_CHECK(m.params[EMBED].shape[0] == 10); /* the model's own declarations are untouched */
    float a[32], b[32];
    zt_layout_init_range(whole, NULL, 1, 7, 0, 32, a);
    zt_layout_init_range(stage, NULL, 1, 7, 0, 32, b);
    ZT_CHECK(memcmp(a, b, sizeof a) == 0);
    zt_layout_free(whole);
    zt_layout_free(stage);
}

int main(void)
{
    test_pipeline_stage();
    test_tensor_parallel_shards();
    test_offsets_and_padding();
    test_decay();
    test_trainable();
    test_bad_models();
    test_init();
    test_init_statistics();
    return zt_test_result();
}
