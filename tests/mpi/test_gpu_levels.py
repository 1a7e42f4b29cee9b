"""Every device collective per level, with NCCL groups of several ranks, on machines without a GPU: ddl is pointed
at the stand-ins (tests/fakes: host memory plays device memory; the stand-in NCCL serves communicators of
several processes of this host through shared memory). Each layout of ranks is a communicator of its own:

- "staged": every level over MPI (DDL_NCCL_LEVELS=0; groups of one rank);
- "one group": one NCCL group of every rank, in rank order (NCCL's collectives as they are);
- "reversed": one group whose members are not in rank order (rows are laid out for it, and put back);
- "pairs": groups of two ranks that are not neighbours (r and r + size/2), MPI between them (a layout
  before and after NCCL, and a staged level on each member's share: DDL_NCCL_LEVELS=1);
- "every level": the same tree with NCCL at both levels (DDL_NCCL_LEVELS=all), large buffers in blocks (the
  wavefront of group calls, its block size lowered so the tests' sizes reach it);
- "racks": three levels (pairs of pairs of ranks, every level on NCCL) where the ranks make them (8), and
  where they do not divide evenly (3) nodes of two and one rank: no level NCCL's equal blocks can serve, all
  staged.

Expected values come from numpy over every rank's inputs. What this proves: layouts, offsets, padding, uneven
rows, avg scaling across levels, out handling, agreement and errors. What it cannot: anything about real GPUs
(tests/gpu does that where one exists).
"""
import ctypes
import os
import tempfile
import time

import numpy as np
import pytest
from mpi4py import MPI
from test_collectives import DTYPES, assert_reduced, contribution, expected, name, valid

from ddl import DDLError, gpu
from ddl.gpu import path as path_module
from ddl.core.communicator import Communicator
from ddl.options import parse
from fakes import FakeDeviceArray, build, read, synchronize

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
LAYOUTS = ["staged", "one group", "reversed", "pairs", "every level", "racks"]
SETTING = {"staged": "0", "one group": "auto", "reversed": "auto", "pairs": "1", "every level": "all",
           "racks": "all"}


def hierarchy(layout):
    if layout == "reversed":
        return [list(reversed(range(SIZE)))]
    if layout in ("pairs", "every level"):
        half = SIZE // 2
        return [[r, r + half] for r in range(half)]
    if layout == "racks":
        return [[[0, 1], [2, 3]], [[4, 5], [6, 7]]] if SIZE == 8 else [[0, 1], [2]]
    return None


def nccl_groups(layout):
    """The NCCL group sizes of every level the layout runs on NCCL."""
    return {"staged": [], "one group": [SIZE], "reversed": [SIZE], "pairs": [2],
            "every level": [2, SIZE // 2], "racks": [2, 2, 2] if SIZE == 8 else []}[layout]


@pytest.fixture(scope="module", autouse=True)
def fakes():
    saved = {k: os.environ.get(k) for k in ("DDL_CUDA_DRIVER", "DDL_NCCL_LIBRARY", "DDL_NCCL_LEVELS")}
    libraries = tempfile.TemporaryDirectory(prefix="ddl-fakes-")
    os.environ.update(build(libraries.name))
    gpu.libraries._LIBS.clear()
    yield
    gpu.libraries._LIBS.clear()
    libraries.cleanup()
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module", params=LAYOUTS)
def comm(request):
    layout = request.param
    if layout in ("pairs", "every level") and (SIZE < 4 or SIZE % 2):
        pytest.skip("pairs of ranks with a level between them need an even number of ranks, 4 or more")
    if layout == "reversed" and SIZE == 1:
        pytest.skip("one rank is in rank order")
    if layout == "racks" and SIZE not in (3, 8):
        pytest.skip("racks of pairs of pairs at 8 ranks, uneven nodes at 3")
    os.environ["DDL_NCCL_LEVELS"] = SETTING[layout]
    c = Communicator.from_mpi(COMM, parse("-timeout 60"), hierarchy=hierarchy(layout))
    # another now: the levels are the communicator's, read as it was made, not at its first device call
    os.environ["DDL_NCCL_LEVELS"] = "auto" if layout == "staged" else "0"
    blocks, most = path_module.PIPELINE_BYTES, path_module.MAX_BLOCKS
    path_module.PIPELINE_BYTES, path_module.MAX_BLOCKS = 1 << 20, 4  # (the wavefront from 2 MiB)
    x = np.ones(1, np.float32)
    c.allreduce(FakeDeviceArray(x), out=FakeDeviceArray(x))
    path = c.road.named("device")._paths[0]
    sizes = [g.nranks if g is not None else 1 for g in path.groups]
    assert sizes == nccl_groups(layout), f"{layout}: NCCL groups of {sizes} ranks, not {nccl_groups(layout)}"
    yield c
    path_module.PIPELINE_BYTES, path_module.MAX_BLOCKS = blocks, most
    c.close()


def on_device(result, dtype):
    return read(result, np.uint16).view(dtype) if name(dtype) == "bfloat16" else read(result, dtype)


def assert_close(got, want, dtype, what):
    tol = {"float16": 2e-3, "bfloat16": 2e-2}.get(name(dtype), 1e-6)
    g = np.asarray(got, np.float64).reshape(-1)
    w = np.asarray(want, np.float64).reshape(-1)
    assert g.shape == w.shape, f"rank {RANK}: {what}: {g.shape} values, not {w.shape}"
    bad = np.flatnonzero(np.abs(g - w) > tol * (1 + np.abs(w)))
    assert bad.size == 0, (f"rank {RANK} of {SIZE}: {what}: {bad.size} wrong, first at {bad[0]}: "
                           f"{g[bad[0]]} != {w[bad[0]]}")


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("n", [1, 10007, (3 << 20) // 4 + 5])
def test_allreduce(comm, n, dtype, op):
    if not valid(dtype, op):
        pytest.skip("avg is refused for integers")
    x = contribution(RANK, n, dtype, op)
    assert_reduced(on_device(comm.allreduce(FakeDeviceArray(x), op), dtype), n, dtype, op)
    comm.allreduce(FakeDeviceArray(x), op, out=FakeDeviceArray(x))  # in place
    synchronize()  # (the stand-in's streams complete later, as a GPU's do)
    assert_reduced(x, n, dtype, op)


def uneven_rows(total):
    """Rows per rank that differ (rank 0 none where there are several ranks), summing to ``total``."""
    rows = [0] + [total // max(SIZE - 1, 1)] * (SIZE - 1) if SIZE > 1 else [total]
    rows[-1] += total - sum(rows)
    return rows


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["sum", "avg", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64], ids=name)
@pytest.mark.parametrize("rows_per_rank, cols, counts", [(1, 1, None), (7, 3, None), (5, 4000, None),
                                                        (0, 5, None), (4, 3, "uneven")])
def test_reduce_scatter(comm, rows_per_rank, cols, counts, dtype, op):
    if not valid(dtype, op):
        pytest.skip("avg is refused for integers")
    total = rows_per_rank * SIZE + (1 if counts is None and rows_per_rank else 0)  # not a multiple of SIZE
    split = uneven_rows(total) if counts == "uneven" else None
    rows = split or [total // SIZE + (r < total % SIZE) for r in range(SIZE)]
    x = contribution(RANK, total * cols, dtype, op).reshape(total, cols)
    want = expected(total * cols, op).reshape(total, cols)[sum(rows[:RANK]):sum(rows[:RANK + 1])]
    got = on_device(comm.reduce_scatter(FakeDeviceArray(x), op, counts=split), dtype)
    assert got.shape == (rows[RANK], cols)
    assert_close(got, want, dtype, f"reduce_scatter {op} rows {rows}")
    out = np.full((rows[RANK], cols), 9, dtype)
    comm.reduce_scatter(FakeDeviceArray(x), op, out=FakeDeviceArray(out), counts=split)
    synchronize()
    assert_close(out, want, dtype, f"reduce_scatter into out, rows {rows}")


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float64], ids=name)
@pytest.mark.parametrize("rows, cols", [("even", 1), ("even", 3001), ("uneven", 3), ("none here", 2)])
def test_allgather(comm, rows, cols, dtype):
    every = {"even": [3] * SIZE, "uneven": [r + 1 for r in range(SIZE)],
             "none here": [0 if r == 0 else 2 for r in range(SIZE)]}[rows]
    mine = (np.arange(every[RANK] * cols) + 1000 * RANK).astype(dtype).reshape(every[RANK], cols)
    want = np.concatenate([(np.arange(every[r] * cols) + 1000 * r).astype(dtype).reshape(every[r], cols)
                           for r in range(SIZE)])
    got = on_device(comm.allgather(FakeDeviceArray(mine)), dtype)
    assert np.array_equal(got, want)
    out = np.zeros_like(want)
    comm.allgather(FakeDeviceArray(mine), out=FakeDeviceArray(out))
    synchronize()
    assert np.array_equal(out, want)


@pytest.mark.mpi
def test_allgather_into_an_out_of_the_wrong_length_raises_everywhere(comm):
    mine = np.full((2, 3), RANK, np.float32)
    rows = 2 * SIZE + (1 if RANK == SIZE - 1 else 0)  # the last rank's out is one row too long
    with pytest.raises(DDLError, match=rf"out of rank\(s\) \[{SIZE - 1}\] has another first dimension"):
        comm.allgather(FakeDeviceArray(mine), out=FakeDeviceArray(np.zeros((rows, 3), np.float32)))
    assert comm.allreduce(np.ones(2))[0] == SIZE  # the communicator still works


@pytest.mark.mpi
@pytest.mark.parametrize("nbytes", [1, 40, (3 << 20) + 3])
def test_broadcast_from_every_root(comm, nbytes):
    for root in range(SIZE):
        data = (np.arange(nbytes) * (RANK + 1) % 251).astype(np.uint8)
        want = (np.arange(nbytes) * (root + 1) % 251).astype(np.uint8)
        assert np.array_equal(read(comm.broadcast(FakeDeviceArray(data), root), np.uint8), want)
        out = np.zeros(nbytes, np.uint8)
        comm.broadcast(FakeDeviceArray(data), root, out=FakeDeviceArray(out))
        synchronize()
        assert np.array_equal(out, want)
        comm.broadcast(FakeDeviceArray(data), root, out=FakeDeviceArray(data))  # in place
        synchronize()
        assert np.array_equal(data, want)


@pytest.mark.mpi
def test_a_bad_call_on_one_rank_raises_on_every_rank(comm):
    x = np.ones((SIZE * 2, 3), np.float32)
    with pytest.raises(DDLError, match="counts" if SIZE == 1 else "ranks called ddl differently|counts"):
        comm.reduce_scatter(FakeDeviceArray(x), "sum", counts=[1] * SIZE if RANK == 0 else None)
    with pytest.raises(DDLError, match="out must be a GPU array"):
        comm.reduce_scatter(FakeDeviceArray(x), "sum", out=FakeDeviceArray(np.ones((5, 3), np.float32)))
    with pytest.raises(DDLError, match="broadcast root 99"):
        comm.broadcast(FakeDeviceArray(x), 99)
    got = on_device(comm.reduce_scatter(FakeDeviceArray(x), "sum"), np.float32)  # still works
    assert np.array_equal(got, np.full((2, 3), SIZE, np.float32))


@pytest.mark.mpi
def test_ddl_follows_and_precedes_the_callers_stream(comm):
    """The caller's own stream (the stand-in's streams run later, in order): a copy queued there before the call
    is what ddl reduces, and a copy queued there after it reads the result, with no synchronisation between."""
    drv = ctypes.CDLL(os.environ["DDL_CUDA_DRIVER"])
    stream, event = ctypes.c_void_p(), ctypes.c_void_p()
    drv.cuStreamCreate(ctypes.byref(stream), 1)
    drv.cuEventCreate(ctypes.byref(event), 0)
    x, given, seen = (np.zeros(1 << 16, np.float32), np.full(1 << 16, RANK + 1, np.float32),
                      np.zeros(1 << 16, np.float32))
    ptr, nbytes = ctypes.c_ulonglong(x.ctypes.data), ctypes.c_size_t(x.nbytes)
    drv.cuMemcpyHtoDAsync_v2(ptr, ctypes.c_void_p(given.ctypes.data), nbytes, stream)  # x = rank + 1, later
    comm.allreduce(FakeDeviceArray(x, stream.value), out=FakeDeviceArray(x, stream.value))
    drv.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(seen.ctypes.data), ptr, nbytes, stream)
    drv.cuEventRecord(event, stream)
    deadline = time.monotonic() + 30
    while drv.cuEventQuery(event) != 0 and time.monotonic() < deadline:
        time.sleep(0.0005)
    assert drv.cuEventQuery(event) == 0, "the caller's stream never got past ddl's work"
    assert np.all(seen == SIZE * (SIZE + 1) / 2), f"rank {RANK}: {seen[:4]}"
    drv.cuEventDestroy_v2(event)
    drv.cuStreamDestroy_v2(stream)
