/* The parallel plugin's pure parts, without a host (docs/parallel.md): the rank grid and its checks
 * against the job and the model (layout.c), and the pipeline schedule (schedule.c). tests/parallel
 * compiles these files directly to test them without ranks or devices. */
#ifndef ZT_PARALLEL_LAYOUT_H
#define ZT_PARALLEL_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "zt/zt_train.h"

typedef struct pp_layout {
    int32_t world, dp, tp, pp;     /* world = dp x tp x pp */
    int32_t virtual_stages;        /* model chunks per pipeline rank (1: plain 1F1B) */
} pp_layout;

/* dp (0: the ranks left once tp x pp have theirs) against world, and the sizes against the model's
 * heads, KV heads, ffn and layers. Returns 0, or -1 with why[] naming the numbers and what would work. */
int pp_layout_check(pp_layout *l, int32_t n_layers, int32_t n_heads, int32_t n_kv_heads, int32_t ffn,
                    char *why, size_t cap);

/* This world rank's coordinates, tensor fastest, then data, then pipeline (Megatron's order):
 * world_rank = (pp_rank * dp + dp_rank) * tp + tp_rank. */
void pp_layout_coords(const pp_layout *l, int32_t world_rank, int32_t *dp_rank, int32_t *tp_rank,
                      int32_t *pp_rank);
int32_t pp_layout_world_rank(const pp_layout *l, int32_t dp_rank, int32_t tp_rank, int32_t pp_rank);

/* The decoder layers of pipeline stage `stage` of `stages` (uneven splits: the remainder goes to the
 * middle stages first, then stage 0, then the last; docs/parallel.md). */
void pp_stage_layers(int32_t n_layers, int32_t stages, int32_t stage, int32_t *first_layer, int32_t *count);

/* The model units (0 the embedding, 1..n_layers the layers, n_layers + 1 the head) of stage `stage`. */
void pp_stage_units(int32_t n_layers, int32_t stages, int32_t stage, int32_t *first_unit, int32_t *last_unit);

/* ---- schedule.c ---- */

/* The bubble of the schedule: (p-1) / (v m + p-1). */
double pp_bubble_fraction(int32_t pp, int32_t n_micro, int32_t virtual_stages);

/* n_micro micro-batches that pp x virtual_stages can schedule: 0, or -1 with why[] (interleaving
 * needs a multiple of pp). */
int pp_schedule_check(int32_t pp, int32_t virtual_stages, int32_t n_micro, char *why, size_t cap);

/* Stage `stage`'s instruction list for one step: 1F1B (interleaved when virtual_stages > 1), with
 * the transfers placed so that blocking sends and receives cannot deadlock. Writes up to cap
 * actions, returns the number needed, or -1 when out of memory. */
int32_t pp_schedule_build(int32_t pp, int32_t virtual_stages, int32_t stage, int32_t n_micro,
                          zt_pp_action *out, int32_t cap);

#endif
