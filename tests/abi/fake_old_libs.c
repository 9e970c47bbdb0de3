/* Stand-ins for libraries too old for zt, so tests/abi/env.sh can check zt-run --env's verdicts and a
 * launch's refusal on a machine without them (put their folder first on LD_LIBRARY_PATH). Built three
 * times (tests/abi/CMakeLists.txt):
 *   FAKE_CUDA  libcuda.so.1: a driver for CUDA 12.4 with two GPUs, compute capability 7.0 and 8.0
 *   FAKE_NCCL  libnccl.so.2: NCCL 2.12.12 (before ncclCommInitRankConfig)
 *   FAKE_MPI   libmpi.so.40: an MPI-2.2 library, with no MPI-3 call at all
 * Only what zt's version checks call is here. */
#include <stddef.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

#if defined(FAKE_CUDA)
enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_NOT_FOUND = 500 };
EXPORT int cuInit(unsigned flags)
{
    (void)flags;
    return CUDA_SUCCESS;
}
EXPORT int cuDriverGetVersion(int *v)
{
    *v = 12040;
    return CUDA_SUCCESS;
}
EXPORT int cuDeviceGetCount(int *n)
{
    *n = 2;
    return CUDA_SUCCESS;
}
EXPORT int cuDeviceGet(int *dev, int ordinal)
{
    if (ordinal < 0 || ordinal > 1) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}
EXPORT int cuDeviceGetName(char *name, int len, int dev)
{
    const char *n = dev == 0 ? "Fake V100" : "Fake A100";
    if (len > 0) {
        strncpy(name, n, (size_t)len - 1);
        name[len - 1] = '\0';
    }
    return CUDA_SUCCESS;
}
EXPORT int cuDeviceTotalMem_v2(size_t *bytes, int dev)
{
    (void)dev;
    *bytes = (size_t)16 << 30;
    return CUDA_SUCCESS;
}
EXPORT int cuDeviceGetAttribute(int *value, int attribute, int dev)
{
    switch (attribute) {
    case 75: *value = dev == 0 ? 7 : 8; return CUDA_SUCCESS; /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
    case 76: *value = 0; return CUDA_SUCCESS;                 /* ..._MINOR */
    case 16: *value = 80; return CUDA_SUCCESS;                /* ..._MULTIPROCESSOR_COUNT */
    default: return CUDA_ERROR_NOT_FOUND;
    }
}
/* The CUDA runtime asks the driver for its entry points this way; this driver has none, so a runtime
 * loaded beside it reports an insufficient driver instead of calling into nothing. */
EXPORT int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags)
{
    (void)symbol, (void)version, (void)flags;
    *pfn = NULL;
    return CUDA_ERROR_NOT_FOUND;
}
EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, void *status)
{
    (void)status;
    return cuGetProcAddress(symbol, pfn, version, flags);
}
#elif defined(FAKE_NCCL)
EXPORT int ncclGetVersion(int *version)
{
    *version = 21212; /* 2.12.12, NCCL_VERSION_CODE's encoding since 2.9 */
    return 0;
}
#elif defined(FAKE_MPI)
EXPORT int MPI_Get_version(int *version, int *subversion)
{
    *version = 2;
    *subversion = 2;
    return 0;
}
EXPORT int MPI_Get_library_version(char *text, int *len)
{
    static const char name[] = "Fake MPI 1.6 (zt test, MPI-2.2)\n";
    memcpy(text, name, sizeof name);
    *len = (int)sizeof name - 1;
    return 0;
}
#else
#error "define FAKE_CUDA, FAKE_NCCL or FAKE_MPI"
#endif
