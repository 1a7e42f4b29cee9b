"""ddl over real MPI processes: run with mpiexec -n N python -m pytest --with-mpi tests/mpi (any N).

Inputs are small integers (or +-1 for prod), so every reduction is exact in every dtype and the expected
values follow from rank and size alone; numpy computes them here, independently of ddl.
"""
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import ddl
from ddl import DDLError, MismatchError, TransportError
from ddl.core.communicator import Communicator
from ddl.topology.tree import depth, normalize

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int32, np.int64]
OPS = ["sum", "avg", "prod", "min", "max"]
LARGE_BYTES = (16 << 20) + 4  # past 16 MiB, not a multiple of anything convenient


pytestmark = pytest.mark.usefixtures("world")  # tests/mpi/conftest.py


def name(dtype):
    return np.dtype(dtype).name


def contribution(rank, n, dtype, op):
    i = np.arange(n, dtype=np.int64)
    v = ((i + rank) % 2) * 2 - 1 if op == "prod" else (i * 3 + rank) % 5 - 2
    return v.astype(dtype)


NUMPY_OPS = {"sum": np.sum, "avg": np.sum, "prod": np.prod, "min": np.min, "max": np.max}


def expected(n, op):
    """Element i's inputs depend on i only through i mod 5 (i mod 2 for prod): reduce one period of every
    rank's inputs with numpy, then tile it, so the check costs O(n), not O(n * size)."""
    period = 2 if op == "prod" else 5
    table = NUMPY_OPS[op](np.stack([contribution(r, period, np.float64, op) for r in range(SIZE)]), axis=0)
    want = table[np.arange(n) % period]
    return want / SIZE if op == "avg" else want


def assert_reduced(got, n, dtype, op):
    assert got.dtype == np.dtype(dtype)
    want = expected(n, op)
    tol = {"float16": 1e-3, "bfloat16": 1e-2}.get(name(dtype), 1e-7) if op == "avg" else 0
    g = got.reshape(-1).astype(np.float64)
    bad = np.flatnonzero(np.abs(g - want) > tol * (1 + np.abs(want)))  # numpy's assert_allclose is 20x slower
    assert bad.size == 0, (f"rank {RANK} of {SIZE}: {name(dtype)} {op} n={n}: {bad.size} wrong, first at "
                           f"{bad[0]}: {g[bad[0]]} != {want[bad[0]]}")


def valid(dtype, op):
    return not (op == "avg" and np.dtype(dtype).kind == "i")


@pytest.mark.mpi
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("n", [0, 1, 10007])
def test_allreduce_small_sizes(n, dtype, op):
    if not valid(dtype, op):
        pytest.skip("avg is refused for integers (tested below)")
    x = contribution(RANK, n, dtype, op)
    assert_reduced(ddl.allreduce(x, op), n, dtype, op)
    ddl.allreduce(x, op, out=x)  # in place
    assert_reduced(x, n, dtype, op)


@pytest.mark.mpi
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_allreduce_16_mib_in_and_out_of_place_2d(dtype, op):
    if not valid(dtype, op):
        pytest.skip("avg is refused for integers (tested below)")
    itemsize = np.dtype(dtype).itemsize
    n = -(-LARGE_BYTES // itemsize)
    n += (-n) % 2  # even, so it folds into two rows
    x = contribution(RANK, n, dtype, op).reshape(2, n // 2)
    out = np.empty_like(x)
    assert ddl.allreduce(x, op, out=out) is out
    assert_reduced(out, n, dtype, op)
    np.testing.assert_array_equal(x.reshape(-1), contribution(RANK, n, dtype, op))  # input untouched
    ddl.allreduce(x, op, out=x)
    assert_reduced(x, n, dtype, op)


@pytest.mark.mpi
def test_non_contiguous_input():
    base = contribution(RANK, 4000, np.float32, "sum").reshape(100, 40)
    got = ddl.allreduce(base[::2, 1::3])
    want = expected(4000, "sum").reshape(100, 40)[::2, 1::3]
    np.testing.assert_array_equal(got, want)


@pytest.mark.mpi
@pytest.mark.parametrize("algo", ["ring", "rabenseifner", "recursive_doubling"])
def test_each_algorithm_forced_and_pipelined(algo):
    comm = Communicator.from_mpi(COMM, replace(ddl.communicator().options, algo=algo, segment=64 << 10,
                                               inflight=3, small_bytes=0))
    try:
        n = 300_007
        assert_reduced(comm.allreduce(contribution(RANK, n, np.float32, "sum")), n, np.float32, "sum")
    finally:
        comm.close()


@pytest.mark.mpi
@pytest.mark.parametrize("n", [0, 1, 10007, 1 << 20])
def test_broadcast_from_every_root(n):
    for root in range(SIZE):
        x = np.arange(n, dtype=np.float64) + 1000 * RANK
        got = ddl.broadcast(x, root=root)
        np.testing.assert_array_equal(got, np.arange(n) + 1000 * root)
        np.testing.assert_array_equal(x, np.arange(n) + 1000 * RANK)  # the input is left alone
    assert np.array_equal(ddl.bcast(np.full((2, 3), RANK), root=SIZE - 1), np.full((2, 3), SIZE - 1))


@pytest.mark.mpi
def test_allgather_uneven_first_dims_and_2d():
    x = np.full((RANK % 3, 4), RANK, dtype=np.int32)
    got = ddl.allgather(x)
    want = np.concatenate([np.full((r % 3, 4), r, dtype=np.int32) for r in range(SIZE)])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ddl.allgather(np.array([RANK, -RANK])), np.array([[r, -r] for r in range(SIZE)]).ravel())


@pytest.mark.mpi
def test_alltoall_sends_each_rank_its_rows():
    """Rank i sends (i + j) % 3 rows of value 100 i + j to rank j (zero rows included), through MPI."""
    send = [(RANK + j) % 3 for j in range(SIZE)]
    mine = np.concatenate([np.full((n, 2), 100 * RANK + j, np.int32) for j, n in enumerate(send)])
    got = ddl.alltoall(mine, send)
    want = np.concatenate([np.full(((i + RANK) % 3, 2), 100 * i + RANK, np.int32) for i in range(SIZE)])
    np.testing.assert_array_equal(got, want)


def test_allreduce_n():
    a, b = ddl.allreduce_n([np.full(5, RANK, np.float32), np.full((2, 2), RANK + 1, np.int64)], op="max")
    np.testing.assert_array_equal(a, np.full(5, SIZE - 1))
    np.testing.assert_array_equal(b, np.full((2, 2), SIZE))


@pytest.mark.mpi
def test_barrier_is_a_real_barrier():
    import time

    time.sleep(0.05 * RANK)
    entered = time.time()
    ddl.barrier()
    left = time.time()
    latest_entry = COMM.allreduce(entered, op=MPI.MAX)
    assert left >= latest_entry


@pytest.mark.mpi
def test_rank_and_size():
    assert (ddl.rank(), ddl.size()) == (RANK, SIZE)
    assert 0 <= ddl.local_rank() < ddl.local_size() <= SIZE
    assert ddl.num_hosts() == 1


# -- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("small", [True, False])
def test_shapes_that_differ_raise_on_every_rank(small):
    n = 4 if small else 100_000
    x = np.ones(n + (RANK == SIZE - 1), np.float32)
    with pytest.raises(MismatchError) as e:
        ddl.allreduce(x)
    assert f"ranks {SIZE - 1}: allreduce(shape=({n + 1},)" in str(e.value)
    assert f"allreduce(shape=({n},)" in str(e.value)
    np.testing.assert_array_equal(x, 1)  # nothing was reduced
    assert_reduced(ddl.allreduce(contribution(RANK, 9, np.float64, "sum")), 9, np.float64, "sum")  # still usable


@pytest.mark.mpi(min_size=2)
def test_dtype_and_op_mismatch():
    with pytest.raises(MismatchError, match="float32.*float64|float64.*float32"):
        ddl.allreduce(np.ones(4, np.float64 if RANK == 0 else np.float32))
    with pytest.raises(MismatchError, match="op=min"):
        ddl.allreduce(np.ones(4), op="min" if RANK == 0 else "max")
    with pytest.raises(MismatchError, match="root=0.*root=1|root=1.*root=0"):
        ddl.broadcast(np.ones(4), root=0 if RANK == 0 else 1)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("hierarchy", [False, True], ids=["world", "two-groups"])
def test_join_serves_the_others_allreduces_with_zeros(hierarchy):
    """Uneven data: each rank in turn joins early; the others' allreduces (in place or not, sync or async, small,
    fused or planned) count it as zeros, an average still divides by every rank; other collectives fail."""
    opts = replace(ddl.communicator().options, small_bytes=0, segment=256 << 10) if hierarchy else None
    comm = Communicator.from_mpi(COMM, opts, hierarchy=trees()[0]) if hierarchy else ddl.communicator()
    try:
        for joiner in range(SIZE):
            if RANK == joiner:
                comm.join()
                continue
            others = [r for r in range(SIZE) if r != joiner]
            for n in (3, 5000, 300_000):
                x = np.arange(n, dtype=np.float64) + RANK  # sum over the others: closed form
                want = sum(np.arange(n, dtype=np.float64) + r for r in others)
                np.testing.assert_array_equal(comm.allreduce(x, "sum"), want)
                np.testing.assert_allclose(comm.allreduce_async(x, "avg").wait(10), want / SIZE, rtol=1e-12)
                comm.allreduce(x, "sum", out=x)  # in place: the retry must start from the caller's data
                np.testing.assert_array_equal(x, want)
            ints = np.full(4, RANK + 1, np.int32)
            np.testing.assert_array_equal(comm.allreduce(ints, "max"), max(others) + 1)  # zeros join the max
            with pytest.raises(MismatchError, match=r"join\(\)"):  # only allreduces are served
                comm.broadcast(np.ones(2), root=others[0])
            comm.join()
        np.testing.assert_array_equal(comm.allreduce(np.ones(2), "sum"), SIZE)  # all joined: in step again
    finally:
        if hierarchy:
            comm.close()


@pytest.mark.mpi(min_size=2)
def test_read_only_out_on_one_rank_fails_everywhere():
    out = np.empty(8)
    out.flags.writeable = RANK != 0
    with pytest.raises(MismatchError, match="ranks 0: out is read-only"):
        ddl.allreduce(np.ones(8), out=out)


@pytest.mark.mpi
@pytest.mark.parametrize("call, message", [
    (lambda: ddl.allreduce(np.ones(3, np.uint16)), "unsupported dtype uint16"),
    (lambda: ddl.allreduce(np.ones(3), op="mean"), "unknown reduction op 'mean'"),
    (lambda: ddl.allreduce(np.ones(3, np.int64), op="avg"), "'avg' is not defined for int64"),
    (lambda: ddl.allreduce(np.ones(3), out=np.ones(4)), "out has shape (4,)"),
    (lambda: ddl.broadcast(np.ones(3), root=-1), "root -1 is not a rank"),
])
def test_bad_input_everywhere(call, message):
    with pytest.raises(DDLError) as e:
        call()
    assert f"rank {RANK}: " in str(e.value) and message in str(e.value)


@pytest.mark.mpi
def test_check_mode_agrees_with_mpi():
    comm = Communicator.from_mpi(COMM, replace(ddl.communicator().options, check=1e-6))
    try:
        for dtype in (np.float32, np.float16, np.int64):
            x = contribution(RANK, 5000, dtype, "sum")
            assert_reduced(comm.allreduce(x, "sum"), 5000, dtype, "sum")
    finally:
        comm.close()


@pytest.mark.mpi(min_size=2)
def test_check_mode_catches_a_wrong_result_on_every_rank(monkeypatch):
    comm = Communicator.from_mpi(COMM, replace(ddl.communicator().options, check=1e-6, small_bytes=0))
    planned = comm.road.named("planned")
    real = planned.allreduce

    def corrupt(flat, *args):
        real(flat, *args)
        if RANK == 0:
            flat[3] += 1
    monkeypatch.setattr(planned, "allreduce", corrupt)
    try:
        with pytest.raises(DDLError, match="differs from MPI_Allreduce in 1 elements on rank 0"):
            comm.allreduce(np.ones(100, np.float32))
    finally:
        comm.close()


@pytest.mark.mpi(min_size=2)
def test_a_rank_that_never_calls_makes_the_others_time_out_naming_a_peer():
    comm = Communicator.from_mpi(COMM, replace(ddl.communicator().options, timeout=1.0))
    try:
        if RANK != 0:
            with pytest.raises(TransportError, match=r"no progress for 1 s \(DDL_TIMEOUT\); waiting on .* rank \d+"):
                comm.barrier()
            with pytest.raises(TransportError, match="unusable"):
                comm.barrier()
    finally:
        COMM.Barrier()
        comm.close()
    # The documented recovery: a new communicator works, and the failed call's messages (still queued under
    # the old communicator) never reach it.
    fresh = Communicator.from_mpi(COMM, replace(ddl.communicator().options, small_bytes=0))
    try:
        for n in (1, 5000):
            assert_reduced(fresh.allreduce(contribution(RANK, n, np.float32, "sum")), n, np.float32, "sum")
        fresh.barrier()
    finally:
        fresh.close()


def trees():
    """Hierarchies for any SIZE: two round-robin groups (uneven when SIZE is odd), and racks of nodes."""
    out = [[list(range(0, SIZE, 2)), list(range(1, SIZE, 2))]]
    if SIZE >= 4:
        half = SIZE // 2
        out.append([[list(range(0, half // 2)), list(range(half // 2, half))],
                    [list(range(half, SIZE - 1)), [SIZE - 1]]])
    return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, ml_dtypes.bfloat16], ids=name)
def test_hierarchical_allreduce(which, dtype):
    if which >= len(trees()):
        pytest.skip("needs 4 ranks")
    opts = replace(ddl.communicator().options, small_bytes=0, segment=256 << 10, inflight=2)
    tree = trees()[which]
    comm = Communicator.from_mpi(COMM, opts, hierarchy=tree)
    try:
        # groups of one rank do not branch: at 2 ranks the round-robin tree is flat
        assert (comm.hierarchy is not None) == (depth(normalize(tree)) >= 2)
        for n in (1, 10007, 1 << 20):
            x = contribution(RANK, n, dtype, "sum")
            assert_reduced(comm.allreduce(x, "sum"), n, dtype, "sum")
            assert_reduced(comm.allreduce(contribution(RANK, n, dtype, "max"), "max"), n, dtype, "max")
    finally:
        comm.close()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("which", [0, 1])
def test_every_collective_per_level(which):
    """reduce_scatter, allgather and broadcast over MPI with a hierarchy (the host memory level is off): the
    plans of ddl.planner.per_level, pipelined in blocks, against numpy."""
    if which >= len(trees()):
        pytest.skip("needs 4 ranks")
    opts = replace(ddl.communicator().options, small_bytes=0, segment=64 << 10, inflight=2)
    comm = Communicator.from_mpi(COMM, opts, hierarchy=trees()[which])
    try:
        assert not comm.host_level
        for n in (SIZE, 10007 * SIZE + 3):
            x = contribution(RANK, n, np.float32, "sum")
            whole = np.sum([contribution(r, n, np.float64, "sum") for r in range(SIZE)], axis=0)
            got = comm.reduce_scatter(x, "sum")
            np.testing.assert_array_equal(got, np.array_split(whole, SIZE)[RANK].astype(np.float32))
            counts = [n // SIZE] * SIZE
            counts[-1] += n - sum(counts)
            counts[0], counts[1] = counts[0] + counts[1], 0  # uneven, one part empty
            start = sum(counts[:RANK])
            np.testing.assert_array_equal(comm.reduce_scatter(x, "sum", counts=counts),
                                          whole[start:start + counts[RANK]].astype(np.float32))
            rows = np.full((RANK % 3 + n // SIZE, 2), RANK, np.int32)
            expected_rows = np.concatenate([np.full((r % 3 + n // SIZE, 2), r, np.int32) for r in range(SIZE)])
            np.testing.assert_array_equal(comm.allgather(rows), expected_rows)
            root = SIZE - 1
            np.testing.assert_array_equal(comm.broadcast(contribution(RANK, n, np.float64, "sum"), root),
                                          contribution(root, n, np.float64, "sum"))
    finally:
        comm.close()


@pytest.mark.mpi(min_size=2)
def test_planned_allgather_and_reduce_scatter_write_into_out_and_reuse_their_staging():
    """The planned (per level, pipelined, staged) allgather writes straight into ``out``, in place too; calls of
    other sizes and dtypes after it reuse the staging memory, and nothing left there from one call shows in the
    next (padding, uneven parts, a larger call before a smaller)."""
    opts = replace(ddl.communicator().options, small_bytes=0, segment=64 << 10, inflight=2)
    comm = Communicator.from_mpi(COMM, opts, hierarchy=trees()[0])
    try:
        for n, dtype in ((30011, np.float64), (257, np.int32), (30011, np.float32), (SIZE * 4099, np.int64)):
            mine = np.arange(n, dtype=dtype) + RANK * n
            expected = np.arange(SIZE * n, dtype=dtype)
            out = np.full(SIZE * n, -1, dtype)
            assert comm.allgather(mine, out=out) is out
            np.testing.assert_array_equal(out, expected)
            out = np.full(SIZE * n, -1, dtype)
            out[RANK * n:(RANK + 1) * n] = mine
            assert comm.allgather(out[RANK * n:(RANK + 1) * n], out=out) is out  # in place
            np.testing.assert_array_equal(out, expected)
            x = contribution(RANK, n, dtype, "sum")
            whole = np.sum([contribution(r, n, np.float64, "sum") for r in range(SIZE)], axis=0)
            part = np.full(len(np.array_split(whole, SIZE)[RANK]), -1, dtype)
            assert comm.reduce_scatter(x, "sum", out=part) is part
            np.testing.assert_array_equal(part, np.array_split(whole, SIZE)[RANK].astype(dtype))
    finally:
        comm.close()


@pytest.mark.mpi(min_size=4)
def test_ibm_mode_dims_plan_a_hierarchy():
    if SIZE % 2:
        pytest.skip("needs an even number of ranks")
    comm = Communicator.from_mpi(COMM, replace(ddl.communicator().options, mode=ddl.options.parse_mode(
        f"r:2x{SIZE // 2}"), small_bytes=0))
    try:
        assert comm.hierarchy == [[2 * i, 2 * i + 1] for i in range(SIZE // 2)]
        assert_reduced(comm.allreduce(contribution(RANK, 30001, np.float32, "sum")), 30001, np.float32, "sum")
    finally:
        comm.close()
