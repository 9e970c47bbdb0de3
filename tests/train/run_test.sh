#!/usr/bin/env bash
# zt-run training end to end. One test per call:
#   run_test.sh ZT_RUN ZT_PREP SOURCE_DIR WORK_DIR TEST [ARGS...]
# prepare_data runs first (ctest fixture train_data): the bundled example tasks (examples/data)
# tokenized by zt-prep. Every run uses a small LLaMA (2 layers, hidden 64) so each test stays short.
set -u
zt_run=$1 zt_prep=$2 src=$3 work=$4 test=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"

data=$work/data
out=$work/$test
model=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_hidden_layers=2
       --set model.num_attention_heads=4 --set model.num_key_value_heads=2)
# A short step: 8 sequences of 128 tokens.
common=(--data "$data" "${model[@]}" --set data.seq_len=128 --set threads=2 --set log.every=1000
        --set optimizer.params.lr=3e-3)

check() {
    if ! python3 "$here/check.py" "$@"; then
        zt_failures=$((zt_failures + 1))
    fi
}

# The output of the last expect_ok / expect_fail must not contain this (advice that does not fit).
not_in_output() {
    if grep -qF -- "$1" <<<"$ZT_OUT"; then
        echo "FAIL: '$1' in the output:"; echo "$ZT_OUT"; zt_failures=$((zt_failures + 1))
    fi
}

# Runs zt-run in the background and sends it `signal` once it has logged `after` steps; sets RC.
interrupt_after() {
    local signal=$1 after=$2 metrics=$3
    shift 3
    "$zt_run" "$@" >"$out/interrupt.log" 2>&1 &
    local pid=$! i
    for i in $(seq 300); do
        [ -f "$metrics" ] && [ "$(wc -l <"$metrics")" -ge "$after" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "-$signal" "$pid" 2>/dev/null
    wait "$pid"
    RC=$?
}

prepare_data() {
    [ -x "$zt_prep" ] || skip "zt-prep is not built"
    rm -rf "$data" "$work/data-no-val" # only these: other tests may be running in $work
    mkdir -p "$work"
    expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" \
        -o "$data" --val-fraction 0.05 --seed 0 --no-progress
    expect_ok "wrote" -- "$zt_prep" "$src/examples/data/heldout.json" -t "$src/examples/data/tokenizer.model" \
        -o "$work/data-no-val" --val-fraction 0 --seed 0 --no-progress
}

# The same global batch of 8 sequences as 1 x 8, 2 x 4 and 4 x 2 micro-batches x accumulation steps:
# the loss is the mean over the global batch's loss tokens, so losses, gradient norms and the weights
# after 3 steps agree to float rounding.
loss_invariance() {
    local split
    for split in 8x1 4x2 2x4; do
        expect_ok -- "$zt_run" "${common[@]}" --output-dir "$out/$split" --set steps=3 \
            --set train_micro_batch_size_per_gpu="${split%x*}" --set gradient_accumulation_steps="${split#*x}" \
            --export "$out/$split/hf" --export-dtype fp32
    done
    for split in 4x2 2x4; do
        check same-metrics "$out/8x1/metrics.jsonl" "$out/$split/metrics.jsonl" 1e-5
        check same-weights "$out/8x1/hf/model.safetensors" "$out/$split/hf/model.safetensors" 1e-5 1e-6
    done
}

# 6 steps straight == 5 steps (checkpoints at 3 and 5) + resume from step 3 + 3 steps: the same
# losses, gradient norms, evaluation losses and final weights, bit for bit, though the resumed part
# runs on another number of threads.
resume() {
    local same=(--set train_micro_batch_size_per_gpu=4 --set gradient_accumulation_steps=2
                --set scheduler.params.total_num_steps=6 --set scheduler.params.warmup_num_steps=2 --set eval.every=2
                --set eval.batches=4)
    expect_ok -- "$zt_run" "${common[@]}" "${same[@]}" --output-dir "$out/straight" --set steps=6 \
        --export "$out/straight/hf" --export-dtype fp32
    expect_ok "checkpoint of step 3 saved" "checkpoint of step 5 saved" -- "$zt_run" "${common[@]}" "${same[@]}" \
        --output-dir "$out/resumed" --set steps=5 --set checkpoint.every=3
    expect_ok "resumed from $out/resumed/checkpoints/step-000003 at step 3" -- "$zt_run" "${common[@]}" \
        "${same[@]}" --output-dir "$out/resumed" --set steps=6 --set threads=1 \
        --resume "$out/resumed/checkpoints/step-000003" --export "$out/resumed/hf" --export-dtype fp32
    # metrics.jsonl of the resumed run: steps 4 and 5 of the first session were dropped and redone
    check same-metrics "$out/straight/metrics.jsonl" "$out/resumed/metrics.jsonl" 0
    if ! cmp -s "$out/straight/hf/model.safetensors" "$out/resumed/hf/model.safetensors"; then
        echo "FAIL: the weights after a resume differ from those of the uninterrupted run"
        zt_failures=$((zt_failures + 1))
    fi
    # --resume latest picks step 6 now; with steps = 6 there is nothing left to do
    expect_ok "resumed from $out/resumed/checkpoints/step-000006" "nothing left to train" -- "$zt_run" \
        "${common[@]}" "${same[@]}" --output-dir "$out/resumed" --set steps=6 --resume latest
}

# Ctrl-C (and SIGTERM): the step in progress finishes, a checkpoint is saved, the exit status is 130,
# and the message says how to resume, which then works.
interrupt() {
    local signal steps
    for signal in INT TERM; do
        rm -rf "$out"
        mkdir -p "$out"
        interrupt_after "$signal" 3 "$out/metrics.jsonl" "${common[@]}" --output-dir "$out" --set steps=100000 \
            --set train_micro_batch_size_per_gpu=2
        if [ "$RC" -ne 130 ]; then
            echo "FAIL: SIG$signal: exit status $RC, expected 130"
            cat "$out/interrupt.log"
            zt_failures=$((zt_failures + 1))
            continue
        fi
        steps=$(python3 "$here/check.py" last-step "$out/metrics.jsonl")
        local saved="$out/checkpoints/step-$(printf %06d "$steps")"
        expect_ok "interrupted after step $steps of 100000" "its checkpoint is in $saved" \
            "Resume with the same command plus --resume latest" -- cat "$out/interrupt.log"
        expect_ok "step-$(printf %06d "$steps")" -- cat "$out/checkpoints/latest"
        [ -f "$saved/checkpoint.json" ] || { echo "FAIL: no $saved/checkpoint.json"; zt_failures=$((zt_failures + 1)); }
        expect_ok "resumed from $saved at step $steps" -- "$zt_run" "${common[@]}" --output-dir "$out" \
            --set steps=$((steps + 2)) --set train_micro_batch_size_per_gpu=2 --resume latest
    done
}

# From random weights the model learns the example tasks: the loss starts at ln(512) = 6.238 (uniform
# predictions over the tokenizer's 512 pieces) and the validation loss falls below 3.6 within 120
# steps of 8 sequences (about 3.3 is reached; deterministic for the seed).
learns() {
    expect_ok -- "$zt_run" "${common[@]}" --output-dir "$out" --set steps=120 \
        --set train_micro_batch_size_per_gpu=8 --set optimizer.params.lr=5e-3 \
        --set scheduler.params.warmup_num_steps=10 --set eval.every=120
    check learns "$out/metrics.jsonl" 6.238 3.6
}

# One AdamW step on a torch fixture's batch through --model, llama, zero0 and adamw, then --export:
# loss, gradient norm and weights against transformers + torch.optim.AdamW (check.py fixture).
fixture() {
    local maker=$1 fixture_dir=$2
    out=$out-$(basename "$fixture_dir") # one folder per fixture: ctest may run them in parallel
    mkdir -p "$out"
    rm -rf "$out/data" "$out/run"
    expect_ok -- "$maker" "$fixture_dir" "$out/data"
    expect_ok -- "$zt_run" --model "$fixture_dir" --data "$out/data" --output-dir "$out/run" --set threads=2 \
        --set train_micro_batch_size_per_gpu=2 --set data.seq_len=16 --set data.shuffle=false --set steps=1 \
        --set scheduler.type=constant --set optimizer.params.lr=0.01 --set 'optimizer.params.betas=[0.9,0.95]' \
        --set optimizer.params.eps=1e-8 --set optimizer.params.weight_decay=0.1 --set gradient_clipping=0 \
        --export "$out/run/hf" --export-dtype fp32
    check fixture "$fixture_dir" "$out/run/metrics.jsonl" "$out/run/hf"
}

# The frozen-parameter fixture (tests/reference: llama_gqa_untied trained 3 AdamW steps by torch with
# requires_grad=False on all but six tensors): zt-run with the same set as trainable_params (the seed's
# list form, names without "model." and a glob) matches torch's losses and weights; the same set written
# as MindFormers' pet_config.freeze_include trains bit for bit the same.
fixture_frozen() {
    local maker=$1 fixture_dir=$2 frozen_dir=$3
    mkdir -p "$out"
    rm -rf "$out/data" "$out/list" "$out/pet"
    expect_ok -- "$maker" "$fixture_dir" "$out/data"
    local run=("$zt_run" --model "$fixture_dir" --data "$out/data" --set threads=2
               --set train_micro_batch_size_per_gpu=2 --set data.seq_len=16 --set data.shuffle=false --set steps=3
               --set scheduler.type=constant --set optimizer.params.lr=0.01 --set 'optimizer.params.betas=[0.9,0.95]'
               --set optimizer.params.eps=1e-8 --set optimizer.params.weight_decay=0.1 --set gradient_clipping=0)
    expect_ok -- "${run[@]}" --output-dir "$out/list" --export "$out/list/hf" \
        --set 'trainable_params=["layers.1.self_attn.q_proj", "layers.1.mlp.*", "model.norm", "lm_head"]'
    check frozen-fixture "$fixture_dir" "$frozen_dir" "$out/list/metrics.jsonl" "$out/list/hf"
    expect_ok -- "${run[@]}" --output-dir "$out/pet" --export "$out/pet/hf" \
        --set 'pet_config.freeze_include=["embed_tokens", "layers.0", "input_layernorm", "post_attention_layernorm",
               "k_proj", "v_proj", "o_proj"]'
    check same-metrics "$out/list/metrics.jsonl" "$out/pet/metrics.jsonl" 0
    check same-weights "$out/list/hf/model.safetensors" "$out/pet/hf/model.safetensors" 0 0
}

# Bad input: each message says what is wrong and what to do, and the exit status is 1 (2 for usage).
errors() {
    mkdir -p "$out"
    local fixture_model=${ZT_TEST_FIXTURES:?set by tests/CMakeLists.txt}/llama_mha_tied
    expect_fail "no training data: data.path is not set" -- "$zt_run" "${model[@]}" --output-dir "$out/x"
    expect_fail "trainable_params: the pattern \"layers.9\" matches no parameter" -- \
        "$zt_run" "${common[@]}" --output-dir "$out/x" --set trainable_params=q_proj,layers.9
    expect_fail "has vocab_size 512 (manifest tokenizer) but the model has only 100 embeddings" -- \
        "$zt_run" "${common[@]}" --output-dir "$out/x" --set model.vocab_size=100
    expect_fail "needs the data set's validation split" "set eval.every to 0" -- \
        "$zt_run" --data "$work/data-no-val" "${model[@]}" --output-dir "$out/x" --set eval.every=5
    expect_fail "nothing to resume from" -- "$zt_run" "${common[@]}" --output-dir "$out/empty" --resume latest
    expect_fail "--resume $out/nowhere: no such directory" -- \
        "$zt_run" "${common[@]}" --output-dir "$out/x" --resume "$out/nowhere"
    expect_fail "'scheduler.params.warmup_num_steps' is set but scheduler.type \"constant\" does not use it" -- \
        "$zt_run" "${common[@]}" --output-dir "$out/x" --set scheduler.type=constant \
        --set scheduler.params.warmup_num_steps=10
    expect_fail "the batch sizes do not agree: train_batch_size 99 (--set train_batch_size=99)" \
        "over 1 data-parallel rank" "(4 x 1 x 1 = 4)" -- "$zt_run" "${common[@]}" --output-dir "$out/x" \
        --set train_batch_size=99 --set train_micro_batch_size_per_gpu=4 --set gradient_accumulation_steps=1
    expect_fail "model.preset and --model $fixture_model both give the model's shape" -- \
        "$zt_run" --data "$data" --model "$fixture_model" --output-dir "$out/x" --set model.preset=tiny
    expect_fail "model.hidden_size is 64 in the config but 32 in $fixture_model/config.json" -- \
        "$zt_run" --data "$data" --model "$fixture_model" --output-dir "$out/x" --set model.hidden_size=64
    expect_fail "$out/nowhere" -- "$zt_run" --data "$data" --model "$out/nowhere" --output-dir "$out/x"
    expect_fail "--data is for training and has no effect with --check" -- "$zt_run" --check --data "$data"
    # A checkpoint of one model shape does not resume another.
    expect_ok -- "$zt_run" "${common[@]}" --output-dir "$out/small" --set steps=1 --set train_micro_batch_size_per_gpu=1
    expect_fail "hidden_size" -- "$zt_run" "${common[@]}" --output-dir "$out/small" --set steps=2 \
        --set train_micro_batch_size_per_gpu=1 --set model.hidden_size=32 --resume latest
}

# A torn last line of metrics.jsonl (the previous session stopped while writing it, e.g. on a full
# disk) is zt's own: --resume removes it, says so, keeps the records up to the checkpoint byte for byte
# and redoes the rest. A bad line anywhere else is someone else's: refused, the file left as it was.
resume_torn() {
    local run=(--set train_micro_batch_size_per_gpu=2 --set checkpoint.every=3 --set checkpoint.final=false)
    expect_ok "checkpoint of step 3 saved" -- "$zt_run" "${common[@]}" "${run[@]}" --output-dir "$out" --set steps=5
    head -n 3 "$out/metrics.jsonl" >"$out/kept.jsonl"
    printf '{"step":6,"type":"train","total_steps":6,"loss":3.14' >>"$out/metrics.jsonl"
    expect_ok "metrics.jsonl:6: removed a torn last line" "resumed from $out/checkpoints/step-000003 at step 3" -- \
        "$zt_run" "${common[@]}" "${run[@]}" --output-dir "$out" --set steps=6 --resume latest
    check train-steps "$out/metrics.jsonl" 1,2,3,4,5,6
    if ! head -n 3 "$out/metrics.jsonl" | cmp -s - "$out/kept.jsonl"; then
        echo "FAIL: the records up to the checkpoint changed on resume"
        zt_failures=$((zt_failures + 1))
    fi
    sed -i '2i edited by hand' "$out/metrics.jsonl"
    cp "$out/metrics.jsonl" "$out/edited.jsonl"
    expect_fail "metrics.jsonl:2 is not a metrics record" "the file was changed by something else" -- \
        "$zt_run" "${common[@]}" "${run[@]}" --output-dir "$out" --set steps=7 --resume latest
    cmp -s "$out/metrics.jsonl" "$out/edited.jsonl" || { echo "FAIL: a refused metrics.jsonl was changed"; zt_failures=$((zt_failures + 1)); }
}

# A save killed part way leaves a step-N.tmp-* staging directory with writer.json (docs/checkpoint-format.md);
# the next run on this host removes it once that process is gone, and says how many bytes it freed.
# One whose writer is another machine's is left alone.
stale_staging() {
    [ -r /proc/sys/kernel/random/boot_id ] && [ -e /proc/self/ns/pid ] || skip "no /proc: nothing is ever removed"
    local root=$out/checkpoints
    sleep 0 &
    local gone=$!
    wait "$gone"
    mkdir -p "$root/step-000007.tmp-$gone-aaaaaa" "$root/step-000008.tmp-$gone-bbbbbb"
    printf '{"host": "%s", "boot_id": "%s", "pid_ns": "%s", "pid": %d}\n' "$(hostname)" \
        "$(cat /proc/sys/kernel/random/boot_id)" "$(readlink /proc/self/ns/pid)" "$gone" \
        >"$root/step-000007.tmp-$gone-aaaaaa/writer.json"
    head -c 4096 /dev/zero >"$root/step-000007.tmp-$gone-aaaaaa/rank-00000.bin"
    printf '{"host": "elsewhere", "boot_id": "another-boot", "pid_ns": "%s", "pid": %d}\n' \
        "$(readlink /proc/self/ns/pid)" "$gone" >"$root/step-000008.tmp-$gone-bbbbbb/writer.json"
    local bytes=$(( 4096 + $(stat -c %s "$root/step-000007.tmp-$gone-aaaaaa/writer.json") ))
    expect_ok "removed stale checkpoint staging directory $root/step-000007.tmp-$gone-aaaaaa ($bytes bytes)" -- \
        "$zt_run" "${common[@]}" --output-dir "$out" --set steps=1 --set train_micro_batch_size_per_gpu=1
    [ ! -e "$root/step-000007.tmp-$gone-aaaaaa" ] || { echo "FAIL: the stale staging directory is still there"; zt_failures=$((zt_failures + 1)); }
    [ -d "$root/step-000008.tmp-$gone-bbbbbb" ] || { echo "FAIL: another machine's staging directory was removed"; zt_failures=$((zt_failures + 1)); }
    [ ! -e "$root/step-000001/writer.json" ] || { echo "FAIL: a published checkpoint kept writer.json"; zt_failures=$((zt_failures + 1)); }
}

# A checkpoint whose checkpoint.json was deleted is incomplete or damaged: the message says so, names
# it and the complete ones left, and does not send the user to train without --resume "first".
resume_damaged() {
    local root=$out/checkpoints run=(--set train_micro_batch_size_per_gpu=1 --set checkpoint.every=2)
    expect_ok "checkpoint of step 5 saved" -- "$zt_run" "${common[@]}" "${run[@]}" --output-dir "$out" --set steps=5
    rm "$root/step-000005/checkpoint.json"
    expect_fail "$root/latest names 'step-000005', but $root/step-000005 has no checkpoint.json" \
        "that checkpoint directory is incomplete or damaged" \
        "Complete checkpoints there: $root/step-000002, $root/step-000004" \
        "Resume from an older one (e.g. --resume $root/step-000004, the newest complete one), or train without --resume to start over" \
        -- "$zt_run" "${common[@]}" "${run[@]}" --output-dir "$out" --set steps=6 --resume latest
    not_in_output "train without --resume first"
    expect_fail "--resume $root/step-000005/: this checkpoint directory has no checkpoint.json, so it is incomplete or damaged" \
        "Complete checkpoints in the same root: $root/step-000002, $root/step-000004" -- \
        "$zt_run" "${common[@]}" "${run[@]}" --output-dir "$out" --set steps=6 --resume "$root/step-000005/"
    not_in_output "train without --resume first"
    expect_ok "resumed from $root/step-000004 at step 4" -- "$zt_run" "${common[@]}" "${run[@]}" --output-dir "$out" \
        --set steps=4 --resume "$root/step-000004"
}

# A corrupt validation shard: the checksum error says to rewrite the data set with zt-prep, and no
# advice about a missing split (--val-fraction) follows, since the split is there.
val_corrupt() {
    cp -r "$data" "$out/data"
    printf '\x5a' | dd of="$out/data/val-00000.ztshard" bs=1 seek=1000 conv=notrunc status=none
    expect_fail "$out/data/val-00000.ztshard" "is corrupt" "re-run zt-prep to regenerate the data set" \
        "(in the validation split, which eval.every = 5 evaluates on)" -- \
        "$zt_run" --data "$out/data" "${model[@]}" --output-dir "$out/x" --set eval.every=5
    not_in_output "--val-fraction"
}

# A run of skipped steps longer than fp16's start-up stops training with its cause and fix (it used to
# skip to the end and exit 0): a learning rate of 1e30 makes the weights overflow after step 1, so
# every later gradient norm is NaN; data.seq_len 16 cuts every answer off, so no batch has a loss
# token. The limit is 34 steps in a row (docs/training.md, "Skipped steps").
skipped_steps() {
    expect_fail "steps 2 to 35: 34 optimizer steps in a row were skipped (zt stops after 34" \
        "The gradient norm was not finite (last: NaN)" "Likely the learning rate is too high" -- \
        "$zt_run" "${common[@]}" --output-dir "$out/lr" --set steps=100 --set train_micro_batch_size_per_gpu=1 \
        --set optimizer.params.lr=1e30
    check train-steps "$out/lr/metrics.jsonl" "$(seq -s, 1 35)"
    expect_fail "steps 1 to 34: 34 optimizer steps in a row were skipped" \
        "The last global batch had no loss token (every target is -100): the answers are cut off by data.seq_len (16)" -- \
        "$zt_run" --data "$data" "${model[@]}" --set data.seq_len=16 --set data.mode=padded --set threads=2 \
        --output-dir "$out/short" --set steps=100 --set train_micro_batch_size_per_gpu=1
}

# Values far out of range are validation errors naming the key, never an out-of-memory report.
bad_values() {
    expect_fail "config key 'gradient_accumulation_steps' is 4294967297, out of range: must be <= 65536" -- \
        "$zt_run" "${common[@]}" --output-dir "$out/x" --set gradient_accumulation_steps=4294967297
    not_in_output "out of memory"
}

# Damaged variants of the real stories260K model (../shared/data/weights/stories260K_hf, vocabulary
# 512, hidden 64, MLP 172; the data set's tokenizer has 512 pieces too), each refused at import with a
# message that names the file, the key or tensor, and the problem.
bad_model() {
    local hf=${ZT_SHARED_DATA:-}/weights/stories260K_hf
    [ -f "$hf/model.safetensors" ] || skip "$hf is not there (../shared/data)"
    local make=(python3 "$here/make_variant.py" "$hf") run=(--data "$data" --output-dir "$out/x" --set steps=2
        --set threads=2 --set data.seq_len=128 --set train_micro_batch_size_per_gpu=1)
    # up_proj is [172, 64]: element 100 is row 1, column 36
    "${make[@]}" "$out/nan" --nan model.layers.2.mlp.up_proj.weight:100
    expect_fail "$out/nan/model.safetensors: tensor 'model.layers.2.mlp.up_proj.weight' holds NaN at element 100 (row 1, column 36)" \
        "use an intact copy" -- "$zt_run" --model "$out/nan" "${run[@]}"
    "${make[@]}" "$out/bos" --set bos_token_id=1000000
    expect_fail "$out/bos/config.json:" "\"bos_token_id\" is 1000000, but vocab_size is 512 (ids 0 to 511)" -- \
        "$zt_run" --model "$out/bos" "${run[@]}"
    "${make[@]}" "$out/eos" --set 'eos_token_id=[2, 600]'
    expect_fail "\"eos_token_id\" is 600, but vocab_size is 512" -- "$zt_run" --model "$out/eos" "${run[@]}"
    "${make[@]}" "$out/string" --set 'hidden_size="64"'
    expect_fail "$out/string/config.json:" "\"hidden_size\" must be an integer >= 1, found 64, a string (write it without the quotes)" -- \
        "$zt_run" --model "$out/string" "${run[@]}"
    "${make[@]}" "$out/wide" --set hidden_size=1000000000
    local mismatch="$out/wide/model.safetensors: tensor 'model.embed_tokens.weight' has shape [512, 64], but $out/wide/config.json implies [512, 1000000000]"
    expect_fail "$mismatch" -- "$zt_run" --model "$out/wide" "${run[@]}"
    not_in_output "out of memory"
    expect_fail "$mismatch" -- "$zt_run" --model "$out/wide" "${run[@]}" --dry-run
    not_in_output "out of memory"
}

# DeepSpeed's tensorboard block: the event files, read with the tensorboard package's reader, hold
# every scalar of metrics.jsonl at DeepSpeed's x-axis (samples: step x 4 sequences here), also after
# a session killed while writing an event (simulated: its last event cut short) and resumed from an
# earlier checkpoint: the old file is left as it was, the new one's SessionLog START drops the steps
# trained again. Bad settings are --check errors. Fails without the package (install-deps.sh installs
# it) unless ZT_SKIP_TENSORBOARD=1.
tensorboard_run() {
    [ "${ZT_SKIP_TENSORBOARD:-0}" = 1 ] && skip "ZT_SKIP_TENSORBOARD=1"
    if ! python3 -c "import tensorboard" 2>/dev/null; then
        echo "FAIL: python3 cannot import tensorboard: run scripts/install-deps.sh (or set ZT_SKIP_TENSORBOARD=1)"
        exit 1
    fi
    local logdir=$out/tb/job tbcheck=(python3 "$here/check_tensorboard.py")
    local run=(--set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=2 --set eval.every=3
               --set eval.batches=2 --set checkpoint.every=2 --set checkpoint.final=false
               --set tensorboard.enabled=true --set tensorboard.output_path="$out/tb" --set tensorboard.job_name=job)
    expect_ok "TensorBoard: writing events to $logdir/events.out.tfevents." -- "$zt_run" "${common[@]}" "${run[@]}" \
        --output-dir "$out" --set steps=4
    "${tbcheck[@]}" compare "$logdir" "$out/metrics.jsonl" 4 || zt_failures=$((zt_failures + 1))
    local first=("$logdir"/events.out.tfevents.*)
    [ ${#first[@]} -eq 1 ] || { echo "FAIL: ${#first[@]} event files after one session"; zt_failures=$((zt_failures + 1)); }
    "${tbcheck[@]}" torn "${first[0]}" || zt_failures=$((zt_failures + 1))
    truncate -s -9 "${first[0]}" # killed while writing step 4's event
    cp "${first[0]}" "$out/first.torn"
    expect_ok "resumed from $out/checkpoints/step-000002 at step 2" -- "$zt_run" "${common[@]}" "${run[@]}" \
        --output-dir "$out" --set steps=5 --resume latest
    cmp -s "${first[0]}" "$out/first.torn" || { echo "FAIL: resuming changed the first event file"; zt_failures=$((zt_failures + 1)); }
    local files=("$logdir"/events.out.tfevents.*)
    [ ${#files[@]} -eq 2 ] || { echo "FAIL: ${#files[@]} event files after a resume, expected 2"; zt_failures=$((zt_failures + 1)); }
    "${tbcheck[@]}" compare "$logdir" "$out/metrics.jsonl" 4 --torn "${first[0]}" || zt_failures=$((zt_failures + 1))

    # --check: the directory is made and written to before a run starts
    local check=(--set model.preset=tiny)
    printf 'x' >"$out/a-file"
    expect_fail "cannot create TensorBoard directory" "set tensorboard.output_path" -- "$zt_run" --check "${check[@]}" \
        --output-dir "$out/c" --set tensorboard.enabled=true --set tensorboard.output_path="$out/a-file/tb"
    expect_ok "check passed" -- "$zt_run" --check "${check[@]}" --output-dir "$out/c" --set tensorboard.enabled=true \
        --set tensorboard.output_path="$out/c/tb"
    [ -d "$out/c/tb/DeepSpeedJobName" ] || { echo "FAIL: --check did not make DeepSpeed's default job directory"; zt_failures=$((zt_failures + 1)); }
    expect_fail "tensorboard.output_path and tensorboard.job_name are both empty" -- "$zt_run" --check "${check[@]}" \
        --output-dir "$out/c" --set tensorboard.enabled=true --set tensorboard.job_name=
    printf '{"tensorboard": {"enabled": "yes", "output_path": "%s"}}\n' "$out/c/tb" >"$out/string.json"
    expect_fail "config key 'tensorboard.enabled' must be" -- "$zt_run" --check "${check[@]}" --output-dir "$out/c" \
        --config "$out/string.json"
    printf '{"tensorboard": {"enabled": true, "output_path": 3}}\n' >"$out/number.json"
    expect_fail "config key 'tensorboard.output_path' must be" -- "$zt_run" --check "${check[@]}" --output-dir "$out/c" \
        --config "$out/number.json"
    printf '{"tensorboard": {"enabled": true, "outputpath": "tb"}}\n' >"$out/typo.json"
    expect_fail "unknown config key 'tensorboard.outputpath'" "did you mean 'tensorboard.output_path'?" -- \
        "$zt_run" --check "${check[@]}" --output-dir "$out/c" --config "$out/typo.json"
}

case $test in
    prepare_data | fixture) ;;
    *) rm -rf "$out" && mkdir -p "$out" ;; # every run starts from nothing
esac
"$test" "$@"
finish
