"""The flight recorder under MPI: a rank that never enters a collective (it is busy in Python) makes the others
pass their deadline; they write their records as they fail, the late rank writes its own on SIGUSR1 (as
``kill -USR1`` would), and ddl-trace's verdict names the late rank and where the others waited; each deadline
error names the late rank too (the roll call). Any N >= 2."""
import os
import signal
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

import ddl
from ddl import TransportError
from ddl.core.communicator import Communicator
from ddl.tools import trace

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size


@pytest.mark.mpi(min_size=2)
def test_the_verdict_names_the_rank_that_never_entered(tmp_path_factory, monkeypatch):
    folder = COMM.bcast(str(tmp_path_factory.mktemp("flight")) if RANK == 0 else None)
    monkeypatch.setenv("DDL_FLIGHT_RECORDER", folder)
    comm = Communicator.from_mpi(COMM, replace(ddl.options.parse("-timeout 1"), small_bytes=0))
    late = SIZE - 1
    try:
        np.testing.assert_array_equal(comm.allreduce(np.ones(10)), np.full(10, SIZE))  # all in step so far
        if RANK != late:
            with pytest.raises(TransportError, match="made no progress") as failed:
                comm.allreduce(np.ones(1 << 18, np.float32))
            # the error itself names the rank behind, whichever peer this rank's wait was on
            assert f"rank {late} (" in str(failed.value) and "never reached this call" in str(failed.value)
            assert f"while {SIZE - 1} of {SIZE} said they were in it" in str(failed.value)
        else:
            os.kill(os.getpid(), signal.SIGUSR1)  # what a user does to a rank that seems stuck
            # out of step still, as a rank busy elsewhere is: the others' roll call must not wait on it
        COMM.Barrier()
        assert sorted(os.listdir(folder)) == sorted(f"rank{r}.json" for r in range(SIZE))
        lines = trace.verdict(trace.load(folder), comm._flight.key)  # other tests' communicators may be there
        text = "\n".join(lines)
        assert lines[0].startswith(f"communicator ranks 0-{SIZE - 1} #"), text
        assert "allreduce" in lines[0] and "did not finish on every rank" in lines[0], text
        assert f"  rank {late} (" in text and "never entered it" in text, text
        assert any("waited on rank" in line for line in lines), text  # the deadline named a peer
        assert lines[-1] == f"  verdict: rank {late} behind; the others waited on it", text
    finally:
        comm.close()
        COMM.Barrier()
