"""Reads a DistJax checkpoint with Python's safetensors (numpy) and checks it.

Usage: read_checkpoint.py SHARDED_STEP_DIR WHOLE_STEP_DIR

SHARDED_STEP_DIR was saved by checkpoint_test.cpp (CheckpointPython) on a ("data"=2,
"model"=2) mesh, WHOLE_STEP_DIR by one device from the same values. Every tensor is
reassembled from its blocks as index.json lists them; the script checks the shapes and
dtypes against the index, each block's CRC-32s (Python's zlib) against the index, the
values against the whole checkpoint and against the values the test wrote, and exits
non-zero with a message on the first mismatch.
"""
import json
import os
import sys
import zlib

import numpy as np
from safetensors.numpy import load_file

DTYPES = {"f32": np.float32, "bf16": None, "f16": np.float16, "i32": np.int32, "i64": np.int64}


def check_checksums(step_dir, index):
    """Every block's data, read raw from its file, has the CRC-32s the index lists."""
    assert index["checksum"]["algorithm"] == "crc32", index["checksum"]
    chunk = index["checksum"]["chunk_bytes"]
    for name, t in index["tensors"].items():
        for b in t["blocks"]:
            with open(os.path.join(step_dir, b["file"]), "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                begin, end = json.loads(f.read(n))[name]["data_offsets"]
                f.seek(8 + n + begin)
                data = f.read(end - begin)
            crcs = [zlib.crc32(data[i:i + chunk]) for i in range(0, len(data), chunk)]
            assert crcs == b["crc32"], (name, b["file"], crcs, b["crc32"])


def load(step_dir):
    with open(os.path.join(step_dir, "index.json")) as f:
        index = json.load(f)
    assert index["format"] == "distjax.checkpoint", index["format"]
    check_checksums(step_dir, index)
    files = {name: load_file(os.path.join(step_dir, name)) for name in index["files"]}
    tensors = {}
    for name, t in index["tensors"].items():
        out = np.zeros(t["shape"], dtype=DTYPES[t["dtype"]])
        covered = 0
        for b in t["blocks"]:
            block = files[b["file"]][name]
            assert list(block.shape) == b["shape"], (name, block.shape, b["shape"])
            assert block.dtype == out.dtype, (name, block.dtype, out.dtype)
            out[tuple(slice(o, o + s) for o, s in zip(b["offset"], b["shape"]))] = block
            covered += block.size
        assert covered == out.size, (name, covered, out.size)
        tensors[name] = out
    return index, tensors


def main():
    sharded_index, sharded = load(sys.argv[1])
    _, whole = load(sys.argv[2])
    assert sharded_index["step"] == 5, sharded_index["step"]
    assert sharded_index["mesh"] == {"shape": [2, 2], "axis_names": ["data", "model"]}
    assert sorted(sharded) == sorted(whole), (sorted(sharded), sorted(whole))
    for name in whole:
        assert sharded[name].shape == whole[name].shape, name
        assert np.array_equal(sharded[name], whole[name]), name
    w = np.arange(48, dtype=np.float32).reshape(8, 6) * 0.5
    expect = {
        "params/w": w,
        "params/v": np.arange(6, dtype=np.float32) - 2.5,
        "params/ids": np.array([7, 8, 9, 10], dtype=np.int32),
        "opt_state/mu/w": 2 * w,
    }
    for name, value in expect.items():
        got = sharded[name]
        assert got.dtype == value.dtype and got.shape == value.shape, (name, got.dtype, got.shape)
        assert np.array_equal(got, value), (name, got, value)
    # One shard file on its own: device 0 holds the top-left block of w.
    f0 = load_file(os.path.join(sys.argv[1], "device_00000.safetensors"))
    assert f0["params/w"].shape == (4, 3) and np.array_equal(f0["params/w"], w[:4, :3])
    print("ok:", len(sharded), "tensors")


if __name__ == "__main__":
    main()
