#!/usr/bin/env bash
# The main job on the bundled default: install dependencies, build, prepare the bundled example data
# (examples/data), train a tiny LLaMA on it from scratch on the CPU (one to two minutes on two cores),
# printing the falling loss, then answer held-out instructions (examples/data/heldout.json) with it.
#
#   ZT_BUILD_DIR=DIR           the build to use (default: build)
#   ZT_QUICKSTART_DIR=DIR      where the data, the run and its checkpoints go (default: out/quickstart)
#   ZT_QUICKSTART_STEPS=N      optimizer steps (default 900; tests/generate runs a shorter schedule)
#   ZT_QUICKSTART_NO_BUILD=1   skip installing and building: use ZT_BUILD_DIR as it is
#
# Training runs on the CPU, with the default plugins (naive attention): this tiny model (head size 24)
# is sized for a two-core CPU; the GPU path (--plugins flash, docs/gpu.md) takes head sizes 64 and 128.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${ZT_QUICKSTART_NO_BUILD:-0}" != 1 ]; then
    scripts/install-deps.sh --run # what running zt needs; scripts/test.sh installs the tests' references too
    scripts/build.sh
fi
bin=${ZT_BUILD_DIR:-build}/bin
work=${ZT_QUICKSTART_DIR:-out/quickstart}
steps=${ZT_QUICKSTART_STEPS:-900}
mkdir -p "$work"
started=$SECONDS

echo "== zt-prep: examples/data/tasks.json -> $work/data"
rm -rf "$work/data" "$work/run"
"$bin/zt-prep" examples/data/tasks.json -t examples/data/tokenizer.model -o "$work/data" --max-len 128 --no-progress
"$bin/zt-prep" --inspect "$work/data" --n 1

# A LLaMA of 0.5M parameters: 4 layers, hidden 96, 4 heads, vocabulary 512 (the data set's tokenizer).
# Rows of 256 tokens hold three samples of about 85 tokens; the loss is taken on the answers only.
# A high peak learning rate with warm-up and cosine decay learns the tasks within the budget.
# device=cpu: the same fp32 run, and the same answers, on machines with and without a GPU.
echo "== zt-run: training for $steps steps (the loss is the cross-entropy of the answer tokens)"
"$bin/zt-run" --data "$work/data" --output-dir "$work/run" --set device=cpu \
    --set model.hidden_size=96 --set model.intermediate_size=256 --set model.num_hidden_layers=4 \
    --set model.num_attention_heads=4 --set model.max_position_embeddings=256 --set model.rms_norm_eps=1e-5 \
    --set data.seq_len=256 --set train_micro_batch_size_per_gpu=8 --set seed=1 \
    --set optimizer.params.lr=4e-3 --set optimizer.params.weight_decay=0 \
    --set scheduler.params.warmup_num_steps=30 --set steps="$steps" --set log.every=$(( (steps + 9) / 10 ))

# Held-out questions (examples/data/heldout.json): capitals asked in another phrasing, and a word the
# model never saw. Capitals and letter counts come out right; reversing an unseen word is hard for a
# model this small (it gets close). The template and tokenizer come from the data set's manifest,
# which the checkpoint points at.
echo "== zt-run --generate: answers to held-out instructions (greedy decoding)"
ask() {
    local instruction=$1 input=${2:-}
    printf '%s%s\n  -> ' "$instruction" "${input:+ [$input]}"
    "$bin/zt-run" --generate --resume "$work/run/checkpoints" --prompt "$instruction" ${input:+--input "$input"} \
        --max-new-tokens 24 2>"$work/generate.log" || { cat "$work/generate.log"; return 1; }
}
ask "What is the capital of Norway?"
ask "Name the capital city of Kenya."
ask "How many letters does the word have?" "window"
ask "Reverse the word." "window"
echo "== done in $((SECONDS - started)) s; the model and its metrics are in $work/run"
