"""The choice: from a tree of ranks and the cost of each level, an allreduce plan.

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

import math
from dataclasses import dataclass, field

from ..topology import LevelCost, default_level
from ..topology.tree import depth, nested, normalize
from .model import (LEVEL_ALGORITHMS, MAX_BLOCK_BYTES, MAX_BLOCKS, MIN_BLOCK_BYTES, MOST_BLOCKS, TCP_BLOCK_BYTES,
                    TCP_DEEPER_SHRINK, TCP_PIPELINE, TOP_ALGORITHMS,
                    Phase, Shape, allgather_phases, latency_phases, link_seconds, phases, pipelined, scatter_choices)


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
        return dict(tree=nested(self.tree), levels=[lv.to_dict() for lv in self.levels],
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


def choose(tree, levels, nbytes: int, forced: tuple[str, ...] = (), block_bytes: int | None = None,
           inflight: int | None = None, tcp: bool = False) -> Plan:
    """The cheapest plan for ``nbytes`` on this tree; ``forced`` names algorithms (one for every level, or
    one per level innermost first, "auto" to let the model pick; "recursive_doubling" alone forces the
    latency shape); ``tcp``: the ranks talk over ddl's own TCP (larger blocks across a network: tcp_block_bytes).
    Deterministic: every rank computes the same plan."""
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
    blocks = best_blocks(ph, busy, nbytes, block_bytes, sum(lv.via == "uplink" for lv in levels), tcp)
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


def best_blocks(ph: list[Phase], busy: list[float], nbytes: int, block_bytes: int | None, network: int,
                tcp: bool = False) -> int:
    """How many pipeline blocks the phases ``ph`` of ``nbytes`` run in: ``block_bytes`` where forced; across a
    network (``network``: how many levels cross one) and large, blocks of MAX_BLOCK_BYTES (over ddl's TCP:
    tcp_block_bytes); else the cheapest power of two by ``pipelined``, none smaller than MIN_BLOCK_BYTES (over
    ddl's TCP across a network: tcp_block_bytes, or what makes TCP_PIPELINE blocks of a smaller buffer)."""
    if block_bytes:
        return max(1, -(-nbytes // block_bytes))
    largest = tcp_block_bytes(network) if network and tcp else MAX_BLOCK_BYTES
    # over ddl's TCP, blocks of that size where the buffer still makes a pipeline of TCP_PIPELINE of them
    smallest = max(MIN_BLOCK_BYTES, min(largest, nbytes // TCP_PIPELINE)) if network and tcp \
        else MIN_BLOCK_BYTES
    if network and nbytes > MAX_BLOCKS * largest:
        return min(MOST_BLOCKS, -(-nbytes // largest))
    best, blocks = math.inf, 1
    b = 1
    while b <= MAX_BLOCKS and (b == 1 or nbytes / b >= smallest):
        t = pipelined(ph, b, busy)
        if t < best:
            best, blocks = t, b
        b *= 2
    return blocks


def tcp_block_bytes(network_levels: int) -> int:
    """Over ddl's TCP, the blocks of a large buffer across ``network_levels`` levels of network (model.py)."""
    if network_levels <= 1:
        return TCP_BLOCK_BYTES
    return max(MIN_BLOCK_BYTES, TCP_BLOCK_BYTES // TCP_DEEPER_SHRINK)


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


def predict_allgather(plan: Plan, nbytes: int, shape: Shape | None = None) -> float:
    """Seconds the model predicts for the planned allgather of ``nbytes`` in all that runs per level as ``plan``
    would (model.scatter_choices, as ddl.planner.per_level.scatter_algorithms picks them), in the plan's
    blocks."""
    shape = shape or Shape.of(plan.tree)
    ph = allgather_phases(shape, plan.levels, scatter_choices(shape.depth, plan.algorithms, plan.shape == "latency"),
                          nbytes)
    return pipelined(ph, max(1, -(-nbytes // plan.block_bytes)), link_seconds(shape, plan.levels, ph))


# -- one rank's program ---------------------------------------------------------------------------------------
