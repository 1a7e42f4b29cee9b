"""The hierarchical planner: from a tree of ranks and the cost of each level, an allreduce plan.

Shape (IBM DDL, BlueConnect): reduce-scatter inside the innermost groups, then inside the groups one level up
among the ranks that own the same piece, and so on; at the top the owners of each piece allreduce it; then
allgathers in reverse. Slow outer links carry only data already reduced below them.

Pieces. A group of g ranks splits its range into g near-equal shares, member i owning share i. Groups of
different sizes split the same range differently, so one level up the range is cut at every group's share
boundaries (*segments*): inside a segment every group has exactly one owner, and those owners form the tree
one level shallower over which the segment continues. Uneven groups (3, 2 and 1 ranks) therefore need no
special case and every member carries its 1/g, and the plan follows the tree, not the rank numbers.

Per level an algorithm: ``ring`` (g-1 rounds each way), ``rabenseifner`` (recursive halving, then doubling;
groups of a power of two, others fall back to ring), ``direct`` (one round each way, g-1 messages); the top
level allreduces with ring, rabenseifner, recursive_doubling, direct, or ``exchange`` (one round: the whole
vector to every other owner, for tiny messages). Each is priced by the alpha-beta-gamma
model with the level's links (ddl.topology.LevelCost); the cheapest wins per level. For tiny messages the
``latency`` shape competes: one recursive doubling over all ranks in tree order (lg p rounds).

Levels are pipelined: the buffer is cut into blocks and the executor keeps one block in flight per phase, so
block b is reduced across nodes while block b+1 is still inside them and the time approaches the slowest
level's rather than the sum. Every rank builds only its own program; what all ranks must agree on (the tree,
the algorithms, the block size) is a pure function of the tree, the levels and the size.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from . import links
from .algorithms import ALLREDUCE, halving_doubling
from .hierarchical import depth, leaves, normalize
from .schedule import Op, Program, Step, number_tags
from .topology import LevelCost, default_level

LEVEL_ALGORITHMS = ("ring", "rabenseifner", "direct")
TOP_ALGORITHMS = ("ring", "rabenseifner", "recursive_doubling", "direct", "exchange")
MIN_BLOCK_BYTES = 64 << 10  # smaller blocks measured slower on TCP links (per-message costs the model lacks)
MAX_BLOCKS = 256


def _pof2(g: int) -> bool:
    return g & (g - 1) == 0


def _effective(algo: str, g: int) -> str:
    return "ring" if algo == "rabenseifner" and not _pof2(g) else algo


def _lg(g: int) -> int:
    return g.bit_length() - 1


# -- the shape of a tree ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What the plan needs to know about a normalized tree, per level (innermost first; the last is the top)."""

    depth: int
    sizes: tuple[tuple[int, ...], ...]   # distinct group sizes per level
    under: tuple[int, ...]               # fewest ranks under one child of a group, per level
    groups: tuple[int, ...]              # groups per level
    nranks: int

    @classmethod
    def of(cls, tree) -> "Shape":
        d = depth(tree)
        sizes: list[set] = [set() for _ in range(d)]
        under = [math.inf] * d
        groups = [0] * d

        def walk(t, level):  # returns the number of ranks under t
            sizes[level].add(len(t))
            groups[level] += 1
            n = [1] * len(t) if level == 0 else [walk(c, level - 1) for c in t]
            under[level] = min(under[level], min(n))
            return sum(n)

        total = walk(tree, d - 1)
        return cls(d, tuple(tuple(sorted(s)) for s in sizes), tuple(int(u) for u in under), tuple(groups), total)

    def top(self) -> int:
        return self.sizes[-1][0]


def level_rounds(algo: str, g: int) -> int:
    """Rounds of one reduce-scatter (or one allgather) among g ranks."""
    if g == 1:
        return 0
    return {"ring": g - 1, "rabenseifner": _lg(g), "direct": 1}[_effective(algo, g)]


def top_rounds(algo: str, g: int) -> int:
    if g == 1:
        return 0
    fold = 2 if not _pof2(g) else 0
    return {"ring": 2 * (g - 1), "rabenseifner": 2 * _lg(g) + fold, "recursive_doubling": _lg(g) + fold,
            "direct": 2, "exchange": 1}[algo]


# -- plans: what every rank agrees on ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A plan's decisions: ``shape`` "hierarchical" (algorithms per level, innermost first, last the top)
    or "latency" (one recursive doubling over the ranks in tree order)."""

    tree: list = field(hash=False, compare=False)
    levels: tuple[LevelCost, ...]
    algorithms: tuple[str, ...]
    shape: str
    block_bytes: int
    inflight: int

    def to_dict(self) -> dict:
        return dict(tree=self.tree, levels=[lv.to_dict() for lv in self.levels],
                    algorithms=list(self.algorithms), shape=self.shape, block_bytes=self.block_bytes,
                    inflight=self.inflight)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        """A plan read back (a dump); checked, since it will be run as it is."""
        tree = normalize(d["tree"])
        plan = cls(tree, tuple(LevelCost(**lv) for lv in d["levels"]), tuple(d["algorithms"]), d["shape"],
                   int(d["block_bytes"]), int(d["inflight"]))
        top = depth(tree) - 1
        if len(plan.levels) != top + 1 or len(plan.algorithms) != top + 1:
            raise ValueError(f"the tree has {top + 1} levels; the plan prices {len(plan.levels)} and names "
                             f"{len(plan.algorithms)} algorithms")
        if plan.shape not in ("hierarchical", "latency") or plan.block_bytes < 1 or plan.inflight < 1:
            raise ValueError("shape must be hierarchical or latency, block_bytes and inflight at least 1")
        for lvl, a in enumerate(plan.algorithms):
            if plan.shape == "hierarchical" and a not in (TOP_ALGORITHMS if lvl == top else LEVEL_ALGORITHMS):
                raise ValueError(f"algorithm {a!r} cannot run level {lvl}")
        return plan


def label(plan: Plan) -> str:
    """A short name for logs: the flat algorithm, or the algorithms per level."""
    if plan.shape == "latency":
        return "recursive_doubling (tree order)" if len(plan.algorithms) > 1 else "recursive_doubling"
    return plan.algorithms[0] if len(plan.algorithms) == 1 else "hierarchical(" + ",".join(plan.algorithms) + ")"


def default_levels(tree, names: tuple[str, ...] = (), link: str = "shm") -> tuple[LevelCost, ...]:
    """Nominal levels for a tree given without a topology: innermost shared memory, then ``link``."""
    s = Shape.of(tree)
    return tuple(default_level(names[i] if i < len(names) else f"level{i}", "shm" if i == 0 else link)
                 for i in range(s.depth))


def _root_up(p: int, r: int) -> int:
    """The least k with k**r >= p."""
    k = max(1, int(round(p ** (1 / r))))
    while k ** r < p:
        k += 1
    while k > 1 and (k - 1) ** r >= p:
        k -= 1
    return k


def _entities(s: Shape, level: int) -> int:
    return s.groups[level - 1] if level else s.nranks


# -- the cost model ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    level: int
    what: str            # "reduce-scatter", "allreduce", "allgather", "recursive doubling"
    algorithm: str
    rounds: int
    seconds: float       # for the whole buffer, unpipelined
    latency: float       # the part every block pays whole
    link_bytes: float    # bytes one child of a group sends over the level's links
    compute: float = 0.0  # seconds of reducing, per rank


def phases(shape: Shape, levels, algorithms, nbytes: float) -> list[Phase]:
    """The plan's phases in order with their predicted cost (alpha-beta-gamma per level; see module doc).
    At level l a child of a group (a rank, a socket, a node) holds the whole vector spread over its ranks and
    moves it through its links at the level's bandwidth; each rank reduces its own part."""
    top = shape.depth - 1
    rs, last = [], None
    for lvl in range(shape.depth):
        c, g, algo = levels[lvl], max(shape.sizes[lvl]), algorithms[lvl]
        m = nbytes / shape.under[lvl]  # bytes per rank entering this level
        if lvl < top:
            r = max(level_rounds(algo, h) for h in shape.sizes[lvl])
            extra = (g - 1 - r) if algo == "direct" else 0  # further messages posted in a direct round
            lat = r * c.alpha + extra * links.SOFTWARE_OVERHEAD
            sent = (g - 1) / g * nbytes
            red = (g - 1) / g * m * c.gamma
            rs.append(Phase(lvl, "reduce-scatter", algo, r, lat + sent / c.bandwidth + red, lat, sent, red))
            continue
        r = top_rounds(algo, g)
        extra = {"direct": 2 * (g - 2), "exchange": g - 2}.get(algo, 0) if g > 1 else 0
        lat = r * c.alpha + extra * links.SOFTWARE_OVERHEAD
        fold = 1.0 if not _pof2(g) and algo in ("rabenseifner", "recursive_doubling") else 0.0
        if algo == "recursive_doubling":
            sent, red = (_lg(g) + 2 * fold) * nbytes, (_lg(g) + fold) * m
        elif algo == "exchange":
            sent, red = (g - 1) * nbytes, (g - 1) * m
        else:
            sent, red = (2 * (g - 1) / g + 2 * fold) * nbytes, ((g - 1) / g + fold) * m
        last = Phase(lvl, "allreduce", algo, r, lat + sent / c.bandwidth + red * c.gamma, lat, sent, red * c.gamma)
    # An allgather moves what its reduce-scatter moved and reduces nothing.
    ag = [Phase(p.level, "allgather", p.algorithm, p.rounds, p.latency + p.link_bytes / levels[p.level].bandwidth,
                p.latency, p.link_bytes) for p in reversed(rs)]
    return rs + [last] + ag


def latency_phases(shape: Shape, levels, nbytes: float) -> list[Phase]:
    """Recursive doubling over all ranks in tree order: the round that pairs ranks within blocks of k
    consecutive ranks crosses the lowest level whose groups hold k ranks; every rank below a child of that
    level sends the whole vector through the child's links at once."""
    p = shape.nranks
    holds = [shape.under[lvl] * min(shape.sizes[lvl]) for lvl in range(shape.depth)]
    reach = [2 ** (i + 1) for i in range(_lg(p))]
    if not _pof2(p):
        reach = [2] + reach + [2]
    out: list[Phase] = []
    for k in reach:  # consecutive rounds on one level make one phase
        lvl = next((j for j in range(shape.depth) if k <= holds[j]), shape.depth - 1)
        c = levels[lvl]
        sent = nbytes * shape.under[lvl]
        red = nbytes * c.gamma
        ph = Phase(lvl, "recursive doubling", "recursive_doubling", 1, c.alpha + sent / c.bandwidth + red,
                   c.alpha, nbytes, red)
        if out and out[-1].level == lvl:
            q = out.pop()
            ph = Phase(lvl, q.what, q.algorithm, q.rounds + 1, q.seconds + ph.seconds, q.latency + ph.latency,
                       q.link_bytes + ph.link_bytes, q.compute + ph.compute)
        out.append(ph)
    return out


def link_bytes(shape: Shape, levels, ph: list[Phase]) -> list[float]:
    """Bytes one child at each level sends over that level's links for the whole buffer. A phase loads its
    own level's links and, where a lower level talks through uplinks (a node's NICs), those too: a rack's
    traffic leaves through the NICs of its nodes, each carrying its share."""
    sent = [0.0] * shape.depth
    for p in ph:
        for k in range(p.level + 1):
            if k == p.level or levels[k].via == "uplink":
                share = shape.under[p.level] / shape.under[k]  # level-k children inside one level-l child
                sent[k] += p.link_bytes / share
    return sent


def link_seconds(shape: Shape, levels, ph: list[Phase]) -> list[float]:
    """Seconds each resource is busy: every level's links, and for a level of peer links (NVLink between
    sockets' GPUs) also the child's other links (its uplink), which carry the outer levels' traffic."""
    busy = [b / lv.bandwidth for b, lv in zip(link_bytes(shape, levels, ph), levels)]
    for k, lv in enumerate(levels):
        other = lv.escape - lv.bandwidth
        if lv.via == "peer" and other > 0:
            outer = sum(p.link_bytes * shape.under[k] / shape.under[p.level] for p in ph if p.level > k)
            busy.append(outer / other)
    return busy


def pipelined(ph: list[Phase], blocks: int, busy: list[float] = ()) -> float:
    """Blocks flow through the phases like a pipeline: one block's trip through every stage, then one more
    block per step of the busiest resource: a level's links (shared by its reduce-scatter, its allgather and
    the outer levels' traffic), a rank's reducing (overlapped with the wires by the executor), or the
    longest latency of a stage. Latency does not shrink with the block."""
    stage = sum(p.latency + (p.seconds - p.latency) / blocks for p in ph)
    compute = sum(p.compute for p in ph)
    step = max(max(busy, default=0.0) / blocks, compute / blocks, max((p.latency for p in ph), default=0.0))
    # No schedule finishes before its busiest link has moved everything it must (the stages leave out
    # outer levels' traffic on inner uplinks).
    return max(stage + (blocks - 1) * step, max(busy, default=0.0))


def lower_bound(shape: Shape, levels, nbytes: float) -> tuple[float, str]:
    """The topology's lower bound (reference/anchors.md §6): at every level, its E children must together
    allreduce the whole vector through the links out of each child (peer links and uplink: a GPU's
    injection, a node's NICs), t >= 2(E-1)/E * n / B_out; and r rounds reach p ranks only with p**(1/r) - 1
    messages each, one of them across the outermost level. Returns (seconds, which bound binds)."""
    best, why = 0.0, "none"
    for lvl, c in enumerate(levels):
        e = _entities(shape, lvl)
        if e > 1:
            t = 2 * (e - 1) / e * nbytes / c.escape
            if t > best:
                best, why = t, f"bandwidth of {c.name} links ({c.link}, {e} endpoints)"
    p = shape.nranks
    if p > 1:  # r rounds reach p ranks only with p**(1/r) - 1 messages each; one round crosses the top
        a = min(c.alpha for c in levels)
        t = min(levels[-1].alpha + (r - 1) * a + r * max(0, _root_up(p, r) - 2) * links.SOFTWARE_OVERHEAD
                for r in range(1, math.ceil(math.log2(p)) + 1))
        if t > best:
            best, why = t, f"latency: {p} ranks, one round across {levels[-1].name}"
    return best, why


# -- choosing ---------------------------------------------------------------------------------------------------


def choose(tree, levels, nbytes: int, forced: tuple[str, ...] = (), block_bytes: int | None = None,
           inflight: int | None = None) -> Plan:
    """The cheapest plan for ``nbytes`` on this tree; ``forced`` names algorithms (one for every level, or
    one per level innermost first, "auto" to let the model pick; "recursive_doubling" alone forces the
    latency shape). Deterministic: every rank computes the same plan."""
    shape = Shape.of(tree)
    levels = tuple(levels)
    if len(levels) != shape.depth:
        raise ValueError(f"{len(levels)} level costs for a tree of {shape.depth} levels")
    forced = tuple(forced) or ("auto",)
    if len(forced) == 1:
        forced = forced * shape.depth
    if len(forced) != shape.depth:
        raise ValueError(f"{len(forced)} algorithms given for {shape.depth} levels ({_names(levels)})")
    top = shape.depth - 1
    for lvl, a in enumerate(forced):
        allowed = TOP_ALGORITHMS if lvl == top else LEVEL_ALGORITHMS
        if a != "auto" and a not in allowed and not (a == "recursive_doubling" and set(forced) == {a}):
            raise ValueError(f"algorithm {a!r} cannot run level {lvl} ({levels[lvl].name}); choose from "
                             f"{', '.join(allowed)}")
    if set(forced) == {"recursive_doubling"} and shape.depth > 1:
        return Plan(tree, levels, forced, "latency", max(1, nbytes), 1)
    picks = []
    for lvl in range(shape.depth):
        options = TOP_ALGORITHMS if lvl == top else LEVEL_ALGORITHMS
        if levels[lvl].via == "uplink":  # all-to-all over NICs measured 2-4x slower than modeled (incast)
            options = tuple(a for a in options if a != "direct")
        options = options if forced[lvl] == "auto" else (forced[lvl],)
        picks.append(min(options, key=lambda a: _level_cost(shape, levels, lvl, a, nbytes)))
    algos = tuple(picks)
    ph = phases(shape, levels, algos, nbytes)
    busy = link_seconds(shape, levels, ph)
    blocks = _blocks(ph, busy, nbytes, block_bytes)
    hier = pipelined(ph, blocks, busy)
    if set(forced) == {"auto"} and shape.depth > 1 and pipelined(latency_phases(shape, levels, nbytes), 1) < hier:
        return Plan(tree, levels, ("recursive_doubling",) * shape.depth, "latency", max(1, nbytes), 1)
    block = block_bytes or max(1, -(-nbytes // blocks))
    stages = 2 * shape.depth - 1
    return Plan(tree, levels, algos, "hierarchical", block,
                inflight or max(1, min(blocks, stages + 1)))


def _level_cost(shape, levels, lvl, algo, nbytes) -> float:
    algos = ["ring"] * shape.depth
    algos[lvl] = algo
    return sum(p.seconds for p in phases(shape, levels, algos, nbytes) if p.level == lvl)


def _blocks(ph: list[Phase], busy: list[float], nbytes: int, block_bytes: int | None) -> int:
    if block_bytes:
        return max(1, -(-nbytes // block_bytes))
    best, blocks = math.inf, 1
    b = 1
    while b <= MAX_BLOCKS and (b == 1 or nbytes / b >= MIN_BLOCK_BYTES):
        t = pipelined(ph, b, busy)
        if t < best:
            best, blocks = t, b
        b *= 2
    return blocks


def _names(levels) -> str:
    return ", ".join(lv.name for lv in levels)


def predict(plan: Plan, nbytes: int, shape: Shape | None = None) -> tuple[float, list[Phase]]:
    """(seconds, phases) the model predicts; ``shape``, when the caller has it, saves walking the tree."""
    shape = shape or Shape.of(plan.tree)
    if plan.shape == "latency":
        ph = latency_phases(shape, plan.levels, nbytes)
        return pipelined(ph, 1), ph
    ph = phases(shape, plan.levels, plan.algorithms, nbytes)
    return pipelined(ph, max(1, -(-nbytes // plan.block_bytes)), link_seconds(shape, plan.levels, ph)), ph


# -- one rank's program ---------------------------------------------------------------------------------------


def program(rank: int, plan: Plan, count: int) -> Program:
    """Rank ``rank``'s steps for an allreduce of ``count`` elements under ``plan`` (for one block)."""
    tree = plan.tree
    if plan.shape == "latency":
        order = leaves(tree)
        prog = ALLREDUCE["recursive_doubling"](order.index(rank), len(order), count)
        steps = [Step(s.round, s.op, order[s.peer], s.offset, s.count, level=0) for s in prog.steps]
        return Program(rank, number_tags(steps), prog.rounds)
    shape = Shape.of(tree)
    ctx = _Context(shape, plan.algorithms)
    out: list[Step] = []
    _rank_steps(rank, tree, 0, 0, count, ctx, out)
    return Program(rank, number_tags(out, ctx.width), ctx.total, ctx.width)


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
            b = self._bounds[key] = [count * i // g for i in range(g + 1)]
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
    algo = _effective(ctx.algorithms[lvl], g)
    _scatter_gather(i, group, bounds, algo, lo, ctx.rs_start[lvl], ctx.ag_start[lvl], lvl, out)
    mine_lo, mine_hi = bounds[i], bounds[i + 1]
    if mine_hi == mine_lo:
        return
    cuts = {mine_lo, mine_hi}
    for h in ctx.shape.sizes[lvl]:
        cuts.update(b for b in ctx.bounds(count, h) if mine_lo < b < mine_hi)
    cuts = sorted(cuts)
    for a, b in zip(cuts, cuts[1:]):
        _rank_steps(me, _owners(tree, a, count, ctx), lvl + 1, lo + a, b - a, ctx, out)


def _scatter_gather(i, group, bounds, algo, lo, rs0, ag0, lvl, out) -> None:
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
    if isinstance(tree[0], int):
        b = ctx.bounds(count, len(tree))
        return tree[bisect.bisect_right(b, offset) - 1]
    return [_owners(t, offset, count, ctx) for t in tree]


def _direct_allreduce(rank: int, p: int, count: int) -> Program:
    out: list[Step] = []
    _scatter_gather(rank, list(range(p)), [count * i // p for i in range(p + 1)], "direct", 0, 0, 1, 0, out)
    return Program(rank, number_tags(out), 2 if p > 1 else 0)


def _exchange_allreduce(rank: int, p: int, count: int) -> Program:
    """Latency-optimal for tiny vectors: one round, the whole vector to and from every other rank."""
    out = [Step(0, op, peer, 0, count) for peer in range(p) if peer != rank and count
           for op in (Op.SEND, Op.RECV_REDUCE)]
    return Program(rank, number_tags(out), 1 if p > 1 else 0)


ALLREDUCE_AT_TOP = {**ALLREDUCE, "direct": _direct_allreduce, "exchange": _exchange_allreduce}
