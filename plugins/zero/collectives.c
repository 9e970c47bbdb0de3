/* The zero plugins' collectives (zero.c's header comment, "Gradient reduction" and "Stage 3
 * gathers"): a unit's gradients reduced (all-reduce, reduce-scatter, in buckets through staging
 * buffers), its parameters gathered, stage 3's gathered parameters held, prefetched and freed per
 * unit, and stages 2-3's transient full gradients held for the backward and reduced into the shard
 * when its last writer is done. On GPUs everything here is enqueued on the comm stream and ordered
 * by events (zero_internal.h, "the comm stream"); CPU collectives are synchronous.
 */
#include <stdio.h>
#include <string.h>

#include <zt/zt.h>

#include "zero_internal.h"

/* ---- collectives ---------------------------------------------------------------------------- */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* A staging copy of a collective: memcpy on the CPU, the comm stream on GPUs. */
static zt_status copy_bytes(zero_state *s, void *dst, const void *src, size_t bytes)
{
    if (s->gpu) return zero_cuda_copy_comm(s->host, dst, src, bytes);
    memcpy(dst, src, bytes);
    return ZT_OK;
}

/* Stage 0: SUM over "dp" in place, in pieces of at most reduce_bucket_size elements. */
static zt_status all_reduce_unit(zero_state *s, unit_store *us)
{
    if (s->dp.size <= 1) return ZT_OK;
    for (int64_t at = 0; at < us->n_grad; at += s->cfg.reduce_bucket) {
        int64_t n = min64(us->n_grad - at, s->cfg.reduce_bucket);
        zt_status st = s->host->all_reduce(s->host->ctx, &s->dp, us->grad + at, us->grad + at, (uint64_t)n, ZT_F32,
                                           ZT_REDUCE_SUM, NULL);
        if (st != ZT_OK) return st; /* the host recorded which collective failed */
    }
    return ZT_OK;
}

/* SUM-reduce-scatter `full` ([P], this rank's contribution) so that `shard` receives this rank's
 * reduced slice. shard == full: in place, the slice lands at the start of full (stage 1, and stages
 * 2-3 stepping in the backward). A unit whose slice exceeds reduce_chunk goes in pieces: piece j of
 * every rank's slice is packed into the staging buffer, which is reduce-scattered into piece j of
 * the result. Pieces run in increasing j, so in place a piece is written only where every piece
 * still to be packed has been read (on GPUs the copies and collectives are ordered on the comm
 * stream). The caller has ordered the comm stream after the compute stream. */
static zt_status reduce_scatter_unit(zero_state *s, const unit_store *us, float *full, float *shard)
{
    const zt_host *h = s->host;
    int64_t S = us->shard_count;
    if (S == 0 || (s->dp.size == 1 && full == shard)) return ZT_OK; /* nothing to train; one rank in place */
    if (S <= s->reduce_chunk)
        return h->reduce_scatter(h->ctx, &s->dp, full, shard, (uint64_t)S, ZT_F32, ZT_REDUCE_SUM, NULL);
    for (int64_t at = 0; at < S; at += s->reduce_chunk) {
        int64_t n = min64(S - at, s->reduce_chunk);
        zt_status st = ZT_OK;
        for (int32_t r = 0; r < s->dp.size && st == ZT_OK; r++)
            st = copy_bytes(s, s->reduce_staging + r * n, full + r * S + at, (size_t)n * sizeof(float));
        if (st == ZT_OK)
            st = h->reduce_scatter(h->ctx, &s->dp, s->reduce_staging, shard + at, (uint64_t)n, ZT_F32, ZT_REDUCE_SUM,
                                   NULL);
        if (st != ZT_OK) return st;
    }
    return ZT_OK;
}

/* A whole region of dp * S elements (of `esz` bytes, `dtype`) from every rank's slice `send` of S
 * elements; the inverse of reduce_scatter_unit's pieces. send == this rank's slot of
 * `full` (full + rank * S) gathers in place. The host's in-place form is send == recv, and backends
 * differ in where they read this rank's part then (NCCL's backend: the start of the buffer, as
 * reduce_scatter leaves it; MPI_IN_PLACE: the rank's slot). So the slice is first copied to the
 * start as well: each convention then finds it, and the start is overwritten by rank 0's slice in
 * either case. */
static zt_status all_gather_bytes(zero_state *s, int64_t S, const void *send, void *full, int32_t dtype, size_t esz)
{
    const zt_host *h = s->host;
    int in_place = send == (const void *)((const char *)full + (size_t)s->dp.rank * (size_t)S * esz);
    if (S == 0 || (in_place && s->dp.size == 1)) return ZT_OK;
    if (S <= s->gather_chunk) {
        if (!in_place) return h->all_gather(h->ctx, &s->dp, send, full, (uint64_t)S, dtype, NULL);
        zt_status st = s->dp.rank > 0 ? copy_bytes(s, full, send, (size_t)S * esz) : ZT_OK;
        return st == ZT_OK ? h->all_gather(h->ctx, &s->dp, full, full, (uint64_t)S, dtype, NULL) : st;
    }
    for (int64_t at = 0; at < S; at += s->gather_chunk) {
        int64_t n = min64(S - at, s->gather_chunk);
        zt_status st = h->all_gather(h->ctx, &s->dp, (const char *)send + (size_t)at * esz, s->gather_staging,
                                     (uint64_t)n, dtype, NULL);
        for (int32_t r = 0; r < s->dp.size && st == ZT_OK; r++)
            st = copy_bytes(s, (char *)full + (size_t)(r * S + at) * esz,
                            (const char *)s->gather_staging + (size_t)(r * n) * esz, (size_t)n * esz);
        if (st != ZT_OK) return st;
    }
    return ZT_OK;
}

/* The model's compute copy of unit u from every rank's slice, enqueued. CPU runs: the fp32 master
 * shards into `compute`. GPU runs, bf16 (half the bytes of gathering fp32): stages 1-2 in place in
 * compute_bf16 (this rank's slice was written by the optimizer or a refresh), stage 3 in place after
 * casting the master shard into this rank's slot (cast_gather), or with offload from shard_bf16; the
 * gather's event is unit u's gather slot, which the compute stream waits on before the model reads
 * the copy. */
zt_status zero_gather_unit(zero_state *s, int32_t u)
{
    unit_store *us = &s->units[u];
    zt_status st = comm_after_compute(s);
    if (st != ZT_OK) return st;
    if (!s->gpu) {
        st = all_gather_bytes(s, us->shard_count, us->master, us->compute, ZT_F32, sizeof(float));
        if (st == ZT_OK && SHARDED_PARAMS) /* the frozen region from every rank's frozen shard */
            st = all_gather_bytes(s, us->frozen_count, us->frozen_shard, us->compute + us->padded, ZT_F32,
                                  sizeof(float));
        return st;
    }
    /* offload: the offload thread uploads the unit's updated slice on the copy stream; gather after it */
    if (s->off.on_gpu) st = zero_cuda_comm_wait_upload(s->host, s->gpu, u);
    const uint16_t *send = SHARDED_PARAMS ? us->shard_bf16 : us->compute_bf16 + us->shard_offset;
    if (st == ZT_OK && s->cast_gather) {
        /* the master shard is on the device: its bf16 straight into this rank's slot, gathered in place */
        uint16_t *slot = us->compute_bf16 + us->shard_offset;
        st = zero_cuda_refresh_comm(s->host, s->gpu, us->master, slot, us->shard_count);
        send = slot;
    } else if (st == ZT_OK && SHARDED_PARAMS && s->cfg.offload_param && us->shard_count) {
        /* the bf16 shard lives on the host, which collectives do not read: copy it into this rank's
         * slot of the gathered buffer and gather in place */
        uint16_t *slot = us->compute_bf16 + us->shard_offset;
        st = zero_cuda_copy_in_comm(s->host, s->gpu, slot, us->shard_bf16,
                                    (uint64_t)us->shard_count * sizeof(uint16_t));
        send = slot;
    }
    if (st == ZT_OK) st = all_gather_bytes(s, us->shard_count, send, us->compute_bf16, s->compute16, sizeof(uint16_t));
    if (st == ZT_OK && SHARDED_PARAMS && us->frozen_count) {
        /* the frozen shard (device, or host with offload_param) into its slot, gathered in place */
        uint16_t *slot = us->compute_bf16 + us->frozen_offset;
        st = zero_cuda_copy_in_comm(s->host, s->gpu, slot, us->frozen_shard,
                                    (uint64_t)us->frozen_count * sizeof(uint16_t));
        if (st == ZT_OK)
            st = all_gather_bytes(s, us->frozen_count, slot, us->compute_bf16 + us->padded, s->compute16,
                                  sizeof(uint16_t));
    }
    return st == ZT_OK ? comm_done(s, gather_slot(s, u)) : st;
}

/* Stages 0-1: the step's single reduction of a unit's accumulated gradients (on GPUs enqueued on
 * the comm stream; step() makes the compute stream wait before the norm). */
zt_status zero_reduce_unit_once(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->reduced) return ZT_OK;
    us->reduced = 1;
    zt_status st = comm_after_compute(s);
    if (st == ZT_OK) st = STAGE == 0 ? all_reduce_unit(s, us) : reduce_scatter_unit(s, us, us->grad, us->grad);
    return st == ZT_OK ? comm_done(s, reduce_slot(unit)) : st;
}

/* Stages 2-3: add this micro-batch's transient gradients of storage unit u into its accumulator:
 * the accumulator joins this rank's own contribution first, so the reduce-scatter yields
 * accumulator + sum over ranks. On GPUs the add and the collective run on the comm stream. */
static zt_status reduce_into_shard(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    float *own = us->grad_full + us->shard_offset;
    zt_status st = comm_after_compute(s);
    if (st != ZT_OK) return st;
    if (s->gpu) st = zero_cuda_add_comm(s->host, s->gpu, own, us->grad, us->shard_count);
    else
        for (int64_t k = 0; k < us->shard_count; k++) own[k] += us->grad[k];
    if (st == ZT_OK) st = reduce_scatter_unit(s, us, us->grad_full, us->grad);
    return st == ZT_OK ? comm_done(s, reduce_slot(unit)) : st;
}

/* GPU runs: free the transient gradients whose reduction has finished reading them; the compute
 * stream waits for that reduction first (freeing is stream-ordered on the compute stream). Called
 * one unit later than the reduction, so the reduction overlaps the next unit's backward. */
zt_status zero_flush_pending(zero_state *s, int32_t only)
{
    for (int32_t u = 0; u < s->n_units; u++) {
        unit_store *us = &s->units[u];
        if (!us->pending_free || (only >= 0 && u != only)) continue;
        zt_status st = compute_after(s, reduce_slot(u));
        if (st != ZT_OK) return st;
        s->host->free(s->host->ctx, us->pending_free);
        us->pending_free = NULL;
    }
    return ZT_OK;
}

/* ---- stage 3 gathers and stages 2-3 transient gradients --------------------------------------- */

static zt_status alloc_gathered(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (!s->gpu) {
        us->compute = zero_alloc_floats(s, ZT_POOL_PARAMS, 0, us->total, "gathered parameters", unit);
        return us->compute || !us->total ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
    }
    char tag[96];
    snprintf(tag, sizeof tag, PLUGIN_NAME " unit %d gathered bf16 parameters", (int)unit);
    us->compute_bf16 = us->total ? s->host->alloc(s->host->ctx, ZT_POOL_PARAMS, ZT_MEM_DEVICE,
                                                  (uint64_t)us->total * sizeof(uint16_t), 0, tag)
                                 : NULL;
    return us->compute_bf16 || !us->total ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
}

static void free_gathered(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    s->host->free(s->host->ctx, us->compute);
    s->host->free(s->host->ctx, us->compute_bf16);
    us->compute = NULL;
    us->compute_bf16 = NULL;
}

zt_status zero_hold_params(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->live++ > 0) return ZT_OK;
    if (us->prefetched) { /* gathered ahead on the comm stream: wait for it on the compute stream */
        us->prefetched = 0;
        return compute_after(s, gather_slot(s, unit));
    }
    zt_status st = alloc_gathered(s, unit);
    if (st == ZT_OK) st = zero_gather_unit(s, unit);
    if (st == ZT_OK) st = compute_after(s, gather_slot(s, unit));
    if (st != ZT_OK) {
        free_gathered(s, unit);
        us->live = 0;
    }
    return st;
}

void zero_release_params(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->live == 0 || --us->live > 0) return;
    free_gathered(s, unit); /* the model's reads of it are earlier on the compute stream */
}

/* GPU runs, stage 3: gather unit u ahead on the comm stream, while the current unit computes. */
static zt_status prefetch_params(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (us->live > 0 || us->prefetched) return ZT_OK;
    zt_status st = alloc_gathered(s, unit);
    if (st == ZT_OK) st = zero_gather_unit(s, unit);
    if (st != ZT_OK) {
        free_gathered(s, unit);
        return st;
    }
    us->prefetched = 1;
    return ZT_OK;
}

/* A prefetched unit that will not be used next: free it once its gather is done. */
static zt_status drop_prefetch(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (!us->prefetched) return ZT_OK;
    us->prefetched = 0;
    zt_status st = compute_after(s, gather_slot(s, unit));
    free_gathered(s, unit);
    return st;
}

/* Stage 3 on GPUs: prefetch the storage units of the unit that runs after `unit` in this phase
 * (forward: unit + 1, backward: unit - 1), up to stage3_prefetch_bucket_size elements and as long as the
 * gathered units stay within stage3_max_live_parameters elements, and drop
 * prefetches that neither this unit nor the next one uses. */
zt_status zero_prefetch_next(zero_state *s, int32_t unit, int32_t phase)
{
    int32_t next = phase == ZT_PHASE_FORWARD ? unit + 1 : unit - 1;
    int has_next = next >= 0 && next < s->n_units;
    zt_status st = ZT_OK;
    for (int32_t u = 0; u < s->n_units && st == ZT_OK; u++) {
        if (!s->units[u].prefetched) continue;
        int used = 0;
        for (int32_t k = 0; has_next && k < s->units[next].n_touched; k++) used |= s->units[next].touched[k] == u;
        if (!used) st = drop_prefetch(s, u);
    }
    if (st != ZT_OK || !has_next || s->cfg.prefetch_bucket <= 0) return st;
    /* stage3_max_live_parameters: what stays gathered (the running units, earlier prefetches) counts */
    int64_t live = 0;
    for (int32_t u = 0; u < s->n_units; u++)
        if (s->units[u].live > 0 || s->units[u].prefetched) live += s->units[u].padded;
    int64_t budget = s->cfg.max_live - live < s->cfg.prefetch_bucket ? s->cfg.max_live - live : s->cfg.prefetch_bucket;
    for (int32_t k = 0; k < s->units[next].n_touched && st == ZT_OK; k++) {
        int32_t home = s->units[next].touched[k];
        if (s->units[home].live > 0 || s->units[home].prefetched) continue;
        if (s->units[home].total > budget) break;
        budget -= s->units[home].total;
        st = prefetch_params(s, home);
    }
    return st;
}

/* The transient full gradients of one storage unit's backward: stages 2-3 always; stages 0-1 when
 * stepping in the backward (then `grad` itself is transient). Zero-filled. */
zt_status zero_hold_grads(zero_state *s, int32_t unit)
{
    unit_store *us = &s->units[unit];
    if (!SHARDED_GRADS) { /* step_in_backward only: allocated by the first backward touching it */
        if (us->grad || !us->n_grad) return ZT_OK;
        us->grad = zero_alloc_floats(s, ZT_POOL_GRADS, 0, us->n_grad, "gradients of this step (transient)", unit);
        return us->grad ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
    }
    if (!us->padded) return ZT_OK; /* nothing of it trains: no gradients (release_grads sees no refs) */
    if (us->grad_refs++ > 0) return ZT_OK;
    if (us->pending_free) { /* its previous reduction may still read the old buffer */
        zt_status st = zero_flush_pending(s, unit);
        if (st != ZT_OK) return st;
    }
    us->grad_full = zero_alloc_floats(s, ZT_POOL_GRADS, 0, us->padded, "gradients of this backward", unit);
    if (us->grad_full) return ZT_OK;
    us->grad_refs = 0;
    return ZT_ERR_OUT_OF_MEMORY;
}

/* Stages 2-3: reduce the transient gradients once the last backward writing them is done, then free
 * them (GPU runs: one unit later, zero_flush_pending). Stepping in the backward, a storage unit written
 * by one unit only is reduced in place and stepped from the transient buffer, one written by several (a
 * tied embedding) accumulates in its shard as usual and is stepped by its last writer. */
zt_status zero_release_grads(zero_state *s, int32_t unit, int32_t by)
{
    unit_store *us = &s->units[unit];
    if (us->grad_refs == 0 || --us->grad_refs > 0) return ZT_OK;
    zt_status st;
    if (s->sib.on && !us->grad) {
        st = comm_after_compute(s);
        if (st == ZT_OK) st = reduce_scatter_unit(s, us, us->grad_full, us->grad_full);
        if (st == ZT_OK) st = comm_done(s, reduce_slot(unit));
        if (st == ZT_OK) st = compute_after(s, reduce_slot(unit));
        if (st == ZT_OK) st = zero_sib_step_unit(s, unit, us->grad_full);
        s->host->free(s->host->ctx, us->grad_full); /* stream-ordered after the step's reads */
        us->grad_full = NULL;
        return st;
    }
    if (s->off.on_gpu) { /* offload: reduce in place, the slice down to the host shard (zero_off_download_grads) */
        st = comm_after_compute(s);
        if (st == ZT_OK) st = reduce_scatter_unit(s, us, us->grad_full, us->grad_full);
        if (st == ZT_OK) st = zero_off_download_grads(s, unit, us->grad_full);
        /* recorded after the download, so zero_flush_pending frees grad_full once the copy has read it */
        if (st == ZT_OK) st = comm_done(s, reduce_slot(unit));
        us->pending_free = us->grad_full;
        us->grad_full = NULL;
        if (st == ZT_OK && s->off.early_now && us->sib_step_at == by) st = zero_off_submit_step(s, unit);
        return st;
    }
    st = reduce_into_shard(s, unit);
    if (s->gpu) {
        us->pending_free = us->grad_full;
    } else {
        s->host->free(s->host->ctx, us->grad_full);
    }
    us->grad_full = NULL;
    if (st == ZT_OK && s->sib.on && us->sib_step_at == by) {
        st = compute_after(s, reduce_slot(unit));
        if (st == ZT_OK) st = zero_sib_step_unit(s, unit, us->grad);
    }
    return st;
}
