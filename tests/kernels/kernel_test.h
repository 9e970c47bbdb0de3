/* Shared helpers of the kernel tests: reference fixtures (tests/reference/fixtures, written by
 * make_fixtures.py with PyTorch), tolerance checks that report the worst element, NaN poisoning,
 * and a kernel context backed by the host's thread pool. */
#ifndef ZT_TESTS_KERNEL_TEST_H
#define ZT_TESTS_KERNEL_TEST_H

#include <stdint.h>
#include "cpu/kernels.h"
#include "base/json.h"
#include "safetensors_min.h"

/* One <name>.safetensors + <name>.json pair. */
typedef struct fixture {
    ref_st_file tensors;
    char *json_text;
    zt_json json;
} fixture;

/* Loads FIXTURE_DIR/<rel>.safetensors and .json; exits the test with a message on failure. */
void fixture_load(fixture *f, const char *rel);
void fixture_free(fixture *f);
/* Tensor or scalar by name; exits with a message when missing. Arrays are malloc'd. */
float *fixture_f32(const fixture *f, const char *name, int64_t *numel);
int32_t *fixture_i32(const fixture *f, const char *name, int64_t *numel);
double fixture_number(const fixture *f, const char *key);

/* Every element of got must satisfy |got - want| <= rtol * max(|want|, rms(want's row)) for rows
 * of `cols` elements: relative for elements of typical size, relative to the row's RMS for those
 * near zero (where fp32 cancellation leaves only absolute accuracy). Rows are the natural unit
 * (a token's hidden vector, a head, a weight's output row): their scales can differ by orders of
 * magnitude. NaN fails. Returns 1 when close; otherwise prints the worst element and returns 0
 * (wrap in ZT_CHECK so the test fails and shows the line). */
int check_close_rows(const char *what, const float *got, const float *want, int64_t rows,
                     int64_t cols, double rtol);
/* The same with the whole array as one row (scalars per row, vectors). */
int check_close_f32(const char *what, const float *got, const float *want, int64_t n, double rtol);
/* Bitwise equality (serial vs threaded runs must agree exactly); 1 when equal. */
int check_identical_f32(const char *what, const float *a, const float *b, int64_t n);

/* malloc'd array of n NaNs: outputs start poisoned so an element a kernel forgets stays NaN. */
float *poisoned(int64_t n);
/* malloc'd copy */
float *copy_f32(const float *x, int64_t n);

/* Kernel contexts: serial (no pool) and one backed by a 3-thread zt_threadpool (3 so that ranges
 * are uneven). */
const zt_cpu_ctx *serial_ctx(void);
const zt_cpu_ctx *threaded_ctx(void);
/* Threaded, with the GEMM's AVX-512 kernel disabled (on CPUs without AVX-512 the same as
 * threaded_ctx): run GEMM tests with both. */
const zt_cpu_ctx *threaded_no_avx512_ctx(void);
void test_contexts_free(void);

#endif
