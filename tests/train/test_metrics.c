/* framework/train/metrics.c: metrics.jsonl across a failed write and a resume. A write that fails part
 * way (a full disk, here the file-size limit RLIMIT_FSIZE, which cuts a write() short exactly as a
 * full disk does) must leave the file ending with the last whole record; a resume keeps the records
 * up to the checkpoint's step byte for byte, removes a torn last line (zt's own record cut short) with
 * a warning, and still refuses a file someone else changed. Expected contents are built here from
 * the records written, never read back through the code under test.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/metrics.h"
#include "runtime/stderr_capture.h"
#include "ztest.h"

static char g_path[4096];

static char *slurp(size_t *len)
{
    FILE *f = fopen(g_path, "rb");
    if (!f) return NULL;
    char *text = malloc(1 << 20);
    *len = fread(text, 1, (1 << 20) - 1, f);
    text[*len] = '\0';
    fclose(f);
    return text;
}

static void spit(const char *text, size_t len)
{
    FILE *f = fopen(g_path, "wb");
    fwrite(text, 1, len, f);
    fclose(f);
}

static void append(const char *text)
{
    FILE *f = fopen(g_path, "ab");
    fputs(text, f);
    fclose(f);
}

static zt_status train_record(zt_metrics *m, int64_t step, zt_error *err)
{
    zt_train_record r;
    memset(&r, 0, sizeof r);
    r.step = step;
    r.total_steps = 10;
    r.loss = 2.5 + (double)step / 8;
    r.lr = 1e-3;
    r.grad_norm = 1.0;
    r.tokens = 100;
    r.loss_tokens = 60;
    r.step_s = 0.5;
    return zt_metrics_train(m, &r, err);
}

/* A new metrics.jsonl holding train records 1..n; returns its text. */
static char *fresh(int64_t n, size_t *len)
{
    zt_metrics *m = NULL;
    zt_error err = {0};
    ZT_CHECK_INT(zt_metrics_open(g_path, -1, &m, &err), ZT_OK);
    for (int64_t s = 1; m && s <= n; s++) ZT_CHECK_INT(train_record(m, s, &err), ZT_OK);
    zt_metrics_close(m);
    return slurp(len);
}

/* The first n lines of text. */
static size_t prefix_lines(const char *text, int n)
{
    const char *p = text;
    for (int i = 0; i < n && p; i++) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    return p ? (size_t)(p - text) : strlen(text);
}

/* Resume at `step`: the status, with stderr captured into log (when given). */
static zt_status resume_at(int64_t step, zt_error *err, char *log, size_t cap)
{
    stderr_capture c;
    capture_begin(&c);
    zt_metrics *m = NULL;
    zt_status st = zt_metrics_open(g_path, step, &m, err);
    zt_metrics_close(m);
    const char *text = capture_end(&c);
    if (log) snprintf(log, cap, "%s", text);
    return st;
}

static void expect_file(const char *want, size_t want_len, const char *what)
{
    size_t len = 0;
    char *have = slurp(&len);
    int same = have && len == want_len && memcmp(have, want, len) == 0;
    if (!same) fprintf(stderr, "%s: metrics.jsonl is\n%s\nexpected\n%.*s\n", what, have ? have : "(none)", (int)want_len, want);
    ZT_CHECK(same);
    free(have);
}

/* A write cut short by a full disk: the partial record is cut back off; resuming keeps the rest. */
static void test_failed_write(void)
{
    zt_metrics *m = NULL;
    zt_error err = {0};
    ZT_CHECK_INT(zt_metrics_open(g_path, -1, &m, &err), ZT_OK);
    for (int64_t s = 1; s <= 3; s++) ZT_CHECK_INT(train_record(m, s, &err), ZT_OK);
    size_t len3 = 0;
    char *three = slurp(&len3);
    struct rlimit old, low;
    getrlimit(RLIMIT_FSIZE, &old);
    low = old;
    low.rlim_cur = (rlim_t)len3 + 40; /* room for 40 bytes of the next record, not all of it */
    signal(SIGXFSZ, SIG_IGN);         /* the limit then fails the write with EFBIG */
    ZT_CHECK_INT(setrlimit(RLIMIT_FSIZE, &low), 0);
    zt_status st = train_record(m, 4, &err);
    setrlimit(RLIMIT_FSIZE, &old);
    ZT_CHECK_INT(st, ZT_ERR_IO);
    ZT_CHECK_CONTAINS(err.msg, "cannot write to the metrics file");
    ZT_CHECK_CONTAINS(err.msg, "it still ends with the last whole record");
    zt_metrics_close(m);
    expect_file(three, len3, "after the failed write");
    ZT_CHECK_INT(resume_at(3, &err, NULL, 0), ZT_OK);
    expect_file(three, len3, "resumed at step 3");
    free(three);
}

/* The reported case: the last line is a record cut short; it is removed with a warning. */
static void test_torn_last_line(void)
{
    size_t len = 0;
    char *five = fresh(5, &len);
    zt_error err = {0};
    char log[16384];
    /* no line end */
    append("{\"step\":6,\"type\":\"train\",\"total_st");
    ZT_CHECK_INT(resume_at(3, &err, log, sizeof log), ZT_OK);
    ZT_CHECK_CONTAINS(log, "metrics.jsonl:6: removed a torn last line (34 bytes, not a whole record)");
    ZT_CHECK_CONTAINS(log, "the records up to step 3 are kept");
    ZT_CHECK_CONTAINS(log, "dropped 2 records of steps after 3");
    expect_file(five, prefix_lines(five, 3), "torn line without a line end");
    /* a start of a record with a line end (a record cut short and ended by something else) */
    spit(five, len);
    append("{\"step\":6,\"ty\n");
    ZT_CHECK_INT(resume_at(5, &err, log, sizeof log), ZT_OK);
    ZT_CHECK_CONTAINS(log, "metrics.jsonl:6: removed a torn last line");
    expect_file(five, len, "torn record start");
    /* torn right before its line end: the record is whole and of a kept step, so it stays */
    spit(five, len - 1);
    ZT_CHECK_INT(resume_at(5, &err, log, sizeof log), ZT_OK);
    ZT_CHECK(!strstr(log, "torn"));
    expect_file(five, len, "a whole last record without its line end");
    free(five);
}

/* Lines that are not zt's: refused, the file left as it was. */
static void test_refused(void)
{
    size_t len = 0;
    char *five = fresh(5, &len);
    size_t one = prefix_lines(five, 1);
    char *edited = malloc(len + 16);
    memcpy(edited, five, one);
    memcpy(edited + one, "hello\n", 6);
    memcpy(edited + one + 6, five + one, len - one);
    spit(edited, len + 6);
    zt_error err = {0};
    ZT_CHECK_INT(resume_at(5, &err, NULL, 0), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "metrics.jsonl:2 is not a metrics record");
    ZT_CHECK_CONTAINS(err.msg, "the file was changed by something else");
    expect_file(edited, len + 6, "a bad line in the middle");
    /* a last line with a line end that is not the start of a record: someone else's too */
    spit(five, len);
    append("hello\n");
    ZT_CHECK_INT(resume_at(5, &err, NULL, 0), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "metrics.jsonl:6 is not a metrics record");
    free(edited);
    free(five);
}

/* Records out of step order (an edited file): rewritten, keeping every record of a step <= 3. */
static void test_out_of_order(void)
{
    size_t len = 0;
    char *five = fresh(5, &len);
    size_t l2 = prefix_lines(five, 2), l3 = prefix_lines(five, 3), l5 = prefix_lines(five, 5);
    /* lines 1, 2, 5, 3 */
    char *mixed = malloc(len + 1), *want = malloc(len + 1);
    size_t n = 0;
    memcpy(mixed, five, l2);
    n = l2;
    memcpy(mixed + n, five + prefix_lines(five, 4), l5 - prefix_lines(five, 4));
    n += l5 - prefix_lines(five, 4);
    memcpy(mixed + n, five + l2, l3 - l2);
    n += l3 - l2;
    spit(mixed, n);
    memcpy(want, five, l3);
    zt_error err = {0};
    ZT_CHECK_INT(resume_at(3, &err, NULL, 0), ZT_OK);
    expect_file(want, l3, "out of order");
    free(mixed);
    free(want);
    free(five);
}

int main(void)
{
    char dir[] = "zt-metrics-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    snprintf(g_path, sizeof g_path, "%s/metrics.jsonl", dir);
    test_failed_write();
    test_torn_last_line();
    test_refused();
    test_out_of_order();
    unlink(g_path);
    rmdir(dir);
    return zt_test_result();
}
