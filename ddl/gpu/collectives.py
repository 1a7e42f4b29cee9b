"""A communicator's collectives on GPU arrays, built on its public seam (``lock``, ``agree``, ``allreduce_plan``,
``execute``, ``mpi_comm``): allreduce through the device path (NCCL inside a node, staged MPI levels above),
broadcast and allgather staged whole through host memory. Registered with ddl.core.devices by ddl.gpu."""
from __future__ import annotations

from ..core.dtypes import native_dtype_name, native_op_name
from ..core.packing import pack_groups
from ..errors import DDLError, DeviceError
from .arrays import host_dtype, is_device_array, view
from .libraries import load_driver, load_nccl
from .path import DevicePath


class DeviceCollectives:
    """One communicator's GPU machinery: a DevicePath per device, made on its first collective."""

    def __init__(self, comm):
        self.comm = comm
        self._paths: dict[int, DevicePath] = {}

    def close(self) -> None:
        for path in self._paths.values():
            path.close()
        self._paths.clear()

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

    def allreduce(self, array, op: str, out):
        problem, a, dst = self._libraries_problem(), None, None
        try:
            a = view(array, "allreduce input")
            native_dtype_name(a.dtype), native_op_name(op, a.dtype)
            if out is not None:
                dst = view(out, "out") if is_device_array(out) else None
                if dst is None or (dst.shape, dst.dtype, dst.device) != (a.shape, a.dtype, a.device):
                    raise DDLError(f"out must be a GPU array of shape {a.shape}, dtype {a.dtype} on device "
                                   f"{a.device}")
        except DDLError as e:
            problem = problem or str(e)
        # An unusable input still takes part in the agreement round (as its error), so every rank raises.
        text = problem if a is None else f"allreduce(cuda, shape={a.shape}, dtype={a.dtype}, op={op})"
        with self.comm.lock:
            self.comm.agree(text, problem)
            dst = dst or view(a.empty(), "result")
            if a.size:
                self._path(a.device).allreduce(a, dst, op, text)
        return dst.obj

    def allreduce_n(self, arrays: list, op: str) -> list:
        """One allreduce per dtype and device, on the framework's concatenation."""
        views = [view(x, f"allreduce_n array {i}") if is_device_array(x) else None for i, x in enumerate(arrays)]
        if any(v is None for v in views):
            raise DDLError(f"rank {self.comm.rank}: allreduce_n got GPU and host arrays together; pass one kind")
        return pack_groups(views, [f"{v.dtype}@{v.device}" for v in views],
                           lambda idx: self.allreduce(_concat([arrays[i] for i in idx], views[idx[0]].framework),
                                                      op, None))

    def broadcast(self, array, root: int):
        return self._staged("broadcast", array, lambda host: self.comm.broadcast(host, root), f"root={root}")

    def allgather(self, array):
        return self._staged("allgather", array, self.comm.allgather, "")

    def _staged(self, name: str, array, host_collective, extra: str):
        """Broadcast or allgather of a GPU array, staged whole through host memory."""
        problem = self._libraries_problem()
        try:
            a = view(array, f"{name} input")
        except DDLError as e:  # still takes part in the agreement round, as its error
            a, problem = None, str(e)
        shape = a and (a.shape if name == "broadcast" else f"(*, {', '.join(map(str, a.shape[1:]))})")  # rows vary
        text = f"{name}(cuda, shape={shape}, dtype={a and a.dtype}{', ' + extra if extra else ''})"
        with self.comm.lock:
            self.comm.agree(text, problem)
            path = self._path(a.device)
            host = path.to_host(a, text).view(host_dtype(a.dtype)).reshape(a.shape)
        result = host_collective(host)
        dst = view(a.empty(result.shape), "result")
        path.to_device(result, dst, text)
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
