/* libFuzzer target: the safetensors reader on hostile bytes. Each input is a whole file. Besides the
 * sanitizers, the oracle is what an accepted file must satisfy: the tensors tile the data section,
 * each holds numel * dtype-size bytes, and every float tensor converts in full. Built with
 * -DZT_FUZZ=ON (see tests/fuzz/CMakeLists.txt); seeds in fuzz_corpus/. */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state/safetensors.h"

static char g_path[] = "/tmp/zt-fuzz-safetensors-XXXXXX";

static void remove_file(void) { unlink(g_path); }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    int fd = mkstemp(g_path);
    if (fd < 0) {
        perror("mkstemp");
        abort();
    }
    close(fd);
    atexit(remove_file);
    return 0;
}

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "invariant failed: %s\n", #cond);                                      \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(g_path, "wb");
    if (!f) abort();
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    zt_st_file *st = NULL;
    zt_error err = {0};
    if (zt_st_open(g_path, &st, &err) != ZT_OK) {
        REQUIRE(st == NULL && err.msg[0] != '\0');
        return 0;
    }
    uint64_t covered = 0;
    for (size_t i = 0; i < zt_st_count(st); i++) {
        const zt_st_tensor *t = zt_st_at(st, i);
        REQUIRE(zt_st_find(st, t->name) == t);
        REQUIRE(t->end - t->begin == t->numel * zt_st_dtype_size(t->dtype));
        covered += t->end - t->begin;
        if (t->dtype != ZT_ST_F32 && t->dtype != ZT_ST_BF16 && t->dtype != ZT_ST_F16) continue;
        float *buf = malloc((t->numel ? t->numel : 1) * sizeof *buf);
        if (!buf) continue;
        REQUIRE(zt_st_read_f32(st, t, 0, t->numel, buf, &err) == ZT_OK);
        free(buf);
    }
    uint64_t header_len;
    memcpy(&header_len, data, 8);
    REQUIRE(8 + header_len + covered == size); /* nothing unaccounted for */
    zt_st_close(st);
    return 0;
}
