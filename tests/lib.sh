# Shared helpers for zt's shell tests. Source it: . "$ZT_TEST_LIB"
# expect_fail / expect_ok run a command, capture its output and check exit status and substrings;
# every failed expectation is counted and the test exits non-zero at the end (finish).
zt_failures=0

_zt_run() { ZT_OUT=$("$@" 2>&1); ZT_RC=$?; }

# expect_fail "substring" [more substrings...] -- cmd args...
expect_fail() {
    local needles=()
    while [ "$1" != "--" ]; do needles+=("$1"); shift; done; shift
    _zt_run "$@"
    if [ "$ZT_RC" -eq 0 ]; then
        echo "FAIL: expected non-zero exit from: $*"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); return
    fi
    if [ "$ZT_RC" -ge 128 ]; then
        echo "FAIL: crashed (signal $((ZT_RC-128))): $*"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); return
    fi
    for n in "${needles[@]}"; do
        if ! grep -qF -- "$n" <<<"$ZT_OUT"; then
            echo "FAIL: expected '$n' in output of: $*"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1))
        fi
    done
}

# expect_ok "substring"... -- cmd args...
expect_ok() {
    local needles=()
    while [ "$1" != "--" ]; do needles+=("$1"); shift; done; shift
    _zt_run "$@"
    if [ "$ZT_RC" -ne 0 ]; then
        echo "FAIL: exit $ZT_RC from: $*"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); return
    fi
    for n in "${needles[@]}"; do
        if ! grep -qF -- "$n" <<<"$ZT_OUT"; then
            echo "FAIL: expected '$n' in output of: $*"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1))
        fi
    done
}

skip() { echo "SKIP: $*"; exit 77; }

finish() {
    if [ "$zt_failures" -ne 0 ]; then echo "$zt_failures expectation(s) failed"; exit 1; fi
    exit 0
}
