#!/usr/bin/env python3
"""Bare SentencePiece encoding of the same texts, with the package's batch API on N threads.

usage: bare_encode.py TOKENIZER.model TEXTS.bin THREADS     (prints texts, ids and seconds)
"""
import struct
import sys
import time

import sentencepiece as spm

sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
data = open(sys.argv[2], "rb").read()
texts, pos = [], 0
while pos < len(data):
    (n,) = struct.unpack_from("<I", data, pos)
    texts.append(data[pos + 4:pos + 4 + n].decode("utf-8"))
    pos += 4 + n
start = time.perf_counter()
ids = sp.encode(texts, num_threads=int(sys.argv[3]))
seconds = time.perf_counter() - start
print(len(texts), sum(len(x) for x in ids), f"{seconds:.3f}")
