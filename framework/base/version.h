/* Version numbers of the libraries and drivers zt depends on: parsing ("2.18.3", "v4.1.6", "13.0"),
 * the integer codes the libraries report (CUDA's 13000, NCCL's 22809), comparison, and the one
 * wording of a minimum-version check that zt-run --env and a run refusing to start share:
 * "ok: 2.28.9 (need 2.14 or newer)" or "too old: need 2.14, have 2.12.12 (why)". */
#ifndef ZT_FRAMEWORK_VERSION_H
#define ZT_FRAMEWORK_VERSION_H

#include <stddef.h>

typedef struct zt_version {
    int major, minor, patch;
    int parts; /* how many were given (1 to 3): formatting shows as many */
} zt_version;

/* [v]MAJOR[.MINOR[.PATCH]], optionally followed by text that starts with neither a digit nor a dot
 * ("2.18.3+cuda12.2", "4.1.6 (Debian)"); each number below 10^6. 1 when `text` is one, else 0 and
 * *out is zeroed. */
int zt_version_parse(const char *text, zt_version *out);

/* CUDA's integer versions (cudaRuntimeGetVersion, cuDriverGetVersion): 1000 * major + 10 * minor. */
zt_version zt_version_of_cuda(int code);
/* NCCL_VERSION_CODE / ncclGetVersion: major * 10000 + minor * 100 + patch since NCCL 2.9, major *
 * 1000 + minor * 100 + patch before. */
zt_version zt_version_of_nccl(int code);

/* <0, 0, >0 as a is older than, the same as, newer than b; missing parts count as 0 (2.14 == 2.14.0). */
int zt_version_compare(zt_version a, zt_version b);

/* "2.14", "2.18.3": as many parts as were given. Returns out. */
const char *zt_version_format(zt_version v, char *out, size_t cap);

/* The verdict on `have` against the minimum `need`: "ok: HAVE (need NEED or newer)", or "too old:
 * need NEED, have HAVE (WHY)". Returns 1 when have >= need. */
int zt_version_verdict(zt_version have, zt_version need, const char *why, char *out, size_t cap);

#endif
