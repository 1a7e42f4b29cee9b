"""Hierarchical allreduce over a tree of ranks: reduce-scatter inside the innermost groups, allreduce the
pieces among their owners one level up (recursively), then allgather inside the groups (IBM DDL, BlueConnect).
Slow outer links carry only data already reduced inside the groups below them.

A hierarchy is a nested list whose leaves are ranks, innermost groups deepest: two nodes of three ranks are
``[[0, 1, 2], [3, 4, 5]]``; uneven nodes ``[[0, 1, 2], [3, 4], [5]]``; ranks placed round-robin
``[[0, 2, 4], [1, 3, 5]]``; racks of nodes ``[[[0, 1], [2, 3]], [[4, 5], [6]]]``. The plan follows the tree,
not the rank numbers.

Terms. At one level the range is cut into C *columns*, C = the largest innermost group anywhere in the tree;
a group of g ranks gives column c to its rank c mod g, the column's *owner* (a small group's ranks own
several columns, so uneven groups need no special case). Replacing every innermost group by its owner of
column c gives a tree one level shallower, over which column c is allreduced; at the top the owners form a
flat ring. Every column's inner allreduce runs in the same rounds, side by side.
"""
from __future__ import annotations

from .algorithms import ring_allreduce, split
from .schedule import Op, Program, Step, number_tags

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


def from_hosts(host_of_rank: list[int]) -> list | None:
    """Two levels from each rank's host: the ranks of each host, hosts in order of their first rank."""
    hosts: dict[int, list[int]] = {}
    for r, h in enumerate(host_of_rank):
        hosts.setdefault(h, []).append(r)
    return normalize(list(hosts.values())) if len(hosts) > 1 else None


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


def _innermost(tree) -> list[list[int]]:
    """The groups of ranks at the bottom of a normalized tree."""
    if all(isinstance(t, int) for t in tree):
        return [tree]
    return [g for t in tree for g in _innermost(t)]


def _owners(tree, column: int):
    """The tree with each innermost group replaced by its owner of ``column``."""
    if all(isinstance(t, int) for t in tree):
        return tree[column % len(tree)]
    return [_owners(t, column) for t in tree]


def columns(tree) -> int:
    return max(len(g) for g in _innermost(tree))


def rounds(tree) -> int:
    """Rounds of the whole allreduce; the same for every rank and every column."""
    if isinstance(tree, int):
        return 0
    if all(isinstance(t, int) for t in tree):
        return 2 * (len(tree) - 1)
    return 2 + rounds(_owners(tree, 0))


def width(tree) -> int:
    """Messages one pair may exchange in one round: a rank owning several columns talks to the same peer once
    per column, at every level below the top."""
    if isinstance(tree, int) or all(isinstance(t, int) for t in tree):
        return 1
    return columns(tree) * width(_owners(tree, 0))


def _steps(me: int, tree, lo: int, count: int, r0: int, level: int, out: list[Step]) -> None:
    if isinstance(tree, int):
        return
    if all(isinstance(t, int) for t in tree):  # the top: a flat ring among these ranks
        if me in tree and len(tree) > 1:
            for s in ring_allreduce(tree.index(me), len(tree), count).steps:
                out.append(Step(r0 + s.round, s.op, tree[s.peer], lo + s.offset, s.count, level=level))
        return
    ncols = columns(tree)
    cols = split(count, ncols)
    group = next(g for g in _innermost(tree) if me in g)
    inner = rounds(_owners(tree, 0))
    for c, (off, n) in enumerate(cols):
        if n == 0:
            continue
        owner = group[c % len(group)]
        if me == owner:
            for peer in group:
                if peer != me:  # reduce-scatter: the column arrives from every other member
                    out.append(Step(r0, Op.RECV_REDUCE, peer, lo + off, n, level=level))
                    out.append(Step(r0 + 1 + inner, Op.SEND, peer, lo + off, n, level=level))
            _steps(me, _owners(tree, c), lo + off, n, r0 + 1, level + 1, out)
        else:
            out.append(Step(r0, Op.SEND, owner, lo + off, n, level=level))
            out.append(Step(r0 + 1 + inner, Op.RECV_COPY, owner, lo + off, n, level=level))


def hierarchical_allreduce(rank: int, tree, count: int) -> Program:
    """Rank ``rank``'s program for an allreduce of ``count`` elements over the normalized ``tree``."""
    out: list[Step] = []
    _steps(rank, tree, 0, count, 0, 0, out)
    w = width(tree)
    return Program(rank, number_tags(out, w), rounds(tree), w)
