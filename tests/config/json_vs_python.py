#!/usr/bin/env python3
"""Differential test: zt's JSON reader (framework/base/json.c, through json_dump) against Python's json
module, a second, independent implementation.

For thousands of generated documents (valid ones with every kind of escape, and mutated ones that
are mostly invalid), zt must accept exactly what Python accepts and produce the same token tree with
the same decoded UTF-8 bytes. Python's json is laxer than zt in three places, so its verdict is
tightened to zt's documented rules: NaN/Infinity are rejected, strings must be valid Unicode scalar
values (no lone surrogates), and \\u0000 is rejected.
It also checks that zt_json_write_string output decodes back to the original text.

Usage: json_vs_python.py PATH_TO_json_dump
"""
import json
import random
import subprocess
import sys

RNG = random.Random(8259)  # fixed seed: failures are reproducible

CHAR_POOL = (
    list("abcxyz ABC019_-/.:,{}[]") + ['"', "\\", "\n", "\t", "\x01", "\x1f", "\x7f"]
    + ["\u00e9", "\u00ff", "\u0100", "\u07ff", "\u0800", "\u4e2d", "\u2028", "\ufeff", "\uffff"]
    + ["\U00010000", "\U0001f600", "\U0010ffff"]
)
SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
                 "\t": "\\t"}


def u_escape(c):
    """\\uXXXX for c, as a surrogate pair above U+FFFF, in random hex case."""
    code = ord(c)
    if code > 0xFFFF:
        code -= 0x10000
        units = [0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)]
    else:
        units = [code]
    text = "".join("\\u%04x" % u for u in units)
    return text.upper().replace("\\U", "\\u") if RNG.random() < 0.5 else text


def gen_string():
    out = ['"']
    for _ in range(RNG.randrange(0, 8)):
        c = RNG.choice(CHAR_POOL)
        must_escape = c in '"\\' or ord(c) < 0x20
        roll = RNG.random()
        if c in SHORT_ESCAPES and (must_escape or roll < 0.3):
            out.append(SHORT_ESCAPES[c] if roll < 0.7 else u_escape(c))
        elif must_escape or roll < 0.3:
            out.append(u_escape(c))
        elif c == "/" and roll < 0.5:
            out.append("\\/")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def gen_number():
    kind = RNG.randrange(8)
    if kind == 0:
        return str(RNG.randrange(-1000, 1000))
    if kind == 1:
        return "-0" if RNG.random() < 0.5 else "0"
    if kind == 2:
        return "%d.%d" % (RNG.randrange(0, 100), RNG.randrange(0, 10**6))
    if kind == 3:
        return "%s%de%s%d" % (RNG.choice(["", "-"]), RNG.randrange(1, 10), RNG.choice(["", "+", "-"]),
                              RNG.randrange(0, 30))
    if kind == 4:
        return RNG.choice(["1e400", "-1e400", "1e-400", "123456789012345678901234567890"])
    if kind == 5:
        return "0.%05dE-%d" % (RNG.randrange(0, 99999), RNG.randrange(0, 9))
    if kind == 6:
        return str(RNG.randrange(-(2**63), 2**63))
    return repr(RNG.uniform(-1e6, 1e6))


def ws():
    return "".join(RNG.choice(" \t\n\r") for _ in range(RNG.choice([0, 0, 1, 2])))


def gen_value(depth):
    kind = RNG.randrange(7 if depth < 6 else 5)
    if kind == 0:
        return gen_string()
    if kind == 1:
        return gen_number()
    if kind in (2, 3, 4):
        return ["true", "false", "null"][kind - 2]
    if kind == 5:
        items = [ws() + gen_value(depth + 1) + ws() for _ in range(RNG.randrange(0, 5))]
        return "[" + ",".join(items) + ws() + "]"
    members = [ws() + gen_string() + ws() + ":" + ws() + gen_value(depth + 1) + ws()
               for _ in range(RNG.randrange(0, 5))]
    return "{" + ",".join(members) + ws() + "}"


MUTATION_BYTES = [b",", b":", b"{", b"}", b"[", b"]", b'"', b"\\", b" ", b"0", b"1", b"-", b".", b"e",
                  b"t", b"n", b"\n", b"\t", b"\x00", b"\x01", b"\x80", b"\xc3", b"\xed\xa0\x80",
                  b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xff", b"\\ud800", b"\\udc00", b"\\u0000",
                  b"\\ud83d\\ude00", b"\\x", b"\\u12", b"\xef\xbb\xbf", b"NaN", b"Infinity", b"01"]


def mutate(data):
    for _ in range(RNG.randrange(1, 3)):
        pos = RNG.randrange(0, len(data) + 1)
        op = RNG.randrange(4)
        if op == 0 and data:
            data = data[:pos] + data[pos + 1:]
        elif op == 1:
            data = data[:pos] + RNG.choice(MUTATION_BYTES) + data[pos:]
        elif op == 2 and data:
            data = data[:pos] + RNG.choice(MUTATION_BYTES) + data[pos + 1:]
        else:
            data = data[:pos]
    return data


class Rejected(Exception):
    pass


def reject_constant(name):
    raise Rejected(name)


def flatten(value, out):
    """Python's tree in json_dump's token format."""
    if isinstance(value, tuple):  # ("O", pairs) from object_pairs_hook
        out.append("O %d" % len(value[1]))
        for key, item in value[1]:
            flatten(key, out)
            flatten(item, out)
    elif isinstance(value, list):
        out.append("A %d" % len(value))
        for item in value:
            flatten(item, out)
    elif isinstance(value, str):
        if "\x00" in value:
            raise Rejected("NUL")
        try:
            out.append("S " + value.encode("utf-8").hex())
        except UnicodeEncodeError:
            raise Rejected("lone surrogate")
    elif value is True:
        out.append("T")
    elif value is False:
        out.append("F")
    elif value is None:
        out.append("Z")
    else:
        out.append("N %.17g" % value)


def python_verdict(data):
    """Token lines, or None when the document is invalid under zt's rules."""
    try:
        text = data.decode("utf-8")
        tree = json.loads(text, object_pairs_hook=lambda pairs: ("O", pairs), parse_int=float,
                          parse_constant=reject_constant)
        out = []
        flatten(tree, out)
        return out
    except (UnicodeDecodeError, ValueError, Rejected, RecursionError):
        return None


def run_helper(helper, records, *args):
    payload = b"".join(b"%d\n%s" % (len(r), r) for r in records)
    result = subprocess.run([helper, *args], input=payload, stdout=subprocess.PIPE, check=True)
    blocks = result.stdout.decode("utf-8", "replace").split("END\n")
    assert blocks[-1] == "", "trailing output from json_dump"
    return [b.rstrip("\n").split("\n") for b in blocks[:-1]]


def main():
    helper = sys.argv[1]
    documents = []
    for _ in range(8000):
        documents.append((ws() + gen_value(0) + ws()).encode("utf-8"))
    documents += [mutate(d) for d in documents[:8000]]
    documents += [mutate(mutate(d)) for d in documents[:4000]]
    blocks = run_helper(helper, documents)
    assert len(blocks) == len(documents)

    failures, n_valid = [], 0
    for doc, block in zip(documents, blocks):
        expected = python_verdict(doc)
        n_valid += expected is not None
        if expected is None:
            ok = block[0].startswith("ERROR ")
        else:
            ok = block[0] == "OK" and block[1:] == expected
        if not ok:
            failures.append((doc, expected, block))
    n_invalid = len(documents) - n_valid
    print("%d documents: %d valid, %d invalid per Python" % (len(documents), n_valid, n_invalid))
    # Guard against a generator that stopped producing one side of the comparison.
    if n_valid < 8000 or n_invalid < 6000:
        print("FAIL: too few valid or invalid documents to mean anything")
        return 1

    texts = ["".join(RNG.choice(CHAR_POOL + ["\x00"]) for _ in range(RNG.randrange(0, 12)))
             for _ in range(2000)]
    encoded = run_helper(helper, [t.encode("utf-8") for t in texts], "--encode")
    encode_failures = []
    for text, block in zip(texts, encoded):
        written = "\n".join(block)[2:]
        try:
            ok = json.loads(written) == text
        except ValueError:
            ok = False
        if not ok:
            encode_failures.append((text, written))

    for doc, expected, block in failures[:10]:
        print("MISMATCH for %r\n  python: %s\n  zt:     %s" % (doc, expected, block))
    for text, written in encode_failures[:10]:
        print("ENCODE MISMATCH: %r written as %r" % (text, written))
    if failures or encode_failures:
        print("FAIL: %d parse mismatches, %d encode mismatches" % (len(failures), len(encode_failures)))
        return 1
    print("OK: zt agrees with Python on every document and every written string")
    return 0


if __name__ == "__main__":
    sys.exit(main())
