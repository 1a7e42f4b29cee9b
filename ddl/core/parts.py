"""A reduce-scatter's or an allgather's buffer, staged for the plans of ddl.planner.per_level: the parts in
position order, cut into pipeline blocks.

Block b holds the b-th piece of every part, in position order, each piece ``piece`` elements long; a part
shorter than the others is padded at its end (a few elements: pieces are its length over the blocks, rounded
up). So every block has the same layout and runs one program, and the levels pipeline over the blocks like an
allreduce's. The native run copies each block's pieces in just before the block starts and out as soon as it
ends, overlapping other blocks' transfers; the links carry nothing extra.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _native
from ..planner.per_level import Grid, scatter_program
from ..planner.model import level_rounds
from ..schedule.compile import CompiledPipeline, native_program


def split_rows(length: int, size: int, counts=None) -> list[int]:
    """Rows per rank of a reduce-scatter along a first dimension of ``length``: ``counts`` when given, else as
    even as can be, the first ranks one row more (numpy.array_split's, Horovod's reducescatter's)."""
    if counts is not None:
        return [int(n) for n in counts]
    return [length // size + (r < length % size) for r in range(size)]


@dataclass(frozen=True)
class PartsPlan:
    """One rank's compiled pipeline for a reduce-scatter or allgather of parts ``counts`` (elements, rank
    order), and where each rank's part sits in the staged buffer."""

    compiled: CompiledPipeline
    counts: tuple[int, ...]
    positions: tuple[int, ...]   # rank -> position
    nblocks: int
    piece: int                   # elements of one part in one block

    @property
    def algorithm(self) -> str:
        return self.compiled.algorithm

    @property
    def block_elems(self) -> int:
        return self.compiled.block_elems

    @property
    def inflight(self) -> int:
        return self.compiled.inflight

    @property
    def extent(self) -> int:
        return self.nblocks * len(self.counts) * self.piece

    @property
    def padded(self) -> bool:
        return any(c != self.nblocks * self.piece for c in self.counts)

    @property
    def in_rank_order(self) -> bool:
        """Whether the staged buffer is the parts concatenated in rank order (one block, no padding, positions
        the ranks): then the caller's own buffer can be the staged one."""
        return self.nblocks == 1 and not self.padded and self.positions == tuple(range(len(self.counts)))

    def staged(self, dtype, scratch: "Scratch") -> np.ndarray:
        """The staging buffer, uninitialized: the native run fills it block by block, padding zeroed
        (_native.Executor.run_parts)."""
        return scratch.get(self.extent, dtype)

    def put(self, staged: np.ndarray, rank: int, part: np.ndarray) -> None:
        """Writes ``part`` (rank ``rank``'s, flat) into its pieces."""
        pieces, full, rest = self._pieces(staged, rank), *divmod(self.counts[rank], self.piece or 1)
        pieces[:full] = part[:full * self.piece].reshape(full, self.piece)
        if rest:
            pieces[full, :rest] = part[full * self.piece:]

    def _pieces(self, staged: np.ndarray, rank: int) -> np.ndarray:
        """Rank ``rank``'s pieces: a (blocks, piece) view of the staged buffer."""
        return staged.reshape(self.nblocks, len(self.counts), self.piece)[:, self.positions[rank], :]


class Scratch:
    """One communicator's staging memory, kept between calls up to ``keep_bytes``: a fresh buffer per call
    costs its page faults every time (6 ms for 16 MiB here, paid by every rank, four times over where ranks
    outnumber cores), more than the copies themselves. Used under the communicator's lock only."""

    def __init__(self, keep_bytes: int):
        self.keep_bytes = keep_bytes
        self._memory = np.empty(0, np.uint8)

    def get(self, count: int, dtype) -> np.ndarray:
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes > self.keep_bytes:
            return np.empty(count, dtype)
        if nbytes > self._memory.nbytes:
            self._memory = np.empty(nbytes, np.uint8)
        return self._memory[:nbytes].view(dtype)

    def release(self) -> None:
        self._memory = np.empty(0, np.uint8)


def parts_plan(rank: int, grid: Grid, algorithms: tuple[str, ...], counts: list[int], block_elems: int,
               inflight: int, half: str) -> PartsPlan:
    """The plan for ``half`` ("reduce_scatter" or "allgather") of parts ``counts`` (elements, rank order),
    pipelined in blocks of about ``block_elems`` elements (every part's piece together)."""
    p = grid.nranks
    longest = max(counts)
    nblocks = max(1, -(-longest * p // max(1, block_elems)))
    nblocks = min(nblocks, max(1, longest))
    piece = -(-longest // nblocks)
    program = scatter_program(rank, grid, algorithms, [k * piece for k in range(p + 1)], half)
    blocks = np.array([(b * p * piece, 0) for b in range(nblocks)], np.int64).reshape(-1, 2)
    native = _native.Pipeline([native_program(program)], blocks, inflight)
    what = "reduce-scatter" if half == "reduce_scatter" else "allgather"
    levels = range(len(grid.sizes)) if half == "reduce_scatter" else reversed(range(len(grid.sizes)))
    phases = tuple((lvl, what) for lvl in levels for _ in range(level_rounds(algorithms[lvl], grid.sizes[lvl])))
    name = f"{what} per level({','.join(algorithms)})"
    compiled = CompiledPipeline(native, name, nblocks * p * piece, p * piece, nblocks, inflight, phases)
    positions = [0] * p
    for k, r in enumerate(grid.order):
        positions[r] = k
    return PartsPlan(compiled, tuple(counts), tuple(positions), nblocks, piece)
