"""Stand-ins for libcuda and libnccl (C, built here with the system compiler) and an array type that looks
like a GPU array to ddl, so the GPU path's orchestration runs on machines without a GPU: streams complete later,
in order, on threads of their own, and NCCL groups of several processes meet in shared memory. They prove that
ddl stages, offsets, orders, waits and reduces correctly given a driver that behaves; never that a real GPU
does."""
from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def build(directory: str | None = None) -> dict[str, str]:
    """Compiles both libraries into ``directory`` (a private temporary one by default); returns the
    environment that points ddl at them."""
    out = directory or tempfile.mkdtemp(prefix="ddl-fakes-")
    libs = {}
    for name in ("fake_cuda", "fake_nccl"):
        lib = os.path.join(out, f"lib{name}.so")
        # -z nodelete: the stand-in CUDA's stream threads may still be running when ddl closes the library
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-pthread", "-Wl,-z,nodelete", "-o", lib,
                        os.path.join(HERE, f"{name}.c"), "-ldl"], check=True)
        libs[name] = lib
    return {"DDL_CUDA_DRIVER": libs["fake_cuda"], "DDL_NCCL_LIBRARY": libs["fake_nccl"]}


class FakeDeviceArray:
    """A numpy array presented through __cuda_array_interface__ (its memory is the fake driver's "device")."""

    def __init__(self, array: np.ndarray, stream=None):
        self.host = array
        self._stream = stream

    @property
    def dtype(self):
        return self.host.dtype

    @property
    def __cuda_array_interface__(self) -> dict:
        a = self.host
        strides = None if a.flags.c_contiguous else a.strides
        typestr = "<V2" if a.dtype.name == "bfloat16" else a.dtype.str
        return {"data": (a.__array_interface__["data"][0], False), "shape": a.shape, "typestr": typestr,
                "strides": strides, "version": 3, "stream": self._stream}


def synchronize() -> None:
    """Waits for every stream of the stand-in driver (as cudaDeviceSynchronize would): its copies and
    collectives complete later, on threads of their own, so a test reads device memory from the host after this."""
    path = os.environ.get("DDL_CUDA_DRIVER")
    if path:
        ctypes.CDLL(path).fake_cuda_synchronize()


def host_bytes() -> tuple[int, int]:
    """(bytes copied device to host, host to device) by this process so far, as the stand-in driver counted."""
    lib = ctypes.CDLL(os.environ["DDL_CUDA_DRIVER"])
    down, up = ctypes.c_longlong(), ctypes.c_longlong()
    lib.fake_cuda_host_bytes(ctypes.byref(down), ctypes.byref(up))
    return down.value, up.value


def read(result, dtype) -> np.ndarray:
    """The contents of a device array that ddl allocated (a ddl CudaArray), read through the fake driver once
    every stream is done."""
    synchronize()
    cai = result.__cuda_array_interface__
    count = int(np.prod(cai["shape"], dtype=np.int64))
    nbytes = count * np.dtype(dtype).itemsize
    raw = (ctypes.c_char * nbytes).from_address(cai["data"][0]) if nbytes else b""
    return np.frombuffer(bytes(raw), dtype=dtype).reshape(cai["shape"])

