/* Prints how many CUDA devices zt-run would see (through the same CUDA backend module), or says why
 * there is none and exits 77, so the shell tests of this folder skip on machines without a GPU. */
#include <stdio.h>
#include <string.h>

#include "device/device.h"
#include "host/runtime.h"

int main(void)
{
    int n = 0;
    zt_error err;
    if (zt_device_cuda_count(&n, &err) != ZT_OK) {
        const char *prefix = strncmp(err.msg, "no CUDA device", 14) == 0 ? "" : "no CUDA device: ";
        printf("SKIP: %s%s\n", prefix, err.msg);
        return 77;
    }
    printf("%d\n", n);
    return 0;
}
