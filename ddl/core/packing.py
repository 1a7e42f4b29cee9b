"""allreduce_n's shape, for host and device arrays alike: arrays grouped by a key (dtype, device), one
collective per group on their concatenation, the result cut back into each array's shape."""
from __future__ import annotations

from typing import Callable, Sequence


def pack_groups(items: Sequence, keys: Sequence[str], reduce_group: Callable[[list[int]], object]) -> list:
    """``reduce_group(indices)`` returns the flat reduced concatenation of those items; groups run in sorted
    key order, which is the same on every rank. Items need ``size`` and ``shape``."""
    out: list = [None] * len(items)
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    for key in sorted(groups):
        idx = groups[key]
        reduced = reduce_group(idx)
        start = 0
        for i in idx:
            n = items[i].size
            out[i] = reduced[start:start + n].reshape(items[i].shape)
            start += n
    return out
