#!/usr/bin/env bash
# fp16 training with dynamic loss scaling on a GPU (fp16.enabled; docs/cuda.md, "fp16"), end to end
# through zt-run with llama + naive attention + adamw + zero0 (loss_curve_flash: with flash attention's
# fp16 kernels). One test per call:
#   fp16_gpu.sh ZT_RUN CUDA_DEVICES FIXTURE_DATA_MAKER FIXTURES SOURCE_DIR WORK_DIR TEST
# Every test skips (exit 77, "SKIP: no CUDA device ...") where CUDA_DEVICES finds no GPU. loss_curve
# trains on the example tasks ($ZT_GPU_TEST_DATA, or tokenized here by ZT_PREP when set); the others
# on a torch fixture's one batch (the same batch every step: data.shuffle false, one micro-batch).
set -u
zt_run=$1 cuda_devices=$2 maker=$3 fixtures=$4 src=$5 work=$6 test=$7
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"
out=$work/$test

need_gpu() {
    local devices
    devices=$("$cuda_devices")
    [ $? -eq 77 ] && skip "${devices#SKIP: }"
    echo "$devices CUDA device(s)"
}

check() {
    if ! python3 "$here/check_fp16.py" "$@"; then zt_failures=$((zt_failures + 1)); fi
}

fp16=(--set device=cuda --plugins naive --set fp16.enabled=true --set bf16.enabled=false)

# The fixture's one batch as a data set; sets FIX (the model) and DATA.
fixture_data() {
    FIX=$fixtures/llama_gqa_untied
    DATA=$out/data
    [ -f "$FIX/config.json" ] || skip "the torch fixture $FIX is missing (tests/reference/fixtures)"
    expect_ok -- "$maker" "$FIX" "$DATA"
}
on_fixture() {
    echo --model "$FIX" --data "$DATA" --set train_micro_batch_size_per_gpu=2 --set data.seq_len=16 \
        --set data.shuffle=false --set scheduler.type=constant --set optimizer.params.lr=1e-3 \
        --set gradient_clipping=0 --set log.every=1
}

# 30 steps on the CPU (fp32) and on the GPU (fp16, naive attention) from the same weights and batches:
# the curves agree within 2e-2 (the bf16 test allows 5e-2), no step overflows at 2^10, the run learns.
loss_curve() {
    curve_against_cpu naive
}

# The same with flash attention's fp16 kernels on the GPU (head_dim 64: the flash kernels proper, the wgmma
# ones on an H100/H200).
loss_curve_flash() {
    curve_against_cpu flash
}

# curve_against_cpu ATTENTION: the CPU fp32 run (naive) against the GPU fp16 run with ATTENTION.
curve_against_cpu() {
    local attention=$1 gpu_needles=("fp16: IEEE half compute with dynamic loss scaling from 1024")
    need_gpu
    local DATA=${ZT_GPU_TEST_DATA:-}
    if [ -z "$DATA" ]; then
        [ -n "${ZT_PREP:-}" ] || skip "set ZT_GPU_TEST_DATA to the example tasks tokenized (scripts/gpu.sh does)"
        DATA=$out/data
        "$ZT_PREP" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$DATA" \
            --val-fraction 0.05 --seed 0 --no-progress >"$out/prep.log" 2>&1 || skip "zt-prep failed here"
    fi
    local run=(--data "$DATA" --set model.hidden_size=256 --set model.intermediate_size=512
               --set model.num_hidden_layers=2 --set model.num_attention_heads=4 --set model.num_key_value_heads=2
               --set data.seq_len=128 --set train_micro_batch_size_per_gpu=8 --set threads=8 --set log.every=1000
               --set optimizer.params.lr=3e-3 --set scheduler.params.warmup_num_steps=5 --set steps=30
               --set eval.every=30 --set eval.batches=4 --set checkpoint.final=false)
    expect_ok -- "$zt_run" "${run[@]}" --set device=cpu --plugins naive --output-dir "$out/cpu"
    expect_ok "${gpu_needles[@]}" -- \
        "$zt_run" "${run[@]}" --set device=cuda --plugins "$attention" --set fp16.enabled=true \
        --set bf16.enabled=false --set fp16.initial_scale_power=10 --output-dir "$out/gpu"
    check curves "$out/cpu/metrics.jsonl" "$out/gpu/metrics.jsonl"
}

# Loss scale 2^32: the first steps overflow (dlogits beyond 65504) and are skipped on the device-side
# norm, the scale holds for `hysteresis` (2) steps and then halves every step until the gradients fit;
# training then proceeds. The first applied update equals, bit for bit, that of a run started at the
# scale it settled on (the skipped steps changed nothing: not the weights, not Adam's step counter).
overflow() {
    need_gpu
    fixture_data
    local base
    read -r -a base <<<"$(on_fixture)"
    expect_ok "fp16 gradients overflowed at loss scale 4.29497e+09" "loss scale 4.29497e+09 -> 2.14748e+09" -- \
        "$zt_run" "${base[@]}" "${fp16[@]}" --set fp16.initial_scale_power=32 --set steps=25 \
        --set checkpoint.final=false --output-dir "$out/a"
    local power first
    power=$(python3 "$here/check_fp16.py" overflow "$out/a/metrics.jsonl" 32 2) || {
        echo "FAIL: the overflow sequence"; echo "$power"; zt_failures=$((zt_failures + 1)); finish; }
    first=$(python3 "$here/check_fp16.py" first-applied "$out/a/metrics.jsonl")
    echo "settled at 2^$power; first applied step $first"
    expect_ok -- "$zt_run" "${base[@]}" "${fp16[@]}" --set fp16.initial_scale_power=32 --set steps="$first" \
        --set checkpoint.final=false --output-dir "$out/a1" --export "$out/a1/hf" --export-dtype fp32
    expect_ok -- "$zt_run" "${base[@]}" "${fp16[@]}" --set fp16.initial_scale_power="$power" --set steps=1 \
        --set checkpoint.final=false --output-dir "$out/b" --export "$out/b/hf" --export-dtype fp32
    check same-bits "$out/a1/hf/model.safetensors" "$out/b/hf/model.safetensors"
}

# Every backward overflows (the test hook ZT_FP16_TEST_OVERFLOW=1 makes the loss scale infinite, so
# the inf flows through the real kernels): 8 -> 4 -> 2 = min, then 2 x hysteresis = 4 overflowing steps
# at the minimum, and the run stops at step 7 with the collapse message.
collapse() {
    need_gpu
    fixture_data
    local base
    read -r -a base <<<"$(on_fixture)"
    expect_fail "fp16: gradients overflow even at the minimum loss scale 2 at step 7" "lower the learning rate" \
        "bf16.enabled" "fp16.min_loss_scale only if" "loss scale 8 -> 4" "loss scale 4 -> 2" -- \
        env ZT_FP16_TEST_OVERFLOW=1 "$zt_run" "${base[@]}" "${fp16[@]}" --set fp16.initial_scale_power=3 \
        --set fp16.min_loss_scale=2 --set fp16.hysteresis=2 --set steps=20 --set checkpoint.final=false \
        --output-dir "$out/c"
    # a learning rate so large that the weights themselves blow up: the same stop, for a real cause
    expect_fail "fp16: gradients overflow even at the minimum loss scale" -- \
        "$zt_run" "${base[@]}" "${fp16[@]}" --set optimizer.params.lr=1e6 --set fp16.initial_scale_power=2 \
        --set fp16.min_loss_scale=1 --set steps=40 --set checkpoint.final=false --output-dir "$out/d"
}

# A run of overflows longer than the loss scale's start-up stops at the skip limit (docs/training.md,
# "Skipped steps") when fp16.min_loss_scale is so low that the scale cannot collapse first: 34 steps in a
# row at the defaults (initial_scale_power 16, hysteresis 2: twice the 17 skips from 2^16 down to 1);
# from 2^20, 2 x (20 + 2 - 1) = 42.
skip_limit() {
    need_gpu
    fixture_data
    local base
    read -r -a base <<<"$(on_fixture)"
    expect_fail "steps 1 to 34: 34 optimizer steps in a row were skipped (zt stops after 34" \
        "fp16 gradients overflowed" "Train in bf16" -- \
        env ZT_FP16_TEST_OVERFLOW=1 "$zt_run" "${base[@]}" "${fp16[@]}" --set fp16.min_loss_scale=1e-9 \
        --set steps=60 --set checkpoint.final=false --output-dir "$out/a"
    expect_fail "steps 1 to 42: 42 optimizer steps in a row were skipped (zt stops after 42" -- \
        env ZT_FP16_TEST_OVERFLOW=1 "$zt_run" "${base[@]}" "${fp16[@]}" --set fp16.initial_scale_power=20 \
        --set fp16.min_loss_scale=1e-12 --set steps=60 --set checkpoint.final=false --output-dir "$out/b"
}

# The scale is checkpointed: 6 steps straight == 3 steps, a checkpoint, 3 resumed steps, with the scale
# doubling every 2 steps (window 2) across the checkpoint. A bf16 checkpoint (no scaler state) resumes
# under fp16 from the initial scale.
resume() {
    need_gpu
    fixture_data
    local base
    read -r -a base <<<"$(on_fixture)"
    local run=("${base[@]}" "${fp16[@]}" --set fp16.initial_scale_power=8 --set fp16.loss_scale_window=2)
    expect_ok -- "$zt_run" "${run[@]}" --set steps=6 --output-dir "$out/straight"
    expect_ok "checkpoint of step 3 saved" -- "$zt_run" "${run[@]}" --set steps=3 --output-dir "$out/resumed"
    expect_ok "fp16: loss scale 512 restored from the checkpoint" -- \
        "$zt_run" "${run[@]}" --set steps=6 --output-dir "$out/resumed" --resume latest
    check resume "$out/straight/metrics.jsonl" "$out/resumed/metrics.jsonl"
    expect_ok -- "$zt_run" "${base[@]}" --set device=cuda --plugins naive --set steps=2 --output-dir "$out/old"
    expect_ok "has no loss-scale state" -- "$zt_run" "${run[@]}" --set steps=3 --output-dir "$out/old" --resume latest
}

# What an fp16 GPU run refuses, and how it says so.
errors() {
    need_gpu
    fixture_data
    local base
    read -r -a base <<<"$(on_fixture)"
    expect_fail "bf16.enabled is false and fp16.enabled is false" -- \
        "$zt_run" "${base[@]}" --set device=cuda --plugins naive --set bf16.enabled=false --set steps=1 \
        --output-dir "$out/x"
}

rm -rf "$out" && mkdir -p "$out"
"$test"
finish
