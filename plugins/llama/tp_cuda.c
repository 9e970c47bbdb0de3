/* Tensor parallelism on the CUDA path (tp.c's split, layers_cuda.c's units): the widths of this
 * rank's shards, and the collectives over "tp" on the compute stream, in the run's 16-bit type.
 *
 *   q/k/v, gate/up  column-parallel: this rank's heads' / ffn part's rows; its input gradient is a
 *                   partial sum, all-reduced before the norm's backward (tp_cuda_reduce)
 *   o, down         row-parallel: tp rank 0 adds the residual in the GEMM's epilogue, the others
 *                   write their partial product alone, and the all-reduce of the sum gives every
 *                   rank x + the whole product (one collective, no separate add)
 *   embedding       this rank's vocabulary rows (zeros for the others' tokens), all-reduced
 *   LM head + loss  zt_cuda_lm_head_loss_split: row statistics reduced over "tp", never the logits;
 *                   evaluation's logits all-gathered (tp_cuda_gather_logits)
 *
 * Sequence parallelism and LoRA under tensor parallelism run on CPU ranks only (refused by
 * llama_parallelize on a GPU).
 */
#include <stdio.h>
#include <string.h>

#include "llama_cuda.h"

void tp_cuda_widths(const llama_state *s, int64_t *Q, int64_t *KV, int64_t *F)
{
    int64_t D = s->cfg.head_dim;
    *Q = s->tp.heads * D;
    *KV = s->tp.kv_heads * D;
    *F = s->tp.ffn;
}

static zt_status collective_failed(const gpu_run *r, zt_status st, const char *op, const char *what)
{
    r->call.s->host->error(r->call.s->host->ctx, st, "%s: the tensor-parallel %s of %s over \"tp\" failed (the "
                           "collective's message is above)", r->call.name, op, what);
    return st;
}

zt_status tp_cuda_reduce(const gpu_run *r, uint16_t *buf, int64_t n, const char *what)
{
    const llama_state *s = r->call.s;
    if (s->tp.size == 1 || n == 0) return ZT_OK;
    zt_status st = s->host->all_reduce(s->host->ctx, &s->tp.group, buf, buf, (uint64_t)n, s->compute,
                                       ZT_REDUCE_SUM, r->stream);
    return st == ZT_OK ? ZT_OK : collective_failed(r, st, "all-reduce", what);
}

/* zt_cuda_group_reduce_fn of the vocab-parallel cross-entropy. */
static zt_status reduce_stats(void *user, float *buf, int64_t n, int is_max, cudaStream_t stream)
{
    const gpu_run *r = user;
    const llama_state *s = r->call.s;
    zt_status st = s->host->all_reduce(s->host->ctx, &s->tp.group, buf, buf, (uint64_t)n, ZT_F32,
                                       is_max ? ZT_REDUCE_MAX : ZT_REDUCE_SUM, stream);
    return st == ZT_OK ? ZT_OK
                       : collective_failed(r, st, "all-reduce", is_max ? "the logits' row maxima"
                                                                       : "the logits' sums of exponentials");
}

zt_cuda_vocab_split tp_cuda_vocab_split(const gpu_run *r)
{
    const llama_tp *t = &r->call.s->tp;
    return (zt_cuda_vocab_split){.vocab = r->call.s->cfg.vocab, .first = t->vocab_first, .valid = t->vocab_valid,
                                 .local = t->vocab, .reduce = reduce_stats, .user = (void *)r};
}

zt_status tp_cuda_sum_kv_replicas(const gpu_run *r, uint16_t *dk, uint16_t *dv, int64_t ld)
{
    const llama_state *s = r->call.s;
    const llama_tp *t = &s->tp;
    if (t->kv_replicas == 1) return ZT_OK;
    const zt_host *h = s->host;
    int64_t N = r->call.tokens, D = s->cfg.head_dim, KV = s->cfg.kv_heads * D;
    uint64_t bytes = (uint64_t)(2 * N * KV) * 2;
    /* each rank's dk and dv in its head's columns of a zeroed [2, N, kv_heads * D], summed over "tp":
     * the ranks sharing a head add up, the others add zero (as tp.c) */
    uint16_t *all = h->alloc(h->ctx, ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, bytes, 0, "replicated key/value gradients");
    if (!all) return ZT_ERR_OUT_OF_MEMORY;
    size_t pitch = (size_t)KV * 2, row = (size_t)D * 2, src_pitch = (size_t)ld * 2;
    uint16_t *col = all + t->kv_first * D;
    cudaError_t e = cudaMemsetAsync(all, 0, bytes, r->stream);
    if (e == cudaSuccess)
        e = cudaMemcpy2DAsync(col, pitch, dk, src_pitch, row, (size_t)N, cudaMemcpyDeviceToDevice, r->stream);
    if (e == cudaSuccess)
        e = cudaMemcpy2DAsync(col + N * KV, pitch, dv, src_pitch, row, (size_t)N, cudaMemcpyDeviceToDevice, r->stream);
    zt_status st = e == cudaSuccess ? tp_cuda_reduce(r, all, 2 * N * KV, "the replicated key/value gradients")
                                    : ZT_ERR_DEVICE;
    if (st == ZT_OK) {
        e = cudaMemcpy2DAsync(dk, src_pitch, col, pitch, row, (size_t)N, cudaMemcpyDeviceToDevice, r->stream);
        if (e == cudaSuccess)
            e = cudaMemcpy2DAsync(dv, src_pitch, col + N * KV, pitch, row, (size_t)N, cudaMemcpyDeviceToDevice,
                                  r->stream);
        if (e != cudaSuccess) st = ZT_ERR_DEVICE;
    }
    if (e != cudaSuccess)
        h->error(h->ctx, ZT_ERR_DEVICE, "%s: copying the replicated key/value gradients failed: %s", r->call.name,
                 cudaGetErrorString(e));
    h->free(h->ctx, all);
    return st;
}

zt_status tp_cuda_gather_logits(const gpu_run *r, const uint16_t *norm, const uint16_t *w, void *out, int32_t dtype)
{
    const llama_state *s = r->call.s;
    const llama_tp *t = &s->tp;
    const zt_host *h = s->host;
    int64_t N = r->call.tokens, H = s->cfg.hidden, V = t->vocab, full = s->cfg.vocab;
    uint64_t elem = dtype == ZT_F32 ? 4 : 2, part = (uint64_t)(N * V) * elem;
    /* this rank's [N, V] (its padding columns unwritten, never copied), then every rank's */
    char *local = h->alloc(h->ctx, ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, part * (uint64_t)(t->size + 1), 0,
                           "tensor-parallel logits");
    if (!local) return ZT_ERR_OUT_OF_MEMORY;
    char *all = local + part;
    zt_status st = t->vocab_valid ? zt_cuda_gemm(s->gpu->ctx, r->stream, 0, 1, N, t->vocab_valid, H, norm, H, w, H,
                                                 local, dtype, V, 0)
                                  : ZT_OK;
    if (st != ZT_OK) {
        h->free(h->ctx, local);
        return zt_plugin_cuda_failed(h, st, "the LM head's logits of this tensor-parallel rank");
    }
    st = h->all_gather(h->ctx, &t->group, local, all, (uint64_t)(N * V), dtype, r->stream);
    if (st != ZT_OK) {
        h->free(h->ctx, local);
        return collective_failed(r, st, "all-gather", "the logits");
    }
    cudaError_t e = cudaSuccess;
    for (int32_t k = 0; k < t->size && e == cudaSuccess; k++) {
        int64_t first = k * V, cols = full - first < V ? full - first : V;
        if (cols <= 0) break;
        e = cudaMemcpy2DAsync((char *)out + (uint64_t)first * elem, (size_t)(full * elem),
                              all + (uint64_t)k * part, (size_t)(V * elem), (size_t)(cols * elem), (size_t)N,
                              cudaMemcpyDeviceToDevice, r->stream);
    }
    h->free(h->ctx, local);
    if (e == cudaSuccess) return ZT_OK;
    h->error(h->ctx, ZT_ERR_DEVICE, "%s: placing the gathered logits failed: %s", r->call.name, cudaGetErrorString(e));
    return ZT_ERR_DEVICE;
}
