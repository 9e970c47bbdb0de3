#!/usr/bin/env bash
# GPU memory: the estimator (zt-run --dry-run) against what a GPU run allocates, and the 24 GB-card
# scenario (docs/zero.md, "The memory estimator"). Needs one GPU (of any size: --gpu-mem-limit makes
# zt's allocator behave like a 24 GiB card) and, for the 7B offload run, about 120 GiB of host memory
# (the estimate's host total is checked first: the 2-GPU machine has it, the 1-GPU one may not).
#
#   tests/zero/mem_gpu.sh BUILD_DIR [refuse] [train7b] [peaks]     (no part named: all three)
#
#   refuse   7B, zero2 + offload_optimizer, b8x512 without recompute, --gpu-mem-limit 24G: must stop
#            within 60 s, before allocating, naming the pool that overflows, the estimate and zero3 with
#            offload_param and offload_optimizer as the configuration that fits
#   train7b  that configuration under the same 24G cap: must train 3 steps, peak under 24 GiB
#   peaks    1.1B b16x512 on one GPU, zero0..zero3 (and zero0 with step_in_backward): each pool's
#            measured peak (metrics.jsonl, mem_device) against the estimate; ratio printed, within 10%
#            required for params, grads, optimizer, activations and comm. The workspace ratio is
#            printed only: the estimate also counts the kernel context's scratch and cuBLASLt's
#            workspace, which zt's pools do not see.
# Exit 0: every part passed; 1: a failure (each is printed); 77: no GPU (ctest: skipped).
set -uo pipefail
build=${1:?usage: tests/zero/mem_gpu.sh BUILD_DIR [refuse] [train7b] [peaks]}
shift
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(refuse train7b peaks)
for part in "${parts[@]}"; do
    case $part in
    refuse | train7b | peaks) ;;
    *) echo "FAIL: unknown part '$part': refuse, train7b or peaks"; exit 2 ;;
    esac
done
[ -d "$build" ] || { echo "FAIL: build directory '$build' does not exist"; exit 1; }
build=$(cd "$build" && pwd)
zt_run=$build/bin/zt-run
random_data=$build/bin/zt-bench-random-data
out=${OUT:-$build}/mem-gpu
export NCCL_NVLS_ENABLE=0
failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIP: no CUDA device (nvidia-smi -L failed)"
    exit 77
fi
for f in "$zt_run" "$random_data"; do
    [ -x "$f" ] || { echo "FAIL: $f is not built (build everything: scripts/gpu.sh)"; exit 1; }
done
mkdir -p "$out"

# data ROWS: random tokens (vocab 32000, seq 512), as bench/gpu uses.
data() {
    local dir=$out/random-$1
    [ -f "$dir/manifest.json" ] || "$random_data" "$dir" 32000 512 "$1" >/dev/null || return 1
    echo "$dir"
}

# common MODEL BATCH STEPS: the settings every run here shares.
common() {
    echo --set device=cuda --set model.preset="$1" --set model.vocab_size=32000 \
        --set train_micro_batch_size_per_gpu="$2" --set data.seq_len=512 --set steps="$3" \
        --set scheduler.type=constant --set optimizer.params.lr=1e-5 --set data.shuffle=false \
        --set checkpoint.final=false --set log.every=1
}

classic=(--plugins "flash,zero2" --set zero_optimization.offload_optimizer.device=cpu --set recompute=false
         --gpu-mem-limit 24G)
fitting=(--plugins "flash,zero3" --set zero_optimization.offload_optimizer.device=cpu
         --set zero_optimization.offload_param.device=cpu --set recompute=false --gpu-mem-limit 24G)

refuse() {
    local d start log=$out/refuse.log
    d=$(data 24) || { fail "refuse: cannot write the random data"; return; }
    start=$SECONDS
    # shellcheck disable=SC2046
    "$zt_run" --data "$d" --output-dir "$out/refuse" $(common 7b 8 3) "${classic[@]}" >"$log" 2>&1
    local rc=$? took=$((SECONDS - start))
    cat "$log"
    [ "$rc" -ne 0 ] || fail "refuse: 7B zero2 + optimizer offload under 24G trained instead of stopping"
    [ "$took" -le 60 ] || fail "refuse: took ${took}s to stop, expected under 60 s (the check runs before allocating)"
    local want
    for want in "out of GPU memory, found before allocating anything" "more than the gpu_mem_limit of 24.0 GiB" \
        "pool '" "Estimate per GPU: params" \
        "A configuration that fits: zero3 with offload_param.device=cpu and offload_optimizer.device=cpu"; do
        grep -qF -- "$want" "$log" || fail "refuse: '$want' missing from the message ($log)"
    done
    echo "refuse: stopped in ${took}s with exit $rc"
}

train7b() {
    local d log=$out/train7b.log dir=$out/train7b
    d=$(data 24) || { fail "train7b: cannot write the random data"; return; }
    # Host memory first: the estimate says how much pinned memory the offloaded state takes.
    # shellcheck disable=SC2046
    "$zt_run" --data "$d" --output-dir "$dir" $(common 7b 8 3) "${fitting[@]}" --dry-run >"$log" 2>&1 ||
        { cat "$log"; fail "train7b: the dry run of the fitting configuration failed"; return; }
    local need avail
    need=$(python3 -c 'import json,sys; r=[r for r in json.load(open(sys.argv[1]))["rows"] if r["chosen"]][0]; print(int(r["host"]["total"]/2**30)+8)' "$dir/memory-estimate.json")
    avail=$(awk '/MemAvailable/ {print int($2/1048576)}' /proc/meminfo)
    if [ "$avail" -lt "$need" ]; then
        fail "train7b: needs about $need GiB of host memory (estimate + 8), this machine has $avail GiB available: run on nvidia-h200-x2"
        return
    fi
    # shellcheck disable=SC2046
    if ! "$zt_run" --data "$d" --output-dir "$dir" $(common 7b 8 3) "${fitting[@]}" >>"$log" 2>&1; then
        tail -n 30 "$log"
        fail "train7b: 7B zero3 with both offloads under 24G did not train (log: $log)"
        return
    fi
    python3 - "$dir/metrics.jsonl" "$dir/memory-estimate.json" <<'EOF' || fail "train7b: see above"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
est = [r for r in json.load(open(sys.argv[2]))["rows"] if r["chosen"]][0]["device"]["total"]
peak = max(r["mem_device"]["total"]["peak"] for r in recs)
print(f"train7b: {len(recs)} steps, losses {[round(r['loss'], 3) for r in recs]}, device pools peak "
      f"{peak / 2**30:.2f} GiB (estimate {est / 2**30:.2f} GiB, cap 24 GiB)")
sys.exit(0 if len(recs) == 3 and peak <= 24 * 2**30 else 1)
EOF
}

peaks() {
    local d n extra name
    d=$(data 48) || { fail "peaks: cannot write the random data"; return; }
    for name in zero0 zero1 zero2 zero3 zero0-sib; do
        n=${name%%-*}
        extra=(--set gradient_clipping=1.0)
        [ "$name" = zero0-sib ] && extra=(--set gradient_clipping=0)
        local dir=$out/peaks-$name log=$out/peaks-$name.log
        # shellcheck disable=SC2046
        if ! "$zt_run" --data "$d" --output-dir "$dir" $(common 1b 16 3) --plugins "flash,$n" \
                --set recompute=false "${extra[@]}" >"$log" 2>&1 ||
           ! "$zt_run" --data "$d" --output-dir "$dir" $(common 1b 16 3) --plugins "flash,$n" \
                --set recompute=false "${extra[@]}" --dry-run >>"$log" 2>&1; then
            tail -n 20 "$log"
            fail "peaks: 1.1B $name did not run (log: $log)"
            continue
        fi
        python3 - "$name" "$dir/metrics.jsonl" "$dir/memory-estimate.json" <<'EOF' || fail "peaks: $name: see above"
import json, sys
name, metrics, estimate = sys.argv[1:4]
recs = [json.loads(l) for l in open(metrics) if '"train"' in l]
est = [r for r in json.load(open(estimate))["rows"] if r["chosen"]][0]["device"]
bad, cells = [], []
for pool in ("params", "grads", "optimizer", "activations", "comm", "workspace", "total"):
    got = max(r["mem_device"][pool]["peak"] for r in recs)
    want = est[pool]
    ratio = got / want if want else (1.0 if got == 0 else float("inf"))
    cells.append(f"{pool} {got / 2**30:.2f}/{want / 2**30:.2f} GiB = {ratio:.2f}")
    if pool not in ("workspace", "total") and abs(ratio - 1) > 0.10:
        bad.append(pool)
print(f"peaks 1.1B {name}: measured/estimate: " + "; ".join(cells))
if bad:
    print(f"FAIL: peaks 1.1B {name}: {', '.join(bad)} more than 10% from the estimate")
sys.exit(1 if bad else 0)
EOF
    done
}

for part in "${parts[@]}"; do
    $part
done
[ $failures -eq 0 ] && echo "mem_gpu: all parts passed (${parts[*]})" && exit 0
echo "mem_gpu: $failures failure(s)"
exit 1
