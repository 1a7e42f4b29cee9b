"""IBM DDL's diagnostics: -check TOL (every result compared with MPI_Allreduce of the same input) and
-dump_iter N (rank 0 prints the mean time per allreduce every N calls, and per level and phase)."""
from __future__ import annotations

import sys

import numpy as np

from ..errors import DDLError
from .dtypes import FLOATING
from .timeline import phase_key, where


def check_against_mpi(mpi_comm, rank: int, size: int, tolerance: float, original: np.ndarray, result: np.ndarray,
                      op: str, call: str) -> None:
    """MPI_Allreduce of the same input on a copy; every rank raises on a difference beyond ``tolerance``."""
    from mpi4py import MPI

    if mpi_comm is None:
        raise DDLError("-check needs an MPI communicator to compare with")
    wide = original.astype(np.float64 if original.dtype.name in FLOATING else original.dtype).reshape(-1)
    ref = np.empty_like(wide)
    mpi_op = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[op]
    mpi_comm.Allreduce(wide, ref, op=mpi_op)
    if op == "avg":
        ref = ref / size
    got = result.reshape(-1).astype(ref.dtype)
    bad = np.abs(got - ref) > tolerance * np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
    nbad = int(np.count_nonzero(bad))
    worst = mpi_comm.allreduce((nbad, rank), op=MPI.MAXLOC)
    if worst[0]:
        raise DDLError(f"rank {rank}: -check {tolerance}: {call} differs from MPI_Allreduce in {worst[0]} "
                       f"elements on rank {worst[1]} (and {nbad} here)")


class CallTimer:
    """-dump_iter N: every N allreduce calls, rank 0 prints the mean time per call and, as IBM DDL's dump did
    per dimension, the mean time of each level's phases (ddl.core.timeline: from the first pipeline block
    entering a phase to the last leaving it; pipelined phases overlap, so they may add up to more)."""

    def __init__(self, every: int, rank: int, level_names: list[str] | None = None):
        self.every, self.rank, self.names = every, rank, level_names or []
        self.calls, self.seconds = 0, 0.0
        self.phases: dict[tuple[int, str], float] = {}

    def add(self, seconds: float, nbytes: int, call=None) -> list[str]:
        """Counts one call (``call``: its ddl.core.timeline.Call, when recorded); returns the lines printed."""
        self.calls += 1
        self.seconds += seconds
        for key, t in (call.phase_seconds() if call is not None else {}).items():
            self.phases[key] = self.phases.get(key, 0.0) + t
        if self.calls % self.every:
            return []
        lines = [f"[ddl] iter {self.calls}: allreduce {self.seconds / self.every * 1e6:.1f} us per call "
                 f"over the last {self.every} (last {nbytes} bytes)"]
        for (level, phase), t in sorted(self.phases.items(), key=lambda item: phase_key(*item[0])):
            lines.append(f"[ddl]   {where(level, self.names):<20} {phase:<18} {t / self.every * 1e6:10.1f} us per call")
        if self.rank == 0:
            print("\n".join(lines), file=sys.stderr)
        self.seconds, self.phases = 0.0, {}
        return lines

