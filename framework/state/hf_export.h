/* A Hugging Face model directory written as a whole (docs/export.md): the weights and config.json
 * (hf_model.h), generation_config.json and the tokenizer files (hf_tokenizer.h) go to a staging
 * directory next to the destination, which is swapped in only once every file is there. So a run
 * killed during an export leaves the destination as it was (absent, or the previous export), never a
 * directory that looks like a model and is not one.
 *
 * A destination is replaced only when it is absent, empty, or an earlier zt export: it holds
 * zt-export.json, which lists the files that export wrote, and nothing else. Any other directory is
 * refused with an error, so an export never clobbers a model, a checkpoint or an output directory.
 */
#ifndef ZT_FRAMEWORK_HF_EXPORT_H
#define ZT_FRAMEWORK_HF_EXPORT_H

#include <stdint.h>
#include "base/error.h"
#include "state/hf_model.h"

#define ZT_HF_EXPORT_MARKER "zt-export.json"

/* transformers' max_shard_size: "5GB" (10^9 bytes), "5GiB" (2^30), "500MB", "100KiB", "10Gb" (bits,
 * so / 8), or a whole number of bytes; the number itself is a whole number, as transformers reads
 * it. `what` names the option in messages ("--export-shard-size"). */
zt_status zt_hf_parse_shard_size(const char *text, const char *what, uint64_t *bytes, zt_error *err);

/* "fp32" | "bf16" | "fp16" (or torch's "float32", "bfloat16", "float16") as ZT_ST_F32/BF16/F16, and
 * "auto" as -1 (the caller decides). */
zt_status zt_hf_parse_dtype(const char *text, const char *what, int *dtype, zt_error *err);

/* Whether `dir` may receive an export: absent, an empty directory, or an earlier zt export. Anything
 * else (a file, a symbolic link, a directory zt did not write, an export with files added since) is
 * an error naming what is there and what to do. */
zt_status zt_hf_export_check_dest(const char *dir, zt_error *err);

typedef struct zt_hf_export_stage {
    char *dest;    /* the destination as given */
    char *staging; /* where the files are written until publish */
} zt_hf_export_stage;

/* Check the destination, create its parent directories, remove staging directories that earlier
 * exports to the same destination left when they were killed (their process is gone), and create a
 * new one: PARENT/.NAME.zt-export-HOST-PID-XXXXXX. */
zt_status zt_hf_export_stage_begin(const char *dest, zt_hf_export_stage *s, zt_error *err);
/* Write zt-export.json listing the staged files, sync, and swap the staging directory in for the
 * destination (renameat2 RENAME_EXCHANGE when it exists, so there is no moment without a complete
 * export); the replaced export is then removed. Frees s. */
zt_status zt_hf_export_stage_publish(zt_hf_export_stage *s, zt_error *err);
/* Remove the staging directory and free s (after a failure). */
void zt_hf_export_stage_discard(zt_hf_export_stage *s);

/* generation_config.json for c's special tokens (bos, eos as an id or a list, pad when it has one);
 * greedy decoding is transformers' default, as zt-run --generate's. Written atomically. */
zt_status zt_hf_generation_config_write(const char *path, const zt_hf_config *c, zt_error *err);

#endif
