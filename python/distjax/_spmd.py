"""shard_map of a Python function over a mesh, with trees of arrays in and out."""

from . import _distjax
from ._distjax import PartitionSpec
from ._tree import tree_flatten, tree_unflatten


def _leaf_specs(spec, n, what):
    """A PartitionSpec for every one of n leaves: one spec for a whole tree, or a tree of them."""
    if isinstance(spec, PartitionSpec):
        return [spec] * n
    specs, _ = tree_flatten(spec)
    if len(specs) != n or not all(isinstance(s, PartitionSpec) for s in specs):
        raise _distjax.InvalidArgument(
            f"[shard_map] {what}: {len(specs)} specs for {n} arrays; give one PartitionSpec "
            "for the whole tree or a tree of them with the tree's structure")
    return specs


def shard_map(f, mesh, in_specs, out_specs, *, timeout_s=30.0, check_replicated=False,
              intra_op_threads=0, backend="auto"):
    """JAX's shard_map: f(*local_shards) runs once per device of `mesh` (simulated devices
    are threads; the interpreter lock is released inside every op and collective), talking
    to other devices through psum, all_gather, ... by axis name.

    Arguments and results may be trees (dicts, lists, tuples) of arrays. `in_specs`: one
    entry per argument (a tuple; a bare PartitionSpec for a single argument), each a
    PartitionSpec for every leaf of that argument or a tree of them. `out_specs`: a
    PartitionSpec when f returns one array, else a tree of PartitionSpecs with the
    structure of f's result. The mapped function takes NumPy arrays, tensors or
    ShardedArrays and returns ShardedArrays in that structure. An exception on one device
    stops every device and is raised here, with a note naming the device.

    `backend`: "auto" runs the devices as threads, or, in a process started by mpirun or
    srun, one device per process over MPI (the same script; each process then holds its
    own device's shards, and gather() of a replicated result works everywhere); "threads"
    or "mpi" to choose."""
    arg_specs = (in_specs,) if isinstance(in_specs, PartitionSpec) else tuple(in_specs)
    out_leaf_specs, out_def = tree_flatten(out_specs)
    single = isinstance(out_specs, PartitionSpec)

    def mapped(*args):
        if len(args) != len(arg_specs):
            raise _distjax.InvalidArgument(
                f"[shard_map] {len(args)} arguments for {len(arg_specs)} in_specs")
        flat, defs, specs = [], [], []
        for i, (a, s) in enumerate(zip(args, arg_specs)):
            leaves, d = tree_flatten(a)
            flat += leaves
            defs.append((d, len(leaves)))
            specs += _leaf_specs(s, len(leaves), f"argument {i}")

        def body(*local):
            rebuilt, at = [], 0
            for d, n in defs:
                rebuilt.append(tree_unflatten(d, local[at:at + n]))
                at += n
            out = f(*rebuilt)
            leaves, _ = tree_flatten(out)
            if len(leaves) != len(out_leaf_specs):
                raise _distjax.InvalidArgument(
                    f"[shard_map] the function returned {len(leaves)} arrays for "
                    f"{len(out_leaf_specs)} out_specs")
            return leaves

        results = _distjax.shard_map(
            body, mesh, specs, out_specs if single else out_leaf_specs, timeout_s=timeout_s,
            check_replicated=check_replicated, intra_op_threads=intra_op_threads,
            backend=backend)(*flat)
        return results if single else tree_unflatten(out_def, list(results))

    return mapped
