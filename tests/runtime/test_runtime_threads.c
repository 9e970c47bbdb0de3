/* The runtime's thread pool: every index exactly once, chunk count and sizes as documented, chunk 0
 * on the caller, real parallelism, nesting without deadlock, concurrent callers; and the device
 * context of a CPU run. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "host/runtime.h"
#include "ztest.h"

static zt_runtime *make_runtime(int n_threads)
{
    zt_runtime_options opt = {.n_threads = n_threads, .device_type = ZT_DEVICE_CPU};
    zt_runtime *rt = NULL;
    zt_error err;
    if (zt_runtime_create(&opt, NULL, &rt, &err) != ZT_OK) {
        fprintf(stderr, "zt_runtime_create failed: %s\n", err.msg);
        exit(1);
    }
    return rt;
}

enum { MAX_N = 100003, MAX_CHUNKS = 64 };

typedef struct coverage {
    _Atomic int hits[MAX_N];
    _Atomic int n_chunks;
    int64_t chunk_begin[MAX_CHUNKS], chunk_end[MAX_CHUNKS];
    pthread_t chunk_thread[MAX_CHUNKS];
} coverage;

static void cover(void *p, int64_t begin, int64_t end)
{
    coverage *c = p;
    int slot = atomic_fetch_add(&c->n_chunks, 1);
    if (slot < MAX_CHUNKS) {
        c->chunk_begin[slot] = begin;
        c->chunk_end[slot] = end;
        c->chunk_thread[slot] = pthread_self();
    }
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

static coverage g_cov;

static void check_coverage(zt_runtime *rt, int n_threads, int64_t n, int64_t grain)
{
    memset(&g_cov, 0, sizeof g_cov);
    zt_runtime_parallel_for(rt, n, grain, cover, &g_cov);

    int64_t wrong = 0;
    for (int64_t i = 0; i < n; i++) wrong += atomic_load(&g_cov.hits[i]) != 1;
    if (wrong)
        fprintf(stderr, "n_threads %d n %lld grain %lld:\n", n_threads, (long long)n, (long long)grain);
    ZT_CHECK_INT(wrong, 0);

    /* Documented split: min(n_threads, n / grain) chunks, at least one, each >= grain items. */
    int64_t g = grain < 1 ? 1 : grain;
    int64_t expected = n == 0 ? 0 : n / g < 1 ? 1 : n / g < n_threads ? n / g : n_threads;
    int chunks = atomic_load(&g_cov.n_chunks);
    ZT_CHECK_INT(chunks, expected);
    for (int i = 0; i < chunks && i < MAX_CHUNKS; i++) {
        int64_t size = g_cov.chunk_end[i] - g_cov.chunk_begin[i];
        if (chunks > 1) ZT_CHECK(size >= g);
        /* chunk 0 (the one starting at 0) runs on the caller */
        if (g_cov.chunk_begin[i] == 0) ZT_CHECK(pthread_equal(g_cov.chunk_thread[i], pthread_self()));
    }
}

static void test_coverage(void)
{
    const int thread_counts[] = {1, 2, 3, 4, 8};
    const int64_t ns[] = {0, 1, 2, 3, 7, 64, 1000, 4099, MAX_N};
    const int64_t grains[] = {0, 1, 2, 5, 64, 1000, 200000};
    for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
        zt_runtime *rt = make_runtime(thread_counts[t]);
        ZT_CHECK_INT(zt_runtime_n_threads(rt), thread_counts[t]);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (size_t j = 0; j < sizeof grains / sizeof grains[0]; j++)
                check_coverage(rt, thread_counts[t], ns[i], grains[j]);
        zt_runtime_destroy(rt);
    }
}

/* Every chunk waits until all chunks have started: this only finishes if they truly run at the
 * same time on distinct threads. */
typedef struct rendezvous {
    _Atomic int arrived;
    int expected;
    _Atomic int timed_out;
    pthread_t threads[8];
} rendezvous;

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void meet(void *p, int64_t begin, int64_t end)
{
    rendezvous *r = p;
    (void)end;
    r->threads[begin] = pthread_self();
    atomic_fetch_add(&r->arrived, 1);
    double deadline = now_seconds() + 10.0;
    while (atomic_load(&r->arrived) < r->expected) {
        if (now_seconds() > deadline) {
            atomic_store(&r->timed_out, 1);
            return;
        }
        sched_yield();
    }
}

static void test_runs_in_parallel(void)
{
    zt_runtime *rt = make_runtime(4);
    rendezvous r = {.expected = 4};
    zt_runtime_parallel_for(rt, 4, 1, meet, &r);
    ZT_CHECK_INT(atomic_load(&r.timed_out), 0);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < i; j++) ZT_CHECK(!pthread_equal(r.threads[i], r.threads[j]));
    zt_runtime_destroy(rt);
}

/* Nested calls: from the caller's chunk and from workers' chunks. */
typedef struct nested {
    zt_runtime *rt;
    const zt_host *host;
    _Atomic int hits[64 * 100];
} nested;

static void inner(void *p, int64_t begin, int64_t end)
{
    _Atomic int *row = p;
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&row[i], 1);
}

static void outer(void *p, int64_t begin, int64_t end)
{
    nested *s = p;
    for (int64_t r = begin; r < end; r++)
        s->host->parallel_for(s->host->ctx, 100, 1, inner, &s->hits[r * 100]);
}

static void test_nested(void)
{
    zt_runtime *rt = make_runtime(4);
    static nested s;
    memset(&s, 0, sizeof s);
    s.rt = rt;
    s.host = zt_runtime_host(rt, "llama", NULL, 0);
    alarm(30); /* a deadlock fails the test instead of hanging it */
    zt_runtime_parallel_for(rt, 64, 1, outer, &s);
    alarm(0);
    int wrong = 0;
    for (int i = 0; i < 64 * 100; i++) wrong += atomic_load(&s.hits[i]) != 1;
    ZT_CHECK_INT(wrong, 0);
    zt_runtime_destroy(rt);
}

/* Several outside threads calling at once, many times (exercises job hand-over between calls). */
typedef struct caller_arg {
    zt_runtime *rt;
    _Atomic long long sum;
} caller_arg;

static void add_indices(void *p, int64_t begin, int64_t end)
{
    caller_arg *a = p;
    long long s = 0;
    for (int64_t i = begin; i < end; i++) s += i;
    atomic_fetch_add(&a->sum, s);
}

static void *caller_thread(void *p)
{
    caller_arg *a = p;
    for (int i = 0; i < 2000; i++) zt_runtime_parallel_for(a->rt, 1000 + i % 7, 16, add_indices, a);
    return NULL;
}

static void test_concurrent_callers(void)
{
    zt_runtime *rt = make_runtime(3);
    enum { CALLERS = 3 };
    pthread_t t[CALLERS];
    caller_arg args[CALLERS];
    alarm(30);
    for (int i = 0; i < CALLERS; i++) {
        args[i].rt = rt;
        atomic_init(&args[i].sum, 0);
        pthread_create(&t[i], NULL, caller_thread, &args[i]);
    }
    long long expected = 0; /* sum over calls of 0 + 1 + ... + (n - 1) */
    for (int i = 0; i < 2000; i++) {
        long long n = 1000 + i % 7;
        expected += n * (n - 1) / 2;
    }
    for (int i = 0; i < CALLERS; i++) {
        pthread_join(t[i], NULL);
        ZT_CHECK_INT(atomic_load(&args[i].sum), expected);
    }
    alarm(0);
    zt_runtime_destroy(rt);
}

static void test_thread_count_and_device(void)
{
    cpu_set_t set;
    ZT_CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
    zt_runtime *rt = make_runtime(0);
    ZT_CHECK_INT(zt_runtime_n_threads(rt), CPU_COUNT(&set));

    const zt_host *host = zt_runtime_host(rt, "llama", NULL, 0);
    const zt_device_ctx *dev = host->device;
    ZT_CHECK(dev != NULL);
    ZT_CHECK_INT(dev->struct_size, sizeof(zt_device_ctx));
    ZT_CHECK_INT(dev->device_type, ZT_DEVICE_CPU);
    ZT_CHECK_INT(dev->device_index, 0);
    ZT_CHECK_INT(dev->n_threads, CPU_COUNT(&set));
    ZT_CHECK(dev->compute_stream == NULL && dev->cublas == NULL && dev->workspace == NULL);
    /* Host RAM as the kernel reports it in /proc/meminfo ("MemTotal: N kB"). */
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kib = 0;
    ZT_CHECK(f && fscanf(f, "MemTotal: %llu kB", &kib) == 1);
    if (f) fclose(f);
    ZT_CHECK_CLOSE((double)dev->total_memory, (double)kib * 1024.0, 1e-3, 0);
    ZT_CHECK_INT(host->world_rank, 0);
    ZT_CHECK_INT(host->world_size, 1);
    zt_runtime_destroy(rt);

    zt_runtime_options bad = {.n_threads = -2};
    zt_error err;
    zt_runtime *none = (zt_runtime *)&err; /* any non-NULL value: a failed create must reset it */
    ZT_CHECK_INT(zt_runtime_create(&bad, NULL, &none, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK(none == NULL);
    ZT_CHECK_CONTAINS(err.msg, "n_threads is -2: use a value from 1 to");

    zt_runtime_options cuda = {.device_type = ZT_DEVICE_CUDA};
    /* No GPU here: whether the build lacks the CUDA module or the machine lacks a driver or a device,
     * the run is refused and told to train on the CPU. */
    ZT_CHECK_INT(zt_runtime_create(&cuda, NULL, &none, &err), ZT_ERR_UNSUPPORTED);
    ZT_CHECK(none == NULL);
    ZT_CHECK_CONTAINS(err.msg, "CUDA");
    ZT_CHECK_CONTAINS(err.msg, "(device = cpu)");
    zt_runtime_options other = {.device_type = 7};
    ZT_CHECK_INT(zt_runtime_create(&other, NULL, &none, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "device type 7 is neither CPU (0) nor CUDA (1)");
}

int main(void)
{
    test_coverage();
    test_runs_in_parallel();
    test_nested();
    test_concurrent_callers();
    test_thread_count_and_device();
    return zt_test_result();
}
