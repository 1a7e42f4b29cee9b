"""Decisions of the GPU path (pure): the groups of every level of the tree a device collective runs per level,
which of them run on NCCL, where each rank's data sits between the levels, and how a buffer is padded and
sharded.

A level j group holds the members that share their positions in every level but j: level 0's groups are the
tree's innermost lists (the GPUs of a node), level 1's the members at one position of the nodes under one leaf
switch, and so on. Member k of a level j group reduce-scatters block k of the group's data, so after the levels
0..m-1 a rank holds block f = k0 (g1 g2 ...) + k1 (g2 ...) + ... of the buffer (level 0 the most significant,
as reduce-scatters in place leave it). NCCL needs equal blocks, so only levels whose groups all have one size can
run on it: the NCCL levels are the innermost m regular ones; the levels above them run ddl's staged MPI plan
among the members that share a rank's whole position (its "outer" communicator, over the collapsed tree).
"""
from __future__ import annotations

import math

from ..errors import DDLError
from ..topology import tree as hierarchical


def innermost(tree) -> list[list[int]]:
    if all(isinstance(c, int) for c in tree):
        return [list(tree)]
    return [g for c in tree for g in innermost(c)]


def collapse(tree, position: int):
    """The tree with each innermost group replaced by its member at ``position`` (ranks kept)."""
    if all(isinstance(c, int) for c in tree):
        return tree[position]
    return [collapse(c, position) for c in tree]


def level_groups(tree) -> list[list[list[int]]]:
    """Every regular level's groups, innermost first: levels up to (not including) the first whose groups differ
    in size (or whose tree is not of one depth). A flat list is one level of one group."""
    if isinstance(tree, int):
        return []
    levels, trees = [], [tree]
    total = len(hierarchical.leaves(tree))
    while not any(isinstance(t, int) for t in trees):
        groups = [g for t in trees for g in innermost(t)]
        if len({len(g) for g in groups}) != 1 or sum(map(len, groups)) != total:
            break
        levels.append(groups)
        trees = [collapse(t, k) for t in trees for k in range(len(groups[0]))]
    return levels


def nccl_levels(setting: str, regular: int, chosen: int | None = None) -> int:
    """How many innermost levels run on NCCL, of the ``regular`` ones that can: DDL_NCCL_LEVELS "0" none, "all"
    every one, a number that many (at most the regular ones), "auto" the cost model's choice (``chosen``)."""
    if setting == "all":
        return regular
    if setting == "auto":
        return regular if chosen is None else min(chosen, regular)
    if setting.isdigit():
        return min(int(setting), regular)
    raise DDLError(f"DDL_NCCL_LEVELS={setting!r}: expected auto, all or a number of levels (0: every level over MPI)")


class Layout:
    """Where a device collective's data goes on one rank, with ``m`` NCCL levels of ``tree``: every NCCL level's
    groups, this rank's group and position in each, every rank's flat position, the members of each flat
    position (ascending: the outer communicator's rank order, MPI_Comm_split by rank) and the tree they reduce
    over above the NCCL levels."""

    def __init__(self, tree, m: int, rank: int):
        self.levels = level_groups(tree)[:m] if m else []
        ranks = sorted(hierarchical.leaves(tree))
        self.sizes = [len(lv[0]) for lv in self.levels]
        self.blocks = math.prod(self.sizes)  # blocks of a reduce-scatter through every NCCL level
        pos = {r: [0] * len(self.levels) for r in ranks}
        for j, groups in enumerate(self.levels):
            for g in groups:
                for k, r in enumerate(g):
                    pos[r][j] = k
        self.positions = {r: tuple(p) for r, p in pos.items()}
        self.flat = {r: self.flatten(p) for r, p in self.positions.items()}
        self.across: list[list[int]] = [[] for _ in range(self.blocks)]
        for r in ranks:
            self.across[self.flat[r]].append(r)
        self.rank = rank
        self.mine = [next(g for g in lv if rank in g) for lv in self.levels]
        self.position = self.positions[rank]
        outer = tree
        for k in self.position:
            outer = collapse(outer, k)
        order = {r: i for i, r in enumerate(self.across[self.flat[rank]])}
        self.outer_tree = [0] if isinstance(outer, int) else _renumber(outer, order)

    def flatten(self, position) -> int:
        f = 0
        for k, g in zip(position, self.sizes):
            f = f * g + k
        return f

    @property
    def outer_size(self) -> int:
        return len(self.across[self.flat[self.rank]])

    def spans(self, length: int, base: int = 0) -> list[tuple[int, int]]:
        """(start, length) of the data this rank holds before each NCCL level's reduce-scatter, and, last, after
        the innermost m: a buffer of ``length`` elements (a multiple of ``blocks``) at ``base``, narrowed in
        place level by level."""
        out = [(base, length)]
        for k, g in zip(self.position, self.sizes):
            length //= g
            base += k * length
            out.append((base, length))
        return out


def _renumber(t, order):
    return order[t] if isinstance(t, int) else [_renumber(c, order) for c in t]


def shard(count: int, group_size: int, member: int) -> tuple[int, int, int]:
    """(elements per member, padded length, valid elements of ``member``'s block) for a reduce-scatter of
    ``count`` elements: NCCL needs equal blocks, so the buffer is padded to a multiple of the group size and
    the padding is never staged or returned."""
    per = -(-count // group_size) if count else 0
    valid = max(0, min(count - member * per, per))
    return per, per * group_size, valid
