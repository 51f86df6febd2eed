"""Trees of tensors: dicts (keys in sorted order), lists and tuples nesting leaves."""


def tree_flatten(tree):
    """(leaves, treedef): the leaves in order, and what tree_unflatten rebuilds from."""
    leaves = []

    def walk(t):
        if isinstance(t, dict):
            keys = sorted(t)
            return ("dict", keys, [walk(t[k]) for k in keys])
        if isinstance(t, (list, tuple)):
            return (type(t).__name__, None, [walk(x) for x in t])
        leaves.append(t)
        return ("leaf", None, None)

    return leaves, walk(tree)


def tree_unflatten(treedef, leaves):
    it = iter(leaves)

    def build(d):
        kind, keys, children = d
        if kind == "leaf":
            return next(it)
        built = [build(c) for c in children]
        if kind == "dict":
            return dict(zip(keys, built))
        return tuple(built) if kind == "tuple" else built

    return build(treedef)


def tree_map(fn, tree, *rest):
    leaves, treedef = tree_flatten(tree)
    others = [tree_flatten(r)[0] for r in rest]
    return tree_unflatten(treedef, [fn(*xs) for xs in zip(leaves, *others)])
