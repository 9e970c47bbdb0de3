/* What a GPU run needs of the CUDA stack, and the verdicts zt-run --env prints and the CUDA backend
 * (device_cuda.c) refuses a run with, in the same words (docs/cli.md, "What zt needs").
 *
 * - The CUDA runtime: the one zt was built with (libzt-device-cuda.so and the plugins link its
 *   libcudart.so.MAJOR); a runtime older than the headers zt was compiled against may lack calls zt
 *   makes.
 * - The driver: it must support at least the runtime's major version (CUDA 12.x needs a driver for
 *   12.0 or newer, 13.x one for 13.0): the runtime refuses an older one (cudaErrorInsufficientDriver).
 *   Within a major version an older driver runs the runtime (CUDA's minor version compatibility),
 *   but cannot compile PTX newer than itself: a GPU zt has no machine code for then cannot run.
 * - Each GPU: compute capability 8.0 or newer (the kernels), and code for it in zt's build: machine
 *   code (sm_XY, which runs on X.Y and newer minors of X) or PTX the driver compiles.
 *
 * Built into zt_core and into the CUDA backend module, so both say the same. */
#ifndef ZT_FRAMEWORK_DEVICE_REQUIREMENTS_H
#define ZT_FRAMEWORK_DEVICE_REQUIREMENTS_H

#include <stddef.h>

#define ZT_CUDA_MIN_CC_MAJOR 8
#define ZT_CUDA_MIN_CC_MINOR 0
#define ZT_CUDA_CC_WHY                                                                                 \
    "zt's CUDA kernels compute in bf16 and fp16 on tensor cores through mma.sync.m16n8k16, cp.async and " \
    "native bf16 arithmetic, which start with compute capability 8.0: A100, RTX 30xx and newer"

/* Every verdict is one of these; zt-run --env counts TOO_OLD and UNSUPPORTED as problems. */
enum { ZT_REQ_OK, ZT_REQ_TOO_OLD, ZT_REQ_UNSUPPORTED, ZT_REQ_MISSING };

/* The CUDA architectures zt's kernels were built for (CMAKE_CUDA_ARCHITECTURES, comma-separated:
 * "80,86,89,90"); "" when zt was built without CUDA. */
const char *zt_cuda_architectures(void);

/* The version zt was built with (the toolkit's, "13.0.88"); "" without CUDA. */
const char *zt_cuda_toolkit_version(void);

/* The driver (cuDriverGetVersion / cudaDriverGetVersion: the newest CUDA it supports, 0 when there
 * is no driver) against the runtime zt loaded (cudaRuntimeGetVersion), both as CUDA's integers
 * (13000 = 13.0). Fills out with "ok: ..." / "too old: need ..., have ... (why)" / "not found: ..." */
int zt_cuda_driver_verdict(int driver, int runtime, char *out, size_t cap);

/* The runtime zt loaded against the one it was built with (CUDART_VERSION of its headers). */
int zt_cuda_runtime_verdict(int runtime, int built, char *out, size_t cap);

/* One GPU of compute capability major.minor: the minimum, and whether zt's build (`archs`, as
 * zt_cuda_architectures; "" or a list with entries zt cannot read skips this part) has machine code
 * for it or PTX the driver (`driver`, `runtime` as above) can compile. */
int zt_cuda_gpu_verdict(int major, int minor, const char *archs, int driver, int runtime, char *out,
                        size_t cap);

#endif
