"""Which levels of a device collective run on NCCL, chosen by a cost model (DDL_NCCL_LEVELS=auto), and what each
level carries: what ddl.explain and ddl-topo show of a device allreduce.

The NCCL levels are the innermost regular ones (ddl.gpu.groups); the choice is how many. For m NCCL levels a
device allreduce of S bytes costs, per rank,
  - each NCCL level j (g members, S_j bytes entering it): a reduce-scatter and an all-gather, ring steps at NCCL's
    own latencies (tuning.cc, Simple protocol: 8.4 us a call, 3.4 us a hop over NVLink, 5.7 over PCIe, 14 over
    the network) and S_j (g-1)/g bytes each way at 0.92 of the level's link (NCCL's ring efficiency; ddl's own
    executor reaches as much of a level's links, so staged levels get it too);
  - the staged levels above: the shard copied to pinned host memory and back over PCIe, and ddl's host plan
    among the members of a position (each level a reduce-scatter and an allgather at its alpha and bandwidth,
    the figures the planner uses, probed or calibrated where the probe ran, reduced by the CPU). The host plan
    runs its levels as a pipeline of blocks (as many as cost least): one block's trip through every level, then a
    block per step of the slowest level; NCCL's levels run one after another. (On the emulated T2 with an H200,
    2026-11-28: the rack and spine levels staged took 0.94 of the bound at 32 MiB, on NCCL 0.54, though each
    level alone is no faster on MPI: the staged levels overlap, NCCL's do not.)
Above the innermost level a child's links (a node's NICs) carry the shards of every rank inside it at once.
Inside a host, NCCL's link is NVLink where the level says so, else PCIe (a host level's own link, shared memory or
the CPUs' bus, is what the staged path uses); across hosts it is the level's network link. The model is priced at
REFERENCE_BYTES (a gradient bucket's order) and fixed for the communicator: its groups are made once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..planner.choice import best_blocks
from ..planner.model import Phase, Shape, pipelined
from ..topology import links
from ..units import format_size
from .groups import level_groups, nccl_levels

REFERENCE_BYTES = 32 << 20
NCCL_CALL = 8.4e-6  # seconds a call (ring, Simple)
NCCL_HOP = {"nvlink": 3.4e-6, "pcie": 5.7e-6, "network": 14e-6}
NCCL_EFFICIENCY = 0.92
HOST_EFFICIENCY = 0.92  # ddl's executor on a level's links: 0.90-0.94 of the bound measured (docs/benchmarks.md)
COPY_LINK = "pcie4"  # host <-> device copies of the staged levels, and NCCL inside a host without NVLink
HOST_LINKS = ("shm", "xbus", "upi")
STAGING_GAIN = 0.02


def nccl_link(link: str) -> tuple[str, float]:
    """(family, bytes/s) of NCCL's path over a level whose link is ``link`` (0: the level's own bandwidth)."""
    if link.startswith("nvlink"):
        return "nvlink", 0.0  # the level's own figure: its NVLink bundles
    if link.startswith("pcie") or link in HOST_LINKS:
        return "pcie", links.kind(link if link.startswith("pcie") else COPY_LINK).bandwidth * 1e9
    return "network", 0.0  # the level's own (probed or calibrated) bandwidth


@dataclass
class LevelPlan:
    """One level of a device allreduce: its name, group size, transport and bytes each rank sends over it."""
    name: str
    size: int
    transport: str  # "nccl" or "mpi (staged)"
    sends: int = 0  # bytes per rank, reduce-scatter and all-gather together


@dataclass
class DeviceLevels:
    """The choice: how many innermost levels run on NCCL (``nccl``), of ``regular`` that could, why, and each
    level for an allreduce of ``nbytes``; ``seconds``: the model's time at REFERENCE_BYTES for every m it
    weighed."""
    setting: str
    nccl: int
    regular: int
    nbytes: int
    levels: list[LevelPlan] = field(default_factory=list)
    seconds: dict[int, float] = field(default_factory=dict)

    def text(self) -> str:
        on = ", ".join(f"{lv.name} ({lv.size} per group): {lv.transport}, {format_size(lv.sends)} sent per rank"
                       for lv in self.levels) or "one rank"
        why = {"auto": "the cost model's choice", "all": "DDL_NCCL_LEVELS=all"}.get(
            self.setting, f"DDL_NCCL_LEVELS={self.setting}")
        weighed = "; modelled at " + format_size(REFERENCE_BYTES) + ": " + ", ".join(
            f"{m} on NCCL {s * 1e3:.2f} ms" for m, s in self.seconds.items()) if self.seconds else ""
        return f"{on} ({self.nccl} of {len(self.levels)} on NCCL: {why}{weighed})"

    def to_dict(self) -> dict:
        return dict(setting=self.setting, nccl=self.nccl, regular=self.regular, bytes=self.nbytes,
                    levels=[vars(lv) for lv in self.levels],
                    seconds={str(m): s for m, s in self.seconds.items()})


def level_sizes(tree) -> list[int]:
    """Members per group at every level, innermost first (the most where a level is uneven): the planner's
    shape of the tree."""
    return [max(sizes) for sizes in Shape.of(tree).sizes]


def _nccl_seconds(cost, g: int, nbytes: float, share: int) -> float:
    family, bw = nccl_link(cost.link)
    bw = (bw or cost.bandwidth / share) * NCCL_EFFICIENCY
    return 2 * (NCCL_CALL + (g - 1) * NCCL_HOP[family] + nbytes * (g - 1) / g / bw)


def _host_phase(j: int, cost, g: int, nbytes: float, share: int) -> Phase:
    """One staged level's reduce-scatter and allgather as the planner's model has them: whole-buffer seconds
    (the wire and the CPU's reducing, counted as one stage), the latency every block pays."""
    moved = nbytes * (g - 1) / g
    latency = 2 * (g - 1) * cost.alpha
    return Phase(j, "allreduce", "ring", 2 * (g - 1), latency + 2 * moved * share / (cost.bandwidth * HOST_EFFICIENCY)
                 + moved * links.REDUCE_SECONDS_PER_BYTE["cpu"], latency, 2 * moved)


def _host_seconds(ph: list[Phase], nbytes: float, network: bool) -> float:
    """The staged levels as ddl's host executor runs them: a pipeline of blocks through every level, each
    level's links its own resource, in the blocks the planner would choose (ddl.planner: pipelined, best_blocks)."""
    if not ph:
        return 0.0
    busy = [p.seconds - p.latency for p in ph]
    return pipelined(ph, best_blocks(ph, busy, int(nbytes), None, network), busy)


def model(costs: list, sizes: list[int], m: int, nbytes: float) -> float:
    """Seconds of a device allreduce of ``nbytes`` with the innermost ``m`` levels on NCCL. Above the innermost
    level a child's links (a node's NICs) are shared by the ranks inside it, each with its own shard."""
    seconds, staged, staged_bytes, shard, share = 0.0, [], 0.0, float(nbytes), 1
    for j, (cost, g) in enumerate(zip(costs, sizes)):
        if g > 1 and j < m:
            seconds += _nccl_seconds(cost, g, shard, share)
        elif g > 1:
            if not staged:  # the first staged level: the shard goes to the host and back
                copy = links.kind(COPY_LINK)
                seconds += 2 * (copy.latency * 1e-6 + shard / (copy.bandwidth * 1e9))
                staged_bytes = shard
            staged.append(_host_phase(j, cost, g, shard, share))
        shard /= g
        share *= g
    network = any(costs[p.level].via == "uplink" for p in staged)
    return seconds + _host_seconds(staged, staged_bytes, network)


def choose_levels(tree, costs: list, setting: str, nbytes: int = REFERENCE_BYTES) -> DeviceLevels:
    """A device allreduce's levels over ``tree`` priced by ``costs`` (the communicator's levels, innermost
    first): how many run on NCCL (DDL_NCCL_LEVELS; auto: the model's cheapest at REFERENCE_BYTES), and each
    level's transport and bytes per rank for an allreduce of ``nbytes``."""
    regular = len(level_groups(tree))
    sizes = level_sizes(tree)
    costs = list(costs)
    if costs and len(costs) != len(sizes):  # (a tree deeper than its priced levels: the rest like the outermost)
        costs = (costs + [costs[-1]] * len(sizes))[:len(sizes)]
    seconds = {m: model(costs, sizes, m, REFERENCE_BYTES) for m in range(regular + 1)} if costs else {}
    # the most levels on NCCL within STAGING_GAIN of the cheapest: staging costs what the model leaves out (the
    # CPU's cycles beside the training step, pinned memory), so it must win clearly
    best = min(seconds.values(), default=0.0)
    chosen = max((m for m, t in seconds.items() if t <= best * (1 + STAGING_GAIN)), default=None)
    m = nccl_levels(setting, regular, chosen)
    plans, shard = [], float(nbytes)
    for j, g in enumerate(sizes):
        name = costs[j].name if costs else f"level {j}"
        plans.append(LevelPlan(name, g, "nccl" if j < m else "mpi (staged)", int(2 * shard * (g - 1) / g)))
        shard /= g
    return DeviceLevels(setting, m, regular, nbytes, plans, seconds)
