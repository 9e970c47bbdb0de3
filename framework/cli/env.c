/* zt-run --env (env.h). Every fact comes from the system or from the library itself; what cannot be
 * found is printed as "not found" with the reason. The requirements are judged by
 * device/requirements.c and dist/requirements.c, whose words a run that cannot start uses too. */
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
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "device/device.h"
#include "device/requirements.h"
#include "dist/requirements.h"
#include "zt/zt_types.h"

/* What the sections found, for the requirements at the end. */
enum { MAX_GPUS = 64 };
typedef struct env_facts {
    int driver;                 /* cuDriverGetVersion; 0: no driver */
    int n_gpus;                 /* queried (at most MAX_GPUS) */
    struct {
        char name[128];
        int major, minor;
    } gpu[MAX_GPUS];
    char no_gpu[4608];          /* why there is none, when n_gpus is 0 */
    zt_library_info nccl, mpi;
} env_facts;

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
    /* What InfiniBand needs (NCCL's and MPI's IB transports register memory against it); pinned memory
     * from cudaHostAlloc is locked by the NVIDIA driver and does not count (docs/zero.md). */
    struct rlimit lock;
    if (getrlimit(RLIMIT_MEMLOCK, &lock) == 0) {
        if (lock.rlim_cur == RLIM_INFINITY)
            fprintf(out, "  locked memory: unlimited (ulimit -l)\n");
        else
            fprintf(out, "  locked memory: %.0f KiB (ulimit -l; InfiniBand transports register memory against "
                         "it, cudaHostAlloc does not)\n", (double)lock.rlim_cur / 1024.0);
    }

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

static void print_gpus(FILE *out, env_facts *facts)
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
        snprintf(facts->no_gpu, sizeof facts->no_gpu, "no NVIDIA driver: libcuda.so.1 not found");
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
        snprintf(facts->no_gpu, sizeof facts->no_gpu, "the NVIDIA driver %s lacks part of its API", path);
        return;
    }
    int version = 0;
    if (driver_version(&version) == 0) {
        facts->driver = version;
        fprintf(out, "  CUDA driver:   supports CUDA %d.%d (%s)\n", version / 1000, (version % 1000) / 10, path);
    } else
        fprintf(out, "  CUDA driver:   version not reported (%s)\n", path);
    char text[256];
    int rc = cu_init(0);
    if (rc != 0) {
        cuda_error_text(h, rc, text, sizeof text);
        fprintf(out, "  devices:       none usable: cuInit failed: %s\n", text);
        snprintf(facts->no_gpu, sizeof facts->no_gpu, "cuInit failed: %s", text);
        return;
    }
    int n = 0;
    rc = device_count(&n);
    if (rc != 0) {
        cuda_error_text(h, rc, text, sizeof text);
        fprintf(out, "  devices:       none usable: cuDeviceGetCount failed: %s\n", text);
        snprintf(facts->no_gpu, sizeof facts->no_gpu, "cuDeviceGetCount failed: %s", text);
        return;
    }
    fprintf(out, "  devices:       %d\n", n);
    if (n == 0) snprintf(facts->no_gpu, sizeof facts->no_gpu, "the NVIDIA driver reports no GPU");
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
        if (facts->n_gpus < MAX_GPUS) {
            snprintf(facts->gpu[facts->n_gpus].name, sizeof facts->gpu[0].name, "%s", name);
            facts->gpu[facts->n_gpus].major = major;
            facts->gpu[facts->n_gpus].minor = minor;
            facts->n_gpus++;
        }
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

static void print_nccl(FILE *out, env_facts *facts)
{
    zt_library_info *nccl = &facts->nccl;
    zt_nccl_library_info(nccl);
    char v[48];
    if (!nccl->found) fprintf(out, "  NCCL:          not found (%s)\n", nccl->why);
    else if (!nccl->has_version) fprintf(out, "  NCCL:          found at %s, but %s\n", nccl->path, nccl->why);
    else fprintf(out, "  NCCL:          %s (%s)\n", zt_version_format(nccl->version, v, sizeof v), nccl->path);
}

static void print_mpi(FILE *out, env_facts *facts)
{
    zt_library_info *mpi = &facts->mpi;
    zt_mpi_library_info(mpi);
    if (!mpi->found) fprintf(out, "  MPI:           not found (%s)\n", mpi->why);
    else if (!mpi->text[0])
        fprintf(out, "  MPI:           found at %s, but MPI_Get_library_version failed\n", mpi->path);
    else fprintf(out, "  MPI:           %s (%s)\n", mpi->text, mpi->path);
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

/* ---- what zt's runs need ----------------------------------------------------------------------- */

typedef struct verdicts {
    int problems;
    char names[512]; /* "CUDA driver, GPU 1" */
} verdicts;

/* One requirement's line; TOO_OLD and UNSUPPORTED are problems. */
static int report(FILE *out, verdicts *v, const char *label, const char *text, int state)
{
    char head[32];
    snprintf(head, sizeof head, "%s:", label);
    fprintf(out, "  %-15s%s\n", head, text);
    if (state == ZT_REQ_TOO_OLD || state == ZT_REQ_UNSUPPORTED) {
        size_t used = strlen(v->names);
        snprintf(v->names + used, sizeof v->names - used, "%s%s", v->problems ? ", " : "", label);
        v->problems++;
    }
    return state;
}

/* A message of several lines on one. */
static void one_line(char *text)
{
    for (char *c = text; *c; c++)
        if (*c == '\n') *c = ' ';
}

/* The CUDA part; fills `gpu_no` with why GPU runs cannot start here ("" when they can). */
static void require_cuda(FILE *out, verdicts *v, const env_facts *facts, char *gpu_no, size_t cap)
{
    char line[ZT_ERROR_MSG_MAX + 64];
    const char *archs = zt_cuda_architectures(), *toolkit = zt_cuda_toolkit_version();
    int runtime = 0, runtime_ok = 0;
    gpu_no[0] = '\0';
    if (!toolkit[0]) {
        report(out, v, "CUDA build", "none: this zt was built without CUDA and trains on the CPU only (for GPU runs, "
                                     "rebuild zt where the CUDA toolkit is installed)", ZT_REQ_MISSING);
        snprintf(gpu_no, cap, "this zt was built without CUDA");
    } else {
        snprintf(line, sizeof line, "CUDA %s, kernels for architectures %s (CMAKE_CUDA_ARCHITECTURES)", toolkit, archs);
        report(out, v, "CUDA build", line, ZT_REQ_OK);
        zt_cuda_versions cv;
        zt_error err;
        if (zt_device_cuda_versions(&cv, &err) != ZT_OK) {
            one_line(err.msg);
            snprintf(line, sizeof line, "not usable: %s", err.msg);
            report(out, v, "CUDA runtime", line, ZT_REQ_MISSING);
            snprintf(gpu_no, cap, "zt's CUDA backend cannot be loaded");
        } else {
            runtime = cv.runtime;
            char verdict[1024];
            int state = zt_cuda_runtime_verdict(cv.runtime, cv.built, verdict, sizeof verdict);
            snprintf(line, sizeof line, "%s; %s, loaded by zt's CUDA backend", verdict,
                     cv.runtime_path[0] ? cv.runtime_path : "libcudart");
            runtime_ok = report(out, v, "CUDA runtime", line, state) == ZT_REQ_OK;
            if (!runtime_ok) snprintf(gpu_no, cap, "the CUDA runtime is older than zt's build");
        }
    }
    if (runtime) {
        int state = zt_cuda_driver_verdict(facts->driver, runtime, line, sizeof line);
        report(out, v, "CUDA driver", line, state);
        if (state != ZT_REQ_OK && !gpu_no[0])
            snprintf(gpu_no, cap, facts->driver ? "the NVIDIA driver is too old" : "no NVIDIA driver");
    } else if (facts->driver) {
        snprintf(line, sizeof line,
                 "supports CUDA %d.%d; not compared (zt has no CUDA runtime here to compare it with)",
                 facts->driver / 1000, facts->driver % 1000 / 10);
        report(out, v, "CUDA driver", line, ZT_REQ_MISSING);
    }
    int usable = 0;
    for (int i = 0; i < facts->n_gpus; i++) {
        char label[16], verdict[1536];
        snprintf(label, sizeof label, "GPU %d", i);
        int state = zt_cuda_gpu_verdict(facts->gpu[i].major, facts->gpu[i].minor, archs, facts->driver, runtime,
                                        verdict, sizeof verdict);
        snprintf(line, sizeof line, "%s, compute capability %d.%d: %s", facts->gpu[i].name, facts->gpu[i].major,
                 facts->gpu[i].minor, verdict);
        usable += report(out, v, label, line, state) == ZT_REQ_OK;
    }
    if (!facts->n_gpus) {
        snprintf(line, sizeof line, "none (%s)", facts->no_gpu[0] ? facts->no_gpu : "the driver reports none");
        report(out, v, "GPUs", line, ZT_REQ_MISSING);
        if (!gpu_no[0]) snprintf(gpu_no, cap, "no GPU (%.400s)", facts->no_gpu[0] ? facts->no_gpu : "none reported");
    } else if (!usable && !gpu_no[0]) {
        snprintf(gpu_no, cap, "no GPU here meets zt's requirements (above)");
    }
}

/* A library of several ranks: its line, and why its kind of job cannot run (`no`, "" when it can). */
static void require_library(FILE *out, verdicts *v, const char *label, const zt_library_info *info, int state,
                            const char *verdict, int backend_built, const char *backend, char *no, size_t cap)
{
    char line[8192];
    snprintf(line, sizeof line, "%s%s%s%s", verdict, state == ZT_REQ_OK && info->found ? "; " : "",
             state == ZT_REQ_OK && info->found ? info->path : "",
             backend_built ? "" : "; but this zt was built without its backend (re-run CMake where the library's "
                                  "headers are installed, and rebuild)");
    report(out, v, label, line, state);
    no[0] = '\0';
    if (!backend_built) snprintf(no, cap, "this zt was built without %s", backend);
    else if (state == ZT_REQ_TOO_OLD) snprintf(no, cap, "%s is too old", backend);
    else if (state != ZT_REQ_OK) snprintf(no, cap, "%s is not usable here", backend);
}

static int print_requirements(FILE *out, const env_facts *facts)
{
    verdicts v = {0};
    fprintf(out, "\nRequirements (what zt's runs need; docs/cli.md, \"What zt needs\")\n");
    char gpu_no[512], nccl_no[256], mpi_no[256], text[1024];
    require_cuda(out, &v, facts, gpu_no, sizeof gpu_no);
    int state = zt_nccl_verdict(&facts->nccl, text, sizeof text);
    require_library(out, &v, "NCCL", &facts->nccl, state, text, zt_nccl_backend_built(), "NCCL", nccl_no,
                    sizeof nccl_no);
    state = zt_mpi_verdict(&facts->mpi, text, sizeof text);
    require_library(out, &v, "MPI standard", &facts->mpi, state, text, zt_mpi_backend_built(), "MPI", mpi_no,
                    sizeof mpi_no);

    fprintf(out, "  CPU runs:      yes\n");
    if (mpi_no[0]) fprintf(out, "  CPU ranks:     no: %s (zt-run --nproc N and mpirun need it)\n", mpi_no);
    else fprintf(out, "  CPU ranks:     yes (through MPI)\n");
    if (gpu_no[0]) fprintf(out, "  GPU runs:      no: %s\n", gpu_no);
    else fprintf(out, "  GPU runs:      yes\n");
    if (gpu_no[0]) fprintf(out, "  GPU ranks:     no: no GPU runs here\n");
    else if (nccl_no[0]) fprintf(out, "  GPU ranks:     no: %s\n", nccl_no);
    else fprintf(out, "  GPU ranks:     yes (through NCCL)\n");
    if (v.problems)
        fprintf(out, "  result:        too old or not supported here: %s (each line above says what it needs); "
                     "zt-run --env exits 1\n", v.names);
    else
        fprintf(out, "  result:        ok: nothing found here is too old for zt\n");
    return v.problems;
}

int zt_env_print(FILE *out)
{
    env_facts *facts = calloc(1, sizeof *facts);
    if (!facts) {
        fprintf(out, "out of memory\n");
        return 1;
    }
    print_host(out);
    print_gpus(out, facts);
    fprintf(out, "\nLibraries (loaded with dlopen; zt links none of them)\n");
    print_cuda_runtime(out);
    print_nccl(out, facts);
    print_mpi(out, facts);
    print_sentencepiece(out);
    int problems = print_requirements(out, facts);
    free(facts);
    return problems;
}
