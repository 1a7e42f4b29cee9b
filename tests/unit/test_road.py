"""One road for every collective (ddl.core.road): a call is described once, then the first path of the
communicator's table that takes it runs it. Which path takes which call is data (``route``, ``ddl.explain``);
DDL_PATH forces one, with the same answers (numpy's); a path added to the table is one entry; a refused call
raises on every rank, whichever path its peers' valid calls take."""
from dataclasses import replace

import numpy as np
import pytest

from ddl import DDLError, _native
from ddl.core.communicator import Communicator
from ddl.core.paths import Planned
from ddl.core.road import COLLECTIVES, Road, said
from ddl.options import parse
from test_loopback import BASE, spawn

ORDER = ["device", "alone", "host memory", "riding", "planned"]


def taken(route) -> str:
    return next(name for name, why in route if why)


def test_the_table_lists_every_path_of_each_collective_in_order():
    comm = Communicator.loopback(_native.LoopbackHub(1), 0, BASE)
    for collective in COLLECTIVES:
        names = [p.name for p in comm.road.table[collective]]
        assert names == [n for n in ORDER if n in names] and names[-1] == "planned"
    assert [p.name for p in comm.road.table["allreduce"]] == ORDER
    assert [p.name for p in comm.road.table["alltoall"]] == ["planned"]  # (one rank's alltoall checks its rows)


@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "allgather", "reduce_scatter", "barrier"])
def test_one_rank_takes_the_alone_path(collective):
    comm = Communicator.loopback(_native.LoopbackHub(1), 0, BASE)
    assert taken(comm.route(collective, 64 << 20)) == "alone"


def test_small_calls_ride_and_large_ones_follow_the_plan():
    hub = _native.LoopbackHub(4)
    comm = Communicator.loopback(hub, 0, BASE)  # (the route is asked of one rank: nothing runs)
    small, large = 64, 16 << 20
    for collective in ("allreduce", "broadcast", "allgather", "reduce_scatter"):
        assert taken(comm.route(collective, small)) == "riding", collective
        assert taken(comm.route(collective, large)) == "planned", collective
    assert taken(comm.route("barrier", 0)) == "riding"
    assert taken(comm.route("alltoall", small)) == "planned"
    # a known allgather's round carries every rank's rows, each once: 4 ranks of 16 KiB fill its 64 KiB
    assert taken(comm.route("allgather", (16 << 10) + 4)) == "planned"
    assert taken(comm.route("allgather", 16 << 10)) == "riding"


def test_explain_names_the_path_and_why():
    hub = _native.LoopbackHub(2)
    comm = Communicator.loopback(hub, 0, BASE)
    said_ = comm.explain(8)
    assert said_.path.startswith("allreduce of 8 B takes the riding path: ") and "(not device, alone" in said_.path
    assert f"path: {said_.path}" in said_.text() and said_.to_dict()["path"] == said_.path
    assert "takes the planned path: ddl's plan per level" in comm.explain(64 << 20, "reduce_scatter").path
    with pytest.raises(DDLError, match="no collective 'gather'"):
        comm.explain(8, "gather")


def test_said_puts_the_taken_path_first_and_names_those_passed_over():
    assert said([("a", None), ("b", "because"), ("c", "also")]) == "the b path: because (not a)"
    assert said([("a", "first")]) == "the a path: first"


def _every_collective(comm, n: int):
    """Each collective of n float64 per rank (reduce_scatter: of 3n), with numpy's answers beside them."""
    p, r = comm.size, comm.rank
    mine = np.arange(n, dtype=np.float64) * (r + 1)
    whole = np.arange(3 * n, dtype=np.float64) + r
    got = {"allreduce": comm.allreduce(mine), "broadcast": comm.broadcast(mine, 1),
           "allgather": comm.allgather(mine.reshape(1, -1)), "reduce_scatter": comm.reduce_scatter(whole, "max"),
           "alltoall": comm.alltoall(np.repeat(np.arange(p, dtype=np.float64), 2) + 10 * r)}
    comm.barrier()
    want = {"allreduce": np.arange(n) * p * (p + 1) / 2, "broadcast": np.arange(n) * 2.0,
            "allgather": np.stack([np.arange(n) * (q + 1.0) for q in range(p)]),
            "reduce_scatter": np.array_split(np.arange(3 * n) + p - 1.0, p)[r],
            "alltoall": np.repeat(r + 10.0 * np.arange(p), 2)}
    return got, want


@pytest.mark.parametrize("forced", [None, "riding", "planned"])
@pytest.mark.parametrize("n", [3, 40_000])
def test_a_forced_path_gives_the_same_answers(forced, n):
    options = replace(BASE, path=forced)
    results, errors = spawn(3, lambda c: (_every_collective(c, n), taken(c.route("allreduce", n * 8))), options)
    assert errors == [None] * 3, errors
    for (got, want), path in results:
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        # riding takes only what fits its round: a forced path is first for what it can take
        assert path == ("riding" if n == 3 and forced != "planned" else "planned")


def test_a_forced_path_must_be_one_of_the_table():
    with pytest.raises(DDLError, match="DDL_PATH= 'ring': expected one of device, alone"):
        parse("", environ={"DDL_PATH": "ring"})
    assert parse("-path host_memory", environ={}).path == "host memory"
    road = Road([Planned(None)], "planned")
    with pytest.raises(DDLError, match="'riding' is not a path here; the paths are planned"):
        Road(road.paths, "riding")


def test_ranks_that_force_different_paths_raise_a_mismatch():
    hub = _native.LoopbackHub(2)
    comms = [Communicator.loopback(hub, r, replace(BASE, path="planned" if r else None)) for r in range(2)]
    from test_loopback import spawn_on

    _, errors = spawn_on(comms, lambda c: c.allreduce(np.ones(1000)))
    assert all(e is not None and "called ddl differently" in str(e) for e in errors), errors


def test_a_refused_call_raises_on_every_rank_whatever_path_the_others_take():
    def body(c):
        out = np.empty(5)
        out.flags.writeable = c.rank != 0  # rank 0's out is read-only
        return c.broadcast(np.ones(5), 0, out=out)

    _, errors = spawn(3, body)  # (before, root wrote its data into the read-only out first and raised alone)
    assert all(isinstance(e, DDLError) and "ranks 0: out is read-only" in str(e) for e in errors), errors


class _Echo:
    """A path of one module and one table entry: it takes allreduces of exactly 7 elements, and answers them
    with the input times the number of ranks (as a sum of equal inputs would be)."""
    name = "echo"
    serves = frozenset(("allreduce",))

    def __init__(self, comm):
        self.comm = comm

    def takes(self, call):
        return "seven elements" if call.array is not None and call.array.size == 7 and not call.problem else None

    def run(self, call):
        return call.array * self.comm.size


def test_a_new_path_is_one_entry_in_the_table():
    hub = _native.LoopbackHub(1)
    comm = Communicator.loopback(hub, 0, BASE)
    comm.road = Road([_Echo(comm)] + comm.road.paths, None, True, None, comm.drain)
    assert taken(comm.route("allreduce", 28)) == "echo" and taken(comm.route("allreduce", 32)) == "alone"
    np.testing.assert_array_equal(comm.allreduce(np.arange(7.0)), np.arange(7.0))
    assert comm.broadcast(np.arange(7.0)).tolist() == list(np.arange(7.0))  # (it serves allreduce only)


@pytest.mark.parametrize("p", [1, 3])
def test_a_known_call_is_described_once_and_then_takes_its_short_form(p):
    """Off the host level (loopback ranks) every small collective's second call takes its path's short form: the
    call is not described again (each rank counts its descriptions), and the answers stay numpy's."""
    def body(c):
        described = []
        for name in ("allreduce", "broadcast", "allgather", "reduce_scatter"):
            real = getattr(c._calls, name)
            setattr(c._calls, name, lambda *args, real=real, name=name: described.append(name) or real(*args))
        got = []
        for _ in range(3):
            x = np.arange(6.0) + c.rank
            out = np.empty(6)
            got.append((c.allreduce(x, out=out).copy(), c.broadcast(x, 0).copy(), c.allgather(x),
                        c.reduce_scatter(x), c.allreduce(x, "max")))
        return described, got

    results, errors = spawn(p, body)
    assert errors == [None] * p, errors
    for r, (described, got) in enumerate(results):
        # one per signature (allreduce twice: sum and max), whatever the number of calls
        assert sorted(described) == ["allgather", "allreduce", "allreduce", "broadcast", "reduce_scatter"], described
        for total, root, gathered, part, biggest in got:
            np.testing.assert_array_equal(total, np.arange(6.0) * p + p * (p - 1) / 2)
            np.testing.assert_array_equal(root, np.arange(6.0))
            np.testing.assert_array_equal(gathered, np.concatenate([np.arange(6.0) + q for q in range(p)]))
            np.testing.assert_array_equal(part, np.array_split(np.arange(6.0) * p + p * (p - 1) / 2, p)[r])
            np.testing.assert_array_equal(biggest, np.arange(6.0) + p - 1)
