"""Where ranks run on a topology, and the planner's view of it: the nested groups of ranks and each level's
cost.

``place`` maps ranks to devices (from the file's placement, checked against the hosts MPI reports, or by
host name); ``hierarchy`` follows the containment tree from the occupied devices up, drops groups of one, and
prices each level by its slowest group (``group_cost``).
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from . import links
from .costs import LevelCost
from .tree import normalize
from ..errors import TopologyError

if TYPE_CHECKING:
    from .graph import Topology




def place(t: Topology, hosts: list[str] | None = None, nranks: int | None = None) -> list[str]:
    """The device of every rank. With the file's placement: that, checked against ``hosts`` (MPI's view):
    ranks the file puts on one node must share a host. Without: each rank goes to the next free device of
    the node named like its host. Raises TopologyError naming the rank on any contradiction."""
    if t.placement is not None:
        if nranks is not None and len(t.placement) != nranks:
            raise TopologyError(f"topology {t.name!r} places {len(t.placement)} ranks but MPI runs "
                                f"{nranks}")
        used: dict[str, list[str]] = {}
        devs = [device_for(t, r, p, used) for r, p in enumerate(t.placement)]
        if hosts is not None:
            first: dict[str, tuple[int, str]] = {}
            for r, d in enumerate(devs):
                node = t.host_of(d) or d
                r0, h0 = first.setdefault(node, (r, hosts[r]))
                if hosts[r] != h0:
                    raise TopologyError(f"rank {r}: topology {t.name!r} places ranks {r0} and {r} on "
                                        f"node {node!r}, but MPI runs them on different hosts "
                                        f"({h0!r} and {hosts[r]!r}), which share no memory")
        return devs
    if hosts is None:
        if nranks is None:
            raise TopologyError("place() needs the hosts of the ranks or a placement in the file")
        free = free_slots(t, t.devices())
        if nranks > len(free):
            raise TopologyError(f"topology {t.name!r} has {len(free)} GPUs or slots for {nranks} ranks")
        return free[:nranks]
    by_host = {t.graph.nodes[n].get("host", n): n for n in t.nodes()}
    free_on: dict[str, list[str]] = {}
    out = []
    for r, h in enumerate(hosts):
        if h not in by_host:
            raise TopologyError(f"rank {r}: MPI runs it on host {h!r}, which topology {t.name!r} does "
                                f"not have (its nodes: {', '.join(sorted(by_host)[:6])}"
                                f"{', ...' if len(by_host) > 6 else ''})")
        node = by_host[h]
        if node not in free_on:
            free_on[node] = free_slots(t, t.devices(node))[::-1]
        if not free_on[node]:
            raise TopologyError(f"rank {r}: node {node!r} has no free GPU or slot left for it "
                                f"(MPI runs {hosts.count(h)} ranks on host {h!r})")
        out.append(free_on[node].pop())
    return out


def free_slots(t: Topology, devices: list[str]) -> list[str]:
    return [d for d in devices for _ in range(t.slots(d))]


def device_for(t: Topology, rank: int, where: str, used: dict) -> str:
    if where not in t.graph:
        raise TopologyError(f"rank {rank}: placed on {where!r}, which topology {t.name!r} does not have")
    if where not in used:
        used[where] = free_slots(t, t.devices(where))[::-1]
    if not used[where]:
        raise TopologyError(f"rank {rank}: placed on {where!r}, which has no free GPU or slot left")
    return used[where].pop()


def hierarchy(t: Topology, placement: list[str]) -> tuple[list, list[LevelCost]]:
    """(tree, levels): the nested groups of ranks (ddl.hierarchical's normalized form, innermost groups
    deepest) following the containment tree, and one LevelCost per level, innermost first."""
    labeled = labeled_tree(t, placement)
    if isinstance(labeled, int):
        return [labeled], []
    by_depth: list[list[tuple]] = []
    _collect(labeled, 0, by_depth)
    levels = []
    for depth in range(len(by_depth) - 1, -1, -1):  # innermost first
        groups = by_depth[depth]
        costs = [group_cost(t, g, placement) for g in groups]
        worst = min(costs, key=lambda c: (c.bandwidth, -c.alpha))
        name = Counter(c.name for c in costs).most_common(1)[0][0]
        levels.append(LevelCost(name, worst.link, max(c.alpha for c in costs), worst.bandwidth,
                                max(c.gamma for c in costs), worst.via, min(c.escape for c in costs),
                                _how_measured([c.measured for c in costs])))
    return normalize(strip(labeled)), levels


def labeled_tree(t: Topology, placement: list[str]):
    """The occupied part of the containment tree, groups of one dropped: a rank, or
    (vertex, children) in containment order, ranks on a vertex itself after its children."""
    ranks_on: dict[str, list[int]] = {}
    for r, d in enumerate(placement):
        ranks_on.setdefault(d, []).append(r)
    occupied: set = set()
    for d in ranks_on:
        while d is not None and d not in occupied:
            occupied.add(d)
            d = t.parent(d)

    kids = t.children_index()

    def build(v):
        return (v, [build(c) for c in kids.get(v, ()) if c in occupied] + ranks_on.get(v, []))

    return _simplify(build(t.roots()[0]))


def group_cost(t: Topology, group: tuple, placement: list[str]) -> LevelCost:
    """Cost of one group (vertex X, children): the slowest child's bandwidth to its siblings, over peer
    links when the children have any between them, else up through X."""
    x, kids = group
    device = t.kind(placement[_first_rank(group)])
    gamma = links.REDUCE_SECONDS_PER_BYTE["gpu" if device == "gpu" else "cpu"]
    name = t.level_name(x)
    tops = [k[0] if isinstance(k, tuple) else placement[k] for k in kids]
    if any(top == x for top in tops):  # a rank on x itself: its siblings are reached in memory
        k = links.kind("shm")
        return LevelCost(name, "shm", k.latency * 1e-6 + links.SOFTWARE_OVERHEAD, k.bandwidth * 1e9, gamma,
                         "peer")
    (peers, leaving), adj, parent = t.peer_links(), t.graph._adj, t.parents
    worst = None
    for top in tops:
        lat, v = 0.0, top
        while parent[v] != x:
            lat += adj[v][parent[v]]["latency"]
            v = parent[v]
        across = peers.get((x, v))
        e = adj[v][x]
        outside = e["bandwidth"] + leaving.get(v, 0.0)
        if across is not None:  # links straight to the siblings
            cost = (across[0], across[1]["kind"], across[1]["latency"], "peer", outside,
                    across[1].get("measured", False))
        else:  # out through the edge into x (what lies below it was paid at lower levels) and back down
            cost = (e["bandwidth"], e["kind"], 2 * (lat + e["latency"]), "uplink", outside, e.get("measured", False))
        if worst is None or cost[0] < worst[0]:
            worst = cost
    bw, kind, lat, via, outside, measured = worst
    return LevelCost(name, kind, lat * 1e-6 + links.SOFTWARE_OVERHEAD, bw * 1e9, gamma, via, outside * 1e9,
                     measured)


def _how_measured(values: list):
    """A level's ``measured`` from its groups': theirs where they agree, probed where all were measured."""
    if all(v == values[0] for v in values):
        return values[0]
    return all(values)


def _simplify(node):
    """Drop groups of one (their level carries nothing)."""
    if isinstance(node, int):
        return node
    v, kids = node
    kids = [_simplify(k) for k in kids]
    return kids[0] if len(kids) == 1 else (v, kids)


def _first_rank(node) -> int:
    while not isinstance(node, int):
        node = node[1][0]
    return node


def _collect(node, depth: int, by_depth: list) -> None:
    """Groups by their depth from the root: that is their level once normalize() pads short branches at
    the bottom (a shallow group keeps its place and gets singleton groups below it)."""
    if isinstance(node, int):
        return
    if len(by_depth) <= depth:
        by_depth.append([])
    by_depth[depth].append(node)
    for k in node[1]:
        _collect(k, depth + 1, by_depth)


def strip(node):
    """A labeled tree's ranks as nested lists."""
    return node if isinstance(node, int) else [strip(k) for k in node[1]]
