/* What a job of several ranks needs of NCCL and MPI (requirements.h). */
#define _GNU_SOURCE /* dlinfo */
#include "dist/requirements.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(ZT_HAVE_NCCL_BACKEND) || !defined(ZT_HAVE_MPI_BACKEND)
#error "ZT_HAVE_NCCL_BACKEND and ZT_HAVE_MPI_BACKEND must be defined (framework/CMakeLists.txt)"
#endif

int zt_nccl_backend_built(void) { return ZT_HAVE_NCCL_BACKEND; }

int zt_mpi_backend_built(void) { return ZT_HAVE_MPI_BACKEND; }

/* dlopen the first of `sonames` that loads, into info->path (the file itself), or info->why. Never
 * closed: MPI does not support being unloaded. */
static void *open_first(const char *const *sonames, zt_library_info *info)
{
    for (int i = 0; sonames[i]; i++) {
        dlerror();
        void *h = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            snprintf(info->why, sizeof info->why, "%s", e ? e : "unknown dlopen error");
            continue;
        }
        struct link_map *map = NULL;
        char resolved[PATH_MAX];
        if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0])
            snprintf(info->path, sizeof info->path, "%s", realpath(map->l_name, resolved) ? resolved : map->l_name);
        else
            snprintf(info->path, sizeof info->path, "%s", sonames[i]);
        info->found = 1;
        info->why[0] = '\0';
        return h;
    }
    return NULL;
}

void zt_nccl_library_info(zt_library_info *out)
{
    static const char *const sonames[] = {"libnccl.so.2", NULL};
    memset(out, 0, sizeof *out);
    void *h = open_first(sonames, out);
    if (!h) return;
    typedef int (*version_fn)(int *);
    version_fn get_version = (version_fn)dlsym(h, "ncclGetVersion");
    int code = 0;
    if (!get_version || get_version(&code) != 0) {
        snprintf(out->why, sizeof out->why, "ncclGetVersion %s", get_version ? "failed" : "is missing");
        return;
    }
    out->version = zt_version_of_nccl(code);
    out->has_version = 1;
}

void zt_mpi_library_info(zt_library_info *out)
{
    /* Open MPI 3-5 ship libmpi.so.40, MPICH and Intel MPI libmpi.so.12. */
    static const char *const sonames[] = {"libmpi.so.40", "libmpi.so.12", "libmpi.so", NULL};
    memset(out, 0, sizeof *out);
    void *h = open_first(sonames, out);
    if (!h) return;
    /* MPI_Get_version and MPI_Get_library_version are among the few calls allowed before MPI_Init. */
    typedef int (*library_version_fn)(char *, int *);
    library_version_fn library_version = (library_version_fn)dlsym(h, "MPI_Get_library_version");
    static char text[8192 + 1]; /* MPI_MAX_LIBRARY_VERSION_STRING: 256 in Open MPI, 8192 in MPICH */
    int len = 0;
    if (library_version && library_version(text, &len) == 0) {
        text[len > 0 && len < (int)sizeof text ? len : 0] = '\0';
        text[strcspn(text, "\n")] = '\0';
        size_t n = strlen(text);
        while (n && (text[n - 1] == ' ' || text[n - 1] == '\t')) text[--n] = '\0';
        snprintf(out->text, sizeof out->text, "%s", text);
    }
    typedef int (*version_fn)(int *, int *);
    version_fn get_version = (version_fn)dlsym(h, "MPI_Get_version");
    int major = 0, minor = 0;
    if (!get_version || get_version(&major, &minor) != 0) {
        snprintf(out->why, sizeof out->why, "MPI_Get_version %s", get_version ? "failed" : "is missing");
        return;
    }
    out->version = (zt_version){major, minor, 0, 2};
    out->has_version = 1;
}

static int verdict(const zt_library_info *info, const char *what, const char *min, const char *why, char *out,
                   size_t cap)
{
    if (!info->found) {
        snprintf(out, cap, "not found (%s)", info->why);
        return ZT_REQ_MISSING;
    }
    if (!info->has_version) {
        snprintf(out, cap, "found at %s, but %s: zt cannot tell whether it is %s %s or newer", info->path, info->why,
                 what, min);
        return ZT_REQ_MISSING;
    }
    zt_version need;
    zt_version_parse(min, &need);
    return zt_version_verdict(info->version, need, why, out, cap) ? ZT_REQ_OK : ZT_REQ_TOO_OLD;
}

int zt_nccl_verdict(const zt_library_info *info, char *out, size_t cap)
{
    return verdict(info, "NCCL", ZT_NCCL_MIN_VERSION, ZT_NCCL_WHY, out, cap);
}

int zt_mpi_verdict(const zt_library_info *info, char *out, size_t cap)
{
    return verdict(info, "MPI", ZT_MPI_MIN_VERSION, ZT_MPI_WHY, out, cap);
}

int zt_nccl_too_old(char *out, size_t cap)
{
    zt_library_info info;
    char text[1024], v[48];
    zt_nccl_library_info(&info);
    if (zt_nccl_verdict(&info, text, sizeof text) != ZT_REQ_TOO_OLD) return 0;
    snprintf(out, cap, "NCCL %s at %s: %s", zt_version_format(info.version, v, sizeof v), info.path, text);
    return 1;
}

int zt_mpi_too_old(char *out, size_t cap)
{
    zt_library_info info;
    char text[1024], v[48];
    zt_mpi_library_info(&info);
    if (zt_mpi_verdict(&info, text, sizeof text) != ZT_REQ_TOO_OLD) return 0;
    snprintf(out, cap, "%s at %s implements the MPI standard %s: %s", info.text[0] ? info.text : "the MPI library",
             info.path, zt_version_format(info.version, v, sizeof v), text);
    return 1;
}
