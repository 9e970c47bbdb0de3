/* The naive attention plugin through its ABI, loaded as zt-run loads it: forward and backward
 * against eager attention written out in PyTorch (tests/reference/fixtures/ops/attention_*), padding
 * that attends only to padding, the KV cache against the same PyTorch outputs, and every refusal
 * with its message.
 *
 * usage: test_naive_attention PLUGINS_D OPS_FIXTURE_DIR
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "model_harness.h"
#include "safetensors_min.h"
#include "ztest.h"

static zt_error g_err;
static mh_env g_env;
static const zt_attention_ops *g_ops;
static void *g_state;

_Noreturn static void die(const char *what)
{
    fprintf(stderr, "test setup failed: %s: %s\n", what, g_err.msg);
    exit(1);
}

/* One PyTorch attention case. */
typedef struct attn_case {
    int64_t B, T, H, Hkv, D;
    float scale;
    float *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    int32_t *doc_ids; /* NULL: one document per row */
} attn_case;

static double json_number(const zt_json *j, const char *key)
{
    int tok = zt_json_object_get(j, 0, key);
    if (tok < 0) {
        zt_error_set(&g_err, ZT_ERR_FORMAT, "no \"%s\"", key);
        die("fixture json");
    }
    return zt_json_get_number(j, tok);
}

static void case_load(attn_case *c, const char *dir, const char *name)
{
    char path[4096];
    memset(c, 0, sizeof *c);
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    size_t len = 0;
    char *text = mh_read_file(path, &len, &g_err);
    zt_json j;
    if (!text || zt_json_parse(text, len, path, &j, &g_err) != ZT_OK) die(path);
    c->B = (int64_t)json_number(&j, "batch");
    c->T = (int64_t)json_number(&j, "seq");
    c->H = (int64_t)json_number(&j, "heads");
    c->Hkv = (int64_t)json_number(&j, "kv_heads");
    c->D = (int64_t)json_number(&j, "head_dim");
    c->scale = (float)json_number(&j, "scale");
    zt_json_free(&j);
    free(text);

    snprintf(path, sizeof path, "%s/%s.safetensors", dir, name);
    ref_st_file f;
    if (ref_st_open(path, &f, &g_err) != ZT_OK) die(path);
    int64_t qs[4] = {c->B, c->T, c->H, c->D}, ks[4] = {c->B, c->T, c->Hkv, c->D}, bt[2] = {c->B, c->T};
    if (ref_st_read_f32(&f, "q", 4, qs, &c->q, &g_err) || ref_st_read_f32(&f, "k", 4, ks, &c->k, &g_err) ||
        ref_st_read_f32(&f, "v", 4, ks, &c->v, &g_err) || ref_st_read_f32(&f, "o", 4, qs, &c->o, &g_err) ||
        ref_st_read_f32(&f, "do", 4, qs, &c->dout, &g_err) || ref_st_read_f32(&f, "dq", 4, qs, &c->dq, &g_err) ||
        ref_st_read_f32(&f, "dk", 4, ks, &c->dk, &g_err) || ref_st_read_f32(&f, "dv", 4, ks, &c->dv, &g_err))
        die(path);
    if (ref_st_find(&f, "doc_ids") && ref_st_read_i32(&f, "doc_ids", 2, bt, &c->doc_ids, &g_err) != ZT_OK) die(path);
    ref_st_close(&f);
}

static void case_free(attn_case *c)
{
    free(c->q), free(c->k), free(c->v), free(c->o), free(c->dout), free(c->dq), free(c->dk), free(c->dv);
    free(c->doc_ids);
}

static zt_batch batch_of(int64_t B, int64_t T, const int32_t *doc_ids)
{
    zt_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.batch = (int32_t)B;
    b.seq_len = (int32_t)T;
    b.doc_ids = doc_ids;
    return b;
}

static zt_attn_args args_of(const zt_batch *b, int64_t H, int64_t Hkv, int64_t D, float scale, float *q, float *k,
                            float *v, float *out)
{
    zt_attn_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.n_heads = (int32_t)H;
    a.n_kv_heads = (int32_t)Hkv;
    a.head_dim = (int32_t)D;
    a.scale = scale;
    a.causal = 1;
    a.batch = b;
    int64_t qs[4] = {b->batch, b->seq_len, H, D}, ks[4] = {b->batch, b->seq_len, Hkv, D};
    a.q = mh_view(q, 4, qs);
    a.k = mh_view(k, 4, ks);
    a.v = mh_view(v, 4, ks);
    a.out = mh_view(out, 4, qs);
    return a;
}

static float *nan_floats(int64_t n)
{
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

static void expect_error(zt_status got, zt_status want, const char *text)
{
    ZT_CHECK_INT(got, want);
    ZT_CHECK_CONTAINS(mh_attention_error(&g_env), text);
}

/* Forward and backward equal PyTorch's eager attention. */
static void check_case(const char *dir, const char *name)
{
    attn_case c;
    case_load(&c, dir, name);
    int64_t nq = c.B * c.T * c.H * c.D, nk = c.B * c.T * c.Hkv * c.D;
    zt_batch b = batch_of(c.B, c.T, c.doc_ids);
    float *out = nan_floats(nq), *dq = nan_floats(nq), *dk = nan_floats(nk), *dv = nan_floats(nk);
    zt_attn_args a = args_of(&b, c.H, c.Hkv, c.D, c.scale, c.q, c.k, c.v, out);
    void *saved = NULL;
    ZT_CHECK_INT(g_ops->forward(g_state, &a, &saved), ZT_OK);
    ZT_CHECK(saved != NULL);
    char what[128];
    snprintf(what, sizeof what, "%s: out", name);
    ZT_CHECK(mh_close_enough(what, out, c.o, nq, 1e-5, 1e-6));
    int64_t qs[4] = {c.B, c.T, c.H, c.D}, ks[4] = {c.B, c.T, c.Hkv, c.D};
    a.dout = mh_view(c.dout, 4, qs);
    a.dq = mh_view(dq, 4, qs);
    a.dk = mh_view(dk, 4, ks);
    a.dv = mh_view(dv, 4, ks);
    ZT_CHECK_INT(g_ops->backward(g_state, &a, saved), ZT_OK);
    snprintf(what, sizeof what, "%s: dq", name);
    ZT_CHECK(mh_close_enough(what, dq, c.dq, nq, 1e-4, 1e-6));
    snprintf(what, sizeof what, "%s: dk", name);
    ZT_CHECK(mh_close_enough(what, dk, c.dk, nk, 1e-4, 1e-6));
    snprintf(what, sizeof what, "%s: dv", name);
    ZT_CHECK(mh_close_enough(what, dv, c.dv, nk, 1e-4, 1e-6));

    /* Without a backward nothing is kept, and the output is the same. */
    float *again = nan_floats(nq);
    a.out = mh_view(again, 4, qs);
    ZT_CHECK_INT(g_ops->forward(g_state, &a, NULL), ZT_OK);
    ZT_CHECK(memcmp(again, out, sizeof(float) * (size_t)nq) == 0);
    free(again), free(out), free(dq), free(dk), free(dv);
    case_free(&c);
}

/* Padding (document -1) attends only to padding, and real tokens never see it. */
static void check_padding(const char *dir)
{
    attn_case c;
    case_load(&c, dir, "attention_gqa_causal");
    enum { T = 8, REAL = 5 };
    int64_t H = c.H, Hkv = c.Hkv, D = c.D, row_q = H * D, row_k = Hkv * D;
    /* row 0 of the fixture, first T tokens, laid out for T */
    float *q = malloc(sizeof(float) * T * row_q), *k = malloc(sizeof(float) * T * row_k),
          *v = malloc(sizeof(float) * T * row_k);
    memcpy(q, c.q, sizeof(float) * T * row_q);
    memcpy(k, c.k, sizeof(float) * T * row_k);
    memcpy(v, c.v, sizeof(float) * T * row_k);
    int32_t docs[T] = {0, 0, 0, 0, 0, -1, -1, -1};
    zt_batch padded = batch_of(1, T, docs);
    float *out = nan_floats(T * row_q);
    zt_attn_args a = args_of(&padded, H, Hkv, D, c.scale, q, k, v, out);
    ZT_CHECK_INT(g_ops->forward(g_state, &a, NULL), ZT_OK);

    /* the real tokens alone */
    zt_batch real = batch_of(1, REAL, NULL);
    float *out_real = nan_floats(REAL * row_q);
    a = args_of(&real, H, Hkv, D, c.scale, q, k, v, out_real);
    ZT_CHECK_INT(g_ops->forward(g_state, &a, NULL), ZT_OK);
    ZT_CHECK(mh_close_enough("real tokens next to padding", out, out_real, REAL * row_q, 1e-6, 0.0));

    /* the padding alone */
    zt_batch pad = batch_of(1, T - REAL, NULL);
    float *out_pad = nan_floats((T - REAL) * row_q);
    a = args_of(&pad, H, Hkv, D, c.scale, q + REAL * row_q, k + REAL * row_k, v + REAL * row_k, out_pad);
    ZT_CHECK_INT(g_ops->forward(g_state, &a, NULL), ZT_OK);
    ZT_CHECK(mh_close_enough("padding attends only to padding", out + REAL * row_q, out_pad, (T - REAL) * row_q,
                             1e-6, 0.0));
    free(q), free(k), free(v), free(out), free(out_real), free(out_pad);
    case_free(&c);
}

/* Decoding against the cache, chunk by chunk, gives PyTorch's causal attention over the whole
 * sequence; two sequences at once, in a layer other than 0. */
static void check_kv_cache(const char *dir)
{
    attn_case c;
    case_load(&c, dir, "attention_gqa_causal");
    int64_t B = c.B, T = c.T, H = c.H, Hkv = c.Hkv, D = c.D, row_q = H * D, row_k = Hkv * D;
    zt_kv_cache_desc desc = {.struct_size = sizeof desc, .n_layers = 3, .n_kv_heads = (int32_t)Hkv,
                             .head_dim = (int32_t)D, .max_seqs = 3, .max_tokens = (int32_t)(3 * T),
                             .dtype = ZT_F32};
    zt_kv_cache *kv = NULL;
    ZT_CHECK_INT(g_ops->kv_create(g_state, &desc, &kv), ZT_OK);
    if (!kv) return;
    /* fixture rows 0 and 1 as cache sequences 2 and 0 */
    const int32_t seqs[2] = {2, 0};
    float *q = malloc(sizeof(float) * (size_t)(B * T * row_q)), *k = malloc(sizeof(float) * (size_t)(B * T * row_k));
    float *v = malloc(sizeof(float) * (size_t)(B * T * row_k)), *out = nan_floats(B * T * row_q);
    float *got = nan_floats(B * T * row_q);
    for (int64_t start = 0, chunk = 5; start < T; start += chunk, chunk = 1) {
        int64_t n = start + chunk <= T ? chunk : T - start;
        for (int64_t row = 0; row < B; row++) { /* gather [B, n, ...] from [B, T, ...] */
            memcpy(q + row * n * row_q, c.q + (row * T + start) * row_q, sizeof(float) * (size_t)(n * row_q));
            memcpy(k + row * n * row_k, c.k + (row * T + start) * row_k, sizeof(float) * (size_t)(n * row_k));
            memcpy(v + row * n * row_k, c.v + (row * T + start) * row_k, sizeof(float) * (size_t)(n * row_k));
        }
        zt_batch b = batch_of(B, n, NULL);
        zt_attn_args a = args_of(&b, H, Hkv, D, c.scale, q, k, v, out);
        ZT_CHECK_INT(g_ops->kv_attend(g_state, kv, 1, seqs, 2, &a), ZT_OK);
        ZT_CHECK_INT(g_ops->kv_advance(g_state, kv, seqs, 2, (int32_t)n), ZT_OK);
        for (int64_t row = 0; row < B; row++)
            memcpy(got + (row * T + start) * row_q, out + row * n * row_q, sizeof(float) * (size_t)(n * row_q));
    }
    ZT_CHECK(mh_close_enough("KV-cache decoding vs PyTorch", got, c.o, B * T * row_q, 1e-5, 1e-6));

    /* The cache is full for these sequences (T of T tokens each): one more token does not fit. */
    zt_batch one = batch_of(1, 1, NULL);
    zt_attn_args a = args_of(&one, H, Hkv, D, c.scale, q, k, v, out);
    expect_error(g_ops->kv_attend(g_state, kv, 1, &seqs[1], 1, &a), ZT_ERR_BUFFER_TOO_SMALL,
                 "sequence 0 holds 13 tokens and 1 more do not fit its 13-token share of the cache");
    int32_t bad_seq = 3, twice[2] = {1, 1};
    expect_error(g_ops->kv_attend(g_state, kv, 1, &bad_seq, 1, &a), ZT_ERR_INVALID_ARG,
                 "sequence id 3 (entry 0) is outside [0, 3)");
    expect_error(g_ops->kv_advance(g_state, kv, twice, 2, 1), ZT_ERR_INVALID_ARG, "sequence id 1 appears twice");
    int32_t seq1 = 1;
    expect_error(g_ops->kv_attend(g_state, kv, 3, &seq1, 1, &a), ZT_ERR_INVALID_ARG, "layer 3 is outside [0, 3)");
    a.n_kv_heads = 1;
    a.n_heads = 1;
    expect_error(g_ops->kv_attend(g_state, kv, 0, &seq1, 1, &a), ZT_ERR_INVALID_ARG,
                 "the call has 1 key/value heads of 8 but the cache was created for 2 of 8");

    /* After a reset the sequence starts over: its first token attends only to itself, so its output
     * is its own value vector (per head group). */
    ZT_CHECK_INT(g_ops->kv_reset(g_state, kv, 0), ZT_OK);
    a = args_of(&one, H, Hkv, D, c.scale, c.q, c.k, c.v, out);
    ZT_CHECK_INT(g_ops->kv_attend(g_state, kv, 1, &seqs[1], 1, &a), ZT_OK);
    for (int64_t h = 0; h < H; h++)
        ZT_CHECK(mh_close_enough("first token after reset", out + h * D, c.v + h / (H / Hkv) * D, D, 1e-6, 0.0));
    g_ops->kv_destroy(g_state, kv);

    desc.dtype = ZT_BF16;
    kv = NULL;
    expect_error(g_ops->kv_create(g_state, &desc, &kv), ZT_ERR_UNSUPPORTED,
                 "naive attention caches fp32 (ZT_F32) only");
    ZT_CHECK(kv == NULL);
    desc.dtype = ZT_F32;
    desc.max_tokens = 2;
    expect_error(g_ops->kv_create(g_state, &desc, &kv), ZT_ERR_INVALID_ARG,
                 "max_tokens at least max_seqs (every sequence gets max_tokens / max_seqs tokens)");
    free(q), free(k), free(v), free(out), free(got);
    case_free(&c);
}

/* Every refusal says what is wrong and what to do. */
static void check_refusals(const char *dir)
{
    attn_case c;
    case_load(&c, dir, "attention_gqa_causal");
    int64_t nq = c.B * c.T * c.H * c.D;
    zt_batch b = batch_of(c.B, c.T, NULL);
    float *out = nan_floats(nq);
    zt_attn_args a = args_of(&b, c.H, c.Hkv, c.D, c.scale, c.q, c.k, c.v, out);
    void *saved = NULL;

    a.causal = 0;
    expect_error(g_ops->forward(g_state, &a, &saved), ZT_ERR_UNSUPPORTED,
                 "naive attention forward: non-causal attention was asked for (causal = 0)");
    a.causal = 1;
    a.n_kv_heads = 3;
    expect_error(g_ops->forward(g_state, &a, &saved), ZT_ERR_INVALID_ARG,
                 "n_heads 4, n_kv_heads 3, head_dim 8: all must be positive and n_kv_heads must divide n_heads");
    a.n_kv_heads = (int32_t)c.Hkv;
    a.k.dtype = ZT_BF16;
    expect_error(g_ops->forward(g_state, &a, &saved), ZT_ERR_UNSUPPORTED,
                 "k has dtype 1; naive attention computes in fp32 only");
    a.k.dtype = ZT_F32;
    a.v.shape[2] = c.H;
    expect_error(g_ops->forward(g_state, &a, &saved), ZT_ERR_INVALID_ARG,
                 "v must be a contiguous [2, 13, 2, 8] tensor ([batch, tokens, heads, head_dim]), got 4 dimensions "
                 "of shape [2, 13, 4, 8]");
    a.v.shape[2] = c.Hkv;
    ZT_CHECK(saved == NULL);

    /* backward needs the record of a forward that expected one */
    int64_t qs[4] = {c.B, c.T, c.H, c.D}, ks[4] = {c.B, c.T, c.Hkv, c.D};
    float *dq = nan_floats(nq), *dk = nan_floats(nq), *dv = nan_floats(nq);
    a.dout = mh_view(c.dout, 4, qs);
    a.dq = mh_view(dq, 4, qs);
    a.dk = mh_view(dk, 4, ks);
    a.dv = mh_view(dv, 4, ks);
    expect_error(g_ops->backward(g_state, &a, NULL), ZT_ERR_INVALID_ARG,
                 "the saved record is NULL (forward ran with saved == NULL, i.e. without a backward)");
    /* a record from another shape is refused, and freed all the same */
    zt_batch shorter = batch_of(c.B, c.T - 1, NULL);
    zt_attn_args s = args_of(&shorter, c.H, c.Hkv, c.D, c.scale, c.q, c.k, c.v, out);
    ZT_CHECK_INT(g_ops->forward(g_state, &s, &saved), ZT_OK);
    expect_error(g_ops->backward(g_state, &a, saved), ZT_ERR_INVALID_ARG, "from a forward of another shape");
    free(out), free(dq), free(dk), free(dv);
    case_free(&c);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLUGINS_D OPS_FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    /* The harness loads the model too (a run always has one); the preset only sizes it. */
    if (mh_open(&g_env, argv[1], "{\"model\": {\"preset\": \"tiny\"}}", 2, &g_err) != ZT_OK) die("loading plugins");
    g_ops = g_env.attention.ops;
    g_state = g_env.attention.state;
    uint64_t caps = g_env.attention.caps;
    ZT_CHECK((caps & (ZT_CAP_CPU | ZT_CAP_PACKED | ZT_CAP_GQA | ZT_CAP_KV_CACHE)) ==
             (ZT_CAP_CPU | ZT_CAP_PACKED | ZT_CAP_GQA | ZT_CAP_KV_CACHE));

    check_case(argv[2], "attention_gqa_causal");
    check_case(argv[2], "attention_mqa_packed");
    check_case(argv[2], "attention_mha_long");
    check_padding(argv[2]);
    check_kv_cache(argv[2]);
    check_refusals(argv[2]);

    static const int pools[] = {ZT_POOL_ACTIVATIONS, ZT_POOL_WORKSPACE, ZT_POOL_KV_CACHE};
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) {
        zt_mem_stats stats;
        zt_runtime_mem_stats(g_env.rt, pools[i], ZT_MEM_HOST, &stats);
        ZT_CHECK_INT(stats.current, 0);
    }
    mh_close(&g_env);
    return zt_test_result();
}
