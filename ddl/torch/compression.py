"""Gradient compression on the wire: floating-point gradients travel (and are summed) in a narrower dtype and
come back in their own. Halves the bytes of a float32 allreduce at the cost of precision: float16 keeps 11
significant bits in a range of about ±65,504 (sums of many ranks can overflow there), bfloat16 keeps float32's
range with 8 bits. Shaped as Horovod's (``compress`` returns the wire tensor and what ``decompress`` needs),
so ``Compression.fp16`` in a Horovod script means the same here.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import DDLError


class Compressor:
    """No compression: the tensor travels as it is."""

    wire: torch.dtype | None = None

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        if cls.wire is None or not tensor.is_floating_point() or tensor.dtype == cls.wire:
            return tensor, tensor.dtype
        return tensor.to(cls.wire), tensor.dtype

    @classmethod
    def decompress(cls, tensor: torch.Tensor, ctx: torch.dtype) -> torch.Tensor:
        return tensor if tensor.dtype == ctx else tensor.to(ctx)


class FP16Compressor(Compressor):
    wire = torch.float16


class BF16Compressor(Compressor):
    wire = torch.bfloat16


class Compression:
    """The choices for ``DistributedOptimizer(compression=...)``."""

    none = Compressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def check(compression) -> type[Compressor]:
    if not (isinstance(compression, type) and issubclass(compression, Compressor)):
        raise DDLError(f"compression {compression!r}: expected Compression.none, Compression.fp16 or "
                       "Compression.bf16")
    return compression


def wire_array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array sharing a contiguous CPU tensor's memory; bfloat16 as ml_dtypes' bfloat16 (numpy has
    none), which ddl reduces natively."""
    if tensor.dtype != torch.bfloat16:
        return tensor.numpy()
    try:
        import ml_dtypes
    except ImportError as e:
        raise DDLError("Compression.bf16 on CPU tensors needs ml_dtypes (pip install ddl[bfloat16])") from e
    return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
