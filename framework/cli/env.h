/* zt-run --env: what this machine offers a zt run, for bug reports and "why is it slow/not working".
 *
 * Host (CPU model, cores, memory, OS), then each GPU the NVIDIA driver reports and the versions of
 * the CUDA runtime, NCCL, MPI and sentencepiece libraries the dynamic linker would load. The host
 * links none of these: each is dlopen'ed here and left alone when absent, and anything that cannot
 * be found or asked is printed as "not found" with the reason, never guessed.
 *
 * CUDA note: this initializes the CUDA driver in the calling process. Fork children that use CUDA
 * (plugin probes) before calling it, never after.
 */
#ifndef ZT_FRAMEWORK_ENV_H
#define ZT_FRAMEWORK_ENV_H

#include <stdio.h>

void zt_env_print(FILE *out);

#endif
