#!/usr/bin/env python3
"""PyTorch reference for DistJax's training-throughput benchmark (bench/bench_train.cpp).

Same models, optimizers, shapes and timing method as the C++ benchmark (see
bench/README.md):
  mlp: 784-512-512-10, ReLU, batch 128, Adam(lr 1e-3, betas (0.9, 0.999), eps 1e-8),
       mean cross-entropy; examples/s.
  gpt: 4 layers, 4 heads, d 256, T 128, vocab 256, batch 16; pre-norm blocks
       (LayerNorm eps 1e-5 with bias), fused qkv Dense with bias, causal softmax
       attention, output Dense, MLP 256-1024-256 with GELU (tanh form), learned
       positions, tied input/output embedding, final LayerNorm, no dropout;
       AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every leaf),
       mean cross-entropy over all B*T tokens; tokens/s.
A step = forward + backward + optimizer update on a fixed synthetic batch (data loading
is not timed). Warm-up steps, then steps until --seconds, median step time.

Prints one JSON object per line (and appends them to --out if given).
Run with the system interpreter: /usr/bin/python3 bench/reference/torch_train.py
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp_flops_per_step(batch):
    params = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    return 6.0 * params * batch, params


def gpt_flops_per_step(cfg):
    """6 * matmul params * tokens + attention 12 L d T per token (PaLM's estimate; the
    same formula as models::Transformer::flops_per_token)."""
    d, L, V, T, B = cfg["d"], cfg["layers"], cfg["vocab"], cfg["seq"], cfg["batch"]
    per_layer = 2 * (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    params = V * d + T * d + L * per_layer + 2 * d
    tokens = B * T
    matmul_params = params - T * d  # the position table is a lookup, no FLOPs
    attn = 12.0 * L * T * d * tokens
    return 6.0 * matmul_params * tokens + attn, params


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, C = x.shape
        H, D = self.heads, C // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d"]
        self.wte = nn.Embedding(cfg["vocab"], d)
        self.wpe = nn.Embedding(cfg["seq"], d)
        self.blocks = nn.ModuleList([Block(d, cfg["heads"]) for _ in range(cfg["layers"])])
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        T = cfg["seq"]
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for blk in self.blocks:
            x = blk(x, self.mask)
        x = self.ln_f(x)
        return x @ self.wte.weight.t()  # tied output embedding


GPT_CFG = dict(layers=4, heads=4, d=256, seq=128, vocab=256, batch=16)


def time_steps(step, seconds, warmup=3, min_steps=5):
    for _ in range(warmup):
        step()
    times = []
    start = time.perf_counter()
    while len(times) < min_steps or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def bench_mlp(seconds):
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    x = torch.randn(128, 784)
    y = torch.randint(0, 10, (128,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    times = time_steps(step, seconds)
    med = statistics.median(times)
    flops, params = mlp_flops_per_step(128)
    return dict(model="mlp", value=128 / med, unit="examples/s", step_time_median_s=med,
                step_time_min_s=min(times), steps=len(times), params=params,
                flops_per_step=flops, gflops=flops / med * 1e-9,
                loss_final=float(step().item()))


def bench_gpt(seconds):
    torch.manual_seed(0)
    cfg = GPT_CFG
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1))
    inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(inp)
        loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]), tgt.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    times = time_steps(step, seconds, warmup=2, min_steps=4)
    med = statistics.median(times)
    flops, params = gpt_flops_per_step(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == params, (n_params, params)
    ntok = cfg["batch"] * cfg["seq"]
    return dict(model="gpt", value=ntok / med, unit="tokens/s", step_time_median_s=med,
                step_time_min_s=min(times), steps=len(times), params=params,
                flops_per_step=flops, gflops=flops / med * 1e-9,
                loss_final=float(step().item()))


def loaded_blas():
    """Resolved path of the BLAS library this process loaded (OpenBLAS, reference, ...)."""
    try:
        with open("/proc/self/maps") as f:
            for ln in f:
                if "blas" in ln.lower() and ".so" in ln:
                    return os.path.realpath(ln.split()[-1])
    except OSError:
        pass
    return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="all", choices=["all", "mlp", "gpt"])
    ap.add_argument("--threads", type=int, default=0, help="0 = PyTorch's default")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", default=os.environ.get("DISTJAX_BENCH_OUT", ""))
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    tag = "threads_default" if args.threads == 0 else f"threads_{threads}"
    models = ["mlp", "gpt"] if args.model == "all" else [args.model]
    for m in models:
        r = bench_mlp(args.seconds) if m == "mlp" else bench_gpt(args.seconds)
        unit_tag = "examples_per_s" if m == "mlp" else "tokens_per_s"
        r = dict(name=f"pytorch_{m}_train_{unit_tag}_{tag}", framework="pytorch",
                 version=torch.__version__, threads=threads, blas=loaded_blas(),
                 threads_setting="default" if args.threads == 0 else "set", **r)
        if os.environ.get("DISTJAX_BENCH_ROUND"):
            r["round"] = int(os.environ["DISTJAX_BENCH_ROUND"])
        line = json.dumps(r)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
