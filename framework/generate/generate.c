/* zt-run --generate (generate.h): the command line's numbers, streaming the text, and the whole run.
 * Where the model, template and tokenizer come from and the tokenizer itself are in sources.c, the
 * model against its KV cache in decode.c, the sampler in sampler.c (generate_internal.h). */
#define _GNU_SOURCE /* memmem, strdup */
#include "generate/generate_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "config/settings.h"
#include "host/adapter.h"
#include "host/select.h"
#include "state/model_config.h"
#include "state/peft_adapter.h"

#define DEFAULT_MAX_NEW_TOKENS 128
#define MAX_NEW_TOKENS_LIMIT 1000000
#define MAX_TEMPERATURE 100.0

/* ---- the command line's numbers --------------------------------------------------------------- */

static zt_status usage(zt_error *err, const char *fmt, ...) ZT_PRINTF(2, 3);
static zt_status usage(zt_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zt_error_setv(err, ZT_ERR_INVALID_ARG, fmt, ap);
    va_end(ap);
    return ZT_ERR_INVALID_ARG;
}

/* A number in [lo, hi] ((lo, hi] when lo_open); `expected` completes "expected ..." in the message. */
static zt_status parse_number(const char *option, const char *text, double lo, double hi, int lo_open,
                              const char *expected, double *out, zt_error *err)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!*text || *end || errno || !isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo))
        return usage(err, "%s '%s': expected %s", option, text, expected);
    *out = v;
    return ZT_OK;
}

static zt_status parse_count(const char *option, const char *text, uint64_t lo, uint64_t hi, const char *meaning,
                             uint64_t *out, zt_error *err)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (!*text || *end || errno || text[0] == '-' || text[0] == '+' || v < lo || v > hi)
        return usage(err, "%s '%s': expected %s, a whole number from %llu to %llu", option, text, meaning,
                     (unsigned long long)lo, (unsigned long long)hi);
    *out = (uint64_t)v;
    return ZT_OK;
}

zt_status zt_generate_check(const zt_generate_options *o, zt_generate_settings *s, zt_error *err)
{
    memset(s, 0, sizeof *s);
    s->max_new_tokens = DEFAULT_MAX_NEW_TOKENS;
    s->top_p = 1.0;
    if (!o->model && !o->resume)
        return usage(err, "--generate needs weights: --model DIR (a Hugging Face LLaMA directory) or "
                          "--model FILE.bin (a llama2.c model), or --resume CHECKPOINT (a zt checkpoint)");
    if (o->model && o->resume)
        return usage(err, "--model and --resume both give the weights to generate with; give one of them");
    if (o->adapter && !o->model)
        return usage(err, "--adapter %s: a checkpoint (--resume) holds its adapter already; leave --adapter "
                          "out, or give the base model it goes on with --model BASE", o->adapter);
    if (o->prompts) {
        const char *other = o->prompt ? "--prompt" : o->prompt_ids ? "--prompt-ids" : o->input ? "--input"
                          : o->print_ids ? "--print-ids" : NULL;
        if (other)
            return usage(err, "%s has no effect with --prompts, whose records give the prompts (and --output gets "
                              "the answers); remove it", other);
        if (!o->output)
            return usage(err, "--prompts needs --output FILE.jsonl, where the answers go (one JSON line per record)");
    } else if (o->output) {
        return usage(err, "--output goes with --prompts FILE (the records to answer)");
    }
    if (!o->prompt && !o->prompt_ids && !o->prompts)
        return usage(err, "--generate needs a prompt: --prompt TEXT (an instruction; with --raw, text to "
                          "continue) or --prompt-ids ID,ID,... (token ids used as they are)");
    if (o->prompt && o->prompt_ids)
        return usage(err, "--prompt and --prompt-ids both give the prompt; give one of them");
    if (o->prompt_ids) {
        const char *ignored = o->input ? "--input" : o->template_name ? "--template" : o->raw ? "--raw" : NULL;
        if (ignored)
            return usage(err, "%s has no effect with --prompt-ids, which gives the exact tokens (no template, no "
                              "BOS added); remove it, or give the text with --prompt",
                         ignored);
    }
    if (o->raw && o->template_name)
        return usage(err, "--raw (no template) and --template contradict each other; give one of them");
    if (o->raw && o->input)
        return usage(err, "--input fills the template's input field, and --raw uses no template; put the whole "
                          "text into --prompt instead");
    uint64_t n = 0;
    zt_status st = ZT_OK;
    if (o->max_new_tokens) {
        st = parse_count("--max-new-tokens", o->max_new_tokens, 1, MAX_NEW_TOKENS_LIMIT,
                         "how many tokens to generate at most", &n, err);
        s->max_new_tokens = (int64_t)n;
    }
    if (st == ZT_OK && o->temperature)
        st = parse_number("--temperature", o->temperature, 0, MAX_TEMPERATURE, 0,
                          "a number from 0 (greedy decoding) to 100", &s->temperature, err);
    if (st == ZT_OK && o->top_k) {
        st = parse_count("--top-k", o->top_k, 0, INT32_MAX,
                         "how many of the most likely tokens to sample from (0: all of them)", &n, err);
        s->top_k = (int32_t)n;
    }
    if (st == ZT_OK && o->n_stops && o->print_ids)
        st = usage(err, "--stop ends the answer's text, and --print-ids writes ids: give one of them");
    if (st == ZT_OK && o->n_stops > MAX_STOP_TEXTS)
        st = usage(err, "--stop is given %d times; at most %d stop texts are supported", o->n_stops, MAX_STOP_TEXTS);
    for (int i = 0; st == ZT_OK && i < o->n_stops; i++) {
        size_t len = strlen(o->stops[i]);
        if (len == 0)
            st = usage(err, "--stop '': a stop text needs at least one character (the answer ends before it)");
        else if (len > MAX_STOP_TEXT_BYTES)
            st = usage(err, "--stop '%.40s...': %zu bytes, longer than the %d a stop text may have", o->stops[i], len,
                       MAX_STOP_TEXT_BYTES);
    }
    if (st == ZT_OK && o->top_p)
        st = parse_number("--top-p", o->top_p, 0, 1, 1,
                          "the probability mass to sample from, a number above 0 and at most 1", &s->top_p, err);
    if (st == ZT_OK && o->seed) {
        st = parse_count("--seed", o->seed, 0, UINT64_MAX, "the sampling seed", &s->seed, err);
        s->seed_given = 1;
    }
    return st;
}

/* "1,22,333" (spaces allowed around the commas). */
static zt_status parse_prompt_ids(const char *text, int32_t vocab, int32_t **ids_out, int32_t *n_out, zt_error *err)
{
    size_t cap = 1;
    for (const char *p = text; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading --prompt-ids");
    int32_t n = 0;
    for (const char *p = text;;) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        const char *after = end;
        while (*after == ' ') after++;
        if (end == p || errno || (*after && *after != ',') || v < 0 || v >= vocab) {
            free(ids);
            if (end == p || errno || (*after && *after != ','))
                return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                    "--prompt-ids '%s': entry %d is not a whole number; give token ids separated "
                                    "by commas, e.g. --prompt-ids 1,450,4996",
                                    text, (int)n + 1);
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--prompt-ids: id %ld (entry %d) is outside the model's vocabulary [0, %d)", v,
                                (int)n + 1, (int)vocab);
        }
        ids[n++] = (int32_t)v;
        if (!*after) break;
        p = after + 1;
    }
    *ids_out = ids;
    *n_out = n;
    return ZT_OK;
}

/* ---- streaming the text ----------------------------------------------------------------------- */

/* Text is decoded from all ids so far each time (a piece's text can depend on its neighbours: the
 * leading space of the first piece, a character split into byte pieces) and the part not yet
 * written is written, except for what may still change: an unfinished UTF-8 character (raw bytes,
 * or U+FFFD from a decoder) and a possible beginning of the stop text. */
typedef struct text_stream {
    size_t written;
    size_t answer_from; /* where the generated text begins (after a --raw prompt's): stop texts are searched from here */
    int stopped;        /* a stop text (gen_run.stop_texts) was found */
} text_stream;

/* Bytes at the end of s[0, n) that may still change: U+FFFD replacements, and a multi-byte UTF-8
 * character with fewer continuation bytes than its lead byte announces. */
static size_t unsettled_tail(const char *s, size_t n)
{
    size_t end = n;
    while (end >= 3 && memcmp(s + end - 3, "\xEF\xBF\xBD", 3) == 0) end -= 3;
    size_t lead = end; /* back over continuation bytes to the lead byte */
    while (lead > 0 && end - lead < 4 && ((unsigned char)s[lead - 1] & 0xC0) == 0x80) lead--;
    if (lead > 0) {
        unsigned char c = (unsigned char)s[--lead];
        size_t announced = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (end - lead < announced) end = lead;
    }
    return n - end;
}

static zt_status stream_text(gen_run *g, text_stream *ts, int32_t prev, const int32_t *ids, size_t n, int final,
                             zt_error *err)
{
    char *text;
    size_t len;
    zt_status st = gen_tokenizer_decode(&g->tok, prev, ids, n, &text, &len, err);
    if (st != ZT_OK) return st;
    size_t end = gen_stop_text_at(g, NULL, 0, text, ts->answer_from, len);
    if (end < len) {
        ts->stopped = 1;
    } else if (!final) {
        end -= gen_stop_text_tail(g, text, ts->answer_from, len);
        end -= unsettled_tail(text, end);
    }
    if (end > ts->written) {
        fwrite(text + ts->written, 1, end - ts->written, stdout);
        fflush(stdout);
        ts->written = end;
    }
    free(text);
    return ZT_OK;
}

/* ---- the run ---------------------------------------------------------------------------------- */


static void add_stop_id(gen_run *g, int64_t id)
{
    if (id < 0 || g->n_stop_ids == MAX_STOP_IDS) return;
    for (int i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] == id) return;
    g->stop_ids[g->n_stop_ids++] = (int32_t)id;
}

int gen_is_stop_id(const gen_run *g, int32_t id)
{
    for (int i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] == id) return 1;
    return 0;
}

int32_t gen_n_draw(const gen_run *g)
{
    int32_t V = (int32_t)g->model.info->vocab_size;
    return g->have_tok && g->tok.info.vocab_size < V ? (int32_t)g->tok.info.vocab_size : V;
}

size_t gen_stop_text_at(const gen_run *g, char *const *extra, int n_extra, const char *text, size_t from, size_t len)
{
    size_t end = len;
    for (int i = 0; i < g->n_stop_texts + n_extra && from < end; i++) {
        const char *stop = i < g->n_stop_texts ? g->stop_texts[i] : extra[i - g->n_stop_texts];
        const char *hit = memmem(text + from, end - from, stop, strlen(stop));
        if (hit) end = (size_t)(hit - text); /* later texts are searched only before the earliest hit */
    }
    return end;
}

size_t gen_stop_text_tail(const gen_run *g, const char *text, size_t from, size_t len)
{
    size_t longest = 0, room = len > from ? len - from : 0;
    for (int i = 0; i < g->n_stop_texts; i++) {
        const char *stop = g->stop_texts[i];
        for (size_t k = strlen(stop) - 1; k > longest; k--)
            if (k <= room && memcmp(text + len - k, stop, k) == 0) {
                longest = k;
                break;
            }
    }
    return longest;
}

/* The stop texts: the template's answer suffix, then each --stop (checked by zt_generate_check). */
static void collect_stop_texts(gen_run *g)
{
    g->n_stop_texts = 0;
    if (g->have_tpl && g->tpl.answer_suffix[0]) g->stop_texts[g->n_stop_texts++] = g->tpl.answer_suffix;
    for (int i = 0; i < g->o->n_stops && g->n_stop_texts <= MAX_STOP_TEXTS; i++)
        g->stop_texts[g->n_stop_texts++] = g->o->stops[i];
}

static int is_directory(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The config: host keys and --set, then the model's keys from the weights' own config. */
static zt_status configure(gen_run *g, zt_error *err)
{
    const zt_generate_options *o = g->o;
    if (!(g->cfg = zt_config_new())) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    uint32_t n_host = 0;
    const zt_option *host = zt_host_options(&n_host);
    zt_status st = zt_config_add_schema(g->cfg, "host", host, n_host, err);
    for (int i = 0; i < o->n_sets && st == ZT_OK; i++) st = zt_config_set(g->cfg, o->sets[i], err);
    if (st != ZT_OK) return st;
    if (o->resume) {
        st = gen_resolve_checkpoint(o->resume, &g->ckpt_dir, err);
        if (st == ZT_OK) st = zt_ckpt_open(g->ckpt_dir, &g->ckpt, err);
        if (st == ZT_OK) st = gen_checkpoint_config(g->ckpt, g->ckpt_dir, g->cfg, &g->data_path, err);
        if (st != ZT_OK) return st;
    } else if (is_directory(o->model)) {
        st = zt_hf_model_open(o->model, &g->hf, err);
    } else {
        st = zt_l2c_model_open(o->model, &g->l2c, err);
        if (st == ZT_ERR_NOT_FOUND)
            zt_error_append(err, "\n--model takes a Hugging Face LLaMA directory (config.json and safetensors) or "
                                 "a llama2.c model .bin");
    }
    if (st != ZT_OK) return st;
    if (o->data) {
        free(g->data_path);
        if (!(g->data_path = strdup(o->data))) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    }

    if (zt_registry_scan(o->plugin_paths, o->n_plugin_paths, &g->reg, err) != ZT_OK) return err->status;
    int tokenizer_plugin = !o->tokenizer || !gen_is_llama2c_file(o->tokenizer);
    unsigned kinds = (1u << ZT_KIND_MODEL) | (1u << ZT_KIND_ATTENTION);
    if (tokenizer_plugin) kinds |= 1u << ZT_KIND_TOKENIZER;
    st = zt_plugin_set_resolve(g->reg, o->plugins, kinds, g->cfg, &g->set, err);
    for (int k = 1; k <= ZT_KIND_COUNT && st == ZT_OK; k++) {
        const zt_loaded_plugin *lp = &g->set.by_kind[k];
        if (lp->plugin)
            st = zt_config_add_schema(g->cfg, lp->desc.name, lp->plugin->options, lp->plugin->n_options, err);
    }
    if (st == ZT_OK) st = zt_config_validate(g->cfg, err);
    if (st == ZT_OK && g->hf) {
        char path[4200];
        snprintf(path, sizeof path, "%s/config.json", o->model);
        st = zt_model_config_apply(g->cfg, zt_hf_model_config(g->hf), o->model, path, err);
    }
    if (st == ZT_OK && g->l2c)
        st = zt_model_config_apply(g->cfg, zt_l2c_model_config(g->l2c), o->model, o->model, err);
    if (st == ZT_OK && (g->hf || g->l2c)) st = zt_config_validate(g->cfg, err);
    if (st == ZT_OK) st = zt_host_settings_read(g->cfg, &g->settings, err);
    return st;
}

static zt_status start_plugins(gen_run *g, zt_error *err)
{
    zt_runtime_options ro;
    memset(&ro, 0, sizeof ro);
    ro.n_threads = (int)g->settings.threads;
    ro.device_type = ZT_DEVICE_CPU;
    ro.single_process = 1; /* generation is one process, whatever a launcher's environment says */
    zt_status st = ZT_OK;
    /* A GPU only when asked for (device = cuda): with auto, generation stays on the CPU in fp32, whose
     * tokens are exact, where training would pick the GPU. */
    if (g->settings.device == ZT_DEVICE_SETTING_CUDA) {
        st = zt_select_device(&g->settings, &g->set, &ro.device_type, err);
        ro.device_mem_limit = zt_device_pool_limit(&g->settings);
    }
    g->model.on_gpu = ro.device_type == ZT_DEVICE_CUDA;
    g->model.dtype = !g->model.on_gpu ? ZT_F32 : g->settings.fp16 ? ZT_F16 : ZT_BF16;
    g->model.device_sampling = g->settings.generate_device_sampling; /* gen_model_prepare checks the rest */
    g->model.cuda_graphs = g->settings.generate_cuda_graphs;
    g->model.warmup = g->settings.generate_warmup;
    if (st == ZT_OK) st = zt_runtime_create(&ro, g->cfg, &g->rt, err);
    for (int k = 1; k <= ZT_KIND_COUNT && st == ZT_OK; k++)
        if (g->set.by_kind[k].plugin) st = zt_plugin_probe(&g->set.by_kind[k], g->rt, err);
    for (int k = 1; k <= ZT_KIND_COUNT && st == ZT_OK; k++)
        if (g->set.by_kind[k].plugin) st = zt_plugin_init(&g->set.by_kind[k], g->rt, err);
    if (st == ZT_OK) st = zt_plugin_set_attach_adapter(&g->set, err);
    return st;
}

/* --model BASE, and with an adapter plugin the adapter from --adapter DIR (a base has none of its own). */
static zt_status load_hf(gen_run *g, zt_error *err)
{
    const zt_adapter_spec *spec = zt_plugin_set_adapter_spec(&g->set);
    if (!spec && g->o->adapter)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--adapter %s: no adapter plugin is loaded; add one to --plugins (--plugins "
                            "llama,lora) with the adapter's settings (lora.r, lora.lora_alpha, lora.target_modules)",
                            g->o->adapter);
    if (!spec) return gen_model_load_weights(&g->model, gen_read_hf, g->hf, err);
    if (!g->o->adapter)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--plugins has the adapter plugin, but --model %s is a base model without the "
                            "adapter's weights: give them with --adapter DIR (a peft adapter directory, e.g. "
                            "--export-adapter's), or leave the adapter plugin out of --plugins",
                            g->o->model);
    gen_hf_adapter_source src = {g->hf, NULL};
    zt_status st = zt_peft_adapter_open(g->o->adapter, spec, g->model.info, &src.adapter, err);
    if (st == ZT_OK) st = gen_model_load_weights(&g->model, gen_read_hf_adapter, &src, err);
    zt_st_close(src.adapter);
    if (st == ZT_OK) zt_log(ZT_LOG_INFO, "adapter from %s", g->o->adapter);
    return st;
}

static zt_status load_model(gen_run *g, zt_error *err)
{
    gen_model *m = &g->model;
    m->rt = g->rt;
    m->model_lp = &g->set.by_kind[ZT_KIND_MODEL];
    m->attention_lp = &g->set.by_kind[ZT_KIND_ATTENTION];
    m->ops = m->model_lp->plugin->ops;
    m->attention.ops = m->attention_lp->plugin->ops;
    m->attention.state = m->attention_lp->state;
    m->attention.caps = m->attention_lp->plugin->caps;
    m->info = m->ops->info(m->model_lp->state);
    if (!m->info || m->info->n_units < 3)
        return zt_error_set(err, ZT_ERR_INTERNAL, "model plugin '%s' reports no model info (or fewer than 3 units)",
                            m->model_lp->desc.name);
    if (!(m->attention.caps & ZT_CAP_KV_CACHE) || !m->attention.ops->kv_create)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "attention plugin '%s' has no KV cache (no ZT_CAP_KV_CACHE), which generation needs; "
                            "name one that has in --plugins, e.g. naive",
                            m->attention_lp->desc.name);
    zt_status st;
    const char *from = g->o->model;
    if (g->ckpt) {
        static const char *const groups[] = {ZT_CKPT_GROUP_PARAM};
        st = zt_ckpt_check_model(g->ckpt, m->info, groups, 1, err);
        if (st == ZT_OK) st = gen_model_load_weights(m, gen_read_checkpoint, g->ckpt, err);
        from = g->ckpt_dir;
    } else if (g->hf) {
        st = load_hf(g, err);
    } else if (g->o->adapter || zt_plugin_set_has_adapter(&g->set)) {
        st = zt_error_set(err, ZT_ERR_CONFIG, "%s: an adapter goes on a Hugging Face base model directory, "
                          "not a llama2.c .bin; give --model DIR", g->o->model);
    } else {
        st = gen_model_load_weights(m, gen_read_llama2c, g->l2c, err);
    }
    if (st == ZT_OK)
        zt_log(ZT_LOG_INFO, "model: %lld parameters from %s", (long long)m->info->n_parameters, from);
    return st;
}

/* The data set's manifest: from --data (must be readable), else the checkpoint's data.path (read
 * when it is there; its absence matters only if template or tokenizer must come from it). */
static zt_status read_manifest(gen_run *g, zt_error *err)
{
    if (!g->data_path) return ZT_OK;
    zt_status st = gen_manifest_load(g->data_path, &g->manifest, g->o->data ? err : &g->manifest_err);
    if (st == ZT_OK) g->have_manifest = 1;
    else if (!g->o->data)
        zt_error_append(&g->manifest_err, "\n(the checkpoint was trained on data.path %s)", g->data_path);
    return g->o->data ? st : ZT_OK;
}

static zt_status manifest_needed(gen_run *g, const char *what, const char *instead, zt_error *err)
{
    zt_error_set(err, g->manifest_err.status, "%s\n%s would come from that data set's manifest.json; %s",
                 g->manifest_err.msg, what, instead);
    return err->status;
}

static zt_status open_tokenizer(gen_run *g, zt_error *err)
{
    const zt_generate_options *o = g->o;
    const char *path = o->tokenizer, *origin = "-t";
    char hf_tokenizer[4200];
    if (!path && g->have_manifest) {
        path = g->manifest.tokenizer_path;
        origin = "the data set's manifest.json (tokenizer.path)";
    }
    if (!path && g->data_path && !g->have_manifest && (o->prompt || o->prompts))
        return manifest_needed(g, "The tokenizer", "give it with -t FILE", err);
    if (!path && g->hf) {
        snprintf(hf_tokenizer, sizeof hf_tokenizer, "%s/tokenizer.model", o->model);
        if (access(hf_tokenizer, R_OK) == 0) {
            path = hf_tokenizer;
            origin = "the model directory";
        }
    }
    if (!path) {
        if (o->prompt) /* --prompts: its {"prompt_ids": [...]} records need none (text records say so) */
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "--prompt needs a tokenizer to turn the text into tokens, and none is known: give -t "
                                "FILE (the SentencePiece .model the model was trained with, or a llama2.c tokenizer "
                                ".bin), or --data DIR of the data set it was trained on; or give token ids with "
                                "--prompt-ids");
        return ZT_OK; /* ids in, ids out */
    }
    const zt_loaded_plugin *lp = &g->set.by_kind[ZT_KIND_TOKENIZER]; /* loaded unless -t is a llama2.c .bin */
    int32_t model_vocab = g->model.info->vocab_size;
    zt_status st = gen_tokenizer_open(&g->tok, path, lp, model_vocab, err);
    if (st != ZT_OK) {
        if (path != o->tokenizer) /* the user did not name it: say where it came from */
            zt_error_append(err, "\n(the tokenizer %s comes from %s%s; give it with -t FILE)", path, origin,
                            path == g->manifest.tokenizer_path && path[0] != '/'
                                ? ", which records it as given to zt-prep, relative to where zt-prep ran"
                                : "");
        return st;
    }
    g->have_tok = 1;
    const zt_tokenizer_info *ti = &g->tok.info;
    if (ti->vocab_size > model_vocab)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "the tokenizer %s has %d tokens but the model's vocabulary has %d: its ids past %d have "
                            "no embedding. Use the tokenizer the model was trained with",
                            path, (int)ti->vocab_size, (int)model_vocab, (int)model_vocab - 1);
    if (g->have_manifest && !g->tok.l2c && strcmp(lp->desc.name, g->manifest.tokenizer_plugin) != 0)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "the data set %s was tokenized with tokenizer plugin '%s', this run loaded '%s': name "
                            "'%s' in --plugins",
                            g->data_path, g->manifest.tokenizer_plugin, lp->desc.name, g->manifest.tokenizer_plugin);
    if (g->have_manifest && !g->tok.l2c && ti->model_hash != g->manifest.tokenizer_hash)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "the tokenizer %s (hash %016" PRIx64 ") is not the one the data set %s was prepared "
                            "with (%s, hash %016" PRIx64 "): the model would read other ids than it was trained on. "
                            "Give that tokenizer with -t, or leave -t out",
                            path, ti->model_hash, g->data_path, g->manifest.tokenizer_path, g->manifest.tokenizer_hash);
    zt_log(ZT_LOG_INFO, "tokenizer: %s (%s, %d tokens) from %s", path, ti->model_type, (int)ti->vocab_size, origin);
    return ZT_OK;
}

static zt_status load_template(gen_run *g, zt_error *err)
{
    const zt_generate_options *o = g->o;
    if (o->raw || o->prompt_ids) return ZT_OK;
    zt_status st;
    const char *origin;
    if (o->template_name) {
        st = zt_template_load(o->template_name, &g->tpl, err);
        origin = "--template";
    } else if (g->have_manifest) {
        st = gen_template_from_manifest(&g->manifest, &g->tpl, err);
        origin = g->manifest.path;
    } else if (g->data_path) {
        return manifest_needed(g, "The prompt template", "give it with --template NAME|FILE (or --raw for none)",
                               err);
    } else {
        st = zt_template_load("alpaca", &g->tpl, err);
        origin = "zt-prep's default; --template NAME|FILE or --raw to change it";
    }
    if (st != ZT_OK) return st;
    g->have_tpl = 1;
    zt_log(ZT_LOG_INFO, "prompt template: %s (%s)", g->tpl.name, origin);
    return ZT_OK;
}

zt_status gen_encode_prompt(gen_run *g, const char *prompt, const char *input, int raw, int32_t **ids_out,
                            int32_t *n_out, int32_t *n_bos, zt_error *err)
{
    zt_buf text = {0};
    size_t prompt_len = strlen(prompt), input_len = input ? strlen(input) : 0;
    int failed;
    if (!raw) {
        /* The default system text follows the input, as zt-prep chooses it (Alpaca has two preambles). */
        const char *system = input_len ? g->tpl.system : g->tpl.system_no_input;
        failed = zt_template_render_prompt(&g->tpl, &text, system, strlen(system), prompt, prompt_len, input,
                                           input_len);
    } else {
        failed = zt_buf_append(&text, prompt, prompt_len);
    }
    if (failed) {
        zt_buf_free(&text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory rendering the prompt");
    }
    int32_t *ids = NULL;
    size_t n = 0;
    zt_status st = gen_tokenizer_encode(&g->tok, text.data ? text.data : "", text.len, &ids, &n, err);
    zt_buf_free(&text);
    if (st != ZT_OK) return st;
    int bos = g->tok.info.bos_id >= 0;
    int32_t *all = malloc((n + 1) * sizeof *all);
    if (!all) {
        free(ids);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory building the prompt");
    }
    if (bos) all[0] = g->tok.info.bos_id;
    if (n) memcpy(all + bos, ids, n * sizeof *ids);
    free(ids);
    *ids_out = all;
    *n_out = (int32_t)n + bos;
    *n_bos = bos;
    return ZT_OK;
}

/* The prompt's ids: --prompt-ids as they are; else BOS (when the tokenizer has one, as zt-prep
 * writes samples) and the text, rendered with the template unless --raw. */
static zt_status build_prompt(gen_run *g, int32_t **ids_out, int32_t *n_out, int32_t *n_bos, zt_error *err)
{
    const zt_generate_options *o = g->o;
    *n_bos = 0;
    if (o->prompt_ids) return parse_prompt_ids(o->prompt_ids, g->model.info->vocab_size, ids_out, n_out, err);
    return gen_encode_prompt(g, o->prompt, o->input, !g->have_tpl, ids_out, n_out, n_bos, err);
}

static zt_status generate(gen_run *g, zt_error *err)
{
    const zt_generate_options *o = g->o;
    const zt_generate_settings *s = g->s;
    gen_model *m = &g->model;
    int32_t V = m->info->vocab_size, max_len = m->info->max_seq_len;
    int32_t *prompt = NULL, n_prompt = 0, n_bos = 0;
    zt_status st = build_prompt(g, &prompt, &n_prompt, &n_bos, err);
    if (st != ZT_OK) return st;
    if (n_prompt == 0) {
        free(prompt);
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "the prompt is empty and the tokenizer has no BOS to start from: "
                            "give some text");
    }
    if (n_prompt >= max_len) {
        free(prompt);
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "the prompt is %d tokens, but the model reads at most %d (max_position_embeddings), "
                            "which leaves no room for an answer: shorten the prompt",
                            (int)n_prompt, (int)max_len);
    }
    int64_t capacity = (int64_t)n_prompt + s->max_new_tokens;
    if (capacity > max_len) {
        zt_log(ZT_LOG_WARN, "%d prompt tokens + --max-new-tokens %lld exceed the model's %d positions "
               "(max_position_embeddings): at most %d tokens will be generated",
               (int)n_prompt, (long long)s->max_new_tokens, (int)max_len, (int)(max_len - n_prompt));
        capacity = max_len;
    }
    int32_t *ids = malloc((size_t)capacity * sizeof *ids);
    float *masked = malloc((size_t)V * sizeof *masked);
    zt_sampler sampler = {0};
    if (!ids || !masked)
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for %lld tokens", (long long)capacity);
    uint64_t seed = s->seed_given ? s->seed : (uint64_t)g->settings.seed;
    if (st == ZT_OK) st = zt_sampler_init(&sampler, V, s->temperature, s->top_k, s->top_p, seed, err);
    if (st == ZT_OK) st = gen_model_prepare(m, 1, (int32_t)capacity, err);
    if (st != ZT_OK) {
        free(prompt);
        free(ids);
        free(masked);
        zt_sampler_free(&sampler);
        return st;
    }
    memcpy(ids, prompt, (size_t)n_prompt * sizeof *ids);
    free(prompt);
    if (s->temperature == 0)
        zt_log(ZT_LOG_INFO, "%d prompt tokens; greedy decoding of up to %lld tokens", (int)n_prompt,
               (long long)(capacity - n_prompt));
    else
        zt_log(ZT_LOG_INFO, "%d prompt tokens; sampling up to %lld tokens with temperature %g, top-k %d%s, top-p %g, "
               "seed %llu", (int)n_prompt, (long long)(capacity - n_prompt), s->temperature, (int)s->top_k,
               s->top_k ? "" : " (off)", s->top_p, (unsigned long long)seed);

    /* Without a tokenizer there is no text: ids in, ids out. With a template only the answer is
     * written; --raw continues the prompt, so the prompt is written too. */
    int print_ids = o->print_ids || !g->have_tok;
    int32_t text_from = g->have_tpl || o->prompt_ids ? n_prompt : n_bos;
    text_stream ts = {0};
    if (!print_ids && text_from < n_prompt) { /* the --raw prompt: written, never searched for stop texts */
        char *prompt_text = NULL;
        st = gen_tokenizer_decode(&g->tok, text_from ? ids[text_from - 1] : -1, ids + text_from,
                                  (size_t)(n_prompt - text_from), &prompt_text, &ts.answer_from, err);
        free(prompt_text);
        if (st == ZT_OK)
            st = stream_text(g, &ts, text_from ? ids[text_from - 1] : -1, ids + text_from,
                             (size_t)(n_prompt - text_from), 0, err);
    }

    const char *why = "the model's context is full";
    int32_t n_draw = gen_n_draw(g);
    if (st == ZT_OK) st = gen_model_warmup(m, n_prompt, n_draw, err);
    gen_stats_begin(&g->stats);
    g->stats.prompt_tokens = n_prompt;
    g->stats.peak_concurrent = 1;
    double started = g->stats.started, prefill_s = 0;
    int32_t length = n_prompt;
    while (st == ZT_OK) {
        const int32_t *step = length == n_prompt ? ids : ids + length - 1;
        int32_t n_step = length == n_prompt ? n_prompt : 1, next = -1;
        double t0 = zt_now_s();
        if (m->device_sampling) { /* the head draws with this record's next u */
            zt_sample_row row = gen_sample_row(&sampler);
            st = gen_model_step_sampled(m, step, n_step, &row, n_draw, &next, err);
        } else {
            st = gen_model_step(m, step, n_step, err);
        }
        if (st != ZT_OK) break;
        if (length == n_prompt) {
            g->stats.prefill_s += zt_now_s() - t0;
            g->stats.prefills++;
        } else {
            g->stats.decode_s += zt_now_s() - t0;
            g->stats.decode_steps++;
        }
        if (length == n_prompt) {
            prefill_s = zt_now_s() - started;
            gen_stats_first_token(&g->stats, started);
        }
        if (!m->device_sampling) {
            memcpy(masked, m->logits, (size_t)V * sizeof *masked);
            for (int32_t v = n_draw; v < V; v++) masked[v] = -INFINITY; /* ids the tokenizer lacks */
            next = zt_sampler_next(&sampler, masked);
        }
        ids[length++] = next;
        if (print_ids) {
            printf("%s%d", length - 1 > n_prompt ? " " : "", (int)next);
            fflush(stdout);
        }
        if (gen_is_stop_id(g, next)) {
            why = "end of sequence";
            break;
        }
        if (!print_ids) {
            st = stream_text(g, &ts, text_from ? ids[text_from - 1] : -1, ids + text_from,
                             (size_t)(length - text_from), 0, err);
            if (ts.stopped) {
                why = "a stop text (the template's answer suffix or --stop)";
                break;
            }
        }
        if (length - n_prompt >= s->max_new_tokens) {
            why = "--max-new-tokens";
            break;
        }
        if (length >= capacity) break;
    }
    if (st == ZT_OK && !print_ids) {
        int32_t end = gen_is_stop_id(g, ids[length - 1]) ? length - 1 : length; /* EOS has no text */
        st = stream_text(g, &ts, text_from ? ids[text_from - 1] : -1, ids + text_from,
                         (size_t)(end - text_from), 1, err);
    }
    if (st == ZT_OK) {
        fputc('\n', stdout);
        fflush(stdout);
        g->stats.finished = zt_now_s();
        double took = g->stats.finished - started;
        int32_t generated = length - n_prompt;
        g->stats.new_tokens = generated;
        zt_log(ZT_LOG_INFO, "generated %d token%s in %.2f s (prompt %.2f s, %.1f tokens/s after it); stopped by %s",
               (int)generated, generated == 1 ? "" : "s", took, prefill_s,
               generated > 1 && took > prefill_s ? (generated - 1) / (took - prefill_s) : 0.0, why);
        zt_kv_stats k;
        if (gen_model_kv_stats(m, 0, &k, err) == ZT_OK) gen_model_log_kv(m, 1, k.slots, k.tokens);
    }
    free(ids);
    free(masked);
    zt_sampler_free(&sampler);
    return st;
}

zt_status zt_generate_run(const zt_generate_options *o, const zt_generate_settings *s, zt_error *err)
{
    gen_run g;
    memset(&g, 0, sizeof g);
    g.o = o;
    g.s = s;
    zt_status st = configure(&g, err);
    if (st == ZT_OK) st = start_plugins(&g, err);
    if (st == ZT_OK) st = load_model(&g, err);
    if (st == ZT_OK) st = read_manifest(&g, err);
    if (st == ZT_OK) st = load_template(&g, err);
    if (st == ZT_OK) st = open_tokenizer(&g, err);
    if (st == ZT_OK) {
        /* Generation ends at the tokenizer's EOS and at the model config's; a llama2.c model also
         * ends at BOS, which starts the next story in its training data (run.c stops there). */
        if (g.have_tok) add_stop_id(&g, g.tok.info.eos_id);
        if (g.have_tok && g.tok.l2c) add_stop_id(&g, ZT_L2C_BOS);
        const zt_hf_config *hc = g.hf ? zt_hf_model_config(g.hf) : g.l2c ? zt_l2c_model_config(g.l2c) : NULL;
        for (int i = 0; hc && i < hc->n_eos; i++) add_stop_id(&g, hc->eos_token_ids[i]);
        collect_stop_texts(&g);
        if (o->n_stops && !g.have_tok)
            st = zt_error_set(err, ZT_ERR_INVALID_ARG, "--stop needs a tokenizer: it ends the answer's text, and "
                              "without one there is only ids; give -t TOKENIZER (or a model with tokenizer.model)");
        if (st == ZT_OK) st = o->prompts ? gen_batch_run(&g, err) : generate(&g, err);
        if (st == ZT_OK) st = gen_stats_write(&g, &g.stats, err);
    }

    if (g.have_tpl) zt_template_free(&g.tpl);
    if (g.have_tok) gen_tokenizer_close(&g.tok);
    gen_manifest_free(&g.manifest);
    free(g.data_path);
    gen_model_free(&g.model);
    zt_plugin_set_unload(&g.set); /* fini before the runtime that served them goes */
    zt_runtime_destroy(g.rt);
    zt_registry_free(g.reg);
    zt_config_free(g.cfg);
    zt_ckpt_close(g.ckpt);
    free(g.ckpt_dir);
    zt_hf_model_close(g.hf);
    zt_l2c_model_close(g.l2c);
    return st;
}
