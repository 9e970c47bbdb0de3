#!/usr/bin/env bash
# zt-run's command line: --help, --version, usage errors (exit 2) and what zt-run does without an
# action. The expected version comes from CMake's project() and the ABI from zt_types.h.
. "$ZT_TEST_LIB"
. "$(dirname "$0")/abi_lib.sh"

abi_major=$(sed -n 's/^#define ZT_ABI_MAJOR \([0-9]*\)u.*/\1/p' "$ZT_SOURCE_DIR/include/zt/zt_types.h")
abi_minor=$(sed -n 's/^#define ZT_ABI_MINOR \([0-9]*\)u.*/\1/p' "$ZT_SOURCE_DIR/include/zt/zt_types.h")
[ -n "$abi_major" ] && [ -n "$abi_minor" ] || { echo "cannot read the ABI version from zt_types.h"; exit 1; }

expect_ok "zt-run $ZT_EXPECTED_VERSION (zt plugin ABI $abi_major.$abi_minor)" -- "$ZT_RUN" --version
[ "$(wc -l <<<"$ZT_OUT")" -eq 1 ] || { echo "FAIL: --version printed more than one line"; zt_failures=$((zt_failures+1)); }

# --help lists every option with its value name, and the exit codes.
expect_ok "Usage:" "--help" "--version" "--list-plugins" "--describe NAME" "--env" "--check" \
          "--plugin-path DIR" "--plugins LIST" "--config FILE" "--set KEY=VALUE" "--output-dir DIR" \
          "Exit status: 0 success, 1 runtime, config or plugin error, 2 usage error." -- "$ZT_RUN" --help
expect_ok "Usage:" -- "$ZT_RUN" -h
# --help wins over everything else on the line.
expect_ok "Usage:" -- "$ZT_RUN" --check --plugins nothing-like-this --help

# No action: training needs data; say which key to set, exit 1.
expect_fail "no training data: data.path is not set" -- "$ZT_RUN"
expect_status 1

# Usage errors: exit 2, with what to do.
expect_fail "zt-run: error: unknown option '--lst-plugins'; did you mean '--list-plugins'?" -- "$ZT_RUN" --lst-plugins
expect_status 2
expect_fail "unknown option '--plugin'; did you mean '--plugins'?" -- "$ZT_RUN" --plugin sgd --check
expect_status 2
expect_fail "unknown option '--frobnicate'; run with --help to list the options" -- "$ZT_RUN" --frobnicate
expect_status 2
expect_fail "option --describe needs a value: --describe NAME" -- "$ZT_RUN" --describe
expect_status 2
expect_fail "option --check takes no value (got '--check=yes')" -- "$ZT_RUN" --check=yes
expect_status 2
expect_fail "unexpected argument 'train.json': every argument is an option" -- "$ZT_RUN" train.json
expect_status 2
expect_fail "--list-plugins and --check are separate actions; give one of them" -- "$ZT_RUN" --list-plugins --check
expect_status 2
expect_fail "--config is given twice; give it once" -- "$ZT_RUN" --check --config a.json --config b.json
expect_status 2
expect_fail "--set 'steps': expected KEY=VALUE, e.g. --set zero_optimization.stage=2" -- "$ZT_RUN" --check --set steps
expect_status 2
expect_fail "--config has no effect with --list-plugins" -- "$ZT_RUN" --list-plugins --config run.json
expect_status 2
expect_fail "ZT_PROBE_TIMEOUT='soon' is not a whole number of seconds from 1 to 3600" -- \
    env ZT_PROBE_TIMEOUT=soon "$ZT_RUN" --list-plugins
expect_status 2
# --name=value works like --name value.
expect_ok "sgd 1.0.0" -- "$ZT_RUN" --plugin-path="$abi_dir" --describe=sgd

# A --plugin-path that does not exist is an error (the user typed it), exit 1.
expect_fail "--plugin-path $scratch/nowhere: no such directory; give the directory that holds the .plugin descriptors" \
    -- "$ZT_RUN" --plugin-path "$scratch/nowhere" --list-plugins
expect_status 1
finish
