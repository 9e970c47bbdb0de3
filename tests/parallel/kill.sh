#!/usr/bin/env bash
# A rank killed inside a pipeline schedule (pp_transfers.c, kill mode: rank 1 of 4 dies by SIGKILL in
# the middle of its instruction list) ends every rank, well before the watchdog's 10 s, with mpirun
# naming the dead rank and the ranks that waited on it saying in which transfer they stood.
#   kill.sh MPIEXEC PP_TRANSFERS TEST_LIB
set -u
mpiexec=$1 pp_transfers=$2
. "$3"
fail() { echo "FAIL: $*"; zt_failures=$((zt_failures + 1)); }
start=$(date +%s%N)
out=$(timeout 60 "$mpiexec" -np 4 --oversubscribe --allow-run-as-root "$pp_transfers" kill 8 2>&1)
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "$out"
echo "mpirun exited with $rc after $elapsed_ms ms"
[ "$rc" -ne 0 ] || fail "the job exited 0; a dead rank must fail it"
[ "$rc" -ne 124 ] || fail "the job hung"
[ "$elapsed_ms" -lt 15000 ] || fail "the job took $elapsed_ms ms to end"
grep -qE "rank 1 .*(signal 9|Killed)" <<<"$out" || fail "expected mpirun to name rank 1 as killed"
grep -qE "zt\[rank (0|2)\] SIGTERM while this rank waited in (send|recv) #[0-9]+ (to|from) rank 1 on group 'pp'" <<<"$out" ||
    fail "expected a neighbour of rank 1 to say in which transfer on 'pp' it waited"
! grep -qF "the job was not ended" <<<"$out" || fail "a rank ran to the end of its list"
finish
