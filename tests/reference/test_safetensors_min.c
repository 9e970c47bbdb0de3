/* The minimal safetensors reader: hand-built files with hand-computed values (F32, F16 incl.
 * subnormal and inf, BF16, I64), every header error with its message, and real files (the HF
 * fixtures written by transformers, and stories260K_hf from the shared data when present). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "safetensors_min.h"
#include "ztest.h"

/* A file image: 8-byte little-endian header length, the header, then `data`. */
static unsigned char *image(const char *header, const void *data, size_t data_len, size_t *size)
{
    size_t n = strlen(header);
    *size = 8 + n + data_len;
    unsigned char *buf = malloc(*size);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    if (data_len) memcpy(buf + 8 + n, data, data_len);
    return buf;
}

/* Parsing `header` + `data_len` zero bytes must fail with `status` and a message containing all
 * the needles. */
static void expect_header_error(const char *header, size_t data_len, zt_status status,
                                const char *needle1, const char *needle2)
{
    unsigned char zeros[64] = {0};
    size_t size;
    unsigned char *buf = image(header, zeros, data_len, &size);
    ref_st_file f;
    zt_error err = {0};
    ZT_CHECK_INT(ref_st_open_memory(buf, size, "bad.safetensors", &f, &err), status);
    ZT_CHECK_CONTAINS(err.msg, "bad.safetensors");
    ZT_CHECK_CONTAINS(err.msg, needle1);
    if (needle2) ZT_CHECK_CONTAINS(err.msg, needle2);
    ZT_CHECK_INT(f.n_tensors, 0); /* nothing half-open */
    ref_st_close(&f);
    free(buf);
}

static void test_values(void)
{
    const char *header =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[8,18]},"
        "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[18,22]},"
        "\"i\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[22,38]},"
        "\"big\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[38,46]},"
        "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[46,46]}}";
    unsigned char data[46];
    float a[2] = {1.5f, -2.0f};
    /* F16: 1.0, -2.0, the smallest subnormal 2^-24, +inf, 0x3555 = 0.333251953125 */
    uint16_t h[5] = {0x3C00, 0xC000, 0x0001, 0x7C00, 0x3555};
    uint16_t b[2] = {0x3F80, 0xC0A0}; /* BF16: 1.0, -5.0 */
    int64_t i64[2] = {7, -3}, big = (int64_t)1 << 40;
    memcpy(data, a, 8);
    memcpy(data + 8, h, 10);
    memcpy(data + 18, b, 4);
    memcpy(data + 22, i64, 16);
    memcpy(data + 38, &big, 8);
    size_t size;
    unsigned char *buf = image(header, data, sizeof data, &size);
    ref_st_file f;
    zt_error err;
    ZT_CHECK_INT(ref_st_open_memory(buf, size, "hand.safetensors", &f, &err), ZT_OK);
    ZT_CHECK_INT(f.n_tensors, 6); /* __metadata__ is not a tensor */

    float *x = NULL;
    int64_t shape_a[1] = {2};
    ZT_CHECK_INT(ref_st_read_f32(&f, "a", 1, shape_a, &x, &err), ZT_OK);
    ZT_CHECK(x && x[0] == 1.5f && x[1] == -2.0f);
    free(x);
    ZT_CHECK_INT(ref_st_read_f32(&f, "h", 0, NULL, &x, &err), ZT_OK);
    ZT_CHECK(x[0] == 1.0f && x[1] == -2.0f && x[2] == 5.9604644775390625e-08f);
    ZT_CHECK(isinf(x[3]) && x[3] > 0 && x[4] == 0.333251953125f);
    free(x);
    int64_t shape_b[2] = {1, 2};
    ZT_CHECK_INT(ref_st_read_f32(&f, "b", 2, shape_b, &x, &err), ZT_OK);
    ZT_CHECK(x[0] == 1.0f && x[1] == -5.0f);
    free(x);
    int32_t *ints = NULL;
    ZT_CHECK_INT(ref_st_read_i32(&f, "i", 0, NULL, &ints, &err), ZT_OK);
    ZT_CHECK(ints[0] == 7 && ints[1] == -3);
    free(ints);
    ZT_CHECK_INT(ref_st_read_f32(&f, "empty", 0, NULL, &x, &err), ZT_OK);
    free(x);

    /* Typed-read errors. */
    ZT_CHECK_INT(ref_st_read_i32(&f, "big", 0, NULL, &ints, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "tensor \"big\" element 0 is 1099511627776, outside the int32 range");
    ZT_CHECK_INT(ref_st_read_f32(&f, "i", 0, NULL, &x, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "tensor \"i\" is I64, expected a floating-point tensor");
    ZT_CHECK_INT(ref_st_read_i32(&f, "a", 0, NULL, &ints, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "tensor \"a\" is F32, expected an integer tensor");
    int64_t wrong[2] = {2, 1};
    ZT_CHECK_INT(ref_st_read_f32(&f, "b", 2, wrong, &x, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "hand.safetensors: tensor \"b\" has shape [1, 2], expected [2, 1]");
    ZT_CHECK_INT(ref_st_read_f32(&f, "nope", 0, NULL, &x, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "no tensor \"nope\" (the file has 6)");
    ref_st_close(&f);
    free(buf);
}

static void test_header_errors(void)
{
    ref_st_file f;
    zt_error err;
    ZT_CHECK_INT(ref_st_open_memory("abc", 3, "bad.safetensors", &f, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "bad.safetensors: the file has 3 bytes, fewer than the 8-byte header");
    unsigned char huge[12] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    ZT_CHECK_INT(ref_st_open_memory(huge, sizeof huge, "bad.safetensors", &f, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "the header length field says 65535 bytes but the file has 4 bytes");

    expect_header_error("{\"a\": }", 0, ZT_ERR_FORMAT, "(safetensors header):1:7", NULL);
    expect_header_error("[1]", 0, ZT_ERR_FORMAT, "the header is not a JSON object", NULL);
    expect_header_error("{\"a\":3}", 0, ZT_ERR_FORMAT, "tensor \"a\": the entry is not an object", NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, ZT_ERR_FORMAT,
                        "header line 1, column 6: tensor \"a\": it lacks one of", NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                        ZT_ERR_FORMAT, "dtype \"F8_E4M3\" is not supported",
                        "knows F32, F16, BF16, I32 and I64");
    expect_header_error("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ZT_ERR_FORMAT,
                        "\"dtype\" is not a string", NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                        ZT_ERR_FORMAT, "a \"shape\" entry is not a non-negative integer", NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
                        ZT_ERR_FORMAT, "a \"shape\" entry is not a non-negative integer", NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                        ZT_ERR_FORMAT, "it has 7 dimensions, more than the 6 supported", NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                        ZT_ERR_FORMAT, "data_offsets [0, 8] do not lie within the 4 bytes of data",
                        "truncated");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,0]}}", 8,
                        ZT_ERR_FORMAT, "do not lie within", NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
                        ZT_ERR_FORMAT, "\"data_offsets\" is not an array of two non-negative integers",
                        NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                        ZT_ERR_FORMAT, "it holds 4 bytes but 2 F32 elements need 8", NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                        8, ZT_ERR_FORMAT, "the data of tensors \"a\" and \"b\" overlap", NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                        8, ZT_ERR_FORMAT, "tensor \"a\": the name appears twice", NULL);

    ZT_CHECK_INT(ref_st_open("/nonexistent/model.safetensors", &f, &err), ZT_ERR_IO);
    ZT_CHECK_CONTAINS(err.msg, "/nonexistent/model.safetensors: cannot open: No such file");
}

/* A real file written by transformers: all parameters F32 with their shapes; then the same bytes
 * cut short must fail cleanly. */
static void test_real_files(void)
{
    ref_st_file f;
    zt_error err;
    const char *path = FIXTURE_DIR "/llama_gqa_untied/model.safetensors";
    ZT_CHECK_INT(ref_st_open(path, &f, &err), ZT_OK);
    ZT_CHECK_INT(f.n_tensors, 1 + 2 * 9 + 1 + 1); /* embed, 2 layers of 9, norm, lm_head */
    const ref_st_tensor *q = ref_st_find(&f, "model.layers.1.self_attn.q_proj.weight");
    ZT_CHECK(q && q->dtype == ZT_F32 && q->ndim == 2 && q->shape[0] == 48 && q->shape[1] == 32);
    const ref_st_tensor *k = ref_st_find(&f, "model.layers.0.self_attn.k_proj.weight");
    ZT_CHECK(k && k->shape[0] == 24 && k->shape[1] == 32);

    ref_st_file cut;
    ZT_CHECK_INT(ref_st_open_memory(f.bytes, f.size - 100, "cut.safetensors", &cut, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "cut.safetensors: header line 1");
    ZT_CHECK_CONTAINS(err.msg, "do not lie within");
    ref_st_close(&f);

    /* stories260K: 47 F32 tensors, tied embeddings (no lm_head), per shared/data/PROVENANCE.md. */
    const char *stories = SHARED_DATA "/weights/stories260K_hf/model.safetensors";
    struct stat sb;
    if (stat(stories, &sb) != 0) {
        fprintf(stderr, "note: %s not found, real-checkpoint check skipped\n", stories);
        return;
    }
    ZT_CHECK_INT(ref_st_open(stories, &f, &err), ZT_OK);
    ZT_CHECK_INT(f.n_tensors, 47);
    ZT_CHECK(ref_st_find(&f, "lm_head.weight") == NULL);
    const ref_st_tensor *embed = ref_st_find(&f, "model.embed_tokens.weight");
    ZT_CHECK(embed && embed->shape[0] == 512 && embed->shape[1] == 64 && embed->dtype == ZT_F32);
    ref_st_close(&f);
}

int main(void)
{
    test_values();
    test_header_errors();
    test_real_files();
    return zt_test_result();
}
