/* Which flash attention kernels run: the mma.sync kernels (flash_forward.cu, flash_backward.cu, sm_80
 * and newer) or the Hopper wgmma kernels (flash_*_sm90.cu, sm_90a builds on compute capability 9.0).
 * zt_cuda_flash_attention_forward and _backward take the choice from the environment:
 * ZT_FLASH_KERNEL=auto|mma|wgmma for both (unset = auto: wgmma where it can run, else mma), and
 * ZT_FLASH_BACKWARD_KERNEL, when set, for the backward alone (auto there: wgmma-ws, the
 * warp-specialized Hopper backward, where wgmma can run). Either forward's o and lse feed either
 * backward. The flash plugin and the tests and benchmarks name the kernels explicitly (the _kernel
 * and _tuned functions): the plugin from its options (flash.kernel, flash.backward_kernel), with
 * these variables as debugging overrides. The backward's tuning switches (split, dQ, ring) come from
 * a zt_cuda_flash_backward_tuning; ZT_FLASH_BACKWARD_SPLIT, _DQ and _RING override it at every
 * launch, on every entry point (docs/cuda.md). */
#ifndef ZT_KERNELS_CUDA_FLASH_KERNEL_H
#define ZT_KERNELS_CUDA_FLASH_KERNEL_H

#include "cuda/kernels_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zt_cuda_flash_kernel {
    ZT_CUDA_FLASH_AUTO = 0,
    ZT_CUDA_FLASH_MMA = 1,   /* mma.sync.m16n8k16, sm_80+ */
    ZT_CUDA_FLASH_WGMMA = 2, /* wgmma + 128B-swizzled shared memory, sm_90a */
    /* "wgmma-ws": the backward's warp-specialized FlashAttention-3-style kernel (TMA producer,
     * setmaxnreg, flash_backward_sm90_ws.cu), auto's backward where wgmma can run. As a forward
     * choice it means the wgmma forward. */
    ZT_CUDA_FLASH_WGMMA_WS = 3,
} zt_cuda_flash_kernel;

const char *zt_cuda_flash_kernel_name(zt_cuda_flash_kernel k);
/* 1 where this build holds the sm_90a (wgmma) kernels: 90 was among CMAKE_CUDA_ARCHITECTURES. */
int zt_cuda_flash_wgmma_built(void);
/* "auto", "mma", "wgmma" or "wgmma-ws"; NULL or "" is auto. ZT_ERR_INVALID_ARG (message recorded) otherwise. */
zt_status zt_cuda_flash_kernel_parse(const char *text, zt_cuda_flash_kernel *out);
/* The choice of the ZT_FLASH_KERNEL environment variable (the forward's; the backward's unless
 * ZT_FLASH_BACKWARD_KERNEL is set). */
zt_status zt_cuda_flash_kernel_from_env(zt_cuda_flash_kernel *out);
zt_status zt_cuda_flash_backward_kernel_from_env(zt_cuda_flash_kernel *out);
/* The kernel `want` runs as on ctx's GPU for shape s: auto becomes wgmma or mma; wgmma where it
 * cannot run (no sm_90a code in this build, or not a compute capability 9.0 GPU) is
 * ZT_ERR_UNSUPPORTED with the reason recorded. */
zt_status zt_cuda_flash_kernel_resolve(zt_cuda_ctx *ctx, const zt_cuda_attention_shape *s,
                                       zt_cuda_flash_kernel want, zt_cuda_flash_kernel *got);
/* zt_cuda_flash_attention_forward on a named kernel (auto resolves as above). */
zt_status zt_cuda_flash_attention_forward_kernel(zt_cuda_ctx *ctx, cudaStream_t stream,
                                                 const zt_cuda_attention_shape *s,
                                                 zt_cuda_flash_kernel kernel, const uint16_t *q,
                                                 const uint16_t *k, const uint16_t *v,
                                                 const int32_t *doc_ids, uint16_t *o, float *lse);
/* The backward's tuning switches: the flash plugin's options flash.backward_split, _dq, _ring. NULL
 * where one is taken means {0, 1, 1}. At every launch ZT_FLASH_BACKWARD_SPLIT, ZT_FLASH_BACKWARD_DQ
 * and ZT_FLASH_BACKWARD_RING, when set, override their field (debugging and measurements). */
typedef struct zt_cuda_flash_backward_tuning {
    int32_t split;   /* wgmma and wgmma-ws: thread blocks a GQA group is split over per key tile;
                        0 (or less): from the shape; else a divisor of heads / kv_heads */
    int32_t dq_bulk; /* wgmma: 1 adds dQ with TMA bulk reduce-adds (the default), 0 with atomics;
                        wgmma-ws always adds in bulk, mma with atomics */
    int32_t ring;    /* wgmma at head dim 64 with bulk dQ: 1 the warpgroups' mbarrier ring (the
                        default), 0 a block barrier per query tile */
} zt_cuda_flash_backward_tuning;
/* zt_cuda_flash_attention_backward_scratch_bytes for a backward run with tuning t (its split). */
uint64_t zt_cuda_flash_attention_backward_scratch_bytes_tuned(const zt_cuda_attention_shape *s,
                                                              const zt_cuda_flash_backward_tuning *t);
/* zt_cuda_flash_attention_backward on a named kernel with tuning t; size the context's scratch with
 * zt_cuda_flash_attention_backward_scratch_bytes_tuned(s, t). */
zt_status zt_cuda_flash_attention_backward_tuned(zt_cuda_ctx *ctx, cudaStream_t stream,
                                                 const zt_cuda_attention_shape *s, zt_cuda_flash_kernel kernel,
                                                 const zt_cuda_flash_backward_tuning *t, const uint16_t *q,
                                                 const uint16_t *k, const uint16_t *v, const int32_t *doc_ids,
                                                 const uint16_t *o, const float *lse, const uint16_t *dout,
                                                 uint16_t *dq, uint16_t *dk, uint16_t *dv);
/* zt_cuda_flash_attention_backward on a named kernel (the default tuning, NULL). */
zt_status zt_cuda_flash_attention_backward_kernel(zt_cuda_ctx *ctx, cudaStream_t stream,
                                                  const zt_cuda_attention_shape *s,
                                                  zt_cuda_flash_kernel kernel, const uint16_t *q,
                                                  const uint16_t *k, const uint16_t *v,
                                                  const int32_t *doc_ids, const uint16_t *o,
                                                  const float *lse, const uint16_t *dout, uint16_t *dq,
                                                  uint16_t *dk, uint16_t *dv);

#ifdef __cplusplus
}

/* Internal, between flash_forward.cu and flash_forward_sm90.cu. */
struct flash_params;
zt_status zt_flash_forward_wgmma(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params *p,
                                 int head_dim);
/* The backward's main kernel only (flash_backward.cu runs delta before and the dQ conversion after);
 * launch = 0 only checks and raises its shared-memory limit, enqueueing nothing. */
zt_status zt_flash_backward_wgmma(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params *p,
                                  int head_dim, int launch);
/* The same for the warp-specialized kernel (flash_backward_sm90_ws.cu): head_dim 128 only, the bulk
 * dQ layout (p->bwd_dq_bulk must be 1). */
zt_status zt_flash_backward_wgmma_ws(zt_cuda_ctx *ctx, cudaStream_t stream, const flash_params *p,
                                     int head_dim, int launch);
#endif

#endif
