#!/usr/bin/python3
"""Writes tests/golden/fixture.txt: reference losses, logits and gradients of the two
DistJax models computed by PyTorch in float64.

Run with Debian's python3-torch:  /usr/bin/python3 tests/golden/make_fixture.py
CI never runs this script; it only reads the fixture it wrote.

Models (must match src/distjax/models/*.cpp exactly):
  mlp: Classifier 16 -> 32 -> 4 (Dense, silu, Dense), no dropout, batch 8,
       loss = mean cross-entropy.
  gpt: Transformer vocab 32, d_model 32, 2 layers, 2 heads, mlp_ratio 4, T 8, batch 2,
       learned positions, tied embeddings, pre-norm blocks, GELU tanh, LayerNorm
       eps 1e-5, qkv columns laid out (head, {q,k,v}, head_dim); loss = mean
       cross-entropy of next-token targets.
  gpt_small: the other options: vocab 16, d_model 16, 1 layer, 4 heads, mlp_ratio 2,
       T 6, batch 3, fixed sinusoidal positions, untied lm_head (no bias).

Parameters and inputs are drawn from numpy with a fixed seed, rounded to 3 decimals
and written as short decimals. Both sides read a decimal as float64 and round it to
float32, so they start from bit-identical parameters; the reference then runs in
float64 on those float32 values.

Format: line 1 is the header. Then one record per tensor:
  <name> <dtype> <rank> <dim_0> ... <dim_{rank-1}>
  <numel values, row-major, separated by spaces>
names: <model>/param/<DistJax parameter path>, <model>/input/<x|labels|tokens|targets>,
<model>/output/<loss|logits>, <model>/grad/<DistJax parameter path>.
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixture.txt")
SEED = 1234


def q3(a):
    """Rounds to 3 decimals: the value both sides parse (then cast to float32)."""
    return np.round(np.asarray(a, dtype=np.float64), 3)


class Writer:
    def __init__(self):
        self.records = []

    def add(self, name, arr, dtype):
        arr = np.asarray(arr)
        if dtype == "f32q":  # parameters / inputs: short decimals
            vals = " ".join("%.3f" % v for v in arr.reshape(-1))
            dtype = "f32"
        elif dtype == "f64":  # reference outputs
            vals = " ".join("%.10g" % v for v in arr.reshape(-1))
        else:  # i64
            vals = " ".join(str(int(v)) for v in arr.reshape(-1))
        dims = " ".join(str(d) for d in arr.shape)
        self.records.append("%s %s %d%s\n%s\n" % (name, dtype, arr.ndim, (" " + dims) if dims else "", vals))

    def write(self, path):
        header = ("# distjax-golden v1 | made by tests/golden/make_fixture.py with PyTorch %s (float64 "
                  "reference), numpy %s, seed %d | layout: records of '<name> <dtype> <rank> <dims...>' "
                  "then one line of row-major values; f32 values are decimals to round to float32\n"
                  % (torch.__version__, np.__version__, SEED))
        with open(path, "w") as f:
            f.write(header)
            for r in self.records:
                f.write(r)


def as_t(a):
    return torch.tensor(np.asarray(a, dtype=np.float32).astype(np.float64), dtype=torch.float64,
                        requires_grad=True)


def mlp_case(rng, w):
    fin, hid, ncls, b = 16, 32, 4, 8
    params = {
        "fc1/kernel": q3(rng.normal(size=(fin, hid)) / np.sqrt(fin)),
        "fc1/bias": q3(0.1 * rng.normal(size=(hid,))),
        "fc2/kernel": q3(rng.normal(size=(hid, ncls)) / np.sqrt(hid)),
        "fc2/bias": q3(0.1 * rng.normal(size=(ncls,))),
    }
    x = q3(rng.normal(size=(b, fin)))
    labels = rng.integers(0, ncls, size=(b,))
    tp = {k: as_t(v) for k, v in params.items()}
    xt = torch.tensor(np.asarray(x, np.float32).astype(np.float64))
    h = F.silu(xt @ tp["fc1/kernel"] + tp["fc1/bias"])
    logits = h @ tp["fc2/kernel"] + tp["fc2/bias"]
    loss = F.cross_entropy(logits, torch.tensor(labels))
    loss.backward()
    for k, v in params.items():
        w.add("mlp/param/" + k, v, "f32q")
    w.add("mlp/input/x", x, "f32q")
    w.add("mlp/input/labels", labels, "i64")
    w.add("mlp/output/loss", loss.detach().numpy(), "f64")
    w.add("mlp/output/logits", logits.detach().numpy(), "f64")
    for k in params:
        w.add("mlp/grad/" + k, tp[k].grad.numpy(), "f64")


def gpt_case(rng, w, name="gpt", V=32, C=32, L=2, H=2, R=4, T=8, B=2, learned=True, tied=True):
    EPS = 1e-5
    D = C // H
    params = {
        "wte/embedding": q3(0.3 * rng.normal(size=(V, C))),
        "ln_f/scale": q3(1 + 0.1 * rng.normal(size=(C,))),
        "ln_f/bias": q3(0.1 * rng.normal(size=(C,))),
    }
    if learned:
        params["wpe/embedding"] = q3(0.1 * rng.normal(size=(T, C)))
    if not tied:
        params["lm_head/kernel"] = q3(rng.normal(size=(C, V)) / np.sqrt(C))
    for i in range(L):
        p = "blocks/%d/" % i
        params[p + "ln1/scale"] = q3(1 + 0.1 * rng.normal(size=(C,)))
        params[p + "ln1/bias"] = q3(0.1 * rng.normal(size=(C,)))
        params[p + "ln2/scale"] = q3(1 + 0.1 * rng.normal(size=(C,)))
        params[p + "ln2/bias"] = q3(0.1 * rng.normal(size=(C,)))
        params[p + "attn/qkv/kernel"] = q3(rng.normal(size=(C, 3 * C)) / np.sqrt(C))
        params[p + "attn/qkv/bias"] = q3(0.05 * rng.normal(size=(3 * C,)))
        params[p + "attn/out/kernel"] = q3(rng.normal(size=(C, C)) / np.sqrt(C))
        params[p + "attn/out/bias"] = q3(0.05 * rng.normal(size=(C,)))
        params[p + "mlp/fc1/kernel"] = q3(rng.normal(size=(C, R * C)) / np.sqrt(C))
        params[p + "mlp/fc1/bias"] = q3(0.05 * rng.normal(size=(R * C,)))
        params[p + "mlp/fc2/kernel"] = q3(rng.normal(size=(R * C, C)) / np.sqrt(R * C))
        params[p + "mlp/fc2/bias"] = q3(0.05 * rng.normal(size=(C,)))
    tokens = rng.integers(0, V, size=(B, T))
    targets = rng.integers(0, V, size=(B, T))
    tp = {k: as_t(v) for k, v in params.items()}

    tok = torch.tensor(tokens)
    if learned:
        pos = tp["wpe/embedding"][:T]
    else:  # fixed sinusoidal positions, in float64
        t = torch.arange(T, dtype=torch.float64)[:, None]
        j = torch.arange(C)
        freq = torch.pow(torch.tensor(10000.0, dtype=torch.float64), -(j - j % 2).double() / C)
        ang = t * freq[None, :]
        pos = torch.where(j % 2 == 0, torch.sin(ang), torch.cos(ang))
    x = tp["wte/embedding"][tok] + pos
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        p = "blocks/%d/" % i
        h = F.layer_norm(x, (C,), tp[p + "ln1/scale"], tp[p + "ln1/bias"], EPS)
        qkv = h @ tp[p + "attn/qkv/kernel"] + tp[p + "attn/qkv/bias"]      # (B, T, 3C)
        qkv = qkv.view(B, T, H, 3, D).permute(3, 0, 2, 1, 4)              # (3, B, H, T, D)
        q, k, v = qkv[0], qkv[1], qkv[2]
        s = (q @ k.transpose(-1, -2)) / np.sqrt(D)
        s = s.masked_fill(~mask, float("-inf"))
        y = torch.softmax(s, dim=-1) @ v                                   # (B, H, T, D)
        y = y.permute(0, 2, 1, 3).reshape(B, T, C)
        x = x + (y @ tp[p + "attn/out/kernel"] + tp[p + "attn/out/bias"])
        h = F.layer_norm(x, (C,), tp[p + "ln2/scale"], tp[p + "ln2/bias"], EPS)
        h = F.gelu(h @ tp[p + "mlp/fc1/kernel"] + tp[p + "mlp/fc1/bias"], approximate="tanh")
        x = x + (h @ tp[p + "mlp/fc2/kernel"] + tp[p + "mlp/fc2/bias"])
    x = F.layer_norm(x, (C,), tp["ln_f/scale"], tp["ln_f/bias"], EPS)
    if tied:
        logits = x @ tp["wte/embedding"].t()                               # (B, T, V)
    else:
        logits = x @ tp["lm_head/kernel"]
    loss = F.cross_entropy(logits.reshape(-1, V), torch.tensor(targets).reshape(-1))
    loss.backward()

    for k in sorted(params):
        w.add(name + "/param/" + k, params[k], "f32q")
    w.add(name + "/input/tokens", tokens, "i64")
    w.add(name + "/input/targets", targets, "i64")
    w.add(name + "/output/loss", loss.detach().numpy(), "f64")
    w.add(name + "/output/logits", logits.detach().numpy(), "f64")
    for k in sorted(params):
        w.add(name + "/grad/" + k, tp[k].grad.numpy(), "f64")


def main():
    rng = np.random.default_rng(SEED)
    w = Writer()
    mlp_case(rng, w)
    gpt_case(rng, w)
    gpt_case(rng, w, name="gpt_small", V=16, C=16, L=1, H=4, R=2, T=6, B=3, learned=False,
             tied=False)
    w.write(OUT)
    print("wrote", OUT, os.path.getsize(OUT), "bytes,", len(w.records), "tensors")


if __name__ == "__main__":
    main()
