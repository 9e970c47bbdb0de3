#!/usr/bin/env bash
# The supervisor of `zt-run --nproc N` on GPUs, on any machine: comm_check --fork N starts its
# children exactly as --nproc starts GPU ranks (ZT_NPROC_FORK skips only the GPU and NCCL checks).
# The children really meet at the TCP rendezvous (ZT_MASTER_ADDR/ZT_MASTER_PORT from the launch)
# and check rank 0's id; then one fails, dies, or the job is signalled, and the job must say which
# rank and how, end the others, and exit non-zero, well within the 10 s grace. Last, torchrun's flags
# (comm_check --fork-nodes): two supervisors as two machines of 2 ranks each, the ranks numbered
# across the job, meeting at the given address.
# usage: fork.sh COMM_CHECK TEST_LIB
set -u
comm_check=$1
. "$2"

# Every rank meets; rank 0's lines are as a single process writes them, the others' are prefixed.
expect_ok "[rank 1] rank 1 of 2: got the id (launcher zt-run --nproc, local rank 1, NCCL_NVLS_ENABLE=0)" \
          "[rank 1] rank 1: pid" -- "$comm_check" --fork 2 fork-child ok
grep -qx "rank 0 of 2: got the id (launcher zt-run --nproc, local rank 0, NCCL_NVLS_ENABLE=0)" <<<"$ZT_OUT" ||
    { echo "FAIL: rank 0's line is not unprefixed:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
expect_ok "[rank 3] rank 3 of 4: got the id" "[rank 2] rank 2 of 4: got the id" -- "$comm_check" --fork=4 fork-child ok
# An NCCL_NVLS_ENABLE the user set is kept.
expect_ok "[rank 1] rank 1 of 2: got the id (launcher zt-run --nproc, local rank 1, NCCL_NVLS_ENABLE=7)" -- \
    env NCCL_NVLS_ENABLE=7 "$comm_check" --fork 2 fork-child ok

# A rank that fails: named with its exit code, which becomes the job's.
expect_fail "zt-run: rank 1 of 2 exited with code 3" -- "$comm_check" --fork 2 fork-child fail
[ "$ZT_RC" -eq 3 ] || { echo "FAIL: the job's exit code is the failed rank's (3), got $ZT_RC"; zt_failures=$((zt_failures+1)); }

# A rank that fails while another is stuck: the other is ended (SIGTERM), promptly.
start=$SECONDS
expect_fail "zt-run: rank 1 of 2 exited with code 5; ending the other ranks" -- "$comm_check" --fork 2 fork-child stuck
[ "$ZT_RC" -eq 5 ] || { echo "FAIL: exit code 5 expected, got $ZT_RC"; zt_failures=$((zt_failures+1)); }
[ $((SECONDS - start)) -lt 15 ] || { echo "FAIL: the stuck rank was not ended promptly"; zt_failures=$((zt_failures+1)); }

# A rank that dies by a signal: named with it; the job exits 128 + 9.
_zt_run "$comm_check" --fork 2 fork-child kill
if [ "$ZT_RC" -ne 137 ] || ! grep -qF "zt-run: rank 1 of 2 was killed by signal 9" <<<"$ZT_OUT"; then
    echo "FAIL: a killed rank: expected exit 137 and its name, got $ZT_RC:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1))
fi

# SIGTERM to the launching process reaches every rank, and none is left behind.
log=$(mktemp)
"$comm_check" --fork 2 fork-child sleep >"$log" 2>&1 &
job=$!
for _ in $(seq 100); do [ "$(grep -c "pid" "$log")" -ge 2 ] && break; sleep 0.1; done
kill -TERM "$job"
wait "$job"
rc=$?
pids=$(sed -n 's/.*rank [0-9]*: pid \([0-9]*\),.*/\1/p' "$log")
[ "$(wc -w <<<"$pids")" -eq 2 ] || { echo "FAIL: both ranks should have started:"; cat "$log"; zt_failures=$((zt_failures+1)); }
[ "$rc" -ne 0 ] || { echo "FAIL: a job ended by SIGTERM exits non-zero"; zt_failures=$((zt_failures+1)); }
grep -qF "was killed by signal 15" "$log" || { echo "FAIL: expected the rank ended by SIGTERM to be named:"; cat "$log"; zt_failures=$((zt_failures+1)); }
for p in $pids; do
    if kill -0 "$p" 2>/dev/null; then echo "FAIL: rank process $p outlived the job"; zt_failures=$((zt_failures+1)); kill -KILL "$p"; fi
done
rm -f "$log"

# A user's interrupt (SIGINT, SIGTERM) is recorded in the job directory before the ranks get it, so
# they take it for one to save a checkpoint for; ranks that stop for it with 130 have not failed: the
# job exits 130 and names nobody.
for sig in INT TERM; do
    log=$(mktemp)
    "$comm_check" --fork 2 fork-child interrupt >"$log" 2>&1 &
    job=$!
    for _ in $(seq 100); do [ "$(grep -c "pid" "$log")" -ge 2 ] && break; sleep 0.1; done
    sleep 0.2 # both have registered in the job directory
    kill "-$sig" "$job"
    wait "$job"
    rc=$?
    [ "$rc" -eq 130 ] || { echo "FAIL: SIG$sig: a job its ranks stopped with 130 exits 130, got $rc:"; cat "$log"; zt_failures=$((zt_failures+1)); }
    for want in "rank 0: SIG$sig, an interrupt to save for (1 interrupt(s) recorded; 0 rank(s) in trouble)" \
                "[rank 1] rank 1: SIG$sig, an interrupt to save for (1 interrupt(s) recorded"; do
        grep -qF "$want" "$log" || { echo "FAIL: SIG$sig: expected '$want':"; cat "$log"; zt_failures=$((zt_failures+1)); }
    done
    if grep -qE "exited with code|ending the other ranks|killed by" "$log"; then
        echo "FAIL: SIG$sig: an interrupted rank was reported as a failure:"; cat "$log"; zt_failures=$((zt_failures+1))
    fi
    rm -f "$log"
done

# A rank killed: the supervisor's SIGTERM to the other is no interrupt, and the job directory names
# the rank that died.
_zt_run "$comm_check" --fork 2 fork-child teardown
pid1=$(sed -n 's/.*rank 1: pid \([0-9]*\),.*/\1/p' <<<"$ZT_OUT")
for want in "zt-run: rank 1 of 2 was killed by signal 9 (Killed; pid $pid1)" \
            "rank 0: SIGTERM, the job is torn down (0 interrupt(s) recorded; 1 rank(s) in trouble: rank 1 (pid $pid1) has died"; do
    grep -qF "$want" <<<"$ZT_OUT" || { echo "FAIL: teardown: expected '$want':"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
done
[ "$ZT_RC" -eq 137 ] || { echo "FAIL: teardown: expected exit 137, got $ZT_RC"; zt_failures=$((zt_failures+1)); }

# torchrun's flags: two supervisors, as on two machines, each start their machine's ranks (node 1:
# ranks 2 and 3 of 4, local ranks 0 and 1), which all meet rank 0 at --master-addr:--master-port.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
node1=$(mktemp)
nodes=(--nnodes 2 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port")
"$comm_check" --fork-nodes "${nodes[@]}" --node-rank 1 fork-child ok >"$node1" 2>&1 &
node1_job=$!
expect_ok "rank 0 of 4: got the id (launcher zt-run --nproc, local rank 0," "rank 0 of 4: local rank 0 of 2" \
          "[rank 1] rank 1 of 4: got the id (launcher zt-run --nproc, local rank 1," "[rank 1] rank 1 of 4: local rank 1 of 2" -- \
    "$comm_check" --fork-nodes "${nodes[@]}" --node-rank 0 fork-child ok
wait "$node1_job" || { echo "FAIL: node 1's supervisor failed:"; cat "$node1"; zt_failures=$((zt_failures+1)); }
for want in "[rank 2] rank 2 of 4: got the id (launcher zt-run --nproc, local rank 0," "[rank 2] rank 2 of 4: local rank 0 of 2" \
            "[rank 3] rank 3 of 4: got the id (launcher zt-run --nproc, local rank 1," "[rank 3] rank 3 of 4: local rank 1 of 2"; do
    grep -qF "$want" "$node1" || { echo "FAIL: node 1: expected '$want':"; cat "$node1"; zt_failures=$((zt_failures+1)); }
done
# A rank that fails is named by its rank in the whole job, by its own machine's supervisor.
"$comm_check" --fork-nodes --nnodes 2 --master-addr 127.0.0.1 --master-port "$port" --node-rank 1 fork-child fail \
    >"$node1" 2>&1 &
node1_job=$!
expect_ok "rank 0 of 2: got the id" -- \
    "$comm_check" --fork-nodes --nnodes 2 --master-addr 127.0.0.1 --master-port "$port" --node-rank 0 fork-child fail
wait "$node1_job"
rc=$?
[ "$rc" -eq 3 ] && grep -qF "zt-run: rank 1 of 2 exited with code 3" "$node1" ||
    { echo "FAIL: node 1's failed rank: expected exit 3 and 'rank 1 of 2 exited with code 3', got $rc:"; cat "$node1"; zt_failures=$((zt_failures+1)); }
rm -f "$node1"
finish
