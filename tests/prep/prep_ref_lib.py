"""Shared by zt-prep's Python tests: an independent reference for what zt-prep writes.

Nothing here uses zt code: records are read with Python's json module, prompts are written out from
the template wording in docs/zt-prep.md, token ids come from the sentencepiece Python package (the
reference implementation), shards are parsed with struct and their FNV-1a checksums recomputed.
Expected sample = [BOS] + spm(prompt) + spm(answer) + [EOS], loss mask 1 on the answer ids and EOS.
"""
import json
import os
import shutil
import struct
import subprocess

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, flush=True)
    return cond


def check_eq(got, want, what):
    if got != want:
        return check(False, f"{what}: got {str(got)[:400]!r}, expected {str(want)[:400]!r}")
    return True


# ---- FNV-1a 64 and the shard layout (framework/data/shard_format.h, written out again here) ----------

M64 = (1 << 64) - 1


def fnv1a64(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


HEADER = struct.Struct("<8s6I12Q128s")
FIELDS = ("magic version header_size token_bytes flags vocab_size shard_index tokenizer_hash "
          "n_samples n_tokens n_loss_tokens tokens_offset mask_offset index_offset file_size "
          "tokens_checksum mask_checksum index_checksum header_checksum reserved").split()


def align64(x):
    return (x + 63) // 64 * 64


def read_shard(path, vocab_size, tokenizer_hash, verify=True):
    """Parse and check one shard; returns (header dict, [(ids, mask), ...]). verify=False skips the
    checksums of the sections (pure Python FNV is slow on megabytes)."""
    data = open(path, "rb").read()
    h = dict(zip(FIELDS, HEADER.unpack_from(data, 0)))
    name = os.path.basename(path)
    check_eq(h["magic"], b"ZTSHARD\0", f"{name} magic")
    check_eq(h["version"], 1, f"{name} version")
    check_eq(h["header_size"], 256, f"{name} header_size")
    check_eq(h["reserved"], bytes(128), f"{name} reserved bytes")
    check_eq(h["header_checksum"], fnv1a64(data[:120]), f"{name} header checksum")
    check_eq(h["vocab_size"], vocab_size, f"{name} vocab_size")
    check_eq(h["tokenizer_hash"], tokenizer_hash, f"{name} tokenizer hash")
    tb, n, nt = h["token_bytes"], h["n_samples"], h["n_tokens"]
    check_eq(tb, 2 if vocab_size <= 65536 else 4, f"{name} token_bytes")
    check_eq(h["tokens_offset"], 256, f"{name} tokens_offset")
    check_eq(h["mask_offset"], align64(256 + nt * tb), f"{name} mask_offset")
    check_eq(h["index_offset"], align64(h["mask_offset"] + nt), f"{name} index_offset")
    check_eq(h["file_size"], h["index_offset"] + 8 * (n + 1), f"{name} file_size")
    check_eq(len(data), h["file_size"], f"{name} real size")
    tokens = data[256:256 + nt * tb]
    mask = data[h["mask_offset"]:h["mask_offset"] + nt]
    index_bytes = data[h["index_offset"]:h["index_offset"] + 8 * (n + 1)]
    if verify:
        check_eq(h["tokens_checksum"], fnv1a64(tokens), f"{name} tokens checksum")
        check_eq(h["mask_checksum"], fnv1a64(mask), f"{name} mask checksum")
        check_eq(h["index_checksum"], fnv1a64(index_bytes), f"{name} index checksum")
    check(data[256 + nt * tb:h["mask_offset"]] == bytes(h["mask_offset"] - 256 - nt * tb),
          f"{name} padding after tokens is zero")
    check(data[h["mask_offset"] + nt:h["index_offset"]] == bytes(h["index_offset"] - h["mask_offset"] - nt),
          f"{name} padding after mask is zero")
    ids = struct.unpack(f"<{nt}{'H' if tb == 2 else 'I'}", tokens)
    index = struct.unpack(f"<{n + 1}Q", index_bytes)
    check_eq(index[0], 0, f"{name} index[0]")
    check_eq(index[-1], nt, f"{name} index[n]")
    check(all(index[i] < index[i + 1] for i in range(n)), f"{name} index strictly increasing")
    check(set(mask) <= {0, 1}, f"{name} mask bytes are 0/1")
    check_eq(sum(mask), h["n_loss_tokens"], f"{name} n_loss_tokens")
    check(all(i < vocab_size for i in ids), f"{name} ids below vocab_size")
    samples = [(list(ids[index[i]:index[i + 1]]), list(mask[index[i]:index[i + 1]])) for i in range(n)]
    return h, samples


def read_output(out_dir, sp, model_path, verify=True):
    """manifest.json and the samples of each split, in manifest (= shard) order."""
    manifest = json.load(open(os.path.join(out_dir, "manifest.json")))
    model_hash = fnv1a64(open(model_path, "rb").read())
    check_eq(manifest["tokenizer"]["hash"], "%016x" % model_hash, "manifest tokenizer hash")
    check_eq(manifest["tokenizer"]["vocab_size"], sp.get_piece_size(), "manifest vocab_size")
    check_eq(manifest["tokenizer"]["bos_id"], sp.bos_id(), "manifest bos_id")
    check_eq(manifest["tokenizer"]["eos_id"], sp.eos_id(), "manifest eos_id")
    splits = {"train": [], "val": []}
    counters = {"train": 0, "val": 0}
    for entry in manifest["shards"]:
        path = os.path.join(out_dir, entry["file"])
        raw = open(path, "rb").read()
        check_eq(entry["bytes"], len(raw), f"{entry['file']} bytes in manifest")
        if verify:
            check_eq(entry["checksum"], "%016x" % fnv1a64(raw), f"{entry['file']} checksum in manifest")
        h, samples = read_shard(path, sp.get_piece_size(), model_hash, verify)
        split = entry["split"]
        check_eq(h["flags"], 1 if split == "val" else 0, f"{entry['file']} validation flag")
        check_eq(h["shard_index"], counters[split], f"{entry['file']} shard_index")
        check_eq(entry["file"], "%s-%05d.ztshard" % (split, counters[split]), "shard file name")
        check_eq(entry["samples"], len(samples), f"{entry['file']} samples in manifest")
        counters[split] += 1
        splits[split].extend(samples)
    extra = sorted(f for f in os.listdir(out_dir) if f != "manifest.json" and f not in
                   {e["file"] for e in manifest["shards"]})
    check_eq(extra, [], f"files in {out_dir} besides the manifest and its shards")
    return manifest, splits


# ---- the reference: templates as documented, spm, truncation rule ------------------------------

ALPACA_SYS = ("Below is an instruction that describes a task, paired with an input that provides "
              "further context. Write a response that appropriately completes the request.")
ALPACA_SYS_NO_INPUT = ("Below is an instruction that describes a task. Write a response that "
                       "appropriately completes the request.")
VICUNA_SYS = ("A chat between a curious user and an artificial intelligence assistant. The assistant "
              "gives helpful, detailed, and polite answers to the user's questions.")


def render_turn(template, first, system, user, inp):
    """(prompt text, suffix appended to the answer) of one user turn."""
    if isinstance(template, dict):  # the custom template file used below
        sys_text = (system if system is not None else template["system"]) if first else ""
        head = f"[{sys_text}]\n" if sys_text else ""
        body = f"Q: {user}\n{inp}\nA:" if inp else f"Q: {user}\nA:"
        return ("" if first else "\n--\n") + head + body, " <end>"
    q = f"{user}\n{inp}" if inp else user
    if template == "alpaca":
        if first:
            sys_text = system if system is not None else (ALPACA_SYS if inp else ALPACA_SYS_NO_INPUT)
            head = sys_text + "\n\n" if sys_text else ""
        else:
            head = "\n\n"
        if inp:
            return head + f"### Instruction:\n{user}\n\n### Input:\n{inp}\n\n### Response:\n", ""
        return head + f"### Instruction:\n{user}\n\n### Response:\n", ""
    if template == "vicuna":
        sys_text = (system if system is not None else VICUNA_SYS) if first else ""
        return (sys_text + " " if sys_text else "") + f"USER: {q} ASSISTANT:", ""
    if template == "llama2":
        sys_text = (system or "") if first else ""
        block = f"<<SYS>>\n{sys_text}\n<</SYS>>\n\n" if sys_text else ""
        return f"[INST] {block}{q} [/INST]", ""
    if template == "chatml":
        sys_text = (system or "") if first else ""
        block = f"<|im_start|>system\n{sys_text}<|im_end|>\n" if sys_text else ""
        return ("" if first else "\n") + block + \
            f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>"
    raise ValueError(template)


def expected_sample(rec, template, sp, history_loss=False):
    """(ids, mask, prompt_len, segments) before truncation; segments = [(text|None, ids, loss)]."""
    turns = [(u, "", a) for u, a in rec.get("history", [])]
    turns.append((rec["instruction"], rec.get("input", ""), rec["output"]))
    segs = []
    if sp.bos_id() >= 0:
        segs.append((None, [sp.bos_id()], 0))
    prompt_len = 0
    for t, (user, inp, answer) in enumerate(turns):
        last = t == len(turns) - 1
        prompt, suffix = render_turn(template, t == 0, rec.get("system"), user, inp)
        segs.append((prompt, sp.encode(prompt), 0))
        if last:
            prompt_len = sum(len(s[1]) for s in segs)
        loss = 1 if last else int(history_loss)
        segs.append((answer + suffix, sp.encode(answer + suffix), loss))
        if not last and template == "vicuna":
            segs.append((None, [sp.eos_id()], loss))
        if not last and template == "llama2":
            segs.append((None, [sp.eos_id()], loss))
            if sp.bos_id() >= 0:
                segs.append((None, [sp.bos_id()], 0))
    segs.append((None, [sp.eos_id()], 1))
    ids, mask = [], []
    for _, seg_ids, loss in segs:
        ids += seg_ids
        mask += [loss] * len(seg_ids)
    return ids, mask, prompt_len, segs


def truncate(ids, mask, prompt_len, has_bos, max_len):
    """The documented rule: keep BOS; cut the prompt from the left down to min(prompt, max_len/4)
    tokens; then cut the response from the right. Returns (ids, mask, kind)."""
    if len(ids) <= max_len:
        return ids, mask, None
    b = 1 if has_bos else 0
    p = prompt_len - b
    r = len(ids) - prompt_len
    budget = max_len - b
    min_prompt = min(p, max_len // 4)
    if budget >= r and budget - r >= min_prompt:
        keep_r, keep_p = r, min(p, budget - r)
    else:
        keep_p, keep_r = min_prompt, budget - min_prompt
    sel = list(range(b)) + list(range(prompt_len - keep_p, prompt_len)) + \
        list(range(prompt_len, prompt_len + keep_r))
    return [ids[i] for i in sel], [mask[i] for i in sel], ("response" if keep_r < r else "prompt")


def load_records(path):
    """Records as Python reads them (valid test files only)."""
    text = open(path, encoding="utf-8").read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def expected_run(files, template, sp, max_len=512, history_loss=False, overlong="truncate"):
    """Expected kept samples in input order and the counters of manifest.json."""
    samples = []
    stats = {"read": 0, "empty_output": 0, "overlong": 0, "prompt": 0, "response": 0, "longest": 0}
    for f in files:
        for rec in load_records(f):
            stats["read"] += 1
            if rec["output"].strip(" \t\n\r") == "":
                stats["empty_output"] += 1
                continue
            ids, mask, plen, _ = expected_sample(rec, template, sp, history_loss)
            stats["longest"] = max(stats["longest"], len(ids))
            if len(ids) > max_len and overlong == "drop":
                stats["overlong"] += 1
                continue
            ids, mask, kind = truncate(ids, mask, plen, sp.bos_id() >= 0, max_len)
            if kind:
                stats[kind] += 1
            samples.append((ids, mask))
    return samples, stats


def run(zt_prep, args, expect_rc=0):
    p = subprocess.run([zt_prep] + args, capture_output=True, text=True)
    check_eq(p.returncode, expect_rc, f"exit status of zt-prep {' '.join(args)}\n{p.stderr}")
    return p


def fresh(work, name):
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    return d


def compare(name, got, want):
    check_eq(len(got), len(want), f"{name}: number of samples")
    for i, (g, w) in enumerate(zip(got, want)):
        if not check_eq(g[0], w[0], f"{name}: sample {i} token ids"):
            break
        if not check_eq(g[1], w[1], f"{name}: sample {i} loss mask"):
            break
