/* The data set's manifest.json as the loader reads it (loader.h lists the keys), and the small JSON
 * readers, with origin:line:col messages, that it and the loader position (loader.c) use. */
#include "data/loader_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MANIFEST_MAX_BYTES (256u << 20) /* far above any real manifest; refuses to slurp junk */

/* ---- small JSON readers with origin:line:col messages ---------------------------------------- */

zt_status loader_json_fail(const zt_json *j, int tok, zt_error *err, const char *fmt, ...)
{
    int line = 1, col = 1;
    if (tok >= 0 && tok < j->n_tok) zt_json_line_col(j->text, (size_t)j->tok[tok].start, &line, &col);
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return zt_error_set(err, ZT_ERR_FORMAT, "%s:%d:%d: %s", j->origin, line, col, what);
}

zt_status loader_json_member(const zt_json *j, int obj, const char *key, const char *where,
                             int *tok, zt_error *err)
{
    *tok = zt_json_object_get(j, obj, key);
    if (*tok < 0) return loader_json_fail(j, obj, err, "%s has no \"%s\"", where, key);
    return ZT_OK;
}

zt_status loader_json_integer(const zt_json *j, int tok, const char *key, int64_t min,
                              int64_t max, int64_t *out, zt_error *err)
{
    const zt_json_tok *t = &j->tok[tok];
    const char *s = j->text + t->start;
    int n = t->end - t->start;
    int neg = n > 0 && s[0] == '-';
    int ok = t->type == ZT_JSON_PRIMITIVE && n > neg && n - neg <= 19;
    uint64_t v = 0;
    for (int i = neg; ok && i < n; i++) {
        if (s[i] < '0' || s[i] > '9') ok = 0;
        else v = v * 10 + (uint64_t)(s[i] - '0');
    }
    ok = ok && v <= (uint64_t)INT64_MAX;
    int64_t value = ok ? (neg ? -(int64_t)v : (int64_t)v) : 0;
    if (!ok || value < min || value > max)
        return loader_json_fail(j, tok, err, "\"%s\" must be an integer in [%" PRId64 ", %" PRId64
                                "], found %s%.*s%s", key, min, max,
                                t->type == ZT_JSON_STRING ? "\"" : "", n > 40 ? 40 : n, s,
                                t->type == ZT_JSON_STRING ? "\"" : "");
    *out = value;
    return ZT_OK;
}

static zt_status json_text(const zt_json *j, int tok, const char *key, char **out, zt_error *err)
{
    if (j->tok[tok].type != ZT_JSON_STRING)
        return loader_json_fail(j, tok, err, "\"%s\" must be a string", key);
    size_t len;
    zt_status st = zt_json_string(j, tok, out, &len, err);
    if (st) return st;
    if (strlen(*out) != len) {
        free(*out);
        *out = NULL;
        return loader_json_fail(j, tok, err, "\"%s\" contains a NUL character", key);
    }
    return ZT_OK;
}

zt_status loader_json_hex64(const zt_json *j, int tok, const char *key, uint64_t *out, zt_error *err)
{
    const zt_json_tok *t = &j->tok[tok];
    const char *s = j->text + t->start;
    int ok = t->type == ZT_JSON_STRING && t->end - t->start == 16;
    uint64_t v = 0;
    for (int i = 0; ok && i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) ok = 0;
        else v = v << 4 | (uint64_t)d;
    }
    if (!ok)
        return loader_json_fail(j, tok, err, "\"%s\" must be a string of 16 hex digits, found %.*s",
                                key, t->end - t->start > 40 ? 40 : t->end - t->start, s);
    *out = v;
    return ZT_OK;
}

zt_status loader_json_bool(const zt_json *j, int tok, const char *key, int32_t *out, zt_error *err)
{
    if (!zt_json_is_bool(j, tok))
        return loader_json_fail(j, tok, err, "\"%s\" must be true or false", key);
    *out = zt_json_get_bool(j, tok);
    return ZT_OK;
}

/* ---- manifest ---------------------------------------------------------------------------------- */

static zt_status read_file(const char *path, char **out, size_t *len, zt_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return zt_error_set(err, errno == ENOENT ? ZT_ERR_NOT_FOUND : ZT_ERR_IO,
                                "cannot open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t used = 0, cap = 0;
    for (;;) {
        if (used == cap) {
            if (cap >= MANIFEST_MAX_BYTES) {
                fclose(f);
                free(buf);
                return zt_error_set(err, ZT_ERR_FORMAT, "%s is larger than %u MiB; it is not a "
                                    "zt-prep manifest", path, MANIFEST_MAX_BYTES >> 20);
            }
            cap = cap ? cap * 2 : 65536;
            char *grown = realloc(buf, cap + 1);
            if (!grown) {
                fclose(f);
                free(buf);
                return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
            }
            buf = grown;
        }
        size_t got = fread(buf + used, 1, cap - used, f);
        used += got;
        if (got == 0) break;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return zt_error_set(err, ZT_ERR_IO, "cannot read %s: a read error occurred", path);
    }
    buf[used] = '\0';
    *out = buf;
    *len = used;
    return ZT_OK;
}

void loader_manifest_free(manifest *m)
{
    for (int64_t i = 0; i < m->n_shards; i++) free(m->shards[i].file);
    free(m->shards);
    memset(m, 0, sizeof *m);
}

static zt_status parse_tokenizer(const zt_json *j, int root, manifest *m, zt_error *err)
{
    int tok_obj, t;
    zt_status st = loader_json_member(j, root, "tokenizer", "the manifest", &tok_obj, err);
    if (st) return st;
    if (j->tok[tok_obj].type != ZT_JSON_OBJECT)
        return loader_json_fail(j, tok_obj, err, "\"tokenizer\" must be an object");
    const char *where = "\"tokenizer\"";
    if ((st = loader_json_member(j, tok_obj, "hash", where, &t, err)) ||
        (st = loader_json_hex64(j, t, "hash", &m->tokenizer_hash, err)))
        return st;
    if ((st = loader_json_member(j, tok_obj, "vocab_size", where, &t, err)) ||
        (st = loader_json_integer(j, t, "vocab_size", 1, INT32_MAX, &m->vocab_size, err)))
        return st;
    const char *ids[3] = {"bos_id", "eos_id", "pad_id"};
    int64_t *values[3] = {&m->bos_id, &m->eos_id, &m->pad_id};
    for (int i = 0; i < 3; i++)
        if ((st = loader_json_member(j, tok_obj, ids[i], where, &t, err)) ||
            (st = loader_json_integer(j, t, ids[i], -1, m->vocab_size - 1, values[i], err)))
            return st;
    return ZT_OK;
}

/* What identifies a zt-prep manifest, and the layout zt-prep recorded for the loader. */
static zt_status parse_header(const zt_json *j, manifest *m, zt_error *err)
{
    int t;
    int64_t version;
    zt_status st = loader_json_member(j, 0, "format", "the manifest", &t, err);
    if (st) return st;
    if (!zt_json_eq(j, t, "zt-prep-manifest"))
        return loader_json_fail(j, t, err, "\"format\" is not \"zt-prep-manifest\": this manifest.json "
                                "was not written by zt-prep; run zt-prep to make a data set");
    if ((st = loader_json_member(j, 0, "format_version", "the manifest", &t, err)) ||
        (st = loader_json_integer(j, t, "format_version", 0, INT64_MAX, &version, err)))
        return st;
    if (version != 1)
        return loader_json_fail(j, t, err, "manifest format_version %" PRId64 ", but this zt reads "
                                "version 1: re-run this release's zt-prep, or use the zt release that "
                                "wrote it", version);
    m->packed = -1;
    int options = zt_json_object_get(j, 0, "options");
    int layout = options >= 0 && j->tok[options].type == ZT_JSON_OBJECT
                     ? zt_json_object_get(j, options, "layout") : -1;
    if (layout >= 0) {
        if (zt_json_eq(j, layout, "packed")) m->packed = 1;
        else if (zt_json_eq(j, layout, "padded")) m->packed = 0;
        else return loader_json_fail(j, layout, err, "options.layout must be \"packed\" or \"padded\"");
    }
    return ZT_OK;
}

/* A shard file name must stay inside the data set directory. */
static int plain_file_name(const char *s)
{
    return s[0] != '\0' && s[0] != '.' && strchr(s, '/') == NULL;
}

static zt_status parse_shard_entry(const zt_json *j, int entry, int64_t i, const char *split,
                                   manifest *m, zt_error *err)
{
    char where[64];
    snprintf(where, sizeof where, "shards[%" PRId64 "]", i);
    if (j->tok[entry].type != ZT_JSON_OBJECT)
        return loader_json_fail(j, entry, err, "%s must be an object", where);
    int t;
    char *split_name = NULL;
    zt_status st = loader_json_member(j, entry, "split", where, &t, err);
    if (!st) st = json_text(j, t, "split", &split_name, err);
    if (st) return st;
    if (strcmp(split_name, "train") != 0 && strcmp(split_name, "val") != 0) {
        free(split_name);
        return loader_json_fail(j, t, err, "%s: \"split\" must be \"train\" or \"val\"", where);
    }
    int wanted = strcmp(split_name, split) == 0;
    free(split_name);

    manifest_shard s = {0};
    if ((st = loader_json_member(j, entry, "file", where, &t, err)) ||
        (st = json_text(j, t, "file", &s.file, err)))
        return st;
    if (!plain_file_name(s.file)) {
        free(s.file);
        return loader_json_fail(j, t, err, "%s: \"file\" must be a file name inside the data set "
                                "directory (no '/', not starting with '.')", where);
    }
    const char *counts[4] = {"samples", "tokens", "loss_tokens", "bytes"};
    int64_t *values[4] = {&s.n_samples, &s.n_tokens, &s.n_loss_tokens, &s.bytes};
    for (int k = 0; !st && k < 4; k++)
        if (!(st = loader_json_member(j, entry, counts[k], where, &t, err)))
            st = loader_json_integer(j, t, counts[k], 0, INT64_MAX, values[k], err);
    if (!st && !(st = loader_json_member(j, entry, "checksum", where, &t, err)))
        st = loader_json_hex64(j, t, "checksum", &s.checksum, err);
    if (st) {
        free(s.file);
        return st;
    }
    if (!wanted) {
        free(s.file);
        m->n_other_split++;
        return ZT_OK;
    }
    m->shards[m->n_shards++] = s;
    return ZT_OK;
}

static zt_status parse_manifest(const char *text, size_t len, const char *origin, const char *split,
                                manifest *m, zt_error *err)
{
    memset(m, 0, sizeof *m);
    zt_json j;
    zt_status st = zt_json_parse(text, len, origin, &j, err);
    if (st) return st;
    int shards;
    if (j.n_tok < 1 || j.tok[0].type != ZT_JSON_OBJECT)
        st = loader_json_fail(&j, 0, err, "the manifest must be an object");
    if (!st) st = parse_header(&j, m, err);
    if (!st) st = parse_tokenizer(&j, 0, m, err);
    if (!st) st = loader_json_member(&j, 0, "shards", "the manifest", &shards, err);
    if (!st && j.tok[shards].type != ZT_JSON_ARRAY)
        st = loader_json_fail(&j, shards, err, "\"shards\" must be an array");
    if (!st) {
        int n = j.tok[shards].size;
        m->shards = calloc(n > 0 ? (size_t)n : 1, sizeof *m->shards);
        if (!m->shards) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", origin);
        int entry = shards + 1;
        for (int i = 0; !st && i < n; i++) {
            st = parse_shard_entry(&j, entry, i, split, m, err);
            entry = zt_json_skip(&j, entry);
        }
    }
    if (!st && m->n_shards == 0)
        st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                          "%s lists no \"%s\" shards (%" PRId64 " of the other split); run zt-prep "
                          "so that it writes a %s split, or use the other split",
                          origin, split, m->n_other_split, split);
    zt_json_free(&j);
    if (st) loader_manifest_free(m);
    return st;
}

zt_status loader_manifest_load(const char *path, const char *dir, const char *split, manifest *m,
                               zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    zt_status st = read_file(path, &text, &len, err);
    if (st == ZT_ERR_NOT_FOUND)
        zt_error_append(err, "\n%s is not a zt-prep data set, or zt-prep did not finish (it writes "
                        "manifest.json last): run zt-prep -o %s", dir, dir);
    if (!st) st = parse_manifest(text, len, path, split, m, err);
    free(text);
    return st;
}

/* ---- the data set's tokenizer ------------------------------------------------------------------ */

static zt_status json_string_into(const zt_json *j, int obj, const char *key, char *dst, size_t cap, zt_error *err)
{
    int t;
    zt_status st = loader_json_member(j, obj, key, "\"tokenizer\"", &t, err);
    if (st) return st;
    if (j->tok[t].type != ZT_JSON_STRING) return loader_json_fail(j, t, err, "\"%s\" must be a string", key);
    char *value = NULL;
    size_t len = 0;
    st = zt_json_string(j, t, &value, &len, err);
    if (!st && len >= cap) st = loader_json_fail(j, t, err, "\"%s\" is longer than %zu bytes", key, cap - 1);
    if (!st) memcpy(dst, value, len + 1);
    free(value);
    return st;
}

zt_status zt_data_tokenizer_read(const char *data_dir, zt_data_tokenizer *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", data_dir, ZT_LOADER_MANIFEST);
    char *text = NULL;
    size_t len = 0;
    zt_status st = read_file(path, &text, &len, err);
    if (st) return st;
    zt_json j;
    st = zt_json_parse(text, len, path, &j, err);
    if (!st) {
        manifest m;
        memset(&m, 0, sizeof m);
        int tok = -1, t;
        if (j.n_tok < 1 || j.tok[0].type != ZT_JSON_OBJECT) st = loader_json_fail(&j, 0, err, "the manifest must be an object");
        if (!st) st = parse_header(&j, &m, err);
        if (!st) st = parse_tokenizer(&j, 0, &m, err);
        if (!st) st = loader_json_member(&j, 0, "tokenizer", "the manifest", &tok, err);
        /* zt-prep always names them; a data set made another way (a test's) may not */
        if (!st && zt_json_object_get(&j, tok, "path") >= 0)
            st = json_string_into(&j, tok, "path", out->path, sizeof out->path, err);
        if (!st && zt_json_object_get(&j, tok, "plugin") >= 0)
            st = json_string_into(&j, tok, "plugin", out->plugin, sizeof out->plugin, err);
        out->unk_id = -1;
        if (!st && (t = zt_json_object_get(&j, tok, "unk_id")) >= 0)
            st = loader_json_integer(&j, t, "unk_id", -1, m.vocab_size - 1, &out->unk_id, err);
        out->hash = m.tokenizer_hash;
        out->vocab_size = m.vocab_size;
        out->bos_id = m.bos_id;
        out->eos_id = m.eos_id;
        out->pad_id = m.pad_id;
        zt_json_free(&j);
    }
    free(text);
    return st;
}
