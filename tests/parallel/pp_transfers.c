/* The pipeline schedule's instruction lists run over real point-to-point transfers: one rank per
 * stage, under Open MPI's mpirun, through the host's send and recv (watched by the collective
 * watchdog) with messages large enough for MPI's rendezvous protocol.
 *   pp_transfers run V M    every rank runs its list for M micro-batches (V virtual stages); each
 *                           forward checks that its input is the output of the previous model stage
 *                           for the same micro-batch, each backward that its gradient came from the
 *                           next, so a list that sends or receives out of order fails, and one that
 *                           deadlocks never ends (ctest's timeout)
 *   pp_transfers kill M     rank 1 dies by SIGKILL in the middle of its list: every rank must end
 *                           (kill.sh checks the messages and the time) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "host/runtime.h"
#include "layout.h"
#include "ztest.h"

#define N 16384 /* floats per message: 64 KiB, past the eager limit of Open MPI's transports */

static int g_rank;

static void expect_ok(const zt_host *h, zt_status st, const char *what, int32_t micro)
{
    if (st == ZT_OK) return;
    zt_status recorded;
    fprintf(stderr, "rank %d: %s (micro-batch %d) failed: %s\n", g_rank, what, (int)micro,
            zt_runtime_take_error(h, &recorded));
    zt_test_failures++;
}

/* What model stage k's forward output (or backward input gradient, negated) holds for micro-batch m. */
static float value(int32_t micro, int32_t k) { return (float)(micro * 1000 + k); }

static int check_buffer(const float *b, float want, const char *what, int32_t micro, int32_t k)
{
    for (int i = 0; i < N; i++)
        if (b[i] != want + (float)(i % 7)) {
            fprintf(stderr, "rank %d: %s of micro-batch %d at model stage %d holds %g at %d, expected %g\n", g_rank,
                    what, (int)micro, (int)k, (double)b[i], i, (double)(want + (float)(i % 7)));
            zt_test_failures++;
            return 0;
        }
    return 1;
}

static void fill(float *b, float v)
{
    for (int i = 0; i < N; i++) b[i] = v + (float)(i % 7);
}

int main(int argc, char **argv)
{
    int kill_mode = argc == 3 && !strcmp(argv[1], "kill");
    if (!(argc == 4 && !strcmp(argv[1], "run")) && !kill_mode) {
        fprintf(stderr, "usage: pp_transfers run V M | kill M\n");
        return 2;
    }
    int32_t v = kill_mode ? 1 : atoi(argv[2]), m = atoi(argv[kill_mode ? 2 : 3]);
    zt_error err;
    zt_config *cfg = zt_config_new();
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    double timeout = kill_mode ? 10 : 30;
    zt_runtime_options opt = {.n_threads = 1, .device_type = ZT_DEVICE_CPU, .comm_timeout_s = timeout};
    zt_runtime *rt = NULL;
    char assignment[64];
    snprintf(assignment, sizeof assignment, "comm.timeout_s=%g", timeout);
    if (zt_config_add_schema(cfg, "host", host_opts, n_host, &err) != ZT_OK || zt_config_set(cfg, assignment, &err) != ZT_OK ||
        zt_runtime_create(&opt, cfg, &rt, &err) != ZT_OK) {
        fprintf(stderr, "pp_transfers: cannot start: %s\n", err.msg);
        return 1;
    }
    const zt_host *h = zt_runtime_host(rt, "pp_transfers", NULL, 0);
    g_rank = h->world_rank;
    int32_t p = h->world_size, K = p * v;
    int32_t *ranks = malloc((size_t)p * sizeof *ranks);
    for (int32_t r = 0; r < p; r++) ranks[r] = r;
    zt_group pp;
    expect_ok(h, h->group_create(h->ctx, "pp", ranks, p, &pp), "group_create pp", -1);
    free(ranks);
    char why[512];
    if (pp_schedule_check(p, v, m, why, sizeof why) != 0) {
        fprintf(stderr, "pp_transfers: %s\n", why);
        return 2;
    }
    int32_t n = pp_schedule_build(p, v, g_rank, m, NULL, 0);
    zt_pp_action *a = calloc((size_t)n, sizeof *a);
    pp_schedule_build(p, v, g_rank, m, a, n);
    /* per (micro, chunk): the received activation, this stage's output, the received gradient, its own */
    size_t slots = (size_t)m * (size_t)v;
    float *act_in = calloc(slots * N, sizeof(float)), *act_out = calloc(slots * N, sizeof(float));
    float *grad_in = calloc(slots * N, sizeof(float)), *grad_out = calloc(slots * N, sizeof(float));
    int32_t forwards = 0, backwards = 0;
    for (int32_t i = 0; i < n && !zt_test_failures; i++) {
        if (kill_mode && g_rank == 1 && i == n / 2) {
            struct timespec half = {0, 300 * 1000 * 1000}; /* so its peers surely wait on it */
            nanosleep(&half, NULL);
            raise(SIGKILL);
        }
        const zt_pp_action *x = &a[i];
        int32_t k = x->chunk * p + g_rank;
        size_t slot = ((size_t)x->micro * (size_t)v + (size_t)x->chunk) * N;
        switch (x->op) {
        case ZT_PP_FORWARD:
            if (k > 0) check_buffer(act_in + slot, value(x->micro, k - 1), "the forward's input", x->micro, k);
            fill(act_out + slot, value(x->micro, k));
            forwards++;
            break;
        case ZT_PP_BACKWARD:
            if (k < K - 1) check_buffer(grad_in + slot, -value(x->micro, k + 1), "the backward's gradient", x->micro, k);
            fill(grad_out + slot, -value(x->micro, k));
            backwards++;
            break;
        case ZT_PP_SEND_ACTIVATION:
            expect_ok(h, h->send(h->ctx, &pp, act_out + slot, N, ZT_F32, x->peer, NULL), "send activation", x->micro);
            break;
        case ZT_PP_SEND_GRADIENT:
            expect_ok(h, h->send(h->ctx, &pp, grad_out + slot, N, ZT_F32, x->peer, NULL), "send gradient", x->micro);
            break;
        case ZT_PP_RECV_ACTIVATION:
            expect_ok(h, h->recv(h->ctx, &pp, act_in + slot, N, ZT_F32, x->peer, NULL), "recv activation", x->micro);
            break;
        case ZT_PP_RECV_GRADIENT:
            expect_ok(h, h->recv(h->ctx, &pp, grad_in + slot, N, ZT_F32, x->peer, NULL), "recv gradient", x->micro);
            break;
        }
    }
    ZT_CHECK_INT(forwards, m * v);
    ZT_CHECK_INT(backwards, m * v);
    if (kill_mode) fprintf(stderr, "rank %d: the job was not ended\n", g_rank);
    free(a), free(act_in), free(act_out), free(grad_in), free(grad_out);
    zt_runtime_destroy(rt);
    zt_config_free(cfg);
    return kill_mode ? 1 : zt_test_result();
}
