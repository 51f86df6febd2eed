#!/usr/bin/env python3
"""PyTorch reference for DistJax's MoE benchmark (bench/bench_moe.cpp runs it).

The MoE GPT of configs/gpt_moe.toml as bench_moe builds it: 4 layers, 4 heads, d 128, T 64,
vocab 256, batch 16; pre-norm blocks (LayerNorm eps 1e-5 with bias), fused qkv Linear with
bias, causal softmax attention, output Linear, learned positions, tied embeddings, final
LayerNorm, no dropout. Every block's MLP is a Mixture-of-Experts layer: a router
Linear(d, 8, no bias), softmax in f32, the top 2 experts per token (dropless), gates = the
chosen probabilities; experts stacked (8, d, 256) and (8, 256, d) with GELU (tanh form) and
no biases; the objective adds 0.01 x the Switch/GShard balancing loss and 0.001 x the router
z-loss. Eager dispatch as its users write it: the (token, slot) pairs sorted by expert (a
stable sort), one product per expert on its rows, the outputs added back with the gates
(index_add_). AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every leaf).
A step = forward + backward + update on a fixed batch; warm-up steps, then steps until
--seconds, median step time, on --threads intra-op threads (default: one and every core,
the faster reported). Prints one JSON object.
Run with the system interpreter: /usr/bin/python3 bench/reference/torch_moe.py
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

D, LAYERS, HEADS, T, V, B = 128, 4, 4, 64, 256, 16
E, K, H = 8, 2, 256
AUX, Z = 0.01, 0.001


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D, E, bias=False)
        self.w1 = nn.Parameter(torch.randn(E, D, H) / math.sqrt(D))
        self.w2 = nn.Parameter(torch.randn(E, H, D) / math.sqrt(H))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, D)
        n = x.shape[0]
        logits = self.router(x.float())
        probs = logits.softmax(-1)
        gates, experts = probs.topk(K, dim=-1)
        flat = experts.reshape(-1)
        order = torch.sort(flat, stable=True).indices
        tokens = order // K
        counts = torch.bincount(flat, minlength=E).tolist()
        y = torch.zeros_like(x)
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            rows = tokens[start:start + c]
            h = F.gelu(x[rows] @ self.w1[e], approximate="tanh") @ self.w2[e]
            y.index_add_(0, rows, h * gates.reshape(-1)[order[start:start + c]].unsqueeze(1))
            start += c
        f = torch.bincount(flat, minlength=E).float() / (n * K)
        aux = E * (f * probs.mean(0)).sum()
        z = torch.logsumexp(logits, -1).square().mean()
        return y.reshape(shape), AUX * aux + Z * z


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.moe = MoE()
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (z.view(b, t, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
        a = (q @ k.transpose(-2, -1)) / math.sqrt(D // HEADS)
        a = a.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1)
        x = x + self.out((a @ v).transpose(1, 2).reshape(b, t, D))
        m, extra = self.moe(self.ln2(x))
        return x + m, extra


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        nn.init.normal_(self.wte.weight, std=0.02)  # as DistJax's GPT (N(0, 1) by default)
        nn.init.normal_(self.wpe.weight, std=0.01)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        extra = 0.0
        for blk in self.blocks:
            x, e = blk(x)
            extra = extra + e
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)) + extra


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads; 0: one and every core, each for --seconds, and the "
                         "faster is reported (eager PyTorch's small ops can run slower on more)")
    args = ap.parse_args()
    counts = [args.threads] if args.threads > 0 else sorted({1, os.cpu_count() or 1})
    results = [run(n, args) for n in counts]
    best = max(results, key=lambda r: r["tokens_per_s"])
    best["by_threads"] = {r["threads"]: r["tokens_per_s"] for r in results}
    print(json.dumps(best))


def run(threads, args):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, V, (B, T), generator=g)
    y = torch.randint(0, V, (B, T), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < args.seconds:
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"name": "torch_moe_gpt", "tokens_per_s": B * T / med, "step_s": med,
            "steps": len(times), "loss": loss, "torch": torch.__version__,
            "threads": torch.get_num_threads()}


if __name__ == "__main__":
    main()
