#!/usr/bin/env python3
"""TensorBoard event files of a zt run, read with the tensorboard package's own readers (never zt's
code), against the run's metrics.jsonl (read with json).

  check_tensorboard.py compare LOGDIR METRICS SAMPLES_PER_STEP
      EventAccumulator over LOGDIR (every event file, in TensorBoard's order, with its purging of what a
      resumed session trains again) holds, for every tag, exactly one scalar per record of metrics.jsonl,
      at x = step x SAMPLES_PER_STEP, equal to the record's value as float32; every file reads to its
      end with both CRCs of every record checked (its first event the file version), except files
      named with --torn, which must end in a cut-short record.
  check_tensorboard.py torn FILE
      FILE cut at every byte of its last record: TensorBoard's loader yields every event before it,
      unchanged, and nothing more.
"""
import json
import math
import os
import shutil
import sys
import tempfile

try:
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New
except ImportError as e:
    print(f"FAIL: the tensorboard package is not importable ({e}): scripts/install-deps.sh installs it; "
          "ZT_SKIP_TENSORBOARD=1 skips the TensorBoard test")
    sys.exit(1)

import numpy as np

POOLS = ["params", "grads", "optimizer", "activations", "workspace", "comm", "kv_cache", "other"]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL: " + msg)


def f32(v):
    return float("nan") if v is None else float(np.float32(v))


def expected_scalars(metrics_path, samples_per_step):
    """{tag: {x: value}} from metrics.jsonl, with the tags docs/training.md lists."""
    want = {}

    def put(tag, x, v):
        series = want.setdefault(tag, {})
        if x in series:
            fail(f"metrics.jsonl has two records for {tag} at x = {x}")
        series[x] = f32(v)

    with open(metrics_path) as f:
        for line in f:
            r = json.loads(line)
            x = r["step"] * samples_per_step
            if r["type"] == "eval":
                put("zt/eval_loss", x, r["eval_loss"])
                continue
            put("Train/Samples/train_loss", x, r["loss"])
            put("Train/Samples/lr", x, r["lr"])
            if "loss_scale" in r:
                put("Train/Samples/loss_scale", x, r["loss_scale"])
            put("zt/grad_norm", x, r["grad_norm"])
            put("zt/tokens_per_s", x, r["tokens_per_s"])
            put("zt/step_s", x, r["step_s"])
            for kind in ("mem_host", "mem_device"):
                if kind not in r:
                    continue
                for pool in POOLS + ["total"]:
                    put(f"zt/{kind}/{pool}/peak", x, r[kind][pool]["peak"])
    return want


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def read_records(path):
    """The records of one file by the stub reader, which checks both CRCs; (records, how it ended)."""
    reader = PyRecordReader_New(path)
    events = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return events, "end"
        except errors.DataLossError as e:
            return events, str(e)
        events.append(reader.record())


def compare(logdir, metrics_path, samples_per_step, torn):
    files = sorted(n for n in os.listdir(logdir) if "tfevents" in n)
    if not files:
        fail(f"no event file in {logdir}")
        return
    for name in files:
        events, ending = read_records(os.path.join(logdir, name))
        if name in torn:
            if ending == "end":
                fail(f"{name} was cut short by the test but reads to its end")
        elif ending != "end":
            fail(f"{name}: {ending} after {len(events)} records")
        if not events or event_pb2.Event.FromString(events[0]).file_version != "brain.Event:2":
            fail(f"{name}: the first event is not file_version brain.Event:2")
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    want = expected_scalars(metrics_path, samples_per_step)
    have_tags = set(acc.Tags()["scalars"])
    if have_tags != set(want):
        fail(f"tags differ: only in the event files {sorted(have_tags - set(want))}, "
             f"only in metrics.jsonl {sorted(set(want) - have_tags)}")
    compared = 0
    for tag in sorted(set(want) & have_tags):
        have = {}
        for e in acc.Scalars(tag):
            if e.step in have:
                fail(f"{tag}: two scalars at x = {e.step} (an earlier session's value was not dropped)")
            have[e.step] = e.value
        if sorted(have) != sorted(want[tag]):
            fail(f"{tag}: x values {sorted(have)}, metrics.jsonl has {sorted(want[tag])}")
            continue
        for x, v in want[tag].items():
            compared += 1
            if not same(have[x], v):
                fail(f"{tag} at x = {x}: {have[x]!r} in the event file, {v!r} in metrics.jsonl")
    print(f"compared {compared} scalars of {len(want)} tags in {len(files)} event file(s)")


def torn(path):
    events, ending = read_records(path)
    if ending != "end" or len(events) < 2:
        fail(f"{path}: needs a whole file of two events or more ({ending}, {len(events)} events)")
        return
    with open(path, "rb") as f:
        data = f.read()
    last_start = len(data) - len(events[-1]) - 16
    work = tempfile.mkdtemp()
    try:
        cut_path = os.path.join(work, os.path.basename(path))
        for cut in range(last_start, len(data)):
            with open(cut_path, "wb") as f:
                f.write(data[:cut])
            got = list(event_file_loader.RawEventFileLoader(cut_path).Load())
            if got != events[:-1]:
                fail(f"{path} cut to {cut} bytes (its last record starts at {last_start}): TensorBoard read "
                     f"{len(got)} events, expected the first {len(events) - 1} unchanged")
                return
        print(f"cut at each of the {len(data) - last_start} bytes of the last record: the "
              f"{len(events) - 1} events before it read back")
    finally:
        shutil.rmtree(work)


def main(argv):
    if len(argv) >= 5 and argv[1] == "compare":
        torn_names = {os.path.basename(p) for p in argv[5:] if p != "--torn"}
        compare(argv[2], argv[3], int(argv[4]), torn_names)
    elif len(argv) == 3 and argv[1] == "torn":
        torn(argv[2])
    else:
        print(__doc__)
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
