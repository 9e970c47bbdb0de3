/* The offload thread of the zero plugins (offload.c): with zero_optimization.offload_optimizer.device
 * = cpu, the optimizer's CPU step runs on this thread, one unit at a time, while the training thread
 * goes on (ZeRO-Offload's overlap). docs/zero.md, "Offload", says what lives where.
 *
 * The engine knows nothing of units' buffers: the plugin (offload_step.c) submits job numbers (a
 * unit, and on GPU runs what to do with it) in the order the units become ready and the thread calls
 * `fn(arg, job)` for each, in that order, one at a time. fn runs
 * the optimizer over the unit's ranges on host memory (device_type ZT_DEVICE_CPU, which spreads
 * each range over host->parallel_for's threads; the pool takes calls from any thread). On GPU runs
 * fn first waits for the unit's gradient copy (device -> host, on the comm stream, behind the
 * unit's reduction) and, after the step, starts the copy of the bf16 parameters back (host ->
 * device, on the copy stream), so the copies of one unit overlap the CPU step of the next.
 *
 * Errors: fn reports its own failure through host->error (the optimizer does) and returns the
 * status. The first failure is kept; later jobs are skipped, not run on half-updated state, and
 * zero_offload_wait returns that status once everything queued has drained. Nothing here blocks on
 * the training thread, so a failure can never hang it.
 */
#ifndef ZT_PLUGINS_ZERO_OFFLOAD_H
#define ZT_PLUGINS_ZERO_OFFLOAD_H

#include <stdint.h>

#include "zt/zt_plugin.h"

typedef struct zero_offload zero_offload;

/* One unit's work on the offload thread. */
typedef zt_status (*zero_offload_fn)(void *arg, int32_t unit);

/* Starts the thread. max_queued: how many submitted jobs may wait at once (a step submits each unit
 * at most once, so n_units is enough). `who` names the plugin in messages. */
zt_status zero_offload_create(const zt_host *h, const char *who, zero_offload_fn fn, void *arg, int32_t max_queued,
                              zero_offload **out);
/* Stops the thread after its current job (queued jobs are dropped) and frees the engine. NULL is
 * fine. */
void zero_offload_destroy(zero_offload *o);
/* Queues `unit`; returns at once. ZT_ERR_INTERNAL when the queue is full (a zero plugin bug). */
zt_status zero_offload_submit(zero_offload *o, int32_t unit);
/* Waits until every submitted job has run (or been skipped after a failure); returns the first
 * failure's status since the previous wait, or ZT_OK. */
zt_status zero_offload_wait(zero_offload *o);
/* Waits until the first n jobs ever submitted have finished (run or skipped), so a caller that counts
 * its submissions (the n-th submit is job n) waits for one job without draining the queue. Returns the
 * first failure since the previous zero_offload_wait without clearing it; a destroyed engine returns
 * at once. */
zt_status zero_offload_wait_for(zero_offload *o, int64_t n);
/* Jobs run since creation (tests check that the thread, not the caller, ran them). */
int64_t zero_offload_jobs_run(zero_offload *o);

#endif
