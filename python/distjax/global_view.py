"""The global view (automatic mode): write the single-device program on GlobalArrays,
annotate shardings, and every op's propagation rule inserts the communication. See
docs/global-view.md (the C++ guide) and docs/python.md."""

from ._distjax import PartitionSpec, axis_index
from ._distjax.global_view import (  # noqa: F401
    GlobalArray, GlobalSharding, from_local, from_host, matmul, relu, tanh, exp, log, square,
    silu, neg, gelu, add, sub, mul, div, sum, mean, softmax, log_softmax, layer_norm, rms_norm,
    embedding, cross_entropy, reshape, transpose, permute, slice, concat, reshard,
    with_sharding_constraint, replicate, reshard_bytes, value_and_grad,
)
from ._distjax import global_view as _gv
from ._spmd import shard_map
from ._tree import tree_flatten, tree_unflatten


def _leaf_specs(tree, spec):
    leaves, _ = tree_flatten(tree)
    if isinstance(spec, PartitionSpec):
        return [spec] * len(leaves)
    return tree_flatten(spec)[0]


def global_map(f, mesh, in_specs, out_specs, *, plan=False, **options):
    """JAX's jit(f, in_shardings, out_shardings): f sees its arguments (trees of arrays) as
    GlobalArrays laid out by `in_specs` and returns GlobalArrays, which are resharded to
    `out_specs` (partial sums resolved). Returns ShardedArrays in f's result structure; with
    plan=True, (result, plan) where plan is device 0's communication plan as text (every
    collective the rules inserted, forward and backward, with its bytes). `options` go to
    shard_map (timeout_s, backend, ...)."""
    arg_specs = (in_specs,) if isinstance(in_specs, PartitionSpec) else tuple(in_specs)
    recorded = []

    def body(*locals_):
        arrays = []
        for a, spec in zip(locals_, arg_specs):
            leaves, treedef = tree_flatten(a)
            arrays.append(tree_unflatten(
                treedef, [from_local(x, s) for x, s in zip(leaves, _leaf_specs(a, spec))]))

        def run():
            out = f(*arrays)
            leaves, treedef = tree_flatten(out)
            specs = _leaf_specs(out, out_specs)
            return tree_unflatten(treedef, [_gv._output(x, s) for x, s in zip(leaves, specs)])

        first = all(axis_index(name) == 0 for name in mesh.axis_names)
        if plan and first:
            out, text = _gv._record_plan(run)
            recorded.append(text)
            return out
        return run()

    mapped = shard_map(body, mesh, in_specs, out_specs, **options)

    def call(*args):
        result = mapped(*args)
        return (result, recorded.pop()) if plan else result

    return call


__all__ = [n for n in dir() if not n.startswith("_")]
