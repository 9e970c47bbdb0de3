#!/usr/bin/env bash
# Every plugin library exports exactly one dynamic symbol, zt_plugin_entry: the in-tree plugins
# built by zt_add_plugin and the test plugins here (no-entry exports its entry under a wrong name,
# on purpose, and exactly that). Checked with binutils' nm, independently of zt's loader.
. "$ZT_TEST_LIB"
command -v nm >/dev/null || skip "nm (binutils) is not installed"

n_checked=0
for so in "$ZT_BUILD_PLUGIN_DIR"/*.so "$ZT_ABI_LIB_DIR"/*.so; do
    [ -e "$so" ] || continue
    expected=zt_plugin_entry
    [ "$(basename "$so")" = libzt-test-no-entry.so ] && expected=zt_plugin_main
    symbols=$(nm -D --defined-only "$so" | awk '{print $NF}')
    if [ "$symbols" != "$expected" ]; then
        echo "FAIL: $so exports [$(tr '\n' ' ' <<<"$symbols")], expected exactly [$expected]"
        zt_failures=$((zt_failures+1))
    fi
    n_checked=$((n_checked+1))
done
echo "checked $n_checked plugin libraries"
# Every test plugin CMake defines must be there, or the check above proved less than it says.
n_test=$(ls "$ZT_ABI_LIB_DIR"/*.so 2>/dev/null | wc -l)
[ "$n_test" -eq "$ZT_ABI_N_TEST_PLUGINS" ] ||
    { echo "FAIL: $n_test of $ZT_ABI_N_TEST_PLUGINS test plugins in $ZT_ABI_LIB_DIR: build zt_abi_test_plugins"; zt_failures=$((zt_failures+1)); }
finish
