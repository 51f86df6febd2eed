"""DistJax from Python: tensors shared with NumPy and DLPack without copies, the ops,
value_and_grad of Python functions of trees, meshes and shard_map with named-axis
collectives, and training from configs. See docs/python.md.

    import numpy as np, distjax as dj
    mesh = dj.Mesh((2,), ("data",))
    f = dj.shard_map(lambda x: dj.psum(dj.sum(x), "data"), mesh,
                     in_specs=dj.P("data"), out_specs=dj.P())
    f(np.arange(8, dtype=np.float32)).gather().item()   # 28.0
"""

from . import _distjax
from ._distjax import (  # noqa: F401  (the public names of the compiled part)
    Tensor, DType, Error, InvalidArgument, ShardingError, CommError, ConfigError,
    NotImplemented, IoError, Mesh, PartitionSpec, NamedSharding, ShardedArray, Config,
    device_put, load_config, builtin_config, builtin_configs, plan,
    add, sub, mul, div, maximum, where, neg, exp, log, sqrt, rsqrt, square, tanh, sigmoid,
    relu, silu, gelu, astype, matmul, linear, sum, mean, max, argmax, softmax, log_softmax,
    layer_norm, rms_norm, embedding, cross_entropy, reshape, transpose, permute, slice,
    concat, stack, split, broadcast_to, zeros, ones, full, arange, normal,
    psum, pmean, pmax, pvary, all_gather, all_gather_invariant, psum_scatter, all_to_all,
    ppermute, axis_index, axis_size, models, optim,
)
from ._arrays import asarray, from_dlpack, _accept_arrays  # noqa: F401
from ._autodiff import value_and_grad, grad, remat, no_grad  # noqa: F401
from ._tree import tree_flatten, tree_unflatten, tree_map  # noqa: F401
from ._spmd import shard_map  # noqa: F401
from ._train import train  # noqa: F401

# The ops take NumPy arrays and DLPack tensors where they take tensors (converted by asarray).
for _name in ("add", "sub", "mul", "div", "maximum", "where", "neg", "exp", "log", "sqrt",
              "rsqrt", "square", "tanh", "sigmoid", "relu", "silu", "gelu", "astype", "matmul",
              "linear", "sum", "mean", "max", "argmax", "softmax", "log_softmax",
              "layer_norm", "rms_norm", "embedding", "cross_entropy", "reshape", "transpose",
              "permute", "slice", "concat", "stack", "split", "broadcast_to"):
    globals()[_name] = _accept_arrays(globals()[_name])

P = PartitionSpec
float32, bfloat16, float16 = DType.float32, DType.bfloat16, DType.float16
int32, int64 = DType.int32, DType.int64

from . import nn, checkpoint, global_view  # noqa: E402,F401  (after the wrapping above)

__all__ = [n for n in dir() if not n.startswith("_")]
