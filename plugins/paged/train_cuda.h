/* The paged plugin's training on a GPU (train_cuda.c): forward and backward of packed causal
 * attention through the flash kernels of kernels/cuda, the very calls the flash plugin makes, so
 * `--plugins llama,zero3,paged` with device = cuda trains (and evaluates) as flash does. Built only
 * with CUDA (ZT_PLUGIN_CUDA). */
#ifndef ZT_PLUGINS_PAGED_TRAIN_CUDA_H
#define ZT_PLUGINS_PAGED_TRAIN_CUDA_H

#include "zt/zt_plugin.h"

typedef struct paged_cuda paged_cuda;

/* The GPU path of a run whose device is CUDA: checks the GPU (compute capability 8.0+) and the
 * kernel choice (ZT_FLASH_KERNEL / ZT_FLASH_BACKWARD_KERNEL, as the flash plugin reads them). */
zt_status paged_cuda_init(const zt_host *host, paged_cuda **out);
void paged_cuda_fini(paged_cuda *c);
zt_status paged_cuda_forward(paged_cuda *c, const zt_attn_args *a, void **saved);
/* Consumes `saved` in every case. */
zt_status paged_cuda_backward(paged_cuda *c, const zt_attn_args *a, void *saved);
void paged_cuda_release(paged_cuda *c, void *saved);

#endif
