/* Times zt's flash attention (kernels/cuda) forward and forward+backward, causal, bf16, on random
 * inputs; bench/attention/run.py runs it next to PyTorch's SDPA. Prints one line of key=value.
 *
 *   zt-bench-flash --batch 8 --seq 2048 --heads 32 [--kv-heads 32] [--dim 128] [--iters 20]
 *
 * Times are medians over --iters runs, each between two CUDA events, after 3 warm-up runs.
 * FLOPs follow the FlashAttention papers' convention for causal attention: forward
 * 4 B H T^2 D / 2, backward 2.5 times that. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/kernels_cuda.h"

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "zt-bench-flash: %s: %s\n", what, detail);
    exit(1);
}

static void check(const char *what, zt_status st)
{
    if (st != ZT_OK) die(what, zt_cuda_last_error());
}

static void check_cuda(const char *what, cudaError_t e)
{
    if (e != cudaSuccess) die(what, cudaGetErrorString(e));
}

/* Device buffer of n bf16 values uniform in [-1, 1). */
static uint16_t *random_bf16(int64_t n, uint64_t *state)
{
    uint16_t *host = malloc(sizeof(uint16_t) * (size_t)n);
    if (!host) die("malloc", "out of host memory");
    for (int64_t i = 0; i < n; i++) {
        *state ^= *state << 13, *state ^= *state >> 7, *state ^= *state << 17;
        /* sign, exponent 2^-1..2^0, random mantissa: values in (-1, -0.5] and [0.5, 1) */
        host[i] = (uint16_t)(((*state >> 40) & 0x8000u) | 0x3f00u | ((*state >> 20) & 0x7fu));
    }
    uint16_t *dev;
    check_cuda("cudaMalloc", cudaMalloc((void **)&dev, sizeof(uint16_t) * (size_t)n));
    check_cuda("cudaMemcpy", cudaMemcpy(dev, host, sizeof(uint16_t) * (size_t)n, cudaMemcpyHostToDevice));
    free(host);
    return dev;
}

static int compare_floats(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static long parse_arg(const char *name, const char *value)
{
    char *end;
    long v = strtol(value, &end, 10);
    if (*end || v <= 0) die(name, "expects a positive integer");
    return v;
}

int main(int argc, char **argv)
{
    zt_cuda_attention_shape s = {.batch = 8, .seq = 2048, .heads = 32, .kv_heads = 0, .head_dim = 128};
    int iters = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) s.batch = parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) s.seq = parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) s.heads = parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-heads")) s.kv_heads = parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--dim")) s.head_dim = parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = (int)parse_arg(argv[i], argv[i + 1]);
        else die(argv[i], "unknown option (--batch --seq --heads --kv-heads --dim --iters)");
    }
    if (argc % 2 == 0) die(argv[argc - 1], "option without a value");
    if (s.kv_heads == 0) s.kv_heads = s.heads;
    s.scale = 1.0f / sqrtf((float)s.head_dim);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) die("CUDA", "no CUDA device");

    zt_cuda_ctx *ctx;
    check("context", zt_cuda_ctx_create(0, zt_cuda_flash_attention_backward_scratch_bytes(&s), &ctx));
    int64_t nq = s.batch * s.seq * s.heads * s.head_dim, nkv = s.batch * s.seq * s.kv_heads * s.head_dim;
    uint64_t state = 0x9E3779B97F4A7C15ull;
    uint16_t *q = random_bf16(nq, &state), *k = random_bf16(nkv, &state), *v = random_bf16(nkv, &state);
    uint16_t *dout = random_bf16(nq, &state), *o, *dq, *dk, *dv;
    float *lse;
    check_cuda("cudaMalloc", cudaMalloc((void **)&o, 2 * (size_t)nq));
    check_cuda("cudaMalloc", cudaMalloc((void **)&dq, 2 * (size_t)nq));
    check_cuda("cudaMalloc", cudaMalloc((void **)&dk, 2 * (size_t)nkv));
    check_cuda("cudaMalloc", cudaMalloc((void **)&dv, 2 * (size_t)nkv));
    check_cuda("cudaMalloc", cudaMalloc((void **)&lse, 4 * (size_t)(s.batch * s.heads * s.seq)));
    cudaStream_t stream;
    check_cuda("cudaStreamCreate", cudaStreamCreate(&stream));
    cudaEvent_t start, stop;
    check_cuda("cudaEventCreate", cudaEventCreate(&start));
    check_cuda("cudaEventCreate", cudaEventCreate(&stop));

    float *fwd_ms = malloc(sizeof(float) * (size_t)iters), *both_ms = malloc(sizeof(float) * (size_t)iters);
    for (int run = -3; run < iters; run++) { /* 3 warm-up runs */
        check_cuda("cudaEventRecord", cudaEventRecord(start, stream));
        check("forward", zt_cuda_flash_attention_forward(ctx, stream, &s, q, k, v, NULL, o, lse));
        check_cuda("cudaEventRecord", cudaEventRecord(stop, stream));
        check_cuda("forward", cudaEventSynchronize(stop));
        if (run >= 0) check_cuda("cudaEventElapsedTime", cudaEventElapsedTime(&fwd_ms[run], start, stop));
    }
    for (int run = -3; run < iters; run++) {
        check_cuda("cudaEventRecord", cudaEventRecord(start, stream));
        check("forward", zt_cuda_flash_attention_forward(ctx, stream, &s, q, k, v, NULL, o, lse));
        check("backward", zt_cuda_flash_attention_backward(ctx, stream, &s, q, k, v, NULL, o, lse,
                                                           dout, dq, dk, dv));
        check_cuda("cudaEventRecord", cudaEventRecord(stop, stream));
        check_cuda("forward + backward", cudaEventSynchronize(stop));
        if (run >= 0) check_cuda("cudaEventElapsedTime", cudaEventElapsedTime(&both_ms[run], start, stop));
    }
    qsort(fwd_ms, (size_t)iters, sizeof(float), compare_floats);
    qsort(both_ms, (size_t)iters, sizeof(float), compare_floats);
    double fwd = fwd_ms[iters / 2], both = both_ms[iters / 2];
    double fwd_flops = 4.0 * (double)s.batch * (double)s.heads * (double)s.seq * (double)s.seq *
                       (double)s.head_dim / 2.0;
    printf("zt-flash batch=%lld seq=%lld heads=%lld kv_heads=%lld dim=%lld fwd_ms=%.4f "
           "fwd_bwd_ms=%.4f fwd_tflops=%.1f fwd_bwd_tflops=%.1f fwd_min_ms=%.4f fwd_bwd_min_ms=%.4f\n",
           (long long)s.batch, (long long)s.seq, (long long)s.heads, (long long)s.kv_heads,
           (long long)s.head_dim, fwd, both, fwd_flops / (fwd * 1e9), 3.5 * fwd_flops / (both * 1e9),
           (double)fwd_ms[0], (double)both_ms[0]);
    free(fwd_ms), free(both_ms);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(dout), cudaFree(o), cudaFree(dq), cudaFree(dk);
    cudaFree(dv), cudaFree(lse);
    zt_cuda_ctx_destroy(ctx);
    return 0;
}
