/* The bf16 CUDA kernels (kernels/cuda) against the fp32 CPU kernels (kernels/cpu), which the CPU
 * tests check against PyTorch. Inputs are fresh random values rounded to bf16, so both sides see
 * the same numbers; GPU outputs are poisoned with NaN before every run; errors are relative L2
 * against the CPU result, with the tolerances of cuda_test.h (docs/cuda.md explains them).
 * Everything runs twice: in bf16, then in fp16 (contexts set to ZT_F16, inputs rounded to fp16, the
 * tighter fp16 tolerances; the loss gradients carry a loss scale there, as fp16 training does). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_test.h"
#include "ztest.h"

static int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

/* Copies the [rows, cols] block of a matrix with row stride ld. */
static float *block_of(const float *x, int64_t rows, int64_t cols, int64_t ld)
{
    float *out = host_f32(rows * cols);
    for (int64_t r = 0; r < rows; r++) memcpy(out + r * cols, x + r * ld, sizeof(float) * (size_t)cols);
    return out;
}

static float *difference(const float *a, const float *b, int64_t n)
{
    float *d = host_f32(n);
    for (int64_t i = 0; i < n; i++) d[i] = a[i] - b[i];
    return d;
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

static void test_gemm(zt_cuda_ctx *ctx)
{
    const int64_t M = 197, N = 136, K = 264;
    char name[128];
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int c_bf16 = 0; c_bf16 < 2; c_bf16++)
                for (int acc = 0; acc < 2; acc++) {
                    /* padded leading dimensions: the kernels must honour them */
                    int64_t a_rows = ta ? K : M, lda = round8(ta ? M : K) + 8;
                    int64_t b_rows = tb ? N : K, ldb = round8(tb ? K : N) + 8;
                    int64_t ldc = round8(N) + 8;
                    float *A = random_bf16_values(a_rows * lda, 1.0f);
                    float *B = random_bf16_values(b_rows * ldb, 1.0f);
                    float *C0 = random_f32(M * ldc, 4.0f);
                    if (c_bf16) round_to_bf16(C0, M * ldc);
                    float *ref = host_f32(M * ldc);
                    memcpy(ref, C0, sizeof(float) * (size_t)(M * ldc));
                    ZT_CHECK(zt_cpu_gemm(NULL, ta, tb, M, N, K, A, lda, B, ldb, ref, ldc, acc) == ZT_OK);

                    uint16_t *dA = device_bf16(A, a_rows * lda), *dB = device_bf16(B, b_rows * ldb);
                    void *dC = c_bf16 ? (void *)device_bf16(C0, M * ldc) : (void *)device_f32(C0, M * ldc);
                    if (!acc) device_poison(dC, (uint64_t)(M * ldc) * (c_bf16 ? 2 : 4));
                    snprintf(name, sizeof name, "gemm trans_a=%d trans_b=%d out=%s accumulate=%d", ta,
                             tb, c_bf16 ? cuda_test_dtype16_name() : "fp32", acc);
                    ZT_CHECK(check_ok(name, zt_cuda_gemm(ctx, 0, ta, tb, M, N, K, dA, lda, dB, ldb, dC,
                                                         c_bf16 ? cuda_test_dtype16() : ZT_F32, ldc, acc)));
                    float *got = c_bf16 ? download_bf16(dC, M * ldc) : download_f32(dC, M * ldc);
                    float *got_block = block_of(got, M, N, ldc), *ref_block = block_of(ref, M, N, ldc);
                    ZT_CHECK(check_rel_l2(name, got_block, ref_block, M * N,
                                          c_bf16 ? TOL_BF16_OUT : TOL_F32));
                    free(A), free(B), free(C0), free(ref), free(got), free(got_block), free(ref_block);
                    device_free(dA), device_free(dB), device_free(dC);
                }

    /* The llama head's logits output (x_out) for a vocabulary that is not a multiple of 8: N = 777
     * columns written at the caller's row stride ldc = N, so C's rows are not 16-byte aligned */
    for (int c_bf16 = 0; c_bf16 < 2; c_bf16++) {
        const int64_t m = 64, n = 777, k = 256;
        float *A = random_bf16_values(m * k, 1.0f), *B = random_bf16_values(n * k, 1.0f);
        float *ref = host_f32(m * n);
        ZT_CHECK(zt_cpu_gemm(NULL, 0, 1, m, n, k, A, k, B, k, ref, n, 0) == ZT_OK);
        uint16_t *dA = device_bf16(A, m * k), *dB = device_bf16(B, n * k);
        void *dC = device_alloc((uint64_t)(m * n) * (c_bf16 ? 2 : 4));
        snprintf(name, sizeof name, "gemm x w^T with N = ldc = %lld (rows not 16-byte aligned), out=%s", (long long)n,
                 c_bf16 ? cuda_test_dtype16_name() : "fp32");
        ZT_CHECK(check_ok(name, zt_cuda_gemm(ctx, 0, 0, 1, m, n, k, dA, k, dB, k, dC,
                                             c_bf16 ? cuda_test_dtype16() : ZT_F32, n, 0)));
        float *got = c_bf16 ? download_bf16(dC, m * n) : download_f32(dC, m * n);
        ZT_CHECK(check_rel_l2(name, got, ref, m * n, c_bf16 ? TOL_BF16_OUT : TOL_F32));
        free(A), free(B), free(ref), free(got);
        device_free(dA), device_free(dB), device_free(dC);
    }

    /* A few rows (a decode step's linear layers: one row goes to gemm_small_m.cu, more to cuBLASLt)
     * against the CPU, x w^T with padded leading dimensions, fp32 and 16-bit output, overwriting and
     * accumulating, K not a multiple of the one-row kernel's unrolled 1024 columns, M up to a
     * decode batch of 64 and past it. */
    static const int64_t few_rows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 64, 65};
    for (size_t mi = 0; mi < sizeof few_rows / sizeof few_rows[0]; mi++)
        for (int c_bf16 = 0; c_bf16 < 2; c_bf16++)
            for (int acc = 0; acc < 2; acc++) {
                const int64_t m = few_rows[mi];
                const int64_t n = m % 2 ? 777 : m % 4 ? 1000 : 10000, k = m % 3 ? 1032 : 4096, lda = k + 16, ldb = k + 8;
                int64_t ldc = n + (m % 2);
                float *A = random_bf16_values(m * lda, 1.0f), *B = random_bf16_values(n * ldb, 1.0f);
                float *C0 = random_f32(m * ldc, 4.0f);
                if (c_bf16) round_to_bf16(C0, m * ldc);
                float *ref = host_f32(m * ldc);
                memcpy(ref, C0, sizeof(float) * (size_t)(m * ldc));
                ZT_CHECK(zt_cpu_gemm(NULL, 0, 1, m, n, k, A, lda, B, ldb, ref, ldc, acc) == ZT_OK);
                uint16_t *dA = device_bf16(A, m * lda), *dB = device_bf16(B, n * ldb);
                void *dC = c_bf16 ? (void *)device_bf16(C0, m * ldc) : (void *)device_f32(C0, m * ldc);
                if (!acc) device_poison(dC, (uint64_t)(m * ldc) * (c_bf16 ? 2 : 4));
                snprintf(name, sizeof name, "gemm of %lld rows x w^T (N %lld, K %lld) out=%s accumulate=%d", (long long)m,
                         (long long)n, (long long)k, c_bf16 ? cuda_test_dtype16_name() : "fp32", acc);
                ZT_CHECK(check_ok(name, zt_cuda_gemm(ctx, 0, 0, 1, m, n, k, dA, lda, dB, ldb, dC,
                                                     c_bf16 ? cuda_test_dtype16() : ZT_F32, ldc, acc)));
                float *got = c_bf16 ? download_bf16(dC, m * ldc) : download_f32(dC, m * ldc);
                float *got_block = block_of(got, m, n, ldc), *ref_block = block_of(ref, m, n, ldc);
                ZT_CHECK(check_rel_l2(name, got_block, ref_block, m * n, c_bf16 ? TOL_BF16_OUT : TOL_F32));
                free(A), free(B), free(C0), free(ref), free(got), free(got_block), free(ref_block);
                device_free(dA), device_free(dB), device_free(dC);
            }

    /* K = 0 overwrites C with zeros */
    float *zeros = host_f32(8 * 8);
    memset(zeros, 0, sizeof(float) * 64);
    float *dC = device_alloc(sizeof(float) * 64);
    uint16_t *dA = device_alloc(64 * 2);
    ZT_CHECK(check_ok("gemm K=0", zt_cuda_gemm(ctx, 0, 0, 0, 8, 8, 0, dA, 8, dA, 8, dC, ZT_F32, 8, 0)));
    float *got = download_f32(dC, 64);
    ZT_CHECK(check_rel_l2("gemm K=0 gives zeros", got, zeros, 64, 0.0));
    ZT_CHECK(check_fails("gemm with lda smaller than a row",
                         zt_cuda_gemm(ctx, 0, 0, 0, 8, 8, 16, dA, 8, dA, 8, dC, ZT_F32, 8, 0),
                         ZT_ERR_INVALID_ARG, "leading dimensions"));
    ZT_CHECK(check_fails("gemm with an int32 output",
                         zt_cuda_gemm(ctx, 0, 0, 0, 8, 8, 8, dA, 8, dA, 8, dC, ZT_I32, 8, 0),
                         ZT_ERR_UNSUPPORTED, "output dtype"));
    free(zeros), free(got);
    device_free(dC), device_free(dA);
}

static void test_linear(zt_cuda_ctx *ctx)
{
    const int64_t M = 256, N = 192, K = 320;
    float *x = random_bf16_values(M * K, 1.0f), *w = random_bf16_values(N * K, 0.2f);
    float *dy = random_bf16_values(M * N, 1.0f), *dw0 = random_f32(N * K, 1.0f);
    float *y = host_f32(M * N), *dx = host_f32(M * K), *dw = host_f32(N * K);
    memcpy(dw, dw0, sizeof(float) * (size_t)(N * K));
    ZT_CHECK(zt_cpu_linear_forward(NULL, M, N, K, x, w, y) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_backward_input(NULL, M, N, K, dy, w, dx) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_backward_weight(NULL, M, N, K, dy, x, dw) == ZT_OK);

    uint16_t *d_x = device_bf16(x, M * K), *d_w = device_bf16(w, N * K), *d_dy = device_bf16(dy, M * N);
    uint16_t *d_y = device_alloc(M * N * 2), *d_dx = device_alloc(M * K * 2);
    float *d_dw = device_f32(dw0, N * K);
    ZT_CHECK(check_ok("linear forward", zt_cuda_linear_forward(ctx, 0, M, N, K, d_x, d_w, d_y)));
    ZT_CHECK(check_ok("linear dX", zt_cuda_linear_backward_input(ctx, 0, M, N, K, d_dy, d_w, d_dx)));
    ZT_CHECK(check_ok("linear dW", zt_cuda_linear_backward_weight(ctx, 0, M, N, K, d_dy, d_x, d_dw)));
    float *g_y = download_bf16(d_y, M * N), *g_dx = download_bf16(d_dx, M * K);
    float *g_dw = download_f32(d_dw, N * K);
    ZT_CHECK(check_rel_l2("linear forward y = x w^T (bf16)", g_y, y, M * N, TOL_BF16_OUT));
    ZT_CHECK(check_rel_l2("linear dX = dy w (bf16)", g_dx, dx, M * K, TOL_BF16_OUT));
    float *g_inc = difference(g_dw, dw0, N * K), *inc = difference(dw, dw0, N * K);
    ZT_CHECK(check_rel_l2("linear dW += dy^T x (fp32, the increment)", g_inc, inc, N * K, TOL_F32));
    free(x), free(w), free(dy), free(dw0), free(y), free(dx), free(dw);
    free(g_y), free(g_dx), free(g_dw), free(g_inc), free(inc);
    device_free(d_x), device_free(d_w), device_free(d_dy), device_free(d_y), device_free(d_dx);
    device_free(d_dw);
}

/* ---- RMSNorm --------------------------------------------------------------------------------- */

static void test_rmsnorm_dim(zt_cuda_ctx *ctx, int64_t rows, int64_t dim)
{
    const float eps = 1e-5f;
    char name[128];
    float *x = random_bf16_values(rows * dim, 2.0f), *w = host_f32(dim);
    for (int64_t i = 0; i < dim; i++) w[i] = test_uniform(0.5f, 1.5f);
    round_to_bf16(w, dim);
    float *dy = random_bf16_values(rows * dim, 1.0f), *dw0 = random_f32(dim, 1.0f);
    float *y = host_f32(rows * dim), *rstd = host_f32(rows), *dx = host_f32(rows * dim);
    float *dw = host_f32(dim);
    memcpy(dw, dw0, sizeof(float) * (size_t)dim);
    zt_cpu_rmsnorm_forward(NULL, rows, dim, eps, x, w, y, rstd);
    zt_cpu_rmsnorm_backward(NULL, rows, dim, x, w, rstd, dy, dx, dw);

    uint16_t *d_x = device_bf16(x, rows * dim), *d_w = device_bf16(w, dim);
    uint16_t *d_dy = device_bf16(dy, rows * dim);
    uint16_t *d_y = device_alloc(rows * dim * 2), *d_dx = device_alloc(rows * dim * 2);
    float *d_rstd = device_alloc(rows * 4), *d_dw = device_f32(dw0, dim);
    snprintf(name, sizeof name, "rmsnorm forward rows=%lld dim=%lld", (long long)rows, (long long)dim);
    ZT_CHECK(check_ok(name, zt_cuda_rmsnorm_forward(ctx, 0, rows, dim, eps, d_x, d_w, d_y, d_rstd)));
    float *g_y = download_bf16(d_y, rows * dim), *g_rstd = download_f32(d_rstd, rows);
    ZT_CHECK(check_rel_l2(name, g_y, y, rows * dim, TOL_BF16_OUT));
    snprintf(name, sizeof name, "rmsnorm rstd dim=%lld (fp32)", (long long)dim);
    ZT_CHECK(check_rel_l2(name, g_rstd, rstd, rows, TOL_F32));

    snprintf(name, sizeof name, "rmsnorm backward rows=%lld dim=%lld", (long long)rows, (long long)dim);
    ZT_CHECK(check_ok(name, zt_cuda_rmsnorm_backward(ctx, 0, rows, dim, d_x, d_w, d_rstd, d_dy,
                                                     d_dx, d_dw)));
    float *g_dx = download_bf16(d_dx, rows * dim), *g_dw = download_f32(d_dw, dim);
    snprintf(name, sizeof name, "rmsnorm dx dim=%lld (bf16)", (long long)dim);
    ZT_CHECK(check_rel_l2(name, g_dx, dx, rows * dim, TOL_BF16_OUT));
    float *g_inc = difference(g_dw, dw0, dim), *inc = difference(dw, dw0, dim);
    snprintf(name, sizeof name, "rmsnorm dw dim=%lld (fp32, the increment)", (long long)dim);
    ZT_CHECK(check_rel_l2(name, g_inc, inc, dim, TOL_F32));

    /* the weight gradient is summed in a fixed order: a second run gives the same bits */
    ZT_CHECK(cudaMemcpy(d_dw, dw0, sizeof(float) * (size_t)dim, cudaMemcpyHostToDevice) == cudaSuccess);
    ZT_CHECK(check_ok(name, zt_cuda_rmsnorm_backward(ctx, 0, rows, dim, d_x, d_w, d_rstd, d_dy,
                                                     d_dx, d_dw)));
    float *g_dw2 = download_f32(d_dw, dim);
    ZT_CHECK(check_identical("rmsnorm dw is deterministic", g_dw, g_dw2, dim));

    /* a frozen norm (dw NULL): the same dx bits, no weight gradient */
    ZT_CHECK(cudaMemset(d_dx, 0, (size_t)(rows * dim * 2)) == cudaSuccess);
    snprintf(name, sizeof name, "rmsnorm backward, frozen weight, rows=%lld dim=%lld", (long long)rows,
             (long long)dim);
    ZT_CHECK(check_ok(name, zt_cuda_rmsnorm_backward(ctx, 0, rows, dim, d_x, d_w, d_rstd, d_dy, d_dx, NULL)));
    float *g_dx_frozen = download_bf16(d_dx, rows * dim);
    ZT_CHECK(check_identical("rmsnorm dx without dw is the dx with it", g_dx, g_dx_frozen, rows * dim));
    free(g_dx_frozen);

    free(x), free(w), free(dy), free(dw0), free(y), free(rstd), free(dx), free(dw);
    free(g_y), free(g_rstd), free(g_dx), free(g_dw), free(g_inc), free(inc), free(g_dw2);
    device_free(d_x), device_free(d_w), device_free(d_dy), device_free(d_y), device_free(d_dx);
    device_free(d_rstd), device_free(d_dw);
}

static void test_rmsnorm(zt_cuda_ctx *ctx)
{
    test_rmsnorm_dim(ctx, 257, 64);
    test_rmsnorm_dim(ctx, 257, 1544);
    test_rmsnorm_dim(ctx, 300, 8192);
    test_rmsnorm_dim(ctx, 3, 4096); /* fewer rows than backward chunks */
    void *p = device_alloc(1024);
    ZT_CHECK(check_fails("rmsnorm with dim 12", zt_cuda_rmsnorm_forward(ctx, 0, 2, 12, 1e-5f, p, p, p, p),
                         ZT_ERR_INVALID_ARG, "multiple of 8"));
    device_free(p);
}

/* ---- rope ------------------------------------------------------------------------------------ */

static void test_rope_config(zt_cuda_ctx *ctx, const zt_rope_config *cfg, int64_t tokens, int64_t heads)
{
    int64_t D = cfg->head_dim, n = tokens * heads * D;
    char name[160];
    const char *kind = cfg->rope_type == ZT_ROPE_LLAMA3 ? "llama3" : "default";
    float *inv_freq = host_f32(D / 2);
    zt_cpu_rope_inv_freq(cfg, inv_freq);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)tokens);
    for (int64_t t = 0; t < tokens; t++) pos[t] = test_randint(0, 8192); /* large angles too */
    float *x = random_bf16_values(n, 1.0f), *y = host_f32(n), *dx = host_f32(n);
    zt_cpu_rope_forward(NULL, tokens, heads, D, pos, inv_freq, x, y);
    zt_cpu_rope_backward(NULL, tokens, heads, D, pos, inv_freq, x, dx);

    float *d_freq = device_f32(inv_freq, D / 2);
    int32_t *d_pos = device_i32(pos, tokens);
    uint16_t *d_x = device_bf16(x, n), *d_y = device_alloc(n * 2);
    snprintf(name, sizeof name, "rope forward %s D=%lld", kind, (long long)D);
    ZT_CHECK(check_ok(name, zt_cuda_rope_forward(ctx, 0, tokens, heads, D, d_pos, d_freq, d_x, d_y)));
    float *g = download_bf16(d_y, n);
    ZT_CHECK(check_rel_l2(name, g, y, n, TOL_BF16_OUT));
    free(g);
    snprintf(name, sizeof name, "rope backward %s D=%lld", kind, (long long)D);
    ZT_CHECK(check_ok(name, zt_cuda_rope_backward(ctx, 0, tokens, heads, D, d_pos, d_freq, d_x, d_y)));
    g = download_bf16(d_y, n);
    ZT_CHECK(check_rel_l2(name, g, dx, n, TOL_BF16_OUT));
    free(g);
    snprintf(name, sizeof name, "rope forward in place %s D=%lld", kind, (long long)D);
    ZT_CHECK(check_ok(name, zt_cuda_rope_forward(ctx, 0, tokens, heads, D, d_pos, d_freq, d_x, d_x)));
    g = download_bf16(d_x, n);
    ZT_CHECK(check_rel_l2(name, g, y, n, TOL_BF16_OUT));
    free(g), free(inv_freq), free(pos), free(x), free(y), free(dx);
    device_free(d_freq), device_free(d_pos), device_free(d_x), device_free(d_y);
}

static void test_rope(zt_cuda_ctx *ctx)
{
    zt_rope_config llama3 = {.rope_type = ZT_ROPE_LLAMA3, .head_dim = 128, .theta = 500000.0,
                             .factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                             .original_max_position_embeddings = 8192.0};
    zt_rope_config plain = {.rope_type = ZT_ROPE_DEFAULT, .head_dim = 64, .theta = 10000.0};
    test_rope_config(ctx, &llama3, 300, 6);
    test_rope_config(ctx, &plain, 257, 3);
    void *p = device_alloc(1024);
    ZT_CHECK(check_fails("rope with head_dim 7", zt_cuda_rope_forward(ctx, 0, 1, 1, 7, p, p, p, p),
                         ZT_ERR_INVALID_ARG, "must be even"));
    device_free(p);
}

/* ---- SwiGLU ---------------------------------------------------------------------------------- */

static void test_swiglu(zt_cuda_ctx *ctx)
{
    const int64_t n = 10007; /* not a multiple of 8: the tail path runs too */
    float *gate = random_bf16_values(n, 6.0f), *up = random_bf16_values(n, 2.0f);
    float *dh = random_bf16_values(n, 1.0f);
    float *h = host_f32(n), *dgate = host_f32(n), *dup = host_f32(n);
    zt_cpu_swiglu_forward(NULL, n, gate, up, h);
    zt_cpu_swiglu_backward(NULL, n, gate, up, dh, dgate, dup);
    uint16_t *d_gate = device_bf16(gate, n), *d_up = device_bf16(up, n), *d_dh = device_bf16(dh, n);
    uint16_t *d_h = device_alloc(n * 2), *d_dg = device_alloc(n * 2), *d_du = device_alloc(n * 2);
    ZT_CHECK(check_ok("swiglu forward", zt_cuda_swiglu_forward(ctx, 0, n, d_gate, d_up, d_h)));
    float *g = download_bf16(d_h, n);
    ZT_CHECK(check_rel_l2("swiglu forward", g, h, n, TOL_BF16_OUT));
    free(g);
    ZT_CHECK(check_ok("swiglu backward", zt_cuda_swiglu_backward(ctx, 0, n, d_gate, d_up, d_dh, d_dg, d_du)));
    float *g_dg = download_bf16(d_dg, n), *g_du = download_bf16(d_du, n);
    ZT_CHECK(check_rel_l2("swiglu dgate", g_dg, dgate, n, TOL_BF16_OUT));
    ZT_CHECK(check_rel_l2("swiglu dup", g_du, dup, n, TOL_BF16_OUT));
    free(g_dg), free(g_du);
    /* gradients written over the inputs */
    ZT_CHECK(check_ok("swiglu backward in place",
                      zt_cuda_swiglu_backward(ctx, 0, n, d_gate, d_up, d_dh, d_gate, d_up)));
    g_dg = download_bf16(d_gate, n), g_du = download_bf16(d_up, n);
    ZT_CHECK(check_rel_l2("swiglu dgate in place", g_dg, dgate, n, TOL_BF16_OUT));
    ZT_CHECK(check_rel_l2("swiglu dup in place", g_du, dup, n, TOL_BF16_OUT));
    free(gate), free(up), free(dh), free(h), free(dgate), free(dup), free(g_dg), free(g_du);
    device_free(d_gate), device_free(d_up), device_free(d_dh), device_free(d_h);
    device_free(d_dg), device_free(d_du);
}

/* ---- embedding ------------------------------------------------------------------------------- */

static void test_embedding_dim(zt_cuda_ctx *ctx, int64_t dim)
{
    const int64_t tokens = 1000, vocab = 3000;
    char name[128];
    int32_t *ids = malloc(sizeof(int32_t) * tokens);
    for (int64_t t = 0; t < tokens; t++) /* mostly a few frequent ids: long runs in the backward */
        ids[t] = t % 3 ? test_randint(0, 50) : test_randint(0, (int32_t)vocab);
    float *table = random_bf16_values(vocab * dim, 1.0f), *dy = random_bf16_values(tokens * dim, 1.0f);
    float *dtable0 = random_f32(vocab * dim, 1.0f), *y = host_f32(tokens * dim);
    float *dtable = host_f32(vocab * dim);
    memcpy(dtable, dtable0, sizeof(float) * (size_t)(vocab * dim));
    ZT_CHECK(zt_cpu_embedding_forward(NULL, tokens, vocab, dim, ids, table, y, NULL) == ZT_OK);
    ZT_CHECK(zt_cpu_embedding_backward(NULL, tokens, vocab, dim, ids, dy, dtable, NULL) == ZT_OK);

    int32_t *d_ids = device_i32(ids, tokens);
    uint16_t *d_table = device_bf16(table, vocab * dim), *d_dy = device_bf16(dy, tokens * dim);
    uint16_t *d_y = device_alloc(tokens * dim * 2);
    float *d_dtable = device_f32(dtable0, vocab * dim);
    snprintf(name, sizeof name, "embedding forward dim=%lld", (long long)dim);
    ZT_CHECK(check_ok(name, zt_cuda_embedding_forward(ctx, 0, tokens, vocab, dim, d_ids, d_table, d_y)));
    float *g_y = download_bf16(d_y, tokens * dim);
    ZT_CHECK(check_identical(name, g_y, y, tokens * dim));
    snprintf(name, sizeof name, "embedding backward dim=%lld (fp32)", (long long)dim);
    ZT_CHECK(check_ok(name, zt_cuda_embedding_backward(ctx, 0, tokens, vocab, dim, d_ids, d_dy, d_dtable)));
    float *g_dt = download_f32(d_dtable, vocab * dim);
    float *g_inc = difference(g_dt, dtable0, vocab * dim), *inc = difference(dtable, dtable0, vocab * dim);
    ZT_CHECK(check_rel_l2(name, g_inc, inc, vocab * dim, TOL_F32));
    ZT_CHECK(cudaMemcpy(d_dtable, dtable0, sizeof(float) * (size_t)(vocab * dim),
                        cudaMemcpyHostToDevice) == cudaSuccess);
    ZT_CHECK(check_ok(name, zt_cuda_embedding_backward(ctx, 0, tokens, vocab, dim, d_ids, d_dy, d_dtable)));
    float *g_dt2 = download_f32(d_dtable, vocab * dim);
    ZT_CHECK(check_identical("embedding backward is deterministic", g_dt, g_dt2, vocab * dim));
    ZT_CHECK(check_ok("no bad ids recorded", zt_cuda_check_indices(ctx, 0)));

    /* out-of-range ids: zeros in the forward, nothing added in the backward, reported later */
    int32_t bad_ids[3] = {5, 3005, -1};
    ZT_CHECK(cudaMemcpy(d_ids + 17, &bad_ids[1], 4, cudaMemcpyHostToDevice) == cudaSuccess);
    ZT_CHECK(check_ok("embedding forward with a bad id",
                      zt_cuda_embedding_forward(ctx, 0, tokens, vocab, dim, d_ids, d_table, d_y)));
    float *g_y2 = download_bf16(d_y, tokens * dim);
    float *zero_row = host_f32(dim);
    memset(zero_row, 0, sizeof(float) * (size_t)dim);
    ZT_CHECK(check_identical("row of the bad id is zero", g_y2 + 17 * dim, zero_row, dim));
    ZT_CHECK(check_fails("bad id reported", zt_cuda_check_indices(ctx, 0), ZT_ERR_INVALID_ARG,
                         "embedding forward: token id 3005 at row 17 is outside [0, vocab)"));
    ZT_CHECK(check_ok("report cleared", zt_cuda_check_indices(ctx, 0)));
    ZT_CHECK(cudaMemcpy(d_ids + 17, &bad_ids[0], 4, cudaMemcpyHostToDevice) == cudaSuccess);
    ZT_CHECK(cudaMemcpy(d_ids + 5, &bad_ids[2], 4, cudaMemcpyHostToDevice) == cudaSuccess);
    ZT_CHECK(check_ok("embedding backward with a bad id",
                      zt_cuda_embedding_backward(ctx, 0, tokens, vocab, dim, d_ids, d_dy, d_dtable)));
    ZT_CHECK(check_fails("bad id reported (backward)", zt_cuda_check_indices(ctx, 0),
                         ZT_ERR_INVALID_ARG, "embedding backward: token id -1 at row 5"));

    free(ids), free(table), free(dy), free(dtable0), free(y), free(dtable), free(g_y), free(g_dt);
    free(g_inc), free(inc), free(g_dt2), free(g_y2), free(zero_row);
    device_free(d_ids), device_free(d_table), device_free(d_dy), device_free(d_y), device_free(d_dtable);
}

static void test_embedding(zt_cuda_ctx *ctx)
{
    test_embedding_dim(ctx, 264);
    test_embedding_dim(ctx, 2048); /* two column slices per id */
}

/* ---- cross-entropy --------------------------------------------------------------------------- */

static int32_t *random_targets(int64_t rows, int64_t vocab, double *normalizer)
{
    int32_t *t = malloc(sizeof(int32_t) * (size_t)rows);
    *normalizer = 0;
    for (int64_t r = 0; r < rows; r++) {
        t[r] = r % 7 == 3 ? ZT_IGNORE_INDEX : test_randint(0, (int32_t)vocab);
        if (t[r] != ZT_IGNORE_INDEX) *normalizer += 1;
    }
    return t;
}

/* vocab 32000, and 777: rows of a length that is not a multiple of 8 */
static void test_cross_entropy_vocab(zt_cuda_ctx *ctx, int64_t vocab)
{
    const int64_t rows = 64;
    char message[96];
    printf("-- cross-entropy, vocab %lld\n", (long long)vocab);
    /* fp16: dlogits of ~1e-6 are subnormal in fp16, which is why fp16 training scales the loss: here
     * by 1024 (the CPU reference gets the same dloss) */
    const float dloss = cuda_test_dtype16() == ZT_F16 ? 1.7f * 1024.0f : 1.7f;
    double normalizer, loss, g_loss;
    int64_t bad;
    int32_t *targets = random_targets(rows, vocab, &normalizer);
    float *logits = random_f32(rows * vocab, 6.0f), *row_loss = host_f32(rows);
    float *dlogits = host_f32(rows * vocab);
    ZT_CHECK(zt_cpu_cross_entropy(NULL, rows, vocab, logits, targets, normalizer, dloss, row_loss,
                                  &loss, dlogits, &bad) == ZT_OK);
    float *d_logits = device_f32(logits, rows * vocab), *d_row = device_alloc(rows * 4);
    int32_t *d_t = device_i32(targets, rows);
    uint16_t *d_dl = device_alloc(rows * vocab * 2);
    double *d_loss = device_alloc(sizeof(double));
    ZT_CHECK(check_ok("cross-entropy", zt_cuda_cross_entropy(ctx, 0, rows, vocab, d_logits, d_t,
                                                             normalizer, dloss, d_row, d_loss, d_dl)));
    float *g_row = download_f32(d_row, rows), *g_dl = download_bf16(d_dl, rows * vocab);
    ZT_CHECK(cudaMemcpy(&g_loss, d_loss, sizeof g_loss, cudaMemcpyDeviceToHost) == cudaSuccess);
    ZT_CHECK(check_rel_l2("cross-entropy row losses (fp32)", g_row, row_loss, rows, TOL_F32));
    float g_loss_f = (float)g_loss, loss_f = (float)loss;
    ZT_CHECK(check_rel_l2("cross-entropy mean loss", &g_loss_f, &loss_f, 1, TOL_F32));
    ZT_CHECK(check_rel_l2("cross-entropy dlogits (bf16)", g_dl, dlogits, rows * vocab, TOL_BF16_OUT));

    device_poison(d_row, rows * 4);
    ZT_CHECK(check_ok("cross-entropy, loss only",
                      zt_cuda_cross_entropy(ctx, 0, rows, vocab, d_logits, d_t, normalizer, dloss,
                                            d_row, d_loss, NULL)));
    free(g_row);
    g_row = download_f32(d_row, rows);
    ZT_CHECK(check_rel_l2("cross-entropy row losses, loss only", g_row, row_loss, rows, TOL_F32));

    int32_t bad_target = (int32_t)vocab;
    ZT_CHECK(cudaMemcpy(d_t + 7, &bad_target, 4, cudaMemcpyHostToDevice) == cudaSuccess);
    ZT_CHECK(check_ok("cross-entropy with a bad target",
                      zt_cuda_cross_entropy(ctx, 0, rows, vocab, d_logits, d_t, normalizer, dloss,
                                            d_row, d_loss, d_dl)));
    snprintf(message, sizeof message, "cross-entropy: target %lld at row 7", (long long)vocab);
    ZT_CHECK(check_fails("bad target reported", zt_cuda_check_indices(ctx, 0), ZT_ERR_INVALID_ARG, message));
    ZT_CHECK(check_fails("cross-entropy with normalizer 0",
                         zt_cuda_cross_entropy(ctx, 0, rows, vocab, d_logits, d_t, 0.0, dloss,
                                               d_row, d_loss, d_dl),
                         ZT_ERR_INVALID_ARG, "normalizer"));
    free(targets), free(logits), free(row_loss), free(dlogits), free(g_row), free(g_dl);
    device_free(d_logits), device_free(d_row), device_free(d_t), device_free(d_dl), device_free(d_loss);
}

static void test_cross_entropy(zt_cuda_ctx *ctx)
{
    test_cross_entropy_vocab(ctx, 32000);
    test_cross_entropy_vocab(ctx, 777);
}

/* Fills every column of the LM head's logits and dlogits scratch rows with NaN: one call over
 * NaN inputs with the vocabulary padded to the row stride (a multiple of 8). A later call whose
 * vocabulary is not a multiple of 8 then fails its checks if it reads a padding column. */
static void poison_lm_head_scratch(zt_cuda_ctx *ctx, int64_t rows, int64_t dim, int64_t vocab,
                                   const int32_t *d_targets, double normalizer)
{
    int64_t ld = round8(vocab);
    uint16_t *d_x = device_alloc(rows * dim * 2), *d_w = device_alloc(ld * dim * 2); /* NaN */
    uint16_t *d_dx = device_alloc(rows * dim * 2);
    float *d_row = device_alloc(rows * 4);
    double *d_loss = device_alloc(sizeof(double));
    ZT_CHECK(check_ok("LM head loss over NaN inputs (poisons the scratch)",
                      zt_cuda_lm_head_loss(ctx, 0, rows, dim, ld, d_x, d_w, d_targets, normalizer, 1.0f,
                                           d_row, d_loss, d_dx, NULL)));
    ZT_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    device_free(d_x), device_free(d_w), device_free(d_dx), device_free(d_row), device_free(d_loss);
}

/* The fused LM head against the CPU's linear + cross-entropy, for a vocabulary of 5008 (a multiple
 * of 8) and for ones that are not: 777 and 4099 (a body of 8-row blocks and a tail of 1 and 3 rows,
 * computed by separate GEMMs), 5 (no body, only a tail). Row losses must match the unpadded CPU loss
 * to 1e-4, and the scratch is NaN past the vocabulary, so a padding column read anywhere shows. */
static void test_lm_head_loss_vocab(int64_t vocab)
{
    const int64_t rows = 300, dim = 256;
    const float dloss = cuda_test_dtype16() == ZT_F16 ? 4096.0f : 1.0f; /* a loss scale in fp16 */
    double normalizer, loss, g_loss;
    int64_t bad;
    char name[160];
    printf("-- LM head, vocab %lld (%lld rows in 8-row blocks, a tail of %lld)\n", (long long)vocab,
           (long long)(vocab / 8 * 8), (long long)(vocab % 8));
    /* scratch for 64 rows of logits: the 300 rows go through in several chunks */
    zt_cuda_ctx *ctx = cuda_test_ctx(zt_cuda_lm_head_loss_scratch_bytes(64, vocab));
    int32_t *targets = random_targets(rows, vocab, &normalizer);
    float *x = random_bf16_values(rows * dim, 1.0f), *w = random_bf16_values(vocab * dim, 0.3f);
    float *dw0 = random_f32(vocab * dim, 0.01f);
    float *logits = host_f32(rows * vocab), *row_loss = host_f32(rows);
    float *dx = host_f32(rows * dim), *dw = host_f32(vocab * dim);
    memcpy(dw, dw0, sizeof(float) * (size_t)(vocab * dim));
    ZT_CHECK(zt_cpu_linear_forward(NULL, rows, vocab, dim, x, w, logits) == ZT_OK);
    ZT_CHECK(zt_cpu_cross_entropy(NULL, rows, vocab, logits, targets, normalizer, dloss, row_loss,
                                  &loss, logits, &bad) == ZT_OK); /* logits := dlogits */
    ZT_CHECK(zt_cpu_linear_backward_input(NULL, rows, vocab, dim, logits, w, dx) == ZT_OK);
    ZT_CHECK(zt_cpu_linear_backward_weight(NULL, rows, vocab, dim, logits, x, dw) == ZT_OK);

    uint16_t *d_x = device_bf16(x, rows * dim), *d_w = device_bf16(w, vocab * dim);
    uint16_t *d_dx = device_alloc(rows * dim * 2);
    int32_t *d_t = device_i32(targets, rows);
    float *d_row = device_alloc(rows * 4), *d_dw = device_f32(dw0, vocab * dim);
    double *d_loss = device_alloc(sizeof(double));
    poison_lm_head_scratch(ctx, rows, dim, vocab, d_t, normalizer);
    snprintf(name, sizeof name, "LM head loss (vocab %lld)", (long long)vocab);
    ZT_CHECK(check_ok(name, zt_cuda_lm_head_loss(ctx, 0, rows, dim, vocab, d_x, d_w, d_t, normalizer, dloss,
                                                 d_row, d_loss, d_dx, d_dw)));
    float *g_row = download_f32(d_row, rows), *g_dx = download_bf16(d_dx, rows * dim);
    float *g_dw = download_f32(d_dw, vocab * dim);
    ZT_CHECK(cudaMemcpy(&g_loss, d_loss, sizeof g_loss, cudaMemcpyDeviceToHost) == cudaSuccess);
    float g_loss_f = (float)g_loss, loss_f = (float)loss;
    snprintf(name, sizeof name, "LM head row losses (vocab %lld)", (long long)vocab);
    ZT_CHECK(check_rel_l2(name, g_row, row_loss, rows, 1e-4));
    snprintf(name, sizeof name, "LM head mean loss (vocab %lld)", (long long)vocab);
    ZT_CHECK(check_rel_l2(name, &g_loss_f, &loss_f, 1, 1e-4));
    snprintf(name, sizeof name, "LM head dx (bf16 dlogits, vocab %lld)", (long long)vocab);
    ZT_CHECK(check_rel_l2(name, g_dx, dx, rows * dim, TOL_BF16_CHAIN));
    float *g_inc = difference(g_dw, dw0, vocab * dim), *inc = difference(dw, dw0, vocab * dim);
    snprintf(name, sizeof name, "LM head dw increment (bf16 dlogits, vocab %lld)", (long long)vocab);
    ZT_CHECK(check_rel_l2(name, g_inc, inc, vocab * dim, TOL_BF16_CHAIN));
    if (vocab % 8) { /* the tail rows on their own: a tail GEMM that went missing fails here */
        int64_t body = vocab / 8 * 8, tail = vocab - body;
        snprintf(name, sizeof name, "LM head dw increment of the %lld tail rows (vocab %lld)", (long long)tail,
                 (long long)vocab);
        ZT_CHECK(check_rel_l2(name, g_inc + body * dim, inc + body * dim, tail * dim, TOL_BF16_CHAIN));
    }

    device_poison(d_row, rows * 4);
    snprintf(name, sizeof name, "LM head loss only (vocab %lld)", (long long)vocab);
    ZT_CHECK(check_ok(name, zt_cuda_lm_head_loss(ctx, 0, rows, dim, vocab, d_x, d_w, d_t, normalizer, dloss,
                                                 d_row, d_loss, NULL, NULL)));
    free(g_row);
    g_row = download_f32(d_row, rows);
    snprintf(name, sizeof name, "LM head row losses, loss only (vocab %lld)", (long long)vocab);
    ZT_CHECK(check_rel_l2(name, g_row, row_loss, rows, 1e-4));
    zt_cuda_ctx_destroy(ctx);

    zt_cuda_ctx *tiny = cuda_test_ctx(1024);
    if (zt_cuda_lm_head_loss_scratch_bytes(1, vocab) > 1024) /* vocab 5: one row fits */
        ZT_CHECK(check_fails("LM head loss with too little scratch",
                             zt_cuda_lm_head_loss(tiny, 0, rows, dim, vocab, d_x, d_w, d_t, normalizer,
                                                  dloss, d_row, d_loss, d_dx, d_dw),
                             ZT_ERR_BUFFER_TOO_SMALL, "bytes of scratch"));
    ZT_CHECK(check_fails("LM head loss with dim not a multiple of 8",
                         zt_cuda_lm_head_loss(tiny, 0, rows, 250, vocab, d_x, d_w, d_t, normalizer,
                                              dloss, d_row, d_loss, d_dx, d_dw),
                         ZT_ERR_INVALID_ARG, "dim 250 must be a positive multiple of 8"));
    zt_cuda_ctx_destroy(tiny);
    free(targets), free(x), free(w), free(dw0), free(logits), free(row_loss), free(dx), free(dw);
    free(g_row), free(g_dx), free(g_dw), free(g_inc), free(inc);
    device_free(d_x), device_free(d_w), device_free(d_dx), device_free(d_t), device_free(d_row);
    device_free(d_dw), device_free(d_loss);
}

static void test_lm_head_loss(void)
{
    test_lm_head_loss_vocab(5008);
    test_lm_head_loss_vocab(777);
    test_lm_head_loss_vocab(4099);
    test_lm_head_loss_vocab(5);
}

/* ---- optimizer ------------------------------------------------------------------------------- */

enum { N_TENSORS = 41 }; /* more than one launch's worth of tensors (36) */

static void test_adamw(zt_cuda_ctx *ctx)
{
    int64_t sizes[N_TENSORS];
    /* one tensor of more than one launch's worth of chunks (320 x 65536) */
    sizes[0] = 21000000;
    for (int t = 1; t < N_TENSORS; t++) sizes[t] = test_randint(1, 5000);
    zt_cuda_adamw_params hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                               .weight_decay = 0.1, .step = 0};
    zt_adamw_params cpu_hp = {.lr = hp.lr, .beta1 = hp.beta1, .beta2 = hp.beta2, .eps = hp.eps,
                              .weight_decay = hp.weight_decay};
    const float max_norm = 1.0f;
    float *p[N_TENSORS], *m[N_TENSORS], *v[N_TENSORS], *g[N_TENSORS];
    zt_cuda_param params[N_TENSORS];
    float *d_g[N_TENSORS];
    for (int t = 0; t < N_TENSORS; t++) {
        p[t] = random_f32(sizes[t], 1.0f);
        m[t] = host_f32(sizes[t]), v[t] = host_f32(sizes[t]);
        memset(m[t], 0, sizeof(float) * (size_t)sizes[t]);
        memset(v[t], 0, sizeof(float) * (size_t)sizes[t]);
        params[t] = (zt_cuda_param){.master = device_f32(p[t], sizes[t]),
                                    .exp_avg = device_f32(m[t], sizes[t]),
                                    .exp_avg_sq = device_f32(v[t], sizes[t]),
                                    .compute_copy = device_alloc(sizes[t] * 2),
                                    .n = sizes[t]};
        d_g[t] = device_alloc(sizes[t] * 4);
        params[t].grad = d_g[t];
    }
    float *d_norm = device_alloc(4), *d_coef = device_alloc(4);
    for (int step = 1; step <= 3; step++) {
        for (int t = 0; t < N_TENSORS; t++) {
            g[t] = random_f32(sizes[t], 0.01f);
            ZT_CHECK(cudaMemcpy(d_g[t], g[t], sizeof(float) * (size_t)sizes[t],
                                cudaMemcpyHostToDevice) == cudaSuccess);
        }
        double norm = zt_cpu_global_l2_norm(NULL, N_TENSORS, (const float *const *)g, sizes);
        float coef = fminf(1.0f, max_norm / ((float)norm + 1e-6f));
        for (int t = 0; t < N_TENSORS; t++) zt_cpu_scale(NULL, sizes[t], coef, g[t]);
        cpu_hp.step = hp.step = step;
        for (int t = 0; t < N_TENSORS; t++) zt_cpu_adamw_step(NULL, sizes[t], &cpu_hp, p[t], g[t], m[t], v[t]);

        ZT_CHECK(check_ok("global norm", zt_cuda_global_norm(ctx, 0, N_TENSORS, (const float *const *)d_g,
                                                             sizes, max_norm, d_norm, d_coef)));
        ZT_CHECK(check_ok("adamw step", zt_cuda_adamw_step(ctx, 0, N_TENSORS, params, &hp, d_coef)));
        float *g_norm = download_f32(d_norm, 1), *g_coef = download_f32(d_coef, 1);
        float norm_f = (float)norm;
        ZT_CHECK(check_rel_l2("global gradient norm", g_norm, &norm_f, 1, 1e-6));
        ZT_CHECK(check_rel_l2("clipping coefficient", g_coef, &coef, 1, 1e-6));
        ZT_CHECK(coef < 1.0f); /* the test exercises clipping */
        free(g_norm), free(g_coef);
        for (int t = 0; t < N_TENSORS; t++) free(g[t]);
    }
    int64_t total = 0;
    for (int t = 0; t < N_TENSORS; t++) total += sizes[t];
    float *all[5];
    for (int k = 0; k < 5; k++) all[k] = host_f32(total);
    int64_t at = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        float *gp = download_f32(params[t].master, sizes[t]), *gm = download_f32(params[t].exp_avg, sizes[t]);
        float *gv = download_f32(params[t].exp_avg_sq, sizes[t]);
        float *gc = download_bf16(params[t].compute_copy, sizes[t]);
        memcpy(all[0] + at, gp, sizeof(float) * (size_t)sizes[t]);
        memcpy(all[1] + at, gm, sizeof(float) * (size_t)sizes[t]);
        memcpy(all[2] + at, gv, sizeof(float) * (size_t)sizes[t]);
        memcpy(all[3] + at, gc, sizeof(float) * (size_t)sizes[t]);
        round_to_bf16(gp, sizes[t]);
        memcpy(all[4] + at, gp, sizeof(float) * (size_t)sizes[t]);
        at += sizes[t];
        free(gp), free(gm), free(gv), free(gc);
    }
    float *ref[3];
    for (int k = 0; k < 3; k++) ref[k] = host_f32(total);
    at = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        memcpy(ref[0] + at, p[t], sizeof(float) * (size_t)sizes[t]);
        memcpy(ref[1] + at, m[t], sizeof(float) * (size_t)sizes[t]);
        memcpy(ref[2] + at, v[t], sizeof(float) * (size_t)sizes[t]);
        at += sizes[t];
    }
    ZT_CHECK(check_rel_l2("adamw master weights after 3 steps", all[0], ref[0], total, 1e-6));
    ZT_CHECK(check_rel_l2("adamw exp_avg", all[1], ref[1], total, 1e-6));
    ZT_CHECK(check_rel_l2("adamw exp_avg_sq", all[2], ref[2], total, 1e-6));
    ZT_CHECK(check_identical(cuda_test_dtype16() == ZT_F16 ? "fp16 compute copy = fp16(master)"
                                                           : "bf16 compute copy = bf16(master)",
                             all[3], all[4], total));

    hp.step = 0;
    ZT_CHECK(check_fails("adamw with step 0", zt_cuda_adamw_step(ctx, 0, N_TENSORS, params, &hp, NULL),
                         ZT_ERR_INVALID_ARG, "step 0 must start at 1"));
    ZT_CHECK(check_fails("clipping with max_norm 0",
                         zt_cuda_global_norm(ctx, 0, N_TENSORS, (const float *const *)d_g, sizes, 0.0f,
                                             d_norm, d_coef),
                         ZT_ERR_INVALID_ARG, "max_norm"));
    for (int k = 0; k < 5; k++) free(all[k]);
    for (int k = 0; k < 3; k++) free(ref[k]);
    for (int t = 0; t < N_TENSORS; t++) {
        free(p[t]), free(m[t]), free(v[t]);
        device_free(params[t].master), device_free(params[t].exp_avg);
        device_free(params[t].exp_avg_sq), device_free(params[t].compute_copy), device_free(d_g[t]);
    }
    device_free(d_norm), device_free(d_coef);
}

/* ---- conversions ----------------------------------------------------------------------------- */

static void test_conversions(zt_cuda_ctx *ctx)
{
    const int64_t n = 100003;
    float *x = random_f32(n, 1000.0f);
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 1e-40f /* subnormal */, x[3] = 3.0e38f, x[4] = -1.00390625f;
    /* fp16's edges: the largest finite (65504), the rounding boundary to inf (65520), its subnormals
     * (below 6.1e-5) and the smallest one (2^-24); ordinary values in bf16 */
    x[5] = 65519.0f, x[6] = 65520.0f, x[7] = -70000.0f, x[8] = 1e-6f, x[9] = 3e-8f, x[10] = 2.9e-8f;
    for (int64_t i = 11; i < 5011; i++) x[i] = test_uniform(-1e-4f, 1e-4f);
    float *want = host_f32(n);
    memcpy(want, x, sizeof(float) * (size_t)n);
    round_to_bf16(want, n); /* round to nearest even on the host */
    float *d_x = device_f32(x, n);
    uint16_t *d_b = device_alloc(n * 2);
    ZT_CHECK(check_ok("cast fp32 to bf16", zt_cuda_cast_f32_to_bf16(ctx, 0, n, d_x, d_b)));
    float *got = download_bf16(d_b, n);
    ZT_CHECK(check_identical("cast fp32 to bf16 rounds to nearest even", got, want, n));
    device_poison(d_x, n * 4);
    ZT_CHECK(check_ok("cast bf16 to fp32", zt_cuda_cast_bf16_to_f32(ctx, 0, n, d_b, d_x)));
    float *back = download_f32(d_x, n);
    ZT_CHECK(check_identical("cast bf16 to fp32 is exact", back, want, n));

    float *y = random_bf16_values(n, 10.0f), *sum = host_f32(n);
    for (int64_t i = 0; i < n; i++) sum[i] = y[i] + want[i];
    round_to_bf16(sum, n);
    uint16_t *d_y = device_bf16(y, n);
    ZT_CHECK(check_ok("add bf16", zt_cuda_add_bf16(ctx, 0, n, d_b, d_y)));
    float *g_sum = download_bf16(d_y, n);
    ZT_CHECK(check_identical("add bf16 = bf16(y + x)", g_sum, sum, n));
    free(x), free(want), free(got), free(back), free(y), free(sum), free(g_sum);
    device_free(d_x), device_free(d_b), device_free(d_y);
}

/* ---- naive attention (the unfused reference; the attention of fp16 training) ------------------ */

static void test_naive_attention(zt_cuda_ctx *ctx)
{
    (void)ctx;
    const int64_t B = 2, T = 96, H = 4, Hkv = 2, D = 32;
    zt_attention_shape cs = {B, T, H, Hkv, D, 1.0f / sqrtf((float)D)};
    zt_cuda_attention_shape gs = {B, T, H, Hkv, D, cs.scale};
    int64_t nq = B * T * H * D, nkv = B * T * Hkv * D;
    int32_t *doc = packed_doc_ids(B, T);
    float *q = random_bf16_values(nq, 1.0f), *k = random_bf16_values(nkv, 1.0f);
    float *v = random_bf16_values(nkv, 1.0f), *dout = random_bf16_values(nq, 1.0f);
    float *o = host_f32(nq), *lse = host_f32(B * H * T), *dq = host_f32(nq), *dk = host_f32(nkv);
    float *dv = host_f32(nkv);
    zt_cpu_attention_forward(NULL, &cs, q, k, v, doc, o, lse);
    zt_cpu_attention_backward(NULL, &cs, q, k, v, doc, o, lse, dout, dq, dk, dv);

    zt_cuda_naive_attention *na = NULL;
    ZT_CHECK(check_ok("naive attention handle", zt_cuda_naive_attention_create(0, &na)));
    if (!na) return;
    ZT_CHECK(check_ok("naive attention dtype", zt_cuda_naive_attention_set_dtype(na, cuda_test_dtype16())));
    uint64_t ws_bytes = zt_cuda_naive_attention_backward_workspace_bytes(&gs);
    uint64_t fw = zt_cuda_naive_attention_forward_workspace_bytes(&gs);
    if (fw > ws_bytes) ws_bytes = fw;
    void *ws = device_alloc(ws_bytes);
    int32_t *d_doc = device_i32(doc, B * T);
    uint16_t *d_q = device_bf16(q, nq), *d_k = device_bf16(k, nkv), *d_v = device_bf16(v, nkv);
    uint16_t *d_dout = device_bf16(dout, nq), *d_o = device_alloc(nq * 2);
    uint16_t *d_dq = device_alloc(nq * 2), *d_dk = device_alloc(nkv * 2), *d_dv = device_alloc(nkv * 2);
    float *d_lse = device_alloc(B * H * T * 4);
    ZT_CHECK(check_ok("naive attention forward",
                      zt_cuda_naive_attention_forward(na, 0, &gs, d_q, d_k, d_v, d_doc, d_o, d_lse, ws, ws_bytes)));
    ZT_CHECK(check_ok("naive attention backward",
                      zt_cuda_naive_attention_backward(na, 0, &gs, d_q, d_k, d_v, d_doc, d_o, d_lse, d_dout, d_dq,
                                                       d_dk, d_dv, ws, ws_bytes)));
    float *g_o = download_bf16(d_o, nq), *g_dq = download_bf16(d_dq, nq);
    float *g_dk = download_bf16(d_dk, nkv), *g_dv = download_bf16(d_dv, nkv);
    /* fp32 inside, one rounding of each output (the backward reads the rounded o: a chain) */
    ZT_CHECK(check_rel_l2("naive attention o", g_o, o, nq, TOL_BF16_OUT));
    ZT_CHECK(check_rel_l2("naive attention dq", g_dq, dq, nq, TOL_BF16_CHAIN));
    ZT_CHECK(check_rel_l2("naive attention dk", g_dk, dk, nkv, TOL_BF16_CHAIN));
    ZT_CHECK(check_rel_l2("naive attention dv", g_dv, dv, nkv, TOL_BF16_OUT));
    zt_cuda_naive_attention_destroy(na);
    free(doc), free(q), free(k), free(v), free(dout), free(o), free(lse), free(dq), free(dk), free(dv);
    free(g_o), free(g_dq), free(g_dk), free(g_dv);
    device_free(ws), device_free(d_doc), device_free(d_q), device_free(d_k), device_free(d_v);
    device_free(d_dout), device_free(d_o), device_free(d_dq), device_free(d_dk), device_free(d_dv);
    device_free(d_lse);
}

/* fp16 specifics: overflow saturates to inf (what the loss scaler detects), the host conversion is
 * the device's bit for bit, and a context's type can be switched (GEMM plans are cached per type). */
static void test_fp16_specifics(zt_cuda_ctx *ctx)
{
    float big[8] = {65504.0f, 65535.0f, 1e5f, -1e9f, 60000.0f, 1.0f, -2.0f, 0.5f};
    float *d_big = device_f32(big, 8);
    uint16_t *d_h = device_alloc(16);
    ZT_CHECK(check_ok("cast to fp16", zt_cuda_cast_f32_to_bf16(ctx, 0, 8, d_big, d_h)));
    float *got = download_bf16(d_h, 8);
    ZT_CHECK(got[0] == 65504.0f && isinf(got[1]) && got[1] > 0 && isinf(got[2]) && isinf(got[3]) && got[3] < 0);
    /* a sum past 65504 overflows too: the add kernel rounds once, to inf */
    ZT_CHECK(check_ok("add fp16 past 65504", zt_cuda_add_bf16(ctx, 0, 8, d_h, d_h)));
    free(got);
    got = download_bf16(d_h, 8);
    ZT_CHECK(isinf(got[4]) && got[5] == 2.0f && got[6] == -4.0f && got[7] == 1.0f);
    ZT_CHECK(check_fails("a context in fp32", zt_cuda_ctx_set_dtype(ctx, ZT_F32), ZT_ERR_UNSUPPORTED,
                         "ZT_BF16"));
    ZT_CHECK(zt_cuda_ctx_dtype(ctx) == ZT_F16);
    free(got);
    device_free(d_big), device_free(d_h);
}

static void run_pass(int32_t dtype)
{
    cuda_test_set_dtype16(dtype);
    printf("==== %s pass ====\n", cuda_test_dtype16_name());
    zt_cuda_ctx *ctx = cuda_test_ctx(0);
    ZT_CHECK(zt_cuda_ctx_dtype(ctx) == dtype);
    test_conversions(ctx);
    if (dtype == ZT_F16) test_fp16_specifics(ctx);
    test_gemm(ctx);
    test_linear(ctx);
    test_rmsnorm(ctx);
    test_rope(ctx);
    test_swiglu(ctx);
    test_embedding(ctx);
    test_cross_entropy(ctx);
    test_lm_head_loss();
    test_adamw(ctx);
    test_naive_attention(ctx);
    ZT_CHECK(check_ok("no index errors left", zt_cuda_check_indices(ctx, 0)));
    zt_cuda_ctx_destroy(ctx);
}

int main(void)
{
    cuda_test_init("test_cuda_ops");
    run_pass(ZT_BF16);
    run_pass(ZT_F16);
    return zt_test_result();
}
