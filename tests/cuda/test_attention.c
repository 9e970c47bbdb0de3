/* Flash attention (kernels/cuda) against the naive fp32 attention of kernels/cpu: forward output
 * and log-sum-exp, and all three gradients, on shapes that exercise partial tiles, grouped-query
 * heads, packed documents (monotone and arbitrary document ids) and both head dimensions; every
 * kernel (mma.sync, and wgmma on Hopper) explicitly, each backward on each forward's output; the
 * warp-specialized Hopper backward (wgmma-ws, auto's backward on Hopper) too.
 * Everything runs twice, as test_ops.c does: in bf16, then in fp16 (the context set to ZT_F16, the
 * kernels' __half instantiations; inputs rounded to fp16 and the fp16 tolerances: 2e-3 relative L2
 * for o, dq, dk, dv instead of 1.5e-2; lse keeps 1e-4), plus fp16 runs with a loss-scaled dO (2^10,
 * as fp16 training feeds the backward) whose gradients must stay finite and as accurate.
 * ZT_TEST_FLASH_BACKWARDS=name[,name...] runs only the named backward kernels (e.g. wgmma-ws under
 * compute-sanitizer, which is slow); the forwards all run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/flash_kernel.h"
#include "cuda_test.h"
#include "ztest.h"

typedef enum doc_layout { NO_DOCS, PACKED_DOCS, SCATTERED_DOCS } doc_layout;

static int32_t *make_doc_ids(int64_t batch, int64_t seq, doc_layout layout)
{
    if (layout == NO_DOCS) return NULL;
    int32_t *doc = malloc(sizeof(int32_t) * (size_t)(batch * seq));
    for (int64_t b = 0; b < batch; b++) {
        int32_t id = 0;
        int64_t left = test_randint(1, 200);
        for (int64_t t = 0; t < seq; t++) {
            if (layout == SCATTERED_DOCS) {
                doc[b * seq + t] = test_randint(0, 3);
                continue;
            }
            if (left-- == 0) { /* documents of 1 to 199 tokens, back to back */
                id++;
                left = test_randint(1, 200) - 1;
            }
            doc[b * seq + t] = id;
        }
    }
    return doc;
}

/* check_rel_l2 on a [B, T, H, D] tensor (H, D = 1 for lse's [B, H, T] read as rows); when it fails,
 * also where: the first non-finite element and the relative error by row % 64 / 8 and by 8-column
 * chunk, which points at a wrong fragment, tile or swizzle in one run on the GPU. */
static int check_bthd(const char *what, const float *got, const float *ref, int64_t B, int64_t T,
                      int64_t H, int64_t D, double tol)
{
    int64_t n = B * T * H * D;
    /* A reference at rounding-noise level (dq and dk at T = 1 are exactly zero in exact arithmetic:
     * P = 1, so dS = P (dP - rowsum(dO O)) = 0) has no meaningful relative error: there, as
     * allclose's atol does, the error is measured against a floor of 1e-4 per element (the
     * gradients of every other case are thousands of times larger). */
    double ref_sq = 0, diff_sq = 0;
    for (int64_t i = 0; i < n; i++) {
        ref_sq += (double)ref[i] * ref[i];
        diff_sq += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    }
    if (n > 0 && sqrt(ref_sq / (double)n) < 1e-4 && isfinite(diff_sq)) {
        /* that noise comes from fp32 summation order, whatever the 16-bit type: the fp16 pass keeps the
         * bf16 pass's absolute allowance (1.5e-2 x 1e-4) instead of tightening it with its tolerance */
        if (tol < TOL_BF16_CHAIN_VALUE) tol = TOL_BF16_CHAIN_VALUE;
        double err = sqrt(diff_sq / (double)n) / 1e-4;
        printf("%s %s: reference at noise level (rms %.3g): rms error / 1e-4 = %.3g (tolerance %g)\n",
               err <= tol ? "ok  " : "FAIL", what, sqrt(ref_sq / (double)n), err, tol);
        return err <= tol;
    }
    if (check_rel_l2(what, got, ref, n, tol)) return 1;
    double row_diff[8] = {0}, row_norm[8] = {0}, col_diff[16] = {0}, col_norm[16] = {0};
    int64_t first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t d = i % D, t = (i / (D * H)) % T;
        if (!isfinite(got[i])) {
            if (first_bad < 0) first_bad = i;
            continue;
        }
        double e = ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]), r = (double)ref[i] * ref[i];
        row_diff[t % 64 / 8] += e, row_norm[t % 64 / 8] += r;
        col_diff[d / 8 % 16] += e, col_norm[d / 8 % 16] += r;
    }
    if (first_bad >= 0)
        printf("  %s: first non-finite at b=%lld t=%lld h=%lld d=%lld\n", what,
               (long long)(first_bad / (T * H * D)), (long long)(first_bad / (H * D) % T),
               (long long)(first_bad / D % H), (long long)(first_bad % D));
    printf("  %s: rel error by row %% 64 / 8:", what);
    for (int i = 0; i < 8; i++) printf(" %.2g", row_norm[i] > 0 ? sqrt(row_diff[i] / row_norm[i]) : 0.0);
    printf("\n  %s: rel error by column / 8:", what);
    for (int i = 0; i < 16 && i < D / 8 + (D < 8); i++)
        printf(" %.2g", col_norm[i] > 0 ? sqrt(col_diff[i] / col_norm[i]) : 0.0);
    printf("\n");
    return 0;
}

/* The kernels under test, forward and backward: each runs explicitly (not through ZT_FLASH_KERNEL),
 * every backward on every forward's output. The wgmma kernels run where zt_cuda_flash_kernel_resolve
 * allows them (an sm_90a build on a compute capability 9.0 GPU); elsewhere main says so once, and on
 * such a GPU with such a build they must run. */
static const zt_cuda_flash_kernel k_kernels[] = {ZT_CUDA_FLASH_MMA, ZT_CUDA_FLASH_WGMMA, ZT_CUDA_FLASH_WGMMA_WS};
enum { N_FORWARDS = 2, N_BACKWARDS = 3 }; /* wgmma-ws is a backward kernel only */
static int g_kernel_runs[N_BACKWARDS];
static int g_backward_selected[N_BACKWARDS];
/* dO is multiplied by this (a power of two: exact in both types) for the loss-scaled runs; the CPU
 * reference's gradients scale with it. */
static float g_dout_scale = 1.0f;

static void test_shape(zt_cuda_ctx *ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       doc_layout layout)
{
    char label[200], name[300], what[64];
    static const char *const layouts[] = {"no documents", "packed documents", "scattered doc ids"};
    const char *type = cuda_test_dtype16_name();
    snprintf(label, sizeof label, "B=%lld T=%lld H=%lld Hkv=%lld D=%lld, %s, %s%s", (long long)B,
             (long long)T, (long long)H, (long long)Hkv, (long long)D, layouts[layout], type,
             g_dout_scale != 1.0f ? ", dO x 1024" : "");
    zt_attention_shape cs = {.batch = B, .seq = T, .heads = H, .kv_heads = Hkv, .head_dim = D,
                             .scale = 1.0f / sqrtf((float)D)};
    zt_cuda_attention_shape gs = {.batch = B, .seq = T, .heads = H, .kv_heads = Hkv,
                                  .head_dim = D, .scale = cs.scale};
    int64_t nq = B * T * H * D, nkv = B * T * Hkv * D, nl = B * H * T;
    float *q = random_bf16_values(nq, 2.0f), *k = random_bf16_values(nkv, 2.0f);
    float *v = random_bf16_values(nkv, 1.0f), *dout = random_bf16_values(nq, 1.0f);
    for (int64_t i = 0; i < nq; i++) dout[i] *= g_dout_scale;
    int32_t *doc = make_doc_ids(B, T, layout);
    float *o = host_f32(nq), *lse = host_f32(nl), *dq = host_f32(nq), *dk = host_f32(nkv);
    float *dv = host_f32(nkv);
    zt_cpu_attention_forward(NULL, &cs, q, k, v, doc, o, lse);
    zt_cpu_attention_backward(NULL, &cs, q, k, v, doc, o, lse, dout, dq, dk, dv);

    uint16_t *d_q = device_bf16(q, nq), *d_k = device_bf16(k, nkv), *d_v = device_bf16(v, nkv);
    uint16_t *d_dout = device_bf16(dout, nq), *d_o = device_alloc(nq * 2);
    uint16_t *d_dq = device_alloc(nq * 2), *d_dk = device_alloc(nkv * 2), *d_dv = device_alloc(nkv * 2);
    float *d_lse = device_alloc(nl * 4);
    int32_t *d_doc = doc ? device_i32(doc, B * T) : NULL;

    for (int ki = 0; ki < N_FORWARDS; ki++) {
        if (!g_kernel_runs[ki]) continue; /* main reported why, once */
        zt_cuda_flash_kernel kern = k_kernels[ki];
        const char *kname = zt_cuda_flash_kernel_name(kern);
        /* poisoned outputs: a row the kernel forgets to write fails the comparison */
        device_poison(d_o, nq * 2);
        device_poison(d_lse, nl * 4);
        snprintf(name, sizeof name, "flash forward (%s) %s", kname, label);
        ZT_CHECK(check_ok(name, zt_cuda_flash_attention_forward_kernel(ctx, 0, &gs, kern, d_q, d_k, d_v,
                                                                       d_doc, d_o, d_lse)));
        float *g_o = download_bf16(d_o, nq), *g_lse = download_f32(d_lse, nl);
        snprintf(what, sizeof what, "  o (%s)", type);
        ZT_CHECK(check_bthd(what, g_o, o, B, T, H, D, TOL_BF16_CHAIN));
        ZT_CHECK(check_bthd("  lse (fp32)", g_lse, lse, B * H, T, 1, 1, 1e-4));

        /* each backward kernel on this forward's o and lse */
        for (int kj = 0; kj < N_BACKWARDS; kj++) {
            if (!g_kernel_runs[kj] || !g_backward_selected[kj]) continue;
            zt_cuda_flash_kernel bkern = k_kernels[kj];
            device_poison(d_dq, nq * 2);
            device_poison(d_dk, nkv * 2);
            device_poison(d_dv, nkv * 2);
            snprintf(name, sizeof name, "flash backward (%s) after the %s forward, %s",
                     zt_cuda_flash_kernel_name(bkern), kname, label);
            ZT_CHECK(check_ok(name, zt_cuda_flash_attention_backward_kernel(ctx, 0, &gs, bkern, d_q, d_k, d_v,
                                                                            d_doc, d_o, d_lse, d_dout, d_dq,
                                                                            d_dk, d_dv)));
            float *g_dq = download_bf16(d_dq, nq), *g_dk = download_bf16(d_dk, nkv);
            float *g_dv = download_bf16(d_dv, nkv);
            snprintf(what, sizeof what, "  dq (%s)", type);
            ZT_CHECK(check_bthd(what, g_dq, dq, B, T, H, D, TOL_BF16_CHAIN));
            snprintf(what, sizeof what, "  dk (%s)", type);
            ZT_CHECK(check_bthd(what, g_dk, dk, B, T, Hkv, D, TOL_BF16_CHAIN));
            snprintf(what, sizeof what, "  dv (%s)", type);
            ZT_CHECK(check_bthd(what, g_dv, dv, B, T, Hkv, D, TOL_BF16_CHAIN));

            /* dK and dV are summed in registers in a fixed order (only dQ uses atomics): a second
             * run must give the same bits, which a race would not */
            device_poison(d_dk, nkv * 2);
            device_poison(d_dv, nkv * 2);
            ZT_CHECK(check_ok(name, zt_cuda_flash_attention_backward_kernel(ctx, 0, &gs, bkern, d_q, d_k, d_v,
                                                                            d_doc, d_o, d_lse, d_dout, d_dq,
                                                                            d_dk, d_dv)));
            float *g_dk2 = download_bf16(d_dk, nkv), *g_dv2 = download_bf16(d_dv, nkv);
            ZT_CHECK(check_identical("  dk is deterministic", g_dk, g_dk2, nkv));
            ZT_CHECK(check_identical("  dv is deterministic", g_dv, g_dv2, nkv));
            free(g_dq), free(g_dk), free(g_dv), free(g_dk2), free(g_dv2);
        }

        /* the forward has no atomics: a second run must give the same bits (a race would not) */
        device_poison(d_o, nq * 2);
        ZT_CHECK(check_ok(name, zt_cuda_flash_attention_forward_kernel(ctx, 0, &gs, kern, d_q, d_k, d_v,
                                                                       d_doc, d_o, d_lse)));
        float *g_o2 = download_bf16(d_o, nq);
        ZT_CHECK(check_identical("  forward is deterministic", g_o, g_o2, nq));
        free(g_o), free(g_lse), free(g_o2);
    }

    free(q), free(k), free(v), free(dout), free(doc), free(o), free(lse), free(dq), free(dk), free(dv);
    device_free(d_q), device_free(d_k), device_free(d_v), device_free(d_dout), device_free(d_o);
    device_free(d_dq), device_free(d_dk), device_free(d_dv), device_free(d_lse);
    if (d_doc) device_free(d_doc);
}

/* Which kernels run here; on a compute capability 9.0 GPU with an sm_90a build, both must. */
static void choose_kernels(zt_cuda_ctx *ctx)
{
    zt_cuda_attention_shape s = {.batch = 1, .seq = 64, .heads = 1, .kv_heads = 1, .head_dim = 128,
                                 .scale = 0.1f};
    zt_cuda_flash_kernel got;
    g_kernel_runs[0] = 1;
    ZT_CHECK(check_ok("mma kernel resolves", zt_cuda_flash_kernel_resolve(ctx, &s, ZT_CUDA_FLASH_MMA, &got)));
    ZT_CHECK(got == ZT_CUDA_FLASH_MMA);
    struct cudaDeviceProp prop;
    ZT_CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    int hopper = prop.major == 9 && prop.minor == 0;
    zt_status st = zt_cuda_flash_kernel_resolve(ctx, &s, ZT_CUDA_FLASH_WGMMA, &got);
    g_kernel_runs[1] = st == ZT_OK;
    zt_cuda_flash_kernel got_ws = ZT_CUDA_FLASH_AUTO;
    zt_status st_ws = zt_cuda_flash_kernel_resolve(ctx, &s, ZT_CUDA_FLASH_WGMMA_WS, &got_ws);
    g_kernel_runs[2] = st_ws == ZT_OK;
    if (hopper && zt_cuda_flash_wgmma_built()) {
        ZT_CHECK(check_ok("wgmma kernel resolves on this compute capability 9.0 GPU", st));
        ZT_CHECK(check_ok("wgmma-ws kernel resolves on this compute capability 9.0 GPU", st_ws));
        ZT_CHECK(got_ws == ZT_CUDA_FLASH_WGMMA_WS);
        /* auto's forward is wgmma (its backward wgmma-ws: flash_backward.cu) */
        ZT_CHECK(check_ok("auto resolves", zt_cuda_flash_kernel_resolve(ctx, &s, ZT_CUDA_FLASH_AUTO, &got)));
        ZT_CHECK(got == ZT_CUDA_FLASH_WGMMA);
    } else {
        ZT_CHECK(check_fails("wgmma kernel where it cannot run", st, ZT_ERR_UNSUPPORTED, "wgmma kernel"));
        ZT_CHECK(check_fails("wgmma-ws kernel where it cannot run", st_ws, ZT_ERR_UNSUPPORTED, "wgmma kernel"));
        printf("NOTE: the wgmma kernel is not tested here (%s GPU %d.%d, sm_90a code %s): only the mma "
               "kernel runs\n", prop.name, prop.major, prop.minor,
               zt_cuda_flash_wgmma_built() ? "built" : "not built");
    }
    /* ZT_TEST_FLASH_BACKWARDS: the backward kernels to run (all by default) */
    const char *only = getenv("ZT_TEST_FLASH_BACKWARDS");
    for (int i = 0; i < N_BACKWARDS; i++) g_backward_selected[i] = !only || !*only;
    if (only && *only) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", only);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            zt_cuda_flash_kernel kern;
            int found = 0;
            if (zt_cuda_flash_kernel_parse(tok, &kern) == ZT_OK)
                for (int i = 0; i < N_BACKWARDS; i++)
                    if (k_kernels[i] == kern) g_backward_selected[i] = found = 1;
            if (!found) {
                fprintf(stderr, "ZT_TEST_FLASH_BACKWARDS=%s: '%s' is not a backward kernel (mma, wgmma, wgmma-ws)\n",
                        only, tok);
                exit(2);
            }
        }
        printf("NOTE: ZT_TEST_FLASH_BACKWARDS=%s: only these backward kernels run\n", only);
    }
}

static void test_errors(zt_cuda_ctx *ctx)
{
    void *p = device_alloc(1 << 16);
    zt_cuda_attention_shape s = {.batch = 1, .seq = 16, .heads = 4, .kv_heads = 4, .head_dim = 96,
                                 .scale = 0.1f};
    ZT_CHECK(check_fails("flash with head_dim 96",
                         zt_cuda_flash_attention_forward(ctx, 0, &s, p, p, p, NULL, p, p),
                         ZT_ERR_UNSUPPORTED, "head_dim 96 is not supported"));
    s.head_dim = 64;
    s.kv_heads = 3;
    ZT_CHECK(check_fails("flash with 4 heads over 3 kv heads",
                         zt_cuda_flash_attention_forward(ctx, 0, &s, p, p, p, NULL, p, p),
                         ZT_ERR_INVALID_ARG, "heads a multiple of kv_heads"));
    s.kv_heads = 4;
    zt_cuda_ctx *tiny = cuda_test_ctx(1024);
    ZT_CHECK(check_fails("flash backward with too little scratch",
                         zt_cuda_flash_attention_backward(tiny, 0, &s, p, p, p, NULL, p, p, p, p, p, p),
                         ZT_ERR_BUFFER_TOO_SMALL, "flash attention backward needs"));
    zt_cuda_ctx_destroy(tiny);

    zt_cuda_flash_kernel kern;
    ZT_CHECK(check_fails("ZT_FLASH_KERNEL=fast", zt_cuda_flash_kernel_parse("fast", &kern),
                         ZT_ERR_INVALID_ARG, "not a flash attention kernel"));
    ZT_CHECK(check_ok("ZT_FLASH_KERNEL=wgmma", zt_cuda_flash_kernel_parse("wgmma", &kern)));
    ZT_CHECK(kern == ZT_CUDA_FLASH_WGMMA);
    ZT_CHECK(check_ok("ZT_FLASH_BACKWARD_KERNEL=wgmma-ws", zt_cuda_flash_kernel_parse("wgmma-ws", &kern)));
    ZT_CHECK(kern == ZT_CUDA_FLASH_WGMMA_WS);
    ZT_CHECK(!strcmp(zt_cuda_flash_kernel_name(ZT_CUDA_FLASH_WGMMA_WS), "wgmma-ws"));
    ZT_CHECK(check_ok("ZT_FLASH_KERNEL unset", zt_cuda_flash_kernel_parse(NULL, &kern)));
    ZT_CHECK(kern == ZT_CUDA_FLASH_AUTO);
    /* the environment reaches the forward: a bad value fails it, with the variable named */
    setenv("ZT_FLASH_KERNEL", "fast", 1);
    ZT_CHECK(check_fails("forward under ZT_FLASH_KERNEL=fast",
                         zt_cuda_flash_attention_forward(ctx, 0, &s, p, p, p, NULL, p, p),
                         ZT_ERR_INVALID_ARG, "ZT_FLASH_KERNEL=fast"));
    unsetenv("ZT_FLASH_KERNEL");
    setenv("ZT_FLASH_BACKWARD_KERNEL", "slow", 1);
    ZT_CHECK(check_fails("backward under ZT_FLASH_BACKWARD_KERNEL=slow",
                         zt_cuda_flash_attention_backward(ctx, 0, &s, p, p, p, NULL, p, p, p, p, p, p),
                         ZT_ERR_INVALID_ARG, "ZT_FLASH_BACKWARD_KERNEL=slow"));
    unsetenv("ZT_FLASH_BACKWARD_KERNEL");
    if (g_kernel_runs[1]) { /* the wgmma backward's split of a GQA group must divide it */
        setenv("ZT_FLASH_BACKWARD_SPLIT", "3", 1);
        ZT_CHECK(check_fails("wgmma backward under ZT_FLASH_BACKWARD_SPLIT=3 (group 1)",
                             zt_cuda_flash_attention_backward_kernel(ctx, 0, &s, ZT_CUDA_FLASH_WGMMA, p, p, p, NULL,
                                                                     p, p, p, p, p, p),
                             ZT_ERR_INVALID_ARG, "ZT_FLASH_BACKWARD_SPLIT=3"));
        unsetenv("ZT_FLASH_BACKWARD_SPLIT");
        setenv("ZT_FLASH_BACKWARD_SPLIT", "3", 1);
        s.head_dim = 128;
        ZT_CHECK(check_fails("wgmma-ws backward under ZT_FLASH_BACKWARD_SPLIT=3 (group 1)",
                             zt_cuda_flash_attention_backward_kernel(ctx, 0, &s, ZT_CUDA_FLASH_WGMMA_WS, p, p, p,
                                                                     NULL, p, p, p, p, p, p),
                             ZT_ERR_INVALID_ARG, "ZT_FLASH_BACKWARD_SPLIT=3"));
        unsetenv("ZT_FLASH_BACKWARD_SPLIT");
        s.head_dim = 64;
        setenv("ZT_FLASH_BACKWARD_DQ", "fast", 1);
        ZT_CHECK(check_fails("wgmma backward under ZT_FLASH_BACKWARD_DQ=fast",
                             zt_cuda_flash_attention_backward_kernel(ctx, 0, &s, ZT_CUDA_FLASH_WGMMA, p, p, p, NULL,
                                                                     p, p, p, p, p, p),
                             ZT_ERR_INVALID_ARG, "ZT_FLASH_BACKWARD_DQ=fast"));
        unsetenv("ZT_FLASH_BACKWARD_DQ");
        setenv("ZT_FLASH_BACKWARD_RING", "yes", 1);
        ZT_CHECK(check_fails("wgmma backward under ZT_FLASH_BACKWARD_RING=yes",
                             zt_cuda_flash_attention_backward_kernel(ctx, 0, &s, ZT_CUDA_FLASH_WGMMA, p, p, p, NULL,
                                                                     p, p, p, p, p, p),
                             ZT_ERR_INVALID_ARG, "ZT_FLASH_BACKWARD_RING=yes"));
        unsetenv("ZT_FLASH_BACKWARD_RING");
    }
    device_free(p);
}

/* Every shape and kernel variant in the current 16-bit type (cuda_test_set_dtype16). */
static void run_pass(int32_t dtype)
{
    cuda_test_set_dtype16(dtype);
    printf("==== %s pass ====\n", cuda_test_dtype16_name());
    zt_cuda_ctx *ctx = cuda_test_ctx(0);
    ZT_CHECK(zt_cuda_ctx_dtype(ctx) == dtype);
    choose_kernels(ctx);
    test_shape(ctx, 2, 200, 4, 4, 64, NO_DOCS);      /* partial tiles */
    test_shape(ctx, 1, 300, 8, 2, 128, NO_DOCS);     /* grouped-query heads */
    test_shape(ctx, 2, 384, 4, 1, 128, PACKED_DOCS); /* multi-query, packed documents */
    test_shape(ctx, 1, 257, 2, 2, 64, SCATTERED_DOCS);
    test_shape(ctx, 1, 1024, 4, 2, 128, PACKED_DOCS); /* many tiles skipped by the document mask */
    test_shape(ctx, 3, 64, 2, 1, 128, NO_DOCS);       /* one tile */
    test_shape(ctx, 2, 520, 6, 3, 64, PACKED_DOCS);   /* grouped-query heads with documents */
    test_shape(ctx, 1, 1, 2, 1, 128, NO_DOCS);        /* one token */
    test_shape(ctx, 2, 777, 4, 2, 64, NO_DOCS);       /* hd 64, many tiles, odd length */
    test_shape(ctx, 1, 1500, 2, 1, 128, SCATTERED_DOCS); /* many pipelined tiles, arbitrary ids */
    test_shape(ctx, 2, 512, 16, 2, 64, PACKED_DOCS);  /* GQA group 8 (the 1b model's) with documents */
    test_shape(ctx, 2, 640, 8, 2, 128, NO_DOCS);      /* hd 128 GQA: several heads per block, ring wraps */
    /* The wgmma backward splits a small problem's groups over blocks (dK/dV partial sums, here all
     * 8 heads apart); other splits, and none, by the tuning variable: */
    static const char *const splits[] = {"2", "1"};
    for (int i = 0; i < 2; i++) {
        printf("NOTE: ZT_FLASH_BACKWARD_SPLIT=%s for the next shapes\n", splits[i]);
        setenv("ZT_FLASH_BACKWARD_SPLIT", splits[i], 1);
        test_shape(ctx, 2, 512, 16, 2, 64, PACKED_DOCS);
        test_shape(ctx, 1, 300, 8, 2, 128, NO_DOCS);
        unsetenv("ZT_FLASH_BACKWARD_SPLIT");
    }
    /* the wgmma backward's other dQ path: 16-byte atomics from registers instead of bulk reduce-adds */
    printf("NOTE: ZT_FLASH_BACKWARD_DQ=atomic for the next shapes\n");
    setenv("ZT_FLASH_BACKWARD_DQ", "atomic", 1);
    test_shape(ctx, 2, 200, 4, 4, 64, NO_DOCS);
    test_shape(ctx, 2, 520, 6, 3, 64, PACKED_DOCS);
    test_shape(ctx, 1, 1500, 2, 1, 128, SCATTERED_DOCS);
    unsetenv("ZT_FLASH_BACKWARD_DQ");
    /* head dim 64's warpgroups meeting at a block barrier per tile instead of the mbarrier ring */
    printf("NOTE: ZT_FLASH_BACKWARD_RING=0 for the next shapes\n");
    setenv("ZT_FLASH_BACKWARD_RING", "0", 1);
    test_shape(ctx, 2, 520, 6, 3, 64, PACKED_DOCS);
    test_shape(ctx, 1, 257, 2, 2, 64, SCATTERED_DOCS);
    unsetenv("ZT_FLASH_BACKWARD_RING");
    if (dtype == ZT_F16) {
        /* fp16 training scales the loss (2^10 .. 2^16 typically): dO arrives scaled, and dP, dS and the
         * gradients with it (here up to ~1e4): fp16's range (65504) must hold them, at the same precision */
        g_dout_scale = 1024.0f;
        test_shape(ctx, 2, 200, 4, 4, 64, NO_DOCS);
        test_shape(ctx, 1, 300, 8, 2, 128, NO_DOCS);
        test_shape(ctx, 2, 520, 6, 3, 64, PACKED_DOCS);
        g_dout_scale = 1.0f;
    }
    if (dtype == ZT_BF16) test_errors(ctx);
    zt_cuda_ctx_destroy(ctx);
}

int main(void)
{
    cuda_test_init("test_cuda_attention");
    run_pass(ZT_BF16);
    run_pass(ZT_F16);
    return zt_test_result();
}
