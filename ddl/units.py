"""Sizes and bandwidths as users write and read them: ``64K``, ``64KiB``, ``64KB`` and ``1.5M`` in, bytes out;
nccl-tests' algbw and busbw for an allreduce (doc/PERFORMANCE.md: busbw = algbw · 2(n−1)/n)."""
from __future__ import annotations

import re

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B)?\s*", re.IGNORECASE)
_SHIFT = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}


def parse_size(text) -> int:
    """Bytes in ``text``: a number with an optional K/M/G/T (binary: K = 1024), then an optional B or iB.
    ValueError names the text when it is not a size."""
    m = _SIZE.fullmatch(str(text))
    if not m:
        raise ValueError(f"bad size {text!r} (e.g. 8, 64K, 64KiB, 16MB, 1.5G)")
    value = float(m.group(1)) * (1 << _SHIFT[m.group(2).upper()])
    if value != int(value):
        raise ValueError(f"bad size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"


def bus_factor(n: int) -> float:
    """busbw / algbw for an allreduce among n ranks."""
    return 2 * (n - 1) / n if n > 1 else 1.0


def bandwidth(nbytes: float, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of an allreduce of ``nbytes`` among ``n`` ranks that took ``seconds``."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * bus_factor(n)
