"""The GPU libraries, opened at run time (ddl builds without CUDA): the CUDA driver and NCCL, each loaded once
per process; DeviceError says what is missing and where ddl looked."""
from __future__ import annotations

import glob
import os
import sys
import threading

from .. import _native
from ..config import get as setting
from ..errors import DeviceError

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
        errors = []
        for path in nccl_candidates(environ):
            try:
                _LIBS["nccl"] = _native.NcclLibrary(path)
                return _LIBS["nccl"]
            except DeviceError as e:
                errors.append(str(e))
        raise DeviceError("no usable NCCL library; install the wheel (pip install 'ddl[gpu]', which brings "
                          "nvidia-nccl-cu12) or set DDL_NCCL_LIBRARY. Tried: " + "; ".join(errors))
