/* Host modules: the parts of zt that link a heavy system library (libzt-comm-mpi.so: MPI;
 * libzt-device-cuda.so: the CUDA runtime) are shared objects that zt-run dlopens only when a run
 * needs them, so zt-run itself starts on machines that have neither. */
#ifndef ZT_FRAMEWORK_MODULE_H
#define ZT_FRAMEWORK_MODULE_H

#include <stddef.h>

/* Find module `file` (e.g. "libzt-comm-mpi.so"). The copy that belongs to the running program comes
 * first: <exe>/../lib/zt/ (an installed or relocated zt), then the build tree zt-run was built in,
 * then the configured install prefix. Returns 1 with the path in path[cap]; 0 when none exists,
 * with the places tried as "\n  PATH" lines in tried[tried_cap]. */
int zt_module_find(const char *file, char *path, size_t cap, char *tried, size_t tried_cap);

#endif
