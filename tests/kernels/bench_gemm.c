/* GEMM benchmark behind the decision in docs/kernels.md: zt's packed GEMM (kernels/cpu/gemm.c) on
 * the host's thread pool against OpenBLAS (Debian libopenblas-dev, its own pthreads), on the
 * matrix products of one LLaMA training step. Not a test: run it by hand,
 *   build/bin/zt-bench-gemm [threads] [repeats] [zt-only [tiny|125m]]
 * Prints milliseconds per call for the forward (x W^T), dX (dY W) and dW (dY^T x) with four
 * implementations: zt's GEMM on the zt thread pool (with the AVX-512 kernel where the CPU has it,
 * and forced to the AVX2 kernel), OpenBLAS with its own threads, and single-threaded OpenBLAS
 * calls on column blocks spread over the zt thread pool (how a plugin would have to call
 * OpenBLAS to honour the host's thread count).
 * "zt-only tiny" (or "125m") runs just zt's AVX-512 path on that model's products and, with
 * threads 1, serially on the calling thread, timed in CPU time: on a busy machine this is far less
 * noisy than wall time (a process that waits for a core is not charged). For before/after
 * comparisons of the GEMM on a shared machine: `taskset -c 1 zt-bench-gemm 1 9 zt-only tiny`.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cpu/kernels.h"
#include "base/threadpool.h"

void openblas_set_num_threads(int n);

typedef struct shape {
    const char *model, *name;
    int64_t tokens, out, in; /* y[tokens, out] = x[tokens, in] W[out, in]^T */
} shape;

/* Wall time, or the process's CPU time (not counting the time it waited for a core). */
static double now_s(int cpu_time)
{
    struct timespec ts;
    clock_gettime(cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(float *x, int64_t n, unsigned seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
}

static void pool_for(void *pool, int64_t n, int64_t grain, zt_range_fn fn, void *arg)
{
    zt_threadpool_parallel_for(pool, n, grain, fn, arg);
}

/* variant 0: forward, 1: dX, 2: dW */
static void run_zt(const zt_cpu_ctx *ctx, int variant, const shape *s, const float *x,
                   const float *w, const float *dy, float *y, float *dx, float *dw)
{
    zt_status st = ZT_OK;
    if (variant == 0) st = zt_cpu_linear_forward(ctx, s->tokens, s->out, s->in, x, w, y);
    if (variant == 1) st = zt_cpu_linear_backward_input(ctx, s->tokens, s->out, s->in, dy, w, dx);
    if (variant == 2) st = zt_cpu_linear_backward_weight(ctx, s->tokens, s->out, s->in, dy, x, dw);
    if (st != ZT_OK) {
        fprintf(stderr, "zt_cpu_gemm failed: out of memory\n");
        exit(1);
    }
}

typedef struct blas_split_job {
    int variant;
    const shape *s;
    const float *x, *w, *dy;
    float *y, *dx, *dw;
} blas_split_job;

/* Column blocks of 64 of the output: disjoint, so single-threaded calls can run concurrently. */
static void blas_split_range(void *arg, int64_t begin, int64_t end)
{
    const blas_split_job *j = arg;
    int M = (int)j->s->tokens, N = (int)j->s->out, K = (int)j->s->in;
    int c0 = (int)begin * 64, c1 = (int)end * 64;
    if (j->variant == 0) {
        c1 = c1 < N ? c1 : N;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, c1 - c0, K, 1.0f, j->x, K,
                    j->w + (int64_t)c0 * K, K, 0.0f, j->y + c0, N);
    } else if (j->variant == 1) {
        c1 = c1 < K ? c1 : K;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, c1 - c0, N, 1.0f, j->dy, N,
                    j->w + c0, K, 0.0f, j->dx + c0, K);
    } else {
        c1 = c1 < K ? c1 : K;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, c1 - c0, M, 1.0f, j->dy, N,
                    j->x + c0, K, 1.0f, j->dw + c0, K);
    }
}

static void run_blas_split(const zt_cpu_ctx *ctx, int variant, const shape *s, const float *x,
                           const float *w, const float *dy, float *y, float *dx, float *dw)
{
    blas_split_job j = {variant, s, x, w, dy, y, dx, dw};
    int64_t cols = variant == 0 ? s->out : s->in;
    zt_cpu_parallel_for(ctx, (cols + 63) / 64, 1, blas_split_range, &j);
}

static void run_blas(int variant, const shape *s, const float *x, const float *w, const float *dy,
                     float *y, float *dx, float *dw)
{
    int M = (int)s->tokens, N = (int)s->out, K = (int)s->in;
    if (variant == 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
    if (variant == 1)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dy, N, w, K, 0.0f, dx, K);
    if (variant == 2)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int repeats = argc > 2 ? atoi(argv[2]) : 5;
    int zt_only = argc > 3 && strcmp(argv[3], "zt-only") == 0;
    const char *only_model = zt_only && argc > 4 ? argv[4] : NULL;
    if ((argc > 3 && !zt_only) || argc > 5 ||
        (only_model && strcmp(only_model, "tiny") != 0 && strcmp(only_model, "125m") != 0)) {
        fprintf(stderr, "usage: %s [threads] [repeats] [zt-only [tiny|125m]]\n", argv[0]);
        return 2;
    }
    /* Tokens per step of bench/cpu/run.sh: tiny 8 x 256, 125m 4 x 256. */
    const shape shapes[] = {
        {"tiny", "qkvo", 2048, 288, 288},      {"tiny", "gate/up", 2048, 768, 288},
        {"tiny", "down", 2048, 288, 768},      {"tiny", "lm_head", 2048, 32000, 288},
        {"125m", "qkvo", 1024, 768, 768},      {"125m", "gate/up", 1024, 2048, 768},
        {"125m", "down", 1024, 768, 2048},     {"125m", "lm_head", 1024, 32000, 768},
    };
    const char *variant_names[] = {"fwd", "dX", "dW"};
    zt_threadpool *pool;
    zt_error err;
    if (zt_threadpool_create(threads, &pool, &err) != ZT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    zt_cpu_ctx ctx = {pool_for, pool, 0};
    int cpu_time = zt_only && threads == 1;
    if (cpu_time) ctx.parallel_for = NULL;
    /* One implementation after the other: OpenBLAS's idle workers spin for a while after each
     * call and would steal the cores from the pool's workers if the runs were interleaved. */
    enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };
    enum { ZT, ZT_AVX2, BLAS, BLAS_SPLIT, N_LIBS };
    zt_cpu_ctx ctx_avx2 = ctx;
    ctx_avx2.no_avx512 = 1;
    double best[N_LIBS][N_SHAPES][3];
    for (int lib = 0; lib < N_LIBS; lib++) {
        openblas_set_num_threads(lib == BLAS ? threads : 1);
        for (int si = 0; si < N_SHAPES; si++) {
            const shape *s = &shapes[si];
            for (int variant = 0; variant < 3; variant++) best[lib][si][variant] = 0.0;
            if (zt_only && (lib != ZT || (only_model && strcmp(s->model, only_model) != 0)))
                continue;
            float *x = malloc(sizeof(float) * s->tokens * s->in);
            float *w = malloc(sizeof(float) * s->out * s->in);
            float *dy = malloc(sizeof(float) * s->tokens * s->out);
            float *y = malloc(sizeof(float) * s->tokens * s->out);
            float *dx = malloc(sizeof(float) * s->tokens * s->in);
            float *dw = calloc((size_t)(s->out * s->in), sizeof(float));
            if (!x || !w || !dy || !y || !dx || !dw) return 1;
            fill(x, s->tokens * s->in, 1);
            fill(w, s->out * s->in, 2);
            fill(dy, s->tokens * s->out, 3);
            for (int variant = 0; variant < 3 && repeats > 0; variant++) {
                best[lib][si][variant] = 1e30;
                for (int r = 0; r < repeats; r++) {
                    double t0 = now_s(cpu_time);
                    if (lib == ZT) run_zt(&ctx, variant, s, x, w, dy, y, dx, dw);
                    else if (lib == ZT_AVX2) run_zt(&ctx_avx2, variant, s, x, w, dy, y, dx, dw);
                    else if (lib == BLAS) run_blas(variant, s, x, w, dy, y, dx, dw);
                    else run_blas_split(&ctx, variant, s, x, w, dy, y, dx, dw);
                    double t = now_s(cpu_time) - t0;
                    if (t < best[lib][si][variant]) best[lib][si][variant] = t;
                }
            }
            free(x); free(w); free(dy); free(y); free(dx); free(dw);
        }
    }
    printf("threads %d, best of %d (ms %s per call)\n%-5s %-8s %-4s %22s %8s %8s %8s %8s %8s\n",
           threads, repeats, cpu_time ? "of CPU time, serial," : "wall", "model", "matrix", "op",
           "M x N x K", "zt", "zt-avx2", "blas", "blas-1t", "zt/blas");
    double total[2][N_LIBS] = {{0}};
    for (int si = 0; si < N_SHAPES; si++) {
        const shape *s = &shapes[si];
        for (int variant = 0; variant < 3; variant++) {
            int model = s->model[0] == 't' ? 0 : 1;
            for (int lib = 0; lib < N_LIBS; lib++) total[model][lib] += best[lib][si][variant];
            int64_t m = variant == 2 ? s->out : s->tokens, n = variant == 0 ? s->out : s->in;
            int64_t k = variant == 0 ? s->in : variant == 1 ? s->out : s->tokens;
            char dims[64];
            snprintf(dims, sizeof dims, "%lld x %lld x %lld", (long long)m, (long long)n, (long long)k);
            printf("%-5s %-8s %-4s %22s %8.2f %8.2f %8.2f %8.2f %8.2f\n", s->model, s->name,
                   variant_names[variant], dims, 1e3 * best[ZT][si][variant],
                   1e3 * best[ZT_AVX2][si][variant], 1e3 * best[BLAS][si][variant],
                   1e3 * best[BLAS_SPLIT][si][variant],
                   best[BLAS][si][variant] > 0 ? best[ZT][si][variant] / best[BLAS][si][variant]
                                               : 0.0);
        }
    }
    for (int model = 0; model < 2; model++)
        printf("%s, all shapes (ms): zt %.1f, zt-avx2 %.1f, blas %.1f, blas-1t %.1f\n",
               model ? "125m" : "tiny", 1e3 * total[model][ZT], 1e3 * total[model][ZT_AVX2],
               1e3 * total[model][BLAS], 1e3 * total[model][BLAS_SPLIT]);
    zt_threadpool_destroy(pool);
    return 0;
}
