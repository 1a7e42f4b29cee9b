"""Decisions of the GPU path (pure): which ranks form NCCL groups, the tree the members of every group reduce
over above them, and how a reduce-scatter pads and shards a buffer."""
from __future__ import annotations

from ..errors import DDLError
from ..topology import tree as hierarchical

def nccl_groups(tree, hosts: list[str] | None, levels: str = "auto") -> list[list[int]]:
    """The NCCL groups: the tree's innermost groups when each lies on one host (GPUs of one node) and all have
    the same size (every member k then has a partner k in every other group); otherwise, or with
    ``levels == "0"``, groups of one rank (every level over MPI)."""
    ranks = hierarchical.leaves(tree)
    singles = [[r] for r in sorted(ranks)]
    if levels == "0":
        return singles
    if levels != "auto":
        raise DDLError(f"DDL_NCCL_LEVELS={levels!r}: expected auto or 0")
    inner = _innermost(tree)
    on_one_host = hosts is None or all(len({hosts[r] for r in g}) == 1 for g in inner)
    if not on_one_host or len({len(g) for g in inner}) != 1:
        return singles
    return inner


def _innermost(tree) -> list[list[int]]:
    if all(isinstance(c, int) for c in tree):
        return [list(tree)]
    return [g for c in tree for g in _innermost(c)]


def cross_tree(tree, groups: list[list[int]], position: int):
    """The tree the members ``position`` of every group reduce over: each innermost group replaced by that
    member, ranks renumbered in rank order (the order MPI_Comm_split gives with key = rank)."""
    if all(len(g) == 1 for g in groups):
        return tree

    def collapse(t):
        return t[position] if all(isinstance(c, int) for c in t) else [collapse(c) for c in t]

    outer = collapse(tree)
    if isinstance(outer, int):  # one group: nothing above it
        return [0]
    order = {r: i for i, r in enumerate(sorted(hierarchical.leaves(outer)))}

    def renumber(t):
        return order[t] if isinstance(t, int) else [renumber(c) for c in t]

    return renumber(outer)


def shard(count: int, group_size: int, member: int) -> tuple[int, int, int]:
    """(elements per member, padded length, valid elements of ``member``'s block) for a reduce-scatter of
    ``count`` elements: NCCL needs equal blocks, so the buffer is padded to a multiple of the group size and
    the padding is never staged or returned."""
    per = -(-count // group_size) if count else 0
    valid = max(0, min(count - member * per, per))
    return per, per * group_size, valid
