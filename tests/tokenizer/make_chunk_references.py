#!/usr/bin/env python3
"""Fixture of test_spm_chunked: texts and the ids libsentencepiece gives for each of them whole.

    make_chunk_references.py WORK_DIR awkward             the models make_references.sh trained
    make_chunk_references.py WORK_DIR alpaca SHARED_DIR   the LLaMA tokenizers of the shared data

Writes into WORK_DIR
    chunk-awkward.texts      texts made to break chunked encoding (below) and texts.txt's lines
    chunk-alpaca.texts       every instruction, input and output of every SHARED_DIR/alpaca file
    chunk-CORPUS-MODEL.ids   one line of ids per text
A .texts file is a sequence of texts, each a 4-byte little-endian length and that many UTF-8 bytes.
With "alpaca" the LLaMA tokenizers also get chunk-awkward-MODEL.ids (run "awkward" first).

The reference is two independent routes into the same libsentencepiece (pyrun.sh prefers Debian's
python3-sentencepiece, which links the library the plugin links): the Python binding encodes every
text, and spm_encode (which reads one text per line) every text without a line break; the two
must agree, or this script fails.
"""
import concurrent.futures
import glob
import json
import os
import random
import struct
import subprocess
import sys

import sentencepiece as spm

USAGE = "usage: make_chunk_references.py WORK_DIR awkward | WORK_DIR alpaca SHARED_DIR"
if len(sys.argv) < 3:
    sys.exit(USAGE)
WORK, CORPUS = sys.argv[1:3]
SHARED = sys.argv[3] if len(sys.argv) > 3 else ""

TRAINED = ["bpe", "bpe_trim", "bpe_suffix", "bpe_nosplit", "bpe_nfkc", "bpe_spaced", "bpe_unused", "unigram"]
SHARED_MODELS = ["llama2_tokenizer", "chinese_llama2_tokenizer"]

# Each line exercises something chunked encoding must get exactly right.
AWKWARD = [
    # empty text, runs of spaces, leading and trailing spaces (trimmed or kept, dummy prefix)
    "", " ", "  ", "   ", "a", " a", "a ", "  a", "a  ", "  a  b   c  ", " " * 100,
    # tabs and line breaks are not spaces to SentencePiece (nmt_nfkc maps them to spaces)
    "\t", "\n", "\r\n", " \n ", "a\tb", "a \tb", "a\t b", "tab\t\tend\t", "\n" * 50,
    "line one\nline two\n\nline four", "\n\nleading line breaks", "trailing line breaks\n\n",
    "def f(x):\n    return x  # four spaces\n\tif x:\n\t\tpass", "    indented code",
    # other spaces: plain characters to an identity normalizer, spaces to nmt_nfkc
    "x\u3000y", "x\u00a0y", "x\u2002y \u200b z", "a\u3000 \u3000b",
    # U+2581 in the text itself: looks like an escaped space to the model
    "\u2581", " \u2581 ", "a\u2581b", "\u2581\u2581x", "x\u2581", "a \u2581\u2581 b\u2581",
    "foo bar foo\u2581bar foobar foo  bar",
    # digits (split_digits), numbers, mixed letters and digits
    "0", "0123456789", "3.14159 and -42 and 1e-5 and 1,000,000", "x1y22z333 4444",
    "\u0663\u0664\u0665 \u0ed1\u0ed2 \uff11\uff12\uff13",
    # characters no test model knows: byte fallback or <unk> (runs of them merge)
    "\U0001f600", "\U0001f600\U0001f600\U0001f600 \U0001f600", "\U0001f469\u200d\U0001f469\u200d\U0001f467 family",
    "\U0001f1fa\U0001f1f3 flag", "e\u0301 combining", "\ufb01 ligature \u2103 \u2460 \uff46\uff55\uff4c\uff4c",
    "\u2603\u2603 \U0001d11e\U0001d11e x\u2603y", "\ufffd", "\ufeff BOM", "\uffff \ufffe \U0010ffff",
    # scripts
    "\u4e2d\u6587", "\u4eca\u5929\u7684\u4f1a\u8bae\u63a8\u8fdf\u5230\u4e0b\u5348\u4e09\u70b9\u3002",
    "\u4e2d\u6587 and English \u6df7\u5408", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u30ab\u30bf\u30ab\u30ca\u3002",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
    "\u043a\u0438\u0440\u0438\u043b\u043b\u0438\u0446\u0430 text", "\u05e2\u05d1\u05e8\u05d9\u05ea",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u0939\u093f\u0928\u094d\u0926\u0940",
    # special and user-defined pieces written in the text
    "<s>", "</s>", "<unk>", "<pad>", "<sep> [MASK] <ctrl>", "a<sep>b[MASK]c<ctrl>d",
    "I love New York and a  b, not a b", "  a  b  ",
    # control characters and NUL
    "\x00", "a\x00b", "\x7f\x01\x1f",
    # long words and long texts
    "a" * 1000, "ab" * 700, "word " * 300, "x" * 300 + " " + "y" * 300,
    "https://example.com/a/b?c=d&e=f#g", "snake_case and CamelCase and kebab-case", "C:\\path\\to\\file.txt",
    "\"quoted\" 'single' `back`", "(parens) [brackets] {braces}", "...!!!???---___***",
]


def random_texts(count, seed):
    """Random concatenations of the fragments above: whatever cut points they create."""
    parts = [" ", "  ", "\t", "\n", "\u2581", "a", "the", "fox", "foo", "bar", "1", "42", "\U0001f600",
             "\u4e2d", "\u6587", "\u2603", "\u3000", "<sep>", "x", "ing", ".", "-", "\x00", "\u00e9"]
    rng = random.Random(seed)
    return ["".join(rng.choice(parts) for _ in range(rng.randint(1, 40))) for _ in range(count)]


def alpaca_texts(shared):
    texts = []
    for path in sorted(glob.glob(os.path.join(shared, "alpaca", "*.json"))):
        with open(path, encoding="utf-8") as f:
            for record in json.load(f):
                texts.extend(record[k] for k in ("instruction", "input", "output") if isinstance(record.get(k), str))
    return texts


def varint(value):
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def read_varint(data, pos):
    value, shift = 0, 0
    while True:
        value |= (data[pos] & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if data[pos - 1] < 0x80:
            return value, pos


def fields(data):
    """(number, payload, raw bytes) of each protobuf field; payload only for length-delimited
    ones. Knows the wire types SentencePiece's ModelProto uses: varint, 32-bit, length-delimited."""
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = read_varint(data, pos)
        payload = None
        if key & 7 == 0:
            _, pos = read_varint(data, pos)
        elif key & 7 == 5:
            pos += 4
        elif key & 7 == 2:
            n, pos = read_varint(data, pos)
            payload, pos = data[pos:pos + n], pos + n
        else:
            raise ValueError(f"wire type {key & 7} in a ModelProto")
        yield key >> 3, payload, data[start:pos]


def write_unused_variant(source, target):
    """The model with every fifth multi-character NORMAL piece marked UNUSED (type 5), which
    spm_train never writes but SentencePiece supports: the plugin must encode whole texts."""
    with open(source, "rb") as f:
        model = f.read()
    out, index = bytearray(), 0
    for number, payload, raw in fields(model):
        if number == 1:  # ModelProto.pieces: piece 1, score 2, type 3 (NORMAL 1 when absent)
            sub = list(fields(payload))
            text = next(p for n, p, _ in sub if n == 1).decode("utf-8")
            is_normal = all(not (n == 3 and r != b"\x18\x01") for n, _, r in sub)
            if is_normal and len(text) > 1 and index % 5 == 0:
                body = b"".join(r for n, _, r in sub if n != 3) + b"\x18\x05"
                raw = b"\x0a" + varint(len(body)) + body
            index += 1
        out += raw
    with open(target, "wb") as f:
        f.write(out)


def write_texts(path, texts):
    with open(path, "wb") as f:
        for t in texts:
            b = t.encode("utf-8")
            f.write(struct.pack("<I", len(b)) + b)


def read_texts(path):
    with open(path, "rb") as f:
        data = f.read()
    texts, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        texts.append(data[pos + 4:pos + 4 + n].decode("utf-8"))
        pos += 4 + n
    return texts


def cli_ids(model, texts):
    """spm_encode's ids for texts without a line break (it reads one text per line)."""
    lines = "".join(t + "\n" for t in texts).encode("utf-8")
    out = subprocess.run(["spm_encode", f"--model={model}", "--output_format=id"], input=lines,
                         stdout=subprocess.PIPE, check=True).stdout.decode("ascii").split("\n")
    return [[int(x) for x in line.split()] for line in out[:len(texts)]]


def write_references(corpus, texts, model_name, model_path):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    ids = [sp.encode(t) for t in texts]
    single_line = [i for i, t in enumerate(texts) if "\n" not in t]
    from_cli = cli_ids(model_path, [texts[i] for i in single_line])
    disagree = [i for i, got in zip(single_line, from_cli) if got != ids[i]]
    if disagree:
        i = disagree[0]
        raise RuntimeError(
            f"make_chunk_references: {model_name}: spm_encode and the Python binding disagree on "
            f"{len(disagree)} texts, first {texts[i]!r}: {from_cli[single_line.index(i)]} vs "
            f"{ids[i]}; they must link the same libsentencepiece (sentencepiece {spm.__version__})")
    with open(os.path.join(WORK, f"chunk-{corpus}-{model_name}.ids"), "w") as f:
        f.writelines(" ".join(map(str, x)) + "\n" for x in ids)
    print(f"{corpus} {model_name}: {len(texts)} texts, {len(single_line)} also checked with spm_encode")


def main():
    jobs = []  # (corpus, texts, model name, model path)
    if CORPUS == "awkward":
        with open(os.path.join(WORK, "texts.txt"), encoding="utf-8") as f:
            awkward = AWKWARD + f.read().split("\n")[:-1] + random_texts(400, seed=1)
        write_texts(os.path.join(WORK, "chunk-awkward.texts"), awkward)
        write_unused_variant(os.path.join(WORK, "bpe.model"), os.path.join(WORK, "bpe_unused.model"))
        jobs = [("awkward", awkward, m, os.path.join(WORK, m + ".model")) for m in TRAINED]
    elif CORPUS == "alpaca":
        if not os.path.isdir(os.path.join(SHARED, "alpaca")):
            print(f"SKIP: the shared data folder '{SHARED}' has no alpaca/ (it lives in ../shared/data "
                  "next to the checkout)")
            sys.exit(77)
        alpaca = alpaca_texts(SHARED)
        write_texts(os.path.join(WORK, "chunk-alpaca.texts"), alpaca)
        awkward = read_texts(os.path.join(WORK, "chunk-awkward.texts"))
        for m in SHARED_MODELS:
            path = os.path.join(SHARED, "tokenizers", m + ".model")
            jobs += [("alpaca", alpaca, m, path), ("awkward", awkward, m, path)]
    else:
        sys.exit(USAGE)
    # One process per job, as many at once as there are cores: the Alpaca texts take a while.
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count()) as pool:
        try:
            for done in [pool.submit(write_references, *job) for job in jobs]:
                done.result()
        except RuntimeError as e:
            sys.exit(str(e))


if __name__ == "__main__":
    main()
