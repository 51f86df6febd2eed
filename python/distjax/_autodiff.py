"""value_and_grad, grad and remat of Python functions, over DistJax's tape."""

import contextlib
import functools

from . import _distjax
from ._arrays import asarray
from ._distjax import Tensor
from ._tree import tree_flatten, tree_unflatten

_FLOATING = {_distjax.DType.float32, _distjax.DType.bfloat16, _distjax.DType.float16}


@contextlib.contextmanager
def _grad_mode(on):
    prev = _distjax._grad_enabled()
    _distjax._set_grad_enabled(on)
    try:
        yield
    finally:
        _distjax._set_grad_enabled(prev)


def no_grad():
    """A context in which ops record nothing on the tape."""
    return _grad_mode(False)


def value_and_grad(fn, argnums=0, has_aux=False):
    """fn(*args) -> scalar loss (or (loss, aux) with has_aux) becomes a function returning
    (value, gradients): the gradients have the structure of args[argnums] (a tree of dicts,
    lists and tuples of tensors; a tuple of such trees for a tuple of argnums). Leaves the
    loss does not reach get zeros; integer leaves get None."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        args = list(args)
        flats = []
        for i in nums:
            leaves, treedef = tree_flatten(args[i])
            leaves = [asarray(x) for x in leaves]
            made = [_distjax._make_leaf(x) if x.dtype in _FLOATING else x for x in leaves]
            args[i] = tree_unflatten(treedef, made)
            flats.append((treedef, made))
        with _grad_mode(True):
            out = fn(*args, **kwargs)
        loss, aux = (out[0], out[1]) if has_aux else (out, None)
        if not isinstance(loss, Tensor) or loss.size != 1:
            raise _distjax.InvalidArgument(
                "[value_and_grad] the function must return a scalar Tensor"
                + (" (and aux)" if has_aux else "") + f", got {type(loss).__name__}"
                + (f" of shape {loss.shape}" if isinstance(loss, Tensor) else ""))
        wrt = [x for _, made in flats for x in made if x.dtype in _FLOATING]
        cotangents = iter(_distjax._grad([loss], [], wrt))
        grads = []
        for treedef, made in flats:
            g = [next(cotangents) if x.dtype in _FLOATING else None for x in made]
            grads.append(tree_unflatten(treedef, g))
        grads = grads[0] if single else tuple(grads)
        loss = loss.detach()
        return ((loss, aux) if has_aux else loss), grads

    return wrapped


def grad(fn, argnums=0, has_aux=False):
    """Like value_and_grad, returning the gradients only (and aux with has_aux)."""
    vg = value_and_grad(fn, argnums, has_aux)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapped


def remat(fn):
    """Rematerialisation: fn(*tensors) -> tensor(s) keeps none of its activations and runs
    again during the backward pass. Everything it differentiates by must be an argument."""

    @functools.wraps(fn)
    def wrapped(*args):
        xs = [asarray(a) for a in args]
        outs = _distjax._checkpoint(fn, xs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return wrapped
