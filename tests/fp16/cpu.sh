#!/usr/bin/env bash
# fp16 options on the CPU (label cpu): the CPU trains in fp32 and ignores fp16.enabled (with a warning,
# no loss scale recorded); contradictions and out-of-range values stop before training with a message.
#   cpu.sh ZT_RUN FIXTURE_DATA_MAKER FIXTURES SOURCE_DIR WORK_DIR
set -u
zt_run=$1 maker=$2 fixtures=$3 src=$4 out=$5
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"
FIX=$fixtures/llama_gqa_untied
[ -f "$FIX/config.json" ] || skip "the torch fixture $FIX is missing (tests/reference/fixtures)"
rm -rf "$out" && mkdir -p "$out"
expect_ok -- "$maker" "$FIX" "$out/data"
run=(--model "$FIX" --data "$out/data" --set device=cpu --plugins naive --set train_micro_batch_size_per_gpu=2
     --set data.seq_len=16 --set data.shuffle=false --set steps=2 --set checkpoint.final=false --set threads=2)

expect_ok "fp16.enabled is ignored on the CPU, which trains in fp32" -- \
    "$zt_run" "${run[@]}" --set fp16.enabled=true --output-dir "$out/ignored"
if ! python3 "$here/check_fp16.py" no-scale "$out/ignored/metrics.jsonl"; then zt_failures=$((zt_failures + 1)); fi
expect_fail "fp16.enabled and bf16.enabled are both true; pick one precision" -- \
    "$zt_run" "${run[@]}" --set fp16.enabled=true --set bf16.enabled=true --output-dir "$out/x"
expect_fail "fp16.min_loss_scale is 8, above the initial loss scale 2^2 = 4" -- \
    "$zt_run" "${run[@]}" --set fp16.enabled=true --set fp16.initial_scale_power=2 --set fp16.min_loss_scale=8 \
    --output-dir "$out/x"
expect_fail "fp16.initial_scale_power" -- \
    "$zt_run" "${run[@]}" --set fp16.enabled=true --set fp16.initial_scale_power=33 --output-dir "$out/x"
expect_fail "fp16.hysteresis" -- "$zt_run" "${run[@]}" --set fp16.enabled=true --set fp16.hysteresis=0 \
    --output-dir "$out/x"
expect_fail "fp16.min_loss_scale" -- "$zt_run" "${run[@]}" --set fp16.enabled=true --set fp16.min_loss_scale=0 \
    --output-dir "$out/x"
# bf16 without fp16 on the CPU changes nothing (fp32): still trains
expect_ok -- "$zt_run" "${run[@]}" --set bf16.enabled=false --output-dir "$out/bf16off"
finish
