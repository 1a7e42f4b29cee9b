"""Checking a cached probe result against the network before a job uses it.

Names stay while cabling, switches, NICs and a scheduler's placement change, so a cache keyed by host names can
describe another network than the job's. Before a cached tree is used, a few rounds test what it claims, each
one the cut that tells it from its nearest alternatives:

- inside every innermost group (hosts it says share a switch at full rate), the group's first half exchanges
  with its second half, member by member: a boundary the cache missed (clusters name hosts rack by rack, so it
  runs through the middle) slows these flows below the group's claimed rate;
- at every level above, each group's first half of children exchanges with its second half, member by member:
  the flows leaving a child share its uplink, and their total must match what the cache says that uplink (and
  the links under it) carries. A boundary that is gone, or an uplink that changed, shows here.

Each level runs both directions in rounds of their own (as the survey does) and ``repeats`` times: a handful of
short rounds, against a survey's dozens. The tree disagrees when a bottleneck's measured rate differs from the
predicted one by more than the grouping's noise margin (slower) or its square (faster). Pure, like ``survey``:
``measure`` runs the rounds over MPI (ddl.topology.probe.measure) or over a simulated network in the tests.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .grouping import MARGIN
from .result import ProbeResult
from .survey import Measure


@dataclass(frozen=True)
class Verdict:
    agrees: bool
    why: str            # the first disagreement, as the job reports it ("" when the tree agrees)
    rounds: int
    flows: int


def _shape(tree, depth: int, index: dict[str, int]):
    """The tree with host indices at its leaves, as (height, children) nodes; hosts are (0, index)."""
    if depth == 0:
        return 0, index[tree]
    return depth, [_shape(t, depth - 1, index) for t in tree]


def _hosts(node) -> list[int]:
    height, body = node
    return [body] if height == 0 else [h for kid in body for h in _hosts(kid)]


def _nodes_at(node, height: int) -> list:
    h, body = node
    if h == height:
        return [node]
    return [] if h < height else [n for kid in body for n in _nodes_at(kid, height)]


def level_pairs(root, level: int) -> list[tuple[int, int]]:
    """(a, b) host pairs of ``level``'s cut: in every group one level up, its first half of children paired with
    its second half, member by member (a host is in one pair at most)."""
    pairs = []
    for _, kids in _nodes_at(root, level + 1):
        half = len(kids) // 2
        for j in range(half):
            left, right = _hosts(kids[j]), _hosts(kids[j + half + len(kids) % 2])
            pairs += list(zip(left, right))
    return pairs


def _ancestors(root, depth: int) -> dict[tuple[int, int], int]:
    """(host, height) -> an id of the host's ancestor at that height (0: the host itself)."""
    out = {}
    for height in range(depth + 1):
        for k, node in enumerate(_nodes_at(root, height)):
            for h in _hosts(node):
                out[(h, height)] = k
    return out


def _uplink(node, senders: set[int], result: ProbeResult) -> float:
    """What the flows from ``senders`` can move out of ``node`` at once, by the cached tree: its own uplink,
    or less where the links under it carry less."""
    height, body = node
    own = result.levels[height].bandwidth
    if height == 0:
        return own if body in senders else 0.0
    return min(own, sum(_uplink(kid, senders, result) for kid in body))


def predicted(root, result: ProbeResult, level: int, pattern: list[tuple[int, int]]) -> dict[int, float]:
    """For a round of ``level``: the cached capacity (bytes/s) out of each sending child, by the child's id."""
    senders = {s for s, _ in pattern}
    return {k: _uplink(node, senders, result) for k, node in enumerate(_nodes_at(root, level))
            if senders & set(_hosts(node))}


def verify(result: ProbeResult, hosts: list[str], measure: Measure, repeats: int = 2,
           margin: float = MARGIN, expect=None) -> Verdict:
    """Runs the cut of every level (``hosts``: the leaders' order, which ``measure`` indexes) and compares each
    sending child's measured rate (its flows times the slowest: they start together with equal bytes) with
    the cached tree's prediction. ``expect(bytes_per_second)``, if given, hears each round's predicted rate per
    flow before it runs (to size the flows: a round across a slow uplink need not move a fast link's bytes)."""
    index = {h: i for i, h in enumerate(hosts)}
    root = _shape(result.tree, result.depth, index)
    ancestor = _ancestors(root, result.depth)
    rounds = flows = 0
    for level in range(result.depth):
        both = level_pairs(root, level)
        for pattern in (both, [(b, a) for a, b in both]):
            if not pattern:
                continue
            want = predicted(root, result, level, pattern)
            if expect is not None:
                per_flow = {k: c / sum(1 for a, _ in pattern if ancestor[(a, level)] == k) for k, c in want.items()}
                expect(min(per_flow.values()))
            best: dict[tuple[int, int], float] = defaultdict(float)
            for _ in range(repeats):
                for f in measure(pattern, rounds):
                    best[(f.src, f.dst)] = max(best[(f.src, f.dst)], f.rate)
                rounds += 1
                flows += len(pattern)
            out: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
            for s, d in pattern:
                out[ancestor[(s, level)]].append((best[(s, d)], s, d))
            for child, seen in out.items():
                rate, src, dst = min(seen)
                got, cached = len(seen) * rate, want[child]
                # (faster than predicted gets the margin twice: a short round's receivers start their clocks
                # after some bytes already left, which reads up to 1.6x fast across a shaped uplink)
                if not cached / margin <= got <= cached * margin * margin:
                    what = "a host's link" if level == 0 and len(seen) == 1 else f"{len(seen)} flow(s) out of " \
                        f"a group at level {result.levels[level].name}"
                    return Verdict(False, f"{hosts[src]} -> {hosts[dst]}: {what} moved "
                                          f"{got * 8 / 1e6:.0f} Mbit/s where the cached tree predicts "
                                          f"{cached * 8 / 1e6:.0f}", rounds, flows)
    return Verdict(True, "", rounds, flows)
