/* TensorBoard event files: DeepSpeed's `tensorboard` block (enabled, output_path, job_name).
 *
 * Rank 0 writes OUTPUT_PATH/JOB_NAME/events.out.tfevents.<unix time>.<host>: TFRecord framing (uint64
 * length, masked CRC-32C of the length, the data, masked CRC-32C of the data) of Event protobufs,
 * encoded here by hand: the first holds file_version "brain.Event:2", the second a SessionLog START,
 * then one Event per train and eval record, each with every scalar of its record (docs/training.md,
 * "TensorBoard", lists the tags). The x-axis ("step" of the Event) is DeepSpeed's: samples (sequences)
 * seen through the step, step x train_batch_size.
 *
 * Every event is written with one write() as its record is complete, so TensorBoard (and `tail -f`)
 * sees each finished step, and a killed run leaves a file whose events are whole up to the last one
 * (a write that fails part way is cut back off). Each session opens a new file and never touches an
 * older one; its SessionLog START at the session's first sample tells TensorBoard to drop what older
 * files logged from there on (the steps a resumed run trains again; everything, for a fresh run in the
 * same directory).
 */
#ifndef ZT_FRAMEWORK_TENSORBOARD_H
#define ZT_FRAMEWORK_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "config/settings.h"
#include "train/metrics.h"

typedef struct zt_tensorboard zt_tensorboard;

/* The directory the event files go to: output_path/job_name, as DeepSpeed joins them (an empty
 * output_path: job_name in the current directory; an empty job_name: output_path itself). */
zt_status zt_tensorboard_dir(const zt_host_settings *s, char *buf, size_t cap, zt_error *err);

/* zt-run --check: creates the directory and makes (and removes) a file in it, so a path that cannot
 * be written is reported before a run starts. */
zt_status zt_tensorboard_check(const zt_host_settings *s, zt_error *err);

/* Opens a new event file for a session that starts after `start_step` (0, or the checkpoint's step)
 * with `samples_per_step` sequences per optimizer step (the x-axis unit), and writes its first two
 * events. */
zt_status zt_tensorboard_open(const zt_host_settings *s, int64_t samples_per_step, int64_t start_step,
                              zt_tensorboard **out, zt_error *err);
void zt_tensorboard_close(zt_tensorboard *tb);

/* The file being written (for messages and tests). */
const char *zt_tensorboard_path(const zt_tensorboard *tb);

zt_status zt_tensorboard_train(zt_tensorboard *tb, const zt_train_record *r, zt_error *err);
zt_status zt_tensorboard_eval(zt_tensorboard *tb, int64_t step, double eval_loss, zt_error *err);

/* ---- the encoding, for tests ------------------------------------------------------------------ */

/* One TFRecord of `n` data bytes as it goes to the file: 8 + 4 + n + 4 bytes into `out` (room for
 * n + 16). */
void zt_tfrecord_frame(const void *data, size_t n, unsigned char *out);

#endif
