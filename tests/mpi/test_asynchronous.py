"""Asynchronous collectives with MPI ranks (any N >= 2): many in flight at once, errors through the handles,
and a rank that never submits: every other rank's handle fails on the deadline, nothing hangs."""
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

from ddl import DDLError, TransportError
from ddl.core.communicator import Communicator
from ddl.options import parse
from test_collectives import assert_reduced, contribution

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size


def make(timeout: float = 60.0) -> Communicator:
    return Communicator.from_mpi(COMM, replace(parse("", environ={}), timeout=timeout))


@pytest.mark.mpi(min_size=2)
def test_many_in_flight_each_result_right():
    comm = make()
    try:
        sizes = [1, 17, 4099, 65_537, 300_001] * 4
        handles = [comm.allreduce_async(contribution(RANK, n, np.float32, "sum")) for n in sizes]
        gathered = comm.allgather_async(np.full(RANK + 1, RANK, np.int64))
        for n, h in zip(sizes, handles):
            assert_reduced(h.wait(), n, np.float32, "sum")
        assert np.array_equal(gathered.wait(), np.concatenate([np.full(r + 1, r) for r in range(SIZE)]))
    finally:
        comm.close()


@pytest.mark.mpi(min_size=2)
def test_an_invalid_call_fails_through_every_ranks_handle():
    comm = make()
    try:
        bad = comm.allreduce_async(np.ones(3, np.int32), op="avg" if RANK == 0 else "sum")
        with pytest.raises(DDLError):
            bad.wait()
        good = comm.allreduce_async(np.ones(3, np.float32))
        assert np.all(good.wait() == SIZE)  # the communicator goes on after a refused call
    finally:
        comm.close()


@pytest.mark.mpi(min_size=2)
def test_a_rank_that_never_submits_ends_in_a_deadline_error_not_a_hang():
    comm = make(timeout=2.0)
    if RANK == SIZE - 1:
        handle = None  # this rank never submits its allreduce
    else:
        handle = comm.allreduce_async(np.ones(100_000, np.float32))
        with pytest.raises(TransportError, match="made no progress for 2 s"):
            handle.wait(30)
    COMM.Barrier()
    comm.close()


@pytest.mark.mpi(min_size=2)
def test_two_teams_reduce_different_tensors_at_once():
    import ddl

    ddl.init()
    halves = [list(range(SIZE // 2)), list(range(SIZE // 2, SIZE))]  # disjoint; and one team of everyone
    mine = 0 if RANK < SIZE // 2 else 1
    teams = [ddl.new_team(h) for h in halves]
    everyone = ddl.new_team(range(SIZE))
    try:
        assert teams[1 - mine] is None and teams[mine].size == len(halves[mine])
        n = 100_003 + mine  # each team its own size: a crossed wire cannot go unnoticed
        own = teams[mine].allreduce_async(np.full(n, RANK + 1.0), "sum")
        world = everyone.allreduce_async(np.full(7, float(RANK)), "sum")  # in flight beside it
        assert np.array_equal(own.wait(), np.full(n, float(sum(r + 1 for r in halves[mine]))))
        assert np.array_equal(world.wait(), np.full(7, SIZE * (SIZE - 1) / 2))
        with pytest.raises(ddl.MismatchError, match="new_team"):  # membership that differs across ranks
            ddl.new_team([0] if RANK == 0 else [0, 1])
        with pytest.raises(ddl.DDLError, match="whole numbers"):  # refused on every rank, none left waiting
            ddl.new_team([0, "1"])
    finally:
        for t in [*teams, everyone]:
            if t is not None:
                t.close()
