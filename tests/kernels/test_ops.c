/* Every CPU kernel against PyTorch autograd (tests/reference/fixtures/ops, make_fixtures.py), run
 * serially and on a 3-thread pool: both must match torch, and each other bit for bit.
 * Outputs start as NaN; gradient buffers that accumulate start with the fixture's "_init" values.
 * The generic GEMM is also checked against a double-precision triple loop for the transpose
 * combinations and sizes the fixtures do not cover, and attention with a head dimension above 128
 * against a double-precision evaluation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cpu/simd.h" /* the internal vector exp is tested directly */
#include "kernel_test.h"
#include "ztest.h"

#define RTOL 1e-5

static int64_t dim_of(const fixture *f, const char *name, int d)
{
    return ref_st_find(&f->tensors, name)->shape[d];
}

/* Run t of every op: 0 serial, 1 threaded; GEMM tests add 2, threaded without the AVX-512 kernel. */
static const zt_cpu_ctx *context(int run)
{
    return run == 0 ? serial_ctx() : run == 1 ? threaded_ctx() : threaded_no_avx512_ctx();
}

static const char *const run_names[3] = {"serial", "threaded", "threaded, no AVX-512"};

/* Compares each of got[0, n_runs) ([rows, cols]) with the reference, and the serial and threaded
 * runs (same kernels, different splits) with each other bit for bit; then frees them. */
static void check_runs(const char *what, float **got, int n_runs, const float *want, int64_t rows,
                       int64_t cols, double rtol)
{
    char label[160];
    for (int t = 0; t < n_runs; t++) {
        snprintf(label, sizeof label, "%s (%s)", what, run_names[t]);
        ZT_CHECK(check_close_rows(label, got[t], want, rows, cols, rtol));
    }
    ZT_CHECK(check_identical_f32(what, got[0], got[1], rows * cols));
    for (int t = 0; t < n_runs; t++) free(got[t]);
}

static void check_pair(const char *what, float *got[2], const float *want, int64_t rows,
                       int64_t cols, double rtol)
{
    check_runs(what, got, 2, want, rows, cols, rtol);
}

static void test_rmsnorm(void)
{
    fixture f;
    fixture_load(&f, "ops/rmsnorm");
    int64_t rows = dim_of(&f, "x", 0), dim = dim_of(&f, "x", 1), n = rows * dim;
    float *x = fixture_f32(&f, "x", NULL), *w = fixture_f32(&f, "w", NULL);
    float *y = fixture_f32(&f, "y", NULL), *rstd = fixture_f32(&f, "rstd", NULL);
    float *dy = fixture_f32(&f, "dy", NULL), *dx = fixture_f32(&f, "dx", NULL);
    float *dw_init = fixture_f32(&f, "dw_init", NULL), *dw = fixture_f32(&f, "dw", NULL);
    float eps = (float)fixture_number(&f, "eps");
    float *y_got[2], *rstd_got[2], *dx_got[2], *dw_got[2];
    for (int t = 0; t < 2; t++) {
        y_got[t] = poisoned(n);
        rstd_got[t] = poisoned(rows);
        zt_cpu_rmsnorm_forward(context(t), rows, dim, eps, x, w, y_got[t], rstd_got[t]);
        dx_got[t] = poisoned(n);
        dw_got[t] = copy_f32(dw_init, dim);
        zt_cpu_rmsnorm_backward(context(t), rows, dim, x, w, rstd_got[t], dy, dx_got[t], dw_got[t]);
    }
    check_pair("rmsnorm y", y_got, y, rows, dim, RTOL);
    check_pair("rmsnorm rstd", rstd_got, rstd, 1, rows, RTOL);
    check_pair("rmsnorm dx", dx_got, dx, rows, dim, RTOL);
    check_pair("rmsnorm dw", dw_got, dw, 1, dim, RTOL);
    /* a frozen norm (dw NULL): the same dx, and no weight gradient anywhere */
    float *dx_frozen[2];
    for (int t = 0; t < 2; t++) {
        dx_frozen[t] = poisoned(n);
        zt_cpu_rmsnorm_backward(context(t), rows, dim, x, w, rstd, dy, dx_frozen[t], NULL); /* torch's rstd */
    }
    check_pair("rmsnorm dx, frozen weight", dx_frozen, dx, rows, dim, RTOL);
    free(x); free(w); free(y); free(rstd); free(dy); free(dx); free(dw_init); free(dw);
    fixture_free(&f);
}

static zt_rope_config rope_config_of(const fixture *f)
{
    zt_rope_config cfg = {0};
    int type_tok = zt_json_object_get(&f->json, 0, "rope_type");
    cfg.rope_type = zt_json_eq(&f->json, type_tok, "llama3") ? ZT_ROPE_LLAMA3 : ZT_ROPE_DEFAULT;
    cfg.head_dim = (int32_t)fixture_number(f, "head_dim");
    cfg.theta = fixture_number(f, "theta");
    if (cfg.rope_type == ZT_ROPE_LLAMA3) {
        cfg.factor = fixture_number(f, "factor");
        cfg.low_freq_factor = fixture_number(f, "low_freq_factor");
        cfg.high_freq_factor = fixture_number(f, "high_freq_factor");
        cfg.original_max_position_embeddings = fixture_number(f, "original_max_position_embeddings");
    }
    return cfg;
}

static void test_rope(const char *name)
{
    fixture f;
    fixture_load(&f, name);
    zt_rope_config cfg = rope_config_of(&f);
    int64_t tokens = dim_of(&f, "x", 0), heads = dim_of(&f, "x", 1), n = tokens * heads * cfg.head_dim;
    float *x = fixture_f32(&f, "x", NULL), *y = fixture_f32(&f, "y", NULL);
    float *dy = fixture_f32(&f, "dy", NULL), *dx = fixture_f32(&f, "dx", NULL);
    float *inv_freq = fixture_f32(&f, "inv_freq", NULL);
    int32_t *positions = fixture_i32(&f, "positions", NULL);

    /* The frequencies must equal transformers' bit for bit: they are computed the same way. */
    float *inv_got = poisoned(cfg.head_dim / 2);
    zt_cpu_rope_inv_freq(&cfg, inv_got);
    for (int i = 0; i < cfg.head_dim / 2; i++) {
        if (inv_got[i] != inv_freq[i]) {
            fprintf(stderr, "%s inv_freq[%d] = %.9g, transformers %.9g\n", name, i, inv_got[i],
                    inv_freq[i]);
            ZT_CHECK(inv_got[i] == inv_freq[i]);
        }
    }
    float *y_got[2], *dx_got[2];
    for (int t = 0; t < 2; t++) {
        y_got[t] = poisoned(n);
        zt_cpu_rope_forward(context(t), tokens, heads, cfg.head_dim, positions, inv_got, x, y_got[t]);
        dx_got[t] = poisoned(n);
        zt_cpu_rope_backward(context(t), tokens, heads, cfg.head_dim, positions, inv_got, dy, dx_got[t]);
    }
    /* In place gives the same result. */
    float *inplace = copy_f32(x, n);
    zt_cpu_rope_forward(serial_ctx(), tokens, heads, cfg.head_dim, positions, inv_got, inplace, inplace);
    ZT_CHECK(check_identical_f32("rope in place", inplace, y_got[0], n));
    char label[96];
    snprintf(label, sizeof label, "%s y", name);
    check_pair(label, y_got, y, tokens * heads, cfg.head_dim, RTOL);
    snprintf(label, sizeof label, "%s dx", name);
    check_pair(label, dx_got, dx, tokens * heads, cfg.head_dim, RTOL);
    free(inplace); free(inv_got); free(x); free(y); free(dy); free(dx); free(inv_freq); free(positions);
    fixture_free(&f);
}

static void test_swiglu(void)
{
    fixture f;
    fixture_load(&f, "ops/swiglu");
    int64_t n;
    float *gate = fixture_f32(&f, "gate", &n), *up = fixture_f32(&f, "up", NULL);
    float *h = fixture_f32(&f, "h", NULL), *dh = fixture_f32(&f, "dh", NULL);
    float *dgate = fixture_f32(&f, "dgate", NULL), *dup = fixture_f32(&f, "dup", NULL);
    float *h_got[2], *dg_got[2], *du_got[2];
    for (int t = 0; t < 2; t++) {
        h_got[t] = poisoned(n);
        zt_cpu_swiglu_forward(context(t), n, gate, up, h_got[t]);
        dg_got[t] = poisoned(n);
        du_got[t] = poisoned(n);
        zt_cpu_swiglu_backward(context(t), n, gate, up, dh, dg_got[t], du_got[t]);
    }
    check_pair("swiglu h", h_got, h, 1, n, RTOL);
    check_pair("swiglu dgate", dg_got, dgate, 1, n, RTOL);
    check_pair("swiglu dup", du_got, dup, 1, n, RTOL);
    free(gate); free(up); free(h); free(dh); free(dgate); free(dup);
    fixture_free(&f);
}

static void test_embedding(void)
{
    fixture f;
    fixture_load(&f, "ops/embedding");
    int64_t vocab = dim_of(&f, "table", 0), dim = dim_of(&f, "table", 1), tokens;
    float *table = fixture_f32(&f, "table", NULL), *y = fixture_f32(&f, "y", NULL);
    float *dy = fixture_f32(&f, "dy", NULL), *dtable = fixture_f32(&f, "dtable", NULL);
    float *dtable_init = fixture_f32(&f, "dtable_init", NULL);
    int32_t *ids = fixture_i32(&f, "ids", &tokens);
    float *y_got[2], *dt_got[2];
    for (int t = 0; t < 2; t++) {
        y_got[t] = poisoned(tokens * dim);
        ZT_CHECK_INT(zt_cpu_embedding_forward(context(t), tokens, vocab, dim, ids, table, y_got[t], NULL), ZT_OK);
        dt_got[t] = copy_f32(dtable_init, vocab * dim);
        ZT_CHECK_INT(zt_cpu_embedding_backward(context(t), tokens, vocab, dim, ids, dy, dt_got[t], NULL), ZT_OK);
    }
    check_pair("embedding y", y_got, y, tokens, dim, RTOL);
    check_pair("embedding dtable", dt_got, dtable, vocab, dim, RTOL);

    /* An out-of-range id is reported with its position and nothing is written. */
    int64_t bad = -7;
    ids[5] = (int32_t)vocab;
    float *untouched = copy_f32(dtable_init, vocab * dim);
    ZT_CHECK_INT(zt_cpu_embedding_forward(serial_ctx(), tokens, vocab, dim, ids, table, untouched, &bad),
                 ZT_ERR_INVALID_ARG);
    ZT_CHECK_INT(bad, 5);
    ids[5] = 0;
    ids[9] = -1;
    ZT_CHECK_INT(zt_cpu_embedding_backward(serial_ctx(), tokens, vocab, dim, ids, dy, untouched, &bad),
                 ZT_ERR_INVALID_ARG);
    ZT_CHECK_INT(bad, 9);
    ZT_CHECK(memcmp(untouched, dtable_init, sizeof(float) * (size_t)(vocab * dim)) == 0);
    free(untouched); free(table); free(y); free(dy); free(dtable); free(dtable_init); free(ids);
    fixture_free(&f);
}

static void test_attention(const char *name)
{
    fixture f;
    fixture_load(&f, name);
    zt_attention_shape s = {
        .batch = (int64_t)fixture_number(&f, "batch"), .seq = (int64_t)fixture_number(&f, "seq"),
        .heads = (int64_t)fixture_number(&f, "heads"),
        .kv_heads = (int64_t)fixture_number(&f, "kv_heads"),
        .head_dim = (int64_t)fixture_number(&f, "head_dim"),
        .scale = (float)fixture_number(&f, "scale")};
    int64_t nq = s.batch * s.seq * s.heads * s.head_dim, nkv = s.batch * s.seq * s.kv_heads * s.head_dim;
    int64_t nlse = s.batch * s.heads * s.seq;
    float *q = fixture_f32(&f, "q", NULL), *k = fixture_f32(&f, "k", NULL), *v = fixture_f32(&f, "v", NULL);
    float *o = fixture_f32(&f, "o", NULL), *lse = fixture_f32(&f, "lse", NULL);
    float *dout = fixture_f32(&f, "do", NULL), *dq = fixture_f32(&f, "dq", NULL);
    float *dk = fixture_f32(&f, "dk", NULL), *dv = fixture_f32(&f, "dv", NULL);
    int32_t *doc = ref_st_find(&f.tensors, "doc_ids") ? fixture_i32(&f, "doc_ids", NULL) : NULL;
    float *o_got[2], *lse_got[2], *dq_got[2], *dk_got[2], *dv_got[2];
    for (int t = 0; t < 2; t++) {
        o_got[t] = poisoned(nq);
        lse_got[t] = poisoned(nlse);
        zt_cpu_attention_forward(context(t), &s, q, k, v, doc, o_got[t], lse_got[t]);
        dq_got[t] = poisoned(nq);
        dk_got[t] = poisoned(nkv);
        dv_got[t] = poisoned(nkv);
        zt_cpu_attention_backward(context(t), &s, q, k, v, doc, o_got[t], lse_got[t], dout,
                                  dq_got[t], dk_got[t], dv_got[t]);
    }
    char label[96];
    const char *parts[] = {"o", "lse", "dq", "dk", "dv"};
    float **got[] = {o_got, lse_got, dq_got, dk_got, dv_got};
    const float *want[] = {o, lse, dq, dk, dv};
    int64_t sizes[] = {nq, nlse, nq, nkv, nkv};
    int64_t row_len[] = {s.head_dim, s.seq, s.head_dim, s.head_dim, s.head_dim};
    /* The gradients go through dS = P (dO.V - dO.O), a difference of O(1) terms that can be
     * hundreds of times smaller than them (e.g. a query seeing two nearly equal keys): there
     * 1e-5 of the row is below fp32 resolution, so the backward is held to 1e-4. */
    for (int i = 0; i < 5; i++) {
        snprintf(label, sizeof label, "%s %s", name, parts[i]);
        check_pair(label, got[i], want[i], sizes[i] / row_len[i], row_len[i], i < 2 ? RTOL : 1e-4);
    }
    free(q); free(k); free(v); free(o); free(lse); free(dout); free(dq); free(dk); free(dv); free(doc);
    fixture_free(&f);
}

/* Uniform in [-0.5, 0.5), reproducible. */
static void fill_random(float *x, int64_t n, uint32_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
}

/* Head dimensions above 128 take a path no fixture reaches (attention.c transposes the queries in
 * slices of 128): a fixture-free check against a double-precision evaluation of the definitions,
 * with GQA, a packed-document mask, T not a multiple of 8 and D = 140 (a partial vector too). */
static void test_attention_long_head(void)
{
    zt_attention_shape s = {.batch = 2, .seq = 19, .heads = 4, .kv_heads = 2, .head_dim = 140};
    s.scale = 1.0f / sqrtf((float)s.head_dim);
    int64_t B = s.batch, T = s.seq, H = s.heads, Hkv = s.kv_heads, D = s.head_dim;
    int64_t nq = B * T * H * D, nkv = B * T * Hkv * D, nlse = B * H * T;
    float *q = malloc(sizeof(float) * (size_t)nq), *dout = malloc(sizeof(float) * (size_t)nq);
    float *k = malloc(sizeof(float) * (size_t)nkv), *v = malloc(sizeof(float) * (size_t)nkv);
    fill_random(q, nq, 11);
    fill_random(dout, nq, 12);
    fill_random(k, nkv, 13);
    fill_random(v, nkv, 14);
    for (int64_t i = 0; i < nq; i++) q[i] *= 4.0f; /* scores of a few units: a peaked softmax */
    int32_t doc[2 * 19];
    for (int64_t t = 0; t < T; t++) {
        doc[t] = 0;
        doc[T + t] = t < 9 ? 0 : 1; /* the second sequence packs two documents */
    }
    double *o = calloc((size_t)nq, sizeof(double)), *lse = calloc((size_t)nlse, sizeof(double));
    double *dq = calloc((size_t)nq, sizeof(double)), *dk = calloc((size_t)nkv, sizeof(double));
    double *dv = calloc((size_t)nkv, sizeof(double)), *p = calloc((size_t)T, sizeof(double));
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            int64_t hk = h / (H / Hkv);
            for (int64_t i = 0; i < T; i++) {
                const float *qi = q + ((b * T + i) * H + h) * D, *doi = dout + ((b * T + i) * H + h) * D;
                double *oi = o + ((b * T + i) * H + h) * D, *dqi = dq + ((b * T + i) * H + h) * D;
                double max = -INFINITY, sum = 0.0, d_i = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    p[j] = NAN; /* masked */
                    if (doc[b * T + j] != doc[b * T + i]) continue;
                    const float *kj = k + ((b * T + j) * Hkv + hk) * D;
                    double dot = 0.0;
                    for (int64_t d = 0; d < D; d++) dot += (double)qi[d] * kj[d];
                    p[j] = dot * s.scale;
                    max = p[j] > max ? p[j] : max;
                }
                for (int64_t j = 0; j <= i; j++)
                    if (!isnan(p[j])) sum += exp(p[j] - max);
                lse[(b * H + h) * T + i] = max + log(sum);
                for (int64_t j = 0; j <= i; j++) {
                    if (isnan(p[j])) continue;
                    p[j] = exp(p[j] - lse[(b * H + h) * T + i]);
                    const float *vj = v + ((b * T + j) * Hkv + hk) * D;
                    for (int64_t d = 0; d < D; d++) oi[d] += p[j] * vj[d];
                }
                for (int64_t d = 0; d < D; d++) d_i += doi[d] * oi[d];
                for (int64_t j = 0; j <= i; j++) {
                    if (isnan(p[j])) continue;
                    const float *kj = k + ((b * T + j) * Hkv + hk) * D, *vj = v + ((b * T + j) * Hkv + hk) * D;
                    double *dkj = dk + ((b * T + j) * Hkv + hk) * D, *dvj = dv + ((b * T + j) * Hkv + hk) * D;
                    double dp = 0.0;
                    for (int64_t d = 0; d < D; d++) dp += (double)doi[d] * vj[d];
                    double ds = p[j] * (dp - d_i) * s.scale;
                    for (int64_t d = 0; d < D; d++) {
                        dqi[d] += ds * kj[d];
                        dkj[d] += ds * qi[d];
                        dvj[d] += p[j] * doi[d];
                    }
                }
            }
        }
    }
    float *o_got[2], *lse_got[2], *dq_got[2], *dk_got[2], *dv_got[2];
    for (int t = 0; t < 2; t++) {
        o_got[t] = poisoned(nq);
        lse_got[t] = poisoned(nlse);
        zt_cpu_attention_forward(context(t), &s, q, k, v, doc, o_got[t], lse_got[t]);
        dq_got[t] = poisoned(nq);
        dk_got[t] = poisoned(nkv);
        dv_got[t] = poisoned(nkv);
        zt_cpu_attention_backward(context(t), &s, q, k, v, doc, o_got[t], lse_got[t], dout,
                                  dq_got[t], dk_got[t], dv_got[t]);
    }
    const char *parts[] = {"o", "lse", "dq", "dk", "dv"};
    float **got[] = {o_got, lse_got, dq_got, dk_got, dv_got};
    double *want[] = {o, lse, dq, dk, dv};
    int64_t sizes[] = {nq, nlse, nq, nkv, nkv};
    int64_t row_len[] = {D, T, D, D, D};
    for (int i = 0; i < 5; i++) {
        float *want_f32 = malloc(sizeof(float) * (size_t)sizes[i]);
        for (int64_t e = 0; e < sizes[i]; e++) want_f32[e] = (float)want[i][e];
        char label[96];
        snprintf(label, sizeof label, "attention D=140 %s", parts[i]);
        /* backward held to 1e-4 as in test_attention (dS is a difference of O(1) terms) */
        check_pair(label, got[i], want_f32, sizes[i] / row_len[i], row_len[i], i < 2 ? RTOL : 1e-4);
        free(want_f32);
        free(want[i]);
    }
    free(p); free(q); free(k); free(v); free(dout);
}

static void test_cross_entropy(void)
{
    fixture f;
    fixture_load(&f, "ops/cross_entropy");
    int64_t rows = dim_of(&f, "logits", 0), vocab = dim_of(&f, "logits", 1), n = rows * vocab;
    float *logits = fixture_f32(&f, "logits", NULL), *dlogits = fixture_f32(&f, "dlogits", NULL);
    float *row_loss = fixture_f32(&f, "row_loss", NULL);
    int32_t *targets = fixture_i32(&f, "targets", NULL);
    double normalizer = fixture_number(&f, "normalizer"), loss = fixture_number(&f, "loss");
    float dloss = (float)fixture_number(&f, "dloss");
    float *dl_got[2], *rl_got[2];
    for (int t = 0; t < 2; t++) {
        double loss_got = NAN;
        dl_got[t] = poisoned(n);
        rl_got[t] = poisoned(rows);
        ZT_CHECK_INT(zt_cpu_cross_entropy(context(t), rows, vocab, logits, targets, normalizer, dloss,
                                          rl_got[t], &loss_got, dl_got[t], NULL), ZT_OK);
        ZT_CHECK_CLOSE(loss_got, loss, RTOL, 0.0);
    }
    check_pair("cross_entropy row_loss", rl_got, row_loss, 1, rows, RTOL);
    check_pair("cross_entropy dlogits", dl_got, dlogits, rows, vocab, RTOL);

    /* Forward only (no dlogits), and in place (dlogits == logits) give the same. */
    double loss_fwd = NAN;
    float *rl = poisoned(rows), *inplace = copy_f32(logits, n);
    ZT_CHECK_INT(zt_cpu_cross_entropy(serial_ctx(), rows, vocab, logits, targets, normalizer, dloss, rl,
                                      &loss_fwd, NULL, NULL), ZT_OK);
    ZT_CHECK_CLOSE(loss_fwd, loss, RTOL, 0.0);
    ZT_CHECK(check_close_f32("cross_entropy row_loss, forward only", rl, row_loss, rows, RTOL));
    ZT_CHECK_INT(zt_cpu_cross_entropy(serial_ctx(), rows, vocab, inplace, targets, normalizer, dloss, rl,
                                      &loss_fwd, inplace, NULL), ZT_OK);
    ZT_CHECK(check_close_rows("cross_entropy dlogits in place", inplace, dlogits, rows, vocab, RTOL));

    /* Bad targets and normalizers are reported, not read out of bounds. */
    int64_t bad = -7;
    targets[3] = (int32_t)vocab;
    ZT_CHECK_INT(zt_cpu_cross_entropy(serial_ctx(), rows, vocab, logits, targets, normalizer, dloss, rl,
                                      &loss_fwd, NULL, &bad), ZT_ERR_INVALID_ARG);
    ZT_CHECK_INT(bad, 3);
    targets[3] = -1; /* negative but not the ignore index */
    ZT_CHECK_INT(zt_cpu_cross_entropy(serial_ctx(), rows, vocab, logits, targets, normalizer, dloss, rl,
                                      &loss_fwd, NULL, &bad), ZT_ERR_INVALID_ARG);
    ZT_CHECK_INT(bad, 3);
    targets[3] = 0;
    ZT_CHECK_INT(zt_cpu_cross_entropy(serial_ctx(), rows, vocab, logits, targets, 0.0, dloss, rl,
                                      &loss_fwd, NULL, &bad), ZT_ERR_INVALID_ARG);
    ZT_CHECK_INT(bad, -1);
    free(rl); free(inplace); free(logits); free(dlogits); free(row_loss); free(targets);
    fixture_free(&f);
}

static void test_matmul(const char *name)
{
    fixture f;
    fixture_load(&f, name);
    int64_t m = (int64_t)fixture_number(&f, "m"), n = (int64_t)fixture_number(&f, "n");
    int64_t k = (int64_t)fixture_number(&f, "k");
    float *x = fixture_f32(&f, "x", NULL), *w = fixture_f32(&f, "w", NULL), *y = fixture_f32(&f, "y", NULL);
    float *dy = fixture_f32(&f, "dy", NULL), *dx = fixture_f32(&f, "dx", NULL);
    float *dw_init = fixture_f32(&f, "dw_init", NULL), *dw = fixture_f32(&f, "dw", NULL);
    float *y_got[3], *dx_got[3], *dw_got[3];
    for (int t = 0; t < 3; t++) {
        y_got[t] = poisoned(m * n);
        ZT_CHECK_INT(zt_cpu_linear_forward(context(t), m, n, k, x, w, y_got[t]), ZT_OK);
        dx_got[t] = poisoned(m * k);
        ZT_CHECK_INT(zt_cpu_linear_backward_input(context(t), m, n, k, dy, w, dx_got[t]), ZT_OK);
        dw_got[t] = copy_f32(dw_init, n * k);
        ZT_CHECK_INT(zt_cpu_linear_backward_weight(context(t), m, n, k, dy, x, dw_got[t]), ZT_OK);
    }
    char label[96];
    snprintf(label, sizeof label, "%s y", name);
    check_runs(label, y_got, 3, y, m, n, RTOL);
    snprintf(label, sizeof label, "%s dx", name);
    check_runs(label, dx_got, 3, dx, m, k, RTOL);
    snprintf(label, sizeof label, "%s dw", name);
    check_runs(label, dw_got, 3, dw, n, k, RTOL);
    free(x); free(w); free(y); free(dy); free(dx); free(dw_init); free(dw);
    fixture_free(&f);
}

/* ---- generic GEMM against a double-precision triple loop ------------------------------------- */

static void test_gemm_case(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, int accumulate,
                           int64_t pad)
{
    /* Leading dimensions larger than the logical width (pad) check that strides are honoured. */
    int64_t lda = (trans_a ? M : K) + pad, ldb = (trans_b ? K : N) + pad, ldc = N + pad;
    int64_t a_rows = trans_a ? K : M, b_rows = trans_b ? N : K;
    float *A = malloc(sizeof(float) * (size_t)(a_rows * lda + 1));
    float *B = malloc(sizeof(float) * (size_t)(b_rows * ldb + 1));
    float *C0 = malloc(sizeof(float) * (size_t)(M * ldc + 1));
    fill_random(A, a_rows * lda, 1);
    fill_random(B, b_rows * ldb, 2);
    fill_random(C0, M * ldc, 3);
    float *want = malloc(sizeof(float) * (size_t)(M * ldc + 1));
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double acc = accumulate ? C0[i * ldc + j] : 0.0;
            for (int64_t p = 0; p < K; p++) {
                double a = trans_a ? A[p * lda + i] : A[i * lda + p];
                double b = trans_b ? B[j * ldb + p] : B[p * ldb + j];
                acc += a * b;
            }
            want[i * ldc + j] = (float)acc;
        }
    }
    float *got[3];
    for (int t = 0; t < 3; t++) {
        got[t] = copy_f32(C0, M * ldc);
        ZT_CHECK_INT(zt_cpu_gemm(context(t), trans_a, trans_b, M, N, K, A, lda, B, ldb, got[t], ldc,
                                 accumulate), ZT_OK);
    }
    /* Padding columns of C must be left alone: compare them to the original. */
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < ldc; j++) want[i * ldc + j] = C0[i * ldc + j];
    char label[128];
    snprintf(label, sizeof label, "gemm %c%c M=%lld N=%lld K=%lld acc=%d pad=%lld", trans_a ? 'T' : 'N',
             trans_b ? 'T' : 'N', (long long)M, (long long)N, (long long)K, accumulate, (long long)pad);
    check_runs(label, got, 3, want, M, ldc, RTOL);
    free(A); free(B); free(C0); free(want);
}

static void test_gemm(void)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int acc = 0; acc < 2; acc++) test_gemm_case(ta, tb, 29, 37, 23, acc, 3);
    test_gemm_case(0, 1, 67, 1100, 40, 0, 0); /* two packed column blocks, partial tiles */
    test_gemm_case(0, 1, 100, 80, 50, 1, 0);  /* 48-row tiles, 12- and 6-row register tiles */
    test_gemm_case(1, 0, 13, 21, 600, 1, 1);  /* three depth slices */
    test_gemm_case(1, 0, 4100, 20, 300, 1, 0); /* three packed A blocks of 1368 rows, the last shorter */
    test_gemm_case(0, 1, 4100, 20, 300, 0, 1);
    test_gemm_case(0, 0, 1, 1, 1, 0, 0);
    test_gemm_case(0, 1, 5, 7, 0, 0, 2);      /* K = 0: C = 0 ... */
    test_gemm_case(0, 1, 5, 7, 0, 1, 2);      /* ... or C unchanged */
}

static void test_adamw(void)
{
    fixture f;
    fixture_load(&f, "ops/adamw");
    int64_t n, steps = (int64_t)fixture_number(&f, "steps");
    float *p0 = fixture_f32(&f, "p0", &n), *grads = fixture_f32(&f, "grads", NULL);
    float *p = fixture_f32(&f, "p", NULL), *m = fixture_f32(&f, "m", NULL), *v = fixture_f32(&f, "v", NULL);
    zt_adamw_params hp = {.lr = fixture_number(&f, "lr"), .beta1 = fixture_number(&f, "beta1"),
                          .beta2 = fixture_number(&f, "beta2"), .eps = fixture_number(&f, "eps"),
                          .weight_decay = fixture_number(&f, "weight_decay")};
    float *p_got[2], *m_got[2], *v_got[2];
    for (int t = 0; t < 2; t++) {
        p_got[t] = copy_f32(p0, n);
        m_got[t] = calloc((size_t)n, sizeof(float));
        v_got[t] = calloc((size_t)n, sizeof(float));
        for (int64_t s = 0; s < steps; s++) {
            hp.step = s + 1;
            zt_cpu_adamw_step(context(t), n, &hp, p_got[t], grads + s * n, m_got[t], v_got[t]);
        }
    }
    check_pair("adamw p", p_got, p, 1, n, RTOL);
    check_pair("adamw m", m_got, m, 1, n, RTOL);
    check_pair("adamw v", v_got, v, 1, n, RTOL);
    free(p0); free(grads); free(p); free(m); free(v);
    fixture_free(&f);
}

static void test_global_norm(void)
{
    fixture f;
    fixture_load(&f, "ops/global_norm");
    const char *names[3] = {"t0", "t1", "t2"}, *clipped_names[3] = {"clipped_t0", "clipped_t1", "clipped_t2"};
    float *tensors[3], *clipped[3];
    int64_t sizes[3];
    for (int i = 0; i < 3; i++) {
        tensors[i] = fixture_f32(&f, names[i], &sizes[i]);
        clipped[i] = fixture_f32(&f, clipped_names[i], NULL);
    }
    double norm = fixture_number(&f, "norm"), clip_coef = fixture_number(&f, "clip_coef");
    for (int t = 0; t < 2; t++) {
        double got = zt_cpu_global_l2_norm(context(t), 3, (const float *const *)tensors, sizes);
        ZT_CHECK_CLOSE(got, norm, 1e-12, 0.0); /* double accumulation: as exact as the reference */
    }
    for (int i = 0; i < 3; i++) {
        float *got[2] = {copy_f32(tensors[i], sizes[i]), copy_f32(tensors[i], sizes[i])};
        for (int t = 0; t < 2; t++) zt_cpu_scale(context(t), sizes[i], (float)clip_coef, got[t]);
        check_pair(clipped_names[i], got, clipped[i], 1, sizes[i], RTOL);
        free(tensors[i]);
        free(clipped[i]);
    }
    fixture_free(&f);
}

/* The kernels' vectorized exp (softmax, cross-entropy, SiLU) against double-precision exp: at most
 * 2 ulp (1.2e-7 relative) over the whole unclamped range, and the documented clamping. */
static void test_exp(void)
{
    double worst = 0.0;
    float worst_x = 0.0f, lanes[8];
    for (float x = -87.0f; x <= 88.0f; x += 0.0007f) {
        zt_v8_store(lanes, zt_v8_exp(zt_v8_splat(x)));
        double want = exp((double)x), err = fabs(lanes[5] - want) / want;
        if (err > worst) {
            worst = err;
            worst_x = x;
        }
    }
    if (worst > 1.2e-7) fprintf(stderr, "exp: relative error %.3g at x = %.9g\n", worst, worst_x);
    ZT_CHECK(worst <= 1.2e-7);
    float special[8] = {NAN, -INFINITY, -1000.0f, -87.5f, 0.0f, 88.5f, 1000.0f, INFINITY};
    zt_v8_store(lanes, zt_v8_exp(zt_v8_load(special)));
    ZT_CHECK(isnan(lanes[0]));
    for (int i = 1; i <= 3; i++) ZT_CHECK(lanes[i] > 0.0f && lanes[i] < 1.7e-38f); /* exp(-87) */
    ZT_CHECK(lanes[4] == 1.0f);
    for (int i = 5; i <= 7; i++) ZT_CHECK(lanes[i] > 1.6e38f && isfinite(lanes[i])); /* exp(88) */

    /* zt_exp_shifted: every length (vector body and tail), values and their sum. */
    float x[21], y[21];
    fill_random(x, 21, 6);
    for (int64_t n = 1; n <= 21; n++) {
        double want_sum = 0.0;
        float sum = zt_exp_shifted(x, 0.25f, y, n);
        for (int64_t i = 0; i < n; i++) {
            double want = exp((double)x[i] - 0.25);
            want_sum += want;
            ZT_CHECK_CLOSE(y[i], want, 1.2e-7, 0.0);
        }
        ZT_CHECK_CLOSE(sum, want_sum, 1e-6, 0.0);
    }
}

static void test_add(void)
{
    float x[37], y[37], want[37];
    fill_random(x, 37, 4);
    fill_random(y, 37, 5);
    for (int i = 0; i < 37; i++) want[i] = y[i] + x[i];
    zt_cpu_add(threaded_ctx(), 37, x, y);
    ZT_CHECK(memcmp(y, want, sizeof y) == 0);
}

/* Reference for zt_cpu_to_bf16, by another route than the kernel's bit trick: of the two bf16 values
 * around x (x's top 16 bits, and the next one up), take the nearer in double arithmetic, the one with
 * an even last bit on a tie; one past the largest finite value stands for 2^128 (IEEE rounds to
 * infinity from half an ulp above the largest bf16). */
static uint16_t bf16_reference(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if (isnan(x)) return 0; /* checked apart: any quiet NaN */
    uint32_t mag = bits & 0x7fffffffu, sign = bits & 0x80000000u;
    if (mag == 0x7f800000u) return (uint16_t)(bits >> 16);
    uint32_t lo = mag & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, sizeof flo);
    memcpy(&fhi, &hi, sizeof fhi);
    double dlo = flo, dhi = hi == 0x7f800000u ? ldexp(1.0, 128) : (double)fhi, dx = fabsf(x);
    uint32_t pick = dx - dlo < dhi - dx ? lo : dx - dlo > dhi - dx ? hi : ((lo >> 16) & 1u) ? hi : lo;
    return (uint16_t)((sign | pick) >> 16);
}

static void test_to_bf16(void)
{
    enum { N = 200003 };
    float *x = malloc(N * sizeof *x);
    uint16_t *got = malloc(N * sizeof *got);
    ZT_CHECK(x && got);
    if (!x || !got) return;
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) { /* random bit patterns: every exponent, subnormals, NaNs, infinities */
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t bits = (uint32_t)(state >> 32);
        memcpy(&x[i], &bits, sizeof bits);
    }
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu,
                                0x7f7fffffu, 0x7f7f7fffu, 0x7f7f8000u, 0xff7fffffu, 0x7f800000u, 0xff800000u,
                                0x7fc00000u, 0x7f800001u, 0x00008000u, 0x00018000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) memcpy(&x[i], &special[i], 4);
    zt_cpu_to_bf16(threaded_ctx(), N, x, got);
    int bad = 0;
    for (int i = 0; i < N && bad < 5; i++) {
        int ok = isnan(x[i]) ? (got[i] & 0x7f80u) == 0x7f80u && (got[i] & 0x007fu) != 0 && (got[i] & 0x40u)
                             : got[i] == bf16_reference(x[i]);
        if (!ok) {
            uint32_t bits;
            memcpy(&bits, &x[i], 4);
            printf("  bf16 of 0x%08x: got 0x%04x, want 0x%04x\n", bits, got[i], bf16_reference(x[i]));
            bad++;
        }
    }
    ZT_CHECK(bad == 0);
    free(x);
    free(got);
}

/* zt_cpu_to_f16 against the compiler's own fp32 -> _Float16 conversion (IEEE round to nearest even,
 * subnormals, overflow to infinity), where the compiler has that type; NaNs must stay quiet NaNs. */
static void test_to_f16(void)
{
#ifdef __FLT16_MAX__
    enum { N = 200003 };
    float *x = malloc(N * sizeof *x);
    uint16_t *got = malloc(N * sizeof *got);
    ZT_CHECK(x && got);
    if (!x || !got) return;
    uint64_t state = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < N; i++) { /* random bit patterns, then values around fp16's range */
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t bits = (uint32_t)(state >> 32);
        if (i % 2) bits = (bits & 0x80ffffffu) | ((uint32_t)(96 + (bits >> 24) % 48) << 23); /* 2^-31 .. 2^16 */
        memcpy(&x[i], &bits, sizeof bits);
    }
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f800000u, 0x477fe000u, 0x477fefffu, 0x477ff000u,
                                0x47800000u, 0x33000000u, 0x33000001u, 0x387fc000u, 0x38800000u, 0x7f800000u,
                                0xff800000u, 0x7fc00000u, 0x7f800001u, 0x3f801000u, 0x3f803000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) memcpy(&x[i], &special[i], 4);
    zt_cpu_to_f16(threaded_ctx(), N, x, got);
    int bad = 0;
    for (int i = 0; i < N && bad < 5; i++) {
        _Float16 h = (_Float16)x[i];
        uint16_t want;
        memcpy(&want, &h, sizeof want);
        int ok = isnan(x[i]) ? (got[i] & 0x7c00u) == 0x7c00u && (got[i] & 0x0200u) : got[i] == want;
        if (!ok) {
            uint32_t bits;
            memcpy(&bits, &x[i], 4);
            printf("  f16 of 0x%08x: got 0x%04x, want 0x%04x\n", bits, got[i], want);
            bad++;
        }
    }
    ZT_CHECK(bad == 0);
    free(x);
    free(got);
#else
    printf("  note: this compiler has no _Float16; zt_cpu_to_f16 is checked only by the GPU tests\n");
#endif
}

int main(void)
{
    test_rmsnorm();
    test_rope("ops/rope_default");
    test_rope("ops/rope_llama3");
    test_swiglu();
    test_embedding();
    test_attention("ops/attention_gqa_causal");
    test_attention("ops/attention_mqa_packed");
    test_attention("ops/attention_mha_long");
    test_attention_long_head();
    test_cross_entropy();
    test_matmul("ops/matmul_small");
    test_matmul("ops/matmul_wide");
    test_matmul("ops/matmul_deep");
    test_gemm();
    test_adamw();
    test_global_norm();
    test_exp();
    test_add();
    test_to_bf16();
    test_to_f16();
    test_contexts_free();
    return zt_test_result();
}
