/* The minimum-version checks behind zt-run --env and a run that refuses to start: version parsing
 * and comparison (base/version.c), the CUDA verdicts (device/requirements.c) and the NCCL and MPI
 * verdicts (dist/requirements.c), against versions and words written out here by hand. */
#include <stdio.h>
#include <string.h>

#include "base/version.h"
#include "device/requirements.h"
#include "dist/requirements.h"
#include "ztest.h"

static void check_parse(const char *text, int ok, int major, int minor, int patch, int parts)
{
    zt_version v;
    int got = zt_version_parse(text, &v);
    if (got != ok || (ok && (v.major != major || v.minor != minor || v.patch != patch || v.parts != parts))) {
        fprintf(stderr, "parse \"%s\": %d -> %d.%d.%d (%d parts), expected %d -> %d.%d.%d (%d parts)\n", text, got,
                v.major, v.minor, v.patch, v.parts, ok, major, minor, patch, parts);
        zt_test_failures++;
    }
}

static zt_version V(const char *text)
{
    zt_version v;
    ZT_CHECK(zt_version_parse(text, &v));
    return v;
}

static void test_parse(void)
{
    check_parse("2.18.3", 1, 2, 18, 3, 3);
    check_parse("13.0", 1, 13, 0, 0, 2);
    check_parse("3", 1, 3, 0, 0, 1);
    check_parse("v4.1.6", 1, 4, 1, 6, 3);
    check_parse("2.18.3+cuda12.2", 1, 2, 18, 3, 3); /* NCCL's package suffix */
    check_parse("4.1.6 (Debian)", 1, 4, 1, 6, 3);
    check_parse("", 0, 0, 0, 0, 0);
    check_parse("v", 0, 0, 0, 0, 0);
    check_parse("2.", 0, 0, 0, 0, 0);
    check_parse(".1", 0, 0, 0, 0, 0);
    check_parse("2..3", 0, 0, 0, 0, 0);
    check_parse("1.2.3.4", 0, 0, 0, 0, 0);
    check_parse("x1.2", 0, 0, 0, 0, 0);
    check_parse("1000000.0", 0, 0, 0, 0, 0);
    zt_version v;
    ZT_CHECK(!zt_version_parse(NULL, &v));
}

static void test_compare_and_format(void)
{
    ZT_CHECK(zt_version_compare(V("2.14"), V("2.14.0")) == 0);
    ZT_CHECK(zt_version_compare(V("2.9"), V("2.14")) < 0); /* numbers, not text: "2.9" > "2.14" as strings */
    ZT_CHECK(zt_version_compare(V("2.14.3"), V("2.14")) > 0);
    ZT_CHECK(zt_version_compare(V("10.0"), V("9.9.9")) > 0);
    ZT_CHECK(zt_version_compare(V("3"), V("3.0")) == 0);
    char b[48];
    ZT_CHECK(!strcmp(zt_version_format(V("2.14"), b, sizeof b), "2.14"));
    ZT_CHECK(!strcmp(zt_version_format(V("2.18.3"), b, sizeof b), "2.18.3"));
    ZT_CHECK(!strcmp(zt_version_format(V("v7"), b, sizeof b), "7"));
    ZT_CHECK(!strcmp(zt_version_format(zt_version_of_cuda(13000), b, sizeof b), "13.0"));
    ZT_CHECK(!strcmp(zt_version_format(zt_version_of_cuda(12020), b, sizeof b), "12.2"));
    ZT_CHECK(!strcmp(zt_version_format(zt_version_of_cuda(11080), b, sizeof b), "11.8"));
    ZT_CHECK(!strcmp(zt_version_format(zt_version_of_nccl(22809), b, sizeof b), "2.28.9"));
    ZT_CHECK(!strcmp(zt_version_format(zt_version_of_nccl(21403), b, sizeof b), "2.14.3"));
    ZT_CHECK(!strcmp(zt_version_format(zt_version_of_nccl(2708), b, sizeof b), "2.7.8")); /* before 2.9's code */
}

static void test_verdict(void)
{
    char out[512];
    ZT_CHECK(zt_version_verdict(V("2.28.9"), V("2.14"), "why", out, sizeof out));
    ZT_CHECK(!strcmp(out, "ok: 2.28.9 (need 2.14 or newer)"));
    ZT_CHECK(zt_version_verdict(V("2.14.0"), V("2.14"), "why", out, sizeof out));
    ZT_CHECK(!zt_version_verdict(V("2.12.12"), V("2.14"), "it calls X", out, sizeof out));
    ZT_CHECK(!strcmp(out, "too old: need 2.14, have 2.12.12 (it calls X)"));
}

static void test_cuda(void)
{
    char out[2048];
    ZT_CHECK_INT(zt_cuda_driver_verdict(0, 13000, out, sizeof out), ZT_REQ_MISSING);
    ZT_CHECK_CONTAINS(out, "not found: no NVIDIA driver");
    /* A 12.4 driver cannot start the 13.0 runtime. */
    ZT_CHECK_INT(zt_cuda_driver_verdict(12040, 13000, out, sizeof out), ZT_REQ_TOO_OLD);
    ZT_CHECK_CONTAINS(out, "too old: need 13.0, have 12.4 (the CUDA 13.0 runtime zt links");
    ZT_CHECK_CONTAINS(out, "NVIDIA driver 580 or newer supports CUDA 13");
    /* Minor version compatibility: a 12.2 driver runs the 12.8 runtime. */
    ZT_CHECK_INT(zt_cuda_driver_verdict(12020, 12080, out, sizeof out), ZT_REQ_OK);
    ZT_CHECK_CONTAINS(out, "ok: 12.2 (need 12.0 or newer); older than the CUDA 12.8 runtime");
    ZT_CHECK_INT(zt_cuda_driver_verdict(13000, 13000, out, sizeof out), ZT_REQ_OK);
    ZT_CHECK(!strcmp(out, "ok: 13.0 (need 13.0 or newer)"));

    ZT_CHECK_INT(zt_cuda_runtime_verdict(12040, 12080, out, sizeof out), ZT_REQ_TOO_OLD);
    ZT_CHECK_CONTAINS(out, "too old: need 12.8, have 12.4 (zt was compiled against the CUDA 12.8 headers");
    ZT_CHECK_INT(zt_cuda_runtime_verdict(13010, 13000, out, sizeof out), ZT_REQ_OK);

    const char *archs = "80,86,89,90";
    ZT_CHECK_INT(zt_cuda_gpu_verdict(7, 0, archs, 13000, 13000, out, sizeof out), ZT_REQ_TOO_OLD);
    ZT_CHECK_CONTAINS(out, "too old: need 8.0, have 7.0 (zt's CUDA kernels compute in bf16 and fp16");
    ZT_CHECK_INT(zt_cuda_gpu_verdict(9, 0, archs, 13000, 13000, out, sizeof out), ZT_REQ_OK);
    ZT_CHECK_CONTAINS(out, "ok: 9.0 (need 8.0 or newer); zt's build has machine code for it (sm_90)");
    /* sm_86 runs on 8.7 (the same major, a newer minor); nothing of 8.x runs on 9.0's machine code. */
    ZT_CHECK_INT(zt_cuda_gpu_verdict(8, 7, archs, 13000, 13000, out, sizeof out), ZT_REQ_OK);
    ZT_CHECK_CONTAINS(out, "(sm_86)");
    /* No machine code for 12.0: the driver compiles the newest PTX, compute_90, and must know its CUDA. */
    ZT_CHECK_INT(zt_cuda_gpu_verdict(12, 0, archs, 13000, 13000, out, sizeof out), ZT_REQ_OK);
    ZT_CHECK_CONTAINS(out, "compiles zt's compute_90 PTX");
    ZT_CHECK_INT(zt_cuda_gpu_verdict(12, 0, archs, 12080, 13000, out, sizeof out), ZT_REQ_TOO_OLD);
    ZT_CHECK_CONTAINS(out, "too old: the driver: need one for CUDA 13.0 or newer, have one for CUDA 12.8");
    /* Machine code only, for another capability: nothing runs. */
    ZT_CHECK_INT(zt_cuda_gpu_verdict(8, 0, "90-real", 13000, 13000, out, sizeof out), ZT_REQ_UNSUPPORTED);
    ZT_CHECK_CONTAINS(out, "none of which runs on compute capability 8.0: rebuild zt with "
                           "-DCMAKE_CUDA_ARCHITECTURES=\"90-real;80\"");
    /* sm_90a runs on 9.0 only, and its PTX compiles for 9.0 only. */
    ZT_CHECK_INT(zt_cuda_gpu_verdict(9, 0, "90a", 13000, 13000, out, sizeof out), ZT_REQ_OK);
    ZT_CHECK_CONTAINS(out, "(sm_90a)");
    ZT_CHECK_INT(zt_cuda_gpu_verdict(10, 0, "90a", 13000, 13000, out, sizeof out), ZT_REQ_UNSUPPORTED);
    /* PTX only: compiled by the driver for any newer capability. */
    ZT_CHECK_INT(zt_cuda_gpu_verdict(8, 9, "80-virtual", 13000, 13000, out, sizeof out), ZT_REQ_OK);
    ZT_CHECK_CONTAINS(out, "compute_80 PTX");
    /* A list zt cannot read ("native"), or none (a build without CUDA): only the minimum is checked. */
    ZT_CHECK_INT(zt_cuda_gpu_verdict(8, 0, "native", 13000, 13000, out, sizeof out), ZT_REQ_OK);
    ZT_CHECK(!strcmp(out, "ok: 8.0 (need 8.0 or newer)"));
    ZT_CHECK_INT(zt_cuda_gpu_verdict(8, 0, "", 0, 0, out, sizeof out), ZT_REQ_OK);
}

static void test_libraries(void)
{
    char out[2048];
    zt_library_info info;
    memset(&info, 0, sizeof info);
    snprintf(info.why, sizeof info.why, "libnccl.so.2: cannot open shared object file");
    ZT_CHECK_INT(zt_nccl_verdict(&info, out, sizeof out), ZT_REQ_MISSING);
    ZT_CHECK(!strcmp(out, "not found (libnccl.so.2: cannot open shared object file)"));
    info.found = 1;
    snprintf(info.path, sizeof info.path, "/opt/nccl/libnccl.so.2");
    snprintf(info.why, sizeof info.why, "ncclGetVersion failed");
    ZT_CHECK_INT(zt_nccl_verdict(&info, out, sizeof out), ZT_REQ_MISSING);
    ZT_CHECK_CONTAINS(out, "found at /opt/nccl/libnccl.so.2, but ncclGetVersion failed: zt cannot tell");
    info.has_version = 1;
    info.version = zt_version_of_nccl(21212);
    ZT_CHECK_INT(zt_nccl_verdict(&info, out, sizeof out), ZT_REQ_TOO_OLD);
    ZT_CHECK_CONTAINS(out, "too old: need 2.14, have 2.12.12 (zt's NCCL backend creates non-blocking communicators "
                           "with ncclCommInitRankConfig");
    info.version = zt_version_of_nccl(21403);
    ZT_CHECK_INT(zt_nccl_verdict(&info, out, sizeof out), ZT_REQ_OK);
    ZT_CHECK(!strcmp(out, "ok: 2.14.3 (need 2.14 or newer)"));

    info.version = V("2.2");
    ZT_CHECK_INT(zt_mpi_verdict(&info, out, sizeof out), ZT_REQ_TOO_OLD);
    ZT_CHECK_CONTAINS(out, "too old: need 3.0, have 2.2 (zt's MPI backend waits through MPI_Iallreduce");
    info.version = V("3.1");
    ZT_CHECK_INT(zt_mpi_verdict(&info, out, sizeof out), ZT_REQ_OK);
}

int main(void)
{
    test_parse();
    test_compare_and_format();
    test_verdict();
    test_cuda();
    test_libraries();
    return zt_test_result();
}
