/* How this process was launched: rank and world size from the launcher's environment, the
 * communication backend that launch calls for, and `zt-run --nproc`. See launch.h. */
#define _GNU_SOURCE /* readlink, strsignal, prctl, pipe2 */
#include "dist/launch.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/module.h"
#include "base/threadpool.h"
#include "device/device.h"
#include "dist/comm_mpi.h"
#include "dist/comm_nccl.h"

#if !defined(ZT_HAVE_MPI_BACKEND) || !defined(ZT_HAVE_NCCL_BACKEND)
#error "ZT_HAVE_MPI_BACKEND and ZT_HAVE_NCCL_BACKEND must be defined (framework/CMakeLists.txt)"
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
    {"torchrun", "torchrun (or another launcher that sets RANK and WORLD_SIZE)", "RANK", "WORLD_SIZE", "LOCAL_RANK",
     NULL},
};

/* The children of `zt-run --nproc` on GPUs say so (ZT_LAUNCHER), for messages. */
#define NPROC_LAUNCHER "zt-run --nproc"

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
        const char *named = env_value("ZT_LAUNCHER");
        if (i == 0 && named && strcmp(named, NPROC_LAUNCHER) == 0) found.launcher = NPROC_LAUNCHER;
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

/* ---- the TCP rendezvous ------------------------------------------------------------------------ */

#define RDV_MAGIC 0x7a74726eu /* "ztrn" */

/* Milliseconds left before `deadline` for poll(); -1 (forever) when there is none. */
static int ms_left(double deadline)
{
    if (deadline <= 0) return -1;
    double left = deadline - zt_now_s();
    return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

/* Moves exactly `len` bytes, or fails at the deadline / on EOF. recv_not_send picks the direction. */
static int transfer_all(int fd, void *buf, size_t len, int recv_not_send, double deadline)
{
    size_t done = 0;
    while (done < len) {
        struct pollfd p = {.fd = fd, .events = recv_not_send ? POLLIN : POLLOUT};
        int r = poll(&p, 1, ms_left(deadline));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        ssize_t n = recv_not_send ? recv(fd, (char *)buf + done, len - done, 0)
                                  : send(fd, (const char *)buf + done, len - done, MSG_NOSIGNAL);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    return 0;
}

static zt_status rendezvous_serve(const char *addr, int port, int32_t world, double timeout_s, const void *data,
                                  size_t len, zt_error *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    /* Rank 0 listens on every interface: the address is for the others to find this machine by. */
    int rc = getaddrinfo(NULL, port_text, &hints, &ai);
    if (rc) return zt_error_set(err, ZT_ERR_COMM, "rank 0: cannot listen on port %d: %s", port, gai_strerror(rc));
    /* The first of the wildcard addresses (IPv6, which also takes IPv4, or IPv4) that binds. */
    int fd = -1, e = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            e = errno;
            continue;
        }
        int one = 1, off = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    if (fd < 0) {
        freeaddrinfo(ai);
        return zt_error_set(err, ZT_ERR_COMM,
                            "rank 0 cannot open the rendezvous on port %d (for %s:%d): %s: pick a free port "
                            "(ZT_MASTER_PORT or MASTER_PORT), or end what holds this one", port, addr, port,
                            strerror(e));
    }
    freeaddrinfo(ai);
    double deadline = timeout_s > 0 ? zt_now_s() + timeout_s : 0;
    char *seen = calloc((size_t)world, 1);
    if (!seen) {
        close(fd);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory at the rendezvous");
    }
    int32_t n_seen = 1;
    zt_status st = ZT_OK;
    while (n_seen < world && st == ZT_OK) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, ms_left(deadline));
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) {
            char missing[256] = "";
            size_t used = 0;
            for (int32_t i = 1; i < world && used + 16 < sizeof missing; i++)
                if (!seen[i]) used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d", used ? ", " : "", i);
            st = zt_error_set(err, ZT_ERR_TIMEOUT,
                              "rank 0 of %d: %s %s did not reach the rendezvous at %s:%d after %g s: did they "
                              "start, with the same ZT_MASTER_ADDR/ZT_MASTER_PORT, and can they reach this machine "
                              "on that port (firewall)? Raise comm.timeout_s if they start slowly",
                              world, world - n_seen == 1 ? "rank" : "ranks", missing, addr, port, timeout_s);
            break;
        }
        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) continue;
        uint32_t hello[3];
        double one_deadline = zt_now_s() + 10; /* a connected peer answers at once */
        if (transfer_all(c, hello, sizeof hello, 1, deadline > 0 && deadline < one_deadline ? deadline : one_deadline)
            || ntohl(hello[0]) != RDV_MAGIC) {
            close(c); /* not a zt rank (a port scanner, a stale job): ignore it */
            continue;
        }
        uint32_t their_rank = ntohl(hello[1]), their_world = ntohl(hello[2]);
        if ((int32_t)their_world != world || their_rank == 0 || their_rank >= (uint32_t)world || seen[their_rank]) {
            st = zt_error_set(err, ZT_ERR_COMM,
                              "rank 0 of %d: the rendezvous at %s:%d was reached by rank %u of %u%s: two jobs "
                              "share this address and port, or the ranks were started with different world "
                              "sizes; give each job its own port", world, addr, port, their_rank, their_world,
                              their_rank < (uint32_t)world && seen[their_rank] ? " a second time" : "");
            close(c);
            break;
        }
        if (transfer_all(c, (void *)data, len, 0, one_deadline) == 0) {
            seen[their_rank] = 1;
            n_seen++;
        }
        close(c);
    }
    free(seen);
    close(fd);
    return st;
}

static zt_status rendezvous_join(const char *addr, int port, int32_t rank, int32_t world, double timeout_s,
                                 void *data, size_t len, zt_error *err)
{
    double start = zt_now_s(), deadline = timeout_s > 0 ? start + timeout_s : 0;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    const char *last = "no attempt";
    char last_buf[256];
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        int rc = getaddrinfo(addr, port_text, &hints, &ai);
        if (rc == 0) {
            for (struct addrinfo *a = ai; a; a = a->ai_next) {
                int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
                if (fd < 0) continue;
                int ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
                if (!ok && errno == EINPROGRESS) {
                    struct pollfd p = {.fd = fd, .events = POLLOUT};
                    int wait_ms = ms_left(deadline);
                    if (wait_ms < 0 || wait_ms > 5000) wait_ms = 5000;
                    int soerr = 0;
                    socklen_t sl = sizeof soerr;
                    if (poll(&p, 1, wait_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && !soerr)
                        ok = 1;
                    else
                        errno = soerr ? soerr : ETIMEDOUT;
                }
                if (!ok) {
                    snprintf(last_buf, sizeof last_buf, "%s", strerror(errno));
                    last = last_buf;
                    close(fd);
                    continue;
                }
                uint32_t hello[3] = {htonl(RDV_MAGIC), htonl((uint32_t)rank), htonl((uint32_t)world)};
                double io_deadline = zt_now_s() + (timeout_s > 0 ? timeout_s : 3600);
                int got = transfer_all(fd, hello, sizeof hello, 0, io_deadline) == 0 &&
                          transfer_all(fd, data, len, 1, io_deadline) == 0;
                close(fd);
                freeaddrinfo(ai);
                if (got) return ZT_OK;
                return zt_error_set(err, ZT_ERR_COMM,
                                    "rank %d of %d reached the rendezvous at %s:%d but got no answer: rank 0 refused "
                                    "it (its output says why: another job on this port, or a different world "
                                    "size) or ended", rank, world, addr, port);
            }
            freeaddrinfo(ai);
        } else {
            snprintf(last_buf, sizeof last_buf, "cannot resolve %s: %s", addr, gai_strerror(rc));
            last = last_buf;
        }
        if (deadline > 0 && zt_now_s() >= deadline)
            return zt_error_set(err, ZT_ERR_TIMEOUT,
                                "rank %d of %d could not reach the rendezvous at %s:%d after %g s (%s): is rank 0 "
                                "running, with the same ZT_MASTER_ADDR/ZT_MASTER_PORT? Is the address this "
                                "machine reaches rank 0's machine by? Raise comm.timeout_s if rank 0 starts slowly",
                                rank, world, addr, port, timeout_s, last);
        struct timespec pause = {0, 200 * 1000 * 1000}; /* rank 0 may not be listening yet */
        nanosleep(&pause, NULL);
    }
}

zt_status zt_rendezvous_exchange(const char *addr, int port, int32_t rank, int32_t world_size, double timeout_s,
                                 void *data, size_t len, zt_error *err)
{
    if (rank == 0) return rendezvous_serve(addr, port, world_size, timeout_s, data, len, err);
    return rendezvous_join(addr, port, rank, world_size, timeout_s, data, len, err);
}

/* The rendezvous address: ZT_MASTER_ADDR/ZT_MASTER_PORT, else torchrun's MASTER_ADDR/MASTER_PORT.
 * Returns 0 when neither is set; an error for half of one or a bad port. */
zt_status zt_launch_rendezvous_address(char *addr, size_t cap, int *port, int *found, zt_error *err)
{
    static const char *const pairs[2][2] = {{"ZT_MASTER_ADDR", "ZT_MASTER_PORT"}, {"MASTER_ADDR", "MASTER_PORT"}};
    *found = 0;
    for (int i = 0; i < 2; i++) {
        const char *a = env_value(pairs[i][0]), *p = env_value(pairs[i][1]);
        if (!a && !p) continue;
        if (!a || !p)
            return zt_error_set(err, ZT_ERR_CONFIG, "%s is set but %s is not: the rendezvous needs both rank 0's "
                                "address and a port (e.g. %s=node0 %s=29500)", a ? pairs[i][0] : pairs[i][1],
                                a ? pairs[i][1] : pairs[i][0], pairs[i][0], pairs[i][1]);
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || *end || v < 1 || v > 65535)
            return zt_error_set(err, ZT_ERR_CONFIG, "%s='%s' is not a TCP port (1 to 65535)", pairs[i][1], p);
        /* Under torchrun the agent's own store already listens on MASTER_PORT: take the next. */
        const char *agent_store = env_value("TORCHELASTIC_USE_AGENT_STORE");
        if (i == 1 && agent_store && (strcmp(agent_store, "True") == 0 || strcmp(agent_store, "1") == 0)) {
            if (v == 65535)
                return zt_error_set(err, ZT_ERR_CONFIG, "MASTER_PORT=65535: under torchrun zt's rendezvous uses "
                                    "MASTER_PORT + 1 (torchrun's store holds MASTER_PORT): pick a lower "
                                    "--master-port");
            v++;
        }
        snprintf(addr, cap, "%s", a);
        *port = (int)v;
        *found = 1;
        return ZT_OK;
    }
    return ZT_OK;
}

/* ---- GPU ranks: the NCCL backend --------------------------------------------------------------- */

typedef struct nccl_module {
    zt_comm_nccl_unique_id_fn unique_id;
    zt_comm_nccl_create_fn create;
} nccl_module;

/* Loads libzt-comm-nccl.so ($ZT_COMM_NCCL_LIBRARY, else where zt_module_find looks). */
static zt_status load_nccl_module(int32_t world, const char *launcher, nccl_module *out, zt_error *err)
{
    char path[PATH_MAX], tried[3 * PATH_MAX + 16];
    const char *chosen = env_value("ZT_COMM_NCCL_LIBRARY");
    if (chosen) {
        snprintf(path, sizeof path, "%s", chosen);
    } else if (!ZT_HAVE_NCCL_BACKEND) {
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "this run has %d ranks (from %s) on GPUs, but zt was built without NCCL, through which "
                            "GPU ranks talk: install NCCL (the CUDA toolkit's, libnccl-dev, or pip install "
                            "nvidia-nccl-cu12), re-run CMake (it prints 'zt: NCCL: ...'; ZT_NCCL_ROOT points it at "
                            "one), rebuild; or run the ranks on the CPU (--set device=cpu)", world, launcher);
    } else if (!zt_module_find(ZT_COMM_NCCL_FILE, path, sizeof path, tried, sizeof tried)) {
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "this run has %d ranks (from %s) on GPUs and needs zt's NCCL backend "
                            "libzt-comm-nccl.so, which is in none of these places:%s\nReinstall zt (cmake "
                            "--install), or set ZT_COMM_NCCL_LIBRARY to the library's path", world, launcher, tried);
    }
    /* Never closed: NCCL's threads live as long as the process. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "this run has %d ranks (from %s) on GPUs but zt's NCCL backend %s%s cannot be loaded: "
                            "%s\nInstall the NCCL it was built with (libnccl2, or the pip package "
                            "nvidia-nccl-cu12 with its lib/ on LD_LIBRARY_PATH)", world, launcher, path,
                            chosen ? " (ZT_COMM_NCCL_LIBRARY)" : "", dlerror());
    out->unique_id = (zt_comm_nccl_unique_id_fn)dlsym(lib, ZT_COMM_NCCL_ID_ENTRY);
    out->create = (zt_comm_nccl_create_fn)dlsym(lib, ZT_COMM_NCCL_ENTRY);
    if (!out->unique_id || !out->create) {
        dlclose(lib);
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "%s%s does not export %s and %s: it is not zt's NCCL backend, or one from another "
                            "version of zt; rebuild and reinstall zt%s", path, chosen ? " (ZT_COMM_NCCL_LIBRARY)" : "",
                            ZT_COMM_NCCL_ENTRY, ZT_COMM_NCCL_ID_ENTRY, chosen ? ", or unset ZT_COMM_NCCL_LIBRARY" : "");
    }
    return ZT_OK;
}

static zt_status load_mpi_backend(const zt_launch *launch, double timeout_s, zt_comm_backend **out, zt_error *err);

/* The job's NCCL id goes from rank 0 to every rank through the TCP rendezvous when an address is
 * given, else through MPI (mpirun, srun --mpi=pmix), which then stays up until NCCL is done. */
static zt_status nccl_comm_create(const zt_launch *launch, double timeout_s, zt_comm_backend **out, zt_error *err)
{
    nccl_module mod = {0};
    zt_status st = load_nccl_module(launch->world_size, launch->launcher, &mod, err);
    if (st != ZT_OK) return st;
    zt_comm_nccl_options opt = {.rank = launch->rank, .world_size = launch->world_size,
                                .launcher = launch->launcher, .timeout_s = timeout_s};
    char version[32] = "";
    if (launch->rank == 0) {
        st = mod.unique_id(opt.id, version, sizeof version, err);
        if (st != ZT_OK) return st;
    }
    char addr[256];
    int port = 0, have_addr = 0;
    st = zt_launch_rendezvous_address(addr, sizeof addr, &port, &have_addr, err);
    if (st != ZT_OK) return st;
    if (have_addr) {
        st = zt_rendezvous_exchange(addr, port, launch->rank, launch->world_size, timeout_s, opt.id, sizeof opt.id, err);
    } else {
        int have_mpi = env_value("ZT_COMM_MPI_LIBRARY") != NULL;
        if (!have_mpi && ZT_HAVE_MPI_BACKEND) {
            char path[PATH_MAX], tried[3 * PATH_MAX + 16];
            have_mpi = zt_module_find(ZT_COMM_MPI_FILE, path, sizeof path, tried, sizeof tried);
        }
        if (!have_mpi)
            return zt_error_set(err, ZT_ERR_CONFIG,
                                "this run has %d ranks (from %s) on GPUs, which NCCL connects once rank 0's id "
                                "reaches them: set ZT_MASTER_ADDR to rank 0's host and ZT_MASTER_PORT to a free "
                                "port (the same on every rank), or build zt with MPI (libopenmpi-dev) so the "
                                "id goes through mpirun's or srun --mpi=pmix's MPI", launch->world_size,
                                launch->launcher);
        zt_comm_backend *mpi = NULL;
        st = load_mpi_backend(launch, timeout_s, &mpi, err);
        if (st != ZT_OK) return st;
        int32_t *all = malloc((size_t)launch->world_size * sizeof *all);
        void *world = NULL;
        if (!all) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory starting NCCL");
        for (int32_t i = 0; all && i < launch->world_size; i++) all[i] = i;
        if (st == ZT_OK) st = mpi->group_create(mpi, "nccl-id", all, launch->world_size, &world, err);
        if (st == ZT_OK) st = mpi->broadcast(mpi, world, opt.id, sizeof opt.id, ZT_U8, 0, NULL, err);
        if (world) mpi->group_destroy(mpi, world);
        free(all);
        if (st != ZT_OK) {
            mpi->destroy(mpi);
            return st;
        }
        opt.bootstrap = mpi;
    }
    if (st == ZT_OK) st = mod.create(&opt, out, err);
    if (st != ZT_OK && opt.bootstrap) opt.bootstrap->destroy(opt.bootstrap);
    return st;
}

zt_status zt_launch_comm_create(const zt_launch *launch, int device_type, double timeout_s,
                                zt_comm_backend **out, zt_error *err)
{
    *out = NULL;
    if (device_type != ZT_DEVICE_CPU) return nccl_comm_create(launch, timeout_s, out, err);
    if (launch->launcher && strcmp(launch->launcher, NPROC_LAUNCHER) == 0)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "zt-run --nproc started these %d ranks for GPUs (device auto or cuda on the command "
                            "line, GPUs present), but this run resolved to the CPU (the config file's device, or a "
                            "plugin that runs on the CPU only): pass --set device=cpu on the command line so "
                            "--nproc starts CPU ranks through mpirun, or --set device=cuda", launch->world_size);
    return load_mpi_backend(launch, timeout_s, out, err);
}

static zt_status load_mpi_backend(const zt_launch *launch, double timeout_s, zt_comm_backend **out, zt_error *err)
{
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

/* ---- zt-run --nproc on GPUs: the ranks are this process's children ----------------------------- */

#define NPROC_GRACE_S 10.0 /* after one rank fails, the others get this long to end on SIGTERM */

static volatile sig_atomic_t g_forward_signal;

static void on_forward_signal(int sig) { g_forward_signal = sig; }

/* The value of the last `--set device=V` (or --set=device=V) in argv; NULL when none. */
static const char *device_in_args(int argc, char **argv)
{
    const char *found = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = NULL;
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) a = argv[++i];
        else if (strncmp(argv[i], "--set=", 6) == 0) a = argv[i] + 6;
        if (a && strncmp(a, "device=", 7) == 0) found = a + 7;
    }
    return found;
}

/* A free TCP port on 127.0.0.1 for the children's rendezvous, held (*holder, bound, never listening)
 * until they are done: a port merely found free and closed again can be taken as the source port of
 * some other program's connection before rank 0 binds it (seen with NCCL jobs running beside each
 * other); Linux never picks an explicitly bound port for that. Both sockets set SO_REUSEADDR, so rank
 * 0's listening socket may bind the port while this one holds it (it never listens). */
static int reserve_local_port(int *holder, zt_error *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || getsockname(fd, (struct sockaddr *)&sa, &len)) {
        int e = errno;
        if (fd >= 0) close(fd);
        zt_error_set(err, ZT_ERR_IO, "--nproc: cannot find a free TCP port on 127.0.0.1 for the ranks' "
                     "rendezvous: %s", strerror(e));
        return -1;
    }
    *holder = fd;
    return ntohs(sa.sin_port);
}

typedef struct rank_output {
    int fd;            /* -1 when closed */
    FILE *to;          /* stdout or stderr */
    int rank;
    char buf[16384];
    size_t len;
} rank_output;

/* zt's own log lines already say "zt[rank 1] ...": those go as they are. */
static void emit_line(rank_output *o, const char *line, size_t len)
{
    if (len >= 8 && strncmp(line, "zt[rank ", 8) == 0)
        fprintf(o->to, "%.*s\n", (int)len, line);
    else
        fprintf(o->to, "[rank %d] %.*s\n", o->rank, (int)len, line);
}

/* Writes the complete lines of `o` (all of it when `flush`), each prefixed with its rank. */
static void emit_lines(rank_output *o, int flush)
{
    size_t start = 0;
    for (size_t i = 0; i < o->len; i++)
        if (o->buf[i] == '\n') {
            emit_line(o, o->buf + start, i - start);
            start = i + 1;
        }
    if (flush && start < o->len) {
        emit_line(o, o->buf + start, o->len - start);
        start = o->len;
    }
    memmove(o->buf, o->buf + start, o->len - start);
    o->len -= start;
    fflush(o->to);
}

static void pump_output(rank_output *outs, int n_outs, int wait_ms)
{
    struct pollfd fds[2 * MAX_LOCAL_RANKS];
    int map[2 * MAX_LOCAL_RANKS], n = 0;
    for (int i = 0; i < n_outs; i++)
        if (outs[i].fd >= 0) {
            fds[n] = (struct pollfd){.fd = outs[i].fd, .events = POLLIN};
            map[n++] = i;
        }
    if (!n) {
        if (wait_ms > 0) {
            struct timespec ts = {0, (long)wait_ms * 1000000L};
            nanosleep(&ts, NULL);
        }
        return;
    }
    if (poll(fds, (nfds_t)n, wait_ms) <= 0) return;
    for (int k = 0; k < n; k++) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        rank_output *o = &outs[map[k]];
        if (o->len == sizeof o->buf) emit_lines(o, 1); /* a line longer than the buffer: split it */
        ssize_t got = read(o->fd, o->buf + o->len, sizeof o->buf - o->len);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) {
            emit_lines(o, 1);
            close(o->fd);
            o->fd = -1;
            continue;
        }
        o->len += (size_t)got;
        emit_lines(o, 0);
    }
}

static void describe_exit(int status, char *out, size_t cap)
{
    if (WIFEXITED(status))
        snprintf(out, cap, "exited with code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "was killed by signal %d (%s)%s", WTERMSIG(status), strsignal(WTERMSIG(status)),
                 WTERMSIG(status) == SIGKILL ? ": out of memory (dmesg says), or killed by hand" : "");
    else
        snprintf(out, cap, "ended with status %d", status);
}

/* Starts the children, relays their output and signals, and returns the job's exit code. */
static int supervise_ranks(const char *exe, char **args, long nproc, int port)
{
    pid_t pids[MAX_LOCAL_RANKS];
    int alive[MAX_LOCAL_RANKS];
    rank_output *outs = calloc((size_t)(2 * nproc), sizeof *outs);
    if (!outs) {
        fprintf(stderr, "zt-run: error: out of memory starting %ld ranks\n", nproc);
        return 1;
    }
    int n_outs = 0;
    struct sigaction sa, old_int, old_term, old_hup;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_forward_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
    pid_t parent = getpid();
    char port_text[16], world_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    snprintf(world_text, sizeof world_text, "%ld", nproc);
    long started = 0;
    int code = 0, failed_rank = -1;
    fflush(NULL);
    for (long r = 0; r < nproc; r++) {
        int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
        /* Rank 0 writes straight to this terminal: its output stays as a single run's. */
        if (r > 0 && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)) {
            fprintf(stderr, "zt-run: error: --nproc: cannot create a pipe for rank %ld: %s\n", r, strerror(errno));
            code = 1;
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "zt-run: error: --nproc: cannot start rank %ld: %s\n", r, strerror(errno));
            code = 1;
            break;
        }
        if (pid == 0) {
            /* Its own process group: a terminal's Ctrl-C reaches only zt-run, which forwards it once. */
            setpgid(0, 0);
            prctl(PR_SET_PDEATHSIG, SIGTERM); /* zt-run killed outright: the ranks end too */
            if (getppid() != parent) _exit(1);
            if (r > 0 && (dup2(out_pipe[1], STDOUT_FILENO) < 0 || dup2(err_pipe[1], STDERR_FILENO) < 0)) _exit(127);
            char rank_text[24];
            snprintf(rank_text, sizeof rank_text, "%ld", r);
            setenv("ZT_RANK", rank_text, 1);
            setenv("ZT_LOCAL_RANK", rank_text, 1);
            setenv("ZT_WORLD_SIZE", world_text, 1);
            setenv("ZT_LAUNCHER", NPROC_LAUNCHER, 1);
            setenv("ZT_MASTER_ADDR", "127.0.0.1", 1);
            setenv("ZT_MASTER_PORT", port_text, 1);
            setenv("NCCL_NVLS_ENABLE", "0", 0); /* NVLink multicast off unless asked for */
            execv(exe, args);
            fprintf(stderr, "zt-run: error: --nproc: cannot start rank %ld (%s): %s\n", r, exe, strerror(errno));
            _exit(127);
        }
        pids[r] = pid;
        alive[r] = 1;
        started++;
        if (r > 0) {
            close(out_pipe[1]);
            close(err_pipe[1]);
            outs[n_outs++] = (rank_output){.fd = out_pipe[0], .to = stdout, .rank = (int)r};
            outs[n_outs++] = (rank_output){.fd = err_pipe[0], .to = stderr, .rank = (int)r};
        }
    }
    if (code) { /* a rank could not start: end those that did */
        for (long r = 0; r < started; r++) kill(pids[r], SIGTERM);
        failed_rank = -2;
    }
    long n_alive = started;
    double kill_at = code ? zt_now_s() + NPROC_GRACE_S : 0;
    while (n_alive > 0) {
        pump_output(outs, n_outs, 100);
        int sig = g_forward_signal;
        if (sig) {
            g_forward_signal = 0;
            for (long r = 0; r < started; r++)
                if (alive[r]) kill(pids[r], sig);
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            long r = 0;
            while (r < started && pids[r] != pid) r++;
            if (r == started || !alive[r]) continue;
            alive[r] = 0;
            n_alive--;
            int bad = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            if (!bad || failed_rank != -1) continue;
            failed_rank = (int)r;
            code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            pump_output(outs, n_outs, 0); /* its last words first */
            char how[160];
            describe_exit(status, how, sizeof how);
            fprintf(stderr, "zt-run: rank %ld of %ld %s%s\n", r, nproc, how,
                    n_alive ? "; ending the other ranks (SIGTERM, then SIGKILL after 10 s)" : "");
            fflush(stderr);
            for (long o = 0; o < started; o++)
                if (alive[o]) kill(pids[o], SIGTERM);
            kill_at = zt_now_s() + NPROC_GRACE_S;
        }
        if (kill_at > 0 && zt_now_s() >= kill_at) {
            for (long r = 0; r < started; r++)
                if (alive[r]) {
                    fprintf(stderr, "zt-run: rank %ld of %ld did not end within 10 s of SIGTERM: SIGKILL\n", r, nproc);
                    kill(pids[r], SIGKILL);
                }
            kill_at = 0;
        }
    }
    /* Whatever the ranks wrote last (a child of theirs could hold a pipe: stop after a second). */
    double drain_until = zt_now_s() + 1.0;
    int open_outs = 1;
    while (open_outs && zt_now_s() < drain_until) {
        pump_output(outs, n_outs, 100);
        open_outs = 0;
        for (int i = 0; i < n_outs; i++) open_outs |= outs[i].fd >= 0;
    }
    for (int i = 0; i < n_outs; i++)
        if (outs[i].fd >= 0) {
            emit_lines(&outs[i], 1);
            close(outs[i].fd);
        }
    free(outs);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    return code;
}

/* Whether --nproc starts GPU ranks (*gpu): device cuda, or auto (the default) with GPUs here. An
 * error when cuda is asked for and unusable, there are fewer GPUs than ranks, or no NCCL backend. */
static zt_status choose_gpu_ranks(long nproc, int mode, int argc, char **argv, int *gpu, zt_error *err)
{
    *gpu = mode == ZT_NPROC_FORK;
    if (*gpu) return ZT_OK;
    const char *device = device_in_args(argc, argv);
    if (mode == ZT_NPROC_CPU || (mode == ZT_NPROC_AUTO && device && strcmp(device, "cpu") == 0)) return ZT_OK;
    int want_cuda = mode == ZT_NPROC_GPU || (device && strcmp(device, "cuda") == 0);
    int n_gpus = 0;
    zt_error cuda_err;
    if (zt_device_cuda_count(&n_gpus, &cuda_err) != ZT_OK) {
        if (!want_cuda) return ZT_OK; /* auto without GPUs: CPU ranks */
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "--nproc %ld with device=cuda starts one rank per GPU, but %s: run on a machine with "
                            "GPUs, or start CPU ranks (--set device=cpu)", nproc, cuda_err.msg);
    }
    if (nproc > n_gpus)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "--nproc %ld starts one rank per GPU, but this process sees %d GPU%s%s: use --nproc %d "
                            "or fewer, or start CPU ranks (--set device=cpu)", nproc, n_gpus, n_gpus == 1 ? "" : "s",
                            env_value("CUDA_VISIBLE_DEVICES") ? " (CUDA_VISIBLE_DEVICES limits them)" : "", n_gpus);
    if (!env_value("ZT_COMM_NCCL_LIBRARY")) {
        char path[PATH_MAX], tried[3 * PATH_MAX + 16];
        if (!ZT_HAVE_NCCL_BACKEND || !zt_module_find(ZT_COMM_NCCL_FILE, path, sizeof path, tried, sizeof tried))
            return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                                "--nproc %ld starts GPU ranks that talk through NCCL, but %s: install NCCL and "
                                "rebuild zt (docs/distributed.md), or start CPU ranks (--set device=cpu)", nproc,
                                ZT_HAVE_NCCL_BACKEND ? "zt's NCCL backend libzt-comm-nccl.so is missing"
                                                     : "zt was built without NCCL");
    }
    *gpu = 1;
    return ZT_OK;
}

zt_status zt_launch_local(const char *nproc_text, int argc, char **argv, zt_error *err)
{
    return zt_launch_local_mode(nproc_text, ZT_NPROC_AUTO, argc, argv, err);
}

zt_status zt_launch_local_mode(const char *nproc_text, int mode, int argc, char **argv, zt_error *err)
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
    int gpu = 0;
    st = choose_gpu_ranks(nproc, mode, argc, argv, &gpu, err);
    if (st != ZT_OK) return st;
    if (gpu) {
        char exe[PATH_MAX];
        ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (len <= 0) return zt_error_set(err, ZT_ERR_IO, "--nproc: cannot find this program's own path "
                                          "(/proc/self/exe: %s)", strerror(errno));
        exe[len] = '\0';
        int port_holder = -1, port = reserve_local_port(&port_holder, err);
        if (port < 0) return err->status;
        char **args = calloc((size_t)argc + 1, sizeof *args);
        if (!args) {
            close(port_holder);
            return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory starting %ld ranks", nproc);
        }
        int n = 0;
        args[n++] = exe;
        for (int i = 1; i < argc; i++) {
            if (strcmp(argv[i], "--nproc") == 0) {
                i++;
                continue;
            }
            if (strncmp(argv[i], "--nproc=", 8) == 0) continue;
            args[n++] = argv[i];
        }
        args[n] = NULL;
        int code = supervise_ranks(exe, args, nproc, port);
        close(port_holder);
        free(args);
        fflush(NULL);
        exit(code);
    }
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
