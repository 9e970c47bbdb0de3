/* The flash plugin's exact attention for head sizes the flash kernels do not take (exact.cu). Same
 * layouts as kernels/cuda's flash attention: q, o, dout, dq [B,T,H,D], k, v, dk, dv [B,T,Hkv,D] in
 * `dtype` (ZT_BF16, or ZT_F16 for fp16.enabled),
 * lse and delta [B,H,T] fp32, doc_ids [B,T] or NULL. Enqueued on `stream`; returns the launch error. */
#ifndef ZT_PLUGIN_FLASH_EXACT_H
#define ZT_PLUGIN_FLASH_EXACT_H

#include "cuda/kernels_cuda.h"

/* The largest head size: each thread keeps a row of this many fp32 in local memory. */
#define ZT_FLASH_EXACT_MAX_D 256

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t zt_flash_exact_forward(cudaStream_t stream, int32_t dtype, const zt_cuda_attention_shape *s,
                                   const uint16_t *q,
                                   const uint16_t *k, const uint16_t *v, const int32_t *doc_ids, uint16_t *o,
                                   float *lse);
/* delta: [B,H,T] fp32 scratch. */
cudaError_t zt_flash_exact_backward(cudaStream_t stream, int32_t dtype, const zt_cuda_attention_shape *s,
                                    const uint16_t *q,
                                    const uint16_t *k, const uint16_t *v, const int32_t *doc_ids,
                                    const uint16_t *o, const float *lse, const uint16_t *dout, float *delta,
                                    uint16_t *dq, uint16_t *dk, uint16_t *dv);

#ifdef __cplusplus
}
#endif

#endif
