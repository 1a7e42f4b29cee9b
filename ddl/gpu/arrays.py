"""Arrays on CUDA devices as ddl sees them: a pointer, shape, dtype, device and the caller's current stream.

torch CUDA tensors are read through their own attributes (pointer, shape, strides, dtype: no DLPack capsule
per call), cupy arrays through DLPack (``__dlpack__``/``__dlpack_device__``), anything else that lives on a GPU
through ``__cuda_array_interface__``. No framework is imported to find out: a numpy array never reaches this
module, and cupy or torch are only asked for their current stream and for new arrays once one of their arrays
was passed in.

Stream semantics: ddl orders its work after the caller's current stream on the array's device (what the
framework reports as current when the call is made), and orders that stream after ddl's work, so kernels the
caller queues next see the result. Inside one node the call returns once the work is queued; with staged
levels, once ddl's MPI transfers are done. Either way the device result is complete in stream order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import _native
from ..core.devices import KDL_CUDA, KDL_CUDA_MANAGED, is_device_array  # noqa: F401 (re-exported)
from ..errors import DDLError
from .libraries import load_driver

_DLPACK_DTYPES = {(0, 32): "int32", (0, 64): "int64", (2, 16): "float16", (2, 32): "float32",
                  (2, 64): "float64", (4, 16): "bfloat16", (1, 8): "uint8", (0, 8): "int8"}
_ITEMSIZE = {"int32": 4, "int64": 8, "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2, "uint8": 1,
             "int8": 1}
_LEGACY_STREAM = 0  # CUstream 0: the legacy default stream


@dataclass
class DeviceArray:
    obj: object            # the caller's array
    ptr: int               # first byte, on `device`
    shape: tuple
    dtype: str             # a name ddl.core.dtypes knows (or not: then the call fails with its message)
    device: int
    stream: int            # the caller's current stream on `device` (a CUstream handle as an int)
    framework: str         # "cupy", "torch" or "cuda_array_interface"
    keep: object = None    # the DLPack capsule, alive while the pointer is used

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE.get(self.dtype, 0)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    def empty(self, shape: tuple | None = None):
        """A new array of the caller's framework on the same device (same shape unless given)."""
        shape = self.shape if shape is None else tuple(shape)
        if self.framework == "torch":
            import torch

            return torch.empty(shape, dtype=self.obj.dtype, device=self.obj.device)
        if self.framework == "cupy":
            import cupy

            with cupy.cuda.Device(self.device):
                return cupy.empty(shape, dtype=self.obj.dtype)
        return CudaArray.empty(shape, self.dtype, self.device)


class CudaArray:
    """A result ddl allocated for a GPU array of a framework it does not know (one that only offers
    __cuda_array_interface__): device memory of ddl's, exposed through the same interface, so numba
    (numba.cuda.as_cuda_array) and others can use it. It lives as long as this object."""

    def __init__(self, buffer, shape: tuple, dtype: str, device: int):
        self._buffer, self.shape, self.dtype, self.device = buffer, tuple(shape), dtype, device

    @classmethod
    def empty(cls, shape: tuple, dtype: str, device: int) -> "CudaArray":
        nbytes = int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[dtype]
        return cls(_native.DeviceBuffer(load_driver(), device, nbytes), shape, dtype, device)

    @property
    def __cuda_array_interface__(self) -> dict:
        typestr = "<V2" if self.dtype == "bfloat16" else np.dtype(self.dtype).str
        return {"data": (self._buffer.ptr, False), "shape": self.shape, "typestr": typestr, "strides": None,
                "version": 3, "stream": None}

    def __repr__(self) -> str:
        return f"CudaArray(shape={self.shape}, dtype={self.dtype}, device={self.device})"


def host_dtype(name: str) -> np.dtype:
    """The numpy dtype a host copy of a device array is viewed as (bfloat16 travels as its 16-bit words)."""
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def _framework(x) -> str:
    module = type(x).__module__.split(".")[0]
    return module if module in ("torch", "cupy") else "cuda_array_interface"


def current_stream(framework: str, device: int, interface_stream=None) -> int:
    """The stream the caller's framework queues work on now, on ``device``."""
    if framework == "torch":
        import torch

        return int(torch.cuda.current_stream(device).cuda_stream)
    if framework == "cupy":
        import cupy

        with cupy.cuda.Device(device):
            return int(cupy.cuda.get_current_stream().ptr)
    # __cuda_array_interface__ v3: None (no ordering needed), 1 legacy, 2 per-thread, else a handle; the
    # values 1 and 2 are also the driver's CU_STREAM_LEGACY and CU_STREAM_PER_THREAD handles.
    return _LEGACY_STREAM if interface_stream is None else int(interface_stream)


def view(x, what: str = "array") -> DeviceArray:
    """How ddl sees a device array; DDLError for one it cannot use (non-contiguous, unknown dtype, lanes)."""
    framework = _framework(x)
    if framework == "torch" and getattr(x, "is_cuda", False):
        return _from_torch(x, what)
    if hasattr(x, "__dlpack__") and framework in ("torch", "cupy"):
        return _from_dlpack(x, framework, what)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_interface(x, cai, framework, what)
    return _from_dlpack(x, framework, what)


_TORCH_DTYPES: dict = {}


def _from_torch(x, what: str) -> DeviceArray:
    """A CUDA tensor through its own attributes: what DLPack says, without making a capsule (a call's few
    microseconds are a small collective's time)."""
    import torch

    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({getattr(torch, name): name for name in _ITEMSIZE})
    dtype = _TORCH_DTYPES.get(x.dtype)
    if dtype is None:
        raise DDLError(f"{what}: unsupported dtype {x.dtype}")
    if not x.is_contiguous():
        _check_contiguous(tuple(x.shape), tuple(x.stride()), 1, what)
    device = x.device.index
    return DeviceArray(x, x.data_ptr(), tuple(x.shape), dtype, device,
                       torch.cuda.current_stream(device).cuda_stream, "torch")


def _from_dlpack(x, framework: str, what: str) -> DeviceArray:
    try:
        capsule = x.__dlpack__(stream=-1)  # -1: no synchronisation by the producer; ddl orders itself
    except TypeError:
        capsule = x.__dlpack__()
    info = _native.dlpack_info(capsule)
    if info["device_type"] not in (KDL_CUDA, KDL_CUDA_MANAGED):
        raise DDLError(f"{what} is not in GPU memory (DLPack device type {info['device_type']})")
    dtype = _DLPACK_DTYPES.get((info["code"], info["bits"]))
    if dtype is None or info["lanes"] != 1:
        raise DDLError(f"{what}: unsupported DLPack dtype (code {info['code']}, {info['bits']} bits, "
                       f"{info['lanes']} lanes)")
    _check_contiguous(info["shape"], info["strides"], 1, what)
    device = int(info["device_id"])
    return DeviceArray(x, int(info["ptr"]), tuple(info["shape"]), dtype, device,
                       current_stream(framework, device), framework, keep=capsule)


def _from_interface(x, cai: dict, framework: str, what: str) -> DeviceArray:
    typestr = cai["typestr"]
    # The interface's typestr cannot say bfloat16 ("<V2"); the object's own dtype can.
    dtype = getattr(getattr(x, "dtype", None), "name", None) or getattr(x, "dtype", None)
    if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
        try:
            dtype = np.dtype(typestr).name
        except TypeError:
            dtype = typestr
    if typestr.startswith(">"):
        raise DDLError(f"{what}: big-endian dtype {typestr} is not supported")
    shape = tuple(int(s) for s in cai["shape"])
    strides = cai.get("strides")
    itemsize = _ITEMSIZE.get(dtype, 1)
    _check_contiguous(shape, None if strides is None else tuple(s // itemsize for s in strides), 1, what)
    ptr = int(cai["data"][0])
    device = int(getattr(getattr(x, "device", None), "id", 0) or 0)
    return DeviceArray(x, ptr, shape, dtype, device, current_stream(framework, device, cai.get("stream")),
                       framework)


def _check_contiguous(shape, strides, unit: int, what: str) -> None:
    if strides is None:
        return
    expect = unit
    for n, s in zip(reversed(shape), reversed(strides)):
        if n > 1 and s != expect:
            raise DDLError(f"{what} is not C-contiguous (shape {tuple(shape)}, strides {tuple(strides)} elements): "
                           f"make it contiguous first (torch: .contiguous(), cupy: cupy.ascontiguousarray)")
        expect *= n
