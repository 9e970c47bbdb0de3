/* zt-run --dry-run (estimate.h). */
#define _GNU_SOURCE
#include "estimate.h"

#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "json.h"

#define OFFLOAD_OPTIMIZER_KEY "zero_optimization.offload_optimizer.device"
#define OFFLOAD_PARAM_KEY "zero_optimization.offload_param.device"

/* The pools a row shows, in order; "total" is their sum. */
static const int k_pools[] = {ZT_POOL_PARAMS, ZT_POOL_GRADS, ZT_POOL_OPTIMIZER, ZT_POOL_ACTIVATIONS, ZT_POOL_COMM};
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

double zt_estimate_activations(const zt_model_info *m, int64_t tokens, int recompute, double element_bytes)
{
    double n = (double)tokens, hidden = element_bytes * m->hidden_size;
    double head = element_bytes * ((double)m->vocab_size + m->hidden_size + 1);
    if (!recompute) return n * ((double)m->n_layers * m->act_bytes_per_token_layer + head + 3.0 * hidden);
    double layer = m->act_bytes_per_token_layer - hidden; /* recomputed; its input is the trainer's */
    return n * ((double)(m->n_layers + 3) * hidden + (layer > head ? layer : head));
}

static double side_total(const double *pools)
{
    double total = 0;
    for (int p = 0; p < N_POOLS; p++) total += pools[k_pools[p]];
    return total;
}

/* "0", "512 B", "1.50 KiB", "3.25 GiB" */
static const char *human(double bytes, char buf[32])
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

static zt_status set_offload(zt_config *cfg, const char *key, int offload, zt_error *err)
{
    char assignment[128];
    snprintf(assignment, sizeof assignment, "%s=%s", key, device_name(offload));
    return zt_config_set(cfg, assignment, err);
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

static void print_side(FILE *out, const char *title, const estimate_row *rows, int n_rows, int device,
                       double gpu_mem_limit)
{
    static const char *const headers[N_POOLS] = {"params", "grads", "optimizer", "activations", "comm"};
    int show_fit = device && gpu_mem_limit > 0;
    fprintf(out, "%s\n  %-6s %-18s", title, "stage", "offload (opt/param)");
    for (int p = 0; p < N_POOLS; p++) fprintf(out, " %11s", headers[p]);
    fprintf(out, " %11s%s\n", "total", show_fit ? "  fits" : "");
    for (int r = 0; r < n_rows; r++) {
        const estimate_row *row = &rows[r];
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
        for (int p = 0; p < N_POOLS; p++) fprintf(out, " %11s", human(pools[k_pools[p]], b));
        fprintf(out, " %11s", human(side_total(pools), b));
        if (show_fit) fprintf(out, "  %s", side_total(pools) <= gpu_mem_limit ? "yes" : "no");
        fputc('\n', out);
    }
}

static void json_side(FILE *f, const char *name, const double *pools)
{
    static const char *const keys[N_POOLS] = {"params", "grads", "optimizer", "activations", "comm"};
    fprintf(f, "\"%s\":{", name);
    for (int p = 0; p < N_POOLS; p++) fprintf(f, "\"%s\":%.0f,", keys[p], pools[k_pools[p]]);
    fprintf(f, "\"total\":%.0f}", side_total(pools));
}

static zt_status write_json(const zt_dry_run_request *req, const zt_estimate_in *in, const estimate_row *rows,
                            int n_rows, int on_gpu, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing %s", req->json_path);
    fprintf(f,
            "{\"format\":\"zt-memory-estimate\",\"version\":1,\"device\":\"%s\",\"dp_size\":%d,\"micro_batch\":%d,"
            "\"seq_len\":%d,\"recompute\":%s,\"n_parameters\":%lld,\"rows\":[",
            on_gpu ? "cuda" : "cpu", (int)in->dp_size, (int)in->micro_batch, (int)in->seq_len,
            in->recompute ? "true" : "false", (long long)in->n_parameters);
    for (int r = 0; r < n_rows; r++) {
        const estimate_row *row = &rows[r];
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

zt_status zt_dry_run(const zt_dry_run_request *req, FILE *out, zt_error *err)
{
    const zt_config *cfg = req->cfg;
    const zt_loaded_plugin *model = &req->plugins->by_kind[ZT_KIND_MODEL];
    const zt_loaded_plugin *opt = &req->plugins->by_kind[ZT_KIND_OPTIMIZER];
    const zt_loaded_plugin *zero = &req->plugins->by_kind[ZT_KIND_ZERO];
    if (!model->initialized || !opt->initialized || !zero->initialized)
        return zt_error_set(err, ZT_ERR_INTERNAL, "--dry-run needs the model, optimizer and zero plugins initialized");
    const zt_model_info *m = ((const zt_model_ops *)model->plugin->ops)->info(model->state);
    const zt_optimizer_ops *oo = opt->plugin->ops;
    const zt_zero_ops *zo = zero->plugin->ops;
    if (!m) return zt_error_set(err, ZT_ERR_INTERNAL, "model plugin '%s' reports no model info", model->desc.name);

    int64_t micro = 1, seq_len = 1;
    int32_t recompute = 0;
    zt_config_get_int(cfg, "train_micro_batch_size_per_gpu", &micro);
    zt_config_get_int(cfg, "data.seq_len", &seq_len);
    zt_config_get_bool(cfg, "recompute", &recompute);
    int on_gpu = zero->host->device->device_type != ZT_DEVICE_CPU;
    zt_estimate_in in = {.struct_size = sizeof in,
                         .dp_size = req->dp_size,
                         .micro_batch = (int32_t)micro,
                         .seq_len = (int32_t)seq_len,
                         .recompute = recompute,
                         .compute_dtype = on_gpu ? ZT_BF16 : ZT_F32,
                         .n_optimizer_states = oo->n_state ? oo->n_state(opt->state) : 0,
                         .n_parameters = m->n_parameters,
                         .model = m};
    for (int32_t u = 0; u < m->n_units; u++) {
        int64_t unit_numel = 0;
        for (int32_t i = 0; i < m->n_params_decl; i++) {
            if (m->params[i].unit != u || (m->params[i].flags & ZT_PARAM_TIED)) continue;
            int64_t n = 1;
            for (int32_t d = 0; d < m->params[i].ndim; d++) n *= m->params[i].shape[d];
            unit_numel += n;
        }
        if (unit_numel > in.largest_unit_numel) in.largest_unit_numel = unit_numel;
    }
    double activations = zt_estimate_activations(m, micro * seq_len, recompute, on_gpu ? 2.0 : 4.0);

    /* The chosen configuration, from the loaded plugin as configured. */
    estimate_row rows[N_ALTERNATIVES + 1];
    memset(rows, 0, sizeof rows);
    int n_rows = 0, chosen_offload_optimizer = offload_of(cfg, OFFLOAD_OPTIMIZER_KEY),
        chosen_offload_param = offload_of(cfg, OFFLOAD_PARAM_KEY);
    estimate_row *chosen = &rows[n_rows++];
    snprintf(chosen->plugin, sizeof chosen->plugin, "%.63s", zero->desc.name);
    chosen->stage = zo->stage;
    chosen->offload_optimizer = chosen_offload_optimizer;
    chosen->offload_param = chosen_offload_param;
    chosen->chosen = 1;
    zt_status st = plugin_estimate(zero, &in, activations, on_gpu, &chosen->mem, err);
    if (st != ZT_OK) return st;

    /* Every other stage and offload choice, through zt's own plugins. */
    for (int a = 0; a < N_ALTERNATIVES; a++) {
        estimate_row *row = &rows[n_rows];
        row->stage = k_alternatives[a].stage;
        row->offload_optimizer = k_alternatives[a].offload_optimizer;
        row->offload_param = k_alternatives[a].offload_param;
        snprintf(row->plugin, sizeof row->plugin, "zero%d", (int)row->stage);
        if (!strcmp(row->plugin, chosen->plugin) && row->offload_optimizer == chosen_offload_optimizer &&
            row->offload_param == chosen_offload_param)
            continue; /* that is the chosen row */
        estimate_alternative(req, row, &in, activations, on_gpu);
        n_rows++;
    }
    zt_error restore_err;
    if (set_offload(req->cfg, OFFLOAD_OPTIMIZER_KEY, chosen_offload_optimizer, &restore_err) != ZT_OK ||
        set_offload(req->cfg, OFFLOAD_PARAM_KEY, chosen_offload_param, &restore_err) != ZT_OK)
        zt_error_clear(&restore_err); /* keys this run's zero plugin does not declare: nothing to restore */

    int64_t gpu_mem_limit = 0;
    if (zt_config_get_int(cfg, "gpu_mem_limit", &gpu_mem_limit) != ZT_OK) gpu_mem_limit = 0;
    fprintf(out,
            "Memory per data-parallel rank (zt-run --dry-run): model '%s', %lld parameters; optimizer '%s', %d state "
            "array%s per element; %d data-parallel rank%s; micro-batch %lld x %lld tokens, recompute %s.\n"
            "* marks this run's configuration (zero plugin '%s'). Not estimated: the model's scratch (pool workspace)\n"
            "and small tables (pool other).\n\n",
            model->desc.name, (long long)m->n_parameters, opt->desc.name, (int)in.n_optimizer_states,
            in.n_optimizer_states == 1 ? "" : "s", (int)in.dp_size, in.dp_size == 1 ? "" : "s", (long long)micro,
            (long long)seq_len, recompute ? "on" : "off", zero->desc.name);
    if (on_gpu) {
        char limit[64] = "";
        char b[32];
        if (gpu_mem_limit > 0)
            snprintf(limit, sizeof limit, "; fits: within gpu_mem_limit %s", human((double)gpu_mem_limit, b));
        char title[128];
        snprintf(title, sizeof title, "GPU memory per rank%s:", limit);
        print_side(out, title, rows, n_rows, 1, (double)gpu_mem_limit);
        fputc('\n', out);
        print_side(out, "Host memory per rank (offloaded state):", rows, n_rows, 0, 0);
    } else {
        print_side(out, "Host memory per rank (this run computes on the CPU, where offload moves nothing):", rows,
                   n_rows, 0, 0);
        if (gpu_mem_limit > 0)
            fprintf(out, "\ngpu_mem_limit caps GPU memory; this run computes on the CPU, so it does not apply.\n");
    }
    fflush(out);
    return req->json_path ? write_json(req, &in, rows, n_rows, on_gpu, err) : ZT_OK;
}
