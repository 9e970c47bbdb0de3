/* Files a user keeps are written atomically: a temp file in the same directory, fsync, rename, fsync
 * of the directory. A reader (or a killed run) sees the old file or the whole new one, never a part.
 * Every module that writes such files (config, safetensors, checkpoints, zt-prep) uses these. */
#ifndef ZT_FRAMEWORK_FILEIO_H
#define ZT_FRAMEWORK_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include "base/error.h"

/* A file that appears at `path` complete or not at all: written to a temp file in the same directory,
 * then fsync, rename and fsync of the directory on commit. */
typedef struct zt_atomic_file {
    int fd;
    char *path;
    char *tmp_path;
} zt_atomic_file;

zt_status zt_atomic_file_open(zt_atomic_file *f, const char *path, zt_error *err);
zt_status zt_atomic_file_write(zt_atomic_file *f, const void *data, size_t n, zt_error *err);
zt_status zt_atomic_file_commit(zt_atomic_file *f, zt_error *err);
/* Discard the temp file; safe after a failed write or commit, and on a zeroed struct. */
void zt_atomic_file_abort(zt_atomic_file *f);
/* Whole contents at once. */
zt_status zt_atomic_write(const char *path, const void *data, size_t n, zt_error *err);
/* fsync a directory so renames inside it are durable. */
zt_status zt_fsync_dir(const char *dir, zt_error *err);
/* mkdir -p: `dir` and every missing parent. `what` says whose directory it is, for messages
 * ("output": "cannot create output directory 'x': ..."), `fix` what to do about a failure ("choose
 * another with -o DIR"). An existing directory is fine; an existing file of that name is an error. */
zt_status zt_mkdir_p(const char *dir, const char *what, const char *fix, zt_error *err);
/* Copy the regular file src to dst atomically (as zt_atomic_file), streaming it, so large files need
 * no memory. A missing src is ZT_ERR_NOT_FOUND. If hash is not NULL it receives the FNV-1a 64 of the
 * bytes copied (base/checksum.h), so a caller can check the file is the one it expects. */
zt_status zt_copy_file(const char *src, const char *dst, uint64_t *hash, zt_error *err);
/* Read a whole (small) file into a NUL-terminated malloc'd buffer; *len excludes the NUL. A missing
 * file is ZT_ERR_NOT_FOUND. */
zt_status zt_read_file(const char *path, char **out, size_t *len, zt_error *err);

#endif
