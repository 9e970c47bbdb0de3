/* The flash attention plugin, loaded through the registry and a CUDA runtime as zt-run loads it,
 * against the CPU attention kernel (kernels/cpu, itself checked against torch) on the same
 * bf16-rounded inputs: the flash kernels (head_dim 64, 128) and the exact fallback (other head
 * sizes), grouped-query heads, packed documents with padding, forward and backward; then its error
 * messages. usage: test_flash_plugin PLUGINS_D */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "ztest.h"

typedef struct fixture {
    zt_runtime *rt;
    zt_registry *reg;
    zt_loaded_plugin lp;
    const zt_attention_ops *ops;
} fixture;

static const char *take_error(fixture *f, zt_status *st)
{
    return zt_runtime_take_error(f->lp.host, st);
}

static void check_case(fixture *f, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int packed)
{
    char name[128];
    snprintf(name, sizeof name, "B%lld T%lld H%lld/%lld D%lld %s", (long long)B, (long long)T, (long long)H,
             (long long)Hkv, (long long)D, packed ? "packed" : "causal");
    int64_t nq = B * T * H * D, nkv = B * T * Hkv * D;
    float *q = random_bf16_values(nq, 1.0f), *k = random_bf16_values(nkv, 1.0f), *v = random_bf16_values(nkv, 1.0f);
    float *dout = random_bf16_values(nq, 1.0f);
    int32_t *doc = packed ? packed_doc_ids(B, T) : NULL;
    float *o = host_f32(nq), *lse = host_f32(B * H * T), *dq = host_f32(nq), *dk = host_f32(nkv), *dv = host_f32(nkv);
    zt_attention_shape cs = {B, T, H, Hkv, D, 1.0f / sqrtf((float)D)};
    zt_cpu_attention_forward(NULL, &cs, q, k, v, doc, o, lse);
    zt_cpu_attention_backward(NULL, &cs, q, k, v, doc, o, lse, dout, dq, dk, dv);

    uint16_t *d_q = device_bf16(q, nq), *d_k = device_bf16(k, nkv), *d_v = device_bf16(v, nkv);
    uint16_t *d_dout = device_bf16(dout, nq);
    uint16_t *d_o = device_alloc((uint64_t)nq * 2), *d_dq = device_alloc((uint64_t)nq * 2);
    uint16_t *d_dk = device_alloc((uint64_t)nkv * 2), *d_dv = device_alloc((uint64_t)nkv * 2);
    int32_t *d_doc = doc ? device_i32(doc, B * T) : NULL;
    zt_batch batch = {.struct_size = sizeof batch, .batch = (int32_t)B, .seq_len = (int32_t)T, .doc_ids = d_doc};
    zt_attn_args a = {.struct_size = sizeof a, .n_heads = (int32_t)H, .n_kv_heads = (int32_t)Hkv,
                      .head_dim = (int32_t)D, .scale = cs.scale, .causal = 1, .batch = &batch};
    a.q = attention_view(d_q, ZT_BF16, B, T, H, D);
    a.k = attention_view(d_k, ZT_BF16, B, T, Hkv, D);
    a.v = attention_view(d_v, ZT_BF16, B, T, Hkv, D);
    a.out = attention_view(d_o, ZT_BF16, B, T, H, D);
    void *saved = NULL;
    zt_status st = f->ops->forward(f->lp.state, &a, &saved);
    ZT_CHECK_INT(st, ZT_OK);
    if (st != ZT_OK) fprintf(stderr, "%s forward: %s\n", name, take_error(f, &st));
    float *got_o = download_bf16(d_o, nq);
    char what[160];
    snprintf(what, sizeof what, "%s: out", name);
    ZT_CHECK(check_rel_l2(what, got_o, o, nq, TOL_BF16_CHAIN));

    a.dout = attention_view(d_dout, ZT_BF16, B, T, H, D);
    a.dq = attention_view(d_dq, ZT_BF16, B, T, H, D);
    a.dk = attention_view(d_dk, ZT_BF16, B, T, Hkv, D);
    a.dv = attention_view(d_dv, ZT_BF16, B, T, Hkv, D);
    st = f->ops->backward(f->lp.state, &a, saved);
    ZT_CHECK_INT(st, ZT_OK);
    if (st != ZT_OK) fprintf(stderr, "%s backward: %s\n", name, take_error(f, &st));
    float *got_dq = download_bf16(d_dq, nq), *got_dk = download_bf16(d_dk, nkv), *got_dv = download_bf16(d_dv, nkv);
    snprintf(what, sizeof what, "%s: dq", name);
    ZT_CHECK(check_rel_l2(what, got_dq, dq, nq, TOL_BF16_CHAIN));
    snprintf(what, sizeof what, "%s: dk", name);
    ZT_CHECK(check_rel_l2(what, got_dk, dk, nkv, TOL_BF16_CHAIN));
    snprintf(what, sizeof what, "%s: dv", name);
    ZT_CHECK(check_rel_l2(what, got_dv, dv, nkv, TOL_BF16_CHAIN));

    free(q), free(k), free(v), free(dout), free(doc), free(o), free(lse), free(dq), free(dk), free(dv);
    free(got_o), free(got_dq), free(got_dk), free(got_dv);
    device_free(d_q), device_free(d_k), device_free(d_v), device_free(d_dout), device_free(d_o);
    device_free(d_dq), device_free(d_dk), device_free(d_dv);
    if (d_doc) device_free(d_doc);
}

/* Each bad call fails with its status and a message that says what is wrong. */
static void check_errors(fixture *f)
{
    int64_t B = 1, T = 8, H = 2, D = 16;
    uint16_t *buf = device_alloc((uint64_t)(B * T * H * 300) * 2);
    zt_batch batch = {.struct_size = sizeof batch, .batch = (int32_t)B, .seq_len = (int32_t)T};
    zt_attn_args a = {.struct_size = sizeof a, .n_heads = (int32_t)H, .n_kv_heads = (int32_t)H,
                      .head_dim = (int32_t)D, .scale = 0.25f, .causal = 1, .batch = &batch};
    a.q = a.k = a.v = a.out = attention_view(buf, ZT_BF16, B, T, H, D);
    zt_status st;
    void *saved = NULL;

    a.q.dtype = ZT_F32;
    ZT_CHECK_INT(f->ops->forward(f->lp.state, &a, &saved), ZT_ERR_UNSUPPORTED);
    ZT_CHECK_CONTAINS(take_error(f, &st), "flash attention forward: q has dtype 0; flash attention computes in bf16");
    a.q.dtype = ZT_BF16;

    a.k.shape[2] = 3;
    ZT_CHECK_INT(f->ops->forward(f->lp.state, &a, &saved), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(take_error(f, &st), "k must be a contiguous [1, 8, 2, 16] tensor");
    a.k.shape[2] = H;

    a.causal = 0;
    ZT_CHECK_INT(f->ops->forward(f->lp.state, &a, &saved), ZT_ERR_UNSUPPORTED);
    ZT_CHECK_CONTAINS(take_error(f, &st), "flash attention computes causal (decoder) attention only");
    a.causal = 1;

    a.head_dim = 300;
    ZT_CHECK_INT(f->ops->forward(f->lp.state, &a, &saved), ZT_ERR_UNSUPPORTED);
    ZT_CHECK_CONTAINS(take_error(f, &st), "head_dim 300: flash attention takes head sizes from 1 to 256");
    a.head_dim = (int32_t)D;

    a.n_kv_heads = 3;
    ZT_CHECK_INT(f->ops->forward(f->lp.state, &a, &saved), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(take_error(f, &st), "2 query heads cannot share 3 key/value heads");
    a.n_kv_heads = (int32_t)H;

    a.dout = a.dq = a.dk = a.dv = a.q;
    ZT_CHECK_INT(f->ops->backward(f->lp.state, &a, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(take_error(f, &st), "`saved` is not what this plugin's forward kept for a batch of this shape "
                                          "(it is NULL)");
    ZT_CHECK(saved == NULL);
    device_free(buf);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGINS_D\n", argv[0]);
        return 2;
    }
    cuda_test_init("flash attention plugin");
    fixture f;
    memset(&f, 0, sizeof f);
    zt_error err;
    zt_runtime_options opt = {.n_threads = 2, .device_type = ZT_DEVICE_CUDA, .single_process = 1};
    const char *dirs[] = {argv[1]};
    if (zt_runtime_create(&opt, NULL, &f.rt, &err) != ZT_OK || zt_registry_scan(dirs, 1, &f.reg, &err) != ZT_OK ||
        zt_plugin_load(f.reg, "flash", &f.lp, &err) != ZT_OK || zt_plugin_probe(&f.lp, f.rt, &err) != ZT_OK ||
        zt_plugin_init(&f.lp, f.rt, &err) != ZT_OK) {
        fprintf(stderr, "cannot set up the flash plugin: %s\n", err.msg);
        return 1;
    }
    f.ops = f.lp.plugin->ops;
    ZT_CHECK(f.lp.plugin->caps & ZT_CAP_CUDA);
    /* the device's one cuBLASLt handle and workspace, which every plugin's kernel context shares */
    const zt_device_ctx *dev = f.lp.host->device;
    ZT_CHECK(dev->cublaslt != NULL && dev->workspace != NULL);
    ZT_CHECK(dev->workspace_bytes == 32ull << 20 && (uintptr_t)dev->workspace % 256 == 0);
    ZT_CHECK(dev->cublas == NULL); /* reserved */
    check_case(&f, 2, 77, 4, 2, 16, 1);   /* exact kernels, GQA, packed with padding */
    check_case(&f, 1, 33, 3, 3, 12, 0);   /* exact kernels, a head size that is not a power of two */
    check_case(&f, 2, 130, 8, 2, 64, 1);  /* flash kernels, GQA, packed */
    check_case(&f, 1, 200, 4, 1, 128, 0); /* flash kernels, multi-query */
    check_errors(&f);
    zt_plugin_unload(&f.lp);
    zt_registry_free(f.reg);
    zt_runtime_destroy(f.rt);
    return zt_test_result();
}
