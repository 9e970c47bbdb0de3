#!/usr/bin/env bash
# Everything zt runs on a GPU, in one go: builds the CUDA kernels, their tests and the benchmarks
# for this machine's GPU, runs the GPU tests (ctest -L gpu), compares flash attention with PyTorch's
# SDPA (bench/attention/run.py) and times the other kernels (zt-bench-kernels). Logs and tables go
# to $OUT (set by the device tool) or out/gpu.
#   ZT_CUDA_ARCHITECTURES=90   architectures of the main build (H100/H200)
#   ZT_GPU_PTX_ARCH=80         also build for sm_80 and run the tests again: on a newer GPU the
#                              driver compiles that build's PTX, which runs the sm_80 code paths
#   ZT_GPU_BENCH=0             skip the benchmarks
#   ZT_GPU_SANITIZE=1          run the attention test under compute-sanitizer memcheck and racecheck
#   ZT_GPU_PROFILE=1           profile the flash kernels with Nsight Compute (profile.log)
set -uo pipefail
cd "$(dirname "$0")/.."
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
targets=(zt_kernels_cuda test_cuda_ops test_cuda_attention zt-bench-flash zt-bench-kernels)

# build_and_test <build dir> <architectures> <ctest log>: returns non-zero when a test failed.
build_and_test() {
    local build=$1 arch=$2 log=$3 start=$SECONDS
    if ! cmake -S . -B "$build" "${configure[@]}" "-DCMAKE_CUDA_ARCHITECTURES=$arch" \
            >>"$out/build.log" 2>&1 ||
       ! cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >>"$out/build.log" 2>&1; then
        tail -n 60 "$out/build.log"
        echo "gpu.sh: build for $arch failed (full log: $out/build.log)"
        exit 1
    fi
    echo "gpu.sh: built ${targets[*]} for $arch in $((SECONDS - start)) s"
    # --verbose keeps every check's measured error in the log, passing or not.
    ctest --test-dir "$build" -L gpu -j 2 --verbose --timeout 300 >"$log" 2>&1
    local rc=$?
    grep -E "tests passed|Test +#|FAIL|SKIP" "$log"
    return $rc
}

status=0
build=${ZT_BUILD_DIR:-build-gpu}
build_and_test "$build" "${ZT_CUDA_ARCHITECTURES:-90}" "$out/ctest.log" || status=1
if [ -n "${ZT_GPU_PTX_ARCH:-}" ]; then
    build_and_test "$build-ptx$ZT_GPU_PTX_ARCH" "$ZT_GPU_PTX_ARCH" \
        "$out/ctest-ptx$ZT_GPU_PTX_ARCH.log" || status=1
fi

if [ "${ZT_GPU_SANITIZE:-0}" = 1 ] || [ "$status" -ne 0 ]; then
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

if [ "${ZT_GPU_BENCH:-1}" != 0 ]; then
    PYTHONUNBUFFERED=1 python3 bench/attention/run.py --bench "$build/bin/zt-bench-flash" \
        --out "$out/bench.md" 2>&1 | tee "$out/bench.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    "$build/bin/zt-bench-kernels" 2>&1 | tee "$out/kernels.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
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
exit $status
