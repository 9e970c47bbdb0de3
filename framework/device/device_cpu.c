/* The CPU device: host memory only. See device.h. */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include "device/device.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t physical_memory_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page_size > 0 ? (uint64_t)pages * (uint64_t)page_size : 0;
}

static zt_status cpu_init(int index, zt_device_ctx *ctx, zt_error *err)
{
    (void)err;
    (void)index; /* there is one CPU "device"; the index only means something to CUDA */
    memset(ctx, 0, sizeof *ctx);
    ctx->struct_size = sizeof *ctx;
    ctx->device_type = ZT_DEVICE_CPU;
    ctx->total_memory = physical_memory_bytes();
    return ZT_OK;
}

static void cpu_shutdown(zt_device_ctx *ctx) { (void)ctx; }

static void *cpu_alloc(const zt_device_ctx *ctx, int where, uint64_t bytes, uint64_t alignment,
                       zt_error *err)
{
    (void)ctx;
    if (where == ZT_MEM_DEVICE) {
        zt_error_set(err, ZT_ERR_UNSUPPORTED,
                     "this run has no GPU (it runs on the CPU), so there is no device memory: "
                     "allocate ZT_MEM_HOST memory on CPU runs, or run on a CUDA device");
        return NULL;
    }
    /* Pinned memory only speeds up host<->device copies; with no device, plain memory does. */
    void *ptr = NULL;
    if (bytes > SIZE_MAX || posix_memalign(&ptr, (size_t)alignment, bytes ? (size_t)bytes : 1) != 0) {
        zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "the system allocator failed");
        return NULL;
    }
    return ptr;
}

static void cpu_free(const zt_device_ctx *ctx, int where, void *ptr)
{
    (void)ctx;
    (void)where;
    free(ptr);
}

static zt_status cpu_memcpy(const zt_device_ctx *ctx, void *dst, const void *src, uint64_t bytes,
                            void *stream, zt_error *err)
{
    (void)ctx;
    (void)stream;
    (void)err;
    if (bytes && dst != src) memmove(dst, src, (size_t)bytes);
    return ZT_OK;
}

static zt_status cpu_sync(const zt_device_ctx *ctx, void *stream, zt_error *err)
{
    (void)ctx;
    (void)stream;
    (void)err;
    return ZT_OK;
}

const zt_device_backend zt_device_cpu = {
    .name = "cpu",
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memcpy = cpu_memcpy,
    .sync = cpu_sync,
};
