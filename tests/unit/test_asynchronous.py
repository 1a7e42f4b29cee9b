"""Asynchronous collectives (ddl.core.asynchronous) over the loopback transport: ranks are threads, each
communicator with its own worker thread. Expected values are closed forms of what each rank contributed."""
import time
from dataclasses import replace

import numpy as np
import pytest

from ddl import DDLError, MismatchError
from ddl.core.asynchronous import Handle
from ddl.options import parse
from test_loopback import spawn

BASE = replace(parse("", environ={}), timeout=20.0)
SIZES = [1, 1000, 70_000, 300_001]


def test_many_submitted_then_waited_in_reverse_give_every_result():
    p = 3

    def body(comm):
        handles = [comm.allreduce_async(np.full(n, comm.rank + 1.0 + i, np.float32)) for i, n in enumerate(SIZES)]
        handles.append(comm.broadcast_async(np.arange(5) * (comm.rank + 1), root=2))
        handles.append(comm.allgather_async(np.full((comm.rank + 1, 2), comm.rank)))
        got = [h.wait() for h in reversed(handles)][::-1]
        assert all(h.done() for h in handles)
        comm.close()
        return got

    results, errors = spawn(p, body, BASE)
    assert errors == [None] * p
    for got in results:
        for i, n in enumerate(SIZES):
            assert got[i].shape == (n,) and np.all(got[i] == sum(r + 1.0 + i for r in range(p)))
        assert np.array_equal(got[len(SIZES)], np.arange(5) * 3)
        assert np.array_equal(got[-1], np.concatenate([np.full((r + 1, 2), r) for r in range(p)]))


def test_blocking_calls_wait_for_the_submitted_ones():
    def body(comm):
        first = comm.allreduce_async(np.full(70_000, 1.0, np.float32))
        middle = comm.allreduce(np.full(10, 2.0, np.float32))  # must not overtake `first` on any rank
        last = comm.allreduce_async(np.full(10, 3.0, np.float32))
        comm.barrier()
        out = (first.wait(), middle, last.wait())
        comm.close()
        return out

    results, errors = spawn(2, body, BASE)
    assert errors == [None, None]
    for first, middle, last in results:
        assert np.all(first == 2.0) and np.all(middle == 4.0) and np.all(last == 6.0)


def test_ranks_that_submit_differently_all_get_a_mismatch_not_a_hang():
    def body(comm):
        h = comm.allreduce_async(np.ones(10 + comm.rank, np.float32))
        try:
            h.wait()
        finally:
            comm.close()

    _, errors = spawn(2, body, BASE)
    assert all(isinstance(e, MismatchError) for e in errors), errors


def test_errors_and_the_callers_deadline_reach_the_handle():
    def body(comm):
        bad = comm.allreduce_async(np.ones(4, np.float32), op="median")
        with pytest.raises(DDLError, match="median"):
            bad.wait()
        if comm.rank == 1:
            time.sleep(0.5)  # rank 0's collective cannot finish before rank 1 submits its own
        h = comm.allreduce_async(np.ones(4, np.float32))
        if comm.rank == 0:
            with pytest.raises(DDLError, match="did not finish within 0.05 s"):
                h.wait(0.05)
        out = h.wait(30)
        comm.close()
        return out

    results, errors = spawn(2, body, BASE)
    assert errors == [None, None]
    assert all(np.all(r == 2.0) for r in results)


def test_a_handle_settles_once():
    h = Handle("x")
    assert not h.done()
    h._settle(result=5)
    assert h.done() and h.wait() == 5 and h.result == 5
