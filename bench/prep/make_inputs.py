#!/usr/bin/env python3
"""The benchmark input of one language: the distinct records of real Alpaca files (a JSON array),
in file order, at most N of them. Never replicated: a repeated text flatters the sentencepiece
plugin's chunk cache, which then never encodes it again. Records are distinct by (instruction,
input, output); when the files hold fewer than N distinct records, all of them are written.
Prints the number written.

usage: make_inputs.py OUT.json N SOURCE.json...
"""
import json
import sys

out, n, sources = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
seen, records = set(), []
for source in sources:
    for rec in json.load(open(source, encoding="utf-8")):
        key = (rec.get("instruction"), rec.get("input", ""), rec.get("output"))
        if key in seen:
            continue
        seen.add(key)
        records.append(rec)
records = records[:n]
with open(out, "w", encoding="utf-8") as f:
    json.dump(records, f, ensure_ascii=False, indent=2)
print(len(records))
