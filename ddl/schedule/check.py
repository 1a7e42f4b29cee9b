"""Symbolic checker: proves, without MPI, that a schedule does what its collective promises.

It tracks, for every rank and every element interval, the set of ranks whose input that interval holds (a
bitmask). Semantics, matching the executor: within a round every send reads the state from before the round;
receives are applied when the round ends; a reduce must add contributions not already present (each exactly
once); a copy replaces. A message carries a range to the same range on the receiver.

Postconditions: allreduce, every rank holds every contribution in every element; broadcast, every rank holds
the root's; allgather, piece j of the layout holds exactly rank j's input on every rank; reduce_scatter, rank j
holds every contribution in piece j (what it holds elsewhere is scratch).
"""
from __future__ import annotations

import bisect
from collections import defaultdict

from ..errors import DDLError
from .ir import Collective, Op, Schedule


class ScheduleError(DDLError):
    """A schedule breaks its postcondition or the IR's rules."""


def _intervals(schedule: Schedule) -> list[int]:
    points = {0, schedule.count}
    for prog in schedule.programs:
        for s in prog.steps:
            points.update((s.offset, s.offset + s.count))
    for off, n in schedule.layout:
        points.update((off, off + n))
    return sorted(points)


def check(schedule: Schedule) -> None:
    """Raises ScheduleError naming the rank, round and step that go wrong; returns None if the schedule holds."""
    if len(schedule.programs) != schedule.nranks:
        raise ScheduleError(f"{len(schedule.programs)} programs for {schedule.nranks} ranks")
    cells = _Cells(schedule)
    state = _initial_state(schedule, cells)
    for rnd, steps in enumerate(_steps_by_round(schedule)):
        _apply_round(rnd, steps, state, cells)
    _verify_end(schedule, state, cells)


class _Cells:
    """The element intervals no step boundary cuts: the checker's unit of state."""

    def __init__(self, schedule: Schedule):
        self.bounds = _intervals(schedule)
        self.count = len(self.bounds) - 1

    def of(self, off: int, cnt: int) -> range:
        return range(bisect.bisect_left(self.bounds, off), bisect.bisect_left(self.bounds, off + cnt))


def _initial_state(schedule: Schedule, cells: _Cells) -> list[list[int]]:
    """Per rank and cell, the bitmask of ranks whose input it holds before round 0."""
    state = []
    for r in range(schedule.nranks):
        if schedule.collective in (Collective.ALLREDUCE, Collective.REDUCE_SCATTER):
            state.append([1 << r] * cells.count)
        elif schedule.collective is Collective.BROADCAST:
            state.append([1 << r if r == schedule.root else 0] * cells.count)
        else:
            row = [0] * cells.count
            for c in cells.of(*schedule.layout[r]):
                row[c] = 1 << r
            state.append(row)
    return state


def _steps_by_round(schedule: Schedule) -> list[list[tuple[int, object]]]:
    """Every (rank, step), grouped by round, after the IR's per-step rules (peer, range, round) hold."""
    p, n = schedule.nranks, schedule.count
    rounds = max((prog.rounds for prog in schedule.programs), default=0)
    by_round: list[list[tuple[int, object]]] = [[] for _ in range(rounds)]
    for r, prog in enumerate(schedule.programs):
        if prog.rank != r:
            raise ScheduleError(f"program {r} says it is rank {prog.rank}")
        for s in prog.steps:
            if not (0 <= s.peer < p) or s.peer == r:
                raise ScheduleError(f"rank {r} round {s.round}: bad peer {s.peer}")
            if s.offset < 0 or s.count <= 0 or s.offset + s.count > n:
                raise ScheduleError(f"rank {r} round {s.round}: range {s.offset}+{s.count} outside 0..{n}")
            if not 0 <= s.round < prog.rounds:
                raise ScheduleError(f"rank {r}: step in round {s.round} of {prog.rounds}")
            by_round[s.round].append((r, s))
    return by_round


def _apply_round(rnd: int, steps, state: list[list[int]], cells: _Cells) -> None:
    """Matches the round's sends with receives, then applies every receive to the state from before it."""
    sends, recvs = defaultdict(list), defaultdict(list)
    for r, s in steps:
        (sends[(r, s.peer)] if s.op is Op.SEND else recvs[(s.peer, r)]).append(s)
    if set(sends) != set(recvs):
        pair = sorted(set(sends) ^ set(recvs))[0]
        raise ScheduleError(f"round {rnd}: messages from rank {pair[0]} to rank {pair[1]} have no partner")
    written = defaultdict(dict)
    updates = []
    for (src, dst), out in sends.items():
        ins = recvs[(src, dst)]
        if len(out) != len(ins):
            raise ScheduleError(f"round {rnd}: rank {src} sends {len(out)} messages to rank {dst}, "
                                f"which receives {len(ins)}")
        for a, b in zip(out, ins):
            if (a.offset, a.count, a.tag) != (b.offset, b.count, b.tag):
                raise ScheduleError(f"round {rnd}: rank {src} sends {a.offset}+{a.count} (tag {a.tag}) but "
                                    f"rank {dst} receives {b.offset}+{b.count} (tag {b.tag})")
            cs = cells.of(b.offset, b.count)
            # Reductions into one range may share a round (the executor applies them one at a time);
            # a copy may not overlap anything else received in its round.
            kind = "reduce" if b.op is Op.RECV_REDUCE else "copy"
            if any(written[dst].get(c, kind) != kind or kind == "copy" and c in written[dst] for c in cs):
                raise ScheduleError(f"round {rnd}: rank {dst} receives overlapping ranges")
            written[dst].update((c, kind) for c in cs)
            updates.append((src, dst, b, cs, [state[src][c] for c in cs]))  # read before any receive applies
    for src, dst, step, cs, payload in updates:
        for c, got in zip(cs, payload):
            if not got:
                raise ScheduleError(f"round {rnd}: rank {src} sends undefined data to rank {dst}")
            if step.op is Op.RECV_REDUCE:
                if state[dst][c] & got:
                    raise ScheduleError(f"round {rnd}: rank {dst} would count contributions "
                                        f"{_ranks(state[dst][c] & got)} twice (from rank {src})")
                state[dst][c] |= got
            else:
                state[dst][c] = got


def _verify_end(schedule: Schedule, state: list[list[int]], cells: _Cells) -> None:
    full = (1 << schedule.nranks) - 1
    for r in range(schedule.nranks):
        # (a reduce-scatter promises rank r its own piece only)
        checked = cells.of(*schedule.layout[r]) if schedule.collective is Collective.REDUCE_SCATTER else \
            range(cells.count)
        for c in checked:
            want = _expected(schedule, cells.bounds, c, full)
            if state[r][c] != want:
                raise ScheduleError(f"rank {r} ends with contributions {_ranks(state[r][c])} in elements "
                                    f"{cells.bounds[c]}..{cells.bounds[c + 1]}, expected {_ranks(want)}")


def _expected(schedule: Schedule, bounds: list[int], c: int, full: int) -> int:
    if schedule.collective in (Collective.ALLREDUCE, Collective.REDUCE_SCATTER):
        return full
    if schedule.collective is Collective.BROADCAST:
        return 1 << schedule.root
    for j, (off, cnt) in enumerate(schedule.layout):
        if off <= bounds[c] and bounds[c + 1] <= off + cnt:
            return 1 << j
    return 0


def _ranks(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]
