/* The --export option values: sizes as transformers' convert_file_size_to_int reads max_shard_size
 * (the expected numbers are what transformers 5.24 returns for each string), and the dtype names. */
#include "state/hf_export.h"
#include "state/safetensors.h"
#include "ztest.h"

static void size_is(const char *text, uint64_t want)
{
    zt_error err;
    uint64_t got = 0;
    ZT_CHECK_INT(zt_hf_parse_shard_size(text, "--export-shard-size", &got, &err), ZT_OK);
    ZT_CHECK_INT(got, want);
}

static void size_refused(const char *text)
{
    zt_error err;
    uint64_t got = 0;
    ZT_CHECK_INT(zt_hf_parse_shard_size(text, "--export-shard-size", &got, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "is not a size");
}

int main(void)
{
    size_is("5GB", 5000000000ull);
    size_is("5GiB", 5368709120ull);
    size_is("500MB", 500000000ull);
    size_is("100KiB", 102400ull);
    size_is("10Gb", 1250000000ull); /* a lowercase b: bits */
    size_is("1kb", 125ull);
    size_is("5gb", 625000000ull);
    size_is("2mib", 2097152ull);
    size_is("3KB", 3000ull);
    size_is("4096", 4096ull); /* transformers' int: bytes */
    size_refused("");
    size_refused("GB");
    size_refused("1.5GB");
    size_refused("5 GB");
    size_refused("5TB");
    size_refused("0");
    size_refused("-1GB");
    size_refused("99999999999999999999GB");

    zt_error err;
    int dtype = 0;
    const char *names[] = {"fp32", "float32", "bf16", "bfloat16", "fp16", "float16", "auto"};
    const int want[] = {ZT_ST_F32, ZT_ST_F32, ZT_ST_BF16, ZT_ST_BF16, ZT_ST_F16, ZT_ST_F16, -1};
    for (int i = 0; i < 7; i++) {
        ZT_CHECK_INT(zt_hf_parse_dtype(names[i], "--export-dtype", &dtype, &err), ZT_OK);
        ZT_CHECK_INT(dtype, want[i]);
    }
    ZT_CHECK_INT(zt_hf_parse_dtype("fp8", "--export-dtype", &dtype, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "use fp32, bf16, fp16, or auto");
    return zt_test_result();
}
