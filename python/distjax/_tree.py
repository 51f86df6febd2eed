"""Trees of tensors: dicts (keys in sorted order), lists and tuples nesting leaves.

The walks are module-level functions, not closures that call themselves: such a closure is
a reference cycle holding the leaves (the gradients of a step), which only the cyclic
garbage collector would free, long after the step."""


def _flatten(t, leaves):
    if isinstance(t, dict):
        keys = sorted(t)
        return ("dict", keys, [_flatten(t[k], leaves) for k in keys])
    if isinstance(t, (list, tuple)):
        return (type(t).__name__, None, [_flatten(x, leaves) for x in t])
    leaves.append(t)
    return ("leaf", None, None)


def _build(treedef, it):
    kind, keys, children = treedef
    if kind == "leaf":
        return next(it)
    built = [_build(c, it) for c in children]
    if kind == "dict":
        return dict(zip(keys, built))
    return tuple(built) if kind == "tuple" else built


def tree_flatten(tree):
    """(leaves, treedef): the leaves in order, and what tree_unflatten rebuilds from."""
    leaves = []
    treedef = _flatten(tree, leaves)
    return leaves, treedef


def tree_unflatten(treedef, leaves):
    return _build(treedef, iter(leaves))


def tree_map(fn, tree, *rest):
    leaves, treedef = tree_flatten(tree)
    others = [tree_flatten(r)[0] for r in rest]
    return tree_unflatten(treedef, [fn(*xs) for xs in zip(leaves, *others)])
