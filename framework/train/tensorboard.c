/* TensorBoard event files (tensorboard.h): TFRecords of hand-encoded Event protobufs. */
#define _GNU_SOURCE /* mkstemp, gethostname */
#include "train/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/checksum.h"
#include "base/fileio.h"
#include "base/log.h"
#include "host/runtime.h"

#define FIX_DIR "set tensorboard.output_path (and tensorboard.job_name) to a directory zt can write, or " \
                "tensorboard.enabled to false"

/* ---- protobuf, the few wire types an Event needs ---------------------------------------------- */

/* Field numbers of tensorflow/core/util/event.proto and framework/summary.proto. */
enum {
    EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5, EVENT_SESSION_LOG = 7,
    SUMMARY_VALUE = 1, VALUE_TAG = 1, VALUE_SIMPLE_VALUE = 2,
    SESSION_LOG_STATUS = 1, SESSION_LOG_START = 1,
};
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

/* A message being encoded; `failed` once an append ran out of memory (checked once, at the end). */
typedef struct pb {
    zt_buf b;
    int failed;
} pb;

static void pb_bytes(pb *p, const void *data, size_t n)
{
    if (!p->failed && zt_buf_append(&p->b, data, n) != 0) p->failed = 1;
}

static void pb_varint(pb *p, uint64_t v)
{
    unsigned char t[10];
    size_t n = 0;
    do {
        t[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) t[n] |= 0x80;
        n++;
    } while (v);
    pb_bytes(p, t, n);
}

static void pb_key(pb *p, int field, int wire)
{
    pb_varint(p, (uint64_t)field << 3 | (uint64_t)wire);
}

/* Little-endian, whatever the host's order. */
static void put_le(unsigned char *out, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) out[i] = (unsigned char)(v >> (8 * i));
}

static void pb_double(pb *p, int field, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    unsigned char t[8];
    put_le(t, bits, 8);
    pb_key(p, field, WIRE_FIXED64);
    pb_bytes(p, t, 8);
}

static void pb_float(pb *p, int field, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    unsigned char t[4];
    put_le(t, bits, 4);
    pb_key(p, field, WIRE_FIXED32);
    pb_bytes(p, t, 4);
}

static void pb_length_delimited(pb *p, int field, const void *data, size_t n)
{
    pb_key(p, field, WIRE_BYTES);
    pb_varint(p, n);
    pb_bytes(p, data, n);
}

/* ---- TFRecord framing ------------------------------------------------------------------------- */

void zt_tfrecord_frame(const void *data, size_t n, unsigned char *out)
{
    put_le(out, n, 8);
    put_le(out + 8, zt_crc32c_masked(zt_crc32c(0, out, 8)), 4);
    memcpy(out + 12, data, n);
    put_le(out + 12 + n, zt_crc32c_masked(zt_crc32c(0, data, n)), 4);
}

/* ---- the directory ---------------------------------------------------------------------------- */

zt_status zt_tensorboard_dir(const zt_host_settings *s, char *buf, size_t cap, zt_error *err)
{
    const char *base = s->tensorboard_output_path, *job = s->tensorboard_job_name;
    if (!base[0] && !job[0])
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "tensorboard.output_path and tensorboard.job_name are both empty: name the directory "
                            "for the event files with either (DeepSpeed writes to output_path/job_name)");
    int n;
    if (!base[0]) n = snprintf(buf, cap, "%s", job);
    else if (!job[0]) n = snprintf(buf, cap, "%s", base);
    else n = snprintf(buf, cap, "%s%s%s", base, base[strlen(base) - 1] == '/' ? "" : "/", job);
    if (n < 0 || (size_t)n >= cap - 64) /* room for the file name */
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "tensorboard.output_path/tensorboard.job_name \"%.100s...\" is longer than %zu bytes", buf,
                            cap - 65);
    return ZT_OK;
}

static zt_status make_dir(const zt_host_settings *s, char *dir, size_t cap, zt_error *err)
{
    zt_status st = zt_tensorboard_dir(s, dir, cap, err);
    if (st == ZT_OK) st = zt_mkdir_p(dir, "TensorBoard", FIX_DIR, err);
    return st;
}

zt_status zt_tensorboard_check(const zt_host_settings *s, zt_error *err)
{
    char dir[4096], probe[4200];
    zt_status st = make_dir(s, dir, sizeof dir, err);
    if (st != ZT_OK) return st;
    snprintf(probe, sizeof probe, "%s/.zt-check-XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0)
        return zt_error_set(err, ZT_ERR_IO, "cannot write in the TensorBoard directory %s: %s; " FIX_DIR, dir,
                            strerror(errno));
    close(fd);
    unlink(probe);
    return ZT_OK;
}

/* ---- writing ---------------------------------------------------------------------------------- */

struct zt_tensorboard {
    int fd;                   /* O_APPEND: every event is one write() at the end */
    char *path;
    off_t size;               /* bytes of whole events: where a failed write is cut back to */
    int64_t samples_per_step; /* the x-axis: samples seen through a step */
    pb summary;               /* the Summary being composed, reused */
};

const char *zt_tensorboard_path(const zt_tensorboard *tb)
{
    return tb->path;
}

static double wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Frames `event` and writes it with one write(); one that fails part way (a full disk) is cut back
 * off, so the file still ends with a whole event. */
static zt_status write_event(zt_tensorboard *tb, pb *event, zt_error *err)
{
    size_t n = event->b.len;
    unsigned char *frame = event->failed ? NULL : malloc(n + 16);
    if (!frame) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing an event to %s", tb->path);
    zt_tfrecord_frame(event->b.data, n, frame);
    size_t done = 0, len = n + 16;
    int e = 0;
    while (done < len) {
        ssize_t w = write(tb->fd, frame + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            e = w < 0 ? errno : ENOSPC;
            break;
        }
        done += (size_t)w;
    }
    free(frame);
    if (!e) {
        tb->size += (off_t)done;
        return ZT_OK;
    }
    int cut = done == 0 || ftruncate(tb->fd, tb->size) == 0;
    return zt_error_set(err, ZT_ERR_IO, "cannot write to the TensorBoard event file %s: %s (disk full?); %s",
                        tb->path, strerror(e),
                        cut ? "it still ends with the last whole event"
                            : "its last event may be cut short, which TensorBoard skips");
}

static void event_begin(pb *event, int64_t x)
{
    memset(event, 0, sizeof *event);
    pb_double(event, EVENT_WALL_TIME, wall_time());
    pb_key(event, EVENT_STEP, WIRE_VARINT);
    pb_varint(event, (uint64_t)x);
}

/* Writes the composed Summary as an Event at x-axis value `x`, and empties it. */
static zt_status write_summary(zt_tensorboard *tb, int64_t x, zt_error *err)
{
    pb event;
    event_begin(&event, x);
    pb_length_delimited(&event, EVENT_SUMMARY, tb->summary.b.data, tb->summary.b.len);
    event.failed |= tb->summary.failed;
    zt_status st = write_event(tb, &event, err);
    zt_buf_free(&event.b);
    zt_buf_free(&tb->summary.b);
    memset(&tb->summary, 0, sizeof tb->summary);
    return st;
}

/* One Summary.Value { tag, simple_value }: TensorBoard's scalars are float32. */
static void add_scalar(zt_tensorboard *tb, const char *tag, double v)
{
    pb value;
    memset(&value, 0, sizeof value);
    pb_length_delimited(&value, VALUE_TAG, tag, strlen(tag));
    pb_float(&value, VALUE_SIMPLE_VALUE, (float)v);
    pb_length_delimited(&tb->summary, SUMMARY_VALUE, value.b.data, value.b.len);
    tb->summary.failed |= value.failed;
    zt_buf_free(&value.b);
}

/* The peak of every pool and their sum, as metrics.jsonl has them. */
static void add_mem(zt_tensorboard *tb, const char *kind, const zt_mem_stats *mem)
{
    char tag[96];
    uint64_t total = 0;
    for (int p = 0; p < ZT_POOL_COUNT; p++) {
        snprintf(tag, sizeof tag, "zt/%s/%s/peak", kind, zt_pool_name(p));
        add_scalar(tb, tag, (double)mem[p].peak);
        total += mem[p].peak;
    }
    snprintf(tag, sizeof tag, "zt/%s/total/peak", kind);
    add_scalar(tb, tag, (double)total);
}

zt_status zt_tensorboard_train(zt_tensorboard *tb, const zt_train_record *r, zt_error *err)
{
    /* DeepSpeed's names where DeepSpeed logs the value (deepspeed/runtime/engine.py), zt/ for the rest */
    add_scalar(tb, "Train/Samples/train_loss", r->loss);
    add_scalar(tb, "Train/Samples/lr", r->lr);
    if (r->loss_scale > 0) add_scalar(tb, "Train/Samples/loss_scale", r->loss_scale); /* fp16 runs only */
    add_scalar(tb, "zt/grad_norm", r->grad_norm);
    add_scalar(tb, "zt/tokens_per_s", zt_train_record_tokens_per_s(r));
    add_scalar(tb, "zt/step_s", r->step_s);
    add_mem(tb, "mem_host", r->host_mem);
    if (r->has_device) add_mem(tb, "mem_device", r->device_mem);
    return write_summary(tb, r->step * tb->samples_per_step, err);
}

zt_status zt_tensorboard_eval(zt_tensorboard *tb, int64_t step, double eval_loss, zt_error *err)
{
    add_scalar(tb, "zt/eval_loss", eval_loss);
    return write_summary(tb, step * tb->samples_per_step, err);
}

/* events.out.tfevents.<time>.<host>, the name TensorBoard looks for; a file of that name already
 * there (two sessions in one second) gets .1, .2, ... after it, which sorts after it as it should. */
static zt_status create_file(zt_tensorboard *tb, const char *dir, zt_error *err)
{
    char host[256] = "localhost", path[4200];
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    long long now = (long long)time(NULL);
    for (int attempt = 0; attempt < 1000; attempt++) {
        int n = attempt ? snprintf(path, sizeof path, "%s/events.out.tfevents.%010lld.%s.%d", dir, now, host,
                                   attempt)
                        : snprintf(path, sizeof path, "%s/events.out.tfevents.%010lld.%s", dir, now, host);
        if (n < 0 || (size_t)n >= sizeof path)
            return zt_error_set(err, ZT_ERR_CONFIG, "the TensorBoard event file name under %s is too long", dir);
        tb->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
        if (tb->fd >= 0) {
            tb->path = strdup(path);
            return tb->path ? ZT_OK : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening %s", path);
        }
        if (errno != EEXIST)
            return zt_error_set(err, ZT_ERR_IO, "cannot create the TensorBoard event file %s: %s; " FIX_DIR, path,
                                strerror(errno));
    }
    return zt_error_set(err, ZT_ERR_IO, "cannot create a TensorBoard event file in %s: 1000 names taken", dir);
}

zt_status zt_tensorboard_open(const zt_host_settings *s, int64_t samples_per_step, int64_t start_step,
                              zt_tensorboard **out, zt_error *err)
{
    *out = NULL;
    char dir[4096];
    zt_status st = make_dir(s, dir, sizeof dir, err);
    if (st != ZT_OK) return st;
    zt_tensorboard *tb = calloc(1, sizeof *tb);
    if (!tb) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening a TensorBoard event file");
    tb->fd = -1;
    tb->samples_per_step = samples_per_step;
    st = create_file(tb, dir, err);

    /* The file version first (readers check it), then where this session starts: TensorBoard drops
     * what earlier files logged at or after it (tensorboard.h). */
    pb event;
    if (st == ZT_OK) {
        event_begin(&event, 0);
        pb_length_delimited(&event, EVENT_FILE_VERSION, "brain.Event:2", strlen("brain.Event:2"));
        st = write_event(tb, &event, err);
        zt_buf_free(&event.b);
    }
    if (st == ZT_OK) {
        pb session;
        memset(&session, 0, sizeof session);
        pb_key(&session, SESSION_LOG_STATUS, WIRE_VARINT);
        pb_varint(&session, SESSION_LOG_START);
        event_begin(&event, start_step * samples_per_step + 1);
        pb_length_delimited(&event, EVENT_SESSION_LOG, session.b.data, session.b.len);
        event.failed |= session.failed;
        st = write_event(tb, &event, err);
        zt_buf_free(&event.b);
        zt_buf_free(&session.b);
    }
    if (st != ZT_OK) {
        zt_tensorboard_close(tb);
        return st;
    }
    zt_log(ZT_LOG_INFO, "TensorBoard: writing events to %s", tb->path);
    *out = tb;
    return ZT_OK;
}

void zt_tensorboard_close(zt_tensorboard *tb)
{
    if (!tb) return;
    if (tb->fd >= 0) close(tb->fd);
    zt_buf_free(&tb->summary.b);
    free(tb->path);
    free(tb);
}
