/* libFuzzer target: the JSON reader and the loader's two JSON consumers on hostile text.
 *
 * Each input is parsed with zt_json_parse; every token is then walked (bounds, parent links,
 * zt_json_skip, line/column, and zt_json_string on every string, which unescapes and checks UTF-8).
 * The same bytes go through zt_json_unescape and zt_utf8_valid directly, through the loader's
 * position reader (with a round trip when accepted), and, when they are a JSON object, into a data
 * set as its manifest.json next to a valid shard, which the loader opens and reads to the end.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "data/loader.h"
#include "base/log.h"
#include "shard_writer.h"

static char *g_dir;        /* data set directory: one fixed shard, a new manifest per input */
static FILE *g_null;       /* sink for zt_json_write_string */

static void remove_dir(void) { tw_remove_tree(g_dir); }

#define REQUIRE(cond)                                                                          \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "invariant violated: %s (%s:%d)\n", #cond, __FILE__, __LINE__);   \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

/* The shard that corpus/json/manifest-*.json describe: 6 samples, 23 tokens, 11 loss tokens,
 * 440 bytes, tokenizer hash 0123456789abcdef, vocab 100. */
static void write_shard(void)
{
    static const uint32_t t0[] = {1, 10, 11, 12}, t1[] = {1, 20, 21}, t2[] = {1, 30, 31, 32, 33},
                          t3[] = {1, 40}, t4[] = {1, 50, 51, 52, 53, 54, 55}, t5[] = {1, 60};
    static const uint8_t m0[] = {0, 0, 1, 1}, m1[] = {0, 1, 1}, m2[] = {0, 0, 0, 1, 1}, m3[] = {0, 1},
                         m4[] = {0, 0, 0, 0, 1, 1, 1}, m5[] = {0, 1};
    tw_samples s;
    tw_samples_init(&s);
    tw_samples_add(&s, t0, m0, 4);
    tw_samples_add(&s, t1, m1, 3);
    tw_samples_add(&s, t2, m2, 5);
    tw_samples_add(&s, t3, m3, 2);
    tw_samples_add(&s, t4, m4, 7);
    tw_samples_add(&s, t5, m5, 2);
    tw_shard_params p = {.token_bytes = 2, .vocab_size = 100, .tokenizer_hash = 0x0123456789abcdefull};
    tw_image img;
    tw_build(&s, &p, &img);
    char path[4096];
    snprintf(path, sizeof path, "%s/train-00000.ztshard", g_dir);
    REQUIRE(tw_write_file(path, img.data, img.size) == 0);
    tw_image_free(&img);
    tw_samples_free(&s);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static char dir[] = "/tmp/zt-fuzz-json-XXXXXX";
    g_dir = mkdtemp(dir);
    g_null = fopen("/dev/null", "w");
    if (!g_dir || !g_null) {
        perror("zt-fuzz-json setup");
        abort();
    }
    atexit(remove_dir);
    zt_log_set_level(ZT_LOG_ERROR);
    write_shard();
    return 0;
}

static void walk(const zt_json *j)
{
    REQUIRE(j->n_tok >= 1 && j->tok[0].parent == -1);
    for (int i = 0; i < j->n_tok; i++) {
        const zt_json_tok *t = &j->tok[i];
        REQUIRE(t->start >= 0 && t->start <= t->end && (size_t)t->end <= j->len);
        REQUIRE(i == 0 || (t->parent >= 0 && t->parent < i));
        int next = zt_json_skip(j, i);
        REQUIRE(next > i && next <= j->n_tok);
        int line, col;
        zt_json_line_col(j->text, (size_t)t->start, &line, &col);
        REQUIRE(line >= 1 && col >= 1);
        switch (t->type) {
        case ZT_JSON_STRING: {
            char *s = NULL;
            size_t len = 0;
            zt_error err = {0};
            if (zt_json_string(j, i, &s, &len, &err) == ZT_OK) {
                REQUIRE(len <= (size_t)(t->end - t->start));
                zt_json_write_string(g_null, s, len);
                free(s);
            } else {
                REQUIRE(s == NULL && strncmp(err.msg, "fuzz.json:", 10) == 0);
            }
            (void)zt_json_eq(j, i, "shards");
            break;
        }
        case ZT_JSON_PRIMITIVE: {
            int kinds = zt_json_is_null(j, i) + zt_json_is_bool(j, i) + zt_json_is_number(j, i);
            REQUIRE(kinds == 1);
            if (zt_json_is_number(j, i)) (void)zt_json_get_number(j, i);
            if (zt_json_is_bool(j, i)) (void)zt_json_get_bool(j, i);
            break;
        }
        case ZT_JSON_OBJECT: {
            int v = zt_json_object_get(j, i, "format");
            REQUIRE(v == -1 || (v > i && v < next));
            break;
        }
        case ZT_JSON_ARRAY:
            break;
        default:
            REQUIRE(!"unknown token type");
        }
    }
}

static void load_as_manifest(const char *text, size_t size)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", g_dir);
    REQUIRE(tw_write_file(path, text, size) == 0);
    const char *splits[2] = {"train", "val"};
    for (int s = 0; s < 2; s++) {
        zt_loader_options o;
        zt_loader_options_default(&o);
        o.dir = g_dir;
        o.split = splits[s];
        o.micro_batch = 2;
        o.seq_len = 5;
        o.single_pass = 1;
        o.verify_checksums = 0; /* seeds cannot carry every mutation's checksum */
        zt_loader *l = NULL;
        zt_error err = {0};
        if (zt_loader_open(&o, &l, &err) != ZT_OK) {
            REQUIRE(l == NULL && err.msg[0] != '\0');
            continue;
        }
        for (int64_t i = 0; i < zt_loader_info_get(l)->batches_per_epoch; i++) {
            const zt_loader_batch *b;
            REQUIRE(zt_loader_next(l, &b, &err) == ZT_OK);
        }
        zt_loader_close(l);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy without a terminating NUL, so any read past the end is caught. */
    char *text = malloc(size ? size : 1);
    char *decoded = malloc(size + 1);
    if (!text || !decoded) return 0;
    memcpy(text, data, size);

    size_t bad;
    const char *what;
    long n = zt_json_unescape(text, size, decoded, &bad, &what);
    REQUIRE(n <= (long)size);
    if (n < 0) REQUIRE(bad <= size && what != NULL);
    (void)zt_utf8_valid(text, size, &bad);

    zt_json j;
    zt_error err = {0};
    int is_object = 0;
    if (zt_json_parse(text, size, "fuzz.json", &j, &err) == ZT_OK) {
        walk(&j);
        is_object = j.tok[0].type == ZT_JSON_OBJECT;
        zt_json_free(&j);
    } else {
        REQUIRE(strncmp(err.msg, "fuzz.json:", 10) == 0);
    }

    zt_loader_position pos;
    if (zt_loader_position_from_json(text, size, "position", &pos, &err) == ZT_OK) {
        char again[512];
        size_t len = zt_loader_position_to_json(&pos, again, sizeof again);
        REQUIRE(len < sizeof again);
        zt_loader_position back;
        REQUIRE(zt_loader_position_from_json(again, len, "again", &back, &err) == ZT_OK);
        REQUIRE(memcmp(&back, &pos, sizeof pos) == 0);
    }

    if (is_object) load_as_manifest(text, size);
    free(decoded);
    free(text);
    return 0;
}
