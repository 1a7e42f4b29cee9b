"""The checker must reject broken schedules, naming what is wrong (else a passing check proves nothing)."""
import dataclasses

import pytest

from ddl.schedule.algorithms import schedule
from ddl.schedule.check import ScheduleError, check
from ddl.schedule import Collective, Op, Program, Step


def mutate(s, rank, fn):
    programs = list(s.programs)
    prog = programs[rank]
    programs[rank] = Program(prog.rank, tuple(fn(list(prog.steps))), prog.rounds)
    return dataclasses.replace(s, programs=tuple(programs))


@pytest.fixture
def ring():
    return schedule(Collective.ALLREDUCE, "ring", 4, 8)


def test_a_correct_schedule_passes(ring):
    check(ring)


def test_missing_receive_is_reported(ring):
    bad = mutate(ring, 1, lambda steps: [s for s in steps if not (s.op is Op.RECV_REDUCE and s.round == 0)])
    with pytest.raises(ScheduleError, match="no partner|sends 1 messages"):
        check(bad)


def test_reducing_the_same_contribution_twice_is_reported():
    s = schedule(Collective.ALLREDUCE, "recursive_doubling", 4, 4)
    # rank 0 turns its last copy-free exchange into a second reduce of data it already holds
    def dup(steps):
        last = [s for s in steps if s.op is Op.RECV_REDUCE][-1]
        return steps + [dataclasses.replace(last, round=last.round)]
    with pytest.raises(ScheduleError):
        check(mutate(s, 0, dup))


def test_wrong_range_is_reported(ring):
    def shift(steps):
        return [dataclasses.replace(s, offset=s.offset + 1, count=s.count - 1)
                if s.op is Op.RECV_COPY and s.round == 3 else s for s in steps]
    with pytest.raises(ScheduleError, match="sends|receives"):
        check(mutate(ring, 2, shift))


def test_incomplete_result_is_reported():
    s = schedule(Collective.ALLREDUCE, "ring", 3, 6)
    # drop the whole allgather of every rank: each ends with one reduced chunk only
    programs = tuple(Program(p.rank, tuple(x for x in p.steps if x.round < 2), p.rounds) for p in s.programs)
    with pytest.raises(ScheduleError, match="expected"):
        check(dataclasses.replace(s, programs=programs))


def test_a_copy_overlapping_another_receive_in_its_round_is_reported():
    steps0 = (Step(0, Op.RECV_REDUCE, 1, 0, 4), Step(0, Op.RECV_COPY, 2, 2, 2, tag=0))
    progs = (Program(0, steps0, 1), Program(1, (Step(0, Op.SEND, 0, 0, 4),), 1),
             Program(2, (Step(0, Op.SEND, 0, 2, 2),), 1))
    s = dataclasses.replace(schedule(Collective.ALLREDUCE, "ring", 3, 4), programs=progs)
    with pytest.raises(ScheduleError, match="overlapping"):
        check(s)


def test_bad_peer_is_reported(ring):
    with pytest.raises(ScheduleError, match="bad peer"):
        check(mutate(ring, 0, lambda steps: [dataclasses.replace(steps[0], peer=9)] + steps[1:]))


def test_broadcast_must_deliver_the_roots_data():
    s = schedule(Collective.BROADCAST, "binomial", 5, 3, root=2)
    check(s)
    with pytest.raises(ScheduleError):
        check(dataclasses.replace(s, root=0))


def test_reductions_into_one_range_may_share_a_round():
    # ranks 1 and 2 both send everything to rank 0 in round 0 (a direct reduce), then rank 0 sends it back
    progs = (Program(0, (Step(0, Op.RECV_REDUCE, 1, 0, 4), Step(0, Op.RECV_REDUCE, 2, 0, 4),
                         Step(1, Op.SEND, 1, 0, 4), Step(1, Op.SEND, 2, 0, 4)), 2),
             Program(1, (Step(0, Op.SEND, 0, 0, 4), Step(1, Op.RECV_COPY, 0, 0, 4)), 2),
             Program(2, (Step(0, Op.SEND, 0, 0, 4), Step(1, Op.RECV_COPY, 0, 0, 4)), 2))
    check(dataclasses.replace(schedule(Collective.ALLREDUCE, "ring", 3, 4), programs=progs))
