/* Softmax cross-entropy over the vocabulary, fused with its gradient.
 * Per row with target c:  loss = lse - x_c,  lse = m + log(sum exp(x - m)),  m = max x;
 * dlogits = dloss / normalizer * (softmax(x) - onehot(c)).
 * Rows are independent; the total is summed afterwards in row order, so it does not depend on the
 * thread count.
 */
#include <math.h>
#include "cpu/kernels.h"
#include "cpu/simd.h"

enum { COLUMN_BLOCK = 256 };

typedef struct ce_job {
    int64_t vocab;
    const float *logits;
    const int32_t *targets;
    float grad_scale; /* dloss / normalizer */
    float *row_loss, *dlogits;
} ce_job;

ZT_CPU_CLONES
static void ce_rows(void *arg, int64_t begin, int64_t end)
{
    const ce_job *j = arg;
    int64_t V = j->vocab;
    for (int64_t row = begin; row < end; row++) {
        const float *x = j->logits + row * V;
        float *dx = j->dlogits ? j->dlogits + row * V : NULL;
        int32_t target = j->targets[row];
        if (target == ZT_IGNORE_INDEX) {
            j->row_loss[row] = 0.0f;
            if (dx) memset(dx, 0, sizeof(float) * (size_t)V);
            continue;
        }
        float target_logit = x[target]; /* read before dx (possibly x itself) is overwritten */
        float max = zt_max(x, V);
        /* exp(x - max) goes to dx when there is one (it becomes the softmax below). Summed per
         * block of COLUMN_BLOCK in float, then across blocks in double. */
        double sum = 0.0;
        float block[COLUMN_BLOCK];
        for (int64_t c = 0; c < V; c += COLUMN_BLOCK) {
            int64_t n = V - c < COLUMN_BLOCK ? V - c : COLUMN_BLOCK;
            sum += zt_exp_shifted(x + c, max, dx ? dx + c : block, n);
        }
        float lse = max + (float)log(sum);
        j->row_loss[row] = lse - target_logit;
        if (dx) {
            float scale = (float)(j->grad_scale / sum);
            for (int64_t c = 0; c < V; c++) dx[c] *= scale;
            dx[target] -= j->grad_scale;
        }
    }
}

zt_status zt_cpu_cross_entropy(const zt_cpu_ctx *ctx, int64_t rows, int64_t vocab,
                               const float *logits, const int32_t *targets, double normalizer,
                               float dloss, float *row_loss, double *loss, float *dlogits,
                               int64_t *bad_index)
{
    if (!(normalizer > 0.0)) {
        if (bad_index) *bad_index = -1;
        return ZT_ERR_INVALID_ARG;
    }
    for (int64_t row = 0; row < rows; row++) {
        if (targets[row] != ZT_IGNORE_INDEX && (targets[row] < 0 || targets[row] >= vocab)) {
            if (bad_index) *bad_index = row;
            return ZT_ERR_INVALID_ARG;
        }
    }
    ce_job j = {vocab, logits, targets, (float)(dloss / normalizer), row_loss, dlogits};
    zt_cpu_parallel_for(ctx, rows, 4, ce_rows, &j);
    double total = 0.0;
    for (int64_t row = 0; row < rows; row++) total += row_loss[row];
    *loss = total / normalizer;
    return ZT_OK;
}
