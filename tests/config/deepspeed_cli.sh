#!/usr/bin/env bash
# DeepSpeed users on zt-run: ds_config files written here in the shapes the Hugging Face Trainer's,
# LLaMA-Factory's and DeepSpeed-Chat's configs have (every "auto" they use, the ZeRO-3 tuning keys, monitor
# sections switched off, steps_per_print, Adam with adam_w_mode, a static fp16 loss scale), run as they are
# through zt-run --check, --dry-run (the batch rule over --nproc ranks) and a few training steps.
#   deepspeed_cli.sh ZT_RUN ZT_PREP SOURCE_DIR WORK_DIR
set -u
zt_run=$1 zt_prep=$2 src=$3 work=$4
. "$src/tests/lib.sh"
python3 -c "import json" 2>/dev/null || skip "python3 is needed to read the resolved configs"
rm -rf "$work" && mkdir -p "$work"
data=$work/data
expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$data" \
    --no-progress
tiny=(--set model.preset=tiny --set data.seq_len=128 --set threads=2)

# resolved FILE KEY=JSON_VALUE[@SOURCE_SUBSTRING]...: each key's value (and its _sources entry) in a resolved config
resolved() {
    if ! python3 - "$@" <<'PY'; then
import json, sys
d = json.load(open(sys.argv[1]))
bad = 0
for spec in sys.argv[2:]:
    key, rest = spec.split("=", 1)
    want, _, source = rest.partition("@")
    v = d
    for part in key.split("."):
        v = v[part]
    if v != json.loads(want) or source not in d["_sources"][key]:
        print("FAIL: %s is %s from %r; expected %s from %r" % (key, json.dumps(v), d["_sources"][key], want, source))
        bad += 1
sys.exit(1 if bad else 0)
PY
        zt_failures=$((zt_failures + 1))
    fi
}

# ---- the Trainer's ZeRO-3 config: "auto" everywhere --------------------------------------------------
cat >"$work/hf_z3.json" <<'JSON'
{
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "zero_optimization": {
    "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true}, "overlap_comm": true, "contiguous_gradients": true,
    "sub_group_size": 1e9, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true
  },
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false
}
JSON
expect_ok "check passed" "train_batch_size \"auto\" is 16" "reduce_bucket_size \"auto\" is 82944" \
    "zero_optimization.sub_group_size (DeepSpeed) has no effect in zt" -- \
    "$zt_run" --check --config "$work/hf_z3.json" "${tiny[@]}" --nproc 2 --set gradient_accumulation_steps=2 \
    --output-dir "$work/z3"
# the tiny preset's hidden size is 288: 288^2, floor(0.9 x 288^2), 10 x 288
resolved "$work/z3/config.resolved.json" 'train_batch_size=16@DeepSpeed' 'gradient_accumulation_steps=2@--set' \
    'train_micro_batch_size_per_gpu=4@auto' 'gradient_clipping=1.0@auto' 'fp16.enabled=false@auto' \
    'zero_optimization.reduce_bucket_size=82944@hidden_size 288' \
    'zero_optimization.stage3_prefetch_bucket_size=74649@hidden_size 288' \
    'zero_optimization.stage3_param_persistence_threshold=2880@hidden_size 288' \
    'zero_optimization.stage3_max_live_parameters=1000000000@file' 'steps_per_print=2000@file'
# a dry run knows its ranks too
expect_ok "the estimate is also in" "train_batch_size \"auto\" is 12" -- "$zt_run" --dry-run --config "$work/hf_z3.json" \
    "${tiny[@]}" --nproc 3 --output-dir "$work/z3dry"
# and it trains as it is, a few steps
expect_ok "step 3/3" -- "$zt_run" --config "$work/hf_z3.json" "${tiny[@]}" --data "$data" --set steps=3 \
    --set checkpoint.final=false --output-dir "$work/z3train"

# ---- LLaMA-Factory-style ZeRO-0/2: keys accepted without effect --------------------------------------
cat >"$work/lf_z0.json" <<'JSON'
{
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto", "zero_allow_untested_optimizer": true,
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "zero_optimization": {"stage": 0, "allgather_partitions": true, "allgather_bucket_size": 5e8, "overlap_comm": false,
                        "reduce_scatter": true, "reduce_bucket_size": 5e8, "contiguous_gradients": true,
                        "round_robin_gradients": true}
}
JSON
expect_ok "check passed" "zero_allow_untested_optimizer (DeepSpeed) has no effect in zt" \
    "round_robin_gradients (DeepSpeed) has no effect in zt" -- \
    "$zt_run" --check --config "$work/lf_z0.json" "${tiny[@]}" --output-dir "$work/z0"
resolved "$work/z0/config.resolved.json" 'zero_optimization.reduce_bucket_size=500000000@file' \
    'zero_allow_untested_optimizer=true@file'

# ---- DeepSpeed-Chat-style: global batch and micro-batch, Adam, monitors off, timing -----------------
cat >"$work/chat.json" <<'JSON'
{
  "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 2,
  "zero_optimization": {"stage": 2, "offload_param": {"device": "none"}, "offload_optimizer": {"device": "none"},
                        "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 3e7,
                        "stage3_prefetch_bucket_size": 3e7},
  "fp16": {"enabled": true, "loss_scale_window": 100},
  "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                                          "adam_w_mode": false}},
  "gradient_clipping": 1.0, "prescale_gradients": false, "wall_clock_breakdown": true,
  "tensorboard": {"enabled": false, "output_path": "tb/", "job_name": "step1"},
  "wandb": {"enabled": false}, "csv_monitor": {"enabled": false}, "comet": {"enabled": false},
  "hybrid_engine": {"enabled": false, "max_out_tokens": 512}
}
JSON
# 8 = 2 x accumulation x 1 rank: accumulation 4
expect_ok "step 4/4" "step 2/4" "step 4 time (wall_clock_breakdown, rank 0): forward" "prescale_gradients is false" -- \
    "$zt_run" --config "$work/chat.json" "${tiny[@]}" --data "$data" --set steps=4 --set checkpoint.final=false \
    --output-dir "$work/chat"
resolved "$work/chat/config.resolved.json" 'gradient_accumulation_steps=4@DeepSpeed' 'log.every=1@default' \
    'optimizer.type="Adam"@file' 'optimizer.params.adam_w_mode=false@file'
if grep -q "step 3/4" <<<"$ZT_OUT"; then echo "FAIL: steps_per_print 2 logged step 3"; zt_failures=$((zt_failures + 1)); fi
# over 2 ranks: 8 = 2 x 2 x 2; over 3 the division is not exact: named with the three values and the ranks
expect_ok "check passed" -- "$zt_run" --check --config "$work/chat.json" "${tiny[@]}" --nproc 2 --output-dir "$work/c2"
resolved "$work/c2/config.resolved.json" 'gradient_accumulation_steps=2@DeepSpeed'
expect_fail "train_batch_size is not a multiple of train_micro_batch_size_per_gpu x data-parallel size" \
    "train_batch_size 8 ($work/chat.json:2:23)" "over 3 data-parallel ranks" -- \
    "$zt_run" --check --config "$work/chat.json" "${tiny[@]}" --nnodes 1 --nproc-per-node 3 --output-dir "$work/c3"
expect_fail "the batch sizes do not agree" "over 2 data-parallel ranks" "(2 x 4 x 2 = 16)" -- \
    "$zt_run" --dry-run --config "$work/chat.json" "${tiny[@]}" --nproc 2 --set gradient_accumulation_steps=4 \
    --output-dir "$work/c4"

# ---- switched on, what zt does not do is named with its key -------------------------------------------
cat >"$work/on.json" <<'JSON'
{"wandb": {"enabled": true, "project": "p"}, "zero_optimization": {"stage": 1}, "prescale_gradients": true}
JSON
expect_fail "DeepSpeed key 'wandb.enabled' is true ($work/on.json:1:12)" \
    "DeepSpeed key 'prescale_gradients' is true" -- "$zt_run" --check --config "$work/on.json" "${tiny[@]}" \
    --output-dir "$work/on"
expect_fail "fp16.loss_scale" "must be" -- "$zt_run" --check "${tiny[@]}" --set fp16.loss_scale=-1 --output-dir "$work/on"
expect_fail "log.every is 3 but steps_per_print (DeepSpeed's name of the same setting) is 2" -- \
    "$zt_run" --check --config "$work/chat.json" "${tiny[@]}" --set log.every=3 --output-dir "$work/on"

finish
