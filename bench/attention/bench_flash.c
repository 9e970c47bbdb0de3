/* Times zt's flash attention (kernels/cuda) forward and forward+backward, causal, bf16, on random
 * inputs; bench/attention/run.py runs it next to PyTorch's SDPA. Prints one line of key=value.
 *
 *   zt-bench-flash --batch 8 --seq 2048 --heads 32 [--kv-heads 32] [--dim 128] [--iters 20]
 *                  [--kernel auto|mma|wgmma] [--backward-kernel auto|mma|wgmma|wgmma-ws]
 *
 * --kernel picks the kernels (default: ZT_FLASH_KERNEL, else auto), --backward-kernel the backward's
 * alone (default: ZT_FLASH_BACKWARD_KERNEL, else as --kernel; wgmma-ws: the warp-specialized Hopper
 * backward, auto's backward on Hopper; as --kernel it means the wgmma forward with that backward).
 * With a wgmma kernel (or wgmma-ws) it also runs the
 * mma kernel once on the same inputs and prints the relative L2 difference of the outputs
 * (vs_mma_rel_l2: o for the forward, dq, dk, dv for the backward, the largest), a correctness check
 * at the benchmark's own, larger shapes; above 2e-2 it fails.
 *
 * Times are medians over --iters runs, each between two CUDA events, after 3 warm-up runs.
 * FLOPs follow the FlashAttention papers' convention for causal attention: forward
 * 4 B H T^2 D / 2, backward 2.5 times that. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/flash_kernel.h"

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
    zt_cuda_flash_kernel kernel, bwd_kernel;
    check("ZT_FLASH_KERNEL", zt_cuda_flash_kernel_from_env(&kernel));
    check("ZT_FLASH_BACKWARD_KERNEL", zt_cuda_flash_backward_kernel_from_env(&bwd_kernel));
    int bwd_named = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) s.batch = parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) s.seq = parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) s.heads = parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-heads")) s.kv_heads = parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--dim")) s.head_dim = parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = (int)parse_arg(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--kernel")) check("--kernel", zt_cuda_flash_kernel_parse(argv[i + 1], &kernel));
        else if (!strcmp(argv[i], "--backward-kernel")) {
            check("--backward-kernel", zt_cuda_flash_kernel_parse(argv[i + 1], &bwd_kernel));
            bwd_named = 1;
        }
        else die(argv[i], "unknown option (--batch --seq --heads --kv-heads --dim --iters --kernel "
                          "--backward-kernel)");
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
    /* --kernel alone sets both, unless ZT_FLASH_BACKWARD_KERNEL names the backward's */
    if (!bwd_named && !getenv("ZT_FLASH_BACKWARD_KERNEL")) bwd_kernel = kernel;
    check("--kernel", zt_cuda_flash_kernel_resolve(ctx, &s, kernel, &kernel));
    check("--backward-kernel", zt_cuda_flash_kernel_resolve(ctx, &s, bwd_kernel, &bwd_kernel));
    cudaStream_t stream;
    check_cuda("cudaStreamCreate", cudaStreamCreate(&stream));
    cudaEvent_t start, stop;
    check_cuda("cudaEventCreate", cudaEventCreate(&start));
    check_cuda("cudaEventCreate", cudaEventCreate(&stop));

    float *fwd_ms = malloc(sizeof(float) * (size_t)iters), *both_ms = malloc(sizeof(float) * (size_t)iters);
    for (int run = -3; run < iters; run++) { /* 3 warm-up runs */
        check_cuda("cudaEventRecord", cudaEventRecord(start, stream));
        check("forward", zt_cuda_flash_attention_forward_kernel(ctx, stream, &s, kernel, q, k, v, NULL, o, lse));
        check_cuda("cudaEventRecord", cudaEventRecord(stop, stream));
        check_cuda("forward", cudaEventSynchronize(stop));
        if (run >= 0) check_cuda("cudaEventElapsedTime", cudaEventElapsedTime(&fwd_ms[run], start, stop));
    }
    for (int run = -3; run < iters; run++) {
        check_cuda("cudaEventRecord", cudaEventRecord(start, stream));
        check("forward", zt_cuda_flash_attention_forward_kernel(ctx, stream, &s, kernel, q, k, v, NULL, o, lse));
        check("backward", zt_cuda_flash_attention_backward_kernel(ctx, stream, &s, bwd_kernel, q, k, v, NULL,
                                                                  o, lse, dout, dq, dk, dv));
        check_cuda("cudaEventRecord", cudaEventRecord(stop, stream));
        check_cuda("forward + backward", cudaEventSynchronize(stop));
        if (run >= 0) check_cuda("cudaEventElapsedTime", cudaEventElapsedTime(&both_ms[run], start, stop));
    }
    /* the wgmma kernels' outputs against the mma kernels' at this shape (bf16, relative L2) */
    double vs_mma = -1.0;
    const int hopper_fwd = kernel == ZT_CUDA_FLASH_WGMMA || kernel == ZT_CUDA_FLASH_WGMMA_WS;
    const int hopper_bwd = bwd_kernel == ZT_CUDA_FLASH_WGMMA || bwd_kernel == ZT_CUDA_FLASH_WGMMA_WS;
    if (hopper_fwd || hopper_bwd) {
        uint16_t *outs[4] = {o, dq, dk, dv}, *refs[4];
        int64_t sizes[4] = {nq, nq, nkv, nkv};
        float *lse_ref;
        for (int i = 0; i < 4; i++)
            check_cuda("cudaMalloc", cudaMalloc((void **)&refs[i], 2 * (size_t)sizes[i]));
        check_cuda("cudaMalloc", cudaMalloc((void **)&lse_ref, 4 * (size_t)(s.batch * s.heads * s.seq)));
        check("forward", zt_cuda_flash_attention_forward_kernel(ctx, stream, &s, kernel, q, k, v, NULL, o, lse));
        check("backward", zt_cuda_flash_attention_backward_kernel(ctx, stream, &s, bwd_kernel, q, k, v, NULL,
                                                                  o, lse, dout, dq, dk, dv));
        check("forward (mma)", zt_cuda_flash_attention_forward_kernel(ctx, stream, &s, ZT_CUDA_FLASH_MMA, q, k,
                                                                       v, NULL, refs[0], lse_ref));
        check("backward (mma)", zt_cuda_flash_attention_backward_kernel(ctx, stream, &s, ZT_CUDA_FLASH_MMA, q,
                                                                        k, v, NULL, refs[0], lse_ref, dout,
                                                                        refs[1], refs[2], refs[3]));
        check_cuda("forward + backward", cudaStreamSynchronize(stream));
        static const char *const names[4] = {"o", "dq", "dk", "dv"};
        for (int t = 0; t < 4; t++) {
            if (t == 0 && !hopper_fwd) continue;
            if (t > 0 && !hopper_bwd && !hopper_fwd) continue;
            uint16_t *a = malloc(2 * (size_t)sizes[t]), *b = malloc(2 * (size_t)sizes[t]);
            if (!a || !b) die("malloc", "out of host memory");
            check_cuda("cudaMemcpy", cudaMemcpy(a, outs[t], 2 * (size_t)sizes[t], cudaMemcpyDeviceToHost));
            check_cuda("cudaMemcpy", cudaMemcpy(b, refs[t], 2 * (size_t)sizes[t], cudaMemcpyDeviceToHost));
            double diff = 0.0, norm = 0.0;
            for (int64_t i = 0; i < sizes[t]; i++) {
                uint32_t ua = (uint32_t)a[i] << 16, ub = (uint32_t)b[i] << 16;
                float fa, fb;
                memcpy(&fa, &ua, 4), memcpy(&fb, &ub, 4);
                diff += ((double)fa - fb) * ((double)fa - fb), norm += (double)fb * fb;
            }
            double rel = norm > 0.0 ? sqrt(diff / norm) : (diff > 0.0 ? INFINITY : 0.0);
            if (!(rel < 2e-2)) { /* NaN too */
                fprintf(stderr, "zt-bench-flash: %s of the %s/%s kernels differs from the mma kernels': "
                                "relative L2 %g (expected < 2e-2)\n", names[t],
                        zt_cuda_flash_kernel_name(kernel), zt_cuda_flash_kernel_name(bwd_kernel), rel);
                return 1;
            }
            if (rel > vs_mma) vs_mma = rel;
            free(a), free(b);
        }
        for (int i = 0; i < 4; i++) cudaFree(refs[i]);
        cudaFree(lse_ref);
    }
    qsort(fwd_ms, (size_t)iters, sizeof(float), compare_floats);
    qsort(both_ms, (size_t)iters, sizeof(float), compare_floats);
    double fwd = fwd_ms[iters / 2], both = both_ms[iters / 2];
    double fwd_flops = 4.0 * (double)s.batch * (double)s.heads * (double)s.seq * (double)s.seq *
                       (double)s.head_dim / 2.0;
    printf("zt-flash kernel=%s backward_kernel=%s batch=%lld seq=%lld heads=%lld kv_heads=%lld dim=%lld fwd_ms=%.4f "
           "fwd_bwd_ms=%.4f fwd_tflops=%.1f fwd_bwd_tflops=%.1f fwd_min_ms=%.4f fwd_bwd_min_ms=%.4f "
           "vs_mma_rel_l2=%.2e\n",
           zt_cuda_flash_kernel_name(kernel), zt_cuda_flash_kernel_name(bwd_kernel), (long long)s.batch, (long long)s.seq, (long long)s.heads,
           (long long)s.kv_heads, (long long)s.head_dim, fwd, both, fwd_flops / (fwd * 1e9),
           3.5 * fwd_flops / (both * 1e9), (double)fwd_ms[0], (double)both_ms[0], vs_mma);
    free(fwd_ms), free(both_ms);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(dout), cudaFree(o), cudaFree(dq), cudaFree(dk);
    cudaFree(dv), cudaFree(lse);
    zt_cuda_ctx_destroy(ctx);
    return 0;
}
