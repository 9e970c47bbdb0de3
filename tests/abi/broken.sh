#!/usr/bin/env bash
# One deliberately broken plugin or descriptor (built by tests/abi/CMakeLists.txt): zt-run --check
# must refuse it with exit status 1 and the message below, never crash or hang. The fixtures
# complete the run's plugin set, so the plugin under test is the only thing that can fail.
. "$ZT_TEST_LIB"
. "$(dirname "$0")/abi_lib.sh"

case="$1"
lib="$abi_lib/libzt-test-$case.so"
check_fails() { expect_check_fails "$case,$fixtures" "$@"; }

case "$case" in
bad-magic)
    check_fails "plugin 'bad-magic' ($lib) is not a zt plugin: its entry returned a struct with magic 0xDEADBEEF, expected 0x3150545A (\"ZTP1\")" ;;
wrong-major)
    check_fails "plugin 'wrong-major' ($lib) was built against zt ABI 2.5, this zt provides 1.5: a plugin of another major ABI cannot be loaded; rebuild the plugin against this SDK" ;;
newer-minor)
    check_fails "plugin 'newer-minor' ($lib) was built against zt ABI 1.6, this zt provides 1.5: upgrade zt or rebuild the plugin against this SDK" ;;
short-struct)
    check_fails "plugin 'short-struct' ($lib) has a zt_plugin struct of 40 bytes, smaller than the 96 bytes of ABI 1.0" ;;
short-ops)
    check_fails "plugin 'short-ops' ($lib) has a zt_optimizer_ops table of 16 bytes (its struct_size), smaller than the 32 bytes of ABI 1.0" ;;
no-entry)
    check_fails "plugin 'no-entry' ($lib) does not export zt_plugin_entry, so it is not a zt plugin" \
                "nm -D --defined-only $lib" ;;
null-entry)
    check_fails "plugin 'null-entry' ($lib): zt_plugin_entry() returned NULL; it must return a pointer to a static zt_plugin" ;;
no-description)
    check_fails "plugin 'no-description' ($lib) has no description (NULL)" ;;
bad-options)
    check_fails "plugin 'bad-options' ($lib): option 0 (key 'optimizer.params.flavour') is an enum without choices" ;;
name-mismatch)
    check_fails "plugin 'name-mismatch' ($lib) calls itself 'someone-else', but its descriptor $abi_dir/name-mismatch.plugin says name = name-mismatch" ;;
kind-mismatch)
    check_fails "plugin 'kind-mismatch' ($lib) is an optimizer plugin, but its descriptor $abi_dir/kind-mismatch.plugin says kind = model: fix the descriptor's kind line (kind = optimizer)" ;;
refuse-probe)
    check_fails "plugin 'refuse-probe' cannot run here: the test plugin refuse-probe needs a flux capacitor, and this machine has none" ;;
segv-probe)
    # The second line is the registry's crash guard speaking from inside the dying child.
    check_fails "probe() of plugin 'segv-probe' crashed (Segmentation fault, signal 11). Library: $lib. zt-run ran it in a child process and is unharmed" \
                "zt: plugin 'segv-probe' crashed in probe() with SIGSEGV (invalid memory access)" ;;
hang-probe)
    # Reachable by path only (no descriptor), so no listing waits for it; a short limit for the test.
    ZT_PROBE_TIMEOUT=2 expect_check_fails "$lib,$fixtures" \
        "probe() of plugin 'hang-probe' did not return within 2 s, so zt-run stopped it. Library: $lib" ;;
init-fails)
    check_fails "plugin 'init-fails' failed in init() (config error): the test plugin init-fails always refuses to start: remove it from --plugins" ;;
throw-probe)
    # The C++ runtime's own report of the exception reaches the user too.
    check_fails "probe() of plugin 'throw-probe' crashed (Aborted, signal 6): an assert failed or a C++ exception escaped the plugin" \
                "the test plugin throw-probe throws from probe()" ;;
throw-init)
    check_fails "init() of plugin 'throw-init' crashed (Aborted, signal 6): an assert failed or a C++ exception escaped the plugin" \
                "the test plugin throw-init throws from init()" ;;
missing-so)
    check_fails "plugin 'missing-so': its library was not found (tried $abi_dir/libzt-test-missing-so.so, $abi_lib/libzt-test-missing-so.so). The descriptor $abi_dir/missing-so.plugin names it in its library line" ;;
syntax-error)
    check_fails "plugin 'syntax-error' has a bad descriptor: $abi_dir/syntax-error.plugin:3: expected 'key = value', found 'kind optimizer'" ;;
future-abi)
    check_fails "plugin 'future-abi' (descriptor $abi_dir/future-abi.plugin) says abi = 2.0, this zt provides 1.5" ;;
two-of-a-kind)
    expect_check_fails "sgd,refuse-probe,$fixtures" \
        "--plugins names two optimizer plugins, 'sgd' ($abi_lib/libzt-test-sgd.so) and 'refuse-probe' ($abi_lib/libzt-test-refuse-probe.so): a run uses one plugin per kind" ;;
unknown-name)
    expect_check_fails "sgdd,$fixtures" "no plugin named 'sgdd' is installed. Closest installed: 'sgd' (optimizer)" \
        "Directories searched, in order:" "  $abi_dir (--plugin-path)" ;;
*)
    echo "broken.sh: unknown case '$case'"; exit 2 ;;
esac
finish
