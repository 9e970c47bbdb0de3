/* Checkpoint errors: incomplete or overlapping shards refused at save time (the "ZeRO-3 saves empty
 * weights" failure), and at load time missing, truncated and corrupt data files, damaged or
 * newer-format checkpoint.json, missing tensors, groups and blobs, and a model that does not match,
 * each with a message naming the file, tensor, shard and rank. */
#include "ckpt_fixture.h"

static char *g_root;

/* Commit `n_ranks` results with the fixture's declarations; returns the status, message in err. */
static zt_status commit(const fix_model *m, const char *staging, zt_ckpt_rank_result *results,
                        size_t n_ranks, zt_error *err)
{
    zt_ckpt_tensor_decl decls[FIX_PARAMS * FIX_GROUPS];
    zt_ckpt_commit_args a = {.root = g_root, .staging_dir = staging, .step = 1,
                             .layout = {3, 3, 3, 1, 1}, .tensors = decls,
                             .n_tensors = fix_decls(m, decls), .ranks = results,
                             .n_ranks = n_ranks};
    zt_ckpt_model_shape_from_info(&m->info, &a.model);
    return zt_ckpt_commit(&a, NULL, err);
}

static void test_save_errors(void)
{
    fix_model m;
    fix_model_init(&m, 0, 3, 4);
    zt_error err = {0};
    char *staging = NULL;
    ZT_CHECK_INT(zt_ckpt_stage(g_root, 1, &staging, &err), ZT_OK);
    ZT_CHECK_CONTAINS(staging, "/step-000001.tmp-");
    zt_ckpt_rank_result results[3];
    fix_write_ranks(&m, staging, 0, results);

    /* Rank 1's shards never arrive (a rank that saved nothing, as ZeRO-3 "empty weights"). */
    zt_ckpt_rank_result without_1[2] = {results[0], results[2]};
    ZT_CHECK_INT(commit(&m, staging, without_1, 2, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "checkpoint not saved: tensor 'model.embed_tokens.weight' (group "
                               "param): elements [28, 56) of 78 were saved by no rank");
    ZT_CHECK_CONTAINS(err.msg, "never an empty gathered copy");

    /* Another writer claims rank 1's elements (its shards), then rank 1's blob name. */
    zt_ckpt_piece *copy = malloc(results[1].n_pieces * sizeof *copy);
    size_t n_shards = 0, n_blobs = 0;
    for (size_t i = 0; i < results[1].n_pieces; i++) {
        if (results[1].pieces[i].kind == ZT_CKPT_SHARD) copy[n_shards++] = results[1].pieces[i];
    }
    for (size_t i = 0; i < n_shards; i++) copy[i].rank = 7;
    zt_ckpt_rank_result twice[4] = {results[0], results[1], results[2],
                                    {7, results[1].file_size, copy, n_shards}};
    ZT_CHECK_INT(commit(&m, staging, twice, 4, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "tensor 'model.embed_tokens.weight' (group param): elements [28, 56) "
                               "are stored twice, by rank 1 and by rank 7");
    for (size_t i = 0; i < results[1].n_pieces; i++) {
        if (results[1].pieces[i].kind == ZT_CKPT_BLOB) copy[n_blobs++] = results[1].pieces[i];
    }
    for (size_t i = 0; i < n_blobs; i++) copy[i].rank = 7;
    twice[3].n_pieces = n_blobs;
    ZT_CHECK_INT(commit(&m, staging, twice, 4, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "blob 'loader.rank1' is written by rank 1 and rank 7");
    free(copy);

    /* A shard of something never declared. */
    zt_ckpt_piece saved = results[2].pieces[0];
    snprintf(results[2].pieces[0].name, ZT_CKPT_NAME_MAX, "model.layers.9.mlp.up_proj.weight");
    ZT_CHECK_INT(commit(&m, staging, results, 3, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "rank 2 wrote a shard of 'model.layers.9.mlp.up_proj.weight' (group "
                               "param), which is not among the declared tensors");
    results[2].pieces[0] = saved;

    /* The config must be JSON. */
    zt_ckpt_tensor_decl decls[FIX_PARAMS * FIX_GROUPS];
    zt_ckpt_commit_args a = {.root = g_root, .staging_dir = staging, .step = 1,
                             .config_json = "{\"a\": 1,}", .tensors = decls,
                             .n_tensors = fix_decls(&m, decls), .ranks = results, .n_ranks = 3};
    ZT_CHECK_INT(zt_ckpt_commit(&a, NULL, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "resolved config:1:");

    /* Nothing was published by the failed commits. */
    zt_ckpt_list list;
    ZT_CHECK_INT(zt_ckpt_list_dir(g_root, &list, &err), ZT_OK);
    ZT_CHECK_INT(list.n_complete, 0);
    ZT_CHECK_INT(list.n_incomplete, 1);
    zt_ckpt_list_free(&list);
    for (int r = 0; r < 3; r++) zt_ckpt_rank_result_free(&results[r]);
    zt_ckpt_discard_stage(staging);
    ZT_CHECK(!file_exists(staging));
    free(staging);
}

/* Open must fail with a message containing every needle. */
static void expect_open_error(const char *dir, zt_status status, const char *const *needles)
{
    zt_error err = {0};
    zt_ckpt *c = (zt_ckpt *)1;
    ZT_CHECK_INT(zt_ckpt_open(dir, &c, &err), status);
    ZT_CHECK(c == NULL);
    for (int i = 0; needles[i]; i++) ZT_CHECK_CONTAINS(err.msg, needles[i]);
}
#define EXPECT_OPEN_ERROR(dir, status, ...) \
    expect_open_error(dir, status, (const char *const[]){__VA_ARGS__, NULL})

/* A fresh good checkpoint; returns its directory. */
static char *fresh(int64_t step)
{
    fix_model m;
    fix_model_init(&m, 0, 3, 4);
    return fix_save(&m, g_root, step, 0, 0);
}

static void test_data_file_damage(void)
{
    for (int r = 0; r < 3; r++) {
        char *dir = fresh(10 + r);
        char name[32];
        snprintf(name, sizeof name, "rank-%05d.bin", r);
        char *file = path_in(dir, name);
        size_t size;
        uint8_t *bytes = read_bytes(file, &size);

        /* Truncated: at open, before any data is trusted. */
        for (size_t len = 0; len < size; len += size / 5 + 1) {
            write_bytes(file, bytes, len);
            char recorded[96];
            snprintf(recorded, sizeof recorded, "is %zu bytes, checkpoint.json records %zu", len, size);
            EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, name, recorded, "the file is truncated");
        }
        /* Grown. */
        uint8_t *longer = calloc(size + 3, 1);
        memcpy(longer, bytes, size);
        write_bytes(file, longer, size + 3);
        EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, "was overwritten or appended to");
        free(longer);

        /* One flipped bit in the first shard (the embeddings' slice of this rank, group param). */
        bytes[5] ^= 0x10;
        write_bytes(file, bytes, size);
        zt_error err = {0};
        zt_ckpt *c = NULL;
        ZT_CHECK_INT(zt_ckpt_open(dir, &c, &err), ZT_OK); /* sizes are fine */
        if (c) {
            float buf[78];
            char shard[160];
            snprintf(shard, sizeof shard, "in the shard of tensor 'model.embed_tokens.weight' (group "
                     "param, elements [%d, %d), written by rank %d", 28 * r, r == 2 ? 78 : 28 * r + 28, r);
            ZT_CHECK_INT(zt_ckpt_read(c, "model.embed_tokens.weight", "param", 0, 78, buf, &err),
                         ZT_ERR_FORMAT);
            ZT_CHECK_CONTAINS(err.msg, "checksum mismatch in ");
            ZT_CHECK_CONTAINS(err.msg, name);
            ZT_CHECK_CONTAINS(err.msg, shard);
            /* Tensors in other shards still read; the whole-checkpoint check finds the damage. */
            ZT_CHECK_INT(zt_ckpt_read(c, "model.norm.weight", "param", 0, 6, buf, &err), ZT_OK);
            ZT_CHECK_INT(zt_ckpt_verify(c, &err), ZT_ERR_FORMAT);
            ZT_CHECK_CONTAINS(err.msg, shard);
            zt_ckpt_close(c);
        }
        /* Missing. */
        remove(file);
        EXPECT_OPEN_ERROR(dir, ZT_ERR_NOT_FOUND, "data file ", name, "is missing",
                          "copied or moved incompletely");
        free(bytes);
        free(file);
        free(dir);
    }

    /* A damaged blob. */
    char *dir = fresh(20);
    char *file = path_in(dir, "rank-00000.bin");
    size_t size;
    uint8_t *bytes = read_bytes(file, &size);
    uint8_t *at = memmem(bytes, size, "rng-state", 9);
    ZT_CHECK(at != NULL);
    if (at) at[0] = 'R';
    write_bytes(file, bytes, size);
    zt_error err = {0};
    zt_ckpt *c = NULL;
    ZT_CHECK_INT(zt_ckpt_open(dir, &c, &err), ZT_OK);
    if (c) {
        const void *data;
        size_t n;
        ZT_CHECK_INT(zt_ckpt_blob(c, "rng", &data, &n, &err), ZT_ERR_FORMAT);
        ZT_CHECK_CONTAINS(err.msg, "checksum mismatch in rank-00000.bin, in blob 'rng' written by rank 0");
        ZT_CHECK_INT(zt_ckpt_blob(c, "scheduler", &data, &n, &err), ZT_ERR_NOT_FOUND);
        ZT_CHECK_CONTAINS(err.msg, "has no blob 'scheduler' (blobs there: 'loader.rank0', 'rng', "
                                   "'loader.rank1', 'loader.rank2')");
        zt_ckpt_close(c);
    }
    free(bytes);
    free(file);
    free(dir);
}

/* Replace the first occurrence of `from` in dir/checkpoint.json by `to`. */
static void edit_index(const char *dir, const char *from, const char *to)
{
    char *path = path_in(dir, "checkpoint.json");
    size_t n;
    char *text = (char *)read_bytes(path, &n);
    char *hit = strstr(text, from);
    ZT_CHECK(hit != NULL);
    if (hit) {
        size_t head = (size_t)(hit - text), from_len = strlen(from), to_len = strlen(to);
        char *out = malloc(n - from_len + to_len + 1);
        memcpy(out, text, head);
        memcpy(out + head, to, to_len);
        memcpy(out + head + to_len, hit + from_len, n - head - from_len);
        write_bytes(path, out, n - from_len + to_len);
        free(out);
    }
    free(text);
    free(path);
}

static void test_index_damage(void)
{
    char *dir = fresh(30);
    char *path = path_in(dir, "checkpoint.json");
    size_t n;
    char *text = (char *)read_bytes(path, &n);

    /* Truncated checkpoint.json: a JSON error with line and column, never a crash. */
    for (size_t len = 0; len < n - 2; len += n / 7 + 1) {
        write_bytes(path, text, len);
        EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, "checkpoint.json:");
    }
    write_bytes(path, text, n);

    edit_index(dir, "\"format_version\": 1", "\"format_version\": 2");
    EXPECT_OPEN_ERROR(dir, ZT_ERR_UNSUPPORTED, "checkpoint format version 2 is newer than this zt "
                                               "reads (version 1): upgrade zt");
    write_bytes(path, text, n);
    edit_index(dir, "\"zt-checkpoint\"", "\"deepspeed\"");
    EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, "format is 'deepspeed', not 'zt-checkpoint'");
    write_bytes(path, text, n);
    edit_index(dir, "\"step\": 30", "\"step\": -30");
    EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, "\"step\" must be an integer >= 0, found -30",
                      "checkpoint.json is damaged");
    write_bytes(path, text, n);
    edit_index(dir, "\"count\": 28", "\"count\": 27");
    EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, "tensor 'model.embed_tokens.weight' (group param): "
                                          "elements [27, 28) of 78 were saved by no rank");
    write_bytes(path, text, n);
    edit_index(dir, "\"checksum\": \"", "\"checksum\": \"x");
    EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, "\"checksum\" must be 16 lower-case hex digits");
    write_bytes(path, text, n);
    edit_index(dir, "\"file\": \"rank-00001.bin\"", "\"file\": \"rank-00009.bin\"");
    EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, "file 'rank-00009.bin' is not among the checkpoint's \"files\"");
    write_bytes(path, text, n);
    edit_index(dir, "\"dtype\": \"F32\"", "\"dtype\": \"F8\"");
    EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, "has dtype 'F8'; this zt reads F32 checkpoint tensors");
    write_bytes(path, text, n);
    edit_index(dir, "\"byte_offset\": 0,", "\"byte_offset\": 999999,");
    EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, "does not lie inside rank-00000.bin");
    write_bytes(path, text, n);
    edit_index(dir, "\"shards\"", "\"shard\"");
    EXPECT_OPEN_ERROR(dir, ZT_ERR_FORMAT, "\"shards\" is missing");
    write_bytes(path, text, n);
    remove(path);
    EXPECT_OPEN_ERROR(dir, ZT_ERR_NOT_FOUND, "is not a complete zt checkpoint: it has no checkpoint.json");
    free(text);
    free(path);
    free(dir);
}

static void test_model_mismatch(void)
{
    char *dir = fresh(40);
    zt_error err = {0};
    zt_ckpt *c = NULL;
    ZT_CHECK_INT(zt_ckpt_open(dir, &c, &err), ZT_OK);
    if (!c) return;
    fix_model other;
    fix_model_init(&other, 0, 2, 4);
    other.info.hidden_size = 8;
    other.info.n_layers = 3;
    ZT_CHECK_INT(zt_ckpt_check_model(c, &other.info, fix_groups, FIX_GROUPS, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "was saved from a different model: checkpoint has n_layers 2, this "
                               "run's model has 3; checkpoint has hidden_size 6, this run's model has 8");
    /* Same shape numbers, but one parameter's shape differs. */
    fix_model_init(&other, 0, 2, 4);
    other.params[3].shape[1] = 7;
    ZT_CHECK_INT(zt_ckpt_check_model(c, &other.info, fix_groups, 1, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "tensor 'model.layers.0.mlp.down_proj.weight' (group param) has shape "
                               "[6, 5], this run's model has [6, 7]");
    /* A parameter the checkpoint lacks, and one only the checkpoint has. */
    fix_model_init(&other, 0, 2, 4);
    other.params[2].name = "model.layers.0.post_attention_layernorm.weight";
    ZT_CHECK_INT(zt_ckpt_check_model(c, &other.info, fix_groups, 1, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "has no tensor 'model.layers.0.post_attention_layernorm.weight' in group param");
    fix_model_init(&other, 1, 2, 4); /* tied: lm_head is not a tensor of its own any more */
    ZT_CHECK_INT(zt_ckpt_check_model(c, &other.info, fix_groups, 1, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "has tensor 'lm_head.weight' (group param), which this run's model "
                               "does not have");
    /* Another optimizer's state. */
    const char *momentum[] = {"momentum"};
    fix_model_init(&other, 0, 2, 4);
    ZT_CHECK_INT(zt_ckpt_check_model(c, &other.info, momentum, 1, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "has no 'momentum' tensors at all: it was saved with another "
                               "optimizer or without optimizer state (groups present: exp_avg, "
                               "exp_avg_sq, param)");
    /* Reads outside a tensor. */
    float buf[4];
    ZT_CHECK_INT(zt_ckpt_read(c, "model.norm.weight", "param", 4, 3, buf, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "elements [4, 7) asked of tensor 'model.norm.weight' (group param), which has 6");
    zt_ckpt_close(c);
    free(dir);
}

static int64_t ckpt_numel(const zt_ckpt_tensor_decl *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= d->shape[i];
    return n;
}

/* A checkpoint that faithfully holds a non-finite value (a run that had diverged saved it; its
 * checksums match): refused where it is read, naming the tensor, group and element. */
static void test_nonfinite(void)
{
    fix_model m;
    fix_model_init(&m, 0, 1, 1);
    char *root = path_in(g_root, "nonfinite");
    zt_error err = {0};
    char *staging = NULL;
    ZT_CHECK_INT(zt_ckpt_stage(root, 7, &staging, &err), ZT_OK);
    zt_ckpt_rank_writer *w = NULL;
    ZT_CHECK_INT(zt_ckpt_rank_writer_open(staging, 0, &w, &err), ZT_OK);
    zt_ckpt_tensor_decl decls[FIX_PARAMS * FIX_GROUPS];
    size_t n_decls = fix_decls(&m, decls);
    for (size_t k = 0; w && k < n_decls; k++) {
        int64_t numel = ckpt_numel(&decls[k]);
        float *v = malloc((size_t)numel * sizeof *v);
        for (int64_t i = 0; i < numel; i++) v[i] = fix_value(decls[k].name, decls[k].group, i, 1);
        if (!strcmp(decls[k].name, "model.norm.weight") && !strcmp(decls[k].group, "exp_avg")) v[2] = INFINITY;
        ZT_CHECK_INT(zt_ckpt_rank_writer_add_shard(w, decls[k].name, decls[k].group, 0, numel, v, &err), ZT_OK);
        free(v);
    }
    zt_ckpt_rank_result result = {0};
    if (w) ZT_CHECK_INT(zt_ckpt_rank_writer_finish(w, &result, &err), ZT_OK);
    zt_ckpt_commit_args a = {.root = root, .staging_dir = staging, .step = 7, .layout = {1, 0, 1, 1, 1},
                             .tensors = decls, .n_tensors = n_decls, .ranks = &result, .n_ranks = 1};
    zt_ckpt_model_shape_from_info(&m.info, &a.model);
    char *dir = NULL;
    ZT_CHECK_INT(zt_ckpt_commit(&a, &dir, &err), ZT_OK);
    zt_ckpt_rank_result_free(&result);
    zt_ckpt *c = NULL;
    if (dir) ZT_CHECK_INT(zt_ckpt_open(dir, &c, &err), ZT_OK);
    if (c) {
        float buf[6];
        ZT_CHECK_INT(zt_ckpt_read(c, "model.norm.weight", "param", 0, 6, buf, &err), ZT_OK);
        ZT_CHECK(buf[2] == fix_value("model.norm.weight", "param", 2, 1));
        ZT_CHECK_INT(zt_ckpt_read(c, "model.norm.weight", "exp_avg", 0, 1, buf, &err), ZT_ERR_FORMAT);
        ZT_CHECK_CONTAINS(err.msg, "tensor 'model.norm.weight' (group exp_avg) holds +inf at element 2 (in "
                                   "rank-00000.bin, written by rank 0): the run had diverged when it saved this "
                                   "checkpoint");
        ZT_CHECK_CONTAINS(err.msg, "resume from an earlier checkpoint");
        ZT_CHECK_INT(zt_ckpt_verify(c, &err), ZT_ERR_FORMAT);
        ZT_CHECK_CONTAINS(err.msg, "holds +inf at element 2");
        zt_ckpt_close(c);
    }
    free(dir);
    free(staging);
    free(root);
}

int main(void)
{
    g_root = make_scratch_dir("ckpt-errors");
    test_nonfinite();
    test_save_errors();
    test_data_file_damage();
    test_index_damage();
    test_model_mismatch();
    remove_tree(g_root);
    free(g_root);
    return zt_test_result();
}
