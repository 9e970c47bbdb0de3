#!/usr/bin/env bash
# torchrun's launch flags and variables through zt-run on CPU ranks (docs/distributed.md, "torchrun's
# flags"): --nnodes 1 --nproc-per-node 2 trains exactly as --nproc 2 does (the same per-step losses,
# read from metrics.jsonl by losses.py); CPU ranks on several machines, and CPU ranks that torchrun's
# RANK/WORLD_SIZE describe (set here, and under torchrun where PyTorch is installed), stop with the
# mpirun and srun commands that start them instead; every
# malformed or conflicting flag is a usage error naming it, before anything starts.
# usage: launch_flags.sh ZT_RUN ZT_PREP SOURCE_DIR TEST_LIB
set -u
zt_run=$1 zt_prep=$2 src=$3
. "$4"
here=$(cd "$(dirname "$0")" && pwd)
python3 -c "import json" 2>/dev/null || skip "python3 is needed to read the losses"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" \
    -o "$work/data" --val-fraction 0.05 --seed 0 --no-progress
run=(--data "$work/data" --set model.hidden_size=50 --set model.intermediate_size=70
     --set model.num_hidden_layers=2 --set model.num_attention_heads=5 --set model.num_key_value_heads=1
     --set data.seq_len=128 --set data.mode=padded --set threads=1 --set log.every=1000 --set seed=7 --set steps=3
     --set train_micro_batch_size_per_gpu=2 --set checkpoint.every=0 --set device=cpu)

# --nnodes 1 --nproc-per-node 2 is --nproc 2: mpirun's 2 ranks, the same losses. The address has no
# effect on CPU ranks, and a note says so.
expect_ok "zt[rank 0] info: step 3/3" "zt[rank 1] info" -- "$zt_run" --nproc 2 "${run[@]}" --output-dir "$work/nproc"
expect_ok "zt[rank 0] info: step 3/3" "zt[rank 1] info" \
          "zt-run: note: --master-addr and --master-port have no effect on CPU ranks: mpirun starts and connects them" \
    -- "$zt_run" --nnodes 1 --nproc-per-node 2 --master-port 29533 "${run[@]}" --output-dir "$work/flags"
python3 "$here/losses.py" "$work/nproc" "$work/flags" 1e-5 || zt_failures=$((zt_failures + 1))
# torchrun's older spellings are the same options.
expect_fail "zt-run: error: --nproc and --nproc-per-node are two ways of saying how to start the ranks" -- \
    "$zt_run" --nproc 2 --nproc_per_node=2 "${run[@]}"
expect_fail "zt-run: error: --node-rank 3 with --nnodes 2" -- \
    "$zt_run" --nnodes=2 --node_rank 3 --master_addr node0 "${run[@]}"

# CPU ranks on 2 machines: the commands that start them, with this run's arguments.
expect_fail "zt-run: error: --nnodes 2 --nproc-per-node 2 asks for CPU ranks on 2 machines, which a zt-run on each machine cannot start" \
            "    mpirun -np 4 --hostfile HOSTS --map-by ppr:2:node:PE=" \
            "--bind-to core $zt_run --data $work/data --set model.hidden_size=50" \
            "    srun -N 2 --ntasks-per-node 2 --cpus-per-task " -- \
    "$zt_run" --nnodes 2 --nproc-per-node 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 "${run[@]}"
[ "$ZT_RC" -eq 2 ] || { echo "FAIL: CPU ranks on 2 machines are a usage error (exit 2), got $ZT_RC"; zt_failures=$((zt_failures+1)); }
grep -qE "mpirun .*--(nnodes|node-rank|master)" <<<"$ZT_OUT" &&
    { echo "FAIL: the mpirun command keeps zt-run's launch flags:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }

# A process torchrun started on the CPU (its variables, no MPI launcher's): MPI cannot join it.
expect_fail "zt[rank 1] error: this process is rank 1 of 4 by torchrun's variables (RANK, WORLD_SIZE) and runs on the CPU" \
            "mpirun -np 4 --hostfile HOSTS --map-by ppr:2:node $zt_run --data $work/data" -- \
    env RANK=1 WORLD_SIZE=4 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
    "$zt_run" "${run[@]}" --output-dir "$work/torchrun"
expect_fail "zt[rank 0] error: this process is rank 0 of 2 by torchrun's variables" \
            "On one machine, without torchrun: $zt_run --data $work/data" \
            "--set device=cpu --output-dir $work/torchrun --nproc 2 (docs/distributed.md" -- \
    env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 "$zt_run" "${run[@]}" --output-dir "$work/torchrun"
# The same under torchrun itself, where it is installed (PyTorch): its ranks say so, and it fails.
# torchrun ends the other ranks as soon as one has failed, so the one that says it first may be
# either (and the other may be ended before it prints).
if command -v torchrun >/dev/null; then
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    expect_fail " of 2 by torchrun's variables (RANK, WORLD_SIZE) and runs on the CPU" \
                "--output-dir $work/torchrun --nproc 2 (docs/distributed.md" -- \
        timeout 60 torchrun --no-python --nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port" \
        "$zt_run" "${run[@]}" --output-dir "$work/torchrun"
else
    echo "note: torchrun (PyTorch) is not installed: CPU ranks under torchrun itself are not tried"
fi

# Malformed and conflicting flags: usage errors (exit 2) before anything starts.
bad() {
    local want=$1
    shift
    expect_fail "zt-run: error: $want" -- "$zt_run" "$@" "${run[@]}"
    [ "$ZT_RC" -eq 2 ] || { echo "FAIL: $*: expected exit 2, got $ZT_RC"; zt_failures=$((zt_failures+1)); }
}
bad "--nproc and --nnodes are two ways of saying how to start the ranks" --nproc 2 --nnodes 1
bad "--nproc and --master-port are two ways" --nproc 2 --master-port 29500
bad "--node-rank 2 with --nnodes 2: the machines are numbered from 0 to 1" --nnodes 2 --node-rank 2 --master-addr x
bad "--node-rank 1 with --nnodes 1" --nproc-per-node 2 --node-rank 1
bad "--master-port '65536' is not a TCP port (1 to 65535)" --nproc-per-node 2 --master-port 65536
bad "--master-port 'abc' is not a TCP port" --nproc-per-node 2 --master-port abc
bad "--nnodes 2 needs --master-addr" --nnodes 2 --nproc-per-node 2
bad "--nnodes '1:2': zt-run starts a fixed number of machines, not torchrun's elastic range" --nnodes 1:2
bad "--nproc-per-node 'auto': zt-run takes the number of ranks itself" --nproc-per-node auto
bad "--nproc-per-node '0': expected the number of ranks to start on this machine" --nproc-per-node 0
bad "--nproc-per-node is given twice" --nproc-per-node 2 --nproc_per_node 2
expect_fail "zt-run: error: --master-addr is for training and has no effect with --list-plugins" -- "$zt_run" --list-plugins --master-addr x
# Inside a launched job the flags are refused as --nproc is.
expect_fail "zt-run: error: --nproc-per-node 2 starts the ranks itself, but this process already is rank 0 of 2 (from mpirun)" -- \
    env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 "$zt_run" --nproc-per-node 2 "${run[@]}"

# comm.backend = nccl cannot carry CPU ranks' collectives: refused with the way out
expect_fail "comm.backend = nccl, but these 2 ranks run on the CPU" "leave comm.backend at auto (MPI)" -- \
    "$zt_run" --nproc 2 "${run[@]}" --set comm.backend=nccl --output-dir "$work/nccl_cpu"
expect_fail "config key 'comm.backend' must be one of \"auto\", \"nccl\", \"mpi\"; got \"gloo\"" -- "$zt_run" "${run[@]}" --set comm.backend=gloo --output-dir "$work/gloo"

# A dry run estimates the whole job: nnodes x nproc-per-node data-parallel ranks.
expect_ok "6 data-parallel ranks" -- "$zt_run" --dry-run --nnodes 2 --nproc-per-node 3 --master-addr node0 \
    "${run[@]}" --output-dir "$work/dry"
finish
