"""The documents' training loop in Python: a mesh, shardings, a data-parallel train step
under shard_map (gradients averaged with pmean), and the loop. Run: python train_loop.py"""
import numpy as np

import distjax as dj
from distjax import P

mesh = dj.Mesh((2,), ("data",))  # two simulated devices
rng = np.random.default_rng(0)
x_all = rng.standard_normal((1024, 16)).astype(np.float32)
teacher = rng.standard_normal((16, 4)).astype(np.float32)
y_all = np.argmax(x_all @ teacher, axis=1).astype(np.int32)  # labels to learn

params = {"w1": dj.normal(1, [16, 64], 0.25), "b1": dj.zeros([64]),
          "w2": dj.normal(2, [64, 4], 0.125), "b2": dj.zeros([4])}
replicated = dj.tree_map(lambda _: P(), params)


def loss_fn(p, x, y):
    h = dj.relu(dj.linear(x, p["w1"], p["b1"]))
    return dj.mean(dj.cross_entropy(dj.linear(h, p["w2"], p["b2"]), y))


def train_step(p, x, y):  # on every device: its half of the batch
    loss, grads = dj.value_and_grad(loss_fn)(p, x, y)
    grads = dj.tree_map(lambda g: dj.pmean(g, "data"), grads)
    new = dj.tree_map(lambda w, g: w - 0.5 * g, p, grads)
    return dj.pmean(loss, "data"), new


step = dj.shard_map(train_step, mesh, in_specs=(P(), P("data"), P("data")),
                    out_specs=(P(), replicated))
for i in range(101):
    batch = rng.integers(0, len(x_all), 64)
    loss, sharded = step(params, x_all[batch], y_all[batch])
    params = dj.tree_map(lambda a: a.gather(), sharded)  # replicated: any shard will do
    if i % 25 == 0:
        print(f"step {i:3d}  loss {loss.gather().item():.4f}")

logits = dj.linear(dj.relu(dj.linear(x_all, params["w1"], params["b1"])), params["w2"],
                   params["b2"])
accuracy = np.mean(np.argmax(logits.numpy(), axis=1) == y_all)
print(f"accuracy {accuracy:.3f} on {len(x_all)} examples")
