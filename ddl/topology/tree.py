"""Trees of ranks: the shape a hierarchical allreduce follows (ddl.planner plans over them).

A hierarchy is a nested list whose leaves are ranks, innermost groups deepest: two nodes of three ranks are
``[[0, 1, 2], [3, 4, 5]]``; uneven nodes ``[[0, 1, 2], [3, 4], [5]]``; ranks placed round-robin
``[[0, 2, 4], [1, 3, 5]]``; racks of nodes ``[[[0, 1], [2, 3]], [[4, 5], [6]]]``. Trees come from a topology
(ddl.topology), from IBM's -mode dims, from the hosts MPI reports, or from the user.
"""
from __future__ import annotations

Tree = "int | list[Tree]"


def depth(tree) -> int:
    return 0 if isinstance(tree, int) else 1 + max((depth(t) for t in tree), default=0)


def normalize(tree) -> list:
    """Checks the tree, drops levels that do not branch (a group of one group), and pads it so every rank
    sits at the same depth (a lone rank beside groups becomes a group of one). Raises ValueError naming what
    is wrong."""
    if isinstance(tree, int) or not tree:
        raise ValueError("a hierarchy is a non-empty list of groups or ranks")
    ranks = leaves(tree)
    if sorted(ranks) != list(range(len(ranks))):
        missing = sorted(set(range(len(ranks))) - set(ranks))
        raise ValueError(f"a hierarchy must hold ranks 0..{len(ranks) - 1} once each "
                         f"(missing {missing[:5]}, repeated {sorted({r for r in ranks if ranks.count(r) > 1})[:5]})")

    def pad(t, d):
        if isinstance(t, int):
            return t if d == 0 else pad([t], d)
        if d == 0 or not t:
            raise ValueError(f"empty group in the hierarchy: {t!r}")
        return [pad(c, d - 1) for c in t]

    def simplify(t):
        if isinstance(t, int):
            return t
        kids = [simplify(c) for c in t]
        return kids[0] if len(kids) == 1 else kids

    def check_groups(t):
        if isinstance(t, list):
            if not t:
                raise ValueError("empty group in the hierarchy")
            for c in t:
                check_groups(c)

    check_groups(tree)
    tree = simplify(tree)
    if isinstance(tree, int):
        return [tree]
    return pad(tree, depth(tree))


def from_dims(dims: tuple[int, ...]) -> list:
    """IBM DDL's tiers, innermost first (ranks per node x nodes per rack x ...), over consecutive ranks."""
    tree: list = list(range(_product(dims)))
    for d in dims:
        tree = [tree[i:i + d] for i in range(0, len(tree), d)]
    return normalize(tree[0] if len(tree) == 1 else tree)


def _product(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def describe(tree) -> str:
    """A short, stable text of a tree (for call hashes and plan keys)."""
    return repr(tree).replace(" ", "")


def leaves(tree) -> list[int]:
    if isinstance(tree, int):
        return [tree]
    return [r for t in tree for r in leaves(t)]
