"""Which numpy dtypes and reduction ops ddl supports, and their codes in the native executor."""
from __future__ import annotations

import numpy as np

from .. import _native
from ..errors import DDLError

# bfloat16 is recognised by name: ml_dtypes (as used by JAX and TensorFlow) provides it for numpy.
_DTYPES = {
    "float16": _native.DType.float16,
    "bfloat16": _native.DType.bfloat16,
    "float32": _native.DType.float32,
    "float64": _native.DType.float64,
    "int32": _native.DType.int32,
    "int64": _native.DType.int64,
}
FLOATING = {"float16", "bfloat16", "float32", "float64"}

# "avg" is sum, then a scale by 1/size; it is refused for integers rather than silently truncated.
_OPS = {"sum": _native.ReduceOp.sum, "avg": _native.ReduceOp.sum, "prod": _native.ReduceOp.prod,
        "min": _native.ReduceOp.min, "max": _native.ReduceOp.max}


_NAMES: dict = {}


def _name(dtype: np.dtype) -> str:
    """dtype.name, cached: numpy computes it in Python, which would dominate a small allreduce."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = dtype.name
    return name


def native_dtype(dtype: np.dtype) -> "_native.DType":
    if dtype.byteorder == ">":
        raise DDLError(f"unsupported dtype {dtype} (supported: {', '.join(_DTYPES)}, native byte order)")
    return native_dtype_name(_name(dtype))


def native_dtype_name(name: str) -> "_native.DType":
    """The executor's code for a dtype given by name (GPU arrays of frameworks other than numpy)."""
    code = _DTYPES.get(name)
    if code is None:
        raise DDLError(f"unsupported dtype {name} (supported: {', '.join(_DTYPES)}, native byte order)")
    return code


def native_op(op: str, dtype: np.dtype) -> "_native.ReduceOp":
    return native_op_name(op, _name(dtype))


def native_op_name(op: str, dtype_name: str) -> "_native.ReduceOp":
    code = _OPS.get(op) if isinstance(op, str) else None
    if code is None:
        raise DDLError(f"unknown reduction op {op!r} (supported: {', '.join(_OPS)})")
    if op == "avg" and dtype_name not in FLOATING:
        raise DDLError(f"op 'avg' is not defined for {dtype_name} (integers would truncate); use 'sum' and divide")
    return code


def raw(array: np.ndarray) -> np.ndarray:
    """What the executor gets: the array itself, or a uint16 view of bfloat16 (which has no buffer format)."""
    return array.view(np.uint16) if _name(array.dtype) == "bfloat16" else array
