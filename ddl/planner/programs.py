"""Every rank's own program for a chosen plan: the reduce-scatter per level innermost first, the allreduce among
the owners of each piece at the top, the allgathers in reverse (see ddl.planner.choice for the shape)."""
from __future__ import annotations

import bisect

from ..schedule.algorithms import ALLREDUCE, halving_doubling
from ..schedule.ir import shares, Op, Program, Step, number_tags
from ..topology.tree import Regular, leaves
from .model import Shape, effective_algorithm, latency_round_levels, level_rounds, top_rounds
from .choice import Plan


def program(rank: int, plan: Plan, count: int) -> Program:
    """Rank ``rank``'s steps for an allreduce of ``count`` elements under ``plan`` (for one block)."""
    tree = plan.tree
    if plan.shape == "latency":
        order = tree.ranks() if isinstance(tree, Regular) else leaves(tree)
        prog = ALLREDUCE["recursive_doubling"](order.index(rank), len(order), count)
        steps = [Step(s.round, s.op, order[s.peer], s.offset, s.count, level=0) for s in prog.steps]
        return Program(rank, number_tags(steps), prog.rounds)
    shape = Shape.of(tree)
    ctx = _Context(shape, plan.algorithms)
    out: list[Step] = []
    _rank_steps(rank, tree, 0, 0, count, ctx, out)
    return Program(rank, number_tags(out, ctx.width), ctx.total, ctx.width)


def round_phases(plan: Plan) -> list[tuple[int, str]]:
    """(level, phase) of every round of ``program``'s programs under ``plan``, the same on every rank: what
    the timeline and -dump_iter label the executor's round spans with."""
    shape = Shape.of(plan.tree)
    if plan.shape == "latency":
        return [(lvl, "recursive doubling") for lvl in latency_round_levels(shape)]
    ctx = _Context(shape, plan.algorithms)
    top = shape.depth - 1
    out: list[tuple[int, str]] = [(top, "allreduce")] * ctx.total
    for lvl in range(top):
        for r in range(ctx.rs_rounds[lvl]):
            out[ctx.rs_start[lvl] + r] = (lvl, "reduce-scatter")
            out[ctx.ag_start[lvl] + r] = (lvl, "allgather")
    return out


class _Context:
    """Round offsets of every phase, the same on every rank."""

    def __init__(self, shape: Shape, algorithms):
        self.shape, self.algorithms = shape, algorithms
        top = shape.depth - 1
        self.rs_rounds = [max(level_rounds(algorithms[lvl], g) for g in shape.sizes[lvl]) for lvl in range(top)]
        self.rs_start = [sum(self.rs_rounds[:lvl]) for lvl in range(top)]
        self.top_start = sum(self.rs_rounds)
        self.top_rounds = top_rounds(algorithms[top], shape.top())
        after = self.top_start + self.top_rounds
        self.ag_start = [after + sum(self.rs_rounds[lvl + 1:]) for lvl in range(top)]
        self.total = after + sum(self.rs_rounds)
        # Messages one pair may exchange in a round: one per segment both own; a share of a group of g is
        # cut by the other sizes' boundaries into at most 1 + sum(h // g + 1) segments.
        self.width = 1
        for lvl in range(top):
            s = shape.sizes[lvl]
            if len(s) > 1:
                self.width *= 1 + sum(h // min(s) + 1 for h in s)
        self._bounds: dict = {}

    def bounds(self, count: int, g: int) -> list[int]:
        key = (count, g)
        b = self._bounds.get(key)
        if b is None:
            if len(self._bounds) > 4096:
                self._bounds.clear()
            b = self._bounds[key] = shares(count, g)
        return b


def _rank_steps(me: int, tree, lvl: int, lo: int, count: int, ctx: _Context, out: list[Step]) -> None:
    if count == 0:
        return
    if lvl == ctx.shape.depth - 1:  # the top: the owners of this segment allreduce it
        prog = ALLREDUCE_AT_TOP[ctx.algorithms[lvl]](tree.index(me), len(tree), count)
        out.extend(Step(ctx.top_start + s.round, s.op, tree[s.peer], lo + s.offset, s.count, level=lvl)
                   for s in prog.steps)
        return
    group = _group_of(tree, me)
    g, i = len(group), group.index(me)
    bounds = ctx.bounds(count, g)
    algo = effective_algorithm(ctx.algorithms[lvl], g)
    scatter_gather(i, group, bounds, algo, lo, ctx.rs_start[lvl], ctx.ag_start[lvl], lvl, out)
    mine_lo, mine_hi = bounds[i], bounds[i + 1]
    if mine_hi == mine_lo:
        return
    cuts = {mine_lo, mine_hi}
    for h in ctx.shape.sizes[lvl]:
        cuts.update(b for b in ctx.bounds(count, h) if mine_lo < b < mine_hi)
    cuts = sorted(cuts)
    for a, b in zip(cuts, cuts[1:]):
        _rank_steps(me, _owners(tree, a, count, ctx), lvl + 1, lo + a, b - a, ctx, out)


def scatter_gather(i, group, bounds, algo, lo, rs0, ag0, lvl, out) -> None:
    """Reduce-scatter within the group so member i ends owning share i (bounds[i]..bounds[i+1]), at rounds
    from rs0; the mirror allgather at rounds from ag0."""
    g = len(group)

    def span(a, b):  # shares a..b-1 as (offset, count)
        return lo + bounds[a], bounds[b] - bounds[a]

    def add(rnd, op, peer, rng):
        if rng[1]:
            out.append(Step(rnd, op, group[peer], rng[0], rng[1], level=lvl))

    if g == 1:
        return
    if algo == "ring":
        right, left = (i + 1) % g, (i - 1) % g
        for k in range(g - 1):
            s, r = (i - k - 1) % g, (i - k - 2) % g
            add(rs0 + k, Op.SEND, right, span(s, s + 1))
            add(rs0 + k, Op.RECV_REDUCE, left, span(r, r + 1))
            s, r = (i - k) % g, (i - k - 1) % g
            add(ag0 + k, Op.SEND, right, span(s, s + 1))
            add(ag0 + k, Op.RECV_COPY, left, span(r, r + 1))
    elif algo == "direct":
        for j in range(g):
            if j != i:
                add(rs0, Op.SEND, j, span(j, j + 1))
                add(rs0, Op.RECV_REDUCE, j, span(i, i + 1))
                add(ag0, Op.SEND, j, span(i, i + 1))
                add(ag0, Op.RECV_COPY, j, span(j, j + 1))
    else:  # recursive halving, then doubling, over the shares
        for rnd, op, peer, a, b in halving_doubling(i, g, rs0, ag0):
            add(rnd, op, peer, span(a, b))


def _group_of(tree, me: int) -> list[int]:
    """The innermost group holding ``me`` (a walk down the branch that contains it)."""
    if isinstance(tree, Regular):
        return tree.group_of(me)
    stack = [tree]
    while stack:
        t = stack.pop()
        if isinstance(t[0], int):
            if me in t:
                return t
            continue
        stack.extend(t)
    raise ValueError(f"rank {me} is not in the tree")


def _owners(tree, offset: int, count: int, ctx: _Context):
    """The tree one level shallower: each innermost group replaced by its owner of ``offset``."""
    if isinstance(tree, Regular):  # every innermost group is alike: one member owns offset in all
        return tree.owners(bisect.bisect_right(ctx.bounds(count, tree.sizes[0]), offset) - 1)
    if isinstance(tree[0], int):
        b = ctx.bounds(count, len(tree))
        return tree[bisect.bisect_right(b, offset) - 1]
    return [_owners(t, offset, count, ctx) for t in tree]


def _direct_allreduce(rank: int, p: int, count: int) -> Program:
    out: list[Step] = []
    scatter_gather(rank, list(range(p)), shares(count, p), "direct", 0, 0, 1, 0, out)
    return Program(rank, number_tags(out), 2 if p > 1 else 0)


def _exchange_allreduce(rank: int, p: int, count: int) -> Program:
    """Latency-optimal for tiny vectors: one round, the whole vector to and from every other rank."""
    out = [Step(0, op, peer, 0, count) for peer in range(p) if peer != rank and count
           for op in (Op.SEND, Op.RECV_REDUCE)]
    return Program(rank, number_tags(out), 1 if p > 1 else 0)


ALLREDUCE_AT_TOP = {**ALLREDUCE, "direct": _direct_allreduce, "exchange": _exchange_allreduce}
