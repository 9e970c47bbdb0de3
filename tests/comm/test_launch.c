/* How a process learns its rank (framework/dist/launch.c), in one process: each launcher's variables,
 * which launcher wins, every malformed value with its message, zt_launch_local's refusals, and the
 * runtime's messages when a multi-rank job cannot get its MPI backend. Expected values are the
 * variables as set here, written out by hand. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "dist/launch.h"
#include "device/device.h"
#include "host/runtime.h"
#include "ztest.h"

static const char *const k_launch_vars[] = {
    "ZT_RANK", "ZT_WORLD_SIZE", "ZT_LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_LOCALID", "SLURM_STEP_ID", "ZT_COMM_MPI_LIBRARY", "RANK", "WORLD_SIZE", "LOCAL_RANK", "ZT_LAUNCHER",
    "ZT_MASTER_ADDR", "ZT_MASTER_PORT", "MASTER_ADDR", "MASTER_PORT", "ZT_COMM_NCCL_LIBRARY", NULL};

/* Unsets every launch variable, then sets "NAME=VALUE" pairs from a NULL-terminated list. */
static void set_env(const char *const *assignments)
{
    for (int i = 0; k_launch_vars[i]; i++) unsetenv(k_launch_vars[i]);
    for (int i = 0; assignments && assignments[i]; i++) {
        char name[64];
        const char *eq = strchr(assignments[i], '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq - assignments[i]), assignments[i]);
        setenv(name, eq + 1, 1);
    }
}

static void expect_launch(const char *const *env, int rank, int world, int local, const char *launcher)
{
    set_env(env);
    zt_launch l;
    zt_error err = {0};
    ZT_CHECK_INT(zt_launch_detect(&l, &err), ZT_OK);
    ZT_CHECK_INT(l.rank, rank);
    ZT_CHECK_INT(l.world_size, world);
    ZT_CHECK_INT(l.local_rank, local);
    ZT_CHECK_CONTAINS(l.launcher, launcher);
}

static void expect_launch_error(const char *const *env, const char *needle)
{
    set_env(env);
    zt_launch l;
    zt_error err = {0};
    ZT_CHECK_INT(zt_launch_detect(&l, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, needle);
}

/* torchrun's variables, the lowest in precedence; the rendezvous address beside them. */
static void test_torchrun(void)
{
    expect_launch((const char *[]){"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "MASTER_ADDR=node0", "MASTER_PORT=29500",
                                   NULL}, 3, 4, 1, "torchrun");
    expect_launch((const char *[]){"RANK=0", "WORLD_SIZE=2", NULL}, 0, 2, -1, "torchrun");
    /* A launcher that sets its own variables wins over RANK/WORLD_SIZE left in the environment. */
    expect_launch((const char *[]){"RANK=3", "WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", NULL},
                  1, 2, -1, "mpirun");
    expect_launch_error((const char *[]){"RANK=1", NULL}, "RANK is set but WORLD_SIZE is not (torchrun (or another "
                                                          "launcher that sets RANK and WORLD_SIZE) sets both)");
    expect_launch_error((const char *[]){"RANK=4", "WORLD_SIZE=4", NULL}, "RANK=4 but WORLD_SIZE=4");
    expect_launch_error((const char *[]){"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=x", NULL},
                        "LOCAL_RANK='x' is not a whole number from 0 to 1");
    /* zt-run --nproc's children name it. */
    expect_launch((const char *[]){"ZT_RANK=1", "ZT_WORLD_SIZE=2", "ZT_LAUNCHER=zt-run --nproc", NULL}, 1, 2, -1,
                  "zt-run --nproc");
    expect_launch((const char *[]){"ZT_RANK=1", "ZT_WORLD_SIZE=2", "ZT_LAUNCHER=something else", NULL}, 1, 2, -1,
                  "ZT_WORLD_SIZE");

    char addr[256] = "";
    int port = 0, found = -1;
    zt_error err = {0};
    set_env((const char *[]){"MASTER_ADDR=node0", "MASTER_PORT=29500", NULL});
    ZT_CHECK_INT(zt_launch_rendezvous_address(addr, sizeof addr, &port, &found, &err), ZT_OK);
    ZT_CHECK_INT(found, 1);
    ZT_CHECK(strcmp(addr, "node0") == 0);
    ZT_CHECK_INT(port, 29500);
    /* zt's own pair wins. */
    set_env((const char *[]){"MASTER_ADDR=node0", "MASTER_PORT=29500", "ZT_MASTER_ADDR=10.0.0.7", "ZT_MASTER_PORT=1234",
                             NULL});
    ZT_CHECK_INT(zt_launch_rendezvous_address(addr, sizeof addr, &port, &found, &err), ZT_OK);
    ZT_CHECK(strcmp(addr, "10.0.0.7") == 0);
    ZT_CHECK_INT(port, 1234);
    /* torchrun's agent holds MASTER_PORT with its own store: zt's rendezvous takes the next port. */
    set_env((const char *[]){"MASTER_ADDR=node0", "MASTER_PORT=29500", NULL});
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    ZT_CHECK_INT(zt_launch_rendezvous_address(addr, sizeof addr, &port, &found, &err), ZT_OK);
    ZT_CHECK_INT(port, 29501);
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    set_env(NULL);
    ZT_CHECK_INT(zt_launch_rendezvous_address(addr, sizeof addr, &port, &found, &err), ZT_OK);
    ZT_CHECK_INT(found, 0);
    set_env((const char *[]){"ZT_MASTER_ADDR=node0", NULL});
    ZT_CHECK_INT(zt_launch_rendezvous_address(addr, sizeof addr, &port, &found, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "ZT_MASTER_ADDR is set but ZT_MASTER_PORT is not");
    set_env((const char *[]){"MASTER_PORT=29500", NULL});
    ZT_CHECK_INT(zt_launch_rendezvous_address(addr, sizeof addr, &port, &found, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "MASTER_PORT is set but MASTER_ADDR is not");
    set_env((const char *[]){"ZT_MASTER_ADDR=node0", "ZT_MASTER_PORT=70000", NULL});
    ZT_CHECK_INT(zt_launch_rendezvous_address(addr, sizeof addr, &port, &found, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "ZT_MASTER_PORT='70000' is not a TCP port (1 to 65535)");
}

static void test_detect(void)
{
    expect_launch(NULL, 0, 1, 0, "a single process");
    expect_launch((const char *[]){"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1",
                                   NULL}, 2, 4, 1, "mpirun");
    expect_launch((const char *[]){"PMI_RANK=1", "PMI_SIZE=3", NULL}, 1, 3, -1, "PMI");
    expect_launch((const char *[]){"PMI_RANK=1", "PMI_SIZE=3", "MPI_LOCALRANKID=0", NULL}, 1, 3, 0, "PMI");
    expect_launch((const char *[]){"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_STEP_ID=0", NULL},
                  5, 8, 1, "srun");
    /* A batch script's own Slurm variables (no job step) describe the allocation, not this process. */
    expect_launch((const char *[]){"SLURM_PROCID=0", "SLURM_NTASKS=8", "SLURM_LOCALID=0", NULL}, 0, 1, 0,
                  "a single process");
    expect_launch((const char *[]){"ZT_RANK=1", "ZT_WORLD_SIZE=2", "ZT_LOCAL_RANK=1", NULL}, 1, 2, 1, "ZT_WORLD_SIZE");
    /* First match wins: ZT_*, then mpirun (inside an sbatch script too), then PMI, then srun. */
    expect_launch((const char *[]){"ZT_RANK=0", "ZT_WORLD_SIZE=1", "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4",
                                   NULL}, 0, 1, -1, "ZT_WORLD_SIZE");
    expect_launch((const char *[]){"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "SLURM_PROCID=0",
                                   "SLURM_NTASKS=1", "SLURM_STEP_ID=0", NULL}, 3, 4, -1, "mpirun");
    /* An empty variable counts as unset. */
    expect_launch((const char *[]){"OMPI_COMM_WORLD_RANK=", "OMPI_COMM_WORLD_SIZE=", NULL}, 0, 1, 0,
                  "a single process");

    expect_launch_error((const char *[]){"OMPI_COMM_WORLD_RANK=1", NULL},
                        "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not (mpirun sets both): unset "
                        "OMPI_COMM_WORLD_RANK, or set both");
    expect_launch_error((const char *[]){"ZT_WORLD_SIZE=4", NULL}, "ZT_WORLD_SIZE is set but ZT_RANK is not");
    expect_launch_error((const char *[]){"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=abc", NULL},
                        "OMPI_COMM_WORLD_SIZE='abc' is not a whole number from 1 to 2147483647 (mpirun sets it)");
    expect_launch_error((const char *[]){"PMI_RANK=1x", "PMI_SIZE=2", NULL},
                        "PMI_RANK='1x' is not a whole number from 0 to 2147483647 (a PMI launcher (mpiexec) sets "
                        "it)");
    expect_launch_error((const char *[]){"ZT_RANK=-1", "ZT_WORLD_SIZE=2", NULL},
                        "ZT_RANK='-1' is not a whole number from 0 to 2147483647 (you or your launcher sets it)");
    expect_launch_error((const char *[]){"ZT_RANK=0", "ZT_WORLD_SIZE=0", NULL},
                        "ZT_WORLD_SIZE='0' is not a whole number from 1");
    expect_launch_error((const char *[]){"ZT_RANK=0", "ZT_WORLD_SIZE=99999999999", NULL},
                        "ZT_WORLD_SIZE='99999999999'");
    expect_launch_error((const char *[]){"OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4", NULL},
                        "OMPI_COMM_WORLD_RANK=4 but OMPI_COMM_WORLD_SIZE=4 (mpirun sets them): a rank is below the "
                        "number of ranks, from 0 to 3");
    expect_launch_error((const char *[]){"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=2", "SLURM_STEP_ID=7",
                                         NULL},
                        "SLURM_LOCALID='2' is not a whole number from 0 to 1 (srun sets it)");
}

static void expect_local_error(const char *nproc, const char *const *env, const char *needle)
{
    set_env(env);
    char *argv[] = {"comm_check", "--nproc", (char *)nproc, "launched", (char *)nproc, NULL};
    zt_error err = {0};
    ZT_CHECK(zt_launch_local(nproc, 5, argv, &err) != ZT_OK);
    ZT_CHECK_CONTAINS(err.msg, needle);
}

static void test_launch_local_refusals(void)
{
    expect_local_error("0", NULL, "--nproc '0': expected the number of ranks to start on this machine, a whole "
                                  "number from 1 to 1024");
    expect_local_error("two", NULL, "--nproc 'two': expected the number of ranks");
    expect_local_error("2000", NULL, "--nproc '2000'");
    expect_local_error("2", (const char *[]){"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", NULL},
                       "--nproc 2 starts the ranks itself, but this process already is rank 1 of 2 (from mpirun): "
                       "drop --nproc");

    const char *path = getenv("PATH");
    char *saved = path ? strdup(path) : NULL;
    setenv("PATH", "/nonexistent-zt-test-dir", 1);
    expect_local_error("3", NULL, "--nproc 3 starts CPU ranks with Open MPI's mpirun, which is not on PATH: install "
                                  "it (Debian/Ubuntu: apt-get install openmpi-bin)");
    if (saved) setenv("PATH", saved, 1);

    /* GPU ranks: device=cuda asked for on a machine without a usable GPU, or more ranks than GPUs. */
    set_env(NULL);
    int n_gpus = 0;
    zt_error cuda_err;
    int have_gpus = zt_device_cuda_count(&n_gpus, &cuda_err) == ZT_OK;
    char nproc_text[16];
    snprintf(nproc_text, sizeof nproc_text, "%d", have_gpus ? n_gpus + 1 : 2);
    char *cuda_argv[] = {"zt-run", "--nproc", nproc_text, "--set", "device=cuda", "--data", "d", NULL};
    zt_error gpu_err = {0};
    ZT_CHECK(zt_launch_local(nproc_text, 7, cuda_argv, &gpu_err) != ZT_OK);
    if (have_gpus) {
        ZT_CHECK_CONTAINS(gpu_err.msg, "starts one rank per GPU, but this process sees");
    } else {
        char want[96];
        snprintf(want, sizeof want, "--nproc %s with device=cuda starts one rank per GPU, but ", nproc_text);
        ZT_CHECK_CONTAINS(gpu_err.msg, want);
        ZT_CHECK_CONTAINS(gpu_err.msg, "or start CPU ranks (--set device=cpu)");
        /* The same when forced (as a GPU test program does). */
        ZT_CHECK(zt_launch_local_mode("2", ZT_NPROC_GPU, 3, (char *[]){"t", "--nproc", "2", NULL}, &gpu_err) != ZT_OK);
        ZT_CHECK_CONTAINS(gpu_err.msg, "--nproc 2 with device=cuda starts one rank per GPU, but ");
        /* device=auto (the default) without GPUs: CPU ranks through mpirun, which is not on this PATH. */
        setenv("PATH", "/nonexistent-zt-test-dir", 1);
        char *auto_argv[] = {"zt-run", "--nproc", "2", "--set=device=auto", NULL};
        ZT_CHECK(zt_launch_local("2", 4, auto_argv, &gpu_err) != ZT_OK);
        ZT_CHECK_CONTAINS(gpu_err.msg, "--nproc 2 starts CPU ranks with Open MPI's mpirun, which is not on PATH");
        if (saved) setenv("PATH", saved, 1);
    }

    free(saved);
    /* --nproc 1 is a run in this process: nothing is started. */
    set_env(NULL);
    char *argv[] = {"comm_check", "--nproc", "1", NULL};
    zt_error err = {0};
    ZT_CHECK_INT(zt_launch_local("1", 3, argv, &err), ZT_OK);
}

static void expect_runtime_error(const char *const *env, zt_status want, const char *needle)
{
    set_env(env);
    zt_runtime_options opt = {.n_threads = 1, .device_type = ZT_DEVICE_CPU};
    zt_runtime *rt = NULL;
    zt_error err = {0};
    ZT_CHECK_INT(zt_runtime_create(&opt, NULL, &rt, &err), want);
    ZT_CHECK(rt == NULL);
    ZT_CHECK_CONTAINS(err.msg, needle);
}

static void test_backend_errors(void)
{
    /* A malformed launch stops the runtime with the launch's message. */
    expect_runtime_error((const char *[]){"OMPI_COMM_WORLD_RANK=1", NULL}, ZT_ERR_CONFIG,
                         "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
    expect_runtime_error((const char *[]){"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2",
                                          "ZT_COMM_MPI_LIBRARY=/nonexistent/libzt-comm-mpi.so", NULL},
                         ZT_ERR_NOT_FOUND,
                         "this run has 2 ranks (from mpirun) but zt's MPI backend /nonexistent/libzt-comm-mpi.so "
                         "(ZT_COMM_MPI_LIBRARY) cannot be loaded: /nonexistent/libzt-comm-mpi.so: cannot open");
    expect_runtime_error((const char *[]){"PMI_RANK=0", "PMI_SIZE=3", "ZT_COMM_MPI_LIBRARY=" ZT_TEST_NOT_A_BACKEND,
                                          NULL},
                         ZT_ERR_NOT_FOUND, "(ZT_COMM_MPI_LIBRARY) does not export zt_comm_mpi_create_v1: it is not "
                                           "zt's MPI backend, or one from another version of zt");

    set_env(NULL);
    zt_launch two = {.rank = 0, .world_size = 2, .local_rank = 0, .launcher = "mpirun"};
    zt_comm_backend *backend = NULL;
    zt_error err = {0};
    /* GPU ranks: the NCCL module's messages. */
    set_env((const char *[]){"ZT_COMM_NCCL_LIBRARY=/nonexistent/libzt-comm-nccl.so", NULL});
    ZT_CHECK_INT(zt_launch_comm_create(&two, ZT_DEVICE_CUDA, 300, &backend, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "this run has 2 ranks (from mpirun) on GPUs but zt's NCCL backend "
                               "/nonexistent/libzt-comm-nccl.so (ZT_COMM_NCCL_LIBRARY) cannot be loaded");
    set_env((const char *[]){"ZT_COMM_NCCL_LIBRARY=" ZT_TEST_NOT_A_BACKEND, NULL});
    ZT_CHECK_INT(zt_launch_comm_create(&two, ZT_DEVICE_CUDA, 300, &backend, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "(ZT_COMM_NCCL_LIBRARY) does not export zt_comm_nccl_create_v1 and "
                               "zt_comm_nccl_unique_id_v1: it is not zt's NCCL backend");
    ZT_CHECK(backend == NULL);
    /* A rendezvous address that is half given is refused before anything connects. */
#if ZT_TEST_HAVE_NCCL
    zt_launch two_gpus = {.rank = 1, .world_size = 2, .local_rank = 1, .launcher = "torchrun"};
    set_env((const char *[]){"MASTER_ADDR=127.0.0.1", NULL});
    ZT_CHECK_INT(zt_launch_comm_create(&two_gpus, ZT_DEVICE_CUDA, 1, &backend, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "MASTER_ADDR is set but MASTER_PORT is not");
#endif

    /* --nproc started GPU ranks, but the run resolved to the CPU (a config file's device=cpu). */
    expect_runtime_error((const char *[]){"ZT_RANK=0", "ZT_WORLD_SIZE=2", "ZT_LAUNCHER=zt-run --nproc", NULL},
                         ZT_ERR_CONFIG, "zt-run --nproc started these 2 ranks for GPUs (device auto or cuda on the "
                                        "command line, GPUs present), but this run resolved to the CPU");

}

/* ZT_WORLD_SIZE=2 without a launcher MPI knows: MPI starts as a single process and says so. Its own
 * process (`test_launch mpi-start`): MPI cannot start twice, and leaves allocations behind that a
 * leak checker would report. */
static void test_mpi_start_mismatch(void)
{
    expect_runtime_error((const char *[]){"ZT_RANK=0", "ZT_WORLD_SIZE=2", NULL}, ZT_ERR_COMM,
                         "the launch environment says this is rank 0 of 2 (from ZT_WORLD_SIZE), but MPI sees rank 0 "
                         "of 1: the ranks were not started by a launcher that this MPI connects. Start them with "
                         "the mpirun of the MPI zt was built with (mpirun -np 2 zt-run ...)");
    /* That start finalized MPI, which cannot start again in this process. */
    expect_runtime_error((const char *[]){"ZT_RANK=0", "ZT_WORLD_SIZE=2", NULL}, ZT_ERR_COMM,
                         "MPI was already finalized in this process");
}

/* A child that a rank forks to inspect plugins is one process, whatever the environment says. */
static void test_single_process(void)
{
    set_env((const char *[]){"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4",
                             "ZT_COMM_MPI_LIBRARY=/nonexistent/libzt-comm-mpi.so", NULL});
    zt_runtime_options opt = {.n_threads = 1, .device_type = ZT_DEVICE_CPU, .single_process = 1};
    zt_runtime *rt = NULL;
    zt_error err = {0};
    ZT_CHECK_INT(zt_runtime_create(&opt, NULL, &rt, &err), ZT_OK);
    if (!rt) return;
    const zt_host *h = zt_runtime_host(rt, "test", NULL, 0);
    ZT_CHECK_INT(h->world_rank, 0);
    ZT_CHECK_INT(h->world_size, 1);
    zt_runtime_destroy(rt);
}

/* The watchdog's key: 300 s unless set, never negative (docs/config.md). */
static void test_timeout_key(void)
{
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    zt_config *cfg = zt_config_new();
    zt_error err = {0};
    ZT_CHECK_INT(zt_config_add_schema(cfg, "host", host_opts, n_host, &err), ZT_OK);
    double timeout = -1;
    ZT_CHECK_INT(zt_config_get_float(cfg, "comm.timeout_s", &timeout), ZT_OK);
    ZT_CHECK_CLOSE(timeout, 300.0, 0, 0);
    ZT_CHECK_INT(zt_config_set(cfg, "comm.timeout_s=-1", &err), ZT_OK);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "comm.timeout_s");
    zt_config_free(cfg);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "mpi-start") == 0) {
        test_mpi_start_mismatch();
        return zt_test_result();
    }
    test_detect();
    test_torchrun();
    test_launch_local_refusals();
    test_single_process();
    test_timeout_key();
    test_backend_errors();
    return zt_test_result();
}
