"""The GPT and the optimizers from Python: a Python training loop over value_and_grad,
against the same loop in C++ bit for bit."""
import os
import subprocess

import numpy as np
import pytest

import distjax as dj


def gpt_loop():
    model = dj.models.Transformer(vocab=256, d_model=32, num_layers=2, num_heads=2, max_len=16)
    params = model.init(seed=0)
    adamw = dj.optim.AdamW(lr=1e-2, weight_decay=0.1)
    state = adamw.init(params)
    i = np.arange(64)
    tokens = ((i * 37) % 256).astype(np.int32).reshape(4, 16)
    targets = ((i * 37 + 37) % 256).astype(np.int32).reshape(4, 16)
    losses = []
    for step in range(3):
        loss, grads = dj.value_and_grad(
            lambda p: model.loss(p, tokens, targets, train=True, seed=step))(params)
        params, state = adamw.update(params, grads, state, step)
        losses.append(loss.item())
    return params, losses


def test_python_gpt_loop_matches_cpp_bitwise():
    program = os.environ.get("DISTJAX_REFERENCE_PROGRAM")
    if not program:
        pytest.skip("DISTJAX_REFERENCE_PROGRAM is not set (ctest sets it)")
    _, losses = gpt_loop()
    cpp = subprocess.run([program, "gpt"], check=True, capture_output=True, text=True).stdout
    assert [float(v).hex() for v in losses] == [float.fromhex(v).hex() for v in cpp.split()]
    assert losses[2] < losses[0]


def test_parameter_trees_are_nested_dicts():
    params, _ = gpt_loop()
    assert set(params) >= {"blocks", "wte", "wpe", "ln_f"}
    kernel = params["blocks"]["0"]["attn"]["qkv"]["kernel"]
    assert isinstance(kernel, dj.Tensor) and kernel.shape == (32, 96)
    model = dj.models.Transformer(vocab=256, d_model=32, num_layers=2, num_heads=2, max_len=16)
    logits = model.apply(params, np.zeros((1, 8), np.int32))
    assert logits.shape == (1, 8, 256)


def test_optimizers_follow_their_rules():
    p = {"w": dj.asarray(np.float32([1.0, -2.0]))}
    g = {"w": dj.asarray(np.float32([0.5, 0.5]))}
    sgd = dj.optim.SGD(lr=0.1)
    new, _ = sgd.update(p, g, sgd.init(p), 0)
    np.testing.assert_allclose(new["w"].numpy(), [0.95, -2.05], rtol=1e-6)
    schedule = dj.optim.warmup_cosine_schedule(0.0, 1.0, 10, 100)
    adam = dj.optim.Adam(lr=schedule)
    assert adam.learning_rate(10) == pytest.approx(1.0) and adam.learning_rate(0) == 0.0


def test_layers_init_apply_and_differentiate():
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    dense, norm = dj.nn.Dense(16), dj.nn.LayerNorm()
    params = {"fc": dense.init(0, x), "ln": norm.init(0, np.zeros((5, 16), np.float32))}
    assert params["fc"]["kernel"].shape == (8, 16) and params["fc"]["bias"].shape == (16,)
    assert dense.init(0, x)["kernel"].numpy().tolist() == params["fc"]["kernel"].numpy().tolist()

    def loss(p):
        return dj.mean(dj.square(norm(p["ln"], dense(p["fc"], x))))

    value, grads = dj.value_and_grad(loss)(params)
    kernel, bias = params["fc"]["kernel"].numpy(), params["fc"]["bias"].numpy()
    h = x @ kernel + bias
    ref = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    assert abs(value.item() - np.mean(ref ** 2)) < 1e-5
    assert grads["fc"]["kernel"].shape == (8, 16) and grads["ln"]["scale"].shape == (16,)
    table = dj.nn.Embedding(10, 4)
    emb = table.init(0, np.zeros(3, np.int32))
    np.testing.assert_array_equal(table(emb, np.int32([2, 2]))[0].numpy(),
                                  emb["embedding"].numpy()[2])
