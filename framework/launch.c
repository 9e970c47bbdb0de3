/* How this process was launched: rank and world size from the launcher's environment, the
 * communication backend that launch calls for, and `zt-run --nproc`. See launch.h. */
#define _POSIX_C_SOURCE 200809L /* readlink */
#include "launch.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_mpi.h"
#include "module.h"
#include "threadpool.h"

#if !defined(ZT_HAVE_MPI_BACKEND)
#error "ZT_HAVE_MPI_BACKEND must be defined (framework/CMakeLists.txt)"
#endif

#define MAX_LOCAL_RANKS 1024

/* ---- detection --------------------------------------------------------------------------------- */

typedef struct launch_source {
    const char *launcher; /* zt_launch.launcher */
    const char *setter;   /* who sets the variables, for messages */
    const char *rank_var, *size_var, *local_rank_var;
    const char *step_var; /* must also be set for the source to count; NULL: nothing more */
} launch_source;

static const launch_source k_sources[] = {
    {"ZT_WORLD_SIZE", "you or your launcher", "ZT_RANK", "ZT_WORLD_SIZE", "ZT_LOCAL_RANK", NULL},
    {"mpirun", "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", NULL},
    {"a PMI launcher (mpiexec)", "a PMI launcher (mpiexec)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", NULL},
    {"srun", "srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID"},
};

static const char *env_value(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* A whole number in [min, max], in decimal, nothing else. */
static zt_status parse_env_int(const launch_source *src, const char *var, const char *text, long min, long max,
                               int32_t *out, zt_error *err)
{
    errno = 0;
    char *end;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s='%s' is not a whole number from %ld to %ld (%s sets it): unset it, or start the "
                            "job with a launcher that sets it right (mpirun, srun)", var, text, min, max,
                            src->setter);
    *out = (int32_t)v;
    return ZT_OK;
}

zt_status zt_launch_detect(zt_launch *out, zt_error *err)
{
    *out = (zt_launch){.rank = 0, .world_size = 1, .local_rank = 0, .launcher = "a single process"};
    for (size_t i = 0; i < sizeof k_sources / sizeof k_sources[0]; i++) {
        const launch_source *src = &k_sources[i];
        const char *rank = env_value(src->rank_var), *size = env_value(src->size_var);
        if ((!rank && !size) || (src->step_var && !env_value(src->step_var))) continue;
        if (!rank || !size)
            return zt_error_set(err, ZT_ERR_CONFIG,
                                "%s is set but %s is not (%s sets both): unset %s, or set both (a rank and the "
                                "number of ranks)", rank ? src->rank_var : src->size_var,
                                rank ? src->size_var : src->rank_var, src->setter,
                                rank ? src->rank_var : src->size_var);
        zt_launch found = {.local_rank = -1, .launcher = src->launcher};
        zt_status st = parse_env_int(src, src->size_var, size, 1, INT32_MAX, &found.world_size, err);
        if (st == ZT_OK) st = parse_env_int(src, src->rank_var, rank, 0, INT32_MAX, &found.rank, err);
        if (st != ZT_OK) return st;
        if (found.rank >= found.world_size)
            return zt_error_set(err, ZT_ERR_CONFIG,
                                "%s=%d but %s=%d (%s sets them): a rank is below the number of ranks, from 0 "
                                "to %d", src->rank_var, found.rank, src->size_var, found.world_size, src->setter,
                                found.world_size - 1);
        const char *local = env_value(src->local_rank_var);
        if (local) {
            st = parse_env_int(src, src->local_rank_var, local, 0, found.world_size - 1, &found.local_rank, err);
            if (st != ZT_OK) return st;
        }
        *out = found;
        return ZT_OK;
    }
    return ZT_OK;
}

/* ---- the communication backend of a multi-rank job --------------------------------------------- */

/* libzt-comm-mpi.so, where zt_module_find looks for host modules. */
static int find_mpi_backend(char *path, size_t cap, char *tried, size_t tried_cap)
{
    return zt_module_find(ZT_COMM_MPI_FILE, path, cap, tried, tried_cap);
}

zt_status zt_launch_comm_create(const zt_launch *launch, int device_type, double timeout_s,
                                zt_comm_backend **out, zt_error *err)
{
    *out = NULL;
    if (device_type != ZT_DEVICE_CPU)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "this run has %d ranks (from %s) on GPUs, but GPU ranks talk through NCCL, which "
                            "this build of zt does not have yet: run the ranks on the CPU (--set device=cpu), or "
                            "one process on the GPU",
                            launch->world_size, launch->launcher);
    char path[PATH_MAX], tried[3 * PATH_MAX + 16];
    const char *chosen = env_value("ZT_COMM_MPI_LIBRARY");
    if (chosen) {
        snprintf(path, sizeof path, "%s", chosen);
    } else if (!ZT_HAVE_MPI_BACKEND) {
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "this run has %d ranks (from %s) but zt was built without MPI, through which CPU "
                            "ranks talk: install libopenmpi-dev and rebuild zt, or run one process",
                            launch->world_size, launch->launcher);
    } else if (!find_mpi_backend(path, sizeof path, tried, sizeof tried)) {
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "this run has %d ranks (from %s) and needs zt's MPI backend libzt-comm-mpi.so, which "
                            "is in none of these places:%s\nReinstall zt (cmake --install), or set "
                            "ZT_COMM_MPI_LIBRARY to the library's path", launch->world_size, launch->launcher,
                            tried);
    }
    /* Never closed: MPI cannot be unloaded and started again, and the process ends soon after. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "this run has %d ranks (from %s) but zt's MPI backend %s%s cannot be loaded: %s\n"
                            "Install the MPI it was built with (Debian/Ubuntu: apt-get install openmpi-bin), "
                            "or rebuild zt against the MPI installed here", launch->world_size,
                            launch->launcher, path, chosen ? " (ZT_COMM_MPI_LIBRARY)" : "", dlerror());
    zt_comm_mpi_create_fn create = (zt_comm_mpi_create_fn)dlsym(lib, ZT_COMM_MPI_ENTRY);
    if (!create) {
        dlclose(lib);
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "%s%s does not export %s: it is not zt's MPI backend, or one from another version "
                            "of zt; rebuild and reinstall zt%s", path, chosen ? " (ZT_COMM_MPI_LIBRARY)" : "",
                            ZT_COMM_MPI_ENTRY, chosen ? ", or unset ZT_COMM_MPI_LIBRARY" : "");
    }
    zt_comm_mpi_options opt = {
        .rank = launch->rank, .world_size = launch->world_size, .launcher = launch->launcher, .timeout_s = timeout_s};
    return create(&opt, out, err);
}

/* ---- zt-run --nproc ---------------------------------------------------------------------------- */

/* The first executable `name` on $PATH, like execvp finds it. */
static int find_on_path(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path || !*path) return 0;
    for (const char *dir = path; dir;) {
        const char *colon = strchr(dir, ':');
        size_t len = colon ? (size_t)(colon - dir) : strlen(dir);
        int w = len ? snprintf(out, cap, "%.*s/%s", (int)len, dir, name) : snprintf(out, cap, "./%s", name);
        if (w > 0 && (size_t)w < cap && access(out, X_OK) == 0) return 1;
        dir = colon ? colon + 1 : NULL;
    }
    return 0;
}

zt_status zt_launch_local(const char *nproc_text, int argc, char **argv, zt_error *err)
{
    errno = 0;
    char *end;
    long nproc = strtol(nproc_text, &end, 10);
    if (errno || end == nproc_text || *end || nproc < 1 || nproc > MAX_LOCAL_RANKS)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "--nproc '%s': expected the number of ranks to start on this machine, a whole "
                            "number from 1 to %d", nproc_text, MAX_LOCAL_RANKS);
    if (nproc == 1) return ZT_OK;

    zt_launch launch;
    zt_status st = zt_launch_detect(&launch, err);
    if (st != ZT_OK) return st;
    if (launch.world_size > 1)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "--nproc %ld starts the ranks itself, but this process already is rank %d of %d "
                            "(from %s): drop --nproc, or run zt-run --nproc outside the launcher",
                            nproc, launch.rank, launch.world_size, launch.launcher);
    char mpirun[PATH_MAX], backend[PATH_MAX], tried[3 * PATH_MAX + 16];
    if (!find_on_path("mpirun", mpirun, sizeof mpirun))
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "--nproc %ld starts CPU ranks with Open MPI's mpirun, which is not on PATH: install "
                            "it (Debian/Ubuntu: apt-get install openmpi-bin), or start the ranks with your "
                            "launcher (mpirun -np %ld zt-run ..., srun -n %ld zt-run ...)", nproc, nproc, nproc);
    if (!env_value("ZT_COMM_MPI_LIBRARY") && (!ZT_HAVE_MPI_BACKEND || !find_mpi_backend(backend, sizeof backend,
                                                                                         tried, sizeof tried)))
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "--nproc %ld starts CPU ranks that talk through MPI, but %s: install libopenmpi-dev "
                            "and rebuild zt, or run one process", nproc,
                            ZT_HAVE_MPI_BACKEND ? "zt's MPI backend libzt-comm-mpi.so is missing"
                                                : "zt was built without MPI");
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return zt_error_set(err, ZT_ERR_IO, "--nproc: cannot find this program's own path "
                                      "(/proc/self/exe: %s)", strerror(errno));
    exe[len] = '\0';

    /* mpirun binds each rank to one core by default (np <= 2), which would leave every thread of
     * a rank's pool on that core: give each rank its share of this machine's cores instead. */
    int cores = zt_online_cores();
    char np[16], map_by[48];
    snprintf(np, sizeof np, "%ld", nproc);
    snprintf(map_by, sizeof map_by, "slot:PE=%ld", cores / nproc);
    char **args = calloc((size_t)argc + 16, sizeof *args);
    if (!args) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory starting %ld ranks", nproc);
    int n = 0;
    args[n++] = mpirun;
    args[n++] = "-np";
    args[n++] = np;
    args[n++] = "--oversubscribe";
    if (nproc <= cores) {
        args[n++] = "--map-by";
        args[n++] = map_by;
        args[n++] = "--bind-to";
        args[n++] = "core";
    } else {
        args[n++] = "--bind-to";
        args[n++] = "none";
    }
    if (geteuid() == 0) args[n++] = "--allow-run-as-root"; /* containers often run as root */
    args[n++] = exe;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--nproc") == 0) {
            i++; /* and its value */
            continue;
        }
        if (strncmp(argv[i], "--nproc=", 8) == 0) continue;
        args[n++] = argv[i];
    }
    args[n] = NULL;
    fflush(NULL);
    execv(mpirun, args);
    zt_error_set(err, ZT_ERR_IO, "--nproc %ld: cannot start %s: %s", nproc, mpirun, strerror(errno));
    free(args);
    return ZT_ERR_IO;
}
