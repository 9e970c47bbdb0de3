/* Files a user keeps: written atomically (temp file in the same directory, fsync, rename, fsync of the
 * directory), so a killed run never leaves a file that looks valid and is not; and whole-file reads. */
#define _GNU_SOURCE
#include "base/fileio.h"

#include "base/checksum.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

zt_status zt_fsync_dir(const char *dir, zt_error *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return zt_error_set(err, ZT_ERR_IO, "cannot open directory '%s' to sync it: %s", dir,
                            strerror(errno));
    }
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    /* Some file systems cannot fsync a directory (EINVAL); renames there are atomic all the same. */
    if (rc != 0 && e != EINVAL) {
        return zt_error_set(err, ZT_ERR_IO, "cannot sync directory '%s': %s", dir, strerror(e));
    }
    return ZT_OK;
}

zt_status zt_atomic_file_open(zt_atomic_file *f, const char *path, zt_error *err)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    size_t cap = strlen(path) + 64;
    f->path = strdup(path);
    f->tmp_path = malloc(cap);
    if (!f->path || !f->tmp_path) {
        zt_atomic_file_abort(f);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening '%s'", path);
    }
    snprintf(f->tmp_path, cap, "%s.tmp-%ld-XXXXXX", path, (long)getpid());
    f->fd = mkstemp(f->tmp_path);
    if (f->fd < 0) {
        zt_status st = zt_error_set(err, ZT_ERR_IO,
                                    "cannot create a temp file next to '%s': %s; check that the "
                                    "directory exists and is writable",
                                    path, strerror(errno));
        free(f->tmp_path);
        f->tmp_path = NULL; /* nothing to unlink */
        zt_atomic_file_abort(f);
        return st;
    }
    /* mkstemp makes the file 0600; the result gets the permissions of any new file. */
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(f->fd, 0666 & ~mask) != 0) {
        zt_status st = zt_error_set(err, ZT_ERR_IO, "cannot set permissions of '%s': %s",
                                    f->tmp_path, strerror(errno));
        zt_atomic_file_abort(f);
        return st;
    }
    return ZT_OK;
}

zt_status zt_atomic_file_write(zt_atomic_file *f, const void *data, size_t n, zt_error *err)
{
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            return zt_error_set(err, ZT_ERR_IO, "cannot write '%s': %s (is the disk full?)",
                                f->tmp_path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return ZT_OK;
}

zt_status zt_atomic_file_commit(zt_atomic_file *f, zt_error *err)
{
    if (fsync(f->fd) != 0) {
        zt_status st = zt_error_set(err, ZT_ERR_IO, "cannot sync '%s': %s (is the disk full?)",
                                    f->tmp_path, strerror(errno));
        zt_atomic_file_abort(f);
        return st;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        zt_status st = zt_error_set(err, ZT_ERR_IO, "cannot write '%s': %s", f->tmp_path,
                                    strerror(errno));
        zt_atomic_file_abort(f);
        return st;
    }
    if (rename(f->tmp_path, f->path) != 0) {
        zt_status st = zt_error_set(err, ZT_ERR_IO, "cannot rename '%s' to '%s': %s", f->tmp_path,
                                    f->path, strerror(errno));
        zt_atomic_file_abort(f);
        return st;
    }
    free(f->tmp_path);
    f->tmp_path = NULL; /* renamed: nothing left to remove */
    char *dir = dir_of(f->path);
    zt_status st = dir ? zt_fsync_dir(dir, err)
                       : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory syncing '%s'",
                                      f->path);
    free(dir);
    zt_atomic_file_abort(f);
    return st;
}

void zt_atomic_file_abort(zt_atomic_file *f)
{
    if (f->fd >= 0) close(f->fd);
    if (f->tmp_path) unlink(f->tmp_path);
    free(f->tmp_path);
    free(f->path);
    f->fd = -1;
    f->tmp_path = NULL;
    f->path = NULL;
}

zt_status zt_atomic_write(const char *path, const void *data, size_t n, zt_error *err)
{
    zt_atomic_file f;
    zt_status st = zt_atomic_file_open(&f, path, err);
    if (st != ZT_OK) return st;
    st = zt_atomic_file_write(&f, data, n, err);
    if (st != ZT_OK) {
        zt_atomic_file_abort(&f);
        return st;
    }
    return zt_atomic_file_commit(&f, err);
}

zt_status zt_read_file(const char *path, char **out, size_t *len, zt_error *err)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return zt_error_set(err, errno == ENOENT ? ZT_ERR_NOT_FOUND : ZT_ERR_IO,
                            "cannot open '%s': %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return zt_error_set(err, ZT_ERR_IO, "'%s' is not a regular file", path);
    }
    size_t size = (size_t)sb.st_size, got = 0;
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading '%s' (%zu bytes)",
                            path, size);
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            close(fd);
            free(buf);
            return zt_error_set(err, ZT_ERR_IO, "cannot read '%s': %s", path,
                                r == 0 ? "the file shrank while being read" : strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    buf[size] = '\0';
    *out = buf;
    *len = size;
    return ZT_OK;
}

zt_status zt_mkdir_p(const char *dir, const char *what, const char *fix, zt_error *err)
{
    char path[4096];
    if (!dir[0] || snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return zt_error_set(err, ZT_ERR_CONFIG, "%s directory '%.100s' is empty or too long; %s", what, dir, fix);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            if (saved) /* a parent could not be made */
                return zt_error_set(err, ZT_ERR_IO, "cannot create %s directory '%s' (making '%s'): %s; %s", what, dir, path,
                                    strerror(e), fix);
            return zt_error_set(err, ZT_ERR_IO, "cannot create %s directory '%s': %s; %s", what, dir, strerror(e), fix);
        }
        *p = saved;
        if (!saved) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return zt_error_set(err, ZT_ERR_IO, "%s path '%s' exists and is not a directory; %s", what, dir, fix);
    return ZT_OK;
}

zt_status zt_copy_file(const char *src, const char *dst, uint64_t *hash, zt_error *err)
{
    int fd = open(src, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zt_error_set(err, e == ENOENT ? ZT_ERR_NOT_FOUND : ZT_ERR_IO, "cannot open '%s' to copy it: %s", src,
                            strerror(e));
    }
    zt_atomic_file f;
    zt_status st = zt_atomic_file_open(&f, dst, err);
    uint64_t h = ZT_FNV1A64_INIT;
    static const size_t chunk = 1u << 20;
    char *buf = st == ZT_OK ? malloc(chunk) : NULL;
    if (st == ZT_OK && !buf) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory copying '%s'", src);
    while (st == ZT_OK) {
        ssize_t n = read(fd, buf, chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) st = zt_error_set(err, ZT_ERR_IO, "cannot read '%s': %s", src, strerror(errno));
        if (n <= 0) break;
        h = zt_fnv1a64(h, buf, (size_t)n);
        st = zt_atomic_file_write(&f, buf, (size_t)n, err);
    }
    free(buf);
    close(fd);
    if (st == ZT_OK) st = zt_atomic_file_commit(&f, err);
    else zt_atomic_file_abort(&f);
    if (st == ZT_OK && hash) *hash = h;
    return st;
}
