#!/usr/bin/env bash
# The watchdog: a job whose ranks stop meeting must end by itself, every rank, with a message that
# names the collective, well before the stuck rank's 60 s sleep (comm_check.c, run_stuck).
#   skip        rank 1 never joins all_reduce #3 on 'world'; comm.timeout_s = 2
#   skip-group  rank 2 never creates group 'even' = [0, 2]; comm.timeout_s = 2
#   kill        rank 1 dies by SIGKILL before all_reduce #3; comm.timeout_s = 10, so it is mpirun,
#               not the watchdog, that ends the job, and rank 0 says where it stood
#   fail-alone  rank 1 stops with an error before all_reduce #3 and shuts down; comm.timeout_s = 2:
#               it waits in the shutdown barrier, rank 0 in all_reduce #3, and the watchdog ends both
# usage: watchdog.sh MODE NPROC MPIEXEC COMM_CHECK TEST_LIB
set -u
mode=$1 np=$2 mpiexec=$3 comm_check=$4
. "$5"

fail() { echo "FAIL: $*"; zt_failures=$((zt_failures+1)); }

start=$(date +%s%N)
out=$("$mpiexec" -np "$np" --oversubscribe --allow-run-as-root "$comm_check" "$mode" 2>&1)
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out"
echo "mpirun exited with $rc after $elapsed_ms ms"

[ "$rc" -ne 0 ] || fail "the job exited 0; a stuck or dead rank must fail it"
# Well under the stuck rank's sleep: the job ended by itself, it did not wait the rank out.
[ "$elapsed_ms" -lt 15000 ] || fail "the job took $elapsed_ms ms to end"
has() { grep -qF -- "$1" <<<"$out" || fail "expected '$1' in the job's output"; }
lacks() { ! grep -qF -- "$1" <<<"$out" || fail "did not expect '$1' in the job's output"; }
lacks "the job was not ended"
case $mode in
skip)
    has "zt[rank 0] error: timed out after 2 s in all_reduce #3 on group 'world' (4 bytes of F32); the other ranks did not reach it: one may have crashed or be stuck elsewhere"
    has "raise comm.timeout_s"
    has "ending every rank of the job"
    lacks "zt[rank 1] error: timed out" # rank 1 was asleep, not in a collective
    ;;
skip-group)
    has "zt[rank 0] error: timed out after 2 s in creating group 'even' (world ranks [0, 2]); rank 2 did not reach it: a rank may have crashed, be stuck elsewhere, or be creating its groups in another order"
    ;;
kill)
    # mpirun names the rank that died; rank 0, still waiting for it, says where it stood.
    grep -qE "rank 1 .*(signal 9|Killed)" <<<"$out" || fail "expected mpirun to name rank 1 as killed"
    has "zt[rank 0] SIGTERM while this rank waited in all_reduce #3 on group 'world' (4 bytes of F32) for the other ranks"
    lacks "timed out" # mpirun ended the job before the watchdog's 10 s
    ;;
fail-alone)
    has "rank 1: stopping with an error of its own"
    # Whichever watchdog fires first ends the job; each names where its rank waited.
    rank0="zt\[rank 0\] error: timed out after 2 s in all_reduce #3 on group 'world'"
    rank1="zt\[rank 1\] error: timed out after 2 s in the shutdown barrier \(every rank waits for the others"
    rank1+=" before MPI_Finalize\); the other ranks did not finish"
    grep -qE "$rank0|$rank1" <<<"$out" || fail "expected rank 0's or rank 1's timeout message"
    ;;
esac
finish
