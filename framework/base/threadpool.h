/* The worker thread pool behind zt_runtime_parallel_for and host->parallel_for.
 *
 * Workers are created once and live until zt_threadpool_destroy. A call splits [0, n) into at most
 * n_threads contiguous chunks of at least `grain` items, runs chunk 0 on the calling thread, lets the
 * workers take the rest, and returns when every chunk is done. It allocates nothing, so it is cheap
 * enough to wrap every GEMM of the CPU training path.
 *
 * Calls from inside fn (on the caller or on a worker) run the whole range serially on that thread
 * instead of deadlocking. Calls from several outside threads at once are serialized.
 */
#ifndef ZT_FRAMEWORK_THREADPOOL_H
#define ZT_FRAMEWORK_THREADPOOL_H

#include "zt/zt_host.h"
#include "base/error.h"

typedef struct zt_threadpool zt_threadpool;

/* n_threads counts the caller: n_threads - 1 workers are started. 0 means one per online core
 * (as allowed by the process's CPU affinity). */
zt_status zt_threadpool_create(int n_threads, zt_threadpool **out, zt_error *err);
void zt_threadpool_destroy(zt_threadpool *pool);

void zt_threadpool_parallel_for(zt_threadpool *pool, int64_t n, int64_t grain, zt_range_fn fn,
                                void *arg);
int zt_threadpool_n_threads(const zt_threadpool *pool);

/* One per online core the process may run on. */
int zt_online_cores(void);

#endif
