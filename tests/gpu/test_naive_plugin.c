/* The naive attention plugin's CUDA path (kernels/cuda/naive_attention.cu), loaded through the
 * registry and a CUDA runtime as zt-run loads it:
 *  1. against the CPU attention kernel that the plugin's CPU path runs (kernels/cpu, itself checked
 *     against torch) on the same bf16-rounded inputs: causal, grouped-query and multi-query heads,
 *     packed documents with padding, odd lengths and head sizes, T = 1; forward and backward. Both
 *     compute in fp32 after the inputs, and the CPU backward is given the GPU's bf16-rounded output,
 *     so the only differences are the bf16 rounding of the outputs and the summation order: the
 *     tolerance is TOL_BF16_OUT (8e-3 relative L2), tighter than flash's;
 *  2. against the flash plugin on the same device inputs, forward and backward (flash keeps P in
 *     bf16: TOL_BF16_CHAIN), which is what the reference is for;
 *  3. memory: the log-sum-exp is in the activations pool while saved and freed by backward, the
 *     [H, T, T] scores are charged to the workspace pool;
 *  4. its error messages on a GPU run.
 * Every output buffer is poisoned (NaN) before each call, so an element never written fails.
 * usage: test_naive_plugin PLUGINS_D */
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
    zt_loaded_plugin naive, flash;
    const zt_attention_ops *ops, *flash_ops;
} fixture;

static const char *take_error(const zt_loaded_plugin *lp, zt_status *st)
{
    return zt_runtime_take_error(lp->host, st);
}

static uint64_t pool_use(fixture *f, int pool, int peak)
{
    zt_mem_stats m;
    zt_runtime_mem_stats(f->rt, pool, ZT_MEM_DEVICE, &m);
    return peak ? m.peak : m.current;
}

/* The device buffers of one case. */
typedef struct bufs {
    uint16_t *q, *k, *v, *dout, *o, *dq, *dk, *dv;
    int32_t *doc;
    zt_batch batch;
    zt_attn_args a;
} bufs;

/* Forward then backward of one plugin on b's inputs, outputs poisoned first; the results come back
 * as floats. Returns 0 (after a failed check) when a call fails. */
static int run_plugin(const zt_loaded_plugin *lp, const zt_attention_ops *ops, bufs *b, int64_t nq, int64_t nkv,
                      const char *name, float **o, float **dq, float **dk, float **dv)
{
    device_poison(b->o, (uint64_t)nq * 2);
    device_poison(b->dq, (uint64_t)nq * 2);
    device_poison(b->dk, (uint64_t)nkv * 2);
    device_poison(b->dv, (uint64_t)nkv * 2);
    void *saved = NULL;
    zt_status st = ops->forward(lp->state, &b->a, &saved), ignored;
    ZT_CHECK_INT(st, ZT_OK);
    if (st != ZT_OK) {
        fprintf(stderr, "%s %s forward: %s\n", name, lp->desc.name, take_error(lp, &ignored));
        return 0;
    }
    st = ops->backward(lp->state, &b->a, saved);
    ZT_CHECK_INT(st, ZT_OK);
    if (st != ZT_OK) {
        fprintf(stderr, "%s %s backward: %s\n", name, lp->desc.name, take_error(lp, &ignored));
        return 0;
    }
    *o = download_bf16(b->o, nq);
    *dq = download_bf16(b->dq, nq);
    *dk = download_bf16(b->dk, nkv);
    *dv = download_bf16(b->dv, nkv);
    return 1;
}

/* Every element of x and of its reference within `bound` of zero (both are zero in exact arithmetic). */
static int check_zero(const char *what, const float *x, const float *ref, int64_t n, double bound)
{
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double m = fabs(x[i]) > fabs(ref[i]) ? fabs(x[i]) : fabs(ref[i]);
        if (!(m <= worst)) worst = m, at = i; /* NaN counts as the worst */
    }
    int pass = worst <= bound;
    printf("%s %s: zero in exact arithmetic: largest magnitude %.3g at %lld (bound %.3g; got %g, want %g)\n",
           pass ? "ok  " : "FAIL", what, worst, (long long)at, bound, (double)x[at], (double)ref[at]);
    return pass;
}

/* single_key: every query attends one key only (T = 1, causal), so dq and dk are zero in exact
 * arithmetic: each side's rounding (around 1e-7 for O(1) inputs) is compared with zero, since a
 * relative error of two roundings of zero means nothing. */
static void compare(const char *name, const char *against, const float *o, const float *dq, const float *dk,
                    const float *dv, const float *ro, const float *rdq, const float *rdk, const float *rdv, int64_t nq,
                    int64_t nkv, double tol, int single_key)
{
    char what[200];
    snprintf(what, sizeof what, "%s vs %s: out", name, against);
    ZT_CHECK(check_rel_l2(what, o, ro, nq, tol));
    snprintf(what, sizeof what, "%s vs %s: dq", name, against);
    ZT_CHECK(single_key ? check_zero(what, dq, rdq, nq, 1e-5) : check_rel_l2(what, dq, rdq, nq, tol));
    snprintf(what, sizeof what, "%s vs %s: dk", name, against);
    ZT_CHECK(single_key ? check_zero(what, dk, rdk, nkv, 1e-5) : check_rel_l2(what, dk, rdk, nkv, tol));
    snprintf(what, sizeof what, "%s vs %s: dv", name, against);
    ZT_CHECK(check_rel_l2(what, dv, rdv, nkv, tol));
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
    float scale = 1.0f / sqrtf((float)D);

    bufs b;
    memset(&b, 0, sizeof b);
    b.q = device_bf16(q, nq), b.k = device_bf16(k, nkv), b.v = device_bf16(v, nkv), b.dout = device_bf16(dout, nq);
    b.o = device_alloc((uint64_t)nq * 2), b.dq = device_alloc((uint64_t)nq * 2);
    b.dk = device_alloc((uint64_t)nkv * 2), b.dv = device_alloc((uint64_t)nkv * 2);
    b.doc = doc ? device_i32(doc, B * T) : NULL;
    b.batch = (zt_batch){.struct_size = sizeof b.batch, .batch = (int32_t)B, .seq_len = (int32_t)T, .doc_ids = b.doc};
    b.a = (zt_attn_args){.struct_size = sizeof b.a, .n_heads = (int32_t)H, .n_kv_heads = (int32_t)Hkv,
                         .head_dim = (int32_t)D, .scale = scale, .causal = 1, .batch = &b.batch};
    b.a.q = attention_view(b.q, ZT_BF16, B, T, H, D);
    b.a.k = attention_view(b.k, ZT_BF16, B, T, Hkv, D);
    b.a.v = attention_view(b.v, ZT_BF16, B, T, Hkv, D);
    b.a.out = attention_view(b.o, ZT_BF16, B, T, H, D);
    b.a.dout = attention_view(b.dout, ZT_BF16, B, T, H, D);
    b.a.dq = attention_view(b.dq, ZT_BF16, B, T, H, D);
    b.a.dk = attention_view(b.dk, ZT_BF16, B, T, Hkv, D);
    b.a.dv = attention_view(b.dv, ZT_BF16, B, T, Hkv, D);

    float *o = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    if (run_plugin(&f->naive, f->ops, &b, nq, nkv, name, &o, &dq, &dk, &dv)) {
        /* The CPU path on the same inputs; its backward gets the GPU's (bf16) output, as the GPU's did. */
        float *ro = host_f32(nq), *lse = host_f32(B * H * T), *rdq = host_f32(nq), *rdk = host_f32(nkv),
              *rdv = host_f32(nkv);
        zt_attention_shape cs = {B, T, H, Hkv, D, scale};
        zt_cpu_attention_forward(NULL, &cs, q, k, v, doc, ro, lse);
        zt_cpu_attention_backward(NULL, &cs, q, k, v, doc, o, lse, dout, rdq, rdk, rdv);
        compare(name, "CPU", o, dq, dk, dv, ro, rdq, rdk, rdv, nq, nkv, TOL_BF16_OUT, T == 1);
        free(ro), free(lse), free(rdq), free(rdk), free(rdv);

        /* Flash on the same device inputs (head sizes up to 256: its flash or exact kernels). */
        float *fo = NULL, *fdq = NULL, *fdk = NULL, *fdv = NULL;
        if (D <= 256 && run_plugin(&f->flash, f->flash_ops, &b, nq, nkv, name, &fo, &fdq, &fdk, &fdv))
            compare(name, "flash", fo, fdq, fdk, fdv, o, dq, dk, dv, nq, nkv, TOL_BF16_CHAIN, T == 1);
        free(fo), free(fdq), free(fdk), free(fdv);
    }
    free(q), free(k), free(v), free(dout), free(doc), free(o), free(dq), free(dk), free(dv);
    device_free(b.q), device_free(b.k), device_free(b.v), device_free(b.dout), device_free(b.o);
    device_free(b.dq), device_free(b.dk), device_free(b.dv);
    if (b.doc) device_free(b.doc);
}

/* The lse is charged to activations while saved and freed by backward; the scores to workspace. */
static void check_memory(fixture *f)
{
    int64_t B = 2, T = 96, H = 4, D = 32;
    int64_t n = B * T * H * D;
    float *x = random_bf16_values(n, 1.0f);
    uint16_t *q = device_bf16(x, n), *o = device_alloc((uint64_t)n * 2), *g = device_alloc((uint64_t)n * 6);
    zt_batch batch = {.struct_size = sizeof batch, .batch = (int32_t)B, .seq_len = (int32_t)T};
    zt_attn_args a = {.struct_size = sizeof a, .n_heads = (int32_t)H, .n_kv_heads = (int32_t)H,
                      .head_dim = (int32_t)D, .scale = 0.2f, .causal = 1, .batch = &batch};
    a.q = a.k = a.v = a.dout = attention_view(q, ZT_BF16, B, T, H, D);
    a.out = attention_view(o, ZT_BF16, B, T, H, D);
    a.dq = attention_view(g, ZT_BF16, B, T, H, D);
    a.dk = attention_view(g + n, ZT_BF16, B, T, H, D);
    a.dv = attention_view(g + 2 * n, ZT_BF16, B, T, H, D);
    zt_runtime_mem_reset_peaks(f->rt);
    uint64_t act0 = pool_use(f, ZT_POOL_ACTIVATIONS, 0), ws0 = pool_use(f, ZT_POOL_WORKSPACE, 0);
    void *saved = NULL;
    ZT_CHECK_INT(f->ops->forward(f->naive.state, &a, &saved), ZT_OK);
    uint64_t lse_bytes = (uint64_t)(B * H * T) * 4;
    ZT_CHECK(pool_use(f, ZT_POOL_ACTIVATIONS, 0) - act0 >= lse_bytes);
    ZT_CHECK(pool_use(f, ZT_POOL_ACTIVATIONS, 0) - act0 < lse_bytes + 4096);
    ZT_CHECK_INT((long long)pool_use(f, ZT_POOL_WORKSPACE, 0), (long long)ws0); /* scratch freed */
    ZT_CHECK(pool_use(f, ZT_POOL_WORKSPACE, 1) - ws0 >= (uint64_t)(H * T * T) * 4);
    ZT_CHECK_INT(f->ops->backward(f->naive.state, &a, saved), ZT_OK);
    ZT_CHECK_INT((long long)pool_use(f, ZT_POOL_ACTIVATIONS, 0), (long long)act0);
    ZT_CHECK(pool_use(f, ZT_POOL_WORKSPACE, 1) - ws0 >= 2 * (uint64_t)(H * T * T) * 4); /* P and dP */
    zt_error err;
    if (zt_runtime_sync(f->rt, &err) != ZT_OK) {
        fprintf(stderr, "memory case: the device failed: %s\n", err.msg);
        ZT_CHECK(!"the device failed");
    }
    free(x);
    device_free(q), device_free(o), device_free(g);
}

/* Each bad call fails with its status and a message that says what is wrong. */
static void check_errors(fixture *f)
{
    int64_t B = 1, T = 8, H = 2, D = 16;
    uint16_t *buf = device_alloc((uint64_t)(B * T * H * D) * 4);
    zt_batch batch = {.struct_size = sizeof batch, .batch = (int32_t)B, .seq_len = (int32_t)T};
    zt_attn_args a = {.struct_size = sizeof a, .n_heads = (int32_t)H, .n_kv_heads = (int32_t)H,
                      .head_dim = (int32_t)D, .scale = 0.25f, .causal = 1, .batch = &batch};
    a.q = a.k = a.v = a.out = attention_view(buf, ZT_BF16, B, T, H, D);
    zt_status st;
    void *saved = NULL;
    const zt_loaded_plugin *lp = &f->naive;

    a.q.dtype = ZT_F32;
    ZT_CHECK_INT(f->ops->forward(lp->state, &a, &saved), ZT_ERR_UNSUPPORTED);
    ZT_CHECK_CONTAINS(take_error(lp, &st), "naive attention forward: q has dtype 0; on a GPU naive attention "
                                           "computes on bf16 tensors");
    a.q.dtype = ZT_BF16;

    a.v.device_type = ZT_DEVICE_CPU;
    ZT_CHECK_INT(f->ops->forward(lp->state, &a, &saved), ZT_ERR_UNSUPPORTED);
    ZT_CHECK_CONTAINS(take_error(lp, &st), "v is in host memory, but this run computes on a GPU");
    a.v.device_type = ZT_DEVICE_CUDA;

    a.k.shape[2] = 3;
    ZT_CHECK_INT(f->ops->forward(lp->state, &a, &saved), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(take_error(lp, &st), "k must be a contiguous [1, 8, 2, 16] tensor");
    a.k.shape[2] = H;

    a.n_kv_heads = 3;
    ZT_CHECK_INT(f->ops->forward(lp->state, &a, &saved), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(take_error(lp, &st), "n_kv_heads must divide n_heads");
    a.n_kv_heads = (int32_t)H;

    a.dout = a.dq = a.dk = a.dv = a.q;
    ZT_CHECK_INT(f->ops->backward(lp->state, &a, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(take_error(lp, &st), "the saved record is NULL");
    ZT_CHECK(saved == NULL);

    zt_kv_cache_desc d = {.struct_size = sizeof d, .n_layers = 1, .n_kv_heads = 2, .head_dim = 16, .max_seqs = 1,
                          .max_tokens = 16, .dtype = ZT_F32};
    zt_kv_cache *cache = NULL;
    ZT_CHECK_INT(f->ops->kv_create(lp->state, &d, &cache), ZT_ERR_UNSUPPORTED);
    ZT_CHECK_CONTAINS(take_error(lp, &st), "on a GPU the cache holds the run's 16-bit type");
    ZT_CHECK(cache == NULL);
    device_free(buf);
}

static int load(fixture *f, const char *name, zt_loaded_plugin *lp, zt_error *err)
{
    return zt_plugin_load(f->reg, name, lp, err) == ZT_OK && zt_plugin_probe(lp, f->rt, err) == ZT_OK &&
           zt_plugin_init(lp, f->rt, err) == ZT_OK;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGINS_D\n", argv[0]);
        return 2;
    }
    cuda_test_init("naive attention plugin (CUDA)");
    fixture f;
    memset(&f, 0, sizeof f);
    zt_error err;
    zt_runtime_options opt = {.n_threads = 2, .device_type = ZT_DEVICE_CUDA, .single_process = 1};
    const char *dirs[] = {argv[1]};
    if (zt_runtime_create(&opt, NULL, &f.rt, &err) != ZT_OK || zt_registry_scan(dirs, 1, &f.reg, &err) != ZT_OK ||
        !load(&f, "naive", &f.naive, &err) || !load(&f, "flash", &f.flash, &err)) {
        fprintf(stderr, "cannot set up the naive and flash plugins: %s\n", err.msg);
        return 1;
    }
    f.ops = f.naive.plugin->ops;
    f.flash_ops = f.flash.plugin->ops;
    ZT_CHECK(f.naive.plugin->caps & ZT_CAP_CUDA);
    check_case(&f, 2, 77, 4, 2, 16, 1);   /* GQA, packed with padding */
    check_case(&f, 1, 33, 3, 3, 12, 0);   /* a head size that is not a power of two */
    check_case(&f, 2, 130, 8, 2, 64, 1);  /* flash kernels' head size, GQA, packed */
    check_case(&f, 1, 200, 4, 1, 128, 0); /* multi-query, head size 128 */
    check_case(&f, 3, 1, 2, 1, 8, 0);     /* one token */
    check_case(&f, 1, 257, 6, 3, 40, 1);  /* odd length past a power of two, packed */
    check_memory(&f);
    check_errors(&f);
    zt_plugin_unload(&f.flash);
    zt_plugin_unload(&f.naive);
    zt_registry_free(f.reg);
    zt_runtime_destroy(f.rt);
    return zt_test_result();
}
