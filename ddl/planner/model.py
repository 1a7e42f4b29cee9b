"""The planner's cost model: the shape of a tree of ranks, the phases an allreduce runs through (per level,
per algorithm), the bytes and seconds each level's links carry under the α–β–γ model, pipelining, and the
topology's lower bound. Pure arithmetic over (tree, levels, size): no MPI, no plans."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..topology import links
from ..topology.tree import Regular, depth

LEVEL_ALGORITHMS = ("ring", "rabenseifner", "direct")
TOP_ALGORITHMS = ("ring", "rabenseifner", "recursive_doubling", "direct", "exchange")
MIN_BLOCK_BYTES = 64 << 10  # smaller blocks measured slower on TCP links (per-message costs the model lacks)
MAX_BLOCKS = 256
# Across a network, blocks of at most this many bytes where MOST_BLOCKS allow: larger ones put a rank's messages
# above MPI's eager limit (Open MPI over TCP: 64 KiB), and each such message waits a rendezvous round trip on
# the receiver's progress. 98 MiB on the emulated T1 (4 nodes x 2 ranks, 1 Gbit/s): blocks of 128 KiB reached
# 0.99 of the bound, 256 KiB 0.91, 390 KiB (256 blocks) 0.92 (a cost the model has no term for).
MAX_BLOCK_BYTES = 128 << 10
# Over ddl's own TCP (ddl.core.tcp) there is no eager limit, and every message costs system calls and a wake-up:
# blocks across a network of at least this many bytes (and, on the largest buffers, exactly this many). A 26 MB
# allreduce on the emulated T1: 512 KiB blocks took the time of the ~100 KiB ones (342 ms) for 0.41 CPU-seconds
# over the 8 ranks instead of 0.57; 2 MiB blocks 0.36 CPU-seconds but 6 % slower (a longer pipeline fill).
TCP_BLOCK_BYTES = 512 << 10
# ... that is across one network level; a tree with more (racks, then their spine) fills a pipeline of more
# network stages, each block's trip through them before the busiest link runs full: its blocks are a quarter as
# large (never under MIN_BLOCK_BYTES). 16 MiB on the emulated T2 (2 racks, 500 Mbit/s spine): blocks of 128 KiB
# took 291-300 ms (0.90-0.92 of the bound) against 302-328 ms in 512 KiB ones; 64 MiB 1152 against 1197-1296 ms,
# for 5-10 % more CPU. On T1 128 KiB blocks cost 25 % more CPU and ran 13-55 % slower (8 ranks on 2 cores: the CPU
# ran out). No smaller for a third network level: on T5 (aisles, racks, nodes; 16 MiB) 64 KiB blocks took
# 566-800 ms for 20-27 % more CPU, 128 KiB 581-597, 512 KiB 589-595.
TCP_DEEPER_SHRINK = 4
# ... but a smaller buffer keeps a pipeline of this many blocks (smaller ones, not under MIN_BLOCK_BYTES): 4 MiB
# on two racks of 200/100 Mbit/s in 8 blocks of 512 KiB ran at 84 % of the bound, its fill over three stages.
TCP_PIPELINE = 32
MOST_BLOCKS = 4096


def _pof2(g: int) -> bool:
    return g & (g - 1) == 0


def effective_algorithm(algo: str, g: int) -> str:
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
        if isinstance(tree, Regular):  # arithmetic: no walk over every rank
            under = [1]
            for g in tree.sizes[:-1]:
                under.append(under[-1] * g)
            n = tree.nranks
            return cls(len(tree.sizes), tuple((g,) for g in tree.sizes), tuple(under),
                       tuple(n // (u * g) for u, g in zip(under, tree.sizes)), n)
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
    return {"ring": g - 1, "rabenseifner": _lg(g), "direct": 1}[effective_algorithm(algo, g)]


def top_rounds(algo: str, g: int) -> int:
    if g == 1:
        return 0
    fold = 2 if not _pof2(g) else 0
    return {"ring": 2 * (g - 1), "rabenseifner": 2 * _lg(g) + fold, "recursive_doubling": _lg(g) + fold,
            "direct": 2, "exchange": 1}[algo]


# -- plans: what every rank agrees on ------------------------------------------------------------------------


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
            r, lat, sent = _scatter_level(shape, c, lvl, algo, nbytes)
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


def _scatter_level(shape: Shape, c, lvl: int, algo: str, nbytes: float) -> tuple[int, float, float]:
    """(rounds, latency, bytes one child sends) of a reduce-scatter, or an allgather, at level ``lvl``: a child
    holds the whole vector spread over its ranks and moves (g-1)/g of it through its links."""
    g = max(shape.sizes[lvl])
    r = max(level_rounds(algo, h) for h in shape.sizes[lvl])
    extra = (g - 1 - r) if algo == "direct" else 0  # further messages posted in a direct round
    return r, r * c.alpha + extra * links.SOFTWARE_OVERHEAD, (g - 1) / g * nbytes


def allgather_phases(shape: Shape, levels, algorithms, nbytes: float) -> list[Phase]:
    """A planned allgather of ``nbytes`` in all (ddl.core.parts: every level gathers, the outermost first, with
    ``algorithms`` per level, innermost first): each level moves what a reduce-scatter there would, the top
    included (no allreduce in the middle), and reduces nothing."""
    out = []
    for lvl in reversed(range(shape.depth)):
        c = levels[lvl]
        r, lat, sent = _scatter_level(shape, c, lvl, algorithms[lvl], nbytes)
        out.append(Phase(lvl, "allgather", algorithms[lvl], r, lat + sent / c.bandwidth, lat, sent))
    return out


def scatter_choices(depth: int, plan_algorithms: tuple[str, ...], latency: bool) -> tuple[str, ...]:
    """Per level, the algorithm of a reduce-scatter or allgather run alone where the allreduce plan for the same
    bytes has ``plan_algorithms`` (its halves'); the top's allreduce-only choices (recursive doubling, exchange:
    tiny vectors) become direct, and so does every level of a latency plan."""
    if latency or len(plan_algorithms) != depth:
        return ("direct",) * depth
    return tuple(a if a in ("ring", "rabenseifner", "direct") else "direct" for a in plan_algorithms)


def latency_round_levels(shape: Shape) -> list[int]:
    """The level each round of recursive doubling over all ranks in tree order crosses (the fold rounds of a
    non-power of two included): the round pairing ranks within blocks of k consecutive ranks crosses the
    lowest level whose groups hold k ranks."""
    p = shape.nranks
    holds = [shape.under[lvl] * min(shape.sizes[lvl]) for lvl in range(shape.depth)]
    reach = [2 ** (i + 1) for i in range(_lg(p))]
    if not _pof2(p):
        reach = [2] + reach + [2]
    return [next((j for j in range(shape.depth) if k <= holds[j]), shape.depth - 1) for k in reach]


def latency_phases(shape: Shape, levels, nbytes: float, payload: str = "whole") -> list[Phase]:
    """Recursive doubling over all ranks in tree order: the round that pairs ranks within blocks of k
    consecutive ranks crosses the lowest level whose groups hold k ranks; every rank below a child of that
    level sends the whole vector through the child's links at once. ``payload`` "halving": the same rounds as a
    reduce-scatter's recursive halving, each carrying half the one before; "gathering": an allgather's, each
    carrying twice the one before, the last half the vector (the fold's rounds whole in both)."""
    out: list[Phase] = []
    rounds = latency_round_levels(shape)
    fold = 0 if _pof2(shape.nranks) else 1
    pof2_rounds = len(rounds) - 2 * fold
    for i, lvl in enumerate(rounds):  # consecutive rounds on one level make one phase
        c = levels[lvl]
        j = i - fold
        carried = nbytes if not 0 <= j < pof2_rounds else nbytes / 2 ** (j + 1) if payload == "halving" else \
            nbytes / 2 ** (pof2_rounds - j) if payload == "gathering" else nbytes
        red = carried * c.gamma
        ph = Phase(lvl, "recursive doubling", "recursive_doubling", 1,
                   c.alpha + _crossing_seconds(shape, levels, lvl, carried) + red, c.alpha, carried, red)
        if out and out[-1].level == lvl:
            q = out.pop()
            ph = Phase(lvl, q.what, q.algorithm, q.rounds + 1, q.seconds + ph.seconds, q.latency + ph.latency,
                       q.link_bytes + ph.link_bytes, q.compute + ph.compute)
        out.append(ph)
    return out


def _crossing_seconds(shape: Shape, levels, lvl: int, carried: float) -> float:
    """Wire time of a round at level ``lvl`` where every rank sends ``carried`` bytes: the busiest resource
    link_seconds finds for it (a child of that level sends its ranks' bytes over its links, and on the way they
    leave every inner child through its uplink, or its other links where children are peer-linked): an inner
    uplink thinner than the outer level's links is what the round waits for."""
    crossing = Phase(lvl, "recursive doubling", "recursive_doubling", 1, 0.0, 0.0, carried * shape.under[lvl])
    return max(link_seconds(shape, levels, [crossing]))


def agreement_phases(shape: Shape, levels, nbytes: float, by_host: bool, payload: str = "whole") -> list[Phase]:
    """The agreement round with ``nbytes`` riding in it, as ddl.core.agreement runs it. ``by_host`` (level 0's
    groups are the hosts, and the round crosses them once per host): each host's ranks to its first rank, recursive
    doubling among the first ranks with one sender per host, back down; else recursive doubling over all ranks
    (latency_phases), where every rank of a node sends through its NICs at once. ``payload`` "halving": a
    reduce-scatter's round (ddl.schedule.algorithms.leader_reduce_scatter), halving the vector between the first
    ranks and handing each rank only its part back down; "gathering": an allgather's (leader_allgather), each
    rank's part going up, the parts doubling between the first ranks, the whole coming back down."""
    if not by_host or shape.depth < 2:
        return latency_phases(shape, levels, nbytes, payload)
    c, g = levels[0], max(shape.sizes[0])
    up = nbytes / shape.nranks if payload == "gathering" else nbytes  # what each of the host's ranks sends up
    red = 0.0 if payload == "gathering" else (g - 1) * nbytes * c.gamma
    gather = Phase(0, "to each host's first rank", "leader", 1, c.alpha + (g - 1) * up / c.bandwidth + red,
                   c.alpha, (g - 1) * up, red)
    per_host = shape.under[1]
    leaders = Shape(shape.depth - 1, shape.sizes[1:], tuple(max(1, u // per_host) for u in shape.under[1:]),
                    shape.groups[1:], shape.groups[0])
    between = [replace(p, level=p.level + 1) for p in latency_phases(leaders, levels[1:], nbytes, payload)]
    down = nbytes / shape.nranks if payload == "halving" else nbytes  # what each of the host's other ranks gets back
    scatter = Phase(0, "back from each host's first rank", "leader", 1, c.alpha + (g - 1) * down / c.bandwidth,
                    c.alpha, (g - 1) * down, 0.0)
    return [gather, *between, scatter]


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


def broadcast_lower_bound(shape: Shape, levels, nbytes: float) -> float:
    """A broadcast's bandwidth bound: at every level with more than one child, each child other than the root's
    receives all ``nbytes`` through its link out (a node's NICs, a rack's uplink), t >= n / B_out."""
    return max((nbytes / c.escape for lvl, c in enumerate(levels) if _entities(shape, lvl) > 1), default=0.0)


# -- choosing ---------------------------------------------------------------------------------------------------
