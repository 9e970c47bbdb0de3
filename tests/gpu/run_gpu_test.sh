#!/usr/bin/env bash
# zt-run training on a GPU (device = cuda: llama, flash, adamw and zero0 in bf16), end to end. One
# test per call:
#   run_gpu_test.sh ZT_RUN ZT_PREP CUDA_DEVICES SOURCE_DIR WORK_DIR TEST [ARGS...]
# Every test but no_gpu skips (exit 77, "SKIP: no CUDA device ...") where CUDA_DEVICES finds no GPU;
# no_gpu runs only there. The loss-curve tests train on the bundled example tasks tokenized by
# zt-prep, or on $ZT_GPU_TEST_DATA (the same data prepared elsewhere, for GPU machines without the
# sentencepiece library: scripts/gpu.sh).
set -u
zt_run=$1 zt_prep=$2 cuda_devices=$3 src=$4 work=$5 test=$6
shift 6
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"

# One folder per test; the fixture and odd_vocab tests, which ctest runs in parallel, get one per
# fixture and vocabulary.
out=$work/$test
[ "$test" = fixture ] && out=$work/fixture-$(basename "$2")
[ "$test" = odd_vocab ] && out=$work/odd_vocab-$2
[ "$test" = lora ] && out=$work/lora-$4
gpu=(--set device=cuda --plugins flash)
# Heads of 64 so attention runs on the flash kernels, packed rows so their document masks are used.
model=(--set model.hidden_size=256 --set model.intermediate_size=512 --set model.num_hidden_layers=2
       --set model.num_attention_heads=4 --set model.num_key_value_heads=2)
common=("${model[@]}" --set data.seq_len=128 --set train_micro_batch_size_per_gpu=8 --set threads=8
        --set log.every=1000 --set optimizer.params.lr=3e-3 --set scheduler.params.warmup_num_steps=5)

check() {
    if ! python3 "$here/check_gpu.py" "$@"; then
        zt_failures=$((zt_failures + 1))
    fi
}

need_gpu() {
    local devices
    devices=$("$cuda_devices")
    [ $? -eq 77 ] && skip "${devices#SKIP: }"
    echo "$devices CUDA device(s)"
}

# The example tasks (examples/data) tokenized; sets DATA.
example_data() {
    if [ -n "${ZT_GPU_TEST_DATA:-}" ]; then
        DATA=$ZT_GPU_TEST_DATA
        return
    fi
    DATA=$out/data
    "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$DATA" \
        --val-fraction 0.05 --seed 0 --no-progress >"$out/prep.log" 2>&1 ||
        skip "zt-prep cannot tokenize the example tasks here (no sentencepiece plugin?); set ZT_GPU_TEST_DATA " \
             "to a data set prepared with: zt-prep examples/data/tasks.json -t examples/data/tokenizer.model " \
             "--val-fraction 0.05 --seed 0 ($(tail -n 1 "$out/prep.log"))"
}

# One AdamW step on a torch fixture's batch on the GPU, then --export: loss, gradient norm and weights
# against transformers + torch.optim.AdamW, with bf16 tolerances (check_gpu.py fixture). The fixtures'
# heads of 8 and 12 run on flash's exact fallback kernels.
fixture() {
    local maker=$1 fixture_dir=$2
    need_gpu
    expect_ok -- "$maker" "$fixture_dir" "$out/data"
    expect_ok -- "$zt_run" "${gpu[@]}" --model "$fixture_dir" --data "$out/data" --output-dir "$out/run" \
        --set train_micro_batch_size_per_gpu=2 --set data.seq_len=16 --set data.shuffle=false --set steps=1 \
        --set scheduler.type=constant --set optimizer.params.lr=0.01 --set 'optimizer.params.betas=[0.9,0.95]' \
        --set optimizer.params.eps=1e-8 --set optimizer.params.weight_decay=0.1 --set gradient_clipping=0 \
        --export "$out/run/hf" --export-dtype fp32
    check fixture "$fixture_dir" "$out/run/metrics.jsonl" "$out/run/hf"
}

# 30 steps on the CPU (fp32) and on the GPU (bf16) from the same initial weights and batches: the
# loss curves and the final evaluation agree within bf16 tolerance, the GPU run learns, and its
# device memory is the same after every step (nothing leaks or grows).
loss_curve() {
    need_gpu
    example_data
    local steps=(--data "$DATA" "${common[@]}" --set steps=30 --set eval.every=30 --set eval.batches=4
                 --set checkpoint.final=false)
    expect_ok -- "$zt_run" "${steps[@]}" --set device=cpu --output-dir "$out/cpu"
    expect_ok "training" -- "$zt_run" "${steps[@]}" "${gpu[@]}" --output-dir "$out/gpu"
    check curves "$out/cpu/metrics.jsonl" "$out/gpu/metrics.jsonl"
    check memory "$out/gpu/metrics.jsonl"
}

# Activation checkpointing on the GPU: the same losses as without, with fewer activation bytes.
recompute() {
    need_gpu
    example_data
    local steps=(--data "$DATA" "${common[@]}" --set steps=8 --set checkpoint.final=false "${gpu[@]}")
    expect_ok -- "$zt_run" "${steps[@]}" --output-dir "$out/full"
    expect_ok -- "$zt_run" "${steps[@]}" --set recompute=true --output-dir "$out/recompute"
    check recompute "$out/full/metrics.jsonl" "$out/recompute/metrics.jsonl"
}

# Checkpoints of a GPU run: 4 steps straight == 2 steps, a checkpoint, and 2 resumed steps (the
# shards go through host memory both ways). Not bit for bit: flash attention's dQ is summed with
# atomics, so runs differ in the last bits, which later steps amplify.
resume() {
    need_gpu
    example_data
    local steps=(--data "$DATA" "${common[@]}" "${gpu[@]}" --set scheduler.params.total_num_steps=4
                 --set scheduler.params.warmup_num_steps=1)
    expect_ok -- "$zt_run" "${steps[@]}" --set steps=4 --output-dir "$out/straight"
    expect_ok "checkpoint of step 2 saved" -- "$zt_run" "${steps[@]}" --set steps=2 --output-dir "$out/resumed"
    expect_ok "resumed from" -- "$zt_run" "${steps[@]}" --set steps=4 --output-dir "$out/resumed" --resume latest
    if ! python3 "$src/tests/train/check.py" same-metrics "$out/straight/metrics.jsonl" "$out/resumed/metrics.jsonl" \
        2e-2; then
        zt_failures=$((zt_failures + 1))
    fi
}

# A vocabulary that is not a multiple of 8 on the GPU: odd_vocab DATA_TOOL VOCAB HIDDEN TIED STEPS, for
# 777 and for 32001 (LLaMA's 32000 and a pad token, as Alpaca fine-tunes have). On data whose targets
# are a quarter the last id (vocab_data.c), which only the LM head's tail GEMMs compute on the GPU:
#   - the same steps on the CPU and the GPU follow each other as loss_curve's do, eval included;
#   - the GPU run's checkpoint and HF export hold the true [vocab, hidden] shapes (padding lives only
#     in the LM head's scratch);
#   - the CPU resumes from the GPU checkpoint and follows the straight CPU run from there.
odd_vocab() {
    local data_tool=$1 vocab=$2 hidden=$3 tied=$4 n=$5
    local half=$((n / 2))
    need_gpu
    expect_ok -- "$data_tool" "$out/data" "$vocab" 128 $((n * 8))
    [ "$ZT_RC" -eq 0 ] || return
    # heads of 64 (flash kernels), GQA, MLP twice the hidden size
    local steps=(--data "$out/data" --set model.vocab_size="$vocab" --set model.hidden_size="$hidden"
                 --set model.intermediate_size=$((2 * hidden)) --set model.num_hidden_layers=2
                 --set model.num_attention_heads=$((hidden / 64)) --set model.num_key_value_heads=$((hidden / 128))
                 --set model.tie_word_embeddings="$tied" --set data.seq_len=128 --set train_micro_batch_size_per_gpu=8
                 --set threads=8 --set log.every=1000 --set optimizer.params.lr=3e-3
                 --set scheduler.params.warmup_num_steps=$((n / 6)) --set steps="$n" --set eval.every="$n"
                 --set eval.batches=4 --set checkpoint.final=false)
    expect_ok "vocab $vocab" -- "$zt_run" "${steps[@]}" --set device=cpu --output-dir "$out/cpu"
    [ "$ZT_RC" -eq 0 ] || return
    expect_ok "vocab $vocab" "checkpoint of step $half saved" -- "$zt_run" "${steps[@]}" "${gpu[@]}" \
        --set checkpoint.every="$half" --output-dir "$out/gpu" --export "$out/gpu/hf" --export-dtype fp32
    [ "$ZT_RC" -eq 0 ] || return
    check curves "$out/cpu/metrics.jsonl" "$out/gpu/metrics.jsonl"
    local ckpt
    ckpt=$out/gpu/checkpoints/$(printf 'step-%06d' "$half")
    check shapes "$vocab" "$hidden" "$tied" "$ckpt" "$out/gpu/hf"
    expect_ok "resumed from $ckpt at step $half" -- "$zt_run" "${steps[@]}" --set device=cpu --resume "$ckpt" \
        --output-dir "$out/resumed"
    [ "$ZT_RC" -eq 0 ] || return
    check resumed "$out/cpu/metrics.jsonl" "$out/resumed/metrics.jsonl" "$half"
}

# --export after GPU training: the fp32 export, then the same weights (a resume with nothing left to
# train) in bf16 by default and in fp16, each the fp32 one rounded to nearest even (check_export.py,
# numpy's rounding); the bf16 export is a whole directory with its tokenizer, and trains again on the
# GPU and generates on the CPU.
export_round_trip() {
    need_gpu
    example_data
    local x=$src/tests/export/check_export.py d
    local steps=(--data "$DATA" "${common[@]}" "${gpu[@]}" --set steps=6) # past the warm-up of common
    expect_ok "(float32)" -- "$zt_run" "${steps[@]}" --output-dir "$out/run" --export "$out/fp32" --export-dtype fp32
    [ "$ZT_RC" -eq 0 ] || return
    for d in auto fp16; do
        expect_ok "nothing left to train" "model exported" -- "$zt_run" "${steps[@]}" --output-dir "$out/run" \
            --resume latest --export "$out/$d" --export-dtype "$d"
        python3 "$x" rounded "$out/fp32" "$out/$d" || zt_failures=$((zt_failures + 1))
    done
    python3 "$x" dtype "$out/auto" BF16 && python3 "$x" complete "$out/auto" &&
        python3 "$x" tokenizer "$out/auto" "$src/examples/data/tokenizer.model" 1 2 0 -1 || zt_failures=$((zt_failures + 1))
    expect_ok "model exported" -- "$zt_run" --model "$out/auto" --data "$DATA" "${gpu[@]}" --set data.seq_len=128 \
        --set steps=1 --output-dir "$out/tune" --export "$out/tune/hf"
    python3 "$x" dtype "$out/tune/hf" BF16 || zt_failures=$((zt_failures + 1))
    expect_ok -- "$zt_run" --generate --model "$out/auto" --prompt-ids 1,2,3 --max-new-tokens 4 --print-ids
}

# What a GPU run refuses, and how it says so.
errors() {
    need_gpu
    example_data
    local run=(--data "$DATA" "${model[@]}" --set steps=1 --output-dir "$out/x")
    # device = cuda without --plugins now defaults to flash: default_attention.sh checks it
    expect_fail "device is cpu, but attention plugin 'flash' runs on CUDA GPUs only" -- \
        "$zt_run" "${run[@]}" --set device=cpu --plugins flash
    # (fp16, with flash or naive attention, trains on GPUs: tests/fp16)
    expect_fail "model.intermediate_size is 500, but the bf16 kernels need a multiple of 8" -- \
        "$zt_run" "${run[@]}" "${gpu[@]}" --set model.intermediate_size=500
    # (zero1-3 train on GPUs since they declare ZT_CAP_CUDA: tests/zero/gpu2.sh covers them)
}

# LoRA on the GPU against the same run on the CPU: lora DATA_TOOL BASE_FIXTURE LORA_FIXTURE VARIANT, with
# VARIANT zero0 (bf16), fp16, zero3 (the frozen base sharded), recompute or dropout (lora_dropout 0.3 on
# both devices: the same masks, from the same hash; another mask moves the adapter by 0.6 to 1.3 of its
# update, where the check allows 0.1). Three steps on the torch
# fixture's batch from peft's adapter (nonzero A and B, all seven linears of both layers adapted, r 4),
# with AdamW's eps 1 so that an update is ~lr * g, linear in the gradient (with eps 1e-8 it would be
# lr * sign(g), which a bf16 gradient flips wherever g is near zero): per-step losses and gradient norms,
# the adapter after the steps, and the frozen weights (check_gpu.py lora has the tolerances).
lora() {
    local maker=$1 base=$2 adapter=$3/adapter variant=$4
    need_gpu
    expect_ok -- "$maker" "$base" "$out/data"
    [ "$ZT_RC" -eq 0 ] || return
    local steps=(--model "$base" --adapter "$adapter" --data "$out/data" --set threads=8
                 --set train_micro_batch_size_per_gpu=2 --set data.seq_len=16 --set data.shuffle=false --set steps=3
                 --set scheduler.type=constant --set optimizer.params.lr=0.01 --set optimizer.params.eps=1
                 --set optimizer.params.weight_decay=0 --set gradient_clipping=0 --set lora.r=4
                 --set lora.lora_alpha=8 --set lora.target_modules=all-linear --set checkpoint.final=false
                 --export-dtype fp32)
    # --plugins once per run: the GPU run adds flash attention to the CPU run's plugins.
    local on_gpu=(--plugins llama,lora,flash --set device=cuda) dtype=bf16
    case $variant in
    zero0) ;;
    dropout) steps+=(--set lora.lora_dropout=0.3) ;;
    fp16) on_gpu+=(--set fp16.enabled=true --set bf16.enabled=false --set fp16.loss_scale=1024); dtype=fp16 ;;
    zero3) on_gpu+=(--set zero_optimization.stage=3) ;;
    recompute) on_gpu+=(--set recompute=true) ;;
    *) echo "FAIL: unknown lora variant $variant"; zt_failures=$((zt_failures + 1)); return ;;
    esac
    expect_ok -- "$zt_run" --plugins llama,lora "${steps[@]}" --set device=cpu --output-dir "$out/cpu" --export "$out/cpu/hf" \
        --export-adapter "$out/cpu/adapter"
    expect_ok -- "$zt_run" "${steps[@]}" "${on_gpu[@]}" --output-dir "$out/gpu" --export "$out/gpu/hf" \
        --export-adapter "$out/gpu/adapter"
    [ "$ZT_RC" -eq 0 ] || return
    check lora "$dtype" "$base" "$adapter" "$out/cpu" "$out/gpu"
}

# Without a GPU: device = cuda says why it cannot run, auto falls back to the CPU.
no_gpu() {
    local devices
    devices=$("$cuda_devices")
    [ $? -ne 77 ] && skip "this machine has $devices CUDA device(s); no_gpu checks the messages of machines without"
    mkdir -p "$out"
    local run=(--data "$src/no-such-data" "${model[@]}" --set model.vocab_size=512 --set steps=1
               --output-dir "$out/x")
    expect_fail "device is cuda, but" -- "$zt_run" "${run[@]}" --set device=cuda --plugins flash
    expect_fail "plugin 'flash' runs on CUDA GPUs only, but" -- "$zt_run" "${run[@]}" --plugins flash
    # auto without a GPU: naive on the CPU, and the run gets as far as the (missing) data
    expect_fail "device auto: training on the CPU because" "('naive')" "no-such-data" -- "$zt_run" "${run[@]}"
}

rm -rf "$out" && mkdir -p "$out"
"$test" "$@"
finish
