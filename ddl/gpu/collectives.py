"""The device path of a communicator's table (ddl.core.road), built on its public seam (``lock``, ``agree``,
``allreduce_plan``, ``execute``, ``mpi_comm``): GPU arrays' calls, described, checked and agreed like any other
(ddl.core.calls), run here — allreduce through the device path (NCCL inside a node, staged MPI levels above),
broadcast and allgather staged whole through host memory (their host collectives take the road again).
Registered with ddl.core.devices by ddl.gpu; first in every table that provides its collectives."""
from __future__ import annotations

from ..core.packing import pack_groups
from ..errors import DDLError, DeviceError
from .arrays import host_dtype, is_device_array, view
from .libraries import load_driver, load_nccl
from .path import DevicePath


class DeviceCollectives:
    """One communicator's GPU machinery: a DevicePath per device, made on its first collective."""
    name = "device"
    serves = frozenset(("allreduce", "broadcast", "allgather"))
    first = True  # (no other path can stand in for it, whatever DDL_PATH says)

    def __init__(self, comm):
        self.comm = comm
        self._paths: dict[int, DevicePath] = {}

    def close(self) -> None:
        for path in self._paths.values():
            path.close()
        self._paths.clear()

    def takes(self, call) -> str | None:
        return "a GPU array: NCCL among the GPUs of a node, ddl's plan staged over MPI above" if call.device \
            else None

    def _path(self, device: int) -> DevicePath:
        path = self._paths.get(device)
        if path is None:
            path = self._paths[device] = DevicePath(self.comm, device)
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
        if call.collective == "allreduce":
            return self._allreduce(call, problem)
        host_collective = (lambda host: self.comm.broadcast(host, call.root)) if call.collective == "broadcast" \
            else self.comm.allgather
        return self._staged(call, problem, host_collective)

    def _allreduce(self, call, problem):
        a = call.array
        with self.comm.lock:
            self.comm.agree(call.text, problem)
            dst = view(call.out, "out") if call.out is not None else view(a.empty(), "result")
            if a.size:
                self._path(a.device).allreduce(a, dst, call.op, call.text)
        return dst.obj

    def allreduce_n(self, arrays: list, op: str) -> list:
        """One allreduce per dtype and device, on the framework's concatenation."""
        views = [view(x, f"allreduce_n array {i}") if is_device_array(x) else None for i, x in enumerate(arrays)]
        if any(v is None for v in views):
            raise DDLError(f"rank {self.comm.rank}: allreduce_n got GPU and host arrays together; pass one kind")
        return pack_groups(views, [f"{v.dtype}@{v.device}" for v in views],
                           lambda idx: self.comm.allreduce(_concat([arrays[i] for i in idx],
                                                                   views[idx[0]].framework), op))

    def _staged(self, call, problem, host_collective):
        """Broadcast or allgather of a GPU array, staged whole through host memory."""
        a = call.array
        with self.comm.lock:
            self.comm.agree(call.text, problem)
            path = self._path(a.device)
            host = path.to_host(a, call.text).view(host_dtype(a.dtype)).reshape(a.shape)
        result = host_collective(host)
        dst = view(a.empty(result.shape), "result")
        path.to_device(result, dst, call.text)
        return dst.obj


def _concat(arrays: list, framework: str):
    """One flat GPU array of many, by their own framework."""
    if framework == "torch":
        import torch

        return torch.cat([x.reshape(-1) for x in arrays])
    if framework == "cupy":
        import cupy

        return cupy.concatenate([x.reshape(-1) for x in arrays])
    raise DDLError(f"allreduce_n of {type(arrays[0]).__name__} GPU arrays: ddl packs only cupy and torch arrays")
