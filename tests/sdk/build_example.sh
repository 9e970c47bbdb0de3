#!/usr/bin/env bash
# build_example.sh BUILD_DIR SOURCE_DIR WORK_DIR C_COMPILER GENERATOR LIBDIR
# The SDK as a third party meets it: install this build of zt to a scratch prefix, then configure,
# build and install examples/lion-optimizer out of tree against it, following its README. Leaves
# under WORK_DIR what the other sdk tests use (ctest fixture zt_sdk_example):
#   zt-prefix/              the installed zt
#   lion-build/             the example's build tree (its own share/zt/plugins.d for uninstalled use)
#   lion-prefix/            the example's install prefix (lib/zt/plugins/libzt-lion.so)
#   plugins.d/              the example's descriptor, installed to a chosen absolute directory
#   home/.local/share/zt/plugins.d/   the same, installed to the per-user directory of HOME=home
#   zt-with-lion/           a copy of zt-prefix with lion installed into it (relative descriptor)
. "$ZT_TEST_LIB"
build=$1 src=$2 work=$3 cc=$4 generator=$5 libdir=$6
prefix=$work/zt-prefix
rm -rf "$work" && mkdir -p "$work" || exit 1

# The ABI version written into descriptors, read from the header here independently of the CMake code.
abi_major=$(sed -n 's/^#define ZT_ABI_MAJOR \([0-9]*\)u.*/\1/p' "$src/include/zt/zt_types.h")
abi_minor=$(sed -n 's/^#define ZT_ABI_MINOR \([0-9]*\)u.*/\1/p' "$src/include/zt/zt_types.h")
[ -n "$abi_major" ] && [ -n "$abi_minor" ] || { echo "FAIL: cannot read the ABI version from zt_types.h"; exit 1; }
abi=$abi_major.$abi_minor

check_file() {
    [ -f "$1" ] || { echo "FAIL: $1 was not installed"; zt_failures=$((zt_failures+1)); }
}
# check_descriptor FILE LIBRARY: the descriptor's keys, ignoring comments, are exactly these.
check_descriptor() {
    local expected actual
    expected=$(printf 'name = lion\nkind = optimizer\nlibrary = %s\nabi = %s' "$2" "$abi")
    actual=$(grep -v '^#' "$1" 2>&1)
    if [ "$actual" != "$expected" ]; then
        echo "FAIL: descriptor $1 is"; echo "$actual"; echo "expected"; echo "$expected"
        zt_failures=$((zt_failures+1))
    fi
}

expect_ok -- cmake --install "$build" --prefix "$prefix"
for f in include/zt/zt.h include/zt/zt_abi_check.h "$libdir/pkgconfig/zt.pc" \
         "$libdir/cmake/zt/ztConfig.cmake" "$libdir/cmake/zt/ztConfigVersion.cmake" \
         "$libdir/cmake/zt/ztTargets.cmake" "$libdir/cmake/zt/ZtPlugin.cmake" \
         "$libdir/cmake/zt/zt-plugin.map" share/doc/zt/plugins.md share/doc/zt/report.md \
         bin/zt-run bin/zt-prep bin/zt-report \
         share/doc/zt/examples/lion-optimizer/lion.c; do
    check_file "$prefix/$f"
done
[ -d "$prefix/share/zt/plugins.d" ] || { echo "FAIL: share/zt/plugins.d was not created"; zt_failures=$((zt_failures+1)); }

# The README's commands. -Werror: the example must be warning-clean under strict flags.
lion_build=$work/lion-build
expect_ok -- cmake -S "$src/examples/lion-optimizer" -B "$lion_build" -G "$generator" \
    -DCMAKE_C_COMPILER="$cc" "-DCMAKE_C_FLAGS=-Wall -Wextra -pedantic -Werror" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_INSTALL_PREFIX="$work/lion-prefix" -DCMAKE_INSTALL_LIBDIR=lib \
    -DZT_PLUGINS_D_INSTALL_DIR="$work/plugins.d"
expect_ok -- cmake --build "$lion_build"
expect_ok "Installing: $work/plugins.d/lion.plugin" -- cmake --install "$lion_build"
so=$work/lion-prefix/lib/zt/plugins/libzt-lion.so
check_file "$so"
check_descriptor "$work/plugins.d/lion.plugin" "$so"
check_descriptor "$lion_build/share/zt/plugins.d/lion.plugin" "../../../lib/zt/plugins/libzt-lion.so"
check_file "$lion_build/lib/zt/plugins/libzt-lion.so"

# Packagers stage with DESTDIR: files land under it, the descriptor names the final path.
expect_ok -- env DESTDIR="$work/destdir" cmake --install "$lion_build"
check_file "$work/destdir$so"
check_descriptor "$work/destdir$work/plugins.d/lion.plugin" "$so"
expect_ok -- env DESTDIR="$work/destdir" cmake --install "$build" --prefix /opt/zt
expect_ok "includedir=/opt/zt/include" -- cat "$work/destdir/opt/zt/$libdir/pkgconfig/zt.pc"
# `make uninstall`-style tools read the manifest: the generated descriptor must be in it.
expect_ok "$work/plugins.d/lion.plugin" -- cat "$lion_build/install_manifest.txt"

# Hidden visibility + version script: the entry is the only symbol the plugin defines for others.
exported=$(nm -D --defined-only "$so" | awk '{print $NF}')
[ "$exported" = "zt_plugin_entry" ] || { echo "FAIL: $so exports: $exported"; zt_failures=$((zt_failures+1)); }

# The documented per-user directory.
user_plugins_d=$work/home/.local/share/zt/plugins.d
expect_ok -- cmake -S "$src/examples/lion-optimizer" -B "$lion_build" -DZT_PLUGINS_D_INSTALL_DIR="$user_plugins_d"
expect_ok "Installing: $user_plugins_d/lion.plugin" -- cmake --install "$lion_build"
check_descriptor "$user_plugins_d/lion.plugin" "$so"

# Installed into zt's own prefix: the descriptor is relative, so the prefix stays relocatable.
expect_ok -- cp -a "$prefix" "$work/zt-with-lion"
expect_ok -- cmake -S "$src/examples/lion-optimizer" -B "$lion_build" -DZT_PLUGINS_D_INSTALL_DIR=share/zt/plugins.d
expect_ok -- cmake --install "$lion_build" --prefix "$work/zt-with-lion"
check_descriptor "$work/zt-with-lion/share/zt/plugins.d/lion.plugin" "../../../lib/zt/plugins/libzt-lion.so"
finish
