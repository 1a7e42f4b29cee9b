"""Grouping units by measured bandwidth: which of them see full bandwidth among themselves under load.

Noise on a shared machine only slows a flow, so each flow keeps its best repeat. Between two units, each round
pattern and direction that joined them gives the sum of its member flows (what the two groups exchange, whatever
their sizes), and the pair's rate is the lowest of those: the pair under the heaviest load it was measured in
(a rack uplink shows its oversubscription only in the rounds where several of the rack's hosts cross it at once). ``top`` is the median over units of each unit's best rate:
the full bandwidth under load. Groups join by complete linkage while the slowest rate between them stays
within ``margin`` of ``top``: a slower or shared path between racks cuts there, noise within the margin does not,
and a flat switch (every rate alike) comes out as one group. Units never measured against each other never
join directly.
"""
from __future__ import annotations

import heapq
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

MARGIN = 1.5  # a level boundary needs rates at least this much slower: a noisy 2-core machine stays inside it


@dataclass(frozen=True)
class Flow:
    """One measured flow of one round: bytes/s as the receiver saw them, and the pair's one-way latency."""
    round: int
    src: int
    dst: int
    rate: float
    latency: float = 0.0
    pattern: int = 0                 # the round's pattern: its repeats and both directions share it


@dataclass
class Grouping:
    groups: list[list[int]]          # unit indices per group, in unit order
    top: float                       # bytes/s: the full rate under load
    threshold: float                 # bytes/s: the slowest rate between two units of one group (top / margin)
    rates: dict = field(default_factory=dict)      # (unit a, unit b), a < b -> rate under the heaviest load
    capacity: list[float] = field(default_factory=list)  # per unit: most bytes/s it moved out in one round
    latency: float = 0.0             # seconds one way between units of one group (median)


def group(units: list[list[int]], flows: list[Flow], margin: float = MARGIN) -> Grouping:
    unit_of = {h: u for u, hosts in enumerate(units) for h in hosts}
    best_repeat: dict[tuple[int, int, int], float] = defaultdict(float)  # (src, dst, pattern) -> bytes/s
    lat_pair: dict[tuple[int, int], list[float]] = defaultdict(list)
    sent: dict[tuple[int, int], list[float]] = defaultdict(list)  # (unit, round) -> rates of its flows out
    for f in flows:
        a, b = unit_of[f.src], unit_of[f.dst]
        if a == b or f.rate <= 0:
            continue
        best_repeat[(f.src, f.dst, f.pattern)] = max(best_repeat[(f.src, f.dst, f.pattern)], f.rate)
        if f.latency > 0:
            lat_pair[(min(a, b), max(a, b))].append(f.latency)
        sent[(a, f.round)].append(f.rate)
    between: dict[tuple[int, int, int], float] = defaultdict(float)  # (unit a, unit b, pattern): a -> b
    for (src, dst, pattern), r in best_repeat.items():
        between[(unit_of[src], unit_of[dst], pattern)] += r
    rates: dict[tuple[int, int], float] = {}
    for (a, b, _), r in between.items():
        key = (min(a, b), max(a, b))
        rates[key] = min(rates.get(key, float("inf")), r)
    if not rates:
        return Grouping([list(range(len(units)))], 0.0, 0.0, {}, [0.0] * len(units))
    best: dict[int, float] = defaultdict(float)
    for (a, b), r in rates.items():
        best[a], best[b] = max(best[a], r), max(best[b], r)
    top = statistics.median(best.values())
    threshold = top / margin
    groups = _complete_linkage(len(units), rates, threshold)
    # A round's flows all carry the same bytes from a common start, so what a unit moved out is n flows over
    # the slowest one's time: n x the lowest rate. Summing rates would count a flow that finished early (TCP
    # is not fair on a shared uplink) as if it had kept its rate: 1.5-1.8x the uplink on the emulator.
    capacity = [0.0] * len(units)
    for (u, _), r in sent.items():
        capacity[u] = max(capacity[u], len(r) * min(r))
    member = {u: i for i, g in enumerate(groups) for u in g}
    lats = [statistics.median(v) for (a, b), v in lat_pair.items() if member[a] == member[b]]
    return Grouping(groups, top, threshold, rates, capacity, statistics.median(lats) if lats else 0.0)


def _complete_linkage(n: int, rates: dict, threshold: float) -> list[list[int]]:
    """Merges groups whose slowest measured rate between them is >= threshold, nearest in host order first
    (clusters name hosts rack by rack), then the highest mean rate. The order matters: a pair measured only
    under light load looks full even across a rack boundary, and merged first it would pull two racks'
    hosts together; merged after its neighbours it meets a whole rack, whose slow pairs keep it out. Groups
    keep (slowest, sum, count) to each neighbour and the span of their members, so a merge costs its
    neighbours, not n."""
    link: dict[int, dict[int, tuple]] = defaultdict(dict)
    for (a, b), r in rates.items():
        link[a][b] = link[b][a] = (r, r, 1)
    members = {u: [u] for u in range(n)}
    span = {u: (u, u) for u in range(n)}

    def entry(a, x):
        low, total, count = link[a][x]
        (a0, a1), (x0, x1) = span[a], span[x]
        return (max(0, x0 - a1, a0 - x1), -total / count, min(a, x), max(a, x), link[a][x], span[a], span[x])

    heap = [entry(a, b) for (a, b), r in rates.items() if r >= threshold]
    heapq.heapify(heap)
    while heap:
        _, _, a, b, seen, sa, sb = heapq.heappop(heap)
        if a not in members or b not in members or link[a].get(b) != seen or (span[a], span[b]) != (sa, sb):
            continue  # stale: a group merged since
        members[a] += members.pop(b)  # b joins a
        span[a] = (min(span[a][0], span.pop(b)[0]), max(span[a][1], sb[1]))
        for x, (low, total, count) in link.pop(b).items():
            del link[x][b]
            if x != a:
                old = link[a].get(x)
                link[a][x] = link[x][a] = (low, total, count) if old is None else \
                    (min(low, old[0]), total + old[1], count + old[2])
        for x in link[a]:
            if link[a][x][0] >= threshold:
                heapq.heappush(heap, entry(a, x) if a < x else entry(x, a))
    return sorted((sorted(m) for m in members.values()), key=lambda g: g[0])
