/* Multi-tensor AdamW and the global gradient norm.
 *
 * Both walk many tensors in few launches: the host cuts every tensor into chunks of CHUNK elements
 * and packs (tensor pointers, block -> chunk map) into a kernel argument of a few KiB; one block
 * handles one chunk. AdamW follows torch.optim.AdamW (decoupled weight decay) in the same
 * operation order as the CPU kernel, and writes the bf16 compute copy in the same pass. The norm is
 * reduced in double: per-chunk partial sums, then one block adds them in chunk order, so the result
 * is deterministic; the clipping factor is derived on the device, so clipping never waits for the
 * host.
 */
#include <math.h>
#include "cuda/common.cuh"

enum { CHUNK = 65536, THREADS = 512, MAX_TENSORS = 36, MAX_BLOCKS = 320 };

/* ---- batching of tensors into launches ------------------------------------------------------- */

struct tensor_batch {
    int n_tensors, n_blocks;
    int64_t size[MAX_TENSORS];
    uint8_t block_tensor[MAX_BLOCKS];
    int32_t block_chunk[MAX_BLOCKS];
};

static int64_t chunks_of(int64_t n) { return (n + CHUNK - 1) / CHUNK; }

/* Calls launch(batch, first_global_block) for successive batches covering all chunks of all
 * tensors; tensor_index[i] maps a batch slot back to the caller's tensor. Stops at the first error. */
template <typename Launch>
static zt_status for_each_batch(int64_t n_tensors, const int64_t *sizes, Launch launch)
{
    tensor_batch batch;
    int tensor_index[MAX_TENSORS];
    batch.n_tensors = batch.n_blocks = 0;
    int64_t global_block = 0, batch_first_block = 0;
    for (int64_t t = 0; t < n_tensors; t++) {
        int64_t chunks = chunks_of(sizes[t]);
        for (int64_t c = 0; c < chunks; c++) {
            if (batch.n_blocks == MAX_BLOCKS ||
                (c == 0 && batch.n_tensors == MAX_TENSORS)) {
                zt_status st = launch(batch, tensor_index, batch_first_block);
                if (st != ZT_OK) return st;
                batch.n_tensors = batch.n_blocks = 0;
                batch_first_block = global_block;
            }
            /* a tensor continued from the previous batch gets a new slot */
            if (c == 0 || batch.n_tensors == 0) {
                tensor_index[batch.n_tensors] = (int)t;
                batch.size[batch.n_tensors] = sizes[t];
                batch.n_tensors++;
            }
            batch.block_tensor[batch.n_blocks] = (uint8_t)(batch.n_tensors - 1);
            batch.block_chunk[batch.n_blocks] = (int32_t)c;
            batch.n_blocks++;
            global_block++;
        }
    }
    if (batch.n_blocks > 0) return launch(batch, tensor_index, batch_first_block);
    return ZT_OK;
}

/* ---- AdamW ----------------------------------------------------------------------------------- */

struct adamw_hyper {
    float decay;         /* 1 - lr * weight_decay */
    float one_minus_beta1, beta2, one_minus_beta2;
    float bias2_sqrt;    /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step_size; /* -lr / (1 - beta1^step) */
};

struct adamw_args {
    tensor_batch batch;
    float *master[MAX_TENSORS], *exp_avg[MAX_TENSORS], *exp_avg_sq[MAX_TENSORS];
    const float *grad[MAX_TENSORS];
    uint16_t *copy[MAX_TENSORS]; /* the 16-bit type the kernel is instantiated for */
};

template <typename T>
__global__ void __launch_bounds__(THREADS)
adamw_kernel(const __grid_constant__ adamw_args a, adamw_hyper h, const float *grad_scale)
{
    int t = a.batch.block_tensor[blockIdx.x];
    int64_t begin = (int64_t)a.batch.block_chunk[blockIdx.x] * CHUNK;
    int64_t end = begin + CHUNK < a.batch.size[t] ? begin + CHUNK : a.batch.size[t];
    float *p = a.master[t], *m = a.exp_avg[t], *v = a.exp_avg_sq[t];
    const float *g = a.grad[t];
    T *copy = (T *)a.copy[t];
    float gscale = grad_scale ? *grad_scale : 1.0f;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        float gi = g[i] * gscale;
        float pi = p[i] * h.decay;
        float mi = m[i] + h.one_minus_beta1 * (gi - m[i]); /* torch: exp_avg.lerp_(grad, 1 - beta1) */
        float vi = v[i] * h.beta2 + h.one_minus_beta2 * gi * gi;
        float denom = sqrtf(vi) / h.bias2_sqrt + h.eps;
        pi += h.neg_step_size * mi / denom;
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (copy) copy[i] = zt_from_f32<T>(pi);
    }
}

zt_status zt_cuda_adamw_step(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n_params,
                             const zt_cuda_param *params, const zt_cuda_adamw_params *hp,
                             const float *grad_scale)
{
    int32_t dtype = zt_cuda_ctx_dtype(ctx); /* of the compute copies */
    if (hp->step < 1)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "AdamW: step %lld must start at 1",
                            (long long)hp->step);
    int64_t sizes_stack[64];
    int64_t *sizes = n_params <= 64 ? sizes_stack : (int64_t *)malloc(sizeof(int64_t) * n_params);
    if (!sizes) return zt_cuda_fail(ZT_ERR_OUT_OF_MEMORY, "AdamW: out of host memory");
    for (int64_t i = 0; i < n_params; i++) sizes[i] = params[i].n > 0 ? params[i].n : 0;
    double step = (double)hp->step;
    adamw_hyper h;
    h.decay = (float)(1.0 - hp->lr * hp->weight_decay);
    h.one_minus_beta1 = (float)(1.0 - hp->beta1);
    h.beta2 = (float)hp->beta2;
    h.one_minus_beta2 = (float)(1.0 - hp->beta2);
    h.bias2_sqrt = (float)sqrt(1.0 - pow(hp->beta2, step));
    h.eps = (float)hp->eps;
    h.neg_step_size = (float)(-(hp->lr / (1.0 - pow(hp->beta1, step))));
    zt_status st = for_each_batch(n_params, sizes, [&](const tensor_batch &batch,
                                                       const int *tensor_index, int64_t) {
        adamw_args a;
        a.batch = batch;
        for (int i = 0; i < batch.n_tensors; i++) {
            const zt_cuda_param *p = &params[tensor_index[i]];
            a.master[i] = p->master;
            a.exp_avg[i] = p->exp_avg;
            a.exp_avg_sq[i] = p->exp_avg_sq;
            a.grad[i] = p->grad;
            a.copy[i] = p->compute_copy;
        }
        ZT_DISPATCH16(dtype, T, adamw_kernel<T><<<batch.n_blocks, THREADS, 0, stream>>>(a, h, grad_scale));
        return zt_cuda_check_launch("AdamW step");
    });
    if (sizes != sizes_stack) free(sizes);
    return st;
}

/* ---- global norm ----------------------------------------------------------------------------- */

struct norm_args {
    tensor_batch batch;
    const float *tensor[MAX_TENSORS];
};

/* Sum of squares of a THREADS-sized block's values in double, in a fixed tree order. */
__device__ double block_sum_double(double x)
{
    __shared__ double partial[THREADS];
    partial[threadIdx.x] = x;
    __syncthreads();
    for (int width = THREADS / 2; width > 0; width /= 2) {
        if ((int)threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
        __syncthreads();
    }
    return partial[0];
}

__global__ void __launch_bounds__(THREADS)
sum_squares_kernel(const __grid_constant__ norm_args a, int64_t first_block, double *partials)
{
    int t = a.batch.block_tensor[blockIdx.x];
    int64_t begin = (int64_t)a.batch.block_chunk[blockIdx.x] * CHUNK;
    int64_t end = begin + CHUNK < a.batch.size[t] ? begin + CHUNK : a.batch.size[t];
    const float *x = a.tensor[t];
    double sum = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) sum += (double)x[i] * x[i];
    sum = block_sum_double(sum);
    if (threadIdx.x == 0) partials[first_block + blockIdx.x] = sum;
}

__global__ void __launch_bounds__(THREADS)
finish_norm_kernel(int64_t n_partials, const double *partials, float max_norm, float *norm,
                   float *clip_coef)
{
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n_partials; i += blockDim.x) sum += partials[i];
    sum = block_sum_double(sum);
    if (threadIdx.x == 0) {
        float total = (float)sqrt(sum);
        *norm = total;
        if (clip_coef) *clip_coef = fminf(1.0f, max_norm / (total + 1e-6f));
    }
}

static int64_t total_chunks(int64_t n_tensors, const int64_t *sizes)
{
    int64_t chunks = 0;
    for (int64_t t = 0; t < n_tensors; t++) chunks += chunks_of(sizes[t] > 0 ? sizes[t] : 0);
    return chunks;
}

uint64_t zt_cuda_global_norm_scratch_bytes(int64_t n_tensors, const int64_t *sizes)
{
    return (uint64_t)total_chunks(n_tensors, sizes) * sizeof(double);
}

zt_status zt_cuda_global_norm(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n_tensors,
                              const float *const *tensors, const int64_t *sizes, float max_norm,
                              float *norm, float *clip_coef)
{
    for (int64_t t = 0; t < n_tensors; t++)
        if (sizes[t] < 0)
            return zt_cuda_fail(ZT_ERR_INVALID_ARG, "global norm: tensor %lld has negative size %lld",
                                (long long)t, (long long)sizes[t]);
    if (clip_coef && !(max_norm > 0.0f))
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "global norm: max_norm %g must be positive (gradient_clipping)",
                            (double)max_norm);
    double *partials = (double *)zt_cuda_scratch(
        ctx, zt_cuda_global_norm_scratch_bytes(n_tensors, sizes), "global gradient norm");
    if (!partials) return ZT_ERR_BUFFER_TOO_SMALL;
    zt_status st = for_each_batch(n_tensors, sizes, [&](const tensor_batch &batch,
                                                        const int *tensor_index,
                                                        int64_t first_block) {
        norm_args a;
        a.batch = batch;
        for (int i = 0; i < batch.n_tensors; i++) a.tensor[i] = tensors[tensor_index[i]];
        sum_squares_kernel<<<batch.n_blocks, THREADS, 0, stream>>>(a, first_block, partials);
        return zt_cuda_check_launch("global gradient norm");
    });
    if (st != ZT_OK) return st;
    finish_norm_kernel<<<1, THREADS, 0, stream>>>(total_chunks(n_tensors, sizes), partials,
                                                  max_norm, norm, clip_coef);
    return zt_cuda_check_launch("global gradient norm (final sum)");
}

/* ---- gradient accumulation ------------------------------------------------------------------- */

__global__ void add_f32_kernel(int64_t n, const float *x, float *y)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

zt_status zt_cuda_add_f32(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t n, const float *x, float *y)
{
    (void)ctx;
    if (n < 0) return zt_cuda_fail(ZT_ERR_INVALID_ARG, "add_f32: negative size %lld", (long long)n);
    if (n == 0) return ZT_OK;
    int64_t blocks = (n + THREADS - 1) / THREADS;
    if (blocks > 65535) blocks = 65535;
    add_f32_kernel<<<(unsigned)blocks, THREADS, 0, stream>>>(n, x, y);
    return zt_cuda_check_launch("fp32 gradient accumulation");
}
