"""The GPU path: collectives on CUDA arrays per level of ddl's tree, NCCL for the innermost levels it chooses
(the GPUs of a node, and above them the same-position members of the nodes under a switch, and so on:
ddl.gpu.groups), ddl's MPI plan staged through pinned host memory for the levels above those.

  - allreduce: NCCL reduce-scatters innermost first, each on the shard the one below left (in place: after the
    NCCL levels a rank holds block f of the buffer, ddl.gpu.groups), the shard allreduced over MPI among the
    members of the same position in pinned host memory where levels are staged (the executor starts each
    pipeline block once its copy from the GPU has landed and queues its copy back as soon as it is reduced,
    native run_staged), NCCL all-gathers in reverse. With every level on NCCL and two or more of them, large
    buffers run in blocks, a wavefront of NCCL group calls (block b's level j beside block b-1's level j+1), so
    the levels' links carry data at once. One group of every rank in rank order: NCCL's allreduce.
  - reduce_scatter: the input's rows laid out so that block f holds the rows of the ranks of flat position f,
    NCCL reduce-scatters down the levels, the block reduce-scattered among the members of that position (ddl's
    host reduce-scatter, planned per level) where levels are staged, this rank's rows copied back.
  - allgather: the inverse: rows gathered among the members of a position (host allgather), NCCL all-gathers
    up the levels, rows put back in rank order.
  - broadcast: root's data to the members at root's position (host broadcast), then NCCL broadcasts from the
    outermost NCCL level in: at level j the groups whose members sit where root does below j.
Every level's reduction runs where its data is: on the GPU in NCCL, on the host in the MPI levels. Work is
queued on ddl's streams (shared by every level's group) after the caller's current stream, and the caller's
stream waits for it: kernels queued next see the result. With every level on NCCL a call returns once its
kernels are queued; staged levels return once their MPI transfers are done.

Python decides (levels, groups, layouts, the plan and its blocks); the native NcclGroup queues work on ddl's
streams and waits with the deadline. libcuda and libnccl are loaded at run time (ddl builds without CUDA);
DDLError subclass DeviceError says what is missing.
"""
from __future__ import annotations

import itertools
import math
import sys

import numpy as np

from .. import _native
from ..core.communicator import Communicator
from ..core.dtypes import native_dtype_name, native_op_name
from ..errors import DeviceError
from .arrays import DeviceArray, host_dtype
from .exchange import MpiExchange
from .groups import Layout
from .levels import choose_levels
from .libraries import load_driver, load_nccl

# Every NCCL level and large buffers: blocks of at least this many bytes, at most MAX_BLOCKS of them, so a
# level's NCCL calls stay large while the levels above carry the blocks before. Off (one block) until a cluster
# shows it pays: on the emulated T1 with an H200 (NCCL over sockets, 2026-11-28) 4 blocks of a 32 MiB allreduce
# took 595 ms against 456 ms in one (medians of 7), on T2 the same as one.
PIPELINE_BYTES = 8 << 20
MAX_BLOCKS = 1
SPLIT_VERSION = 21800  # ncclCommSplit


def pipeline_blocks(nbytes: int, levels: int) -> int:
    return 1 if levels < 2 else max(1, min(MAX_BLOCKS, nbytes // PIPELINE_BYTES))


class DevicePath:
    """One communicator's GPU machinery for one device, built on its first device collective: an NCCL group for
    each NCCL level (split from one of every rank where NCCL can split, else each made from an id its first
    member sends the others), the communicator of the staged levels above them, ddl's buffers."""

    def __init__(self, comm, device: int, setting: str = "auto", exchange=None):
        if comm.mpi_comm is None and comm.size > 1 and exchange is None:
            raise DeviceError(f"rank {comm.rank}: collectives on GPU arrays need an MPI communicator")
        self.comm, self.device = comm, device
        self.driver = load_driver()
        nccl = load_nccl()
        self.choice = choose_levels(comm.tree, comm.levels, setting)
        self.layout = layout = Layout(comm.tree, self.choice.nccl, comm.rank)
        self.exchange = exchange or MpiExchange(comm.mpi_comm)
        self._world = None  # the group of every rank the levels were split from
        self.groups = self._make_groups(nccl, device, comm.options.timeout)
        self.lead = next((g for g in self.groups if g is not None), None) or \
            self._alone(nccl, device, comm.options.timeout)
        self.flat = self.flat_world()  # NCCL's collectives serve as they are
        if layout.outer_size == comm.size:
            self.outer = comm  # every level over MPI: the communicator's own plan
        elif layout.outer_size == 1:
            self.outer = _Alone()
        else:
            sub = comm.mpi_comm.Split(layout.flat[comm.rank], comm.rank)
            try:  # from_mpi works on its own duplicate
                self.outer = Communicator.from_mpi(sub, comm.options, hierarchy=layout.outer_tree)
            finally:
                sub.Free()
        self._work: _native.DeviceBuffer | None = None
        self._pinned: _native.PinnedBuffer | None = None
        # Detected and reported; the MPI levels stage either way (device pointers to MPI would need the
        # executor's reductions on the GPU).
        self.cuda_aware_mpi = {1: "yes", 0: "no"}.get(_native.mpi_cuda_support(), "unknown")
        if comm.options.dbg_level >= 1 and comm.rank == 0:
            print(f"[ddl] GPU path on device {device}: NCCL {nccl.version}; {self.choice.text()}; MPI CUDA-aware: "
                  f"{self.cuda_aware_mpi}", file=sys.stderr)

    def _make_groups(self, nccl, device: int, timeout: float) -> list:
        """One NCCL group per NCCL level, every rank making its levels in the same order; a failure names the
        group it was making."""
        making = ["the NCCL communicator of every rank (the one the levels split from)"]
        try:
            return self._made_groups(nccl, device, timeout, making)
        except DeviceError as e:
            raise DeviceError(f"rank {self.comm.rank}: making {making[-1]}: {e}") from None

    def _made_groups(self, nccl, device: int, timeout: float, making: list) -> list:
        layout, rank, size = self.layout, self.comm.rank, self.comm.size
        if not layout.levels:
            return []
        if self.flat_world() or nccl.version >= SPLIT_VERSION:
            uid = self.exchange.broadcast(nccl.unique_id() if rank == 0 else None)
            world = _native.NcclGroup(nccl, self.driver, device, uid, size, rank, timeout)
            if self.flat_world():  # the one level is this group
                return [world]
            self._world = world
            if world.can_split:  # (a level of groups of one needs none; the parent lives as long as its splits)
                made = []
                for j, (groups, mine, k) in enumerate(zip(layout.levels, layout.mine, layout.position)):
                    making.append(self._naming(j, mine))
                    made.append(world.split(groups.index(mine), k) if len(mine) > 1 else None)
                return made
        made = []
        for j, (groups, mine, k) in enumerate(zip(layout.levels, layout.mine, layout.position)):
            making.append(self._naming(j, mine))
            if len(mine) == 1:
                made.append(None)
                continue
            ids = self.exchange.allgather(nccl.unique_id() if k == 0 else None)
            first = next((g for g in made if g is not None), None)
            made.append(_native.NcclGroup(nccl, self.driver, device, ids[mine[0]], len(mine), k, timeout, first))
        return made

    def _naming(self, level: int, members: list[int]) -> str:
        name = self.choice.levels[level].name if level < len(self.choice.levels) else f"level {level}"
        return f"level {level}'s ({name}) NCCL communicator of ranks {members}"

    def flat_world(self) -> bool:
        """One NCCL level of one group of every rank in rank order."""
        layout = self.layout
        return len(layout.levels) == 1 and layout.mine[0] == list(range(self.comm.size))

    def _alone(self, nccl, device: int, timeout: float):
        """Every level staged: a group of this rank alone gives the streams and copies."""
        return _native.NcclGroup(nccl, self.driver, device, nccl.unique_id(), 1, 0, timeout)

    def close(self) -> None:
        if self.outer is not self.comm:
            self.outer.close()
        self.groups, self.lead, self._world = [], None, None

    def _work_buffer(self, nbytes: int):
        if self._work is None or self._work.nbytes < nbytes:
            self._work = self._retire(self._work, "growing ddl's device buffer")
            self._work = _native.DeviceBuffer(self.driver, self.device, nbytes)
        return self._work

    def _pinned_buffer(self, nbytes: int) -> np.ndarray:
        if self._pinned is None or self._pinned.nbytes < nbytes:
            self._pinned = self._retire(self._pinned, "growing ddl's pinned buffer")
            self._pinned = _native.PinnedBuffer(self.driver, max(nbytes, 1 << 20))
        return np.frombuffer(self._pinned, np.uint8)

    def _retire(self, old, why: str) -> None:
        """Waits for copies queued by earlier calls that may still use ``old``; returns None, which the caller
        stores to free it before allocating the larger one."""
        if old is not None:
            self.lead.synchronize(why)

    # -- collectives (the caller holds the communicator's lock and has run the agreement round) -------------

    def _enter(self, src: DeviceArray, dst: DeviceArray) -> None:
        """ddl's work follows what the caller queued on both arrays' streams."""
        self.lead.after(src.stream)
        if dst.stream != src.stream:
            self.lead.after(dst.stream)

    def _scatter_level(self, j: int, work: int, spans, es: int, dtype, rop, average: bool) -> None:
        """Level j's NCCL reduce-scatter, in place: it leaves this rank span j+1 of span j (``Layout.spans``).
        A level of groups of one moves nothing."""
        (at, _), (mine, n) = spans[j], spans[j + 1]
        if self.groups[j] is not None:
            self.groups[j].reduce_scatter(work + at * es, work + mine * es, n, dtype, rop, average)

    def _gather_level(self, j: int, work: int, spans, es: int, dtype) -> None:
        """Level j's NCCL all-gather, in place: the inverse of _scatter_level."""
        (at, _), (mine, n) = spans[j], spans[j + 1]
        if self.groups[j] is not None:
            self.groups[j].all_gather(work + mine * es, work + at * es, n, dtype)

    def _down_levels(self, work: int, spans, es: int, dtype, rop, average: bool) -> None:
        """NCCL reduce-scatters innermost first."""
        for j in range(len(self.groups)):
            self._scatter_level(j, work, spans, es, dtype, rop, average)

    def _up_levels(self, work: int, spans, es: int, dtype) -> None:
        """NCCL all-gathers outermost first."""
        for j in reversed(range(len(self.groups))):
            self._gather_level(j, work, spans, es, dtype)

    def allreduce(self, src: DeviceArray, dst: DeviceArray, op: str, label: str) -> None:
        """dst = allreduce(src), both on this device (they may be the same array)."""
        es, layout = src.itemsize, self.layout
        dtype, rop = native_dtype_name(src.dtype), native_op_name(op, src.dtype)
        staged = self.outer.size > 1
        # avg: NCCL divides at every level when no level is staged; else the staged levels scale by 1/size
        average = op == "avg" and not staged
        self._enter(src, dst)
        if self.flat:  # one kernel
            self.lead.all_reduce(src.ptr, dst.ptr, src.size, dtype, rop, average)
            self.lead.before(dst.stream)
            return
        blocks = 1 if staged else pipeline_blocks(src.nbytes, len(self.groups))
        unit = layout.blocks * blocks
        padded = -(-src.size // unit) * unit
        work = dst.ptr if padded == src.size else self._work_buffer(padded * es).ptr  # in dst unless padded
        if work != src.ptr:
            self.lead.copy_dd(work, src.ptr, src.nbytes)
        if blocks > 1:
            self._wavefront(work, padded // blocks, blocks, es, dtype, rop, average, label)
        else:
            spans = layout.spans(padded)
            self._down_levels(work, spans, es, dtype, rop, average)
            at, n = spans[-1]
            valid = max(0, min(src.size - at, n))
            if staged and valid:
                self._stage(work + at * es, valid, es, dtype, rop, 1.0 / self.comm.size if op == "avg" else 1.0,
                            label)
            self._up_levels(work, spans, es, dtype)
        if work != dst.ptr:
            self.lead.copy_dd(dst.ptr, work, dst.nbytes)
        self.lead.before(dst.stream)

    def _wavefront(self, work: int, per_block: int, blocks: int, es: int, dtype, rop, average, label) -> None:
        """Every level on NCCL, in blocks: step s runs phase j (the reduce-scatter of level j, then the
        all-gathers outermost first) on block s - j, one NCCL group call per step, so block b's inner level and
        block b-1's outer one run at once. Every rank queues the same steps in the same order."""
        m = len(self.groups)
        spans = [self.layout.spans(per_block, b * per_block) for b in range(blocks)]
        for step in range(blocks + 2 * m - 1):
            self.lead.group_start()
            for phase in range(2 * m):
                b = step - phase
                if not 0 <= b < blocks:
                    continue
                if phase < m:
                    self._scatter_level(phase, work, spans[b], es, dtype, rop, average)
                else:
                    self._gather_level(2 * m - 1 - phase, work, spans[b], es, dtype)
            self.lead.group_end(f"{label}: step {step} of the NCCL levels")

    def reduce_scatter(self, src: DeviceArray, dst: DeviceArray, rows: tuple, op: str, label: str) -> None:
        """dst = this rank's rows (``rows[r]`` for rank r, in rank order along the first dimension) of the
        reduction of every rank's src."""
        es = src.itemsize
        dtype, rop = native_dtype_name(src.dtype), native_op_name(op, src.dtype)
        row = math.prod(src.shape[1:])
        outer = self.outer.size > 1
        average = op == "avg"  # (NCCL divides by each level's size, the staged levels by theirs)
        self._enter(src, dst)
        if self.flat and len(set(rows)) == 1:
            self.lead.reduce_scatter(src.ptr, dst.ptr, rows[0] * row, dtype, rop, average)
            self.lead.before(dst.stream)
            return
        blk, used, pieces = self._by_position(rows, row * es)
        if blk:
            f = self.layout.flat[self.comm.rank]
            work = self._work_buffer(self.layout.blocks * blk).ptr
            for at, start, nbytes in pieces:
                self.lead.copy_dd(work + at, src.ptr + start, nbytes)
            spans = self.layout.spans(self.layout.blocks * blk // es)
            self._down_levels(work, spans, es, dtype, rop, average)
            mine = work + f * blk
            if outer:
                block = self._down(mine, used[f], label)
                block = block.view(host_dtype(src.dtype)).reshape(-1, row)
                part = self.outer.reduce_scatter(block, op, counts=[rows[r] for r in self.layout.across[f]])
                self._up(part, dst.ptr, label)
            else:
                self.lead.copy_dd(dst.ptr, mine, dst.nbytes)
        self.lead.before(dst.stream)

    def allgather(self, src: DeviceArray, dst: DeviceArray, rows: list[int], label: str) -> None:
        """dst = every rank's src (``rows[r]`` rows from rank r) in rank order along the first dimension."""
        row = math.prod(src.shape[1:]) * src.itemsize
        u8 = _native.DType.uint8
        self._enter(src, dst)
        if self.flat and len(set(rows)) == 1:
            self.lead.all_gather(src.ptr, dst.ptr, rows[0] * row, u8)
            self.lead.before(dst.stream)
            return
        blk, _, pieces = self._by_position(rows, row)
        if blk:
            work = self._work_buffer(self.layout.blocks * blk).ptr
            spans = self.layout.spans(self.layout.blocks * blk)
            mine = work + spans[-1][0]
            if self.outer.size > 1:  # the rows of the members at this position, gathered over MPI
                mine_rows = self._down(src.ptr, src.nbytes, label).reshape(-1, row)
                self._up(self.outer.allgather(mine_rows), mine, label)
            else:
                self.lead.copy_dd(mine, src.ptr, src.nbytes)
            self._up_levels(work, spans, 1, u8)
            for at, start, nbytes in pieces:  # back in rank order
                self.lead.copy_dd(dst.ptr + start, work + at, nbytes)
        self.lead.before(dst.stream)

    def _by_position(self, rows, row_bytes: int) -> tuple[int, list[int], list[tuple[int, int, int]]]:
        """The layout NCCL's reduce-scatters and all-gathers need when the levels are not one group of the
        communicator in rank order, or rows differ: block f holds the rows of the ranks of flat position f, in
        their outer order, every block as long as the longest (NCCL's blocks are equal). Returns (bytes per
        block, each block's bytes in use, (offset in the blocks, offset in rank order, bytes) of every rank's
        rows)."""
        starts = list(itertools.accumulate(rows[:-1], initial=0))
        used, pieces = [], []
        for f, ranks in enumerate(self.layout.across):
            at = 0
            for r in ranks:
                pieces.append((f, at, starts[r] * row_bytes, rows[r] * row_bytes))
                at += rows[r] * row_bytes
            used.append(at)
        blk = max(used)
        return blk, used, [(f * blk + at, start, nbytes) for f, at, start, nbytes in pieces]

    def broadcast(self, src: DeviceArray, dst: DeviceArray, root: int, label: str) -> None:
        """dst = root's src on every rank (root's dst may be its src)."""
        me, layout = self.comm.rank, self.layout
        where = layout.positions[root]
        self._enter(src, dst)
        if self.outer.size > 1 and layout.position == where:  # to the members at root's position
            ranks = layout.across[layout.flat[root]]
            data = self._down(src.ptr, src.nbytes, label) if me == root else np.empty(src.nbytes, np.uint8)
            data = self.outer.broadcast(data, ranks.index(root))
            if me != root:
                self._up(data, dst.ptr, label)
        if me == root and src.ptr != dst.ptr and not any(self.groups):
            self.lead.copy_dd(dst.ptr, src.ptr, src.nbytes)
        if src.nbytes:
            # outermost NCCL level first: at level j the groups whose members sit where root does below j
            for j in reversed(range(len(self.groups))):
                # (the levels above, and the staged ones, gave the data to every rank where root is from j on)
                if layout.position[:j] == where[:j] and self.groups[j] is not None:
                    self.groups[j].broadcast(src.ptr if me == root else dst.ptr, dst.ptr, src.nbytes,
                                             _native.DType.uint8, where[j])
        self.lead.before(dst.stream)

    def _stage(self, block: int, valid: int, es: int, dtype, rop, factor: float, label: str) -> None:
        """The outer levels on this member's block, run by the executor over pinned memory: each pipeline block
        is copied in when the plan reaches it and copied back as soon as it is reduced (native run_staged)."""
        self._pinned_buffer(valid * es)
        plan = self.outer.allreduce_plan(valid, es)
        self.outer.execute(plan, self._pinned, _native.RunOptions(
            dtype, rop, self.comm.options.timeout, label, factor=factor, group=self.lead, device=block))

    def _down(self, ptr: int, nbytes: int, label: str) -> np.ndarray:
        """A host copy of device bytes, once the work queued so far is done."""
        host = self._pinned_buffer(nbytes)
        g = self.lead
        g.copies_after_work()
        g.wait(g.to_host(self._pinned.ptr, ptr, nbytes), f"{label}: copy to the host")
        return host[:nbytes].copy()

    def _up(self, data: np.ndarray, ptr: int, label: str) -> None:
        """Host data to device memory at ``ptr``; the work queued after this follows the copy."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        host = self._pinned_buffer(raw.nbytes)
        g = self.lead
        g.synchronize(f"{label}: earlier copies from the pinned buffer")  # before the host overwrites it
        host[:raw.nbytes] = raw
        g.copies_after_work()
        g.wait(g.to_device(ptr, self._pinned.ptr, raw.nbytes), f"{label}: copy to the device")
        g.work_after_copies()




class _Alone:
    """The staged levels' communicator where a position has one member (every level on NCCL)."""
    size = 1

    def close(self) -> None:
        pass
