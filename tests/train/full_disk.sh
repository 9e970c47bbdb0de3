#!/usr/bin/env bash
# A full disk during training: the run's output directory on a small tmpfs (in a mount namespace of
# its own, so nothing outlives the test) that fills up part way. zt-run must stop with a non-zero
# status and a message naming the disk, leave every checkpoint that looks complete really complete and
# metrics.jsonl whole; once space is freed, --resume latest must finish the run with the losses of a
# run that never stopped, bit for bit (the CPU computes deterministically).
#   full_disk.sh ZT_RUN SOURCE_DIR WORK_DIR DATA_DIR
set -u
zt_run=$1 src=$2 work=$3 data=$4
. "$src/tests/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
python3 -c "import numpy" 2>/dev/null || skip "python3 with numpy is needed to read the results"
[ -f "$data/manifest.json" ] || skip "no data set at $data (the train.data fixture writes it)"
if [ "${ZT_FULL_DISK_INNER:-0}" != 1 ]; then
    # Re-enter in a private mount namespace, where mounting a tmpfs needs no cleanup.
    command -v unshare >/dev/null || skip "unshare (util-linux) is needed for the private tmpfs"
    unshare -m true 2>/dev/null || skip "cannot make a mount namespace here (needs root or user namespaces)"
    ZT_FULL_DISK_INNER=1 exec unshare -m bash "$0" "$@"
fi

out=$work/full_disk
rm -rf "$out"
mkdir -p "$out/disk"
mount -t tmpfs -o size=16m tmpfs "$out/disk" || skip "cannot mount a tmpfs here"
model=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_hidden_layers=2
       --set model.num_attention_heads=4 --set model.num_key_value_heads=2)
run=(--data "$data" "${model[@]}" --set data.seq_len=128 --set threads=2 --set log.every=1000
     --set optimizer.params.lr=3e-3 --set train_micro_batch_size_per_gpu=2 --set checkpoint.every=1
     --set checkpoint.keep=2 --set steps=8)

# The reference: the same run on an ordinary disk.
expect_ok -- "$zt_run" "${run[@]}" --output-dir "$out/straight"

# Leave room for a checkpoint or two only: the run fills the disk part way, wherever the space ends (a
# rank file, checkpoint.json, metrics.jsonl). Two fill levels, so the space ends at different points.
size=$(du -sb "$out/straight/checkpoints/step-000008" | cut -f1)
for room in 250 130; do
    rm -rf "$out/disk/run"
    avail=$(df -B1 --output=avail "$out/disk" | tail -n 1)
    filler=$((avail - size * room / 100))
    [ "$filler" -gt 0 ] || skip "a checkpoint of $size bytes does not fit the tmpfs"
    head -c "$filler" /dev/zero >"$out/disk/filler"
    expect_fail "No space left on device" -- "$zt_run" "${run[@]}" --output-dir "$out/disk/run"
    echo "$ZT_OUT" | grep -E "error" | head -n 3
    stopped_at=$(grep -c '"type":"train"' "$out/disk/run/metrics.jsonl" 2>/dev/null || echo 0)
    echo "room for $room% of a checkpoint: the run stopped with a full disk after $stopped_at logged steps"
    [ "$stopped_at" -lt 8 ] || { echo "FAIL: the disk never filled up (the test proved nothing)"; zt_failures=$((zt_failures + 1)); }

    # A step directory that is not a staging one must be a whole checkpoint (checkpoint.json is written
    # last); the resume below reads and verifies the newest.
    for d in "$out/disk/run/checkpoints"/step-*; do
        [ -d "$d" ] || continue
        case $d in *.tmp-*) continue ;; esac
        [ -f "$d/checkpoint.json" ] ||
            { echo "FAIL: $d looks like a checkpoint but has no checkpoint.json"; zt_failures=$((zt_failures + 1)); }
    done

    # Space again: resume and finish; the losses are the straight run's.
    rm -f "$out/disk/filler"
    expect_ok "resumed from" -- "$zt_run" "${run[@]}" --output-dir "$out/disk/run" --resume latest
    if ! python3 "$here/check.py" same-metrics "$out/straight/metrics.jsonl" "$out/disk/run/metrics.jsonl" 0; then
        zt_failures=$((zt_failures + 1))
    fi
done
umount "$out/disk"
finish
