/* Internal helpers shared by the kernel sources (not part of the kernel API).
 *
 * Vectorization strategy (docs/kernels.md): plain C that GCC/Clang vectorize at the x86-64 baseline
 * (SSE2), plus GCC vector extensions for the loops the compiler will not vectorize on its own (float
 * reductions, the GEMM micro-kernel). The hot functions are compiled several times with
 * target_clones and the loader picks the best clone for the CPU it runs on, so the binary stays
 * portable (no -march=native) and still uses AVX2/FMA or AVX-512 where available.
 */
#ifndef ZT_KERNELS_CPU_SIMD_H
#define ZT_KERNELS_CPU_SIMD_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__)
#define ZT_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ZT_CPU_CLONES
#endif

#define ZT_CPU_INLINE static inline __attribute__((always_inline))

/* Eight floats; at the baseline the compiler lowers each operation to two SSE instructions. */
typedef float zt_v8 __attribute__((vector_size(32)));

typedef int32_t zt_v8i __attribute__((vector_size(32)));

ZT_CPU_INLINE zt_v8 zt_v8_splat(float s) { return (zt_v8){s, s, s, s, s, s, s, s}; }

ZT_CPU_INLINE zt_v8 zt_v8_load(const float *p)
{
    zt_v8 v;
    memcpy(&v, p, sizeof v); /* unaligned load */
    return v;
}

ZT_CPU_INLINE void zt_v8_store(float *p, zt_v8 v) { memcpy(p, &v, sizeof v); }

/* The first n < 8 lanes from / to memory (the rest read as 0), for loop tails. */
ZT_CPU_INLINE zt_v8 zt_v8_load_partial(const float *p, int64_t n)
{
    zt_v8 v = {0};
    memcpy(&v, p, sizeof(float) * (size_t)n);
    return v;
}

ZT_CPU_INLINE void zt_v8_store_partial(float *p, zt_v8 v, int64_t n)
{
    memcpy(p, &v, sizeof(float) * (size_t)n);
}

ZT_CPU_INLINE float zt_v8_sum(zt_v8 v)
{
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* mask ? a : b, lane by lane (C has no vector ?:). */
ZT_CPU_INLINE zt_v8 zt_v8_select(zt_v8i mask, zt_v8 a, zt_v8 b)
{
    return (zt_v8)((mask & (zt_v8i)a) | (~mask & (zt_v8i)b));
}

/* exp(x) with at most ~1.5 ulp error (Cody-Waite reduction to |r| <= ln2/2, Cephes polynomial),
 * vectorizable unlike libm's expf. Inputs are clamped to [-87, 88]: below, the result is 1.6e-38
 * instead of a denormal or zero (negligible next to the 1 that softmax's max term contributes);
 * above, exp(88) = 1.65e38 instead of overflowing. NaN stays NaN. */
ZT_CPU_INLINE zt_v8 zt_v8_exp(zt_v8 input)
{
    const zt_v8 lo = zt_v8_splat(-87.0f), hi = zt_v8_splat(88.0f);
    zt_v8i is_number = input == input;
    /* NaN lanes compute exp(0) (converting NaN to int would be undefined) and are restored below. */
    zt_v8 x = zt_v8_select(is_number, input, zt_v8_splat(0.0f));
    x = zt_v8_select(x < lo, lo, x);
    x = zt_v8_select(x > hi, hi, x);
    /* n = round(x / ln2): adding 1.5 * 2^23 leaves no fraction bits, so the sum rounds. */
    const zt_v8 round_magic = zt_v8_splat(12582912.0f);
    zt_v8 n = (x * 1.44269504088896341f + round_magic) - round_magic;
    zt_v8 r = x - n * 0.693359375f; /* ln2 split in two so that n * ln2_hi is exact */
    r = r - n * -2.12194440e-4f;
    zt_v8 p = zt_v8_splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    zt_v8i two_to_n = (__builtin_convertvector(n, zt_v8i) + 127) << 23; /* 2^n as float bits */
    return zt_v8_select(is_number, p * (zt_v8)two_to_n, input);
}

/* y[i] = exp(x[i] - shift) for i < n (y may equal x); returns the sum of the y[i]. */
ZT_CPU_INLINE float zt_exp_shifted(const float *x, float shift, float *y, int64_t n)
{
    zt_v8 sum = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        zt_v8 e = zt_v8_exp(zt_v8_load(x + i) - shift);
        zt_v8_store(y + i, e);
        sum += e;
    }
    float total = zt_v8_sum(sum);
    if (i < n) {
        zt_v8 e = zt_v8_exp(zt_v8_load_partial(x + i, n - i) - shift);
        zt_v8_store_partial(y + i, e, n - i);
        for (int64_t l = 0; l < n - i; l++) total += e[l];
    }
    return total;
}

/* Largest of x[0, n), n >= 1. */
ZT_CPU_INLINE float zt_max(const float *x, int64_t n)
{
    float m = x[0];
    int64_t i = 0;
    if (n >= 8) {
        zt_v8 vm = zt_v8_load(x);
        for (i = 8; i + 8 <= n; i += 8) {
            zt_v8 v = zt_v8_load(x + i);
            vm = zt_v8_select(v > vm, v, vm);
        }
        for (int l = 0; l < 8; l++) m = vm[l] > m ? vm[l] : m;
    }
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* Dot product with four independent vector accumulators (a plain loop would be one serial chain:
 * compilers may not reorder float additions). */
ZT_CPU_INLINE float zt_dot(const float *a, const float *b, int64_t n)
{
    zt_v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 += zt_v8_load(a + i) * zt_v8_load(b + i);
        s1 += zt_v8_load(a + i + 8) * zt_v8_load(b + i + 8);
        s2 += zt_v8_load(a + i + 16) * zt_v8_load(b + i + 16);
        s3 += zt_v8_load(a + i + 24) * zt_v8_load(b + i + 24);
    }
    for (; i + 8 <= n; i += 8) s0 += zt_v8_load(a + i) * zt_v8_load(b + i);
    float s = zt_v8_sum((s0 + s1) + (s2 + s3));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* sum of a[i] * b[i] * c[i], same structure as zt_dot. */
ZT_CPU_INLINE float zt_dot3(const float *a, const float *b, const float *c, int64_t n)
{
    zt_v8 s0 = {0}, s1 = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 += zt_v8_load(a + i) * zt_v8_load(b + i) * zt_v8_load(c + i);
        s1 += zt_v8_load(a + i + 8) * zt_v8_load(b + i + 8) * zt_v8_load(c + i + 8);
    }
    for (; i + 8 <= n; i += 8) s0 += zt_v8_load(a + i) * zt_v8_load(b + i) * zt_v8_load(c + i);
    float s = zt_v8_sum(s0 + s1);
    for (; i < n; i++) s += a[i] * b[i] * c[i];
    return s;
}

/* y[i] += a * x[i] */
ZT_CPU_INLINE void zt_axpy(float *restrict y, float a, const float *restrict x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

#endif
