"""The GPU path's orchestration under real MPI, on machines without a GPU: ddl is pointed at stand-ins for
libcuda and libnccl (tests/fakes: host memory plays device memory), and every
level runs over MPI staged through "pinned" buffers (DDL_NCCL_LEVELS=0) — the configuration the GPU tests use
with several processes on one GPU. What this proves: staging offsets, chunking, padding, avg scaling, agreement
and error paths. What it cannot: anything about real GPUs (tests/gpu does that where one exists).
"""
import os
import tempfile

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI
from test_collectives import DTYPES, OPS, assert_reduced, contribution, name, valid

import ddl
from ddl import DDLError, MismatchError, _native, gpu
from ddl.core.communicator import Communicator
from ddl.errors import DeviceError, TransportError
from ddl.options import parse
from fakes import FakeDeviceArray, build, read, synchronize

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
STAGED_BYTES = (6 << 20) + 12  # several staging pieces of 1.5 MiB, and not a multiple of them


@pytest.fixture(scope="module", autouse=True)
def world():
    saved = {k: os.environ.get(k) for k in ("DDL_CUDA_DRIVER", "DDL_NCCL_LIBRARY", "DDL_NCCL_LEVELS")}
    libraries = tempfile.TemporaryDirectory(prefix="ddl-fakes-")  # removed below: once loaded, not needed
    os.environ.update(build(libraries.name))
    os.environ["DDL_NCCL_LEVELS"] = "0"
    gpu.libraries._LIBS.clear()
    ddl.finalize()
    ddl.init(COMM, options="-timeout 60")
    yield
    ddl.finalize()
    gpu.libraries._LIBS.clear()
    libraries.cleanup()
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def host_result(result, dtype):
    return read(result, np.uint16).view(dtype) if name(dtype) == "bfloat16" else read(result, dtype)


@pytest.mark.mpi
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("n", [0, 1, 10007])
def test_device_allreduce_every_dtype_and_op(n, dtype, op):
    if not valid(dtype, op):
        pytest.skip("avg is refused for integers")
    x = contribution(RANK, n, dtype, op)
    before = x.copy()
    result = ddl.allreduce(FakeDeviceArray(x), op)
    assert_reduced(host_result(result, dtype), n, dtype, op)
    assert np.array_equal(x.view(np.uint8), before.view(np.uint8))  # the input is untouched
    ddl.allreduce(FakeDeviceArray(x), op, out=FakeDeviceArray(x))  # in place
    synchronize()  # (the stand-in's streams complete later, as a GPU's do)
    assert_reduced(x, n, dtype, op)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=name)
def test_device_allreduce_stages_in_pieces(dtype):
    n = STAGED_BYTES // np.dtype(dtype).itemsize
    x = contribution(RANK, n, dtype, "sum")
    out = np.full(n, 7, dtype)
    ddl.allreduce(FakeDeviceArray(x), "sum", out=FakeDeviceArray(out))
    synchronize()
    assert_reduced(out, n, dtype, "sum")


@pytest.mark.mpi
def test_device_allreduce_n_broadcast_and_allgather():
    a = np.arange(5, dtype=np.float64) + RANK
    b = np.full((2, 3), RANK + 1, np.int32)
    want_a = sum(np.arange(5, dtype=np.float64) + r for r in range(SIZE))
    got = ddl.allreduce(FakeDeviceArray(a), out=FakeDeviceArray(np.empty_like(a)))
    assert got is not None
    with pytest.raises(DDLError, match="packs only cupy and torch"):
        ddl.allreduce_n([FakeDeviceArray(a), FakeDeviceArray(b)])
    root = SIZE - 1
    got = host_result(ddl.broadcast(FakeDeviceArray(np.full(4, RANK, np.int64)), root=root), np.int64)
    assert got.tolist() == [root] * 4
    rows = np.full((RANK + 1, 2), RANK, np.float32)  # first dims differ per rank
    got = host_result(ddl.allgather(FakeDeviceArray(rows)), np.float32)
    want = np.concatenate([np.full((r + 1, 2), r, np.float32) for r in range(SIZE)])
    assert np.array_equal(got, want)
    assert np.array_equal(read(ddl.allreduce(FakeDeviceArray(a)), np.float64), want_a)


@pytest.mark.mpi
def test_device_calls_that_differ_raise_everywhere():
    if SIZE == 1:
        pytest.skip("needs peers")
    dtype = np.float32 if RANK else np.float64
    with pytest.raises(MismatchError, match="ranks called ddl differently"):
        ddl.allreduce(FakeDeviceArray(np.ones(8, dtype)))
    x = np.ones(8, np.float32)  # a GPU array on one rank, a host array on the others
    with pytest.raises(MismatchError):
        ddl.allreduce(FakeDeviceArray(x) if RANK == 0 else x)
    with pytest.raises(DDLError, match="avg"):  # the same bad call everywhere: every rank raises
        ddl.allreduce(FakeDeviceArray(np.ones(3, np.int32)), "avg")
    assert ddl.allreduce(np.ones(2))[0] == SIZE  # the communicator still works


@pytest.mark.mpi
def test_non_contiguous_and_mismatched_out_are_refused():
    x = np.ones((4, 4), np.float32)
    with pytest.raises(DDLError, match="not C-contiguous"):
        ddl.allreduce(FakeDeviceArray(x[:, ::2]))
    with pytest.raises(DDLError, match="out must be a GPU array of shape"):
        ddl.allreduce(FakeDeviceArray(x), out=FakeDeviceArray(np.ones(3, np.float32)))
    # on one rank only: that rank still takes part, so every rank raises at once instead of waiting
    with pytest.raises(DDLError, match="not C-contiguous" if SIZE == 1 else "ranks called ddl differently"):
        ddl.allreduce(FakeDeviceArray(x[:, ::2] if RANK == 0 else x))
    with pytest.raises(DDLError, match="not C-contiguous" if SIZE == 1 else "ranks called ddl differently"):
        ddl.broadcast(FakeDeviceArray(x[:, ::2] if RANK == 0 else x))
    assert ddl.allreduce(np.ones(2))[0] == SIZE


@pytest.mark.mpi
def test_groups_larger_than_nccl_allows_fail_with_nccl_message():
    """One host, DDL_NCCL_LEVELS=auto: the group is every rank, which the stand-in is told to refuse as real
    NCCL refuses what it cannot do: every rank raises DeviceError with NCCL's words, none hangs."""
    if SIZE == 1:
        pytest.skip("a group of one is allowed")
    os.environ.update(DDL_NCCL_LEVELS="auto", FAKE_NCCL_MAX_RANKS="1")
    comm = Communicator.from_mpi(COMM, ddl.communicator().options)
    try:
        with pytest.raises(DeviceError, match="ncclCommInitRankConfig.*invalid usage"):
            comm.allreduce(FakeDeviceArray(np.ones(4, np.float32)))
    finally:
        os.environ["DDL_NCCL_LEVELS"] = "0"
        del os.environ["FAKE_NCCL_MAX_RANKS"]
        comm.close()


@pytest.mark.mpi
def test_cuda_awareness_of_mpi_is_detected():
    """Open MPI answers through MPIX_Query_cuda_support: the PyPI wheel is built without CUDA."""
    answer = _native.mpi_cuda_support()
    assert answer in (-1, 0, 1)
    if MPI.Get_library_version().startswith("Open MPI"):
        assert answer == 0
    x = np.ones(1)
    ddl.allreduce(FakeDeviceArray(x), out=FakeDeviceArray(x))  # makes the device path if no test did yet
    path = ddl.communicator().road.named("device")._paths[0]
    assert path.cuda_aware_mpi == {1: "yes", 0: "no", -1: "unknown"}[answer]


@pytest.mark.mpi
def test_a_copy_that_never_finishes_ends_in_an_error_not_a_hang():
    """Every GPU event stays pending (stand-in): the executor, waiting for a staged block's copy, gives up after
    the deadline with a message that says so, on every rank."""
    if SIZE == 1:
        pytest.skip("nothing is staged on one rank")
    comm = Communicator.from_mpi(COMM, parse("-timeout 1"))
    x = np.ones(1000, np.float32)
    comm.allreduce(FakeDeviceArray(x), out=FakeDeviceArray(x))  # the device path is built while events pass
    os.environ["FAKE_CUDA_PENDING"] = "1"
    try:
        with pytest.raises(TransportError, match="block 0's data never became ready"):
            comm.allreduce(FakeDeviceArray(x), out=FakeDeviceArray(x))
    finally:
        del os.environ["FAKE_CUDA_PENDING"]
        comm.close()
