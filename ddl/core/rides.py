"""Small broadcasts, allgathers and reduce-scatters that ride in the agreement round, worked out once per call.

Off the host memory level, a collective small enough to ride in the agreement round (ddl.core.agreement) runs
the same round on every call of one signature: the same plan and options, the same layout of its payload. The
first call (Python's long path, with its checks and refusals) makes the call's Ride; later calls of plain
C-contiguous numpy arrays fill the Ride's buffer, run the round and copy the answer out. Between two ranks
that is about 4 us of Python where the long path took 9-12, and ranks that share cores (8 ranks on 2 in the
emulated clusters) pay that difference several times over.

An allgather's round sends every rank's part once (ddl.schedule.algorithms.leader_allgather), not the whole
gathered vector summed through every round; a reduce-scatter's halves the vector between hosts
(leader_reduce_scatter), in a layout of its own.

A Ride's buffer is reused: it is only touched under the communicator's lock, and answers are copied out of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..schedule.compile import CompiledPipeline
from .dtypes import raw


@dataclass(eq=False)
class Ride:
    text: str                     # the call, as MismatchError names it
    plan: CompiledPipeline        # the agreement round's, with this payload
    options: object               # _native.RunOptions: the call's hash as the header
    buffer: np.ndarray            # what the round runs on (int64 words summed, or the reduce-scatter's whole as
                                  # the executor takes it)
    mine: np.ndarray | None       # where this rank's input goes in it (None: nowhere, or the executor copies it)
    answer: np.ndarray            # the answer's view of it (allgather: every rank's part, in the round's order)
    runs: tuple = ()              # a reduce-scatter's input pieces where the round lays parts out otherwise:
                                  # (buffer offset, input offset, elements)


def words(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(int64 words, their first ``nbytes`` bytes), zeroed: bytes that one rank writes and every other leaves
    zero add up to themselves (no bits in common, no carries), so a sum of words moves bytes."""
    buffer = np.zeros(-(-nbytes // 8), np.int64)
    return buffer, buffer.view(np.uint8)[:nbytes]


def broadcast(text: str, plan, options, shape: tuple, dtype: np.dtype, is_root: bool) -> Ride:
    """Root's bytes, zeros elsewhere, summed."""
    buffer, payload = words(math.prod(shape) * dtype.itemsize)
    typed = payload.view(dtype).reshape(shape)
    return Ride(text, plan, options, buffer, typed if is_root else None, typed)


def allgather(text: str, plan, options, shape: tuple, dtype: np.dtype, position: int, size: int) -> Ride:
    """Every rank's part at its ``position`` in the round's order of ranks (agreement.order); the round hashes
    this rank's row count with the call, so when it agrees every rank has this rank's rows."""
    nbytes = math.prod(shape) * dtype.itemsize
    buffer = np.empty(size * nbytes, np.uint8)
    parts = buffer.view(dtype).reshape((size,) + shape)
    return Ride(text, plan, options, buffer, parts[position], parts)


def reduce_scatter(text: str, plan, options, shape: tuple, dtype: np.dtype, layout: list[tuple[int, int]],
                   rows: int, rank: int) -> Ride:
    """The whole reduced and halved in the round, every rank's part (``layout``: elements, per rank) where the
    round leaves it; this rank's ``rows`` are the answer. Where the layout is not rank order, the input goes in
    as pieces (``runs``); otherwise the executor copies it in whole."""
    whole = np.empty(sum(n for _, n in layout), dtype)
    at, n = layout[rank]
    runs, start = [], 0
    for r in range(len(layout)):  # (buffer offset, input offset, elements), contiguous pieces merged
        offset, count = layout[r]
        if runs and runs[-1][0] + runs[-1][2] == offset and runs[-1][1] + runs[-1][2] == start:
            runs[-1][2] += count
        elif count:
            runs.append([offset, start, count])
        start += count
    runs = [] if len(runs) <= 1 and (not runs or runs[0][0] == 0) else [tuple(r) for r in runs]
    return Ride(text, plan, options, raw(whole), None, whole[at:at + n].reshape((rows,) + tuple(shape[1:])),
                tuple(runs))
