#!/usr/bin/env bash
# Everything zt runs on a GPU, in one go: builds the CUDA kernels, zt-run with the CUDA backend and
# plugins, their tests and the benchmarks for this machine's GPU, runs the GPU tests (ctest -L gpu:
# the kernels against the CPU kernels, training against torch fixtures and the CPU run), trains
# against the PyTorch peer (bench/gpu/run.py), compares flash attention with PyTorch's SDPA
# (bench/attention/run.py) and times the other kernels (zt-bench-kernels, zt-bench-decode). Logs and
# tables go to $OUT (set by the device tool) or out/gpu.
#   ZT_CUDA_ARCHITECTURES=90   architectures of the main build (H100/H200)
#   ZT_GPU_PTX_ARCH=80         also build for sm_80 and run the tests again: on a newer GPU the
#                              driver compiles that build's PTX, which runs the sm_80 code paths
#   ZT_GPU_KERNEL_TESTS=0      skip the kernel tests (cuda.*), e.g. when only the training path changed
#   ZT_GPU_BENCH=0             skip all benchmarks
#   ZT_GPU_BENCH_KERNELS=0     skip the attention and kernel benchmarks
#   ZT_GPU_BENCH_MODELS=125m,1b  models of the training benchmark (125m, 1b, 7b, 8b; empty: none)
#   ZT_GPU_BENCH_PEER_MODES=eager,compile  the PyTorch peer's modes (empty: zt only)
#   ZT_GPU_BENCH_STEPS=10      timed steps per training benchmark run
#   ZT_GPU_BENCH_DEADLINE=S    start no benchmark run later than S seconds after this script started
#   ZT_GPU_CTEST_EXCLUDE=RE    GPU tests to leave out (a ctest -E regex); ZT_GPU_CTEST_J=N: N at a time
#   ZT_GPU_MULTI=0             skip the multi-GPU and offload tests (they skip themselves on one GPU)
#   ZT_GPU_BENCH_PEER_RUNS=125m:compile,7b:eager  per-model peer modes (instead of the list above)
#   ZT_GPU_TWO_GPUS=1          single-GPU benchmark: zt on GPU 0 and the peer on GPU 1 at once
#   ZT_GPU_BENCH_ZERO=...      run bench/zero/run.py (2 GPUs) with these arguments (unset: not run)
#   ZT_GPU_BENCH_FINETUNE=1    run bench/finetune/run.py: 7B LoRA r16 and last-two-layers next to the
#                              peer at b8 x 512, then both under --gpu-mem-limit 24G (unset or 0: not run);
#                              ZT_GPU_BENCH_FINETUNE_ARGS: more arguments for both (e.g. --recompute off);
#                              ZT_GPU_BENCH_FINETUNE_LIMIT=24G: the 24 GB card's --gpu-mem-limit (the whole
#                              card: zt keeps gpu_context_reserve of it for the CUDA context), the process
#                              checked below 24G
#   ZT_GPU_BENCH_GENERATE=...  run bench/generate/run.py (the seed's generation table, 7B) with these
#                              arguments, e.g. "--deadline 480" or "--batches 1,32" (unset: not run)
#   ZT_GPU_SANITIZE=1          run the attention test under compute-sanitizer memcheck and racecheck
#   ZT_GPU_PROFILE=1           profile the flash kernels with Nsight Compute (profile.log)
# GPU machines lack libsentencepiece, so the training tests read the example tasks tokenized here
# beforehand into .deps/gpu-data/examples, and the benchmark finds the peer torch_llama.py in
# ../shared/peers or a copy in .deps/peers; .deps travels with the device tool's carry (docs/gpu.md).
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast stays off on the lent multi-GPU machines (it can take the host's GPUs out of
# service): NCCL, PyTorch and NVSHMEM each have a switch.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-$PWD/out/gpu}
mkdir -p "$out"

{ nvidia-smi; nvcc --version; python3 -c 'import torch; print("torch", torch.__version__)'; } \
    >"$out/device.txt" 2>&1
head -n 12 "$out/device.txt"

configure=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DZT_CUDA=ON)
# jsmn.h (libjsmn-dev) may be missing there: the device tool carries a copy in .deps/include.
if [ ! -f /usr/include/jsmn.h ] && [ -f .deps/include/jsmn.h ]; then
    configure+=("-DJSMN_INCLUDE_DIR=$PWD/.deps/include")
fi
# libyaml (libyaml-dev) likewise: the device tool carries yaml.h and the static libyaml.a in .deps.
if [ ! -f /usr/include/yaml.h ] && [ -f .deps/include/yaml.h ] && [ -f .deps/lib/libyaml.a ]; then
    configure+=("-DYAML_INCLUDE_DIR=$PWD/.deps/include" "-DYAML_LIBRARY=$PWD/.deps/lib/libyaml.a")
fi
# Everything: the GPU tests need the plugins, modules and test programs of every area. `-k 0` keeps
# building past a failure elsewhere (e.g. a CPU-only tool), and the failure is reported.
[ -f .deps/gpu-data/examples/manifest.json ] && export ZT_GPU_TEST_DATA=$PWD/.deps/gpu-data/examples
ctest_filter=()
[ "${ZT_GPU_KERNEL_TESTS:-1}" = 0 ] && ctest_filter=(-E "^cuda\\.${ZT_GPU_CTEST_EXCLUDE:+|$ZT_GPU_CTEST_EXCLUDE}")
[ "${ZT_GPU_KERNEL_TESTS:-1}" != 0 ] && [ -n "${ZT_GPU_CTEST_EXCLUDE:-}" ] && ctest_filter=(-E "$ZT_GPU_CTEST_EXCLUDE")

# build_and_test <build dir> <architectures> <ctest log>: returns non-zero when a test failed.
build_and_test() {
    local build=$1 arch=$2 log=$3 start=$SECONDS
    if ! cmake -S . -B "$build" "${configure[@]}" "-DCMAKE_CUDA_ARCHITECTURES=$arch" \
            >>"$out/build.log" 2>&1; then
        tail -n 60 "$out/build.log"
        echo "gpu.sh: configure for $arch failed (full log: $out/build.log)"
        exit 1
    fi
    if ! cmake --build "$build" -j "$(nproc)" -- -k 0 >>"$out/build.log" 2>&1; then
        grep -E "error|FAILED" "$out/build.log" | head -n 40
        echo "gpu.sh: some targets failed to build for $arch (full log: $out/build.log); testing what built"
    fi
    echo "gpu.sh: built for $arch in $((SECONDS - start)) s"
    # --verbose keeps every check's measured error in the log, passing or not.
    ctest --test-dir "$build" -L gpu "${ctest_filter[@]}" -j "${ZT_GPU_CTEST_J:-2}" --verbose --timeout 300 >"$log" 2>&1
    local rc=$?
    grep -E "tests passed|Test +#|FAIL|SKIP" "$log"
    # the measured agreement with the references (torch, the CPU run)
    grep -E "^[0-9]+: (loss |largest relative|device memory|[0-9]+ steps agree|[0-9]+ records agree|B[0-9])" "$log" |
        head -n 40
    # what failed, for the reply's tail (the whole log is in $log)
    [ $rc -eq 0 ] || grep -E "check failed|expected|not close|rel L2 error .*FAIL|zt-run: error|Error|error:" "$log" |
        head -n 40
    echo "gpu.sh: tests done at $SECONDS s"
    return $rc
}

status=0
build=${ZT_BUILD_DIR:-build-gpu}
build_and_test "$build" "${ZT_CUDA_ARCHITECTURES:-90}" "$out/ctest.log" || status=1
if [ -n "${ZT_GPU_PTX_ARCH:-}" ]; then
    build_and_test "$build-ptx$ZT_GPU_PTX_ARCH" "$ZT_GPU_PTX_ARCH" \
        "$out/ctest-ptx$ZT_GPU_PTX_ARCH.log" || status=1
fi

# The sanitizers take minutes: on request, or after a failure when the kernel tests ran.
sanitize=${ZT_GPU_SANITIZE:-}
[ -z "$sanitize" ] && [ "$status" -ne 0 ] && [ "${ZT_GPU_KERNEL_TESTS:-1}" != 0 ] && sanitize=1
if [ "$sanitize" = 1 ]; then
    # Out-of-bounds accesses and shared-memory races (compute-sanitizer works on the Firecracker
    # machines; /work/.library/device/KINDS.md).
    for tool in memcheck racecheck; do
        echo "== compute-sanitizer --tool $tool test_cuda_attention" >>"$out/sanitizer.log"
        timeout 75 compute-sanitizer --tool "$tool" --print-limit 20 \
            "$build/bin/test_cuda_attention" >>"$out/sanitizer.log" 2>&1
        echo "== exit status $?" >>"$out/sanitizer.log"
    done
    grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard" "$out/sanitizer.log" | head -n 20
fi

# Several ranks, offload and the memory estimate on GPUs: each script skips (exit 77) with a message
# when the machine lacks what it needs (2 GPUs, the NCCL module).
if [ "${ZT_GPU_MULTI:-1}" != 0 ]; then
    for suite in tests/comm/gpu2.sh tests/zero/gpu2.sh tests/zero/offload_gpu.sh tests/zero/mem_gpu.sh; do
        [ -f "$suite" ] || continue
        name=$(basename "$(dirname "$suite")")-$(basename "$suite" .sh)
        start=$SECONDS
        timeout "${ZT_GPU_SUITE_TIMEOUT:-240}" bash "$suite" "$build" >"$out/$name.log" 2>&1
        rc=$?
        case $rc in
            0) verdict=PASS ;; 77) verdict=SKIP ;; 124) verdict="FAIL (timed out)"; status=1 ;;
            *) verdict="FAIL (exit $rc)"; status=1 ;;
        esac
        echo "gpu.sh: $suite: $verdict in $((SECONDS - start)) s"
        grep -E "PASS|FAIL|SKIP|ratio|peak|error" "$out/$name.log" | head -n 25
    done
fi

if [ "${ZT_GPU_BENCH:-1}" != 0 ] && [ -n "${ZT_GPU_BENCH_MODELS-125m,1b}" ]; then
    # zt and the PyTorch peer training the same shapes (bench/RESULTS.md keeps the figures).
    PYTHONUNBUFFERED=1 python3 bench/gpu/run.py --build "$build" --models "${ZT_GPU_BENCH_MODELS-125m,1b}" \
        --peer-modes "${ZT_GPU_BENCH_PEER_MODES-eager,compile}" --steps "${ZT_GPU_BENCH_STEPS:-10}" \
        $( [ "${ZT_GPU_TWO_GPUS:-0}" = 1 ] && echo --two-gpus ) \
        ${ZT_GPU_BENCH_PEER_RUNS:+--peer-runs "$ZT_GPU_BENCH_PEER_RUNS"} \
        --deadline "$(( ${ZT_GPU_BENCH_DEADLINE:-100000} - SECONDS ))" --work "$build/bench-gpu" \
        --out "$out/bench-train.md" 2>&1 | tee "$out/bench-train.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    cp "$build/bench-gpu/bench.log" "$out/bench-train-runs.log" 2>/dev/null
fi

if [ "${ZT_GPU_BENCH:-1}" != 0 ] && [ "${ZT_GPU_BENCH_FINETUNE:-0}" = 1 ]; then
    # issue 15's fine-tuning rows (bench/RESULTS.md keeps the figures): next to the peer, then the 24 GB card
    for mode in h200 24g; do
        limit=()
        [ $mode = 24g ] && limit=(--gpu-mem-limit "${ZT_GPU_BENCH_FINETUNE_LIMIT:-24G}" --card 24G)
        # shellcheck disable=SC2086 # the extra arguments are meant to split
        PYTHONUNBUFFERED=1 python3 bench/finetune/run.py --build "$build" --steps "${ZT_GPU_BENCH_STEPS:-10}" \
            "${limit[@]}" --deadline "$(( ${ZT_GPU_BENCH_DEADLINE:-100000} - SECONDS ))" \
            --work "$build/bench-finetune-$mode" --out "$out/bench-finetune-$mode.md" ${ZT_GPU_BENCH_FINETUNE_ARGS:-} \
            2>&1 | tee "$out/bench-finetune-$mode.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        cp "$build/bench-finetune-$mode/bench.log" "$out/bench-finetune-$mode-runs.log" 2>/dev/null
    done
fi

if [ "${ZT_GPU_BENCH:-1}" != 0 ] && [ "${ZT_GPU_BENCH_KERNELS:-1}" != 0 ]; then
    PYTHONUNBUFFERED=1 python3 bench/attention/run.py --bench "$build/bin/zt-bench-flash" \
        --out "$out/bench.md" 2>&1 | tee "$out/bench.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    "$build/bin/zt-bench-kernels" 2>&1 | tee "$out/kernels.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    # decode attention's GB/s on 7B shapes (batch 1/8/32, contexts 256/1024/2048) against the copy bound
    "$build/bin/zt-bench-decode" 2>&1 | tee "$out/decode.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ -n "${ZT_GPU_BENCH_ZERO+set}" ] && [ -f bench/zero/run.py ]; then
    # ZeRO stages and offload on 2 GPUs next to PyTorch DDP / FSDP2 (bench/zero/README.md).
    # shellcheck disable=SC2086 # the arguments are meant to split
    PYTHONUNBUFFERED=1 python3 bench/zero/run.py --build "$build" $ZT_GPU_BENCH_ZERO 2>&1 | tee "$out/bench-zero.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ -n "${ZT_GPU_BENCH_GENERATE+set}" ]; then
    # zt-run --generate (naive, flash, paged) next to HF generate() on a random 7B (bench/RESULTS.md).
    # shellcheck disable=SC2086 # the arguments are meant to split
    PYTHONUNBUFFERED=1 python3 bench/generate/run.py --build "$build" --work "$build/bench-generate" \
        --out "$out/bench-generate.md" $ZT_GPU_BENCH_GENERATE 2>&1 | tee "$out/bench-generate.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    cp "$build/bench-generate/bench.log" "$out/bench-generate-runs.log" 2>/dev/null
fi

if [ "${ZT_GPU_PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
    # One forward and one backward launch at seq 2048 (--clock-control none: leave clocks alone).
    for kernel in flash_forward_kernel flash_backward_kernel; do
        timeout 180 ncu --clock-control none --kernel-name "regex:$kernel" --launch-count 1 \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
            --section WarpStateStats --section Occupancy --section LaunchStats \
            "$build/bin/zt-bench-flash" --batch 8 --seq 2048 --heads 32 --iters 1 \
            >>"$out/profile.log" 2>&1
    done
    grep -E "Duration|Throughput|Pipe|Registers|Achieved Occupancy|Stall|Warp Cycles" "$out/profile.log" | head -n 60
fi
# The device tool brings back at most 8 files, each of limited size: the text logs go into one
# archive (checkpoints and model files that tests leave under $OUT would make it too large to return).
if [ -n "${OUT:-}" ]; then
    (cd "$out" && find . -type f \( -name '*.log' -o -name '*.txt' -o -name '*.jsonl' -o -name '*.json' \) |
        tar czf logs.tgz -T - 2>/dev/null &&
        find . -mindepth 1 ! -name logs.tgz ! -name '*.md' -delete 2>/dev/null)
fi
exit $status
