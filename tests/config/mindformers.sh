#!/usr/bin/env bash
# MindFormers users on zt-run: a MindFormers-style run_llama_7b.yaml (mindformers/, written for these tests)
# checked with --check, training from a MindFormers YAML against the same run spelt in zt's JSON, and
# MindFormers' launcher flags (--use_parallel, --device_num, --run_mode, --load_checkpoint).
#   mindformers.sh ZT_RUN ZT_PREP SOURCE_DIR WORK_DIR FIXTURES_DIR
set -u
zt_run=$1 zt_prep=$2 src=$3 work=$4 fixtures=$5
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
python3 -c "import json" 2>/dev/null || skip "python3 is needed to read the resolved configs"

rm -rf "$work" && mkdir -p "$work"
data=$work/data
yaml7b=$here/mindformers/run_llama_7b.yaml
hf=$fixtures/llama_mha_tied
expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$data" \
    --val-fraction 0.05 --seed 0 --no-progress

# The output of the last expect_ok / expect_fail must not contain this.
not_in_output() {
    if grep -qF -- "$1" <<<"$ZT_OUT"; then
        echo "FAIL: '$1' in the output:"; echo "$ZT_OUT"; zt_failures=$((zt_failures + 1))
    fi
}

# resolved.py FILE KEY=JSON_VALUE@SOURCE...: each key's value and its _sources entry (SOURCE without the
# directory of the YAML file; '-' for any source).
check_resolved() {
    if ! python3 - "$@" <<'EOF'; then
import json, os, sys
d = json.load(open(sys.argv[1]))
bad = 0
for spec in sys.argv[2:]:
    key, rest = spec.split("=", 1)
    want, source = rest.rsplit("@", 1)
    v = d
    for part in key.split("."):
        v = v[part]
    got_source = d["_sources"][key]
    got_source = got_source.replace(os.path.dirname(sys.argv[1]) + "/", "").replace("file:" + os.environ["YAMLDIR"] + "/", "file:")
    if v != json.loads(want) or (source != "-" and got_source != source):
        print("FAIL: %s is %s from %r; expected %s from %r" % (key, json.dumps(v), got_source, want, source))
        bad += 1
sys.exit(1 if bad else 0)
EOF
        zt_failures=$((zt_failures + 1))
    fi
}
export YAMLDIR=$here/mindformers

# ---- run_llama_7b.yaml under --check --------------------------------------------------------------------

# With the sizes at 1, the seed's list of trainable_params is taken.
expect_ok '"trainable_params": "layers.31,layers.30",' \
    '"trainable_params": "file:'"$yaml7b"':96 (MindFormers train_config.trainable_params)",' -- \
    "$zt_run" --check --config "$yaml7b" --set device=cpu --set parallel_config.model_parallel=1 \
    --set parallel_config.data_parallel=1 --output-dir "$work/check"
# As it is, its parallel_config (data 2 x model 4) alone selects the parallel plugin, whose schema joins.
expect_ok '"parallel.virtual_stages": "default"' -- "$zt_run" --check --config "$yaml7b" --set device=cpu \
    --output-dir "$work/check"
# With those two set on the command line, every MindFormers key reaches its zt key (values from the YAML
# file and MindFormers' definitions: 8/3 x 4096 rounded up to 256 is 11008, 1e-5 / 1e-4 is 0.1,
# 65536 is 2^16, optimizer_shard is ZeRO-1).
expect_ok "check passed" \
    "run_llama_7b.yaml:107:1: context (mode, device_target, max_call_depth, max_device_memory, save_graphs, device_id) (MindFormers) has no effect in zt" \
    "optimizer.type AdamWeightDecay is zt's adamw" "no bias correction" \
    "parallel_config.optimizer_shard: true is ZeRO stage 1 in zt" \
    "runner_config.sink_mode, runner_config.sink_size (MindFormers) have no effect in zt" \
    "use_parallel is True (" "zt-run runs one process" -- \
    "$zt_run" --check --config "$yaml7b" --set device=cpu --set parallel_config.model_parallel=1 \
    --set parallel_config.data_parallel=1 --set trainable_params=layers.31,layers.30 --output-dir "$work/check"
r=$work/check/config.resolved.json
check_resolved "$r" \
    'seed=42@file:run_llama_7b.yaml:5' \
    'auto_trans_ckpt=true@file:run_llama_7b.yaml:9' \
    'epochs=3@file:run_llama_7b.yaml:19 (MindFormers runner_config.epochs)' \
    'train_micro_batch_size_per_gpu=2@file:run_llama_7b.yaml:20 (MindFormers runner_config.batch_size)' \
    'gradient_accumulation_steps=4@file:run_llama_7b.yaml:21 (MindFormers runner_config.gradient_accumulation_steps)' \
    'optimizer.type="adamw"@file:run_llama_7b.yaml:26 (MindFormers optimizer.type AdamWeightDecay)' \
    'optimizer.params.betas=[0.9, 0.95]@file:run_llama_7b.yaml:27 (MindFormers optimizer.beta1, optimizer.beta2)' \
    'optimizer.params.eps=1e-8@file:run_llama_7b.yaml:29 (MindFormers optimizer.eps)' \
    'optimizer.params.weight_decay=0.1@file:run_llama_7b.yaml:30 (MindFormers optimizer.weight_decay)' \
    'optimizer.params.lr=1e-4@file:run_llama_7b.yaml:31 (MindFormers optimizer.learning_rate)' \
    'scheduler.type="WarmupCosineLR"@file:run_llama_7b.yaml:34 (MindFormers lr_schedule.type CosineWithWarmUpLR)' \
    'scheduler.params.warmup_max_lr=1e-4@file:run_llama_7b.yaml:35 (MindFormers lr_schedule.learning_rate)' \
    'scheduler.params.cos_min_ratio=0.1@file:run_llama_7b.yaml:36 (MindFormers lr_schedule.lr_end / lr_schedule.learning_rate)' \
    'scheduler.params.warmup_num_steps=20@file:run_llama_7b.yaml:37 (MindFormers lr_schedule.warmup_steps)' \
    'scheduler.params.total_num_steps=null@default' \
    'data.shuffle=true@file:run_llama_7b.yaml:44 (MindFormers train_dataset.data_loader.shuffle)' \
    'zero_optimization.stage=1@file:run_llama_7b.yaml:78 (MindFormers parallel_config.optimizer_shard: true)' \
    'parallel_config.pipeline_stage=1@file:run_llama_7b.yaml:73' \
    'recompute=true@file:run_llama_7b.yaml:86 (MindFormers recompute_config.recompute)' \
    'trainable_params="layers.31,layers.30"@--set' \
    'checkpoint.every=100@file:run_llama_7b.yaml:102 (MindFormers callbacks CheckpointMointor.save_checkpoint_steps)' \
    'checkpoint.keep=2@file:run_llama_7b.yaml:103 (MindFormers callbacks CheckpointMointor.keep_checkpoint_max)' \
    'data.seq_len=2048@file:run_llama_7b.yaml:119 (MindFormers model.model_config.seq_length)' \
    'model.hidden_size=4096@file:run_llama_7b.yaml:120 (MindFormers model.model_config.hidden_size)' \
    'model.num_hidden_layers=32@file:run_llama_7b.yaml:121 (MindFormers model.model_config.num_layers)' \
    'model.num_attention_heads=32@file:run_llama_7b.yaml:122 (MindFormers model.model_config.num_heads)' \
    'model.vocab_size=32000@file:run_llama_7b.yaml:123 (MindFormers model.model_config.vocab_size)' \
    'model.intermediate_size=11008@-' \
    'model.max_position_embeddings=null@default' \
    'model.rms_norm_eps=1e-6@file:run_llama_7b.yaml:125 (MindFormers model.model_config.rms_norm_eps)' \
    'bf16.enabled=true@file:run_llama_7b.yaml:130 (MindFormers model.model_config.compute_dtype bfloat16)' \
    'fp16.enabled=false@-' \
    'fp16.initial_scale_power=16@file:run_llama_7b.yaml:161 (MindFormers runner_wrapper.scale_sense.loss_scale_value = 2^initial_scale_power)' \
    'fp16.loss_scale_window=1000@-' \
    'gradient_clipping=1@-'
# The seed's launch line, with its MindSpore checkpoint: what zt reads instead.
: >"$work/llama-7b.ckpt"
expect_fail "is a MindSpore checkpoint: zt cannot read MindSpore checkpoints" "convert it to a Hugging Face model directory" -- \
    "$zt_run" --config "$yaml7b" --use_parallel True --device_num 8 --run_mode finetune \
    --load_checkpoint "$work/llama-7b.ckpt"

# ---- training from a MindFormers YAML, against the same run in zt's JSON ----------------------------------

mkdir -p "$work/mf"
cat >"$work/mf/run.yaml" <<EOF
seed: 7
run_mode: 'train'
runner_config:
  epochs: 1
  batch_size: 2
  gradient_accumulation_steps: 2
  sink_mode: True
optimizer:
  type: AdamWeightDecay
  beta1: 0.9
  beta2: 0.95
  eps: 1.e-8
  weight_decay: 0.1
  learning_rate: 2.e-3
lr_schedule:
  type: CosineWithWarmUpLR
  learning_rate: 2.e-3
  lr_end: 5.e-4
  warmup_steps: 1
  total_steps: 4
train_dataset: &ds
  data_loader:
    type: MindDataset
    dataset_dir: "$data"
    shuffle: True
  batch_size: 2
train_dataset_task:
  dataset_config: *ds
model:
  model_config:
    type: LlamaConfig
    seq_length: 128
    hidden_size: 64
    num_layers: 2
    num_heads: 4
    n_kv_heads: 2
    multiple_of: 32
    rms_norm_eps: 1.0e-5
    compute_dtype: "bfloat16"
  arch:
    type: LlamaForCausalLM
recompute_config:
  recompute: True
callbacks:
  - type: MFLossMonitor
  - type: CheckpointMointor
    save_checkpoint_steps: 2
    keep_checkpoint_max: 2
context:
  device_target: "GPU"
parallel_config:
  data_parallel: 1
  model_parallel: 1
  pipeline_stage: 1
  optimizer_shard: False
EOF
# The same run in zt's own keys, written by hand (8/3 x 64 rounded up to 32 is 192; 5e-4 / 2e-3 is 0.25).
cat >"$work/mf/run.json" <<EOF
{"seed": 7, "epochs": 1, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
 "optimizer": {"type": "adamw", "params": {"betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "lr": 2e-3}},
 "scheduler": {"type": "WarmupCosineLR",
               "params": {"warmup_max_lr": 2e-3, "cos_min_ratio": 0.25, "warmup_num_steps": 1, "total_num_steps": 4}},
 "data": {"path": "$data", "shuffle": true, "seq_len": 128},
 "model": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 192, "rms_norm_eps": 1e-5},
 "bf16": {"enabled": true}, "fp16": {"enabled": false}, "recompute": true,
 "checkpoint": {"every": 2, "keep": 2},
 "parallel_config": {"data_parallel": 1, "model_parallel": 1, "pipeline_stage": 1},
 "zero_optimization": {"stage": 0}}
EOF
run=(--set steps=4 --set threads=2 --set device=cpu)
expect_ok "data_loader.dataset_dir is zt's data.path" -- "$zt_run" --config "$work/mf/run.yaml" "${run[@]}" \
    --output-dir "$work/mf/yaml"
expect_ok -- "$zt_run" --config "$work/mf/run.json" "${run[@]}" --output-dir "$work/mf/json"
# Every resolved value the same (only where they came from differs), and the same losses, exactly.
if ! python3 - "$work/mf/yaml/config.resolved.json" "$work/mf/json/config.resolved.json" <<'EOF'; then
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for d in (a, b):
    for k in ("_sources", "_plugins", "_notes", "output_dir"):
        d.pop(k, None)
if a != b:
    print("FAIL: the YAML and JSON runs resolve differently:\n%s\n%s" % (json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True)))
    sys.exit(1)
EOF
    zt_failures=$((zt_failures + 1))
fi
if ! python3 "$src/tests/train/check.py" same-metrics "$work/mf/yaml/metrics.jsonl" "$work/mf/json/metrics.jsonl" 0; then
    zt_failures=$((zt_failures + 1))
fi
if ! python3 "$src/tests/train/check.py" train-steps "$work/mf/yaml/metrics.jsonl" 1,2,3,4; then
    zt_failures=$((zt_failures + 1))
fi

# ---- MindFormers' launcher flags ----------------------------------------------------------------------

small=(--data "$data" --set model.preset=tiny --set device=cpu --output-dir "$work/flags")
# --device_num N with use_parallel: --nproc N (a dry run shows the ranks without starting them)
expect_ok "--device_num 2 is zt-run --nproc 2" "2 data-parallel ranks" -- \
    "$zt_run" --dry-run "${small[@]}" --use_parallel True --device_num 2
expect_fail "--device_num 2 asks for 2 ranks, but use_parallel is False (--use_parallel)" -- \
    "$zt_run" --dry-run "${small[@]}" --use_parallel False --device_num 2
expect_fail "--device_num 2 and --nproc 3 disagree: give one (zt's option is --nproc)" -- \
    "$zt_run" --dry-run "${small[@]}" --device_num 2 --nproc 3
expect_fail "--use_parallel 'maybe': expected True or False" -- "$zt_run" --dry-run "${small[@]}" --use_parallel maybe
# a rank of a launched job: --device_num must be the job's size, and starts nothing
ZT_OUT=$(ZT_RANK=0 ZT_WORLD_SIZE=4 "$zt_run" --dry-run "${small[@]}" --device_num 2 2>&1); ZT_RC=$?
if [ "$ZT_RC" -eq 0 ] || ! grep -qF "is rank 0 of 4 (from ZT_WORLD_SIZE): give --device_num 4" <<<"$ZT_OUT"; then
    echo "FAIL: --device_num 2 in a rank of 4:"; echo "$ZT_OUT"; zt_failures=$((zt_failures + 1))
fi
ZT_OUT=$(ZT_RANK=1 ZT_WORLD_SIZE=2 "$zt_run" --check --config "$work/mf/run.yaml" --set device=cpu --set model.vocab_size=512 \
         --output-dir "$work/flags" --use_parallel True --device_num 2 2>&1); ZT_RC=$?
if [ "$ZT_RC" -ne 0 ]; then echo "FAIL: --device_num 2 in rank 1 of 2:"; echo "$ZT_OUT"; zt_failures=$((zt_failures + 1)); fi
not_in_output "is zt-run --nproc"
not_in_output "info: $work/mf/run.yaml" # the notes are rank 0's to log (every rank prints them in the resolved config)
# --run_mode
expect_fail "run_mode eval (--run_mode): zt has no evaluation-only run" "eval.every" -- \
    "$zt_run" "${small[@]}" --run_mode eval
expect_fail "run_mode 'test' (--run_mode): expected train, finetune, predict or eval" -- \
    "$zt_run" "${small[@]}" --run_mode test
expect_fail "run_mode finetune (--run_mode) starts from trained weights, but none are given" -- \
    "$zt_run" "${small[@]}" --run_mode finetune
sed 's/^run_mode: .train./run_mode: predict/' "$work/mf/run.yaml" >"$work/mf/predict.yaml"
expect_fail "run_mode predict (" "predict.yaml:2:11): zt-run trains unless it generates" -- \
    "$zt_run" --config "$work/mf/predict.yaml" --set device=cpu
# predict is --generate: the same tokens as zt-run --generate --model
gen=(--prompt-ids 1,5,9 --max-new-tokens 4)
expect_ok -- "$zt_run" --generate --model "$hf" "${gen[@]}"
want=$ZT_OUT
expect_ok "--run_mode predict is zt-run --generate: of" "load_checkpoint $hf (--load_checkpoint) is zt-run --model" -- \
    "$zt_run" --run_mode predict --config "$work/mf/run.yaml" --load_checkpoint "$hf" "${gen[@]}"
if [ "$(grep -v '^zt info' <<<"$ZT_OUT")" != "$(grep -v '^zt info' <<<"$want")" ]; then
    echo "FAIL: --run_mode predict generated other tokens than --generate:"; echo "$ZT_OUT"; echo "$want"
    zt_failures=$((zt_failures + 1))
fi
expect_fail "--run_mode predict is zt-run --generate, where --export has no effect" -- \
    "$zt_run" --run_mode predict --load_checkpoint "$hf" "${gen[@]}" --export "$work/x"
# load_checkpoint: an HF directory is --model (the same dry run), a zt checkpoint --resume. The dry runs
# say how much host memory the machine has: a fixed figure, so two of them print the same.
fixed_mem=(env ZT_HOST_MEM_AVAILABLE=64GiB)
expect_ok -- "${fixed_mem[@]}" "$zt_run" --dry-run --data "$data" --set device=cpu --output-dir "$work/flags" --model "$hf"
want=$(grep -v '^zt info' <<<"$ZT_OUT")
expect_ok "is zt-run --model" -- "${fixed_mem[@]}" "$zt_run" --dry-run --data "$data" --set device=cpu --output-dir "$work/flags" \
    --run_mode finetune --load_checkpoint "$hf"
if [ "$(grep -v '^zt info' <<<"$ZT_OUT")" != "$want" ]; then
    echo "FAIL: --load_checkpoint HF_DIR is not --model HF_DIR:"; echo "$ZT_OUT"; zt_failures=$((zt_failures + 1))
fi
expect_fail "give one of them" -- "$zt_run" --dry-run "${small[@]}" --load_checkpoint "$hf" --resume latest
expect_ok "(--load_checkpoint) is zt-run --resume" "resumed from $work/mf/yaml/checkpoints/step-000004 at step 4" -- \
    "$zt_run" --config "$work/mf/run.yaml" --set steps=5 --set threads=2 --set device=cpu --output-dir "$work/mf/yaml" \
    --load_checkpoint "$work/mf/yaml/checkpoints"
sed "s|^run_mode: .train.|load_checkpoint: $hf\nresume_training: True|" "$work/mf/run.yaml" >"$work/mf/resume.yaml"
expect_fail "resume_training is true (" "resume.yaml:3:18), but load_checkpoint '$hf' is a Hugging Face model directory" -- \
    "$zt_run" --config "$work/mf/resume.yaml" --set device=cpu
sed "s|^run_mode: .train.|load_checkpoint: $work/mf/yaml/checkpoints\nresume_training: False|" "$work/mf/run.yaml" \
    >"$work/mf/noresume.yaml"
expect_fail "resume_training is false (" "zt starts new runs from Hugging Face weights only" -- \
    "$zt_run" --config "$work/mf/noresume.yaml" --set device=cpu
mkdir -p "$work/ms/rank_0" && : >"$work/ms/rank_0/llama_7b_rank_0-10_2.ckpt"
expect_fail "holds MindSpore checkpoints (.ckpt)" -- "$zt_run" "${small[@]}" --load_checkpoint "$work/ms"
expect_fail "load_checkpoint '$work/nothing' (--load_checkpoint): no such file or directory" -- \
    "$zt_run" "${small[@]}" --load_checkpoint "$work/nothing"
expect_fail "--device_num is for runs and has no effect with --list-plugins" -- "$zt_run" --list-plugins --device_num 2
finish
