/* zt-run --generate: text from a trained model (docs/generate.md is the user's guide).
 *
 * The weights come from a Hugging Face LLaMA directory, a llama2.c model .bin (--model) or a zt
 * checkpoint (--resume); the model and attention plugins run them exactly as in training, one unit
 * after another, but forward only and against the attention plugin's KV cache: the prompt in one
 * call (prefill), then one token per call. The prompt is rendered with the same template code
 * zt-prep uses (dataprep/template.c, library zt_prompt), from the template zt-prep recorded in the
 * data set's manifest when there is one, so the model sees its prompts exactly as in training.
 */
#ifndef ZT_FRAMEWORK_GENERATE_H
#define ZT_FRAMEWORK_GENERATE_H

#include <stdint.h>

#include "base/error.h"

/* What the command line gave; strings point into argv. Numbers stay text until
 * zt_generate_check parses them, so one place says what is wrong with them. */
typedef struct zt_generate_options {
    const char *const *plugin_paths; /* --plugin-path, as for every zt-run action */
    int n_plugin_paths;
    const char *plugins;             /* --plugins: e.g. another attention plugin */
    const char *const *sets;         /* --set KEY=VALUE: model.* overrides, threads */
    int n_sets;

    const char *model;      /* --model: an HF directory or a llama2.c model .bin */
    const char *resume;     /* --resume: a checkpoint (step directory or checkpoint root) */
    const char *adapter;    /* --adapter: a peft adapter directory on --model's base (an adapter plugin's) */
    const char *data;       /* --data: a zt-prep directory whose manifest gives template and tokenizer */
    const char *tokenizer;  /* -t: a tokenizer model (the tokenizer plugin's) or a llama2.c .bin */
    const char *template_name; /* --template NAME|FILE */
    const char *prompt;     /* --prompt: the instruction (or with --raw, the text to continue) */
    const char *input;      /* --input: the Alpaca input field */
    const char *prompt_ids; /* --prompt-ids: "1,22,333", used as they are */
    int raw;                /* --raw: no template */
    int print_ids;          /* --print-ids: write the generated ids instead of text */
    const char *prompts;    /* --prompts: a .json array or .jsonl of records to answer */
    const char *output;     /* --output: the answers, one JSON line per record */
    const char *stats;      /* --stats: the run's figures as one JSON object (docs/generate.md) */

    const char *max_new_tokens, *temperature, *top_k, *top_p, *seed; /* NULL: the defaults */
    const char **stops;     /* --stop TEXT (repeatable): the answer ends before the first of them */
    int n_stops;
} zt_generate_options;

/* The parsed sampling settings. */
typedef struct zt_generate_settings {
    int64_t max_new_tokens; /* default 128 */
    double temperature;     /* default 0: greedy */
    int32_t top_k;          /* default 0: off */
    double top_p;           /* default 1 */
    uint64_t seed;          /* default: the config's seed */
    int seed_given;
} zt_generate_settings;

/* Check the combination of options and parse the numbers. A problem is ZT_ERR_INVALID_ARG (a usage
 * error: zt-run exits with 2) with a message naming the option. */
zt_status zt_generate_check(const zt_generate_options *o, zt_generate_settings *s, zt_error *err);

/* Load the model and tokenizer, build the prompt, generate and print (text is streamed to stdout as
 * it is produced; progress and statistics go to stderr). */
zt_status zt_generate_run(const zt_generate_options *o, const zt_generate_settings *s, zt_error *err);

/* ---- the sampler (exposed for tests) --------------------------------------------------------- */

/* Temperature 0: the argmax (the lowest id among equal maxima, as torch.argmax). Otherwise the
 * top_k most likely tokens (0: all; transformers' TopKLogitsWarper), their softmax of logits /
 * temperature, cut to the smallest set of most likely tokens whose probability reaches top_p
 * (transformers' TopPLogitsWarper: a token stays when the tokens more likely than it hold less than
 * top_p; ties are ordered by id), renormalised, and one draw from it with a splitmix64 generator
 * seeded by `seed`. Tokens rank by logit value (a float comparison: -0 ties with +0), ties
 * to the lower id: the device sampler (zt_cuda_sample) keeps the same rule and, given the same u,
 * draws the same token. */
typedef struct zt_sampler {
    double temperature, top_p;
    int32_t top_k;
    uint64_t state;
    int32_t vocab;
    int32_t *order;  /* scratch [vocab] */
    double *prob;    /* scratch [vocab] */
} zt_sampler;

zt_status zt_sampler_init(zt_sampler *s, int32_t vocab, double temperature, int32_t top_k, double top_p,
                          uint64_t seed, zt_error *err);
void zt_sampler_free(zt_sampler *s);
/* The distribution the next draw comes from: probs[vocab] (zero outside the top-k and top-p sets);
 * for temperature 0 a one at the argmax. */
void zt_sampler_distribution(zt_sampler *s, const float *logits, double *probs);
/* The next token. logits[vocab]; -INFINITY excludes a token. zt_sampler_pick(s, logits,
 * zt_sampler_draw_u(s)), in one call. */
int32_t zt_sampler_next(zt_sampler *s, const float *logits);
/* The uniform number in [0, 1) the next draw walks the distribution with, advancing the generator
 * (53 random bits); 0 without advancing at temperature 0, where no draw is made. A device sampler is
 * given this u, so a record's tokens are the same wherever they are drawn. */
double zt_sampler_draw_u(zt_sampler *s);
/* The token u selects: the argmax at temperature 0, else the first token in id order whose cumulative
 * probability exceeds u (the last token that can be drawn when u is beyond the rounded total). */
int32_t zt_sampler_pick(zt_sampler *s, const float *logits, double u);

#endif
