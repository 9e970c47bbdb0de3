/* Attention of new tokens against a KV cache kept in blocks (docs/kernels.md): the exact two-pass
 * softmax the attention plugins' generation uses. A contiguous per-sequence cache is the case of
 * one block per sequence (block_size = its capacity), so the naive and paged plugins run the same
 * arithmetic and give the same bits. */
#include <math.h>
#include "cpu/kernels.h"

typedef struct decode_job {
    const zt_kv_pages *p;
    const zt_attention_shape *s;
    int64_t n_new;
    const float *q;
    float *out;
} decode_job;

/* K (or V) row of token `pos` of the sequence whose block table is `table`. */
static const float *page_row(const zt_kv_pages *p, const float *base, const int32_t *table, int64_t pos)
{
    int64_t slot = (int64_t)table[pos / p->block_size] * p->block_size + pos % p->block_size;
    return base + slot * p->row_stride;
}

/* One (sequence, new token, query head) per item: the query attends to the sequence's committed
 * tokens and the new ones up to itself; the maximum score first, then the normalized weighted sum. */
static void decode_items(void *arg, int64_t begin, int64_t end)
{
    const decode_job *job = arg;
    const zt_kv_pages *p = job->p;
    int64_t H = job->s->heads, D = job->s->head_dim, group = job->s->heads / job->s->kv_heads, n_new = job->n_new;
    float scale = job->s->scale;
    for (int64_t item = begin; item < end; item++) {
        int64_t h = item % H, i = item / H % n_new, seq = item / H / n_new;
        const int32_t *table = p->block_tables + seq * p->table_stride;
        int64_t visible = p->lengths[seq] + i + 1;
        const float *q = job->q + ((seq * n_new + i) * H + h) * D;
        float *out = job->out + ((seq * n_new + i) * H + h) * D;
        int64_t kv_offset = h / group * D;
        float max_score = -INFINITY;
        for (int64_t j = 0; j < visible; j++) {
            const float *k = page_row(p, p->k, table, j) + kv_offset;
            float score = 0.0f;
            for (int64_t d = 0; d < D; d++) score += q[d] * k[d];
            score *= scale;
            if (score > max_score) max_score = score;
        }
        float sum = 0.0f;
        for (int64_t d = 0; d < D; d++) out[d] = 0.0f;
        for (int64_t j = 0; j < visible; j++) {
            const float *k = page_row(p, p->k, table, j) + kv_offset;
            const float *v = page_row(p, p->v, table, j) + kv_offset;
            float score = 0.0f;
            for (int64_t d = 0; d < D; d++) score += q[d] * k[d];
            float weight = expf(score * scale - max_score);
            sum += weight;
            for (int64_t d = 0; d < D; d++) out[d] += weight * v[d];
        }
        for (int64_t d = 0; d < D; d++) out[d] /= sum;
    }
}

void zt_cpu_attention_decode(const zt_cpu_ctx *ctx, const zt_attention_shape *s, const zt_kv_pages *p,
                             int64_t n_seqs, int64_t n_new, const float *q, float *out)
{
    decode_job job = {p, s, n_new, q, out};
    zt_cpu_parallel_for(ctx, n_seqs * n_new * s->heads, 4, decode_items, &job);
}
