/* HF fixtures written by transformers (tests/reference/fixtures/<name>, copied by tests/CMakeLists.txt
 * into the build tree's test-fixtures/<name>/ as config.json + model.safetensors): zt opens each, reads every tensor, and
 * exports a copy in the same dtype that is bit-identical tensor by tensor. Skips (77) while no
 * fixture exists. */
#include "test_util.h"

#include <dirent.h>

#include "state/hf_model.h"

typedef struct copy_ctx {
    const zt_hf_model *model;
    const zt_st_tensor_spec *specs;
} copy_ctx;

static zt_status fill_from_model(void *ctx, size_t index, uint64_t elem_offset, uint64_t count,
                                 float *dst, zt_error *err)
{
    const copy_ctx *c = ctx;
    const zt_st_tensor_spec *s = &c->specs[index];
    return zt_hf_model_read(c->model, s->name, s->ndim, s->shape, elem_offset, count, dst, err);
}

/* Every tensor of `copy` has the same dtype, shape and bytes as in `original`. */
static void compare_weights(const char *original, const char *copy)
{
    zt_error err = {0};
    zt_st_set *a = NULL, *b = NULL;
    ZT_CHECK_INT(zt_st_set_open(original, &a, &err), ZT_OK);
    ZT_CHECK_INT(zt_st_set_open(copy, &b, &err), ZT_OK);
    if (!a || !b) {
        fprintf(stderr, "%s\n", err.msg);
        zt_st_set_close(a);
        zt_st_set_close(b);
        return;
    }
    size_t compared = 0;
    for (size_t i = 0; i < zt_st_set_count(a); i++) {
        const zt_st_file *fa, *fb;
        const zt_st_tensor *ta = zt_st_set_at(a, i, &fa);
        const zt_st_tensor *tb = zt_st_set_find(b, ta->name, &fb);
        if (!tb) { /* only what transformers itself drops may be missing from the copy */
            ZT_CHECK(strstr(ta->name, "rotary_emb.inv_freq") || !strcmp(ta->name, "lm_head.weight"));
            continue;
        }
        ZT_CHECK(ta->dtype == tb->dtype && ta->ndim == tb->ndim && ta->numel == tb->numel);
        int same = ta->end - ta->begin == tb->end - tb->begin &&
                   memcmp(zt_st_data(fa, ta), zt_st_data(fb, tb), ta->end - ta->begin) == 0;
        if (!same) fprintf(stderr, "%s: tensor %s differs in the copy\n", original, ta->name);
        ZT_CHECK(same);
        compared++;
    }
    ZT_CHECK(compared > 0);
    zt_st_set_close(a);
    zt_st_set_close(b);
}

static void check_fixture(const char *dir, const char *scratch)
{
    zt_error err = {0};
    zt_hf_model *m = NULL;
    ZT_CHECK_INT(zt_hf_model_open(dir, &m, &err), ZT_OK);
    if (!m) {
        fprintf(stderr, "%s: %s\n", dir, err.msg);
        return;
    }
    const zt_hf_config *c = zt_hf_model_config(m);
    const zt_st_set *weights = zt_hf_model_weights(m);
    int dtype = zt_st_set_at(weights, 0, NULL)->dtype;
    zt_hf_tensor_list list;
    ZT_CHECK_INT(zt_hf_llama_tensors(c, dtype, &list, &err), ZT_OK);
    /* Read every tensor the files hold. */
    for (size_t i = 0; i < zt_st_set_count(weights); i++) {
        const zt_st_file *f;
        const zt_st_tensor *t = zt_st_set_at(weights, i, &f);
        float *buf = malloc((t->numel ? t->numel : 1) * sizeof *buf);
        ZT_CHECK_INT(zt_st_read_f32(f, t, 0, t->numel, buf, &err), ZT_OK);
        free(buf);
    }
    char *copy = path_in(scratch, strrchr(dir, '/') + 1);
    copy_ctx ctx = {m, list.specs};
    ZT_CHECK_INT(zt_hf_export(copy, c, list.specs, list.n, fill_from_model, &ctx, 0, &err), ZT_OK);
    compare_weights(dir, copy);
    zt_hf_model *again = NULL;
    ZT_CHECK_INT(zt_hf_model_open(copy, &again, &err), ZT_OK);
    zt_hf_model_close(again);
    printf("fixture %s: %zu tensors, %s, copied bit for bit\n", dir, zt_st_set_count(weights),
           zt_st_dtype_name(dtype));
    free(copy);
    zt_hf_tensor_list_free(&list);
    zt_hf_model_close(m);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_hf_fixtures FIXTURES_DIR\n");
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (!d) ZT_SKIP("no HF fixtures yet (%s does not exist)", argv[1]);
    char *scratch = make_scratch_dir("hf-fixtures");
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char *dir = path_in(argv[1], e->d_name);
        char *config = path_in(dir, "config.json");
        if (file_exists(config)) {
            check_fixture(dir, scratch);
            found++;
        }
        free(config);
        free(dir);
    }
    closedir(d);
    remove_tree(scratch);
    free(scratch);
    if (!found) ZT_SKIP("no HF fixture with a config.json under %s", argv[1]);
    return zt_test_result();
}
