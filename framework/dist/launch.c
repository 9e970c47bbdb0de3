/* How this process was launched: rank and world size from the launcher's environment, the
 * communication backend that launch calls for, and the TCP rendezvous of GPU ranks. See launch.h;
 * `zt-run --nproc` itself is in nproc.c. */
#define _GNU_SOURCE /* accept4 */
#include "dist/launch.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/module.h"
#include "dist/comm_mpi.h"
#include "dist/comm_nccl.h"
#include "dist/flight.h"
#include "dist/requirements.h"

#if !defined(ZT_HAVE_MPI_BACKEND) || !defined(ZT_HAVE_NCCL_BACKEND)
#error "ZT_HAVE_MPI_BACKEND and ZT_HAVE_NCCL_BACKEND must be defined (framework/CMakeLists.txt)"
#endif

/* ---- detection --------------------------------------------------------------------------------- */

typedef struct launch_source {
    const char *launcher; /* zt_launch.launcher */
    const char *setter;   /* who sets the variables, for messages */
    const char *rank_var, *size_var, *local_rank_var;
    const char *local_size_var; /* NULL: the launcher does not say */
    const char *step_var;       /* must also be set for the source to count; NULL: nothing more */
} launch_source;

static const launch_source k_sources[] = {
    {"ZT_WORLD_SIZE", "you or your launcher", "ZT_RANK", "ZT_WORLD_SIZE", "ZT_LOCAL_RANK", "ZT_LOCAL_WORLD_SIZE", NULL},
    {"mpirun", "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", NULL},
    {"a PMI launcher (mpiexec)", "a PMI launcher (mpiexec)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
     "MPI_LOCALNRANKS", NULL},
    /* SLURM_NTASKS_PER_NODE is what was asked for, not what this node got: no local world size. */
    {"srun", "srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, "SLURM_STEP_ID"},
    {ZT_TORCHRUN_LAUNCHER, "torchrun (or another launcher that sets RANK and WORLD_SIZE)", "RANK", "WORLD_SIZE",
     "LOCAL_RANK", "LOCAL_WORLD_SIZE", NULL},
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
    *out = (zt_launch){.rank = 0, .world_size = 1, .local_rank = 0, .local_world_size = 1,
                       .launcher = "a single process"};
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
        zt_launch found = {.local_rank = -1, .local_world_size = -1, .launcher = src->launcher};
        const char *named = env_value("ZT_LAUNCHER");
        if (i == 0 && named && strcmp(named, ZT_NPROC_LAUNCHER) == 0) found.launcher = ZT_NPROC_LAUNCHER;
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
        const char *local_size = src->local_size_var ? env_value(src->local_size_var) : NULL;
        if (local_size) {
            st = parse_env_int(src, src->local_size_var, local_size, 1, found.world_size, &found.local_world_size,
                               err);
            if (st != ZT_OK) return st;
            if (found.local_rank >= found.local_world_size)
                return zt_error_set(err, ZT_ERR_CONFIG,
                                    "%s=%d but %s=%d (%s sets them): a local rank is below the number of ranks "
                                    "on this machine, from 0 to %d", src->local_rank_var, found.local_rank,
                                    src->local_size_var, found.local_world_size, src->setter,
                                    found.local_world_size - 1);
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

/* A comm module's watchdog dumps the flight recorder through these hooks (dist/flight.h); a module
 * without the export works as before, without. */
static void give_flight_hooks(void *lib, const char *entry)
{
    zt_comm_flight_fn give = (zt_comm_flight_fn)dlsym(lib, entry);
    if (give) give(zt_flight_hooks_get());
}

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
    char why[2048], too_old[4096]; /* an older NCCL lacks the calls the backend makes: say so in --env's words */
    const char *load_error = lib ? "" : dlerror(); /* read before the check's own dlopen */
    snprintf(why, sizeof why, "%s", load_error ? load_error : "unknown dlopen error");
    if (!lib && zt_nccl_too_old(too_old, sizeof too_old))
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "this run has %d ranks (from %s) on GPUs, which talk through NCCL: %s", world, launcher,
                            too_old);
    if (!lib)
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "this run has %d ranks (from %s) on GPUs but zt's NCCL backend %s%s cannot be loaded: "
                            "%s\nInstall the NCCL it was built with (libnccl2, or the pip package "
                            "nvidia-nccl-cu12 with its lib/ on LD_LIBRARY_PATH)", world, launcher, path,
                            chosen ? " (ZT_COMM_NCCL_LIBRARY)" : "", why);
    give_flight_hooks(lib, ZT_COMM_NCCL_FLIGHT_ENTRY);
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

/* This process's command line (/proc/self/cmdline) as a shell command, for messages; "zt-run ARGS"
 * when it cannot be read. */
static void own_command(char *out, size_t cap)
{
    snprintf(out, cap, "zt-run ARGS");
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    if (n == 0) return;
    buf[n] = '\0';
    char *words[512];
    int argc = 0;
    for (size_t i = 0; i < n && argc < 512; i += strlen(buf + i) + 1) words[argc++] = buf + i;
    zt_launch_command_text(argc, words, out, cap);
}

/* CPU ranks that torchrun (RANK, WORLD_SIZE) started: MPI connects only the processes its own
 * launcher starts, so they could never meet; say how to start them instead, with this command. */
static zt_status torchrun_cpu_error(const zt_launch *launch, zt_error *err)
{
    int32_t world = launch->world_size, per_node = launch->local_world_size;
    char command[2048];
    own_command(command, sizeof command);
    zt_error_set(err, ZT_ERR_UNSUPPORTED,
                 "this process is rank %d of %d by torchrun's variables (RANK, WORLD_SIZE) and runs on the CPU, "
                 "where ranks talk through MPI, which connects only the processes its own launcher starts "
                 "(mpirun, srun), never those torchrun starts. ", launch->rank, world);
    /* --nproc starts CPU ranks when the command line says device=cpu (else GPUs, where there are some). */
    const char *cpu = strstr(command, "device=cpu") ? "" : " --set device=cpu";
    if (per_node > 0 && per_node < world && world % per_node == 0)
        zt_error_append(err, "Start these %d ranks on %d machines once, from one of them: mpirun -np %d --hostfile "
                        "HOSTS --map-by ppr:%d:node %s (HOSTS: one line per machine, 'node0 slots=%d'), or srun "
                        "-N %d --ntasks-per-node %d --mpi=pmix %s under Slurm", world, world / per_node, world,
                        per_node, command, per_node, world / per_node, per_node, command);
    else if (per_node == world)
        zt_error_append(err, "On one machine, without torchrun: %s --nproc %d%s", command, world, cpu);
    else
        zt_error_append(err, "On one machine, without torchrun: %s --nproc %d%s; on several: mpirun -np %d "
                        "--hostfile HOSTS %s, or srun -n %d --mpi=pmix %s", command, world, cpu, world, command,
                        world, command);
    zt_error_append(err, " (docs/distributed.md, 'CPU ranks on several machines'). GPU ranks (--set device=cuda) "
                    "run under torchrun as they are");
    return ZT_ERR_UNSUPPORTED;
}

zt_status zt_launch_comm_create(const zt_launch *launch, int device_type, double timeout_s,
                                zt_comm_backend **out, zt_error *err)
{
    *out = NULL;
    if (device_type != ZT_DEVICE_CPU) return nccl_comm_create(launch, timeout_s, out, err);
    if (launch->launcher && strcmp(launch->launcher, ZT_NPROC_LAUNCHER) == 0)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "zt-run --nproc started these %d ranks for GPUs (device auto or cuda on the command "
                            "line, GPUs present), but this run resolved to the CPU (the config file's device, or a "
                            "plugin that runs on the CPU only): pass --set device=cpu on the command line so "
                            "--nproc starts CPU ranks through mpirun, or --set device=cuda", launch->world_size);
    if (launch->launcher && strcmp(launch->launcher, ZT_TORCHRUN_LAUNCHER) == 0)
        return torchrun_cpu_error(launch, err);
    return load_mpi_backend(launch, timeout_s, out, err);
}

zt_status zt_launch_comm_create_mpi_for_gpus(const zt_launch *launch, double timeout_s, zt_comm_backend **out,
                                             zt_error *err)
{
    *out = NULL;
    const char *by = launch->launcher ? launch->launcher : "";
    if (!strcmp(by, ZT_NPROC_LAUNCHER) || !strcmp(by, ZT_TORCHRUN_LAUNCHER)) {
        char command[2048];
        own_command(command, sizeof command);
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "comm.backend = mpi: these %d GPU ranks were started by %s, but MPI connects only the "
                            "processes its own launcher starts: run mpirun -np %d %s (srun --mpi=pmix under "
                            "Slurm), or leave comm.backend at auto (NCCL)", launch->world_size, by,
                            launch->world_size, command);
    }
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
    char why[2048], too_old[4096]; /* an MPI-2 library lacks the calls the backend makes: say so in --env's words */
    const char *load_error = lib ? "" : dlerror(); /* read before the check's own dlopen */
    snprintf(why, sizeof why, "%s", load_error ? load_error : "unknown dlopen error");
    if (!lib && zt_mpi_too_old(too_old, sizeof too_old))
        return zt_error_set(err, ZT_ERR_UNSUPPORTED, "this run has %d ranks (from %s), which talk through MPI: %s",
                            launch->world_size, launch->launcher, too_old);
    if (!lib)
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "this run has %d ranks (from %s) but zt's MPI backend %s%s cannot be loaded: %s\n"
                            "Install the MPI it was built with (Debian/Ubuntu: apt-get install openmpi-bin), "
                            "or rebuild zt against the MPI installed here", launch->world_size,
                            launch->launcher, path, chosen ? " (ZT_COMM_MPI_LIBRARY)" : "", why);
    zt_comm_mpi_create_fn create = (zt_comm_mpi_create_fn)dlsym(lib, ZT_COMM_MPI_ENTRY);
    if (!create) {
        dlclose(lib);
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "%s%s does not export %s: it is not zt's MPI backend, or one from another version "
                            "of zt; rebuild and reinstall zt%s", path, chosen ? " (ZT_COMM_MPI_LIBRARY)" : "",
                            ZT_COMM_MPI_ENTRY, chosen ? ", or unset ZT_COMM_MPI_LIBRARY" : "");
    }
    give_flight_hooks(lib, ZT_COMM_MPI_FLIGHT_ENTRY);
    zt_comm_mpi_options opt = {
        .rank = launch->rank, .world_size = launch->world_size, .launcher = launch->launcher, .timeout_s = timeout_s};
    return create(&opt, out, err);
}
