"""The device path of a communicator's table (ddl.core.road), built on its public seam (``lock``, ``agree``,
``mpi_comm`` and the planned collectives of the outer communicator): GPU arrays' calls, described, checked and
agreed like any other (ddl.core.calls), run here per level — NCCL inside a node, ddl's staged MPI levels above
(ddl.gpu.path). Registered with ddl.core.devices by ddl.gpu; first in every table that provides its collectives.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from ..config import get as setting
from ..core.packing import pack_groups
from ..errors import DDLError, DeviceError
from .arrays import is_device_array, view
from .levels import DeviceLevels, choose_levels
from .libraries import load_driver, load_nccl
from .path import DevicePath


class DeviceCollectives:
    """One communicator's GPU machinery: a DevicePath per device, made on its first collective."""
    name = "device"
    serves = frozenset(("allreduce", "broadcast", "allgather", "reduce_scatter"))
    first = True  # (no other path can stand in for it, whatever DDL_PATH says)

    def __init__(self, comm, levels: str | None = None):
        self.comm = comm
        # as the communicator is made (its paths come at first use); a world without MPI gives "all"
        self.levels = levels or setting("DDL_NCCL_LEVELS")
        self._paths: dict[int, DevicePath] = {}

    def close(self) -> None:
        for path in self._paths.values():
            path.close()
        self._paths.clear()

    def takes(self, call) -> str | None:
        return "a GPU array: NCCL at the innermost levels chosen, ddl's plan staged over MPI above them" \
            if call.device else None

    def levels_for(self, nbytes: int) -> DeviceLevels:
        """Each level's transport and bytes per rank for an allreduce of GPU arrays of ``nbytes`` (ddl.explain);
        a path already made says what it runs."""
        made = next(iter(self._paths.values()), None)
        return choose_levels(self.comm.tree, self.comm.levels, made.choice.setting if made else self.levels,
                             nbytes)

    def _path(self, device: int) -> DevicePath:
        path = self._paths.get(device)
        if path is None:
            exchange = getattr(self.comm, "exchange", None)  # (a world without MPI hands ids through its store)
            path = self._paths[device] = DevicePath(self.comm, device, self.levels, exchange)
        return path

    @staticmethod
    def _libraries_problem() -> str | None:
        """Loads the CUDA driver and NCCL before any collective step, so a rank without them fails in the
        agreement round with its reason instead of leaving its peers waiting."""
        try:
            load_driver()
            load_nccl()
        except DeviceError as e:
            return str(e)
        return None

    def run(self, call):
        # An unusable input still takes part in the agreement round (as its error), so every rank raises.
        problem = self._libraries_problem() or call.problem
        return getattr(self, "_" + call.collective)(call, problem)

    def _result(self, call, shape: tuple):
        """The call's out (checked when described), else a new array of the input's framework."""
        return call.target if call.target is not None else view(call.array.empty(shape), "result")

    def _agreed(self, call, problem, run, shape=None):
        """The agreement round, then ``run(path, dst)`` where there is data (its size is agreed: every rank
        alike), into the call's result (of ``shape(call)``, default the input's). Nothing of the input is read
        before the round: an unusable one (no array at all) must still take part."""
        with self.comm.lock:
            self.comm.agree(call.text, problem)
            a = call.array
            dst = self._result(call, shape(call) if shape else a.shape)
            if a.nbytes:
                run(self._path(a.device), dst)
        return dst.obj

    def _allreduce(self, call, problem):
        return self._agreed(call, problem, lambda path, dst: path.allreduce(call.array, dst, call.op, call.text))

    def _reduce_scatter(self, call, problem):
        rows = call.known.rows
        return self._agreed(call, problem,
                            lambda path, dst: path.reduce_scatter(call.array, dst, rows, call.op, call.text),
                            lambda c: (rows[self.comm.rank],) + c.array.shape[1:])

    def _broadcast(self, call, problem):
        return self._agreed(call, problem, lambda path, dst: path.broadcast(call.array, dst, call.root, call.text))

    def _allgather(self, call, problem):
        """Every rank's rows (and the first dimension of every out given) are learnt in the agreement round."""
        a, size, rank = call.array, self.comm.size, self.comm.rank
        counts = np.zeros(2 * size, np.int64)  # [rows of rank r..., 1 + out's first dimension on rank r...]
        if problem is None:
            counts[rank] = a.shape[0]
            counts[size + rank] = 0 if call.out is None else 1 + call.target.shape[0]
        with self.comm.lock:
            self.comm.agree(call.text, problem, counts, _native.DType.int64, _native.ReduceOp.sum)
            rows = [int(n) for n in counts[:size]]
            total = sum(rows)
            wrong = [r for r in range(size) if counts[size + r] and counts[size + r] - 1 != total]
            if wrong:
                raise DDLError(f"rank {rank}: allgather of {total} rows in all: the out of rank(s) {wrong} has "
                               f"another first dimension (every rank's out must hold every rank's rows)")
            dst = self._result(call, (total,) + a.shape[1:])
            if total and dst.nbytes:
                self._path(a.device).allgather(a, dst, rows, call.text)
        return dst.obj

    def allreduce_n(self, arrays: list, op: str) -> list:
        """One allreduce per dtype and device, on the framework's concatenation."""
        views = [view(x, f"allreduce_n array {i}") if is_device_array(x) else None for i, x in enumerate(arrays)]
        if any(v is None for v in views):
            raise DDLError(f"rank {self.comm.rank}: allreduce_n got GPU and host arrays together; pass one kind")
        return pack_groups(views, [f"{v.dtype}@{v.device}" for v in views],
                           lambda idx: self.comm.allreduce(_concat([arrays[i] for i in idx],
                                                                   views[idx[0]].framework), op))


def _concat(arrays: list, framework: str):
    """One flat GPU array of many, by their own framework."""
    if framework == "torch":
        import torch

        return torch.cat([x.reshape(-1) for x in arrays])
    if framework == "cupy":
        import cupy

        return cupy.concatenate([x.reshape(-1) for x in arrays])
    raise DDLError(f"allreduce_n of {type(arrays[0]).__name__} GPU arrays: ddl packs only cupy and torch arrays")
