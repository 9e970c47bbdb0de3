/* Minimal assertions for zt's C tests. A failed check prints file:line and the values, and the test
 * exits non-zero at the end; ZT_SKIP exits with 77, which ctest reports as skipped
 * (set_tests_properties(... SKIP_RETURN_CODE 77)). */
#ifndef ZT_TEST_H
#define ZT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int zt_test_failures = 0;

#define ZT_CHECK(cond)                                                                        \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);          \
            zt_test_failures++;                                                               \
        }                                                                                     \
    } while (0)

#define ZT_CHECK_INT(a, b)                                                                    \
    do {                                                                                      \
        long long zt_a_ = (long long)(a), zt_b_ = (long long)(b);                             \
        if (zt_a_ != zt_b_) {                                                                 \
            fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__,   \
                    #a, zt_a_, #b, zt_b_);                                                    \
            zt_test_failures++;                                                               \
        }                                                                                     \
    } while (0)

/* Relative closeness: |a-b| <= rtol * max(|a|,|b|) + atol */
#define ZT_CHECK_CLOSE(a, b, rtol, atol)                                                      \
    do {                                                                                      \
        double zt_a_ = (double)(a), zt_b_ = (double)(b);                                      \
        double zt_m_ = fabs(zt_a_) > fabs(zt_b_) ? fabs(zt_a_) : fabs(zt_b_);                 \
        if (!(fabs(zt_a_ - zt_b_) <= (rtol) * zt_m_ + (atol))) {                              \
            fprintf(stderr, "%s:%d: %s = %.9g not close to %s = %.9g\n", __FILE__, __LINE__,  \
                    #a, zt_a_, #b, zt_b_);                                                    \
            zt_test_failures++;                                                               \
        }                                                                                     \
    } while (0)

/* `haystack` must contain `needle` (used to assert error messages). */
#define ZT_CHECK_CONTAINS(haystack, needle)                                                   \
    do {                                                                                      \
        const char *zt_h_ = (haystack), *zt_n_ = (needle);                                    \
        if (!zt_h_ || !strstr(zt_h_, zt_n_)) {                                                \
            fprintf(stderr, "%s:%d: expected \"%s\" in:\n%s\n", __FILE__, __LINE__, zt_n_,    \
                    zt_h_ ? zt_h_ : "(null)");                                                \
            zt_test_failures++;                                                               \
        }                                                                                     \
    } while (0)

/* cond, or a failure with a message of its own (printf arguments). In a test whose ranks print
 * together (mpirun), the line starts "rank R: " once zt_test_set_rank(R) has been called. */
static int zt_test_rank_ = -1;
static inline void zt_test_set_rank(int rank) { zt_test_rank_ = rank; }

#define ZT_CHECK_MSG(cond, ...)                                                               \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            if (zt_test_rank_ >= 0) fprintf(stderr, "rank %d: ", zt_test_rank_);              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                              \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
            zt_test_failures++;                                                               \
        }                                                                                     \
    } while (0)

#define ZT_SKIP(...)                                                                          \
    do {                                                                                      \
        fprintf(stderr, "SKIP: " __VA_ARGS__);                                                \
        fprintf(stderr, "\n");                                                                \
        exit(77);                                                                             \
    } while (0)

static inline int zt_test_result(void)
{
    if (zt_test_failures) fprintf(stderr, "%d check(s) failed\n", zt_test_failures);
    return zt_test_failures ? 1 : 0;
}

#endif
