"""Small collectives off the host memory level: the agreement round crosses hosts once per host (checked by the
symbolic checker, and run over the loopback transport with hosts), and the calls that ride in it, once known,
take their short path (ddl.core.rides) with numpy's answers, into out and in place, uneven rows included; a rank
that calls differently after them still makes every rank raise MismatchError."""
import numpy as np
import pytest

from ddl import MismatchError, _native
from ddl.core.agreement import host_groups
from ddl.core.communicator import Communicator
from ddl.schedule import Collective, Schedule
from ddl.schedule.algorithms import leader_allgather, leader_allreduce, leader_reduce_scatter, scatter_layout
from ddl.schedule.check import ScheduleError, check
from ddl.schedule.ir import Op
from test_loopback import BASE, spawn_on

HOSTS = [
    [[0, 1], [2, 3], [4, 5], [6, 7]],      # T1's shape
    [[0, 2, 4], [1, 3], [5]],              # uneven, interleaved
    [[0, 1, 2, 3, 4, 5, 6]],               # one host
    [[0], [1], [2]],                       # one rank per host
    [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]],
]


@pytest.mark.parametrize("hosts", HOSTS, ids=str)
@pytest.mark.parametrize("count", [0, 1, 5])
def test_the_leader_agreement_is_an_allreduce_that_crosses_hosts_once_per_host(hosts, count):
    p = sum(map(len, hosts))
    programs = tuple(leader_allreduce(r, hosts, count, keep_empty=True) for r in range(p))
    if count:
        check(Schedule(Collective.ALLREDUCE, "leader", p, count, programs))
    host_of = {r: k for k, h in enumerate(hosts) for r in h}
    for r, prog in enumerate(programs):
        across = [s for s in prog.steps if host_of[s.peer] != host_of[r]]
        if r != hosts[host_of[r]][0]:
            assert not across  # only each host's first rank talks to other hosts
        for rnd in {s.round for s in across}:  # at most one message each way per round
            assert sum(s.op is Op.SEND for s in across if s.round == rnd) <= 1
            assert sum(s.op is not Op.SEND for s in across if s.round == rnd) <= 1
    assert len({prog.rounds for prog in programs}) == 1


def messages(program) -> list[tuple]:
    return sorted((s.round, s.peer, s.op is Op.SEND, s.tag) for s in program.steps)


@pytest.mark.parametrize("hosts", HOSTS + [[[r] for r in range(7)], [[1, 0], [3, 2, 5], [4]]], ids=str)
@pytest.mark.parametrize("part", [0, 1, 3])
def test_an_allgathers_round_sends_each_part_once_in_the_agreement_rounds_messages(hosts, part):
    """Every rank ends with every part, in host order; the messages are the agreement round's, peer for peer
    and tag for tag (a rank that made another call still pairs with it), and no part crosses between hosts
    twice into one host."""
    p = sum(map(len, hosts))
    order = [r for h in hosts for r in h]
    programs = tuple(leader_allgather(r, hosts, part) for r in range(p))
    if part:
        layout = tuple((order.index(r) * part, part) for r in range(p))
        check(Schedule(Collective.ALLGATHER, "leader", p, p * part, programs, 0, layout))
    host_of = {r: k for k, h in enumerate(hosts) for r in h}
    for r, prog in enumerate(programs):
        same = leader_allreduce(r, hosts, 5, keep_empty=True)
        assert messages(prog) == messages(same) and prog.rounds == same.rounds
        received = [s for s in prog.steps if s.op is Op.RECV_COPY and host_of[s.peer] != host_of[r]]
        # a power of two of hosts: what crosses into a host is the other hosts' parts, once each
        if part and len(hosts) & (len(hosts) - 1) == 0:
            assert sum(s.count for s in received) == (p - len(hosts[host_of[r]])) * part * (r == hosts[host_of[r]][0])


@pytest.mark.parametrize("hosts", HOSTS + [[[r] for r in range(7)], [[r] for r in range(8)], [[1, 0], [3, 2, 5], [4]],
                                   [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]], ids=str)
@pytest.mark.parametrize("parts", ["ones", "threes", "uneven"])
def test_a_reduce_scatters_round_halves_the_vector_between_hosts_in_the_agreement_rounds_messages(hosts, parts):
    """Every rank ends with its own part reduced over every rank; the messages are the agreement round's, peer
    for peer and tag for tag; a power of two of hosts sends each first rank's partner half, then a quarter, ...
    of the vector (what crosses out of a host: the vector less the host's own parts, once)."""
    p = sum(map(len, hosts))
    counts = {"ones": [1] * p, "threes": [3] * p, "uneven": [(r * 5) % 4 for r in range(p)]}[parts]
    programs = tuple(leader_reduce_scatter(r, hosts, counts) for r in range(p))
    layout = scatter_layout(hosts, counts)
    spans = sorted((at, at + n) for at, n in layout)  # the parts tile the buffer
    assert spans[0][0] == 0 and spans[-1][1] == sum(counts) and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    nonempty = tuple(prog.__class__(prog.rank, tuple(s for s in prog.steps if s.count), prog.rounds)
                     for prog in programs)
    check(Schedule(Collective.REDUCE_SCATTER, "leader", p, sum(counts), nonempty, 0, tuple(layout)))
    host_of = {r: k for k, h in enumerate(hosts) for r in h}
    for r, prog in enumerate(programs):
        same = leader_allreduce(r, hosts, 5, keep_empty=True)
        assert messages(prog) == messages(same) and prog.rounds == same.rounds
        out = [s for s in prog.steps if s.op is Op.SEND and host_of[s.peer] != host_of[r]]
        if len(hosts) & (len(hosts) - 1) == 0 and r == hosts[host_of[r]][0]:
            assert sum(s.count for s in out) == sum(counts) - sum(counts[q] for q in hosts[host_of[r]])


def test_the_checker_refuses_a_leader_agreement_that_skips_a_rank():
    hosts = [[0, 1], [2, 3]]
    programs = [leader_allreduce(r, hosts, 4) for r in range(4)]
    programs[1] = programs[1].__class__(1, tuple(s for s in programs[1].steps if s.op is not Op.SEND),
                                        programs[1].rounds)
    programs[0] = programs[0].__class__(0, tuple(s for s in programs[0].steps if s.op is not Op.RECV_REDUCE
                                                 or s.peer != 1), programs[0].rounds)
    with pytest.raises(ScheduleError):
        check(Schedule(Collective.ALLREDUCE, "leader", 4, 4, tuple(programs)))


def test_host_groups_shape_the_round_only_where_hosts_hold_several_ranks():
    assert host_groups(["a", "a", "b", "b"]) == [[0, 1], [2, 3]]
    assert host_groups(["a", "b", "a", "b", "c"]) == [[0, 2], [1, 3], [4]]
    assert host_groups(["a", "b", "c"]) is None  # one rank per host: rank order is the same round
    assert host_groups(["a", "a", "a"]) is None  # one host: the host memory level, or rank order


def on_hosts(hosts: list[str], options=BASE) -> list[Communicator]:
    hub = _native.LoopbackHub(len(hosts))
    reports = [{"host": h, "gpus": [], "numa": None} for h in hosts]
    return [Communicator(_native.Executor.loopback(hub, r), r, len(hosts), options, reports=reports)
            for r in range(len(hosts))]


HOSTS_OF_SIX = ["a", "a", "a", "b", "b", "c"]
INTERLEAVED = ["a", "b", "a", "b", "c", "a"]  # the round's order of ranks is not rank order


def values(rank: int, shape, dtype) -> np.ndarray:
    return ((np.arange(int(np.prod(shape))) * 7 + rank * 3) % 11 - 5).astype(dtype).reshape(shape)


@pytest.mark.parametrize("hosts", [HOSTS_OF_SIX, INTERLEAVED], ids=["packed", "interleaved"])
def test_known_small_calls_give_numpys_answers_on_their_short_path(hosts):
    comms = on_hosts(hosts)
    p = len(comms)
    assert comms[0].agreement.plan(0).algorithm == "leader"

    def body(c):
        got = []
        for k in range(3):  # the first call makes each Ride; the others take the short path
            b = values(c.rank, (5,), np.float64)
            got.append(("bcast", k, c.broadcast(b, 4)))
            c.broadcast(b, 2, out=b)  # in place
            got.append(("bcast in place", k, b))
            out = np.full((p * 2, 3), -1, np.int32)
            got.append(("allgather out", k, c.allgather(values(c.rank, (2, 3), np.int32), out=out) is out, out))
            mine = out[c.rank * 2:(c.rank + 1) * 2]
            got.append(("allgather in place", k, c.allgather(mine, out=out) is out, out.copy()))
            got.append(("reduce_scatter", k, c.reduce_scatter(values(c.rank, (13,), np.float32), "avg")))
            part = np.full((1, 2), -1, np.int64)
            got.append(("reduce_scatter out", k, c.reduce_scatter(values(c.rank, (6, 2), np.int64), "max",
                                                                  out=part) is part, part))
        rounds = {k.collective: k.kept["ride"].plan.algorithm for path, k in c.road.quick.values()
                  if k.collective in ("allgather", "reduce_scatter")}
        return got, sum(path.name == "riding" for path, _ in c.road.quick.values()), rounds

    results, errors = spawn_on(comms, body)
    assert errors == [None] * p, errors
    gathered = np.concatenate([values(r, (2, 3), np.int32) for r in range(p)])
    whole = np.stack([values(r, (13,), np.float64) for r in range(p)]).mean(0)
    biggest = np.stack([values(r, (6, 2), np.int64) for r in range(p)]).max(0)
    for r, (got, known, rounds) in enumerate(results):
        # each part sent once, not summed through every round; the vector halved between hosts, not whole
        assert rounds == {"allgather": "leader allgather", "reduce_scatter": "leader reduce-scatter"}
        assert known == 5  # one Ride per signature: two broadcast roots, one allgather, two reduce_scatters
        for name, k, *rest in got:
            if name == "bcast":
                np.testing.assert_array_equal(rest[0], values(4, (5,), np.float64))
            elif name == "bcast in place":
                np.testing.assert_array_equal(rest[0], values(2, (5,), np.float64))
            elif name.startswith("allgather"):
                assert rest[0] is True, (name, k)
                np.testing.assert_array_equal(rest[1], gathered)
            elif name == "reduce_scatter":
                np.testing.assert_allclose(rest[0], np.array_split(whole, p)[r].astype(np.float32), rtol=1e-6)
            else:
                assert rest[0] is True
                np.testing.assert_array_equal(rest[1], biggest[r:r + 1])


@pytest.mark.parametrize("hosts", [HOSTS_OF_SIX, INTERLEAVED], ids=["packed", "interleaved"])
def test_a_known_allgather_whose_rows_turn_uneven_gathers_them(hosts):
    comms = on_hosts(hosts)

    def body(c):
        first = c.allgather(np.full((2, 1), c.rank, np.int16))  # even: the Ride is made
        rows = 2 if c.rank != 3 else 4  # rank 3 calls another shape: ranks with 2 rows find theirs uneven
        second = c.allgather(np.full((rows, 1), c.rank, np.int16))
        third = c.allgather(np.full((2, 1), c.rank, np.int16))  # even again, on the same Ride
        return first, second, third

    results, errors = spawn_on(comms, body)
    assert errors == [None] * 6, errors
    even = np.concatenate([np.full((2, 1), r, np.int16) for r in range(6)])
    uneven = np.concatenate([np.full((4 if r == 3 else 2, 1), r, np.int16) for r in range(6)])
    for first, second, third in results:
        np.testing.assert_array_equal(first, even)
        np.testing.assert_array_equal(second, uneven)
        np.testing.assert_array_equal(third, even)


@pytest.mark.parametrize("odd", ["broadcast", "allgather", "barrier", "reduce_scatter"])
def test_a_rank_that_calls_differently_after_known_calls_raises_a_mismatch_everywhere(odd):
    comms = on_hosts(HOSTS_OF_SIX)
    calls = {"broadcast": lambda c: c.broadcast(np.ones(3), 0),
             "allgather": lambda c: c.allgather(np.ones(3)),
             "barrier": lambda c: c.barrier(),
             "reduce_scatter": lambda c: c.reduce_scatter(np.ones(12))}
    usual = "allgather" if odd != "allgather" else "broadcast"

    def body(c):
        for _ in range(2):
            calls[usual](c)  # known: the second call took the short path
        calls[odd if c.rank == 4 else usual](c)

    _, errors = spawn_on(comms, body)
    assert all(isinstance(e, MismatchError) for e in errors), errors
    assert all(usual in str(e) and odd in str(e) for e in errors), errors[0]


def test_explain_says_how_the_agreement_round_runs():
    shaped = on_hosts(HOSTS_OF_SIX)[0].explain(1 << 20)
    assert "each host's ranks to its first rank" in shaped.agreement and "3 first ranks" in shaped.agreement
    assert "agreement round: each host's" in shaped.text()
    hub = _native.LoopbackHub(3)
    flat = Communicator.loopback(hub, 0, BASE).explain(8)
    assert flat.agreement.startswith("recursive doubling over the 3 ranks") and "ride in it" in flat.agreement
    assert shaped.to_dict()["agreement"] == shaped.agreement
