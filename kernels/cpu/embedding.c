/* Token embedding lookup and its scatter-add backward.
 * The backward splits the table's columns among threads (every thread walks all tokens in order
 * over its own columns), so repeated ids never race and the sums do not depend on the thread count.
 */
#include <string.h>
#include "cpu/kernels.h"

/* Index of the first id outside [0, vocab), or -1. */
static int64_t first_bad_id(int64_t tokens, int64_t vocab, const int32_t *ids)
{
    for (int64_t t = 0; t < tokens; t++)
        if (ids[t] < 0 || ids[t] >= vocab) return t;
    return -1;
}

typedef struct embedding_job {
    int64_t tokens, dim;
    const int32_t *ids;
    const float *src;
    float *dst;
} embedding_job;

static void gather_rows(void *arg, int64_t begin, int64_t end)
{
    const embedding_job *j = arg;
    for (int64_t t = begin; t < end; t++)
        memcpy(j->dst + t * j->dim, j->src + (int64_t)j->ids[t] * j->dim, sizeof(float) * (size_t)j->dim);
}

static void scatter_add_columns(void *arg, int64_t begin, int64_t end)
{
    const embedding_job *j = arg;
    for (int64_t t = 0; t < j->tokens; t++) {
        const float *dy = j->src + t * j->dim;
        float *row = j->dst + (int64_t)j->ids[t] * j->dim;
        for (int64_t c = begin; c < end; c++) row[c] += dy[c];
    }
}

zt_status zt_cpu_embedding_forward(const zt_cpu_ctx *ctx, int64_t tokens, int64_t vocab,
                                   int64_t dim, const int32_t *ids, const float *table, float *y,
                                   int64_t *bad_index)
{
    int64_t bad = first_bad_id(tokens, vocab, ids);
    if (bad >= 0) {
        if (bad_index) *bad_index = bad;
        return ZT_ERR_INVALID_ARG;
    }
    embedding_job j = {tokens, dim, ids, table, y};
    zt_cpu_parallel_for(ctx, tokens, 64, gather_rows, &j);
    return ZT_OK;
}

zt_status zt_cpu_embedding_backward(const zt_cpu_ctx *ctx, int64_t tokens, int64_t vocab,
                                    int64_t dim, const int32_t *ids, const float *dy,
                                    float *dtable, int64_t *bad_index)
{
    int64_t bad = first_bad_id(tokens, vocab, ids);
    if (bad >= 0) {
        if (bad_index) *bad_index = bad;
        return ZT_ERR_INVALID_ARG;
    }
    embedding_job j = {tokens, dim, ids, dy, dtable};
    zt_cpu_parallel_for(ctx, dim, 64, scatter_add_columns, &j);
    return ZT_OK;
}
