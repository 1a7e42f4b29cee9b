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

import glob
import os
import sys
import threading

import numpy as np

from . import _native, hierarchical
from .config import get as setting
from .device_arrays import DeviceArray
from .dtypes import native_dtype_name, native_op_name
from .errors import DDLError, DeviceError

_LOCK = threading.Lock()
_LIBS: dict = {}


def nccl_candidates(environ=os.environ, paths=None) -> list[str]:
    """Where libnccl is looked for, in order: DDL_NCCL_LIBRARY; the nvidia-nccl-cu13/-cu12 wheels on the
    Python path; the system's libnccl.so.2 (the dynamic loader's search)."""
    given = setting("DDL_NCCL_LIBRARY", environ)
    if given:
        return [given]
    found = []
    for entry in paths if paths is not None else sys.path:
        found += sorted(glob.glob(os.path.join(entry or ".", "nvidia", "nccl", "lib", "libnccl.so*")))
    return list(dict.fromkeys(found)) + ["libnccl.so.2"]


def load_driver():
    """The CUDA driver (libcuda, or DDL_CUDA_DRIVER), loaded once per process."""
    with _LOCK:
        if "driver" not in _LIBS:
            _LIBS["driver"] = _native.CudaDriver(setting("DDL_CUDA_DRIVER"))
        return _LIBS["driver"]


def load_nccl(environ=os.environ):
    """NCCL, loaded once per process from the first candidate that loads; DeviceError naming every one tried."""
    with _LOCK:
        if "nccl" in _LIBS:
            return _LIBS["nccl"]
        # Non-blocking communicators: creation and collectives return at once and ddl waits with its deadline.
        os.environ.setdefault("NCCL_COMM_BLOCKING", "0")
        errors = []
        for path in nccl_candidates(environ):
            try:
                _LIBS["nccl"] = _native.NcclLibrary(path)
                return _LIBS["nccl"]
            except DeviceError as e:
                errors.append(str(e))
        raise DeviceError("no usable NCCL library; install the wheel (pip install 'ddl[gpu]', which brings "
                          "nvidia-nccl-cu12) or set DDL_NCCL_LIBRARY. Tried: " + "; ".join(errors))


# -- decisions (pure) ---------------------------------------------------------------------------------------

def nccl_groups(tree, hosts: list[str] | None, levels: str = "auto") -> list[list[int]]:
    """The NCCL groups: the tree's innermost groups when each lies on one host (GPUs of one node) and all have
    the same size (every member k then has a partner k in every other group); otherwise, or with
    ``levels == "0"``, groups of one rank (every level over MPI)."""
    ranks = hierarchical.leaves(tree)
    singles = [[r] for r in sorted(ranks)]
    if levels == "0":
        return singles
    if levels != "auto":
        raise DDLError(f"DDL_NCCL_LEVELS={levels!r}: expected auto or 0")
    inner = _innermost(tree)
    on_one_host = hosts is None or all(len({hosts[r] for r in g}) == 1 for g in inner)
    if not on_one_host or len({len(g) for g in inner}) != 1:
        return singles
    return inner


def _innermost(tree) -> list[list[int]]:
    if all(isinstance(c, int) for c in tree):
        return [list(tree)]
    return [g for c in tree for g in _innermost(c)]


def cross_tree(tree, groups: list[list[int]], position: int):
    """The tree the members ``position`` of every group reduce over: each innermost group replaced by that
    member, ranks renumbered in rank order (the order MPI_Comm_split gives with key = rank)."""
    if all(len(g) == 1 for g in groups):
        return tree

    def collapse(t):
        return t[position] if all(isinstance(c, int) for c in t) else [collapse(c) for c in t]

    outer = collapse(tree)
    if isinstance(outer, int):  # one group: nothing above it
        return [0]
    order = {r: i for i, r in enumerate(sorted(hierarchical.leaves(outer)))}

    def renumber(t):
        return order[t] if isinstance(t, int) else [renumber(c) for c in t]

    return renumber(outer)


def shard(count: int, group_size: int, member: int) -> tuple[int, int, int]:
    """(elements per member, padded length, valid elements of ``member``'s block) for a reduce-scatter of
    ``count`` elements: NCCL needs equal blocks, so the buffer is padded to a multiple of the group size and
    the padding is never staged or returned."""
    per = -(-count // group_size) if count else 0
    valid = max(0, min(count - member * per, per))
    return per, per * group_size, valid


# -- execution ----------------------------------------------------------------------------------------------

class DevicePath:
    """One communicator's GPU machinery for one device, built on its first device collective: the NCCL group
    (id made by its first member, sent over MPI), the communicator of the outer levels, ddl's buffers."""

    def __init__(self, comm, device: int):
        if comm._mpi is None and comm.size > 1:
            raise DeviceError(f"rank {comm.rank}: collectives on GPU arrays need an MPI communicator")
        self.comm, self.device = comm, device
        self.driver = load_driver()
        nccl = load_nccl()
        groups = nccl_groups(comm.tree, comm.hosts, setting("DDL_NCCL_LEVELS"))
        mine = next(g for g in groups if comm.rank in g)
        self.position = mine.index(comm.rank)
        inner = comm._mpi.Split(groups.index(mine), comm.rank) if comm._mpi is not None else None
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
            from .communicator import Communicator

            sub = comm._mpi.Split(self.position, comm.rank)
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
        plan = self.outer._allreduce_plan(valid, es)
        self.outer._executor.run_staged(plan.native, self.group, block, self._pinned, dtype, rop, factor,
                                        self.comm.options.timeout, label)

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
