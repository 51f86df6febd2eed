#!/usr/bin/env python3
"""JAX reference for the tensor-parallel GPT train step (`tp_gpt_vs_jax_shard_map`).

The bench GPT of bench/reference/jax_train.py (4 layers, 4 heads, d 256, T 128, vocab
256, batch 16, pre-norm, LayerNorm eps 1e-5 with bias, fused qkv with bias, causal
attention, GELU (tanh) MLP 4x, learned positions, tied embedding; AdamW lr 3e-4, b1 0.9,
b2 0.95, eps 1e-8, weight decay 0.1 on every leaf; mean cross-entropy over all tokens)
trained with Megatron tensor parallelism written by hand with `shard_map` over a 1-D
mesh ("model",) of simulated CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count):

  qkv   column-parallel: kernel (C, 3C) and bias sharded on the columns. The columns
        are laid out (H, 3, D) as in DistJax's MultiHeadAttention (head h owns
        [3Dh, 3D(h+1)) = its q, k, v), so each device holds whole heads.
  out   row-parallel: kernel (C, C) sharded on the rows, psum over "model", then the
        replicated bias.
  fc1   column-parallel (kernel and bias), GELU on the local columns.
  fc2   row-parallel + psum, then the replicated bias.
  LayerNorms, token and position embeddings, final LayerNorm: replicated.
  LM head: replicated (every device computes the full tied logits x wte^T and the loss;
        no vocab parallelism).

The whole step (forward, backward, AdamW) runs inside one shard_map (check_vma=True,
so the transposes are Megatron's f/g operators: the backward of the implicit pvary at
the input of a column-parallel layer is a psum of dX, the backward of the forward psum
is free), under one jax.jit with the parameters and optimizer state donated. Every
device updates its own shards; replicated parameters get identical gradients on every
device (their computation only touches replicated values).

  --check   compares loss and gradients of the TP step with the unsharded model on
            one device (same parameters, same layout), first step, relative 1e-5.

Threads: by default (--threads-per-device 1) XLA_FLAGS gets
--xla_cpu_multi_thread_eigen=false, so each simulated device runs on one thread (the
measured process CPU seconds per wall second, recorded in the line, is ~0.93 with one
device and ~1.7-1.9 with two on a 2-core machine); --threads-per-device default leaves
XLA's CPU thread pool (all cores, shared by the devices) and adds `_threads_default` to
the line's name.

Output: one JSON line `jax_gpt_tp<N>_train_tokens_per_s` (tokens/s of the whole global
batch B x T, not per device) to stdout and to the file named by DISTJAX_BENCH_OUT (or
--out), with step_time_median_s, devices, mesh, version (jax), xla_flags.
Run inside the venv bench/run.sh creates: .venv-bench/bin/python bench/reference/jax_tp_gpt.py
"""
import argparse
import os
import sys


def _early_args():
    # XLA_FLAGS must be set before jax is imported, so parse these two first.
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--threads-per-device", default="1", choices=["1", "default"])
    a, _ = ap.parse_known_args()
    return a


_EARLY = _early_args()
_FLAGS = [f"--xla_force_host_platform_device_count={_EARLY.devices}"]
if _EARLY.threads_per_device == "1":
    # Eigen's intra-op thread pool off: each simulated device runs its ops (dots
    # included) on the one thread that executes its program. (The often quoted
    # `intra_op_parallelism_threads=1` is not an XLA flag; XLA's parser ignores the
    # word without "--" and rejects it with "--", so it is not set.)
    _FLAGS.append("--xla_cpu_multi_thread_eigen=false")
_PREV = os.environ.get("XLA_FLAGS", "").strip()
os.environ["XLA_FLAGS"] = " ".join(([_PREV] if _PREV else []) + _FLAGS)

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

try:
    shard_map = jax.shard_map  # jax >= 0.6
    _SHMAP_KW = {"check_vma": True}
except AttributeError:  # older jax
    from jax.experimental.shard_map import shard_map
    _SHMAP_KW = {"check_rep": True}

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jax_train import (GPT_CFG, adam_init, adamw_update, cross_entropy,  # noqa: E402
                       gpt_flops_per_step, gpt_init, layer_norm, time_steps)

AXIS = "model"
LR, B1, B2, EPS, WD = 3e-4, 0.9, 0.95, 1e-8, 0.1


# ------------------------------------------------------------------ model

def param_specs(params):
    """PartitionSpecs of the parameter tree: Megatron sharding over AXIS."""
    blk = {"ln1": {"scale": P(), "bias": P()}, "ln2": {"scale": P(), "bias": P()},
           "qkv": {"kernel": P(None, AXIS), "bias": P(AXIS)},
           "proj": {"kernel": P(AXIS, None), "bias": P()},
           "fc1": {"kernel": P(None, AXIS), "bias": P(AXIS)},
           "fc2": {"kernel": P(AXIS, None), "bias": P()}}
    return {"wte": P(), "wpe": P(), "ln_f": {"scale": P(), "bias": P()},
            "blocks": [blk for _ in params["blocks"]]}


def attention(qkv, heads, D):
    """qkv (B, T, heads*3*D) laid out (heads, 3, D) -> (B, T, heads*D), causal."""
    B, T, _ = qkv.shape
    qkv = qkv.reshape(B, T, heads, 3, D)
    q, k, v = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]  # (B, T, h, D)
    s = jnp.einsum("bthd,bshd->bhts", q, k) * (D ** -0.5)
    mask = jnp.tril(jnp.ones((T, T), bool))
    s = jnp.where(mask, s, -jnp.inf)
    a = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhts,bshd->bthd", a, v).reshape(B, T, heads * D)


def gpt_loss(p, inp, tgt, cfg, tp):
    """Mean CE of the GPT. tp=True: inside shard_map, p holds this device's shards
    and the row-parallel outputs are psum'd over AXIS; tp=False: the plain model."""
    B, T = inp.shape
    D = cfg["d"] // cfg["heads"]
    reduce = (lambda y: jax.lax.psum(y, AXIS)) if tp else (lambda y: y)
    x = p["wte"][inp] + p["wpe"][:T]
    for blk in p["blocks"]:
        qkv = layer_norm(blk["ln1"], x) @ blk["qkv"]["kernel"] + blk["qkv"]["bias"]
        local_heads = qkv.shape[-1] // (3 * D)
        y = attention(qkv, local_heads, D)
        x = x + reduce(y @ blk["proj"]["kernel"]) + blk["proj"]["bias"]
        h = layer_norm(blk["ln2"], x) @ blk["fc1"]["kernel"] + blk["fc1"]["bias"]
        h = jax.nn.gelu(h, approximate=True)
        x = x + reduce(h @ blk["fc2"]["kernel"]) + blk["fc2"]["bias"]
    x = layer_norm(p["ln_f"], x)
    return cross_entropy(x @ p["wte"].T, tgt)  # tied head, replicated


def make_tp_fns(mesh, specs, cfg):
    def local_grads(p, inp, tgt):
        return jax.value_and_grad(gpt_loss)(p, inp, tgt, cfg, True)

    def local_step(p, opt, inp, tgt):
        loss, g = local_grads(p, inp, tgt)
        p, opt = adamw_update(p, g, opt, LR, B1, B2, EPS, WD)
        return p, opt, loss

    opt_specs = {"m": specs, "v": specs, "t": P()}
    grads = shard_map(local_grads, mesh=mesh, in_specs=(specs, P(), P()),
                      out_specs=(P(), specs), **_SHMAP_KW)
    step = shard_map(local_step, mesh=mesh, in_specs=(specs, opt_specs, P(), P()),
                     out_specs=(specs, opt_specs, P()), **_SHMAP_KW)
    return jax.jit(grads), jax.jit(step, donate_argnums=(0, 1)), opt_specs


def setup(devices):
    cfg = GPT_CFG
    assert cfg["heads"] % devices == 0, "heads must divide over the devices"
    mesh = Mesh(np.array(jax.devices()[:devices]), (AXIS,))
    params = gpt_init(jax.random.PRNGKey(0), cfg)
    # Non-zero biases and LayerNorm parameters, so the check also sees their sharding.
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(2), len(leaves))
    leaves = [l + 0.02 * jax.random.normal(k, l.shape) if l.ndim == 1 else l
              for l, k in zip(leaves, keys)]
    params = jax.tree_util.tree_unflatten(tree, leaves)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (cfg["batch"], cfg["seq"] + 1), 0, cfg["vocab"])
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    specs = param_specs(params)
    return cfg, mesh, params, specs, inp, tgt


def place(tree, specs, mesh):
    return jax.tree_util.tree_map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)),
                                  tree, specs, is_leaf=lambda x: isinstance(x, P))


# ------------------------------------------------------------------ modes

def check(devices):
    cfg, mesh, params, specs, inp, tgt = setup(devices)
    dev0 = jax.devices()[0]
    ref_params = jax.device_put(params, dev0)
    ref_loss, ref_g = jax.jit(jax.value_and_grad(partial(gpt_loss, cfg=cfg, tp=False)))(
        ref_params, jax.device_put(inp, dev0), jax.device_put(tgt, dev0))
    grads_fn, step_fn, opt_specs = make_tp_fns(mesh, specs, cfg)
    p = place(params, specs, mesh)
    rep = NamedSharding(mesh, P())
    tp_loss, tp_g = grads_fn(p, jax.device_put(inp, rep), jax.device_put(tgt, rep))

    loss_rel = abs(float(tp_loss) - float(ref_loss)) / abs(float(ref_loss))
    worst, worst_path = 0.0, ""
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(tp_g), jax.tree_util.tree_leaves(ref_g)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        rel = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
        if rel > worst:
            worst, worst_path = rel, jax.tree_util.keystr(path)
    # One full donated train step as well: updated parameters vs the unsharded update.
    ref_p2, _ = adamw_update(ref_params, ref_g, adam_init(ref_params), LR, B1, B2, EPS, WD)
    p2, _, loss2 = step_fn(p, place(adam_init(params), opt_specs, mesh),
                           jax.device_put(inp, rep), jax.device_put(tgt, rep))
    pdiff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree_util.tree_leaves(p2), jax.tree_util.tree_leaves(ref_p2)))
    ok = bool(loss_rel <= 1e-5 and worst <= 1e-5)
    res = dict(name=f"jax_gpt_tp{devices}_check", ok=ok, devices=devices,
               loss_tp=float(tp_loss), loss_unsharded=float(ref_loss), loss_rel_diff=loss_rel,
               grad_max_rel_diff=float(worst), grad_worst_leaf=worst_path,
               step_loss=float(loss2), params_after_step_max_abs_diff=pdiff,
               note="grad rel diff = ||g_tp - g_ref|| / ||g_ref|| per leaf, max over leaves; "
                    "params after one AdamW step compared in absolute terms (lr 3e-4)",
               jax_version=jax.__version__, xla_flags=os.environ["XLA_FLAGS"])
    print(json.dumps(res), flush=True)
    return 0 if ok else 1


def bench(devices, seconds, out):
    cfg, mesh, params, specs, inp, tgt = setup(devices)
    _, step_fn, opt_specs = make_tp_fns(mesh, specs, cfg)
    rep = NamedSharding(mesh, P())
    inp, tgt = jax.device_put(inp, rep), jax.device_put(tgt, rep)
    state = {"p": place(params, specs, mesh), "o": place(adam_init(params), opt_specs, mesh), "loss": None}

    def step():
        state["p"], state["o"], state["loss"] = step_fn(state["p"], state["o"], inp, tgt)
        state["loss"].block_until_ready()

    t0 = time.perf_counter()
    step()
    compile_s = time.perf_counter() - t0
    c0, w0 = time.process_time(), time.perf_counter()
    times = time_steps(step, seconds, warmup=2, min_steps=4)
    cpu_per_wall = (time.process_time() - c0) / (time.perf_counter() - w0)
    med = statistics.median(times)
    flops, n = gpt_flops_per_step(cfg)
    n_actual = sum(x.size for x in jax.tree_util.tree_leaves(state["p"]))
    assert n_actual == n, (n_actual, n)
    ntok = cfg["batch"] * cfg["seq"]
    name = f"jax_gpt_tp{devices}_train_tokens_per_s"
    if _EARLY.threads_per_device != "1":
        name += "_threads_default"
    r = dict(name=name, value=ntok / med, unit="tokens/s",
             framework="jax", model="gpt", parallelism="tensor (Megatron, shard_map)",
             devices=devices, mesh={AXIS: devices}, lm_head="replicated",
             version=jax.__version__, backend=jax.default_backend(),
             xla_flags=os.environ["XLA_FLAGS"], threads_per_device=_EARLY.threads_per_device,
             threads_setting=("Eigen intra-op pool off (--xla_cpu_multi_thread_eigen=false): "
                              "one thread per simulated device" if _EARLY.threads_per_device == "1"
                              else "default (XLA CPU thread pool, all cores, shared by the devices)"),
             cpu_seconds_per_wall_second=cpu_per_wall, cpus=os.cpu_count(),
             step_time_median_s=med, step_time_min_s=min(times), steps=len(times), params=n,
             flops_per_step=flops, gflops=flops / med * 1e-9, compile_s=compile_s,
             loss_final=float(state["loss"]))
    if os.environ.get("DISTJAX_BENCH_ROUND"):
        r["round"] = int(os.environ["DISTJAX_BENCH_ROUND"])
    line = json.dumps(r)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=2, help="simulated CPU devices = model-axis size")
    ap.add_argument("--threads-per-device", default="1", choices=["1", "default"],
                    help="1: --xla_cpu_multi_thread_eigen=false (default); default: XLA's thread pool")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--check", action="store_true", help="compare with the unsharded model and exit")
    ap.add_argument("--out", default=os.environ.get("DISTJAX_BENCH_OUT", ""))
    args = ap.parse_args()
    if len(jax.devices()) < args.devices:
        sys.exit(f"only {len(jax.devices())} devices (XLA_FLAGS={os.environ['XLA_FLAGS']})")
    return check(args.devices) if args.check else bench(args.devices, args.seconds, args.out)


if __name__ == "__main__":
    sys.exit(main())
