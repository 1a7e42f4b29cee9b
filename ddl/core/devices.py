"""The seam between the road (ddl.core.road) and the GPU path.

The communicator's calls recognise a device array here (without importing any framework or ddl.gpu), describe
it through the view registered here, and its table takes the device path registered here, first. ddl.gpu
registers both when imported (``import ddl`` does that), so the dependency points one way: ddl.gpu uses the
communicator's public methods, core never imports ddl.gpu.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import DDLError

KDL_CUDA, KDL_CUDA_MANAGED = 2, 13  # DLPack device types in GPU memory

_factory: Callable | None = None


def is_device_array(x) -> bool:
    """True for arrays that live in GPU memory (cheap: numpy arrays and lists answer at once)."""
    if isinstance(x, (np.ndarray, list, tuple, int, float)) or x is None:
        return False
    if getattr(x, "is_cuda", False) is True:  # torch
        return True
    if hasattr(x, "__cuda_array_interface__"):
        return True
    where = getattr(x, "__dlpack_device__", None)
    if where is None:
        return False
    try:
        return where()[0] in (KDL_CUDA, KDL_CUDA_MANAGED)
    except Exception:
        return False


def register(factory: Callable, viewer: Callable) -> None:
    """``factory(communicator)`` makes the device path of a communicator's table (ddl.core.road: ``name``,
    ``serves``, ``takes``, ``run``; ``allreduce_n(arrays, op)`` and ``close()``); ``viewer(array, what)`` is how
    calls see a device array (ddl.gpu.arrays.view)."""
    global _factory, _viewer
    _factory, _viewer = factory, viewer


_viewer: Callable | None = None


def view(x, what: str):
    if _viewer is None:
        raise DDLError("GPU arrays need ddl.gpu (import ddl registers it)")
    return _viewer(x, what)


class Unavailable:
    """The device path's place where ddl.gpu was not imported: a GPU array's call fails there, with why."""
    name = "device"
    serves = frozenset(("allreduce", "broadcast", "allgather"))
    first = True

    def __init__(self, comm):
        self.comm = comm

    def takes(self, call) -> str | None:
        return "a GPU array" if call.device else None

    def run(self, call):
        raise DDLError(f"rank {self.comm.rank}: GPU arrays need ddl.gpu (import ddl registers it)")

    def allreduce_n(self, arrays: list, op: str):
        raise DDLError(f"rank {self.comm.rank}: GPU arrays need ddl.gpu (import ddl registers it)")

    def close(self) -> None:
        pass


def path_for(comm):
    return (_factory or Unavailable)(comm)
