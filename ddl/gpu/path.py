"""The GPU path: collectives on CUDA arrays, NCCL for the GPUs of one node, MPI (staged through pinned host
memory) above them.

Every collective runs per level (IBM DDL's split), NCCL inside the innermost groups (GPUs of one host) and ddl's
own planned collectives among the members k of every group above them, on 1/g of the data:
  - allreduce: NCCL reduce-scatter inside the group (member k holds the group's sum of block k), block k
    allreduced over MPI among the members k of every group in pinned host memory (the executor starts each
    pipeline block once its copy from the GPU has landed and queues its copy back as soon as it is reduced,
    native run_staged), NCCL all-gather inside the group. With one group of every rank: NCCL's allreduce.
  - reduce_scatter: the input's rows laid out so that block k holds the rows of the members k of every group,
    NCCL reduce-scatter inside the group, the block reduce-scattered among the members k (ddl's host
    reduce-scatter, planned per level), this rank's rows copied back. One group in rank order, even rows: NCCL's.
  - allgather: the inverse: rows gathered among the members k (host allgather), NCCL all-gather inside the
    group, rows put back in rank order. One group in rank order, even rows: NCCL's all-gather into the result.
  - broadcast: root's data to the members at root's position of every group (host broadcast), then NCCL's
    broadcast inside every group from that position.
Every level's reduction runs where its data is: on the GPU in NCCL, on the host in the MPI levels. Work is
queued on ddl's streams after the caller's current stream, and the caller's stream waits for it: kernels queued
next see the result. Inside one group the call returns once NCCL's kernels are queued; staged levels return
once their MPI transfers are done.

Python decides (groups, trees, layouts, the plan and its blocks); the native NcclGroup queues work on ddl's
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
from .groups import cross_tree, nccl_groups, shard
from .libraries import load_driver, load_nccl

class DevicePath:
    """One communicator's GPU machinery for one device, built on its first device collective: the NCCL group
    (id made by its first member, sent over MPI), the communicator of the outer levels, ddl's buffers."""

    def __init__(self, comm, device: int, levels: str = "auto"):
        if comm.mpi_comm is None and comm.size > 1:
            raise DeviceError(f"rank {comm.rank}: collectives on GPU arrays need an MPI communicator")
        self.comm, self.device = comm, device
        self.driver = load_driver()
        nccl = load_nccl()
        groups = nccl_groups(comm.tree, comm.hosts, levels)
        mine = next(g for g in groups if comm.rank in g)
        self.position = mine.index(comm.rank)
        # Position k's members of every group, in their outer communicator's rank order (Split by rank), and
        # whether this one group is the whole communicator in rank order (NCCL's collectives then serve as is).
        self.across = [sorted(g[k] for g in groups) for k in range(len(mine))]
        self.flat = len(groups) == 1 and mine == list(range(comm.size))
        # (keyed by position: member 0 makes the id, whatever its rank)
        inner = comm.mpi_comm.Split(groups.index(mine), self.position) if comm.mpi_comm is not None else None
        try:
            uid = nccl.unique_id() if self.position == 0 else None
            uid = inner.bcast(uid, root=0) if inner is not None else uid
        finally:
            if inner is not None:
                inner.Free()
        self.group = _native.NcclGroup(nccl, self.driver, device, uid, len(mine), self.position,
                                       comm.options.timeout)
        if len(mine) == 1:
            self.outer = comm  # every level over MPI: the communicator's own plan
        else:
            sub = comm.mpi_comm.Split(self.position, comm.rank)
            try:  # from_mpi works on its own duplicate
                self.outer = Communicator.from_mpi(sub, comm.options,
                                                   hierarchy=cross_tree(comm.tree, groups, self.position))
            finally:
                sub.Free()
        self._work: _native.DeviceBuffer | None = None
        self._pinned: _native.PinnedBuffer | None = None
        # Detected and reported; the MPI levels stage either way (device pointers to MPI would need the
        # executor's reductions on the GPU).
        self.cuda_aware_mpi = {1: "yes", 0: "no"}.get(_native.mpi_cuda_support(), "unknown")
        if comm.options.dbg_level >= 1 and comm.rank == 0:
            print(f"[ddl] GPU path on device {device}: NCCL {nccl.version}, groups of {len(mine)} rank(s), "
                  f"outer levels over MPI ({self.outer.size} ranks per position) staged through pinned memory; "
                  f"MPI CUDA-aware: {self.cuda_aware_mpi}", file=sys.stderr)

    def close(self) -> None:
        if self.outer is not self.comm:
            self.outer.close()
        self.group = None

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
            self.group.synchronize(why)

    # -- collectives (the caller holds the communicator's lock and has run the agreement round) -------------

    def _enter(self, src: DeviceArray, dst: DeviceArray) -> None:
        """ddl's work follows what the caller queued on both arrays' streams."""
        self.group.after(src.stream)
        if dst.stream != src.stream:
            self.group.after(dst.stream)

    def allreduce(self, src: DeviceArray, dst: DeviceArray, op: str, label: str) -> None:
        """dst = allreduce(src), both on this device (they may be the same array)."""
        g, es = self.group, src.itemsize
        dtype, rop = native_dtype_name(src.dtype), native_op_name(op, src.dtype)
        average = op == "avg"
        self._enter(src, dst)
        if self.outer.size == 1:  # one NCCL group of every rank: NCCL's allreduce, one kernel
            g.all_reduce(src.ptr, dst.ptr, src.size, dtype, rop, average)
            g.before(dst.stream)
            return
        per, padded, valid = shard(src.size, g.nranks, self.position)
        in_place = padded == src.size  # no padding: dst itself is the work buffer
        work = dst.ptr if in_place else self._work_buffer(padded * es).ptr
        if work != src.ptr:
            g.copy_dd(work, src.ptr, src.nbytes)
        g.reduce_scatter(work, work + self.position * per * es, per, dtype, rop, False)
        if valid:
            self._stage(work + (self.position * per) * es, valid, es, dtype, rop,
                        1.0 / self.comm.size if average else 1.0, label)
        g.all_gather(work + self.position * per * es, work, per, dtype)
        if work != dst.ptr:
            g.copy_dd(dst.ptr, work, dst.nbytes)
        g.before(dst.stream)

    def reduce_scatter(self, src: DeviceArray, dst: DeviceArray, rows: tuple, op: str, label: str) -> None:
        """dst = this rank's rows (``rows[r]`` for rank r, in rank order along the first dimension) of the
        reduction of every rank's src."""
        g, es = self.group, src.itemsize
        dtype, rop = native_dtype_name(src.dtype), native_op_name(op, src.dtype)
        row = math.prod(src.shape[1:])
        average, outer = op == "avg", self.outer.size > 1
        self._enter(src, dst)
        if self.flat and len(set(rows)) == 1:
            g.reduce_scatter(src.ptr, dst.ptr, rows[0] * row, dtype, rop, average)
            g.before(dst.stream)
            return
        blk, used, pieces = self._by_position(rows, row * es)
        if blk:
            work = self._work_buffer(g.nranks * blk).ptr
            for at, start, nbytes in pieces:
                g.copy_dd(work + at, src.ptr + start, nbytes)
            mine = work + self.position * blk
            # (avg: NCCL divides by the group's size, the outer levels by theirs: by every rank's in all)
            g.reduce_scatter(work, mine, blk // es, dtype, rop, average)
            if outer:
                block = self._down(mine, used[self.position], label)
                block = block.view(host_dtype(src.dtype)).reshape(-1, row)
                part = self.outer.reduce_scatter(block, op, counts=[rows[r] for r in self.across[self.position]])
                self._up(part, dst.ptr, label)
            else:
                g.copy_dd(dst.ptr, mine, dst.nbytes)
        g.before(dst.stream)

    def allgather(self, src: DeviceArray, dst: DeviceArray, rows: list[int], label: str) -> None:
        """dst = every rank's src (``rows[r]`` rows from rank r) in rank order along the first dimension."""
        g = self.group
        row = math.prod(src.shape[1:]) * src.itemsize
        u8 = _native.DType.uint8
        self._enter(src, dst)
        if self.flat and len(set(rows)) == 1:
            g.all_gather(src.ptr, dst.ptr, rows[0] * row, u8)
            g.before(dst.stream)
            return
        blk, _, pieces = self._by_position(rows, row)
        if blk:
            work = self._work_buffer(g.nranks * blk).ptr
            mine = work + self.position * blk
            if self.outer.size > 1:  # the rows of the members at this position, gathered over MPI
                mine_rows = self._down(src.ptr, src.nbytes, label).reshape(-1, row)
                self._up(self.outer.allgather(mine_rows), mine, label)
            else:
                g.copy_dd(mine, src.ptr, src.nbytes)
            g.all_gather(mine, work, blk, u8)
            for at, start, nbytes in pieces:  # back in rank order
                g.copy_dd(dst.ptr + start, work + at, nbytes)
        g.before(dst.stream)

    def _by_position(self, rows, row_bytes: int) -> tuple[int, list[int], list[tuple[int, int, int]]]:
        """The layout NCCL's reduce-scatter and all-gather need when the group is not the communicator in rank
        order, or rows differ: block k holds the rows of the members k of every group, in their outer order,
        every block as long as the longest (NCCL's blocks are equal). Returns (bytes per block, each block's
        bytes in use, (offset in the blocks, offset in rank order, bytes) of every rank's rows)."""
        starts = list(itertools.accumulate(rows[:-1], initial=0))
        used, pieces = [], []
        for k, ranks in enumerate(self.across):
            at = 0
            for r in ranks:
                pieces.append((k, at, starts[r] * row_bytes, rows[r] * row_bytes))
                at += rows[r] * row_bytes
            used.append(at)
        blk = max(used)
        return blk, used, [(k * blk + at, start, nbytes) for k, at, start, nbytes in pieces]

    def broadcast(self, src: DeviceArray, dst: DeviceArray, root: int, label: str) -> None:
        """dst = root's src on every rank (root's dst may be its src)."""
        g, me = self.group, self.comm.rank
        holder = next(k for k, ranks in enumerate(self.across) if root in ranks)  # root's position
        self._enter(src, dst)
        if self.outer.size > 1 and self.position == holder:  # to that position's member of every group
            ranks = self.across[holder]
            data = self._down(src.ptr, src.nbytes, label) if me == root else np.empty(src.nbytes, np.uint8)
            data = self.outer.broadcast(data, ranks.index(root))
            if me != root:
                self._up(data, dst.ptr, label)
        if src.nbytes:
            g.broadcast(src.ptr if me == root else dst.ptr, dst.ptr, src.nbytes, _native.DType.uint8, holder)
        g.before(dst.stream)

    def _stage(self, block: int, valid: int, es: int, dtype, rop, factor: float, label: str) -> None:
        """The outer levels on this member's block, run by the executor over pinned memory: each pipeline block
        is copied in when the plan reaches it and copied back as soon as it is reduced (native run_staged)."""
        self._pinned_buffer(valid * es)
        plan = self.outer.allreduce_plan(valid, es)
        self.outer.execute(plan, self._pinned, _native.RunOptions(
            dtype, rop, self.comm.options.timeout, label, factor=factor, group=self.group, device=block))

    def _down(self, ptr: int, nbytes: int, label: str) -> np.ndarray:
        """A host copy of device bytes, once the work queued so far is done."""
        host = self._pinned_buffer(nbytes)
        g = self.group
        g.copies_after_work()
        g.wait(g.to_host(self._pinned.ptr, ptr, nbytes), f"{label}: copy to the host")
        return host[:nbytes].copy()

    def _up(self, data: np.ndarray, ptr: int, label: str) -> None:
        """Host data to device memory at ``ptr``; the work queued after this follows the copy."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        host = self._pinned_buffer(raw.nbytes)
        g = self.group
        g.synchronize(f"{label}: earlier copies from the pinned buffer")  # before the host overwrites it
        host[:raw.nbytes] = raw
        g.copies_after_work()
        g.wait(g.to_device(ptr, self._pinned.ptr, raw.nbytes), f"{label}: copy to the device")
        g.work_after_copies()


