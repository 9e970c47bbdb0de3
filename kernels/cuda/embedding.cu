/* Token embedding lookup (bf16 or fp16: a 16-bit copy, type-agnostic) and its deterministic scatter-add backward (fp32).
 *
 * Backward without atomics: token positions are sorted by id (a stable radix sort, so tokens with
 * the same id stay in token order); the block at the first position of each run of equal ids sums
 * dy over the run, in token order, and adds the sum to that id's row of dtable. The result is the
 * same on every run, and the same sum the CPU kernel takes.
 * Out-of-range ids are recorded in the context (zt_cuda_check_indices reports them); the forward
 * writes zeros for them and the backward leaves the table alone.
 */
#include <cub/device/device_radix_sort.cuh>
#include "cuda/common.cuh"

enum { THREADS = 128, COLUMNS_PER_BLOCK = THREADS * 8 };

static zt_status check_shape(const char *what, int64_t tokens, int64_t vocab, int64_t dim,
                             const void *const *ptrs, int n_ptrs)
{
    if (tokens < 0 || tokens > INT32_MAX || vocab <= 0 || vocab >= INT32_MAX || dim <= 0 ||
        dim % 8 != 0)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "%s: tokens %lld (at most 2^31-1), vocab %lld (positive, below 2^31-1) "
                            "and dim %lld (a positive multiple of 8) are not all valid",
                            what, (long long)tokens, (long long)vocab, (long long)dim);
    for (int i = 0; i < n_ptrs; i++)
        if ((uintptr_t)ptrs[i] % 16 != 0)
            return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                                "%s: tensor argument %d is not 16-byte aligned; allocate it with "
                                "cudaMalloc or at a multiple of 8 elements", what, i + 1);
    return ZT_OK;
}

/* Rows [first, first + rows) of the vocabulary live in table (a tensor-parallel rank's shard; the
 * whole table: 0, vocab); a valid id outside them gives zeros. */
__global__ void embedding_forward_kernel(int64_t vocab, int64_t first, int64_t rows, int64_t dim,
                                         const int32_t *ids, const bf16 *table, bf16 *y,
                                         unsigned long long *bad)
{
    int64_t t = blockIdx.x;
    int32_t id = ids[t];
    int valid = id >= 0 && id < vocab;
    if (!valid && threadIdx.x == 0) zt_record_bad_index(bad, t, id);
    int64_t local = (int64_t)id - first;
    int here = valid && local >= 0 && local < rows;
    for (int64_t col = (int64_t)threadIdx.x * 8; col < dim; col += (int64_t)blockDim.x * 8) {
        uint4 v = here ? *reinterpret_cast<const uint4 *>(table + local * dim + col) : make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4 *>(y + t * dim + col) = v;
    }
}

static zt_status check_rows(const char *what, int64_t vocab, int64_t first, int64_t rows)
{
    if (first < 0 || rows < 0 || first + rows > vocab)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: rows %lld..%lld are not inside the vocabulary of %lld",
                            what, (long long)first, (long long)(first + rows), (long long)vocab);
    return ZT_OK;
}

zt_status zt_cuda_embedding_forward_rows(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                         int64_t vocab, int64_t first, int64_t rows, int64_t dim,
                                         const int32_t *ids, const uint16_t *table, uint16_t *y)
{
    const void *ptrs[] = {table, y};
    zt_status st = check_shape("embedding forward", tokens, vocab, dim, ptrs, 2);
    if (st == ZT_OK) st = check_rows("embedding forward", vocab, first, rows);
    if (st != ZT_OK || tokens == 0) return st;
    embedding_forward_kernel<<<(unsigned)tokens, THREADS, 0, stream>>>(
        vocab, first, rows, dim, ids, (const bf16 *)table, (bf16 *)y,
        ctx->index_errors + ZT_INDEX_EMBEDDING_FORWARD);
    return zt_cuda_check_launch("embedding forward");
}

zt_status zt_cuda_embedding_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                    int64_t vocab, int64_t dim, const int32_t *ids,
                                    const uint16_t *table, uint16_t *y)
{
    return zt_cuda_embedding_forward_rows(ctx, stream, tokens, vocab, 0, vocab, dim, ids, table, y);
}

/* keys[t] = ids[t] - first (an out-of-range id, or one outside the rows, becomes `rows`, which
 * sorts last and is skipped); positions[t] = t. */
__global__ void prepare_sort_kernel(int64_t tokens, int64_t vocab, int64_t first, int64_t rows,
                                    const int32_t *ids, int32_t *keys, int32_t *positions,
                                    unsigned long long *bad)
{
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < tokens;
         t += (int64_t)gridDim.x * blockDim.x) {
        int32_t id = ids[t];
        int64_t key = (int64_t)id - first;
        if (id < 0 || id >= vocab) zt_record_bad_index(bad, t, id);
        if (id < 0 || id >= vocab || key < 0 || key >= rows) key = rows;
        keys[t] = (int32_t)key;
        positions[t] = (int32_t)t;
    }
}

/* Block (p, column slice): when sorted position p starts a run of equal ids, sums that run. */
template <typename T>
__global__ void accumulate_runs_kernel(int64_t tokens, int64_t vocab, int64_t dim,
                                       const int32_t *sorted_ids, const int32_t *sorted_positions,
                                       const T *dy, float *dtable)
{
    int64_t p = blockIdx.x;
    int32_t id = sorted_ids[p];
    if (id >= vocab || (p > 0 && sorted_ids[p - 1] == id)) return;
    int64_t col = (int64_t)blockIdx.y * COLUMNS_PER_BLOCK + threadIdx.x * 8;
    if (col >= dim) return;
    float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t q = p; q < tokens && sorted_ids[q] == id; q++) {
        float v[8];
        zt_load8(dy + (int64_t)sorted_positions[q] * dim + col, v);
#pragma unroll
        for (int i = 0; i < 8; i++) sum[i] += v[i];
    }
    float4 *row = reinterpret_cast<float4 *>(dtable + (int64_t)id * dim + col);
    float4 a = row[0], b = row[1];
    row[0] = make_float4(a.x + sum[0], a.y + sum[1], a.z + sum[2], a.w + sum[3]);
    row[1] = make_float4(b.x + sum[4], b.y + sum[5], b.z + sum[6], b.w + sum[7]);
}

/* Bits the sort must look at: ids and the `vocab` sentinel are in [0, vocab]. */
static int key_bits(int64_t vocab)
{
    int bits = 1;
    while (bits < 31 && (1ll << bits) <= vocab) bits++;
    return bits;
}

static size_t sort_temp_bytes(int64_t tokens, int64_t vocab)
{
    size_t bytes = 0;
    cub::DoubleBuffer<int32_t> keys(NULL, NULL), values(NULL, NULL);
    cub::DeviceRadixSort::SortPairs(NULL, bytes, keys, values, (int)tokens, 0, key_bits(vocab));
    return bytes;
}

uint64_t zt_cuda_embedding_backward_scratch_bytes(int64_t tokens, int64_t vocab)
{
    uint64_t buffer = zt_round_up((uint64_t)tokens * sizeof(int32_t), 256);
    return 4 * buffer + zt_round_up(sort_temp_bytes(tokens, vocab), 256);
}

zt_status zt_cuda_embedding_backward_rows(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                          int64_t vocab, int64_t first, int64_t rows, int64_t dim,
                                          const int32_t *ids, const uint16_t *dy, float *dtable)
{
    const void *ptrs[] = {dy, dtable};
    zt_status st = check_shape("embedding backward", tokens, vocab, dim, ptrs, 2);
    if (st == ZT_OK) st = check_rows("embedding backward", vocab, first, rows);
    if (st != ZT_OK || tokens == 0) return st;
    char *scratch = (char *)zt_cuda_scratch(
        ctx, zt_cuda_embedding_backward_scratch_bytes(tokens, rows), "embedding backward");
    if (!scratch) return ZT_ERR_BUFFER_TOO_SMALL;
    uint64_t buffer = zt_round_up((uint64_t)tokens * sizeof(int32_t), 256);
    int32_t *keys_a = (int32_t *)scratch, *keys_b = (int32_t *)(scratch + buffer);
    int32_t *pos_a = (int32_t *)(scratch + 2 * buffer), *pos_b = (int32_t *)(scratch + 3 * buffer);
    void *temp = scratch + 4 * buffer;
    size_t temp_bytes = sort_temp_bytes(tokens, rows);

    prepare_sort_kernel<<<zt_grid_for(tokens, 256, ctx), 256, 0, stream>>>(
        tokens, vocab, first, rows, ids, keys_a, pos_a, ctx->index_errors + ZT_INDEX_EMBEDDING_BACKWARD);
    if ((st = zt_cuda_check_launch("embedding backward (sort keys)")) != ZT_OK) return st;
    cub::DoubleBuffer<int32_t> keys(keys_a, keys_b), positions(pos_a, pos_b);
    cudaError_t e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, positions, (int)tokens,
                                                    0, key_bits(rows), stream);
    if (e != cudaSuccess)
        return zt_cuda_fail(ZT_ERR_DEVICE, "embedding backward: sorting token ids failed: %s",
                            cudaGetErrorString(e));
    dim3 grid((unsigned)tokens, (unsigned)((dim + COLUMNS_PER_BLOCK - 1) / COLUMNS_PER_BLOCK));
    ZT_DISPATCH16(ctx->dtype, T,
                  accumulate_runs_kernel<T><<<grid, THREADS, 0, stream>>>(tokens, rows, dim, keys.Current(),
                                                                          positions.Current(), (const T *)dy,
                                                                          dtable));
    return zt_cuda_check_launch("embedding backward");
}

zt_status zt_cuda_embedding_backward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t tokens,
                                     int64_t vocab, int64_t dim, const int32_t *ids,
                                     const uint16_t *dy, float *dtable)
{
    return zt_cuda_embedding_backward_rows(ctx, stream, tokens, vocab, 0, vocab, dim, ids, dy, dtable);
}
