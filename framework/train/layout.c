/* The flat parameter layout and deterministic initialisation (layout.h). */
#include "train/layout.h"

#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "base/random.h"

#define PI 3.14159265358979323846

/* ---- checking the model's declarations --------------------------------------------------------- */

static int64_t decl_numel(const zt_param_decl *p)
{
    int64_t n = 1;
    for (int32_t d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static int32_t find_param(const zt_model_info *m, const char *name)
{
    for (int32_t i = 0; i < m->n_params_decl; i++)
        if (m->params[i].name && !strcmp(m->params[i].name, name)) return i;
    return -1;
}

static zt_status check_model(const zt_model_info *m, zt_error *err)
{
    if (m->n_units < 1 || m->n_params_decl < 1 || !m->params)
        return zt_error_set(err, ZT_ERR_INTERNAL,
                            "the model plugin declares %d units and %d parameters: it needs at least one of "
                            "each (a model plugin bug)",
                            (int)m->n_units, (int)m->n_params_decl);
    int64_t total = 0;
    for (int32_t i = 0; i < m->n_params_decl; i++) {
        const zt_param_decl *p = &m->params[i];
        if (!p->name || !*p->name)
            return zt_error_set(err, ZT_ERR_INTERNAL, "the model plugin's parameter %d has no name", (int)i);
        if (p->unit < 0 || p->unit >= m->n_units || (i > 0 && p->unit < m->params[i - 1].unit))
            return zt_error_set(err, ZT_ERR_INTERNAL,
                                "the model plugin's parameter '%s' is in unit %d: parameters must be grouped "
                                "by unit in unit order, with units 0 to %d",
                                p->name, (int)p->unit, (int)m->n_units - 1);
        if (p->ndim < 1 || p->ndim > 4)
            return zt_error_set(err, ZT_ERR_INTERNAL, "the model plugin's parameter '%s' has %d dimensions (1 to 4 allowed)",
                                p->name, (int)p->ndim);
        for (int32_t d = 0; d < p->ndim; d++)
            if (p->shape[d] < 1)
                return zt_error_set(err, ZT_ERR_INTERNAL, "the model plugin's parameter '%s' has size %lld in dimension %d",
                                    p->name, (long long)p->shape[d], (int)d);
        if (p->init != ZT_INIT_NORMAL && p->init != ZT_INIT_ONES && p->init != ZT_INIT_ZEROS && p->init != ZT_INIT_UNIFORM)
            return zt_error_set(err, ZT_ERR_INTERNAL, "the model plugin's parameter '%s' has unknown init kind %d",
                                p->name, (int)p->init);
        if (find_param(m, p->name) != i)
            return zt_error_set(err, ZT_ERR_INTERNAL, "the model plugin declares the parameter '%s' twice", p->name);
        int tied = (p->flags & ZT_PARAM_TIED) != 0;
        if (tied != (p->tied_to != NULL))
            return zt_error_set(err, ZT_ERR_INTERNAL,
                                "the model plugin's parameter '%s' %s: ZT_PARAM_TIED and tied_to go together",
                                p->name, tied ? "is ZT_PARAM_TIED without tied_to" : "has tied_to without ZT_PARAM_TIED");
        if (tied) {
            int32_t o = find_param(m, p->tied_to);
            if (o < 0 || (m->params[o].flags & ZT_PARAM_TIED))
                return zt_error_set(err, ZT_ERR_INTERNAL,
                                    "the model plugin's parameter '%s' is tied to '%s', which %s", p->name, p->tied_to,
                                    o < 0 ? "it does not declare" : "is tied itself");
            const zt_param_decl *q = &m->params[o];
            int same = q->ndim == p->ndim;
            for (int32_t d = 0; same && d < p->ndim; d++) same = q->shape[d] == p->shape[d];
            if (!same)
                return zt_error_set(err, ZT_ERR_INTERNAL,
                                    "the model plugin's parameter '%s' is tied to '%s' of a different shape", p->name,
                                    p->tied_to);
        } else {
            total += decl_numel(p);
        }
    }
    if (total != m->n_parameters)
        return zt_error_set(err, ZT_ERR_INTERNAL,
                            "the model plugin reports %lld parameters but its declarations add up to %lld "
                            "(tied parameters counted once)",
                            (long long)m->n_parameters, (long long)total);
    return ZT_OK;
}

/* ---- trainable_params ------------------------------------------------------------------------ */

static int has_wildcard(const char *pattern)
{
    return strpbrk(pattern, "*?[") != NULL;
}

/* layout.h describes the two kinds of pattern. */
static int pattern_matches(const char *pattern, const char *name)
{
    if (has_wildcard(pattern)) return fnmatch(pattern, name, 0) == 0;
    size_t np = strlen(pattern), nn = strlen(name);
    for (size_t at = 0; at + np <= nn; at++) {
        if (memcmp(name + at, pattern, np) != 0) continue;
        int starts = at == 0 || name[at - 1] == '.';
        int ends = at + np == nn || name[at + np] == '.';
        if (starts && ends) return 1;
    }
    return 0;
}

/* Splits `list` at commas into trimmed patterns; calls fn on each. An empty pattern is an error. */
typedef zt_status (*pattern_fn)(const char *pattern, void *ctx, zt_error *err);

static zt_status for_each_pattern(const char *key, const char *list, pattern_fn fn, void *ctx, int *count,
                                  zt_error *err)
{
    char *copy = strdup(list);
    if (!copy) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", key);
    zt_status st = ZT_OK;
    int index = 0;
    char *item = copy;
    for (char *next; item && st == ZT_OK; item = next) {
        next = strchr(item, ',');
        if (next) *next++ = '\0';
        index++;
        while (*item == ' ' || *item == '\t') item++;
        char *end = item + strlen(item);
        while (end > item && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
        if (!*item && (next || index > 1 || list[0]))
            st = zt_error_set(err, ZT_ERR_CONFIG, "%s \"%s\": pattern %d is empty (an empty pattern selects nothing); remove "
                              "the extra comma", key,
                              list, index);
        else if (*item)
            st = fn(item, ctx, err);
        else
            index--;
    }
    *count = index;
    free(copy);
    return st;
}

typedef struct mark_ctx {
    const zt_model_info *m;
    const int32_t *owner;
    const char *key;
    uint8_t *hits;        /* [n_params_decl] set for every owner a pattern matches */
} mark_ctx;

/* The names a pattern could have meant: the first parameters of the model, for the error. */
static void first_names(const zt_model_info *m, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int32_t i = 0; i < m->n_params_decl && i < 6 && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s\"%s\"", i ? ", " : "", m->params[i].name);
    if (m->n_params_decl > 6 && used < cap) snprintf(buf + used, cap - used, ", ... (%d in all)", (int)m->n_params_decl);
}

static zt_status mark_pattern(const char *pattern, void *opaque, zt_error *err)
{
    mark_ctx *x = opaque;
    /* "layers.31" and "model.layers.31" name the same layer: patterns may leave out the "model." prefix */
    int matched = 0;
    for (int32_t i = 0; i < x->m->n_params_decl; i++) {
        const char *name = x->m->params[i].name;
        int hit = pattern_matches(pattern, name);
        if (!hit && has_wildcard(pattern) && !strncmp(name, "model.", 6)) hit = pattern_matches(pattern, name + 6);
        if (!hit) continue;
        x->hits[x->owner[i]] = 1;
        matched = 1;
    }
    if (matched) return ZT_OK;
    char names[640];
    first_names(x->m, names, sizeof names);
    return zt_error_set(err, ZT_ERR_CONFIG,
                        "%s: the pattern \"%s\" matches no parameter of the model. Patterns match whole "
                        "dot-separated parts of a name (\"q_proj\", \"layers.0\") or, with * ? [], the whole name, "
                        "with or without \"model.\" (\"*.self_attn.*\", \"layers.3?.*\"); the model's parameters "
                        "are %s",
                        x->key, pattern, names);
}

/* The owners matched by the patterns of `list` (key: the config key, for messages) into hits[]. */
static zt_status match_list(const zt_model_info *m, const int32_t *owner, const char *key, const char *list,
                            uint8_t *hits, zt_error *err)
{
    mark_ctx x = {m, owner, key, hits};
    int count = 0;
    zt_status st = for_each_pattern(key, list, mark_pattern, &x, &count, err);
    if (st == ZT_OK && count == 0)
        st = zt_error_set(err, ZT_ERR_CONFIG, "%s is empty%s; unset it%s, or list patterns", key,
                          strcmp(key, "trainable_params") ? "" : ": that would freeze the whole model",
                          strcmp(key, "trainable_params") ? "" : " to train everything");
    return st;
}

/* trainable_params, then pet_config.freeze_include (frozen) and .freeze_exclude (trainable); a
 * parameter both freeze lists match keeps what trainable_params gave it (MindFormers' rule). */
static zt_status apply_trainable(const zt_model_info *m, const int32_t *owner, const zt_layout_options *opt,
                                 uint8_t *trainable, zt_error *err)
{
    size_t np = (size_t)m->n_params_decl;
    uint8_t *inc = calloc(np, 1), *exc = calloc(np, 1);
    zt_status st = inc && exc ? ZT_OK : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading trainable_params");
    if (st == ZT_OK && opt->trainable) {
        st = match_list(m, owner, "trainable_params", opt->trainable, trainable, err);
        if (st == ZT_OK && !memchr(trainable, 1, np))
            st = zt_error_set(err, ZT_ERR_CONFIG, "trainable_params selects nothing to train");
    } else if (st == ZT_OK) {
        memset(trainable, 1, np);
    }
    /* An adapter's parameters train; with an adapter, the base model trains only where
     * trainable_params says so. */
    int adapter = 0;
    for (size_t i = 0; i < np; i++) adapter |= (m->params[i].flags & ZT_PARAM_ADAPTER) != 0;
    for (size_t i = 0; adapter && st == ZT_OK && i < np; i++)
        if (m->params[i].flags & ZT_PARAM_ADAPTER) trainable[i] = 1;
        else if (!opt->trainable) trainable[i] = 0;
    if (st == ZT_OK && opt->freeze_include)
        st = match_list(m, owner, "pet_config.freeze_include", opt->freeze_include, inc, err);
    if (st == ZT_OK && opt->freeze_exclude)
        st = match_list(m, owner, "pet_config.freeze_exclude", opt->freeze_exclude, exc, err);
    for (size_t i = 0; st == ZT_OK && i < np; i++) {
        if (inc[i] && !exc[i]) trainable[i] = 0;
        if (exc[i] && !inc[i]) trainable[i] = 1;
    }
    if (st == ZT_OK && !memchr(trainable, 1, np))
        st = zt_error_set(err, ZT_ERR_CONFIG,
                          "trainable_params and pet_config.freeze_include freeze the whole model: nothing would "
                          "train; leave at least one parameter trainable");
    free(inc);
    free(exc);
    return st;
}

/* ---- build ------------------------------------------------------------------------------------- */

/* Parameter i's shard from opt->shards (whole without them), checked against its declaration. */
static zt_status take_shard(const zt_model_info *model, const zt_layout_options *opt, int32_t i, zt_param_shard *out,
                            int64_t *numel, zt_error *err)
{
    const zt_param_decl *p = &model->params[i];
    *out = (zt_param_shard){.struct_size = sizeof *out, .split_dim = -1, .extent = p->shape[0],
                            .valid = p->shape[0], .replicas = 1};
    if (opt->shards && opt->shards[i].replicas > 1) out->replicas = opt->shards[i].replicas;
    if (!opt->shards || opt->shards[i].split_dim < 0) return ZT_OK;
    const zt_param_shard *sh = &opt->shards[i];
    int32_t dim = sh->split_dim;
    if (dim >= p->ndim || dim > 1 || (dim == 1 && p->ndim != 2) || sh->extent < 1 || sh->valid < 0 ||
        sh->valid > sh->extent || sh->offset < 0 || sh->offset + sh->valid > p->shape[dim] ||
        (p->flags & ZT_PARAM_TIED && sh->split_dim != opt->shards[find_param(model, p->tied_to)].split_dim))
        return zt_error_set(err, ZT_ERR_INTERNAL,
                            "the model's tensor-parallel shard of %s (dimension %d, %lld of %lld from %lld, %lld "
                            "valid) does not fit its shape (a bug in the model plugin's param_shard)",
                            p->name, (int)dim, (long long)sh->extent, (long long)p->shape[dim < 0 ? 0 : dim],
                            (long long)sh->offset, (long long)sh->valid);
    *out = *sh;
    *numel = decl_numel(p) / p->shape[dim] * sh->extent;
    return ZT_OK;
}

zt_status zt_layout_shard_runs(const zt_host_layout *l, int32_t param, int64_t begin, int64_t n,
                               zt_layout_run_fn fn, void *ctx)
{
    return zt_layout_runs_of(l, param, &l->shard[param], begin, n, fn, ctx);
}

zt_status zt_layout_runs_of(const zt_host_layout *l, int32_t param, const zt_param_shard *sh, int64_t begin,
                            int64_t n, zt_layout_run_fn fn, void *ctx)
{
    const zt_param_decl *p = &l->logical->params[param];
    if (n <= 0) return ZT_OK;
    if (sh->split_dim < 0) return fn(ctx, begin, begin, n);
    int64_t row = decl_numel(p) / p->shape[0]; /* elements per row of the logical tensor */
    if (sh->split_dim == 0) { /* whole rows: one run, clipped at the padding */
        int64_t end = begin + n, valid_end = sh->valid * row;
        if (end > valid_end) end = valid_end;
        return begin < end ? fn(ctx, begin, sh->offset * row + begin, end - begin) : ZT_OK;
    }
    /* columns: a run per local row */
    int64_t cols = sh->extent;
    for (int64_t at = begin; at < begin + n;) {
        int64_t r = at / cols, c = at % cols, stop = (r + 1) * cols < begin + n ? (r + 1) * cols : begin + n;
        int64_t c_end = c + (stop - at) < sh->valid ? c + (stop - at) : sh->valid;
        if (c < c_end) {
            zt_status st = fn(ctx, at, r * row + sh->offset + c, c_end - c);
            if (st != ZT_OK) return st;
        }
        at = stop;
    }
    return ZT_OK;
}

void zt_layout_free(zt_host_layout *l)
{
    if (!l) return;
    free(l->units);
    free(l->param_offset);
    free(l->trainable);
    free(l->decay);
    free(l->owner);
    free(l->numel);
    free(l->shard);
    free(l->local_decls);
    free(l->tp_replicas);
    free(l->trainable_numel);
    free(l);
}

/* Whether this rank stores unit u's parameters (all of them, unless it is a pipeline stage). */
static int holds_unit(const zt_layout_options *opt, int32_t u)
{
    return !opt->held_range || (u >= opt->held_first && u <= opt->held_last);
}

zt_status zt_layout_build(const zt_model_info *model, const zt_layout_options *opt, zt_host_layout **out,
                          zt_error *err)
{
    *out = NULL;
    if (opt->dp_size < 1)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "the layout needs a data-parallel size >= 1, got %d",
                            (int)opt->dp_size);
    zt_status st = check_model(model, err);
    if (st != ZT_OK) return st;

    size_t np = (size_t)model->n_params_decl;
    zt_host_layout *l = calloc(1, sizeof *l);
    if (l) {
        l->units = calloc((size_t)model->n_units, sizeof *l->units);
        l->param_offset = calloc(np, sizeof *l->param_offset);
        l->trainable = calloc(np, 1);
        l->decay = calloc(np, 1);
        l->owner = calloc(np, sizeof *l->owner);
        l->numel = calloc(np, sizeof *l->numel);
        l->shard = calloc(np, sizeof *l->shard);
        l->trainable_numel = calloc((size_t)model->n_units, sizeof *l->trainable_numel);
    }
    if (!l || !l->units || !l->param_offset || !l->trainable || !l->decay || !l->owner || !l->numel ||
        !l->shard || !l->trainable_numel) {
        zt_layout_free(l);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory building the parameter layout");
    }

    int64_t quantum = (int64_t)opt->dp_size * ZT_LAYOUT_ALIGN;
    for (int32_t u = 0; u < model->n_units; u++) l->units[u].first_param = -1;
    for (int32_t i = 0; i < model->n_params_decl; i++) {
        const zt_param_decl *p = &model->params[i];
        zt_unit_layout *unit = &l->units[p->unit];
        if (unit->first_param < 0) unit->first_param = i;
        unit->n_params++;
        l->numel[i] = decl_numel(p);
        st = take_shard(model, opt, i, &l->shard[i], &l->numel[i], err);
        if (st != ZT_OK) {
            zt_layout_free(l);
            return st;
        }
        if (!holds_unit(opt, p->unit)) l->numel[i] = 0; /* another pipeline stage's */
        l->owner[i] = (p->flags & ZT_PARAM_TIED) ? find_param(model, p->tied_to) : i;
        l->decay[i] = (p->flags & opt->no_decay_flags) == 0;
    }
    st = apply_trainable(model, l->owner, opt, l->trainable, err);
    if (st != ZT_OK) {
        zt_layout_free(l);
        return st;
    }
    for (int32_t i = 0; i < model->n_params_decl; i++) {
        l->trainable[i] = l->trainable[l->owner[i]]; /* a tied parameter follows its owner */
        l->decay[i] = l->decay[l->owner[i]];
        if (l->owner[i] == i && l->trainable[i]) l->n_trainable += l->numel[i];
    }
    /* Offsets: the unit's trainable parameters first, then (from the padded trainable size on) the
     * frozen ones, each region in declaration order. */
    l->lowest_trainable_unit = -1;
    for (int32_t u = 0; u < model->n_units; u++) {
        zt_unit_layout *unit = &l->units[u];
        if (unit->first_param < 0) unit->first_param = 0; /* a unit without parameters */
        int64_t at[2] = {0, 0}; /* frozen, trainable */
        for (int32_t i = unit->first_param; i < unit->first_param + unit->n_params; i++) {
            if (l->trainable[i] && l->lowest_trainable_unit < 0) l->lowest_trainable_unit = u;
            if (l->owner[i] != i) {
                l->param_offset[i] = -1;
                continue;
            }
            l->param_offset[i] = at[l->trainable[i]];
            at[l->trainable[i]] += l->numel[i];
        }
        unit->numel = at[0] + at[1];
        l->trainable_numel[u] = (at[1] + quantum - 1) / quantum * quantum;
        for (int32_t i = unit->first_param; i < unit->first_param + unit->n_params; i++)
            if (l->param_offset[i] >= 0 && !l->trainable[i]) l->param_offset[i] += l->trainable_numel[u];
        unit->padded_numel = l->trainable_numel[u] + (at[0] + quantum - 1) / quantum * quantum;
        if (unit->padded_numel > l->largest_unit_numel) l->largest_unit_numel = unit->padded_numel;
        if (unit->padded_numel > l->trainable_numel[u]) l->has_frozen_region = 1;
    }

    l->layout.struct_size = sizeof l->layout;
    l->layout.n_units = model->n_units;
    l->layout.model = model;
    l->logical = model;
    if (opt->shards || opt->held_range) {
        l->local_decls = malloc(np * sizeof *l->local_decls);
        if (!l->local_decls) {
            zt_layout_free(l);
            return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory building the parameter layout");
        }
        memcpy(l->local_decls, model->params, np * sizeof *l->local_decls);
        l->local_info = *model;
        l->local_info.params = l->local_decls;
        l->local_info.n_parameters = 0;
        for (size_t i = 0; i < np; i++) {
            if (l->shard[i].split_dim >= 0) l->local_decls[i].shape[l->shard[i].split_dim] = l->shard[i].extent;
            if (!holds_unit(opt, model->params[i].unit)) l->local_decls[i].shape[0] = 0;
            if (l->owner[i] == (int32_t)i) l->local_info.n_parameters += l->numel[i];
        }
        l->layout.model = &l->local_info;
    }
    if (opt->shards) {
        l->tp_replicas = malloc(np * sizeof *l->tp_replicas);
        if (!l->tp_replicas) {
            zt_layout_free(l);
            return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory building the parameter layout");
        }
        for (size_t i = 0; i < np; i++) l->tp_replicas[i] = l->shard[i].replicas;
        l->layout.tp_replicas = l->tp_replicas;
    }
    l->layout.units = l->units;
    l->layout.param_offset = l->param_offset;
    l->layout.trainable = l->trainable;
    l->layout.decay = l->decay;
    l->layout.compute_dtype = ZT_F32;
    l->layout.trainable_numel = l->trainable_numel;
    *out = l;
    return ZT_OK;
}

int32_t zt_layout_find(const zt_host_layout *l, const char *name)
{
    return find_param(l->layout.model, name);
}

/* ---- initialisation ---------------------------------------------------------------------------- */

/* A uniform double in (0, 1]: 53 random bits, never 0 so the logarithm below stays finite. */
static double uniform(uint64_t key, uint64_t counter)
{
    uint64_t bits = zt_mix64(key + counter * ZT_GOLDEN_GAMMA) >> 11;
    return ((double)bits + 1.0) * (1.0 / 9007199254740992.0);
}

typedef struct init_job {
    uint64_t key;
    double std;
    int64_t first;   /* tensor element of dst[0] */
    float *dst;
} init_job;

/* U(-std, std) from one uniform per element (counter j). */
static void init_uniform_range(void *arg, int64_t begin, int64_t end)
{
    const init_job *j = arg;
    for (int64_t k = begin; k < end; k++)
        j->dst[k] = (float)(j->std * (2.0 * uniform(j->key, (uint64_t)(j->first + k)) - 1.0));
}

static void init_normal_range(void *arg, int64_t begin, int64_t end)
{
    const init_job *j = arg;
    for (int64_t k = begin; k < end; k++) {
        uint64_t element = (uint64_t)(j->first + k);
        double u1 = uniform(j->key, 2 * element), u2 = uniform(j->key, 2 * element + 1);
        j->dst[k] = (float)(j->std * sqrt(-2.0 * log(u1)) * cos(2.0 * PI * u2));
    }
}

/* One run of a parameter's random init: dst is the parameter's storage, elements from its start. */
typedef struct init_runs {
    zt_runtime *rt;
    uint64_t key;
    double std;
    void (*fill)(void *, int64_t, int64_t);
    float *param;
} init_runs;

static zt_status init_run(void *ctx, int64_t local, int64_t logical, int64_t count)
{
    const init_runs *r = ctx;
    init_job job = {r->key, r->std, logical, r->param + local};
    if (r->rt) zt_runtime_parallel_for(r->rt, count, 1 << 14, r->fill, &job);
    else r->fill(&job, 0, count);
    return ZT_OK;
}

/* ZT_INIT_ONES on a run (a shard's padding stays zero). */
static zt_status ones_run(void *ctx, int64_t local, int64_t logical, int64_t count)
{
    (void)logical;
    float *param = ctx;
    for (int64_t k = 0; k < count; k++) param[local + k] = 1.0f;
    return ZT_OK;
}

void zt_layout_init_range(const zt_host_layout *l, zt_runtime *rt, int32_t unit, uint64_t seed,
                          int64_t begin, int64_t count, float *dst)
{
    const zt_model_info *m = l->layout.model;
    const zt_unit_layout *u = &l->units[unit];
    memset(dst, 0, (size_t)count * sizeof *dst); /* padding, and the base for ZT_INIT_ZEROS */
    for (int32_t i = u->first_param; i < u->first_param + u->n_params; i++) {
        if (l->param_offset[i] < 0) continue; /* tied: its owner's storage */
        int64_t lo = l->param_offset[i], hi = lo + l->numel[i];
        int64_t from = lo > begin ? lo : begin, to = hi < begin + count ? hi : begin + count;
        if (from >= to) continue;
        const zt_param_decl *p = &m->params[i];
        float *out = dst + (from - begin);
        if (p->init == ZT_INIT_ONES) {
            zt_layout_shard_runs(l, i, from - lo, to - from, ones_run, out - (from - lo));
        } else if (p->init == ZT_INIT_NORMAL || p->init == ZT_INIT_UNIFORM) {
            /* each run of the shard draws the logical tensor's elements it holds */
            init_runs runs = {rt, zt_mix64(seed ^ zt_fnv1a64(ZT_FNV1A64_INIT, p->name, strlen(p->name))),
                              p->init_std, p->init == ZT_INIT_NORMAL ? init_normal_range : init_uniform_range,
                              out - (from - lo)};
            zt_layout_shard_runs(l, i, from - lo, to - from, init_run, &runs);
        }
    }
}
