/* safetensors: fp16/bf16 conversion against hand-computed bit patterns, round trips of single and
 * sharded files checked byte by byte against the format spec, and reading the file Python's
 * safetensors wrote (python_written.safetensors, see README.md). */
#include "test_util.h"

#include <math.h>

#include "base/json.h"

/* ---- conversions ----------------------------------------------------------------------------- */

static void test_bf16_rounding(void)
{
    /* fp32 bits -> expected bf16 bits, worked out by hand: keep the top 16 bits, then look at the
     * dropped 16: above 0x8000 rounds up, below rounds down, exactly 0x8000 rounds to the even one. */
    static const struct { uint32_t in; uint16_t out; } cases[] = {
        {0x3F800000u, 0x3F80}, /* 1.0 */
        {0xBF800000u, 0xBF80}, /* -1.0 */
        {0x3F807FFFu, 0x3F80}, /* just below half: down */
        {0x3F808000u, 0x3F80}, /* tie, kept lsb 0 (even): down */
        {0x3F808001u, 0x3F81}, /* just above half: up */
        {0x3F818000u, 0x3F82}, /* tie, kept lsb 1 (odd): up to even */
        {0x40490FDBu, 0x4049}, /* pi */
        {0x40498000u, 0x404A}, /* tie on odd 0x4049: up */
        {0x3F80FFFFu, 0x3F81},
        {0x3FFF8000u, 0x4000}, /* tie on odd mantissa 0x7F: carries into the exponent */
        {0x7F7F7FFFu, 0x7F7F}, /* below the last rounding boundary: largest finite bf16 */
        {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX: rounds to infinity */
        {0x7F800000u, 0x7F80}, /* inf */
        {0xFF800000u, 0xFF80}, /* -inf */
        {0x00000000u, 0x0000},
        {0x80000000u, 0x8000}, /* -0 */
        {0x00008000u, 0x0000}, /* denormal tie on even: 0 */
        {0x00018000u, 0x0002}, /* denormal tie on odd 1: up to 2 */
        {0x7FC00000u, 0x7FC0}, /* quiet NaN */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = zt_bf16_from_f32(float_of(cases[i].in));
        if (got != cases[i].out) {
            fprintf(stderr, "bf16(0x%08X) = 0x%04X, expected 0x%04X\n", cases[i].in, got,
                    cases[i].out);
        }
        ZT_CHECK_INT(got, cases[i].out);
    }
    /* A signalling NaN (whose top 16 bits alone would read as infinity) stays a NaN. */
    uint16_t nan = zt_bf16_from_f32(float_of(0x7F800001u));
    ZT_CHECK((nan & 0x7F80) == 0x7F80 && (nan & 0x007F) != 0);
    /* Widening is exact: the bits move up by 16. */
    ZT_CHECK_INT(bits_of(zt_f32_from_bf16(0x4049)), 0x40490000u);
    ZT_CHECK_INT(bits_of(zt_f32_from_bf16(0x8001)), 0x80010000u);
    ZT_CHECK(isnan(zt_f32_from_bf16(0x7FC1)));
}

static void test_f16_rounding(void)
{
    /* fp32 -> fp16 by hand: 10 mantissa bits, exponent bias 15, subnormals in units of 2^-24. */
    static const struct { uint32_t in; uint16_t out; } cases[] = {
        {0x3F800000u, 0x3C00}, /* 1 */
        {0xC0000000u, 0xC000}, /* -2 */
        {0x3F000000u, 0x3800}, /* 0.5 */
        {0x3F801000u, 0x3C00}, /* 1 + 2^-11: tie, even (down) */
        {0x3F801001u, 0x3C01}, /* just above the tie */
        {0x3F803000u, 0x3C02}, /* 1 + 3 * 2^-11: tie on odd: up */
        {0x477FE000u, 0x7BFF}, /* 65504, the largest half */
        {0x477FEFFFu, 0x7BFF}, /* just below 65520 */
        {0x477FF000u, 0x7C00}, /* 65520: tie between 65504 (odd) and 65536: infinity */
        {0x49742400u, 0x7C00}, /* 1e6 */
        {0x38800000u, 0x0400}, /* 2^-14, the smallest normal */
        {0x387FC000u, 0x03FF}, /* 1023 units exactly: the largest subnormal */
        {0x387FE000u, 0x0400}, /* 1023.5 units: tie on odd 1023: up to the smallest normal */
        {0x33800000u, 0x0001}, /* 2^-24, the smallest subnormal */
        {0x33000000u, 0x0000}, /* 2^-25: tie between 0 and 1: even 0 */
        {0x33400000u, 0x0001}, /* 1.5 * 2^-25 = 0.75 units: up */
        {0x33C00000u, 0x0002}, /* 1.5 units: tie on odd 1: up to 2 */
        {0x34200000u, 0x0002}, /* 2.5 units: tie on even 2: down */
        {0x00000001u, 0x0000}, /* fp32 denormal */
        {0x80000000u, 0x8000}, /* -0 */
        {0x7F800000u, 0x7C00}, /* inf */
        {0xFF800000u, 0xFC00}, /* -inf */
        {0x7FC00000u, 0x7E00}, /* NaN */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = zt_f16_from_f32(float_of(cases[i].in));
        if (got != cases[i].out) {
            fprintf(stderr, "f16(0x%08X) = 0x%04X, expected 0x%04X\n", cases[i].in, got,
                    cases[i].out);
        }
        ZT_CHECK_INT(got, cases[i].out);
    }
    static const struct { uint16_t in; uint32_t out; } widen[] = {
        {0x0001, 0x33800000u}, {0x03FF, 0x387FC000u}, {0x0400, 0x38800000u},
        {0x3C01, 0x3F802000u}, {0x7BFF, 0x477FE000u}, {0xFC00, 0xFF800000u},
        {0x8000, 0x80000000u}, {0x8001, 0xB3800000u},
    };
    for (size_t i = 0; i < sizeof widen / sizeof *widen; i++) {
        ZT_CHECK_INT(bits_of(zt_f32_from_f16(widen[i].in)), widen[i].out);
    }
    ZT_CHECK(isnan(zt_f32_from_f16(0x7E00)));
}

/* ---- single-file round trip ------------------------------------------------------------------ */

/* The first 8 bytes, the header length and where the data section starts, read independently. */
static uint64_t header_len_of(const uint8_t *file)
{
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--) n = n << 8 | file[b];
    return n;
}

static void test_round_trip(const char *dir)
{
    /* Values with known encodings (the hand-checked cases above) plus ordinary ones. */
    const float bf16_in[6] = {1.0f, float_of(0x3F818000u), float_of(0x40490FDBu), -2.5f,
                              float_of(0x7F7FFFFFu), 0.0f};
    const uint16_t bf16_bits[6] = {0x3F80, 0x3F82, 0x4049, 0xC020, 0x7F80, 0x0000};
    const float f16_in[4] = {1.0f, float_of(0x3F803000u), 65504.0f, float_of(0x33C00000u)};
    const uint16_t f16_bits[4] = {0x3C00, 0x3C02, 0x7BFF, 0x0002};
    float f32_in[24];
    for (int i = 0; i < 24; i++) f32_in[i] = ref_value(0, i);
    const float scalar = -7.75f;
    const float *arrays[] = {f32_in, bf16_in, f16_in, &scalar, NULL};
    const zt_st_tensor_spec specs[] = {
        {"model.layers.0.mlp.up_proj.weight", ZT_ST_F32, 3, {2, 3, 4}},
        {"bf16 tensor \"quoted\"", ZT_ST_BF16, 2, {3, 2}},
        {"f16", ZT_ST_F16, 1, {4}},
        {"scalar", ZT_ST_F32, 0, {0}},
        {"empty", ZT_ST_BF16, 2, {0, 5}},
    };
    char *path = path_in(dir, "round.safetensors");
    zt_error err = {0};
    ZT_CHECK_INT(zt_st_write(path, specs, 5, fill_from_arrays, (void *)arrays, &err), ZT_OK);

    /* The bytes, against the spec. */
    size_t size;
    uint8_t *file = read_bytes(path, &size);
    uint64_t n = header_len_of(file);
    ZT_CHECK_INT((8 + n) % 8, 0);
    const uint64_t data_bytes = 24 * 4 + 6 * 2 + 4 * 2 + 4;
    ZT_CHECK_INT(size, 8 + n + data_bytes);
    ZT_CHECK(memcmp(file + 8, "{\"__metadata__\":{\"format\":\"pt\"}", 31) == 0);
    const uint8_t *data = file + 8 + n;
    ZT_CHECK(memcmp(data, f32_in, sizeof f32_in) == 0);
    for (int i = 0; i < 6; i++) {
        ZT_CHECK_INT(data[96 + 2 * i] | data[96 + 2 * i + 1] << 8, bf16_bits[i]);
    }
    for (int i = 0; i < 4; i++) {
        ZT_CHECK_INT(data[108 + 2 * i] | data[108 + 2 * i + 1] << 8, f16_bits[i]);
    }
    /* The header, read with zt's JSON reader (not the safetensors code under test). */
    zt_json j;
    ZT_CHECK_INT(zt_json_parse((const char *)file + 8, n, "header", &j, &err), ZT_OK);
    int t = zt_json_object_get(&j, 0, "bf16 tensor \\\"quoted\\\"");
    ZT_CHECK(t >= 0);
    int offsets = zt_json_object_get(&j, t, "data_offsets");
    ZT_CHECK(offsets >= 0 && zt_json_get_number(&j, offsets + 1) == 96 &&
             zt_json_get_number(&j, offsets + 2) == 108);
    zt_json_free(&j);
    free(file);

    /* And back through the reader. */
    zt_st_file *f;
    ZT_CHECK_INT(zt_st_open(path, &f, &err), ZT_OK);
    if (!f) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    ZT_CHECK_INT(zt_st_count(f), 5);
    ZT_CHECK(zt_st_metadata(f, "format") && strcmp(zt_st_metadata(f, "format"), "pt") == 0);
    const zt_st_tensor *x = zt_st_find(f, "model.layers.0.mlp.up_proj.weight");
    ZT_CHECK(x && x->dtype == ZT_ST_F32 && x->ndim == 3 && x->shape[2] == 4 && x->numel == 24);
    float out[24];
    ZT_CHECK_INT(zt_st_read_f32(f, x, 0, 24, out, &err), ZT_OK);
    ZT_CHECK(memcmp(out, f32_in, sizeof out) == 0);
    ZT_CHECK_INT(zt_st_read_f32(f, x, 5, 7, out, &err), ZT_OK); /* a sub-range, as shards read */
    ZT_CHECK(memcmp(out, f32_in + 5, 7 * sizeof *out) == 0);
    x = zt_st_find(f, "bf16 tensor \"quoted\"");
    ZT_CHECK(x && x->dtype == ZT_ST_BF16 && x->shape[0] == 3 && x->shape[1] == 2);
    ZT_CHECK_INT(zt_st_read_f32(f, x, 0, 6, out, &err), ZT_OK);
    for (int i = 0; i < 6; i++) ZT_CHECK_INT(bits_of(out[i]), (uint32_t)bf16_bits[i] << 16);
    x = zt_st_find(f, "f16");
    ZT_CHECK_INT(zt_st_read_f32(f, x, 1, 3, out, &err), ZT_OK);
    ZT_CHECK(out[0] == 1.001953125f && out[1] == 65504.0f && out[2] == 2 * 0x1p-24f);
    x = zt_st_find(f, "scalar");
    ZT_CHECK(x && x->ndim == 0 && x->numel == 1);
    ZT_CHECK_INT(zt_st_read_f32(f, x, 0, 1, out, &err), ZT_OK);
    ZT_CHECK(out[0] == -7.75f);
    x = zt_st_find(f, "empty");
    ZT_CHECK(x && x->numel == 0 && x->begin == x->end);
    ZT_CHECK(zt_st_find(f, "absent") == NULL);
    zt_st_close(f);
    free(path);
}

/* ---- sharded sets ---------------------------------------------------------------------------- */

/* Ten F32 tensors t0..t9 of shape [k + 1, 100]: 400 (k + 1) bytes each. */
static void sharded_specs(zt_st_tensor_spec *specs, char names[10][8])
{
    for (int k = 0; k < 10; k++) {
        snprintf(names[k], 8, "t%d", k);
        specs[k] = (zt_st_tensor_spec){names[k], ZT_ST_F32, 2, {k + 1, 100}};
    }
}

static void check_set_values(const char *dir)
{
    zt_error err = {0};
    zt_st_set *s;
    ZT_CHECK_INT(zt_st_set_open(dir, &s, &err), ZT_OK);
    if (!s) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    ZT_CHECK_INT(zt_st_set_count(s), 10);
    float buf[1000];
    for (int k = 0; k < 10; k++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", k);
        const zt_st_file *file;
        const zt_st_tensor *t = zt_st_set_find(s, name, &file);
        ZT_CHECK(t && t->numel == (uint64_t)(k + 1) * 100);
        if (!t) continue;
        ZT_CHECK_INT(zt_st_read_f32(file, t, 0, t->numel, buf, &err), ZT_OK);
        int same = 1;
        for (uint64_t i = 0; i < t->numel; i++) same &= buf[i] == ref_value(k, (int64_t)i);
        ZT_CHECK(same);
    }
    zt_st_set_close(s);
}

static void test_sharded(const char *dir)
{
    zt_st_tensor_spec specs[10];
    char names[10][8];
    sharded_specs(specs, names);
    zt_error err = {0};
    /* Limit 4000 bytes, filled greedily in order: t0..t3 take 400+800+1200+1600 = 4000; t4 (2000)
     * would overflow that, so it opens shard 2; t5 (2400) does not fit beside t4, and so on: each
     * of t4..t9 gets a shard of its own (t9 is exactly 4000). 7 shards. */
    ZT_CHECK_INT(zt_st_write_model(dir, specs, 10, fill_reference, NULL, 4000, &err), ZT_OK);
    const char *shards[] = {"model-00001-of-00007.safetensors", "model-00002-of-00007.safetensors",
                            "model-00003-of-00007.safetensors", "model-00004-of-00007.safetensors",
                            "model-00005-of-00007.safetensors", "model-00006-of-00007.safetensors",
                            "model-00007-of-00007.safetensors"};
    const int shard_of[10] = {0, 0, 0, 0, 1, 2, 3, 4, 5, 6};
    for (int s = 0; s < 7; s++) {
        char *p = path_in(dir, shards[s]);
        ZT_CHECK(file_exists(p));
        free(p);
    }
    char *index = path_in(dir, "model.safetensors.index.json");
    size_t n;
    char *text = (char *)read_bytes(index, &n);
    zt_json j;
    ZT_CHECK_INT(zt_json_parse(text, n, index, &j, &err), ZT_OK);
    int meta = zt_json_object_get(&j, 0, "metadata");
    ZT_CHECK(zt_json_get_number(&j, zt_json_object_get(&j, meta, "total_size")) == 55 * 400);
    int map = zt_json_object_get(&j, 0, "weight_map");
    ZT_CHECK(map >= 0 && j.tok[map].size == 10);
    for (int k = 0; k < 10; k++) {
        ZT_CHECK(zt_json_eq(&j, zt_json_object_get(&j, map, names[k]), shards[shard_of[k]]));
    }
    zt_json_free(&j);
    free(text);
    check_set_values(dir);

    /* Saving again in one file removes the index and the shards, else a reader could see both. */
    ZT_CHECK_INT(zt_st_write_model(dir, specs, 10, fill_reference, NULL, 0, &err), ZT_OK);
    ZT_CHECK(!file_exists(index));
    for (int s = 0; s < 7; s++) {
        char *p = path_in(dir, shards[s]);
        ZT_CHECK(!file_exists(p));
        free(p);
    }
    char *single = path_in(dir, "model.safetensors");
    ZT_CHECK(file_exists(single));
    check_set_values(dir);
    /* And sharded again: the single file goes. */
    ZT_CHECK_INT(zt_st_write_model(dir, specs, 10, fill_reference, NULL, 12000, &err), ZT_OK);
    ZT_CHECK(!file_exists(single));
    ZT_CHECK(file_exists(index));
    check_set_values(dir);
    free(single);
    free(index);
}

/* ---- the file Python wrote ------------------------------------------------------------------- */

/* The values st_reference.py `write` stores; all exactly representable, so no conversion is
 * needed to state them. */
static void check_python_file(const char *path)
{
    zt_error err = {0};
    zt_st_file *f;
    ZT_CHECK_INT(zt_st_open(path, &f, &err), ZT_OK);
    if (!f) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    ZT_CHECK_INT(zt_st_count(f), 6);
    ZT_CHECK(zt_st_metadata(f, "source") && !strcmp(zt_st_metadata(f, "source"), "st_reference.py"));
    float out[16];
    const zt_st_tensor *t = zt_st_find(f, "weight.f32");
    ZT_CHECK(t && t->dtype == ZT_ST_F32 && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 4);
    if (t && zt_st_read_f32(f, t, 0, 12, out, &err) == ZT_OK) {
        for (int i = 0; i < 12; i++) ZT_CHECK(out[i] == ref_value(0, i));
    }
    t = zt_st_find(f, "weight.f16");
    ZT_CHECK(t && t->dtype == ZT_ST_F16 && t->shape[0] == 2 && t->shape[1] == 5);
    if (t && zt_st_read_f32(f, t, 0, 10, out, &err) == ZT_OK) {
        for (int i = 0; i < 10; i++) ZT_CHECK(out[i] == (float)((i * 37) % 201 - 100) / 8.0f);
    }
    t = zt_st_find(f, "weight.bf16");
    ZT_CHECK(t && t->dtype == ZT_ST_BF16 && t->shape[0] == 4 && t->shape[1] == 3);
    if (t && zt_st_read_f32(f, t, 0, 12, out, &err) == ZT_OK) {
        for (int i = 0; i < 12; i++) ZT_CHECK_INT(bits_of(out[i]), bits_of(ref_value(2, i)) & 0xFFFF0000u);
    }
    t = zt_st_find(f, "ids.i64");
    ZT_CHECK(t && t->dtype == ZT_ST_I64 && t->numel == 5);
    if (t) {
        int64_t ids[5];
        memcpy(ids, zt_st_data(f, t), sizeof ids);
        for (int i = 0; i < 5; i++) ZT_CHECK(ids[i] == (int64_t)i * 1000000000000);
        ZT_CHECK_INT(zt_st_read_f32(f, t, 0, 5, out, &err), ZT_ERR_UNSUPPORTED);
        ZT_CHECK_CONTAINS(err.msg, "tensor 'ids.i64' has dtype I64; zt converts only F32, BF16 and F16");
    }
    t = zt_st_find(f, "scalar");
    ZT_CHECK(t && t->ndim == 0 && zt_st_read_f32(f, t, 0, 1, out, &err) == ZT_OK && out[0] == 3.5f);
    t = zt_st_find(f, "empty");
    ZT_CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 7 && t->numel == 0);
    zt_st_close(f);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_st_format PYTHON_WRITTEN.safetensors\n");
        return 2;
    }
    test_bf16_rounding();
    test_f16_rounding();
    char *dir = make_scratch_dir("st-format");
    test_round_trip(dir);
    char *sharded = path_in(dir, "sharded");
    mkdir(sharded, 0777);
    test_sharded(sharded);
    check_python_file(argv[1]);
    remove_tree(dir);
    free(sharded);
    free(dir);
    return zt_test_result();
}
