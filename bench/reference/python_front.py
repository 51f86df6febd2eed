"""The Python side of bench/bench_python.cpp: the same small op and the same data-parallel
step on 2 simulated devices as the C++ side, timed from Python through the distjax module.
Prints one JSON line: {"add_s": seconds per call, "dp2_step_s": seconds per step,
"gpt_step_s": seconds per step of the GPT loop (value_and_grad, AdamW)}."""
import argparse
import json
import time

import numpy as np

import distjax as dj
from distjax import P


def per_call(fn, seconds, inner):
    for _ in range(3):
        fn()
    times, start = [], time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    args = ap.parse_args()

    a = dj.full([4], 1.0)
    b = dj.full([4], 2.0)
    add_s = per_call(lambda: dj.add(a, b), args.seconds, 2000)

    mesh = dj.Mesh((2,), ("data",))
    params = {"w1": dj.normal(1, [args.width, args.hidden], 0.05), "b1": dj.zeros([args.hidden]),
              "w2": dj.normal(2, [args.hidden, 10], 0.05), "b2": dj.zeros([10])}
    x = dj.normal(3, [args.batch, args.width], 1.0)
    y = dj.asarray((np.arange(args.batch) % 10).astype(np.int32))

    def loss_fn(p, x, y):
        h = dj.relu(dj.linear(x, p["w1"], p["b1"]))
        return dj.mean(dj.cross_entropy(dj.linear(h, p["w2"], p["b2"]), y))

    def train_step(p, x, y):
        loss, grads = dj.value_and_grad(loss_fn)(p, x, y)
        grads = dj.tree_map(lambda g: dj.pmean(g, "data"), grads)
        return dj.pmean(loss, "data"), dj.tree_map(lambda w, g: w - 0.1 * g, p, grads)

    step = dj.shard_map(train_step, mesh, in_specs=(P(), P("data"), P("data")),
                        out_specs=(P(), dj.tree_map(lambda _: P(), params)))
    dp2_step_s = per_call(lambda: step(params, x, y), args.seconds, 5)

    # The GPT of configs/train_gpt.toml trained by a Python loop (bench_python.cpp's C++ loop).
    model = dj.models.Transformer(vocab=256, d_model=128, num_layers=4, num_heads=4, max_len=64)
    gpt = {"params": model.init(seed=0), "step": 0}
    adamw = dj.optim.AdamW(lr=1e-3, weight_decay=0.1)
    gpt["state"] = adamw.init(gpt["params"])
    i = np.arange(8 * 64)
    tokens = ((i * 37) % 256).astype(np.int32).reshape(8, 64)
    targets = ((i * 37 + 37) % 256).astype(np.int32).reshape(8, 64)

    def gpt_step():
        loss, grads = dj.value_and_grad(lambda p: model.loss(p, tokens, targets))(gpt["params"])
        gpt["params"], gpt["state"] = adamw.update(gpt["params"], grads, gpt["state"], gpt["step"])
        gpt["step"] += 1
        return loss

    gpt_step_s = per_call(gpt_step, args.seconds, 3)
    print(json.dumps({"add_s": add_s, "dp2_step_s": dp2_step_s, "gpt_step_s": gpt_step_s}))


if __name__ == "__main__":
    main()
