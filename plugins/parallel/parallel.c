/* The parallel plugin: tensor and pipeline parallelism composed with data parallelism (docs/parallel.md).
 * setup() reads parallel_config, checks it against the job and the model, and creates the "dp", "tp"
 * and "pp" groups; schedule() gives each rank its pipeline instruction list (schedule.c). The math of
 * tensor parallelism lives in the model plugin; the host runs the instruction list. */
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "zt/zt_plugin.h"

static const zt_option k_options[] = {
    {"parallel.virtual_stages", ZT_OPT_INT, ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX, "1", 1, 64, NULL,
     "Model chunks per pipeline rank (Megatron's virtual pipeline stages): above 1 the interleaved 1F1B "
     "schedule, whose bubble is (p-1) / (v m + p-1); micro_batch_num must then be a multiple of pipeline_stage."},
};

typedef struct parallel_state {
    const zt_host *host;
    pp_layout layout;
    zt_rank_grid grid;
    int set_up;
} parallel_state;

static zt_status parallel_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static void parallel_fini(void *state) { free(state); }

static zt_status parallel_init(const zt_host *host, void **state)
{
    *state = NULL;
    parallel_state *s = calloc(1, sizeof *s);
    if (!s) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "cannot allocate the parallel plugin state");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    s->host = host;
    int64_t tp = 1, pp = 1, v = 1;
    zt_status st = host->cfg_int(host->ctx, "parallel_config.model_parallel", &tp);
    if (st == ZT_OK) st = host->cfg_int(host->ctx, "parallel_config.pipeline_stage", &pp);
    if (st == ZT_OK) st = host->cfg_int(host->ctx, "parallel.virtual_stages", &v);
    if (st != ZT_OK) {
        host->error(host->ctx, st, "cannot read parallel_config.model_parallel, .pipeline_stage or "
                    "parallel.virtual_stages");
        free(s);
        return st;
    }
    s->layout.world = host->world_size;
    s->layout.tp = (int32_t)tp;
    s->layout.pp = (int32_t)pp;
    s->layout.virtual_stages = (int32_t)v;
    *state = s;
    return ZT_OK;
}

/* The members of this rank's group along one dimension ('d' data, 't' tensor, 'p' pipeline). */
static void members(const pp_layout *l, const zt_rank_grid *g, char dim, int32_t *out, int32_t *n)
{
    *n = dim == 'd' ? l->dp : dim == 't' ? l->tp : l->pp;
    for (int32_t i = 0; i < *n; i++)
        out[i] = pp_layout_world_rank(l, dim == 'd' ? i : g->dp_rank, dim == 't' ? i : g->tp_rank,
                                      dim == 'p' ? i : g->pp_rank);
}

/* The grid of world rank `rank` of `world`, checked against the job and the model. */
static zt_status parallel_plan(void *state, const zt_model_info *model, int32_t world, int32_t rank,
                               zt_rank_grid *out)
{
    parallel_state *s = state;
    const zt_host *host = s->host;
    char why[1024];
    pp_layout l = s->layout;
    l.world = world;
    l.dp = 0;
    if (!model || world < 1 || rank < 0 || rank >= world) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG, "plan: rank %d of %d ranks (or no model)", (int)rank, (int)world);
        return ZT_ERR_INVALID_ARG;
    }
    if (pp_layout_check(&l, model->n_layers, model->n_heads, model->n_kv_heads, model->intermediate_size, why,
                        sizeof why) != 0) {
        host->error(host->ctx, ZT_ERR_CONFIG, "parallel_config: %s", why);
        return ZT_ERR_CONFIG;
    }
    zt_rank_grid g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.dp_size = l.dp;
    g.tp_size = l.tp;
    g.pp_size = l.pp;
    pp_layout_coords(&l, rank, &g.dp_rank, &g.tp_rank, &g.pp_rank);
    pp_stage_units(model->n_layers, g.pp_size, g.pp_rank, &g.first_unit, &g.last_unit);
    uint32_t size = out->struct_size && out->struct_size < sizeof g ? out->struct_size : (uint32_t)sizeof g;
    memcpy(out, &g, size);
    out->struct_size = size;
    return ZT_OK;
}

static zt_status parallel_setup(void *state, const zt_model_info *model, zt_rank_grid *out)
{
    parallel_state *s = state;
    const zt_host *host = s->host;
    zt_rank_grid g;
    memset(&g, 0, sizeof g);
    zt_status st = parallel_plan(s, model, host->world_size, host->world_rank, &g);
    if (st != ZT_OK) return st;
    s->layout.dp = g.dp_size;
    if (s->layout.virtual_stages > 1) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "parallel.virtual_stages = %d: the trainer runs one model chunk per pipeline rank (the "
                    "interleaved schedule is computed and tested, but a rank holds one unit range); set "
                    "parallel.virtual_stages to 1", (int)s->layout.virtual_stages);
        return ZT_ERR_UNSUPPORTED;
    }
    int32_t *ranks = malloc((size_t)s->layout.world * sizeof *ranks);
    if (!ranks) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "out of memory creating the parallel groups");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    static const char *const names[] = {"dp", "tp", "pp"};
    static const char dims[] = {'d', 't', 'p'};
    for (int i = 0; i < 3; i++) {
        int32_t n;
        zt_group group;
        members(&s->layout, &g, dims[i], ranks, &n);
        st = host->group_create(host->ctx, names[i], ranks, n, &group);
        if (st != ZT_OK) {
            free(ranks);
            host->error(host->ctx, st, "creating the process group '%s' of the %d x %d x %d (data x tensor x "
                        "pipeline) grid failed", names[i], (int)g.dp_size, (int)g.tp_size, (int)g.pp_size);
            return st;
        }
    }
    free(ranks);
    if (out) {
        uint32_t size = out->struct_size && out->struct_size < sizeof g ? out->struct_size : (uint32_t)sizeof g;
        memcpy(out, &g, size);
        out->struct_size = size;
    }
    s->grid = g;
    s->set_up = 1;
    host->log(host->ctx, ZT_LOG_INFO, "grid: data %d x tensor %d x pipeline %d; this rank dp %d tp %d pp %d, units "
              "%d..%d", (int)g.dp_size, (int)g.tp_size, (int)g.pp_size, (int)g.dp_rank, (int)g.tp_rank,
              (int)g.pp_rank, (int)g.first_unit, (int)g.last_unit);
    return ZT_OK;
}

static zt_status parallel_schedule(void *state, int32_t n_micro, zt_pp_action *actions, int32_t cap, int32_t *n)
{
    parallel_state *s = state;
    const zt_host *host = s->host;
    char why[512];
    if (!s->set_up) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG, "schedule called before setup");
        return ZT_ERR_INVALID_ARG;
    }
    if (pp_schedule_check(s->grid.pp_size, s->layout.virtual_stages, n_micro, why, sizeof why) != 0) {
        host->error(host->ctx, ZT_ERR_CONFIG, "%s", why);
        return ZT_ERR_CONFIG;
    }
    int32_t need = pp_schedule_build(s->grid.pp_size, s->layout.virtual_stages, s->grid.pp_rank, n_micro, actions,
                                     actions ? cap : 0);
    if (need < 0) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "out of memory building the pipeline schedule");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    *n = need;
    return need <= cap ? ZT_OK : ZT_ERR_BUFFER_TOO_SMALL;
}

static const zt_parallel_ops k_ops = {
    .struct_size = sizeof(zt_parallel_ops),
    .setup = parallel_setup,
    .schedule = parallel_schedule,
    .plan = parallel_plan,
};

static const zt_plugin k_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_PARALLEL,
    .name = "parallel",
    .version = "1.0.0",
    .description = "Tensor and pipeline parallelism with data parallelism (MindFormers parallel_config): the "
                   "rank grid, its process groups, and the 1F1B pipeline schedule",
    .options = k_options,
    .n_options = sizeof k_options / sizeof k_options[0],
    .caps = ZT_CAP_CPU | ZT_CAP_CUDA,
    .probe = parallel_probe,
    .init = parallel_init,
    .fini = parallel_fini,
    .ops = &k_ops,
};

ZT_PLUGIN_ENTRY
{
    return &k_plugin;
}
