/* Flash attention (kernels/cuda) against the naive fp32 attention of kernels/cpu: forward output
 * and log-sum-exp, and all three gradients, on shapes that exercise partial tiles, grouped-query
 * heads, packed documents (monotone and arbitrary document ids) and both head dimensions. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
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

static void test_shape(zt_cuda_ctx *ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       doc_layout layout)
{
    char label[160], name[224];
    static const char *const layouts[] = {"no documents", "packed documents", "scattered doc ids"};
    snprintf(label, sizeof label, "B=%lld T=%lld H=%lld Hkv=%lld D=%lld, %s", (long long)B,
             (long long)T, (long long)H, (long long)Hkv, (long long)D, layouts[layout]);
    zt_attention_shape cs = {.batch = B, .seq = T, .heads = H, .kv_heads = Hkv, .head_dim = D,
                             .scale = 1.0f / sqrtf((float)D)};
    zt_cuda_attention_shape gs = {.batch = B, .seq = T, .heads = H, .kv_heads = Hkv,
                                  .head_dim = D, .scale = cs.scale};
    int64_t nq = B * T * H * D, nkv = B * T * Hkv * D, nl = B * H * T;
    float *q = random_bf16_values(nq, 2.0f), *k = random_bf16_values(nkv, 2.0f);
    float *v = random_bf16_values(nkv, 1.0f), *dout = random_bf16_values(nq, 1.0f);
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

    snprintf(name, sizeof name, "flash forward %s", label);
    ZT_CHECK(check_ok(name, zt_cuda_flash_attention_forward(ctx, 0, &gs, d_q, d_k, d_v, d_doc, d_o, d_lse)));
    float *g_o = download_bf16(d_o, nq), *g_lse = download_f32(d_lse, nl);
    snprintf(name, sizeof name, "  o (bf16)");
    ZT_CHECK(check_rel_l2(name, g_o, o, nq, TOL_BF16_CHAIN));
    snprintf(name, sizeof name, "  lse (fp32)");
    ZT_CHECK(check_rel_l2(name, g_lse, lse, nl, 1e-4));

    snprintf(name, sizeof name, "flash backward %s", label);
    ZT_CHECK(check_ok(name, zt_cuda_flash_attention_backward(ctx, 0, &gs, d_q, d_k, d_v, d_doc, d_o,
                                                             d_lse, d_dout, d_dq, d_dk, d_dv)));
    float *g_dq = download_bf16(d_dq, nq), *g_dk = download_bf16(d_dk, nkv);
    float *g_dv = download_bf16(d_dv, nkv);
    ZT_CHECK(check_rel_l2("  dq (bf16)", g_dq, dq, nq, TOL_BF16_CHAIN));
    ZT_CHECK(check_rel_l2("  dk (bf16)", g_dk, dk, nkv, TOL_BF16_CHAIN));
    ZT_CHECK(check_rel_l2("  dv (bf16)", g_dv, dv, nkv, TOL_BF16_CHAIN));

    /* dK and dV are summed in registers in a fixed order (only dQ uses atomics): a second run
     * must give the same bits, which a race would not */
    device_poison(d_dk, nkv * 2);
    device_poison(d_dv, nkv * 2);
    ZT_CHECK(check_ok(name, zt_cuda_flash_attention_backward(ctx, 0, &gs, d_q, d_k, d_v, d_doc, d_o,
                                                             d_lse, d_dout, d_dq, d_dk, d_dv)));
    float *g_dk2 = download_bf16(d_dk, nkv), *g_dv2 = download_bf16(d_dv, nkv);
    ZT_CHECK(check_identical("  dk is deterministic", g_dk, g_dk2, nkv));
    ZT_CHECK(check_identical("  dv is deterministic", g_dv, g_dv2, nkv));
    free(g_dk2), free(g_dv2);

    /* the forward has no atomics: a second run must give the same bits (a race would not) */
    device_poison(d_o, nq * 2);
    ZT_CHECK(check_ok(name, zt_cuda_flash_attention_forward(ctx, 0, &gs, d_q, d_k, d_v, d_doc, d_o, d_lse)));
    float *g_o2 = download_bf16(d_o, nq);
    ZT_CHECK(check_identical("  forward is deterministic", g_o, g_o2, nq));

    free(q), free(k), free(v), free(dout), free(doc), free(o), free(lse), free(dq), free(dk), free(dv);
    free(g_o), free(g_lse), free(g_dq), free(g_dk), free(g_dv), free(g_o2);
    device_free(d_q), device_free(d_k), device_free(d_v), device_free(d_dout), device_free(d_o);
    device_free(d_dq), device_free(d_dk), device_free(d_dv), device_free(d_lse);
    if (d_doc) device_free(d_doc);
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
    device_free(p);
}

int main(void)
{
    cuda_test_init("test_cuda_attention");
    zt_cuda_ctx *ctx = cuda_test_ctx(0);
    test_shape(ctx, 2, 200, 4, 4, 64, NO_DOCS);      /* partial tiles */
    test_shape(ctx, 1, 300, 8, 2, 128, NO_DOCS);     /* grouped-query heads */
    test_shape(ctx, 2, 384, 4, 1, 128, PACKED_DOCS); /* multi-query, packed documents */
    test_shape(ctx, 1, 257, 2, 2, 64, SCATTERED_DOCS);
    test_shape(ctx, 1, 1024, 4, 2, 128, PACKED_DOCS); /* many tiles skipped by the document mask */
    test_shape(ctx, 3, 64, 2, 1, 128, NO_DOCS);       /* one tile */
    test_shape(ctx, 2, 520, 6, 3, 64, PACKED_DOCS);   /* grouped-query heads with documents */
    test_errors(ctx);
    zt_cuda_ctx_destroy(ctx);
    return zt_test_result();
}
