#!/usr/bin/env bash
# Checkpoints across parallel layouts on CPU ranks (Open MPI's mpirun): a checkpoint of step 2 of 4
# written by tp2, pp2 and tp2 x pp2 runs resumes on other layouts (tp2 -> tp1, tp4, dp2 x tp2; pp2 ->
# pp1, pp4; tp2 x pp2 -> 1 rank) with no conversion step, and steps 3 and 4 (loss, gradient norm, lr,
# tokens within 1e-5) and the final export are those of the uninterrupted 1-rank run of the same global
# batch (tests/zero/compare.py, numpy only), which parallel.tp_train and parallel.pipeline tie every
# target layout to. auto_trans_ckpt false refuses a layout change naming both layouts and resumes the
# same layout; zt-run --generate --resume of the tp2 x pp2 run's final checkpoint gives the greedy
# tokens of the 1-rank run's export.
#   ckpt_layouts.sh ZT_RUN ZT_PREP MPIEXEC SOURCE_DIR WORK_DIR
set -u
zt_run=$1 zt_prep=$2 mpiexec=$3 src=$4 work=$5
. "$src/tests/lib.sh"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the exports"
rm -rf "$work"
mkdir -p "$work"
expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" \
    -o "$work/data" --val-fraction 0 --seed 0 --no-progress
# hidden 32 (4 heads of 8, 2 key/value heads), 4 layers (4 stages), untied head (a pipeline needs it)
common=(--data "$work/data" --set model.hidden_size=32 --set model.intermediate_size=64
        --set model.num_hidden_layers=4 --set model.num_attention_heads=4 --set model.num_key_value_heads=2
        --set model.tie_word_embeddings=false --set data.seq_len=128 --set data.mode=padded --set threads=1
        --set device=cpu --set log.every=1 --set optimizer.params.lr=3e-3 --set seed=7 --set steps=4
        --set checkpoint.final=false --set train_micro_batch_size_per_gpu=1)
# 4 sequences per step: 1 data-parallel rank x 4 micro-batches, or 2 x 2
dp1=(--set gradient_accumulation_steps=4 --set parallel_config.micro_batch_num=4)
dp2=(--set gradient_accumulation_steps=2 --set parallel_config.micro_batch_num=2)
# the layouts: model_parallel (tensor) x pipeline_stage
tp2=(--set parallel_config.model_parallel=2)
tp4=(--set parallel_config.model_parallel=4)
pp2=(--set parallel_config.pipeline_stage=2)
pp4=(--set parallel_config.pipeline_stage=4)
run() { # run RANKS NAME ARGS...: zt-run on RANKS ranks into WORK/NAME, exporting the final weights
    local ranks=$1 name=$2
    shift 2
    local cmd=("$zt_run")
    [ "$ranks" -gt 1 ] && cmd=(timeout 120 "$mpiexec" -np "$ranks" --oversubscribe --allow-run-as-root "$zt_run")
    expect_ok -- "${cmd[@]}" "${common[@]}" --output-dir "$work/$name" --export "$work/$name/hf" \
        --export-dtype fp32 "$@"
}
compare() { # compare NAME: steps 3 and 4 and the export against the uninterrupted 1-rank run
    python3 "$src/tests/zero/compare.py" same-run "$work/reference" "$work/$1" 3 || zt_failures=$((zt_failures + 1))
}
saved() { echo "$work/$1/checkpoints/step-000002"; }
said() { # said TEXT: the last run's output has TEXT
    grep -qF -- "$1" <<<"$ZT_OUT" && return
    echo "FAIL: expected '$1' in the output"
    zt_failures=$((zt_failures + 1))
}

run 1 reference "${dp1[@]}" --plugins zero0
# the writers: a checkpoint at step 2, each rank writing its own shards
run 2 tp2 "${dp1[@]}" "${tp2[@]}" --set checkpoint.every=2
run 2 pp2 "${dp1[@]}" "${pp2[@]}" --set checkpoint.every=2 --plugins zero1
run 4 tp2pp2 "${dp1[@]}" "${tp2[@]}" "${pp2[@]}" --set checkpoint.every=2 --plugins zero3 --set checkpoint.final=true
expect_ok '"tp_size": 2' '"pp_size": 1' '"rank-00001.bin"' -- cat "$(saved tp2)/checkpoint.json"
expect_ok '"tp_size": 2' '"pp_size": 2' '"rank-00003.bin"' -- cat "$(saved tp2pp2)/checkpoint.json"

run 1 tp2-on-tp1 "${dp1[@]}" --resume "$(saved tp2)"
said "resumed from $(saved tp2) at step 2"
compare tp2-on-tp1
run 4 tp2-on-tp4 "${dp1[@]}" "${tp4[@]}" --resume "$(saved tp2)"
compare tp2-on-tp4
run 4 tp2-on-dp2tp2 "${dp2[@]}" "${tp2[@]}" --resume "$(saved tp2)" --plugins zero2
said "the checkpoint was written by 1 data-parallel ranks, this run has 2: the data continues at sample 8"
compare tp2-on-dp2tp2
run 1 pp2-on-pp1 "${dp1[@]}" --resume "$(saved pp2)"
compare pp2-on-pp1
run 4 pp2-on-pp4 "${dp1[@]}" "${pp4[@]}" --resume "$(saved pp2)" --plugins zero3
compare pp2-on-pp4
run 1 tp2pp2-on-1 "${dp1[@]}" --resume "$(saved tp2pp2)"
compare tp2pp2-on-1

# auto_trans_ckpt false: the same layout resumes, another is refused with both layouts named
run 2 tp2-on-tp2 "${dp1[@]}" "${tp2[@]}" --resume "$(saved tp2)" --set auto_trans_ckpt=false
compare tp2-on-tp2
expect_fail "was written by 2 ranks as data_parallel 1 x model_parallel 2 x pipeline_stage 1 under ZeRO stage" \
    "this run has 1 rank as data_parallel 1 x model_parallel 1 x pipeline_stage 1" "auto_trans_ckpt is false" -- \
    "$zt_run" "${common[@]}" "${dp1[@]}" --output-dir "$work/refused" --resume "$(saved tp2)" \
    --set auto_trans_ckpt=false

# generation from the tp2 x pp2 run's final checkpoint (step 4) on one rank: the greedy tokens of the
# uninterrupted 1-rank run's export
gen=("$zt_run" --generate --set threads=1 --prompt-ids "1,15,27,3" --max-new-tokens 6 --print-ids)
want=$("${gen[@]}" --model "$work/reference/hf" 2>/dev/null)
got=$("${gen[@]}" --resume "$work/tp2pp2/checkpoints" --data "$work/data" 2>/dev/null)
if [ -z "$want" ] || [ "$want" != "$got" ]; then
    echo "FAIL: greedy tokens from the tp2 x pp2 checkpoint: '$got', from the 1-rank export: '$want'"
    zt_failures=$((zt_failures + 1))
else
    echo "ok: greedy tokens from the tp2 x pp2 checkpoint: $got"
fi
finish
