#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "base/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Chunks of the current job are claimed through one atomic 64-bit word:
 *
 *     bits 32..63  generation of the job (one per parallel_for call)
 *     bits 16..31  number of chunks of that job
 *     bits  0..15  next unclaimed chunk
 *
 * A worker claims a chunk with a compare-and-swap on the whole word. One that slept through a job
 * and wakes up late fails the swap (the generation moved on) instead of running a chunk of a job
 * whose fields the caller is already overwriting. A claimed chunk is not yet done, so the job's
 * fields stay untouched until the claimer has read them. */
#define FIELD_BITS 16
#define FIELD_MASK ((UINT64_C(1) << FIELD_BITS) - 1)
#define MAX_THREADS 1024 /* well below FIELD_MASK; more would only add wake-up cost */

/* Spin this many times before sleeping on a condition variable: back-to-back calls (one per GEMM)
 * then wake workers in well under a microsecond, while an idle pool costs no CPU. */
#define SPIN_ITERATIONS 4000

/* Generations are 32-bit and wrap around; only equality matters. */
static inline uint64_t claim_word(uint32_t generation, uint64_t n_chunks, uint64_t next)
{
    return ((uint64_t)generation << (2 * FIELD_BITS)) | (n_chunks << FIELD_BITS) | next;
}
static inline uint32_t word_generation(uint64_t w) { return (uint32_t)(w >> (2 * FIELD_BITS)); }
static inline uint64_t word_n_chunks(uint64_t w) { return (w >> FIELD_BITS) & FIELD_MASK; }
static inline uint64_t word_next(uint64_t w) { return w & FIELD_MASK; }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Set on worker threads for their whole life and on a caller while its call runs: a parallel_for
 * from such a thread is a nested call and runs serially. */
static _Thread_local int tls_inside_pool = 0;

struct zt_threadpool {
    int n_threads; /* including the caller */
    pthread_t *workers;
    int n_workers_started;

    /* The current job. Written only by the caller holding submit_lock, before the claim word that
     * publishes it; read by workers only after claiming one of its chunks. */
    zt_range_fn fn;
    void *arg;
    int64_t n;
    uint32_t generation; /* the caller's count of published jobs */

    _Atomic uint64_t claim;      /* see claim_word() */
    _Atomic int chunks_done;     /* of the current job */
    _Atomic int n_sleeping;      /* workers blocked on work_cv */
    _Atomic int caller_sleeping; /* the caller is blocked on done_cv */
    _Atomic int shutdown;

    pthread_mutex_t submit_lock; /* one outside caller at a time */
    pthread_mutex_t lock;        /* guards the two condition variables */
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
};

int zt_online_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void run_chunk(zt_threadpool *pool, uint64_t index, uint64_t n_chunks)
{
    /* Contiguous, near-equal chunks: the first n % k get one extra item. */
    int64_t k = (int64_t)n_chunks, i = (int64_t)index;
    int64_t base = pool->n / k, extra = pool->n % k;
    int64_t begin = i * base + (i < extra ? i : extra);
    int64_t end = begin + base + (i < extra ? 1 : 0);
    pool->fn(pool->arg, begin, end);
}

/* Called after a chunk ran: the thread completing the last one wakes a sleeping caller. n_chunks is
 * passed in because the job's fields may be overwritten as soon as the count is reached. */
static void finish_chunk(zt_threadpool *pool, uint64_t n_chunks)
{
    int done = atomic_fetch_add(&pool->chunks_done, 1) + 1;
    if ((uint64_t)done == n_chunks && atomic_load(&pool->caller_sleeping)) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_signal(&pool->done_cv);
        pthread_mutex_unlock(&pool->lock);
    }
}

/* Claim and run chunks of job `generation` until none is left. */
static void run_claimed_chunks(zt_threadpool *pool, uint32_t generation)
{
    uint64_t w = atomic_load(&pool->claim);
    for (;;) {
        if (word_generation(w) != generation || word_next(w) >= word_n_chunks(w)) return;
        if (atomic_compare_exchange_weak(&pool->claim, &w, w + 1)) {
            run_chunk(pool, word_next(w), word_n_chunks(w));
            finish_chunk(pool, word_n_chunks(w));
            w = atomic_load(&pool->claim);
        }
        /* On failure w now holds the current word: retry with it. */
    }
}

/* Waits for a job other than `seen`: returns 1 with its generation, or 0 at shutdown. */
static int wait_for_job(zt_threadpool *pool, uint32_t seen, uint32_t *generation)
{
    for (int i = 0; i < SPIN_ITERATIONS; i++) {
        if (atomic_load(&pool->shutdown)) return 0;
        *generation = word_generation(atomic_load_explicit(&pool->claim, memory_order_acquire));
        if (*generation != seen) return 1;
        cpu_relax();
    }
    /* Announce the sleep before the last check; the caller checks n_sleeping after publishing, so
     * one of the two always sees the other (both are sequentially consistent). */
    pthread_mutex_lock(&pool->lock);
    atomic_fetch_add(&pool->n_sleeping, 1);
    for (;;) {
        *generation = word_generation(atomic_load(&pool->claim));
        if (*generation != seen || atomic_load(&pool->shutdown)) break;
        pthread_cond_wait(&pool->work_cv, &pool->lock);
    }
    atomic_fetch_sub(&pool->n_sleeping, 1);
    pthread_mutex_unlock(&pool->lock);
    return !atomic_load(&pool->shutdown);
}

static void *worker_main(void *p)
{
    zt_threadpool *pool = p;
    tls_inside_pool = 1;
    uint32_t seen = 0, generation;
    while (wait_for_job(pool, seen, &generation)) {
        seen = generation;
        run_claimed_chunks(pool, generation);
    }
    return NULL;
}

static void stop_workers(zt_threadpool *pool)
{
    atomic_store(&pool->shutdown, 1);
    pthread_mutex_lock(&pool->lock);
    pthread_cond_broadcast(&pool->work_cv);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < pool->n_workers_started; i++) pthread_join(pool->workers[i], NULL);
    pool->n_workers_started = 0;
}

zt_status zt_threadpool_create(int n_threads, zt_threadpool **out, zt_error *err)
{
    *out = NULL;
    if (n_threads < 0 || n_threads > MAX_THREADS)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "n_threads is %d: use a value from 1 to %d, or 0 for one thread per core",
                            n_threads, MAX_THREADS);
    if (n_threads == 0) n_threads = zt_online_cores();
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;

    zt_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating the thread pool");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->submit_lock, NULL);
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->work_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    /* Generation 0 with no chunks: "no job yet". */
    atomic_init(&pool->claim, claim_word(0, 0, 0));

    if (n_threads > 1) {
        pool->workers = calloc((size_t)n_threads - 1, sizeof *pool->workers);
        if (!pool->workers) {
            zt_threadpool_destroy(pool);
            return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory creating the thread pool");
        }
        for (int i = 0; i < n_threads - 1; i++) {
            int rc = pthread_create(&pool->workers[i], NULL, worker_main, pool);
            if (rc != 0) {
                zt_threadpool_destroy(pool);
                return zt_error_set(err, ZT_ERR_INTERNAL,
                                    "could not start worker thread %d of %d: %s; lower the thread "
                                    "count (n_threads) or raise the process limit (ulimit -u)",
                                    i + 1, n_threads - 1, strerror(rc));
            }
            pool->n_workers_started++;
        }
    }
    *out = pool;
    return ZT_OK;
}

void zt_threadpool_destroy(zt_threadpool *pool)
{
    if (!pool) return;
    stop_workers(pool);
    free(pool->workers);
    pthread_cond_destroy(&pool->done_cv);
    pthread_cond_destroy(&pool->work_cv);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->submit_lock);
    free(pool);
}

int zt_threadpool_n_threads(const zt_threadpool *pool) { return pool->n_threads; }

void zt_threadpool_parallel_for(zt_threadpool *pool, int64_t n, int64_t grain, zt_range_fn fn,
                                void *arg)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t n_chunks = n / grain;
    if (n_chunks > pool->n_threads) n_chunks = pool->n_threads;

    if (n_chunks <= 1 || tls_inside_pool) {
        int was_inside = tls_inside_pool;
        tls_inside_pool = 1;
        fn(arg, 0, n);
        tls_inside_pool = was_inside;
        return;
    }

    pthread_mutex_lock(&pool->submit_lock);
    tls_inside_pool = 1;
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    atomic_store(&pool->chunks_done, 0);
    uint32_t generation = ++pool->generation;
    /* Chunk 0 is the caller's, so claiming starts at 1. */
    atomic_store(&pool->claim, claim_word(generation, (uint64_t)n_chunks, 1));
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->work_cv);
        pthread_mutex_unlock(&pool->lock);
    }

    run_chunk(pool, 0, (uint64_t)n_chunks);
    finish_chunk(pool, (uint64_t)n_chunks);
    run_claimed_chunks(pool, generation); /* help with chunks no worker has taken yet */

    for (int i = 0; i < SPIN_ITERATIONS && atomic_load(&pool->chunks_done) != n_chunks; i++)
        cpu_relax();
    if (atomic_load(&pool->chunks_done) != n_chunks) {
        pthread_mutex_lock(&pool->lock);
        atomic_store(&pool->caller_sleeping, 1);
        while (atomic_load(&pool->chunks_done) != n_chunks)
            pthread_cond_wait(&pool->done_cv, &pool->lock);
        atomic_store(&pool->caller_sleeping, 0);
        pthread_mutex_unlock(&pool->lock);
    }
    tls_inside_pool = 0;
    pthread_mutex_unlock(&pool->submit_lock);
}
