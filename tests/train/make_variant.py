#!/usr/bin/env python3
"""A damaged copy of a Hugging Face model directory (config.json + one F32 model.safetensors), for the
zt-run error tests (run_test.sh). Reads and writes safetensors itself (json + numpy), so the variant
does not go through zt's writer.

  make_variant.py SRC_DIR DST_DIR [--nan TENSOR:INDEX] [--set KEY=JSON]...

--nan makes element INDEX of the flattened TENSOR a NaN; --set replaces config.json's KEY with the
JSON value (--set 'hidden_size="64"' makes it a string).
"""
import argparse
import json
import os
import struct

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--nan", action="append", default=[])
    p.add_argument("--set", action="append", default=[])
    a = p.parse_args()
    os.makedirs(a.dst, exist_ok=True)
    with open(os.path.join(a.src, "config.json")) as f:
        config = json.load(f)
    for item in a.set:
        key, value = item.split("=", 1)
        config[key] = json.loads(value)
    with open(os.path.join(a.dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(a.src, "model.safetensors"), "rb") as f:
        data = bytearray(f.read())
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    for item in a.nan:
        name, index = item.rsplit(":", 1)
        info = header[name]
        if info["dtype"] != "F32":
            raise SystemExit(f"{name} is {info['dtype']}; only F32 is poisoned here")
        at = 8 + n + info["data_offsets"][0] + 4 * int(index)
        data[at:at + 4] = np.array([np.nan], dtype="<f4").tobytes()
    with open(os.path.join(a.dst, "model.safetensors"), "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main()
