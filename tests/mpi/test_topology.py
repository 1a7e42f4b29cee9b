"""Hierarchical plans run for real: a topology file maps the ranks of this one machine to pretend nodes of
uneven size (3, 2, 1, 3, ...) in racks of two, ranks placed round-robin, so the plan follows the topology
and not the rank numbers. Results are checked against numpy (test_collectives' helpers); any N >= 2."""
import json
import os
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

import ddl
from ddl import DDLError
from ddl.core.communicator import Communicator
from ddl.topology.tree import normalize
from ddl.planner import Shape
from test_collectives import assert_reduced, contribution

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
PATTERN = (3, 2, 1)


def pretend(size: int) -> tuple[dict, list]:
    """(topology, the tree it must give): nodes of 3, 2, 1, 3, ... slots, racks of two nodes, rank r on the
    next node round-robin that has room."""
    slots, total = [], 0
    while total < size:
        slots.append(min(PATTERN[len(slots) % 3], size - total))
        total += slots[-1]
    nodes = len(slots)
    members: list[list[int]] = [[] for _ in range(nodes)]
    placement, node = [], 0
    for r in range(size):
        while len(members[node]) == slots[node]:
            node = (node + 1) % nodes
        members[node].append(r)
        placement.append(f"n{node}")
        node = (node + 1) % nodes
    racks = (nodes + 1) // 2
    switches = [{"name": "spine", "level": "spine"}] + [
        {"name": f"rack{k}", "level": "rack", "parent": "spine", "uplink": {"kind": "veth", "bandwidth": 0.0625}}
        for k in range(racks)]
    topo = {"name": f"pretend-{size}", "node": {"nic": {"kind": "veth"}},
            "nodes": [{"name": f"n{i}", "slots": s, "switch": f"rack{i // 2}"} for i, s in enumerate(slots)],
            "switches": switches, "placement": placement}
    tree = [[members[i] for i in range(k * 2, min(nodes, k * 2 + 2))] for k in range(racks)]
    return topo, normalize(tree)


def options(**over):
    return replace(ddl.options.parse("-timeout 60"), small_bytes=0, segment=64 << 10, **over)


def check_allreduces(comm):
    for n in (1, 7, 10007, 300_001):
        for dtype in (np.float32, np.int64):
            assert_reduced(comm.allreduce(contribution(RANK, n, dtype, "sum")), n, dtype, "sum")
        assert_reduced(comm.allreduce(contribution(RANK, n, np.float64, "max"), "max"), n, np.float64, "max")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algo", ["auto", "ring", "direct", "rabenseifner", "recursive_doubling",
                                  "direct,ring,exchange"])
def test_pretend_cluster_follows_the_topology(algo):
    topo, tree = pretend(SIZE)
    if "," in algo and Shape.of(tree).depth != algo.count(",") + 1:
        pytest.skip(f"a per-level list for {algo.count(',') + 1} levels; this tree has {Shape.of(tree).depth}")
    comm = Communicator.from_mpi(COMM, options(algo=algo), topology=topo)
    try:
        assert comm.tree == tree
        if algo != "auto":
            assert comm.plan_for(1 << 20).algorithms[-1] == algo.split(",")[-1]
        check_allreduces(comm)
    finally:
        comm.close()


@pytest.mark.mpi(min_size=2)
def test_topology_file_from_the_option_and_plans_dumped_then_forced(tmp_path_factory):
    topo, tree = pretend(SIZE)
    where = tmp_path_factory.mktemp(f"rank{RANK}")
    path = where / "pretend.json"
    path.write_text(json.dumps(topo))
    comm = Communicator.from_mpi(COMM, options(topology=str(path)))
    try:
        assert comm.tree == tree and comm.topology.name == f"pretend-{SIZE}"
        plan = comm.plan_for(1 << 20)
        text = str(comm.explain(1 << 20))
        assert "lower bound" in text and ("rack" in text or SIZE <= 3)
    finally:
        comm.close()
    dumped = where / "plan.json"
    dumped.write_text(json.dumps(plan.to_dict()))
    forced = Communicator.from_mpi(COMM, options(plan=str(dumped)))
    try:
        assert forced.plan_for(8) == plan and forced.tree == tree
        check_allreduces(forced)
    finally:
        forced.close()


@pytest.mark.mpi(min_size=2)
def test_topology_contradicting_mpi_is_refused_on_every_rank():
    topo, _ = pretend(SIZE)
    too_many = {**topo, "placement": topo["placement"] + ["n0"]}
    with pytest.raises(DDLError, match=f"rank {RANK}: .*places {SIZE + 1} ranks but MPI runs {SIZE}"):
        Communicator.from_mpi(COMM, options(), topology=too_many)
    elsewhere = {k: v for k, v in topo.items() if k != "placement"}
    with pytest.raises(DDLError, match=f"MPI runs it on host '{MPI.Get_processor_name()}'"):
        Communicator.from_mpi(COMM, options(), topology=elsewhere)
    with pytest.raises(DDLError, match="no topology file"):
        Communicator.from_mpi(COMM, options(topology=os.path.join("no", "such", "file.json")))
    COMM.Barrier()


@pytest.mark.mpi(min_size=4)
def test_ibm_mode_letters_choose_the_algorithm_per_level():
    if SIZE % 2:
        pytest.skip("needs an even number of ranks")
    for letter, want in (("c", "rabenseifner"), ("m", "direct"), ("r", "ring")):
        o = replace(options(), **{"algo": ddl.options.MODE_ALGORITHMS[letter]},
                    mode=ddl.options.parse_mode(f"{letter}:2x{SIZE // 2}"))
        comm = Communicator.from_mpi(COMM, o)
        try:
            plan = comm.plan_for(4 << 20)
            inner = plan.algorithms[0]
            assert inner == want and comm.tree == [[2 * i, 2 * i + 1] for i in range(SIZE // 2)]
            check_allreduces(comm)
        finally:
            comm.close()


@pytest.mark.mpi(min_size=3)
def test_a_group_is_planned_on_the_topology_narrowed_to_its_members():
    # the world's file places SIZE ranks; a group of the even ranks, in reverse, must not read that placement
    # as its own (it did: "places SIZE ranks but MPI runs k"), and its nodes must be the members' nodes
    topo, _ = pretend(SIZE)
    world = Communicator.from_mpi(COMM, options(), topology=topo)
    members = [r for r in range(SIZE) if r % 2 == 0][::-1]
    try:
        if RANK not in members:
            return
        group = world.group(members)
        try:
            assert (group.rank, group.size) == (members.index(RANK), len(members))
            node = {g: topo["placement"][w] for g, w in enumerate(members)}
            rack = {g: int(node[g][1:]) // 2 for g in node}  # the file's racks: nodes two by two
            inner = _innermost(group.tree)
            where = {g: i for i, grp in enumerate(inner) for g in grp}
            for grp in inner:  # an innermost group is a node or a rack of the members', never more
                assert len({rack[g] for g in grp}) == 1, (group.tree, members)
            for a_, b_ in ((a_, b_) for a_ in node for b_ in node if node[a_] == node[b_]):
                assert where[a_] == where[b_], (group.tree, members)  # a node's members stay together
            if len(set(rack.values())) > 1:  # racks apart at the top
                top = {g: i for i, t in enumerate(group.tree) for g in _leaves(t)}
                assert all(top[a_] != top[b_] for a_ in rack for b_ in rack if rack[a_] != rack[b_])
            n = 10007
            values = np.arange(n, dtype=np.float64) * (RANK + 1)
            want = np.arange(n, dtype=np.float64) * sum(r + 1 for r in members)  # closed form over members
            np.testing.assert_array_equal(group.allreduce(values), want)
        finally:
            group.close()
    finally:
        world.close()


def _leaves(tree) -> list[int]:
    return [tree] if isinstance(tree, int) else [x for t in tree for x in _leaves(t)]


def _innermost(tree) -> list[list[int]]:
    if all(isinstance(t, int) for t in tree):
        return [tree]
    return [leaf for t in tree if not isinstance(t, int) for leaf in _innermost(t)]


def test_a_bad_group_is_refused_naming_the_rank():
    comm = ddl.communicator()
    with pytest.raises(DDLError, match=f"rank {RANK}: bad group"):
        comm.group([RANK, RANK])
