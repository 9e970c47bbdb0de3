/* The serial fallback every kernel relies on when no thread pool is given. */
#include "cpu/kernels.h"

void zt_cpu_parallel_for(const zt_cpu_ctx *ctx, int64_t n, int64_t grain, zt_range_fn fn,
                         void *arg)
{
    if (n <= 0) return;
    if (ctx && ctx->parallel_for && n > grain)
        ctx->parallel_for(ctx->pool, n, grain, fn, arg);
    else
        fn(arg, 0, n);
}
