/* The MPI communication backend (CPU ranks) as zt-run sees it: a MODULE library,
 * libzt-comm-mpi.so, that exports one function. zt-run and zt_core never link libmpi, so they run
 * on machines without MPI; launch.c dlopens the module only when the launch environment says the
 * job has more than one rank (docs/distributed.md).
 */
#ifndef ZT_FRAMEWORK_COMM_MPI_H
#define ZT_FRAMEWORK_COMM_MPI_H

#include "dist/comm.h"

/* The exported entry. The version is in the name, so a module from a zt whose table differs is
 * refused by dlsym instead of being called with the wrong layout. */
#define ZT_COMM_MPI_ENTRY "zt_comm_mpi_create_v1"

typedef struct zt_comm_mpi_options {
    /* What the launch environment says (launch.h); MPI must see the same job, else the process
     * was started by a launcher that MPI does not know and create fails saying so. */
    int32_t rank;
    int32_t world_size;
    const char *launcher; /* "mpirun", "srun", ...: named in messages */
    /* The watchdog: a collective that has not completed after this many seconds ends the job with
     * a message naming it (comm.timeout_s); 0 waits forever. */
    double timeout_s;
} zt_comm_mpi_options;

/* Initializes MPI (unless the program already did) and returns the backend. Its destroy waits for
 * every rank (under the watchdog) and finalizes MPI, which cannot be initialized again in the
 * same process. */
typedef zt_status (*zt_comm_mpi_create_fn)(const zt_comm_mpi_options *opt, zt_comm_backend **out,
                                           zt_error *err);

#endif
