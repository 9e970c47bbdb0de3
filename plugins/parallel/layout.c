/* The rank grid and its checks against the job and the model (layout.h; docs/parallel.md). */
#include <stdio.h>

#include "layout.h"

/* The divisors of n up to limit, as "1, 2, 4" (for messages saying what would work). */
static void divisors(int32_t n, int32_t limit, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (int32_t d = 1; d <= n && d <= limit && used + 16 < cap; d++)
        if (n % d == 0) used += (size_t)snprintf(out + used, cap - used, "%s%d", used ? ", " : "", (int)d);
}

int pp_layout_check(pp_layout *l, int32_t n_layers, int32_t n_heads, int32_t n_kv_heads, int32_t ffn,
                    char *why, size_t cap)
{
    char ok[256];
    int32_t model = l->tp * l->pp;
    if (l->dp == 0) {
        if (l->world % model) {
            snprintf(why, cap, "model_parallel x pipeline_stage = %d x %d = %d does not divide the job's %d rank%s: "
                     "launch a multiple of %d ranks, or choose sizes whose product divides %d",
                     (int)l->tp, (int)l->pp, (int)model, (int)l->world, l->world == 1 ? "" : "s", (int)model,
                     (int)l->world);
            return -1;
        }
        l->dp = l->world / model;
    }
    if ((int64_t)l->dp * model != l->world) {
        snprintf(why, cap, "data_parallel x model_parallel x pipeline_stage = %d x %d x %d = %lld, but the job has %d "
                 "rank%s: launch %lld ranks (zt-run --nproc, mpirun -np), or change the sizes so their product is %d "
                 "(or remove data_parallel: it is then the ranks left)",
                 (int)l->dp, (int)l->tp, (int)l->pp, (long long)l->dp * model, (int)l->world,
                 l->world == 1 ? "" : "s", (long long)l->dp * model, (int)l->world);
        return -1;
    }
    if (n_heads % l->tp) {
        divisors(n_heads, l->world, ok, sizeof ok);
        snprintf(why, cap, "model_parallel = %d does not divide the model's %d attention heads: use one of %s",
                 (int)l->tp, (int)n_heads, ok);
        return -1;
    }
    /* more tensor ranks than KV heads replicate them (as Megatron does): tp must be a multiple */
    if (n_kv_heads % l->tp && l->tp % n_kv_heads) {
        snprintf(why, cap, "model_parallel = %d and the model's %d KV heads: tp must divide the KV heads or be a "
                 "multiple of them (then each KV head is replicated on tp / %d ranks)",
                 (int)l->tp, (int)n_kv_heads, (int)n_kv_heads);
        return -1;
    }
    if (ffn % l->tp) {
        divisors(ffn, l->world, ok, sizeof ok);
        snprintf(why, cap, "model_parallel = %d does not divide the model's intermediate_size %d: use one of %s",
                 (int)l->tp, (int)ffn, ok);
        return -1;
    }
    if (l->pp > n_layers) {
        snprintf(why, cap, "pipeline_stage = %d is more than the model's %d layer%s: every stage needs at least one "
                 "layer; use at most %d stages", (int)l->pp, (int)n_layers, n_layers == 1 ? "" : "s", (int)n_layers);
        return -1;
    }
    if (l->virtual_stages > 1 && l->pp * l->virtual_stages > n_layers) {
        snprintf(why, cap, "pipeline_stage x parallel.virtual_stages = %d x %d = %d model chunks, but the model has "
                 "%d layers: every chunk needs one; use at most %d virtual stages", (int)l->pp,
                 (int)l->virtual_stages, (int)(l->pp * l->virtual_stages), (int)n_layers, (int)(n_layers / l->pp));
        return -1;
    }
    return 0;
}

void pp_layout_coords(const pp_layout *l, int32_t world_rank, int32_t *dp_rank, int32_t *tp_rank, int32_t *pp_rank)
{
    *tp_rank = world_rank % l->tp;
    *dp_rank = world_rank / l->tp % l->dp;
    *pp_rank = world_rank / (l->tp * l->dp);
}

int32_t pp_layout_world_rank(const pp_layout *l, int32_t dp_rank, int32_t tp_rank, int32_t pp_rank)
{
    return (pp_rank * l->dp + dp_rank) * l->tp + tp_rank;
}

/* The position of `stage` in the order the remainder layers are handed out: the middle stages first
 * (stage 0 holds the most activations under 1F1B, the last computes the LM head), then 0, then the last. */
static int32_t extra_rank(int32_t stages, int32_t stage)
{
    if (stages <= 2) return stage;
    if (stage == 0) return stages - 2;
    if (stage == stages - 1) return stages - 1;
    return stage - 1;
}

void pp_stage_layers(int32_t n_layers, int32_t stages, int32_t stage, int32_t *first_layer, int32_t *count)
{
    int32_t base = n_layers / stages, extra = n_layers % stages, first = 0;
    for (int32_t s = 0; s < stage; s++) first += base + (extra_rank(stages, s) < extra);
    *first_layer = first;
    *count = base + (extra_rank(stages, stage) < extra);
}

void pp_stage_units(int32_t n_layers, int32_t stages, int32_t stage, int32_t *first_unit, int32_t *last_unit)
{
    int32_t first, count;
    pp_stage_layers(n_layers, stages, stage, &first, &count);
    *first_unit = stage == 0 ? 0 : 1 + first;
    *last_unit = stage == stages - 1 ? n_layers + 1 : first + count;
}
