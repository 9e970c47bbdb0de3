#include "kernel_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/threadpool.h"

#ifndef FIXTURE_DIR
#error "FIXTURE_DIR must point at tests/reference/fixtures"
#endif

static void die(const char *msg)
{
    fprintf(stderr, "%s\n", msg);
    exit(1);
}

static char *read_text(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "%s: cannot open (run tests/reference/make_fixtures.py?)\n", path);
        exit(1);
    }
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (!text || fread(text, 1, (size_t)n, fp) != (size_t)n) die("read failed");
    text[n] = 0;
    fclose(fp);
    return text;
}

void fixture_load(fixture *f, const char *rel)
{
    char path[1024];
    zt_error err;
    snprintf(path, sizeof path, "%s/%s.safetensors", FIXTURE_DIR, rel);
    if (ref_st_open(path, &f->tensors, &err) != ZT_OK) die(err.msg);
    snprintf(path, sizeof path, "%s/%s.json", FIXTURE_DIR, rel);
    f->json_text = read_text(path);
    if (zt_json_parse(f->json_text, strlen(f->json_text), path, &f->json, &err) != ZT_OK) die(err.msg);
}

void fixture_free(fixture *f)
{
    ref_st_close(&f->tensors);
    zt_json_free(&f->json);
    free(f->json_text);
}

float *fixture_f32(const fixture *f, const char *name, int64_t *numel)
{
    float *x;
    zt_error err;
    if (ref_st_read_f32(&f->tensors, name, 0, NULL, &x, &err) != ZT_OK) die(err.msg);
    if (numel) *numel = ref_st_find(&f->tensors, name)->numel;
    return x;
}

int32_t *fixture_i32(const fixture *f, const char *name, int64_t *numel)
{
    int32_t *x;
    zt_error err;
    if (ref_st_read_i32(&f->tensors, name, 0, NULL, &x, &err) != ZT_OK) die(err.msg);
    if (numel) *numel = ref_st_find(&f->tensors, name)->numel;
    return x;
}

double fixture_number(const fixture *f, const char *key)
{
    int tok = zt_json_object_get(&f->json, 0, key);
    if (tok < 0 || !zt_json_is_number(&f->json, tok)) {
        fprintf(stderr, "%s: no number \"%s\"\n", f->json.origin, key);
        exit(1);
    }
    return zt_json_get_number(&f->json, tok);
}

int check_close_rows(const char *what, const float *got, const float *want, int64_t rows,
                     int64_t cols, double rtol)
{
    int64_t worst = 0, bad = 0;
    double worst_ratio = -1.0, worst_rms = 0.0;
    for (int64_t row = 0; row < rows; row++) {
        const float *g = got + row * cols, *w = want + row * cols;
        double sum_sq = 0.0;
        for (int64_t i = 0; i < cols; i++) sum_sq += (double)w[i] * w[i];
        double rms = cols ? sqrt(sum_sq / (double)cols) : 0.0;
        for (int64_t i = 0; i < cols; i++) {
            double scale = fabs(w[i]) > rms ? fabs(w[i]) : rms;
            double err = fabs((double)g[i] - w[i]);
            double ratio = isnan(g[i]) ? INFINITY : scale > 0 ? err / scale : err;
            if (!(ratio <= rtol)) bad++;
            if (ratio > worst_ratio) {
                worst = row * cols + i;
                worst_ratio = ratio;
                worst_rms = rms;
            }
        }
    }
    if (bad == 0) return 1;
    fprintf(stderr,
            "%s: %lld of %lld elements differ by more than %g relative; worst [%lld] (row rms "
            "%g): got %.9g, want %.9g (error %.3g of its scale)\n",
            what, (long long)bad, (long long)(rows * cols), rtol, (long long)worst, worst_rms,
            got[worst], want[worst], worst_ratio);
    return 0;
}

int check_close_f32(const char *what, const float *got, const float *want, int64_t n, double rtol)
{
    return check_close_rows(what, got, want, 1, n, rtol);
}

int check_identical_f32(const char *what, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            fprintf(stderr, "%s: serial and threaded results differ at [%lld]: %.9g vs %.9g\n",
                    what, (long long)i, a[i], b[i]);
            return 0;
        }
    }
    return 1;
}

float *poisoned(int64_t n)
{
    float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!x) die("out of memory");
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

float *copy_f32(const float *x, int64_t n)
{
    float *y = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!y) die("out of memory");
    memcpy(y, x, sizeof(float) * (size_t)n);
    return y;
}

static zt_threadpool *pool;
static zt_cpu_ctx pool_ctx, pool_no_avx512_ctx;

static void pool_parallel_for(void *p, int64_t n, int64_t grain, zt_range_fn fn, void *arg)
{
    zt_threadpool_parallel_for(p, n, grain, fn, arg);
}

const zt_cpu_ctx *serial_ctx(void)
{
    static const zt_cpu_ctx serial = {NULL, NULL, 0};
    return &serial;
}

const zt_cpu_ctx *threaded_ctx(void)
{
    if (!pool) {
        zt_error err;
        if (zt_threadpool_create(3, &pool, &err) != ZT_OK) die(err.msg);
        pool_ctx.parallel_for = pool_parallel_for;
        pool_ctx.pool = pool;
        pool_no_avx512_ctx = pool_ctx;
        pool_no_avx512_ctx.no_avx512 = 1;
    }
    return &pool_ctx;
}

const zt_cpu_ctx *threaded_no_avx512_ctx(void)
{
    threaded_ctx();
    return &pool_no_avx512_ctx;
}

void test_contexts_free(void)
{
    if (pool) zt_threadpool_destroy(pool);
    pool = NULL;
}
