/* The saved activations of the llama units, the same on every device: which record a forward
 * leaves in *zt_unit_call.saved, from which pool, when it is only a recompute marker, how a backward
 * checks it, recomputes it, and frees it. Where the activations lie and how they are laid out is the
 * device path's (llama_backend.saved_alloc: layers.c, layers_cuda.c); so is the math, which these
 * functions call back (llama_compute_fn).
 *
 * A training forward (ZT_UNIT_TRAIN) keeps its activations in ZT_POOL_ACTIVATIONS; with
 * ZT_UNIT_RECOMPUTE as well it keeps only a marker, and the backward recomputes the forward from the
 * unit input, which the host keeps. Any other forward computes into ZT_POOL_WORKSPACE scratch and
 * keeps nothing. The embedding's backward needs only the tokens, so it never saves a record.
 */
#include "llama.h"

#define SAVED_MAGIC 0x4C41535Au /* "ZSAL" */

void llama_call_init(llama_call *u, llama_state *s, const zt_unit_call *c)
{
    u->s = s;
    u->c = c;
    u->tokens = (int64_t)c->batch->batch * c->batch->seq_len;
    llama_unit_name(s, c->unit, u->name, sizeof u->name);
}

/* A record of this call (just the header when `marker`). */
static llama_saved *record_new(const llama_call *u, int32_t pool, int marker, const char *what)
{
    llama_saved *rec = u->s->backend->saved_alloc(u, pool, marker, what);
    if (!rec) return NULL;
    rec->magic = SAVED_MAGIC;
    rec->unit = u->c->unit;
    rec->recompute = marker;
    rec->tokens = u->tokens;
    rec->attention = u->c->attention;
    return rec;
}

void llama_saved_free(llama_state *s, llama_saved *rec)
{
    if (!rec) return;
    /* A record whose backward never runs: the attention plugin frees its own part. */
    if (rec->attention_saved) rec->attention->ops->release(rec->attention->state, rec->attention_saved);
    rec->magic = 0;
    s->backend->saved_free(s, rec);
}

zt_status llama_saved_forward(const llama_call *u, llama_compute_fn compute)
{
    const zt_unit_call *c = u->c;
    int train = (c->flags & ZT_UNIT_TRAIN) != 0, recompute = (c->flags & ZT_UNIT_RECOMPUTE) != 0;
    int keep = train && !recompute;
    llama_saved *rec = record_new(u, keep ? ZT_POOL_ACTIVATIONS : ZT_POOL_WORKSPACE, 0,
                                  keep ? "activations" : "forward scratch");
    if (!rec) return ZT_ERR_OUT_OF_MEMORY;
    zt_status st = compute(u, rec, 1, keep);
    if (st != ZT_OK || !keep) {
        llama_saved_free(u->s, rec);
        rec = NULL;
    }
    if (st == ZT_OK && train && recompute) {
        rec = record_new(u, ZT_POOL_ACTIVATIONS, 1, "recompute marker");
        if (!rec) return ZT_ERR_OUT_OF_MEMORY;
    }
    if (st == ZT_OK && train) *c->saved = rec;
    return st;
}

zt_status llama_saved_take(const llama_call *u, llama_saved **saved)
{
    llama_saved *rec = *u->c->saved;
    if (!rec || rec->magic != SAVED_MAGIC || rec->unit != u->c->unit || rec->tokens != u->tokens) {
        u->s->host->error(u->s->host->ctx, ZT_ERR_INVALID_ARG,
                          "%s backward: the saved-activations slot does not hold this unit's training forward "
                          "(%s); run forward with ZT_UNIT_TRAIN on the same batch before backward, and free "
                          "each slot once (a host or zero-plugin bug)",
                          u->name,
                          !rec ? "it is empty"
                          : rec->magic != SAVED_MAGIC ? "it holds something else"
                          : rec->unit != u->c->unit  ? "it belongs to another unit"
                                                     : "it was made for a batch of another size");
        return ZT_ERR_INVALID_ARG;
    }
    *saved = rec;
    return ZT_OK;
}

zt_status llama_saved_materialize(const llama_call *u, llama_saved *saved, llama_compute_fn compute,
                                  llama_saved **fresh)
{
    *fresh = NULL;
    if (!saved->recompute) return ZT_OK;
    llama_saved *again = record_new(u, ZT_POOL_ACTIVATIONS, 0, "recomputed activations");
    if (!again) return ZT_ERR_OUT_OF_MEMORY;
    zt_status st = compute(u, again, 0, 1);
    if (st != ZT_OK) {
        llama_saved_free(u->s, again);
        return st;
    }
    *fresh = again;
    return ZT_OK;
}

void llama_saved_done(const llama_call *u, llama_saved *saved, llama_saved *fresh)
{
    llama_saved_free(u->s, fresh);
    llama_saved_free(u->s, saved);
    *u->c->saved = NULL;
}
