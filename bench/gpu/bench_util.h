/* What the CUDA kernel benchmarks share (zt-bench-decode, zt-bench-gemm-rows): fatal errors with
 * the program's name, random 16-bit device buffers, medians and the device's copy bandwidth (the
 * bound a bandwidth-bound kernel is measured against). Each program sets bench_name first. */
#ifndef ZT_BENCH_GPU_BENCH_UTIL_H
#define ZT_BENCH_GPU_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/kernels_cuda.h"

static const char *bench_name = "zt-bench";

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "%s: %s: %s\n", bench_name, what, detail);
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

/* n 16-bit values in (-1, -0.5] and [0.5, 1) as bf16 */
static uint16_t *random_16(int64_t n, uint64_t *state)
{
    uint16_t *host = malloc(sizeof(uint16_t) * (size_t)n), *dev;
    if (!host) die("malloc", "out of host memory");
    for (int64_t i = 0; i < n; i++) {
        *state ^= *state << 13, *state ^= *state >> 7, *state ^= *state << 17;
        host[i] = (uint16_t)(((*state >> 40) & 0x8000u) | 0x3f00u | ((*state >> 20) & 0x7fu));
    }
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

static double copy_gbps(void)
{
    size_t bytes = (size_t)1 << 30;
    void *a, *b;
    check_cuda("cudaMalloc", cudaMalloc(&a, bytes));
    check_cuda("cudaMalloc", cudaMalloc(&b, bytes));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 2; i++) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < 10; i++) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
    cudaEventRecord(e1, 0);
    check_cuda("copy", cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes * 10 / (ms * 1e-3) / 1e9;
}

/* "1,8,32" -> out[0..n), at most max values */
static int parse_list(const char *text, int *out, int max)
{
    int n = 0;
    for (const char *p = text; *p && n < max;) {
        out[n++] = atoi(p);
        const char *comma = strchr(p, ',');
        if (!comma) break;
        p = comma + 1;
    }
    return n;
}

#endif
