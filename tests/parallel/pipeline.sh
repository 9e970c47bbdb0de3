#!/usr/bin/env bash
# Pipeline execution on CPU ranks under Open MPI's mpirun against the 1-rank run of the same global
# batch (4 sequences per step): pp2 and pp4 (micro_batch_num 4), dp2 x pp2 (2 micro-batches per rank),
# with zero1 and zero3, and pp2 with recompute. Per-step losses and gradient norms within 1e-5
# relative (fp32; the stages' sums of squares add up to the whole model's norm), and the final weights,
# exported by the first stage after every stage shared its units', tensor by tensor. For pp2 and
# dp2 x pp2: every rank's memory by pool within 10% of the dry run's estimate for its stage
# (stage_memory.py), so a rank that allocated another stage's units, or a buffer per micro-batch, fails.
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
# tests/zero/compare.py: the same train records (loss, grad_norm, lr, tokens within 1e-5) and the same
# exported tensors (relative L2 within 1e-5, elements within 1e-4), read with numpy, not zt
compare() {
    python3 "$src/tests/zero/compare.py" same-run "$1" "$2" || zt_failures=$((zt_failures + 1))
}
# each rank's memory by pool (metrics.jsonl, metrics.rank<R>.jsonl) within 10% of zt-run --dry-run's
# estimate for its stage, below the whole model's state (a stage stores its own units only):
#   memory RUN_DIR RANKS ARGS...   (ARGS: the run's own, without --output-dir and --export)
memory() {
    local dir=$1 ranks=$2
    shift 2
    expect_ok "Memory per rank of each pipeline stage" -- "$zt_run" "${common[@]}" "$@" --output-dir "$dir/dry" \
        --dry-run --nproc "$ranks"
    python3 "$src/tests/parallel/stage_memory.py" "$dir/dry/memory-estimate.json" "$dir" || zt_failures=$((zt_failures + 1))
}
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the exported weights"
expect_ok -- "$zt_run" "${common[@]}" --output-dir "$work/ref" --set gradient_accumulation_steps=4 --plugins zero0 \
    --export "$work/ref/hf" --export-dtype fp32
for stage in 1 3; do
    expect_ok -- mpi 2 "$zt_run" "${common[@]}" --output-dir "$work/pp2-zero$stage" --export "$work/pp2-zero$stage/hf" --export-dtype fp32 --plugins "zero$stage" \
        --set parallel_config.pipeline_stage=2 --set parallel_config.micro_batch_num=4
    compare "$work/ref" "$work/pp2-zero$stage"
    memory "$work/pp2-zero$stage" 2 --plugins "zero$stage" --set parallel_config.pipeline_stage=2 \
        --set parallel_config.micro_batch_num=4
    expect_ok -- mpi 4 "$zt_run" "${common[@]}" --output-dir "$work/pp4-zero$stage" --export "$work/pp4-zero$stage/hf" --export-dtype fp32 --plugins "zero$stage" \
        --set parallel_config.pipeline_stage=4 --set parallel_config.micro_batch_num=4
    compare "$work/ref" "$work/pp4-zero$stage"
    expect_ok -- mpi 4 "$zt_run" "${common[@]}" --output-dir "$work/dp2pp2-zero$stage" --export "$work/dp2pp2-zero$stage/hf" --export-dtype fp32 --plugins "zero$stage" \
        --set parallel_config.pipeline_stage=2 --set parallel_config.micro_batch_num=2
    compare "$work/ref" "$work/dp2pp2-zero$stage"
    memory "$work/dp2pp2-zero$stage" 4 --plugins "zero$stage" --set parallel_config.pipeline_stage=2 \
        --set parallel_config.micro_batch_num=2
done
expect_ok -- mpi 2 "$zt_run" "${common[@]}" --output-dir "$work/pp2-recompute" --export "$work/pp2-recompute/hf" --export-dtype fp32 --plugins zero1 --set recompute=true \
    --set parallel_config.pipeline_stage=2 --set parallel_config.micro_batch_num=4
compare "$work/ref" "$work/pp2-recompute"
# what a pipeline run does not execute is refused on every rank, with the way out
expect_fail "parallel_config.pipeline_stage = 2: the LM head is tied to the embedding" -- mpi 2 "$zt_run" \
    "${common[@]}" --output-dir "$work/tied" --set model.tie_word_embeddings=true --set parallel_config.pipeline_stage=2
finish
