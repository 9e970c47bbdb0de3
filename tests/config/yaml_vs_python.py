#!/usr/bin/env python3
"""Differential test: zt's YAML reader (framework/config/yaml.c, through yaml_dump) against PyYAML, the
reader MindFormers loads its configs with.

For a few thousand generated documents (every scalar spelling YAML 1.1 types, quoting styles, block and
flow collections, anchors, aliases, << merges, duplicate and non-text keys, tags, second documents, and
mutated ones that are mostly invalid), zt must accept exactly what the reference accepts and produce the
same values. The reference is PyYAML's SafeLoader (on libyaml when PyYAML has it, as zt) with zt's
documented differences (docs/config.md, "YAML") written out as resolver and constructor rules below:

  - a plain scalar that YAML 1.1 leaves text and YAML 1.2's core schema reads as a number is a number
    (1e-4, 1.0e5, 0o17, 08, -.5);
  - an integer that YAML 1.1 reads as octal and YAML 1.2 as a different decimal is refused (010);
  - timestamps, .inf and .nan, text with a NUL, !!binary / !!set / !!omap / !!pairs, a !!null that is not
    null, 0x_ (PyYAML fails on it too), duplicate keys, keys that are not text, two << in one mapping, an
    alias inside the value it names, a second document and a top level that is not a mapping are refused;
  - config keys (those of mappings reached from the top through mappings) may not be empty or hold '.'.

Each difference must be met at least once, so the test notices when the generator stops reaching one.
Usage: yaml_vs_python.py PATH_TO_yaml_dump
"""
import json
import math
import random
import re
import subprocess
import sys

import yaml

RNG = random.Random(1105)  # fixed seed: failures are reproducible
Base = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
SEEN = {}  # difference -> times the reference applied it


class Refused(Exception):
    pass


def refuse(kind):
    SEEN[kind] = SEEN.get(kind, 0) + 1
    raise Refused(kind)


class ZtLoader(Base):
    pass


YAML12_NUMBER = re.compile(r"""^(?:[-+]?[0-9]+
    |0o[0-7]+
    |0x[0-9a-fA-F]+
    |[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?)$""", re.X)
# Tried after PyYAML's own resolvers, so only where YAML 1.1 found no type.
ZtLoader.add_implicit_resolver("tag:zt:yaml12-number", YAML12_NUMBER, list("-+0123456789."))


def construct_yaml12(loader, node):
    SEEN["1.2 number"] = SEEN.get("1.2 number", 0) + 1
    v = node.value
    if v.startswith("0o"):
        return int(v[2:], 8)
    if v.startswith("0x"):
        return int(v[2:], 16)
    if re.fullmatch(r"[-+]?[0-9]+", v):
        return int(v)
    return float(v)


def construct_int(loader, node):
    v = node.value
    if re.fullmatch(r"[-+]?0[0-7_]+", v) and re.fullmatch(r"[-+]?[0-9]+", v) and int(v, 8) != int(v, 10):
        refuse("ambiguous octal")
    return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)


def construct_float(loader, node):
    if re.fullmatch(r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)", node.value):
        refuse("not finite")
    return yaml.constructor.SafeConstructor.construct_yaml_float(loader, node)


def construct_str(loader, node):
    if "\0" in node.value:
        refuse("NUL")
    return node.value


def construct_null(loader, node):
    if node.value not in ("", "~", "null", "Null", "NULL"):
        refuse("!!null not null")
    return None


def construct_map(loader, node):
    if not isinstance(node, yaml.MappingNode):
        raise Refused("not a mapping")
    seen, merges = set(), 0
    for k, _ in node.value:
        if k.tag == "tag:yaml.org,2002:merge":
            merges += 1
            continue
        key = loader.construct_object(k, deep=True)
        if not isinstance(key, str):
            refuse("key not text")
        if key in seen:
            refuse("duplicate key")
        seen.add(key)
    if merges > 1:
        refuse("two merges")
    return loader.construct_mapping(node, deep=True)


for tag, fn in [("tag:zt:yaml12-number", construct_yaml12), ("tag:yaml.org,2002:int", construct_int),
                ("tag:yaml.org,2002:float", construct_float), ("tag:yaml.org,2002:str", construct_str),
                ("tag:yaml.org,2002:null", construct_null), ("tag:yaml.org,2002:map", construct_map)]:
    ZtLoader.add_constructor(tag, fn)
for tag in ["timestamp", "binary", "set", "omap", "pairs"]:
    ZtLoader.add_constructor("tag:yaml.org,2002:" + tag, lambda loader, node, t=tag: refuse(t))


def recursive(node, stack):
    """1 when an alias below `node` names a node that contains it (PyYAML merges such a mapping into
    itself, or builds a value that contains itself)."""
    if any(node is n for n in stack):
        return True
    if isinstance(node, yaml.ScalarNode):
        return False
    children = [x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode) else node.value
    return any(recursive(c, stack + [node]) for c in children)


def config_keys(value, path=()):
    """The keys zt reads as config keys: those of the mappings reached from the top through mappings."""
    for k, v in value.items():
        if k == "" or "." in k:
            refuse("key empty or dotted")
        if isinstance(v, dict):
            config_keys(v, path + (k,))


def reference(text):
    """(True, value) or (False, why)."""
    try:
        nodes = list(yaml.compose_all(text, Loader=ZtLoader))
        if len(nodes) == 1 and nodes[0] is not None and recursive(nodes[0], []):
            refuse("recursive")
        docs = list(yaml.load_all(text, Loader=ZtLoader))
        if len(docs) == 1 and isinstance(docs[0], dict):
            config_keys(docs[0])
    except Refused as e:
        return False, str(e)
    except Exception as e:  # YAMLError, and the ValueErrors of !!int "x" and kin
        return False, type(e).__name__
    if len(docs) != 1:
        if len(docs) > 1:
            SEEN["second document"] = SEEN.get("second document", 0) + 1
        return False, "%d documents" % len(docs)
    if not isinstance(docs[0], dict):
        return False, "top level not a mapping"
    return True, docs[0]


def same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
            return math.isnan(b)
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


# ---- the documents -------------------------------------------------------------------------------

SCALARS = [
    # YAML 1.1 booleans and nulls, and look-alikes that are text
    "yes", "Yes", "YES", "no", "No", "NO", "true", "True", "TRUE", "false", "False", "FALSE", "on", "On",
    "ON", "off", "Off", "OFF", "y", "n", "tRue", "~", "null", "Null", "NULL", "nul",
    # integers
    "0", "7", "-12", "+5", "1_000", "0x1F", "-0x1f", "0b101", "-0b11", "017", "010", "08", "00", "0o17",
    "1:30", "-1:30:05", "190:20:30", "12345678901234567890123", "0x_", "1__0",
    # floats
    "1.5", "-2.25", "3.e-4", "1e-4", "1E5", "1.0e5", "1.0e+5", "2.5E-3", ".5", "-.5", "+.5", "1.", "00.5",
    "1_0.2_5", "1:30.5", ".inf", "-.Inf", "+.INF", ".nan", ".NaN", "NaN", "1e999", "6.02e+23", "0.1",
    # text
    "abc", "hello world", "a.b", "key:value", "x-y", "'single quoted'", '"double quoted"', '"true"', "'123'",
    '"1e-4"', '"tab\\there"', '"\\u00e9t\\u00e9"', '"line\\nbreak"', '"nul\\0byte"', "2001-12-14",
    "2001-12-14 21:59:43.10 -5", "2001-12-14t21:59:43.10Z", "2001-1-1", "20011214", "-", "?x", "é",
    "'it''s'", '"\\x41"',
    # tags
    "!!str 123", '!!int "42"', "!!int 0x1F", "!!int 010", "!!float 1", "!!float abc", "!!int 1.5",
    '!!bool "yes"', "!!bool maybe", '!!null ""', "!!null abc", "!!binary aGVsbG8=", "!foo bar", "! 12",
    "!!timestamp 2001-12-14",
]
KEYS = ["k", "key_2", "alpha", "b", "c3", "\u65e5\u672c", '"quoted key"', "'yes'", "lr"]
BAD_KEYS = ["yes", "1", "null", "1.5", "a.b", '""', "[1, 2]", "{x: 1}"]


class Gen:
    def __init__(self):
        self.anchors = []  # (name, is_mapping) that aliases may name
        self.pending = []  # anchored values still being written: named once complete
        self.n = 0

    def anchor(self, mapping):
        """'&aN ' or ''; the anchor becomes nameable when done() is called, now and then at once (an alias
        inside the value it names)."""
        if RNG.random() < 0.15:
            self.n += 1
            name = "a%d" % self.n
            (self.anchors if RNG.random() < 0.03 else self.pending).append((name, mapping))
            return "&%s " % name
        return ""

    def done(self):
        self.anchors += self.pending
        self.pending = []

    def alias(self, mapping=None):
        pool = [a for a, m in self.anchors if mapping is None or m == mapping]
        return "*" + RNG.choice(pool) if pool else None

    def key(self, used):
        if RNG.random() < 0.03:
            return RNG.choice(BAD_KEYS)
        fresh = [k for k in KEYS if k not in used]
        k = RNG.choice(KEYS) if RNG.random() < 0.04 or not fresh else RNG.choice(fresh)  # now and then twice
        used.add(k)
        return k

    def flow(self, depth):
        r = RNG.random()
        if depth > 2 or r < 0.5:
            a = self.alias() if RNG.random() < 0.1 else None
            text = a or self.anchor(False) + RNG.choice(SCALARS)
            self.done()
            return text
        used = set()
        if r < 0.75:
            head = self.anchor(False)
            text = head + "[" + ", ".join(self.flow(depth + 1) for _ in range(RNG.randrange(4))) + "]"
        else:
            head = self.anchor(True)
            text = head + "{" + ", ".join(
                "%s: %s" % (self.key(used), self.flow(depth + 1)) for _ in range(RNG.randrange(4))) + "}"
        self.done()
        return text

    def block_map(self, indent, depth):
        lines = []
        pad = " " * indent
        if depth > 0 and RNG.random() < 0.2:
            many = RNG.random() < 0.4
            targets = [self.alias(True) for _ in range(2 if many else 1)]
            if all(targets):
                lines.append(pad + "<<: " + ("[%s]" % ", ".join(targets) if many else targets[0]))
                if RNG.random() < 0.1:
                    lines.append(pad + "<<: " + targets[0])
        used = set()
        for _ in range(RNG.randrange(1, 5)):
            k = self.key(used)
            r = RNG.random()
            if depth < 3 and r < 0.25:
                lines.append(pad + "%s: %s" % (k, self.anchor(True).strip()))
                lines += self.block_map(indent + 2, depth + 1)
                self.done()
            elif depth < 3 and r < 0.35:
                lines.append(pad + "%s: %s" % (k, self.anchor(False).strip()))
                for _ in range(RNG.randrange(1, 4)):
                    lines.append(pad + "  - " + self.flow(depth + 1))
                self.done()
            elif r < 0.4:
                lines.append(pad + k + ":")  # null
            elif r < 0.45:
                lines.append(pad + k + ": |")
                lines += [pad + "  line one", pad + "  line two"]
            else:
                lines.append(pad + "%s: %s" % (k, self.flow(depth + 1)))
        return lines


def document():
    g = Gen()
    lines = g.block_map(0, 0)
    if RNG.random() < 0.03:
        lines = ["---"] + lines + ["---", "x: 1"]
    text = "\n".join(lines) + "\n"
    if RNG.random() < 0.15:  # a mutation: mostly a syntax error
        pos = RNG.randrange(len(text))
        cut = RNG.choice(["\t", "", ":", "- ", "[", '"', "  ", "\n  ", "&", "*", "#"])
        text = text[:pos] + cut + text[pos + (cut == ""):]
    return text


def main():
    dump = sys.argv[1]
    docs = [document() for _ in range(3000)]
    stdin = b"".join(b"%d\n%s" % (len(d.encode()), d.encode()) for d in docs)
    out = subprocess.run([dump], input=stdin, capture_output=True, check=True).stdout.decode("utf-8")
    blocks = out.split("END\n")[:-1]
    assert len(blocks) == len(docs), "yaml_dump answered %d of %d documents" % (len(blocks), len(docs))
    failures, accepted = 0, 0
    for text, block in zip(docs, blocks):
        zt_ok = block.startswith("OK ")
        ok, want = reference(text)
        if zt_ok != ok:
            failures += 1
            if failures <= 8:
                print("FAIL: zt %s, the reference %s:\n%s\n--- zt: %s--- reference: %s\n" % (
                    "accepts" if zt_ok else "refuses", "accepts" if ok else "refuses", text, block,
                    want if not ok else json.dumps(want, default=str)))
            continue
        if not ok:
            continue
        accepted += 1
        got = json.loads(block[3:])
        if not same(got, want):
            failures += 1
            if failures <= 8:
                print("FAIL: different values:\n%s\n--- zt: %s--- reference: %s\n" % (text, block, want))
    needed = ["1.2 number", "ambiguous octal", "not finite", "NUL", "!!null not null", "key not text",
              "duplicate key", "key empty or dotted", "two merges", "timestamp", "binary", "second document", "recursive"]
    for kind in needed:
        if not SEEN.get(kind):
            failures += 1
            print("FAIL: no generated document met the difference '%s': the generator no longer covers it" % kind)
    print("%d documents, %d accepted by both, differences met: %s" % (
        len(docs), accepted, ", ".join("%s %d" % (k, SEEN[k]) for k in sorted(SEEN))))
    if failures:
        print("%d failure(s)" % failures)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
