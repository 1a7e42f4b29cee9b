"""Flat schedule generators: every output passes the symbolic checker, for 1-33 ranks and awkward sizes."""
import pytest
from hypothesis import given, settings, strategies as st

from ddl.schedule.algorithms import ALLREDUCE, schedule, split
from ddl.schedule.check import check
from ddl.schedule import Collective, Op, Schedule

COUNTS = (0, 1, 2, 7, 31, 1000, 65537)


def counts_for(p):
    return sorted(set(COUNTS) | {p - 1, p, p + 1, 3 * p + 1})


@pytest.mark.parametrize("algorithm", sorted(ALLREDUCE))
@pytest.mark.parametrize("p", range(1, 34))
def test_allreduce_schedules_pass_the_checker(algorithm, p):
    for n in counts_for(p):
        check(schedule(Collective.ALLREDUCE, algorithm, p, n))


@pytest.mark.parametrize("p", range(1, 34))
def test_broadcast_from_every_root_passes_the_checker(p):
    for root in range(p):
        for n in (1, 5, 1000):
            check(schedule(Collective.BROADCAST, "binomial", p, n, root=root))


@pytest.mark.parametrize("p", range(1, 34))
def test_allgather_with_uneven_and_empty_pieces_passes_the_checker(p):
    rows = [(r * 7) % 4 for r in range(p)]  # some ranks contribute nothing
    offsets = [sum(rows[:r]) for r in range(p)]
    layout = tuple(zip(offsets, rows))
    check(schedule(Collective.ALLGATHER, "ring", p, sum(rows), layout=layout))


@settings(max_examples=150, deadline=None)
@given(p=st.integers(1, 64), n=st.integers(0, 5000), algorithm=st.sampled_from(sorted(ALLREDUCE)))
def test_random_sizes(p, n, algorithm):
    check(schedule(Collective.ALLREDUCE, algorithm, p, n))


def bytes_sent(program):
    return sum(s.count for s in program.steps if s.op is Op.SEND)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 12])
def test_ring_sends_the_bandwidth_optimal_volume(p):
    n = 12 * p * 10  # divisible by p: every chunk equal
    s = schedule(Collective.ALLREDUCE, "ring", p, n)
    for prog in s.programs:
        assert bytes_sent(prog) == 2 * (p - 1) * n // p
        assert prog.rounds == 2 * (p - 1)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_rabenseifner_power_of_two_volume_and_rounds(p):
    n = 64 * p
    s = schedule(Collective.ALLREDUCE, "rabenseifner", p, n)
    lg = p.bit_length() - 1
    for prog in s.programs:
        assert bytes_sent(prog) == 2 * (p - 1) * n // p
        assert prog.rounds == 2 * lg


@pytest.mark.parametrize("p", [3, 5, 6, 7, 12])
def test_non_power_of_two_folds_extra_ranks(p):
    pof2 = 1 << (p.bit_length() - 1)
    s = schedule(Collective.ALLREDUCE, "recursive_doubling", p, 10)
    last = s.programs[0].rounds - 1
    # a folded rank hands its data up in round 0 and gets the result back in the last round, nothing between
    folded = [r for r in range(p) if {x.round for x in s.programs[r].steps} == {0, last}]
    assert folded == [2 * i for i in range(p - pof2)]


def test_split_is_even_and_covers_everything():
    for n in range(0, 50):
        for parts in range(1, 12):
            pieces = split(n, parts)
            assert sum(c for _, c in pieces) == n
            assert max(c for _, c in pieces) - min(c for _, c in pieces) <= 1
            assert all(pieces[i][0] + pieces[i][1] == pieces[i + 1][0] for i in range(parts - 1))


@pytest.mark.parametrize("algorithm", sorted(ALLREDUCE))
def test_json_round_trip(algorithm):
    s = schedule(Collective.ALLREDUCE, algorithm, 6, 101)
    again = Schedule.from_json(s.to_json())
    assert again == s
    check(again)
