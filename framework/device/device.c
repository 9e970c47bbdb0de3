/* Which device backend a run computes on: the CPU's, built in, or CUDA's, loaded from its module
 * (device.h says why it is a module) the first time a run or a question needs it. */
#include "device/device.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/module.h"

#if !defined(ZT_HAVE_CUDA_DEVICE)
#error "ZT_HAVE_CUDA_DEVICE must be defined (framework/CMakeLists.txt)"
#endif

enum { MODULE_PATH_MAX = 4096 };

/* libzt-device-cuda.so: $ZT_DEVICE_CUDA_LIBRARY, else where zt_module_find looks for host modules. */
static int find_cuda_module(char *path, char *tried, size_t tried_cap)
{
    const char *chosen = getenv("ZT_DEVICE_CUDA_LIBRARY");
    if (chosen && *chosen) {
        snprintf(path, MODULE_PATH_MAX, "%s", chosen);
        return 1;
    }
    return zt_module_find(ZT_DEVICE_CUDA_FILE, path, MODULE_PATH_MAX, tried, tried_cap);
}

/* The CUDA backend module's two exports. The module is loaded once and never closed: the CUDA
 * runtime it links cannot be unloaded and started again cleanly within one process. */
static zt_status load_cuda_module(zt_device_cuda_open_fn *open_out, zt_device_cuda_versions_fn *versions_out,
                                  zt_error *err)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static zt_device_cuda_open_fn open_fn;
    static zt_device_cuda_versions_fn versions_fn;
    *open_out = NULL;
    *versions_out = NULL;
    if (!ZT_HAVE_CUDA_DEVICE)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED, "this build of zt has no CUDA support (it was built without "
                            "the CUDA toolkit): run on the CPU (device = cpu), or rebuild zt where nvcc is "
                            "installed");
    pthread_mutex_lock(&lock);
    zt_status st = ZT_OK;
    if (!open_fn) {
        char path[MODULE_PATH_MAX], tried[3 * MODULE_PATH_MAX + 16];
        if (!find_cuda_module(path, tried, sizeof tried)) {
            st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                              "a CUDA run needs zt's CUDA backend libzt-device-cuda.so, which is in none of "
                              "these places:%s\nReinstall zt (cmake --install), or set ZT_DEVICE_CUDA_LIBRARY to "
                              "the library's path", tried);
        } else {
            void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (!lib)
                st = zt_error_set(err, ZT_ERR_UNSUPPORTED,
                                  "zt's CUDA backend %s cannot be loaded: %s\nInstall the CUDA runtime and cuBLAS "
                                  "it was built with (libcudart, libcublasLt), or train on the CPU (device = cpu)",
                                  path, dlerror());
            else if (!(open_fn = (zt_device_cuda_open_fn)dlsym(lib, ZT_DEVICE_CUDA_ENTRY)) ||
                     !(versions_fn = (zt_device_cuda_versions_fn)dlsym(lib, ZT_DEVICE_CUDA_VERSIONS_ENTRY))) {
                open_fn = NULL;
                st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                                  "%s does not export %s and %s: it is not zt's CUDA backend, or one from another "
                                  "version of zt; rebuild and reinstall zt", path, ZT_DEVICE_CUDA_ENTRY,
                                  ZT_DEVICE_CUDA_VERSIONS_ENTRY);
            }
            if (lib && !open_fn) dlclose(lib);
        }
    }
    *open_out = open_fn;
    *versions_out = versions_fn;
    pthread_mutex_unlock(&lock);
    return st;
}

/* The CUDA backend and how many devices it sees. */
static zt_status open_cuda_backend(const zt_device_backend **backend_out, int *n_devices, zt_error *err)
{
    zt_device_cuda_open_fn open_fn;
    zt_device_cuda_versions_fn versions_fn;
    *backend_out = NULL;
    *n_devices = 0;
    zt_status st = load_cuda_module(&open_fn, &versions_fn, err);
    return st == ZT_OK ? open_fn(backend_out, n_devices, err) : st;
}

zt_status zt_device_cuda_versions(zt_cuda_versions *out, zt_error *err)
{
    zt_device_cuda_open_fn open_fn;
    zt_device_cuda_versions_fn versions_fn;
    memset(out, 0, sizeof *out);
    zt_status st = load_cuda_module(&open_fn, &versions_fn, err);
    if (st == ZT_OK) versions_fn(out);
    return st;
}

zt_status zt_device_cuda_count(int *n_devices, zt_error *err)
{
    const zt_device_backend *backend;
    return open_cuda_backend(&backend, n_devices, err);
}

/* The one place a run's device backend is chosen. */
zt_status zt_device_backend_open(int device_type, const zt_device_backend **out, zt_error *err)
{
    int n_devices = 0;
    switch (device_type) {
    case ZT_DEVICE_CPU:
        *out = &zt_device_cpu;
        return ZT_OK;
    case ZT_DEVICE_CUDA:
        return open_cuda_backend(out, &n_devices, err);
    default:
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "device type %d is neither CPU (%d) nor CUDA (%d)",
                            device_type, ZT_DEVICE_CPU, ZT_DEVICE_CUDA);
    }
}
