#!/usr/bin/env bash
# The flash attention kernels on a GPU machine, alone and fast: builds only their test and benchmark
# (sm_90 + sm_90a), runs the test (every forward kernel against the CPU reference), the wgmma-vs-mma
# check at the benchmark shapes, and the table against PyTorch SDPA (run.py). Output in $OUT or
# out/flash. Exit status non-zero when anything failed.
#   ZT_FLASH_ARCH=90           CMAKE_CUDA_ARCHITECTURES (90 builds both the mma and the wgmma kernels)
#   ZT_FLASH_SANITIZE=1        also run the test under compute-sanitizer memcheck (slow)
#   ZT_FLASH_BENCH=0           test only
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/out/flash}
build=${ZT_FLASH_BUILD_DIR:-build-flash-gpu}
mkdir -p "$out"
configure=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DZT_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${ZT_FLASH_ARCH:-90}")
# jsmn.h may be missing on GPU machines: the device tool carries a copy in .deps/include (scripts/gpu.sh)
if [ ! -f /usr/include/jsmn.h ] && [ -f .deps/include/jsmn.h ]; then
    configure+=("-DJSMN_INCLUDE_DIR=$PWD/.deps/include")
fi
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
if ! { cmake -S . -B "$build" "${configure[@]}" &&
       cmake --build "$build" -j "$(nproc)" --target test_cuda_attention zt-bench-flash; } >"$out/build.log" 2>&1; then
    grep -E "error|FAILED" "$out/build.log" | head -n 40
    echo "gpu-flash.sh: build failed (full log: $out/build.log)"
    exit 1
fi
status=0
echo "== test_cuda_attention"
"$build/bin/test_cuda_attention" >"$out/test.log" 2>&1 || status=1
grep -E "NOTE|FAIL|check failed|flash (forward|backward)|rel L2|passed|failed" "$out/test.log" | head -n 120
tail -n 3 "$out/test.log"
if [ "${ZT_FLASH_SANITIZE:-0}" = 1 ]; then
    echo "== compute-sanitizer memcheck test_cuda_attention"
    compute-sanitizer --tool memcheck --error-exitcode 9 "$build/bin/test_cuda_attention" >"$out/sanitizer.log" 2>&1 ||
        { status=1; grep -E "ERROR|error" "$out/sanitizer.log" | head -n 20; }
fi
[ "${ZT_FLASH_BENCH:-1}" = 0 ] && exit $status
echo "== zt-bench-flash: mma, wgmma, wgmma forward + mma backward (wgmma results checked against mma)"
for shape in "--batch 4 --seq 4096 --heads 32 --dim 128" "--batch 16 --seq 512 --heads 32 --dim 64" \
             "--batch 2 --seq 2048 --heads 32 --kv-heads 8 --dim 128"; do
    for kernel in mma wgmma "wgmma --backward-kernel mma"; do
        # shellcheck disable=SC2086
        "$build/bin/zt-bench-flash" --kernel $kernel $shape --iters 10 2>&1 | tee -a "$out/bench.log" || status=1
    done
done
echo "== run.py (PyTorch SDPA)"
PYTHONUNBUFFERED=1 python3 bench/attention/run.py --bench "$build/bin/zt-bench-flash" \
    --out "$out/attention.md" 2>&1 | tail -n 16 || status=1
echo "gpu-flash.sh: status $status"
exit $status
