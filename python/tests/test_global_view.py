"""The global view from Python: ops pick their shardings and insert the collectives; the
gradients of a tensor-and-data-parallel MLP against one device; the communication plan."""
import re

import numpy as np

import distjax as dj
from distjax import P
from distjax import global_view as gv

MESH = dj.Mesh((2, 2), ("data", "model"))
RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 16)).astype(np.float32)
W1 = (RNG.standard_normal((16, 32)) * 0.3).astype(np.float32)
W2 = (RNG.standard_normal((32, 4)) * 0.3).astype(np.float32)
Y = (np.arange(8) % 4).astype(np.int32)


def test_column_then_row_parallel_products():
    seen = {}

    def f(x, w1, w2):
        h = gv.relu(x @ w1)  # P("data", "model"): no communication
        seen["h"] = repr(h.sharding)
        out = h @ w2  # partial over "model" until resharded
        seen["out"] = repr(out.sharding)
        return out

    out = gv.global_map(f, MESH, in_specs=(P("data", None), P(None, "model"), P("model", None)),
                        out_specs=P("data", None))(X, W1, W2)
    np.testing.assert_allclose(out.gather().numpy(), np.maximum(X @ W1, 0) @ W2, rtol=1e-5,
                               atol=1e-5)
    assert seen["h"] == 'P("data", "model")'
    assert seen["out"] == 'P("data") partial("model")'


def test_value_and_grad_matches_one_device_and_the_plan_names_the_collectives():
    def loss_fn(p, x, y):
        h = dj.relu(x @ p["w1"])
        return dj.mean(dj.cross_entropy(h @ p["w2"], y))

    ref_loss, ref = dj.value_and_grad(loss_fn)({"w1": W1, "w2": W2}, X, Y)

    def step(w1, w2, x, y):
        def loss(p):
            h = gv.relu(gv.matmul(x, p["w1"]))
            return gv.mean(gv.cross_entropy(gv.matmul(h, p["w2"]), y))
        value, grads = gv.value_and_grad(loss, {"w1": w1, "w2": w2})
        return value, grads["w1"], grads["w2"]

    specs = (P(None, "model"), P("model", None), P("data", None), P("data"))
    (loss, g1, g2), plan = gv.global_map(step, MESH, in_specs=specs,
                                         out_specs=(P(), P(None, "model"), P("model", None)),
                                         plan=True)(W1, W2, X, Y)
    assert abs(loss.gather().item() - ref_loss.item()) < 1e-6 * abs(ref_loss.item())
    for ours, theirs in ((g1, ref["w1"]), (g2, ref["w2"])):
        scale = np.abs(theirs.numpy()).max()
        assert np.abs(ours.gather().numpy() - theirs.numpy()).max() < 1e-6 * scale
    # The row-parallel product's partial sum is resolved over "model"; the weights'
    # gradients are summed over "data" in the backward pass.
    assert re.search(r"forward\s+cross_entropy\s+all_reduce\s+model", plan), plan
    assert len(re.findall(r"backward\s+matmul\s+all_reduce\s+data", plan)) == 2, plan


def test_reshard_moves_a_block_and_counts_its_bytes():
    def f(x):
        y = gv.reshard(x, P(None, "model"))
        f.bytes = gv.reshard_bytes(x, P())
        return y

    out = gv.global_map(f, MESH, in_specs=P("data", None), out_specs=P(None, "model"))(X)
    np.testing.assert_array_equal(out.gather().numpy(), X)
    assert f.bytes > 0
