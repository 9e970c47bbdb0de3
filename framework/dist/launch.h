/* How this process was launched, and what that means for communication (docs/distributed.md).
 *
 * A job of several ranks is started by a launcher that tells each process its rank through the
 * environment: mpirun (Open MPI), an MPICH-style PMI launcher (mpiexec), srun (Slurm), torchrun, or
 * ZT_RANK/ZT_WORLD_SIZE. zt_launch_detect reads them; zt_launch_comm_create gives the
 * communication backend such a job needs (MPI for CPU ranks, NCCL for GPU ranks, whose start-up
 * goes through the TCP rendezvous below); zt_launch_start is zt-run's own launch, `--nproc N` or
 * torchrun's flags (`--nnodes N --nproc-per-node P ...`), in nproc.c.
 */
#ifndef ZT_FRAMEWORK_LAUNCH_H
#define ZT_FRAMEWORK_LAUNCH_H

#include "base/error.h"
#include "dist/comm.h"

/* zt_launch.launcher of the GPU ranks `zt-run --nproc` (or --nproc-per-node) starts itself (they say
 * so in ZT_LAUNCHER). */
#define ZT_NPROC_LAUNCHER "zt-run --nproc"
/* zt_launch.launcher when RANK and WORLD_SIZE said it (torchrun's variables). */
#define ZT_TORCHRUN_LAUNCHER "torchrun"

typedef struct zt_launch {
    int32_t rank;
    int32_t world_size; /* 1: a single process, whatever started it */
    int32_t local_rank; /* rank among the job's processes on this machine; -1 when not told */
    int32_t local_world_size; /* how many of them are on this machine; -1 when not told */
    /* Who said so, for messages: "mpirun", "srun", "a PMI launcher (mpiexec)", "ZT_WORLD_SIZE",
     * or "a single process" when no launcher variable is set. */
    const char *launcher;
} zt_launch;

/* Reads, first match wins (rank, world size, local rank, local world size):
 *   ZT_RANK, ZT_WORLD_SIZE, ZT_LOCAL_RANK, ZT_LOCAL_WORLD_SIZE        (by hand, a custom launcher, zt-run)
 *   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE             (Open MPI's mpirun)
 *   PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS              (MPICH / Intel MPI mpiexec)
 *   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID                         (srun; only inside a job
 *                                          step, SLURM_STEP_ID set: a batch script's own values
 *                                          describe the allocation, not this process)
 *   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE                    (torchrun)
 * None set: a single process. A rank without its world size, a value that is not a whole number,
 * a rank outside [0, world size), or a local rank outside [0, local world size) is an error naming
 * the variable. */
zt_status zt_launch_detect(zt_launch *out, zt_error *err);

/* The communication backend of a job of launch->world_size > 1 ranks on `device_type`. CPU ranks
 * talk through MPI: this loads libzt-comm-mpi.so ($ZT_COMM_MPI_LIBRARY, else next to the
 * executable, the build tree, the install prefix) and starts it with the watchdog `timeout_s`
 * (comm.timeout_s; 0: none). GPU ranks talk through NCCL: libzt-comm-nccl.so
 * ($ZT_COMM_NCCL_LIBRARY, else the same places); rank 0's NCCL id reaches the others through the
 * rendezvous at ZT_MASTER_ADDR:ZT_MASTER_PORT (or MASTER_ADDR:MASTER_PORT), else through MPI. The
 * current CUDA device must be this rank's GPU (the runtime selects local_rank). */
zt_status zt_launch_comm_create(const zt_launch *launch, int device_type, double timeout_s,
                                zt_comm_backend **out, zt_error *err);
/* comm.backend = mpi on GPU ranks: the MPI backend as for CPU ranks (the runtime stages device buffers
 * through host memory around it, dist/comm.h). MPI connects only ranks that its own launcher
 * (mpirun, srun --mpi=pmix) starts: ranks of zt-run --nproc on GPUs or of torchrun are refused with
 * the command that works. */
zt_status zt_launch_comm_create_mpi_for_gpus(const zt_launch *launch, double timeout_s, zt_comm_backend **out,
                                             zt_error *err);

/* The exchange at the start of a GPU job: rank 0 listens on `port` (every interface) and sends
 * data[len] to each of the world_size - 1 other ranks, which connect to addr:port (retrying until
 * rank 0 listens) and receive it. Each side gives up after timeout_s (0: never) with a message
 * naming the address and, on rank 0, the ranks that never came. */
zt_status zt_rendezvous_exchange(const char *addr, int port, int32_t rank, int32_t world_size, double timeout_s,
                                 void *data, size_t len, zt_error *err);

/* ZT_MASTER_ADDR/ZT_MASTER_PORT, else MASTER_ADDR/MASTER_PORT (torchrun's): *found = 1 with the
 * address and port. Neither set: *found = 0. Half a pair or a port outside 1..65535: an error. */
zt_status zt_launch_rendezvous_address(char *addr, size_t cap, int *port, int *found, zt_error *err);

/* ZT_NPROC_FORK: start the children as for GPU ranks without looking for GPUs or NCCL (tests of
 * the supervisor on machines without GPUs). */
enum { ZT_NPROC_AUTO, ZT_NPROC_CPU, ZT_NPROC_GPU, ZT_NPROC_FORK };

/* zt-run's launch options as typed; NULL: not given. `nproc` is --nproc N; the others are torchrun's
 * flags, --nnodes, --nproc-per-node, --node-rank, --master-addr, --master-port. */
typedef struct zt_launch_request {
    const char *nproc;
    const char *nnodes, *nproc_per_node, *node_rank, *master_addr, *master_port;
} zt_launch_request;

/* A request checked. --nproc N is one machine of N ranks; torchrun's flags default as torchrun's do
 * (1 machine, 1 rank on it, node rank 0), except that several machines need --master-addr. */
typedef struct zt_launch_plan {
    int32_t nnodes, per_node, node_rank;
    int32_t world_size;      /* nnodes * per_node */
    const char *master_addr; /* NULL: not given */
    int master_port;         /* 0: not given (several machines then meet on 29500, torchrun's default) */
    const char *form;        /* "--nproc" or "--nproc-per-node": the option that gave per_node */
} zt_launch_plan;

/* Checks the request: whole numbers in range, --node-rank below --nnodes, a TCP port, --master-addr
 * for several machines, and not --nproc together with torchrun's flags. ZT_ERR_INVALID_ARG with a
 * message naming the option. */
zt_status zt_launch_plan_make(const zt_launch_request *req, zt_launch_plan *out, zt_error *err);

/* zt-run's own launch (nproc.c). One rank in all returns ZT_OK at once: the run stays in this
 * process. Otherwise this process supervises this machine's ranks and exits with the job's code (0
 * when every rank succeeded, 130 when an interrupt stopped it, the failed rank's code after naming
 * it); only errors before anything starts return. Either way the ranks get ZT_NPROC_DIR, the job
 * directory (job.h), and a user's SIGINT, SIGTERM or SIGHUP to this process is recorded there
 * before each rank gets it, so a rank tells it from a launcher's SIGTERM after a failure.
 *
 * GPU ranks (device=cuda in argv's --set, or auto, the default, when this machine has GPUs): this
 * process starts its machine's ranks itself, one per GPU: ranks node_rank * P .. node_rank * P + P - 1
 * of nnodes * P, with ZT_RANK, ZT_LOCAL_RANK, ZT_WORLD_SIZE, ZT_LOCAL_WORLD_SIZE, ZT_MASTER_ADDR,
 * ZT_MASTER_PORT and NCCL_NVLS_ENABLE=0 (unless set) in their environment; the address is
 * --master-addr:--master-port when given (rank 0 listens there on every interface), else, on one
 * machine, 127.0.0.1 and a free port. It relays their output ("[rank 1] " before the lines of ranks
 * above 0), forwards SIGINT/SIGTERM/SIGHUP, and when one fails names it and ends the others on this
 * machine (SIGTERM, SIGKILL 10 s later). Errors before starting (more ranks than GPUs, no NCCL)
 * return.
 *
 * CPU ranks, on one machine: this process starts, in a process group of its own,
 *     mpirun -np N --oversubscribe [binding] [--allow-run-as-root] <this program> <argv without the launch options>
 * so CPU ranks talk through MPI and mpirun stops every rank when one dies. This process relays a
 * user's signal to each rank by pid once the rank is ready for it, names the rank that was killed,
 * stopped or failed first, and ends the job when a rank has been stopped for longer than its
 * comm.timeout_s. CPU ranks on several machines are an error giving the mpirun and srun commands
 * that start them (MPI connects only the processes its own launcher starts). Returns on failure
 * before anything starts (a bad request, already inside a launched job, no mpirun on PATH, zt built
 * without MPI, no job directory).
 *
 * `mode` forces CPU or GPU ranks (ZT_NPROC_CPU, ZT_NPROC_GPU, ZT_NPROC_FORK) or leaves the choice to
 * argv and the machine (ZT_NPROC_AUTO, what zt-run uses); the others are for test programs. */
zt_status zt_launch_start(const zt_launch_request *req, int mode, int argc, char **argv, zt_error *err);

/* argv[0] and argv[1..] less zt-run's launch options (both spellings of torchrun's) as one shell
 * command line into out[cap]: words the shell would split or expand in single quotes, "..." at the
 * end when it does not fit. For messages that give the command to run instead. */
void zt_launch_command_text(int argc, char **argv, char *out, size_t cap);

/* `zt-run --nproc N`: zt_launch_start with only --nproc, `nproc_text` being N as typed. */
zt_status zt_launch_local(const char *nproc_text, int argc, char **argv, zt_error *err);
zt_status zt_launch_local_mode(const char *nproc_text, int mode, int argc, char **argv, zt_error *err);

#endif
