/* The sentencepiece plugin against the sentencepiece CLI on two models trained by the fixture
 * (make_references.sh): ids equal spm_encode's on every line, decode equals spm_decode, pieces and
 * special ids equal spm_export_vocab and the training flags, and the model hash equals the host's
 * FNV-1a of the file.
 *
 *   test_spm_reference PLUGINS_D WORK_DIR */
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "tk_common.h"
#include "ztest.h"

/* What make_references.sh asked spm_train for. */
typedef struct trained_model {
    const char *name;
    const char *type;
    int32_t vocab_size, unk_id, bos_id, eos_id, pad_id;
    int round_trips; /* identity normalizer + byte fallback: decode(encode(x)) == x */
} trained_model;

static const trained_model trained[] = {
    {"bpe", "bpe", 1000, 0, 1, 2, 3, 1},
    {"unigram", "unigram", 500, 2, -1, 1, 0, 0},
};

/* The id of a special piece in the exported vocabulary, -1 when the model has none. */
static int32_t vocab_id_of(const tk_lines *vocab, const char *piece)
{
    size_t n = strlen(piece);
    for (size_t i = 0; i < vocab->count; i++)
        if (strncmp(vocab->line[i], piece, n) == 0 && vocab->line[i][n] == '\t') return (int32_t)i;
    return -1;
}

static void check_info_and_vocab(tk_plugin *p, zt_tokenizer_model *m, const trained_model *t,
                                 const char *work)
{
    zt_tokenizer_info info = {.struct_size = sizeof info};
    ZT_CHECK_INT(p->ops->info(m, &info), ZT_OK);
    ZT_CHECK(strcmp(info.model_type, t->type) == 0);
    ZT_CHECK_INT(info.vocab_size, t->vocab_size);
    ZT_CHECK_INT(info.unk_id, t->unk_id);
    ZT_CHECK_INT(info.bos_id, t->bos_id);
    ZT_CHECK_INT(info.eos_id, t->eos_id);
    ZT_CHECK_INT(info.pad_id, t->pad_id);

    /* A caller built against a later ABI minor passes a bigger struct: the v1.0 fields are filled,
     * its struct_size and the bytes after the v1.0 fields stay as they were. */
    struct {
        zt_tokenizer_info info;
        unsigned char appended[16];
    } bigger;
    memset(&bigger, 0xab, sizeof bigger);
    bigger.info.struct_size = sizeof bigger;
    ZT_CHECK_INT(p->ops->info(m, &bigger.info), ZT_OK);
    ZT_CHECK_INT(bigger.info.struct_size, sizeof bigger);
    ZT_CHECK_INT(bigger.info.vocab_size, t->vocab_size);
    ZT_CHECK_INT(bigger.appended[0], 0xab);
    ZT_CHECK_INT(bigger.appended[15], 0xab);

    char name[64];
    snprintf(name, sizeof name, "%s.vocab", t->name);
    tk_lines vocab;
    tk_read_lines(tk_path(work, name), &vocab);
    ZT_CHECK_INT(info.vocab_size, vocab.count);
    ZT_CHECK_INT(info.unk_id, vocab_id_of(&vocab, "<unk>"));
    ZT_CHECK_INT(info.bos_id, vocab_id_of(&vocab, "<s>"));
    ZT_CHECK_INT(info.eos_id, vocab_id_of(&vocab, "</s>"));
    ZT_CHECK_INT(info.pad_id, vocab_id_of(&vocab, "<pad>"));
    int piece_mismatches = 0;
    for (size_t id = 0; id < vocab.count; id++) {
        char piece[256];
        uint64_t len = 0;
        /* "piece<TAB>score"; the last tab, as a piece may itself be a tab */
        size_t want = (size_t)(strrchr(vocab.line[id], '\t') - vocab.line[id]);
        zt_status st = p->ops->id_to_piece(m, (int32_t)id, piece, sizeof piece, &len);
        if (st != ZT_OK || len != want || memcmp(piece, vocab.line[id], want) != 0 || piece[len]) {
            if (piece_mismatches++ < 5)
                fprintf(stderr, "%s: id %zu: piece \"%s\", spm_export_vocab has \"%.*s\"\n", t->name,
                        id, st == ZT_OK ? piece : tk_take_error(p, NULL), (int)want, vocab.line[id]);
        }
    }
    ZT_CHECK_INT(piece_mismatches, 0);
    tk_lines_free(&vocab);

    snprintf(name, sizeof name, "%s.model", t->name);
    size_t size;
    char *bytes = tk_read_file(tk_path(work, name), &size);
    ZT_CHECK(info.model_hash == zt_fnv1a64(ZT_FNV1A64_INIT, bytes, size));
    free(bytes);
}

static void check_against_cli(tk_plugin *p, zt_tokenizer_model *m, const trained_model *t,
                              const char *work)
{
    tk_lines texts, ref_ids, ref_decoded;
    char name[64];
    tk_read_lines(tk_path(work, "texts.txt"), &texts);
    snprintf(name, sizeof name, "%s.ids", t->name);
    tk_read_lines(tk_path(work, name), &ref_ids);
    snprintf(name, sizeof name, "%s.decoded", t->name);
    tk_read_lines(tk_path(work, name), &ref_decoded);
    ZT_CHECK_INT(ref_ids.count, texts.count);
    ZT_CHECK_INT(ref_decoded.count, texts.count);
    ZT_CHECK(texts.count > 50);

    int mismatches = 0;
    for (size_t i = 0; i < texts.count && i < ref_ids.count && i < ref_decoded.count; i++) {
        size_t n_want = 0;
        int32_t *want = tk_parse_ids(ref_ids.line[i], &n_want);
        uint64_t n_got = 0, text_len = 0;
        int32_t *got = tk_encode(p, m, texts.line[i], texts.len[i], &n_got);
        int same_ids = n_got == n_want && memcmp(got, want, n_want * sizeof *want) == 0;
        char *decoded = tk_decode(p, m, want, n_want, &text_len);
        int same_text = text_len == ref_decoded.len[i] &&
                        memcmp(decoded, ref_decoded.line[i], text_len) == 0;
        int round_trip = !t->round_trips ||
                         (text_len == texts.len[i] && memcmp(decoded, texts.line[i], text_len) == 0);
        if (!same_ids || !same_text || !round_trip) {
            if (mismatches++ < 5)
                fprintf(stderr,
                        "%s line %zu \"%s\": ids %s spm_encode (%llu vs %zu ids), decode %s "
                        "spm_decode (\"%s\")%s\n",
                        t->name, i + 1, texts.line[i], same_ids ? "equal" : "DIFFER from",
                        (unsigned long long)n_got, n_want, same_text ? "equals" : "DIFFERS from",
                        decoded, round_trip ? "" : ", and the round trip changed the text");
        }
        free(want);
        free(got);
        free(decoded);
    }
    ZT_CHECK_INT(mismatches, 0);
    tk_lines_free(&texts);
    tk_lines_free(&ref_ids);
    tk_lines_free(&ref_decoded);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLUGINS_D WORK_DIR\n", argv[0]);
        return 2;
    }
    /* Anchor the reference hash itself: published FNV-1a 64 test vectors. */
    ZT_CHECK(zt_fnv1a64(ZT_FNV1A64_INIT, "a", 1) == 0xaf63dc4c8601ec8cull);
    ZT_CHECK(zt_fnv1a64(ZT_FNV1A64_INIT, "foobar", 6) == 0x85944171f73967e8ull);

    tk_plugin p;
    tk_plugin_load(&p, argv[1]);
    ZT_CHECK_INT(p.loaded.plugin->caps, ZT_CAP_CPU | ZT_CAP_CONCURRENT);
    for (size_t i = 0; i < sizeof trained / sizeof trained[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.model", trained[i].name);
        zt_tokenizer_model *m = tk_open(&p, tk_path(argv[2], name));
        check_info_and_vocab(&p, m, &trained[i], argv[2]);
        check_against_cli(&p, m, &trained[i], argv[2]);
        p.ops->close(m);
    }
    tk_plugin_unload(&p);
    return zt_test_result();
}
