"""Trees of ranks: the shape a hierarchical allreduce follows (ddl.planner plans over them).

A hierarchy is a nested list whose leaves are ranks, innermost groups deepest: two nodes of three ranks are
``[[0, 1, 2], [3, 4, 5]]``; uneven nodes ``[[0, 1, 2], [3, 4], [5]]``; ranks placed round-robin
``[[0, 2, 4], [1, 3, 5]]``; racks of nodes ``[[[0, 1], [2, 3]], [[4, 5], [6]]]``. Trees come from a topology
(ddl.topology), from IBM's -mode dims, from the hosts MPI reports, or from the user.
"""
from __future__ import annotations

from dataclasses import dataclass

Tree = "int | list[Tree] | Regular"


@dataclass(frozen=True)
class Regular:
    """A normalized tree every level of which has groups of one size, its leaves the ranks ``base``,
    ``base + stride``, ... in tree order: what a machine of identical nodes under regular switches gives, kept
    as its sizes so that planning never walks every rank (Summit's 27,648). ``sizes``: innermost first, each at
    least 2. The planner reads it arithmetically; ``nested()`` is the same tree as nested lists."""

    sizes: tuple[int, ...]
    base: int = 0
    stride: int = 1

    def __post_init__(self):
        if not self.sizes or min(self.sizes) < 2:
            raise ValueError(f"a regular tree needs levels of at least 2: {self.sizes}")

    @property
    def nranks(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    def ranks(self) -> range:
        """The leaves in tree order (a range: indexable and searchable without a list of every rank)."""
        return range(self.base, self.base + self.stride * self.nranks, self.stride)

    def group_of(self, rank: int) -> list[int]:
        """The innermost group holding ``rank``."""
        g = self.sizes[0]
        first = (rank - self.base) // self.stride // g * g
        return [self.base + self.stride * (first + i) for i in range(g)]

    def owners(self, member: int) -> "Regular | list[int]":
        """The tree one level shallower: each innermost group replaced by its member ``member``."""
        base = self.base + self.stride * member
        if len(self.sizes) == 1:
            return [base]
        return Regular(self.sizes[1:], base, self.stride * self.sizes[0])

    # A one-level tree is read as the list of its ranks
    def __len__(self) -> int:
        return self.sizes[-1]

    def index(self, rank: int) -> int:
        return self.ranks().index(rank)

    def __getitem__(self, k: int):
        if len(self.sizes) != 1:
            return self.nested()[k]
        return self.ranks()[k]

    def __eq__(self, other) -> bool:  # equal to the nested lists of the same tree
        if isinstance(other, Regular):
            return (self.sizes, self.base, self.stride) == (other.sizes, other.base, other.stride)
        return isinstance(other, list) and self.nested() == other

    def nested(self) -> list:
        tree: list = list(self.ranks())
        for g in self.sizes[:-1]:
            tree = [tree[i:i + g] for i in range(0, len(tree), g)]
        return tree


def nested(tree):
    """The tree as nested lists (a Regular expanded; anything else as it is)."""
    return tree.nested() if isinstance(tree, Regular) else tree


def depth(tree) -> int:
    if isinstance(tree, Regular):
        return len(tree.sizes)
    return 0 if isinstance(tree, int) else 1 + max((depth(t) for t in tree), default=0)


def normalize(tree) -> list:
    """Checks the tree, drops levels that do not branch (a group of one group), and pads it so every rank
    sits at the same depth (a lone rank beside groups becomes a group of one). Raises ValueError naming what
    is wrong."""
    if isinstance(tree, Regular):
        return tree
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
    return repr(nested(tree)).replace(" ", "")  # one text for one tree, however it is held


def leaves(tree) -> list[int]:
    if isinstance(tree, Regular):
        return list(tree.ranks())
    if isinstance(tree, int):
        return [tree]
    return [r for t in tree for r in leaves(t)]
