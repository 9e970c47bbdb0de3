#!/usr/bin/env bash
# The llama plugin's fused CUDA path end to end (docs/cuda.md, "Fused q/k/v and gate/up"):
#   llama_fused_gpu.sh ZT_RUN ZT_PREP SOURCE_DIR WORK_DIR
# - the same 8 steps on the CPU (fp32), on the GPU with the fused GEMMs (the default) and on the GPU
#   with ZT_CUDA_FUSE=0 (separate q, k, v and gate, up GEMMs): both GPU loss curves follow the CPU one
#   (first step within 1e-2, later ones within 5e-2, as gpu.train_loss_curve) and each other (2e-2);
# - ZT_CUDA_PROFILE=1 prints the per-op table, with the fused op names in the first GPU run and the
#   separate ones in the second (so each run really took the path it claims);
# - a bad ZT_CUDA_PROFILE value is refused with a message; a window after the last step says so.
# Skips (exit 77) where zt-run finds no CUDA device. Data: $ZT_GPU_TEST_DATA (scripts/gpu.sh sets it)
# or the example tasks tokenized with ZT_PREP.
set -u
zt_run=$1 zt_prep=$2 src=$3 out=$4
. "$src/tests/lib.sh"
rm -rf "$out" && mkdir -p "$out"

if [ -n "${ZT_GPU_TEST_DATA:-}" ]; then
    DATA=$ZT_GPU_TEST_DATA
else
    DATA=$out/data
    "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$DATA" \
        --val-fraction 0.05 --seed 0 --no-progress >"$out/prep.log" 2>&1 ||
        skip "zt-prep cannot tokenize the example tasks here ($(tail -n 1 "$out/prep.log")); set ZT_GPU_TEST_DATA"
fi

# Heads of 64 (flash kernels), GQA (4 query heads on 2 kv heads), packed rows: as gpu.train_loss_curve.
run=(--data "$DATA" --set model.hidden_size=256 --set model.intermediate_size=512 --set model.num_hidden_layers=2
     --set model.num_attention_heads=4 --set model.num_key_value_heads=2 --set data.seq_len=128
     --set train_micro_batch_size_per_gpu=8 --set threads=8 --set log.every=1000 --set optimizer.params.lr=3e-3
     --set scheduler.params.warmup_num_steps=5 --set steps=8 --set checkpoint.final=false)
gpu=(--set device=cuda --plugins flash)

probe=$("$zt_run" "${run[@]}" "${gpu[@]}" --set steps=1 --output-dir "$out/probe" 2>&1)
if [ $? -ne 0 ] && grep -q "no CUDA device" <<<"$probe"; then
    skip "no CUDA device: $(grep -m1 "no CUDA device" <<<"$probe")"
fi

expect_ok -- "$zt_run" "${run[@]}" --set device=cpu --output-dir "$out/cpu"
ZT_CUDA_PROFILE=1 ZT_CUDA_PROFILE_WARMUP=2 ZT_CUDA_PROFILE_STEPS=3 \
    expect_ok "ZT_CUDA_PROFILE: llama GPU time by op over 3 training micro-batches" \
              "q|k|v_proj forward (one GEMM)" "q|k|v_proj backward (one GEMM)" \
              "q|k|v_proj weight gradient (one GEMM)" "gate|up_proj forward (one GEMM)" \
              "gate|up_proj backward (one GEMM)" "gate|up_proj weight gradient (one GEMM)" \
              "rope forward (q, k; v copied)" "attention forward (plugin)" "attention backward (plugin)" \
              "o_proj forward + residual" "input_layernorm backward + residual" "LM head loss" \
              "outside the model" "(no op timed" "window" \
              -- "$zt_run" "${run[@]}" "${gpu[@]}" --output-dir "$out/fused"
echo "$ZT_OUT" >"$out/fused.log"
if grep -qE "^(q_proj|gate_proj) forward " <<<"$ZT_OUT"; then
    echo "FAIL: the fused run timed separate projections"; zt_failures=$((zt_failures + 1))
fi
grep -A40 "ZT_CUDA_PROFILE: llama GPU time" <<<"$ZT_OUT" | head -n 45

ZT_CUDA_FUSE=0 ZT_CUDA_PROFILE=1 ZT_CUDA_PROFILE_WARMUP=2 ZT_CUDA_PROFILE_STEPS=3 \
    expect_ok "ZT_CUDA_FUSE=0" "q_proj forward" "k_proj forward" "v_proj backward" "k_proj weight gradient" \
              "gate_proj forward" "up_proj backward" "up_proj weight gradient" \
              -- "$zt_run" "${run[@]}" "${gpu[@]}" --output-dir "$out/separate"
echo "$ZT_OUT" >"$out/separate.log"
if grep -q "(one GEMM)" <<<"$ZT_OUT"; then
    echo "FAIL: the ZT_CUDA_FUSE=0 run used a fused GEMM"; zt_failures=$((zt_failures + 1))
fi

if ! python3 - "$out/cpu/metrics.jsonl" "$out/fused/metrics.jsonl" "$out/separate/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    with open(path) as f:
        return [r["loss"] for r in map(json.loads, filter(str.strip, f)) if r.get("type") == "train"]
cpu, fused, sep = (losses(p) for p in sys.argv[1:4])
ok = len(cpu) == len(fused) == len(sep) == 8
if not ok:
    print(f"FAIL: expected 8 training records each, got cpu {len(cpu)}, fused {len(fused)}, separate {len(sep)}")
rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)
print("step  cpu loss  fused gpu  separate gpu")
for i, (c, f, s) in enumerate(zip(cpu, fused, sep)):
    tol = 1e-2 if i == 0 else 5e-2
    bad = rel(f, c) > tol or rel(s, c) > tol or rel(f, s) > 2e-2
    print(f"{i + 1:4d}  {c:8.5f}  {f:9.5f}  {s:12.5f}{'  FAIL' if bad else ''}")
    ok = ok and not bad
sys.exit(0 if ok else 1)
PY
then
    zt_failures=$((zt_failures + 1))
fi

ZT_CUDA_PROFILE=yes expect_fail "ZT_CUDA_PROFILE" "not an integer" \
    -- "$zt_run" "${run[@]}" "${gpu[@]}" --set steps=1 --output-dir "$out/bad_env"
ZT_CUDA_PROFILE=1 ZT_CUDA_PROFILE_WARMUP=100 expect_ok "ZT_CUDA_PROFILE: nothing recorded" \
    -- "$zt_run" "${run[@]}" "${gpu[@]}" --set steps=2 --set scheduler.params.warmup_num_steps=1 --output-dir "$out/short"
finish
