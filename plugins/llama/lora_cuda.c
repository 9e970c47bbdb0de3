/* LoRA on the CUDA path (lora.c chose the linears; layers.c is the CPU path, step for step): for each
 * adapted linear y = x W^T + scaling * dropout(x) A^T B^T, as the CPU computes it, on cuBLASLt GEMMs.
 *
 * Where the adapter's GEMMs go: after the frozen linear's own GEMM, two thin ones (rank r) per linear:
 *   u = scaling * dropout(x) A^T   [N, r]: the scaling is the GEMM's alpha (no pass over u)
 *   y += u B^T                     beta = 1 into the base output, its column block of the fused q|k|v or
 *                                  gate|up array, or the o/down_proj output that already holds the
 *                                  residual: no [N, out] temporary and no add kernel
 * and in the backward, before (dB, du, dA) and after (dx) the base linear's input gradient:
 *   dB += dy^T u (fp32)   du = scaling * dy B (alpha)   dA += du^T dropout(x) (fp32)
 *   dx += du A            beta = 1 onto the base's dx (with dropout: into a scratch, then masked and
 *                         added by the dropout kernel)
 * Fusing A into the frozen GEMM (x [W; A]^T) would save one read of x per linear but needs W and A
 * adjacent in memory, which the frozen region and the trainable one are not (zero's layout); each
 * thin GEMM has r / out (or r / in) of the base GEMM's flops and is bound by reading its [N, in] or
 * [N, out] operand once. u (bf16, [N, r] per linear) is saved with the layer's activations; down_proj's
 * is recomputed in the backward from the SwiGLU output, as on the CPU.
 */
#include <stdio.h>
#include <string.h>

#include "llama_cuda.h"

static const uint16_t *param16(const gpu_run *r, int i)
{
    return r->call.c->params[i].data;
}

static float *grad32(const gpu_run *r, int i)
{
    return r->call.c->grads ? r->call.c->grads[i].data : NULL;
}

int gpu_lora_slot(const gpu_run *r, int k)
{
    const llama_lora *l = &r->call.s->lora;
    return l->r > 0 ? l->slot[(r->call.c->unit - 1) * LLAMA_LINEARS + k] : -1;
}

static int dropping(const gpu_run *r)
{
    return r->call.s->lora.r > 0 && r->call.s->lora.dropout > 0 && (r->call.c->flags & ZT_UNIT_TRAIN);
}

zt_status gpu_lora_begin(const gpu_run *r, gpu_lora *l)
{
    memset(l, 0, sizeof *l);
    if (!dropping(r)) return ZT_OK;
    llama_state *s = r->call.s;
    const llama_config *c = &s->cfg;
    int64_t widest = c->hidden, Q = c->heads * c->head_dim;
    if (Q > widest) widest = Q;
    if (c->intermediate > widest) widest = c->intermediate;
    /* the chain values first (8-byte aligned), then the [N, widest] scratch at a 256-byte boundary */
    uint64_t bytes = 256 + (uint64_t)(r->call.tokens * widest) * 2;
    char tag[64];
    snprintf(tag, sizeof tag, "%s LoRA dropout scratch", r->call.name);
    l->block = s->host->alloc(s->host->ctx, ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, bytes, 0, tag);
    if (!l->block) return ZT_ERR_OUT_OF_MEMORY;
    l->hash = l->block;
    l->drop = (uint16_t *)((char *)l->block + 256);
    uint64_t starts[LLAMA_LINEARS];
    for (int k = 0; k < LLAMA_LINEARS; k++) starts[k] = llama_lora_mask_start(&s->lora, r->call.c->unit, k);
    zt_status st = zt_cuda_lora_dropout_hash(s->gpu->ctx, r->stream, r->call.tokens, r->call.c->batch->tokens,
                                             r->call.c->batch->positions, LLAMA_LINEARS, starts, l->hash);
    if (st != ZT_OK) {
        gpu_lora_end(r, l);
        return zt_plugin_cuda_failed(s->host, st, "LoRA dropout masks");
    }
    return ZT_OK;
}

void gpu_lora_end(const gpu_run *r, gpu_lora *l)
{
    if (l->block) r->call.s->host->free(r->call.s->host->ctx, l->block);
    memset(l, 0, sizeof *l);
}

/* x, or dropout(x) in l->drop with linear k's mask. */
static zt_status lora_input(const gpu_run *r, const gpu_lora *l, int k, int64_t in, const uint16_t *x,
                            const uint16_t **xd)
{
    *xd = x;
    if (!l->hash) return ZT_OK;
    *xd = l->drop;
    return zt_cuda_lora_dropout(r->call.s->gpu->ctx, r->stream, r->call.tokens * in, x, l->drop, l->hash + k,
                                r->call.s->lora.dropout, 0);
}

zt_status gpu_lora_project(const gpu_run *r, const gpu_lora *l, int k, int64_t in, const uint16_t *x, uint16_t *u)
{
    int a = gpu_lora_slot(r, k);
    if (a < 0) return ZT_OK;
    int64_t N = r->call.tokens, R = r->call.s->lora.r;
    const uint16_t *xd;
    zt_status st = lora_input(r, l, k, in, x, &xd);
    if (st != ZT_OK) return st;
    return zt_cuda_gemm_scaled(r->call.s->gpu->ctx, r->stream, 0, 1, N, R, in, r->call.s->lora.scaling, xd, in,
                               param16(r, a), in, u, ZT_BF16, R, 0);
}

zt_status gpu_lora_forward(const gpu_run *r, const gpu_lora *l, int k, int64_t in, int64_t out, const uint16_t *x,
                           uint16_t *u, uint16_t *y, int64_t ldy)
{
    int a = gpu_lora_slot(r, k);
    if (a < 0) return ZT_OK;
    zt_status st = gpu_lora_project(r, l, k, in, x, u);
    if (st != ZT_OK) return st;
    int64_t R = r->call.s->lora.r;
    return zt_cuda_gemm(r->call.s->gpu->ctx, r->stream, 0, 1, r->call.tokens, out, R, u, R, param16(r, a + 1), R, y,
                        ZT_BF16, ldy, 1);
}

zt_status gpu_lora_backward_weights(const gpu_run *r, const gpu_lora *l, int k, int64_t in, int64_t out,
                                    const uint16_t *x, const uint16_t *u, const uint16_t *dy, int64_t lddy,
                                    uint16_t *du)
{
    int a = gpu_lora_slot(r, k);
    if (a < 0) return ZT_OK;
    zt_cuda_ctx *ctx = r->call.s->gpu->ctx;
    int64_t N = r->call.tokens, R = r->call.s->lora.r;
    float *gA = grad32(r, a), *gB = grad32(r, a + 1);
    zt_status st = ZT_OK;
    if (gB) st = zt_cuda_gemm(ctx, r->stream, 1, 0, out, R, N, dy, lddy, u, R, gB, ZT_F32, R, 1);
    if (st == ZT_OK)
        st = zt_cuda_gemm_scaled(ctx, r->stream, 0, 0, N, R, out, r->call.s->lora.scaling, dy, lddy, param16(r, a + 1),
                                 R, du, ZT_BF16, R, 0);
    if (st != ZT_OK || !gA) return st;
    const uint16_t *xd;
    if ((st = lora_input(r, l, k, in, x, &xd)) != ZT_OK) return st;
    return zt_cuda_gemm(ctx, r->stream, 1, 0, R, in, N, du, R, xd, in, gA, ZT_F32, in, 1);
}

zt_status gpu_lora_backward_input(const gpu_run *r, const gpu_lora *l, int k, int64_t in, const uint16_t *du,
                                  uint16_t *dx)
{
    int a = gpu_lora_slot(r, k);
    if (a < 0) return ZT_OK;
    zt_cuda_ctx *ctx = r->call.s->gpu->ctx;
    int64_t N = r->call.tokens, R = r->call.s->lora.r;
    if (!l->hash) return zt_cuda_gemm(ctx, r->stream, 0, 0, N, in, R, du, R, param16(r, a), in, dx, ZT_BF16, in, 1);
    zt_status st = zt_cuda_gemm(ctx, r->stream, 0, 0, N, in, R, du, R, param16(r, a), in, l->drop, ZT_BF16, in, 0);
    if (st != ZT_OK) return st;
    return zt_cuda_lora_dropout(ctx, r->stream, N * in, l->drop, dx, l->hash + k, r->call.s->lora.dropout, 1);
}
