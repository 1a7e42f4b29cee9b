"""Reduce-scatter, allgather and broadcast planned per level (ddl.planner.per_level): every plan passes the
symbolic checker (fixed trees x every algorithm per level x even and uneven parts, the machines of topology/);
slow links carry only reduced shares; and the collectives give numpy's answers over the loopback transport
with hierarchies (threads as ranks; pipelined blocks, padding, uneven rows)."""
import itertools
import random
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from ddl import DDLError, MismatchError, _native, planner, topology
from ddl.core.communicator import Communicator
from ddl.planner.per_level import broadcast_program, chain_program, grid_of, scatter_algorithms, scatter_program
from ddl.schedule import Collective, Op, Schedule
from ddl.schedule.check import ScheduleError, check
from ddl.topology.tree import leaves, normalize
from test_loopback import BASE, spawn_on

TREES = [
    [[0, 1, 2], [3, 4, 5]],                          # two even nodes
    [[0, 1, 2], [3, 4], [5]],                        # uneven nodes: one flat level in tree order
    [[0, 2, 4], [1, 3, 5]],                          # round-robin placement
    [[[0, 1], [2, 3]], [[4, 5], [6]]],               # uneven racks
    [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],            # even racks: three levels
    [[0, 4], [1, 5], [2, 6], [3, 7]],                # four nodes of two
    [[0, 1, 2, 3], [4, 5, 6, 7]],                    # powers of two (halving runs)
    list(range(5)),                                  # flat
]
ALGORITHMS = ("ring", "rabenseifner", "direct")


def layout_of(grid, parts):
    """(bounds in position order, layout per rank) of parts given in rank order."""
    bounds = [0]
    for r in grid.order:
        bounds.append(bounds[-1] + parts[r])
    where = {r: k for k, r in enumerate(grid.order)}
    return bounds, tuple((bounds[where[r]], parts[r]) for r in range(grid.nranks))


def scatter_schedule(grid, algorithms, parts, half):
    bounds, layout = layout_of(grid, parts)
    coll = Collective.REDUCE_SCATTER if half == "reduce_scatter" else Collective.ALLGATHER
    programs = tuple(scatter_program(r, grid, algorithms, bounds, half) for r in range(grid.nranks))
    return Schedule(coll, "per level", grid.nranks, bounds[-1], programs, 0, layout)


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("half", ["reduce_scatter", "allgather"])
def test_every_algorithm_per_level_passes_the_checker(tree, half):
    grid = grid_of(normalize(tree))
    rng = random.Random(len(tree))
    p = grid.nranks
    for algorithms in itertools.product(ALGORITHMS, repeat=len(grid.sizes)):
        for parts in ([3] * p, [rng.randint(0, 4) for _ in range(p)], [0] * p, [1] + [0] * (p - 1)):
            check(scatter_schedule(grid, algorithms, parts, half))


@pytest.mark.parametrize("tree", TREES)
def test_broadcasts_from_every_root_pass_the_checker(tree):
    grid = grid_of(normalize(tree))
    p = grid.nranks
    for root in range(p):
        for n in (0, 1, 7):
            check(Schedule(Collective.BROADCAST, "binomial per level", p, n,
                           tuple(broadcast_program(r, grid, n, root) for r in range(p)), root))


@pytest.mark.parametrize("name", [m for m in topology.library() if m not in ("summit", "dgx-h100-superpod")])
def test_the_machines_plans_pass_the_checker(name):
    t = topology.load(name)
    p = t.capacity()
    tree, levels = t.hierarchy(t.place(None, p))
    grid = grid_of(tree)
    for nbytes in (8, 1 << 20):
        plan = planner.choose(tree, levels, nbytes)
        algorithms = scatter_algorithms(grid, plan.algorithms, plan.shape == "latency")
        for half in ("reduce_scatter", "allgather"):
            check(scatter_schedule(grid, algorithms, [5] * p, half))
    check(Schedule(Collective.BROADCAST, "b", p, 3, tuple(broadcast_program(r, grid, 3, p - 1) for r in range(p)),
                   p - 1))


def test_the_checker_refuses_a_reduce_scatter_that_misses_a_contribution():
    grid = grid_of(normalize([[0, 1], [2, 3]]))
    good = scatter_schedule(grid, ("ring", "ring"), [2] * 4, "reduce_scatter")
    programs = list(good.programs)
    programs[3] = replace(programs[3], steps=())  # rank 3 sends and receives nothing
    with pytest.raises(ScheduleError):
        check(replace(good, programs=tuple(programs)))


def test_only_reduced_shares_cross_nodes():
    """Two nodes of four: each rank sends (g-1)/g of the buffer inside its node and 1/g of its share's half,
    i.e. 1/8 of the buffer, to the other node (a flat ring would send 7/8 around a ring crossing nodes)."""
    tree = normalize([[0, 1, 2, 3], [4, 5, 6, 7]])
    grid = grid_of(tree)
    parts = [10] * 8
    for half in ("reduce_scatter", "allgather"):
        sched = scatter_schedule(grid, ("ring", "ring"), parts, half)
        for prog in sched.programs:
            node = prog.rank // 4
            across = sum(s.count for s in prog.steps if s.op is Op.SEND and s.peer // 4 != node)
            inside = sum(s.count for s in prog.steps if s.op is Op.SEND and s.peer // 4 == node)
            assert (across, inside) == (10, 60)


def test_broadcast_crosses_the_top_level_once_per_node():
    tree = normalize([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]])
    grid = grid_of(tree)
    for root in (0, 6):
        crossing = [s for r in range(16) for s in broadcast_program(r, grid, 5, root).steps
                    if s.op is Op.SEND and s.peer // 4 != r // 4]
        assert len(crossing) == 3  # one copy into each of the other three nodes


def test_positions_follow_the_coordinates():
    grid = grid_of(normalize([[0, 1, 2], [3, 4, 5]]))
    assert grid.sizes == (3, 2) and grid.order == (0, 3, 1, 4, 2, 5)
    uneven = grid_of(normalize([[0, 1, 2], [3, 4], [5]]))
    assert uneven.sizes == (6,) and uneven.order == (0, 1, 2, 3, 4, 5) and not uneven.even


# -- the collectives over loopback threads with hierarchies ----------------------------------------------------

LOOPBACK_TREES = [
    [[0, 1, 2], [3, 4, 5]],
    [[0, 1, 2], [3, 4], [5]],
    [[0, 2, 4], [1, 3, 5]],
    [[[0, 1], [2]], [[3, 4], [5]]],
]


def comms_on(tree, **options):
    opts = replace(BASE, small_bytes=0, **options)
    hub = _native.LoopbackHub(6)
    return [Communicator.loopback(hub, r, opts, hierarchy=tree) for r in range(6)]


def run_all(comms, fn):
    results, errors = spawn_on(comms, fn)
    assert errors == [None] * len(comms)
    return results


def values(rank, shape, dtype):
    return ((np.arange(int(np.prod(shape))) * 7 + rank * 3) % 11 - 5).reshape(shape).astype(dtype)


@pytest.mark.parametrize("tree", LOOPBACK_TREES)
@pytest.mark.parametrize("segment", [None, 4096])  # one block; many blocks (pipelined, pieces padded)
def test_reduce_scatter_per_level_gives_numpys_sums(tree, segment):
    comms = comms_on(tree, segment=segment)
    cases = [((6, 3), np.float32, "sum"), ((7001,), np.float64, "sum"), ((1000, 5), np.int32, "max"),
             ((13, 2), np.float32, "avg"), ((4,), np.int64, "sum"), ((2049,), ml_dtypes.bfloat16, "sum")]
    results = run_all(comms, lambda c: [c.reduce_scatter(values(c.rank, s, d), op) for s, d, op in cases])
    for shape, dtype, op in cases:
        stack = np.stack([values(r, shape, np.float64) for r in range(6)])
        whole = {"sum": stack.sum(0), "max": stack.max(0), "avg": stack.mean(0)}[op]
        for r, part in enumerate(np.array_split(whole, 6)):
            got = results[r][cases.index((shape, dtype, op))]
            assert got.dtype == dtype and got.shape == part.shape
            np.testing.assert_allclose(got.astype(np.float64), part.astype(dtype).astype(np.float64), rtol=1e-6)


@pytest.mark.parametrize("tree", LOOPBACK_TREES)
@pytest.mark.parametrize("segment", [None, 4096])
def test_allgather_per_level_with_uneven_rows(tree, segment):
    comms = comms_on(tree, segment=segment)

    def body(c):
        even = c.allgather(values(c.rank, (1000, 3), np.float32))
        uneven = c.allgather(np.full((c.rank % 3, 2), c.rank, np.int16))
        out = np.empty((6 * 40,), np.float64)
        into = c.allgather(values(c.rank, (40,), np.float64), out=out)
        return even, uneven, into is out and out

    results = run_all(comms, body)
    even = np.concatenate([values(r, (1000, 3), np.float32) for r in range(6)])
    uneven = np.concatenate([np.full((r % 3, 2), r, np.int16) for r in range(6)])
    into = np.concatenate([values(r, (40,), np.float64) for r in range(6)])
    for r in range(6):
        np.testing.assert_array_equal(results[r][0], even)
        np.testing.assert_array_equal(results[r][1], uneven)
        np.testing.assert_array_equal(results[r][2], into)


@pytest.mark.parametrize("tree", LOOPBACK_TREES)
def test_broadcast_per_level_from_every_root(tree):
    comms = comms_on(tree, segment=4096)
    results = run_all(comms, lambda c: [c.broadcast(values(c.rank, (3001,), np.float32), root) for root in range(6)])
    for r in range(6):
        for root in range(6):
            np.testing.assert_array_equal(results[r][root], values(root, (3001,), np.float32))


@pytest.mark.parametrize("tree", LOOPBACK_TREES)
def test_large_broadcasts_run_as_a_chain_with_numpys_answers(tree):
    comms = comms_on(tree, segment=16 << 10)
    n = (300 << 10) // 8  # past CHAIN_FROM: a chain of 19 blocks
    results = run_all(comms, lambda c: [c.broadcast(values(c.rank, (n,), np.float64), root) for root in (0, 4)])
    for r in range(6):
        for k, root in enumerate((0, 4)):
            np.testing.assert_array_equal(results[r][k], values(root, (n,), np.float64))
    assert {plan.algorithm for key, plan in comms[0].plans._plans.items() if key[0] == "broadcast"} <= \
        {"chain", "chain per level"}


@pytest.mark.parametrize("tree", TREES)
def test_chains_from_every_root_pass_the_checker_and_cross_each_subtree_once_each_way(tree):
    grid = grid_of(normalize(tree))
    p = grid.nranks
    top = {r: k for k, sub in enumerate(normalize(tree)) for r in leaves(sub)} if isinstance(tree[0], list) else None
    for root in range(p):
        programs = tuple(chain_program(r, grid, 7, root) for r in range(p))
        check(Schedule(Collective.BROADCAST, "chain", p, 7, programs, root))
        if top is not None:  # each top-level subtree entered at most once and left at most once
            crossing = [(top[r], top[s.peer]) for r in range(p) for s in programs[r].steps
                        if s.op is Op.SEND and top[s.peer] != top[r]]
            assert len({b for _, b in crossing}) == len({a for a, _ in crossing}) == len(crossing)
            # an even grid starts with the root's whole subtree; an uneven one (flat, in tree order) turns the
            # order to start at the root and may come back into the root's subtree once, from the other side
            subtrees = len(set(top.values()))
            assert len(crossing) in ({subtrees - 1} if grid.even else {subtrees - 1, subtrees})


def test_reduce_scatter_plans_follow_the_levels():
    comms = comms_on([[0, 1, 2], [3, 4, 5]])
    plan = comms[0].parts_plan("reduce_scatter", [1000] * 6, 4)
    assert plan.algorithm.startswith("reduce-scatter per level(") and plan.positions == (0, 2, 4, 1, 3, 5)
    assert {lvl for lvl, _ in plan.compiled.phases} == {0, 1}


@pytest.mark.parametrize("tree", [None, [[0, 1, 2], [3, 4, 5]]])
def test_small_collectives_ride_in_the_agreement_round(tree):
    """Small broadcasts, allgathers and reduce-scatters are one exchange (the agreement round carries them);
    uneven rows where some ranks' payloads ride and others' do not still meet in the planned allgather."""
    opts = replace(BASE, small_bytes=4096)
    hub = _native.LoopbackHub(6)
    comms = [Communicator.loopback(hub, r, opts, hierarchy=tree) for r in range(6)]

    def body(c):
        rows = 100 if c.rank == 0 else c.rank % 2  # rank 0's slots pass 4 KiB: it does not ride, the rest do
        return (c.broadcast(values(c.rank, (37,), np.float64), 4),
                c.allgather(np.full((rows, 1), c.rank, np.int64)),
                c.allgather(values(c.rank, (3, 2), np.int16)),
                c.reduce_scatter(values(c.rank, (13,), np.float32), "avg"))

    results = run_all(comms, body)
    uneven = np.concatenate([np.full((100 if r == 0 else r % 2, 1), r, np.int64) for r in range(6)])
    whole = np.stack([values(r, (13,), np.float64) for r in range(6)]).mean(0)
    for r in range(6):
        np.testing.assert_array_equal(results[r][0], values(4, (37,), np.float64))
        np.testing.assert_array_equal(results[r][1], uneven)
        np.testing.assert_array_equal(results[r][2], np.concatenate([values(q, (3, 2), np.int16) for q in range(6)]))
        np.testing.assert_allclose(results[r][3], np.array_split(whole, 6)[r].astype(np.float32), rtol=1e-6)
        planned = {key[0] for key in comms[r].plans._plans}  # what ran besides agreement rounds
        # (the rounds, the reduce-scatter's halving the vector, and the uneven rows' allgather only)
        assert planned == {"agree", "agree-gather", "agree-scatter", "allgather"}, planned


def test_small_calls_that_differ_raise_a_mismatch_on_every_rank():
    hub = _native.LoopbackHub(4)
    comms = [Communicator.loopback(hub, r, BASE, hierarchy=[[0, 1], [2, 3]]) for r in range(4)]
    calls = [lambda c: c.broadcast(np.ones(3), 0), lambda c: c.allgather(np.ones(3)),
             lambda c: c.reduce_scatter(np.ones(4)), lambda c: c.broadcast(np.ones(3), 1)]
    _, errors = spawn_on(comms, lambda c: calls[c.rank](c))
    assert all(isinstance(e, MismatchError) for e in errors), errors
    for text in ("broadcast(shape=(3,), dtype=float64, root=0)", "allgather", "reduce_scatter", "root=1"):
        assert all(text in str(e) for e in errors)


@pytest.mark.parametrize("tree", [None, [[0, 1], [2, 3]]])
def test_objects_are_refused_on_every_rank_naming_the_call(tree):
    hub = _native.LoopbackHub(4)
    comms = [Communicator.loopback(hub, r, BASE, hierarchy=tree) for r in range(4)]
    for call, what in ((lambda c: c.broadcast(np.array([object()] * 3) if c.rank == 2 else np.ones(3), 0),
                        "cannot broadcast dtype object"),
                       (lambda c: c.allgather(np.array([object()])), "cannot allgather dtype object")):
        _, errors = spawn_on(comms, call)
        assert all(isinstance(e, DDLError) and what in str(e) for e in errors), errors


def test_staging_memory_is_kept_between_calls_up_to_its_limit():
    from ddl.core.parts import Scratch
    scratch = Scratch(keep_bytes=1 << 20)
    first = scratch.get(1000, np.float64)
    again = scratch.get(2000, np.float32)  # fewer bytes: the same memory, another dtype
    assert first.shape == (1000,) and again.shape == (2000,) and again.dtype == np.float32
    assert np.shares_memory(first, again)
    grown = scratch.get(1 << 17, np.float64)  # 1 MiB: the limit, kept
    assert grown.nbytes == 1 << 20 and np.shares_memory(grown, scratch.get(10, np.int8))
    huge = scratch.get((1 << 17) + 1, np.float64)  # over it: made for the call alone
    assert not np.shares_memory(huge, scratch.get(10, np.int8))
    scratch.release()
    assert not np.shares_memory(grown, scratch.get(10, np.int8))


def test_run_parts_refuses_parts_that_do_not_fit_its_buffers():
    comms = [Communicator.loopback(_native.LoopbackHub(1), 0, BASE)]
    plan = comms[0].parts_plan("allgather", [8], 4)
    ex = comms[0]._executor
    opts = _native.RunOptions(_native.DType.float32, _native.ReduceOp.sum, 5.0, "test")
    staged, src = np.zeros(plan.extent, np.float32), np.arange(8, dtype=np.float32)
    with pytest.raises(ValueError, match="one entry per rank"):
        ex.run_parts(plan.compiled.native, staged, src, np.zeros(8, np.float32), True, [8, 8], [0, 1], plan.piece,
                     opts)
    with pytest.raises(ValueError, match="holds 28 bytes"):
        ex.run_parts(plan.compiled.native, staged, src, np.zeros(7, np.float32), True, [8], [0], plan.piece, opts)
    dst = np.zeros(8, np.float32)
    ex.run_parts(plan.compiled.native, staged, src, dst, True, [8], [0], plan.piece, opts)
    np.testing.assert_array_equal(dst, src)
