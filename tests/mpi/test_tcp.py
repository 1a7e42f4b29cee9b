"""ddl's own TCP transport set up through MPI (any N; DDL_TRANSPORT=tcp forces it on one host): every rank
publishes its addresses and port over the MPI communicator, connects, and the collectives run on the sockets,
checked against closed forms. An emulated cluster's communicators take it by default (tests/cluster)."""
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

from ddl.core.communicator import Communicator
from ddl.options import parse
from test_collectives import assert_reduced, contribution

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size


@pytest.fixture(scope="module")
def over_tcp():
    mp = pytest.MonkeyPatch()
    mp.setenv("DDL_TRANSPORT", "tcp")
    comm = Communicator.from_mpi(COMM, replace(parse("", environ={}), shm="0"))
    mp.undo()
    yield comm
    comm.close()


def test_the_transport_is_ddls_tcp_wherever_there_are_peers(over_tcp):
    assert (over_tcp._executor.transport if SIZE > 1 else over_tcp._executor) == ("tcp" if SIZE > 1 else None)
    assert over_tcp.over_tcp is (SIZE > 1)


@pytest.mark.parametrize("n", [1, 1000, 3_000_001])
def test_allreduce_over_tcp(over_tcp, n):
    assert_reduced(over_tcp.allreduce(contribution(RANK, n, np.float32, "sum")), n, np.float32, "sum")


def test_every_collective_over_tcp(over_tcp):
    rows = np.full(100 + RANK, RANK, np.int64)  # uneven rows
    np.testing.assert_array_equal(over_tcp.allgather(rows), np.concatenate([np.full(100 + r, r) for r in range(SIZE)]))
    whole = np.arange(SIZE * 70_000, dtype=np.float64).reshape(SIZE, -1) * (RANK + 1)
    mine = over_tcp.reduce_scatter(whole)
    np.testing.assert_array_equal(mine.reshape(-1), whole[RANK] / (RANK + 1) * SIZE * (SIZE + 1) / 2)
    for n in (300_000, 20_000, 1):  # a chain; a binomial tree checked on receipt; one that rides
        got = over_tcp.broadcast(np.full(n, RANK, np.float32), root=SIZE - 1)
        np.testing.assert_array_equal(got, np.full(n, SIZE - 1, np.float32))
    handles = [over_tcp.allreduce_async(np.full(50_000, RANK + k, np.float32)) for k in range(3)]
    for k, h in enumerate(handles):
        np.testing.assert_array_equal(h.wait(60), np.full(50_000, SIZE * (SIZE - 1) / 2 + SIZE * k, np.float32))


def test_a_checked_allreduce_that_ranks_call_differently_raises_everywhere(over_tcp):
    """A mid-size allreduce over TCP has no agreement round: the last rank's other shape is found on receipt,
    every rank raises MismatchError naming both shapes, and the next call gets only its own messages."""
    if SIZE == 1:
        pytest.skip("one rank: nothing to differ from")
    from ddl import MismatchError

    n = 200_000 + (RANK == SIZE - 1)
    with pytest.raises(MismatchError, match=r"ranks called ddl differently") as raised:
        over_tcp.allreduce(np.ones(n, np.float32))
    assert "shape=(200000,)" in str(raised.value) and "shape=(200001,)" in str(raised.value)
    assert_reduced(over_tcp.allreduce(contribution(RANK, 200_000, np.float32, "sum")), 200_000, np.float32, "sum")
