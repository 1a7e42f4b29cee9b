"""ddl-bench's helpers: sizes, exact inputs, the nccl-tests bandwidth formulas."""
import argparse

import numpy as np
import pytest

from ddl.tools import bench
from ddl.tools.cli import size


def test_size_arguments():
    assert [size(s) for s in ("8", "64K", "64M", "1G")] == [8, 65536, 64 << 20, 1 << 30]
    with pytest.raises(argparse.ArgumentTypeError, match="bad size 'lots'"):
        size("lots")


def test_sizes_sweep_like_nccl_tests():
    assert bench.sizes(8, 64, 2) == [8, 16, 32, 64]


def test_busbw_uses_the_allreduce_factor():
    algbw, busbw = bench.bandwidth(8_000_000, 1000.0, 4)  # 8 MB in 1 ms
    assert algbw == pytest.approx(8.0)
    assert busbw == pytest.approx(8.0 * 2 * 3 / 4)


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
def test_inputs_reduce_exactly_in_float16(op):
    size, count = 8, 1000
    want = bench.expected(size, count, np.dtype(np.float64), op)
    stack = np.stack([bench.inputs(r, count, np.dtype(np.float16), op).astype(np.float64) for r in range(size)])
    ref = {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0), "max": stack.max(0),
           "avg": stack.sum(0) / size}[op]
    assert np.array_equal(want, ref)
    assert bench.count_wrong(want.astype(np.float16), ref, op, np.dtype(np.float16)) == 0
    assert bench.count_wrong((want + 1).astype(np.float16), ref, op, np.dtype(np.float16)) == count
