/* zt-run --dry-run (estimate.h). */
#define _GNU_SOURCE
#include "train/estimate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/json.h"
#include "base/log.h"
#include "host/select.h"
#include "train/layout.h"

#define OFFLOAD_OPTIMIZER_KEY "zero_optimization.offload_optimizer.device"
#define OFFLOAD_PARAM_KEY "zero_optimization.offload_param.device"
/* The card a GPU dry run assumes when there is neither a GPU nor gpu_mem_limit (an 80 GB A100/H100). */
#define ASSUMED_CARD_BYTES (80.0 * 1073741824.0)
#define LM_HEAD_SCRATCH_BYTES (512.0 * 1048576.0) /* plugins/llama/layers_cuda.c, LM_HEAD_SCRATCH */
#define CUBLASLT_WORKSPACE_BYTES (32.0 * 1048576.0) /* the host's one: framework/device/device_cuda.c */

/* The pools a row shows, in order; "total" is their sum. */
static const int k_pools[] = {ZT_POOL_PARAMS,      ZT_POOL_GRADS,     ZT_POOL_OPTIMIZER,
                             ZT_POOL_ACTIVATIONS, ZT_POOL_WORKSPACE, ZT_POOL_COMM};
static const char *const k_pool_keys[] = {"params", "grads", "optimizer", "activations", "workspace", "comm"};
#define N_POOLS ((int)(sizeof k_pools / sizeof k_pools[0]))

/* One configuration: a ZeRO stage and where its state lives. */
typedef struct estimate_row {
    char plugin[64];
    int32_t stage;
    int offload_optimizer, offload_param;
    int chosen;
    zt_mem_estimate mem;
    char problem[ZT_ERROR_MSG_MAX]; /* non-empty: no numbers, this is why */
} estimate_row;

/* Every stage with every offload choice DeepSpeed allows for it. */
static const struct {
    int32_t stage;
    int offload_optimizer, offload_param;
} k_alternatives[] = {{0, 0, 0}, {1, 0, 0}, {1, 1, 0}, {2, 0, 0}, {2, 1, 0},
                      {3, 0, 0}, {3, 1, 0}, {3, 0, 1}, {3, 1, 1}};
#define N_ALTERNATIVES ((int)(sizeof k_alternatives / sizeof k_alternatives[0]))

double zt_estimate_activations(const zt_model_info *m, int64_t tokens, int recompute, double element_bytes,
                               int gpu)
{
    double n = (double)tokens, hidden = element_bytes * m->hidden_size;
    double head = gpu ? hidden + 4.0 : element_bytes * ((double)m->vocab_size + m->hidden_size + 1);
    if (!recompute) return n * ((double)m->n_layers * m->act_bytes_per_token_layer + head + 3.0 * hidden);
    double layer = m->act_bytes_per_token_layer - hidden; /* recomputed; its input is the trainer's */
    return n * ((double)(m->n_layers + 3) * hidden + (layer > head ? layer : head));
}

static double round256(double bytes) { return ceil(bytes / 256.0) * 256.0; }

double zt_estimate_workspace(const zt_model_info *m, int64_t tokens, int gpu)
{
    if (!gpu) return 0;
    double n = (double)tokens, h = m->hidden_size, f = m->intermediate_size;
    double v = ceil(m->vocab_size / 8.0) * 8.0; /* the logits chunk's rows: the vocabulary padded to 8 */
    double q = (double)m->n_heads * m->head_dim, kv = (double)m->n_kv_heads * m->head_dim;
    double backward = n * 2.0 * (f + 2.0 * h + 3.0 * q + 4.0 * kv) + n * m->n_heads * 4.0;
    /* the LM-head chunk is halved until its fp32 and bf16 logits fit LM_HEAD_SCRATCH_BYTES */
    int64_t chunk = tokens;
    while (chunk > 1 && round256((double)chunk * v * 4) + round256((double)chunk * v * 2) > LM_HEAD_SCRATCH_BYTES)
        chunk = (chunk + 1) / 2;
    double lm_head = round256((double)chunk * v * 4) + round256((double)chunk * v * 2);
    return backward + lm_head + CUBLASLT_WORKSPACE_BYTES;
}

static double side_total(const double *pools)
{
    double total = 0;
    for (int p = 0; p < N_POOLS; p++) total += pools[k_pools[p]];
    return total;
}

/* "0", "512 B", "1.50 KiB", "3.25 GiB" */
const char *zt_estimate_format_bytes(double bytes, char buf[32])
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int unit = 0;
    while (bytes >= 1024.0 && unit < 5) {
        bytes /= 1024.0;
        unit++;
    }
    if (bytes == 0) snprintf(buf, 32, "0");
    else if (unit == 0) snprintf(buf, 32, "%.0f B", bytes);
    else snprintf(buf, 32, bytes < 10 ? "%.2f %s" : bytes < 100 ? "%.1f %s" : "%.0f %s", bytes, units[unit]);
    return buf;
}

static const char *device_name(int offload) { return offload ? "cpu" : "none"; }

/* The offload device a key names, "none" when the key is not declared (a plugin without offload). */
static int offload_of(const zt_config *cfg, const char *key)
{
    const char *v = NULL;
    return zt_config_get_string(cfg, key, &v) == ZT_OK && v && !strcmp(v, "cpu");
}

/* The origin of the offload keys the other rows are estimated with; taken back afterwards. */
#define ALTERNATIVE_ORIGIN "--dry-run (another ZeRO configuration)"

static zt_status set_offload(zt_config *cfg, const char *key, int offload, zt_error *err)
{
    return zt_config_put_string(cfg, key, device_name(offload), ALTERNATIVE_ORIGIN, ZT_CONFIG_RANK_SET, err);
}

/* The ZeRO pools of one configuration through its plugin's estimate(), plus activations. */
static zt_status plugin_estimate(const zt_loaded_plugin *lp, const zt_estimate_in *in, double activations,
                                 int on_gpu, zt_mem_estimate *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    const zt_zero_ops *ops = lp->plugin->ops;
    zt_status st = ops->estimate ? ops->estimate(lp->state, in, out) : ZT_ERR_UNSUPPORTED;
    if (st != ZT_OK) {
        zt_status reported;
        const char *msg = zt_runtime_take_error(lp->host, &reported);
        return zt_error_set(err, st, "zero plugin '%s' cannot estimate its memory: %s", lp->desc.name,
                            msg[0] ? msg : ops->estimate ? zt_status_name(st) : "it has no estimate()");
    }
    (on_gpu ? out->device : out->host)[ZT_POOL_ACTIVATIONS] += activations;
    return ZT_OK;
}

/* Another stage or offload choice: zt's plugin for the stage, initialized under the config with the
 * offload keys set for this row. */
static void estimate_alternative(const zt_dry_run_request *req, estimate_row *row, const zt_estimate_in *in,
                                 double activations, int on_gpu)
{
    zt_error err;
    zt_loaded_plugin lp;
    memset(&lp, 0, sizeof lp);
    zt_status st = set_offload(req->cfg, OFFLOAD_OPTIMIZER_KEY, row->offload_optimizer, &err);
    if (st == ZT_OK) st = set_offload(req->cfg, OFFLOAD_PARAM_KEY, row->offload_param, &err);
    if (st == ZT_OK) st = zt_plugin_load(req->reg, row->plugin, &lp, &err);
    if (st == ZT_OK && (lp.plugin->kind != ZT_KIND_ZERO || ((const zt_zero_ops *)lp.plugin->ops)->stage != row->stage))
        st = zt_error_set(&err, ZT_ERR_INVALID_ARG, "plugin '%s' is not the ZeRO stage-%d plugin", row->plugin,
                          (int)row->stage);
    if (st == ZT_OK) st = zt_plugin_init(&lp, req->rt, &err);
    if (st == ZT_OK) st = plugin_estimate(&lp, in, activations, on_gpu, &row->mem, &err);
    if (st != ZT_OK) snprintf(row->problem, sizeof row->problem, "%s", err.msg);
    zt_plugin_unload(&lp);
}

/* What the GPU side is compared with: gpu_mem_limit, else the GPU's memory, else (a dry run without a
 * GPU) an assumed card. `enforced` is 0 only for the assumed card. */
typedef struct gpu_limit {
    double bytes;
    int enforced;
    char label[224];
} gpu_limit;

static void find_gpu_limit(const zt_dry_run_request *req, gpu_limit *out)
{
    const zt_host *host = req->plugins->by_kind[ZT_KIND_ZERO].host;
    int64_t cap = (int64_t)req->settings->gpu_mem_limit;
    char b[32];
    out->enforced = 1;
    if (cap > 0) {
        out->bytes = (double)cap;
        snprintf(out->label, sizeof out->label, "the gpu_mem_limit of %s", zt_estimate_format_bytes(out->bytes, b));
    } else if (host->device->device_type != ZT_DEVICE_CPU && host->device->total_memory > 0) {
        out->bytes = (double)host->device->total_memory;
        snprintf(out->label, sizeof out->label, "the GPU's %s", zt_estimate_format_bytes(out->bytes, b));
    } else {
        out->bytes = ASSUMED_CARD_BYTES;
        out->enforced = 0;
        snprintf(out->label, sizeof out->label,
                 "an assumed %s card (no GPU here and no gpu_mem_limit: set --gpu-mem-limit for yours)",
                 zt_estimate_format_bytes(out->bytes, b));
    }
    /* The card also holds what the process keeps outside the pools (the CUDA context, kernels): the
     * pools, which the rows add up, get the rest. */
    double reserve = (double)req->settings->gpu_context_reserve;
    if (reserve > 0) {
        out->bytes = out->bytes > reserve ? out->bytes - reserve : 0;
        size_t n = strlen(out->label);
        snprintf(out->label + n, sizeof out->label - n, " less the %s gpu_context_reserve",
                 zt_estimate_format_bytes(reserve, b));
    }
}

/* What the host side is compared with: the machine's memory, for all of the run's ranks on it. */
typedef struct host_limit {
    double bytes;        /* available; 0: not known (nothing is compared) */
    int32_t local_ranks; /* the run's ranks on this machine */
    int enforced;        /* 0: a GPU run that cannot start here, and no ZT_HOST_MEM_AVAILABLE */
    char label[224];     /* "the 22.7 GiB available (MemAvailable in /proc/meminfo)" */
} host_limit;

/* Everything one estimate needs: the rows and the inputs they were computed from. */
typedef struct estimate_set {
    estimate_row rows[N_ALTERNATIVES + 1];
    int n_rows;
    zt_estimate_in in;
    int64_t micro, seq_len;
    int32_t recompute;
    int gpu;
    gpu_limit limit;
    host_limit host;
    zt_host_layout *layout;  /* which parameters train (trainable_params, pet_config.freeze_*) */
    int32_t frozen_layers;   /* layers below the lowest trainable unit: no backward, nothing kept */
    zt_model_info model;     /* the model's info as activations are counted (halved: a GPU run on a CPU runtime) */
    zt_parallel_estimate parallel; /* per pipeline stage, with a parallel plugin */
} estimate_set;

static void free_set(estimate_set *e)
{
    if (e) zt_layout_free(e->layout);
    if (e) zt_parallel_estimate_free(&e->parallel);
    free(e);
}

/* The machine's memory. A GPU run estimated where it cannot start (a CPU runtime) is not for this
 * machine, so its host side is compared but not enforced, unless ZT_HOST_MEM_AVAILABLE says what the
 * machine it is for has. Only a bad ZT_HOST_MEM_AVAILABLE is an error; memory that cannot be read is
 * not compared. */
static zt_status find_host_limit(const zt_dry_run_request *req, estimate_set *e, zt_error *err)
{
    zt_machine_memory mm;
    zt_error why;
    zt_status st = zt_machine_memory_read(&mm, &why);
    if (st == ZT_ERR_INVALID_ARG) return zt_error_set(err, st, "%s", why.msg);
    int elsewhere = e->gpu && req->plugins->by_kind[ZT_KIND_ZERO].host->device->device_type == ZT_DEVICE_CPU;
    char b[32];
    if (st != ZT_OK) {
        e->host.bytes = 0;
        snprintf(e->host.label, sizeof e->host.label, "unknown: %.180s", why.msg);
        return ZT_OK;
    }
    e->host.bytes = (double)mm.available;
    e->host.enforced = mm.overridden || !elsewhere;
    if (mm.overridden)
        snprintf(e->host.label, sizeof e->host.label, "the %s of ZT_HOST_MEM_AVAILABLE", zt_estimate_format_bytes(e->host.bytes, b));
    else
        snprintf(e->host.label, sizeof e->host.label, "the %s available (%s)", zt_estimate_format_bytes(e->host.bytes, b),
                 mm.source);
    return ZT_OK;
}

static double row_total(const estimate_row *row, int device)
{
    return side_total(device ? row->mem.device : row->mem.host);
}

static int row_fits(const estimate_set *e, const estimate_row *row)
{
    return !row->problem[0] && row_total(row, 1) <= e->limit.bytes;
}

/* The host memory of the run's ranks on this machine. */
static double machine_total(const estimate_set *e, const estimate_row *row)
{
    return (double)e->host.local_ranks * row_total(row, 0);
}

static int row_fits_host(const estimate_set *e, const estimate_row *row)
{
    return !row->problem[0] && (!e->host.bytes || machine_total(e, row) <= e->host.bytes);
}

/* What the chosen configuration must fit: the GPU on GPU runs, and the machine's memory. */
static int row_fits_all(const estimate_set *e, const estimate_row *row)
{
    return (!e->gpu || row_fits(e, row)) && row_fits_host(e, row);
}

/* "zero2", "zero3 with offload_param.device=cpu and offload_optimizer.device=cpu" */
static const char *row_name(const estimate_row *row, char buf[160])
{
    snprintf(buf, 160, "%s%s%s%s%s", row->plugin, row->offload_param || row->offload_optimizer ? " with " : "",
             row->offload_param ? "offload_param.device=cpu" : "",
             row->offload_param && row->offload_optimizer ? " and " : "",
             row->offload_optimizer ? "offload_optimizer.device=cpu" : "");
    return buf;
}

static zt_status compute_rows(const zt_dry_run_request *req, estimate_set *e, zt_error *err)
{
    const zt_config *cfg = req->cfg;
    const zt_loaded_plugin *model = &req->plugins->by_kind[ZT_KIND_MODEL];
    const zt_loaded_plugin *opt = &req->plugins->by_kind[ZT_KIND_OPTIMIZER];
    const zt_loaded_plugin *zero = &req->plugins->by_kind[ZT_KIND_ZERO];
    if (!model->initialized || !opt->initialized || !zero->initialized)
        return zt_error_set(err, ZT_ERR_INTERNAL, "the memory estimate needs the model, optimizer and zero plugins "
                                                  "initialized");
    const zt_model_info *reported = ((const zt_model_ops *)model->plugin->ops)->info(model->state);
    const zt_optimizer_ops *oo = opt->plugin->ops;
    const zt_zero_ops *zo = zero->plugin->ops;
    if (!reported)
        return zt_error_set(err, ZT_ERR_INTERNAL, "model plugin '%s' reports no model info", model->desc.name);
    memset(e, 0, sizeof *e);
    e->gpu = req->gpu;
    /* A model initialized on a CPU runtime reports fp32 activation sizes; its GPU path keeps bf16. */
    zt_model_info m = *reported;
    if (e->gpu && zero->host->device->device_type == ZT_DEVICE_CPU) {
        m.act_bytes_per_token_layer /= 2;
        m.act_bytes_per_token_layer_recompute /= 2;
    }
    e->model = m;
    e->micro = req->settings->micro_batch;
    e->seq_len = req->settings->seq_len;
    e->recompute = req->settings->recompute;
    int32_t fp16 = req->settings->fp16;
    /* The frozen parameters cost only their compute copy (zero plugins of ABI 1.3 count that) */
    zt_layout_options lo = {req->dp_size, req->settings->trainable_params, req->settings->no_decay_flags,
                            req->settings->freeze_include, req->settings->freeze_exclude, NULL, 0, 0, 0};
    zt_status lst = zt_layout_build(reported, &lo, &e->layout, err);
    if (lst != ZT_OK) return lst;
    int32_t lowest = e->layout->lowest_trainable_unit;
    e->frozen_layers = lowest > 1 ? lowest - 1 : 0; /* unit u >= 1 is layer u - 1 */
    zt_estimate_in *in = &e->in;
    *in = (zt_estimate_in){.struct_size = sizeof *in,
                           .dp_size = req->dp_size,
                           .micro_batch = (int32_t)e->micro,
                           .seq_len = (int32_t)e->seq_len,
                           .recompute = e->recompute,
                           .compute_dtype = !e->gpu ? ZT_F32 : fp16 ? ZT_F16 : ZT_BF16,
                           .n_optimizer_states = oo->n_state ? oo->n_state(opt->state) : 0,
                           .n_parameters = m.n_parameters,
                           .model = reported,
                           .trainable = e->layout->trainable};
    for (int32_t u = 0; u < m.n_units; u++) {
        int64_t unit_numel = 0;
        for (int32_t i = 0; i < m.n_params_decl; i++) {
            if (m.params[i].unit != u || (m.params[i].flags & ZT_PARAM_TIED)) continue;
            int64_t n = 1;
            for (int32_t d = 0; d < m.params[i].ndim; d++) n *= m.params[i].shape[d];
            unit_numel += n;
        }
        if (unit_numel > in->largest_unit_numel) in->largest_unit_numel = unit_numel;
    }
    int64_t tokens = e->micro * e->seq_len;
    double activations = zt_estimate_activations(&m, tokens, e->recompute, e->gpu ? 2.0 : 4.0, e->gpu);
    /* a frozen bottom keeps only each layer's output (the trainer's), not what a backward would read */
    if (!e->recompute)
        activations -= (double)tokens * e->frozen_layers *
                       (m.act_bytes_per_token_layer - (e->gpu ? 2.0 : 4.0) * m.hidden_size);
    double workspace = zt_estimate_workspace(&m, tokens, e->gpu);

    /* The chosen configuration, from the loaded plugin as configured. */
    int chosen_offload_optimizer = offload_of(cfg, OFFLOAD_OPTIMIZER_KEY),
        chosen_offload_param = offload_of(cfg, OFFLOAD_PARAM_KEY);
    estimate_row *chosen = &e->rows[e->n_rows++];
    snprintf(chosen->plugin, sizeof chosen->plugin, "%.63s", zero->desc.name);
    chosen->stage = zo->stage;
    chosen->offload_optimizer = chosen_offload_optimizer;
    chosen->offload_param = chosen_offload_param;
    chosen->chosen = 1;
    zt_status st = plugin_estimate(zero, in, activations, e->gpu, &chosen->mem, err);
    if (st != ZT_OK) return st;
    (e->gpu ? chosen->mem.device : chosen->mem.host)[ZT_POOL_WORKSPACE] += workspace;

    /* Every other stage and offload choice, through zt's own plugins. */
    for (int a = 0; a < N_ALTERNATIVES; a++) {
        estimate_row *row = &e->rows[e->n_rows];
        row->stage = k_alternatives[a].stage;
        row->offload_optimizer = k_alternatives[a].offload_optimizer;
        row->offload_param = k_alternatives[a].offload_param;
        zt_select_zero_plugin(row->stage, row->plugin, sizeof row->plugin);
        if (!strcmp(row->plugin, chosen->plugin) && row->offload_optimizer == chosen_offload_optimizer &&
            row->offload_param == chosen_offload_param)
            continue; /* that is the chosen row */
        estimate_alternative(req, row, in, activations, e->gpu);
        if (!row->problem[0]) (e->gpu ? row->mem.device : row->mem.host)[ZT_POOL_WORKSPACE] += workspace;
        e->n_rows++;
    }
    /* The alternatives were estimated by putting offload keys: taken back, the config holds the run's
     * own values again, and is validated again before the trainer reads or saves it. */
    zt_config_drop_puts(req->cfg, ALTERNATIVE_ORIGIN);
    if (zt_config_validate(req->cfg, err) != ZT_OK) return err ? err->status : ZT_ERR_CONFIG;
    if (e->gpu) find_gpu_limit(req, &e->limit);
    e->host.local_ranks = 1;
    return find_host_limit(req, e, err);
}

/* "params 12.6 GiB, grads 771 MiB, ...": a side's pools, for messages. */
static void pools_text(const double *pools, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (int p = 0; p < N_POOLS && used < cap; p++) {
        char b[32];
        used += (size_t)snprintf(out + used, cap - used, "%s%s %s", p ? ", " : "", k_pool_keys[p],
                                 zt_estimate_format_bytes(pools[k_pools[p]], b));
    }
}

/* How to select a row: its plugin and offload settings. */
static const char *row_how(const estimate_row *row, char *buf, size_t cap)
{
    snprintf(buf, cap, "run with plugin %s (in --plugins, or --set zero_optimization.stage=%d)%s%s", row->plugin,
             (int)row->stage, row->offload_optimizer ? " --set zero_optimization.offload_optimizer.device=cpu" : "",
             row->offload_param ? " --set zero_optimization.offload_param.device=cpu" : "");
    return buf;
}

/* The message when the chosen GPU configuration does not fit; also the note the runtime adds to an
 * allocation failure (fits = 1: only the estimate and the alternative). */
static void fit_message(const estimate_set *e, char *out, size_t cap)
{
    const estimate_row *chosen = &e->rows[0];
    char name[160], b[32], t[32], dev[512], host[512];
    pools_text(chosen->mem.device, dev, sizeof dev);
    pools_text(chosen->mem.host, host, sizeof host);
    double total = row_total(chosen, 1);
    /* Filled in the order a run allocates them (model states at setup, then buckets, then the
     * forward's activations and the backward's scratch), the pool where the sum first passes the limit. */
    static const int order[] = {ZT_POOL_PARAMS, ZT_POOL_GRADS, ZT_POOL_OPTIMIZER, ZT_POOL_COMM,
                                ZT_POOL_ACTIVATIONS, ZT_POOL_WORKSPACE};
    const char *overflow = NULL;
    double sum = 0;
    for (size_t i = 0; i < sizeof order / sizeof order[0] && !overflow; i++) {
        sum += chosen->mem.device[order[i]];
        if (sum > e->limit.bytes) overflow = zt_pool_name(order[i]);
    }
    size_t used = (size_t)snprintf(out, cap, "%s on %d data-parallel rank%s needs about %s per GPU, more than %s",
                                   row_name(chosen, name), (int)e->in.dp_size, e->in.dp_size == 1 ? "" : "s",
                                   zt_estimate_format_bytes(total, t), e->limit.label);
    if (overflow && used < cap)
        used += (size_t)snprintf(out + used, cap - used, ": pool '%s' overflows", overflow);
    if (used < cap)
        used += (size_t)snprintf(out + used, cap - used, ".\nEstimate per GPU: %s (total %s); host: %s.", dev,
                                 zt_estimate_format_bytes(total, t), host);
    /* The first that fits, preferring less offload (faster), then the lower stage (less traffic);
     * first among those that also fit the machine's memory (when it is this run's machine). */
    const estimate_row *best = NULL, *smallest = NULL;
    for (int pass = 0; pass < 2 && !best; pass++)
        for (int level = 0; level <= 2 && !best; level++)
            for (int r = 1; r < e->n_rows && !best; r++) {
                const estimate_row *row = &e->rows[r];
                if (row->offload_optimizer + row->offload_param == level && row_fits(e, row) &&
                    (pass || !e->host.enforced || row_fits_host(e, row)))
                    best = row;
            }
    for (int r = 0; r < e->n_rows; r++)
        if (!e->rows[r].problem[0] && (!smallest || row_total(&e->rows[r], 1) < row_total(smallest, 1)))
            smallest = &e->rows[r];
    if (used >= cap) return;
    if (best) {
        char how[320], host_note[384] = "", m[32];
        if (e->host.enforced && !row_fits_host(e, best))
            snprintf(host_note, sizeof host_note, "; but for %d rank%s on this machine that is %s of host memory, "
                     "more than %s", (int)e->host.local_ranks, e->host.local_ranks == 1 ? "" : "s",
                     zt_estimate_format_bytes(machine_total(e, best), m), e->host.label);
        snprintf(out + used, cap - used,
                 "\nA configuration that fits: %s: about %s per GPU (host %s%s); %s. Every stage and offload choice: "
                 "add --dry-run.",
                 row_name(best, name), zt_estimate_format_bytes(row_total(best, 1), t), zt_estimate_format_bytes(row_total(best, 0), b), host_note,
                 row_how(best, how, sizeof how));
    } else {
        snprintf(out + used, cap - used,
                 "\nNo ZeRO stage or offload choice fits at this batch (the smallest, %s, needs about %s per GPU): "
                 "%sreduce train_micro_batch_size_per_gpu or data.seq_len, or add data-parallel ranks (--nproc); "
                 "add --dry-run to see every choice.",
                 smallest ? row_name(smallest, name) : "none", smallest ? zt_estimate_format_bytes(row_total(smallest, 1), t) : "?",
                 e->recompute ? "" : "turn on activation checkpointing (--set recompute=true), ");
    }
}

/* The message when the chosen configuration's ranks on this machine need more host memory than it
 * has, with a configuration that fits (the GPU too on GPU runs) and the fixes. */
static void host_fit_message(const estimate_set *e, char *out, size_t cap)
{
    const estimate_row *chosen = &e->rows[0];
    char name[160], t[32], m[32], pools[512];
    int n = (int)e->host.local_ranks, d = (int)e->in.dp_size;
    pools_text(chosen->mem.host, pools, sizeof pools);
    char ranks[96] = "";
    if (n > 1)
        snprintf(ranks, sizeof ranks, ", %s for the %d ranks on this machine", zt_estimate_format_bytes(machine_total(e, chosen), m), n);
    size_t used = (size_t)snprintf(out, cap,
                                   "%s on %d data-parallel rank%s needs about %s of host memory per rank (%s%s)%s, "
                                   "more than %s",
                                   row_name(chosen, name), d, d == 1 ? "" : "s", zt_estimate_format_bytes(row_total(chosen, 0), t), pools,
                                   e->gpu ? "; the offloaded state, page-locked when its pin_memory is true" : "",
                                   ranks, e->host.label);
    /* GPU runs: of those that fit both, the one needing the least GPU memory (the run offloaded to
     * save it); CPU runs: the least offload, then the lowest stage, as for the GPU. */
    const estimate_row *best = NULL;
    for (int level = 0; level <= 2 && (!best || e->gpu); level++)
        for (int r = 1; r < e->n_rows; r++) {
            const estimate_row *row = &e->rows[r];
            if (row->offload_optimizer + row->offload_param != level || !row_fits_all(e, row)) continue;
            if (!best || (e->gpu && row_total(row, 1) < row_total(best, 1))) best = row;
        }
    if (used >= cap) return;
    if (best) {
        char how[320], b[32], host[96], g[64] = "";
        if (e->gpu) snprintf(g, sizeof g, ", %s per GPU", zt_estimate_format_bytes(row_total(best, 1), t));
        if (row_total(best, 0) > 0)
            snprintf(host, sizeof host, "about %s of host memory per rank (%s for %d rank%s)",
                     zt_estimate_format_bytes(row_total(best, 0), b), zt_estimate_format_bytes(machine_total(e, best), m), n, n == 1 ? "" : "s");
        else
            snprintf(host, sizeof host, "nothing in host memory");
        used += (size_t)snprintf(out + used, cap - used, ".\nA configuration that fits: %s: %s%s; %s",
                                 row_name(best, name), host, g, row_how(best, how, sizeof how));
    } else {
        used += (size_t)snprintf(out + used, cap - used, ".\nNo ZeRO stage or offload choice fits%s at %d rank%s on "
                                 "this machine", e->gpu ? " both the GPU and the host" : "", n, n == 1 ? "" : "s");
    }
    if (used >= cap) return;
    snprintf(out + used, cap - used,
             ".\nTo fit: %s%suse a machine with more memory, or free memory here. Every stage and offload choice: "
             "add --dry-run", n > 1 ? "run fewer ranks on this machine (spread them over more machines), " : "",
             e->gpu ? "offload less to the CPU (zero_optimization.offload_param.device and "
                      "offload_optimizer.device = \"none\"), "
                    : "use a higher zero_optimization.stage (less state repeated on every rank) or a smaller "
                      "train_micro_batch_size_per_gpu, ");
}

/* The line under the tables: the chosen configuration's host memory on this machine. */
static void print_machine(FILE *out, const estimate_set *e)
{
    const estimate_row *chosen = &e->rows[0];
    char t[32], m[32];
    int n = (int)e->host.local_ranks;
    if (!e->host.bytes) {
        fprintf(out, "\nHost memory of this machine: not compared (%s).\n", e->host.label);
        return;
    }
    fprintf(out, "\nHost memory of this machine: %d rank%s x %s (this run's configuration) = %s, %s %s%s\n", n,
            n == 1 ? "" : "s", zt_estimate_format_bytes(row_total(chosen, 0), t), zt_estimate_format_bytes(machine_total(e, chosen), m),
            row_fits_host(e, chosen) ? "within" : "more than", e->host.label,
            e->host.enforced ? (row_fits_host(e, chosen) ? ": fits." : ": does not fit.")
                             : (row_fits_host(e, chosen) ? "." : "; not enforced: this GPU run cannot start here, so "
                                "this is not its machine (ZT_HOST_MEM_AVAILABLE=SIZE checks against the memory of "
                                "the machine it is for)."));
}

static void print_side(FILE *out, const char *title, const estimate_set *e, int device)
{
    static const char *const headers[N_POOLS] = {"params", "grads", "optimizer", "activations", "workspace", "comm"};
    int show_fit = device ? e->gpu : e->host.bytes > 0;
    fprintf(out, "%s\n  %-6s %-18s", title, "stage", "offload (opt/param)");
    for (int p = 0; p < N_POOLS; p++) fprintf(out, " %11s", headers[p]);
    fprintf(out, " %11s%s\n", "total", show_fit ? "  fits" : "");
    for (int r = 0; r < e->n_rows; r++) {
        const estimate_row *row = &e->rows[r];
        char offload[32];
        snprintf(offload, sizeof offload, "%s/%s", device_name(row->offload_optimizer),
                 device_name(row->offload_param));
        fprintf(out, "%c %-6d %-18s", row->chosen ? '*' : ' ', (int)row->stage, offload);
        if (row->problem[0]) {
            fprintf(out, " not available: %s\n", row->problem);
            continue;
        }
        const double *pools = device ? row->mem.device : row->mem.host;
        char b[32];
        for (int p = 0; p < N_POOLS; p++) fprintf(out, " %11s", zt_estimate_format_bytes(pools[k_pools[p]], b));
        fprintf(out, " %11s", zt_estimate_format_bytes(side_total(pools), b));
        if (show_fit) fprintf(out, "  %s", (device ? row_fits(e, row) : row_fits_host(e, row)) ? "yes" : "no");
        fputc('\n', out);
    }
}

static void json_side(FILE *f, const char *name, const double *pools)
{
    fprintf(f, "\"%s\":{", name);
    for (int p = 0; p < N_POOLS; p++) fprintf(f, "\"%s\":%.0f,", k_pool_keys[p], pools[k_pools[p]]);
    fprintf(f, "\"total\":%.0f}", side_total(pools));
}

/* The tensor x pipeline layout: per pipeline stage, one rank's pools under the chosen zero plugin. */
static void print_parallel(FILE *out, const estimate_set *e)
{
    const zt_parallel_estimate *p = &e->parallel;
    if (p->problem) fprintf(out, "\nParallel layout: %s.\n", p->why);
    if (!p->n_stages) return;
    fprintf(out, "\nParallel layout: data %d x tensor %d x pipeline %d = %d ranks; %d micro-batch%s per step, "
            "pipeline bubble %.1f%% ((p-1)/(m+p-1)).\nMemory per rank of each pipeline stage (%s, zero plugin '%s'; "
            "1F1B keeps min(p-stage, m) micro-batches' activations):\n",
            (int)p->dp, (int)p->tp, (int)p->pp, (int)p->world, (int)p->n_micro, p->n_micro == 1 ? "" : "es",
            100.0 * p->bubble, e->gpu ? "GPU memory" : "host memory", e->rows[0].plugin);
    for (int32_t i = 0; i < p->n_stages; i++) {
        const zt_parallel_stage_estimate *s = &p->stages[i];
        const double *pools = e->gpu ? s->mem.device : s->mem.host;
        char text[400], total[32];
        pools_text(pools, text, sizeof text);
        fprintf(out, "  stage %d: units %d..%d (%d layer%s), %lld parameters, %d in flight: %s; total %s\n",
                (int)s->stage, (int)s->first_unit, (int)s->last_unit, (int)s->layers, s->layers == 1 ? "" : "s",
                (long long)s->n_parameters, (int)s->in_flight, text,
                zt_estimate_format_bytes(side_total(pools), total));
    }
}

static void json_parallel(FILE *f, const zt_parallel_estimate *p)
{
    fprintf(f, "\"parallel\":{\"dp\":%d,\"tp\":%d,\"pp\":%d,\"world\":%d,\"micro_batches\":%d,\"bubble\":%.17g,"
            "\"stages\":[", (int)p->dp, (int)p->tp, (int)p->pp, (int)p->world, (int)p->n_micro, p->bubble);
    for (int32_t i = 0; i < p->n_stages; i++) {
        const zt_parallel_stage_estimate *s = &p->stages[i];
        fprintf(f, "%s{\"stage\":%d,\"first_unit\":%d,\"last_unit\":%d,\"layers\":%d,\"in_flight\":%d,"
                "\"n_parameters\":%lld,\"activations\":%.0f,", i ? "," : "", (int)s->stage, (int)s->first_unit,
                (int)s->last_unit, (int)s->layers, (int)s->in_flight, (long long)s->n_parameters, s->activations);
        json_side(f, "device", s->mem.device);
        fputc(',', f);
        json_side(f, "host", s->mem.host);
        fputc('}', f);
    }
    fputs("]},", f);
}

static zt_status write_json(const zt_dry_run_request *req, const estimate_set *e, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing %s", req->json_path);
    const zt_estimate_in *in = &e->in;
    fprintf(f,
            "{\"format\":\"zt-memory-estimate\",\"version\":1,\"device\":\"%s\",\"dp_size\":%d,\"micro_batch\":%d,"
            "\"seq_len\":%d,\"recompute\":%s,\"n_parameters\":%lld,",
            e->gpu ? "cuda" : "cpu", (int)in->dp_size, (int)in->micro_batch, (int)in->seq_len,
            in->recompute ? "true" : "false", (long long)in->n_parameters);
    if (e->gpu) {
        fprintf(f, "\"gpu_limit\":%.0f,\"gpu_limit_source\":", e->limit.bytes);
        zt_json_write_string(f, e->limit.label, strlen(e->limit.label));
        fputc(',', f);
    }
    fprintf(f, "\"local_ranks\":%d,\"host_limit\":%.0f,\"host_limit_enforced\":%s,\"host_limit_source\":",
            (int)e->host.local_ranks, e->host.bytes, e->host.enforced ? "true" : "false");
    zt_json_write_string(f, e->host.label, strlen(e->host.label));
    fputc(',', f);
    if (e->parallel.n_stages) json_parallel(f, &e->parallel);
    fputs("\"rows\":[", f);
    for (int r = 0; r < e->n_rows; r++) {
        const estimate_row *row = &e->rows[r];
        fprintf(f, "%s{\"plugin\":\"%s\",\"stage\":%d,\"offload_optimizer\":\"%s\",\"offload_param\":\"%s\","
                   "\"chosen\":%s,",
                r ? "," : "", row->plugin, (int)row->stage, device_name(row->offload_optimizer),
                device_name(row->offload_param), row->chosen ? "true" : "false");
        if (row->problem[0]) {
            fputs("\"problem\":", f);
            zt_json_write_string(f, row->problem, strlen(row->problem));
        } else {
            json_side(f, "device", row->mem.device);
            fputc(',', f);
            json_side(f, "host", row->mem.host);
            if (e->gpu) fprintf(f, ",\"fits\":%s", row_fits(e, row) ? "true" : "false");
            if (e->host.bytes) fprintf(f, ",\"fits_host\":%s", row_fits_host(e, row) ? "true" : "false");
        }
        fputc('}', f);
    }
    fputs("]}\n", f);
    if (fclose(f) != 0) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing %s", req->json_path);
    }
    zt_status st = zt_atomic_write(req->json_path, text, len, err);
    free(text);
    return st;
}

/* ---- the ranks on this machine ------------------------------------------------------------------ */

/* A dry run's: req->local_ranks, else what the launcher says share this machine, else all of them
 * (--nproc N starts them here). */
static int32_t dry_run_local_ranks(const zt_dry_run_request *req)
{
    if (req->local_ranks > 0) return req->local_ranks;
    if (req->plugins->by_kind[ZT_KIND_ZERO].host->world_size > 1) {
        static const char *const vars[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"};
        for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
            const char *v = getenv(vars[i]);
            char *end;
            long n = v ? strtol(v, &end, 10) : 0;
            if (v && *v && !*end && n > 0) return n < req->dp_size ? (int32_t)n : req->dp_size;
        }
    }
    return req->dp_size;
}

/* This machine as the ranks that share its memory see it: its host name and the kernel's boot id. */
static int64_t machine_id(void)
{
    char text[512] = "";
    if (gethostname(text, 256) != 0) text[0] = '\0';
    text[256] = '\0';
    size_t n = strlen(text);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(text + n, (int)(sizeof text - n), f)) text[n] = '\0';
        fclose(f);
    }
    uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */
    for (const char *c = text; *c; c++) h = (h ^ (unsigned char)*c) * UINT64_C(1099511628211);
    return (int64_t)(h >> 1);
}

/* A run's: the launched ranks with this machine's id, over "world"; every rank takes the most memory
 * any of them read (each read it before this collective, so before any allocated its model). */
static zt_status count_local_ranks(const zt_dry_run_request *req, estimate_set *e, zt_error *err)
{
    const zt_host *host = req->plugins->by_kind[ZT_KIND_ZERO].host;
    e->host.local_ranks = 1;
    if (host->world_size <= 1) return ZT_OK;
    zt_group world;
    int64_t mine[2] = {machine_id(), (int64_t)e->host.bytes};
    int64_t *all = calloc((size_t)host->world_size * 2, sizeof *all);
    if (!all) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory counting the ranks on this machine");
    zt_status st = host->group_get(host->ctx, "world", &world);
    if (st == ZT_OK) st = host->all_gather(host->ctx, &world, mine, all, 2, ZT_I64, NULL);
    if (st != ZT_OK) {
        zt_status reported;
        const char *msg = zt_runtime_take_error(host, &reported);
        free(all);
        return zt_error_set(err, st, "cannot count the ranks on this machine for the host-memory check: %s",
                            msg[0] ? msg : zt_status_name(st));
    }
    int32_t n = 0;
    for (int32_t r = 0; r < host->world_size; r++) {
        if (all[2 * r] != mine[0]) continue;
        n++;
        if ((double)all[2 * r + 1] > e->host.bytes) e->host.bytes = (double)all[2 * r + 1];
    }
    free(all);
    e->host.local_ranks = n > 0 ? n : 1;
    return ZT_OK;
}

/* ---- the dry run and the check ------------------------------------------------------------------- */

zt_status zt_dry_run(const zt_dry_run_request *req, FILE *out, zt_error *err)
{
    estimate_set *e = calloc(1, sizeof *e);
    if (!e) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory estimating memory");
    zt_status st = compute_rows(req, e, err);
    if (st != ZT_OK) {
        free_set(e);
        return st;
    }
    e->host.local_ranks = dry_run_local_ranks(req);
    st = zt_estimate_parallel(req, &e->in, &e->model, e->gpu, &e->parallel, err);
    if (st != ZT_OK) {
        free_set(e);
        return st;
    }
    const zt_loaded_plugin *model = &req->plugins->by_kind[ZT_KIND_MODEL];
    const zt_loaded_plugin *opt = &req->plugins->by_kind[ZT_KIND_OPTIMIZER];
    const zt_loaded_plugin *zero = &req->plugins->by_kind[ZT_KIND_ZERO];
    const zt_estimate_in *in = &e->in;
    fprintf(out,
            "Memory per data-parallel rank (zt-run --dry-run): model '%s', %lld parameters (%lld trainable: the "
            "frozen ones cost only their compute copy%s); optimizer '%s', %d state "
            "array%s per element; %d data-parallel rank%s; micro-batch %lld x %lld tokens, recompute %s.\n"
            "* marks this run's configuration (zero plugin '%s'). %s\n\n",
            model->desc.name, (long long)in->n_parameters, (long long)e->layout->n_trainable,
            e->frozen_layers ? ", and the backward stops above the frozen bottom layers" : "", opt->desc.name,
            (int)in->n_optimizer_states,
            in->n_optimizer_states == 1 ? "" : "s", (int)in->dp_size, in->dp_size == 1 ? "" : "s",
            (long long)e->micro, (long long)e->seq_len, e->recompute ? "on" : "off", zero->desc.name,
            e->gpu ? "GPU run: bf16 compute copy and activations, fp32 master, gradients and optimizer state.\n"
                     "Workspace: the model's backward scratch, the LM-head logits chunk and cuBLASLt's workspace. "
                     "The CUDA context and\nkernels outside zt's pools are the gpu_context_reserve, "
                     "taken from the card. Not estimated: small tables (pool other)."
                   : "Not estimated: the model's scratch (pool workspace)\nand small tables (pool other).");
    char fits[400] = "", title[640];
    if (e->host.bytes)
        snprintf(fits, sizeof fits, "; fits: %d rank%s on this machine within %s", (int)e->host.local_ranks,
                 e->host.local_ranks == 1 ? "" : "s", e->host.label);
    if (e->gpu) {
        snprintf(title, sizeof title, "GPU memory per rank (fits: within %s):", e->limit.label);
        print_side(out, title, e, 1);
        fputc('\n', out);
        snprintf(title, sizeof title, "Host memory per rank (offloaded state, pinned%s):", fits);
        print_side(out, title, e, 0);
    } else {
        snprintf(title, sizeof title,
                 "Host memory per rank (this run computes on the CPU, where offload moves nothing%s):", fits);
        print_side(out, title, e, 0);
    }
    print_machine(out, e);
    print_parallel(out, e);
    if (!e->gpu && req->settings->gpu_mem_limit > 0)
        fprintf(out, "\ngpu_mem_limit caps GPU memory; this run computes on the CPU, so it does not apply.\n");
    fflush(out);
    st = req->json_path ? write_json(req, e, err) : ZT_OK;
    const estimate_row *chosen = &e->rows[0];
    int gpu_short = e->gpu && e->limit.enforced && !row_fits(e, chosen);
    int host_short = e->host.enforced && !row_fits_host(e, chosen);
    if (st == ZT_OK && (gpu_short || host_short)) {
        char *msg = malloc(ZT_ERROR_MSG_MAX);
        if (!msg) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory estimating memory");
        else if (gpu_short) {
            fit_message(e, msg, ZT_ERROR_MSG_MAX);
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of GPU memory (estimated): %s", msg);
            if (host_short) {
                char t[32];
                zt_error_append(err, "\nThe host memory does not fit either: %d rank%s on this machine need %s, more "
                                "than %s.", (int)e->host.local_ranks, e->host.local_ranks == 1 ? "" : "s",
                                zt_estimate_format_bytes(machine_total(e, chosen), t), e->host.label);
            }
        } else {
            host_fit_message(e, msg, ZT_ERROR_MSG_MAX);
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of host memory (estimated): %s.", msg);
        }
        free(msg);
    }
    free_set(e);
    return st;
}

zt_status zt_memory_check(const zt_dry_run_request *req, zt_error *err)
{
    zt_machine_memory mm;
    if (zt_machine_memory_read(&mm, err) == ZT_ERR_INVALID_ARG) return err->status; /* a bad ZT_HOST_MEM_AVAILABLE */
    estimate_set *e = calloc(1, sizeof *e);
    char *msg = malloc(ZT_ERROR_MSG_MAX);
    zt_status st = !e || !msg ? zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory estimating memory")
                              : compute_rows(req, e, err);
    /* A CPU run's zero plugin need not estimate (zt_zero_ops.estimate may be NULL there): without an
     * estimate the run goes on unchecked, saying so. Every rank finds the same, so none waits in the
     * collective below alone. */
    if (st != ZT_OK && st != ZT_ERR_OUT_OF_MEMORY && !req->gpu) {
        zt_log(ZT_LOG_WARN, "the host-memory check before the run is skipped: %s", err->msg);
        zt_error_clear(err);
        free(msg);
        free_set(e);
        return ZT_OK;
    }
    /* Every rank gets here (the collective), whatever it found; then each decides alike. */
    if (st == ZT_OK) st = count_local_ranks(req, e, err);
    if (st == ZT_OK && req->gpu) {
        const estimate_row *chosen = &e->rows[0];
        char dev[512], t[32];
        pools_text(chosen->mem.device, dev, sizeof dev);
        /* For an allocation that fails anyway: what was expected, and the smallest choice. */
        const estimate_row *smallest = NULL;
        for (int r = 0; r < e->n_rows; r++)
            if (!e->rows[r].problem[0] && (!smallest || row_total(&e->rows[r], 1) < row_total(smallest, 1)))
                smallest = &e->rows[r];
        char name[160], how[320], s_t[32];
        int n = snprintf(msg, ZT_ERROR_MSG_MAX,
                         "The estimate made before the run (zt-run --dry-run) was, per GPU: %s, total %s, against %s "
                         "(not counted: fragmentation)",
                         dev, zt_estimate_format_bytes(row_total(chosen, 1), t), e->limit.label);
        if (smallest && smallest != chosen && n > 0 && n < ZT_ERROR_MSG_MAX)
            snprintf(msg + n, ZT_ERROR_MSG_MAX - n, ". The smallest choice is %s, about %s per GPU: %s",
                     row_name(smallest, name), zt_estimate_format_bytes(row_total(smallest, 1), s_t), row_how(smallest, how, sizeof how));
        zt_runtime_set_memory_note(req->rt, msg);
        if (e->limit.enforced && !row_fits(e, chosen)) {
            fit_message(e, msg, ZT_ERROR_MSG_MAX);
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY,
                              "out of GPU memory, found before allocating anything (from the estimate): %s", msg);
        }
    }
    if (st == ZT_OK && e->host.enforced && !row_fits_host(e, &e->rows[0])) {
        host_fit_message(e, msg, ZT_ERROR_MSG_MAX);
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY,
                          "out of host memory, found before allocating anything (from the estimate): %s.", msg);
    }
    free(msg);
    free_set(e);
    return st;
}
