/* The sentencepiece plugin on real third-party tokenizers from ../shared/data (skipped when that
 * folder is absent):
 *   - llama2_tokenizer_golden.jsonl: ids made by the sentencepiece Python binding must match exactly,
 *     and decoding them must give the text back;
 *   - every .model in tokenizers/ loads, with the vocabulary size, type and special ids that
 *     PROVENANCE.md lists (T5: no BOS, pad 0, eos 1, unk 2) and the host's FNV-1a of the file;
 *   - chinese_sp.model (unigram, NFKC) encodes Chinese text exactly as spm_encode does.
 *
 *   test_spm_shared PLUGINS_D SHARED_DATA_DIR WORK_DIR */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/checksum.h"
#include "base/json.h"
#include "tk_common.h"
#include "ztest.h"

static tk_plugin plugin;

/* From the tokenizer table of shared/data/PROVENANCE.md. */
typedef struct known_model {
    const char *file;
    const char *type;
    int32_t vocab_size, bos_id, eos_id, unk_id, pad_id;
} known_model;

static const known_model known[] = {
    {"llama2_tokenizer.model", "bpe", 32000, 1, 2, 0, -1},
    {"chinese_llama2_tokenizer.model", "bpe", 55296, 1, 2, 0, -1},
    {"chinese_sp.model", "unigram", 20000, 1, 2, 0, -1},
    {"spm_test_model.model", "unigram", 1000, 1, 2, 0, -1},
    {"spm_test_ja_model.model", "unigram", 8000, 1, 2, 0, -1},
    {"t5_spiece_torchtune.model", "unigram", 32000, -1, 1, 2, 0},
};
#define N_KNOWN (sizeof known / sizeof known[0])

static void check_every_model(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "cannot list %s\n", dir);
        zt_test_failures++;
        return;
    }
    int seen[N_KNOWN] = {0};
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 6, ".model") != 0) continue;
        const char *path = tk_path(dir, e->d_name);
        zt_tokenizer_model *m = NULL;
        zt_status st = plugin.ops->open(plugin.state, path, &m);
        if (st != ZT_OK) {
            fprintf(stderr, "%s does not load: %s\n", path, tk_take_error(&plugin, NULL));
            zt_test_failures++;
            continue;
        }
        zt_tokenizer_info info = {.struct_size = sizeof info};
        ZT_CHECK_INT(plugin.ops->info(m, &info), ZT_OK);
        size_t size;
        char *bytes = tk_read_file(path, &size);
        ZT_CHECK(info.model_hash == zt_fnv1a64(ZT_FNV1A64_INIT, bytes, size));
        free(bytes);
        for (size_t k = 0; k < N_KNOWN; k++) {
            if (strcmp(known[k].file, e->d_name) != 0) continue;
            seen[k] = 1;
            fprintf(stderr, "%s: %s, vocab %d, bos %d eos %d unk %d pad %d\n", e->d_name,
                    info.model_type, info.vocab_size, info.bos_id, info.eos_id, info.unk_id,
                    info.pad_id);
            ZT_CHECK(strcmp(info.model_type, known[k].type) == 0);
            ZT_CHECK_INT(info.vocab_size, known[k].vocab_size);
            ZT_CHECK_INT(info.bos_id, known[k].bos_id);
            ZT_CHECK_INT(info.eos_id, known[k].eos_id);
            ZT_CHECK_INT(info.unk_id, known[k].unk_id);
            ZT_CHECK_INT(info.pad_id, known[k].pad_id);
        }
        plugin.ops->close(m);
    }
    closedir(d);
    for (size_t k = 0; k < N_KNOWN; k++)
        if (!seen[k]) {
            fprintf(stderr, "%s/%s is missing\n", dir, known[k].file);
            zt_test_failures++;
        }
}

/* One golden record: {"source": ..., "text": "...", "ids": [...]}. Returns 1 when it matches. */
static int check_golden_record(zt_tokenizer_model *m, const char *line, size_t len, const char *origin)
{
    static zt_error err;
    zt_json j;
    if (zt_json_parse(line, len, origin, &j, &err) != ZT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 0;
    }
    int ok = 0;
    char *text = NULL;
    size_t text_len = 0;
    int text_tok = zt_json_object_get(&j, 0, "text"), ids_tok = zt_json_object_get(&j, 0, "ids");
    if (text_tok < 0 || ids_tok < 0 || j.tok[ids_tok].type != ZT_JSON_ARRAY) {
        fprintf(stderr, "%s: expected \"text\" and an \"ids\" array\n", origin);
    } else if (zt_json_string(&j, text_tok, &text, &text_len, &err) != ZT_OK) {
        fprintf(stderr, "%s\n", err.msg);
    } else {
        size_t n_want = (size_t)j.tok[ids_tok].size;
        int32_t *want = malloc((n_want + 1) * sizeof *want);
        if (!want) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        int t = ids_tok + 1;
        for (size_t i = 0; i < n_want; i++, t = zt_json_skip(&j, t))
            want[i] = (int32_t)zt_json_get_number(&j, t);
        uint64_t n_got = 0, decoded_len = 0;
        int32_t *got = tk_encode(&plugin, m, text, text_len, &n_got);
        char *decoded = tk_decode(&plugin, m, want, n_want, &decoded_len);
        int same_ids = n_got == n_want && memcmp(got, want, n_want * sizeof *want) == 0;
        int round_trip = decoded_len == text_len && memcmp(decoded, text, text_len) == 0;
        if (!same_ids || !round_trip)
            fprintf(stderr, "%s: %s (%llu ids, golden %zu)%s\n", origin,
                    same_ids ? "ids equal" : "ids DIFFER", (unsigned long long)n_got, n_want,
                    round_trip ? "" : "; decoding the golden ids does not give the text back");
        ok = same_ids && round_trip;
        free(want);
        free(got);
        free(decoded);
    }
    free(text);
    zt_json_free(&j);
    return ok;
}

static void check_llama2_golden(const char *tokenizers)
{
    zt_tokenizer_model *m = tk_open(&plugin, tk_path(tokenizers, "llama2_tokenizer.model"));
    tk_lines golden;
    tk_read_lines(tk_path(tokenizers, "llama2_tokenizer_golden.jsonl"), &golden);
    ZT_CHECK_INT(golden.count, 262);
    int mismatches = 0;
    for (size_t i = 0; i < golden.count; i++) {
        char origin[64];
        snprintf(origin, sizeof origin, "llama2_tokenizer_golden.jsonl:%zu", i + 1);
        mismatches += !check_golden_record(m, golden.line[i], golden.len[i], origin);
    }
    ZT_CHECK_INT(mismatches, 0);
    tk_lines_free(&golden);
    plugin.ops->close(m);
}

static void check_chinese_unigram(const char *tokenizers, const char *work)
{
    zt_tokenizer_model *m = tk_open(&plugin, tk_path(tokenizers, "chinese_sp.model"));
    tk_lines texts, ref;
    tk_read_lines(tk_path(work, "chinese.txt"), &texts);
    tk_read_lines(tk_path(work, "chinese_sp.ids"), &ref);
    ZT_CHECK(texts.count > 100);
    ZT_CHECK_INT(ref.count, texts.count);
    int mismatches = 0;
    for (size_t i = 0; i < texts.count && i < ref.count; i++) {
        size_t n_want;
        uint64_t n_got;
        int32_t *want = tk_parse_ids(ref.line[i], &n_want);
        int32_t *got = tk_encode(&plugin, m, texts.line[i], texts.len[i], &n_got);
        if (n_got != n_want || memcmp(got, want, n_want * sizeof *want) != 0) {
            if (mismatches++ < 5)
                fprintf(stderr, "chinese.txt line %zu \"%s\": ids differ from spm_encode\n", i + 1,
                        texts.line[i]);
        }
        free(want);
        free(got);
    }
    ZT_CHECK_INT(mismatches, 0);
    tk_lines_free(&texts);
    tk_lines_free(&ref);
    plugin.ops->close(m);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PLUGINS_D SHARED_DATA_DIR WORK_DIR\n", argv[0]);
        return 2;
    }
    struct stat st;
    if (stat(argv[2], &st) != 0 || !S_ISDIR(st.st_mode))
        ZT_SKIP("%s does not exist: the real-tokenizer tests need the shared data folder", argv[2]);
    char tokenizers[4096];
    snprintf(tokenizers, sizeof tokenizers, "%s/tokenizers", argv[2]);

    tk_plugin_load(&plugin, argv[1]);
    check_every_model(tokenizers);
    check_llama2_golden(tokenizers);
    check_chinese_unigram(tokenizers, argv[3]);
    tk_plugin_unload(&plugin);
    return zt_test_result();
}
