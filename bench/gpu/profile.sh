#!/usr/bin/env bash
# Where a GPU training step's time goes: runs zt-run with ZT_CUDA_PROFILE=1 on the benchmark shapes
# (bench/gpu/run.py: random tokens, vocab 32000, seq 512) and prints the llama plugin's per-op table
# (docs/cuda.md, "Profile"). Not a timed benchmark: the events cost host time.
#   bash bench/gpu/profile.sh [BUILD_DIR=build-gpu] [MODELS=125m,1b]
# ZT_PROFILE_FUSE=both also profiles each model with ZT_CUDA_FUSE=0 (separate q/k/v and gate/up GEMMs).
# Logs go to $OUT (the device tool's output folder) or out/gpu-profile.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
models=${2:-125m,1b}
out=${OUT:-$PWD/out}/gpu-profile
mkdir -p "$out"
for tool in zt-run zt-bench-random-data; do
    [ -x "$build/bin/$tool" ] || { echo "profile.sh: $build/bin/$tool is missing: build first (scripts/gpu.sh)"; exit 1; }
done
steps=8 # 2 warm-up micro-batches, 5 profiled, the rest closes the window
status=0
for model in ${models//,/ }; do
    case $model in
        125m|1b) batch=16 ;;
        *) echo "profile.sh: model '$model' is not one of 125m, 1b"; exit 1 ;;
    esac
    data=$out/random-32000-512-$((batch * steps))
    [ -f "$data/manifest.json" ] || "$build/bin/zt-bench-random-data" "$data" 32000 512 $((batch * steps)) >/dev/null ||
        { echo "profile.sh: making random data failed"; exit 1; }
    fuse_values=(1)
    [ "${ZT_PROFILE_FUSE:-}" = both ] && fuse_values=(1 0)
    for fuse in "${fuse_values[@]}"; do
        log=$out/$model-fuse$fuse.log
        echo "== $model, ZT_CUDA_FUSE=$fuse (log: $log)"
        ZT_CUDA_PROFILE=1 ZT_CUDA_FUSE=$fuse "$build/bin/zt-run" --data "$data" --output-dir "$out/run-$model-$fuse" \
            --plugins flash --set device=cuda --set model.preset="$model" --set model.vocab_size=32000 \
            --set train_micro_batch_size_per_gpu=$batch --set data.seq_len=512 --set steps=$steps \
            --set scheduler.type=constant --set optimizer.params.lr=1e-5 --set gradient_clipping=0 \
            --set data.shuffle=false --set checkpoint.final=false --set log.every=1 >"$log" 2>&1
        rc=$?
        grep -E "step [0-9]+/[0-9]+" "$log" | tail -n 2
        sed -n '/^ZT_CUDA_PROFILE: llama GPU time/,/^window/p' "$log"
        if [ $rc -ne 0 ]; then
            tail -n 5 "$log"
            echo "profile.sh: zt-run failed (exit $rc)"
            status=1
        fi
    done
done
exit $status
