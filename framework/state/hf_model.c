/* Hugging Face LLaMA directories: config.json mapping, weight lookup across shards, export. */
#define _GNU_SOURCE /* open_memstream */

#include "state/hf_model.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/args.h"
#include "base/json.h"
#include "base/log.h"

/* ---- config.json ----------------------------------------------------------------------------- */

const char *const zt_hf_informational_keys[] = {
    /* bookkeeping */
    "_name_or_path", "transformers_version", "_commit_hash", "tokenizer_class",
    /* inference and framework switches */
    "use_cache", "_attn_implementation", "attn_implementation", "torchscript", "use_bfloat16",
    "return_dict", "output_attentions", "output_hidden_states", "output_scores",
    "return_dict_in_generate", "tf_legacy_loss", "chunk_size_feed_forward",
    /* pretraining_tp > 1 splits the projections into slices: the same sums in another order */
    "pretraining_tp",
    /* heads and tasks a causal LM does not use */
    "id2label", "label2id", "problem_type", "finetuning_task", "task_specific_params", "prefix",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
    "tie_encoder_decoder", "decoder_start_token_id", "sep_token_id",
    /* generation defaults of older configs (generation_config.json holds them today) */
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    NULL};

/* Keys this file reads (or refuses with a reason); everything else is informational or unknown. */
static const char *const handled_keys[] = {
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps",
    "rope_theta", "rope_scaling", "rope_parameters", "tie_word_embeddings", "bos_token_id",
    "eos_token_id", "pad_token_id", "torch_dtype", "dtype", "architectures", "model_type",
    "hidden_act", "attention_bias", "mlp_bias", "attention_dropout", "initializer_range",
    "quantization_config", NULL};

static int in_list(const char *const *list, const zt_json *j, int key_tok)
{
    for (int i = 0; list[i]; i++) {
        if (zt_json_eq(j, key_tok, list[i])) return 1;
    }
    return 0;
}

void zt_hf_config_defaults(zt_hf_config *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 32000;
    c->hidden_size = 4096;
    c->intermediate_size = 11008;
    c->num_hidden_layers = 32;
    c->num_attention_heads = 32;
    c->num_key_value_heads = 32;
    c->head_dim = 128;
    c->max_position_embeddings = 2048;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->initializer_range = 0.02;
    c->bos_token_id = 1;
    c->eos_token_ids[0] = 2;
    c->n_eos = 1;
    c->pad_token_id = -1;
    c->dtype = -1;
}

typedef struct cfg_reader {
    const zt_json *j;
    const char *origin;
    zt_error *err;
} cfg_reader;

/* "origin:line:col" of token tok (a string's opening quote), for messages. */
static const char *where(const cfg_reader *r, int tok, char *buf, size_t cap)
{
    int line, col;
    const zt_json_tok *t = &r->j->tok[tok];
    zt_json_line_col(r->j->text, (size_t)(t->start - (t->type == ZT_JSON_STRING)), &line, &col);
    snprintf(buf, cap, "%s:%d:%d", r->origin, line, col);
    return buf;
}

static zt_status bad_value(const cfg_reader *r, int tok, const char *key, const char *expected)
{
    char at[1200];
    const zt_json_tok *t = &r->j->tok[tok];
    /* "288" is not 288: a quoted value is said to be the string it is */
    const char *kind = "";
    if (t->type == ZT_JSON_STRING) {
        zt_json value;
        zt_error ignored;
        int primitive = zt_json_parse(r->j->text + t->start, (size_t)(t->end - t->start), "value", &value,
                                      &ignored) == ZT_OK;
        if (primitive) {
            primitive = value.tok[0].type == ZT_JSON_PRIMITIVE;
            zt_json_free(&value);
        }
        kind = primitive ? ", a string (write it without the quotes)" : ", a string";
    }
    return zt_error_set(r->err, ZT_ERR_CONFIG, "%s: \"%s\" must be %s, found %.*s%s%s",
                        where(r, tok, at, sizeof at), key, expected,
                        t->end - t->start > 60 ? 60 : t->end - t->start, r->j->text + t->start,
                        t->end - t->start > 60 ? "..." : "", kind);
}

/* Value token of key in obj; -1 when absent or null. */
static int value_of(const cfg_reader *r, int obj, const char *key)
{
    int tok = zt_json_object_get(r->j, obj, key);
    return tok >= 0 && zt_json_is_null(r->j, tok) ? -1 : tok;
}

/* An integer >= min. Absent: ZT_ERR_NOT_FOUND without touching *out (caller decides). */
static zt_status read_int(const cfg_reader *r, int obj, const char *key, int64_t min, int64_t *out)
{
    int tok = value_of(r, obj, key);
    if (tok < 0) return ZT_ERR_NOT_FOUND;
    double v = zt_json_get_number(r->j, tok);
    if (!zt_json_is_number(r->j, tok) || v != floor(v) || v < (double)min || v > 9.0e15) {
        char expected[64];
        snprintf(expected, sizeof expected, "an integer >= %" PRId64, min);
        return bad_value(r, tok, key, expected);
    }
    *out = (int64_t)v;
    return ZT_OK;
}

static zt_status require_int(const cfg_reader *r, int obj, const char *key, int64_t *out)
{
    zt_status st = read_int(r, obj, key, 1, out);
    if (st == ZT_ERR_NOT_FOUND) {
        return zt_error_set(r->err, ZT_ERR_CONFIG,
                            "%s: \"%s\" is missing; a LLaMA config.json must give it (transformers "
                            "would silently assume its 7B default)",
                            r->origin, key);
    }
    return st;
}

static zt_status read_positive_float(const cfg_reader *r, int obj, const char *key, double *out)
{
    int tok = value_of(r, obj, key);
    if (tok < 0) return ZT_ERR_NOT_FOUND;
    if (!zt_json_is_number(r->j, tok) || !(zt_json_get_number(r->j, tok) > 0)) {
        return bad_value(r, tok, key, "a number > 0");
    }
    *out = zt_json_get_number(r->j, tok);
    return ZT_OK;
}

static zt_status read_bool(const cfg_reader *r, int obj, const char *key, int32_t *out)
{
    int tok = value_of(r, obj, key);
    if (tok < 0) return ZT_ERR_NOT_FOUND;
    if (!zt_json_is_bool(r->j, tok)) return bad_value(r, tok, key, "true or false");
    *out = zt_json_get_bool(r->j, tok);
    return ZT_OK;
}

/* A string value compared without allocation (config values never need unescaping to compare). */
static int string_is(const cfg_reader *r, int tok, const char *s)
{
    return tok >= 0 && zt_json_eq(r->j, tok, s);
}

static zt_status refuse(const cfg_reader *r, int tok, const char *what)
{
    char at[1200];
    return zt_error_set(r->err, ZT_ERR_UNSUPPORTED, "%s: %s", where(r, tok, at, sizeof at), what);
}

static int is_ok_or_absent(zt_status st) { return st == ZT_OK || st == ZT_ERR_NOT_FOUND; }

/* rope_scaling (transformers 4) or rope_parameters (transformers 5) object `obj`. */
static zt_status read_rope(const cfg_reader *r, int obj, const char *key, zt_hf_config *c)
{
    if (r->j->tok[obj].type != ZT_JSON_OBJECT) return bad_value(r, obj, key, "an object or null");
    int type = value_of(r, obj, "rope_type");
    if (type < 0) type = value_of(r, obj, "type"); /* the older spelling */
    zt_status st = read_positive_float(r, obj, "rope_theta", &c->rope_theta);
    if (!is_ok_or_absent(st)) return st;
    if (type < 0 || string_is(r, type, "default")) {
        c->rope_llama3 = 0;
        return ZT_OK;
    }
    if (r->j->tok[type].type != ZT_JSON_STRING) return bad_value(r, type, key, "a rope_type string");
    if (!string_is(r, type, "llama3")) {
        char what[512];
        snprintf(what, sizeof what,
                 "%s type %.*s is not supported by zt, which implements plain RoPE and the "
                 "\"llama3\" scaling; training with another scaling would silently differ from "
                 "transformers",
                 key, r->j->tok[type].end - r->j->tok[type].start + 2,
                 r->j->text + r->j->tok[type].start - 1);
        return refuse(r, type, what);
    }
    c->rope_llama3 = 1;
    const char *fields[] = {"factor", "low_freq_factor", "high_freq_factor"};
    double *values[] = {&c->rope_factor, &c->rope_low_freq_factor, &c->rope_high_freq_factor};
    for (int i = 0; i < 3; i++) {
        st = read_positive_float(r, obj, fields[i], values[i]);
        if (st == ZT_ERR_NOT_FOUND) {
            return zt_error_set(r->err, ZT_ERR_CONFIG,
                                "%s: %s of type llama3 needs \"%s\" (Llama 3.1 uses factor 8, "
                                "low_freq_factor 1, high_freq_factor 4)",
                                r->origin, key, fields[i]);
        }
        if (st != ZT_OK) return st;
    }
    st = read_int(r, obj, "original_max_position_embeddings", 1,
                  &c->rope_original_max_position_embeddings);
    if (st == ZT_ERR_NOT_FOUND) {
        return zt_error_set(r->err, ZT_ERR_CONFIG,
                            "%s: %s of type llama3 needs \"original_max_position_embeddings\" "
                            "(8192 for Llama 3.1)",
                            r->origin, key);
    }
    if (st != ZT_OK) return st;
    if (c->rope_high_freq_factor <= c->rope_low_freq_factor) {
        return zt_error_set(r->err, ZT_ERR_CONFIG,
                            "%s: %s high_freq_factor (%g) must be greater than low_freq_factor (%g)",
                            r->origin, key, c->rope_high_freq_factor, c->rope_low_freq_factor);
    }
    return ZT_OK;
}

/* A special token id the vocabulary does not have: an embedding row that does not exist. */
static zt_status id_outside_vocab(const cfg_reader *r, int tok, const char *key, int64_t id, int64_t vocab)
{
    char at[1200];
    return zt_error_set(r->err, ZT_ERR_CONFIG,
                        "%s: \"%s\" is %" PRId64 ", but vocab_size is %" PRId64 " (ids 0 to %" PRId64 "): the "
                        "model has no such token; fix the id in %s (the tokenizer's own files name its special "
                        "tokens) or use the config.json that belongs to these weights",
                        where(r, tok, at, sizeof at), key, id, vocab, vocab - 1, r->origin);
}

/* bos/pad: an id >= 0 or null; eos also a list of ids. Every id below vocab_size. */
static zt_status read_token_ids(const cfg_reader *r, zt_hf_config *c)
{
    zt_status st = ZT_OK;
    const char *single[] = {"bos_token_id", "pad_token_id"};
    int64_t *dst[] = {&c->bos_token_id, &c->pad_token_id};
    for (int i = 0; i < 2; i++) {
        int tok = zt_json_object_get(r->j, 0, single[i]);
        if (tok < 0) continue;
        *dst[i] = -1;
        st = read_int(r, 0, single[i], 0, dst[i]);
        if (!is_ok_or_absent(st)) return st;
        if (*dst[i] >= c->vocab_size) return id_outside_vocab(r, tok, single[i], *dst[i], c->vocab_size);
    }
    int eos = zt_json_object_get(r->j, 0, "eos_token_id");
    if (eos < 0) return ZT_OK;
    c->n_eos = 0;
    if (zt_json_is_null(r->j, eos)) return ZT_OK;
    int first = eos, count = 1;
    if (r->j->tok[eos].type == ZT_JSON_ARRAY) {
        first = eos + 1;
        count = r->j->tok[eos].size;
        if (count > ZT_HF_MAX_EOS) {
            return bad_value(r, eos, "eos_token_id", "an id or a list of at most 8 ids");
        }
    }
    for (int i = 0, tok = first; i < count; i++, tok = zt_json_skip(r->j, tok)) {
        double v = zt_json_get_number(r->j, tok);
        if (!zt_json_is_number(r->j, tok) || v != floor(v) || v < 0 || v > 9.0e15) {
            return bad_value(r, tok, "eos_token_id", "a token id >= 0 or a list of them");
        }
        if ((int64_t)v >= c->vocab_size) return id_outside_vocab(r, tok, "eos_token_id", (int64_t)v, c->vocab_size);
        c->eos_token_ids[c->n_eos++] = (int64_t)v;
    }
    return ZT_OK;
}

/* What changes the math and zt does not implement: refused, each with its reason. */
static zt_status refuse_unsupported(const cfg_reader *r)
{
    int tok = value_of(r, 0, "model_type");
    if (tok < 0) {
        return zt_error_set(r->err, ZT_ERR_CONFIG,
                            "%s: \"model_type\" is missing; zt imports LLaMA models, whose "
                            "config.json has \"model_type\": \"llama\"",
                            r->origin);
    }
    if (!string_is(r, tok, "llama")) {
        return refuse(r, tok, "model_type must be \"llama\": zt implements the LLaMA architecture "
                              "only (Mistral, Qwen and others differ in details that change the "
                              "results)");
    }
    tok = value_of(r, 0, "architectures");
    if (tok >= 0) {
        if (r->j->tok[tok].type != ZT_JSON_ARRAY) {
            return bad_value(r, tok, "architectures", "a list of class names");
        }
        int found = r->j->tok[tok].size == 0;
        for (int i = 0, item = tok + 1; i < r->j->tok[tok].size; i++, item = zt_json_skip(r->j, item))
            found |= string_is(r, item, "LlamaForCausalLM");
        if (!found) {
            return refuse(r, tok, "architectures does not include \"LlamaForCausalLM\": zt trains "
                                  "and exports causal language models only");
        }
    }
    tok = value_of(r, 0, "hidden_act");
    if (tok >= 0 && !string_is(r, tok, "silu")) {
        return refuse(r, tok, "hidden_act must be \"silu\" (LLaMA's SwiGLU MLP); zt implements no "
                              "other activation");
    }
    const char *biases[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) {
        int32_t on = 0;
        zt_status st = read_bool(r, 0, biases[i], &on);
        if (!is_ok_or_absent(st)) return st;
        if (on) {
            char what[160];
            snprintf(what, sizeof what,
                     "%s is true: zt's LLaMA has no bias vectors, so these weights cannot be "
                     "trained faithfully",
                     biases[i]);
            return refuse(r, zt_json_object_get(r->j, 0, biases[i]), what);
        }
    }
    tok = value_of(r, 0, "attention_dropout");
    if (tok >= 0 && (!zt_json_is_number(r->j, tok) || zt_json_get_number(r->j, tok) != 0.0)) {
        return refuse(r, tok, "attention_dropout must be 0: zt does not implement attention "
                              "dropout, so training would differ from transformers");
    }
    tok = value_of(r, 0, "quantization_config");
    if (tok >= 0) {
        return refuse(r, tok, "quantization_config is present: zt reads F32, BF16 and F16 weights, "
                              "not quantized ones; use the unquantized model");
    }
    return ZT_OK;
}

static void warn_unknown_keys(const cfg_reader *r)
{
    char list[1024] = "";
    size_t used = 0;
    int n_unknown = 0, k = 1;
    for (int m = 0; m < r->j->tok[0].size; m++, k = zt_json_skip(r->j, k)) {
        if (in_list(handled_keys, r->j, k) || in_list(zt_hf_informational_keys, r->j, k)) continue;
        n_unknown++;
        const zt_json_tok *t = &r->j->tok[k];
        if (used < sizeof list - 80) {
            used += (size_t)snprintf(list + used, sizeof list - used, "%s\"%.*s\"", used ? ", " : "",
                                     t->end - t->start > 60 ? 60 : t->end - t->start,
                                     r->j->text + t->start);
        }
    }
    if (n_unknown) {
        zt_log(ZT_LOG_WARN,
               "%s: ignoring %d key(s) zt does not know: %s. If one of them changes the model's "
               "math, zt's results will differ from transformers",
               r->origin, n_unknown, list);
    }
}

zt_status zt_hf_config_parse(const char *text, size_t len, const char *origin, zt_hf_config *out,
                             zt_error *err)
{
    zt_hf_config c;
    zt_hf_config_defaults(&c);
    zt_json j;
    zt_status st = zt_json_parse(text, len, origin, &j, err);
    if (st != ZT_OK) return st;
    cfg_reader r = {&j, origin, err};
    if (j.tok[0].type != ZT_JSON_OBJECT) {
        zt_json_free(&j);
        return zt_error_set(err, ZT_ERR_CONFIG, "%s: config.json must be a JSON object", origin);
    }
    st = refuse_unsupported(&r);
    if (st == ZT_OK) st = require_int(&r, 0, "hidden_size", &c.hidden_size);
    if (st == ZT_OK) st = require_int(&r, 0, "intermediate_size", &c.intermediate_size);
    if (st == ZT_OK) st = require_int(&r, 0, "num_hidden_layers", &c.num_hidden_layers);
    if (st == ZT_OK) st = require_int(&r, 0, "num_attention_heads", &c.num_attention_heads);
    if (st == ZT_OK) st = require_int(&r, 0, "vocab_size", &c.vocab_size);
    if (st == ZT_OK) {
        c.num_key_value_heads = c.num_attention_heads;
        st = read_int(&r, 0, "num_key_value_heads", 1, &c.num_key_value_heads);
    }
    if (is_ok_or_absent(st)) {
        c.head_dim = c.hidden_size / c.num_attention_heads;
        st = read_int(&r, 0, "head_dim", 1, &c.head_dim);
        if (st == ZT_ERR_NOT_FOUND && c.hidden_size % c.num_attention_heads != 0) {
            st = zt_error_set(err, ZT_ERR_CONFIG,
                              "%s: hidden_size %" PRId64 " is not a multiple of "
                              "num_attention_heads %" PRId64 " and no head_dim is given",
                              origin, c.hidden_size, c.num_attention_heads);
        }
    }
    if (is_ok_or_absent(st)) st = read_int(&r, 0, "max_position_embeddings", 1, &c.max_position_embeddings);
    if (is_ok_or_absent(st)) st = read_positive_float(&r, 0, "rms_norm_eps", &c.rms_norm_eps);
    if (is_ok_or_absent(st)) st = read_positive_float(&r, 0, "rope_theta", &c.rope_theta);
    if (is_ok_or_absent(st)) st = read_positive_float(&r, 0, "initializer_range", &c.initializer_range);
    if (is_ok_or_absent(st)) st = read_bool(&r, 0, "tie_word_embeddings", &c.tie_word_embeddings);
    const char *rope_keys[] = {"rope_scaling", "rope_parameters"};
    for (int i = 0; i < 2 && is_ok_or_absent(st); i++) {
        int tok = value_of(&r, 0, rope_keys[i]);
        st = tok >= 0 ? read_rope(&r, tok, rope_keys[i], &c) : ZT_OK;
    }
    if (is_ok_or_absent(st)) st = read_token_ids(&r, &c);
    for (int i = 0; i < 2 && is_ok_or_absent(st); i++) {
        int tok = value_of(&r, 0, i == 0 ? "torch_dtype" : "dtype");
        if (tok < 0) continue;
        c.dtype = string_is(&r, tok, "float32")    ? ZT_ST_F32
                : string_is(&r, tok, "bfloat16") ? ZT_ST_BF16
                : string_is(&r, tok, "float16")  ? ZT_ST_F16
                                                 : -1;
    }
    if (is_ok_or_absent(st) && c.num_attention_heads % c.num_key_value_heads != 0) {
        st = zt_error_set(err, ZT_ERR_CONFIG,
                          "%s: num_attention_heads %" PRId64 " is not a multiple of "
                          "num_key_value_heads %" PRId64 " (grouped-query attention shares each "
                          "key/value head among a whole number of query heads)",
                          origin, c.num_attention_heads, c.num_key_value_heads);
    }
    if (is_ok_or_absent(st)) {
        warn_unknown_keys(&r);
        st = ZT_OK;
        *out = c;
    }
    zt_json_free(&j);
    return st;
}

zt_status zt_hf_config_load(const char *path, zt_hf_config *out, zt_error *err)
{
    char *text;
    size_t len;
    zt_status st = zt_read_file(path, &text, &len, err);
    if (st != ZT_OK) return st;
    st = zt_hf_config_parse(text, len, path, out, err);
    free(text);
    return st;
}

/* As Python writes a float: "10000.0", "1e-05": the shortest decimal that reads back as exactly v,
 * never a bare integer (json.load would make that an int; transformers expects floats here). */
static void write_double(FILE *m, double v)
{
    if (v == floor(v) && fabs(v) < 1e16) {
        fprintf(m, "%.1f", v);
        return;
    }
    char buf[40];
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    fputs(buf, m);
}

zt_status zt_hf_config_write(const char *path, const zt_hf_config *c, zt_error *err)
{
    /* Never export what import refuses: a special token id past the vocabulary. */
    int64_t ids[2 + ZT_HF_MAX_EOS] = {c->bos_token_id, c->pad_token_id};
    const char *names[2 + ZT_HF_MAX_EOS] = {"bos_token_id", "pad_token_id"};
    int n_ids = 2;
    for (int i = 0; i < c->n_eos && i < ZT_HF_MAX_EOS; i++, n_ids++) {
        ids[n_ids] = c->eos_token_ids[i];
        names[n_ids] = "eos_token_id";
    }
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= c->vocab_size)
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "%s: %s %" PRId64 " is not below vocab_size %" PRId64 ": the model would name a "
                                "token it does not have",
                                path, names[i], ids[i], c->vocab_size);
    const char *dtype = zt_st_dtype_torch_name(c->dtype < 0 ? ZT_ST_F32 : c->dtype);
    if (!dtype) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "%s: dtype %s cannot be a model's torch_dtype",
                            path, zt_st_dtype_name(c->dtype));
    }
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", path);
    fprintf(m, "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n");
    fprintf(m, "  \"hidden_size\": %" PRId64 ",\n  \"intermediate_size\": %" PRId64 ",\n",
            c->hidden_size, c->intermediate_size);
    fprintf(m, "  \"num_hidden_layers\": %" PRId64 ",\n  \"num_attention_heads\": %" PRId64 ",\n",
            c->num_hidden_layers, c->num_attention_heads);
    fprintf(m, "  \"num_key_value_heads\": %" PRId64 ",\n  \"head_dim\": %" PRId64 ",\n",
            c->num_key_value_heads, c->head_dim);
    fprintf(m, "  \"vocab_size\": %" PRId64 ",\n  \"max_position_embeddings\": %" PRId64 ",\n",
            c->vocab_size, c->max_position_embeddings);
    fputs("  \"rms_norm_eps\": ", m);
    write_double(m, c->rms_norm_eps);
    fputs(",\n  \"rope_theta\": ", m);
    write_double(m, c->rope_theta);
    fputs(",\n  \"rope_scaling\": ", m);
    if (c->rope_llama3) {
        fputs("{\n    \"rope_type\": \"llama3\",\n    \"factor\": ", m);
        write_double(m, c->rope_factor);
        fputs(",\n    \"low_freq_factor\": ", m);
        write_double(m, c->rope_low_freq_factor);
        fputs(",\n    \"high_freq_factor\": ", m);
        write_double(m, c->rope_high_freq_factor);
        fprintf(m, ",\n    \"original_max_position_embeddings\": %" PRId64 "\n  }",
                c->rope_original_max_position_embeddings);
    } else {
        fputs("null", m);
    }
    fprintf(m, ",\n  \"tie_word_embeddings\": %s,\n", c->tie_word_embeddings ? "true" : "false");
    fputs("  \"hidden_act\": \"silu\",\n  \"attention_bias\": false,\n  \"mlp_bias\": false,\n"
          "  \"attention_dropout\": 0.0,\n  \"initializer_range\": ",
          m);
    write_double(m, c->initializer_range);
    fputs(",\n  \"bos_token_id\": ", m);
    if (c->bos_token_id >= 0) fprintf(m, "%" PRId64, c->bos_token_id);
    else fputs("null", m);
    fputs(",\n  \"eos_token_id\": ", m);
    if (c->n_eos == 0) fputs("null", m);
    if (c->n_eos == 1) fprintf(m, "%" PRId64, c->eos_token_ids[0]);
    for (int i = 0; c->n_eos > 1 && i < c->n_eos; i++) {
        fprintf(m, "%s%" PRId64 "%s", i ? ", " : "[", c->eos_token_ids[i], i + 1 == c->n_eos ? "]" : "");
    }
    fputs(",\n  \"pad_token_id\": ", m);
    if (c->pad_token_id >= 0) fprintf(m, "%" PRId64, c->pad_token_id);
    else fputs("null", m);
    fprintf(m, ",\n  \"torch_dtype\": \"%s\",\n  \"use_cache\": true\n}\n", dtype);
    if (fclose(m) != 0 || !text) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", path);
    }
    zt_status st = zt_atomic_write(path, text, len, err);
    free(text);
    return st;
}

/* ---- the tensors of a LLaMA model ------------------------------------------------------------ */

#define HF_NAME_MAX 96 /* "model.layers.<n>.self_attn.q_proj.weight" and the like */

void zt_hf_tensor_list_free(zt_hf_tensor_list *l)
{
    free(l->specs);
    free(l->names);
    memset(l, 0, sizeof *l);
}

zt_status zt_hf_llama_tensors(const zt_hf_config *c, int dtype, zt_hf_tensor_list *out,
                              zt_error *err)
{
    memset(out, 0, sizeof *out);
    size_t cap = 3 + 9 * (size_t)c->num_hidden_layers;
    out->specs = calloc(cap, sizeof *out->specs);
    out->names = calloc(cap, HF_NAME_MAX);
    if (!out->specs || !out->names) {
        zt_hf_tensor_list_free(out);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory listing %zu tensors", cap);
    }
    const int64_t hidden = c->hidden_size, q_out = c->num_attention_heads * c->head_dim;
    const int64_t kv_out = c->num_key_value_heads * c->head_dim, inter = c->intermediate_size;
#define ADD(rows, cols, ...)                                                                      \
    do {                                                                                          \
        zt_st_tensor_spec *s = &out->specs[out->n];                                               \
        char *name = out->names + out->n * HF_NAME_MAX;                                           \
        snprintf(name, HF_NAME_MAX, __VA_ARGS__);                                                 \
        *s = (zt_st_tensor_spec){name, dtype, (cols) ? 2 : 1, {rows, cols}};                      \
        out->n++;                                                                                 \
    } while (0)
    ADD(c->vocab_size, hidden, "model.embed_tokens.weight");
    /* The order of transformers' state_dict, so exported files list tensors as HF's do. */
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        ADD(q_out, hidden, "model.layers.%" PRId64 ".self_attn.q_proj.weight", l);
        ADD(kv_out, hidden, "model.layers.%" PRId64 ".self_attn.k_proj.weight", l);
        ADD(kv_out, hidden, "model.layers.%" PRId64 ".self_attn.v_proj.weight", l);
        ADD(hidden, q_out, "model.layers.%" PRId64 ".self_attn.o_proj.weight", l);
        ADD(inter, hidden, "model.layers.%" PRId64 ".mlp.gate_proj.weight", l);
        ADD(inter, hidden, "model.layers.%" PRId64 ".mlp.up_proj.weight", l);
        ADD(hidden, inter, "model.layers.%" PRId64 ".mlp.down_proj.weight", l);
        ADD(hidden, 0, "model.layers.%" PRId64 ".input_layernorm.weight", l);
        ADD(hidden, 0, "model.layers.%" PRId64 ".post_attention_layernorm.weight", l);
    }
    ADD(hidden, 0, "model.norm.weight");
    if (!c->tie_word_embeddings) ADD(c->vocab_size, hidden, "lm_head.weight");
#undef ADD
    return ZT_OK;
}

/* ---- import ---------------------------------------------------------------------------------- */

struct zt_hf_model {
    char *dir;
    zt_hf_config config;
    zt_st_set *weights;
};

void zt_hf_model_close(zt_hf_model *m)
{
    if (!m) return;
    zt_st_set_close(m->weights);
    free(m->dir);
    free(m);
}

const zt_hf_config *zt_hf_model_config(const zt_hf_model *m) { return &m->config; }
const zt_st_set *zt_hf_model_weights(const zt_hf_model *m) { return m->weights; }

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && used < cap; d++) {
        used += (size_t)snprintf(buf + used, cap - used, "%s%" PRId64, d ? ", " : "", shape[d]);
    }
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

static int same_shape(const zt_st_tensor *t, int ndim, const int64_t *shape)
{
    if (t->ndim != ndim) return 0;
    for (int d = 0; d < ndim; d++) {
        if (t->shape[d] != shape[d]) return 0;
    }
    return 1;
}

/* zt_edit_distance; names of 256 bytes or more (a hostile file's) are far from everything. */
static size_t edit_distance(const char *a, const char *b)
{
    if (strlen(b) >= 256) return (size_t)-1;
    return (size_t)zt_edit_distance(a, b);
}

/* Append the (up to) three names of the set nearest to `name`. */
static void append_nearest(zt_error *err, const zt_st_set *set, const char *name)
{
    const char *best[3] = {NULL, NULL, NULL};
    size_t best_d[3] = {(size_t)-1, (size_t)-1, (size_t)-1};
    for (size_t i = 0; i < zt_st_set_count(set); i++) {
        const char *candidate = zt_st_set_at(set, i, NULL)->name;
        size_t d = edit_distance(name, candidate);
        for (int k = 0; k < 3; k++) {
            if (d < best_d[k]) {
                for (int s = 2; s > k; s--) {
                    best[s] = best[s - 1];
                    best_d[s] = best_d[s - 1];
                }
                best[k] = candidate;
                best_d[k] = d;
                break;
            }
        }
    }
    if (!best[0]) return;
    zt_error_append(err, "; nearest names there:");
    for (int k = 0; k < 3 && best[k]; k++) zt_error_append(err, "%s '%s'", k ? "," : "", best[k]);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The weights are exactly the tensors of a LLaMA with this config. */
static zt_status check_weights(const zt_hf_model *m, zt_error *err)
{
    zt_hf_tensor_list expected;
    zt_status st = zt_hf_llama_tensors(&m->config, ZT_ST_F32, &expected, err);
    if (st != ZT_OK) return st;
    char *config_path = NULL;
    if (asprintf(&config_path, "%s/config.json", m->dir) < 0) config_path = NULL;
    const char *cfg_name = config_path ? config_path : "config.json";
    for (size_t i = 0; i < expected.n && st == ZT_OK; i++) {
        const zt_st_tensor_spec *e = &expected.specs[i];
        const zt_st_file *file;
        const zt_st_tensor *t = zt_st_set_find(m->weights, e->name, &file);
        char want[96], have[96];
        if (!t) {
            st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                              "%s: the weights have no tensor '%s', which a LLaMA with %s "
                              "(num_hidden_layers %" PRId64 ", tie_word_embeddings %s) needs",
                              m->dir, e->name, cfg_name, m->config.num_hidden_layers,
                              m->config.tie_word_embeddings ? "true" : "false");
            append_nearest(err, m->weights, e->name);
            if (strcmp(e->name, "lm_head.weight") == 0) {
                zt_error_append(err, ". If the model shares its embeddings with the output layer, "
                                     "config.json should say \"tie_word_embeddings\": true");
            }
        } else if (!same_shape(t, e->ndim, e->shape)) {
            format_shape(want, sizeof want, e->ndim, e->shape);
            format_shape(have, sizeof have, t->ndim, t->shape);
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s: tensor '%s' has shape %s, but %s implies %s: the weights and "
                              "config.json do not belong together",
                              zt_st_path(file), e->name, have, cfg_name, want);
        } else if (t->dtype != ZT_ST_F32 && t->dtype != ZT_ST_BF16 && t->dtype != ZT_ST_F16) {
            st = zt_error_set(err, ZT_ERR_UNSUPPORTED,
                              "%s: tensor '%s' has dtype %s; zt imports F32, BF16 and F16 weights",
                              zt_st_path(file), e->name, zt_st_dtype_name(t->dtype));
        }
    }
    /* Anything else would be silently dropped: refuse it, except what transformers drops too. */
    size_t n_extra = 0;
    for (size_t i = 0; i < zt_st_set_count(m->weights) && st == ZT_OK; i++) {
        const char *name = zt_st_set_at(m->weights, i, NULL)->name;
        int known = ends_with(name, ".rotary_emb.inv_freq") ||
                    (m->config.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0);
        for (size_t k = 0; k < expected.n && !known; k++) known = !strcmp(expected.specs[k].name, name);
        if (known) continue;
        if (n_extra == 0) {
            zt_error_set(err, ZT_ERR_FORMAT,
                         "%s: the weights have tensors a LLaMA with %s does not (check "
                         "num_hidden_layers and the model type there):",
                         m->dir, cfg_name);
        }
        if (n_extra < 10) zt_error_append(err, " '%s'", name);
        n_extra++;
    }
    if (n_extra > 10) zt_error_append(err, " and %zu more", n_extra - 10);
    if (n_extra) st = ZT_ERR_FORMAT;
    free(config_path);
    zt_hf_tensor_list_free(&expected);
    return st;
}

zt_status zt_hf_model_open(const char *dir, zt_hf_model **out, zt_error *err)
{
    *out = NULL;
    zt_hf_model *m = calloc(1, sizeof *m);
    char *config_path = NULL;
    if (!m || !(m->dir = strdup(dir)) || asprintf(&config_path, "%s/config.json", dir) < 0) {
        free(m ? m->dir : NULL);
        free(m);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening '%s'", dir);
    }
    zt_status st = zt_hf_config_load(config_path, &m->config, err);
    free(config_path);
    if (st == ZT_OK) st = zt_st_set_open(dir, &m->weights, err);
    if (st == ZT_OK) st = check_weights(m, err);
    if (st != ZT_OK) {
        zt_hf_model_close(m);
        return st;
    }
    *out = m;
    return ZT_OK;
}

zt_status zt_hf_model_read(const zt_hf_model *m, const char *name, int ndim, const int64_t *shape,
                           uint64_t elem_offset, uint64_t count, float *dst, zt_error *err)
{
    /* Tied: the output layer IS the embedding matrix, as in transformers, even when a file also
     * carries an lm_head.weight (transformers ignores that copy too). */
    if (m->config.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0) {
        name = "model.embed_tokens.weight";
    }
    const zt_st_file *file;
    const zt_st_tensor *t = zt_st_set_find(m->weights, name, &file);
    if (!t) {
        zt_error_set(err, ZT_ERR_NOT_FOUND, "%s: no tensor '%s' in the weights", m->dir, name);
        append_nearest(err, m->weights, name);
        return ZT_ERR_NOT_FOUND;
    }
    if (!same_shape(t, ndim, shape)) {
        char want[96], have[96];
        format_shape(want, sizeof want, ndim, shape);
        format_shape(have, sizeof have, t->ndim, t->shape);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor '%s' has shape %s, this run's model expects %s: the model "
                            "config does not match this checkpoint's config.json",
                            zt_st_path(file), name, have, want);
    }
    zt_status st = zt_st_read_f32(file, t, elem_offset, count, dst, err);
    int64_t bad = st == ZT_OK ? zt_st_find_nonfinite(dst, count) : -1;
    if (bad < 0) return st;
    uint64_t e = elem_offset + (uint64_t)bad;
    char at[64] = "";
    if (ndim == 2) snprintf(at, sizeof at, " (row %" PRIu64 ", column %" PRIu64 ")", e / (uint64_t)shape[1], e % (uint64_t)shape[1]);
    return zt_error_set(err, ZT_ERR_FORMAT,
                        "%s: tensor '%s' holds %s at element %" PRIu64 "%s: the model's weights are not all finite "
                        "numbers, so every loss and gradient would be too (training would skip every step); the "
                        "file is damaged, or the model was saved after its training diverged: use an intact copy",
                        zt_st_path(file), name, zt_st_nonfinite_name(dst[bad]), e, at);
}

/* ---- export ---------------------------------------------------------------------------------- */

/* tensors is exactly the LLaMA list of c, one dtype throughout. */
static zt_status check_export_tensors(const char *dir, const zt_hf_config *c,
                                      const zt_st_tensor_spec *tensors, size_t n, zt_error *err)
{
    zt_hf_tensor_list expected;
    zt_status st = zt_hf_llama_tensors(c, tensors[0].dtype, &expected, err);
    if (st != ZT_OK) return st;
    if (n != expected.n) {
        st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                          "export to %s: %zu tensors given, a LLaMA with %" PRId64 " layers%s has "
                          "%zu",
                          dir, n, c->num_hidden_layers,
                          c->tie_word_embeddings ? " and tied embeddings" : "", expected.n);
    }
    for (size_t i = 0; i < n && st == ZT_OK; i++) {
        const zt_st_tensor_spec *e = NULL;
        for (size_t k = 0; k < expected.n && !e; k++) {
            if (strcmp(expected.specs[k].name, tensors[i].name) == 0) e = &expected.specs[k];
        }
        int same = e && e->ndim == tensors[i].ndim;
        for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == tensors[i].shape[d];
        if (!e) {
            st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                              "export to %s: tensor '%s' is not part of a LLaMA model", dir,
                              tensors[i].name);
        } else if (!same) {
            char want[96], have[96];
            format_shape(want, sizeof want, e->ndim, e->shape);
            format_shape(have, sizeof have, tensors[i].ndim, tensors[i].shape);
            st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                              "export to %s: tensor '%s' has shape %s, the config implies %s", dir,
                              tensors[i].name, have, want);
        } else if (tensors[i].dtype != tensors[0].dtype) {
            st = zt_error_set(err, ZT_ERR_INVALID_ARG,
                              "export to %s: tensor '%s' is %s but '%s' is %s; a transformers "
                              "model has one torch_dtype",
                              dir, tensors[i].name, zt_st_dtype_name(tensors[i].dtype),
                              tensors[0].name, zt_st_dtype_name(tensors[0].dtype));
        }
    }
    zt_hf_tensor_list_free(&expected);
    return st;
}

zt_status zt_hf_export(const char *dir, const zt_hf_config *c, const zt_st_tensor_spec *tensors,
                       size_t n, zt_st_fill_fn fill, void *ctx, uint64_t max_shard_bytes,
                       zt_error *err)
{
    if (n == 0) return zt_error_set(err, ZT_ERR_INVALID_ARG, "export to %s: no tensors given", dir);
    zt_status st = check_export_tensors(dir, c, tensors, n, err);
    if (st != ZT_OK) return st;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        return zt_error_set(err, ZT_ERR_IO, "cannot create the export directory '%s': %s", dir,
                            strerror(errno));
    }
    st = zt_st_write_model(dir, tensors, n, fill, ctx, max_shard_bytes, err);
    if (st != ZT_OK) return st;
    zt_hf_config written = *c;
    written.dtype = tensors[0].dtype;
    char *path = NULL;
    if (asprintf(&path, "%s/config.json", dir) < 0) {
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory exporting to '%s'", dir);
    }
    st = zt_hf_config_write(path, &written, err);
    free(path);
    return st;
}

typedef struct checkpoint_fill {
    zt_ckpt *ckpt;
    const zt_st_tensor_spec *specs;
} checkpoint_fill;

static zt_status fill_from_checkpoint(void *ctx, size_t index, uint64_t elem_offset,
                                      uint64_t count, float *dst, zt_error *err)
{
    const checkpoint_fill *f = ctx;
    return zt_ckpt_read(f->ckpt, f->specs[index].name, ZT_CKPT_GROUP_PARAM, (int64_t)elem_offset,
                        (int64_t)count, dst, err);
}

zt_status zt_hf_export_checkpoint(const char *dir, const zt_hf_config *c, zt_ckpt *ckpt, int dtype,
                                  uint64_t max_shard_bytes, zt_error *err)
{
    zt_hf_tensor_list list;
    zt_status st = zt_hf_llama_tensors(c, dtype, &list, err);
    for (size_t i = 0; i < list.n && st == ZT_OK; i++) {
        const zt_st_tensor_spec *s = &list.specs[i];
        const zt_ckpt_tensor_info *t = zt_ckpt_find(ckpt, s->name, ZT_CKPT_GROUP_PARAM);
        int same = t && t->ndim == s->ndim;
        for (int d = 0; same && d < s->ndim; d++) same = t->shape[d] == s->shape[d];
        if (!same) {
            char want[96], have[96] = "";
            format_shape(want, sizeof want, s->ndim, s->shape);
            if (t) format_shape(have, sizeof have, t->ndim, t->shape);
            st = zt_error_set(err, ZT_ERR_CONFIG,
                              "export to %s: the checkpoint %s '%s'%s%s, but the HF config implies "
                              "%s: export with the config of the model the checkpoint was saved "
                              "from",
                              dir, t ? "has tensor" : "has no tensor", s->name,
                              t ? " of shape " : "", have, want);
        }
    }
    if (st == ZT_OK) {
        checkpoint_fill ctx = {ckpt, list.specs};
        st = zt_hf_export(dir, c, list.specs, list.n, fill_from_checkpoint, &ctx, max_shard_bytes,
                          err);
    }
    zt_hf_tensor_list_free(&list);
    return st;
}
