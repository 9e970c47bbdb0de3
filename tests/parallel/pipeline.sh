#!/usr/bin/env bash
# Pipeline execution on CPU ranks under Open MPI's mpirun against the 1-rank run of the same global
# batch (4 sequences per step): pp2 and pp4 (micro_batch_num 4), dp2 x pp2 (2 micro-batches per rank),
# with zero1 and zero3, and pp2 with recompute. Per-step losses within 1e-5 relative (fp32), and the
# gradient norm too (the stages' sums of squares add up to the whole model's).
#   pipeline.sh ZT_RUN ZT_PREP MPIEXEC SOURCE_DIR WORK_DIR
set -u
zt_run=$1 zt_prep=$2 mpiexec=$3 src=$4 work=$5
. "$src/tests/lib.sh"
rm -rf "$work"
mkdir -p "$work"
data=$work/data
expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$data" \
    --val-fraction 0 --seed 0 --no-progress
mpi() { local n=$1; shift; timeout 120 "$mpiexec" -np "$n" --oversubscribe --allow-run-as-root "$@"; }
common=(--data "$data" --set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_hidden_layers=4
        --set model.num_attention_heads=4 --set model.num_key_value_heads=2 --set model.tie_word_embeddings=false
        --set device=cpu --set threads=1 --set data.seq_len=128 --set data.mode=padded --set train_micro_batch_size_per_gpu=1
        --set log.every=1 --set seed=3 --set steps=3 --set optimizer.params.lr=3e-3 --set checkpoint.final=false
        --set gradient_clipping=1.0)
compare() {
    python3 - "$1" "$2" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
def records(path):
    return [json.loads(l) for l in open(path) if '"train"' in l]
ref, run = records(sys.argv[1] + "/metrics.jsonl"), records(sys.argv[2] + "/metrics.jsonl")
bad = len(ref) != 3 or len(run) != 3
for a, b in zip(ref, run):
    for key in ("loss", "grad_norm"):
        if abs(a[key] - b[key]) > 1e-5 * abs(a[key]):
            print(f"FAIL: {sys.argv[2]} step {b['step']}: {key} {b[key]!r}, the 1-rank run's {a[key]!r}")
            bad = True
if bad:
    print(f"FAIL: {sys.argv[2]}: {len(run)} train records against the reference's {len(ref)}")
sys.exit(1 if bad else 0)
PY
}
expect_ok -- "$zt_run" "${common[@]}" --output-dir "$work/ref" --set gradient_accumulation_steps=4 --plugins zero0
for stage in 1 3; do
    expect_ok -- mpi 2 "$zt_run" "${common[@]}" --output-dir "$work/pp2-zero$stage" --plugins "zero$stage" \
        --set parallel_config.pipeline_stage=2 --set parallel_config.micro_batch_num=4
    compare "$work/ref" "$work/pp2-zero$stage"
    expect_ok -- mpi 4 "$zt_run" "${common[@]}" --output-dir "$work/pp4-zero$stage" --plugins "zero$stage" \
        --set parallel_config.pipeline_stage=4 --set parallel_config.micro_batch_num=4
    compare "$work/ref" "$work/pp4-zero$stage"
    expect_ok -- mpi 4 "$zt_run" "${common[@]}" --output-dir "$work/dp2pp2-zero$stage" --plugins "zero$stage" \
        --set parallel_config.pipeline_stage=2 --set parallel_config.micro_batch_num=2
    compare "$work/ref" "$work/dp2pp2-zero$stage"
done
expect_ok -- mpi 2 "$zt_run" "${common[@]}" --output-dir "$work/pp2-recompute" --plugins zero1 --set recompute=true \
    --set parallel_config.pipeline_stage=2 --set parallel_config.micro_batch_num=4
compare "$work/ref" "$work/pp2-recompute"
# what a pipeline run does not execute is refused on every rank, with the way out
expect_fail "parallel_config.pipeline_stage = 2: the LM head is tied to the embedding" -- mpi 2 "$zt_run" \
    "${common[@]}" --output-dir "$work/tied" --set model.tie_word_embeddings=true --set parallel_config.pipeline_stage=2
finish
