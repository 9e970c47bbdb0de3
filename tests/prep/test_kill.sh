#!/usr/bin/env bash
# Crash safety: a zt-prep killed (SIGKILL) while tokenizing or while writing shards leaves neither a
# manifest.json nor a shard in the output directory, a killed run over a previous output leaves that
# output intact, Ctrl-C (SIGINT) cleans up and exits 130, and the next run removes the leftovers.
# usage: test_kill.sh ZT_PREP TOKENIZER_DIR WORK_DIR TEST_LIB
set -u
prep=$1 tok=$2/prep.model work=$3
. "$4"
rm -rf "$work"
mkdir -p "$work"
cd "$work"

# A large input (one record repeated), so that there is time to kill the run in each phase.
line='{"instruction": "Summarize the following paragraph in one sentence.", "input": "The library opened a new reading room on the third floor. It has forty seats, quiet lamps and a view over the park.", "output": "The library has a new forty-seat reading room with a park view on the third floor."}'
yes "$line" | head -n 60000 > big.jsonl

fail() { echo "FAIL: $*"; zt_failures=$((zt_failures+1)); }

# Wait until `cond` holds (checked every 10 ms, at most ~20 s); returns 1 on timeout.
wait_for() {
    for _ in $(seq 2000); do
        if eval "$1"; then return 0; fi
        sleep 0.01
    done
    return 1
}

# Starts zt-prep on big.jsonl into $1 in the background; sets $pid.
start() {
    "$prep" big.jsonl -t "$tok" -o "$1" --threads 1 --shard-tokens 256K --no-progress > "$1.log" 2>&1 &
    pid=$!
}

no_output_visible() {
    local dir=$1 what=$2
    [ -e "$dir/manifest.json" ] && fail "$what: manifest.json exists"
    ls "$dir"/*.ztshard >/dev/null 2>&1 && fail "$what: a shard is visible in $dir: $(ls "$dir")"
    return 0
}

# 1. Killed while tokenizing: the spill file is growing, no shard exists yet.
start out1
wait_for '[ -s out1/.zt-prep-tmp-*/samples.spill ]' || fail "tokenizing never started: $(cat out1.log)"
kill -KILL "$pid"; wait "$pid" 2>/dev/null
no_output_visible out1 "killed while tokenizing"

# 2. Killed while writing shards (a shard file exists in the temp directory).
start out2
wait_for 'ls out2/.zt-prep-tmp-*/train-*.ztshard >/dev/null 2>&1' || fail "no shard was ever written: $(cat out2.log)"
kill -KILL "$pid"; wait "$pid" 2>/dev/null
no_output_visible out2 "killed while writing shards"

# 3. The next run cleans up after the killed one and succeeds.
expect_ok "left by an interrupted run" "wrote" -- "$prep" big.jsonl -t "$tok" -o out2 --no-progress --shard-tokens 256K
[ -e out2/manifest.json ] || fail "the run after a killed one wrote no manifest"
ls -a out2 | grep -q zt-prep-tmp && fail "a temp directory is left in out2: $(ls -a out2)"

# 4. Killed while replacing a previous output: the previous output is intact.
cp out2/manifest.json before.json
sum_before=$(cat out2/*.ztshard | cksum)
"$prep" big.jsonl -t "$tok" -o out2 --threads 1 --shard-tokens 256K --seed 5 --no-progress > out2b.log 2>&1 &
pid=$!
wait_for '[ -s out2/.zt-prep-tmp-*/samples.spill ]' || fail "second run never started: $(cat out2b.log)"
kill -KILL "$pid"; wait "$pid" 2>/dev/null
cmp -s before.json out2/manifest.json || fail "the previous manifest changed"
[ "$(cat out2/*.ztshard | cksum)" = "$sum_before" ] || fail "the previous shards changed"

# 5. Ctrl-C: exit status 130, a message, nothing left behind.
start out3
wait_for '[ -s out3/.zt-prep-tmp-*/samples.spill ]' || fail "third run never started: $(cat out3.log)"
kill -INT "$pid"; wait "$pid"; rc=$?
[ "$rc" -eq 130 ] || fail "SIGINT: exit status $rc, expected 130: $(cat out3.log)"
grep -q "interrupted; the output directory was left as it was" out3.log || fail "SIGINT message: $(cat out3.log)"
no_output_visible out3 "interrupted"
ls -a out3 | grep -q zt-prep-tmp && fail "SIGINT left a temp directory: $(ls -a out3)"

# 6. A second run into a directory that a running zt-prep is writing is refused.
start out4
wait_for '[ -s out4/.zt-prep-tmp-*/samples.spill ]' || fail "fourth run never started: $(cat out4.log)"
expect_fail "another zt-prep is writing into 'out4' right now" -- "$prep" big.jsonl -t "$tok" -o out4
kill -KILL "$pid"; wait "$pid" 2>/dev/null

finish
