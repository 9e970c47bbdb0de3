#!/usr/bin/env bash
# Tensor and pipeline parallelism on GPU ranks, all on one GPU: NCCL refuses two ranks on one device,
# so the ranks' collectives go through MPI (comm.backend = mpi, every buffer staged through host
# memory, dist/comm_host_staged.c) while the units compute on the GPU in bf16 exactly as they do under
# NCCL. Each layout trains 3 steps of the same global batch (4 sequences) as the 1-GPU run:
#   tp2, tp4 (2 KV heads: each replicated on 2 ranks), tp2 with recompute, dp2 x tp2 under ZeRO-3,
#   pp2 under ZeRO-1 and ZeRO-3, tp2 x pp2;
# per-step losses and gradient norms, and every tensor of the --export, against the 1-GPU run within
# bf16 tolerances (parallel_compare.py states them), and each run's log must show its layout.
#   parallel_one_gpu.sh ZT_RUN ZT_PREP CUDA_DEVICES MPIEXEC SOURCE_DIR WORK_DIR
set -u
zt_run=$1 zt_prep=$2 cuda_devices=$3 mpiexec=$4 src=$5 work=$6
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the exports"
devices=$("$cuda_devices")
[ $? -eq 77 ] && skip "${devices#SKIP: }"
out=$work/parallel_one_gpu
rm -rf "$out"
mkdir -p "$out"
if [ -n "${ZT_GPU_TEST_DATA:-}" ]; then
    data=$ZT_GPU_TEST_DATA
else
    data=$out/data
    "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$data" \
        --val-fraction 0.05 --seed 0 --no-progress >"$out/prep.log" 2>&1 ||
        skip "zt-prep cannot tokenize the example tasks here; set ZT_GPU_TEST_DATA (run_gpu_test.sh says how)"
fi
# heads of 64 (the flash kernels' fast path), 2 KV heads, 4 layers, untied head (a pipeline needs it)
common=(--data "$data" --set device=cuda --set model.hidden_size=256
        --set model.intermediate_size=512 --set model.num_hidden_layers=4 --set model.num_attention_heads=4
        --set model.num_key_value_heads=2 --set model.tie_word_embeddings=false --set data.seq_len=128
        --set data.mode=padded --set threads=2 --set log.every=1 --set optimizer.params.lr=3e-3 --set seed=7
        --set steps=3 --set checkpoint.final=false --set comm.backend=mpi)
one_dp=(--set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=2)
two_dp=(--set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=2)
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} # every rank on the one GPU

run() { # run RANKS NAME LOG_NEEDLE ARGS...
    local ranks=$1 name=$2 needle=$3
    shift 3
    local cmd=("$zt_run")
    [ "$ranks" -gt 1 ] && cmd=("$mpiexec" -np "$ranks" --oversubscribe --allow-run-as-root -x CUDA_VISIBLE_DEVICES
                               "$zt_run")
    expect_ok "$needle" -- "${cmd[@]}" "${common[@]}" --output-dir "$out/$name" --export "$out/$name/hf" \
        --export-dtype fp32 "$@"
}

compare() {
    python3 "$here/parallel_compare.py" "$out/reference" "$out/$1" "$1" || zt_failures=$((zt_failures + 1))
}

run 1 reference "step 3" "${one_dp[@]}" --plugins flash,zero0
run 2 tp2 "tensor-parallel rank" "${one_dp[@]}" --plugins flash --set parallel_config.model_parallel=2
compare tp2
run 4 tp4 "(replicated)" "${one_dp[@]}" --plugins flash --set parallel_config.model_parallel=4
compare tp4
run 2 tp2_recompute "tensor-parallel rank" "${one_dp[@]}" --plugins flash --set parallel_config.model_parallel=2 --set recompute=true
compare tp2_recompute
run 4 dp2_tp2_zero3 "tensor-parallel rank" "${two_dp[@]}" --set parallel_config.model_parallel=2 --plugins flash,zero3
compare dp2_tp2_zero3
run 2 pp2_zero1 "pipeline stage" "${one_dp[@]}" --set parallel_config.pipeline_stage=2 --plugins flash,zero1
compare pp2_zero1
run 2 pp2_zero3 "pipeline stage" "${one_dp[@]}" --set parallel_config.pipeline_stage=2 --plugins flash,zero3
compare pp2_zero3
run 4 tp2_pp2 "pipeline stage" "${one_dp[@]}" --plugins flash --set parallel_config.model_parallel=2 \
    --set parallel_config.pipeline_stage=2
compare tp2_pp2
finish
