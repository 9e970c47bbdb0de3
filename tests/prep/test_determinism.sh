#!/usr/bin/env bash
# The same inputs and options give byte-identical output (every shard and manifest.json) for any
# --threads: records are tokenized in parallel batches but collected in input order.
# usage: test_determinism.sh ZT_PREP TOKENIZER_DIR TEST_DATA_DIR WORK_DIR TEST_LIB
set -u
prep=$1 tok=$2/prep.model data=$3 work=$4
. "$5"
rm -rf "$work"
mkdir -p "$work"
cd "$work"

# Many records of varied length, so batches finish out of order on several threads.
seq 1 6000 | awk '{ printf "{\"instruction\": \"Add %d and %d, then explain the steps%s.\", \"input\": \"\", \"output\": \"%d%s\"}\n",
                    $1, $1 * 7, substr(" in great detail, step by step, with examples", 1, ($1 * 13) % 45), $1 * 8,
                    substr(" because adding the units and then the tens gives the total", 1, ($1 * 31) % 60) }' > many.jsonl
inputs=("$data/en.json" "$data/zh.json" "$data/emoji.json" "$data/history.json" many.jsonl "$data/long.json")
for t in 1 2 4; do
    expect_ok "wrote" -- "$prep" "${inputs[@]}" -t "$tok" -o "out$t" --threads "$t" --val-fraction 0.05 \
        --seed 42 --shard-tokens 64K --max-len 128 --no-progress
done
n=$(ls out1 | wc -l)
[ "$n" -gt 3 ] || { echo "FAIL: expected several shards, got: $(ls out1)"; zt_failures=$((zt_failures+1)); }
for t in 2 4; do
    if ! diff -r out1 "out$t" >/dev/null; then
        echo "FAIL: --threads 1 and --threads $t differ: $(diff -rq out1 "out$t")"; zt_failures=$((zt_failures+1))
    fi
done
# A different seed changes the order (and so the bytes), the same seed does not.
expect_ok -- "$prep" "${inputs[@]}" -t "$tok" -o seed43 --val-fraction 0.05 --seed 43 --shard-tokens 64K --max-len 128
cmp -s out1/train-00000.ztshard seed43/train-00000.ztshard && { echo "FAIL: --seed 43 gave the same shard as --seed 42"; zt_failures=$((zt_failures+1)); }
finish
