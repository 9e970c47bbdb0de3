#!/usr/bin/env python3
"""Checks flight recorder dumps (docs/distributed.md, "The flight recorder") with Python's own JSON
reader, not zt's, and what zt-run said about them (faults.sh flight_stop, flight_kill).

  check_flight.py DIR ENTRIES OTHERS LOG SUSPECT [wait]

DIR holds rank-R.flight.jsonl; ENTRIES is comm.flight_recorder.entries; OTHERS (e.g. 0,2) the ranks
that wait for rank SUSPECT; LOG zt-run's output. The collective its flight recorder lines name for
rank SUSPECT (required with `wait`) must be the one the others' dumps hold open (the suspect's own
when none of them left one: a loaded machine may not run a rank before mpirun's SIGKILL).

Each dump: a header line, then exactly min(ENTRIES, recorded) entries with the ids recorded-n+1 ..
recorded in order, sequence numbers increasing by one within each group and ending at that group's
"issued", completion after issue, and every entry before a group's last one completed.
"""
import json
import os
import re
import sys

STATES = {"issued", "enqueued", "completed", "failed"}
OPS = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier"}


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def read_dump(path):
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or lines[0].get("flight_recorder") != 1:
        fail(f"{path}: the first line is not a flight recorder header")
    return lines[0], lines[1:]


def check_dump(path, rank, entries_cap):
    header, entries = read_dump(path)
    if header["rank"] != rank:
        fail(f"{path}: header says rank {header['rank']}")
    recorded = header["recorded"]
    if header["entries"] != entries_cap:
        fail(f"{path}: entries {header['entries']}, expected {entries_cap}")
    expected_n = min(entries_cap, recorded)
    if recorded <= entries_cap:
        fail(f"{path}: only {recorded} collectives recorded; the test needs the ring to have wrapped")
    if len(entries) != expected_n:
        fail(f"{path}: {len(entries)} entries, expected the last {expected_n} of {recorded}")
    ids = [e["id"] for e in entries]
    if ids != list(range(recorded - expected_n + 1, recorded + 1)):
        fail(f"{path}: ids {ids} are not the last {expected_n} of {recorded} in order")
    groups = {g["name"]: g for g in header["groups"]}
    last_seq = {}
    for e in entries:
        if e["op"] not in OPS or e["state"] not in STATES or e["group"] not in groups:
            fail(f"{path}: bad entry {e}")
        if e["group"] in last_seq and e["seq"] != last_seq[e["group"]] + 1:
            fail(f"{path}: group {e['group']}: seq {e['seq']} after {last_seq[e['group']]}")
        last_seq[e["group"]] = e["seq"]
        if e["state"] == "completed" and not e["completed_s"] >= e["issued_s"]:
            fail(f"{path}: completed before issued: {e}")
        if e["state"] != "completed" and e["completed_s"] is not None:
            fail(f"{path}: not completed but with a completion time: {e}")
        if e["bytes"] < e["count"]:
            fail(f"{path}: fewer bytes than elements: {e}")
    for name, seq in last_seq.items():
        if seq != groups[name]["issued"]:
            fail(f"{path}: group {name}: last entry #{seq}, header says issued {groups[name]['issued']}")
    for e in entries:
        if e["seq"] < groups[e["group"]]["issued"] and e["state"] != "completed":
            fail(f"{path}: #{e['seq']} on {e['group']} is {e['state']} though later ones were issued")
    return header, entries


def main():
    directory, cap, dumped, log, suspect = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    need_wait = len(sys.argv) > 6 and sys.argv[6] == "wait"
    dumped = [int(r) for r in dumped.split(",")]  # the others
    dumps = {}
    for name in os.listdir(directory):
        m = re.fullmatch(r"rank-(\d+)\.flight\.jsonl", name)
        if m:
            dumps[int(m.group(1))] = check_dump(os.path.join(directory, name), int(m.group(1)), cap)
    # Ranks ended by the launcher dump as they get its SIGTERM; one that a loaded machine does not
    # schedule before mpirun's SIGKILL cannot.
    if not dumps:
        fail(f"no rank left a dump in {directory}")
    with open(log) as f:
        said = [line for line in f if line.startswith("zt-run: flight recorder: ")]
    pattern = re.compile(r"rank %d \(pid \d+.*?(?:inside|wait in|waits in) (\w+) #(\d+) on group '(\w+)'" % suspect)
    waits = [m for m in (pattern.search(line) for line in said) if m]
    if not waits and need_wait:
        fail("zt-run's flight recorder lines name no collective the others wait in for rank %d:\n%s" %
             (suspect, "".join(said)))
    if not waits:
        print(f"flight dumps of ranks {sorted(dumps)} check out; no collective named for rank {suspect}")
        return
    op, seq, group = waits[0].group(1), int(waits[0].group(2)), waits[0].group(3)
    # The others' own dumps hold that collective open (the last they issued there); when none of
    # them left one, the suspect's own dump does.
    # Inside a collective's data phase MPI lets ranks finish at different times: a rank may have left
    # it and be stopped in the next one while the others still wait in it, or some of the others may
    # have finished it and wait in the next: so each holds the named one or the one before open.
    holders = [r for r in dumps if r != suspect and r in dumped] or [suspect]
    for r in holders:
        if r not in dumps:
            fail(f"zt-run named {op} #{seq} on '{group}', but no dump shows it")
        open_ones = [e for e in dumps[r][1] if e["group"] == group and e["state"] != "completed"]
        last = open_ones[-1] if open_ones else None
        if not last or last["seq"] not in (seq, seq - 1) or (last["seq"] == seq and last["op"] != op):
            fail(f"rank {r}'s dump does not hold {op} #{seq} (or the one before) on '{group}' open: "
                 f"{open_ones[-1:] or 'none open'}")
    print(f"flight dumps of ranks {sorted(dumps)} check out; zt-run names rank {suspect} and {op} #{seq} on '{group}'")


main()
