#!/usr/bin/env bash
# ZeRO stages 0-3 end to end through zt-run, on 1, 2 and 4 CPU ranks (Open MPI's mpirun). One test per
# call:
#   run_test.sh ZT_RUN ZT_PREP MPIEXEC SOURCE_DIR WORK_DIR TEST
# prepare runs first (ctest fixture zero_data): the bundled example tasks tokenized by zt-prep, and the
# references every other test compares with: 1 rank, stage 0, the same global batch.
#
# The model is small and shaped so that nothing divides evenly: hidden 50 (5 heads of 10, one
# key/value head), MLP 70, 2 layers, the LM head tied to the embedding. Its norm weights (50) and
# projections (500, 2500, 3500 elements) do not split into 4 equal parts, the layer units are padded
# for 4 ranks, and the head unit (the final norm alone) leaves 4 ranks a 16-element slice each, the
# last three of padding only. Every run sees the same global batch of 8 sequences of 64 tokens per
# step: 1 rank x 4 x 2 micro-batches, 2 ranks x 2 x 2, 4 ranks x 1 x 2 (data.mode padded: rank r of w
# takes samples r, r + w, ..., so the 8 samples of a step are the same whatever w).
set -u
zt_run=$1 zt_prep=$2 mpiexec=$3 src=$4 work=$5 test=$6
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"

data=$work/data
ref=$work/reference
out=$work/$test
model=(--set model.hidden_size=50 --set model.intermediate_size=70 --set model.num_hidden_layers=2
       --set model.num_attention_heads=5 --set model.num_key_value_heads=1 --set model.tie_word_embeddings=true)
common=(--data "$data" "${model[@]}" --set data.seq_len=64 --set data.mode=padded --set threads=1
        --set log.every=1000 --set optimizer.params.lr=3e-3 --set seed=7)
# The same global batch on each rank count.
batch_of=([1]="--set train_micro_batch_size_per_gpu=4 --set gradient_accumulation_steps=2"
          [2]="--set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=2"
          [4]="--set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=2")
# Pieces of 1000 elements: every unit but the head is reduced and gathered through the staging buckets.
small_buckets=(--set zero_optimization.reduce_bucket_size=1000 --set zero_optimization.allgather_bucket_size=1000)

freeze_check() {
    if ! python3 "$here/freeze_check.py" "$@"; then
        zt_failures=$((zt_failures + 1))
    fi
}

compare() {
    if ! python3 "$here/compare.py" "$@"; then
        zt_failures=$((zt_failures + 1))
    fi
}

# CMD: zt-run on N ranks (N = 1: no mpirun) with that rank count's batch; append zt-run arguments.
# `zt_on N one-process`: the batch of N ranks in a single process (for --dry-run --nproc N).
zt_on() {
    local ranks=$1 batch
    CMD=()
    if [ "$ranks" -gt 1 ] && [ "${2:-}" != one-process ]; then
        CMD=("$mpiexec" -np "$ranks" --oversubscribe --allow-run-as-root)
    fi
    read -ra batch <<<"${batch_of[$ranks]}"
    CMD+=("$zt_run" "${common[@]}" "${batch[@]}")
}

train() {
    zt_on "$1"
    shift
    expect_ok -- "${CMD[@]}" "$@"
}

# The output of the last command holds `text`.
output_has() {
    grep -qF -- "$1" <<<"$ZT_OUT" && return
    echo "FAIL: expected '$1' in the output"
    echo "$ZT_OUT"
    zt_failures=$((zt_failures + 1))
}

prepare() {
    [ -x "$zt_prep" ] || skip "zt-prep is not built"
    rm -rf "$data" "$ref" "$ref-untied" "$ref-frozen"
    mkdir -p "$work"
    expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" \
        -o "$data" --val-fraction 0.05 --seed 0 --no-progress
    train 1 --plugins zero0 --output-dir "$ref" --set steps=4 --export "$ref/hf" --export-dtype fp32
    train 1 --plugins zero0 --output-dir "$ref-untied" --set steps=4 --set model.tie_word_embeddings=false \
        --export "$ref-untied/hf" --export-dtype fp32
    # the frozen reference: from the reference's trained weights, 1 rank, stage 0, FREEZE
    freeze_train 1 --plugins zero0 --output-dir "$ref-frozen" --set steps=3 --export "$ref-frozen/hf"
}

# Freezing: the trainable set of freeze_check.py (layer 1's q_proj and MLP, the final norm), as the seed
# writes it (a list, names without "model.", a glob); the embedding (with the tied head) and layer 0
# are frozen whole, so the backward stops at layer 1, which is frozen only in part. Runs start from the
# reference's exported weights, so a frozen tensor must end with exactly those bytes.
FREEZE='trainable_params=["layers.1.mlp.*", "layers.1.self_attn.q_proj", "model.norm"]'
FREEZE_TRAINED=model.layers.1.self_attn.q_proj.weight,model.layers.1.mlp.gate_proj.weight
FREEZE_TRAINED+=,model.layers.1.mlp.up_proj.weight,model.layers.1.mlp.down_proj.weight,model.norm.weight
freeze_command() {
    zt_on "$@"
    local at
    # --model gives the shape: drop the model.* settings of common
    for at in "${!CMD[@]}"; do
        [[ ${CMD[$at]} == model.* ]] && unset "CMD[$at]" "CMD[$((at - 1))]"
    done
    CMD=("${CMD[@]}" --model "$ref/hf" --set "$FREEZE")
}
freeze_train() {
    freeze_command "$1"
    shift
    expect_ok -- "${CMD[@]}" "$@"
}

# Stage N with FREEZE on 1 and 2 ranks: the losses and weights of the 1-rank stage-0 frozen reference,
# the frozen tensors bit for bit their starting bytes, rank 0's gradient and optimizer pools exactly
# the trainable parameters' bytes (freeze_check.py computes them from the shapes), and every measured
# pool within 10% of zt-run --dry-run for the same command.
freeze_stage() {
    local stage=$1 ranks # not n: expect_ok loops over its needles with n
    for ranks in 1 2; do
        local dir=$out/ranks$ranks
        if [ "$stage" -gt 0 ] || [ "$ranks" -gt 1 ]; then
            freeze_train "$ranks" --plugins "zero$stage" --output-dir "$dir" --set steps=3 --export "$dir/hf"
            compare same-run "$ref-frozen" "$dir"
        else
            dir=$ref-frozen
        fi
        freeze_check frozen-bits "$ref/hf" "$dir/hf" "$FREEZE_TRAINED"
        freeze_check pools "$dir/metrics.jsonl" "$stage" "$ranks"
        freeze_command "$ranks" one-process
        expect_ok "58850 parameters (13050 trainable: the frozen ones cost only their compute copy, and the backward stops" -- \
            "${CMD[@]}" --plugins "zero$stage" --output-dir "$out/dry$ranks" --set steps=3 --dry-run --nproc "$ranks"
        compare memory "$out/dry$ranks/memory-estimate.json" "$dir/metrics.jsonl"
    done
}
freeze_stage0() { freeze_stage 0; }
freeze_stage1() { freeze_stage 1; }
freeze_stage2() { freeze_stage 2; }
freeze_stage3() { freeze_stage 3; }

# Freezing's bad settings: a pattern that matches nothing, list items that are not patterns, and a
# configuration that leaves nothing to train, each named with what to do.
freeze_errors() {
    local run=("$zt_run" "${common[@]}" --output-dir "$out/x" --set steps=1)
    expect_fail 'trainable_params: the pattern "layers.7" matches no parameter of the model' \
        'the model'"'"'s parameters are "model.embed_tokens.weight"' -- "${run[@]}" --set 'trainable_params=["layers.1", "layers.7"]'
    expect_fail 'pet_config.freeze_include: the pattern "*.lora_A.*" matches no parameter' -- \
        "${run[@]}" --set 'pet_config.freeze_include=["*.lora_A.*"]'
    expect_fail "'pet_config.freeze_exclude' item 2 must be a non-empty parameter-name pattern without commas, got" \
        "number 3" -- "${run[@]}" --set 'pet_config.freeze_exclude=["q_proj", 3]'
    expect_fail "'pet_config.freeze_include' item 1 must be a non-empty parameter-name pattern without commas" -- \
        "${run[@]}" --set 'pet_config.freeze_include=["q_proj,k_proj"]'
    mkdir -p "$out"
    local bad
    for bad in '{"a": 1}' true; do
        printf '{"pet_config": {"freeze_include": %s}}' "$bad" >"$out/bad.json"
        expect_fail "config key 'pet_config.freeze_include' must be a list of parameter-name patterns or one" \
            "comma-separated string, got" "$out/bad.json:1:" -- "${run[@]}" --config "$out/bad.json"
    done
    expect_fail "trainable_params is empty: that would freeze the whole model; unset it to train everything" -- \
        "${run[@]}" --set 'trainable_params=[]'
    expect_fail "trainable_params and pet_config.freeze_include freeze the whole model: nothing would train" -- \
        "${run[@]}" --set 'trainable_params=["layers.1"]' --set 'pet_config.freeze_include=["layers"]'
}

# Stage N on 1, 2 and 4 ranks against the 1-rank stage-0 reference; 4 ranks through small buckets;
# offload to the CPU, which moves nothing on CPU runs, gives bit for bit the 2-rank result.
stage() {
    local n=$1 ranks
    for ranks in 1 2 4; do
        [ "$n" -eq 0 ] && [ "$ranks" -eq 1 ] && continue # that is the reference
        local extra=()
        [ "$ranks" -eq 4 ] && extra=("${small_buckets[@]}")
        train "$ranks" --plugins "zero$n" --output-dir "$out/ranks$ranks" --set steps=4 "${extra[@]}" \
            --export "$out/ranks$ranks/hf" --export-dtype fp32
        compare same-run "$ref" "$out/ranks$ranks"
    done
    [ "$n" -eq 0 ] && return
    local offload=(--set zero_optimization.offload_optimizer.device=cpu
                   --set zero_optimization.offload_optimizer.pin_memory=true)
    [ "$n" -eq 3 ] && offload+=(--set zero_optimization.offload_param.device=cpu)
    train 2 --plugins "zero$n" --output-dir "$out/offload" --set steps=4 "${offload[@]}" --export "$out/offload/hf" --export-dtype fp32
    output_has "offload to the CPU requested: this run computes on the CPU, where every buffer already is host memory"
    compare identical-run "$out/ranks2" "$out/offload"
}
stage0() { stage 0; }
stage1() { stage 1; }
stage2() { stage 2; }
# Stage 3 also without tied embeddings (the LM head then is a unit's own parameter).
stage3() {
    stage 3
    train 2 --plugins zero3 --output-dir "$out/untied" --set steps=4 --set model.tie_word_embeddings=false \
        --export "$out/untied/hf" --export-dtype fp32
    compare same-run "$ref-untied" "$out/untied"
}

# A checkpoint of 2 ranks under stage 3 (step 2 of 4), resumed on 1 rank under stage 0 and on 4 ranks
# under stage 2: steps 3 and 4 and the final weights are those of the uninterrupted reference.
reshard() {
    train 2 --plugins zero3 --output-dir "$out/written" --set steps=4 --set checkpoint.every=2
    local saved=$out/written/checkpoints/step-000002
    [ -f "$saved/checkpoint.json" ] || { echo "FAIL: no $saved/checkpoint.json"; zt_failures=$((zt_failures + 1)); }
    expect_ok '"zero_stage": 3' '"dp_size": 2' -- cat "$saved/checkpoint.json"
    train 1 --plugins zero0 --output-dir "$out/one" --set steps=4 --resume "$saved" --export "$out/one/hf" --export-dtype fp32
    output_has "resumed from $saved at step 2"
    output_has "the checkpoint was written by 2 data-parallel ranks, this run has 1: the data continues at sample 16"
    output_has "exactly where the old ranks stopped"
    compare same-run "$ref" "$out/one" 3
    train 4 --plugins zero2 --output-dir "$out/four" --set steps=4 --resume "$saved" --export "$out/four/hf" --export-dtype fp32
    compare same-run "$ref" "$out/four" 3
}

# Measured peaks by pool (rank 0's, from metrics.jsonl) against zt-run --dry-run for the same
# command, stages 0-3 on 1 and 2 ranks; on 2 ranks the model states shrink with every stage.
memory() {
    local ranks n
    for ranks in 1 2; do
        for n in 0 1 2 3; do
            local dir=$out/ranks$ranks-stage$n
            train "$ranks" --plugins "zero$n" --output-dir "$dir" --set steps=1
            zt_on "$ranks" one-process
            expect_ok "dry run: nothing was trained" -- "${CMD[@]}" --plugins "zero$n" --output-dir "$dir" \
                --set steps=1 --dry-run --nproc "$ranks"
            compare memory "$dir/memory-estimate.json" "$dir/metrics.jsonl"
        done
    done
    compare falls "$out"/ranks2-stage{0,1,2,3}/metrics.jsonl
}

# The table and its JSON: every stage and offload choice, against the formulas computed by hand for
# this model: N = embedding 512 x 50 + 2 layers x (q 2500 + k 500 + v 500 + o 2500 + gate, up and
# down 3 x 3500 + 2 norms x 50) + final norm 50 = 25600 + 33200 + 50 = 58850 parameters; AdamW keeps
# 2 states; the largest unit a backward touches is the head (norm 50) with the tied embedding (25600).
dry_run() {
    zt_on 2 one-process
    expect_ok "Memory per data-parallel rank" "2 data-parallel ranks" "* 3      none/none" "  0      none/none" \
        "  3      cpu/cpu" "Not estimated" -- "${CMD[@]}" --plugins zero3 --output-dir "$out" --dry-run --nproc 2
    compare formula "$out/memory-estimate.json" 58850 2 2 25650
    expect_ok "gpu_mem_limit caps GPU memory; this run computes on the CPU, so it does not apply" -- \
        "$zt_run" "${common[@]}" --output-dir "$out/capped" --dry-run --gpu-mem-limit 24G
    # Under mpirun only rank 0 prints the table.
    zt_on 2
    expect_ok "* 0      none/none" "2 data-parallel ranks" -- "${CMD[@]}" --output-dir "$out/ranked" --dry-run
    local tables
    # Counted anywhere in a line: mpirun merges the ranks' output, and another rank's unfinished line
    # can end up in front of the title.
    tables=$(grep -o "Memory per data-parallel rank" <<<"$ZT_OUT" | wc -l | tr -d ' ')
    if [ "$tables" != 1 ]; then
        echo "FAIL: $tables tables printed under mpirun -np 2, expected 1"
        zt_failures=$((zt_failures + 1))
    fi
}

# zero_optimization.step_in_backward: the optimizer steps each unit inside the backward. Exact
# without clipping and gradient accumulation, so for every stage on 1 and 2 ranks (one micro-batch of
# the global batch of 8 per rank count) the losses and final weights are bit for bit those of the
# normal step (the norm, summed unit by unit, within 1e-6); 2 ranks also through small buckets. Then
# its refusals: true with clipping or accumulation, and the CPU default (auto) keeps it off.
step_in_backward() {
    local exact=(--set gradient_clipping=0 --set gradient_accumulation_steps=1)
    local n ranks
    for ranks in 1 2; do
        local mb=$((8 / ranks)) launch=()
        [ "$ranks" -gt 1 ] && launch=("$mpiexec" -np "$ranks" --oversubscribe --allow-run-as-root)
        for n in 0 1 2 3; do
            local dir=$out/ranks$ranks-stage$n extra=()
            [ "$ranks" -eq 2 ] && extra=("${small_buckets[@]}")
            local run=("${launch[@]}" "$zt_run" "${common[@]}" --set train_micro_batch_size_per_gpu=$mb "${exact[@]}"
                       --plugins "zero$n" --set steps=4 "${extra[@]}")
            expect_ok -- "${run[@]}" --output-dir "$dir-normal" --set zero_optimization.step_in_backward=false \
                --export "$dir-normal/hf" --export-dtype fp32
            expect_ok "step_in_backward: the optimizer steps each unit inside the backward" -- "${run[@]}" \
                --output-dir "$dir-sib" --set zero_optimization.step_in_backward=true --export "$dir-sib/hf" --export-dtype fp32
            compare stepped-run "$dir-normal" "$dir-sib"
            # gradients only per unit: stages 0-1 drop the full buffer, stages 2-3 the shard accumulators
            # of untied units
            compare fewer-grads "$dir-normal/metrics.jsonl" "$dir-sib/metrics.jsonl"
        done
    done
    expect_fail "zero_optimization.step_in_backward is true" "gradient_clipping 0 (this run: 1)" -- \
        "$zt_run" "${common[@]}" --plugins zero2 --output-dir "$out/x" --set zero_optimization.step_in_backward=true
    expect_fail "gradient_accumulation_steps 1 (this run: 2)" -- "$zt_run" "${common[@]}" --plugins zero1 \
        --set gradient_clipping=0 --set gradient_accumulation_steps=2 --output-dir "$out/x" \
        --set zero_optimization.step_in_backward=true
    expect_ok -- "$zt_run" "${common[@]}" --plugins zero0 "${exact[@]}" --output-dir "$out/auto" --set steps=1
    if grep -qF "step_in_backward: the optimizer steps" <<<"$ZT_OUT"; then
        echo "FAIL: step_in_backward auto turned itself on for a CPU run"
        zt_failures=$((zt_failures + 1))
    fi
}

# Bad settings: each message says what is wrong and how to fix it; nothing crashes.
errors() {
    expect_fail "offloading the optimizer needs a sharded optimizer (stage 1, 2 or 3" -- "$zt_run" "${common[@]}" \
        --plugins zero0 --output-dir "$out/x" --set zero_optimization.offload_optimizer.device=cpu
    expect_fail "offloading parameters needs stage 3" -- "$zt_run" "${common[@]}" --plugins zero2 \
        --output-dir "$out/x" --set zero_optimization.offload_param.device=cpu
    expect_fail "zero_optimization.reduce_scatter is false, but zt always reduces sharded gradients" -- \
        "$zt_run" "${common[@]}" --plugins zero3 --output-dir "$out/x" --set zero_optimization.reduce_scatter=false
    expect_fail "zero_optimization.offload_optimizer.device" "gpu" -- "$zt_run" "${common[@]}" --plugins zero1 \
        --output-dir "$out/x" --set zero_optimization.offload_optimizer.device=gpu
    expect_fail "zero_optimization.reduce_bucket_size" -- "$zt_run" "${common[@]}" --plugins zero2 \
        --output-dir "$out/x" --set zero_optimization.reduce_bucket_size=-1
    expect_fail "parallel_config.data_parallel is 2 but the job has 1 process" "zt-run --nproc 2" -- \
        "$zt_run" "${common[@]}" --output-dir "$out/x" --set parallel_config.data_parallel=2
    zt_on 2
    expect_fail "the batch sizes do not agree: train_batch_size 16 (--set train_batch_size=16)" \
        "over 2 data-parallel ranks" "(2 x 2 x 2 = 8)" \
        -- "${CMD[@]}" --plugins zero1 --output-dir "$out/x" --set train_batch_size=16
    expect_fail "--dry-run is for training and has no effect with --check" -- "$zt_run" --check --dry-run
    expect_fail "gpu_mem_limit" -- "$zt_run" "${common[@]}" --output-dir "$out/x" --gpu-mem-limit 12parsecs
}

# The host-memory check before a run counts the ranks that share this machine (a collective at
# start-up): 2 ranks under mpirun with room for one rank's host memory and a half (ZT_HOST_MEM_AVAILABLE,
# the per-rank figure from the dry run of the same command) are both refused before training, which a
# rank counting only itself would not be; with room for two and a half they train.
host_memory_ranks() {
    zt_on 2 one-process
    expect_ok -- "${CMD[@]}" --plugins zero2 --output-dir "$out/dry" --set steps=1 --dry-run --nproc 2
    local per_rank batch
    per_rank=$(python3 -c 'import json, sys; print(int(json.load(open(sys.argv[1]))["rows"][0]["host"]["total"]))' \
               "$out/dry/memory-estimate.json")
    read -ra batch <<<"${batch_of[2]}"
    local ranks=("$mpiexec" -np 2 --oversubscribe --allow-run-as-root -x ZT_HOST_MEM_AVAILABLE "$zt_run" "${common[@]}"
                 "${batch[@]}" --plugins zero2 --set steps=1)
    expect_fail "out of host memory, found before allocating anything (from the estimate): zero2 on 2 data-parallel" \
        "for the 2 ranks on this machine, more than" -- \
        env ZT_HOST_MEM_AVAILABLE=$((per_rank * 3 / 2)) "${ranks[@]}" --output-dir "$out/refused"
    local refusals
    refusals=$(grep -c "error: out of host memory, found before allocating anything" <<<"$ZT_OUT")
    if [ "$refusals" != 2 ]; then
        echo "FAIL: $refusals ranks refused the run, expected both"; echo "$ZT_OUT"; zt_failures=$((zt_failures + 1))
    fi
    [ -e "$out/refused/metrics.jsonl" ] && { echo "FAIL: the refused run trained"; zt_failures=$((zt_failures + 1)); }
    expect_ok -- env ZT_HOST_MEM_AVAILABLE=$((per_rank * 5 / 2)) "${ranks[@]}" --output-dir "$out/trained"
    [ -e "$out/trained/metrics.jsonl" ] || { echo "FAIL: no metrics.jsonl: the run did not train"; zt_failures=$((zt_failures + 1)); }
}

case $test in
    prepare) ;;
    *) rm -rf "$out" && mkdir -p "$out" ;; # every run starts from nothing
esac
"$test"
finish
