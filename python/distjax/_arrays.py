"""Tensors to and from NumPy and DLPack without copies, and Tensor's Python methods."""

import numpy as _np

from . import _distjax
from ._distjax import Tensor

try:  # NumPy's bfloat16 (ml_dtypes): what a bf16 tensor is seen as
    from ml_dtypes import bfloat16 as _np_bfloat16
except ImportError:  # pragma: no cover - without it bf16 tensors read as uint16
    _np_bfloat16 = None


def from_dlpack(x):
    """A Tensor over the memory of `x` (any object with __dlpack__, or the buffer protocol),
    without a copy: the tensor keeps `x`'s buffer alive. CPU memory, C-contiguous."""
    if isinstance(x, Tensor):
        return x
    if _np_bfloat16 is not None and isinstance(x, _np.ndarray) and x.dtype == _np_bfloat16:
        return _distjax._from_object(x.view(_np.uint16), as_bf16=True)
    return _distjax._from_object(x)


def asarray(x, dtype=None):
    """A Tensor of `x`: a Tensor as it is; a NumPy array or DLPack tensor without a copy when
    it is contiguous and of a tensor dtype; Python numbers and lists through NumPy. Like
    JAX without x64, float64 becomes float32 (a copy). `dtype` converts (a copy)."""
    if not isinstance(x, Tensor):
        if not isinstance(x, _np.ndarray) and not hasattr(x, "__dlpack__"):
            x = _np.asarray(x)
        if isinstance(x, _np.ndarray):
            if x.dtype == _np.float64:
                x = x.astype(_np.float32)
            elif x.dtype == _np.bool_:
                x = x.astype(_np.float32)
            elif not x.flags.c_contiguous:
                x = _np.ascontiguousarray(x)
        x = from_dlpack(x)
    if dtype is not None and x.dtype != dtype:
        x = _distjax.astype(x, dtype)
    return x


def _accept_arrays(op):
    """`op` with its NumPy-array and DLPack arguments (also inside lists) made tensors."""
    def convert(a):
        if isinstance(a, _np.ndarray) or (hasattr(a, "__dlpack__") and not isinstance(a, Tensor)):
            return asarray(a)
        if isinstance(a, list) and a and not isinstance(a[0], (int, float)):
            return [convert(x) for x in a]
        return a

    def wrapped(*args, **kwargs):
        return op(*[convert(a) for a in args], **{k: convert(v) for k, v in kwargs.items()})

    wrapped.__name__ = op.__name__
    wrapped.__doc__ = op.__doc__
    wrapped.__wrapped__ = op
    return wrapped
