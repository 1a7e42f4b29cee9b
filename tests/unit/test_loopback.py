"""The executor and the collectives, over the in-process loopback transport: ranks are threads."""
import threading
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from ddl import DDLError, MismatchError, TransportError, _native
from ddl.core.communicator import Communicator
from ddl.options import parse

BASE = replace(parse("", environ={}), timeout=20.0)
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int32, np.int64]


def spawn(p, fn, options=BASE):
    """Runs fn(comm) on p threads, one loopback rank each; returns (results, errors) by rank."""
    hub = _native.LoopbackHub(p)
    return spawn_on([Communicator.loopback(hub, r, options) for r in range(p)], fn)


def spawn_on(comms, fn):
    """Runs fn(comm) for each communicator on its own thread; returns (results, errors) by rank."""
    p = len(comms)
    results, errors = [None] * p, [None] * p

    def body(r):
        try:
            results[r] = fn(comms[r])
        except Exception as e:  # collected: the test decides what each rank should have raised
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results, errors


def run_ok(p, fn, options=BASE):
    results, errors = spawn(p, fn, options)
    for e in errors:
        if e is not None:
            raise e
    return results


def contribution(rank, n, dtype, op):
    i = np.arange(n)
    v = ((i + rank) % 2) * 2 - 1 if op == "prod" else (i * 3 + rank) % 5 - 2
    return v.astype(dtype)


def expected(p, n, dtype, op):
    stack = np.stack([contribution(r, n, np.float64, op) for r in range(p)]) if n else np.zeros((p, 0))
    return {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0), "max": stack.max(0),
            "avg": stack.sum(0) / p}[op]


@pytest.mark.parametrize("p", [2, 3, 5, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_allreduce_every_dtype_and_op(p, dtype):
    ops = ["sum", "prod", "min", "max"] + (["avg"] if np.dtype(dtype).kind == "f" or dtype is ml_dtypes.bfloat16
                                           else [])
    for op in ops:
        for n in (0, 1, 13, 3001):  # 3001 elements: past the small path for 8-byte types
            got = run_ok(p, lambda c: c.allreduce(contribution(c.rank, n, dtype, op), op))
            want = expected(p, n, dtype, op)
            for r, g in enumerate(got):
                assert g.dtype == np.dtype(dtype) and g.shape == (n,)
                np.testing.assert_allclose(g.astype(np.float64), want, rtol=1e-2 if op == "avg" else 0,
                                           err_msg=f"rank {r} op {op} n {n}")


@pytest.mark.parametrize("algo", ["ring", "rabenseifner", "recursive_doubling"])
@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_every_algorithm_pipelined_in_many_blocks(algo, p):
    opts = replace(BASE, algo=algo, segment=4096, inflight=3, small_bytes=0)
    n = 100_003  # a prime: uneven chunks and a short last block
    got = run_ok(p, lambda c: c.allreduce(contribution(c.rank, n, np.float32, "sum")), opts)
    want = expected(p, n, np.float32, "sum")
    for g in got:
        np.testing.assert_array_equal(g, want)


def test_in_place_out_of_place_and_2d():
    p = 3
    def body(c):
        x = contribution(c.rank, 600, np.float64, "sum").reshape(20, 30)
        y = np.empty_like(x)
        same = c.allreduce(x, out=x)
        other = c.allreduce(contribution(c.rank, 600, np.float64, "sum").reshape(20, 30), out=y)
        fresh = c.allreduce(np.asfortranarray(contribution(c.rank, 600, np.float64, "sum").reshape(20, 30)))
        return same is x, other is y, x, y, fresh
    want = expected(p, 600, np.float64, "sum").reshape(20, 30)
    for same, other, x, y, fresh in run_ok(p, body):
        assert same and other
        np.testing.assert_array_equal(x, want)
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(fresh, want)


@pytest.mark.parametrize("algo", ["ring", "rabenseifner"])
def test_out_of_place_in_many_blocks_leaves_the_input_as_it_was(algo):
    # the run copies the input into out block by block as each block starts (RunOptions.source)
    opts = replace(BASE, algo=algo, segment=4096, inflight=3, small_bytes=0)
    p, n = 3, 100_003

    def body(c):
        x = contribution(c.rank, n, np.float32, "sum")
        out = np.full(n, np.nan, np.float32)
        got = c.allreduce(x, out=out)
        fresh = c.allreduce(x)
        shared = np.concatenate([x, [0]]).astype(np.float32)  # an out that overlaps the input: copied first
        overlapping = c.allreduce(shared[:n], out=shared[1:])
        average = c.allreduce(x, "avg")  # (scaled block by block as each finishes)
        return got is out, out, fresh, overlapping, x, average
    want = expected(p, n, np.float32, "sum")
    for r, (same, out, fresh, overlapping, x, average) in enumerate(run_ok(p, body, opts)):
        assert same
        np.testing.assert_allclose(average, want / p, rtol=1e-6)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(fresh, want)
        np.testing.assert_array_equal(overlapping, want)
        np.testing.assert_array_equal(x, contribution(r, n, np.float32, "sum"))


def _swap_program(peer: int, count: int) -> "_native.Program":
    """One round with ``peer``: send [0, count), reduce the peer's [0, count) into it."""
    kinds = {k: int(getattr(_native.StepKind, k)) for k in ("send", "recv_reduce")}
    rows = np.zeros((2, len(_native.STEP_FIELDS)), np.int64)
    field = {f: i for i, f in enumerate(_native.STEP_FIELDS)}
    for row, kind, scratch in ((rows[0], "send", -1), (rows[1], "recv_reduce", 0)):
        row[field["kind"]], row[field["peer"]], row[field["count"]] = kinds[kind], peer, count
        row[field["scratch"]], row[field["wait_sends"]] = scratch, int(kind != "send")
    return _native.Program(rows, count, 1)


def test_a_run_from_a_source_whose_blocks_do_not_tile_takes_it_whole():
    # two blocks over the same elements (the second reduces the first's sums again) do not tile the buffer: the
    # source is copied in once, before the run (copied again as the second block started, it would undo the
    # first), and a factor applied once, after it
    n = 5
    hub = _native.LoopbackHub(2)
    comms = [Communicator.loopback(hub, r, BASE) for r in range(2)]

    def body(c):
        plan = _native.Pipeline([_swap_program(1 - c.rank, n)], np.array([[0, 0], [0, 0]], np.int64), 1)
        source = np.arange(n, dtype=np.float32) * (c.rank + 1)
        buffer = np.full(n, np.nan, np.float32)
        options = _native.RunOptions(_native.DType.float32, _native.ReduceOp.sum, 20.0, "twice")
        with pytest.raises(ValueError, match="same elements"):
            c._executor.run(plan, np.zeros(n + 1, np.float32), options, source=source)
        with pytest.raises(ValueError, match="overlaps"):
            c._executor.run(plan, buffer, options, source=buffer)
        c._executor.run(plan, buffer, options, source=source)
        halved = np.full(n, np.nan, np.float32)  # (scaled once, after the run: not as each block finished)
        c._executor.run(plan, halved, _native.RunOptions(_native.DType.float32, _native.ReduceOp.sum, 20.0, "twice",
                                                         factor=0.5), source=source)
        return buffer, source, halved
    results, errors = spawn_on(comms, body)
    assert errors == [None, None]
    for r, (buffer, source, halved) in enumerate(results):
        np.testing.assert_array_equal(buffer, np.arange(n) * 3 * 2)  # (x0 + x1), then that summed on both
        np.testing.assert_array_equal(halved, np.arange(n) * 3)
        np.testing.assert_array_equal(source, np.arange(n) * (r + 1))


def test_non_contiguous_input_is_copied_not_modified():
    def body(c):
        base = np.arange(40, dtype=np.float32).reshape(10, 4) + c.rank
        view = base[:, ::2]
        before = view.copy()
        out = c.allreduce(view)
        return out, np.array_equal(view, before)
    for out, untouched in run_ok(3, body):
        assert untouched
        np.testing.assert_array_equal(out, (np.arange(40, dtype=np.float32).reshape(10, 4)[:, ::2]) * 3 + 3)


@pytest.mark.parametrize("p", [2, 3, 5])
def test_broadcast_from_every_root(p):
    for root in range(p):
        for n in (0, 1, 9, 70_001):
            got = run_ok(p, lambda c: c.broadcast(np.arange(n, dtype=np.int64) * (c.rank + 1), root=root))
            for g in got:
                np.testing.assert_array_equal(g, np.arange(n) * (root + 1))


def test_allgather_uneven_first_dims():
    p = 4
    got = run_ok(p, lambda c: c.allgather(np.full((c.rank % 3, 2), c.rank, dtype=np.int16)))
    want = np.concatenate([np.full((r % 3, 2), r, dtype=np.int16) for r in range(p)])
    for g in got:
        np.testing.assert_array_equal(g, want)


def test_allreduce_n_fuses_mixed_dtypes():
    def body(c):
        return c.allreduce_n([np.full(3, c.rank, np.float32), np.full((2, 2), c.rank, np.int64),
                              np.full(5, 1.0, np.float32)], op="sum")
    for a, b, d in run_ok(4, body):
        np.testing.assert_array_equal(a, np.full(3, 6, np.float32))
        np.testing.assert_array_equal(b, np.full((2, 2), 6))
        np.testing.assert_array_equal(d, np.full(5, 4.0))


def test_barrier_waits_for_everyone():
    arrived = []
    def body(c):
        if c.rank == 0:
            threading.Event().wait(0.3)
        arrived.append(c.rank)
        c.barrier()
        return len(arrived)
    assert run_ok(3, body) == [3, 3, 3]


@pytest.mark.parametrize("n_small, n_large", [(3, 4), (3, 5000)])
def test_shapes_that_differ_raise_on_every_rank_naming_the_ranks(n_small, n_large):
    _, errors = spawn(4, lambda c: c.allreduce(np.ones(n_large if c.rank == 2 else n_small)))
    for e in errors:
        assert isinstance(e, MismatchError)
        assert "ranks 0-1,3: allreduce(shape=(%d,)" % n_small in str(e)
        assert "ranks 2: allreduce(shape=(%d,)" % n_large in str(e)


def test_dtype_and_op_mismatches_are_reported():
    _, errors = spawn(2, lambda c: c.allreduce(np.ones(4, np.float32 if c.rank else np.float64)))
    assert all(isinstance(e, MismatchError) and "float64" in str(e) and "float32" in str(e) for e in errors)
    _, errors = spawn(2, lambda c: c.allreduce(np.ones(4), op="max" if c.rank else "min"))
    assert all(isinstance(e, MismatchError) and "op=max" in str(e) for e in errors)


def test_bad_input_on_one_rank_fails_every_rank_and_names_it():
    def body(c):
        x = np.ones(8)
        out = np.empty_like(x)
        if c.rank == 1:
            out.flags.writeable = False
        return c.allreduce(x, out=out)
    _, errors = spawn(3, body)
    assert all(isinstance(e, MismatchError) for e in errors)
    assert all("ranks 1: out is read-only" in str(e) for e in errors)


@pytest.mark.parametrize("call, message", [
    (lambda c: c.allreduce(np.ones(3, np.uint8)), "unsupported dtype uint8"),
    (lambda c: c.allreduce(np.ones(3), op="mean"), "unknown reduction op 'mean'"),
    (lambda c: c.allreduce(np.ones(3, np.int32), op="avg"), "'avg' is not defined for int32"),
    (lambda c: c.broadcast(np.ones(3), root=7), "root 7 is not a rank"),
])
def test_the_same_bad_call_everywhere_raises_ddlerror_everywhere(call, message):
    _, errors = spawn(3, call)
    for r, e in enumerate(errors):
        assert type(e) is DDLError and f"rank {r}: " in str(e) and message in str(e)


def test_a_missing_peer_times_out_naming_it_and_the_communicator_stays_broken():
    opts = replace(BASE, timeout=0.5)
    def body(c):
        if c.rank == 2:
            return None
        try:
            c.allreduce(np.ones(4))
        except TransportError as e:
            first = str(e)
        with pytest.raises(TransportError, match="unusable after an earlier failure"):
            c.allreduce(np.ones(4))
        return first
    results, errors = spawn(3, body, opts)
    assert errors == [None, None, None]
    assert "waiting on" in results[1] and "rank 2" in results[1] and "DDL_TIMEOUT" in results[1]
    assert "rank 1" in results[0]  # rank 0 folded its data to rank 1 and waits for it


def test_size_one_returns_a_copy():
    c = Communicator.loopback(_native.LoopbackHub(1), 0, BASE)
    x = np.arange(5.0)
    y = c.allreduce(x, "avg")
    assert y is not x and np.array_equal(y, x)
    with pytest.raises(DDLError, match="rank 0: unsupported dtype"):
        c.allreduce(np.ones(2, np.complex64))


def test_different_collectives_are_reported_not_hung():
    calls = [lambda c: c.allreduce(np.ones(3)), lambda c: c.barrier(), lambda c: c.broadcast(np.ones(3)),
             lambda c: c.allgather(np.ones(3))]
    _, errors = spawn(4, lambda c: calls[c.rank](c))
    for e in errors:
        assert isinstance(e, MismatchError)
        for text in ("ranks 0: allreduce", "ranks 1: barrier()", "ranks 2: broadcast", "ranks 3: allgather"):
            assert text in str(e)


def test_settings_that_differ_across_ranks_are_named():
    hub = _native.LoopbackHub(2)
    comms = [Communicator.loopback(hub, 0, replace(BASE, algo="ring")), Communicator.loopback(hub, 1, BASE)]
    _, errors = spawn_on(comms, lambda c: c.allreduce(np.ones(5)))
    for e in errors:
        assert isinstance(e, MismatchError)
        assert "ranks 0: allreduce(shape=(5,), dtype=float64, op=sum) | algo=ring" in str(e)
        assert "ranks 1: allreduce(shape=(5,), dtype=float64, op=sum) | algo=auto" in str(e)


def test_dump_iter_and_dbg_level_report_on_rank_zero(capsys):
    run_ok(2, lambda c: [c.allreduce(np.ones(10)) for _ in range(4)], replace(BASE, dump_iter=2, dbg_level=1))
    err = capsys.readouterr().err
    assert err.count("[ddl] iter") == 2 and "iter 4: allreduce" in err
    assert "[ddl] plan ('agree', 10): recursive_doubling" in err


def test_a_closed_communicator_says_so():
    def body(c):
        c.close()
        with pytest.raises(DDLError, match="was closed"):
            c.allreduce(np.ones(3))
        return True
    assert run_ok(2, body) == [True, True]


def test_unhashable_op_is_a_ddlerror():
    _, errors = spawn(2, lambda c: c.allreduce(np.ones(3), op=["sum"]))
    assert all(type(e) is DDLError and "unknown reduction op ['sum']" in str(e) for e in errors)


@pytest.mark.parametrize("tree", [
    [[0, 1, 2], [3, 4, 5]],
    [[0, 1, 2], [3, 4], [5]],
    [[0, 2, 4], [1, 3, 5]],
    [[[0, 1], [2]], [[3, 4], [5]]],
])
def test_hierarchical_allreduce_over_loopback(tree):
    p = 6
    opts = replace(BASE, segment=8192, inflight=3, small_bytes=0, algo="ring")
    hub = _native.LoopbackHub(p)
    comms = [Communicator.loopback(hub, r, opts, hierarchy=tree) for r in range(p)]
    assert all(c.hierarchy is not None for c in comms)
    cases = ((1, np.float32), (4099, np.float64), (50_001, np.float32))
    results, errors = spawn_on(comms, lambda c: [c.allreduce(contribution(c.rank, n, dt, "sum")) for n, dt in cases])
    assert errors == [None] * p
    for r in range(p):
        for got, (n, dt) in zip(results[r], cases):
            np.testing.assert_array_equal(got, expected(p, n, dt, "sum").astype(dt))
    assert comms[0].allreduce_plan(50_001, 4).algorithm.startswith("hierarchical(")


def test_mode_dims_make_a_hierarchy_and_bad_ones_are_refused():
    hub = _native.LoopbackHub(4)
    c = Communicator.loopback(hub, 0, parse("-mode r:2x2", environ={}))
    assert c.hierarchy == [[0, 1], [2, 3]]
    with pytest.raises(DDLError, match="bad hierarchy"):
        Communicator.loopback(hub, 0, BASE, hierarchy=[[0, 1], [1, 2, 3]])
    with pytest.raises(DDLError, match="holds 3 ranks, the communicator 4"):
        Communicator.loopback(hub, 0, BASE, hierarchy=[[0, 1], [2]])


def test_ranks_with_different_hierarchies_get_a_mismatch():
    hub = _native.LoopbackHub(4)
    trees = [[[0, 1], [2, 3]]] * 2 + [[[0, 2], [1, 3]]] * 2
    comms = [Communicator.loopback(hub, r, BASE, hierarchy=trees[r]) for r in range(4)]
    _, errors = spawn_on(comms, lambda c: c.allreduce(np.ones(100_000)))
    assert all(isinstance(e, MismatchError) and "ranks 0-1:" in str(e) and "ranks 2-3:" in str(e)
               and "tree=" in str(e) for e in errors)
