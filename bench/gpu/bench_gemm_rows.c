/* Times the decode step's linear layers (y = x w^T, zt_cuda_linear_forward) on 7B shapes at a few
 * rows M (the batch of a decode step) and prints the weight bandwidth each reaches next to the
 * device's copy bandwidth: at these M a GEMM is bound by reading its weights once. One key=value line
 * per (shape, M). Run it twice to compare gemm.cu's routes: as is (M <= 64: gemm_small_m.cu) and with
 * ZT_CUDA_SMALL_M_GEMM=0 (everything through cuBLASLt); the line's path= says which ran.
 *
 *   zt-bench-gemm-rows [--rows 1,8,16,32,64] [--iters 50]
 *
 * Shapes (N x K, LLaMA-7B): q|k|v 12288 x 4096, o 4096 x 4096, gate|up 22016 x 4096, down 4096 x
 * 11008, LM head 32000 x 4096. Times are medians over --iters runs, each between two CUDA events,
 * after 3 warm-up runs, with the weights of all five resident (more than the L2 holds). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_util.h"

int main(int argc, char **argv)
{
    bench_name = "zt-bench-gemm-rows";
    int rows[16] = {1, 8, 16, 32, 64}, n_rows = 5, iters = 50;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) die(a, "needs a value (see the usage at the top of bench/gpu/bench_gemm_rows.c)");
        if (!strcmp(a, "--iters")) iters = atoi(v);
        else if (!strcmp(a, "--rows")) n_rows = parse_list(v, rows, 16);
        else die(a, "unknown option (see the usage at the top of bench/gpu/bench_gemm_rows.c)");
        i++;
    }
    if (iters < 1) die("--iters", "must be >= 1");
    static const struct { const char *name; int64_t n, k; } shapes[] = {
        {"qkv", 12288, 4096}, {"o", 4096, 4096}, {"gate_up", 22016, 4096}, {"down", 4096, 11008}, {"lm_head", 32000, 4096}};
    enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };
    const char *env = getenv("ZT_CUDA_SMALL_M_GEMM");
    const char *path = env && !strcmp(env, "0") ? "cublaslt" : "zt";
    zt_cuda_ctx *ctx;
    check("zt_cuda_ctx_create", zt_cuda_ctx_create(0, 1 << 20, &ctx));
    double copy = copy_gbps();
    printf("device_copy_gbps=%.0f\n", copy);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    uint16_t *w[N_SHAPES], *x, *y;
    int max_rows = 1;
    for (int r = 0; r < n_rows; r++) max_rows = rows[r] > max_rows ? rows[r] : max_rows;
    for (int s = 0; s < N_SHAPES; s++) w[s] = random_16(shapes[s].n * shapes[s].k, &state);
    x = random_16((int64_t)max_rows * 11008, &state);
    check_cuda("cudaMalloc", cudaMalloc((void **)&y, sizeof(uint16_t) * (size_t)max_rows * 32000));
    float *times = malloc(sizeof(float) * (size_t)iters);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int r = 0; r < n_rows; r++)
        for (int s = 0; s < N_SHAPES; s++) {
            int64_t M = rows[r], N = shapes[s].n, K = shapes[s].k;
            for (int i = 0; i < 3; i++) check("zt_cuda_linear_forward", zt_cuda_linear_forward(ctx, 0, M, N, K, x, w[s], y));
            for (int it = 0; it < iters; it++) {
                cudaEventRecord(e0, 0);
                check("zt_cuda_linear_forward", zt_cuda_linear_forward(ctx, 0, M, N, K, x, w[s], y));
                cudaEventRecord(e1, 0);
                check_cuda("gemm", cudaEventSynchronize(e1));
                cudaEventElapsedTime(&times[it], e0, e1);
            }
            qsort(times, (size_t)iters, sizeof(float), compare_floats);
            double ms = times[iters / 2], gbps = (double)N * K * 2 / (ms * 1e-3) / 1e9;
            printf("gemm path=%s shape=%s M=%lld N=%lld K=%lld us=%.1f weight_gbps=%.0f of_copy=%.2f\n", path,
                   shapes[s].name, (long long)M, (long long)N, (long long)K, ms * 1e3, gbps, gbps / copy);
        }
    free(times);
    for (int s = 0; s < N_SHAPES; s++) cudaFree(w[s]);
    cudaFree(x);
    cudaFree(y);
    zt_cuda_ctx_destroy(ctx);
    return 0;
}
