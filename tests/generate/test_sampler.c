/* The sampler of zt-run --generate (framework/generate/generate.h) against hand-computed distributions:
 * temperature as p_i^(1/T) renormalised, top-p as transformers' TopPLogitsWarper keeps tokens (the
 * smallest most-likely set reaching top_p), greedy as torch.argmax; then the draws: their
 * frequencies follow the distribution, a seed repeats them, and excluded tokens never come out.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/random.h"
#include "generate/generate.h"
#include "ztest.h"

#define V 4

/* probabilities 0.5, 0.3, 0.2 and an excluded token */
static const float k_logits[V] = {-0.69314718f, -1.2039728f, -1.6094379f, -INFINITY};

static void expect_distribution_k(const char *what, double temperature, int32_t top_k, double top_p,
                                  const float *logits, const double *want)
{
    zt_sampler s;
    zt_error err;
    ZT_CHECK_INT(zt_sampler_init(&s, V, temperature, top_k, top_p, 1, &err), ZT_OK);
    double got[V];
    zt_sampler_distribution(&s, logits, got);
    for (int i = 0; i < V; i++) {
        if (fabs(got[i] - want[i]) > 1e-6)
            fprintf(stderr, "%s: p[%d] = %.9f, expected %.9f\n", what, i, got[i], want[i]);
        ZT_CHECK(fabs(got[i] - want[i]) <= 1e-6);
    }
    zt_sampler_free(&s);
}

static void expect_distribution(const char *what, double temperature, double top_p, const float *logits,
                                const double *want)
{
    expect_distribution_k(what, temperature, 0, top_p, logits, want);
}

static void check_distributions(void)
{
    expect_distribution("temperature 1", 1, 1, k_logits, (const double[]){0.5, 0.3, 0.2, 0});
    /* temperature 2: p_i^(1/2) / sum */
    double r[3] = {sqrt(0.5), sqrt(0.3), sqrt(0.2)}, sum = r[0] + r[1] + r[2];
    expect_distribution("temperature 2", 2, 1, k_logits, (const double[]){r[0] / sum, r[1] / sum, r[2] / sum, 0});
    /* temperature 0.5: p_i^2 / sum */
    double q[3] = {0.25, 0.09, 0.04}, qs = 0.38;
    expect_distribution("temperature 0.5", 0.5, 1, k_logits, (const double[]){q[0] / qs, q[1] / qs, q[2] / qs, 0});
    /* top-p: 0.5 stays (nothing above it); 0.3 stays when top_p > 0.5; 0.2 when top_p > 0.8 */
    expect_distribution("top-p 0.4", 1, 0.4, k_logits, (const double[]){1, 0, 0, 0});
    expect_distribution("top-p 0.7", 1, 0.7, k_logits, (const double[]){0.625, 0.375, 0, 0});
    expect_distribution("top-p 0.9", 1, 0.9, k_logits, (const double[]){0.5, 0.3, 0.2, 0});
    /* top-p applies after temperature: at T = 2 the top two hold 0.7370, so 0.7 keeps them */
    expect_distribution("T 2, top-p 0.7", 2, 0.7, k_logits,
                        (const double[]){r[0] / (r[0] + r[1]), r[1] / (r[0] + r[1]), 0, 0});
    /* equal probabilities are ordered by id */
    const float ties[V] = {0, 1, 1, 0};
    expect_distribution("ties, top-p 0.3", 1, 0.3, ties, (const double[]){0, 1, 0, 0});
    /* -0 and +0 are one logit value (the device sampler ranks the same way): the lower id comes first */
    const float zeros[V] = {-1, -0.0f, 0.0f, -1};
    expect_distribution("signed zeros, top-p 0.3", 1, 0.3, zeros, (const double[]){0, 1, 0, 0});
    const float zeros_up[V] = {-1, 0.0f, -0.0f, -1};
    expect_distribution("signed zeros swapped, top-p 0.3", 1, 0.3, zeros_up, (const double[]){0, 1, 0, 0});
    /* top-k keeps the k most likely, renormalised; k >= the vocabulary (or 0) keeps all */
    expect_distribution_k("top-k 1", 1, 1, 1, k_logits, (const double[]){1, 0, 0, 0});
    expect_distribution_k("top-k 2", 1, 2, 1, k_logits, (const double[]){0.625, 0.375, 0, 0});
    expect_distribution_k("top-k 4", 1, 4, 1, k_logits, (const double[]){0.5, 0.3, 0.2, 0});
    expect_distribution_k("top-k 9", 1, 9, 1, k_logits, (const double[]){0.5, 0.3, 0.2, 0});
    /* top-k, then top-p over the renormalised top-k: of 0.625 / 0.375, top-p 0.6 keeps the first */
    expect_distribution_k("top-k 2, top-p 0.6", 1, 2, 0.6, k_logits, (const double[]){1, 0, 0, 0});
    expect_distribution_k("top-k 2, top-p 0.7", 1, 2, 0.7, k_logits, (const double[]){0.625, 0.375, 0, 0});
    /* after the temperature: T 2 flattens, top-k 2 keeps the same two */
    expect_distribution_k("T 2, top-k 2", 2, 2, 1, k_logits,
                          (const double[]){r[0] / (r[0] + r[1]), r[1] / (r[0] + r[1]), 0, 0});
    /* equal logits at the cut: the lower id stays (as the device sampler) */
    expect_distribution_k("ties, top-k 1", 1, 1, 1, ties, (const double[]){0, 1, 0, 0});
    double e = exp(1.0); /* ids 1 and 2 (logit 1), then the lower of ids 0 and 3 (logit 0) */
    expect_distribution_k("ties, top-k 3", 1, 3, 1, ties, (const double[]){1 / (1 + 2 * e), e / (1 + 2 * e), e / (1 + 2 * e), 0});
    /* greedy: the first of equal maxima, as torch.argmax */
    expect_distribution("greedy", 0, 1, ties, (const double[]){0, 1, 0, 0});
}

static void check_draws(void)
{
    zt_sampler s;
    zt_error err;
    enum { N = 200000 };
    int counts[V] = {0};
    ZT_CHECK_INT(zt_sampler_init(&s, V, 1, 0, 0.7, 42, &err), ZT_OK);
    for (int i = 0; i < N; i++) counts[zt_sampler_next(&s, k_logits)]++;
    zt_sampler_free(&s);
    /* 0.625 / 0.375; a standard deviation is 0.0011 */
    ZT_CHECK_CLOSE((double)counts[0] / N, 0.625, 0, 0.006);
    ZT_CHECK_CLOSE((double)counts[1] / N, 0.375, 0, 0.006);
    ZT_CHECK_INT(counts[2], 0);
    ZT_CHECK_INT(counts[3], 0);

    memset(counts, 0, sizeof counts);
    ZT_CHECK_INT(zt_sampler_init(&s, V, 1, 0, 1, 7, &err), ZT_OK);
    for (int i = 0; i < N; i++) counts[zt_sampler_next(&s, k_logits)]++;
    zt_sampler_free(&s);
    ZT_CHECK_CLOSE((double)counts[0] / N, 0.5, 0, 0.006);
    ZT_CHECK_CLOSE((double)counts[1] / N, 0.3, 0, 0.006);
    ZT_CHECK_CLOSE((double)counts[2] / N, 0.2, 0, 0.006);
    ZT_CHECK_INT(counts[3], 0); /* -inf: never */

    /* A seed repeats its draws; another seed gives others. */
    int32_t a[100], b[100], c[100];
    const float flat[V] = {0, 0, 0, 0};
    zt_sampler sa, sb, sc;
    ZT_CHECK_INT(zt_sampler_init(&sa, V, 1, 0, 1, 5, &err), ZT_OK);
    ZT_CHECK_INT(zt_sampler_init(&sb, V, 1, 0, 1, 5, &err), ZT_OK);
    ZT_CHECK_INT(zt_sampler_init(&sc, V, 1, 0, 1, 6, &err), ZT_OK);
    for (int i = 0; i < 100; i++) {
        a[i] = zt_sampler_next(&sa, flat);
        b[i] = zt_sampler_next(&sb, flat);
        c[i] = zt_sampler_next(&sc, flat);
    }
    ZT_CHECK(memcmp(a, b, sizeof a) == 0);
    ZT_CHECK(memcmp(a, c, sizeof a) != 0);
    zt_sampler_free(&sa);
    zt_sampler_free(&sb);
    zt_sampler_free(&sc);

    /* The split a device sampler uses (u drawn on the host, the token picked elsewhere): the u of the
     * k-th draw is the k-th splitmix64 output's top 53 bits over 2^53, and picking with it repeats
     * zt_sampler_next's tokens; at temperature 0 no u is drawn (the generator does not advance). */
    ZT_CHECK_INT(zt_sampler_init(&sa, V, 1, 0, 0.9, 11, &err), ZT_OK);
    ZT_CHECK_INT(zt_sampler_init(&sb, V, 1, 0, 0.9, 11, &err), ZT_OK);
    uint64_t state = 11;
    for (int i = 0; i < 100; i++) {
        double u = zt_sampler_draw_u(&sb);
        ZT_CHECK(u == (double)(zt_splitmix64(&state) >> 11) / 9007199254740992.0);
        ZT_CHECK_INT(zt_sampler_pick(&sb, k_logits, u), zt_sampler_next(&sa, k_logits));
    }
    /* u at the edges: 0 takes the first token that can be drawn, just below 1 the last */
    ZT_CHECK_INT(zt_sampler_pick(&sb, k_logits, 0.0), 0);
    ZT_CHECK_INT(zt_sampler_pick(&sb, k_logits, 0.999999), 2);
    zt_sampler_free(&sa);
    zt_sampler_free(&sb);
    ZT_CHECK_INT(zt_sampler_init(&sa, V, 0, 0, 1, 11, &err), ZT_OK);
    ZT_CHECK(zt_sampler_draw_u(&sa) == 0.0);
    ZT_CHECK(sa.state == 11);
    ZT_CHECK_INT(zt_sampler_pick(&sa, k_logits, 0.9), 0);
    zt_sampler_free(&sa);

    /* A tiny top-p or temperature is greedy. */
    ZT_CHECK_INT(zt_sampler_init(&s, V, 1, 0, 1e-9, 3, &err), ZT_OK);
    for (int i = 0; i < 1000; i++) ZT_CHECK_INT(zt_sampler_next(&s, k_logits), 0);
    zt_sampler_free(&s);
    ZT_CHECK_INT(zt_sampler_init(&s, V, 1e-3, 0, 1, 3, &err), ZT_OK);
    for (int i = 0; i < 1000; i++) ZT_CHECK_INT(zt_sampler_next(&s, k_logits), 0);
    zt_sampler_free(&s);
}

static void check_errors(void)
{
    zt_sampler s;
    zt_error err;
    ZT_CHECK_INT(zt_sampler_init(&s, V, -1, 0, 1, 0, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "temperature -1");
    ZT_CHECK_INT(zt_sampler_init(&s, V, 1, 0, 0, 0, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "top_p in (0, 1]");
    ZT_CHECK_INT(zt_sampler_init(&s, 0, 1, 0, 1, 0, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "vocab >= 1");
    ZT_CHECK_INT(zt_sampler_init(&s, V, 1, -2, 1, 0, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "top_k >= 0");
}

/* --distributions: for sampler_hf.py, which compares with transformers' logits warpers. Reads
 * cases from stdin, each "T K P VOCAB" then VOCAB logits (-inf as "-inf"), and prints each
 * distribution as one line of %.17g numbers. */
static int print_distributions(void)
{
    double temperature, top_p;
    int top_k, vocab;
    while (scanf("%lf %d %lf %d", &temperature, &top_k, &top_p, &vocab) == 4) {
        float *logits = malloc(sizeof(float) * (size_t)vocab);
        double *probs = malloc(sizeof(double) * (size_t)vocab);
        for (int i = 0; i < vocab; i++)
            if (scanf("%f", &logits[i]) != 1) return 2;
        zt_sampler s;
        zt_error err;
        if (zt_sampler_init(&s, vocab, temperature, top_k, top_p, 1, &err) != ZT_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 2;
        }
        zt_sampler_distribution(&s, logits, probs);
        for (int i = 0; i < vocab; i++) printf("%s%.17g", i ? " " : "", probs[i]);
        printf("\n");
        zt_sampler_free(&s);
        free(logits);
        free(probs);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--distributions") == 0) return print_distributions();
    check_distributions();
    check_draws();
    check_errors();
    return zt_test_result();
}
