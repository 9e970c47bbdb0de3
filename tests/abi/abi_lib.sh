# Helpers shared by the tests/abi shell tests (sourced after tests/lib.sh).
[ -x "$ZT_RUN" ] || { echo "ZT_RUN ($ZT_RUN) is not an executable: build zt-run first"; exit 1; }
[ -d "$ZT_ABI_PLUGINS_D" ] || { echo "ZT_ABI_PLUGINS_D ($ZT_ABI_PLUGINS_D) is missing: build the test plugins"; exit 1; }

# The registry prints canonical paths.
abi_dir=$(realpath "$ZT_ABI_PLUGINS_D")
abi_lib=$(realpath "$ZT_ABI_LIB_DIR")
# These complete a run's plugin set (model, attention, zero) around the plugin under test.
fixtures="fixture-model,fixture-attention,fixture-zero1"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# expect_status N: the exit status of the last expect_ok/expect_fail command was N.
expect_status() {
    if [ "$ZT_RC" -ne "$1" ]; then
        echo "FAIL: expected exit status $1, got $ZT_RC"; zt_failures=$((zt_failures+1))
    fi
}

# expect_check_fails PLUGINS "message"... [-- extra zt-run args]: --check fails with status 1.
expect_check_fails() {
    local plugins="$1"; shift
    local needles=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do needles+=("$1"); shift; done
    [ "${1-}" = "--" ] && shift
    expect_fail "${needles[@]}" -- "$ZT_RUN" --plugin-path "$abi_dir" --plugins "$plugins" --check \
        --output-dir "$scratch/out" "$@"
    expect_status 1
}
