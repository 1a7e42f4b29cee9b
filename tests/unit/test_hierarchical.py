"""Hierarchical allreduce schedules: every one passes the symbolic checker, over random trees of 1-4 levels
with uneven groups and random rank placement, and slow links carry only reduced data."""
import random

import pytest
from hypothesis import given, settings, strategies as st

from ddl.check import check
from ddl.hierarchical import hierarchical_allreduce, leaves, normalize, rounds
from ddl.schedule import Collective, Op, Schedule


def schedule(tree, n):
    t = normalize(tree)
    p = len(leaves(t))
    return Schedule(Collective.ALLREDUCE, "hierarchical", p, n,
                    tuple(hierarchical_allreduce(r, t, n) for r in range(p)))


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
            group = [r for r in (next(it, None) for _ in range(x)) if r is not None]
            return group
        kids = [k for k in (fill(c) for c in x) if k]
        return kids
    return fill(s)


def _sizes(s):
    return [s] if isinstance(s, int) else [n for c in s for n in _sizes(c)]


@pytest.mark.parametrize("tree", [
    [[0, 1, 2], [3, 4, 5]],                      # two even nodes
    [[0, 1, 2], [3, 4], [5]],                    # uneven nodes
    [[0, 2, 4], [1, 3, 5]],                      # round-robin placement
    [[[0, 1], [2, 3]], [[4, 5], [6]]],           # racks of nodes
    [[[[0, 1], [2]], [[3, 4]]], [[[5], [6, 7]]]],  # four levels
    [0, [1, 2]],                                 # a lone rank beside a group
])
@pytest.mark.parametrize("n", [0, 1, 5, 7, 100, 1001])
def test_fixed_hierarchies_pass_the_checker(tree, n):
    check(schedule(tree, n))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**9), levels=st.integers(1, 4), n=st.integers(0, 3000))
def test_random_hierarchies_pass_the_checker(seed, levels, n):
    tree = random_tree(random.Random(seed), levels, 64)
    check(schedule(tree, n))


def test_only_reduced_data_crosses_nodes():
    """Two nodes of four: each rank sends 1/4 of the buffer across, twice (ring of two owners), the minimum."""
    tree = [[0, 1, 2, 3], [4, 5, 6, 7]]
    n = 8000
    s = schedule(tree, n)
    node = {r: r // 4 for r in range(8)}
    for prog in s.programs:
        across = sum(x.count for x in prog.steps if x.op is Op.SEND and node[x.peer] != node[prog.rank])
        assert across == n // 4  # ring of 2 over a quarter: reduce-scatter half + allgather half
    flat_rounds = 2 * (8 - 1)
    assert rounds(normalize(tree)) == 2 + 2 < flat_rounds


def test_bad_trees_are_refused():
    with pytest.raises(ValueError, match="once each"):
        normalize([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="empty group"):
        normalize([[0, 1], []])
