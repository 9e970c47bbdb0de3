/* The llama and naive plugins, loaded as zt-run loads them, against a fixture written by Hugging
 * Face transformers (tests/reference/make_fixtures.py): logits, loss and every parameter gradient
 * to 1e-4 relative, greedy generation token for token. Then properties transformers cannot check
 * for us: recompute gives bit-identical gradients, a frozen parameter changes nothing else, a packed
 * row equals its documents run one by one, gradients accumulate, and decoding with the KV cache
 * equals decoding by full recompute.
 *
 * usage: test_llama_reference PLUGINS_D FIXTURE_DIR
 */
#include <stdlib.h>
#include <string.h>

#include "model_harness.h"
#include "safetensors_min.h"
#include "ztest.h"

/* transformers computes in fp32 as we do, but sums in another order: 1e-4 relative, with an
 * absolute floor of 1e-6 of the tensor's largest element for entries that cancel to near zero. */
#define RTOL 1e-4
#define ATOL_FRACTION 1e-6

static zt_error g_err; /* 8 KiB: off the stack */

_Noreturn static void die(const char *what)
{
    fprintf(stderr, "test setup failed: %s: %s\n", what, g_err.msg);
    exit(1);
}

typedef struct fixture {
    const char *dir;
    ref_st_file expected;
    int32_t B, T, V;
    int32_t *input_ids, *labels, *position_ids, *doc_ids; /* doc_ids NULL unless packed */
    float *logits;
    mh_expected json;
} fixture;

static void fixture_load(fixture *f, const char *dir, const mh_env *e)
{
    char path[4096];
    memset(f, 0, sizeof *f);
    f->dir = dir;
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    if (ref_st_open(path, &f->expected, &g_err) != ZT_OK) die("expected.safetensors");
    const ref_st_tensor *ids = ref_st_find(&f->expected, "input_ids");
    if (!ids || ids->ndim != 2) die("input_ids");
    f->B = (int32_t)ids->shape[0];
    f->T = (int32_t)ids->shape[1];
    f->V = e->info->vocab_size;
    int64_t bt[2] = {f->B, f->T}, btv[3] = {f->B, f->T, f->V};
    if (ref_st_read_i32(&f->expected, "input_ids", 2, bt, &f->input_ids, &g_err) != ZT_OK ||
        ref_st_read_i32(&f->expected, "labels", 2, bt, &f->labels, &g_err) != ZT_OK ||
        ref_st_read_i32(&f->expected, "position_ids", 2, bt, &f->position_ids, &g_err) != ZT_OK ||
        ref_st_read_f32(&f->expected, "logits", 3, btv, &f->logits, &g_err) != ZT_OK)
        die("expected tensors");
    if (ref_st_find(&f->expected, "doc_ids") &&
        ref_st_read_i32(&f->expected, "doc_ids", 2, bt, &f->doc_ids, &g_err) != ZT_OK)
        die("doc_ids");
    snprintf(path, sizeof path, "%s/expected.json", dir);
    if (mh_expected_load(path, &f->json, &g_err) != ZT_OK) die("expected.json");
}

static void fixture_free(fixture *f)
{
    free(f->input_ids);
    free(f->labels);
    free(f->position_ids);
    free(f->doc_ids);
    free(f->logits);
    ref_st_close(&f->expected);
}

/* Copies of every gradient, to compare runs. */
static float **grads_copy(const mh_params *p)
{
    float **copy = calloc((size_t)p->n, sizeof *copy);
    for (int32_t i = 0; copy && i < p->n; i++) {
        copy[i] = malloc((size_t)p->numel[i] * sizeof(float));
        if (copy[i]) memcpy(copy[i], p->grad[i], (size_t)p->numel[i] * sizeof(float));
    }
    return copy;
}

static void grads_free(const mh_params *p, float **g)
{
    for (int32_t i = 0; g && i < p->n; i++) free(g[i]);
    free(g);
}

/* One training step (forward with `flags`, backward) on `b` with zeroed gradients. */
static void train_step(mh_env *e, mh_params *p, const mh_batch *b, mh_run *r, uint32_t flags, const int *frozen)
{
    mh_grads_zero(e, p);
    if (mh_forward(e, p, b, r, flags, 1, &g_err) != ZT_OK) die("forward");
    if (mh_backward(e, p, b, r, frozen, &g_err) != ZT_OK) die("backward");
}

/* Logits, loss and gradients against transformers. Leaves the gradients in p and returns copies. */
static float **check_against_transformers(mh_env *e, mh_params *p, const fixture *f)
{
    mh_batch b;
    mh_run r;
    if (mh_batch_make(&b, f->B, f->T, f->input_ids, f->labels, f->doc_ids, 0, &g_err) != ZT_OK ||
        mh_run_alloc(e, &b, &r, &g_err) != ZT_OK)
        die("batch");
    /* The harness derives positions from the documents as the data loader does; HF's must agree. */
    ZT_CHECK(memcmp(b.positions, f->position_ids, sizeof(int32_t) * (size_t)(f->B * f->T)) == 0);
    ZT_CHECK_INT(b.batch.n_loss_tokens_global, f->json.n_loss_tokens);

    train_step(e, p, &b, &r, ZT_UNIT_TRAIN, NULL);
    ZT_CHECK(mh_close_enough("logits", r.logits, f->logits, (int64_t)f->B * f->T * f->V, RTOL, ATOL_FRACTION));
    ZT_CHECK_CLOSE(r.loss, f->json.loss, RTOL, 0.0);
    int checked = 0;
    for (int32_t i = 0; i < p->n; i++) {
        const zt_param_decl *d = &e->info->params[i];
        if (p->owner[i] != i) {
            /* tied: the fixture has no lm_head; its gradient is part of the embedding's */
            ZT_CHECK(ref_st_find(&f->expected, "grad.lm_head.weight") == NULL);
            continue;
        }
        char name[160];
        float *want = NULL;
        snprintf(name, sizeof name, "grad.%s", d->name);
        if (ref_st_read_f32(&f->expected, name, d->ndim, d->shape, &want, &g_err) != ZT_OK) {
            fprintf(stderr, "%s\n", g_err.msg);
            ZT_CHECK(!"every declared parameter has a gradient in the fixture");
            continue;
        }
        ZT_CHECK(mh_close_enough(name, p->grad[i], want, p->numel[i], RTOL, ATOL_FRACTION));
        free(want);
        checked++;
    }
    /* lm_head + model.norm + embedding + 9 per layer, minus the tied head */
    ZT_CHECK_INT(checked, 2 + 9 * e->info->n_layers + (ref_st_find(&f->expected, "grad.lm_head.weight") != NULL));
    float **grads = grads_copy(p);

    /* Gradients accumulate: a second identical step on top doubles them. */
    if (mh_forward(e, p, &b, &r, ZT_UNIT_TRAIN, 0, &g_err) != ZT_OK || mh_backward(e, p, &b, &r, NULL, &g_err) != ZT_OK)
        die("second step");
    for (int32_t i = 0; i < p->n; i++) {
        if (p->owner[i] != i) continue;
        float *twice = malloc((size_t)p->numel[i] * sizeof(float));
        for (int64_t k = 0; k < p->numel[i]; k++) twice[k] = 2.0f * grads[i][k];
        ZT_CHECK(mh_close_enough("accumulated gradient", p->grad[i], twice, p->numel[i], 1e-6, 1e-7));
        free(twice);
    }
    mh_run_free(&r);
    mh_batch_free(&b);
    return grads;
}

static int grads_identical(const mh_params *p, float **a, const int *skip)
{
    int same = 1;
    for (int32_t i = 0; i < p->n; i++) {
        if (p->owner[i] != i || (skip && skip[i])) continue;
        if (memcmp(p->grad[i], a[i], (size_t)p->numel[i] * sizeof(float)) != 0) {
            fprintf(stderr, "gradient of declaration %d differs\n", (int)i);
            same = 0;
        }
    }
    return same;
}

/* Activation checkpointing recomputes exactly what it dropped: gradients equal to the bit. */
static void check_recompute(mh_env *e, mh_params *p, const fixture *f, float **reference)
{
    mh_batch b;
    mh_run r;
    if (mh_batch_make(&b, f->B, f->T, f->input_ids, f->labels, f->doc_ids, 0, &g_err) != ZT_OK ||
        mh_run_alloc(e, &b, &r, &g_err) != ZT_OK)
        die("batch");
    /* Only the recompute markers are kept between forward and backward. */
    train_step(e, p, &b, &r, ZT_UNIT_TRAIN | ZT_UNIT_RECOMPUTE, NULL);
    ZT_CHECK(grads_identical(p, reference, NULL));
    ZT_CHECK_CLOSE(r.loss, f->json.loss, RTOL, 0.0);
    mh_run_free(&r);
    mh_batch_free(&b);
}

/* A frozen parameter (NULL gradient view) gets nothing, and every other gradient is unchanged. */
static void check_frozen(mh_env *e, mh_params *p, const fixture *f, float **reference)
{
    int *frozen = calloc((size_t)p->n, sizeof *frozen);
    char name[128];
    int32_t last_layer = e->info->n_layers - 1;
    const char *names[4] = {"model.layers.0.self_attn.q_proj.weight", name, "model.norm.weight",
                            "model.embed_tokens.weight"};
    snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", (int)last_layer);
    /* The tied embedding also receives the head's gradient: freezing it is freezing both views. */
    int n_names = e->info->params[mh_param_index(e, "lm_head.weight")].flags & ZT_PARAM_TIED ? 3 : 4;
    for (int i = 0; i < n_names; i++) {
        int32_t k = mh_param_index(e, names[i]);
        ZT_CHECK(k >= 0);
        if (k >= 0) frozen[k] = 1;
    }
    mh_batch b;
    mh_run r;
    if (mh_batch_make(&b, f->B, f->T, f->input_ids, f->labels, f->doc_ids, 0, &g_err) != ZT_OK ||
        mh_run_alloc(e, &b, &r, &g_err) != ZT_OK)
        die("batch");
    mh_grads_zero(e, p);
    for (int32_t i = 0; i < p->n; i++)
        if (frozen[i]) for (int64_t k = 0; k < p->numel[i]; k++) p->grad[i][k] = 7.0f; /* must survive */
    if (mh_forward(e, p, &b, &r, ZT_UNIT_TRAIN, 0, &g_err) != ZT_OK ||
        mh_backward(e, p, &b, &r, frozen, &g_err) != ZT_OK)
        die("frozen step");
    ZT_CHECK(grads_identical(p, reference, frozen));
    for (int32_t i = 0; i < p->n; i++) {
        if (!frozen[i]) continue;
        int untouched = 1;
        for (int64_t k = 0; k < p->numel[i]; k++) untouched &= p->grad[i][k] == 7.0f;
        ZT_CHECK(untouched);
    }
    mh_run_free(&r);
    mh_batch_free(&b);
    free(frozen);
}

/* Documents packed in one row give the logits, loss and gradients of the same documents run one
 * at a time: attention never crosses a document boundary, forward or backward. */
static void check_packing(mh_env *e, mh_params *p, const fixture *f)
{
    int32_t B = f->B, T = f->T, n = B * T, V = f->V;
    int32_t *docs = malloc(sizeof(int32_t) * (size_t)n), *labels = malloc(sizeof(int32_t) * (size_t)n);
    memcpy(labels, f->labels, sizeof(int32_t) * (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        /* the fixture's documents, or for unpacked fixtures a split of each row at 7 and 11 */
        int32_t t = i % T;
        docs[i] = f->doc_ids ? f->doc_ids[i] : (t < 7 ? 0 : t < 11 ? 1 : 2);
        /* a document's first token is nobody's target: the one before it ends another document */
        if (t > 0 && docs[i] != docs[i - 1]) labels[i] = -100;
    }
    mh_batch packed;
    mh_run r;
    if (mh_batch_make(&packed, B, T, f->input_ids, labels, docs, 0, &g_err) != ZT_OK ||
        mh_run_alloc(e, &packed, &r, &g_err) != ZT_OK)
        die("packed batch");
    int64_t normalizer = packed.batch.n_loss_tokens_global;
    train_step(e, p, &packed, &r, ZT_UNIT_TRAIN, NULL);
    float **packed_grads = grads_copy(p);
    float *packed_logits = malloc(sizeof(float) * (size_t)n * (size_t)V);
    memcpy(packed_logits, r.logits, sizeof(float) * (size_t)n * (size_t)V);
    float packed_loss = r.loss;
    mh_run_free(&r);

    mh_grads_zero(e, p);
    double loss_sum = 0.0;
    int n_docs = 0;
    for (int32_t start = 0; start < n;) {
        int32_t end = start + 1;
        while (end < n && end % T != 0 && docs[end] == docs[start]) end++;
        mh_batch alone;
        mh_run ra;
        /* every document's loss is normalized by the packed batch's token count, as one global batch */
        if (mh_batch_make(&alone, 1, end - start, f->input_ids + start, labels + start, NULL, normalizer, &g_err) !=
                ZT_OK ||
            mh_run_alloc(e, &alone, &ra, &g_err) != ZT_OK)
            die("document batch");
        if (mh_forward(e, p, &alone, &ra, ZT_UNIT_TRAIN, 1, &g_err) != ZT_OK ||
            mh_backward(e, p, &alone, &ra, NULL, &g_err) != ZT_OK)
            die("document step");
        ZT_CHECK(mh_close_enough("document logits vs packed", ra.logits, packed_logits + (int64_t)start * V,
                                 (int64_t)(end - start) * V, 1e-5, 1e-6));
        loss_sum += ra.loss;
        n_docs++;
        mh_run_free(&ra);
        mh_batch_free(&alone);
        start = end;
    }
    ZT_CHECK_INT(n_docs, packed.batch.n_docs);
    ZT_CHECK(n_docs > B);
    ZT_CHECK_CLOSE(loss_sum, packed_loss, 1e-5, 0.0);
    for (int32_t i = 0; i < p->n; i++) {
        if (p->owner[i] != i) continue;
        char what[160];
        snprintf(what, sizeof what, "summed document gradients vs packed: %s", e->info->params[i].name);
        ZT_CHECK(mh_close_enough(what, p->grad[i], packed_grads[i], p->numel[i], 1e-4, 1e-5));
    }
    grads_free(p, packed_grads);
    free(packed_logits);
    mh_batch_free(&packed);
    free(docs);
    free(labels);
}

/* Greedy decoding reproduces transformers' generate(), with the KV cache and without. */
static void check_generation(mh_env *e, mh_params *p, const fixture *f)
{
    const mh_expected *x = &f->json;
    int32_t n_new = x->n_output - x->n_prompt, V = f->V;
    int32_t cached[64], recomputed[64];
    float *cached_logits = malloc(sizeof(float) * (size_t)n_new * (size_t)V);
    float *recomputed_logits = malloc(sizeof(float) * (size_t)n_new * (size_t)V);
    if (mh_generate(e, p, x->prompt, x->n_prompt, n_new, 1, cached, cached_logits, &g_err) != ZT_OK)
        die("generation with the KV cache");
    if (mh_generate(e, p, x->prompt, x->n_prompt, n_new, 0, recomputed, recomputed_logits, &g_err) != ZT_OK)
        die("generation without cache");
    for (int32_t i = 0; i < x->n_output; i++) {
        ZT_CHECK_INT(cached[i], x->output[i]);
        ZT_CHECK_INT(recomputed[i], x->output[i]);
    }
    ZT_CHECK(mh_close_enough("logits with vs without KV cache", cached_logits, recomputed_logits,
                             (int64_t)n_new * V, 1e-5, 1e-6));
    free(cached_logits);
    free(recomputed_logits);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLUGINS_D FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    char *config = mh_config_from_hf(argv[2], &g_err);
    if (!config) die("config.json");
    mh_env e;
    if (mh_open(&e, argv[1], config, 2, &g_err) != ZT_OK) die("loading llama and naive");
    mh_params p;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", argv[2]);
    if (mh_params_alloc(&e, &p, &g_err) != ZT_OK || mh_params_load(&e, &p, path, &g_err) != ZT_OK)
        die("weights");
    fixture f;
    fixture_load(&f, argv[2], &e);

    float **reference = check_against_transformers(&e, &p, &f);
    check_recompute(&e, &p, &f, reference);
    check_frozen(&e, &p, &f, reference);
    check_packing(&e, &p, &f);
    check_generation(&e, &p, &f);
    grads_free(&p, reference);

    /* Everything the plugins allocated per call was given back. */
    static const int pools[] = {ZT_POOL_ACTIVATIONS, ZT_POOL_WORKSPACE, ZT_POOL_KV_CACHE};
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) {
        zt_mem_stats stats;
        zt_runtime_mem_stats(e.rt, pools[i], ZT_MEM_HOST, &stats);
        ZT_CHECK_INT(stats.current, 0);
        ZT_CHECK(stats.peak > 0);
    }

    fixture_free(&f);
    mh_params_free(&p);
    mh_close(&e);
    free(config);
    return zt_test_result();
}
