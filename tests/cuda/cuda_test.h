/* Helpers of the CUDA kernel tests: device detection (skip without a GPU), fresh random inputs
 * rounded to bf16 so the CPU reference sees exactly what the GPU sees, device buffers poisoned with
 * NaN before every run, and relative-L2 comparisons against the CPU kernels (kernels/cpu). */
#ifndef ZT_TESTS_CUDA_TEST_H
#define ZT_TESTS_CUDA_TEST_H

#include <stdint.h>
#include "zt/zt_types.h"
#include "cpu/kernels.h"
#include "cuda/kernels_cuda.h"

/* Exits 77 with "SKIP: no CUDA device ..." when there is no usable GPU; otherwise selects device 0,
 * seeds the generator (ZT_TEST_SEED, or the clock; printed so a failure can be replayed) and
 * prints the device's name. */
void cuda_test_init(const char *test_name);

/* Context with `scratch_bytes` of scratch (0: 256 MiB), computing in the current 16-bit type (below);
 * exits on failure. */
zt_cuda_ctx *cuda_test_ctx(uint64_t scratch_bytes);

/* The 16-bit type the tests run in: ZT_BF16 (default) or ZT_F16 (the fp16 pass). The *_bf16 helpers
 * below (round_to_bf16, random_bf16_values, device_bf16, download_bf16) round to, upload and decode
 * that type, cuda_test_ctx's contexts compute in it, and TOL_BF16_OUT / TOL_BF16_CHAIN are its
 * tolerances. Set it before creating contexts. */
void cuda_test_set_dtype16(int32_t dtype);
int32_t cuda_test_dtype16(void);
const char *cuda_test_dtype16_name(void);
double cuda_test_tol_out(void);
double cuda_test_tol_chain(void);

/* ---- host data ------------------------------------------------------------------------------- */

uint64_t test_random_u64(void);
/* uniform in [lo, hi) */
float test_uniform(float lo, float hi);
int32_t test_randint(int32_t lo, int32_t hi); /* [lo, hi) */
/* malloc'd n floats, uniform in [-scale, scale), rounded to bf16-representable values. */
float *random_bf16_values(int64_t n, float scale);
/* malloc'd n floats, uniform in [-scale, scale) (full fp32). */
float *random_f32(int64_t n, float scale);
float *host_f32(int64_t n); /* malloc'd, exits on failure */
void round_to_bf16(float *x, int64_t n);

/* ---- attention plugin inputs (tests/gpu) ------------------------------------------------------ */

/* A contiguous [B, T, heads, D] view of device memory, the layout the attention plugins take. */
zt_tensor attention_view(void *data, int32_t dtype, int64_t B, int64_t T, int64_t heads, int64_t D);
/* malloc'd [B, T] document ids: row 0 holds documents of 1 to 40 tokens back to back; every other row
 * one document, then padding (-1) over its last quarter. */
int32_t *packed_doc_ids(int64_t B, int64_t T);

/* ---- device buffers -------------------------------------------------------------------------- */

/* cudaMalloc'd and filled with 0xff bytes (NaN in fp32 and bf16); exits on failure. */
void *device_alloc(uint64_t bytes);
void device_poison(void *p, uint64_t bytes);
/* Device bf16 copy of n floats (rounded to nearest even). */
uint16_t *device_bf16(const float *x, int64_t n);
float *device_f32(const float *x, int64_t n);
int32_t *device_i32(const int32_t *x, int64_t n);
/* Waits for the device (checking for asynchronous errors), then copies back. */
float *download_bf16(const uint16_t *d, int64_t n);
float *download_f32(const float *d, int64_t n);
void device_free(void *p);

/* ---- checks ---------------------------------------------------------------------------------- */

/* Every check prints what it compared and returns 1 when it passes, 0 when it fails: wrap it in
 * ZT_CHECK so the test fails and shows the line.
 * check_rel_l2 prints "<what>: rel L2 error <e> (tolerance <tol>)" and fails when e > tol, when got
 * holds a NaN or an infinity (an element the kernel never wrote stays NaN), or when ref is all
 * zeros but got is not. */
int check_rel_l2(const char *what, const float *got, const float *ref, int64_t n, double tol);
/* Bitwise equality of two float arrays (determinism); prints the first difference. */
int check_identical(const char *what, const float *a, const float *b, int64_t n);
/* st must be ZT_OK; otherwise prints zt_cuda_last_error(). */
int check_ok(const char *what, zt_status st);
/* The call must fail with `want` and its message must contain `needle`. */
int check_fails(const char *what, zt_status st, zt_status want, const char *needle);

/* Tolerances (relative L2 error), see docs/cuda.md. */
#define TOL_F32 1e-5    /* fp32 arithmetic on identical inputs, different summation order */
#define TOL_BF16_OUT_VALUE 8e-3 /* one rounding of the result to bf16 (2^-9 relative, ~3e-3 rms) */
#define TOL_BF16_CHAIN_VALUE 1.5e-2 /* bf16 intermediates feeding further products (P, dS, dlogits) */
/* fp16 has a 10-bit mantissa (bf16: 7): one rounding is 2^-11 relative at most, ~3e-4 rms */
#define TOL_F16_OUT_VALUE 1e-3
#define TOL_F16_CHAIN_VALUE 2e-3 /* fp16 intermediates feeding further products */
/* The current 16-bit type's (cuda_test_set_dtype16): bf16's values unless the fp16 pass runs. */
#define TOL_BF16_OUT (cuda_test_tol_out())
#define TOL_BF16_CHAIN (cuda_test_tol_chain())

#endif
