#!/usr/bin/env bash
# LoRA end to end against peft (tests/reference's llama_gqa_untied_lora). One test per call:
#   run_test.sh ZT_RUN MAKE_FIXTURE_DATA FIXTURES SOURCE_DIR WORK_DIR TEST
set -u
zt_run=$1 maker=$2 fixtures=$3 src=$4 work=$5 test=$6
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"

base=$fixtures/llama_gqa_untied lora=$src/tests/reference/fixtures/llama_gqa_untied_lora
out=$work/$test
rm -rf "$out"
mkdir -p "$out"
"$maker" "$base" "$out/data" >/dev/null || { echo "FAIL: make_fixture_data"; exit 1; }
# The fixture's optimizer and batch (make_fixtures.py: ADAMW, BATCH x SEQ) and its adapter's settings.
training=(--data "$out/data" --set threads=2
     --set train_micro_batch_size_per_gpu=2 --set data.seq_len=16 --set data.shuffle=false --set steps=3
     --set scheduler.type=constant --set optimizer.params.lr=0.01 --set 'optimizer.params.betas=[0.9,0.95]'
     --set optimizer.params.eps=1e-8 --set optimizer.params.weight_decay=0.1 --set gradient_clipping=0)
lora_sets=(--set lora.r=4 --set lora.lora_alpha=8 --set lora.target_modules=all-linear)
run=("$zt_run" --plugins llama,lora --model "$base" "${training[@]}" "${lora_sets[@]}")

check() {
    python3 "$here/check_lora.py" "$@"
    local rc=$?
    [ "$rc" -eq 77 ] && skip "the peft check was skipped (ZT_SKIP_TRANSFORMERS=1)"
    [ "$rc" -eq 0 ] || zt_failures=$((zt_failures + 1))
}

case $test in
# Three AdamW steps from peft's adapter against torch + peft; the exported adapter loaded by peft.
peft)
    expect_ok "adapter exported as peft writes it" -- "${run[@]}" --adapter "$lora/adapter" --output-dir "$out/run" \
        --export "$out/run/hf" --export-adapter "$out/run/adapter"
    check fixture "$lora" "$base" "$out/run/metrics.jsonl" "$out/run/hf" "$out/run/adapter"
    check peft "$base" "$out/run/adapter" "$out/run/hf"
    ;;
# Every LoRA tensor's first-step gradient against peft's: one AdamW step with lr = eps = 1 and no weight
# decay, whose update the check inverts (check_lora.py gradients).
gradients)
    expect_ok -- "${run[@]}" --adapter "$lora/adapter" --output-dir "$out/run" --set steps=1 \
        --set optimizer.params.lr=1 --set optimizer.params.eps=1 --set optimizer.params.weight_decay=0 \
        --export-adapter "$out/run/adapter"
    check gradients "$lora" "$out/run/adapter" 1 1
    ;;
# The same run under every ZeRO stage, with offload, with recompute, on 2 CPU ranks: peft's losses.
stages)
    expect_ok -- "${run[@]}" --adapter "$lora/adapter" --output-dir "$out/zero0"
    # each variant: "+"-separated --set values
    for variant in "zero_optimization.stage=1" "zero_optimization.stage=2" "zero_optimization.stage=3" \
                   "zero_optimization.stage=2+zero_optimization.offload_optimizer.device=cpu" \
                   "zero_optimization.stage=3+zero_optimization.offload_optimizer.device=cpu" "recompute=true"; do
        sets=() v=()
        IFS=+ read -ra v <<<"$variant"
        for s in "${v[@]}"; do sets+=(--set "$s"); done
        expect_ok -- "${run[@]}" --adapter "$lora/adapter" --output-dir "$out/$variant" "${sets[@]}"
        check same-losses "$out/$variant/metrics.jsonl" "$out/zero0/metrics.jsonl" 1e-5
    done
    # stopped after step 2 and resumed from its checkpoint (the adapter comes from there)
    expect_ok -- "${run[@]}" --adapter "$lora/adapter" --output-dir "$out/resume" --set steps=2
    expect_ok "resumed from" -- "${run[@]}" --output-dir "$out/resume" --resume latest
    check same-losses "$out/resume/metrics.jsonl" "$out/zero0/metrics.jsonl" 1e-5
    if command -v mpirun >/dev/null; then
        # 2 ranks split the global batch of 2 sequences: 1 each
        expect_ok -- "${run[@]}" --adapter "$lora/adapter" --output-dir "$out/ranks2" --nproc 2 \
            --set zero_optimization.stage=3 --set train_micro_batch_size_per_gpu=1
        check same-losses "$out/ranks2/metrics.jsonl" "$out/zero0/metrics.jsonl" 1e-5
    else
        echo "note: mpirun is not installed: the 2-rank run is left out"
    fi
    ;;
# checkpoint.only_trainable: a LoRA run and a run with frozen layers alone, each stopped after step 2
# and resumed from its trainable-only checkpoint, give the uninterrupted run's losses bit for bit; the
# checkpoint holds the trained tensors only and the base's hash; another base and no base are refused.
trainable_only)
    other=$out/other-base
    mkdir -p "$other" && cp "$base/config.json" "$other/" || exit 1
    # the same model with one frozen value changed (the first of the embedding)
    python3 - "$base/model.safetensors" "$other/model.safetensors" <<'PY' || exit 1
import json, struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
(n,) = struct.unpack("<Q", data[:8])
at = 8 + n + json.loads(data[8:8 + n])["model.embed_tokens.weight"]["data_offsets"][0]
data[at:at + 4] = struct.pack("<f", struct.unpack("<f", data[at:at + 4])[0] + 0.5)
open(sys.argv[2], "wb").write(data)
PY
    for kind in lora frozen; do
        # the model's arguments without --model, which each command adds
        if [ $kind = lora ]; then args=(--plugins llama,lora "${training[@]}" "${lora_sets[@]}")
        else args=("${training[@]}" --set 'trainable_params=["layers.1.self_attn.q_proj", "model.norm"]'); fi
        resume=("$zt_run" --model "$base" "${args[@]}") bad=("$zt_run" --model "$other" "${args[@]}")
        cmd=("${resume[@]}")
        [ $kind = lora ] && cmd+=(--adapter "$lora/adapter")
        expect_ok -- "${cmd[@]}" --output-dir "$out/$kind-full"
        expect_ok -- "${cmd[@]}" --output-dir "$out/$kind-only" --set steps=2 --set checkpoint.only_trainable=true
        check trainable-only "$out/$kind-only/checkpoints/step-000002" "$out/$kind-full/checkpoints/step-000003" "$base"
        expect_ok "trainable-only checkpoint: the frozen weights from" -- "${resume[@]}" --output-dir "$out/$kind-only" \
            --resume latest --set checkpoint.only_trainable=true
        check same-losses "$out/$kind-only/metrics.jsonl" "$out/$kind-full/metrics.jsonl" 0
        expect_fail "that is another base" "the frozen weights of --model $other hash to" "--model $base" -- \
            "${bad[@]}" --output-dir "$out/$kind-only" --resume latest
    done
    if command -v mpirun >/dev/null; then
        # 2 ranks under ZeRO-3 (the frozen weights sharded), saving and resuming: the same losses
        ranks2=("${run[@]}" --nproc 2 --set zero_optimization.stage=3 --set train_micro_batch_size_per_gpu=1
                --set checkpoint.only_trainable=true --output-dir "$out/ranks2")
        expect_ok -- "${ranks2[@]}" --adapter "$lora/adapter" --set steps=2
        expect_ok "trainable-only checkpoint: the frozen weights from" -- "${ranks2[@]}" --resume latest
        check same-losses "$out/ranks2/metrics.jsonl" "$out/lora-full/metrics.jsonl" 1e-5
    else
        echo "note: mpirun is not installed: the 2-rank run is left out"
    fi
    expect_fail "holds only the trainable parameters" "Resume with --model BASE" -- "$zt_run" --plugins llama,lora \
        --data "$out/data" --set model.preset=tiny --set model.vocab_size=128 --set steps=3 \
        --output-dir "$out/lora-only" --resume latest
    expect_fail "checkpoint.only_trainable is true but the run has no --model" -- "$zt_run" --data "$out/data" \
        --set model.preset=tiny --set model.vocab_size=128 --set steps=1 --set checkpoint.only_trainable=true \
        --output-dir "$out/no-base"
    ;;
# --generate --model BASE --adapter DIR: the tokens of the merged export of the same adapter (zt's
# merge, which lora.peft checks against peft's merge_and_unload), and not the base's alone.
generate)
    expect_ok -- "${run[@]}" --adapter "$lora/adapter" --output-dir "$out/run" --set steps=1 \
        --export "$out/run/hf" --export-adapter "$out/run/adapter"
    gen=("$zt_run" --generate --prompt-ids 1,5,9,20 --print-ids --max-new-tokens 24)
    on_base=("${gen[@]}" --model "$base" --plugins llama,lora "${lora_sets[@]}")
    merged=$("${gen[@]}" --model "$out/run/hf" 2>"$out/merged.log") || { cat "$out/merged.log"; exit 1; }
    adapted=$("${on_base[@]}" --adapter "$out/run/adapter" 2>"$out/adapted.log") || { cat "$out/adapted.log"; exit 1; }
    alone=$("${gen[@]}" --model "$base" 2>/dev/null)
    echo "merged:  $merged"; echo "adapter: $adapted"; echo "base:    $alone"
    if [ -z "$merged" ] || [ "$merged" != "$adapted" ]; then
        echo "FAIL: the base with the adapter generates other tokens than the merged model"
        zt_failures=$((zt_failures + 1))
    fi
    if [ "$merged" = "$alone" ]; then
        echo "FAIL: the adapted model generates the base's tokens: the test shows nothing"
        zt_failures=$((zt_failures + 1))
    fi
    expect_fail "no adapter plugin is loaded" -- "${gen[@]}" --model "$base" --adapter "$out/run/adapter"
    expect_fail "without the adapter's weights" "--adapter DIR" -- "${on_base[@]}"
    expect_fail "adapter_config.json has r 4" "lora.r = 8" -- "${on_base[@]}" --set lora.r=8 --adapter "$out/run/adapter"
    expect_fail "holds its adapter already" -- "${gen[@]}" --resume "$out/run/checkpoints" --adapter "$out/run/adapter"
    ;;
# lora.lora_dropout (peft's: on the adapter's input, in training only). 0 is the path without dropout;
# above 0 every training loss changes and, of weights that do not move (lr 1e-30), no evaluation loss;
# the masks are the same under recompute, ZeRO-3 and across a resume (from the seed and the batch).
dropout)
    # the training shard again as the held-out split, so evaluation sees the training batch
    python3 - "$out/data" <<'PY' || exit 1
import json, struct, sys
d = sys.argv[1]
def fnv(b, h=0xcbf29ce484222325):
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
b = bytearray(open(f"{d}/train-00000.ztshard", "rb").read())
struct.pack_into("<I", b, 20, struct.unpack_from("<I", b, 20)[0] | 1)   # flags: ZT_SHARD_FLAG_VALIDATION
struct.pack_into("<Q", b, 120, fnv(bytes(b[:120])))                   # header_checksum
open(f"{d}/val-00000.ztshard", "wb").write(b)
m = json.load(open(f"{d}/manifest.json"))
m["shards"].append(dict(m["shards"][0], split="val", file="val-00000.ztshard", checksum="%016x" % fnv(bytes(b))))
json.dump(m, open(f"{d}/manifest.json", "w"))
PY
    d=("${run[@]}" --adapter "$lora/adapter")
    expect_ok -- "${d[@]}" --output-dir "$out/default"
    expect_ok -- "${d[@]}" --output-dir "$out/p0" --set lora.lora_dropout=0
    check same-losses "$out/p0/metrics.jsonl" "$out/default/metrics.jsonl" 0
    still=(--set optimizer.params.lr=1e-30 --set eval.every=1 --set eval.batches=1 --set checkpoint.final=false)
    expect_ok -- "${d[@]}" --output-dir "$out/still0" "${still[@]}"
    expect_ok -- "${d[@]}" --output-dir "$out/still3" "${still[@]}" --set lora.lora_dropout=0.3
    check dropout "$out/still0/metrics.jsonl" "$out/still3/metrics.jsonl"
    expect_ok -- "${d[@]}" --output-dir "$out/p3" --set lora.lora_dropout=0.3
    for variant in again "recompute=true" "zero_optimization.stage=3"; do
        sets=()
        [ $variant != again ] && sets=(--set "$variant")
        expect_ok -- "${d[@]}" --output-dir "$out/p3-$variant" --set lora.lora_dropout=0.3 "${sets[@]}"
        check same-losses "$out/p3-$variant/metrics.jsonl" "$out/p3/metrics.jsonl" 0
    done
    expect_ok -- "${d[@]}" --output-dir "$out/p3-resume" --set lora.lora_dropout=0.3 --set steps=2
    expect_ok "resumed from" -- "${run[@]}" --output-dir "$out/p3-resume" --set lora.lora_dropout=0.3 --resume latest
    check same-losses "$out/p3-resume/metrics.jsonl" "$out/p3/metrics.jsonl" 0
    ;;
# Bad inputs: clear messages, non-zero exits.
errors)
    expect_fail "no adapter plugin" -- "$zt_run" --model "$base" --data "$out/data" --adapter "$lora/adapter" \
        --set steps=1 --output-dir "$out/e1"
    expect_fail "no adapter plugin" "--export" -- "$zt_run" --model "$base" --data "$out/data" \
        --export-adapter "$out/e2/a" --set steps=1 --output-dir "$out/e2"
    expect_fail "lora.target_modules" "\"qproj\" names no linear layer" -- "${run[@]}" --set lora.target_modules=qproj \
        --output-dir "$out/e3"
    expect_fail "adapter_config.json has r 4" "lora.r = 8" -- "${run[@]}" --set lora.r=8 --adapter "$lora/adapter" \
        --output-dir "$out/e4"
    expect_fail "is not a parameter of this run's adapter" "lora.target_modules" -- "${run[@]}" --set 'lora.target_modules=["q_proj"]' \
        --adapter "$lora/adapter" --output-dir "$out/e5"
    expect_fail "not the embedding or the LM head" -- "${run[@]}" --set 'lora.target_modules=["lm_head"]' \
        --output-dir "$out/e6"
    expect_fail "add --model BASE" -- "$zt_run" --plugins llama,lora --data "$out/data" --adapter "$lora/adapter" \
        --set model.preset=tiny --set model.vocab_size=128 --set steps=1 --output-dir "$out/e7"
    ;;
*) echo "unknown test $test"; exit 2 ;;
esac
finish
