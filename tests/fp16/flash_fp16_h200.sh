#!/usr/bin/env bash
# First GPU run of flash attention's fp16 kernels (docs/cuda.md, "fp16"; not yet run on a GPU when this
# was written): one call on an H100/H200 that builds, verifies and measures them.
#   1. builds everything for sm_90 (Release, as scripts/gpu.sh) into build-gpu;
#   2. ctest -R "cuda.attention|fp16": every flash kernel (mma.sync and wgmma, forward and backward,
#      every variant) in bf16 and in fp16 against the CPU reference (tests/cuda/test_attention.c), and
#      the fp16 training tests, among them gpu.fp16_loss_curve_flash: 30 steps of fp16 + flash
#      against the CPU's fp32 curve;
#   3. measures (unless ZT_FLASH_FP16_BENCH=0, or past ZT_FLASH_FP16_DEADLINE seconds, default 420):
#      the attention plugin's GPU time per micro-batch (ZT_CUDA_PROFILE=1) and tok/s of the 1b model
#      (head dim 128) and 125m (head dim 64) in bf16 + flash, fp16 + flash and fp16 + naive.
# Logs go to $OUT (set by the device tool) or out/flash-fp16. Exit status: 0 when every test passed.
# The example tasks come tokenized from .deps/gpu-data/examples (carry .deps: GPU machines lack
# libsentencepiece), as for scripts/gpu.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-$PWD/out/flash-fp16}
build=build-gpu
mkdir -p "$out"
nvidia-smi -L 2>&1 | head -n 2

configure=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DZT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
if [ ! -f /usr/include/jsmn.h ] && [ -f .deps/include/jsmn.h ]; then
    configure+=("-DJSMN_INCLUDE_DIR=$PWD/.deps/include")
fi
if ! cmake -S . -B "$build" "${configure[@]}" >"$out/build.log" 2>&1; then
    tail -n 40 "$out/build.log"; echo "flash_fp16_h200.sh: configure failed"; exit 1
fi
if ! cmake --build "$build" -j "$(nproc)" -- -k 0 >>"$out/build.log" 2>&1; then
    grep -E "error|FAILED" "$out/build.log" | head -n 30
    echo "flash_fp16_h200.sh: some targets failed to build; testing what built"
fi
echo "built at $SECONDS s"

[ -f .deps/gpu-data/examples/manifest.json ] && export ZT_GPU_TEST_DATA=$PWD/.deps/gpu-data/examples
[ -n "${ZT_GPU_TEST_DATA:-}" ] || echo "NOTE: no .deps/gpu-data/examples: the loss-curve tests will skip"
ctest --test-dir "$build" -R "cuda.attention|fp16" -j 2 --verbose --timeout 300 >"$out/ctest.log" 2>&1
status=$?
grep -E "tests passed|Test +#|SKIP" "$out/ctest.log"
# the largest measured error of each flash output per type (tolerances: bf16 1.5e-2, fp16 2e-3), and the
# fp16 + flash loss curve against the CPU
grep -E "^[0-9]+: (ok|FAIL) +(o|dq|dk|dv) \((bf16|fp16)\): rel L2 error" "$out/ctest.log" |
    awk '{k = $3 " " $4; if (!(k in m) || $8 + 0 > m[k]) m[k] = $8 + 0}
         END {for (k in m) printf "largest rel L2 error, %s %g\n", k, m[k]}' | sort
grep -E "^[0-9]+: largest relative" "$out/ctest.log" | head -n 6
[ $status -eq 0 ] || grep -E "FAIL|expected|zt-run: error|error:" "$out/ctest.log" | head -n 40
echo "tests done at $SECONDS s (full log: $out/ctest.log)"

if [ "${ZT_FLASH_FP16_BENCH:-1}" != 0 ]; then
    steps=8 # as bench/gpu/profile.sh: 2 warm-up micro-batches, 5 profiled
    data=$out/random-32000-512-$((16 * steps))
    "$build/bin/zt-bench-random-data" "$data" 32000 512 $((16 * steps)) >/dev/null 2>&1 ||
        echo "flash_fp16_h200.sh: making random data failed"
    for model in 1b 125m; do
        for config in "bf16 flash" "fp16 flash" "fp16 naive"; do
            [ $SECONDS -lt "${ZT_FLASH_FP16_DEADLINE:-420}" ] || { echo "deadline: skipping $model $config"; continue; }
            set -- $config
            dtype=(--set bf16.enabled=true --set fp16.enabled=false)
            [ "$1" = fp16 ] && dtype=(--set bf16.enabled=false --set fp16.enabled=true)
            log=$out/$model-$1-$2.log
            ZT_CUDA_PROFILE=1 "$build/bin/zt-run" --data "$data" --output-dir "$out/run-$model-$1-$2" \
                --plugins "$2" --set device=cuda "${dtype[@]}" --set model.preset="$model" \
                --set model.vocab_size=32000 --set train_micro_batch_size_per_gpu=16 --set data.seq_len=512 \
                --set steps=$steps --set scheduler.type=constant --set optimizer.params.lr=1e-5 \
                --set gradient_clipping=0 --set data.shuffle=false --set checkpoint.final=false --set log.every=1 \
                >"$log" 2>&1 || { tail -n 5 "$log"; echo "flash_fp16_h200.sh: zt-run $model $config failed"; status=1; }
            printf '%-5s %-4s %-5s | %s\n' "$model" "$1" "$2" \
                "$(grep -E "step $steps/$steps" "$log" | grep -oE "loss [0-9.]+|[0-9.]+[kM]? tok/s" | tr '\n' ' ')"
            grep -E "^ *attention (forward|backward)" "$log" | sed 's/^/      /'
        done
    done
fi
echo "flash_fp16_h200.sh: done at $SECONDS s, status $status"
exit $status
