/* zt-run --env (env.h). Every fact comes from the system or from the library itself; what cannot be
 * found is printed as "not found" with the reason. */
#define _GNU_SOURCE
#include "cli/env.h"

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <limits.h>
#include <link.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "zt/zt_types.h"

#ifndef ZT_VERSION
#error "ZT_VERSION must be defined (framework/CMakeLists.txt)"
#endif

/* ---- reading /proc and /etc ------------------------------------------------------------------- */

/* The value of the first "key<spaces>:<value>" or "key=value" line of a file, without surrounding
 * spaces and quotes; 1 when found. */
static int read_keyed_line(const char *path, const char *key, char sep, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[1024];
    size_t key_len = strlen(key);
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, key_len)) continue;
        char *p = line + key_len;
        while (*p == ' ' || *p == '\t') p++;
        if (*p != sep) continue;
        p++;
        while (*p == ' ' || *p == '\t' || *p == '"') p++;
        size_t n = strcspn(p, "\"\n");
        snprintf(out, cap, "%.*s", (int)n, p);
        found = 1;
    }
    fclose(f);
    return found;
}

static int read_first_line(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(out, (int)cap, f) != NULL;
    fclose(f);
    if (ok) out[strcspn(out, "\n")] = '\0';
    return ok;
}

/* Distinct (physical id, core id) pairs in /proc/cpuinfo; 0 when the file does not say. */
static int physical_cores(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    enum { MAX_CORES = 4096 };
    static long seen[MAX_CORES];
    int n_seen = 0;
    long package = -1, core = -1;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "physical id", 11)) package = strtol(strchr(line, ':') ? strchr(line, ':') + 1 : "", NULL, 10);
        else if (!strncmp(line, "core id", 7)) core = strtol(strchr(line, ':') ? strchr(line, ':') + 1 : "", NULL, 10);
        else if (line[0] == '\n' && package >= 0 && core >= 0) {
            long id = package * 100000 + core;
            int known = 0;
            for (int i = 0; i < n_seen; i++) known |= seen[i] == id;
            if (!known && n_seen < MAX_CORES) seen[n_seen++] = id;
            package = core = -1;
        }
    }
    fclose(f);
    return n_seen;
}

static void print_host(FILE *out)
{
    char text[512];
    fprintf(out, "zt %s (plugin ABI %u.%u)\n\nHost\n", ZT_VERSION, ZT_ABI_MAJOR, ZT_ABI_MINOR);

    if (read_keyed_line("/proc/cpuinfo", "model name", ':', text, sizeof text))
        fprintf(out, "  CPU:           %s\n", text);
    else
        fprintf(out, "  CPU:           not found (no 'model name' in /proc/cpuinfo)\n");

    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    int usable = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : -1;
    int cores = physical_cores();
    fprintf(out, "  logical CPUs:  %ld online, %d usable by this process", online, usable);
    if (cores > 0) fprintf(out, " (%d physical cores)", cores);
    fputc('\n', out);

    char total[64], available[64];
    if (read_keyed_line("/proc/meminfo", "MemTotal", ':', total, sizeof total) &&
        read_keyed_line("/proc/meminfo", "MemAvailable", ':', available, sizeof available)) {
        double total_kb = strtod(total, NULL), available_kb = strtod(available, NULL);
        fprintf(out, "  memory:        %.0f kB total (%.1f GiB), %.1f GiB available\n", total_kb,
                total_kb / 1048576.0, available_kb / 1048576.0);
    } else {
        fprintf(out, "  memory:        not found (no MemTotal/MemAvailable in /proc/meminfo)\n");
    }
    /* In a container the cgroup limit, not MemTotal, is what a run can use. */
    if (read_first_line("/sys/fs/cgroup/memory.max", text, sizeof text) && strcmp(text, "max"))
        fprintf(out, "  memory limit:  %.1f GiB (cgroup memory.max)\n", strtod(text, NULL) / 1073741824.0);

    struct utsname u;
    char pretty[256];
    if (!read_keyed_line("/etc/os-release", "PRETTY_NAME", '=', pretty, sizeof pretty))
        snprintf(pretty, sizeof pretty, "unknown distribution (no PRETTY_NAME in /etc/os-release)");
    if (uname(&u) == 0)
        fprintf(out, "  OS:            %s; %s %s %s; glibc %s\n", pretty, u.sysname, u.release, u.machine,
                gnu_get_libc_version());
    else
        fprintf(out, "  OS:            %s; glibc %s\n", pretty, gnu_get_libc_version());
}

/* ---- libraries -------------------------------------------------------------------------------- */

/* dlopen the first of `sonames` that loads; fills `path` with the file actually loaded and `why`
 * with the last dlerror when none loads. The handle is never closed: some of these libraries
 * (CUDA, MPI) do not support being unloaded, and zt-run exits soon after. */
static void *open_first(const char *const *sonames, char *path, size_t path_cap, char *why, size_t why_cap)
{
    for (int i = 0; sonames[i]; i++) {
        dlerror();
        void *h = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            snprintf(why, why_cap, "%s", e ? e : "unknown dlopen error");
            continue;
        }
        struct link_map *map = NULL;
        char resolved[PATH_MAX];
        if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0])
            snprintf(path, path_cap, "%s", realpath(map->l_name, resolved) ? resolved : map->l_name);
        else
            snprintf(path, path_cap, "%s", sonames[i]);
        return h;
    }
    return NULL;
}

/* The CUDA driver API, declared here so the host needs no CUDA headers to build. */
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_int_fn)(int *);
typedef int (*cu_device_get_fn)(int *, int);
typedef int (*cu_device_name_fn)(char *, int, int);
typedef int (*cu_device_mem_fn)(size_t *, int);
typedef int (*cu_device_attr_fn)(int *, int, int);
typedef int (*cu_error_string_fn)(int, const char **);
enum { CU_ATTR_SM_COUNT = 16, CU_ATTR_CC_MAJOR = 75, CU_ATTR_CC_MINOR = 76 };

static void cuda_error_text(void *h, int code, char *out, size_t cap)
{
    cu_error_string_fn name_fn = (cu_error_string_fn)dlsym(h, "cuGetErrorName");
    cu_error_string_fn text_fn = (cu_error_string_fn)dlsym(h, "cuGetErrorString");
    const char *name = NULL, *text = NULL;
    if (name_fn) name_fn(code, &name);
    if (text_fn) text_fn(code, &text);
    snprintf(out, cap, "%s (%s, code %d)", name ? name : "CUDA error", text ? text : "no description", code);
}

static void print_gpus(FILE *out)
{
    fprintf(out, "\nGPUs\n");
    char kernel_driver[256];
    if (read_first_line("/proc/driver/nvidia/version", kernel_driver, sizeof kernel_driver))
        fprintf(out, "  kernel module: %s\n", kernel_driver);

    static const char *const sonames[] = {"libcuda.so.1", NULL};
    char path[PATH_MAX], why[1024];
    void *h = open_first(sonames, path, sizeof path, why, sizeof why);
    if (!h) {
        fprintf(out, "  CUDA driver:   not found (%s)\n  devices:       none usable\n", why);
        return;
    }
    cu_init_fn cu_init = (cu_init_fn)dlsym(h, "cuInit");
    cu_int_fn driver_version = (cu_int_fn)dlsym(h, "cuDriverGetVersion");
    cu_int_fn device_count = (cu_int_fn)dlsym(h, "cuDeviceGetCount");
    cu_device_get_fn device_get = (cu_device_get_fn)dlsym(h, "cuDeviceGet");
    cu_device_name_fn device_name = (cu_device_name_fn)dlsym(h, "cuDeviceGetName");
    cu_device_mem_fn device_mem = (cu_device_mem_fn)dlsym(h, "cuDeviceTotalMem_v2");
    cu_device_attr_fn device_attr = (cu_device_attr_fn)dlsym(h, "cuDeviceGetAttribute");
    if (!cu_init || !driver_version || !device_count || !device_get || !device_name || !device_mem || !device_attr) {
        fprintf(out, "  CUDA driver:   %s lacks part of the driver API (cuInit ... cuDeviceGetAttribute); "
                     "reinstall the NVIDIA driver\n", path);
        return;
    }
    int version = 0;
    if (driver_version(&version) == 0)
        fprintf(out, "  CUDA driver:   supports CUDA %d.%d (%s)\n", version / 1000, (version % 1000) / 10, path);
    else
        fprintf(out, "  CUDA driver:   version not reported (%s)\n", path);
    char text[256];
    int rc = cu_init(0);
    if (rc != 0) {
        cuda_error_text(h, rc, text, sizeof text);
        fprintf(out, "  devices:       none usable: cuInit failed: %s\n", text);
        return;
    }
    int n = 0;
    rc = device_count(&n);
    if (rc != 0) {
        cuda_error_text(h, rc, text, sizeof text);
        fprintf(out, "  devices:       none usable: cuDeviceGetCount failed: %s\n", text);
        return;
    }
    fprintf(out, "  devices:       %d\n", n);
    for (int i = 0; i < n; i++) {
        int dev, major = 0, minor = 0, sms = 0;
        size_t bytes = 0;
        char name[256] = "";
        if ((rc = device_get(&dev, i)) != 0 || (rc = device_name(name, (int)sizeof name, dev)) != 0 ||
            (rc = device_mem(&bytes, dev)) != 0 || (rc = device_attr(&major, CU_ATTR_CC_MAJOR, dev)) != 0 ||
            (rc = device_attr(&minor, CU_ATTR_CC_MINOR, dev)) != 0 ||
            (rc = device_attr(&sms, CU_ATTR_SM_COUNT, dev)) != 0) {
            cuda_error_text(h, rc, text, sizeof text);
            fprintf(out, "  %d: cannot query: %s\n", i, text);
            continue;
        }
        fprintf(out, "  %d: %s, %.1f GiB, compute capability %d.%d, %d SMs\n", i, name,
                (double)bytes / 1073741824.0, major, minor, sms);
    }
}

static void print_cuda_runtime(FILE *out)
{
    static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                          "libcudart.so", NULL};
    char path[PATH_MAX], why[1024];
    void *h = open_first(sonames, path, sizeof path, why, sizeof why);
    if (!h) {
        fprintf(out, "  CUDA runtime:  not found (%s)\n", why);
        return;
    }
    cu_int_fn get_version = (cu_int_fn)dlsym(h, "cudaRuntimeGetVersion");
    int v = 0;
    if (get_version && get_version(&v) == 0)
        fprintf(out, "  CUDA runtime:  %d.%d (%s)\n", v / 1000, (v % 1000) / 10, path);
    else
        fprintf(out, "  CUDA runtime:  found at %s, but cudaRuntimeGetVersion failed\n", path);
}

static void print_nccl(FILE *out)
{
    static const char *const sonames[] = {"libnccl.so.2", NULL};
    char path[PATH_MAX], why[1024];
    void *h = open_first(sonames, path, sizeof path, why, sizeof why);
    if (!h) {
        fprintf(out, "  NCCL:          not found (%s)\n", why);
        return;
    }
    cu_int_fn get_version = (cu_int_fn)dlsym(h, "ncclGetVersion");
    int code = 0;
    if (!get_version || get_version(&code) != 0) {
        fprintf(out, "  NCCL:          found at %s, but ncclGetVersion failed\n", path);
        return;
    }
    /* NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 + patch
     * before. */
    int major, minor, patch;
    if (code >= 10000) major = code / 10000, minor = (code % 10000) / 100, patch = code % 100;
    else major = code / 1000, minor = (code % 1000) / 100, patch = code % 100;
    fprintf(out, "  NCCL:          %d.%d.%d (%s)\n", major, minor, patch, path);
}

static void print_mpi(FILE *out)
{
    /* Open MPI 3-5 ship libmpi.so.40, MPICH and Intel MPI libmpi.so.12. */
    static const char *const sonames[] = {"libmpi.so.40", "libmpi.so.12", "libmpi.so", NULL};
    char path[PATH_MAX], why[1024];
    void *h = open_first(sonames, path, sizeof path, why, sizeof why);
    if (!h) {
        fprintf(out, "  MPI:           not found (%s)\n", why);
        return;
    }
    /* MPI_Get_library_version is one of the few MPI calls allowed before MPI_Init. */
    typedef int (*version_fn)(char *, int *);
    version_fn get_version = (version_fn)dlsym(h, "MPI_Get_library_version");
    static char text[8192 + 1]; /* MPI_MAX_LIBRARY_VERSION_STRING: 256 in Open MPI, 8192 in MPICH */
    int len = 0;
    if (!get_version || get_version(text, &len) != 0) {
        fprintf(out, "  MPI:           found at %s, but MPI_Get_library_version failed\n", path);
        return;
    }
    text[len > 0 && len < (int)sizeof text ? len : 0] = '\0';
    text[strcspn(text, "\n")] = '\0';
    fprintf(out, "  MPI:           %s (%s)\n", text, path);
}

static void print_sentencepiece(FILE *out)
{
    static const char *const sonames[] = {"libsentencepiece.so.0", "libsentencepiece.so", NULL};
    char path[PATH_MAX], why[1024];
    void *h = open_first(sonames, path, sizeof path, why, sizeof why);
    if (!h) {
        fprintf(out, "  sentencepiece: not found (%s)\n", why);
        return;
    }
    /* The library has no version call; its release is in the pkg-config file installed next to it
     * (the -dev package). The .so file name carries the ABI version, not the release. */
    char pc[PATH_MAX + 32], version[64];
    const char *slash = strrchr(path, '/');
    snprintf(pc, sizeof pc, "%.*s/pkgconfig/sentencepiece.pc", slash ? (int)(slash - path) : 1,
             slash ? path : ".");
    if (read_keyed_line(pc, "Version", ':', version, sizeof version))
        fprintf(out, "  sentencepiece: %s (library %s; version from %s)\n", version, path, pc);
    else
        fprintf(out, "  sentencepiece: found at %s; release version not known (the library reports none and "
                     "there is no %s)\n", path, pc);
}

void zt_env_print(FILE *out)
{
    print_host(out);
    print_gpus(out);
    fprintf(out, "\nLibraries (loaded with dlopen; zt links none of them)\n");
    print_cuda_runtime(out);
    print_nccl(out);
    print_mpi(out);
    print_sentencepiece(out);
}
