#!/usr/bin/env python3
"""Replicate a real Alpaca file to N records (a JSON array), for the zt-prep benchmark.

usage: make_inputs.py SOURCE.json N OUT.json
"""
import json
import sys

source, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
records = json.load(open(source, encoding="utf-8"))
copies = [records[i % len(records)] for i in range(n)]
with open(out, "w", encoding="utf-8") as f:
    json.dump(copies, f, ensure_ascii=False, indent=2)
