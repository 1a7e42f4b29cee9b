"""The GPU path: collectives on CUDA arrays, NCCL for the GPUs of one node, MPI (staged through pinned host
memory) above them.

An allreduce of a device array, on a tree whose innermost groups are GPUs of one host (IBM DDL's split):
  1. NCCL reduce-scatter inside the group: member k holds the group's sum of block k (1/g of the data);
  2. block k is allreduced over MPI among the members k of every group (ddl's own hierarchical plan over the
     outer levels) in pinned host memory: the executor starts each of the plan's pipeline blocks once its copy
     from the GPU has landed and queues its copy back as soon as it is reduced, so copies in both directions
     overlap the transfers of other blocks and the pipeline never restarts (native run_staged);
  3. NCCL all-gather inside the group.
Every level's reduction runs where its data is: on the GPU in NCCL, on the host in the MPI levels. Broadcast
and allgather of device arrays are staged whole through host memory.

Python decides (groups, trees, the plan and its blocks); the native NcclGroup queues work on ddl's streams and
waits with the deadline. libcuda and libnccl are loaded at run time (ddl builds without CUDA); DDLError subclass DeviceError
says what is missing.
"""
from __future__ import annotations

import sys

import numpy as np

from .. import _native
from ..config import get as setting
from ..core.communicator import Communicator
from ..core.dtypes import native_dtype_name, native_op_name
from ..errors import DDLError, DeviceError
from .arrays import DeviceArray
from .groups import cross_tree, nccl_groups, shard
from .libraries import load_driver, load_nccl

class DevicePath:
    """One communicator's GPU machinery for one device, built on its first device collective: the NCCL group
    (id made by its first member, sent over MPI), the communicator of the outer levels, ddl's buffers."""

    def __init__(self, comm, device: int):
        if comm.mpi_comm is None and comm.size > 1:
            raise DeviceError(f"rank {comm.rank}: collectives on GPU arrays need an MPI communicator")
        self.comm, self.device = comm, device
        self.driver = load_driver()
        nccl = load_nccl()
        groups = nccl_groups(comm.tree, comm.hosts, setting("DDL_NCCL_LEVELS"))
        mine = next(g for g in groups if comm.rank in g)
        self.position = mine.index(comm.rank)
        inner = comm.mpi_comm.Split(groups.index(mine), comm.rank) if comm.mpi_comm is not None else None
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

    def allreduce(self, src: DeviceArray, dst: DeviceArray, op: str, label: str) -> None:
        """dst = allreduce(src), both on this device (they may be the same array)."""
        g, es = self.group, src.itemsize
        dtype, rop = native_dtype_name(src.dtype), native_op_name(op, src.dtype)
        per, padded, valid = shard(src.size, g.nranks, self.position)
        in_place = padded == src.size  # no padding: dst itself is the work buffer
        work = dst.ptr if in_place else self._work_buffer(padded * es).ptr
        g.after(src.stream)
        if dst.stream != src.stream:
            g.after(dst.stream)
        if work != src.ptr:
            g.copy_dd(work, src.ptr, src.nbytes)
        outer = self.outer.size > 1
        average = op == "avg"
        g.reduce_scatter(work, per, dtype, rop, average and not outer)
        if outer and valid:
            self._stage(work + (self.position * per) * es, valid, es, dtype, rop,
                        1.0 / self.comm.size if average else 1.0, label)
        g.all_gather(work, per, dtype)
        if work != dst.ptr:
            g.copy_dd(dst.ptr, work, dst.nbytes)
        g.before(dst.stream)

    def _stage(self, block: int, valid: int, es: int, dtype, rop, factor: float, label: str) -> None:
        """The outer levels on this member's block, run by the executor over pinned memory: each pipeline block
        is copied in when the plan reaches it and copied back as soon as it is reduced (native run_staged)."""
        self._pinned_buffer(valid * es)
        plan = self.outer.allreduce_plan(valid, es)
        self.outer.execute(plan, self._pinned, _native.RunOptions(
            dtype, rop, self.comm.options.timeout, label, factor=factor, group=self.group, device=block))

    def to_host(self, src: DeviceArray, label: str) -> np.ndarray:
        """A host copy of a device array (for the staged broadcast and allgather)."""
        host = self._pinned_buffer(src.nbytes)
        g = self.group
        g.after(src.stream)
        g.copies_after_work()
        g.wait(g.to_host(self._pinned.ptr, src.ptr, src.nbytes), f"{label}: copy to the host")
        return host[:src.nbytes].copy()

    def to_device(self, data: np.ndarray, dst: DeviceArray, label: str) -> None:
        """Host bytes into a device array, ordered before the caller's next work on dst's stream."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if raw.nbytes != dst.nbytes:
            raise DDLError(f"rank {self.comm.rank}: {label}: {raw.nbytes} bytes for a {dst.nbytes}-byte array")
        host = self._pinned_buffer(raw.nbytes)
        g = self.group
        g.synchronize(f"{label}: earlier copies from the pinned buffer")  # before the host overwrites it
        host[:raw.nbytes] = raw
        g.after(dst.stream)
        g.copies_after_work()
        g.wait(g.to_device(dst.ptr, self._pinned.ptr, raw.nbytes), f"{label}: copy to the device")
        g.before(dst.stream)
