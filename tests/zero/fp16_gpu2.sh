#!/usr/bin/env bash
# fp16 with dynamic loss scaling under ZeRO on GPUs: stages 2 and 3 (and stage 2 with the optimizer
# offloaded to the CPU, whose AdamW must skip too) on 2 GPUs against stage 2 on 1 GPU, with the same
# global batch. The loss scale starts at 2^28, so the first steps overflow: every rank must skip the
# same steps and move the scale identically (the skip follows the all-reduced gradient norm); the
# loss_scale and skipped sequences must equal the 1-GPU run's exactly, the losses agree within 2e-2
# relative per step and the final weights within 1e-2 relative L2 per tensor (the tolerances of
# gpu2.sh: two partial gradient sums added by NCCL differ in the last bits from one).
#
#   tests/zero/fp16_gpu2.sh BUILD_DIR
#
# Data: $ZT_GPU_TEST_DATA (the example tasks tokenized; scripts/gpu.sh sets it) or zt-prep here.
# Exit 0: passed; 1: failures (printed); 77: skipped (fewer than 2 GPUs, no NCCL module).
set -uo pipefail
build=${1:?usage: tests/zero/fp16_gpu2.sh BUILD_DIR}
build=$(cd "$build" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
zt_run=$build/bin/zt-run zt_prep=$build/bin/zt-prep devices_bin=$build/bin/zt-cuda-devices
[ -x "$devices_bin" ] || devices_bin=$build/bin/zt-fp16-cuda-devices
out=${OUT:-$build}/zero-fp16-gpu2
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the lent machines
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
skip() { echo "SKIP: $*"; exit 77; }

for f in "$zt_run" "$devices_bin"; do
    [ -x "$f" ] || { echo "FAIL: $f is not built (build everything: scripts/gpu.sh)"; exit 1; }
done
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"
n_gpus=$("$devices_bin")
[ $? -eq 77 ] && skip "${n_gpus#SKIP: }"
[ "${n_gpus%% *}" -ge 2 ] 2>/dev/null || skip "2 GPUs are needed, this machine has $n_gpus"
ls "$build"/lib/zt/libzt-comm-nccl.so >/dev/null 2>&1 || skip "the NCCL module (lib/zt/libzt-comm-nccl.so) is not built"
rm -rf "$out" && mkdir -p "$out"
if [ -n "${ZT_GPU_TEST_DATA:-}" ]; then
    data=$ZT_GPU_TEST_DATA
else
    data=$out/data
    "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$data" \
        --val-fraction 0.05 --seed 0 --no-progress >"$out/prep.log" 2>&1 ||
        skip "zt-prep cannot tokenize the example tasks here; set ZT_GPU_TEST_DATA (docs/gpu.md)"
fi

common=(--data "$data" --set device=cuda --set fp16.enabled=true --set bf16.enabled=false
        --set fp16.initial_scale_power=28 --set model.hidden_size=256 --set model.intermediate_size=512
        --set model.num_hidden_layers=4 --set model.num_attention_heads=4 --set model.num_key_value_heads=2
        --set model.tie_word_embeddings=true --set data.seq_len=128 --set data.mode=padded --set threads=4
        --set log.every=1 --set optimizer.params.lr=3e-3 --set seed=7 --set steps=16 --set gradient_clipping=1.0
        --set checkpoint.final=false)

# run NAME RANKS STAGE [ARGS...]: global batch 8 (8 x 1 rank, 4 x 2 ranks).
run() {
    local name=$1 ranks=$2 stage=$3
    shift 3
    local dir=$out/$name launch=()
    [ "$ranks" -gt 1 ] && launch=(--nproc "$ranks")
    echo "== $name: fp16, stage $stage on $ranks GPU(s)"
    if ! "$zt_run" "${launch[@]}" "${common[@]}" --plugins "naive,zero$stage" \
            --set train_micro_batch_size_per_gpu=$((8 / ranks)) --output-dir "$dir" --export "$dir/hf" --export-dtype fp32 "$@" \
            >"$dir.log" 2>&1; then
        tail -n 30 "$dir.log"
        fail "$name: zt-run failed (log: $dir.log)"
    fi
}

run g1-s2 1 2
run g2-s2 2 2
run g2-s3 2 3
run g2-s2-offload 2 2 --set zero_optimization.offload_optimizer.device=cpu
run g1-s3-offload 1 3 --set zero_optimization.offload_optimizer.device=cpu --set zero_optimization.offload_param.device=cpu

python3 - "$out" <<'PY' || failures=$((failures + 1))
import json, struct, sys
import numpy as np

out = sys.argv[1]
bad = []


def records(name):
    with open(f"{out}/{name}/metrics.jsonl") as f:
        return [r for r in (json.loads(line) for line in f) if r.get("type") == "train"]


def weights(name):
    with open(f"{out}/{name}/hf/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    dtypes = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}
    result = {}
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        x = np.frombuffer(body[a:b], dtype=dtypes[meta["dtype"]])
        if meta["dtype"] == "BF16":
            x = (x.astype(np.uint32) << 16).view(np.float32)
        result[key] = x.astype(np.float64)
    return result


ref = records("g1-s2")
skips = [r["step"] for r in ref if r["skipped"]]
if not skips or len(ref) - len(skips) < 4:
    bad.append(f"g1-s2: {len(skips)} skipped steps of {len(ref)}: the test needs overflows first, then training")
print(f"g1-s2: skipped steps {skips}, loss scales {[r['loss_scale'] for r in ref]}")
for run in ("g2-s2", "g2-s3", "g2-s2-offload", "g1-s3-offload"):
    try:
        got = records(run)
    except OSError as e:
        bad.append(f"{run}: {e}")
        continue
    if [(r["step"], r["skipped"], r["loss_scale"]) for r in got] != [(r["step"], r["skipped"], r["loss_scale"]) for r in ref]:
        bad.append(f"{run}: (step, skipped, loss_scale) {[(r['step'], r['skipped'], r['loss_scale']) for r in got]} "
                   f"differ from g1-s2's {[(r['step'], r['skipped'], r['loss_scale']) for r in ref]}")
        continue
    worst = 0.0
    for x, y in zip(ref, got):
        rel = abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-12)
        worst = max(worst, rel)
        if not rel <= 2e-2:
            bad.append(f"{run}: step {x['step']} loss {y['loss']} vs {x['loss']} (relative {rel:.3g} > 2e-2)")
    applied = [r for r in got if not r["skipped"]]
    if not applied or not applied[-1]["loss"] < applied[0]["loss"]:
        bad.append(f"{run}: the loss did not fall over the applied steps")
    wa, wb = weights("g1-s2"), weights(run)
    worst_w = 0.0
    for k in wa:
        rel = float(np.linalg.norm(wa[k] - wb[k]) / max(np.linalg.norm(wa[k]), 1e-30))
        worst_w = max(worst_w, rel)
        if not rel <= 1e-2:
            bad.append(f"{run}: {k} relative L2 {rel:.3g} > 1e-2 against g1-s2")
    print(f"{run} vs g1-s2: same skips and scales; largest loss difference {worst:.2e}, weight rel L2 {worst_w:.2e}")
for b in bad:
    print("FAIL: " + b)
sys.exit(1 if bad else 0)
PY
[ "$failures" -eq 0 ] && echo "fp16 ZeRO on 2 GPUs: passed" && exit 0
echo "$failures failure(s)"
exit 1
