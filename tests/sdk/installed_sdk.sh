#!/usr/bin/env bash
# installed_sdk.sh SOURCE_DIR WORK_DIR C_COMPILER GENERATOR LIBDIR VERSION
# Uses what build_example.sh left in WORK_DIR: the installed zt-run must find and describe the
# third-party lion plugin through each documented route, pkg-config must describe the SDK well
# enough to build a plugin without CMake, and zt_add_plugin must reject misuse clearly.
. "$ZT_TEST_LIB"
src=$1 work=$2 cc=$3 generator=$4 libdir=$5 version=$6
prefix=$work/zt-prefix
zt_run=$prefix/bin/zt-run
[ -x "$zt_run" ] || { echo "FAIL: $zt_run is missing: was zt-run built before ctest?"; exit 1; }

# Nothing but the directories given below may provide lion: an empty HOME, no ZT_PLUGIN_PATH.
empty_home=$work/empty-home
mkdir -p "$empty_home"
run_zt() { env -u ZT_PLUGIN_PATH -u XDG_DATA_HOME HOME="$empty_home" "$@"; }
expect_fail "no plugin named 'lion'" "$empty_home/.local/share/zt/plugins.d" -- run_zt "$zt_run" --describe lion

# A --list-plugins line names lion and its kind.
expect_lion_listed() {
    expect_ok "lion" -- "$@" --list-plugins
    if [ "$ZT_RC" -eq 0 ] && ! grep -qE '(^|[^a-z])lion([^a-z].*)?optimizer' <<<"$ZT_OUT"; then
        echo "FAIL: no line with lion and kind optimizer from: $* --list-plugins"; echo "$ZT_OUT"
        zt_failures=$((zt_failures+1))
    fi
    # The installed prefix and the example's build pass the trust rules (docs/plugins.md#trust).
    if grep -q "unsafe" <<<"$ZT_OUT"; then
        echo "FAIL: a plugin is marked unsafe by: $* --list-plugins"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1))
    fi
}
expect_lion_listed run_zt "$zt_run" --plugin-path "$work/plugins.d"
expect_ok "lion 1.0.0" "optimizer.params.betas" "[0.9, 0.99]" "optimizer.params.lr" "optimizer.params.weight_decay" -- \
    run_zt "$zt_run" --plugin-path "$work/plugins.d" --describe lion
expect_lion_listed run_zt env ZT_PLUGIN_PATH="$work/plugins.d" "$zt_run"
expect_lion_listed env -u ZT_PLUGIN_PATH -u XDG_DATA_HOME HOME="$work/home" "$zt_run"
expect_ok "optimizer.params.betas" -- \
    run_zt "$zt_run" --plugin-path "$work/lion-build/share/zt/plugins.d" --describe lion

# zt with lion installed into its prefix keeps working after the whole prefix is moved.
expect_ok -- mv "$work/zt-with-lion" "$work/zt-moved"
expect_lion_listed run_zt "$work/zt-moved/bin/zt-run"
expect_ok -- mv "$work/zt-moved" "$work/zt-with-lion"

# pkg-config: exact paths of this prefix, and enough to build a working plugin without CMake.
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
expect_ok -- pkg-config --cflags zt
[ "$(echo $ZT_OUT)" = "-I$prefix/include" ] || { echo "FAIL: pkg-config --cflags zt gave '$ZT_OUT'"; zt_failures=$((zt_failures+1)); }
expect_ok "$version" -- pkg-config --modversion zt
expect_ok "$prefix/share/zt/plugins.d" -- pkg-config --variable=pluginsddir zt
pc_so=$work/pkg-config/libzt-lion.so
mkdir -p "$work/pkg-config"
expect_ok -- "$cc" -std=c11 -Wall -Wextra -pedantic -Werror -O2 -shared -fPIC -fvisibility=hidden \
    $(pkg-config --cflags zt) -DLION_VERSION='"1.0.0"' "$src/examples/lion-optimizer/lion.c" \
    -Wl,--version-script="$(pkg-config --variable=versionscript zt)" -Wl,--no-undefined -o "$pc_so"
printf 'name = lion\nkind = optimizer\nlibrary = libzt-lion.so\nabi = %s\n' \
    "$(pkg-config --variable=abi_version zt)" >"$work/pkg-config/lion.plugin"
expect_ok "optimizer.params.betas" -- run_zt "$zt_run" --plugin-path "$work/pkg-config" --describe lion

# zt_add_plugin misuse is a configure error that says what is wrong and how to fix it. CMake wraps
# long messages, so the output is compared with runs of spaces and newlines squeezed to one space.
configure_flat() {
    cmake "$@" 2>&1 | tr -s ' \n' '  '
    return "${PIPESTATUS[0]}"
}
bad=$work/bad-plugin
mkdir -p "$bad"
printf 'int x;\n' >"$bad/x.c"
write_bad_project() {
    printf 'cmake_minimum_required(VERSION 3.22)\nproject(bad C)\nfind_package(zt REQUIRED)\n%s\n' "$1" \
        >"$bad/CMakeLists.txt"
}
write_bad_project 'zt_add_plugin(NAME lion KIND optimiser SOURCES x.c)'
expect_fail "unknown KIND 'optimiser'" "tokenizer, model, optimizer, zero, attention, parallel" -- \
    configure_flat -S "$bad" -B "$bad/build" -G "$generator" -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix"
write_bad_project 'zt_add_plugin(NAME "my lion" KIND optimizer SOURCES x.c)'
expect_fail "invalid NAME 'my lion'" "letters, digits" -- \
    configure_flat -S "$bad" -B "$bad/build" -DCMAKE_PREFIX_PATH="$prefix"
write_bad_project 'zt_add_plugin(NAME lion KIND optimizer)'
expect_fail "NAME, KIND and SOURCES are required" "usage: zt_add_plugin(NAME" -- \
    configure_flat -S "$bad" -B "$bad/build" -DCMAKE_PREFIX_PATH="$prefix"
finish
