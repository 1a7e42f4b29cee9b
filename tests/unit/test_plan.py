"""Compiling programs for the executor: blocks, scratch and staging decided in Python."""
import numpy as np

from ddl.schedule.algorithms import recursive_doubling_allreduce, ring_allreduce
from ddl.schedule.compile import compile_blocks, native_program, program_rows

KIND, SCRATCH, WAIT = 0, 6, 7


def test_blocks_cover_the_buffer_with_at_most_two_programs():
    plan = compile_blocks(lambda n: ring_allreduce(1, 4, n), 10_001, 1000, 2, "ring")
    assert (plan.nblocks, plan.block_elems, plan.inflight) == (11, 1000, 2)
    assert plan.native.nblocks == 11
    assert plan.native.extent == 10_001  # the last block ends exactly at the end of the buffer


def test_empty_and_single_block_plans():
    assert compile_blocks(lambda n: ring_allreduce(0, 3, n), 0, 100, 2, "ring").native.extent == 0
    one = compile_blocks(lambda n: ring_allreduce(0, 3, n), 50, 100, 2, "ring")
    assert (one.nblocks, one.native.extent) == (1, 50)


def test_receives_that_overlap_a_send_of_their_round_are_staged_and_wait():
    # recursive doubling sends and reduces the same range in one round: the receive must wait for the send
    prog = recursive_doubling_allreduce(0, 4, 64)
    rows, scratch = program_rows(prog)
    receives = rows[rows[:, KIND] != 0]
    assert (receives[:, WAIT] == 1).all() and (receives[:, SCRATCH] >= 0).all()
    assert sorted(receives[:, SCRATCH]) == [0, 64] and scratch == 128  # one scratch range per receive
    native = native_program(prog)
    assert native.nsteps == len(prog.steps) == 4 and native.nrounds == 2


def test_ring_receives_never_wait_and_copies_land_in_place():
    rows, scratch = program_rows(ring_allreduce(0, 4, 64))
    assert (rows[:, WAIT] == 0).all()
    copies = rows[rows[:, KIND] == 2]
    assert len(copies) == 3 and (copies[:, SCRATCH] == -1).all()
    assert scratch == 3 * 16  # three reduce-scatter receives of a quarter each
    assert native_program(ring_allreduce(0, 4, 64)).nrounds == 6


def test_native_program_rejects_rows_it_cannot_run():
    import pytest

    from ddl import _native

    rows = np.array([[1, 1, 0, 0, 0, 4, -1, 0]], dtype=np.int64)  # a reduce with no scratch
    with pytest.raises(ValueError, match="scratch"):
        _native.Program(rows, 0, 1)
    rows = np.array([[0, 1, 1, 0, 0, 4, -1, 0], [0, 1, 0, 0, 0, 4, -1, 0]], dtype=np.int64)
    with pytest.raises(ValueError, match="sorted by round"):
        _native.Program(rows, 0, 2)
