#!/usr/bin/env bash
# The parallel plugin on CPU ranks under Open MPI's mpirun:
#   - 8 ranks, data 2 x tensor 2 x pipeline 2: every rank's grid coordinates (its log line) are the
#     formula's, world_rank = (pp_rank * dp + dp_rank) * tp + tp_rank, with pipeline stage p running
#     its half of the units; the groups are created on all ranks; the step trains and the end-of-run
#     checkpoint has the 8 ranks' files, each tensor covered once (the commit checks it);
#   - layouts that do not fit the job or the model stop every rank with the numbers;
#   - 4 ranks with --plugins parallel and every size 1: the plugin's "dp" group trains exactly as the
#     trainer's own (the same losses, bit for bit, as the plain 4-rank run).
#   ranks.sh ZT_RUN ZT_PREP MPIEXEC SOURCE_DIR WORK_DIR
set -u
zt_run=$1 zt_prep=$2 mpiexec=$3 src=$4 work=$5
. "$src/tests/lib.sh"
rm -rf "$work"
mkdir -p "$work"
data=$work/data
expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$data" \
    --val-fraction 0 --seed 0 --no-progress
mpi() { local n=$1; shift; timeout 120 "$mpiexec" -np "$n" --oversubscribe --allow-run-as-root "$@"; }
model=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_hidden_layers=4
       --set model.num_attention_heads=4 --set model.num_key_value_heads=2 --set device=cpu --set threads=1
       --set data.seq_len=32 --set train_micro_batch_size_per_gpu=1 --set log.every=1 --set seed=3)

# data 2 x tensor 2 x pipeline 2 on 8 ranks, one step and the end-of-run checkpoint (untied head: the
# pipeline needs it)
expect_ok "checkpoint of step 1 saved" -- mpi 8 "$zt_run" --data "$data" "${model[@]}" \
    --output-dir "$work/grid" --set steps=1 --set parallel_config.model_parallel=2 \
    --set parallel_config.pipeline_stage=2 --set comm.timeout_s=60 --set model.tie_word_embeddings=false
[ "$ZT_RC" -eq 124 ] && { echo "FAIL: the 8 ranks hung"; zt_failures=$((zt_failures + 1)); }
grid_out=$ZT_OUT
expect_ok '"world_size": 8' '"dp_size": 2' '"tp_size": 2' '"pp_size": 2' '"rank-00007.bin"' -- \
    cat "$work/grid/checkpoints/step-000001/checkpoint.json"
ZT_OUT=$grid_out
for r in 0 1 2 3 4 5 6 7; do
    tp=$((r % 2)) dp=$((r / 2 % 2)) pp=$((r / 4))
    units="0..2"
    [ "$pp" -eq 1 ] && units="3..5"
    line="zt[rank $r] info [parallel]: grid: data 2 x tensor 2 x pipeline 2; this rank dp $dp tp $tp pp $pp, units $units"
    if ! grep -qF -- "$line" <<<"$ZT_OUT"; then
        echo "FAIL: world rank $r did not log '$line'"; zt_failures=$((zt_failures + 1))
    fi
done

# layouts that do not fit
expect_fail "model_parallel x pipeline_stage = 3 x 1 = 3 does not divide the job's 4 ranks" -- \
    mpi 4 "$zt_run" --data "$data" "${model[@]}" --output-dir "$work/bad1" --set steps=1 \
    --set parallel_config.model_parallel=3
expect_fail "data_parallel x model_parallel x pipeline_stage = 4 x 2 x 1 = 8, but the job has 4 ranks" -- \
    mpi 4 "$zt_run" --data "$data" "${model[@]}" --output-dir "$work/bad2" --set steps=1 \
    --set parallel_config.model_parallel=2 --set parallel_config.data_parallel=4
expect_fail "pipeline_stage = 8 is more than the model's 4 layers" -- \
    mpi 8 "$zt_run" --data "$data" "${model[@]}" --output-dir "$work/bad3" --set steps=1 \
    --set parallel_config.pipeline_stage=8

# every size 1: the plugin's dp group against the trainer's own
expect_ok -- mpi 4 "$zt_run" --data "$data" "${model[@]}" --output-dir "$work/plain" --set steps=3
expect_ok "grid: data 4 x tensor 1 x pipeline 1" -- mpi 4 "$zt_run" --data "$data" "${model[@]}" \
    --output-dir "$work/plugin" --set steps=3 --plugins parallel
python3 - "$work/plain/metrics.jsonl" "$work/plugin/metrics.jsonl" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"train"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if len(a) != 3 or a != b:
    print(f"FAIL: losses with the plugin's dp group {b} differ from the plain run's {a}")
    sys.exit(1)
PY
finish
