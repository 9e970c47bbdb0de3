/* LoRA's dropout on the GPU, the same mask as the CPU path (plugins/llama/layers.c, lora_dropout):
 * element e of a [tokens, in] input is kept when mix64(h + GOLDEN * e) >> 40 >= p * 2^24, and scaled by
 * 1 / (1 - p), where h chains splitmix64's finalizer over the micro-batch's tokens and positions from a
 * start value that the caller derives from the seed, the unit and the linear. CPU and GPU therefore drop
 * the same elements of the same batch.
 *
 * The chain is serial in the tokens: one thread per chain (zt_cuda_lora_dropout_hash runs up to
 * ZT_LORA_DROPOUT_CHAINS of them at once, one per linear of a layer); the mask is elementwise.
 */
#include <string.h>

#include "cuda/common.cuh"

#define LORA_GOLDEN 0x9e3779b97f4a7c15ull

__device__ __forceinline__ uint64_t lora_mix64(uint64_t z) /* splitmix64's finalizer */
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct lora_chain_starts {
    uint64_t h[ZT_LORA_DROPOUT_CHAINS];
};

__global__ void lora_dropout_hash_kernel(int64_t tokens, const int32_t *ids, const int32_t *positions,
                                         int n_chains, lora_chain_starts starts, uint64_t *out)
{
    int c = threadIdx.x;
    if (c >= n_chains) return;
    uint64_t h = starts.h[c];
    for (int64_t i = 0; i < tokens; i++)
        h = lora_mix64(h ^ ((uint64_t)(uint32_t)ids[i] | (uint64_t)(uint32_t)positions[i] << 32));
    out[c] = h;
}

template <typename T>
__global__ void lora_dropout_kernel(int64_t n, const T *src, T *dst, const uint64_t *hash, uint64_t cut,
                                    float keep, int accumulate)
{
    uint64_t h = *hash;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += stride) {
        float v = (lora_mix64(h + LORA_GOLDEN * (uint64_t)e) >> 40) >= cut ? zt_to_f32(src[e]) * keep : 0.0f;
        if (accumulate) v += zt_to_f32(dst[e]);
        dst[e] = zt_from_f32<T>(v);
    }
}

zt_status zt_cuda_lora_dropout_hash(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens, const int32_t *ids,
                                    const int32_t *positions, int n_chains, const uint64_t *starts,
                                    uint64_t *out)
{
    (void)ctx;
    if (n_chains < 1 || n_chains > ZT_LORA_DROPOUT_CHAINS || tokens < 0)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "LoRA dropout hash: %d chains (1 to %d) over %lld tokens",
                            n_chains, ZT_LORA_DROPOUT_CHAINS, (long long)tokens);
    lora_chain_starts s;
    memset(&s, 0, sizeof s);
    for (int c = 0; c < n_chains; c++) s.h[c] = starts[c];
    lora_dropout_hash_kernel<<<1, 32, 0, stream>>>(tokens, ids, positions, n_chains, s, out);
    return zt_cuda_check_launch("LoRA dropout hash");
}

zt_status zt_cuda_lora_dropout(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n, const uint16_t *src,
                               uint16_t *dst, const uint64_t *hash, float p, int accumulate)
{
    if (!(p > 0.0f && p < 1.0f))
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "LoRA dropout: probability %g is not in (0, 1)", (double)p);
    if (n <= 0) return ZT_OK;
    /* the CPU path's constants, computed the same way (double product, float reciprocal) */
    uint64_t cut = (uint64_t)((double)p * 16777216.0);
    float keep = 1.0f / (1.0f - p);
    ZT_DISPATCH16(ctx->dtype, T,
                  lora_dropout_kernel<T><<<zt_grid_for(n, 256, ctx), 256, 0, stream>>>(
                      n, (const T *)src, (T *)dst, hash, cut, keep, accumulate));
    return zt_cuda_check_launch("LoRA dropout");
}
