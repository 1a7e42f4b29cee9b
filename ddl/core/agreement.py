"""The agreement round that starts every collective.

A recursive-doubling exchange in rank order whose messages carry a 64-bit hash of each rank's call (the
collective, shape, dtype, op, root, and the settings that shape the plan). Each receive merges the hashes by
max and -min, so afterwards every rank knows whether all ranks made the same call. When they did not, every
rank learns what each rank called (a fixed-size report per rank) and raises the same MismatchError; nothing
is reduced. Small payloads ride in the round itself. Every receive accepts the same fixed capacity, so a rank
with a different call can never overflow one.
"""
from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np

from .. import _native
from ..errors import DDLError, MismatchError
from ..schedule.algorithms import (ALLREDUCE, leader_allgather, leader_allreduce, leader_reduce_scatter,
                                   recursive_doubling_allreduce, scatter_layout)
from ..schedule.compile import CompiledPipeline, compile_blocks
from .dtypes import raw
from .plans import PlanCache

CAPACITY = 65536   # bytes of payload every agreement receive accepts, whatever a rank's own call
REPORT_BYTES = 512  # per rank, when ranks disagree and tell each other what they called
ROWS = "rows="      # an allgather's report starts with its row count
_HASH_CACHE = 1024


def hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


class Agreement:
    """One communicator's agreement rounds. ``execute(pipeline, buffer, RunOptions) -> agreed`` runs a plan on
    the communicator's executor; ``settings`` are the plan-shaping settings every call's hash includes;
    ``hosts`` (each rank's host, the same list on every rank) makes the round cross hosts once per host."""

    def __init__(self, rank: int, size: int, settings: str, plans: PlanCache, execute: Callable, timeout: float,
                 hosts: list[str] | None = None):
        self.rank, self.size, self.settings = rank, size, settings
        self.groups = host_groups(hosts) if hosts else None
        # the round's order of ranks (hosts, or rank order): an allgather's parts lie in it
        self.order = [r for g in self.groups for r in g] if self.groups else list(range(size))
        self._plans, self._execute, self._timeout = plans, execute, timeout
        self._hashes: dict[str, int] = {}
        self._options: dict[tuple, "_native.RunOptions"] = {}  # RunOptions are read-only to a run: made once
        self.host = None  # the host memory level (ddl.core.host), which runs the round where ranks share a host

    def describe(self) -> str:
        """The round's shape, as ddl.explain says it."""
        if self.host is not None:
            return "on the host memory level (one shared-memory segment)"
        if self.groups is not None:
            return (f"each host's ranks to its first rank, recursive doubling between the {len(self.groups)} "
                    f"first ranks, back down (one message per host and round between hosts)")
        return f"recursive doubling over the {self.size} ranks in rank order"

    def hash(self, call: str) -> int:
        h = self._hashes.get(call)
        if h is None:
            if len(self._hashes) > _HASH_CACHE:
                self._hashes.clear()
            h = self._hashes[call] = hash64(f"{call} | {self.settings}")
        return h

    def plan(self, count: int) -> CompiledPipeline:
        # Hosts or rank order, never the tree: ranks whose settings differ must still pair up to find out that
        # they do, and the hosts were gathered at start-up, the same on every rank whatever its settings.
        if self.groups is not None:
            algorithm, make = "leader", lambda n: leader_allreduce(self.rank, self.groups, n, keep_empty=True)
        else:
            algorithm, make = "recursive_doubling", lambda n: recursive_doubling_allreduce(self.rank, self.size, n,
                                                                                           keep_empty=True)
        return self._plans.get(("agree", count), lambda: compile_blocks(
            make, count, max(count, 1), 1, algorithm,
            ((-1, "agreement" if count == 0 else "agreement + data"),)))  # level -1: all ranks

    def gather_plan(self, part: int) -> CompiledPipeline:
        """The round of an allgather of ``part`` bytes a rank: plan()'s messages, each carrying only the parts
        its sender holds (ddl.schedule.algorithms.leader_allgather), the parts in ``order``."""
        hosts = self.groups or [[r] for r in range(self.size)]
        count = self.size * part
        return self._plans.get(("agree-gather", part), lambda: compile_blocks(
            lambda n: leader_allgather(self.rank, hosts, part), count, max(count, 1), 1, "leader allgather",
            ((-1, "agreement + gathered data"),)))

    def scatter_plan(self, counts: tuple[int, ...]) -> tuple[CompiledPipeline, list[tuple[int, int]]]:
        """The round of a reduce-scatter of parts ``counts`` (elements, in rank order): plan()'s messages, the
        whole reduced to each host's first rank and halved between them (ddl.schedule.algorithms.
        leader_reduce_scatter); and where each rank's part lies in its buffer."""
        hosts = self.groups or [[r] for r in range(self.size)]
        layout = scatter_layout(hosts, list(counts))
        plan = self._plans.get(("agree-scatter", counts), lambda: compile_blocks(
            lambda n: leader_reduce_scatter(self.rank, hosts, list(counts)), sum(counts), max(sum(counts), 1), 1,
            "leader reduce-scatter", ((-1, "agreement + data, halved"),)))
        return plan, layout

    def options(self, call: str, dtype, op, **extra) -> "_native.RunOptions":
        key = (call, dtype, op, *extra.items())
        made = self._options.get(key)
        if made is None:
            if len(self._options) > _HASH_CACHE:
                self._options.clear()
            made = self._options[key] = _native.RunOptions(dtype, op, self._timeout, call, header=self.hash(call),
                                                           capacity=CAPACITY, **extra)
        return made

    def agree(self, call: str, problem: str | None, work: np.ndarray | None = None,
              dtype=_native.DType.uint8, op=_native.ReduceOp.sum, factor: float = 1.0,
              rows: int | None = None) -> np.ndarray | None:
        """The round, reducing ``work`` (None: no payload; scaled by ``factor`` once reduced) in it. Raises on
        every rank if ranks disagree, or if they all agree on the same invalid call. An allgather's ``rows``:
        where its ride hashed the counts on some ranks, every rank's count comes back (report_mismatch)."""
        text = problem or call
        work = np.empty(0, np.uint8) if work is None else work
        if self.host is not None:
            try:
                agreed = self.host.native.allreduce(raw(work), raw(work), dtype, op, factor, work.nbytes,
                                                    self.hash(text), self._timeout, text)
            except MismatchError:  # (the others ran a broadcast ahead: they learn it at their next full step)
                if problem:
                    raise DDLError(f"rank {self.rank}: {problem}") from None
                raise
        else:
            agreed = self._execute(self.plan(work.size), raw(work), self.options(text, dtype, op, factor=factor))
        counted = None if agreed else self.report_mismatch(text, rows)
        if problem:
            raise DDLError(f"rank {self.rank}: {problem}")
        return counted

    def report_mismatch(self, mine: str, rows: int | None = None) -> np.ndarray:
        """All ranks are here together: exchange what each called and with which settings (fixed-size slots,
        summed in a plan that no setting can change), then raise the same MismatchError everywhere. An
        allgather's round hashes its row count too (``rows``): where every rank made that allgather and only
        the counts differ, they are returned (every rank's, in rank order) instead."""
        slots = np.zeros(self.size * REPORT_BYTES, dtype=np.uint8)
        before = self.host.native.history if self.host is not None else ""
        if before:  # the step checked the broadcasts that ran ahead of it too: they may be what differs
            mine = f"{mine} after {before}"
        text = ("" if rows is None else f"{ROWS}{rows} ") + f"{mine} | {self.settings}"
        text = text.encode()[:REPORT_BYTES]
        slots[self.rank * REPORT_BYTES:self.rank * REPORT_BYTES + len(text)] = np.frombuffer(text, np.uint8)
        words = slots.view(np.int64)
        plan = compile_blocks(lambda n: ALLREDUCE["ring"](self.rank, self.size, n), words.size, words.size, 1,
                              "ring")
        self._execute(plan, words, _native.RunOptions(_native.DType.int64, _native.ReduceOp.sum, self._timeout,
                                                      "ddl mismatch report"))
        reports = [slots[r * REPORT_BYTES:(r + 1) * REPORT_BYTES].tobytes().rstrip(b"\0").decode(errors="replace")
                   for r in range(self.size)]
        counted = [t.partition(" ")[0][len(ROWS):] if t.startswith(ROWS) else None for t in reports]
        reports = [t.partition(" ")[2] if n is not None else t for t, n in zip(reports, counted)]
        if None not in counted and len(set(reports)) == 1:
            return np.array([int(n) for n in counted], np.int64)  # uneven rows: a legal allgather
        calls = [t.split(" | ")[0] for t in reports]
        # Name the calls; only when every rank made the same call did the settings differ.
        keys = reports if len(set(calls)) == 1 else calls
        groups: dict[str, list[int]] = {}
        for r, k in enumerate(keys):
            groups.setdefault(k, []).append(r)
        detail = "; ".join(f"ranks {ranges(rs)}: {k}" for k, rs in groups.items())
        raise MismatchError(f"rank {self.rank}: ranks called ddl differently: {detail}", calls)


def host_groups(hosts: list[str]) -> list[list[int]] | None:
    """The ranks of each host, in order of their first rank, where the agreement round is better crossing
    hosts once per host: several hosts, one of them with several ranks. None: rank order it is."""
    groups: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        groups.setdefault(h, []).append(r)
    shaped = list(groups.values())
    return shaped if 1 < len(shaped) < len(hosts) else None


def ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'"""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(f"{start}-{r}" if r > start else f"{r}")
            start = None
    return ",".join(parts)
