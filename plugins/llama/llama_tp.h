/* The CPU path's tensor-parallel pieces (tp.c), for layers.c. Each is the identity, or the one-rank
 * math, when s->tp.size is 1. */
#ifndef ZT_PLUGIN_LLAMA_TP_H
#define ZT_PLUGIN_LLAMA_TP_H

#include "llama.h"

/* buf[0, n) reduced in place over "tp" with op (zt_reduce_op); a no-op on one rank. */
zt_status llama_tp_all_reduce(const llama_call *r, float *buf, int64_t n, int32_t op, const char *what);
/* With replicated KV heads: dk and dv [N, D] summed over the ranks that share this rank's head. */
zt_status llama_tp_sum_kv_replicas(const llama_call *r, float *dk, float *dv);
/* Vocab-parallel embedding: y [N, hidden] = E[tokens] from this rank's rows (zero elsewhere), then
 * all-reduced; its backward scatters dy into this rank's rows. A token outside the vocabulary:
 * ZT_ERR_INVALID_ARG with its index in *bad (no message). */
zt_status llama_tp_embedding_forward(const llama_call *r, const float *table, float *y, int64_t *bad);
zt_status llama_tp_embedding_backward(const llama_call *r, const float *dy, float *dtable, int64_t *bad);
/* Vocab-parallel cross-entropy on this rank's logits [N, vocab rows of the rank]: *loss =
 * sum(-log p[target]) / normalizer on every rank; with train, logits := d loss / d logits times
 * dloss (zero in padding columns). A target outside the vocabulary: as above. */
zt_status llama_tp_cross_entropy(const llama_call *r, float *logits, double normalizer, float dloss, double *loss,
                                 int train, int64_t *bad);
/* The whole logits [N, vocab] from every rank's columns (evaluation and generation only). */
zt_status llama_tp_gather_logits(const llama_call *r, const float *local, float *out);

#endif
