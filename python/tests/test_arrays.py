"""Tensors shared with NumPy and DLPack without copies, dtypes, errors."""
import gc

import ml_dtypes
import numpy as np
import pytest

import distjax as dj


def test_numpy_to_tensor_shares_memory_and_keeps_it_alive():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = dj.asarray(a)
    assert t.data_ptr == a.ctypes.data
    assert t.shape == (3, 4) and t.dtype == dj.float32
    a[1, 2] = 100.0  # one memory: the tensor sees the write
    del a
    gc.collect()
    assert t.numpy()[1, 2] == 100.0
    assert dj.sum(t).item() == sum(range(12)) - 6 + 100


def test_tensor_to_numpy_shares_memory_and_keeps_it_alive():
    t = dj.arange(6, dj.int64)
    a = np.asarray(t)
    assert a.ctypes.data == t.data_ptr
    assert a.dtype == np.int64 and a.tolist() == list(range(6))
    ptr = t.data_ptr
    del t
    gc.collect()
    assert a.ctypes.data == ptr and a.tolist() == list(range(6))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64,
                                   ml_dtypes.bfloat16])
def test_every_dtype_round_trips(dtype):
    a = (np.arange(10) - 3).astype(dtype)
    t = dj.asarray(a)
    assert t.data_ptr == a.ctypes.data
    back = t.numpy()
    assert back.dtype == a.dtype
    assert back.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(back.view(np.uint8), a.view(np.uint8))


def test_bf16_is_bf16_to_the_ops():
    a = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)
    t = dj.asarray(a)
    assert t.dtype == dj.bfloat16
    np.testing.assert_array_equal(dj.astype(t, dj.float32).numpy(), [1.5, -2.25, 3.0])


def test_dlpack_both_ways_without_copies():
    a = np.linspace(0, 1, 8, dtype=np.float32)
    t = dj.from_dlpack(a)
    assert t.data_ptr == a.ctypes.data
    b = np.from_dlpack(t)
    assert b.ctypes.data == t.data_ptr
    assert t.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(b, a)


def test_float64_needs_a_conversion():
    with pytest.raises(dj.InvalidArgument, match="float64 have no tensor dtype"):
        dj.from_dlpack(np.zeros(3))
    t = dj.asarray(np.ones(3))  # like JAX without x64: float32, a copy
    assert t.dtype == dj.float32


def test_strided_arrays_come_in_as_a_contiguous_copy():
    a = np.arange(16, dtype=np.float32).reshape(4, 4)[:, ::2]
    t = dj.asarray(a)
    np.testing.assert_array_equal(t.numpy(), a)


def test_errors_are_named_python_exceptions_with_distjax_messages():
    x = dj.ones([2, 3])
    with pytest.raises(dj.InvalidArgument, match=r"\[matmul\]") as e:
        dj.matmul(x, x)
    assert isinstance(e.value, ValueError) and isinstance(e.value, dj.Error)
    with pytest.raises(dj.ShardingError, match="outside shard_map"):
        dj.psum(x, "data")


def test_ops_and_operators_match_numpy():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((5, 2)).astype(np.float32)
    ta, tb = dj.asarray(a), dj.asarray(b)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose((2.0 * ta - 1.0).numpy(), 2 * a - 1, rtol=1e-6)
    np.testing.assert_allclose((ta / 4).numpy(), a / 4, rtol=1e-6)
    np.testing.assert_allclose(dj.exp(ta).numpy(), np.exp(a), rtol=1e-6)
    np.testing.assert_allclose(dj.sum(ta, [1]).numpy(), a.sum(1), rtol=1e-5)
    s = dj.nn.softmax(ta).numpy()
    ref = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(s, ref / ref.sum(1, keepdims=True), rtol=1e-5)
    assert ta.T.shape == (5, 3) and ta.reshape(15).shape == (15,)


def test_indexing_by_integers_and_slices_is_differentiable():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = dj.asarray(a)
    np.testing.assert_array_equal(t[1].numpy(), a[1])
    np.testing.assert_array_equal(t[:, 1:3].numpy(), a[:, 1:3])
    np.testing.assert_array_equal(t[-1, 2:].numpy(), a[-1, 2:])
    assert t[2, 3].item() == a[2, 3]
    g = dj.grad(lambda x: dj.sum(x[1:3, -2:]))(t)
    expected = np.zeros_like(a)
    expected[1:3, -2:] = 1
    np.testing.assert_array_equal(g.numpy(), expected)
    with pytest.raises(dj.InvalidArgument, match="out of range"):
        t[4]
    with pytest.raises(dj.NotImplemented, match="step 2"):
        t[::2]
