/* The TCP rendezvous that carries a GPU job's NCCL id from rank 0 to the others (launch.c,
 * zt_rendezvous_exchange), between forked processes on 127.0.0.1 with a fake 128-byte id: every
 * rank gets rank 0's bytes whatever the start order; a missing rank 0, a missing other rank, a
 * job of another size on the same port, a port in use and an unknown host each end within the
 * timeout with a message that says what to do. The expected id is the parent's random bytes,
 * which the children inherit; only rank 0 holds them when the exchange starts. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/launch.h"
#include "ztest.h"

static unsigned char g_id[128];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A port nothing listens on right now. */
static int unused_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || getsockname(fd, (struct sockaddr *)&sa, &len)) {
        perror("test_rendezvous: a free port");
        exit(1);
    }
    close(fd);
    return ntohs(sa.sin_port);
}

/* Child: one rank of the exchange. Exit 0: got rank 0's id; 3: other bytes; 4: an error. */
static void rank_main(int port, int rank, int world, double timeout_s, long delay_ms)
{
    sleep_ms(delay_ms);
    unsigned char id[128];
    if (rank == 0) memcpy(id, g_id, sizeof id);
    else memset(id, 0, sizeof id);
    zt_error err;
    if (zt_rendezvous_exchange("127.0.0.1", port, rank, world, timeout_s, id, sizeof id, &err) != ZT_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        _exit(4);
    }
    _exit(memcmp(id, g_id, sizeof id) == 0 ? 0 : 3);
}

static pid_t start_rank(int port, int rank, int world, double timeout_s, long delay_ms)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) rank_main(port, rank, world, timeout_s, delay_ms);
    return pid;
}

static int exit_code(pid_t pid)
{
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* n ranks; rank 0 starts last (delayed), so the others must retry until it listens. */
static void test_exchange(int n)
{
    int port = unused_port();
    pid_t pids[8];
    for (int r = n - 1; r >= 0; r--) pids[r] = start_rank(port, r, n, 10, r == 0 ? 400 : 0);
    for (int r = 0; r < n; r++) {
        int code = exit_code(pids[r]);
        if (code != 0) fprintf(stderr, "rank %d of %d ended with %d\n", r, n, code);
        ZT_CHECK_INT(code, 0);
    }
}

static void test_no_rank0(void)
{
    int port = unused_port();
    unsigned char id[128] = {0};
    zt_error err = {0};
    double start = now_s();
    ZT_CHECK_INT(zt_rendezvous_exchange("127.0.0.1", port, 1, 2, 1.0, id, sizeof id, &err), ZT_ERR_TIMEOUT);
    double took = now_s() - start;
    ZT_CHECK(took >= 0.9 && took < 5.0);
    char want[160];
    snprintf(want, sizeof want, "rank 1 of 2 could not reach the rendezvous at 127.0.0.1:%d after 1 s", port);
    ZT_CHECK_CONTAINS(err.msg, want);
    ZT_CHECK_CONTAINS(err.msg, "is rank 0 running, with the same ZT_MASTER_ADDR/ZT_MASTER_PORT?");
    ZT_CHECK_CONTAINS(err.msg, "comm.timeout_s");
}

/* Rank 0 of 3 with only rank 1 coming: rank 1 gets the id, rank 0 names rank 2. */
static void test_missing_rank(void)
{
    int port = unused_port();
    pid_t one = start_rank(port, 1, 3, 10, 0);
    unsigned char id[128];
    memcpy(id, g_id, sizeof id);
    zt_error err = {0};
    double start = now_s();
    ZT_CHECK_INT(zt_rendezvous_exchange("127.0.0.1", port, 0, 3, 1.5, id, sizeof id, &err), ZT_ERR_TIMEOUT);
    ZT_CHECK(now_s() - start < 6.0);
    char want[160];
    snprintf(want, sizeof want, "rank 0 of 3: rank 2 did not reach the rendezvous at 127.0.0.1:%d after 1.5 s", port);
    ZT_CHECK_CONTAINS(err.msg, want);
    ZT_CHECK_INT(exit_code(one), 0);

    port = unused_port();
    ZT_CHECK_INT(zt_rendezvous_exchange("127.0.0.1", port, 0, 4, 0.5, id, sizeof id, &err), ZT_ERR_TIMEOUT);
    ZT_CHECK_CONTAINS(err.msg, "rank 0 of 4: ranks 1, 2, 3 did not reach the rendezvous");
}

/* A rank of a 3-rank job reaches a 2-rank job's rank 0: rank 0 refuses, both say so. */
static void test_other_job(void)
{
    int port = unused_port();
    pid_t stranger = start_rank(port, 1, 3, 3, 100);
    unsigned char id[128];
    memcpy(id, g_id, sizeof id);
    zt_error err = {0};
    ZT_CHECK_INT(zt_rendezvous_exchange("127.0.0.1", port, 0, 2, 5, id, sizeof id, &err), ZT_ERR_COMM);
    ZT_CHECK_CONTAINS(err.msg, "was reached by rank 1 of 3: two jobs share this address and port, or the ranks "
                               "were started with different world sizes");
    ZT_CHECK_INT(exit_code(stranger), 4);
}

static void test_port_in_use(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof sa;
    ZT_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 1) == 0 &&
             getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
    int port = ntohs(sa.sin_port);
    unsigned char id[128] = {0};
    zt_error err = {0};
    ZT_CHECK_INT(zt_rendezvous_exchange("127.0.0.1", port, 0, 2, 1, id, sizeof id, &err), ZT_ERR_COMM);
    char want[120];
    snprintf(want, sizeof want, "rank 0 cannot open the rendezvous on port %d", port);
    ZT_CHECK_CONTAINS(err.msg, want);
    ZT_CHECK_CONTAINS(err.msg, "pick a free port (ZT_MASTER_PORT or MASTER_PORT)");
    close(fd);
}

static void test_unknown_host(void)
{
    unsigned char id[128] = {0};
    zt_error err = {0};
    ZT_CHECK_INT(zt_rendezvous_exchange("no-such-host.invalid", 29500, 2, 4, 0.5, id, sizeof id, &err),
                 ZT_ERR_TIMEOUT);
    ZT_CHECK_CONTAINS(err.msg, "rank 2 of 4 could not reach the rendezvous at no-such-host.invalid:29500 after 0.5 s "
                               "(cannot resolve no-such-host.invalid");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    for (int i = 0; i < 128; i++) g_id[i] = (unsigned char)(rand() & 0xff);
    g_id[0] |= 1; /* never all zeros, which is what the other ranks start from */
    test_exchange(2);
    test_exchange(5);
    test_no_rank0();
    test_missing_rank();
    test_other_job();
    test_port_in_use();
    test_unknown_host();
    return zt_test_result();
}
