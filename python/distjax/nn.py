"""Neural-network ops (distjax.nn.layer_norm, ...)."""

from . import (  # noqa: F401  (the package's, which take NumPy arrays too)
    softmax, log_softmax, layer_norm, rms_norm, embedding, cross_entropy, linear, gelu, relu,
    silu, sigmoid, tanh,
)
