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
    "ZT_MASTER_ADDR", "ZT_MASTER_PORT", "MASTER_ADDR", "MASTER_PORT", "ZT_COMM_NCCL_LIBRARY", "ZT_LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", NULL};

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

/* The local world size, which only some launchers give (-1: not told). */
static void expect_local_world(const char *const *env, int local_world)
{
    set_env(env);
    zt_launch l;
    zt_error err = {0};
    ZT_CHECK_INT(zt_launch_detect(&l, &err), ZT_OK);
    ZT_CHECK_INT(l.local_world_size, local_world);
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
    /* torchrun's LOCAL_WORLD_SIZE: the ranks on this machine, from 1 to WORLD_SIZE, above LOCAL_RANK. */
    expect_local_world((const char *[]){"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", NULL}, 2);
    expect_local_world((const char *[]){"RANK=3", "WORLD_SIZE=4", NULL}, -1);
    expect_launch_error((const char *[]){"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", NULL},
                        "LOCAL_RANK=2 but LOCAL_WORLD_SIZE=2 (torchrun (or another launcher that sets RANK and "
                        "WORLD_SIZE) sets them): a local rank is below the number of ranks on this machine, from 0 "
                        "to 1");
    expect_launch_error((const char *[]){"RANK=3", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=5", NULL},
                        "LOCAL_WORLD_SIZE='5' is not a whole number from 1 to 4");
    expect_launch_error((const char *[]){"RANK=3", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=0", NULL},
                        "LOCAL_WORLD_SIZE='0' is not a whole number from 1 to 4");
    /* The other launchers' local sizes; srun gives none (SLURM_NTASKS_PER_NODE is what was asked for). */
    expect_local_world((const char *[]){"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4",
                                        "OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL}, 2);
    expect_local_world((const char *[]){"PMI_RANK=1", "PMI_SIZE=3", "MPI_LOCALNRANKS=3", NULL}, 3);
    expect_local_world((const char *[]){"ZT_RANK=1", "ZT_WORLD_SIZE=2", "ZT_LOCAL_WORLD_SIZE=1", NULL}, 1);
    expect_local_world((const char *[]){"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_STEP_ID=0",
                                        NULL}, -1);
    expect_local_world(NULL, 1); /* a single process is alone on its machine */
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

/* torchrun's flags checked (zt_launch_plan_make): defaults, the world they make, every refusal. */
static void expect_plan(zt_launch_request req, int nnodes, int per_node, int node_rank, int world, int port,
                        const char *form)
{
    zt_launch_plan plan;
    zt_error err = {0};
    ZT_CHECK_INT(zt_launch_plan_make(&req, &plan, &err), ZT_OK);
    ZT_CHECK_INT(plan.nnodes, nnodes);
    ZT_CHECK_INT(plan.per_node, per_node);
    ZT_CHECK_INT(plan.node_rank, node_rank);
    ZT_CHECK_INT(plan.world_size, world);
    ZT_CHECK_INT(plan.master_port, port);
    ZT_CHECK(strcmp(plan.form, form) == 0);
}

static void expect_plan_error(zt_launch_request req, const char *needle)
{
    zt_launch_plan plan;
    zt_error err = {0};
    ZT_CHECK_INT(zt_launch_plan_make(&req, &plan, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, needle);
}

static void test_launch_plan(void)
{
    expect_plan((zt_launch_request){0}, 1, 1, 0, 1, 0, "--nproc"); /* nothing asked: one process */
    expect_plan((zt_launch_request){.nproc = "3"}, 1, 3, 0, 3, 0, "--nproc");
    /* torchrun's defaults: 1 machine, 1 rank on it, machine 0. */
    expect_plan((zt_launch_request){.nproc_per_node = "2"}, 1, 2, 0, 2, 0, "--nproc-per-node");
    expect_plan((zt_launch_request){.nnodes = "1", .nproc_per_node = "2", .master_port = "1234"}, 1, 2, 0, 2, 1234,
                "--nproc-per-node");
    expect_plan((zt_launch_request){.nnodes = "2", .master_addr = "node0"}, 2, 1, 0, 2, 0, "--nproc-per-node");
    expect_plan((zt_launch_request){.nnodes = "3", .nproc_per_node = "8", .node_rank = "2", .master_addr = "node0",
                                    .master_port = "29400"}, 3, 8, 2, 24, 29400, "--nproc-per-node");

    expect_plan_error((zt_launch_request){.nproc = "2", .nproc_per_node = "2"},
                      "--nproc and --nproc-per-node are two ways of saying how to start the ranks: give --nproc N "
                      "alone (N ranks on this machine; the same as --nnodes 1 --nproc-per-node N), or torchrun's "
                      "flags");
    expect_plan_error((zt_launch_request){.nproc = "2", .master_port = "29500"}, "--nproc and --master-port are two");
    expect_plan_error((zt_launch_request){.nproc = "0"}, "--nproc '0': expected the number of ranks");
    expect_plan_error((zt_launch_request){.nnodes = "2", .node_rank = "2", .master_addr = "node0"},
                      "--node-rank 2 with --nnodes 2: the machines are numbered from 0 to 1");
    expect_plan_error((zt_launch_request){.node_rank = "1"}, "--node-rank 1 with --nnodes 1: the machines are "
                                                             "numbered from 0 to 0");
    expect_plan_error((zt_launch_request){.node_rank = "-1"}, "--node-rank '-1': expected this machine's number");
    expect_plan_error((zt_launch_request){.nnodes = "2", .nproc_per_node = "4"},
                      "--nnodes 2 needs --master-addr: the address or host name by which every machine reaches the "
                      "machine of rank 0");
    expect_plan_error((zt_launch_request){.nproc_per_node = "2", .master_addr = ""}, "--master-addr is empty");
    expect_plan_error((zt_launch_request){.nproc_per_node = "2", .master_port = "70000"},
                      "--master-port '70000' is not a TCP port (1 to 65535)");
    expect_plan_error((zt_launch_request){.nproc_per_node = "2", .master_port = "0"}, "--master-port '0' is not");
    expect_plan_error((zt_launch_request){.nproc_per_node = "2", .master_port = "http"}, "--master-port 'http'");
    expect_plan_error((zt_launch_request){.nnodes = "1:4"}, "--nnodes '1:4': zt-run starts a fixed number of "
                                                            "machines, not torchrun's elastic range MIN:MAX");
    expect_plan_error((zt_launch_request){.nnodes = "0"}, "--nnodes '0': expected the number of machines");
    expect_plan_error((zt_launch_request){.nproc_per_node = "gpu"},
                      "--nproc-per-node 'gpu': zt-run takes the number of ranks itself, not torchrun's 'gpu'");
    expect_plan_error((zt_launch_request){.nproc_per_node = "2000"}, "--nproc-per-node '2000': expected the number "
                                                                     "of ranks to start on this machine, a whole "
                                                                     "number from 1 to 1024");
}

/* zt_launch_start's refusals before anything starts. */
static void test_launch_start_refusals(void)
{
    /* CPU ranks on several machines: the mpirun and srun commands, with this command line in them less
     * the launch flags (both spellings), quoted for the shell. */
    set_env(NULL);
    char *argv[] = {"zt-run", "--nnodes", "2", "--nproc_per_node=2", "--data", "my data", "--node-rank", "1",
                    "--master-addr=node0", "--set", "device=cpu", NULL};
    zt_launch_request req = {.nnodes = "2", .nproc_per_node = "2", .node_rank = "1", .master_addr = "node0"};
    zt_error err = {0};
    ZT_CHECK_INT(zt_launch_start(&req, ZT_NPROC_CPU, 11, argv, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "--nnodes 2 --nproc-per-node 2 asks for CPU ranks on 2 machines, which a zt-run on "
                               "each machine cannot start: CPU ranks talk through MPI, which connects only the "
                               "processes its own launcher starts");
    ZT_CHECK_CONTAINS(err.msg, "    mpirun -np 4 --hostfile HOSTS --map-by ppr:2:node:PE=");
    ZT_CHECK_CONTAINS(err.msg, " --bind-to core zt-run --data 'my data' --set device=cpu\n");
    ZT_CHECK_CONTAINS(err.msg, "    srun -N 2 --ntasks-per-node 2 --cpus-per-task ");
    ZT_CHECK_CONTAINS(err.msg, " --mpi=pmix zt-run --data 'my data' --set device=cpu\n");
    /* Inside a launched job, torchrun's flags are refused as --nproc is. */
    set_env((const char *[]){"RANK=1", "WORLD_SIZE=2", NULL});
    zt_launch_request two = {.nproc_per_node = "2"};
    ZT_CHECK_INT(zt_launch_start(&two, ZT_NPROC_CPU, 3, (char *[]){"zt-run", "--nproc-per-node", "2", NULL}, &err),
                 ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "--nproc-per-node 2 starts the ranks itself, but this process already is rank 1 of 2 "
                               "(from torchrun): drop --nproc-per-node");
    /* One rank in all stays in this process; the address then has no effect (a note says so). */
    set_env(NULL);
    zt_launch_request one = {.nproc_per_node = "1", .master_port = "29500"};
    ZT_CHECK_INT(zt_launch_start(&one, ZT_NPROC_AUTO, 1, (char *[]){"zt-run", NULL}, &err), ZT_OK);
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

    /* CPU ranks torchrun started (its variables, no MPI launcher's): MPI cannot join them; the message
     * says how to start them, from what torchrun says of the machines. */
    expect_runtime_error((const char *[]){"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
                                          "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", NULL},
                         ZT_ERR_UNSUPPORTED,
                         "this process is rank 1 of 4 by torchrun's variables (RANK, WORLD_SIZE) and runs on the "
                         "CPU, where ranks talk through MPI, which connects only the processes its own launcher "
                         "starts (mpirun, srun), never those torchrun starts. Start these 4 ranks on 2 machines "
                         "once, from one of them: mpirun -np 4 --hostfile HOSTS --map-by ppr:2:node ");
    /* The commands hold this process's own command line (here, this test program alone). */
    expect_runtime_error((const char *[]){"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", NULL},
                         ZT_ERR_UNSUPPORTED, "/test_launch (HOSTS: one line per machine, 'node0 slots=2'), or srun "
                                             "-N 2 --ntasks-per-node 2 --mpi=pmix ");
    expect_runtime_error((const char *[]){"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", NULL},
                         ZT_ERR_UNSUPPORTED, "/test_launch under Slurm (docs/distributed.md");
    expect_runtime_error((const char *[]){"RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", NULL}, ZT_ERR_UNSUPPORTED,
                         "/test_launch --nproc 2 --set device=cpu (docs/distributed.md");
    expect_runtime_error((const char *[]){"RANK=0", "WORLD_SIZE=2", NULL}, ZT_ERR_UNSUPPORTED,
                         "/test_launch --nproc 2 --set device=cpu; on several: mpirun -np 2 --hostfile HOSTS ");
    expect_runtime_error((const char *[]){"RANK=0", "WORLD_SIZE=2", NULL}, ZT_ERR_UNSUPPORTED,
                         "GPU ranks (--set device=cuda) run under torchrun as they are");
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
    test_launch_plan();
    test_launch_start_refusals();
    test_single_process();
    test_timeout_key();
    test_backend_errors();
    return zt_test_result();
}
