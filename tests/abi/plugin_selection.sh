#!/usr/bin/env bash
# How --check chooses a run's plugins: names, .plugin and .so paths in --plugins, defaults from the
# config (optimizer.type, zero_optimization.stage), agreement between the two, and the parallel plugin
# when a parallel size is above 1.
. "$ZT_TEST_LIB"
. "$(dirname "$0")/abi_lib.sh"

zt() { "$ZT_RUN" --plugin-path "$abi_dir" "$@"; }
resolved() { python3 -c 'import json,sys; c=json.load(sys.stdin); print(" ".join(p["name"] for p in c["_plugins"]))'; }

# optimizer.type selects the default optimizer, lower-cased as DeepSpeed writes it ("SGD").
names=$(zt --plugins "$fixtures" --set optimizer.type=SGD --check --output-dir "$scratch/a" 2>"$scratch/err" | resolved)
[ "$names" = "fixture-model sgd fixture-zero1 fixture-attention" ] ||
    { echo "FAIL: optimizer.type=SGD resolved to '$names'"; cat "$scratch/err"; zt_failures=$((zt_failures+1)); }
# A DeepSpeed-style config file selects the same way.
printf '{\n  "optimizer": {"type": "SGD", "params": {"momentum": 0.5}}\n}\n' >"$scratch/ds.json"
names=$(zt --plugins "$fixtures" --config "$scratch/ds.json" --check --output-dir "$scratch/b" 2>"$scratch/err" | resolved)
[ "$names" = "fixture-model sgd fixture-zero1 fixture-attention" ] ||
    { echo "FAIL: a config with optimizer.type SGD resolved to '$names'"; cat "$scratch/err"; zt_failures=$((zt_failures+1)); }
# A default that is not installed: the kind, the default, where it came from, and the search.
expect_check_fails "$fixtures" \
    "no optimizer plugin was named in --plugins, so zt uses the optimizer selected by optimizer.type, 'nosuchopt', which is not installed. Install it, or name another optimizer plugin in --plugins." \
    "no plugin named 'nosuchopt' is installed." "Directories searched, in order:" -- --set optimizer.type=NoSuchOpt
expect_check_fails "$fixtures" "optimizer.type = \"../evil\" is not an optimizer plugin name" -- --set optimizer.type=../evil

# A named plugin must agree with the key that would otherwise select it.
expect_check_fails "sgd,$fixtures" \
    "--plugins names the optimizer 'sgd' but the config sets optimizer.type to an optimizer called 'adamw': make them agree, or drop one of them" \
    -- --set optimizer.type=AdamW
expect_check_fails "sgd,$fixtures" \
    "--plugins names 'fixture-zero1', a ZeRO stage 1 plugin, but the config sets zero_optimization.stage = 2: make them agree, or drop one of them" \
    -- --set zero_optimization.stage=2
# ... and when the key is not set, the resolved config records what --plugins chose.
zt --plugins "sgd,$fixtures" --check --output-dir "$scratch/c" >"$scratch/c.json" 2>"$scratch/err" ||
    { echo "FAIL: --check of sgd and the fixtures"; cat "$scratch/err"; zt_failures=$((zt_failures+1)); }
python3 - "$scratch/c.json" <<'PY' || zt_failures=$((zt_failures+1))
import json, sys
c = json.load(open(sys.argv[1]))
bad = []
if c["optimizer"]["type"] != "sgd": bad.append(f"optimizer.type {c['optimizer']['type']!r}, expected 'sgd'")
if c["zero_optimization"]["stage"] != 1: bad.append(f"zero_optimization.stage {c['zero_optimization']['stage']!r}, expected 1")
for key in ("optimizer.type", "zero_optimization.stage"):
    if "--plugins" not in c["_sources"][key]: bad.append(f"source of {key} is {c['_sources'][key]!r}, expected --plugins")
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY

# Parallel sizes above 1 select the parallel plugin (its schema joins the config); data parallelism
# alone loads none.
expect_ok '"parallel.virtual_stages": "default"' -- zt --plugins "sgd,$fixtures" --check --output-dir "$scratch/p" \
    --set parallel_config.model_parallel=2
if zt --plugins "sgd,$fixtures" --check --output-dir "$scratch/q" 2>&1 | grep -q '"parallel.virtual_stages"'; then
    echo "FAIL: a run without tensor or pipeline parallelism loaded the parallel plugin" >&2
    exit 1
fi

# Paths instead of names: a .plugin descriptor and a bare .so.
expect_ok "\"name\": \"sgd\"" -- zt --plugins "$abi_dir/sgd.plugin,$fixtures" --check --output-dir "$scratch/d"
expect_ok "\"name\": \"sgd\"" -- zt --plugins "$abi_lib/libzt-test-sgd.so,$fixtures" --check --output-dir "$scratch/e"
expect_check_fails "$scratch/none/libzt-x.so,$fixtures" "plugin library $scratch/none/libzt-x.so: no such file"
expect_check_fails "$scratch/none/x.plugin,$fixtures" "bad plugin descriptor: $scratch/none/x.plugin: cannot open the descriptor: No such file or directory"
expect_check_fails "sub/dir,$fixtures" "'sub/dir' is neither a plugin name nor a path ending in .plugin or .so"
# List syntax.
expect_check_fails "sgd,,$fixtures" "--plugins 'sgd,,$fixtures': entry 2 is empty; separate plugin names with single commas"
expect_ok "\"name\": \"sgd\"" -- zt --plugins " sgd , $fixtures" --check --output-dir "$scratch/f"
finish
