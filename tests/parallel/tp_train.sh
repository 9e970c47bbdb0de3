#!/usr/bin/env bash
# Tensor parallelism end to end through zt-run on CPU ranks (Open MPI's mpirun), gradient clipping on
# (the default 1.0, which these steps reach): per-step losses and gradient norms of
# tp2, tp4 (2 KV heads: each replicated on 2 ranks), tp2 with recompute, dp2 x tp2 under ZeRO-1
# and ZeRO-3 and tp2 x pp2, against the 1-rank run on the same global batch (fp32: 1e-5 relative), and their Hugging
# Face exports (assembled from the tp shards) against the 1-rank export (1e-4 relative L2 per tensor).
#   tp_train.sh ZT_RUN ZT_PREP MPIEXEC SOURCE_DIR WORK_DIR
set -u
zt_run=$1 zt_prep=$2 mpiexec=$3 src=$4 work=$5
. "$src/tests/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the exports"
[ -x "$zt_prep" ] || skip "zt-prep is not built"
rm -rf "$work"
mkdir -p "$work"
expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" \
    -o "$work/data" --val-fraction 0.05 --seed 0 --no-progress
# hidden 32 (4 heads of 8, 2 key/value heads), MLP 64, untied head; the tokenizer's vocabulary pads on 4 ranks
common=(--data "$work/data" --set model.hidden_size=32 --set model.intermediate_size=64
        --set model.num_hidden_layers=2 --set model.num_attention_heads=4 --set model.num_key_value_heads=2
        --set model.tie_word_embeddings=false --set data.seq_len=128 --set data.mode=padded --set threads=1
        --set log.every=1000 --set optimizer.params.lr=3e-3 --set seed=7 --set steps=3
        --set checkpoint.final=false)
# 4 sequences per step: 1 data-parallel rank x 2 x 2, or 2 x 1 x 2
one_dp=(--set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=2)
two_dp=(--set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=2)

run() { # run RANKS NAME ARGS...: zt-run on RANKS ranks into WORK/NAME
    local ranks=$1 name=$2
    shift 2
    local cmd=("$zt_run")
    [ "$ranks" -gt 1 ] && cmd=("$mpiexec" -np "$ranks" --oversubscribe --allow-run-as-root "$zt_run")
    expect_ok -- "${cmd[@]}" "${common[@]}" --output-dir "$work/$name" --export "$work/$name/hf" \
        --export-dtype fp32 "$@"
}

losses_match() { # losses_match NAME: its per-step losses against the reference's
    if ! python3 - "$work/reference/metrics.jsonl" "$work/$1/metrics.jsonl" "$1" <<'PY'
import json, sys
def records(path):
    return [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(path)) if r.get("type") == "train"]
want, got, name = records(sys.argv[1]), records(sys.argv[2]), sys.argv[3]
# the loss, and the global gradient norm (over every tensor shard: gradient_clipping clips by it)
bad = len(want) != len(got) or any(g is None or abs(g - w) > 1e-5 * abs(w) for gw, ww in zip(got, want)
                                   for g, w in zip(gw, ww))
print(("FAIL: " if bad else "") + f"{name}: (loss, grad_norm) {got}, one rank {want}")
sys.exit(1 if bad else 0)
PY
    then zt_failures=$((zt_failures + 1)); fi
    python3 "$here/compare_weights.py" "$work/reference/hf" "$work/$1/hf" || zt_failures=$((zt_failures + 1))
}

run 1 reference "${one_dp[@]}" --plugins zero0
run 2 tp2 "${one_dp[@]}" --set parallel_config.model_parallel=2
losses_match tp2
run 4 tp4 "${one_dp[@]}" --set parallel_config.model_parallel=4
losses_match tp4
run 2 tp2_recompute "${one_dp[@]}" --set parallel_config.model_parallel=2 --set recompute=true
losses_match tp2_recompute
for stage in 1 3; do
    run 4 dp2_tp2_zero$stage "${two_dp[@]}" --set parallel_config.model_parallel=2 \
        --set zero_optimization.stage=$stage
    losses_match dp2_tp2_zero$stage
done
# tensor x pipeline: 2 x 2 on 4 ranks (the hidden states between stages are the same on every tp rank)
run 4 tp2_pp2 "${one_dp[@]}" --set parallel_config.model_parallel=2 --set parallel_config.pipeline_stage=2
losses_match tp2_pp2
# what a tensor-parallel run refuses: a message naming the option
expect_fail "model_parallel 2: --export-adapter reads the whole adapter on one rank" -- "$mpiexec" -np 2 \
    --oversubscribe --allow-run-as-root "$zt_run" "${common[@]}" "${one_dp[@]}" --output-dir "$work/refused" \
    --set parallel_config.model_parallel=2 --export-adapter "$work/refused/adapter"
finish
