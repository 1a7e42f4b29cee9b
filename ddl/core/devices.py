"""The seam between the host collectives and the GPU path.

The communicator recognises a device array here (without importing any framework or ddl.gpu) and hands it to
the device collectives registered here. ddl.gpu registers itself when imported (``import ddl`` does that), so
the dependency points one way: ddl.gpu uses the communicator's public methods, core never imports ddl.gpu.
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


def register(factory: Callable) -> None:
    """``factory(communicator)`` makes the object that runs a communicator's collectives on device arrays:
    ``allreduce(array, op, out)``, ``allreduce_n(arrays, op)``, ``broadcast(array, root)``, ``allgather(array)``,
    ``close()``."""
    global _factory
    _factory = factory


def collectives_for(comm):
    if _factory is None:
        raise DDLError(f"rank {comm.rank}: GPU arrays need ddl.gpu (import ddl registers it)")
    return _factory(comm)
