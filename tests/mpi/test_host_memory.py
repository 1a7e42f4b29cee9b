"""The host memory level under real MPI ranks of one host (any N; at 1 rank there is no level to test).

Every collective on the world communicator runs on it when its ranks share a host; these tests check what
is particular to it: sizes that take many steps of the segment's slots, every root and layout, reduce_scatter,
out= in every form, mismatches between collectives of different kinds, teams with segments of their own, and
that no segment is left in /dev/shm. Expected values come from numpy on rank and size alone.
"""
import os
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

import ddl
from ddl import _native
from ddl import DDLError, MismatchError
from ddl.core import host
from ddl.core.communicator import Communicator

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
MANY_STEPS = 3 * host.SLOT_BYTES + 12  # bytes per rank: several steps of a slot, and a ragged last one

pytestmark = [pytest.mark.mpi, pytest.mark.skipif(SIZE == 1, reason="one rank has no host level"),
              pytest.mark.usefixtures("world")]


def values(rank, n, dtype=np.int64):
    return ((np.arange(n, dtype=np.int64) * 7 + rank) % 11 - 5).astype(dtype)


def total(n, dtype=np.int64):
    return sum(values(r, n, np.int64) for r in range(SIZE)).astype(dtype)


def test_the_world_of_one_host_runs_on_host_memory_and_leaves_no_segment():
    comm = ddl.communicator()
    assert comm.host_level
    assert "host memory" in comm.explain(1 << 20).text()
    assert not os.path.exists("/dev/shm" + comm.host_memory.name)  # unlinked once every rank had mapped it
    off = Communicator.from_mpi(COMM, replace(comm.options, shm="0"))
    try:
        assert not off.host_level
        np.testing.assert_array_equal(off.allreduce(values(RANK, 5)), total(5))
    finally:
        off.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("count", [1, 3 * 1024, host.ONE_PHASE_BYTES // 4 + 1])
def test_allreduce_on_either_side_of_one_phase(dtype, count):
    np.testing.assert_array_equal(ddl.allreduce(values(RANK, count, dtype)), total(count, dtype))
    got = ddl.allreduce(values(RANK, count, dtype), "max")
    np.testing.assert_array_equal(got, np.max([values(r, count, dtype) for r in range(SIZE)], axis=0))


def test_allreduce_of_many_steps_in_place_and_into_an_overlapping_out():
    n = MANY_STEPS // 8
    x = values(RANK, n)
    ddl.allreduce(x, out=x)
    np.testing.assert_array_equal(x, total(n))
    buf = np.zeros(n + 1000, np.int64)
    buf[:n] = values(RANK, n)
    got = ddl.allreduce(buf[:n], out=buf[1000:])  # out starts inside the input: later steps' input must survive
    assert got.base is buf
    np.testing.assert_array_equal(buf[1000:], total(n))


@pytest.fixture(params=["direct", "slots"])
def copying(request):
    """Broadcasts and allgathers read the writer's buffer directly (where this machine allows it: else skipped),
    or move through the segment's slots. Set alike on every rank."""
    native = ddl.communicator().host_memory.native
    before = native.single_copy_bytes
    if request.param == "direct" and not before:
        pytest.skip("this machine does not let ranks read each other's memory (single copy is off)")
    native.single_copy_bytes = before if request.param == "direct" else 0
    yield request.param
    native.single_copy_bytes = before


def test_single_copy_is_on_where_the_ranks_can_read_each_other_and_off_with_slots():
    comm = ddl.communicator()
    assert comm.host_memory.native.single_copy_bytes in (0, host.SINGLE_COPY_BYTES)  # 0: this kernel refuses it
    slots = Communicator.from_mpi(COMM, replace(comm.options, shm="slots"))
    try:
        assert slots.host_level and slots.host_memory.native.single_copy_bytes == 0
        np.testing.assert_array_equal(slots.broadcast(values(RANK, MANY_STEPS // 8), SIZE - 1),
                                      values(SIZE - 1, MANY_STEPS // 8))
    finally:
        slots.close()


@pytest.mark.parametrize("nbytes", [0, 8, host.SINGLE_COPY_BYTES, MANY_STEPS])
def test_broadcast_from_every_root_many_steps_and_into_out(nbytes, copying):
    for root in range(SIZE):
        x = values(RANK, nbytes // 8)
        got = ddl.broadcast(x, root)
        np.testing.assert_array_equal(got, values(root, nbytes // 8))
        np.testing.assert_array_equal(x, values(RANK, nbytes // 8))  # the input is left alone
        out = np.empty_like(x)
        assert ddl.broadcast(x, root, out=out) is out
        np.testing.assert_array_equal(out, values(root, nbytes // 8))
        assert ddl.broadcast(x, root, out=x) is x  # in place
        np.testing.assert_array_equal(x, values(root, nbytes // 8))


@pytest.mark.parametrize("rows", [1, 1000, host.SINGLE_COPY_BYTES // 24, MANY_STEPS // 24])
def test_allgather_equal_rows_in_place_and_out(rows, copying):
    x = values(RANK, rows * 3).reshape(rows, 3)
    want = np.concatenate([values(r, rows * 3).reshape(rows, 3) for r in range(SIZE)])
    np.testing.assert_array_equal(ddl.allgather(x), want)
    out = np.zeros_like(want)
    out[RANK * rows:(RANK + 1) * rows] = x
    assert ddl.allgather(out[RANK * rows:(RANK + 1) * rows], out=out) is out  # in place
    np.testing.assert_array_equal(out, want)


def test_allgather_uneven_rows_of_many_steps(copying):
    rows = [r * (MANY_STEPS // 16) + 1 for r in range(SIZE)]  # rank 0 one row, the last several slots
    x = values(RANK, rows[RANK] * 2).reshape(rows[RANK], 2)
    got = ddl.allgather(x)
    want = np.concatenate([values(r, rows[r] * 2).reshape(rows[r], 2) for r in range(SIZE)])
    np.testing.assert_array_equal(got, want)
    out = np.empty_like(want)
    assert ddl.allgather(x, out=out) is out
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("op", ["sum", "avg", "min"])
@pytest.mark.parametrize("rows", [1, SIZE * 5 + 1, MANY_STEPS // 8 + 3])
def test_reduce_scatter_gives_each_rank_its_part(rows, op):
    dtype = np.float64
    x = values(RANK, rows * 2, dtype).reshape(rows, 2)
    stack = np.stack([values(r, rows * 2, dtype).reshape(rows, 2) for r in range(SIZE)])
    whole = {"sum": stack.sum(0), "avg": stack.sum(0) / SIZE, "min": stack.min(0)}[op]
    want = np.array_split(whole, SIZE)[RANK]
    got = ddl.reduce_scatter(x, op)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    out = np.empty_like(want)
    assert ddl.reduce_scatter(x, op, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-12)
    counts = [0] * SIZE
    counts[-1], counts[0] = rows // 2, rows - rows // 2  # uneven, empty parts between
    start = sum(counts[:RANK])
    np.testing.assert_allclose(ddl.reduce_scatter(x, op, counts=counts), whole[start:start + counts[RANK]],
                               rtol=1e-12)


def test_repeated_calls_take_the_short_paths_with_every_form_of_out():
    # the first call of a signature goes the long way and prepares it; the next ones take the short paths
    x = values(RANK, 6).reshape(3, 2)
    rows = [1 + r % 2 for r in range(SIZE)]
    mine = values(RANK, rows[RANK] * 2).reshape(rows[RANK], 2)
    uneven = np.concatenate([values(r, rows[r] * 2).reshape(rows[r], 2) for r in range(SIZE)])
    whole = np.concatenate([values(r, 6).reshape(3, 2) for r in range(SIZE)])
    part = np.array_split(total(6 * SIZE).reshape(3 * SIZE, 2), SIZE)[RANK]
    big = values(RANK, 6 * SIZE).reshape(3 * SIZE, 2)
    for _ in range(3):
        for root in range(SIZE):
            np.testing.assert_array_equal(ddl.broadcast(x, root), values(root, 6).reshape(3, 2))
            out = np.zeros_like(x)
            assert ddl.broadcast(x, root, out=out) is out
            np.testing.assert_array_equal(out, values(root, 6).reshape(3, 2))
            y = x.copy()
            assert ddl.broadcast(y, root, out=y) is y
            np.testing.assert_array_equal(y, values(root, 6).reshape(3, 2))
        np.testing.assert_array_equal(ddl.allgather(x), whole)
        out = np.zeros_like(whole)
        assert ddl.allgather(x, out=out) is out
        np.testing.assert_array_equal(out, whole)
        out[:] = 0
        out[3 * RANK:3 * RANK + 3] = x
        assert ddl.allgather(out[3 * RANK:3 * RANK + 3], out=out) is out
        np.testing.assert_array_equal(out, whole)
        out[:] = 0
        out[:3] = x  # the input at rank 0's rows of out: in place on rank 0, overlapping elsewhere on the others
        assert ddl.allgather(out[:3], out=out) is out
        np.testing.assert_array_equal(out, whole)
        np.testing.assert_array_equal(ddl.allgather(mine), uneven)  # rows differ: a second step, short or not
        out = np.zeros_like(uneven)
        assert ddl.allgather(mine, out=out) is out
        np.testing.assert_array_equal(out, uneven)
        np.testing.assert_array_equal(ddl.reduce_scatter(big), part)
        out = np.zeros_like(part)
        assert ddl.reduce_scatter(big, out=out) is out
        np.testing.assert_array_equal(out, part)
        overlapping = big.copy()  # out inside the input: the long path copies first
        got = ddl.reduce_scatter(overlapping, out=overlapping[1:1 + len(part)])
        np.testing.assert_array_equal(got, part)
        ddl.barrier()


def test_known_calls_run_natively_and_decline_what_they_do_not_know():
    native = ddl.communicator()._native  # every rank makes the same calls here: a declined one moves nothing
    x = values(RANK, 10).reshape(5, 2).astype(np.float64)
    assert native.broadcast(x, 1 % SIZE, None) is None  # not known before Python has checked it once
    ddl.broadcast(x, 1 % SIZE)
    np.testing.assert_array_equal(native.broadcast(x, 1 % SIZE, None), values(1 % SIZE, 10).reshape(5, 2))
    assert native.broadcast(x, 0, None) is None  # another root: another call
    for odd in (1.0 * (1 % SIZE), str(1 % SIZE), 2 ** 70):  # not a plain int: Python refuses it on every rank
        assert native.broadcast(x, odd, None) is None
        with pytest.raises(DDLError, match="root"):
            ddl.broadcast(x, odd)
    assert native.broadcast(np.asfortranarray(x.T), 1 % SIZE, None) is None  # another shape
    assert native.broadcast(x.astype(np.float32), 1 % SIZE, None) is None  # another dtype
    assert native.broadcast(x.view(np.matrix), 1 % SIZE, None) is None  # a subclass: Python's path
    assert native.broadcast(x, 1 % SIZE, np.empty((5, 2), np.float32)) is None  # an out to refuse: Python's path
    assert native.broadcast(x, 1 % SIZE, np.empty((5, 2))[::-1]) is None  # not contiguous
    ddl.allreduce(x, "max")
    np.testing.assert_array_equal(native.allreduce(x, "max", None),
                                  np.max([values(r, 10).reshape(5, 2) for r in range(SIZE)], axis=0))
    assert native.allreduce(x, "min", None) is None
    assert native.allreduce(x, ReduceOpLike(), None) is None  # only ops named by a string are kept
    assert native.allreduce(x, "max\0", None) is None  # not "max" padded
    deep = np.ones((1,) * 9 + (2,))  # more dimensions than the table keeps: Python's path every time
    for _ in range(2):
        np.testing.assert_array_equal(ddl.allreduce(deep), np.full(deep.shape, SIZE))
    assert native.allreduce(deep, "sum", None) is None
    read_only = x.copy()
    read_only.flags.writeable = False
    assert native.allreduce(read_only, "max", read_only) is None  # in place into a read-only array: refused by Python
    with pytest.raises(DDLError):
        ddl.allreduce(read_only, "max", out=read_only)


RUN_AHEAD = _native.HostMemory.RUN_AHEAD_BYTES


@pytest.mark.parametrize("n", [1, RUN_AHEAD // 8, RUN_AHEAD // 8 + 1], ids=["8B", "run-ahead-limit", "one-more"])
def test_known_small_broadcasts_from_every_root_arrive_intact_while_roots_run_ahead(n):
    base = np.arange(n, dtype=np.int64)
    for root in range(SIZE):
        x, out = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i in range(3 * _native.HostMemory.RUN_AHEAD_DEPTH):  # nothing else meanwhile: the root may lead
            x[...] = base * 3 + 1000 * root + i if RANK == root else -1
            ddl.broadcast(x, root, out=x)  # in place
            np.testing.assert_array_equal(x, base * 3 + 1000 * root + i)
            ddl.broadcast(x * 2, root, out=out)  # out of place: root's input lands in every out
            np.testing.assert_array_equal(out, (base * 3 + 1000 * root + i) * 2)


def test_ranks_on_the_full_path_meet_peers_that_run_the_same_broadcast_ahead():
    """A strided array takes Python's path (a full step) where the others' plain arrays run ahead: the same call
    all the same, so every rank gets root's data, and nothing is raised then or at the next full step."""
    n = 6
    for root in range(SIZE):
        x = np.zeros(n)
        ddl.broadcast(x, root, out=x)  # known on every rank
        for i in range(40):
            want = np.arange(n) + 100 * root + i
            strided = (RANK == root and i % 2 == 1) or (RANK == (root + 1) % SIZE and i % 3 == 0)
            y = np.zeros(2 * n)[::2] if strided else np.zeros(n)
            y[...] = want if RANK == root else -1
            ddl.broadcast(y, root, out=y)
            np.testing.assert_array_equal(y, want)
    ddl.barrier()  # the histories agree: no mismatch surfaces
    np.testing.assert_array_equal(ddl.allreduce(values(RANK, 3)), total(3))


def raised_by_the_next_full_step(call) -> list:
    """The errors of ``call`` and of the barrier after it, on this rank."""
    errors = []
    for f in (call, ddl.barrier):
        try:
            f()
        except DDLError as e:
            errors.append(e)
    return errors


def test_a_known_broadcast_of_another_shape_raises_there_at_once_and_everywhere_at_the_next_full_step():
    a, b = np.ones(2), np.ones(3)
    ddl.broadcast(a, 0, out=a), ddl.broadcast(b, 0, out=b)  # both known on every rank
    odd = RANK == SIZE - 1
    errors = raised_by_the_next_full_step(lambda: ddl.broadcast(b if odd else a, 0, out=b if odd else a))
    if odd:  # it checked the root's call on receipt
        assert "broadcast(shape=(3,)" in str(errors[0]) and "ranks 0: broadcast(shape=(2,)" in str(errors[0])
    assert len(errors) == (2 if odd else 1)
    assert isinstance(errors[-1], MismatchError) and "barrier() after" in str(errors[-1])
    assert f"ranks {SIZE - 1}: barrier() after " in str(errors[-1])  # what each ran ahead with, the last:
    assert "broadcast(shape=(3,), dtype=float64, root=0) (raised here)" in str(errors[-1])
    np.testing.assert_array_equal(ddl.allreduce(values(RANK, 3)), total(3))  # and the level goes on


def test_ranks_that_each_take_another_root_all_raise_by_the_next_full_step():
    x = np.ones(2)
    ddl.broadcast(x, 0, out=x), ddl.broadcast(x, 1, out=x)  # both known on every rank
    errors = raised_by_the_next_full_step(lambda: ddl.broadcast(x, 0 if RANK == 0 else 1, out=x))
    assert isinstance(errors[-1], MismatchError)
    assert "ranks 0: barrier() after broadcast(shape=(2,), dtype=float64, root=0)" in str(errors[-1])
    assert "barrier() after broadcast(shape=(2,), dtype=float64, root=1)" in str(errors[-1])
    np.testing.assert_array_equal(ddl.allreduce(values(RANK, 3)), total(3))


def test_a_known_broadcast_refused_on_one_rank_raises_its_reason_there_and_mismatch_everywhere_next():
    x = np.ones(2)
    ddl.broadcast(x, 0, out=x)
    errors = raised_by_the_next_full_step(lambda: ddl.broadcast(x, 0, out=np.empty(9) if RANK == 1 else x))
    if RANK == 1:
        assert not isinstance(errors[0], MismatchError) and "rank 1: out has shape (9,)" in str(errors[0])
    assert isinstance(errors[-1], MismatchError) and "ranks 1: barrier() after " in str(errors[-1])
    assert "out has shape (9,) and dtype float64; the input has (2,), float64 (raised here)" in str(errors[-1])
    np.testing.assert_array_equal(ddl.allreduce(values(RANK, 3)), total(3))


class ReduceOpLike:
    def __repr__(self):
        return "max"


def test_a_mismatch_between_known_calls_raises_on_every_rank():
    a, b = np.ones(5), np.ones(7)
    ddl.allreduce(a)
    ddl.broadcast(b, 0)  # both known now, on every rank
    with pytest.raises(MismatchError, match=r"allreduce\(shape=\(5,\).*broadcast\(shape=\(7,\)|"
                                            r"broadcast\(shape=\(7,\).*allreduce\(shape=\(5,\)"):
        ddl.allreduce(a) if RANK == 0 else ddl.broadcast(b, 0)
    np.testing.assert_array_equal(ddl.allreduce(values(RANK, 3)), total(3))  # and the level goes on


def test_bfloat16_moves_by_broadcast_and_allgather():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16) + RANK
    for _ in range(2):
        np.testing.assert_array_equal(ddl.broadcast(x, 0).astype(np.float32), np.arange(4, dtype=np.float32))
        got = ddl.allgather(x).astype(np.float32)
        np.testing.assert_array_equal(got, np.concatenate([np.arange(4, dtype=np.float32) + r for r in range(SIZE)]))


def test_a_bad_root_is_refused_every_time():
    for _ in range(2):  # a refused call is never a short path's
        with pytest.raises(DDLError, match="root"):
            ddl.broadcast(np.ones(3), SIZE)
    np.testing.assert_array_equal(ddl.allreduce(values(RANK, 3)), total(3))


def test_reduce_scatter_refuses_a_bad_call_on_every_rank():
    with pytest.raises(DDLError, match="avg"):
        ddl.reduce_scatter(np.ones(SIZE, np.int32), "avg")
    with pytest.raises(DDLError, match="out has shape"):
        ddl.reduce_scatter(np.ones(SIZE * 2), out=np.empty(5 if RANK == 0 else 2))


CALLS = {
    "allreduce": lambda: ddl.allreduce(np.ones(4)),
    "broadcast": lambda: ddl.broadcast(np.ones(4)),
    "allgather": lambda: ddl.allgather(np.ones(4)),
    "reduce_scatter": lambda: ddl.reduce_scatter(np.ones(4 * SIZE)),
    "barrier": ddl.barrier,
    "large allreduce": lambda: ddl.allreduce(np.ones(MANY_STEPS // 8)),
    "large broadcast": lambda: ddl.broadcast(np.ones(MANY_STEPS // 8)),
    "large allgather": lambda: ddl.allgather(np.ones(MANY_STEPS // 8)),
}


@pytest.mark.parametrize("other", sorted(CALLS))
def test_different_collectives_raise_mismatch_on_every_rank(other):
    mine = other if RANK else "barrier" if other == "allreduce" else "allreduce"  # rank 0 differs from the rest
    with pytest.raises(MismatchError, match="called ddl differently"):
        CALLS[mine]()
    np.testing.assert_array_equal(ddl.allreduce(values(RANK, 3)), total(3))  # and the level goes on


def test_teams_have_their_own_segment_and_run_concurrently():
    halves = [list(range(0, SIZE, 2)), list(range(1, SIZE, 2))]
    mine = halves[RANK % 2]
    teams = [ddl.new_team(half) for half in halves]  # every rank takes part in making each team
    team = teams[RANK % 2]
    assert teams[1 - RANK % 2] is None
    try:
        assert team.host_level == (len(mine) > 1)
        got = team.allreduce(np.array([RANK, 1], np.int64))
        np.testing.assert_array_equal(got, [sum(mine), len(mine)])
        np.testing.assert_array_equal(team.reduce_scatter(np.arange(2 * len(mine), dtype=np.int64)),
                                      np.array_split(np.arange(2 * len(mine)) * len(mine), len(mine))[team.rank])
    finally:
        team.close()


def test_asynchronous_calls_in_submission_order():
    handles = [ddl.allreduce_async(np.full(1000, RANK + i, np.int64)) for i in range(5)]
    for i, h in enumerate(handles):
        np.testing.assert_array_equal(h.wait(), np.full(1000, sum(range(SIZE)) + SIZE * i))


@pytest.mark.parametrize("forced", ["planned", "riding"])
def test_the_road_takes_host_memory_and_a_forced_path_gives_the_same_answers(forced):
    world = ddl.communicator()
    assert [name for name, why in world.route("allreduce", 8) if why][0] == "host memory"
    comm = Communicator.from_mpi(COMM, replace(world.options, path=forced))
    try:
        assert comm.host_level  # the level is there; the forced path goes first for what it takes
        n = 1000 if forced == "riding" else MANY_STEPS // 8  # (riding takes only what fits its round)
        assert [name for name, why in comm.route("allreduce", 8 * n) if why][0] == forced
        for _ in range(2):  # the second call of each signature: the forced path's short form, not the segment's
            np.testing.assert_array_equal(comm.allreduce(values(RANK, n)), total(n))
            np.testing.assert_array_equal(comm.broadcast(values(RANK, n), SIZE - 1), values(SIZE - 1, n))
            np.testing.assert_array_equal(comm.allgather(values(RANK, n).reshape(1, -1)),
                                          np.stack([values(r, n) for r in range(SIZE)]))
            np.testing.assert_array_equal(comm.reduce_scatter(values(RANK, n * SIZE), "sum"),
                                          np.array_split(total(n * SIZE), SIZE)[RANK])
        comm.barrier()
    finally:
        comm.close()
