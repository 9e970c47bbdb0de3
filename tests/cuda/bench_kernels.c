/* Times the CUDA kernels other than attention on LLaMA-7B-like shapes (8192 tokens, dim 4096,
 * ffn 11008, vocab 32000) and prints achieved bandwidth (memory-bound kernels: bytes each must move
 * at least once, read + written) or TFLOP/s (GEMMs). Not a test: scripts/gpu.sh runs it for
 * docs/cuda.md. Inputs are random, not zeros; times are medians of 20 runs after 3 warm-ups. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_test.h"

enum { TOKENS = 8192, DIM = 4096, FFN = 11008, VOCAB = 32000, HEADS = 32, HEAD_DIM = 128 };

typedef struct bench_args {
    zt_cuda_ctx *ctx;
    void *a, *b, *c, *d, *e, *f;
    int32_t *ids, *positions;
    float *inv_freq;
    zt_cuda_param *params;
    int64_t n_params;
} bench_args;

static int compare_floats(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

static double median_ms(zt_status (*fn)(const bench_args *), const bench_args *args)
{
    enum { WARMUP = 3, RUNS = 20 };
    float ms[RUNS];
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (int i = -WARMUP; i < RUNS; i++) {
        cudaEventRecord(start, 0);
        if (fn(args) != ZT_OK) {
            fprintf(stderr, "zt-bench-kernels: %s\n", zt_cuda_last_error());
            exit(1);
        }
        cudaEventRecord(stop, 0);
        if (cudaEventSynchronize(stop) != cudaSuccess) {
            fprintf(stderr, "zt-bench-kernels: %s\n", cudaGetErrorString(cudaGetLastError()));
            exit(1);
        }
        if (i >= 0) cudaEventElapsedTime(&ms[i], start, stop);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    qsort(ms, RUNS, sizeof(float), compare_floats);
    return ms[RUNS / 2];
}

static zt_status rmsnorm_fwd(const bench_args *a)
{
    return zt_cuda_rmsnorm_forward(a->ctx, 0, TOKENS, DIM, 1e-5f, a->a, a->b, a->c, a->d);
}
static zt_status rmsnorm_bwd(const bench_args *a)
{
    return zt_cuda_rmsnorm_backward(a->ctx, 0, TOKENS, DIM, a->a, a->b, a->d, a->e, a->c, a->f);
}
static zt_status rmsnorm_bwd_add(const bench_args *a)
{
    return zt_cuda_rmsnorm_backward_add(a->ctx, 0, TOKENS, DIM, a->a, a->b, a->d, a->e, a->c, a->c, a->f);
}

enum { KV_HEADS = 8 }; /* the rope q|k|v shape: GQA as LLaMA 3 8B */

static zt_status rope_qkv_fwd(const bench_args *a)
{
    return zt_cuda_rope_qkv_forward(a->ctx, 0, TOKENS, HEADS, KV_HEADS, HEAD_DIM, a->positions, a->inv_freq, a->b,
                                    a->c, a->d, a->e);
}

static zt_status rope_qkv_bwd(const bench_args *a)
{
    return zt_cuda_rope_qkv_backward(a->ctx, 0, TOKENS, HEADS, KV_HEADS, HEAD_DIM, a->positions, a->inv_freq, a->c,
                                     a->d, a->e, a->b);
}

static zt_status swiglu_rows_fwd(const bench_args *a)
{
    return zt_cuda_swiglu_forward_rows(a->ctx, 0, TOKENS, FFN, a->a, (const uint16_t *)a->a + FFN, 2 * FFN, a->d,
                                       FFN);
}

static zt_status swiglu_fwd(const bench_args *a)
{
    return zt_cuda_swiglu_forward(a->ctx, 0, (int64_t)TOKENS * FFN, a->a, a->b, a->c);
}
static zt_status swiglu_bwd(const bench_args *a)
{
    return zt_cuda_swiglu_backward(a->ctx, 0, (int64_t)TOKENS * FFN, a->a, a->b, a->c, a->d, a->e);
}
static zt_status rope_fwd(const bench_args *a)
{
    return zt_cuda_rope_forward(a->ctx, 0, TOKENS, HEADS, HEAD_DIM, a->positions, a->inv_freq, a->a, a->a);
}
static zt_status embedding_fwd(const bench_args *a)
{
    return zt_cuda_embedding_forward(a->ctx, 0, TOKENS, VOCAB, DIM, a->ids, a->a, a->b);
}
static zt_status embedding_bwd(const bench_args *a)
{
    return zt_cuda_embedding_backward(a->ctx, 0, TOKENS, VOCAB, DIM, a->ids, a->b, a->c);
}
static zt_status lm_head(const bench_args *a)
{
    return zt_cuda_lm_head_loss(a->ctx, 0, TOKENS, DIM, VOCAB, a->a, a->b, a->ids, TOKENS, 1.0f,
                                a->d, a->e, a->c, a->f);
}
/* LLaMA's vocabulary with a pad token: the body of 32000 rows and a tail GEMM of one */
static zt_status lm_head_odd(const bench_args *a)
{
    return zt_cuda_lm_head_loss(a->ctx, 0, TOKENS, DIM, VOCAB + 1, a->a, a->b, a->ids, TOKENS, 1.0f,
                                a->d, a->e, a->c, a->f);
}
static zt_status linear_fwd(const bench_args *a)
{
    return zt_cuda_linear_forward(a->ctx, 0, TOKENS, FFN, DIM, a->a, a->b, a->c);
}
static zt_status linear_dx(const bench_args *a)
{
    return zt_cuda_linear_backward_input(a->ctx, 0, TOKENS, FFN, DIM, a->c, a->b, a->a);
}
static zt_status linear_dw(const bench_args *a)
{
    return zt_cuda_linear_backward_weight(a->ctx, 0, TOKENS, FFN, DIM, a->c, a->a, a->d);
}
static zt_status adamw(const bench_args *a)
{
    zt_cuda_adamw_params hp = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                               .weight_decay = 0.1, .step = 10};
    return zt_cuda_adamw_step(a->ctx, 0, a->n_params, a->params, &hp, NULL);
}

static void report(const char *name, double ms, double bytes, double flops)
{
    if (flops > 0)
        printf("| %s | %.3f | %.0f TFLOP/s |\n", name, ms, flops / (ms * 1e9));
    else
        printf("| %s | %.3f | %.0f GB/s |\n", name, ms, bytes / (ms * 1e6));
}

int main(void)
{
    cuda_test_init("zt-bench-kernels");
    const int64_t T = TOKENS;
    bench_args a = {0};
    /* scratch: the LM head's chunks (1024 rows of logits, also of vocab + 1) dominate */
    a.ctx = cuda_test_ctx(zt_cuda_lm_head_loss_scratch_bytes(1024, VOCAB + 1));
    printf("| kernel (8192 tokens, dim 4096, ffn 11008, vocab 32000) | ms | achieved |\n|---|---|---|\n");

    float *x = random_bf16_values(T * FFN, 1.0f);
    a.a = device_bf16(x, T * DIM), a.b = device_bf16(x + T * DIM, DIM), a.c = device_alloc(T * DIM * 2);
    a.d = device_alloc(T * 4), a.e = device_bf16(x, T * DIM), a.f = device_alloc(DIM * 4);
    report("rmsnorm forward", median_ms(rmsnorm_fwd, &a), 2.0 * T * DIM * 2, 0);
    report("rmsnorm backward", median_ms(rmsnorm_bwd, &a), 3.0 * T * DIM * 2, 0);
    report("rmsnorm backward + residual (in place)", median_ms(rmsnorm_bwd_add, &a), 4.0 * T * DIM * 2, 0);
    device_free(a.a), device_free(a.b), device_free(a.c), device_free(a.d), device_free(a.e);
    device_free(a.f);

    a.a = device_bf16(x, T * FFN), a.b = device_bf16(x, T * FFN), a.c = device_bf16(x, T * FFN);
    a.d = device_alloc(T * FFN * 2), a.e = device_alloc(T * FFN * 2);
    report("swiglu forward", median_ms(swiglu_fwd, &a), 3.0 * T * FFN * 2, 0);
    report("swiglu backward", median_ms(swiglu_bwd, &a), 5.0 * T * FFN * 2, 0);
    device_free(a.a);
    {
        float *gu = random_bf16_values(T * FFN * 2, 1.0f); /* [T, 2 FFN] gate|up */
        a.a = device_bf16(gu, T * FFN * 2);
        free(gu);
    }
    report("swiglu forward (row-strided gate|up)", median_ms(swiglu_rows_fwd, &a), 3.0 * T * FFN * 2, 0);
    device_free(a.a), device_free(a.b), device_free(a.c), device_free(a.d), device_free(a.e);

    int32_t *ids = malloc(sizeof(int32_t) * T);
    for (int64_t t = 0; t < T; t++) ids[t] = test_randint(0, VOCAB);
    a.ids = device_i32(ids, T);
    for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)(t % 2048);
    a.positions = device_i32(ids, T);
    float inv_freq[HEAD_DIM / 2];
    zt_rope_config rope = {.rope_type = ZT_ROPE_DEFAULT, .head_dim = HEAD_DIM, .theta = 10000.0};
    zt_cpu_rope_inv_freq(&rope, inv_freq);
    a.inv_freq = device_f32(inv_freq, HEAD_DIM / 2);
    a.a = device_bf16(x, T * HEADS * HEAD_DIM);
    report("rope forward (in place)", median_ms(rope_fwd, &a), 2.0 * T * HEADS * HEAD_DIM * 2, 0);
    device_free(a.a);
    {
        int64_t Q = HEADS * HEAD_DIM, KV = KV_HEADS * HEAD_DIM;
        float *qkv = random_bf16_values(T * (Q + 2 * KV), 1.0f);
        a.b = device_bf16(qkv, T * (Q + 2 * KV));
        a.c = device_bf16(qkv, T * Q), a.d = device_bf16(qkv, T * KV), a.e = device_bf16(qkv, T * KV);
        free(qkv);
        report("rope q|k|v forward (32 + 8 + 8 heads, stacked -> contiguous)", median_ms(rope_qkv_fwd, &a),
               2.0 * T * (Q + 2 * KV) * 2, 0);
        report("rope q|k|v backward (contiguous -> stacked)", median_ms(rope_qkv_bwd, &a), 2.0 * T * (Q + 2 * KV) * 2,
               0);
        device_free(a.b), device_free(a.c), device_free(a.d), device_free(a.e);
    }

    float *table = random_bf16_values((int64_t)(VOCAB + 1) * DIM, 1.0f); /* a row more for vocab + 1 */
    a.a = device_bf16(table, (int64_t)VOCAB * DIM), a.b = device_bf16(x, T * DIM);
    a.c = device_alloc((int64_t)VOCAB * DIM * 4);
    report("embedding forward", median_ms(embedding_fwd, &a), 2.0 * T * DIM * 2, 0);
    /* rows of the fp32 table gradient are read and written once per distinct id */
    report("embedding backward", median_ms(embedding_bwd, &a), T * DIM * (2.0 + 8.0), 0);
    a.d = device_alloc(T * 4), a.e = device_alloc(8), a.f = device_alloc((int64_t)(VOCAB + 1) * DIM * 4);
    void *dx = device_alloc(T * DIM * 2);
    void *keep_c = a.c;
    a.c = dx;
    a.a = device_bf16(x, T * DIM), a.b = device_bf16(table, (int64_t)(VOCAB + 1) * DIM);
    report("LM head + cross-entropy fwd+bwd (3 GEMMs)", median_ms(lm_head, &a), 0,
           3.0 * 2.0 * T * DIM * (double)VOCAB);
    report("LM head, vocab 32001 (3 GEMMs + 3 one-row tail GEMMs)", median_ms(lm_head_odd, &a), 0,
           3.0 * 2.0 * T * DIM * (double)(VOCAB + 1));
    device_free(a.a), device_free(a.b), device_free(keep_c), device_free(dx), device_free(a.d);
    device_free(a.e), device_free(a.f);

    a.a = device_bf16(x, T * DIM), a.b = device_bf16(x, (int64_t)FFN * DIM);
    a.c = device_alloc(T * FFN * 2), a.d = device_alloc((int64_t)FFN * DIM * 4);
    double flops = 2.0 * T * DIM * FFN;
    report("linear forward 8192x11008x4096", median_ms(linear_fwd, &a), 0, flops);
    report("linear dX", median_ms(linear_dx, &a), 0, flops);
    report("linear dW (fp32 accumulate)", median_ms(linear_dw, &a), 0, flops);
    device_free(a.a), device_free(a.b), device_free(a.c), device_free(a.d);

    /* 7B parameters would be 126 GB of optimizer traffic: one 1.0B-parameter slice, in 32 tensors */
    enum { N_PARAMS = 32 };
    const int64_t per = 1000000000 / N_PARAMS;
    zt_cuda_param params[N_PARAMS];
    float *chunk = random_f32(per, 1.0f);
    for (int i = 0; i < N_PARAMS; i++) {
        params[i] = (zt_cuda_param){.master = device_f32(chunk, per), .grad = device_f32(chunk, per),
                                    .exp_avg = device_f32(chunk, per), .exp_avg_sq = device_alloc(per * 4),
                                    .compute_copy = device_alloc(per * 2), .n = per};
        cudaMemset(params[i].exp_avg_sq, 0, per * 4);
    }
    a.params = params, a.n_params = N_PARAMS;
    /* reads p, g, m, v (16 bytes), writes p, m, v, bf16 copy (14 bytes) */
    report("adamw step, 1.0B parameters", median_ms(adamw, &a), 30.0 * per * N_PARAMS, 0);
    for (int i = 0; i < N_PARAMS; i++) {
        device_free(params[i].master), device_free((void *)params[i].grad);
        device_free(params[i].exp_avg), device_free(params[i].exp_avg_sq);
        device_free(params[i].compute_copy);
    }
    free(x), free(ids), free(table), free(chunk);
    device_free(a.ids), device_free(a.positions), device_free(a.inv_freq);
    zt_cuda_ctx_destroy(a.ctx);
    return 0;
}
