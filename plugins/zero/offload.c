/* The offload thread of the zero plugins: offload.h. */
#define _POSIX_C_SOURCE 200809L /* pthread_sigmask, sigfillset */
#include "offload.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

struct zero_offload {
    const zt_host *host;
    const char *who;
    zero_offload_fn fn;
    void *arg;

    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work_cv; /* a job was queued, or stop */
    pthread_cond_t idle_cv; /* the queue drained and the thread is idle */

    /* Guarded by lock. */
    int32_t *queue; /* ring of unit numbers */
    int32_t capacity, head, count;
    int32_t busy;   /* the thread is running a job */
    int32_t stop;
    zt_status error; /* first failure since the last wait */
    int64_t jobs_run;
    int64_t jobs_done; /* run or skipped, since creation */
};

static void *offload_main(void *opaque)
{
    zero_offload *o = opaque;
    pthread_mutex_lock(&o->lock);
    for (;;) {
        while (!o->stop && o->count == 0) pthread_cond_wait(&o->work_cv, &o->lock);
        if (o->stop) break;
        int32_t unit = o->queue[o->head];
        o->head = (o->head + 1) % o->capacity;
        o->count--;
        /* After a failure the remaining jobs drain unrun: the state they would update is suspect,
         * and the caller learns of the failure at its next wait. */
        int run = o->error == ZT_OK;
        o->busy = 1;
        pthread_mutex_unlock(&o->lock);
        zt_status st = run ? o->fn(o->arg, unit) : ZT_OK;
        pthread_mutex_lock(&o->lock);
        o->busy = 0;
        if (run) o->jobs_run++;
        o->jobs_done++;
        if (st != ZT_OK && o->error == ZT_OK) o->error = st;
        pthread_cond_broadcast(&o->idle_cv); /* zero_offload_wait_for waits for single jobs */
    }
    o->busy = 0;
    pthread_cond_broadcast(&o->idle_cv);
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

static zt_status offload_failed(const zt_host *h, const char *who, zt_status st, const char *what, int err)
{
    h->error(h->ctx, st, "%s: cannot start its offload thread: %s failed (%s); lower the thread count or turn "
                         "zero_optimization.offload_optimizer.device to \"none\"",
             who, what, strerror(err));
    return st;
}

zt_status zero_offload_create(const zt_host *h, const char *who, zero_offload_fn fn, void *arg, int32_t max_queued,
                              zero_offload **out)
{
    *out = NULL;
    if (!fn || max_queued < 1) {
        h->error(h->ctx, ZT_ERR_INTERNAL, "%s: offload engine created without a job function or queue (a bug)", who);
        return ZT_ERR_INTERNAL;
    }
    zero_offload *o = calloc(1, sizeof *o);
    int32_t *queue = calloc((size_t)max_queued, sizeof *queue);
    if (!o || !queue) {
        free(o);
        free(queue);
        h->error(h->ctx, ZT_ERR_OUT_OF_MEMORY, "%s: out of host memory for its offload thread's queue", who);
        return ZT_ERR_OUT_OF_MEMORY;
    }
    *o = (zero_offload){.host = h, .who = who, .fn = fn, .arg = arg, .queue = queue, .capacity = max_queued};
    int err = pthread_mutex_init(&o->lock, NULL);
    if (err) {
        free(queue);
        free(o);
        return offload_failed(h, who, ZT_ERR_INTERNAL, "pthread_mutex_init", err);
    }
    pthread_cond_init(&o->work_cv, NULL);
    pthread_cond_init(&o->idle_cv, NULL);
    /* Signals (Ctrl-C: save and exit) belong to the training thread: the new thread starts with all
     * of them blocked, and the caller's mask is restored right after. */
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    err = pthread_create(&o->thread, NULL, offload_main, o);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (err) {
        pthread_cond_destroy(&o->work_cv);
        pthread_cond_destroy(&o->idle_cv);
        pthread_mutex_destroy(&o->lock);
        free(queue);
        free(o);
        return offload_failed(h, who, ZT_ERR_INTERNAL, "pthread_create", err);
    }
    *out = o;
    return ZT_OK;
}

void zero_offload_destroy(zero_offload *o)
{
    if (!o) return;
    pthread_mutex_lock(&o->lock);
    o->stop = 1;
    pthread_cond_broadcast(&o->work_cv);
    pthread_mutex_unlock(&o->lock);
    pthread_join(o->thread, NULL);
    pthread_cond_destroy(&o->work_cv);
    pthread_cond_destroy(&o->idle_cv);
    pthread_mutex_destroy(&o->lock);
    free(o->queue);
    free(o);
}

zt_status zero_offload_submit(zero_offload *o, int32_t unit)
{
    pthread_mutex_lock(&o->lock);
    if (o->count == o->capacity) {
        int32_t capacity = o->capacity;
        pthread_mutex_unlock(&o->lock);
        o->host->error(o->host->ctx, ZT_ERR_INTERNAL,
                       "%s: offload queue full (%d jobs) when unit %d was submitted: a unit was queued twice in "
                       "one step (a bug)",
                       o->who, (int)capacity, (int)unit);
        return ZT_ERR_INTERNAL;
    }
    o->queue[(o->head + o->count) % o->capacity] = unit;
    o->count++;
    pthread_cond_signal(&o->work_cv);
    pthread_mutex_unlock(&o->lock);
    return ZT_OK;
}

zt_status zero_offload_wait(zero_offload *o)
{
    pthread_mutex_lock(&o->lock);
    while ((o->count > 0 || o->busy) && !o->stop) pthread_cond_wait(&o->idle_cv, &o->lock);
    zt_status st = o->error;
    o->error = ZT_OK;
    pthread_mutex_unlock(&o->lock);
    return st;
}

zt_status zero_offload_wait_for(zero_offload *o, int64_t n)
{
    pthread_mutex_lock(&o->lock);
    while (o->jobs_done < n && !o->stop) pthread_cond_wait(&o->idle_cv, &o->lock);
    zt_status st = o->error;
    pthread_mutex_unlock(&o->lock);
    return st;
}

int64_t zero_offload_jobs_run(zero_offload *o)
{
    pthread_mutex_lock(&o->lock);
    int64_t n = o->jobs_run;
    pthread_mutex_unlock(&o->lock);
    return n;
}
