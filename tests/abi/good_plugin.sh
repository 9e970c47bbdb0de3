#!/usr/bin/env bash
# The good test plugin (sgd, a real optimizer) through --describe and --check: its options are
# described, validated with the rest of the config, and it is probed and initialized.
. "$ZT_TEST_LIB"
. "$(dirname "$0")/abi_lib.sh"

sgd_lib="$abi_lib/libzt-test-sgd.so"
zt() { "$ZT_RUN" --plugin-path "$abi_dir" "$@"; }

# --describe: header, then one line per option with key, type, default, range and help.
expect_ok "sgd 1.0.0: an optimizer plugin, zt ABI 1.5" \
          "  SGD with momentum, as torch.optim.SGD (zt ABI test plugin)" \
          "  library:      $sgd_lib" "  descriptor:   $abi_dir/sgd.plugin" "  capabilities: cpu" \
          "Options (set them in the --config file or with --set KEY=VALUE):" -- zt --describe sgd
for row in 'optimizer\.params\.lr +float +0\.01 +> 0 +learning rate' \
           'optimizer\.params\.weight_decay +float +0 +>= 0 +L2 penalty' \
           'optimizer\.params\.momentum +float +0 +\[0, 1\] +momentum factor' \
           'optimizer\.params\.dampening +float +0 +\[0, 1\] +dampening' \
           'optimizer\.params\.nesterov +bool +false +- +Nesterov momentum'; do
    grep -qE "^  $row" <<<"$ZT_OUT" || { echo "FAIL: no option row matching /$row/ in:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
done
expect_fail "no plugin named 'sgdd' is installed. Closest installed: 'sgd' (optimizer)" -- zt --describe sgdd
expect_status 1
# Enums show their choices, sizes their unit-less bounds.
expect_ok "fixture-zero1 0.0.1: a zero plugin, zt ABI 1.5" -- zt --describe fixture-zero1
for row in 'zero_optimization\.offload_optimizer\.device +enum +none +none\|cpu +where optimizer state lives' \
           'zero_optimization\.reduce_bucket_size +bytes +500M +>= 1 +gradient bucket size'; do
    grep -qE "^  $row" <<<"$ZT_OUT" || { echo "FAIL: no option row matching /$row/ in:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
done
expect_check_fails "sgd,$fixtures" "zero_optimization.offload_optimizer.device" "nvme" -- \
    --set zero_optimization.offload_optimizer.device=nvme
# --describe loads without probing: a plugin that cannot run here is still described.
expect_ok "refuse-probe 0.0.1: an optimizer plugin" "Options: none" -- zt --describe refuse-probe
# ... but one that fails the ABI checks is refused with the same message as in a run.
expect_fail "plugin 'newer-minor' ($abi_lib/libzt-test-newer-minor.so) was built against zt ABI 1.6" -- zt --describe newer-minor
expect_status 1

# --check: the whole set passes; the resolved config is printed on stdout and saved atomically.
out="$scratch/run"
json=$(zt --plugins "sgd,$fixtures" --check --set optimizer.type=sgd --set optimizer.params.momentum=0.9 \
          --output-dir "$out" 2>"$scratch/stderr")
rc=$?
if [ $rc -ne 0 ]; then
    echo "FAIL: --check exited $rc"; cat "$scratch/stderr"; zt_failures=$((zt_failures+1))
else
    grep -qF "zt-run: check passed; resolved config saved to $out/config.resolved.json" "$scratch/stderr" ||
        { echo "FAIL: no 'check passed' on stderr"; cat "$scratch/stderr"; zt_failures=$((zt_failures+1)); }
    cmp -s <(printf '%s\n' "$json") "$out/config.resolved.json" ||
        { echo "FAIL: the saved config differs from the printed one"; zt_failures=$((zt_failures+1)); }
    ls -A "$out" | grep -v '^config.resolved.json$' && { echo "FAIL: temp files left in $out"; zt_failures=$((zt_failures+1)); }
    # Python's json module reads it back independently.
    python3 - "$out/config.resolved.json" "$sgd_lib" "$abi_lib" <<'PY' || zt_failures=$((zt_failures+1))
import json, sys
path, sgd_lib, abi_lib = sys.argv[1:]
c = json.load(open(path))
problems = []
def expect(what, got, want):
    if got != want: problems.append(f"{what}: got {got!r}, expected {want!r}")
expect("optimizer.params.momentum", c["optimizer"]["params"]["momentum"], 0.9)
expect("optimizer.params.lr (sgd's default)", c["optimizer"]["params"]["lr"], 0.01)
expect("optimizer.params.nesterov (sgd's default)", c["optimizer"]["params"]["nesterov"], False)
expect("optimizer.type", c["optimizer"]["type"], "sgd")
expect("source of optimizer.params.momentum", c["_sources"]["optimizer.params.momentum"], "--set")
expect("source of optimizer.params.dampening", c["_sources"]["optimizer.params.dampening"], "default")
want = [("fixture-model", "model"), ("sgd", "optimizer"), ("fixture-zero1", "zero"),
        ("fixture-attention", "attention")]
expect("_plugins names and kinds", [(p["name"], p["kind"]) for p in c["_plugins"]], want)
for p in c["_plugins"]:
    expect(p["name"] + " abi", p["abi"], "1.5")
    expect(p["name"] + " path", p["path"], f"{abi_lib}/libzt-test-{p['name']}.so")
expect("sgd version", [p["version"] for p in c["_plugins"] if p["name"] == "sgd"], ["1.0.0"])
for p in problems: print("FAIL:", p)
sys.exit(1 if problems else 0)
PY
fi

# The plugin's keys are validated like the host's, before any init.
expect_check_fails "sgd,$fixtures" "optimizer.params.momentum" "1.5" -- --set optimizer.params.momentum=1.5
expect_check_fails "sgd,$fixtures" "optimizer.params.momentun" "optimizer.params.momentum" -- --set optimizer.params.momentun=0.5
# Without sgd loaded, its keys are unknown.
expect_check_fails "throw-init,$fixtures" "optimizer.params.nesterov" -- --set optimizer.params.nesterov=true
# What the schema cannot say, init checks, and its message reaches the user.
expect_check_fails "sgd,$fixtures" \
    "plugin 'sgd' failed in init() (config error): optimizer.params.nesterov = true needs optimizer.params.momentum > 0" \
    -- --set optimizer.params.nesterov=true
finish
