#!/usr/bin/env bash
# GPU ranks through NCCL on a machine with 2 GPUs (or more: the first 2 are used). Prints PASS/FAIL
# per check and exits non-zero when one failed; exits 77 (skip) with fewer than 2 GPUs or without
# the NCCL backend.
#   usage: tests/comm/gpu2.sh BUILD_DIR
# Checks: every collective on device buffers against host-computed values (nccl_check collectives,
# started by the --nproc supervisor); the watchdog (rank 1 never joins a collective: rank 0 ends
# with the message within comm.timeout_s); a rank killed mid-job; torchrun-style variables with
# MASTER_ADDR/MASTER_PORT; mpirun without an address (the id goes through MPI); zt-run --nproc 2
# refusing more ranks than GPUs; and, with ZT_GPU_TEST_DATA (scripts/gpu.sh sets it), 3 training
# steps of zt-run --nproc 2 on the GPUs.
set -u
build=$(cd "${1:?usage: gpu2.sh BUILD_DIR}" && pwd)
nccl_check=$build/bin/nccl_check
zt_run=$build/bin/zt-run
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} # no NVLink multicast on the lent machines
[ -x "$nccl_check" ] || { echo "SKIP: $nccl_check was not built (no NCCL found by CMake?)"; exit 77; }
[ -f "$build/lib/zt/libzt-comm-nccl.so" ] || { echo "SKIP: no libzt-comm-nccl.so in $build/lib/zt"; exit 77; }
n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${n_gpus:-0}" -ge 2 ] || { echo "SKIP: these checks need 2 GPUs, nvidia-smi lists ${n_gpus:-0}"; exit 77; }

failures=0
log_dir=${OUT:-$build}/gpu2-logs
mkdir -p "$log_dir"
# check NAME EXPECTED_RC(ok|fail|N) MAX_SECONDS "needle"... -- command...
check() {
    local name=$1 want=$2 max_s=$3; shift 3
    local needles=()
    while [ "$1" != "--" ]; do needles+=("$1"); shift; done; shift
    local log="$log_dir/$name.log" start=$SECONDS
    if declare -F "$1" >/dev/null; then "$@" >"$log" 2>&1; else timeout 300 "$@" >"$log" 2>&1; fi
    local rc=$? took=$((SECONDS - start)) why=""
    case $want in
        ok) [ "$rc" -eq 0 ] || why="exit $rc, expected 0" ;;
        fail) { [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; } || why="exit $rc, expected a failure (not 0, not the 300 s timeout)" ;;
        *) [ "$rc" -eq "$want" ] || why="exit $rc, expected $want" ;;
    esac
    [ -z "$why" ] && [ "$took" -gt "$max_s" ] && why="took ${took} s, more than $max_s s"
    for n in "${needles[@]}"; do
        [ -z "$why" ] && ! grep -qF -- "$n" "$log" && why="'$n' not in the output"
    done
    if [ -z "$why" ]; then
        echo "PASS: $name (${took} s)"
    else
        echo "FAIL: $name: $why; last lines of $log:"
        tail -n 25 "$log" | sed 's/^/    /'
        failures=$((failures + 1))
    fi
}

check collectives ok 240 "rank 0: nccl_check collectives passed" "[rank 1] rank 1: nccl_check collectives passed" -- \
    "$nccl_check" --nproc 2 collectives
check watchdog 1 40 "zt-run: rank 0 of 2: all_reduce #3 on group 'world' (1 x F32) has not completed after 3 s; a peer rank is probably dead or stuck" \
    "comm.timeout_s" "zt-run: rank 0 of 2 exited with code 1" -- "$nccl_check" --nproc 2 skip
check killed-rank fail 40 "zt-run: rank 1 of 2 was killed by signal 9" -- "$nccl_check" --nproc 2 kill

# torchrun's variables, each rank started by hand.
port=$((29500 + RANDOM % 2000))
torchrun_like() {
    local pids=() rc=0
    for r in 0 1; do
        env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$nccl_check" launched 2 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}
check torchrun-variables ok 120 "rank 0 of 2: sum of ranks 1 on GPU 0" "rank 1 of 2: sum of ranks 1 on GPU 1" -- torchrun_like
# Rank 0 missing: rank 1 gives up after comm.timeout_s (5 s here) naming the address.
alone() { env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 1)) "$nccl_check" launched 2 5; }
check rendezvous-timeout fail 30 "rank 1 of 2 could not reach the rendezvous at 127.0.0.1:$((port + 1)) after 5 s" -- alone

if command -v mpirun >/dev/null && [ -f "$build/lib/zt/libzt-comm-mpi.so" ]; then
    root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
    check mpirun-id-through-mpi ok 120 "rank 0 of 2: sum of ranks 1 on GPU 0" "rank 1 of 2: sum of ranks 1 on GPU 1" -- \
        env -u ZT_MASTER_ADDR -u MASTER_ADDR OMPI_MCA_btl_vader_single_copy_mechanism=none \
        mpirun -np 2 "${root[@]}" --bind-to none "$nccl_check" launched 2
    check mpirun-with-address ok 120 "rank 1 of 2: sum of ranks 1 on GPU 1" -- \
        env ZT_MASTER_ADDR=127.0.0.1 ZT_MASTER_PORT=$((port + 2)) OMPI_MCA_btl_vader_single_copy_mechanism=none \
        mpirun -np 2 "${root[@]}" --bind-to none "$nccl_check" launched 2
else
    echo "SKIP: mpirun checks (no mpirun, or zt built without MPI)"
fi

check nproc-more-than-gpus 2 20 "starts one rank per GPU, but this process sees" -- \
    "$zt_run" --nproc $((n_gpus + 1)) --set device=cuda --data /nonexistent

if [ -n "${ZT_GPU_TEST_DATA:-}" ]; then
    check zt-run-nproc-2-train ok 240 "[rank 1]" -- \
        "$zt_run" --nproc 2 --data "$ZT_GPU_TEST_DATA" --set device=cuda --set model.preset=tiny --set steps=3 \
        --set comm.timeout_s=120
else
    echo "SKIP: zt-run --nproc 2 training (set ZT_GPU_TEST_DATA to a prepared data dir)"
fi

echo "gpu2.sh: $failures check(s) failed; logs in $log_dir"
[ "$failures" -eq 0 ]
