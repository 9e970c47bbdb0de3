/* Resharding: a checkpoint written by 3 simulated ranks (padded flat units, ZeRO-style slices) is
 * read back under 1, 2 and 4 ranks with another alignment, and by arbitrary element ranges; every
 * logical tensor comes back exactly, padding reads as zero and never reaches the file. */
#include "ckpt_fixture.h"

#include "base/json.h"

/* Every rank of a run with `readers` ranks reads its slice of every unit and group; compare with
 * the flat buffers this run would have built from the logical values (padding 0). */
static void read_back_under(zt_ckpt *c, int tied, int readers, int alignment, int version)
{
    fix_model m;
    fix_model_init(&m, tied, readers, alignment);
    zt_error err = {0};
    for (int u = 0; u < FIX_UNITS; u++) {
        for (int g = 0; g < FIX_GROUPS; g++) {
            float *want = fix_flat_unit(&m, u, fix_groups[g], version, 0.0f);
            for (int r = 0; r < readers; r++) {
                int64_t offset, count;
                fix_shard_range(&m, u, r, &offset, &count);
                float *got = malloc((size_t)count * sizeof *got);
                ZT_CHECK_INT(zt_ckpt_read_unit_shard(c, &m.layout, u, fix_groups[g], offset, count,
                                                     got, &err),
                             ZT_OK);
                int same = memcmp(got, want + offset, (size_t)count * sizeof *got) == 0;
                if (!same) {
                    fprintf(stderr, "%d readers, rank %d, unit %d, group %s differs\n", readers, r,
                            u, fix_groups[g]);
                }
                ZT_CHECK(same);
                free(got);
            }
            free(want);
        }
    }
}

/* The shards of model.embed_tokens.weight in checkpoint.json, worked out by hand: unit 0 holds
 * only the embeddings (78 elements), padded to a multiple of 3 ranks * 4 = 84, so rank r holds flat
 * [28r, 28r + 28): rank 0 [0, 28), rank 1 [28, 56), rank 2 [56, 78) plus 6 padding elements. */
static void check_index_text(const char *dir)
{
    char *path = path_in(dir, "checkpoint.json");
    size_t n;
    char *text = (char *)read_bytes(path, &n);
    zt_json j;
    zt_error err = {0};
    ZT_CHECK_INT(zt_json_parse(text, n, path, &j, &err), ZT_OK);
    ZT_CHECK(zt_json_eq(&j, zt_json_object_get(&j, 0, "format"), "zt-checkpoint"));
    ZT_CHECK(zt_json_get_number(&j, zt_json_object_get(&j, 0, "format_version")) == 1);
    ZT_CHECK(zt_json_get_number(&j, zt_json_object_get(&j, 0, "step")) == 100);
    int layout = zt_json_object_get(&j, 0, "written_layout");
    ZT_CHECK(zt_json_get_number(&j, zt_json_object_get(&j, layout, "world_size")) == 3);
    int config = zt_json_object_get(&j, 0, "config");
    ZT_CHECK(zt_json_get_number(&j, zt_json_object_get(&j, config, "train_micro_batch_size_per_gpu")) == 4);
    int tensors = zt_json_object_get(&j, 0, "tensors");
    ZT_CHECK_INT(j.tok[tensors].size, FIX_PARAMS * FIX_GROUPS);
    int embed = tensors + 1; /* the first declared */
    ZT_CHECK(zt_json_eq(&j, zt_json_object_get(&j, embed, "name"), "model.embed_tokens.weight"));
    ZT_CHECK(zt_json_eq(&j, zt_json_object_get(&j, embed, "group"), "param"));
    int shards = zt_json_object_get(&j, embed, "shards");
    ZT_CHECK_INT(j.tok[shards].size, 3);
    const double want[3][3] = {{0, 0, 28}, {1, 28, 28}, {2, 56, 22}};
    int s = shards + 1;
    for (int i = 0; i < 3 && i < j.tok[shards].size; i++, s = zt_json_skip(&j, s)) {
        ZT_CHECK(zt_json_get_number(&j, zt_json_object_get(&j, s, "rank")) == want[i][0]);
        ZT_CHECK(zt_json_get_number(&j, zt_json_object_get(&j, s, "offset")) == want[i][1]);
        ZT_CHECK(zt_json_get_number(&j, zt_json_object_get(&j, s, "count")) == want[i][2]);
        char file[32];
        snprintf(file, sizeof file, "rank-%05d.bin", (int)want[i][0]);
        ZT_CHECK(zt_json_eq(&j, zt_json_object_get(&j, s, "file"), file));
    }
    zt_json_free(&j);
    free(text);
    free(path);
}

/* The data files hold the logical values and nothing else: their total payload is exactly the
 * logical element count (padding excluded), and rank 1's file begins with its first shard, the
 * embeddings' elements [28, 56). */
static void check_data_files(const char *dir)
{
    size_t n;
    char *p = path_in(dir, "rank-00001.bin");
    uint8_t *bytes = read_bytes(p, &n);
    float first[28];
    memcpy(first, bytes, sizeof first);
    int same = 1;
    for (int i = 0; i < 28; i++) same &= first[i] == fix_value("model.embed_tokens.weight", "param", 28 + i, 0);
    ZT_CHECK(same);
    for (size_t i = 0; i + 4 <= n; i += 4) { /* no NaN padding marker anywhere */
        float x;
        memcpy(&x, bytes + i, 4);
        ZT_CHECK(!isnan(x));
    }
    free(bytes);
    free(p);
}

static void test_reshard(int tied)
{
    char *root = make_scratch_dir("ckpt-reshard");
    fix_model writer;
    fix_model_init(&writer, tied, 3, 4);
    char *dir = fix_save(&writer, root, 100, 0, 0);
    if (!dir) return;
    if (!tied) {
        check_index_text(dir);
        check_data_files(dir);
    }
    zt_error err = {0};
    zt_ckpt *c = NULL;
    ZT_CHECK_INT(zt_ckpt_open(dir, &c, &err), ZT_OK);
    if (!c) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    ZT_CHECK_INT(zt_ckpt_step(c), 100);
    ZT_CHECK(strcmp(zt_ckpt_zt_version(c), ZT_TEST_VERSION) == 0);
    ZT_CHECK(zt_ckpt_written_layout(c)->world_size == 3 && zt_ckpt_written_layout(c)->zero_stage == 2);
    ZT_CHECK(zt_ckpt_model(c)->hidden_size == 6 && zt_ckpt_model(c)->n_layers == 2);
    ZT_CHECK_CONTAINS(zt_ckpt_config_json(c), "\"zero_optimization\": {\"stage\": 2}");
    ZT_CHECK_INT(zt_ckpt_tensor_count(c), (tied ? FIX_PARAMS - 1 : FIX_PARAMS) * FIX_GROUPS);
    const zt_ckpt_tensor_info *info = zt_ckpt_find(c, "model.layers.1.mlp.down_proj.weight", "exp_avg");
    ZT_CHECK(info && info->ndim == 2 && info->shape[0] == 6 && info->shape[1] == 5 && info->numel == 30);
    ZT_CHECK(zt_ckpt_check_model(c, &writer.info, fix_groups, FIX_GROUPS, &err) == ZT_OK);

    for (int readers = 1; readers <= 4; readers *= 2) read_back_under(c, tied, readers, 8, 0);
    read_back_under(c, tied, 3, 1, 0);

    /* Any element range of a logical tensor, wherever the shard boundaries fall. */
    const char *name = "model.embed_tokens.weight";
    float got[78];
    int all_same = 1;
    for (int64_t off = 0; off <= 78; off++) {
        for (int64_t count = 0; off + count <= 78; count++) {
            ZT_CHECK_INT(zt_ckpt_read(c, name, "exp_avg_sq", off, count, got, &err), ZT_OK);
            for (int64_t i = 0; i < count; i++) all_same &= got[i] == fix_value(name, "exp_avg_sq", off + i, 0);
        }
    }
    ZT_CHECK(all_same);

    const void *data;
    size_t size;
    ZT_CHECK_INT(zt_ckpt_blob(c, "rng", &data, &size, &err), ZT_OK);
    ZT_CHECK(size == 20 && memcmp(data, "rng-state-of-rank-0", 20) == 0);
    ZT_CHECK_INT(zt_ckpt_blob(c, "loader.rank2", &data, &size, &err), ZT_OK);
    int64_t position[2];
    memcpy(position, data, sizeof position);
    ZT_CHECK(size == 16 && position[0] == 1002 && position[1] == 0);
    ZT_CHECK_INT(zt_ckpt_verify(c, &err), ZT_OK);
    zt_ckpt_close(c);
    free(dir);
    remove_tree(root);
    free(root);
}

/* A single rank (ZeRO stage 0: everything on one rank) read back by 3 and by 4. */
static void test_one_writer(void)
{
    char *root = make_scratch_dir("ckpt-one");
    fix_model writer;
    fix_model_init(&writer, 0, 1, 1);
    char *dir = fix_save(&writer, root, 7, 3, 0);
    zt_error err = {0};
    zt_ckpt *c = NULL;
    ZT_CHECK_INT(zt_ckpt_open(dir, &c, &err), ZT_OK);
    if (c) {
        read_back_under(c, 0, 3, 4, 3);
        read_back_under(c, 0, 4, 16, 3);
        zt_ckpt_close(c);
    }
    free(dir);
    remove_tree(root);
    free(root);
}

int main(void)
{
    test_reshard(0);
    test_reshard(1);
    test_one_writer();
    return zt_test_result();
}
