/* Shared pieces of the tests/abi plugins: a state that remembers the host table, and the answer of
 * an op a fixture does not implement. Fixtures exist to exercise the loader and zt-run; their ops
 * are never meant to compute anything. */
#ifndef ZT_TESTS_ABI_FIXTURE_H
#define ZT_TESTS_ABI_FIXTURE_H

#include <stdlib.h>

#include "zt/zt_plugin.h"

typedef struct fixture_state {
    const zt_host *host;
} fixture_state;

static inline zt_status fixture_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static inline zt_status fixture_init(const zt_host *host, void **state)
{
    fixture_state *s = malloc(sizeof *s);
    if (!s) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "out of memory for a %zu-byte fixture state", sizeof *s);
        return ZT_ERR_OUT_OF_MEMORY;
    }
    s->host = host;
    *state = s;
    return ZT_OK;
}

static inline void fixture_fini(void *state)
{
    free(state);
}

/* What every op of a fixture answers. */
static inline zt_status fixture_refuse(void *state, const char *plugin, const char *op)
{
    const zt_host *host = ((fixture_state *)state)->host;
    host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                "%s is a test fixture of tests/abi and does not implement %s: use a real plugin", plugin, op);
    return ZT_ERR_UNSUPPORTED;
}

#endif
