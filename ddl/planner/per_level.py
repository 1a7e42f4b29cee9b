"""Reduce-scatter, allgather and broadcast planned per level: an allreduce's two halves, run alone.

A reduce-scatter leaves part d of the result on rank d alone, so the shares of every level must follow the
parts. In a tree whose levels are even (every group of a level the same size, the usual cluster) a rank has
coordinates, its position in its group at each level, innermost first (c0, c1, ..., ctop). Laying the parts
out in *position order*, sorted by (c0, c1, ..., ctop), makes every level's share a run of whole parts: inside
a node, member i reduces the parts of every rank that is member i of its own node (c0 = i); one level up, the
members i of the nodes of a rack split those by c1, and so on, until at the top each rank holds its own part.
Slow links carry only data already reduced below them, each byte once; an allgather is the mirror. The caller
stages the buffer in position order (ddl.core.parts) and the programs here run on it.

Trees with uneven levels have no such order: their reduce-scatter and allgather run flat, a single level in
tree order. A small broadcast is a binomial tree over the ranks renumbered relative to the root's coordinates,
lowest digit the top's, so its first rounds cross the slowest links and each subtree receives the data once; a
large one is a pipelined chain through the subtrees in turn, so every link carries the data once each way.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..schedule.algorithms import binomial_tree
from ..schedule.ir import Op, Program, Step, number_tags
from ..topology.tree import depth, leaves, nested
from .model import effective_algorithm, level_rounds, scatter_choices
from .programs import scatter_gather


@dataclass(frozen=True)
class Grid:
    """Ranks as coordinates. ``sizes``: group size per level, innermost first; ``coords[r]``: rank r's position
    in its group at each level; ``order[k]``: the rank at position k (sorted by coordinates, innermost most
    significant). An uneven tree is one flat level in tree order, and ``spread`` is the order its broadcast
    numbers ranks in (ranks of different subtrees side by side); for an even one it is ``order``."""

    sizes: tuple[int, ...]
    coords: tuple[tuple[int, ...], ...]
    order: tuple[int, ...]
    spread: tuple[int, ...]

    @property
    def nranks(self) -> int:
        return len(self.order)

    @property
    def even(self) -> bool:
        return self.spread == self.order

    def weight(self, level: int) -> int:
        """Positions one step of coordinate ``level`` moves (the product of the sizes above it)."""
        w = 1
        for n in self.sizes[level + 1:]:
            w *= n
        return w

    def rank_at(self, coords: tuple[int, ...]) -> int:
        return self.order[sum(c * self.weight(lvl) for lvl, c in enumerate(coords))]


def grid_of(tree) -> Grid:
    """The grid of a normalized tree: its levels where they are even, else one flat level in tree order."""
    tree = nested(tree)
    d = depth(tree)
    coords: dict[int, tuple[int, ...]] = {}
    sizes: list[set] = [set() for _ in range(d)]

    def walk(t, level, above):
        sizes[level].add(len(t))
        for i, child in enumerate(t):
            if level == 0:
                coords[child] = (i,) + above
            else:
                walk(child, level - 1, (i,) + above)

    walk(tree, d - 1, ())
    p = len(coords)
    spread = tuple(sorted(range(p), key=lambda r: coords[r]))
    if all(len(s) == 1 for s in sizes):
        return Grid(tuple(s.pop() for s in sizes), tuple(coords[r] for r in range(p)), spread, spread)
    flat = leaves(tree)
    at = {r: k for k, r in enumerate(flat)}
    return Grid((p,), tuple((at[r],) for r in range(p)), tuple(flat), spread)


_UNUSED = -1 << 40


def scatter_program(rank: int, grid: Grid, algorithms: tuple[str, ...], bounds: list[int],
                    half: str) -> Program:
    """Rank ``rank``'s steps for a reduce-scatter (``half`` "reduce_scatter") or an allgather ("allgather")
    of a buffer in position order, whose part k (of the rank at position k) is bounds[k]..bounds[k + 1].
    ``algorithms``: per level, ring, rabenseifner (recursive halving/doubling) or direct."""
    sizes = grid.sizes
    rounds = [level_rounds(algorithms[lvl], n) for lvl, n in enumerate(sizes)]
    if half == "reduce_scatter":  # innermost level first
        starts = [sum(rounds[:lvl]) for lvl in range(len(sizes))]
    else:  # the mirror: the top first
        starts = [sum(rounds[lvl + 1:]) for lvl in range(len(sizes))]
    me = grid.coords[rank]
    out: list[Step] = []
    prefix = 0
    for lvl, n in enumerate(sizes):
        w = grid.weight(lvl)
        group = [grid.rank_at(me[:lvl] + (j,) + me[lvl + 1:]) for j in range(n)]
        level_bounds = [bounds[prefix + j * w] for j in range(n + 1)]
        steps: list[Step] = []  # (both halves come out; the other's rounds are negative and dropped)
        rs0, ag0 = (starts[lvl], _UNUSED) if half == "reduce_scatter" else (_UNUSED, starts[lvl])
        scatter_gather(me[lvl], group, level_bounds, effective_algorithm(algorithms[lvl], n), 0, rs0, ag0, lvl, steps)
        out.extend(s for s in steps if s.round >= 0)
        prefix += me[lvl] * w
    return Program(rank, number_tags(out), sum(rounds))


def scatter_algorithms(grid: Grid, plan_algorithms: tuple[str, ...], latency: bool) -> tuple[str, ...]:
    """Per level of ``grid``, the algorithm of the allreduce plan for the same bytes (its reduce-scatter half);
    the top's allreduce-only choices (recursive doubling, exchange: tiny vectors) become direct."""
    return scatter_choices(len(grid.sizes), plan_algorithms, latency)


def chain_order(grid: Grid, root: int) -> list[int]:
    """The ranks as a chain from ``root`` in which every subtree is one run (the root's own first): coordinates
    relative to the root's, the top's most significant, in an even grid; the tree order turned to start at the
    root otherwise."""
    if grid.even:
        base = grid.coords[root]
        return sorted(range(grid.nranks), key=lambda r: tuple(
            (grid.coords[r][lvl] - base[lvl]) % n for lvl, n in reversed(list(enumerate(grid.sizes)))))
    at = grid.order.index(root)
    return list(grid.order[at:] + grid.order[:at])


def chain_program(rank: int, grid: Grid, count: int, root: int) -> Program:
    """A pipelined chain broadcast: in round i the i-th rank of ``chain_order`` hands the block to the next.
    Every rank sends and receives the data at most once and every link between subtrees carries it once each
    way, so over many blocks it runs at the slowest link's bandwidth, where a binomial tree's root sends
    every block log2(p) times; p - 1 rounds of fill make it the choice for large broadcasts only."""
    chain = chain_order(grid, root)
    i = chain.index(rank)
    steps = []
    if i > 0:
        steps.append(Step(i - 1, Op.RECV_COPY, chain[i - 1], 0, count))
    if i + 1 < len(chain):
        steps.append(Step(i, Op.SEND, chain[i + 1], 0, count))
    return Program(rank, number_tags(steps), max(1, len(chain) - 1))


def broadcast_program(rank: int, grid: Grid, count: int, root: int) -> Program:
    """A binomial tree from ``root`` over the ranks numbered relative to the root: digit by digit (mod each
    level's size) in an even grid, by position otherwise; the top's digit lowest, so early rounds cross it."""
    p = grid.nranks
    if grid.even:
        base, mine = grid.coords[root], grid.coords[rank]
        vr = sum((mine[lvl] - base[lvl]) % n * grid.weight(lvl) for lvl, n in enumerate(grid.sizes))

        def real(v):
            return grid.rank_at(tuple((v // grid.weight(lvl) + base[lvl]) % n for lvl, n in enumerate(grid.sizes)))
    else:
        at = grid.spread.index(root)
        vr = (grid.spread.index(rank) - at) % p

        def real(v):
            return grid.spread[(v + at) % p]
    return binomial_tree(rank, vr, p, count, real)
