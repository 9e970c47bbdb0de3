#!/usr/bin/env bash
# compile_headers.sh CC CXX INCLUDE_DIR FIRES_SOURCE USE_SOURCE HEADER_SOURCE...
# In each language mode a plugin may use (C99 and C11 with CC, C++17 with CXX):
#  - USE_SOURCE (a plugin using the SDK) compiles with -Wall -Wextra -pedantic -Werror;
#  - each HEADER_SOURCE (one header included alone) compiles with those and the stricter warnings
#    plugin authors often enable, so no header forces a warning on them and each is self-contained;
#  - FIRES_SOURCE (wrong frozen-layout assertions) fails, naming the assertions: the checks of
#    zt_abi_check.h are live in that mode.
# Skips (77) when CC or CXX is not installed.
. "$ZT_TEST_LIB"
cc=$1 cxx=$2 include_dir=$3 fires=$4 use=$5
shift 5
command -v "$cc" >/dev/null || skip "$cc is not installed"
command -v "$cxx" >/dev/null || skip "$cxx is not installed"

common=(-Wall -Wextra -pedantic -Werror -fsyntax-only -I "$include_dir")
strict_both=(-Wconversion -Wsign-conversion -Wshadow -Wundef -Wcast-qual)
strict_c=("${strict_both[@]}" -Wstrict-prototypes -Wredundant-decls)
strict_cxx=("${strict_both[@]}" -Wold-style-cast -Wzero-as-null-pointer-constant -Wextra-semi)

check_mode() { # check_mode "COMPILER -x LANG -std=STD" strict-flags...
    local -a compile
    read -r -a compile <<<"$1"
    shift
    expect_ok -- "${compile[@]}" "${common[@]}" "$use"
    for header_source in "${header_sources[@]}"; do
        expect_ok -- "${compile[@]}" "${common[@]}" "$@" "$header_source"
    done
    expect_fail "zt_plugin_size_is_frozen" "zt_host_ctx_offset_is_frozen" -- \
        "${compile[@]}" "${common[@]}" "$fires"
}
header_sources=("$@")
check_mode "$cc -x c -std=c99" "${strict_c[@]}"
check_mode "$cc -x c -std=c11" "${strict_c[@]}"
check_mode "$cxx -x c++ -std=c++17" "${strict_cxx[@]}"
finish
