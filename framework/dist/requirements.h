/* What a job of several ranks needs of NCCL and MPI, read from the libraries the dynamic linker
 * would load, and the verdicts zt-run --env prints and a launch that cannot load zt's backend
 * (launch.c) explains itself with, in the same words (docs/cli.md, "What zt needs").
 *
 * - NCCL 2.14 or newer: comm_nccl.c creates every communicator with ncclCommInitRankConfig and a
 *   non-blocking ncclConfig_t (blocking = 0), and closes it with ncclCommFinalize, all new in 2.14
 *   (it also uses ncclGetLastError, 2.13, and ncclBfloat16 and ncclAvg, 2.10). It never calls
 *   ncclCommSplit (2.18): groups are made from ids sent to their members only.
 * - MPI 3.0 or newer (the standard MPI_Get_version reports): comm_mpi.c waits for every collective
 *   through the non-blocking MPI_Iallreduce and MPI_Ibarrier, duplicates communicators with
 *   MPI_Comm_idup and makes groups on their members only with MPI_Comm_create_group, all MPI-3.0.
 *
 * Each library is dlopen'ed (zt-run links neither) and left loaded. */
#ifndef ZT_FRAMEWORK_DIST_REQUIREMENTS_H
#define ZT_FRAMEWORK_DIST_REQUIREMENTS_H

#include <stddef.h>

#include "base/version.h"
#include "device/requirements.h" /* the ZT_REQ_ verdicts */

#define ZT_NCCL_MIN_VERSION "2.14"
#define ZT_NCCL_WHY                                                                                  \
    "zt's NCCL backend creates non-blocking communicators with ncclCommInitRankConfig and closes them " \
    "with ncclCommFinalize, new in NCCL 2.14: install a newer libnccl2, or pip install nvidia-nccl-cu12 " \
    "and put its lib/ on LD_LIBRARY_PATH"
#define ZT_MPI_MIN_VERSION "3.0"
#define ZT_MPI_WHY                                                                                    \
    "zt's MPI backend waits through MPI_Iallreduce and MPI_Ibarrier and makes groups with MPI_Comm_idup " \
    "and MPI_Comm_create_group, all MPI-3.0: install Open MPI 1.8 or newer (libopenmpi-dev), or MPICH 3.0 " \
    "or newer"

typedef struct zt_library_info {
    int found;           /* the library loaded */
    char path[4096];     /* the file loaded (PATH_MAX) */
    char why[1024];      /* not found: dlerror; found: what could not be asked, or "" */
    int has_version;     /* version is what the library said */
    zt_version version;  /* NCCL: ncclGetVersion; MPI: the standard's version (MPI_Get_version) */
    char text[512];      /* MPI: the first line of MPI_Get_library_version; NCCL: "" */
} zt_library_info;

/* libnccl.so.2, and ncclGetVersion. */
void zt_nccl_library_info(zt_library_info *out);
/* libmpi.so.40 (Open MPI 3 and newer), libmpi.so.12 (MPICH, Intel MPI), libmpi.so; MPI_Get_version
 * and MPI_Get_library_version, which MPI allows before MPI_Init. */
void zt_mpi_library_info(zt_library_info *out);

/* "ok: ..." / "too old: need ..., have ... (why)" / "not found (...)" / "found at PATH, but ..."
 * (ZT_REQ_MISSING too: zt cannot tell). */
int zt_nccl_verdict(const zt_library_info *info, char *out, size_t cap);
int zt_mpi_verdict(const zt_library_info *info, char *out, size_t cap);

/* 1 when the library the dynamic linker finds is too old for zt, with `out` saying so ("NCCL
 * 2.12.12 at PATH: too old: need 2.14, have 2.12.12 (why)"): what a launch says when zt's backend
 * for it cannot be loaded (an older library lacks the calls the backend makes). */
int zt_nccl_too_old(char *out, size_t cap);
int zt_mpi_too_old(char *out, size_t cap);

/* Whether this build has the backend module of each (re-run CMake with the library installed). */
int zt_nccl_backend_built(void);
int zt_mpi_backend_built(void);

#endif
