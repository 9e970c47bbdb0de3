/* Helpers shared by the safetensors, hf_model and checkpoint tests: scratch directories, raw file
 * access (tests build and damage files byte by byte, independently of the code under test), the
 * reference values st_reference.py also defines, and a fill callback over plain arrays. */
#ifndef ZT_TEST_ST_UTIL_H
#define ZT_TEST_ST_UTIL_H

#define _GNU_SOURCE /* nftw, mkdtemp */
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state/safetensors.h"
#include "ztest.h"

/* Value i of reference tensor k: a float32 division, as st_reference.py's value(k, i). */
static inline float ref_value(int k, int64_t i)
{
    return (float)((i * 7919 + (int64_t)k * 104729) % 100003 - 50000) / 997.0f;
}

static inline uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* A fresh directory under the current one (the test's build directory). */
static inline char *make_scratch_dir(const char *prefix)
{
    char *dir = malloc(strlen(prefix) + 8);
    sprintf(dir, "%s-XXXXXX", prefix);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(2);
    }
    return dir;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static inline void remove_tree(const char *dir)
{
    nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static inline char *path_in(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static inline void write_bytes(const char *path, const void *data, size_t n)
{
    /* A new file, not a truncated one: ext4 flushes a file truncated and rewritten on close,
     * which made the damage loops take seconds. */
    unlink(path);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

/* Whole file; *n receives its size. */
static inline uint8_t *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    uint8_t *buf = malloc((size_t)size + 1);
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        perror(path);
        exit(2);
    }
    fclose(f);
    buf[size] = 0;
    *n = (size_t)size;
    return buf;
}

static inline int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* zt_st_fill_fn over an array of float arrays: ctx is `const float *const *`. */
static inline zt_status fill_from_arrays(void *ctx, size_t index, uint64_t elem_offset,
                                         uint64_t count, float *dst, zt_error *err)
{
    (void)err;
    memcpy(dst, ((const float *const *)ctx)[index] + elem_offset, count * sizeof(float));
    return ZT_OK;
}

/* zt_st_fill_fn computing ref_value(index, i) for tensor `index`. ctx unused. */
static inline zt_status fill_reference(void *ctx, size_t index, uint64_t elem_offset,
                                       uint64_t count, float *dst, zt_error *err)
{
    (void)ctx, (void)err;
    for (uint64_t i = 0; i < count; i++) dst[i] = ref_value((int)index, (int64_t)(elem_offset + i));
    return ZT_OK;
}

#endif
