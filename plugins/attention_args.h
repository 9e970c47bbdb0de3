/* What zt's attention plugins (naive, flash) share when they check a call's tensors: the layout
 * [batch, tokens, heads, head_dim], contiguous. Each plugin keeps its own dtype and device rules. */
#ifndef ZT_PLUGINS_ATTENTION_ARGS_H
#define ZT_PLUGINS_ATTENTION_ARGS_H

#include <stdio.h>
#include "zt/zt_types.h"

/* 1 when t is a contiguous tensor of exactly the shape `want`; else 0 and `why` (cap bytes) says
 * what was expected and what was given, naming the tensor. */
static inline int zt_attention_shape_ok(const zt_tensor *t, const char *name, const int64_t want[4],
                                        char *why, size_t cap)
{
    int ok = t->ndim == 4;
    int64_t stride = 1;
    for (int i = 3; ok && i >= 0; i--) {
        ok = t->shape[i] == want[i] && t->stride[i] == stride;
        stride *= want[i];
    }
    if (!ok)
        snprintf(why, cap,
                 "%s must be a contiguous [%lld, %lld, %lld, %lld] tensor ([batch, tokens, heads, head_dim]), "
                 "got %d dimensions of shape [%lld, %lld, %lld, %lld]",
                 name, (long long)want[0], (long long)want[1], (long long)want[2], (long long)want[3],
                 (int)t->ndim, (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                 (long long)t->shape[3]);
    return ok;
}

#endif
