/* The communication monitor: every collective a plugin or the host issues through the runtime
 * (host->all_reduce, ...) is counted, sized and timed, per kind and process group, per training step
 * and over the run (docs/distributed.md, "Watching the collectives").
 *
 * Bytes and bandwidths follow nccl-tests (its PERFORMANCE.md): the bytes of a call are
 *   all_reduce, broadcast, send, recv   count x element size (the buffer)
 *   reduce_scatter                      count x element size x ranks (the whole input; count is per rank)
 *   all_gather                          count x element size x ranks (the whole output; count is per rank)
 * in the call's own dtype, padding included (what the caller passed is what moves). algbw is
 * bytes / time, busbw is algbw x factor: all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n,
 * broadcast, send and recv 1 (n: the group's ranks). Barriers move nothing and are not counted.
 *
 * Timing: where the device runs work asynchronously (CUDA), two events are recorded on the stream the
 * collective is given, before and after it, and read without waiting when the step ends
 * (zt_runtime_comm_step_end): no host synchronization is added. An operation whose end event has not
 * completed then (a gather queued behind the optimizer step) is timed in the step that reads it.
 * On the CPU (MPI, or a single process) the clock is read around the call, which returns when the
 * data has moved.
 */
#ifndef ZT_FRAMEWORK_COMM_MONITOR_H
#define ZT_FRAMEWORK_COMM_MONITOR_H

#include <stdint.h>

#include "base/error.h"
#include "host/runtime.h"

enum {
    ZT_COMM_ALL_REDUCE = 0,
    ZT_COMM_REDUCE_SCATTER = 1,
    ZT_COMM_ALL_GATHER = 2,
    ZT_COMM_BROADCAST = 3,
    ZT_COMM_SEND = 4,
    ZT_COMM_RECV = 5,
    ZT_COMM_OP_COUNT = 6
};

/* "all_reduce", ... (DeepSpeed's and nccl-tests' names). */
const char *zt_comm_op_name(int op);
/* nccl-tests' bytes of one call: `count` elements of `elem_size` bytes as the collective takes them
 * (per rank for reduce_scatter and all_gather) in a group of `ranks`. */
uint64_t zt_comm_op_bytes(int op, uint64_t count, uint64_t elem_size, int32_t ranks);
/* busbw / algbw for `op` in a group of `ranks` (0 for an all_reduce of one rank: nothing crosses a bus). */
double zt_comm_busbw_factor(int op, int32_t ranks);

/* One kind of collective on one group, summed over calls. */
typedef struct zt_comm_op_stats {
    int32_t op;
    int32_t ranks;   /* the group's size */
    char group[64];
    uint64_t count;  /* calls */
    uint64_t bytes;
    double time_s;
} zt_comm_op_stats;

/* algbw and busbw in GB/s (10^9 bytes per second, as nccl-tests); 0 when no time was measured. */
double zt_comm_algbw_gbps(const zt_comm_op_stats *s);
double zt_comm_busbw_gbps(const zt_comm_op_stats *s);

/* What one step moved: n_ops entries, by first use; ops belong to the runtime and stay valid until
 * the next zt_runtime_comm_step_end. time_s sums them. */
typedef struct zt_comm_stats {
    int32_t n_ops;
    const zt_comm_op_stats *ops;
    double time_s;
} zt_comm_stats;

/* The step loop brackets each step: collectives between begin and end are that step's, the others
 * (setup, evaluation, checkpoints) count as outside steps in the end-of-run table. step_end reads the
 * device's timing events that have completed (never waiting) and returns the step's figures. */
void zt_runtime_comm_step_begin(zt_runtime *rt);
void zt_runtime_comm_step_end(zt_runtime *rt, zt_comm_stats *out);

/* The end-of-run table. A collective over "world": every rank calls it at the same point (the end of
 * a training run that every rank finished). Waits for the device, reads the remaining events, gathers
 * every rank's totals and rank 0 logs them: its own by kind and group (the profiled kinds only when
 * comms_logger.enabled restricts them, per caller with comms_logger.debug), then one line per rank
 * (time, bytes, calls, and the share of `steps_s`, that rank's time in steps), so an imbalance shows. */
zt_status zt_runtime_comm_report(zt_runtime *rt, double steps_s, zt_error *err);

#endif
