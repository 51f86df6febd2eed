"""shard_map and the collectives from Python: against NumPy, against the same program in
C++ bit for bit, and a failing device stopping every device."""
import os
import subprocess
import time

import numpy as np
import pytest

import distjax as dj
from distjax import P


def test_collectives_against_numpy():
    mesh = dj.Mesh((2, 2), ("data", "model"))
    x = np.arange(16, dtype=np.float32).reshape(4, 4)

    def body(xl):
        i = dj.axis_index("model")
        total = dj.psum(dj.sum(xl), ("data", "model"))
        gathered = dj.all_gather_invariant(xl, "model", axis=1, tiled=True)
        scattered = dj.psum_scatter(xl, "data", axis=0, tiled=True)
        shifted = dj.ppermute(xl, "model", [(0, 1), (1, 0)])
        return total, gathered, scattered, shifted, dj.full([1], float(i))

    f = dj.shard_map(body, mesh, in_specs=P("data", "model"),
                     out_specs=(P(), P("data", None), P("data", "model"),
                                P("data", "model"), P("model")))
    total, gathered, scattered, shifted, index = f(x)
    assert total.gather().item() == x.sum()
    np.testing.assert_array_equal(gathered.gather().numpy(), x)
    halves = x.reshape(2, 2, 4)  # data blocks of 2 rows, summed over data, split again
    np.testing.assert_array_equal(scattered.gather().numpy(), halves[0] + halves[1])
    np.testing.assert_array_equal(shifted.gather().numpy(),
                                  np.concatenate([x[:, 2:], x[:, :2]], axis=1))
    assert index.gather().numpy().tolist() == [0.0, 1.0]


def values(n, mul, mod, shift, scale, shape):
    i = np.arange(n)
    return (((i * mul) % mod - shift) * scale).astype(np.float32).reshape(shape)


def test_program_matches_cpp_bitwise():
    program = os.environ.get("DISTJAX_REFERENCE_PROGRAM")
    if not program:
        pytest.skip("DISTJAX_REFERENCE_PROGRAM is not set (ctest sets it)")
    mesh = dj.Mesh((2, 2), ("data", "model"))
    x = values(48, 7, 13, 6, 1 / 8, (8, 6))
    w = values(24, 5, 11, 5, 1 / 16, (6, 4))

    def body(xl, wl):
        loss, g = dj.value_and_grad(lambda t: dj.mean(dj.square(dj.tanh(xl @ t))))(wl)
        grad = dj.pmean(g, "data")
        h = dj.psum(dj.sum(dj.tanh(xl @ wl), [1]), "model")
        everything = dj.all_gather_invariant(h, "data", axis=0, tiled=True)
        return grad, h, everything, dj.pmean(dj.pmean(loss, "data"), "model")

    f = dj.shard_map(body, mesh, in_specs=(P("data", None), P(None, "model")),
                     out_specs=(P(None, "model"), P("data"), P(), P()))
    ours = [float(v).hex() for out in f(x, w) for v in out.gather().numpy().ravel()]
    cpp = subprocess.run([program, "shard_map"], check=True, capture_output=True, text=True).stdout.split()
    assert len(ours) == len(cpp) == 24 + 8 + 8 + 1
    assert [float.fromhex(v) for v in ours] == [float.fromhex(v) for v in cpp]


def test_an_exception_on_one_device_stops_every_device():
    mesh = dj.Mesh((4,), ("data",))

    def body(xl):
        if dj.axis_index("data") == 2:
            raise ValueError("bad shard on purpose")
        return dj.psum(xl, "data")  # the other devices wait here for device 2

    start = time.monotonic()
    with pytest.raises(ValueError, match="bad shard on purpose") as e:
        dj.shard_map(body, mesh, in_specs=P("data"), out_specs=P(), timeout_s=20)(
            np.zeros(4, np.float32))
    assert time.monotonic() - start < 10  # stopped, not timed out
    assert any("device 2" in n for n in getattr(e.value, "__notes__", []))


def test_a_mismatch_between_devices_raises_on_every_device():
    mesh = dj.Mesh((2,), ("data",))

    def body(xl):
        n = 2 if dj.axis_index("data") == 0 else 3
        return dj.psum(dj.ones([n]), "data")

    with pytest.raises(dj.Error):
        dj.shard_map(body, mesh, in_specs=P("data"), out_specs=P(), timeout_s=20)(
            np.zeros(2, np.float32))

