/* The sentencepiece plugin's chunked encoding (plugins/sentencepiece/chunked_encoder.h) against
 * libsentencepiece encoding each text whole, as recorded by make_chunk_references.py with
 * spm_encode and the Python binding:
 *   trained  the models make_references.sh trains, on the awkward texts; bpe and bpe_trim also
 *            with a cache too small for them (full after the first few hundred chunks), and off
 *   shared   the LLaMA-2 and Chinese-LLaMA tokenizers of ../shared/data on the awkward texts and on
 *            every instruction, input and output of every Alpaca file there
 * Each model must be encoded the way its open() log line says (in chunks: BPE without
 * normalization rules; whole: everything else), and a second pass over the texts, now served by
 * the cache, must give the same ids again.
 *
 *   test_spm_chunked PLUGINS_D WORK_DIR trained
 *   test_spm_chunked PLUGINS_D WORK_DIR shared SHARED_DATA_DIR */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tk_common.h"
#include "ztest.h"

static const char k_in_chunks[] = "encoding in chunks cut where no piece can span";
static const char k_not_exact[] = "encoding every text whole; encoding in chunks would not be exact: ";

typedef struct model_case {
    const char *name;       /* the .model file without its extension */
    const char *open_log;   /* what the log line of open() must say */
    const char *open_log2;  /* and, when not NULL, this too */
} model_case;

static const model_case trained_models[] = {
    {"bpe", k_in_chunks, NULL},
    {"bpe_trim", k_in_chunks, NULL},
    {"bpe_suffix", k_in_chunks, NULL},
    {"bpe_nosplit", k_in_chunks, NULL},
    {"bpe_nfkc", k_not_exact, "its normalizer 'nmt_nfkc' rewrites text with rules"},
    {"bpe_spaced", k_not_exact, "('New York') contains a space"},
    {"bpe_unused", k_not_exact, "') is UNUSED, and BPE re-splits such pieces"},
    {"unigram", k_not_exact, "it is a unigram model"},
};

static const model_case shared_models[] = {
    {"llama2_tokenizer", k_in_chunks, NULL},
    {"chinese_llama2_tokenizer", k_in_chunks, NULL},
};

/* A .texts file: 4-byte little-endian length, then the UTF-8 bytes, per text. */
typedef struct texts {
    char *data;
    size_t count;
    const char **text;
    size_t *len;
} texts;

static void read_texts(const char *path, texts *out)
{
    size_t size, cap = 1024;
    memset(out, 0, sizeof *out);
    out->data = tk_read_file(path, &size);
    out->text = malloc(cap * sizeof *out->text);
    out->len = malloc(cap * sizeof *out->len);
    for (size_t pos = 0; pos < size;) {
        uint32_t n = 0;
        if (size - pos >= 4) memcpy(&n, out->data + pos, 4);
        if (size - pos < 4 || n > size - pos - 4) {
            fprintf(stderr, "%s: text %zu at byte %zu runs past the end of the file (%zu bytes); "
                            "run the tokenizer fixtures again (ctest -R tokenizer)\n",
                    path, out->count, pos, size);
            exit(1);
        }
        if (out->count == cap) {
            cap *= 2;
            out->text = realloc(out->text, cap * sizeof *out->text);
            out->len = realloc(out->len, cap * sizeof *out->len);
        }
        if (!out->text || !out->len) {
            fprintf(stderr, "out of memory reading %s\n", path);
            exit(1);
        }
        out->text[out->count] = out->data + pos + 4;
        out->len[out->count] = n;
        out->count++;
        pos += 4 + (size_t)n;
    }
}

static void free_texts(texts *t)
{
    free(t->data);
    free(t->text);
    free(t->len);
}

/* The start of a text for a message, control characters as \xHH. */
static const char *preview(const char *text, size_t len)
{
    static char out[256];
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < sizeof out; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c < 0x20) o += (size_t)snprintf(out + o, sizeof out - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    out[o] = '\0';
    return out;
}

/* Encode every text twice and compare with the reference ids; returns the texts that differ. */
static int compare_with_reference(tk_plugin *p, zt_tokenizer_model *m, const char *model,
                                  const char *corpus, const texts *t, const tk_lines *ref)
{
    ZT_CHECK_INT(ref->count, t->count);
    int mismatches = 0;
    for (int pass = 1; pass <= 2; pass++) {
        for (size_t i = 0; i < t->count && i < ref->count; i++) {
            size_t n_want = 0;
            uint64_t n_got = 0;
            int32_t *want = tk_parse_ids(ref->line[i], &n_want);
            int32_t *got = tk_encode(p, m, t->text[i], t->len[i], &n_got);
            if (n_got != n_want || memcmp(got, want, n_want * sizeof *want) != 0) {
                if (mismatches++ < 5)
                    fprintf(stderr,
                            "%s, %s text %zu (pass %d): %llu ids, libsentencepiece %zu: \"%s\"\n",
                            model, corpus, i, pass, (unsigned long long)n_got, n_want,
                            preview(t->text[i], t->len[i]));
            }
            free(want);
            free(got);
        }
    }
    return mismatches;
}

typedef struct cache_report {
    int found; /* close() logged cache statistics */
    unsigned long long lookups, hits, not_cached;
} cache_report;

/* Open model_dir/NAME.model, check the open() log line, compare with the references in `work` on
 * each corpus, close, and return the cache statistics close() logged. */
static cache_report check_model(tk_plugin *p, const char *model_dir, const char *work,
                                const model_case *mc, const char *const *corpora, size_t n_corpora)
{
    char path[4096];
    int len = snprintf(path, sizeof path, "%s/%s.model", model_dir, mc->name);
    ZT_CHECK(len > 0 && (size_t)len < sizeof path); /* a longer data path would open the wrong file */
    tk_stderr_capture_start();
    zt_tokenizer_model *m = tk_open(p, path);
    char *open_log = tk_stderr_capture_end();
    ZT_CHECK_CONTAINS(open_log, mc->open_log);
    if (mc->open_log2) ZT_CHECK_CONTAINS(open_log, mc->open_log2);
    free(open_log);

    for (size_t c = 0; c < n_corpora; c++) {
        char name[256];
        texts t;
        tk_lines ref;
        snprintf(name, sizeof name, "chunk-%s.texts", corpora[c]);
        read_texts(tk_path(work, name), &t);
        snprintf(name, sizeof name, "chunk-%s-%s.ids", corpora[c], mc->name);
        tk_read_lines(tk_path(work, name), &ref);
        ZT_CHECK(t.count > 500);
        int mismatches = compare_with_reference(p, m, mc->name, corpora[c], &t, &ref);
        fprintf(stderr, "%s on %s: %zu texts, encoded twice, %d differ from libsentencepiece\n",
                mc->name, corpora[c], t.count, mismatches);
        ZT_CHECK_INT(mismatches, 0);
        free_texts(&t);
        tk_lines_free(&ref);
    }

    tk_stderr_capture_start();
    p->ops->close(m);
    char *close_log = tk_stderr_capture_end();
    cache_report r = {0};
    r.found = tk_log_number(close_log, " lookups, ", &r.lookups) &&
              tk_log_number(close_log, " hits (", &r.hits) &&
              tk_log_number(close_log, " not cached (cache full)", &r.not_cached);
    free(close_log);
    return r;
}

static void check_trained(const char *plugins_d, const char *work)
{
    const char *awkward[] = {"awkward"};
    tk_plugin p;
    tk_plugin_load(&p, plugins_d);
    for (size_t i = 0; i < sizeof trained_models / sizeof trained_models[0]; i++) {
        const model_case *mc = &trained_models[i];
        cache_report r = check_model(&p, work, work, mc, awkward, 1);
        int in_chunks = mc->open_log == k_in_chunks;
        ZT_CHECK_INT(r.found, in_chunks);
        /* The second pass repeats every chunk of the first. */
        if (in_chunks) ZT_CHECK(r.lookups > 0 && 2 * r.hits >= r.lookups);
    }
    tk_plugin_unload(&p);

    /* 16 KiB: a table of 512 slots, so at most 256 chunks are cached. */
    tk_plugin_load_config(&p, plugins_d, "{\"tokenizer\": {\"chunk_cache\": \"16K\"}}");
    for (size_t i = 0; i < 2; i++) {
        cache_report r = check_model(&p, work, work, &trained_models[i], awkward, 1);
        ZT_CHECK(r.found);
        if (r.not_cached == 0) fprintf(stderr, "%s: a 16K cache never filled up\n",
                                       trained_models[i].name);
        ZT_CHECK(r.not_cached > 0);
        ZT_CHECK(r.hits > 0);
    }
    tk_plugin_unload(&p);

    /* 20 bytes: a table of one slot, which is never used (at least half stays free). */
    tk_plugin_load_config(&p, plugins_d, "{\"tokenizer\": {\"chunk_cache\": 20}}");
    model_case tiny = {"bpe_trim", "with a cache of up to 20 bytes", NULL};
    cache_report tiny_report = check_model(&p, work, work, &tiny, awkward, 1);
    ZT_CHECK(tiny_report.found && tiny_report.hits == 0 && tiny_report.not_cached > 0);
    tk_plugin_unload(&p);

    tk_plugin_load_config(&p, plugins_d, "{\"tokenizer\": {\"chunk_cache\": 0}}");
    for (size_t i = 0; i < 2; i++) {
        model_case off = {trained_models[i].name,
                          "encoding every text whole (tokenizer.chunk_cache is 0)", NULL};
        cache_report r = check_model(&p, work, work, &off, awkward, 1);
        ZT_CHECK(!r.found);
    }
    tk_plugin_unload(&p);
}

static void check_shared(const char *plugins_d, const char *work, const char *shared)
{
    const char *corpora[] = {"awkward", "alpaca"};
    char tokenizers[4096];
    snprintf(tokenizers, sizeof tokenizers, "%s/tokenizers", shared);
    tk_plugin p;
    tk_plugin_load(&p, plugins_d);
    for (size_t i = 0; i < sizeof shared_models / sizeof shared_models[0]; i++) {
        cache_report r = check_model(&p, tokenizers, work, &shared_models[i], corpora, 2);
        ZT_CHECK(r.found);
        ZT_CHECK(r.lookups > 0 && 2 * r.hits >= r.lookups);
    }
    tk_plugin_unload(&p);
}

int main(int argc, char **argv)
{
    int trained = argc == 4 && strcmp(argv[3], "trained") == 0;
    int shared = argc == 5 && strcmp(argv[3], "shared") == 0;
    if (!trained && !shared) {
        fprintf(stderr, "usage: %s PLUGINS_D WORK_DIR trained | PLUGINS_D WORK_DIR shared SHARED_DATA_DIR\n",
                argv[0]);
        return 2;
    }
    struct stat st;
    if (shared && (stat(argv[4], &st) != 0 || !S_ISDIR(st.st_mode)))
        ZT_SKIP("%s does not exist: the real-tokenizer tests need the shared data folder", argv[4]);
    /* The fixture skips without a python3 that has the sentencepiece module. */
    const char *texts_file = tk_path(argv[2], trained ? "chunk-awkward.texts" : "chunk-alpaca.texts");
    if (stat(texts_file, &st) != 0)
        ZT_SKIP("%s does not exist: the fixture make_chunk_references.py did not run (it needs "
                "python3 with the sentencepiece module: apt-get install python3-sentencepiece)",
                texts_file);
    if (trained) check_trained(argv[1], argv[2]);
    else check_shared(argv[1], argv[2], argv[4]);
    return zt_test_result();
}
