"""What the executor's clock saw, in a form people read: per call, one event per phase and pipeline block; the
per-level times of -dump_iter; the Chrome trace of DDL_TIMELINE (chrome://tracing, Perfetto: one process per
rank, one track per level and phase, as Horovod's timeline).

The mechanism: while recording, the native executor appends (block, round, start ns, end ns) for every round
it runs (``_native.Executor.record`` / ``take_spans``, on ``_native.clock_ns``); after each run the communicator
hands the spans here with the run's round labels (``ddl.planner.programs.round_phases``), and a Recorder keeps
the last calls in a ring. A flight recorder (the last few calls of a rank, dumped when something goes wrong) is
the same Recorder with a small ring.
"""
from __future__ import annotations

import collections
import json
import socket
import sys
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from ..errors import DDLError

PHASE_ORDER = {"agreement": -1, "agreement + data": -1, "reduce-scatter": 0, "allreduce": 1,
               "recursive doubling": 1, "allgather": 2}


def phase_key(level: int, phase: str) -> tuple:
    """How phases are listed: the agreement, reduce-scatters innermost first, the top, allgathers outermost
    first (the order a call runs them)."""
    return PHASE_ORDER.get(phase, 3), -level if phase == "allgather" else level, phase


@dataclass
class Event:
    level: int
    phase: str
    block: int
    start: int  # ns on the executor's clock
    end: int


@dataclass
class Call:
    name: str
    nbytes: int
    start: int
    end: int = 0
    events: list[Event] = field(default_factory=list)

    def phase_seconds(self) -> dict[tuple[int, str], float]:
        """Per (level, phase): from the first block entering it to the last leaving it. Pipelined phases
        overlap, so these may add up to more than the call."""
        spans: dict[tuple[int, str], list[int]] = {}
        for e in self.events:
            s = spans.setdefault((e.level, e.phase), [e.start, e.end])
            s[0], s[1] = min(s[0], e.start), max(s[1], e.end)
        return {k: (b - a) * 1e-9 for k, (a, b) in spans.items()}

    def to_list(self) -> list:
        return [self.name, self.nbytes, self.start, self.end,
                [[e.level, e.phase, e.block, e.start, e.end] for e in self.events]]

    @classmethod
    def from_list(cls, row: list) -> "Call":
        name, nbytes, start, end, events = row
        return cls(name, nbytes, start, end, [Event(*e) for e in events])


def events(spans, labels, default: str) -> list[Event]:
    """One event per block and phase: from the start of its first round to the end of its last. ``labels``:
    (level, phase) per round, rounds past the end labelled as the last; none: level 0, phase ``default``."""
    out: dict[tuple[int, int, str], Event] = {}
    for block, rnd, start, end in spans.tolist():
        level, phase = labels[min(rnd, len(labels) - 1)] if labels else (0, default)
        e = out.get((block, level, phase))
        if e is None:
            out[(block, level, phase)] = Event(level, phase, block, start, end)
        else:
            e.start, e.end = min(e.start, start), max(e.end, end)
    return sorted(out.values(), key=lambda e: (e.start, e.block))


class Recorder:
    """Keeps this rank's last ``calls`` calls with their events. begin/end bracket a call (its runs, the
    agreement round included, become its events); a run outside any call is a call of its own."""

    def __init__(self, executor, calls: int):
        self._executor = executor
        self.calls: collections.deque[Call] = collections.deque(maxlen=max(1, calls))
        self.dropped = 0  # spans the executor dropped past its bound (nobody took them)
        self._open: Call | None = None
        executor.record(True)

    def begin(self, name: str, nbytes: int) -> None:
        self._open = Call(name, nbytes, _native.clock_ns())

    def end(self) -> Call | None:
        call, self._open = self._open, None
        if call is not None:
            call.end = _native.clock_ns()
            self.calls.append(call)
        return call

    def ran(self, labels, default: str, name: str) -> None:
        spans, dropped = self._executor.take_spans()
        self.dropped += dropped
        got = events(spans, labels, default)
        if self._open is not None:
            self._open.events += got
        elif got:
            self.calls.append(Call(name, 0, min(e.start for e in got), max(e.end for e in got), got))

    def stop(self) -> None:
        self._executor.record(False)


# -- the Chrome trace -------------------------------------------------------------------------------------------


def rank_part(rank: int, host: str, origin: int, level_names: list[str], calls) -> dict:
    """One rank's share of the trace, as plain data (gathered to rank 0, which writes the file)."""
    return {"rank": rank, "host": host, "origin": origin, "levels": level_names,
            "calls": [c.to_list() for c in calls]}


def where(level: int, names: list[str]) -> str:
    """A level as people read it: "level 1 (rack)"; level -1 is all ranks in rank order (the agreement)."""
    if level < 0:
        return "all ranks"
    return f"level {level} ({names[level]})" if level < len(names) else f"level {level}"


def _track_name(level: int, phase: str, names: list[str], lane: int) -> str:
    return f"{where(level, names)} {phase}" + (f" #{lane + 1}" if lane else "")


def chrome_trace(parts: list[dict]) -> dict:
    """The trace: per rank (pid) a track of calls (tid 0) and one per level and phase, innermost
    reduce-scatter first; blocks that overlap in one phase go to further lanes of it (a track's events must
    nest). Times in microseconds from each rank's origin (taken right after a barrier at the start)."""
    out: list[dict] = []
    for part in sorted(parts, key=lambda p: p["rank"]):
        pid, origin, names = part["rank"], part["origin"], part["levels"]
        calls = [Call.from_list(c) for c in part["calls"]]
        out.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {pid} ({part['host']})"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        lanes: dict[tuple[int, str], list[int]] = {}   # (level, phase) -> end of the last event per lane
        placed: list[tuple[tuple[int, str, int], Event, Call]] = []
        for call in calls:
            out.append({"name": call.name, "cat": "call", "ph": "X", "pid": pid, "tid": 0,
                        "ts": (call.start - origin) / 1e3, "dur": (call.end - call.start) / 1e3,
                        "args": {"bytes": call.nbytes}})
            for e in sorted(call.events, key=lambda e: e.start):
                ends = lanes.setdefault((e.level, e.phase), [])
                lane = next((i for i, t in enumerate(ends) if t <= e.start), len(ends))
                if lane == len(ends):
                    ends.append(e.end)
                ends[lane] = e.end
                placed.append(((e.level, e.phase, lane), e, call))
        keys = sorted({k for k, _, _ in placed}, key=lambda k: (phase_key(k[0], k[1]), k[2]))
        tid = {k: i + 1 for i, k in enumerate(keys)}
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "calls"}})
        for k, t in tid.items():
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": t,
                        "args": {"name": _track_name(k[0], k[1], names, k[2])}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": t, "args": {"sort_index": t}})
        for k, e, call in placed:
            out.append({"name": e.phase, "cat": _track_name(e.level, e.phase, names, 0), "ph": "X", "pid": pid,
                        "tid": tid[k], "ts": (e.start - origin) / 1e3, "dur": (e.end - e.start) / 1e3,
                        "args": {"level": e.level, "block": e.block, "call": call.name}})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"producer": "ddl", "ranks": len(parts)}}


def write(path: str, parts: list[dict]) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(parts), f, separators=(",", ":"))


def write_gathered(comm, recorder: Recorder, path: str, origin: int, broken: bool) -> None:
    """DDL_TIMELINE at the end of a communicator: every rank's calls gathered to rank 0, which writes one Chrome
    trace. After a failure (or if the gathering fails) each rank writes its own part to <file>.rank<r> instead."""
    recorder.stop()  # the gathering is not part of the trace
    host = comm.hosts[comm.rank] if comm.hosts else socket.gethostname()
    part = rank_part(comm.rank, host, origin, [lv.name for lv in comm.levels], recorder.calls)
    if not broken:
        data = np.frombuffer(json.dumps(part).encode(), np.uint8)
        try:
            sizes = comm.allgather(np.array([data.size], np.int64))
            everything = comm.allgather(data)
        except DDLError as e:
            print(f"[ddl] rank {comm.rank}: timeline not gathered ({e})", file=sys.stderr)
        else:
            if comm.rank == 0:
                cuts = np.cumsum(sizes)[:-1]
                write(path, [json.loads(bytes(b)) for b in np.split(everything, cuts)])
            return
    own = f"{path}.rank{comm.rank}"
    write(own, [part])
    print(f"[ddl] rank {comm.rank}: timeline of this rank written to {own}", file=sys.stderr)
