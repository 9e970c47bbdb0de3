/* safetensors validation: every malformed file is refused with a message naming the file, the
 * tensor and the problem, and nothing crashes (run this under ASan: build-*-asan). Files are built
 * byte by byte here, independently of zt's writer. */
#include "test_util.h"

static char *g_dir;

/* Write 8-byte length + header + data to NAME in the scratch directory; returns the path. */
static char *raw_file(const char *name, const char *header, const void *data, size_t data_len)
{
    size_t n = strlen(header);
    uint8_t *buf = malloc(8 + n + data_len + 1);
    for (int b = 0; b < 8; b++) buf[b] = (uint8_t)((uint64_t)n >> (8 * b));
    memcpy(buf + 8, header, n);
    if (data_len) memcpy(buf + 8 + n, data, data_len);
    char *path = path_in(g_dir, name);
    write_bytes(path, buf, 8 + n + data_len);
    free(buf);
    return path;
}

/* Opening must fail with `status` and a message containing the path and every `needles` string. */
static void expect_open_error(const char *path, zt_status status, const char *const *needles)
{
    zt_error err = {0};
    zt_st_file *f = (zt_st_file *)1;
    zt_status st = zt_st_open(path, &f, &err);
    ZT_CHECK_INT(st, status);
    ZT_CHECK(f == NULL);
    ZT_CHECK_CONTAINS(err.msg, path);
    for (int i = 0; needles[i]; i++) ZT_CHECK_CONTAINS(err.msg, needles[i]);
    if (st == ZT_OK) zt_st_close(f);
}

#define EXPECT_OPEN_ERROR(path, status, ...) \
    expect_open_error(path, status, (const char *const[]){__VA_ARGS__, NULL})

static void test_header_errors(void)
{
    uint8_t zeros[64] = {0};
    char *p;

    p = path_in(g_dir, "absent.safetensors");
    EXPECT_OPEN_ERROR(p, ZT_ERR_NOT_FOUND, "cannot open", "No such file");
    free(p);

    p = path_in(g_dir, "short.safetensors");
    write_bytes(p, "\x10\0\0\0\0", 5);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "the file is 5 bytes, shorter than the 8-byte header length");
    write_bytes(p, "", 0);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "the file is 0 bytes");
    free(p);

    p = path_in(g_dir, "long_header.safetensors");
    uint8_t big[16] = {0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'}; /* says 1000 bytes of header */
    write_bytes(p, big, 16);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "the header length 1000 exceeds the file (16 bytes)",
                      "truncated");
    uint8_t huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'}; /* 2^63 */
    write_bytes(p, huge, 16);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "the header length 9223372036854775808 exceeds the file");
    free(p);

    p = raw_file("not_object.safetensors", "[1, 2]", NULL, 0);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "the header does not start with '{'");
    free(p);

    p = raw_file("bad_json.safetensors", "{\"a\": {\"dtype\": \"F32\",}}", NULL, 0);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "header:1:23: expected", "re-download or re-export");
    free(p);

    p = raw_file("bad_utf8.safetensors", "{\"caf\xc3\x28\": 1}", NULL, 0);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "the header is not valid UTF-8 (byte 5 of the header)");
    free(p);

    p = raw_file("no_dtype.safetensors", "{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}",
                 zeros, 4);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "tensor 'w' has no \"dtype\" in the header");
    free(p);

    p = raw_file("not_entry.safetensors", "{\"w\": 5}", NULL, 0);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "tensor 'w': the header entry is not an object");
    free(p);

    p = raw_file("dtype.safetensors",
                 "{\"w\": {\"dtype\": \"F17\", \"shape\": [1], \"data_offsets\": [0, 4]}}", zeros, 4);
    EXPECT_OPEN_ERROR(p, ZT_ERR_UNSUPPORTED, "tensor 'w' has dtype 'F17', which zt does not know");
    free(p);

    p = raw_file("shape.safetensors",
                 "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 4]}}", zeros, 4);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "tensor 'w': shape[1] is '-1', not a non-negative integer");
    free(p);

    p = raw_file("shape2.safetensors",
                 "{\"w\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 4]}}", zeros, 4);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "shape[0] is '2.5'");
    free(p);

    p = raw_file("offsets_arity.safetensors",
                 "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", zeros, 4);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "tensor 'w': \"data_offsets\" must be [begin, end]");
    free(p);

    /* The spec's own example message. */
    p = raw_file("oob.safetensors",
                 "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [20], "
                 "\"data_offsets\": [10, 90]}}",
                 zeros, 64);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT,
                      "tensor 'model.norm.weight' data_offsets [10, 90] exceed the data section "
                      "(64 bytes): file truncated or corrupt");
    free(p);

    p = raw_file("backwards.safetensors",
                 "{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}", zeros, 8);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "data_offsets [8, 4] end before they begin");
    free(p);

    p = raw_file("size.safetensors",
                 "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", zeros, 8);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "tensor 'w' holds 8 bytes",
                      "shape and dtype F32 need 3 elements x 4 bytes");
    free(p);

    p = raw_file("overlap.safetensors",
                 "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}, "
                 "\"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}",
                 zeros, 24);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "tensor 'b' data_offsets [8, 24] overlap tensor 'a' [0, 16]");
    free(p);

    p = raw_file("gap.safetensors",
                 "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
                 "\"b\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [16, 24]}}",
                 zeros, 24);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "bytes [8, 16) of the data section belong to no tensor",
                      "before tensor 'b'");
    free(p);

    p = raw_file("trailing.safetensors",
                 "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", zeros, 12);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "the file has 4 bytes after the last tensor's data");
    free(p);

    p = raw_file("dup.safetensors",
                 "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
                 "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                 zeros, 8);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "tensor 'a' appears twice in the header");
    free(p);

    p = raw_file("meta.safetensors", "{\"__metadata__\": {\"format\": 1}}", NULL, 0);
    EXPECT_OPEN_ERROR(p, ZT_ERR_FORMAT, "\"__metadata__\" value of 'format' is not a string");
    free(p);

    /* Valid edge cases are accepted: an empty header object, whitespace padding, escapes. */
    p = raw_file("empty.safetensors", "{}      ", NULL, 0);
    zt_error err = {0};
    zt_st_file *f;
    ZT_CHECK_INT(zt_st_open(p, &f, &err), ZT_OK);
    if (f) {
        ZT_CHECK_INT(zt_st_count(f), 0);
        zt_st_close(f);
    }
    free(p);
    p = raw_file("escaped.safetensors",
                 "{\"caf\\u00e9\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]}}  ",
                 "\x01\x02", 2);
    ZT_CHECK_INT(zt_st_open(p, &f, &err), ZT_OK);
    if (f) {
        ZT_CHECK(zt_st_find(f, "caf\xc3\xa9") != NULL);
        zt_st_close(f);
    }
    free(p);
}

static void test_read_errors(void)
{
    uint8_t zeros[16] = {0};
    char *p = raw_file("read.safetensors",
                       "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}",
                       zeros, 16);
    zt_error err = {0};
    zt_st_file *f;
    ZT_CHECK_INT(zt_st_open(p, &f, &err), ZT_OK);
    if (f) {
        float out[8];
        ZT_CHECK_INT(zt_st_read_f32(f, zt_st_find(f, "w"), 2, 3, out, &err), ZT_ERR_INVALID_ARG);
        ZT_CHECK_CONTAINS(err.msg, "elements [2, 5) asked of tensor 'w', which has 4");
        zt_st_close(f);
    }
    free(p);
}

/* Every prefix of a valid file is refused cleanly; every single-byte change of its header either
 * still parses or is refused with a message: never a crash or an out-of-bounds read. */
static void test_truncation_and_damage(void)
{
    const float a[6] = {1, 2, 3, 4, 5, 6};
    const float b[3] = {7, 8, 9};
    const float *arrays[] = {a, b};
    const zt_st_tensor_spec specs[] = {{"model.embed_tokens.weight", ZT_ST_F32, 2, {2, 3}},
                                       {"model.norm.weight", ZT_ST_BF16, 1, {3}}};
    char *good = path_in(g_dir, "good.safetensors");
    zt_error err = {0};
    ZT_CHECK_INT(zt_st_write(good, specs, 2, fill_from_arrays, (void *)arrays, &err), ZT_OK);
    size_t size;
    uint8_t *bytes = read_bytes(good, &size);
    uint64_t header_len = 0;
    memcpy(&header_len, bytes, 8);
    char *cut = path_in(g_dir, "cut.safetensors");
    int truncated_data = 0;
    for (size_t len = 0; len < size; len++) {
        write_bytes(cut, bytes, len);
        zt_st_file *f = NULL;
        zt_status st = zt_st_open(cut, &f, &err);
        ZT_CHECK(st != ZT_OK && f == NULL);
        ZT_CHECK_CONTAINS(err.msg, cut);
        if (st == ZT_OK) zt_st_close(f);
        /* Cut inside the data: the last tensor's offsets run past the end. */
        if (len > 8 + header_len) {
            ZT_CHECK_CONTAINS(err.msg, "exceed the data section");
            truncated_data++;
        }
    }
    ZT_CHECK_INT(truncated_data, size - 9 - header_len);
    char *damaged = path_in(g_dir, "damaged.safetensors");
    const uint8_t replacements[] = {'0', '9', '"', '{', '}', ',', ':', '[', ']', 0x00, 0xff, ' '};
    int refused = 0;
    for (size_t at = 0; at < 8 + header_len; at++) {
        for (size_t r = 0; r < sizeof replacements; r++) {
            uint8_t saved = bytes[at];
            bytes[at] = replacements[r];
            write_bytes(damaged, bytes, size);
            bytes[at] = saved;
            zt_st_file *f = NULL;
            err.msg[0] = '\0';
            if (zt_st_open(damaged, &f, &err) == ZT_OK) {
                zt_st_close(f); /* e.g. a digit changed inside a name */
            } else {
                ZT_CHECK(err.msg[0] != '\0');
                refused++;
            }
        }
    }
    ZT_CHECK(refused > (int)(8 + header_len)); /* most damage is detected */
    free(bytes);
    free(good);
    free(cut);
    free(damaged);
}

static void test_set_errors(void)
{
    zt_error err = {0};
    zt_st_set *s = NULL;
    char *dir = path_in(g_dir, "model");
    mkdir(dir, 0777);

    ZT_CHECK_INT(zt_st_set_open(dir, &s, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "has neither model.safetensors nor model.safetensors.index.json");
    char *bin = path_in(dir, "pytorch_model.bin");
    write_bytes(bin, "x", 1);
    ZT_CHECK_INT(zt_st_set_open(dir, &s, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "pytorch_model.bin, which zt does not read");
    ZT_CHECK_CONTAINS(err.msg, "safe_serialization=True");
    remove(bin);
    free(bin);

    uint8_t zeros[16] = {0};
    char *shard = path_in(dir, "a.safetensors");
    {
        char *tmp = raw_file("shard_a.safetensors",
                             "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
                             zeros, 8);
        rename(tmp, shard);
        free(tmp);
    }
    char *index = path_in(dir, "model.safetensors.index.json");
    const char *bad_indexes[][2] = {
        {"{\"weight_map\": {\"x\": \"a.safetensors\",}}", "expected"},
        {"{\"metadata\": {}}", "expected an object with a \"weight_map\" object"},
        {"{\"weight_map\": {\"x\": 3}}", "weight_map entry of 'x' is not a file name string"},
        {"{\"weight_map\": {\"x\": \"../a.safetensors\"}}", "shard names must be plain file names"},
        {"{\"weight_map\": {\"x\": \"b.safetensors\"}}", "(a shard named by"},
        {"{\"weight_map\": {\"y\": \"a.safetensors\"}}",
         "weight_map says tensor 'y' is in 'a.safetensors', but that file has no such tensor"},
        {"{\"weight_map\": {}}", "the weight_map is empty"},
    };
    for (size_t i = 0; i < sizeof bad_indexes / sizeof *bad_indexes; i++) {
        write_bytes(index, bad_indexes[i][0], strlen(bad_indexes[i][0]));
        ZT_CHECK(zt_st_set_open(dir, &s, &err) != ZT_OK);
        ZT_CHECK(s == NULL);
        ZT_CHECK_CONTAINS(err.msg, "model.safetensors.index.json");
        ZT_CHECK_CONTAINS(err.msg, bad_indexes[i][1]);
    }
    /* The same tensor in two shards is ambiguous. */
    char *shard_b = path_in(dir, "b.safetensors");
    {
        char *tmp = raw_file("shard_b.safetensors",
                             "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
                             zeros, 4);
        rename(tmp, shard_b);
        free(tmp);
    }
    const char *two = "{\"weight_map\": {\"x\": \"a.safetensors\", \"x2\": \"b.safetensors\"}}";
    write_bytes(index, two, strlen(two));
    ZT_CHECK_INT(zt_st_set_open(dir, &s, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "weight_map says tensor 'x2' is in 'b.safetensors'");
    {
        char *tmp = raw_file("shard_b2.safetensors",
                             "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
                             "\"z\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                             zeros, 8);
        rename(tmp, shard_b);
        free(tmp);
    }
    const char *both = "{\"weight_map\": {\"x\": \"a.safetensors\", \"z\": \"b.safetensors\"}}";
    write_bytes(index, both, strlen(both));
    ZT_CHECK_INT(zt_st_set_open(dir, &s, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "tensor 'x' is stored in both");
    /* Both layouts at once: one of them is stale. */
    char *single = path_in(dir, "model.safetensors");
    rename(shard, single);
    ZT_CHECK_INT(zt_st_set_open(dir, &s, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "has both model.safetensors and model.safetensors.index.json");
    free(single);
    free(shard);
    free(shard_b);
    free(index);
    free(dir);
}

int main(void)
{
    g_dir = make_scratch_dir("st-errors");
    test_header_errors();
    test_read_errors();
    test_truncation_and_damage();
    test_set_errors();
    remove_tree(g_dir);
    free(g_dir);
    return zt_test_result();
}
