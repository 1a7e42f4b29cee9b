"""The hierarchical planner: every plan passes the symbolic checker (fixed trees x every algorithm per level,
and property-based over random trees of 1-4 levels, uneven groups, random placements, 1-64 ranks); the
cost model's closed forms; choices at the extremes; plans round-trip through JSON."""
import itertools
import json
import math
import random

import pytest
from hypothesis import example, given, settings, strategies as st

from ddl import planner
from ddl.schedule.check import check
from ddl.topology.tree import from_dims, leaves, normalize
from ddl.schedule import Collective, Op, Schedule
from ddl.topology import LevelCost

FIXED = [
    [[0, 1, 2], [3, 4, 5]],                      # two even nodes
    [[0, 1, 2], [3, 4], [5]],                    # uneven nodes
    [[0, 2, 4], [1, 3, 5]],                      # round-robin placement
    [[[0, 1], [2, 3]], [[4, 5], [6]]],           # racks of nodes
    [[[[0, 1], [2]], [[3, 4]]], [[[5], [6, 7]]]],  # four levels
    [0, [1, 2]],                                 # a lone rank beside a group
    [[0, 1, 2, 3], [4, 5, 6, 7]],                # powers of two (halving/doubling runs)
    list(range(5)),                              # flat
]


def make_plan(tree, algorithms, shape="hierarchical"):
    t = normalize(tree)
    return planner.Plan(t, planner.default_levels(t), tuple(algorithms), shape, 1, 1)


def full_schedule(plan, n):
    p = len(leaves(plan.tree))
    return Schedule(Collective.ALLREDUCE, "planned", p, n, tuple(planner.program(r, plan, n) for r in range(p)))


@pytest.mark.parametrize("tree", FIXED)
@pytest.mark.parametrize("n", [0, 1, 5, 7, 100, 1001])
def test_every_algorithm_per_level_passes_the_checker(tree, n):
    depth = planner.Shape.of(normalize(tree)).depth
    for inner in itertools.product(planner.LEVEL_ALGORITHMS, repeat=depth - 1):
        for top in planner.TOP_ALGORITHMS:
            check(full_schedule(make_plan(tree, inner + (top,)), n))
    check(full_schedule(make_plan(tree, ("recursive_doubling",) * depth, "latency"), n))


def random_tree(rng, levels, max_ranks):
    """A random tree of the given depth; group sizes uneven; ranks placed in random order."""
    def shape(d):
        return rng.randint(1, 4) if d == 1 else [shape(d - 1) for _ in range(rng.randint(1, 3))]
    s = shape(levels)
    total = sum(_sizes(s))
    ranks = list(range(min(total, max_ranks)))
    rng.shuffle(ranks)
    it = iter(ranks)

    def fill(x):
        if isinstance(x, int):
            return [r for r in (next(it, None) for _ in range(x)) if r is not None]
        return [k for k in (fill(c) for c in x) if k]
    return fill(s)


def _sizes(s):
    return [s] if isinstance(s, int) else [n for c in s for n in _sizes(c)]


def random_levels(rng, depth):
    """Random costs; a peer level's child also has other links (an uplink) of random width."""
    out = []
    for i in range(depth):
        bw, via = rng.uniform(1e7, 1e11), rng.choice(["peer", "uplink"])
        out.append(LevelCost(f"l{i}", "shm", rng.uniform(1e-6, 1e-4), bw, 1 / 4e9, via,
                             bw + rng.uniform(1e7, 1e11) if via == "peer" else bw))
    return tuple(out)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 10**9), levels=st.integers(1, 4), n=st.integers(0, 3000),
       nbytes=st.integers(1, 1 << 30))
def test_random_hierarchies_pass_the_checker(seed, levels, n, nbytes):
    """Random trees, random level costs: the plan the model picks, and random forced algorithms."""
    rng = random.Random(seed)
    tree = normalize(random_tree(rng, levels, 64))
    depth = planner.Shape.of(tree).depth
    lv = random_levels(rng, depth)
    check(full_schedule(planner.choose(tree, lv, nbytes), n))
    forced = tuple(rng.choice(planner.LEVEL_ALGORITHMS) for _ in range(depth - 1)) + \
        (rng.choice(planner.TOP_ALGORITHMS),)
    check(full_schedule(planner.choose(tree, lv, nbytes, forced), n))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**9), dims=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       nbytes=st.integers(1, 1 << 32))
@example(seed=494690561, dims=[2, 2], nbytes=158450)  # a rank's uplink (370 MB/s) thinner than the outer level's links
def test_prediction_never_beats_the_lower_bound(seed, dims, nbytes):
    """On regular trees (IBM's dims) the model's prediction is never below the topology's lower bound. (On
    uneven trees it prices each level by its largest group and thinnest child, an approximation.)"""
    tree = from_dims(tuple(dims))
    lv = random_levels(random.Random(seed), planner.Shape.of(tree).depth)
    plan = planner.choose(tree, lv, nbytes)
    seconds, _ = planner.predict(plan, nbytes)
    bound, _ = planner.lower_bound(planner.Shape.of(tree), lv, nbytes)
    assert seconds >= bound * (1 - 1e-9)


def test_only_reduced_data_crosses_nodes():
    """Two nodes of four: each rank sends 1/4 of the buffer across, twice (ring of two owners), the minimum."""
    n = 8000
    plan = make_plan([[0, 1, 2, 3], [4, 5, 6, 7]], ("direct", "ring"))
    for prog in full_schedule(plan, n).programs:
        across = sum(x.count for x in prog.steps if x.op is Op.SEND and prog.rank // 4 != x.peer // 4)
        assert across == n // 4
    assert planner.program(0, plan, n).rounds == 1 + 2 + 1 < 2 * (8 - 1)


def test_uneven_nodes_split_work_evenly_inside_each_node():
    """Nodes of 3, 2 and 1 ranks, placed round-robin: a rank in a node of g ranks owns 1/g of the vector and
    sends 2 (N-1)/N of that across nodes (ring over the N = 3 nodes) - no rank does more than its share."""
    tree = [[0, 3, 5], [1, 4], [2]]
    node = {r: i for i, g in enumerate(tree) for r in g}
    n = 180
    plan = make_plan(tree, ("ring", "ring"))
    for prog in full_schedule(plan, n).programs:
        g = len(tree[node[prog.rank]])
        across = sum(x.count for x in prog.steps if x.op is Op.SEND and node[x.peer] != node[prog.rank])
        assert across == 2 * 2 * (n // g) // 3


def test_round_counts_follow_the_levels():
    """Ring per level: 2 sum(g_i - 1) rounds (IBM's multi-dimensional ring), versus 2(p-1) for a flat ring."""
    tree = [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]]]
    plan = make_plan(tree, ("ring", "ring", "ring"))
    assert planner.program(5, plan, 1600).rounds == 2 * (3 + 1 + 1)
    plan = make_plan(tree, ("direct", "direct", "recursive_doubling"))
    assert planner.program(5, plan, 1600).rounds == 1 + 1 + 1 + 1 + 1


def test_flat_cost_formulas_closed_form():
    """One level, alpha only / beta only: the textbook counts (Thakur, Rabenseifner, Gropp)."""
    s = planner.Shape.of(list(range(8)))
    alpha = (LevelCost("l", "shm", 1.0, 1e30, 0.0),)
    t = {a: sum(p.seconds for p in planner.phases(s, alpha, (a,), 100)) for a in planner.TOP_ALGORITHMS}
    assert t == {"ring": 14.0, "rabenseifner": 6.0, "recursive_doubling": 3.0, "direct": 2.0 + 12 * 2e-6,
                 "exchange": 1.0 + 6 * 2e-6}
    beta = (LevelCost("l", "shm", 0.0, 1.0, 0.0),)
    s4 = planner.Shape.of(list(range(4)))
    assert sum(p.seconds for p in planner.phases(s4, beta, ("ring",), 100)) == pytest.approx(150.0)
    assert sum(p.seconds for p in planner.phases(s4, beta, ("recursive_doubling",), 100)) == pytest.approx(200.0)


def test_choice_at_the_extremes():
    tree = normalize([[0, 1, 2, 3], [4, 5, 6, 7]])
    slow_net = (LevelCost("node", "shm", 3e-6, 4e9, 2.5e-10, "peer"),
                LevelCost("net", "eth_10g", 50e-6, 1.25e9, 2.5e-10, "uplink"))
    tiny = planner.choose(tree, slow_net, 8)
    assert planner.predict(tiny, 8)[1][-1].rounds <= 2   # one or two rounds across the slow network
    big = planner.choose(tree, slow_net, 256 << 20)
    assert big.shape == "hierarchical" and big.block_bytes < 256 << 20 and big.inflight > 1
    assert planner.choose(tree, slow_net, 8, ("recursive_doubling",)).shape == "latency"
    assert planner.choose(tree, slow_net, 1 << 20, ("direct", "ring")).algorithms == ("direct", "ring")
    assert planner.choose(tree, slow_net, 8, ("auto", "ring")).algorithms[1] == "ring"  # a forced level stays
    with pytest.raises(ValueError, match="cannot run level 0"):
        planner.choose(tree, slow_net, 8, ("recursive_doubling", "ring"))
    with pytest.raises(ValueError, match="3 algorithms given for 2 levels"):
        planner.choose(tree, slow_net, 8, ("ring", "ring", "ring"))


def test_blocks_across_a_network_stay_under_the_eager_sized_cap():
    """Past MAX_BLOCKS blocks of MAX_BLOCK_BYTES, a plan over a network takes more blocks rather than larger ones
    (up to MOST_BLOCKS); one host's plan and a forced segment keep the model's choice."""
    tree = normalize([[0, 1], [2, 3], [4, 5], [6, 7]])
    net = (LevelCost("node", "shm", 3e-6, 4e9, 2.5e-10, "peer"),
           LevelCost("switch", "veth", 62e-6, 1.25e8, 2.5e-10, "uplink"))
    cap, most = planner.MAX_BLOCK_BYTES, planner.MOST_BLOCKS
    for nbytes in (planner.MAX_BLOCKS * cap + 1, 98 << 20, 300_000_007):
        plan = planner.choose(tree, net, nbytes)
        assert plan.block_bytes <= cap and math.ceil(nbytes / plan.block_bytes) == math.ceil(nbytes / cap)
    huge = planner.choose(tree, net, 4 * most * cap)
    assert math.ceil(4 * most * cap / huge.block_bytes) == most  # at most MOST_BLOCKS: blocks grow instead
    small = planner.choose(tree, net, 8 << 20)
    assert small.block_bytes >= planner.MIN_BLOCK_BYTES  # below the cap's reach the model still decides
    inside = (LevelCost("socket", "shm", 3e-6, 4e9, 2.5e-10, "peer"),
              LevelCost("host", "shm", 3e-6, 4e9, 2.5e-10, "peer"))
    assert math.ceil((98 << 20) / planner.choose(tree, inside, 98 << 20).block_bytes) <= planner.MAX_BLOCKS
    assert planner.choose(tree, net, 98 << 20, block_bytes=1 << 20).block_bytes == 1 << 20


def test_the_agreement_round_by_host_sends_one_payload_per_host_and_round():
    """4 hosts x 2 ranks: to the first rank (one message in), two rounds of recursive doubling between hosts
    with one sender each (not two ranks sharing the NIC), back out; in closed form."""
    tree = normalize([[0, 1], [2, 3], [4, 5], [6, 7]])
    shm = LevelCost("node", "shm", 3e-6, 4e9, 2.5e-10, "peer")
    net = LevelCost("switch", "veth", 62e-6, 1.25e8, 2.5e-10, "uplink")
    n = 8192
    ph = planner.agreement_phases(planner.Shape.of(tree), (shm, net), n, by_host=True)
    fan = 3e-6 + n / 4e9
    between = 2 * (62e-6 + n / 1.25e8 + n * 2.5e-10)
    assert [p.level for p in ph] == [0, 1, 0] and ph[1].rounds == 2
    assert planner.pipelined(ph, 1) == pytest.approx(fan + n * 2.5e-10 + between + fan)
    every_rank = planner.agreement_phases(planner.Shape.of(tree), (shm, net), n, by_host=False)
    assert every_rank == planner.latency_phases(planner.Shape.of(tree), (shm, net), n)
    assert planner.pipelined(every_rank, 1) > planner.pipelined(ph, 1)  # two ranks' payloads through one NIC


def test_a_reduce_scatters_round_is_priced_halving_the_vector_between_hosts():
    """leader_reduce_scatter on 4 hosts x 2 ranks: the whole to each first rank, half then a quarter of it
    between hosts (3/4 of the vector out of each host, not twice all of it), each rank's eighth back; in closed
    form. Across ranks in rank order (no host groups) the rounds halve alike."""
    tree = normalize([[0, 1], [2, 3], [4, 5], [6, 7]])
    shm = LevelCost("node", "shm", 3e-6, 4e9, 2.5e-10, "peer")
    net = LevelCost("switch", "veth", 62e-6, 1.25e8, 2.5e-10, "uplink")
    n, shape = 65536, planner.Shape.of(tree)
    ph = planner.agreement_phases(shape, (shm, net), n, by_host=True, payload="halving")
    between = sum(62e-6 + m / 1.25e8 + m * 2.5e-10 for m in (n / 2, n / 4))
    assert ph[1].link_bytes == pytest.approx(3 * n / 4)
    assert planner.pipelined(ph, 1) == pytest.approx(3e-6 + n / 4e9 + n * 2.5e-10 + between + 3e-6 + n / 8 / 4e9)
    flat = planner.agreement_phases(shape, (shm, net), n, by_host=False, payload="halving")
    assert [p.link_bytes for p in flat] == pytest.approx([n / 2, n / 4 + n / 8])  # (rounds on one level: a phase)
    assert planner.pipelined(ph, 1) < planner.pipelined(planner.agreement_phases(shape, (shm, net), n, True), 1)


def test_a_planned_allgather_gathers_per_level_outermost_first_moving_what_a_reduce_scatter_would():
    """4 hosts x 2 ranks, direct between hosts and a ring inside: one round across the network (the other two
    messages posted in it at software cost) carrying 3/4 of the vector out of each host, then one inside carrying
    half of it; nothing reduced; in closed form. A latency plan's allgather runs direct at every level."""
    tree = normalize([[0, 1], [2, 3], [4, 5], [6, 7]])
    shm = LevelCost("node", "shm", 3e-6, 4e9, 2.5e-10, "peer")
    net = LevelCost("switch", "veth", 62e-6, 1.25e8, 2.5e-10, "uplink")
    n, shape = 65536, planner.Shape.of(tree)
    ph = planner.allgather_phases(shape, (shm, net), ("ring", "direct"), n)
    assert [(p.level, p.rounds) for p in ph] == [(1, 1), (0, 1)] and all(p.compute == 0 for p in ph)
    software = 2e-6  # (links.SOFTWARE_OVERHEAD, as test_flat_cost_formulas_closed_form has it)
    across, inside = 62e-6 + 2 * software + 0.75 * n / 1.25e8, 3e-6 + 0.5 * n / 4e9
    assert planner.pipelined(ph, 1) == pytest.approx(across + inside)
    plan = planner.Plan(tree, (shm, net), ("ring", "direct"), "hierarchical", n, 1)
    assert planner.predict_allgather(plan, n) == pytest.approx(across + inside)
    latency = planner.Plan(tree, (shm, net), ("recursive_doubling",) * 2, "latency", n, 1)
    assert planner.predict_allgather(latency, n) == pytest.approx(across + 3e-6 + 0.5 * n / 4e9)


def test_pipelining_approaches_the_slowest_level():
    """Two levels of equal cost: pipelined blocks take about one level's time, not the sum of both."""
    tree = normalize([[0, 1], [2, 3]])
    lv = (LevelCost("a", "shm", 0.0, 1e9, 0.0, "peer"), LevelCost("b", "shm", 0.0, 1e9, 0.0, "peer"))
    one = planner.Plan(tree, lv, ("ring", "ring"), "hierarchical", 64 << 20, 1)
    many = planner.Plan(tree, lv, ("ring", "ring"), "hierarchical", 1 << 20, 4)
    t1, t64 = planner.predict(one, 64 << 20)[0], planner.predict(many, 64 << 20)[0]
    inner_alone = 2 * (1 / 2) * (64 << 20) / 1e9
    assert t1 == pytest.approx(2 * inner_alone)
    assert t64 < 0.6 * t1


def test_plans_round_trip_through_json_and_bad_ones_are_refused():
    tree = normalize([[0, 1, 2], [3, 4], [5]])
    plan = planner.choose(tree, planner.default_levels(tree), 1 << 20)
    again = planner.Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan and again.tree == plan.tree
    assert planner.program(4, again, 999) == planner.program(4, plan, 999)
    bad = plan.to_dict() | {"algorithms": ["recursive_doubling", "ring"]}
    with pytest.raises(ValueError, match="cannot run level 0"):
        planner.Plan.from_dict(bad)
    with pytest.raises(ValueError, match="levels"):
        planner.Plan.from_dict(plan.to_dict() | {"algorithms": ["ring"]})


def test_a_rank_plans_only_its_own_steps():
    """A 27,648-rank tree of Summit's shape: one rank's program holds a few dozen steps, not the world's."""
    tree = [[[[[r * 6 + s * 3 + g for g in range(3)] for s in range(2)] for r in range(18 * k, 18 * k + 18)]
             for k in range(256)]]
    tree = normalize(tree[0])
    lv = planner.default_levels(tree)
    plan = planner.choose(tree, lv, 100 << 20)
    for rank in (0, 13_824, 27_647):
        prog = planner.program(rank, plan, 1 << 20)
        assert 0 < len(prog.steps) < 200
        assert prog.rounds == sum(max(planner.level_rounds(a, g) for g in s) * 2
                                  for a, s in zip(plan.algorithms[:-1], planner.Shape.of(tree).sizes[:-1])) + \
            planner.top_rounds(plan.algorithms[-1], 256)


def test_lower_bound_matches_the_anchors_two_level_formula():
    """N nodes x g ranks: t >= max(2(p-1)/p n / B_gpu, 2(N-1)/N n / B_node) (reference/anchors.md section 6),
    B_gpu a GPU's injection into its NVSwitch; a peer level (links between siblings) bounds nothing."""
    tree = normalize([[r * 8 + i for i in range(8)] for r in range(4)])
    lv = (LevelCost("gpu", "nvlink4", 1e-6, 370e9, 0.0, "uplink"), LevelCost("node", "ib_ndr", 5e-6, 384e9, 0.0))
    n = 1 << 30
    bound, why = planner.lower_bound(planner.Shape.of(tree), lv, n)
    assert bound == pytest.approx(max(2 * 31 / 32 * n / 370e9, 2 * 3 / 4 * n / 384e9))
    assert math.isclose(bound, 2 * 31 / 32 * n / 370e9) and "gpu" in why
    # Peer links (NVLink between siblings) count together with the uplink: both carry a GPU's traffic.
    peer = (LevelCost("gpu", "nvlink2", 1e-6, 1e9, 0.0, "peer", outside=1e9 + 12e9), lv[1])
    assert planner.lower_bound(planner.Shape.of(tree), peer, n)[0] == pytest.approx(2 * 31 / 32 * n / 13e9)


def test_broadcast_lower_bound_is_n_over_the_slowest_escape_of_a_level_with_several_children():
    tree = normalize([[r * 8 + i for i in range(8)] for r in range(4)])
    lv = (LevelCost("gpu", "nvlink4", 1e-6, 370e9, 0.0, "uplink"), LevelCost("node", "ib_ndr", 5e-6, 50e9, 0.0))
    n = 1 << 30
    assert planner.broadcast_lower_bound(planner.Shape.of(tree), lv, n) == pytest.approx(n / 50e9)
    one_node = normalize([list(range(8))])  # a single node: its link out carries nothing
    assert planner.broadcast_lower_bound(planner.Shape.of(one_node), lv[:1], n) == pytest.approx(n / 370e9)
