/* How this process was launched, and what that means for communication (docs/distributed.md).
 *
 * A job of several ranks is started by a launcher that tells each process its rank through the
 * environment: mpirun (Open MPI), an MPICH-style PMI launcher (mpiexec), srun (Slurm), or
 * ZT_RANK/ZT_WORLD_SIZE. zt_launch_detect reads them; zt_launch_comm_create gives the
 * communication backend such a job needs; zt_launch_local is `zt-run --nproc N`.
 */
#ifndef ZT_FRAMEWORK_LAUNCH_H
#define ZT_FRAMEWORK_LAUNCH_H

#include "comm.h"
#include "error.h"

typedef struct zt_launch {
    int32_t rank;
    int32_t world_size; /* 1: a single process, whatever started it */
    int32_t local_rank; /* rank among the job's processes on this machine; -1 when not told */
    /* Who said so, for messages: "mpirun", "srun", "a PMI launcher (mpiexec)", "ZT_WORLD_SIZE",
     * or "a single process" when no launcher variable is set. */
    const char *launcher;
} zt_launch;

/* Reads, first match wins:
 *   ZT_RANK, ZT_WORLD_SIZE, ZT_LOCAL_RANK                                  (set by hand or a custom launcher)
 *   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's mpirun)
 *   PMI_RANK, PMI_SIZE, MPI_LOCALRANKID                                    (MPICH / Intel MPI mpiexec)
 *   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID                              (srun; only inside a job
 *                                          step, SLURM_STEP_ID set: a batch script's own values
 *                                          describe the allocation, not this process)
 * None set: a single process. A rank without its world size, a value that is not a whole number,
 * or a rank outside [0, world size) is an error naming the variable. */
zt_status zt_launch_detect(zt_launch *out, zt_error *err);

/* The communication backend of a job of launch->world_size > 1 ranks on `device_type`. CPU ranks
 * talk through MPI: this loads libzt-comm-mpi.so ($ZT_COMM_MPI_LIBRARY, else next to the
 * executable, the build tree, the install prefix) and starts it with the watchdog `timeout_s`
 * (comm.timeout_s; 0: none). GPU ranks will talk through NCCL, which this build does not have yet:
 * an error says so. */
zt_status zt_launch_comm_create(const zt_launch *launch, int device_type, double timeout_s,
                                zt_comm_backend **out, zt_error *err);

/* `zt-run --nproc N`: `nproc_text` is N as typed. N = 1 returns ZT_OK at once: the run stays in
 * this process. For N > 1 this process is replaced by
 *     mpirun -np N --oversubscribe [binding] [--allow-run-as-root] <this program> <argv without --nproc>
 * so CPU ranks talk through MPI, and mpirun forwards signals, stops every rank when one fails and
 * names it. Returns only on failure (bad N, already inside a launched job, no mpirun on PATH, zt
 * built without MPI).
 *
 * GPU ranks need no MPI: the NCCL path will instead start N children itself with ZT_RANK,
 * ZT_WORLD_SIZE and ZT_LOCAL_RANK set, forward signals to them and stop the others when one
 * fails. That arrives with the NCCL backend. */
zt_status zt_launch_local(const char *nproc_text, int argc, char **argv, zt_error *err);

#endif
