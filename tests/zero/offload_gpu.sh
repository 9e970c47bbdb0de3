#!/usr/bin/env bash
# CPU offload on GPU runs (docs/zero.md, "Offload"), end to end through zt-run:
#   offload_gpu.sh BUILD_DIR
# On 1 GPU, and on 2 GPUs (zt-run --nproc 2) when the machine has them: a small LLaMA trains 8 steps
# in bf16 under zero1, zero2 and zero3, without offload and with offload_optimizer (zero3 also with
# offload_param, and zero2 once with pin_memory false); each offload run's losses and exported weights
# must agree with the run without offload (offload_compare.py states the tolerances and why), and a
# table shows the per-pool device and host peaks, i.e. the device memory offload removes, which must
# fall: the offload run's device optimizer-state peak must be below the reference's. On the largest
# rank count each stage also runs without clipping and with one micro-batch, where the CPU optimizer
# steps each unit during the backward (the log says so), against the same run without offload.
# Takes a few minutes: scripts/gpu.sh callers set ZT_GPU_SUITE_TIMEOUT=900.
# Exit 77 with "SKIP: ..." without a GPU. Data: $ZT_GPU_TEST_DATA, or the example tasks tokenized
# here (needs the sentencepiece plugin), as tests/gpu/run_gpu_test.sh does.
set -u
# NVLink multicast stays off on the lent multi-GPU machines (scripts/gpu.sh says why)
export NCCL_NVLS_ENABLE=0
build=$(cd "${1:?usage: offload_gpu.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
. "$src/tests/lib.sh"
zt_run=$build/bin/zt-run zt_prep=$build/bin/zt-prep devices_bin=$build/bin/zt-cuda-devices
for f in "$zt_run" "$devices_bin"; do
    [ -x "$f" ] || { echo "FAIL: $f is not built (build $build with CUDA first)"; exit 1; }
done
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"
n_gpus=$("$devices_bin")
[ $? -eq 77 ] && skip "${n_gpus#SKIP: }"
echo "$n_gpus CUDA device(s)"
work=${ZT_OFFLOAD_GPU_WORK:-$build/offload-gpu}
rm -rf "$work" && mkdir -p "$work"

if [ -n "${ZT_GPU_TEST_DATA:-}" ]; then
    data=$ZT_GPU_TEST_DATA
else
    data=$work/data
    "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$data" \
        --val-fraction 0.05 --seed 0 --no-progress >"$work/prep.log" 2>&1 ||
        skip "zt-prep cannot tokenize the example tasks here (no sentencepiece plugin?); set ZT_GPU_TEST_DATA" \
             "(scripts/gpu.sh does: .deps/gpu-data/examples)"
fi

# Heads of 64 (flash kernels), 4 layers so several units pipeline; 2 micro-batches per step, so the
# offloaded gradient shards accumulate over micro-batches on the host.
common=(--data "$data" --set device=cuda --set model.hidden_size=256 --set model.intermediate_size=512
        --set model.num_hidden_layers=4 --set model.num_attention_heads=4 --set model.num_key_value_heads=2
        --set data.seq_len=128 --set train_micro_batch_size_per_gpu=4 --set gradient_accumulation_steps=2
        --set steps=8 --set threads=8 --set log.every=1000 --set optimizer.params.lr=3e-3 --set seed=7
        --set checkpoint.final=false)
opt=(--set zero_optimization.offload_optimizer.device=cpu)
param=(--set zero_optimization.offload_param.device=cpu)
early=(--set gradient_clipping=0 --set gradient_accumulation_steps=1)

compare() {
    python3 "$here/offload_compare.py" "$@" || zt_failures=$((zt_failures + 1))
}

# run NAME RANKS STAGE [zt-run args...]: trains into $work/NAME and exports its weights. An offload
# run must say how it steps: after the backward (clipping, 2 micro-batches) or inside it (early).
run() {
    local name=$1 ranks=$2 stage=$3
    shift 3
    local launch=("$zt_run") needles=()
    [ "$ranks" -gt 1 ] && launch+=(--nproc "$ranks")
    case $name in
    *-opt*-early) needles=("each unit is stepped during the backward as soon as its gradients reach the host") ;;
    *-opt*) needles=("units are stepped after the backward (the global norm comes first)") ;;
    esac
    local before=$zt_failures
    expect_ok "${needles[@]}" -- "${launch[@]}" "${common[@]}" --plugins "flash,zero$stage" --output-dir "$work/$name" \
        --export "$work/$name/hf" --export-dtype fp32 "$@"
    echo "$ZT_OUT" >"$work/$name.log"
    [ "$ZT_RC" -eq 0 ] && [ "$zt_failures" -eq "$before" ]
}

rank_counts=(1)
[ "$n_gpus" -ge 2 ] && rank_counts+=(2)
for ranks in "${rank_counts[@]}"; do
    for stage in 1 2 3; do
        ref=r${ranks}-zero$stage
        run "$ref" "$ranks" "$stage" || continue
        runs=("$work/$ref")
        if run "$ref-opt" "$ranks" "$stage" "${opt[@]}"; then
            compare close "$work/$ref" "$work/$ref-opt"
            runs+=("$work/$ref-opt")
        fi
        if [ "$stage" = 2 ] && run "$ref-opt-pageable" "$ranks" "$stage" "${opt[@]}" \
                --set zero_optimization.offload_optimizer.pin_memory=false; then
            compare close "$work/$ref" "$work/$ref-opt-pageable"
            runs+=("$work/$ref-opt-pageable")
        fi
        if [ "$stage" = 3 ] && run "$ref-opt-param" "$ranks" "$stage" "${opt[@]}" "${param[@]}"; then
            compare close "$work/$ref" "$work/$ref-opt-param"
            runs+=("$work/$ref-opt-param")
        fi
        # Early steps (no clipping, one micro-batch): on the largest rank count only (time).
        if [ "$ranks" = "${rank_counts[-1]}" ] &&
            run "$ref-early" "$ranks" "$stage" "${early[@]}"; then
            extra=("${opt[@]}")
            [ "$stage" = 3 ] && extra+=("${param[@]}")
            if run "$ref-opt-early" "$ranks" "$stage" "${early[@]}" "${extra[@]}"; then
                compare close "$work/$ref-early" "$work/$ref-opt-early"
                runs+=("$work/$ref-opt-early")
            fi
        fi
        compare peaks "$ranks GPU(s), zero$stage" "${runs[@]}"
        # what offload must remove from the device: the optimizer state
        for r in "${runs[@]:1}"; do
            python3 - "$work/$ref" "$r" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
def last(d):
    with open(f"{d}/metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["type"] == "train"][-1]
ref, run = last(sys.argv[1]), last(sys.argv[2])
a, b = ref["mem_device"]["optimizer"]["peak"], run["mem_device"]["optimizer"]["peak"]
if not b < a or not run["mem_host"]["optimizer"]["peak"] > 0:
    print(f"FAIL: {sys.argv[2]}: device optimizer-state peak {b} B, without offload {a} B; host "
          f"{run['mem_host']['optimizer']['peak']} B: offload did not move the optimizer state")
    sys.exit(1)
print(f"PASS {sys.argv[2]}: device optimizer-state peak {a} -> {b} B")
PY
        done
    done
done
finish
