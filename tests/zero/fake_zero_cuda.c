/* A stand-in for plugins/zero/zero_cuda.c without a GPU, for test_zero_fake_gpu.c: "device"
 * memory is host memory and every kernel is a CPU loop, so the zero plugins' GPU paths (bf16 compute
 * copies, comm-stream ordering, offload downloads, uploads and the offload thread) run on any machine.
 *
 * Copies on the comm and copy streams are not done when they are enqueued but when something the
 * real stream order guarantees says they must be (the fake's flush points below), so a plugin that
 * reads a download before waiting for its event, reuses a staging buffer before its upload left it,
 * or gathers a unit before its upload landed sees stale data, as it could on a GPU:
 *   comm stream (downloads, host->device copies): flushed when the comm stream runs its next
 *     collective (zero_cuda_comm_wait_compute precedes every one), when the compute stream or the host
 *     waits for it (compute_wait, wait_download, sync_comm, the norm exchange);
 *   copy stream (uploads): flushed when the comm stream waits for an upload (comm_wait_upload), when
 *     a staging buffer is waited for (wait_staging), or sync_copy.
 * Both queues are guarded by a mutex: the offload thread enqueues uploads and waits on events. */
#include "../../plugins/zero/zero_cuda.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pending_copy {
    void *dst;
    const void *src;
    size_t bytes;
} pending_copy;

typedef struct copy_queue {
    pending_copy *items;
    int n, cap;
} copy_queue;

struct zero_cuda {
    float *unit_norms;
    int32_t n_norms, n_slots, n_units, n_staging, dp;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static copy_queue g_comm, g_copy;
/* How many copies each queue deferred past their enqueue (the test checks deferral happened). */
long fake_zero_cuda_deferred[2];

static zt_status enqueue(copy_queue *q, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return ZT_OK;
    pthread_mutex_lock(&g_lock);
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 64;
        pending_copy *items = realloc(q->items, (size_t)cap * sizeof *items);
        if (!items) {
            pthread_mutex_unlock(&g_lock);
            return ZT_ERR_OUT_OF_MEMORY;
        }
        q->items = items;
        q->cap = cap;
    }
    q->items[q->n++] = (pending_copy){dst, src, bytes};
    pthread_mutex_unlock(&g_lock);
    return ZT_OK;
}

static void flush(copy_queue *q, int which)
{
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < q->n; i++) memcpy(q->items[i].dst, q->items[i].src, q->items[i].bytes);
    fake_zero_cuda_deferred[which] += q->n;
    q->n = 0;
    pthread_mutex_unlock(&g_lock);
}
#define FLUSH_COMM() flush(&g_comm, 0)
#define FLUSH_COPY() flush(&g_copy, 1)

/* Called by the test between runs: nothing may be left queued. */
int fake_zero_cuda_idle(void)
{
    pthread_mutex_lock(&g_lock);
    int idle = g_comm.n == 0 && g_copy.n == 0;
    pthread_mutex_unlock(&g_lock);
    return idle;
}

zt_status zero_cuda_create(const zt_host *h, const char *plugin, int64_t n_tensors, const int64_t *sizes,
                           int32_t n_slots, int32_t n_norms, int32_t dp, zero_cuda **out)
{
    (void)plugin, (void)n_tensors, (void)sizes;
    zero_cuda *g = calloc(1, sizeof *g);
    if (g) g->unit_norms = calloc((size_t)(n_norms > 0 ? n_norms : 1), sizeof(float));
    if (!g || !g->unit_norms) {
        free(g);
        h->error(h->ctx, ZT_ERR_OUT_OF_MEMORY, "fake zero_cuda: out of memory");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    g->n_norms = n_norms;
    g->n_slots = n_slots;
    g->dp = dp;
    *out = g;
    return ZT_OK;
}

void zero_cuda_destroy(const zt_host *h, zero_cuda *g)
{
    (void)h;
    if (!g) return;
    FLUSH_COMM();
    FLUSH_COPY();
    free(g->unit_norms);
    free(g);
}

zt_status zero_cuda_zero(const zt_host *h, void *dst, uint64_t bytes)
{
    (void)h;
    memset(dst, 0, (size_t)bytes);
    return ZT_OK;
}

zt_status zero_cuda_copy(const zt_host *h, void *dst, const void *src, uint64_t bytes)
{
    (void)h;
    memcpy(dst, src, (size_t)bytes);
    return ZT_OK;
}

zt_status zero_cuda_copy_comm(const zt_host *h, void *dst, const void *src, uint64_t bytes)
{
    (void)h;
    FLUSH_COMM(); /* in stream order with the deferred copies before it */
    memcpy(dst, src, (size_t)bytes);
    return ZT_OK;
}

zt_status zero_cuda_add_comm(const zt_host *h, zero_cuda *g, float *y, const float *x, int64_t n)
{
    (void)h, (void)g;
    FLUSH_COMM();
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
    return ZT_OK;
}

zt_status zero_cuda_comm_wait_compute(const zt_host *h, zero_cuda *g)
{
    (void)h, (void)g;
    FLUSH_COMM(); /* a collective follows: it runs after the copies queued before it */
    return ZT_OK;
}

static zt_status check_slot(const zt_host *h, int32_t slot, int32_t n)
{
    if (slot >= 0 && slot < n) return ZT_OK;
    h->error(h->ctx, ZT_ERR_INTERNAL, "fake zero_cuda: slot %d not in [0, %d)", (int)slot, (int)n);
    return ZT_ERR_INTERNAL;
}

zt_status zero_cuda_record_comm(const zt_host *h, zero_cuda *g, int32_t slot)
{
    return check_slot(h, slot, g->n_slots);
}

zt_status zero_cuda_compute_wait(const zt_host *h, zero_cuda *g, int32_t slot)
{
    FLUSH_COMM();
    return check_slot(h, slot, g->n_slots);
}

static double sum_squares(int64_t n, const float *const *tensors, const int64_t *sizes)
{
    double sum = 0;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < sizes[t]; i++) sum += (double)tensors[t][i] * tensors[t][i];
    return sum;
}

zt_status zero_cuda_global_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                                const int64_t *sizes, double *norm)
{
    (void)h, (void)g;
    FLUSH_COMM();
    *norm = (float)sqrt(sum_squares(n, tensors, sizes)); /* the device computes a float */
    return ZT_OK;
}

zt_status zero_cuda_unit_norm(const zt_host *h, zero_cuda *g, int64_t n, const float *const *tensors,
                              const int64_t *sizes, int32_t index)
{
    zt_status st = check_slot(h, index, g->n_norms);
    if (st == ZT_OK) g->unit_norms[index] = (float)sqrt(sum_squares(n, tensors, sizes));
    return st;
}

zt_status zero_cuda_read_norms(const zt_host *h, zero_cuda *g, int32_t n, float *out)
{
    (void)h;
    memcpy(out, g->unit_norms, (size_t)(n < g->n_norms ? n : g->n_norms) * sizeof(float));
    return ZT_OK;
}

zt_status zero_cuda_all_gather_double(const zt_host *h, zero_cuda *g, const zt_group *group, double local,
                                      double *parts)
{
    (void)g;
    FLUSH_COMM();
    return h->all_gather(h->ctx, group, &local, parts, sizeof local, ZT_U8, NULL);
}

static uint16_t bf16_of(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

zt_status zero_cuda_refresh(const zt_host *h, zero_cuda *g, const float *master, uint16_t *copy, int64_t n)
{
    (void)h, (void)g;
    for (int64_t i = 0; i < n; i++) copy[i] = bf16_of(master[i]);
    return ZT_OK;
}

zt_status zero_cuda_refresh_comm(const zt_host *h, zero_cuda *g, const float *master, uint16_t *copy, int64_t n)
{
    FLUSH_COMM(); /* in order after what the comm stream already holds */
    return zero_cuda_refresh(h, g, master, copy, n);
}

/* ---- offload ---------------------------------------------------------------------------------- */

zt_status zero_cuda_offload_init(const zt_host *h, zero_cuda *g, int32_t n_units, int32_t n_staging)
{
    (void)h;
    g->n_units = n_units;
    g->n_staging = n_staging;
    return ZT_OK;
}

zt_status zero_cuda_bind_thread(const zt_host *h, zero_cuda *g)
{
    (void)h, (void)g;
    return ZT_OK;
}

zt_status zero_cuda_download(const zt_host *h, zero_cuda *g, int32_t unit, void *dst, const void *src,
                             uint64_t bytes)
{
    zt_status st = check_slot(h, unit, g->n_units);
    return st == ZT_OK ? enqueue(&g_comm, dst, src, (size_t)bytes) : st;
}

zt_status zero_cuda_wait_download(const zt_host *h, zero_cuda *g, int32_t unit)
{
    FLUSH_COMM();
    return check_slot(h, unit, g->n_units);
}

zt_status zero_cuda_upload(const zt_host *h, zero_cuda *g, void *dst, const void *src, uint64_t bytes)
{
    (void)h, (void)g;
    return enqueue(&g_copy, dst, src, (size_t)bytes);
}

zt_status zero_cuda_upload_done(const zt_host *h, zero_cuda *g, int32_t unit, int32_t buf)
{
    zt_status st = check_slot(h, unit, g->n_units);
    return st == ZT_OK ? check_slot(h, buf, g->n_staging) : st;
}

zt_status zero_cuda_wait_staging(const zt_host *h, zero_cuda *g, int32_t buf)
{
    FLUSH_COPY();
    return check_slot(h, buf, g->n_staging);
}

zt_status zero_cuda_comm_wait_upload(const zt_host *h, zero_cuda *g, int32_t unit)
{
    FLUSH_COPY(); /* conservative: every upload so far (the real wait is for this unit's) */
    return check_slot(h, unit, g->n_units);
}

zt_status zero_cuda_copy_in_comm(const zt_host *h, zero_cuda *g, void *dst, const void *src, uint64_t bytes)
{
    (void)h, (void)g;
    return enqueue(&g_comm, dst, src, (size_t)bytes);
}

zt_status zero_cuda_sync_comm(const zt_host *h, zero_cuda *g)
{
    (void)h, (void)g;
    FLUSH_COMM();
    return ZT_OK;
}

zt_status zero_cuda_sync_copy(const zt_host *h, zero_cuda *g)
{
    (void)h, (void)g;
    FLUSH_COPY();
    return ZT_OK;
}
