/* zt-run --env: what this machine offers a zt run, for bug reports and "why is it slow/not working".
 *
 * Host (CPU model, cores, memory, OS), then each GPU the NVIDIA driver reports and the versions of
 * the CUDA runtime, NCCL, MPI and sentencepiece libraries the dynamic linker would load. The host
 * links none of these: each is dlopen'ed here and left alone when absent, and anything that cannot
 * be found or asked is printed as "not found" with the reason, never guessed. Then what zt's runs
 * need of them, judged (docs/cli.md, "What zt needs"): zt-run --env exits 1 when something found is
 * too old.
 *
 * CUDA note: this initializes the CUDA driver in the calling process. Fork children that use CUDA
 * (plugin probes) before calling it, never after.
 */
#ifndef ZT_FRAMEWORK_ENV_H
#define ZT_FRAMEWORK_ENV_H

#include <stdio.h>

/* Prints everything, ending with the requirements (device/requirements.h, dist/requirements.h):
 * each found component "ok" or "too old: need X, have Y (why)", what kinds of runs can start here,
 * and a result line. Returns how many found components are too old or not supported (0: none). */
int zt_env_print(FILE *out);

#endif
