/* zt-prep --inspect DIR and --stats DIR: read a finished data directory back.
 *
 * --inspect decodes samples with the tokenizer and marks the tokens that carry loss, so a person
 * can see exactly what the model will be trained to produce. Shards are validated with the
 * loader's own check (zt_shard_validate), so what --inspect shows is what training reads.
 */
#define _GNU_SOURCE
#include "prep.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "data/loader.h"

#define LOSS_OPEN_PLAIN "\xe2\x9f\xa6"  /* U+27E6 ⟦ : start of tokens that carry loss */
#define LOSS_CLOSE_PLAIN "\xe2\x9f\xa7" /* U+27E7 ⟧ */
#define LOSS_OPEN_TTY "\x1b[1;32m"
#define LOSS_CLOSE_TTY "\x1b[0m"

typedef struct manifest_doc {
    char *path;
    char *text;
    size_t size;
    zt_json j;
} manifest_doc;

static zt_status manifest_open(const char *dir, manifest_doc *m, zt_error *err)
{
    memset(m, 0, sizeof *m);
    size_t n = strlen(dir) + 32;
    m->path = prep_xmalloc(n, "a path");
    snprintf(m->path, n, "%s/manifest.json", dir);
    zt_status st = zt_read_file(m->path, &m->text, &m->size, err);
    if (st == ZT_ERR_NOT_FOUND)
        return zt_error_set(err, st, "'%s' has no manifest.json, so it is not a complete zt-prep "
                            "output (an interrupted run leaves none); run zt-prep again", dir);
    if (st != ZT_OK) return st;
    st = zt_json_parse(m->text, m->size, m->path, &m->j, err);
    if (st != ZT_OK) return st;
    if (m->j.n_tok == 0 || m->j.tok[0].type != ZT_JSON_OBJECT)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s is not a JSON object", m->path);
    return ZT_OK;
}

static void manifest_close(manifest_doc *m)
{
    zt_json_free(&m->j);
    free(m->text);
    free(m->path);
}

/* Token of a dotted path like "statistics.sample_tokens.p50", or -1. */
static int get(const manifest_doc *m, const char *dotted)
{
    int tok = 0;
    char key[128];
    for (const char *p = dotted; tok >= 0 && *p;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        snprintf(key, sizeof key, "%.*s", (int)n, p);
        if (m->j.tok[tok].type != ZT_JSON_OBJECT) return -1;
        tok = zt_json_object_get(&m->j, tok, key);
        p += n + (dot ? 1 : 0);
    }
    return tok;
}

/* The raw text of a value token (numbers, and strings without their quotes). */
static const char *raw(const manifest_doc *m, int tok, char *buf, size_t cap)
{
    if (tok < 0) return "?";
    snprintf(buf, cap, "%.*s", m->j.tok[tok].end - m->j.tok[tok].start, m->text + m->j.tok[tok].start);
    return buf;
}

static char *get_string(const manifest_doc *m, const char *dotted)
{
    int t = get(m, dotted);
    char *s = NULL;
    size_t len;
    zt_error err;
    if (t < 0 || m->j.tok[t].type != ZT_JSON_STRING || zt_json_string(&m->j, t, &s, &len, &err) != ZT_OK)
        return NULL;
    return s;
}

static uint64_t get_u64(const manifest_doc *m, const char *dotted)
{
    int t = get(m, dotted);
    return t < 0 ? 0 : strtoull(m->text + m->j.tok[t].start, NULL, 10);
}

static uint64_t get_hex(const manifest_doc *m, int tok)
{
    return tok < 0 ? 0 : strtoull(m->text + m->j.tok[tok].start, NULL, 16);
}

/* ---- --inspect ---------------------------------------------------------------------------------- */

/* Print a piece or decoded text with control characters made visible (for --tokens). */
static void print_escaped(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

typedef struct inspector {
    prep_tokenizer *tok;
    int tty;
    prep_buf text;
    int32_t *ids;
    size_t cap_ids;
} inspector;

static int is_special(const prep_tokenizer *t, int32_t id)
{
    return id == t->info.bos_id || id == t->info.eos_id || id == t->info.pad_id;
}

/* Decode ids[0, n) (one loss state) with special ids shown as their pieces ("<s>", "</s>"). */
static zt_status print_run(inspector *in, const int32_t *ids, size_t n, zt_error *err)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        if (is_special(in->tok, ids[i])) {
            zt_status st = prep_tokenizer_piece(in->tok, ids[i], &in->text, err);
            if (st != ZT_OK) return st;
            j = i + 1;
        } else {
            while (j < n && !is_special(in->tok, ids[j])) j++;
            zt_status st = prep_tokenizer_decode(in->tok, ids + i, j - i, &in->text, err);
            if (st != ZT_OK) return st;
        }
        fwrite(in->text.data, 1, in->text.len, stdout);
        i = j;
    }
    return ZT_OK;
}

static zt_status show_sample(inspector *in, const zt_shard_view *v, uint64_t s, const char *file,
                             int show_tokens, zt_error *err)
{
    uint64_t begin = v->index[s], end = v->index[s + 1], n = end - begin;
    if (n > in->cap_ids) {
        in->cap_ids = (size_t)n;
        in->ids = prep_xrealloc(in->ids, in->cap_ids * sizeof *in->ids, "sample ids");
    }
    uint64_t n_loss = 0;
    for (uint64_t i = 0; i < n; i++) {
        in->ids[i] = v->token_bytes == 2 ? ((const uint16_t *)v->tokens)[begin + i]
                                         : (int32_t)((const uint32_t *)v->tokens)[begin + i];
        n_loss += v->mask[begin + i];
    }
    const uint8_t *mask = v->mask + begin;
    printf("=== sample %" PRIu64 " of %s: %" PRIu64 " tokens, %" PRIu64 " carry loss ===\n", s, file,
           n, n_loss);
    for (uint64_t i = 0; i < n;) {
        uint64_t j = i;
        while (j < n && mask[j] == mask[i]) j++;
        if (mask[i]) fputs(in->tty ? LOSS_OPEN_TTY : LOSS_OPEN_PLAIN, stdout);
        zt_status st = print_run(in, in->ids + i, (size_t)(j - i), err);
        if (st != ZT_OK) return st;
        if (mask[i]) fputs(in->tty ? LOSS_CLOSE_TTY : LOSS_CLOSE_PLAIN, stdout);
        i = j;
    }
    fputs("\n", stdout);
    if (show_tokens) {
        printf("%8s %8s  %s  %s\n", "position", "id", "loss", "piece");
        for (uint64_t i = 0; i < n; i++) {
            zt_status st = prep_tokenizer_piece(in->tok, in->ids[i], &in->text, err);
            if (st != ZT_OK) return st;
            printf("%8" PRIu64 " %8d  %s  ", i, in->ids[i], mask[i] ? "  L " : "  - ");
            print_escaped(in->text.data, in->text.len);
            putchar('\n');
        }
    }
    return ZT_OK;
}

static zt_status map_shard(const char *path, uint8_t **data, uint64_t *size, zt_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zt_error_set(err, ZT_ERR_NOT_FOUND, "cannot open shard '%s' listed in manifest.json: %s",
                            path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size == 0) {
        close(fd);
        return zt_error_set(err, ZT_ERR_FORMAT, "shard '%s' is empty", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return zt_error_set(err, ZT_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
    *data = p;
    *size = (uint64_t)st.st_size;
    return ZT_OK;
}

int prep_inspect_main(const prep_options *opt, const char *dir, int n_samples, int show_tokens,
                      const char *split)
{
    zt_error err;
    zt_error_clear(&err);
    manifest_doc m;
    prep_tokenizer tok;
    memset(&tok, 0, sizeof tok);
    inspector in = {.tok = &tok, .tty = isatty(STDOUT_FILENO)};
    char *recorded_path = NULL;
    zt_status st = manifest_open(dir, &m, &err);
    if (st == ZT_OK) {
        recorded_path = get_string(&m, "tokenizer.path");
        const char *path = opt->tokenizer_path ? opt->tokenizer_path : recorded_path;
        if (!path) st = zt_error_set(&err, ZT_ERR_FORMAT, "%s names no tokenizer; pass -t MODEL", m.path);
        else st = prep_tokenizer_open(&tok, opt->tokenizer_plugin, opt->plugin_dirs,
                                      opt->n_plugin_dirs, path, &err);
        if (st != ZT_OK && !opt->tokenizer_path)
            zt_error_append(&err, "\n(the tokenizer path comes from %s; pass -t MODEL to use another copy)",
                            m.path);
    }
    uint64_t want_hash = st == ZT_OK ? get_hex(&m, get(&m, "tokenizer.hash")) : 0;
    if (st == ZT_OK && tok.info.model_hash != want_hash)
        st = zt_error_set(&err, ZT_ERR_INVALID_ARG,
                          "tokenizer '%s' (hash %016" PRIx64 ") is not the one these shards were made "
                          "with (hash %016" PRIx64 " in %s); pass -t with that tokenizer",
                          tok.path, tok.info.model_hash, want_hash, m.path);
    int shards = st == ZT_OK ? get(&m, "shards") : -1;
    if (st == ZT_OK && (shards < 0 || m.j.tok[shards].type != ZT_JSON_ARRAY))
        st = zt_error_set(&err, ZT_ERR_FORMAT, "%s has no \"shards\" array", m.path);
    int shown = 0, n_split_shards = 0;
    if (st == ZT_OK) {
        char *template_name = get_string(&m, "template.name");
        printf("%s: template %s, tokenizer %s (vocab %d), %s split; loss tokens are marked %s\n", dir,
               template_name ? template_name : "?", tok.path, tok.info.vocab_size, split,
               in.tty ? "in green" : "between " LOSS_OPEN_PLAIN " and " LOSS_CLOSE_PLAIN);
        free(template_name);
    }
    for (int k = shards + 1, i = 0; st == ZT_OK && i < m.j.tok[shards].size && shown < n_samples; i++) {
        int entry = k;
        k = zt_json_skip(&m.j, k);
        int split_tok = zt_json_object_get(&m.j, entry, "split");
        if (split_tok < 0 || !zt_json_eq(&m.j, split_tok, split)) continue;
        n_split_shards++;
        char file[256];
        int ft = zt_json_object_get(&m.j, entry, "file");
        raw(&m, ft, file, sizeof file);
        if (ft < 0 || strchr(file, '/') || file[0] == '.') {
            st = zt_error_set(&err, ZT_ERR_FORMAT, "%s: shards[%d] has no plain \"file\" name", m.path, i);
            break;
        }
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        uint8_t *data = NULL;
        uint64_t size = 0;
        st = map_shard(path, &data, &size, &err);
        if (st != ZT_OK) break;
        zt_shard_expect expect = {
            .check_tokenizer = 1,
            .check_split = 1,
            .check_file_checksum = 1,
            .validation = strcmp(split, "val") == 0,
            .verify_checksums = 1,
            .tokenizer_hash = want_hash,
            .vocab_size = (uint64_t)tok.info.vocab_size,
            .file_checksum = get_hex(&m, zt_json_object_get(&m.j, entry, "checksum")),
        };
        zt_shard_view v;
        st = zt_shard_validate(data, size, path, &expect, &v, &err);
        for (uint64_t s = 0; st == ZT_OK && s < v.n_samples && shown < n_samples; s++, shown++)
            st = show_sample(&in, &v, s, file, show_tokens, &err);
        munmap(data, (size_t)size);
    }
    if (st == ZT_OK && n_split_shards == 0)
        st = zt_error_set(&err, ZT_ERR_NOT_FOUND, "%s lists no %s shards%s", m.path, split,
                          strcmp(split, "val") == 0 ? " (the run kept no validation samples; see "
                                                      "--val-fraction)" : "");
    int rc = 0;
    if (st != ZT_OK) {
        prep_fail("%s", err.msg);
        rc = 1;
    }
    free(recorded_path);
    free(in.ids);
    prep_buf_free(&in.text);
    prep_tokenizer_close(&tok);
    manifest_close(&m);
    return rc;
}

/* ---- --stats ------------------------------------------------------------------------------------ */

static void print_counts(const manifest_doc *m, const char *dotted, const char *title)
{
    int obj = get(m, dotted);
    if (obj < 0 || m->j.tok[obj].type != ZT_JSON_OBJECT) return;
    int printed = 0;
    char name[256], value[64];
    for (int k = obj + 1, i = 0; i < m->j.tok[obj].size; i++) {
        int v = k + 1;
        raw(m, v, value, sizeof value);
        if (strcmp(value, "0") != 0) {
            if (!printed++) printf("\n%s\n", title);
            printf("  %-28s %12s\n", raw(m, k, name, sizeof name), value);
        }
        k = zt_json_skip(&m->j, v);
    }
    if (!printed) printf("\n%s\n  (none)\n", title);
}

int prep_stats_main(const char *dir)
{
    zt_error err;
    zt_error_clear(&err);
    manifest_doc m;
    if (manifest_open(dir, &m, &err) != ZT_OK) {
        prep_fail("%s", err.msg);
        manifest_close(&m);
        return 1;
    }
    char a[128], b[128], c[128], d[128], e[128], f[128];
    printf("%s (zt-prep %s)\n", m.path, raw(&m, get(&m, "zt_version"), a, sizeof a));

    printf("\ninputs\n  %-44s %12s %10s %8s\n", "file", "bytes", "records", "bad");
    int inputs = get(&m, "inputs");
    for (int k = inputs + 1, i = 0; inputs >= 0 && i < m.j.tok[inputs].size; i++) {
        printf("  %-44s %12s %10s %8s\n", raw(&m, zt_json_object_get(&m.j, k, "path"), a, sizeof a),
               raw(&m, zt_json_object_get(&m.j, k, "bytes"), b, sizeof b),
               raw(&m, zt_json_object_get(&m.j, k, "records"), c, sizeof c),
               raw(&m, zt_json_object_get(&m.j, k, "bad_records"), d, sizeof d));
        k = zt_json_skip(&m.j, k);
    }
    printf("\ntokenizer  %s (%s, vocab %s)\n", raw(&m, get(&m, "tokenizer.path"), a, sizeof a),
           raw(&m, get(&m, "tokenizer.model_type"), b, sizeof b),
           raw(&m, get(&m, "tokenizer.vocab_size"), c, sizeof c));
    printf("template   %s\n", raw(&m, get(&m, "template.name"), a, sizeof a));
    printf("options    max_len %s, layout %s, overlong %s, val_fraction %s, seed %s, shuffle %s\n",
           raw(&m, get(&m, "options.max_len"), a, sizeof a),
           raw(&m, get(&m, "options.layout"), b, sizeof b),
           raw(&m, get(&m, "options.overlong"), c, sizeof c),
           raw(&m, get(&m, "options.val_fraction"), d, sizeof d),
           raw(&m, get(&m, "options.seed"), e, sizeof e),
           raw(&m, get(&m, "options.shuffle"), f, sizeof f));
    if (get(&m, "options.fields") >= 0) { /* manifests of zt-prep before --field and --dedup lack them */
        char fields[512];
        printf("           dedup %s, fields %s\n", raw(&m, get(&m, "options.dedup"), a, sizeof a),
               raw(&m, get(&m, "options.fields"), fields, sizeof fields));
    }

    uint64_t read = get_u64(&m, "statistics.records_read");
    printf("\nrecords\n");
    const char *rows[][2] = {{"read", "statistics.records_read"},
                             {"kept", "statistics.records_kept"},
                             {"truncated", "statistics.records_truncated"},
                             {"duplicate (same sample)", "statistics.records_duplicate"},
                             {"dropped", "statistics.records_dropped"},
                             {"bad", "statistics.records_bad"},
                             {"with history", "statistics.records_with_history"},
                             {"with system", "statistics.records_with_system"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        uint64_t v = get_u64(&m, rows[i][1]);
        printf("  %-28s %12" PRIu64 " %7.2f%%\n", rows[i][0], v, read ? 100.0 * (double)v / (double)read : 0.0);
    }
    print_counts(&m, "statistics.truncated", "truncated by kind");
    print_counts(&m, "statistics.dropped", "dropped by reason");
    print_counts(&m, "statistics.bad_records", "bad records by reason");
    print_counts(&m, "statistics.unknown_fields", "unknown fields (ignored), records having each");

    printf("\ntokens\n  %-28s %12s\n  %-28s %12s\n  %-28s %12s\n", "total",
           raw(&m, get(&m, "statistics.tokens"), a, sizeof a), "carrying loss",
           raw(&m, get(&m, "statistics.loss_tokens"), b, sizeof b), "loss share",
           raw(&m, get(&m, "statistics.loss_token_share"), c, sizeof c));
    printf("  %-28s %s / %s / %s (mean %s)\n", "sample length p50/p95/max",
           raw(&m, get(&m, "statistics.sample_tokens.p50"), a, sizeof a),
           raw(&m, get(&m, "statistics.sample_tokens.p95"), b, sizeof b),
           raw(&m, get(&m, "statistics.sample_tokens.max"), c, sizeof c),
           raw(&m, get(&m, "statistics.sample_tokens.mean"), d, sizeof d));
    printf("  %-28s %s train, %s validation\n", "samples",
           raw(&m, get(&m, "statistics.train_samples"), a, sizeof a),
           raw(&m, get(&m, "statistics.val_samples"), b, sizeof b));

    printf("\nshards (%s tokens)\n  %-24s %-6s %10s %12s %14s  %s\n",
           raw(&m, get(&m, "token_dtype"), a, sizeof a), "file", "split", "samples", "tokens",
           "bytes", "checksum");
    int shards = get(&m, "shards");
    for (int k = shards + 1, i = 0; shards >= 0 && i < m.j.tok[shards].size; i++) {
        printf("  %-24s %-6s %10s %12s %14s  %s\n", raw(&m, zt_json_object_get(&m.j, k, "file"), a, sizeof a),
               raw(&m, zt_json_object_get(&m.j, k, "split"), b, sizeof b),
               raw(&m, zt_json_object_get(&m.j, k, "samples"), c, sizeof c),
               raw(&m, zt_json_object_get(&m.j, k, "tokens"), d, sizeof d),
               raw(&m, zt_json_object_get(&m.j, k, "bytes"), e, sizeof e),
               raw(&m, zt_json_object_get(&m.j, k, "checksum"), f, sizeof f));
        k = zt_json_skip(&m.j, k);
    }
    manifest_close(&m);
    return 0;
}
