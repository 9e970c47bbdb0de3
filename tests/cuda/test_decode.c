/* The generation kernels of kernels/cuda against their CPU references:
 *  - zt_cuda_kv_write then zt_cuda_attention_decode against zt_cpu_attention_decode (kernels/cpu) on
 *    fresh random inputs rounded to the 16-bit type, block pools shuffled at random, every slot the
 *    kernel must not read set to NaN in the cache (so an over-read shows as NaN), the output poisoned
 *    before each run; GQA ratios 1, 4 and 8, n_new 1 and > 1, block sizes 1, 16 and 32, head_dim 64
 *    and 128, contexts up to 4096 (the split-and-merge path) and tables much longer than the
 *    sequences (empty splits); each case also captured in a CUDA graph and replayed after new lengths
 *    were written to the device. Tolerance: one rounding of the output (TOL_BF16_OUT: 8e-3 relative L2
 *    in bf16, 1e-3 in fp16). The cache is read back after kv_write: bit for bit what was written.
 *  - zt_cuda_sample against the CPU sampler (framework/generate/sampler.c) for the same u on many rows:
 *    greedy, temperature, top-p, and top-k (the CPU sampler has no top-k: its reference is the CPU
 *    sampler on logits set to -inf outside the k most likely, ties to the lower id), with tied logits
 *    and excluded (-inf) tokens, signed zeros among the ties (-0 ties with +0: both rank tokens by
 *    logit value, ties to the lower id). Tokens must be identical. The one exception is stated: fp64
 *    probabilities may differ in their last bits (summation order, CUDA's exp within 1 ulp), so a row
 *    whose u or top-p mass lies within BOUNDARY_MARGIN of a boundary may pick the other side of it: such
 *    a row that differs is counted apart and printed, and more than MAX_BOUNDARY_ROWS of them fails the
 *    test. Rows at a boundary that agree (tied logits make many: 32 of 40 equal probabilities are
 *    exactly top_p 0.8) are compared like every other.
 * Runs in bf16, then in fp16. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "cuda_test.h"
#include "generate/generate.h"
#include "ztest.h"

typedef struct decode_case {
    int32_t n_seqs, n_new, heads, kv_heads, head_dim, block_size;
    int32_t max_len;  /* lengths (committed tokens) are drawn in [0, max_len - n_new] */
    int32_t capacity; /* tokens the block tables can hold (table_stride * block_size, rounded up) */
} decode_case;

static void shuffle(int32_t *x, int32_t n)
{
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = test_randint(0, i + 1), t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}

/* The decode captured in a CUDA graph replays with other lengths written to the device (each halved):
 * the launch shape depends on the shape only, so the replay must match the CPU kernel at the new
 * lengths (the cache holds data for every position up to the old ones). */
static void check_graph_replay(zt_cuda_ctx *ctx, const zt_cuda_kv_pages *pages, const zt_kv_pages *cpu_pages,
                               const zt_attention_shape *shape, int32_t *lengths, int64_t *lengths64,
                               int32_t *dlengths, int32_t N, const float *q, const uint16_t *dq, uint16_t *dout,
                               const char *what)
{
    int32_t S = (int32_t)shape->batch, H = (int32_t)shape->heads, D = (int32_t)shape->head_dim;
    int64_t n = (int64_t)S * N * H * D;
    cudaStream_t stream;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ZT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    ZT_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    zt_status st = zt_cuda_attention_decode(ctx, stream, pages, S, N, H, shape->scale, dq, dout);
    ZT_CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    ZT_CHECK(check_ok("zt_cuda_attention_decode under graph capture", st));
    ZT_CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    for (int32_t s = 0; s < S; s++) lengths64[s] = lengths[s] = lengths[s] / 2;
    ZT_CHECK(cudaMemcpy(dlengths, lengths, sizeof(int32_t) * (size_t)S, cudaMemcpyHostToDevice) == cudaSuccess);
    float *ref = host_f32(n);
    zt_cpu_attention_decode(NULL, shape, cpu_pages, S, N, q, ref);
    device_poison(dout, (uint64_t)n * 2);
    ZT_CHECK(cudaDeviceSynchronize() == cudaSuccess); /* the poison (legacy stream) lands before the replay */
    ZT_CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess);
    ZT_CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    float *got = download_bf16(dout, n);
    char label[300];
    snprintf(label, sizeof label, "%s, graph replay at halved lengths", what);
    ZT_CHECK(check_rel_l2(label, got, ref, n, TOL_BF16_OUT));
    free(got);
    free(ref);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
}

static void run_decode_case(zt_cuda_ctx *ctx, const decode_case *c)
{
    int32_t S = c->n_seqs, N = c->n_new, H = c->heads, Hkv = c->kv_heads, D = c->head_dim, bs = c->block_size;
    int32_t stride = (c->capacity + bs - 1) / bs, n_blocks = S * stride + 3; /* a few blocks nobody owns */
    int64_t row = (int64_t)Hkv * D, pool = (int64_t)n_blocks * bs * row;
    char what[256];
    snprintf(what, sizeof what, "decode %s S%d n_new%d H%d Hkv%d D%d block%d len<=%d capacity %d",
             cuda_test_dtype16_name(), S, N, H, Hkv, D, bs, c->max_len, stride * bs);

    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks), *tables = malloc(sizeof(int32_t) * (size_t)S * stride);
    int32_t *lengths = malloc(sizeof(int32_t) * (size_t)S);
    int64_t *lengths64 = malloc(sizeof(int64_t) * (size_t)S);
    for (int32_t i = 0; i < n_blocks; i++) perm[i] = i;
    shuffle(perm, n_blocks);
    for (int32_t i = 0; i < S * stride; i++) tables[i] = perm[i];
    for (int32_t s = 0; s < S; s++) {
        /* the first sequence at the longest length, another at 0 when there are several */
        int32_t top = c->max_len - N;
        lengths[s] = s == 0 ? top : s == 1 ? 0 : test_randint(0, top + 1);
        lengths64[s] = lengths[s];
    }
    /* The cache: NaN everywhere but the committed tokens (random); kv_write fills in the new ones. */
    float *k = host_f32(pool), *v = host_f32(pool);
    for (int64_t i = 0; i < pool; i++) k[i] = v[i] = NAN;
    float *k_new = random_bf16_values((int64_t)S * N * row, 1.0f), *v_new = random_bf16_values((int64_t)S * N * row, 1.0f);
    float *q = random_bf16_values((int64_t)S * N * H * D, 1.0f);
    float *k_ref = host_f32(pool), *v_ref = host_f32(pool);
    for (int64_t i = 0; i < pool; i++) k_ref[i] = v_ref[i] = NAN; /* the CPU kernel must not read these either */
    /* The device pool is head-major ([block][kv head][block_size][head_dim], kernels_cuda.h), the CPU
     * kernel's token-major ([block][block_size][kv head][head_dim]): k_dev, v_dev are what the device
     * pool must hold after the write. */
    float *k_dev = host_f32(pool), *v_dev = host_f32(pool);
    for (int64_t i = 0; i < pool; i++) k_dev[i] = v_dev[i] = NAN;
    for (int32_t s = 0; s < S; s++)
        for (int32_t t = 0; t < lengths[s] + N; t++) {
            int64_t block = tables[s * stride + t / bs], slot = block * bs + t % bs;
            for (int64_t e = 0; e < row; e++) {
                int64_t dev = ((block * Hkv + e / D) * bs + t % bs) * D + e % D;
                float kv = test_uniform(-2.0f, 2.0f), vv = test_uniform(-1.0f, 1.0f);
                if (t >= lengths[s]) { /* a new token: from k_new / v_new */
                    int64_t src = ((int64_t)s * N + (t - lengths[s])) * row + e;
                    kv = k_new[src];
                    vv = v_new[src];
                } else {
                    round_to_bf16(&kv, 1);
                    round_to_bf16(&vv, 1);
                    k[dev] = kv;
                    v[dev] = vv;
                }
                k_ref[slot * row + e] = kv;
                v_ref[slot * row + e] = vv;
                k_dev[dev] = kv;
                v_dev[dev] = vv;
            }
        }

    uint16_t *dk = device_bf16(k, pool), *dv = device_bf16(v, pool);
    uint16_t *dk_new = device_bf16(k_new, (int64_t)S * N * row), *dv_new = device_bf16(v_new, (int64_t)S * N * row);
    uint16_t *dq = device_bf16(q, (int64_t)S * N * H * D);
    int32_t *dtables = device_i32(tables, (int64_t)S * stride), *dlengths = device_i32(lengths, S);
    uint16_t *dout = device_alloc((uint64_t)S * N * H * D * 2);
    zt_cuda_kv_pages pages = {dk, dv, bs, Hkv, D, dtables, stride, dlengths};

    float scale = 1.0f / sqrtf((float)D);
    ZT_CHECK(check_ok("zt_cuda_kv_write", zt_cuda_kv_write(ctx, NULL, &pages, S, N, dk_new, dv_new)));
    float *k_back = download_bf16(dk, pool), *v_back = download_bf16(dv, pool);
    int64_t bad = 0;
    for (int64_t i = 0; i < pool; i++)
        if (memcmp(&k_back[i], &k_dev[i], 4) && !(isnan(k_back[i]) && isnan(k_dev[i]))) bad++;
        else if (memcmp(&v_back[i], &v_dev[i], 4) && !(isnan(v_back[i]) && isnan(v_dev[i]))) bad++;
    if (bad) printf("%s: kv_write: %lld cache elements differ from what was written\n", what, (long long)bad);
    ZT_CHECK(bad == 0);

    zt_attention_shape shape = {S, 1, H, Hkv, D, scale};
    zt_kv_pages cpu_pages = {k_ref, v_ref, bs, row, tables, stride, lengths64};
    float *ref = host_f32((int64_t)S * N * H * D);
    zt_cpu_attention_decode(NULL, &shape, &cpu_pages, S, N, q, ref);
    for (int run = 0; run < 2; run++) { /* twice, each into a freshly poisoned output */
        device_poison(dout, (uint64_t)S * N * H * D * 2);
        ZT_CHECK(check_ok("zt_cuda_attention_decode",
                          zt_cuda_attention_decode(ctx, NULL, &pages, S, N, H, scale, dq, dout)));
        float *got = download_bf16(dout, (int64_t)S * N * H * D);
        ZT_CHECK(check_rel_l2(what, got, ref, (int64_t)S * N * H * D, TOL_BF16_OUT));
        free(got);
    }
    check_graph_replay(ctx, &pages, &cpu_pages, &shape, lengths, lengths64, dlengths, N, q, dq, dout, what);
    free(ref);
    free(k_back);
    free(v_back);
    device_free(dk);
    device_free(dv);
    device_free(dk_new);
    device_free(dv_new);
    device_free(dq);
    device_free(dtables);
    device_free(dlengths);
    device_free(dout);
    free(k);
    free(v);
    free(k_ref);
    free(v_ref);
    free(k_dev);
    free(v_dev);
    free(k_new);
    free(v_new);
    free(q);
    free(perm);
    free(tables);
    free(lengths);
    free(lengths64);
}

static void test_decode(zt_cuda_ctx *ctx)
{
    static const decode_case cases[] = {
        {3, 1, 8, 8, 128, 16, 300, 320},     /* MHA, default block */
        {4, 1, 8, 2, 64, 1, 200, 256},       /* GQA 4, one token a block */
        {2, 4, 8, 1, 128, 32, 1000, 1024},   /* GQA 8, several new tokens: 32 rows, 4 tiles */
        {3, 2, 32, 4, 128, 16, 4096, 4096},  /* 7B-like heads, GQA 8, the split path */
        {1, 1, 32, 32, 128, 16, 2048, 2048}, /* batch 1: many splits */
        {5, 3, 16, 4, 64, 32, 2500, 2560},   /* GQA 4, head_dim 64, three new tokens */
        {2, 1, 8, 8, 128, 16, 40, 4096},     /* tables far longer than the sequences: empty splits */
        {6, 1, 4, 1, 64, 1, 3000, 3000},     /* GQA 4 at block 1 over a long context */
        {2, 5, 4, 4, 128, 1, 9, 16},         /* n_new 5 on tiny contexts (a sequence of 0 + 5) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_decode_case(ctx, &cases[i]);
}

static void test_decode_bad_input(zt_cuda_ctx *ctx)
{
    int32_t *dummy = device_alloc(64);
    zt_cuda_kv_pages p = {(uint16_t *)dummy, (uint16_t *)dummy, 16, 2, 96, dummy, 1, dummy};
    ZT_CHECK(check_fails("head_dim 96", zt_cuda_attention_decode(ctx, NULL, &p, 1, 1, 4, 0.1f,
                                                                 (uint16_t *)dummy, (uint16_t *)dummy),
                         ZT_ERR_INVALID_ARG, "head_dim 96"));
    p.head_dim = 128;
    ZT_CHECK(check_fails("heads 3 over kv 2", zt_cuda_attention_decode(ctx, NULL, &p, 1, 1, 3, 0.1f,
                                                                       (uint16_t *)dummy, (uint16_t *)dummy),
                         ZT_ERR_INVALID_ARG, "multiple"));
    p.block_size = 0;
    ZT_CHECK(check_fails("block 0", zt_cuda_kv_write(ctx, NULL, &p, 1, 1, (uint16_t *)dummy, (uint16_t *)dummy),
                         ZT_ERR_INVALID_ARG, "block_size 0"));
    device_free(dummy);
}

/* ---- sampling -------------------------------------------------------------------------------- */

typedef struct sample_config {
    double temperature, top_p;
    int32_t top_k;
} sample_config;

/* logits outside the k most likely (ties: the lower id first) set to -inf. */
static void mask_top_k(float *x, int32_t vocab, int32_t k)
{
    if (k <= 0 || k >= vocab) return;
    float *sorted = malloc(sizeof(float) * (size_t)vocab);
    memcpy(sorted, x, sizeof(float) * (size_t)vocab);
    /* the k-th largest value by selection: partial sort is enough for a test */
    for (int32_t i = 0; i < k; i++) {
        int32_t best = i;
        for (int32_t j = i + 1; j < vocab; j++)
            if (sorted[j] > sorted[best]) best = j;
        float t = sorted[i];
        sorted[i] = sorted[best];
        sorted[best] = t;
    }
    float kth = sorted[k - 1];
    int32_t above = 0;
    for (int32_t i = 0; i < vocab; i++) above += x[i] > kth;
    int32_t ties_left = k - above;
    for (int32_t i = 0; i < vocab; i++) {
        if (x[i] > kth) continue;
        if (x[i] == kth && ties_left > 0) {
            ties_left--;
            continue;
        }
        x[i] = -INFINITY;
    }
    free(sorted);
}

#define BOUNDARY_MARGIN 1e-12 /* thousands of ulps of 1.0: far beyond fp64 summation and exp differences */
#define MAX_BOUNDARY_ROWS 2   /* over all settings; at ~1e-12 a row, any at all means suspect inputs */

static const float *g_rank_logits;

static int rank_by_logit(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    float x = g_rank_logits[a], y = g_rank_logits[b];
    if (x != y) return x > y ? -1 : 1;
    return (a > b) - (a < b);
}

/* How close this row's draw is to a decision boundary: the smallest distance of u to the cumulative
 * probabilities (id order) of the final distribution, and of top_p to the kept mass just before and
 * at the top-p cut (descending logit order). Computed from the CPU sampler's own distributions. */
static double boundary_distance(const float *masked, int32_t V, double temperature, double top_p, double u)
{
    if (temperature == 0) return INFINITY;
    double *full = malloc(sizeof(double) * (size_t)V), *final = malloc(sizeof(double) * (size_t)V);
    int32_t *order = malloc(sizeof(int32_t) * (size_t)V);
    zt_sampler s;
    zt_error err = {0};
    ZT_CHECK(zt_sampler_init(&s, V, temperature, 0, 1.0, 1, &err) == ZT_OK);
    zt_sampler_distribution(&s, masked, full);
    zt_sampler_free(&s);
    ZT_CHECK(zt_sampler_init(&s, V, temperature, 0, top_p, 1, &err) == ZT_OK);
    zt_sampler_distribution(&s, masked, final);
    zt_sampler_free(&s);
    double nearest = INFINITY, cumulative = 0;
    for (int32_t i = 0; i < V; i++) {
        if (final[i] == 0) continue;
        cumulative += final[i];
        nearest = fmin(nearest, fabs(u - cumulative));
    }
    if (top_p < 1) {
        for (int32_t i = 0; i < V; i++) order[i] = i;
        g_rank_logits = masked;
        qsort(order, (size_t)V, sizeof *order, rank_by_logit);
        double kept = 0;
        for (int32_t k = 0; k < V && kept < top_p; k++) {
            nearest = fmin(nearest, fabs(kept - top_p));
            kept += full[order[k]];
        }
        nearest = fmin(nearest, fabs(kept - top_p));
    }
    free(full);
    free(final);
    free(order);
    return nearest;
}

/* Rows with a NaN or +inf among the drawable logits get -1 (greedy and sampled); the same values past
 * n_draw are never read; bad arguments are refused by message. */
static void test_sample_broken(zt_cuda_ctx *ctx)
{
    enum { N = 6, VB = 300, DRAW = 290 };
    float *logits = host_f32((int64_t)N * VB);
    zt_cuda_sample_row rows[N];
    const int32_t want[N] = {-1, -1, -1, -1, 7, 7};
    for (int32_t r = 0; r < N; r++) {
        float *x = logits + (int64_t)r * VB;
        for (int32_t i = 0; i < VB; i++) x[i] = test_uniform(-1.0f, 1.0f);
        x[7] = 50; /* so the good rows' token is 7 whatever the draw */
        rows[r] = (zt_cuda_sample_row){r % 2 ? 1.0 : 0.0, 1.0, 0.5, 0};
    }
    logits[0 * VB + 100] = NAN;
    logits[1 * VB + 289] = NAN;
    logits[2 * VB + 3] = INFINITY;
    logits[3 * VB + 0] = INFINITY;
    logits[4 * VB + 290] = NAN; /* past n_draw */
    logits[5 * VB + 299] = INFINITY;
    float *dlogits = device_f32(logits, (int64_t)N * VB);
    zt_cuda_sample_row *drows = device_alloc(sizeof rows);
    ZT_CHECK(cudaMemcpy(drows, rows, sizeof rows, cudaMemcpyHostToDevice) == cudaSuccess);
    int32_t *dtokens = device_alloc(sizeof(int32_t) * N), got[N];
    ZT_CHECK(check_ok("zt_cuda_sample broken rows", zt_cuda_sample(ctx, NULL, dlogits, N, VB, DRAW, drows, dtokens)));
    ZT_CHECK(cudaMemcpy(got, dtokens, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int32_t r = 0; r < N; r++) {
        printf("%s sample broken row %d: token %d, want %d\n", got[r] == want[r] ? "ok  " : "FAIL", r, got[r], want[r]);
        ZT_CHECK_INT(got[r], want[r]);
    }
    ZT_CHECK(check_fails("n_draw past the vocabulary", zt_cuda_sample(ctx, NULL, dlogits, N, VB, VB + 1, drows, dtokens),
                         ZT_ERR_INVALID_ARG, "n_draw 301"));
    ZT_CHECK(check_fails("n_draw 0", zt_cuda_sample(ctx, NULL, dlogits, N, VB, 0, drows, dtokens), ZT_ERR_INVALID_ARG,
                         "n_draw 0"));
    device_free(dlogits);
    device_free(drows);
    device_free(dtokens);
    free(logits);
}

static void test_sample(zt_cuda_ctx *ctx)
{
    int32_t boundary_rows = 0;
    static const sample_config configs[] = {
        {0.0, 1.0, 0},  {0.7, 1.0, 0},  {1.0, 0.9, 0},  {1.3, 0.5, 0},  {1.0, 1.0, 50},
        {0.8, 0.8, 40}, {1.0, 0.95, 1}, {2.0, 0.3, 0}, {0.5, 0.99, 500},
    };
    static const int32_t vocabs[] = {1000, 32000};
    const int32_t n = 96;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        int32_t V = vocabs[vi], n_draw = vi ? V - 10 : V; /* a padded vocabulary: the last 10 never drawn */
        for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ci++) {
            const sample_config *c = &configs[ci];
            float *logits = host_f32((int64_t)n * V);
            zt_cuda_sample_row *rows = malloc(sizeof *rows * (size_t)n);
            int32_t *want = malloc(sizeof(int32_t) * (size_t)n);
            double *margin = malloc(sizeof(double) * (size_t)n);
            for (int32_t r = 0; r < n; r++) {
                float *x = logits + (int64_t)r * V;
                float spread = test_uniform(0.5f, 8.0f);
                for (int32_t i = 0; i < V; i++) {
                    x[i] = test_uniform(-spread, spread);
                    if (r % 3 == 1) x[i] = roundf(x[i] * 2) / 2; /* many ties */
                    if (r % 3 == 1 && i % 4 == 0) x[i] = i % 8 ? -0.0f : 0.0f; /* a big tie group at 0 */
                    if (r % 5 == 2 && test_randint(0, 10) == 0) x[i] = -INFINITY;
                }
                if (r % 4 == 3) x[test_randint(0, V)] = spread + 4; /* one dominant token */
                float *masked = malloc(sizeof(float) * (size_t)V), *drawable = malloc(sizeof(float) * (size_t)V);
                memcpy(masked, x, sizeof(float) * (size_t)V);
                for (int32_t i = n_draw; i < V; i++) masked[i] = -INFINITY; /* as generation masks them */
                memcpy(drawable, masked, sizeof(float) * (size_t)V);
                mask_top_k(masked, V, c->top_k);
                zt_sampler s, plain;
                zt_error err = {0};
                uint64_t seed = test_random_u64();
                if (zt_sampler_init(&s, V, c->temperature, c->top_k, c->top_p, seed, &err) != ZT_OK ||
                    zt_sampler_init(&plain, V, c->temperature, 0, c->top_p, seed, &err) != ZT_OK) {
                    printf("sampler init failed: %s\n", err.msg);
                    exit(1);
                }
                /* the u the host draws for a record, as generation hands it to the device */
                double u = c->temperature > 0 ? zt_sampler_draw_u(&s) : test_uniform(0.0f, 1.0f);
                rows[r] = (zt_cuda_sample_row){c->temperature, c->top_p, u, c->top_k};
                want[r] = zt_sampler_pick(&s, drawable, u);
                /* the host's top-k is this test's mask_top_k then no top-k */
                ZT_CHECK_INT(want[r], zt_sampler_pick(&plain, masked, u));
                zt_sampler_free(&s);
                zt_sampler_free(&plain);
                free(drawable);
                margin[r] = boundary_distance(masked, V, c->temperature, c->top_p, u);
                free(masked);
            }
            float *dlogits = device_f32(logits, (int64_t)n * V);
            zt_cuda_sample_row *drows = device_alloc(sizeof *rows * (size_t)n);
            cudaMemcpy(drows, rows, sizeof *rows * (size_t)n, cudaMemcpyHostToDevice);
            int32_t *dtokens = device_alloc(sizeof(int32_t) * (size_t)n);
            ZT_CHECK(check_ok("zt_cuda_sample", zt_cuda_sample(ctx, NULL, dlogits, n, V, n_draw, drows, dtokens)));
            int32_t *got = malloc(sizeof(int32_t) * (size_t)n);
            ZT_CHECK(cudaMemcpy(got, dtokens, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost) == cudaSuccess);
            int32_t mismatches = 0, near = 0;
            for (int32_t r = 0; r < n; r++) {
                if (got[r] != want[r] && margin[r] < BOUNDARY_MARGIN) {
                    near++;
                    printf("  row %d: within %.3g of a boundary (u %.17g): device token %d, CPU sampler %d, "
                           "counted apart\n",
                           r, margin[r], rows[r].u, got[r], want[r]);
                    continue;
                }
                if (got[r] != want[r]) {
                    if (mismatches++ < 5)
                        printf("  row %d: device token %d, CPU sampler %d (u %.17g, nearest boundary %.3g)\n", r,
                               got[r], want[r], rows[r].u, margin[r]);
                }
            }
            printf("sample vocab %d temperature %g top_p %g top_k %d: %d of %d rows differ from the CPU sampler "
                   "(and %d differ within %g of a boundary)\n",
                   V, c->temperature, c->top_p, c->top_k, mismatches, n, near, BOUNDARY_MARGIN);
            ZT_CHECK(mismatches == 0);
            boundary_rows += near;
            free(margin);
            device_free(dlogits);
            device_free(drows);
            device_free(dtokens);
            free(logits);
            free(rows);
            free(want);
            free(got);
        }
    }
    printf("sample: %d rows differ within %g of a boundary in all (at most %d allowed)\n", boundary_rows, BOUNDARY_MARGIN,
           MAX_BOUNDARY_ROWS);
    ZT_CHECK(boundary_rows <= MAX_BOUNDARY_ROWS);
    test_sample_broken(ctx);
}

static void run_pass(int32_t dtype)
{
    cuda_test_set_dtype16(dtype);
    printf("==== %s pass ====\n", cuda_test_dtype16_name());
    zt_cuda_ctx *ctx = cuda_test_ctx(0);
    test_decode(ctx);
    test_decode_bad_input(ctx);
    if (dtype == ZT_BF16) test_sample(ctx); /* fp32 logits: the 16-bit type does not enter */
    zt_cuda_ctx_destroy(ctx);
}

int main(void)
{
    cuda_test_init("test_cuda_decode");
    run_pass(ZT_BF16);
    run_pass(ZT_F16);
    return zt_test_result();
}
