#!/usr/bin/env bash
# Where zt-run finds descriptors (--plugin-path, $ZT_PLUGIN_PATH, the per-user directory; first
# match wins, duplicates removed) and how a descriptor's library line is resolved (absolute, with a
# '/' relative to the descriptor, a bare name next to it or in the install tree's library dir).
. "$ZT_TEST_LIB"
. "$(dirname "$0")/abi_lib.sh"

sgd_lib="$abi_lib/libzt-test-sgd.so"
scratch=$(realpath "$scratch")
descriptor() { # descriptor DIR LIBRARY-LINE: an sgd descriptor in DIR
    mkdir -p "$1"
    printf '# written by search_path.sh\nname = sgd\nkind = optimizer\nlibrary = %s\nabi = 1.0\n' "$2" >"$1/sgd.plugin"
}

# Library lines. Absolute:
descriptor "$scratch/abs" "$sgd_lib"
expect_ok "library:      $sgd_lib" "descriptor:   $scratch/abs/sgd.plugin" -- "$ZT_RUN" --plugin-path "$scratch/abs" --describe sgd
# With a '/': relative to the descriptor's directory, not to the working directory.
mkdir -p "$scratch/rel/lib"
cp "$sgd_lib" "$scratch/rel/lib/"
descriptor "$scratch/rel/plugins.d" "../lib/libzt-test-sgd.so"
expect_ok "library:      $scratch/rel/lib/libzt-test-sgd.so" -- "$ZT_RUN" --plugin-path "$scratch/rel/plugins.d" --describe sgd
# A bare name next to the descriptor.
descriptor "$scratch/bare" "libzt-test-sgd.so"
cp "$sgd_lib" "$scratch/bare/"
expect_ok "library:      $scratch/bare/libzt-test-sgd.so" -- "$ZT_RUN" --plugin-path "$scratch/bare" --describe sgd
# A bare name in the install tree's library dir is what every test descriptor uses (abi_dir).
expect_ok "library:      $sgd_lib" "descriptor:   $abi_dir/sgd.plugin" -- "$ZT_RUN" --plugin-path "$abi_dir" --describe sgd

# Order: the first --plugin-path wins over the second, over $ZT_PLUGIN_PATH, over the per-user dir.
descriptor "$scratch/user/zt/plugins.d" "$sgd_lib"
expect_ok "descriptor:   $scratch/user/zt/plugins.d/sgd.plugin" -- env XDG_DATA_HOME="$scratch/user" "$ZT_RUN" --describe sgd
expect_ok "descriptor:   $scratch/bare/sgd.plugin" -- \
    env XDG_DATA_HOME="$scratch/user" ZT_PLUGIN_PATH="$scratch/nowhere:$scratch/bare" "$ZT_RUN" --describe sgd
expect_ok "descriptor:   $scratch/abs/sgd.plugin" -- \
    env XDG_DATA_HOME="$scratch/user" ZT_PLUGIN_PATH="$scratch/bare" "$ZT_RUN" --plugin-path "$scratch/abs:$scratch/rel/plugins.d" --describe sgd
# Without XDG_DATA_HOME the per-user directory is ~/.local/share/zt/plugins.d.
descriptor "$scratch/home/.local/share/zt/plugins.d" "$sgd_lib"
expect_ok "descriptor:   $scratch/home/.local/share/zt/plugins.d/sgd.plugin" -- \
    env -u XDG_DATA_HOME HOME="$scratch/home" "$ZT_RUN" --describe sgd

# The search path as --list-plugins shows it: in order, each directory once, missing ones marked;
# later descriptors of a name shadowed; a stale $ZT_PLUGIN_PATH entry reported but not fatal.
expect_ok "Plugin search path (first match wins):" "  1. $scratch/abs" "  2. $scratch/bare" \
          "  3. $scratch/nowhere  (does not exist)" "  4. $scratch/user/zt/plugins.d" \
          "    shadowed: shadowed by $scratch/abs/sgd.plugin, earlier on the search path" \
          "\$ZT_PLUGIN_PATH names $scratch/nowhere, which is not a directory; fix or drop that entry" -- \
    env XDG_DATA_HOME="$scratch/user" ZT_PLUGIN_PATH="$scratch/bare:$scratch/nowhere:$scratch/abs/" \
    "$ZT_RUN" --plugin-path "$scratch/abs" --plugin-path "$scratch/abs/." --list-plugins
n_abs=$(grep -c "^  [0-9]*\. $scratch/abs\$" <<<"$ZT_OUT")
[ "$n_abs" -eq 1 ] || { echo "FAIL: $scratch/abs listed $n_abs times"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
n_shadowed=$(grep -c "shadowed by $scratch/abs/sgd.plugin" <<<"$ZT_OUT")
[ "$n_shadowed" -eq 2 ] || { echo "FAIL: expected 2 shadowed sgd descriptors, got $n_shadowed"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }

# Malformed descriptors: listed as problems with file:line, and the same message when asked for.
mkdir -p "$scratch/bad"
printf 'name = typo\nkind = optimizer\nlibary = libzt-test-sgd.so\nabi = 1.0\n' >"$scratch/bad/typo.plugin"
printf 'name = other\nkind = optimizer\nlibrary = %s\nabi = 1.0\n' "$sgd_lib" >"$scratch/bad/renamed.plugin"
printf 'name = nokind\nlibrary = %s\nabi = 1.0\n' "$sgd_lib" >"$scratch/bad/nokind.plugin"
printf 'name = twice\nname = twice\nkind = optimizer\nlibrary = x.so\nabi = 1.0\n' >"$scratch/bad/twice.plugin"
printf 'name = weird\nkind = optimiser\nlibrary = x.so\nabi = 1.0\n' >"$scratch/bad/weird.plugin"
printf 'name = badabi\nkind = optimizer\nlibrary = x.so\nabi = one\n' >"$scratch/bad/badabi.plugin"
printf 'README: not a descriptor, ignored\n' >"$scratch/bad/README"
expect_ok "Problems (these descriptors are ignored until fixed):" \
    "  $scratch/bad/typo.plugin:3: unknown key 'libary' (did you mean 'library'?); the keys are name, kind, library and abi" \
    "  $scratch/bad/renamed.plugin:1: name = other, but the file is named renamed.plugin; rename the file to other.plugin" \
    "  $scratch/bad/nokind.plugin: missing 'kind = ...'; a descriptor needs name, kind, library and abi" \
    "  $scratch/bad/twice.plugin:2: 'name' is given twice (first on line 1); keep one" \
    "  $scratch/bad/weird.plugin:2: kind 'optimiser' is not a plugin kind (did you mean 'optimizer'?)" \
    "  $scratch/bad/badabi.plugin:4: abi 'one' is not MAJOR.MINOR (e.g. abi = 1.5)" \
    -- "$ZT_RUN" --plugin-path "$scratch/bad" --list-plugins
grep -q README <<<"$ZT_OUT" && { echo "FAIL: README listed"; zt_failures=$((zt_failures+1)); }
expect_fail "plugin 'typo' has a bad descriptor: $scratch/bad/typo.plugin:3: unknown key 'libary'" -- \
    "$ZT_RUN" --plugin-path "$scratch/bad" --describe typo
expect_status 1
# A malformed descriptor still wins its name: a later good one does not silently take over.
printf 'name = sgd\nkind = optimizer\nlibrary = %s\n' "$sgd_lib" >"$scratch/bad/sgd.plugin"
expect_fail "plugin 'sgd' has a bad descriptor: $scratch/bad/sgd.plugin: missing 'abi = ...'" -- \
    "$ZT_RUN" --plugin-path "$scratch/bad" --plugin-path "$scratch/abs" --describe sgd
expect_status 1
expect_ok "    shadowed: shadowed by a malformed sgd.plugin earlier on the search path (see Problems)" -- \
    "$ZT_RUN" --plugin-path "$scratch/bad" --plugin-path "$scratch/abs" --list-plugins
finish
