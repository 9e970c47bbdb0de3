/* framework/base/checksum.c's CRC-32C and framework/train/tensorboard.c's files, without a reader:
 * the CRC against published vectors (RFC 3720, B.4) and masked values computed by the tensorboard
 * package (tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c); the TFRecord frame's
 * layout; a write that fails part way cut back to the last whole event (the file's size is measured
 * here, not read back through the code under test); a second session in the same second getting a file
 * of its own, the first left byte for byte; the directory DeepSpeed's keys name; --check's errors.
 * tests/train/check_tensorboard.py reads the files of a real run with TensorBoard's own reader.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "train/tensorboard.h"
#include "ztest.h"

static char g_dir[256];

static void test_crc32c_vectors(void)
{
    unsigned char zeros[32], ones[32], up[32], down[32];
    for (int i = 0; i < 32; i++) {
        zeros[i] = 0;
        ones[i] = 0xff;
        up[i] = (unsigned char)i;
        down[i] = (unsigned char)(31 - i);
    }
    ZT_CHECK_INT(zt_crc32c(0, "123456789", 9), 0xE3069283u);
    ZT_CHECK_INT(zt_crc32c(0, zeros, 32), 0x8A9136AAu);
    ZT_CHECK_INT(zt_crc32c(0, ones, 32), 0x62A8AB43u);
    ZT_CHECK_INT(zt_crc32c(0, up, 32), 0x46DD794Eu);
    ZT_CHECK_INT(zt_crc32c(0, down, 32), 0x113FDB5Cu);
    ZT_CHECK_INT(zt_crc32c(0, "", 0), 0);
    /* incremental: pieces chain to the whole */
    ZT_CHECK_INT(zt_crc32c(zt_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
    /* masked, as TFRecord stores them (tensorboard's masked_crc32c) */
    ZT_CHECK_INT(zt_crc32c_masked(zt_crc32c(0, "123456789", 9)), 0xC78AB0E5u);
    ZT_CHECK_INT(zt_crc32c_masked(zt_crc32c(0, "", 0)), 0xA282EAD8u);
    ZT_CHECK_INT(zt_crc32c_masked(zt_crc32c(0, zeros, 8)), 0x07980329u);
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void test_frame(void)
{
    unsigned char out[9 + 16];
    zt_tfrecord_frame("123456789", 9, out);
    ZT_CHECK_INT(le(out, 8), 9);
    ZT_CHECK_INT(le(out + 8, 4), zt_crc32c_masked(zt_crc32c(0, out, 8)));
    ZT_CHECK(memcmp(out + 12, "123456789", 9) == 0);
    ZT_CHECK_INT(le(out + 21, 4), 0xC78AB0E5u);
}

static zt_host_settings settings(const char *base, const char *job)
{
    zt_host_settings s;
    memset(&s, 0, sizeof s);
    s.tensorboard = 1;
    s.tensorboard_output_path = base;
    s.tensorboard_job_name = job;
    return s;
}

static void test_dir(void)
{
    char buf[4096];
    zt_error err = {0};
    const char *cases[][3] = {{"a", "b", "a/b"}, {"a/", "b", "a/b"}, {"", "b", "b"}, {"a", "", "a"}};
    for (int i = 0; i < 4; i++) {
        zt_host_settings s = settings(cases[i][0], cases[i][1]);
        ZT_CHECK_INT(zt_tensorboard_dir(&s, buf, sizeof buf, &err), ZT_OK);
        ZT_CHECK(strcmp(buf, cases[i][2]) == 0);
    }
    zt_host_settings s = settings("", "");
    ZT_CHECK_INT(zt_tensorboard_dir(&s, buf, sizeof buf, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "tensorboard.output_path and tensorboard.job_name are both empty");
}

/* A path below a regular file cannot be a directory, not even for root. */
static void test_check(void)
{
    char file[512], base[600];
    snprintf(file, sizeof file, "%s/a-file", g_dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    snprintf(base, sizeof base, "%s/x", file);
    zt_host_settings s = settings(base, "job");
    zt_error err = {0};
    ZT_CHECK(zt_tensorboard_check(&s, &err) != ZT_OK);
    ZT_CHECK_CONTAINS(err.msg, "TensorBoard");
    ZT_CHECK_CONTAINS(err.msg, "set tensorboard.output_path");
    snprintf(base, sizeof base, "%s/ok", g_dir);
    s = settings(base, "job");
    ZT_CHECK_INT(zt_tensorboard_check(&s, &err), ZT_OK);
    char job[700];
    snprintf(job, sizeof job, "%s/job", base);
    DIR *d = opendir(job);
    ZT_CHECK(d != NULL);
    int entries = 0;
    for (struct dirent *e; d && (e = readdir(d));) entries += e->d_name[0] != '.' || strlen(e->d_name) > 2;
    if (d) closedir(d);
    ZT_CHECK_INT(entries, 0); /* the probe file is gone */
}

static zt_train_record record(int64_t step)
{
    zt_train_record r;
    memset(&r, 0, sizeof r);
    r.step = step;
    r.total_steps = 10;
    r.loss = 2.5;
    r.lr = 1e-3;
    r.tokens = 100;
    r.step_s = 0.5;
    return r;
}

static off_t size_of(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_size : -1;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *text = malloc(1 << 16);
    *len = f ? fread(text, 1, 1 << 16, f) : 0;
    if (f) fclose(f);
    return text;
}

static void test_failed_write_and_second_session(void)
{
    char base[512];
    snprintf(base, sizeof base, "%s/runs", g_dir);
    zt_host_settings s = settings(base, "job");
    zt_error err = {0};
    zt_tensorboard *tb = NULL;
    ZT_CHECK_INT(zt_tensorboard_open(&s, 8, 0, &tb, &err), ZT_OK);
    if (!tb) return;
    char path[4096];
    snprintf(path, sizeof path, "%s", zt_tensorboard_path(tb));
    ZT_CHECK_CONTAINS(path, "/runs/job/events.out.tfevents.");
    for (int64_t step = 1; step <= 2; step++) {
        zt_train_record r = record(step);
        ZT_CHECK_INT(zt_tensorboard_train(tb, &r, &err), ZT_OK);
    }
    ZT_CHECK_INT(zt_tensorboard_eval(tb, 2, 2.4, &err), ZT_OK);
    off_t whole = size_of(path);
    struct rlimit old, low;
    getrlimit(RLIMIT_FSIZE, &old);
    low = old;
    low.rlim_cur = (rlim_t)whole + 20; /* room for 20 bytes of the next event, not all of it */
    signal(SIGXFSZ, SIG_IGN);          /* the limit then fails the write with EFBIG */
    ZT_CHECK_INT(setrlimit(RLIMIT_FSIZE, &low), 0);
    zt_train_record r = record(3);
    zt_status st = zt_tensorboard_train(tb, &r, &err);
    setrlimit(RLIMIT_FSIZE, &old);
    ZT_CHECK_INT(st, ZT_ERR_IO);
    ZT_CHECK_CONTAINS(err.msg, "cannot write to the TensorBoard event file");
    ZT_CHECK_CONTAINS(err.msg, "it still ends with the last whole event");
    ZT_CHECK_INT(size_of(path), whole);
    zt_tensorboard_close(tb);

    /* a resumed session, at once: a file of its own; the first is not touched */
    size_t len_before = 0, len_after = 0;
    char *before = slurp(path, &len_before);
    zt_tensorboard *again = NULL;
    ZT_CHECK_INT(zt_tensorboard_open(&s, 8, 2, &again, &err), ZT_OK);
    if (again) {
        ZT_CHECK(strcmp(zt_tensorboard_path(again), path) != 0);
        ZT_CHECK(strcmp(zt_tensorboard_path(again), path) > 0); /* read after it */
        r = record(3);
        ZT_CHECK_INT(zt_tensorboard_train(again, &r, &err), ZT_OK);
    }
    zt_tensorboard_close(again);
    char *after = slurp(path, &len_after);
    ZT_CHECK(len_after == len_before && memcmp(before, after, len_before) == 0);
    free(before);
    free(after);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/zt-test-tensorboard-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc32c_vectors();
    test_frame();
    test_dir();
    test_check();
    test_failed_write_and_second_session();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", g_dir);
    return zt_test_result();
}
