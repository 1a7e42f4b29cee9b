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
