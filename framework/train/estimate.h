/* The memory estimator behind `zt-run --dry-run` (docs/zero.md, "Memory").
 *
 * For the run's plugins and config it gives the memory one data-parallel rank needs, by pool, and
 * the same for every other ZeRO stage and offload choice, so a user sees what fits before
 * launching. The pools a ZeRO plugin owns (parameters, gradients, optimizer state, communication
 * buckets) come from the zero plugins' own estimate(): the chosen plugin as configured, and zt's
 * zero0..zero3 re-initialized with each offload choice for the other rows. Activations come from
 * the model's declared bytes per token and layer plus the trainer's own buffers
 * (zt_estimate_activations). Workspace: on GPU runs the model's scratch, the kernels' context
 * scratch and cuBLASLt's workspace from the model's shapes (zt_estimate_workspace); on the CPU not
 * estimated. Never estimated: small tables (pool other), the CUDA context.
 *
 * Host memory is per machine: the host pools of one rank (on GPU runs the offloaded state, mostly
 * pinned; on CPU runs everything) times the run's ranks on this machine, against what the machine
 * has (zt_machine_memory_read: MemAvailable, a cgroup limit, or ZT_HOST_MEM_AVAILABLE). Page-locked
 * memory cannot be swapped out, so it must fit in RAM; cudaHostAlloc does not count against
 * RLIMIT_MEMLOCK (the NVIDIA driver locks it), so that limit is not compared.
 */
#ifndef ZT_FRAMEWORK_ESTIMATE_H
#define ZT_FRAMEWORK_ESTIMATE_H

#include <stdio.h>

#include "base/error.h"
#include "config/config.h"
#include "config/settings.h"
#include "host/registry.h"
#include "host/runtime.h"

/* Bytes of pool activations one rank holds at its peak for micro-batches of `tokens` tokens
 * (micro_batch x seq_len), elements of `element_bytes` (4 on the CPU, 2 on GPUs):
 *   - without recompute, at the end of a forward: every layer's saved activations
 *     (act_bytes_per_token_layer, which counts the layer's input, a buffer of the trainer's), the LM
 *     head's, and the trainer's buffers the layers do not count: the head's input and the two
 *     hidden-state gradients. The head keeps its normalized input and one rms factor per token, and
 *     on the CPU the logits too; GPU runs compute the loss chunk by chunk and keep no logits
 *     (gpu = 1: the rms factor is fp32);
 *   - with recompute, in the backward: the trainer's buffers (every unit's input and the two
 *     gradients) plus the larger of one layer's and the head's recomputed activations. */
double zt_estimate_activations(const zt_model_info *m, int64_t tokens, int recompute, double element_bytes,
                               int gpu);

/* Bytes of scratch a GPU run's model needs at its peak for micro-batches of `tokens` tokens, from the
 * model's shapes (a LLaMA-style layer, as plugins/llama/layers_cuda.c allocates it): a layer's
 * backward scratch (bf16 gradients of the MLP activation, the norm input, the residual, the attention
 * output, q, k, v and the packed q|k|v, N x (F + 2H + 3Q + 4KV) x 2 bytes) with flash attention's fp32 row sums
 * (N x heads x 4), the kernel context's LM-head logits chunk (fp32 and bf16 copies of up to 512 MiB
 * worth of rows) and cuBLASLt's 32 MiB workspace. 0 on the CPU, whose scratch is not estimated. */
double zt_estimate_workspace(const zt_model_info *m, int64_t tokens, int gpu);

typedef struct zt_dry_run_request {
    zt_config *cfg;               /* validated; its offload keys change while other rows are estimated
                                     and are set back afterwards */
    const zt_host_settings *settings; /* read from cfg */
    const zt_registry *reg;       /* finds zero0..zero3 for the other rows */
    const zt_plugin_set *plugins; /* the run's plugins, initialized (at least model, optimizer, zero) */
    zt_runtime *rt;
    int32_t dp_size;              /* data-parallel ranks to estimate for */
    const char *json_path;        /* NULL, or where to write the estimate as JSON (atomically) */
    int gpu;                      /* 1: estimate a GPU run (bf16 compute). The runtime may be a CPU one
                                     (a dry run where no GPU is present): the model then reported fp32
                                     activation sizes, which the estimator halves */
    int32_t local_ranks;          /* zt_dry_run: the ranks on this machine; 0: all dp_size of them (what
                                     --nproc N starts), or the launcher's local world size (torchrun's
                                     LOCAL_WORLD_SIZE, mpirun's OMPI_COMM_WORLD_LOCAL_SIZE). Ignored by
                                     zt_memory_check, which counts the launched ranks sharing this host */
} zt_dry_run_request;

/* Print the table to `out` (and write json_path). Errors: a plugin's estimate failing for the chosen
 * configuration, or the JSON file not written; ZT_ERR_OUT_OF_MEMORY (after the table) when a GPU
 * run's configuration does not fit under gpu_mem_limit or the GPU's memory, or when the host memory
 * of the ranks on this machine does not fit in what it has, with the message of zt_memory_check. The
 * host side of a GPU run that cannot start here (no GPU) is shown but not enforced unless
 * ZT_HOST_MEM_AVAILABLE says what the machine it is for has. A bad ZT_HOST_MEM_AVAILABLE is an
 * error. A row of another stage whose plugin cannot be loaded or initialized is printed with the
 * reason instead of numbers. */
/* "0", "512 B", "1.50 KiB", "24.0 GiB", "512 GiB": the dry run's sizes (also --compare's tables). */
const char *zt_estimate_format_bytes(double bytes, char buf[32]);

zt_status zt_dry_run(const zt_dry_run_request *req, FILE *out, zt_error *err);

/* Before a run allocates anything, on every rank: estimate the chosen configuration (and the
 * others, for a suggestion) and refuse the run with ZT_ERR_OUT_OF_MEMORY when it does not fit: a GPU
 * run under gpu_mem_limit (or the GPU's memory), with the pool that overflows; any run when its ranks
 * on this machine (counted over the "world" group: a collective) need more host memory than the
 * machine has, with the estimate and the fix (fewer ranks per machine, less offload, more RAM). The
 * machine's memory is read before the collective, so no rank has allocated its model yet. A GPU run
 * also hands the estimate to the runtime for its out-of-memory message. */
zt_status zt_memory_check(const zt_dry_run_request *req, zt_error *err);

/* ---- estimate_parallel.c: a tensor x pipeline layout, per pipeline stage ------------------------ */

typedef struct zt_parallel_stage_estimate {
    int32_t stage, first_unit, last_unit, layers;
    int32_t in_flight;            /* micro-batches whose activations 1F1B holds: min(p - stage, m) */
    int64_t n_parameters;         /* one rank's, after the tensor split */
    double activations;           /* bytes, included in mem */
    zt_mem_estimate mem;          /* the run's zero plugin over the data-parallel ranks, plus activations */
} zt_parallel_stage_estimate;

typedef struct zt_parallel_estimate {
    int32_t dp, tp, pp, world, n_micro;
    double bubble;                /* (p-1) / (m+p-1) */
    int32_t problem;              /* 1: no per-stage figures; why says why */
    char why[256];
    int32_t n_stages;
    zt_parallel_stage_estimate *stages; /* [pp] */
} zt_parallel_estimate;

/* Per pipeline stage, one rank's memory under the run's parallel plugin (none loaded: nothing, n_stages
 * 0). base: the whole model's estimate input; m: the model info as the estimate counts activations
 * (halved for a GPU run estimated on a CPU runtime). A layout the plugin refuses is its error. */
zt_status zt_estimate_parallel(const zt_dry_run_request *req, const zt_estimate_in *base, const zt_model_info *m,
                               int gpu, zt_parallel_estimate *out, zt_error *err);
void zt_parallel_estimate_free(zt_parallel_estimate *e);

#endif
