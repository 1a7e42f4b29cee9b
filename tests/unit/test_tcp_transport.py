"""ddl's own TCP transport (ddl.core.tcp, native TcpTransport): ranks are threads of this process connected over
Unix sockets with a shared pipe each, as ranks of one host are (the pipes small, so that messages wrap around
them and fill them; the socket alone or loopback TCP where a test says so); what is checked is the transport's
contract (MPI's matching order, messages that arrive before their receive, errors naming the peer, a set-up that
ignores strangers) and the collectives on it, against numpy."""
import socket
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from ddl import DDLError, MismatchError, TransportError, _native
from ddl.core import tcp
from ddl.core.communicator import Communicator
from ddl.core.paths import planned
from ddl.options import parse
from ddl import planner
from ddl.topology import LevelCost
from ddl.topology.tree import normalize

from test_loopback import contribution, expected, spawn_on

BASE = replace(parse("", environ={}), timeout=20.0)
LOOP = "127.0.0.1"
PIPE = 40000  # bytes each way: smaller than the larger messages here, and no power of two


def connected(p, nonce=7, via=(tcp.UNIX, LOOP), pipe=PIPE):
    """p TcpTransports of this process, connected to each other (``via``: the candidates, in order; ``pipe``:
    the shared pipes' bytes each way between ranks on Unix sockets, 0: none)."""
    transports = [_native.TcpTransport(r, p, LOOP) for r in range(p)]
    connect_all(transports, nonce, via, pipe)
    return transports


def connect_all(transports, nonce, via=(tcp.UNIX, LOOP), pipe=PIPE):
    ports = [t.port for t in transports]
    errors = []

    def connect(t):
        try:
            t.connect([list(via)] * len(transports), ports, nonce, 10.0, pipe)
        except Exception as e:  # noqa: BLE001 (collected for the assert)
            errors.append(e)

    threads = [threading.Thread(target=connect, args=(t,)) for t in transports]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


def comms(p, options=BASE, hierarchy=None):
    return [Communicator(_native.Executor.tcp(t), r, p, options, hierarchy=hierarchy)
            for r, t in enumerate(connected(p))]


def run_ok(cs, fn):
    results, errors = spawn_on(cs, fn)
    for e in errors:
        if e is not None:
            raise e
    return results


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize("n", [0, 1, 13, 3001, 1_000_003])  # 1M elements: many pipeline blocks
def test_allreduce_over_tcp_equals_numpy(p, n):
    cs = comms(p)
    for op in ("sum", "max"):
        got = run_ok(cs, lambda c: c.allreduce(contribution(c.rank, n, np.float32, op), op))
        for r, g in enumerate(got):
            np.testing.assert_array_equal(g.astype(np.float64), expected(p, n, np.float32, op), err_msg=f"rank {r}")


def test_two_levels_over_tcp_every_collective():
    p, n = 4, 600_001
    cs = comms(p, hierarchy=[[0, 1], [2, 3]])
    got = run_ok(cs, lambda c: c.allreduce(contribution(c.rank, n, np.float64, "sum")))
    for g in got:
        np.testing.assert_array_equal(g, expected(p, n, np.float64, "sum"))
    rows = [np.arange(r * 1000, r * 1000 + 1000 + 7 * r, dtype=np.float32) for r in range(p)]  # uneven
    for g in run_ok(cs, lambda c: c.allgather(rows[c.rank])):
        np.testing.assert_array_equal(g, np.concatenate(rows))
    whole = [np.arange(p * 50_000, dtype=np.float64) * (r + 1) for r in range(p)]
    for r, g in enumerate(run_ok(cs, lambda c: c.reduce_scatter(whole[c.rank].reshape(p, -1)))):
        np.testing.assert_array_equal(g.reshape(-1), sum(whole).reshape(p, -1)[r])
    for g in run_ok(cs, lambda c: c.broadcast(np.full(70_000, c.rank, np.int64), root=2)):
        np.testing.assert_array_equal(g, np.full(70_000, 2))


def test_asynchronous_calls_over_tcp_keep_their_order():
    cs = comms(3)

    def body(c):
        handles = [c.allreduce_async(np.full(200_000, c.rank + k, np.float32)) for k in range(4)]
        return [h.wait(30) for h in handles]

    for got in run_ok(cs, body):
        for k, g in enumerate(got):
            np.testing.assert_array_equal(g, np.full(200_000, sum(r + k for r in range(3)), np.float32))


def test_a_mismatch_over_tcp_raises_on_every_rank():
    _, errors = spawn_on(comms(3), lambda c: c.allreduce(np.ones(500 if c.rank == 1 else 400)))
    for e in errors:
        assert isinstance(e, MismatchError) and "ranks 1: allreduce(shape=(500,)" in str(e)


N_CHECKED = 100_000  # float32: 400 KB, above what rides in the agreement round, within CHECKED_UP_TO


def test_a_checked_allreduce_has_no_agreement_round_and_names_the_ranks_that_differ():
    """Over TCP a mid-size allreduce is checked on receipt: ranks that called with other shapes all raise at
    once (not at the deadline), naming both calls; neither the input (in place) nor ``out`` changes; the next
    call is read by no message of the failed one."""
    cs = comms(3)
    assert "checked on receipt" in cs[0].explain(4 * N_CHECKED).path
    assert "after an agreement round" in cs[0].explain(8 << 20).path

    def body(c):
        a, out = np.full(N_CHECKED - (c.rank == 1), 5.0, np.float32), np.zeros(N_CHECKED - (c.rank == 1), np.float32)
        try:
            c.allreduce(a, out=out) if c.rank else c.allreduce(a, out=a)
        finally:
            assert (a == 5.0).all() and (out == 0.0).all()

    started = time.monotonic()
    _, errors = spawn_on(cs, body)
    assert time.monotonic() - started < BASE.timeout / 2
    for r, e in enumerate(errors):
        assert isinstance(e, MismatchError), (r, e)
        assert str(e).startswith(f"rank {r}: ranks called ddl differently") and \
            f"allreduce(shape=({N_CHECKED - 1},)" in str(e) and f"allreduce(shape=({N_CHECKED},)" in str(e)
    for _ in range(2):
        got = run_ok(cs, lambda c: c.allreduce(np.arange(N_CHECKED, dtype=np.float32) + c.rank))
        for g in got:
            np.testing.assert_array_equal(g, 3 * np.arange(N_CHECKED, dtype=np.float32) + 3)


def test_a_checked_reduce_scatter_raises_on_every_rank_and_the_next_is_right():
    cs, n = comms(3), N_CHECKED // 2
    assert "checked on receipt" in cs[0].explain(12 * n, "reduce_scatter").path
    _, errors = spawn_on(cs, lambda c: c.reduce_scatter(np.ones((3, n + (c.rank == 2)), np.float32)))
    for r, e in enumerate(errors):
        assert isinstance(e, MismatchError) and f"shape=(3, {n + 1})" in str(e), (r, e)
    got = run_ok(cs, lambda c: c.reduce_scatter(np.arange(3 * n, dtype=np.float32).reshape(3, -1) * (c.rank + 1)))
    for r, g in enumerate(got):
        np.testing.assert_array_equal(g.reshape(-1), 6 * np.arange(r * n, (r + 1) * n, dtype=np.float32))


def test_a_checked_allreduce_beside_an_agreed_call_raises_on_every_rank():
    """One rank's allgather begins with an agreement round where the others' allreduce has none: the rank
    that meets the other kind of call tells the rest, and all go on together afterwards."""
    cs = comms(4, hierarchy=[[0, 1], [2, 3]])
    for odd in (0, 2, 3):
        def body(c):
            a = np.full(N_CHECKED, 2.0, np.float32)
            return c.allgather(a) if c.rank == odd else c.allreduce(a)

        _, errors = spawn_on(cs, body)
        for r, e in enumerate(errors):
            assert isinstance(e, MismatchError) and "allgather(shape=" in str(e) and "allreduce(shape=" in str(e), \
                (odd, r, e)
        got = run_ok(cs, lambda c: c.allreduce(np.full(N_CHECKED, c.rank, np.float64)))
        for g in got:
            np.testing.assert_array_equal(g, np.full(N_CHECKED, 6.0))


def test_checked_allgathers_whose_rows_differ_gather_as_agreed(monkeypatch):
    """Over TCP an allgather of a few hundred KB is checked on receipt, its row count in the check: where ranks'
    rows differ, every rank raises inside the run, learns every count and gathers them, whichever path its own
    size took (checked; riding, with no rows; agreed, past CHECKED_UP_TO). Its later calls, even or not, are
    agreed first (no rank raises again) and right."""
    from ddl.core.paths.planned import Planned

    recovered = []
    learn = Planned.after_mismatch
    monkeypatch.setattr(Planned, "after_mismatch", lambda self, *a: recovered.append(self.comm.rank) or learn(self, *a))
    cs, n = comms(4, hierarchy=[[0, 1], [2, 3]]), 5_000
    assert "checked on receipt" in cs[0].explain(4 * 4 * 3 * n, "allgather").path
    even = [n] * 4
    for cols, uneven in ((3, [n, n, n + 1, n]), (4, [n, n, 0, n]), (5, [n, 30_000, n, n]), (6, [0, 0, 0, n])):
        for rows, recovering in ((even, False), (even, False), (uneven, True), (uneven, False), (even, False)):
            def body(c):
                return c.allgather(np.arange(rows[c.rank] * cols, dtype=np.float32).reshape(-1, cols) + 1e4 * c.rank)

            want = np.concatenate([np.arange(rows[r] * cols, dtype=np.float32).reshape(-1, cols) + 1e4 * r
                                   for r in range(4)])
            recovered.clear()
            for g in run_ok(cs, body):
                np.testing.assert_array_equal(g, want)
            assert sorted(recovered) == ([0, 1, 2, 3] if recovering else []), (cols, rows, recovered)
    for g in run_ok(cs, lambda c: c.allgather(np.ones((0, 7), np.float32))):  # no rows anywhere: checked, empty
        assert g.shape == (0, 7)


def test_an_allgather_whose_rows_were_uneven_is_checked_again_after_enough_even_calls(monkeypatch):
    """Once rows differed, an allgather is agreed first; EVEN_AGAIN agreed calls in a row with even rows end
    that on every rank alike: it is checked on receipt again (and rows that differ then are recovered from
    again), every answer right throughout."""

    monkeypatch.setattr(planned, "EVEN_AGAIN", 3)
    cs, n = comms(4, hierarchy=[[0, 1], [2, 3]]), 15_000
    nbytes = 4 * n  # (explain's call: float32, one dimension, as these)

    def gather(rows):
        def body(c):
            return c.allgather(np.arange(rows[c.rank], dtype=np.float32) + 1e5 * c.rank)
        want = np.concatenate([np.arange(rows[r], dtype=np.float32) + 1e5 * r for r in range(4)])
        for g in run_ok(cs, body):
            np.testing.assert_array_equal(g, want)

    even, uneven = [n] * 4, [n, n + 2, n, n]
    for _ in range(2):
        gather(even)
        gather(uneven)
        for k in range(3):
            assert all("checked on receipt" not in c.explain(nbytes, "allgather").path for c in cs), k
            gather(even)
        assert all("checked on receipt" in c.explain(nbytes, "allgather").path for c in cs)


def test_a_rank_behind_finishes_the_call_the_others_finished_before_they_raised():
    """Ranks 0 and 1 finish a broadcast, then call allreduces that differ and raise; rank 2, late to the
    broadcast, still gets it whole (every message of it had come) and raises in its allreduce, the call where
    the others did; then all go on together."""
    cs, broadcast = comms(3), []

    def body(c):
        if c.rank == 2:
            time.sleep(0.5)
        got = c.broadcast(np.arange(1000, dtype=np.float32) if c.rank == 0 else np.zeros(1000, np.float32))
        np.testing.assert_array_equal(got, np.arange(1000, dtype=np.float32))
        broadcast.append(c.rank)
        c.allreduce(np.ones(N_CHECKED + (c.rank == 1), np.float32))

    _, errors = spawn_on(cs, body)
    assert sorted(broadcast) == [0, 1, 2]
    for r, e in enumerate(errors):
        assert isinstance(e, MismatchError) and "allreduce(shape=" in str(e), (r, e)
    for g in run_ok(cs, lambda c: c.allreduce(np.full(N_CHECKED, c.rank, np.float32))):
        np.testing.assert_array_equal(g, np.full(N_CHECKED, 3.0))


def test_a_checked_allgather_beside_another_call_raises_on_every_rank():
    """Rows per row that differ (another call, not uneven rows) raise on every rank, and the next call is right."""
    cs, n = comms(4, hierarchy=[[0, 1], [2, 3]]), 5_000
    _, errors = spawn_on(cs, lambda c: c.allgather(np.ones((n, 4 if c.rank == 3 else 3), np.float32)))
    for r, e in enumerate(errors):
        assert isinstance(e, MismatchError) and "allgather(shape=(*, 4)" in str(e) and \
            "allgather(shape=(*, 3)" in str(e), (r, e)
    for g in run_ok(cs, lambda c: c.allgather(np.full((n, 3), c.rank, np.float32))):
        np.testing.assert_array_equal(g, np.repeat(np.arange(4, dtype=np.float32), n)[:, None] * np.ones(3))


@pytest.mark.parametrize("n", [2, 20_000, N_CHECKED])  # 8 B, 80 and 400 KB: checked, not riding
def test_broadcasts_checked_on_receipt_raise_on_every_rank_and_the_ranks_start_over_together(n):
    """A broadcast's rank may finish before another finds that it called differently (here rank 3 names
    another root), and go on to the next calls: every rank raises, in that call or within the next RUN_AHEAD
    (a root that never waits for anyone finds out there at the latest), none waits for its deadline; then the
    ranks start over together and the calls after are right. Three times over: a rank that raises and stops
    calling must still get its word out (before it flushed it, a word queued behind a full Unix socket left
    the others waiting for the deadline in 1 of 10-20 such runs, under load)."""
    cs = comms(4, hierarchy=[[0, 1], [2, 3]])
    assert "checked on receipt" in cs[0].explain(4 * n, "broadcast").path

    def body(c):  # as a program that stops calling collectives at its first error
        a = np.full(n, c.rank, np.float32)
        for k in range(_native.TcpTransport.RUN_AHEAD + 1):
            try:
                c.broadcast(a, root=1 if c.rank == 3 and k == 0 else 0)
            except MismatchError as e:
                return k, str(e)
        return None, ""

    for _ in range(3):
        started = time.monotonic()
        said = run_ok(cs, body)
        assert time.monotonic() - started < BASE.timeout / 2
        assert all(k is not None and "root=1" in text and "root=0" in text for k, text in said), said
        for k in range(3):  # a broadcast, an allreduce that rides, one that does not: all right
            got = run_ok(cs, lambda c: (c.broadcast(np.full(n, c.rank + k, np.float32), root=k),
                                        c.allreduce(np.ones(4)), c.allreduce(np.full(N_CHECKED, c.rank, np.float32))))
            for b, small, large in got:
                np.testing.assert_array_equal(b, np.full(n, 2 * k, np.float32))
                np.testing.assert_array_equal(small, np.full(4, 4.0))
                np.testing.assert_array_equal(large, np.full(N_CHECKED, 6.0, np.float32))


def test_a_rank_that_skips_a_small_broadcast_makes_every_rank_raise_and_the_next_calls_are_right():
    """As a program whose broadcast sits under a condition one rank does not meet: ranks 0 and 1 broadcast 8 B
    and then allreduce, rank 2 only allreduces. No message of the broadcast is read as the allreduce's: every
    rank raises MismatchError naming both calls (rank 0 finished its broadcast and raises in its allreduce),
    none waits for the deadline; the calls after are right."""
    cs = comms(3)

    def body(c):
        try:
            if c.rank < 2:
                c.broadcast(np.full(2, 7.0, np.float32), root=0)
            c.allreduce(np.full(2, 1.0, np.float32))
        except MismatchError as e:
            return str(e)
        return None

    started = time.monotonic()
    said = run_ok(cs, body)
    assert time.monotonic() - started < BASE.timeout / 2
    assert all(text and "broadcast(shape=(2,)" in text and "allreduce(shape=(2,)" in text for text in said), said
    got = run_ok(cs, lambda c: (c.broadcast(np.full(2, c.rank + 1.0), root=1), c.allreduce(np.full(2, c.rank + 1.0))))
    for b, total in got:
        np.testing.assert_array_equal(b, np.full(2, 2.0))
        np.testing.assert_array_equal(total, np.full(2, 6.0))


def test_a_root_runs_ahead_at_most_run_ahead_calls_and_late_ranks_get_every_call_in_order():
    """The root of small broadcasts waits for nobody but the previous rank's notice, one call in RUN_AHEAD: while
    the others sleep it finishes no more than RUN_AHEAD calls; the messages of the calls it ran ahead with wait
    for their receivers, each read by its own call (fails if the root waits no notice, or an early message is
    read by a later call)."""
    cs = comms(4, hierarchy=[[0, 1], [2, 3]])
    assert "checked on receipt" in cs[0].explain(8, "broadcast").path
    ahead = _native.TcpTransport.RUN_AHEAD
    calls = 2 * ahead + 3
    done = [0]

    def body(c):
        seen, led = [], None
        if c.rank:
            time.sleep(0.5)
            led = done[0]
        for k in range(calls):
            seen.append(c.broadcast(np.full(2, k if c.rank == 0 else -1, np.int32), root=0)[0])
            if c.rank == 0:
                done[0] = k + 1
        return seen, led

    got = run_ok(cs, body)
    assert all(seen == list(range(calls)) for seen, _ in got)
    assert all(led <= ahead for _, led in got[1:]), [led for _, led in got]


def test_late_ranks_read_queued_broadcasts_of_every_size_from_their_pipes():
    """The root runs ahead through the shared pipes with broadcasts of changing sizes (8 B to 24 KiB) while the
    others sleep: each late rank reads them queued, each into a buffer kept from earlier ones where it fits (the
    transport's spares: larger, smaller, new), and every call gets its own bytes (fails if a kept buffer keeps an
    earlier call's length or bytes)."""
    cs = comms(3)
    sizes = [1, 512, 3, 3072, 2, 511, 513, 1, 4096] * 3  # int64 elements: around the spares' 4 KiB, and above
    expect = [np.arange(n, dtype=np.int64) * 7 + k for k, n in enumerate(sizes)]

    def body(c):
        if c.rank:
            time.sleep(0.3)
        return [c.broadcast(expect[k] if c.rank == 0 else np.full(n, -1, np.int64), root=0)
                for k, n in enumerate(sizes)]

    for got in run_ok(cs, body):
        assert [len(b) for b in got] == sizes
        for b, e in zip(got, expect):
            np.testing.assert_array_equal(b, e)


def test_a_run_of_broadcasts_checked_on_receipt_is_right():
    cs = comms(3)
    assert "checked on receipt" in cs[0].explain(8 * 10_000, "broadcast").path
    assert "checked on receipt" in cs[0].explain(8, "broadcast").path  # (small ones too: they no longer ride)
    got = run_ok(cs, lambda c: [c.broadcast(np.full(10_000, c.rank * 10 + k, np.int64), root=k % 3)
                                for k in range(30)])
    for g in got:
        for k, b in enumerate(g):
            np.testing.assert_array_equal(b, np.full(10_000, (k % 3) * 10 + k))


def test_messages_queued_in_a_socket_are_read_ahead_and_each_lands_whole():
    # over sockets alone (no shared pipes), a root that runs ahead queues messages of every size: one recv
    # takes several small ones and the start of the next (Peer::inbox); bodies of 8 KiB or more go straight
    # into place, after the part the read-ahead already took
    cs = [Communicator(_native.Executor.tcp(t), r, 3, BASE) for r, t in enumerate(connected(3, via=(LOOP,), pipe=0))]
    sizes = [1, 125, 1023, 1024, 1025, 3000, 7, 2500] * 4  # int64 elements: 8 B to 24 KiB, across the inbox's size
    got = run_ok(cs, lambda c: [c.broadcast(np.arange(n, dtype=np.int64) * (k + 1) + c.rank, root=0)
                                for k, n in enumerate(sizes)])
    for g in got:
        for k, (b, n) in enumerate(zip(g, sizes)):
            np.testing.assert_array_equal(b, np.arange(n) * (k + 1))


def test_a_large_run_its_caller_waits_for_blocks_at_once_where_a_small_one_polls_first(monkeypatch):
    # rank 1 comes late to the second of two calls, so rank 0 waits inside its run (the 8 MiB call checked on
    # receipt too: no agreement round to wait in first). A small call polls a while after its message went out
    # (the answer is usually that near); an allreduce of 8 MiB blocks at once, though its blocks here are small
    # messages, as a plan of many levels makes them (polling after each, 8 ranks on 2 cores spun ~0.4
    # CPU-seconds more per 26 MiB on the emulated T2)
    monkeypatch.setattr(planned, "CHECKED_UP_TO", 64 << 20)
    transports = connected(2, via=(LOOP,), pipe=0)
    options = replace(BASE, segment=64 << 10)
    cs = [Communicator(_native.Executor.tcp(t), r, 2, options) for r, t in enumerate(transports)]

    def late(c, n, delay):
        if c.rank == 1:
            time.sleep(delay)
        return c.allreduce(contribution(c.rank, n, np.float32, "sum"), "sum")

    for n, polled in ((2 << 20, False), (8, True)):
        run_ok(cs, lambda c: late(c, n, 0))
        before = transports[0].spins
        got = run_ok(cs, lambda c: late(c, n, 0.1))
        for g in got:
            np.testing.assert_array_equal(g, expected(2, n, np.float64, "sum"))
        assert (transports[0].spins > before) == polled, (n, transports[0].spins - before)


def test_a_waiting_callers_spin_doubles_after_premature_blocks_and_falls_back_after_a_long_wait():
    # a rank that spun its window (400 us at first), blocked, and had its message within one more window blocked
    # too soon: the window doubles, to 3.2 ms at most; a wait blocked past that (a peer really late) sets it
    # back to 400 us; between the two it stays; a call begun long after the last small message blocks at once,
    # which says nothing about the window
    rule = _native.TcpTransport.next_spin_window_us
    windows = [400]
    for _ in range(4):
        windows.append(rule(windows[-1], windows[-1] + 20, windows[-1] // 4))
    assert windows == [400, 800, 1600, 3200, 3200]
    assert rule(3200, 3300, 3201) == 400 and rule(800, 810, 50_000) == 400
    assert rule(400, 420, 401) == 400 and rule(1600, 1650, 2000) == 1600 and rule(400, 420, 3200) == 400
    assert rule(400, 50_000, 10) == 400 and rule(1600, 3200, 100) == 3200 and rule(1600, 3201, 100) == 1600
    # on a transport: 400 us before any wait; after a call rank 0 waited ~100 ms for, 400 us again
    transports = connected(2)
    assert [t.spin_window_us for t in transports] == [400, 400]
    cs = [Communicator(_native.Executor.tcp(t), r, 2, BASE) for r, t in enumerate(transports)]

    def late(c):
        if c.rank == 1:
            time.sleep(0.1)
        return c.allreduce(np.full(2, c.rank + 1.0), "sum")

    for _ in range(2):
        for g in run_ok(cs, late):
            np.testing.assert_array_equal(g, [3.0, 3.0])
    assert transports[0].spin_window_us == 400


def test_known_calls_across_hosts_run_natively_and_equal_numpy(monkeypatch):
    """After its first call, a known checked broadcast (new result, another out, in place), an allreduce that
    rides (avg) and a checked one (sum into out), an allgather and a reduce-scatter (uneven parts) that ride
    run from ddl._native.ShortCalls: Python's short forms are never taken, and the results are numpy's. An
    allgather whose rows turn out uneven is still right; a rank that calls another op makes every rank raise
    MismatchError naming both calls, and the next calls are right."""
    from ddl.core.paths.planned import Planned
    from ddl.core.paths.riding import Riding

    cs = comms(3, hierarchy=[[0, 1], [2]])

    def body(c, k):
        x = np.arange(6, dtype=np.float32).reshape(2, 3) + c.rank + k
        y = x.copy()
        c.broadcast(y, root=2, out=y)
        big, into = np.full(20_000, c.rank + k, np.float64), np.empty(20_000)
        c.allreduce(big, "sum", out=into)
        whole = np.arange(20, dtype=np.float64).reshape(10, 2) * (c.rank + 1) + k
        return (c.broadcast(x, root=1), c.broadcast(x, root=0, out=np.empty_like(x)), y, c.allreduce(x, "avg"),
                into, c.allgather(x), c.reduce_scatter(whole, "sum"))

    def expect(got, k):
        x = np.arange(6, dtype=np.float32).reshape(2, 3) + k
        reduced = np.arange(20, dtype=np.float64).reshape(10, 2) * 6 + 3 * k
        for rank, one in enumerate(got):
            for value, want in zip(one, (x + 1, x, x + 2, x + 1, np.full(20_000, 3.0 * k + 3),
                                         np.concatenate([x, x + 1, x + 2]), np.array_split(reduced, 3)[rank])):
                np.testing.assert_array_equal(value, want)

    expect(run_ok(cs, lambda c: body(c, 0)), 0)  # Python's long path, which teaches the table
    # three broadcasts (their roots), two allreduces, an allgather, a reduce-scatter
    assert [len(c._native) for c in cs] == [7] * 3

    def python(*args):
        raise AssertionError("a known call took Python's short form")

    monkeypatch.setattr(Planned, "again", python)
    monkeypatch.setattr(Riding, "again", python)
    for k in (1, 2):
        expect(run_ok(cs, lambda c: body(c, k)), k)

    def other_op(c):
        try:
            c.allreduce(np.ones((2, 3), np.float32), "max" if c.rank == 2 else "avg")
        except MismatchError as e:
            return str(e)

    said = run_ok(cs, other_op)
    assert all(text and "op=avg" in text and "op=max" in text for text in said), said
    expect(run_ok(cs, lambda c: body(c, 3)), 3)
    rows = run_ok(cs, lambda c: c.allgather(np.full((2 + (c.rank == 1), 3), c.rank, np.float32)))
    for got in rows:  # (ranks 0 and 2 ran the known round natively; rank 1's rows made it disagree)
        np.testing.assert_array_equal(got, np.repeat(np.arange(3, dtype=np.float32), [2, 3, 2])[:, None] * [1, 1, 1])


def test_a_rank_that_goes_away_is_named_before_the_deadline():
    transports = connected(2)
    survivor = Communicator(_native.Executor.tcp(transports[0]), 0, 2, replace(BASE, timeout=60.0))
    del transports[1]  # its sockets close, as a process's do when it dies
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="rank 0: the connection with rank 1 was lost"):
        survivor.allreduce(np.ones(1 << 20, np.float32))
    assert time.monotonic() - t0 < 30  # seen at once, not at the 60 s deadline


def test_set_up_ignores_a_stranger_and_a_wrong_nonce():
    p = 2
    transports = [_native.TcpTransport(r, p, LOOP) for r in range(p)]
    ports = [t.port for t in transports]
    strangers = []
    hello_of_another_job = b"1LDD" + (1).to_bytes(4, "little") + (98).to_bytes(8, "little")  # rank 1, nonce 98
    for junk in (b"GET / HTTP/1.0\r\n\r\n", hello_of_another_job):
        s = socket.create_connection((LOOP, ports[0]))
        s.sendall(junk)
        strangers.append(s)
    connect_all(transports, 99)
    cs = [Communicator(_native.Executor.tcp(t), r, p, BASE) for r, t in enumerate(transports)]
    for g in run_ok(cs, lambda c: c.allreduce(np.full(5, c.rank + 1.0))):
        np.testing.assert_array_equal(g, np.full(5, 3.0))
    for s in strangers:
        s.close()


def test_an_unreachable_rank_is_named_after_the_deadline():
    closed = socket.socket()
    closed.bind((LOOP, 0))
    port = closed.getsockname()[1]
    closed.close()  # nobody listens there
    t = _native.TcpTransport(1, 2, LOOP)
    with pytest.raises(TransportError, match=r"rank 1: .*could not reach rank 0 at port %d of 127\.0\.0\.1" % port):
        t.connect([[LOOP], [LOOP]], [port, t.port], 1, 0.5)


def test_ranks_of_one_host_connect_over_unix_sockets_or_loopback_alike():
    """Offered a Unix socket first, every pair connects over one (no TCP/IP in the kernel), with a shared pipe
    where asked; offered loopback alone, none does (and no pipe); the collectives are right every way. A Unix
    socket that no rank listens on is named."""
    for via, pipe, unix, shared in (((tcp.UNIX, LOOP), PIPE, 2, 2), ((tcp.UNIX, LOOP), 0, 2, 0),
                                    ((tcp.UNIX, LOOP), 1 << 20, 2, 2), ((LOOP,), PIPE, 0, 0)):
        transports = connected(3, via=via, pipe=pipe)
        assert [t.unix_peers for t in transports] == [unix] * 3
        assert [t.shared_peers for t in transports] == [shared] * 3
        cs = [Communicator(_native.Executor.tcp(t), r, 3, BASE) for r, t in enumerate(transports)]
        got = run_ok(cs, lambda c: c.allreduce(contribution(c.rank, 3001, np.float32, "sum"), "sum"))
        for r, g in enumerate(got):
            np.testing.assert_array_equal(g.astype(np.float64), expected(3, 3001, np.float32, "sum"), err_msg=f"rank {r}")
    with socket.socket() as s:
        s.bind((LOOP, 0))
        port = s.getsockname()[1]  # a port (and so a Unix socket name) nobody listens on
    t = _native.TcpTransport(1, 2, LOOP)
    with pytest.raises(TransportError, match=r"rank 1: .*could not reach rank 0 at port %d of unix" % port):
        t.connect([[tcp.UNIX], [tcp.UNIX]], [port, t.port], 1, 0.5)


def test_candidates_loopback_on_the_same_host_and_never_an_address_both_have():
    hosts = ["a", "a", "b"]
    published = [[("eth0", "10.0.0.1"), ("docker0", "172.17.0.1")], [("eth0", "10.0.0.1")],
                 [("ib0", "10.1.0.3"), ("docker0", "172.17.0.1"), ("eth0", "10.0.0.3")]]
    here = [tcp.UNIX, LOOP]
    assert tcp.candidates(0, hosts, published, None) == [here, here, ["10.1.0.3", "10.0.0.3"]]
    assert tcp.candidates(2, hosts, published, None) == [["10.0.0.1"], ["10.0.0.1"], here]
    assert tcp.candidates(0, hosts, published, None, unix=False) == [[LOOP], [LOOP], ["10.1.0.3", "10.0.0.3"]]
    assert tcp.candidates(0, hosts, published, "eth0")[2] == ["10.0.0.3"]
    with pytest.raises(DDLError, match="rank 2: DDL_TCP_IFACE=ib0: rank 0 \\(host a\\) has no IPv4 address on it"):
        tcp.candidates(2, hosts, published, "ib0")


def test_a_rank_shares_a_pipe_with_each_rank_of_its_host_sized_from_one_budget():
    one_each = ["a", "a", "b", "b"]
    assert tcp.pipe_bytes(0, one_each, {}) == tcp.PIPE_BYTES_MAX  # the budget is more than one pipe's
    crowded = ["a"] * 32 + ["b"]
    assert tcp.pipe_bytes(0, crowded, {}) == tcp.PIPES_BYTES // 31
    assert tcp.pipe_bytes(0, ["a"] * 1000, {}) == tcp.PIPE_BYTES_MIN
    assert tcp.pipe_bytes(0, one_each, {"DDL_TCP_SHM": "0"}) == 0


def test_transport_choice():
    two_hosts = ["a", "a", "b", "b"]
    assert tcp.wanted(4, two_hosts, {}) is True
    assert tcp.wanted(4, ["a"] * 4, {}) is False  # one host: MPI's shared memory
    assert tcp.wanted(4, two_hosts, {"DDL_ELASTIC": "1"}) is False  # ULFM's notices come through MPI
    assert tcp.wanted(4, two_hosts, {"DDL_TRANSPORT": "mpi"}) is False
    assert tcp.wanted(4, ["a"] * 4, {"DDL_TRANSPORT": "tcp"}) is True
    assert tcp.wanted(1, None, {"DDL_TRANSPORT": "tcp"}) is False
    assert tcp.wanted(tcp.MAX_RANKS + 1, ["a", "b"] * 200, {}) is False
    with pytest.raises(DDLError, match="DDL_TRANSPORT='ucx': expected one of auto, mpi, tcp"):
        tcp.wanted(4, two_hosts, {"DDL_TRANSPORT": "ucx"})


def test_blocks_across_a_network_are_larger_over_tcp():
    """Over ddl's TCP a plan across a network takes blocks of TCP_BLOCK_BYTES or more (fewer messages, fewer
    system calls and wake-ups), where over MPI they stay at or under MAX_BLOCK_BYTES (its eager limit)."""
    tree = normalize([[0, 1], [2, 3], [4, 5], [6, 7]])  # T1's shape: 4 nodes of 2 ranks, 1 Gbit/s between them
    net = (LevelCost("node", "shm", 3e-6, 4e9, 2.5e-10, "peer"),
           LevelCost("switch", "veth", 62e-6, 1.25e8, 2.5e-10, "uplink"))
    for nbytes in (26 << 20, 200 << 20):
        assert planner.choose(tree, net, nbytes).block_bytes <= planner.MAX_BLOCK_BYTES
        over_tcp = planner.choose(tree, net, nbytes, tcp=True).block_bytes
        assert planner.TCP_BLOCK_BYTES <= over_tcp < 2 * planner.TCP_BLOCK_BYTES
    # T2's shape: racks, then their spine; a pipeline through more network stages takes a quarter the blocks
    racks = normalize([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    two = net + (LevelCost("spine", "veth", 62e-6, 6.25e7, 2.5e-10, "uplink"),)
    for nbytes in (16 << 20, 64 << 20):
        assert planner.choose(racks, two, nbytes, tcp=True).block_bytes == planner.TCP_BLOCK_BYTES // 4
    # T5's shape (one rank a node: racks, aisles, their spine, three network levels): no smaller than T2's
    three = (LevelCost("rack", "veth", 62e-6, 1.25e8, 2.5e-10, "uplink"),
             LevelCost("aisle", "veth", 62e-6, 6.25e7, 2.5e-10, "uplink"),
             LevelCost("spine", "veth", 62e-6, 3.125e7, 2.5e-10, "uplink"))
    assert planner.choose(racks, three, 16 << 20, tcp=True).block_bytes == planner.TCP_BLOCK_BYTES // 4
    one_host = (LevelCost("node", "shm", 3e-6, 4e9, 2.5e-10, "peer"),)
    assert planner.choose(normalize([0, 1, 2, 3]), one_host, 26 << 20, tcp=True) == \
        planner.choose(normalize([0, 1, 2, 3]), one_host, 26 << 20)
