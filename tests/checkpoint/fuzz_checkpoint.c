/* libFuzzer target: the checkpoint reader on a hostile checkpoint.json. A real 3-rank checkpoint of
 * the test model is saved once; each input replaces its checkpoint.json. Besides the sanitizers, the
 * oracle is what an accepted index must allow: every tensor reads in full (a checksum mismatch is
 * the one acceptable failure, as shards may now point at other bytes), every blob too. Built with
 * -DZT_FUZZ=ON (see tests/fuzz/CMakeLists.txt); seeds in fuzz_corpus/. */
#include "ckpt_fixture.h"

static char *g_step_dir;
static char *g_index;
static char *g_root;

static void remove_root(void) { remove_tree(g_root); }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static char root[] = "/tmp/zt-fuzz-checkpoint-XXXXXX";
    g_root = mkdtemp(root);
    if (!g_root) abort();
    atexit(remove_root);
    fix_model m;
    fix_model_init(&m, 0, 3, 4);
    g_step_dir = fix_save(&m, g_root, 1, 0, 0);
    if (!g_step_dir) abort();
    g_index = path_in(g_step_dir, "checkpoint.json");
    return 0;
}

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "invariant failed: %s\n", #cond);                                      \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    write_bytes(g_index, data, size);
    zt_ckpt *c = NULL;
    zt_error err = {0};
    if (zt_ckpt_open(g_step_dir, &c, &err) != ZT_OK) {
        REQUIRE(c == NULL && err.msg[0] != '\0');
        return 0;
    }
    for (size_t i = 0; i < zt_ckpt_tensor_count(c); i++) {
        const zt_ckpt_tensor_info *t = zt_ckpt_tensor_at(c, i);
        REQUIRE(zt_ckpt_find(c, t->name, t->group) == t);
        if (t->numel > (1 << 20)) continue;
        float *buf = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *buf);
        zt_status st = zt_ckpt_read(c, t->name, t->group, 0, t->numel, buf, &err);
        REQUIRE(st == ZT_OK || (st == ZT_ERR_FORMAT && strstr(err.msg, "checksum mismatch")));
        free(buf);
    }
    zt_ckpt_verify(c, &err);
    zt_ckpt_close(c);
    return 0;
}
