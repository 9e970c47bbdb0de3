/* Training metrics: the per-step log line and OUTPUT_DIR/metrics.jsonl.
 *
 * metrics.jsonl holds one JSON object per line, each written with one write() as it is complete, so
 * `tail -f` and a crashed run both see every finished step; a write that fails part way (a full disk)
 * is cut back off, so the file still ends with the last whole record. Every record starts with
 * "step" and "type":
 *
 *   {"step":12,"type":"train","total_steps":100,"loss":3.21,"lr":0.0003,"grad_norm":1.9,
 *    "skipped":false,"tokens":4096,"loss_tokens":2710,"tokens_per_s":15000.5,"step_s":0.27,
 *    "elapsed_s":3.3,"eta_s":23.7,
 *    "mem_host":{"params":{"current":N,"peak":N},...,"total":{"current":N,"peak":N}},
 *    "comm":{"time_s":0.01,"share":0.037,"ops":[{"op":"all_reduce","group":"dp","ranks":2,"count":3,
 *            "bytes":1200,"time_s":0.01,"algbw_gbps":0.00012,"busbw_gbps":0.00012},...]}}
 *   {"step":12,"type":"eval","eval_loss":3.3,"eval_tokens":8000,"eval_s":0.9}
 *
 * "mem_device" follows "mem_host" on GPU runs. "comm" holds the step's collectives by kind and group
 * (host/comm_monitor.h: nccl-tests' bytes, algbw and busbw in GB/s); share is its time_s / step_s.
 * Rank 0 writes metrics.jsonl; every other rank R writes the same records, with its own memory and
 * communication, to metrics.rank<R>.jsonl. Numbers are written with 17 significant digits, so a
 * loss read back is the exact double the trainer computed (the resume test compares them bit for
 * bit). tokens counts non-padding tokens of the whole global batch, loss_tokens those with a target.
 */
#ifndef ZT_FRAMEWORK_METRICS_H
#define ZT_FRAMEWORK_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include "zt/zt_host.h"
#include "base/error.h"
#include "host/comm_monitor.h"

typedef struct zt_metrics zt_metrics;

/* Open path for appending records. resume_step < 0: start a new file (an old one is replaced).
 * resume_step >= 0 (a resumed run): keep the records of steps <= resume_step and drop later ones
 * (written after the checkpoint by the interrupted run, they are about to be redone). The kept records
 * are the file's first lines, so the file is cut back in place (one ftruncate: no free space needed,
 * no byte before the cut touched); when they are not (an edited file) it is rewritten atomically. A
 * torn last line (no line end, or the start of a record that does not parse: the previous session
 * stopped while writing it) is removed with a warning naming it; any other line that is not a
 * metrics record is an error naming the line, and the file is left as it was. */
zt_status zt_metrics_open(const char *path, int64_t resume_step, zt_metrics **out, zt_error *err);
void zt_metrics_close(zt_metrics *m);

typedef struct zt_train_record {
    int64_t step, total_steps;
    double loss, lr, grad_norm;
    int32_t skipped;              /* the optimizer skipped the update (non-finite gradients) */
    double loss_scale;            /* fp16: the loss scale the step's backward used; 0 otherwise (not written) */
    int32_t has_device;           /* device_mem is meaningful (GPU run) */
    int64_t tokens, loss_tokens;
    double step_s;                /* this step's wall time */
    double elapsed_s;             /* since the start of training, earlier sessions of a resumed run
                                     included */
    double eta_s;                 /* estimated time to finish the remaining steps */
    zt_mem_stats host_mem[ZT_POOL_COUNT];
    zt_mem_stats device_mem[ZT_POOL_COUNT];
    const zt_comm_stats *comm;    /* the step's collectives; NULL: no "comm" object */
} zt_train_record;

/* Non-padding tokens of the global batch per second of the step; 0 for a step that took no time. */
static inline double zt_train_record_tokens_per_s(const zt_train_record *r)
{
    return r->step_s > 0 ? (double)r->tokens / r->step_s : 0.0;
}

zt_status zt_metrics_train(zt_metrics *m, const zt_train_record *r, zt_error *err);
zt_status zt_metrics_eval(zt_metrics *m, int64_t step, double eval_loss, int64_t eval_tokens, double eval_s,
                          zt_error *err);

/* The human log line of a train record:
 *   step 12/100 | loss 3.2145 | lr 3.000e-04 | grad_norm 1.903 | 15.0k tok/s | elapsed 3s | eta 24s |
 *   peak mem 1.21 GiB */
void zt_metrics_format_train(const zt_train_record *r, char *buf, size_t cap);


#endif
