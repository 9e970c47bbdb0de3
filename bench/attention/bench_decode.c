/* Times zt_cuda_attention_decode (kernels/cuda) on 7B shapes over a paged KV cache with shuffled
 * blocks and prints the bandwidth it reaches next to the device's copy bandwidth (the bound: decode
 * reads every cached K and V element once). One key=value line per (batch, context).
 *
 *   zt-bench-decode [--heads 32] [--kv-heads 32] [--dim 128] [--block 16] [--new 1] [--iters 50]
 *                   [--batches 1,8,32] [--contexts 256,1024,2048] [--fp16]
 *
 * Every sequence of a batch holds the full context; the block tables have room for exactly that
 * context (table_stride = context / block, rounded up). Times are medians over --iters runs, each
 * between two CUDA events, after 3 warm-up runs. Bytes counted: K and V of every visible token, plus
 * q and out. copy_gbps: cudaMemcpy device to device of 1 GiB (read + write counted). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../gpu/bench_util.h"

static uint64_t next_random(uint64_t *state)
{
    *state ^= *state << 13, *state ^= *state >> 7, *state ^= *state << 17;
    return *state;
}

int main(int argc, char **argv)
{
    bench_name = "zt-bench-decode";
    int heads = 32, kv_heads = 32, dim = 128, block = 16, n_new = 1, iters = 50, fp16 = 0;
    int batches[16] = {1, 8, 32}, contexts[16] = {256, 1024, 2048}, nb = 3, nc = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--fp16")) { fp16 = 1; continue; }
        if (!v) die(a, "needs a value (see the usage at the top of bench/attention/bench_decode.c)");
        if (!strcmp(a, "--heads")) heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) kv_heads = atoi(v);
        else if (!strcmp(a, "--dim")) dim = atoi(v);
        else if (!strcmp(a, "--block")) block = atoi(v);
        else if (!strcmp(a, "--new")) n_new = atoi(v);
        else if (!strcmp(a, "--iters")) iters = atoi(v);
        else if (!strcmp(a, "--batches")) nb = parse_list(v, batches, 16);
        else if (!strcmp(a, "--contexts")) nc = parse_list(v, contexts, 16);
        else die(a, "unknown option (see the usage at the top of bench/attention/bench_decode.c)");
        i++;
    }
    if (iters < 1 || block < 1 || n_new < 1 || kv_heads < 1 || heads % kv_heads) die("options", "bad shape");
    zt_cuda_ctx *ctx;
    uint64_t scratch = 0; /* the largest any (batch, context) needs */
    for (int bi = 0; bi < nb; bi++)
        for (int ci = 0; ci < nc; ci++) {
            uint64_t need = zt_cuda_attention_decode_scratch_bytes(batches[bi], n_new, heads, dim,
                                                                   (contexts[ci] + n_new + block - 1) / block, block);
            if (need > scratch) scratch = need;
        }
    check("zt_cuda_ctx_create", zt_cuda_ctx_create(0, scratch + (1 << 20), &ctx));
    if (fp16) check("zt_cuda_ctx_set_dtype", zt_cuda_ctx_set_dtype(ctx, ZT_F16));
    double copy = copy_gbps();
    printf("device_copy_gbps=%.0f\n", copy);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    float *times = malloc(sizeof(float) * (size_t)iters);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int bi = 0; bi < nb; bi++)
        for (int ci = 0; ci < nc; ci++) {
            int B = batches[bi], T = contexts[ci];
            int stride = (T + n_new + block - 1) / block, n_blocks = B * stride;
            int64_t row = (int64_t)kv_heads * dim, pool = (int64_t)n_blocks * block * row;
            uint16_t *k = random_16(pool, &state), *v = random_16(pool, &state);
            uint16_t *q = random_16((int64_t)B * n_new * heads * dim, &state), *out;
            check_cuda("cudaMalloc", cudaMalloc((void **)&out, sizeof(uint16_t) * (size_t)B * n_new * heads * dim));
            int32_t *tables = malloc(sizeof(int32_t) * (size_t)n_blocks), *lengths = malloc(sizeof(int32_t) * (size_t)B);
            for (int i = 0; i < n_blocks; i++) tables[i] = i;
            for (int i = n_blocks - 1; i > 0; i--) { /* shuffled blocks */
                int j = (int)(next_random(&state) % (uint64_t)(i + 1)), t = tables[i];
                tables[i] = tables[j];
                tables[j] = t;
            }
            for (int s = 0; s < B; s++) lengths[s] = T;
            int32_t *dtables, *dlengths;
            check_cuda("cudaMalloc", cudaMalloc((void **)&dtables, sizeof(int32_t) * (size_t)n_blocks));
            check_cuda("cudaMalloc", cudaMalloc((void **)&dlengths, sizeof(int32_t) * (size_t)B));
            cudaMemcpy(dtables, tables, sizeof(int32_t) * (size_t)n_blocks, cudaMemcpyHostToDevice);
            cudaMemcpy(dlengths, lengths, sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice);
            zt_cuda_kv_pages p = {k, v, block, kv_heads, dim, dtables, stride, dlengths};
            float scale = 1.0f / 11.3137085f;
            for (int w = 0; w < 3; w++)
                check("zt_cuda_attention_decode", zt_cuda_attention_decode(ctx, 0, &p, B, n_new, heads, scale, q, out));
            for (int it = 0; it < iters; it++) {
                cudaEventRecord(e0, 0);
                check("zt_cuda_attention_decode", zt_cuda_attention_decode(ctx, 0, &p, B, n_new, heads, scale, q, out));
                cudaEventRecord(e1, 0);
                check_cuda("decode", cudaEventSynchronize(e1));
                cudaEventElapsedTime(&times[it], e0, e1);
            }
            qsort(times, (size_t)iters, sizeof(float), compare_floats);
            double ms = times[iters / 2];
            double bytes = (double)B * (T + n_new) * row * 2 * 2 + 2.0 * B * n_new * heads * dim * 2;
            double gbps = bytes / (ms * 1e-3) / 1e9;
            printf("decode batch=%d context=%d heads=%d kv_heads=%d dim=%d block=%d new=%d dtype=%s us=%.1f gbps=%.0f "
                   "of_copy=%.2f\n",
                   B, T, heads, kv_heads, dim, block, n_new, fp16 ? "fp16" : "bf16", ms * 1e3, gbps, gbps / copy);
            cudaFree(k);
            cudaFree(v);
            cudaFree(q);
            cudaFree(out);
            cudaFree(dtables);
            cudaFree(dlengths);
            free(tables);
            free(lengths);
        }
    free(times);
    zt_cuda_ctx_destroy(ctx);
    return 0;
}
