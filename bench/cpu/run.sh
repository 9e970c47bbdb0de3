#!/usr/bin/env bash
# CPU training benchmark: tokens/s of a LLaMA training step, zt-run against PyTorch on the CPU, in
# one run, same shapes, batch, sequence length and threads. Prints a table (zt/torch > 1: zt faster).
#
#   bench/cpu/run.sh [BUILD_DIR]            (default: build-benchcpu; built here when needed)
#
# Environment (defaults in brackets):
#   ZT_BENCH_SHAPES  ["tiny:8 125m:4"]  SHAPE:BATCH pairs; shapes are the peer's
#                                       (../shared/peers/torch_llama.py), vocab 32000
#   ZT_BENCH_SEQ     [256]   tokens per row
#   ZT_BENCH_THREADS [2]     zt-run threads=N; torch.set_num_threads(N)
#   ZT_BENCH_WARMUP  [2]     untimed steps first
#   ZT_BENCH_STEPS   [4]     timed steps
#   ZT_BENCH_CPUS    [N CPUs on N different physical cores when the machine has more than N;
#                     else unpinned]  taskset list both runs are pinned to (the same cores)
#   ZT_BENCH_DIR     [out/bench-cpu]    work directory (data, logs, metrics, table.md)
#
# Both sides run the same step: fp32, AdamW (lr 1e-5 constant, no gradient clipping), rows of
# random tokens trained on every next token (torch: labels = inputs), untied LM head. zt's figure
# comes from its own metrics.jsonl (step_s of the timed steps); torch_train.py times PyTorch the
# same way. The two runs are sequential, never concurrent. Needs python3 with torch, transformers
# and numpy (pip install torch transformers).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath -m "${1:-$repo/build-benchcpu}")
shapes=${ZT_BENCH_SHAPES:-tiny:8 125m:4}
seq=${ZT_BENCH_SEQ:-256}
threads=${ZT_BENCH_THREADS:-2}
warmup=${ZT_BENCH_WARMUP:-2}
steps=${ZT_BENCH_STEPS:-4}
work=$(realpath -m "${ZT_BENCH_DIR:-$repo/out/bench-cpu}")
here=$repo/bench/cpu

die() { echo "bench/cpu/run.sh: $*" >&2; exit 1; }

python3 -c 'import torch, transformers, numpy' 2>/dev/null ||
    die "python3 cannot import torch, transformers and numpy: pip install torch transformers"

# Same cores for both sides: on a bigger machine, N logical CPUs on N different physical cores (two
# hyper-threads of one core would halve both sides' arithmetic), unless told otherwise.
pin=()
cpus=${ZT_BENCH_CPUS:-}
if [ -z "$cpus" ] && [ "$(nproc)" -gt "$threads" ]; then
    command -v lscpu >/dev/null || die "lscpu (util-linux) is needed to pick cores; or set ZT_BENCH_CPUS"
    cpus=$(lscpu -p=CPU,CORE,SOCKET | grep -v '^#' | sort -t, -k3,3n -k2,2n -k1,1n |
           awk -F, -v n="$threads" '!seen[$3 "," $2]++ && picked < n { list = list (picked++ ? "," : "") $1 }
                                   END { print list }')
fi
if [ -n "$cpus" ]; then
    command -v taskset >/dev/null || die "ZT_BENCH_CPUS needs taskset (util-linux)"
    pin=(taskset -c "$cpus")
fi

echo "== building zt in $build"
if [ ! -f "$build/CMakeCache.txt" ]; then
    configure=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZT_CUDA=OFF -DZT_BUILD_TESTS=OFF)
    # Where libjsmn-dev is not installed (the GPU machine), scripts/gpu.sh's copy in .deps/include.
    if [ ! -f /usr/include/jsmn.h ] && [ -f "$repo/.deps/include/jsmn.h" ]; then
        configure+=("-DJSMN_INCLUDE_DIR=$repo/.deps/include")
    fi
    mkdir -p "$build"
    cmake -S "$repo" -B "$build" "${configure[@]}" >"$build/bench-cpu-configure.log" 2>&1 ||
        die "cmake configure failed: $build/bench-cpu-configure.log"
fi
cmake --build "$build" -j "$(nproc)" --target zt-run zt-plugin-llama zt-plugin-naive zt-plugin-adamw \
    zt-plugin-zero0 >"$build/bench-cpu-build.log" 2>&1 || die "build failed: $build/bench-cpu-build.log"

# Only what this script writes: ZT_BENCH_DIR may be a directory that holds other things.
mkdir -p "$work"
rm -rf "$work/data" "$work/table.md" "$work/machine.txt"
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) online"
    echo "pinned: ${cpus:-no}"
    echo "zt: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?') (+ working tree), $build"
    python3 -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")'
    echo "seq $seq, threads $threads, $warmup warm-up + $steps timed steps"
} | tee "$work/machine.txt"

max_batch=0
for spec in $shapes; do
    batch=${spec#*:}
    [ "$batch" -gt "$max_batch" ] && max_batch=$batch
done
# Enough rows for every step of the largest batch, so no row repeats within a run.
python3 "$here/make_data.py" "$work/data" --samples $((max_batch * (warmup + steps))) --seq-len "$seq" \
    --vocab 32000

for spec in $shapes; do
    shape=${spec%%:*} batch=${spec#*:}
    dir=$work/$shape
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "== $shape, batch $batch: zt-run"
    "${pin[@]}" "$build/bin/zt-run" --data "$work/data" --set model.preset="$shape" --set model.vocab_size=32000 \
        --set model.tie_word_embeddings=false --set data.seq_len="$seq" --set data.mode=padded \
        --set train_micro_batch_size_per_gpu="$batch" --set steps=$((warmup + steps)) --set threads="$threads" \
        --set optimizer.params.lr=1e-5 --set scheduler.type=constant --set gradient_clipping=0 \
        --set output_dir="$dir/out" >"$dir/zt.log" 2>&1 || { tail -n 20 "$dir/zt.log"; die "zt-run failed: $dir/zt.log"; }
    grep -E "step [0-9]+/" "$dir/zt.log" || true
    echo "== $shape, batch $batch: PyTorch"
    OMP_NUM_THREADS=$threads "${pin[@]}" python3 "$here/torch_train.py" --model "$shape" --batch "$batch" \
        --seq "$seq" --threads "$threads" --warmup "$warmup" --steps "$steps" >"$dir/torch.json" 2>"$dir/torch.log" ||
        { tail -n 20 "$dir/torch.log"; die "torch_train.py failed: $dir/torch.log"; }
    cat "$dir/torch.json"
done

echo
python3 "$here/report.py" "$work" --shapes $shapes --seq "$seq" --warmup "$warmup" --steps "$steps" |
    tee "$work/table.md"
