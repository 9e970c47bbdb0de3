#!/usr/bin/env bash
# The default attention plugin follows the run's device (docs/gpu.md), and naive attention trains on
# the GPU as flash's reference.
#   usage: default_attention.sh ZT_RUN ZT_PREP CUDA_DEVICES SRC WORK MODE
#   MODE no_gpu (label cpu; skips on a machine with a GPU): device = auto defaults to naive and trains
#        on the CPU; device = cuda defaults to flash and says why it cannot run; device = cpu: naive.
#   MODE gpu (label gpu; skips without a GPU): device = auto and cuda default to flash and train on
#        the GPU; --plugins naive trains on the GPU too (with its cost noted), and its loss curve
#        matches flash's (same data, seed and model; rtol 3e-2: flash keeps P in bf16, naive fp32 scores).
# Data: the bundled example tasks tokenized by zt-prep, or $ZT_GPU_TEST_DATA (the same data prepared
# elsewhere, for GPU machines without the sentencepiece library: scripts/gpu.sh).
set -u
zt_run=$1 zt_prep=$2 cuda_devices=$3 src=$4 work=$5 mode=$6
. "$src/tests/lib.sh"
out=$work/default-attention-$mode
rm -rf "$out" && mkdir -p "$out"

# A small model whose heads of 64 run flash's fast kernels on the GPU and take seconds on the CPU.
model=(--set model.hidden_size=128 --set model.intermediate_size=256 --set model.num_hidden_layers=2
       --set model.num_attention_heads=2 --set model.num_key_value_heads=1 --set data.seq_len=128
       --set train_micro_batch_size_per_gpu=2 --set log.every=1 --set seed=3 --set threads=2)

example_data() {
    if [ -n "${ZT_GPU_TEST_DATA:-}" ]; then
        DATA=$ZT_GPU_TEST_DATA
        return
    fi
    DATA=$out/data
    # As run_gpu_test.sh prepares it (and scripts/gpu.sh for $ZT_GPU_TEST_DATA).
    "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$DATA" \
        --val-fraction 0.05 --seed 0 --no-progress >"$out/prep.log" 2>&1 ||
        skip "zt-prep cannot tokenize the example tasks here ($(tail -n 1 "$out/prep.log")); set ZT_GPU_TEST_DATA"
}

devices=$("$cuda_devices")
have_gpu=$([ $? -eq 77 ] && echo 0 || echo 1)

no_gpu() {
    [ "$have_gpu" = 1 ] && skip "this machine has $devices CUDA device(s); no_gpu checks machines without one"
    example_data
    local run=(--data "$DATA" "${model[@]}" --set steps=2)
    # auto (the default): naive, on the CPU, and it trains
    expect_ok "attention: the default attention of device = auto: no usable GPU" "('naive')" \
        "device auto: training on the CPU because" "step 2/2" -- \
        "$zt_run" "${run[@]}" --output-dir "$out/auto"
    # cuda: flash, and the clear reason why there is no GPU run here
    expect_fail "the default attention of GPU runs (device = cuda) ('flash')" "device is cuda, but" -- \
        "$zt_run" "${run[@]}" --set device=cuda --output-dir "$out/cuda"
    expect_ok "the default attention on the CPU (device = cpu) ('naive')" "step 2/2" -- \
        "$zt_run" "${run[@]}" --set device=cpu --output-dir "$out/cpu"
    # a named plugin is never replaced
    expect_fail "plugin 'flash' runs on CUDA GPUs only" -- \
        "$zt_run" "${run[@]}" --plugins flash --set device=cpu --output-dir "$out/named"
}

gpu() {
    [ "$have_gpu" = 0 ] && skip "${devices#SKIP: }"
    example_data
    local run=(--data "$DATA" "${model[@]}" --set steps=6 --set optimizer.params.lr=3e-3
               --set scheduler.params.warmup_num_steps=1)
    expect_ok "the default attention of device = auto: " "usable GPU" "('flash')" "step 6/6" -- \
        "$zt_run" "${run[@]}" --output-dir "$out/auto"
    expect_ok "the default attention of GPU runs (device = cuda) ('flash')" "step 6/6" -- \
        "$zt_run" "${run[@]}" --set device=cuda --output-dir "$out/flash"
    expect_ok "attention 'naive' on the GPU is the unfused reference" "step 6/6" -- \
        "$zt_run" "${run[@]}" --set device=cuda --plugins naive --output-dir "$out/naive"
    if ! python3 "$src/tests/train/check.py" same-metrics "$out/flash/metrics.jsonl" "$out/naive/metrics.jsonl" \
        3e-2; then
        zt_failures=$((zt_failures + 1))
    fi
}

"$mode"
finish
