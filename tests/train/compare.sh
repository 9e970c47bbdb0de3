#!/usr/bin/env bash
# zt-run --compare (docs/compare.md) end to end on the CPU. One test per call:
#   compare.sh ZT_RUN SOURCE_DIR WORK_DIR TEST
#   table      2 keys x 2 values: one row per combination in the product's order, each figure of
#              compare.json recomputed from the child's own files (check_compare.py), compare.md valid
#   no_fit     ZT_HOST_MEM_AVAILABLE between two micro-batches' estimated host memory (read from
#              dry runs made here): the larger one's row says host memory overflows, the others ran
#   errors     bad --compare arguments and bad values: clear errors, exit 2 or 1, nothing run
#   interrupt  SIGINT during the second combination: exit 130, the table of the first
#   nproc      --nproc 2 (each child an MPI job of 2 ranks): the table as for one rank
# The data is train.data's (run_test.sh prepare_data); the model is tiny, so each test takes seconds.
set -u
zt_run=$1 src=$2 work=$3 test=$4
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
command -v python3 >/dev/null || skip "python3 is needed to check compare.json"

data=$work/data
out=$work/compare-$test
[ -f "$data/manifest.json" ] || skip "no prepared data in $data (train.data prepares it)"
rm -rf "$out" && mkdir -p "$out"
tiny=(--data "$data" --set device=cpu --set model.hidden_size=32 --set model.intermediate_size=64
      --set model.num_hidden_layers=1 --set model.num_attention_heads=2 --set model.num_key_value_heads=1
      --set data.seq_len=128 --set train_micro_batch_size_per_gpu=2 --set threads=1)

fail() { echo "FAIL: $*"; zt_failures=$((zt_failures + 1)); }
check() { python3 "$here/check_compare.py" "$@" || zt_failures=$((zt_failures + 1)); }

table() {
    local keys=(recompute=false,true zero_optimization.stage=0,1)
    expect_ok "compare 1 of 4: recompute=false zero_optimization.stage=0" "compare 4 of 4" "| # | recompute |" -- \
        "$zt_run" "${tiny[@]}" --output-dir "$out/run" --compare "${keys[0]}" --compare "${keys[1]}" \
        --compare-warmup 1 --compare-steps 2
    check "$out/run" "${keys[@]}" --warmup 1 --timed 2
    # What zt-run printed is the compare.md it wrote.
    grep -qF -- "$(head -n 12 "$out/run/compare.md")" <<<"$ZT_OUT" || fail "stdout does not hold compare.md"
}

# The estimated host total of one micro-batch size (a dry run's memory-estimate.json).
estimated_host() {
    "$zt_run" "${tiny[@]}" --set train_micro_batch_size_per_gpu="$1" --output-dir "$out/dry-$1" --dry-run \
        >/dev/null 2>&1 || { fail "dry run of micro-batch $1"; echo 0; return; }
    python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print([r for r in rows if r["chosen"]][0]["host"]["total"])' "$out/dry-$1/memory-estimate.json"
}

no_fit() {
    local small big limit
    small=$(estimated_host 2) big=$(estimated_host 8)
    limit=$(((small + big) / 2))
    [ "$big" -gt "$small" ] || fail "micro-batch 8 should need more host memory than 2 ($big, $small)"
    # Rows 1 and 3 fit under the limit, row 2 does not; the run of row 3 shows the table goes on.
    ZT_HOST_MEM_AVAILABLE=$limit expect_ok "compare 2 of 3: does not fit: out of host memory" \
        "does not fit: host memory" -- "$zt_run" "${tiny[@]}" --output-dir "$out/run" \
        --compare train_micro_batch_size_per_gpu=2,8,1 --compare-warmup 1 --compare-steps 2
    check "$out/run" train_micro_batch_size_per_gpu=2,8,1 --warmup 1 --timed 2 --host-limit "$limit"
    python3 - "$out/run/compare.json" <<'EOF' || fail "compare.json's outcomes"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["outcome"] for r in rows] == ["ran", "does not fit", "ran"], [r["outcome"] for r in rows]
EOF
}

errors() {
    local run=("$zt_run" "${tiny[@]}" --output-dir "$out/run")
    expect_fail "--compare 'recompute': expected KEY=V1,V2" -- "${run[@]}" --compare recompute
    expect_fail "value 2 is empty" -- "${run[@]}" --compare recompute=true,,false
    expect_fail "the value true is given twice" -- "${run[@]}" --compare recompute=true,true
    expect_fail "a bracket is not closed" -- "${run[@]}" --compare 'optimizer.params.betas=[0.9,0.95],[0.8'
    expect_fail "steps cannot be compared" -- "${run[@]}" --compare steps=1,2
    expect_fail "--compare recompute is given twice" -- "${run[@]}" --compare recompute=true --compare recompute=false
    expect_fail "make more than 64 combinations" -- "${run[@]}" --compare seed=1,2,3,4,5 \
        --compare recompute=true,false --compare data.seq_len=16,32,64,128,256,512,1024
    expect_fail "--compare-steps '0' is not a whole number of steps" -- "${run[@]}" --compare seed=1,2 --compare-steps 0
    expect_fail "--compare-warmup goes with --compare" -- "${run[@]}" --compare-warmup 1
    expect_fail "--nproc 'two' is not a number of ranks" -- "${run[@]}" --compare seed=1,2 --nproc two
    expect_fail "--resume does not go with --compare" -- "${run[@]}" --compare seed=1,2 --resume latest
    expect_fail "--compare is for training and has no effect with --check" -- "$zt_run" --check --compare seed=1,2
    # Values are checked before anything runs, with the key's own message.
    expect_fail "combination 2 of 2 (zero_optimization.stage=5)" "Nothing was run" -- "${run[@]}" \
        --compare zero_optimization.stage=0,5
    expect_fail "did you mean 'zero_optimization.stage'?" -- "${run[@]}" --compare zero_optimization.stag=0,1
    expect_fail "no plugin named 'nosuch'" -- "${run[@]}" --compare attention=naive,nosuch
    [ "$ZT_RC" -eq 1 ] || fail "a bad value should exit 1, not $ZT_RC"
    [ ! -e "$out/run/runs" ] || fail "a refused comparison ran something: $(ls "$out/run/runs")"
}

interrupt() {
    # The second combination's steps are 20 micro-batches each: it is still training when interrupted.
    local keys=gradient_accumulation_steps=1,20
    "$zt_run" "${tiny[@]}" --output-dir "$out/run" --compare "$keys" --compare-warmup 1 --compare-steps 20 \
        >"$out/stdout" 2>"$out/stderr" &
    local pid=$! i
    for i in $(seq 600); do
        [ -s "$out/run/runs/02-gradient_accumulation_steps_20/metrics.jsonl" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -INT "$pid"
    wait "$pid"
    local rc=$?
    [ "$rc" -eq 130 ] || { fail "an interrupted comparison exits 130, not $rc"; cat "$out/stderr"; }
    grep -qF "compare 2 of 2: interrupted; the table holds the 1 that finished" "$out/stderr" ||
        { fail "no interruption line"; cat "$out/stderr"; }
    grep -qF "interrupted after step" "$out/run/runs/02-gradient_accumulation_steps_20/train.log" ||
        fail "the child was not stopped by the relayed SIGINT"
    check "$out/run" "$keys" --warmup 1 --timed 20 --interrupted --expect-rows 1
}

nproc() {
    expect_ok "compare 2 of 2" -- "$zt_run" "${tiny[@]}" --nproc 2 --output-dir "$out/run" \
        --compare zero_optimization.stage=0,2 --compare-warmup 1 --compare-steps 2
    check "$out/run" zero_optimization.stage=0,2 --warmup 1 --timed 2
    grep -q '"nproc":2' "$out/run/compare.json" || fail "compare.json does not say 2 ranks"
}

"$test"
finish
