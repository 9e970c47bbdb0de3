#!/usr/bin/env bash
# --list-plugins over the test plugins: every plugin is loaded and probed in a child process, so the
# broken ones show up as "no" with their reason (a crash included) and the listing still succeeds.
. "$ZT_TEST_LIB"
. "$(dirname "$0")/abi_lib.sh"

expect_ok "Plugin search path (first match wins):" "  1. $abi_dir" -- "$ZT_RUN" --plugin-path "$abi_dir" --list-plugins
list="$ZT_OUT"
header=$(grep '^NAME ' <<<"$list")
for column in NAME KIND VERSION ABI "RUNS HERE" CAPS PATH DESCRIPTION; do
    grep -qF "$column" <<<"$header" || { echo "FAIL: no column $column in: $header"; zt_failures=$((zt_failures+1)); }
done
# row NAME KIND VERSION ABI HERE CAPS: the columns of one plugin's row, in order.
row() {
    local pattern="^$1 +$2 +$3 +$4 +$5 +$6 +$abi_lib/libzt-test-$1\.so +"
    grep -qE "$pattern" <<<"$list" || { echo "FAIL: no row matching /$pattern/ in:"; echo "$list"; zt_failures=$((zt_failures+1)); }
}
# reason NAME "text": the indented line under NAME's row.
reason() {
    grep -A1 -E "^$1 " <<<"$list" | grep -qF -- "$2" ||
        { echo "FAIL: no reason '$2' under $1 in:"; echo "$list"; zt_failures=$((zt_failures+1)); }
}
row sgd optimizer 1.0.0 1.5 yes cpu
grep -qE "^sgd .* SGD with momentum, as torch.optim.SGD \(zt ABI test plugin\)$" <<<"$list" ||
    { echo "FAIL: sgd's description"; zt_failures=$((zt_failures+1)); }
row fixture-zero1 zero 0.0.1 1.5 yes cpu
row refuse-probe optimizer 0.0.1 1.5 no cpu
reason refuse-probe "    no: plugin 'refuse-probe' cannot run here: the test plugin refuse-probe needs a flux capacitor"
row segv-probe optimizer 0.0.1 1.5 no cpu
reason segv-probe "    no: probe() of plugin 'segv-probe' crashed (Segmentation fault, signal 11)"
row throw-probe optimizer 0.0.1 1.5 no cpu
reason throw-probe "    no: probe() of plugin 'throw-probe' crashed (Aborted, signal 6)"
# A plugin refused at load shows the descriptor's ABI claim and no version.
row newer-minor optimizer - 1.5 no -
reason newer-minor "was built against zt ABI 1.6, this zt provides 1.5"
row missing-so optimizer - 1.5 no -
reason missing-so "its library was not found"
# init is not called by a listing: init-fails and throw-init can run here as far as probe knows.
row init-fails optimizer 0.0.1 1.5 yes cpu
row throw-init optimizer 0.0.1 1.5 yes cpu
grep -qF "Problems (these descriptors are ignored until fixed):" <<<"$list" &&
grep -qF "  $abi_dir/syntax-error.plugin:3: expected 'key = value', found 'kind optimizer'" <<<"$list" ||
    { echo "FAIL: syntax-error.plugin not listed as a problem"; zt_failures=$((zt_failures+1)); }
finish
