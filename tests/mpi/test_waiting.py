"""How the executor waits, with MPI ranks (any N >= 2): a large asynchronous run whose caller works beside it and
whose peers are late rests between polls (Executor.rest, as DDL_REST sets it where links are slow) and still
reduces right; a blocking run, one its caller waits for, a small run, or any run with no rest set keeps
polling. Rank 0 arrives late on
purpose, so every other rank waits about that long inside the run."""
import time
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

from ddl.core.communicator import REST_FROM_BYTES, Communicator
from ddl.options import parse
from test_collectives import assert_reduced, contribution

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
LATE = 0.3  # seconds rank 0 arrives after the others


def late_allreduce(rest_us: float, nbytes: int, how: str = "working") -> int:
    """Rests the executor took during one allreduce of ``nbytes`` (float32) that rank 0 joins LATE seconds after
    the others, its rests set to at most ``rest_us``; ``how`` the others call it: "working" (submitted, the caller
    busy for 2 LATE seconds before it waits), "waiting" (submitted and waited for at once) or "blocking". Checks
    the result against the closed form."""
    comm = Communicator.from_mpi(COMM, replace(parse("", environ={}), path="planned", shm="0"))
    comm._executor.rest(rest_us * 1e-6, REST_FROM_BYTES)  # (one host's links are fast: the test sets it)
    try:
        n = nbytes // 4
        comm.allreduce(contribution(RANK, n, np.float32, "sum"))  # the plan and the agreement, before counting
        before = comm._executor.rests
        COMM.Barrier()
        if RANK == 0:
            time.sleep(LATE)
        x = contribution(RANK, n, np.float32, "sum")
        if how == "blocking":
            result = comm.allreduce(x)
        else:
            handle = comm.allreduce_async(x)
            if how == "working" and RANK != 0:
                time.sleep(2 * LATE)  # the caller's own work (an accelerator's, say), past rank 0's arrival
            result = handle.wait(60)
        assert_reduced(result, n, np.float32, "sum")
        return comm._executor.rests - before
    finally:
        comm.close()


@pytest.mark.mpi(min_size=2)
def test_a_large_run_rests_while_its_peers_are_late():
    rests = late_allreduce(100, 2 * REST_FROM_BYTES)
    if RANK != 0:  # each rest is at most 100 us (plus the kernel's slack): a 0.3 s wait takes many of them
        assert rests > 0


@pytest.mark.mpi(min_size=2)
def test_no_rests_with_rest_zero_or_below_the_size_that_rests():
    assert late_allreduce(0, 2 * REST_FROM_BYTES) == 0
    assert late_allreduce(100, REST_FROM_BYTES // 4) == 0


@pytest.mark.mpi(min_size=2)
def test_a_blocking_run_keeps_polling_while_its_peers_are_late():
    """Its caller does nothing but wait for it: a rest would only make it late."""
    assert late_allreduce(100, 2 * REST_FROM_BYTES, "blocking") == 0


@pytest.mark.mpi(min_size=2)
def test_a_run_its_caller_waits_for_keeps_polling():
    """Submitted and waited for at once: nothing of the caller's needs the core either."""
    assert late_allreduce(100, 2 * REST_FROM_BYTES, "waiting") == 0
