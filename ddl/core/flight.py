"""The flight recorder: every rank keeps its communicators' last native runs (the agreement round and the data
run of each collective) in a ring, always, and writes them out when something goes wrong: a deadline or a
failed peer (the communicator writes it before raising), or SIGUSR1 (``kill -USR1`` a rank that seems stuck).
Written only where DDL_FLIGHT_RECORDER names a folder: ``rank<R>.json`` per rank, read by ``ddl-trace``
(ddl.tools.trace), which says who was behind and where.

A run's record: its number on the communicator (the same run has the same number on every rank, because
every rank runs the same sequence of agreement and data runs), its label (the call, as the mismatch reports
name it), bytes, start and end on the executor's clock (``_native.clock_ns``, the timeline's), and for a
failed run its algorithm, the error and, parsed from it, the peer waited on and the round, level and phase
reached. The executor keeps the ring (benchmarks/flight_recorder.py: no cost measurable at 8 B);
DDL_FLIGHT_RECORDER_RUNS sets its size (0: no recorder).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import weakref
from pathlib import Path

from .. import _native
from .timeline import where

FORMAT = 1

# the executor's deadline message (native/src/executor.cpp, fail())
_WAITING = re.compile(r"waiting on (send|receive \(\w+\)) (?:to|from) rank (\d+) \((\d+) bytes, round (\d+), "
                      r"block (\d+)\)")


class FlightRecorder:
    """One communicator's ring of runs, kept by its executor (``keep_runs``: two clock reads and a string copy
    per run, in C++). Python adds, for a failed run only, what its error says (``failed``)."""

    STATES = ("running", "done", "failed")

    def __init__(self, executor, rank: int, size: int, levels: list[str], runs: int = 64,
                 members: list[int] | None = None):
        self.rank, self.size, self.levels = rank, size, levels
        self.members = list(members) if members is not None else list(range(size))  # world ranks, by rank
        self._executor = executor
        executor.keep_runs(max(2, runs))
        self.details: dict[int, dict] = {}  # seq -> what a failed run's error says
        self.key = _register(self)

    def failed(self, error: BaseException, algorithm: str, phases) -> None:
        """The run that just failed (the last one the executor began)."""
        kept = self._executor.runs()
        if kept:
            self.details[kept[-1][0]] = {"algorithm": algorithm,
                                         **failure_detail(str(error), phases, self.levels)}

    def runs(self) -> list[dict]:
        """The kept runs, oldest first, as the files hold them."""
        return [{"seq": seq, "label": label, "bytes": nbytes, "start_ns": start, "end_ns": end,
                 "state": self.STATES[state], **self.details.get(seq, {})}
                for seq, label, nbytes, start, end, state in self._executor.runs()]

    def to_dict(self) -> dict:
        return {"communicator": self.key, "rank": self.rank, "size": self.size, "members": self.members,
                "levels": self.levels, "runs": self.runs()}


def failure_detail(message: str, phases, levels: list[str]) -> dict:
    """What a failed run's error says: the peer it waited on, and the round with its level and phase."""
    out: dict = {"error": message}
    m = _WAITING.search(message)
    if m:
        kind, peer, nbytes, rnd, block = m.groups()
        out.update(waiting_on=int(peer), waiting_for=kind, round=int(rnd), block=int(block),
                   message_bytes=int(nbytes))
        if phases:
            level, phase = phases[min(int(rnd), len(phases) - 1)]
            out["step"] = f"round {rnd}: {where(level, levels)} {phase}"
    return out


# -- every live recorder of this process, and writing them ------------------------------------------------------

_LIVE: "weakref.WeakValueDictionary[str, FlightRecorder]" = weakref.WeakValueDictionary()
_LOCK = threading.Lock()
_MADE: dict[tuple, int] = {}  # communicators made so far over each set of world ranks


def _register(recorder: FlightRecorder) -> str:
    """The communicator's name, the same on all its ranks: its world ranks and how many communicators over
    exactly those ranks this process made before it (creation is collective over them, so they agree)."""
    from .agreement import ranges

    members = tuple(recorder.members)
    with _LOCK:
        ordinal = _MADE.get(members, 0)
        _MADE[members] = ordinal + 1
        key = f"ranks {ranges(sorted(members))} #{ordinal}"
        _LIVE[key] = recorder
    return key


def forget(recorder: FlightRecorder) -> None:
    """A closed communicator's ring is no longer written."""
    with _LOCK:
        if _LIVE.get(recorder.key) is recorder:
            del _LIVE[recorder.key]


def runs_kept(environ=os.environ) -> int:
    from .. import config

    return config.get_whole("DDL_FLIGHT_RECORDER_RUNS", environ, 0, " of runs (0: none)")


def folder(environ=os.environ) -> str | None:
    from .. import config

    return config.get("DDL_FLIGHT_RECORDER", environ) or None


def dump(reason: str, environ=os.environ) -> Path | None:
    """Writes this process's recorders to DDL_FLIGHT_RECORDER/rank<R>.json (R: the world rank); returns the
    file, or None where no folder is set or there is nothing to write."""
    where_to = folder(environ)
    with _LOCK:
        recorders = sorted(_LIVE.values(), key=lambda r: r.key)
    if not where_to or not recorders:
        return None
    rank = recorders[0].members[recorders[0].rank]
    data = {"format": FORMAT, "rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "reason": reason,
            "clock_ns": _native.clock_ns(), "communicators": [r.to_dict() for r in recorders]}
    path = Path(where_to) / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".json.{os.getpid()}.tmp")
    partial.write_text(json.dumps(data, indent=1))
    partial.replace(path)  # a reader never sees half a file
    return path


_HANDLER = [False]


def install_signal_handler() -> None:
    """SIGUSR1 writes the recorders (then runs any handler that was there before). Main thread only: where
    ddl is initialised from another thread, there is no handler (a Python rule)."""
    if _HANDLER[0] or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGUSR1"):
        return
    before = signal.getsignal(signal.SIGUSR1)

    def on_usr1(signum, frame):
        dump("SIGUSR1")
        if callable(before):
            before(signum, frame)

    signal.signal(signal.SIGUSR1, on_usr1)
    _HANDLER[0] = True
