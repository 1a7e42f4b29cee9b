"""The host memory level's native collectives among forked processes, without MPI: a rank that dies inside a
phase is named within a fraction of a second, a live but silent one at the deadline, ranks that call
different collectives all see the mismatch, and the segment's name is gone once every member has mapped it.
The parent process is rank 0; children are ranks 1..n-1."""
import multiprocessing
import os
import time

import numpy as np
import pytest

from ddl import _native
from ddl.errors import MismatchError, RankFailure, TransportError

SLOT = 64 << 10
DIRECT = 4 << 10  # single copy from this many bytes
AHEAD = _native.HostMemory.RUN_AHEAD_DEPTH
I64 = _native.DType.int64
SUM = _native.ReduceOp.sum
_names = iter(range(1 << 30))


def _member(conn, rank, size, behaviour):
    name, pids = conn.recv()
    level = _native.HostMemory(name, False, rank, size, SLOT, pids, list(range(size)))
    conn.send("mapped")
    try:
        if behaviour == "die-before-arriving":
            os._exit(3)
        if behaviour == "die-in-the-second-step":
            level.barrier(1, 60.0, "barrier()")
            os._exit(3)
        if behaviour == "one-barrier-then-silent":
            level.barrier(1, 60.0, "barrier()")
        if behaviour in ("silent", "one-barrier-then-silent"):
            time.sleep(30)
        if behaviour == "allreduce":
            x = np.full(3 * SLOT // 8 + 5, rank, np.int64)  # several steps
            conn.send((level.allreduce(x, x, I64, SUM, 1.0, 4096, 7, 60.0, "allreduce"), x[:3].tolist(), x[-1]))
        if behaviour == "broadcast-instead":
            conn.send(level.broadcast(np.zeros(4), 0, 8, 60.0, "broadcast"))
        if behaviour.startswith("direct"):  # single copy: reads its peers' buffers (they set the same threshold)
            level.single_copy_bytes = DIRECT
        if behaviour == "direct-probe":
            conn.send(level.probe_address)
            conn.recv()  # stays alive while the parent reads its probe word
        if behaviour == "direct-broadcast":
            x = np.zeros(3 * SLOT // 8 + 5, np.int64)  # more than a slot: one step all the same
            conn.send((level.broadcast(x, 0, 8, 60.0, "broadcast"), int(x.sum()), x[-1]))
        if behaviour == "direct-allgather":
            x = np.full(DIRECT // 8 + rank, rank, np.int64)  # uneven rows, every one read from its owner
            lengths = [(DIRECT // 8 + r) * 8 for r in range(size)]
            out = np.zeros(sum(lengths) // 8, np.int64)
            agreed = level.allgather(x, out, [sum(lengths[:r]) for r in range(size)], lengths, 9, 60.0, "allgather")
            conn.send((agreed, out.tolist()))
        if behaviour == "run-ahead-receiver":  # arrives only once the root has run the whole ring ahead
            assert conn.recv() == "go"
            got = []
            for _ in range(AHEAD + 4):
                x = np.zeros(2, np.int64)
                level.broadcast(x, 0, _native.HostCall(8, 60.0, "broadcast", run_ahead=True))
                got.append(x.tolist())
            conn.send(got)
        if behaviour == "run-ahead-other-shape":
            try:
                level.broadcast(np.zeros(3, np.int64), 0, _native.HostCall(9, 60.0, "broadcast(3)", run_ahead=True))
            except MismatchError as e:
                conn.send(str(e))
            conn.send((level.barrier(1, 60.0, "barrier()"), level.history, level.barrier(1, 60.0, "barrier()")))
        if behaviour == "direct-root-then-die":
            conn.send("calling")
            level.broadcast(np.full(DIRECT, 5, np.int64), 1, 8, 60.0, "broadcast")  # waits for its reader
    except Exception as e:  # reported to the parent, which asserts on it
        conn.send(repr(e))
    conn.close()


def group(behaviours):
    """Rank 0 (this process) and one child per behaviour, all mapping one new segment; yields (level, pipes)."""
    size = len(behaviours) + 1
    ctx = multiprocessing.get_context("fork")
    pipes, children = [], []
    for rank, b in enumerate(behaviours, start=1):
        mine, theirs = ctx.Pipe()
        child = ctx.Process(target=_member, args=(theirs, rank, size, b), daemon=True)
        child.start()
        pipes.append(mine)
        children.append(child)
    name = f"/ddl-test-{os.getpid()}-{next(_names)}"
    pids = [os.getpid()] + [c.pid for c in children]
    level = _native.HostMemory(name, True, 0, size, SLOT, pids, list(range(size)))
    for p in pipes:
        p.send((name, pids))
    for p in pipes:
        assert p.recv() == "mapped"
    _native.HostMemory.unlink(name)
    assert not os.path.exists("/dev/shm" + name)
    return level, pipes, children


def finish(children):
    for c in children:
        c.kill()
        c.join(5)


@pytest.mark.parametrize("when", ["die-before-arriving", "die-in-the-second-step"])
def test_a_rank_that_dies_is_named_long_before_the_deadline(when):
    other = "silent" if when == "die-before-arriving" else "one-barrier-then-silent"
    level, pipes, children = group([when, other])
    try:
        start = time.monotonic()
        with pytest.raises(RankFailure, match="rank 1 .*ended during barrier") as caught:
            level.barrier(1, 60.0, "barrier()")
            level.barrier(1, 60.0, "barrier()")
        assert caught.value.ranks == [1]
        assert time.monotonic() - start < 10  # the deadline is 60 s
        assert level.broken
        with pytest.raises(TransportError, match="unusable after an earlier failure"):
            level.barrier(1, 60.0, "barrier()")
    finally:
        finish(children)


def test_a_silent_rank_fails_the_call_at_its_deadline_naming_it():
    level, pipes, children = group(["silent", "silent"])
    try:
        start = time.monotonic()
        with pytest.raises(TransportError, match=r"made no progress for 0.5 s \(DDL_TIMEOUT\); waiting on rank 1"):
            level.barrier(1, 0.5, "barrier()")
        assert 0.4 < time.monotonic() - start < 10
    finally:
        finish(children)


def test_allreduce_over_several_steps_and_a_mismatch_seen_by_every_rank():
    level, pipes, children = group(["allreduce", "allreduce"])
    try:
        x = np.zeros(3 * SLOT // 8 + 5, np.int64)
        assert level.allreduce(x, x, I64, SUM, 1.0, 4096, 7, 60.0, "allreduce")
        assert (x == 3).all()  # 0 + 1 + 2
        for p in pipes:
            assert p.recv() == (True, [3, 3, 3], 3)
    finally:
        finish(children)
    level, pipes, children = group(["broadcast-instead"])
    try:
        y = np.ones(4, np.int64)
        assert level.allreduce(y, y, I64, SUM, 1.0, 4096, 7, 60.0, "allreduce") is False
        assert (y == 1).all()  # nothing written on a mismatch
        assert pipes[0].recv() is False
    finally:
        finish(children)


def test_a_rank_can_read_its_peers_probe_word_and_nothing_else():
    level, pipes, children = group(["direct-probe"])
    try:
        address = pipes[0].recv()
        assert level.can_read(1, address)
        assert not level.can_read(1, address + 8)  # readable, but not the probe word
        assert not level.can_read(1, 8)  # not mapped in the peer
        assert not level.can_read(2, address)  # no such member
        pipes[0].send("bye")
    finally:
        finish(children)


def test_single_copy_broadcast_and_uneven_allgather_read_the_writers_buffers():
    level, pipes, children = group(["direct-broadcast", "direct-broadcast"])
    try:
        level.single_copy_bytes = DIRECT
        x = np.arange(3 * SLOT // 8 + 5, dtype=np.int64)
        assert level.broadcast(x, 0, 8, 60.0, "broadcast")
        for p in pipes:
            assert p.recv() == (True, int(x.sum()), x[-1])
    finally:
        finish(children)
    level, pipes, children = group(["direct-allgather", "direct-allgather"])
    try:
        level.single_copy_bytes = DIRECT
        lengths = [(DIRECT // 8 + r) * 8 for r in range(3)]
        out = np.zeros(sum(lengths) // 8, np.int64)
        assert level.allgather(np.full(DIRECT // 8, 0, np.int64), out, [sum(lengths[:r]) for r in range(3)],
                               lengths, 9, 60.0, "allgather")
        expected = np.concatenate([np.full(n // 8, r) for r, n in enumerate(lengths)])
        np.testing.assert_array_equal(out, expected)
        for p in pipes:
            assert p.recv() == (True, expected.tolist())
    finally:
        finish(children)


def test_a_root_that_dies_before_its_buffer_is_read_is_named():
    level, pipes, children = group(["direct-root-then-die"])
    try:
        level.single_copy_bytes = DIRECT
        assert pipes[0].recv() == "calling"
        time.sleep(0.5)  # it has published its buffer's address and waits for this rank to read it
        children[0].kill()
        children[0].join(5)
        x = np.zeros(DIRECT, np.int64)
        with pytest.raises(RankFailure, match="rank 0: rank 1 .*ended during broadcast .*while this rank read") as caught:
            level.broadcast(x, 1, 8, 60.0, "broadcast")
        assert caught.value.ranks == [1]
        assert level.broken
    finally:
        finish(children)


def test_a_root_runs_a_whole_ring_of_small_broadcasts_ahead_of_a_receiver_that_has_not_come():
    level, pipes, children = group(["run-ahead-receiver"])
    try:
        call = _native.HostCall(8, 5.0, "broadcast", run_ahead=True)
        for i in range(AHEAD):  # (blocked here, the root would fail at the 5 s deadline: the receiver waits on "go")
            assert level.broadcast(np.array([i, -i], np.int64), 0, call)
        pipes[0].send("go")
        for i in range(AHEAD, AHEAD + 4):  # these wait for the receiver to free the ring's entries
            assert level.broadcast(np.array([i, -i], np.int64), 0, call)
        assert pipes[0].recv() == [[i, -i] for i in range(AHEAD + 4)]
    finally:
        finish(children)


def test_a_receiver_that_dies_while_the_root_runs_ahead_is_named_when_the_ring_is_full():
    level, pipes, children = group(["die-before-arriving"])
    try:
        call = _native.HostCall(8, 60.0, "broadcast", run_ahead=True)
        start = time.monotonic()
        with pytest.raises(RankFailure, match="rank 1 .*ended during broadcast") as caught:
            for i in range(AHEAD + 1):
                level.broadcast(np.array([i, i], np.int64), 0, call)
        assert caught.value.ranks == [1]
        assert time.monotonic() - start < 10  # the deadline is 60 s
    finally:
        finish(children)


def test_a_receiver_checks_the_root_s_call_on_receipt_and_the_root_learns_it_at_the_next_full_step():
    level, pipes, children = group(["run-ahead-other-shape"])
    try:
        assert level.broadcast(np.array([4, 5], np.int64), 0, _native.HostCall(8, 60.0, "broadcast(2)",
                                                                                  run_ahead=True))  # ran ahead
        said = pipes[0].recv()
        assert said.startswith("rank 1: ranks called ddl differently: ranks 1: broadcast(3); ranks 0: broadcast(2)")
        assert level.barrier(1, 60.0, "barrier()") is False  # the histories differ: every rank sees it here
        assert level.history == "broadcast(2)"
        assert level.barrier(1, 60.0, "barrier()") is True  # and then goes on
        assert pipes[0].recv() == (False, "broadcast(3) (raised here)", True)
    finally:
        finish(children)
