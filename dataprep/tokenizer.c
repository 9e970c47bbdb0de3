/* The tokenizer as zt-prep uses it: a tokenizer plugin (sentencepiece by default) found and loaded
 * through the registry exactly as zt-run loads plugins, and one opened model shared by all threads. */
#define _DEFAULT_SOURCE /* realpath */
#define _POSIX_C_SOURCE 200809L
#include "prep.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The plugin's own description of its last failure, appended to err. */
static zt_status plugin_error(prep_tokenizer *t, zt_status st, zt_error *err, const char *fmt, ...)
    ZT_PRINTF(4, 5);
static zt_status plugin_error(prep_tokenizer *t, zt_status st, zt_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zt_error_setv(err, st, fmt, ap);
    va_end(ap);
    zt_status plugin_status;
    const char *why = t->plugin.host ? zt_runtime_take_error(t->plugin.host, &plugin_status) : "";
    if (why && *why) zt_error_append(err, ": %s", why);
    else zt_error_append(err, " (%s)", zt_status_name(st));
    return st;
}

zt_status prep_tokenizer_open(prep_tokenizer *t, const char *plugin_name, const char **plugin_dirs,
                              int n_plugin_dirs, const char *model_path, zt_error *err)
{
    memset(t, 0, sizeof *t);
    t->path = realpath(model_path, NULL);
    if (!t->path) t->path = prep_xstrdup(model_path);
    struct stat st_model;
    if (stat(model_path, &st_model) != 0)
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "tokenizer model '%s' not found (%s); pass -t PATH to the model's "
                            "tokenizer.model (a SentencePiece file)", model_path, strerror(errno));

    zt_status st = zt_registry_scan(plugin_dirs, n_plugin_dirs, &t->registry, err);
    if (st != ZT_OK) return st;
    st = zt_plugin_load(t->registry, plugin_name, &t->plugin, err);
    if (st != ZT_OK) return st;
    if (t->plugin.plugin->kind != ZT_KIND_TOKENIZER)
        return zt_error_set(err, ZT_ERR_INVALID_ARG,
                            "plugin '%s' (%s) is a %s plugin, not a tokenizer; zt-prep needs a "
                            "tokenizer plugin such as sentencepiece", plugin_name,
                            t->plugin.desc.library, zt_kind_name(t->plugin.plugin->kind));
    zt_runtime_options ropt;
    memset(&ropt, 0, sizeof ropt);
    ropt.n_threads = 1; /* zt-prep runs its own workers; the plugin's pool stays idle */
    ropt.device_type = ZT_DEVICE_CPU;
    ropt.single_process = 1; /* zt-prep is one process, whatever a launcher's environment says */
    st = zt_runtime_create(&ropt, NULL, &t->runtime, err);
    if (st != ZT_OK) return st;
    st = zt_plugin_probe(&t->plugin, t->runtime, err);
    if (st != ZT_OK) return st;
    st = zt_plugin_init(&t->plugin, t->runtime, err);
    if (st != ZT_OK) return st;
    t->ops = (const zt_tokenizer_ops *)t->plugin.plugin->ops;
    if (!t->ops || t->ops->struct_size < sizeof(zt_tokenizer_ops))
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "tokenizer plugin '%s' has an ops table older than this zt-prep "
                            "(struct_size %u, need %zu); rebuild the plugin", plugin_name,
                            t->ops ? t->ops->struct_size : 0, sizeof(zt_tokenizer_ops));

    st = t->ops->open(t->plugin.state, model_path, &t->model);
    if (st != ZT_OK) {
        t->model = NULL;
        zt_status ignored;
        const char *why = zt_runtime_take_error(t->plugin.host, &ignored);
        /* The plugin's message names the file and the problem; only add the file when it is silent. */
        if (why && *why) return zt_error_set(err, st, "%s", why);
        return zt_error_set(err, st, "cannot open tokenizer model '%s' (%s)", model_path,
                            zt_status_name(st));
    }
    memset(&t->info, 0, sizeof t->info);
    t->info.struct_size = sizeof t->info;
    st = t->ops->info(t->model, &t->info);
    if (st != ZT_OK) return plugin_error(t, st, err, "cannot read facts of tokenizer '%s'", model_path);
    if (t->info.vocab_size <= 0)
        return zt_error_set(err, ZT_ERR_FORMAT, "tokenizer '%s' reports a vocabulary of %d tokens",
                            model_path, t->info.vocab_size);
    if (t->info.eos_id < 0 || t->info.eos_id >= t->info.vocab_size)
        return zt_error_set(err, ZT_ERR_UNSUPPORTED,
                            "tokenizer '%s' has no end-of-sequence id; zt-prep ends every response "
                            "with EOS so the model learns to stop. Use a model trained with an EOS "
                            "piece (spm_train --eos_id=2)", model_path);
    return ZT_OK;
}

typedef struct close_job {
    const zt_tokenizer_ops *ops;
    zt_tokenizer_model *model;
} close_job;

static void *close_model(void *arg)
{
    close_job *job = arg;
    job->ops->close(job->model);
    free(job);
    return NULL;
}

void prep_tokenizer_release_model(prep_tokenizer *t)
{
    if (!t->ops || !t->model || t->closing) return;
    close_job *job = malloc(sizeof *job);
    if (!job) return; /* closed by prep_tokenizer_close instead */
    *job = (close_job){t->ops, t->model};
    if (pthread_create(&t->closer, NULL, close_model, job) != 0) {
        free(job);
        return;
    }
    t->closing = 1;
    t->model = NULL;
}

void prep_tokenizer_close(prep_tokenizer *t)
{
    if (t->closing) pthread_join(t->closer, NULL);
    if (t->ops && t->model) t->ops->close(t->model);
    t->model = NULL;
    zt_plugin_unload(&t->plugin);
    if (t->runtime) zt_runtime_destroy(t->runtime);
    if (t->registry) zt_registry_free(t->registry);
    free(t->path);
    memset(t, 0, sizeof *t);
}

zt_status prep_tokenizer_encode(prep_tokenizer *t, const char *text, size_t len, int32_t **ids,
                                size_t *cap, size_t *n, zt_error *err)
{
    for (;;) {
        uint64_t needed = 0;
        zt_status st = t->ops->encode(t->model, text, len, *ids, *cap, &needed);
        if (st == ZT_OK) {
            *n = (size_t)needed;
            return ZT_OK;
        }
        if (st != ZT_ERR_BUFFER_TOO_SMALL || needed <= *cap)
            return plugin_error(t, st, err, "the tokenizer failed to encode %zu bytes of text", len);
        *cap = (size_t)needed + 64;
        *ids = prep_xrealloc(*ids, *cap * sizeof **ids, "token ids");
    }
}

zt_status prep_tokenizer_decode(prep_tokenizer *t, const int32_t *ids, size_t n, prep_buf *out,
                                zt_error *err)
{
    out->len = 0;
    prep_buf_reserve(out, 4 * n + 16);
    for (;;) {
        uint64_t needed = 0;
        zt_status st = t->ops->decode(t->model, ids, n, out->data, out->cap, &needed);
        if (st == ZT_OK) {
            out->len = (size_t)needed;
            out->data[out->len] = '\0';
            return ZT_OK;
        }
        if (st != ZT_ERR_BUFFER_TOO_SMALL || needed + 1 <= out->cap)
            return plugin_error(t, st, err, "the tokenizer failed to decode %zu ids", n);
        prep_buf_reserve(out, (size_t)needed + 1);
    }
}

zt_status prep_tokenizer_piece(prep_tokenizer *t, int32_t id, prep_buf *out, zt_error *err)
{
    out->len = 0;
    prep_buf_reserve(out, 64);
    for (;;) {
        uint64_t needed = 0;
        zt_status st = t->ops->id_to_piece(t->model, id, out->data, out->cap, &needed);
        if (st == ZT_OK) {
            out->len = (size_t)needed;
            out->data[out->len] = '\0';
            return ZT_OK;
        }
        if (st != ZT_ERR_BUFFER_TOO_SMALL || needed + 1 <= out->cap)
            return plugin_error(t, st, err, "the tokenizer has no piece for id %d", id);
        prep_buf_reserve(out, (size_t)needed + 1);
    }
}
