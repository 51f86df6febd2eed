"""Checkpoints from Python: global NumPy arrays whatever mesh saved them."""

from . import _distjax


def load(path):
    """Every array of the checkpoint at `path` (a run's checkpoint directory or one step's)
    as a global NumPy array, by name: "params/<path>", "opt_state/<slot>/<path>". The
    blocks are checked against their checksums as a run's load does."""
    return {name: t.numpy() for name, t in _distjax._checkpoint_load(path).items()}


def inspect(path):
    """The index of the checkpoint at `path` as text (what `distjax ckpt inspect` prints)."""
    return _distjax._checkpoint_inspect(path)
