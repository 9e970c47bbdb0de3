#include "cuda_test.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state;
static int32_t dtype16 = ZT_BF16; /* what the *_bf16 helpers round to, upload and download */

void cuda_test_set_dtype16(int32_t dtype) { dtype16 = dtype == ZT_F16 ? ZT_F16 : ZT_BF16; }
int32_t cuda_test_dtype16(void) { return dtype16; }
const char *cuda_test_dtype16_name(void) { return dtype16 == ZT_F16 ? "fp16" : "bf16"; }

double cuda_test_tol_out(void) { return dtype16 == ZT_F16 ? TOL_F16_OUT_VALUE : TOL_BF16_OUT_VALUE; }
double cuda_test_tol_chain(void) { return dtype16 == ZT_F16 ? TOL_F16_CHAIN_VALUE : TOL_BF16_CHAIN_VALUE; }

static void to16(const float *x, uint16_t *out, int64_t n)
{
    if (dtype16 == ZT_F16) zt_cuda_f16_from_f32_host(x, out, n);
    else zt_cuda_bf16_from_f32_host(x, out, n);
}

static void from16(const uint16_t *in, float *x, int64_t n)
{
    if (dtype16 == ZT_F16) zt_cuda_f32_from_f16_host(in, x, n);
    else zt_cuda_f32_from_bf16_host(in, x, n);
}

static void die(const char *fmt, const char *detail)
{
    fprintf(stderr, fmt, detail);
    fprintf(stderr, "\n");
    exit(1);
}

static void check_cuda(const char *what, cudaError_t e)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "%s failed: %s (%s)\n", what, cudaGetErrorString(e), cudaGetErrorName(e));
        exit(1);
    }
}

void cuda_test_init(const char *test_name)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        fprintf(stderr, "SKIP: no CUDA device (cudaGetDeviceCount: %s); %s runs on a GPU machine "
                        "(scripts/gpu.sh)\n", cudaGetErrorString(e), test_name);
        exit(77);
    }
    if (count == 0) {
        fprintf(stderr, "SKIP: no CUDA device (cudaGetDeviceCount found 0); %s runs on a GPU "
                        "machine (scripts/gpu.sh)\n", test_name);
        exit(77);
    }
    check_cuda("cudaSetDevice(0)", cudaSetDevice(0));
    struct cudaDeviceProp prop;
    check_cuda("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, 0));
    const char *seed_text = getenv("ZT_TEST_SEED");
    uint64_t seed = seed_text ? strtoull(seed_text, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    rng_state = seed ? seed : 1;
    printf("%s on %s (sm_%d%d); ZT_TEST_SEED=%" PRIu64 " replays these inputs\n", test_name,
           prop.name, prop.major, prop.minor, seed);
}

zt_cuda_ctx *cuda_test_ctx(uint64_t scratch_bytes)
{
    zt_cuda_ctx *ctx;
    if (zt_cuda_ctx_create(0, scratch_bytes ? scratch_bytes : 256ull << 20, &ctx) != ZT_OK)
        die("zt_cuda_ctx_create: %s", zt_cuda_last_error());
    if (zt_cuda_ctx_set_dtype(ctx, dtype16) != ZT_OK) die("zt_cuda_ctx_set_dtype: %s", zt_cuda_last_error());
    return ctx;
}

/* ---- host data ------------------------------------------------------------------------------- */

uint64_t test_random_u64(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

float test_uniform(float lo, float hi)
{
    double unit = (double)(test_random_u64() >> 11) / 9007199254740992.0; /* [0, 1) */
    return (float)(lo + (hi - lo) * unit);
}

int32_t test_randint(int32_t lo, int32_t hi)
{
    return lo + (int32_t)(test_random_u64() % (uint64_t)(hi - lo));
}

float *host_f32(int64_t n)
{
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!x) die("out of host memory%s", "");
    return x;
}

void round_to_bf16(float *x, int64_t n)
{
    uint16_t *tmp = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    if (!tmp) die("out of host memory%s", "");
    to16(x, tmp, n);
    from16(tmp, x, n);
    free(tmp);
}

float *random_f32(int64_t n, float scale)
{
    float *x = host_f32(n);
    for (int64_t i = 0; i < n; i++) x[i] = test_uniform(-scale, scale);
    return x;
}

float *random_bf16_values(int64_t n, float scale)
{
    float *x = random_f32(n, scale);
    round_to_bf16(x, n);
    return x;
}

/* ---- device buffers -------------------------------------------------------------------------- */

void *device_alloc(uint64_t bytes)
{
    void *p = NULL;
    check_cuda("cudaMalloc", cudaMalloc(&p, bytes ? bytes : 1));
    device_poison(p, bytes);
    return p;
}

void device_poison(void *p, uint64_t bytes)
{
    check_cuda("cudaMemset (poison)", cudaMemset(p, 0xff, bytes));
}

uint16_t *device_bf16(const float *x, int64_t n)
{
    uint16_t *tmp = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    if (!tmp) die("out of host memory%s", "");
    to16(x, tmp, n);
    uint16_t *d = device_alloc(sizeof(uint16_t) * (uint64_t)n);
    check_cuda("cudaMemcpy (upload)", cudaMemcpy(d, tmp, sizeof(uint16_t) * (size_t)n,
                                                 cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

float *device_f32(const float *x, int64_t n)
{
    float *d = device_alloc(sizeof(float) * (uint64_t)n);
    check_cuda("cudaMemcpy (upload)", cudaMemcpy(d, x, sizeof(float) * (size_t)n,
                                                 cudaMemcpyHostToDevice));
    return d;
}

int32_t *device_i32(const int32_t *x, int64_t n)
{
    int32_t *d = device_alloc(sizeof(int32_t) * (uint64_t)n);
    check_cuda("cudaMemcpy (upload)", cudaMemcpy(d, x, sizeof(int32_t) * (size_t)n,
                                                 cudaMemcpyHostToDevice));
    return d;
}

float *download_bf16(const uint16_t *d, int64_t n)
{
    check_cuda("kernels (cudaDeviceSynchronize)", cudaDeviceSynchronize());
    uint16_t *tmp = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    if (!tmp) die("out of host memory%s", "");
    check_cuda("cudaMemcpy (download)", cudaMemcpy(tmp, d, sizeof(uint16_t) * (size_t)n,
                                                   cudaMemcpyDeviceToHost));
    float *x = host_f32(n);
    from16(tmp, x, n);
    free(tmp);
    return x;
}

float *download_f32(const float *d, int64_t n)
{
    check_cuda("kernels (cudaDeviceSynchronize)", cudaDeviceSynchronize());
    float *x = host_f32(n);
    check_cuda("cudaMemcpy (download)", cudaMemcpy(x, d, sizeof(float) * (size_t)n,
                                                   cudaMemcpyDeviceToHost));
    return x;
}

void device_free(void *p) { cudaFree(p); }

/* ---- checks ---------------------------------------------------------------------------------- */

int check_rel_l2(const char *what, const float *got, const float *ref, int64_t n, double tol)
{
    double diff = 0.0, norm = 0.0;
    int64_t bad = -1, worst = 0;
    double worst_abs = -1.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            if (bad < 0) bad = i;
            continue;
        }
        double d = (double)got[i] - (double)ref[i];
        diff += d * d;
        norm += (double)ref[i] * ref[i];
        if (fabs(d) > worst_abs) {
            worst_abs = fabs(d);
            worst = i;
        }
    }
    if (bad >= 0) {
        printf("FAIL %s: element %" PRId64 " is %g (not finite: never written, or overflow)\n",
               what, bad, (double)got[bad]);
        return 0;
    }
    double err = norm > 0.0 ? sqrt(diff / norm) : sqrt(diff);
    int pass = err <= tol;
    printf("%s %s: rel L2 error %.3g (tolerance %.3g); largest difference %.3g at %" PRId64
           " (got %.6g, want %.6g)\n",
           pass ? "ok  " : "FAIL", what, err, tol, worst_abs, worst, n ? (double)got[worst] : 0.0,
           n ? (double)ref[worst] : 0.0);
    return pass;
}

int check_identical(const char *what, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            printf("FAIL %s: element %" PRId64 " differs between runs: %.9g vs %.9g\n", what, i,
                   (double)a[i], (double)b[i]);
            return 0;
        }
    }
    printf("ok   %s: identical (%" PRId64 " elements)\n", what, n);
    return 1;
}

int check_ok(const char *what, zt_status st)
{
    if (st == ZT_OK) return 1;
    printf("FAIL %s: status %d: %s\n", what, (int)st, zt_cuda_last_error());
    return 0;
}

int check_fails(const char *what, zt_status st, zt_status want, const char *needle)
{
    const char *msg = zt_cuda_last_error();
    if (st != want) {
        printf("FAIL %s: status %d, expected %d (message: %s)\n", what, (int)st, (int)want, msg);
        return 0;
    }
    if (!strstr(msg, needle)) {
        printf("FAIL %s: message lacks \"%s\": %s\n", what, needle, msg);
        return 0;
    }
    printf("ok   %s: %s\n", what, msg);
    return 1;
}

zt_tensor attention_view(void *data, int32_t dtype, int64_t B, int64_t T, int64_t heads, int64_t D)
{
    zt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device_type = ZT_DEVICE_CUDA;
    t.ndim = 4;
    t.shape[0] = B, t.shape[1] = T, t.shape[2] = heads, t.shape[3] = D;
    t.stride[3] = 1, t.stride[2] = D, t.stride[1] = heads * D, t.stride[0] = T * heads * D;
    return t;
}

int32_t *packed_doc_ids(int64_t B, int64_t T)
{
    int32_t *doc = malloc(sizeof(int32_t) * (size_t)(B * T));
    if (!doc) {
        fprintf(stderr, "out of memory for %lld document ids\n", (long long)(B * T));
        exit(1);
    }
    for (int64_t b = 0; b < B; b++) {
        int32_t id = 0, left = test_randint(1, 41);
        int64_t padding_from = b == 0 ? T : T - T / 4;
        for (int64_t t = 0; t < T; t++) {
            if (b == 0 && left-- == 0) {
                id++;
                left = test_randint(1, 41) - 1;
            }
            doc[b * T + t] = t >= padding_from ? -1 : id;
        }
    }
    return doc;
}
