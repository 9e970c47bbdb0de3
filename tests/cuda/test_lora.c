/* The LoRA kernels of the llama plugin's CUDA path (plugins/llama/lora_cuda.c, docs/cuda.md "LoRA on
 * CUDA"): lora_dropout's mask against the CPU path's (plugins/llama/layers.c: its chain start and hash
 * step from plugins/llama/llama.h, the chain over the tokens and the per-element test as layers.c
 * writes them), bit for bit, written and accumulated; and the scaled GEMM against alpha times the
 * plain one. In bf16, then in fp16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_test.h"
#include "ztest.h"
#include "../../plugins/llama/llama.h"

/* layers.c's lora_dropout on the host: the chain value, then dst = keep(e) ? src * 1 / (1 - p) : 0
 * (+ dst when accumulating), rounded to the 16-bit type as the kernel rounds. */
static uint64_t host_chain(uint64_t start, const int32_t *ids, const int32_t *pos, int64_t n)
{
    uint64_t h = start;
    for (int64_t i = 0; i < n; i++) h = llama_lora_mix64(h ^ ((uint64_t)(uint32_t)ids[i] | (uint64_t)(uint32_t)pos[i] << 32));
    return h;
}

static void host_dropout(uint64_t h, float p, const float *src, float *dst, int64_t n, int accumulate)
{
    uint64_t cut = (uint64_t)((double)p * 16777216.0);
    float keep = 1.0f / (1.0f - p);
    for (int64_t e = 0; e < n; e++) {
        float v = (llama_lora_mix64(h + LLAMA_LORA_GOLDEN * (uint64_t)e) >> 40) >= cut ? src[e] * keep : 0.0f;
        dst[e] = accumulate ? dst[e] + v : v;
    }
    round_to_bf16(dst, n);
}

static void test_dropout(zt_cuda_ctx *ctx)
{
    const int64_t tokens = 300, in = 96, n = tokens * in;
    const float p = 0.3f;
    int32_t *ids = malloc(sizeof *ids * tokens), *pos = malloc(sizeof *pos * tokens);
    for (int64_t i = 0; i < tokens; i++) ids[i] = test_randint(0, 32000), pos[i] = (int32_t)(i % 77);
    llama_lora lora;
    memset(&lora, 0, sizeof lora);
    lora.seed = test_random_u64();
    uint64_t starts[LLAMA_LINEARS], want[LLAMA_LINEARS], got[LLAMA_LINEARS];
    for (int k = 0; k < LLAMA_LINEARS; k++) {
        starts[k] = llama_lora_mask_start(&lora, 3, k);
        want[k] = host_chain(starts[k], ids, pos, tokens);
    }
    int32_t *d_ids = device_i32(ids, tokens), *d_pos = device_i32(pos, tokens);
    uint64_t *d_hash = device_alloc(sizeof(uint64_t) * LLAMA_LINEARS);
    ZT_CHECK(check_ok("LoRA dropout hash", zt_cuda_lora_dropout_hash(ctx, 0, tokens, d_ids, d_pos, LLAMA_LINEARS,
                                                                     starts, d_hash)));
    ZT_CHECK(cudaMemcpy(got, d_hash, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess);
    int same = 1;
    for (int k = 0; k < LLAMA_LINEARS; k++) same &= got[k] == want[k];
    printf("LoRA dropout hash: %d chains over %lld tokens %s the CPU's\n", LLAMA_LINEARS, (long long)tokens,
           same ? "equal" : "DIFFER from");
    ZT_CHECK(same);

    float *src = random_bf16_values(n, 2.0f), *acc = random_bf16_values(n, 1.0f);
    uint16_t *d_src = device_bf16(src, n), *d_out = device_alloc((uint64_t)n * 2), *d_acc = device_bf16(acc, n);
    for (int k = 0; k < 2; k++) { /* two linears' masks: they must differ */
        float *ref = host_f32(n);
        host_dropout(want[k], p, src, ref, n, 0);
        ZT_CHECK(check_ok("LoRA dropout", zt_cuda_lora_dropout(ctx, 0, n, d_src, d_out, d_hash + k, p, 0)));
        float *out = download_bf16(d_out, n);
        ZT_CHECK(check_identical(k ? "LoRA dropout, linear 1" : "LoRA dropout, linear 0", out, ref, n));
        int64_t zeros = 0;
        for (int64_t e = 0; e < n; e++) zeros += out[e] == 0.0f;
        printf("  dropped %.4f of the elements (p %.2f)\n", (double)zeros / (double)n, (double)p);
        ZT_CHECK(fabs((double)zeros / (double)n - p) < 0.02);
        free(out);
        free(ref);
    }
    float *ref = host_f32(n);
    memcpy(ref, acc, sizeof(float) * (size_t)n);
    host_dropout(want[4], p, src, ref, n, 1);
    ZT_CHECK(check_ok("LoRA dropout, accumulate", zt_cuda_lora_dropout(ctx, 0, n, d_src, d_acc, d_hash + 4, p, 1)));
    float *out = download_bf16(d_acc, n);
    ZT_CHECK(check_identical("LoRA dropout added onto dx", out, ref, n));
    ZT_CHECK(check_fails("LoRA dropout with p = 0", zt_cuda_lora_dropout(ctx, 0, n, d_src, d_out, d_hash, 0.0f, 0),
                         ZT_ERR_INVALID_ARG, "probability"));
    free(out);
    free(ref);
    free(src);
    free(acc);
    free(ids);
    free(pos);
    device_free(d_ids);
    device_free(d_pos);
    device_free(d_hash);
    device_free(d_src);
    device_free(d_out);
    device_free(d_acc);
}

/* C = alpha A B^T (fp32 out, and accumulated) against alpha times zt_cuda_gemm's product. */
static void test_gemm_scaled(zt_cuda_ctx *ctx)
{
    const int64_t M = 256, N = 16, K = 4096; /* u = x A^T at r 16 */
    const float alpha = 2.0f / 3.0f;
    float *a = random_bf16_values(M * K, 1.0f), *b = random_bf16_values(N * K, 1.0f);
    uint16_t *d_a = device_bf16(a, M * K), *d_b = device_bf16(b, N * K);
    float *d_plain = device_alloc(sizeof(float) * M * N), *d_scaled = device_alloc(sizeof(float) * M * N);
    ZT_CHECK(check_ok("GEMM", zt_cuda_gemm(ctx, 0, 0, 1, M, N, K, d_a, K, d_b, K, d_plain, ZT_F32, N, 0)));
    ZT_CHECK(check_ok("scaled GEMM", zt_cuda_gemm_scaled(ctx, 0, 0, 1, M, N, K, alpha, d_a, K, d_b, K, d_scaled, ZT_F32,
                                                        N, 0)));
    float *plain = download_f32(d_plain, M * N), *scaled = download_f32(d_scaled, M * N);
    for (int64_t i = 0; i < M * N; i++) plain[i] *= alpha;
    ZT_CHECK(check_rel_l2("scaled GEMM = alpha x GEMM", scaled, plain, M * N, 1e-6));
    /* accumulating: C += alpha A B^T onto the scaled product doubles it */
    ZT_CHECK(check_ok("scaled GEMM, accumulate", zt_cuda_gemm_scaled(ctx, 0, 0, 1, M, N, K, alpha, d_a, K, d_b, K,
                                                                    d_scaled, ZT_F32, N, 1)));
    float *twice = download_f32(d_scaled, M * N);
    for (int64_t i = 0; i < M * N; i++) plain[i] *= 2.0f;
    ZT_CHECK(check_rel_l2("scaled GEMM accumulated (beta 1)", twice, plain, M * N, 1e-6));
    free(a);
    free(b);
    free(plain);
    free(scaled);
    free(twice);
    device_free(d_a);
    device_free(d_b);
    device_free(d_plain);
    device_free(d_scaled);
}

int main(void)
{
    cuda_test_init("test_cuda_lora");
    const int32_t passes[2] = {ZT_BF16, ZT_F16};
    for (int p = 0; p < 2; p++) {
        cuda_test_set_dtype16(passes[p]);
        printf("==== %s pass ====\n", cuda_test_dtype16_name());
        zt_cuda_ctx *ctx = cuda_test_ctx(0);
        test_dropout(ctx);
        test_gemm_scaled(ctx);
        zt_cuda_ctx_destroy(ctx);
    }
    return zt_test_result();
}
