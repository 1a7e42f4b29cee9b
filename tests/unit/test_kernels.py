"""Reduction kernels against numpy (and ml_dtypes for bfloat16), element by element."""
import ml_dtypes
import numpy as np
import pytest

from ddl import _native
from ddl.core.dtypes import raw

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BF16, "float32": np.dtype(np.float32),
          "float64": np.dtype(np.float64), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64)}
NUMPY_OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def sample(dtype, n, seed):
    rng = np.random.default_rng(seed)
    if dtype.kind == "i":
        return rng.integers(-1000, 1000, n).astype(dtype)
    return (rng.standard_normal(n) * 10).astype(dtype)


@pytest.mark.parametrize("op", sorted(NUMPY_OPS))
@pytest.mark.parametrize("name", sorted(DTYPES))
@pytest.mark.parametrize("n", [0, 1, 17, 4099])
def test_reduce_into_matches_numpy(name, op, n):
    dt = DTYPES[name]
    a, b = sample(dt, n, 1), sample(dt, n, 2)
    if name in ("float16", "bfloat16"):  # one operation in float32, rounded once: what ml_dtypes/numpy do
        want = NUMPY_OPS[op](a.astype(np.float32), b.astype(np.float32)).astype(dt)
    else:
        want = NUMPY_OPS[op](a, b)
    got = a.copy()
    _native.reduce_into(raw(got), raw(b), getattr(_native.DType, name), getattr(_native.ReduceOp, op))
    assert got.tobytes() == want.tobytes()


def all_half_bits():
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def test_every_float16_value_survives_a_sum_with_zero():
    h = all_half_bits().view(np.float16)
    finite = h[np.isfinite(h) & (h != 0)]  # +0 + -0 would change the sign of zero
    got = finite.copy()
    _native.reduce_into(got, np.zeros_like(finite), _native.DType.float16, _native.ReduceOp.sum)
    assert got.tobytes() == finite.tobytes()


def test_float16_rounding_matches_numpy_on_hard_cases():
    # sums that land between halves, overflow to inf, fall to subnormals
    rng = np.random.default_rng(7)
    a = np.concatenate([all_half_bits().view(np.float16), rng.standard_normal(20000).astype(np.float16)])
    a = a[np.isfinite(a)]
    b = np.roll(a, 1)
    with np.errstate(over="ignore"):  # overflowing to inf is one of the cases
        want = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
    got = a.copy()
    _native.reduce_into(got, b, _native.DType.float16, _native.ReduceOp.sum)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_bfloat16_rounding_matches_ml_dtypes():
    rng = np.random.default_rng(3)
    a = rng.standard_normal(50000).astype(np.float32)
    b = rng.standard_normal(50000).astype(np.float32) * 1e-3
    a16, b16 = a.astype(BF16), b.astype(BF16)
    want = (a16.astype(np.float32) + b16.astype(np.float32)).astype(BF16)
    got = a16.copy()
    _native.reduce_into(raw(got), raw(b16), _native.DType.bfloat16, _native.ReduceOp.sum)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_scale(name):
    dt = DTYPES[name]
    x = np.arange(-8, 8).astype(dt)
    _native.scale(raw(x), getattr(_native.DType, name), 0.25)
    assert np.array_equal(x.astype(np.float64), np.arange(-8, 8) * 0.25)


def test_scale_refuses_integers():
    with pytest.raises(ValueError, match="floating"):
        _native.scale(np.ones(3, np.int32), _native.DType.int32, 0.5)
