/* The fused forms the llama plugin's CUDA path uses (docs/cuda.md, "Fused q/k/v and gate/up"),
 * against the fp32 CPU kernels on the same bf16 inputs: rope on a stacked [tokens, q|k|v] array and
 * its transpose into a stacked gradient, SwiGLU on row-strided gate|up blocks, the residual add as a
 * GEMM epilogue, and the whole q|k|v and gate|up chains of a layer (one GEMM over stacked weights,
 * then the fused kernel; backward one dX and one dW GEMM) against the separate CPU products. GPU
 * outputs are poisoned with NaN before every run (device_alloc), so an element a kernel forgets
 * fails; padding a kernel must not touch is checked to stay NaN. Everything runs in bf16, then in
 * fp16 (fp16.enabled's kernels). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_test.h"
#include "ztest.h"

/* Copies the [rows, cols] block at column `col` of a matrix with row stride ld. */
static float *block_of(const float *x, int64_t rows, int64_t cols, int64_t col, int64_t ld)
{
    float *out = host_f32(rows * cols);
    for (int64_t r = 0; r < rows; r++) memcpy(out + r * cols, x + r * ld + col, sizeof(float) * (size_t)cols);
    return out;
}

/* Writes the [rows, cols] block src at column `col` of dst (row stride ld). */
static void put_block(float *dst, int64_t ld, int64_t col, const float *src, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * ld + col, src + r * cols, sizeof(float) * (size_t)cols);
}

static float *difference(const float *a, const float *b, int64_t n)
{
    float *d = host_f32(n);
    for (int64_t i = 0; i < n; i++) d[i] = a[i] - b[i];
    return d;
}

/* Every element of the [rows, cols) .. ld padding columns is still NaN. */
static int padding_untouched(const char *what, const float *x, int64_t rows, int64_t cols, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = cols; c < ld; c++)
            if (!isnan(x[r * ld + c])) {
                printf("%s: padding element [%lld, %lld] was written (%g): FAIL\n", what, (long long)r, (long long)c,
                       (double)x[r * ld + c]);
                return 0;
            }
    printf("%s: padding untouched\n", what);
    return 1;
}

static int32_t *random_positions(int64_t tokens)
{
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)tokens);
    for (int64_t t = 0; t < tokens; t++) pos[t] = test_randint(0, 8192); /* large angles too */
    return pos;
}

/* ---- rope on stacked q|k|v ------------------------------------------------------------------- */

static void test_rope_qkv_config(zt_cuda_ctx *ctx, const zt_rope_config *cfg, int64_t T, int64_t heads,
                                 int64_t kv_heads)
{
    int64_t D = cfg->head_dim, Q = heads * D, KV = kv_heads * D, L = Q + 2 * KV;
    char name[160];
    float *inv_freq = host_f32(D / 2);
    zt_cpu_rope_inv_freq(cfg, inv_freq);
    int32_t *pos = random_positions(T);
    float *d_freq = device_f32(inv_freq, D / 2);
    int32_t *d_pos = device_i32(pos, T);

    /* forward: CPU rope on the q and k blocks, v as is */
    float *qkv = random_bf16_values(T * L, 1.0f);
    float *q_in = block_of(qkv, T, Q, 0, L), *k_in = block_of(qkv, T, KV, Q, L), *v_in = block_of(qkv, T, KV, Q + KV, L);
    float *q_ref = host_f32(T * Q), *k_ref = host_f32(T * KV);
    zt_cpu_rope_forward(NULL, T, heads, D, pos, inv_freq, q_in, q_ref);
    zt_cpu_rope_forward(NULL, T, kv_heads, D, pos, inv_freq, k_in, k_ref);
    uint16_t *d_qkv = device_bf16(qkv, T * L);
    uint16_t *d_q = device_alloc((uint64_t)(T * Q) * 2), *d_k = device_alloc((uint64_t)(T * KV) * 2);
    uint16_t *d_v = device_alloc((uint64_t)(T * KV) * 2);
    snprintf(name, sizeof name, "rope q|k|v forward D=%lld heads=%lld kv=%lld", (long long)D, (long long)heads,
             (long long)kv_heads);
    ZT_CHECK(check_ok(name, zt_cuda_rope_qkv_forward(ctx, 0, T, heads, kv_heads, D, d_pos, d_freq, d_qkv, d_q, d_k, d_v)));
    float *g_q = download_bf16(d_q, T * Q), *g_k = download_bf16(d_k, T * KV), *g_v = download_bf16(d_v, T * KV);
    ZT_CHECK(check_rel_l2("  q", g_q, q_ref, T * Q, TOL_BF16_OUT));
    ZT_CHECK(check_rel_l2("  k", g_k, k_ref, T * KV, TOL_BF16_OUT));
    ZT_CHECK(check_identical("  v (copied)", g_v, v_in, T * KV));

    /* backward: the transposed rotation of dq, dk and dv as is, into one stacked dqkv */
    float *dq = random_bf16_values(T * Q, 1.0f), *dk = random_bf16_values(T * KV, 1.0f);
    float *dv = random_bf16_values(T * KV, 1.0f);
    float *dq_ref = host_f32(T * Q), *dk_ref = host_f32(T * KV), *dqkv_ref = host_f32(T * L);
    zt_cpu_rope_backward(NULL, T, heads, D, pos, inv_freq, dq, dq_ref);
    zt_cpu_rope_backward(NULL, T, kv_heads, D, pos, inv_freq, dk, dk_ref);
    put_block(dqkv_ref, L, 0, dq_ref, T, Q);
    put_block(dqkv_ref, L, Q, dk_ref, T, KV);
    put_block(dqkv_ref, L, Q + KV, dv, T, KV);
    uint16_t *d_dq = device_bf16(dq, T * Q), *d_dk = device_bf16(dk, T * KV), *d_dv = device_bf16(dv, T * KV);
    uint16_t *d_dqkv = device_alloc((uint64_t)(T * L) * 2);
    snprintf(name, sizeof name, "rope q|k|v backward D=%lld heads=%lld kv=%lld", (long long)D, (long long)heads,
             (long long)kv_heads);
    ZT_CHECK(check_ok(name, zt_cuda_rope_qkv_backward(ctx, 0, T, heads, kv_heads, D, d_pos, d_freq, d_dq, d_dk, d_dv,
                                                      d_dqkv)));
    float *g_dqkv = download_bf16(d_dqkv, T * L);
    ZT_CHECK(check_rel_l2("  dqkv (every element: poisoned before)", g_dqkv, dqkv_ref, T * L, TOL_BF16_OUT));
    float *g_dv = block_of(g_dqkv, T, KV, Q + KV, L);
    ZT_CHECK(check_identical("  dv block (copied)", g_dv, dv, T * KV));

    free(inv_freq), free(pos), free(qkv), free(q_in), free(k_in), free(v_in), free(q_ref), free(k_ref);
    free(g_q), free(g_k), free(g_v), free(dq), free(dk), free(dv), free(dq_ref), free(dk_ref), free(dqkv_ref);
    free(g_dqkv), free(g_dv);
    device_free(d_freq), device_free(d_pos), device_free(d_qkv), device_free(d_q), device_free(d_k);
    device_free(d_v), device_free(d_dq), device_free(d_dk), device_free(d_dv), device_free(d_dqkv);
}

/* The plain rope on head sizes that take the scalar path (D % 16 != 0) and the smallest vector one. */
static void test_rope_plain(zt_cuda_ctx *ctx, int64_t D, int64_t T, int64_t heads)
{
    zt_rope_config cfg = {.rope_type = ZT_ROPE_DEFAULT, .head_dim = (int32_t)D, .theta = 10000.0};
    int64_t n = T * heads * D;
    char name[96];
    float *inv_freq = host_f32(D / 2);
    zt_cpu_rope_inv_freq(&cfg, inv_freq);
    int32_t *pos = random_positions(T);
    float *x = random_bf16_values(n, 1.0f), *y = host_f32(n), *dx = host_f32(n);
    zt_cpu_rope_forward(NULL, T, heads, D, pos, inv_freq, x, y);
    zt_cpu_rope_backward(NULL, T, heads, D, pos, inv_freq, x, dx);
    float *d_freq = device_f32(inv_freq, D / 2);
    int32_t *d_pos = device_i32(pos, T);
    uint16_t *d_x = device_bf16(x, n), *d_y = device_alloc((uint64_t)n * 2);
    snprintf(name, sizeof name, "rope forward D=%lld", (long long)D);
    ZT_CHECK(check_ok(name, zt_cuda_rope_forward(ctx, 0, T, heads, D, d_pos, d_freq, d_x, d_y)));
    float *g = download_bf16(d_y, n);
    ZT_CHECK(check_rel_l2(name, g, y, n, TOL_BF16_OUT));
    free(g);
    snprintf(name, sizeof name, "rope backward in place D=%lld", (long long)D);
    ZT_CHECK(check_ok(name, zt_cuda_rope_backward(ctx, 0, T, heads, D, d_pos, d_freq, d_x, d_x)));
    g = download_bf16(d_x, n);
    ZT_CHECK(check_rel_l2(name, g, dx, n, TOL_BF16_OUT));
    free(g), free(inv_freq), free(pos), free(x), free(y), free(dx);
    device_free(d_freq), device_free(d_pos), device_free(d_x), device_free(d_y);
}

static void test_rope_qkv(zt_cuda_ctx *ctx)
{
    zt_rope_config llama3 = {.rope_type = ZT_ROPE_LLAMA3, .head_dim = 128, .theta = 500000.0,
                             .factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                             .original_max_position_embeddings = 8192.0};
    zt_rope_config d64 = {.rope_type = ZT_ROPE_DEFAULT, .head_dim = 64, .theta = 10000.0};
    zt_rope_config d12 = {.rope_type = ZT_ROPE_DEFAULT, .head_dim = 12, .theta = 10000.0};
    zt_rope_config d16 = {.rope_type = ZT_ROPE_DEFAULT, .head_dim = 16, .theta = 10000.0};
    test_rope_qkv_config(ctx, &llama3, 301, 8, 2); /* GQA, the vector path */
    test_rope_qkv_config(ctx, &d64, 130, 4, 4);    /* MHA */
    test_rope_qkv_config(ctx, &d64, 77, 6, 1);     /* MQA */
    test_rope_qkv_config(ctx, &d16, 50, 4, 2);     /* one 8-element vector per half-head */
    test_rope_qkv_config(ctx, &d12, 65, 4, 2);     /* the scalar path (rows of 24 and 48 elements) */
    test_rope_plain(ctx, 12, 70, 3);
    test_rope_plain(ctx, 16, 70, 3);
    test_rope_plain(ctx, 96, 33, 5);
    void *p = device_alloc(4096);
    ZT_CHECK(check_fails("rope q|k|v with no kv heads",
                         zt_cuda_rope_qkv_forward(ctx, 0, 1, 1, 0, 64, p, p, p, p, p, p), ZT_ERR_INVALID_ARG,
                         "kv_heads"));
    ZT_CHECK(check_fails("rope q|k|v with head_dim 7",
                         zt_cuda_rope_qkv_backward(ctx, 0, 1, 1, 1, 7, p, p, p, p, p, p), ZT_ERR_INVALID_ARG,
                         "must be even"));
    device_free(p);
}

/* ---- SwiGLU on row-strided gate|up ----------------------------------------------------------- */

static void test_swiglu_rows(zt_cuda_ctx *ctx)
{
    const int64_t rows = 37, F = 40, L = 2 * F, ld_h = F + 8; /* h with padding that must stay NaN */
    float *gu = random_bf16_values(rows * L, 6.0f), *dh = random_bf16_values(rows * F, 1.0f);
    float *gate = block_of(gu, rows, F, 0, L), *up = block_of(gu, rows, F, F, L);
    float *h = host_f32(rows * F), *dgate = host_f32(rows * F), *dup = host_f32(rows * F);
    zt_cpu_swiglu_forward(NULL, rows * F, gate, up, h);
    zt_cpu_swiglu_backward(NULL, rows * F, gate, up, dh, dgate, dup);
    float *dgu_ref = host_f32(rows * L);
    put_block(dgu_ref, L, 0, dgate, rows, F);
    put_block(dgu_ref, L, F, dup, rows, F);

    uint16_t *d_gu = device_bf16(gu, rows * L), *d_dh = device_bf16(dh, rows * F);
    uint16_t *d_h = device_alloc((uint64_t)(rows * ld_h) * 2), *d_dgu = device_alloc((uint64_t)(rows * L) * 2);
    ZT_CHECK(check_ok("swiglu rows forward",
                      zt_cuda_swiglu_forward_rows(ctx, 0, rows, F, d_gu, d_gu + F, L, d_h, ld_h)));
    float *g_h = download_bf16(d_h, rows * ld_h), *g_hb = block_of(g_h, rows, F, 0, ld_h);
    ZT_CHECK(check_rel_l2("swiglu rows forward", g_hb, h, rows * F, TOL_BF16_OUT));
    ZT_CHECK(padding_untouched("swiglu rows forward", g_h, rows, F, ld_h));
    ZT_CHECK(check_ok("swiglu rows backward",
                      zt_cuda_swiglu_backward_rows(ctx, 0, rows, F, d_gu, d_gu + F, L, d_dh, F, d_dgu, d_dgu + F, L)));
    float *g_dgu = download_bf16(d_dgu, rows * L);
    ZT_CHECK(check_rel_l2("swiglu rows backward dgate|dup", g_dgu, dgu_ref, rows * L, TOL_BF16_OUT));
    /* in place over gate|up, as the layer does */
    ZT_CHECK(check_ok("swiglu rows backward in place",
                      zt_cuda_swiglu_backward_rows(ctx, 0, rows, F, d_gu, d_gu + F, L, d_dh, F, d_gu, d_gu + F, L)));
    float *g_in = download_bf16(d_gu, rows * L);
    ZT_CHECK(check_rel_l2("swiglu rows backward in place", g_in, dgu_ref, rows * L, TOL_BF16_OUT));

    ZT_CHECK(check_fails("swiglu rows, cols not a multiple of 8",
                         zt_cuda_swiglu_forward_rows(ctx, 0, 2, 12, d_gu, d_gu, 16, d_h, 16), ZT_ERR_INVALID_ARG,
                         "multiple of 8"));
    ZT_CHECK(check_fails("swiglu rows, stride below cols",
                         zt_cuda_swiglu_backward_rows(ctx, 0, 2, 16, d_gu, d_gu, 8, d_dh, 16, d_gu, d_gu, 16),
                         ZT_ERR_INVALID_ARG, "row stride"));
    free(gu), free(dh), free(gate), free(up), free(h), free(dgate), free(dup), free(dgu_ref);
    free(g_h), free(g_hb), free(g_dgu), free(g_in);
    device_free(d_gu), device_free(d_dh), device_free(d_h), device_free(d_dgu);
}

/* ---- residual add as GEMM epilogue ----------------------------------------------------------- */

/* M 197 through cuBLASLt's epilogue; 1 and 3 rows (a decode step) through gemm_small_m.cu. */
static void test_linear_residual(zt_cuda_ctx *ctx)
{
    static const int64_t rows[3] = {197, 1, 3};
    for (int r = 0; r < 3; r++) {
        const int64_t M = rows[r], N = 136, K = 264;
        float *x = random_bf16_values(M * K, 1.0f), *w = random_bf16_values(N * K, 0.2f);
        float *res = random_bf16_values(M * N, 4.0f), *ref = host_f32(M * N);
        memcpy(ref, res, sizeof(float) * (size_t)(M * N));
        ZT_CHECK(zt_cpu_gemm(NULL, 0, 1, M, N, K, x, K, w, K, ref, N, 1) == ZT_OK); /* ref = res + x w^T */
        uint16_t *d_x = device_bf16(x, M * K), *d_w = device_bf16(w, N * K), *d_res = device_bf16(res, M * N);
        uint16_t *d_y = device_alloc((uint64_t)(M * N) * 2);
        ZT_CHECK(check_ok("linear + residual", zt_cuda_linear_forward_residual(ctx, 0, M, N, K, d_x, d_w, d_res, d_y)));
        float *g = download_bf16(d_y, M * N), *g_res = download_bf16(d_res, M * N);
        ZT_CHECK(check_rel_l2("linear + residual, y = res + x w^T (bf16)", g, ref, M * N, TOL_BF16_OUT));
        ZT_CHECK(check_identical("linear + residual leaves the residual", g_res, res, M * N));
        free(g);
        ZT_CHECK(check_ok("linear + residual in place",
                          zt_cuda_linear_forward_residual(ctx, 0, M, N, K, d_x, d_w, d_res, d_res)));
        g = download_bf16(d_res, M * N);
        ZT_CHECK(check_rel_l2("linear + residual in place", g, ref, M * N, TOL_BF16_OUT));
        ZT_CHECK(check_fails("linear + residual without residual",
                             zt_cuda_linear_forward_residual(ctx, 0, M, N, K, d_x, d_w, NULL, d_y), ZT_ERR_INVALID_ARG,
                             "residual"));
        free(x), free(w), free(res), free(ref), free(g), free(g_res);
        device_free(d_x), device_free(d_w), device_free(d_res), device_free(d_y);
    }
}

/* ---- a layer's q|k|v and gate|up chains, as layers_cuda.c composes them ---------------------- */

/* Forward: one GEMM over the stacked [Q + 2 KV, H] weights, then rope from the stacked output;
 * backward: rope's transpose into one dqkv, then one dX and one dW GEMM (dW into the stacked fp32
 * gradient). Reference: three CPU linears and ropes, the dX of the three summed. */
static void test_qkv_chain(zt_cuda_ctx *ctx)
{
    const int64_t N = 96, H = 128, heads = 4, kv = 2, D = 32, Q = heads * D, KV = kv * D, L = Q + 2 * KV;
    zt_rope_config cfg = {.rope_type = ZT_ROPE_DEFAULT, .head_dim = (int32_t)D, .theta = 10000.0};
    float *inv_freq = host_f32(D / 2);
    zt_cpu_rope_inv_freq(&cfg, inv_freq);
    int32_t *pos = random_positions(N);
    float *x = random_bf16_values(N * H, 1.0f), *w = random_bf16_values(L * H, 0.1f); /* wq|wk|wv stacked */
    const float *wq = w, *wk = w + Q * H, *wv = w + (Q + KV) * H;
    float *q0 = host_f32(N * Q), *k0 = host_f32(N * KV), *v = host_f32(N * KV);
    float *q = host_f32(N * Q), *k = host_f32(N * KV);
    ZT_CHECK(zt_cpu_linear_forward(NULL, N, Q, H, x, wq, q0) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_forward(NULL, N, KV, H, x, wk, k0) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_forward(NULL, N, KV, H, x, wv, v) == ZT_OK);
    zt_cpu_rope_forward(NULL, N, heads, D, pos, inv_freq, q0, q);
    zt_cpu_rope_forward(NULL, N, kv, D, pos, inv_freq, k0, k);

    float *d_freq = device_f32(inv_freq, D / 2);
    int32_t *d_pos = device_i32(pos, N);
    uint16_t *d_x = device_bf16(x, N * H), *d_w = device_bf16(w, L * H), *d_qkv = device_alloc((uint64_t)(N * L) * 2);
    uint16_t *d_q = device_alloc((uint64_t)(N * Q) * 2), *d_k = device_alloc((uint64_t)(N * KV) * 2);
    uint16_t *d_v = device_alloc((uint64_t)(N * KV) * 2);
    ZT_CHECK(check_ok("q|k|v GEMM", zt_cuda_linear_forward(ctx, 0, N, L, H, d_x, d_w, d_qkv)));
    ZT_CHECK(check_ok("q|k|v rope", zt_cuda_rope_qkv_forward(ctx, 0, N, heads, kv, D, d_pos, d_freq, d_qkv, d_q, d_k,
                                                             d_v)));
    float *g_q = download_bf16(d_q, N * Q), *g_k = download_bf16(d_k, N * KV), *g_v = download_bf16(d_v, N * KV);
    ZT_CHECK(check_rel_l2("q|k|v chain: q", g_q, q, N * Q, TOL_BF16_CHAIN));
    ZT_CHECK(check_rel_l2("q|k|v chain: k", g_k, k, N * KV, TOL_BF16_CHAIN));
    ZT_CHECK(check_rel_l2("q|k|v chain: v", g_v, v, N * KV, TOL_BF16_OUT));

    float *dq = random_bf16_values(N * Q, 1.0f), *dk = random_bf16_values(N * KV, 1.0f);
    float *dv = random_bf16_values(N * KV, 1.0f);
    float *dq0 = host_f32(N * Q), *dk0 = host_f32(N * KV), *dx = host_f32(N * H), *dx_part = host_f32(N * H);
    float *dw0 = random_f32(L * H, 1.0f), *dw = host_f32(L * H);
    memcpy(dw, dw0, sizeof(float) * (size_t)(L * H));
    zt_cpu_rope_backward(NULL, N, heads, D, pos, inv_freq, dq, dq0);
    zt_cpu_rope_backward(NULL, N, kv, D, pos, inv_freq, dk, dk0);
    ZT_CHECK(zt_cpu_linear_backward_input(NULL, N, Q, H, dq0, wq, dx) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_backward_input(NULL, N, KV, H, dk0, wk, dx_part) == ZT_OK);
    for (int64_t i = 0; i < N * H; i++) dx[i] += dx_part[i];
    ZT_CHECK(zt_cpu_linear_backward_input(NULL, N, KV, H, dv, wv, dx_part) == ZT_OK);
    for (int64_t i = 0; i < N * H; i++) dx[i] += dx_part[i];
    ZT_CHECK(zt_cpu_linear_backward_weight(NULL, N, Q, H, dq0, x, dw) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_backward_weight(NULL, N, KV, H, dk0, x, dw + Q * H) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_backward_weight(NULL, N, KV, H, dv, x, dw + (Q + KV) * H) == ZT_OK);

    uint16_t *d_dq = device_bf16(dq, N * Q), *d_dk = device_bf16(dk, N * KV), *d_dv = device_bf16(dv, N * KV);
    uint16_t *d_dqkv = device_alloc((uint64_t)(N * L) * 2), *d_dx = device_alloc((uint64_t)(N * H) * 2);
    float *d_dw = device_f32(dw0, L * H);
    ZT_CHECK(check_ok("q|k|v rope backward", zt_cuda_rope_qkv_backward(ctx, 0, N, heads, kv, D, d_pos, d_freq, d_dq,
                                                                       d_dk, d_dv, d_dqkv)));
    ZT_CHECK(check_ok("q|k|v dX GEMM", zt_cuda_linear_backward_input(ctx, 0, N, L, H, d_dqkv, d_w, d_dx)));
    ZT_CHECK(check_ok("q|k|v dW GEMM", zt_cuda_linear_backward_weight(ctx, 0, N, L, H, d_dqkv, d_x, d_dw)));
    float *g_dx = download_bf16(d_dx, N * H), *g_dw = download_f32(d_dw, L * H);
    ZT_CHECK(check_rel_l2("q|k|v chain: dX (one GEMM)", g_dx, dx, N * H, TOL_BF16_CHAIN));
    float *g_inc = difference(g_dw, dw0, L * H), *inc = difference(dw, dw0, L * H);
    ZT_CHECK(check_rel_l2("q|k|v chain: dW increment (one GEMM)", g_inc, inc, L * H, TOL_BF16_CHAIN));

    free(inv_freq), free(pos), free(x), free(w), free(q0), free(k0), free(v), free(q), free(k);
    free(g_q), free(g_k), free(g_v), free(dq), free(dk), free(dv), free(dq0), free(dk0), free(dx), free(dx_part);
    free(dw0), free(dw), free(g_dx), free(g_dw), free(g_inc), free(inc);
    device_free(d_freq), device_free(d_pos), device_free(d_x), device_free(d_w), device_free(d_qkv);
    device_free(d_q), device_free(d_k), device_free(d_v), device_free(d_dq), device_free(d_dk), device_free(d_dv);
    device_free(d_dqkv), device_free(d_dx), device_free(d_dw);
}

static void test_gate_up_chain(zt_cuda_ctx *ctx)
{
    const int64_t N = 72, H = 96, F = 160, L = 2 * F;
    float *x = random_bf16_values(N * H, 1.0f), *w = random_bf16_values(L * H, 0.2f); /* w_gate|w_up */
    const float *wg = w, *wu = w + F * H;
    float *gate = host_f32(N * F), *up = host_f32(N * F), *h = host_f32(N * F);
    ZT_CHECK(zt_cpu_linear_forward(NULL, N, F, H, x, wg, gate) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_forward(NULL, N, F, H, x, wu, up) == ZT_OK);
    zt_cpu_swiglu_forward(NULL, N * F, gate, up, h);
    float *dh = random_bf16_values(N * F, 1.0f), *dgate = host_f32(N * F), *dup = host_f32(N * F);
    float *dx = host_f32(N * H), *dx_part = host_f32(N * H), *dw0 = random_f32(L * H, 1.0f), *dw = host_f32(L * H);
    memcpy(dw, dw0, sizeof(float) * (size_t)(L * H));
    zt_cpu_swiglu_backward(NULL, N * F, gate, up, dh, dgate, dup);
    ZT_CHECK(zt_cpu_linear_backward_input(NULL, N, F, H, dgate, wg, dx) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_backward_input(NULL, N, F, H, dup, wu, dx_part) == ZT_OK);
    for (int64_t i = 0; i < N * H; i++) dx[i] += dx_part[i];
    ZT_CHECK(zt_cpu_linear_backward_weight(NULL, N, F, H, dgate, x, dw) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_backward_weight(NULL, N, F, H, dup, x, dw + F * H) == ZT_OK);

    uint16_t *d_x = device_bf16(x, N * H), *d_w = device_bf16(w, L * H), *d_gu = device_alloc((uint64_t)(N * L) * 2);
    uint16_t *d_h = device_alloc((uint64_t)(N * F) * 2), *d_dh = device_bf16(dh, N * F);
    uint16_t *d_dx = device_alloc((uint64_t)(N * H) * 2);
    float *d_dw = device_f32(dw0, L * H);
    ZT_CHECK(check_ok("gate|up GEMM", zt_cuda_linear_forward(ctx, 0, N, L, H, d_x, d_w, d_gu)));
    ZT_CHECK(check_ok("gate|up SwiGLU", zt_cuda_swiglu_forward_rows(ctx, 0, N, F, d_gu, d_gu + F, L, d_h, F)));
    float *g_h = download_bf16(d_h, N * F);
    ZT_CHECK(check_rel_l2("gate|up chain: SwiGLU output", g_h, h, N * F, TOL_BF16_CHAIN));
    ZT_CHECK(check_ok("gate|up SwiGLU backward",
                      zt_cuda_swiglu_backward_rows(ctx, 0, N, F, d_gu, d_gu + F, L, d_dh, F, d_gu, d_gu + F, L)));
    ZT_CHECK(check_ok("gate|up dX GEMM", zt_cuda_linear_backward_input(ctx, 0, N, L, H, d_gu, d_w, d_dx)));
    ZT_CHECK(check_ok("gate|up dW GEMM", zt_cuda_linear_backward_weight(ctx, 0, N, L, H, d_gu, d_x, d_dw)));
    float *g_dx = download_bf16(d_dx, N * H), *g_dw = download_f32(d_dw, L * H);
    ZT_CHECK(check_rel_l2("gate|up chain: dX (one GEMM)", g_dx, dx, N * H, TOL_BF16_CHAIN));
    float *g_inc = difference(g_dw, dw0, L * H), *inc = difference(dw, dw0, L * H);
    ZT_CHECK(check_rel_l2("gate|up chain: dW increment (one GEMM)", g_inc, inc, L * H, TOL_BF16_CHAIN));
    free(x), free(w), free(gate), free(up), free(h), free(dh), free(dgate), free(dup), free(dx), free(dx_part);
    free(dw0), free(dw), free(g_h), free(g_dx), free(g_dw), free(g_inc), free(inc);
    device_free(d_x), device_free(d_w), device_free(d_gu), device_free(d_h), device_free(d_dh), device_free(d_dx);
    device_free(d_dw);
}

/* ---- RMSNorm backward (one pass per row) with the residual gradient added --------------------- */

/* d_res again holds dres (an in-place run overwrote it): upload it once more. */
static uint16_t *d_res0(uint16_t *d_res, const float *dres, int64_t n)
{
    uint16_t *fresh = device_bf16(dres, n);
    ZT_CHECK(cudaMemcpy(d_res, fresh, (size_t)n * 2, cudaMemcpyDeviceToDevice) == cudaSuccess);
    device_free(fresh);
    return d_res;
}

/* zt_cuda_rmsnorm_backward_add against the CPU backward plus dres; dims that take 1, 2 and 4
 * vectors per thread, more rows than blocks; in place over dres too, and dW deterministic. */
static void test_rmsnorm_add_dim(zt_cuda_ctx *ctx, int64_t rows, int64_t dim)
{
    const float eps = 1e-5f;
    char name[128];
    int64_t n = rows * dim;
    float *x = random_bf16_values(n, 2.0f), *w = host_f32(dim);
    for (int64_t i = 0; i < dim; i++) w[i] = test_uniform(0.5f, 1.5f);
    round_to_bf16(w, dim);
    float *dy = random_bf16_values(n, 1.0f), *dres = random_bf16_values(n, 1.0f), *dw0 = random_f32(dim, 1.0f);
    float *y = host_f32(n), *rstd = host_f32(rows), *dx = host_f32(n), *dw = host_f32(dim);
    memcpy(dw, dw0, sizeof(float) * (size_t)dim);
    zt_cpu_rmsnorm_forward(NULL, rows, dim, eps, x, w, y, rstd);
    zt_cpu_rmsnorm_backward(NULL, rows, dim, x, w, rstd, dy, dx, dw);
    for (int64_t i = 0; i < n; i++) dx[i] += dres[i];

    uint16_t *d_x = device_bf16(x, n), *d_w = device_bf16(w, dim), *d_dy = device_bf16(dy, n);
    uint16_t *d_res = device_bf16(dres, n), *d_dx = device_alloc((uint64_t)n * 2);
    float *d_rstd = device_f32(rstd, rows), *d_dw = device_f32(dw0, dim);
    snprintf(name, sizeof name, "rmsnorm backward + residual rows=%lld dim=%lld", (long long)rows, (long long)dim);
    ZT_CHECK(check_ok(name, zt_cuda_rmsnorm_backward_add(ctx, 0, rows, dim, d_x, d_w, d_rstd, d_dy, d_res, d_dx,
                                                         d_dw)));
    float *g_dx = download_bf16(d_dx, n), *g_dw = download_f32(d_dw, dim);
    ZT_CHECK(check_rel_l2("  dx + dres (bf16)", g_dx, dx, n, TOL_BF16_OUT));
    float *g_inc = difference(g_dw, dw0, dim), *inc = difference(dw, dw0, dim);
    ZT_CHECK(check_rel_l2("  dw (fp32, the increment)", g_inc, inc, dim, TOL_F32));

    /* in place over dres (dx aliases it), and the same dW bits again */
    ZT_CHECK(cudaMemcpy(d_dw, dw0, sizeof(float) * (size_t)dim, cudaMemcpyHostToDevice) == cudaSuccess);
    ZT_CHECK(check_ok(name, zt_cuda_rmsnorm_backward_add(ctx, 0, rows, dim, d_x, d_w, d_rstd, d_dy, d_res, d_res,
                                                         d_dw)));
    float *g_in = download_bf16(d_res, n), *g_dw2 = download_f32(d_dw, dim);
    ZT_CHECK(check_rel_l2("  in place over dres", g_in, dx, n, TOL_BF16_OUT));
    ZT_CHECK(check_identical("  dw is deterministic", g_dw, g_dw2, dim));

    /* a frozen norm (dw NULL, every vectors-per-thread variant): the same dx bits, and no dW */
    ZT_CHECK(cudaMemset(d_dx, 0, (size_t)n * 2) == cudaSuccess);
    ZT_CHECK(check_ok(name, zt_cuda_rmsnorm_backward_add(ctx, 0, rows, dim, d_x, d_w, d_rstd, d_dy, d_res0(d_res,
                                                         dres, n), d_dx, NULL)));
    float *g_frozen = download_bf16(d_dx, n);
    ZT_CHECK(check_identical("  dx without dw (frozen weight) is the dx with it", g_dx, g_frozen, n));
    free(g_frozen);

    free(x), free(w), free(dy), free(dres), free(dw0), free(y), free(rstd), free(dx), free(dw);
    free(g_dx), free(g_dw), free(g_inc), free(inc), free(g_in), free(g_dw2);
    device_free(d_x), device_free(d_w), device_free(d_dy), device_free(d_res), device_free(d_dx);
    device_free(d_rstd), device_free(d_dw);
}

static void test_rmsnorm_add(zt_cuda_ctx *ctx)
{
    test_rmsnorm_add_dim(ctx, 3000, 2048); /* more rows than backward blocks: 3 rows per block */
    test_rmsnorm_add_dim(ctx, 129, 768);
    test_rmsnorm_add_dim(ctx, 40, 16384); /* 2 vectors per thread */
    test_rmsnorm_add_dim(ctx, 9, 32768);  /* 4 vectors per thread */
    test_rmsnorm_add_dim(ctx, 5, 24);     /* fewer columns than a warp */
    void *p = device_alloc(4096);
    ZT_CHECK(check_fails("rmsnorm backward + residual without dres",
                         zt_cuda_rmsnorm_backward_add(ctx, 0, 2, 64, p, p, p, p, NULL, p, p), ZT_ERR_INVALID_ARG,
                         "dres"));
    device_free(p);
}

/* Every test in bf16, then in fp16 (the context's type, inputs rounded to fp16, fp16's tolerances). */
int main(void)
{
    cuda_test_init("test_cuda_fused");
    const int32_t passes[2] = {ZT_BF16, ZT_F16};
    for (int p = 0; p < 2; p++) {
        cuda_test_set_dtype16(passes[p]);
        printf("==== %s pass ====\n", cuda_test_dtype16_name());
        zt_cuda_ctx *ctx = cuda_test_ctx(0);
        test_rope_qkv(ctx);
        test_swiglu_rows(ctx);
        test_linear_residual(ctx);
        test_rmsnorm_add(ctx);
        test_qkv_chain(ctx);
        test_gate_up_chain(ctx);
        zt_cuda_ctx_destroy(ctx);
    }
    return zt_test_result();
}
