"""value_and_grad of Python functions of trees, against JAX on the same weights."""
import gc
import os

import numpy as np
import pytest

import distjax as dj

os.environ.setdefault("JAX_PLATFORMS", "cpu")
jax = pytest.importorskip("jax")
jnp = jax.numpy


def init(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "layers": [
            {"w": rng.standard_normal((6, 16)).astype(np.float32) * 0.4,
             "b": rng.standard_normal(16).astype(np.float32) * 0.1},
            {"w": rng.standard_normal((16, 3)).astype(np.float32) * 0.4,
             "b": rng.standard_normal(3).astype(np.float32) * 0.1},
        ],
        "scale": np.float32([1.5]),
    }


def mlp_dj(params, x, y):
    h = x
    for i, layer in enumerate(params["layers"]):
        h = dj.linear(h, layer["w"], layer["b"])
        if i == 0:
            h = dj.tanh(h)
    h = h * params["scale"]
    return dj.mean((h - y) ** 2)


def mlp_jax(params, x, y):
    h = x
    for i, layer in enumerate(params["layers"]):
        h = h @ layer["w"] + layer["b"]
        if i == 0:
            h = jnp.tanh(h)
    h = h * params["scale"]
    return jnp.mean((h - y) ** 2)


def relative_error(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)


def test_mlp_gradients_match_jax():
    params = init()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 6)).astype(np.float32)
    y = rng.standard_normal((32, 3)).astype(np.float32)
    tree = dj.tree_map(dj.asarray, params)
    loss, grads = dj.value_and_grad(mlp_dj)(tree, dj.asarray(x), dj.asarray(y))
    jloss, jgrads = jax.value_and_grad(mlp_jax)(params, x, y)
    assert relative_error(loss.item(), jloss) < 1e-6
    ours, _ = dj.tree_flatten(grads)
    theirs, _ = dj.tree_flatten(jgrads)
    assert len(ours) == len(theirs) == 5
    for g, jg in zip(ours, theirs):
        assert g.shape == jg.shape
        assert relative_error(g.numpy(), jg) < 1e-6


def test_argnums_aux_and_unused_leaves():
    def f(a, b):
        return dj.sum(a * b), {"norm": dj.sum(a)}
    a, b = dj.asarray(np.float32([1, 2, 3])), dj.asarray(np.float32([4, 5, 6]))
    (value, aux), (ga, gb) = dj.value_and_grad(f, argnums=(0, 1), has_aux=True)(a, b)
    assert value.item() == 32.0 and aux["norm"].item() == 6.0
    assert ga.numpy().tolist() == [4, 5, 6] and gb.numpy().tolist() == [1, 2, 3]
    g = dj.grad(lambda p: dj.sum(p["used"]))({"used": a, "unused": b})
    assert g["unused"].numpy().tolist() == [0, 0, 0]


def test_remat_gives_the_same_gradients():
    params = dj.tree_map(dj.asarray, init(3))
    x = dj.asarray(np.random.default_rng(2).standard_normal((8, 6)).astype(np.float32))

    def block(h, w, b):
        return dj.tanh(dj.linear(h, w, b))

    def loss(p, remat):
        layer = p["layers"][0]
        f = dj.remat(block) if remat else block
        return dj.sum(f(x, layer["w"], layer["b"]))

    plain = dj.grad(loss)(params, False)
    again = dj.grad(loss)(params, True)
    for g1, g2 in zip(dj.tree_flatten(plain)[0], dj.tree_flatten(again)[0]):
        np.testing.assert_array_equal(g1.numpy(), g2.numpy())


def test_a_step_frees_its_tensors_without_the_cycle_collector():
    # The gradients and leaves of a step go when its last reference does, as in C++: a
    # reference cycle holding them (a tree walk as a closure calling itself) left each
    # step's gradients to the cyclic collector, and the next steps to fresh memory.
    params = dj.tree_map(dj.asarray, init(4))
    x = dj.asarray(np.ones((8, 6), np.float32))
    y = dj.asarray(np.zeros((8, 3), np.float32))
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(2):
            loss, grads = dj.value_and_grad(mlp_dj)(params, x, y)
            params = dj.tree_map(lambda w, g: w - 0.1 * g, params, grads)
        del loss, grads
        gc.collect()
        held = [o for o in gc.garbage if isinstance(o, dj.Tensor)
                or (isinstance(o, (list, dict)) and any(isinstance(v, dj.Tensor) for v in
                                                          (o.values() if isinstance(o, dict) else o)))]
        assert not held, f"{len(held)} tensors or containers of them left to the cycle collector"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_a_non_scalar_loss_is_refused():
    with pytest.raises(dj.InvalidArgument, match="scalar"):
        dj.value_and_grad(lambda p: p * 2)(dj.ones([3]))
