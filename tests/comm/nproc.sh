#!/usr/bin/env bash
# --nproc N (zt_launch_local) through a test program that calls it exactly as zt-run does: the
# process becomes `mpirun -np N ... comm_check launched N`, whose ranks must find each other (the
# sum of ranks 0..N-1 comes back on every rank). Its refusals are in test_launch.c; zt-run's own use
# of the option is checked last.
# usage: nproc.sh COMM_CHECK ZT_RUN TEST_LIB
set -u
comm_check=$1 zt_run=$2
. "$3"

expect_ok "rank 0 of 2: sum of ranks 1" "rank 1 of 2: sum of ranks 1" -- "$comm_check" --nproc 2 launched 2
expect_ok "rank 0 of 3: sum of ranks 3" "rank 2 of 3: sum of ranks 3" -- "$comm_check" --nproc=3 launched 3
# One rank: nothing is started, the run stays in this process.
expect_ok "rank 0 of 1: sum of ranks 0" -- "$comm_check" --nproc 1 launched 1
# A rank that fails makes the whole job fail.
expect_fail "comm_check: cannot start" -- env ZT_COMM_MPI_LIBRARY=/nonexistent/lib.so "$comm_check" --nproc 2 launched 2

# zt-run: --nproc is a training option, and its value is checked before anything starts.
expect_fail "zt-run: error: --nproc is for training and has no effect with --list-plugins" -- "$zt_run" --nproc 2 --list-plugins
expect_fail "zt-run: error: --nproc '0': expected the number of ranks to start on this machine" -- "$zt_run" --nproc 0
expect_fail "zt-run: error: --nproc 2 starts the ranks itself, but this process already is rank 0 of 2 (from mpirun)" -- \
    env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 "$zt_run" --nproc 2
[ "$ZT_RC" -eq 2 ] || { echo "FAIL: a bad --nproc is a usage error (exit 2), got $ZT_RC"; zt_failures=$((zt_failures+1)); }
finish
