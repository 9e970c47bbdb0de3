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
        if (p->init != ZT_INIT_NORMAL && p->init != ZT_INIT_ONES && p->init != ZT_INIT_ZEROS)
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

/* Marks the owners of every parameter matched by a pattern of `list`. */
static zt_status apply_trainable(const zt_model_info *m, const int32_t *owner, const char *list,
                                 uint8_t *trainable, zt_error *err)
{
    char *copy = strdup(list);
    if (!copy) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading trainable_params");
    zt_status st = ZT_OK;
    int index = 0;
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item && st == ZT_OK; item = strtok_r(NULL, ",", &save)) {
        index++;
        while (*item == ' ' || *item == '\t') item++;
        char *end = item + strlen(item);
        while (end > item && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
        if (!*item) {
            st = zt_error_set(err, ZT_ERR_CONFIG,
                              "trainable_params \"%s\": pattern %d is empty; remove the extra comma", list, index);
            break;
        }
        int matched = 0;
        for (int32_t i = 0; i < m->n_params_decl; i++) {
            if (!pattern_matches(item, m->params[i].name)) continue;
            trainable[owner[i]] = 1;
            matched = 1;
        }
        if (!matched)
            st = zt_error_set(err, ZT_ERR_CONFIG,
                              "trainable_params: the pattern \"%s\" matches no parameter of the model. Patterns "
                              "match whole dot-separated parts of a name (\"q_proj\", \"layers.0\") or, with "
                              "* ? [], the whole name (\"*.self_attn.*\"); names look like \"%s\"",
                              item, m->params[m->n_params_decl > 1 ? 1 : 0].name);
    }
    /* "a,,b" and trailing commas produce no strtok token: catch them on the raw text. */
    if (st == ZT_OK && (strstr(list, ",,") || list[0] == ',' || (list[0] && list[strlen(list) - 1] == ',')))
        st = zt_error_set(err, ZT_ERR_CONFIG, "trainable_params \"%s\" has an empty pattern; remove the extra comma",
                          list);
    if (st == ZT_OK && index == 0)
        st = zt_error_set(err, ZT_ERR_CONFIG,
                          "trainable_params is empty: that would freeze the whole model; unset it to train "
                          "everything, or list patterns");
    free(copy);
    return st;
}

/* ---- build ------------------------------------------------------------------------------------- */

void zt_layout_free(zt_host_layout *l)
{
    if (!l) return;
    free(l->units);
    free(l->param_offset);
    free(l->trainable);
    free(l->decay);
    free(l->owner);
    free(l->numel);
    free(l);
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
    }
    if (!l || !l->units || !l->param_offset || !l->trainable || !l->decay || !l->owner || !l->numel) {
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
        if (p->flags & ZT_PARAM_TIED) {
            l->owner[i] = find_param(model, p->tied_to);
            l->param_offset[i] = -1;
        } else {
            l->owner[i] = i;
            l->param_offset[i] = unit->numel;
            unit->numel += l->numel[i];
        }
        l->decay[i] = (p->flags & opt->no_decay_flags) == 0;
    }
    for (int32_t u = 0; u < model->n_units; u++) {
        zt_unit_layout *unit = &l->units[u];
        if (unit->first_param < 0) unit->first_param = 0; /* a unit without parameters */
        unit->padded_numel = (unit->numel + quantum - 1) / quantum * quantum;
        if (unit->padded_numel > l->largest_unit_numel) l->largest_unit_numel = unit->padded_numel;
    }

    if (opt->trainable) {
        st = apply_trainable(model, l->owner, opt->trainable, l->trainable, err);
        if (st != ZT_OK) {
            zt_layout_free(l);
            return st;
        }
    } else {
        memset(l->trainable, 1, np);
    }
    for (int32_t i = 0; i < model->n_params_decl; i++) {
        l->trainable[i] = l->trainable[l->owner[i]]; /* a tied parameter follows its owner */
        l->decay[i] = l->decay[l->owner[i]];
        if (l->owner[i] == i && l->trainable[i]) l->n_trainable += l->numel[i];
    }

    l->layout.struct_size = sizeof l->layout;
    l->layout.n_units = model->n_units;
    l->layout.model = model;
    l->layout.units = l->units;
    l->layout.param_offset = l->param_offset;
    l->layout.trainable = l->trainable;
    l->layout.decay = l->decay;
    l->layout.compute_dtype = ZT_F32;
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

static void init_normal_range(void *arg, int64_t begin, int64_t end)
{
    const init_job *j = arg;
    for (int64_t k = begin; k < end; k++) {
        uint64_t element = (uint64_t)(j->first + k);
        double u1 = uniform(j->key, 2 * element), u2 = uniform(j->key, 2 * element + 1);
        j->dst[k] = (float)(j->std * sqrt(-2.0 * log(u1)) * cos(2.0 * PI * u2));
    }
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
            for (int64_t k = 0; k < to - from; k++) out[k] = 1.0f;
        } else if (p->init == ZT_INIT_NORMAL) {
            uint64_t key = zt_mix64(seed ^ zt_fnv1a64(ZT_FNV1A64_INIT, p->name, strlen(p->name)));
            init_job job = {key, p->init_std, from - lo, out};
            if (rt) zt_runtime_parallel_for(rt, to - from, 1 << 14, init_normal_range, &job);
            else init_normal_range(&job, 0, to - from);
        }
    }
}
