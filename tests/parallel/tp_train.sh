#!/usr/bin/env bash
# Tensor parallelism end to end through zt-run on CPU ranks (Open MPI's mpirun), gradient clipping on
# (the default 1.0, which these steps reach): per-step losses and gradient norms of
# tp2, tp4 (2 KV heads: each replicated on 2 ranks), tp2 with recompute, dp2 x tp2 under ZeRO-1
# and ZeRO-3 and tp2 x pp2, against the 1-rank run on the same global batch (fp32: 1e-5 relative), and their Hugging
# Face exports (assembled from the tp shards) against the 1-rank export (1e-4 relative L2 per tensor).
# Sequence parallelism (use_seq_parallel) the same way: tp2, tp4, tp2 with recompute, dp2 x tp2
# under ZeRO-3 and tp2 x pp2, and the peak of its activations pool against tp2's less what the norms' and the
# residual's rows on 1 / tp of the tokens save (counted from the shapes); a seq_len that does not
# divide by model_parallel refused.
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

losses_match() { # losses_match NAME [REFERENCE]: its per-step losses against the reference's
    local ref=${2:-reference}
    if ! python3 - "$work/$ref/metrics.jsonl" "$work/$1/metrics.jsonl" "$1" <<'PY'
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
    python3 "$here/compare_weights.py" "$work/$ref/hf" "$work/$1/hf" || zt_failures=$((zt_failures + 1))
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
# sequence parallelism: the same losses, gradient norms and exports
sp=(--set parallel_config.use_seq_parallel=true)
run 2 tp2_sp "${one_dp[@]}" --set parallel_config.model_parallel=2 "${sp[@]}"
losses_match tp2_sp
run 4 tp4_sp "${one_dp[@]}" --set parallel_config.model_parallel=4 "${sp[@]}"
losses_match tp4_sp
run 2 tp2_sp_recompute "${one_dp[@]}" --set parallel_config.model_parallel=2 --set recompute=true "${sp[@]}"
losses_match tp2_sp_recompute
run 4 dp2_tp2_zero3_sp "${two_dp[@]}" --set parallel_config.model_parallel=2 --set zero_optimization.stage=3 \
    "${sp[@]}"
losses_match dp2_tp2_zero3_sp
run 4 tp2_pp2_sp "${one_dp[@]}" --set parallel_config.model_parallel=2 --set parallel_config.pipeline_stage=2 \
    "${sp[@]}"
losses_match tp2_pp2_sp
# its activations: the records of one micro-batch (2 x 128 tokens) are held at the peak; each of the 2
# layers keeps 3 arrays [N, 32] and 2 [N] on N / 2 rows instead of N, the head 1 and 1 (the plugin
# carves each array to a multiple of 16 floats)
if ! python3 - "$work/tp2/metrics.jsonl" "$work/tp2_sp/metrics.jsonl" <<'PY'
import json, sys
def peak(path):
    return max(r["mem_host"]["activations"]["peak"] for r in map(json.loads, open(path)) if r.get("type") == "train")
carved = lambda floats: (floats + 15) // 16 * 16 * 4
n, h = 2 * 128, 32
rows, rstd = carved(n * h) - carved(n // 2 * h), carved(n) - carved(n // 2)
want = 2 * (3 * rows + 2 * rstd) + rows + rstd
plain, sp = peak(sys.argv[1]), peak(sys.argv[2])
bad = plain - sp != want
print(("FAIL: " if bad else "") + f"activations pool peak: tp2 {plain} bytes, with sequence parallelism {sp} "
      f"(expected {want} less)")
sys.exit(1 if bad else 0)
PY
then zt_failures=$((zt_failures + 1)); fi
expect_fail "does not divide by 2: make data.seq_len a multiple of 2" -- "$mpiexec" -np 2 --oversubscribe \
    --allow-run-as-root "$zt_run" "${common[@]}" "${one_dp[@]}" --output-dir "$work/sp_odd" \
    --set parallel_config.model_parallel=2 "${sp[@]}" --set data.seq_len=127 --set train_micro_batch_size_per_gpu=1
# LoRA under tensor parallelism (A of q/k/v/gate/up replicated, B split by rows; A of o/down split by
# columns, B replicated) against the 1-rank LoRA run, with dropout (0.1), and the exports merged (W + s B A)
lora=(--set lora.r=4 --set lora.lora_alpha=8 --set lora.target_modules=all-linear
      --set lora.lora_dropout=0.1 --plugins llama,lora)
run 1 lora_reference "${one_dp[@]}" "${lora[@]:0:8}" --plugins llama,lora,zero0
run 2 lora_tp2 "${one_dp[@]}" "${lora[@]}" --set parallel_config.model_parallel=2
losses_match lora_tp2 lora_reference
run 2 lora_tp2_sp "${one_dp[@]}" "${lora[@]}" --set parallel_config.model_parallel=2 "${sp[@]}"
losses_match lora_tp2_sp lora_reference
# dropout draws its masks from each micro-batch's tokens, so data parallelism (other micro-batches) is
# compared without it
run 1 lora_reference_p0 "${one_dp[@]}" "${lora[@]:0:6}" --plugins llama,lora,zero0
run 4 lora_dp2_tp2_zero3 "${two_dp[@]}" "${lora[@]:0:6}" --plugins llama,lora --set parallel_config.model_parallel=2 \
    --set zero_optimization.stage=3
losses_match lora_dp2_tp2_zero3 lora_reference_p0
# tp4 replicates the 2 KV heads: LoRA on k_proj / v_proj of a replicated head is refused
expect_fail "leave k_proj and v_proj out of lora.target_modules" -- "$mpiexec" -np 4 --oversubscribe \
    --allow-run-as-root "$zt_run" "${common[@]}" "${one_dp[@]}" "${lora[@]}" --output-dir "$work/lora_tp4" \
    --set parallel_config.model_parallel=4
# what a tensor-parallel run refuses: a message naming the option
expect_fail "model_parallel 2: --export-adapter reads the whole adapter on one rank" -- "$mpiexec" -np 2 \
    --oversubscribe --allow-run-as-root "$zt_run" "${common[@]}" "${one_dp[@]}" --output-dir "$work/refused" \
    --set parallel_config.model_parallel=2 --export-adapter "$work/refused/adapter"
finish
