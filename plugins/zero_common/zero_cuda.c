/* The GPU side of the zero plugins: zero_cuda.h. */
#include "zero_cuda.h"

#include <stdlib.h>

#include "../cuda_plugin.h"

struct zero_cuda {
    zt_cuda_ctx *ctx;
    float *norm; /* one device float: the global norm */
};

static zt_status cuda_call_failed(const zt_host *h, cudaError_t e, const char *what)
{
    h->error(h->ctx, ZT_ERR_DEVICE, "zero0: %s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return ZT_ERR_DEVICE;
}

zt_status zero_cuda_create(const zt_host *h, int64_t n_tensors, const int64_t *sizes, zero_cuda **out)
{
    *out = NULL;
    zero_cuda *g = calloc(1, sizeof *g);
    if (!g) {
        h->error(h->ctx, ZT_ERR_OUT_OF_MEMORY, "zero0: out of host memory for its CUDA state");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    zt_status st = zt_plugin_cuda_ctx(h, "zero0", zt_cuda_global_norm_scratch_bytes(n_tensors, sizes), &g->ctx);
    if (st == ZT_OK &&
        !(g->norm = h->alloc(h->ctx, ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, sizeof(float), 0, "zero0 gradient norm")))
        st = ZT_ERR_OUT_OF_MEMORY;
    if (st != ZT_OK) {
        zero_cuda_destroy(h, g);
        return st;
    }
    *out = g;
    return ZT_OK;
}

void zero_cuda_destroy(const zt_host *h, zero_cuda *g)
{
    if (!g) return;
    h->free(h->ctx, g->norm);
    zt_cuda_ctx_destroy(g->ctx);
    free(g);
}

zt_status zero_cuda_zero(const zt_host *h, void *dst, uint64_t bytes)
{
    cudaError_t e = cudaMemsetAsync(dst, 0, (size_t)bytes, zt_plugin_stream(h));
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, e, "cudaMemsetAsync");
}

zt_status zero_cuda_copy(const zt_host *h, void *dst, const void *src, uint64_t bytes)
{
    cudaStream_t stream = zt_plugin_stream(h);
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    return e == cudaSuccess ? ZT_OK : cuda_call_failed(h, e, "copying a shard between host and GPU");
}

zt_status zero_cuda_global_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                                const int64_t *sizes, double *norm)
{
    cudaStream_t stream = zt_plugin_stream(h);
    zt_status st = zt_cuda_global_norm(g->ctx, stream, n, tensors, sizes, 0.0f, g->norm, NULL);
    if (st != ZT_OK) return zt_plugin_cuda_failed(h, st, "zero0: the gradient norm");
    float value = 0;
    cudaError_t e = cudaMemcpyAsync(&value, g->norm, sizeof value, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return cuda_call_failed(h, e, "reading the gradient norm");
    *norm = value;
    return ZT_OK;
}

zt_status zero_cuda_refresh(const zt_host *h, zero_cuda *g, const float *master, uint16_t *copy, int64_t n)
{
    zt_status st = zt_cuda_cast_f32_to_bf16(g->ctx, zt_plugin_stream(h), n, master, copy);
    return st == ZT_OK ? ZT_OK : zt_plugin_cuda_failed(h, st, "zero0: refreshing the bf16 copy of the weights");
}
