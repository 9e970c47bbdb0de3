/* Private to framework/state/ (nothing outside it includes this): what the checkpoint files share.
 * checkpoint.c holds the rules both directions enforce, checkpoint_write.c the staging, rank writer
 * and commit, checkpoint_find.c the listing of a root and the choice of the one to resume from,
 * checkpoint_read.c the reader; checkpoint.h is their public face. */
#ifndef ZT_FRAMEWORK_CHECKPOINT_INTERNAL_H
#define ZT_FRAMEWORK_CHECKPOINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "state/checkpoint.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint data files are little-endian fp32; zt needs a little-endian host"
#endif

#define CKPT_FORMAT_NAME "zt-checkpoint"
#define CKPT_INDEX "checkpoint.json"
#define CKPT_LATEST "latest"
#define CKPT_TMP_MARK ".tmp-"
/* In a staging directory until it is published: who writes it (host, boot_id, pid_ns, pid), so a
 * later run on this host can tell that the writer is gone and remove what it left. */
#define CKPT_WRITER "writer.json"
/* Each piece starts at a multiple of this in its data file, so a reader can map fp32 in place. */
#define CKPT_ALIGN 64u

/* "dir/name", malloc'd; NULL when out of memory. */
char *ckpt_join(const char *dir, const char *name);
/* Elements of a tensor of this shape. */
int64_t ckpt_decl_numel(int ndim, const int64_t *shape);

/* ---- coverage: the one rule both writer and reader enforce ----------------------------------- */

typedef struct span {
    int64_t offset, count;
    int32_t rank;
    size_t source; /* index of the piece or shard it came from */
} span;

/* Sort spans and check that they tile [0, numel): no element missing, none stored twice. `where`
 * starts the message. */
zt_status ckpt_check_coverage(const char *where, const char *name, const char *group, int64_t numel,
                              span *spans, size_t n, zt_error *err);

/* ---- tensor keys: (group, name), in the order declarations and read tensors are sorted by ---- */

int ckpt_compare_key(const char *group_a, const char *name_a, const char *group_b,
                     const char *name_b);

/* ---- unit shards: a unit's padded flat buffer against its logical tensors ---------------------- */

/* The range check shared by both directions of unit-shard conversion. */
zt_status ckpt_check_unit_range(const zt_layout *layout, int32_t unit, int64_t offset,
                                int64_t count, zt_error *err);
/* For each stored parameter of `unit` that overlaps flat range [offset, offset + count): its
 * index, the overlap's start within the parameter, and its length. Returns the next index to look
 * at, or -1 when there is none. */
int ckpt_next_overlap(const zt_layout *layout, int32_t unit, int p, int64_t offset, int64_t count,
                      int64_t *param_start, int64_t *length, int64_t *flat_start);

#endif
