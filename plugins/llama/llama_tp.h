/* The CPU path's tensor-parallel pieces (tp.c), for layers.c. Each is the identity, or the one-rank
 * math, when s->tp.size is 1. */
#ifndef ZT_PLUGIN_LLAMA_TP_H
#define ZT_PLUGIN_LLAMA_TP_H

#include "llama.h"

/* Sequence parallelism (use_seq_parallel): outside the tensor-parallel regions each rank holds
 * N / tp consecutive tokens of the call's N = B*T (its sequence shard, from row *first). Without it,
 * or on one rank, the whole call: *first 0, N rows. A call whose N does not divide by tp is refused
 * (ZT_ERR_CONFIG, with the message). */
int llama_tp_seq_parallel(const llama_state *s);
zt_status llama_tp_seq_rows(const llama_call *r, int64_t *rows, int64_t *first);
/* The end of a row-parallel linear: its partial sums partial [N, width] reduced over "tp", into
 * dst [N, width] (all-reduce; dst must be partial) or, with sequence parallelism, this rank's
 * shard dst [N / tp, width] (reduce-scatter). */
zt_status llama_tp_reduce_rows(const llama_call *r, float *partial, float *dst, int64_t width, const char *what);
/* The start of a column-parallel linear: full [N, width] from every rank's shard [N / tp, width]
 * (all-gather) with sequence parallelism; otherwise shard is already the whole (copied when the two
 * differ). */
zt_status llama_tp_gather_rows(const llama_call *r, const float *shard, float *full, int64_t width, const char *what);
/* A replicated weight's gradient from this rank's part of the computation (a norm's from the rank's
 * sequence shard, a LoRA factor's from the rank's split of the other): gw [n] summed over "tp", then
 * added to dw, so every rank holds the same gradient. */
zt_status llama_tp_sum_grad(const llama_call *r, float *gw, float *dw, int64_t n, const char *what);
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
