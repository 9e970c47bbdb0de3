#!/usr/bin/env bash
# zt-run --export end to end (docs/export.md). One test per call:
#   export.sh ZT_RUN ZT_PREP SOURCE_DIR SHARED_DATA WORK_DIR TEST
# data runs first (ctest fixture export_data): the bundled example tasks tokenized by zt-prep. The
# references: transformers (AutoTokenizer, AutoModelForCausalLM, generate), numpy's rounding, Python's
# sentencepiece and the safetensors bytes as check_export.py reads them on its own.
set -u
zt_run=$1 zt_prep=$2 src=$3 shared=$4 work=$5 test=$6
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the exports"

data=$work/data
out=$work/$test
# A small LLaMA from its own initialization: a few seconds per run.
shape=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_hidden_layers=2
       --set model.num_attention_heads=4 --set model.num_key_value_heads=2 --set data.seq_len=64
       --set train_micro_batch_size_per_gpu=2 --set threads=2 --set steps=2 --set log.every=1000)
small=(--data "$data" "${shape[@]}")
# check_export.py exits 77 only for transformers' checks under ZT_SKIP_TRANSFORMERS=1 without transformers
check() {
    python3 "$here/check_export.py" "$@"
    case $? in
        0) ;;
        77) skip "torch or transformers is missing and ZT_SKIP_TRANSFORMERS=1" ;;
        *) zt_failures=$((zt_failures + 1)) ;;
    esac
}
fail() { echo "FAIL: $*"; zt_failures=$((zt_failures + 1)); }
# The output of the last expect_ok / expect_fail must not contain this.
not_in_output() { ! grep -qF -- "$1" <<<"$ZT_OUT" || fail "'$1' in the output: $ZT_OUT"; }
# zt-run's greedy tokens after --raw --prompt TEXT, from the export DIR alone (its own tokenizer).
zt_greedy() { "$zt_run" --generate --model "$1" --raw --prompt "$2" --max-new-tokens "$3" --print-ids --set threads=2; }

data() {
    [ -x "$zt_prep" ] || skip "zt-prep is not built"
    rm -rf "$data" && mkdir -p "$work"
    expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" \
        -o "$data" --val-fraction 0 --seed 0 --no-progress
}

# transformers loads what --export writes and generates zt's greedy tokens: the README's model
# trained from model.preset=tiny (bf16 by default), in one file and in shards.
transformers() {
    local prompt checks=()
    expect_ok "model exported in Hugging Face format to $out/tuned (bfloat16)" -- "$zt_run" --data "$data" \
        --set model.preset=tiny --set steps=2 --set data.seq_len=64 --set train_micro_batch_size_per_gpu=1 \
        --set threads=2 --output-dir "$out/run" --export "$out/tuned"
    for prompt in "Name the capital of France." "Give three tips for staying healthy."; do
        checks+=("$out/tuned" "$prompt" "$(zt_greedy "$out/tuned" "$prompt" 12)")
    done
    expect_ok -- "$zt_run" --data "$data" --set model.preset=tiny --set steps=2 --set data.seq_len=64 \
        --set train_micro_batch_size_per_gpu=1 --set threads=2 --output-dir "$out/run2" --export "$out/sharded" \
        --export-shard-size 2MB
    check shards "$out/sharded" 2000000
    checks+=("$out/sharded" "Name the capital of France." "$(zt_greedy "$out/sharded" "Name the capital of France." 12)")
    check transformers 12 "${checks[@]}"
}

# The same for a fine-tuned model: the real TinyStories 260K in F32 (shared data), whose directory has
# no tokenizer, so the export ships the data set's; the export keeps the source's F32.
transformers_finetune() {
    local hf=$shared/weights/stories260K_hf prompt="Once upon a time"
    [ -f "$hf/model.safetensors" ] || skip "$hf is not there (../shared/data)"
    expect_ok "model exported in Hugging Face format to $out/tuned (float32)" -- "$zt_run" --data "$data" \
        --model "$hf" --set steps=2 --set data.seq_len=64 --set train_micro_batch_size_per_gpu=2 --set threads=2 \
        --output-dir "$out/run" --export "$out/tuned"
    check dtype "$out/tuned" F32
    check tokenizer "$out/tuned" "$src/examples/data/tokenizer.model" 1 2 0 -1
    check transformers 16 "$out/tuned" "$prompt" "$(zt_greedy "$out/tuned" "$prompt" 16)"
}

# The dtype: bf16 from a model's own initialization, the source's when fine-tuning, --export-dtype
# above both; bf16 and fp16 are the fp32 weights rounded to nearest even; every such export reads
# back (zt-run --model, --generate).
dtype() {
    local d
    for d in fp32 auto fp16; do
        expect_ok -- "$zt_run" "${small[@]}" --output-dir "$out/$d" --export "$out/$d/hf" --export-dtype "$d"
    done
    check dtype "$out/fp32/hf" F32
    check dtype "$out/auto/hf" BF16
    check dtype "$out/fp16/hf" F16
    check rounded "$out/fp32/hf" "$out/auto/hf"
    check rounded "$out/fp32/hf" "$out/fp16/hf"
    for d in fp32:F32 auto:BF16 fp16:F16; do
        expect_ok -- "$zt_run" --model "$out/${d%:*}/hf" --data "$data" --set data.seq_len=64 --set threads=2 \
            --set steps=1 --output-dir "$out/tune-${d%:*}" --export "$out/tune-${d%:*}/hf"
        check dtype "$out/tune-${d%:*}/hf" "${d#*:}"
        expect_ok -- "$zt_run" --generate --model "$out/${d%:*}/hf" --prompt-ids 1,2,3 --max-new-tokens 3 --print-ids
    done
    expect_ok "float32 weights (--export-dtype)" -- "$zt_run" --model "$out/auto/hf" --data "$data" \
        --set data.seq_len=64 --set threads=2 --set steps=1 --output-dir "$out/tune-up" --export "$out/tune-up/hf" \
        --export-dtype fp32
    check dtype "$out/tune-up/hf" F32
}

# The tokenizer files and generation_config.json: from the data set's tokenizer, or copied from the
# --model directory when it has them.
tokenizer() {
    expect_ok -- "$zt_run" "${small[@]}" --output-dir "$out/a" --export "$out/a/hf"
    check tokenizer "$out/a/hf" "$src/examples/data/tokenizer.model" 1 2 0 -1
    # a model directory with tokenizer files of its own: copied byte for byte, generation config too
    mkdir -p "$out/model" && cp "$out/a/hf"/{config.json,model.safetensors,tokenizer.model} "$out/model/"
    printf '{"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "x_zt_test": 1}\n' \
        >"$out/model/tokenizer_config.json"
    printf '{"bos_token_id": 1, "eos_token_id": 2, "max_new_tokens": 7}\n' >"$out/model/generation_config.json"
    expect_ok -- "$zt_run" --model "$out/model" --data "$data" --set data.seq_len=64 --set threads=2 --set steps=1 \
        --output-dir "$out/b" --export "$out/b/hf"
    local f
    for f in tokenizer.model tokenizer_config.json generation_config.json; do
        cmp -s "$out/model/$f" "$out/b/hf/$f" || fail "$f was not copied from the --model directory"
    done
    [ ! -e "$out/b/hf/special_tokens_map.json" ] || fail "special_tokens_map.json appeared, the --model has none"
}

# Shards as transformers writes them: the index names every tensor's shard, no shard passes the
# limit unless one tensor does, and no model.safetensors beside them.
shards() {
    expect_ok -- "$zt_run" "${small[@]}" --output-dir "$out/run" --export "$out/hf" --export-shard-size 20KiB
    check shards "$out/hf" 20480
    check complete "$out/hf"
    # the same directory again without shards: the index and the shards go
    expect_ok -- "$zt_run" "${small[@]}" --output-dir "$out/run" --export "$out/hf"
    [ -f "$out/hf/model.safetensors" ] && [ ! -e "$out/hf/model.safetensors.index.json" ] &&
        [ -z "$(find "$out/hf" -name 'model-*')" ] || fail "the unsharded export kept shards: $(ls "$out/hf")"
}

# A killed export never leaves a directory that looks like a model: killed with everything staged,
# the previous export is untouched; the next export removes the leftover and replaces it.
atomic() {
    expect_ok -- "$zt_run" "${small[@]}" --output-dir "$out/first" --export "$out/hf"
    cp -r "$out/hf" "$out/hf.before"
    ZT_TEST_EXPORT_STALL=1 "$zt_run" "${small[@]}" --set seed=7 --output-dir "$out/second" --export "$out/hf" \
        >"$out/second.log" 2>&1 &
    local pid=$! i
    for i in $(seq 600); do
        grep -q "test hook ZT_TEST_EXPORT_STALL" "$out/second.log" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    grep -q "test hook ZT_TEST_EXPORT_STALL" "$out/second.log" || { fail "the run did not stall:"; cat "$out/second.log"; }
    check same-files "$out/hf.before" "$out/hf"
    local left
    left=$(find "$out" -maxdepth 1 -name '.hf.zt-export-*' | head -1)
    [ -n "$left" ] || fail "no staging directory left by the killed export"
    expect_ok "left by an export (process $pid) that did not finish" "model exported" -- \
        "$zt_run" "${small[@]}" --set seed=7 --output-dir "$out/third" --export "$out/hf"
    [ -z "$left" ] || [ ! -e "$left" ] || fail "$left was not removed"
    check complete "$out/hf"
    ! python3 "$here/check_export.py" same-files "$out/hf.before" "$out/hf" >/dev/null ||
        fail "the third run's export did not replace the first"
    # killed at a random point of a first export: no directory, or a whole one
    for i in 1 2 3; do
        rm -rf "$out/k$i"
        "$zt_run" "${small[@]}" --output-dir "$out/k$i.run" --export "$out/k$i" >/dev/null 2>&1 &
        pid=$!
        until compgen -G "$out/.k$i.zt-export-*" >/dev/null || ! kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
        sleep "0.0$i"
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        [ ! -e "$out/k$i" ] || check complete "$out/k$i"
    done
}

# What --export refuses, before the first step: a directory it did not write, a file, an export with
# files added, the run's own output directory, bad option values, a tokenizer that is gone or changed,
# and fp16 weights beyond its range (after training, with nothing left behind).
errors() {
    mkdir -p "$out/mine" && echo notes >"$out/mine/notes.txt"
    expect_fail "--export $out/mine is a directory zt's export did not write" "'notes.txt'" -- \
        "$zt_run" "${small[@]}" --output-dir "$out/r" --export "$out/mine"
    not_in_output "step 1/"
    [ -f "$out/mine/notes.txt" ] || fail "$out/mine/notes.txt is gone"
    echo x >"$out/file"
    expect_fail "--export $out/file exists and is not a directory" -- "$zt_run" "${small[@]}" --output-dir "$out/r" \
        --export "$out/file"
    expect_ok -- "$zt_run" "${small[@]}" --output-dir "$out/r" --export "$out/hf"
    echo mine >"$out/hf/README.md"
    expect_fail "is an earlier zt export, but it also holds files that export did not write ('README.md')" -- \
        "$zt_run" "${small[@]}" --output-dir "$out/r" --export "$out/hf"
    expect_fail "is a directory zt's export did not write" "config.resolved.json" -- \
        "$zt_run" "${small[@]}" --output-dir "$out/same" --export "$out/same"
    ln -s "$out/r" "$out/link"
    expect_fail "is a symbolic link" -- "$zt_run" "${small[@]}" --output-dir "$out/r" --export "$out/link"
    expect_fail "--export-dtype 'fp8' is not an export dtype: use fp32, bf16, fp16, or auto" -- \
        "$zt_run" "${small[@]}" --export "$out/x" --export-dtype fp8
    [ "$ZT_RC" -eq 2 ] || fail "a bad --export-dtype exits $ZT_RC, not 2 (usage)"
    expect_fail "--export-shard-size '5XB' is not a size" -- "$zt_run" "${small[@]}" --export "$out/x" \
        --export-shard-size 5XB
    expect_fail "--export-shard-size sets how --export writes the model; add --export DIR" -- \
        "$zt_run" "${small[@]}" --export-shard-size 5GB
    # the data set's tokenizer gone, or another file in its place
    mkdir -p "$out/tok" && cp "$src/examples/data/tokenizer.model" "$out/tok/t.model"
    "$zt_prep" "$src/examples/data/heldout.json" -t "$out/tok/t.model" -o "$out/tok/data" --val-fraction 0 \
        --no-progress >/dev/null 2>&1 || fail "zt-prep $out/tok/data"
    rm "$out/tok/t.model"
    expect_fail "cannot open '$out/tok/t.model'" "tokenizer.path of $out/tok/data/manifest.json" "put the file back" -- \
        "$zt_run" "${shape[@]}" --data "$out/tok/data" --output-dir "$out/r" --export "$out/x"
    not_in_output "step 1/"
    head -c 4000 "$src/examples/data/tokenizer.model" >"$out/tok/t.model"
    expect_fail "$out/tok/t.model is not the tokenizer the data set was prepared with" -- \
        "$zt_run" "${shape[@]}" --data "$out/tok/data" --output-dir "$out/r" --export "$out/x"
    # fp16: a weight of 1e5 cannot be stored
    python3 - "$out/hf" "$out/big" <<'EOF' || fail "making $out/big"
import json, os, shutil, struct, sys
import numpy as np
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
for f in ["config.json", "model.safetensors"]:
    shutil.copy(os.path.join(src, f), dst)
data = bytearray(open(os.path.join(dst, "model.safetensors"), "rb").read())
n = struct.unpack("<Q", data[:8])[0]
info = json.loads(data[8:8 + n])["model.norm.weight"]
assert info["dtype"] == "BF16"
at = 8 + n + info["data_offsets"][0]
data[at:at + 2] = (np.array([1e5], dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
open(os.path.join(dst, "model.safetensors"), "wb").write(data)
EOF
    expect_fail "--export-dtype fp16: tensor 'model.norm.weight' holds" "beyond float16's range" -- \
        "$zt_run" --model "$out/big" --data "$data" --set data.seq_len=64 --set threads=2 --set steps=1 \
        --set optimizer.params.lr=1e-6 --output-dir "$out/big.run" --export "$out/big16" --export-dtype fp16
    [ ! -e "$out/big16" ] || fail "a failed export left $out/big16"
    [ -z "$(find "$out" -maxdepth 1 -name '.big16.zt-export-*')" ] || fail "a failed export left its staging directory"
}

case $test in
    data) ;;
    *) [ -f "$data/manifest.json" ] || skip "no prepared data in $data (export.data prepares it)"
       rm -rf "$out" && mkdir -p "$out" ;;
esac
"$test"
finish
