#!/usr/bin/env bash
# `zt-run --plugins llama,zero3,paged` trains on a GPU (device = cuda) with the flash kernels, the
# calls the flash plugin makes (plugins/paged/train_cuda.c), so its train and eval records equal a
# `--plugins llama,zero3,flash` run's on the same model, data and seed: exactly when two flash runs
# are themselves bit for bit equal (the flash backward may add dQ in a varying order), else within
# rtol 1e-3 (and the message says which).
#   usage: paged_training.sh ZT_RUN ZT_PREP CUDA_DEVICES SRC WORK
# Data: the bundled example tasks tokenized by zt-prep, or $ZT_GPU_TEST_DATA (scripts/gpu.sh).
set -u
zt_run=$1 zt_prep=$2 cuda_devices=$3 src=$4 work=$5
. "$src/tests/lib.sh"
out=$work/paged-training
rm -rf "$out" && mkdir -p "$out"
devices=$("$cuda_devices")
[ $? -eq 77 ] && skip "${devices#SKIP: }"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"
if [ -n "${ZT_GPU_TEST_DATA:-}" ]; then
    DATA=$ZT_GPU_TEST_DATA
else
    DATA=$out/data
    "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$DATA" \
        --val-fraction 0.05 --seed 0 --no-progress >"$out/prep.log" 2>&1 ||
        skip "zt-prep cannot tokenize the example tasks here ($(tail -n 1 "$out/prep.log")); set ZT_GPU_TEST_DATA"
fi
# Heads of 64 (the flash kernels' size), grouped KV heads, packed rows; evaluation at steps 3 and 6.
run=(--data "$DATA" --set device=cuda --set model.hidden_size=256 --set model.intermediate_size=512
     --set model.num_hidden_layers=2 --set model.num_attention_heads=4 --set model.num_key_value_heads=2
     --set data.seq_len=128 --set train_micro_batch_size_per_gpu=4 --set log.every=1 --set seed=5 --set threads=2
     --set steps=6 --set eval.every=3 --set eval.batches=2 --set optimizer.params.lr=3e-3
     --set scheduler.params.warmup_num_steps=1 --set checkpoint.final=false)
expect_ok "step 6/6" -- "$zt_run" "${run[@]}" --plugins llama,zero3,flash --output-dir "$out/flash"
expect_ok "step 6/6" -- "$zt_run" "${run[@]}" --plugins llama,zero3,flash --output-dir "$out/flash2"
expect_ok "step 6/6" -- "$zt_run" "${run[@]}" --plugins llama,zero3,paged --output-dir "$out/paged"
rtol=0
if ! python3 "$src/tests/train/check.py" same-metrics "$out/flash/metrics.jsonl" "$out/flash2/metrics.jsonl" 0; then
    echo "two flash runs differ in the last bits (the backward's dQ order): paged is compared at rtol 1e-3"
    rtol=1e-3
fi
if ! python3 "$src/tests/train/check.py" same-metrics "$out/flash/metrics.jsonl" "$out/paged/metrics.jsonl" $rtol; then
    zt_failures=$((zt_failures + 1))
fi
grep -q '"type": *"eval"' "$out/paged/metrics.jsonl" || {
    echo "FAIL: the paged run wrote no eval record"
    zt_failures=$((zt_failures + 1))
}
finish
