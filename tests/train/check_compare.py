#!/usr/bin/env python3
"""Checks zt-run --compare's RUN_DIR (docs/compare.md) against what its children wrote themselves.

    check_compare.py RUN_DIR KEY=V1,V2 [KEY=V1,V2...] [--warmup W] [--timed T] [--host-limit BYTES]
                     [--expect-rows N] [--interrupted]

Every figure of compare.json is recomputed here from the child's own files, independently of zt's
reader: the rows are the cartesian product of the values, first key slowest, first value first; each
child's config.resolved.json has the row's values (a plugin kind's key: that plugin in _plugins) and
steps = W + T; its measured peaks are the largest of metrics.jsonl's per-step peaks (and of
metrics.rank<R>.jsonl's, where ranks wrote them); tokens/s, step time and loss are those of the
timed steps; the estimate is memory-estimate.json's chosen row; every ratio is the row's figure over
the first row that ran. With --host-limit, a row fits exactly when its estimated host total is
within the limit, and one that does not says host memory overflows. compare.md holds valid Markdown
tables (GitHub's rules: a header row, a delimiter row with as many cells, then rows with as many
cells), one row per combination.
"""
import argparse
import itertools
import json
import math
import os
import re
import sys

POOLS = ["params", "grads", "optimizer", "activations", "workspace", "comm", "kv_cache", "other"]
ESTIMATED = POOLS[:6]
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def close(a, b, rel=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def split_values(text):
    """KEY=V1,V2 as docs/compare.md defines it: commas outside brackets and double quotes split."""
    key, _, rest = text.partition("=")
    values, depth, quoted, cur = [], 0, False, ""
    for ch in rest:
        if quoted:
            quoted = ch != '"'
        elif ch == '"':
            quoted = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(cur)
            cur = ""
            continue
        cur += ch
    values.append(cur)
    return key, values


def records(path):
    with open(path) as f:
        return [r for r in (json.loads(line) for line in f if line.strip()) if r.get("type") == "train"]


def expected_measured(run_dir, warmup):
    recs = records(os.path.join(run_dir, "metrics.jsonl"))
    all_recs = list(recs)
    r = 1
    while os.path.exists(os.path.join(run_dir, "metrics.rank%d.jsonl" % r)):
        all_recs += records(os.path.join(run_dir, "metrics.rank%d.jsonl" % r))
        r += 1
    sides = {}
    for side, field in (("host", "mem_host"), ("device", "mem_device")):
        have = [x[field] for x in all_recs if field in x]
        if not have:
            sides[side] = None
            continue
        sides[side] = {p: max(m[p]["peak"] for m in have) for p in POOLS}
        sides[side]["total"] = max(m["total"]["peak"] for m in have)
    timed = [x for x in recs if x["step"] > warmup]
    tokens_per_s = sum(x["tokens"] for x in timed) / sum(x["step_s"] for x in timed)
    step_s = sum(x["step_s"] for x in timed) / len(timed)
    loss = max(recs, key=lambda x: x["step"])["loss"]
    return sides, tokens_per_s, step_s, loss, len(timed)


def expected_estimate(run_dir):
    with open(os.path.join(run_dir, "memory-estimate.json")) as f:
        est = json.load(f)
    chosen = [r for r in est["rows"] if r.get("chosen")]
    if len(chosen) != 1:
        fail("%s/memory-estimate.json: %d chosen rows" % (run_dir, len(chosen)))
        return None
    row = chosen[0]
    return {"device": row["device"] if est["device"] == "cuda" else None, "host": row["host"]}


KINDS = ("tokenizer", "model", "optimizer", "zero", "attention", "parallel")


def resolved_value(resolved, key):
    """A key's value in config.resolved.json (nested objects); a plugin kind's: the plugin's name."""
    if key in KINDS:
        return next((p["name"] for p in resolved["_plugins"] if p["kind"] == key), None)
    for part in key.split("."):
        if not isinstance(resolved, dict) or part not in resolved:
            return None
        resolved = resolved[part]
    return resolved


def given_value(text):
    """A value as --set reads it: JSON when it parses as JSON, else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def ratio(v, b):
    return None if v is None or b is None or b == 0 else v / b


def check_ratios(i, row, base):
    r = row["ratios"]
    if base is None:
        if r is not None:
            fail("row %d: ratios without a baseline" % i)
        return
    for what in ("tokens_per_s", "step_s", "loss"):
        want = ratio(row[what], base[what]) if row["measured"] and base["measured"] else None
        if not close(r[what], want):
            fail("row %d: ratio of %s is %r, expected %r / %r = %r" % (i, what, r[what], row[what], base[what], want))
    for part, pools in (("measured", POOLS), ("estimate", ESTIMATED)):
        if part == "measured" and not (row["measured"] and base["measured"]):
            if r["measured"] is not None:
                fail("row %d: measured ratios without measurements" % i)
            continue
        for side in ("device", "host"):
            a, b = (row[part] or {}).get(side), (base[part] or {}).get(side)
            got = r[part][side] if r[part] else None
            if a is None or b is None:
                if got is not None:
                    fail("row %d: %s %s ratios without both sides" % (i, part, side))
                continue
            for p in pools + ["total"]:
                if not close(got[p], ratio(a[p], b[p])):
                    fail("row %d: %s %s %s ratio %r, expected %r" % (i, part, side, p, got[p], ratio(a[p], b[p])))


def table_cells(line):
    """The cells of a Markdown table row: split at pipes not escaped by a backslash."""
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|") and not line.endswith("\\|")):
        return None
    return [c.strip() for c in re.split(r"(?<!\\)\|", line[1:-1])]


def check_markdown(path, keys, rows):
    with open(path) as f:
        lines = f.read().split("\n")
    tables, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            tables.append(block)
        else:
            i += 1
    if len(tables) != 2:
        fail("%s: %d tables, expected 2 (results, memory by pool)" % (path, len(tables)))
        return
    for t, block in enumerate(tables):
        header = table_cells(block[0])
        delim = table_cells(block[1]) if len(block) > 1 else None
        if header is None or delim is None or len(delim) != len(header) or \
                not all(re.fullmatch(r":?-{3,}:?", c) for c in delim):
            fail("%s: table %d has no valid header and delimiter row:\n%s" % (path, t + 1, "\n".join(block[:2])))
            continue
        if header[1:1 + len(keys)] != keys:
            fail("%s: table %d's key columns are %r, expected %r" % (path, t + 1, header[1:1 + len(keys)], keys))
        for line in block[2:]:
            cells = table_cells(line)
            if cells is None or len(cells) != len(header):
                fail("%s: table %d: a row of %s cells under a header of %d: %s" %
                     (path, t + 1, "no" if cells is None else len(cells), len(header), line))
    body = [table_cells(line) for line in tables[0][2:]]
    if len(body) != len(rows):
        fail("%s: %d rows in the results table, compare.json has %d" % (path, len(body), len(rows)))
    for n, (cells, row) in enumerate(zip(body, rows)):
        want = [str(n + 1)] + [row["config"][k] for k in keys]
        if cells[:1 + len(keys)] != want:
            fail("%s: results row %d begins %r, expected %r" % (path, n + 1, cells[:1 + len(keys)], want))
        result = cells[1 + len(keys)]
        expect = {"ran": "ran", "does not fit": "does not fit", "failed": "failed"}[row["outcome"]]
        if not result.startswith(expect):
            fail("%s: results row %d says %r, the row %s" % (path, n + 1, result, row["outcome"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("compare", nargs="+")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timed", type=int, default=5)
    ap.add_argument("--host-limit", type=float)
    ap.add_argument("--expect-rows", type=int)
    ap.add_argument("--interrupted", action="store_true")
    args = ap.parse_args()

    with open(os.path.join(args.run_dir, "compare.json")) as f:
        doc = json.load(f)
    keys_values = [split_values(c) for c in args.compare]
    keys = [k for k, _ in keys_values]
    combos = list(itertools.product(*[v for _, v in keys_values]))
    if doc["version"] != 1 or doc["keys"] != keys:
        fail("compare.json: version %r, keys %r; expected 1 and %r" % (doc["version"], doc["keys"], keys))
    if doc["combinations"] != len(combos) or doc["warmup_steps"] != args.warmup or doc["timed_steps"] != args.timed:
        fail("compare.json: %r combinations, %r + %r steps; expected %d, %d + %d" %
             (doc["combinations"], doc["warmup_steps"], doc["timed_steps"], len(combos), args.warmup, args.timed))
    if doc["interrupted"] != args.interrupted:
        fail("compare.json: interrupted is %r" % doc["interrupted"])
    rows = doc["rows"]
    n_rows = len(combos) if args.expect_rows is None else args.expect_rows
    if len(rows) != n_rows:
        fail("compare.json: %d rows, expected %d" % (len(rows), n_rows))

    base = next((r for r in rows if r["outcome"] == "ran"), None)
    if doc["baseline"] != (rows.index(base) if base else None):
        fail("compare.json: baseline %r is not the first row that ran" % doc["baseline"])
    for i, (row, combo) in enumerate(zip(rows, combos)):
        want = dict(zip(keys, [v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v for v in combo]))
        if row["config"] != want:
            fail("row %d: config %r, expected %r (the product's order)" % (i, row["config"], want))
        run_dir = row["run_dir"]
        if os.path.dirname(run_dir) != os.path.join(args.run_dir, "runs") or \
                not os.path.basename(run_dir).startswith("%02d-" % (i + 1)):
            fail("row %d: run_dir %s is not %s/runs/%02d-..." % (i, run_dir, args.run_dir, i + 1))
        resolved_path = os.path.join(run_dir, "config.resolved.json")  # a training child's; not a dry run's
        resolved = None
        if row["outcome"] == "ran" or os.path.exists(resolved_path):
            with open(resolved_path) as f:
                resolved = json.load(f)
        for k, v in zip(keys, combo if resolved else ()):
            ran_with = resolved_value(resolved, k)
            if ran_with != given_value(v):
                fail("row %d: the child ran with %s = %r, not %s" % (i, k, ran_with, v))
        est = expected_estimate(run_dir)
        if row["estimate"] != est:
            fail("row %d: estimate %r, memory-estimate.json's chosen row %r" % (i, row["estimate"], est))
        if args.host_limit is not None and est:
            fits = est["host"]["total"] <= args.host_limit
            if row["fits"] != fits or (row["outcome"] == "does not fit") == fits:
                fail("row %d: estimated host total %d against a limit of %d, but fits=%r, outcome %r" %
                     (i, est["host"]["total"], args.host_limit, row["fits"], row["outcome"]))
        if row["outcome"] == "does not fit":
            if row["fits"] is not False or not row["overflow"] or "host memory" not in row["overflow"] or \
                    row["measured"] is not None or row["tokens_per_s"] is not None:
                fail("row %d: a does-not-fit row should say host memory overflows and hold no measurement: %r" %
                     (i, row))
            continue
        if row["outcome"] != "ran":
            fail("row %d: %s: %s" % (i, row["outcome"], row["error"]))
            continue
        if resolved["steps"] != args.warmup + args.timed:
            fail("row %d: the child trained %r steps, not %d" % (i, resolved["steps"], args.warmup + args.timed))
        sides, tps, step_s, loss, n_timed = expected_measured(run_dir, args.warmup)
        if n_timed != args.timed or row["timed_steps"] != n_timed:
            fail("row %d: %d timed steps in metrics.jsonl, compare.json says %r" % (i, n_timed, row["timed_steps"]))
        if row["measured"] != sides:
            fail("row %d: measured %r, the child's metrics say %r" % (i, row["measured"], sides))
        for what, got, want in (("tokens_per_s", row["tokens_per_s"], tps), ("step_s", row["step_s"], step_s),
                                ("loss", row["loss"], loss)):
            if not close(got, want):
                fail("row %d: %s %r, the child's metrics give %r" % (i, what, got, want))
    for i, row in enumerate(rows):
        check_ratios(i, row, base)
    check_markdown(os.path.join(args.run_dir, "compare.md"), keys, rows)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("compare.json and compare.md agree with the %d children's own files" % len(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
