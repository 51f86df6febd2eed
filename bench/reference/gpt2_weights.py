# DistJax's GPT-2 initial weights and token batches for the references (numpy only, so the
# GPU machine needs no safetensors package): bench_gpu_gpt2 --weights-out (safetensors, f32,
# DistJax's paths and layouts) and --tokens-out (.npy of i32 (N, 2, B, T): [s, 0] the inputs,
# [s, 1] the targets of step s). torch_gpt2.py and jax_gpt2.py read them with WEIGHTS= and
# TOKENS=.
import json
import os
import types

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64}


def read_safetensors(path):
    """-> ({name: array}, metadata): 8-byte little-endian header length, JSON header, data."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=_DTYPES[e["dtype"]]).reshape(e["shape"])
    return out, meta


def load(path):
    """The weights at `path` -> (cfg, params).

    cfg: dict L, H, D, T, V, eps. params, in the layout jax_gpt2.py keeps: "wte" (V, D)
    (the head is tied to it), "wpe" (T, D), "lnf" (scale, bias), "blocks": a list of dicts
    ln1, ln2 (scale, bias) and qkv, proj, fc, fc2 (kernel (in, out), bias) for
    y = x @ kernel + bias, qkv's 3D columns as [q | k | v] with the heads side by side in
    each. DistJax orders them (H, 3, D/H), per head its q, k and v: permuted here.
    Every tensor of the file is used, or this raises.
    """
    w, meta = read_safetensors(path)
    if meta.get("format") != "distjax.gpt2":
        raise ValueError(f"{path}: not bench_gpu_gpt2's weights (metadata {meta})")
    if meta.get("tied_embeddings") != "true":
        raise ValueError(f"{path}: the references tie the head to wte")
    used = set()

    def get(name):
        used.add(name)
        return w[name]

    V, D = w["wte/embedding"].shape
    cfg = dict(L=int(meta["num_layers"]), H=int(meta["num_heads"]), D=D, V=V,
               T=w["wpe/embedding"].shape[0], eps=float(meta["ln_eps"]))
    H = cfg["H"]

    def pair(prefix, a, b):
        return (get(f"{prefix}/{a}"), get(f"{prefix}/{b}"))

    blocks = []
    for i in range(cfg["L"]):
        p = f"blocks/{i}"
        qk, qb = pair(f"{p}/attn/qkv", "kernel", "bias")
        blocks.append(dict(
            ln1=pair(f"{p}/ln1", "scale", "bias"),
            qkv=(qk.reshape(D, H, 3, D // H).transpose(0, 2, 1, 3).reshape(D, 3 * D),
                 qb.reshape(H, 3, D // H).transpose(1, 0, 2).reshape(3 * D)),
            proj=pair(f"{p}/attn/out", "kernel", "bias"),
            ln2=pair(f"{p}/ln2", "scale", "bias"),
            fc=pair(f"{p}/mlp/fc1", "kernel", "bias"),
            fc2=pair(f"{p}/mlp/fc2", "kernel", "bias")))
    params = dict(wte=get("wte/embedding"), wpe=get("wpe/embedding"), blocks=blocks,
                  lnf=pair("ln_f", "scale", "bias"))
    if used != set(w):
        raise ValueError(f"{path}: tensors not mapped: {sorted(set(w) - used)}")
    return cfg, params


def load_tokens(path):
    """The batches at `path`: i32 (N, 2, B, T)."""
    t = np.load(path)
    if t.dtype != np.int32 or t.ndim != 4 or t.shape[1] != 2:
        raise ValueError(f"{path}: expected i32 (N, 2, B, T), got {t.dtype} {t.shape}")
    return t


def max_rel(ours, theirs):
    """max over steps of |ours - theirs| / |theirs| (the shorter list's steps)."""
    n = min(len(ours), len(theirs))
    return max(abs(a - b) / abs(b) for a, b in zip(ours[:n], theirs[:n])) if n else None


def run_settings(env=os.environ):
    """What both references read from the environment: the model's shape (from WEIGHTS= when
    given, else L= and T= over GPT-2 124M's), the batch (from TOKENS= when given, else B=),
    PRECISION=, STEPS=, LOSS_STEPS=, and the loaded weights and tokens (None without)."""
    s = types.SimpleNamespace(precision=env.get("PRECISION", "bf16"),
                              steps=int(env.get("STEPS", "30")),
                              loss_steps=int(env.get("LOSS_STEPS", "20")), params=None, tokens=None)
    if env.get("WEIGHTS"):
        cfg, s.params = load(env["WEIGHTS"])
        s.L, s.H, s.D, s.T, s.V, s.eps = (cfg[k] for k in ("L", "H", "D", "T", "V", "eps"))
    else:
        s.L, s.H, s.D, s.T, s.V, s.eps = int(env.get("L", "12")), 12, 768, int(env.get("T", "1024")), 50304, 1e-5
    s.B = int(env.get("B", "16"))
    if env.get("TOKENS"):
        s.tokens = load_tokens(env["TOKENS"])
        s.B = s.tokens.shape[2]
        if s.tokens.shape[3] > s.T:
            raise ValueError(f"tokens of length {s.tokens.shape[3]} past the model's {s.T} positions")
        s.T = s.tokens.shape[3]
    return s
