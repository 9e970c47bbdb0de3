#define _DEFAULT_SOURCE /* readlink */
#include "base/module.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int zt_module_find(const char *file, char *path, size_t cap, char *tried, size_t tried_cap)
{
    char candidates[3][PATH_MAX];
    int n = 0;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/'); /* <prefix>/bin/zt-run -> <prefix> */
        if (slash) *slash = '\0';
        slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            int w = snprintf(candidates[n], PATH_MAX, "%s/%s/%s", exe, ZT_MODULE_DIR_FROM_PREFIX, file);
            if (w > 0 && w < PATH_MAX) n++;
        }
    }
    int w = snprintf(candidates[n], PATH_MAX, "%s/%s", ZT_MODULE_BUILD_DIR, file);
    if (w > 0 && w < PATH_MAX) n++;
    w = snprintf(candidates[n], PATH_MAX, "%s/%s", ZT_MODULE_INSTALL_DIR, file);
    if (w > 0 && w < PATH_MAX) n++;
    size_t used = 0;
    if (tried_cap) tried[0] = '\0';
    for (int i = 0; i < n; i++) {
        size_t n_chars = strlen(candidates[i]);
        if (n_chars < cap && access(candidates[i], F_OK) == 0) {
            memcpy(path, candidates[i], n_chars + 1);
            return 1;
        }
        if (used < tried_cap) used += (size_t)snprintf(tried + used, tried_cap - used, "\n  %s", candidates[i]);
    }
    return 0;
}
