#!/usr/bin/env python3
"""JAX (jit) reference for DistJax's training-throughput benchmark (bench/bench_train.cpp).

The same models, optimizers and timing as bench/reference/torch_train.py (see
bench/README.md); the whole train step (forward, backward, optimizer update) is one
jitted function with the parameters and optimizer state donated.
  mlp: 784-512-512-10, ReLU, batch 128, Adam(lr 1e-3, b1 0.9, b2 0.999, eps 1e-8).
  gpt: 4 layers, 4 heads, d 256, T 128, vocab 256, batch 16, pre-norm, GELU (tanh),
       learned positions, tied embedding, LayerNorm eps 1e-5, no dropout;
       AdamW(lr 3e-4, b1 0.9, b2 0.95, eps 1e-8, weight decay 0.1 on every leaf).
Run inside the venv bench/run.sh creates: .venv-bench/bin/python bench/reference/jax_train.py
"""
import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

GPT_CFG = dict(layers=4, heads=4, d=256, seq=128, vocab=256, batch=16)


def mlp_flops_per_step(batch):
    params = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    return 6.0 * params * batch, params


def gpt_flops_per_step(cfg):
    d, L, V, T, B = cfg["d"], cfg["layers"], cfg["vocab"], cfg["seq"], cfg["batch"]
    per_layer = 2 * (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    params = V * d + T * d + L * per_layer + 2 * d
    tokens = B * T
    matmul_params = params - T * d  # the position table is a lookup, no FLOPs
    return 6.0 * matmul_params * tokens + 12.0 * L * T * d * tokens, params


# ------------------------------------------------------------------ models

def dense_init(key, n_in, n_out, std=None):
    std = (1.0 / n_in) ** 0.5 if std is None else std
    return {"kernel": jax.random.normal(key, (n_in, n_out), jnp.float32) * std,
            "bias": jnp.zeros((n_out,), jnp.float32)}


def dense(p, x):
    return x @ p["kernel"] + p["bias"]


def mlp_init(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"fc1": dense_init(k1, 784, 512), "fc2": dense_init(k2, 512, 512),
            "fc3": dense_init(k3, 512, 10)}


def mlp_apply(p, x):
    h = jax.nn.relu(dense(p["fc1"], x))
    h = jax.nn.relu(dense(p["fc2"], h))
    return dense(p["fc3"], h)


def layer_norm(p, x, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def ln_init(d):
    return {"scale": jnp.ones((d,), jnp.float32), "bias": jnp.zeros((d,), jnp.float32)}


def gpt_init(key, cfg):
    d, L = cfg["d"], cfg["layers"]
    keys = jax.random.split(key, 2 + 4 * L)
    p = {"wte": jax.random.normal(keys[0], (cfg["vocab"], d)) * 0.02,
         "wpe": jax.random.normal(keys[1], (cfg["seq"], d)) * 0.02,
         "ln_f": ln_init(d), "blocks": []}
    for i in range(L):
        k = keys[2 + 4 * i: 6 + 4 * i]
        p["blocks"].append({"ln1": ln_init(d), "ln2": ln_init(d),
                            "qkv": dense_init(k[0], d, 3 * d, 0.02),
                            "proj": dense_init(k[1], d, d, 0.02),
                            "fc1": dense_init(k[2], d, 4 * d, 0.02),
                            "fc2": dense_init(k[3], 4 * d, d, 0.02)})
    return p


def gpt_apply(p, idx, cfg):
    B, T = idx.shape
    d, H = cfg["d"], cfg["heads"]
    D = d // H
    x = p["wte"][idx] + p["wpe"][:T]
    mask = jnp.tril(jnp.ones((T, T), bool))
    for blk in p["blocks"]:
        qkv = dense(blk["qkv"], layer_norm(blk["ln1"], x))
        q, k, v = jnp.split(qkv, 3, axis=-1)
        q = q.reshape(B, T, H, D).transpose(0, 2, 1, 3)
        k = k.reshape(B, T, H, D).transpose(0, 2, 1, 3)
        v = v.reshape(B, T, H, D).transpose(0, 2, 1, 3)
        s = jnp.einsum("bhtd,bhsd->bhts", q, k) * (D ** -0.5)
        s = jnp.where(mask, s, -jnp.inf)
        a = jax.nn.softmax(s, axis=-1)
        y = jnp.einsum("bhts,bhsd->bhtd", a, v).transpose(0, 2, 1, 3).reshape(B, T, d)
        x = x + dense(blk["proj"], y)
        h = jax.nn.gelu(dense(blk["fc1"], layer_norm(blk["ln2"], x)), approximate=True)
        x = x + dense(blk["fc2"], h)
    x = layer_norm(p["ln_f"], x)
    return x @ p["wte"].T  # tied output embedding


def cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


# ------------------------------------------------------------------ optimizers

def adam_init(params):
    z = jax.tree_util.tree_map(jnp.zeros_like, params)
    return {"m": z, "v": jax.tree_util.tree_map(jnp.zeros_like, params), "t": jnp.zeros((), jnp.int32)}


def adamw_update(params, grads, state, lr, b1, b2, eps, wd):
    t = state["t"] + 1
    tf = t.astype(jnp.float32)
    m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    c1 = 1 - b1 ** tf
    c2 = 1 - b2 ** tf

    def upd(p, m, v):
        p = p * (1 - lr * wd)
        return p - lr / c1 * m / (jnp.sqrt(v) / jnp.sqrt(c2) + eps)

    return jax.tree_util.tree_map(upd, params, m, v), {"m": m, "v": v, "t": t}


# ------------------------------------------------------------------ timing

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
    params = mlp_init(jax.random.PRNGKey(0))
    opt = adam_init(params)
    kx, ky = jax.random.split(jax.random.PRNGKey(1))
    x = jax.random.normal(kx, (128, 784))
    y = jax.random.randint(ky, (128,), 0, 10)

    def train_step(params, opt, x, y):
        loss, g = jax.value_and_grad(lambda p: cross_entropy(mlp_apply(p, x), y))(params)
        params, opt = adamw_update(params, g, opt, 1e-3, 0.9, 0.999, 1e-8, 0.0)
        return params, opt, loss

    train_step = jax.jit(train_step, donate_argnums=(0, 1))
    state = {"p": params, "o": opt, "loss": None}

    def step():
        state["p"], state["o"], state["loss"] = train_step(state["p"], state["o"], x, y)
        state["loss"].block_until_ready()

    t0 = time.perf_counter()
    step()
    compile_s = time.perf_counter() - t0
    times = time_steps(step, seconds)
    med = statistics.median(times)
    flops, n = mlp_flops_per_step(128)
    return dict(model="mlp", value=128 / med, unit="examples/s", step_time_median_s=med,
                step_time_min_s=min(times), steps=len(times), params=n, flops_per_step=flops,
                gflops=flops / med * 1e-9, compile_s=compile_s, loss_final=float(state["loss"]))


def bench_gpt(seconds):
    cfg = GPT_CFG
    params = gpt_init(jax.random.PRNGKey(0), cfg)
    opt = adam_init(params)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (cfg["batch"], cfg["seq"] + 1), 0, cfg["vocab"])
    inp, tgt = tokens[:, :-1], tokens[:, 1:]

    def train_step(params, opt, inp, tgt):
        loss, g = jax.value_and_grad(lambda p: cross_entropy(gpt_apply(p, inp, cfg), tgt))(params)
        params, opt = adamw_update(params, g, opt, 3e-4, 0.9, 0.95, 1e-8, 0.1)
        return params, opt, loss

    train_step = jax.jit(train_step, donate_argnums=(0, 1))
    state = {"p": params, "o": opt, "loss": None}

    def step():
        state["p"], state["o"], state["loss"] = train_step(state["p"], state["o"], inp, tgt)
        state["loss"].block_until_ready()

    t0 = time.perf_counter()
    step()
    compile_s = time.perf_counter() - t0
    times = time_steps(step, seconds, warmup=2, min_steps=4)
    med = statistics.median(times)
    flops, n = gpt_flops_per_step(cfg)
    n_actual = sum(x.size for x in jax.tree_util.tree_leaves(state["p"]))
    assert n_actual == n, (n_actual, n)
    ntok = cfg["batch"] * cfg["seq"]
    return dict(model="gpt", value=ntok / med, unit="tokens/s", step_time_median_s=med,
                step_time_min_s=min(times), steps=len(times), params=n, flops_per_step=flops,
                gflops=flops / med * 1e-9, compile_s=compile_s, loss_final=float(state["loss"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="all", choices=["all", "mlp", "gpt"])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", default=os.environ.get("DISTJAX_BENCH_OUT", ""))
    args = ap.parse_args()
    models = ["mlp", "gpt"] if args.model == "all" else [args.model]
    for m in models:
        r = bench_mlp(args.seconds) if m == "mlp" else bench_gpt(args.seconds)
        unit_tag = "examples_per_s" if m == "mlp" else "tokens_per_s"
        r = dict(name=f"jax_{m}_train_{unit_tag}_threads_default", framework="jax",
                 version=jax.__version__, backend=jax.default_backend(),
                 threads=os.cpu_count(), threads_setting="default (XLA CPU thread pool)", **r)
        if os.environ.get("DISTJAX_BENCH_ROUND"):
            r["round"] = int(os.environ["DISTJAX_BENCH_ROUND"])
        line = json.dumps(r)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
