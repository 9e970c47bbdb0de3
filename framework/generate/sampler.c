/* zt-run --generate's sampler (generate.h, exposed for tests): greedy, or temperature, top-k and
 * top-p sampling with a splitmix64 generator. */
#define _GNU_SOURCE /* qsort_r */
#include "base/random.h"
#include "generate/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

zt_status zt_sampler_init(zt_sampler *s, int32_t vocab, double temperature, int32_t top_k, double top_p,
                          uint64_t seed, zt_error *err)
{
    memset(s, 0, sizeof *s);
    if (vocab < 1 || !(temperature >= 0) || top_k < 0 || !(top_p > 0 && top_p <= 1))
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "sampler: vocab %d, temperature %g, top_k %d, top_p %g: need vocab >= 1, temperature "
                            ">= 0, top_k >= 0 (0: off) and top_p in (0, 1]",
                            (int)vocab, temperature, (int)top_k, top_p);
    s->vocab = vocab;
    s->temperature = temperature;
    s->top_k = top_k;
    s->top_p = top_p;
    s->state = seed;
    s->order = malloc((size_t)vocab * sizeof *s->order);
    s->prob = malloc((size_t)vocab * sizeof *s->prob);
    if (!s->order || !s->prob) {
        zt_sampler_free(s);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the sampler (vocabulary %d)", (int)vocab);
    }
    return ZT_OK;
}

void zt_sampler_free(zt_sampler *s)
{
    free(s->order);
    free(s->prob);
    s->order = NULL;
    s->prob = NULL;
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The ranking rule, shared with the device sampler (kernels/cuda/sample.cu): by logit value (a float
 * comparison, so -0 ties with +0), ties to the lower id. Probabilities are monotone in the logit, so
 * this is "most likely first"; ranking the logits rather than the rounded probabilities keeps two
 * distinct logits whose fp64 exp rounds alike in logit order on both sides. */
static int more_likely_first(const void *pa, const void *pb, void *logits)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    float x = ((const float *)logits)[a], y = ((const float *)logits)[b];
    if (x != y) return x > y ? -1 : 1;
    return (a > b) - (a < b);
}

/* The sampling distribution into s->prob (temperature > 0): top-k on the logits (the k most likely,
 * ties to the lower id), the softmax of what is left over the temperature, then top-p on it,
 * renormalised: transformers' order (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
 * and the device sampler's. */
static void distribution(zt_sampler *s, const float *logits)
{
    int32_t V = s->vocab, k_cut = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    int sorted = k_cut < V || s->top_p < 1;
    if (sorted) {
        for (int32_t i = 0; i < V; i++) s->order[i] = i;
        qsort_r(s->order, (size_t)V, sizeof *s->order, more_likely_first, (void *)logits);
    }
    float top = logits[argmax(logits, V)];
    double sum = 0;
    for (int32_t i = 0; i < V; i++) {
        s->prob[i] = logits[i] == -INFINITY ? 0.0 : exp(((double)logits[i] - top) / s->temperature);
    }
    for (int32_t i = k_cut; i < V; i++) s->prob[s->order[i]] = 0; /* beyond the k most likely */
    for (int32_t i = 0; i < V; i++) sum += s->prob[i];
    for (int32_t i = 0; i < V; i++) s->prob[i] /= sum;
    if (s->top_p >= 1) return;
    double kept = 0; /* the mass of the tokens kept so far, all more likely than the next */
    int32_t k = 0;
    for (; k < k_cut && kept < s->top_p; k++) kept += s->prob[s->order[k]];
    for (int32_t i = k; i < V; i++) s->prob[s->order[i]] = 0;
    for (int32_t i = 0; i < k; i++) s->prob[s->order[i]] /= kept;
}

void zt_sampler_distribution(zt_sampler *s, const float *logits, double *probs)
{
    if (s->temperature == 0) {
        memset(probs, 0, (size_t)s->vocab * sizeof *probs);
        probs[argmax(logits, s->vocab)] = 1;
        return;
    }
    distribution(s, logits);
    memcpy(probs, s->prob, (size_t)s->vocab * sizeof *probs);
}

double zt_sampler_draw_u(zt_sampler *s)
{
    return s->temperature == 0 ? 0.0 : (double)(zt_splitmix64(&s->state) >> 11) * 0x1p-53;
}

int32_t zt_sampler_next(zt_sampler *s, const float *logits)
{
    return zt_sampler_pick(s, logits, zt_sampler_draw_u(s));
}

int32_t zt_sampler_pick(zt_sampler *s, const float *logits, double u)
{
    if (s->temperature == 0) return argmax(logits, s->vocab);
    distribution(s, logits);
    double cumulative = 0;
    int32_t last = 0;
    for (int32_t i = 0; i < s->vocab; i++) {
        if (s->prob[i] == 0) continue;
        cumulative += s->prob[i];
        last = i;
        if (u < cumulative) return i;
    }
    return last; /* u beyond the rounded total: the last token that can be drawn */
}
