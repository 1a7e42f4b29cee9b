"""Machines kept compact: a description of identical nodes under regular switches (a node template, a node count,
switch fan-outs: topology/summit.json) is planned from its numbers, not from a graph of every device.

Every rank of a job plans at start-up, so expanding Summit's 4,608 nodes into 41,473 vertices on each of its
27,648 ranks (1.3 s) and walking them all (1.5 s) is start-up time for the whole job. Here the node template is
expanded once; where the ranks sit is a list of (node, ranks on it); the tree of ranks is its group sizes
(tree.Regular) when every node and switch holds alike, else nested lists built node by node; and each level is
priced by the same code as an expanded machine's (placement.hierarchy), on a *skeleton*: the template
expanded only for the first and the last occupied child of every switch. Groups of one level differ only in
whether they are whole or the last, partly filled one, so the skeleton has a group of every kind at every level
and prices each level as the whole machine does. The full graph is built the first time anything asks for it
(drawing, a dump, a placement the numbers cannot follow).
"""
from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import dataclass

from . import placement as placing
from .graph import Topology
from .tree import Regular, depth, normalize
from ..errors import TopologyError

_EXPANDED = ("graph", "_version", "_cache", "_templates", "_parent", "_kind", "_peer_edges")


def is_compact(d: dict) -> bool:
    """A description this module plans without expanding: identical nodes (a count, or names only), switches by
    fan-out (not by name), no placement, no host shared by every node."""
    nodes = d.get("nodes", 1)
    plain_nodes = isinstance(nodes, int) or all(set(n) <= {"name"} for n in nodes)
    switches = d.get("switches", [])
    return (plain_nodes and "placement" not in d and "host" not in d.get("node", {})
            and all("fanout" in s and "name" not in s for s in switches))


@dataclass(frozen=True)
class Occupancy:
    """Where ranks run on a compact machine: ``nodes[i]`` (ascending node numbers) holds ``counts[i]`` ranks, in
    rank order, each on the node's next free device. Reads as the list of every rank's device, built on demand."""

    machine: "CompactTopology"
    nodes: range | list
    counts: list

    def __len__(self) -> int:
        return self._offsets[-1]

    @functools.cached_property
    def _offsets(self) -> list[int]:
        return [0, *itertools.accumulate(self.counts)]

    def __getitem__(self, rank: int) -> str:
        if not 0 <= rank < len(self):
            raise IndexError(rank)
        i = bisect.bisect_right(self._offsets, rank) - 1
        return self.machine.device(self.nodes[i], rank - self._offsets[i])

    def __eq__(self, other) -> bool:  # equal to the list of the same devices
        return isinstance(other, (list, Occupancy)) and list(self) == list(other)

    def __iter__(self):
        for node, k in zip(self.nodes, self.counts):
            for j in range(k):
                yield self.machine.device(node, j)


class CompactTopology(Topology):
    """A Topology read from a compact description (``is_compact``). Answers capacity, place and hierarchy from
    the numbers; any other question expands the whole graph once, as ddl.topology.files would have."""

    def __init__(self, d: dict, expand):
        self.name = d.get("name", "machine")
        self.placement = None
        self._description, self._expand = d, expand
        self._template = d.get("node", {})
        nodes = d.get("nodes", 1)
        self._names = None if isinstance(nodes, int) else [n["name"] for n in nodes]
        self._count = nodes if isinstance(nodes, int) else len(nodes)
        self._format = d.get("hostnames", "node{index}")
        self._switches = d.get("switches", [])
        # nodes under one switch of each level (level 0: the node itself); that the fan-outs join every node
        # under one top switch, and that node names are distinct, ddl.topology.validate checked before
        self._span = [1]
        for s in self._switches:
            self._span.append(self._span[-1] * s["fanout"])
        self._check_names()
        first = self._skeleton([0, self._count - 1]).validate()
        node0 = self.node_name(0)
        self._local = [v[len(node0):] for v in placing.free_slots(first, first.devices(node0))]
        if not self._local:
            raise TopologyError(f"topology {self.name!r} has nowhere to run ranks (no GPUs and no slots)")
        self._patterns: dict[int, object] = {}

    def __getattr__(self, name: str):
        """The expanded graph's fields, built on first use."""
        if name not in _EXPANDED:
            raise AttributeError(name)
        full = self._expand(self._description).validate()
        for field in _EXPANDED:
            setattr(self, field, getattr(full, field))
        return getattr(self, name)

    # -- names ------------------------------------------------------------------------------------------------

    def node_name(self, i: int) -> str:
        return self._names[i] if self._names is not None else self._format.format(index=i)

    def switch_name(self, level: int, i: int) -> str:
        """Switch i of ``level`` (1: the leaf switches)."""
        s = self._switches[level - 1]
        return s.get("names", s["level"] + "{index}").format(index=i)

    def device(self, node: int, j: int) -> str:
        """The j-th free device (GPU or slot) of node ``node``."""
        return self.node_name(node) + self._local[j]

    def _check_names(self) -> None:
        """What only a full expansion would otherwise find: a switch named like a node (or another switch)."""
        samples = {}
        for level in range(len(self._span)):
            many = self._count if level == 0 else math.ceil(self._count / self._span[level])
            for i in sorted(i for i in {0, 1, many - 1} if i < many):
                name = self.node_name(i) if level == 0 else self.switch_name(level, i)
                if samples.setdefault(name, (level, i)) != (level, i):
                    raise TopologyError(f"vertex {name!r} is defined twice")

    # -- the planner's view -----------------------------------------------------------------------------------

    def capacity(self) -> int:
        return self._count * len(self._local)

    def place(self, hosts: list[str] | None = None, nranks: int | None = None):
        if self.placement is not None:  # given after loading: the expanded rules follow it
            return placing.place(self, hosts, nranks)
        per = len(self._local)
        if hosts is None:
            if nranks is None:
                raise TopologyError("place() needs the hosts of the ranks or a placement in the file")
            if nranks > self.capacity():
                raise TopologyError(f"topology {self.name!r} has {self.capacity()} GPUs or slots for {nranks} ranks")
            whole, rest = divmod(nranks, per)
            return Occupancy(self, range(whole + (1 if rest else 0)), [per] * whole + ([rest] if rest else []))
        index = {self.node_name(i): i for i in range(self._count)}
        nodes, counts = [], []
        for r, h in enumerate(hosts):
            i = index.get(h)
            if i is None or (nodes and i < nodes[-1]) or (counts and i == nodes[-1] and counts[-1] == per):
                return placing.place(self, hosts, nranks)  # out of node order or wrong: the expanded rules say
            if nodes and nodes[-1] == i:
                counts[-1] += 1
            else:
                nodes.append(i)
                counts.append(1)
        return Occupancy(self, nodes, counts)

    def hierarchy(self, ranks_placement) -> tuple:
        if not (isinstance(ranks_placement, Occupancy) and ranks_placement.machine is self):
            return placing.hierarchy(self, list(ranks_placement))
        occ = ranks_placement
        if len(occ) == 1:
            return [0], []
        kept = self._kept(occ)
        skeleton = self._skeleton([occ.nodes[p] for p in kept])
        where = [self.device(occ.nodes[p], j) for p in kept for j in range(occ.counts[p])]
        _, levels = placing.hierarchy(skeleton, where)
        tree = self._tree(occ)
        if depth(tree) != len(levels):  # not expected: the skeleton has every kind of group
            return placing.hierarchy(self, list(occ))
        return tree, levels

    def _kept(self, occ: Occupancy) -> list[int]:
        """Positions in ``occ`` of the nodes the skeleton keeps: under every switch, its first and last child."""
        nodes = occ.nodes

        def prune(lo: int, hi: int, level: int) -> list[int]:
            if level == 0:
                return [lo]
            span = self._span[level - 1]
            first_end = bisect.bisect_left(nodes, (nodes[lo] // span + 1) * span, lo, hi)
            last_start = bisect.bisect_left(nodes, nodes[hi - 1] // span * span, lo, hi)
            out = prune(lo, first_end, level - 1)
            return out + prune(last_start, hi, level - 1) if last_start > lo else out

        return prune(0, len(nodes), len(self._switches))

    def _skeleton(self, nodes: list[int]) -> Topology:
        """The machine with only ``nodes`` (ascending) expanded, under the switches above them."""
        from .files import _add_node

        t = Topology(self.name)
        top = len(self._switches)
        for level in range(top, 0, -1):
            s = self._switches[level - 1]
            for i in sorted({n // self._span[level] for n in nodes}):
                name = self.switch_name(level, i)
                if name not in t.graph:
                    parent = self.switch_name(level + 1, i * self._span[level] // self._span[level + 1]) \
                        if level < top else None
                    t.add(name, "switch", parent, s.get("uplink") if level < top else None, level=s["level"])
        for n in nodes:
            if self.node_name(n) not in t.graph:
                _add_node(t, {**self._template, "name": self.node_name(n)},
                          self.switch_name(1, n // self._span[1]) if top else None)
        return t

    def _pattern(self, k: int):
        """The tree of k ranks on one node, ranks 0..k-1, groups of one dropped (not padded)."""
        hit = self._patterns.get(k)
        if hit is None:
            t = self._skeleton([0])
            hit = self._patterns[k] = placing.strip(placing.labeled_tree(t, [self.device(0, j) for j in range(k)]))
        return hit

    def _tree(self, occ: Occupancy):
        """The normalized tree of ranks: a Regular where every node holds alike and every switch as many
        children as the others of its level, else nested lists."""
        sizes = self._regular_sizes(occ)
        if sizes is not None:
            return Regular(tuple(sizes))
        items, offset = [], 0
        for node, k in zip(occ.nodes, occ.counts):
            items.append((node, _shift(self._pattern(k), offset)))
            offset += k
        for level in range(1, len(self._span)):
            span = self._span[level]
            grouped = []
            for key, run in itertools.groupby(items, key=lambda item: item[0] // span):
                kids = [sub for _, sub in run]
                grouped.append((key * span, kids[0] if len(kids) == 1 else kids))
            items = grouped
        return normalize(items[0][1])

    def _regular_sizes(self, occ: Occupancy) -> list[int] | None:
        k = occ.counts[0]
        if any(c != k for c in occ.counts):
            return None
        sizes = _even_sizes(self._pattern(k))
        if sizes is None:
            return None
        units = occ.nodes
        for level in range(1, len(self._span)):
            counts, units = _children(units, self._span[level] // self._span[level - 1])
            if len(counts) != 1:
                return None
            if counts[0] > 1:
                sizes.append(counts[0])
        return sizes


def _children(units, fanout: int) -> tuple[list[int], range | list]:
    """Grouping ascending switch (or node) numbers ``units`` under their parents, ``fanout`` to a parent: the
    distinct numbers of children a parent has, and the parents. Arithmetic for a run of numbers."""
    if isinstance(units, range) and units.step == 1:
        lo, hi = units.start, units.stop
        first, last = lo // fanout, (hi - 1) // fanout
        if first == last:
            return [hi - lo], range(first, first + 1)
        counts = {(first + 1) * fanout - lo, hi - last * fanout} | ({fanout} if last - first > 1 else set())
        return sorted(counts), range(first, last + 1)
    parents = [u // fanout for u in units]
    counts = {len(list(run)) for _, run in itertools.groupby(parents)}
    return sorted(counts), sorted(set(parents))


def _shift(tree, offset: int):
    return tree + offset if isinstance(tree, int) else [_shift(t, offset) for t in tree]


def _even_sizes(tree) -> list[int] | None:
    """The group sizes, innermost first, of a tree whose every level is even and whose ranks are in order;
    else None."""
    if isinstance(tree, int):
        return []
    tree = normalize(tree)
    sizes = []
    t = tree
    while isinstance(t, list):
        sizes.append(len(t))
        t = t[0]
    sizes.reverse()
    if min(sizes) < 2 or Regular(tuple(sizes)).nested() != tree:
        return None
    return sizes
