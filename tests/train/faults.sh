#!/usr/bin/env bash
# Faults injected into training, as permanent tests (docs/training.md "Ctrl-C", docs/distributed.md
# "Stopping a job, and when a rank fails"). One test per call:
#   faults.sh ZT_RUN SOURCE_DIR WORK_DIR TEST [ARGS...]
#   kill9 SEED...      one CPU process killed by SIGKILL at random points, inside checkpoint writes
#                      too, then --resume latest until done: its per-step losses are bit for bit those
#                      of a run never killed, and every checkpoint that looks valid is whole
#   nproc_kill         under zt-run --nproc 2, rank 1 killed by SIGKILL
#   nproc_stop         under zt-run --nproc 2, rank 1 stopped by SIGSTOP
#                      (both: every rank is gone within comm.timeout_s plus a margin, zt-run exits
#                      non-zero and names rank 1 by its pid, rank 0 names it too, nobody claims a
#                      checkpoint)
#   mpirun_flight_stop MPIEXEC  under your own mpirun -np 3, rank 1 stopped: a timed-out rank's flight
#                      recorder names it (no dump) and the collective the others wait in
#   mpirun_kill MPIEXEC  under your own mpirun -np 2, rank 1 killed by SIGKILL: rank 0 cannot tell
#                      mpirun's SIGTERM from a user's, and says so instead of promising a checkpoint
#   flight_stop        under zt-run --nproc 3, rank 1 stopped by SIGSTOP: the flight recorder's
#                      analysis names it by rank and pid as stopped, and the collective ranks 0 and 2
#                      wait in, which their own dumps (read by check_flight.py) hold open; each dump
#                      holds the last comm.flight_recorder.entries collectives in order
#   flight_kill        under zt-run --nproc 2, rank 1 killed by SIGKILL: found by elimination (no
#                      dump, killed by signal 9, its pid), rank 0's dump checked the same way
#   nproc_interrupt    Ctrl-C (SIGINT to the process group, as a terminal sends it) and SIGTERM to
#                      zt-run alone, under --nproc 2: exit 130, a checkpoint, no message of a failure,
#                      and the resumed run computes what an uninterrupted one does
# The data is train.data's (run_test.sh prepare_data); the model is tiny, so each test takes seconds.
set -u
zt_run=$1 src=$2 work=$3 test=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/lib.sh"
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"

data=$work/data
out=$work/faults-$test
[ -f "$data/manifest.json" ] || skip "no prepared data in $data (train.data prepares it)"
rm -rf "$out" && mkdir -p "$out"
tiny=(--data "$data" --set device=cpu --set model.hidden_size=32 --set model.intermediate_size=64
      --set model.num_hidden_layers=1 --set model.num_attention_heads=2 --set model.num_key_value_heads=1
      --set data.seq_len=128 --set train_micro_batch_size_per_gpu=2 --set threads=1 --set log.every=1000
      --set scheduler.params.total_num_steps=1000 --set scheduler.params.warmup_num_steps=5)

fail() { echo "FAIL: $*"; zt_failures=$((zt_failures + 1)); }
has() { grep -qF -- "$1" "$2" || { fail "expected '$1' in $2:"; cat "$2"; }; }
lacks() { ! grep -qF -- "$1" "$2" || { fail "did not expect '$1' in $2:"; cat "$2"; }; }

check() { python3 "$here/check.py" "$@" || zt_failures=$((zt_failures + 1)); }
checkpoints_whole() { python3 "$here/check_checkpoints.py" "$1" || zt_failures=$((zt_failures + 1)); }

# Milliseconds since the epoch, without forking (EPOCHREALTIME: bash 5).
now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }

# Waits (up to 30 s) until `file` has at least `n` lines, or process `pid` is gone.
wait_lines() {
    local file=$1 n=$2 pid=$3 i
    for i in $(seq 300); do
        [ -f "$file" ] && [ "$(wc -l <"$file")" -ge "$n" ] && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# ---- one process, killed at random points ------------------------------------------------------

# The reference: the same run, never killed.
kill9_reference() {
    expect_ok -- "$zt_run" "${tiny[@]}" "$@" --output-dir "$out/reference"
}

# One round: starts the run (resuming when there is a checkpoint), waits, kills it with SIGKILL.
# `how` is "delay MS" (a random moment: start-up, a step, or a checkpoint write, which dominates a
# step of this model) or "inside STEP" (the moment the staging directory of checkpoint STEP exists,
# so the kill lands inside that write; missed when the write is over first: then at once after it).
kill9_round() {
    local dir=$1 how=$2 arg=$3
    shift 3
    local resume=()
    [ -f "$dir/checkpoints/latest" ] && resume=(--resume latest)
    "$zt_run" "${tiny[@]}" "$@" --output-dir "$dir" "${resume[@]}" >>"$dir/rounds.log" 2>&1 &
    local pid=$! staging
    if [ "$how" = delay ]; then
        sleep "$(printf '0.%03d' "$arg")"
    else
        staging=$(printf '%s/checkpoints/step-%06d' "$dir" "$arg")
        while kill -0 "$pid" 2>/dev/null; do
            compgen -G "$staging.tmp-*" >/dev/null && break
            [ -d "$staging" ] && break
        done
    fi
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    echo "round: $how $arg: $(ls "$dir/checkpoints" 2>/dev/null | tr '\n' ' ')"
    checkpoints_whole "$dir/checkpoints"
}

# For each seed: a kill at a random moment, then one inside a random checkpoint's write, then the
# run to its end through --resume latest, against the reference.
kill9() {
    local run=(--set steps=12 --set checkpoint.every=1 --set seed=3)
    kill9_reference "${run[@]}"
    local seed
    for seed in "$@"; do
        RANDOM=$seed
        local dir=$out/seed$seed
        mkdir -p "$dir"
        kill9_round "$dir" delay $((RANDOM % 400)) "${run[@]}"
        local done_step=0 # the next write to kill inside: one of those still to come
        [ -f "$dir/checkpoints/latest" ] && done_step=$((10#$(sed 's/step-//' "$dir/checkpoints/latest")))
        [ "$done_step" -lt 12 ] && kill9_round "$dir" inside $((done_step + 1 + RANDOM % (12 - done_step))) "${run[@]}"
        local resume=()
        [ -f "$dir/checkpoints/latest" ] && resume=(--resume latest)
        expect_ok -- "$zt_run" "${tiny[@]}" "${run[@]}" --output-dir "$dir" "${resume[@]}"
        check same-metrics "$out/reference/metrics.jsonl" "$dir/metrics.jsonl" 0
        checkpoints_whole "$dir/checkpoints"
    done
}

# ---- zt-run --nproc 2 ----------------------------------------------------------------------------

# The children of process $1 (from /proc, so no procps is needed).
children() {
    local stat pid comm state ppid rest
    for stat in /proc/[0-9]*/stat; do
        read -r pid comm state ppid rest <"$stat" 2>/dev/null || continue
        [ "$ppid" = "$1" ] && echo "$pid"
    done
}

# The pid of rank $2 of the job zt-run $1 started: a child of its mpirun.
rank_pid() {
    local p
    for p in $(children "$(children "$1")"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$p"
    done
}

# Whether process $1 still runs (a zombie waiting for its parent does not).
running() {
    local state
    state=$(sed 's/.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# Starts `zt-run --nproc ${NPROC:-2}` with comm.timeout_s = $2 (and any further arguments), waits for 3
# steps and sends rank 1 signal $1; then every rank must be gone within $3 s, and zt-run must exit
# non-zero naming rank 1.
nproc_fault() {
    local sig=$1 timeout=$2 limit=$3 log=$out/$1.log
    shift 3
    "$zt_run" --nproc "${NPROC:-2}" "${tiny[@]}" --output-dir "$out/$sig" --set steps=100000 \
        --set comm.timeout_s="$timeout" "$@" >"$log" 2>&1 &
    local zt=$!
    wait_lines "$out/$sig/metrics.jsonl" 3 "$zt" || { fail "the job did not start training"; cat "$log"; return; }
    local r0 r1
    r0=$(rank_pid "$zt" 0) r1=$(rank_pid "$zt" 1)
    [ -n "$r0" ] && [ -n "$r1" ] || { fail "cannot find the ranks' pids under zt-run $zt"; kill -KILL "$zt"; return; }
    local start
    start=$(now_ms)
    kill "-$sig" "$r1"
    wait "$zt"
    local rc=$? took=$(($(now_ms) - start)) p
    echo "zt-run --nproc ${NPROC:-2} exited with $rc $took ms after SIG$sig to rank 1 (pid $r1); rank 0 was pid $r0"
    cat "$log"
    [ "$rc" -ne 0 ] || fail "the job exited 0 after rank 1 got SIG$sig"
    [ "$took" -lt $((limit * 1000)) ] || fail "the job took $took ms to end, more than $limit s"
    for p in "$r0" "$r1"; do
        for _ in $(seq 20); do running "$p" || break; sleep 0.1; done
        running "$p" && { fail "rank pid $p outlived the job"; kill -CONT "$p"; kill -KILL "$p"; }
    done
    lacks "saving a checkpoint" "$log"
    lacks "interrupt:" "$log"
    NPROC_R1=$r1 NPROC_LOG=$log
}

nproc_kill() {
    nproc_fault KILL 30 10 # mpirun ends the job at once; the watchdog's 30 s must not be needed
    has "zt-run: rank 1 of 2 was killed by signal 9 (Killed; pid $NPROC_R1)" "$NPROC_LOG"
    has "zt[rank 0] SIGTERM: the launcher is ending the job, and this rank stops now, without a checkpoint" "$NPROC_LOG"
    has "rank 1 (pid $NPROC_R1) has died" "$NPROC_LOG"
    lacks "timed out" "$NPROC_LOG"
}

nproc_stop() {
    nproc_fault STOP 2 12 # 2 s of watchdog (or zt-run's 2 s past it), the teardown, a margin
    grep -qE "zt-run: rank 1 of 2 \(pid $NPROC_R1\) (has been|was) stopped" "$NPROC_LOG" ||
        fail "expected zt-run to name rank 1 (pid $NPROC_R1) as stopped"
    # rank 0 names it too: in its watchdog's timeout, or as it is ended
    grep -qE "rank 1 (of 2 )?\(pid $NPROC_R1\) (is|has been) stopped" "$NPROC_LOG" ||
        fail "expected rank 0 to name rank 1 (pid $NPROC_R1) as stopped"
}

# The directory zt-run kept the flight recorder's dumps in (its last line says).
flight_dir() {
    sed -n 's/^zt-run: flight recorder: the ranks.* dumps stay in \([^ ]*\) .*/\1/p' "$1" | tail -n 1
}

flight_stop() {
    NPROC=3 nproc_fault STOP 2 15 --set comm.flight_recorder.entries=16
    grep -qE "^zt-run: flight recorder: rank 1 \(pid $NPROC_R1, stopped for [0-9]+ s: SIGSTOP" "$NPROC_LOG" ||
        fail "expected the flight recorder to name rank 1 (pid $NPROC_R1) as stopped"
    local dir
    dir=$(flight_dir "$NPROC_LOG")
    [ -n "$dir" ] && [ -d "$dir" ] || { fail "zt-run did not say where the dumps are"; return; }
    python3 "$here/check_flight.py" "$dir" 16 0,2 "$NPROC_LOG" 1 wait || zt_failures=$((zt_failures + 1))
    # After the fact, from the dumps alone (the directory is kept).
    expect_ok "the dumps of" -- "$zt_run" --flight-recorder "$dir"
    rm -rf "$dir"
}

flight_kill() {
    nproc_fault KILL 30 10 --set comm.flight_recorder.entries=16
    has "zt-run: flight recorder: rank 1 (pid $NPROC_R1, killed by signal 9) left no dump" "$NPROC_LOG"
    local dir
    dir=$(flight_dir "$NPROC_LOG")
    [ -n "$dir" ] && [ -d "$dir" ] || { fail "zt-run did not say where the dumps are"; return; }
    [ ! -e "$dir/rank-1.flight.jsonl" ] || fail "a rank killed by SIGKILL cannot have written a dump"
    python3 "$here/check_flight.py" "$dir" 16 0 "$NPROC_LOG" 1 || zt_failures=$((zt_failures + 1))
    rm -rf "$dir"
}

mpirun_kill() {
    local mpiexec=$1 log=$out/mpirun.log
    "$mpiexec" -np 2 --oversubscribe --allow-run-as-root "$zt_run" "${tiny[@]}" --output-dir "$out/run" \
        --set steps=100000 >"$log" 2>&1 &
    local job=$!
    wait_lines "$out/run/metrics.jsonl" 3 "$job" || { fail "the job did not start training"; cat "$log"; return; }
    local r1
    r1=$(for p in $(children "$job"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && echo "$p"; done)
    [ -n "$r1" ] || { fail "cannot find rank 1 under mpirun $job"; kill -KILL "$job"; return; }
    kill -KILL "$r1"
    wait "$job"
    local rc=$?
    cat "$log"
    [ "$rc" -ne 0 ] || fail "the job exited 0 after rank 1 was killed"
    has "zt[rank 0] SIGTERM: finishing the current step, then saving a checkpoint if every rank is still there" "$log"
    lacks "interrupt: finishing the current step, then saving a checkpoint" "$log"
}

# Under your own mpirun (no zt-run supervisor) the ranks whose watchdog times out dump their last
# collectives into the output directory, and the first of them, once the others' dumps are there,
# says which rank is behind: rank 1, stopped by SIGSTOP, left no dump, and ranks 0 and 2 wait for it.
mpirun_flight_stop() {
    local mpiexec=$1 log=$out/mpirun-flight.log
    "$mpiexec" -np 3 --oversubscribe --allow-run-as-root "$zt_run" "${tiny[@]}" --output-dir "$out/run" \
        --set steps=100000 --set comm.timeout_s=2 --set comm.flight_recorder.entries=16 >"$log" 2>&1 &
    local job=$!
    wait_lines "$out/run/metrics.jsonl" 3 "$job" || { fail "the job did not start training"; cat "$log"; return; }
    local r1
    r1=$(for p in $(children "$job"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && echo "$p"; done)
    [ -n "$r1" ] || { fail "cannot find rank 1 under mpirun $job"; kill -KILL "$job"; return; }
    kill -STOP "$r1"
    local i
    for i in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$job" 2>/dev/null && { fail "mpirun still runs 30 s after rank 1 was stopped"; kill -KILL "$job"; }
    wait "$job"
    local rc=$?
    kill -KILL "$r1" 2>/dev/null # mpirun's teardown continues it (SIGCONT, SIGTERM): it may dump then
    cat "$log"
    [ "$rc" -ne 0 ] || fail "the job exited 0 after rank 1 was stopped"
    grep -qE "^zt\[rank [02]\] flight recorder: rank 1 .*left no dump" "$log" ||
        fail "expected a rank's flight recorder to name rank 1 as the one that left no dump"
    grep -qE "^zt\[rank [02]\] flight recorder: .*rank[s]? [0-9, ]*wait" "$log" ||
        fail "expected the flight recorder to say which ranks wait, and in which collective"
    ls "$out/run/"rank-*.flight.jsonl >/dev/null 2>&1 || fail "no dump in the output directory $out/run"
}

# Ctrl-C as a terminal sends it (SIGINT to zt-run's process group), then SIGTERM to zt-run alone;
# each time exit 130 with a checkpoint and no message of a failure; then the resumed run against one
# never interrupted.
nproc_interrupt() {
    local how
    for how in group term; do
        local dir=$out/$how log=$out/$how.log
        set -m # the job gets a process group of its own, as in a terminal
        "$zt_run" --nproc 2 "${tiny[@]}" --output-dir "$dir" --set steps=100000 >"$log" 2>&1 &
        local zt=$!
        set +m
        wait_lines "$dir/metrics.jsonl" 3 "$zt" || { fail "$how: the job did not start training"; cat "$log"; continue; }
        if [ "$how" = group ]; then kill -INT -- "-$zt"; else kill -TERM "$zt"; fi
        wait "$zt"
        local rc=$?
        echo "$how: zt-run --nproc 2 exited with $rc"
        cat "$log"
        [ "$rc" -eq 130 ] || fail "$how: exit status $rc, expected 130"
        local steps saved
        steps=$(python3 "$here/check.py" last-step "$dir/metrics.jsonl")
        saved=$dir/checkpoints/step-$(printf %06d "$steps")
        has "zt[rank 0] interrupted after step $steps of 100000; its checkpoint is in $saved" "$log"
        has "zt[rank 0] interrupt: finishing the current step, then saving a checkpoint" "$log"
        has "zt[rank 1] interrupt: finishing the current step, then saving a checkpoint" "$log"
        local word
        for word in SIGTERM failed died killed "exited with" aborted "non-zero" "Primary job" error; do
            lacks "$word" "$log"
        done
        checkpoints_whole "$dir/checkpoints"
        expect_ok "step-$(printf %06d "$steps")" -- cat "$dir/checkpoints/latest"
        # Resumed to 2 steps past it, under --nproc 2: what 2 ranks never interrupted compute.
        local total=$((steps + 2))
        expect_ok "resumed from $saved at step $steps" -- "$zt_run" --nproc 2 "${tiny[@]}" --output-dir "$dir" \
            --set steps=$total --resume latest
        expect_ok -- "$zt_run" --nproc 2 "${tiny[@]}" --output-dir "$dir-straight" --set steps=$total
        check same-metrics "$dir-straight/metrics.jsonl" "$dir/metrics.jsonl" 0
    done
}

"$test" "$@"
finish
