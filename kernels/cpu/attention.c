/* Exact ("naive") causal attention with grouped KV heads and an optional packed-document mask.
 *
 * Forward: one query row at a time, keys in blocks of KEY_BLOCK with an online softmax (a running
 * max m and sum l; the output row is rescaled when m grows), so no T x T score matrix is stored.
 * The row's log-sum-exp lse = m + log(l) is saved for the backward.
 *
 * Backward, with P_ij = exp(scale q_i.k_j - lse_i) recomputed from lse and D_i = dO_i . O_i:
 *   dV_j += P_ij dO_i;  dS_ij = P_ij (dO_i . V_j - D_i);  dQ_i += scale dS_ij K_j;
 *   dK_j += scale dS_ij Q_i.
 * A task owns one (batch, kv head) pair: it writes that head's dK, dV and the dQ of every query head
 * sharing it, so nothing is written by two threads.
 */
#include <math.h>
#include "cpu/kernels.h"
#include "cpu/simd.h"

enum { KEY_BLOCK = 64 };

typedef struct attention_job {
    const zt_attention_shape *s;
    const float *q, *k, *v, *o, *lse_in, *dout;
    const int32_t *doc_ids;
    float *o_out, *lse_out, *dq, *dk, *dv;
} attention_job;

/* Query rows are visited in the order 0, T-1, 1, T-2, ...: with causal masking row i costs i + 1,
 * so any contiguous run of items (what one thread receives) has about the same total cost. */
static int64_t balanced_row(int64_t item, int64_t seq)
{
    int64_t pair = item / 2;
    return item % 2 == 0 ? pair : seq - 1 - pair;
}

static int key_visible(const int32_t *doc, int64_t i, int64_t j)
{
    return !doc || doc[j] == doc[i];
}

ZT_CPU_CLONES
static void forward_rows(void *arg, int64_t begin, int64_t end)
{
    const attention_job *job = arg;
    const zt_attention_shape *s = job->s;
    int64_t T = s->seq, H = s->heads, Hkv = s->kv_heads, D = s->head_dim;
    int64_t group = H / Hkv;
    float scores[KEY_BLOCK];
    for (int64_t item = begin; item < end; item++) {
        int64_t bh = item / T, b = bh / H, h = bh % H, i = balanced_row(item % T, T);
        const float *q = job->q + ((b * T + i) * H + h) * D;
        const float *k = job->k + (b * T * Hkv + h / group) * D; /* key j at k + j * Hkv * D */
        const float *v = job->v + (b * T * Hkv + h / group) * D;
        const int32_t *doc = job->doc_ids ? job->doc_ids + b * T : NULL;
        float *o = job->o_out + ((b * T + i) * H + h) * D;
        float running_max = -INFINITY, running_sum = 0.0f;
        memset(o, 0, sizeof(float) * (size_t)D);
        for (int64_t j0 = 0; j0 <= i; j0 += KEY_BLOCK) {
            int64_t n = i + 1 - j0 < KEY_BLOCK ? i + 1 - j0 : KEY_BLOCK;
            float block_max = -INFINITY;
            for (int64_t jj = 0; jj < n; jj++) {
                scores[jj] = -INFINITY;
                if (!key_visible(doc, i, j0 + jj)) continue;
                scores[jj] = s->scale * zt_dot(q, k + (j0 + jj) * Hkv * D, D);
                block_max = scores[jj] > block_max ? scores[jj] : block_max;
            }
            if (block_max == -INFINITY) continue; /* no visible key in this block */
            if (block_max > running_max) {
                float shrink = expf(running_max - block_max); /* 0 on the first block */
                running_sum *= shrink;
                for (int64_t d = 0; d < D; d++) o[d] *= shrink;
                running_max = block_max;
            }
            zt_exp_shifted(scores, running_max, scores, n);
            for (int64_t jj = 0; jj < n; jj++) {
                if (!key_visible(doc, i, j0 + jj)) continue;
                running_sum += scores[jj];
                zt_axpy(o, scores[jj], v + (j0 + jj) * Hkv * D, D);
            }
        }
        float inv_sum = 1.0f / running_sum;
        for (int64_t d = 0; d < D; d++) o[d] *= inv_sum;
        job->lse_out[(b * H + h) * T + i] = running_max + logf(running_sum);
    }
}

void zt_cpu_attention_forward(const zt_cpu_ctx *ctx, const zt_attention_shape *s, const float *q,
                              const float *k, const float *v, const int32_t *doc_ids, float *o,
                              float *lse)
{
    attention_job job = {.s = s, .q = q, .k = k, .v = v, .doc_ids = doc_ids, .o_out = o,
                         .lse_out = lse};
    zt_cpu_parallel_for(ctx, s->batch * s->heads * s->seq, 16, forward_rows, &job);
}

ZT_CPU_CLONES
static void backward_groups(void *arg, int64_t begin, int64_t end)
{
    const attention_job *job = arg;
    const zt_attention_shape *s = job->s;
    int64_t T = s->seq, H = s->heads, Hkv = s->kv_heads, D = s->head_dim;
    int64_t group = H / Hkv;
    for (int64_t item = begin; item < end; item++) {
        int64_t b = item / Hkv, g = item % Hkv;
        const int32_t *doc = job->doc_ids ? job->doc_ids + b * T : NULL;
        const float *k = job->k + (b * T * Hkv + g) * D, *v = job->v + (b * T * Hkv + g) * D;
        float *dk = job->dk + (b * T * Hkv + g) * D, *dv = job->dv + (b * T * Hkv + g) * D;
        for (int64_t j = 0; j < T; j++) {
            memset(dk + j * Hkv * D, 0, sizeof(float) * (size_t)D);
            memset(dv + j * Hkv * D, 0, sizeof(float) * (size_t)D);
        }
        for (int64_t h = g * group; h < (g + 1) * group; h++) {
            for (int64_t i = 0; i < T; i++) {
                int64_t row = (b * T + i) * H + h;
                const float *q = job->q + row * D, *o = job->o + row * D, *dout = job->dout + row * D;
                float *dq = job->dq + row * D;
                float lse = job->lse_in[(b * H + h) * T + i];
                float out_dot = zt_dot(dout, o, D); /* D_i */
                memset(dq, 0, sizeof(float) * (size_t)D);
                for (int64_t j = 0; j <= i; j++) {
                    if (!key_visible(doc, i, j)) continue;
                    const float *kj = k + j * Hkv * D, *vj = v + j * Hkv * D;
                    float p = expf(s->scale * zt_dot(q, kj, D) - lse);
                    float dscore = p * (zt_dot(dout, vj, D) - out_dot) * s->scale;
                    zt_axpy(dv + j * Hkv * D, p, dout, D);
                    zt_axpy(dq, dscore, kj, D);
                    zt_axpy(dk + j * Hkv * D, dscore, q, D);
                }
            }
        }
    }
}

void zt_cpu_attention_backward(const zt_cpu_ctx *ctx, const zt_attention_shape *s, const float *q,
                               const float *k, const float *v, const int32_t *doc_ids,
                               const float *o, const float *lse, const float *dout, float *dq,
                               float *dk, float *dv)
{
    attention_job job = {.s = s, .q = q, .k = k, .v = v, .o = o, .lse_in = lse, .dout = dout,
                         .doc_ids = doc_ids, .dq = dq, .dk = dk, .dv = dv};
    zt_cpu_parallel_for(ctx, s->batch * s->kv_heads, 1, backward_groups, &job);
}
