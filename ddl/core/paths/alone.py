"""The path of a job of one rank: every collective's result is its input (an average over one rank included).

Serves every collective but alltoall (whose own checks of its row counts the planned path keeps) when the
communicator has one rank; first after the device path, since nothing of the others applies to one rank. An
invalid call raises here at once: there is nobody to tell.
"""
from __future__ import annotations

import numpy as np

from ...errors import DDLError


class Alone:
    name = "alone"
    serves = frozenset(("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier"))
    first = True   # (no other path can stand in for it, whatever DDL_PATH says)
    native = True  # its known calls are found and run natively (ddl._native.ShortCalls without a segment) ...
    repeats = frozenset(("allreduce", "broadcast", "allgather", "reduce_scatter"))  # ... or by ``again``

    def __init__(self, comm):
        self.comm = comm

    def takes(self, call) -> str | None:
        return "one rank: the result is the input" if self.comm.size == 1 else None

    def run(self, call):
        if call.problem:
            raise DDLError(f"rank {self.comm.rank}: {call.problem}")
        if call.collective == "barrier":
            return None
        a, out = call.array, call.out
        if out is None:
            return np.array(a, order="C")
        if out is not a:
            np.copyto(out, a)
        return out

    def again(self, known, array: np.ndarray, out) -> np.ndarray:
        if out is None:
            return array.copy()
        if out is not array:
            np.copyto(out, array)
        return out
