/* zt-run --generate: where the model, template and tokenizer come from (the checkpoint's config,
 * the data set's manifest), and the tokenizer, a plugin's or llama2.c's. */
#define _GNU_SOURCE /* open_memstream, asprintf, mkstemp */
#include "generate/generate_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/json.h"

/* ---- where model, template and tokenizer come from ---------------------------------------------- */

void gen_manifest_free(manifest_info *m)
{
    free(m->tokenizer_path);
    free(m->tokenizer_plugin);
    free(m->template_json);
    memset(m, 0, sizeof *m);
}

static zt_status manifest_string(const zt_json *j, int obj, const char *key, const char *path, char **out,
                                 zt_error *err)
{
    int v = obj >= 0 && j->tok[obj].type == ZT_JSON_OBJECT ? zt_json_object_get(j, obj, key) : -1;
    if (v < 0 || j->tok[v].type != ZT_JSON_STRING)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s has no string %s; re-run zt-prep to rewrite the data set", path,
                            key);
    size_t len;
    return zt_json_string(j, v, out, &len, err);
}

/* The template object of the manifest, less the keys that only describe where it came from, is a
 * template file (docs/zt-prep.md). */
static zt_status manifest_template_json(const zt_json *j, int tpl, const char *path, char **out, zt_error *err)
{
    if (tpl < 0 || j->tok[tpl].type != ZT_JSON_OBJECT)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s has no template object; re-run zt-prep to rewrite the data set",
                            path);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    fputc('{', f);
    int written = 0;
    for (int k = tpl + 1, i = 0; i < j->tok[tpl].size; i++) {
        int v = k + 1;
        if (!zt_json_eq(j, k, "file") && !zt_json_eq(j, k, "file_fnv1a64")) {
            /* String tokens span their contents; the quotes are one byte either side. */
            int quote = j->tok[v].type == ZT_JSON_STRING;
            fprintf(f, "%s\"%.*s\": %.*s", written++ ? ", " : "", j->tok[k].end - j->tok[k].start,
                    j->text + j->tok[k].start, j->tok[v].end - j->tok[v].start + 2 * quote,
                    j->text + j->tok[v].start - quote);
        }
        k = zt_json_skip(j, v);
    }
    fputc('}', f);
    if (fclose(f) != 0) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    }
    *out = text;
    return ZT_OK;
}

zt_status gen_manifest_load(const char *data_dir, manifest_info *m, zt_error *err)
{
    memset(m, 0, sizeof *m);
    if (snprintf(m->path, sizeof m->path, "%s/manifest.json", data_dir) >= (int)sizeof m->path)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "the data directory path %.100s... is too long", data_dir);
    char *text = NULL;
    size_t len = 0;
    zt_status st = zt_read_file(m->path, &text, &len, err);
    if (st != ZT_OK) {
        zt_error_append(err, "\n%s must be a directory written by zt-prep", data_dir);
        return st;
    }
    zt_json j;
    st = zt_json_parse(text, len, m->path, &j, err);
    if (st == ZT_OK) {
        int tok = j.tok[0].type == ZT_JSON_OBJECT ? zt_json_object_get(&j, 0, "tokenizer") : -1;
        char *hash = NULL;
        st = manifest_string(&j, tok, "path", m->path, &m->tokenizer_path, err);
        if (st == ZT_OK) st = manifest_string(&j, tok, "plugin", m->path, &m->tokenizer_plugin, err);
        if (st == ZT_OK) st = manifest_string(&j, tok, "hash", m->path, &hash, err);
        char *end = hash;
        if (st == ZT_OK) m->tokenizer_hash = strtoull(hash, &end, 16);
        if (st == ZT_OK && (strlen(hash) != 16 || *end))
            st = zt_error_set(err, ZT_ERR_FORMAT, "%s: tokenizer.hash \"%s\" is not 16 hex digits; re-run zt-prep",
                              m->path, hash);
        free(hash);
        int tpl = j.tok[0].type == ZT_JSON_OBJECT ? zt_json_object_get(&j, 0, "template") : -1;
        if (st == ZT_OK) st = manifest_template_json(&j, tpl, m->path, &m->template_json, err);
        zt_json_free(&j);
    }
    free(text);
    if (st != ZT_OK) gen_manifest_free(m);
    return st;
}

zt_status gen_template_from_manifest(const manifest_info *m, zt_template *tpl, zt_error *err)
{
    const char *tmpdir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/zt-template-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return zt_error_set(err, ZT_ERR_IO, "cannot create a temporary file %s: %s", path, strerror(errno));
    size_t len = strlen(m->template_json);
    ssize_t wrote = write(fd, m->template_json, len);
    close(fd);
    zt_status st = wrote == (ssize_t)len
                       ? zt_template_load(path, tpl, err)
                       : zt_error_set(err, ZT_ERR_IO, "cannot write the temporary file %s: %s", path, strerror(errno));
    unlink(path);
    if (st != ZT_OK) zt_error_append(err, "\n(the template recorded in %s)", m->path);
    return st;
}

zt_status gen_resolve_checkpoint(const char *arg, char **step_dir, zt_error *err)
{
    char probe[4096];
    struct stat sb;
    snprintf(probe, sizeof probe, "%s/checkpoint.json", arg);
    if (stat(probe, &sb) == 0) return (*step_dir = strdup(arg)) ? ZT_OK : ZT_ERR_OUT_OF_MEMORY;
    if (stat(arg, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "--resume %s: no such directory; give a checkpoint (a step-NNNNNN directory) or a "
                            "checkpoint root such as OUTPUT_DIR/checkpoints (its newest checkpoint)",
                            arg);
    zt_status st = zt_ckpt_latest(arg, step_dir, err);
    if (st != ZT_OK)
        zt_error_append(err, "\n--resume takes a checkpoint (a step-NNNNNN directory) or a checkpoint root such as "
                             "OUTPUT_DIR/checkpoints");
    return st;
}

zt_status gen_checkpoint_config(zt_ckpt *c, const char *dir, zt_config *cfg, char **data_path, zt_error *err)
{
    *data_path = NULL;
    const char *text = zt_ckpt_config_json(c);
    char origin[4200];
    snprintf(origin, sizeof origin, "%s/checkpoint.json (config)", dir);
    zt_json j;
    zt_status st = zt_json_parse(text, strlen(text), origin, &j, err);
    if (st != ZT_OK) return st;
    int model = j.tok[0].type == ZT_JSON_OBJECT ? zt_json_object_get(&j, 0, "model") : -1;
    if (model < 0 || j.tok[model].type != ZT_JSON_OBJECT) {
        zt_json_free(&j);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s has no model section: the checkpoint was not written by zt-run training", origin);
    }
    char *json = NULL;
    if (asprintf(&json, "{\"model\": %.*s}", j.tok[model].end - j.tok[model].start, text + j.tok[model].start) < 0)
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", origin);
    if (st == ZT_OK) st = zt_config_load_string(cfg, json, origin, err);
    free(json);
    int data = zt_json_object_get(&j, 0, "data");
    int path = data >= 0 && j.tok[data].type == ZT_JSON_OBJECT ? zt_json_object_get(&j, data, "path") : -1;
    size_t len;
    if (st == ZT_OK && path >= 0 && j.tok[path].type == ZT_JSON_STRING)
        st = zt_json_string(&j, path, data_path, &len, err);
    zt_json_free(&j);
    return st;
}

/* ---- the tokenizer ---------------------------------------------------------------------------- */

int gen_is_llama2c_file(const char *path)
{
    size_t n = strlen(path);
    return n > 4 && strcmp(path + n - 4, ".bin") == 0;
}

zt_status gen_tokenizer_open(gen_tokenizer *t, const char *path, const zt_loaded_plugin *lp, int32_t model_vocab,
                             zt_error *err)
{
    memset(t, 0, sizeof *t);
    if (!(t->path = strdup(path))) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    t->info.struct_size = sizeof t->info;
    if (gen_is_llama2c_file(path)) {
        zt_status st = zt_l2c_tokenizer_load(path, model_vocab, &t->l2c, err);
        if (st != ZT_OK) return st;
        t->info.vocab_size = model_vocab;
        t->info.bos_id = ZT_L2C_BOS;
        t->info.eos_id = ZT_L2C_EOS;
        t->info.pad_id = -1;
        t->info.unk_id = 0;
        snprintf(t->info.model_type, sizeof t->info.model_type, "llama2.c");
        return ZT_OK;
    }
    t->lp = lp;
    t->ops = lp->plugin->ops;
    zt_status st = t->ops->open(lp->state, path, &t->model);
    if (st != ZT_OK) return zt_plugin_failed(lp, st, err, "opening %s", path);
    st = t->ops->info(t->model, &t->info);
    if (st != ZT_OK) return zt_plugin_failed(lp, st, err, "info() of %s", path);
    return ZT_OK;
}

void gen_tokenizer_close(gen_tokenizer *t)
{
    if (t->model) t->ops->close(t->model);
    zt_l2c_tokenizer_free(t->l2c);
    free(t->path);
    memset(t, 0, sizeof *t);
}

zt_status gen_tokenizer_encode(gen_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                               zt_error *err)
{
    if (t->l2c) return zt_l2c_encode(t->l2c, text, len, ids, n, err);
    uint64_t cap = len + 16, needed = 0;
    for (;;) {
        *ids = malloc(cap * sizeof **ids);
        if (!*ids) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory encoding the prompt");
        zt_status st = t->ops->encode(t->model, text, len, *ids, cap, &needed);
        if (st == ZT_OK) break;
        free(*ids);
        *ids = NULL;
        if (st != ZT_ERR_BUFFER_TOO_SMALL || needed <= cap)
            return zt_plugin_failed(t->lp, st, err, "encoding the prompt with %s", t->path);
        cap = needed;
    }
    *n = needed;
    return ZT_OK;
}

zt_status gen_tokenizer_decode(gen_tokenizer *t, int32_t prev, const int32_t *ids, size_t n, char **text, size_t *len,
                               zt_error *err)
{
    if (t->l2c) return zt_l2c_decode(t->l2c, prev, ids, n, text, len, err);
    uint64_t cap = 64 + 16 * (uint64_t)n, needed = 0;
    for (;;) {
        *text = malloc(cap);
        if (!*text) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory decoding");
        zt_status st = t->ops->decode(t->model, ids, n, *text, cap, &needed);
        if (st == ZT_OK) break;
        free(*text);
        *text = NULL;
        if (st != ZT_ERR_BUFFER_TOO_SMALL || needed + 1 <= cap)
            return zt_plugin_failed(t->lp, st, err, "decoding with %s", t->path);
        cap = needed + 1;
    }
    *len = needed;
    return ZT_OK;
}
