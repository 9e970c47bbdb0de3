/* What a GPU run needs of the CUDA stack: the verdicts of requirements.h. */
#include "device/requirements.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/version.h"

#if !defined(ZT_CUDA_ARCHITECTURES) || !defined(ZT_CUDA_TOOLKIT_VERSION)
#error "ZT_CUDA_ARCHITECTURES and ZT_CUDA_TOOLKIT_VERSION must be defined (framework/CMakeLists.txt)"
#endif

const char *zt_cuda_architectures(void) { return ZT_CUDA_ARCHITECTURES; }

const char *zt_cuda_toolkit_version(void) { return ZT_CUDA_TOOLKIT_VERSION; }

/* ---- the driver and the runtime ---------------------------------------------------------------- */

/* The first driver branch of each CUDA major version (NVIDIA's release notes), for the fix. */
static const char *driver_branch(int cuda_major)
{
    switch (cuda_major) {
    case 11: return "NVIDIA driver 450 or newer supports CUDA 11";
    case 12: return "NVIDIA driver 525 or newer supports CUDA 12";
    case 13: return "NVIDIA driver 580 or newer supports CUDA 13";
    default: return "see the CUDA release notes for the driver it needs";
    }
}

int zt_cuda_driver_verdict(int driver, int runtime, char *out, size_t cap)
{
    if (driver <= 0) {
        snprintf(out, cap, "not found: no NVIDIA driver answers (the CUDA runtime reports none: libcuda.so.1 is "
                           "missing or the kernel module is not loaded): install the NVIDIA driver");
        return ZT_REQ_MISSING;
    }
    zt_version have = zt_version_of_cuda(driver), rt = zt_version_of_cuda(runtime);
    zt_version need = {rt.major, 0, 0, 2};
    char why[384], r[32], h[32];
    zt_version_format(rt, r, sizeof r);
    snprintf(why, sizeof why,
             "the CUDA %s runtime zt links does not start on a driver for an older CUDA major version "
             "(cudaErrorInsufficientDriver): update the NVIDIA driver; %s", r, driver_branch(rt.major));
    if (!zt_version_verdict(have, need, why, out, cap)) return ZT_REQ_TOO_OLD;
    if (zt_version_compare(have, rt) < 0) {
        size_t used = strlen(out);
        if (used < cap)
            snprintf(out + used, cap - used,
                     "; older than the CUDA %s runtime, which CUDA's minor version compatibility allows: GPUs zt "
                     "has machine code for run, PTX needs a driver for CUDA %s", r, zt_version_format(rt, h, sizeof h));
    }
    return ZT_REQ_OK;
}

int zt_cuda_runtime_verdict(int runtime, int built, char *out, size_t cap)
{
    zt_version have = zt_version_of_cuda(runtime), need = zt_version_of_cuda(built);
    char why[320], n[32];
    zt_version_format(need, n, sizeof n);
    snprintf(why, sizeof why,
             "zt was compiled against the CUDA %s headers, and an older runtime may lack calls zt makes: put the "
             "CUDA %s runtime (or a newer %d.x) first on the library path, or rebuild zt with the toolkit installed "
             "here", n, n, need.major);
    return zt_version_verdict(have, need, why, out, cap) ? ZT_REQ_OK : ZT_REQ_TOO_OLD;
}

/* ---- each GPU ----------------------------------------------------------------------------------- */

/* One entry of CMAKE_CUDA_ARCHITECTURES: "86", "90a", "100f", "80-real", "90-virtual". */
typedef struct arch_entry {
    int major, minor;
    char suffix; /* 0, 'a' (runs on exactly this capability), 'f' (this major's family) */
    int sass, ptx;
} arch_entry;

static int parse_arch(const char *s, size_t len, arch_entry *out)
{
    char text[32];
    if (len == 0 || len >= sizeof text) return 0;
    memcpy(text, s, len);
    text[len] = '\0';
    char *p = text;
    long number = strtol(text, &p, 10);
    if (p == text || number < 10 || number > 999) return 0;
    *out = (arch_entry){(int)(number / 10), (int)(number % 10), 0, 1, 1};
    if (*p == 'a' || *p == 'f') out->suffix = *p++;
    if (!strcmp(p, "-real")) out->ptx = 0;
    else if (!strcmp(p, "-virtual")) out->sass = 0;
    else if (*p) return 0;
    return 1;
}

/* Does code of `e` run on major.minor? Machine code: the same major and this minor or a newer one
 * ('a': exactly it). PTX: any capability from its own up ('a': exactly it, 'f': its major). */
static int sass_runs(const arch_entry *e, int major, int minor)
{
    if (!e->sass || e->major != major) return 0;
    return e->suffix == 'a' ? e->minor == minor : minor >= e->minor;
}

static int ptx_runs(const arch_entry *e, int major, int minor)
{
    if (!e->ptx) return 0;
    if (e->suffix == 'a') return e->major == major && e->minor == minor;
    if (e->suffix == 'f') return e->major == major && minor >= e->minor;
    return major > e->major || (major == e->major && minor >= e->minor);
}

int zt_cuda_gpu_verdict(int major, int minor, const char *archs, int driver, int runtime, char *out,
                        size_t cap)
{
    zt_version have = {major, minor, 0, 2}, need = {ZT_CUDA_MIN_CC_MAJOR, ZT_CUDA_MIN_CC_MINOR, 0, 2};
    if (!zt_version_verdict(have, need, ZT_CUDA_CC_WHY, out, cap)) return ZT_REQ_TOO_OLD;
    /* What zt's build has for this capability; an entry zt cannot read ("native", "all") leaves it
     * to the run to find out. */
    arch_entry sass = {0}, ptx = {0};
    int found_sass = 0, found_ptx = 0, readable = archs && *archs;
    for (const char *p = archs; readable && *p;) {
        size_t len = strcspn(p, ",");
        arch_entry e;
        if (!parse_arch(p, len, &e)) readable = 0;
        /* The newest of each that runs: what the CUDA runtime picks. */
        if (readable && sass_runs(&e, major, minor) && (!found_sass || e.minor > sass.minor)) {
            sass = e;
            found_sass = 1;
        }
        if (readable && ptx_runs(&e, major, minor) &&
            (!found_ptx || e.major * 10 + e.minor > ptx.major * 10 + ptx.minor)) {
            ptx = e;
            found_ptx = 1;
        }
        p += len + (p[len] == ',');
    }
    size_t used = strlen(out);
    if (!readable || used >= cap) return ZT_REQ_OK;
    if (found_sass) {
        snprintf(out + used, cap - used, "; zt's build has machine code for it (sm_%d%d%s)", sass.major, sass.minor,
                 sass.suffix == 'a' ? "a" : sass.suffix == 'f' ? "f" : "");
        return ZT_REQ_OK;
    }
    if (!found_ptx) {
        char list[128]; /* CMake's own spelling of the list, for the fix */
        snprintf(list, sizeof list, "%s", archs);
        for (char *c = list; *c; c++)
            if (*c == ',') *c = ';';
        snprintf(out, cap,
                 "not supported by this build: zt's kernels were built for CUDA architectures %s "
                 "(CMAKE_CUDA_ARCHITECTURES), none of which runs on compute capability %d.%d: rebuild zt with "
                 "-DCMAKE_CUDA_ARCHITECTURES=\"%s;%d%d\"", archs, major, minor, list, major, minor);
        return ZT_REQ_UNSUPPORTED;
    }
    zt_version drv = zt_version_of_cuda(driver), rt = zt_version_of_cuda(runtime);
    if (driver > 0 && runtime > 0 && zt_version_compare(drv, rt) < 0) {
        char d[32], r[32];
        snprintf(out, cap,
                 "too old: the driver: need one for CUDA %s or newer, have one for CUDA %s (zt's build has no "
                 "machine code for compute capability %d.%d, built for %s, so the driver must compile zt's "
                 "compute_%d%d PTX, which needs a driver for the CUDA zt was built with: update the NVIDIA driver, "
                 "or rebuild zt with -DCMAKE_CUDA_ARCHITECTURES including %d%d)",
                 zt_version_format(rt, r, sizeof r), zt_version_format(drv, d, sizeof d), major, minor, archs,
                 ptx.major, ptx.minor, major, minor);
        return ZT_REQ_TOO_OLD;
    }
    snprintf(out + used, cap - used,
             "; zt's build has no machine code for it, so the driver compiles zt's compute_%d%d PTX when a run "
             "starts (slow the first time; cached after)", ptx.major, ptx.minor);
    return ZT_REQ_OK;
}
