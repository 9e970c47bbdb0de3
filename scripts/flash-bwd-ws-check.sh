#!/usr/bin/env bash
# The warp-specialized Hopper flash backward (wgmma-ws, kernels/cuda/flash_backward_sm90_ws.cu,
# auto's backward on Hopper) checked and timed in one call on an H100/H200 of at most 10 minutes: build (sm_90 + sm_90a), test_cuda_attention (every kernel, wgmma-ws included,
# against the CPU reference, dK/dV determinism), compute-sanitizer memcheck of the test with the
# wgmma-ws backward only, zt-bench-flash wgmma vs wgmma-ws (each also checked against the mma
# kernels at the benchmark shape), and run.py's table against PyTorch SDPA with wgmma vs
# wgmma/wgmma-ws. Every step has a time limit (a deadlocked kernel is killed, not waited for); logs
# in $OUT (or out/flash-ws). Exit status non-zero when anything failed.
#   ZT_WS_SANITIZE=0      skip the memcheck step
#   ZT_WS_RACECHECK=1     also racecheck and synccheck (the named-barrier and shared-memory hazards;
#                         slow: only with time to spare)
#   ZT_WS_ITERS=10        iterations per timing (run.py, zt-bench-flash)
#   ZT_WS_PROFILE=1       also Nsight Compute on one launch of each backward kernel at 8 x 2048
#                         (issue slots, tensor pipe, stalls: wgmma's was 29% issue slots)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
start=$SECONDS
out=${OUT:-$PWD/out/flash-ws}
build=${ZT_WS_BUILD_DIR:-build-flash-ws}
iters=${ZT_WS_ITERS:-10}
mkdir -p "$out"
status=0
step() { echo "== $* (t=$((SECONDS - start)) s)"; }

nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
configure=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DZT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
# jsmn.h may be missing on GPU machines: the device tool carries a copy in .deps/include (scripts/gpu.sh)
if [ ! -f /usr/include/jsmn.h ] && [ -f .deps/include/jsmn.h ]; then
    configure+=("-DJSMN_INCLUDE_DIR=$PWD/.deps/include")
fi
step "build"
if ! { cmake -S . -B "$build" "${configure[@]}" &&
       cmake --build "$build" -j "$(nproc)" --target test_cuda_attention zt-bench-flash; } >"$out/build.log" 2>&1; then
    grep -E "error|FAILED" "$out/build.log" | head -n 40
    echo "flash-bwd-ws-check.sh: build failed (full log: $out/build.log)"
    exit 1
fi

# 1. correctness: every shape, every forward, every backward (mma, wgmma, wgmma-ws)
step "test_cuda_attention (all kernels)"
timeout 240 "$build/bin/test_cuda_attention" >"$out/test.log" 2>&1
rc=$?
[ $rc = 0 ] || { status=1; echo "test_cuda_attention: exit status $rc (124: timed out, a hang?)"; }
grep -E "NOTE|FAIL|check failed|flash backward \(wgmma-ws\)" "$out/test.log" | head -n 80
# the wgmma-ws rows with their errors (dq, dk, dv lines follow each backward's line)
grep -A3 "flash backward (wgmma-ws)" "$out/test.log" | grep -E "rel|FAIL" | sort | uniq -c | sort -rn | head -n 8
tail -n 3 "$out/test.log"

# 2. memory errors of the new kernel alone (the forwards still run: they make o and lse)
if [ "${ZT_WS_SANITIZE:-1}" = 1 ]; then
    tools=(memcheck)
    [ "${ZT_WS_RACECHECK:-0}" = 1 ] && tools+=(racecheck synccheck)
    for tool in "${tools[@]}"; do
        step "compute-sanitizer --tool $tool, ZT_TEST_FLASH_BACKWARDS=wgmma-ws"
        ZT_TEST_FLASH_BACKWARDS=wgmma-ws timeout 170 compute-sanitizer --tool "$tool" --error-exitcode 9 \
            --print-limit 20 "$build/bin/test_cuda_attention" >"$out/sanitizer-$tool.log" 2>&1
        rc=$?
        echo "compute-sanitizer $tool: exit status $rc (0 clean, 9 errors found, 124 timed out)"
        [ $rc = 0 ] || [ $rc = 124 ] || status=1
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|Barrier|FAIL" "$out/sanitizer-$tool.log" | head -n 12
    done
fi

# 3. speed: the backward alone is fwd_bwd_ms - fwd_ms (same wgmma forward in all); head dim 128 shapes,
# then the 125m and 1b models' attention (head dim 64)
step "zt-bench-flash: wgmma vs wgmma-ws backward (each checked against the mma kernels)"
for shape in "--batch 4 --seq 4096 --heads 32 --dim 128" "--batch 8 --seq 2048 --heads 32 --dim 128" \
             "--batch 32 --seq 512 --heads 32 --dim 128" "--batch 2 --seq 2048 --heads 32 --kv-heads 8 --dim 128" \
             "--batch 16 --seq 512 --heads 12 --dim 64" "--batch 16 --seq 512 --heads 32 --kv-heads 4 --dim 64"; do
    for bwd in wgmma wgmma-ws; do
        # shellcheck disable=SC2086
        timeout 60 "$build/bin/zt-bench-flash" --kernel wgmma --backward-kernel "$bwd" $shape --iters "$iters" 2>&1 |
            tee -a "$out/bench.log" || status=1
    done
done
python3 - "$out/bench.log" <<'EOF' || true
import sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("zt-flash "):
        continue
    f = dict(x.split("=", 1) for x in line.split()[1:])
    key = (f["batch"], f["seq"], f["heads"], f["kv_heads"], f["dim"])
    rows.setdefault(key, {})[f["backward_kernel"]] = float(f["fwd_bwd_ms"]) - float(f["fwd_ms"])
print("backward ms (fwd_bwd - fwd): batch x seq, heads / kv, dim | wgmma | wgmma-ws | speedup")
for (b, t, h, kv, d), r in rows.items():
    if "wgmma" not in r:
        continue
    cells = [f"{r['wgmma']:.3f}"]
    for k in ("wgmma-ws",):
        cells += [f"{r[k]:.3f}", f"{r['wgmma'] / r[k]:.2f}x"] if k in r else ["failed", ""]
    print(f"  {b} x {t}, {h} / {kv}, {d} | " + " | ".join(cells))
EOF

if [ "${ZT_WS_PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
    step "Nsight Compute: flash_backward_sm90_kernel (wgmma) and flash_backward_sm90_ws_kernel"
    for bwd in wgmma wgmma-ws; do
        kernel=flash_backward_sm90_kernel
        [ $bwd = wgmma-ws ] && kernel=flash_backward_sm90_ws_kernel
        timeout 120 ncu --clock-control none --kernel-name "regex:$kernel" --launch-count 1 \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
            --section LaunchStats "$build/bin/zt-bench-flash" --kernel wgmma --backward-kernel $bwd \
            --batch 8 --seq 2048 --heads 32 --iters 1 >>"$out/profile.log" 2>&1
    done
    grep -E "flash_backward|Duration|Throughput|Pipe|Registers|Issue Slots|Stall|Warp Cycles" "$out/profile.log" | head -n 40
fi

# 4. against PyTorch SDPA (head dim 128 shapes of the issue, and head dim 64)
left=$((570 - (SECONDS - start)))
if [ $left -gt 60 ]; then
    step "run.py: wgmma vs wgmma/wgmma-ws against SDPA (time left $left s)"
    PYTHONUNBUFFERED=1 timeout $left python3 bench/attention/run.py --bench "$build/bin/zt-bench-flash" \
        --kernels wgmma,wgmma/wgmma-ws --iters "$iters" --out "$out/attention.md" 2>&1 | tail -n 12
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
else
    echo "run.py skipped: only $left s left of the 10-minute call"
fi
echo "flash-bwd-ws-check.sh: status $status (t=$((SECONDS - start)) s)"
exit $status
