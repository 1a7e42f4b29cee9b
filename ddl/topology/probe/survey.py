"""The probe's stages, given a way to measure a round: pure, so it runs against MPI (ddl.topology.probe.measure)
or against a simulated network in the tests."""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Callable

from .grouping import MARGIN, Flow, group
from .result import LEVEL_NAMES, BudgetSpent, Level, ProbeResult, utc_now
from .schedule import DEFAULT_WINDOW, patterns, round_flows

MAX_LEVELS = 6

Measure = Callable[[list[tuple[int, int]], int], list[Flow]]


def survey(hosts: list[str], measure: Measure, window: int = DEFAULT_WINDOW, repeats: int = 2,
           margin: float = MARGIN) -> ProbeResult:
    """Stages until one group holds everything: each runs its rounds (``repeats`` times each), groups its
    units, and the groups become the next stage's units. ``measure(flows, round)`` returns the flows measured;
    it raises ProbeError when it cannot (a host that does not answer, the budget spent). Where the budget runs
    out after a stage has formed groups, those stand: what is left is placed under one switch (less structure
    than the network may have, never a level that was not measured), and the notes say so."""
    units = [[i] for i in range(len(hosts))]
    subtrees: list = list(hosts)
    levels: list[Level] = []
    rounds = flows = 0
    notes = []
    for stage in range(MAX_LEVELS):
        if len(units) == 1:
            break
        measured: list[Flow] = []
        name = LEVEL_NAMES[min(stage, len(LEVEL_NAMES) - 1)] + ("" if stage < len(LEVEL_NAMES) else str(stage))
        try:
            for k, pattern in enumerate(patterns(len(units), window)):
                both = round_flows(units, pattern, window)
                # One direction per round: TCP's acknowledgements then never queue behind the other
                # direction's data on a shaped link (measured: bidirectional rounds halved some flows on a
                # flat emulated switch). Every flow of a round still crosses its boundaries the same way.
                for pairs in (both[0::2], both[1::2]):
                    for _ in range(repeats):
                        measured += [replace(f, pattern=k) for f in measure(pairs, rounds)]
                        rounds += 1
                        flows += len(pairs)
        except BudgetSpent as e:
            if not levels:  # no stage finished: nothing stands
                raise
            top = _unfinished_top(units, measured, margin, levels[-1], name)
            cut = (f"{e} in stage {stage}: the {len(units)} groups the stages before it found are placed under "
                   f"one switch ({top.name} {top.bandwidth * 8 / 1e6:.0f} Mbit/s "
                   f"{'from its rounds so far' if measured else 'assumed as fast as the level below'})")
            # used by this job, measured afresh by the next (a cached result marked doubtful is not reused)
            return ProbeResult(sorted(hosts), subtrees, levels + [top], 0.0, rounds, flows, notes + [cut],
                               doubtful=f"{utc_now()}: {cut}")
        g = group(units, measured, margin)
        capacity = [c for c in g.capacity if c > 0] or [g.top]
        levels.append(Level(name, statistics.median(capacity), g.latency, len(g.groups)))
        if len(g.groups) in (1, len(units)):  # one group: the top; none formed: all share the top switch
            if len(g.groups) == len(units) and len(units) > 1:
                notes.append(f"stage {stage}: no units joined (all rates differ by more than x{margin}); "
                             f"they are placed under one switch")
            return ProbeResult(sorted(hosts), subtrees if isinstance(subtrees, list) else [subtrees],
                               levels, 0.0, rounds, flows, notes)
        subtrees = [[subtrees[u] for u in grp] for grp in g.groups]
        units = [[h for u in grp for h in units[u]] for grp in g.groups]
    notes.append(f"stopped after {MAX_LEVELS} levels")
    return ProbeResult(sorted(hosts), subtrees, levels, 0.0, rounds, flows, notes)


def _unfinished_top(units: list, measured: list[Flow], margin: float, below: Level, name: str) -> Level:
    """The level of a stage the budget cut short: one group over ``units``, its figures from the rounds it ran
    (each unit's best capacity, as a finished stage's), or the level below's where it ran none."""
    g = group(units, measured, margin) if measured else None
    capacity = [c for c in g.capacity if c > 0] if g else []
    if not capacity:
        return Level(name, below.bandwidth, below.latency, 1)
    return Level(name, statistics.median(capacity), g.latency or below.latency, 1)
