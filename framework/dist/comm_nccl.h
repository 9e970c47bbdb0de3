/* The NCCL communication backend (GPU ranks) as zt-run sees it: a MODULE library,
 * libzt-comm-nccl.so, that exports two functions. zt-run and zt_core never link NCCL or the CUDA
 * runtime, so they run where neither is installed; launch.c dlopens the module only for a CUDA run
 * of more than one rank (docs/distributed.md).
 *
 * Start-up: rank 0 makes the job's id (ZT_COMM_NCCL_ID_ENTRY), launch.c carries it to every rank
 * (the TCP rendezvous at ZT_MASTER_ADDR:ZT_MASTER_PORT, or an MPI broadcast under mpirun/srun), and
 * each rank then calls ZT_COMM_NCCL_ENTRY with it, on the thread that selected its GPU.
 */
#ifndef ZT_FRAMEWORK_COMM_NCCL_H
#define ZT_FRAMEWORK_COMM_NCCL_H

#include "dist/comm.h"

/* The exports. The version is in the names, so a module whose table differs is refused by dlsym. */
#define ZT_COMM_NCCL_ENTRY "zt_comm_nccl_create_v1"
#define ZT_COMM_NCCL_ID_ENTRY "zt_comm_nccl_unique_id_v1"

/* sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES); the module checks it at compile time. */
#define ZT_COMM_NCCL_ID_BYTES 128

typedef struct zt_comm_nccl_options {
    int32_t rank;
    int32_t world_size;
    const char *launcher; /* named in messages */
    /* comm.timeout_s: bounds communicator start-up and every collective (the watchdog); 0: none. */
    double timeout_s;
    /* The job's id, the same on every rank (rank 0's ZT_COMM_NCCL_ID_ENTRY). */
    unsigned char id[ZT_COMM_NCCL_ID_BYTES];
    /* Destroyed after the NCCL communicators by the backend's destroy (the MPI backend that carried
     * the id, which must outlive them); may be NULL. */
    zt_comm_backend *bootstrap;
} zt_comm_nccl_options;

/* ncclGetUniqueId. Also says which NCCL this is in `version` (e.g. "2.28.9"; cap >= 16). */
typedef zt_status (*zt_comm_nccl_unique_id_fn)(unsigned char id[ZT_COMM_NCCL_ID_BYTES], char *version,
                                               size_t cap, zt_error *err);

/* Connects the ranks on the current CUDA device (the device module's init selected it) and
 * returns the backend, with its watchdog thread running. On failure opt->bootstrap is left to the
 * caller. */
typedef zt_status (*zt_comm_nccl_create_fn)(const zt_comm_nccl_options *opt, zt_comm_backend **out,
                                            zt_error *err);

#endif
