/* Must NOT compile: deliberately wrong frozen-layout assertions. compile_headers.sh checks that each
 * language mode rejects them and names the assertion, proving zt_abi_check.h's checks are live (its
 * C99 fallback, C11 _Static_assert and C++ static_assert alike). */
#include <zt/zt.h>

ZT_ABI_SIZE(zt_plugin, 97);
ZT_ABI_OFFSET(zt_host, ctx, 9);
