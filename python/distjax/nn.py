"""Neural-network ops (distjax.nn.layer_norm, ...) and layers (distjax.nn.Dense, ...):
a layer's init(seed, x) gives its parameters as a dict, apply(params, x) its output."""

from . import (  # noqa: F401  (the package's, which take NumPy arrays too)
    softmax, log_softmax, layer_norm, rms_norm, embedding, cross_entropy, linear, gelu, relu,
    silu, sigmoid, tanh,
)
from ._distjax.layers import Dense, Embedding, LayerNorm, RMSNorm  # noqa: F401,E402
