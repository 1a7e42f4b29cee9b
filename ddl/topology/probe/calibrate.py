"""Calibrating a probe's levels: the bandwidth a level gives each child when an allreduce loads it.

The survey's rounds are built to tell levels apart: flows sized to keep its budget, one direction at a time,
a few flows per boundary. What a level gives a hierarchical allreduce is another figure: every host of a child
crosses the level at once, in both directions (a ring sends right while it receives from the left), for as long
as the buffer lasts. On the emulated three-tier cluster the survey's figures for the two outer levels ran 25-32 %
above that and the planner's predictions were as far off.

So once the tree is known, each level runs that load: in every group, host j of child i sends to host j of child
i + 1 (every group at once; a group of two in one direction, then the other), with flows sized to last
``seconds`` at the rate the survey found (three times its longest: a receiver that passes the round's barrier
late finds bytes already arrived, and reads a short flow fast), ``repeats`` times, each flow's median kept (a busy
2-core machine errs both ways: slower flows, skewed starts). A child moves its flows' count times the slowest
one's rate (they start together with equal bytes; TCP is not fair on a shared uplink); the level's figure is the
median over children. A level whose flows run as fast as the level below's is no boundary, whatever the survey
made of its noise, and goes (``separated``). Pure, like ``survey``: ``measure`` runs the rounds over MPI
(ddl.topology.probe.measure) or over a simulated network in the tests.
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import replace
from typing import Callable

from .grouping import MARGIN
from .result import LEVEL_NAMES, Level, ProbeResult
from .survey import Measure

SECONDS = 0.3  # per round: three times the survey's longest, so the leaders' skew at the start weighs less
REPEATS = 3


def level_load(tree, height: int, index: dict[str, int]) -> tuple[list[list[tuple[int, int]]], dict[int, tuple]]:
    """The rounds that load the level whose groups sit ``height`` lists above the hosts (1: the innermost
    groups): host j of child i to host j of child i + 1 in every group, every group at once; and each sending
    host's child. A group of two runs its two directions in rounds of their own, as the survey does (a pair's
    TCP acknowledgements then never queue behind the other direction's data on a shaped link)."""
    out, back, child_of = [], [], {}
    for n, g in enumerate(_at_height(tree, len_of(tree), height)):
        kids = [[index[h] for h in _hosts(c)] for c in g]
        if len(kids) < 2:
            continue
        for i, src in enumerate(kids):
            dst = kids[(i + 1) % len(kids)]
            for j in range(min(len(src), len(dst))):
                (back if len(kids) == 2 and i == 1 else out).append((src[j], dst[j]))
                child_of[src[j]] = (n, i)
    return [r for r in (out, back) if r], child_of


def calibrate(result: ProbeResult, hosts: list[str], measure: Measure, size_flows: Callable[[float], int],
              repeats: int = REPEATS, seconds: float = SECONDS, first_round: int = 0,
              margin: float = MARGIN) -> ProbeResult:
    """``result`` with every level's bandwidth measured under an allreduce's load (``how`` "calibrated").
    ``size_flows(nbytes)`` sizes the coming rounds' flows (the measure may cap them)."""
    index = {h: i for i, h in enumerate(hosts)}
    levels, rounds, flows = [], 0, 0
    per_flow: dict[int, float] = {}  # level -> a flow's rate across it (median)
    for k, level in enumerate(result.levels):
        load, child_of = level_load(result.tree, k + 1, index)
        if not load:
            levels.append(level)
            continue
        per_child = max(Counter(child_of.values()).values())  # flows out of the busiest child
        size_flows(level.bandwidth / per_child * seconds)
        seen: dict[tuple[int, int], list[float]] = {}
        for pattern in load:
            for _ in range(repeats):
                for f in measure(pattern, first_round + rounds):
                    seen.setdefault((f.src, f.dst), []).append(f.rate)
                rounds += 1
                flows += len(pattern)
        out: dict[tuple, list[float]] = {}
        for (src, _), rates in seen.items():
            out.setdefault(child_of[src], []).append(statistics.median(rates))
        per_flow[k] = statistics.median(r for rates in out.values() for r in rates)
        capacity = [len(r) * min(r) for r in out.values() if min(r) > 0]
        if not capacity:
            levels.append(level)
            continue
        levels.append(replace(level, bandwidth=statistics.median(capacity), how="calibrated"))
    text = ", ".join(f"{a.name} {a.bandwidth * 8 / 1e6:.0f} -> {b.bandwidth * 8 / 1e6:.0f} Mbit/s"
                     for a, b in zip(result.levels, levels) if b.how == "calibrated")
    notes = result.notes + ([f"calibrated under an allreduce's load: {text}"] if text else [])
    tree, levels, dropped = separated(result.tree, levels, per_flow, margin)
    return replace(result, tree=tree, levels=levels, rounds=result.rounds + rounds, flows=result.flows + flows,
                   notes=notes + dropped)


def separated(tree, levels: list[Level], per_flow: dict[int, float], margin: float = MARGIN):
    """(tree, levels, notes) without the levels that noise made: a boundary is real only where a flow crossing
    it runs at least ``margin`` times slower than one crossing the level below (an uplink shared by the child's
    hosts, or slower). Where a level's flows run as fast as the level below's, the groups below it inside each
    of its groups are one group (a rack split in two by noise; racks joined in twos by noise under a switch that
    joins them all): the lower boundaries go, with the level's figure; the level below keeps its own."""
    notes = []
    k = 1
    while k < len(levels):
        inner, outer = per_flow.get(k - 1), per_flow.get(k)
        if inner is None or outer is None or outer * margin <= inner:
            k += 1
            continue
        notes.append(f"level {levels[k].name} dropped: a flow across it ran at {outer * 8 / 1e6:.0f} Mbit/s, within "
                     f"x{margin:g} of one across {levels[k - 1].name} ({inner * 8 / 1e6:.0f} Mbit/s): not a boundary")
        tree = _merge_groups_below(tree, len(levels), k)
        levels = levels[:k] + levels[k + 1:]
        per_flow = {(j if j < k else j - 1): r for j, r in per_flow.items() if j != k}
        k = max(1, k - 1)
    names = [LEVEL_NAMES[min(j, len(LEVEL_NAMES) - 1)] for j in range(len(levels))] if notes else \
        [lv.name for lv in levels]
    levels = [replace(lv, name=name, groups=len(_at_height(tree, len(levels), j + 1)))
              for j, (lv, name) in enumerate(zip(levels, names))]
    return tree, levels, notes


def _merge_groups_below(tree, height: int, k: int):
    """Each group of level ``k`` (``k + 1`` lists above the hosts) made of its grandchildren: the groups of
    level k - 1 inside it become one."""
    if height == k + 1:
        return [grand for child in tree for grand in child]
    return [_merge_groups_below(t, height - 1, k) for t in tree]


def len_of(tree) -> int:
    """Lists from the root down to a host."""
    n = 0
    while isinstance(tree, list):
        tree, n = tree[0], n + 1
    return n


def _at_height(tree, height: int, want: int) -> list:
    if height == want:
        return [tree]
    return [g for t in tree for g in _at_height(t, height - 1, want)]


def _hosts(tree) -> list[str]:
    return [tree] if isinstance(tree, str) else [h for t in tree for h in _hosts(t)]
